/*
 * Multi-QP core (libvqp): the whole interface of the layer.
 *
 * A virtual QP drives N physical RC QPs (possibly on several devices) as one
 * QP. RDMA WRITE / WRITE_IMM / READ larger than the striping threshold are cut
 * into fragments spread over the QPs that have room; SEND and atomics go to
 * the primary QP. Completions of all physical QPs of a device land on one CQ,
 * are routed by QP number (never by opcode) and reported once per operation,
 * in posting order, with the first error as status.
 *
 * WRITE_IMM notifications reach the receiver in order with the user's
 * immediate data:
 *  - SPRAY: data fragments are plain WRITEs; once all of them completed, one
 *    zero-length WRITE_IMM with the user's immediate goes on the notify QP.
 *  - DQPLB: every fragment is a WRITE_IMM carrying a 24-bit sequence number;
 *    the operation ends with a 4-byte SEND_IMM carrying its last sequence
 *    number and the user's immediate. The receiver reorders in a bounded
 *    window and reports one notification per operation.
 * Plain WRITE and READ are striped the same way under both schemes and never
 * involve the receiver.
 *
 * A physical QP that fails is excluded from dispatch; its unfinished WRITE and
 * READ fragments are replayed on the surviving QPs (the DQPLB receiver drops
 * duplicate sequence numbers). Only when no QP survives do operations fail,
 * each exactly once.
 */
#ifndef VQP_H_
#define VQP_H_

#include <dev/vqp_dev.h>
#include <ucs/config/types.h>
#include <ucs/type/status.h>
#include <stddef.h>
#include <stdint.h>

/* Devices one virtual QP may span. */
#define VQP_MAX_DEVS 4

typedef struct vqp_cq vqp_cq_t;
typedef struct vqp_srq vqp_srq_t;
typedef struct vqp vqp_t;

typedef enum vqp_lb { VQP_LB_DQPLB, VQP_LB_SPRAY } vqp_lb_t;

typedef enum vqp_opcode {
    VQP_OP_WRITE,
    VQP_OP_WRITE_IMM,
    VQP_OP_READ,
    VQP_OP_SEND,
    VQP_OP_SEND_IMM,
    /* Atomics: length is the operand's size, 8 or 4 bytes (local and remote
     * addresses aligned to it); the old value lands at local_addr in host
     * order. 8-byte FA and CS are the basic ones; everything else uses the
     * extended (masked) forms a ConnectX offers. */
    VQP_OP_ATOMIC_FA,   /* fetch-and-add compare_add */
    VQP_OP_ATOMIC_CS,   /* compare with compare_add, swap in swap */
    VQP_OP_ATOMIC_SWAP, /* store compare_add */
    VQP_OP_ATOMIC_AND,  /* and with compare_add */
    VQP_OP_ATOMIC_OR,   /* or with compare_add */
    VQP_OP_ATOMIC_XOR,  /* xor with compare_add */
    VQP_OP_FLUSH,       /* completes when everything posted before it has */
    /* A zero-length WRITE on every physical QP alive: checks that the peer
     * answers. Fails only when the peer is unreachable (no data QP or the
     * send QP is left); QPs failing one by one do not fail it. */
    VQP_OP_PROBE,
    VQP_OP_RECV,       /* completion of a data receive (SEND arrived) */
    VQP_OP_RECV_NOTIFY /* completion of a notification (WRITE_IMM arrived) */
} vqp_opcode_t;

enum {
    VQP_SEND_SIGNALED = 1u << 0, /* report a completion for this operation */
    VQP_SEND_FENCE    = 1u << 1, /* start after all earlier ones completed */
    VQP_SEND_INLINE   = 1u << 2  /* small data may be copied into the WQE */
};

/* One operation. Keys are per device: index d is the key on the virtual QP's
 * device d (see vqp_params_t.devs). */
typedef struct vqp_send_wr {
    uint64_t wr_id;
    vqp_opcode_t opcode;
    unsigned flags;
    uint64_t local_addr;
    uint64_t length;
    uint64_t remote_addr;
    uint32_t lkey[VQP_MAX_DEVS];
    uint32_t rkey[VQP_MAX_DEVS];
    uint32_t imm;         /* WRITE_IMM / SEND_IMM, host order */
    uint64_t compare_add; /* ATOMIC_CS: compare; other atomics: operand */
    uint64_t swap;        /* ATOMIC_CS */
} vqp_send_wr_t;

/* A receive: length > 0 is a buffer for a SEND; length 0 is a notification
 * slot for a WRITE_IMM. */
typedef struct vqp_recv_wr {
    uint64_t wr_id;
    uint64_t addr;
    uint64_t length;
    uint32_t lkey[VQP_MAX_DEVS];
} vqp_recv_wr_t;

enum { VQP_WC_WITH_IMM = 1u << 0 };

