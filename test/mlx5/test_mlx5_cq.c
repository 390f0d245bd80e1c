/*
 * Completion-queue tests of the mlx5 data path: owner-bit alternation over
 * many wraps, field decoding, consumer-index record, every error syndrome's
 * status, compressed and unexpected CQEs, 128-byte CQEs and arming. CQEs are
 * fabricated the way the device writes them.
 */
#include <config.h>

#include "mlx5_fake.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

static void test_init_rejects(void **state)
{
    fake_cq_t *f     = fake_cq_new(8, 64);
    vqp_mlx5_cq_t cq = {0};

    f->dv.cqe_cnt = 6;
    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "6 CQEs of 64 bytes");
    f->dv.cqe_cnt  = 8;
    f->dv.cqe_size = 32;
    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "8 CQEs of 32 bytes");
    f->dv.cqe_size = 64;
    f->dv.dbrec    = NULL;
    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "dbrec (nil)");
    f->dv.dbrec = f->dbrec;
    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_OK);
    assert_int_equal(cq.log_cnt, 3);
    fake_cq_free(f);
}

/* Poll through 6 passes over an 8-entry ring, in bursts of varying size:
 * each CQE is seen exactly once, with its own fields, and stale CQEs of the
 * previous pass are never mistaken for new ones. */
static void poll_wraps(uint32_t cqe_size)
{
    fake_cq_t *f      = fake_cq_new(8, cqe_size);
    uint32_t produced = 0, consumed = 0, burst;
    struct mlx5_cqe64 *cqe;
    vqp_mlx5_cq_t cq = {0};
    uint8_t op_own   = 0;

    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_OK);
    assert_null(vqp_mlx5_cq_poll(&cq)); /* a new CQ is empty */
    assert_null(vqp_mlx5_cq_poll_own(&cq, &op_own));

    for (burst = 1; produced < 6 * 8; burst = (burst % 8) + 1) {
        uint32_t n;

        for (n = 0; (n < burst) && (produced < 6 * 8); ++n, ++produced) {
            fake_cq_push(f, (uint8_t)(produced % 4), 0x100 + produced,
                         (uint16_t)(produced * 3), produced * 11,
                         htobe32(produced ^ 0xabcdef));
        }
        /* Every third CQE through vqp_mlx5_cq_poll, the others through
         * vqp_mlx5_cq_poll_own, which also returns the op_own byte it
         * checked (the core's poll tests it without reading it again). */
        while ((cqe = (consumed % 3) ? vqp_mlx5_cq_poll_own(&cq, &op_own)
                                     : vqp_mlx5_cq_poll(&cq)) != NULL) {
            if (consumed % 3) {
                assert_int_equal(op_own, cqe->op_own);
                assert_int_equal(vqp_mlx5_op_own_is_req_ok(op_own),
                                 consumed % 4 == MLX5_CQE_REQ);
            }
            assert_int_equal(vqp_mlx5_cqe_is_req_ok(cqe),
                             consumed % 4 == MLX5_CQE_REQ);
            assert_int_equal(vqp_mlx5_cqe_status(cqe), UCS_OK);
            assert_int_equal(vqp_mlx5_cqe_opcode(cqe), consumed % 4);
            assert_int_equal(vqp_mlx5_cqe_qpn(cqe), 0x100 + consumed);
            assert_int_equal(vqp_mlx5_cqe_wqe_counter(cqe),
                             (uint16_t)(consumed * 3));
            assert_int_equal(vqp_mlx5_cqe_byte_cnt(cqe), consumed * 11);
            assert_int_equal(vqp_mlx5_cqe_imm(cqe),
                             htobe32(consumed ^ 0xabcdef));
            ++consumed;
        }
        assert_int_equal(consumed, produced);
        vqp_mlx5_cq_update_ci(&cq);
        assert_int_equal(be32toh(f->dbrec[VQP_MLX5_CQ_SET_CI]), consumed);
    }
    assert_int_equal(cq.ci, 48);
    expect_no_log();
    /* Every slot now holds a CQE of an old pass: still nothing to poll. */
    assert_null(vqp_mlx5_cq_poll(&cq));
    assert_int_equal(cq.ci, 48);
    fake_cq_free(f);
}

