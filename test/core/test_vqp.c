/*
 * Multi-QP core over the software device: two virtual QPs in one process on
 * two device instances (two "hosts"), connected to each other. Data
 * integrity, one completion per operation in posting order, notifications
 * with the user's immediate data under SPRAY and DQPLB, backpressure, QP
 * failure with replay, total failure, teardown with operations in flight,
 * the DQPLB reorder window, and every error path of the API.
 */
#include <config.h>

#include "../../src/core/vqp_int.h"

#include <ucs/arch/bitops.h>
#include <ucs/sys/math.h>
#include "../dev/test_dev_log.h"

#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#define BUF_SIZE (8u << 20)
#define MAX_WCS  4096

typedef struct side {
    vqp_dev_t *dev;
    vqp_cq_t *cq;
    vqp_t *vqp;
    char *buf;
    vqp_dev_mr_t *mr;
    uint32_t lkey;
    uint32_t rkey;
    vqp_wc_t wcs[MAX_WCS];
    unsigned nwcs;
} side_t;

typedef struct pair {
    side_t a;
    side_t b;
} pair_t;

/* CQ entries of the sides opened next (0: the default). */
static uint32_t side_cq_entries;

static void side_open(side_t *s)
{
    vqp_cq_params_t cqp;

    memset(s, 0, sizeof(*s));
    assert_int_equal(vqp_dev_open(VQP_DEV_SW_NAME, NULL, &s->dev), UCS_OK);
    vqp_cq_params_default(&cqp);
    cqp.devs[0]  = s->dev;
    cqp.num_devs = 1;
    if (side_cq_entries != 0) {
        cqp.cqe = side_cq_entries;
    }
    assert_int_equal(vqp_cq_create(&cqp, &s->cq), UCS_OK);
    s->buf = aligned_alloc(4096, BUF_SIZE);
    assert_non_null(s->buf);
    assert_int_equal(
        vqp_dev_mr_reg(s->dev, s->buf, BUF_SIZE,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
                       &s->mr, &s->lkey, &s->rkey),
        UCS_OK);
}

static void side_close(side_t *s)
{
    if (s->vqp != NULL) {
        vqp_destroy(s->vqp);
    }
    assert_int_equal(vqp_cq_destroy(s->cq), UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(s->mr), UCS_OK);
    assert_int_equal(vqp_dev_close(s->dev), UCS_OK);
    free(s->buf);
}

static void pair_create(pair_t *p, const vqp_params_t *tmpl)
{
    vqp_params_t params = *tmpl;
    char addr_a[2048], addr_b[2048];
    size_t len_a, len_b;

    side_open(&p->a);
    side_open(&p->b);
    params.cq = p->a.cq;
    assert_int_equal(vqp_create(&params, &p->a.vqp), UCS_OK);
    params.cq = p->b.cq;
    assert_int_equal(vqp_create(&params, &p->b.vqp), UCS_OK);
    assert_true(vqp_address_size(p->a.vqp) <= sizeof(addr_a));
    assert_int_equal(vqp_address_pack(p->a.vqp, addr_a, sizeof(addr_a), &len_a),
                     UCS_OK);
    assert_int_equal(len_a, vqp_address_size(p->a.vqp));
    assert_int_equal(vqp_address_pack(p->b.vqp, addr_b, sizeof(addr_b), &len_b),
                     UCS_OK);
    assert_int_equal(vqp_connect(p->a.vqp, addr_b, len_b), UCS_OK);
    assert_int_equal(vqp_connect(p->b.vqp, addr_a, len_a), UCS_OK);
}

static void pair_destroy(pair_t *p)
{
    side_close(&p->a);
    side_close(&p->b);
}

/* Progress both sides, collecting completions, until @a a_want and
 * @a b_want completions arrived (or a generous step budget ran out). */
static void pair_wait(pair_t *p, unsigned a_want, unsigned b_want)
{
    unsigned steps;

    for (steps = 0; steps < 2000000; ++steps) {
        p->a.nwcs +=
            vqp_cq_poll(p->a.cq, p->a.wcs + p->a.nwcs, MAX_WCS - p->a.nwcs);
        p->b.nwcs +=
            vqp_cq_poll(p->b.cq, p->b.wcs + p->b.nwcs, MAX_WCS - p->b.nwcs);
        if ((p->a.nwcs >= a_want) && (p->b.nwcs >= b_want)) {
            return;
        }
        if ((steps & 63) == 63) {
            sched_yield();
        }
    }
    fail_msg("timeout: side a %u/%u completions, side b %u/%u", p->a.nwcs,
             a_want, p->b.nwcs, b_want);
}

/* Progress for a while without expecting anything (no more completions). */
static void pair_idle(pair_t *p, unsigned steps)
{
    while (steps-- > 0) {
        p->a.nwcs +=
            vqp_cq_poll(p->a.cq, p->a.wcs + p->a.nwcs, MAX_WCS - p->a.nwcs);
        p->b.nwcs +=
            vqp_cq_poll(p->b.cq, p->b.wcs + p->b.nwcs, MAX_WCS - p->b.nwcs);
    }
}

static vqp_send_wr_t make_wr(side_t *src, side_t *dst, vqp_opcode_t opcode,
                             uint64_t wr_id, uint64_t loff, uint64_t roff,
                             uint64_t length)
{
    vqp_send_wr_t wr = {0};

    wr.wr_id       = wr_id;
    wr.opcode      = opcode;
    wr.flags       = VQP_SEND_SIGNALED;
    wr.local_addr  = (uintptr_t)src->buf + loff;
    wr.length      = length;
    wr.remote_addr = (uintptr_t)dst->buf + roff;
    wr.lkey[0]     = src->lkey;
    wr.rkey[0]     = dst->rkey;
    return wr;
}

static void fill_pattern(char *buf, size_t len, unsigned seed)
{
    size_t i;

    for (i = 0; i < len; ++i) {
        buf[i] = (char)(i * 31 + seed * 7 + (i >> 12));
    }
}

static vqp_params_t base_params(unsigned num_qps, vqp_lb_t lb)
{
    vqp_params_t params;

    vqp_params_default(&params);
    params.num_qps          = num_qps;
    params.lb               = lb;
    params.frag_size        = 64 * 1024;
    params.stripe_threshold = 32 * 1024;
    params.max_outstanding  = 8;
    params.max_ops          = 256;
    params.max_recvs        = 64;
    return params;
}

static void check_in_order(const side_t *s, unsigned count, uint64_t first_id)
{
    unsigned i;

    assert_int_equal(s->nwcs, count);
    for (i = 0; i < count; ++i) {
        assert_int_equal(s->wcs[i].status, UCS_OK);
        assert_int_equal(s->wcs[i].wr_id, first_id + i);
    }
}

/* Writes of many sizes (below / above the threshold, not multiples of the
 * fragment size, zero) complete once each, in order, with the data. */
static void run_writes(unsigned num_qps, vqp_lb_t lb)
{
    static const uint64_t sizes[] = {
        0, 1, 4095, 32 * 1024, 65536, 65537, 200000, 1u << 20, (3u << 20) + 17};
    vqp_params_t params = base_params(num_qps, lb);
    uint64_t off        = 0;
    vqp_send_wr_t wr;
    unsigned i, n = ucs_static_array_size(sizes);
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, BUF_SIZE, num_qps + lb);
    memset(p.b.buf, 0, BUF_SIZE);
    for (i = 0; i < n; ++i) {
        wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 100 + i, off, off, sizes[i]);
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
        off += sizes[i];
    }
    pair_wait(&p, n, 0);
    check_in_order(&p.a, n, 100);
    assert_memory_equal(p.a.buf, p.b.buf, off);
    assert_int_equal(p.b.nwcs, 0); /* plain writes never notify */
    pair_idle(&p, 100);
    assert_int_equal(p.a.nwcs, n); /* exactly once */
    pair_destroy(&p);
}

static void test_write_1qp(void **state)
{
    run_writes(1, VQP_LB_DQPLB);
}

static void test_write_4qp_dqplb(void **state)
{
    run_writes(4, VQP_LB_DQPLB);
}

static void test_write_16qp_spray(void **state)
{
    run_writes(16, VQP_LB_SPRAY);
}

/* The data QPs' fragment rings share one array, a column each (the send QP
 * keeps its own ring): the layout, and rings that wrap many times with
 * every QP at once (any record written into another QP's column loses a
 * completion). */
static void run_shared_frag_rings(unsigned num_qps, vqp_lb_t lb)
{
    const unsigned ops = 150, op_len = 7 * 4096 + 5;
    vqp_params_t params = base_params(num_qps, lb);
    unsigned first, count, i;
    const vqp_pqp_t *pqp;
    vqp_send_wr_t wr;
    vqp_stats_t stats;
    vqp_t *vqp;
    pair_t p;

    params.frag_size        = 4096;
    params.stripe_threshold = 4096;
    pair_create(&p, &params);
    vqp   = p.a.vqp;
    first = (vqp->send_qp == &vqp->qps[0]) ? 1 : 0; /* SPRAY: QP 0 sends */
    count = num_qps - first;
    for (i = 0; i < vqp->num_pqps; ++i) {
        pqp = &vqp->qps[i];
        if ((count >= 2) && (i >= first) && (i < num_qps)) {
            assert_ptr_equal(pqp->frags, vqp->data_frags + (i - first));
            assert_int_equal(pqp->frag_mask, vqp->data_frag_mask);
            assert_int_equal(
                pqp->frag_shift,
                ucs_ilog2(ucs_roundup_pow2(count) * sizeof(vqp_frag_t)));
        } else {
            assert_int_equal(pqp->frag_shift, ucs_ilog2(sizeof(vqp_frag_t)));
            assert_true(
                (vqp->data_frags == NULL) || (pqp->frags < vqp->data_frags) ||
                (pqp->frags >=
                 vqp->data_frags + ((vqp->data_frag_mask + 1)
                                    << (vqp->data_frag_shift -
                                        ucs_ilog2(sizeof(vqp_frag_t))))));
        }
    }
    assert_true((count >= 2) == (vqp->data_frags != NULL));
    if (count >= 2) {
        assert_int_equal(vqp->data_frag_mask + 1, params.max_outstanding);
    }

    fill_pattern(p.a.buf, BUF_SIZE, num_qps * 7 + lb);
    memset(p.b.buf, 0, BUF_SIZE);
    for (i = 0; i < ops; ++i) {
        wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1000 + i, (uint64_t)i * op_len,
                     (uint64_t)i * op_len, op_len);
        assert_int_equal(vqp_post_send(vqp, &wr), UCS_OK);
    }
    pair_wait(&p, ops, 0);
    check_in_order(&p.a, ops, 1000);
    assert_memory_equal(p.a.buf, p.b.buf, (size_t)ops * op_len);
    vqp_query_stats(vqp, &stats);
    assert_int_equal(stats.frags_posted, ops * 8); /* 8 fragments each */
    pair_destroy(&p);
}

static void test_shared_frag_rings(void **state)
{
    run_shared_frag_rings(2, VQP_LB_SPRAY); /* one data QP: own rings only */
    run_shared_frag_rings(2, VQP_LB_DQPLB);
    run_shared_frag_rings(3, VQP_LB_SPRAY);
    run_shared_frag_rings(5, VQP_LB_DQPLB); /* rows of 8 records, 5 used */
    run_shared_frag_rings(6, VQP_LB_SPRAY);
}

static void test_read_striped(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_SPRAY);
    vqp_send_wr_t wr;
    vqp_stats_t stats;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.b.buf, BUF_SIZE, 3);
    memset(p.a.buf, 0, BUF_SIZE);
    wr = make_wr(&p.a, &p.b, VQP_OP_READ, 7, 0, 0, (2u << 20) + 123);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_READ, 8, 4u << 20, 4u << 20, 1000);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 2, 0);
    check_in_order(&p.a, 2, 7);
    assert_memory_equal(p.a.buf, p.b.buf, (2u << 20) + 123);
    assert_memory_equal(p.a.buf + (4u << 20), p.b.buf + (4u << 20), 1000);
    vqp_query_stats(p.a.vqp, &stats);
    /* 2 MiB + 123 in 64 KiB fragments, plus the small one on one QP. */
    assert_int_equal(stats.frags_posted, 33 + 1);
    pair_destroy(&p);
}

/* WRITE_IMM: one notification per operation at the receiver, in order,
 * with the user's immediate data and the data in place. */
static void run_write_imm(unsigned num_qps, vqp_lb_t lb)
{
    vqp_params_t params = base_params(num_qps, lb);
    const unsigned n    = 20;
    vqp_recv_wr_t rwr   = {0};
    uint64_t len, off = 0;
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, BUF_SIZE, 11);
    memset(p.b.buf, 0, BUF_SIZE);
    for (i = 0; i < n; ++i) {
        rwr.wr_id = 500 + i;
        assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_OK);
    }
    for (i = 0; i < n; ++i) {
        len    = (i % 3 == 0) ? 0 : (i * 37777) % (300 * 1024);
        wr     = make_wr(&p.a, &p.b, VQP_OP_WRITE_IMM, i, off, off, len);
        wr.imm = 0xabc00000u + i;
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
        off += len;
    }
    pair_wait(&p, n, n);
    check_in_order(&p.a, n, 0);
    for (i = 0; i < n; ++i) {
        assert_int_equal(p.b.wcs[i].status, UCS_OK);
        assert_int_equal(p.b.wcs[i].opcode, VQP_OP_RECV_NOTIFY);
        assert_int_equal(p.b.wcs[i].wr_id, 500 + i);
        /* nothing went into the slot (one QP: the WRITE_IMM's receive) */
        assert_int_equal(p.b.wcs[i].byte_len, 0);
        assert_true(p.b.wcs[i].flags & VQP_WC_WITH_IMM);
        assert_int_equal(p.b.wcs[i].imm, 0xabc00000u + i);
    }
    assert_memory_equal(p.a.buf, p.b.buf, off);
    pair_destroy(&p);
}

static void test_write_imm_dqplb(void **state)
{
    run_write_imm(4, VQP_LB_DQPLB);
}

static void test_write_imm_spray(void **state)
{
    run_write_imm(8, VQP_LB_SPRAY);
}

static void test_write_imm_1qp(void **state)
{
    run_write_imm(1, VQP_LB_SPRAY);
}

/* Notifications that arrive before the user posted slots wait for them. */
static void test_notify_before_recv(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_recv_wr_t rwr   = {0};
    vqp_send_wr_t wr;
    pair_t p;

    pair_create(&p, &params);
    wr     = make_wr(&p.a, &p.b, VQP_OP_WRITE_IMM, 1, 0, 0, 100000);
    wr.imm = 42;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    pair_idle(&p, 200);
    assert_int_equal(p.b.nwcs, 0);
    rwr.wr_id = 9;
    assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_OK);
    pair_wait(&p, 1, 1);
    assert_int_equal(p.b.wcs[0].wr_id, 9);
    assert_int_equal(p.b.wcs[0].imm, 42);
    pair_destroy(&p);
}

static void run_send_recv(unsigned num_qps, vqp_lb_t lb)
{
    vqp_params_t params = base_params(num_qps, lb);
    vqp_recv_wr_t rwr   = {0};
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, 65536, 5);
    for (i = 0; i < 4; ++i) {
        rwr.wr_id   = 70 + i;
        rwr.addr    = (uintptr_t)p.b.buf + i * 8192;
        rwr.length  = 8192;
        rwr.lkey[0] = p.b.lkey;
        assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_OK);
    }
    for (i = 0; i < 4; ++i) {
        wr     = make_wr(&p.a, &p.b, (i & 1) ? VQP_OP_SEND_IMM : VQP_OP_SEND, i,
                         i * 8192, 0, 1000 * (i + 1));
        wr.imm = 0x1234 + i;
        if (i == 0) {
            wr.flags |= VQP_SEND_INLINE;
            wr.length = 40;
        }
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    pair_wait(&p, 4, 4);
    check_in_order(&p.a, 4, 0);
    for (i = 0; i < 4; ++i) {
        assert_int_equal(p.b.wcs[i].status, UCS_OK);
        assert_int_equal(p.b.wcs[i].opcode, VQP_OP_RECV);
        assert_int_equal(p.b.wcs[i].wr_id, 70 + i);
        assert_int_equal(p.b.wcs[i].byte_len, (i == 0) ? 40 : 1000 * (i + 1));
        assert_memory_equal(p.b.buf + i * 8192, p.a.buf + i * 8192,
                            p.b.wcs[i].byte_len);
        if (i & 1) {
            assert_true(p.b.wcs[i].flags & VQP_WC_WITH_IMM);
            assert_int_equal(p.b.wcs[i].imm, 0x1234 + i);
        }
    }
    pair_destroy(&p);
}

