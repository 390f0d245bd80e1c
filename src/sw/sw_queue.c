/*
 * Software mlx5 device: CQ, SRQ and RC QP objects, their queue memory laid
 * out as mlx5dv_init_obj() describes it, and the QP state machine.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <stdlib.h>
#include <string.h>

static uint32_t vqp_sw_roundup_pow2(uint32_t v)
{
    uint32_t r = 1;

    while (r < v) {
        r <<= 1;
    }
    return r;
}

const char *vqp_sw_state_str(enum ibv_qp_state state)
{
    switch (state) {
    case IBV_QPS_RESET:
        return "RESET";
    case IBV_QPS_INIT:
        return "INIT";
    case IBV_QPS_RTR:
        return "RTR";
    case IBV_QPS_RTS:
        return "RTS";
    case IBV_QPS_SQD:
        return "SQD";
    case IBV_QPS_SQE:
        return "SQE";
    case IBV_QPS_ERR:
        return "ERR";
    default:
        return "?";
    }
}

static ucs_status_t vqp_sw_cq_create_locked(vqp_sw_dev_t *dev, uint32_t cqe,
                                            vqp_sw_cq_t **cq_p,
                                            struct mlx5dv_cq *dv)
{
    vqp_sw_cq_t *cq;
    uint32_t i, cnt;

    if ((cqe == 0) || (cqe > dev->attr.max_cqe)) {
        ucs_error("vqp_sw %s: cq_create with %u entries (allowed 1..%u)",
                  dev->name, cqe, dev->attr.max_cqe);
        return UCS_ERR_INVALID_PARAM;
    }
    for (i = 0; (i < VQP_SW_MAX_CQ) && (dev->cqs[i] != NULL); ++i) {
    }
    if (i == VQP_SW_MAX_CQ) {
        ucs_error("vqp_sw %s: too many CQs (max %u)", dev->name, VQP_SW_MAX_CQ);
        return UCS_ERR_EXCEEDS_LIMIT;
    }
    cq = calloc(1, sizeof(*cq));
    if (cq == NULL) {
        ucs_error("vqp_sw %s: cannot allocate CQ", dev->name);
        return UCS_ERR_NO_MEMORY;
    }
    cnt     = vqp_sw_roundup_pow2(cqe);
    cq->buf = vqp_sw_arena_alloc(dev, (size_t)cnt * sizeof(struct mlx5_cqe64),
                                 &cq->pages, &cq->off);
    if (cq->buf == NULL) {
        free(cq);
        return UCS_ERR_NO_MEMORY;
    }
    cq->dev     = dev;
    cq->index   = i;
    cq->cqe_cnt = cnt;
    while ((1u << cq->log_cnt) < cnt) {
        ++cq->log_cnt;
    }
    cq->dbrec    = dev->shm->cq_dbrec[i];
    cq->dbrec[0] = 0;
    cq->dbrec[1] = 0;
    /* All ones is no valid arm doorbell (reserved bits): "never armed",
     * while CQ 0 armed at index 0 with sequence 0 writes all zeros. */
    memset(cq->uar, 0xff, sizeof(cq->uar));
    /* Invalid opcode, owner 0: software sees nothing until we write. */
    for (i = 0; i < cnt; ++i) {
        cq->buf[i].op_own = MLX5_CQE_INVALID << 4;
    }
    dev->cqs[cq->index] = cq;
    memset(dv, 0, sizeof(*dv));
    dv->buf      = cq->buf;
    dv->dbrec    = (__be32 *)cq->dbrec;
    dv->cqe_cnt  = cnt;
    dv->cqe_size = sizeof(struct mlx5_cqe64);
    dv->cq_uar   = cq->uar;
    dv->cqn      = cq->index;
    *cq_p        = cq;
    return UCS_OK;
}

ucs_status_t vqp_sw_cq_create(vqp_sw_dev_t *dev, uint32_t cqe,
                              vqp_sw_cq_t **cq_p, struct mlx5dv_cq *dv)
{
    return VQP_SW_LOCKED(vqp_sw_cq_create_locked(dev, cqe, cq_p, dv));
}

