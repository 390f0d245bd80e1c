/*
 * rc_vqp interface: configuration (UCX_RC_VQP_*), the device list of a memory
 * domain, the interface object (one virtual CQ on its device, registered
 * buffer pools, the pending arbiter), its capabilities, progress (device,
 * CQ, pending dispatch), active-message receive and the iface-wide flush and
 * fence.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <config.h>

#include "rc_vqp.h"

#include <ucs/arch/cpu.h>
#include <ucs/datastruct/mpool.inl>
#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/string.h>
#include <string.h>

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
     "How notifications of striped writes with immediate data are ordered:\n"
     " dqplb - every fragment carries a sequence number; the receiver\n"
     "         reorders in a bounded window.\n"
     " spray - after all fragments completed, one zero-length write with\n"
     "         immediate goes on a separate notify QP.\n"
     "Plain puts and gets are striped the same way under both.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, lb),
     UCS_CONFIG_TYPE_ENUM(uct_rc_vqp_lb_names)},

    {"FRAG_SIZE", "1m",
     "Size of the fragments a large RDMA operation is cut into (a power of\n"
     "two).",
     ucs_offsetof(uct_rc_vqp_iface_config_t, frag_size),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"STRIPE_THRESH", "512k",
     "Puts and gets smaller than this go to a single QP unfragmented.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, stripe_threshold),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"MAX_OUTSTANDING", "16",
     "Fragments in flight per physical QP before new fragments wait.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, max_outstanding),
     UCS_CONFIG_TYPE_UINT},

    {"TX_QUEUE_LEN", "256",
     "Operations in flight per endpoint; more get UCS_ERR_NO_RESOURCE.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, tx_queue_len),
     UCS_CONFIG_TYPE_UINT},

    {"RX_QUEUE_LEN", "4095",
     "Receive buffers for active messages, shared by all endpoints of an\n"
     "interface (a shared receive queue of SEG_SIZE buffers).",
     ucs_offsetof(uct_rc_vqp_iface_config_t, rx_queue_len),
     UCS_CONFIG_TYPE_UINT},

    {"RX_MAX_BUFS", "-1",
     "Receive buffers the interface allocates at most: those posted and those\n"
     "AM handlers keep (UCS_INPROGRESS); -1 is unlimited. Once handlers keep\n"
     "them all, senders wait (RNR retries) until buffers are released.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, rx_max_bufs), UCS_CONFIG_TYPE_INT},

    {"TX_MAX_BUFS", "-1",
     "Bounce buffers of bcopy operations (put_bcopy, get_bcopy, am_bcopy,\n"
     "am_zcopy's copy) the interface allocates at most, shared by its\n"
     "endpoints; -1 is unlimited. Beyond it operations return\n"
     "UCS_ERR_NO_RESOURCE until completions release buffers.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, tx_max_bufs), UCS_CONFIG_TYPE_INT},

    {"TX_BUFS_GROW", "128",
     "Bounce buffers allocated at a time when more are needed.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, tx_bufs_grow),
     UCS_CONFIG_TYPE_UINT},

    {"FC_WND_SIZE", "128",
     "Active messages an endpoint sends before the peer returns credits\n"
     "(flow control: receivers are not flooded into RNR waits).",
     ucs_offsetof(uct_rc_vqp_iface_config_t, fc_wnd_size),
     UCS_CONFIG_TYPE_UINT},

    {"SEG_SIZE", "8k",
     "Size of the bounce buffers of bcopy operations and active messages.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, seg_size),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"CQ_LEN", "65536",
     "Completion queue entries of an interface, shared by its endpoints.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, cq_len), UCS_CONFIG_TYPE_UINT},

    {"MAX_INLINE", "128",
     "Largest payload copied into a work request instead of read by DMA.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, max_inline),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"TIMEOUT", "100ms",
     "How long a QP waits for an acknowledgement before it retransmits\n"
     "(rounded up to what the device encodes: 4.096 us x 2^n). A dead peer\n"
     "is reported after about TIMEOUT x (RETRY_COUNT + 1).",
     ucs_offsetof(uct_rc_vqp_iface_config_t, timeout), UCS_CONFIG_TYPE_TIME},

    {"RETRY_COUNT", "7",
     "Retransmissions (0..7) before an operation fails with a transport error.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, retry_count),
     UCS_CONFIG_TYPE_UINT},

    {"RNR_TIMEOUT", "10us",
     "How long a QP waits before resending to a peer whose receive queue was\n"
     "empty (rounded up to the IB encoding, at most 491 ms). Receivers are\n"
     "credited, so this only matters for two-sided traffic of other users.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, rnr_timeout),
     UCS_CONFIG_TYPE_TIME},

    {"CONNECT_TIMEOUT", "30s",
     "How long an endpoint created from an interface address keeps asking\n"
     "the peer interface to connect (the request is resent with growing\n"
     "intervals) before it fails with UCS_ERR_ENDPOINT_TIMEOUT. Time in which\n"
     "the interface is not progressed (longer gaps than a quarter of this, at\n"
     "most 1 s) does not count: no request is resent and no answer read then.\n"
     "A peer whose interface is not progressed says from its async thread\n"
     "that it is busy (UCX's thread async mode); that restarts this timeout.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, connect_timeout),
     UCS_CONFIG_TYPE_TIME},

    {"KEEPALIVE_INTERVAL", "20s",
     "How often an interface checks, while idle, that the peers of the\n"
     "endpoints it created for their connections (to its interface address)\n"
     "are still there (once the peer said it connected); one whose peer is\n"
     "gone is released. The user's own\n"
     "endpoints are checked by uct_ep_check (UCP's keepalive). 0 or inf:\n"
     "never.",
     ucs_offsetof(uct_rc_vqp_iface_config_t, keepalive_interval),
     UCS_CONFIG_TYPE_TIME},

    {NULL}};

/* IB ack timeout encoding: 4.096 us * 2^t, t in 1..31 (0 means infinite). */
static uint8_t uct_rc_vqp_ib_timeout(double seconds)
{
    uint8_t t = 1;

    while ((t < 31) && (4.096e-6 * (double)(1ul << t) < seconds)) {
        ++t;
    }
    return t;
}

