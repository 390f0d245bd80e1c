/*
 * Device control: the whole interface of the layer.
 *
 * Opens a device (an mlx5 HCA port through libibverbs + mlx5dv, or the
 * software mlx5 device of src/sw), creates the queues the data path drives
 * and connects RC QPs to their peers. Queues are handed out exactly as
 * mlx5dv_init_obj() describes them (struct mlx5dv_qp/cq/srq), so the data path
 * never knows which kind of device it runs on. Nothing here is on the fast
 * path. Every function returns a UCS status and logs what was wrong.
 *
 * Addresses: a device address says how a peer reaches the device (IB: LID and
 * optionally the GID; RoCE: GID; software: process and instance), a QP address
 * adds the 24-bit QPN. Both pack into compact byte forms that start with a
 * type byte, so hardware and software peers can never be confused.
 */
#ifndef VQP_DEV_H_
#define VQP_DEV_H_

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <ucs/type/status.h>
#include <stddef.h>
#include <stdint.h>

typedef struct vqp_dev vqp_dev_t;
typedef struct vqp_dev_mr vqp_dev_mr_t;
typedef struct vqp_dev_cq vqp_dev_cq_t;
typedef struct vqp_dev_srq vqp_dev_srq_t;
typedef struct vqp_dev_qp vqp_dev_qp_t;

#define VQP_DEV_NAME_MAX 64

/* Name of the software device; it is listed only with VQP_DEV_LIST_SW. */
#define VQP_DEV_SW_NAME "vqp_sw0"

typedef enum vqp_dev_link {
    VQP_DEV_LINK_IB       = 1,
    VQP_DEV_LINK_ETHERNET = 2, /* RoCE */
    VQP_DEV_LINK_SW       = 3
} vqp_dev_link_t;

/* ------------------------------------------------------------ enumeration */

enum {
    /* Also list the software device. Off by default so that a user with real
     * HCAs never ends up on it by accident. */
    VQP_DEV_LIST_SW = 1u << 0,
    /* Also list hardware ports that are not ACTIVE (diagnostics). */
    VQP_DEV_LIST_INACTIVE = 1u << 1
};

typedef struct vqp_dev_info {
    char name[VQP_DEV_NAME_MAX]; /* "mlx5_0:1" or "vqp_sw0" */
    vqp_dev_link_t link;
    int active; /* port state ACTIVE (software: always) */
} vqp_dev_info_t;

/* Lists usable devices into a new array (free with vqp_dev_list_free). With
 * no RDMA support in the kernel or no mlx5 device, the hardware part is empty
 * and the call still succeeds. */
ucs_status_t vqp_dev_list(unsigned flags, vqp_dev_info_t **list_p,
                          unsigned *count_p);
void vqp_dev_list_free(vqp_dev_info_t *list);

/* ------------------------------------------------------------ device */

typedef struct vqp_dev_open_params {
    /* RoCE GID table index; -1 picks the first RoCE v2 GID of the port
     * (IPv4-mapped preferred). Ignored on IB and software. */
    int gid_index;
} vqp_dev_open_params_t;

void vqp_dev_open_params_default(vqp_dev_open_params_t *params);

/* @a name: "mlx5_0:1" (device:port), "mlx5_0" (its first active port) or
 * VQP_DEV_SW_NAME. @a params may be NULL for the defaults.
 * Unknown name: UCS_ERR_NO_DEVICE. */
ucs_status_t vqp_dev_open(const char *name, const vqp_dev_open_params_t *params,
                          vqp_dev_t **dev_p);
/* UCS_ERR_BUSY (and nothing closed) while MRs, CQs, SRQs, QPs or AHs of the
 * device are alive: closing would pull queue memory from under their users. */
ucs_status_t vqp_dev_close(vqp_dev_t *dev);

