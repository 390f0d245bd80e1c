/*
 * Software mlx5 device: the whole interface of the layer.
 *
 * The device exposes queue memory exactly as mlx5dv_init_obj() describes a
 * ConnectX QP/CQ/SRQ (struct mlx5dv_qp / mlx5dv_cq / mlx5dv_srq), so the same
 * WQE-building and CQE-parsing code runs on it and on hardware. There is no
 * device thread: the engine runs in the owner's threads. Software that rings
 * an SQ doorbell calls vqp_sw_qp_doorbell() where a NIC gets its MMIO write;
 * with VQP_SW_EXEC=doorbell the engine executes that QP's new WQEs right
 * there, as a NIC starts on them (by default they wait for progress, which
 * merges small WRITEs into one syscall); everything else
 * (inbound messages placed and their CQEs written, RNR and transport
 * retries, flushes, dead peers, held CQEs) happens when the owner calls
 * vqp_sw_progress(). Peers are other processes (or other device instances in
 * the same process) on this host; one-sided operations move data with
 * process_vm_writev/readv after checking the rkey against the peer's
 * registered regions, two-sided ones reach the peer's RQ/SRQ and the peer's
 * own engine writes the peer's CQEs.
 *
 * Verbs enums (ibv_qp_state, ibv_access_flags) are reused for states and
 * access rights so the device-control layer maps hardware and software 1:1.
 * Every function returns a UCS status and logs what was wrong on failure.
 */
#ifndef VQP_SW_H_
#define VQP_SW_H_

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <ucs/config/types.h>
#include <ucs/type/status.h>
#include <stddef.h>
#include <stdint.h>

typedef struct vqp_sw_dev vqp_sw_dev_t;
typedef struct vqp_sw_mr vqp_sw_mr_t;
typedef struct vqp_sw_cq vqp_sw_cq_t;
typedef struct vqp_sw_srq vqp_sw_srq_t;
typedef struct vqp_sw_qp vqp_sw_qp_t;

/* Limits the device enforces (and reports, like ibv_query_device). */
typedef struct vqp_sw_dev_attr {
    uint32_t max_qp;
    uint32_t max_cq;
    uint32_t max_srq;
    uint32_t max_mr;
    uint32_t max_qp_wr; /* SQ/RQ WQEs (basic blocks for the SQ) */
    uint32_t max_cqe;
    uint32_t max_srq_wr;
    uint32_t max_sge;     /* data segments per WQE */
    uint32_t max_inline;  /* inline bytes per WQE */
    uint64_t max_msg_sz;  /* largest message, bytes */
    uint32_t max_rd_atom; /* outstanding RDMA_READ/atomics per QP */
    /* Operand sizes (bit n: n bytes) whose fetched values the device writes
     * big-endian: 4 always; 8 unless VQP_SW_ATOMIC_REPLY=host at open, which
     * models a ConnectX in 8-byte host-endianness mode (what Linux selects
     * when the HCA offers it). */
    uint32_t atomic_be_sizes;
    /* 1: vqp_sw_qp_doorbell executes (VQP_SW_EXEC=doorbell); 0: WQEs run
     * in vqp_sw_progress (VQP_SW_EXEC=auto, the default, or progress). */
    uint32_t exec_doorbell;
    /* 1 (VQP_SW_EXEC=auto): an idle executor thread also progresses the
     * device once its owner left it unprogressed for VQP_SW_IDLE_US
     * (1000 us by default); 0: only the owner's calls execute. */
    uint32_t exec_idle;
} vqp_sw_dev_attr_t;

/*
 * What a peer needs to reach this device: the owning process and the device
 * instance in it (several instances per process are allowed, e.g. to model
 * two NICs or two hosts in one test). Fixed size, no pointers: it is sent
 * over the wire inside endpoint addresses.
 */
typedef struct vqp_sw_dev_addr {
    uint32_t pid;
    uint32_t instance;
} vqp_sw_dev_addr_t;