static void test_poll_wraps_64(void **state)
{
    poll_wraps(64);
}

static void test_poll_wraps_128(void **state)
{
    poll_wraps(128);
}

/* A CQE whose owner bit says "next pass", or that is still marked invalid
 * with the right owner bit, is not ready. */
static void test_not_ready(void **state)
{
    fake_cq_t *f = fake_cq_new(4, 64);
    struct mlx5_cqe64 *cqe;
    vqp_mlx5_cq_t cq = {0};

    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_OK);
    cqe         = fake_cq_slot(f, 0);
    cqe->op_own = (MLX5_CQE_REQ << 4) | 1; /* owner of pass 1 */
    assert_null(vqp_mlx5_cq_poll(&cq));
    cqe->op_own = (MLX5_CQE_INVALID << 4) | 0;
    assert_null(vqp_mlx5_cq_poll(&cq));
    cqe->op_own = (MLX5_CQE_REQ << 4) | 0;
    assert_ptr_equal(vqp_mlx5_cq_poll(&cq), cqe);
    assert_null(vqp_mlx5_cq_poll(&cq));
    fake_cq_free(f);
}

/* The consumer-index record holds the low 24 bits. */
static void test_update_ci_24bit(void **state)
{
    fake_cq_t *f     = fake_cq_new(4, 64);
    vqp_mlx5_cq_t cq = {0};

    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_OK);
    cq.ci = 0x1234567; /* as after 2^24 + ... polls */
    vqp_mlx5_cq_update_ci(&cq);
    assert_int_equal(be32toh(f->dbrec[VQP_MLX5_CQ_SET_CI]), 0x234567);
    fake_cq_free(f);
}

static const struct {
    uint8_t syndrome;
    ucs_status_t status;
    const char *str;
} syndromes[] = {
    {MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR, UCS_ERR_IO_ERROR, "length"},
    {MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR, UCS_ERR_IO_ERROR, "QP operation"},
    {MLX5_CQE_SYNDROME_LOCAL_PROT_ERR, UCS_ERR_IO_ERROR, "protection"},
    {MLX5_CQE_SYNDROME_WR_FLUSH_ERR, UCS_ERR_CANCELED, "flushed"},
    {MLX5_CQE_SYNDROME_MW_BIND_ERR, UCS_ERR_IO_ERROR, "window"},
    {MLX5_CQE_SYNDROME_BAD_RESP_ERR, UCS_ERR_IO_ERROR, "bad response"},
    {MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR, UCS_ERR_IO_ERROR, "local access"},
    {MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR, UCS_ERR_IO_ERROR,
     "invalid request"},
    {MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, UCS_ERR_CONNECTION_RESET,
     "remote access"},
    {MLX5_CQE_SYNDROME_REMOTE_OP_ERR, UCS_ERR_CONNECTION_RESET,
     "remote operation"},
    {MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR, UCS_ERR_ENDPOINT_TIMEOUT,
     "transport retry"},
    {MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR, UCS_ERR_ENDPOINT_TIMEOUT, "RNR"},
    {MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR, UCS_ERR_ENDPOINT_TIMEOUT, "aborted"},
    {0x7f, UCS_ERR_IO_ERROR, "unknown"},
};

/* Every syndrome, on requester and responder error CQEs, through the ring:
 * QP number and wqe_counter still decode (errors are routed by them). */
