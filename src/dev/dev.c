/*
 * Device control, common part: enumeration, dispatch by device name, the
 * argument and limit checks both implementations share, object accounting
 * (what still uses a device, CQ or SRQ) and the QP state machine of the
 * connect / error / reset calls. The implementations only talk to devices.
 */
#include <config.h>

#include "dev_int.h"

#include <mlx5/vqp_mlx5.h>

#include <ucs/debug/log.h>
#include <stdlib.h>
#include <string.h>

/* The remote rights a responder can grant and the local one they need. */
#define VQP_DEV_ACCESS_ALL                              \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)
#define VQP_DEV_ACCESS_REMOTE                           \
    (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
     IBV_ACCESS_REMOTE_ATOMIC)

const char *vqp_dev_qp_state_str(enum ibv_qp_state state)
{
    switch (state) {
    case IBV_QPS_RESET:
        return "RESET";
    case IBV_QPS_INIT:
        return "INIT";
    case IBV_QPS_RTR:
        return "RTR";
    case IBV_QPS_RTS:
        return "RTS";
    case IBV_QPS_SQD:
        return "SQD";
    case IBV_QPS_SQE:
        return "SQE";
    case IBV_QPS_ERR:
        return "ERROR";
    default:
        return "UNKNOWN";
    }
}

uint32_t vqp_dev_mtu_bytes(enum ibv_mtu mtu)
{
    if ((mtu < IBV_MTU_256) || (mtu > IBV_MTU_4096)) {
        return 0;
    }
    return 256u << (mtu - IBV_MTU_256);
}

enum ibv_mtu vqp_dev_mtu_enum(uint32_t bytes)
{
    enum ibv_mtu mtu;

    for (mtu = IBV_MTU_256; mtu <= IBV_MTU_4096; ++mtu) {
        if (vqp_dev_mtu_bytes(mtu) == bytes) {
            return mtu;
        }
    }
    return (enum ibv_mtu)0;
}

/* ------------------------------------------------------------ enumeration */

ucs_status_t vqp_dev_list(unsigned flags, vqp_dev_info_t **list_p,
                          unsigned *count_p)
{
    vqp_dev_info_t *list = NULL, *grown;
    unsigned count       = 0;
    ucs_status_t status;

    if ((list_p == NULL) || (count_p == NULL)) {
        ucs_error("vqp_dev_list: NULL output argument");
        return UCS_ERR_INVALID_PARAM;
    }
    if (flags & ~(unsigned)(VQP_DEV_LIST_SW | VQP_DEV_LIST_INACTIVE)) {
        ucs_error("vqp_dev_list: unknown flags 0x%x", flags);
        return UCS_ERR_INVALID_PARAM;
    }

    status = vqp_dev_hw_list(flags, &list, &count);
    if (status != UCS_OK) {
        free(list);
        return status;
    }

    if (flags & VQP_DEV_LIST_SW) {
        grown = realloc(list, (count + 1) * sizeof(*list));
        if (grown == NULL) {
            ucs_error("vqp_dev_list: out of memory");
            free(list);
            return UCS_ERR_NO_MEMORY;
        }
        list = grown;
        memset(&list[count], 0, sizeof(list[count]));
        strcpy(list[count].name, VQP_DEV_SW_NAME);
        list[count].link   = VQP_DEV_LINK_SW;
        list[count].active = 1;
        ++count;
    }

    *list_p  = list;
    *count_p = count;
    return UCS_OK;
}

void vqp_dev_list_free(vqp_dev_info_t *list)
{
    free(list);
}

/* ------------------------------------------------------------ device */

void vqp_dev_open_params_default(vqp_dev_open_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->gid_index = -1;
}

