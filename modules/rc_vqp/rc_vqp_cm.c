/*
 * rc_vqp connection manager (see rc_vqp_cm.h): one UD QP per interface, a
 * REQ / REP / REJ / DISC exchange of small datagrams, retries and
 * de-duplication, passive endpoints for the peers' connections.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <config.h>

#include "rc_vqp.h"
#include "rc_vqp_memcheck.h"

#include <ucs/async/async.h>
#include <ucs/datastruct/queue.h>
#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/math.h>
#include <ucs/sys/sys.h>
#include <endian.h>
#include <string.h>
#include <time.h>

#define UCT_RC_VQP_CM_MAGIC    0x76 /* 'v' */
#define UCT_RC_VQP_CM_VERSION  1
#define UCT_RC_VQP_CM_QKEY     0x1ee7c0de
#define UCT_RC_VQP_CM_RX_SLOTS 128
/* Datagrams in flight: endpoints destroyed together (UCP closing a worker)
 * send their DISCs with no progress in between. */
#define UCT_RC_VQP_CM_TX_SLOTS 256
#define UCT_RC_VQP_CM_MSG_MAX  4096ul /* payload bytes, at most */
#define UCT_RC_VQP_CM_POLL     16     /* CQEs per progress call */
#define UCT_RC_VQP_CM_MAX_QPS  4096   /* data QPs a request may ask for */
#define UCT_RC_VQP_CM_BACKOFF  1.0    /* longest interval between REQs, s */
#define UCT_RC_VQP_CM_KA_SKIP  1024   /* progress calls per clock read */
/* The async responder's period, s, at most: a REQ waits that long for its
 * MRA, far below any sensible connect timeout. */
#define UCT_RC_VQP_CM_ASYNC_TICK 0.1
/* Datagrams the responder keeps for the interface, at most: a REQ past it
 * is dropped unanswered (it is resent), so a process that never progresses
 * cannot make the queue grow without bound. */
#define UCT_RC_VQP_CM_MAX_DEFERRED 4096

enum {
    UCT_RC_VQP_CM_REQ  = 1, /* active -> passive: connect to my QPs */
    UCT_RC_VQP_CM_REP  = 2, /* passive -> active: connected, here are mine */
    UCT_RC_VQP_CM_REJ  = 3, /* passive -> active: cannot, status says why */
    UCT_RC_VQP_CM_DISC = 4, /* active -> passive: endpoint destroyed */
    /* active -> passive: the REP arrived, my QPs are connected to yours.
     * Until it (or a message) comes, the passive endpoint is unconfirmed:
     * its probes would fail whenever the active side simply has not read
     * the REP yet (a process busy elsewhere), so keepalive leaves it be. */
    UCT_RC_VQP_CM_RTU = 5,
    /* passive -> active: your REQ arrived while this process was not
     * progressing the interface; the REP follows once it does (IB CM's
     * message receipt acknowledgement). The requester's deadline moves. */
    UCT_RC_VQP_CM_MRA = 6,
    /* passive -> active: the passive endpoint failed and was released. The
     * active one fails too: it may be idle, or waiting for AM credits, and
     * send nothing that would tell it. */
    UCT_RC_VQP_CM_DROP = 7
};

/* Every datagram starts with this header (little endian), then the
 * sender's packed device address, then (REQ, REP) its virtual QP address. */
typedef struct uct_rc_vqp_cm_hdr {
    uint8_t magic;
    uint8_t version;
    uint8_t type;
    uint8_t lb;       /* REQ: vqp_lb_t of the active side */
    uint32_t src_qpn; /* the sender's CM QPN: where answers go */
    uint64_t id;      /* connection id, chosen by the active side */
    uint32_t num_qps; /* REQ: data QPs of the active side */
    int16_t status;   /* REJ: why */
    uint8_t dev_addr_len;
    uint8_t reserved;
    uint16_t vqp_addr_len;
    uint16_t reserved2;
} UCS_S_PACKED uct_rc_vqp_cm_hdr_t;

static const char *uct_rc_vqp_cm_type_str(unsigned type)
{
    switch (type) {
    case UCT_RC_VQP_CM_REQ:
        return "REQ";
    case UCT_RC_VQP_CM_REP:
        return "REP";
    case UCT_RC_VQP_CM_REJ:
        return "REJ";
    case UCT_RC_VQP_CM_DISC:
        return "DISC";
    case UCT_RC_VQP_CM_RTU:
        return "RTU";
    case UCT_RC_VQP_CM_MRA:
        return "MRA";
    case UCT_RC_VQP_CM_DROP:
        return "DROP";
    default:
        return "?";
    }
}

/* The manager's clock, in ns. Not ucs_get_time(): UCS converts TSC ticks
 * with a frequency it may have measured over 1 ms at start-up (when the CPU
 * model name carries none, as on many VMs), and a process preempted then
 * keeps a clock that is off by tens of percent: timeouts the user set would
 * expire that much early or late. The manager reads the time rarely. */
static uint64_t uct_rc_vqp_cm_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t uct_rc_vqp_cm_ns(double sec)
{
    return (uint64_t)(sec * 1e9);
}

static char *uct_rc_vqp_cm_rx_slot(uct_rc_vqp_cm_t *cm, unsigned index)
{
    return cm->buf + (size_t)(index & (cm->rx_slots - 1)) * cm->slot_size;
}

static char *uct_rc_vqp_cm_tx_slot(uct_rc_vqp_cm_t *cm, uint64_t count)
{
    return cm->buf + (size_t)cm->rx_slots * cm->slot_size +
           (size_t)(count % cm->tx_slots) * cm->msg_max;
}

/* The interface's thread takes the manager's lock through these: nested
 * calls (a handler destroying an endpoint, which says DISC) only count. The
 * async responder only tries the lock itself, never waits for it. Without a
 * responder (poll-mode async context, an HCA) there is nobody to exclude:
 * no lock at all, nothing added to progress. */
static void uct_rc_vqp_cm_lock(uct_rc_vqp_cm_t *cm)
{
    if ((cm->async_timer >= 0) && (cm->lock_depth++ == 0)) {
        ucs_spin_lock(&cm->lock);
    }
}

static int uct_rc_vqp_cm_trylock(uct_rc_vqp_cm_t *cm)
{
    if (cm->async_timer < 0) {
        return 1;
    }
    if ((cm->lock_depth == 0) && !ucs_spin_try_lock(&cm->lock)) {
        return 0;
    }
    ++cm->lock_depth;
    return 1;
}

static void uct_rc_vqp_cm_unlock(uct_rc_vqp_cm_t *cm)
{
    if ((cm->async_timer >= 0) && (--cm->lock_depth == 0)) {
        ucs_spin_unlock(&cm->lock);
    }
}

static ucs_status_t uct_rc_vqp_cm_post_recv(uct_rc_vqp_cm_t *cm)
{
    vqp_mlx5_sge_t sge;
    int ret;

    sge.addr   = (uintptr_t)uct_rc_vqp_cm_rx_slot(cm, cm->rx.head);
    sge.length = (uint32_t)cm->slot_size;
    sge.lkey   = cm->lkey;
    ret        = vqp_mlx5_rxwq_post(&cm->rx, &sge, 1);
    return (ret < 0) ? (ucs_status_t)ret : UCS_OK;
}

/* ------------------------------------------------------ address handles */

