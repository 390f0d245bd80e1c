#!/usr/bin/env bash
# End-to-end benchmark suite: stock ucx_perftest over rc_vqp (software device)
# and over UCX's own cma and posix transports, for put_bw, put_lat, get_bw,
# am_lat and am_bw at 8 B .. 8 MiB. Each cell is run several times, each run
# with its own server/client pair; the median is kept. Writes raw.tsv,
# results.json, results.md (table with rc_vqp/cma and rc_vqp/posix ratios)
# and bw.png (bandwidth vs size) into the output directory, and prints the
# table.
#
# usage: contrib/bench/run.sh [-m MODULE] [-o OUTDIR] [-r RUNS] [-q]
#   -m  libuct_rc_vqp.so (default: build-perf, then build, under the tree)
#   -o  output directory (default: ./bench-results)
#   -r  runs per cell (default 5)
#   -q  quick: a tenth of the iterations (a smoke run, not for numbers)
# Environment: UCX_RC_VQP_* apply to rc_vqp runs and are recorded;
#   UCX_PERFTEST (default ucx_perftest); BENCH_PIN=1 pins server and client
#   to CPUs 0 and 1; BENCH_TIMEOUT seconds per process (default 30);
#   BENCH_COMMIT names the module's source commit when the tree running this
#   is not the one it was built from (default: this tree's HEAD).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

module=
outdir=bench-results
runs=5
scale=1
while getopts "m:o:r:qh" opt; do
    case $opt in
    m) module=$OPTARG ;;
    o) outdir=$OPTARG ;;
    r) runs=$OPTARG ;;
    q) scale=10 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done

if [ -z "$module" ]; then
    for b in build-perf build; do
        m="$top/$b/modules/rc_vqp/.libs/libuct_rc_vqp.so"
        if [ -f "$m" ]; then module=$m; break; fi
    done
fi
if [ -z "$module" ] || [ ! -f "$module" ]; then
    echo "bench: libuct_rc_vqp.so not found; build first or pass -m MODULE" >&2
    exit 1
fi
module=$(cd "$(dirname "$module")" && pwd)/$(basename "$module")
perftest=${UCX_PERFTEST:-ucx_perftest}
if ! command -v "$perftest" >/dev/null; then
    echo "bench: $perftest not found (Debian package ucx-utils)" >&2
    exit 1
fi
timeout_s=${BENCH_TIMEOUT:-30}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
logdir=$outdir/logs
rm -rf "$logdir"
mkdir -p "$logdir"

# ---------------------------------------------------------------- the plan
sizes="8 4096 65536 1048576 8388608"
tests="put_bw put_lat get_bw am_lat am_bw"

# cells TEST TRANSPORT SIZE: one line per cell to run, "LAYOUT ROLE WHY...",
# where ROLE is primary (the transport's best layout, used for the ratios) or
# extra (another layout reported for reference) and WHY says why the layout;
# or one line "n/a REASON".
cells() {
    local test=$1 tl=$2 size=$3
    case $tl/$test in
    rc_vqp/put_*)
        if [ "$size" -le 128 ]; then
            echo "short primary inline in the WQE (<= MAX_INLINE 128 B)"
            echo "bcopy extra copy into a registered bounce buffer"
        elif [ "$size" -le 8192 ]; then
            echo "zcopy primary RDMA write from the user buffer"
            echo "bcopy extra copy into a registered bounce buffer (<= SEG_SIZE 8 KiB)"
        else
            echo "zcopy primary RDMA write from the user buffer (bcopy <= 8 KiB)"
        fi ;;
    rc_vqp/get_bw)
        if [ "$size" -le 8192 ]; then
            echo "zcopy primary RDMA read into the user buffer"
            echo "bcopy extra RDMA read into a bounce buffer, then copy"
        else
            echo "zcopy primary RDMA read into the user buffer (bcopy <= 8 KiB)"
        fi ;;
    rc_vqp/am_*)
        if [ "$size" -le 128 ]; then
            echo "short primary inline send (<= 128 B)"
        elif [ "$size" -le 8192 ]; then
            echo "bcopy primary send from a bounce buffer"
            echo "zcopy extra send from the user buffer"
        else
            echo "n/a rc_vqp active messages are at most SEG_SIZE (8 KiB)"
        fi ;;
    cma/put_* | cma/get_bw)
        echo "zcopy primary the only layout cma has (process_vm_writev/readv)" ;;
    cma/am_*) echo "n/a cma has no active messages" ;;
    posix/put_*)
        echo "short primary put_short has no size limit on posix: one memcpy" ;;
    posix/get_bw) echo "bcopy primary the only get layout posix has" ;;
    posix/am_*)
        if [ "$size" -le 100 ]; then
            echo "short primary into the FIFO element (<= 100 B)"
        elif [ "$size" -le 8256 ]; then
            echo "bcopy primary the only AM layout above 100 B (<= 8256 B)"
        else
            echo "n/a posix active messages are at most 8256 B (am_bcopy)"
        fi ;;
    esac
}

