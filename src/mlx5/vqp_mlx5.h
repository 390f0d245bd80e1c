/*
 * mlx5 data path: the whole interface of the layer.
 *
 * Builds send WQEs, rings doorbells, posts receives and parses CQEs directly
 * in the queue memory that rdma-core's mlx5dv_init_obj() describes (struct
 * mlx5dv_qp / mlx5dv_cq / mlx5dv_srq), so the same code drives a ConnectX HCA
 * and the software device of src/sw. Everything here is static inline: the
 * fast path allocates nothing, looks nothing up and calls through no function
 * pointer (except a software device's doorbell, VQP_MLX5_DB_HOOK). The layer
 * holds no locks: one thread owns each queue.
 *
 *   vqp_mlx5_tx.inl  send queue: WQE building, signaling, doorbell/BlueFlame
 *   vqp_mlx5_rx.inl  receive queue and linked-list SRQ
 *   vqp_mlx5_cq.inl  completion queue: polling, CQE decoding, error syndromes
 *   vqp_mlx5_ud.inl  UD sends (datagram segment) and UD receive CQE fields
 */
#ifndef VQP_MLX5_H_
#define VQP_MLX5_H_

#include <infiniband/mlx5dv.h>
#include <ucs/arch/cpu.h>
#include <ucs/debug/log.h>
#include <ucs/sys/compiler_def.h>
#include <ucs/type/status.h>
#include <endian.h>
#include <stdint.h>
#include <string.h>

/* Post flags (any combination). */
enum {
    VQP_MLX5_SIGNALED  = 1u << 0, /* ask for a CQE for this WQE */
    VQP_MLX5_FENCE     = 1u << 1, /* wait for earlier READ/atomics first */
    VQP_MLX5_SOLICITED = 1u << 2, /* solicited event at the responder */
    VQP_MLX5_INLINE    = 1u << 3, /* copy data into the WQE if it fits */
    VQP_MLX5_MORE      = 1u << 4, /* more posts follow: no doorbell yet */
    /* The caller made sure VQP_MLX5_MAX_BB BBs are free (it checks room
     * before choosing the QP): no second check. */
    VQP_MLX5_HAS_ROOM = 1u << 5
};

/* How a send queue tells the device about new WQEs. The modes without a
 * register come last: the doorbell tells them apart from the hardware ones
 * with the one compare it needs anyway. */
typedef enum {
    VQP_MLX5_DB_BF,     /* BlueFlame copy when the WQE fits, else doorbell */
    VQP_MLX5_DB_MMIO,   /* 8-byte doorbell write only */
    VQP_MLX5_DB_RECORD, /* doorbell record only (device polls it) */
    VQP_MLX5_DB_HOOK    /* record, then a call into the device (software) */
} vqp_mlx5_db_mode_t;

/*
 * A device without a doorbell register that starts on WQEs when told (the
 * software device of src/sw, whose engine runs in the ringing thread) hands
 * its QPs out with VQP_MLX5_DV_QP_MASK_DB_HOOK in mlx5dv_qp.comp_mask and the
 * address of its hook in mlx5dv_qp.tir_icm_addr (an RC QP has no TIR;
 * rdma-core sets only the mask bits it knows). vqp_mlx5_txwq_init then rings
 * by calling ring(arg) after the doorbell record, once per doorbell: a batch
 * posted with VQP_MLX5_MORE calls it once, at its flush. The hook must stay
 * valid while the QP is in use.
 */
#define VQP_MLX5_DV_QP_MASK_DB_HOOK (1ull << 63)

typedef struct vqp_mlx5_db_hook {
    void (*ring)(void *arg);
    void *arg;
} vqp_mlx5_db_hook_t;

enum {
    VQP_MLX5_SEG_SIZE   = 16, /* WQE size unit (ds) */
    VQP_MLX5_MAX_SGE    = 16, /* data segments per send WQE */
    VQP_MLX5_MAX_DS     = 63, /* 6-bit ds field of the ctrl segment */
    VQP_MLX5_MAX_BB     = 16, /* 63 ds fit in 16 basic blocks */
    VQP_MLX5_MAX_INLINE = (VQP_MLX5_MAX_DS - 2) * VQP_MLX5_SEG_SIZE - 4,
    VQP_MLX5_CQ_SET_CI  = 0, /* CQ dbrec words */
    VQP_MLX5_CQ_ARM_DB  = 1
};

#define VQP_MLX5_MAX_MSG (1ul << 31) /* bytes per WQE */

