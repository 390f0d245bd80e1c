/*
 * Software mlx5 device: the responder. A requester delivering SEND,
 * SEND_IMM or RDMA_WRITE_IMM takes the target QP's RQ/SRQ WQE itself,
 * places the data, and publishes a completion record into the target
 * device's inbound ring; the target's own engine turns records into its
 * responder CQEs, so only the owner ever writes a CQ.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>
#include <ucs/sys/math.h>

#include <errno.h>
#include <signal.h>
#include <string.h>

/* The target QP if it is alive, RC and connected back to @a qp, else NULL
 * (a real responder would drop the packets: the requester times out). */
vqp_sw_shm_qp_t *vqp_sw_peer_qp(vqp_sw_qp_t *qp)
{
    vqp_sw_shm_qp_t *tqp;
    uint32_t dest_qpn = qp->shm->dest_qpn, state;

    if ((qp->peer == NULL) || qp->peer->dead ||
        !__atomic_load_n(&qp->peer->shm->alive, __ATOMIC_ACQUIRE)) {
        return NULL;
    }
    tqp   = &qp->peer->shm->qp[dest_qpn & (VQP_SW_MAX_QP - 1)];
    state = __atomic_load_n(&tqp->state, __ATOMIC_ACQUIRE);
    if ((tqp->qpn != dest_qpn) || (tqp->type != VQP_SW_QPT_RC) ||
        ((state != IBV_QPS_RTR) && (state != IBV_QPS_RTS)) ||
        (tqp->dest_pid != qp->dev->pid) ||
        (tqp->dest_instance != qp->dev->instance) ||
        (tqp->dest_qpn != qp->qpn)) {
        return NULL;
    }
    return tqp;
}

void vqp_sw_peer_remote_err(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                            uint32_t synd)
{
    __atomic_store_n(&tqp->remote_err, synd, __ATOMIC_RELEASE);
    __atomic_fetch_add(&qp->peer->shm->err_gen, 1, __ATOMIC_RELEASE);
    vqp_sw_peer_wake(qp->dev, qp->peer);
}

void vqp_sw_resp_prefetch(vqp_sw_qp_t *qp)
{
    const vqp_sw_shm_srq_t *srq;
    const vqp_sw_shm_qp_t *tqp;
    vqp_sw_shm_t *pshm;
    uint64_t off;
    unsigned t, s;

    if ((qp->peer == NULL) || qp->peer->dead) {
        return;
    }
    /* Unlocked reads of fields that may change: only addresses to touch
     * early, kept inside the mapping; the locked path decides. */
    pshm = qp->peer->shm;
    t    = qp->shm->dest_qpn & (VQP_SW_MAX_QP - 1);
    tqp  = &pshm->qp[t];
    s    = tqp->srq_index;
    __builtin_prefetch(&pshm->in[pshm->in_head & (VQP_SW_INBOUND - 1)], 1);
    if (s == VQP_SW_NO_SRQ) {
        __builtin_prefetch(&pshm->qp_dbrec[t][MLX5_RCV_DBR]);
        off = tqp->rq_off +
              (uint64_t)(tqp->rq_ci & (tqp->rq_wqe_cnt - 1)) * tqp->rq_stride;
    } else if (s < VQP_SW_MAX_SRQ) {
        srq = &pshm->srq[s];
        __builtin_prefetch(&pshm->srq_dbrec[s][0]);
        off = srq->buf_off +
              (uint64_t)(srq->hw_head & (srq->wqe_cnt - 1)) * srq->stride;
    } else {
        return;
    }
    if (off < qp->peer->size) {
        __builtin_prefetch((uint8_t *)pshm + off);
    }
}

/* The receive WQE @a k places after the next one the target's queue hands
 * out (k = 0: the next). For an SRQ, @a cursor follows the linked list: set
 * here for k = 0, advanced by the caller with vqp_sw_resp_srq_next(). */
