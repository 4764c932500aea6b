#!/usr/bin/env bash
# The main job on a fresh machine: installs what is needed, builds, and runs the demo.
# Extra arguments go to `tessera demo cluster` (e.g. --k 8 --r 2 --pages 100000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release -j "$(nproc)" >/dev/null
exec build/bin/tessera demo cluster "$@"
