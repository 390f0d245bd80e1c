/*
 * Software mlx5 device: one-sided execution for the requester. RDMA_WRITE
 * and RDMA_READ straight into the target process after the rkey check,
 * atomics under the target's lock, and runs of WRITEs merged into a single
 * process_vm_writev.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <errno.h>
#include <string.h>

/* rkey + bounds + rights at the target, and the target QP's own rights.
 * On failure the target QP is told to enter ERROR, as a ConnectX responder
 * does on an access violation. On success an access of @a len > 0 bytes is
 * counted in the region until vqp_sw_req_rkey_done (the target's dereg
 * waits for it). */
static bool vqp_sw_req_check_rkey(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                                  uint64_t raddr, uint32_t rkey, uint64_t len,
                                  unsigned access)
{
    const char *why = NULL;

    /* As on IB: a zero-length RDMA operation touches no memory, so its
     * rkey is not checked (UCX flushes with a 0-byte WRITE and rkey 0). */
    if (len == 0) {
        return true;
    }
    if ((tqp->access & access) != access) {
        why = "target QP lacks the remote access right";
    } else {
        why = vqp_sw_mr_access_begin(qp->peer->shm, rkey, raddr, len, access);
    }
    if (why == NULL) {
        return true;
    }
    ucs_error("vqp_sw %s: QP 0x%x WQE %u: remote access 0x%lx+%lu rkey 0x%x "
              "refused: %s",
              qp->dev->name, qp->qpn, qp->sq_ci, raddr, len, rkey, why);
    vqp_sw_peer_remote_err(qp, tqp, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    return false;
}

static void vqp_sw_req_rkey_done(vqp_sw_qp_t *qp, uint32_t rkey, uint64_t len)
{
    if (len != 0) {
        vqp_sw_mr_access_end(qp->peer->shm, rkey);
    }
}

static vqp_sw_req_result_t vqp_sw_req_xfer_err(vqp_sw_qp_t *qp,
                                               const vqp_sw_wqe_t *w, int err)
{
    if (err == ESRCH) {
        qp->peer->dead = true;
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_RETRY);
    }
    ucs_error("vqp_sw %s: QP 0x%x WQE %u: data movement with pid %u failed: "
              "%s (registered memory not mapped?)",
              qp->dev->name, qp->qpn, qp->sq_ci, qp->peer->pid, strerror(err));
    return vqp_sw_req_fail(qp, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
}

vqp_sw_req_result_t vqp_sw_req_rdma(vqp_sw_qp_t *qp, vqp_sw_wqe_t *w)
{
    bool is_read   = (w->opcode == MLX5_OPCODE_RDMA_READ);
    unsigned right = is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
    vqp_sw_shm_qp_t *tqp = vqp_sw_peer_qp(qp);
    struct iovec riov;
    int err;

    if (tqp == NULL) {
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_RETRY);
    }
    if ((w->len == 0) && !vqp_sw_peer_alive(qp->peer, qp->dev->pid)) {
        /* Nothing to move, but a real responder still has to acknowledge:
         * a dead peer never does (ep_check / keepalive probes rely on it). */
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_RETRY);
    }
    if (!vqp_sw_req_check_rkey(qp, tqp, w->raddr, w->rkey, w->len, right)) {
        return vqp_sw_req_fail(qp, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    }
    if (vqp_sw_small_conflict(qp, w->raddr, w->len)) {
        /* An earlier small SEND's payload is still to land there. */
        vqp_sw_req_rkey_done(qp, w->rkey, w->len);
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_BUSY);
    }
    riov.iov_base = (void *)(uintptr_t)w->raddr;
    riov.iov_len  = w->len;
    err = vqp_sw_xfer(qp->peer->pid, !is_read, w->iov, w->n_iov, &riov, 1);
    vqp_sw_req_rkey_done(qp, w->rkey, w->len);
    if (err != 0) {
        return vqp_sw_req_xfer_err(qp, w, err);
    }
    return VQP_SW_REQ_DONE;
}

