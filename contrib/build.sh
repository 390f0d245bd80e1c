#!/usr/bin/env bash
# Configure and build rc_vqp in a build directory (default ./build), preparing
# UCX's internal headers once in ./build-ucx-src. Extra arguments go to
# configure (e.g. --enable-asan).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
builddir=${1:-$top/build}; shift || true
ucx_src="$top/build-ucx-src"
"$top/contrib/ucx-src.sh" --dest "$ucx_src" >/dev/null
[ -x "$top/configure" ] || (cd "$top" && ./autogen.sh)
mkdir -p "$builddir"
cd "$builddir"
[ -f Makefile ] || "$top/configure" --with-ucx-src="$ucx_src" "$@"
make -j"$(nproc)"
