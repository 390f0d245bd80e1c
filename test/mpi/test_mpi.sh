#!/usr/bin/env bash
# Open MPI over UCX with the rc_vqp module preloaded into every rank: the
# test_mpi program (point-to-point, collectives, one-sided; every byte
# checked) on 2, 4 and 32 ranks with pml ucx and osc ucx, then NetPIPE
# (NPopenmpi) in its integrity mode and a short timed run. Each rank's UCP
# endpoints must carry tag matching, RMA and atomics on the transport under
# test (UCX's "ep_cfg" info lines). Builds nothing: make builds test_mpi.
#   test_mpi.sh          the CI subset (make check-mpi)
#   test_mpi.sh --full   64 MiB messages, larger windows, NetPIPE to 64 MiB
# Environment:
#   MPI_UCX_TLS          UCX_TLS of the ranks (default rc_vqp)
#   MPI_UCX_TL           the transport that must carry the lanes (default:
#                        the first name in MPI_UCX_TLS)
#   MPI_NET_DEVICES      UCX_NET_DEVICES (default vqp_sw0 when MPI_UCX_TLS
#                        names rc_vqp, else unset; empty leaves it unset);
#                        vqp_sw0 sets UCX_RC_VQP_SW=y unless it is set
#   UCX_RC_VQP_*         passed to every rank
#   MPI_LANES            features that must be carried natively by
#                        MPI_UCX_TL (default "tag rma amo")
#   MPI_TIMEOUT          seconds per mpirun (default 180, 480 in sanitizer
#                        builds)
set -u
: "${top_builddir:?run through make (make check-mpi)}"
# The heavy two-process tests (stock perftest, UCP, MPI) take turns under
# 'make -j check': two at once on 2 cores starve each other's busy pollers.
exec 9>"$top_builddir/heavy-tests.lock"
flock 9
module="$top_builddir/modules/rc_vqp/.libs/libuct_rc_vqp.so"
prog="$top_builddir/test/mpi/test_mpi"
mpirun=${MPIRUN:-mpirun}
netpipe=${NETPIPE:-NPopenmpi}
full=no
[ "${1:-}" != --full ] || full=yes

tls=${MPI_UCX_TLS:-rc_vqp}
tl=${MPI_UCX_TL:-${tls%%,*}}
tl=${tl%%:*}
case ",$tls," in
*,rc_vqp[,:]*) dflt_dev=vqp_sw0 ;;
*) dflt_dev="" ;;
esac
devs=${MPI_NET_DEVICES-$dflt_dev}
# The software device is offered next to real HCAs only when asked for.
[ "$devs" != vqp_sw0 ] || export UCX_RC_VQP_SW=${UCX_RC_VQP_SW:-y}
lanes=${MPI_LANES:-tag rma amo}
# Sanitizer builds run every rank several times slower: 32 ranks on 2 cores
# took 26-183 s per mpirun there (4 of 45 runs over 100 s, with other tests
# running), the default build 10-30 s.
dflt_timeout=180
[ "${ENABLE_ASAN:-no}" != yes ] || dflt_timeout=480
timeout=${MPI_TIMEOUT:-$dflt_timeout}
pre="$module"
if [ "${ENABLE_ASAN:-no}" = yes ]; then
    # The sanitizer runtimes must come first when injected into binaries
    # built without them.
    pre="$($CC -print-file-name=libasan.so) $($CC -print-file-name=libubsan.so) $module"
fi

pass=0; fail=0
ok() { echo "ok - $*"; pass=$((pass + 1)); }
notok() { echo "not ok - $*"; fail=$((fail + 1)); }
finish() {
    echo "$pass passed, $fail failed"
    [ $fail -eq 0 ]
    exit
}

