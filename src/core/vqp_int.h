/*
 * Multi-QP core internals: physical QP state, the operation ring, fragment
 * records, the DQPLB receive window and the virtual CQ's QPN table. Shared by
 * the core's .c files and its inline fast path (vqp_fast.inl).
 */
#ifndef VQP_INT_H_
#define VQP_INT_H_

#include "vqp.h"

#include <mlx5/vqp_mlx5.h>
#include <ucs/datastruct/list.h>

/* QPN -> physical QP: a two-level table indexed by the QPN's bits (24 bits:
 * 12 + 12), so routing a CQE costs two loads and no hash. Ranges without a
 * QP point to vqp_qpn_none (all NULL), so the route needs no test between
 * the two loads. */
#define VQP_QPN_LOW_BITS  12
#define VQP_QPN_HIGH_SIZE (1u << (24 - VQP_QPN_LOW_BITS))
#define VQP_QPN_LOW_SIZE  (1u << VQP_QPN_LOW_BITS)

/* DQPLB: sequence numbers are 24 bits; the final message of an operation
 * carries its sequence number with this flag in a 4-byte payload. */
#define VQP_DQPLB_SEQ_MASK 0xffffffu
#define VQP_DQPLB_LAST     0x80000000u /* FINAL payload: ends an operation */
/* Immediate flags of a zero-length WRITE_IMM that fills the sequence number
 * of a fragment that failed for good: the receiver advances past it and
 * fails the operation's notification instead of waiting forever. */
#define VQP_DQPLB_ABORT 0x40000000u
#define VQP_DQPLB_END   0x20000000u

/* Internal operation flags next to the user's VQP_SEND_* ones. */
#define VQP_OP_FENCE_ARMED                                                 \
    0x80u                        /* the NOPs that let a fenced operation's \
                                  * predecessors complete were posted */
#define VQP_OP_STRIPED     0x40u /* cut into fragments over the data QPs */
#define VQP_OP_TAIL_POSTED 0x20u /* notify / final / NOPs posted */
/* An atomic (its result to copy out at the report): set at post, so the
 * report tests the flags it loads anyway instead of the opcode. */
#define VQP_OP_ATOMIC 0x10u

/* vqp->fast_ops: where the bits of operations that may go whole start. */
#define VQP_FAST_WHOLE 16

typedef enum vqp_frag_kind {
    VQP_FRAG_DATA,   /* one fragment of a striped WRITE / WRITE_IMM / READ */
    VQP_FRAG_WHOLE,  /* a whole unstriped operation on one QP */
    VQP_FRAG_NOTIFY, /* SPRAY: zero-length WRITE_IMM on the notify QP */
    VQP_FRAG_FINAL,  /* DQPLB: SEND_IMM closing an operation */
    VQP_FRAG_NOP,    /* FLUSH: signaled NOP covering the QP's earlier WQEs */
    VQP_FRAG_PROBE   /* PROBE: a zero-length WRITE on one QP */
} vqp_frag_kind_t;

enum {
    VQP_WIN_EMPTY   = 0,
    VQP_WIN_ARRIVED = 1 << 0,
    VQP_WIN_END     = 1 << 1, /* last number of an operation */
    VQP_WIN_ABORT   = 1 << 2
};

typedef enum vqp_qp_role {
    VQP_ROLE_DATA,   /* carries striped fragments */
    VQP_ROLE_NOTIFY, /* SPRAY notify QP */
    VQP_ROLE_SEND    /* DQPLB: SEND / atomics / small ops and user receives */
} vqp_qp_role_t;

/* A posted WQE the core waits for: 16 bytes, written once per WQE. Where a
 * fragment starts, how long it is and its DQPLB sequence number follow from
 * its operation and its index there (vqp_op.c: vqp_frag_offset, _len, _seq),
 * so they are not stored. */
