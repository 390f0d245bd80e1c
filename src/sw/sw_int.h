/*
 * Software mlx5 device: internal header shared by the device's files.
 *
 * Owns the layout of the per-instance shared-memory segment (what peers read
 * and write) and the private objects behind the opaque handles of vqp_sw.h.
 * Shared structures hold offsets and fixed-size integers only: a peer maps
 * the segment at a different address.
 */
#ifndef VQP_SW_INT_H_
#define VQP_SW_INT_H_

#include "vqp_sw.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Internal to the device: calls between its files bind directly (no PLT
 * hop through the shared object that links it; the engine's per-QP loop
 * runs on every poll). */
#pragma GCC visibility push(hidden)

/* Segment versions: 2 UD QPs; 3 armed; 4 record seq; 5 16 Ki QPs;
 * 7 staging ring; 8 64 Ki QPs (16-bit slots) and a 4 GiB arena;
 * 9 out_of_buffer. */
#define VQP_SW_MAGIC       0x7671707377646576ull /* "vqpswdev" */
#define VQP_SW_VERSION     10u
#define VQP_SW_MAX_QP      65536u
#define VQP_SW_QP_BITS     16u
#define VQP_SW_MAX_CQ      512u
#define VQP_SW_MAX_SRQ     64u
#define VQP_SW_MAX_MR      16384u
#define VQP_SW_MR_BITS     14u
#define VQP_SW_INBOUND     4096u          /* responder records, power of two */
#define VQP_SW_ARENA_SIZE  (4096ul << 20) /* sparse in tmpfs */
#define VQP_SW_PAGE        4096ul
#define VQP_SW_MAX_PEERS   1024u
#define VQP_SW_BB          64u
#define VQP_SW_MAX_WQE_BB  16u /* ds is 6 bits: 63 x 16 bytes */
#define VQP_SW_BF_SIZE     256u
#define VQP_SW_MAX_SGE     16u
#define VQP_SW_MAX_INLINE  512u
#define VQP_SW_MAX_QP_WR   32768u      /* as a ConnectX */
#define VQP_SW_MAX_CQE     (1u << 20)  /* 64 MiB of the arena */
#define VQP_SW_MAX_MSG     (1ul << 30) /* as a ConnectX port says */
#define VQP_SW_NO_SRQ      UINT32_MAX
#define VQP_SW_WQE_BUDGET  64u  /* WQEs per QP per progress call */
#define VQP_SW_DRAIN_RUNS  64u  /* requester runs of a QP being destroyed */
#define VQP_SW_DEFER_MAX   16u  /* doorbells rung inside the engine, kept */
#define VQP_SW_IN_BUDGET   256u /* inbound records per progress call */
#define VQP_SW_REORDER_MAX 16u
#define VQP_SW_RUN_MAX     64u  /* WRITEs merged into one syscall */
#define VQP_SW_RUN_IOV     256u /* their local iovecs */
/* "/vqp_sw.<ns 32>-<uid>-<pid>-<instance>" with room to spare. */
#define VQP_SW_NAME_MAX 96
/* SEND/SEND_IMM payloads up to this size travel inside the inbound record
 * and the receiver's engine scatters them (no syscall); larger ones are
 * staged (below). Multiple of 8. */
#define VQP_SW_SMALL_SEND  256u
#define VQP_SW_SMALL_TRACK 8u /* unplaced small SENDs tracked per QP */
/* Larger SEND/SEND_IMM payloads up to this size are staged: the requester
 * copies them into the target's staging ring and the receiver's engine
 * scatters them, as small ones. Two copies of up to 16 KiB cost less than
 * one process_vm_writev (a syscall that pins the target's pages); larger
 * payloads, and those that find the ring full, are placed by the requester
 * with process_vm_writev. */
#define VQP_SW_STAGE_SEND  16384u
#define VQP_SW_STAGE_SIZE  (2u << 20) /* bytes of a device's staging ring */
#define VQP_SW_STAGE_ALIGN 64u        /* payloads start on a cache line */
/* Puts a mutex's robust-list links at the start of a cache line. */
#define VQP_SW_LIFE_PAD (64 - offsetof(pthread_mutex_t, __data.__list))
#define VQP_SW_SCAN_ERR (1ull << 32)
/* In scan[].idle: the QP had work left at its last run (matches no record). */
#define VQP_SW_SCAN_BUSY (1ull << 33)
/* UD QP types in vqp_sw_shm_qp_t.type. */
#define VQP_SW_QPT_RC 0u
#define VQP_SW_QPT_UD 1u

/* Memory region entry, readable by peers. key 0 marks a free slot. A reader
 * re-reads the key after the fields to detect a concurrent dereg. users
 * counts a peer's accesses in progress outside the owner's lock (one-sided
 * data movement): dereg waits for them, as an HCA touches no region after
 * ibv_dereg_mr returned (vqp_sw_mr_access_begin). */