typedef struct vqp_dev_attr {
    char name[VQP_DEV_NAME_MAX];
    vqp_dev_link_t link;
    uint32_t max_qp_wr;  /* SQ/RQ WQEs */
    uint32_t max_sge;    /* data segments per WQE */
    uint32_t max_inline; /* inline bytes per send WQE */
    uint32_t max_cqe;
    uint32_t max_srq_wr;
    uint32_t max_rd_atom; /* outstanding reads/atomics per QP */
    uint32_t max_mr;      /* memory regions registered at once; 0: unknown */
    /* Operand sizes (bit n: n bytes, 4 and 8) of the extended (masked)
     * atomics the device executes with big-endian replies; 0: none. */
    uint32_t ext_atomic_sizes;
    /* Operand sizes (bit n: n bytes) whose fetched values the device writes
     * big-endian; the others land in host order (a ConnectX in 8-byte
     * host-endianness mode, which Linux selects when the HCA offers it). */
    uint32_t atomic_be_sizes;
    uint64_t max_msg_sz; /* largest message, bytes */
    uint32_t path_mtu;   /* active MTU, bytes */
    double bandwidth;    /* link data rate, bytes/s (estimates) */
    int gid_index;       /* RoCE: the GID index in use, else -1 */
    uint32_t max_ud_msg; /* largest UD payload: the path MTU */
    int comp_events;     /* vqp_dev_event_* work (see "events" below) */
    /* QPs whose sends complete on different CQs may be posted from
     * different threads at once: no two of them copy into one doorbell
     * (BlueFlame) register. The software device gives every QP a buffer of
     * its own. On a ConnectX, where rdma-core shares medium-latency
     * registers between QPs and a concurrent copy into one corrupts both
     * doorbells, the QPs of a CQ share a thread domain (a register of their
     * own), or without one ring 8-byte doorbells, which cannot tear. QPs of
     * one CQ are posted by one thread (as UCX's worker rule has it). */
    int qp_db_private;
} vqp_dev_attr_t;

void vqp_dev_query(const vqp_dev_t *dev, vqp_dev_attr_t *attr);

/* Runs the device: the software engine executes posted WQEs and writes CQEs.
 * Hardware needs nothing: returns 0. Returns the number of events handled. */
unsigned vqp_dev_progress(vqp_dev_t *dev);

/* ------------------------------------------------------------ queues */

/* Or'ed into @a access of vqp_dev_mr_reg (not an IBV_ACCESS_* bit): a
 * registration the memory refuses (unmapped, no room) logs at diag level
 * instead of error, for callers that retry, as UCT_MD_MEM_FLAG_HIDE_ERRORS. */
#define VQP_DEV_MR_HIDE_ERRORS (1u << 31)

/* @a access: IBV_ACCESS_* mask, optionally with VQP_DEV_MR_HIDE_ERRORS. As
 * ibv_reg_mr, every page of the range must be mapped (else
 * UCS_ERR_INVALID_ADDR). */
ucs_status_t vqp_dev_mr_reg(vqp_dev_t *dev, void *addr, size_t length,
                            unsigned access, vqp_dev_mr_t **mr_p,
                            uint32_t *lkey_p, uint32_t *rkey_p);
ucs_status_t vqp_dev_mr_dereg(vqp_dev_mr_t *mr);

/* At least @a cqe entries; @a dv is filled as by mlx5dv_init_obj (dv->cqn is
 * the CQ number). */
ucs_status_t vqp_dev_cq_create(vqp_dev_t *dev, uint32_t cqe,
                               vqp_dev_cq_t **cq_p, struct mlx5dv_cq *dv);
/* UCS_ERR_BUSY while a QP still uses the CQ. */
ucs_status_t vqp_dev_cq_destroy(vqp_dev_cq_t *cq);

/* @a dv as by mlx5dv_init_obj, with dv->srqn and MLX5DV_SRQ_MASK_SRQN set. */
ucs_status_t vqp_dev_srq_create(vqp_dev_t *dev, uint32_t max_wr,
                                uint32_t max_sge, vqp_dev_srq_t **srq_p,
                                struct mlx5dv_srq *dv);
/* UCS_ERR_BUSY while a QP still uses the SRQ. */
ucs_status_t vqp_dev_srq_destroy(vqp_dev_srq_t *srq);

typedef struct vqp_dev_qp_init {
    vqp_dev_cq_t *send_cq;
    vqp_dev_cq_t *recv_cq;
    vqp_dev_srq_t *srq; /* NULL: the QP has its own RQ */
    uint32_t max_send_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_wr;  /* must be 0 with an SRQ */
    uint32_t max_recv_sge; /* must be 0 with an SRQ */
    uint32_t max_inline;
} vqp_dev_qp_init_t;

/* What the device granted for a new QP. */
typedef struct vqp_dev_qp_caps {
    uint32_t qpn;
    uint32_t max_inline;
    uint32_t max_send_wr;
    uint32_t max_recv_wr;
} vqp_dev_qp_caps_t;

/* RC QP in RESET; @a dv is filled as by mlx5dv_init_obj. */
ucs_status_t vqp_dev_qp_create(vqp_dev_t *dev, const vqp_dev_qp_init_t *init,
                               vqp_dev_qp_t **qp_p, struct mlx5dv_qp *dv,
                               vqp_dev_qp_caps_t *caps);
ucs_status_t vqp_dev_qp_destroy(vqp_dev_qp_t *qp);

/* ------------------------------------------------------------ addresses */

typedef enum vqp_dev_addr_type {
    VQP_DEV_ADDR_IB   = 0xb1,
    VQP_DEV_ADDR_ROCE = 0xb2,
    VQP_DEV_ADDR_SW   = 0x5f
} vqp_dev_addr_type_t;

