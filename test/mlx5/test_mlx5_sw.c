/*
 * The mlx5 data path against the software device (src/sw): two device
 * instances in one process, and two processes (fork) exchanging addresses
 * over a pipe. Every WQE is built, every doorbell rung and every CQE parsed
 * by src/mlx5 only; the device's API is used for setup alone. Checks data
 * moved by SEND (RQ and SRQ), RDMA WRITE / WRITE_IMM / READ and atomics, and
 * the error path (remote access error, then flushes).
 */
#include <config.h>

#include <mlx5/vqp_mlx5.h>
#include <sw/vqp_sw.h>

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#define EP_BUF     (1u << 20)
#define EP_SQ      64
#define EP_RQ      32
#define EP_INLINE  128
#define EP_SIG     8
#define TIMEOUT_NS 5000000000ull
#define ACCESS_ALL                                      \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

typedef struct ep {
    vqp_sw_dev_t *dev;
    vqp_sw_dev_addr_t addr;
    vqp_sw_cq_t *scq_h, *rcq_h;
    vqp_sw_srq_t *srq_h;
    vqp_sw_qp_t *qp_h;
    vqp_sw_mr_t *mr;
    uint32_t qpn, lkey, rkey;
    uint8_t *buf;
    vqp_mlx5_txwq_t sq;
    uint32_t bf_toggle;
    vqp_mlx5_rxwq_t rq;
    vqp_mlx5_srq_t srq;
    vqp_mlx5_cq_t scq, rcq;
} ep_t;

/* What a peer needs to reach an endpoint (sent over a pipe across fork). */
typedef struct ep_info {
    vqp_sw_dev_addr_t addr;
    uint32_t qpn, rkey;
    uint64_t buf;
} ep_info_t;

static ucs_status_t ep_open(ep_t *ep, int use_srq)
{
    vqp_sw_qp_init_attr_t attr = {0};
    struct mlx5dv_srq dsrq;
    struct mlx5dv_cq dcq;
    struct mlx5dv_qp dqp;
    ucs_status_t status;

    memset(ep, 0, sizeof(*ep));
    ep->buf = aligned_alloc(4096, EP_BUF);
    memset(ep->buf, 0, EP_BUF);
    status = vqp_sw_dev_open("vqp_sw0", &ep->dev);
    if (status != UCS_OK) {
        return status;
    }
    vqp_sw_dev_address(ep->dev, &ep->addr);
    status = vqp_sw_mr_reg(ep->dev, ep->buf, EP_BUF, ACCESS_ALL, &ep->mr,
                           &ep->lkey, &ep->rkey);
    if (status != UCS_OK) {
        return status;
    }
    if (((status = vqp_sw_cq_create(ep->dev, 256, &ep->scq_h, &dcq)) !=
         UCS_OK) ||
        ((status = vqp_mlx5_cq_init(&ep->scq, &dcq)) != UCS_OK) ||
        ((status = vqp_sw_cq_create(ep->dev, 256, &ep->rcq_h, &dcq)) !=
         UCS_OK) ||
        ((status = vqp_mlx5_cq_init(&ep->rcq, &dcq)) != UCS_OK)) {
        return status;
    }
    if (use_srq) {
        if (((status = vqp_sw_srq_create(ep->dev, 7, 2, &ep->srq_h, &dsrq)) !=
             UCS_OK) ||
            ((status = vqp_mlx5_srq_init(&ep->srq, &dsrq)) != UCS_OK)) {
            return status;
        }
    }
    attr.send_cq         = ep->scq_h;
    attr.recv_cq         = ep->rcq_h;
    attr.srq             = ep->srq_h;
    attr.max_send_wr     = EP_SQ;
    attr.max_recv_wr     = EP_RQ;
    attr.max_recv_sge    = 2;
    attr.max_inline_data = EP_INLINE;
    status = vqp_sw_qp_create(ep->dev, &attr, &ep->qp_h, &dqp, &ep->qpn);
    if (status != UCS_OK) {
        return status;
    }
    status = vqp_mlx5_txwq_init(&ep->sq, &dqp, ep->qpn, EP_INLINE, EP_SIG,
                                VQP_MLX5_DB_BF, &ep->bf_toggle);
    if ((status == UCS_OK) && !use_srq) {
        status = vqp_mlx5_rxwq_init(&ep->rq, &dqp);
    }
    return status;
}