static int uct_rc_vqp_cm_addr_equal(const vqp_dev_addr_t *a,
                                    const vqp_dev_addr_t *b)
{
    uint8_t pa[VQP_DEV_ADDR_PACKED_MAX], pb[VQP_DEV_ADDR_PACKED_MAX];
    size_t la, lb;

    return (vqp_dev_addr_pack(a, pa, sizeof(pa), &la) == UCS_OK) &&
           (vqp_dev_addr_pack(b, pb, sizeof(pb), &lb) == UCS_OK) &&
           (la == lb) && !memcmp(pa, pb, la);
}

/* The address handle towards @a addr, created on first use and kept until
 * the interface closes (peers are few; connections to them are many). */
static ucs_status_t uct_rc_vqp_cm_get_peer(uct_rc_vqp_iface_t *iface,
                                           const vqp_dev_addr_t *addr,
                                           uct_rc_vqp_cm_peer_t **peer_p)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uct_rc_vqp_cm_peer_t *peer, **peers;
    ucs_status_t status;
    unsigned i;

    for (i = 0; i < cm->num_peers; ++i) {
        if (uct_rc_vqp_cm_addr_equal(&cm->peers[i]->addr, addr)) {
            *peer_p = cm->peers[i];
            return UCS_OK;
        }
    }
    peers = ucs_realloc(cm->peers, sizeof(*peers) * (cm->num_peers + 1),
                        "rc_vqp_cm_peers");
    if (peers == NULL) {
        ucs_error("rc_vqp cm: out of memory for a peer table entry");
        return UCS_ERR_NO_MEMORY;
    }
    cm->peers = peers;
    peer      = ucs_calloc(1, sizeof(*peer), "rc_vqp_cm_peer");
    if (peer == NULL) {
        ucs_error("rc_vqp cm: out of memory for a peer");
        return UCS_ERR_NO_MEMORY;
    }
    peer->addr = *addr;
    status     = vqp_dev_ah_create(iface->dev, addr, &peer->ah, &peer->av);
    if (status != UCS_OK) {
        ucs_free(peer);
        return status;
    }
    cm->peers[cm->num_peers++] = peer;
    *peer_p                    = peer;
    return UCS_OK;
}

/* ------------------------------------------------------------- sending */

/* One datagram to @a peer / @a qpn. No room (all send buffers in flight) or
 * a datagram too large fails; the REQ's retries cover the first case. */
static ucs_status_t uct_rc_vqp_cm_send(uct_rc_vqp_iface_t *iface,
                                       uct_rc_vqp_cm_peer_t *peer, uint32_t qpn,
                                       unsigned type, uint64_t id,
                                       const vqp_t *vqp, ucs_status_t reject)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    char *msg           = uct_rc_vqp_cm_tx_slot(cm, cm->tx_posted);
    uct_rc_vqp_cm_hdr_t hdr;
    vqp_dev_addr_t dev_addr;
    size_t dev_len, vqp_len = 0;
    vqp_mlx5_sge_t sge;
    ucs_status_t status;
    int ret;

    if (cm->tx_posted - cm->tx_done >= cm->tx_slots) {
        ucs_debug("rc_vqp cm: no send buffer for a %s to qpn 0x%x",
                  uct_rc_vqp_cm_type_str(type), qpn);
        return UCS_ERR_NO_RESOURCE;
    }
    vqp_dev_address(iface->dev, &dev_addr);
    status = vqp_dev_addr_pack(&dev_addr, msg + sizeof(hdr),
                               cm->msg_max - sizeof(hdr), &dev_len);
    if (status != UCS_OK) {
        return status;
    }
    if (vqp != NULL) {
        status =
            vqp_address_pack(vqp, msg + sizeof(hdr) + dev_len,
                             cm->msg_max - sizeof(hdr) - dev_len, &vqp_len);
        if (status != UCS_OK) {
            ucs_error("rc_vqp cm: the address of %u QPs does not fit a"
                      " %zu-byte datagram: use fewer QPs (UCX_RC_VQP_NUM_QPS)",
                      iface->vqp_params.num_qps, cm->msg_max);
            return UCS_ERR_EXCEEDS_LIMIT;
        }
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic        = UCT_RC_VQP_CM_MAGIC;
    hdr.version      = UCT_RC_VQP_CM_VERSION;
    hdr.type         = type;
    hdr.src_qpn      = htole32(cm->qpn);
    hdr.id           = htole64(id);
    hdr.status       = (int16_t)htole16((uint16_t)reject);
    hdr.dev_addr_len = (uint8_t)dev_len;
    hdr.vqp_addr_len = htole16((uint16_t)vqp_len);
    if (type == UCT_RC_VQP_CM_REQ) {
        hdr.lb      = (uint8_t)iface->vqp_params.lb;
        hdr.num_qps = htole32(iface->vqp_params.num_qps);
    }
    memcpy(msg, &hdr, sizeof(hdr));

    sge.addr   = (uintptr_t)msg;
    sge.length = (uint32_t)(sizeof(hdr) + dev_len + vqp_len);
    sge.lkey   = cm->lkey;
    ret = vqp_mlx5_post_ud_send(&cm->tx, &peer->av, qpn, cm->qkey, &sge, 1,
                                VQP_MLX5_SIGNALED);
    if (ret < 0) {
        ucs_debug("rc_vqp cm: %s to qpn 0x%x not posted: %s",
                  uct_rc_vqp_cm_type_str(type), qpn,
                  ucs_status_string((ucs_status_t)ret));
        return (ucs_status_t)ret;
    }
    ++cm->tx_posted;
    ucs_trace("rc_vqp cm: %s id 0x%lx to qpn 0x%x (%u bytes)",
              uct_rc_vqp_cm_type_str(type), id, qpn, sge.length);
    return UCS_OK;
}

static void uct_rc_vqp_cm_conn_unlist(uct_rc_vqp_cm_conn_t *conn)
{
    if (conn->listed) {
        ucs_list_del(&conn->list);
        conn->listed = 0;
    }
}

static ucs_status_t uct_rc_vqp_cm_send_req(uct_rc_vqp_iface_t *iface,
                                           uct_rc_vqp_cm_conn_t *conn)
{
    ++conn->attempts;
    ++iface->cm.stats.reqs_sent;
    return uct_rc_vqp_cm_send(iface, conn->peer, conn->peer_qpn,
                              UCT_RC_VQP_CM_REQ, conn->id, conn->ep->vqp,
                              UCS_OK);
}

/* ------------------------------------------------------ receiving */

static uct_rc_vqp_cm_conn_t *
uct_rc_vqp_cm_find(khash_t(uct_rc_vqp_cm_conns) * map, uint64_t id)
{
    khiter_t it = kh_get(uct_rc_vqp_cm_conns, map, id);

    return (it == kh_end(map)) ? NULL : kh_val(map, it);
}

static ucs_status_t uct_rc_vqp_cm_insert(khash_t(uct_rc_vqp_cm_conns) * map,
                                         uct_rc_vqp_cm_conn_t *conn)
{
    int ret;
    khiter_t it = kh_put(uct_rc_vqp_cm_conns, map, conn->id, &ret);

    if (ret == -1) {
        ucs_error("rc_vqp cm: out of memory for a connection table entry");
        return UCS_ERR_NO_MEMORY;
    }
    if (ret == 0) {
        ucs_error("rc_vqp cm: connection id 0x%lx is in use", conn->id);
        return UCS_ERR_ALREADY_EXISTS;
    }
    kh_val(map, it) = conn;
    return UCS_OK;
}