static void test_send_recv_dqplb(void **state)
{
    run_send_recv(4, VQP_LB_DQPLB);
}

static void test_send_recv_spray(void **state)
{
    run_send_recv(4, VQP_LB_SPRAY);
}

static void test_send_recv_1qp(void **state)
{
    run_send_recv(1, VQP_LB_DQPLB);
}

/* Messages both ways, each side answering what it received (ping-pong). */
static void test_ping_pong_1qp(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    vqp_recv_wr_t rwr   = {0};
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    pair_create(&p, &params);
    for (i = 0; i < 8; ++i) {
        rwr.wr_id   = i;
        rwr.addr    = (uintptr_t)p.b.buf + i * 64;
        rwr.length  = 64;
        rwr.lkey[0] = p.b.lkey;
        assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_OK);
        rwr.addr    = (uintptr_t)p.a.buf + i * 64;
        rwr.lkey[0] = p.a.lkey;
        assert_int_equal(vqp_post_recv(p.a.vqp, &rwr), UCS_OK);
    }
    for (i = 0; i < 8; ++i) {
        wr       = make_wr(&p.a, &p.b, VQP_OP_SEND_IMM, i, 4096, 0, 8);
        wr.flags = VQP_SEND_INLINE;
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
        pair_wait(&p, i, i + 1);
        wr       = make_wr(&p.b, &p.a, VQP_OP_SEND_IMM, i, 4096, 0, 8);
        wr.flags = VQP_SEND_INLINE;
        assert_int_equal(vqp_post_send(p.b.vqp, &wr), UCS_OK);
        pair_wait(&p, i + 1, i + 1);
    }
    pair_destroy(&p);
}

/* More receives than the 16-bit RQ counters count: reposting keeps working
 * across the wrap (it once stopped at 65536). */
static void test_rq_counter_wrap(void **state)
{
    vqp_params_t params  = base_params(1, VQP_LB_DQPLB);
    const unsigned total = 70000, batch = 32;
    vqp_recv_wr_t rwr = {0};
    unsigned sent = 0, done = 0, i;
    vqp_send_wr_t wr;
    pair_t p;

    pair_create(&p, &params);
    rwr.addr    = (uintptr_t)p.b.buf;
    rwr.length  = 64;
    rwr.lkey[0] = p.b.lkey;
    for (i = 0; i < params.max_recvs; ++i) {
        assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_OK);
    }
    while (done < total) {
        for (i = 0; (i < batch) && (sent < total); ++i, ++sent) {
            wr = make_wr(&p.a, &p.b, VQP_OP_SEND, sent, 0, 0, 8);
            wr.flags |= VQP_SEND_INLINE;
            assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
        }
        pair_wait(&p, 0, sent - done);
        for (i = 0; i < p.b.nwcs; ++i) {
            assert_int_equal(p.b.wcs[i].status, UCS_OK);
            assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_OK);
        }
        done += p.b.nwcs;
        p.b.nwcs = 0;
        p.a.nwcs = 0;
    }
    assert_int_equal(done, total);
    pair_destroy(&p);
}

static void test_atomics(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    uint64_t *remote, *result;
    vqp_send_wr_t wr;
    pair_t p;

    pair_create(&p, &params);
    remote         = (uint64_t *)(p.b.buf + 4096);
    result         = (uint64_t *)(p.a.buf + 4096);
    *remote        = 1000;
    wr             = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_FA, 1, 4096, 4096, 8);
    wr.compare_add = 5;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    assert_int_equal(*result, 1000); /* host order for the user */
    assert_int_equal(*remote, 1005);

    wr             = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_CS, 2, 4096, 4096, 8);
    wr.compare_add = 1005;
    wr.swap        = 77;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr.wr_id = 3; /* compare fails now: value unchanged */
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 3, 0);
    check_in_order(&p.a, 3, 1);
    assert_int_equal(*remote, 77);
    assert_int_equal(*result, 77);
    pair_destroy(&p);
}

/* Every atomic on 8 and 4 bytes, all in flight at once (each returns into
 * its own buffer), over every layout: results in host order, 4-byte ones
 * writing only 4 bytes; the targets' final values; a 4-byte atomic leaves
 * the other half of its 8-byte word alone. */
static void run_atomics_ext(unsigned num_qps, vqp_lb_t lb)
{
    static const vqp_opcode_t ops[] = {VQP_OP_ATOMIC_FA,  VQP_OP_ATOMIC_CS,
                                       VQP_OP_ATOMIC_CS,  VQP_OP_ATOMIC_SWAP,
                                       VQP_OP_ATOMIC_AND, VQP_OP_ATOMIC_OR,
                                       VQP_OP_ATOMIC_XOR};
    /* Operands and, for CS, the swap value: the first CS misses. */
    static const uint64_t arg[]  = {0x0000000100000003ull, 0x1234,
                                    0x0000000100000001ull, 0xf0f0f0f0f0f0f0f0ull,
                                    0xff00ff00ff00ff00ull, 0x0000000f0000000full,
                                    0xffffffffffffffffull};
    static const uint64_t swap[] = {0, 77, 0x8000000080000000ull, 0, 0, 0, 0};
    vqp_params_t params          = base_params(num_qps, lb);
    const unsigned n             = sizeof(ops) / sizeof(ops[0]);
    uint64_t *r64, *t64, expect, old, v;
    uint32_t *r32, *t32, e32, o32, v32;
    unsigned i;
    vqp_send_wr_t wr;
    pair_t p;

    pair_create(&p, &params);
    t64    = (uint64_t *)(p.b.buf + 4096);
    t32    = (uint32_t *)(p.b.buf + 4104);
    r64    = (uint64_t *)(p.a.buf + 4096);
    r32    = (uint32_t *)(p.a.buf + 8192);
    *t64   = 0xfffffffffffffffeull;
    t32[0] = 0xfffffffe;
    t32[1] = 0x5a5a5a5a;
    memset(r32, 0xee, 2 * n * sizeof(*r32));
    for (i = 0; i < n; ++i) {
        wr             = make_wr(&p.a, &p.b, ops[i], i, 4096 + 8 * i, 4096, 8);
        wr.compare_add = arg[i];
        wr.swap        = swap[i];
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
        wr = make_wr(&p.a, &p.b, ops[i], n + i, 8192 + 8 * i, 4104, 4);
        wr.compare_add = arg[i];
        wr.swap        = swap[i];
        if (ops[i] == VQP_OP_ATOMIC_CS) {
            /* 4-byte compare values: the first misses, the second hits */
            wr.compare_add = (i == 1) ? 0x1234 : 0x00000001;
        }
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    pair_wait(&p, 2 * n, 0);
    for (i = 0; i < 2 * n; ++i) {
        assert_int_equal(p.a.wcs[i].status, UCS_OK);
        assert_int_equal(p.a.wcs[i].wr_id, (i % 2) ? n + i / 2 : i / 2);
        assert_int_equal(p.a.wcs[i].opcode, ops[i / 2]);
    }
    /* The same sequence on a local copy gives the expected values. */
    expect = 0xfffffffffffffffeull;
    e32    = 0xfffffffe;
    for (i = 0; i < n; ++i) {
        old = expect;
        o32 = e32;
        v   = arg[i];
        v32 = (uint32_t)v;
        switch (ops[i]) {
        case VQP_OP_ATOMIC_FA:
            expect += v;
            e32 += v32;
            break;
        case VQP_OP_ATOMIC_CS:
            expect = (expect == v) ? swap[i] : expect;
            v32    = (i == 1) ? 0x1234 : 0x00000001;
            e32    = (e32 == v32) ? (uint32_t)swap[i] : e32;
            break;
        case VQP_OP_ATOMIC_SWAP:
            expect = v;
            e32    = v32;
            break;
        case VQP_OP_ATOMIC_AND:
            expect &= v;
            e32 &= v32;
            break;
        case VQP_OP_ATOMIC_OR:
            expect |= v;
            e32 |= v32;
            break;
        default:
            expect ^= v;
            e32 ^= v32;
            break;
        }
        assert_int_equal(r64[i], old);
        assert_int_equal(r32[2 * i], o32);
        assert_int_equal(r32[2 * i + 1], 0xeeeeeeee);
    }
    /* The chain went through both CS outcomes (the second swapped). */
    assert_int_equal(r64[2], 0x0000000100000001ull);
    assert_int_equal(r64[3], 0x8000000080000000ull);
    assert_int_equal(r32[4], 0x00000001);
    assert_int_equal(r32[6], 0x80000000);
    assert_int_equal(*t64, expect);
    assert_int_equal(t32[0], e32);
    assert_int_equal(t32[1], 0x5a5a5a5a);
    assert_int_equal(*t64, 0x0fff0ff00fff0ff0ull);
    assert_int_equal(e32, 0x0fff0ff0);
    pair_destroy(&p);
}

/* A device that returns 8-byte fetched values in host order (a ConnectX in
 * host-endianness mode, modelled by VQP_SW_ATOMIC_REPLY=host): the user
 * still gets the right values, 8 and 4 bytes. */
static void test_atomics_host_order(void **state)
{
    vqp_params_t params = base_params(2, VQP_LB_DQPLB);
    uint64_t *remote, *result;
    uint32_t *r32, *res32;
    vqp_dev_attr_t attr;
    vqp_send_wr_t wr;
    pair_t p;

    setenv("VQP_SW_ATOMIC_REPLY", "host", 1);
    pair_create(&p, &params);
    unsetenv("VQP_SW_ATOMIC_REPLY");
    vqp_dev_query(p.a.dev, &attr);
    assert_int_equal(attr.atomic_be_sizes, sizeof(uint32_t));
    remote         = (uint64_t *)(p.b.buf + 4096);
    result         = (uint64_t *)(p.a.buf + 4096);
    *remote        = 0x0102030405060708ull;
    wr             = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_FA, 1, 4096, 4096, 8);
    wr.compare_add = 1;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    assert_int_equal(*result, 0x0102030405060708ull);
    assert_int_equal(*remote, 0x0102030405060709ull);

    r32            = (uint32_t *)(p.b.buf + 8192);
    res32          = (uint32_t *)(p.a.buf + 8192);
    *r32           = 0x11223344u;
    wr             = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_FA, 2, 8192, 8192, 4);
    wr.compare_add = 2;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 2, 0);
    assert_int_equal(*res32, 0x11223344u);
    assert_int_equal(*r32, 0x11223346u);
    pair_destroy(&p);

    /* Anything else than be or host is refused at open. */
    {
        vqp_dev_t *dev;

        setenv("VQP_SW_ATOMIC_REPLY", "little", 1);
        assert_int_equal(vqp_dev_open(VQP_DEV_SW_NAME, NULL, &dev),
                         UCS_ERR_INVALID_PARAM);
        unsetenv("VQP_SW_ATOMIC_REPLY");
    }
}

static void test_atomics_ext(void **state)
{
    run_atomics_ext(1, VQP_LB_DQPLB);
    run_atomics_ext(4, VQP_LB_DQPLB);
    run_atomics_ext(3, VQP_LB_SPRAY);
}

/* More operations than the QPs can hold: they wait inside and all complete
 * in order; a full operation ring says NO_RESOURCE. */
static void test_backpressure(void **state)
{
    vqp_params_t params = base_params(2, VQP_LB_DQPLB);
    unsigned i, accepted = 0;
    vqp_send_wr_t wr;
    ucs_status_t status;
    pair_t p;

    params.max_outstanding = 2;
    params.max_ops         = 16;
    pair_create(&p, &params);
    fill_pattern(p.a.buf, BUF_SIZE, 9);
    for (i = 0; i < 40; ++i) {
        wr     = make_wr(&p.a, &p.b, VQP_OP_WRITE, i, i * 100000, i * 100000,
                         100000);
        status = vqp_post_send(p.a.vqp, &wr);
        if (status == UCS_ERR_NO_RESOURCE) {
            break;
        }
        assert_int_equal(status, UCS_OK);
        ++accepted;
    }
    assert_int_equal(accepted, 16);
    pair_wait(&p, accepted, 0);
    check_in_order(&p.a, accepted, 0);
    /* Completions not polled yet count: none here, so room again. */
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 99, 0, 0, 10);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, accepted + 1, 0);
    assert_memory_equal(p.a.buf, p.b.buf, accepted * 100000);
    pair_destroy(&p);
}

/* Unsignaled operations report nothing; a flush completes after them. */
static void run_unsignaled_and_flush(unsigned num_qps)
{
    vqp_params_t params = base_params(num_qps, VQP_LB_SPRAY);
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, BUF_SIZE, 1);
    for (i = 0; i < 10; ++i) {
        wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, i, i * 100000, i * 100000,
                     (i & 1) ? 100000 : 64);
        wr.flags = (i & 2) ? VQP_SEND_INLINE : 0;
        if (wr.flags & VQP_SEND_INLINE) {
            wr.length = 64;
        }
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    wr = make_wr(&p.a, &p.b, VQP_OP_FLUSH, 1000, 0, 0, 0);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    assert_int_equal(p.a.wcs[0].wr_id, 1000);
    assert_int_equal(p.a.wcs[0].opcode, VQP_OP_FLUSH);
    for (i = 0; i < 10; ++i) {
        assert_memory_equal(p.a.buf + i * 100000, p.b.buf + i * 100000,
                            (i & 1) && !(i & 2) ? 100000 : 64);
    }
    pair_idle(&p, 100);
    assert_int_equal(p.a.nwcs, 1);
    pair_destroy(&p);
}

static void test_unsignaled_and_flush(void **state)
{
    run_unsignaled_and_flush(4);
}

static void test_unsignaled_and_flush_1qp(void **state)
{
    run_unsignaled_and_flush(1);
}

/* A fenced operation starts only when everything before it completed: a
 * READ fenced after a WRITE to the same place sees the written data. */
static void test_fence(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, 1u << 20, 2);
    memset(p.b.buf, 0, 1u << 20);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 1u << 20);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_READ, 2, 2u << 20, 0, 1u << 20);
    wr.flags |= VQP_SEND_FENCE;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 2, 0);
    check_in_order(&p.a, 2, 1);
    assert_memory_equal(p.a.buf, p.a.buf + (2u << 20), 1u << 20);
    pair_destroy(&p);
}

/* A fence after operations that asked for no completion: their WQEs get no
 * CQE of their own, yet the fenced operation must start (and see them). */
static void test_fence_after_unsignaled(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, 8192, 6);
    memset(p.b.buf, 0, 8192);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 64);
    wr.flags = VQP_SEND_INLINE; /* like put_short: no completion */
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 2, 64, 64, 4000);
    wr.flags = 0; /* like put_zcopy without a completion */
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_READ, 3, 4096, 0, 4064);
    wr.flags |= VQP_SEND_FENCE;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    assert_int_equal(p.a.wcs[0].wr_id, 3);
    assert_int_equal(p.a.wcs[0].status, UCS_OK);
    assert_memory_equal(p.a.buf + 4096, p.a.buf, 4064);
    /* Unknown flags are refused. */
    wr.flags = 0x40;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    pair_destroy(&p);
}

/* An unsignaled small operation on the send QP, then a striped one on the
 * data QPs: the striped one must complete although nothing else goes to the
 * send QP (its report waits for the small one, which needs a CQE). Many
 * such pairs must not fill the operation ring either. */
