/*
 * Virtual CQ: one physical CQ per device, the QPN table that routes each CQE
 * to its physical QP (and so to its virtual QP), bounded polling, and the
 * completion ring of QPs that report by vqp_cq_poll() instead of a callback.
 */
#include <config.h>

#include "vqp_int.h"

#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/math.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* Event fds of virtual CQs (vqp_cq_event_fd), by CQ: kept beside the CQ
 * object so that only CQs that asked pay for one. */
static pthread_mutex_t vqp_cq_efd_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const vqp_cq_t *cq;
    int fd;
} * vqp_cq_efds;
static unsigned vqp_cq_num_efds;

/* The slot of @a cq, or -1; with the lock held. */
static int vqp_cq_efd_find(const vqp_cq_t *cq)
{
    unsigned i;

    for (i = 0; i < vqp_cq_num_efds; ++i) {
        if (vqp_cq_efds[i].cq == cq) {
            return (int)i;
        }
    }
    return -1;
}

static void vqp_cq_efd_close(const vqp_cq_t *cq)
{
    int i;

    pthread_mutex_lock(&vqp_cq_efd_lock);
    i = vqp_cq_efd_find(cq);
    if (i >= 0) {
        close(vqp_cq_efds[i].fd);
        vqp_cq_efds[i] = vqp_cq_efds[--vqp_cq_num_efds];
    }
    pthread_mutex_unlock(&vqp_cq_efd_lock);
}

void vqp_cq_params_default(vqp_cq_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->cqe        = 4096;
    params->max_poll   = 64;
    params->max_covers = VQP_CQ_MAX_COVERS_DEFAULT;
}

vqp_pqp_t *const vqp_qpn_none[VQP_QPN_LOW_SIZE];

ucs_status_t vqp_cq_create(const vqp_cq_params_t *params, vqp_cq_t **cq_p)
{
    struct mlx5dv_cq dv;
    ucs_status_t status;
    vqp_cq_t *cq;
    unsigned i, j;

    if ((params->num_devs == 0) || (params->num_devs > VQP_MAX_DEVS) ||
        (params->cqe == 0) || (params->max_poll == 0) ||
        (params->max_covers == 0)) {
        ucs_error("vqp cq: %u devices (1..%d), %u CQEs, max_poll %u,"
                  " max_covers %u: invalid",
                  params->num_devs, VQP_MAX_DEVS, params->cqe, params->max_poll,
                  params->max_covers);
        return UCS_ERR_INVALID_PARAM;
    }

    cq = ucs_calloc(1, sizeof(*cq), "vqp_cq");
    if (cq == NULL) {
        ucs_error("vqp cq: out of memory");
        return UCS_ERR_NO_MEMORY;
    }
    cq->max_poll   = params->max_poll;
    cq->max_covers = params->max_covers;
    ucs_list_head_init(&cq->vqps);
    ucs_list_head_init(&cq->credit_waiters);
    cq->dirty = ucs_calloc(params->max_poll, sizeof(*cq->dirty), "vqp_dirty");
    if (cq->dirty == NULL) {
        ucs_error("vqp cq: out of memory");
        ucs_free(cq);
        return UCS_ERR_NO_MEMORY;
    }

    for (i = 0; i < params->num_devs; ++i) {
        if (params->devs[i] == NULL) {
            ucs_error("vqp cq: device %u is NULL", i);
            status = UCS_ERR_INVALID_PARAM;
            goto err;
        }
        for (j = 0; j < VQP_QPN_HIGH_SIZE; ++j) {
            cq->devs[i].qpn_table[j] = vqp_qpn_none;
        }
        cq->devs[i].dev = params->devs[i];
        status          = vqp_dev_cq_create(params->devs[i], params->cqe,
                                            &cq->devs[i].dev_cq, &dv);
        if (status != UCS_OK) {
            goto err;
        }
        cq->num_devs = i + 1;
        status       = vqp_mlx5_cq_init(&cq->devs[i].cq, &dv);
        if (status != UCS_OK) {
            goto err;
        }
        cq->devs[i].credits = (int32_t)(cq->devs[i].cq.mask + 1);
    }

    *cq_p = cq;
    return UCS_OK;

err:
    vqp_cq_destroy(cq);
    return status;
}

