#!/usr/bin/env bash
# Main job: install dependencies, build rc_vqp, show it registered in the
# stock ucx_info, and run the stock ucx_perftest over rc_vqp on the software
# mlx5 device (server and client as two processes on this host).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/contrib/install-deps.sh"
"$top/contrib/build.sh" "$top/build"
module="$top/build/modules/rc_vqp/.libs/libuct_rc_vqp.so"

echo
echo "== LD_PRELOAD=$module ucx_info -d (rc_vqp part)"
LD_PRELOAD="$module" ucx_info -d | awk '/^# Memory domain:/ {p = 0} /Component: rc_vqp/ {p = 1} p'

echo
echo "== ucx_perftest over rc_vqp (device vqp_sw0, UCX_RC_VQP_NUM_QPS=${UCX_RC_VQP_NUM_QPS:-16})"
printf '%-34s %12s %12s %14s %14s\n' test "lat 50% us" "lat avg us" "bw MB/s" "msg/s"
run() { # description, ucx_perftest arguments...
    local desc=$1 line
    shift
    line=$("$top/contrib/perftest-pair.sh" "$module" "$@" 2>&1 | grep '^Final:' || true)
    if [ -z "$line" ]; then
        printf '%-34s %s\n' "$desc" "FAILED"
        return 1
    fi
    # Final: iters lat50 latavg latoverall bwavg bwoverall mravg mroverall
    awk -v d="$desc" '{printf "%-34s %12s %12s %14s %14s\n", d, $3, $4, $7, $9}' <<<"$line"
}
status=0
run "put_lat 8 B (short)"        -t put_lat -s 8 -n 100000 || status=1
run "put_bw 8 B (short)"         -t put_bw -s 8 -D short -n 1000000 || status=1
run "put_bw 1 MiB (zcopy)"       -t put_bw -s 1048576 -D zcopy -n 2000 || status=1
run "put_bw 64 MiB (zcopy)"      -t put_bw -s 67108864 -D zcopy -n 30 -w 3 || status=1
run "get 1 MiB (zcopy)"          -t get -s 1048576 -D zcopy -n 2000 || status=1
run "am_lat 8 B (short)"         -t am_lat -s 8 -n 100000 || status=1
run "am_bw 8 KiB (bcopy)"        -t am_bw -s 8192 -D bcopy -n 100000 || status=1
run "fadd 8 B"                   -t fadd -n 100000 || status=1
exit $status