typedef struct vqp_sw_shm_mr {
    uint32_t key;
    uint32_t access;
    uint64_t addr;
    uint64_t length;
    int32_t users;
    uint32_t reserved;
} vqp_sw_shm_mr_t;

/* Per-QP state a peer needs. Fields a peer writes are marked. */
typedef struct vqp_sw_shm_qp {
    uint32_t qpn;   /* 0 = free slot */
    uint32_t state; /* enum ibv_qp_state, written under the lock */
    uint32_t access;
    uint32_t dest_pid;
    uint32_t dest_instance;
    uint32_t dest_qpn;
    uint32_t srq_index; /* VQP_SW_NO_SRQ: own RQ */
    uint32_t rq_wqe_cnt;
    uint32_t rq_stride;
    uint32_t rq_max_sge;
    uint64_t rq_off;
    uint32_t rq_ci;      /* peer writes, under the lock: RQ WQEs consumed */
    uint32_t remote_err; /* peer writes: responder-side error to enter */
    uint32_t type;       /* VQP_SW_QPT_*, fixed at create */
    uint32_t qkey;       /* UD: set in INIT; datagrams must carry it */
    /* Counters, owner writes on every WQE: a cache line of their own so
     * peers reading the fields above do not bounce it. */
    uint64_t wqes __attribute__((aligned(64)));
    uint64_t bytes;
    uint64_t errors;
    uint64_t rnr_retries;
    uint64_t retries;
    uint64_t flushed;
    uint64_t recv_msgs;
    uint64_t ud_dropped; /* UD datagrams sent but not delivered */
    /* UD datagrams that found no receive posted here (a ConnectX's
     * out_of_buffer): written by the senders, under this segment's lock. */
    uint64_t out_of_buffer;
} vqp_sw_shm_qp_t;

/* dev->maps_fd before the first registration looked. */
#define VQP_SW_MAPS_UNKNOWN (-2)

typedef struct vqp_sw_shm_srq {
    uint32_t used;
    uint32_t wqe_cnt;
    uint32_t stride;
    uint32_t max_sge;
    uint32_t hw_head;  /* next WQE index the device takes */
    uint32_t consumed; /* WQEs taken, compared with the dbrec counter */
    uint64_t buf_off;
} vqp_sw_shm_srq_t;

/* vqp_sw_shm_rec_t.flags */
#define VQP_SW_REC_DATA   1u /* payload in data[]: the owner places it */
#define VQP_SW_REC_STAGED 2u /* payload in the staging ring (stage_end) */

/* Responder completion, published by the requester for the owner. With
 * VQP_SW_REC_DATA it carries a small SEND's payload (byte_cnt bytes), which
 * the owner scatters into the receive WQE before writing the CQE. The owner
 * polls seq (ring position + 1, stored last) instead of in_head: it then
 * reads only the record's first line, which holds the header and up to 32
 * payload bytes, and never the producers' lock line. */
typedef struct vqp_sw_shm_rec {
    uint32_t seq;
    uint16_t qp_index;
    uint8_t opcode;   /* MLX5_CQE_RESP_* or MLX5_CQE_RESP_ERR */
    uint8_t syndrome; /* for MLX5_CQE_RESP_ERR */
    uint32_t qpn;
    uint32_t byte_cnt;
    uint32_t imm; /* raw, as in the WQE */
    uint32_t src_qpn;
    uint16_t wqe_counter;
    uint8_t flags;
    uint8_t ud_hdr; /* UD: bits 31:24 of the CQE's flags_rqpn (GRH, SL) */
    /* VQP_SW_REC_STAGED: low 32 bits of the staging ring's head after the
     * payload; the payload is the byte_cnt bytes at the aligned start
     * before it (vqp_sw_stage_next). */
    uint32_t stage_end;
    uint8_t data[VQP_SW_SMALL_SEND];
} __attribute__((aligned(64))) vqp_sw_shm_rec_t;