typedef struct vqp_wc {
    uint64_t wr_id;
    ucs_status_t status;
    vqp_opcode_t opcode;
    unsigned flags;    /* VQP_WC_* */
    uint32_t imm;      /* host order, with VQP_WC_WITH_IMM */
    uint64_t byte_len; /* receives: bytes that arrived */
    vqp_t *vqp;
} vqp_wc_t;

/* Completion delivery by callback (the UCT glue's way). @a wc is valid during
 * the call only and must not be written: the core reuses it for the next
 * completion and sets only the fields that differ. The callback may post to
 * any virtual QP, its own included. */
typedef void (*vqp_comp_cb_t)(void *arg, const vqp_wc_t *wc);

/* ------------------------------------------------------------ virtual CQ */

typedef struct vqp_cq_params {
    vqp_dev_t *devs[VQP_MAX_DEVS]; /* one physical CQ on each */
    unsigned num_devs;
    uint32_t cqe;      /* entries per physical CQ */
    unsigned max_poll; /* CQEs handled per device per poll call */
    /* Entries kept for the signaled NOPs that make unsignaled WQEs complete:
     * one per QP, at most this many per device (>= 1; more covers wait for
     * the CQEs of those in flight). */
    uint32_t max_covers;
} vqp_cq_params_t;

#define VQP_CQ_MAX_COVERS_DEFAULT 64

void vqp_cq_params_default(vqp_cq_params_t *params);
ucs_status_t vqp_cq_create(const vqp_cq_params_t *params, vqp_cq_t **cq_p);
/* UCS_ERR_BUSY while virtual QPs still use it. */
ucs_status_t vqp_cq_destroy(vqp_cq_t *cq);

/* CQ entries neither reserved (receive queues, QPs) nor held by WQEs in
 * flight, on the device that has the fewest. */
uint32_t vqp_cq_room(const vqp_cq_t *cq);

/* Runs the devices and handles at most max_poll CQEs per device, delivering
 * completions of callback-mode QPs. Returns the number of CQEs handled. */
unsigned vqp_cq_progress(vqp_cq_t *cq);

/* vqp_cq_progress(), then returns up to @a max completions of QPs without a
 * callback, in posting order per QP and direction. Completions that do not
 * fit stay queued for the next call. */
unsigned vqp_cq_poll(vqp_cq_t *cq, vqp_wc_t *wcs, unsigned max);

/* Arms every physical CQ for an event at its next CQE (vqp_dev_cq_arm with
 * the data path's consumer index). Call after vqp_dev_event_arm of the
 * devices. UCS_ERR_BUSY: a CQE is already there or poll-mode completions
 * wait: progress (or poll) first, sleeping would miss them. Other errors:
 * the device cannot arm (no events). */
ucs_status_t vqp_cq_arm(vqp_cq_t *cq);

/* An fd of this virtual CQ's own (created on the first call, closed by
 * vqp_cq_destroy), readable when one of its devices' event fds is: an epoll
 * set over them. Users that register fds by number (UCX's async and worker
 * event sets) get a distinct fd per CQ although the devices are shared. */
ucs_status_t vqp_cq_event_fd(vqp_cq_t *cq, int *fd_p);

/* ------------------------------------------------------------ virtual QP */

typedef struct vqp_params {
    vqp_cq_t *cq;
    unsigned num_qps; /* data QPs, >= 1 */
    vqp_lb_t lb;
    uint64_t frag_size;        /* bytes per fragment */
    uint64_t stripe_threshold; /* smaller RDMA ops use one QP */
    unsigned max_outstanding;  /* fragments in flight per QP */
    unsigned max_ops;          /* operations in flight (send side) */
    /* Posted receives (each kind). 0: the virtual QP receives no
     * notifications (its data QPs post no receives, and the peer's
     * WRITE_IMMs fail with UCS_ERR_UNSUPPORTED) and, without an SRQ, no
     * SENDs. */
    unsigned max_recvs;
    uint32_t max_inline;
    vqp_comp_cb_t comp_cb; /* NULL: completions via vqp_cq_poll */
    void *comp_arg;
    /* Called once with comp_arg and the QP's error when the virtual QP
     * becomes unusable for SENDs and atomics (its send QP died; or no data
     * QP is left): from a CQ poll, after the reports of that poll, never
     * within a post and not after vqp_cancel. The operations that failed
     * with it are reported too, but there may be none (the WQE that failed
     * was a NOP, or nothing was in flight). NULL: not called. */
    void (*fail_cb)(void *arg, ucs_status_t status);
    /* Receive buffers for SENDs come from this shared receive queue instead
     * of the virtual QP's own (vqp_post_recv then takes notification slots
     * only). Needs comp_cb, and the SRQ must be on the first device of cq. */
    vqp_srq_t *srq;
    vqp_dev_connect_params_t connect; /* timeouts, retries, access */
    /* Level of the line logged when a physical QP fails (default WARN;
     * UCT's interfaces pass their failure level, DIAG unless configured,
     * since the error reaches the user's handler). */
    ucs_log_level_t fail_log_level;
} vqp_params_t;

