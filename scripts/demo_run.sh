#!/usr/bin/env bash
# The main job of Tessera in one command: a real, unmodified, memory-hungry program runs with
# only half of its memory local, the rest erasure-coded RS(k,r) across memservers, one of which
# is SIGKILLed half way, and its output is identical to a plain local run.
#
#   scripts/demo_run.sh [RECORDS]      (default 400000: ~150 MB of Python objects)
#
# Builds what it needs (build/ by default; BUILD_DIR=... to change), runs
# tests/run/workload.py (an in-memory external sort of dicts/lists/strings, printing a SHA-256
# digest of its results) once locally and once under
#   tessera run --local-memory 50% --cluster <k+r+1 local memservers> -- python3 workload.py
# kills one memserver when the program prints its half-way line, prints both digests and the
# paging summary, and exits non-zero if the digests differ.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
RECORDS="${1:-400000}"
K="${K:-4}"
R="${R:-2}"
PY=/usr/bin/python3
WORKLOAD="$ROOT/tests/run/workload.py"

if [[ ! -x "$BUILD_DIR/bin/tessera-run" || ! -f "$BUILD_DIR/lib/libtessera_preload.so" ]]; then
  echo "== building tessera run in $BUILD_DIR"
  [[ -f "$BUILD_DIR/build.ninja" ]] ||
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C "$BUILD_DIR" -j2 tessera tessera-run tessera-memserver tessera-status
fi
BIN="$BUILD_DIR/bin"
WORK="$(mktemp -d /tmp/tessera-demo-run-XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== 1. local run: $PY workload.py $RECORDS"
start=$(date +%s.%N)
"$PY" "$WORKLOAD" "$RECORDS" >"$WORK/local.out"
local_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
LOCAL_DIGEST=$(grep '^tessera-workload: records' "$WORK/local.out")

echo "== 2. starting $((K + R + 1)) memservers on loopback"
head -c 48 /dev/urandom | base64 >"$WORK/token"
: >"$WORK/cluster"
for i in $(seq 0 $((K + R))); do
  "$BIN/tessera" memserver --port=0 --capacity=2G --slab_size=1M --headroom=0 \
    --auth_token_file="$WORK/token" --log_level=warning >"$WORK/ms$i.out" 2>/dev/null &
  PIDS+=($!)
  disown $!  # no job-control notice when it is killed
done
for i in $(seq 0 $((K + R))); do
  for _ in $(seq 1 200); do
    grep -q 'listening on' "$WORK/ms$i.out" 2>/dev/null && break
    sleep 0.05  # waiting for the server's start-up line
  done
  addr=$(grep -o 'listening on [0-9.:]*' "$WORK/ms$i.out" | awk '{print $3}')
  [[ -n "$addr" ]] || { echo "memserver $i did not start"; exit 1; }
  echo "$addr" >>"$WORK/cluster"
done
cat "$WORK/cluster" | tr '\n' ' '; echo

echo "== 3. paged run: tessera run --local-memory 50% --k $K --r $R -- $PY workload.py $RECORDS"
echo "   (memserver ${PIDS[0]} is SIGKILLed when the program prints its half-way line)"
start=$(date +%s.%N)
set +e
"$BIN/tessera" run --local-memory 50% --cluster "$WORK/cluster" --auth-token-file "$WORK/token" \
  --k "$K" --r "$R" --stats-json "$WORK/stats.json" -- "$PY" "$WORKLOAD" "$RECORDS" \
  2>"$WORK/run.err" | while IFS= read -r line; do
    echo "$line" >>"$WORK/paged.out"
    if [[ "$line" == "tessera-workload: half" ]]; then
      kill -9 "${PIDS[0]}" && echo "   half way: SIGKILLed memserver $(head -1 "$WORK/cluster")"
    fi
  done
rc=${PIPESTATUS[0]}
set -e
paged_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
cat "$WORK/run.err" >&2
PAGED_DIGEST=$(grep '^tessera-workload: records' "$WORK/paged.out" || true)

echo "== 4. result"
printf '   local run  (%6.1f s): %s\n' "$local_s" "$LOCAL_DIGEST"
printf '   paged run  (%6.1f s): %s\n' "$paged_s" "$PAGED_DIGEST"
if [[ $rc -ne 0 ]]; then
  echo "FAIL: the paged program exited with $rc"
  exit 1
fi
if [[ "$LOCAL_DIGEST" != "$PAGED_DIGEST" || -z "$PAGED_DIGEST" ]]; then
  echo "FAIL: the outputs differ"
  exit 1
fi
echo "OK: identical output at 50% local memory with a memserver killed half way"