typedef struct vqp_sw_shm {
    uint64_t magic;
    uint32_t version;
    uint32_t hdr_size;
    uint32_t pid;
    uint32_t uid;
    uint64_t start_time; /* /proc/<pid>/stat field 22, detects pid reuse */
    uint32_t instance;
    uint32_t alive; /* 1 while open; 0 after close */
    uint64_t seg_size;
    /* Robust mutex the owner holds while the device is open: when its
     * thread or process ends the kernel marks it owner-died, so a peer
     * learns that the owner is gone from one load (no syscall). glibc
     * links every robust mutex a thread holds through their __list fields
     * and rewrites its neighbour's links on each lock and unlock, i.e.
     * this one's whenever the owner takes a peer's lock: the padding puts
     * __list on the next cache line, away from the word peers read. */
    uint8_t life_pad[VQP_SW_LIFE_PAD] __attribute__((aligned(64)));
    pthread_mutex_t life;
    uint64_t arena_off;
    /* Guards everything peers mutate: RQ/SRQ consumption, the inbound
     * ring's producer side, atomics, and the owner's QP state changes.
     * Cache lines by writer: peers (lock, in_head), owner (in_tail). The
     * owner's engine reads neither lock nor in_head (it polls the records'
     * seq), and producers read in_tail only when the ring looks full, so
     * each line stays with its writer between messages. */
    pthread_mutex_t lock __attribute__((aligned(64)));
    uint64_t in_head;    /* producers, under the lock */
    uint64_t stage_head; /* staging ring bytes taken: producers, locked */
    /* Owner sets it before sleeping on its event socket (vqp_sw_dev_arm);
     * the first producer that deposits work afterwards clears it and sends
     * one wakeup datagram. On the producers' line: they read it after
     * every deposit, the owner writes it only when going to sleep. */
    uint32_t armed;
    uint64_t in_tail __attribute__((aligned(64))); /* owner */
    /* Owner: staging ring bytes placed and free again (in record order,
     * which is the order producers took them in). */
    uint64_t stage_tail;
    /* Owner, on every poll: a line of its own, so polling does not take
     * the in_tail line away from producers between messages. */
    uint64_t progress_calls __attribute__((aligned(64)));
    /* Peers add 1 after setting a QP's remote_err: the owner's poll reads
     * this word (a line peers write only on errors) instead of every QP's
     * remote_err. */
    uint32_t err_gen __attribute__((aligned(64)));
    vqp_sw_shm_rec_t in[VQP_SW_INBOUND] __attribute__((aligned(64)));
    uint8_t stage[VQP_SW_STAGE_SIZE] __attribute__((aligned(64)));
    vqp_sw_shm_mr_t mr[VQP_SW_MAX_MR];
    vqp_sw_shm_qp_t qp[VQP_SW_MAX_QP];
    vqp_sw_shm_srq_t srq[VQP_SW_MAX_SRQ];
    /* Doorbell records, contiguous so the engine scans them cheaply. */
    uint32_t qp_dbrec[VQP_SW_MAX_QP][2];
    uint32_t cq_dbrec[VQP_SW_MAX_CQ][2];
    uint32_t srq_dbrec[VQP_SW_MAX_SRQ][2];
} vqp_sw_shm_t;

/* A mapped peer segment (another process, or another instance here). */
typedef struct vqp_sw_peer {
    uint32_t pid;
    uint32_t instance;
    uint64_t start_time;
    vqp_sw_shm_t *shm;
    size_t size;
    bool dead;
    bool life_unreliable; /* life lock lost while the pid lives: ask */
    unsigned refs;        /* QPs pointing at it */
    /* The peer's in_tail when we last read it: a lower bound of the real
     * one (it only grows), so free ring slots are counted from it and the
     * owner's line is fetched only when the ring looks full. */
    uint64_t in_tail_seen;
    uint64_t stage_tail_seen; /* the same for its staging ring */
} vqp_sw_peer_t;

typedef struct vqp_sw_fault {
    bool enabled;
    uint64_t rng;
    double reorder;
    double delay_prob;
    unsigned delay_us;
    double err_prob;
    double ud_drop; /* UD datagrams lost on the way */
    double ud_dup;  /* UD datagrams delivered twice */
    uint8_t err_prob_synd;
    unsigned n_err;
    struct {
        uint32_t qpn;
        uint16_t wqe;
        uint8_t synd;
    } err[8];
    unsigned n_kill;
    uint32_t kill[8];
} vqp_sw_fault_t;

struct vqp_sw_mr {
    vqp_sw_dev_t *dev;
    uint32_t index;
};

struct vqp_sw_cq {
    vqp_sw_dev_t *dev;
    uint32_t index;
    struct mlx5_cqe64 *buf;
    uint32_t *dbrec;
    uint32_t cqe_cnt;
    unsigned log_cnt;
    uint32_t pi;
    unsigned refs;
    bool overflow;
    size_t pages;
    uint64_t off;
    /* Arm doorbell target (mlx5 writes 8 bytes at cq_uar + 0x20): checked
     * by vqp_sw_dev_arm against the arm record dbrec[1]; all ones until
     * the first arm. */
    uint64_t uar[8];
    /* CQEs held back by reorder injection, emitted in FIFO order. */
    unsigned n_held;
    struct mlx5_cqe64 held[VQP_SW_REORDER_MAX];
};