/* Device open/close. @a name selects the device ("vqp_sw0"); every open
 * creates a new instance with its own shared-memory segment and QPN space. */
ucs_status_t vqp_sw_dev_open(const char *name, vqp_sw_dev_t **dev_p);
void vqp_sw_dev_close(vqp_sw_dev_t *dev);
void vqp_sw_dev_query(const vqp_sw_dev_t *dev, vqp_sw_dev_attr_t *attr);
void vqp_sw_dev_address(const vqp_sw_dev_t *dev, vqp_sw_dev_addr_t *addr);

/* Run the engine: execute newly rung SQ doorbells, deliver inbound two-sided
 * messages, retry RNR-waiting WQEs, detect dead peers, apply injected faults.
 * Bounded work per call. Returns the number of events processed (0 = idle).
 */
unsigned vqp_sw_progress(vqp_sw_dev_t *dev);

/* Visits in which the idle executor progressed @a dev for its owner
 * (VQP_SW_EXEC=auto; see vqp_sw_dev_attr_t.exec_idle). */
uint64_t vqp_sw_dev_idle_runs(const vqp_sw_dev_t *dev);

/*
 * The SQ doorbell: software calls it after writing the doorbell record (and,
 * if it likes, the BlueFlame copy, which the device ignores), where a NIC gets
 * the MMIO write; once per batch is enough. In doorbell mode the engine runs
 * @a qp's requester right here, in this thread: every WQE rung so far executes
 * (data placed, the target's receive taken, requester CQEs written) unless the
 * QP has to wait (RNR, retry, a full inbound ring at the target: progress
 * retries it) or fails (error CQE, flushes), with every check of progress-
 * driven execution. Nothing else runs: no inbound records, no other QP. Rung
 * from inside the engine (a log handler, on any device of this thread), it is
 * deferred until the outermost engine call returns. In progress mode, and for
 * software that never calls it, the next vqp_sw_progress executes the WQEs.
 */
void vqp_sw_qp_doorbell(vqp_sw_qp_t *qp);

/*
 * Completion events: sleep instead of polling. Inbound messages are placed
 * and their CQEs written only inside vqp_sw_progress(), so a sleeping owner
 * needs a peer to wake it:
 *
 * vqp_sw_dev_event_fd: the device's event fd (created on the first call,
 *   closed with the device): a non-blocking UNIX datagram socket bound in the
 *   abstract namespace under the segment's name. It becomes readable when a
 *   peer deposited work (a SEND / WRITE_IMM / UD record, a responder error)
 *   for this device while it was armed.
 * vqp_sw_dev_arm: drains the fd, then arms the device. UCS_OK: nothing is
 *   pending, sleeping on the fd is safe. UCS_ERR_BUSY: wakeups were drained,
 *   or work is pending (inbound records, posted or stalled WQEs, responder
 *   errors, receives to flush, held or unpolled CQEs, CQEs past the consumer
 *   index of an armed CQ): progress and poll, then arm again. Other errors:
 *   the fd cannot be read (e.g. closed by the caller: UCS_ERR_IO_ERROR) or an
 *   arm doorbell written to a CQ's cq_uar is malformed
 *   (UCS_ERR_INVALID_PARAM). A peer sends one wakeup per arm, without
 *   blocking; a peer that is gone just never wakes anybody.
 */
ucs_status_t vqp_sw_dev_event_fd(vqp_sw_dev_t *dev, int *fd_p);
ucs_status_t vqp_sw_dev_arm(vqp_sw_dev_t *dev);

/* Memory regions. @a access is a mask of IBV_ACCESS_* flags. As ibv_reg_mr,
 * every page of the range must be mapped: else UCS_ERR_INVALID_ADDR. */
ucs_status_t vqp_sw_mr_reg(vqp_sw_dev_t *dev, void *addr, size_t length,
                           unsigned access, vqp_sw_mr_t **mr_p,
                           uint32_t *lkey_p, uint32_t *rkey_p);
/* The same; a refusal by the memory (unmapped, no free region) logs at
 * @a level, for callers that retry. */
