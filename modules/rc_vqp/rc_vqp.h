/*
 * rc_vqp UCT glue: the structures shared by the memory domain, interface and
 * endpoint files. A thin mapping of uct.h onto the multi-QP core (vqp.h): an
 * interface owns one virtual CQ on its device, an endpoint owns one virtual
 * QP, and every UCT operation becomes one core operation (a put or get of
 * several iov entries one per entry).
 */
#ifndef UCT_RC_VQP_H_
#define UCT_RC_VQP_H_

#include "rc_vqp_cm.h"
#include "rc_vqp_iface.h"
#include "rc_vqp_md.h"

#include <core/vqp.h>
#include <ucs/datastruct/arbiter.h>
#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpool.h>
#include <uct/base/uct_iface.h>

/* Immediate data of a SEND: the AM id, credits returned to the peer (flow
 * control piggy-backed on every message), a flag for a message that carries
 * credits only, and one for an AM that spent the sender's last credit: the
 * receiver then returns what it owes at once (its own threshold is of its
 * own window, and the sender's may be smaller: configured differently,
 * that sender would wait for good). */
#define UCT_RC_VQP_AM_ID_MASK     (UCT_AM_ID_MAX - 1)
#define UCT_RC_VQP_IMM_GRANT      0x80u
#define UCT_RC_VQP_IMM_LAST       0x40u
#define UCT_RC_VQP_IMM_CRED_SHIFT 8
#define UCT_RC_VQP_IMM_CRED_MAX   0xffffu

/* Credits of the window kept for credit-only messages: those are sent
 * without a credit, so that returning credits can never wait for one. */
#define UCT_RC_VQP_FC_RESERVE 4

/* Operations whose wr_id is a descriptor (bcopy, get_bcopy) are tagged with
 * this bit; otherwise the wr_id is the user's uct_completion_t (or 0). */
#define UCT_RC_VQP_WR_DESC 1ul

typedef struct uct_rc_vqp_memh {
    vqp_dev_mr_t *mr;
    uint32_t lkey;
    uint32_t rkey;
    uintptr_t address; /* the registered range, which am_zcopy checks */
    size_t length;
    /* Uncached registrations only: the memory domain's record of the
     * range, and the registration's number (memory invalidation). */
    uct_rc_vqp_md_range_t *range;
    uint64_t seq;
} uct_rc_vqp_memh_t;

typedef struct uct_rc_vqp_rkey_buf {
    uint32_t rkey;
} UCS_S_PACKED uct_rc_vqp_rkey_buf_t;

/* Chunk header of the registered memory pools. */
typedef struct uct_rc_vqp_chunk {
    vqp_dev_mr_t *mr;
    uint32_t lkey;
} uct_rc_vqp_chunk_t;

/* Send-side bounce buffer: bcopy data, get_bcopy landing zone. */
typedef struct uct_rc_vqp_tx_desc {
    uct_completion_t *comp;
    uct_unpack_callback_t unpack_cb;
    void *unpack_arg;
    size_t length;
    uint32_t lkey;
} uct_rc_vqp_tx_desc_t;

/* Receive buffer: the release pointer sits right before the user's
 * headroom, where uct_iface_release_desc() looks for it. Packed: where the
 * user's AM alignment and offset put the payload, the header before it may
 * be at any address. */
typedef struct uct_rc_vqp_rx_desc {
    uint32_t lkey;
    uint32_t reserved;
    uct_recv_desc_t *release;
} UCS_S_PACKED uct_rc_vqp_rx_desc_t;

/* and, or, xor: extended atomics (masked compare-and-swap / fetch-and-add) */
#define UCT_RC_VQP_ATOMIC_BITWISE                             \
    (UCS_BIT(UCT_ATOMIC_OP_AND) | UCS_BIT(UCT_ATOMIC_OP_OR) | \
     UCS_BIT(UCT_ATOMIC_OP_XOR))