typedef struct vqp_frag {
    /* Its operation's byte offset in vqp->ops (ring index x record size),
     * so a completion reaches the record with one add; VQP_FRAG_NO_OP_OFF:
     * no operation. */
    uint32_t op_off;
    uint32_t idx; /* DATA: fragment index; FINAL: the operation's nfrags */
    uint16_t wqe; /* index of the WQE's first BB */
    /* The SQ's producer index after it: its consumer index once the WQE
     * completed (no read of the WQE's size back from the SQ). */
    uint16_t wqe_next;
    uint8_t kind;  /* vqp_frag_kind_t */
    uint8_t flags; /* VQP_FRAG_F_*: 0 in the common case, one test */
    uint16_t reserved;
} vqp_frag_t;

#define VQP_FRAG_NO_OP_OFF UINT32_MAX

enum {
    VQP_FRAG_F_SEQ   = 1 << 0, /* carries a DQPLB sequence number */
    VQP_FRAG_F_NO_OP = 1 << 1  /* cover NOP or hole filler: no operation */
};

/* Three cache lines, aligned: a post touches the send queue's line (tx) and
 * the next one (fragment ring, round robin, device and CQ share), a
 * completion the same two; the third is cold. Three, not four: in an array
 * of QPs a stride of 4 lines would put every QP's hot lines into a quarter
 * of the L1's sets, where with a hundred QPs they evict each other. */
/* vqp_t.slow_work bits */
#define VQP_SLOW_COVERS 1
#define VQP_SLOW_FAILED 2

typedef struct vqp_pqp {
    vqp_mlx5_txwq_t tx;
    /* Ring of posted WQEs in posting order; entry n at byte
     * (n & frag_mask) << frag_shift of frags (vqp_pqp_frag). */
    vqp_frag_t *frags;
    uint32_t frag_head;
    uint32_t frag_tail;
    uint32_t frag_mask;
    /* log2 of the bytes between entries: one record, or a row of
     * vqp->data_frags */
    uint32_t frag_shift;
    /* Entries a post may fill: the ring's size while alive, 0 once dead, so
     * one comparison tells both. */
    uint32_t frag_limit;
    uint32_t qpn;
    struct vqp_pqp *rr_next; /* the data QP after it in round-robin order */
    uint8_t alive;
    uint8_t role;       /* vqp_qp_role_t */
    ucs_status_t error; /* why it died */
    uint8_t dev;        /* index into the virtual CQ's devices */
    uint32_t slot_base; /* its receive slots in vqp->slots */
    vqp_t *vqp;
    struct vqp_cq_dev *cdev; /* its device's share of the virtual CQ */
    /* Cold: receives, device objects. */
    vqp_mlx5_rxwq_t rx;
    uint32_t rx_cap;    /* receives the core keeps posted (0: none) */
    uint32_t cqe_need;  /* receive CQEs reserved in its device's CQ */
    uint64_t *rx_wr_id; /* user receives: wr_id per RQ slot */
    vqp_srq_t *srq;     /* the send QP's receives come from it, or NULL */
    vqp_dev_qp_t *dev_qp;
} UCS_V_ALIGNED(64) vqp_pqp_t;

_Static_assert(sizeof(vqp_pqp_t) == 3 * 64, "vqp_pqp_t: three cache lines");

/* An operation: one cache line, written once by the post and read by its
 * fragments' completions and the report. What only some operations need is
 * in vqp_op_ext_t. The lean path (whole WRITE / WRITE_IMM / READ on the
 * send QP, device 0) writes only what reports and completions read
 * (wr_id, length, the counters, status, opcode, flags), not the request's
 * addresses, keys and immediate: its WQE holds them until its CQE, and a
 * failure that replays it reads them back from there first
 * (vqp_op_from_wqe). */