static void uct_rc_vqp_cm_remove(khash_t(uct_rc_vqp_cm_conns) * map,
                                 uint64_t id)
{
    khiter_t it = kh_get(uct_rc_vqp_cm_conns, map, id);

    if (it != kh_end(map)) {
        kh_del(uct_rc_vqp_cm_conns, map, it);
    }
}

/* A request from a peer: a new passive endpoint, or the answer again. */
static void uct_rc_vqp_cm_handle_req(uct_rc_vqp_iface_t *iface,
                                     const uct_rc_vqp_cm_hdr_t *hdr,
                                     uct_rc_vqp_cm_peer_t *peer,
                                     const void *vqp_addr)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uint64_t id         = le64toh(hdr->id);
    uint32_t src_qpn    = le32toh(hdr->src_qpn);
    uint32_t num_qps    = le32toh(hdr->num_qps);
    uct_ep_params_t ep_params;
    uct_rc_vqp_cm_conn_t *conn;
    vqp_params_t params;
    uct_ep_h tl_ep;
    uct_rc_vqp_ep_t *ep;
    ucs_status_t status;

    ++cm->stats.reqs_received;
    conn = uct_rc_vqp_cm_find(&cm->passive, id);
    if (conn != NULL) {
        /* Our REP was lost or is late: say it again. */
        ++cm->stats.dup_reqs;
        uct_rc_vqp_cm_send(iface, conn->peer, conn->peer_qpn, UCT_RC_VQP_CM_REP,
                           id, conn->ep->vqp, UCS_OK);
        return;
    }
    if ((num_qps == 0) || (num_qps > UCT_RC_VQP_CM_MAX_QPS) ||
        ((hdr->lb != VQP_LB_DQPLB) && (hdr->lb != VQP_LB_SPRAY))) {
        ucs_error("rc_vqp cm: request 0x%lx for %u QPs with scheme %u:"
                  " need 1..%d QPs and dqplb or spray",
                  id, num_qps, hdr->lb, UCT_RC_VQP_CM_MAX_QPS);
        status = UCS_ERR_INVALID_PARAM;
        goto reject;
    }

    /* The passive side follows the requester's QP count and scheme, so
     * interfaces configured differently still connect. */
    params               = iface->vqp_params;
    params.num_qps       = num_qps;
    params.lb            = (vqp_lb_t)hdr->lb;
    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE;
    ep_params.iface      = &iface->super.super;
    cm->passive_params   = &params;
    status               = uct_ep_create(&ep_params, &tl_ep);
    cm->passive_params   = NULL;
    if (status != UCS_OK) {
        goto reject;
    }
    ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    ep->flags |= UCT_RC_VQP_EP_PASSIVE | UCT_RC_VQP_EP_UNCONFIRMED;

    conn = ucs_calloc(1, sizeof(*conn), "rc_vqp_cm_conn");
    if (conn == NULL) {
        ucs_error("rc_vqp cm: out of memory for a connection");
        status = UCS_ERR_NO_MEMORY;
        goto err_ep;
    }
    conn->ep       = ep;
    conn->peer     = peer;
    conn->peer_qpn = src_qpn;
    conn->id       = id;
    conn->passive  = 1;
    ep->conn       = conn;
    status         = uct_rc_vqp_cm_insert(&cm->passive, conn);
    if (status != UCS_OK) {
        ep->conn = NULL;
        ucs_free(conn);
        goto err_ep;
    }
    status =
        uct_rc_vqp_ep_connect_vqp(ep, vqp_addr, le16toh(hdr->vqp_addr_len));
    if (status != UCS_OK) {
        goto err_ep;
    }
    ucs_debug("rc_vqp cm: passive ep %p for request 0x%lx (%u QPs, %s)", ep, id,
              num_qps, (hdr->lb == VQP_LB_SPRAY) ? "spray" : "dqplb");
    uct_rc_vqp_cm_send(iface, peer, src_qpn, UCT_RC_VQP_CM_REP, id, ep->vqp,
                       UCS_OK);
    return;

err_ep:
    uct_ep_destroy(tl_ep);
reject:
    uct_rc_vqp_cm_send(iface, peer, src_qpn, UCT_RC_VQP_CM_REJ, id, NULL,
                       status);
}

static void uct_rc_vqp_cm_handle_rep(uct_rc_vqp_iface_t *iface,
                                     const uct_rc_vqp_cm_hdr_t *hdr,
                                     const void *vqp_addr)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uint64_t id         = le64toh(hdr->id);
    uct_rc_vqp_cm_conn_t *conn;
    ucs_status_t status;

    ++cm->stats.reps_received;
    conn = uct_rc_vqp_cm_find(&cm->active, id);
    if ((conn == NULL) || !conn->listed) {
        ++cm->stats.dup_reps; /* connected already, or gone */
        return;
    }
    uct_rc_vqp_cm_conn_unlist(conn);
    if (conn->ep->flags & UCT_RC_VQP_EP_FAILED) {
        /* flush(CANCEL) while connecting: its QPs are in ERROR, and the
         * user destroys the endpoint next (its DISC releases the peer's). */
        ucs_debug("rc_vqp cm: ep %p canceled before request 0x%lx was"
                  " answered: not connected",
                  conn->ep, id);
        return;
    }
    status = uct_rc_vqp_ep_connect_vqp(conn->ep, vqp_addr,
                                       le16toh(hdr->vqp_addr_len));
    if (status != UCS_OK) {
        uct_rc_vqp_ep_set_failed(conn->ep, status);
        return;
    }
    ucs_debug("rc_vqp cm: ep %p connected (request 0x%lx, %u attempts)",
              conn->ep, id, conn->attempts);
    /* Best effort: a lost RTU only leaves the passive endpoint unprobed
     * until a message confirms it (uct_rc_vqp_ep_recv). */
    uct_rc_vqp_cm_send(iface, conn->peer, conn->peer_qpn, UCT_RC_VQP_CM_RTU, id,
                       NULL, UCS_OK);
}

/* The active side connected to this passive endpoint (its RTU arrived). */
static void uct_rc_vqp_cm_handle_rtu(uct_rc_vqp_iface_t *iface,
                                     const uct_rc_vqp_cm_hdr_t *hdr)
{
    uct_rc_vqp_cm_conn_t *conn;

    ++iface->cm.stats.rtus_received;
    conn = uct_rc_vqp_cm_find(&iface->cm.passive, le64toh(hdr->id));
    if (conn == NULL) {
        ucs_debug("rc_vqp cm: RTU for unknown request 0x%lx", le64toh(hdr->id));
        return;
    }
    conn->ep->flags &= ~UCT_RC_VQP_EP_UNCONFIRMED;
}

/* A busy peer has our REQ: its interface is not progressed now, the REP
 * comes when it is. The peer is there, so the deadline moves. */
