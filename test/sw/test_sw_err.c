/*
 * Software device, single process: error completions as a ConnectX reports
 * them (syndromes, QP to ERROR, flush of every outstanding and later WQE
 * with its own wqe_counter), RNR and transport retries, and every strict
 * check of the WQE contract with its log line.
 */
#include <config.h>

#include "sw_test_fx.h"

#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

static const uint8_t CU = MLX5_WQE_CTRL_CQ_UPDATE;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));

    *state             = f;
    sw_test_log_buf[0] = '\0';
    return fx_init(f, 16, 8, 2, 2);
}

static int teardown(void **state)
{
    fx_fini(*state);
    free(*state);
    return 0;
}

static void expect_err(fx_t *f, int side, int recv, uint16_t wqe, uint8_t synd)
{
    struct mlx5_cqe64 cqe;

    assert_int_equal(fx_poll(f, side, recv, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe),
                     recv ? MLX5_CQE_RESP_ERR : MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe), synd);
    assert_int_equal(be16toh(cqe.wqe_counter), wqe);
    assert_int_equal(be32toh(((struct mlx5_err_cqe *)&cqe)->s_wqe_opcode_qpn) &
                         0xffffff,
                     f->qp[side].qpn);
}

/* Fresh fixture after a test step left a QP in ERROR. */
static int fx_init_again(fx_t *f)
{
    fx_fini(f);
    return fx_init(f, 16, 8, 2, 2);
}

static void settle(fx_t *f)
{
    int i;

    for (i = 0; i < 10; ++i) {
        vqp_sw_progress(f->devs[0]);
        vqp_sw_progress(f->devs[1]);
    }
}

/* Bad lkey: 0x04 on that WQE, then every outstanding and later WQE,
 * signaled or not, and the posted receives flush with their own index. */
