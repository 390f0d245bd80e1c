/*
 * Test helper shared by the device-control tests and the hardware smoke
 * program: one hand-built RDMA WRITE WQE and a CQ poll loop, written
 * directly against the mlx5dv formats (the data path layer is not needed to
 * prove that the queues a device hands out work).
 */
#ifndef TEST_DEV_WQE_H_
#define TEST_DEV_WQE_H_

#include <dev/vqp_dev.h>

#include <endian.h>
#include <sched.h>
#include <string.h>
#include <time.h>

static inline double dev_wqe_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* RDMA WRITE of @a len bytes from (lkey, src) to (rkey, dst) at producer
 * index @a pi: ctrl, remote address and one data segment, asking for a CQE.
 */
static inline void dev_wqe_post_write(struct mlx5dv_qp *dv, uint32_t qpn,
                                      uint16_t pi, const void *src,
                                      uint32_t lkey, void *dst, uint32_t rkey,
                                      uint32_t len)
{
    void *wqe = (char *)dv->sq.buf + (pi & (dv->sq.wqe_cnt - 1)) * 64;
    struct mlx5_wqe_ctrl_seg *ctrl   = wqe;
    struct mlx5_wqe_raddr_seg *raddr = (void *)(ctrl + 1);
    struct mlx5_wqe_data_seg *data   = (void *)(raddr + 1);
    const unsigned ds                = 3; /* 16-byte units, ctrl included */

    memset(wqe, 0, 64);
    ctrl->opmod_idx_opcode =
        htobe32(((uint32_t)pi << 8) | MLX5_OPCODE_RDMA_WRITE);
    ctrl->qpn_ds     = htobe32((qpn << 8) | ds);
    ctrl->fm_ce_se   = MLX5_WQE_CTRL_CQ_UPDATE;
    raddr->raddr     = htobe64((uintptr_t)dst);
    raddr->rkey      = htobe32(rkey);
    data->byte_count = htobe32(len);
    data->lkey       = htobe32(lkey);
    data->addr       = htobe64((uintptr_t)src);

    /* The WQE must be in memory before the device sees the new producer
     * index, and the index before the doorbell write. */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    dv->dbrec[MLX5_SND_DBR] = htobe32((uint16_t)(pi + 1));
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (dv->bf.reg != NULL) {
        /* Doorbell: the first 8 bytes of the ctrl segment. */
        *(volatile uint64_t *)dv->bf.reg = *(uint64_t *)ctrl;
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* UD SEND of @a len bytes (at most 60: inline) to QP @a dqpn behind @a av
 * with @a qkey at producer index @a pi: ctrl, datagram segment (the first
 * BB), inline data (the second); asks for a CQE and rings. Returns the
 * next producer index. */
static inline uint16_t dev_wqe_post_ud_send(struct mlx5dv_qp *dv, uint32_t qpn,
                                            uint16_t pi,
                                            const struct mlx5_wqe_av *av,
                                            uint32_t dqpn, uint32_t qkey,
                                            const void *src, uint32_t len)
{
    uint8_t wqe[128];
    struct mlx5_wqe_ctrl_seg *ctrl    = (void *)wqe;
    struct mlx5_wqe_datagram_seg *dg  = (void *)(ctrl + 1);
    struct mlx5_wqe_inl_data_seg *inl = (void *)(dg + 1);
    const unsigned ds                 = 4 + (4 + len + 15) / 16;
    unsigned bb;

    memset(wqe, 0, sizeof(wqe));
    ctrl->opmod_idx_opcode = htobe32(((uint32_t)pi << 8) | MLX5_OPCODE_SEND);
    ctrl->qpn_ds           = htobe32((qpn << 8) | ds);
    ctrl->fm_ce_se         = MLX5_WQE_CTRL_CQ_UPDATE;
    memcpy(&dg->av, av, sizeof(dg->av));
    dg->av.dqp_dct       = htobe32(dqpn | MLX5_EXTENDED_UD_AV);
    dg->av.key.qkey.qkey = htobe32(qkey);
    inl->byte_count      = htobe32(len | MLX5_INLINE_SEG);
    memcpy(inl + 1, src, len);
    for (bb = 0; bb < 2; ++bb) {
        memcpy((char *)dv->sq.buf +
                   ((uint16_t)(pi + bb) & (dv->sq.wqe_cnt - 1)) * 64,
               wqe + bb * 64, 64);
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    dv->dbrec[MLX5_SND_DBR] = htobe32((uint16_t)(pi + 2));
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (dv->bf.reg != NULL) {
        *(volatile uint64_t *)dv->bf.reg = *(uint64_t *)wqe;
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return (uint16_t)(pi + 2);
}

/* One receive of @a len bytes at RQ index @a pi (RQ of 1-SGE WQEs). */
static inline void dev_wqe_post_recv(struct mlx5dv_qp *dv, uint16_t pi,
                                     void *buf, uint32_t len, uint32_t lkey)
{
    struct mlx5_wqe_data_seg *d =
        (void *)((char *)dv->rq.buf +
                 (pi & (dv->rq.wqe_cnt - 1)) * dv->rq.stride);

    d->byte_count = htobe32(len);
    d->lkey       = htobe32(lkey);
    d->addr       = htobe64((uintptr_t)buf);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    dv->dbrec[MLX5_RCV_DBR] = htobe32((uint16_t)(pi + 1));
}

/* Waits up to @a timeout seconds for the CQE at consumer index @a ci,
 * progressing @a devs meanwhile (the software device runs only then).
 * Returns the CQE opcode, or -1 on timeout. */
static inline int dev_wqe_poll(vqp_dev_t **devs, unsigned num_devs,
                               struct mlx5dv_cq *cq, uint32_t ci,
                               double timeout, struct mlx5_cqe64 **cqe_p)
{
    struct mlx5_cqe64 *cqe =
        (void *)((char *)cq->buf + (ci & (cq->cqe_cnt - 1)) * cq->cqe_size);
    unsigned owner  = !!(ci & cq->cqe_cnt);
    double deadline = dev_wqe_now() + timeout;
    uint8_t op_own;
    unsigned i;

    for (;;) {
        for (i = 0; i < num_devs; ++i) {
            vqp_dev_progress(devs[i]);
        }
        op_own = *(volatile uint8_t *)&cqe->op_own;
        if (((op_own >> 4) != MLX5_CQE_INVALID) &&
            ((op_own & MLX5_CQE_OWNER_MASK) == owner)) {
            break;
        }
        if (dev_wqe_now() > deadline) {
            return -1;
        }
        sched_yield();
    }
    /* Read the CQE body only after seeing it owned by software. */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    cq->dbrec[0] = htobe32((ci + 1) & 0xffffff);
    *cqe_p       = cqe;
    return op_own >> 4;
}

#endif