static void uct_rc_vqp_cm_handle_mra(uct_rc_vqp_iface_t *iface,
                                     const uct_rc_vqp_cm_hdr_t *hdr)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uct_rc_vqp_cm_conn_t *conn;
    uint64_t now, deadline, next;

    ++cm->stats.mras_received;
    conn = uct_rc_vqp_cm_find(&cm->active, le64toh(hdr->id));
    if ((conn == NULL) || !conn->listed) {
        return; /* connected already, or gone */
    }
    now      = uct_rc_vqp_cm_now();
    deadline = now + uct_rc_vqp_cm_ns(cm->timeout);
    if ((int64_t)(deadline - conn->deadline) > 0) {
        conn->deadline = deadline;
    }
    /* As IB CM's MRA: the REQ arrived, so resend it at half the retry
     * pace. Each copy takes a receive of a peer that is not reposting them
     * (31 requesters once a second ran a busy rank's queue dry). Not
     * longer: the copy is also what recovers a lost REP (a hold of half a
     * timeout, 15 s, made 20% of the 32-rank MPI runs wait 15 s for one). */
    next = now + uct_rc_vqp_cm_ns(cm->mra_hold);
    if ((int64_t)(next - conn->next_send) > 0) {
        conn->next_send = next;
    }
    ucs_debug("rc_vqp cm: ep %p: the peer is busy, request 0x%lx waits",
              conn->ep, conn->id);
}

static void uct_rc_vqp_cm_handle_rej(uct_rc_vqp_iface_t *iface,
                                     const uct_rc_vqp_cm_hdr_t *hdr)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uint64_t id         = le64toh(hdr->id);
    ucs_status_t status = (int16_t)le16toh((uint16_t)hdr->status);
    uct_rc_vqp_cm_conn_t *conn;

    ++cm->stats.rejects_received;
    conn = uct_rc_vqp_cm_find(&cm->active, id);
    if ((conn == NULL) || !conn->listed) {
        return;
    }
    if ((status >= 0) || (status <= UCS_ERR_LAST)) {
        status = UCS_ERR_REJECTED;
    }
    ucs_error("rc_vqp cm: ep %p: the peer rejected the connection: %s",
              conn->ep, ucs_status_string(status));
    uct_rc_vqp_cm_conn_unlist(conn);
    uct_rc_vqp_ep_set_failed(conn->ep, status);
}

static void uct_rc_vqp_cm_handle_drop(uct_rc_vqp_iface_t *iface,
                                      const uct_rc_vqp_cm_hdr_t *hdr)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uint64_t id         = le64toh(hdr->id);
    uct_rc_vqp_cm_conn_t *conn;

    ++cm->stats.drops_received;
    conn = uct_rc_vqp_cm_find(&cm->active, id);
    if (conn == NULL) {
        return; /* destroyed meanwhile */
    }
    ucs_diag("rc_vqp cm: ep %p: the peer released its side of request 0x%lx"
             " after a failure",
             conn->ep, id);
    if (conn->listed) { /* its REP was lost, or comes later */
        uct_rc_vqp_cm_conn_unlist(conn);
    }
    uct_rc_vqp_ep_set_failed(conn->ep, UCS_ERR_CONNECTION_RESET);
}

static void uct_rc_vqp_cm_handle_disc(uct_rc_vqp_iface_t *iface,
                                      const uct_rc_vqp_cm_hdr_t *hdr)
{
    uct_rc_vqp_cm_conn_t *conn;

    ++iface->cm.stats.discs_received;
    conn = uct_rc_vqp_cm_find(&iface->cm.passive, le64toh(hdr->id));
    if (conn != NULL) {
        ucs_debug("rc_vqp cm: peer closed request 0x%lx: passive ep %p gone",
                  conn->id, conn->ep);
        uct_ep_destroy(&conn->ep->super.super);
    }
}

/* A datagram's header and sender address, checked (diag log if bad). */
static ucs_status_t uct_rc_vqp_cm_parse(const char *msg, size_t len,
                                        uct_rc_vqp_cm_hdr_t *hdr,
                                        vqp_dev_addr_t *dev_addr)
{
    size_t used;

    if (len < sizeof(*hdr)) {
        ucs_diag("rc_vqp cm: datagram of %zu bytes is shorter than a header",
                 len);
        return UCS_ERR_INVALID_PARAM;
    }
    memcpy(hdr, msg, sizeof(*hdr));
    if ((hdr->magic != UCT_RC_VQP_CM_MAGIC) ||
        (hdr->version != UCT_RC_VQP_CM_VERSION) ||
        (sizeof(*hdr) + hdr->dev_addr_len + le16toh(hdr->vqp_addr_len) > len)) {
        ucs_diag("rc_vqp cm: datagram (magic 0x%x version %u type %u, %zu"
                 " bytes) is not a valid message of version %d",
                 hdr->magic, hdr->version, hdr->type, len,
                 UCT_RC_VQP_CM_VERSION);
        return UCS_ERR_INVALID_PARAM;
    }
    if (vqp_dev_addr_unpack(msg + sizeof(*hdr), hdr->dev_addr_len, dev_addr,
                            &used) != UCS_OK) {
        ucs_diag("rc_vqp cm: %s with an invalid sender address",
                 uct_rc_vqp_cm_type_str(hdr->type));
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

static void uct_rc_vqp_cm_handle_msg(uct_rc_vqp_iface_t *iface, const char *msg,
                                     size_t len)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uct_rc_vqp_cm_peer_t *peer;
    uct_rc_vqp_cm_hdr_t hdr;
    vqp_dev_addr_t dev_addr;

    if (uct_rc_vqp_cm_parse(msg, len, &hdr, &dev_addr) != UCS_OK) {
        goto drop;
    }
    ucs_trace("rc_vqp cm: %s id 0x%lx from qpn 0x%x",
              uct_rc_vqp_cm_type_str(hdr.type), le64toh(hdr.id),
              le32toh(hdr.src_qpn));
    switch (hdr.type) {
    case UCT_RC_VQP_CM_REQ:
        if (uct_rc_vqp_cm_get_peer(iface, &dev_addr, &peer) != UCS_OK) {
            goto drop;
        }
        uct_rc_vqp_cm_handle_req(iface, &hdr, peer,
                                 msg + sizeof(hdr) + hdr.dev_addr_len);
        return;
    case UCT_RC_VQP_CM_REP:
        uct_rc_vqp_cm_handle_rep(iface, &hdr,
                                 msg + sizeof(hdr) + hdr.dev_addr_len);
        return;
    case UCT_RC_VQP_CM_REJ:
        uct_rc_vqp_cm_handle_rej(iface, &hdr);
        return;
    case UCT_RC_VQP_CM_DISC:
        uct_rc_vqp_cm_handle_disc(iface, &hdr);
        return;
    case UCT_RC_VQP_CM_RTU:
        uct_rc_vqp_cm_handle_rtu(iface, &hdr);
        return;
    case UCT_RC_VQP_CM_MRA:
        uct_rc_vqp_cm_handle_mra(iface, &hdr);
        return;
    case UCT_RC_VQP_CM_DROP:
        uct_rc_vqp_cm_handle_drop(iface, &hdr);
        return;
    default:
        ucs_diag("rc_vqp cm: datagram of unknown type %u", hdr.type);
        break;
    }
drop:
    ++cm->stats.dropped;
}

/* ------------------------------------------------------------ progress */

/* Resends requests that are due and fails the connections past their
 * deadline. A deadline counts only while the interface is progressed: a
 * process that did not call progress for a while (descheduled, busy with
 * other work) sent no request and read no answer then. And it only fails a
 * connection when @a drained (this progress call read every datagram that
 * had arrived): its answer may be among those still queued. */
static void uct_rc_vqp_cm_timers(uct_rc_vqp_iface_t *iface, int drained)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uint64_t now        = uct_rc_vqp_cm_now();
    uct_rc_vqp_cm_conn_t *conn, *tmp;
    char peer[VQP_DEV_ADDR_STR_MAX];
    double interval;
    uint64_t gap;

    ucs_list_for_each_safe(conn, tmp, &cm->connecting, list)
    {
        gap = now - conn->last_check;
        if (gap > cm->stall) {
            ++cm->stats.stalls;
            conn->deadline += gap;
            conn->next_send = now;
        }
        conn->last_check = now;
        if (conn->ep->flags & UCT_RC_VQP_EP_FAILED) {
            uct_rc_vqp_cm_conn_unlist(conn); /* canceled by the user */
        } else if (drained && ((int64_t)(now - conn->deadline) >= 0)) {
            ++cm->stats.timeouts;
            ucs_diag("rc_vqp cm: ep %p: no answer from %s qpn 0x%x after %u"
                     " requests in %.1f s",
                     conn->ep,
                     vqp_dev_addr_str(&conn->peer->addr, peer, sizeof(peer)),
                     conn->peer_qpn, conn->attempts, cm->timeout);
            uct_rc_vqp_cm_conn_unlist(conn);
            uct_rc_vqp_ep_set_failed(conn->ep, UCS_ERR_ENDPOINT_TIMEOUT);
        } else if ((int64_t)(now - conn->next_send) >= 0) {
            uct_rc_vqp_cm_send_req(iface, conn);
            interval =
                ucs_min(cm->retry_interval *
                            (double)(1ul << ucs_min(conn->attempts, 20u)),
                        cm->max_interval);
            conn->next_send = now + uct_rc_vqp_cm_ns(interval);
        }
    }
}