typedef struct vqp_op {
    uint64_t wr_id;
    uint64_t laddr;
    uint64_t length;
    uint64_t raddr;
    uint32_t remaining; /* WQEs still to complete (posted or not) */
    uint32_t nfrags;    /* data fragments in all */
    uint32_t posted;    /* data fragments posted */
    uint32_t first_seq; /* DQPLB */
    uint32_t lkey;      /* the first device's; the others' in vqp_op_ext_t */
    uint32_t rkey;
    uint32_t imm;
    union {
        struct {
            ucs_status_t status; /* first error */
            uint8_t flags;       /* VQP_SEND_* and VQP_OP_* */
        };
        /* Both in one load: the report tests them at once (VQP_OP_SF). */
        uint16_t status_flags;
    };
    uint8_t opcode; /* vqp_opcode_t */
} UCS_V_ALIGNED(64) vqp_op_t;

_Static_assert(sizeof(ucs_status_t) == 1, "vqp_op_t: status is one byte");

/* The bits of vqp_op_t.status_flags: @a _status (a mask of the status
 * byte) and @a _flags (of the flags byte). */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define VQP_OP_SF(_status, _flags) ((uint16_t)((_status) | ((_flags) << 8)))
#define VQP_OP_SF_STATUS(_sf)      ((ucs_status_t)(_sf))
#else
#define VQP_OP_SF(_status, _flags) ((uint16_t)(((_status) << 8) | (_flags)))
#define VQP_OP_SF_STATUS(_sf)      ((ucs_status_t)((_sf) >> 8))
#endif

/* The rest of an operation, same index: atomics' operands, and the keys of
 * devices after the first. */
typedef struct vqp_op_ext {
    uint64_t compare_add;
    uint64_t swap;
    uint32_t lkey[VQP_MAX_DEVS - 1];
    uint32_t rkey[VQP_MAX_DEVS - 1];
} vqp_op_ext_t;

/* A bounded ring of 32-bit counters' worth of entries. */
#define VQP_RING_COUNT(_head, _tail) ((uint32_t)((_tail) - (_head)))

struct vqp {
    /* What every post and completion reads or writes comes first: about
     * three cache lines per virtual QP. */
    vqp_cq_t *cq;
    /* Operations: [head, disp) dispatched, [disp, tail) waiting;
     * notify: SPRAY cursor of the next notify to post, in order. */
    vqp_op_t *ops;
    vqp_op_ext_t *op_ext;
    uint32_t op_mask;
    uint32_t op_head;
    uint32_t op_disp;
    uint32_t op_notify;
    uint32_t op_tail;
    /* Bit per opcode vqp_post_send's fast path takes: WRITE and READ, and
     * WRITE_IMM unless SPRAY or the peer takes no notifications; none until
     * connected or once fatal is set. The same bits VQP_FAST_WHOLE higher:
     * those that go whole to the send QP when shorter than whole_max (not
     * multi-QP WRITE_IMM, which always stripes; none over several devices,
     * whose other keys the lean path does not record). None while replays
     * wait either (vqp_frag_done, vqp_dispatch): new operations go behind
     * them, and the fast path need not test the replay ring. */
    uint32_t fast_ops;
    /* Completions waiting in the CQ's wc ring still count against max_ops /
     * max_recvs, so the ring cannot overflow when the user posts without
     * polling. */
    unsigned max_ops;
    unsigned max_recvs;
    unsigned wc_pending_ops;
    unsigned wc_pending_recvs;
    vqp_pqp_t *rr_qp;     /* round robin: the data QP to try first */
    vqp_pqp_t *send_qp;   /* SEND, atomics, unstriped ops, user recvs */
    vqp_pqp_t *notify_qp; /* SPRAY only */
    uint64_t frag_size;
    unsigned frag_shift; /* log2(frag_size) */
    unsigned num_qps;    /* data QPs */
    uint64_t stripe_threshold;
    /* Whole operations the lean path posts are shorter: below the stripe
     * threshold (if striping) and the largest WQE, so their post cannot
     * fail. */
    uint64_t whole_max;
    /* Fragments of failed QPs waiting for a surviving QP. */
    vqp_frag_t *replay;
    uint32_t replay_mask;
    uint32_t replay_head;
    uint32_t replay_tail;
    vqp_comp_cb_t comp_cb;
    void *comp_arg;
    int dirty; /* on the CQ's list of QPs to advance */
    /* Rare work for the next advance: VQP_SLOW_COVERS (a dead QP's cover
     * NOP could not be posted yet: vqp_post_owed_covers), VQP_SLOW_FAILED
     * (fail_cb is due, with fail_status). */
    int slow_work;
    vqp_stats_t stats;