static void run_unsignaled_before_striped(unsigned num_qps, vqp_lb_t lb)
{
    vqp_params_t params = base_params(num_qps, lb);
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, BUF_SIZE, 8);
    memset(p.b.buf, 0, BUF_SIZE);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 8);
    wr.flags = VQP_SEND_INLINE; /* like put_short */
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 2, 4096, 4096, 256 * 1024);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    assert_int_equal(p.a.wcs[0].wr_id, 2);
    assert_int_equal(p.a.wcs[0].status, UCS_OK);
    assert_memory_equal(p.a.buf, p.b.buf, 8);
    assert_memory_equal(p.a.buf + 4096, p.b.buf + 4096, 256 * 1024);

    /* More pairs than the operation ring holds, none signaled. */
    for (i = 0; i < 3 * params.max_ops; ++i) {
        wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 10 + i, 0, 0, 8);
        wr.flags = VQP_SEND_INLINE;
        while (vqp_post_send(p.a.vqp, &wr) == UCS_ERR_NO_RESOURCE) {
            pair_idle(&p, 1);
        }
        wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 20 + i, 8192, 8192, 64 * 1024);
        wr.flags = 0;
        while (vqp_post_send(p.a.vqp, &wr) == UCS_ERR_NO_RESOURCE) {
            pair_idle(&p, 1);
        }
    }
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 99, 4096, 4096, 256 * 1024);
    while (vqp_post_send(p.a.vqp, &wr) == UCS_ERR_NO_RESOURCE) {
        pair_idle(&p, 1);
    }
    pair_wait(&p, 2, 0);
    assert_int_equal(p.a.wcs[1].wr_id, 99);
    assert_int_equal(p.a.wcs[1].status, UCS_OK);
    pair_destroy(&p);
}

static void test_unsignaled_before_striped(void **state)
{
    run_unsignaled_before_striped(4, VQP_LB_DQPLB);
    run_unsignaled_before_striped(4, VQP_LB_SPRAY);
}

/* A fenced inline operation after unsignaled ones is refused while they
 * are in flight, and vqp_send_avail_inline says so; the refusal must make
 * sure they complete, or it would last forever. */
static void test_fenced_inline_after_unsignaled(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    unsigned steps, n, avail;
    vqp_send_wr_t wr;
    ucs_status_t st;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, 4096, 9);
    memset(p.b.buf, 0, 4096);
    assert_true(vqp_send_avail_inline(p.a.vqp, VQP_SEND_FENCE) > 0);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 8);
    wr.flags = VQP_SEND_INLINE;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    assert_int_equal(vqp_send_avail_inline(p.a.vqp, VQP_SEND_FENCE), 0);
    assert_true(vqp_send_avail_inline(p.a.vqp, 0) > 0);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 2, 8, 8, 8);
    wr.flags = VQP_SEND_INLINE | VQP_SEND_FENCE | VQP_SEND_SIGNALED;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_NO_RESOURCE);
    for (steps = 0; vqp_send_avail_inline(p.a.vqp, VQP_SEND_FENCE) == 0;
         ++steps) {
        assert_true(steps < 1000000);
        pair_idle(&p, 1);
    }
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    assert_int_equal(p.a.wcs[0].wr_id, 2);
    assert_memory_equal(p.a.buf, p.b.buf, 16);

    /* Inline posts without progress until refused: vqp_send_avail_inline
     * foretells every answer (UCT's pending_add relies on it). */
    wr.flags = VQP_SEND_INLINE;
    for (n = 0;; ++n) {
        avail = vqp_send_avail_inline(p.a.vqp, 0);
        st    = vqp_post_send(p.a.vqp, &wr);
        assert_int_equal(avail != 0, st == UCS_OK);
        if (st != UCS_OK) {
            assert_int_equal(st, UCS_ERR_NO_RESOURCE);
            break;
        }
        assert_true(n <= params.max_ops);
    }
    pair_destroy(&p);
}

/* One data QP fails: its fragments are replayed on the others, the user
 * sees only successes, with the data in place. */
static void run_qp_failure(vqp_lb_t lb)
{
    vqp_params_t params = base_params(4, lb);
    vqp_recv_wr_t rwr   = {0};
    vqp_send_wr_t wr;
    vqp_stats_t stats;
    unsigned i, n = 12;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, BUF_SIZE, 4);
    memset(p.b.buf, 0, BUF_SIZE);
    for (i = 0; i < n; ++i) {
        rwr.wr_id = 300 + i;
        assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_OK);
    }
    for (i = 0; i < n; ++i) {
        wr = make_wr(&p.a, &p.b, (i & 1) ? VQP_OP_WRITE_IMM : VQP_OP_WRITE, i,
                     i * 500000, i * 500000, 500000);
        wr.imm = i;
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    /* Kill data QP 1 with its fragments in flight (the engine has not run). */
    assert_int_equal(vqp_dev_qp_set_error(p.a.vqp->qps[1].dev_qp), UCS_OK);
    pair_wait(&p, n, n / 2);
    check_in_order(&p.a, n, 0);
    for (i = 0; i < n / 2; ++i) {
        assert_int_equal(p.b.wcs[i].status, UCS_OK);
        assert_int_equal(p.b.wcs[i].imm, 2 * i + 1);
    }
    assert_memory_equal(p.a.buf, p.b.buf, n * 500000);
    vqp_query_stats(p.a.vqp, &stats);
    assert_true(stats.frags_replayed > 0);
    assert_int_equal(stats.qps_alive, p.a.vqp->num_pqps - 1);

    /* Later operations avoid the dead QP. */
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 50, 0, 6u << 20, 1u << 20);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, n + 1, n / 2);
    assert_int_equal(p.a.wcs[n].status, UCS_OK);
    assert_memory_equal(p.a.buf, p.b.buf + (6u << 20), 1u << 20);
    pair_destroy(&p);
}

static void test_qp_failure_dqplb(void **state)
{
    run_qp_failure(VQP_LB_DQPLB);
}

static void test_qp_failure_spray(void **state)
{
    run_qp_failure(VQP_LB_SPRAY);
}

/* The send QP fails with an inline WRITE and a plain one in flight: the
 * plain one is replayed on a data QP, the inline one fails (its data was in
 * the WQE only; the caller's buffer already holds something else). */
static void test_inline_not_replayed(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    vqp_stats_t stats;
    unsigned i;
    pair_t p;

    pair_create(&p, &params);
    fill_pattern(p.a.buf, 8192, 9);
    memset(p.b.buf, 0, 8192);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 64);
    wr.flags = VQP_SEND_INLINE | VQP_SEND_SIGNALED; /* like put_short */
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 2, 4096, 4096, 4000);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    memset(p.a.buf, 0xee, 64); /* the caller reused its buffer */
    assert_int_equal(vqp_dev_qp_set_error(p.a.vqp->send_qp->dev_qp), UCS_OK);
    pair_wait(&p, 2, 0);
    assert_int_equal(p.a.wcs[0].wr_id, 1);
    assert_true(p.a.wcs[0].status != UCS_OK);
    assert_int_equal(p.a.wcs[1].wr_id, 2);
    assert_int_equal(p.a.wcs[1].status, UCS_OK);
    assert_memory_equal(p.a.buf + 4096, p.b.buf + 4096, 4000);
    for (i = 0; i < 64; ++i) {
        assert_true((unsigned char)p.b.buf[i] != 0xee);
    }
    vqp_query_stats(p.a.vqp, &stats);
    assert_int_equal(stats.frags_replayed, 1);
    pair_idle(&p, 100);
    assert_int_equal(p.a.nwcs, 2);

    /* Later inline posts have no QP to go to: the send QP's error, not
     * UCS_ERR_NO_RESOURCE, which no completion would ever end (and the
     * room they would need is never there); vqp_send_avail_inline says
     * they are not refused for room, so callers that queue requests until
     * it is nonzero get the error too. A WRITE that is not inline goes to a
     * data QP. */
    assert_true(vqp_send_avail_inline(p.a.vqp, 0) > 0); /* not for room */
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 3, 0, 0, 64);
    wr.flags = VQP_SEND_INLINE | VQP_SEND_SIGNALED;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), p.a.vqp->send_qp->error);
    assert_true(p.a.vqp->send_qp->error != UCS_OK);
    wr.flags = VQP_SEND_INLINE | VQP_SEND_SIGNALED | VQP_SEND_FENCE;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), p.a.vqp->send_qp->error);
    fill_pattern(p.a.buf, 64, 10);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 4, 0, 0, 64);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 3, 0);
    assert_int_equal(p.a.wcs[2].wr_id, 4);
    assert_int_equal(p.a.wcs[2].status, UCS_OK);
    assert_memory_equal(p.a.buf, p.b.buf, 64);
    pair_destroy(&p);
}

/* The send QP fails with whole WRITEs and READs in flight (signaled or not,
 * zero bytes too): each is replayed on a data QP and lands where it was
 * meant to, with its keys (a wrong key fails the replay), local and remote
 * addresses not swapped. The lean path posted them and left their records
 * without addresses, keys and immediate: the replay reads them back from
 * the failed WQEs. An unsignaled one is signaled there: it may be its QP's
 * last WQE, which nothing else would complete, and every later completion
 * would wait for it. */
static void test_whole_replay(void **state)
{
    static const struct {
        vqp_opcode_t opcode;
        unsigned flags;
        uint64_t loff, roff, len;
    } ops[] = {
        {VQP_OP_WRITE, VQP_SEND_SIGNALED, 100, 300000, 1000},
        {VQP_OP_READ, 0, 200000, 40000, 3000},
        {VQP_OP_WRITE, VQP_SEND_SIGNALED, 0, 0, 0},
        {VQP_OP_READ, VQP_SEND_SIGNALED, 600000, 500000, 20000},
        {VQP_OP_WRITE, VQP_SEND_SIGNALED, 700000, 800000, 32 * 1024 - 1},
    };
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    size_t span         = 1u << 20;
    unsigned i, n = ucs_static_array_size(ops), nsig = 0;
    char *orig_a, *orig_b;
    vqp_send_wr_t wr;
    vqp_stats_t stats;
    pair_t p;

    pair_create(&p, &params);
    orig_a = malloc(span);
    orig_b = malloc(span);
    assert_non_null(orig_a);
    assert_non_null(orig_b);
    fill_pattern(p.a.buf, span, 3);
    fill_pattern(p.b.buf, span, 5);
    memcpy(orig_a, p.a.buf, span);
    memcpy(orig_b, p.b.buf, span);
    for (i = 0; i < n; ++i) {
        /* below the stripe threshold: whole, on the send QP */
        assert_true(ops[i].len < params.stripe_threshold);
        wr = make_wr(&p.a, &p.b, ops[i].opcode, i, ops[i].loff, ops[i].roff,
                     ops[i].len);
        wr.flags = ops[i].flags;
        nsig += !!(ops[i].flags & VQP_SEND_SIGNALED);
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    /* The engine has not run: every WQE is flushed. */
    assert_int_equal(vqp_dev_qp_set_error(p.a.vqp->send_qp->dev_qp), UCS_OK);
    pair_wait(&p, nsig, 0);
    for (i = 0; i < nsig; ++i) {
        assert_int_equal(p.a.wcs[i].status, UCS_OK);
    }
    assert_int_equal(p.a.wcs[0].wr_id, 0);
    assert_int_equal(p.a.wcs[nsig - 1].wr_id, n - 1);
    vqp_query_stats(p.a.vqp, &stats);
    assert_int_equal(stats.frags_replayed, n);
    for (i = 0; i < n; ++i) {
        if (ops[i].opcode == VQP_OP_WRITE) {
            assert_memory_equal(p.b.buf + ops[i].roff, orig_a + ops[i].loff,
                                ops[i].len);
        } else {
            assert_memory_equal(p.a.buf + ops[i].loff, orig_b + ops[i].roff,
                                ops[i].len);
        }
    }
    /* Nothing where swapped addresses would have put it. */
    assert_memory_equal(p.b.buf + 100, orig_b + 100, 1000);
    assert_memory_equal(p.a.buf + 40000, orig_a + 40000, 3000);
    assert_memory_equal(p.b.buf + 200000, orig_b + 200000, 3000);
    pair_idle(&p, 100);
    assert_int_equal(p.a.nwcs, nsig);
    free(orig_a);
    free(orig_b);
    pair_destroy(&p);
}

/* @a n unsignaled 8-byte WRITEs of tagged words from a to b, the last one
 * signaled. @a may_wait: a post may be refused for room (progress and
 * retry, bounded); otherwise each must be accepted at once. */
static void post_tagged_writes(pair_t *p, unsigned n, uint64_t tag,
                               int may_wait)
{
    uint64_t *src = (uint64_t *)p->a.buf;
    vqp_send_wr_t wr;
    ucs_status_t st;
    unsigned i, tries;

    assert_true(n * sizeof(uint64_t) <= BUF_SIZE);
    memset(p->b.buf, 0, n * sizeof(uint64_t));
    for (i = 0; i < n; ++i) {
        src[i]   = tag + i;
        wr       = make_wr(&p->a, &p->b, VQP_OP_WRITE, i, i * sizeof(uint64_t),
                           i * sizeof(uint64_t), sizeof(uint64_t));
        wr.flags = (i + 1 == n) ? VQP_SEND_SIGNALED : 0;
        for (tries = 0; (st = vqp_post_send(p->a.vqp, &wr)) != UCS_OK;
             ++tries) {
            assert_int_equal(st, UCS_ERR_NO_RESOURCE);
            if (!may_wait || (tries == 1000000)) {
                fail_msg("operation %u of %u never got room", i, n);
            }
            pair_idle(p, 1);
        }
    }
}

/* The last of them completed alone, nothing is in flight, all words
 * arrived. */
static void check_tagged_writes(pair_t *p, unsigned n, uint64_t tag)
{
    const uint64_t *dst = (const uint64_t *)p->b.buf;
    unsigned i;

    pair_wait(p, 1, 0);
    assert_int_equal(p->a.wcs[0].wr_id, n - 1);
    assert_int_equal(p->a.wcs[0].status, UCS_OK);
    assert_int_equal(vqp_ops_in_flight(p->a.vqp), 0);
    for (i = 0; i < n; ++i) {
        assert_true(dst[i] == tag + i);
    }
    pair_idle(p, 100);
    assert_int_equal(p->a.nwcs, 1);
}

/* Unsignaled operations, many more than the CQ has entries for: each time
 * the credits run out, the WQEs holding them are all unsignaled, and only a
 * cover NOP brings them back. The shortage recurs within the poll that got
 * the credits back (the waiting operations use them up at once); every such
 * episode must get its cover, or the virtual QP waits forever. */
static void test_credit_episodes(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    const unsigned n    = 3000;
    vqp_stats_t stats;
    pair_t p;

    params.max_ops  = 1024; /* signals every 512: more than the credits */
    side_cq_entries = 256;
    pair_create(&p, &params);
    side_cq_entries = 0;
    post_tagged_writes(&p, n, 0x7700000000ull, 1);
    check_tagged_writes(&p, n, 0x7700000000ull);
    vqp_query_stats(p.a.vqp, &stats);
    assert_true(stats.credit_waits >= 1); /* it did run short */
    pair_destroy(&p);
}

/* An operation ring smaller than a QP's signaling interval fills with
 * unsignaled operations, which only a later signaled WQE completes: the
 * refused post must ask for one, or every retry is refused for good. */
static void test_ring_full_unsignaled(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    pair_t p;

    params.max_ops = 4;
    pair_create(&p, &params);
    post_tagged_writes(&p, 40, 0x5500000000ull, 1);
    check_tagged_writes(&p, 40, 0x5500000000ull);
    pair_destroy(&p);
    params         = base_params(4, VQP_LB_SPRAY);
    params.max_ops = 2;
    pair_create(&p, &params);
    post_tagged_writes(&p, 40, 0x5600000000ull, 1);
    check_tagged_writes(&p, 40, 0x5600000000ull);
    pair_destroy(&p);
}

/* max_ops beyond what the device's SQ can hold: the send QP takes what the
 * device allows and the rest wait in the operation ring, completing in
 * order (one data QP: every operation goes to the send QP). */
static void test_max_ops_beyond_sq(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    vqp_dev_attr_t attr;
    unsigned n;
    pair_t p;

    params.max_ops = 1u << 20;
    pair_create(&p, &params);
    vqp_dev_query(p.a.dev, &attr);
    n = attr.max_qp_wr / 2 + 1000; /* more than the send QP's ring */
    assert_true(n < params.max_ops);
    post_tagged_writes(&p, n, 0x5a00000000ull, 0);
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), n);
    check_tagged_writes(&p, n, 0x5a00000000ull);
    pair_destroy(&p);
}

/* vqp_cancel marks the virtual QP for the CQ's next poll; destroyed before
 * that poll (a flush(CANCEL) with nothing in flight completes at once, and
 * UCT destroys the endpoint), it must not stay on the CQ's list: the poll
 * would advance freed memory. Also a virtual QP marked in a poll batch and
 * destroyed by a completion callback of another one. */
