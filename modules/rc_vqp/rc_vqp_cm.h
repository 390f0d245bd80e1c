/*
 * rc_vqp connection manager: lets an endpoint connect to a peer interface's
 * address (UCT_IFACE_FLAG_CONNECT_TO_IFACE), so UCP can use rc_vqp without an
 * auxiliary wireup transport.
 *
 * Every interface owns one UD QP (its address is the interface address).
 * An endpoint created from an interface address sends a REQ datagram with
 * its virtual QP's address; the peer interface creates a passive endpoint
 * (never shown to the user; it receives the active side's active messages and
 * serves its RDMA), connects it and answers with a REP carrying its own
 * address. Lost datagrams are covered by resending the REQ until a REP or a
 * REJ arrives or the connect timeout expires; duplicates are recognised by
 * the connection id. Operations posted meanwhile get UCS_ERR_NO_RESOURCE and
 * wait in the pending queue. Destroying an active endpoint sends a DISC so
 * the peer releases its passive endpoint.
 *
 * A peer that does not progress its interface (a long computation, a wait
 * on another worker) still answers, as UCX's own wireup (over UD, acked by
 * the async thread) does: a timer on the worker's async context finds the
 * manager not polled for a whole period, takes the datagrams off its CQ for
 * the next progress call and answers each REQ with an MRA ("received, the
 * answer follows"), which moves the requester's deadline. Only a peer that
 * is gone, or never had an interface at that address, times out.
 */
#ifndef UCT_RC_VQP_CM_H_
#define UCT_RC_VQP_CM_H_

#include <core/vqp.h>
#include <mlx5/vqp_mlx5.h>
#include <ucs/datastruct/khash.h>
#include <ucs/datastruct/list.h>
#include <ucs/datastruct/queue_types.h>
#include <ucs/type/spinlock.h>

typedef struct uct_rc_vqp_iface uct_rc_vqp_iface_t;
typedef struct uct_rc_vqp_ep uct_rc_vqp_ep_t;

/* A remote device the manager sends datagrams to: its address handle. */
typedef struct uct_rc_vqp_cm_peer {
    vqp_dev_addr_t addr;
    vqp_dev_ah_t *ah;
    struct mlx5_wqe_av av;
} uct_rc_vqp_cm_peer_t;

/* The manager's side of one endpoint it connected (active) or created for a
 * peer's request (passive). */
typedef struct uct_rc_vqp_cm_conn {
    uct_rc_vqp_ep_t *ep;
    uct_rc_vqp_cm_peer_t *peer; /* the other side's device */
    uint32_t peer_qpn;          /* the other side's CM QPN */
    uint64_t id;                /* chosen by the active side, random */
    int passive;
    unsigned attempts;    /* REQs sent (active) */
    uint64_t next_send;   /* next REQ, ns (active, connecting) */
    uint64_t deadline;    /* give up, ns (active, connecting) */
    uint64_t last_check;  /* the timers' last look at it, ns */
    ucs_list_link_t list; /* cm.connecting or cm.doomed */
    int listed;
} uct_rc_vqp_cm_conn_t;

KHASH_MAP_INIT_INT64(uct_rc_vqp_cm_conns, uct_rc_vqp_cm_conn_t *);

/* A datagram the async responder took off the CQ while the interface was
 * not progressed: handled by the next progress call, in arrival order. */
typedef struct uct_rc_vqp_cm_deferred {
    ucs_queue_elem_t queue;
    uint64_t id;  /* of its connection */
    uint8_t type; /* UCT_RC_VQP_CM_* */
    size_t len;
    char msg[];
} uct_rc_vqp_cm_deferred_t;

typedef struct uct_rc_vqp_cm_stats {
    uint64_t reqs_sent;
    uint64_t reqs_received;
    uint64_t dup_reqs; /* answered again from the existing endpoint */
    uint64_t reps_received;
    uint64_t dup_reps; /* for a connection that was up already or gone */
    uint64_t discs_received;
    uint64_t rtus_received;
    uint64_t rejects_received;
    uint64_t dropped; /* malformed, wrong version, no room to answer */
    uint64_t timeouts;
    uint64_t stalls;          /* connect deadlines moved for a process stall */
    uint64_t keepalives;      /* probes of idle passive endpoints */
    uint64_t passive_expired; /* passive endpoints whose peer was gone */
    uint64_t drops_received;  /* active endpoints whose peer released */
    uint64_t deferred;        /* datagrams taken off by the async responder */
    uint64_t mras_sent;       /* REQs answered "busy, wait" by it */
    uint64_t mras_received;   /* connect deadlines moved by a busy peer */
} uct_rc_vqp_cm_stats_t;

