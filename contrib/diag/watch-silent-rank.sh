#!/usr/bin/env bash
# Run the MPI first-window reproducer RUNS times; whenever a rank logs
# "no answer from sw pid P" (a connection to P timed out), attach gdb to P at
# once and dump the counters of a build made with hang-counters.patch
# (hang-dump.py), or at least its stacks. Output: OUT/r.N.{log,stat.P,gdb.P}.
#
# usage: contrib/diag/watch-silent-rank.sh MODULE_SO RUNS [OUT]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd); top=$(cd "$here/../.." && pwd)
so=$1; runs=$2; out=${3:-/tmp/watch-silent-rank}
stat="$top/build/src/sw/vqp_sw_stat"
mkdir -p "$out"
mpicc -O1 -g -o "$out/mpi-first-window" "$top/contrib/mpi-first-window.c" || exit 1
for i in $(seq "$runs"); do
    timeout 100 mpirun --allow-run-as-root --oversubscribe -np 32 --timeout 90 \
        --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
        --mca osc ucx --mca btl self --mca mpi_yield_when_idle 1 \
        -x UCX_TLS=rc_vqp -x UCX_NET_DEVICES=vqp_sw0 -x UCX_RC_VQP_SW=y \
        -x LD_PRELOAD="$so" -x UCX_LOG_LEVEL=diag \
        "$out/mpi-first-window" >"$out/r.$i.log" 2>&1 &
    mp=$!; t0=$(date +%s); dumped=""
    while kill -0 $mp 2>/dev/null; do
        sleep 0.3
        for p in $(grep -o "no answer from sw pid [0-9]*" "$out/r.$i.log" |
                   awk '{print $NF}' | sort -u | head -2); do
            case " $dumped " in *" $p "*) continue ;; esac
            dumped="$dumped $p"
            "$stat" 2>/dev/null | grep -A2 "pid $p " >"$out/r.$i.stat.$p"
            timeout 60 gdb -batch -q -p "$p" -ex 'set pagination off' \
                -x "$here/hang-dump.py" -ex 'thread apply all bt 20' \
                >"$out/r.$i.gdb.$p" 2>&1
        done
    done
    wait $mp; rc=$?
    echo "run $i rc=$rc $(($(date +%s) - t0))s dumped:$dumped"
    [ $rc -eq 0 ] && rm -f "$out/r.$i.log"
done
