/*
 * mlx5 send queue: WQE building for RC operations, the signaling policy,
 * completion bookkeeping of BBs, and the doorbell (record, BlueFlame or MMIO,
 * or a call into a software device). Included by vqp_mlx5.h only.
 */

/* Set up @a wq over an SQ described by @a dv. @a sig_every: a CQE is asked
 * for at least every that many posts (1 = every post). @a bf_toggle: the
 * caller's word for the half of the doorbell register the next doorbell
 * writes (0 at first): QPs that ring one register must share it, as the
 * device wants consecutive BlueFlame writes to a register in alternate
 * halves (on a ConnectX the QPs of one thread domain ring one register);
 * NULL only where the QP has no register (dv without bf.reg, or a hook). */
static inline ucs_status_t
vqp_mlx5_txwq_init(vqp_mlx5_txwq_t *wq, const struct mlx5dv_qp *dv,
                   uint32_t qpn, unsigned max_inline, unsigned sig_every,
                   vqp_mlx5_db_mode_t db_mode, uint32_t *bf_toggle)
{
    uint32_t cnt = dv->sq.wqe_cnt;

    if ((dv->sq.buf == NULL) || (dv->dbrec == NULL) ||
        (dv->sq.stride != MLX5_SEND_WQE_BB)) {
        ucs_error("mlx5 sq: buf %p dbrec %p stride %u: need a ring of %d-byte"
                  " BBs with a doorbell record",
                  dv->sq.buf, dv->dbrec, dv->sq.stride, MLX5_SEND_WQE_BB);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((cnt < 2 * VQP_MLX5_MAX_BB) || (cnt > 0x8000) || (cnt & (cnt - 1))) {
        ucs_error("mlx5 sq: %u BBs: need a power of two in [%d, 32768]", cnt,
                  2 * VQP_MLX5_MAX_BB);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((qpn > 0xffffff) || (max_inline > VQP_MLX5_MAX_INLINE) ||
        (sig_every == 0) || (sig_every > cnt) ||
        (db_mode > VQP_MLX5_DB_RECORD)) {
        ucs_error("mlx5 sq: qpn 0x%x max_inline %u sig_every %u db_mode %d:"
                  " need a 24-bit qpn, max_inline <= %d, 1 <= sig_every <="
                  " %u, a register mode (the hook comes from the device)",
                  qpn, max_inline, sig_every, (int)db_mode, VQP_MLX5_MAX_INLINE,
                  cnt);
        return UCS_ERR_INVALID_PARAM;
    }

    memset(wq, 0, sizeof(*wq));
    wq->qstart     = dv->sq.buf;
    wq->qend       = (char *)dv->sq.buf + cnt * MLX5_SEND_WQE_BB;
    wq->mask       = cnt - 1;
    wq->sig_every  = sig_every;
    wq->sig_left   = sig_every;
    wq->qpn_ds     = qpn << 8;
    wq->max_inline = max_inline;
    wq->dbrec      = &dv->dbrec[MLX5_SND_DBR];
    wq->bf_reg     = dv->bf.reg;
    wq->bf_size    = dv->bf.size;
    /* A device that is told by a call has no use for a register; without a
     * register there is nothing to write but the record; without a
     * BlueFlame buffer only 8-byte doorbells work. */
    if (dv->comp_mask & VQP_MLX5_DV_QP_MASK_DB_HOOK) {
        wq->db_hook = (const vqp_mlx5_db_hook_t *)(uintptr_t)dv->tir_icm_addr;
        wq->bf_size = 0;
        if ((wq->db_hook == NULL) || (wq->db_hook->ring == NULL)) {
            ucs_error("mlx5 sq: qpn 0x%x: doorbell hook without a function",
                      qpn);
            return UCS_ERR_INVALID_PARAM;
        }
        db_mode = VQP_MLX5_DB_HOOK;
    } else if (wq->bf_reg == NULL) {
        db_mode = VQP_MLX5_DB_RECORD;
    } else if ((wq->bf_size < MLX5_SEND_WQE_BB) &&
               (db_mode == VQP_MLX5_DB_BF)) {
        db_mode = VQP_MLX5_DB_MMIO;
    }
    wq->db_mode = db_mode;
    if (db_mode >= VQP_MLX5_DB_RECORD) {
        return UCS_OK;
    }
    /* A register: the shared half, which must be one of this QP's. */
    if ((dv->bf.size > UINT16_MAX) || (bf_toggle == NULL) ||
        ((*bf_toggle != 0) && (*bf_toggle != wq->bf_size))) {
        ucs_error("mlx5 sq: qpn 0x%x: BlueFlame size %u, register half %p "
                  "(%d): need a size below 64 KiB and a half of 0 or that "
                  "size",
                  qpn, dv->bf.size, bf_toggle,
                  (bf_toggle != NULL) ? (int)*bf_toggle : -1);
        return UCS_ERR_INVALID_PARAM;
    }
    wq->bf_toggle = bf_toggle;
    return UCS_OK;
}

/* BBs free for new WQEs. */
static UCS_F_ALWAYS_INLINE unsigned
vqp_mlx5_txwq_avail(const vqp_mlx5_txwq_t *wq)
{
    return (unsigned)wq->mask + 1 - (uint16_t)(wq->pi - wq->ci);
}

static UCS_F_ALWAYS_INLINE void *vqp_mlx5_txwq_bb(const vqp_mlx5_txwq_t *wq,
                                                  uint16_t index)
{
    return (char *)wq->qstart + (size_t)(index & wq->mask) * MLX5_SEND_WQE_BB;
}

/* Segments are 16 bytes and the ring a multiple of 64: a segment never
 * straddles the end, only the pointer to the next one needs wrapping. */
static UCS_F_ALWAYS_INLINE void *
vqp_mlx5_txwq_next_seg(const vqp_mlx5_txwq_t *wq, void *seg)
{
    seg = (char *)seg + VQP_MLX5_SEG_SIZE;
    return ucs_unlikely(seg == wq->qend) ? wq->qstart : seg;
}

/* Copy inline payload that may run past the ring end; returns where the
 * copy stopped (wrapped). */
static UCS_F_ALWAYS_INLINE char *vqp_mlx5_txwq_copy(const vqp_mlx5_txwq_t *wq,
                                                    char *dst, const void *src,
                                                    size_t len)
{
    size_t room = (char *)wq->qend - dst;

    if (ucs_likely(len < room)) {
        memcpy(dst, src, len);
        return dst + len;
    }
    memcpy(dst, src, room);
    memcpy(wq->qstart, (const char *)src + room, len - room);
    return (char *)wq->qstart + (len - room);
}

/* A WQE's BBs, from the ds field of its ctrl segment. */
static UCS_F_ALWAYS_INLINE unsigned
vqp_mlx5_ctrl_num_bb(const struct mlx5_wqe_ctrl_seg *ctrl)
{
    unsigned ds = be32toh(ctrl->qpn_ds) & 0x3f;

    return (ds * VQP_MLX5_SEG_SIZE + MLX5_SEND_WQE_BB - 1) / MLX5_SEND_WQE_BB;
}

/* A CQE (success or error) reported the WQE starting at @a wqe_counter: it
 * and every WQE before it are done. Its size is still in its ctrl segment,
 * which nothing overwrites before ci passes it. */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_txwq_complete(vqp_mlx5_txwq_t *wq,
                                                       uint16_t wqe_counter)
{
    wq->ci =
        wqe_counter + vqp_mlx5_ctrl_num_bb(vqp_mlx5_txwq_bb(wq, wqe_counter));
}

/* Read back the WRITE / WRITE_IMM / READ posted at @a index, not inline and
 * of at most one data segment: its remote address and key, its buffer
 * (length 0, address and key 0 when it has no data segment) and its
 * immediate (big-endian). Valid until ci passes the WQE: nothing overwrites
 * it before, and a device only reads the SQ. Cold: for a caller that
 * recorded the request nowhere else. */
static inline void vqp_mlx5_txwq_read_rdma(const vqp_mlx5_txwq_t *wq,
                                           uint16_t index, uint64_t *raddr,
                                           uint32_t *rkey, vqp_mlx5_sge_t *sge,
                                           __be32 *imm)
{
    struct mlx5_wqe_ctrl_seg *ctrl = vqp_mlx5_txwq_bb(wq, index);
    const struct mlx5_wqe_raddr_seg *rseg;
    const struct mlx5_wqe_data_seg *dseg;

    rseg   = vqp_mlx5_txwq_next_seg(wq, ctrl);
    *raddr = be64toh(rseg->raddr);
    *rkey  = be32toh(rseg->rkey);
    *imm   = ctrl->imm;
    if ((be32toh(ctrl->qpn_ds) & 0x3f) < 3) {
        *sge = (vqp_mlx5_sge_t){0, 0, 0};
        return;
    }
    dseg = vqp_mlx5_txwq_next_seg(wq, (void *)rseg);
    *sge = (vqp_mlx5_sge_t){be64toh(dseg->addr), be32toh(dseg->byte_count),
                            be32toh(dseg->lkey)};
}

/* Two adjacent big-endian 32-bit fields of a WQE in one 8-byte store. The
 * BlueFlame copy reads the WQE back in 8-byte words, and a load is served
 * from the store buffer only when a single store covers it: otherwise it
 * waits until the older stores reached the cache. */
static UCS_F_ALWAYS_INLINE void
vqp_mlx5_store_be32_pair(void *dst, uint32_t first, uint32_t second)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t word =
        (uint64_t)htobe32(first) | ((uint64_t)htobe32(second) << 32);
#else
    uint64_t word = ((uint64_t)first << 32) | second;
#endif

    memcpy(dst, &word, sizeof(word));
}

/* The ctrl segment's second 8 bytes (signature and stream id 0, fm_ce_se,
 * imm) as one word: composed in a register, so that the store of it is one
 * 8-byte store (built in memory, it would be read back across smaller
 * stores, the wait vqp_mlx5_store_be32_pair avoids). */
static UCS_F_ALWAYS_INLINE uint64_t vqp_mlx5_ctrl_tail(uint8_t fm_ce_se,
                                                       __be32 imm)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return ((uint64_t)fm_ce_se << 24) | ((uint64_t)imm << 32);
#else
    return ((uint64_t)fm_ce_se << 32) | imm;
#endif
}

