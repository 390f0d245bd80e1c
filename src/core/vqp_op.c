/*
 * Send side of a virtual QP: accepting operations into the operation ring,
 * cutting them into fragments and posting them on physical QPs with room,
 * handling requester CQEs (routed by QPN and wqe_counter, never by opcode),
 * replaying fragments of failed QPs, and reporting each operation once, in
 * posting order.
 */
#include <config.h>

#include "vqp_int.h"

#include <ucs/debug/log.h>
#include <ucs/sys/math.h>

#define VQP_OP(_vqp, _n)     (&(_vqp)->ops[(_n) & (_vqp)->op_mask])
#define VQP_OP_EXT(_vqp, _n) (&(_vqp)->op_ext[(_n) & (_vqp)->op_mask])

/* Where a fragment record finds operation @a opn (vqp_frag_t.op_off). */
static UCS_F_ALWAYS_INLINE uint32_t vqp_op_off(const vqp_t *vqp, uint32_t opn)
{
    return (opn & vqp->op_mask) * (uint32_t)sizeof(vqp_op_t);
}

/* The operation of fragment @a f (one that has one). */
static UCS_F_ALWAYS_INLINE vqp_op_t *vqp_frag_op(const vqp_t *vqp,
                                                 const vqp_frag_t *f)
{
    return (vqp_op_t *)((char *)vqp->ops + f->op_off);
}

/* The ring index of fragment @a f's operation, for VQP_OP and the posts. */
static UCS_F_ALWAYS_INLINE uint32_t vqp_frag_opn(const vqp_frag_t *f)
{
    return f->op_off / (uint32_t)sizeof(vqp_op_t);
}

/* Fragment records and operation records are written in nearly sequential
 * order (the data QPs' rings are interleaved, the operation ring is a ring)
 * into lines that are rarely still cached, and stores alone do not train the
 * hardware prefetchers: every new line would be a full miss on the post's
 * path. The post fetches the lines it will write this far ahead instead. */
#define VQP_PREFETCH_FRAG_BYTES 512 /* 32 records */
#define VQP_PREFETCH_FRAG_LINES 4u
#define VQP_PREFETCH_OPS        4

/* Records @a nfrags fragments from @a pqp's next one on will take (in the
 * shared array, at the next columns), VQP_PREFETCH_FRAG_BYTES later. Past the
 * array's end the prefetch is harmless (it never faults) and useless: the
 * address is computed as an integer. */
static UCS_F_ALWAYS_INLINE void vqp_prefetch_frags(const vqp_pqp_t *pqp,
                                                   uint32_t nfrags)
{
    uintptr_t p =
        (uintptr_t)vqp_pqp_frag(pqp, pqp->frag_tail) + VQP_PREFETCH_FRAG_BYTES;
    unsigned lines =
        ucs_min((nfrags * sizeof(vqp_frag_t) + UCS_SYS_CACHE_LINE_SIZE - 1) /
                    UCS_SYS_CACHE_LINE_SIZE,
                VQP_PREFETCH_FRAG_LINES);
    unsigned i;

    for (i = 0; i < lines; ++i) {
        __builtin_prefetch((const void *)(p + i * UCS_SYS_CACHE_LINE_SIZE), 1);
    }
}

/* An operation's keys on device @a d (its QP's). */
static UCS_F_ALWAYS_INLINE uint32_t vqp_op_lkey(const vqp_t *vqp,
                                                const vqp_op_t *op, unsigned d)
{
    return ucs_likely(d == 0) ? op->lkey
                              : vqp->op_ext[op - vqp->ops].lkey[d - 1];
}

static UCS_F_ALWAYS_INLINE uint32_t vqp_op_rkey(const vqp_t *vqp,
                                                const vqp_op_t *op, unsigned d)
{
    return ucs_likely(d == 0) ? op->rkey
                              : vqp->op_ext[op - vqp->ops].rkey[d - 1];
}

/* The DQPLB sequence number of fragment @a f: an operation's fragments take
 * consecutive numbers from first_seq, and its FINAL the one after them
 * (idx = nfrags), so the record need not keep it. */
static UCS_F_ALWAYS_INLINE uint32_t vqp_frag_seq(const vqp_t *vqp,
                                                 const vqp_frag_t *f)
{
    return (vqp_frag_op(vqp, f)->first_seq + f->idx) & VQP_DQPLB_SEQ_MASK;
}

/* @a vqp waits on the CQ's list until CQEs of any QP give credits back
 * (vqp_cq_credit_progress advances it then). Returns 0. */
static int vqp_credit_wait(vqp_t *vqp)
{
    if (!vqp->credit_wait) {
        vqp->credit_wait = 1;
        ucs_list_add_tail(&vqp->cq->credit_waiters, &vqp->credit_list);
        ++vqp->stats.credit_waits;
    }
    return 0;
}

/* No CQ credit left for a WQE of @a pqp: its virtual QP waits for credits.
 * Every shortage asks for covers, also one met while the virtual QP is
 * still on the list (credits that came back were used up again within the
 * same poll): the WQEs holding the credits may all be unsignaled. */
static UCS_F_NOINLINE int vqp_credit_short(const vqp_pqp_t *pqp)
{
    vqp_credit_wait(pqp->vqp);
    pqp->vqp->cq->cover_pending = 1;
    return 0;
}

/* A cover found no entry, not even a kept one: covers in flight hold them
 * all (only covers take credits below 0), and their CQEs give them back.
 * The virtual QP waits for that, to post its cover then (it may have no
 * CQE of its own to come). Asks for no more covers: the CQEs are coming. */
static UCS_F_NOINLINE int vqp_cover_short(vqp_t *vqp)
{
    ++vqp->stats.cover_waits;
    return vqp_credit_wait(vqp);
}

static UCS_F_ALWAYS_INLINE int vqp_cdev_has_cover_credit(const vqp_cq_dev_t *cd)
{
    return cd->credits + (int32_t)cd->cover_reserve > 0;
}

/* A free entry in @a pqp's fragment ring (none once dead) and room for the
 * largest WQE in its SQ. */
static UCS_F_ALWAYS_INLINE int vqp_pqp_has_slot(const vqp_pqp_t *pqp)
{
    /* vqp_mlx5_txwq_avail() >= VQP_MLX5_MAX_BB as the BBs in use against
     * a bound: 16-bit values (the ring has at most 32768), no widening. */
    return (VQP_RING_COUNT(pqp->frag_head, pqp->frag_tail) < pqp->frag_limit) &&
           ((uint16_t)(pqp->tx.pi - pqp->tx.ci) <=
            (uint16_t)(pqp->tx.mask + 1 - VQP_MLX5_MAX_BB));
}

/* Room in @a pqp's rings; a CQ credit too unless the caller holds one for
 * it already (@a credit_held, a constant at every call). */
static UCS_F_ALWAYS_INLINE int vqp_pqp_has_room_credit(const vqp_pqp_t *pqp,
                                                       int credit_held)
{
    return vqp_pqp_has_slot(pqp) &&
           (credit_held || ucs_likely(pqp->cdev->credits > 0) ||
            vqp_credit_short(pqp));
}

static UCS_F_ALWAYS_INLINE int vqp_pqp_has_room(const vqp_pqp_t *pqp)
{
    return vqp_pqp_has_room_credit(pqp, 0);
}

/* Room for a signaled NOP (or hole filler) that lets tracked WQEs complete:
 * it may use the CQ's entries kept for covers (cover_reserve). */
static UCS_F_ALWAYS_INLINE int vqp_pqp_has_cover_room(const vqp_pqp_t *pqp)
{
    return vqp_pqp_has_slot(pqp) && vqp_cdev_has_cover_credit(pqp->cdev);
}

/* The round-robin cursor's QP is full or dead: the next one with room
 * (a CQ credit held already for it if @a credit_held). */
static UCS_F_NOINLINE vqp_pqp_t *vqp_pick_data_qp_slow(vqp_t *vqp,
                                                       int credit_held)
{
    vqp_pqp_t *pqp = vqp->rr_qp;
    unsigned i;

    for (i = 1; i < vqp->num_qps; ++i) {
        pqp = pqp->rr_next;
        if (vqp_pqp_has_room_credit(pqp, credit_held)) {
            vqp->rr_qp = pqp->rr_next;
            return pqp;
        }
    }
    return NULL;
}

/* Round robin over the data QPs that are alive and have room. */
static UCS_F_ALWAYS_INLINE vqp_pqp_t *vqp_pick_data_qp(vqp_t *vqp)
{
    vqp_pqp_t *pqp = vqp->rr_qp;

    if (ucs_likely(vqp_pqp_has_room(pqp))) {
        vqp->rr_qp = pqp->rr_next;
        return pqp;
    }
    return vqp_pick_data_qp_slow(vqp, 0);
}

/* vqp_pick_data_qp on a cursor the caller keeps (in a register across a
 * loop that stores through other pointers); a CQ credit is held already for
 * the QP if @a credit_held. */
static UCS_F_ALWAYS_INLINE vqp_pqp_t *
vqp_pick_data_qp_at(vqp_t *vqp, vqp_pqp_t **cursor, int credit_held)
{
    vqp_pqp_t *pqp = *cursor;

    if (ucs_likely(vqp_pqp_has_room_credit(pqp, credit_held))) {
        *cursor = pqp->rr_next;
        /* The next QP's second line (fragment ring, round robin), fetched
         * while this fragment is built: from about a hundred QPs on it is
         * no longer in L1 when its turn comes. */
        __builtin_prefetch((const char *)*cursor + UCS_SYS_CACHE_LINE_SIZE, 1);
        return pqp;
    }
    vqp->rr_qp = pqp;
    pqp        = vqp_pick_data_qp_slow(vqp, credit_held);
    *cursor    = vqp->rr_qp;
    return pqp;
}

static UCS_F_ALWAYS_INLINE int vqp_opcode_is_atomic(unsigned opcode)
{
    return (opcode >= VQP_OP_ATOMIC_FA) && (opcode <= VQP_OP_ATOMIC_XOR);
}

/* Post the WQE of atomic operation @a opn; its result goes to the
 * operation's own slot (its first @a op->length bytes). 8-byte FA and CS
 * take the basic opcodes; the rest is masked CS/FA as rc_mlx5 builds them:
 * a masked CS replaces the bits of swap_mask when the bits of compare_mask
 * match; a masked FA with every bit a field boundary adds without carries,
 * which is XOR. */