/* IB RNR timer encoding (table 45 of the IB spec, in microseconds). */
static uint8_t uct_rc_vqp_ib_rnr_timer(double seconds)
{
    static const double us[32] = {
        655360, 10,    20,    30,     40,     60,     80,     120,
        160,    240,   320,   480,    640,    960,    1280,   1920,
        2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
        40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
    uint8_t t;

    for (t = 1; t < 32; ++t) {
        if (us[t] * 1e-6 >= seconds) {
            return t;
        }
    }
    return 31;
}

static ucs_status_t
uct_rc_vqp_query_devices(uct_md_h tl_md, uct_tl_device_resource_t **devices_p,
                         unsigned *num_devices_p)
{
    uct_rc_vqp_md_t *md = ucs_derived_of(tl_md, uct_rc_vqp_md_t);
    uct_tl_device_resource_t *device;
    vqp_dev_attr_t attr;

    vqp_dev_query(md->dev, &attr);
    device = ucs_calloc(1, sizeof(*device), "rc_vqp_device");
    if (device == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    ucs_snprintf_zero(device->name, sizeof(device->name), "%s", attr.name);
    device->type       = UCT_DEVICE_TYPE_NET;
    device->sys_device = UCS_SYS_DEVICE_ID_UNKNOWN;
    *devices_p         = device;
    *num_devices_p     = 1;
    return UCS_OK;
}

/* ------------------------------------------------------ registered pools */

static ucs_status_t uct_rc_vqp_chunk_alloc(ucs_mpool_t *mp, size_t *size_p,
                                           void **chunk_p)
{
    uct_rc_vqp_iface_t *iface = *(uct_rc_vqp_iface_t **)ucs_mpool_priv(mp);
    size_t size               = sizeof(uct_rc_vqp_chunk_t) + *size_p;
    uct_rc_vqp_chunk_t *chunk;
    ucs_status_t status;
    uint32_t rkey;

    chunk = ucs_malloc(size, "rc_vqp_chunk");
    if (chunk == NULL) {
        ucs_error("rc_vqp: out of memory for a %zu-byte buffer chunk", size);
        return UCS_ERR_NO_MEMORY;
    }
    status = vqp_dev_mr_reg(iface->dev, chunk, size, IBV_ACCESS_LOCAL_WRITE,
                            &chunk->mr, &chunk->lkey, &rkey);
    if (status != UCS_OK) {
        ucs_free(chunk);
        return status;
    }
    *chunk_p = chunk + 1;
    return UCS_OK;
}

static void uct_rc_vqp_chunk_release(ucs_mpool_t *mp, void *ptr)
{
    uct_rc_vqp_chunk_t *chunk = (uct_rc_vqp_chunk_t *)ptr - 1;

    vqp_dev_mr_dereg(chunk->mr);
    ucs_free(chunk);
}

static void uct_rc_vqp_tx_init(ucs_mpool_t *mp, void *obj, void *ptr)
{
    ((uct_rc_vqp_tx_desc_t *)obj)->lkey = ((uct_rc_vqp_chunk_t *)ptr - 1)->lkey;
}

static void uct_rc_vqp_rx_init(ucs_mpool_t *mp, void *obj, void *ptr)
{
    uct_rc_vqp_iface_t *iface  = *(uct_rc_vqp_iface_t **)ucs_mpool_priv(mp);
    uct_rc_vqp_rx_desc_t *desc = obj;

    desc->lkey    = ((uct_rc_vqp_chunk_t *)ptr - 1)->lkey;
    desc->release = &iface->release_desc;
}

static ucs_mpool_ops_t uct_rc_vqp_tx_mp_ops = {
    .chunk_alloc   = uct_rc_vqp_chunk_alloc,
    .chunk_release = uct_rc_vqp_chunk_release,
    .obj_init      = uct_rc_vqp_tx_init,
    .obj_cleanup   = NULL,
    .obj_str       = NULL,
};

static ucs_mpool_ops_t uct_rc_vqp_rx_mp_ops = {
    .chunk_alloc   = uct_rc_vqp_chunk_alloc,
    .chunk_release = uct_rc_vqp_chunk_release,
    .obj_init      = uct_rc_vqp_rx_init,
    .obj_cleanup   = NULL,
    .obj_str       = NULL,
};

/* Completions of multi-entry RMA operations: plain memory. */
static ucs_mpool_ops_t uct_rc_vqp_iov_comp_mp_ops = {
    .chunk_alloc   = ucs_mpool_chunk_malloc,
    .chunk_release = ucs_mpool_chunk_free,
    .obj_init      = NULL,
    .obj_cleanup   = NULL,
    .obj_str       = NULL,
};

ucs_status_t uct_rc_vqp_iface_post_recv(uct_rc_vqp_iface_t *iface,
                                        uct_rc_vqp_rx_desc_t *desc)
{
    vqp_recv_wr_t wr = {0};
    ucs_status_t status;

    if (desc == NULL) {
        desc = ucs_mpool_get(&iface->rx_mp);
        if (desc == NULL) {
            /* At RX_MAX_BUFS that is what the limit is for; otherwise the
             * memory ran out. Either way the SRQ lacks it until later. */
            ucs_log(iface->rx_limited ? UCS_LOG_LEVEL_DEBUG
                                      : UCS_LOG_LEVEL_ERROR,
                    "rc_vqp: out of receive buffers (%u missing in the"
                    " receive queue)",
                    iface->rx_missing + 1);
            ++iface->rx_missing;
            return UCS_ERR_NO_MEMORY;
        }
    }
    wr.wr_id   = (uintptr_t)desc;
    wr.addr    = (uintptr_t)(desc + 1) + iface->rx_headroom;
    wr.length  = iface->seg_size;
    wr.lkey[0] = desc->lkey;
    status     = vqp_srq_post_recv(iface->srq, &wr);
    if (status != UCS_OK) {
        ucs_mpool_put(desc);
    }
    return status;
}

void uct_rc_vqp_iface_rx_refill(uct_rc_vqp_iface_t *iface)
{
    unsigned missing = iface->rx_missing;
    ucs_status_t status;

    iface->rx_missing = 0;
    while (missing-- > 0) {
        status = uct_rc_vqp_iface_post_recv(iface, NULL);
        if (status == UCS_ERR_NO_MEMORY) {
            iface->rx_missing += missing; /* none free yet: this one too */
            return;
        } else if (status != UCS_OK) {
            return; /* the SRQ is full */
        }
    }
}

/* The SRQ's unused buffers at close. */
void uct_rc_vqp_iface_release_recv(void *arg, uint64_t wr_id)
{
    ucs_mpool_put((void *)(uintptr_t)wr_id);
}

/* A descriptor kept by an AM handler (UCS_INPROGRESS) comes back here. */
static void uct_rc_vqp_release_desc(uct_recv_desc_t *self, void *desc)
{
    ucs_mpool_put((uct_rc_vqp_rx_desc_t *)desc - 1);
}

/* ------------------------------------------------------------- interface */

static ucs_status_t uct_rc_vqp_iface_query(uct_iface_h tl_iface,
                                           uct_iface_attr_t *attr)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);
    size_t max_inline         = iface->vqp_params.max_inline;
    vqp_dev_attr_t dev_attr;
    vqp_dev_addr_t dev_addr;
    unsigned num_qps;

    vqp_dev_query(iface->dev, &dev_attr);
    vqp_dev_address(iface->dev, &dev_addr);
    uct_base_iface_query(&iface->super, attr);

    attr->cap.put.max_short       = max_inline;
    attr->cap.put.max_bcopy       = iface->seg_size;
    attr->cap.put.min_zcopy       = 0;
    attr->cap.put.max_zcopy       = iface->rma_max_zcopy;
    attr->cap.put.opt_zcopy_align = UCS_SYS_PCI_MAX_PAYLOAD;
    attr->cap.put.align_mtu       = dev_attr.path_mtu;
    attr->cap.put.max_iov         = iface->rma_max_iov;

    attr->cap.get.max_bcopy       = iface->seg_size;
    attr->cap.get.min_zcopy       = 0;
    attr->cap.get.max_zcopy       = iface->rma_max_zcopy;
    attr->cap.get.opt_zcopy_align = UCS_SYS_PCI_MAX_PAYLOAD;
    attr->cap.get.align_mtu       = dev_attr.path_mtu;
    attr->cap.get.max_iov         = iface->rma_max_iov;

    /* The 8-byte AM header is part of the short payload. */
    attr->cap.am.max_short       = max_inline;
    attr->cap.am.max_bcopy       = iface->seg_size;
    attr->cap.am.min_zcopy       = 0;
    attr->cap.am.max_zcopy       = iface->seg_size;
    attr->cap.am.max_hdr         = UCT_RC_VQP_AM_MAX_HDR(iface->seg_size);
    attr->cap.am.opt_zcopy_align = UCS_SYS_PCI_MAX_PAYLOAD;
    attr->cap.am.align_mtu       = dev_attr.path_mtu;
    attr->cap.am.max_iov         = UCT_RC_VQP_AM_MAX_IOV;

    attr->cap.flags = UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY |
                      UCT_IFACE_FLAG_PUT_ZCOPY | UCT_IFACE_FLAG_GET_BCOPY |
                      UCT_IFACE_FLAG_GET_ZCOPY | UCT_IFACE_FLAG_AM_SHORT |
                      UCT_IFACE_FLAG_AM_BCOPY | UCT_IFACE_FLAG_AM_ZCOPY |
                      UCT_IFACE_FLAG_ATOMIC_DEVICE | UCT_IFACE_FLAG_PENDING |
                      UCT_IFACE_FLAG_CB_SYNC | UCT_IFACE_FLAG_CONNECT_TO_EP |
                      UCT_IFACE_FLAG_CONNECT_TO_IFACE |
                      UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE |
                      UCT_IFACE_FLAG_ERRHANDLE_ZCOPY_BUF |
                      UCT_IFACE_FLAG_ERRHANDLE_REMOTE_MEM |
                      UCT_IFACE_FLAG_ERRHANDLE_BCOPY_LEN |
                      UCT_IFACE_FLAG_EP_CHECK;
    if (dev_attr.comp_events) {
        /* One arm serves every kind: a signaled receive wakes a sleeper
         * armed for RECV_SIG, and so does any other CQE (allowed). */
        attr->cap.event_flags =
            UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV |
            UCT_IFACE_FLAG_EVENT_RECV_SIG | UCT_IFACE_FLAG_EVENT_FD;
    }
    /* 64-bit add and cswap are basic atomics; the rest needs the extended
     * (masked) ones, as rc_mlx5 offers them. */
    attr->cap.atomic64.op_flags = UCS_BIT(UCT_ATOMIC_OP_ADD);
    attr->cap.atomic64.fop_flags =
        UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_CSWAP);
    if (iface->ext_atomic_sizes & sizeof(uint64_t)) {
        attr->cap.atomic64.op_flags |= UCT_RC_VQP_ATOMIC_BITWISE;
        attr->cap.atomic64.fop_flags |=
            UCT_RC_VQP_ATOMIC_BITWISE | UCS_BIT(UCT_ATOMIC_OP_SWAP);
    }
    if (iface->ext_atomic_sizes & sizeof(uint32_t)) {
        attr->cap.atomic32.op_flags =
            UCS_BIT(UCT_ATOMIC_OP_ADD) | UCT_RC_VQP_ATOMIC_BITWISE;
        attr->cap.atomic32.fop_flags =
            UCS_BIT(UCT_ATOMIC_OP_ADD) | UCT_RC_VQP_ATOMIC_BITWISE |
            UCS_BIT(UCT_ATOMIC_OP_SWAP) | UCS_BIT(UCT_ATOMIC_OP_CSWAP);
    }

    attr->device_addr_len = vqp_dev_addr_packed_size(&dev_addr);
    attr->iface_addr_len  = sizeof(uct_rc_vqp_iface_addr_t);
    attr->ep_addr_len     = iface->ep_addr_len;
    attr->max_conn_priv   = 0;

    /* Estimates UCP picks lanes and protocol thresholds by. The software
     * device moves RDMA data with one process_vm_writev/readv (9-19 GB/s
     * from 64 KiB on the 2-core VMs, docs/benchmarks.md); a message takes
     * 0.3-0.6 us one way, an RDMA operation 1.5-2 us (a syscall). Each
     * process copies with its own CPU, as cma does: dedicated bandwidth.
     * Its latency, above the shared-memory transports', and its bandwidth,
     * below theirs (cma: 11.1 GB/s), keep posix and cma ahead of it when
     * they are enabled too. With UCP's copy bandwidth per CPU vendor (Intel
     * 5.8 GB/s, AMD 5.0) these put the rendezvous threshold at 58 and
     * 43 KB, where rendezvous is the faster protocol (docs/performance.md).
     */
    num_qps = iface->vqp_params.num_qps;
    if (dev_attr.link == VQP_DEV_LINK_SW) {
        attr->latency             = ucs_linear_func_make(1e-6, 0);
        attr->bandwidth.dedicated = 11e9;
        attr->bandwidth.shared    = 0;
        attr->overhead            = 200e-9;
        attr->priority            = 0;
    } else {
        attr->latency             = ucs_linear_func_make(1.5e-6, 0);
        attr->bandwidth.dedicated = 0;
        attr->bandwidth.shared =
            dev_attr.bandwidth * ucs_min(num_qps, 8u) / 8.0 * 0.95;
        attr->overhead = 60e-9;
        attr->priority = 10;
    }
    return UCS_OK;
}

