#!/usr/bin/env bash
# The stock ucx_perftest UCP tests (tag matching, put, get, active messages,
# stream, atomics) between two processes over the transport(s) in UCP_TLS,
# rc_vqp by default, with the module preloaded. Every run must end with a
# "Final:" result line and its endpoint must carry the test's feature on the
# transport under test (the client's "ep_cfg" info line, e.g. "rma(rc_vqp/..."
# and not "rma_am(" which is RMA emulated over active messages). A lane check
# first asks ucx_info which lanes an endpoint gets for tag, RMA, atomics, AM
# and stream together.
#   test_ucp_perftest.sh          the CI subset (make check-ucp)
#   test_ucp_perftest.sh --full   every test at sizes 8 B .. 64 MiB (make check-ucp-full)
# Environment:
#   UCP_TLS          UCX_TLS for both processes (default rc_vqp)
#   UCP_TL           the transport that must carry the lanes (default: the
#                    first name in UCP_TLS)
#   UCP_NET_DEVICES  UCX_NET_DEVICES (default vqp_sw0 when UCP_TLS names
#                    rc_vqp, else unset; set it empty to leave it unset);
#                    vqp_sw0 sets UCX_RC_VQP_SW=y unless it is set
#   UCX_RC_VQP_*     reach both processes as they are
#   UCP_LANES        features that must be carried natively by UCP_TL, in the
#                    lane check and in each run (default "tag rma amo am
#                    stream"); those left out may be emulated over AM
#   PERFTEST_TIMEOUT seconds per process (default 120)
set -u
: "${top_builddir:?run through make (make check-ucp)}"
# The heavy two-process tests (stock perftest, UCP, MPI) take turns under
# 'make -j check': two at once on 2 cores starve each other's busy pollers.
exec 9>"$top_builddir/heavy-tests.lock"
flock 9
module="$top_builddir/modules/rc_vqp/.libs/libuct_rc_vqp.so"
pair="$top_srcdir/contrib/ucp-pair.sh"
ucx_info="${UCX_BINDIR:-/usr/bin}/ucx_info"
export PERFTEST_BIN="${UCX_BINDIR:-/usr/bin}/ucx_perftest"
if [ "${ENABLE_ASAN:-no}" = yes ]; then
    # Stock binaries need the sanitizer runtimes ahead of the module.
    export PRELOAD_EXTRA="$($CC -print-file-name=libasan.so) $($CC -print-file-name=libubsan.so)"
fi
pre="$module"
[ -z "${PRELOAD_EXTRA:-}" ] || pre="$PRELOAD_EXTRA $module"
export PERFTEST_TIMEOUT=${PERFTEST_TIMEOUT:-120}

tls=${UCP_TLS:-rc_vqp}
tl=${UCP_TL:-${tls%%,*}}
tl=${tl%%:*}
export UCX_TLS=$tls
case ",$tls," in
*,rc_vqp[,:]*) dflt_dev=vqp_sw0 ;;
*) dflt_dev="" ;;
esac
devs=${UCP_NET_DEVICES-$dflt_dev}
if [ -n "$devs" ]; then export UCX_NET_DEVICES=$devs; else unset UCX_NET_DEVICES; fi
# The software device is offered next to real HCAs only when asked for.
[ "$devs" != vqp_sw0 ] || export UCX_RC_VQP_SW=${UCX_RC_VQP_SW:-y}
lanes=${UCP_LANES:-tag rma amo am stream}
# UCP prints which transport carries each feature of a new endpoint
# configuration at info level; Debian's UCX keeps info messages.
export UCX_LOG_LEVEL=info

echo "# UCX_TLS=$UCX_TLS UCX_NET_DEVICES=${UCX_NET_DEVICES:-(all)} lanes on $tl"
[ -r "$module" ] || { echo "not ok - module $module is not built"; exit 1; }

pass=0; fail=0
ok() { echo "ok - $*"; pass=$((pass + 1)); }
notok() { echo "not ok - $*"; fail=$((fail + 1)); }
# Why a run failed: UCX's errors (e.g. "no auxiliary transport") and the
# harness's own messages, each once; without any, the end of the output.
explain() {
    local why
    why=$(grep -E 'UCX +ERROR|ucp-pair:|Failed|[Aa]bort|[Ss]egmentation|Sanitizer' <<<"$1" |
        sed -E 's/^\[[0-9.]+\] \[[^]]*\] *//' | awk '!seen[$0]++' | head -8)
    [ -n "$why" ] || why=$(grep -vE ' (DIAG|INFO) ' <<<"$1" | tail -10)
    sed 's/^/#   /' <<<"$why"
}

