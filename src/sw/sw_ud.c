/*
 * Software mlx5 device: UD (unreliable datagram) sends. A UD WQE names its
 * destination in a datagram segment (address vector, QPN, qkey); the
 * requester places the datagram in the target QP's next receive behind a
 * 40-byte IB GRH and publishes a record for the target's engine, exactly as
 * for an RC SEND, or drops it when nothing takes it there. UD has no
 * acknowledgement: the sender completes every datagram that left, delivered
 * or not, and only its own errors (WQE format, lkeys, MTU) fail it.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <errno.h>
#include <string.h>

#define VQP_SW_AV_GRH       (1u << 30) /* grh_gid_fl: a GRH is sent */
#define VQP_SW_AV_SGID(_v)  (((_v) >> 20) & 0xff)
#define VQP_SW_AV_RESERVED  0xb0000000u /* grh_gid_fl bits 31, 29:28 */
#define VQP_SW_DQP_RESERVED 0x7f000000u /* dqp_dct bits 30:24 */
#define VQP_SW_IB_BTH       12u
#define VQP_SW_IB_DETH      8u
#define VQP_SW_IB_IMMDT     4u
#define VQP_SW_IB_ICRC      4u
#define VQP_SW_IB_NEXT_BTH  0x1b /* GRH next header: IBA transport */

/* fe80:0:7671:7073 ("vqps"): the subnet prefix and tag of a software GID;
 * the device's pid and instance follow, big-endian. */
static const uint8_t vqp_sw_gid_prefix[8] = {0xfe, 0x80, 0x00, 0x00,
                                             0x76, 0x71, 0x70, 0x73};

static void vqp_sw_gid(uint32_t pid, uint32_t instance, uint8_t *gid)
{
    uint32_t be;

    memcpy(gid, vqp_sw_gid_prefix, sizeof(vqp_sw_gid_prefix));
    be = htobe32(pid);
    memcpy(gid + 8, &be, sizeof(be));
    be = htobe32(instance);
    memcpy(gid + 12, &be, sizeof(be));
}

void vqp_sw_ah_av(const vqp_sw_dev_addr_t *remote, struct mlx5_wqe_av *av)
{
    memset(av, 0, sizeof(*av));
    av->grh_gid_fl = htobe32(VQP_SW_AV_GRH);
    av->hop_limit  = 64;
    vqp_sw_gid(remote->pid, remote->instance, av->rgid);
}

/* The destination of a datagram segment, or why it is not one the device
 * accepts: extended AV bit, GRH with a software GID and SGID index 0, no
 * LID, no MAC, every reserved bit clear. */
static const char *vqp_sw_ud_av_parse(const struct mlx5_wqe_av *av,
                                      vqp_sw_dev_addr_t *dst, uint32_t *dqpn)
{
    static const uint8_t zero[6] = {};
    uint32_t dqp = be32toh(av->dqp_dct), gfl = be32toh(av->grh_gid_fl), be;

    if (!(dqp & MLX5_EXTENDED_UD_AV)) {
        return "dqp_dct lacks MLX5_EXTENDED_UD_AV (48-byte AV)";
    }
    if ((dqp & VQP_SW_DQP_RESERVED) || (av->key.qkey.reserved != 0)) {
        return "reserved bits of dqp_dct or of the qkey word set";
    }
    if (!(gfl & VQP_SW_AV_GRH)) {
        return "no GRH (the software device is addressed by GID only)";
    }
    if ((gfl & VQP_SW_AV_RESERVED) || (VQP_SW_AV_SGID(gfl) != 0)) {
        return "grh_gid_fl has reserved bits or an SGID index other than 0";
    }
    if ((av->rlid != 0) || (av->fl_mlid != 0)) {
        return "LID fields set (the software device has no LIDs)";
    }
    if (memcmp(av->rmac, zero, sizeof(av->rmac)) ||
        memcmp(av->reserved0, zero, sizeof(av->reserved0))) {
        return "rmac or reserved bytes set (not RoCE)";
    }
    if (memcmp(av->rgid, vqp_sw_gid_prefix, sizeof(vqp_sw_gid_prefix))) {
        return "rgid is not a software device GID";
    }
    memcpy(&be, av->rgid + 8, sizeof(be));
    dst->pid = be32toh(be);
    memcpy(&be, av->rgid + 12, sizeof(be));
    dst->instance = be32toh(be);
    if (dst->pid == 0) {
        return "rgid names pid 0";
    }
    *dqpn = dqp & 0xffffff;
    return NULL;
}