echo "# UCX_TLS=$tls UCX_NET_DEVICES=${devs:-(all)} lanes on $tl"
[ -r "$module" ] || { notok "$module is not built"; finish; }
[ -x "$prog" ] || { notok "$prog is not built (configure needs mpicc: install openmpi-bin libopenmpi-dev)"; finish; }
command -v "$mpirun" >/dev/null || { notok "no $mpirun (install openmpi-bin)"; finish; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
OUT=$tmp/out

# Debian's /etc/openmpi/openmpi-mca-params.conf turns pml ucx and osc ucx
# off; naming them here overrides that, and a component that cannot start
# then aborts the job instead of falling back to another one. 4 ranks on 2
# cores need oversubscription, and ranks that wait must yield the core.
# Prints the merged output; each rank's streams also go to files under $OUT
# (OUT/1/rank.N/stdout|stderr, N zero-padded from 10 ranks on), where lines
# of different ranks do not mix.
mpi() { # np program args...
    local np=$1; shift
    local env=(-x UCX_TLS="$tls" -x LD_PRELOAD="$pre" -x UCX_LOG_LEVEL=info
               -x ASAN_OPTIONS="${ASAN_OPTIONS:-}" -x UBSAN_OPTIONS="${UBSAN_OPTIONS:-}")
    [ -z "$devs" ] || env+=(-x UCX_NET_DEVICES="$devs")
    local v
    for v in $(compgen -e UCX_RC_VQP_); do env+=(-x "$v"); done
    rm -rf "$OUT"
    timeout -k 10 $((timeout + 20)) "$mpirun" --allow-run-as-root --oversubscribe -np "$np" \
        --timeout "$timeout" --output-filename "$OUT" --mca pml ucx --mca pml_ucx_tls any \
        --mca pml_ucx_devices any --mca osc ucx --mca btl self --mca mpi_yield_when_idle 1 \
        "${env[@]}" "$@" 2>&1
}
rank0() { # stdout|stderr: what rank 0 wrote there
    # Open MPI pads the rank to the width of the largest: rank.0, rank.00...
    local d
    for d in "$OUT"/*/rank.0 "$OUT"/*/rank.00 "$OUT"/*/rank.000; do
        [ ! -d "$d" ] || cat "$d/$1" 2>/dev/null
    done
}

# mpirun --timeout exits 110; timeout(1), a backstop, 124 (137 after -k).
timed_out() {
    case $1 in 110 | 124 | 137) echo ", timed out after ${timeout}s" ;; esac
}

# UCX's errors and Open MPI's abort messages, each once; else the last lines.
explain() {
    local why
    why=$(grep -E 'UCX +ERROR|^not ok|^rank [0-9]+:|MPI_ABORT|timeout|[Aa]bort|Sanitizer|signal|error' <<<"$1" |
        grep -vE ' DIAG |many reasons|help_aggregate|sent help message' |
        sed -E 's/^\[[0-9.]+\] \[[^]]*\] *//' | awk '!seen[$0]++' | head -12)
    [ -n "$why" ] || why=$(grep -vE ' (DIAG|INFO) ' <<<"$1" | tail -15)
    sed 's/^/#   /' <<<"$why"
    # The lanes UCP chose before it failed.
    grep -oE 'ep_cfg\[[0-9]+\]:.*' <<<"$1" | sort -u | sed 's/^/#   lanes: /'
}

# Every transport in the ranks' ep_cfg lines is one of UCX_TLS (self, when
# named, for a rank's endpoint to itself), and each feature in $lanes is
# carried by $tl on some endpoint ("rma(rc_vqp/...", not "rma_am(", which is
# RMA emulated over active messages).
lane_check() { # description output
    local desc=$1 out=$2 cfgs res bad="" feat missing=""
    cfgs=$(grep -oE 'ep_cfg\[[0-9]+\]:.*' <<<"$out" | sort -u)
    if [ -z "$cfgs" ]; then
        notok "$desc: lanes: no ep_cfg line from UCX"
        return
    fi
    for res in $(grep -oE '\([^)]*\)' <<<"$cfgs" | tr -d '()' | tr ' ' '\n' | sort -u); do
        case ",$tls," in
        *",${res%%/*},"* | *",${res%%/*}:"*) ;;
        *) bad="$bad $res" ;;
        esac
    done
    for feat in $lanes; do
        grep -oE " $feat\([^)]*\)" <<<"$cfgs" | grep -qE "[( ]$tl/" || missing="$missing $feat"
    done
    if [ -z "$bad$missing" ]; then
        ok "$desc: lanes: $(sed 's/^ep_cfg\[[0-9]*\]: //' <<<"$cfgs" | sort -u | paste -sd '|' | sed 's/|/ | /g')"
    else
        notok "$desc: lanes:${missing:+ no native$missing on $tl;}${bad:+ transports outside UCX_TLS:$bad}"
        sed 's/^/#   /' <<<"$cfgs"
    fi
}

