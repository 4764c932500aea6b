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
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "${extra[@]}" >/dev/null
fi
cmake --build "$dir" "$@"
