/*
 * mlx5 completion queue: ownership check and polling, consumer index
 * updates, field decoding, error CQEs (syndrome to ucs_status_t) and arming.
 * Included by vqp_mlx5.h only.
 */

/* Set up @a cq over the CQ @a dv describes (64- or 128-byte CQEs). */
static inline ucs_status_t vqp_mlx5_cq_init(vqp_mlx5_cq_t *cq,
                                            const struct mlx5dv_cq *dv)
{
    uint32_t cnt = dv->cqe_cnt;

    if ((dv->buf == NULL) || (dv->dbrec == NULL) || (cnt < 2) ||
        (cnt > (1u << 24)) || (cnt & (cnt - 1)) ||
        ((dv->cqe_size != 64) && (dv->cqe_size != 128))) {
        ucs_error("mlx5 cq: buf %p dbrec %p %u CQEs of %u bytes: need a"
                  " power-of-two count in [2, 2^24] of 64- or 128-byte CQEs",
                  dv->buf, dv->dbrec, cnt, dv->cqe_size);
        return UCS_ERR_INVALID_PARAM;
    }
    memset(cq, 0, sizeof(*cq));
    cq->buf       = dv->buf;
    cq->mask      = cnt - 1;
    cq->log_cnt   = __builtin_ctz(cnt);
    cq->cqe_shift = (dv->cqe_size == 64) ? 6 : 7;
    cq->cqe64_off = dv->cqe_size - sizeof(struct mlx5_cqe64);
    cq->dbrec     = dv->dbrec;
    cq->uar       = dv->cq_uar;
    cq->cqn       = dv->cqn;
    return UCS_OK;
}

static UCS_F_ALWAYS_INLINE struct mlx5_cqe64 *
vqp_mlx5_cq_get(const vqp_mlx5_cq_t *cq, uint32_t index)
{
    return (struct mlx5_cqe64 *)(cq->buf +
                                 ((size_t)(index & cq->mask) << cq->cqe_shift) +
                                 cq->cqe64_off);
}

/* The one ownership rule: the device wrote the CQE at @a index in its
 * current pass over the ring when the owner bit equals that pass's parity
 * and the opcode is not the "never written" marker. */
static UCS_F_ALWAYS_INLINE int
vqp_mlx5_cqe_is_sw_owned(uint8_t op_own, uint32_t index, unsigned log_cnt)
{
    return (((op_own ^ (index >> log_cnt)) & MLX5_CQE_OWNER_MASK) == 0) &&
           ((op_own >> 4) != MLX5_CQE_INVALID);
}

/* The next completed CQE, consumed, or NULL. Check vqp_mlx5_cqe_status()
 * before trusting any other field. The device learns about consumed CQEs
 * only from vqp_mlx5_cq_update_ci(). */
static UCS_F_ALWAYS_INLINE struct mlx5_cqe64 *
vqp_mlx5_cq_poll_own(vqp_mlx5_cq_t *cq, uint8_t *op_own_p)
{
    struct mlx5_cqe64 *cqe = vqp_mlx5_cq_get(cq, cq->ci);
    uint8_t op_own         = *(volatile uint8_t *)&cqe->op_own;

    if (!vqp_mlx5_cqe_is_sw_owned(op_own, cq->ci, cq->log_cnt)) {
        return NULL;
    }
    /* op_own is written last: read the other fields only after it. */
    ucs_memory_cpu_load_fence();
    ++cq->ci;
    *op_own_p = op_own;
    return cqe;
}

static UCS_F_ALWAYS_INLINE struct mlx5_cqe64 *
vqp_mlx5_cq_poll(vqp_mlx5_cq_t *cq)
{
    uint8_t op_own;

    return vqp_mlx5_cq_poll_own(cq, &op_own);
}

/* Tell the device which CQEs it may overwrite (after one poll or a batch). */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_cq_update_ci(vqp_mlx5_cq_t *cq)
{
    /* Finish reading the consumed CQEs before their slots are handed back. */
    ucs_memory_cpu_fence();
    cq->dbrec[VQP_MLX5_CQ_SET_CI] = htobe32(cq->ci & 0xffffff);
}

static UCS_F_ALWAYS_INLINE uint8_t
vqp_mlx5_cqe_opcode(const struct mlx5_cqe64 *cqe)
{
    return cqe->op_own >> 4;
}

/* Local QP (or SRQ user QP) the CQE belongs to: route errors by this and
 * the wqe_counter, never by opcode. */
static UCS_F_ALWAYS_INLINE uint32_t
vqp_mlx5_cqe_qpn(const struct mlx5_cqe64 *cqe)
{
    return be32toh(cqe->sop_drop_qpn) & 0xffffff;
}

