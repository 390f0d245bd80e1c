#!/bin/sh
# The module preloaded into the stock ucx_info: the component, memory domain
# and transport are listed, the UCX_RC_VQP_* variables are documented, and a
# module built with a skewed ABI size is refused with one clear warning.
set -u
: "${top_builddir:?run through make check}"
ucx_info="${UCX_BINDIR:-/usr/bin}/ucx_info"
module="$top_builddir/modules/rc_vqp/.libs/libuct_rc_vqp.so"
skew="$top_builddir/modules/rc_vqp/.libs/libuct_rc_vqp_skew.so"
pre=""
if [ "${ENABLE_ASAN:-no}" = yes ]; then
    # The sanitizer runtime must come first when injected into a stock binary.
    pre="$($CC -print-file-name=libasan.so) $($CC -print-file-name=libubsan.so) "
fi
fail=0
check() { # description, command...
    desc=$1; shift
    if "$@"; then echo "ok - $desc"; else echo "not ok - $desc"; fail=1; fi
}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT

LD_PRELOAD="$pre$module" "$ucx_info" -d >"$out/d" 2>"$out/d.err"
check "ucx_info -d lists the software device's memory domain" grep -q '^# Memory domain: vqp_sw0$' "$out/d"
check "ucx_info -d lists the rc_vqp transport on it" grep -q '^#      Transport: rc_vqp$' "$out/d"
check "ucx_info -d lists the rc_vqp component" grep -q '^#     Component: rc_vqp$' "$out/d"
check "ucx_info -d reports memory invalidation on vqp_sw0" sh -c "sed -n '/Memory domain: vqp_sw0/,/Transport/p' \"$out/d\" | grep -q 'memory invalidation is supported'"
check "ucx_info -d prints no rc_vqp warning for the matching build" sh -c "! grep -q rc_vqp_abi \"$out/d\" \"$out/d.err\""

LD_PRELOAD="$pre$module" "$ucx_info" -c -f >"$out/c" 2>&1
check "ucx_info -c documents UCX_RC_VQP_NUM_QPS" grep -q '^UCX_RC_VQP_NUM_QPS=16$' "$out/c"
check "ucx_info -c documents UCX_RC_VQP_LB" grep -q '^UCX_RC_VQP_LB=dqplb$' "$out/c"
check "ucx_info -c documents UCX_RC_VQP_FRAG_SIZE" grep -q '^UCX_RC_VQP_FRAG_SIZE=' "$out/c"

# UCP with error handling takes rendezvous lanes reached through an
# interface address only from a memory domain that can invalidate.
LD_PRELOAD="$pre$module" UCX_TLS=rc_vqp,self UCX_NET_DEVICES=vqp_sw0 \
    "$ucx_info" -e -u te -P inter >"$out/e" 2>&1
check "ucx_info -e -u te: rc_vqp lane carries rma_bw with error handling" grep -q 'rc_vqp/vqp_sw0.* rma_bw#0' "$out/e"
check "ucx_info -e -u te: rendezvous through the rc_vqp memory domain" grep -Eq 'rma_bw: mds \[[0-9]+\]' "$out/e"

"$ucx_info" -d >"$out/plain" 2>&1
check "without the module rc_vqp is absent" sh -c "! grep -q 'Component: rc_vqp' '$out/plain'"

# UCX logs to stdout unless UCX_LOG_FILE says otherwise: read both streams.
LD_PRELOAD="$pre$skew" "$ucx_info" -d >"$out/s" 2>&1
check "skewed module is not registered" sh -c "! grep -q 'Component: rc_vqp' '$out/s'"
check "skewed module warns once" test "$(grep -c 'do not match the loaded UCX library' "$out/s")" = 1
check "the warning names the type and both sizes" grep -q 'sizeof(uct_base_iface_t) is [0-9]* in libuct but [0-9]* in rc_vqp' "$out/s"
check "ucx_info still works with the refused module" grep -q 'Component: self' "$out/s"

exit $fail
