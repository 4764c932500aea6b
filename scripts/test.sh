#!/usr/bin/env bash
# Builds Tessera and runs the whole test suite: the documentation site (strict), every test
# (unit and integration, real processes on loopback) in the release build, then the unit tests
# again under ASan+UBSan.
# Installs what it needs first (scripts/setup.sh). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs="$(nproc)"
# Line tables only: enough for backtraces and sanitizer reports, and a much faster cold build.
export TESSERA_DEBUG_INFO="${TESSERA_DEBUG_INFO:-lines}"

echo "== release build"
scripts/build.sh release -j "$jobs"
echo "== documentation (mkdocs, strict: a broken link fails)"
scripts/docs.sh
echo "== all tests (release)"
# Every test runs once: a test that fails now and then is a bug to find, not to rerun.
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600

echo "== unit tests under ASan+UBSan"
scripts/build.sh asan --target unit_tests tessera -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L unit --output-on-failure -j "$jobs" --timeout 600
echo "== all tests passed"