static void test_destroy_after_cancel(void **state)
{
    vqp_params_t params = base_params(2, VQP_LB_DQPLB);
    vqp_t *second;
    pair_t p;

    pair_create(&p, &params);
    vqp_cancel(p.a.vqp);
    assert_int_equal(p.a.cq->num_dirty, 1);
    vqp_destroy(p.a.vqp);
    p.a.vqp = NULL;
    assert_int_equal(p.a.cq->num_dirty, 0);
    pair_idle(&p, 10); /* nothing left to advance */

    /* Two marked, the first destroyed: the other stays on the list. */
    params.cq = p.a.cq;
    assert_int_equal(vqp_create(&params, &p.a.vqp), UCS_OK);
    assert_int_equal(vqp_create(&params, &second), UCS_OK);
    vqp_cancel(p.a.vqp);
    vqp_cancel(second);
    assert_int_equal(p.a.cq->num_dirty, 2);
    vqp_destroy(p.a.vqp);
    p.a.vqp = NULL;
    assert_int_equal(p.a.cq->num_dirty, 1);
    assert_ptr_equal(p.a.cq->dirty[0], second);
    pair_idle(&p, 10);
    vqp_destroy(second);
    pair_destroy(&p);
}

static unsigned fail_calls;
static ucs_status_t fail_status;
static void *fail_arg;

static void count_fail(void *arg, ucs_status_t status)
{
    ++fail_calls;
    fail_status = status;
    fail_arg    = arg;
}

/* The send QP dies where no operation fails with it (the WQE that failed
 * is a cover NOP: the WRITE before it executed, unsignaled): fail_cb tells
 * the user, once, from the poll. vqp_cancel does not call it. */
static void test_send_qp_fail_cb(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    pair_t p;

    params.fail_cb  = count_fail;
    params.comp_arg = &fail_calls;
    fail_calls      = 0;
    pair_create(&p, &params);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 64);
    wr.flags = 0;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_idle(&p, 100); /* executed; no CQE asked for */
    assert_int_equal(vqp_dev_qp_set_error(p.a.vqp->send_qp->dev_qp), UCS_OK);
    vqp_cover_in_flight(p.a.vqp);
    assert_int_equal(fail_calls, 0); /* never within a call */
    pair_idle(&p, 100);
    assert_int_equal(fail_calls, 1);
    assert_ptr_equal(fail_arg, &fail_calls);
    assert_int_equal(fail_status, UCS_ERR_CANCELED); /* flushed */
    assert_int_equal(p.a.nwcs, 0);                   /* no operation failed */
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 0);
    wr = make_wr(&p.a, &p.b, VQP_OP_SEND, 2, 0, 0, 8);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_CANCELED);
    pair_idle(&p, 100);
    assert_int_equal(fail_calls, 1);
    pair_destroy(&p);

    /* The user's own cancel is no failure to report. */
    pair_create(&p, &params);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 64);
    wr.flags = 0;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    vqp_cancel(p.a.vqp);
    pair_idle(&p, 100);
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 0);
    assert_int_equal(fail_calls, 1);
    pair_destroy(&p);
}

/* vqp_cancel with an unsignaled WQE that already executed: the flush of
 * its QP gives it no CQE, so a signaled NOP must cover it, or the operation
 * stays in flight for good (a flush(CANCEL) waiting for it never ends). */
static void test_cancel_after_unsignaled(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    pair_create(&p, &params);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 64);
    wr.flags = 0;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_idle(&p, 100); /* executed; no CQE asked for */
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 1);
    vqp_cancel(p.a.vqp);
    for (i = 0; (i < 1000) && (vqp_ops_in_flight(p.a.vqp) != 0); ++i) {
        pair_idle(&p, 1);
    }
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 0);
    assert_int_equal(p.a.nwcs, 0); /* it succeeded, unsignaled */
    pair_destroy(&p);
}

/* vqp_cancel when the send QP's ring is full, its newest WQEs unsignaled
 * and executed (their CQEs not asked for; a signaled one's not polled yet):
 * no NOP fits to cover them, and the flush reports nothing for them. The
 * NOP must go once the signaled one's CQE made room, or they stay in flight
 * for good (a flush(CANCEL) waiting for them never ends). */
static void test_cancel_full_ring_unsignaled(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    vqp_pqp_t *sq;
    vqp_send_wr_t wr;
    unsigned i, n;
    pair_t p;

    params.max_ops         = 8;
    params.max_outstanding = 8;
    pair_create(&p, &params);
    sq = p.a.vqp->send_qp;
    n  = sq->frag_mask + 1;
    assert_true(sq->tx.sig_every < n);
    /* One signaled WQE, then unsignaled ones until the ring is full: the
     * newest is unsignaled (the ring signals every sig_every). */
    for (i = 0; i < n; ++i) {
        wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, i, i * 8, i * 8, 8);
        wr.flags = (i == 0) ? VQP_SEND_SIGNALED : 0;
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    assert_int_equal(sq->frag_tail - sq->frag_head, n);
    assert_true(sq->tx.sig_left != sq->tx.sig_every);
    /* Executed, the CQEs left in the CQ. */
    for (i = 0; i < 100; ++i) {
        vqp_dev_progress(p.a.dev);
        vqp_dev_progress(p.b.dev);
    }
    vqp_cancel(p.a.vqp);
    for (i = 0; (i < 100000) && (vqp_ops_in_flight(p.a.vqp) != 0); ++i) {
        pair_idle(&p, 1);
    }
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 0);
    assert_int_equal(p.a.nwcs, 1); /* the signaled one, done before */
    assert_int_equal(p.a.wcs[0].wr_id, 0);
    assert_int_equal(p.a.wcs[0].status, UCS_OK);
    pair_destroy(&p);
}

/* No data QP survives: every operation fails exactly once, later posts are
 * refused with the error. */
static void test_all_qps_fail(void **state)
{
    vqp_params_t params = base_params(3, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    unsigned i, n = 6;
    pair_t p;

    pair_create(&p, &params);
    for (i = 0; i < n; ++i) {
        wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, i, 0, 0, 300000);
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    for (i = 0; i < 3; ++i) {
        assert_int_equal(vqp_dev_qp_set_error(p.a.vqp->qps[i].dev_qp), UCS_OK);
    }
    pair_wait(&p, n, 0);
    pair_idle(&p, 200);
    assert_int_equal(p.a.nwcs, n);
    for (i = 0; i < n; ++i) {
        assert_int_equal(p.a.wcs[i].wr_id, i);
        assert_true(p.a.wcs[i].status != UCS_OK);
    }
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 99, 0, 0, 10);
    assert_true(vqp_post_send(p.a.vqp, &wr) != UCS_OK);
    pair_destroy(&p);
}

/* The data QPs all fail while an unsignaled WRITE, the send QP's newest
 * WQE, is in flight there: the send QP goes too, so that it ends (a FLUSH,
 * which would cover it, is refused once nothing is left). Before, it stayed
 * in flight for good (found by test_vqp_random). */
static void test_all_qps_fail_send_qp_unsignaled(void **state)
{
    vqp_params_t params = base_params(2, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    unsigned i, steps;
    pair_t p;

    pair_create(&p, &params);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 0, 0, 0, 300000);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 100);
    wr.flags = 0;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    for (i = 0; i < 2; ++i) {
        assert_int_equal(vqp_dev_qp_set_error(p.a.vqp->qps[i].dev_qp), UCS_OK);
    }
    pair_wait(&p, 1, 0);
    assert_int_equal(p.a.wcs[0].wr_id, 0);
    assert_true(p.a.wcs[0].status != UCS_OK);
    for (steps = 0; (vqp_ops_in_flight(p.a.vqp) != 0) && (steps < 100000);
         ++steps) {
        pair_idle(&p, 1);
    }
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 0);
    assert_false(p.a.vqp->send_qp->alive);
    /* reported only if it failed, and then once */
    assert_true(p.a.nwcs <= 2);
    if (p.a.nwcs == 2) {
        assert_int_equal(p.a.wcs[1].wr_id, 1);
        assert_true(p.a.wcs[1].status != UCS_OK);
    }
    wr = make_wr(&p.a, &p.b, VQP_OP_FLUSH, 2, 0, 0, 0);
    assert_true(vqp_post_send(p.a.vqp, &wr) != UCS_OK);
    pair_destroy(&p);
}

/* A bad rkey cannot be fixed by another QP: that operation fails, and the
 * virtual QP goes on with the others. */
static void test_remote_access_error(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_SPRAY);
    vqp_send_wr_t wr;
    pair_t p;

    pair_create(&p, &params);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 100);
    wr.rkey[0] ^= 0x5a5a;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    assert_int_equal(p.a.wcs[0].wr_id, 1);
    assert_true(p.a.wcs[0].status != UCS_OK);
    pair_idle(&p, 200);
    assert_int_equal(p.a.nwcs, 1);
    pair_destroy(&p);
}

static unsigned cb_count;
static ucs_status_t cb_last_status;

static void count_cb(void *arg, const vqp_wc_t *wc)
{
    assert_ptr_equal(arg, &cb_count);
    ++cb_count;
    cb_last_status = wc->status;
}

/* Teardown with operations in flight: each completes once, as canceled. */
static void test_destroy_in_flight(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    params.comp_cb  = count_cb;
    params.comp_arg = &cb_count;
    pair_create(&p, &params);
    cb_count = 0;
    for (i = 0; i < 10; ++i) {
        wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, i, 0, 0, 400000);
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    assert_int_equal(cb_count, 0);
    vqp_destroy(p.a.vqp);
    p.a.vqp = NULL;
    assert_int_equal(cb_count, 10);
    assert_int_equal(cb_last_status, UCS_ERR_CANCELED);
    pair_idle(&p, 100);
    assert_int_equal(cb_count, 10);
    pair_destroy(&p);
}

/* The DQPLB window: out-of-order numbers are held until the gap closes,
 * duplicates and old numbers are dropped, numbers beyond the window are
 * refused and fail their operation instead of corrupting state. */
static void test_dqplb_window(void **state)
{
    vqp_params_t params = base_params(2, VQP_LB_DQPLB);
    vqp_recv_wr_t rwr   = {0};
    vqp_stats_t stats;
    side_t s;
    vqp_t *v;
    unsigned i;

    side_open(&s);
    params.cq = s.cq;
    assert_int_equal(vqp_create(&params, &s.vqp), UCS_OK);
    v = s.vqp;
    for (i = 0; i < 4; ++i) {
        rwr.wr_id = i;
        assert_int_equal(vqp_post_recv(v, &rwr), UCS_OK);
    }

    /* op A = {0, 1, 2(end)}, op B = {3, 4(end)} arriving 4, 2, 1, 3, 0 */
    vqp_win_insert(v, 4, VQP_WIN_END, 0xb);
    vqp_win_insert(v, 2, VQP_WIN_END, 0xa);
    vqp_win_insert(v, 1, 0, 0);
    vqp_win_insert(v, 3, 0, 0);
    s.nwcs = vqp_cq_poll(s.cq, s.wcs, MAX_WCS);
    assert_int_equal(s.nwcs, 0);
    vqp_win_insert(v, 0, 0, 0);
    s.nwcs = vqp_cq_poll(s.cq, s.wcs, MAX_WCS);
    assert_int_equal(s.nwcs, 2);
    assert_int_equal(s.wcs[0].imm, 0xa);
    assert_int_equal(s.wcs[1].imm, 0xb);
    assert_int_equal(s.wcs[1].status, UCS_OK);

    /* duplicates: an old number, and one already in the window */
    vqp_win_insert(v, 1, 0, 0);
    vqp_win_insert(v, 6, 0, 0);
    vqp_win_insert(v, 6, 0, 0);
    vqp_query_stats(v, &stats);
    assert_int_equal(stats.dqplb_duplicates, 2);

    /* a lost number reported by the peer: the op's notification fails */
    vqp_win_insert(v, 5, VQP_WIN_ABORT, 0);
    vqp_win_insert(v, 7, VQP_WIN_END, 0xc);
    s.nwcs = vqp_cq_poll(s.cq, s.wcs, MAX_WCS);
    assert_int_equal(s.nwcs, 1);
    assert_int_equal(s.wcs[0].status, UCS_ERR_IO_ERROR);

    /* beyond the window: refused, the next operation fails */
    vqp_win_insert(v, 8 + v->win_mask + 1, VQP_WIN_END, 0xd);
    vqp_win_insert(v, 8, VQP_WIN_END, 0xe);
    s.nwcs = vqp_cq_poll(s.cq, s.wcs, MAX_WCS);
    assert_int_equal(s.nwcs, 1);
    assert_int_equal(s.wcs[0].imm, 0xe);
    assert_int_equal(s.wcs[0].status, UCS_ERR_IO_ERROR);
    side_close(&s);
}

/* flush(CANCEL): operations in flight complete as canceled, once; counters
 * the UCT layer relies on; an inline post is refused while others wait. */
static void test_cancel_and_accounting(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    params.max_outstanding = 1;
    params.max_ops         = 8;
    pair_create(&p, &params);
    assert_int_equal(
        vqp_address_size(p.a.vqp),
        vqp_address_size_for(&(vqp_params_t){.cq = p.a.cq, .num_qps = 4}));
    assert_int_equal(vqp_send_avail(p.a.vqp), 8);
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 0);
    for (i = 0; i < 6; ++i) {
        wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, i, 0, 0, 200000);
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    assert_int_equal(vqp_send_avail(p.a.vqp), 2);
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 6);
    /* 4 QPs x 1 fragment are busy: the inline put cannot go now. */
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 50, 0, 0, 8);
    wr.flags |= VQP_SEND_INLINE;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_NO_RESOURCE);

    vqp_cancel(p.a.vqp);
    pair_wait(&p, 6, 0);
    pair_idle(&p, 200);
    assert_int_equal(p.a.nwcs, 6);
    for (i = 0; i < 6; ++i) {
        assert_int_equal(p.a.wcs[i].wr_id, i);
        assert_int_equal(p.a.wcs[i].status, UCS_ERR_CANCELED);
    }
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 0);
    wr = make_wr(&p.a, &p.b, VQP_OP_SEND, 60, 0, 0, 8);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_CANCELED);
    pair_destroy(&p);
}

/* A striped WRITE canceled with only some of its fragments posted (the
 * rings are full), a READ behind it: each is reported once, canceled, and
 * so is what waits behind them. A WRITE or READ has no WQE after its
 * data; the unposted part once counted one (found by test_vqp_random):
 * the posted fragments' CQEs then took the count below zero and nothing
 * was ever reported again. */
static void test_cancel_partly_posted(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    params.max_outstanding = 1;
    pair_create(&p, &params);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 0, 0, 0, 40 * 65536);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_READ, 1, 3u << 20, 3u << 20, 40 * 65536);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 2, 0, 0, 100);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    /* some of the WRITE's 40 fragments, none of the READ's */
    assert_true(p.a.vqp->ops[0].posted > 0);
    assert_true(p.a.vqp->ops[0].posted < 40);
    assert_int_equal(p.a.vqp->ops[1].posted, 0);
    /* One CQE per poll: the unposted part fails (at the first advance)
     * before the posted fragments' flushes are all counted. */
    p.a.cq->max_poll = 1;
    vqp_cancel(p.a.vqp);
    pair_wait(&p, 3, 0);
    pair_idle(&p, 200);
    assert_int_equal(p.a.nwcs, 3);
    for (i = 0; i < 3; ++i) {
        assert_int_equal(p.a.wcs[i].wr_id, i);
        assert_int_equal(p.a.wcs[i].status, UCS_ERR_CANCELED);
        /* Every WQE counted once: none is left, none came after the report
         * (the last flush would have taken the count below zero). */
        assert_int_equal(p.a.vqp->ops[i].remaining, 0);
    }
    assert_int_equal(vqp_ops_in_flight(p.a.vqp), 0);
    pair_destroy(&p);
}

/* A virtual QP over two devices per side (the seeds' multi-NIC mode): keys
 * per device, one CQ per device, striped writes and in-order notifications
 * whose notify never overtakes data on the other device. */
/* Wire layout of a virtual QP address (version 2), for the size checks and
 * the corruption tests: header, the distinct device addresses, then per QP
 * a 3-byte QPN and, with several devices, a 1-byte device index. */
#define ADDR_HDR_LEN      9
#define ADDR_OFF_VERSION  0
#define ADDR_OFF_NUM_DEVS 8