/* iov entries of am_zcopy and am_short_iov: both gather them into one
 * buffer (one contiguous message for the receiver), so any count costs the
 * same; rc_mlx5 offers a handful. */
#define UCT_RC_VQP_AM_MAX_IOV 8

/* iov entries of put_zcopy and get_zcopy: each non-empty entry is a core
 * operation of its own (remote addresses follow one another), so the
 * endpoint needs that many free operation slots; at most TX_QUEUE_LEN. */
#define UCT_RC_VQP_RMA_MAX_IOV 8

/* The completion of a put_zcopy / get_zcopy of several iov entries: it
 * counts their operations and calls the user's completion once, with the
 * first error any of them had. */
typedef struct uct_rc_vqp_iov_comp {
    uct_completion_t super;
    uct_completion_t *user;
} uct_rc_vqp_iov_comp_t;

/* Bytes after a bounce buffer's max_bcopy: a pack callback that returns a
 * little more than max_bcopy (refused) wrote nothing of another buffer. */
#define UCT_RC_VQP_BCOPY_SLACK 64

/* The largest header of am_zcopy (uct_iface_attr_t.cap.am.max_hdr). */
#define UCT_RC_VQP_AM_MAX_HDR(_seg_size) ucs_min((_seg_size) / 2, 128ul)

typedef struct uct_rc_vqp_iface {
    uct_base_iface_t super;
    vqp_dev_t *dev;
    vqp_cq_t *cq;
    vqp_params_t vqp_params; /* template for endpoints */
    ucs_arbiter_t arbiter;
    ucs_list_link_t eps;
    /* Endpoints with pending requests: resources come back silently when
     * unsignaled operations complete, so progress looks at these. */
    ucs_list_link_t pending_eps;
    /* Endpoints owing their peer a credit grant that could not be posted
     * (no room then): progress posts it, since the peer, out of credits,
     * may send nothing that would give another chance. */
    ucs_list_link_t grant_eps;
    ucs_mpool_t tx_mp;
    ucs_mpool_t rx_mp;
    ucs_mpool_t iov_comp_mp; /* uct_rc_vqp_iov_comp_t */
    unsigned rma_max_iov;    /* cap.put.max_iov and cap.get.max_iov */
    uint64_t rma_max_zcopy;  /* cap.put.max_zcopy and cap.get.max_zcopy */
    uct_recv_desc_t release_desc;
    size_t seg_size;
    size_t rx_headroom;
    unsigned fc_wnd;          /* AM credits of a new endpoint */
    unsigned fc_grant_thresh; /* credits owed that make a grant due */
    /* Endpoints whose flush(CANCEL) completion waits for the operations
     * still in flight (checked from progress: the last of them may end
     * without a completion of its own). */
    unsigned cancel_waiting;
    vqp_srq_t *srq; /* AM receive buffers of all endpoints */
    /* Buffers the SRQ lacks because none was free (RX_MAX_BUFS reached:
     * AM handlers keep the others): progress posts them once handlers
     * release theirs. */
    unsigned rx_missing;
    int rx_limited; /* RX_MAX_BUFS is set: running out is no error */
    size_t ep_addr_len;
    uint64_t scratch;          /* result of atomics without fetch */
    uint32_t ext_atomic_sizes; /* vqp_dev_attr_t.ext_atomic_sizes */
    uct_rc_vqp_cm_t cm;        /* connections to interface addresses */
} uct_rc_vqp_iface_t;