# feature_on CFG FEATURE [emul]: every resource in "FEATURE(res res ...)" of
# the ep_cfg line CFG is a device of $tl; with 'emul', FEATURE emulated over
# active messages ("rma_am(...)") is accepted too. Prints the field, or what
# is wrong.
feature_on() {
    local cfg=$1 feat=$2 field res pat=$2
    [ "${3:-}" != emul ] || pat="$feat(_am)?"
    field=$(grep -oE "(^| )$pat\([^)]*\)" <<<"$cfg" | sed "s/^ //")
    if [ -z "$field" ]; then
        echo "no $feat lane (ep_cfg:${cfg#*:})"
        return 1
    fi
    for res in $(sed 's/^[a-z_]*(\(.*\))$/\1/' <<<"$field"); do
        if [ "${res%%/*}" != "$tl" ]; then
            echo "$field: $res is not $tl"
            return 1
        fi
    done
    echo "$field"
}

# ---------------------------------------------------------------- lane check
# ucx_info connects an endpoint to its own worker's address; -P intra treats
# the peer as another process of this host (the default, self, would pick the
# loopback transport 'self').
out=$(LD_PRELOAD="$pre" timeout -k 5 60 "$ucx_info" -e -u tarms -P intra 2>&1)
rc=$?
cfg=$(grep -oE 'ep_cfg\[[0-9]+\]:.*' <<<"$out" | head -1)
if [ $rc -ne 0 ] || [ -z "$cfg" ]; then
    notok "ucx_info -e -u tarms: an endpoint over $tls (exit $rc)"
    explain "$out"
else
    ok "ucx_info -e -u tarms: an endpoint over $tls: ${cfg#*: }"
    for feat in $lanes; do
        if why=$(feature_on "$cfg" "$feat"); then
            ok "ucx_info: $tl carries the $feat lanes: $why"
        else
            notok "ucx_info: $tl carries the $feat lanes: $why"
        fi
    done
    # The lane table: the lane marked 'am' (tag, AM and stream protocols),
    # the atomic lanes (amo#N) and the RMA lanes (put[N]) are all on $tl.
    for name in am amo rma; do
        case "$name: $lanes " in
        am:*" tag "* | am:*" am "* | am:*" stream "* | amo:*" amo "* | rma:*" rma "*) ;;
        *) continue ;;
        esac
        case $name in
        am) idx=$(sed -nE 's/^# *lane\[([0-9]+)\]:.* am( .*)?$/\1/p' <<<"$out") ;;
        amo) idx=$(sed -nE 's/^# *lane\[([0-9]+)\]:.* amo#.*/\1/p' <<<"$out") ;;
        rma) idx=$(sed -nE 's/^# *put\[([0-9]+)\]:.*/\1/p' <<<"$out") ;;
        esac
        if [ -z "$idx" ]; then
            notok "ucx_info lane table: no $name lane"
            grep -E 'lane\[' <<<"$out" | sed 's/^/#   /'
            continue
        fi
        bad=""
        for i in $idx; do
            grep -qE "lane\[$i\]: +[0-9]+:$tl/" <<<"$out" || bad="$bad $i"
        done
        if [ -z "$bad" ]; then
            ok "ucx_info lane table: $name lanes [$(echo $idx)] are $tl"
        else
            notok "ucx_info lane table: $name lanes [$(echo $bad)] are not $tl"
            grep -E 'lane\[' <<<"$out" | sed 's/^/#   /'
        fi
    done
    # The software device's estimates (bandwidth, latency) put UCP's
    # rendezvous threshold where rendezvous is the faster protocol: within
    # 64 KiB (282 KB with the estimates before 26 Nov 2026, 2-4x slower
    # messages; docs/performance.md).
    if [ "$tl" = rc_vqp ] && [ "${UCX_NET_DEVICES:-}" = vqp_sw0 ] &&
        [ -z "${UCX_RNDV_THRESH:-}" ]; then
        proto=$(grep -E '^# +tag_send: ' <<<"$out" | head -1)
        rndv=$(sed -nE 's/.*\.\.([0-9]+)\.\.<rndv>.*/\1/p' <<<"$proto")
        if [ -n "$rndv" ] && [ "$rndv" -le 65536 ]; then
            ok "ucx_info: tag messages go by rendezvous from $rndv bytes (<= 64 KiB)"
        else
            notok "ucx_info: tag messages go by rendezvous from ${rndv:-?} bytes, not within 64 KiB: ${proto#*: }"
        fi
    fi
fi

# ------------------------------------------------------------ perftest runs
feature_of() {
    case $1 in
    tag_*) echo tag ;;
    ucp_put_* | ucp_get) echo rma ;;
    ucp_add | ucp_fadd | ucp_swap | ucp_cswap) echo amo ;;
    ucp_am_*) echo am ;;
    stream_*) echo stream ;;
    esac
}