/* One BlueFlame chunk: 64 bytes as 8-byte stores, the largest a device
 * register accepts in order on every CPU we build for. */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_bf_copy_bb(char *dst, const char *src)
{
    volatile uint64_t *d = (volatile uint64_t *)dst;
    uint64_t word;
    unsigned i;

    for (i = 0; i < MLX5_SEND_WQE_BB / sizeof(word); ++i) {
        memcpy(&word, src + i * sizeof(word), sizeof(word));
        d[i] = word;
    }
}

/*
 * Tell the device about every WQE up to pi. @a num_bb is the size of the
 * newest WQE (at last_pi) when it alone is new, 0 when several are: only a
 * lone WQE may go by BlueFlame.
 */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_txwq_doorbell(vqp_mlx5_txwq_t *wq,
                                                       unsigned num_bb)
{
    const char *src = vqp_mlx5_txwq_bb(wq, wq->last_pi);
    uint64_t db;
    unsigned i;
    char *dst;

    /* The WQE stores must be visible in memory before the record says they
     * are valid: the device may fetch them as soon as it sees the record. */
    ucs_memory_cpu_store_fence();
    *wq->dbrec = htobe32(wq->pi);
    wq->db_pi  = wq->pi;
    if (ucs_unlikely(wq->db_mode >= VQP_MLX5_DB_RECORD)) {
        /* No register. A software device starts on the WQEs here, in this
         * thread, as a NIC starts on them after the doorbell. */
        if (wq->db_mode == VQP_MLX5_DB_HOOK) {
            wq->db_hook->ring(wq->db_hook->arg);
        }
        return;
    }

    /* The record must reach memory before the doorbell MMIO: the device
     * reads the record when the doorbell tells it to. */
    ucs_memory_bus_store_fence();
    dst = wq->bf_reg + *wq->bf_toggle;
    if ((wq->db_mode == VQP_MLX5_DB_BF) && (num_bb != 0) &&
        (num_bb * MLX5_SEND_WQE_BB <= wq->bf_size)) {
        for (i = 0; i < num_bb; ++i) {
            vqp_mlx5_bf_copy_bb(dst, src);
            dst += MLX5_SEND_WQE_BB;
            src += MLX5_SEND_WQE_BB;
            if (src == wq->qend) {
                src = wq->qstart;
            }
        }
    } else {
        /* ctrl bytes 0..7 (opcode, index, qpn, ds) name the newest WQE. */
        memcpy(&db, src, sizeof(db));
        *(volatile uint64_t *)dst = db;
    }
    /* Flush the write-combining buffer now, so the next doorbell (to the
     * other half of the register) cannot overtake this one. */
    ucs_memory_bus_store_fence();
    *wq->bf_toggle ^= wq->bf_size;
}