static void test_bad_lkey_flushes_all(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    vqp_sw_qp_counters_t c;
    uint16_t w0, w1, w2, w3;

    sw_test_post_recv(q, f->buf[0] + 512, 64, f->lkey[0]);
    sw_test_post_recv(q, f->buf[0] + 600, 64, f->lkey[0]);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0], 16, f->lkey[0] ^ 0x400);
    w0 = sw_test_ring(q, 3);
    w1 = fx_write(f, 0, 0, 0, 8, 0); /* unsignaled */
    w2 = fx_nop(f, 0, CU);
    expect_err(f, 0, 0, w0, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
    assert_true(sw_test_log_has("key not registered"));
    assert_int_equal(vqp_sw_qp_state(q->qp), IBV_QPS_ERR);
    expect_err(f, 0, 0, w1, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    expect_err(f, 0, 0, w2, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    expect_err(f, 0, 1, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    expect_err(f, 0, 1, 1, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    /* Posted after the error: flushed too, each exactly once. */
    w3 = fx_write(f, 0, 0, 0, 8, 0);
    sw_test_post_recv(q, f->buf[0] + 700, 64, f->lkey[0]);
    expect_err(f, 0, 0, w3, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    expect_err(f, 0, 1, 2, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_true(fx_cq_empty(f, 0, 0));
    assert_true(fx_cq_empty(f, 0, 1));
    assert_int_equal(f->buf[1][0], 0);
    vqp_sw_qp_counters(q->qp, &c);
    assert_int_equal(c.errors, 1);
    assert_int_equal(c.flushed, 6); /* 3 SQ + 3 RQ */
}

/* A run of WRITEs (merged into one transfer by the engine) with a bad rkey
 * in the middle: the ones before it complete and land, it fails with 0x13,
 * the ones after it are flushed and never land. */
static void test_write_run_error_in_middle(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint16_t w[5];
    struct mlx5_cqe64 cqe;
    unsigned i;

    for (i = 0; i < 5; ++i) {
        memset(f->buf[0] + i * 16, 'a' + i, 16);
        sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
        sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + i * 16,
                      i == 2 ? f->rkey[1] + 1 : f->rkey[1]);
        sw_test_dseg(q, 2, f->buf[0] + i * 16, 16, f->lkey[0]);
        w[i] = sw_test_ring(q, 3);
    }
    for (i = 0; i < 2; ++i) {
        assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), w[i]);
        assert_int_equal(f->buf[1][i * 16 + 15], 'a' + i);
    }
    expect_err(f, 0, 0, w[2], MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    assert_true(sw_test_log_has("key not registered"));
    expect_err(f, 0, 0, w[3], MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    expect_err(f, 0, 0, w[4], MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(f->buf[1][2 * 16], 0);
    assert_int_equal(f->buf[1][3 * 16], 0);
    assert_int_equal(f->buf[1][4 * 16], 0);
}

/* A run of SENDs (delivered under one lock with one transfer) whose second
 * message does not fit its receive: the first lands, the second fails
 * (0x12 here, 0x01 at the receiver), the third is flushed. */
static void test_send_run_error_in_middle(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    uint16_t w[3];
    unsigned i;

    sw_test_post_recv(&f->qp[1], f->buf[1], 64, f->lkey[1]);
    sw_test_post_recv(&f->qp[1], f->buf[1] + 64, 4, f->lkey[1]);
    sw_test_post_recv(&f->qp[1], f->buf[1] + 128, 64, f->lkey[1]);
    for (i = 0; i < 3; ++i) {
        memset(f->buf[0] + i * 16, 'k' + i, 16);
        w[i] = fx_send(f, 0, MLX5_OPCODE_SEND, i * 16, 16, 0);
    }
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be16toh(cqe.wqe_counter), w[0]);
    expect_err(f, 0, 0, w[1], MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
    expect_err(f, 0, 0, w[2], MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_true(sw_test_log_has("does not fit receive WQE 1"));
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_memory_equal(f->buf[1], f->buf[0], 16);
    expect_err(f, 1, 1, 1, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
    expect_err(f, 1, 1, 2, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(f->buf[1][128], 0);
}

/* A run of 5 SENDs with 2 receives posted: 2 land, the rest wait in RNR
 * (infinite budget) and complete once receives appear, in order. */
static void test_send_run_partial_rnr(void **state)
{
    fx_t *f = *state;
    vqp_sw_qp_attr_t qa;
    vqp_sw_qp_counters_t c;
    struct mlx5_cqe64 cqe;
    unsigned i;

    memset(&qa, 0, sizeof(qa));
    qa.qp_state  = IBV_QPS_RTS;
    qa.rnr_retry = 7;
    qa.timeout   = 8;
    qa.retry_cnt = 2;
    assert_int_equal(vqp_sw_qp_modify(f->qp[0].qp, &qa), UCS_OK);
    for (i = 0; i < 2; ++i) {
        sw_test_post_recv(&f->qp[1], f->buf[1] + i * 64, 64, f->lkey[1]);
    }
    for (i = 0; i < 5; ++i) {
        f->buf[0][i] = (uint8_t)('A' + i);
        fx_send(f, 0, MLX5_OPCODE_SEND, i, 1, 0);
    }
    for (i = 0; i < 2; ++i) {
        assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), i);
    }
    settle(f);
    assert_null(sw_test_cq_peek(&f->scq[0]));
    vqp_sw_qp_counters(f->qp[0].qp, &c);
    assert_true(c.rnr_retries > 0);
    for (i = 2; i < 5; ++i) {
        sw_test_post_recv(&f->qp[1], f->buf[1] + i * 64, 64, f->lkey[1]);
    }
    for (i = 2; i < 5; ++i) {
        assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), i);
    }
    for (i = 0; i < 5; ++i) {
        assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
        assert_int_equal(be16toh(cqe.wqe_counter), i);
        assert_int_equal(f->buf[1][(i % 8) * 64], 'A' + i);
    }
}

/* Local bounds: 16 KiB from an 8 KiB region; byte_count 0 means 2 GiB,
 * more than max_msg_sz (1 GiB, as a ConnectX port says). */
static void test_lkey_bounds_and_2gib(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint16_t w;

    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0], 16384, f->lkey[0]);
    w = sw_test_ring(q, 3);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
    assert_true(sw_test_log_has("+16384: range outside the region"));
    assert_int_equal(fx_init_again(f), 0);

    q = &f->qp[0];
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0], 0, f->lkey[0]);
    w = sw_test_ring(q, 3);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
    assert_true(
        sw_test_log_has("message of 2147483648 bytes exceeds max_msg_sz"));
}

/* Remote access violations: requester 0x13, the target QP enters ERROR and
 * flushes its receives. */
static void test_remote_access(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint16_t w;

    sw_test_post_recv(&f->qp[1], f->buf[1] + 100, 32, f->lkey[1]);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + FX_BUF - 4, f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0], 16, f->lkey[0]);
    w = sw_test_ring(q, 3);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    assert_true(sw_test_log_has("range outside the region"));
    settle(f);
    assert_int_equal(vqp_sw_qp_state(f->qp[1].qp), IBV_QPS_ERR);
    expect_err(f, 1, 1, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
}

/* A SEND, then a WRITE with a bad rkey, executed before the target runs:
 * the SEND completed at the requester, so its receive completes at the
 * target (it arrived before the error), and only the next receive flushes
 * when the target QP enters ERROR. Before 28 Nov 2026 the target applied
 * the error first and flushed the SEND's receive: a message the sender saw
 * delivered was lost (found by test_vqp_random). */
static void test_send_before_remote_access(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    struct mlx5_cqe64 cqe;
    uint16_t s, w;

    sw_test_post_recv(&f->qp[1], f->buf[1], 64, f->lkey[1]);
    sw_test_post_recv(&f->qp[1], f->buf[1] + 64, 64, f->lkey[1]);
    memset(f->buf[0], 's', 16);
    s = fx_send(f, 0, MLX5_OPCODE_SEND, 0, 16, 0);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + FX_BUF - 4, f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0], 16, f->lkey[0]);
    w = sw_test_ring(q, 3);
    /* The requester runs both before the target runs at all. */
    vqp_sw_progress(f->devs[0]);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be16toh(cqe.wqe_counter), s);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(be16toh(cqe.wqe_counter), 0);
    assert_memory_equal(f->buf[1], f->buf[0], 16);
    settle(f);
    assert_int_equal(vqp_sw_qp_state(f->qp[1].qp), IBV_QPS_ERR);
    expect_err(f, 1, 1, 1, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
}

