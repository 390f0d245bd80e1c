/*
 * Receive side of a virtual QP: the user's receives (buffers for SENDs on the
 * send QP, notification slots for WRITE_IMMs), the receives the core keeps
 * posted on its own QPs (DQPLB data QPs, the SPRAY notify QP), the DQPLB
 * reorder window, and matching arrived notifications with notification slots.
 */
#include <config.h>

#include "vqp_int.h"

#include <ucs/debug/log.h>
#include <ucs/sys/math.h>

/* The receive slot array holds one 4-byte slot per RQ entry of each QP the
 * core receives on, from the QP's slot_base on. */
static UCS_F_ALWAYS_INLINE uint32_t *vqp_slot(vqp_pqp_t *pqp, uint16_t index)
{
    return &pqp->vqp->slots[pqp->slot_base + (index & pqp->rx.mask)];
}

/* Receives posted and not completed (the RQ counters are 16 bits). */
static UCS_F_ALWAYS_INLINE unsigned vqp_rx_posted(const vqp_pqp_t *pqp)
{
    return (uint16_t)(pqp->rx.head - pqp->rx.tail);
}

static UCS_F_ALWAYS_INLINE int vqp_core_receives(const vqp_pqp_t *pqp)
{
    return pqp->rx_cap != 0;
}

/* Keep the core's own receives posted, unless notifications pile up that
 * nobody has a slot for: then the peer waits (RNR) instead of us dropping. */
ucs_status_t vqp_recv_fill(vqp_pqp_t *pqp)
{
    vqp_t *vqp = pqp->vqp;
    vqp_mlx5_sge_t sge;
    unsigned posted = 0;
    int ret;

    if (!pqp->alive || !vqp_core_receives(pqp) || !vqp->connected) {
        return UCS_OK;
    }
    while ((vqp_rx_posted(pqp) < pqp->rx_cap) &&
           (VQP_RING_COUNT(vqp->arrived_head, vqp->arrived_tail) <
            vqp->max_recvs)) {
        sge.addr   = (uintptr_t)vqp_slot(pqp, pqp->rx.head);
        sge.length = sizeof(uint32_t);
        sge.lkey   = vqp->slot_lkey[pqp->dev];
        ret        = vqp_mlx5_rxwq_post(&pqp->rx, &sge,
                                 (pqp->role == VQP_ROLE_DATA) ? 1 : 0);
        if (ret < 0) {
            ucs_error("vqp %p: QP 0x%x: posting a receive failed: %s", vqp,
                      pqp->qpn, ucs_status_string((ucs_status_t)ret));
            return (ucs_status_t)ret;
        }
        ++posted;
    }
    if (vqp_rx_posted(pqp) < pqp->rx_cap) {
        vqp->rx_starved = 1; /* notifications wait for the user's slots */
    }
    if (posted != 0) {
        vqp_mlx5_rxwq_ring(&pqp->rx);
    }
    return UCS_OK;
}

void vqp_recv_replenish(vqp_t *vqp)
{
    unsigned i;

    vqp->rx_starved = 0;
    for (i = 0; i < vqp->num_pqps; ++i) {
        vqp_recv_fill(&vqp->qps[i]);
    }
}

static void vqp_deliver_recv(vqp_t *vqp, uint64_t wr_id, ucs_status_t status,
                             vqp_opcode_t opcode, unsigned flags, uint32_t imm,
                             uint64_t byte_len)
{
    vqp_wc_t wc = {.wr_id    = wr_id,
                   .status   = status,
                   .opcode   = opcode,
                   .flags    = flags,
                   .imm      = imm,
                   .byte_len = byte_len,
                   .vqp      = vqp};

    if (opcode == VQP_OP_RECV_NOTIFY) {
        ++vqp->stats.notifies_received;
    }
    vqp_deliver(vqp, &wc);
}