run_test_mpi() { # np [args]
    local np=$1 out rc lines desc
    shift
    desc="test_mpi${1:+ $*} np=$np"
    out=$(mpi "$np" "$prog" "$@")
    rc=$?
    lines=$(rank0 stdout | grep -E '^(ok|not ok) - ')
    [ -z "$lines" ] || sed 's/^/#   /' <<<"$lines"
    if [ $rc -eq 0 ] && rank0 stdout | grep -q '^PASS: 0 checks failed' && ! grep -q '^not ok' <<<"$lines"; then
        ok "$desc: $(grep -c '^ok' <<<"$lines") checks passed"
    else
        notok "$desc: exit $rc, $(grep -c '^not ok' <<<"$lines") checks failed$(timed_out $rc)"
        explain "$out"
        return
    fi
    lane_check "$desc" "$out"
}

run_test_mpi 2 ${1:+"$@"}
run_test_mpi 4 ${1:+"$@"}
# Scale: each of 32 ranks connects to 31 peers, two endpoints per peer of
# NUM_QPS + 1 = 17 QPs: 1054 QPs and 62 endpoints in one process, which
# neither the software device's former 1024 QPs nor a worst-case CQ
# reservation per endpoint allowed.
run_test_mpi 32

# The checks must be able to fail: with one byte of every received buffer
# flipped, every pattern check fails (40 of them); only those with nothing to
# compare (0 bytes) or that compare sums (Allreduce, Accumulate) still pass.
out=$(mpi 2 "$prog" --corrupt)
rc=$?
wrongly_ok=$(rank0 stdout | grep -E '^ok - ' | grep -vE ' 0 bytes|Allreduce|Accumulate')
nbad=$(rank0 stdout | grep -c '^not ok - ')
if [ $rc -ne 0 ] && [ "$nbad" -ge 40 ] && [ -z "$wrongly_ok" ]; then
    ok "test_mpi --corrupt np=2 fails as it must: exit $rc, $nbad checks caught the damage"
else
    notok "test_mpi --corrupt np=2: exit $rc, $nbad checks failed (expected 40)$(timed_out $rc)"
    [ -z "$wrongly_ok" ] || sed 's/^/#   passed despite the damage: /' <<<"$wrongly_ok"
    explain "$out"
fi

# NetPIPE: integrity mode checks the data of each size (1 B up, with +-1 byte
# perturbations); then a short timed run reports the bandwidth. Rank 0
# reports each size on stderr.
if ! command -v "$netpipe" >/dev/null; then
    notok "no $netpipe (install netpipe-openmpi)"
    finish
fi
upper=$((4 * 1024 * 1024))
[ $full = no ] || upper=$((64 * 1024 * 1024))
out=$(cd "$tmp" && mpi 2 "$netpipe" -i -l 1 -u $upper -n 3 -p 1)
rc=$?
sizes=$(rank0 stderr | grep -E '^ *[0-9]+: +[0-9]+ bytes')
nsize=$(grep -c . <<<"$sizes")
npass=$(grep -c 'Integrity check passed$' <<<"$sizes")
if [ $rc -eq 0 ] && grep -q " $((upper + 1)) bytes" <<<"$sizes" && [ "$npass" -eq "$nsize" ] &&
    ! rank0 stderr | grep -q 'Integrity check failed'; then
    ok "NPopenmpi -i 1 B .. $((upper + 1)) B: $npass sizes, integrity check passed on each"
else
    notok "NPopenmpi -i 1 B .. $((upper + 1)) B: exit $rc, $npass of $nsize sizes passed the integrity check$(timed_out $rc)"
    { rank0 stderr | grep 'Integrity check failed'; grep -v 'Integrity check passed$' <<<"$sizes"; } |
        grep . | head -5 | sed 's/^/#   /'
    explain "$out"
    out=""
fi
# NetPIPE only uses tag matching.
[ -z "$out" ] || lanes=tag lane_check "NPopenmpi" "$out"
out=$(cd "$tmp" && mpi 2 "$netpipe" -l 1 -u $upper -n 10 -p 0 -o "$tmp/np.out")
rc=$?
last=$(tail -1 "$tmp/np.out" 2>/dev/null)
if [ $rc -eq 0 ] && [ -n "$last" ] && [ "$(awk '{print $1}' <<<"$last")" = $upper ]; then
    ok "NPopenmpi 1 B .. $upper B: $(awk '{printf "%d bytes at %.0f Mbps (%.1f us)", $1, $2, $3 * 1e6}' <<<"$last"), 8 B in $(awk '$1 == 8 {printf "%.2f us", $3 * 1e6}' "$tmp/np.out")"
else
    notok "NPopenmpi 1 B .. $upper B: exit $rc, last line: ${last:-none}$(timed_out $rc)"
    explain "$out"
fi
finish