ucs_status_t vqp_cq_destroy(vqp_cq_t *cq)
{
    unsigned i, j;

    if (cq->num_vqps != 0) {
        ucs_error("vqp cq %p: %u virtual QPs still use it", cq, cq->num_vqps);
        return UCS_ERR_BUSY;
    }
    vqp_cq_efd_close(cq);
    for (i = 0; i < cq->num_devs; ++i) {
        for (j = 0; j < VQP_QPN_HIGH_SIZE; ++j) {
            if ((cq->devs[i].qpn_table[j] != NULL) &&
                (cq->devs[i].qpn_table[j] != vqp_qpn_none)) {
                ucs_free((void *)cq->devs[i].qpn_table[j]);
            }
        }
        if (cq->devs[i].dev_cq != NULL) {
            vqp_dev_cq_destroy(cq->devs[i].dev_cq);
        }
    }
    ucs_free(cq->wcs);
    ucs_free(cq->dirty);
    ucs_free(cq);
    return UCS_OK;
}

ucs_status_t vqp_cq_dev_reserve(vqp_cq_dev_t *cdev, uint32_t recvs,
                                uint32_t covers, const char *what)
{
    int64_t n    = (int64_t)recvs + covers;
    int64_t left = (int64_t)cdev->cq.mask + 1 - cdev->cqe_reserved -
                   cdev->cover_reserve - n;

    if (n == 0) {
        return UCS_OK; /* a QP beyond max_covers without receives */
    }
    /* Entries are free only where no posted WQE may need them; and one must
     * stay for WQEs, or every QP of the CQ would wait for credits for good
     * once the last reservation took them. */
    if (((int64_t)cdev->credits < n) || (left < 1)) {
        ucs_error("vqp cq: the CQ of %u entries cannot take %s needing %ld"
                  " (%u reserved for receives, %u for QPs, %d free of WQEs"
                  " in flight): make the CQ larger or the receive queues"
                  " smaller",
                  cdev->cq.mask + 1, what, (long)n, cdev->cqe_reserved,
                  cdev->cover_reserve, cdev->credits);
        return UCS_ERR_EXCEEDS_LIMIT;
    }
    cdev->credits -= (int32_t)n;
    cdev->cqe_reserved += recvs;
    cdev->cover_reserve += covers;
    return UCS_OK;
}

void vqp_cq_dev_release(vqp_cq_dev_t *cdev, uint32_t recvs, uint32_t covers)
{
    cdev->credits += (int32_t)(recvs + covers);
    cdev->cqe_reserved -= recvs;
    cdev->cover_reserve -= covers;
}

ucs_status_t vqp_cq_register(vqp_cq_t *cq, vqp_pqp_t *pqp)
{
    vqp_cq_dev_t *cdev       = &cq->devs[pqp->dev];
    vqp_pqp_t *const **chunk = &cdev->qpn_table[pqp->qpn >> VQP_QPN_LOW_BITS];
    vqp_pqp_t **table;
    ucs_status_t status;
    vqp_pqp_t **slot;

    if (*chunk == vqp_qpn_none) {
        table = ucs_calloc(VQP_QPN_LOW_SIZE, sizeof(*table), "vqp_qpn");
        if (table == NULL) {
            ucs_error("vqp cq: out of memory for the QPN table");
            return UCS_ERR_NO_MEMORY;
        }
        *chunk = table;
    }
    /* A chunk other than vqp_qpn_none is one of ours, writable. */
    slot = (vqp_pqp_t **)&(*chunk)[pqp->qpn & (VQP_QPN_LOW_SIZE - 1)];
    if (*slot != NULL) {
        ucs_error("vqp cq: QPN 0x%x on device %u is already registered",
                  pqp->qpn, pqp->dev);
        return UCS_ERR_ALREADY_EXISTS;
    }
    /* Its receives, and the entry of the NOP that may cover it (while
     * fewer than max_covers are kept). */
    status = vqp_cq_dev_reserve(cdev, pqp->cqe_need,
                                cdev->cover_qps < cq->max_covers, "a QP");
    if (status != UCS_OK) {
        return status;
    }
    ++cdev->cover_qps;
    *slot = pqp;
    return UCS_OK;
}

