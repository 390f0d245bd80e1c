/*
 * Software mlx5 device: the requester. Walks a QP's send queue from its
 * doorbell record, checks each WQE against the mlx5 contract, dispatches it
 * (one-sided operations to sw_rdma.c, two-sided ones to sw_resp.c), handles
 * RNR and transport retries, and writes requester CQEs.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <errno.h>
#include <string.h>

/* IB min_rnr_timer encoding, in microseconds (IBA table 45). */
static const uint32_t vqp_sw_rnr_us[32] = {
    655360, 10,    20,    30,     40,     60,     80,     120,
    160,    240,   320,   480,    640,    960,    1280,   1920,
    2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
    40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

vqp_sw_req_result_t vqp_sw_req_fail(vqp_sw_qp_t *qp, const vqp_sw_wqe_t *w,
                                    uint8_t syndrome)
{
    vqp_sw_cqe_err(qp, qp->send_cq, false, qp->sq_ci, w->opcode, syndrome);
    qp->sq_ci += w->nbb ? w->nbb : 1;
    qp->stall       = VQP_SW_STALL_NONE;
    qp->stall_count = 0;
    /* A send error takes a UD QP in RTS to SQE (its RQ keeps working, as
     * IBA 10.3.1 has it), anything else to ERR. */
    if (qp->ud && (vqp_sw_qp_state(qp) == IBV_QPS_RTS)) {
        vqp_sw_qp_set_sqe(qp);
    } else {
        vqp_sw_qp_set_error(qp);
    }
    return VQP_SW_REQ_ERROR;
}


bool vqp_sw_req_layout(vqp_sw_qp_t *qp, vqp_sw_wqe_t *w, unsigned first,
                       const char **why)
{
    const struct mlx5_wqe_data_seg *d;
    unsigned pos, units, n_data = 0;
    uint32_t bc, inl_total = 0;

    w->n_iov       = 0;
    w->len         = 0;
    w->is_inline   = false;
    w->inline_mask = 0;
    if (first > w->ds) {
        *why = "ds too small for the opcode's segments";
        return false;
    }
    /* Data and inline segments in any order must fill ds exactly. */
    for (pos = first; pos < w->ds;) {
        if (w->n_iov == VQP_SW_MAX_SGE + 1) {
            *why = "more gather entries than max_sge";
            return false;
        }
        d  = (const void *)(w->base + pos * 16);
        bc = be32toh(d->byte_count);
        if (bc & MLX5_INLINE_SEG) {
            bc &= ~MLX5_INLINE_SEG;
            units = (4 + bc + 15) / 16; /* padded to 16 bytes */
            if (pos + units > w->ds) {
                *why = "inline segment extends past ds";
                return false;
            }
            inl_total += bc;
            if (inl_total > qp->max_inline) {
                *why = "inline data larger than the QP's max_inline";
                return false;
            }
            w->is_inline = true;
            if (bc > 0) {
                w->inline_mask |= 1u << w->n_iov;
                w->iov[w->n_iov].iov_base = (void *)((const uint8_t *)d + 4);
                w->iov[w->n_iov].iov_len  = bc;
                w->lkey[w->n_iov]         = 0;
                ++w->n_iov;
            }
            w->len += bc;
            pos += units;
            continue;
        }
        if (++n_data > VQP_SW_MAX_SGE) {
            *why = "more data segments than max_sge";
            return false;
        }
        /* byte_count 0 stands for 2 GiB in a data segment. */
        w->iov[w->n_iov].iov_len  = bc ? bc : 0x80000000u;
        w->iov[w->n_iov].iov_base = (void *)(uintptr_t)be64toh(d->addr);
        w->lkey[w->n_iov]         = be32toh(d->lkey);
        w->len += w->iov[w->n_iov].iov_len;
        ++w->n_iov;
        ++pos;
    }
    return true;
}

/* Local gather/scatter list against our own MR table. */
const char *vqp_sw_req_check_lkeys(vqp_sw_qp_t *qp, const vqp_sw_wqe_t *w,
                                   unsigned access, unsigned *bad)
{
    const char *why;
    unsigned i;

    for (i = 0; i < w->n_iov; ++i) {
        if (w->inline_mask & (1u << i)) {
            continue;
        }
        why = vqp_sw_mr_check(qp->dev->shm, w->lkey[i],
                              (uintptr_t)w->iov[i].iov_base, w->iov[i].iov_len,
                              access);
        if (why != NULL) {
            *bad = i;
            return why;
        }
    }
    return NULL;
}

vqp_sw_req_result_t vqp_sw_req_stall(vqp_sw_qp_t *qp, const vqp_sw_wqe_t *w,
                                     vqp_sw_stall_t why)
{
    uint64_t wait_ns;

    if (why == VQP_SW_STALL_BUSY) {
        /* Backpressure is not a protocol retry: try on the next call. */
        qp->stall       = why;
        qp->stall_until = 0;
        return VQP_SW_REQ_STALL;
    }
    if (why == VQP_SW_STALL_RNR) {
        if ((qp->rnr_retry != 7) && (qp->stall_count >= qp->rnr_retry)) {
            ucs_debug("vqp_sw %s: QP 0x%x WQE %u: RNR retries (%u) exhausted",
                      qp->dev->name, qp->qpn, qp->sq_ci, qp->rnr_retry);
            return vqp_sw_req_fail(qp, w, MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
        }
        ++qp->shm->rnr_retries;
        wait_ns = (uint64_t)vqp_sw_rnr_us[qp->min_rnr_timer] * 1000;
    } else {
        if (qp->stall_count >= qp->retry_cnt) {
            ucs_debug("vqp_sw %s: QP 0x%x WQE %u: no response after %u "
                      "retries (peer %u:%u %s)",
                      qp->dev->name, qp->qpn, qp->sq_ci, qp->retry_cnt,
                      qp->shm->dest_pid, qp->shm->dest_instance,
                      qp->peer->dead ? "dead" : "not connected");
            return vqp_sw_req_fail(qp, w,
                                   MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
        }
        ++qp->shm->retries;
        /* 4.096 us * 2^timeout; 0 (infinite on IB) is taken as the shortest
         * interval so that a dead peer always ends in an error. */
        wait_ns = 4096ull << qp->timeout;
        vqp_sw_peer_check(qp->peer);
    }
    ++qp->stall_count;
    qp->stall       = why;
    qp->stall_until = vqp_sw_now_ns() + wait_ns;
    return VQP_SW_REQ_STALL;
}


static vqp_sw_req_result_t vqp_sw_req_two_sided(vqp_sw_qp_t *qp,
                                                vqp_sw_wqe_t *w)
{
    switch (vqp_sw_resp_deliver(qp, w->opcode, w->imm, w->iov, w->n_iov, w->len,
                                w->raddr, w->rkey)) {
    case VQP_SW_RESP_OK:
        return VQP_SW_REQ_DONE;
    case VQP_SW_RESP_RNR:
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_RNR);
    case VQP_SW_RESP_NO_ACK:
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_RETRY);
    case VQP_SW_RESP_BUSY:
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_BUSY);
    case VQP_SW_RESP_LOC_PROT:
        return vqp_sw_req_fail(qp, w, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
    case VQP_SW_RESP_REM_ACCESS:
        return vqp_sw_req_fail(qp, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    case VQP_SW_RESP_REM_INVAL:
        return vqp_sw_req_fail(qp, w, MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
    default:
        return vqp_sw_req_fail(qp, w, MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
    }
}

/* Fault injection's decisions for the WQE at sq_ci (an injected error, a
 * placement delay), drawn once per WQE and kept while it is retried after a
 * stall (RNR, a busy target, a full ring): a retry is the same WQE, so it
 * neither gets another chance to fail nor shifts the seed's sequence by how
 * often the timing made it wait. An injected error fails the WQE at once,
 * so a WQE whose draws are kept (drawn_wqe) drew none. Returns
 * VQP_SW_REQ_DONE to execute it. */
static vqp_sw_req_result_t vqp_sw_req_faults(vqp_sw_qp_t *qp,
                                             const vqp_sw_wqe_t *w)
{
    vqp_sw_fault_t *f = &qp->dev->fault;
    uint8_t synd;

    if (qp->drawn_wqe != qp->sq_ci) {
        synd = vqp_sw_fault_wqe(qp->dev, qp, qp->sq_ci);
        if (synd != 0) {
            ucs_debug("vqp_sw %s: QP 0x%x WQE %u: injected syndrome 0x%x",
                      qp->dev->name, qp->qpn, qp->sq_ci, synd);
            return vqp_sw_req_fail(qp, w, synd);
        }
        qp->drawn_wqe = qp->sq_ci;
        qp->drawn_delay =
            (f->delay_us > 0) && (vqp_sw_fault_rand(f) < f->delay_prob);
    }
    if (qp->drawn_delay) {
        qp->drawn_delay = false; /* once: the retry after it executes */
        qp->stall       = VQP_SW_STALL_DELAY;
        qp->stall_until = vqp_sw_now_ns() + f->delay_us * 1000ull;
        return VQP_SW_REQ_STALL;
    }
    return VQP_SW_REQ_DONE;
}

/* Parse and check the WQE at sq_ci, then execute it. */
static vqp_sw_req_result_t vqp_sw_req_one(vqp_sw_qp_t *qp, uint16_t pi,
                                          uint8_t *copy)
{
    const uint32_t mask = qp->sq_wqe_cnt - 1;
    const struct mlx5_wqe_ctrl_seg *ctrl;
    const struct mlx5_wqe_raddr_seg *rseg;
    const struct mlx5_wqe_atomic_seg *aseg;
    uint32_t opmod_idx_opcode, qpn_ds, idx, first_bb, local_access = 0;
    vqp_sw_req_result_t res;
    uint32_t opnd32[4], opmod;
    uint64_t opnd64[4];
    unsigned mds, n_opnd;
    vqp_sw_wqe_t w;
    const char *why = NULL;
    unsigned bad    = 0, i;

    first_bb = qp->sq_ci & mask;
    ctrl     = (const void *)(qp->sq_buf + (size_t)first_bb * VQP_SW_BB);
    opmod_idx_opcode = be32toh(ctrl->opmod_idx_opcode);
    qpn_ds           = be32toh(ctrl->qpn_ds);
    w.opcode         = opmod_idx_opcode & 0xff;
    w.fm_ce_se       = ctrl->fm_ce_se;
    w.imm            = ctrl->imm;
    w.ds             = qpn_ds & 0x3f;
    w.nbb            = (w.ds * 16 + VQP_SW_BB - 1) / VQP_SW_BB;
    w.base           = (const uint8_t *)ctrl;
    w.asize          = 0;
    w.swap_mask      = 0;
    w.compare_mask   = 0;
    idx              = (opmod_idx_opcode >> 8) & 0xffff;
    if (w.ds == 0) {
        w.nbb = 1;
        return vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "ds is 0 (the ctrl segment counts)");
    }
    if (idx != qp->sq_ci) {
        return vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "wqe index %u in opmod_idx_opcode != "
                                    "producer index %u",
                                    idx, qp->sq_ci);
    }
    if ((qpn_ds >> 8) != qp->qpn) {
        return vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "qpn 0x%x in ctrl != QPN 0x%x", qpn_ds >> 8,
                                    qp->qpn);
    }
    if ((w.nbb > qp->sq_wqe_cnt) || (w.nbb > (uint16_t)(pi - qp->sq_ci))) {
        w.nbb = (uint16_t)(pi - qp->sq_ci);
        return vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "ds %u (%u BBs) exceeds the posted WQE "
                                    "space (%u BBs)",
                                    w.ds, (w.ds * 16 + 63) / 64,
                                    (uint16_t)(pi - qp->sq_ci));
    }
    if (first_bb + w.nbb > qp->sq_wqe_cnt) {
        /* Wraps around the end of the ring: parse a linear copy. */
        i = qp->sq_wqe_cnt - first_bb;
        memcpy(copy, w.base, (size_t)i * VQP_SW_BB);
        memcpy(copy + (size_t)i * VQP_SW_BB, qp->sq_buf,
               (size_t)(w.nbb - i) * VQP_SW_BB);
        w.base = copy;
    }
    if (qp->ud) {
        return vqp_sw_ud_send(qp, &w);
    }
    rseg = (const void *)(w.base + 16);
    aseg = (const void *)(w.base + 32);
    switch (w.opcode) {
    case MLX5_OPCODE_NOP:
        w.n_iov       = 0;
        w.len         = 0;
        w.is_inline   = false;
        w.inline_mask = 0;
        break;
    case MLX5_OPCODE_SEND:
    case MLX5_OPCODE_SEND_IMM:
        vqp_sw_req_layout(qp, &w, 1, &why);
        break;
    case MLX5_OPCODE_RDMA_WRITE:
    case MLX5_OPCODE_RDMA_WRITE_IMM:
    case MLX5_OPCODE_RDMA_READ:
        if (vqp_sw_req_layout(qp, &w, 2, &why) &&
            (w.opcode == MLX5_OPCODE_RDMA_READ)) {
            local_access = IBV_ACCESS_LOCAL_WRITE;
            if (w.is_inline) {
                why = "RDMA_READ with an inline segment";
            }
        }
        break;
    case MLX5_OPCODE_ATOMIC_CS:
    case MLX5_OPCODE_ATOMIC_FA:
        local_access = IBV_ACCESS_LOCAL_WRITE;
        w.asize      = 8;
        if (w.ds != 4) {
            why = "atomic WQE needs ds 4 (ctrl, raddr, atomic, data)";
        } else if (vqp_sw_req_layout(qp, &w, 3, &why) &&
                   (w.is_inline || (w.n_iov != 1) || (w.len != 8))) {
            why = "atomic result segment must be one 8-byte data segment";
        }
        break;
    case MLX5_OPCODE_ATOMIC_MASKED_CS:
    case MLX5_OPCODE_ATOMIC_MASKED_FA:
        /* Extended atomics: opmod 0x8 | (log2(operand bytes) - 2). */
        local_access = IBV_ACCESS_LOCAL_WRITE;
        opmod        = opmod_idx_opcode >> 24;
        if ((opmod != 0x8) && (opmod != 0x9)) {
            return vqp_sw_req_violation(
                qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                "masked atomic opcode 0x%x opmod 0x%x: need 0x8 (4-byte) or"
                " 0x9 (8-byte operands)",
                w.opcode, opmod);
        }
        w.asize = (opmod == 0x9) ? 8 : 4;
        mds     = ((w.opcode == MLX5_OPCODE_ATOMIC_MASKED_CS) && (w.asize == 8))
                      ? 5
                      : 4;
        if (w.ds != mds) {
            return vqp_sw_req_violation(
                qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                "masked atomic opcode 0x%x on %u bytes needs ds %u (ctrl,"
                " raddr, %u operand segment(s), data), not %u",
                w.opcode, w.asize, mds, mds - 3, w.ds);
        }
        if (vqp_sw_req_layout(qp, &w, mds - 1, &why) &&
            (w.is_inline || (w.n_iov != 1) || (w.len != w.asize))) {
            return vqp_sw_req_violation(
                qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                "masked atomic on %u bytes: the result must be one %u-byte"
                " data segment",
                w.asize, w.asize);
        }
        break;
    default:
        return vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "unsupported opcode 0x%x", w.opcode);
    }
    if (why != NULL) {
        return vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                                    "opcode 0x%x ds %u: %s", w.opcode, w.ds,
                                    why);
    }
    if (w.opcode != MLX5_OPCODE_NOP && w.opcode != MLX5_OPCODE_SEND &&
        w.opcode != MLX5_OPCODE_SEND_IMM) {
        w.raddr = be64toh(rseg->raddr);
        w.rkey  = be32toh(rseg->rkey);
    } else {
        w.raddr = 0;
        w.rkey  = 0;
    }
    if ((w.opcode == MLX5_OPCODE_ATOMIC_CS) ||
        (w.opcode == MLX5_OPCODE_ATOMIC_FA)) {
        w.swap_add = be64toh(aseg->swap_add);
        w.compare  = be64toh(aseg->compare);
    } else if (w.asize == 4) {
        /* swap/add, compare/boundary, swap_mask, compare_mask: 4 bytes */
        memcpy(opnd32, aseg, sizeof(opnd32));
        w.swap_add     = be32toh(opnd32[0]);
        w.compare      = be32toh(opnd32[1]);
        w.swap_mask    = be32toh(opnd32[2]);
        w.compare_mask = be32toh(opnd32[3]);
    } else if (w.asize == 8) {
        /* swap/add, compare/boundary | swap_mask, compare_mask (CS only) */
        n_opnd = (w.opcode == MLX5_OPCODE_ATOMIC_MASKED_CS) ? 4 : 2;
        memset(opnd64, 0, sizeof(opnd64));
        memcpy(opnd64, aseg, n_opnd * sizeof(opnd64[0]));
        w.swap_add     = be64toh(opnd64[0]);
        w.compare      = be64toh(opnd64[1]);
        w.swap_mask    = be64toh(opnd64[2]);
        w.compare_mask = be64toh(opnd64[3]);
    }
    if ((w.asize != 0) && (w.raddr & (w.asize - 1))) {
        return vqp_sw_req_violation(
            qp, &w, MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR,
            "atomic remote address 0x%lx not %u-byte aligned", w.raddr,
            w.asize);
    }
    if (w.len > VQP_SW_MAX_MSG) {
        return vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR,
                                    "message of %lu bytes exceeds max_msg_sz",
                                    w.len);
    }
    why = vqp_sw_req_check_lkeys(qp, &w, local_access, &bad);
    if (why != NULL) {
        return vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR,
                                    "local segment %u lkey 0x%x %p+%zu: %s",
                                    bad, w.lkey[bad], w.iov[bad].iov_base,
                                    w.iov[bad].iov_len, why);
    }
    if (ucs_unlikely(qp->dev->fault.enabled)) {
        res = vqp_sw_req_faults(qp, &w);
        if (res != VQP_SW_REQ_DONE) {
            return res;
        }
    }
    /* Fence: earlier RDMA_READ/atomics of this QP must have completed.
     * They complete synchronously here, so the rule holds at this point. */
    switch (w.opcode) {
    case MLX5_OPCODE_NOP:
        res = VQP_SW_REQ_DONE;
        break;
    case MLX5_OPCODE_RDMA_WRITE:
    case MLX5_OPCODE_RDMA_READ:
        res = vqp_sw_req_rdma(qp, &w);
        break;
    case MLX5_OPCODE_ATOMIC_CS:
    case MLX5_OPCODE_ATOMIC_FA:
    case MLX5_OPCODE_ATOMIC_MASKED_CS:
    case MLX5_OPCODE_ATOMIC_MASKED_FA:
        res = vqp_sw_req_atomic(qp, &w);
        break;
    default:
        res = vqp_sw_req_two_sided(qp, &w);
        break;
    }
    if (res != VQP_SW_REQ_DONE) {
        return res;
    }
    if (w.fm_ce_se & MLX5_WQE_CTRL_CQ_UPDATE) {
        vqp_sw_cqe_req(qp, qp->sq_ci, w.opcode, (uint32_t)w.len);
    }
    ++qp->shm->wqes;
    qp->shm->bytes += w.len;
    qp->sq_ci += w.nbb;
    qp->stall       = VQP_SW_STALL_NONE;
    qp->stall_count = 0;
    qp->drawn_wqe   = UINT32_MAX;
    return VQP_SW_REQ_DONE;
}