static ucs_status_t uct_rc_vqp_iface_get_device_address(uct_iface_h tl_iface,
                                                        uct_device_addr_t *addr)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);
    vqp_dev_addr_t dev_addr;
    size_t len;

    vqp_dev_address(iface->dev, &dev_addr);
    return vqp_dev_addr_pack(&dev_addr, addr,
                             vqp_dev_addr_packed_size(&dev_addr), &len);
}

static int uct_rc_vqp_iface_is_reachable(const uct_iface_h tl_iface,
                                         const uct_device_addr_t *dev_addr,
                                         const uct_iface_addr_t *iface_addr)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);
    vqp_dev_addr_t remote;
    uint32_t qpn;

    if ((dev_addr == NULL) ||
        (vqp_dev_addr_unpack(dev_addr, VQP_DEV_ADDR_PACKED_MAX, &remote,
                             NULL) != UCS_OK)) {
        return 0;
    }
    if ((iface_addr != NULL) &&
        (uct_rc_vqp_cm_unpack_iface_address(iface_addr, &qpn) != UCS_OK)) {
        return 0;
    }
    return vqp_dev_is_reachable(iface->dev, &remote) == UCS_OK;
}

static ucs_status_t uct_rc_vqp_iface_get_address(uct_iface_h tl_iface,
                                                 uct_iface_addr_t *addr)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);

    uct_rc_vqp_cm_get_iface_address(iface, (uct_rc_vqp_iface_addr_t *)addr);
    return UCS_OK;
}