static void ep_info(const ep_t *ep, ep_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->addr = ep->addr;
    info->qpn  = ep->qpn;
    info->rkey = ep->rkey;
    info->buf  = (uintptr_t)ep->buf;
}

static ucs_status_t ep_connect(ep_t *ep, const ep_info_t *peer)
{
    vqp_sw_qp_attr_t attr = {0};
    ucs_status_t status;

    attr.qp_state        = IBV_QPS_INIT;
    attr.qp_access_flags = ACCESS_ALL;
    status               = vqp_sw_qp_modify(ep->qp_h, &attr);
    if (status != UCS_OK) {
        return status;
    }
    attr.qp_state           = IBV_QPS_RTR;
    attr.dest_dev           = peer->addr;
    attr.dest_qp_num        = peer->qpn;
    attr.min_rnr_timer      = 1;
    attr.max_dest_rd_atomic = 4;
    status                  = vqp_sw_qp_modify(ep->qp_h, &attr);
    if (status != UCS_OK) {
        return status;
    }
    attr.qp_state      = IBV_QPS_RTS;
    attr.timeout       = 14;
    attr.retry_cnt     = 7;
    attr.rnr_retry     = 7;
    attr.max_rd_atomic = 4;
    return vqp_sw_qp_modify(ep->qp_h, &attr);
}