# Iterations of one run: enough for ~0.05-0.5 s of transfer per run on a quiet
# machine. rc_vqp am_bw at 8 B slows down by orders of magnitude over long
# runs (receiver-not-ready stalls), so am_bw 8 B runs fewer iterations.
iters() {
    local test=$1 size=$2 n
    case $test in
    *_lat) case $size in 8) n=20000 ;; 4096) n=10000 ;; 65536) n=2000 ;;
                         1048576) n=200 ;; *) n=50 ;; esac ;;
    am_bw) case $size in 8) n=50000 ;; *) n=20000 ;; esac ;;
    *)     case $size in 8) n=200000 ;; 4096) n=50000 ;; 65536) n=10000 ;;
                         1048576) n=1000 ;; *) n=200 ;; esac ;;
    esac
    n=$((n / scale))
    [ "$n" -ge 10 ] || n=10
    echo "$n"
}

# ------------------------------------------------------------ one run
# start_server LOG PRELOAD PIN: starts a ucx_perftest server on a free port;
# sets $server (pid) and $port. Fails if three ports in a row could not be
# bound (another process may take a port between the check and the bind).
start_server() {
    local log=$1 pre=$2 pin=$3 attempt
    for attempt in 1 2 3; do
        port=$((20000 + RANDOM % 20000))
        if ss -tan 2>/dev/null | grep -q ":$port "; then continue; fi
        # shellcheck disable=SC2086
        LD_PRELOAD=$pre timeout "$timeout_s" "$perftest" -p "$port" $pin \
            >"$log.server" 2>&1 &
        server=$!
        for _ in $(seq 250); do
            if ss -ltn 2>/dev/null | grep -q ":$port "; then return 0; fi
            kill -0 "$server" 2>/dev/null || break
            sleep 0.02
        done
        kill "$server" 2>/dev/null || true
        wait "$server" || true
        echo "  server on port $port did not come up (attempt $attempt)" >&2
    done
    return 1
}

# perftest_pair LOG TRANSPORT CLIENT-OPTIONS...: one server and one client,
# their output in LOG.server and LOG.client; prints the client's CSV result
# line, returns non-zero on failure.
perftest_pair() {
    local log=$1 tl=$2; shift 2
    local dev=memory pre='' server port rc src
    if [ "$tl" = rc_vqp ]; then dev=vqp_sw0; pre=$module; fi
    local spin='' cpin=''
    if [ "${BENCH_PIN:-0}" = 1 ]; then spin="-c 0"; cpin="-c 1"; fi
    start_server "$log" "$pre" "$spin" || return 1
    rc=0
    # shellcheck disable=SC2086
    LD_PRELOAD=$pre timeout "$timeout_s" "$perftest" 127.0.0.1 -p "$port" \
        -x "$tl" -d "$dev" $cpin "$@" -f -v >"$log.client" 2>&1 || rc=$?
    # A client that failed before connecting leaves the server waiting.
    [ $rc -eq 0 ] || kill "$server" 2>/dev/null || true
    src=0
    wait "$server" || src=$?
    if [ $rc -ne 0 ] || [ $src -ne 0 ]; then
        echo "  run failed (client $rc, server $src): $tl $*; logs $log.*" >&2
        return 1
    fi
    # The result is the last line that starts with the iteration count.
    grep -E '^ *[0-9]+,' "$log.client" | tail -1 | tr -d ' '
}

# ---------------------------------------------------------------- setup
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${load_before%% *}" 'BEGIN { exit !(l > 0.5) }'; then
    echo "bench: warning: load average $load_before; the machine is not quiet" >&2
fi

raw=$outdir/raw.tsv
: >"$raw"
printf 'test\ttransport\tlayout\tsize\trole\trun\tstatus\tcsv\n' >"$raw"
napath=$outdir/na.tsv
: >"$napath"
whypath=$outdir/layouts.tsv
: >"$whypath"

