#!/usr/bin/env bash
# Run contrib/mpi-first-window.c RUNS times with NP ranks over rc_vqp on the
# software device, one line per run; the per-rank output of failing or hung
# runs stays in OUT/run.N (diag logs).
#
# usage: contrib/mpi-first-window.sh BUILD_DIR RUNS [NP] [-- mpirun -x args]
# e.g.   contrib/mpi-first-window.sh build-asan 200 32 -- -x UCX_RC_VQP_RCACHE=try
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd); runs=$2; np=${3:-32}
shift $(( $# >= 3 ? 3 : $# )); [ "${1:-}" = "--" ] && shift
out=${OUT:-/tmp/mpi-first-window}
mkdir -p "$out"
mpicc -O1 -g -o "$out/mpi-first-window" "$top/contrib/mpi-first-window.c" || exit 1
pre="$build/modules/rc_vqp/.libs/libuct_rc_vqp.so"
if grep -q -- '-fsanitize=address' "$build/config.log" 2>/dev/null; then
    pre="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so) $pre"
fi
for i in $(seq "$runs"); do
    rm -rf "$out/run.$i"
    t0=$(date +%s)
    timeout 200 mpirun --allow-run-as-root --oversubscribe -np "$np" \
        --timeout 180 --output-filename "$out/run.$i" \
        --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
        --mca osc ucx --mca btl self --mca mpi_yield_when_idle 1 \
        -x UCX_TLS=rc_vqp -x UCX_NET_DEVICES=vqp_sw0 -x UCX_RC_VQP_SW=y \
        -x LD_PRELOAD="$pre" -x UCX_LOG_LEVEL=diag \
        -x ASAN_OPTIONS=detect_leaks=0 "$@" \
        "$out/mpi-first-window" >"$out/run.$i.log" 2>&1
    rc=$?
    echo "run $i rc=$rc $(($(date +%s) - t0))s" \
        "$(cat "$out/run.$i"/*/rank.0*/stdout 2>/dev/null | grep -E '^(PASS|FAIL)')"
    [ $rc -eq 0 ] && rm -rf "$out/run.$i" "$out/run.$i.log"
done