/* A passive endpoint is the peer's: nobody here calls uct_ep_check on it.
 * Probe the idle ones now and then, so one whose peer died without a DISC
 * fails (and is released) instead of keeping its QPs until the interface
 * closes. Busy ones fail by their own operations. Unconfirmed ones are left
 * alone: their probe fails as long as the active side has not read our REP,
 * which a process busy with another worker may not do for many seconds
 * (Open MPI's osc creates its endpoints, then waits on the pml's). Released
 * then, the endpoint's QPs were gone when the REP was finally read. */
static void uct_rc_vqp_cm_keepalive(uct_rc_vqp_iface_t *iface)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uint64_t now        = uct_rc_vqp_cm_now();
    uct_rc_vqp_cm_conn_t *conn;

    if ((int64_t)(now - cm->next_keepalive) < 0) {
        return;
    }
    cm->next_keepalive = now + cm->keepalive;
    kh_foreach_value(&cm->passive, conn, {
        if (!(conn->ep->flags &
              (UCT_RC_VQP_EP_FAILED | UCT_RC_VQP_EP_NOT_READY |
               UCT_RC_VQP_EP_UNCONFIRMED)) &&
            (vqp_ops_in_flight(conn->ep->vqp) == 0)) {
            ++cm->stats.keepalives;
            uct_rc_vqp_ep_check(&conn->ep->super.super, 0, NULL);
        }
    })
}

/* Datagram @a msg taken off the CQ by the async responder: kept for the
 * next progress call; a REQ is answered "busy" (MRA) at once. A REQ of a
 * connection whose REQ is kept already is only answered again: the active
 * side resends while it waits. */
static void uct_rc_vqp_cm_defer(uct_rc_vqp_iface_t *iface, const char *msg,
                                size_t len)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uct_rc_vqp_cm_deferred_t *d;
    uct_rc_vqp_cm_peer_t *peer;
    uct_rc_vqp_cm_hdr_t hdr;
    vqp_dev_addr_t dev_addr;
    int kept = 0;

    if (uct_rc_vqp_cm_parse(msg, len, &hdr, &dev_addr) != UCS_OK) {
        ++cm->stats.dropped;
        return;
    }
    if (hdr.type == UCT_RC_VQP_CM_REQ) {
        ucs_queue_for_each(d, &cm->deferred, queue)
        {
            kept |= (d->type == UCT_RC_VQP_CM_REQ) && (d->id == hdr.id);
        }
    }
    if (!kept) {
        d = (cm->num_deferred < UCT_RC_VQP_CM_MAX_DEFERRED)
                ? ucs_malloc(sizeof(*d) + len, "rc_vqp_cm_deferred")
                : NULL;
        if (d == NULL) {
            ++cm->stats.dropped; /* a REQ comes again; others are best effort */
            return;
        }
        d->id   = hdr.id;
        d->type = hdr.type;
        d->len  = len;
        memcpy(d->msg, msg, len);
        ucs_queue_push(&cm->deferred, &d->queue);
        ++cm->num_deferred;
        ++cm->stats.deferred;
    }
    if ((hdr.type == UCT_RC_VQP_CM_REQ) &&
        (uct_rc_vqp_cm_get_peer(iface, &dev_addr, &peer) == UCS_OK) &&
        (uct_rc_vqp_cm_send(iface, peer, le32toh(hdr.src_qpn),
                            UCT_RC_VQP_CM_MRA, le64toh(hdr.id), NULL,
                            UCS_OK) == UCS_OK)) {
        ++cm->stats.mras_sent;
    }
}

/* Polls at most @a max CQEs: send completions free their buffers; each
 * datagram received is handled, or kept (@a defer: the async responder).
 * Returns the CQEs polled. */
static unsigned uct_rc_vqp_cm_poll(uct_rc_vqp_iface_t *iface, int defer,
                                   unsigned max)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    unsigned count = 0, posted = 0;
    struct mlx5_cqe64 *cqe;
    ucs_status_t status;
    const char *msg;
    uint16_t index;
    uint32_t len;
    uint8_t opcode;

    while ((count < max) && ((cqe = vqp_mlx5_cq_poll(&cm->cq)) != NULL)) {
        ++count;
        opcode = vqp_mlx5_cqe_opcode(cqe);
        status = vqp_mlx5_cqe_status(cqe);
        index  = vqp_mlx5_cqe_wqe_counter(cqe);
        if ((opcode == MLX5_CQE_REQ) || (opcode == MLX5_CQE_REQ_ERR)) {
            /* Every datagram is signaled: one CQE frees one buffer. A send
             * error leaves the UD QP unable to send (SQE): say so. */
            if ((status != UCS_OK) && (status != UCS_ERR_CANCELED)) {
                ucs_error("rc_vqp cm: datagram on UD qpn 0x%x failed: %s;"
                          " this interface cannot connect any more",
                          cm->qpn, ucs_status_string(status));
            }
            vqp_mlx5_txwq_complete(&cm->tx, index);
            ++cm->tx_done;
            continue;
        }
        vqp_mlx5_rxwq_complete(&cm->rx, index);
        if (status == UCS_OK) {
            len = vqp_mlx5_cqe_byte_cnt(cqe);
            msg = uct_rc_vqp_cm_rx_slot(cm, index) + VQP_DEV_UD_GRH_LEN;
            UCT_RC_VQP_DEVICE_WROTE(msg - VQP_DEV_UD_GRH_LEN, len);
            if (len < VQP_DEV_UD_GRH_LEN) {
                /* too short to carry anything */
            } else if (defer) {
                uct_rc_vqp_cm_defer(iface, msg, len - VQP_DEV_UD_GRH_LEN);
            } else {
                uct_rc_vqp_cm_handle_msg(iface, msg, len - VQP_DEV_UD_GRH_LEN);
            }
        } else if (status == UCS_ERR_CANCELED) {
            continue; /* flushed: the QP is going away */
        } else {
            ucs_error("rc_vqp cm: receive on UD qpn 0x%x failed: %s; new"
                      " connections to this interface may fail",
                      cm->qpn, ucs_status_string(status));
        }
        if (uct_rc_vqp_cm_post_recv(cm) == UCS_OK) {
            ++posted;
        }
    }
    if (count != 0) {
        vqp_mlx5_cq_update_ci(&cm->cq);
        if (posted != 0) {
            vqp_mlx5_rxwq_ring(&cm->rx);
        }
    }
    return count;
}