typedef struct uct_rc_vqp_cm {
    vqp_dev_cq_t *dev_cq;
    vqp_dev_qp_t *dev_qp;
    vqp_dev_mr_t *mr;
    vqp_mlx5_cq_t cq;
    vqp_mlx5_txwq_t tx;
    uint32_t bf_toggle; /* its register's next half (its own CQ's domain) */
    vqp_mlx5_rxwq_t rx;
    char *buf; /* rx slots, then tx slots */
    uint32_t lkey;
    uint32_t qpn; /* the interface address */
    uint32_t qkey;
    size_t msg_max;    /* largest datagram payload */
    size_t slot_size;  /* bytes per rx slot (GRH room + payload) */
    unsigned rx_slots; /* receives kept posted */
    unsigned tx_slots; /* send buffers */
    uint64_t tx_posted;
    uint64_t tx_done;
    double retry_interval; /* first REQ resend, doubling up to max */
    double max_interval;   /* 1 s, or a quarter of the timeout if less */
    double mra_hold;       /* next REQ after an MRA: 2 max, <= timeout/2 */
    double timeout;        /* connect attempt limit, seconds */
    /* A gap between two progress calls longer than this is a stall of the
     * process: no REQ went out and no answer was read in it, so it does not
     * count against the peer (the connect deadline moves by the gap). */
    uint64_t stall;
    /* Idle passive endpoints are probed every keepalive ns (0: never); the
     * clock is read once every UCT_RC_VQP_CM_KA_SKIP progress calls. */
    uint64_t keepalive;
    uint64_t next_keepalive;
    unsigned ka_iter;
    /* Set while a passive endpoint is being created: its virtual QP takes
     * the QP count and scheme of the request instead of the config. */
    const vqp_params_t *passive_params;
    khash_t(uct_rc_vqp_cm_conns) active;  /* by id: our connect attempts */
    khash_t(uct_rc_vqp_cm_conns) passive; /* by id: peers' connections */
    uct_rc_vqp_cm_peer_t **peers;         /* address handles, by device */
    unsigned num_peers;
    ucs_list_link_t connecting; /* active conns waiting for a REP */
    ucs_list_link_t doomed;     /* passive conns to destroy in progress */
    uct_rc_vqp_cm_stats_t stats;
    /* Guards the CQ, both work queues, their buffers, the peers, the
     * connection tables and the deferred datagrams against the async
     * responder, which only ever tries it. Taken by the interface's thread
     * through uct_rc_vqp_cm_lock (a depth count: its handlers destroy and
     * create endpoints, which come back to the manager). */
    ucs_spinlock_t lock;
    unsigned lock_depth;
    int async_timer;       /* the responder's timer id, or -1 */
    uint32_t progress_gen; /* progress calls (interface thread) */
    uint32_t async_gen;    /* progress_gen at the responder's last tick */
    ucs_queue_head_t deferred;
    unsigned num_deferred;
} uct_rc_vqp_cm_t;

/* Interface address: the CM QPN (24 bits) and the format version. */
typedef struct uct_rc_vqp_iface_addr {
    uint32_t qpn_ver; /* little endian: qpn | version << 24 */
} UCS_S_PACKED uct_rc_vqp_iface_addr_t;

ucs_status_t uct_rc_vqp_cm_init(uct_rc_vqp_iface_t *iface, double timeout,
                                double keepalive);
void uct_rc_vqp_cm_cleanup(uct_rc_vqp_iface_t *iface);
unsigned uct_rc_vqp_cm_progress(uct_rc_vqp_iface_t *iface);
/* The manager's part of uct_iface_event_arm: UCS_ERR_BUSY when a datagram
 * waits (on the CQ or deferred), else its CQ armed. */
ucs_status_t uct_rc_vqp_cm_arm(uct_rc_vqp_iface_t *iface);
void uct_rc_vqp_cm_get_iface_address(uct_rc_vqp_iface_t *iface,
                                     uct_rc_vqp_iface_addr_t *addr);
/* Checks an interface address: UCS_ERR_INVALID_PARAM (debug log) if bad. */
ucs_status_t uct_rc_vqp_cm_unpack_iface_address(const void *buf,
                                                uint32_t *qpn_p);

/* Start connecting @a ep (created, not connected) to the interface at
 * @a dev_addr / @a qpn. */
ucs_status_t uct_rc_vqp_cm_connect(uct_rc_vqp_ep_t *ep,
                                   const vqp_dev_addr_t *dev_addr,
                                   uint32_t qpn);
/* The endpoint is going away: forget it, tell the peer (active). */
void uct_rc_vqp_cm_ep_cleanup(uct_rc_vqp_ep_t *ep);
/* A passive endpoint failed: destroy it from progress, silently. */
void uct_rc_vqp_cm_ep_failed(uct_rc_vqp_ep_t *ep);

#endif
