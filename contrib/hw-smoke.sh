#!/usr/bin/env bash
# Hardware smoke test of rc_vqp's device control, for a machine with a
# ConnectX (mlx5) HCA: builds the project and runs test/dev/vqp_dev_smoke,
# which opens the first active mlx5 port (or the one given), creates a CQ and
# two RC QPs, connects them to each other in loopback (IB: LID; RoCE: GID,
# with a distinct UDP source port per QP) and checks one RDMA write done with
# a hand-built WQE. Without an mlx5 device it says so and exits 0.
#
# usage: contrib/hw-smoke.sh [--build-dir DIR] [--ucx-src DIR] [--no-build]
#                            [--verbose] [DEVICE[:PORT]]
#   --build-dir DIR  where to configure and build (default: build-hw-smoke)
#   --ucx-src DIR    passed to configure as --with-ucx-src
#   --no-build       reuse an existing build in --build-dir
#   --verbose        UCX debug log (device attributes, GID choice, QP states)
#   DEVICE[:PORT]    e.g. mlx5_0:1 (default: the first active mlx5 port)
# Exit status: 0 passed or no device; 1 the smoke test failed; 2 usage or build
# error. Please report failures with the full output.
set -uo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build_dir="$top/build-hw-smoke"
ucx_src=""
do_build=1
device=""

die() { echo "hw-smoke: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) [ $# -ge 2 ] || die "--build-dir needs a directory"; build_dir=$2; shift 2 ;;
    --ucx-src) [ $# -ge 2 ] || die "--ucx-src needs a directory"; ucx_src=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --verbose) export UCX_LOG_LEVEL=debug; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [ -z "$device" ] || die "only one device may be given"; device=$1; shift ;;
    esac
done

if [ "$do_build" = 1 ]; then
    echo "hw-smoke: building in $build_dir"
    if [ ! -x "$top/configure" ]; then
        (cd "$top" && ./autogen.sh) || die "autogen.sh failed (needs autoconf, automake, libtool)"
    fi
    mkdir -p "$build_dir" || die "cannot create $build_dir"
    build_dir=$(cd "$build_dir" && pwd)
    cd "$build_dir" || die "cannot enter $build_dir"
    if [ ! -f Makefile ]; then
        "$top/configure" ${ucx_src:+--with-ucx-src="$ucx_src"} >configure.log 2>&1 ||
            { tail -n 20 configure.log >&2; die "configure failed (log: $build_dir/configure.log)"; }
    fi
    make -j"$(nproc 2>/dev/null || echo 2)" test/dev/vqp_dev_smoke >make.log 2>&1 ||
        { tail -n 30 make.log >&2; die "build failed (log: $build_dir/make.log)"; }
fi

smoke="$build_dir/test/dev/vqp_dev_smoke"
[ -x "$smoke" ] || die "$smoke not found: build first (drop --no-build)"

# What the machine offers, for the report (informational only).
if command -v ibv_devinfo >/dev/null 2>&1; then
    ibv_devinfo -l 2>/dev/null | sed 's/^/hw-smoke: ibv_devinfo: /'
fi

"$smoke" ${device:+"$device"}
rc=$?
if [ $rc = 0 ]; then
    echo "hw-smoke: OK"
else
    echo "hw-smoke: FAILED (exit $rc); rerun with --verbose for the UCX debug log" >&2
    rc=1
fi
exit $rc
