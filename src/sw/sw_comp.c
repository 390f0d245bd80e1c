/*
 * Software mlx5 device: CQE writing (owner bits, overflow, injected
 * reordering across QPs) and the flush of a QP in ERROR.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <string.h>

/* QPN of a CQE: same offset in mlx5_cqe64 and mlx5_err_cqe. */
static uint32_t vqp_sw_cqe_qpn(const struct mlx5_cqe64 *cqe)
{
    return be32toh(cqe->sop_drop_qpn) & 0xffffff;
}

static void vqp_sw_cq_overflow(vqp_sw_cq_t *cq)
{
    vqp_sw_dev_t *dev = cq->dev;
    unsigned i;

    ucs_error("vqp_sw %s: CQ %u overflow: producer %u caught the consumer "
              "index %u in dbrec[0] (%u entries); CQ in error, its QPs to ERR",
              dev->name, cq->index, cq->pi, be32toh(cq->dbrec[0]) & 0xffffff,
              cq->cqe_cnt);
    __atomic_store_n(&cq->overflow, true, __ATOMIC_RELAXED);
    for (i = 0; i < dev->n_qps; ++i) {
        if ((dev->qp_list[i]->send_cq == cq) ||
            (dev->qp_list[i]->recv_cq == cq)) {
            vqp_sw_qp_set_error(dev->qp_list[i]);
        }
    }
}

static void vqp_sw_cq_put(vqp_sw_cq_t *cq, const struct mlx5_cqe64 *src)
{
    struct mlx5_cqe64 *dst;
    uint32_t ci;
    uint8_t owner;

    if (cq->overflow) {
        return;
    }
    ci = be32toh(__atomic_load_n(&cq->dbrec[0], __ATOMIC_ACQUIRE)) & 0xffffff;
    if (((cq->pi - ci) & 0xffffff) >= cq->cqe_cnt) {
        vqp_sw_cq_overflow(cq);
        return;
    }
    dst   = &cq->buf[cq->pi & (cq->cqe_cnt - 1)];
    owner = (cq->pi >> cq->log_cnt) & 1;
    memcpy(dst, src, offsetof(struct mlx5_cqe64, op_own));
    /* op_own last: software polls it and then reads the rest. */
    __atomic_store_n(&dst->op_own, (uint8_t)((src->op_own & 0xfe) | owner),
                     __ATOMIC_RELEASE);
    ++cq->pi;
}

void vqp_sw_cq_release_held(vqp_sw_cq_t *cq)
{
    unsigned i, n = cq->n_held;

    cq->n_held = 0;
    for (i = 0; i < n; ++i) {
        vqp_sw_cq_put(cq, &cq->held[i]);
    }
}

/* Writes a CQE, or holds it back to let later CQEs of other QPs pass it.
 * CQEs of a QP with a held CQE are held too: order within a QP stays. */
static void vqp_sw_cq_emit(vqp_sw_cq_t *cq, const struct mlx5_cqe64 *cqe)
{
    vqp_sw_fault_t *f = &cq->dev->fault;
    uint32_t qpn;
    unsigned i;
    bool hold = false;

    if (f->reorder > 0) {
        qpn = vqp_sw_cqe_qpn(cqe);
        for (i = 0; (i < cq->n_held) && !hold; ++i) {
            hold = vqp_sw_cqe_qpn(&cq->held[i]) == qpn;
        }
        if (!hold) {
            hold = vqp_sw_fault_rand(f) < f->reorder;
        }
        if (hold) {
            if (cq->n_held == VQP_SW_REORDER_MAX) {
                vqp_sw_cq_release_held(cq);
            }
            cq->held[cq->n_held++] = *cqe;
            return;
        }
    }
    vqp_sw_cq_put(cq, cqe);
}

void vqp_sw_cqe_req(vqp_sw_qp_t *qp, uint16_t wqe_counter, uint8_t opcode,
                    uint32_t byte_cnt)
{
    struct mlx5_cqe64 cqe;

    memset(&cqe, 0, sizeof(cqe));
    cqe.byte_cnt     = htobe32(byte_cnt);
    cqe.sop_drop_qpn = htobe32(((uint32_t)opcode << 24) | qp->qpn);
    cqe.wqe_counter  = htobe16(wqe_counter);
    cqe.op_own       = MLX5_CQE_REQ << 4;
    vqp_sw_cq_emit(qp->send_cq, &cqe);
}