static int vqp_post_atomic(vqp_t *vqp, vqp_pqp_t *pqp, uint32_t opn,
                           unsigned flags)
{
    const vqp_op_t *op = VQP_OP(vqp, opn);
    unsigned d         = pqp->dev;
    unsigned size      = (unsigned)op->length;
    uint64_t v         = VQP_OP_EXT(vqp, opn)->compare_add;
    vqp_mlx5_sge_t sg  = {(uintptr_t)&vqp->atomic_res[opn & vqp->op_mask], size,
                          vqp->atomic_lkey[d]};
    const uint8_t mcs  = MLX5_OPCODE_ATOMIC_MASKED_CS;
    const uint8_t mfa  = MLX5_OPCODE_ATOMIC_MASKED_FA;

    switch (op->opcode) {
    case VQP_OP_ATOMIC_FA:
        if (size == sizeof(uint64_t)) {
            return vqp_mlx5_post_atomic_fa(&pqp->tx, &sg, op->raddr,
                                           vqp_op_rkey(vqp, op, d), v, flags);
        }
        return vqp_mlx5_post_masked_atomic(&pqp->tx, mfa, size, &sg, op->raddr,
                                           vqp_op_rkey(vqp, op, d), v, 0, 0, 0,
                                           flags);
    case VQP_OP_ATOMIC_CS:
        if (size == sizeof(uint64_t)) {
            return vqp_mlx5_post_atomic_cs(&pqp->tx, &sg, op->raddr,
                                           vqp_op_rkey(vqp, op, d), v,
                                           VQP_OP_EXT(vqp, opn)->swap, flags);
        }
        return vqp_mlx5_post_masked_atomic(
            &pqp->tx, mcs, size, &sg, op->raddr, vqp_op_rkey(vqp, op, d),
            VQP_OP_EXT(vqp, opn)->swap, v, UINT64_MAX, UINT64_MAX, flags);
    case VQP_OP_ATOMIC_SWAP:
        return vqp_mlx5_post_masked_atomic(&pqp->tx, mcs, size, &sg, op->raddr,
                                           vqp_op_rkey(vqp, op, d), v, 0,
                                           UINT64_MAX, 0, flags);
    case VQP_OP_ATOMIC_AND:
        return vqp_mlx5_post_masked_atomic(&pqp->tx, mcs, size, &sg, op->raddr,
                                           vqp_op_rkey(vqp, op, d), v, 0, ~v, 0,
                                           flags);
    case VQP_OP_ATOMIC_OR:
        return vqp_mlx5_post_masked_atomic(&pqp->tx, mcs, size, &sg, op->raddr,
                                           vqp_op_rkey(vqp, op, d), v, 0, v, 0,
                                           flags);
    default: /* VQP_OP_ATOMIC_XOR */
        return vqp_mlx5_post_masked_atomic(&pqp->tx, mfa, size, &sg, op->raddr,
                                           vqp_op_rkey(vqp, op, d), v,
                                           UINT64_MAX, 0, 0, flags);
    }
}

static UCS_F_ALWAYS_INLINE int vqp_op_is_idempotent(const vqp_op_t *op)
{
    return (op->opcode == VQP_OP_WRITE) || (op->opcode == VQP_OP_READ) ||
           (op->opcode == VQP_OP_WRITE_IMM);
}

/* Where an unstriped operation goes: the send QP keeps SENDs, atomics and
 * small operations in order with each other. When it died, idempotent ones
 * may use any data QP; the others have nowhere to go (*dead_p set). */
static UCS_F_ALWAYS_INLINE vqp_pqp_t *
vqp_pick_whole_qp(vqp_t *vqp, const vqp_op_t *op, int *dead_p)
{
    *dead_p = 0;
    if (vqp->send_qp->alive) {
        return vqp_pqp_has_room(vqp->send_qp) ? vqp->send_qp : NULL;
    }
    if (vqp_op_is_idempotent(op) && (vqp->alive > 0)) {
        return vqp_pick_data_qp(vqp);
    }
    *dead_p = 1;
    return NULL;
}

/* Remember a posted WQE in its QP's fragment ring at @a frag, its next
 * entry (room was checked); vqp_frag_push also counts it. */
static UCS_F_ALWAYS_INLINE void
vqp_frag_record_at(vqp_pqp_t *pqp, vqp_frag_t *frag, uint32_t op_off,
                   uint8_t kind, uint32_t idx, int wqe, int seq_valid,
                   int credit_held)
{
    if (!credit_held) {
        --pqp->cdev->credits;
    }
    *frag = (vqp_frag_t){.op_off   = op_off,
                         .idx      = idx,
                         .wqe      = (uint16_t)wqe,
                         .wqe_next = pqp->tx.pi,
                         .kind     = kind,
                         .flags    = seq_valid ? VQP_FRAG_F_SEQ : 0};
}

static UCS_F_ALWAYS_INLINE void
vqp_frag_record_credit(vqp_pqp_t *pqp, uint32_t op_off, uint8_t kind,
                       uint32_t idx, int wqe, int seq_valid, int credit_held)
{
    vqp_frag_record_at(pqp, vqp_pqp_frag(pqp, pqp->frag_tail++), op_off, kind,
                       idx, wqe, seq_valid, credit_held);
}

static UCS_F_ALWAYS_INLINE void vqp_frag_record(vqp_pqp_t *pqp, uint32_t op_off,
                                                uint8_t kind, uint32_t idx,
                                                int wqe, int seq_valid)
{
    vqp_frag_record_credit(pqp, op_off, kind, idx, wqe, seq_valid, 0);
}

static UCS_F_ALWAYS_INLINE void vqp_frag_push(vqp_t *vqp, vqp_pqp_t *pqp,
                                              uint32_t opn, uint8_t kind,
                                              uint32_t idx, int wqe,
                                              int seq_valid)
{
    vqp_frag_record(pqp, vqp_op_off(vqp, opn), kind, idx, wqe, seq_valid);
    ++vqp->stats.frags_posted;
}

/* One data fragment of a striped operation whose opcode (and so WQE kind)
 * is known at compile time: no switch per fragment. @a offset is the
 * fragment's (idx << frag_shift), @a lkey and @a rkey the operation's keys
 * on @a pqp's device; @a pqp has room (picked by vqp_pick_data_qp). Not
 * counted in the statistics (the caller does, once per operation). Returns
 * the mlx5 post's result. */
static UCS_F_ALWAYS_INLINE int
vqp_post_data(vqp_t *vqp, vqp_pqp_t *pqp, const vqp_op_t *op, uint32_t op_off,
              unsigned opcode, int dqplb, uint32_t idx, uint64_t offset,
              uint32_t lkey, uint32_t rkey, uint32_t seq, int credit_held)
{
    uint32_t len      = ucs_min(vqp->frag_size, op->length - offset);
    vqp_mlx5_sge_t sg = {op->laddr + offset, len, lkey};
    uint64_t raddr    = op->raddr + offset;
    unsigned flags    = VQP_MLX5_SIGNALED | VQP_MLX5_HAS_ROOM;
    int ret;

    if (opcode == VQP_OP_READ) {
        ret = vqp_mlx5_post_read(&pqp->tx, &sg, 1, raddr, rkey, flags);
    } else if (dqplb) {
        ret = vqp_mlx5_post_write_imm(&pqp->tx, &sg, 1, raddr, rkey,
                                      htobe32(seq), flags);
    } else {
        ret = vqp_mlx5_post_write(&pqp->tx, &sg, 1, raddr, rkey, flags);
    }
    if (ucs_likely(ret >= 0)) {
        vqp_frag_record_credit(pqp, op_off, VQP_FRAG_DATA, idx, ret, dqplb,
                               credit_held);
    }
    return ret;
}

/* Post one WQE for @a op on @a pqp and remember it. Returns UCS_OK,
 * UCS_ERR_NO_RESOURCE (nothing posted) or an error for a request the WQE
 * format refused. The generic form, for whole operations, tails, NOPs and
 * replays; striped data goes through vqp_post_data. */
static ucs_status_t vqp_post_frag(vqp_t *vqp, vqp_pqp_t *pqp, uint32_t opn,
                                  uint8_t kind, uint32_t idx)
{
    vqp_op_t *op      = VQP_OP(vqp, opn);
    unsigned d        = pqp->dev;
    vqp_mlx5_sge_t sg = {op->laddr, 0, vqp_op_lkey(vqp, op, d)};
    uint64_t raddr    = op->raddr;
    unsigned flags    = VQP_MLX5_SIGNALED;
    uint32_t seq      = (op->first_seq + idx) & VQP_DQPLB_SEQ_MASK;
    int dqplb = (vqp->lb == VQP_LB_DQPLB) && (op->opcode == VQP_OP_WRITE_IMM);
    uint32_t payload;
    int ret;

    switch (kind) {
    case VQP_FRAG_DATA:
        /* Replays only: cold. */
        if (op->opcode == VQP_OP_READ) {
            ret = vqp_post_data(vqp, pqp, op, vqp_op_off(vqp, opn), VQP_OP_READ,
                                0, idx, (uint64_t)idx << vqp->frag_shift,
                                sg.lkey, vqp_op_rkey(vqp, op, d), seq, 0);
        } else {
            ret =
                vqp_post_data(vqp, pqp, op, vqp_op_off(vqp, opn), VQP_OP_WRITE,
                              dqplb, idx, (uint64_t)idx << vqp->frag_shift,
                              sg.lkey, vqp_op_rkey(vqp, op, d), seq, 0);
        }
        if (ret < 0) {
            return (ucs_status_t)ret;
        }
        ++vqp->stats.frags_posted;
        return UCS_OK;
    case VQP_FRAG_WHOLE:
        /* Beyond 4 GiB the length must not wrap into a small one: clipped,
         * the WQE builder refuses it. */
        sg.length = (uint32_t)ucs_min(op->length, UINT32_MAX);
        /* Off the send QP (a replay, or the send QP died), an unsignaled
         * WQE may be its QP's last one for good: nothing would complete it
         * (covers are for the send QP), and every later operation would
         * wait for it. Data QPs signal every WQE. */
        flags = ((op->flags & VQP_SEND_SIGNALED) || (pqp != vqp->send_qp))
                    ? VQP_MLX5_SIGNALED
                    : 0;
        if (op->flags & VQP_SEND_INLINE) {
            flags |= VQP_MLX5_INLINE;
        }
        switch (op->opcode) {
        case VQP_OP_WRITE:
            ret = vqp_mlx5_post_write(&pqp->tx, &sg, 1, raddr,
                                      vqp_op_rkey(vqp, op, d), flags);
            break;
        case VQP_OP_WRITE_IMM:
            ret = vqp_mlx5_post_write_imm(&pqp->tx, &sg, 1, raddr,
                                          vqp_op_rkey(vqp, op, d),
                                          htobe32(op->imm), flags);
            break;
        case VQP_OP_READ:
            ret = vqp_mlx5_post_read(&pqp->tx, &sg, 1, raddr,
                                     vqp_op_rkey(vqp, op, d), flags);
            break;
        case VQP_OP_SEND:
            ret = vqp_mlx5_post_send(&pqp->tx, &sg, 1, flags);
            break;
        case VQP_OP_SEND_IMM:
            ret = vqp_mlx5_post_send_imm(&pqp->tx, &sg, 1, htobe32(op->imm),
                                         flags);
            break;
        default: /* the atomics */
            ret = vqp_post_atomic(vqp, pqp, opn, flags);
            break;
        }
        dqplb = 0;
        break;
    case VQP_FRAG_NOTIFY:
        ret   = vqp_mlx5_post_write_imm(&pqp->tx, NULL, 0, op->raddr,
                                        vqp_op_rkey(vqp, op, d), htobe32(op->imm),
                                        flags);
        dqplb = 0;
        break;
    case VQP_FRAG_FINAL:
        /* The receiver learns the operation's last sequence number from the
         * payload; the immediate is the user's. Inline: the payload lives on
         * this stack frame only. */
        payload = htobe32(seq | VQP_DQPLB_LAST);
        sg      = (vqp_mlx5_sge_t){(uintptr_t)&payload, sizeof(payload), 0};
        ret     = vqp_mlx5_post_send_imm(&pqp->tx, &sg, 1, htobe32(op->imm),
                                         flags | VQP_MLX5_INLINE);
        dqplb   = (vqp->lb == VQP_LB_DQPLB);
        break;
    case VQP_FRAG_PROBE:
        ret   = vqp_mlx5_post_write(&pqp->tx, NULL, 0, 0, 0, flags);
        dqplb = 0;
        break;
    default: /* VQP_FRAG_NOP */
        ret   = vqp_mlx5_post_nop(&pqp->tx, flags);
        dqplb = 0;
        break;
    }

    if (ucs_unlikely(ret < 0)) {
        return (ucs_status_t)ret;
    }
    /* VQP_FRAG_F_SEQ is fixed at post time so the completion path need not work
     * it out. */
    vqp_frag_push(vqp, pqp, opn, kind, idx, ret, dqplb);
    return UCS_OK;
}

