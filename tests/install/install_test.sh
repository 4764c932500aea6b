#!/usr/bin/env bash
# install_find_package: `cmake --install` into a temporary prefix, then, from that prefix only:
# `tessera --version`, a memory server started through the installed command (its subcommands
# in libexec/tessera), the built-in scenarios from share/tessera, `tessera run` finding the
# installed preload library, and examples/kv-client built out of tree against
# find_package(Tessera), putting and getting a key through kayak::Client; and
# `pip install ./python` loading the installed C library.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"; src="$2"
tmp="$(mktemp -d /tmp/tessera-install-test-XXXXXX)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
prefix="$tmp/prefix"

cmake --install "$build" --prefix "$prefix" --strip >/dev/null
for f in bin/tessera libexec/tessera/tessera-memserver libexec/tessera/tessera-run \
         lib/libtessera_preload.so lib/libtessera_paramsvc_c.so \
         lib/cmake/Tessera/TesseraConfig.cmake lib/pkgconfig/tessera-offload.pc \
         include/tessera/apps/kayak/client/client.h share/tessera/workloads/workload.py \
         share/tessera/scenarios/r-plus-one.toml lib/systemd/system/tessera-memserver.service \
         share/doc/tessera/memserver.env share/man/man1/tessera-run.1 \
         share/bash-completion/completions/tessera share/tessera/examples/paramsvc_train.py; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
grep -q "^ExecStart=$prefix/bin/tessera memserver" "$prefix/lib/systemd/system/tessera-memserver.service" \
  || { echo "FAIL: the installed unit does not start $prefix/bin/tessera"; exit 1; }

"$prefix/bin/tessera" --version | grep -q '^tessera [0-9]' || { echo "FAIL: --version"; exit 1; }
"$prefix/bin/tessera" experiment list | grep -q 'kill-during-python' \
  || { echo "FAIL: tessera experiment list"; exit 1; }
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags tessera-offload \
  | grep -q -- "-I$prefix/include/tessera/apps/kayak/server" || { echo "FAIL: pkg-config"; exit 1; }

# tessera run from the prefix: finds lib/libtessera_preload.so and starts its embedded
# memservers from libexec/tessera.
out="$("$prefix/bin/tessera" run --local-memory 50% --summary=false -- \
       /usr/bin/python3 -c "print(sum(len(str(i)) for i in range(200000)))")"
[ "$out" = "1088890" ] || { echo "FAIL: tessera run printed '$out'"; exit 1; }

# The out-of-tree program.
cmake -S "$src/examples/kv-client" -B "$tmp/kv" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/kv" >/dev/null

"$prefix/bin/tessera" token secret --out "$tmp/secret" >/dev/null
"$prefix/bin/tessera" memserver --port 0 --capacity 64M --slab-size 1M \
  --auth-token-file "$tmp/secret" >"$tmp/memserver.out" 2>"$tmp/memserver.err" &
pid=$!
for _ in $(seq 100); do
  grep -q '^listening on ' "$tmp/memserver.out" && break
  sleep 0.1
done
endpoint="$(sed -n 's/^listening on //p' "$tmp/memserver.out")"
[ -n "$endpoint" ] || { echo "FAIL: the memserver did not start"; cat "$tmp/memserver.err"; exit 1; }
echo "$endpoint" > "$tmp/cluster"
got="$("$tmp/kv/kv_client" "$tmp/cluster" "$tmp/secret" greeting hello)"
echo "$got"
case "$got" in
  "greeting = hello (version "*) ;;
  *) echo "FAIL: kv_client printed '$got'"; exit 1 ;;
esac

# pip install ./python into a virtual environment (no package index needed), then the
# package loads the installed C library through the loader's own search path.
python3 -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --no-index "$src/python"
LD_LIBRARY_PATH="$prefix/lib" "$tmp/venv/bin/python" -c \
  "import tessera_paramsvc; tessera_paramsvc.load_library(); print('tessera_paramsvc loaded')"
echo "OK: installed, built out of tree against find_package(Tessera), put and got a key, pip-installed the Python package"