enum {
    UCT_RC_VQP_EP_CONNECTED = 1u << 0,
    UCT_RC_VQP_EP_FAILED    = 1u << 1, /* error handler called */
    UCT_RC_VQP_EP_FENCE     = 1u << 2, /* next operation is fenced */
    UCT_RC_VQP_EP_PENDING   = 1u << 3, /* on the iface's pending_eps list */
    /* Created from an interface address, waiting for the peer's answer:
     * operations get UCS_ERR_NO_RESOURCE and wait in the pending queue. */
    UCT_RC_VQP_EP_NOT_READY = 1u << 4,
    /* Created by the connection manager for a peer's request: never shown
     * to the user, destroyed when the peer disconnects or fails. */
    UCT_RC_VQP_EP_PASSIVE = 1u << 5,
    /* A request of its pending queue is being dispatched: a flush from it
     * does not wait for the queue (the request itself is its head). */
    UCT_RC_VQP_EP_DISPATCH = 1u << 6,
    UCT_RC_VQP_EP_GRANT    = 1u << 7, /* on the iface's grant_eps list */
    /* Passive, and the active side has not said it connected yet (RTU
     * datagram or a first message): the keepalive leaves it unprobed. */
    UCT_RC_VQP_EP_UNCONFIRMED = 1u << 8,
    /* The peer spent its last credit: the grant goes whatever is owed. */
    UCT_RC_VQP_EP_GRANT_NOW = 1u << 9
};

typedef struct uct_rc_vqp_ep {
    uct_base_ep_t super;
    int fc_credits;        /* AMs the peer has receive buffers for */
    unsigned fc_to_return; /* AMs received, not yet credited back */
    vqp_t *vqp;
    ucs_arbiter_group_t arb_group;
    ucs_list_link_t list;
    ucs_list_link_t pending_list;
    ucs_list_link_t grant_list;
    uct_completion_t *cancel_comp; /* flush(CANCEL) waiting for the rest */
    unsigned flags;
    uct_rc_vqp_cm_conn_t *conn; /* connection manager's state, or NULL */
} uct_rc_vqp_ep_t;

UCS_CLASS_DECLARE(uct_rc_vqp_ep_t, const uct_ep_params_t *);
UCS_CLASS_DECLARE_NEW_FUNC(uct_rc_vqp_ep_t, uct_ep_t, const uct_ep_params_t *);
UCS_CLASS_DECLARE_DELETE_FUNC(uct_rc_vqp_ep_t, uct_ep_t);

/* Posts the credit grants that found no room when they were due. */
void uct_rc_vqp_iface_grant_progress(uct_rc_vqp_iface_t *iface);

/* Completion callback of every endpoint's virtual QP. */
void uct_rc_vqp_ep_completion(void *arg, const vqp_wc_t *wc);

/* Failure callback of every endpoint's virtual QP: it can no longer send
 * (also when no operation failed with it). */
void uct_rc_vqp_ep_vqp_failed(void *arg, ucs_status_t status);

/* Connect the endpoint's virtual QP to the peer's address, post receives,
 * and let pending requests go. */
ucs_status_t uct_rc_vqp_ep_connect_vqp(uct_rc_vqp_ep_t *ep, const void *addr,
                                       size_t len);

/* The endpoint failed with @a status: report it once (passive endpoints are
 * destroyed instead). */
void uct_rc_vqp_ep_set_failed(uct_rc_vqp_ep_t *ep, ucs_status_t status);

/* Post @a desc (NULL: a new one) to the interface's shared receive queue.
 * With no free buffer (RX_MAX_BUFS), counts it in rx_missing. */
ucs_status_t uct_rc_vqp_iface_post_recv(uct_rc_vqp_iface_t *iface,
                                        uct_rc_vqp_rx_desc_t *desc);
/* Posts the buffers the SRQ lacks (rx_missing) while free ones exist. */
void uct_rc_vqp_iface_rx_refill(uct_rc_vqp_iface_t *iface);
void uct_rc_vqp_iface_release_recv(void *arg, uint64_t wr_id);

/* Operations (rc_vqp_ep.c) */
ucs_status_t uct_rc_vqp_ep_put_short(uct_ep_h tl_ep, const void *buffer,
                                     unsigned length, uint64_t remote_addr,
                                     uct_rkey_t rkey);
ssize_t uct_rc_vqp_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb,
                                void *arg, uint64_t remote_addr,
                                uct_rkey_t rkey);