/* Collects consecutive WQEs from sq_ci with opcode @a op0 or @a op1 that
 * do not wrap and pass every check (index, QPN, ds, layout, lkeys). The run
 * stops before the first that does not qualify: the one-by-one path then
 * executes or reports it exactly. Only without fault injection, which
 * decides per WQE. */
unsigned vqp_sw_req_scan_run(vqp_sw_qp_t *qp, uint16_t pi, unsigned budget,
                             uint8_t op0, uint8_t op1, vqp_sw_run_t *run)
{
    const uint32_t mask = qp->sq_wqe_cnt - 1;
    const struct mlx5_wqe_ctrl_seg *ctrl;
    const struct mlx5_wqe_raddr_seg *rseg;
    uint16_t pos    = qp->sq_ci;
    const char *why = NULL;
    uint32_t first_bb, opmod_idx_opcode;
    unsigned bad, first;
    vqp_sw_wqe_t w;

    run->n  = 0;
    run->nl = 0;
    if (qp->dev->fault.enabled) {
        return 0;
    }
    while ((pos != pi) && (run->n < budget) && (run->n < VQP_SW_RUN_MAX)) {
        first_bb = pos & mask;
        ctrl     = (const void *)(qp->sq_buf + (size_t)first_bb * VQP_SW_BB);
        opmod_idx_opcode = be32toh(ctrl->opmod_idx_opcode);
        w.opcode         = opmod_idx_opcode & 0xff;
        w.ds             = be32toh(ctrl->qpn_ds) & 0x3f;
        w.nbb            = (w.ds * 16 + VQP_SW_BB - 1) / VQP_SW_BB;
        w.base           = (const uint8_t *)ctrl;
        first            = (w.opcode == MLX5_OPCODE_RDMA_WRITE) ? 2 : 1;
        if (((w.opcode != op0) && (w.opcode != op1)) ||
            ((opmod_idx_opcode >> 8) != pos) ||
            ((be32toh(ctrl->qpn_ds) >> 8) != qp->qpn) || (w.ds < first) ||
            (w.nbb > (uint16_t)(pi - pos)) ||
            (first_bb + w.nbb > qp->sq_wqe_cnt) ||
            !vqp_sw_req_layout(qp, &w, first, &why) ||
            (w.len > VQP_SW_MAX_MSG) || (run->nl + w.n_iov > VQP_SW_RUN_IOV) ||
            (vqp_sw_req_check_lkeys(qp, &w, 0, &bad) != NULL)) {
            break;
        }
        rseg                        = (const void *)(w.base + 16);
        run->ent[run->n].idx        = pos;
        run->ent[run->n].nbb        = (uint16_t)w.nbb;
        run->ent[run->n].opcode     = w.opcode;
        run->ent[run->n].signaled   = ctrl->fm_ce_se & MLX5_WQE_CTRL_CQ_UPDATE;
        run->ent[run->n].imm        = ctrl->imm;
        run->ent[run->n].raddr      = (first == 2) ? be64toh(rseg->raddr) : 0;
        run->ent[run->n].rkey       = (first == 2) ? be32toh(rseg->rkey) : 0;
        run->ent[run->n].len        = w.len;
        run->ent[run->n].liov_first = run->nl;
        run->ent[run->n].liov_cnt   = w.n_iov;
        memcpy(&run->liov[run->nl], w.iov, w.n_iov * sizeof(*w.iov));
        run->nl += w.n_iov;
        pos += w.nbb;
        ++run->n;
    }
    return run->n;
}