typedef struct vqp_dev_addr {
    vqp_dev_addr_type_t type;
    union {
        struct {
            uint16_t lid;
            int has_gid; /* routed subnets need the GID */
            union ibv_gid gid;
        } ib;
        struct {
            union ibv_gid gid;
        } roce;
        struct {
            uint32_t pid;
            uint32_t instance;
        } sw;
    };
} vqp_dev_addr_t;

typedef struct vqp_dev_qp_addr {
    vqp_dev_addr_t dev;
    uint32_t qpn; /* 24 bits */
} vqp_dev_qp_addr_t;

/* Largest packed device / QP address of any device kind. */
#define VQP_DEV_ADDR_PACKED_MAX    20
#define VQP_DEV_QP_ADDR_PACKED_MAX (VQP_DEV_ADDR_PACKED_MAX + 3)

void vqp_dev_address(const vqp_dev_t *dev, vqp_dev_addr_t *addr);

/* Packed size of @a addr (what UCT reports as its address lengths). Zero for
 * an address of unknown type. */
size_t vqp_dev_addr_packed_size(const vqp_dev_addr_t *addr);
size_t vqp_dev_qp_addr_packed_size(const vqp_dev_qp_addr_t *addr);

/* Packing fails with UCS_ERR_BUFFER_TOO_SMALL / UCS_ERR_INVALID_PARAM, never
 * writes past @a max. Unpacking checks the type byte and the length and
 * returns in @a used_p (may be NULL) how many bytes it consumed. */
ucs_status_t vqp_dev_addr_pack(const vqp_dev_addr_t *addr, void *buf,
                               size_t max, size_t *len_p);
ucs_status_t vqp_dev_addr_unpack(const void *buf, size_t len,
                                 vqp_dev_addr_t *addr, size_t *used_p);
ucs_status_t vqp_dev_qp_addr_pack(const vqp_dev_qp_addr_t *addr, void *buf,
                                  size_t max, size_t *len_p);
ucs_status_t vqp_dev_qp_addr_unpack(const void *buf, size_t len,
                                    vqp_dev_qp_addr_t *addr, size_t *used_p);

/* @a addr for a log line ("lid 0x1a", "gid fe80::...", "sw pid 1234
 * instance 0"), NUL-terminated and truncated to @a max bytes; returns @a buf.
 * Enough: VQP_DEV_ADDR_STR_MAX. */
#define VQP_DEV_ADDR_STR_MAX 64
const char *vqp_dev_addr_str(const vqp_dev_addr_t *addr, char *buf, size_t max);

/* UCS_OK if @a dev can reach a device at @a remote, else UCS_ERR_UNREACHABLE
 * with a debug log saying why (kinds differ, other IB subnet without GID,
 * software peer process gone, ...). */
ucs_status_t vqp_dev_is_reachable(const vqp_dev_t *dev,
                                  const vqp_dev_addr_t *remote);

/* ------------------------------------------------------------ datagrams */

/* Every UD receive buffer starts with room for a GRH (40 bytes), as in verbs;
 * the payload follows it and the CQE's byte count includes these 40 bytes. */
#define VQP_DEV_UD_GRH_LEN 40

typedef struct vqp_dev_ah vqp_dev_ah_t;

typedef struct vqp_dev_ud_qp_init {
    vqp_dev_cq_t *send_cq;
    vqp_dev_cq_t *recv_cq;
    uint32_t max_send_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_wr;
    uint32_t max_recv_sge;
    uint32_t max_inline;
    uint32_t qkey;
} vqp_dev_ud_qp_init_t;

/* UD QP with its own RQ, already in RTS (INIT with the qkey, RTR, RTS done
 * inside); @a dv as mlx5dv_init_obj fills it. Destroy with vqp_dev_qp_destroy.
 * The qkey must have its high bit clear (controlled qkeys are privileged).
 * vqp_dev_qp_connect refuses a UD QP. */
ucs_status_t vqp_dev_ud_qp_create(vqp_dev_t *dev,
                                  const vqp_dev_ud_qp_init_t *init,
                                  vqp_dev_qp_t **qp_p, struct mlx5dv_qp *dv,
                                  vqp_dev_qp_caps_t *caps);

/* Address handle towards the device at @a remote; @a av receives the mlx5
 * address vector for the datagram segment of UD WQEs (the QPN and qkey are
 * set per WQE by vqp_mlx5_post_ud_send). Unreachable: UCS_ERR_UNREACHABLE. */
ucs_status_t vqp_dev_ah_create(vqp_dev_t *dev, const vqp_dev_addr_t *remote,
                               vqp_dev_ah_t **ah_p, struct mlx5_wqe_av *av);