static UCS_F_ALWAYS_INLINE uint16_t
vqp_mlx5_cqe_wqe_counter(const struct mlx5_cqe64 *cqe)
{
    return be16toh(cqe->wqe_counter);
}

/* Bytes received (responder CQEs) or moved by a READ/atomic. */
static UCS_F_ALWAYS_INLINE uint32_t
vqp_mlx5_cqe_byte_cnt(const struct mlx5_cqe64 *cqe)
{
    return be32toh(cqe->byte_cnt);
}

/* Immediate data of RESP_WR_IMM / RESP_SEND_IMM, raw (big-endian). */
static UCS_F_ALWAYS_INLINE __be32 vqp_mlx5_cqe_imm(const struct mlx5_cqe64 *cqe)
{
    return cqe->imm_inval_pkey;
}

static UCS_F_ALWAYS_INLINE uint8_t
vqp_mlx5_cqe_syndrome(const struct mlx5_cqe64 *cqe)
{
    return ((const struct mlx5_err_cqe *)cqe)->syndrome;
}

static UCS_F_ALWAYS_INLINE uint8_t
vqp_mlx5_cqe_vendor_syndrome(const struct mlx5_cqe64 *cqe)
{
    return ((const struct mlx5_err_cqe *)cqe)->vendor_err_synd;
}

/* What a syndrome means, for logs. */
static inline const char *vqp_mlx5_syndrome_str(uint8_t syndrome)
{
    switch (syndrome) {
    case MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR:
        return "local length error";
    case MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR:
        return "local QP operation error";
    case MLX5_CQE_SYNDROME_LOCAL_PROT_ERR:
        return "local protection error";
    case MLX5_CQE_SYNDROME_WR_FLUSH_ERR:
        return "work request flushed";
    case MLX5_CQE_SYNDROME_MW_BIND_ERR:
        return "memory window bind error";
    case MLX5_CQE_SYNDROME_BAD_RESP_ERR:
        return "bad response";
    case MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR:
        return "local access error";
    case MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR:
        return "remote invalid request";
    case MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR:
        return "remote access error";
    case MLX5_CQE_SYNDROME_REMOTE_OP_ERR:
        return "remote operation error";
    case MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR:
        return "transport retry counter exceeded";
    case MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR:
        return "RNR retry counter exceeded";
    case MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR:
        return "remote side aborted";
    default:
        return "unknown syndrome";
    }
}

/* For logs: what an error CQE says went wrong; NULL for any other CQE. */
static inline const char *vqp_mlx5_cqe_error_str(const struct mlx5_cqe64 *cqe)
{
    uint8_t opcode = vqp_mlx5_cqe_opcode(cqe);

    if ((opcode != MLX5_CQE_REQ_ERR) && (opcode != MLX5_CQE_RESP_ERR)) {
        return NULL;
    }
    return vqp_mlx5_syndrome_str(vqp_mlx5_cqe_syndrome(cqe));
}

/* Status a syndrome maps to, as UCX's rc_mlx5 maps it: a flush is the
 * consequence of an earlier error, the remote refusing is a reset, retries
 * running out is a timeout. */
static inline ucs_status_t vqp_mlx5_syndrome_status(uint8_t syndrome)
{
    switch (syndrome) {
    case MLX5_CQE_SYNDROME_WR_FLUSH_ERR:
        return UCS_ERR_CANCELED;
    case MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR:
    case MLX5_CQE_SYNDROME_REMOTE_OP_ERR:
        return UCS_ERR_CONNECTION_RESET;
    case MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR:
    case MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR:
    case MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR:
        return UCS_ERR_ENDPOINT_TIMEOUT;
    default:
        return UCS_ERR_IO_ERROR;
    }
}