static void test_remote_rights(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
    uint16_t w;

    /* The region allows only REMOTE_WRITE: a READ is refused. */
    assert_int_equal(
        vqp_sw_mr_reg(f->devs[1], f->buf[1], 64,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &mr,
                      &lkey, &rkey),
        UCS_OK);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_READ, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], rkey);
    sw_test_dseg(q, 2, f->buf[0], 8, f->lkey[0]);
    w = sw_test_ring(q, 3);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    assert_true(sw_test_log_has("region lacks the access right"));
    assert_int_equal(vqp_sw_mr_dereg(mr), UCS_OK);
}

/* A deregistered rkey is refused even though the memory is still there. */
static void test_deregistered_rkey(void **state)
{
    fx_t *f = *state;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
    uint16_t w;

    assert_int_equal(vqp_sw_mr_reg(f->devs[1], f->buf[1], 64,
                                   SW_TEST_ACCESS_ALL, &mr, &lkey, &rkey),
                     UCS_OK);
    assert_int_equal(vqp_sw_mr_dereg(mr), UCS_OK);
    sw_test_ctrl(&f->qp[0], MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
    sw_test_raddr(&f->qp[0], 1, (uintptr_t)f->buf[1], rkey);
    sw_test_dseg(&f->qp[0], 2, f->buf[0], 8, f->lkey[0]);
    w = sw_test_ring(&f->qp[0], 3);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    assert_true(sw_test_log_has("key not registered"));
}

static void test_qp_access_flags(void **state)
{
    fx_t *f = *state;
    vqp_sw_qp_attr_t qa;
    uint16_t w;

    /* B's QP allows only REMOTE_READ: a WRITE to it is refused. */
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RESET;
    assert_int_equal(vqp_sw_qp_modify(f->qp[1].qp, &qa), UCS_OK);
    assert_int_equal(sw_test_qp_connect(&f->qp[1], &f->addr[0], f->qp[0].qpn,
                                        IBV_ACCESS_REMOTE_READ, 2, 2),
                     UCS_OK);
    w = fx_write(f, 0, 0, 0, 8, CU);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    assert_true(sw_test_log_has("target QP lacks the remote access right"));
}

/* Receive too small: requester 0x12, receiver RESP_ERR 0x01 and ERROR.
 * MLX5_INVALID_LKEY ends the 2-entry scatter list after the first. */
static void test_receive_too_small(void **state)
{
    fx_t *f = *state;
    uint16_t w;

    sw_test_post_recv(&f->qp[1], f->buf[1], 4, f->lkey[1]);
    sw_test_post_recv(&f->qp[1], f->buf[1] + 64, 64, f->lkey[1]);
    w = fx_send(f, 0, MLX5_OPCODE_SEND, 0, 8, 0);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
    assert_true(sw_test_log_has("does not fit receive WQE 0"));
    expect_err(f, 1, 1, 0, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
    assert_int_equal(vqp_sw_qp_state(f->qp[1].qp), IBV_QPS_ERR);
    expect_err(f, 1, 1, 1, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
}

static void test_scatter_two_entries(void **state)
{
    fx_t *f                     = *state;
    sw_test_qp_t *b             = &f->qp[1];
    struct mlx5_wqe_data_seg *d = b->dv.rq.buf;
    struct mlx5_cqe64 cqe;

    /* Two entries of 3 and 5 bytes receive an 8-byte message. */
    d[0].byte_count           = htobe32(3);
    d[0].lkey                 = htobe32(f->lkey[1]);
    d[0].addr                 = htobe64((uintptr_t)f->buf[1]);
    d[1].byte_count           = htobe32(5);
    d[1].lkey                 = htobe32(f->lkey[1]);
    d[1].addr                 = htobe64((uintptr_t)f->buf[1] + 100);
    b->rq_pi                  = 1;
    b->dv.dbrec[MLX5_RCV_DBR] = htobe32(1);
    memcpy(f->buf[0], "abcdefgh", 8);
    fx_send(f, 0, MLX5_OPCODE_SEND, 0, 8, 0);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(be32toh(cqe.byte_cnt), 8);
    assert_memory_equal(f->buf[1], "abc", 3);
    assert_memory_equal(f->buf[1] + 100, "defgh", 5);
}

/* Receiver's scatter list has a bad lkey: receiver 0x04, requester 0x14. */
static void test_receiver_bad_lkey(void **state)
{
    fx_t *f = *state;
    uint16_t w;

    sw_test_post_recv(&f->qp[1], f->buf[1], 64, 0x12345);
    w = fx_send(f, 0, MLX5_OPCODE_SEND, 0, 8, 0);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
    expect_err(f, 1, 1, 0, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
    assert_true(sw_test_log_has("segment 0 lkey 0x12345"));
}

/* No receive posted: rnr_retry 2 waits twice, then 0x16 and a flush. */
static void test_rnr_exhausted(void **state)
{
    fx_t *f = *state;
    vqp_sw_qp_counters_t c;
    uint16_t w0, w1;

    w0 = fx_send(f, 0, MLX5_OPCODE_SEND, 0, 8, 0);
    w1 = fx_write(f, 0, 0, 0, 8, 0);
    expect_err(f, 0, 0, w0, MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
    expect_err(f, 0, 0, w1, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    vqp_sw_qp_counters(f->qp[0].qp, &c);
    assert_int_equal(c.rnr_retries, 2);
    /* RC order: the write behind the stalled send never executed. */
    assert_int_equal(f->buf[1][0], 0);
}

/* rnr_retry 7 waits forever; a receive posted later completes the send. */
static void test_rnr_then_receive(void **state)
{
    fx_t *f = *state;
    vqp_sw_qp_attr_t qa;
    struct mlx5_cqe64 cqe;
    vqp_sw_qp_counters_t c;
    int i;

    memset(&qa, 0, sizeof(qa));
    qa.qp_state  = IBV_QPS_RTS;
    qa.rnr_retry = 7;
    qa.timeout   = 8;
    qa.retry_cnt = 2;
    assert_int_equal(vqp_sw_qp_modify(f->qp[0].qp, &qa), UCS_OK);
    memcpy(f->buf[0], "late", 4);
    fx_send(f, 0, MLX5_OPCODE_SEND, 0, 4, 0);
    for (i = 0; i < 2000; ++i) {
        vqp_sw_progress(f->devs[0]);
        vqp_sw_progress(f->devs[1]);
        vqp_sw_qp_counters(f->qp[0].qp, &c);
        if (c.rnr_retries >= 5) {
            break;
        }
        sched_yield();
    }
    assert_true(c.rnr_retries >= 5);
    assert_null(sw_test_cq_peek(&f->scq[0]));
    sw_test_post_recv(&f->qp[1], f->buf[1], 64, f->lkey[1]);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_memory_equal(f->buf[1], "late", 4);
}

/* The peer device closed: no response, retry_cnt retries, then 0x15. */
static void test_peer_closed_retry_exceeded(void **state)
{
    fx_t *f = *state;
    vqp_sw_qp_counters_t c;
    uint16_t w;

    vqp_sw_qp_destroy(f->qp[1].qp);
    f->qp[1].qp = NULL;
    vqp_sw_dev_close(f->devs[1]);
    free(f->buf[1]);
    f->devs[1] = NULL;
    w          = fx_nop(f, 0, CU); /* local: completes */
    w          = fx_send(f, 0, MLX5_OPCODE_SEND, 0, 8, 0);
    {
        struct mlx5_cqe64 cqe;

        assert_int_equal(sw_test_poll(f->devs, 1, &f->scq[0], &cqe, 2000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(sw_test_poll(f->devs, 1, &f->scq[0], &cqe, 2000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
        assert_int_equal(sw_test_cqe_synd(&cqe),
                         MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
        assert_int_equal(be16toh(cqe.wqe_counter), w);
    }
    vqp_sw_qp_counters(f->qp[0].qp, &c);
    assert_int_equal(c.retries, 2);
}

/* The peer QP went back to RESET (not connected): also 0x15. */
static void test_peer_qp_reset(void **state)
{
    fx_t *f = *state;
    vqp_sw_qp_attr_t qa;
    uint16_t w;

    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RESET;
    assert_int_equal(vqp_sw_qp_modify(f->qp[1].qp, &qa), UCS_OK);
    w = fx_write(f, 0, 0, 0, 8, CU);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
}

/* RTR towards a device that does not exist: UCS_ERR_UNREACHABLE and the
 * QP stays in INIT either way, with an error line when the peer's process
 * lives (a wrong address) and none when it has ended (the peer failed:
 * said at diag level, as UCX logs failures of peers). */
static void test_rtr_peer_missing(void **state)
{
    fx_t *f = *state;
    vqp_sw_qp_attr_t a;
    sw_test_qp_t q;
    pid_t child;
    int st;

    assert_int_equal(sw_test_qp_create(f->devs[0], &f->scq[0], &f->rcq[0], NULL,
                                       16, 8, 0, &q),
                     UCS_OK);
    memset(&a, 0, sizeof(a));
    a.qp_state        = IBV_QPS_INIT;
    a.qp_access_flags = SW_TEST_ACCESS_ALL;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &a), UCS_OK);
    a.qp_state    = IBV_QPS_RTR;
    a.dest_dev    = f->addr[1];
    a.dest_qp_num = f->qp[1].qpn;
    a.dest_dev.instance += 1000;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &a), UCS_ERR_UNREACHABLE);
    assert_true(sw_test_log_has("not found"));

    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        _exit(0);
    }
    assert_int_equal(waitpid(child, &st, 0), child);
    a.dest_dev     = f->addr[1];
    a.dest_dev.pid = (uint32_t)child;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &a), UCS_ERR_UNREACHABLE);
    assert_string_equal(sw_test_log_buf, "");
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_INIT);
    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);
}

/* ------------------------------------------------------- strict checks */

static void test_strict_ds_too_small(void **state)
{
    fx_t *f = *state;
    uint16_t w;

    sw_test_ctrl(&f->qp[0], MLX5_OPCODE_RDMA_WRITE, 1, CU, 0);
    w = sw_test_ring(&f->qp[0], 1);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("ds too small for the opcode's segments"));
    assert_int_equal(vqp_sw_qp_state(f->qp[0].qp), IBV_QPS_ERR);
}

static void test_strict_inline_ds_mismatch(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint16_t w;

    /* 40 inline bytes need 3 units; ds leaves room for 2. */
    sw_test_inline(q, 1, "0123456789012345678901234567890123456789", 40);
    sw_test_ctrl(q, MLX5_OPCODE_SEND, 3, CU, 0);
    w = sw_test_ring(q, 3);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("inline segment extends past ds"));
}