/* BBs of a WRITE / WRITE_IMM / READ with at most one data segment, not
 * inline: ctrl, raddr and data segment, 48 bytes. */
#define VQP_MLX5_RDMA_1SGE_BB 1

/* opmod of MLX5_OPCODE_ATOMIC_MASKED_CS/FA: extended atomic (bit 3) with
 * log2(operand bytes) - 2 in bits 2:0 (0: 4 bytes, 1: 8 bytes). */
#define VQP_MLX5_OPMOD_EXT_ATOMIC(_size) (0x8 | ((_size) == 8 ? 1 : 0))

/* One local buffer. A zero length is skipped: 0 in a data segment would
 * mean 2 GiB to the device. */
typedef struct vqp_mlx5_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
} vqp_mlx5_sge_t;

/* Send queue state: one cache line, all of it touched by each post. */
typedef struct vqp_mlx5_txwq {
    void *qstart;        /* first basic block (BB) of the ring */
    void *qend;          /* one past the last BB */
    uint16_t pi;         /* producer index in BBs, wraps at 2^16 */
    uint16_t ci;         /* oldest BB not yet known complete */
    uint16_t mask;       /* BBs in the ring - 1 */
    uint16_t sig_left;   /* posts until one is signaled anyway */
    uint16_t sig_every;  /* signal at least every N posts */
    uint16_t db_pi;      /* pi at the last doorbell */
    uint16_t last_pi;    /* index of the newest WQE */
    uint16_t max_inline; /* largest inline payload, bytes */
    uint32_t qpn_ds;     /* qpn << 8, ds is or'ed in per WQE */
    uint16_t bf_size;    /* bytes per BlueFlame half */
    uint8_t db_mode;     /* vqp_mlx5_db_mode_t */
    uint8_t reserved;
    /* The register's half for the next doorbell: 0 or bf_size, toggled by
     * each. Shared by the QPs that ring one register (vqp_mlx5_txwq_init),
     * so that its halves alternate whichever QP rings. */
    uint32_t *bf_toggle;
    volatile __be32 *dbrec; /* send doorbell record */
    union {
        char *bf_reg;                      /* BlueFlame register; NULL: none */
        const vqp_mlx5_db_hook_t *db_hook; /* VQP_MLX5_DB_HOOK */
    };
} vqp_mlx5_txwq_t;

_Static_assert(sizeof(vqp_mlx5_txwq_t) == 64, "vqp_mlx5_txwq_t: one line");

/* Receive queue of a QP without SRQ: a ring of scatter lists. */
typedef struct vqp_mlx5_rxwq {
    char *buf;
    volatile __be32 *dbrec;
    uint16_t head;   /* next WQE to post */
    uint16_t tail;   /* oldest posted WQE not yet consumed */
    uint16_t mask;   /* WQEs - 1 */
    uint16_t stride; /* bytes per WQE */
    uint16_t max_sge;
} vqp_mlx5_rxwq_t;

/* Shared receive queue in the linked-list layout of mlx5 providers: free
 * WQEs form a list from head to tail; one stays unposted so head == tail
 * means full. */
typedef struct vqp_mlx5_srq {
    char *buf;
    volatile __be32 *dbrec;
    uint16_t head;    /* next free WQE to post */
    uint16_t tail;    /* last free WQE; freed ones link after it */
    uint16_t counter; /* WQEs posted, wraps at 2^16 */
    uint16_t mask;    /* WQEs - 1 */
    uint16_t stride;  /* bytes per WQE */
    uint16_t max_sge;
} vqp_mlx5_srq_t;

/* Completion queue; ci counts CQEs consumed since creation. */
typedef struct vqp_mlx5_cq {
    char *buf;
    uint32_t ci;
    uint32_t mask;     /* CQEs - 1 */
    uint8_t log_cnt;   /* log2(CQEs): the owner bit's position */
    uint8_t cqe_shift; /* log2(CQE size): 6 or 7 */
    uint8_t cqe64_off; /* struct mlx5_cqe64 is the last 64 bytes */
    uint8_t arm_sn;    /* arm sequence number (2 bits) */
    volatile __be32 *dbrec;
    char *uar; /* CQ doorbell page (arming only) */
    uint32_t cqn;
} vqp_mlx5_cq_t;

#include "vqp_mlx5_tx.inl"
#include "vqp_mlx5_rx.inl"
#include "vqp_mlx5_cq.inl"
#include "vqp_mlx5_ud.inl"

#endif
