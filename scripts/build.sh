#!/usr/bin/env bash
# Configures and builds Tessera. Usage: scripts/build.sh [release|asan|tsan] [cmake --build args]
#   release (default): build/       RelWithDebInfo, everything
#   asan:              build-asan/  ASan+UBSan
#   tsan:              build-tsan/  ThreadSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
flavor="${1:-release}"; shift || true
case "$flavor" in
  release) dir=build; extra=() ;;
  asan)    dir=build-asan; extra=(-DTESSERA_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug) ;;
  tsan)    dir=build-tsan; extra=(-DTESSERA_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
  *) echo "build.sh: unknown flavor '$flavor' (release, asan, tsan)" >&2; exit 2 ;;
esac
# TESSERA_DEBUG_INFO=full|lines|none in the environment sets the CMake option of that name
# (scripts/test.sh uses lines); a build directory configured otherwise is reconfigured.
if [ -n "${TESSERA_DEBUG_INFO:-}" ]; then
  extra+=(-DTESSERA_DEBUG_INFO="$TESSERA_DEBUG_INFO")
  if [ -f "$dir/CMakeCache.txt" ] &&
     ! grep -qx "TESSERA_DEBUG_INFO:STRING=$TESSERA_DEBUG_INFO" "$dir/CMakeCache.txt"; then
    cmake -S . -B "$dir" "-DTESSERA_DEBUG_INFO=$TESSERA_DEBUG_INFO" >/dev/null
  fi
fi
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "${extra[@]}" >/dev/null
fi
cmake --build "$dir" "$@"