/* Zero-length WRITE_IMM that stands in for a DQPLB sequence number whose
 * fragment failed for good (see VQP_DQPLB_ABORT). Not tracked as a fragment
 * of any operation: posted signaled on a QP with room, or not at all when
 * none has room, in which case the receiver's notifications stall, as the
 * whole virtual QP is then failing anyway. */
static void vqp_post_hole(vqp_t *vqp, const vqp_frag_t *f)
{
    uint32_t seq = vqp_frag_seq(vqp, f);
    uint32_t imm = seq | VQP_DQPLB_ABORT |
                   ((f->kind == VQP_FRAG_FINAL) ? VQP_DQPLB_END : 0);
    vqp_op_t *op   = vqp_frag_op(vqp, f);
    vqp_pqp_t *pqp = NULL;
    vqp_frag_t *frag;
    unsigned i;
    int ret;

    /* Rare, and the peer waits for it: it may take a cover entry. */
    for (i = 0; i < vqp->num_qps; ++i) {
        if (vqp_pqp_has_cover_room(&vqp->qps[i])) {
            pqp = &vqp->qps[i];
            break;
        }
    }
    if (pqp == NULL) {
        ucs_warn("vqp %p: no QP to report lost sequence number %u to the"
                 " peer",
                 vqp, seq);
        return;
    }
    ret = vqp_mlx5_post_write_imm(&pqp->tx, NULL, 0, op->raddr,
                                  vqp_op_rkey(vqp, op, pqp->dev), htobe32(imm),
                                  VQP_MLX5_SIGNALED);
    if (ret < 0) {
        ucs_warn("vqp %p: failed to post lost sequence number %u: %s", vqp, seq,
                 ucs_status_string((ucs_status_t)ret));
        return;
    }
    /* Tracked as a NOP of no operation so its CQE is accounted. */
    --pqp->cdev->credits;
    frag           = vqp_pqp_frag(pqp, pqp->frag_tail++);
    *frag          = *f;
    frag->op_off   = VQP_FRAG_NO_OP_OFF;
    frag->flags    = VQP_FRAG_F_NO_OP;
    frag->wqe      = (uint16_t)ret;
    frag->wqe_next = pqp->tx.pi;
    frag->kind     = VQP_FRAG_NOP;
}

static UCS_F_ALWAYS_INLINE void vqp_seq_acked(vqp_t *vqp, uint32_t seq)
{
    vqp->send_acked[seq & (vqp->send_window - 1)] = 1;
    while ((vqp->send_floor != vqp->send_seq) &&
           vqp->send_acked[vqp->send_floor & (vqp->send_window - 1)]) {
        vqp->send_acked[vqp->send_floor & (vqp->send_window - 1)] = 0;
        vqp->send_floor = (vqp->send_floor + 1) & VQP_DQPLB_SEQ_MASK;
    }
}

static UCS_F_ALWAYS_INLINE int vqp_seq_room(const vqp_t *vqp)
{
    return ((vqp->send_seq - vqp->send_floor) & VQP_DQPLB_SEQ_MASK) <
           vqp->send_window;
}

static UCS_F_ALWAYS_INLINE uint32_t vqp_seq_next(vqp_t *vqp)
{
    uint32_t seq = vqp->send_seq;

    vqp->send_seq = (seq + 1) & VQP_DQPLB_SEQ_MASK;
    return seq;
}

static void vqp_op_fail_unposted(vqp_t *vqp, vqp_op_t *op, ucs_status_t status)
{
    /* Of striped operations only a WRITE_IMM has a WQE after its data (the
     * DQPLB FINAL or the SPRAY notify); a WRITE or READ failed before all
     * its data went out would otherwise lose one WQE too many from its
     * count. Others: their one WQE, or a FLUSH's or PROBE's placeholder. */
    uint32_t tail =
        !(op->flags & VQP_OP_TAIL_POSTED) &&
        (!(op->flags & VQP_OP_STRIPED) || (op->opcode == VQP_OP_WRITE_IMM));
    uint32_t unposted = op->nfrags - op->posted + tail;

    if (op->status == UCS_OK) {
        op->status = status;
    }
    op->posted = op->nfrags;
    op->flags |= VQP_OP_TAIL_POSTED;
    op->remaining -= ucs_min(unposted, op->remaining);
}

/* The striped loop stops at fragment @a posted: the cursor back, the
 * credits taken for fragments that did not go given back. */
static UCS_F_ALWAYS_INLINE void
vqp_post_striped_stop(vqp_t *vqp, vqp_op_t *op, vqp_pqp_t *next,
                      vqp_cq_dev_t *cdev, int one_dev, uint32_t first,
                      uint32_t posted, uint32_t end)
{
    vqp->rr_qp = next;
    if (one_dev) {
        cdev->credits += (int32_t)(end - posted);
    }
    vqp->stats.frags_posted += posted - first;
    op->posted = posted;
}

/* The data fragments of striped operation @a op, then its DQPLB FINAL.
 * @a opcode, @a dqplb and @a one_dev are constants at every call, so each
 * opcode class gets its own loop, and a virtual QP on one device takes the
 * keys once per operation. Returns as vqp_dispatch_op. */
static UCS_F_ALWAYS_INLINE int vqp_post_striped(vqp_t *vqp, vqp_op_t *op,
                                                uint32_t opn, unsigned opcode,
                                                int dqplb, int one_dev)
{
    uint32_t first     = op->posted;
    uint32_t posted    = first;
    uint32_t nfrags    = op->nfrags;
    uint32_t end       = nfrags;
    uint64_t offset    = (uint64_t)posted << vqp->frag_shift;
    uint32_t lkey      = op->lkey;
    uint32_t rkey      = op->rkey;
    vqp_pqp_t *next    = vqp->rr_qp; /* the cursor, in a register */
    uint32_t op_off    = (uint32_t)((char *)op - (char *)vqp->ops);
    vqp_cq_dev_t *cdev = next->cdev;
    ucs_status_t status;
    vqp_pqp_t *pqp;
    uint32_t seq;
    int ret;

    vqp_prefetch_frags(next, nfrags - posted);
    if (one_dev) {
        /* All QPs share one CQ: take the credits of all fragments at once
         * (those of the fragments that do not go are given back). */
        if (ucs_unlikely(cdev->credits < (int32_t)(nfrags - posted))) {
            end = posted + (uint32_t)ucs_max(cdev->credits, 0);
        }
        cdev->credits -= (int32_t)(end - posted);
    }

    for (; posted < end; ++posted, offset += vqp->frag_size) {
        if (dqplb && !vqp_seq_room(vqp)) {
            goto out_wait;
        }
        pqp = vqp_pick_data_qp_at(vqp, &next, one_dev);
        if (pqp == NULL) {
            goto out_wait;
        }
        if (!one_dev) {
            lkey = vqp_op_lkey(vqp, op, pqp->dev);
            rkey = vqp_op_rkey(vqp, op, pqp->dev);
        }
        seq = dqplb ? vqp->send_seq : 0;
        ret = vqp_post_data(vqp, pqp, op, op_off, opcode, dqplb, posted, offset,
                            lkey, rkey, seq, one_dev);
        if (ucs_unlikely(ret < 0)) {
            vqp_post_striped_stop(vqp, op, next, cdev, one_dev, first, posted,
                                  end);
            if (ret == UCS_ERR_NO_RESOURCE) {
                return 0;
            }
            vqp_op_fail_unposted(vqp, op, (ucs_status_t)ret);
            return 1;
        }
        if (dqplb) {
            if (posted == 0) {
                op->first_seq = seq;
            }
            vqp_seq_next(vqp);
        }
    }
    vqp->rr_qp = next;
    vqp->stats.frags_posted += posted - first;
    op->posted = posted;
    if (one_dev && ucs_unlikely(posted < nfrags)) {
        /* out of CQ credits */
        return vqp_credit_short(next);
    }

    if (dqplb && !(op->flags & VQP_OP_TAIL_POSTED)) {
        if (!vqp_seq_room(vqp) || ((pqp = vqp_pick_data_qp(vqp)) == NULL)) {
            return 0;
        }
        status = vqp_post_frag(vqp, pqp, opn, VQP_FRAG_FINAL, op->nfrags);
        if (status == UCS_ERR_NO_RESOURCE) {
            return 0;
        } else if (status != UCS_OK) {
            vqp_op_fail_unposted(vqp, op, status);
            return 1;
        }
        vqp_seq_next(vqp);
        op->flags |= VQP_OP_TAIL_POSTED;
    }
    return 1;

out_wait:
    vqp_post_striped_stop(vqp, op, next, cdev, one_dev, first, posted, end);
    return 0;
}

static UCS_F_ALWAYS_INLINE int vqp_post_striped_opc(vqp_t *vqp, vqp_op_t *op,
                                                    uint32_t opn, int one_dev)
{
    switch (op->opcode) {
    case VQP_OP_READ:
        return vqp_post_striped(vqp, op, opn, VQP_OP_READ, 0, one_dev);
    case VQP_OP_WRITE_IMM:
        if (vqp->lb == VQP_LB_DQPLB) {
            return vqp_post_striped(vqp, op, opn, VQP_OP_WRITE_IMM, 1, one_dev);
        }
        /* SPRAY: plain WRITEs, the notify follows on its own QP */
        return vqp_post_striped(vqp, op, opn, VQP_OP_WRITE, 0, one_dev);
    default:
        return vqp_post_striped(vqp, op, opn, VQP_OP_WRITE, 0, one_dev);
    }
}

/* A virtual QP over several devices: keys per fragment, out of line. */
static UCS_F_NOINLINE int vqp_post_striped_multi(vqp_t *vqp, vqp_op_t *op,
                                                 uint32_t opn)
{
    return vqp_post_striped_opc(vqp, op, opn, 0);
}

static UCS_F_ALWAYS_INLINE int
vqp_post_striped_any(vqp_t *vqp, vqp_op_t *op, uint32_t opn, unsigned num_devs)
{
    if (ucs_likely(num_devs == 1)) {
        return vqp_post_striped_opc(vqp, op, opn, 1);
    }
    return vqp_post_striped_multi(vqp, op, opn);
}

static UCS_F_ALWAYS_INLINE int vqp_qp_covered(const vqp_pqp_t *pqp)
{
    /* Nothing in flight, or the newest WQE has a CQE coming. */
    return !pqp->alive || (pqp->frag_head == pqp->frag_tail) ||
           (pqp->tx.sig_left == pqp->tx.sig_every);
}

static UCS_F_ALWAYS_INLINE int vqp_send_qp_covered(const vqp_t *vqp)
{
    return vqp_qp_covered(vqp->send_qp);
}

/* A signaled NOP on @a pqp, whose rings the caller found room in. */
static int vqp_cover_qp_now(vqp_t *vqp, vqp_pqp_t *pqp)
{
    vqp_frag_t *frag;
    int ret;

    ret = vqp_mlx5_post_nop(&pqp->tx, VQP_MLX5_SIGNALED);
    if (ret < 0) {
        return 0;
    }
    --pqp->cdev->credits;
    frag           = vqp_pqp_frag(pqp, pqp->frag_tail++);
    frag->op_off   = VQP_FRAG_NO_OP_OFF;
    frag->idx      = 0;
    frag->kind     = VQP_FRAG_NOP;
    frag->flags    = VQP_FRAG_F_NO_OP;
    frag->wqe      = (uint16_t)ret;
    frag->wqe_next = pqp->tx.pi;
    return 1;
}

