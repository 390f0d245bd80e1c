/*
 * Device control over the software mlx5 device (src/sw): a thin mapping of
 * the ops table onto vqp_sw.h. The software device fills the same mlx5dv
 * structures as hardware, so only limits, addresses, progress and the SQ
 * doorbell (a call instead of a register) differ.
 */
#include <config.h>

#include "dev_int.h"

#include <mlx5/vqp_mlx5.h>
#include <sw/vqp_sw.h>
#include <ucs/debug/log.h>
#include <ucs/sys/compiler_def.h>
#include <stdlib.h>
#include <string.h>

/* Estimate for UCT's performance model: process_vm_writev moves 64 KiB-1 MiB
 * at 20-28 GB/s and large buffers at ~12 GB/s on the reference machines. */
#define VQP_DEV_SW_BANDWIDTH 12e9

/* No wire, so no MTU: report the largest IB one for fragment sizing. */
#define VQP_DEV_SW_MTU 4096

typedef struct vqp_dev_swd {
    vqp_dev_t super;
    vqp_sw_dev_t *sw;
    int exec_doorbell; /* the device executes WQEs at the SQ doorbell */
} vqp_dev_swd_t;

typedef struct vqp_dev_sw_mr {
    vqp_dev_mr_t super;
    vqp_sw_mr_t *mr;
} vqp_dev_sw_mr_t;

typedef struct vqp_dev_sw_cq {
    vqp_dev_cq_t super;
    vqp_sw_cq_t *cq;
} vqp_dev_sw_cq_t;

typedef struct vqp_dev_sw_srq {
    vqp_dev_srq_t super;
    vqp_sw_srq_t *srq;
} vqp_dev_sw_srq_t;

typedef struct vqp_dev_sw_qp {
    vqp_dev_qp_t super;
    vqp_sw_qp_t *qp;
    vqp_mlx5_db_hook_t db_hook; /* the data path's doorbell calls it */
} vqp_dev_sw_qp_t;

typedef struct vqp_dev_sw_ah {
    vqp_dev_ah_t super;
} vqp_dev_sw_ah_t;

#define vqp_dev_swd(_dev) ucs_container_of(_dev, vqp_dev_swd_t, super)->sw

static const vqp_dev_ops_t vqp_dev_sw_ops;

ucs_status_t vqp_dev_sw_open(const char *name, vqp_dev_t **dev_p)
{
    vqp_sw_dev_attr_t sw_attr;
    vqp_sw_dev_addr_t sw_addr;
    vqp_dev_attr_t *attr;
    vqp_dev_swd_t *dev;
    ucs_status_t status;

    dev = calloc(1, sizeof(*dev));
    if (dev == NULL) {
        ucs_error("%s: out of memory", name);
        return UCS_ERR_NO_MEMORY;
    }
    status = vqp_sw_dev_open(name, &dev->sw);
    if (status != UCS_OK) {
        free(dev);
        return status;
    }
    dev->super.ops = &vqp_dev_sw_ops;

    vqp_sw_dev_query(dev->sw, &sw_attr);
    attr = &dev->super.attr;
    snprintf(attr->name, sizeof(attr->name), "%s", name);
    attr->link        = VQP_DEV_LINK_SW;
    attr->max_qp_wr   = sw_attr.max_qp_wr;
    attr->max_sge     = sw_attr.max_sge;
    attr->max_inline  = sw_attr.max_inline;
    attr->max_cqe     = sw_attr.max_cqe;
    attr->max_srq_wr  = sw_attr.max_srq_wr;
    attr->max_mr      = sw_attr.max_mr;
    attr->max_rd_atom = sw_attr.max_rd_atom;
    /* The software device executes masked CS/FA on 4 and 8 bytes. */
    attr->ext_atomic_sizes = sizeof(uint32_t) | sizeof(uint64_t);
    attr->atomic_be_sizes  = sw_attr.atomic_be_sizes;
    attr->max_msg_sz       = sw_attr.max_msg_sz;
    attr->path_mtu         = VQP_DEV_SW_MTU;
    attr->bandwidth        = VQP_DEV_SW_BANDWIDTH;
    attr->gid_index        = -1;
    attr->max_ud_msg       = VQP_SW_UD_MAX_MSG;
    attr->comp_events      = 1;
    attr->qp_db_private    = 1; /* a BlueFlame buffer per QP */
    dev->exec_doorbell     = sw_attr.exec_doorbell;

    vqp_sw_dev_address(dev->sw, &sw_addr);
    dev->super.addr.type        = VQP_DEV_ADDR_SW;
    dev->super.addr.sw.pid      = sw_addr.pid;
    dev->super.addr.sw.instance = sw_addr.instance;

    ucs_debug("%s: software device, pid %u instance %u", name, sw_addr.pid,
              sw_addr.instance);
    *dev_p = &dev->super;
    return UCS_OK;
}

