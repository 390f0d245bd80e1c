#!/usr/bin/env bash
# Run one stock ucx_perftest UCP test (tag_lat, ucp_put_bw, ...) between a
# server and a client process on this host, with the rc_vqp module preloaded
# into both. UCP picks transports from the environment, so the caller sets
# UCX_TLS (and UCX_NET_DEVICES); nothing here names a transport.
# usage: contrib/ucp-pair.sh MODULE [ucx_perftest client options...]
# Environment: UCX_* settings apply to both processes; PERFTEST_TIMEOUT (s);
# PRELOAD_EXTRA (libraries preloaded ahead of the module, e.g. ASan);
# UCP_PAIR_SERVER_LOG (keep the server's output in this file); PERFTEST_BIN
# (default ucx_perftest; not UCX_*: UCX warns about unknown UCX_ variables).
# The client's output goes to stdout, its errors to stderr; the exit status is
# 0 only when both processes exit 0.
set -u
module=$1; shift
timeout=${PERFTEST_TIMEOUT:-60}
perftest=${PERFTEST_BIN:-ucx_perftest}
pre="$module"
if [ -n "${PRELOAD_EXTRA:-}" ]; then pre="$PRELOAD_EXTRA $module"; fi
srvlog=${UCP_PAIR_SERVER_LOG:-${TMPDIR:-/tmp}/ucp-pair-server.$$}

# From /proc (ss is not in every image): a socket in state 0A (LISTEN) on
# the port, IPv4 or IPv6.
listening() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# A port another process holds makes the server exit at once: try another.
for _ in 1 2 3 4 5; do
    port=$(( 20000 + (RANDOM % 20000) ))
    LD_PRELOAD="$pre" timeout -k 5 "$timeout" "$perftest" -p "$port" >"$srvlog" 2>&1 &
    server=$!
    # The server listens once its worker is up.
    for _ in $(seq 200); do
        if listening $port; then break 2; fi
        kill -0 $server 2>/dev/null || break
        sleep 0.05
    done
    kill $server 2>/dev/null
    wait $server 2>/dev/null
    server=""
done
if [ -z "$server" ]; then
    echo "ucp-pair: the ucx_perftest server did not listen:" >&2
    tail -20 "$srvlog" >&2
    [ -n "${UCP_PAIR_SERVER_LOG:-}" ] || rm -f "$srvlog"
    exit 1
fi

LD_PRELOAD="$pre" timeout -k 5 "$timeout" "$perftest" localhost -p "$port" "$@"
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "ucp-pair: client timed out after ${timeout}s" >&2
fi
# A client that failed before connecting leaves the server waiting.
[ $rc -eq 0 ] || kill $server 2>/dev/null
wait $server
src=$?
if [ $src -ne 0 ]; then
    echo "ucp-pair: server exited with $src:" >&2
    tail -20 "$srvlog" >&2
fi
[ -n "${UCP_PAIR_SERVER_LOG:-}" ] || rm -f "$srvlog"
[ $rc -eq 0 ] && [ $src -eq 0 ]