void vqp_cq_retire(vqp_cq_t *cq, vqp_pqp_t *pqp)
{
    vqp_mlx5_cq_t *mcq = &cq->devs[pqp->dev].cq;
    unsigned reclaimed = 0, dropped = 0;
    struct mlx5_cqe64 *cqe;
    uint32_t ci;

    /* Only what the device wrote; the CQEs stay in place and the normal
     * poll consumes them. */
    for (ci = mcq->ci;; ++ci) {
        cqe = vqp_mlx5_cq_get(mcq, ci);
        if (!vqp_mlx5_cqe_is_sw_owned(cqe->op_own, ci, mcq->log_cnt)) {
            break;
        }
        ucs_memory_cpu_load_fence();
        if (vqp_mlx5_cqe_qpn(cqe) != pqp->qpn) {
            continue;
        }
        if (pqp->srq != NULL) {
            reclaimed += vqp_srq_reclaim(pqp->srq, cqe);
        }
        cqe->sop_drop_qpn = 0;
        ++dropped;
    }
    /* They hold their entries until the poll passes them. */
    cq->devs[pqp->dev].credits -= (int32_t)dropped;
    if (dropped != 0) {
        ucs_debug("vqp cq: %u CQEs of destroyed QP 0x%x neutralised (%u SRQ"
                  " buffers posted again)",
                  dropped, pqp->qpn, reclaimed);
    }
}

void vqp_cq_unregister(vqp_cq_t *cq, vqp_pqp_t *pqp)
{
    vqp_cq_dev_t *cdev;
    vqp_pqp_t *const *chunk =
        cq->devs[pqp->dev].qpn_table[pqp->qpn >> VQP_QPN_LOW_BITS];

    /* Found there, the chunk is not vqp_qpn_none: writable. */
    if (chunk[pqp->qpn & (VQP_QPN_LOW_SIZE - 1)] == pqp) {
        ((vqp_pqp_t **)chunk)[pqp->qpn & (VQP_QPN_LOW_SIZE - 1)] = NULL;
        cdev = &cq->devs[pqp->dev];
        --cdev->cover_qps;
        vqp_cq_dev_release(cdev, pqp->cqe_need,
                           cdev->cover_qps < cq->max_covers);
    }
}

/* Grow (or shrink the reservation of) the completion ring; slow path, called
 * when a virtual QP is created or destroyed. */
ucs_status_t vqp_cq_reserve_wcs(vqp_cq_t *cq, int delta)
{
    unsigned need = cq->wc_reserved + delta;
    uint32_t size, i, count;
    vqp_wc_t *wcs;

    /* Completions of destroyed QPs still in the ring take room too. */
    if ((delta <= 0) ||
        ((cq->wcs != NULL) && (need + cq->wc_stale <= cq->wc_mask + 1))) {
        cq->wc_reserved = need;
        return UCS_OK;
    }

    size = ucs_roundup_pow2(need + cq->wc_stale);
    wcs  = ucs_malloc(size * sizeof(*wcs), "vqp_wcs");
    if (wcs == NULL) {
        ucs_error("vqp cq: out of memory for %u completions", size);
        return UCS_ERR_NO_MEMORY;
    }
    count = VQP_RING_COUNT(cq->wc_head, cq->wc_tail);
    for (i = 0; i < count; ++i) {
        wcs[i] = cq->wcs[(cq->wc_head + i) & cq->wc_mask];
    }
    ucs_free(cq->wcs);
    cq->wcs         = wcs;
    cq->wc_mask     = size - 1;
    cq->wc_head     = 0;
    cq->wc_tail     = count;
    cq->wc_reserved = need;
    return UCS_OK;
}

uint32_t vqp_cq_room(const vqp_cq_t *cq)
{
    int32_t room = INT32_MAX;
    unsigned i;

    for (i = 0; i < cq->num_devs; ++i) {
        room = ucs_min(room, cq->devs[i].credits);
    }
    return (room > 0) ? (uint32_t)room : 0;
}

