#!/usr/bin/env bash
# The whole test suite: install dependencies, then build and run 'make check'
# twice, normally and with ASan+UBSan. Ends with "N passed, N failed".
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/contrib/install-deps.sh" || exit 1

total_pass=0; total_fail=0; rc=0
run_suite() { # name builddir configure-args...
    local name=$1 dir=$2; shift 2
    echo "== $name: build in $dir"
    if ! "$top/contrib/build.sh" "$dir" "$@"; then
        echo "== $name: BUILD FAILED"; total_fail=$((total_fail + 1)); rc=1; return
    fi
    echo "== $name: make check"
    make -C "$dir" -j"$(nproc)" check >"$dir/check.out" 2>&1 || rc=1
    grep -E '^(PASS|FAIL|XPASS|ERROR|SKIP):' "$dir/check.out" || true
    [ -f "$dir/test-suite.log" ] || { tail -30 "$dir/check.out"; total_fail=$((total_fail + 1)); rc=1; return; }
    for f in $(grep -lE '^(FAIL|ERROR|XPASS)' "$dir"/test/*/*.log 2>/dev/null); do
        echo "---- $f"; tail -40 "$f"
    done
    local p f
    p=$(sed -n 's/^# PASS: *//p' "$dir/test-suite.log")
    f=$(( $(sed -n 's/^# FAIL: *//p' "$dir/test-suite.log") + $(sed -n 's/^# ERROR: *//p' "$dir/test-suite.log") + $(sed -n 's/^# XPASS: *//p' "$dir/test-suite.log") ))
    echo "== $name: $p passed, $f failed"
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
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