struct vqp_sw_srq {
    vqp_sw_dev_t *dev;
    uint32_t index;
    vqp_sw_shm_srq_t *shm;
    /* Geometry for the owner's engine: peers write hw_head and consumed in
     * the shared line, which reading the geometry there would pull back
     * on every message. */
    uint8_t *buf;
    uint32_t wqe_cnt;
    uint32_t stride;
    uint32_t max_sge;
    unsigned refs;
    size_t pages;
};

typedef enum vqp_sw_stall {
    VQP_SW_STALL_NONE,
    VQP_SW_STALL_RNR,   /* no receive WQE at the peer */
    VQP_SW_STALL_RETRY, /* no response: peer gone or not connected */
    VQP_SW_STALL_BUSY,  /* peer's inbound ring full or lock held */
    VQP_SW_STALL_DELAY  /* injected placement delay */
} vqp_sw_stall_t;

struct vqp_sw_qp {
    vqp_sw_dev_t *dev;
    uint32_t index;
    uint32_t qpn;
    vqp_sw_shm_qp_t *shm;
    uint32_t *dbrec;
    uint8_t *sq_buf;
    uint32_t sq_wqe_cnt;
    uint16_t sq_ci;
    uint16_t rq_flush_ci; /* RQ WQEs flushed so far in ERROR */
    unsigned list_pos;    /* index in dev->qp_list and dev->scan */
    vqp_sw_cq_t *send_cq;
    vqp_sw_cq_t *recv_cq;
    vqp_sw_srq_t *srq;
    uint32_t max_inline;
    vqp_sw_peer_t *peer;
    uint8_t min_rnr_timer;
    uint8_t timeout;
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    vqp_sw_stall_t stall;
    uint64_t stall_until; /* ns, CLOCK_MONOTONIC */
    unsigned stall_count; /* retries of the head WQE so far */
    /* Fault injection's decisions for WQE drawn_wqe (> 0xffff: none yet),
     * kept across its retries (vqp_sw_req_faults). */
    uint32_t drawn_wqe;
    bool drawn_delay;
    /* Receive buffers of small SENDs whose payload the target has not
     * placed yet, oldest first: until the target's ring tail passes seq, a
     * later operation of this QP touching [lo, hi) of the target waits
     * (placement order). When full, the newest entry absorbs more. */
    unsigned n_small;
    struct {
        uint64_t seq; /* target's in_head after the record */
        uint64_t lo;
        uint64_t hi;
    } small[VQP_SW_SMALL_TRACK];
    size_t sq_pages;
    size_t rq_pages;
    /* RQ geometry for the owner's engine (peers write rq_ci next to the
     * shared copy). */
    uint8_t *rq_buf;
    uint32_t rq_wqe_cnt;
    uint32_t rq_stride;
    uint32_t rq_max_sge;
    void *bf;
    /* UD: no connection; peer caches the device the last datagram went
     * to, ud_hdr is the CQE header of the datagram being delivered. */
    bool ud;
    uint32_t ud_hdr;
};

struct vqp_sw_dev {
    vqp_sw_shm_t *shm;
    size_t seg_size;
    char name[VQP_SW_NAME_MAX];
    uint32_t instance;
    uint32_t pid;
    uint32_t next_gen;
    vqp_sw_dev_attr_t attr;
    vqp_sw_qp_t *qps[VQP_SW_MAX_QP];
    vqp_sw_qp_t *qp_list[VQP_SW_MAX_QP]; /* dense, for progress */
    /* The poll's view of qp_list[i]: it skips the QP while its SQ doorbell
     * record holds idle (the raw value last seen with nothing left to
     * execute); VQP_SW_SCAN_ERR in idle (QP in ERROR, flushing) never
     * matches. Dense, so an idle QP costs two loads. */
    struct {
        const uint32_t *db;
        uint64_t idle;
    } scan[VQP_SW_MAX_QP];
    unsigned n_qps;
    unsigned qp_next;   /* where the search for a free QP slot starts */
    unsigned scan_hint; /* list index of the QP that last had work */
    vqp_sw_cq_t *cqs[VQP_SW_MAX_CQ];
    vqp_sw_srq_t *srqs[VQP_SW_MAX_SRQ];
    vqp_sw_mr_t *mrs[VQP_SW_MAX_MR];
    uint32_t mr_gen[VQP_SW_MAX_MR];
    uint32_t mr_free; /* every MR slot below it is taken */
    uint32_t qp_gen[VQP_SW_MAX_QP];
    uint8_t *arena_used; /* one byte per arena page */
    size_t arena_pages;
    size_t arena_low; /* every page below it is in use */
    vqp_sw_peer_t peers[VQP_SW_MAX_PEERS];
    vqp_sw_fault_t fault;
    bool atomic8_host;       /* 8-byte fetched values in host order */
    bool exec_doorbell;      /* VQP_SW_EXEC=doorbell: SQ doorbells execute */
    bool exec_idle;          /* VQP_SW_EXEC=auto: on the idle executor's list */
    vqp_sw_dev_t *idle_next; /* that list */
    uint64_t idle_calls;     /* shm->progress_calls at its last visit */
    uint64_t idle_runs;      /* progress calls it made for the owner */
    /* Doorbells rung while this thread was inside the engine (a log
     * handler posting, say): run when the outermost engine call ends.
     * Slot and QPN, so a QP destroyed meanwhile is skipped. */
    unsigned n_deferred;
    struct {
        uint32_t slot;
        uint32_t qpn;
    } deferred[VQP_SW_DEFER_MAX];
    bool defer_listed;        /* on this thread's list of such devices */
    vqp_sw_dev_t *defer_next; /* that list */
    uint64_t last_liveness;
    /* /proc/self/maps for PROCMAP_QUERY (sw_mr.c), opened at the first
     * registration; -1: not available (mincore only), VQP_SW_MAPS_UNKNOWN:
     * not opened yet. */
    int maps_fd;
    uint32_t err_gen_seen; /* shm->err_gen at the last full QP scan */
    pid_t life_tid;        /* thread holding shm->life (0: none) */
    /* Events (sw_event.c): the bound socket peers wake us through, and an
     * unbound one we wake peers from; -1 until first needed. */
    int event_fd;
    int wake_fd;
};