ucs_status_t vqp_dev_ah_destroy(vqp_dev_ah_t *ah);

/* ------------------------------------------------------------ events */

/*
 * Completion events, so a user can sleep in poll()/epoll instead of polling:
 *
 *   vqp_dev_event_fd(dev, &fd)  the device's event fd (non-blocking; owned by
 *       the device, closed with it). Readable when something happened that
 *       needs progress: hardware, an armed CQ got a CQE (a completion
 *       channel created at open, every CQ of the device reports to it);
 *       software, a peer deposited work for this device while it was armed
 *       (the device's UNIX datagram socket, see vqp_sw.h).
 *   vqp_dev_cq_arm(cq, ci, solicited)  asks for an event at the next CQE
 *       (next solicited one if @a solicited) after consumer index @a ci (the
 *       data path's count of polled CQEs): the mlx5 arm doorbell, written
 *       through vqp_mlx5_cq_arm with the CQ's arm sequence number.
 *   vqp_dev_event_arm(dev)  consumes what made the fd readable, then arms
 *       the device. UCS_OK: sleeping on the fd is safe once the CQs are
 *       armed. UCS_ERR_BUSY: events were consumed or work is pending (the
 *       software device: posted WQEs, inbound records, unpolled CQEs, ...):
 *       progress and poll first, then arm again.
 *
 * The caller's order: vqp_dev_event_arm, then vqp_dev_cq_arm of every CQ,
 * then check the CQs for CQEs (one that arrived before the arm raises no
 * event), then sleep. Without events (attr.comp_events == 0) every call is
 * UCS_ERR_UNSUPPORTED with a log line.
 */
ucs_status_t vqp_dev_event_fd(vqp_dev_t *dev, int *fd_p);
ucs_status_t vqp_dev_event_arm(vqp_dev_t *dev);
ucs_status_t vqp_dev_cq_arm(vqp_dev_cq_t *cq, uint32_t ci, int solicited);

/* ------------------------------------------------------------ connection */

typedef struct vqp_dev_connect_params {
    unsigned access;       /* IBV_ACCESS_REMOTE_* granted to the peer */
    uint8_t min_rnr_timer; /* IB encoding, 0..31 */
    uint8_t rnr_retry;     /* 0..7, 7 = infinite */
    uint8_t retry_cnt;     /* 0..7 */
    uint8_t timeout;       /* IB encoding 0..31: 4.096us * 2^timeout */
    uint8_t max_rd_atomic; /* 0: the device maximum */
    uint8_t sl;            /* service level (IB) */
    uint8_t traffic_class; /* GRH traffic class (RoCE, routed IB) */
    uint8_t hop_limit;
    uint32_t path_mtu; /* bytes; 0: the port's active MTU */
    /* RoCE: this QP's index within its virtual QP, or -1 to leave the NIC's
     * source port. QPs of one virtual QP with distinct indices get distinct
     * UDP source ports so that ECMP spreads them. */
    int udp_sport_index;
    uint16_t udp_sport_base; /* offset (e.g. a hash of the virtual QP) */
} vqp_dev_connect_params_t;

void vqp_dev_connect_params_default(vqp_dev_connect_params_t *params);

/* The RoCE v2 UDP source port for (@a base, @a index): always in the
 * dynamic range 0xC000..0xFFFF, distinct for 16384 consecutive indices. */
uint16_t vqp_dev_udp_sport(uint16_t base, unsigned index);

/* RESET -> INIT -> RTR -> RTS towards @a remote (QPN 2..0xffffff). The QP
 * must be in RESET (UCS_ERR_INVALID_PARAM otherwise); an unreachable @a remote
 * gives UCS_ERR_UNREACHABLE. On any failure the QP is left in RESET. @a params
 * may be NULL for the defaults. */
ucs_status_t vqp_dev_qp_connect(vqp_dev_qp_t *qp,
                                const vqp_dev_qp_addr_t *remote,
                                const vqp_dev_connect_params_t *params);

/* Moves the QP to ERROR: outstanding and later WQEs complete with flush
 * errors. Valid from any state, as in verbs. */
ucs_status_t vqp_dev_qp_set_error(vqp_dev_qp_t *qp);

/* Back to RESET (e.g. to reconnect after an error); rings become empty. */
ucs_status_t vqp_dev_qp_reset(vqp_dev_qp_t *qp);

enum ibv_qp_state vqp_dev_qp_state(const vqp_dev_qp_t *qp);

/* The UDP source port the QP got on RoCE, 0 if none was set. */
uint16_t vqp_dev_qp_udp_sport(const vqp_dev_qp_t *qp);

#endif