static void test_strict_ds_beyond_posted(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];

    /* ds 20 = 5 BBs, but the doorbell only covers 1 BB. */
    sw_test_ctrl(q, MLX5_OPCODE_NOP, 20, CU, 0);
    q->sq_pi += 1;
    q->dv.dbrec[MLX5_SND_DBR] = htobe32(q->sq_pi);
    expect_err(f, 0, 0, 0, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("exceeds the posted WQE space"));
}

static void test_strict_segment_rules(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    unsigned i, units;
    uint16_t w;

    /* RDMA_READ cannot scatter into inline data. */
    units = sw_test_inline(q, 2, "xy", 2);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], f->rkey[1]);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_READ, 2 + units, CU, 0);
    w = sw_test_ring(q, 2 + units);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("RDMA_READ with an inline segment"));
    assert_int_equal(fx_init_again(f), 0);

    /* 17 data segments: more than max_sge (16). */
    q = &f->qp[0];
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], f->rkey[1]);
    for (i = 0; i < 17; ++i) {
        sw_test_dseg(q, 2 + i, f->buf[0], 1, f->lkey[0]);
    }
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 19, CU, 0);
    w = sw_test_ring(q, 19);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("more data segments than max_sge"));
    assert_int_equal(fx_init_again(f), 0);

    /* Two 2 GiB segments (byte_count 0): over max_msg_sz. */
    q = &f->qp[0];
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0], 0, f->lkey[0]);
    sw_test_dseg(q, 3, f->buf[0], 0, f->lkey[0]);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 4, CU, 0);
    w = sw_test_ring(q, 4);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
    assert_true(sw_test_log_has("exceeds max_msg_sz"));
}