/* Give arrived notifications to the user's notification slots, in order. */
static void vqp_match_notifies(vqp_t *vqp)
{
    uint32_t a;

    while ((vqp->arrived_head != vqp->arrived_tail) &&
           (vqp->nrecv_head != vqp->nrecv_tail)) {
        a = vqp->arrived_head++ & vqp->arrived_mask;
        vqp_deliver_recv(
            vqp, vqp->nrecv_wr_id[vqp->nrecv_head++ & vqp->nrecv_mask],
            vqp->arrived_failed[a] ? UCS_ERR_IO_ERROR : UCS_OK,
            VQP_OP_RECV_NOTIFY, VQP_WC_WITH_IMM, vqp->arrived_imm[a], 0);
    }
}

static void vqp_push_arrived(vqp_t *vqp, uint32_t imm, int failed)
{
    uint32_t a = vqp->arrived_tail++ & vqp->arrived_mask;

    vqp->arrived_imm[a]    = imm;
    vqp->arrived_failed[a] = failed;
}

/* DQPLB: record sequence number @a seq; deliver every operation whose
 * numbers are now all in. Old and repeated numbers (a replayed fragment that
 * had arrived after all) are dropped; a number beyond the window means the
 * peer broke the protocol, which is reported, not absorbed. */
void vqp_win_insert(vqp_t *vqp, uint32_t seq, uint8_t bits, uint32_t imm)
{
    uint32_t dist = (seq - vqp->win_next) & VQP_DQPLB_SEQ_MASK;
    uint8_t *state;

    if ((dist >= (VQP_DQPLB_SEQ_MASK + 1) / 2) ||
        (vqp->win_state[seq & vqp->win_mask] & VQP_WIN_ARRIVED)) {
        ++vqp->stats.dqplb_duplicates;
        ucs_debug("vqp %p: duplicate sequence number %u dropped", vqp, seq);
        return;
    }
    if (dist > vqp->win_mask) {
        ucs_error("vqp %p: sequence number %u is %u ahead of %u, beyond the"
                  " reorder window of %u: dropped, its operation fails",
                  vqp, seq, dist, vqp->win_next, vqp->win_mask + 1);
        ++vqp->stats.dqplb_duplicates;
        vqp->win_aborted = 1;
        return;
    }

    vqp->win_state[seq & vqp->win_mask] = VQP_WIN_ARRIVED | bits;
    if (bits & VQP_WIN_END) {
        vqp->win_imm[seq & vqp->win_mask] = imm;
    }

    for (;;) {
        state = &vqp->win_state[vqp->win_next & vqp->win_mask];
        if (!(*state & VQP_WIN_ARRIVED)) {
            break;
        }
        if (*state & VQP_WIN_ABORT) {
            vqp->win_aborted = 1;
        }
        if (*state & VQP_WIN_END) {
            vqp_push_arrived(vqp, vqp->win_imm[vqp->win_next & vqp->win_mask],
                             vqp->win_aborted);
            vqp->win_aborted = 0;
        }
        *state        = VQP_WIN_EMPTY;
        vqp->win_next = (vqp->win_next + 1) & VQP_DQPLB_SEQ_MASK;
    }
    vqp_match_notifies(vqp);
}

static void vqp_user_recv_cqe(vqp_pqp_t *pqp, struct mlx5_cqe64 *cqe,
                              ucs_status_t status)
{
    uint16_t index = vqp_mlx5_cqe_wqe_counter(cqe);
    uint8_t opcode = vqp_mlx5_cqe_opcode(cqe);
    vqp_t *vqp     = pqp->vqp;
    unsigned flags = 0;

    if ((uint16_t)(index - pqp->rx.tail) >=
        (uint16_t)(pqp->rx.head - pqp->rx.tail)) {
        /* Already completed (canceled at teardown). */
        return;
    }
    vqp_mlx5_rxwq_complete(&pqp->rx, index);
    if (status != UCS_OK) {
        vqp_deliver_recv(vqp, pqp->rx_wr_id[index & pqp->rx.mask], status,
                         VQP_OP_RECV, 0, 0, 0);
        return;
    }
    if ((opcode == MLX5_CQE_RESP_SEND_IMM) ||
        (opcode == MLX5_CQE_RESP_WR_IMM)) {
        flags = VQP_WC_WITH_IMM;
    }
    /* A WRITE_IMM put nothing into the buffer (its byte count is the
     * WRITE's): 0, as a notification reports everywhere else. */
    vqp_deliver_recv(
        vqp, pqp->rx_wr_id[index & pqp->rx.mask], UCS_OK,
        (opcode == MLX5_CQE_RESP_WR_IMM) ? VQP_OP_RECV_NOTIFY : VQP_OP_RECV,
        flags, be32toh(vqp_mlx5_cqe_imm(cqe)),
        (opcode == MLX5_CQE_RESP_WR_IMM) ? 0 : vqp_mlx5_cqe_byte_cnt(cqe));
}