void vqp_params_default(vqp_params_t *params);
ucs_status_t vqp_create(const vqp_params_t *params, vqp_t **vqp_p);

/* Operations still in flight complete with UCS_ERR_CANCELED (each once) before
 * the QPs are destroyed. */
void vqp_destroy(vqp_t *vqp);

/* What the peer needs to connect: all QP addresses and the parameters both
 * sides must agree on. */
size_t vqp_address_size(const vqp_t *vqp);
ucs_status_t vqp_address_pack(const vqp_t *vqp, void *buf, size_t max,
                              size_t *len_p);
/* The i-th QP connects to the peer's i-th QP. The peer must have the same QP
 * count and load-balancing scheme (UCS_ERR_INVALID_PARAM otherwise). */
ucs_status_t vqp_connect(vqp_t *vqp, const void *addr, size_t len);

/* UCS_OK: accepted (completion later if VQP_SEND_SIGNALED);
 * UCS_ERR_NO_RESOURCE: not started, try again after completions;
 * other errors: invalid request, nothing started.
 * An operation with VQP_SEND_INLINE is posted within the call (its buffer is
 * free on return) or refused with UCS_ERR_NO_RESOURCE; others may wait inside
 * the virtual QP for room, so their buffers stay in use until completion. */
ucs_status_t vqp_post_send(vqp_t *vqp, const vqp_send_wr_t *wr);
ucs_status_t vqp_post_recv(vqp_t *vqp, const vqp_recv_wr_t *wr);

/* Operations vqp_post_send can accept right now (0: UCS_ERR_NO_RESOURCE). */
unsigned vqp_send_avail(const vqp_t *vqp);

/* The same for an operation with VQP_SEND_INLINE and @a flags (its
 * VQP_SEND_FENCE counts): inline data must go into a WQE within the call, so
 * it also needs room on the send QP with nothing waiting ahead of it. Once
 * the send QP died such a post fails with its error: not counted as a lack
 * of room. */
unsigned vqp_send_avail_inline(const vqp_t *vqp, unsigned flags);

/* Operations posted and not reported yet (0: nothing to flush). */
unsigned vqp_ops_in_flight(const vqp_t *vqp);

/* Makes what is in flight complete without a new operation: a signaled NOP
 * behind every QP's newest WQE that is unsignaled (those only complete
 * behind a signaled one). For a caller that waits for room or for nothing
 * in flight (a fenced inline post) without posting; a post refused for
 * either does it too. */
void vqp_cover_in_flight(vqp_t *vqp);

/* Move every physical QP to ERROR: operations in flight complete with
 * UCS_ERR_CANCELED, later posts fail. For flush(CANCEL). */
void vqp_cancel(vqp_t *vqp);

/* The packed address size of a virtual QP created with @a params. */
size_t vqp_address_size_for(const vqp_params_t *params);

/* ------------------------------------------------------ shared receives */

/* A shared receive queue of @a max_wr buffers on the first device of @a cq,
 * for the send QPs of virtual QPs created with it (vqp_params_t.srq): SENDs
 * to any of them take the next buffer. Completions arrive through the
 * receiving virtual QP's callback (wc->vqp says which), as VQP_OP_RECV; with
 * one data QP a WRITE_IMM also takes a buffer and completes as
 * VQP_OP_RECV_NOTIFY carrying it (byte_len 0). Its CQ entries are reserved
 * at creation (UCS_ERR_EXCEEDS_LIMIT if the CQ cannot take them). */
ucs_status_t vqp_srq_create(vqp_cq_t *cq, uint32_t max_wr, vqp_srq_t **srq_p);

/* UCS_ERR_BUSY (nothing destroyed) while virtual QPs use it. Buffers still
 * posted are handed to @a release (may be NULL) with their wr_id. */
ucs_status_t vqp_srq_destroy(vqp_srq_t *srq,
                             void (*release)(void *arg, uint64_t wr_id),
                             void *arg);

/* A buffer (length > 0); UCS_ERR_NO_RESOURCE when the SRQ is full. */
ucs_status_t vqp_srq_post_recv(vqp_srq_t *srq, const vqp_recv_wr_t *wr);

/* Buffers posted and not consumed. */
unsigned vqp_srq_posted(const vqp_srq_t *srq);

typedef struct vqp_stats {
    uint64_t ops_posted;
    uint64_t frags_posted;
    uint64_t frags_replayed;
    uint64_t ops_completed;
    uint64_t notifies_received;
    uint64_t dqplb_duplicates;
    /* Times a post waited for CQ room taken by WQEs of other QPs on the
     * same virtual CQ. */
    uint64_t credit_waits;
    /* Times a cover NOP found no CQ entry left (max_covers of them in
     * flight) and waited for their CQEs. */
    uint64_t cover_waits;
    unsigned qps_alive;
} vqp_stats_t;

void vqp_query_stats(const vqp_t *vqp, vqp_stats_t *stats);

#endif
