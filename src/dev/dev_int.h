/*
 * Device control internals: the object layouts shared by the common code
 * (dev.c: argument and state checks, dispatch) and the two implementations
 * (dev_hw.c over ibverbs + mlx5dv, dev_sw.c over the software device), and
 * the ops table each implementation provides. Not for use outside src/dev.
 */
#ifndef VQP_DEV_INT_H_
#define VQP_DEV_INT_H_

#include "vqp_dev.h"

#include <ucs/config/types.h>

typedef struct vqp_dev_ops {
    void (*close)(vqp_dev_t *dev);
    unsigned (*progress)(vqp_dev_t *dev);
    /* @a level: of the line logged when the memory refuses. */
    ucs_status_t (*mr_reg)(vqp_dev_t *dev, void *addr, size_t length,
                           unsigned access, ucs_log_level_t level,
                           vqp_dev_mr_t **mr_p, uint32_t *lkey_p,
                           uint32_t *rkey_p);
    ucs_status_t (*mr_dereg)(vqp_dev_mr_t *mr);
    ucs_status_t (*cq_create)(vqp_dev_t *dev, uint32_t cqe, vqp_dev_cq_t **cq_p,
                              struct mlx5dv_cq *dv);
    ucs_status_t (*cq_destroy)(vqp_dev_cq_t *cq);
    ucs_status_t (*srq_create)(vqp_dev_t *dev, uint32_t max_wr,
                               uint32_t max_sge, vqp_dev_srq_t **srq_p,
                               struct mlx5dv_srq *dv);
    ucs_status_t (*srq_destroy)(vqp_dev_srq_t *srq);
    ucs_status_t (*qp_create)(vqp_dev_t *dev, const vqp_dev_qp_init_t *init,
                              vqp_dev_qp_t **qp_p, struct mlx5dv_qp *dv,
                              vqp_dev_qp_caps_t *caps);
    ucs_status_t (*qp_destroy)(vqp_dev_qp_t *qp);
    /* One transition; the common code has checked that it is legal and that
     * @a remote is reachable. @a remote and @a params are set for INIT, RTR
     * and RTS and NULL otherwise. */
    ucs_status_t (*qp_modify)(vqp_dev_qp_t *qp, enum ibv_qp_state state,
                              const vqp_dev_qp_addr_t *remote,
                              const vqp_dev_connect_params_t *params);
    /* UD QP brought to RTS with init->qkey; caps->qpn set. Arguments are
     * checked; on failure nothing is left behind. */
    ucs_status_t (*ud_qp_create)(vqp_dev_t *dev,
                                 const vqp_dev_ud_qp_init_t *init,
                                 vqp_dev_qp_t **qp_p, struct mlx5dv_qp *dv,
                                 vqp_dev_qp_caps_t *caps);
    /* @a remote is of this device's kind and reachable. */
    ucs_status_t (*ah_create)(vqp_dev_t *dev, const vqp_dev_addr_t *remote,
                              vqp_dev_ah_t **ah_p, struct mlx5_wqe_av *av);
    ucs_status_t (*ah_destroy)(vqp_dev_ah_t *ah);
    /* Events (NULL: none); arguments checked. */
    ucs_status_t (*event_fd)(vqp_dev_t *dev, int *fd_p);
    ucs_status_t (*event_arm)(vqp_dev_t *dev);
} vqp_dev_ops_t;

/* Base of every device; implementations put it first in their own struct. */
struct vqp_dev {
    const vqp_dev_ops_t *ops;
    vqp_dev_attr_t attr;
    vqp_dev_addr_t addr;
    /* Live MRs, CQs, SRQs, QPs and AHs. Atomic: a registration cache
     * deregisters MRs from UCX's async thread. */
    unsigned num_objs;
};

static inline void vqp_dev_obj_add(vqp_dev_t *dev, int delta)
{
    __atomic_add_fetch(&dev->num_objs, (unsigned)delta, __ATOMIC_RELEASE);
}

struct vqp_dev_mr {
    vqp_dev_t *dev;
};

struct vqp_dev_cq {
    vqp_dev_t *dev;
    unsigned refcount; /* QPs using it */
    uint32_t cqn;
    /* Arming (vqp_dev_cq_arm): the doorbell page and record from the dv,
     * and the sequence number, advanced for every event consumed. */
    char *arm_uar;
    volatile __be32 *arm_dbrec;
    uint8_t arm_sn;
};

struct vqp_dev_srq {
    vqp_dev_t *dev;
    unsigned refcount;
    uint32_t srqn;
};

struct vqp_dev_qp {
    vqp_dev_t *dev;
    vqp_dev_cq_t *send_cq;
    vqp_dev_cq_t *recv_cq;
    vqp_dev_srq_t *srq;
    enum ibv_qp_state state;
    uint32_t qpn;
    uint16_t udp_sport;
    int ud; /* UD QP: connected at creation, never by vqp_dev_qp_connect */
};

struct vqp_dev_ah {
    vqp_dev_t *dev;
};

/* Implementations: open one device of their kind by name. */
ucs_status_t vqp_dev_hw_open(const char *name,
                             const vqp_dev_open_params_t *params,
                             vqp_dev_t **dev_p);
ucs_status_t vqp_dev_sw_open(const char *name, vqp_dev_t **dev_p);

/* Appends the hardware ports to @a list (grown with realloc). */
ucs_status_t vqp_dev_hw_list(unsigned flags, vqp_dev_info_t **list_p,
                             unsigned *count_p);

/* Extended (masked) atomic operand sizes (bit n: n bytes, 4 and 8) an mlx5
 * device executes as the data path posts them and with replies it can read
 * (big-endian), from its HCA capabilities via DevX (dev_hw_caps.c). 0 when
 * DevX is not available or the query fails (logged); never fails the open.
 * *@a be_sizes_p: the operand sizes whose fetched values land big-endian (4
 * always; 8 in endianness mode 0); left as the caller set it when the atomic
 * capabilities cannot be read. */
uint32_t vqp_dev_hw_ext_atomic_sizes(struct ibv_context *ctx, const char *name,
                                     uint32_t *be_sizes_p);

/* Parsers of QUERY_HCA_CAP outputs (@a out, @a len bytes, PRM layout): pure
 * functions, @a name only labels log lines. UCS_ERR_INVALID_PARAM: no buffer
 * or one too short for the fields read; UCS_ERR_IO_ERROR: the command's
 * status is not OK. General page: *atomic_p = cmd_hca_cap.atomic. Atomic
 * page: *sizes_p = the extended atomic sizes as above. */
ucs_status_t vqp_dev_hw_caps_parse_general(const char *name, const void *out,
                                           size_t len, int *atomic_p);
ucs_status_t vqp_dev_hw_caps_parse_atomic(const char *name, const void *out,
                                          size_t len, uint32_t *sizes_p);

const char *vqp_dev_qp_state_str(enum ibv_qp_state state);

/* Whether @a remote is a software device whose process has ended. */
int vqp_dev_sw_peer_gone(const vqp_dev_addr_t *remote);

/* ibv_mtu <-> bytes; 0 for a value that is not an IB MTU. */
uint32_t vqp_dev_mtu_bytes(enum ibv_mtu mtu);
enum ibv_mtu vqp_dev_mtu_enum(uint32_t bytes);

#endif