void vqp_srq_recv_cqe(vqp_pqp_t *pqp, struct mlx5_cqe64 *cqe,
                      ucs_status_t status)
{
    vqp_srq_t *srq = pqp->srq;
    uint16_t index = vqp_mlx5_cqe_wqe_counter(cqe) & srq->mlx.mask;
    uint8_t opcode = vqp_mlx5_cqe_opcode(cqe);
    unsigned flags = 0;

    if (!srq->busy[index]) {
        ucs_error("vqp %p: QP 0x%x: completion of SRQ entry %u that was not"
                  " posted: dropped",
                  pqp->vqp, pqp->qpn, index);
        return;
    }
    srq->busy[index] = 0;
    --srq->posted;
    vqp_mlx5_srq_free(&srq->mlx, index);
    if (status != UCS_OK) {
        vqp_deliver_recv(pqp->vqp, srq->wr_id[index], status, VQP_OP_RECV, 0, 0,
                         0);
        return;
    }
    if ((opcode == MLX5_CQE_RESP_SEND_IMM) ||
        (opcode == MLX5_CQE_RESP_WR_IMM)) {
        flags = VQP_WC_WITH_IMM;
    }
    vqp_deliver_recv(
        pqp->vqp, srq->wr_id[index], UCS_OK,
        (opcode == MLX5_CQE_RESP_WR_IMM) ? VQP_OP_RECV_NOTIFY : VQP_OP_RECV,
        flags, be32toh(vqp_mlx5_cqe_imm(cqe)),
        (opcode == MLX5_CQE_RESP_WR_IMM) ? 0 : vqp_mlx5_cqe_byte_cnt(cqe));
}

void vqp_recv_cqe(vqp_pqp_t *pqp, struct mlx5_cqe64 *cqe, ucs_status_t status)
{
    uint8_t opcode = vqp_mlx5_cqe_opcode(cqe);
    vqp_t *vqp     = pqp->vqp;
    uint16_t index;
    uint32_t word, imm;

    if (pqp->srq != NULL) {
        vqp_srq_recv_cqe(pqp, cqe, status);
        return;
    }
    if (!vqp_core_receives(pqp)) {
        vqp_user_recv_cqe(pqp, cqe, status);
        return;
    }

    if (status != UCS_OK) {
        /* Our own receive flushed or failed: nothing of the user's is lost
         * here; the QP is gone for receiving too. */
        ucs_debug("vqp %p: QP 0x%x receive completed with %s", vqp, pqp->qpn,
                  ucs_status_string(status));
        return;
    }

    index = vqp_mlx5_cqe_wqe_counter(cqe);
    imm   = be32toh(vqp_mlx5_cqe_imm(cqe));
    vqp_mlx5_rxwq_complete(&pqp->rx, index);

    if (pqp->role == VQP_ROLE_NOTIFY) {
        vqp_push_arrived(vqp, imm, 0); /* SPRAY: in order on one QP */
    } else if (opcode == MLX5_CQE_RESP_SEND_IMM) {
        word = be32toh(*vqp_slot(pqp, index));
        if (!(word & VQP_DQPLB_LAST)) {
            ucs_error("vqp %p: QP 0x%x: DQPLB final message without its"
                      " flag (0x%x): dropped",
                      vqp, pqp->qpn, word);
        } else {
            vqp_win_insert(vqp, word & VQP_DQPLB_SEQ_MASK, VQP_WIN_END, imm);
        }
    } else if (opcode == MLX5_CQE_RESP_WR_IMM) {
        vqp_win_insert(vqp, imm & VQP_DQPLB_SEQ_MASK,
                       ((imm & VQP_DQPLB_ABORT) ? VQP_WIN_ABORT : 0) |
                           ((imm & VQP_DQPLB_END) ? VQP_WIN_END : 0),
                       0);
    } else {
        ucs_error("vqp %p: QP 0x%x: unexpected SEND of %u bytes on a"
                  " notification QP: dropped",
                  vqp, pqp->qpn, vqp_mlx5_cqe_byte_cnt(cqe));
    }

    vqp_match_notifies(vqp);
    vqp_recv_fill(pqp);
}

