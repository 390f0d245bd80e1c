/*
 * Virtual QP lifetime: creating the physical QPs and the rings the fast path
 * works in (all memory is allocated here, none per operation), the address
 * a peer connects to, connecting, teardown with operations in flight, and
 * statistics.
 */
#include <config.h>

#include "vqp_int.h"

#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/compiler_def.h>
#include <ucs/sys/math.h>
#include <string.h>

/* 2: each distinct device address once, then 3 (+1) bytes per QP. Version
 * 1 repeated the full device address for every QP; the two never mix: a
 * version mismatch is refused with its own message. */
#define VQP_ADDR_VERSION 2

/* Per QP: its 24-bit QPN, then the index of its device address when there
 * are several. Multi-byte fields are big-endian, as in device addresses. */
#define VQP_ADDR_QPN_BYTES 3

/* Wire header of a virtual QP address; num_devs packed device addresses
 * follow, then num_pqps QP entries. */
typedef struct vqp_addr_hdr {
    uint8_t version;
    uint8_t lb;
    uint16_t num_pqps;
    uint32_t recv_window; /* DQPLB reorder window of the sender of this;
                           * 0: it receives no WRITE_IMM */
    uint8_t num_devs;     /* distinct device addresses, 1..VQP_MAX_DEVS */
} UCS_S_PACKED vqp_addr_hdr_t;

void vqp_params_default(vqp_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->num_qps          = 4;
    params->lb               = VQP_LB_DQPLB;
    params->frag_size        = 1024 * 1024;
    params->stripe_threshold = 512 * 1024;
    params->max_outstanding  = 128;
    params->max_ops          = 1024;
    params->max_recvs        = 256;
    params->max_inline       = 64;
    params->fail_log_level   = UCS_LOG_LEVEL_WARN;
    vqp_dev_connect_params_default(&params->connect);
}

