/*
 * Shared receive queue of the core: one SRQ of receive buffers that the send
 * QPs of many virtual QPs take SENDs into (the UCT glue's active messages),
 * so receive memory grows with the interface, not with its endpoints. The
 * buffers' wr_ids are kept per SRQ WQE; a receive CQE names the WQE and
 * arrives on the receiving virtual QP's send QP (vqp_recv.c delivers it).
 */
#include <config.h>

#include "vqp_int.h"

#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <string.h>

ucs_status_t vqp_srq_create(vqp_cq_t *cq, uint32_t max_wr, vqp_srq_t **srq_p)
{
    vqp_cq_dev_t *cdev;
    struct mlx5dv_srq dv;
    ucs_status_t status;
    vqp_srq_t *srq;
    uint32_t cnt;

    if ((cq == NULL) || (max_wr == 0) || (max_wr > 32767)) {
        ucs_error("vqp srq: cq %p, %u buffers: need a CQ and 1..32767", cq,
                  max_wr);
        return UCS_ERR_INVALID_PARAM;
    }
    cdev = &cq->devs[0];
    srq  = ucs_calloc(1, sizeof(*srq), "vqp_srq");
    if (srq == NULL) {
        ucs_error("vqp srq: out of memory");
        return UCS_ERR_NO_MEMORY;
    }
    srq->cq = cq;
    memset(&dv, 0, sizeof(dv));
    status = vqp_dev_srq_create(cdev->dev, max_wr, 1, &srq->dev_srq, &dv);
    if (status != UCS_OK) {
        goto err_free;
    }
    status = vqp_mlx5_srq_init(&srq->mlx, &dv);
    if (status != UCS_OK) {
        goto err_srq;
    }
    cnt         = srq->mlx.mask + 1;
    srq->wr_id  = ucs_calloc(cnt, sizeof(*srq->wr_id), "vqp_srq_wr_id");
    srq->busy   = ucs_calloc(cnt, sizeof(*srq->busy), "vqp_srq_busy");
    srq->sge    = ucs_calloc(cnt, sizeof(*srq->sge), "vqp_srq_sge");
    srq->max_wr = cnt;
    if ((srq->wr_id == NULL) || (srq->busy == NULL) || (srq->sge == NULL)) {
        ucs_error("vqp srq: out of memory for %u entries", cnt);
        status = UCS_ERR_NO_MEMORY;
        goto err_arrays;
    }
    /* Every buffer can complete at once, into the CQ of the send QPs. */
    status = vqp_cq_dev_reserve(cdev, cnt, 0, "a shared receive queue");
    if (status != UCS_OK) {
        goto err_arrays;
    }
    *srq_p = srq;
    return UCS_OK;

err_arrays:
    ucs_free(srq->wr_id);
    ucs_free(srq->busy);
    ucs_free(srq->sge);
err_srq:
    vqp_dev_srq_destroy(srq->dev_srq);
err_free:
    ucs_free(srq);
    return status;
}

ucs_status_t vqp_srq_destroy(vqp_srq_t *srq,
                             void (*release)(void *arg, uint64_t wr_id),
                             void *arg)
{
    uint32_t i;

    if (srq->users != 0) {
        ucs_error("vqp srq %p: destroyed while %u virtual QPs use it", srq,
                  srq->users);
        return UCS_ERR_BUSY;
    }
    for (i = 0; i < srq->max_wr; ++i) {
        if (srq->busy[i] && (release != NULL)) {
            release(arg, srq->wr_id[i]);
        }
    }
    vqp_cq_dev_release(&srq->cq->devs[0], srq->max_wr, 0);
    vqp_dev_srq_destroy(srq->dev_srq);
    ucs_free(srq->wr_id);
    ucs_free(srq->busy);
    ucs_free(srq->sge);
    ucs_free(srq);
    return UCS_OK;
}

ucs_status_t vqp_srq_post_recv(vqp_srq_t *srq, const vqp_recv_wr_t *wr)
{
    vqp_mlx5_sge_t sge;
    int ret;

    if ((wr->length == 0) || (wr->length > UINT32_MAX)) {
        ucs_error("vqp srq %p: receive of %lu bytes: need 1 byte .. 4 GiB - 1",
                  srq, wr->length);
        return UCS_ERR_INVALID_PARAM;
    }
    sge.addr   = wr->addr;
    sge.length = (uint32_t)wr->length;
    sge.lkey   = wr->lkey[0];
    ret        = vqp_mlx5_srq_post(&srq->mlx, &sge, 1);
    if (ret < 0) {
        return (ucs_status_t)ret;
    }
    srq->wr_id[ret & srq->mlx.mask] = wr->wr_id;
    srq->sge[ret & srq->mlx.mask]   = sge;
    srq->busy[ret & srq->mlx.mask]  = 1;
    ++srq->posted;
    vqp_mlx5_srq_ring(&srq->mlx);
    return UCS_OK;
}

unsigned vqp_srq_posted(const vqp_srq_t *srq)
{
    return srq->posted;
}

/* A receive CQE of a destroyed send QP on @a srq, not polled: post its
 * buffer again (the entry would be stranded otherwise). Returns 1 if it did. */
int vqp_srq_reclaim(vqp_srq_t *srq, const struct mlx5_cqe64 *cqe)
{
    uint16_t index = vqp_mlx5_cqe_wqe_counter(cqe) & srq->mlx.mask;
    uint8_t opcode = vqp_mlx5_cqe_opcode(cqe);
    vqp_mlx5_sge_t sge;
    uint64_t wr_id;
    int ret;

    if (((opcode != MLX5_CQE_RESP_SEND) && (opcode != MLX5_CQE_RESP_SEND_IMM) &&
         (opcode != MLX5_CQE_RESP_WR_IMM) && (opcode != MLX5_CQE_RESP_ERR)) ||
        !srq->busy[index]) {
        return 0;
    }
    wr_id            = srq->wr_id[index];
    sge              = srq->sge[index];
    srq->busy[index] = 0;
    --srq->posted;
    vqp_mlx5_srq_free(&srq->mlx, index);
    ret = vqp_mlx5_srq_post(&srq->mlx, &sge, 1);
    if (ret < 0) {
        ucs_error("vqp srq %p: re-posting a reclaimed buffer failed: %s", srq,
                  ucs_status_string((ucs_status_t)ret));
        return 0;
    }
    srq->wr_id[ret & srq->mlx.mask] = wr_id;
    srq->sge[ret & srq->mlx.mask]   = sge;
    srq->busy[ret & srq->mlx.mask]  = 1;
    ++srq->posted;
    vqp_mlx5_srq_ring(&srq->mlx);
    return 1;
}
