/*
 * Test-only helpers for the software mlx5 device: build WQEs by hand in the
 * mlx5 formats (no dependency on the data-path layer), ring doorbells, poll
 * CQEs with owner-bit checks, and wire up connected QP pairs.
 */
#ifndef VQP_SW_TEST_UTIL_H_
#define VQP_SW_TEST_UTIL_H_

#include "sw/vqp_sw.h"

#include <ucs/debug/log.h>

#include <endian.h>
#include <stdio.h>
#include <sched.h>
#include <string.h>
#include <time.h>

typedef struct sw_test_cq {
    vqp_sw_cq_t *cq;
    struct mlx5dv_cq dv;
    uint32_t ci;
} sw_test_cq_t;

typedef struct sw_test_qp {
    vqp_sw_qp_t *qp;
    struct mlx5dv_qp dv;
    uint32_t qpn;
    uint16_t sq_pi;
    uint16_t rq_pi;
    unsigned bf_off;
} sw_test_qp_t;

typedef struct sw_test_srq {
    vqp_sw_srq_t *srq;
    struct mlx5dv_srq dv;
    uint16_t counter;
    uint32_t wqe_cnt;
} sw_test_srq_t;

static inline uint8_t *sw_test_bb(sw_test_qp_t *q, uint16_t idx)
{
    return (uint8_t *)q->dv.sq.buf +
           (size_t)(idx & (q->dv.sq.wqe_cnt - 1)) * q->dv.sq.stride;
}

/* Writes @a len bytes of segment data at 16-byte unit @a unit of the WQE
 * starting at the producer index, wrapping at the end of the ring. */
static inline void sw_test_wqe_put(sw_test_qp_t *q, unsigned unit,
                                   const void *data, size_t len)
{
    const uint8_t *src = data;
    size_t off         = (size_t)unit * 16, chunk;
    uint16_t bb;

    while (len > 0) {
        bb    = (uint16_t)(q->sq_pi + off / 64);
        chunk = 64 - off % 64;
        if (chunk > len) {
            chunk = len;
        }
        memcpy(sw_test_bb(q, bb) + off % 64, src, chunk);
        src += chunk;
        off += chunk;
        len -= chunk;
    }
}

static inline void sw_test_ctrl(sw_test_qp_t *q, uint8_t opcode, unsigned ds,
                                uint8_t fm_ce_se, uint32_t imm_be)
{
    struct mlx5_wqe_ctrl_seg c;

    memset(&c, 0, sizeof(c));
    c.opmod_idx_opcode = htobe32(((uint32_t)q->sq_pi << 8) | opcode);
    c.qpn_ds           = htobe32((q->qpn << 8) | ds);
    c.fm_ce_se         = fm_ce_se;
    c.imm              = imm_be;
    sw_test_wqe_put(q, 0, &c, sizeof(c));
}

static inline void sw_test_raddr(sw_test_qp_t *q, unsigned unit, uint64_t raddr,
                                 uint32_t rkey)
{
    struct mlx5_wqe_raddr_seg r;

    memset(&r, 0, sizeof(r));
    r.raddr = htobe64(raddr);
    r.rkey  = htobe32(rkey);
    sw_test_wqe_put(q, unit, &r, sizeof(r));
}

static inline void sw_test_dseg(sw_test_qp_t *q, unsigned unit,
                                const void *addr, uint32_t len, uint32_t lkey)
{
    struct mlx5_wqe_data_seg d;

    d.byte_count = htobe32(len);
    d.lkey       = htobe32(lkey);
    d.addr       = htobe64((uintptr_t)addr);
    sw_test_wqe_put(q, unit, &d, sizeof(d));
}

/* Inline segment; returns the number of 16-byte units it takes. */
static inline unsigned sw_test_inline(sw_test_qp_t *q, unsigned unit,
                                      const void *data, uint32_t len)
{
    uint8_t buf[1024];
    uint32_t bc    = htobe32(len | MLX5_INLINE_SEG);
    unsigned units = (4 + len + 15) / 16;

    memset(buf, 0, units * 16);
    memcpy(buf, &bc, 4);
    memcpy(buf + 4, data, len);
    sw_test_wqe_put(q, unit, buf, units * 16);
    return units;
}

