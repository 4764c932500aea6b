#!/usr/bin/env bash
# Installs the Debian packages Tessera builds and tests with. Idempotent: quiet and quick
# when everything is already present. Needs root (or sudo) only when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache lld gdb
  libisal-dev liburing-dev libibverbs-dev librdmacm-dev rdma-core ibverbs-utils
  libboost-dev libgflags-dev libgtest-dev libgmock-dev
  libjerasure-dev libgf-complete-dev
  memcached gnuplot-nox libhwy-dev nlohmann-json3-dev python3-torch libtomlplusplus-dev nftables
  libjemalloc-dev nettle-dev liblz4-dev libnbd-bin python3-libnbd nbdkit qemu-utils redis-server redis-tools python3
  libcurl4-openssl-dev etcd-server etcd-client libfuse3-dev fuse3
  mkdocs mkdocs-material help2man debhelper python3-venv
  nodejs ruby default-jdk-headless iproute2 sqlite3 zstd
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: need root to install: ${missing[*]}" >&2; exit 1
  fi
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done" >&2