static int vqp_cover_qp(vqp_t *vqp, vqp_pqp_t *pqp)
{
    if (!vqp_pqp_has_slot(pqp)) {
        return 0; /* a signaled WQE is in flight: its CQE makes room */
    }
    if (!vqp_cdev_has_cover_credit(pqp->cdev)) {
        return vqp_cover_short(vqp);
    }
    return vqp_cover_qp_now(vqp, pqp);
}

/* QPs that died uncovered while their rings were full (vqp_pqp_fail): a
 * signaled WQE was among them (a ring signals every half), and its CQE makes
 * room. The NOP goes to a QP in ERROR, which flushes it with a CQE: it
 * completes the unsignaled WQEs that executed before the error, which no
 * flush reports. A dead QP's frag_limit is 0: the ring's size counts. */
static UCS_F_NOINLINE void vqp_post_owed_covers(vqp_t *vqp)
{
    vqp_pqp_t *pqp;
    unsigned i;
    int owed = 0;

    for (i = 0; i < vqp->num_pqps; ++i) {
        pqp = &vqp->qps[i];
        if (pqp->alive || (pqp->frag_head == pqp->frag_tail) ||
            (pqp->tx.sig_left == pqp->tx.sig_every)) {
            continue; /* covered */
        }
        if (!(VQP_RING_COUNT(pqp->frag_head, pqp->frag_tail) <=
              pqp->frag_mask) ||
            !((uint16_t)(pqp->tx.pi - pqp->tx.ci) <=
              (uint16_t)(pqp->tx.mask + 1 - VQP_MLX5_MAX_BB))) {
            owed = 1;
        } else if (!vqp_cdev_has_cover_credit(pqp->cdev)) {
            owed = 1;
            vqp_cover_short(vqp);
        } else if (!vqp_cover_qp_now(vqp, pqp)) {
            owed = 1;
        }
    }
    if (!owed) {
        vqp->slow_work &= ~VQP_SLOW_COVERS;
    }
}

/* Operations complete in posting order, and the send QP carries only
 * unstriped operations: when its newest WQE is unsignaled, no CQE will cover
 * it until another unstriped operation comes, and a striped operation posted
 * after it (on the data QPs) could never be reported. A signaled NOP that
 * belongs to no operation covers it. Returns 0 when the QP has no room for
 * the NOP yet (a signaled WQE is in flight then: the ring signals at least
 * every half of it). */
static int vqp_cover_send_qp(vqp_t *vqp)
{
    return vqp_cover_qp(vqp, vqp->send_qp);
}

/* A fenced inline operation was refused because earlier ones are still in
 * flight: make sure each of them has a CQE coming, or the refusal would
 * last forever. Later refusals find the QPs covered and post nothing. */
static void vqp_cover_all(vqp_t *vqp)
{
    unsigned i;

    for (i = 0; i < vqp->num_pqps; ++i) {
        if (!vqp_qp_covered(&vqp->qps[i])) {
            vqp_cover_qp(vqp, &vqp->qps[i]);
        }
    }
}

void vqp_cover_in_flight(vqp_t *vqp)
{
    if ((vqp->fatal == UCS_OK) && (vqp->op_head != vqp->op_disp)) {
        vqp_cover_all(vqp);
    }
}

/* Post what @a op still needs. Returns 1 when nothing of it is left to post
 * (the dispatch cursor moves on), 0 when it has to wait for room. */
static int vqp_dispatch_op(vqp_t *vqp, uint32_t opn)
{
    vqp_op_t *op = VQP_OP(vqp, opn);
    ucs_status_t status;
    vqp_pqp_t *pqp;
    unsigned i, count;
    int dead;

    if (ucs_unlikely(vqp->fatal != UCS_OK)) {
        vqp_op_fail_unposted(vqp, op, vqp->fatal);
        return 1;
    }

    if (op->opcode == VQP_OP_PROBE) {
        /* Every QP reaches the peer on its own, so a dead peer fails them
         * all at once (one WRITE would be replayed QP after QP, each taking
         * the whole retry time). */
        for (i = 0; i < vqp->num_pqps; ++i) {
            pqp = &vqp->qps[i];
            if (pqp->alive && !vqp_pqp_has_room(pqp)) {
                return 0;
            }
        }
        count = 0;
        for (i = 0; i < vqp->num_pqps; ++i) {
            pqp = &vqp->qps[i];
            if (pqp->alive &&
                (vqp_post_frag(vqp, pqp, opn, VQP_FRAG_PROBE, 0) == UCS_OK)) {
                ++count;
            }
        }
        op->remaining = count;
        op->flags |= VQP_OP_TAIL_POSTED;
        return 1;
    }

    if (op->opcode == VQP_OP_FLUSH) {
        /* A signaled NOP on every QP with WQEs in flight: its CQE covers all
         * earlier WQEs of that QP, signaled or not. */
        for (i = 0; i < vqp->num_pqps; ++i) {
            pqp = &vqp->qps[i];
            if (pqp->alive && (pqp->frag_head != pqp->frag_tail) &&
                !vqp_pqp_has_room(pqp)) {
                return 0;
            }
        }
        count = 0;
        for (i = 0; i < vqp->num_pqps; ++i) {
            pqp = &vqp->qps[i];
            if (pqp->alive && (pqp->frag_head != pqp->frag_tail) &&
                (vqp_post_frag(vqp, pqp, opn, VQP_FRAG_NOP, 0) == UCS_OK)) {
                ++count;
            }
        }
        op->remaining = count;
        op->flags |= VQP_OP_TAIL_POSTED;
        return 1;
    }

    if (!(op->flags & VQP_OP_STRIPED)) {
        pqp = vqp_pick_whole_qp(vqp, op, &dead);
        if (pqp == NULL) {
            if (dead) {
                vqp_op_fail_unposted(vqp, op, vqp->send_qp->error);
                return 1;
            }
            return 0;
        }
        status = vqp_post_frag(vqp, pqp, opn, VQP_FRAG_WHOLE, 0);
        if (status == UCS_ERR_NO_RESOURCE) {
            return 0;
        } else if (status != UCS_OK) {
            vqp_op_fail_unposted(vqp, op, status);
            return 1;
        }
        op->posted = 1;
        op->flags |= VQP_OP_TAIL_POSTED;
        return 1;
    }

    if ((op->posted == 0) && !vqp_send_qp_covered(vqp) &&
        !vqp_cover_send_qp(vqp)) {
        return 0;
    }
    return vqp_post_striped_any(vqp, op, opn, vqp->cq->num_devs);
}

/* SPRAY: once all data of an operation completed, its notify goes on the
 * notify QP; notifies leave in operation order. */
static void vqp_post_notifies(vqp_t *vqp)
{
    vqp_pqp_t *pqp = vqp->notify_qp;
    ucs_status_t status;
    vqp_op_t *op;

    for (; vqp->op_notify != vqp->op_disp; ++vqp->op_notify) {
        op = VQP_OP(vqp, vqp->op_notify);
        if (!(op->flags & VQP_OP_STRIPED) || (op->opcode != VQP_OP_WRITE_IMM) ||
            (op->flags & VQP_OP_TAIL_POSTED)) {
            continue;
        }
        if (op->remaining > 1) {
            return; /* data still in flight: later notifies wait */
        }
        if ((op->status != UCS_OK) || !pqp->alive) {
            /* Nothing arrived completely: no notification. */
            vqp_op_fail_unposted(
                vqp, op, (op->status != UCS_OK) ? op->status : pqp->error);
            continue;
        }
        if (!vqp_pqp_has_room(pqp)) {
            return;
        }
        status = vqp_post_frag(vqp, pqp, vqp->op_notify, VQP_FRAG_NOTIFY, 0);
        if (status == UCS_ERR_NO_RESOURCE) {
            return;
        } else if (status != UCS_OK) {
            vqp_op_fail_unposted(vqp, op, status);
            continue;
        }
        op->flags |= VQP_OP_TAIL_POSTED;
    }
}

/* A fenced operation waits for all earlier ones. Those whose last WQE on a
 * QP is unsignaled would wait for a CQE that only a later post brings: post
 * one signaled NOP on every such QP, once per fenced operation. The NOPs
 * belong to no operation (their completion only covers earlier WQEs). */
static void vqp_fence_arm(vqp_t *vqp, vqp_op_t *op)
{
    vqp_pqp_t *pqp;
    unsigned i;

    if (op->flags & VQP_OP_FENCE_ARMED) {
        return;
    }
    for (i = 0; i < vqp->num_pqps; ++i) {
        pqp = &vqp->qps[i];
        if (!pqp->alive || (pqp->frag_head == pqp->frag_tail)) {
            continue;
        }
        if (!vqp_pqp_has_room(pqp)) {
            return; /* tried again at the next dispatch */
        }
    }
    for (i = 0; i < vqp->num_pqps; ++i) {
        /* A QP whose newest WQE is signaled has its CQE coming anyway. */
        pqp = &vqp->qps[i];
        if (!vqp_qp_covered(pqp) && !vqp_cover_qp(vqp, pqp)) {
            ucs_warn("vqp %p: QP 0x%x: fence NOP refused", vqp, pqp->qpn);
        }
    }
    op->flags |= VQP_OP_FENCE_ARMED;
}

static void vqp_dispatch(vqp_t *vqp)
{
    vqp_frag_t *f;
    vqp_pqp_t *pqp;
    vqp_op_t *op;
    int dead;

    /* Replays first: they belong to older operations. */
    while (vqp->replay_head != vqp->replay_tail) {
        f  = &vqp->replay[vqp->replay_head & vqp->replay_mask];
        op = vqp_frag_op(vqp, f);
        if (vqp->fatal != UCS_OK) {
            if (op->status == UCS_OK) {
                op->status = vqp->fatal;
            }
            --op->remaining;
        } else {
            pqp = (f->kind == VQP_FRAG_WHOLE)
                      ? vqp_pick_whole_qp(vqp, op, &dead)
                      : vqp_pick_data_qp(vqp);
            if ((pqp == NULL) || (vqp_post_frag(vqp, pqp, vqp_frag_opn(f),
                                                f->kind, f->idx) != UCS_OK)) {
                break;
            }
            ++vqp->stats.frags_replayed;
        }
        if (++vqp->replay_head == vqp->replay_tail) {
            /* The last replay went: the fast path may take new operations
             * again, unless none may (fatal, set when no data QP is left). */
            vqp->fast_ops = (vqp->fatal == UCS_OK) ? vqp->fast_ops_up : 0;
        }
    }

    while (vqp->op_disp != vqp->op_tail) {
        op = VQP_OP(vqp, vqp->op_disp);
        if ((op->flags & VQP_SEND_FENCE) && (vqp->op_head != vqp->op_disp)) {
            /* Starts only after everything before it completed; earlier
             * unsignaled WQEs need a CQE to cover them. */
            vqp_fence_arm(vqp, op);
            break;
        }
        if (!vqp_dispatch_op(vqp, vqp->op_disp)) {
            break;
        }
        ++vqp->op_disp;
    }

    if (vqp->notify_qp != NULL) {
        vqp_post_notifies(vqp);
    }
}

/* The device returned the old value big-endian, in the operand's size, into
 * the operation's own slot (a user buffer shared by several atomics in
 * flight would be overwritten before we got to it). */
static UCS_F_ALWAYS_INLINE void
vqp_atomic_result(const vqp_t *vqp, const vqp_op_t *op, uint32_t opn)
{
    const uint64_t *slot = &vqp->atomic_res[opn & vqp->op_mask];
    uint32_t r32;

    /* A ConnectX in 8-byte host-endianness mode (what Linux selects when
     * it can) writes 8-byte values in host order. */
    if (op->length == sizeof(uint64_t)) {
        *(uint64_t *)(uintptr_t)op->laddr =
            (vqp->atomic_be & sizeof(uint64_t)) ? be64toh(*slot) : *slot;
    } else {
        memcpy(&r32, slot, sizeof(r32));
        *(uint32_t *)(uintptr_t)op->laddr =
            (vqp->atomic_be & sizeof(uint32_t)) ? be32toh(r32) : r32;
    }
}