    vqp_pqp_t *qps; /* data QPs, then the extra QP if any */
    /* The fragment rings of the data QPs other than the send QP,
     * interleaved: round robin keeps their counters close, so one
     * operation's records share cache lines and pages instead of one line
     * (and one page) per QP, each a ring's length apart, where they would
     * also contend for the same cache sets. Rows are a power of two of
     * records, so an entry's place is a shift. NULL when fewer than two. */
    vqp_frag_t *data_frags;
    uint32_t data_frag_mask;
    uint32_t data_frag_shift; /* log2 of a row's bytes */
    unsigned num_pqps;        /* all physical QPs */
    unsigned alive;           /* data QPs alive */
    vqp_lb_t lb;
    ucs_status_t fatal; /* set when no data QP survives */

    /* DQPLB sender: next sequence number, and which of the last
     * send_window numbers completed; a fragment is posted only while its
     * number is within the window of the oldest one not yet completed, so
     * the receiver's window (twice as large) cannot overflow. */
    uint32_t send_seq;
    uint32_t send_floor;
    uint32_t send_window;
    uint8_t *send_acked;

    /* Receiver: DQPLB reorder window (power of two). */
    uint8_t *win_state; /* VQP_WIN_* per sequence number */
    uint32_t *win_imm;
    uint32_t win_mask;
    uint32_t win_next;
    uint8_t win_aborted; /* the operation being assembled failed */

    /* Receiver: notifications that arrived vs. user notification slots. */
    uint32_t *arrived_imm;
    uint8_t *arrived_failed;
    uint32_t arrived_mask;
    uint32_t arrived_head;
    uint32_t arrived_tail;
    uint64_t *nrecv_wr_id;
    uint32_t nrecv_mask;
    uint32_t nrecv_head;
    uint32_t nrecv_tail;

    /* 4-byte receive slots of the QPs the core receives on itself. */
    uint32_t *slots;
    size_t slots_len;
    vqp_dev_mr_t *slot_mr[VQP_MAX_DEVS];
    uint32_t slot_lkey[VQP_MAX_DEVS];

    /* One 8-byte result slot per operation ring entry for atomics. */
    uint64_t *atomic_res;
    uint32_t atomic_be; /* sizes the send QP's device returns big-endian */
    vqp_dev_mr_t *atomic_mr[VQP_MAX_DEVS];
    uint32_t atomic_lkey[VQP_MAX_DEVS];

    unsigned wc_reserve; /* entries reserved in the CQ's wc ring */
    vqp_dev_connect_params_t connect;
    ucs_log_level_t fail_log_level;
    /* fast_ops once connected, while no replay waits */
    uint32_t fast_ops_up;
    int connected;
    int canceling; /* vqp_cancel(): QP failures are expected */
    void (*fail_cb)(void *arg, ucs_status_t status);
    ucs_status_t fail_status; /* for fail_cb; UCS_OK once called */
    int rx_starved;           /* a core RQ stopped short (arrived ring full) */
    int credit_wait; /* on the CQ's list of QPs waiting for CQ credits */
    int peer_no_imm; /* the peer posts no receives for WRITE_IMM */
    ucs_list_link_t cq_list;     /* the CQ's virtual QPs */
    ucs_list_link_t credit_list; /* waiting for CQ credits */
};