/* sw_dev.c */
uint64_t vqp_sw_now_ns(void);
uint64_t vqp_sw_proc_start_time(uint32_t pid);
bool vqp_sw_pid_alive(uint32_t pid, uint64_t start_time);
void vqp_sw_shm_prefix(char *buf, size_t len, uint32_t uid);
void vqp_sw_shm_name(char *buf, size_t len, uint32_t uid, uint32_t pid,
                     uint32_t instance);
vqp_sw_peer_t *vqp_sw_peer_get(vqp_sw_dev_t *dev,
                               const vqp_sw_dev_addr_t *addr);
void vqp_sw_peer_put(vqp_sw_dev_t *dev, vqp_sw_peer_t *peer);
/* As vqp_sw_peer_get, without logging a missing or foreign segment (UD:
 * a datagram to a vanished device is dropped quietly). */
vqp_sw_peer_t *vqp_sw_peer_get_quiet(vqp_sw_dev_t *dev,
                                     const vqp_sw_dev_addr_t *addr);
bool vqp_sw_peer_check(vqp_sw_peer_t *peer);
/* Cheap per-message check that the peer process lives (reaped or not):
 * its life lock, or kill() when that lock cannot tell. @a self_pid: ours
 * (a peer in this process is alive while mapped). */
bool vqp_sw_peer_alive(vqp_sw_peer_t *peer, uint32_t self_pid);
void vqp_sw_lock(vqp_sw_shm_t *shm);
/* False when another process holds the lock. Depositors use this, never
 * vqp_sw_lock: on oversubscribed cores a holder is often descheduled inside
 * its short critical section, and a waiter that sleeps behind it stalls
 * its own process's progress (and so its peers') for whole time slices. */
bool vqp_sw_trylock(vqp_sw_shm_t *shm);
void vqp_sw_unlock(vqp_sw_shm_t *shm);
void *vqp_sw_arena_alloc(vqp_sw_dev_t *dev, size_t size, size_t *pages_p,
                         uint64_t *off_p);
void vqp_sw_arena_free(vqp_sw_dev_t *dev, uint64_t off, size_t pages);
/* This process's pid (cached; a forked child gets its own). */
uint32_t vqp_sw_pid(void);
/* Move data between this process and process @a pid (memcpy when it is us).
 * Returns 0, or an errno (ESRCH: gone, EFAULT: bad remote address). */
int vqp_sw_xfer(uint32_t pid, bool to_remote, const struct iovec *local,
                unsigned n_local, const struct iovec *remote,
                unsigned n_remote);

/* The engine of this thread: every call that executes WQEs or writes
 * CQEs (progress, doorbell, the destroy drain) is one section. Enter
 * returns false inside another one (of any device: the outer one may hold
 * a segment lock or be halfway through a CQE), and the caller must not run
 * anything then. Leave, at the outermost level, runs the doorbells that
 * were deferred meanwhile. */
bool vqp_sw_engine_enter(void);
void vqp_sw_engine_leave(void);

/* The device lock: one per process, taken by every engine section and by
 * every control call (create, destroy, modify, register, arm), so threads
 * sharing devices (UCX workers of one context) and the idle executor take
 * turns. Recursive per thread (a control call inside a section, a destroy
 * inside a close). */
