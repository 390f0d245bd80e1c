#!/usr/bin/env bash
# The stock Debian ucx_perftest over rc_vqp on the software device: a matrix
# of UCT tests (put/get/AM, short/bcopy/zcopy), sizes from 1 B up (including
# sizes that are not multiples of the fragment size; atomics on 8 and, with
# -s 4, 4 bytes), QP counts and both load-balancing schemes. Every run must
# complete and report a result line.
#   test_perftest.sh          the CI subset (make check)
#   test_perftest.sh --full   the whole matrix, up to 64 MiB (make check-perftest-full)
set -u
: "${top_builddir:?run through make check}"
# The heavy two-process tests (stock perftest, UCP, MPI) take turns under
# 'make -j check': two at once on 2 cores starve each other's busy pollers.
exec 9>"$top_builddir/heavy-tests.lock"
flock 9
module="$top_builddir/modules/rc_vqp/.libs/libuct_rc_vqp.so"
pair="$top_srcdir/contrib/perftest-pair.sh"
if [ "${ENABLE_ASAN:-no}" = yes ]; then
    # Stock binaries need the sanitizer runtimes ahead of the module.
    export PRELOAD_EXTRA="$($CC -print-file-name=libasan.so) $($CC -print-file-name=libubsan.so)"
fi
export PERFTEST_TIMEOUT=${PERFTEST_TIMEOUT:-120}
# Fragments of 256 KiB from 256 KiB on: striping starts at sizes CI can afford.
export UCX_RC_VQP_FRAG_SIZE=${UCX_RC_VQP_FRAG_SIZE:-256k}
export UCX_RC_VQP_STRIPE_THRESH=${UCX_RC_VQP_STRIPE_THRESH:-256k}

pass=0; fail=0
run() { # qps lb test-args...
    local qps=$1 lb=$2; shift 2
    local desc="qps=$qps lb=$lb $*" out
    out=$(UCX_RC_VQP_NUM_QPS=$qps UCX_RC_VQP_LB=$lb "$pair" "$module" "$@" 2>&1)
    if [ $? -eq 0 ] && grep -q '^Final:' <<<"$out"; then
        echo "ok - $desc: $(grep '^Final:' <<<"$out" | tr -s ' ')"
        pass=$((pass + 1))
    else
        echo "not ok - $desc"
        tail -15 <<<"$out" | sed 's/^/#   /'
        fail=$((fail + 1))
    fi
}

if [ "${1:-}" = --full ]; then
    for qps in 1 4 64; do
        for lb in dqplb spray; do
            run $qps $lb -t put_lat -s 8 -n 2000 -w 100
            run $qps $lb -t put_bw -s 1 -D short -n 20000 -w 1000
            run $qps $lb -t put_bw -s 4095 -D bcopy -n 5000 -w 100
            for s in 65536 1048577 8388608 67108864; do
                run $qps $lb -t put_bw -s $s -D zcopy -n $(( 200000000 / s + 20 )) -w 5
            done
            run $qps $lb -t get -s 8 -D bcopy -n 5000 -w 100
            for s in 65537 3145733 67108864; do
                run $qps $lb -t get -s $s -D zcopy -n $(( 200000000 / s + 20 )) -w 5
            done
            run $qps $lb -t am_lat -s 8 -n 2000 -w 100
            run $qps $lb -t am_bw -s 1 -D short -n 20000 -w 1000
            run $qps $lb -t am_bw -s 8000 -D bcopy -n 5000 -w 100
            run $qps $lb -t am_bw -s 8000 -D zcopy -n 5000 -w 100
            run $qps $lb -t fadd -n 2000 -w 100
            run $qps $lb -t cswap -n 2000 -w 100
            run $qps $lb -t swap -n 2000 -w 100
            for t in fadd cswap swap add_mr; do
                run $qps $lb -t $t -s 4 -n 2000 -w 100
            done
            run $qps $lb -t add_mr -n 5000 -w 100
        done
    done
else
    run 1 dqplb -t put_lat -s 8 -n 2000 -w 100
    run 4 spray -t put_bw -s 1 -D short -n 10000 -w 100
    run 4 dqplb -t put_bw -s 4095 -D bcopy -n 2000 -w 100
    run 4 dqplb -t put_bw -s 1048577 -D zcopy -n 100 -w 5
    run 64 spray -t put_bw -s 9437189 -D zcopy -n 20 -w 2
    run 4 spray -t get -s 3145733 -D zcopy -n 50 -w 5
    run 1 spray -t get -s 8 -D bcopy -n 2000 -w 100
    run 4 dqplb -t am_lat -s 8 -n 2000 -w 100
    run 1 dqplb -t am_bw -s 8000 -D bcopy -n 2000 -w 100
    run 4 spray -t am_bw -s 8000 -D zcopy -n 2000 -w 100
    # four iov entries (-s: the sizes of the scatter-gather list)
    run 4 dqplb -t am_bw -s 100,2000,8,3000 -D zcopy -n 2000 -w 100
    # put and get of iov entries, one of them striped
    run 4 spray -t put_bw -s 1000,3000,300000,100 -D zcopy -n 200 -w 5
    run 4 dqplb -t get -s 100,8,270000,5000,1 -D zcopy -n 200 -w 5
    run 4 dqplb -t fadd -n 1000 -w 100
    run 1 spray -t cswap -n 1000 -w 100
    run 4 spray -t swap -n 1000 -w 100
    run 1 dqplb -t fadd -s 4 -n 1000 -w 100
    run 4 dqplb -t cswap -s 4 -n 1000 -w 100
fi
# No "-E sleep" run here: UCX 1.13's UCT-level tests (uct_tests.cc) never read
# the wait mode, so it would poll all the same; test_ucp_perftest.sh runs UCP
# tests with -E sleep (ucp_worker_wait over rc_vqp's event fd).
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