static void test_error_syndromes(void **state)
{
    size_t n     = sizeof(syndromes) / sizeof(syndromes[0]);
    fake_cq_t *f = fake_cq_new(4, 64);
    struct mlx5_cqe64 *cqe;
    vqp_mlx5_cq_t cq = {0};
    unsigned i, side;

    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_OK);
    for (i = 0; i < n; ++i) {
        for (side = 0; side < 2; ++side) {
            uint8_t op = side ? MLX5_CQE_RESP_ERR : MLX5_CQE_REQ_ERR;

            fake_cq_push_err(f, op, 0xabc00 + i, (uint16_t)(0xfff0 + i),
                             syndromes[i].syndrome, 0x42);
            cqe = vqp_mlx5_cq_poll(&cq);
            assert_non_null(cqe);
            assert_int_equal(vqp_mlx5_cqe_opcode(cqe), op);
            assert_int_equal(vqp_mlx5_cqe_status(cqe), syndromes[i].status);
            if (syndromes[i].syndrome == MLX5_CQE_SYNDROME_WR_FLUSH_ERR) {
                expect_log(UCS_LOG_LEVEL_DEBUG, "work request flushed");
            } else {
                assert_non_null(
                    strstr(fake_log_last, side ? "responder" : "requester"));
                expect_log(UCS_LOG_LEVEL_DIAG, syndromes[i].str);
            }
            assert_int_equal(vqp_mlx5_cqe_syndrome(cqe), syndromes[i].syndrome);
            assert_int_equal(vqp_mlx5_cqe_vendor_syndrome(cqe), 0x42);
            assert_int_equal(vqp_mlx5_cqe_qpn(cqe), 0xabc00 + i);
            assert_int_equal(vqp_mlx5_cqe_wqe_counter(cqe),
                             (uint16_t)(0xfff0 + i));
            assert_non_null(strstr(vqp_mlx5_syndrome_str(syndromes[i].syndrome),
                                   syndromes[i].str));
            assert_null(vqp_mlx5_cq_poll(&cq));
        }
    }
    fake_cq_free(f);
}

/* Compressed CQEs (format 3) are never enabled by us; a signature error
 * is not a normal completion either. Both surface as I/O errors. */
static void test_unexpected_cqes(void **state)
{
    fake_cq_t *f = fake_cq_new(4, 64);
    struct mlx5_cqe64 *cqe;
    vqp_mlx5_cq_t cq = {0};

    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_OK);
    cqe = fake_cq_push(f, MLX5_CQE_REQ, 1, 0, 0, 0);
    cqe->op_own |= 0x0c;
    cqe = vqp_mlx5_cq_poll(&cq);
    assert_non_null(cqe);
    assert_int_equal(vqp_mlx5_cqe_status(cqe), UCS_ERR_IO_ERROR);
    expect_log(UCS_LOG_LEVEL_ERROR, "compressed CQE (op_own 0x0c)");

    fake_cq_push(f, MLX5_CQE_SIG_ERR, 1, 0, 0, 0);
    cqe = vqp_mlx5_cq_poll(&cq);
    assert_non_null(cqe);
    assert_int_equal(vqp_mlx5_cqe_status(cqe), UCS_ERR_IO_ERROR);
    expect_log(UCS_LOG_LEVEL_ERROR, "unexpected CQE opcode 12");

    /* Responder opcodes are good completions. */
    fake_cq_push(f, MLX5_CQE_RESP_SEND_IMM, 1, 0, 0, 0);
    cqe = vqp_mlx5_cq_poll(&cq);
    assert_int_equal(vqp_mlx5_cqe_status(cqe), UCS_OK);
    fake_cq_free(f);
}

/* The fast path's one test agrees with opcode and status on every op_own
 * byte: a requester CQE that vqp_mlx5_cqe_status() finds good, nothing
 * else. */