/* The mapped device at @a dst, cached in qp->peer (a UD QP has no
 * connection; consecutive datagrams mostly go to one device). */
static vqp_sw_peer_t *vqp_sw_ud_peer(vqp_sw_qp_t *qp,
                                     const vqp_sw_dev_addr_t *dst)
{
    if (qp->peer != NULL) {
        if ((qp->peer->pid == dst->pid) &&
            (qp->peer->instance == dst->instance) && !qp->peer->dead) {
            return qp->peer;
        }
        vqp_sw_peer_put(qp->dev, qp->peer);
        qp->peer = NULL;
    }
    qp->peer = vqp_sw_peer_get_quiet(qp->dev, dst);
    return qp->peer;
}

/* The IB GRH a receiving HCA puts in front of the payload. */
static void vqp_sw_ud_grh(vqp_sw_qp_t *qp, const vqp_sw_wqe_t *w,
                          const struct mlx5_wqe_av *av, struct ibv_grh *grh)
{
    uint32_t paylen = VQP_SW_IB_BTH + VQP_SW_IB_DETH + (uint32_t)w->len +
                      ((-(uint32_t)w->len) & 3) + VQP_SW_IB_ICRC;

    if (w->opcode == MLX5_OPCODE_SEND_IMM) {
        paylen += VQP_SW_IB_IMMDT;
    }
    memset(grh, 0, sizeof(*grh));
    grh->version_tclass_flow =
        htobe32((6u << 28) | ((uint32_t)av->tclass << 20) |
                (be32toh(av->grh_gid_fl) & 0xfffff));
    grh->paylen    = htobe16((uint16_t)paylen);
    grh->next_hdr  = VQP_SW_IB_NEXT_BTH;
    grh->hop_limit = av->hop_limit;
    vqp_sw_gid(qp->dev->pid, qp->dev->instance, grh->sgid.raw);
    memcpy(grh->dgid.raw, av->rgid, sizeof(grh->dgid.raw));
}

/* One copy of the datagram to QP @a dqpn of @a peer, whose lock the caller
 * holds. False if it was dropped (@a why_p says why); true once the target
 * consumed a receive for it, also when that receive completes in error. */