/* Slow half of vqp_mlx5_cqe_status(). */
static inline ucs_status_t vqp_mlx5_cqe_exception(const struct mlx5_cqe64 *cqe)
{
    uint8_t opcode = vqp_mlx5_cqe_opcode(cqe);
    uint8_t synd;

    if ((cqe->op_own & 0x0c) == 0x0c) {
        /* We never enable CQE compression: its mini-CQE arrays would be
         * misread as CQEs. The CQ cannot be trusted from here on. */
        ucs_error("mlx5 cq: compressed CQE (op_own 0x%02x) on a CQ created"
                  " without compression",
                  cqe->op_own);
        return UCS_ERR_IO_ERROR;
    }
    if ((opcode != MLX5_CQE_REQ_ERR) && (opcode != MLX5_CQE_RESP_ERR)) {
        ucs_error("mlx5 cq: qp 0x%x: unexpected CQE opcode %u",
                  vqp_mlx5_cqe_qpn(cqe), opcode);
        return UCS_ERR_IO_ERROR;
    }
    synd = vqp_mlx5_cqe_syndrome(cqe);
    if (synd == MLX5_CQE_SYNDROME_WR_FLUSH_ERR) {
        ucs_debug("mlx5 cq: qp 0x%x wqe %u: %s", vqp_mlx5_cqe_qpn(cqe),
                  vqp_mlx5_cqe_wqe_counter(cqe), vqp_mlx5_syndrome_str(synd));
    } else {
        ucs_diag("mlx5 cq: qp 0x%x wqe %u %s: %s (syndrome 0x%x vendor 0x%x)",
                 vqp_mlx5_cqe_qpn(cqe), vqp_mlx5_cqe_wqe_counter(cqe),
                 (opcode == MLX5_CQE_REQ_ERR) ? "requester" : "responder",
                 vqp_mlx5_syndrome_str(synd), synd,
                 vqp_mlx5_cqe_vendor_syndrome(cqe));
    }
    return vqp_mlx5_syndrome_status(synd);
}

/* UCS_OK for a good completion, else what went wrong. Cheap when good:
 * opcodes 0..11 in normal format. */
static UCS_F_ALWAYS_INLINE ucs_status_t
vqp_mlx5_cqe_status(const struct mlx5_cqe64 *cqe)
{
    if (ucs_likely((cqe->op_own < (MLX5_CQE_SIG_ERR << 4)) &&
                   ((cqe->op_own & 0x0c) != 0x0c))) {
        return UCS_OK;
    }
    return vqp_mlx5_cqe_exception(cqe);
}

/* A successful requester CQE in normal format (opcode MLX5_CQE_REQ, format
 * not compressed): the fast path's one test, which implies
 * vqp_mlx5_cqe_status() == UCS_OK. */
static UCS_F_ALWAYS_INLINE int vqp_mlx5_op_own_is_req_ok(uint8_t op_own)
{
    return (op_own & 0xfc) < 0x0c;
}

static UCS_F_ALWAYS_INLINE int
vqp_mlx5_cqe_is_req_ok(const struct mlx5_cqe64 *cqe)
{
    return vqp_mlx5_op_own_is_req_ok(cqe->op_own);
}

/* Ask for an event at the next (solicited, if @a solicited) CQE. Needs the
 * CQ's doorbell page (dv->cq_uar). */
static inline ucs_status_t vqp_mlx5_cq_arm(vqp_mlx5_cq_t *cq, int solicited)
{
    uint32_t cmd = solicited ? MLX5_CQ_DB_REQ_NOT_SOL : MLX5_CQ_DB_REQ_NOT;
    uint32_t val =
        ((uint32_t)(cq->arm_sn & 3) << 28) | cmd | (cq->ci & 0xffffff);

    if (cq->uar == NULL) {
        ucs_error("mlx5 cq 0x%x: no doorbell page, cannot arm", cq->cqn);
        return UCS_ERR_UNSUPPORTED;
    }

    cq->dbrec[VQP_MLX5_CQ_ARM_DB] = htobe32(val);
    /* The arm record must be in memory before the doorbell makes the device
     * read it. */
    ucs_memory_bus_store_fence();
    *(volatile uint64_t *)(cq->uar + MLX5_CQ_DOORBELL) =
        htobe64(((uint64_t)val << 32) | cq->cqn);
    return UCS_OK;
}

/* Whether a poll would return the CQE at ci now: a look at its owner byte,
 * without the poll's acquire fence (nothing of the CQE is read), so that an
 * idle caller can skip its poll altogether. */
static UCS_F_ALWAYS_INLINE int vqp_mlx5_cq_ready(const vqp_mlx5_cq_t *cq)
{
    uint8_t op_own = *(volatile uint8_t *)&vqp_mlx5_cq_get(cq, cq->ci)->op_own;

    return vqp_mlx5_cqe_is_sw_owned(op_own, cq->ci, cq->log_cnt);
}

/* Right after an arm: a CQE the device wrote before it raised no event, so
 * the caller must not sleep when this says one waits at ci. The full fence
 * orders the arm's stores before the owner byte's load (one written after
 * the arm raises the event). */
static inline int vqp_mlx5_cq_ready_at_arm(const vqp_mlx5_cq_t *cq)
{
    ucs_memory_cpu_fence();
    return vqp_mlx5_cq_ready(cq);
}

/* An event arrived: the next arm must carry the next sequence number. */
static inline void vqp_mlx5_cq_event(vqp_mlx5_cq_t *cq)
{
    ++cq->arm_sn;
}
