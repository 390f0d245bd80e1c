#!/usr/bin/env bash
# Main job: install dependencies, build rc_vqp, and show it registered in the
# stock ucx_info (loaded with LD_PRELOAD, as UCX 1.13 cannot load new modules
# from its module directory).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/contrib/install-deps.sh"
"$top/contrib/build.sh" "$top/build"
module="$top/build/modules/rc_vqp/.libs/libuct_rc_vqp.so"
echo
echo "== LD_PRELOAD=$module ucx_info -d (rc_vqp part)"
LD_PRELOAD="$module" ucx_info -d | awk '/^# Memory domain:/ {p = ($4 == "rc_vqp")} p'
echo
echo "== ucx_info -c (UCX_RC_VQP_* variables)"
LD_PRELOAD="$module" ucx_info -c | grep '^UCX_RC_VQP_' || true