static ucs_status_t vqp_check_params(const vqp_params_t *p)
{
    if ((p->cq == NULL) || (p->num_qps == 0) || (p->num_qps > 4096) ||
        (p->frag_size == 0) || (p->frag_size > (1ul << 30)) ||
        (p->frag_size & (p->frag_size - 1)) || (p->max_outstanding == 0) ||
        (p->max_outstanding > 16384) || (p->max_ops == 0) ||
        (p->max_ops > (1u << 20)) || (p->max_recvs > 16384) ||
        (p->lb > VQP_LB_SPRAY) || (p->max_inline < sizeof(uint32_t))) {
        ucs_error("vqp: invalid parameters: cq %p, %u QPs (1..4096), fragment"
                  " %lu bytes (a power of two, 1..1 GiB), %u outstanding"
                  " (1..16384), %u ops"
                  " (1..2^20), %u receives (0..16384), lb %d, max_inline %u"
                  " (>= 4)",
                  p->cq, p->num_qps, p->frag_size, p->max_outstanding,
                  p->max_ops, p->max_recvs, p->lb, p->max_inline);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((p->srq != NULL) && ((p->srq->cq != p->cq) || (p->comp_cb == NULL))) {
        ucs_error("vqp: a shared receive queue needs its own virtual CQ (SRQ"
                  " of cq %p, QP on cq %p) and callback completions",
                  p->srq->cq, p->cq);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

static void *vqp_ring_alloc(uint32_t count, size_t elem, uint32_t *mask_p,
                            const char *name)
{
    uint32_t size = ucs_roundup_pow2(ucs_max(count, (uint32_t)2));
    void *ring    = ucs_calloc(size, elem, name);

    if (ring == NULL) {
        ucs_error("vqp: out of memory for %u %s entries", size, name);
    }
    *mask_p = size - 1;
    return ring;
}

/* vqp_ring_alloc with entries aligned to a cache line. */
static void *vqp_ring_alloc_aligned(uint32_t count, size_t elem,
                                    uint32_t *mask_p, const char *name)
{
    uint32_t size = ucs_roundup_pow2(ucs_max(count, (uint32_t)2));
    void *ring;

    if (ucs_posix_memalign(&ring, UCS_SYS_CACHE_LINE_SIZE, (size_t)size * elem,
                           name) != 0) {
        ucs_error("vqp: out of memory for %u %s entries", size, name);
        return NULL;
    }
    memset(ring, 0, (size_t)size * elem);
    *mask_p = size - 1;
    return ring;
}

/* The largest fragment ring a QP on @a dev can have: a power of two whose
 * SQ of two BBs per entry the device accepts. */
static uint32_t vqp_qp_max_frags(vqp_dev_t *dev)
{
    vqp_dev_attr_t attr;

    vqp_dev_query(dev, &attr);
    return ucs_rounddown_pow2(ucs_max(attr.max_qp_wr / 2, 1u));
}

/* The first data QP whose ring is in vqp->data_frags: SPRAY's first data QP
 * is also the send QP, with a ring of its own sized for max_ops. */
static unsigned vqp_data_frags_first(const vqp_t *vqp)
{
    return (vqp->send_qp == &vqp->qps[0]) ? 1 : 0;
}

/* One array for the fragment rings of the data QPs from
 * vqp_data_frags_first() on: a row per ring entry, a column per QP (rows
 * rounded up to a power of two). Each ring takes max_outstanding entries,
 * as far as every data QP's device allows. */
static ucs_status_t vqp_data_frags_alloc(vqp_t *vqp, const vqp_params_t *params)
{
    unsigned first = vqp_data_frags_first(vqp);
    unsigned count = vqp->num_qps - first;
    uint32_t frags = params->max_outstanding;
    uint32_t row;
    unsigned i;

    if (count < 2) {
        return UCS_OK; /* nothing to interleave */
    }
    row = ucs_roundup_pow2(count);
    for (i = first; i < vqp->num_qps; ++i) {
        frags = ucs_min(
            frags, vqp_qp_max_frags(vqp->cq->devs[i % vqp->cq->num_devs].dev));
    }
    frags           = ucs_roundup_pow2(ucs_max(frags, (uint32_t)2));
    vqp->data_frags = ucs_calloc((size_t)frags * row, sizeof(*vqp->data_frags),
                                 "vqp_data_frags");
    if (vqp->data_frags == NULL) {
        ucs_error("vqp: out of memory for %u x %u fragment records", row,
                  frags);
        return UCS_ERR_NO_MEMORY;
    }
    vqp->data_frag_mask  = frags - 1;
    vqp->data_frag_shift = ucs_ilog2(row * sizeof(*vqp->data_frags));
    return UCS_OK;
}

static ucs_status_t vqp_pqp_create(vqp_t *vqp, const vqp_params_t *params,
                                   unsigned i)
{
    vqp_pqp_t *pqp = &vqp->qps[i];
    vqp_cq_dev_t *cd;
    vqp_dev_qp_init_t init = {0};
    vqp_dev_qp_caps_t caps;
    struct mlx5dv_qp dv;
    uint32_t frags, rq;
    ucs_status_t status;

    pqp->vqp  = vqp;
    pqp->dev  = (i < vqp->num_qps) ? (i % vqp->cq->num_devs) : 0;
    pqp->role = (i < vqp->num_qps)          ? VQP_ROLE_DATA
                : (vqp->lb == VQP_LB_SPRAY) ? VQP_ROLE_NOTIFY
                                            : VQP_ROLE_SEND;
    cd        = &vqp->cq->devs[pqp->dev];

    frags     = params->max_outstanding;
    rq        = 1;
    pqp->cdev = cd;
    if ((pqp == vqp->send_qp) && (params->srq != NULL)) {
        frags    = ucs_max(frags, params->max_ops);
        rq       = 0; /* SENDs land in the SRQ */
        pqp->srq = params->srq;
        ++pqp->srq->users;
    } else if (pqp == vqp->send_qp) {
        frags = ucs_max(frags, params->max_ops);
        rq    = ucs_max(params->max_recvs, 1u);
    } else if (pqp->role == VQP_ROLE_NOTIFY) {
        frags       = params->max_ops;
        rq          = ucs_max(params->max_recvs, 1u);
        pqp->rx_cap = params->max_recvs;
    } else if ((vqp->lb == VQP_LB_DQPLB) && (vqp->num_qps > 1) &&
               (params->max_recvs != 0)) {
        /* Fragments and final messages of the peer land here. */
        rq          = 2 * params->max_outstanding;
        pqp->rx_cap = rq;
    }

    /* The SQ holds twice the ring (vqp_pqp_create below): the send and
     * notify QPs, sized by max_ops, take what the device allows, and
     * operations beyond wait in the operation ring. */
    if ((vqp->data_frags != NULL) && (pqp->role == VQP_ROLE_DATA) &&
        (pqp != vqp->send_qp)) {
        /* Its column of the shared array (vqp_data_frags_alloc). */
        pqp->frags      = vqp->data_frags + (i - vqp_data_frags_first(vqp));
        pqp->frag_mask  = vqp->data_frag_mask;
        pqp->frag_shift = vqp->data_frag_shift;
    } else {
        frags      = ucs_min(frags, vqp_qp_max_frags(cd->dev));
        pqp->frags = vqp_ring_alloc(frags, sizeof(*pqp->frags), &pqp->frag_mask,
                                    "vqp_frags");
        pqp->frag_shift = ucs_ilog2(sizeof(*pqp->frags));
    }
    pqp->frag_limit = pqp->frag_mask + 1;
    pqp->rr_next    = (i >= vqp->num_qps)       ? NULL
                      : (i + 1 == vqp->num_qps) ? &vqp->qps[0]
                                                : &vqp->qps[i + 1];
    if ((pqp == vqp->send_qp) && (rq != 0)) { /* the user's receives */
        pqp->rx_wr_id = ucs_calloc(ucs_roundup_pow2((uint32_t)rq),
                                   sizeof(uint64_t), "vqp_rx_wr_id");
    }
    if ((pqp->frags == NULL) ||
        ((pqp == vqp->send_qp) && (rq != 0) && (pqp->rx_wr_id == NULL))) {
        return UCS_ERR_NO_MEMORY;
    }

    init.send_cq      = cd->dev_cq;
    init.recv_cq      = cd->dev_cq;
    init.max_send_wr  = ucs_max(2 * (pqp->frag_mask + 1), 64u);
    init.max_send_sge = 1;
    init.srq          = (rq == 0) ? pqp->srq->dev_srq : NULL;
    init.max_recv_wr  = rq;
    init.max_recv_sge = (rq == 0) ? 0 : 1;
    init.max_inline   = params->max_inline;
    status = vqp_dev_qp_create(cd->dev, &init, &pqp->dev_qp, &dv, &caps);
    if (status != UCS_OK) {
        return status;
    }
    pqp->qpn   = caps.qpn;
    pqp->alive = 1;

    /* Signal at least every half frag ring, so an unsignaled WQE is always
     * followed by a CQE before the ring can fill. */
    status = vqp_mlx5_txwq_init(
        &pqp->tx, &dv, caps.qpn,
        ucs_min(caps.max_inline, (uint32_t)VQP_MLX5_MAX_INLINE),
        ucs_max((pqp->frag_mask + 1) / 2, 1u), VQP_MLX5_DB_BF, &cd->bf_toggle);
    if (status != UCS_OK) {
        return status;
    }
    if (rq == 0) {
        /* Its receive CQEs are the SRQ's, reserved by the SRQ; WQEs take
         * CQ credits when posted. */
        pqp->cqe_need = 0;
        return vqp_cq_register(vqp->cq, pqp);
    }
    status = vqp_mlx5_rxwq_init(&pqp->rx, &dv);
    if (status != UCS_OK) {
        return status;
    }
    if (pqp->rx_cap > pqp->rx.mask + 1u) {
        pqp->rx_cap = pqp->rx.mask + 1;
    }
    /* Only receives are reserved: the user's may fill the send QP's ring,
     * the core keeps rx_cap posted on the others. */
    pqp->cqe_need = ((pqp == vqp->send_qp) && (params->max_recvs != 0))
                        ? pqp->rx.mask + 1u
                        : pqp->rx_cap;
    return vqp_cq_register(vqp->cq, pqp);
}

static ucs_status_t vqp_slots_create(vqp_t *vqp)
{
    size_t count = 0;
    ucs_status_t status;
    uint32_t rkey;
    unsigned i;

    vqp->atomic_res =
        ucs_calloc(vqp->op_mask + 1, sizeof(uint64_t), "vqp_atomic_res");
    if (vqp->atomic_res == NULL) {
        ucs_error("vqp: out of memory for atomic results");
        return UCS_ERR_NO_MEMORY;
    }
    for (i = 0; i < vqp->cq->num_devs; ++i) {
        status = vqp_dev_mr_reg(vqp->cq->devs[i].dev, vqp->atomic_res,
                                (vqp->op_mask + 1) * sizeof(uint64_t),
                                IBV_ACCESS_LOCAL_WRITE, &vqp->atomic_mr[i],
                                &vqp->atomic_lkey[i], &rkey);
        if (status != UCS_OK) {
            return status;
        }
    }

    for (i = 0; i < vqp->num_pqps; ++i) {
        if (vqp->qps[i].rx_cap != 0) {
            vqp->qps[i].slot_base = count;
            count += vqp->qps[i].rx.mask + 1;
        }
    }
    if (count == 0) {
        return UCS_OK;
    }
    vqp->slots_len = count * sizeof(uint32_t);
    vqp->slots     = ucs_calloc(count, sizeof(uint32_t), "vqp_slots");
    if (vqp->slots == NULL) {
        ucs_error("vqp: out of memory for %zu receive slots", count);
        return UCS_ERR_NO_MEMORY;
    }
    for (i = 0; i < vqp->cq->num_devs; ++i) {
        status = vqp_dev_mr_reg(vqp->cq->devs[i].dev, vqp->slots,
                                vqp->slots_len, IBV_ACCESS_LOCAL_WRITE,
                                &vqp->slot_mr[i], &vqp->slot_lkey[i], &rkey);
        if (status != UCS_OK) {
            return status;
        }
    }
    return UCS_OK;
}

static void vqp_free(vqp_t *vqp)
{
    vqp_pqp_t *pqp;
    unsigned i;

    for (i = 0; i < vqp->num_pqps; ++i) {
        pqp = &vqp->qps[i];
        if (pqp->dev_qp != NULL) {
            vqp_dev_qp_destroy(pqp->dev_qp);
            /* No more CQEs of it now; those not polled must not reach a
             * QP that reuses its number, nor strand SRQ entries. */
            vqp_cq_retire(vqp->cq, pqp);
        }
        vqp_cq_unregister(vqp->cq, pqp);
        if (pqp->srq != NULL) {
            --pqp->srq->users;
        }
        if ((pqp->frags != NULL) &&
            (pqp->frag_shift == ucs_ilog2(sizeof(*pqp->frags)))) {
            ucs_free(pqp->frags); /* its own ring */
        }
        ucs_free(pqp->rx_wr_id);
    }
    ucs_free(vqp->data_frags);
    for (i = 0; i < VQP_MAX_DEVS; ++i) {
        if (vqp->slot_mr[i] != NULL) {
            vqp_dev_mr_dereg(vqp->slot_mr[i]);
        }
        if (vqp->atomic_mr[i] != NULL) {
            vqp_dev_mr_dereg(vqp->atomic_mr[i]);
        }
    }
    ucs_free(vqp->slots);
    ucs_free(vqp->atomic_res);
    ucs_free(vqp->qps);
    ucs_free(vqp->ops);
    ucs_free(vqp->op_ext);
    ucs_free(vqp->replay);
    ucs_free(vqp->send_acked);
    ucs_free(vqp->win_state);
    ucs_free(vqp->win_imm);
    ucs_free(vqp->arrived_imm);
    ucs_free(vqp->arrived_failed);
    ucs_free(vqp->nrecv_wr_id);
    ucs_free(vqp);
}

ucs_status_t vqp_create(const vqp_params_t *params, vqp_t **vqp_p)
{
    uint32_t frag_cap, win, mask;
    ucs_status_t status;
    vqp_t *vqp;
    unsigned i;

    status = vqp_check_params(params);
    if (status != UCS_OK) {
        return status;
    }

    /* Aligned: its first cache lines are what every post touches. */
    if (ucs_posix_memalign((void **)&vqp, UCS_SYS_CACHE_LINE_SIZE, sizeof(*vqp),
                           "vqp") != 0) {
        ucs_error("vqp: out of memory");
        return UCS_ERR_NO_MEMORY;
    }
    memset(vqp, 0, sizeof(*vqp));
    vqp->cq               = params->cq;
    vqp->num_qps          = params->num_qps;
    vqp->num_pqps         = params->num_qps + (params->num_qps > 1);
    vqp->alive            = params->num_qps;
    vqp->lb               = params->lb;
    vqp->frag_size        = params->frag_size;
    vqp->frag_shift       = ucs_ilog2(params->frag_size);
    vqp->stripe_threshold = params->stripe_threshold;
    vqp->whole_max        = (params->num_qps > 1)
                                ? ucs_min(params->stripe_threshold, VQP_MLX5_MAX_MSG)
                                : VQP_MLX5_MAX_MSG;
    vqp->max_ops          = params->max_ops;
    vqp->max_recvs        = params->max_recvs;
    vqp->comp_cb          = params->comp_cb;
    vqp->comp_arg         = params->comp_arg;
    vqp->fail_cb          = params->fail_cb;
    vqp->connect          = params->connect;
    vqp->fail_log_level   = params->fail_log_level;
    vqp->fatal            = UCS_OK;
    {
        vqp_dev_attr_t attr;

        /* Atomics go to the send QP, on the first device. */
        vqp_dev_query(params->cq->devs[0].dev, &attr);
        vqp->atomic_be = attr.atomic_be_sizes;
    }

    frag_cap         = ucs_roundup_pow2((uint32_t)params->max_outstanding);
    vqp->send_window = ucs_roundup_pow2(vqp->num_qps * frag_cap);
    win              = 2 * vqp->send_window;

    if (ucs_posix_memalign((void **)&vqp->qps, UCS_SYS_CACHE_LINE_SIZE,
                           vqp->num_pqps * sizeof(*vqp->qps), "vqp_qps") == 0) {
        memset(vqp->qps, 0, vqp->num_pqps * sizeof(*vqp->qps));
    } else {
        vqp->qps = NULL;
    }
    /* One cache line per operation record. */
    vqp->ops    = vqp_ring_alloc_aligned(params->max_ops, sizeof(*vqp->ops),
                                         &vqp->op_mask, "vqp_ops");
    vqp->op_ext = vqp_ring_alloc(params->max_ops, sizeof(*vqp->op_ext), &mask,
                                 "vqp_op_ext");
    /* Replays come from posted WQEs: at most every data QP's ring and the
     * send QP's. */
    vqp->replay = vqp_ring_alloc(
        vqp->num_qps * frag_cap + ucs_max(frag_cap, (uint32_t)params->max_ops),
        sizeof(*vqp->replay), &vqp->replay_mask, "vqp_replay");
    vqp->send_acked  = ucs_calloc(vqp->send_window, 1, "vqp_send_acked");
    vqp->win_state   = vqp_ring_alloc(win, 1, &vqp->win_mask, "vqp_win");
    vqp->win_imm     = vqp_ring_alloc(win, sizeof(uint32_t), &mask, "vqp_imm");
    vqp->arrived_imm = vqp_ring_alloc(win + params->max_recvs, sizeof(uint32_t),
                                      &vqp->arrived_mask, "vqp_arrived");
    vqp->arrived_failed =
        vqp_ring_alloc(win + params->max_recvs, 1, &mask, "vqp_arrived_failed");
    vqp->nrecv_wr_id = vqp_ring_alloc(params->max_recvs, sizeof(uint64_t),
                                      &vqp->nrecv_mask, "vqp_nrecv");
    if ((vqp->qps == NULL) || (vqp->ops == NULL) || (vqp->op_ext == NULL) ||
        (vqp->replay == NULL) || (vqp->send_acked == NULL) ||
        (vqp->win_state == NULL) || (vqp->win_imm == NULL) ||
        (vqp->arrived_imm == NULL) || (vqp->arrived_failed == NULL) ||
        (vqp->nrecv_wr_id == NULL)) {
        status = UCS_ERR_NO_MEMORY;
        goto err;
    }

    /* DQPLB keeps the data QPs' receive queues for itself, so SENDs and the
     * user's receives get the extra QP; SPRAY's data QPs receive nothing and
     * the first one carries them. */
    vqp->send_qp   = ((vqp->lb == VQP_LB_DQPLB) && (vqp->num_qps > 1))
                         ? &vqp->qps[vqp->num_qps]
                         : &vqp->qps[0];
    vqp->notify_qp = ((vqp->lb == VQP_LB_SPRAY) && (vqp->num_qps > 1))
                         ? &vqp->qps[vqp->num_qps]
                         : NULL;

    vqp->rr_qp = &vqp->qps[0];
    status     = vqp_data_frags_alloc(vqp, params);
    if (status != UCS_OK) {
        goto err;
    }
    for (i = 0; i < vqp->num_pqps; ++i) {
        status = vqp_pqp_create(vqp, params, i);
        if (status != UCS_OK) {
            goto err;
        }
    }
    status = vqp_slots_create(vqp);
    if (status != UCS_OK) {
        goto err;
    }

    vqp->wc_reserve = params->max_ops + 2 * params->max_recvs;
    status          = vqp_cq_reserve_wcs(vqp->cq, vqp->wc_reserve);
    if (status != UCS_OK) {
        goto err;
    }
    ++vqp->cq->num_vqps;
    ucs_list_add_tail(&vqp->cq->vqps, &vqp->cq_list);
    *vqp_p = vqp;
    return UCS_OK;

err:
    vqp_free(vqp);
    return status;
}

void vqp_destroy(vqp_t *vqp)
{
    vqp_cq_t *cq = vqp->cq;
    uint32_t i;

    vqp_fail_all(vqp, UCS_ERR_CANCELED);
    vqp_recv_cancel_all(vqp);

    /* Completions still waiting for vqp_cq_poll stay the user's, but must
     * not point to freed memory. */
    for (i = cq->wc_head; i != cq->wc_tail; ++i) {
        if (cq->wcs[i & cq->wc_mask].vqp == vqp) {
            cq->wcs[i & cq->wc_mask].vqp = NULL;
            ++cq->wc_stale;
        }
    }
    vqp_cq_reserve_wcs(cq, -(int)vqp->wc_reserve);
    if (vqp->dirty) {
        /* Marked for the next poll's advance (vqp_cancel does, a callback
         * may destroy another virtual QP of the batch): off the list. */
        for (i = 0; cq->dirty[i] != vqp; ++i) {
        }
        cq->dirty[i] = cq->dirty[--cq->num_dirty];
    }
    --cq->num_vqps;
    ucs_list_del(&vqp->cq_list);
    if (vqp->credit_wait) {
        ucs_list_del(&vqp->credit_list);
    }
    vqp_free(vqp);
}

/* The distinct device addresses among the CQ devices whose mask bit is set
 * in @a used: @a wire_p[d] is the wire index of CQ device d, @a addrs the
 * distinct addresses in wire order. Returns their count. Two CQ devices of
 * the same address (the same device opened twice) share one entry. */
static unsigned vqp_addr_devs(const vqp_cq_t *cq, unsigned used,
                              vqp_dev_addr_t *addrs, uint8_t *wire_p)
{
    uint8_t packed[VQP_MAX_DEVS][VQP_DEV_ADDR_PACKED_MAX];
    size_t lens[VQP_MAX_DEVS];
    unsigned d, w, count = 0;

    for (d = 0; d < cq->num_devs; ++d) {
        if (!(used & (1u << d))) {
            continue;
        }
        /* Compared packed: the struct has padding and a union. */
        vqp_dev_address(cq->devs[d].dev, &addrs[count]);
        if (vqp_dev_addr_pack(&addrs[count], packed[count],
                              sizeof(packed[count]), &lens[count]) != UCS_OK) {
            lens[count] = 0;
        }
        for (w = 0; w < count; ++w) {
            if ((lens[w] == lens[count]) &&
                !memcmp(packed[w], packed[count], lens[w])) {
                break;
            }
        }
        count += (w == count);
        wire_p[d] = (uint8_t)w;
    }
    return count;
}

/* CQ devices the QPs of a virtual QP use (bit per device): data QP i is on
 * device i % num_devs, the extra QP on device 0 (as vqp_pqp_create). */
static unsigned vqp_addr_used_devs(unsigned num_qps, unsigned num_devs)
{
    unsigned i, used = 1;

    for (i = 0; (i < num_qps) && (i < num_devs); ++i) {
        used |= 1u << i;
    }
    return used;
}

static size_t vqp_addr_size(const vqp_cq_t *cq, unsigned num_qps,
                            unsigned num_pqps)
{
    vqp_dev_addr_t addrs[VQP_MAX_DEVS];
    uint8_t wire[VQP_MAX_DEVS];
    size_t size = sizeof(vqp_addr_hdr_t);
    unsigned w, count;

    count = vqp_addr_devs(cq, vqp_addr_used_devs(num_qps, cq->num_devs), addrs,
                          wire);
    for (w = 0; w < count; ++w) {
        size += vqp_dev_addr_packed_size(&addrs[w]);
    }
    return size + num_pqps * (VQP_ADDR_QPN_BYTES + (count > 1));
}

size_t vqp_address_size_for(const vqp_params_t *params)
{
    return vqp_addr_size(params->cq, params->num_qps,
                         params->num_qps + (params->num_qps > 1));
}

size_t vqp_address_size(const vqp_t *vqp)
{
    return vqp_addr_size(vqp->cq, vqp->num_qps, vqp->num_pqps);
}

ucs_status_t vqp_address_pack(const vqp_t *vqp, void *buf, size_t max,
                              size_t *len_p)
{
    vqp_addr_hdr_t hdr = {
        .version     = VQP_ADDR_VERSION,
        .lb          = vqp->lb,
        .num_pqps    = htobe16(vqp->num_pqps),
        .recv_window = htobe32((vqp->max_recvs == 0) ? 0 : vqp->win_mask + 1)};
    vqp_dev_addr_t addrs[VQP_MAX_DEVS];
    uint8_t wire[VQP_MAX_DEVS];
    size_t len, offset, need;
    ucs_status_t status;
    uint8_t *p;
    unsigned i;

    need = vqp_address_size(vqp);
    if (max < need) {
        ucs_error("vqp %p: address buffer of %zu bytes is too small (%zu"
                  " needed)",
                  vqp, max, need);
        return UCS_ERR_BUFFER_TOO_SMALL;
    }
    hdr.num_devs = (uint8_t)vqp_addr_devs(
        vqp->cq, vqp_addr_used_devs(vqp->num_qps, vqp->cq->num_devs), addrs,
        wire);
    memcpy(buf, &hdr, sizeof(hdr));
    offset = sizeof(hdr);
    for (i = 0; i < hdr.num_devs; ++i) {
        status = vqp_dev_addr_pack(&addrs[i], UCS_PTR_BYTE_OFFSET(buf, offset),
                                   max - offset, &len);
        if (status != UCS_OK) {
            return status;
        }
        offset += len;
    }
    for (i = 0; i < vqp->num_pqps; ++i) {
        p    = UCS_PTR_BYTE_OFFSET(buf, offset);
        p[0] = (uint8_t)(vqp->qps[i].qpn >> 16);
        p[1] = (uint8_t)(vqp->qps[i].qpn >> 8);
        p[2] = (uint8_t)vqp->qps[i].qpn;
        if (hdr.num_devs > 1) {
            p[3] = wire[vqp->qps[i].dev];
        }
        offset += VQP_ADDR_QPN_BYTES + (hdr.num_devs > 1);
    }
    ucs_assert(offset == need);
    *len_p = offset;
    return UCS_OK;
}

ucs_status_t vqp_connect(vqp_t *vqp, const void *buf, size_t len)
{
    vqp_dev_connect_params_t params = vqp->connect;
    vqp_dev_addr_t addrs[VQP_MAX_DEVS];
    size_t offset, used, entry, need;
    vqp_dev_qp_addr_t remote;
    ucs_status_t status;
    vqp_addr_hdr_t hdr;
    const uint8_t *p;
    unsigned i, w;

    if (vqp->connected) {
        ucs_error("vqp %p: already connected", vqp);
        return UCS_ERR_INVALID_PARAM;
    }
    if (len < sizeof(hdr)) {
        ucs_error("vqp %p: peer address of %zu bytes is truncated (header"
                  " alone is %zu)",
                  vqp, len, sizeof(hdr));
        return UCS_ERR_INVALID_PARAM;
    }
    memcpy(&hdr, buf, sizeof(hdr));
    hdr.num_pqps    = be16toh(hdr.num_pqps);
    hdr.recv_window = be32toh(hdr.recv_window);
    if (hdr.version != VQP_ADDR_VERSION) {
        ucs_error("vqp %p: peer address has format version %u, ours is %u", vqp,
                  hdr.version, VQP_ADDR_VERSION);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((hdr.lb != vqp->lb) || (hdr.num_pqps != vqp->num_pqps) ||
        (hdr.recv_window & (hdr.recv_window - 1)) || (hdr.num_devs == 0) ||
        (hdr.num_devs > VQP_MAX_DEVS)) {
        ucs_error("vqp %p: peer address (lb %u, %u QPs, window %u, %u"
                  " devices) does not match ours (lb %u, %u QPs) or is"
                  " invalid",
                  vqp, hdr.lb, hdr.num_pqps, hdr.recv_window, hdr.num_devs,
                  vqp->lb, vqp->num_pqps);
        return UCS_ERR_INVALID_PARAM;
    }

    offset = sizeof(hdr);
    for (w = 0; w < hdr.num_devs; ++w) {
        status = vqp_dev_addr_unpack(UCS_PTR_BYTE_OFFSET(buf, offset),
                                     len - offset, &addrs[w], &used);
        if (status != UCS_OK) {
            ucs_error("vqp %p: peer address: device address %u of %u is"
                      " invalid or truncated (%zu bytes left)",
                      vqp, w, hdr.num_devs, len - offset);
            return UCS_ERR_INVALID_PARAM;
        }
        offset += used;
    }
    entry = VQP_ADDR_QPN_BYTES + (hdr.num_devs > 1);
    need  = offset + (size_t)hdr.num_pqps * entry;
    if (len != need) {
        ucs_error("vqp %p: peer address of %zu bytes, %zu expected for %u QPs"
                  " on %u devices",
                  vqp, len, need, hdr.num_pqps, hdr.num_devs);
        return UCS_ERR_INVALID_PARAM;
    }
    /* Check every entry before connecting any QP. */
    for (i = 0; i < vqp->num_pqps; ++i) {
        p          = UCS_PTR_BYTE_OFFSET(buf, offset + i * entry);
        remote.qpn = ((uint32_t)p[0] << 16) | ((uint32_t)p[1] << 8) | p[2];
        w          = (hdr.num_devs > 1) ? p[3] : 0;
        if ((remote.qpn < 2) || (w >= hdr.num_devs)) {
            ucs_error("vqp %p: peer address: QP %u has QPN 0x%x and device"
                      " %u (of %u): invalid",
                      vqp, i, remote.qpn, w, hdr.num_devs);
            return UCS_ERR_INVALID_PARAM;
        }
    }

    /* Never run ahead of what the peer's window can reorder. A window of 0:
     * the peer posts no receives for notifications. */
    vqp->peer_no_imm = (hdr.recv_window == 0);
    if (!vqp->peer_no_imm) {
        vqp->send_window = ucs_min(vqp->send_window, hdr.recv_window / 2);
    }
    for (i = 0; i < vqp->num_pqps; ++i) {
        p          = UCS_PTR_BYTE_OFFSET(buf, offset + i * entry);
        remote.qpn = ((uint32_t)p[0] << 16) | ((uint32_t)p[1] << 8) | p[2];
        remote.dev = addrs[(hdr.num_devs > 1) ? p[3] : 0];
        params.udp_sport_index = i;
        params.udp_sport_base  = (uint16_t)((uintptr_t)vqp >> 6);
        status = vqp_dev_qp_connect(vqp->qps[i].dev_qp, &remote, &params);
        if (status != UCS_OK) {
            return status;
        }
    }
    vqp->connected   = 1;
    vqp->fast_ops_up = UCS_BIT(VQP_OP_WRITE) | UCS_BIT(VQP_OP_READ);
    if (!vqp->peer_no_imm && (vqp->notify_qp == NULL)) {
        vqp->fast_ops_up |= UCS_BIT(VQP_OP_WRITE_IMM);
    }
    if (vqp->cq->num_devs == 1) {
        vqp->fast_ops_up |=
            (vqp->fast_ops_up &
             ~((vqp->num_qps > 1) ? UCS_BIT(VQP_OP_WRITE_IMM) : 0))
            << VQP_FAST_WHOLE;
    }
    vqp->fast_ops = vqp->fast_ops_up;
    vqp_recv_replenish(vqp);
    return UCS_OK;
}

void vqp_query_stats(const vqp_t *vqp, vqp_stats_t *stats)
{
    unsigned i;

    *stats = vqp->stats;
    /* Every operation posted entered the ring and leaves it at its report:
     * no counter per completion. */
    stats->ops_completed =
        vqp->stats.ops_posted - VQP_RING_COUNT(vqp->op_head, vqp->op_tail);
    stats->qps_alive = 0;
    for (i = 0; i < vqp->num_pqps; ++i) {
        stats->qps_alive += vqp->qps[i].alive;
    }
}