/* Datagrams the async responder kept, in arrival order. */
static unsigned uct_rc_vqp_cm_handle_deferred(uct_rc_vqp_iface_t *iface)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uct_rc_vqp_cm_deferred_t *d;
    unsigned count = 0;

    while (!ucs_queue_is_empty(&cm->deferred)) {
        d = ucs_queue_pull_elem_non_empty(&cm->deferred,
                                          uct_rc_vqp_cm_deferred_t, queue);
        --cm->num_deferred;
        uct_rc_vqp_cm_handle_msg(iface, d->msg, d->len);
        ucs_free(d);
        ++count;
    }
    return count;
}

/* The async responder: a timer on the worker's async context. While the
 * interface is progressed it does nothing; when a whole period passed
 * without a progress call, it empties the manager's CQ into the deferred
 * queue, answering REQs with MRA, so a requester does not time out on a
 * peer that is only busy. It never waits for the lock: the interface's
 * thread may hold it while it waits for the async context. */
static void uct_rc_vqp_cm_async(int id, ucs_event_set_types_t events, void *arg)
{
    uct_rc_vqp_iface_t *iface = arg;
    uct_rc_vqp_cm_t *cm       = &iface->cm;
    uint32_t gen = __atomic_load_n(&cm->progress_gen, __ATOMIC_RELAXED);

    (void)id;
    (void)events;
    if (gen != cm->async_gen) {
        cm->async_gen = gen; /* progressed since the last tick */
        return;
    }
    if (!ucs_spin_try_lock(&cm->lock)) {
        return;
    }
    uct_rc_vqp_cm_poll(iface, 1, cm->rx_slots + cm->tx_slots);
    ucs_spin_unlock(&cm->lock);
}

/* Whether a progress call has more to do than look (under the lock): a
 * datagram or a kept one, connections being made or released, or the
 * keepalive's turn (its counter counts here). */
static UCS_F_ALWAYS_INLINE int uct_rc_vqp_cm_busy(uct_rc_vqp_cm_t *cm)
{
    /* First: the counter counts every call, busy or not. */
    int ka_due = (kh_size(&cm->passive) != 0) && (cm->keepalive != 0) &&
                 (++cm->ka_iter >= UCT_RC_VQP_CM_KA_SKIP);

    return ka_due || !ucs_queue_is_empty(&cm->deferred) ||
           vqp_mlx5_cq_ready(&cm->cq) || !ucs_list_is_empty(&cm->connecting) ||
           !ucs_list_is_empty(&cm->doomed);
}

/* What uct_rc_vqp_cm_busy found to do, out of line: an idle progress call
 * does not pay for this frame. */
static UCS_F_NOINLINE unsigned uct_rc_vqp_cm_work(uct_rc_vqp_iface_t *iface)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    char peer[VQP_DEV_ADDR_STR_MAX];
    uct_rc_vqp_cm_conn_t *conn;
    unsigned count, polled;

    count  = uct_rc_vqp_cm_handle_deferred(iface);
    polled = uct_rc_vqp_cm_poll(iface, 0, UCT_RC_VQP_CM_POLL);
    count += polled;
    if (ucs_unlikely(!ucs_list_is_empty(&cm->connecting))) {
        uct_rc_vqp_cm_timers(iface, polled < UCT_RC_VQP_CM_POLL);
    }
    if (cm->ka_iter >= UCT_RC_VQP_CM_KA_SKIP) {
        cm->ka_iter = 0;
        if ((kh_size(&cm->passive) != 0) && (cm->keepalive != 0)) {
            uct_rc_vqp_cm_keepalive(iface);
        }
    }
    while (ucs_unlikely(!ucs_list_is_empty(&cm->doomed))) {
        conn = ucs_list_head(&cm->doomed, uct_rc_vqp_cm_conn_t, list);
        uct_rc_vqp_cm_conn_unlist(conn);
        ++cm->stats.passive_expired;
        ucs_diag("rc_vqp cm: passive ep %p of request 0x%lx: peer %s"
                 " unreachable, released",
                 conn->ep, conn->id,
                 vqp_dev_addr_str(&conn->peer->addr, peer, sizeof(peer)));
        /* Best effort (a dead peer gets nothing): its endpoint fails now,
         * not at its next send. */
        uct_rc_vqp_cm_send(iface, conn->peer, conn->peer_qpn,
                           UCT_RC_VQP_CM_DROP, conn->id, NULL, UCS_OK);
        uct_ep_destroy(&conn->ep->super.super);
        ++count;
    }
    return count;
}

unsigned uct_rc_vqp_cm_progress(uct_rc_vqp_iface_t *iface)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    unsigned count;

    /* Only this thread writes it; the responder reads it. */
    __atomic_store_n(&cm->progress_gen, cm->progress_gen + 1, __ATOMIC_RELAXED);
    if (!uct_rc_vqp_cm_trylock(cm)) {
        return 0; /* the responder has it, for a moment */
    }
    count = uct_rc_vqp_cm_busy(cm) ? uct_rc_vqp_cm_work(iface) : 0;
    uct_rc_vqp_cm_unlock(cm);
    return count;
}

ucs_status_t uct_rc_vqp_cm_arm(uct_rc_vqp_iface_t *iface)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    ucs_status_t status;

    uct_rc_vqp_cm_lock(cm);
    if (!ucs_queue_is_empty(&cm->deferred)) {
        status = UCS_ERR_BUSY;
        goto out;
    }
    status = vqp_dev_cq_arm(cm->dev_cq, cm->cq.ci, 0);
    if (status != UCS_OK) {
        goto out;
    }
    if (vqp_mlx5_cq_ready_at_arm(&cm->cq)) {
        status = UCS_ERR_BUSY;
    }
out:
    uct_rc_vqp_cm_unlock(cm);
    return status;
}

/* ------------------------------------------------------------ endpoints */