static void test_req_ok_every_op_own(void **state)
{
    struct mlx5_cqe64 cqe;
    unsigned op_own;
    int expect;

    memset(&cqe, 0, sizeof(cqe));
    for (op_own = 0; op_own < 256; ++op_own) {
        cqe.op_own = (uint8_t)op_own;
        expect     = (vqp_mlx5_cqe_opcode(&cqe) == MLX5_CQE_REQ) &&
                 ((op_own & 0x0c) != 0x0c);
        assert_int_equal(vqp_mlx5_cqe_is_req_ok(&cqe), expect);
    }
    /* And where it holds, the status is good, without a log line. */
    for (op_own = 0; op_own < 0x0c; ++op_own) {
        cqe.op_own = (uint8_t)op_own;
        assert_int_equal(vqp_mlx5_cqe_status(&cqe), UCS_OK);
    }
    expect_no_log();
}

static void test_arm(void **state)
{
    fake_cq_t *f     = fake_cq_new(8, 64);
    vqp_mlx5_cq_t cq = {0};
    uint32_t val;

    assert_int_equal(vqp_mlx5_cq_init(&cq, &f->dv), UCS_OK);
    fake_cq_push(f, MLX5_CQE_REQ, 1, 0, 0, 0);
    fake_cq_push(f, MLX5_CQE_REQ, 1, 0, 0, 0);
    assert_non_null(vqp_mlx5_cq_poll(&cq));
    assert_non_null(vqp_mlx5_cq_poll(&cq));

    assert_int_equal(vqp_mlx5_cq_arm(&cq, 0), UCS_OK);
    val = be32toh(f->dbrec[VQP_MLX5_CQ_ARM_DB]);
    assert_int_equal(val, 2); /* sn 0, "next CQE", ci 2 */
    assert_int_equal(be64toh(f->uar[MLX5_CQ_DOORBELL / 8]),
                     ((uint64_t)val << 32) | 0x77);

    vqp_mlx5_cq_event(&cq);
    assert_int_equal(vqp_mlx5_cq_arm(&cq, 1), UCS_OK);
    val = be32toh(f->dbrec[VQP_MLX5_CQ_ARM_DB]);
    assert_int_equal(val, (1u << 28) | MLX5_CQ_DB_REQ_NOT_SOL | 2);
    assert_int_equal(be64toh(f->uar[MLX5_CQ_DOORBELL / 8]),
                     ((uint64_t)val << 32) | 0x77);

    /* Nothing at ci after the arm, then a CQE the device wrote there. */
    assert_false(vqp_mlx5_cq_ready_at_arm(&cq));
    assert_false(vqp_mlx5_cq_ready(&cq));
    fake_cq_push(f, MLX5_CQE_REQ, 1, 0, 0, 0);
    assert_true(vqp_mlx5_cq_ready_at_arm(&cq));
    assert_true(vqp_mlx5_cq_ready(&cq)); /* a look: the CQE stays */
    assert_non_null(vqp_mlx5_cq_poll(&cq));
    assert_false(vqp_mlx5_cq_ready_at_arm(&cq));
    assert_false(vqp_mlx5_cq_ready(&cq));

    cq.uar = NULL;
    assert_int_equal(vqp_mlx5_cq_arm(&cq, 0), UCS_ERR_UNSUPPORTED);
    expect_log(UCS_LOG_LEVEL_ERROR, "no doorbell page");
    fake_cq_free(f);
}

static int log_setup(void **state)
{
    fake_log_start();
    return 0;
}

static int log_teardown(void **state)
{
    fake_log_stop();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rejects),
        cmocka_unit_test(test_poll_wraps_64),
        cmocka_unit_test(test_poll_wraps_128),
        cmocka_unit_test(test_not_ready),
        cmocka_unit_test(test_update_ci_24bit),
        cmocka_unit_test(test_error_syndromes),
        cmocka_unit_test(test_unexpected_cqes),
        cmocka_unit_test(test_req_ok_every_op_own),
        cmocka_unit_test(test_arm),
    };

    return cmocka_run_group_tests(tests, log_setup, log_teardown);
}