/* A doorbell rung on a QP in RESET is ignored (a reset QP executes
 * nothing) and logged; the QP stays usable. */
static void test_strict_doorbell_in_reset(void **state)
{
    fx_t *f = *state;
    sw_test_cq_t cq;
    sw_test_qp_t q;

    assert_int_equal(sw_test_cq_create(f->devs[0], 8, &cq), UCS_OK);
    assert_int_equal(sw_test_qp_create(f->devs[0], &cq, &cq, NULL, 8, 0, 0, &q),
                     UCS_OK);
    sw_test_ctrl(&q, MLX5_OPCODE_NOP, 1, CU, 0);
    sw_test_ring(&q, 1);
    vqp_sw_progress(f->devs[0]);
    assert_true(sw_test_log_has("rung in state RESET (SQ requires RTS)"));
    assert_null(sw_test_cq_peek(&cq));
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_RESET);
    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);
    assert_int_equal(vqp_sw_cq_destroy(cq.cq), UCS_OK);
}

static void test_strict_wqe_index(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];

    q->sq_pi = 5; /* WQE claims index 5 at ring position 0 */
    sw_test_ctrl(q, MLX5_OPCODE_NOP, 1, CU, 0);
    memcpy(sw_test_bb(q, 0), sw_test_bb(q, 5), 64);
    q->sq_pi                  = 1;
    q->dv.dbrec[MLX5_SND_DBR] = htobe32(1);
    expect_err(f, 0, 0, 0, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("wqe index 5 in opmod_idx_opcode != "
                                "producer index 0"));
}

static void test_strict_qpn(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint16_t w;

    q->qpn ^= 1;
    sw_test_ctrl(q, MLX5_OPCODE_NOP, 1, CU, 0);
    q->qpn ^= 1;
    w = sw_test_ring(q, 1);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("in ctrl != QPN"));
}

static void test_strict_sq_overflow(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    unsigned i;

    /* 17 NOPs into a 16-BB ring before the engine runs. */
    for (i = 0; i < 17; ++i) {
        sw_test_ctrl(q, MLX5_OPCODE_NOP, 1, CU, 0);
        sw_test_ring(q, 1);
    }
    vqp_sw_progress(f->devs[0]);
    assert_true(sw_test_log_has("SQ overflow"));
    assert_int_equal(vqp_sw_qp_state(q->qp), IBV_QPS_ERR);
}