static inline void sw_test_atomic(sw_test_qp_t *q, unsigned unit,
                                  uint64_t swap_add, uint64_t compare)
{
    struct mlx5_wqe_atomic_seg a;

    a.swap_add = htobe64(swap_add);
    a.compare  = htobe64(compare);
    sw_test_wqe_put(q, unit, &a, sizeof(a));
}

/* Advance the producer index past a WQE of @a ds units and ring. Returns
 * the WQE's index (its wqe_counter). */
static inline uint16_t sw_test_ring(sw_test_qp_t *q, unsigned ds)
{
    uint16_t idx = q->sq_pi;
    uint64_t ctrl;

    q->sq_pi += (ds * 16 + 63) / 64;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    q->dv.dbrec[MLX5_SND_DBR] = htobe32(q->sq_pi);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    /* The 8-byte doorbell write of the ctrl segment's first bytes. */
    memcpy(&ctrl, sw_test_bb(q, idx), sizeof(ctrl));
    memcpy((uint8_t *)q->dv.bf.reg + q->bf_off, &ctrl, sizeof(ctrl));
    q->bf_off ^= q->dv.bf.size;
    return idx;
}

/* A masked (extended) atomic WQE as a ConnectX takes it: ctrl with opmod
 * @a opmod, raddr, operands big-endian in @a size bytes (MASKED_CS: swap,
 * compare, swap_mask, compare_mask; MASKED_FA: add, field boundary), one
 * data segment of @a res_len bytes; @a ds as given (the right one is 4, or 5
 * for an 8-byte MASKED_CS). Rings; returns the WQE's index. */
