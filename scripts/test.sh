#!/usr/bin/env bash
# Builds Tessera and runs the whole test suite: the documentation site (strict), every test
# (unit and integration, real processes on loopback) in the release build, then the unit tests
# again under ASan+UBSan (built in the background, at the lowest CPU priority, while the release
# tests run).
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
# The sanitizer build is compiled meanwhile, at the lowest CPU priority: the release tests spend
# most of their time waiting on the processes they start, and take the CPU back whenever they
# want it (nice 19 weighs 1/68 of a normal process).
echo "== ASan+UBSan build of the unit tests, in the background at nice 19 (build/asan-build.log)"
setsid nice -n 19 scripts/build.sh asan --target unit_tests tessera -j "$jobs" > build/asan-build.log 2>&1 &
asan_build=$!
trap 'kill -- -"$asan_build" 2>/dev/null || true' EXIT  # Its whole process group.
echo "== all tests (release)"
# Every test runs once: a test that fails now and then is a bug to find, not to rerun.
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600

echo "== unit tests under ASan+UBSan"
if ! wait "$asan_build"; then
  tail -n 50 build/asan-build.log
  echo "the ASan+UBSan build failed (build/asan-build.log)" >&2
  exit 1
fi
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L unit --output-on-failure -j "$jobs" --timeout 600
echo "== all tests passed"