/* The packed size of @a dev's address. */
static size_t dev_addr_len(vqp_dev_t *dev)
{
    vqp_dev_addr_t a;

    vqp_dev_address(dev, &a);
    return vqp_dev_addr_packed_size(&a);
}

static void run_two_devices(vqp_lb_t lb, unsigned num_qps)
{
    vqp_params_t params = base_params(num_qps, lb);
    vqp_dev_t *devs[2][2];
    vqp_dev_mr_t *mrs[2][2];
    uint32_t lkeys[2][2], rkeys[2][2];
    vqp_cq_t *cqs[2];
    vqp_t *vqps[2];
    char *bufs[2];
    char addr[2][2048];
    size_t len[2];
    vqp_cq_params_t cqp;
    vqp_recv_wr_t rwr = {0};
    vqp_wc_t wcs[2][64];
    unsigned nwcs[2] = {0, 0}, i, s, d, steps;
    vqp_send_wr_t wr = {0};
    const unsigned n = 6;

    for (s = 0; s < 2; ++s) {
        vqp_cq_params_default(&cqp);
        bufs[s] = aligned_alloc(4096, BUF_SIZE);
        assert_non_null(bufs[s]);
        for (d = 0; d < 2; ++d) {
            assert_int_equal(vqp_dev_open(VQP_DEV_SW_NAME, NULL, &devs[s][d]),
                             UCS_OK);
            cqp.devs[d] = devs[s][d];
            assert_int_equal(vqp_dev_mr_reg(devs[s][d], bufs[s], BUF_SIZE,
                                            IBV_ACCESS_LOCAL_WRITE |
                                                IBV_ACCESS_REMOTE_WRITE |
                                                IBV_ACCESS_REMOTE_READ,
                                            &mrs[s][d], &lkeys[s][d],
                                            &rkeys[s][d]),
                             UCS_OK);
        }
        cqp.num_devs = 2;
        assert_int_equal(vqp_cq_create(&cqp, &cqs[s]), UCS_OK);
        params.cq = cqs[s];
        assert_int_equal(vqp_create(&params, &vqps[s]), UCS_OK);
        assert_int_equal(
            vqp_address_pack(vqps[s], addr[s], sizeof(addr[s]), &len[s]),
            UCS_OK);
        /* Each device address once; 4 bytes per QP (QPN, device index). */
        assert_int_equal(len[s], ADDR_HDR_LEN + dev_addr_len(devs[s][0]) +
                                     dev_addr_len(devs[s][1]) +
                                     (num_qps + 1) * 4);
        assert_int_equal(addr[s][ADDR_OFF_NUM_DEVS], 2);
        assert_int_equal(len[s], vqp_address_size(vqps[s]));
        assert_int_equal(len[s], vqp_address_size_for(&params));
    }
    assert_int_equal(vqp_connect(vqps[0], addr[1], len[1]), UCS_OK);
    assert_int_equal(vqp_connect(vqps[1], addr[0], len[0]), UCS_OK);

    fill_pattern(bufs[0], BUF_SIZE, 21);
    memset(bufs[1], 0, BUF_SIZE);
    for (i = 0; i < n; ++i) {
        rwr.wr_id = 900 + i;
        assert_int_equal(vqp_post_recv(vqps[1], &rwr), UCS_OK);
    }
    for (i = 0; i < n; ++i) {
        wr.wr_id       = i;
        wr.opcode      = VQP_OP_WRITE_IMM;
        wr.flags       = VQP_SEND_SIGNALED;
        wr.local_addr  = (uintptr_t)bufs[0] + i * 1000000;
        wr.remote_addr = (uintptr_t)bufs[1] + i * 1000000;
        wr.length      = 1000000;
        wr.imm         = 0x7700 + i;
        for (d = 0; d < 2; ++d) {
            wr.lkey[d] = lkeys[0][d];
            wr.rkey[d] = rkeys[1][d];
        }
        assert_int_equal(vqp_post_send(vqps[0], &wr), UCS_OK);
    }
    for (steps = 0; (steps < 2000000) && ((nwcs[0] < n) || (nwcs[1] < n));
         ++steps) {
        for (s = 0; s < 2; ++s) {
            nwcs[s] += vqp_cq_poll(cqs[s], wcs[s] + nwcs[s], 64 - nwcs[s]);
        }
    }
    assert_int_equal(nwcs[0], n);
    assert_int_equal(nwcs[1], n);
    for (i = 0; i < n; ++i) {
        assert_int_equal(wcs[0][i].wr_id, i);
        assert_int_equal(wcs[0][i].status, UCS_OK);
        assert_int_equal(wcs[1][i].wr_id, 900 + i);
        assert_int_equal(wcs[1][i].imm, 0x7700 + i);
        assert_int_equal(wcs[1][i].status, UCS_OK);
    }
    assert_memory_equal(bufs[0], bufs[1], n * 1000000);

    for (s = 0; s < 2; ++s) {
        vqp_destroy(vqps[s]);
        assert_int_equal(vqp_cq_destroy(cqs[s]), UCS_OK);
        for (d = 0; d < 2; ++d) {
            assert_int_equal(vqp_dev_mr_dereg(mrs[s][d]), UCS_OK);
            assert_int_equal(vqp_dev_close(devs[s][d]), UCS_OK);
        }
        free(bufs[s]);
    }
}

static void test_two_devices_spray(void **state)
{
    run_two_devices(VQP_LB_SPRAY, 4);
}

static void test_two_devices_dqplb(void **state)
{
    run_two_devices(VQP_LB_DQPLB, 4);
}

static void test_two_devices_64qp(void **state)
{
    run_two_devices(VQP_LB_DQPLB, 64);
}

/* 64 QPs on one device: the device address once, 3 bytes per QP; the
 * size functions are exact, a buffer one byte short is refused, and the
 * pair works over the address. */
static void test_address_compact(void **state)
{
    vqp_params_t params = base_params(64, VQP_LB_DQPLB);
    char addr[2048];
    size_t len, want;
    pair_t p;

    pair_create(&p, &params);
    want = ADDR_HDR_LEN + dev_addr_len(p.a.dev) + 65 * 3;
    assert_int_equal(vqp_address_size(p.a.vqp), want);
    params.cq = p.a.cq;
    assert_int_equal(vqp_address_size_for(&params), want);
    assert_int_equal(vqp_address_pack(p.a.vqp, addr, want - 1, &len),
                     UCS_ERR_BUFFER_TOO_SMALL);
    expect_log("too small");
    assert_int_equal(vqp_address_pack(p.a.vqp, addr, want, &len), UCS_OK);
    assert_int_equal(len, want);
    assert_int_equal(addr[ADDR_OFF_VERSION], 2);
    assert_int_equal(addr[ADDR_OFF_NUM_DEVS], 1);
    pair_destroy(&p);
    run_writes(64, VQP_LB_DQPLB);
}

/* Connecting to @a addr of @a len bytes fails with a log line saying
 * @a why, and leaves the virtual QP unconnected. */
static void expect_bad_addr(vqp_t *vqp, const char *addr, size_t len,
                            const char *why)
{
    assert_int_equal(vqp_connect(vqp, addr, len), UCS_ERR_INVALID_PARAM);
    expect_log(why);
    assert_false(vqp->connected);
}

/* Truncated, padded and corrupt addresses are refused with a clear error
 * before any QP is touched; the intact address connects afterwards. */
static void run_bad_address(unsigned num_devs)
{
    vqp_params_t params = base_params(8, VQP_LB_DQPLB);
    vqp_dev_t *devs[2][2];
    vqp_cq_params_t cqp;
    vqp_cq_t *cqs[2];
    vqp_t *vqps[2];
    char addr[2][2048], bad[2048];
    size_t len[2], i, qp_off, entry = (num_devs > 1) ? 4 : 3;
    unsigned s, d;

    for (s = 0; s < 2; ++s) {
        vqp_cq_params_default(&cqp);
        for (d = 0; d < num_devs; ++d) {
            assert_int_equal(vqp_dev_open(VQP_DEV_SW_NAME, NULL, &devs[s][d]),
                             UCS_OK);
            cqp.devs[d] = devs[s][d];
        }
        cqp.num_devs = num_devs;
        assert_int_equal(vqp_cq_create(&cqp, &cqs[s]), UCS_OK);
        params.cq = cqs[s];
        assert_int_equal(vqp_create(&params, &vqps[s]), UCS_OK);
        assert_int_equal(
            vqp_address_pack(vqps[s], addr[s], sizeof(addr[s]), &len[s]),
            UCS_OK);
    }
    qp_off = len[1] - 9 * entry; /* 8 data QPs and the send QP */

    for (i = 0; i < len[1]; ++i) { /* every truncation */
        assert_int_equal(vqp_connect(vqps[0], addr[1], i),
                         UCS_ERR_INVALID_PARAM);
        assert_false(vqps[0]->connected);
    }
    expect_log("expected");
    expect_bad_addr(vqps[0], addr[1], 3, "truncated");
    memcpy(bad, addr[1], len[1]);
    bad[len[1]] = 0;
    expect_bad_addr(vqps[0], bad, len[1] + 1, "expected");

    memcpy(bad, addr[1], len[1]);
    bad[ADDR_OFF_VERSION] = 1; /* the old format: one full address per QP */
    expect_bad_addr(vqps[0], bad, len[1], "format version 1, ours is 2");
    memcpy(bad, addr[1], len[1]);
    bad[ADDR_OFF_NUM_DEVS] = 0;
    expect_bad_addr(vqps[0], bad, len[1], "0 devices");
    bad[ADDR_OFF_NUM_DEVS] = VQP_MAX_DEVS + 1;
    expect_bad_addr(vqps[0], bad, len[1], "does not match");
    memcpy(bad, addr[1], len[1]);
    bad[ADDR_HDR_LEN] = 0x42; /* the first device address's type */
    expect_bad_addr(vqps[0], bad, len[1], "device address 0 of");
    memcpy(bad, addr[1], len[1]);
    memset(&bad[qp_off + 4 * entry], 0, 3); /* QPN 0 */
    expect_bad_addr(vqps[0], bad, len[1], "QP 4 has QPN 0x0");
    if (num_devs > 1) {
        memcpy(bad, addr[1], len[1]);
        bad[qp_off + 2 * entry + 3] = (char)num_devs;
        expect_bad_addr(vqps[0], bad, len[1], "QP 2 has QPN");
    }

    assert_int_equal(vqp_connect(vqps[0], addr[1], len[1]), UCS_OK);
    assert_int_equal(vqp_connect(vqps[1], addr[0], len[0]), UCS_OK);
    for (s = 0; s < 2; ++s) {
        vqp_destroy(vqps[s]);
        assert_int_equal(vqp_cq_destroy(cqs[s]), UCS_OK);
        for (d = 0; d < num_devs; ++d) {
            assert_int_equal(vqp_dev_close(devs[s][d]), UCS_OK);
        }
    }
}

static void test_bad_address(void **state)
{
    run_bad_address(1);
}

static void test_bad_address_two_devices(void **state)
{
    run_bad_address(2);
}

static void test_bad_params(void **state)
{
    vqp_params_t params = base_params(2, VQP_LB_DQPLB);
    vqp_cq_params_t cqp;
    vqp_cq_t *cq;
    vqp_t *vqp;
    side_t s;

    vqp_cq_params_default(&cqp);
    assert_int_equal(vqp_cq_create(&cqp, &cq), UCS_ERR_INVALID_PARAM);
    cqp.num_devs = VQP_MAX_DEVS + 1;
    assert_int_equal(vqp_cq_create(&cqp, &cq), UCS_ERR_INVALID_PARAM);

    side_open(&s);
    params.cq = NULL;
    assert_int_equal(vqp_create(&params, &vqp), UCS_ERR_INVALID_PARAM);
    params.cq      = s.cq;
    params.num_qps = 0;
    assert_int_equal(vqp_create(&params, &vqp), UCS_ERR_INVALID_PARAM);
    params.num_qps   = 2;
    params.frag_size = 0;
    assert_int_equal(vqp_create(&params, &vqp), UCS_ERR_INVALID_PARAM);
    params.frag_size = 3000; /* fragments are cut by a shift */
    assert_int_equal(vqp_create(&params, &vqp), UCS_ERR_INVALID_PARAM);
    params.frag_size  = 4096;
    params.max_inline = 2;
    assert_int_equal(vqp_create(&params, &vqp), UCS_ERR_INVALID_PARAM);
    side_close(&s);
}

/* CQ entries of the device behind @a cq are all accounted for: nothing
 * reserved, nothing in flight (after every virtual QP is gone and the CQ
 * was polled past their CQEs). */
static void check_cq_idle(vqp_cq_t *cq)
{
    vqp_cq_dev_t *cdev = &cq->devs[0];

    assert_int_equal(cdev->cqe_reserved, 0);
    assert_int_equal(cdev->cover_reserve, 0);
    assert_int_equal(cdev->credits, (int32_t)(cdev->cq.mask + 1));
}

/* Receives can complete at any time, so a virtual QP whose receives would
 * not fit the CQ is refused with a clear error, and fits again once another
 * one is gone. WQEs reserve nothing up front (they take credits). */
static void test_cq_capacity(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_cq_params_t cqp;
    vqp_t *first, *second;
    side_t s;

    side_open(&s);
    vqp_cq_destroy(s.cq);
    vqp_cq_params_default(&cqp);
    cqp.devs[0]  = s.dev;
    cqp.num_devs = 1;
    cqp.cqe      = 1024;
    assert_int_equal(vqp_cq_create(&cqp, &s.cq), UCS_OK);
    params.cq              = s.cq;
    params.max_ops         = 4096; /* would have reserved 8192 entries */
    params.max_outstanding = 64;   /* 4 data QPs x 128 receives */
    params.max_recvs       = 64;
    assert_int_equal(vqp_create(&params, &first), UCS_OK);
    assert_int_equal(s.cq->devs[0].cqe_reserved, 4 * 128 + 64);
    assert_int_equal(vqp_create(&params, &second), UCS_ERR_EXCEEDS_LIMIT);
    expect_log("cannot take a QP needing 129"); /* 128 + its cover */
    vqp_destroy(first);
    assert_int_equal(vqp_create(&params, &second), UCS_OK);
    vqp_destroy(second);
    check_cq_idle(s.cq);
    side_close(&s);
}

/* Reservations that would take a CQ's last entry are refused: WQEs need a
 * credit each, and with none left every QP of the CQ would wait for good.
 * The virtual QPs that fit still run. */
static void test_cq_last_entry(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    vqp_t *vqps[64], *peer;
    char addr_a[2048], addr_b[2048];
    size_t len_a, len_b;
    unsigned n = 0, entries, per = 0, i;
    vqp_cq_params_t cqp;
    vqp_send_wr_t wr;
    side_t s, b;
    vqp_cq_dev_t *cdev;

    side_open(&s);
    side_open(&b);
    vqp_cq_destroy(s.cq);
    vqp_cq_params_default(&cqp);
    cqp.devs[0]  = s.dev;
    cqp.num_devs = 1;
    cqp.cqe      = 64;
    assert_int_equal(vqp_cq_create(&cqp, &s.cq), UCS_OK);
    cdev      = &s.cq->devs[0];
    entries   = cdev->cq.mask + 1;
    params.cq = s.cq;
    /* Receives per virtual QP such that whole ones fill the CQ exactly. */
    for (params.max_recvs = 1; params.max_recvs < entries / 2;
         ++params.max_recvs) {
        assert_int_equal(vqp_create(&params, &vqps[0]), UCS_OK);
        per = entries - (unsigned)cdev->credits;
        vqp_destroy(vqps[0]);
        if ((entries % per) == 0) {
            break;
        }
    }
    assert_true((per > 0) && ((entries % per) == 0) && (entries / per > 1));
    while (vqp_create(&params, &vqps[n]) == UCS_OK) {
        ++n;
        assert_true(n < entries / per);
        assert_true(cdev->credits >= 1);
    }
    expect_log("make the CQ larger");
    assert_int_equal(n, entries / per - 1);

    /* The last one still moves data. */
    params.cq = b.cq;
    assert_int_equal(vqp_create(&params, &peer), UCS_OK);
    assert_int_equal(
        vqp_address_pack(vqps[n - 1], addr_a, sizeof(addr_a), &len_a), UCS_OK);
    assert_int_equal(vqp_address_pack(peer, addr_b, sizeof(addr_b), &len_b),
                     UCS_OK);
    assert_int_equal(vqp_connect(vqps[n - 1], addr_b, len_b), UCS_OK);
    assert_int_equal(vqp_connect(peer, addr_a, len_a), UCS_OK);
    fill_pattern(s.buf, 4096, 5);
    memset(b.buf, 0, 4096);
    wr       = make_wr(&s, &b, VQP_OP_WRITE, 1, 0, 0, 4096);
    wr.flags = VQP_SEND_SIGNALED;
    assert_int_equal(vqp_post_send(vqps[n - 1], &wr), UCS_OK);
    for (i = 0; (i < 2000000) && (s.nwcs == 0); ++i) {
        s.nwcs += vqp_cq_poll(s.cq, s.wcs, MAX_WCS);
        b.nwcs += vqp_cq_poll(b.cq, b.wcs, MAX_WCS);
    }
    assert_int_equal(s.nwcs, 1);
    assert_int_equal(s.wcs[0].status, UCS_OK);
    assert_memory_equal(s.buf, b.buf, 4096);
    for (i = 0; i < n; ++i) {
        vqp_destroy(vqps[i]);
    }
    vqp_destroy(peer);
    side_close(&s);
    side_close(&b);
}

