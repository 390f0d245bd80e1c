/*
 * mlx5 receive side: a QP's own receive queue (a ring of scatter lists) and
 * the shared receive queue (scatter lists on a linked free list). Posting
 * writes WQEs only; vqp_mlx5_rxwq_ring / vqp_mlx5_srq_ring publish a batch.
 * Included by vqp_mlx5.h only.
 */

/* Scatter list of a receive WQE: zero-length entries are skipped (0 would
 * mean 2 GiB) and a short list ends with an invalid-lkey entry. */
static UCS_F_ALWAYS_INLINE void
vqp_mlx5_set_scatter(struct mlx5_wqe_data_seg *dseg, unsigned max_sge,
                     const vqp_mlx5_sge_t *sge, unsigned num_sge)
{
    unsigned i, n = 0;

    for (i = 0; i < num_sge; ++i) {
        if (sge[i].length == 0) {
            continue;
        }
        dseg[n].byte_count = htobe32(sge[i].length);
        dseg[n].lkey       = htobe32(sge[i].lkey);
        dseg[n].addr       = htobe64(sge[i].addr);
        ++n;
    }
    if (n < max_sge) {
        dseg[n].byte_count = 0;
        dseg[n].lkey       = htobe32(MLX5_INVALID_LKEY);
        dseg[n].addr       = 0;
    }
}