struct vqp_srq {
    vqp_cq_t *cq;
    vqp_dev_srq_t *dev_srq;
    vqp_mlx5_srq_t mlx;
    uint64_t *wr_id;     /* per SRQ WQE */
    vqp_mlx5_sge_t *sge; /* per SRQ WQE: its buffer, to post it again */
    uint8_t *busy;       /* per SRQ WQE: posted, not consumed */
    uint32_t max_wr;     /* WQEs reserved in the CQ */
    unsigned posted;
    unsigned users; /* virtual QPs created with it */
};

extern vqp_pqp_t *const vqp_qpn_none[VQP_QPN_LOW_SIZE];

/* Entry @a n (a ring counter) of @a pqp's fragment ring. */
static UCS_F_ALWAYS_INLINE vqp_frag_t *vqp_pqp_frag(const vqp_pqp_t *pqp,
                                                    uint32_t n)
{
    return (vqp_frag_t *)((char *)pqp->frags +
                          ((size_t)(n & pqp->frag_mask) << pqp->frag_shift));
}

typedef struct vqp_cq_dev {
    vqp_dev_t *dev;
    vqp_dev_cq_t *dev_cq;
    vqp_mlx5_cq_t cq;
    /* vqp_qpn_none where no QP is registered; never written through it. */
    vqp_pqp_t *const *qpn_table[VQP_QPN_HIGH_SIZE];
    /* A ConnectX treats a CQ overflow as fatal, so every CQE that can
     * arrive has a CQ entry before it can be produced:
     *  - receives can complete at any time: reserved while posted
     *    (cqe_reserved; QPs, SRQs);
     *  - every tracked WQE, signaled or not (a QP in ERROR flushes each):
     *    one credit from posting until its CQE, or the CQE covering it, was
     *    polled. Posts wait while credits <= 0;
     *  - one entry per registered QP, up to the CQ's max_covers
     *    (cover_reserve), that only signaled NOPs covering unsignaled WQEs
     *    may use, so WQEs that hold credits can always be made to complete:
     *    covers in flight give their entries back at their CQEs, and a
     *    cover that found none waits for that (vqp_cover_short). Not one
     *    per QP: the CQ would bound the endpoints, not the WQEs in flight.
     * credits = entries - cqe_reserved - cover_reserve - WQEs tracked - CQEs
     * of destroyed QPs not polled yet; it goes below 0 by covers only. */
    int32_t credits;
    uint32_t cqe_reserved;
    uint32_t cover_reserve;
    uint32_t cover_qps; /* QPs registered; cover_reserve is at most this */
    /* The next doorbell's half of the BlueFlame register its QPs ring (on
     * a ConnectX, the QPs of a CQ share its thread domain's register). */
    uint32_t bf_toggle;
} vqp_cq_dev_t;

struct vqp_cq {
    vqp_cq_dev_t devs[VQP_MAX_DEVS];
    unsigned num_devs;
    unsigned max_poll;
    uint32_t max_covers; /* cover entries reserved per device, at most */
    unsigned num_vqps;
    /* Completions for QPs without a callback, until vqp_cq_poll takes them.
     * Sized for every operation and receive its QPs can have in flight, so
     * it never overflows. */
    vqp_wc_t *wcs;
    uint32_t wc_mask;
    uint32_t wc_head;
    uint32_t wc_tail;
    unsigned wc_reserved;
    unsigned wc_stale; /* entries of destroyed QPs (wc->vqp == NULL) */
    /* Inside vqp_cq_poll with the ring empty: completions go straight to
     * the caller's array (one copy) while it has room, the rest to the
     * ring. out_left is 0 everywhere else. */
    vqp_wc_t *out;
    unsigned out_left;
    /* Virtual QPs that got CQEs in the current poll batch: dispatch and
     * reporting run once per QP per batch, not once per CQE. */
    vqp_t **dirty;
    unsigned num_dirty;
    ucs_list_link_t vqps;           /* every virtual QP on this CQ */
    ucs_list_link_t credit_waiters; /* refused for lack of CQ credits */
    int cover_pending; /* a waiter came: cover unsignaled WQEs of all QPs */
};

