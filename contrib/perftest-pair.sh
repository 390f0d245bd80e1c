#!/usr/bin/env bash
# Run one stock ucx_perftest test over rc_vqp on the software device: a
# server and a client process on this host, the module preloaded.
# usage: contrib/perftest-pair.sh MODULE [ucx_perftest client options...]
# Environment: UCX_RC_VQP_* settings apply to both; PERFTEST_TIMEOUT (s).
set -u
module=$1; shift
timeout=${PERFTEST_TIMEOUT:-60}
port=$(( 20000 + (RANDOM % 20000) ))
perftest=${UCX_PERFTEST:-ucx_perftest}
pre="$module"
if [ -n "${PRELOAD_EXTRA:-}" ]; then pre="$PRELOAD_EXTRA $module"; fi

LD_PRELOAD="$pre" timeout "$timeout" "$perftest" -x rc_vqp -d vqp_sw0 -p "$port" >"${TMPDIR:-/tmp}/perftest-server.$$" 2>&1 &
server=$!
# The server listens once its interface is up.
for _ in $(seq 100); do
    if ss -ltn 2>/dev/null | grep -q ":$port "; then break; fi
    sleep 0.05
done
LD_PRELOAD="$pre" timeout "$timeout" "$perftest" localhost -p "$port" -x rc_vqp -d vqp_sw0 "$@"
rc=$?
# A client that failed before connecting leaves the server waiting.
[ $rc -eq 0 ] || kill $server 2>/dev/null
wait $server
src=$?
if [ $src -ne 0 ]; then
    echo "server exited with $src:" >&2
    tail -20 "${TMPDIR:-/tmp}/perftest-server.$$" >&2
fi
rm -f "${TMPDIR:-/tmp}/perftest-server.$$"
[ $rc -eq 0 ] && [ $src -eq 0 ]
