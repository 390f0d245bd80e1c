#!/usr/bin/env bash
# Profile one rc_vqp ucx_perftest cell with perf: server and client each run
# under 'perf record' (cpu-clock samples), then the top symbols of each side
# are printed with their shared object.
# usage: contrib/bench/profile.sh MODULE OUTDIR ucx_perftest-client-options...
#   e.g. contrib/bench/profile.sh build-perf/modules/rc_vqp/.libs/libuct_rc_vqp.so \
#        /tmp/prof -t am_lat -D short -s 8 -n 300000 -w 10000
# Environment: PROFILE_TOP (symbols per side, default 25), UCX_RC_VQP_*.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
module=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
outdir=$2
shift 2
top=${PROFILE_TOP:-25}
if ! command -v perf >/dev/null; then
    echo "profile: perf not found (Debian package linux-perf)" >&2
    exit 1
fi
mkdir -p "$outdir"

port=$((20000 + RANDOM % 20000))
perf record -q -e cpu-clock -F 10000 -o "$outdir/server.data" -- \
    env LD_PRELOAD="$module" timeout 120 ucx_perftest -p "$port" \
    >"$outdir/server.log" 2>&1 &
server=$!
for _ in $(seq 250); do
    if ss -ltn 2>/dev/null | grep -q ":$port "; then break; fi
    sleep 0.02
done
perf record -q -e cpu-clock -F 10000 -o "$outdir/client.data" -- \
    env LD_PRELOAD="$module" timeout 120 ucx_perftest 127.0.0.1 -p "$port" \
    -x rc_vqp -d vqp_sw0 "$@" -f -v 2>&1 | tee "$outdir/client.log" | tail -n 1
wait "$server"

for side in client server; do
    echo "== $side: top $top symbols (self time)"
    perf report -q -i "$outdir/$side.data" --no-children --sort dso,symbol \
        --percent-limit 0.5 2>/dev/null | head -n "$top"
done