static inline uint16_t
sw_test_masked(sw_test_qp_t *q, uint8_t opcode, uint8_t opmod, unsigned size,
               unsigned ds, uint64_t raddr, uint32_t rkey, uint64_t swap_add,
               uint64_t compare, uint64_t swap_mask, uint64_t compare_mask,
               void *res, uint32_t res_len, uint32_t lkey)
{
    const uint64_t v[4] = {swap_add, compare, swap_mask, compare_mask};
    uint8_t ops[32];
    unsigned i, j, n;

    memset(ops, 0, sizeof(ops));
    n = (opcode == MLX5_OPCODE_ATOMIC_MASKED_CS) ? 4 : 2;
    for (i = 0; i < n; ++i) {
        for (j = 0; j < size; ++j) {
            ops[i * size + j] = (uint8_t)(v[i] >> (8 * (size - 1 - j)));
        }
    }
    sw_test_ctrl(q, opcode, ds, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_bb(q, q->sq_pi)[0] = opmod;
    sw_test_raddr(q, 1, raddr, rkey);
    sw_test_wqe_put(q, 2, ops, 16 * (ds - 3));
    sw_test_dseg(q, ds - 1, res, res_len, lkey);
    return sw_test_ring(q, ds);
}

/* The right opmod and ds of a masked atomic on @a size bytes. */
#define SW_TEST_EXT_OPMOD(_size) (((_size) == 8) ? 0x9 : 0x8)
#define SW_TEST_EXT_DS(_op, _size) \
    ((((_op) == MLX5_OPCODE_ATOMIC_MASKED_CS) && ((_size) == 8)) ? 5 : 4)

static inline void sw_test_post_recv(sw_test_qp_t *q, const void *addr,
                                     uint32_t len, uint32_t lkey)
{
    struct mlx5_wqe_data_seg *d =
        (void *)((uint8_t *)q->dv.rq.buf +
                 (size_t)(q->rq_pi & (q->dv.rq.wqe_cnt - 1)) * q->dv.rq.stride);
    unsigned nseg = q->dv.rq.stride / sizeof(*d), i;

    d[0].byte_count = htobe32(len);
    d[0].lkey       = htobe32(lkey);
    d[0].addr       = htobe64((uintptr_t)addr);
    for (i = 1; i < nseg; ++i) {
        d[i].byte_count = 0;
        d[i].lkey       = htobe32(MLX5_INVALID_LKEY);
        d[i].addr       = 0;
    }
    ++q->rq_pi;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    q->dv.dbrec[MLX5_RCV_DBR] = htobe32(q->rq_pi);
}

/* Posts at the SRQ's list head as rdma-core does; returns the WQE index. */
static inline uint16_t sw_test_srq_post(sw_test_srq_t *s, const void *addr,
                                        uint32_t len, uint32_t lkey)
{
    uint16_t idx = (uint16_t)s->dv.head;
    uint8_t *wqe = (uint8_t *)s->dv.buf + (size_t)idx * s->dv.stride;
    struct mlx5_wqe_srq_next_seg *next = (void *)wqe;
    struct mlx5_wqe_data_seg *d        = (void *)(wqe + sizeof(*next));
    unsigned nseg = (s->dv.stride - sizeof(*next)) / sizeof(*d), i;

    d[0].byte_count = htobe32(len);
    d[0].lkey       = htobe32(lkey);
    d[0].addr       = htobe64((uintptr_t)addr);
    for (i = 1; i < nseg; ++i) {
        d[i].lkey = htobe32(MLX5_INVALID_LKEY);
    }
    s->dv.head = be16toh(next->next_wqe_index);
    ++s->counter;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    *s->dv.dbrec = htobe32(s->counter);
    return idx;
}

/* Returns the SRQ entry to the free list (rdma-core's free_srq_wqe). */
static inline void sw_test_srq_free(sw_test_srq_t *s, uint16_t idx)
{
    struct mlx5_wqe_srq_next_seg *tail =
        (void *)((uint8_t *)s->dv.buf + (size_t)s->dv.tail * s->dv.stride);

    tail->next_wqe_index = htobe16(idx);
    s->dv.tail           = idx;
}

/* Next valid CQE or NULL; checks the owner bit like a ConnectX consumer. */
static inline struct mlx5_cqe64 *sw_test_cq_peek(sw_test_cq_t *c)
{
    struct mlx5_cqe64 *cqe =
        (struct mlx5_cqe64 *)c->dv.buf + (c->ci & (c->dv.cqe_cnt - 1));
    uint8_t op_own = __atomic_load_n(&cqe->op_own, __ATOMIC_ACQUIRE);

    if (((op_own >> 4) == MLX5_CQE_INVALID) ||
        ((op_own & MLX5_CQE_OWNER_MASK) != !!(c->ci & c->dv.cqe_cnt))) {
        return NULL;
    }
    return cqe;
}

static inline void sw_test_cq_pop(sw_test_cq_t *c)
{
    ++c->ci;
    c->dv.dbrec[0] = htobe32(c->ci & 0xffffff);
}

static inline uint64_t sw_test_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Progresses @a devs until a CQE is on @a c (copied to @a out); 0 on
 * success, -1 after @a ms milliseconds. Yields: two cores only. */
static inline int sw_test_poll(vqp_sw_dev_t **devs, unsigned n_devs,
                               sw_test_cq_t *c, struct mlx5_cqe64 *out,
                               unsigned ms)
{
    uint64_t end = sw_test_now_ms() + ms;
    struct mlx5_cqe64 *cqe;
    unsigned i;

    memset(out, 0, sizeof(*out));
    for (;;) {
        cqe = sw_test_cq_peek(c);
        if (cqe != NULL) {
            *out = *cqe;
            sw_test_cq_pop(c);
            return 0;
        }
        if (sw_test_now_ms() > end) {
            return -1;
        }
        for (i = 0; i < n_devs; ++i) {
            vqp_sw_progress(devs[i]);
        }
        sched_yield();
    }
}

static inline uint8_t sw_test_cqe_opcode(const struct mlx5_cqe64 *cqe)
{
    return cqe->op_own >> 4;
}

static inline uint8_t sw_test_cqe_synd(const struct mlx5_cqe64 *cqe)
{
    return ((const struct mlx5_err_cqe *)cqe)->syndrome;
}

static inline uint32_t sw_test_cqe_qpn(const struct mlx5_cqe64 *cqe)
{
    return be32toh(cqe->sop_drop_qpn) & 0xffffff;
}

static inline ucs_status_t sw_test_cq_create(vqp_sw_dev_t *dev, uint32_t n,
                                             sw_test_cq_t *c)
{
    memset(c, 0, sizeof(*c));
    return vqp_sw_cq_create(dev, n, &c->cq, &c->dv);
}

static inline ucs_status_t
sw_test_qp_create(vqp_sw_dev_t *dev, sw_test_cq_t *scq, sw_test_cq_t *rcq,
                  sw_test_srq_t *srq, uint32_t sq, uint32_t rq,
                  uint32_t max_inline, sw_test_qp_t *q)
{
    vqp_sw_qp_init_attr_t attr;

    memset(q, 0, sizeof(*q));
    memset(&attr, 0, sizeof(attr));
    attr.send_cq         = scq->cq;
    attr.recv_cq         = rcq->cq;
    attr.srq             = srq ? srq->srq : NULL;
    attr.max_send_wr     = sq;
    attr.max_recv_wr     = rq;
    attr.max_recv_sge    = rq ? 2 : 0;
    attr.max_inline_data = max_inline;
    return vqp_sw_qp_create(dev, &attr, &q->qp, &q->dv, &q->qpn);
}

/* RESET -> INIT -> RTR -> RTS towards (peer, peer_qpn). */
static inline ucs_status_t
sw_test_qp_connect(sw_test_qp_t *q, const vqp_sw_dev_addr_t *peer,
                   uint32_t peer_qpn, unsigned access, uint8_t rnr_retry,
                   uint8_t retry_cnt)
{
    vqp_sw_qp_attr_t a;
    ucs_status_t status;

    memset(&a, 0, sizeof(a));
    a.qp_state        = IBV_QPS_INIT;
    a.qp_access_flags = access;
    status            = vqp_sw_qp_modify(q->qp, &a);
    if (status != UCS_OK) {
        return status;
    }
    a.qp_state      = IBV_QPS_RTR;
    a.dest_dev      = *peer;
    a.dest_qp_num   = peer_qpn;
    a.min_rnr_timer = 1; /* 10 us: keeps RNR tests short */
    status          = vqp_sw_qp_modify(q->qp, &a);
    if (status != UCS_OK) {
        return status;
    }
    a.qp_state  = IBV_QPS_RTS;
    a.timeout   = 8; /* ~1 ms */
    a.retry_cnt = retry_cnt;
    a.rnr_retry = rnr_retry;
    return vqp_sw_qp_modify(q->qp, &a);
}

/* Captured warnings/errors, so tests check the log line of each rule. */
static char sw_test_log_buf[8192];

static inline ucs_log_func_rc_t
sw_test_log_handler(const char *file, unsigned line, const char *function,
                    ucs_log_level_t level,
                    const ucs_log_component_config_t *comp_conf,
                    const char *message, va_list ap)
{
    size_t used = strlen(sw_test_log_buf);

    if (level > UCS_LOG_LEVEL_WARN) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    if (used + 2 < sizeof(sw_test_log_buf)) {
        vsnprintf(sw_test_log_buf + used, sizeof(sw_test_log_buf) - used - 1,
                  message, ap);
        strcat(sw_test_log_buf, "\n");
    }
    return UCS_LOG_FUNC_RC_STOP;
}

/* Non-zero if the captured log contains @a text; clears the capture. */
static inline int sw_test_log_has(const char *text)
{
    int found = strstr(sw_test_log_buf, text) != NULL;

    if (!found) {
        fprintf(stderr, "log '%s' lacks '%s'\n", sw_test_log_buf, text);
    }
    sw_test_log_buf[0] = '\0';
    return found;
}

#define SW_TEST_ACCESS_ALL                              \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

#endif