/* vqp_cq.c */
ucs_status_t vqp_cq_register(vqp_cq_t *cq, vqp_pqp_t *pqp);
/* @a pqp's device QP is destroyed: CQEs of it still in the CQ are
 * neutralised (QPN 0, dropped by the poll), so a QP that reuses the QPN
 * never gets them; receives of an SRQ are taken back first. */
void vqp_cq_retire(vqp_cq_t *cq, vqp_pqp_t *pqp);
void vqp_cq_unregister(vqp_cq_t *cq, vqp_pqp_t *pqp);
ucs_status_t vqp_cq_reserve_wcs(vqp_cq_t *cq, int delta);
/* Reserve CQ entries of @a cdev for @a recvs receives and @a covers QPs'
 * cover NOPs (for @a what, in the error message), or give them back. */
ucs_status_t vqp_cq_dev_reserve(vqp_cq_dev_t *cdev, uint32_t recvs,
                                uint32_t covers, const char *what);
void vqp_cq_dev_release(vqp_cq_dev_t *cdev, uint32_t recvs, uint32_t covers);

/* vqp_op.c */
/* Handle at most max_poll CQEs of @a cdev, then advance the virtual QPs that
 * got any. Returns the number of CQEs. */
unsigned vqp_cq_poll_dev(vqp_cq_t *cq, vqp_cq_dev_t *cdev);
void vqp_advance(vqp_t *vqp);
void vqp_fail_all(vqp_t *vqp, ucs_status_t status);
/* Waiters for CQ credits: cover what holds credits, advance the waiters. */
void vqp_cq_credit_progress(vqp_cq_t *cq, unsigned polled);

/* vqp_srq.c: a receive CQE of a send QP attached to an SRQ. */
void vqp_srq_recv_cqe(vqp_pqp_t *pqp, struct mlx5_cqe64 *cqe,
                      ucs_status_t status);
/* A receive CQE of a destroyed send QP on @a srq, not polled yet: its SRQ
 * entry would be stranded (no QP to route it to): post the buffer again.
 * Returns 1 if it did. */
int vqp_srq_reclaim(vqp_srq_t *srq, const struct mlx5_cqe64 *cqe);

/* vqp_recv.c */
void vqp_recv_cqe(vqp_pqp_t *pqp, struct mlx5_cqe64 *cqe, ucs_status_t status);
ucs_status_t vqp_recv_fill(vqp_pqp_t *pqp);
void vqp_recv_cancel_notifies(vqp_t *vqp, ucs_status_t status);
void vqp_recv_cancel_all(vqp_t *vqp);
void vqp_recv_replenish(vqp_t *vqp);
/* DQPLB receiver: sequence number @a seq arrived (VQP_WIN_* @a bits). */
void vqp_win_insert(vqp_t *vqp, uint32_t seq, uint8_t bits, uint32_t imm);

/* Where a poll-mode completion goes: the caller's array of the running
 * vqp_cq_poll while it has room, else the CQ's ring, where it counts against
 * the virtual QP's limits until polled. */
static UCS_F_ALWAYS_INLINE vqp_wc_t *vqp_wc_slot(vqp_t *vqp, int recv)
{
    vqp_cq_t *cq = vqp->cq;

    if (ucs_likely(cq->out_left != 0)) {
        --cq->out_left;
        return cq->out++;
    }
    if (recv) {
        ++vqp->wc_pending_recvs;
    } else {
        ++vqp->wc_pending_ops;
    }
    return &cq->wcs[cq->wc_tail++ & cq->wc_mask];
}

/* Hand one completion to its owner: callback, or vqp_wc_slot(). */
static inline void vqp_deliver(vqp_t *vqp, const vqp_wc_t *wc)
{
    if (vqp->comp_cb != NULL) {
        vqp->comp_cb(vqp->comp_arg, wc);
        return;
    }
    *vqp_wc_slot(vqp, (wc->opcode == VQP_OP_RECV) ||
                          (wc->opcode == VQP_OP_RECV_NOTIFY)) = *wc;
}

#endif