ucs_status_t vqp_post_recv(vqp_t *vqp, const vqp_recv_wr_t *wr)
{
    vqp_pqp_t *pqp = vqp->send_qp;
    vqp_mlx5_sge_t sge;
    int ret;

    if (vqp->max_recvs == 0) {
        ucs_error("vqp %p: created with max_recvs 0: it takes no receives"
                  "%s",
                  vqp,
                  (vqp->send_qp->srq != NULL) ? " (SENDs go to its SRQ)" : "");
        return UCS_ERR_UNSUPPORTED;
    }
    if ((wr->length == 0) && (vqp->num_qps > 1)) {
        if (VQP_RING_COUNT(vqp->nrecv_head, vqp->nrecv_tail) +
                vqp->wc_pending_recvs >=
            vqp->max_recvs) {
            return UCS_ERR_NO_RESOURCE;
        }
        vqp->nrecv_wr_id[vqp->nrecv_tail++ & vqp->nrecv_mask] = wr->wr_id;
        vqp_match_notifies(vqp);
        /* Slots freed: QPs that stopped receiving may go on. */
        if (vqp->rx_starved) {
            vqp_recv_replenish(vqp);
        }
        return UCS_OK;
    }

    if (pqp->srq != NULL) {
        ucs_error("vqp %p: receives of a virtual QP on a shared receive queue"
                  " go to the SRQ (vqp_srq_post_recv)%s",
                  vqp,
                  (wr->length == 0) ? "; with one QP so do notifications" : "");
        return UCS_ERR_UNSUPPORTED;
    }
    if (wr->length > UINT32_MAX) {
        ucs_error("vqp %p: receive of %lu bytes: at most 4 GiB - 1", vqp,
                  wr->length);
        return UCS_ERR_INVALID_PARAM;
    }
    if (!pqp->alive) {
        return pqp->error;
    }
    if (vqp_rx_posted(pqp) + vqp->wc_pending_recvs >= vqp->max_recvs) {
        return UCS_ERR_NO_RESOURCE;
    }
    sge.addr   = wr->addr;
    sge.length = wr->length;
    sge.lkey   = wr->lkey[pqp->dev];
    ret        = vqp_mlx5_rxwq_post(&pqp->rx, &sge, 1);
    if (ret < 0) {
        return (ucs_status_t)ret;
    }
    pqp->rx_wr_id[ret & pqp->rx.mask] = wr->wr_id;
    vqp_mlx5_rxwq_ring(&pqp->rx);
    return UCS_OK;
}

void vqp_recv_cancel_notifies(vqp_t *vqp, ucs_status_t status)
{
    while (vqp->nrecv_head != vqp->nrecv_tail) {
        vqp_deliver_recv(vqp,
                         vqp->nrecv_wr_id[vqp->nrecv_head++ & vqp->nrecv_mask],
                         status, VQP_OP_RECV_NOTIFY, 0, 0, 0);
    }
}

void vqp_recv_cancel_all(vqp_t *vqp)
{
    vqp_pqp_t *pqp = vqp->send_qp;

    vqp_recv_cancel_notifies(vqp, UCS_ERR_CANCELED);
    if (pqp->srq != NULL) {
        return; /* the SRQ's buffers stay with the SRQ */
    }
    while (pqp->rx.tail != pqp->rx.head) {
        vqp_deliver_recv(vqp, pqp->rx_wr_id[pqp->rx.tail++ & pqp->rx.mask],
                         UCS_ERR_CANCELED, VQP_OP_RECV, 0, 0, 0);
    }
}
