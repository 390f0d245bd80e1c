/*
 * Test fixtures for the mlx5 data path without a device: queue memory laid
 * out as mlx5dv_init_obj() describes it, and a CQE producer that writes
 * CQEs the way the device does (fields, then op_own with the owner bit).
 */
#ifndef VQP_MLX5_FAKE_H_
#define VQP_MLX5_FAKE_H_

#include <mlx5/vqp_mlx5.h>
#include <ucs/config/global_opts.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define FAKE_QPN     0x12345u
#define FAKE_BF_SIZE 256u

typedef struct fake_qp {
    struct mlx5dv_qp dv;
    __be32 dbrec[2];
    uint64_t bf[2 * FAKE_BF_SIZE / sizeof(uint64_t)];
} fake_qp_t;

/* SQ of @a sq_bbs BBs and RQ of @a rq_cnt WQEs of @a rq_stride bytes, all
 * filled with a pattern so stray writes show. */
static inline fake_qp_t *fake_qp_new(uint32_t sq_bbs, uint32_t rq_cnt,
                                     uint32_t rq_stride)
{
    fake_qp_t *qp = calloc(1, sizeof(*qp));
    size_t sq_len = (size_t)sq_bbs * MLX5_SEND_WQE_BB;
    size_t rq_len = (size_t)rq_cnt * rq_stride;

    qp->dv.dbrec      = qp->dbrec;
    qp->dv.sq.buf     = aligned_alloc(64, sq_len);
    qp->dv.sq.wqe_cnt = sq_bbs;
    qp->dv.sq.stride  = MLX5_SEND_WQE_BB;
    memset(qp->dv.sq.buf, 0xa5, sq_len);
    if (rq_cnt != 0) {
        qp->dv.rq.buf     = aligned_alloc(64, rq_len < 64 ? 64 : rq_len);
        qp->dv.rq.wqe_cnt = rq_cnt;
        qp->dv.rq.stride  = rq_stride;
        memset(qp->dv.rq.buf, 0xa5, rq_len);
    }
    qp->dv.bf.reg  = qp->bf;
    qp->dv.bf.size = FAKE_BF_SIZE;
    memset(qp->bf, 0, sizeof(qp->bf));
    return qp;
}

static inline void fake_qp_free(fake_qp_t *qp)
{
    free(qp->dv.sq.buf);
    free(qp->dv.rq.buf);
    free(qp);
}

typedef struct fake_cq {
    struct mlx5dv_cq dv;
    __be32 dbrec[2];
    uint64_t uar[16]; /* CQ doorbell page stand-in */
    uint32_t pi;      /* producer index, as the device keeps it */
    unsigned log_cnt;
} fake_cq_t;

/* A new CQ: every CQE marked invalid, owned by the device. */
static inline fake_cq_t *fake_cq_new(uint32_t cnt, uint32_t cqe_size)
{
    fake_cq_t *cq = calloc(1, sizeof(*cq));
    uint32_t i;

    cq->dv.buf      = aligned_alloc(64, (size_t)cnt * cqe_size);
    cq->dv.dbrec    = cq->dbrec;
    cq->dv.cqe_cnt  = cnt;
    cq->dv.cqe_size = cqe_size;
    cq->dv.cq_uar   = cq->uar;
    cq->dv.cqn      = 0x77;
    cq->log_cnt     = __builtin_ctz(cnt);
    memset(cq->dv.buf, 0, (size_t)cnt * cqe_size);
    for (i = 0; i < cnt; ++i) {
        ((uint8_t *)cq->dv.buf)[(size_t)i * cqe_size + cqe_size - 1] =
            MLX5_CQE_INVALID << 4;
    }
    return cq;
}

static inline void fake_cq_free(fake_cq_t *cq)
{
    free(cq->dv.buf);
    free(cq);
}

static inline struct mlx5_cqe64 *fake_cq_slot(fake_cq_t *cq, uint32_t index)
{
    char *cqe = (char *)cq->dv.buf +
                (size_t)(index & (cq->dv.cqe_cnt - 1)) * cq->dv.cqe_size;

    return (struct mlx5_cqe64 *)(cqe + cq->dv.cqe_size - 64);
}

/* Produce a good CQE at the device's pi. */
static inline struct mlx5_cqe64 *fake_cq_push(fake_cq_t *cq, uint8_t opcode,
                                              uint32_t qpn,
                                              uint16_t wqe_counter,
                                              uint32_t byte_cnt, __be32 imm)
{
    struct mlx5_cqe64 *cqe = fake_cq_slot(cq, cq->pi);
    uint8_t owner          = (cq->pi >> cq->log_cnt) & 1;

    memset(cqe, 0, sizeof(*cqe) - 1);
    cqe->sop_drop_qpn   = htobe32(qpn);
    cqe->wqe_counter    = htobe16(wqe_counter);
    cqe->byte_cnt       = htobe32(byte_cnt);
    cqe->imm_inval_pkey = imm;
    cqe->op_own         = (uint8_t)(opcode << 4) | owner;
    ++cq->pi;
    return cqe;
}

/* Produce an error CQE (REQ_ERR or RESP_ERR) at the device's pi. */
static inline void fake_cq_push_err(fake_cq_t *cq, uint8_t opcode, uint32_t qpn,
                                    uint16_t wqe_counter, uint8_t syndrome,
                                    uint8_t vendor)
{
    struct mlx5_err_cqe *ecqe = (struct mlx5_err_cqe *)fake_cq_slot(cq, cq->pi);
    uint8_t owner             = (cq->pi >> cq->log_cnt) & 1;

    memset(ecqe, 0, sizeof(*ecqe) - 1);
    ecqe->syndrome         = syndrome;
    ecqe->vendor_err_synd  = vendor;
    ecqe->s_wqe_opcode_qpn = htobe32((0x08u << 24) | qpn);
    ecqe->wqe_counter      = htobe16(wqe_counter);
    ecqe->op_own           = (uint8_t)(opcode << 4) | owner;
    ++cq->pi;
}

/* Log capture: the last line of any level, kept off the output. */
static char fake_log_last[1024];
static ucs_log_level_t fake_log_level;
static ucs_log_level_t fake_log_saved_level;

static ucs_log_func_rc_t
fake_log_handler(const char *file, unsigned line, const char *function,
                 ucs_log_level_t level,
                 const ucs_log_component_config_t *comp_conf,
                 const char *message, va_list ap)
{
    vsnprintf(fake_log_last, sizeof(fake_log_last), message, ap);
    fake_log_level = level;
    return UCS_LOG_FUNC_RC_STOP;
}

/* Capture lines up to debug level until fake_log_stop(). */
static inline void fake_log_start(void)
{
    fake_log_last[0]     = '\0';
    fake_log_saved_level = ucs_global_opts.log_component.log_level;
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DEBUG;
    ucs_log_push_handler(fake_log_handler);
}

static inline void fake_log_stop(void)
{
    ucs_log_pop_handler();
    ucs_global_opts.log_component.log_level = fake_log_saved_level;
}

/* The last line was logged at @a _level and contains @a _text; forget it
 * for the next check. */
#define expect_log(_level, _text)                                            \
    do {                                                                     \
        if ((strstr(fake_log_last, (_text)) == NULL) ||                      \
            (fake_log_level != (_level))) {                                  \
            fail_msg("log '%s' (level %d) does not contain '%s' (level %d)", \
                     fake_log_last, fake_log_level, (_text), (_level));      \
        }                                                                    \
        fake_log_last[0] = '\0';                                             \
    } while (0)

/* Nothing was logged since the last check. */
#define expect_no_log() assert_string_equal(fake_log_last, "")

#endif