static unsigned uct_rc_vqp_iface_progress(uct_iface_h tl_iface)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);
    unsigned count;

    count = vqp_cq_progress(iface->cq);
    count += uct_rc_vqp_cm_progress(iface);
    if (ucs_unlikely(iface->rx_missing != 0)) {
        uct_rc_vqp_iface_rx_refill(iface);
    }
    if (ucs_unlikely(iface->cancel_waiting != 0)) {
        uct_rc_vqp_iface_cancel_progress(iface);
    }
    if (ucs_unlikely(!ucs_list_is_empty(&iface->grant_eps))) {
        uct_rc_vqp_iface_grant_progress(iface);
    }
    if (!ucs_list_is_empty(&iface->pending_eps)) {
        uct_rc_vqp_iface_schedule_pending(iface);
    }
    if (!ucs_arbiter_is_empty(&iface->arbiter)) {
        ucs_arbiter_dispatch(&iface->arbiter, 1, uct_rc_vqp_ep_process_pending,
                             NULL);
    }
    return count;
}

static ucs_status_t uct_rc_vqp_iface_flush(uct_iface_h tl_iface, unsigned flags,
                                           uct_completion_t *comp)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);
    ucs_status_t status, result = UCS_OK;
    uct_rc_vqp_ep_t *ep;

    if (comp != NULL) {
        return UCS_ERR_UNSUPPORTED;
    }
    ucs_list_for_each(ep, &iface->eps, list)
    {
        /* Unsignaled operations complete only when a later CQE covers
         * them: the endpoint flush posts that marker (once). */
        status = uct_rc_vqp_ep_flush(&ep->super.super, flags, NULL);
        if ((status == UCS_INPROGRESS) || (status == UCS_ERR_NO_RESOURCE)) {
            /* NO_RESOURCE: operations wait for the connection or in the
             * pending queue; the caller progresses and asks again. */
            result = UCS_INPROGRESS;
        } else if (status != UCS_OK) {
            return status;
        }
    }
    return result;
}