void vqp_sw_cqe_err(vqp_sw_qp_t *qp, vqp_sw_cq_t *cq, bool responder,
                    uint16_t wqe_counter, uint8_t opcode, uint8_t syndrome)
{
    struct mlx5_cqe64 cqe;
    struct mlx5_err_cqe *err = (void *)&cqe;

    memset(&cqe, 0, sizeof(cqe));
    err->syndrome         = syndrome;
    err->vendor_err_synd  = syndrome;
    err->s_wqe_opcode_qpn = htobe32(((uint32_t)opcode << 24) | qp->qpn);
    err->wqe_counter      = htobe16(wqe_counter);
    if (responder && (qp->srq != NULL)) {
        err->srqn = htobe32(qp->srq->index);
    }
    err->op_own = (responder ? MLX5_CQE_RESP_ERR : MLX5_CQE_REQ_ERR) << 4;
    if (syndrome == MLX5_CQE_SYNDROME_WR_FLUSH_ERR) {
        ++qp->shm->flushed;
    } else {
        ++qp->shm->errors;
    }
    vqp_sw_cq_emit(cq, &cqe);
}

void vqp_sw_cqe_resp(vqp_sw_qp_t *qp, const vqp_sw_shm_rec_t *rec)
{
    struct mlx5_cqe64 cqe;

    memset(&cqe, 0, sizeof(cqe));
    cqe.byte_cnt       = htobe32(rec->byte_cnt);
    cqe.imm_inval_pkey = rec->imm;
    cqe.sop_drop_qpn   = htobe32(qp->qpn);
    /* UD: GRH present (bits 29:28 = 1) and the sender's SL above it. */
    cqe.flags_rqpn =
        htobe32(((uint32_t)rec->ud_hdr << 24) | (rec->src_qpn & 0xffffff));
    cqe.wqe_counter = htobe16(rec->wqe_counter);
    if (qp->srq != NULL) {
        cqe.srqn_uidx = htobe32(qp->srq->index);
    }
    cqe.op_own = (uint8_t)(rec->opcode << 4);
    ++qp->shm->recv_msgs;
    vqp_sw_cq_emit(qp->recv_cq, &cqe);
}

/* Every SQ WQE still outstanding or posted later, and every posted RQ WQE,
 * completes with a flush error carrying its own wqe_counter, signaled or
 * not. */
unsigned vqp_sw_flush_qp(vqp_sw_qp_t *qp)
{
    const uint8_t *ctrl;
    uint16_t pi, rpi;
    unsigned n = 0, ds, nbb, walked = 0;

    pi = (uint16_t)be32toh(
        __atomic_load_n(&qp->dbrec[MLX5_SND_DBR], __ATOMIC_ACQUIRE));
    while ((qp->sq_ci != pi) && (walked < qp->sq_wqe_cnt)) {
        ctrl =
            qp->sq_buf + (size_t)(qp->sq_ci & (qp->sq_wqe_cnt - 1)) * VQP_SW_BB;
        ds  = ctrl[7] & 0x3f;
        nbb = (ds * 16 + VQP_SW_BB - 1) / VQP_SW_BB;
        if ((nbb == 0) || (nbb > (uint16_t)(pi - qp->sq_ci))) {
            nbb = 1; /* malformed: step one BB so the flush ends */
        }
        vqp_sw_cqe_err(qp, qp->send_cq, false, qp->sq_ci, ctrl[3],
                       MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
        qp->sq_ci += nbb;
        walked += nbb;
        ++n;
    }
    if (walked >= qp->sq_wqe_cnt) {
        qp->sq_ci = pi; /* overflowed ring: nothing meaningful is left */
    }
    /* SQE: the RQ keeps receiving. */
    if ((qp->srq == NULL) && (qp->shm->rq_wqe_cnt > 0) &&
        (vqp_sw_qp_state(qp) != IBV_QPS_SQE)) {
        rpi = (uint16_t)be32toh(
            __atomic_load_n(&qp->dbrec[MLX5_RCV_DBR], __ATOMIC_ACQUIRE));
        walked = 0;
        while ((qp->rq_flush_ci != rpi) && (walked++ < qp->shm->rq_wqe_cnt)) {
            vqp_sw_cqe_err(qp, qp->recv_cq, true, qp->rq_flush_ci, 0,
                           MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
            ++qp->rq_flush_ci;
            ++n;
        }
        if (walked > qp->shm->rq_wqe_cnt) {
            qp->rq_flush_ci = rpi;
        }
    }
    return n;
}