ucs_status_t vqp_sw_mr_reg_log(vqp_sw_dev_t *dev, void *addr, size_t length,
                               unsigned access, ucs_log_level_t level,
                               vqp_sw_mr_t **mr_p, uint32_t *lkey_p,
                               uint32_t *rkey_p);
ucs_status_t vqp_sw_mr_dereg(vqp_sw_mr_t *mr);

/* Completion queue of at least @a cqe entries (rounded up to a power of
 * two); @a dv is filled as mlx5dv_init_obj fills struct mlx5dv_cq. */
ucs_status_t vqp_sw_cq_create(vqp_sw_dev_t *dev, uint32_t cqe,
                              vqp_sw_cq_t **cq_p, struct mlx5dv_cq *dv);
ucs_status_t vqp_sw_cq_destroy(vqp_sw_cq_t *cq);

/* Shared receive queue; @a dv as struct mlx5dv_srq (linked-list layout). */
ucs_status_t vqp_sw_srq_create(vqp_sw_dev_t *dev, uint32_t max_wr,
                               uint32_t max_sge, vqp_sw_srq_t **srq_p,
                               struct mlx5dv_srq *dv);
ucs_status_t vqp_sw_srq_destroy(vqp_sw_srq_t *srq);

typedef struct vqp_sw_qp_init_attr {
    vqp_sw_cq_t *send_cq;
    vqp_sw_cq_t *recv_cq;
    vqp_sw_srq_t *srq;     /* NULL: the QP has its own RQ */
    uint32_t max_send_wr;  /* WQEs of one basic block */
    uint32_t max_recv_wr;  /* ignored with an SRQ */
    uint32_t max_recv_sge; /* ignored with an SRQ */
    uint32_t max_inline_data;
} vqp_sw_qp_init_attr_t;

/* RC QP. @a dv is filled as mlx5dv_init_obj fills struct mlx5dv_qp. */
ucs_status_t vqp_sw_qp_create(vqp_sw_dev_t *dev,
                              const vqp_sw_qp_init_attr_t *attr,
                              vqp_sw_qp_t **qp_p, struct mlx5dv_qp *dv,
                              uint32_t *qpn_p);
ucs_status_t vqp_sw_qp_destroy(vqp_sw_qp_t *qp);

/*
 * UD QP with its own RQ (no SRQ: UCS_ERR_UNSUPPORTED), destroyed with
 * vqp_sw_qp_destroy. Only SEND and SEND_IMM run on it; each WQE is ctrl,
 * a datagram segment (struct mlx5_wqe_datagram_seg: an AV from
 * vqp_sw_ah_av with dqp_dct = QPN | MLX5_EXTENDED_UD_AV and the qkey), then
 * data or inline segments, payload at most VQP_SW_UD_MAX_MSG bytes. A
 * datagram reaches the QP with that QPN on the AV's device if it is UD, in
 * RTR/RTS/SQE, has the same qkey and a receive posted; otherwise it is
 * dropped (ud_dropped counter) and the sender still completes it. A receive
 * gets VQP_SW_UD_GRH bytes of IB GRH (docs/swdev.md) and then the payload;
 * its CQE's byte count includes the GRH.
 */
#define VQP_SW_UD_MAX_MSG 4096u /* the path MTU: no wire, largest IB MTU */
#define VQP_SW_UD_GRH     40u
ucs_status_t vqp_sw_ud_qp_create(vqp_sw_dev_t *dev,
                                 const vqp_sw_qp_init_attr_t *attr,
                                 vqp_sw_qp_t **qp_p, struct mlx5dv_qp *dv,
                                 uint32_t *qpn_p);

/* The address vector of the software device at @a remote for UD WQEs:
 * GRH flag set, rgid = fe80:0:7671:7073:<pid>:<instance> (32 bits each,
 * big-endian), hop limit 64, everything else 0 (no LID, no MAC, SGID index
 * 0); the QPN and qkey are set per WQE. */
void vqp_sw_ah_av(const vqp_sw_dev_addr_t *remote, struct mlx5_wqe_av *av);