#define CREDIT_VQPS 6

/* Virtual QPs of one side on one CQ of few entries, each connected to its
 * own peer QP on the other side. */
typedef struct credit_set {
    side_t a; /* the CQ under test */
    side_t b;
    vqp_t *va[CREDIT_VQPS];
    vqp_t *vb[CREDIT_VQPS];
    unsigned n;
} credit_set_t;

/* @a max_covers: the CQ's cover entries; 0: the default. */
static void credit_set_create_covers(credit_set_t *cs, unsigned n, unsigned cqe,
                                     vqp_params_t params, uint32_t max_covers)
{
    char addr_a[2048], addr_b[2048];
    size_t len_a, len_b;
    vqp_cq_params_t cqp;
    unsigned i;

    cs->n = n;
    side_open(&cs->a);
    side_open(&cs->b);
    vqp_cq_destroy(cs->a.cq);
    vqp_cq_params_default(&cqp);
    cqp.devs[0]  = cs->a.dev;
    cqp.num_devs = 1;
    cqp.cqe      = cqe;
    if (max_covers != 0) {
        cqp.max_covers = max_covers;
    }
    assert_int_equal(vqp_cq_create(&cqp, &cs->a.cq), UCS_OK);
    for (i = 0; i < n; ++i) {
        params.cq = cs->a.cq;
        assert_int_equal(vqp_create(&params, &cs->va[i]), UCS_OK);
        params.cq = cs->b.cq;
        assert_int_equal(vqp_create(&params, &cs->vb[i]), UCS_OK);
        assert_int_equal(
            vqp_address_pack(cs->va[i], addr_a, sizeof(addr_a), &len_a),
            UCS_OK);
        assert_int_equal(
            vqp_address_pack(cs->vb[i], addr_b, sizeof(addr_b), &len_b),
            UCS_OK);
        assert_int_equal(vqp_connect(cs->va[i], addr_b, len_b), UCS_OK);
        assert_int_equal(vqp_connect(cs->vb[i], addr_a, len_a), UCS_OK);
    }
}

static void credit_set_create(credit_set_t *cs, unsigned n, unsigned cqe,
                              vqp_params_t params)
{
    credit_set_create_covers(cs, n, cqe, params, 0);
}

static void credit_set_poll(credit_set_t *cs)
{
    cs->a.nwcs +=
        vqp_cq_poll(cs->a.cq, cs->a.wcs + cs->a.nwcs, MAX_WCS - cs->a.nwcs);
    cs->b.nwcs +=
        vqp_cq_poll(cs->b.cq, cs->b.wcs + cs->b.nwcs, MAX_WCS - cs->b.nwcs);
}

static void credit_set_wait(credit_set_t *cs, unsigned a_want)
{
    unsigned steps;

    for (steps = 0; (steps < 2000000) && (cs->a.nwcs < a_want); ++steps) {
        credit_set_poll(cs);
        if ((steps & 63) == 63) {
            sched_yield();
        }
    }
    assert_int_equal(cs->a.nwcs, a_want);
}

static void credit_set_destroy(credit_set_t *cs)
{
    unsigned i;

    for (i = 0; i < cs->n; ++i) {
        vqp_destroy(cs->va[i]);
        vqp_destroy(cs->vb[i]);
    }
    /* CQEs of destroyed QPs hold their entries until polled past. */
    for (i = 0; i < 100; ++i) {
        credit_set_poll(cs);
    }
    check_cq_idle(cs->a.cq);
    side_close(&cs->a);
    side_close(&cs->b);
}

/* The WQEs each virtual QP may have in flight (its QPs' rings) add up to
 * far more than the shared CQ holds: posts wait for CQ credits instead of
 * overflowing it (fatal on a ConnectX; the software device fails the CQ),
 * and every operation completes once, in order per virtual QP, with its
 * data. */
static void test_cq_credits_shared(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    uint64_t waits = 0, len = 3000;
    unsigned i, j, per = 60, count[CREDIT_VQPS] = {0};
    vqp_stats_t stats;
    vqp_send_wr_t wr;
    credit_set_t cs;
    uint64_t off;

    params.max_recvs = 0; /* nothing reserved: every entry is a credit */
    credit_set_create(&cs, CREDIT_VQPS, 128, params);
    fill_pattern(cs.a.buf, BUF_SIZE, 21);
    memset(cs.b.buf, 0, BUF_SIZE);
    for (j = 0; j < per; ++j) {
        for (i = 0; i < cs.n; ++i) {
            off = (i * per + j) * len;
            wr  = make_wr(&cs.a, &cs.b, VQP_OP_WRITE, i * 1000 + j, off, off,
                         (j % 3 == 2) ? 100000 : len); /* some striped */
            if (wr.length != len) {
                wr.local_addr =
                    wr.remote_addr - (uintptr_t)cs.b.buf + (uintptr_t)cs.a.buf;
                wr.length = len;
                wr.opcode = VQP_OP_WRITE;
            }
            assert_int_equal(vqp_post_send(cs.va[i], &wr), UCS_OK);
        }
    }
    /* 360 WQEs wanted, 128 - 30 (one per QP to cover it) entries. */
    assert_true(cs.a.cq->devs[0].credits <= 0);
    credit_set_wait(&cs, cs.n * per);
    for (j = 0; j < cs.a.nwcs; ++j) {
        i = (unsigned)(cs.a.wcs[j].wr_id / 1000);
        assert_true(i < cs.n);
        assert_int_equal(cs.a.wcs[j].status, UCS_OK);
        assert_int_equal(cs.a.wcs[j].wr_id % 1000, count[i]);
        ++count[i];
    }
    for (i = 0; i < cs.n; ++i) {
        assert_int_equal(count[i], per);
        vqp_query_stats(cs.va[i], &stats);
        waits += stats.credit_waits;
    }
    assert_true(waits > 0);
    assert_memory_equal(cs.a.buf, cs.b.buf, cs.n * per * len);
    for (i = 0; i < 100; ++i) {
        credit_set_poll(&cs);
    }
    assert_int_equal(cs.a.nwcs, cs.n * per); /* exactly once */
    credit_set_destroy(&cs);
}

#define STRIPED_FRAGS 16
#define STRIPED_LEN   (STRIPED_FRAGS * 4096)

/* Spray over 4 QPs, 4 KiB fragments, nothing reserved for receives. */
static vqp_params_t striped_params(unsigned max_outstanding)
{
    vqp_params_t params = base_params(4, VQP_LB_SPRAY);

    params.frag_size        = 4096;
    params.stripe_threshold = 4096;
    params.max_outstanding  = max_outstanding;
    params.max_recvs        = 0;
    return params;
}

/* @a ops WRITEs of STRIPED_FRAGS fragments each from cs->va[0]. */
static void striped_post(credit_set_t *cs, unsigned ops, unsigned seed)
{
    vqp_send_wr_t wr;
    unsigned i;

    fill_pattern(cs->a.buf, ops * STRIPED_LEN, seed);
    memset(cs->b.buf, 0, ops * STRIPED_LEN);
    for (i = 0; i < ops; ++i) {
        wr = make_wr(&cs->a, &cs->b, VQP_OP_WRITE, i, i * STRIPED_LEN,
                     i * STRIPED_LEN, STRIPED_LEN);
        assert_int_equal(vqp_post_send(cs->va[0], &wr), UCS_OK);
    }
}

/* They all complete once, in order, with their data; every credit is back
 * once the set is gone. */
static void striped_finish(credit_set_t *cs, unsigned ops)
{
    vqp_stats_t stats;

    credit_set_wait(cs, ops);
    check_in_order(&cs->a, ops, 0);
    assert_memory_equal(cs->a.buf, cs->b.buf, ops * STRIPED_LEN);
    vqp_query_stats(cs->va[0], &stats);
    assert_int_equal(stats.frags_posted, ops * STRIPED_FRAGS);
    credit_set_destroy(cs);
}

/* A striped operation takes the CQ credits of all its fragments at once:
 * with fewer credits left it posts as many fragments as there are credits
 * (the count never goes below zero), waits, and goes on with credits that
 * come back. */
static void test_striped_credits_partial(void **state)
{
    const unsigned ops = 6;
    vqp_stats_t stats;
    credit_set_t cs;
    int32_t credits0;

    credit_set_create(&cs, 1, 32, striped_params(64)); /* rings: no limit */
    credits0 = cs.a.cq->devs[0].credits;
    assert_true((credits0 > STRIPED_FRAGS) && (credits0 < 2 * STRIPED_FRAGS));
    striped_post(&cs, ops, 5);
    vqp_query_stats(cs.va[0], &stats);
    assert_int_equal(stats.frags_posted, (uint64_t)credits0);
    assert_int_equal(cs.a.cq->devs[0].credits, 0);
    assert_true(stats.credit_waits >= 1);
    striped_finish(&cs, ops);
}

/* The QPs' rings fill before the fragments of a striped operation are all
 * posted: the credits it took for those that did not go are given back. */
static void test_striped_rings_full_credits(void **state)
{
    const unsigned ops  = 8;
    vqp_params_t params = striped_params(2);
    vqp_stats_t stats;
    credit_set_t cs;
    int32_t credits0;

    params.max_ops = ops; /* the ring of QP 0 (also the send QP) */
    credit_set_create(&cs, 1, 1024, params);
    credits0 = cs.a.cq->devs[0].credits;
    striped_post(&cs, ops, 6);
    vqp_query_stats(cs.va[0], &stats);
    assert_true(stats.frags_posted < ops * STRIPED_FRAGS); /* rings full */
    assert_int_equal(cs.a.cq->devs[0].credits,
                     credits0 - (int32_t)stats.frags_posted);
    assert_int_equal(stats.credit_waits, 0);
    striped_finish(&cs, ops);
}

/* One virtual QP holds most credits with unsignaled WQEs that no CQE
 * covers, then goes idle: another one's posts must not wait forever. The
 * CQ covers the idle QP with a signaled NOP from its reserved entry. */
static void test_cq_credits_unsignaled_holder(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    unsigned i, n_unsig;
    vqp_stats_t stats;
    vqp_send_wr_t wr;
    credit_set_t cs;

    params.max_recvs = 0;
    params.max_ops   = 256; /* the send QP signals every 128th WQE */
    credit_set_create(&cs, 2, 128, params);
    fill_pattern(cs.a.buf, BUF_SIZE, 22);
    memset(cs.b.buf, 0, BUF_SIZE);
    /* 126 entries are credits (one per QP is the cover reserve): all of
     * them held. */
    n_unsig = 126;
    for (i = 0; i < n_unsig; ++i) {
        wr       = make_wr(&cs.a, &cs.b, VQP_OP_WRITE, i, i * 64, i * 64, 64);
        wr.flags = 0;
        assert_int_equal(vqp_post_send(cs.va[0], &wr), UCS_OK);
    }
    for (i = 0; i < 200; ++i) {
        credit_set_poll(&cs); /* executed; no CQE covers them */
    }
    assert_int_equal(cs.a.nwcs, 0);
    assert_int_equal(cs.a.cq->devs[0].credits, 128 - 2 - (int)n_unsig);
    for (i = 0; i < 20; ++i) {
        wr = make_wr(&cs.a, &cs.b, VQP_OP_WRITE, 1000 + i, 100000 + i * 64,
                     100000 + i * 64, 64);
        assert_int_equal(vqp_post_send(cs.va[1], &wr), UCS_OK);
    }
    credit_set_wait(&cs, 20);
    check_in_order(&cs.a, 20, 1000);
    vqp_query_stats(cs.va[1], &stats);
    assert_true(stats.credit_waits > 0);
    assert_memory_equal(cs.a.buf, cs.b.buf, n_unsig * 64);
    assert_memory_equal(cs.a.buf + 100000, cs.b.buf + 100000, 20 * 64);
    /* The cover NOP completed the idle QP's WQEs: all credits are back. */
    assert_int_equal(cs.a.cq->devs[0].credits, 128 - 2);
    credit_set_destroy(&cs);
}

/* The CQ keeps one cover entry (max_covers 1) for four QPs. Three idle
 * virtual QPs hold nearly all credits with unsignaled WQEs no CQE covers;
 * the fourth runs short: the covers go one at a time, each after the CQE
 * of the one before gave entries back, until its operations complete. A
 * CQ of any size takes any number of QPs (one entry per QP would bound
 * them by the CQ). */
static void test_cq_credits_capped_covers(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    const unsigned per = 20, holders = 3;
    uint64_t cover_waits = 0;
    vqp_stats_t stats;
    vqp_send_wr_t wr;
    credit_set_t cs;
    unsigned i, j;

    params.max_recvs = 0;
    params.max_ops   = 256; /* the QP signals every 128th WQE */
    credit_set_create_covers(&cs, holders + 1, 64, params, 1);
    assert_int_equal(cs.a.cq->devs[0].cover_reserve, 1);
    assert_int_equal(cs.a.cq->devs[0].credits, 63);
    fill_pattern(cs.a.buf, BUF_SIZE, 23);
    memset(cs.b.buf, 0, BUF_SIZE);
    for (i = 0; i < holders; ++i) {
        for (j = 0; j < per; ++j) {
            wr       = make_wr(&cs.a, &cs.b, VQP_OP_WRITE, i * 1000 + j,
                               (i * per + j) * 64, (i * per + j) * 64, 64);
            wr.flags = 0;
            assert_int_equal(vqp_post_send(cs.va[i], &wr), UCS_OK);
        }
    }
    for (i = 0; i < 200; ++i) {
        credit_set_poll(&cs); /* executed; no CQE covers them */
    }
    assert_int_equal(cs.a.nwcs, 0);
    assert_int_equal(cs.a.cq->devs[0].credits, 63 - (int)(holders * per));
    /* As many as the holders hold, unsignaled but the last: they hold
     * their credits until it completes, so every holder must be covered,
     * one after the other. */
    for (j = 0; j < holders * per; ++j) {
        wr = make_wr(&cs.a, &cs.b, VQP_OP_WRITE, 9000 + j, 100000 + j * 64,
                     100000 + j * 64, 64);
        wr.flags = (j == holders * per - 1) ? VQP_SEND_SIGNALED : 0;
        assert_int_equal(vqp_post_send(cs.va[holders], &wr), UCS_OK);
    }
    credit_set_wait(&cs, 1);
    assert_int_equal(cs.a.wcs[0].wr_id, 9000 + holders * per - 1);
    assert_int_equal(cs.a.wcs[0].status, UCS_OK);
    assert_memory_equal(cs.a.buf, cs.b.buf, holders * per * 64);
    assert_memory_equal(cs.a.buf + 100000, cs.b.buf + 100000,
                        holders * per * 64);
    for (i = 0; i <= holders; ++i) {
        vqp_query_stats(cs.va[i], &stats);
        cover_waits += stats.cover_waits;
        if (i < holders) {
            /* reported by the cover, unsignaled: no completion */
            assert_int_equal(stats.ops_completed, per);
        }
    }
    assert_true(cover_waits >= holders - 1); /* one entry, one at a time */
    for (i = 0; i < 100; ++i) {
        credit_set_poll(&cs);
    }
    assert_int_equal(cs.a.nwcs, 1); /* exactly once */
    assert_int_equal(cs.a.cq->devs[0].credits, 63);
    credit_set_destroy(&cs);
}