void vqp_sw_dev_lock(void);
void vqp_sw_dev_unlock(void);
/* Taken without waiting (the idle executor); false if another thread
 * holds it. */
bool vqp_sw_dev_trylock(void);

/* The value of the control call @a _call, made under the device lock. */
#define VQP_SW_LOCKED(_call)           \
    ({                                 \
        __typeof__(_call) _vqp_sw_ret; \
        vqp_sw_dev_lock();             \
        _vqp_sw_ret = (_call);         \
        vqp_sw_dev_unlock();           \
        _vqp_sw_ret;                   \
    })

/* sw_idle.c: the idle executor of VQP_SW_EXEC=auto. A thread that progresses
 * every such device whose owner left it unprogressed for a period: posted
 * WQEs execute whether or not their process progresses again, as on a NIC.
 * Add and remove under the device lock; start and stop without it. */
void vqp_sw_idle_add(vqp_sw_dev_t *dev);
void vqp_sw_idle_remove(vqp_sw_dev_t *dev);
ucs_status_t vqp_sw_idle_start(void);
void vqp_sw_idle_stop_unused(void);
/* In a child after fork(): no executor thread there, no devices of ours. */
void vqp_sw_idle_forked(void);

/* sw_mr.c */
/* Resolves [addr, addr+len) under @a key in @a shm's MR table with @a
 * access rights; 0 on success, or the failing rule for the log. */
const char *vqp_sw_mr_check(const vqp_sw_shm_t *shm, uint32_t key,
                            uint64_t addr, uint64_t len, unsigned access);

/* vqp_sw_mr_check for an access that moves data after the check without
 * the owner's lock: on success the region's slot counts the access until
 * vqp_sw_mr_access_end, so that a dereg (which clears the key, then waits
 * for the count) cannot return while the data still moves. Counting before
 * the key is read, and the dereg clearing the key before reading the count,
 * means one of the two sees the other (both sequentially consistent). */
static inline const char *vqp_sw_mr_access_begin(vqp_sw_shm_t *shm,
                                                 uint32_t key, uint64_t addr,
                                                 uint64_t len, unsigned access)
{
    vqp_sw_shm_mr_t *ent = &shm->mr[key & (VQP_SW_MAX_MR - 1)];
    const char *why;

    __atomic_add_fetch(&ent->users, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&ent->key, __ATOMIC_SEQ_CST) != key) {
        why = "key not registered";
    } else {
        why = vqp_sw_mr_check(shm, key, addr, len, access);
    }
    if (why != NULL) {
        __atomic_sub_fetch(&ent->users, 1, __ATOMIC_RELEASE);
    }
    return why;
}

static inline void vqp_sw_mr_access_end(vqp_sw_shm_t *shm, uint32_t key)
{
    __atomic_sub_fetch(&shm->mr[key & (VQP_SW_MAX_MR - 1)].users, 1,
                       __ATOMIC_RELEASE);
}

/* Resolves a receive WQE's scatter list (ends at MLX5_INVALID_LKEY or
 * @a n_segs entries) in @a shm's MR table for a @a len-byte message into
 * @a riov / *nr_p. Returns 0, 0x04 (bad entry: *bad_p, *why_p) or 0x01
 * (the message does not fit: *cap_p bytes). */
uint8_t vqp_sw_scatter_resolve(const vqp_sw_shm_t *shm,
                               const struct mlx5_wqe_data_seg *segs,
                               unsigned n_segs, uint64_t len,
                               struct iovec *riov, unsigned *nr_p,
                               unsigned *bad_p, const char **why_p,
                               uint64_t *cap_p);

/* sw_queue.c */
const char *vqp_sw_state_str(enum ibv_qp_state state);
void vqp_sw_qp_set_error(vqp_sw_qp_t *qp);
/* UD QP in RTS after a send error: SQ Error (the RQ keeps working). */
void vqp_sw_qp_set_sqe(vqp_sw_qp_t *qp);

/* sw_comp.c */
void vqp_sw_cqe_req(vqp_sw_qp_t *qp, uint16_t wqe_counter, uint8_t opcode,
                    uint32_t byte_cnt);
void vqp_sw_cqe_err(vqp_sw_qp_t *qp, vqp_sw_cq_t *cq, bool responder,
                    uint16_t wqe_counter, uint8_t opcode, uint8_t syndrome);
void vqp_sw_cqe_resp(vqp_sw_qp_t *qp, const vqp_sw_shm_rec_t *rec);
void vqp_sw_cq_release_held(vqp_sw_cq_t *cq);
/* Flush CQEs for the SQ, and for the RQ unless the QP is in SQE. */
unsigned vqp_sw_flush_qp(vqp_sw_qp_t *qp);