/* The report loop for @a cb, the virtual QP's callback (a constant at each
 * call: the callback and the poll mode each get their own loop, without a
 * test of comp_cb per operation). What a callback can change (the cursors:
 * it may post, or report further down) is read again after each call. */
static UCS_F_ALWAYS_INLINE void vqp_report_loop(vqp_t *vqp, vqp_comp_cb_t cb)
{
    vqp_wc_t tmp, *wc;
    uint16_t sf;
    vqp_op_t *op;

    /* The fields no operation changes, once: a callback gets a const
     * pointer and must not write through it (vqp_comp_cb_t). */
    tmp.flags = 0;
    tmp.imm   = 0;
    tmp.vqp   = vqp;
    while (vqp->op_head != vqp->op_disp) {
        op = VQP_OP(vqp, vqp->op_head);
        if (op->remaining != 0) {
            break;
        }
        sf = op->status_flags;
        ++vqp->op_head; /* and so ops_completed (vqp_query_stats) */
        if (ucs_unlikely(sf & VQP_OP_SF(0xff, VQP_OP_ATOMIC))) {
            /* failed, or an atomic: one test for both in the common case */
            if ((op->flags & VQP_OP_ATOMIC) && (op->status == UCS_OK)) {
                vqp_atomic_result(vqp, op, vqp->op_head - 1);
            }
            if (!(sf & VQP_OP_SF(0xff, VQP_SEND_SIGNALED))) {
                continue;
            }
        } else if (!(sf & VQP_OP_SF(0, VQP_SEND_SIGNALED))) {
            continue;
        }
        if (cb == NULL) {
            /* Poll mode: built where the user reads it (one copy). */
            wc  = vqp_wc_slot(vqp, 0);
            *wc = tmp;
        } else {
            wc = &tmp;
        }
        wc->wr_id    = op->wr_id;
        wc->status   = VQP_OP_SF_STATUS(sf);
        wc->opcode   = op->opcode;
        wc->byte_len = op->length;
        if (cb != NULL) {
            cb(vqp->comp_arg, wc);
        }
    }
}

/* Report finished operations at the head, in posting order. Returns
 * non-zero when any was. */
static int vqp_report(vqp_t *vqp)
{
    uint32_t head = vqp->op_head;

    if (vqp->comp_cb != NULL) {
        vqp_report_loop(vqp, vqp->comp_cb);
    } else {
        vqp_report_loop(vqp, NULL);
    }
    if ((int32_t)(vqp->op_notify - vqp->op_head) < 0) {
        vqp->op_notify = vqp->op_head;
    }
    return head != vqp->op_head;
}

/* The rare work of vqp_advance: owed covers first; the failure callback
 * last, since it may destroy the virtual QP. */
static UCS_F_NOINLINE void vqp_advance_slow(vqp_t *vqp)
{
    ucs_status_t status;

    if (vqp->slow_work & VQP_SLOW_COVERS) {
        vqp_post_owed_covers(vqp);
    }
    if (vqp->slow_work & VQP_SLOW_FAILED) {
        vqp->slow_work &= ~VQP_SLOW_FAILED;
        status           = vqp->fail_status;
        vqp->fail_status = UCS_OK;
        if (!vqp->canceling && (vqp->fail_cb != NULL)) {
            vqp->fail_cb(vqp->comp_arg, status);
        }
    }
}

/* After completions: report, and when that unblocked a fenced operation,
 * dispatch again. */
void vqp_advance(vqp_t *vqp)
{
    /* Nothing to dispatch in the common case: skip the call. */
    if ((vqp->replay_head != vqp->replay_tail) ||
        (vqp->op_disp != vqp->op_tail) || (vqp->notify_qp != NULL)) {
        vqp_dispatch(vqp);
    }
    while (vqp_report(vqp) && (vqp->op_disp != vqp->op_tail)) {
        vqp_dispatch(vqp);
    }
    if (ucs_unlikely(vqp->slow_work)) {
        vqp_advance_slow(vqp); /* last: it may destroy the virtual QP */
    }
}

static UCS_F_ALWAYS_INLINE int vqp_status_is_transport(ucs_status_t status)
{
    /* Flushed because its QP failed, or the path to the peer broke: another
     * QP may well succeed. Access and protocol errors would fail there too. */
    return (status == UCS_ERR_CANCELED) || (status == UCS_ERR_ENDPOINT_TIMEOUT);
}

static UCS_F_ALWAYS_INLINE void vqp_mark_dirty(vqp_t *vqp);

/* @a why: what the device said (an error CQE's syndrome), or NULL. */
static void vqp_pqp_fail(vqp_pqp_t *pqp, ucs_status_t status, const char *why)
{
    vqp_t *vqp = pqp->vqp;
    vqp_frag_t *f;
    vqp_op_t *op;
    unsigned i;

    if (!pqp->alive) {
        return;
    }
    /* A WQE that completed unsignaled gets no CQE from the flush below:
     * when the newest tracked one is such, a signaled NOP covers it (it
     * completes, flushed or not); later if its rings are full now. */
    if (!vqp_qp_covered(pqp) && !vqp_cover_qp(vqp, pqp)) {
        vqp->slow_work |= VQP_SLOW_COVERS;
    }
    pqp->alive      = 0;
    pqp->frag_limit = 0;
    pqp->error      = status;
    if (pqp->role == VQP_ROLE_DATA) {
        --vqp->alive;
    }
    ucs_log(vqp->canceling ? UCS_LOG_LEVEL_DEBUG : vqp->fail_log_level,
            "vqp %p: QP 0x%x failed (%s%s%s): excluded, %u of %u data QPs"
            " left",
            vqp, pqp->qpn, ucs_status_string(status), (why != NULL) ? ": " : "",
            (why != NULL) ? why : "", vqp->alive, vqp->num_qps);
    /* Make sure every WQE still queued comes back (flushed). */
    vqp_dev_qp_set_error(pqp->dev_qp);
    if (pqp == vqp->send_qp) {
        /* SENDs and atomics have no other QP: the user hears of it, also
         * when no operation failed with it. (No data QP left fails the
         * send QP too, below.) */
        vqp->fail_status = status;
        vqp->slow_work |= VQP_SLOW_FAILED;
        vqp_mark_dirty(vqp);
    }

    if ((vqp->alive == 0) && (vqp->fatal == UCS_OK)) {
        vqp->fatal    = status;
        vqp->fast_ops = 0;
        /* Replays have nowhere to go: their operations fail now. */
        while (vqp->replay_head != vqp->replay_tail) {
            f  = &vqp->replay[vqp->replay_head++ & vqp->replay_mask];
            op = vqp_frag_op(vqp, f);
            if (op->status == UCS_OK) {
                op->status = status;
            }
            --op->remaining;
        }
        vqp_recv_cancel_notifies(vqp, status);
        /* The send (and notify) QP go too: no post is taken any more, not
         * even a FLUSH, so an unsignaled last WQE there would never
         * complete; flushed, every operation in flight ends, once. */
        for (i = 0; i < vqp->num_pqps; ++i) {
            vqp_pqp_fail(&vqp->qps[i], status, NULL);
        }
    }
}

/* Whole operation @a op's WQE at @a wqe on @a pqp failed and is to be
 * replayed: its addresses, keys and immediate into the record, which the
 * lean path left without them. The WQE is still in the SQ: a dead QP posts
 * nothing. On device 0 only, whose keys are the record's (the send QP is
 * there; a replay on another device's QP has its record complete). */
static void vqp_op_from_wqe(const vqp_pqp_t *pqp, vqp_op_t *op, uint16_t wqe)
{
    vqp_mlx5_sge_t sg;
    __be32 imm;

    if (pqp->dev != 0) {
        return;
    }
    vqp_mlx5_txwq_read_rdma(&pqp->tx, wqe, &op->raddr, &op->rkey, &sg, &imm);
    op->laddr = sg.addr;
    op->lkey  = sg.lkey;
    op->imm   = be32toh(imm);
}

static void vqp_frag_done(vqp_t *vqp, vqp_pqp_t *pqp, vqp_frag_t *f,
                          ucs_status_t status)
{
    vqp_op_t *op;
    int dqplb;

    if (f->op_off == VQP_FRAG_NO_OP_OFF) {
        return; /* a hole filler: no operation waits for it */
    }
    op = vqp_frag_op(vqp, f);
    if (ucs_likely(status == UCS_OK)) {
        if (f->flags & VQP_FRAG_F_SEQ) {
            vqp_seq_acked(vqp, vqp_frag_seq(vqp, f));
        }
        --op->remaining;
        return;
    }
    dqplb = f->flags & VQP_FRAG_F_SEQ;

    /* An inline operation's data was only in its WQE (the caller's buffer
     * was free at return): it cannot be sent again. */
    if ((vqp->fatal == UCS_OK) && vqp_status_is_transport(status) &&
        ((f->kind == VQP_FRAG_DATA) || (f->kind == VQP_FRAG_FINAL) ||
         ((f->kind == VQP_FRAG_WHOLE) && vqp_op_is_idempotent(op) &&
          !(op->flags & VQP_SEND_INLINE)))) {
        if (f->kind == VQP_FRAG_WHOLE) {
            vqp_op_from_wqe(pqp, op, f->wqe);
        }
        vqp->replay[vqp->replay_tail++ & vqp->replay_mask] = *f;
        vqp->fast_ops = 0; /* until the replays are posted (vqp_dispatch) */
        return;
    }

    if (f->kind == VQP_FRAG_NOP) {
        /* A flush's NOP: the WQEs it covered are accounted for themselves. */
        --op->remaining;
        return;
    }
    if (f->kind == VQP_FRAG_PROBE) {
        /* One QP failing says little; the peer is gone when no data QP is
         * left (vqp->fatal) or the send QP died (no SEND can reach it). */
        if ((op->status == UCS_OK) &&
            ((vqp->fatal != UCS_OK) || !vqp->send_qp->alive)) {
            op->status = (vqp->fatal != UCS_OK) ? vqp->fatal : status;
        }
        --op->remaining;
        return;
    }
    if (op->status == UCS_OK) {
        op->status = status;
    }
    if (dqplb && (vqp->fatal == UCS_OK)) {
        /* The receiver must not wait for this number forever. */
        vqp_post_hole(vqp, f);
        vqp_seq_acked(vqp, vqp_frag_seq(vqp, f));
    }
    --op->remaining;
}

/* A requester CQE (success or error) @a cqe for the WQE it names: it and
 * every earlier WQE of the QP are done; earlier ones succeeded. */
static void vqp_tx_cqe(vqp_pqp_t *pqp, const struct mlx5_cqe64 *cqe,
                       ucs_status_t status)
{
    uint16_t wqe_counter = vqp_mlx5_cqe_wqe_counter(cqe);
    vqp_t *vqp           = pqp->vqp;
    vqp_frag_t *f;

    if (ucs_unlikely(status != UCS_OK)) {
        vqp_pqp_fail(pqp, status, vqp_mlx5_cqe_error_str(cqe));
    }
    vqp_mlx5_txwq_complete(&pqp->tx, wqe_counter);
    while (pqp->frag_head != pqp->frag_tail) {
        f = vqp_pqp_frag(pqp, pqp->frag_head++);
        ++pqp->cdev->credits;
        if (f->wqe == wqe_counter) {
            vqp_frag_done(vqp, pqp, f, status);
            return;
        }
        vqp_frag_done(vqp, pqp, f, UCS_OK);
    }
    ucs_error("vqp %p: QP 0x%x: CQE for WQE %u that was not posted", vqp,
              pqp->qpn, wqe_counter);
}