ucs_status_t uct_rc_vqp_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                     size_t iovcnt, uint64_t remote_addr,
                                     uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_get_bcopy(uct_ep_h tl_ep,
                                     uct_unpack_callback_t unpack_cb, void *arg,
                                     size_t length, uint64_t remote_addr,
                                     uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                     size_t iovcnt, uint64_t remote_addr,
                                     uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t hdr,
                                    const void *buffer, unsigned length);
ucs_status_t uct_rc_vqp_ep_am_short_iov(uct_ep_h tl_ep, uint8_t id,
                                        const uct_iov_t *iov, size_t iovcnt);
ssize_t uct_rc_vqp_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id,
                               uct_pack_callback_t pack_cb, void *arg,
                               unsigned flags);
ucs_status_t uct_rc_vqp_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id,
                                    const void *header, unsigned header_length,
                                    const uct_iov_t *iov, size_t iovcnt,
                                    unsigned flags, uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_atomic64_post(uct_ep_h tl_ep, unsigned opcode,
                                         uint64_t value, uint64_t remote_addr,
                                         uct_rkey_t rkey);
ucs_status_t uct_rc_vqp_ep_atomic64_fetch(uct_ep_h tl_ep,
                                          uct_atomic_op_t opcode,
                                          uint64_t value, uint64_t *result,
                                          uint64_t remote_addr, uct_rkey_t rkey,
                                          uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_atomic_cswap64(uct_ep_h tl_ep, uint64_t compare,
                                          uint64_t swap, uint64_t remote_addr,
                                          uct_rkey_t rkey, uint64_t *result,
                                          uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_atomic32_post(uct_ep_h tl_ep, unsigned opcode,
                                         uint32_t value, uint64_t remote_addr,
                                         uct_rkey_t rkey);
ucs_status_t uct_rc_vqp_ep_atomic32_fetch(uct_ep_h tl_ep,
                                          uct_atomic_op_t opcode,
                                          uint32_t value, uint32_t *result,
                                          uint64_t remote_addr, uct_rkey_t rkey,
                                          uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_atomic_cswap32(uct_ep_h tl_ep, uint32_t compare,
                                          uint32_t swap, uint64_t remote_addr,
                                          uct_rkey_t rkey, uint32_t *result,
                                          uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_flush(uct_ep_h tl_ep, unsigned flags,
                                 uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_fence(uct_ep_h tl_ep, unsigned flags);
ucs_status_t uct_rc_vqp_ep_check(uct_ep_h tl_ep, unsigned flags,
                                 uct_completion_t *comp);
ucs_status_t uct_rc_vqp_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *req,
                                       unsigned flags);
void uct_rc_vqp_ep_pending_purge(uct_ep_h tl_ep,
                                 uct_pending_purge_callback_t cb, void *arg);
ucs_status_t uct_rc_vqp_ep_get_address(uct_ep_h tl_ep, uct_ep_addr_t *addr);
ucs_status_t uct_rc_vqp_ep_connect_to_ep(uct_ep_h tl_ep,
                                         const uct_device_addr_t *dev_addr,
                                         const uct_ep_addr_t *ep_addr);

/* Interface events (rc_vqp_event.c). */
ucs_status_t uct_rc_vqp_iface_event_fd_get(uct_iface_h tl_iface, int *fd_p);
ucs_status_t uct_rc_vqp_iface_event_arm(uct_iface_h tl_iface, unsigned events);

/* Schedule endpoints whose pending requests can go now (iface progress). */
void uct_rc_vqp_iface_schedule_pending(uct_rc_vqp_iface_t *iface);

/* Run the flush(CANCEL) completions of endpoints with nothing in flight
 * any more (iface progress, while iface->cancel_waiting). */
void uct_rc_vqp_iface_cancel_progress(uct_rc_vqp_iface_t *iface);

/* Pending dispatch from the interface's progress. */
ucs_arbiter_cb_result_t
uct_rc_vqp_ep_process_pending(ucs_arbiter_t *arbiter,
                              ucs_arbiter_group_t *group,
                              ucs_arbiter_elem_t *elem, void *arg);

#endif