static bool vqp_sw_ud_deliver(vqp_sw_qp_t *qp, const vqp_sw_wqe_t *w,
                              const struct mlx5_wqe_av *av, vqp_sw_peer_t *peer,
                              uint32_t dqpn, uint32_t qkey, const char **why_p)
{
    struct iovec liov[VQP_SW_MAX_SGE + 2], riov[VQP_SW_MAX_SGE];
    const struct mlx5_wqe_data_seg *segs = NULL;
    uint64_t total = VQP_SW_UD_GRH + w->len, cap = 0;
    unsigned n_segs = 0, nr = 0, bad = 0;
    const char *why      = NULL;
    uint16_t wqe_counter = 0;
    uint32_t cursor      = 0, state, imm;
    vqp_sw_shm_t *pshm   = peer->shm;
    vqp_sw_shm_qp_t *tqp;
    struct ibv_grh grh;
    bool delivered = false;
    uint8_t synd, cqe_op;
    int err;

    if (peer->dead) {
        *why_p = "process gone";
        return false;
    }
    tqp   = &pshm->qp[dqpn & (VQP_SW_MAX_QP - 1)];
    state = __atomic_load_n(&tqp->state, __ATOMIC_ACQUIRE);
    if ((tqp->qpn != dqpn) || (tqp->type != VQP_SW_QPT_UD) ||
        ((state != IBV_QPS_RTR) && (state != IBV_QPS_RTS) &&
         (state != IBV_QPS_SQE))) {
        why = "no UD QP with that QPN in RTR, RTS or SQE";
    } else if (tqp->qkey != qkey) {
        why = "qkey mismatch";
    } else if (vqp_sw_ring_room(peer, 1) == 0) {
        why = "target's inbound ring full";
    } else if (vqp_sw_resp_take_wqe(qp, tqp, 0, &cursor, &segs, &n_segs,
                                    &wqe_counter) != VQP_SW_RESP_OK) {
        why = "no receive posted";
        ++tqp->out_of_buffer; /* under the segment's lock */
    }
    if (why != NULL) {
        goto out;
    }
    synd = vqp_sw_scatter_resolve(pshm, segs, n_segs, total, riov, &nr, &bad,
                                  &why, &cap);
    if (synd != 0) {
        /* A receive error: the target completes that WQE in error and
         * enters ERR; on the wire the datagram did arrive. */
        ucs_debug("vqp_sw %s: UD QP 0x%x WQE %u: receive WQE %u of QP 0x%x "
                  "fails with syndrome 0x%x (%lu bytes with the GRH, room "
                  "%lu%s%s)",
                  qp->dev->name, qp->qpn, qp->sq_ci, wqe_counter, dqpn, synd,
                  total, cap, why ? ": " : "", why ? why : "");
        why = NULL;
        vqp_sw_resp_consume(qp, tqp, wqe_counter);
        vqp_sw_resp_publish(qp, tqp, MLX5_CQE_RESP_ERR, synd, wqe_counter, 0, 0,
                            NULL, 0, 0);
        delivered = true;
        goto out;
    }
    vqp_sw_ud_grh(qp, w, av, &grh);
    liov[0].iov_base = &grh;
    liov[0].iov_len  = VQP_SW_UD_GRH;
    memcpy(&liov[1], w->iov, w->n_iov * sizeof(*w->iov));
    /* Without an immediate the CQE's word is the P_Key index: 0. */
    imm    = (w->opcode == MLX5_OPCODE_SEND_IMM) ? w->imm : 0;
    cqe_op = (w->opcode == MLX5_OPCODE_SEND_IMM) ? MLX5_CQE_RESP_SEND_IMM
                                                 : MLX5_CQE_RESP_SEND;
    /* CQE: GRH present (flags_rqpn bits 29:28 = 1) and the sender's SL. */
    qp->ud_hdr = 0x10 | (av->stat_rate_sl & 0xf);
    if (total <= VQP_SW_SMALL_SEND) {
        /* The datagram rides in the record; the target places it. */
        vqp_sw_resp_consume(qp, tqp, wqe_counter);
        vqp_sw_resp_publish(qp, tqp, cqe_op, 0, wqe_counter, (uint32_t)total,
                            imm, liov, 1 + w->n_iov, 0);
        delivered = true;
        goto out;
    }
    err = vqp_sw_xfer(peer->pid, true, liov, 1 + w->n_iov, riov, nr);
    if (err == ESRCH) {
        peer->dead = true;
        why        = "process gone";
    } else if (err != 0) {
        ucs_error("vqp_sw %s: UD QP 0x%x WQE %u: placing %lu bytes in pid %u "
                  "failed: %s",
                  qp->dev->name, qp->qpn, qp->sq_ci, total, peer->pid,
                  strerror(err));
        why = "placement failed";
    } else {
        vqp_sw_resp_consume(qp, tqp, wqe_counter);
        vqp_sw_resp_publish(qp, tqp, cqe_op, 0, wqe_counter, (uint32_t)total,
                            imm, NULL, 0, 0);
        delivered = true;
    }
out:
    *why_p = why;
    return delivered;
}