typedef struct vqp_sw_qp_attr {
    enum ibv_qp_state qp_state;
    unsigned qp_access_flags;   /* INIT: IBV_ACCESS_REMOTE_* allowed */
    vqp_sw_dev_addr_t dest_dev; /* RTR: peer device */
    uint32_t dest_qp_num;       /* RTR: peer QPN */
    uint8_t min_rnr_timer;      /* RTR: IB encoding (0..31) */
    uint8_t max_dest_rd_atomic;
    uint8_t timeout;   /* RTS: IB encoding, 4.096us*2^t */
    uint8_t retry_cnt; /* RTS: 0..7 */
    uint8_t rnr_retry; /* RTS: 0..6, 7 = infinite */
    uint8_t max_rd_atomic;
    uint32_t qkey; /* UD, INIT: high bit clear (controlled qkeys: no) */
} vqp_sw_qp_attr_t;

/* State transitions RESET->INIT->RTR->RTS, any->ERR, any->RESET, checked as
 * ibv_modify_qp checks them (an invalid transition is UCS_ERR_INVALID_PARAM).
 * UD QPs take only qp_state and, in INIT, the qkey (every RC attribute must
 * be 0), and go SQE -> RTS after a send error.
 */
ucs_status_t vqp_sw_qp_modify(vqp_sw_qp_t *qp, const vqp_sw_qp_attr_t *attr);
enum ibv_qp_state vqp_sw_qp_state(const vqp_sw_qp_t *qp);


/*
 * Extensions beyond the drafted interface (observability and test control).
 *
 * Environment, read at open:
 *   VQP_SW_FAULTS     seeded fault injection, e.g.
 *                     "seed=7,reorder=0.2,delay_us=50,err=<qpn>:<wqe>:<synd>,
 *                     err_prob=0.001,kill=<qpn>,ud_drop=0.1,ud_dup=0.1"
 *                     (docs/swdev.md); an invalid
 *                     string fails the open.
 *   VQP_SW_NAMESPACE  letters/digits: a separate set of devices; peers must
 *                     share it (keeps concurrent test runs apart).
 *   VQP_SW_EXEC       doorbell: vqp_sw_qp_doorbell executes; progress (the
 *                     default): only vqp_sw_progress does. Anything else
 *                     fails the open (UCS_ERR_INVALID_PARAM).
 *   VQP_SW_ATOMIC_REPLY  be (default) or host: see atomic_be_sizes.
 */

/* Per-QP counters, also shown by the vqp_sw_stat tool. */
typedef struct vqp_sw_qp_counters {
    uint64_t wqes;          /* SQ WQEs executed */
    uint64_t bytes;         /* payload bytes moved by them */
    uint64_t errors;        /* error CQEs other than flushes */
    uint64_t rnr_retries;   /* RNR waits of the SQ head */
    uint64_t retries;       /* transport retries (no response) */
    uint64_t flushed;       /* flush CQEs written (SQ and RQ) */
    uint64_t recv_msgs;     /* responder completions delivered */
    uint64_t ud_dropped;    /* UD datagrams sent but not delivered */
    uint64_t out_of_buffer; /* UD datagrams that found no receive posted */
} vqp_sw_qp_counters_t;
void vqp_sw_qp_counters(const vqp_sw_qp_t *qp, vqp_sw_qp_counters_t *c);

/* Replace the fault configuration read from VQP_SW_FAULTS at open; same
 * syntax (see docs/swdev.md); NULL or "" disables injection. */
ucs_status_t vqp_sw_dev_set_faults(vqp_sw_dev_t *dev, const char *spec);

/* UCS_OK, or UCS_ERR_BUFFER_TOO_SMALL once the CQ overflowed (the producer
 * caught up with the consumer index in dbrec[0]); an overflowed CQ writes no
 * further CQEs and its QPs are in ERROR, as on a ConnectX. */
ucs_status_t vqp_sw_cq_status(const vqp_sw_cq_t *cq);

#endif