# Runs are interleaved: for each test and size, run 1 of every transport and
# layout, then run 2, ...; so a change of machine load hits all of a ratio's
# terms alike.
ngroups=0
for test in $tests; do for size in $sizes; do ngroups=$((ngroups + 1)); done; done
echo "bench: $ngroups test/size groups x $runs runs; module $module; results in $outdir"

start=$(date +%s)
group=0
for test in $tests; do
    ptest=$test
    if [ "$test" = get_bw ]; then ptest="get"; fi
    for size in $sizes; do
        group=$((group + 1))
        n=$(iters "$test" "$size")
        w=$((n / 10))
        torun=()
        for tl in rc_vqp cma posix; do
            while read -r layout role why; do
                if [ "$layout" = n/a ]; then
                    printf '%s\t%s\t%s\t%s\n' "$test" "$tl" "$size" "$role $why" >>"$napath"
                else
                    printf '%s\t%s\t%s\t%s\t%s\n' "$test" "$tl" "$size" "$layout" \
                        "$why" >>"$whypath"
                    torun+=("$tl $layout $role")
                fi
            done < <(cells "$test" "$tl" "$size")
        done
        what="all n/a"
        if [ ${#torun[@]} -gt 0 ]; then
            what=$(printf '%s, ' "${torun[@]}" | sed 's/ primary//g; s/, $//')
        fi
        printf '[%2d/%d] %-7s %7s B x%d: %s\n' "$group" "$ngroups" "$test" "$size" \
            "$runs" "$what"
        for r in $(seq "$runs"); do
            for c in "${torun[@]}"; do
                read -r tl layout role <<<"$c"
                status=ok
                csv=$(perftest_pair "$logdir/$test.$tl.$layout.$size.$r" "$tl" \
                    -t "$ptest" -D "$layout" -s "$size" -n "$n" -w "$w" </dev/null) ||
                    status=fail
                [ -n "$csv" ] || status=fail
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$test" "$tl" "$layout" \
                    "$size" "$role" "$r" "$status" "$csv" >>"$raw"
            done
        done
    done
done
elapsed=$(( $(date +%s) - start ))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- meta
vqp_config=$(LD_PRELOAD=$module ucx_info -c 2>/dev/null | grep '^UCX_RC_VQP_' || true)
num_qps=$(sed -n 's/^UCX_RC_VQP_NUM_QPS=//p' <<<"$vqp_config")
ucx_version=$(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -1)
commit=${BENCH_COMMIT:-$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ -z "${BENCH_COMMIT:-}" ] &&
    [ -n "$(git -C "$top" status --porcelain -- modules src 2>/dev/null)" ]; then
    commit="$commit+dirty"
fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
meta=$outdir/meta.tsv
{
    printf 'date\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf 'host\t%s\n' "$(uname -srm)"
    printf 'cpu\t%s x %s\n' "$(nproc)" "$cpu"
    printf 'ucx\t%s\n' "$ucx_version"
    printf 'commit\t%s\n' "$commit"
    printf 'module\t%s\n' "$module"
    printf 'runs\t%s\n' "$runs"
    printf 'iteration_scale\t1/%s\n' "$scale"
    printf 'pinned\t%s\n' "${BENCH_PIN:-0}"
    printf 'load_before\t%s\n' "$load_before"
    printf 'load_after\t%s\n' "$load_after"
    printf 'elapsed_s\t%s\n' "$elapsed"
    printf 'num_qps\t%s\n' "$num_qps"
    printf 'rc_vqp_config\t%s\n' "$(tr '\n' ' ' <<<"$vqp_config" | sed 's/ $//')"
} >"$meta"

# ------------------------------------------------------------ summaries
awk -f "$here/summarize.awk" -v out="$outdir" "$meta" "$napath" "$whypath" "$raw"
cat "$outdir/results.md"

if ! command -v gnuplot >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bench: installing gnuplot-nox for the plot" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >/dev/null 2>&1; } || true
fi
if command -v gnuplot >/dev/null; then
    gnuplot -e "datafile='$outdir/bw.dat'; outfile='$outdir/bw.png'" "$here/plot.gp"
    echo "bench: plot $outdir/bw.png"
else
    echo "bench: gnuplot not available (apt-get install gnuplot-nox); plot skipped," \
        "data in $outdir/bw.dat" >&2
fi
echo "bench: $elapsed s; results $outdir/results.json $outdir/results.md"