static inline ucs_status_t vqp_mlx5_rx_check(const char *what, const void *buf,
                                             const void *dbrec, uint32_t cnt,
                                             uint32_t stride, uint32_t hdr)
{
    if ((buf == NULL) || (dbrec == NULL) || (cnt == 0) || (cnt > 0x8000) ||
        (cnt & (cnt - 1)) ||
        (stride < hdr + sizeof(struct mlx5_wqe_data_seg)) ||
        (stride > 0x8000) || (stride & (stride - 1))) {
        ucs_error("mlx5 %s: buf %p dbrec %p %u WQEs of %u bytes: need a"
                  " power-of-two count <= 32768 and a power-of-two stride"
                  " holding a data segment",
                  what, buf, dbrec, cnt, stride);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

/* Set up @a rq over the receive queue of the QP @a dv describes. */
static inline ucs_status_t vqp_mlx5_rxwq_init(vqp_mlx5_rxwq_t *rq,
                                              const struct mlx5dv_qp *dv)
{
    ucs_status_t status;

    status = vqp_mlx5_rx_check("rq", dv->rq.buf, dv->dbrec, dv->rq.wqe_cnt,
                               dv->rq.stride, 0);
    if (status != UCS_OK) {
        return status;
    }
    memset(rq, 0, sizeof(*rq));
    rq->buf     = dv->rq.buf;
    rq->dbrec   = &dv->dbrec[MLX5_RCV_DBR];
    rq->mask    = dv->rq.wqe_cnt - 1;
    rq->stride  = dv->rq.stride;
    rq->max_sge = dv->rq.stride / sizeof(struct mlx5_wqe_data_seg);
    return UCS_OK;
}

/* Receive WQEs the RQ can still take. */
static UCS_F_ALWAYS_INLINE unsigned
vqp_mlx5_rxwq_avail(const vqp_mlx5_rxwq_t *rq)
{
    return (unsigned)rq->mask + 1 - (uint16_t)(rq->head - rq->tail);
}

/* Queue a receive of @a sge; returns its RQ index (a responder CQE's
 * wqe_counter) or a negative ucs_status_t. Not visible until ring. */
static UCS_F_ALWAYS_INLINE int vqp_mlx5_rxwq_post(vqp_mlx5_rxwq_t *rq,
                                                  const vqp_mlx5_sge_t *sge,
                                                  unsigned num_sge)
{
    uint16_t index = rq->head;

    if (ucs_unlikely(num_sge > rq->max_sge)) {
        ucs_error("mlx5 rq: %u SGEs, at most %u", num_sge, rq->max_sge);
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_unlikely(vqp_mlx5_rxwq_avail(rq) == 0)) {
        return UCS_ERR_NO_RESOURCE;
    }
    vqp_mlx5_set_scatter(
        (struct mlx5_wqe_data_seg *)(rq->buf +
                                     (size_t)(index & rq->mask) * rq->stride),
        rq->max_sge, sge, num_sge);
    rq->head = index + 1;
    return index;
}

/* Publish every receive posted so far. */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_rxwq_ring(vqp_mlx5_rxwq_t *rq)
{
    /* Scatter lists must be in memory before the record hands them over. */
    ucs_memory_cpu_store_fence();
    *rq->dbrec = htobe32(rq->head);
}

/* The receive at @a wqe_counter completed; the RQ is consumed in order. */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_rxwq_complete(vqp_mlx5_rxwq_t *rq,
                                                       uint16_t wqe_counter)
{
    rq->tail = wqe_counter + 1;
}

static UCS_F_ALWAYS_INLINE struct mlx5_wqe_srq_next_seg *
vqp_mlx5_srq_wqe(const vqp_mlx5_srq_t *srq, uint16_t index)
{
    return (struct mlx5_wqe_srq_next_seg *)(srq->buf +
                                            (size_t)(index & srq->mask) *
                                                srq->stride);
}

/*
 * Set up @a srq over a new SRQ @a dv describes. mlx5 providers hand it out
 * with head 0 and tail = WQEs - 1; the free list is (re)linked here in ring
 * order, as they link it, so it does not matter who linked it first.
 */
static inline ucs_status_t vqp_mlx5_srq_init(vqp_mlx5_srq_t *srq,
                                             const struct mlx5dv_srq *dv)
{
    uint32_t cnt = dv->tail + 1;
    ucs_status_t status;
    uint32_t i;

    if (dv->head != 0) {
        ucs_error("mlx5 srq: head %u tail %u: not a new SRQ", dv->head,
                  dv->tail);
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_mlx5_rx_check("srq", dv->buf, dv->dbrec, cnt, dv->stride,
                               sizeof(struct mlx5_wqe_srq_next_seg));
    if (status != UCS_OK) {
        return status;
    }
    memset(srq, 0, sizeof(*srq));
    srq->buf     = dv->buf;
    srq->dbrec   = dv->dbrec;
    srq->tail    = cnt - 1;
    srq->mask    = cnt - 1;
    srq->stride  = dv->stride;
    srq->max_sge = (dv->stride - sizeof(struct mlx5_wqe_srq_next_seg)) /
                   sizeof(struct mlx5_wqe_data_seg);
    for (i = 0; i < cnt; ++i) {
        vqp_mlx5_srq_wqe(srq, i)->next_wqe_index = htobe16((i + 1) & srq->mask);
    }
    return UCS_OK;
}

/* Queue a receive of @a sge; returns the SRQ WQE index a responder CQE will
 * name in wqe_counter, or a negative ucs_status_t. Not visible until ring. */
static UCS_F_ALWAYS_INLINE int vqp_mlx5_srq_post(vqp_mlx5_srq_t *srq,
                                                 const vqp_mlx5_sge_t *sge,
                                                 unsigned num_sge)
{
    uint16_t index = srq->head;
    struct mlx5_wqe_srq_next_seg *next;

    if (ucs_unlikely(num_sge > srq->max_sge)) {
        ucs_error("mlx5 srq: %u SGEs, at most %u", num_sge, srq->max_sge);
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_unlikely(srq->head == srq->tail)) {
        return UCS_ERR_NO_RESOURCE;
    }
    next      = vqp_mlx5_srq_wqe(srq, index);
    srq->head = be16toh(next->next_wqe_index);
    vqp_mlx5_set_scatter((struct mlx5_wqe_data_seg *)(next + 1), srq->max_sge,
                         sge, num_sge);
    ++srq->counter;
    return index;
}

/* Publish every receive posted so far. */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_srq_ring(vqp_mlx5_srq_t *srq)
{
    /* Scatter lists must be in memory before the counter hands them over. */
    ucs_memory_cpu_store_fence();
    *srq->dbrec = htobe32(srq->counter);
}

/* The device consumed the WQE at @a index (a responder CQE's wqe_counter):
 * append it to the free list so a later post can reuse it. */
static UCS_F_ALWAYS_INLINE void vqp_mlx5_srq_free(vqp_mlx5_srq_t *srq,
                                                  uint16_t index)
{
    vqp_mlx5_srq_wqe(srq, srq->tail)->next_wqe_index = htobe16(index);
    srq->tail                                        = index;
}
