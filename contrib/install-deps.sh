#!/usr/bin/env bash
# Install what rc_vqp needs to build and test on Debian bookworm, from Debian's
# own packages: UCX 1.13.1 (libraries, headers, ucx_info/ucx_perftest), the
# UCX source package for internal headers (needs a deb-src line), rdma-core,
# autotools, cmocka, valgrind (make check-valgrind, make bench-core); Open MPI
# and NetPIPE for the MPI tests (make check-mpi).
# Idempotent; skips apt when everything is present.
set -euo pipefail

pkgs=(build-essential autoconf automake libtool pkg-config dpkg-dev
      libucx-dev ucx-utils libibverbs-dev ibverbs-providers rdma-core
      libnuma-dev libcmocka-dev clang-format valgrind
      openmpi-bin libopenmpi-dev netpipe-openmpi)

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

sudo=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps.sh: run as root (or install sudo): need ${missing[*]:-nothing}" >&2; exit 1; }
    sudo=sudo
fi

# apt-get source ucx needs a deb-src entry; bookworm images ship only 'deb'.
if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "install-deps.sh: adding a deb-src entry for bookworm (for apt-get source ucx)"
    $sudo tee /etc/apt/sources.list.d/rc_vqp-deb-src.sources >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    need_update=1
fi

if [ ${#missing[@]} -gt 0 ] || [ -n "${need_update:-}" ]; then
    echo "install-deps.sh: installing ${missing[*]:-(sources only)}"
    $sudo apt-get update -q
    [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