vqp_sw_req_result_t vqp_sw_ud_send(vqp_sw_qp_t *qp, vqp_sw_wqe_t *w)
{
    const struct mlx5_wqe_datagram_seg *dg = (const void *)(w->base + 16);
    struct mlx5_wqe_av av;
    vqp_sw_dev_addr_t dst;
    const char *why = NULL, *drop_why;
    unsigned bad    = 0, copies, i;
    uint32_t dqpn   = 0, qkey;
    vqp_sw_peer_t *peer;
    uint8_t synd;

    if ((w->opcode != MLX5_OPCODE_SEND) &&
        (w->opcode != MLX5_OPCODE_SEND_IMM)) {
        return vqp_sw_req_violation(qp, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "opcode 0x%x on a UD QP (only SEND and "
                                    "SEND_IMM)",
                                    w->opcode);
    }
    if (w->ds < 4) {
        return vqp_sw_req_violation(qp, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "UD WQE of ds %u has no datagram segment "
                                    "(ctrl + 3 units)",
                                    w->ds);
    }
    memcpy(&av, &dg->av, sizeof(av));
    why = vqp_sw_ud_av_parse(&av, &dst, &dqpn);
    if (why != NULL) {
        return vqp_sw_req_violation(qp, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "datagram segment: %s", why);
    }
    if (!vqp_sw_req_layout(qp, w, 4, &why)) {
        return vqp_sw_req_violation(qp, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "UD opcode 0x%x ds %u: %s", w->opcode,
                                    w->ds, why);
    }
    if (w->len > VQP_SW_UD_MAX_MSG) {
        return vqp_sw_req_violation(qp, w, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR,
                                    "%lu-byte datagram exceeds the path MTU "
                                    "(%u)",
                                    w->len, VQP_SW_UD_MAX_MSG);
    }
    why = vqp_sw_req_check_lkeys(qp, w, 0, &bad);
    if (why != NULL) {
        return vqp_sw_req_violation(qp, w, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR,
                                    "local segment %u lkey 0x%x %p+%zu: %s",
                                    bad, w->lkey[bad], w->iov[bad].iov_base,
                                    w->iov[bad].iov_len, why);
    }
    /* The target's lock before any fault draw: when another process holds
     * it, this WQE is retried whole on the next call (vqp_sw_trylock). */
    peer = vqp_sw_ud_peer(qp, &dst);
    if (peer == NULL) {
        why = "no such device";
    } else if (!vqp_sw_peer_alive(peer, qp->dev->pid)) {
        why = "device closed or its process gone";
    } else if (!vqp_sw_trylock(peer->shm)) {
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_BUSY);
    }
    synd = vqp_sw_fault_wqe(qp->dev, qp, qp->sq_ci);
    if (synd != 0) {
        if (why == NULL) {
            vqp_sw_unlock(peer->shm);
        }
        ucs_debug("vqp_sw %s: UD QP 0x%x WQE %u: injected syndrome 0x%x",
                  qp->dev->name, qp->qpn, qp->sq_ci, synd);
        return vqp_sw_req_fail(qp, w, synd);
    }
    /* A qkey with the high bit means "the QP's own" (IBA 10.2.5). */
    qkey = be32toh(av.key.qkey.qkey);
    if (qkey & 0x80000000u) {
        qkey = qp->shm->qkey;
    }
    copies = vqp_sw_fault_ud_copies(qp->dev);
    if (copies == 0) {
        ucs_debug("vqp_sw %s: UD QP 0x%x WQE %u: datagram to %u:%u QP 0x%x "
                  "dropped by fault injection",
                  qp->dev->name, qp->qpn, qp->sq_ci, dst.pid, dst.instance,
                  dqpn);
        ++qp->shm->ud_dropped;
    }
    for (i = 0; i < copies; ++i) {
        drop_why = why;
        if ((why == NULL) &&
            vqp_sw_ud_deliver(qp, w, &av, peer, dqpn, qkey, &drop_why)) {
            continue;
        }
        ucs_debug("vqp_sw %s: UD QP 0x%x WQE %u: datagram to %u:%u QP 0x%x "
                  "dropped: %s",
                  qp->dev->name, qp->qpn, qp->sq_ci, dst.pid, dst.instance,
                  dqpn, drop_why);
        ++qp->shm->ud_dropped;
    }
    if (why == NULL) {
        vqp_sw_unlock(peer->shm);
    }
    if (w->fm_ce_se & MLX5_WQE_CTRL_CQ_UPDATE) {
        vqp_sw_cqe_req(qp, qp->sq_ci, w->opcode, (uint32_t)w->len);
    }
    ++qp->shm->wqes;
    qp->shm->bytes += w->len;
    qp->sq_ci += w->nbb;
    qp->stall       = VQP_SW_STALL_NONE;
    qp->stall_count = 0;
    return VQP_SW_REQ_DONE;
}