ucs_status_t uct_rc_vqp_cm_connect(uct_rc_vqp_ep_t *ep,
                                   const vqp_dev_addr_t *dev_addr, uint32_t qpn)
{
    uct_rc_vqp_iface_t *iface =
        ucs_derived_of(ep->super.super.iface, uct_rc_vqp_iface_t);
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uct_rc_vqp_cm_conn_t *conn;
    ucs_status_t status;
    uint64_t now;

    conn = ucs_calloc(1, sizeof(*conn), "rc_vqp_cm_conn");
    if (conn == NULL) {
        ucs_error("rc_vqp cm: out of memory for a connection");
        return UCS_ERR_NO_MEMORY;
    }
    uct_rc_vqp_cm_lock(cm);
    status = uct_rc_vqp_cm_get_peer(iface, dev_addr, &conn->peer);
    if (status != UCS_OK) {
        goto err_free;
    }
    conn->ep       = ep;
    conn->peer_qpn = qpn;
    do {
        conn->id = ucs_generate_uuid((uintptr_t)conn);
    } while ((conn->id == 0) ||
             (uct_rc_vqp_cm_find(&cm->active, conn->id) != NULL));
    status = uct_rc_vqp_cm_insert(&cm->active, conn);
    if (status != UCS_OK) {
        goto err_free;
    }
    ep->conn = conn;
    ep->flags |= UCT_RC_VQP_EP_NOT_READY;

    /* A datagram that cannot go now (no send buffer) goes at the first
     * retry; an address too large for a datagram never will. */
    status = uct_rc_vqp_cm_send_req(iface, conn);
    if (status == UCS_ERR_EXCEEDS_LIMIT) {
        uct_rc_vqp_cm_remove(&cm->active, conn->id);
        ep->conn = NULL;
        goto err_free;
    }
    now              = uct_rc_vqp_cm_now();
    conn->next_send  = now + uct_rc_vqp_cm_ns(cm->retry_interval);
    conn->deadline   = now + uct_rc_vqp_cm_ns(cm->timeout);
    conn->last_check = now;
    ucs_list_add_tail(&cm->connecting, &conn->list);
    conn->listed = 1;
    ucs_debug("rc_vqp cm: ep %p connecting to qpn 0x%x, request 0x%lx", ep, qpn,
              conn->id);
    uct_rc_vqp_cm_unlock(cm);
    return UCS_OK;

err_free:
    uct_rc_vqp_cm_unlock(cm);
    ucs_free(conn);
    return status;
}

void uct_rc_vqp_cm_ep_cleanup(uct_rc_vqp_ep_t *ep)
{
    uct_rc_vqp_iface_t *iface =
        ucs_derived_of(ep->super.super.iface, uct_rc_vqp_iface_t);
    uct_rc_vqp_cm_conn_t *conn = ep->conn;

    if (conn == NULL) {
        return;
    }
    uct_rc_vqp_cm_lock(&iface->cm);
    uct_rc_vqp_cm_conn_unlist(conn);
    if (conn->passive) {
        uct_rc_vqp_cm_remove(&iface->cm.passive, conn->id);
    } else {
        uct_rc_vqp_cm_remove(&iface->cm.active, conn->id);
        /* Best effort: a lost DISC leaves the peer's passive endpoint until
         * its interface closes. Also sent for a connection that never got
         * its REP: the peer may have created the endpoint anyway. */
        uct_rc_vqp_cm_send(iface, conn->peer, conn->peer_qpn,
                           UCT_RC_VQP_CM_DISC, conn->id, NULL, UCS_OK);
    }
    uct_rc_vqp_cm_unlock(&iface->cm);
    ep->conn = NULL;
    ucs_free(conn);
}

void uct_rc_vqp_cm_ep_failed(uct_rc_vqp_ep_t *ep)
{
    uct_rc_vqp_iface_t *iface =
        ucs_derived_of(ep->super.super.iface, uct_rc_vqp_iface_t);
    uct_rc_vqp_cm_conn_t *conn = ep->conn;

    if ((conn == NULL) || !conn->passive || conn->listed) {
        return;
    }
    ucs_list_add_tail(&iface->cm.doomed, &conn->list);
    conn->listed = 1;
}

/* ------------------------------------------------------------ interface */

void uct_rc_vqp_cm_get_iface_address(uct_rc_vqp_iface_t *iface,
                                     uct_rc_vqp_iface_addr_t *addr)
{
    addr->qpn_ver =
        htole32(iface->cm.qpn | ((uint32_t)UCT_RC_VQP_CM_VERSION << 24));
}

ucs_status_t uct_rc_vqp_cm_unpack_iface_address(const void *buf,
                                                uint32_t *qpn_p)
{
    uct_rc_vqp_iface_addr_t addr;
    uint32_t value;

    memcpy(&addr, buf, sizeof(addr));
    value = le32toh(addr.qpn_ver);
    if ((value >> 24) != UCT_RC_VQP_CM_VERSION) {
        /* Not an error here: is_reachable asks about any address. */
        ucs_debug("rc_vqp: interface address of version %u, expected %d",
                  value >> 24, UCT_RC_VQP_CM_VERSION);
        return UCS_ERR_INVALID_PARAM;
    }
    *qpn_p = value & 0xffffff;
    return UCS_OK;
}

/* The async responder's timer, on the worker's async context. A context in
 * poll mode dispatches timers only when its owner asks (ucs_async_poll),
 * which no interface user does between its progress calls: none then. Nor
 * on a device where QPs of different CQs may share a doorbell register: the
 * MRA rings the UD QP's (on the CM's own CQ) from the async thread while the
 * interface's thread may ring a data QP's (vqp_dev_attr_t.qp_db_private). */
static ucs_status_t uct_rc_vqp_cm_async_start(uct_rc_vqp_iface_t *iface)
{
    ucs_async_context_t *async = iface->super.worker->async;
    uct_rc_vqp_cm_t *cm        = &iface->cm;
    double tick =
        ucs_max(ucs_min(UCT_RC_VQP_CM_ASYNC_TICK, cm->timeout / 10), 0.001);
    vqp_dev_attr_t attr;
    ucs_status_t status;

    vqp_dev_query(iface->dev, &attr);
    if (!attr.qp_db_private) {
        ucs_debug("rc_vqp cm: %s: its QPs may share doorbell registers; busy"
                  " peers are not answered from the async thread",
                  attr.name);
        return UCS_OK;
    }
    if ((async == NULL) || (async->mode == UCS_ASYNC_MODE_POLL)) {
        return UCS_OK;
    }
    status = ucs_async_add_timer(async->mode, ucs_time_from_sec(tick),
                                 uct_rc_vqp_cm_async, iface, async,
                                 &cm->async_timer);
    if (status != UCS_OK) {
        ucs_error("rc_vqp cm: cannot add its async timer: %s",
                  ucs_status_string(status));
        cm->async_timer = -1;
    }
    return status;
}