/* A QP canceled while its unsignaled WQEs hold credits needs a cover (the
 * flush reports none of them), but the one cover entry is taken by another
 * QP's cover whose CQE is not polled yet: the canceled virtual QP's cover
 * waits for that CQE (a cover wait), then goes, and its operations end. */
static void test_cq_cover_waits_for_entry(void **state)
{
    vqp_params_t params = base_params(1, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    credit_set_t cs;
    vqp_stats_t stats;
    unsigned i, j;

    params.max_recvs = 0;
    params.max_ops   = 256;
    credit_set_create_covers(&cs, 2, 64, params, 1);
    for (i = 0; i < 2; ++i) { /* 40 + 23: every credit held */
        for (j = 0; j < (i ? 23u : 40u); ++j) {
            wr       = make_wr(&cs.a, &cs.b, VQP_OP_WRITE, i * 1000 + j,
                               (i * 64 + j) * 64, (i * 64 + j) * 64, 64);
            wr.flags = 0;
            assert_int_equal(vqp_post_send(cs.va[i], &wr), UCS_OK);
        }
    }
    for (i = 0; i < 200; ++i) {
        credit_set_poll(&cs); /* executed; no CQE covers them */
    }
    assert_int_equal(cs.a.cq->devs[0].credits, 0);
    vqp_cover_in_flight(cs.va[1]); /* takes the kept entry */
    assert_int_equal(cs.a.cq->devs[0].credits, -1);
    vqp_cancel(cs.va[0]); /* no entry for its cover now */
    vqp_query_stats(cs.va[0], &stats);
    assert_int_equal(stats.cover_waits, 1);
    for (i = 0; (i < 100000) && ((vqp_ops_in_flight(cs.va[0]) != 0) ||
                                 (vqp_ops_in_flight(cs.va[1]) != 0));
         ++i) {
        credit_set_poll(&cs);
    }
    assert_int_equal(vqp_ops_in_flight(cs.va[0]), 0);
    assert_int_equal(vqp_ops_in_flight(cs.va[1]), 0);
    assert_int_equal(cs.a.nwcs, 0); /* unsignaled, canceled: no reports */
    assert_int_equal(cs.a.cq->devs[0].credits, 63);
    credit_set_destroy(&cs);
}

/* A virtual QP destroyed with CQEs written but not polled: those CQEs keep
 * their entries until the poll passes them, then every credit is back. */
static void test_cq_credits_destroy_unpolled(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_send_wr_t wr;
    credit_set_t cs;
    unsigned i;
    int32_t before;

    credit_set_create(&cs, 1, 1024, params);
    for (i = 0; i < 10; ++i) {
        wr = make_wr(&cs.a, &cs.b, VQP_OP_WRITE, i, 0, 0, 200000);
        assert_int_equal(vqp_post_send(cs.va[0], &wr), UCS_OK);
    }
    /* Let both devices execute and write CQEs, without polling side a. */
    for (i = 0; i < 2000; ++i) {
        vqp_dev_progress(cs.a.dev);
        vqp_cq_progress(cs.b.cq);
    }
    before = cs.a.cq->devs[0].credits;
    vqp_destroy(cs.va[0]);
    /* Everything but the unpolled CQEs came back. */
    assert_true(cs.a.cq->devs[0].credits > before);
    assert_true(cs.a.cq->devs[0].credits < 1024);
    cs.va[0] = NULL;
    vqp_destroy(cs.vb[0]);
    cs.n = 0;
    credit_set_destroy(&cs);
}

/* max_recvs 0: the data QPs post no receives (nothing reserved for them),
 * the address tells the peer, whose WRITE_IMMs are refused with a clear
 * error; plain RDMA works. */
static void test_no_recvs(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_recv_wr_t rwr   = {0};
    vqp_send_wr_t wr;
    pair_t p;

    params.max_recvs = 0;
    pair_create(&p, &params);
    assert_int_equal(p.a.cq->devs[0].cqe_reserved, 0);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE_IMM, 1, 0, 0, 100000);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_UNSUPPORTED);
    expect_log("receives no notifications");
    rwr.addr    = (uintptr_t)p.b.buf;
    rwr.length  = 64;
    rwr.lkey[0] = p.b.lkey;
    assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_ERR_UNSUPPORTED);
    expect_log("created with max_recvs 0");
    fill_pattern(p.a.buf, BUF_SIZE, 23);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 2, 0, 0, 300000);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    check_in_order(&p.a, 1, 2);
    assert_memory_equal(p.a.buf, p.b.buf, 300000);
    pair_destroy(&p);
}

/* ----------------------------------------------------- shared receives */

static void srq_cb(void *arg, const vqp_wc_t *wc)
{
    side_t *s = arg;

    assert_true(s->nwcs < MAX_WCS);
    s->wcs[s->nwcs++] = *wc;
}

static void srq_release(void *arg, uint64_t wr_id)
{
    ++*(unsigned *)arg;
}

static void srq_progress(side_t *a, side_t *b, unsigned a_want, unsigned b_want)
{
    unsigned steps;

    for (steps = 0; steps < 2000000; ++steps) {
        vqp_cq_progress(a->cq);
        vqp_cq_progress(b->cq);
        if ((a->nwcs >= a_want) && (b->nwcs >= b_want)) {
            return;
        }
        if ((steps & 63) == 63) {
            sched_yield();
        }
    }
    fail_msg("timeout: side a %u/%u completions, side b %u/%u", a->nwcs, a_want,
             b->nwcs, b_want);
}

/* Two virtual QPs of side b (one DQPLB with 4 QPs, one of 1 QP) share one
 * SRQ: SENDs from both of side a's take its buffers in order, each
 * completion names its virtual QP; own receive buffers are refused; the
 * SRQ is busy while used, and returns its unconsumed buffers when
 * destroyed. */
static void test_srq(void **state)
{
    vqp_params_t params[2] = {base_params(4, VQP_LB_DQPLB),
                              base_params(1, VQP_LB_DQPLB)};
    vqp_t *va[2], *vb[2];
    char addr[2][2048];
    size_t len[2];
    vqp_recv_wr_t rwr = {0};
    vqp_send_wr_t wr;
    unsigned i, k, posted0, released = 0;
    ucs_status_t st;
    vqp_srq_t *srq;
    side_t a, b;

    side_open(&a);
    side_open(&b);
    assert_int_equal(vqp_srq_create(b.cq, 16, &srq), UCS_OK);
    for (k = 0; k < 2; ++k) {
        params[k].comp_cb  = srq_cb;
        params[k].cq       = a.cq;
        params[k].comp_arg = &a;
        assert_int_equal(vqp_create(&params[k], &va[k]), UCS_OK);
        params[k].cq       = b.cq;
        params[k].comp_arg = &b;
        params[k].srq      = srq;
        assert_int_equal(vqp_create(&params[k], &vb[k]), UCS_OK);
        assert_int_equal(
            vqp_address_pack(va[k], addr[0], sizeof(addr[0]), &len[0]), UCS_OK);
        assert_int_equal(
            vqp_address_pack(vb[k], addr[1], sizeof(addr[1]), &len[1]), UCS_OK);
        assert_int_equal(vqp_connect(va[k], addr[1], len[1]), UCS_OK);
        assert_int_equal(vqp_connect(vb[k], addr[0], len[0]), UCS_OK);
    }

    /* Buffers go to the SRQ, not to a virtual QP. */
    rwr.wr_id   = 1;
    rwr.addr    = (uintptr_t)b.buf;
    rwr.length  = 4096;
    rwr.lkey[0] = b.lkey;
    assert_int_equal(vqp_post_recv(vb[0], &rwr), UCS_ERR_UNSUPPORTED);
    rwr.length = 0;
    assert_int_equal(vqp_post_recv(vb[1], &rwr), UCS_ERR_UNSUPPORTED);
    assert_int_equal(vqp_srq_post_recv(srq, &rwr), UCS_ERR_INVALID_PARAM);
    /* Fill it: an SRQ asked for 16 takes at least 15 (the mlx5 free list
     * keeps one WQE unlinked), then says NO_RESOURCE. */
    for (i = 0;; ++i) {
        assert_true(i < 1024);
        rwr.wr_id  = 100 + i;
        rwr.addr   = (uintptr_t)b.buf + i * 4096;
        rwr.length = 4096;
        st         = vqp_srq_post_recv(srq, &rwr);
        if (st != UCS_OK) {
            assert_int_equal(st, UCS_ERR_NO_RESOURCE);
            break;
        }
    }
    assert_true(vqp_srq_posted(srq) >= 15);
    assert_int_equal(vqp_srq_posted(srq), i);

    posted0 = vqp_srq_posted(srq);
    fill_pattern(a.buf, 65536, 12);
    for (i = 0; i < 6; ++i) {
        wr     = make_wr(&a, &b, VQP_OP_SEND_IMM, i, i * 1000, 0, 100 + i);
        wr.imm = 0x500 + i;
        assert_int_equal(vqp_post_send(va[i & 1], &wr), UCS_OK);
    }
    srq_progress(&a, &b, 6, 6);
    for (i = 0; i < 6; ++i) {
        const vqp_wc_t *wc = &b.wcs[i];
        uint64_t slot      = wc->wr_id - 100;

        assert_int_equal(wc->status, UCS_OK);
        assert_int_equal(wc->opcode, VQP_OP_RECV);
        assert_true(wc->flags & VQP_WC_WITH_IMM);
        assert_true(slot < posted0);
        k = wc->imm - 0x500;
        assert_true(k < 6);
        assert_ptr_equal(wc->vqp, vb[k & 1]);
        assert_int_equal(wc->byte_len, 100 + k);
        assert_memory_equal(b.buf + slot * 4096, a.buf + k * 1000, 100 + k);
    }
    /* Each virtual QP's messages arrive in its order. */
    for (k = 0; k < 2; ++k) {
        uint32_t last = 0;

        for (i = 0; i < 6; ++i) {
            if (b.wcs[i].vqp == vb[k]) {
                assert_true(b.wcs[i].imm >= last);
                last = b.wcs[i].imm;
            }
        }
    }
    assert_int_equal(vqp_srq_posted(srq) + 6, posted0);
    assert_int_equal(vqp_srq_destroy(srq, srq_release, &released),
                     UCS_ERR_BUSY);

    /* A SEND that landed (CQE written, not polled) when its virtual QP is
     * destroyed: its SRQ entry is taken back, not stranded. */
    posted0 = vqp_srq_posted(srq);
    wr      = make_wr(&a, &b, VQP_OP_SEND, 50, 0, 0, 64);
    assert_int_equal(vqp_post_send(va[0], &wr), UCS_OK);
    for (i = 0; a.nwcs < 7; ++i) {
        assert_true(i < 1000000);
        vqp_cq_progress(a.cq);
        vqp_dev_progress(b.dev); /* the engine delivers; nobody polls */
    }
    for (i = 0; i < 100; ++i) {
        vqp_dev_progress(b.dev);
    }
    assert_int_equal(b.nwcs, 6);
    vqp_destroy(vb[0]);
    assert_int_equal(vqp_srq_posted(srq), posted0);
    for (i = 0; i < 100; ++i) {
        vqp_cq_progress(b.cq);
    }
    assert_int_equal(b.nwcs, 6); /* nothing for the destroyed one */
    /* The other virtual QP still receives into the SRQ. */
    wr = make_wr(&a, &b, VQP_OP_SEND, 51, 0, 0, 64);
    assert_int_equal(vqp_post_send(va[1], &wr), UCS_OK);
    srq_progress(&a, &b, 8, 7);
    assert_ptr_equal(b.wcs[6].vqp, vb[1]);
    assert_int_equal(b.wcs[6].status, UCS_OK);
    vb[0] = NULL;
    /* Every buffer the SRQ thinks it has is really there: as many SENDs
     * as it holds all land (a stranded entry would leave the last one
     * waiting for a buffer forever). */
    k = vqp_srq_posted(srq);
    for (i = 0; i < k; ++i) {
        wr = make_wr(&a, &b, VQP_OP_SEND, 60 + i, 0, 0, 64);
        assert_int_equal(vqp_post_send(va[1], &wr), UCS_OK);
    }
    srq_progress(&a, &b, 8 + k, 7 + k);
    assert_int_equal(vqp_srq_posted(srq), 0);
    posted0 = 6; /* what the release must return: none is left */

    for (k = 0; k < 2; ++k) {
        vqp_destroy(va[k]);
        if (vb[k] != NULL) {
            vqp_destroy(vb[k]);
        }
    }
    k = vqp_srq_posted(srq);
    assert_int_equal(vqp_srq_destroy(srq, srq_release, &released), UCS_OK);
    assert_int_equal(released, k);
    assert_int_equal(released, posted0 - 6);

    /* An SRQ needs callback completions. */
    assert_int_equal(vqp_srq_create(b.cq, 4, &srq), UCS_OK);
    params[0].cq      = b.cq;
    params[0].srq     = srq;
    params[0].comp_cb = NULL;
    assert_int_equal(vqp_create(&params[0], &vb[0]), UCS_ERR_INVALID_PARAM);
    params[0].comp_cb = srq_cb;
    params[0].cq      = a.cq; /* another virtual CQ */
    assert_int_equal(vqp_create(&params[0], &vb[0]), UCS_ERR_INVALID_PARAM);
    assert_int_equal(vqp_srq_destroy(srq, NULL, NULL), UCS_OK);
    assert_int_equal(vqp_srq_create(b.cq, 0, &srq), UCS_ERR_INVALID_PARAM);
    side_close(&a);
    side_close(&b);
}

/* The probe: a zero-length WRITE on every QP at once. It succeeds while
 * the peer answers (also after one data QP failed); when the peer is gone
 * it fails once, with no fragment replayed QP after QP. */
static void run_probe(vqp_lb_t lb)
{
    vqp_params_t params = base_params(4, lb);
    vqp_stats_t before, after;
    vqp_send_wr_t wr;
    pair_t p;

    params.connect.timeout   = 8; /* ~1 ms per try, 2 tries */
    params.connect.retry_cnt = 1;
    pair_create(&p, &params);
    wr        = make_wr(&p.a, &p.b, VQP_OP_PROBE, 1, 0, 0, 0);
    wr.length = 0;
    vqp_query_stats(p.a.vqp, &before);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 1, 0);
    assert_int_equal(p.a.wcs[0].wr_id, 1);
    assert_int_equal(p.a.wcs[0].status, UCS_OK);
    vqp_query_stats(p.a.vqp, &after);
    assert_int_equal(after.frags_posted - before.frags_posted,
                     p.a.vqp->num_pqps);

    /* One data QP (not the send QP) dies: the peer still answers. */
    assert_int_equal(vqp_dev_qp_set_error(p.a.vqp->qps[1].dev_qp), UCS_OK);
    wr.wr_id = 2;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 2, 0);
    assert_int_equal(p.a.wcs[1].wr_id, 2);
    assert_int_equal(p.a.wcs[1].status, UCS_OK);

    /* The peer's virtual QP is gone: every QP fails at once. */
    vqp_destroy(p.b.vqp);
    p.b.vqp = NULL;
    vqp_query_stats(p.a.vqp, &before);
    wr.wr_id = 3;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    pair_wait(&p, 3, 0);
    pair_idle(&p, 100);
    assert_int_equal(p.a.nwcs, 3);
    assert_int_equal(p.a.wcs[2].wr_id, 3);
    assert_true(p.a.wcs[2].status != UCS_OK);
    vqp_query_stats(p.a.vqp, &after);
    assert_int_equal(after.frags_replayed, before.frags_replayed);
    assert_int_equal(after.frags_posted - before.frags_posted,
                     p.a.vqp->num_pqps - 1);
    pair_destroy(&p);
}

static void test_probe(void **state)
{
    run_probe(VQP_LB_DQPLB);
    run_probe(VQP_LB_SPRAY);
}

/* An inline WRITE or SEND is copied within the call (the fast path's too):
 * the caller may overwrite its buffer at once. */