ucs_status_t vqp_dev_open(const char *name, const vqp_dev_open_params_t *params,
                          vqp_dev_t **dev_p)
{
    vqp_dev_open_params_t defaults;

    if ((name == NULL) || (dev_p == NULL)) {
        ucs_error("vqp_dev_open: NULL %s", (name == NULL) ? "name" : "dev_p");
        return UCS_ERR_INVALID_PARAM;
    }
    if ((name[0] == '\0') || (strlen(name) >= VQP_DEV_NAME_MAX)) {
        ucs_error("vqp_dev_open: device name '%.*s' is empty or longer than "
                  "%d characters",
                  VQP_DEV_NAME_MAX, name, VQP_DEV_NAME_MAX - 1);
        return UCS_ERR_INVALID_PARAM;
    }
    if (params == NULL) {
        vqp_dev_open_params_default(&defaults);
        params = &defaults;
    }
    if (params->gid_index < -1) {
        ucs_error("%s: GID index %d is invalid (-1: automatic)", name,
                  params->gid_index);
        return UCS_ERR_INVALID_PARAM;
    }

    if (!strcmp(name, VQP_DEV_SW_NAME)) {
        return vqp_dev_sw_open(name, dev_p);
    }
    return vqp_dev_hw_open(name, params, dev_p);
}

ucs_status_t vqp_dev_close(vqp_dev_t *dev)
{
    unsigned num_objs;

    if (dev == NULL) {
        return UCS_OK;
    }
    num_objs = __atomic_load_n(&dev->num_objs, __ATOMIC_ACQUIRE);
    if (num_objs != 0) {
        ucs_warn("%s: not closed, %u MRs/CQs/SRQs/QPs/AHs are still alive",
                 dev->attr.name, num_objs);
        return UCS_ERR_BUSY;
    }
    dev->ops->close(dev);
    return UCS_OK;
}

void vqp_dev_query(const vqp_dev_t *dev, vqp_dev_attr_t *attr)
{
    *attr = dev->attr;
}

unsigned vqp_dev_progress(vqp_dev_t *dev)
{
    return dev->ops->progress(dev);
}

void vqp_dev_address(const vqp_dev_t *dev, vqp_dev_addr_t *addr)
{
    *addr = dev->addr;
}

/* ------------------------------------------------------------ queues */

ucs_status_t vqp_dev_mr_reg(vqp_dev_t *dev, void *addr, size_t length,
                            unsigned access, vqp_dev_mr_t **mr_p,
                            uint32_t *lkey_p, uint32_t *rkey_p)
{
    ucs_log_level_t level = (access & VQP_DEV_MR_HIDE_ERRORS)
                                ? UCS_LOG_LEVEL_DIAG
                                : UCS_LOG_LEVEL_ERROR;
    ucs_status_t status;

    access &= ~VQP_DEV_MR_HIDE_ERRORS;
    if ((dev == NULL) || (mr_p == NULL) || (lkey_p == NULL) ||
        (rkey_p == NULL)) {
        ucs_error("vqp_dev_mr_reg: NULL device or output argument");
        return UCS_ERR_INVALID_PARAM;
    }
    if ((addr == NULL) || (length == 0)) {
        ucs_error("%s: cannot register %p length %zu: empty region",
                  dev->attr.name, addr, length);
        return UCS_ERR_INVALID_PARAM;
    }
    if (access & ~(unsigned)VQP_DEV_ACCESS_ALL) {
        ucs_error("%s: unsupported memory access flags 0x%x", dev->attr.name,
                  access & ~(unsigned)VQP_DEV_ACCESS_ALL);
        return UCS_ERR_INVALID_PARAM;
    }
    /* Verbs rule: the device writes into memory peers may write or atomically
     * update, so those rights need local write too. */
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE)) {
        ucs_error("%s: remote write/atomic access needs "
                  "IBV_ACCESS_LOCAL_WRITE (access 0x%x)",
                  dev->attr.name, access);
        return UCS_ERR_INVALID_PARAM;
    }

    status = dev->ops->mr_reg(dev, addr, length, access, level, mr_p, lkey_p,
                              rkey_p);
    if (status == UCS_OK) {
        (*mr_p)->dev = dev;
        vqp_dev_obj_add(dev, 1);
    }
    return status;
}