static ucs_status_t vqp_sw_cq_destroy_locked(vqp_sw_cq_t *cq)
{
    if (cq == NULL) {
        ucs_error("vqp_sw: cq_destroy(NULL)");
        return UCS_ERR_INVALID_PARAM;
    }
    if (cq->refs > 0) {
        ucs_error("vqp_sw %s: cq_destroy of CQ %u still used by %u QPs",
                  cq->dev->name, cq->index, cq->refs);
        return UCS_ERR_BUSY;
    }
    cq->dev->cqs[cq->index] = NULL;
    vqp_sw_arena_free(cq->dev, cq->off, cq->pages);
    free(cq);
    return UCS_OK;
}

ucs_status_t vqp_sw_cq_destroy(vqp_sw_cq_t *cq)
{
    return VQP_SW_LOCKED(vqp_sw_cq_destroy_locked(cq));
}

ucs_status_t vqp_sw_cq_status(const vqp_sw_cq_t *cq)
{
    /* Set by the engine, maybe in another thread: one flag, no lock. */
    return __atomic_load_n(&cq->overflow, __ATOMIC_RELAXED)
               ? UCS_ERR_BUFFER_TOO_SMALL
               : UCS_OK;
}

static ucs_status_t vqp_sw_srq_create_locked(vqp_sw_dev_t *dev, uint32_t max_wr,
                                             uint32_t max_sge,
                                             vqp_sw_srq_t **srq_p,
                                             struct mlx5dv_srq *dv)
{
    struct mlx5_wqe_srq_next_seg *next;
    vqp_sw_srq_t *srq;
    uint64_t off;
    uint32_t i, idx, cnt, stride;
    uint8_t *buf;

    if ((max_wr == 0) || (max_wr >= dev->attr.max_srq_wr) || (max_sge == 0) ||
        (max_sge > dev->attr.max_sge)) {
        ucs_error("vqp_sw %s: srq_create max_wr %u (1..%u) max_sge %u (1..%u)",
                  dev->name, max_wr, dev->attr.max_srq_wr - 1, max_sge,
                  dev->attr.max_sge);
        return UCS_ERR_INVALID_PARAM;
    }
    for (i = 0; (i < VQP_SW_MAX_SRQ) && (dev->srqs[i] != NULL); ++i) {
    }
    if (i == VQP_SW_MAX_SRQ) {
        ucs_error("vqp_sw %s: too many SRQs (max %u)", dev->name,
                  VQP_SW_MAX_SRQ);
        return UCS_ERR_EXCEEDS_LIMIT;
    }
    idx = i;
    srq = calloc(1, sizeof(*srq));
    if (srq == NULL) {
        ucs_error("vqp_sw %s: cannot allocate SRQ", dev->name);
        return UCS_ERR_NO_MEMORY;
    }
    /* As mlx5: one spare entry, the list's tail is never handed out. */
    cnt    = vqp_sw_roundup_pow2(max_wr + 1);
    stride = vqp_sw_roundup_pow2(sizeof(*next) +
                                 max_sge * sizeof(struct mlx5_wqe_data_seg));
    buf    = vqp_sw_arena_alloc(dev, (size_t)cnt * stride, &srq->pages, &off);
    if (buf == NULL) {
        free(srq);
        return UCS_ERR_NO_MEMORY;
    }
    for (i = 0; i < cnt; ++i) {
        next                 = (void *)(buf + (size_t)i * stride);
        next->next_wqe_index = htobe16((uint16_t)((i + 1) & (cnt - 1)));
    }
    srq->dev     = dev;
    i            = idx;
    srq->index   = i;
    srq->shm     = &dev->shm->srq[i];
    srq->buf     = buf;
    srq->wqe_cnt = cnt;
    srq->stride  = stride;
    srq->max_sge = max_sge;
    vqp_sw_lock(dev->shm);
    srq->shm->wqe_cnt         = cnt;
    srq->shm->stride          = stride;
    srq->shm->max_sge         = max_sge;
    srq->shm->hw_head         = 0;
    srq->shm->consumed        = 0;
    srq->shm->buf_off         = off;
    srq->shm->used            = 1;
    dev->shm->srq_dbrec[i][0] = 0;
    vqp_sw_unlock(dev->shm);
    dev->srqs[i] = srq;
    memset(dv, 0, sizeof(*dv));
    dv->buf       = buf;
    dv->dbrec     = (__be32 *)dev->shm->srq_dbrec[i];
    dv->stride    = stride;
    dv->head      = 0;
    dv->tail      = cnt - 1;
    dv->srqn      = i;
    dv->comp_mask = MLX5DV_SRQ_MASK_SRQN;
    *srq_p        = srq;
    return UCS_OK;
}