/* Ring for WQEs posted with VQP_MLX5_MORE. */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_txwq_flush(vqp_mlx5_txwq_t *wq)
{
    if (wq->pi != wq->db_pi) {
        vqp_mlx5_txwq_doorbell(wq, 0);
    }
}

/* Ring for the newest WQE (@a num_bb BBs): BlueFlame when it alone is new
 * since the last doorbell, else the 8-byte doorbell, which covers earlier
 * batched WQEs too (a BlueFlame copy would carry only the newest). */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_txwq_ring_newest(vqp_mlx5_txwq_t *wq,
                                                          unsigned num_bb)
{
    vqp_mlx5_txwq_doorbell(wq, (uint16_t)(wq->pi - wq->db_pi) == num_bb ? num_bb
                                                                        : 0);
}

/* Ring for the newest WQE, posted with VQP_MLX5_MORE, as its post would
 * have: the caller records it between the build and the doorbell, so
 * nothing it needs afterwards lives across the doorbell's call into a
 * software device. */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_txwq_ring_last(vqp_mlx5_txwq_t *wq)
{
    vqp_mlx5_txwq_ring_newest(wq, (uint16_t)(wq->pi - wq->last_pi));
}

/* ds of an inline segment of @a len bytes: header and data, padded. */
static UCS_F_ALWAYS_INLINE unsigned vqp_mlx5_inl_ds(size_t len)
{
    size_t bytes = sizeof(struct mlx5_wqe_inl_data_seg) + len;

    return (bytes + VQP_MLX5_SEG_SIZE - 1) / VQP_MLX5_SEG_SIZE;
}