ucs_status_t vqp_dev_mr_dereg(vqp_dev_mr_t *mr)
{
    vqp_dev_t *dev;
    ucs_status_t status;

    if (mr == NULL) {
        return UCS_OK;
    }
    dev    = mr->dev;
    status = dev->ops->mr_dereg(mr);
    if (status == UCS_OK) {
        vqp_dev_obj_add(dev, -1);
    }
    return status;
}

ucs_status_t vqp_dev_cq_create(vqp_dev_t *dev, uint32_t cqe,
                               vqp_dev_cq_t **cq_p, struct mlx5dv_cq *dv)
{
    ucs_status_t status;

    if ((dev == NULL) || (cq_p == NULL) || (dv == NULL)) {
        ucs_error("vqp_dev_cq_create: NULL device or output argument");
        return UCS_ERR_INVALID_PARAM;
    }
    if ((cqe == 0) || (cqe > dev->attr.max_cqe)) {
        ucs_error("%s: CQ of %u entries requested, the device allows 1..%u",
                  dev->attr.name, cqe, dev->attr.max_cqe);
        return UCS_ERR_INVALID_PARAM;
    }

    memset(dv, 0, sizeof(*dv));
    status = dev->ops->cq_create(dev, cqe, cq_p, dv);
    if (status == UCS_OK) {
        (*cq_p)->dev       = dev;
        (*cq_p)->refcount  = 0;
        (*cq_p)->cqn       = dv->cqn;
        (*cq_p)->arm_uar   = dv->cq_uar;
        (*cq_p)->arm_dbrec = dv->dbrec;
        (*cq_p)->arm_sn    = 0;
        vqp_dev_obj_add(dev, 1);
        ucs_debug("%s: created CQ 0x%x of %u entries", dev->attr.name, dv->cqn,
                  dv->cqe_cnt);
    }
    return status;
}

ucs_status_t vqp_dev_cq_destroy(vqp_dev_cq_t *cq)
{
    vqp_dev_t *dev;
    ucs_status_t status;

    if (cq == NULL) {
        return UCS_OK;
    }
    dev = cq->dev;
    if (cq->refcount != 0) {
        ucs_error("%s: CQ 0x%x is still used by %u QPs", dev->attr.name,
                  cq->cqn, cq->refcount);
        return UCS_ERR_BUSY;
    }
    status = dev->ops->cq_destroy(cq);
    if (status == UCS_OK) {
        vqp_dev_obj_add(dev, -1);
    }
    return status;
}

/* ------------------------------------------------------------ events */

static ucs_status_t vqp_dev_events_check(vqp_dev_t *dev, const char *what)
{
    if (dev == NULL) {
        ucs_error("vqp_dev_%s: NULL device", what);
        return UCS_ERR_INVALID_PARAM;
    }
    if (!dev->attr.comp_events) {
        ucs_error("%s: %s: the device has no completion events", dev->attr.name,
                  what);
        return UCS_ERR_UNSUPPORTED;
    }
    return UCS_OK;
}

ucs_status_t vqp_dev_event_fd(vqp_dev_t *dev, int *fd_p)
{
    ucs_status_t status = vqp_dev_events_check(dev, "event_fd");

    if (status != UCS_OK) {
        return status;
    }
    if (fd_p == NULL) {
        ucs_error("%s: event_fd: NULL output argument", dev->attr.name);
        return UCS_ERR_INVALID_PARAM;
    }
    return dev->ops->event_fd(dev, fd_p);
}

ucs_status_t vqp_dev_event_arm(vqp_dev_t *dev)
{
    ucs_status_t status = vqp_dev_events_check(dev, "event_arm");

    return (status != UCS_OK) ? status : dev->ops->event_arm(dev);
}