static void test_strict_post_in_init(void **state)
{
    fx_t *f = *state;
    sw_test_cq_t cq;
    sw_test_qp_t q;
    vqp_sw_qp_attr_t qa;
    struct mlx5_cqe64 cqe;

    assert_int_equal(sw_test_cq_create(f->devs[0], 8, &cq), UCS_OK);
    assert_int_equal(sw_test_qp_create(f->devs[0], &cq, &cq, NULL, 8, 4, 0, &q),
                     UCS_OK);
    /* Receives may be posted from INIT, sends need RTS. */
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_INIT;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_OK);
    sw_test_post_recv(&q, f->buf[0], 8, f->lkey[0]);
    sw_test_ctrl(&q, MLX5_OPCODE_NOP, 1, CU, 0);
    sw_test_ring(&q, 1);
    assert_int_equal(sw_test_poll(f->devs, 1, &cq, &cqe, 2000), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe), MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("posted to the SQ in state INIT"));
    /* The early receive is flushed, not lost. */
    assert_int_equal(sw_test_poll(f->devs, 1, &cq, &cqe, 2000), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);
    assert_int_equal(vqp_sw_cq_destroy(cq.cq), UCS_OK);
}

static void test_strict_unknown_opcode(void **state)
{
    fx_t *f = *state;
    uint16_t w;

    sw_test_ctrl(&f->qp[0], 0x25 /* UMR: not supported */, 1, CU, 0);
    w = sw_test_ring(&f->qp[0], 1);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("unsupported opcode 0x25"));
}

static void test_strict_atomic_rules(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint16_t w;

    sw_test_ctrl(q, MLX5_OPCODE_ATOMIC_FA, 4, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + 4, f->rkey[1]);
    sw_test_atomic(q, 2, 1, 0);
    sw_test_dseg(q, 3, f->buf[0], 8, f->lkey[0]);
    w = sw_test_ring(q, 4);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
    assert_true(sw_test_log_has("not 8-byte aligned"));
    assert_int_equal(f->buf[1][4], 0);
}

static void test_strict_atomic_layout(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint16_t w;

    sw_test_ctrl(q, MLX5_OPCODE_ATOMIC_CS, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], f->rkey[1]);
    sw_test_atomic(q, 2, 1, 0);
    w = sw_test_ring(q, 3);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("atomic WQE needs ds 4"));
}

/* A masked atomic the device must refuse: error CQE with @a synd, the log
 * line, the target word (16 bytes at buf[1] + 64) and the result buffer
 * unchanged, the QP in ERROR. */
static void masked_refused(fx_t *f, uint8_t op, uint8_t opmod, unsigned size,
                           unsigned ds, uint64_t raddr, uint32_t res_len,
                           uint32_t lkey, uint8_t synd, const char *log)
{
    static const uint8_t zero[16];
    uint8_t *res = f->buf[0] + 256;
    uint16_t w;

    memset(res, 0xee, 16);
    w = sw_test_masked(&f->qp[0], op, opmod, size, ds, raddr, f->rkey[1], 1, 0,
                       ~0ull, 0, res, res_len, lkey);
    expect_err(f, 0, 0, w, synd);
    assert_true(sw_test_log_has(log));
    assert_memory_equal(f->buf[1] + 64, zero, 16);
    assert_int_equal(res[0], 0xee);
    assert_int_equal(vqp_sw_qp_state(f->qp[0].qp), IBV_QPS_ERR);
}

#define T_MASKED(_name, _op, _opmod, _size, _ds, _roff, _rlen, _synd, _log)    \
    static void _name(void **state)                                            \
    {                                                                          \
        fx_t *f = *state;                                                      \
                                                                               \
        masked_refused(f, MLX5_OPCODE_ATOMIC_MASKED_##_op, _opmod, _size, _ds, \
                       (uintptr_t)f->buf[1] + (_roff), _rlen, f->lkey[0],      \
                       MLX5_CQE_SYNDROME_##_synd, _log);                       \
    }

/* The opmod must say extended atomic with a 4- or 8-byte operand. */
T_MASKED(test_strict_masked_opmod0, CS, 0x0, 8, 5, 64, 8, LOCAL_QP_OP_ERR,
         "opmod 0x0: need 0x8 (4-byte) or 0x9 (8-byte operands)")
T_MASKED(test_strict_masked_opmod_size, FA, 0xa, 8, 4, 64, 8, LOCAL_QP_OP_ERR,
         "opmod 0xa: need 0x8 (4-byte) or 0x9 (8-byte operands)")
T_MASKED(test_strict_masked_opmod_noext, FA, 0x1, 8, 4, 64, 8, LOCAL_QP_OP_ERR,
         "opmod 0x1: need 0x8")
/* ds follows the operand layout: 8-byte CS has two operand segments. */
T_MASKED(test_strict_masked_cs64_ds, CS, 0x9, 8, 4, 64, 8, LOCAL_QP_OP_ERR,
         "on 8 bytes needs ds 5 (ctrl, raddr, 2 operand segment(s), data), "
         "not 4")
T_MASKED(test_strict_masked_cs32_ds, CS, 0x8, 4, 5, 64, 4, LOCAL_QP_OP_ERR,
         "on 4 bytes needs ds 4 (ctrl, raddr, 1 operand segment(s), data), "
         "not 5")
T_MASKED(test_strict_masked_fa64_ds, FA, 0x9, 8, 5, 64, 8, LOCAL_QP_OP_ERR,
         "on 8 bytes needs ds 4")
/* The result buffer has the operand's size. */
T_MASKED(test_strict_masked_res32, FA, 0x8, 4, 4, 64, 8, LOCAL_QP_OP_ERR,
         "the result must be one 4-byte data segment")
T_MASKED(test_strict_masked_res64, CS, 0x9, 8, 5, 64, 4, LOCAL_QP_OP_ERR,
         "the result must be one 8-byte data segment")
/* Alignment to the operand's size. */
T_MASKED(test_strict_masked_align32, CS, 0x8, 4, 4, 66, 4, REMOTE_INVAL_REQ_ERR,
         "not 4-byte aligned")
T_MASKED(test_strict_masked_align64, FA, 0x9, 8, 4, 68, 8, REMOTE_INVAL_REQ_ERR,
         "not 8-byte aligned")
/* The 4-byte word must lie inside the region (its last word is fine). */
T_MASKED(test_strict_masked_range, FA, 0x8, 4, 4, FX_BUF, 4, REMOTE_ACCESS_ERR,
         "range outside the region")

static void test_strict_masked_inline_result(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint32_t word   = 0;
    uint16_t w;

    sw_test_ctrl(q, MLX5_OPCODE_ATOMIC_MASKED_FA, 4, CU, 0);
    sw_test_bb(q, q->sq_pi)[0] = 0x8;
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + 64, f->rkey[1]);
    sw_test_atomic(q, 2, 1, 0);
    sw_test_inline(q, 3, &word, 4);
    w = sw_test_ring(q, 4);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("the result must be one 4-byte data segment"));
    assert_int_equal(f->buf[1][64], 0);
}

