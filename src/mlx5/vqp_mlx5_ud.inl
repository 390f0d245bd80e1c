/*
 * mlx5 UD (unreliable datagram) send and receive helpers. A UD send WQE is
 * the ctrl segment, a datagram segment (the 48-byte address vector of the
 * destination device with the QPN and qkey filled in), then data segments
 * or one inline segment. Receives use the ordinary RQ (vqp_mlx5_rx.inl);
 * every receive buffer starts with 40 bytes of GRH room. Included by
 * vqp_mlx5.h only, after vqp_mlx5_tx.inl whose helpers it reuses.
 */

/* ctrl + datagram segment, in 16-byte units. */
#define VQP_MLX5_UD_HDR_DS                    \
    ((sizeof(struct mlx5_wqe_ctrl_seg) +      \
      sizeof(struct mlx5_wqe_datagram_seg)) / \
     VQP_MLX5_SEG_SIZE)

/* Largest inline payload of a UD WQE: the datagram segment takes room. */
#define VQP_MLX5_UD_MAX_INLINE \
    ((VQP_MLX5_MAX_DS - VQP_MLX5_UD_HDR_DS) * VQP_MLX5_SEG_SIZE - 4)

/* SEND or SEND_IMM on a UD QP; see vqp_mlx5_post_ud_send. */
static UCS_F_ALWAYS_INLINE int
vqp_mlx5_post_ud(vqp_mlx5_txwq_t *wq, uint8_t opcode,
                 const struct mlx5_wqe_av *av, uint32_t dqpn, uint32_t qkey,
                 const vqp_mlx5_sge_t *sge, unsigned num_sge, __be32 imm,
                 unsigned flags)
{
    uint16_t index = wq->pi;
    struct mlx5_wqe_datagram_seg *dseg;
    struct mlx5_wqe_ctrl_seg *ctrl;
    unsigned i, ds, nz, num_bb;
    uint32_t toobig = 0;
    size_t len      = 0;
    uint8_t fm_ce_se;
    void *seg;
    int inl;

    if (ucs_unlikely((num_sge > VQP_MLX5_MAX_SGE) || (dqpn > 0xffffff) ||
                     (av == NULL))) {
        ucs_error("mlx5 qp 0x%x: UD send with %u SGEs (at most %d), dest QPN"
                  " 0x%x (24 bits), AV %p",
                  wq->qpn_ds >> 8, num_sge, VQP_MLX5_MAX_SGE, dqpn, av);
        return UCS_ERR_INVALID_PARAM;
    }
    for (i = 0, nz = 0; i < num_sge; ++i) {
        len += sge[i].length;
        nz += (sge[i].length != 0);
        toobig |= (sge[i].length >= VQP_MLX5_MAX_MSG);
    }
    if (ucs_unlikely(toobig || (len > VQP_MLX5_MAX_MSG))) {
        ucs_error("mlx5 qp 0x%x: UD message of %zu bytes in %u SGEs: at most"
                  " 2^31 bytes, each SGE less",
                  wq->qpn_ds >> 8, len, num_sge);
        return UCS_ERR_INVALID_PARAM;
    }
    /* The path MTU is the device's business (it fails the WQE). */
    ds  = VQP_MLX5_UD_HDR_DS;
    inl = (flags & VQP_MLX5_INLINE) && (len <= wq->max_inline) &&
          (len <= VQP_MLX5_UD_MAX_INLINE);
    if (!inl) {
        ds += nz;
    } else if (len != 0) {
        ds += vqp_mlx5_inl_ds(len);
    }
    num_bb = (ds * VQP_MLX5_SEG_SIZE + MLX5_SEND_WQE_BB - 1) / MLX5_SEND_WQE_BB;
    if (ucs_unlikely(num_bb > vqp_mlx5_txwq_avail(wq))) {
        return UCS_ERR_NO_RESOURCE;
    }

    fm_ce_se = vqp_mlx5_txwq_fm_ce_se(wq, flags, num_bb);
    ctrl     = vqp_mlx5_txwq_bb(wq, index);
    /* ctrl and the datagram segment fill the first BB: no wrap inside. */
    dseg = (struct mlx5_wqe_datagram_seg *)(ctrl + 1);
    memcpy(&dseg->av, av, sizeof(dseg->av));
    dseg->av.dqp_dct           = htobe32(dqpn | MLX5_EXTENDED_UD_AV);
    dseg->av.key.qkey.qkey     = htobe32(qkey);
    dseg->av.key.qkey.reserved = 0;
    seg = vqp_mlx5_txwq_next_seg(wq, (char *)(dseg + 1) - VQP_MLX5_SEG_SIZE);
    vqp_mlx5_txwq_set_data(wq, seg, sge, num_sge, inl, len);
    vqp_mlx5_txwq_finish(wq, ctrl, 0, opcode, ds, fm_ce_se, imm, num_bb, flags);
    return index;
}

/* SEND on a UD QP to QPN @a dqpn of the device @a av addresses (from
 * vqp_dev_ah_create), with @a qkey. Returns the WQE index or a negative
 * ucs_status_t exactly like vqp_mlx5_post (NO_RESOURCE when the ring is full).
 * VQP_MLX5_INLINE copies the payload into the WQE when it fits the QP's
 * max_inline and VQP_MLX5_UD_MAX_INLINE. */
static inline int vqp_mlx5_post_ud_send(vqp_mlx5_txwq_t *wq,
                                        const struct mlx5_wqe_av *av,
                                        uint32_t dqpn, uint32_t qkey,
                                        const vqp_mlx5_sge_t *sge,
                                        unsigned num_sge, unsigned flags)
{
    return vqp_mlx5_post_ud(wq, MLX5_OPCODE_SEND, av, dqpn, qkey, sge, num_sge,
                            0, flags);
}

/* SEND_IMM on a UD QP: as vqp_mlx5_post_ud_send, with immediate @a imm
 * (big-endian, as on the wire). */
static inline int vqp_mlx5_post_ud_send_imm(vqp_mlx5_txwq_t *wq,
                                            const struct mlx5_wqe_av *av,
                                            uint32_t dqpn, uint32_t qkey,
                                            const vqp_mlx5_sge_t *sge,
                                            unsigned num_sge, __be32 imm,
                                            unsigned flags)
{
    return vqp_mlx5_post_ud(wq, MLX5_OPCODE_SEND_IMM, av, dqpn, qkey, sge,
                            num_sge, imm, flags);
}

/* Source QPN of a receive CQE of a UD QP. */
static inline uint32_t vqp_mlx5_cqe_src_qpn(const struct mlx5_cqe64 *cqe)
{
    return be32toh(cqe->flags_rqpn) & 0xffffff;
}

/* Non-zero if the receive CQE says a GRH fills the first 40 bytes of the
 * buffer (flags_rqpn bits 29:28, the L3 header type; 0: none). */
static inline int vqp_mlx5_cqe_has_grh(const struct mlx5_cqe64 *cqe)
{
    return (be32toh(cqe->flags_rqpn) >> 28) & 0x3;
}