/* sw_req.c, sw_rdma.c: the requester */
typedef enum vqp_sw_req_result {
    VQP_SW_REQ_DONE,
    VQP_SW_REQ_STALL, /* qp->stall says why; retry the same WQE later */
    VQP_SW_REQ_ERROR  /* error CQE written, QP moved to ERR */
} vqp_sw_req_result_t;

/* A parsed WQE: segments after ctrl/raddr/atomic as local iovecs. */
typedef struct vqp_sw_wqe {
    const uint8_t *base;
    uint8_t opcode;
    uint8_t fm_ce_se;
    unsigned ds;
    unsigned nbb;
    uint32_t imm;
    uint64_t raddr;
    uint32_t rkey;
    uint64_t swap_add; /* atomics: operands in host order */
    uint64_t compare;  /* MASKED_FA: the field boundary */
    uint64_t swap_mask;
    uint64_t compare_mask;
    unsigned asize; /* atomics: operand bytes (4 or 8) */
    unsigned n_iov;
    uint64_t len;
    /* Gather list in WQE order: data segments and inline segments (UCX
     * puts an inline header before data segments); bit i of inline_mask
     * marks iov[i] as inline data (no lkey). */
    struct iovec iov[VQP_SW_MAX_SGE + 1];
    uint32_t lkey[VQP_SW_MAX_SGE + 1];
    uint32_t inline_mask;
    bool is_inline; /* any inline segment */
} vqp_sw_wqe_t;
vqp_sw_req_result_t vqp_sw_req_fail(vqp_sw_qp_t *qp, const vqp_sw_wqe_t *w,
                                    uint8_t syndrome);
/* A violated rule of the WQE contract: named in the log, then an error CQE
 * with the syndrome a ConnectX gives. */
