/* ABI guard: compares UCS class sizes recorded in libuct with our headers. */
#include <config.h>

#include "rc_vqp_abi.h"

#include <ucs/debug/log.h>
#include <ucs/sys/compiler_def.h>
#include <ucs/sys/math.h>
#include <ucs/type/class.h>
#include <uct/base/uct_iface.h>
#include <uct/base/uct_worker.h>
#include <stdio.h>

/* Exported by libuct but declared in no installed or internal header. */
extern ucs_class_t uct_iface_t_class;
extern ucs_class_t uct_worker_t_class;
extern ucs_class_t uct_priv_worker_t_class;

/* Tests build a copy of the module with this set to a non-zero value, to see
 * that a deliberately skewed size is refused. Never set in a normal build. */
#ifndef UCT_RC_VQP_ABI_TEST_SKEW
#define UCT_RC_VQP_ABI_TEST_SKEW 0
#endif

#define UCT_RC_VQP_ABI_ENTRY(_type)               \
    {                                             \
#_type, _type##_class.size, sizeof(_type) \
    }

unsigned uct_rc_vqp_abi_collect(uct_rc_vqp_abi_entry_t *entries, unsigned max)
{
    const uct_rc_vqp_abi_entry_t all[] = {
        UCT_RC_VQP_ABI_ENTRY(uct_iface_t),
        UCT_RC_VQP_ABI_ENTRY(uct_ep_t),
        {"uct_base_iface_t", uct_base_iface_t_class.size,
         sizeof(uct_base_iface_t) + UCT_RC_VQP_ABI_TEST_SKEW},
        UCT_RC_VQP_ABI_ENTRY(uct_base_ep_t),
        UCT_RC_VQP_ABI_ENTRY(uct_worker_t),
        UCT_RC_VQP_ABI_ENTRY(uct_priv_worker_t),
    };
    unsigned i, count = ucs_min(max, (unsigned)ucs_static_array_size(all));

    for (i = 0; i < count; ++i) {
        entries[i] = all[i];
    }
    return count;
}

ucs_status_t uct_rc_vqp_abi_check(const uct_rc_vqp_abi_entry_t *entries,
                                  unsigned count, char *msg, size_t max)
{
    unsigned i;

    for (i = 0; i < count; ++i) {
        if (entries[i].library_size != entries[i].header_size) {
            snprintf(msg, max,
                     "rc_vqp was built against UCX headers that do not match "
                     "the loaded UCX library: sizeof(%s) is %zu in libuct "
                     "but %zu in rc_vqp; rc_vqp is not registered. Rebuild "
                     "rc_vqp against the installed UCX (configure "
                     "--with-ucx-src with the matching source)",
                     entries[i].name, entries[i].library_size,
                     entries[i].header_size);
            return UCS_ERR_UNSUPPORTED;
        }
    }
    return UCS_OK;
}

ucs_status_t uct_rc_vqp_abi_verify(void)
{
    uct_rc_vqp_abi_entry_t entries[16];
    ucs_status_t status;
    char msg[512];
    unsigned count;

    count  = uct_rc_vqp_abi_collect(entries, ucs_static_array_size(entries));
    status = uct_rc_vqp_abi_check(entries, count, msg, sizeof(msg));
    if (status != UCS_OK) {
        ucs_warn("%s", msg);
    }
    return status;
}