/* Write the data part (inline or pointers) at @a seg; returns its ds. */
static UCS_F_ALWAYS_INLINE unsigned
vqp_mlx5_txwq_set_data(vqp_mlx5_txwq_t *wq, void *seg,
                       const vqp_mlx5_sge_t *sge, unsigned num_sge, int inl,
                       size_t inl_len)
{
    struct mlx5_wqe_inl_data_seg *iseg;
    struct mlx5_wqe_data_seg *dseg;
    unsigned i, ds = 0;
    char *dst;

    if (inl) {
        if (inl_len == 0) {
            return 0;
        }
        iseg             = seg;
        iseg->byte_count = htobe32((uint32_t)inl_len | MLX5_INLINE_SEG);
        dst              = (char *)(iseg + 1);
        for (i = 0; i < num_sge; ++i) {
            if (sge[i].length != 0) {
                dst = vqp_mlx5_txwq_copy(wq, dst,
                                         (const void *)(uintptr_t)sge[i].addr,
                                         sge[i].length);
            }
        }
        return vqp_mlx5_inl_ds(inl_len);
    }

    for (i = 0; i < num_sge; ++i) {
        if (sge[i].length == 0) {
            continue;
        }
        dseg = seg;
        vqp_mlx5_store_be32_pair(&dseg->byte_count, sge[i].length, sge[i].lkey);
        dseg->addr = htobe64(sge[i].addr);
        seg        = vqp_mlx5_txwq_next_seg(wq, seg);
        ++ds;
    }
    return ds;
}

/* The ctrl segment's fm_ce_se for a WQE of @a num_bb BBs. Signal when
 * asked, every sig_every posts, and whenever the ring is nearly full: then
 * the newest WQE always has a CQE coming, and a post refused for room is sure
 * to get room back. */
