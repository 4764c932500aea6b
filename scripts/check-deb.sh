#!/usr/bin/env bash
# Checks the Debian packages: builds them with `dpkg-buildpackage -b` from the committed tree
# in a temporary copy (or takes the .deb files already in DIR), then, without installing
# anything on this machine, unpacks both into a temporary root and runs the tour's first steps
# from there: `tessera --version`, `tessera demo`, `tessera demo cluster` (real memory servers
# from the package's libexec directory), `tessera SUBCOMMAND --help` for every subcommand the
# package ships, and the Python binding's import with its C library. On a clean machine,
# `apt-get install ./tessera_*.deb ./python3-tessera_*.deb` followed by the tour
# (docs/tour.md) is the same check with the packages installed.
# Usage: scripts/check-deb.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
debs="${1:-}"
if [ -z "$debs" ]; then
  mkdir "$work/src"
  git archive HEAD | tar -x -C "$work/src"
  (cd "$work/src" && DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS:-nocheck}" dpkg-buildpackage -b -uc -us)
  debs="$work"
fi
shopt -s nullglob
packages=("$debs"/tessera_*.deb "$debs"/python3-tessera_*.deb)
if [ "${#packages[@]}" -ne 2 ]; then
  echo "check-deb: want one tessera_*.deb and one python3-tessera_*.deb in $debs" >&2
  exit 1
fi
root="$work/root"
for deb in "${packages[@]}"; do
  echo "== $(basename "$deb")"
  dpkg-deb -c "$deb" | grep -E 'usr/bin/tessera$|libtessera_preload|TesseraConfig.cmake|tessera_paramsvc/__init__.py' || true
  dpkg -x "$deb" "$root"
done
tessera="$root/usr/bin/tessera"
"$tessera" --version
"$tessera" demo --pages 200 | tail -2
"$tessera" demo cluster --pages 500 --k 2 --r 1 --spares 1 --log-level=error 2>&1 | tail -1
"$tessera" help | sed -n 's/^  \([a-z][a-z ]*[a-z]\)  .*/\1/p' | while read -r words; do
  # shellcheck disable=SC2086
  "$tessera" $words --help >/dev/null || { echo "check-deb: tessera $words --help failed" >&2; exit 1; }
done
# The unpacked root is not in the loader's paths, as an installed package would be.
libdir="$(dirname "$(find "$root/usr/lib" -name 'libtessera_paramsvc_c.so*' | head -1)")"
LD_LIBRARY_PATH="$libdir" PYTHONPATH="$root/usr/lib/python3/dist-packages" python3 -c \
  "import tessera_paramsvc; tessera_paramsvc.load_library(); print('python3-tessera: the binding loads', tessera_paramsvc.__file__)"
echo "check-deb: ok"