run() { # test size iterations [more ucx_perftest options]
    local t=$1 s=$2 n=$3 out rc final cfg why feat
    shift 3
    local desc="$t -s $s -n $n $*" level=info
    feat=$(feature_of "$t")
    # UCP prints no ep_cfg line for an endpoint of atomics only: read its
    # lane table (debug level) instead.
    [ "$feat" != amo ] || level=debug
    out=$(UCX_LOG_LEVEL=$level "$pair" "$module" -t "$t" -s "$s" -n "$n" "$@" 2>&1)
    rc=$?
    final=$(grep '^Final:' <<<"$out" | tr -s ' ')
    cfg=$(grep -oE 'ep_cfg\[[0-9]+\]:.*' <<<"$out" | head -1)
    if [ -z "$cfg" ] && [ "$feat" = amo ]; then
        cfg=$(amo_cfg "$out")
    fi
    # Features left out of UCP_LANES may be emulated (e.g. RMA over tcp).
    local emul=emul
    case " $lanes " in *" $feat "*) emul="" ;; esac
    if [ $rc -ne 0 ] || [ -z "$final" ]; then
        notok "$desc (exit $rc, no result line)"
        explain "$out"
    elif ! why=$(feature_on "$cfg" "$feat" $emul); then
        notok "$desc: $why"
    else
        ok "$desc: $why: $final"
    fi
}

# An "amo(res ...)" field built from the debug lane table ("lane[0]:
# 0:rc_vqp/vqp_sw0.0 md[0] -> ... amo#0"), for feature_on.
amo_cfg() {
    local res
    res=$(sed -nE 's/.*lane\[[0-9]+\]: +[0-9]+:([^ ]+) .* amo#[0-9].*/\1/p' <<<"$1" |
        sed -E 's/\.[0-9]+$//' | awk '!seen[$0]++' | tr '\n' ' ' | sed 's/ $//')
    [ -z "$res" ] || echo "lanes: amo($res)"
}

# Iterations for bandwidth runs: about 64 MB per run (CI) or 256 MB (full),
# and at least a few messages.
iters() { # size budget
    local n=$(($2 / $1))
    [ $n -ge 5 ] || n=5
    [ $n -le 20000 ] || n=20000
    echo $n
}

if [ "${1:-}" = --full ]; then
    for t in tag_lat tag_bw ucp_put_bw ucp_get ucp_am_bw stream_bw; do
        for s in 8 64 4095 8192 65537 1048576 8388613 67108864; do
            run $t $s $(iters $s 268435456) -w 3
        done
    done
    run ucp_put_lat 8 2000 -w 100
    run ucp_am_lat 8 2000 -w 100
    run stream_lat 8 2000 -w 100
    run tag_sync_lat 8 2000 -w 100
    run tag_bw 1048579 50 -w 3 -D iov,iov
    run tag_bw 8193 1000 -w 10 -U
    for t in ucp_add ucp_fadd ucp_swap ucp_cswap; do
        run $t 8 2000 -w 100
        run $t 4 2000 -w 100
    done
else
    run tag_lat 8 2000 -w 100
    # -E sleep: ucp_worker_wait sleeps on the worker's fd between
    # progress calls, armed through rc_vqp's iface_event_arm; a lost wakeup
    # hangs until PERFTEST_TIMEOUT and fails the run.
    run tag_lat 8 2000 -w 100 -E sleep
    run tag_bw 1048579 40 -w 2 -E sleep
    run tag_bw 8193 2000 -w 10
    # Rendezvous, not a multiple of a page or fragment.
    run tag_bw 1048579 40 -w 2
    # With error handling (-e): UCP takes rc_vqp's rendezvous lane only
    # because its memory domain can invalidate (UCT_MD_FLAG_INVALIDATE).
    run tag_bw 1048579 40 -w 2 -e
    run ucp_put_bw 8 2000 -w 100
    run ucp_put_bw 1048579 40 -w 2
    run ucp_get 8 2000 -w 100
    run ucp_get 1048579 40 -w 2
    run ucp_am_bw 8 2000 -w 100
    run ucp_am_bw 1048579 20 -w 2
    run stream_bw 8 2000 -w 100
    run stream_bw 1048579 20 -w 2
    run ucp_fadd 8 1000 -w 100
    run ucp_cswap 4 1000 -w 100
    # The largest size of each bandwidth test (64 MiB), a few iterations.
    for t in tag_bw ucp_put_bw ucp_get ucp_am_bw stream_bw; do
        run $t 67108864 3 -w 1
    done
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
