/*
 * Software mlx5 device: completion events. The engine runs inside the
 * owner's vqp_sw_progress() (and the idle executor's, which an armed owner
 * never needs: arming fails while its own WQEs wait), so work that a peer
 * deposits (an inbound record, a responder error) must wake a sleeping
 * owner that armed. Wakeups travel as empty datagrams to a UNIX socket in
 * the abstract namespace named like the device's segment: no fd passing, no
 * file left behind, and a socket that vanishes with its process.
 *
 * Protocol (a Dekker pair, both sides with full fences):
 *   owner: armed = 1; fence; look for pending work -> BUSY (armed = 0) or sleep
 *   peer:  deposit work; fence; if armed and exchange(armed, 0): send
 * Either the owner sees the work or the peer sees the flag.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>
#include <ucs/sys/math.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Abstract address of device (pid, instance): the segment's name without
 * the leading '/', after a NUL byte. Returns the address length. */
static socklen_t vqp_sw_event_addr(struct sockaddr_un *sun, uint32_t pid,
                                   uint32_t instance)
{
    char name[VQP_SW_NAME_MAX];
    size_t len;

    vqp_sw_shm_name(name, sizeof(name), (uint32_t)getuid(), pid, instance);
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    len             = ucs_min(strlen(name + 1), sizeof(sun->sun_path) - 1);
    memcpy(sun->sun_path + 1, name + 1, len);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

static int vqp_sw_event_socket(void)
{
    return socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

static ucs_status_t vqp_sw_dev_event_fd_locked(vqp_sw_dev_t *dev, int *fd_p)
{
    struct sockaddr_un sun;
    socklen_t len;
    int fd;

    if ((dev == NULL) || (fd_p == NULL)) {
        ucs_error("vqp_sw: dev_event_fd(%p, %p): NULL argument", dev, fd_p);
        return UCS_ERR_INVALID_PARAM;
    }
    if (dev->event_fd < 0) {
        fd = vqp_sw_event_socket();
        if (fd < 0) {
            ucs_error("vqp_sw %s: cannot create the event socket: %m",
                      dev->name);
            return UCS_ERR_IO_ERROR;
        }
        len = vqp_sw_event_addr(&sun, dev->pid, dev->instance);
        if (bind(fd, (struct sockaddr *)&sun, len) != 0) {
            ucs_error("vqp_sw %s: cannot bind the event socket @%s: %m",
                      dev->name, sun.sun_path + 1);
            close(fd);
            return UCS_ERR_IO_ERROR;
        }
        dev->event_fd = fd;
    }
    *fd_p = dev->event_fd;
    return UCS_OK;
}

ucs_status_t vqp_sw_dev_event_fd(vqp_sw_dev_t *dev, int *fd_p)
{
    return VQP_SW_LOCKED(vqp_sw_dev_event_fd_locked(dev, fd_p));
}

/* Work the owner's engine or its user still has to do: a sleep now could
 * miss it. Returns what it found, for the log, or NULL. */
static const char *vqp_sw_dev_pending(vqp_sw_dev_t *dev, ucs_status_t *err)
{
    vqp_sw_shm_t *shm = dev->shm;
    enum ibv_qp_state state;
    uint32_t pi, ci, db, val, rec;
    vqp_sw_qp_t *qp;
    vqp_sw_cq_t *cq;
    unsigned i;

    *err = UCS_OK;
    if (__atomic_load_n(&shm->in_head, __ATOMIC_ACQUIRE) != shm->in_tail) {
        return "inbound records";
    }
    for (i = 0; i < dev->n_qps; ++i) {
        qp = dev->qp_list[i];
        if (__atomic_load_n(&qp->shm->remote_err, __ATOMIC_ACQUIRE) != 0) {
            return "a responder error";
        }
        if ((uint16_t)be32toh(__atomic_load_n(&qp->dbrec[MLX5_SND_DBR],
                                              __ATOMIC_ACQUIRE)) != qp->sq_ci) {
            return "posted or stalled WQEs";
        }
        state = vqp_sw_qp_state(qp);
        if ((state == IBV_QPS_ERR) && (qp->srq == NULL) &&
            (qp->shm->rq_wqe_cnt > 0) &&
            ((uint16_t)be32toh(
                 __atomic_load_n(&qp->dbrec[MLX5_RCV_DBR], __ATOMIC_ACQUIRE)) !=
             qp->rq_flush_ci)) {
            return "receives to flush";
        }
    }
    for (i = 0; i < VQP_SW_MAX_CQ; ++i) {
        cq = dev->cqs[i];
        if (cq == NULL) {
            continue;
        }
        if (cq->n_held > 0) {
            return "held CQEs";
        }
        pi = cq->pi & 0xffffff;
        ci = be32toh(__atomic_load_n(&cq->dbrec[0], __ATOMIC_ACQUIRE)) &
             0xffffff;
        if (pi != ci) {
            return "unpolled CQEs";
        }
        /* An arm doorbell (8 bytes at cq_uar + MLX5_CQ_DOORBELL) must match
         * its record and name this CQ, as a ConnectX requires; its consumer
         * index lags the producer when a CQE would fire the event now. */
        memcpy(&val, (uint8_t *)cq->uar + MLX5_CQ_DOORBELL, sizeof(val));
        memcpy(&db, (uint8_t *)cq->uar + MLX5_CQ_DOORBELL + 4, sizeof(db));
        if ((val == UINT32_MAX) && (db == UINT32_MAX)) {
            continue; /* never armed (the page's initial pattern) */
        }
        val = be32toh(val);
        db  = be32toh(db);
        rec = be32toh(__atomic_load_n(&cq->dbrec[1], __ATOMIC_ACQUIRE));
        if ((db != cq->index) ||
            ((val & ~(0x3u << 28 | MLX5_CQ_DB_REQ_NOT_SOL | 0xffffffu)) != 0) ||
            (rec != val)) {
            ucs_error("vqp_sw %s: CQ %u: invalid arm doorbell 0x%08x%08x "
                      "(CQN %u, command 0x%x, record 0x%x): it must name "
                      "this CQ, command REQ_NOT or REQ_NOT_SOL, and equal "
                      "its doorbell record",
                      dev->name, cq->index, val, db, db, val & 0x0f000000, rec);
            *err = UCS_ERR_INVALID_PARAM;
            return "an invalid arm doorbell";
        }
        /* An arm names the consumer index it was made at, never beyond
         * the producer: one ahead of it by up to a ring is invalid. Any
         * other distance is an arm that CQEs passed, however many (the
         * consumer may have polled more than a ring since). */
        if ((((val - pi) & 0xffffff) != 0) &&
            (((val - pi) & 0xffffff) <= cq->cqe_cnt)) {
            ucs_error("vqp_sw %s: CQ %u: arm doorbell consumer index %u is "
                      "ahead of the producer index %u",
                      dev->name, cq->index, val & 0xffffff, pi);
            *err = UCS_ERR_INVALID_PARAM;
            return "an invalid arm doorbell";
        }
        if (((pi - val) & 0xffffff) != 0) {
            /* The arm fires, once: like a ConnectX's, it is used up and
             * the CQ must be armed again for the next event. */
            memset(cq->uar, 0xff, sizeof(cq->uar));
            return "CQEs past the armed consumer index";
        }
    }
    return NULL;
}

static ucs_status_t vqp_sw_dev_arm_locked(vqp_sw_dev_t *dev)
{
    unsigned drained = 0;
    const char *why;
    ucs_status_t status;
    char buf[8];
    ssize_t ret;
    int fd;

    if (dev == NULL) {
        ucs_error("vqp_sw: dev_arm(NULL)");
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_sw_dev_event_fd(dev, &fd);
    if (status != UCS_OK) {
        return status;
    }
    /* Wakeups that arrived since the last arm: their work may be undone. */
    for (;;) {
        ret = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (ret >= 0) {
            ++drained;
            continue;
        }
        if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
            break;
        }
        if (errno == EINTR) {
            continue;
        }
        ucs_error("vqp_sw %s: draining the event socket (fd %d) failed: %m",
                  dev->name, fd);
        return UCS_ERR_IO_ERROR;
    }
    if (drained > 0) {
        ucs_trace("vqp_sw %s: %u wakeups drained: busy", dev->name, drained);
        return UCS_ERR_BUSY;
    }
    __atomic_store_n(&dev->shm->armed, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    why = vqp_sw_dev_pending(dev, &status);
    if (why != NULL) {
        __atomic_store_n(&dev->shm->armed, 0, __ATOMIC_RELAXED);
        ucs_trace("vqp_sw %s: not armed: %s", dev->name, why);
        return (status != UCS_OK) ? status : UCS_ERR_BUSY;
    }
    return UCS_OK;
}

ucs_status_t vqp_sw_dev_arm(vqp_sw_dev_t *dev)
{
    return VQP_SW_LOCKED(vqp_sw_dev_arm_locked(dev));
}

void vqp_sw_peer_wake(vqp_sw_dev_t *dev, vqp_sw_peer_t *peer)
{
    struct sockaddr_un sun;
    socklen_t len;

    /* Our deposit before the flag's load (pairs with the owner's fence). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if ((__atomic_load_n(&peer->shm->armed, __ATOMIC_RELAXED) == 0) ||
        (__atomic_exchange_n(&peer->shm->armed, 0, __ATOMIC_ACQ_REL) == 0)) {
        return;
    }
    if (dev->wake_fd < 0) {
        dev->wake_fd = vqp_sw_event_socket();
        if (dev->wake_fd < 0) {
            ucs_error("vqp_sw %s: cannot create a socket to wake pid %u: %m",
                      dev->name, peer->pid);
            return;
        }
    }
    len = vqp_sw_event_addr(&sun, peer->pid, peer->instance);
    if (sendto(dev->wake_fd, "", 0, MSG_DONTWAIT | MSG_NOSIGNAL,
               (struct sockaddr *)&sun, len) < 0) {
        /* EAGAIN: a wakeup is queued already, which is enough. Refused or
         * missing: the peer is gone or never made its socket. */
        ucs_debug("vqp_sw %s: wakeup of pid %u instance %u not sent: %m",
                  dev->name, peer->pid, peer->instance);
    }
}

void vqp_sw_event_close(vqp_sw_dev_t *dev)
{
    if (dev->event_fd >= 0) {
        close(dev->event_fd);
        dev->event_fd = -1;
    }
    if (dev->wake_fd >= 0) {
        close(dev->wake_fd);
        dev->wake_fd = -1;
    }
}
