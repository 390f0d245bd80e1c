#!/usr/bin/env bash
# Run UCX's own UCT and UCP test suites (gtest) against rc_vqp on the
# software device.
#
# usage: contrib/ucx-gtest.sh --module LIB --dest DIR [--ucx-src DIR] [-- GTEST_ARGS]
#
# - copies the prepared UCX source tree (contrib/ucx-src.sh; the installed
#   version, configured like the installed build) to DIR, configures it again
#   with --enable-gtest (config.h does not change) and builds the libraries
#   and the gtest binary there (about 20 minutes on 2 cores, once);
# - adds rc_vqp to the transports the UCT tests are instantiated for
#   (UCT_TEST_NO_SELF_TLS) and to the memory-domain tests; not to the
#   rc-specific ones, which cast interfaces to UCX's own rc structures;
#   and to uct_cancel_test's own list (rc_mlx5, rc_verbs, dc_mlx5);
# - adds an "rcvqp" instantiation (UCX_TLS=rc_vqp) to UCP's test cases
#   (UCP_INSTANTIATE_TEST_CASE and its GPU-aware form), and an "rcvqp_tcp"
#   one ("rc_vqp,tcp") to the sockaddr test cases;
# - runs every rc_vqp UCT test with LIB preloaded, and one that needs 2048
#   endpoint pairs with one QP per endpoint (17 per endpoint by default
#   would exceed the software device's 16384 QPs); then every rcvqp UCP test
#   but the sockaddr ones (their fixture wants an IPoIB or RoCE netdev, or
#   tcp among the transports: all of them skip), then every rcvqp_tcp one;
# - prints gtest's own summaries and a last line "N passed, N failed".
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
module="" dest="" ucx_src=""
while [ $# -gt 0 ]; do
    case "$1" in
    --module) module="$2"; shift 2 ;;
    --dest) dest="$2"; shift 2 ;;
    --ucx-src) ucx_src="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "ucx-gtest.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
die() { echo "ucx-gtest.sh: error: $*" >&2; echo "0 passed, 1 failed"; exit 1; }
log() { echo "ucx-gtest.sh: $*" >&2; }
[ -n "$module" ] && [ -r "$module" ] || die "--module LIB (the built libuct_rc_vqp.so) is required"
[ -n "$dest" ] || die "--dest DIR is required"
module=$(cd "$(dirname "$module")" && pwd)/$(basename "$module")
jobs=$(nproc)

if [ -z "$ucx_src" ]; then
    ucx_src=$("$top/contrib/ucx-src.sh" --dest "$top/build-ucx-src" | tail -n 1) ||
        die "cannot prepare the UCX source tree"
fi
[ -r "$ucx_src/config.h" ] || die "$ucx_src is not a configured UCX source tree"

configured="$dest/.rc_vqp-gtest-configured"
stamp="$dest/.rc_vqp-gtest-built"
if [ ! -r "$configured" ]; then
    rm -rf "$dest"
    mkdir -p "$dest" && cp -a "$ucx_src/." "$dest/" || die "copying $ucx_src failed"
    cd "$dest" || die "cannot enter $dest"
    # The installed build's options (as contrib/ucx-src.sh used them) plus
    # the test suite.
    opts=$(ucx_info -v | sed -n 's/^# Configured with: //p')
    read -ra cfg_opts <<<"$opts"
    log "configuring UCX with --enable-gtest in $dest"
    ./configure "${cfg_opts[@]}" --enable-gtest >"$dest/configure-gtest.log" 2>&1 ||
        { tail -20 "$dest/configure-gtest.log" >&2; die "configure failed"; }

    h=test/gtest/uct/uct_test.h
    perl -0pi -e 's/(#define UCT_TEST_NO_SELF_TLS.*?\bknem)\n/$1, \\\n    rc_vqp\n/s' "$h"
    grep -q '^ *rc_vqp$' "$h" || die "could not add rc_vqp to UCT_TEST_NO_SELF_TLS in $h"
    m=test/gtest/uct/test_md.cc
    perl -0pi -e 's/(UCT_MD_INSTANTIATE_TEST_CASE\(_test_case\).*?knem, \\\n)/$1                   rc_vqp, \\\n/s' "$m"
    grep -q '^ *rc_vqp, \\$' "$m" || die "could not add rc_vqp to the MD tests in $m"
    touch "$configured"