static ucs_status_t uct_rc_vqp_iface_fence(uct_iface_h tl_iface, unsigned flags)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);
    uct_rc_vqp_ep_t *ep;

    ucs_list_for_each(ep, &iface->eps, list)
    {
        uct_rc_vqp_ep_fence(&ep->super.super, flags);
    }
    return UCS_OK;
}

static UCS_CLASS_DECLARE_DELETE_FUNC(uct_rc_vqp_iface_t, uct_iface_t);

static uct_iface_ops_t uct_rc_vqp_iface_ops = {
    .ep_put_short             = uct_rc_vqp_ep_put_short,
    .ep_put_bcopy             = uct_rc_vqp_ep_put_bcopy,
    .ep_put_zcopy             = uct_rc_vqp_ep_put_zcopy,
    .ep_get_bcopy             = uct_rc_vqp_ep_get_bcopy,
    .ep_get_zcopy             = uct_rc_vqp_ep_get_zcopy,
    .ep_am_short              = uct_rc_vqp_ep_am_short,
    .ep_am_short_iov          = uct_rc_vqp_ep_am_short_iov,
    .ep_am_bcopy              = uct_rc_vqp_ep_am_bcopy,
    .ep_am_zcopy              = uct_rc_vqp_ep_am_zcopy,
    .ep_atomic_cswap64        = uct_rc_vqp_ep_atomic_cswap64,
    .ep_atomic64_post         = uct_rc_vqp_ep_atomic64_post,
    .ep_atomic64_fetch        = uct_rc_vqp_ep_atomic64_fetch,
    .ep_atomic_cswap32        = uct_rc_vqp_ep_atomic_cswap32,
    .ep_atomic32_post         = uct_rc_vqp_ep_atomic32_post,
    .ep_atomic32_fetch        = uct_rc_vqp_ep_atomic32_fetch,
    .ep_pending_add           = uct_rc_vqp_ep_pending_add,
    .ep_pending_purge         = uct_rc_vqp_ep_pending_purge,
    .ep_flush                 = uct_rc_vqp_ep_flush,
    .ep_fence                 = uct_rc_vqp_ep_fence,
    .ep_check                 = uct_rc_vqp_ep_check,
    .ep_create                = UCS_CLASS_NEW_FUNC_NAME(uct_rc_vqp_ep_t),
    .ep_destroy               = UCS_CLASS_DELETE_FUNC_NAME(uct_rc_vqp_ep_t),
    .ep_get_address           = uct_rc_vqp_ep_get_address,
    .ep_connect_to_ep         = uct_rc_vqp_ep_connect_to_ep,
    .iface_flush              = uct_rc_vqp_iface_flush,
    .iface_fence              = uct_rc_vqp_iface_fence,
    .iface_progress_enable    = uct_base_iface_progress_enable,
    .iface_progress_disable   = uct_base_iface_progress_disable,
    .iface_progress           = uct_rc_vqp_iface_progress,
    .iface_close              = UCS_CLASS_DELETE_FUNC_NAME(uct_rc_vqp_iface_t),
    .iface_query              = uct_rc_vqp_iface_query,
    .iface_get_device_address = uct_rc_vqp_iface_get_device_address,
    .iface_get_address        = uct_rc_vqp_iface_get_address,
    .iface_is_reachable       = uct_rc_vqp_iface_is_reachable,
    .iface_event_fd_get       = uct_rc_vqp_iface_event_fd_get,
    .iface_event_arm          = uct_rc_vqp_iface_event_arm,
};