/* Every WQE of @a pqp up to the one at @a wqe_counter succeeded: the common
 * case of vqp_tx_cqe and vqp_frag_done without their error handling.
 * Returns the WQEs it completed: their CQ credits, which the caller gives
 * back once per batch. */
static UCS_F_ALWAYS_INLINE uint32_t vqp_tx_cqe_ok(vqp_t *vqp, vqp_pqp_t *pqp,
                                                  uint16_t wqe_counter)
{
    uint32_t head = pqp->frag_head, done;
    vqp_frag_t *f;

    while (head != pqp->frag_tail) {
        f = vqp_pqp_frag(pqp, head++);
        if (ucs_likely(f->flags == 0)) {
            --vqp_frag_op(vqp, f)->remaining;
        } else if (!(f->flags & VQP_FRAG_F_NO_OP)) {
            vqp_seq_acked(vqp, vqp_frag_seq(vqp, f));
            --vqp_frag_op(vqp, f)->remaining;
        }
        if (f->wqe == wqe_counter) {
            pqp->tx.ci     = f->wqe_next;
            done           = head - pqp->frag_head;
            pqp->frag_head = head;
            return done;
        }
    }
    vqp_mlx5_txwq_complete(&pqp->tx, wqe_counter);
    done           = head - pqp->frag_head;
    pqp->frag_head = head;
    ucs_error("vqp %p: QP 0x%x: CQE for WQE %u that was not posted", vqp,
              pqp->qpn, wqe_counter);
    return done;
}

/* On the CQ's list of virtual QPs to advance at the end of the poll batch
 * (once each). */
static UCS_F_ALWAYS_INLINE void vqp_mark_dirty(vqp_t *vqp)
{
    if (!vqp->dirty) {
        vqp->dirty                           = 1;
        vqp->cq->dirty[vqp->cq->num_dirty++] = vqp;
    }
}

/* Returns the CQ credits of a successful requester CQE (see vqp_tx_cqe_ok);
 * the other kinds give theirs back themselves, and may run user code
 * (receives delivered, operations failed): they set *@a pqp_qpn to
 * UINT32_MAX, so that the poll looks the next CQE's QP up in the table
 * again (a callback may have destroyed a QP, and its QPN gone to a new
 * one). */
static UCS_F_ALWAYS_INLINE uint32_t vqp_handle_cqe(vqp_pqp_t *pqp,
                                                   struct mlx5_cqe64 *cqe,
                                                   uint8_t op_own,
                                                   uint32_t *pqp_qpn)
{
    vqp_t *vqp    = pqp->vqp;
    uint32_t done = 0;
    ucs_status_t status;
    uint8_t opcode;

    if (ucs_likely(vqp_mlx5_op_own_is_req_ok(op_own))) {
        done = vqp_tx_cqe_ok(vqp, pqp, vqp_mlx5_cqe_wqe_counter(cqe));
    } else {
        /* The CQE's own kind (requester / responder, error or not) is
         * defined even on errors; the work request's opcode is not, and is
         * never used. */
        opcode = vqp_mlx5_cqe_opcode(cqe);
        status = vqp_mlx5_cqe_status(cqe);
        if ((opcode == MLX5_CQE_REQ) || (opcode == MLX5_CQE_REQ_ERR)) {
            vqp_tx_cqe(pqp, cqe, status);
        } else {
            vqp_recv_cqe(pqp, cqe, status);
        }
        *pqp_qpn = UINT32_MAX;
    }
    vqp_mark_dirty(vqp);
    return done;
}

unsigned vqp_cq_poll_dev(vqp_cq_t *cq, vqp_cq_dev_t *cdev)
{
    uint32_t credits = 0;
    /* The QP of the last CQE: CQEs come in runs of one QP (a device works
     * QP after QP; whole operations all go to the send QP), so the table
     * is read once per run. Only while no user code ran since the lookup
     * (vqp_handle_cqe), so the QP is still the one registered. */
    uint32_t pqp_qpn = UINT32_MAX;
    vqp_pqp_t *pqp   = NULL;
    struct mlx5_cqe64 *cqe;
    unsigned count;
    uint8_t op_own;
    uint32_t qpn;
    vqp_t *vqp;

    /* Bounded: a busy device must not keep its caller here (T9). */
    for (count = 0; count < cq->max_poll; ++count) {
        cqe = vqp_mlx5_cq_poll_own(&cdev->cq, &op_own);
        if (cqe == NULL) {
            break;
        }

        qpn = vqp_mlx5_cqe_qpn(cqe);
        if (ucs_unlikely(qpn != pqp_qpn)) {
            pqp = cdev->qpn_table[qpn >> VQP_QPN_LOW_BITS]
                                 [qpn & (VQP_QPN_LOW_SIZE - 1)];
            if (ucs_unlikely(pqp == NULL)) {
                /* A QP destroyed with CQEs still queued (neutralised to QPN
                 * 0 by vqp_cq_retire, which kept its entry). */
                /* The QPN read from the CQE again, not from qpn: kept live
                 * for this rare case, qpn was spilled to the stack on every
                 * CQE (and one read stored into a local is merged back). */
                ucs_debug("vqp cq: CQE of unknown QPN 0x%x dropped",
                          vqp_mlx5_cqe_qpn(cqe));
                cdev->credits += (vqp_mlx5_cqe_qpn(cqe) == 0);
                pqp_qpn = UINT32_MAX;
                continue;
            }
            pqp_qpn = qpn;
        }
        credits += vqp_handle_cqe(pqp, cqe, op_own, &pqp_qpn);
    }
    if (count != 0) {
        vqp_mlx5_cq_update_ci(&cdev->cq);
        cdev->credits += (int32_t)credits; /* before anyone posts again */
    }
    /* Dispatch and reporting once per virtual QP per batch. */
    while (cq->num_dirty > 0) {
        vqp        = cq->dirty[--cq->num_dirty];
        vqp->dirty = 0;
        vqp_advance(vqp);
    }
    if (ucs_unlikely(!ucs_list_is_empty(&cq->credit_waiters))) {
        vqp_cq_credit_progress(cq, count);
    }
    return count;
}

void vqp_cq_credit_progress(vqp_cq_t *cq, unsigned polled)
{
    ucs_list_link_t waiters;
    unsigned i;
    vqp_t *vqp;
    int room = 0;

    if (cq->cover_pending && (polled == 0)) {
        /* No CQE came: the WQEs holding the credits may all be unsignaled
         * ones that only a later post on their QP would complete, and that
         * post may never come. A signaled NOP on each such QP (from the
         * entries reserved for it) makes them complete. Once per episode:
         * a covered QP stays covered until it gets credits again. */
        cq->cover_pending = 0;
        ucs_list_for_each(vqp, &cq->vqps, cq_list)
        {
            vqp_cover_all(vqp);
        }
    }
    for (i = 0; i < cq->num_devs; ++i) {
        room |= (cq->devs[i].credits > 0);
    }
    if (!room) {
        return;
    }
    /* Each waiter tries again once; one still short queues itself anew. */
    ucs_list_head_init(&waiters);
    ucs_list_splice_tail(&waiters, &cq->credit_waiters);
    ucs_list_head_init(&cq->credit_waiters);
    while (!ucs_list_is_empty(&waiters)) {
        vqp              = ucs_list_extract_head(&waiters, vqp_t, credit_list);
        vqp->credit_wait = 0;
        vqp_advance(vqp);
    }
}

