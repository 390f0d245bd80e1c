#!/usr/bin/env bash
# Run one stock ucx_perftest test over rc_vqp on the software device: a
# server and a client process on this host, the module preloaded.
# usage: contrib/perftest-pair.sh MODULE [ucx_perftest client options...]
# Environment: UCX_RC_VQP_* settings apply to both; PERFTEST_TIMEOUT (s).
set -u
module=$1; shift
timeout=${PERFTEST_TIMEOUT:-60}
perftest=${UCX_PERFTEST:-ucx_perftest}
pre="$module"
if [ -n "${PRELOAD_EXTRA:-}" ]; then pre="$PRELOAD_EXTRA $module"; fi
log="${TMPDIR:-/tmp}/perftest-server.$$"
server=

# A random port can be taken (tests running in parallel, other listeners):
# skip ports in use, and start again on another one when the server could
# not bind all the same.
for attempt in 1 2 3 4 5; do
    port=$(( 20000 + (RANDOM % 20000) ))
    if ss -tan 2>/dev/null | grep -q ":$port "; then continue; fi
    LD_PRELOAD="$pre" timeout "$timeout" "$perftest" -x rc_vqp -d vqp_sw0 -p "$port" >"$log" 2>&1 &
    server=$!
    # The server listens once its interface is up.
    for _ in $(seq 100); do
        if ss -ltn 2>/dev/null | grep -q ":$port "; then break; fi
        kill -0 $server 2>/dev/null || break
        sleep 0.05
    done
    if kill -0 $server 2>/dev/null || ! grep -q "Address already in use" "$log"; then
        break
    fi
    wait $server
    echo "perftest-pair: port $port taken (attempt $attempt), another one" >&2
    server=
done
if [ -z "$server" ]; then
    echo "perftest-pair: no free port found for the server" >&2
    exit 1
fi
LD_PRELOAD="$pre" timeout "$timeout" "$perftest" localhost -p "$port" -x rc_vqp -d vqp_sw0 "$@"
rc=$?
# A client that failed before connecting leaves the server waiting.
[ $rc -eq 0 ] || kill $server 2>/dev/null
wait $server
src=$?
if [ $src -ne 0 ]; then
    echo "server exited with $src:" >&2
    tail -20 "$log" >&2
fi
rm -f "$log"
[ $rc -eq 0 ] && [ $src -eq 0 ]