static UCS_F_ALWAYS_INLINE uint8_t vqp_mlx5_txwq_fm_ce_se(vqp_mlx5_txwq_t *wq,
                                                          unsigned flags,
                                                          unsigned num_bb)
{
    uint8_t fm_ce_se = 0;

    if ((flags & VQP_MLX5_SIGNALED) || (--wq->sig_left == 0) ||
        (vqp_mlx5_txwq_avail(wq) - num_bb < VQP_MLX5_MAX_BB)) {
        fm_ce_se     = MLX5_WQE_CTRL_CQ_UPDATE;
        wq->sig_left = wq->sig_every;
    }
    if (flags & VQP_MLX5_FENCE) {
        fm_ce_se |= MLX5_WQE_CTRL_FENCE;
    }
    if (flags & VQP_MLX5_SOLICITED) {
        fm_ce_se |= MLX5_WQE_CTRL_SOLICITED;
    }
    return fm_ce_se;
}

/* Write the ctrl segment of the WQE at pi (its other segments are written),
 * advance pi and ring unless VQP_MLX5_MORE. */
static UCS_F_ALWAYS_INLINE void
vqp_mlx5_txwq_finish(vqp_mlx5_txwq_t *wq, struct mlx5_wqe_ctrl_seg *ctrl,
                     uint8_t opmod, uint8_t opcode, unsigned ds,
                     uint8_t fm_ce_se, __be32 imm, unsigned num_bb,
                     unsigned flags)
{
    uint16_t index = wq->pi;
    uint64_t tail  = vqp_mlx5_ctrl_tail(fm_ce_se, imm);

    vqp_mlx5_store_be32_pair(&ctrl->opmod_idx_opcode,
                             ((uint32_t)opmod << 24) | ((uint32_t)index << 8) |
                                 opcode,
                             wq->qpn_ds | ds);
    memcpy(&ctrl->signature, &tail, sizeof(tail));

    wq->last_pi = index;
    wq->pi += num_bb;
    /* The next WQE's line, fetched while the QP is idle: with
     * many QPs posted in turn it is no longer cached when this QP's turn
     * comes again, and the BlueFlame copy would wait for it. */
    __builtin_prefetch(vqp_mlx5_txwq_bb(wq, wq->pi), 1);
    if (!(flags & VQP_MLX5_MORE)) {
        vqp_mlx5_txwq_ring_newest(wq, num_bb);
    }
}

/*
 * Build one WQE at pi and ring (unless VQP_MLX5_MORE). Returns the WQE's
 * index (pi of its first BB, what its CQE's wqe_counter will say), or a
 * negative ucs_status_t: UCS_ERR_NO_RESOURCE when the ring lacks room,
 * UCS_ERR_INVALID_PARAM for a request the WQE format cannot carry.
 */
