#!/usr/bin/env bash
# The whole test suite: install dependencies, then build and run 'make check'
# twice, normally and with ASan+UBSan, UCX's gtest over the module and the C
# test programs under valgrind. Ends with "N passed, N failed".
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/contrib/install-deps.sh" || exit 1

total_pass=0; total_fail=0; rc=0
# Adds the automake summary in $dir/$log (a make target's output in $out)
# to the totals, with the tails of the failed tests' logs.
count_suite() { # name dir out log
    local name=$1 dir=$2 out=$3 log=$4 p f t
    grep -E '^(PASS|FAIL|XPASS|ERROR|SKIP):' "$out" || true
    [ -f "$dir/$log" ] || { tail -30 "$out"; total_fail=$((total_fail + 1)); rc=1; return; }
    for t in $(grep -lE '^(FAIL|ERROR|XPASS)' "$dir"/test/*/*.log 2>/dev/null); do
        echo "---- $t"; tail -40 "$t"
    done
    p=$(sed -n 's/^# PASS: *//p' "$dir/$log")
    f=$(( $(sed -n 's/^# FAIL: *//p' "$dir/$log") + $(sed -n 's/^# ERROR: *//p' "$dir/$log") + $(sed -n 's/^# XPASS: *//p' "$dir/$log") ))
    echo "== $name: $p passed, $f failed"
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
}
run_suite() { # name builddir configure-args...
    local name=$1 dir=$2; shift 2
    echo "== $name: build in $dir"
    if ! "$top/contrib/build.sh" "$dir" "$@"; then
        echo "== $name: BUILD FAILED"; total_fail=$((total_fail + 1)); rc=1; return
    fi
    echo "== $name: make check"
    make -C "$dir" -j"$(nproc)" check >"$dir/check.out" 2>&1 || rc=1
    count_suite "$name" "$dir" "$dir/check.out" test-suite.log
}

run_suite "default build" "$top/build-test"

# UCX's own UCT tests (gtest of the installed version) over rc_vqp, against
# the default build's module.
if [ "${RC_VQP_SKIP_UCX_GTEST:-0}" != 1 ] && [ -f "$top/build-test/Makefile" ]; then
    echo "== UCX gtest (uct) over rc_vqp"
    make -C "$top/build-test" check-ucx-gtest >"$top/build-test/ucx-gtest.out" 2>&1 || rc=1
    grep -E '^\[  (PASSED|FAILED)  \]|ucx-gtest.sh: error' "$top/build-test/ucx-gtest.out" | sort -u
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$top/build-test/ucx-gtest.out" | tail -n 1)
    if [ -n "$line" ]; then
        echo "== UCX gtest: $line"
        total_pass=$((total_pass + ${line%% passed*}))
        f=${line#*, }; total_fail=$((total_fail + ${f%% failed}))
    else
        tail -30 "$top/build-test/ucx-gtest.out"
        total_fail=$((total_fail + 1)); rc=1
    fi
fi

# The C test programs again under valgrind's memcheck (about 4 minutes).
if [ "${RC_VQP_SKIP_VALGRIND:-0}" != 1 ] && [ -f "$top/build-test/Makefile" ]; then
    echo "== valgrind: make check-valgrind"
    make -C "$top/build-test" -j"$(nproc)" check-valgrind >"$top/build-test/valgrind.out" 2>&1 || rc=1
    count_suite "valgrind" "$top/build-test" "$top/build-test/valgrind.out" test-suite-valgrind.log
fi
run_suite "ASan+UBSan build" "$top/build-asan" --enable-asan

if [ "${RC_VQP_SKIP_FORMAT:-0}" != 1 ]; then
    echo "== clang-format check"
    if (cd "$top" && git ls-files '*.c' '*.h' '*.inl' | xargs -r clang-format --dry-run --Werror) ; then
        total_pass=$((total_pass + 1))
    else
        echo "== clang-format: files need formatting"; total_fail=$((total_fail + 1)); rc=1
    fi
fi

echo "$total_pass passed, $total_fail failed"
[ $total_fail -eq 0 ] || rc=1
exit $rc
