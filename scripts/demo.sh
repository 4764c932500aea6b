#!/usr/bin/env bash
# The main job on a fresh machine: installs what is needed, builds, and runs
# scripts/demo_run.sh: a real memory-hungry program (python3) runs unmodified under
# `tessera run` with 50% of its memory local and the rest erasure-coded RS(4,2) across local
# memservers, one of which is SIGKILLed half way; its output must equal a plain local run.
# Extra arguments go to scripts/demo_run.sh (the number of records, default 400000).
# `tessera demo cluster` (the page store alone, 12 servers, 2 killed) is the smaller demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release -j "$(nproc)" >/dev/null
BUILD_DIR="$PWD/build" exec scripts/demo_run.sh "$@"