ucs_status_t uct_rc_vqp_cm_init(uct_rc_vqp_iface_t *iface, double timeout,
                                double keepalive)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    vqp_dev_ud_qp_init_t init;
    struct mlx5dv_qp dv_qp;
    struct mlx5dv_cq dv_cq;
    vqp_dev_qp_caps_t caps;
    vqp_dev_attr_t attr;
    ucs_status_t status;
    size_t size;
    uint32_t rkey;
    unsigned i;

    memset(cm, 0, sizeof(*cm));
    cm->async_timer = -1;
    ucs_queue_head_init(&cm->deferred);
    status = ucs_spinlock_init(&cm->lock, 0);
    if (status != UCS_OK) {
        ucs_error("rc_vqp cm: cannot initialise its lock");
        return status;
    }
    kh_init_inplace(uct_rc_vqp_cm_conns, &cm->active);
    kh_init_inplace(uct_rc_vqp_cm_conns, &cm->passive);
    ucs_list_head_init(&cm->connecting);
    ucs_list_head_init(&cm->doomed);
    cm->qkey           = UCT_RC_VQP_CM_QKEY;
    cm->timeout        = timeout;
    cm->retry_interval = ucs_min(0.05, timeout / 8);
    /* Several REQs per timeout: each busy answer (MRA) moves the deadline
     * by a timeout, and the next must come before it passes. */
    cm->max_interval   = ucs_min(UCT_RC_VQP_CM_BACKOFF, timeout / 4);
    cm->mra_hold       = ucs_min(2 * cm->max_interval, timeout / 2);
    cm->stall          = uct_rc_vqp_cm_ns(cm->max_interval);
    cm->keepalive      = ((keepalive > 0) && (keepalive < 1e9))
                             ? uct_rc_vqp_cm_ns(keepalive)
                             : 0;
    cm->next_keepalive = uct_rc_vqp_cm_now() + cm->keepalive;
    cm->rx_slots       = UCT_RC_VQP_CM_RX_SLOTS;
    cm->tx_slots       = UCT_RC_VQP_CM_TX_SLOTS;

    vqp_dev_query(iface->dev, &attr);
    cm->msg_max = ucs_min((size_t)attr.max_ud_msg, UCT_RC_VQP_CM_MSG_MAX);
    if (cm->msg_max < 256) {
        ucs_error("rc_vqp cm: device %s carries datagrams of %u bytes, at"
                  " least 256 are needed",
                  attr.name, attr.max_ud_msg);
        status = UCS_ERR_UNSUPPORTED;
        goto err;
    }
    /* Receive slots take the largest datagram any device carries, not only
     * ours: a larger one would end the QP (a receive too short is a
     * receive-queue error). */
    cm->slot_size = VQP_DEV_UD_GRH_LEN + UCT_RC_VQP_CM_MSG_MAX;
    size    = (size_t)cm->rx_slots * cm->slot_size + cm->tx_slots * cm->msg_max;
    cm->buf = ucs_malloc(size, "rc_vqp_cm_buf");
    if (cm->buf == NULL) {
        ucs_error("rc_vqp cm: out of memory for %zu bytes of buffers", size);
        status = UCS_ERR_NO_MEMORY;
        goto err;
    }
    status = vqp_dev_mr_reg(iface->dev, cm->buf, size, IBV_ACCESS_LOCAL_WRITE,
                            &cm->mr, &cm->lkey, &rkey);
    if (status != UCS_OK) {
        goto err_buf;
    }
    status = vqp_dev_cq_create(iface->dev, 2 * (cm->rx_slots + cm->tx_slots),
                               &cm->dev_cq, &dv_cq);
    if (status != UCS_OK) {
        goto err_mr;
    }
    status = vqp_mlx5_cq_init(&cm->cq, &dv_cq);
    if (status != UCS_OK) {
        goto err_cq;
    }
    memset(&init, 0, sizeof(init));
    init.send_cq      = cm->dev_cq;
    init.recv_cq      = cm->dev_cq;
    init.max_send_wr  = 2 * cm->tx_slots; /* 2 BBs per datagram */
    init.max_send_sge = 1;
    init.max_recv_wr  = cm->rx_slots;
    init.max_recv_sge = 1;
    init.max_inline   = 0;
    init.qkey         = cm->qkey;
    status =
        vqp_dev_ud_qp_create(iface->dev, &init, &cm->dev_qp, &dv_qp, &caps);
    if (status != UCS_OK) {
        goto err_cq;
    }
    cm->qpn = caps.qpn;
    status = vqp_mlx5_txwq_init(&cm->tx, &dv_qp, caps.qpn, 0, 1, VQP_MLX5_DB_BF,
                                &cm->bf_toggle);
    if (status != UCS_OK) {
        goto err_qp;
    }
    status = vqp_mlx5_rxwq_init(&cm->rx, &dv_qp);
    if (status != UCS_OK) {
        goto err_qp;
    }
    cm->rx_slots = ucs_min(cm->rx_slots, (unsigned)cm->rx.mask + 1);
    for (i = 0; i < cm->rx_slots; ++i) {
        status = uct_rc_vqp_cm_post_recv(cm);
        if (status != UCS_OK) {
            goto err_qp;
        }
    }
    vqp_mlx5_rxwq_ring(&cm->rx);
    status = uct_rc_vqp_cm_async_start(iface);
    if (status != UCS_OK) {
        goto err_qp;
    }
    ucs_debug("rc_vqp cm: interface %p listens on UD qpn 0x%x", iface, cm->qpn);
    return UCS_OK;

err_qp:
    vqp_dev_qp_destroy(cm->dev_qp);
err_cq:
    vqp_dev_cq_destroy(cm->dev_cq);
err_mr:
    vqp_dev_mr_dereg(cm->mr);
err_buf:
    ucs_free(cm->buf);
err:
    kh_destroy_inplace(uct_rc_vqp_cm_conns, &cm->active);
    kh_destroy_inplace(uct_rc_vqp_cm_conns, &cm->passive);
    ucs_spinlock_destroy(&cm->lock);
    return status;
}

void uct_rc_vqp_cm_cleanup(uct_rc_vqp_iface_t *iface)
{
    uct_rc_vqp_cm_t *cm = &iface->cm;
    uct_rc_vqp_cm_deferred_t *d;
    uct_rc_vqp_cm_conn_t *conn;
    unsigned i;

    /* First the responder: it must not run on what is freed below. */
    if (cm->async_timer >= 0) {
        ucs_async_remove_handler(cm->async_timer, 1);
        cm->async_timer = -1;
    }
    /* Passive endpoints are ours; the user's endpoints should be gone. */
    kh_foreach_value(&cm->passive, conn,
                     { uct_ep_destroy(&conn->ep->super.super); });
    ucs_debug("rc_vqp cm: %lu REQs sent, %lu received (%lu again), %lu REPs"
              " (%lu late), %lu REJs, %lu DISCs, %lu timeouts (%lu deadlines"
              " moved for stalls), %lu dropped, %lu keepalive probes, %lu"
              " passive endpoints released, %lu DROPs",
              cm->stats.reqs_sent, cm->stats.reqs_received, cm->stats.dup_reqs,
              cm->stats.reps_received, cm->stats.dup_reps,
              cm->stats.rejects_received, cm->stats.discs_received,
              cm->stats.timeouts, cm->stats.stalls, cm->stats.dropped,
              cm->stats.keepalives, cm->stats.passive_expired,
              cm->stats.drops_received);
    vqp_dev_qp_destroy(cm->dev_qp);
    vqp_dev_cq_destroy(cm->dev_cq);
    vqp_dev_mr_dereg(cm->mr);
    ucs_free(cm->buf);
    for (i = 0; i < cm->num_peers; ++i) {
        vqp_dev_ah_destroy(cm->peers[i]->ah);
        ucs_free(cm->peers[i]);
    }
    ucs_free(cm->peers);
    while (!ucs_queue_is_empty(&cm->deferred)) {
        d = ucs_queue_pull_elem_non_empty(&cm->deferred,
                                          uct_rc_vqp_cm_deferred_t, queue);
        ucs_free(d);
    }
    kh_destroy_inplace(uct_rc_vqp_cm_conns, &cm->active);
    kh_destroy_inplace(uct_rc_vqp_cm_conns, &cm->passive);
    ucs_spinlock_destroy(&cm->lock);
}