static UCS_F_ALWAYS_INLINE int
vqp_mlx5_post(vqp_mlx5_txwq_t *wq, uint8_t opcode, const vqp_mlx5_sge_t *sge,
              unsigned num_sge, uint64_t raddr, uint32_t rkey,
              uint64_t swap_add, uint64_t compare, __be32 imm, unsigned flags)
{
    int atomic =
        (opcode == MLX5_OPCODE_ATOMIC_FA) || (opcode == MLX5_OPCODE_ATOMIC_CS);
    int has_raddr = atomic || (opcode == MLX5_OPCODE_RDMA_WRITE) ||
                    (opcode == MLX5_OPCODE_RDMA_WRITE_IMM) ||
                    (opcode == MLX5_OPCODE_RDMA_READ);
    int may_inl = (opcode != MLX5_OPCODE_RDMA_READ) && !atomic &&
                  (opcode != MLX5_OPCODE_NOP);
    uint16_t index = wq->pi;
    struct mlx5_wqe_ctrl_seg *ctrl;
    struct mlx5_wqe_raddr_seg *rseg;
    struct mlx5_wqe_atomic_seg *aseg;
    unsigned i, ds, nz, num_bb;
    uint32_t toobig = 0;
    size_t len      = 0;
    uint8_t fm_ce_se;
    void *seg;
    int inl;

    if (ucs_unlikely(num_sge > VQP_MLX5_MAX_SGE)) {
        ucs_error("mlx5 qp 0x%x: %u SGEs, at most %d", wq->qpn_ds >> 8, num_sge,
                  VQP_MLX5_MAX_SGE);
        return UCS_ERR_INVALID_PARAM;
    }
    if (atomic && ucs_unlikely((num_sge != 1) || (sge[0].length != 8))) {
        ucs_error("mlx5 qp 0x%x: atomic result buffer must be one 8-byte SGE",
                  wq->qpn_ds >> 8);
        return UCS_ERR_INVALID_PARAM;
    }

    /* Size first, so nothing is written when the WQE does not fit. A data
     * segment holds 31 bits of length; a message is at most 2 GiB. */
    for (i = 0, nz = 0; i < num_sge; ++i) {
        len += sge[i].length;
        nz += (sge[i].length != 0);
        toobig |= (sge[i].length >= VQP_MLX5_MAX_MSG);
    }
    if (ucs_unlikely(toobig || (len > VQP_MLX5_MAX_MSG))) {
        ucs_error("mlx5 qp 0x%x: message of %zu bytes in %u SGEs: at most"
                  " 2^31 bytes, each SGE less",
                  wq->qpn_ds >> 8, len, num_sge);
        return UCS_ERR_INVALID_PARAM;
    }
    ds  = 1 + has_raddr + atomic;
    inl = may_inl && (flags & VQP_MLX5_INLINE) && (len <= wq->max_inline);
    if (!inl) {
        ds += nz;
    } else if (len != 0) {
        ds += vqp_mlx5_inl_ds(len);
    }
    num_bb = (ds * VQP_MLX5_SEG_SIZE + MLX5_SEND_WQE_BB - 1) / MLX5_SEND_WQE_BB;
    if (!(flags & VQP_MLX5_HAS_ROOM) &&
        ucs_unlikely(num_bb > vqp_mlx5_txwq_avail(wq))) {
        return UCS_ERR_NO_RESOURCE;
    }

    fm_ce_se = vqp_mlx5_txwq_fm_ce_se(wq, flags, num_bb);
    ctrl     = vqp_mlx5_txwq_bb(wq, index);
    seg      = vqp_mlx5_txwq_next_seg(wq, ctrl);
    if (has_raddr) {
        rseg        = seg;
        rseg->raddr = htobe64(raddr);
        vqp_mlx5_store_be32_pair(&rseg->rkey, rkey, 0); /* and reserved */
        seg = vqp_mlx5_txwq_next_seg(wq, seg);
    }
    if (atomic) {
        aseg           = seg;
        aseg->swap_add = htobe64(swap_add);
        aseg->compare  = htobe64(compare);
        seg            = vqp_mlx5_txwq_next_seg(wq, seg);
    }
    vqp_mlx5_txwq_set_data(wq, seg, sge, num_sge, inl, len);
    vqp_mlx5_txwq_finish(wq, ctrl, 0, opcode, ds, fm_ce_se, imm, num_bb, flags);
    return index;
}

/* RDMA WRITE of the gathered @a sge to raddr/rkey; zero bytes is legal. */
static UCS_F_ALWAYS_INLINE int
vqp_mlx5_post_write(vqp_mlx5_txwq_t *wq, const vqp_mlx5_sge_t *sge,
                    unsigned num_sge, uint64_t raddr, uint32_t rkey,
                    unsigned flags)
{
    return vqp_mlx5_post(wq, MLX5_OPCODE_RDMA_WRITE, sge, num_sge, raddr, rkey,
                         0, 0, 0, flags);
}

/* RDMA WRITE with immediate @a imm (big-endian, as it goes on the wire). */
static UCS_F_ALWAYS_INLINE int
vqp_mlx5_post_write_imm(vqp_mlx5_txwq_t *wq, const vqp_mlx5_sge_t *sge,
                        unsigned num_sge, uint64_t raddr, uint32_t rkey,
                        __be32 imm, unsigned flags)
{
    return vqp_mlx5_post(wq, MLX5_OPCODE_RDMA_WRITE_IMM, sge, num_sge, raddr,
                         rkey, 0, 0, imm, flags);
}