fi
# The UCP test cases get an rcvqp instantiation (UCX_TLS=rc_vqp), and the
# sockaddr ones an rcvqp_tcp one ("rc_vqp,tcp": their fixture needs tcp, or
# an IPoIB or RoCE netdev, for the connection manager). Also in a tree built
# before: the edited files' objects are rebuilt (the tree does not track
# header dependencies).
cd "$dest" || die "cannot enter $dest"
h=test/gtest/ucp/ucp_test.h
if ! grep -q 'rcvqp' "$h"; then
    perl -0pi -e 's/(UCP_INSTANTIATE_TEST_CASE_TLS\(_test_case, tcp, +"tcp"\))\n/$1 \\\n    UCP_INSTANTIATE_TEST_CASE_TLS(_test_case, rcvqp, "rc_vqp")\n/' "$h"
    perl -0pi -e 's/(UCP_INSTANTIATE_TEST_CASE_TLS_GPU_AWARE\(_test_case, tcp, \\\n +"tcp"\))\n/$1 \\\n    UCP_INSTANTIATE_TEST_CASE_TLS_GPU_AWARE(_test_case, rcvqp, "rc_vqp")\n/' "$h"
    [ "$(grep -c '_test_case, rcvqp, "rc_vqp")$' "$h")" -eq 2 ] ||
        die "could not add the rcvqp instantiations to $h"
    rm -f test/gtest/ucp/*.o test/gtest/gtest "$stamp"
fi
sa=test/gtest/ucp/test_ucp_sockaddr.cc
if ! grep -q 'rcvqp_tcp' "$sa"; then
    perl -0pi -e 's/(UCP_INSTANTIATE_TEST_CASE_TLS\(_test_case, dc_no_ud_ud_x, "dc_mlx5,mm"\) \\\n)/$1        UCP_INSTANTIATE_TEST_CASE_TLS(_test_case, rcvqp_tcp, "rc_vqp,tcp") \\\n/' "$sa"
    perl -0pi -e 's/(UCP_INSTANTIATE_TEST_CASE_TLS_GPU_AWARE\(_test_case, tcp, "tcp"\) \\\n)/$1    UCP_INSTANTIATE_TEST_CASE_TLS_GPU_AWARE(_test_case, rcvqp_tcp, "rc_vqp,tcp") \\\n/' "$sa"
    [ "$(grep -c 'rcvqp_tcp, "rc_vqp,tcp") \\$' "$sa")" -eq 2 ] ||
        die "could not add the rcvqp_tcp instantiations to $sa"
    rm -f test/gtest/ucp/*sockaddr*.o test/gtest/gtest "$stamp"
fi
# uct_cancel_test (flush with UCT_FLUSH_FLAG_CANCEL, then reconnect) runs
# only for the transports it names: rc_vqp joins them.
fl=test/gtest/uct/test_flush.cc
if ! grep -q '"rc_vqp"' "$fl"; then
    perl -0pi -e 's/(\(GetParam\(\)->tl_name != "rc_mlx5"\))\) \{\n( *)UCS_TEST_SKIP_R\("not supported yet"\)/$1 \&\&\n            (GetParam()->tl_name != "rc_vqp")) {\n$2UCS_TEST_SKIP_R("not supported yet")/' "$fl"
    grep -q 'tl_name != "rc_vqp"' "$fl" ||
        die "could not add rc_vqp to the cancel tests in $fl"
    rm -f test/gtest/uct/*test_flush*.o test/gtest/gtest "$stamp"
fi
if [ ! -r "$stamp" ]; then
    cd "$dest" || die "cannot enter $dest"

    log "building UCX's libraries and gtest (-j$jobs; logs in $dest/build-gtest.log)"
    for d in src/ucm src/ucs src/uct src/ucp src/tools/perf; do
        make -C "$d" -j"$jobs" >>"$dest/build-gtest.log" 2>&1 ||
            { tail -30 "$dest/build-gtest.log" >&2; die "building $d failed"; }
    done
    # GCC 12 flags use-after-free in UCX 1.13's ucm malloc_hook test.
    make -C test/gtest -j"$jobs" CXXFLAGS="-Wno-error=use-after-free" \
        >>"$dest/build-gtest.log" 2>&1 ||
        { tail -30 "$dest/build-gtest.log" >&2; die "building gtest failed"; }
    touch "$stamp"
fi

cd "$dest/test/gtest" || die "no $dest/test/gtest"
libs=""
for d in ucs uct ucm ucp uct/ib tools/perf/lib; do
    libs="$libs${libs:+:}$dest/src/$d/.libs"
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_PRELOAD="$module" UCX_RC_VQP_SW=y

pass=0 fail=0
run() { # log-name env... -- gtest args
    local name=$1 out rc p f
    shift
    out="$dest/gtest-$name.log"
    env "$@" >"$out" 2>&1
    rc=$?
    grep -E '^\[  (PASSED|FAILED)  \]|^\[==========\]|^ *[0-9]+ FAILED TEST' "$out" | sort -u
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n 1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*listed below.*/\1/p' "$out" | tail -n 1)
    if [ -z "$p" ] || { [ "$rc" -ne 0 ] && [ -z "$f" ]; }; then
        tail -30 "$out"
        f=$((${f:-0} + 1)) # crashed or hung: count the run as a failure
    fi
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
}
log "running the rc_vqp tests (logs: $dest/gtest-*.log)"
run all timeout 1200 ./gtest "--gtest_filter=*rc_vqp*:-rcvqp/*" "$@"
run ucp timeout 2400 ./gtest "--gtest_filter=rcvqp/*:-*sockaddr*" "$@"
run ucp-sockaddr timeout 1200 ./gtest "--gtest_filter=rcvqp_tcp/*" "$@"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