static ucs_status_t
uct_rc_vqp_iface_check_config(const uct_rc_vqp_iface_config_t *config,
                              const vqp_dev_attr_t *attr)
{
    if ((config->num_qps == 0) || (config->frag_size == 0) ||
        (config->frag_size > attr->max_msg_sz) ||
        (config->frag_size & (config->frag_size - 1)) ||
        (config->max_outstanding == 0) || (config->tx_queue_len == 0) ||
        (config->rx_queue_len == 0) ||
        (config->rx_queue_len >= attr->max_srq_wr) ||
        ((config->rx_max_bufs < 1) && (config->rx_max_bufs != -1)) ||
        ((config->tx_max_bufs < 1) && (config->tx_max_bufs != -1)) ||
        (config->tx_bufs_grow == 0) ||
        (config->fc_wnd_size <= UCT_RC_VQP_FC_RESERVE) ||
        (config->fc_wnd_size > 0x7fff) || (config->seg_size < 64) ||
        (config->seg_size > UINT32_MAX) || (config->max_inline < 8) ||
        (config->max_inline > UINT32_MAX) || (config->retry_count > 7) ||
        (config->timeout <= 0) || (config->rnr_timeout <= 0) ||
        (config->connect_timeout <= 0)) {
        ucs_error("rc_vqp: invalid configuration: NUM_QPS=%u FRAG_SIZE=%zu"
                  " (a power of two, 1..%lu) MAX_OUTSTANDING=%u TX_QUEUE_LEN=%u"
                  " RX_QUEUE_LEN=%u (1..%u) RX_MAX_BUFS=%d (-1 or >= 1)"
                  " TX_MAX_BUFS=%d (-1 or >= 1) TX_BUFS_GROW=%u (>= 1)"
                  " FC_WND_SIZE=%u (%d..32767)"
                  " SEG_SIZE=%zu (>= 64) MAX_INLINE=%zu"
                  " (>= 8) RETRY_COUNT=%u (0..7) TIMEOUT=%g s RNR_TIMEOUT=%g s"
                  " CONNECT_TIMEOUT=%g s (> 0)",
                  config->num_qps, config->frag_size, attr->max_msg_sz,
                  config->max_outstanding, config->tx_queue_len,
                  config->rx_queue_len, attr->max_srq_wr - 1,
                  config->rx_max_bufs, config->tx_max_bufs,
                  config->tx_bufs_grow, config->fc_wnd_size,
                  UCT_RC_VQP_FC_RESERVE + 1, config->seg_size,
                  config->max_inline, config->retry_count, config->timeout,
                  config->rnr_timeout, config->connect_timeout);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

static void
uct_rc_vqp_iface_cq_too_small(const uct_rc_vqp_iface_config_t *config,
                              unsigned room, unsigned need)
{
    ucs_error("rc_vqp: CQ_LEN=%u leaves %u entries beside those of the"
              " receive queue (RX_QUEUE_LEN=%u), and an endpoint of"
              " NUM_QPS=%u needs at least %u: make CQ_LEN larger or"
              " RX_QUEUE_LEN smaller",
              config->cq_len, room, config->rx_queue_len, config->num_qps,
              need);
}

static UCS_CLASS_INIT_FUNC(uct_rc_vqp_iface_t, uct_md_h tl_md,
                           uct_worker_h worker,
                           const uct_iface_params_t *params,
                           const uct_iface_config_t *tl_config)
{
    uct_rc_vqp_iface_config_t *config =
        ucs_derived_of(tl_config, uct_rc_vqp_iface_config_t);
    uct_rc_vqp_md_t *md = ucs_derived_of(tl_md, uct_rc_vqp_md_t);
    size_t payload_offset, am_align, am_align_offset;
    vqp_cq_params_t cq_params;
    vqp_dev_attr_t attr;
    unsigned qps, rx_max, tx_max;
    ucs_status_t status;

    UCS_CLASS_CALL_SUPER_INIT(
        uct_base_iface_t, &uct_rc_vqp_iface_ops, &uct_base_iface_internal_ops,
        tl_md, worker, params,
        tl_config UCS_STATS_ARG(
            (params->field_mask & UCT_IFACE_PARAM_FIELD_STATS_ROOT)
                ? params->stats_root
                : NULL) UCS_STATS_ARG(UCT_RC_VQP_NAME));

    vqp_dev_query(md->dev, &attr);
    if (!(params->field_mask & UCT_IFACE_PARAM_FIELD_OPEN_MODE) ||
        !(params->open_mode & UCT_IFACE_OPEN_MODE_DEVICE)) {
        ucs_error("rc_vqp: only UCT_IFACE_OPEN_MODE_DEVICE is supported");
        return UCS_ERR_UNSUPPORTED;
    }
    if (strcmp(params->mode.device.dev_name, attr.name)) {
        ucs_error("rc_vqp: no device '%s' on memory domain %s",
                  params->mode.device.dev_name, attr.name);
        return UCS_ERR_NO_DEVICE;
    }
    status = uct_rc_vqp_iface_check_config(config, &attr);
    if (status != UCS_OK) {
        return status;
    }
    /* AM payloads start after the descriptor and the user's headroom; by
     * default that point is cache-line aligned (the device writes whole
     * lines), else where the user's alignment and offset put it. */
    self->rx_headroom =
        UCT_IFACE_PARAM_VALUE(params, rx_headroom, RX_HEADROOM, 0);
    payload_offset = sizeof(uct_rc_vqp_rx_desc_t) + self->rx_headroom;
    status         = uct_iface_param_am_alignment(params, config->seg_size,
                                                  payload_offset, payload_offset,
                                                  &am_align, &am_align_offset);
    if (status != UCS_OK) {
        return status;
    }
    if ((am_align == 0) || !ucs_is_pow2(am_align)) {
        ucs_error("rc_vqp: AM alignment %zu is not a power of two", am_align);
        return UCS_ERR_INVALID_PARAM;
    }

    self->dev              = md->dev;
    self->seg_size         = config->seg_size;
    self->ext_atomic_sizes = attr.ext_atomic_sizes;
    self->fc_wnd           = config->fc_wnd_size;
    self->fc_grant_thresh =
        ucs_max((config->fc_wnd_size - UCT_RC_VQP_FC_RESERVE) / 2, 1u);
    self->cancel_waiting  = 0;
    self->release_desc.cb = uct_rc_vqp_release_desc;
    ucs_list_head_init(&self->eps);
    ucs_list_head_init(&self->pending_eps);
    ucs_list_head_init(&self->grant_eps);
    ucs_arbiter_init(&self->arbiter);

    vqp_cq_params_default(&cq_params);
    cq_params.devs[0]  = md->dev;
    cq_params.num_devs = 1;
    cq_params.cqe      = ucs_min(config->cq_len, (unsigned)attr.max_cqe);
    status             = vqp_cq_create(&cq_params, &self->cq);
    if (status != UCS_OK) {
        goto err;
    }

    vqp_params_default(&self->vqp_params);
    self->vqp_params.cq      = self->cq;
    self->vqp_params.num_qps = config->num_qps;
    self->vqp_params.lb =
        (config->lb == UCT_RC_VQP_LB_SPRAY) ? VQP_LB_SPRAY : VQP_LB_DQPLB;
    self->vqp_params.frag_size        = config->frag_size;
    self->vqp_params.stripe_threshold = config->stripe_threshold;
    self->vqp_params.max_outstanding  = config->max_outstanding;
    self->vqp_params.max_ops          = config->tx_queue_len;
    /* Receive buffers come from the SRQ, and rc_vqp sends no WRITE_IMM:
     * the data QPs post no receives and reserve no CQ entries for them. */
    self->vqp_params.max_recvs = 0;
    self->vqp_params.max_inline =
        ucs_min(config->max_inline, (size_t)attr.max_inline);
    self->vqp_params.comp_cb           = uct_rc_vqp_ep_completion;
    self->vqp_params.fail_cb           = uct_rc_vqp_ep_vqp_failed;
    self->vqp_params.connect.timeout   = uct_rc_vqp_ib_timeout(config->timeout);
    self->vqp_params.connect.retry_cnt = config->retry_count;
    self->vqp_params.connect.min_rnr_timer =
        uct_rc_vqp_ib_rnr_timer(config->rnr_timeout);
    self->vqp_params.fail_log_level = self->super.config.failure_level;
    self->ep_addr_len               = vqp_address_size_for(&self->vqp_params);

    tx_max =
        (config->tx_max_bufs == -1) ? UINT_MAX : (unsigned)config->tx_max_bufs;
    status = ucs_mpool_init(
        &self->tx_mp, sizeof(void *),
        sizeof(uct_rc_vqp_tx_desc_t) + self->seg_size + UCT_RC_VQP_BCOPY_SLACK,
        0, UCS_SYS_CACHE_LINE_SIZE, ucs_min(config->tx_bufs_grow, tx_max),
        tx_max, &uct_rc_vqp_tx_mp_ops, "rc_vqp_tx");
    if (status != UCS_OK) {
        goto err_cq;
    }
    *(uct_rc_vqp_iface_t **)ucs_mpool_priv(&self->tx_mp) = self;

    /* An RMA operation of several iov entries needs a slot for each in the
     * endpoint's operation ring. */
    self->rma_max_iov =
        ucs_min((unsigned)UCT_RC_VQP_RMA_MAX_IOV, config->tx_queue_len);
    self->rma_max_zcopy = attr.max_msg_sz;
    status =
        ucs_mpool_init(&self->iov_comp_mp, 0, sizeof(uct_rc_vqp_iov_comp_t), 0,
                       UCS_SYS_CACHE_LINE_SIZE, 64, UINT_MAX,
                       &uct_rc_vqp_iov_comp_mp_ops, "rc_vqp_iov_comp");
    if (status != UCS_OK) {
        goto err_tx_mp;
    }

    self->rx_limited = (config->rx_max_bufs != -1);
    self->rx_missing = 0;
    rx_max = self->rx_limited ? (unsigned)config->rx_max_bufs : UINT_MAX;
    status = ucs_mpool_init(&self->rx_mp, sizeof(void *),
                            payload_offset + self->seg_size, am_align_offset,
                            am_align, ucs_min(256u, rx_max), rx_max,
                            &uct_rc_vqp_rx_mp_ops, "rc_vqp_rx");
    if (status != UCS_OK) {
        goto err_iov_comp_mp;
    }
    *(uct_rc_vqp_iface_t **)ucs_mpool_priv(&self->rx_mp) = self;

    /* The receive buffers reserve their CQ entries up front: a CQ they
     * fill would fail every endpoint later, with a less clear cause. */
    /* An endpoint's QPs each keep a CQ entry for a cover, up to
     * max_covers per CQ. */
    qps =
        ucs_min(config->num_qps + (config->num_qps > 1), cq_params.max_covers);
    status = vqp_srq_create(self->cq, config->rx_queue_len, &self->srq);
    if (status == UCS_ERR_EXCEEDS_LIMIT) {
        uct_rc_vqp_iface_cq_too_small(config, 0, qps + 1);
        status = UCS_ERR_INVALID_PARAM;
        goto err_rx_mp;
    } else if (status != UCS_OK) {
        goto err_rx_mp;
    }
    self->vqp_params.srq = self->srq;
    while (vqp_srq_posted(self->srq) < config->rx_queue_len) {
        status = uct_rc_vqp_iface_post_recv(self, NULL);
        if (status == UCS_ERR_NO_RESOURCE) {
            break; /* the SRQ rounds its size: full */
        } else if ((status == UCS_ERR_NO_MEMORY) && self->rx_limited) {
            self->rx_missing = 0; /* RX_MAX_BUFS below RX_QUEUE_LEN */
            break;
        } else if (status != UCS_OK) {
            goto err_srq;
        }
    }

    if (vqp_cq_room(self->cq) < qps + 1) {
        uct_rc_vqp_iface_cq_too_small(config, vqp_cq_room(self->cq), qps + 1);
        status = UCS_ERR_INVALID_PARAM;
        goto err_srq;
    }

    status = uct_rc_vqp_cm_init(self, config->connect_timeout,
                                config->keepalive_interval);
    if (status != UCS_OK) {
        goto err_srq;
    }
    return UCS_OK;

err_srq:
    vqp_srq_destroy(self->srq, uct_rc_vqp_iface_release_recv, self);
err_rx_mp:
    ucs_mpool_cleanup(&self->rx_mp, 1);
err_iov_comp_mp:
    ucs_mpool_cleanup(&self->iov_comp_mp, 1);
err_tx_mp:
    ucs_mpool_cleanup(&self->tx_mp, 0);
err_cq:
    vqp_cq_destroy(self->cq);
err:
    ucs_arbiter_cleanup(&self->arbiter);
    return status;
}

static UCS_CLASS_CLEANUP_FUNC(uct_rc_vqp_iface_t)
{
    /* First the connection manager's own (passive) endpoints. */
    uct_rc_vqp_cm_cleanup(self);
    if (!ucs_list_is_empty(&self->eps)) {
        ucs_warn("rc_vqp: interface closed with %zu endpoints still open",
                 ucs_list_length(&self->eps));
    }
    uct_base_iface_progress_disable(&self->super.super,
                                    UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    if (vqp_srq_destroy(self->srq, uct_rc_vqp_iface_release_recv, self) !=
        UCS_OK) {
        ucs_warn("rc_vqp: interface closed with endpoints on its receive"
                 " queue; its buffers are leaked");
    }
    vqp_cq_destroy(self->cq);
    ucs_mpool_cleanup(&self->rx_mp, 1);
    ucs_mpool_cleanup(&self->iov_comp_mp, 1);
    ucs_mpool_cleanup(&self->tx_mp, 1);
    ucs_arbiter_cleanup(&self->arbiter);
}

UCS_CLASS_DEFINE(uct_rc_vqp_iface_t, uct_base_iface_t);

static UCS_CLASS_DEFINE_NEW_FUNC(uct_rc_vqp_iface_t, uct_iface_t, uct_md_h,
                                 uct_worker_h, const uct_iface_params_t *,
                                 const uct_iface_config_t *);
static UCS_CLASS_DEFINE_DELETE_FUNC(uct_rc_vqp_iface_t, uct_iface_t);

uct_tl_t UCT_TL_NAME(rc_vqp) = {
    .name          = UCT_RC_VQP_NAME,
    .query_devices = uct_rc_vqp_query_devices,
    .iface_open    = UCS_CLASS_NEW_FUNC_NAME(uct_rc_vqp_iface_t),
    .config =
        {
            .name   = "rc_vqp transport",
            .prefix = "RC_VQP_",
            .table  = uct_rc_vqp_iface_config_table,
            .size   = sizeof(uct_rc_vqp_iface_config_t),
        },
};
