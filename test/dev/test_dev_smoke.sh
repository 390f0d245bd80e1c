#!/bin/sh
# The hardware smoke program as a user without RDMA hardware runs it: a clear
# "no mlx5 device found" and exit 0; the same steps on the software device
# pass; bad usage and a missing device fail with exit 1.
set -u
: "${top_builddir:?run through make check}"
smoke="$top_builddir/test/dev/vqp_dev_smoke"
fail=0
check() { # description, command...
    desc=$1; shift
    if "$@"; then echo "ok - $desc"; else echo "not ok - $desc"; fail=1; fi
}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT

"$smoke" >"$out/hw" 2>&1; rc=$?
cat "$out/hw"
if [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
    check "no device: exit code 0" test "$rc" = 0
    check "no device: says no mlx5 device found" grep -q 'no mlx5 device found' "$out/hw"
    check "no device: prints nothing else" test "$(wc -l <"$out/hw")" = 1
else
    check "hardware smoke passes" test "$rc" = 0
fi

"$smoke" --sw >"$out/sw" 2>&1; rc=$?
cat "$out/sw"
check "--sw: exit code 0" test "$rc" = 0
check "--sw: both QPs reached RTS" test "$(grep -c 'in RTS' "$out/sw")" = 2
check "--sw: the RDMA write was verified" grep -q 'RDMA write of 4096 bytes verified on vqp_sw0' "$out/sw"
check "--sw: the event steps passed" grep -q 'completion event verified on vqp_sw0' "$out/sw"
check "--sw: PASSED" grep -q 'PASSED' "$out/sw"

"$smoke" --bogus >"$out/usage" 2>&1; rc=$?
check "bad option: exit code 1" test "$rc" = 1
check "bad option: prints usage" grep -q 'usage:' "$out/usage"

UCX_LOG_LEVEL=error "$smoke" no_such_dev:1 >"$out/missing" 2>&1; rc=$?
check "missing device: exit code 1" test "$rc" = 1
check "missing device: names it" grep -q "FAILED: open no_such_dev:1" "$out/missing"
check "missing device: UCS error says not found" grep -q "device 'no_such_dev:1' not found" "$out/missing"

exit $fail