static UCS_F_ALWAYS_INLINE int vqp_mlx5_post_send(vqp_mlx5_txwq_t *wq,
                                                  const vqp_mlx5_sge_t *sge,
                                                  unsigned num_sge,
                                                  unsigned flags)
{
    return vqp_mlx5_post(wq, MLX5_OPCODE_SEND, sge, num_sge, 0, 0, 0, 0, 0,
                         flags);
}

static UCS_F_ALWAYS_INLINE int
vqp_mlx5_post_send_imm(vqp_mlx5_txwq_t *wq, const vqp_mlx5_sge_t *sge,
                       unsigned num_sge, __be32 imm, unsigned flags)
{
    return vqp_mlx5_post(wq, MLX5_OPCODE_SEND_IMM, sge, num_sge, 0, 0, 0, 0,
                         imm, flags);
}

/* RDMA READ from raddr/rkey, scattered to @a sge (never inline). */
static UCS_F_ALWAYS_INLINE int vqp_mlx5_post_read(vqp_mlx5_txwq_t *wq,
                                                  const vqp_mlx5_sge_t *sge,
                                                  unsigned num_sge,
                                                  uint64_t raddr, uint32_t rkey,
                                                  unsigned flags)
{
    return vqp_mlx5_post(wq, MLX5_OPCODE_RDMA_READ, sge, num_sge, raddr, rkey,
                         0, 0, 0, flags & ~VQP_MLX5_INLINE);
}

/* 64-bit fetch-and-add at raddr (8-byte aligned); the old value lands in
 * @a result (8 bytes, big-endian). */
static UCS_F_ALWAYS_INLINE int
vqp_mlx5_post_atomic_fa(vqp_mlx5_txwq_t *wq, const vqp_mlx5_sge_t *result,
                        uint64_t raddr, uint32_t rkey, uint64_t add,
                        unsigned flags)
{
    return vqp_mlx5_post(wq, MLX5_OPCODE_ATOMIC_FA, result, 1, raddr, rkey, add,
                         0, 0, flags);
}

/* 64-bit compare-and-swap: *raddr = swap if it equals compare; the old value
 * lands in @a result (8 bytes, big-endian). */
static UCS_F_ALWAYS_INLINE int
vqp_mlx5_post_atomic_cs(vqp_mlx5_txwq_t *wq, const vqp_mlx5_sge_t *result,
                        uint64_t raddr, uint32_t rkey, uint64_t compare,
                        uint64_t swap, unsigned flags)
{
    return vqp_mlx5_post(wq, MLX5_OPCODE_ATOMIC_CS, result, 1, raddr, rkey,
                         swap, compare, 0, flags);
}

/* A WQE that moves nothing: a completion point, or a fence carrier. */
static UCS_F_ALWAYS_INLINE int vqp_mlx5_post_nop(vqp_mlx5_txwq_t *wq,
                                                 unsigned flags)
{
    return vqp_mlx5_post(wq, MLX5_OPCODE_NOP, NULL, 0, 0, 0, 0, 0, 0,
                         flags & ~VQP_MLX5_INLINE);
}

/*
 * Extended (masked) atomic on a @a size-byte (4 or 8) operand at raddr,
 * aligned to its size; the old value lands in @a result (@a size bytes,
 * big-endian). Operands are in host order; the WQE carries them big-endian
 * in their size. Layouts after ctrl and raddr:
 *   MASKED_CS 4: swap, compare, swap_mask, compare_mask (4 bytes each): ds 4
 *   MASKED_CS 8: swap, compare | swap_mask, compare_mask (8 bytes each): ds 5
 *   MASKED_FA 4: add, field_boundary, 8 reserved bytes: ds 4
 *   MASKED_FA 8: add, field_boundary (8 bytes each): ds 4
 * then the result's data segment. MASKED_CS: when (old ^ compare) &
 * compare_mask is 0, new = (old & ~swap_mask) | (swap & swap_mask).
 * MASKED_FA: new = old + add where a set field_boundary bit stops the carry
 * out of that bit (all ones: XOR). For MASKED_FA, @a swap_add is the addend
 * and @a compare the field boundary; the masks are ignored.
 */