/* The new value of an atomic's target, @a old and the result in the low
 * w->asize bytes. */
static uint64_t vqp_sw_atomic_apply(const vqp_sw_wqe_t *w, uint64_t old)
{
    uint64_t sum = 0, carry = 0, bit;
    unsigned i;

    switch (w->opcode) {
    case MLX5_OPCODE_ATOMIC_FA:
        return old + w->swap_add;
    case MLX5_OPCODE_ATOMIC_CS:
        return (old == w->compare) ? w->swap_add : old;
    case MLX5_OPCODE_ATOMIC_MASKED_CS:
        /* Compare under compare_mask; replace the bits of swap_mask. */
        if (((old ^ w->compare) & w->compare_mask) != 0) {
            return old;
        }
        return (old & ~w->swap_mask) | (w->swap_add & w->swap_mask);
    default: /* MASKED_FA: no carry out of a field-boundary bit */
        for (i = 0; i < 8 * w->asize; ++i) {
            bit = ((old >> i) & 1) + ((w->swap_add >> i) & 1) + carry;
            sum |= (bit & 1) << i;
            carry = (bit >> 1) & ~(w->compare >> i) & 1;
        }
        return sum;
    }
}

vqp_sw_req_result_t vqp_sw_req_atomic(vqp_sw_qp_t *qp, vqp_sw_wqe_t *w)
{
    vqp_sw_shm_qp_t *tqp = vqp_sw_peer_qp(qp);
    const unsigned size  = w->asize;
    uint64_t old64       = 0, val64, res64;
    uint32_t old32       = 0, val32, res32;
    struct iovec liov, riov;
    int changed, err;

    if (tqp == NULL) {
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_RETRY);
    }
    if (!vqp_sw_req_check_rkey(qp, tqp, w->raddr, w->rkey, size,
                               IBV_ACCESS_REMOTE_ATOMIC)) {
        return vqp_sw_req_fail(qp, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    }
    if (vqp_sw_small_conflict(qp, w->raddr, size)) {
        vqp_sw_req_rkey_done(qp, w->rkey, size);
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_BUSY);
    }
    liov.iov_base = (size == 4) ? (void *)&old32 : (void *)&old64;
    liov.iov_len  = size;
    riov.iov_base = (void *)(uintptr_t)w->raddr;
    riov.iov_len  = size;
    /* Atomic among all device atomics on the target: its lock serialises
     * the read-modify-write. Remote memory holds host byte order. */
    if (!vqp_sw_trylock(qp->peer->shm)) {
        vqp_sw_req_rkey_done(qp, w->rkey, size);
        return vqp_sw_req_stall(qp, w, VQP_SW_STALL_BUSY);
    }
    err = vqp_sw_xfer(qp->peer->pid, false, &liov, 1, &riov, 1);
    if (err == 0) {
        if (size == 4) {
            val32         = (uint32_t)vqp_sw_atomic_apply(w, old32);
            changed       = (val32 != old32);
            liov.iov_base = &val32;
        } else {
            val64         = vqp_sw_atomic_apply(w, old64);
            changed       = (val64 != old64);
            liov.iov_base = &val64;
        }
        err =
            changed ? vqp_sw_xfer(qp->peer->pid, true, &liov, 1, &riov, 1) : 0;
    }
    vqp_sw_unlock(qp->peer->shm);
    vqp_sw_req_rkey_done(qp, w->rkey, size);
    if (err != 0) {
        return vqp_sw_req_xfer_err(qp, w, err);
    }
    /* The original value lands in the operand's size, big-endian as the HCA
     * returns it, or for 8 bytes in host order when the device is in that
     * endianness mode. */
    if (size == 4) {
        res32 = htobe32(old32);
        memcpy(w->iov[0].iov_base, &res32, sizeof(res32));
    } else {
        res64 = qp->dev->atomic8_host ? old64 : htobe64(old64);
        memcpy(w->iov[0].iov_base, &res64, sizeof(res64));
    }
    return VQP_SW_REQ_DONE;
}

