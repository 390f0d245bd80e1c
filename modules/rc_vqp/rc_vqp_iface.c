/*
 * rc_vqp transport: configuration table and device query. The interface
 * itself is built on the multi-QP core; until devices exist there is nothing
 * an interface could be opened on.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <config.h>

#include "rc_vqp_iface.h"
#include "rc_vqp_md.h"

#include <ucs/debug/log.h>

const char *uct_rc_vqp_lb_names[] = {
    [UCT_RC_VQP_LB_DQPLB] = "dqplb",
    [UCT_RC_VQP_LB_SPRAY] = "spray",
    [UCT_RC_VQP_LB_LAST]  = NULL,
};

ucs_config_field_t uct_rc_vqp_iface_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_rc_vqp_iface_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_iface_config_table)},

    {"NUM_QPS", "16",
     "Number of physical RC queue pairs that one endpoint drives as a single\n"
     "virtual QP. Large RDMA operations are striped over all of them.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, num_qps), UCS_CONFIG_TYPE_UINT},

    {"LB", "dqplb",
     "How fragments of one operation are spread over the QPs:\n"
     " dqplb - every fragment is an RDMA write with immediate data carrying a\n"
     "         sequence number; the receiver reorders in a bounded window.\n"
     " spray - fragments are plain RDMA writes; after all of them complete "
     "one\n"
     "         zero-length write with immediate goes on a separate notify QP.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, lb),
     UCS_CONFIG_TYPE_ENUM(uct_rc_vqp_lb_names)},

    {"FRAG_SIZE", "1m",
     "Size of the fragments a large RDMA operation is cut into.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, frag_size),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"STRIPE_THRESH", "512k",
     "Operations smaller than this go to a single QP unfragmented.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, stripe_threshold),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"MAX_OUTSTANDING", "128",
     "Fragments in flight per physical QP before new fragments wait.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, max_outstanding),
     UCS_CONFIG_TYPE_UINT},

    {"TX_QUEUE_LEN", "256", "Send queue length of each physical QP.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, tx_queue_len),
     UCS_CONFIG_TYPE_UINT},

    {"RX_QUEUE_LEN", "4096", "Length of the interface's shared receive queue.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, rx_queue_len),
     UCS_CONFIG_TYPE_UINT},

    {NULL}};

static ucs_status_t
uct_rc_vqp_query_devices(uct_md_h md, uct_tl_device_resource_t **devices_p,
                         unsigned *num_devices_p)
{
    *devices_p     = NULL;
    *num_devices_p = 0;
    return UCS_OK;
}

static ucs_status_t uct_rc_vqp_iface_open(uct_md_h md, uct_worker_h worker,
                                          const uct_iface_params_t *params,
                                          const uct_iface_config_t *config,
                                          uct_iface_h *iface_p)
{
    const char *dev = (params->open_mode & UCT_IFACE_OPEN_MODE_DEVICE)
                          ? params->mode.device.dev_name
                          : "(none)";

    ucs_error("rc_vqp: no such device '%s' (this build has no devices)", dev);
    return UCS_ERR_NO_DEVICE;
}

uct_tl_t UCT_TL_NAME(rc_vqp) = {
    .name          = UCT_RC_VQP_NAME,
    .query_devices = uct_rc_vqp_query_devices,
    .iface_open    = uct_rc_vqp_iface_open,
    .config =
        {
            .name   = "rc_vqp transport",
            .prefix = "RC_VQP_",
            .table  = uct_rc_vqp_iface_config_table,
            .size   = sizeof(uct_rc_vqp_iface_config_t),
        },
};