ucs_status_t vqp_sw_srq_create(vqp_sw_dev_t *dev, uint32_t max_wr,
                               uint32_t max_sge, vqp_sw_srq_t **srq_p,
                               struct mlx5dv_srq *dv)
{
    return VQP_SW_LOCKED(
        vqp_sw_srq_create_locked(dev, max_wr, max_sge, srq_p, dv));
}

static ucs_status_t vqp_sw_srq_destroy_locked(vqp_sw_srq_t *srq)
{
    vqp_sw_dev_t *dev;

    if (srq == NULL) {
        ucs_error("vqp_sw: srq_destroy(NULL)");
        return UCS_ERR_INVALID_PARAM;
    }
    dev = srq->dev;
    if (srq->refs > 0) {
        ucs_error("vqp_sw %s: srq_destroy of SRQ %u still used by %u QPs",
                  dev->name, srq->index, srq->refs);
        return UCS_ERR_BUSY;
    }
    vqp_sw_lock(dev->shm);
    srq->shm->used = 0;
    vqp_sw_unlock(dev->shm);
    vqp_sw_arena_free(dev, srq->shm->buf_off, srq->pages);
    dev->srqs[srq->index] = NULL;
    free(srq);
    return UCS_OK;
}

ucs_status_t vqp_sw_srq_destroy(vqp_sw_srq_t *srq)
{
    return VQP_SW_LOCKED(vqp_sw_srq_destroy_locked(srq));
}

static ucs_status_t vqp_sw_qp_create_type(vqp_sw_dev_t *dev,
                                          const vqp_sw_qp_init_attr_t *attr,
                                          uint32_t type, vqp_sw_qp_t **qp_p,
                                          struct mlx5dv_qp *dv, uint32_t *qpn_p)
{
    vqp_sw_shm_qp_t *sq;
    vqp_sw_qp_t *qp;
    uint32_t i, n, gen, rq_cnt = 0, rq_stride = 0;
    uint64_t sq_off, rq_off = 0;
    uint8_t *rq_buf = NULL;