/* The first @a n WQEs of a run completed: CQEs, counters, consumer index. */
void vqp_sw_req_run_complete(vqp_sw_qp_t *qp, const vqp_sw_run_t *run,
                             unsigned n)
{
    unsigned i;

    for (i = 0; i < n; ++i) {
        if (run->ent[i].signaled) {
            vqp_sw_cqe_req(qp, run->ent[i].idx, run->ent[i].opcode,
                           (uint32_t)run->ent[i].len);
        }
        qp->shm->bytes += run->ent[i].len;
        qp->sq_ci += run->ent[i].nbb;
    }
    qp->shm->wqes += n;
    qp->stall       = VQP_SW_STALL_NONE;
    qp->stall_count = 0;
    qp->drawn_wqe   = UINT32_MAX;
}

/* A run of SEND/SEND_IMM delivered under one lock with one syscall. */
static unsigned vqp_sw_req_send_run(vqp_sw_qp_t *qp, uint16_t pi,
                                    unsigned budget)
{
    vqp_sw_run_t run;
    unsigned n;

    /* A single SEND too: parsed and checked once on the fast path. Any
     * SEND the run cannot deliver (RNR, errors, dead peer) is redone by
     * the ordinary path, which waits or reports it exactly. */
    vqp_sw_resp_prefetch(qp);
    if (vqp_sw_req_scan_run(qp, pi, budget, MLX5_OPCODE_SEND,
                            MLX5_OPCODE_SEND_IMM, &run) == 0) {
        return 0;
    }
    n = vqp_sw_resp_deliver_run(qp, &run);
    if (n > 0) {
        vqp_sw_req_run_complete(qp, &run, n);
    }
    return n;
}