/*
 * Executes a run of consecutive plain RDMA_WRITEs from sq_ci with one
 * process_vm_writev (one syscall instead of one per WQE: small writes are
 * syscall-bound). Conservative: the run ends before any WQE that is not an
 * unwrapped, well-formed RDMA_WRITE with valid keys, and a failed transfer
 * completes nothing; the one-by-one path then executes or reports that WQE
 * exactly (rewriting the same bytes is harmless). Remote ranges that
 * continue the previous one join its iovec, and a WRITE of exactly the
 * previous WQE's range replaces that WQE's data: the kernel pins pages per
 * remote iovec, which is most of the cost of small writes, and the run
 * completes as a whole, so no CQE can order a reader between the two (as
 * on a NIC, where a reader may see either). Returns WQEs completed.
 */
unsigned vqp_sw_req_write_run(vqp_sw_qp_t *qp, uint16_t pi, unsigned budget)
{
    struct iovec riov[VQP_SW_RUN_MAX];
    unsigned i, j, nr = 0, nl = 0, last_l = 0;
    bool last_alone = false, ok;
    vqp_sw_shm_qp_t *tqp;
    uint64_t raddr, len;
    vqp_sw_run_t run;

    tqp = vqp_sw_peer_qp(qp);
    if ((tqp == NULL) || !(tqp->access & IBV_ACCESS_REMOTE_WRITE) ||
        (vqp_sw_req_scan_run(qp, pi, budget, MLX5_OPCODE_RDMA_WRITE,
                             MLX5_OPCODE_RDMA_WRITE, &run) == 0)) {
        return 0;
    }
    /* The run ends before the first WQE the target refuses. */
    for (i = 0; i < run.n; ++i) {
        if (run.ent[i].len == 0) {
            continue;
        }
        if (vqp_sw_small_conflict(qp, run.ent[i].raddr, run.ent[i].len) ||
            (vqp_sw_mr_access_begin(qp->peer->shm, run.ent[i].rkey,
                                    run.ent[i].raddr, run.ent[i].len,
                                    IBV_ACCESS_REMOTE_WRITE) != NULL)) {
            break;
        }
        raddr = run.ent[i].raddr;
        len   = run.ent[i].len;
        if (last_alone && ((uintptr_t)riov[nr - 1].iov_base == raddr) &&
            (riov[nr - 1].iov_len == len)) {
            --nr; /* the same bytes again: this WQE's data replaces them */
            nl = last_l;
        }
        if ((nr > 0) &&
            ((uintptr_t)riov[nr - 1].iov_base + riov[nr - 1].iov_len ==
             raddr)) {
            riov[nr - 1].iov_len += len;
            last_alone = false;
        } else {
            riov[nr].iov_base = (void *)(uintptr_t)raddr;
            riov[nr].iov_len  = len;
            ++nr;
            last_alone = true;
        }
        /* Local iovecs in the order of the remote bytes, those of replaced
         * WQEs left out (compacted in place: nl never passes a source). */
        last_l = nl;
        if (run.ent[i].liov_first != nl) {
            memmove(&run.liov[nl], &run.liov[run.ent[i].liov_first],
                    run.ent[i].liov_cnt * sizeof(run.liov[0]));
        }
        nl += run.ent[i].liov_cnt;
    }
    /* A run with nothing to move still needs a live responder: leave it to
     * the one-by-one path, which waits for the acknowledgement. */
    ok = (i > 0) && ((nr > 0) || vqp_sw_peer_alive(qp->peer, qp->dev->pid)) &&
         (vqp_sw_xfer(qp->peer->pid, true, run.liov, nl, riov, nr) == 0);
    for (j = 0; j < i; ++j) {
        vqp_sw_req_rkey_done(qp, run.ent[j].rkey, run.ent[j].len);
    }
    if (!ok) {
        return 0;
    }
    vqp_sw_req_run_complete(qp, &run, i);
    return i;
}