static UCS_F_ALWAYS_INLINE int
vqp_mlx5_post_masked_atomic(vqp_mlx5_txwq_t *wq, uint8_t opcode, unsigned size,
                            const vqp_mlx5_sge_t *result, uint64_t raddr,
                            uint32_t rkey, uint64_t swap_add, uint64_t compare,
                            uint64_t swap_mask, uint64_t compare_mask,
                            unsigned flags)
{
    uint16_t index = wq->pi;
    struct mlx5_wqe_ctrl_seg *ctrl;
    struct mlx5_wqe_raddr_seg *rseg;
    struct mlx5_wqe_data_seg *dseg;
    unsigned ds, num_bb;
    uint8_t fm_ce_se;
    uint32_t *w32;
    uint64_t *w64;
    void *seg;

    if (ucs_unlikely(((opcode != MLX5_OPCODE_ATOMIC_MASKED_CS) &&
                      (opcode != MLX5_OPCODE_ATOMIC_MASKED_FA)) ||
                     ((size != 4) && (size != 8)))) {
        ucs_error("mlx5 qp 0x%x: masked atomic opcode 0x%x size %u: need"
                  " MASKED_CS or MASKED_FA on 4 or 8 bytes",
                  wq->qpn_ds >> 8, opcode, size);
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_unlikely((result->length != size) || (raddr & (size - 1)))) {
        ucs_error("mlx5 qp 0x%x: %u-byte masked atomic: result buffer of %u"
                  " bytes, remote address 0x%lx: need a %u-byte result and"
                  " a %u-byte aligned address",
                  wq->qpn_ds >> 8, size, result->length, raddr, size, size);
        return UCS_ERR_INVALID_PARAM;
    }

    ds     = ((opcode == MLX5_OPCODE_ATOMIC_MASKED_CS) && (size == 8)) ? 5 : 4;
    num_bb = (ds * VQP_MLX5_SEG_SIZE + MLX5_SEND_WQE_BB - 1) / MLX5_SEND_WQE_BB;
    if (ucs_unlikely(num_bb > vqp_mlx5_txwq_avail(wq))) {
        return UCS_ERR_NO_RESOURCE;
    }

    fm_ce_se       = vqp_mlx5_txwq_fm_ce_se(wq, flags, num_bb);
    ctrl           = vqp_mlx5_txwq_bb(wq, index);
    rseg           = vqp_mlx5_txwq_next_seg(wq, ctrl);
    rseg->raddr    = htobe64(raddr);
    rseg->rkey     = htobe32(rkey);
    rseg->reserved = 0;
    seg            = vqp_mlx5_txwq_next_seg(wq, rseg);
    if (size == 4) {
        w32    = seg;
        w32[0] = htobe32((uint32_t)swap_add);
        w32[1] = htobe32((uint32_t)compare);
        if (opcode == MLX5_OPCODE_ATOMIC_MASKED_CS) {
            w32[2] = htobe32((uint32_t)swap_mask);
            w32[3] = htobe32((uint32_t)compare_mask);
        } else {
            w32[2] = 0;
            w32[3] = 0;
        }
    } else {
        w64    = seg;
        w64[0] = htobe64(swap_add);
        w64[1] = htobe64(compare);
        if (opcode == MLX5_OPCODE_ATOMIC_MASKED_CS) {
            /* The masks are the next segment, which may wrap. */
            seg    = vqp_mlx5_txwq_next_seg(wq, seg);
            w64    = seg;
            w64[0] = htobe64(swap_mask);
            w64[1] = htobe64(compare_mask);
        }
    }
    dseg             = vqp_mlx5_txwq_next_seg(wq, seg);
    dseg->byte_count = htobe32(size);
    dseg->lkey       = htobe32(result->lkey);
    dseg->addr       = htobe64(result->addr);
    vqp_mlx5_txwq_finish(wq, ctrl, VQP_MLX5_OPMOD_EXT_ATOMIC(size), opcode, ds,
                         fm_ce_se, 0, num_bb, flags);
    return index;
}