unsigned vqp_sw_req_progress(vqp_sw_qp_t *qp)
{
    uint8_t copy[VQP_SW_MAX_WQE_BB * VQP_SW_BB];
    enum ibv_qp_state state;
    const uint8_t *head;
    vqp_sw_wqe_t w;
    unsigned n = 0, run;
    uint32_t rerr;
    uint16_t pi;

    /* Peers read this cache line on every delivery: no locked write to it
     * unless a responder error is actually pending. */
    rerr = __atomic_load_n(&qp->shm->remote_err, __ATOMIC_RELAXED);
    if (rerr != 0) {
        rerr = __atomic_exchange_n(&qp->shm->remote_err, 0, __ATOMIC_ACQ_REL);
    }
    if (rerr != 0) {
        ucs_debug("vqp_sw %s: QP 0x%x: responder error 0x%x -> ERR",
                  qp->dev->name, qp->qpn, rerr);
        /* What the peer deposited before the error (a SEND it saw
         * complete) lands first, as packets ahead of a NAK would: only the
         * receives after it flush. */
        vqp_sw_resp_drain(qp->dev);
        vqp_sw_qp_set_error(qp);
    }
    state = (enum ibv_qp_state)qp->shm->state;
    if ((state == IBV_QPS_ERR) || (state == IBV_QPS_SQE)) {
        return vqp_sw_flush_qp(qp);
    }
    pi = (uint16_t)be32toh(
        __atomic_load_n(&qp->dbrec[MLX5_SND_DBR], __ATOMIC_ACQUIRE));
    if (pi == qp->sq_ci) {
        return 0;
    }
    head = qp->sq_buf + (size_t)(qp->sq_ci & (qp->sq_wqe_cnt - 1)) * VQP_SW_BB;
    w.opcode = head[3];
    w.nbb    = ((head[7] & 0x3f) * 16 + VQP_SW_BB - 1) / VQP_SW_BB;
    if ((w.nbb == 0) || (w.nbb > (uint16_t)(pi - qp->sq_ci))) {
        w.nbb = 1;
    }
    if (state != IBV_QPS_RTS) {
        /* The QP would ignore a reset doorbell; anything else is a bug. */
        if (state == IBV_QPS_RESET) {
            ucs_error("vqp_sw %s: QP 0x%x: SQ doorbell %u rung in state "
                      "RESET (SQ requires RTS)",
                      qp->dev->name, qp->qpn, pi);
            qp->sq_ci = pi;
            return 0;
        }
        vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                             "posted to the SQ in state %s (SQ requires RTS)",
                             vqp_sw_state_str(state));
        return 1 + vqp_sw_flush_qp(qp);
    }
    if (vqp_sw_fault_killed(qp->dev, qp)) {
        ucs_debug("vqp_sw %s: QP 0x%x killed by fault injection", qp->dev->name,
                  qp->qpn);
        vqp_sw_req_fail(qp, &w, MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
        return 1 + vqp_sw_flush_qp(qp);
    }
    if ((uint16_t)(pi - qp->sq_ci) > qp->sq_wqe_cnt) {
        vqp_sw_req_violation(qp, &w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                             "SQ overflow: producer %u is %u BBs ahead of "
                             "consumer (ring of %u)",
                             pi, (uint16_t)(pi - qp->sq_ci), qp->sq_wqe_cnt);
        return 1 + vqp_sw_flush_qp(qp);
    }
    if ((qp->stall != VQP_SW_STALL_NONE) && (qp->stall_until != 0) &&
        (vqp_sw_now_ns() < qp->stall_until)) {
        return 0;
    }
    while ((qp->sq_ci != pi) && (n < VQP_SW_WQE_BUDGET)) {
        head =
            qp->sq_buf + (size_t)(qp->sq_ci & (qp->sq_wqe_cnt - 1)) * VQP_SW_BB;
        if (qp->ud) {
            run = 0; /* every datagram alone: own destination, faults */
        } else if (head[3] == MLX5_OPCODE_RDMA_WRITE) {
            run = vqp_sw_req_write_run(qp, pi, VQP_SW_WQE_BUDGET - n);
        } else if ((head[3] == MLX5_OPCODE_SEND) ||
                   (head[3] == MLX5_OPCODE_SEND_IMM)) {
            run = vqp_sw_req_send_run(qp, pi, VQP_SW_WQE_BUDGET - n);
        } else {
            run = 0;
        }
        if (run > 0) {
            n += run;
            continue;
        }
        switch (vqp_sw_req_one(qp, pi, copy)) {
        case VQP_SW_REQ_DONE:
            ++n;
            break;
        case VQP_SW_REQ_STALL:
            return n;
        default:
            return n + 1 + vqp_sw_flush_qp(qp);
        }
    }
    return n;
}