static void test_inline_write_copied(void **state)
{
    vqp_params_t params = base_params(4, VQP_LB_DQPLB);
    vqp_recv_wr_t rwr   = {0};
    char expect[64];
    vqp_send_wr_t wr;
    unsigned i;
    pair_t p;

    pair_create(&p, &params);
    memset(p.b.buf, 0, 4096);
    for (i = 0; i < 8; ++i) {
        fill_pattern(p.a.buf, sizeof(expect), 20 + i);
        memcpy(expect, p.a.buf, sizeof(expect));
        wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, i, 0, 64 * i, 64);
        wr.flags = VQP_SEND_INLINE | VQP_SEND_SIGNALED;
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
        memset(p.a.buf, 0xee, sizeof(expect)); /* the caller reuses it */
        pair_wait(&p, i + 1, 0);
        assert_int_equal(p.a.wcs[i].status, UCS_OK);
        assert_memory_equal(p.b.buf + 64 * i, expect, sizeof(expect));
    }

    /* The same for inline SEND_IMM (am_short). */
    for (i = 0; i < 4; ++i) {
        rwr.wr_id   = 100 + i;
        rwr.addr    = (uintptr_t)p.b.buf + 8192 + 256 * i;
        rwr.length  = 256;
        rwr.lkey[0] = p.b.lkey;
        assert_int_equal(vqp_post_recv(p.b.vqp, &rwr), UCS_OK);
    }
    for (i = 0; i < 4; ++i) {
        fill_pattern(p.a.buf, sizeof(expect), 40 + i);
        memcpy(expect, p.a.buf, sizeof(expect));
        wr       = make_wr(&p.a, &p.b, VQP_OP_SEND_IMM, 20 + i, 0, 0, 40);
        wr.imm   = 7 + i;
        wr.flags = VQP_SEND_INLINE | VQP_SEND_SIGNALED;
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
        memset(p.a.buf, 0xee, sizeof(expect));
        pair_wait(&p, 9 + i, i + 1);
        assert_int_equal(p.b.wcs[i].status, UCS_OK);
        assert_int_equal(p.b.wcs[i].byte_len, 40);
        assert_int_equal(p.b.wcs[i].imm, 7 + i);
        assert_memory_equal(p.b.buf + 8192 + 256 * i, expect, 40);
    }
    pair_destroy(&p);
}

/* Completions by callback, as the UCT glue takes them: what each callback
 * sees, in posting order, exactly once; an unsignaled operation gets none,
 * an atomic's result is in place when its callback runs, and a callback may
 * post (a chain of whole WRITEs posted from inside the report) without
 * breaking the order or losing a completion. A striped operation in flight
 * ahead of whole ones holds their reports back until it completes. */
typedef struct report_cb {
    pair_t *p;
    vqp_wc_t wcs[64];
    uint64_t atomic_seen; /* the result word when the atomic's report ran */
    unsigned n;
    unsigned chain; /* posts left to make from callbacks */
} report_cb_t;

static void report_cb(void *arg, const vqp_wc_t *wc)
{
    report_cb_t *r = arg;
    vqp_send_wr_t wr;

    assert_true(r->n < ucs_static_array_size(r->wcs));
    assert_ptr_equal(wc->vqp, r->p->a.vqp);
    assert_int_equal(wc->flags, 0);
    assert_int_equal(wc->imm, 0);
    r->wcs[r->n++] = *wc;
    if (wc->opcode == VQP_OP_ATOMIC_FA) {
        r->atomic_seen = *(uint64_t *)(r->p->a.buf + 8192);
    }
    if ((wc->wr_id >= 5) && (wc->wr_id < 100) && (r->chain > 0)) {
        /* the first of the chain, posted from the report of id 5 */
        --r->chain;
        wr = make_wr(&r->p->a, &r->p->b, VQP_OP_WRITE, 100, 16384, 16384, 512);
        assert_int_equal(vqp_post_send(r->p->a.vqp, &wr), UCS_OK);
    } else if ((wc->wr_id >= 100) && (r->chain > 0)) {
        --r->chain;
        wr = make_wr(&r->p->a, &r->p->b, VQP_OP_WRITE, wc->wr_id + 1,
                     16384 + 512 * (wc->wr_id - 99),
                     16384 + 512 * (wc->wr_id - 99), 512);
        assert_int_equal(vqp_post_send(r->p->a.vqp, &wr), UCS_OK);
    }
}

static void report_cb_wait(pair_t *p, report_cb_t *r, unsigned want)
{
    unsigned steps;

    for (steps = 0; (r->n < want) && (steps < 2000000); ++steps) {
        vqp_cq_progress(p->a.cq);
        vqp_cq_progress(p->b.cq);
    }
    assert_int_equal(r->n, want);
}

static void test_report_callback(void **state)
{
    static const uint64_t expect_id[]  = {0, 1, 3, 5, 100, 101, 102};
    static const uint64_t expect_len[] = {200000, 100, 8, 4000, 512, 512, 512};
    vqp_params_t params                = base_params(4, VQP_LB_DQPLB);
    report_cb_t r                      = {0};
    uint64_t *remote;
    vqp_send_wr_t wr;
    unsigned i, n = ucs_static_array_size(expect_id);
    pair_t p;

    params.comp_cb  = report_cb;
    params.comp_arg = &r;
    pair_create(&p, &params);
    r.p     = &p;
    r.chain = 3;
    fill_pattern(p.a.buf, 1u << 20, 11);
    memset(p.b.buf, 0, 1u << 20);
    remote  = (uint64_t *)(p.b.buf + 8192);
    *remote = 40;

    /* striped, ahead of the whole ones */
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 0, 65536, 65536, 200000);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 100);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 2, 100, 100, 100);
    wr.flags = 0; /* no report */
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr             = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_FA, 3, 8192, 8192, 8);
    wr.compare_add = 2;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 5, 4096, 4096, 4000);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    assert_int_equal(r.n, 0);

    report_cb_wait(&p, &r, n);
    for (i = 0; i < n; ++i) {
        assert_int_equal(r.wcs[i].wr_id, expect_id[i]);
        assert_int_equal(r.wcs[i].status, UCS_OK);
        assert_int_equal(r.wcs[i].byte_len, expect_len[i]);
        assert_int_equal(r.wcs[i].opcode,
                         (i == 2) ? VQP_OP_ATOMIC_FA : VQP_OP_WRITE);
    }
    assert_int_equal(r.atomic_seen, 40);
    assert_int_equal(*remote, 42);
    assert_memory_equal(p.a.buf, p.b.buf, 200);
    assert_memory_equal(p.a.buf + 4096, p.b.buf + 4096, 4000);
    assert_memory_equal(p.a.buf + 16384, p.b.buf + 16384, 3 * 512);
    assert_memory_equal(p.a.buf + 65536, p.b.buf + 65536, 200000);

    /* A failed operation is reported, signaled or not, with its status;
     * its callback's wc carries it, the next one's does not. */
    r.n      = 0;
    wr       = make_wr(&p.a, &p.b, VQP_OP_WRITE, 7, 0, 0, 64);
    wr.flags = 0;
    wr.rkey[0] ^= 0x5a5a;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 8, 0, 524288, 65536);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    report_cb_wait(&p, &r, 2);
    assert_int_equal(r.wcs[0].wr_id, 7);
    assert_true(r.wcs[0].status != UCS_OK);
    assert_int_equal(r.wcs[0].byte_len, 64);
    assert_int_equal(r.wcs[1].wr_id, 8);
    assert_int_equal(r.wcs[1].status, UCS_OK);
    pair_idle(&p, 100);
    assert_int_equal(r.n, 2); /* exactly once */
    pair_destroy(&p);
}

/* While replays of a failed QP's fragments wait, the fast path is closed
 * (fast_ops 0): new operations go behind them through the slow path, and
 * complete in order; once the replays went, whole operations take the lean
 * path again. */
static void test_post_behind_replays(void **state)
{
    vqp_params_t params = base_params(2, VQP_LB_DQPLB);
    unsigned i, n = 4, extra = 0, waited = 0, steps;
    vqp_send_wr_t wr;
    uint32_t tail;
    pair_t p;

    /* The engines run in the polls only: the idle executor, running QP 1
     * while this thread waits for a CPU, would let its completions come
     * before QP 0's flushes, and no replay would wait. */
    setenv("VQP_SW_EXEC", "progress", 1);
    pair_create(&p, &params);
    unsetenv("VQP_SW_EXEC");
    assert_int_equal(p.a.vqp->fast_ops, p.a.vqp->fast_ops_up);
    fill_pattern(p.a.buf, 7u << 20, 6);
    memset(p.b.buf, 0, 7u << 20);
    /* Both data QPs' rings full (8 fragments of 64 KiB each). */
    for (i = 0; i < n; ++i) {
        wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, i, i * 262144, i * 262144,
                     262144);
        assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    }
    assert_int_equal(vqp_dev_qp_set_error(p.a.vqp->qps[0].dev_qp), UCS_OK);
    /* One CQE per poll: QP 0's flushed fragments come first and go to the
     * replay ring while QP 1's completions are not polled yet (its ring
     * full), so the replays wait. */
    p.a.cq->max_poll = 1;
    for (steps = 0; p.a.nwcs < n + extra; ++steps) {
        assert_true(steps < 2000000);
        pair_idle(&p, 1);
        if (p.a.vqp->replay_head != p.a.vqp->replay_tail) {
            ++waited;
            assert_int_equal(p.a.vqp->fast_ops, 0);
            if (extra < 8) {
                wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, n + extra,
                             (4u << 20) + extra * 1000,
                             (4u << 20) + extra * 1000, 1000);
                assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
                ++extra;
            }
        }
    }
    assert_true(waited > 0);
    check_in_order(&p.a, n + extra, 0);
    assert_memory_equal(p.a.buf, p.b.buf, n * 262144);
    assert_memory_equal(p.a.buf + (4u << 20), p.b.buf + (4u << 20),
                        extra * 1000);
    assert_int_equal(p.a.vqp->fast_ops, p.a.vqp->fast_ops_up);

    /* The lean path again: a whole WRITE is on the send QP at once. */
    tail = p.a.vqp->send_qp->frag_tail;
    wr   = make_wr(&p.a, &p.b, VQP_OP_WRITE, 99, 6u << 20, 6u << 20, 100);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_OK);
    assert_int_equal(p.a.vqp->send_qp->frag_tail, tail + 1);
    pair_wait(&p, n + extra + 1, 0);
    assert_int_equal(p.a.wcs[n + extra].wr_id, 99);
    assert_int_equal(p.a.wcs[n + extra].status, UCS_OK);
    pair_destroy(&p);
}

static void test_post_errors(void **state)
{
    vqp_params_t params = base_params(2, VQP_LB_DQPLB);
    char addr[2048];
    vqp_send_wr_t wr;
    vqp_t *other;
    size_t len;
    pair_t p;

    side_open(&p.a);
    params.cq = p.a.cq;
    assert_int_equal(vqp_create(&params, &p.a.vqp), UCS_OK);
    wr = make_wr(&p.a, &p.a, VQP_OP_WRITE, 1, 0, 0, 8);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_NOT_CONNECTED);

    /* addresses that do not fit */
    assert_int_equal(vqp_address_pack(p.a.vqp, addr, 3, &len),
                     UCS_ERR_BUFFER_TOO_SMALL);
    params.num_qps = 3;
    assert_int_equal(vqp_create(&params, &other), UCS_OK);
    assert_int_equal(vqp_address_pack(other, addr, sizeof(addr), &len), UCS_OK);
    assert_int_equal(vqp_connect(p.a.vqp, addr, len), UCS_ERR_INVALID_PARAM);
    vqp_destroy(other);
    params.num_qps = 2;
    params.lb      = VQP_LB_SPRAY;
    assert_int_equal(vqp_create(&params, &other), UCS_OK);
    assert_int_equal(vqp_address_pack(other, addr, sizeof(addr), &len), UCS_OK);
    assert_int_equal(vqp_connect(p.a.vqp, addr, len), UCS_ERR_INVALID_PARAM);
    assert_int_equal(vqp_connect(p.a.vqp, addr, 2), UCS_ERR_INVALID_PARAM);
    vqp_destroy(other);
    side_close(&p.a);

    params.lb = VQP_LB_DQPLB;
    pair_create(&p, &params);
    wr = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_FA, 1, 4, 8, 8);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    /* An operand of neither 8 nor 4 bytes, or one not aligned to its
     * size on either side. */
    wr = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_CS, 1, 8, 8, 2);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    wr = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_SWAP, 1, 8, 8, 16);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    wr = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_AND, 1, 8, 6, 4);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    wr = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_XOR, 1, 2, 8, 4);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    wr = make_wr(&p.a, &p.b, VQP_OP_ATOMIC_OR, 1, 8, 4, 8);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    wr = make_wr(&p.a, &p.b, VQP_OP_RECV, 1, 0, 0, 8);
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    wr = make_wr(&p.a, &p.b, VQP_OP_WRITE, 1, 0, 0, 100000);
    wr.flags |= VQP_SEND_INLINE;
    assert_int_equal(vqp_post_send(p.a.vqp, &wr), UCS_ERR_INVALID_PARAM);
    assert_int_equal(vqp_connect(p.a.vqp, addr, len), UCS_ERR_INVALID_PARAM);
    pair_idle(&p, 10);
    assert_int_equal(p.a.nwcs, 0);
    pair_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_1qp),
        cmocka_unit_test(test_write_4qp_dqplb),
        cmocka_unit_test(test_write_16qp_spray),
        cmocka_unit_test(test_shared_frag_rings),
        cmocka_unit_test(test_read_striped),
        cmocka_unit_test(test_write_imm_dqplb),
        cmocka_unit_test(test_write_imm_spray),
        cmocka_unit_test(test_write_imm_1qp),
        cmocka_unit_test(test_notify_before_recv),
        cmocka_unit_test(test_send_recv_dqplb),
        cmocka_unit_test(test_send_recv_spray),
        cmocka_unit_test(test_send_recv_1qp),
        cmocka_unit_test(test_ping_pong_1qp),
        cmocka_unit_test(test_rq_counter_wrap),
        cmocka_unit_test(test_atomics),
        cmocka_unit_test(test_atomics_ext),
        cmocka_unit_test(test_atomics_host_order),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_unsignaled_and_flush),
        cmocka_unit_test(test_unsignaled_and_flush_1qp),
        cmocka_unit_test(test_fence),
        cmocka_unit_test(test_fence_after_unsignaled),
        cmocka_unit_test(test_unsignaled_before_striped),
        cmocka_unit_test(test_fenced_inline_after_unsignaled),
        cmocka_unit_test(test_srq),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_inline_write_copied),
        cmocka_unit_test(test_qp_failure_dqplb),
        cmocka_unit_test(test_qp_failure_spray),
        cmocka_unit_test(test_inline_not_replayed),
        cmocka_unit_test(test_whole_replay),
        cmocka_unit_test(test_credit_episodes),
        cmocka_unit_test(test_cq_credits_capped_covers),
        cmocka_unit_test(test_cq_cover_waits_for_entry),
        cmocka_unit_test(test_ring_full_unsignaled),
        cmocka_unit_test(test_send_qp_fail_cb),
        cmocka_unit_test(test_destroy_after_cancel),
        cmocka_unit_test(test_cancel_full_ring_unsignaled),
        cmocka_unit_test_setup_teardown(test_cq_last_entry, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test(test_max_ops_beyond_sq),
        cmocka_unit_test(test_cancel_after_unsignaled),
        cmocka_unit_test(test_all_qps_fail),
        cmocka_unit_test(test_all_qps_fail_send_qp_unsignaled),
        cmocka_unit_test(test_remote_access_error),
        cmocka_unit_test(test_destroy_in_flight),
        cmocka_unit_test(test_dqplb_window),
        cmocka_unit_test(test_cancel_and_accounting),
        cmocka_unit_test(test_cancel_partly_posted),
        cmocka_unit_test(test_two_devices_spray),
        cmocka_unit_test(test_two_devices_dqplb),
        cmocka_unit_test(test_two_devices_64qp),
        cmocka_unit_test_setup_teardown(test_address_compact, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test_setup_teardown(test_bad_address, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test_setup_teardown(test_bad_address_two_devices,
                                        test_log_setup, test_log_teardown),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test_setup_teardown(test_cq_capacity, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test(test_cq_credits_shared),
        cmocka_unit_test(test_cq_credits_unsignaled_holder),
        cmocka_unit_test(test_striped_credits_partial),
        cmocka_unit_test(test_striped_rings_full_credits),
        cmocka_unit_test(test_cq_credits_destroy_unpolled),
        cmocka_unit_test_setup_teardown(test_no_recvs, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test(test_report_callback),
        cmocka_unit_test(test_post_behind_replays),
        cmocka_unit_test(test_post_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