static void vqp_dev_sw_close(vqp_dev_t *dev)
{
    vqp_sw_dev_close(vqp_dev_swd(dev));
    free(ucs_container_of(dev, vqp_dev_swd_t, super));
}

static unsigned vqp_dev_sw_progress(vqp_dev_t *dev)
{
    return vqp_sw_progress(vqp_dev_swd(dev));
}

static ucs_status_t vqp_dev_sw_mr_reg(vqp_dev_t *dev, void *addr, size_t length,
                                      unsigned access, ucs_log_level_t level,
                                      vqp_dev_mr_t **mr_p, uint32_t *lkey_p,
                                      uint32_t *rkey_p)
{
    vqp_dev_sw_mr_t *mr;
    ucs_status_t status;

    mr = calloc(1, sizeof(*mr));
    if (mr == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    status = vqp_sw_mr_reg_log(vqp_dev_swd(dev), addr, length, access, level,
                               &mr->mr, lkey_p, rkey_p);
    if (status != UCS_OK) {
        free(mr);
        return status;
    }
    *mr_p = &mr->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_sw_mr_dereg(vqp_dev_mr_t *super)
{
    vqp_dev_sw_mr_t *mr = ucs_container_of(super, vqp_dev_sw_mr_t, super);
    ucs_status_t status;

    status = vqp_sw_mr_dereg(mr->mr);
    if (status == UCS_OK) {
        free(mr);
    }
    return status;
}

static ucs_status_t vqp_dev_sw_cq_create(vqp_dev_t *dev, uint32_t cqe,
                                         vqp_dev_cq_t **cq_p,
                                         struct mlx5dv_cq *dv)
{
    vqp_dev_sw_cq_t *cq;
    ucs_status_t status;

    cq = calloc(1, sizeof(*cq));
    if (cq == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    status = vqp_sw_cq_create(vqp_dev_swd(dev), cqe, &cq->cq, dv);
    if (status != UCS_OK) {
        free(cq);
        return status;
    }
    *cq_p = &cq->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_sw_cq_destroy(vqp_dev_cq_t *super)
{
    vqp_dev_sw_cq_t *cq = ucs_container_of(super, vqp_dev_sw_cq_t, super);
    ucs_status_t status;

    status = vqp_sw_cq_destroy(cq->cq);
    if (status == UCS_OK) {
        free(cq);
    }
    return status;
}

static ucs_status_t vqp_dev_sw_srq_create(vqp_dev_t *dev, uint32_t max_wr,
                                          uint32_t max_sge,
                                          vqp_dev_srq_t **srq_p,
                                          struct mlx5dv_srq *dv)
{
    vqp_dev_sw_srq_t *srq;
    ucs_status_t status;

    srq = calloc(1, sizeof(*srq));
    if (srq == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    status =
        vqp_sw_srq_create(vqp_dev_swd(dev), max_wr, max_sge, &srq->srq, dv);
    if (status != UCS_OK) {
        free(srq);
        return status;
    }
    /* The software device always fills srqn; say so as mlx5dv would. */
    dv->comp_mask |= MLX5DV_SRQ_MASK_SRQN;
    *srq_p = &srq->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_sw_srq_destroy(vqp_dev_srq_t *super)
{
    vqp_dev_sw_srq_t *srq = ucs_container_of(super, vqp_dev_sw_srq_t, super);
    ucs_status_t status;

    status = vqp_sw_srq_destroy(srq->srq);
    if (status == UCS_OK) {
        free(srq);
    }
    return status;
}

static void vqp_dev_sw_ring(void *arg)
{
    vqp_sw_qp_doorbell(arg);
}

/* In doorbell mode the data path rings by calling the device (see
 * VQP_MLX5_DV_QP_MASK_DB_HOOK); the BlueFlame area stays as it was for
 * software that writes it by hand. */
static void vqp_dev_sw_set_hook(vqp_dev_t *dev, vqp_dev_sw_qp_t *qp,
                                struct mlx5dv_qp *dv)
{
    if (!ucs_container_of(dev, vqp_dev_swd_t, super)->exec_doorbell) {
        return;
    }
    qp->db_hook.ring = vqp_dev_sw_ring;
    qp->db_hook.arg  = qp->qp;
    dv->comp_mask |= VQP_MLX5_DV_QP_MASK_DB_HOOK;
    dv->tir_icm_addr = (uintptr_t)&qp->db_hook;
}

static ucs_status_t vqp_dev_sw_qp_create(vqp_dev_t *dev,
                                         const vqp_dev_qp_init_t *init,
                                         vqp_dev_qp_t **qp_p,
                                         struct mlx5dv_qp *dv,
                                         vqp_dev_qp_caps_t *caps)
{
    vqp_sw_qp_init_attr_t sw_init = {};
    vqp_dev_sw_qp_t *qp;
    ucs_status_t status;

    qp = calloc(1, sizeof(*qp));
    if (qp == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    sw_init.send_cq =
        ucs_container_of(init->send_cq, vqp_dev_sw_cq_t, super)->cq;
    sw_init.recv_cq =
        ucs_container_of(init->recv_cq, vqp_dev_sw_cq_t, super)->cq;
    if (init->srq != NULL) {
        sw_init.srq = ucs_container_of(init->srq, vqp_dev_sw_srq_t, super)->srq;
    }
    sw_init.max_send_wr     = init->max_send_wr;
    sw_init.max_recv_wr     = init->max_recv_wr;
    sw_init.max_recv_sge    = init->max_recv_sge;
    sw_init.max_inline_data = init->max_inline;

    status =
        vqp_sw_qp_create(vqp_dev_swd(dev), &sw_init, &qp->qp, dv, &caps->qpn);
    if (status != UCS_OK) {
        free(qp);
        return status;
    }
    /* The software device has no separate inline limit per QP: it grants
     * what was asked within its device limit, and the ring sizes it made. */
    vqp_dev_sw_set_hook(dev, qp, dv);
    caps->max_inline  = init->max_inline;
    caps->max_send_wr = dv->sq.wqe_cnt;
    caps->max_recv_wr = (init->srq != NULL) ? 0 : dv->rq.wqe_cnt;
    *qp_p             = &qp->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_sw_qp_destroy(vqp_dev_qp_t *super)
{
    vqp_dev_sw_qp_t *qp = ucs_container_of(super, vqp_dev_sw_qp_t, super);
    ucs_status_t status;

    status = vqp_sw_qp_destroy(qp->qp);
    if (status == UCS_OK) {
        free(qp);
    }
    return status;
}

static ucs_status_t vqp_dev_sw_qp_modify(vqp_dev_qp_t *super,
                                         enum ibv_qp_state state,
                                         const vqp_dev_qp_addr_t *remote,
                                         const vqp_dev_connect_params_t *params)
{
    vqp_dev_sw_qp_t *qp   = ucs_container_of(super, vqp_dev_sw_qp_t, super);
    vqp_sw_qp_attr_t attr = {};

    attr.qp_state = state;
    if (params != NULL) {
        attr.qp_access_flags    = params->access;
        attr.min_rnr_timer      = params->min_rnr_timer;
        attr.timeout            = params->timeout;
        attr.retry_cnt          = params->retry_cnt;
        attr.rnr_retry          = params->rnr_retry;
        attr.max_rd_atomic      = params->max_rd_atomic
                                      ? params->max_rd_atomic
                                      : super->dev->attr.max_rd_atom;
        attr.max_dest_rd_atomic = super->dev->attr.max_rd_atom;
        if ((state == IBV_QPS_RTS) && (params->udp_sport_index >= 0)) {
            ucs_debug("%s: QP 0x%x: no UDP source port on the software "
                      "device, index %d ignored",
                      super->dev->attr.name, super->qpn,
                      params->udp_sport_index);
        }
    }
    if (remote != NULL) {
        attr.dest_dev.pid      = remote->dev.sw.pid;
        attr.dest_dev.instance = remote->dev.sw.instance;
        attr.dest_qp_num       = remote->qpn;
    }
    return vqp_sw_qp_modify(qp->qp, &attr);
}

static ucs_status_t vqp_dev_sw_ud_qp_create(vqp_dev_t *dev,
                                            const vqp_dev_ud_qp_init_t *init,
                                            vqp_dev_qp_t **qp_p,
                                            struct mlx5dv_qp *dv,
                                            vqp_dev_qp_caps_t *caps)
{
    static const enum ibv_qp_state path[] = {IBV_QPS_INIT, IBV_QPS_RTR,
                                             IBV_QPS_RTS};
    vqp_sw_qp_init_attr_t sw_init         = {};
    vqp_sw_qp_attr_t attr;
    vqp_dev_sw_qp_t *qp;
    ucs_status_t status;
    unsigned i;

    qp = calloc(1, sizeof(*qp));
    if (qp == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    sw_init.send_cq =
        ucs_container_of(init->send_cq, vqp_dev_sw_cq_t, super)->cq;
    sw_init.recv_cq =
        ucs_container_of(init->recv_cq, vqp_dev_sw_cq_t, super)->cq;
    sw_init.max_send_wr     = init->max_send_wr;
    sw_init.max_recv_wr     = init->max_recv_wr;
    sw_init.max_recv_sge    = init->max_recv_sge;
    sw_init.max_inline_data = init->max_inline;
    status = vqp_sw_ud_qp_create(vqp_dev_swd(dev), &sw_init, &qp->qp, dv,
                                 &caps->qpn);
    if (status != UCS_OK) {
        free(qp);
        return status;
    }
    for (i = 0; i < sizeof(path) / sizeof(path[0]); ++i) {
        memset(&attr, 0, sizeof(attr));
        attr.qp_state = path[i];
        attr.qkey     = (path[i] == IBV_QPS_INIT) ? init->qkey : 0;
        status        = vqp_sw_qp_modify(qp->qp, &attr);
        if (status != UCS_OK) {
            vqp_sw_qp_destroy(qp->qp);
            free(qp);
            return status;
        }
    }
    vqp_dev_sw_set_hook(dev, qp, dv);
    caps->max_inline  = init->max_inline;
    caps->max_send_wr = dv->sq.wqe_cnt;
    caps->max_recv_wr = dv->rq.wqe_cnt;
    *qp_p             = &qp->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_sw_ah_create(vqp_dev_t *dev,
                                         const vqp_dev_addr_t *remote,
                                         vqp_dev_ah_t **ah_p,
                                         struct mlx5_wqe_av *av)
{
    vqp_sw_dev_addr_t sw_addr;
    vqp_dev_sw_ah_t *ah;

    /* The AV is the whole handle: nothing to allocate in the device. */
    ah = calloc(1, sizeof(*ah));
    if (ah == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    sw_addr.pid      = remote->sw.pid;
    sw_addr.instance = remote->sw.instance;
    vqp_sw_ah_av(&sw_addr, av);
    *ah_p = &ah->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_sw_ah_destroy(vqp_dev_ah_t *super)
{
    free(ucs_container_of(super, vqp_dev_sw_ah_t, super));
    return UCS_OK;
}

static ucs_status_t vqp_dev_sw_event_fd(vqp_dev_t *dev, int *fd_p)
{
    return vqp_sw_dev_event_fd(vqp_dev_swd(dev), fd_p);
}

static ucs_status_t vqp_dev_sw_event_arm(vqp_dev_t *dev)
{
    return vqp_sw_dev_arm(vqp_dev_swd(dev));
}

static const vqp_dev_ops_t vqp_dev_sw_ops = {
    .close        = vqp_dev_sw_close,
    .progress     = vqp_dev_sw_progress,
    .mr_reg       = vqp_dev_sw_mr_reg,
    .mr_dereg     = vqp_dev_sw_mr_dereg,
    .cq_create    = vqp_dev_sw_cq_create,
    .cq_destroy   = vqp_dev_sw_cq_destroy,
    .srq_create   = vqp_dev_sw_srq_create,
    .srq_destroy  = vqp_dev_sw_srq_destroy,
    .qp_create    = vqp_dev_sw_qp_create,
    .qp_destroy   = vqp_dev_sw_qp_destroy,
    .qp_modify    = vqp_dev_sw_qp_modify,
    .ud_qp_create = vqp_dev_sw_ud_qp_create,
    .ah_create    = vqp_dev_sw_ah_create,
    .ah_destroy   = vqp_dev_sw_ah_destroy,
    .event_fd     = vqp_dev_sw_event_fd,
    .event_arm    = vqp_dev_sw_event_arm,
};