static void ep_close(ep_t *ep)
{
    if (ep->dev != NULL) {
        if (ep->qp_h != NULL) {
            vqp_sw_qp_destroy(ep->qp_h);
        }
        if (ep->srq_h != NULL) {
            vqp_sw_srq_destroy(ep->srq_h);
        }
        vqp_sw_cq_destroy(ep->scq_h);
        vqp_sw_cq_destroy(ep->rcq_h);
        vqp_sw_mr_dereg(ep->mr);
        vqp_sw_dev_close(ep->dev);
    }
    free(ep->buf);
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/*
 * Next CQE of @a cq, copied to @a out, progressing the devices of @a eps
 * (this process's only) meanwhile; 0 after TIMEOUT_NS. Yields while
 * waiting: the peer may need this core.
 */
static int poll_cq(ep_t **eps, int n, vqp_mlx5_cq_t *cq, struct mlx5_cqe64 *out)
{
    uint64_t deadline = now_ns() + TIMEOUT_NS;
    struct mlx5_cqe64 *cqe;
    int i;

    do {
        for (i = 0; i < n; ++i) {
            vqp_sw_progress(eps[i]->dev);
        }
        cqe = vqp_mlx5_cq_poll(cq);
        if (cqe != NULL) {
            *out = *cqe;
            vqp_mlx5_cq_update_ci(cq);
            return 1;
        }
        sched_yield();
    } while (now_ns() < deadline);
    return 0;
}

/* Take the next send CQE of @a ep, which must be a good one of its QP, and
 * reclaim the ring up to it. Returns its wqe_counter, -1 on timeout or a bad
 * CQE. Used by both processes of the fork test, so no cmocka asserts. */
static int sq_reap(ep_t **eps, int n, ep_t *ep)
{
    struct mlx5_cqe64 cqe;

    if (!poll_cq(eps, n, &ep->scq, &cqe) ||
        (vqp_mlx5_cqe_status(&cqe) != UCS_OK) ||
        (vqp_mlx5_cqe_opcode(&cqe) != MLX5_CQE_REQ) ||
        (vqp_mlx5_cqe_qpn(&cqe) != ep->qpn)) {
        return -1;
    }
    vqp_mlx5_txwq_complete(&ep->sq, vqp_mlx5_cqe_wqe_counter(&cqe));
    return vqp_mlx5_cqe_wqe_counter(&cqe);
}

/* Reap send CQEs until the one of WQE @a idx; 0 or -1 as sq_reap. */
static int sq_wait(ep_t **eps, int n, ep_t *ep, int idx)
{
    int wc;

    if (idx < 0) {
        return -1;
    }
    do {
        wc = sq_reap(eps, n, ep);
    } while ((wc >= 0) && (wc != (uint16_t)idx));
    return (wc < 0) ? -1 : 0;
}

static void wait_sq(ep_t **eps, int n, ep_t *ep, int idx)
{
    assert_int_equal(sq_wait(eps, n, ep, idx), 0);
}

/* Wait for a receive completion on @a ep; checks it is good and ours. */
static void wait_rq(ep_t **eps, int n, ep_t *ep, struct mlx5_cqe64 *cqe)
{
    assert_true(poll_cq(eps, n, &ep->rcq, cqe));
    assert_int_equal(vqp_mlx5_cqe_status(cqe), UCS_OK);
    assert_int_equal(vqp_mlx5_cqe_qpn(cqe), ep->qpn);
}

static void fill(uint8_t *p, size_t len, unsigned seed)
{
    size_t i;

    for (i = 0; i < len; ++i) {
        p[i] = (uint8_t)(i * 31 + seed);
    }
}

typedef struct {
    ep_t a, b;
    ep_t *both[2];
} pair_t;

static int pair_setup(void **state, int b_srq)
{
    pair_t *p = calloc(1, sizeof(*p));
    ep_info_t ia, ib;

    *state     = p;
    p->both[0] = &p->a;
    p->both[1] = &p->b;
    if ((ep_open(&p->a, 0) != UCS_OK) || (ep_open(&p->b, b_srq) != UCS_OK)) {
        return -1;
    }
    ep_info(&p->a, &ia);
    ep_info(&p->b, &ib);
    return ((ep_connect(&p->a, &ib) == UCS_OK) &&
            (ep_connect(&p->b, &ia) == UCS_OK))
               ? 0
               : -1;
}

static int pair_setup_rq(void **state)
{
    return pair_setup(state, 0);
}

static int pair_setup_srq(void **state)
{
    return pair_setup(state, 1);
}

static int pair_teardown(void **state)
{
    pair_t *p = *state;

    ep_close(&p->a);
    ep_close(&p->b);
    free(p);
    return 0;
}

/* SEND / SEND_IMM, inline and by pointer, into B's RQ. */
static void test_send_recv(void **state)
{
    pair_t *p = *state;
    ep_t *a = &p->a, *b = &p->b;
    vqp_mlx5_sge_t sg[2];
    struct mlx5_cqe64 cqe;
    int idx, ridx[4];
    unsigned i;

    for (i = 0; i < 4; ++i) {
        sg[0]   = (vqp_mlx5_sge_t){(uintptr_t)b->buf + i * 8192, 8192, b->lkey};
        ridx[i] = vqp_mlx5_rxwq_post(&b->rq, sg, 1);
        assert_int_equal(ridx[i], i);
    }
    vqp_mlx5_rxwq_ring(&b->rq);
    fill(a->buf, 16384, 3);

    /* Inline: the device reads the payload from the WQE. */
    sg[0] = (vqp_mlx5_sge_t){(uintptr_t)a->buf, 13, 0};
    idx =
        vqp_mlx5_post_send(&a->sq, sg, 1, VQP_MLX5_INLINE | VQP_MLX5_SIGNALED);
    wait_sq(p->both, 2, a, idx);
    wait_rq(p->both, 2, b, &cqe);
    assert_int_equal(vqp_mlx5_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(vqp_mlx5_cqe_byte_cnt(&cqe), 13);
    assert_int_equal(vqp_mlx5_cqe_wqe_counter(&cqe), ridx[0]);
    vqp_mlx5_rxwq_complete(&b->rq, vqp_mlx5_cqe_wqe_counter(&cqe));
    assert_memory_equal(b->buf, a->buf, 13);

    /* Pointer, with immediate data. */
    sg[0] = (vqp_mlx5_sge_t){(uintptr_t)a->buf + 100, 3000, a->lkey};
    idx   = vqp_mlx5_post_send_imm(&a->sq, sg, 1, htobe32(0xc0ffee),
                                   VQP_MLX5_SIGNALED);
    wait_sq(p->both, 2, a, idx);
    wait_rq(p->both, 2, b, &cqe);
    assert_int_equal(vqp_mlx5_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND_IMM);
    assert_int_equal(vqp_mlx5_cqe_imm(&cqe), htobe32(0xc0ffee));
    assert_int_equal(vqp_mlx5_cqe_byte_cnt(&cqe), 3000);
    assert_int_equal(vqp_mlx5_cqe_wqe_counter(&cqe), ridx[1]);
    assert_memory_equal(b->buf + 8192, a->buf + 100, 3000);

    /* Two gathered pieces land back to back. */
    sg[0] = (vqp_mlx5_sge_t){(uintptr_t)a->buf + 5000, 700, a->lkey};
    sg[1] = (vqp_mlx5_sge_t){(uintptr_t)a->buf + 9000, 300, a->lkey};
    idx   = vqp_mlx5_post_send(&a->sq, sg, 2, VQP_MLX5_SIGNALED);
    wait_sq(p->both, 2, a, idx);
    wait_rq(p->both, 2, b, &cqe);
    assert_int_equal(vqp_mlx5_cqe_byte_cnt(&cqe), 1000);
    assert_memory_equal(b->buf + 2 * 8192, a->buf + 5000, 700);
    assert_memory_equal(b->buf + 2 * 8192 + 700, a->buf + 9000, 300);

    /* Empty message. */
    idx = vqp_mlx5_post_send(&a->sq, NULL, 0, VQP_MLX5_SIGNALED);
    wait_sq(p->both, 2, a, idx);
    wait_rq(p->both, 2, b, &cqe);
    assert_int_equal(vqp_mlx5_cqe_byte_cnt(&cqe), 0);
    assert_int_equal(vqp_mlx5_cqe_wqe_counter(&cqe), ridx[3]);
}

/* Bulk RDMA WRITE of 768 KiB in 8 KiB pieces (more than the ring holds),
 * unsignaled but for the policy, partly batched; then WRITE_IMM as the
 * notification, and a READ back into another region. */
static void test_bulk_write_read(void **state)
{
    pair_t *p = *state;
    ep_t *a = &p->a, *b = &p->b;
    const size_t total = 768 * 1024, piece = 8192;
    vqp_mlx5_sge_t sg[2];
    struct mlx5_cqe64 cqe;
    size_t off;
    int idx = -1, last = -1;

    fill(a->buf, total, 7);
    sg[0] = (vqp_mlx5_sge_t){(uintptr_t)b->buf + total, 64, b->lkey};
    assert_true(vqp_mlx5_rxwq_post(&b->rq, sg, 1) >= 0);
    vqp_mlx5_rxwq_ring(&b->rq);

    for (off = 0; off < total; off += piece) {
        sg[0] = (vqp_mlx5_sge_t){(uintptr_t)a->buf + off, piece, a->lkey};
        while ((idx = vqp_mlx5_post_write(
                    &a->sq, sg, 1, (uintptr_t)b->buf + off, b->rkey,
                    ((off / piece) % 4 != 3) ? VQP_MLX5_MORE : 0)) ==
               UCS_ERR_NO_RESOURCE) {
            /* Ring full: its newest WQE is signaled, wait for it. */
            vqp_mlx5_txwq_flush(&a->sq);
            wait_sq(p->both, 2, a, last);
        }
        assert_true(idx >= 0);
        last = idx;
    }
    vqp_mlx5_txwq_flush(&a->sq);
    while ((idx = vqp_mlx5_post_write_imm(
                &a->sq, NULL, 0, (uintptr_t)b->buf, b->rkey, htobe32(0x1234),
                VQP_MLX5_SIGNALED)) == UCS_ERR_NO_RESOURCE) {
        wait_sq(p->both, 2, a, last);
    }
    wait_sq(p->both, 2, a, idx);
    assert_int_equal(a->sq.ci, a->sq.pi);
    wait_rq(p->both, 2, b, &cqe);
    assert_int_equal(vqp_mlx5_cqe_opcode(&cqe), MLX5_CQE_RESP_WR_IMM);
    assert_int_equal(vqp_mlx5_cqe_imm(&cqe), htobe32(0x1234));
    assert_memory_equal(b->buf, a->buf, total);

    /* READ B's data back, scattered over two pieces of A's buffer. */
    sg[0] = (vqp_mlx5_sge_t){(uintptr_t)a->buf + total, 1000, a->lkey};
    sg[1] = (vqp_mlx5_sge_t){(uintptr_t)a->buf + total + 4096, 3000, a->lkey};
    idx = vqp_mlx5_post_read(&a->sq, sg, 2, (uintptr_t)b->buf + 10000, b->rkey,
                             VQP_MLX5_SIGNALED);
    wait_sq(p->both, 2, a, idx);
    assert_memory_equal(a->buf + total, a->buf + 10000, 1000);
    assert_memory_equal(a->buf + total + 4096, a->buf + 11000, 3000);
}

static void test_atomics(void **state)
{
    pair_t *p = *state;
    ep_t *a = &p->a, *b = &p->b;
    uint64_t *counter  = (uint64_t *)(b->buf + 4096);
    uint64_t *result   = (uint64_t *)(a->buf + 64);
    vqp_mlx5_sge_t res = {(uintptr_t)result, 8, a->lkey};
    int idx;

    *counter = 40;
    idx = vqp_mlx5_post_atomic_fa(&a->sq, &res, (uintptr_t)counter, b->rkey, 2,
                                  VQP_MLX5_SIGNALED);
    wait_sq(p->both, 2, a, idx);
    assert_int_equal(be64toh(*result), 40);
    assert_int_equal(*counter, 42);

    /* Compare fails: nothing swapped, old value returned. */
    idx = vqp_mlx5_post_atomic_cs(&a->sq, &res, (uintptr_t)counter, b->rkey, 41,
                                  7, VQP_MLX5_SIGNALED);
    wait_sq(p->both, 2, a, idx);
    assert_int_equal(be64toh(*result), 42);
    assert_int_equal(*counter, 42);

    /* Compare matches; the fence orders it after the previous atomic. */
    idx = vqp_mlx5_post_atomic_cs(&a->sq, &res, (uintptr_t)counter, b->rkey, 42,
                                  7, VQP_MLX5_SIGNALED | VQP_MLX5_FENCE);
    wait_sq(p->both, 2, a, idx);
    assert_int_equal(be64toh(*result), 42);
    assert_int_equal(*counter, 7);
}

/* A bad rkey fails the WQE with a remote access error; the QP is then in
 * error and every later WQE is flushed with its own wqe_counter. */
static void test_error_flush(void **state)
{
    pair_t *p = *state;
    ep_t *a = &p->a, *b = &p->b;
    vqp_mlx5_sge_t sg = {(uintptr_t)a->buf, 64, a->lkey};
    struct mlx5_cqe64 cqe;
    int bad, later[2];
    unsigned i;

    bad = vqp_mlx5_post_write(&a->sq, &sg, 1, (uintptr_t)b->buf,
                              b->rkey ^ 0x5a5a00, VQP_MLX5_SIGNALED);
    assert_true(poll_cq(p->both, 2, &a->scq, &cqe));
    assert_int_equal(vqp_mlx5_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(vqp_mlx5_cqe_syndrome(&cqe),
                     MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    assert_int_equal(vqp_mlx5_cqe_status(&cqe), UCS_ERR_CONNECTION_RESET);
    assert_int_equal(vqp_mlx5_cqe_qpn(&cqe), a->qpn);
    assert_int_equal(vqp_mlx5_cqe_wqe_counter(&cqe), bad);
    vqp_mlx5_txwq_complete(&a->sq, vqp_mlx5_cqe_wqe_counter(&cqe));

    /* Unsignaled posts after the error still complete, as flushes. */
    later[0] =
        vqp_mlx5_post_write(&a->sq, &sg, 1, (uintptr_t)b->buf, b->rkey, 0);
    later[1] = vqp_mlx5_post_nop(&a->sq, 0);
    for (i = 0; i < 2; ++i) {
        assert_true(poll_cq(p->both, 2, &a->scq, &cqe));
        assert_int_equal(vqp_mlx5_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
        assert_int_equal(vqp_mlx5_cqe_status(&cqe), UCS_ERR_CANCELED);
        assert_int_equal(vqp_mlx5_cqe_qpn(&cqe), a->qpn);
        assert_int_equal(vqp_mlx5_cqe_wqe_counter(&cqe), later[i]);
        vqp_mlx5_txwq_complete(&a->sq, vqp_mlx5_cqe_wqe_counter(&cqe));
    }
    assert_int_equal(vqp_mlx5_txwq_avail(&a->sq), EP_SQ);
}

/* SENDs into B's SRQ: consumed WQEs are freed back and reposted while 40
 * messages go through a 7-entry SRQ. */
static void test_srq(void **state)
{
    pair_t *p = *state;
    ep_t *a = &p->a, *b = &p->b;
    vqp_mlx5_sge_t sg;
    struct mlx5_cqe64 cqe;
    unsigned slot_of[8]; /* buffer slot each SRQ WQE scatters to */
    unsigned i, slot;
    uint16_t wc;
    int idx;

    for (i = 0; i < 8; ++i) {
        sg  = (vqp_mlx5_sge_t){(uintptr_t)b->buf + i * 4096, 4096, b->lkey};
        idx = vqp_mlx5_srq_post(&b->srq, &sg, 1);
        assert_int_equal(idx, (i < 7) ? (int)i : UCS_ERR_NO_RESOURCE);
        slot_of[i] = i;
    }
    vqp_mlx5_srq_ring(&b->srq);

    for (i = 0; i < 40; ++i) {
        fill(a->buf, 100 + i, i);
        sg  = (vqp_mlx5_sge_t){(uintptr_t)a->buf, 100 + i, a->lkey};
        idx = vqp_mlx5_post_send(&a->sq, &sg, 1, VQP_MLX5_SIGNALED);
        wait_sq(p->both, 2, a, idx);
        wait_rq(p->both, 2, b, &cqe);
        assert_int_equal(vqp_mlx5_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
        assert_int_equal(vqp_mlx5_cqe_byte_cnt(&cqe), 100 + i);
        wc = vqp_mlx5_cqe_wqe_counter(&cqe);
        assert_true(wc < 8);
        slot = slot_of[wc];
        assert_memory_equal(b->buf + slot * 4096, a->buf, 100 + i);
        memset(b->buf + slot * 4096, 0, 4096);
        /* The freed WQE waits at the tail; the buffer goes to the WQE the
         * post takes (the spare). */
        vqp_mlx5_srq_free(&b->srq, wc);
        sg  = (vqp_mlx5_sge_t){(uintptr_t)b->buf + slot * 4096, 4096, b->lkey};
        idx = vqp_mlx5_srq_post(&b->srq, &sg, 1);
        assert_true((idx >= 0) && (idx < 8) && (idx != wc));
        slot_of[idx] = slot;
        vqp_mlx5_srq_ring(&b->srq);
    }
}

static int write_full(int fd, const void *p, size_t len)
{
    return write(fd, p, len) == (ssize_t)len ? 0 : -1;
}

static int read_full(int fd, void *p, size_t len)
{
    return read(fd, p, len) == (ssize_t)len ? 0 : -1;
}

#define PINGS 300
#define BULK  (EP_BUF / 2)  /* bulk WRITE target; the rest is not written */
#define RXOFF (BULK + 4096) /* receive buffers, outside the bulk target */

/*
 * The child: answers PINGS pings (SEND with a sequence number, inline),
 * then writes BULK bytes of pattern into the parent with RDMA WRITEs, adds to
 * its counter with a fetch-and-add and announces the end with SEND_IMM.
 * Returns 0 when every check passed; no cmocka in the child.
 */
static int child_run(int rfd, int wfd)
{
    vqp_mlx5_sge_t sg;
    struct mlx5_cqe64 cqe;
    ep_info_t me, peer;
    ep_t ep, *eps[1] = {&ep};
    uint32_t seq, i;
    uint64_t old;
    size_t off;
    int idx = 0, wc;
    char bye;

    if ((ep_open(&ep, 0) != UCS_OK)) {
        return 10;
    }
    ep_info(&ep, &me);
    if ((write_full(wfd, &me, sizeof(me)) != 0) ||
        (read_full(rfd, &peer, sizeof(peer)) != 0) ||
        (ep_connect(&ep, &peer) != UCS_OK)) {
        return 11;
    }
    for (i = 0; i < EP_RQ; ++i) {
        sg = (vqp_mlx5_sge_t){(uintptr_t)ep.buf + RXOFF + i * 64, 64, ep.lkey};
        vqp_mlx5_rxwq_post(&ep.rq, &sg, 1);
    }
    vqp_mlx5_rxwq_ring(&ep.rq);
    if (write_full(wfd, "r", 1) != 0) {
        return 12;
    }

    for (i = 0; i < PINGS; ++i) {
        if (!poll_cq(eps, 1, &ep.rcq, &cqe) ||
            (vqp_mlx5_cqe_status(&cqe) != UCS_OK) ||
            (vqp_mlx5_cqe_byte_cnt(&cqe) != sizeof(seq))) {
            return 13;
        }
        wc = vqp_mlx5_cqe_wqe_counter(&cqe);
        memcpy(&seq, ep.buf + RXOFF + (wc % EP_RQ) * 64, sizeof(seq));
        if (seq != i) {
            return 14;
        }
        vqp_mlx5_rxwq_complete(&ep.rq, (uint16_t)wc);
        sg = (vqp_mlx5_sge_t){(uintptr_t)ep.buf + RXOFF + (wc % EP_RQ) * 64, 64,
                              ep.lkey};
        vqp_mlx5_rxwq_post(&ep.rq, &sg, 1);
        vqp_mlx5_rxwq_ring(&ep.rq);

        seq = ~i;
        sg  = (vqp_mlx5_sge_t){(uintptr_t)&seq, sizeof(seq), 0};
        idx = vqp_mlx5_post_send(&ep.sq, &sg, 1, VQP_MLX5_INLINE);
        /* Reclaim the ring as its signaled WQEs complete. */
        while (vqp_mlx5_txwq_avail(&ep.sq) < 2 * VQP_MLX5_MAX_BB) {
            if (sq_reap(eps, 1, &ep) < 0) {
                return 15;
            }
        }
        if (idx < 0) {
            return 16;
        }
    }

    /* Bulk: half a MiB in 64 KiB WRITEs, then FA, then SEND_IMM "done". */
    fill(ep.buf, EP_BUF, 99);
    for (off = 0; off < BULK; off += 65536) {
        sg = (vqp_mlx5_sge_t){(uintptr_t)ep.buf + off, 65536, ep.lkey};
        while ((idx = vqp_mlx5_post_write(&ep.sq, &sg, 1, peer.buf + off,
                                          peer.rkey, 0)) ==
               UCS_ERR_NO_RESOURCE) {
            if (sq_reap(eps, 1, &ep) < 0) {
                return 17;
            }
        }
    }
    /* The engine runs only inside progress calls: finish everything posted
     * (the last pong too) before blocking on the pipe. */
    while ((idx = vqp_mlx5_post_nop(&ep.sq, VQP_MLX5_SIGNALED)) ==
           UCS_ERR_NO_RESOURCE) {
        if (sq_reap(eps, 1, &ep) < 0) {
            return 18;
        }
    }
    if ((sq_wait(eps, 1, &ep, idx) != 0) ||
        read_full(rfd, &bye, 1) != 0) { /* the parent's counter is set */
        return 18;
    }
    (void)bye;
    sg  = (vqp_mlx5_sge_t){(uintptr_t)ep.buf + 64, 8, ep.lkey};
    idx = vqp_mlx5_post_atomic_fa(&ep.sq, &sg, peer.buf + EP_BUF - 8, peer.rkey,
                                  5, 0);
    idx = vqp_mlx5_post_send_imm(&ep.sq, NULL, 0, htobe32(0xd0e),
                                 VQP_MLX5_SIGNALED);
    if (sq_wait(eps, 1, &ep, idx) != 0) {
        return 19;
    }
    memcpy(&old, ep.buf + 64, sizeof(old));
    if (be64toh(old) != 1000) { /* the value before our add, big-endian */
        return 21;
    }

    /* Stay alive until the parent has checked everything. */
    if (read_full(rfd, &bye, 1) != 0) {
        return 20;
    }
    ep_close(&ep);
    return 0;
}

/* The parent's side; returns 0 when every check passed, else the step
 * that failed (so the child is always reaped, whatever happens). */
static int parent_run(int rfd, int wfd)
{
    vqp_mlx5_sge_t sg;
    struct mlx5_cqe64 cqe;
    ep_info_t me, peer;
    ep_t ep, *eps[1] = {&ep};
    uint8_t *expect;
    uint64_t t0, counter;
    uint32_t seq, i;
    int idx, ret = 0;
    char c;

    /* Open after the child's device exists; the child sends its address
     * first, so both sides connect to a device that is already there. */
    if (read_full(rfd, &peer, sizeof(peer)) != 0) {
        return 1;
    }
    if (ep_open(&ep, 0) != UCS_OK) {
        ep_close(&ep);
        return 2;
    }
    ep_info(&ep, &me);
    if ((write_full(wfd, &me, sizeof(me)) != 0) ||
        (ep_connect(&ep, &peer) != UCS_OK)) {
        ret = 3;
        goto out;
    }
    for (i = 0; i < EP_RQ; ++i) {
        sg = (vqp_mlx5_sge_t){(uintptr_t)ep.buf + RXOFF + i * 64, 64, ep.lkey};
        vqp_mlx5_rxwq_post(&ep.rq, &sg, 1);
    }
    vqp_mlx5_rxwq_ring(&ep.rq);
    if (read_full(rfd, &c, 1) != 0) { /* the child's RQ is ready */
        ret = 4;
        goto out;
    }

    t0 = now_ns();
    for (i = 0; i < PINGS; ++i) {
        seq = i;
        sg  = (vqp_mlx5_sge_t){(uintptr_t)&seq, sizeof(seq), 0};
        if (vqp_mlx5_post_send(&ep.sq, &sg, 1, VQP_MLX5_INLINE) < 0) {
            ret = 5;
            goto out;
        }
        if (!poll_cq(eps, 1, &ep.rcq, &cqe) ||
            (vqp_mlx5_cqe_status(&cqe) != UCS_OK) ||
            (vqp_mlx5_cqe_opcode(&cqe) != MLX5_CQE_RESP_SEND)) {
            ret = 6;
            goto out;
        }
        idx = vqp_mlx5_cqe_wqe_counter(&cqe);
        memcpy(&seq, ep.buf + RXOFF + (idx % EP_RQ) * 64, sizeof(seq));
        if (seq != ~i) {
            ret = 7;
            goto out;
        }
        vqp_mlx5_rxwq_complete(&ep.rq, (uint16_t)idx);
        sg = (vqp_mlx5_sge_t){(uintptr_t)ep.buf + RXOFF + (idx % EP_RQ) * 64,
                              64, ep.lkey};
        vqp_mlx5_rxwq_post(&ep.rq, &sg, 1);
        vqp_mlx5_rxwq_ring(&ep.rq);
        /* Reclaim send BBs from the periodic signaled CQEs. */
        while (vqp_mlx5_txwq_avail(&ep.sq) < 2 * VQP_MLX5_MAX_BB) {
            if (sq_reap(eps, 1, &ep) < 0) {
                ret = 8;
                goto out;
            }
        }
    }
    print_message("    %u ping-pongs between processes: %.2f us per round"
                  " trip\n",
                  PINGS, (now_ns() - t0) / 1e3 / PINGS);

    /* The child's bulk WRITEs need nothing from us; its atomic needs the
     * counter set first. */
    counter = 1000;
    memcpy(ep.buf + EP_BUF - 8, &counter, 8);
    if ((write_full(wfd, "g", 1) != 0) || !poll_cq(eps, 1, &ep.rcq, &cqe) ||
        (vqp_mlx5_cqe_status(&cqe) != UCS_OK) ||
        (vqp_mlx5_cqe_opcode(&cqe) != MLX5_CQE_RESP_SEND_IMM) ||
        (vqp_mlx5_cqe_imm(&cqe) != htobe32(0xd0e))) {
        ret = 9;
        goto out;
    }
    expect = malloc(EP_BUF);
    fill(expect, EP_BUF, 99);
    if (memcmp(ep.buf, expect, BULK) != 0) {
        ret = 10;
    }
    free(expect);
    memcpy(&counter, ep.buf + EP_BUF - 8, 8);
    if ((ret == 0) && (counter != 1005)) {
        ret = 11;
    }
out:
    if (write_full(wfd, "x", 1) != 0) {
        ret = ret ? ret : 12;
    }
    ep_close(&ep);
    return ret;
}

static void test_fork_pingpong_bulk(void **state)
{
    int to_child[2], to_parent[2], status, ret;
    pid_t pid;

    /* A peer that quit early must fail a step, not kill us with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(to_parent), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        ret = child_run(to_child[0], to_parent[1]);
        fflush(stdout); /* the child's log lines */
        _exit(ret);
    }
    close(to_child[0]);
    close(to_parent[1]);
    ret = parent_run(to_parent[0], to_child[1]);
    close(to_child[1]); /* a child waiting on the pipe sees EOF */
    close(to_parent[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (ret != 0) {
        print_error("parent failed at step %d\n", ret);
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(ret, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_send_recv, pair_setup_rq,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_bulk_write_read, pair_setup_rq,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_atomics, pair_setup_rq,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_error_flush, pair_setup_rq,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_srq, pair_setup_srq,
                                        pair_teardown),
        cmocka_unit_test(test_fork_pingpong_bulk),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