static void test_strict_masked_bad_lkey(void **state)
{
    fx_t *f = *state;

    masked_refused(f, MLX5_OPCODE_ATOMIC_MASKED_CS, 0x8, 4, 4,
                   (uintptr_t)f->buf[1] + 64, 4, f->lkey[0] + 1,
                   MLX5_CQE_SYNDROME_LOCAL_PROT_ERR, "key not registered");
}

/* The region's last 4-byte word is a valid target. */
static void test_masked_last_word(void **state)
{
    fx_t *f          = *state;
    uint32_t *target = (uint32_t *)(f->buf[1] + FX_BUF - 4);
    uint32_t *res    = (uint32_t *)(f->buf[0] + 256);
    struct mlx5_cqe64 cqe;

    *target = 10;
    sw_test_masked(&f->qp[0], MLX5_OPCODE_ATOMIC_MASKED_FA, 0x8, 4, 4,
                   (uintptr_t)target, f->rkey[1], 5, 0, 0, 0, res, 4,
                   f->lkey[0]);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(*target, 15);
    assert_int_equal(be32toh(*res), 10);
}

static void test_strict_inline_too_large(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    uint8_t data[200];
    unsigned units;
    uint16_t w;

    memset(data, 1, sizeof(data));
    units = sw_test_inline(q, 2, data, sizeof(data)); /* max_inline 128 */
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1], f->rkey[1]);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 2 + units, CU, 0);
    w = sw_test_ring(q, 2 + units);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    assert_true(sw_test_log_has("larger than the QP's max_inline"));
    assert_int_equal(f->buf[1][0], 0);
}