unsigned vqp_cq_progress(vqp_cq_t *cq)
{
    unsigned i, count = 0;

    for (i = 0; i < cq->num_devs; ++i) {
        vqp_dev_progress(cq->devs[i].dev);
        /* Idle (no CQE, nothing to advance, no waiter): no call into the
         * poll, whose frame costs an idle progress call more than the
         * look. */
        if (vqp_mlx5_cq_ready(&cq->devs[i].cq) || (cq->num_dirty != 0) ||
            !ucs_list_is_empty(&cq->credit_waiters)) {
            count += vqp_cq_poll_dev(cq, &cq->devs[i]);
        }
    }
    return count;
}

unsigned vqp_cq_poll(vqp_cq_t *cq, vqp_wc_t *wcs, unsigned max)
{
    unsigned count = 0;
    vqp_wc_t *wc;

    /* Completions queued earlier go first, then new ones straight into
     * @a wcs while it has room (vqp_wc_slot). */
    while ((count < max) && (cq->wc_head != cq->wc_tail)) {
        wc = &cq->wcs[cq->wc_head++ & cq->wc_mask];
        if (wc->vqp == NULL) {
            /* Its QP was destroyed: the completion is still the user's. */
            --cq->wc_stale;
        } else if ((wc->opcode == VQP_OP_RECV) ||
                   (wc->opcode == VQP_OP_RECV_NOTIFY)) {
            --wc->vqp->wc_pending_recvs;
        } else {
            --wc->vqp->wc_pending_ops;
        }
        wcs[count++] = *wc;
    }
    cq->out      = wcs + count;
    cq->out_left = (cq->wc_head == cq->wc_tail) ? max - count : 0;
    vqp_cq_progress(cq);
    count        = (unsigned)(cq->out - wcs);
    cq->out      = NULL;
    cq->out_left = 0;
    return count;
}

ucs_status_t vqp_cq_arm(vqp_cq_t *cq)
{
    vqp_cq_dev_t *cdev;
    ucs_status_t status;
    unsigned i;

    if (cq->wc_head != cq->wc_tail) {
        return UCS_ERR_BUSY;
    }
    for (i = 0; i < cq->num_devs; ++i) {
        cdev   = &cq->devs[i];
        status = vqp_dev_cq_arm(cdev->dev_cq, cdev->cq.ci, 0);
        if (status != UCS_OK) {
            return status;
        }
        if (vqp_mlx5_cq_ready_at_arm(&cdev->cq)) {
            return UCS_ERR_BUSY;
        }
    }
    return UCS_OK;
}

ucs_status_t vqp_cq_event_fd(vqp_cq_t *cq, int *fd_p)
{
    struct epoll_event ev = {.events = EPOLLIN};
    ucs_status_t status   = UCS_OK;
    void *grown;
    int i, efd = -1, dfd;
    unsigned d;

    pthread_mutex_lock(&vqp_cq_efd_lock);
    i = vqp_cq_efd_find(cq);
    if (i >= 0) {
        *fd_p = vqp_cq_efds[i].fd;
        goto out;
    }
    efd = epoll_create1(EPOLL_CLOEXEC);
    if (efd < 0) {
        ucs_error("vqp cq %p: epoll_create1 failed: %m", cq);
        status = UCS_ERR_IO_ERROR;
        goto out;
    }
    for (d = 0; d < cq->num_devs; ++d) {
        status = vqp_dev_event_fd(cq->devs[d].dev, &dfd);
        if (status != UCS_OK) {
            goto err;
        }
        ev.data.u32 = d;
        if (epoll_ctl(efd, EPOLL_CTL_ADD, dfd, &ev) != 0) {
            ucs_error("vqp cq %p: cannot watch device %u's event fd %d: %m", cq,
                      d, dfd);
            status = UCS_ERR_IO_ERROR;
            goto err;
        }
    }
    grown = realloc(vqp_cq_efds, (vqp_cq_num_efds + 1) * sizeof(*vqp_cq_efds));
    if (grown == NULL) {
        ucs_error("vqp cq %p: out of memory for its event fd", cq);
        status = UCS_ERR_NO_MEMORY;
        goto err;
    }
    vqp_cq_efds                     = grown;
    vqp_cq_efds[vqp_cq_num_efds].cq = cq;
    vqp_cq_efds[vqp_cq_num_efds].fd = efd;
    ++vqp_cq_num_efds;
    *fd_p = efd;
    goto out;

err:
    close(efd);
out:
    pthread_mutex_unlock(&vqp_cq_efd_lock);
    return status;
}