ucs_status_t vqp_dev_cq_arm(vqp_dev_cq_t *cq, uint32_t ci, int solicited)
{
    vqp_mlx5_cq_t mcq;
    ucs_status_t status;

    if (cq == NULL) {
        ucs_error("vqp_dev_cq_arm: NULL CQ");
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_dev_events_check(cq->dev, "cq_arm");
    if (status != UCS_OK) {
        return status;
    }
    /* The data path's arm needs only these fields. */
    memset(&mcq, 0, sizeof(mcq));
    mcq.uar    = cq->arm_uar;
    mcq.dbrec  = cq->arm_dbrec;
    mcq.cqn    = cq->cqn;
    mcq.ci     = ci;
    mcq.arm_sn = cq->arm_sn;
    return vqp_mlx5_cq_arm(&mcq, solicited);
}

ucs_status_t vqp_dev_srq_create(vqp_dev_t *dev, uint32_t max_wr,
                                uint32_t max_sge, vqp_dev_srq_t **srq_p,
                                struct mlx5dv_srq *dv)
{
    ucs_status_t status;

    if ((dev == NULL) || (srq_p == NULL) || (dv == NULL)) {
        ucs_error("vqp_dev_srq_create: NULL device or output argument");
        return UCS_ERR_INVALID_PARAM;
    }
    if ((max_wr == 0) || (max_wr > dev->attr.max_srq_wr)) {
        ucs_error("%s: SRQ of %u WQEs requested, the device allows 1..%u",
                  dev->attr.name, max_wr, dev->attr.max_srq_wr);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((max_sge == 0) || (max_sge > dev->attr.max_sge)) {
        ucs_error("%s: SRQ with %u SGEs requested, the device allows 1..%u",
                  dev->attr.name, max_sge, dev->attr.max_sge);
        return UCS_ERR_INVALID_PARAM;
    }

    memset(dv, 0, sizeof(*dv));
    status = dev->ops->srq_create(dev, max_wr, max_sge, srq_p, dv);
    if (status == UCS_OK) {
        (*srq_p)->dev      = dev;
        (*srq_p)->refcount = 0;
        (*srq_p)->srqn     = dv->srqn;
        vqp_dev_obj_add(dev, 1);
    }
    return status;
}

ucs_status_t vqp_dev_srq_destroy(vqp_dev_srq_t *srq)
{
    vqp_dev_t *dev;
    ucs_status_t status;

    if (srq == NULL) {
        return UCS_OK;
    }
    dev = srq->dev;
    if (srq->refcount != 0) {
        ucs_error("%s: SRQ 0x%x is still used by %u QPs", dev->attr.name,
                  srq->srqn, srq->refcount);
        return UCS_ERR_BUSY;
    }
    status = dev->ops->srq_destroy(srq);
    if (status == UCS_OK) {
        vqp_dev_obj_add(dev, -1);
    }
    return status;
}

static ucs_status_t vqp_dev_qp_init_check(vqp_dev_t *dev,
                                          const vqp_dev_qp_init_t *init)
{
    const vqp_dev_attr_t *attr = &dev->attr;

    if ((init->send_cq == NULL) || (init->recv_cq == NULL)) {
        ucs_error("%s: QP needs a send CQ and a receive CQ", attr->name);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((init->send_cq->dev != dev) || (init->recv_cq->dev != dev) ||
        ((init->srq != NULL) && (init->srq->dev != dev))) {
        ucs_error("%s: QP queues belong to another device", attr->name);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((init->max_send_wr == 0) || (init->max_send_wr > attr->max_qp_wr)) {
        ucs_error("%s: QP with %u send WQEs requested, the device allows "
                  "1..%u",
                  attr->name, init->max_send_wr, attr->max_qp_wr);
        return UCS_ERR_INVALID_PARAM;
    }
    if (init->max_send_sge > attr->max_sge) {
        ucs_error("%s: QP with %u send SGEs requested, the device allows %u",
                  attr->name, init->max_send_sge, attr->max_sge);
        return UCS_ERR_INVALID_PARAM;
    }
    if (init->max_inline > attr->max_inline) {
        ucs_error("%s: QP with %u inline bytes requested, the device allows "
                  "%u",
                  attr->name, init->max_inline, attr->max_inline);
        return UCS_ERR_INVALID_PARAM;
    }
    if (init->srq != NULL) {
        if ((init->max_recv_wr != 0) || (init->max_recv_sge != 0)) {
            ucs_error("%s: a QP on an SRQ has no receive queue of its own "
                      "(max_recv_wr %u, max_recv_sge %u)",
                      attr->name, init->max_recv_wr, init->max_recv_sge);
            return UCS_ERR_INVALID_PARAM;
        }
    } else if ((init->max_recv_wr > attr->max_qp_wr) ||
               (init->max_recv_sge > attr->max_sge) ||
               ((init->max_recv_wr != 0) && (init->max_recv_sge == 0))) {
        ucs_error("%s: QP receive queue of %u WQEs x %u SGEs is invalid, the "
                  "device allows %u x 1..%u",
                  attr->name, init->max_recv_wr, init->max_recv_sge,
                  attr->max_qp_wr, attr->max_sge);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

/* Accounting of a new QP, shared by RC and UD. */
static void vqp_dev_qp_track(vqp_dev_t *dev, vqp_dev_qp_t *qp,
                             const vqp_dev_qp_init_t *init, uint32_t qpn)
{
    qp->dev       = dev;
    qp->send_cq   = init->send_cq;
    qp->recv_cq   = init->recv_cq;
    qp->srq       = init->srq;
    qp->qpn       = qpn;
    qp->udp_sport = 0;
    /* Counted once per QP, also when one CQ serves both directions. */
    ++qp->send_cq->refcount;
    if (qp->recv_cq != qp->send_cq) {
        ++qp->recv_cq->refcount;
    }
    if (qp->srq != NULL) {
        ++qp->srq->refcount;
    }
    vqp_dev_obj_add(dev, 1);
}

ucs_status_t vqp_dev_qp_create(vqp_dev_t *dev, const vqp_dev_qp_init_t *init,
                               vqp_dev_qp_t **qp_p, struct mlx5dv_qp *dv,
                               vqp_dev_qp_caps_t *caps)
{
    vqp_dev_qp_t *qp;
    ucs_status_t status;

    if ((dev == NULL) || (init == NULL) || (qp_p == NULL) || (dv == NULL) ||
        (caps == NULL)) {
        ucs_error("vqp_dev_qp_create: NULL device, attributes or output "
                  "argument");
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_dev_qp_init_check(dev, init);
    if (status != UCS_OK) {
        return status;
    }

    memset(dv, 0, sizeof(*dv));
    memset(caps, 0, sizeof(*caps));
    status = dev->ops->qp_create(dev, init, &qp, dv, caps);
    if (status != UCS_OK) {
        return status;
    }

    vqp_dev_qp_track(dev, qp, init, caps->qpn);
    qp->ud    = 0;
    qp->state = IBV_QPS_RESET;
    ucs_debug("%s: created QP 0x%x (sq %u x %u B, inline %u)", dev->attr.name,
              qp->qpn, dv->sq.wqe_cnt, dv->sq.stride, caps->max_inline);
    *qp_p = qp;
    return UCS_OK;
}

ucs_status_t vqp_dev_ud_qp_create(vqp_dev_t *dev,
                                  const vqp_dev_ud_qp_init_t *init,
                                  vqp_dev_qp_t **qp_p, struct mlx5dv_qp *dv,
                                  vqp_dev_qp_caps_t *caps)
{
    vqp_dev_qp_init_t rc_init = {};
    vqp_dev_qp_t *qp;
    ucs_status_t status;

    if ((dev == NULL) || (init == NULL) || (qp_p == NULL) || (dv == NULL) ||
        (caps == NULL)) {
        ucs_error("vqp_dev_ud_qp_create: NULL device, attributes or output "
                  "argument");
        return UCS_ERR_INVALID_PARAM;
    }
    /* The queue limits are those of any QP with its own RQ. */
    rc_init.send_cq      = init->send_cq;
    rc_init.recv_cq      = init->recv_cq;
    rc_init.max_send_wr  = init->max_send_wr;
    rc_init.max_send_sge = init->max_send_sge;
    rc_init.max_recv_wr  = init->max_recv_wr;
    rc_init.max_recv_sge = init->max_recv_sge;
    rc_init.max_inline   = init->max_inline;
    status               = vqp_dev_qp_init_check(dev, &rc_init);
    if (status != UCS_OK) {
        return status;
    }
    if (init->qkey & 0x80000000u) {
        ucs_error("%s: UD qkey 0x%x has the high bit set (a controlled qkey, "
                  "privileged)",
                  dev->attr.name, init->qkey);
        return UCS_ERR_INVALID_PARAM;
    }

    memset(dv, 0, sizeof(*dv));
    memset(caps, 0, sizeof(*caps));
    status = dev->ops->ud_qp_create(dev, init, &qp, dv, caps);
    if (status != UCS_OK) {
        return status;
    }
    vqp_dev_qp_track(dev, qp, &rc_init, caps->qpn);
    qp->ud    = 1;
    qp->state = IBV_QPS_RTS;
    ucs_debug("%s: created UD QP 0x%x (sq %u x %u B, rq %u, inline %u, "
              "qkey 0x%x)",
              dev->attr.name, qp->qpn, dv->sq.wqe_cnt, dv->sq.stride,
              dv->rq.wqe_cnt, caps->max_inline, init->qkey);
    *qp_p = qp;
    return UCS_OK;
}

ucs_status_t vqp_dev_ah_create(vqp_dev_t *dev, const vqp_dev_addr_t *remote,
                               vqp_dev_ah_t **ah_p, struct mlx5_wqe_av *av)
{
    ucs_status_t status;

    if ((dev == NULL) || (remote == NULL) || (ah_p == NULL) || (av == NULL)) {
        ucs_error("vqp_dev_ah_create: NULL device, address or output "
                  "argument");
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_dev_is_reachable(dev, remote);
    if (status != UCS_OK) {
        ucs_error("%s: no address handle: the %s peer is unreachable",
                  dev->attr.name,
                  (remote->type == VQP_DEV_ADDR_SW)     ? "software"
                  : (remote->type == VQP_DEV_ADDR_IB)   ? "IB"
                  : (remote->type == VQP_DEV_ADDR_ROCE) ? "RoCE"
                                                        : "unknown");
        return status;
    }
    memset(av, 0, sizeof(*av));
    status = dev->ops->ah_create(dev, remote, ah_p, av);
    if (status != UCS_OK) {
        return status;
    }
    (*ah_p)->dev = dev;
    vqp_dev_obj_add(dev, 1);
    return UCS_OK;
}

ucs_status_t vqp_dev_ah_destroy(vqp_dev_ah_t *ah)
{
    vqp_dev_t *dev;
    ucs_status_t status;

    if (ah == NULL) {
        return UCS_OK;
    }
    dev    = ah->dev;
    status = dev->ops->ah_destroy(ah);
    if (status == UCS_OK) {
        vqp_dev_obj_add(dev, -1);
    }
    return status;
}

ucs_status_t vqp_dev_qp_destroy(vqp_dev_qp_t *qp)
{
    vqp_dev_cq_t *send_cq, *recv_cq;
    vqp_dev_srq_t *srq;
    vqp_dev_t *dev;
    ucs_status_t status;

    if (qp == NULL) {
        return UCS_OK;
    }
    dev     = qp->dev;
    send_cq = qp->send_cq;
    recv_cq = qp->recv_cq;
    srq     = qp->srq;
    status  = dev->ops->qp_destroy(qp);
    if (status != UCS_OK) {
        return status;
    }
    --send_cq->refcount;
    if (recv_cq != send_cq) {
        --recv_cq->refcount;
    }
    if (srq != NULL) {
        --srq->refcount;
    }
    vqp_dev_obj_add(dev, -1);
    return UCS_OK;
}

/* ------------------------------------------------------------ connection */

void vqp_dev_connect_params_default(vqp_dev_connect_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->access          = VQP_DEV_ACCESS_REMOTE;
    params->min_rnr_timer   = 12; /* 0.64 ms, the common verbs default */
    params->rnr_retry       = 7;  /* infinite: receivers refill eventually */
    params->retry_cnt       = 7;
    params->timeout         = 18; /* ~1 s before a retry */
    params->max_rd_atomic   = 0;
    params->hop_limit       = 64;
    params->path_mtu        = 0;
    params->udp_sport_index = -1;
}

uint16_t vqp_dev_udp_sport(uint16_t base, unsigned index)
{
    /* RoCE v2 source ports live in the dynamic range; consecutive indices
     * get consecutive ports, so N QPs of one virtual QP get N ports. */
    return (uint16_t)(0xC000u | ((base + index) & 0x3FFFu));
}

static ucs_status_t
vqp_dev_connect_params_check(const vqp_dev_qp_t *qp,
                             const vqp_dev_connect_params_t *params)
{
    const char *name = qp->dev->attr.name;

    if (params->access & ~(unsigned)VQP_DEV_ACCESS_REMOTE) {
        ucs_error("%s: QP 0x%x: access 0x%x has non-remote flags", name,
                  qp->qpn, params->access);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((params->min_rnr_timer > 31) || (params->timeout > 31) ||
        (params->rnr_retry > 7) || (params->retry_cnt > 7)) {
        ucs_error("%s: QP 0x%x: out of range: min_rnr_timer %u (0..31), "
                  "timeout %u (0..31), rnr_retry %u (0..7), retry_cnt %u "
                  "(0..7)",
                  name, qp->qpn, params->min_rnr_timer, params->timeout,
                  params->rnr_retry, params->retry_cnt);
        return UCS_ERR_INVALID_PARAM;
    }
    if (params->max_rd_atomic > qp->dev->attr.max_rd_atom) {
        ucs_error("%s: QP 0x%x: max_rd_atomic %u above the device's %u", name,
                  qp->qpn, params->max_rd_atomic, qp->dev->attr.max_rd_atom);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((params->path_mtu != 0) &&
        ((vqp_dev_mtu_enum(params->path_mtu) == 0) ||
         (params->path_mtu > qp->dev->attr.path_mtu))) {
        ucs_error("%s: QP 0x%x: path MTU %u is not 256..%u bytes, power of 2",
                  name, qp->qpn, params->path_mtu, qp->dev->attr.path_mtu);
        return UCS_ERR_INVALID_PARAM;
    }
    if (params->udp_sport_index < -1) {
        ucs_error("%s: QP 0x%x: udp_sport_index %d (-1: NIC default)", name,
                  qp->qpn, params->udp_sport_index);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

static ucs_status_t vqp_dev_qp_move(vqp_dev_qp_t *qp, enum ibv_qp_state state,
                                    const vqp_dev_qp_addr_t *remote,
                                    const vqp_dev_connect_params_t *params)
{
    ucs_status_t status;

    status = qp->dev->ops->qp_modify(qp, state, remote, params);
    if (status != UCS_OK) {
        return status;
    }
    ucs_debug("%s: QP 0x%x %s -> %s", qp->dev->attr.name, qp->qpn,
              vqp_dev_qp_state_str(qp->state), vqp_dev_qp_state_str(state));
    qp->state = state;
    return UCS_OK;
}

ucs_status_t vqp_dev_qp_connect(vqp_dev_qp_t *qp,
                                const vqp_dev_qp_addr_t *remote,
                                const vqp_dev_connect_params_t *params)
{
    static const enum ibv_qp_state path[] = {IBV_QPS_INIT, IBV_QPS_RTR,
                                             IBV_QPS_RTS};
    vqp_dev_connect_params_t defaults;
    ucs_status_t status;
    unsigned i;

    if ((qp == NULL) || (remote == NULL)) {
        ucs_error("vqp_dev_qp_connect: NULL %s",
                  (qp == NULL) ? "QP" : "remote address");
        return UCS_ERR_INVALID_PARAM;
    }
    if (params == NULL) {
        vqp_dev_connect_params_default(&defaults);
        params = &defaults;
    }
    if (qp->ud) {
        ucs_error("%s: QP 0x%x is a UD QP: it is ready at creation and "
                  "never connected",
                  qp->dev->attr.name, qp->qpn);
        return UCS_ERR_INVALID_PARAM;
    }
    if (qp->state != IBV_QPS_RESET) {
        ucs_error("%s: QP 0x%x is in state %s: connecting needs RESET "
                  "(reset it first)",
                  qp->dev->attr.name, qp->qpn, vqp_dev_qp_state_str(qp->state));
        return UCS_ERR_INVALID_PARAM;
    }
    /* QPNs 0 and 1 are the IB management QPs (SMI, GSI), never an RC peer. */
    if ((remote->qpn < 2) || (remote->qpn > 0xffffff)) {
        ucs_error("%s: QP 0x%x: remote QPN 0x%x is not an RC QP number "
                  "(2..0xffffff)",
                  qp->dev->attr.name, qp->qpn, remote->qpn);
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_dev_connect_params_check(qp, params);
    if (status != UCS_OK) {
        return status;
    }
    status = vqp_dev_is_reachable(qp->dev, &remote->dev);
    if (status != UCS_OK) {
        /* A peer whose process ended is a peer failure, not a wrong
         * address: its user learns of it from the status, and UCX logs
         * failures of peers at diag level. */
        if (vqp_dev_sw_peer_gone(&remote->dev)) {
            ucs_diag("%s: QP 0x%x cannot reach remote QP 0x%x: its process "
                     "%u has ended",
                     qp->dev->attr.name, qp->qpn, remote->qpn,
                     remote->dev.sw.pid);
        } else {
            ucs_error("%s: QP 0x%x cannot reach remote QP 0x%x",
                      qp->dev->attr.name, qp->qpn, remote->qpn);
        }
        return status;
    }

    for (i = 0; i < sizeof(path) / sizeof(path[0]); ++i) {
        status = vqp_dev_qp_move(qp, path[i], remote, params);
        if (status != UCS_OK) {
            /* Leave a QP that can be connected again, not a half-way one. */
            if (vqp_dev_qp_move(qp, IBV_QPS_RESET, NULL, NULL) != UCS_OK) {
                qp->state = IBV_QPS_ERR;
            }
            return status;
        }
    }
    return UCS_OK;
}

ucs_status_t vqp_dev_qp_set_error(vqp_dev_qp_t *qp)
{
    if (qp == NULL) {
        ucs_error("vqp_dev_qp_set_error: NULL QP");
        return UCS_ERR_INVALID_PARAM;
    }
    return vqp_dev_qp_move(qp, IBV_QPS_ERR, NULL, NULL);
}

ucs_status_t vqp_dev_qp_reset(vqp_dev_qp_t *qp)
{
    ucs_status_t status;

    if (qp == NULL) {
        ucs_error("vqp_dev_qp_reset: NULL QP");
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_dev_qp_move(qp, IBV_QPS_RESET, NULL, NULL);
    if (status == UCS_OK) {
        qp->udp_sport = 0;
    }
    return status;
}

enum ibv_qp_state vqp_dev_qp_state(const vqp_dev_qp_t *qp)
{
    return qp->state;
}

uint16_t vqp_dev_qp_udp_sport(const vqp_dev_qp_t *qp)
{
    return qp->udp_sport;
}