vqp_sw_resp_status_t vqp_sw_resp_take_wqe(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                                          unsigned k, uint32_t *cursor,
                                          const struct mlx5_wqe_data_seg **segs,
                                          unsigned *n_segs,
                                          uint16_t *wqe_counter)
{
    vqp_sw_shm_t *pshm = qp->peer->shm;
    unsigned tidx      = tqp->qpn & (VQP_SW_MAX_QP - 1);
    vqp_sw_shm_srq_t *srq;
    uint16_t pi, avail;
    uint8_t *wqe;

    if (tqp->srq_index == VQP_SW_NO_SRQ) {
        if (tqp->rq_wqe_cnt == 0) {
            return VQP_SW_RESP_RNR;
        }
        /* The geometry comes from another process: never trust it to stay
         * inside the mapping. */
        if (tqp->rq_off + (uint64_t)tqp->rq_wqe_cnt * tqp->rq_stride >
            qp->peer->size) {
            ucs_error("vqp_sw %s: peer QP 0x%x: RQ outside its segment",
                      qp->dev->name, tqp->qpn);
            return VQP_SW_RESP_REM_OP;
        }
        pi    = (uint16_t)be32toh(__atomic_load_n(
               &pshm->qp_dbrec[tidx][MLX5_RCV_DBR], __ATOMIC_ACQUIRE));
        avail = (uint16_t)(pi - tqp->rq_ci);
        if (avail > tqp->rq_wqe_cnt) {
            ucs_error("vqp_sw %s: peer QP 0x%x: RQ overflow: producer %u is "
                      "%u ahead of consumer (ring of %u)",
                      qp->dev->name, tqp->qpn, pi, avail, tqp->rq_wqe_cnt);
            vqp_sw_peer_remote_err(qp, tqp, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
            return VQP_SW_RESP_REM_OP;
        }
        if (avail <= k) {
            return VQP_SW_RESP_RNR;
        }
        wqe =
            (uint8_t *)pshm + tqp->rq_off +
            (size_t)((tqp->rq_ci + k) & (tqp->rq_wqe_cnt - 1)) * tqp->rq_stride;
        *segs        = (const void *)wqe;
        *n_segs      = ucs_min(tqp->rq_max_sge, VQP_SW_MAX_SGE);
        *wqe_counter = (uint16_t)(tqp->rq_ci + k);
        return VQP_SW_RESP_OK;
    }
    if (tqp->srq_index >= VQP_SW_MAX_SRQ) {
        ucs_error("vqp_sw %s: peer QP 0x%x: SRQ index %u out of range",
                  qp->dev->name, tqp->qpn, tqp->srq_index);
        return VQP_SW_RESP_REM_OP;
    }
    srq = &pshm->srq[tqp->srq_index];
    if (!srq->used || (srq->buf_off + (uint64_t)srq->wqe_cnt * srq->stride >
                       qp->peer->size)) {
        ucs_error("vqp_sw %s: peer QP 0x%x: SRQ %u unused or outside its "
                  "segment",
                  qp->dev->name, tqp->qpn, tqp->srq_index);
        return VQP_SW_RESP_REM_OP;
    }
    pi = (uint16_t)be32toh(
        __atomic_load_n(&pshm->srq_dbrec[tqp->srq_index][0], __ATOMIC_ACQUIRE));
    avail = (uint16_t)(pi - srq->consumed);
    /* One entry is the list's spare: at most wqe_cnt - 1 can be posted. */
    if (avail >= srq->wqe_cnt) {
        ucs_error("vqp_sw %s: peer SRQ %u: overflow: counter %u is %u ahead "
                  "(%u usable entries)",
                  qp->dev->name, tqp->srq_index, pi, avail, srq->wqe_cnt - 1);
        vqp_sw_peer_remote_err(qp, tqp, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
        return VQP_SW_RESP_REM_OP;
    }
    if (avail <= k) {
        return VQP_SW_RESP_RNR;
    }
    if (k == 0) {
        *cursor = srq->hw_head & (srq->wqe_cnt - 1);
    }
    wqe     = (uint8_t *)pshm + srq->buf_off + (size_t)*cursor * srq->stride;
    *segs   = (const void *)(wqe + sizeof(struct mlx5_wqe_srq_next_seg));
    *n_segs = ucs_min(srq->max_sge, VQP_SW_MAX_SGE);
    *wqe_counter = (uint16_t)*cursor;
    return VQP_SW_RESP_OK;
}

/* The SRQ entry after @a entry in the target's linked list. */
static uint32_t vqp_sw_resp_srq_next(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                                     uint32_t entry)
{
    vqp_sw_shm_srq_t *srq = &qp->peer->shm->srq[tqp->srq_index];
    const struct mlx5_wqe_srq_next_seg *next =
        (const void *)((uint8_t *)qp->peer->shm + srq->buf_off +
                       (size_t)entry * srq->stride);

    return be16toh(next->next_wqe_index) & (srq->wqe_cnt - 1);
}

uint8_t vqp_sw_scatter_resolve(const vqp_sw_shm_t *shm,
                               const struct mlx5_wqe_data_seg *segs,
                               unsigned n_segs, uint64_t len,
                               struct iovec *riov, unsigned *nr_p,
                               unsigned *bad_p, const char **why_p,
                               uint64_t *cap_p)
{
    uint64_t cap = 0, left = len;
    const char *why;
    uint32_t bc, lkey;
    unsigned i, nr = 0;

    for (i = 0; i < n_segs; ++i) {
        lkey = be32toh(segs[i].lkey);
        if (lkey == MLX5_INVALID_LKEY) {
            break;
        }
        bc               = be32toh(segs[i].byte_count);
        riov[i].iov_base = (void *)(uintptr_t)be64toh(segs[i].addr);
        riov[i].iov_len  = bc ? bc : 0x80000000u;
        why = vqp_sw_mr_check(shm, lkey, be64toh(segs[i].addr), riov[i].iov_len,
                              IBV_ACCESS_LOCAL_WRITE);
        if (why != NULL) {
            *bad_p = i;
            *why_p = why;
            return MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
        }
        cap += riov[i].iov_len;
        if (left > 0) {
            if (riov[i].iov_len > left) {
                riov[i].iov_len = left;
            }
            left -= riov[i].iov_len;
            nr = i + 1;
        }
    }
    *cap_p = cap;
    if (cap < len) {
        return MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR;
    }
    *nr_p = nr;
    return 0;
}

/* Remote iovecs for a @a len-byte message from a receive WQE's scatter list
 * (ends at MLX5_INVALID_LKEY or max_sge entries). Returns 0, or the
 * receiver's syndrome: 0x04 for a bad entry, 0x01 if the message does not
 * fit. Logs only if @a log (a merged run retries the WQE alone, which
 * logs). */
static uint8_t vqp_sw_resp_scatter(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                                   const struct mlx5_wqe_data_seg *segs,
                                   unsigned n_segs, uint64_t len,
                                   uint16_t wqe_counter, struct iovec *riov,
                                   unsigned *nr_p, bool log)
{
    const char *why = NULL;
    unsigned bad    = 0;
    uint64_t cap    = 0;
    uint8_t synd;

    synd = vqp_sw_scatter_resolve(qp->peer->shm, segs, n_segs, len, riov, nr_p,
                                  &bad, &why, &cap);
    if ((synd == MLX5_CQE_SYNDROME_LOCAL_PROT_ERR) && log) {
        ucs_error("vqp_sw %s: QP 0x%x WQE %u: receive WQE %u of peer "
                  "QP 0x%x, segment %u lkey 0x%x: %s",
                  qp->dev->name, qp->qpn, qp->sq_ci, wqe_counter, tqp->qpn, bad,
                  be32toh(segs[bad].lkey), why);
    } else if ((synd == MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR) && log) {
        ucs_error("vqp_sw %s: QP 0x%x WQE %u: %lu-byte message does not "
                  "fit receive WQE %u (%lu bytes) of peer QP 0x%x",
                  qp->dev->name, qp->qpn, qp->sq_ci, len, wqe_counter, cap,
                  tqp->qpn);
    }
    return synd;
}

/* Bounding range [*lo, *hi) of @a n iovecs (empty: *lo == *hi). */
static void vqp_sw_iov_box(const struct iovec *iov, unsigned n, uint64_t *lo,
                           uint64_t *hi)
{
    uint64_t a;
    unsigned i;

    *lo = UINT64_MAX;
    *hi = 0;
    for (i = 0; i < n; ++i) {
        a   = (uintptr_t)iov[i].iov_base;
        *lo = ucs_min(*lo, a);
        *hi = ucs_max(*hi, a + iov[i].iov_len);
    }
    if (*hi == 0) {
        *lo = 0;
    }
}

static bool vqp_sw_box_overlap(uint64_t lo1, uint64_t hi1, uint64_t lo2,
                               uint64_t hi2)
{
    return (lo1 < hi1) && (lo2 < hi2) && (lo1 < hi2) && (lo2 < hi1);
}

unsigned vqp_sw_ring_room(vqp_sw_peer_t *peer, unsigned want)
{
    vqp_sw_shm_t *pshm = peer->shm;
    uint64_t used      = pshm->in_head - peer->in_tail_seen;

    if (used + want > VQP_SW_INBOUND) {
        peer->in_tail_seen = __atomic_load_n(&pshm->in_tail, __ATOMIC_ACQUIRE);
        used               = pshm->in_head - peer->in_tail_seen;
    }
    /* A tail past the head is a corrupt segment: take the ring as full. */
    return (used > VQP_SW_INBOUND) ? 0 : VQP_SW_INBOUND - (unsigned)used;
}

/* The staging ring's head after a @a len-byte payload taken at @a head:
 * payloads start aligned and never wrap (one that would starts at the
 * ring's beginning; the gap is freed with it). */
static uint64_t vqp_sw_stage_next(uint64_t head, uint64_t len)
{
    uint64_t alen = ucs_align_up_pow2(len, VQP_SW_STAGE_ALIGN);
    uint64_t pos  = head & (VQP_SW_STAGE_SIZE - 1);

    if (pos + alen > VQP_SW_STAGE_SIZE) {
        head += VQP_SW_STAGE_SIZE - pos;
    }
    return head + alen;
}

/* True if @a peer's staging ring (its lock held) has room up to @a end:
 * as vqp_sw_ring_room, its tail is read only when the last one seen says
 * no. A tail past the head (a corrupt segment) gives no room. */
static bool vqp_sw_stage_fits(vqp_sw_peer_t *peer, uint64_t end)
{
    if (end - peer->stage_tail_seen > VQP_SW_STAGE_SIZE) {
        peer->stage_tail_seen =
            __atomic_load_n(&peer->shm->stage_tail, __ATOMIC_ACQUIRE);
    }
    return end - peer->stage_tail_seen <= VQP_SW_STAGE_SIZE;
}

/* Where a SEND payload travels to the target (vqp_sw_payload_route): any
 * other value is the staging ring's head after it. */
#define VQP_SW_ROUTE_XFER   0u /* the requester's process_vm_writev */
#define VQP_SW_ROUTE_RECORD 1u /* inside the record */

/* The route of a @a len-byte payload with the staging ring taken up to
 * @a head. */
static uint64_t vqp_sw_payload_route(vqp_sw_peer_t *peer, uint64_t head,
                                     uint64_t len)
{
    uint64_t end;

    if (len <= VQP_SW_SMALL_SEND) {
        return VQP_SW_ROUTE_RECORD;
    }
    if (len > VQP_SW_STAGE_SEND) {
        return VQP_SW_ROUTE_XFER;
    }
    end = vqp_sw_stage_next(head, len);
    return vqp_sw_stage_fits(peer, end) ? end : VQP_SW_ROUTE_XFER;
}

/* Forgets the small SENDs the target has placed (its ring tail passed
 * their records): with @a fresh its current tail, else the last one seen
 * (no access to the owner's line). */
static void vqp_sw_small_prune(vqp_sw_qp_t *qp, bool fresh)
{
    uint64_t tail;
    unsigned i = 0;

    if (fresh) {
        qp->peer->in_tail_seen =
            __atomic_load_n(&qp->peer->shm->in_tail, __ATOMIC_ACQUIRE);
    }
    tail = qp->peer->in_tail_seen;
    while ((i < qp->n_small) && ((int64_t)(tail - qp->small[i].seq) >= 0)) {
        ++i;
    }
    if (i > 0) {
        qp->n_small -= i;
        memmove(qp->small, qp->small + i, qp->n_small * sizeof(qp->small[0]));
    }
}

bool vqp_sw_small_conflict(vqp_sw_qp_t *qp, uint64_t addr, uint64_t len)
{
    unsigned i;

    if (qp->n_small == 0) {
        return false;
    }
    if ((qp->peer == NULL) || qp->peer->dead) {
        /* Nothing will ever be placed: let the operation fail its way. */
        qp->n_small = 0;
        return false;
    }
    vqp_sw_small_prune(qp, true);
    for (i = 0; i < qp->n_small; ++i) {
        if (vqp_sw_box_overlap(addr, addr + len, qp->small[i].lo,
                               qp->small[i].hi)) {
            return true;
        }
    }
    return false;
}

/* A small SEND's receive buffers [lo, hi) wait for the target's engine
 * until its ring tail passes the record just published. */
static void vqp_sw_small_track(vqp_sw_qp_t *qp, uint64_t lo, uint64_t hi)
{
    unsigned i;

    if (lo >= hi) {
        return;
    }
    /* Only a full list is worth a look at the owner's tail. */
    vqp_sw_small_prune(qp, qp->n_small == VQP_SW_SMALL_TRACK);
    if (qp->n_small == VQP_SW_SMALL_TRACK) {
        i               = qp->n_small - 1;
        qp->small[i].lo = ucs_min(qp->small[i].lo, lo);
        qp->small[i].hi = ucs_max(qp->small[i].hi, hi);
    } else {
        i               = qp->n_small++;
        qp->small[i].lo = lo;
        qp->small[i].hi = hi;
    }
    qp->small[i].seq = qp->peer->shm->in_head;
}

void vqp_sw_resp_consume(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                         uint16_t wqe_counter)
{
    vqp_sw_shm_srq_t *srq;

    if (tqp->srq_index == VQP_SW_NO_SRQ) {
        ++tqp->rq_ci;
        return;
    }
    srq          = &qp->peer->shm->srq[tqp->srq_index];
    srq->hw_head = vqp_sw_resp_srq_next(qp, tqp, wqe_counter);
    ++srq->consumed;
}

/* Publishes a record. With @a data (a SEND's payload, already checked) the
 * payload, gathered from our memory, travels with the record and the owner
 * places it: inside the record (at most VQP_SW_SMALL_SEND bytes), or with
 * @a stage_end (vqp_sw_payload_route) in the staging ring. */
void vqp_sw_resp_publish(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp, uint8_t opcode,
                         uint8_t syndrome, uint16_t wqe_counter,
                         uint32_t byte_cnt, uint32_t imm,
                         const struct iovec *data, unsigned n_data,
                         uint64_t stage_end)
{
    vqp_sw_shm_t *pshm    = qp->peer->shm;
    uint64_t pos          = pshm->in_head;
    vqp_sw_shm_rec_t *rec = &pshm->in[pos & (VQP_SW_INBOUND - 1)];
    uint8_t *dst          = rec->data;
    size_t off            = 0;
    unsigned i;

    rec->flags     = 0;
    rec->stage_end = 0;
    if (data != NULL) {
        rec->flags = VQP_SW_REC_DATA;
        if (stage_end > VQP_SW_ROUTE_RECORD) {
            dst =
                pshm->stage +
                ((stage_end - ucs_align_up_pow2(byte_cnt, VQP_SW_STAGE_ALIGN)) &
                 (VQP_SW_STAGE_SIZE - 1));
            pshm->stage_head = stage_end;
            rec->stage_end   = (uint32_t)stage_end;
            rec->flags       = VQP_SW_REC_STAGED;
        }
        for (i = 0; i < n_data; ++i) {
            memcpy(dst + off, data[i].iov_base, data[i].iov_len);
            off += data[i].iov_len;
        }
    }

    /* The record's 16-bit index names every slot (the owner masks it). */
    UCS_STATIC_ASSERT(VQP_SW_MAX_QP <= (1u << (8 * sizeof(rec->qp_index))));
    rec->qp_index    = (uint16_t)(tqp->qpn & (VQP_SW_MAX_QP - 1));
    rec->qpn         = tqp->qpn;
    rec->byte_cnt    = byte_cnt;
    rec->imm         = imm;
    rec->src_qpn     = qp->qpn;
    rec->wqe_counter = wqe_counter;
    rec->opcode      = opcode;
    rec->syndrome    = syndrome;
    rec->ud_hdr      = qp->ud ? (uint8_t)qp->ud_hdr : 0;
    /* The record (and the data placed before it) before its seq, which
     * the owner polls; in_head for producers and the arm check. */
    __atomic_store_n(&rec->seq, (uint32_t)(pos + 1), __ATOMIC_RELEASE);
    __atomic_store_n(&pshm->in_head, pos + 1, __ATOMIC_RELEASE);
    vqp_sw_peer_wake(qp->dev, qp->peer);
}

vqp_sw_resp_status_t vqp_sw_resp_deliver(vqp_sw_qp_t *qp, uint8_t opcode,
                                         uint32_t imm, const struct iovec *iov,
                                         unsigned n_iov, uint64_t len,
                                         uint64_t raddr, uint32_t rkey)
{
    vqp_sw_shm_t *pshm;
    vqp_sw_shm_qp_t *tqp;
    const struct mlx5_wqe_data_seg *segs = NULL;
    struct iovec riov[VQP_SW_MAX_SGE];
    vqp_sw_resp_status_t status;
    unsigned n_segs = 0, nr = 0;
    uint16_t wqe_counter = 0;
    uint8_t cqe_op, rsynd = 0;
    const char *why = NULL;
    uint32_t cursor = 0;
    uint64_t lo, hi, route;
    int err;

    if ((qp->peer == NULL) || qp->peer->dead) {
        return VQP_SW_RESP_NO_ACK;
    }
    pshm = qp->peer->shm;
    /* One lock per target: RQ/SRQ consumption and ring reservation are
     * atomic with respect to other requesters and the owner's state. Held
     * by another process: backpressure, as a full ring (vqp_sw_trylock). */
    if (!vqp_sw_trylock(pshm)) {
        return VQP_SW_RESP_BUSY;
    }
    tqp = vqp_sw_peer_qp(qp);
    if (tqp == NULL) {
        status = VQP_SW_RESP_NO_ACK;
        goto out;
    }
    if (vqp_sw_ring_room(qp->peer, 1) == 0) {
        status = VQP_SW_RESP_BUSY;
        goto out;
    }
    status =
        vqp_sw_resp_take_wqe(qp, tqp, 0, &cursor, &segs, &n_segs, &wqe_counter);
    if (status != VQP_SW_RESP_OK) {
        goto out;
    }
    if (opcode == MLX5_OPCODE_RDMA_WRITE_IMM) {
        cqe_op = MLX5_CQE_RESP_WR_IMM;
        if (len == 0) {
            why = NULL; /* no memory touched: no rkey check, as on IB */
        } else if ((tqp->access & IBV_ACCESS_REMOTE_WRITE) == 0) {
            why = "target QP lacks REMOTE_WRITE";
        } else {
            why = vqp_sw_mr_check(pshm, rkey, raddr, len,
                                  IBV_ACCESS_REMOTE_WRITE);
        }
        if (why != NULL) {
            ucs_error("vqp_sw %s: QP 0x%x WQE %u: WRITE_IMM to 0x%lx+%lu rkey "
                      "0x%x refused: %s",
                      qp->dev->name, qp->qpn, qp->sq_ci, raddr, len, rkey, why);
            vqp_sw_peer_remote_err(qp, tqp,
                                   MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
            status = VQP_SW_RESP_REM_ACCESS;
            goto out;
        }
        riov[0].iov_base = (void *)(uintptr_t)raddr;
        riov[0].iov_len  = len;
        nr               = 1;
        if (vqp_sw_small_conflict(qp, raddr, len)) {
            status = VQP_SW_RESP_BUSY; /* an earlier small SEND first */
            goto out;
        }
    } else {
        cqe_op = (opcode == MLX5_OPCODE_SEND_IMM) ? MLX5_CQE_RESP_SEND_IMM
                                                  : MLX5_CQE_RESP_SEND;
        rsynd  = vqp_sw_resp_scatter(qp, tqp, segs, n_segs, len, wqe_counter,
                                     riov, &nr, true);
        status = (rsynd == MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR)
                     ? VQP_SW_RESP_REM_INVAL
                     : VQP_SW_RESP_REM_OP;
        if (rsynd != 0) {
            /* The receiver completes this WQE in error and enters ERROR. */
            vqp_sw_resp_consume(qp, tqp, wqe_counter);
            vqp_sw_resp_publish(qp, tqp, MLX5_CQE_RESP_ERR, rsynd, wqe_counter,
                                0, 0, NULL, 0, 0);
            goto out;
        }
        vqp_sw_iov_box(riov, nr, &lo, &hi);
        route = vqp_sw_payload_route(qp->peer, pshm->stage_head, len);
        if (route != VQP_SW_ROUTE_XFER) {
            /* Checked exactly as a large SEND; the payload travels with the
             * record and the owner places it before writing the CQE. No
             * syscall would notice a dead target: ask its life lock. */
            if (!vqp_sw_peer_alive(qp->peer, qp->dev->pid)) {
                status = VQP_SW_RESP_NO_ACK;
                goto out;
            }
            vqp_sw_resp_consume(qp, tqp, wqe_counter);
            vqp_sw_resp_publish(qp, tqp, cqe_op, 0, wqe_counter, (uint32_t)len,
                                imm, iov, n_iov, route);
            vqp_sw_small_track(qp, lo, hi);
            status = VQP_SW_RESP_OK;
            goto out;
        }
        if (vqp_sw_small_conflict(qp, lo, hi - lo)) {
            status = VQP_SW_RESP_BUSY; /* an earlier small SEND first */
            goto out;
        }
    }
    /* With no payload no syscall would notice a dead target: ask. */
    err = ((len == 0) && !vqp_sw_peer_alive(qp->peer, qp->dev->pid))
              ? ESRCH
              : vqp_sw_xfer(qp->peer->pid, true, iov, n_iov, riov, nr);
    if (err == ESRCH) {
        qp->peer->dead = true;
        status         = VQP_SW_RESP_NO_ACK;
        goto out;
    } else if (err != 0) {
        ucs_error("vqp_sw %s: QP 0x%x WQE %u: placing %lu bytes in pid %u "
                  "failed: %s",
                  qp->dev->name, qp->qpn, qp->sq_ci, len, qp->peer->pid,
                  strerror(err));
        status = VQP_SW_RESP_REM_OP;
        goto out;
    }
    vqp_sw_resp_consume(qp, tqp, wqe_counter);
    vqp_sw_resp_publish(qp, tqp, cqe_op, 0, wqe_counter, (uint32_t)len, imm,
                        NULL, 0, 0);
    status = VQP_SW_RESP_OK;
out:
    vqp_sw_unlock(pshm);
    return status;
}

/*
 * Delivers a prefix of a run of SEND/SEND_IMM under one acquisition of the
 * target's lock with one transfer for all payloads that neither fit their
 * record nor go staged (vqp_sw_payload_route). Each message needs a receive
 * WQE that takes it whole with valid keys and a free record; the run stops
 * before the first that lacks one (the ordinary path then handles the RNR
 * wait or reports the error), and before a transferred one whose buffers
 * may still receive an earlier payload the owner places. Nothing is
 * consumed unless the transfer succeeded. Returns the messages delivered.
 */
unsigned vqp_sw_resp_deliver_run(vqp_sw_qp_t *qp, const vqp_sw_run_t *run)
{
    struct iovec riov[VQP_SW_RUN_IOV], liov[VQP_SW_RUN_IOV];
    uint16_t wqe_counter[VQP_SW_RUN_MAX];
    uint64_t lo[VQP_SW_RUN_MAX], hi[VQP_SW_RUN_MAX], route[VQP_SW_RUN_MAX];
    uint64_t run_lo = 0, run_hi = 0, stage_head;
    const struct mlx5_wqe_data_seg *segs;
    unsigned n = 0, nr = 0, nl = 0, cnt, room, n_segs, i, first, lcnt;
    vqp_sw_shm_qp_t *tqp;
    vqp_sw_shm_t *pshm;
    uint32_t cursor = 0;

    if ((qp->peer == NULL) || qp->peer->dead) {
        return 0;
    }
    pshm = qp->peer->shm;
    if (!vqp_sw_trylock(pshm)) {
        return 0; /* the ordinary path stalls on the busy lock */
    }
    tqp = vqp_sw_peer_qp(qp);
    if (tqp == NULL) {
        goto out;
    }
    room       = vqp_sw_ring_room(qp->peer, run->n);
    stage_head = pshm->stage_head;
    while ((n < run->n) && (n < room) &&
           (nr + VQP_SW_MAX_SGE <= VQP_SW_RUN_IOV)) {
        if ((n > 0) && (tqp->srq_index != VQP_SW_NO_SRQ)) {
            cursor = vqp_sw_resp_srq_next(qp, tqp, cursor);
        }
        if ((vqp_sw_resp_take_wqe(qp, tqp, n, &cursor, &segs, &n_segs,
                                  &wqe_counter[n]) != VQP_SW_RESP_OK) ||
            (vqp_sw_resp_scatter(qp, tqp, segs, n_segs, run->ent[n].len,
                                 wqe_counter[n], riov + nr, &cnt,
                                 false) != 0)) {
            break;
        }
        vqp_sw_iov_box(riov + nr, cnt, &lo[n], &hi[n]);
        route[n] = vqp_sw_payload_route(qp->peer, stage_head, run->ent[n].len);
        if (route[n] == VQP_SW_ROUTE_XFER) {
            /* Placed now: not where an earlier payload will land. */
            if (vqp_sw_small_conflict(qp, lo[n], hi[n] - lo[n]) ||
                vqp_sw_box_overlap(lo[n], hi[n], run_lo, run_hi)) {
                break;
            }
            first = run->ent[n].liov_first;
            lcnt  = run->ent[n].liov_cnt;
            memcpy(liov + nl, run->liov + first, lcnt * sizeof(*liov));
            nl += lcnt;
            nr += cnt;
        } else {
            if (route[n] != VQP_SW_ROUTE_RECORD) {
                stage_head = route[n];
            }
            if (lo[n] < hi[n]) {
                run_lo = (run_lo < run_hi) ? ucs_min(run_lo, lo[n]) : lo[n];
                run_hi = ucs_max(run_hi, hi[n]);
            }
        }
        ++n;
    }
    /* Owner-placed payloads only: no syscall would notice a dead target,
     * ask. Any failure: the ordinary path redoes the first WQE and reports
     * it. */
    if ((n > 0) && ((nl == 0) ? !vqp_sw_peer_alive(qp->peer, qp->dev->pid)
                              : (vqp_sw_xfer(qp->peer->pid, true, liov, nl,
                                             riov, nr) != 0))) {
        n = 0;
    }
    for (i = 0; i < n; ++i) {
        vqp_sw_resp_consume(qp, tqp, wqe_counter[i]);
        vqp_sw_resp_publish(qp, tqp,
                            (run->ent[i].opcode == MLX5_OPCODE_SEND_IMM)
                                ? MLX5_CQE_RESP_SEND_IMM
                                : MLX5_CQE_RESP_SEND,
                            0, wqe_counter[i], (uint32_t)run->ent[i].len,
                            run->ent[i].imm,
                            (route[i] == VQP_SW_ROUTE_XFER)
                                ? NULL
                                : run->liov + run->ent[i].liov_first,
                            run->ent[i].liov_cnt, route[i]);
        if (route[i] != VQP_SW_ROUTE_XFER) {
            vqp_sw_small_track(qp, lo[i], hi[i]);
        }
    }
out:
    vqp_sw_unlock(pshm);
    return n;
}

/* Owner side: the staged payload of @a rec, whose stage_end must lie
 * within the ring's free-to-be bytes past *@a tail; NULL (logged) when the
 * record does not describe one. Moves *@a tail past it. */
static const uint8_t *vqp_sw_stage_take(vqp_sw_dev_t *dev,
                                        const vqp_sw_shm_rec_t *rec,
                                        uint64_t *tail)
{
    uint64_t alen = ucs_align_up_pow2(rec->byte_cnt, VQP_SW_STAGE_ALIGN);
    uint64_t ahead, start;

    ahead = (uint32_t)(rec->stage_end - (uint32_t)*tail);
    start = *tail + ahead - alen;
    if ((rec->byte_cnt > VQP_SW_STAGE_SEND) || (ahead > VQP_SW_STAGE_SIZE) ||
        (ahead < alen) ||
        ((start & (VQP_SW_STAGE_SIZE - 1)) + alen > VQP_SW_STAGE_SIZE)) {
        ucs_error("vqp_sw %s: inbound record of QP 0x%x: staged %u bytes "
                  "ending at %u do not follow the ring's tail %lu",
                  dev->name, rec->qpn, rec->byte_cnt, rec->stage_end, *tail);
        return NULL;
    }
    *tail += ahead;
    return dev->shm->stage + (start & (VQP_SW_STAGE_SIZE - 1));
}

/* Owner side: places the payload @a src of a record (in it, or staged)
 * into the receive WQE it consumed. The requester checked that WQE against
 * our MR table when it took it; check again here, where the memory is
 * written, in case software changed the posted WQE or deregistered its
 * buffer. Returns 0 or the responder's syndrome. */
static uint8_t vqp_sw_resp_place(vqp_sw_qp_t *qp, const vqp_sw_shm_rec_t *rec,
                                 const uint8_t *src)
{
    vqp_sw_dev_t *dev = qp->dev;
    const struct mlx5_wqe_data_seg *segs;
    struct iovec riov[VQP_SW_MAX_SGE];
    const vqp_sw_srq_t *srq;
    const char *why = NULL;
    unsigned n_segs, nr = 0, bad = 0, i;
    uint64_t cap = 0;
    size_t off   = 0;
    uint8_t synd;

    if (src == NULL) {
        return MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR; /* logged */
    }
    if ((rec->flags & VQP_SW_REC_DATA) && (rec->byte_cnt > VQP_SW_SMALL_SEND)) {
        ucs_error("vqp_sw %s: QP 0x%x: inbound record with %u payload bytes "
                  "(at most %u)",
                  dev->name, qp->qpn, rec->byte_cnt, VQP_SW_SMALL_SEND);
        return MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR;
    }
    /* Our own geometry, not the shared copies next to what peers write. */
    if (qp->srq == NULL) {
        if (qp->rq_wqe_cnt == 0) {
            ucs_error("vqp_sw %s: QP 0x%x: inbound SEND without an RQ",
                      dev->name, qp->qpn);
            return MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR;
        }
        segs   = (const void *)(qp->rq_buf + (size_t)(rec->wqe_counter &
                                                    (qp->rq_wqe_cnt - 1)) *
                                               qp->rq_stride);
        n_segs = ucs_min(qp->rq_max_sge, VQP_SW_MAX_SGE);
    } else {
        srq    = qp->srq;
        segs   = (const void *)(srq->buf +
                              (size_t)(rec->wqe_counter & (srq->wqe_cnt - 1)) *
                                  srq->stride +
                              sizeof(struct mlx5_wqe_srq_next_seg));
        n_segs = ucs_min(srq->max_sge, VQP_SW_MAX_SGE);
    }
    synd = vqp_sw_scatter_resolve(dev->shm, segs, n_segs, rec->byte_cnt, riov,
                                  &nr, &bad, &why, &cap);
    if (synd == MLX5_CQE_SYNDROME_LOCAL_PROT_ERR) {
        ucs_error("vqp_sw %s: QP 0x%x: receive WQE %u segment %u lkey 0x%x "
                  "changed after the message arrived: %s",
                  dev->name, qp->qpn, rec->wqe_counter, bad,
                  be32toh(segs[bad].lkey), why);
        return synd;
    } else if (synd != 0) {
        ucs_error("vqp_sw %s: QP 0x%x: receive WQE %u changed after the "
                  "message arrived: %u bytes do not fit %lu",
                  dev->name, qp->qpn, rec->wqe_counter, rec->byte_cnt, cap);
        return synd;
    }
    for (i = 0; i < nr; ++i) {
        memcpy(riov[i].iov_base, src + off, riov[i].iov_len);
        off += riov[i].iov_len;
    }
    return 0;
}

/* Owner side: turn inbound records into this device's responder CQEs. */
unsigned vqp_sw_resp_progress(vqp_sw_dev_t *dev)
{
    vqp_sw_shm_t *shm   = dev->shm;
    uint64_t tail       = shm->in_tail;
    uint64_t stage_tail = shm->stage_tail;
    const vqp_sw_shm_rec_t *rec;
    const uint8_t *src;
    vqp_sw_qp_t *qp;
    unsigned n = 0;
    uint8_t synd;

    while (n < VQP_SW_IN_BUDGET) {
        rec = &shm->in[tail & (VQP_SW_INBOUND - 1)];
        /* Published once its seq is its position + 1 (stored last). */
        if (__atomic_load_n(&rec->seq, __ATOMIC_ACQUIRE) !=
            (uint32_t)(tail + 1)) {
            break;
        }
        /* Staged bytes are freed in record order, whatever becomes of the
         * record. */
        src = (rec->flags & VQP_SW_REC_STAGED)
                  ? vqp_sw_stage_take(dev, rec, &stage_tail)
                  : rec->data;
        /* Peers wrote the record: check the index before using it. */
        qp = dev->qps[rec->qp_index & (VQP_SW_MAX_QP - 1)];
        if ((qp == NULL) || (qp->qpn != rec->qpn)) {
            ucs_debug("vqp_sw %s: record for destroyed QP 0x%x dropped",
                      dev->name, rec->qpn);
        } else if (rec->opcode == MLX5_CQE_RESP_ERR) {
            vqp_sw_cqe_err(qp, qp->recv_cq, true, rec->wqe_counter, 0,
                           rec->syndrome);
            vqp_sw_qp_set_error(qp);
        } else if ((rec->flags & (VQP_SW_REC_DATA | VQP_SW_REC_STAGED)) &&
                   ((synd = vqp_sw_resp_place(qp, rec, src)) != 0)) {
            /* Data in place before the CQE; else the receive fails. */
            vqp_sw_cqe_err(qp, qp->recv_cq, true, rec->wqe_counter, 0, synd);
            vqp_sw_qp_set_error(qp);
        } else {
            vqp_sw_cqe_resp(qp, rec);
        }
        ++tail;
        ++n;
    }
    /* Frees the slots and staged bytes for producers (no store when idle:
     * peers read the line on every delivery). */
    if (n > 0) {
        if (stage_tail != shm->stage_tail) {
            __atomic_store_n(&shm->stage_tail, stage_tail, __ATOMIC_RELEASE);
        }
        __atomic_store_n(&shm->in_tail, tail, __ATOMIC_RELEASE);
    }
    return n;
}

unsigned vqp_sw_resp_drain(vqp_sw_dev_t *dev)
{
    uint64_t head = __atomic_load_n(&dev->shm->in_head, __ATOMIC_ACQUIRE);
    unsigned n, total = 0;

    /* Up to the records published now; one whose producer is still
     * writing it ends the drain (it came after whatever the caller saw). */
    while ((int64_t)(head - dev->shm->in_tail) > 0) {
        n = vqp_sw_resp_progress(dev);
        if (n == 0) {
            break;
        }
        total += n;
    }
    return total;
}