#define vqp_sw_req_violation(_qp, _w, _synd, _fmt, ...)                 \
    ({                                                                  \
        ucs_error("vqp_sw %s: QP 0x%x WQE %u: " _fmt, (_qp)->dev->name, \
                  (_qp)->qpn, (_qp)->sq_ci, ##__VA_ARGS__);             \
        vqp_sw_req_fail(_qp, _w, _synd);                                \
    })
vqp_sw_req_result_t vqp_sw_req_stall(vqp_sw_qp_t *qp, const vqp_sw_wqe_t *w,
                                     vqp_sw_stall_t why);
bool vqp_sw_req_layout(vqp_sw_qp_t *qp, vqp_sw_wqe_t *w, unsigned first,
                       const char **why);
const char *vqp_sw_req_check_lkeys(vqp_sw_qp_t *qp, const vqp_sw_wqe_t *w,
                                   unsigned access, unsigned *bad);
vqp_sw_req_result_t vqp_sw_req_rdma(vqp_sw_qp_t *qp, vqp_sw_wqe_t *w);
vqp_sw_req_result_t vqp_sw_req_atomic(vqp_sw_qp_t *qp, vqp_sw_wqe_t *w);
/* A run of consecutive, already checked WQEs executed together: one
 * syscall for all their payloads. Local iovecs of entry i are
 * liov[ent[i].liov_first .. + ent[i].liov_cnt). */
typedef struct vqp_sw_run {
    unsigned n;
    unsigned nl;
    struct {
        uint16_t idx;
        uint16_t nbb;
        uint8_t opcode;
        bool signaled;
        uint32_t imm;
        uint32_t rkey;
        uint64_t raddr;
        uint64_t len;
        unsigned liov_first;
        unsigned liov_cnt;
    } ent[VQP_SW_RUN_MAX];
    struct iovec liov[VQP_SW_RUN_IOV];
} vqp_sw_run_t;
unsigned vqp_sw_req_scan_run(vqp_sw_qp_t *qp, uint16_t pi, unsigned budget,
                             uint8_t op0, uint8_t op1, vqp_sw_run_t *run);
void vqp_sw_req_run_complete(vqp_sw_qp_t *qp, const vqp_sw_run_t *run,
                             unsigned n);
unsigned vqp_sw_req_write_run(vqp_sw_qp_t *qp, uint16_t pi, unsigned budget);
unsigned vqp_sw_resp_deliver_run(vqp_sw_qp_t *qp, const vqp_sw_run_t *run);
unsigned vqp_sw_req_progress(vqp_sw_qp_t *qp);

/* sw_resp.c */
unsigned vqp_sw_resp_progress(vqp_sw_dev_t *dev);
/* Deliver every inbound record published before the call: those a peer
 * deposited before it set one of our QPs' remote_err (on a wire they
 * arrived before the error). */
unsigned vqp_sw_resp_drain(vqp_sw_dev_t *dev);

/* Whether an inbound record waits at the ring's tail: the check
 * vqp_sw_resp_progress starts with, without its call (a progress call that
 * finds nothing pays only this). */
static inline bool vqp_sw_resp_pending(const vqp_sw_dev_t *dev)
{
    const vqp_sw_shm_t *shm = dev->shm;
    uint64_t tail           = shm->in_tail;

    return __atomic_load_n(&shm->in[tail & (VQP_SW_INBOUND - 1)].seq,
                           __ATOMIC_RELAXED) == (uint32_t)(tail + 1);
}

/* Free records in @a peer's inbound ring (its lock held), at least @a want
 * if there are: its in_tail is read only when the last one seen leaves
 * fewer. */
unsigned vqp_sw_ring_room(vqp_sw_peer_t *peer, unsigned want);
typedef enum vqp_sw_resp_status {
    VQP_SW_RESP_OK,
    VQP_SW_RESP_RNR,
    VQP_SW_RESP_NO_ACK,   /* peer QP absent/not connected: retry */
    VQP_SW_RESP_BUSY,     /* inbound ring full or its lock held */
    VQP_SW_RESP_LOC_PROT, /* our gather list invalid */
    VQP_SW_RESP_REM_ACCESS,
    VQP_SW_RESP_REM_INVAL, /* receive too small */
    VQP_SW_RESP_REM_OP     /* receiver's scatter list invalid */
} vqp_sw_resp_status_t;
vqp_sw_resp_status_t vqp_sw_resp_deliver(vqp_sw_qp_t *qp, uint8_t opcode,
                                         uint32_t imm, const struct iovec *iov,
                                         unsigned n_iov, uint64_t len,
                                         uint64_t raddr, uint32_t rkey);
vqp_sw_shm_qp_t *vqp_sw_peer_qp(vqp_sw_qp_t *qp);
/* Starts loading the lines a SEND of @a qp reads or writes in its target's
 * segment (receive doorbell record and WQE, ring slot) while the WQE is
 * parsed: they were last written by the target's process. */
void vqp_sw_resp_prefetch(vqp_sw_qp_t *qp);
/* Sets @a tqp's responder error flag @a synd in qp->peer's segment, tells
 * its owner's poll (err_gen) and wakes it. */
void vqp_sw_peer_remote_err(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                            uint32_t synd);
/* Responder steps the UD path shares; qp->peer is the target device, its
 * lock held. */
vqp_sw_resp_status_t vqp_sw_resp_take_wqe(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                                          unsigned k, uint32_t *cursor,
                                          const struct mlx5_wqe_data_seg **segs,
                                          unsigned *n_segs,
                                          uint16_t *wqe_counter);
void vqp_sw_resp_consume(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp,
                         uint16_t wqe_counter);
void vqp_sw_resp_publish(vqp_sw_qp_t *qp, vqp_sw_shm_qp_t *tqp, uint8_t opcode,
                         uint8_t syndrome, uint16_t wqe_counter,
                         uint32_t byte_cnt, uint32_t imm,
                         const struct iovec *data, unsigned n_data,
                         uint64_t stage_end);

/* sw_ud.c */
/* Executes the UD WQE at sq_ci (ctrl checked, @a w->base linear). */
vqp_sw_req_result_t vqp_sw_ud_send(vqp_sw_qp_t *qp, vqp_sw_wqe_t *w);
/* True while [addr, addr+len) of the target may still receive the payload
 * of an earlier small SEND of @a qp: the caller waits (BUSY). */
bool vqp_sw_small_conflict(vqp_sw_qp_t *qp, uint64_t addr, uint64_t len);

/* sw_event.c */
/* After depositing work for @a peer's engine (an inbound record, a
 * responder error): if the peer is armed, disarm it and send one wakeup
 * datagram. Never blocks; a dead or vanished peer is ignored. */
void vqp_sw_peer_wake(vqp_sw_dev_t *dev, vqp_sw_peer_t *peer);
void vqp_sw_event_close(vqp_sw_dev_t *dev);

/* sw_fault.c */
ucs_status_t vqp_sw_fault_parse(const char *spec, vqp_sw_fault_t *fault);
double vqp_sw_fault_rand(vqp_sw_fault_t *fault);
uint8_t vqp_sw_fault_wqe(vqp_sw_dev_t *dev, vqp_sw_qp_t *qp, uint16_t wqe);
bool vqp_sw_fault_killed(vqp_sw_dev_t *dev, vqp_sw_qp_t *qp);
/* Copies of a UD datagram the network delivers: 0 (ud_drop), 1 or 2
 * (ud_dup). */
unsigned vqp_sw_fault_ud_copies(vqp_sw_dev_t *dev);

#pragma GCC visibility pop

#endif
