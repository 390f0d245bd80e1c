/*
 * Test fixture for single-process tests of the software device: two device
 * instances A and B in this process (like two hosts), one connected RC QP
 * pair, registered buffers, and a helper to progress both devices.
 */
#ifndef VQP_SW_TEST_FX_H_
#define VQP_SW_TEST_FX_H_

#include "sw_test_util.h"

#include "sw/sw_int.h" /* the MR table's access counts */

#include <stdlib.h>

#define FX_BUF 8192

typedef struct fx {
    vqp_sw_dev_t *devs[2]; /* A, B */
    vqp_sw_dev_addr_t addr[2];
    sw_test_cq_t scq[2], rcq[2];
    sw_test_qp_t qp[2];
    uint8_t *buf[2];
    vqp_sw_mr_t *mr[2];
    uint32_t lkey[2], rkey[2];
} fx_t;

/* Build A<->B with QPs of @a sq send BBs, @a rq receive WQEs. */
static inline int fx_init(fx_t *f, uint32_t sq, uint32_t rq, uint8_t rnr_retry,
                          uint8_t retry_cnt)
{
    int i;

    memset(f, 0, sizeof(*f));
    for (i = 0; i < 2; ++i) {
        if (vqp_sw_dev_open("vqp_sw0", &f->devs[i]) != UCS_OK) {
            return -1;
        }
        vqp_sw_dev_address(f->devs[i], &f->addr[i]);
        f->buf[i] = aligned_alloc(64, FX_BUF);
        memset(f->buf[i], 0, FX_BUF);
        if ((vqp_sw_mr_reg(f->devs[i], f->buf[i], FX_BUF, SW_TEST_ACCESS_ALL,
                           &f->mr[i], &f->lkey[i], &f->rkey[i]) != UCS_OK) ||
            (sw_test_cq_create(f->devs[i], 64, &f->scq[i]) != UCS_OK) ||
            (sw_test_cq_create(f->devs[i], 64, &f->rcq[i]) != UCS_OK) ||
            (sw_test_qp_create(f->devs[i], &f->scq[i], &f->rcq[i], NULL, sq, rq,
                               128, &f->qp[i]) != UCS_OK)) {
            return -1;
        }
    }
    for (i = 0; i < 2; ++i) {
        if (sw_test_qp_connect(&f->qp[i], &f->addr[!i], f->qp[!i].qpn,
                               SW_TEST_ACCESS_ALL, rnr_retry,
                               retry_cnt) != UCS_OK) {
            return -1;
        }
    }
    return 0;
}

/* Accesses of a peer still counted in a region of @a dev (between
 * vqp_sw_mr_access_begin and _end): none once the engine is idle. */
static inline int fx_mr_users(vqp_sw_dev_t *dev, uint32_t key)
{
    return __atomic_load_n(&dev->shm->mr[key & (VQP_SW_MAX_MR - 1)].users,
                           __ATOMIC_ACQUIRE);
}

static inline void fx_fini(fx_t *f)
{
    int i;

    for (i = 0; i < 2; ++i) {
        if (f->devs[i] == NULL) {
            continue;
        }
        /* Every path of the engine that counted an access ended it: a
         * leaked count would make each later dereg of the slot wait. */
        if ((f->mr[i] != NULL) && (fx_mr_users(f->devs[i], f->rkey[i]) != 0)) {
            fprintf(stderr, "fixture region %d: %d accesses still counted\n", i,
                    fx_mr_users(f->devs[i], f->rkey[i]));
            abort();
        }
        if (f->qp[i].qp != NULL) {
            vqp_sw_qp_destroy(f->qp[i].qp);
        }
        vqp_sw_dev_close(f->devs[i]); /* frees the CQs and MRs */
        free(f->buf[i]);
    }
}

/* Polls side @a side's send (recv=0) or receive (recv=1) CQ. */
static inline int fx_poll(fx_t *f, int side, int recv, struct mlx5_cqe64 *cqe)
{
    return sw_test_poll(f->devs, 2, recv ? &f->rcq[side] : &f->scq[side], cqe,
                        2000);
}

/* True if nothing arrives on that CQ within a few progress rounds. */
static inline int fx_cq_empty(fx_t *f, int side, int recv)
{
    int i;

    for (i = 0; i < 20; ++i) {
        vqp_sw_progress(f->devs[0]);
        vqp_sw_progress(f->devs[1]);
    }
    return sw_test_cq_peek(recv ? &f->rcq[side] : &f->scq[side]) == NULL;
}

/* RDMA WRITE of [A.buf+loff, len) to B.buf+roff from side @a s. */
static inline uint16_t fx_write(fx_t *f, int s, unsigned loff, unsigned roff,
                                uint32_t len, uint8_t flags)
{
    sw_test_qp_t *q = &f->qp[s];

    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, flags, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[!s] + roff, f->rkey[!s]);
    sw_test_dseg(q, 2, f->buf[s] + loff, len, f->lkey[s]);
    return sw_test_ring(q, 3);
}

static inline uint16_t fx_send(fx_t *f, int s, uint8_t opcode, unsigned loff,
                               uint32_t len, uint32_t imm_be)
{
    sw_test_qp_t *q = &f->qp[s];

    sw_test_ctrl(q, opcode, 2, MLX5_WQE_CTRL_CQ_UPDATE, imm_be);
    sw_test_dseg(q, 1, f->buf[s] + loff, len, f->lkey[s]);
    return sw_test_ring(q, 2);
}

static inline uint16_t fx_nop(fx_t *f, int s, uint8_t flags)
{
    sw_test_ctrl(&f->qp[s], MLX5_OPCODE_NOP, 1, flags, 0);
    return sw_test_ring(&f->qp[s], 1);
}

#endif