static void test_strict_rq_overflow(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *b = &f->qp[1];
    uint16_t w;

    /* 9 receives into an 8-entry RQ. */
    b->rq_pi                  = 9;
    b->dv.dbrec[MLX5_RCV_DBR] = htobe32(9);
    w                         = fx_send(f, 0, MLX5_OPCODE_SEND, 0, 8, 0);
    expect_err(f, 0, 0, w, MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
    assert_true(sw_test_log_has("RQ overflow"));
    settle(f);
    assert_int_equal(vqp_sw_qp_state(b->qp), IBV_QPS_ERR);
}

static void test_strict_cq_overflow(void **state)
{
    fx_t *f = *state;
    unsigned i;

    /* 65 signaled NOPs into a 64-entry CQ nobody consumes (dbrec[0] 0). */
    for (i = 0; i < 65; ++i) {
        fx_nop(f, 0, CU);
        if ((i % 15) == 14) {
            vqp_sw_progress(f->devs[0]);
        }
    }
    settle(f);
    assert_int_equal(vqp_sw_cq_status(f->scq[0].cq), UCS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(vqp_sw_cq_status(f->scq[1].cq), UCS_OK);
    assert_true(sw_test_log_has("CQ 0 overflow"));
    assert_int_equal(vqp_sw_qp_state(f->qp[0].qp), IBV_QPS_ERR);
    /* Entries already written stay valid; nothing overwrote them. */
    for (i = 0; i < 64; ++i) {
        struct mlx5_cqe64 *cqe = sw_test_cq_peek(&f->scq[0]);

        assert_non_null(cqe);
        assert_int_equal(sw_test_cqe_opcode(cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe->wqe_counter), i);
        sw_test_cq_pop(&f->scq[0]);
    }
}

/* The target's inbound ring is full while its owner does not progress:
 * the sender waits (backpressure, no error), and resumes once the owner
 * drains the ring; nothing is lost or completed twice. */
static void test_inbound_backpressure(void **state)
{
    enum { N = 4200 };
    sw_test_cq_t scq, rcq, bcq;
    sw_test_qp_t qa, qb;
    struct mlx5_cqe64 cqe;
    vqp_sw_qp_counters_t c;
    fx_t *f = *state;
    unsigned i, n = 0;

    assert_int_equal(sw_test_cq_create(f->devs[0], 8192, &scq), UCS_OK);
    assert_int_equal(sw_test_cq_create(f->devs[0], 8, &rcq), UCS_OK);
    assert_int_equal(sw_test_cq_create(f->devs[1], 8192, &bcq), UCS_OK);
    assert_int_equal(
        sw_test_qp_create(f->devs[0], &scq, &rcq, NULL, 8192, 0, 0, &qa),
        UCS_OK);
    assert_int_equal(
        sw_test_qp_create(f->devs[1], &bcq, &bcq, NULL, 8, 8192, 0, &qb),
        UCS_OK);
    assert_int_equal(
        sw_test_qp_connect(&qa, &f->addr[1], qb.qpn, SW_TEST_ACCESS_ALL, 7, 2),
        UCS_OK);
    assert_int_equal(
        sw_test_qp_connect(&qb, &f->addr[0], qa.qpn, SW_TEST_ACCESS_ALL, 7, 2),
        UCS_OK);
    for (i = 0; i < N; ++i) {
        sw_test_post_recv(&qb, f->buf[1], 0 + 8, f->lkey[1]);
        sw_test_ctrl(&qa, MLX5_OPCODE_SEND, 1, CU, 0);
        sw_test_ring(&qa, 1);
    }
    /* Only A progresses: sends stop once B's ring is full. */
    for (i = 0; i < 200; ++i) {
        vqp_sw_progress(f->devs[0]);
    }
    while (sw_test_cq_peek(&scq) != NULL) {
        sw_test_cq_pop(&scq);
        ++n;
    }
    assert_true(n >= 4096);
    assert_true(n < N);
    vqp_sw_qp_counters(qa.qp, &c);
    assert_int_equal(c.errors, 0);
    assert_int_equal(vqp_sw_qp_state(qa.qp), IBV_QPS_RTS);
    /* B drains; everything completes once, in order. */
    for (i = 0; i < N; ++i) {
        assert_int_equal(sw_test_poll(f->devs, 2, &bcq, &cqe, 2000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
        assert_int_equal(be16toh(cqe.wqe_counter), i);
    }
    while (n < N) {
        assert_int_equal(sw_test_poll(f->devs, 2, &scq, &cqe, 2000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), n);
        ++n;
    }
    assert_true(fx_cq_empty(f, 1, 1) && (sw_test_cq_peek(&bcq) == NULL));
    vqp_sw_qp_destroy(qa.qp);
    vqp_sw_qp_destroy(qb.qp);
}

int main(void)
{
#define T(_t) cmocka_unit_test_setup_teardown(_t, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_bad_lkey_flushes_all),
        T(test_lkey_bounds_and_2gib),
        T(test_write_run_error_in_middle),
        T(test_send_run_error_in_middle),
        T(test_send_run_partial_rnr),
        T(test_remote_access),
        T(test_send_before_remote_access),
        T(test_remote_rights),
        T(test_deregistered_rkey),
        T(test_qp_access_flags),
        T(test_receive_too_small),
        T(test_scatter_two_entries),
        T(test_receiver_bad_lkey),
        T(test_rnr_exhausted),
        T(test_rnr_then_receive),
        T(test_peer_closed_retry_exceeded),
        T(test_peer_qp_reset),
        T(test_rtr_peer_missing),
        T(test_strict_ds_too_small),
        T(test_strict_inline_ds_mismatch),
        T(test_strict_ds_beyond_posted),
        T(test_strict_segment_rules),
        T(test_strict_doorbell_in_reset),
        T(test_strict_wqe_index),
        T(test_strict_qpn),
        T(test_strict_sq_overflow),
        T(test_strict_post_in_init),
        T(test_strict_unknown_opcode),
        T(test_strict_atomic_rules),
        T(test_strict_atomic_layout),
        T(test_strict_masked_opmod0),
        T(test_strict_masked_opmod_size),
        T(test_strict_masked_opmod_noext),
        T(test_strict_masked_cs64_ds),
        T(test_strict_masked_cs32_ds),
        T(test_strict_masked_fa64_ds),
        T(test_strict_masked_res32),
        T(test_strict_masked_res64),
        T(test_strict_masked_align32),
        T(test_strict_masked_align64),
        T(test_strict_masked_range),
        T(test_strict_masked_inline_result),
        T(test_strict_masked_bad_lkey),
        T(test_masked_last_word),
        T(test_strict_inline_too_large),
        T(test_strict_rq_overflow),
        T(test_strict_cq_overflow),
        T(test_inbound_backpressure),
    };
    int ret;
#undef T

    ucs_log_push_handler(sw_test_log_handler);
    ret = cmocka_run_group_tests(tests, NULL, NULL);
    ucs_log_pop_handler();
    return ret;
}