static ucs_status_t vqp_check_send(const vqp_t *vqp, const vqp_send_wr_t *wr)
{
    if (wr->flags &
        ~(unsigned)(VQP_SEND_SIGNALED | VQP_SEND_FENCE | VQP_SEND_INLINE)) {
        ucs_error("vqp %p: unknown send flags 0x%x", vqp, wr->flags);
        return UCS_ERR_INVALID_PARAM;
    }
    switch (wr->opcode) {
    case VQP_OP_WRITE:
    case VQP_OP_WRITE_IMM:
    case VQP_OP_READ:
    case VQP_OP_FLUSH:
    case VQP_OP_PROBE:
        break;
    case VQP_OP_SEND:
    case VQP_OP_SEND_IMM:
        if (wr->length > UINT32_MAX) {
            ucs_error("vqp %p: SEND of %lu bytes: at most 4 GiB - 1", vqp,
                      wr->length);
            return UCS_ERR_INVALID_PARAM;
        }
        break;
    case VQP_OP_ATOMIC_FA:
    case VQP_OP_ATOMIC_CS:
    case VQP_OP_ATOMIC_SWAP:
    case VQP_OP_ATOMIC_AND:
    case VQP_OP_ATOMIC_OR:
    case VQP_OP_ATOMIC_XOR:
        if (((wr->length != 8) && (wr->length != 4)) ||
            (wr->remote_addr & (wr->length - 1)) ||
            (wr->local_addr & (wr->length - 1))) {
            ucs_error("vqp %p: atomic needs 8 or 4 bytes at local and remote"
                      " addresses aligned to that size (length %lu, local"
                      " 0x%lx, remote 0x%lx)",
                      vqp, wr->length, wr->local_addr, wr->remote_addr);
            return UCS_ERR_INVALID_PARAM;
        }
        break;
    default:
        ucs_error("vqp %p: opcode %d cannot be posted", vqp, wr->opcode);
        return UCS_ERR_INVALID_PARAM;
    }
    if (!vqp->connected) {
        ucs_error("vqp %p: post before connect", vqp);
        return UCS_ERR_NOT_CONNECTED;
    }
    if ((wr->opcode == VQP_OP_WRITE_IMM) && vqp->peer_no_imm) {
        ucs_error("vqp %p: WRITE_IMM to a peer that receives no"
                  " notifications (created with max_recvs 0)",
                  vqp);
        return UCS_ERR_UNSUPPORTED;
    }
    if ((wr->flags & VQP_SEND_INLINE) && (wr->opcode == VQP_OP_WRITE_IMM) &&
        (vqp->num_qps > 1)) {
        ucs_error("vqp %p: WRITE_IMM over several QPs cannot be inline", vqp);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((wr->flags & VQP_SEND_INLINE) &&
        (wr->length > vqp->qps[0].tx.max_inline)) {
        ucs_error("vqp %p: inline %lu bytes, at most %u", vqp, wr->length,
                  vqp->qps[0].tx.max_inline);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

/* The WQE of a whole operation: a WRITE / WRITE_IMM / READ, or when @a inl
 * (a constant at every call) an inline WRITE / SEND / SEND_IMM; @a imm in
 * host order. Returns the mlx5 post's result. */
static UCS_F_ALWAYS_INLINE int vqp_post_whole_wqe(vqp_mlx5_txwq_t *tx,
                                                  const vqp_mlx5_sge_t *sg,
                                                  unsigned opcode, int inl,
                                                  uint64_t raddr, uint32_t rkey,
                                                  uint32_t imm, unsigned flags)
{
    if (opcode == VQP_OP_WRITE) {
        return vqp_mlx5_post_write(tx, sg, 1, raddr, rkey, flags);
    } else if (inl && (opcode == VQP_OP_SEND)) {
        return vqp_mlx5_post_send(tx, sg, 1, flags);
    } else if (inl) { /* VQP_OP_SEND_IMM */
        return vqp_mlx5_post_send_imm(tx, sg, 1, htobe32(imm), flags);
    } else if (opcode == VQP_OP_READ) {
        return vqp_mlx5_post_read(tx, sg, 1, raddr, rkey, flags);
    }
    /* VQP_OP_WRITE_IMM */
    return vqp_mlx5_post_write_imm(tx, sg, 1, raddr, rkey, htobe32(imm), flags);
}

/* A whole unstriped operation on @a pqp, without the generic switch: a
 * WRITE / WRITE_IMM / READ, or when @a inl (a constant at every call: the
 * WQE's size and layout then fold at compile time) an inline WRITE / SEND /
 * SEND_IMM (vqp_inline_fast). The caller checked room (vqp_pqp_has_room),
 * so the WQE builder does not again. Returns as vqp_dispatch_op. */
static UCS_F_ALWAYS_INLINE int vqp_post_whole_rdma(vqp_t *vqp, vqp_pqp_t *pqp,
                                                   vqp_op_t *op, uint32_t opn,
                                                   int inl)
{
    unsigned d        = pqp->dev;
    vqp_mlx5_sge_t sg = {op->laddr, (uint32_t)op->length,
                         vqp_op_lkey(vqp, op, d)};
    unsigned flags = ((op->flags & VQP_SEND_SIGNALED) ? VQP_MLX5_SIGNALED : 0) |
                     (inl ? VQP_MLX5_INLINE : 0) | VQP_MLX5_HAS_ROOM;
    int ret;

    if (ucs_unlikely(op->length > UINT32_MAX)) {
        /* Let the WQE builder refuse it with its message. */
        return vqp_dispatch_op(vqp, opn);
    }
    ret = vqp_post_whole_wqe(&pqp->tx, &sg, op->opcode, inl, op->raddr,
                             vqp_op_rkey(vqp, op, d), op->imm, flags);
    if (ucs_unlikely(ret < 0)) {
        if (ret == UCS_ERR_NO_RESOURCE) {
            return 0;
        }
        vqp_op_fail_unposted(vqp, op, (ucs_status_t)ret);
        return 1;
    }
    vqp_frag_push(vqp, pqp, opn, VQP_FRAG_WHOLE, 0, ret, 0);
    op->posted = 1;
    op->flags |= VQP_OP_TAIL_POSTED;
    return 1;
}

/* The operation record: only what dispatch, replay and reporting read.
 * @a num_devs is the CQ's, read by the caller before any store. */
static UCS_F_ALWAYS_INLINE vqp_op_t *
vqp_op_fill(vqp_t *vqp, const vqp_send_wr_t *wr, unsigned num_devs)
{
    vqp_op_t *op = VQP_OP(vqp, vqp->op_tail);
    vqp_op_ext_t *ext;

    op->wr_id  = wr->wr_id;
    op->laddr  = wr->local_addr;
    op->length = wr->length;
    op->raddr  = wr->remote_addr;
    op->lkey   = wr->lkey[0];
    op->rkey   = wr->rkey[0];
    if (ucs_unlikely(num_devs > 1)) {
        ext = VQP_OP_EXT(vqp, vqp->op_tail);
        memcpy(ext->lkey, &wr->lkey[1], sizeof(ext->lkey));
        memcpy(ext->rkey, &wr->rkey[1], sizeof(ext->rkey));
    }
    op->imm       = wr->imm;
    op->status    = UCS_OK;
    op->opcode    = wr->opcode;
    op->flags     = wr->flags;
    op->posted    = 0;
    op->first_seq = 0;
    return op;
}

/* Striped: multi-QP WRITE_IMM always takes the scheme's form (the receiver
 * tells notifications apart only by where and how they arrive); WRITE and
 * READ from the threshold on. */
static UCS_F_ALWAYS_INLINE int vqp_op_stripes(const vqp_t *vqp, unsigned opcode,
                                              uint64_t length)
{
    return (vqp->num_qps > 1) &&
           ((opcode == VQP_OP_WRITE_IMM) || (length >= vqp->stripe_threshold));
}

/* From the request, not the record just written: no loads back. */
static UCS_F_ALWAYS_INLINE void vqp_op_set_striped(vqp_t *vqp, vqp_op_t *op,
                                                   const vqp_send_wr_t *wr)
{
    uint32_t nfrags =
        (wr->length == 0) ? 1 : ((wr->length - 1) >> vqp->frag_shift) + 1;

    op->flags     = (wr->flags & ~VQP_SEND_INLINE) | VQP_OP_STRIPED;
    op->nfrags    = nfrags;
    op->remaining = nfrags + (wr->opcode == VQP_OP_WRITE_IMM);
}

/* Every check and case: inline data, fences, flushes, SENDs and atomics,
 * operations queued behind others, dead QPs. */
/* An inline operation can go into a WQE now. */
static UCS_F_ALWAYS_INLINE int vqp_inline_room(const vqp_t *vqp, unsigned flags)
{
    return (vqp->op_disp == vqp->op_tail) && vqp->send_qp->alive &&
           vqp_pqp_has_room(vqp->send_qp) &&
           (!(flags & VQP_SEND_FENCE) || (vqp->op_head == vqp->op_disp));
}

/* An inline WRITE or SEND the fast path can take: small enough for the send
 * QP's WQEs, which have room now with nothing waiting (it must go in this
 * call), and not one the striping rule would cut. */
static UCS_F_ALWAYS_INLINE int vqp_inline_fast(const vqp_t *vqp,
                                               const vqp_send_wr_t *wr)
{
    return (vqp->fast_ops != 0) &&
           ((wr->opcode == VQP_OP_WRITE) || (wr->opcode == VQP_OP_SEND) ||
            (wr->opcode == VQP_OP_SEND_IMM)) &&
           (wr->length <= vqp->send_qp->tx.max_inline) &&
           !vqp_op_stripes(vqp, VQP_OP_WRITE, wr->length) &&
           vqp_pqp_has_room(vqp->send_qp);
}

static ucs_status_t vqp_post_send_slow(vqp_t *vqp, const vqp_send_wr_t *wr)
{
    ucs_status_t status;
    vqp_op_t *op;

    status = vqp_check_send(vqp, wr);
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }
    if (ucs_unlikely(vqp->fatal != UCS_OK)) {
        return vqp->fatal;
    }
    if (ucs_unlikely(!vqp->send_qp->alive) &&
        !((wr->opcode == VQP_OP_WRITE) || (wr->opcode == VQP_OP_READ) ||
          (wr->opcode == VQP_OP_WRITE_IMM) || (wr->opcode == VQP_OP_FLUSH) ||
          (wr->opcode == VQP_OP_PROBE))) {
        /* SENDs and atomics have one QP; it is gone. */
        return vqp->send_qp->error;
    }
    if (ucs_unlikely(!vqp->send_qp->alive) && (wr->flags & VQP_SEND_INLINE)) {
        /* Inline data goes into a WQE of the send QP within this call: no
         * completion will ever make room for it there. */
        return vqp->send_qp->error;
    }
    if ((wr->opcode == VQP_OP_FLUSH) && !(wr->flags & VQP_SEND_SIGNALED) &&
        (vqp->op_tail != vqp->op_head) &&
        (VQP_OP(vqp, vqp->op_tail - 1)->opcode == VQP_OP_FLUSH)) {
        /* Nothing was posted since the last flush, which will already cover
         * everything: polling callers need not add one per poll. */
        return UCS_OK;
    }
    if (ucs_unlikely(vqp_send_avail(vqp) == 0)) {
        /* The ring may be full of unsignaled operations, which only a
         * later signaled WQE completes: the caller's retry would wait for
         * good. */
        vqp_cover_in_flight(vqp);
        return UCS_ERR_NO_RESOURCE;
    }
    if ((wr->flags & VQP_SEND_INLINE) && !vqp_inline_room(vqp, wr->flags)) {
        /* The data lives in the caller's buffer only during this call: it
         * must go into a WQE now or not at all. */
        if ((wr->flags & VQP_SEND_FENCE) && (vqp->op_head != vqp->op_disp)) {
            vqp_cover_all(vqp);
        }
        return UCS_ERR_NO_RESOURCE;
    }

    op = vqp_op_fill(vqp, wr, vqp->cq->num_devs);
    if (vqp_opcode_is_atomic(wr->opcode)) {
        VQP_OP_EXT(vqp, vqp->op_tail)->compare_add = wr->compare_add;
        VQP_OP_EXT(vqp, vqp->op_tail)->swap        = wr->swap;
        op->flags |= VQP_OP_ATOMIC;
    }
    if ((wr->opcode == VQP_OP_FLUSH) || (wr->opcode == VQP_OP_PROBE)) {
        op->nfrags    = 0;
        op->remaining = 1; /* set to the WQE count at dispatch */
    } else if ((wr->opcode <= VQP_OP_READ) &&
               vqp_op_stripes(vqp, wr->opcode, wr->length)) {
        vqp_op_set_striped(vqp, op, wr);
    } else {
        op->nfrags    = 1;
        op->remaining = 1;
    }

    ++vqp->op_tail;
    ++vqp->stats.ops_posted;
    if (ucs_likely(
            (vqp->op_disp + 1 == vqp->op_tail) &&
            (vqp->replay_head == vqp->replay_tail) &&
            !(op->flags & VQP_SEND_FENCE) && (op->opcode != VQP_OP_FLUSH) &&
            ((vqp->notify_qp == NULL) || (op->opcode != VQP_OP_WRITE_IMM)))) {
        /* Nothing waits ahead of it: post it now. A new operation can only
         * finish here by failing, so reporting is needed only then. */
        vqp->op_disp += vqp_dispatch_op(vqp, vqp->op_disp);
        if (ucs_unlikely(op->remaining == 0)) {
            vqp_advance(vqp);
        }
        return UCS_OK;
    }
    vqp_advance(vqp);
    return UCS_OK;
}

/* Nothing waits ahead of a new operation and the operation ring has room:
 * it may be posted at once. Replays: the callers test fast_ops too, which
 * is 0 while any waits. */
static UCS_F_ALWAYS_INLINE int vqp_post_now_ok(const vqp_t *vqp, uint32_t opn)
{
    return (vqp->op_disp == opn) &&
           (VQP_RING_COUNT(vqp->op_head, opn) + vqp->wc_pending_ops <
            vqp->max_ops);
}

/* A request that passed the fast path's checks (vqp_post_send_flagged's for
 * inline ones) but not the lean path's: striped, or whole without room on
 * the send QP, or over several devices, or too long for one WQE. */
static UCS_F_NOINLINE ucs_status_t
vqp_post_send_accepted(vqp_t *vqp, const vqp_send_wr_t *wr)
{
    unsigned opcode   = wr->opcode;
    unsigned num_devs = vqp->cq->num_devs;
    uint32_t opn      = vqp->op_tail;
    unsigned inl;
    vqp_op_t *op;

    op = vqp_op_fill(vqp, wr, num_devs);
    __builtin_prefetch(VQP_OP(vqp, opn + VQP_PREFETCH_OPS), 1);
    vqp->op_tail = opn + 1;
    ++vqp->stats.ops_posted;
    /* vqp_inline_fast found an inline operation unstriped, with room. */
    inl = wr->flags & VQP_SEND_INLINE;
    if (!inl && vqp_op_stripes(vqp, opcode, wr->length)) {
        vqp_op_set_striped(vqp, op, wr);
        if (ucs_likely(vqp_send_qp_covered(vqp))) {
            vqp->op_disp += vqp_post_striped_any(vqp, op, opn, num_devs);
        } else {
            vqp->op_disp += vqp_dispatch_op(vqp, opn);
        }
    } else {
        op->nfrags    = 1;
        op->remaining = 1;
        if (inl) {
            vqp->op_disp += vqp_post_whole_rdma(vqp, vqp->send_qp, op, opn, 1);
        } else if (ucs_likely(vqp_pqp_has_room(vqp->send_qp))) {
            vqp->op_disp += vqp_post_whole_rdma(vqp, vqp->send_qp, op, opn, 0);
        } else {
            vqp->op_disp += vqp_dispatch_op(vqp, opn);
        }
    }
    if (ucs_unlikely(op->remaining == 0)) {
        /* A new operation can only finish here by failing. */
        vqp_advance(vqp);
    }
    return UCS_OK;
}

/* Room on @a pqp for the lean path: as vqp_pqp_has_room, but a lack of CQ
 * credits only sends the request on (the path it takes then queues for
 * them). */
static UCS_F_ALWAYS_INLINE int vqp_pqp_has_room_lean(const vqp_pqp_t *pqp)
{
    return vqp_pqp_has_slot(pqp) && (pqp->cdev->credits > 0);
}

/* The lean path: a whole operation posted on the send QP @a pqp (device 0,
 * alive, room checked) straight from the request, whose post cannot fail
 * (one SGE shorter than the largest WQE): a WRITE / WRITE_IMM / READ, or
 * when @a inl (a constant) an inline WRITE / SEND / SEND_IMM. The record is
 * complete at once (posted, tail posted), as replays and reports read it.
 * The doorbell goes last, after the fragment record, so that nothing lives
 * across its call into a software device. */
static UCS_F_ALWAYS_INLINE ucs_status_t
vqp_post_whole_lean(vqp_t *vqp, const vqp_send_wr_t *wr, vqp_pqp_t *pqp,
                    int inl, unsigned opcode)
{
    uint32_t opn;
    vqp_op_t *op;
    /* The mask keeps the length as it is (the callers checked it is
     * shorter), and tells the WQE builder so: it skips its test. */
    vqp_mlx5_sge_t sg = {wr->local_addr,
                         (uint32_t)wr->length & (VQP_MLX5_MAX_MSG - 1),
                         wr->lkey[0]};
    unsigned flags = ((wr->flags & VQP_SEND_SIGNALED) ? VQP_MLX5_SIGNALED : 0) |
                     (inl ? VQP_MLX5_INLINE : 0) | VQP_MLX5_HAS_ROOM |
                     VQP_MLX5_MORE;
    int wqe;

    /* The WQE first: what it needs is dead before the records are
     * written, which read the request again (fewer registers live). */
    wqe = vqp_post_whole_wqe(&pqp->tx, &sg, opcode, inl, wr->remote_addr,
                             wr->rkey[0], wr->imm, flags);

    /* Not the addresses, keys and immediate: in the WQE (vqp_op_t). */
    opn           = vqp->op_tail;
    op            = VQP_OP(vqp, opn);
    op->wr_id     = wr->wr_id;
    op->length    = wr->length;
    op->remaining = 1;
    op->nfrags    = 1;
    op->posted    = 1;
    op->first_seq = 0;
    op->status    = UCS_OK;
    op->opcode    = opcode;
    op->flags     = wr->flags | VQP_OP_TAIL_POSTED;
    __builtin_prefetch(VQP_OP(vqp, opn + VQP_PREFETCH_OPS), 1);
    vqp->op_tail = opn + 1;
    vqp->op_disp = opn + 1;
    ++vqp->stats.ops_posted;
    ++vqp->stats.frags_posted;
    /* The send QP's ring is its own, never a column of data_frags: an
     * index, not vqp_pqp_frag's shift by frag_shift. */
    vqp_frag_record_at(pqp, &pqp->frags[pqp->frag_tail++ & pqp->frag_mask],
                       vqp_op_off(vqp, opn), VQP_FRAG_WHOLE, 0, wqe, 0, 0);
    if (inl) {
        vqp_mlx5_txwq_ring_last(&pqp->tx);
    } else {
        /* Its size known at compile time: the doorbell's BlueFlame copy
         * folds to one BB, as the bare post's does. */
        vqp_mlx5_txwq_ring_newest(&pqp->tx, VQP_MLX5_RDMA_1SGE_BB);
    }
    return UCS_OK;
}

/* The common case of vqp_post_send for @a opcode (a WRITE / READ, or a
 * DQPLB WRITE_IMM; a constant at each call, so its bits in fast_ops are
 * constant masks): on a healthy, connected virtual QP with nothing waiting
 * ahead and room in the operation ring, the checks vqp_check_send and the
 * slow path make all pass for it. Each other case leaves by a tail call at
 * its first failing test; the lean path is a function of its own, so that
 * the registers it needs are saved there only (inlined here, GCC saved them
 * before the second test and restored them on every way out). */
static UCS_F_ALWAYS_INLINE ucs_status_t
vqp_post_send_opc(vqp_t *vqp, const vqp_send_wr_t *wr, unsigned opcode,
                  ucs_status_t (*lean)(vqp_t *, const vqp_send_wr_t *))
{
    vqp_pqp_t *pqp = vqp->send_qp;

    if (ucs_unlikely(!vqp_post_now_ok(vqp, vqp->op_tail))) {
        return vqp_post_send_slow(vqp, wr);
    }
    /* An opcode that may go whole may take the fast path (its bit is set
     * too): that bit is tested only when the lean path is out. */
    if (ucs_unlikely(!(vqp->fast_ops & UCS_BIT(opcode + VQP_FAST_WHOLE)) ||
                     (wr->length >= vqp->whole_max) ||
                     !vqp_pqp_has_room_lean(pqp))) {
        if (ucs_unlikely(!(vqp->fast_ops & UCS_BIT(opcode)))) {
            return vqp_post_send_slow(vqp, wr);
        }
        return vqp_post_send_accepted(vqp, wr);
    }
    return lean(vqp, wr);
}

/* Out of line, so that the checks before them need no registers saved;
 * one per opcode, so that each holds one WQE builder. */
static UCS_F_NOINLINE ucs_status_t
vqp_post_send_lean_write(vqp_t *vqp, const vqp_send_wr_t *wr)
{
    return vqp_post_whole_lean(vqp, wr, vqp->send_qp, 0, VQP_OP_WRITE);
}

static UCS_F_NOINLINE ucs_status_t
vqp_post_send_lean_read(vqp_t *vqp, const vqp_send_wr_t *wr)
{
    return vqp_post_whole_lean(vqp, wr, vqp->send_qp, 0, VQP_OP_READ);
}

static UCS_F_NOINLINE ucs_status_t
vqp_post_send_lean_write_imm(vqp_t *vqp, const vqp_send_wr_t *wr)
{
    return vqp_post_whole_lean(vqp, wr, vqp->send_qp, 0, VQP_OP_WRITE_IMM);
}

/* The checks of READ and WRITE_IMM, one function per opcode (its bits in
 * fast_ops are constant masks then), without a stack frame; WRITE's are in
 * vqp_post_send itself. */
static UCS_F_NOINLINE ucs_status_t vqp_post_send_read(vqp_t *vqp,
                                                      const vqp_send_wr_t *wr)
{
    return vqp_post_send_opc(vqp, wr, VQP_OP_READ, vqp_post_send_lean_read);
}

static UCS_F_NOINLINE ucs_status_t
vqp_post_send_write_imm(vqp_t *vqp, const vqp_send_wr_t *wr)
{
    return vqp_post_send_opc(vqp, wr, VQP_OP_WRITE_IMM,
                             vqp_post_send_lean_write_imm);
}

/* Flags besides SIGNALED: an inline WRITE / SEND (UCT's put_short and
 * am_short) the lean path can take, or the slow path. */
static UCS_F_NOINLINE ucs_status_t
vqp_post_send_flagged(vqp_t *vqp, const vqp_send_wr_t *wr)
{
    uint32_t opn = vqp->op_tail;

    if (ucs_unlikely(
            (wr->flags & ~(unsigned)(VQP_SEND_SIGNALED | VQP_SEND_INLINE)) ||
            !vqp_inline_fast(vqp, wr) || !vqp_post_now_ok(vqp, opn))) {
        return vqp_post_send_slow(vqp, wr);
    }
    if (ucs_unlikely(!(vqp->fast_ops >> VQP_FAST_WHOLE))) {
        /* over several devices: their keys go into the record there */
        return vqp_post_send_accepted(vqp, wr);
    }
    return vqp_post_whole_lean(vqp, wr, vqp->send_qp, 1, wr->opcode);
}

ucs_status_t vqp_post_send(vqp_t *vqp, const vqp_send_wr_t *wr)
{
    /* Flags besides SIGNALED, then by opcode: a tail call each, but a
     * WRITE, the most common, is checked here (one jump less). */
    if (ucs_unlikely(wr->flags & ~(unsigned)VQP_SEND_SIGNALED)) {
        return vqp_post_send_flagged(vqp, wr);
    }
    if (wr->opcode == VQP_OP_WRITE) {
        return vqp_post_send_opc(vqp, wr, VQP_OP_WRITE,
                                 vqp_post_send_lean_write);
    } else if (wr->opcode == VQP_OP_READ) {
        return vqp_post_send_read(vqp, wr);
    } else if (wr->opcode == VQP_OP_WRITE_IMM) {
        return vqp_post_send_write_imm(vqp, wr);
    }
    return vqp_post_send_slow(vqp, wr);
}

unsigned vqp_send_avail(const vqp_t *vqp)
{
    unsigned used =
        VQP_RING_COUNT(vqp->op_head, vqp->op_tail) + vqp->wc_pending_ops;

    return (used >= vqp->max_ops) ? 0 : vqp->max_ops - used;
}

unsigned vqp_send_avail_inline(const vqp_t *vqp, unsigned flags)
{
    /* Once the send QP died an inline post fails with its error, which no
     * wait would change: not a lack of room (0 would keep a caller's
     * queued requests waiting for good). */
    return (vqp_inline_room(vqp, flags) || !vqp->send_qp->alive)
               ? vqp_send_avail(vqp)
               : 0;
}

unsigned vqp_ops_in_flight(const vqp_t *vqp)
{
    return VQP_RING_COUNT(vqp->op_head, vqp->op_tail);
}

void vqp_cancel(vqp_t *vqp)
{
    unsigned i;

    vqp->canceling = 1;
    for (i = 0; i < vqp->num_pqps; ++i) {
        vqp_pqp_fail(&vqp->qps[i], UCS_ERR_CANCELED, NULL);
    }
    /* Operations not posted yet fail at the next advance; no CQE of this
     * virtual QP may come to cause one (its QPs may have been flushed
     * already), so the CQ's next poll does it. */
    vqp_mark_dirty(vqp);
}

/* Teardown or a dead virtual QP: every operation not reported yet completes
 * with @a status, once. Posted WQEs are forgotten: their QPs are about to
 * be destroyed. */
void vqp_fail_all(vqp_t *vqp, ucs_status_t status)
{
    vqp_op_t *op;
    unsigned i;

    for (i = 0; i < vqp->num_pqps; ++i) {
        /* Their CQEs still in the CQ are taken back by vqp_cq_retire. */
        vqp->qps[i].cdev->credits += (int32_t)VQP_RING_COUNT(
            vqp->qps[i].frag_head, vqp->qps[i].frag_tail);
        vqp->qps[i].frag_head = vqp->qps[i].frag_tail;
    }
    vqp->replay_head = vqp->replay_tail;
    for (; vqp->op_disp != vqp->op_tail; ++vqp->op_disp) {
        VQP_OP(vqp, vqp->op_disp)->remaining = 0;
    }
    for (i = vqp->op_head; i != vqp->op_tail; ++i) {
        op            = VQP_OP(vqp, i);
        op->remaining = 0;
        if (op->status == UCS_OK) {
            op->status = status;
        }
    }
    vqp_report(vqp);
}