    if ((attr->send_cq == NULL) || (attr->recv_cq == NULL) ||
        (attr->send_cq->dev != dev) || (attr->recv_cq->dev != dev) ||
        ((attr->srq != NULL) && (attr->srq->dev != dev))) {
        ucs_error("vqp_sw %s: qp_create needs a send and a recv CQ (and SRQ) "
                  "of this device",
                  dev->name);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((attr->max_send_wr == 0) || (attr->max_send_wr > dev->attr.max_qp_wr) ||
        (attr->max_inline_data > dev->attr.max_inline) ||
        ((attr->srq == NULL) &&
         ((attr->max_recv_wr > dev->attr.max_qp_wr) ||
          (attr->max_recv_sge > dev->attr.max_sge) ||
          ((attr->max_recv_wr > 0) && (attr->max_recv_sge == 0))))) {
        ucs_error("vqp_sw %s: qp_create limits exceeded: max_send_wr %u "
                  "(1..%u) max_recv_wr %u max_recv_sge %u (..%u) "
                  "max_inline_data %u (..%u)",
                  dev->name, attr->max_send_wr, dev->attr.max_qp_wr,
                  attr->max_recv_wr, attr->max_recv_sge, dev->attr.max_sge,
                  attr->max_inline_data, dev->attr.max_inline);
        return UCS_ERR_INVALID_PARAM;
    }
    /* Next fit: slots are reused round the table, so a QPN's generation
     * comes back only after every free slot was taken, and a create does
     * not walk the QPs in use from slot 0. */
    for (n = 0, i = dev->qp_next; (n < VQP_SW_MAX_QP) && (dev->qps[i] != NULL);
         ++n, i   = (i + 1) & (VQP_SW_MAX_QP - 1)) {
    }
    if (n == VQP_SW_MAX_QP) {
        ucs_error("vqp_sw %s: too many QPs (max %u)", dev->name, VQP_SW_MAX_QP);
        return UCS_ERR_EXCEEDS_LIMIT;
    }
    dev->qp_next = (i + 1) & (VQP_SW_MAX_QP - 1);
    qp           = calloc(1, sizeof(*qp));
    if (qp == NULL) {
        ucs_error("vqp_sw %s: cannot allocate QP", dev->name);
        return UCS_ERR_NO_MEMORY;
    }
    qp->bf = aligned_alloc(64, 2 * VQP_SW_BF_SIZE);
    if (qp->bf == NULL) {
        ucs_error("vqp_sw %s: cannot allocate BlueFlame area", dev->name);
        goto err_free;
    }
    qp->sq_wqe_cnt = vqp_sw_roundup_pow2(attr->max_send_wr);
    qp->sq_buf     = vqp_sw_arena_alloc(dev, (size_t)qp->sq_wqe_cnt * VQP_SW_BB,
                                        &qp->sq_pages, &sq_off);
    if (qp->sq_buf == NULL) {
        goto err_free;
    }
    if ((attr->srq == NULL) && (attr->max_recv_wr > 0)) {
        rq_cnt    = vqp_sw_roundup_pow2(attr->max_recv_wr);
        rq_stride = vqp_sw_roundup_pow2(attr->max_recv_sge *
                                        sizeof(struct mlx5_wqe_data_seg));
        rq_buf    = vqp_sw_arena_alloc(dev, (size_t)rq_cnt * rq_stride,
                                       &qp->rq_pages, &rq_off);
        if (rq_buf == NULL) {
            vqp_sw_arena_free(dev, sq_off, qp->sq_pages);
            goto err_free;
        }
    }
    /* QPN = generation:index, never 0 and unique while the device lives. */
    gen = (dev->qp_gen[i] + 1) & ((1u << (24 - VQP_SW_QP_BITS)) - 1);
    if (gen == 0) {
        gen = 1;
    }
    dev->qp_gen[i] = gen;
    qp->dev        = dev;
    qp->index      = i;
    qp->qpn        = (gen << VQP_SW_QP_BITS) | i;
    qp->shm = sq   = &dev->shm->qp[i];
    qp->dbrec      = dev->shm->qp_dbrec[i];
    qp->send_cq    = attr->send_cq;
    qp->recv_cq    = attr->recv_cq;
    qp->srq        = attr->srq;
    qp->max_inline = attr->max_inline_data;
    qp->drawn_wqe  = UINT32_MAX;
    qp->rq_buf     = rq_buf;
    qp->rq_wqe_cnt = rq_cnt;
    qp->rq_stride  = rq_stride;
    qp->rq_max_sge = attr->max_recv_sge;
    qp->dbrec[0]   = 0;
    qp->dbrec[1]   = 0;
    /* Without the segment's lock: the slot stays in RESET, where no peer
     * acts on it (they read the state first, acquire), and destroy left no
     * depositor inside it. */
    memset(sq, 0, sizeof(*sq));
    sq->state      = IBV_QPS_RESET;
    sq->srq_index  = attr->srq ? attr->srq->index : VQP_SW_NO_SRQ;
    sq->rq_wqe_cnt = rq_cnt;
    sq->rq_stride  = rq_stride;
    sq->rq_max_sge = attr->max_recv_sge;
    sq->rq_off     = rq_off;
    sq->type       = type;
    sq->qpn        = qp->qpn;
    qp->ud         = (type == VQP_SW_QPT_UD);
    ++qp->send_cq->refs;
    ++qp->recv_cq->refs;
    if (qp->srq != NULL) {
        ++qp->srq->refs;
    }
    dev->qps[i]                = qp;
    qp->list_pos               = dev->n_qps;
    dev->scan[dev->n_qps].db   = &qp->dbrec[MLX5_SND_DBR];
    dev->scan[dev->n_qps].idle = 0;
    dev->qp_list[dev->n_qps++] = qp;
    memset(dv, 0, sizeof(*dv));
    dv->dbrec      = (__be32 *)qp->dbrec;
    dv->sq.buf     = qp->sq_buf;
    dv->sq.wqe_cnt = qp->sq_wqe_cnt;
    dv->sq.stride  = VQP_SW_BB;
    dv->rq.buf     = rq_buf;
    dv->rq.wqe_cnt = rq_cnt;
    dv->rq.stride  = rq_stride;
    dv->bf.reg     = qp->bf;
    dv->bf.size    = VQP_SW_BF_SIZE;
    dv->sqn        = qp->qpn;
    dv->rqn        = qp->qpn;
    *qp_p          = qp;
    *qpn_p         = qp->qpn;
    return UCS_OK;

err_free:
    free(qp->bf);
    free(qp);
    return UCS_ERR_NO_MEMORY;
}

ucs_status_t vqp_sw_qp_create(vqp_sw_dev_t *dev,
                              const vqp_sw_qp_init_attr_t *attr,
                              vqp_sw_qp_t **qp_p, struct mlx5dv_qp *dv,
                              uint32_t *qpn_p)
{
    return VQP_SW_LOCKED(
        vqp_sw_qp_create_type(dev, attr, VQP_SW_QPT_RC, qp_p, dv, qpn_p));
}

ucs_status_t vqp_sw_ud_qp_create(vqp_sw_dev_t *dev,
                                 const vqp_sw_qp_init_attr_t *attr,
                                 vqp_sw_qp_t **qp_p, struct mlx5dv_qp *dv,
                                 uint32_t *qpn_p)
{
    if (attr->srq != NULL) {
        ucs_error("vqp_sw %s: ud_qp_create: a UD QP on an SRQ is not "
                  "supported by the software device (own RQ only)",
                  dev->name);
        return UCS_ERR_UNSUPPORTED;
    }
    return VQP_SW_LOCKED(
        vqp_sw_qp_create_type(dev, attr, VQP_SW_QPT_UD, qp_p, dv, qpn_p));
}

static ucs_status_t vqp_sw_qp_destroy_locked(vqp_sw_qp_t *qp)
{
    vqp_sw_dev_t *dev;
    unsigned i;

    if (qp == NULL) {
        ucs_error("vqp_sw: qp_destroy(NULL)");
        return UCS_ERR_INVALID_PARAM;
    }
    dev = qp->dev;
    /* A NIC executes what was rung within microseconds of the doorbell,
     * long before a destroy command gets through; this engine only runs
     * when progressed. So WQEs rung before the destroy get their run now
     * (what a NIC does in practice: a process that sends and then closes
     * its endpoint at once expects the peer to get the data). Bounded: a
     * peer that does not take them (RNR, a full inbound ring, an error)
     * leaves the rest unexecuted, as a NIC may. In ERR this flushes, which
     * writes CQEs only. Not from inside the engine (it may be running
     * this QP). */
    if (vqp_sw_engine_enter()) {
        for (i = 0;
             (i < VQP_SW_DRAIN_RUNS) && (vqp_sw_qp_state(qp) == IBV_QPS_RTS) &&
             (vqp_sw_req_progress(qp) != 0);
             ++i) {
        }
        vqp_sw_engine_leave();
    }
    vqp_sw_lock(dev->shm);
    qp->shm->state = IBV_QPS_RESET;
    qp->shm->qpn   = 0;
    vqp_sw_unlock(dev->shm);
    i                         = qp->list_pos;
    dev->qp_list[i]           = dev->qp_list[--dev->n_qps];
    dev->scan[i]              = dev->scan[dev->n_qps];
    dev->qp_list[i]->list_pos = i;
    dev->qps[qp->index]       = NULL;
    vqp_sw_peer_put(dev, qp->peer);
    vqp_sw_arena_free(dev, (uint64_t)(qp->sq_buf - (uint8_t *)dev->shm),
                      qp->sq_pages);
    if (qp->rq_pages > 0) {
        vqp_sw_arena_free(dev, qp->shm->rq_off, qp->rq_pages);
    }
    --qp->send_cq->refs;
    --qp->recv_cq->refs;
    if (qp->srq != NULL) {
        --qp->srq->refs;
    }
    free(qp->bf);
    free(qp);
    return UCS_OK;
}

ucs_status_t vqp_sw_qp_destroy(vqp_sw_qp_t *qp)
{
    return VQP_SW_LOCKED(vqp_sw_qp_destroy_locked(qp));
}

enum ibv_qp_state vqp_sw_qp_state(const vqp_sw_qp_t *qp)
{
    return (enum ibv_qp_state)__atomic_load_n(&qp->shm->state,
                                              __ATOMIC_ACQUIRE);
}

/* The attributes peers read were stored before: they load the state with
 * acquire. Only ERR takes the segment's lock (peers stop consuming the RQ
 * at a known index); INIT, RTR, RTS and SQE change nothing a depositor
 * inside its critical section relies on, and a create or connect must not
 * wait behind a depositor that was descheduled holding the lock. */
static void vqp_sw_qp_set_state(vqp_sw_qp_t *qp, enum ibv_qp_state state)
{
    if (state != IBV_QPS_ERR) {
        __atomic_store_n(&qp->shm->state, state, __ATOMIC_RELEASE);
        return;
    }
    vqp_sw_lock(qp->dev->shm);
    qp->rq_flush_ci = (uint16_t)qp->shm->rq_ci; /* flush from here on */
    __atomic_store_n(&qp->shm->state, state, __ATOMIC_RELEASE);
    vqp_sw_unlock(qp->dev->shm);
    qp->dev->scan[qp->list_pos].idle |= VQP_SW_SCAN_ERR;
}

void vqp_sw_qp_set_sqe(vqp_sw_qp_t *qp)
{
    ucs_debug("vqp_sw %s: UD QP 0x%x -> SQE", qp->dev->name, qp->qpn);
    vqp_sw_qp_set_state(qp, IBV_QPS_SQE);
}

void vqp_sw_qp_set_error(vqp_sw_qp_t *qp)
{
    if (vqp_sw_qp_state(qp) != IBV_QPS_ERR) {
        ucs_debug("vqp_sw %s: QP 0x%x -> ERR", qp->dev->name, qp->qpn);
        vqp_sw_qp_set_state(qp, IBV_QPS_ERR);
    }
}

static void vqp_sw_qp_reset(vqp_sw_qp_t *qp)
{
    vqp_sw_lock(qp->dev->shm);
    qp->shm->rq_ci      = 0;
    qp->shm->remote_err = 0;
    qp->shm->dest_pid   = 0;
    qp->shm->dest_qpn   = 0;
    qp->shm->access     = 0;
    qp->shm->qkey       = 0;
    __atomic_store_n(&qp->shm->state, IBV_QPS_RESET, __ATOMIC_RELEASE);
    vqp_sw_unlock(qp->dev->shm);
    /* Software restarts its counters from 0 after RESET, as on mlx5. */
    qp->dbrec[0]    = 0;
    qp->dbrec[1]    = 0;
    qp->sq_ci       = 0;
    qp->rq_flush_ci = 0;
    qp->n_small     = 0;
    qp->stall       = VQP_SW_STALL_NONE;
    qp->stall_count = 0;
    qp->drawn_wqe   = UINT32_MAX;
    /* Idle again at doorbell 0, not flushing. */
    qp->dev->scan[qp->list_pos].idle = 0;
    vqp_sw_peer_put(qp->dev, qp->peer);
    qp->peer = NULL;
}

/* INIT, RTR, RTS of a UD QP: a qkey in INIT and nothing of a connection
 * (verbs refuses the RC attributes on UD, and a qkey with the high bit,
 * the controlled qkeys, needs privileges). */
static ucs_status_t vqp_sw_ud_modify(vqp_sw_qp_t *qp, enum ibv_qp_state cur,
                                     const vqp_sw_qp_attr_t *attr)
{
    vqp_sw_dev_t *dev            = qp->dev;
    const vqp_sw_dev_addr_t none = {};

    if ((attr->qp_access_flags != 0) || (attr->dest_qp_num != 0) ||
        memcmp(&attr->dest_dev, &none, sizeof(none)) ||
        (attr->min_rnr_timer != 0) || (attr->max_dest_rd_atomic != 0) ||
        (attr->timeout != 0) || (attr->retry_cnt != 0) ||
        (attr->rnr_retry != 0) || (attr->max_rd_atomic != 0)) {
        ucs_error("vqp_sw %s: UD QP 0x%x -> %s: access flags, destination, "
                  "timers and retry/read counts are RC attributes (must be "
                  "0 on UD)",
                  dev->name, qp->qpn, vqp_sw_state_str(attr->qp_state));
        return UCS_ERR_INVALID_PARAM;
    }
    if (attr->qp_state == IBV_QPS_INIT) {
        if (attr->qkey & 0x80000000u) {
            ucs_error("vqp_sw %s: UD QP 0x%x: qkey 0x%x has the high bit "
                      "(controlled qkey, privileged)",
                      dev->name, qp->qpn, attr->qkey);
            return UCS_ERR_INVALID_PARAM;
        }
        qp->shm->qkey = attr->qkey;
    } else if (attr->qkey != 0) {
        ucs_error("vqp_sw %s: UD QP 0x%x: the qkey is set in INIT, not in %s",
                  dev->name, qp->qpn, vqp_sw_state_str(attr->qp_state));
        return UCS_ERR_INVALID_PARAM;
    }
    if ((cur == IBV_QPS_SQE) && (attr->qp_state == IBV_QPS_RTS)) {
        ucs_debug("vqp_sw %s: UD QP 0x%x: SQE -> RTS", dev->name, qp->qpn);
    }
    vqp_sw_qp_set_state(qp, attr->qp_state);
    return UCS_OK;
}

static ucs_status_t vqp_sw_qp_modify_locked(vqp_sw_qp_t *qp,
                                            const vqp_sw_qp_attr_t *attr)
{
    const unsigned access_ok =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    enum ibv_qp_state cur = vqp_sw_qp_state(qp), next = attr->qp_state;
    vqp_sw_dev_t *dev = qp->dev;
    bool ok;

    switch (next) {
    case IBV_QPS_RESET:
    case IBV_QPS_ERR:
        ok = true;
        break;
    case IBV_QPS_INIT:
        ok = (cur == IBV_QPS_RESET) || (cur == IBV_QPS_INIT);
        break;
    case IBV_QPS_RTR:
        ok = (cur == IBV_QPS_INIT);
        break;
    case IBV_QPS_RTS:
        /* SQE -> RTS recovers a UD QP's send queue (not RC: IBA 10.3.1). */
        ok = (cur == IBV_QPS_RTR) || (cur == IBV_QPS_RTS) ||
             (qp->ud && (cur == IBV_QPS_SQE));
        break;
    default:
        ok = false;
        break;
    }
    if (!ok) {
        ucs_error("vqp_sw %s: QP 0x%x: invalid transition %s -> %s", dev->name,
                  qp->qpn, vqp_sw_state_str(cur), vqp_sw_state_str(next));
        return UCS_ERR_INVALID_PARAM;
    }
    if (qp->ud && (next != IBV_QPS_RESET) && (next != IBV_QPS_ERR)) {
        return vqp_sw_ud_modify(qp, cur, attr);
    }
    if (attr->qkey != 0) {
        ucs_error("vqp_sw %s: QP 0x%x: %s", dev->name, qp->qpn,
                  qp->ud ? "the qkey is set in INIT only"
                         : "a qkey is for UD QPs only");
        return UCS_ERR_INVALID_PARAM;
    }
    switch (next) {
    case IBV_QPS_RESET:
        vqp_sw_qp_reset(qp);
        return UCS_OK;
    case IBV_QPS_ERR:
        vqp_sw_qp_set_error(qp);
        return UCS_OK;
    case IBV_QPS_INIT:
        if (attr->qp_access_flags & ~access_ok) {
            ucs_error("vqp_sw %s: QP 0x%x: unsupported access flags 0x%x",
                      dev->name, qp->qpn, attr->qp_access_flags);
            return UCS_ERR_INVALID_PARAM;
        }
        qp->shm->access = attr->qp_access_flags;
        break;
    case IBV_QPS_RTR:
        if ((attr->min_rnr_timer > 31) || (attr->dest_qp_num == 0) ||
            (attr->dest_qp_num > 0xffffff)) {
            ucs_error("vqp_sw %s: QP 0x%x: RTR needs dest_qp_num in 1..2^24-1 "
                      "(got 0x%x) and min_rnr_timer <= 31 (got %u)",
                      dev->name, qp->qpn, attr->dest_qp_num,
                      attr->min_rnr_timer);
            return UCS_ERR_INVALID_PARAM;
        }
        qp->peer = vqp_sw_peer_get(dev, &attr->dest_dev);
        if (qp->peer == NULL) {
            return UCS_ERR_UNREACHABLE;
        }
        qp->min_rnr_timer      = attr->min_rnr_timer;
        qp->shm->dest_pid      = attr->dest_dev.pid;
        qp->shm->dest_instance = attr->dest_dev.instance;
        qp->shm->dest_qpn      = attr->dest_qp_num;
        break;
    case IBV_QPS_RTS:
        if ((attr->timeout > 31) || (attr->retry_cnt > 7) ||
            (attr->rnr_retry > 7)) {
            ucs_error("vqp_sw %s: QP 0x%x: RTS needs timeout <= 31 (got %u), "
                      "retry_cnt <= 7 (got %u), rnr_retry <= 7 (got %u)",
                      dev->name, qp->qpn, attr->timeout, attr->retry_cnt,
                      attr->rnr_retry);
            return UCS_ERR_INVALID_PARAM;
        }
        qp->timeout   = attr->timeout;
        qp->retry_cnt = attr->retry_cnt;
        qp->rnr_retry = attr->rnr_retry;
        break;
    default:
        break;
    }
    vqp_sw_qp_set_state(qp, next);
    return UCS_OK;
}

ucs_status_t vqp_sw_qp_modify(vqp_sw_qp_t *qp, const vqp_sw_qp_attr_t *attr)
{
    return VQP_SW_LOCKED(vqp_sw_qp_modify_locked(qp, attr));
}

static void vqp_sw_qp_counters_locked(const vqp_sw_qp_t *qp,
                                      vqp_sw_qp_counters_t *c)
{
    c->wqes          = qp->shm->wqes;
    c->bytes         = qp->shm->bytes;
    c->errors        = qp->shm->errors;
    c->rnr_retries   = qp->shm->rnr_retries;
    c->retries       = qp->shm->retries;
    c->flushed       = qp->shm->flushed;
    c->recv_msgs     = qp->shm->recv_msgs;
    c->ud_dropped    = qp->shm->ud_dropped;
    c->out_of_buffer = qp->shm->out_of_buffer;
}

void vqp_sw_qp_counters(const vqp_sw_qp_t *qp, vqp_sw_qp_counters_t *c)
{
    vqp_sw_dev_lock();
    vqp_sw_qp_counters_locked(qp, c);
    vqp_sw_dev_unlock();
}
