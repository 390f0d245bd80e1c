/*
 * Software device: seeded fault injection. Configuration parsing (errors
 * named in the log), targeted error CQEs, probabilistic errors and
 * completion reordering that repeat exactly for a seed, reordering that
 * never crosses a QP's own order, placement delay and killed QPs.
 */
#include <config.h>

#include "sw_test_fx.h"
#include "sw_test_lock.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>

static const uint8_t CU = MLX5_WQE_CTRL_CQ_UPDATE;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));

    *state             = f;
    sw_test_log_buf[0] = '\0';
    return fx_init(f, 64, 8, 7, 2);
}

static int teardown(void **state)
{
    fx_fini(*state);
    free(*state);
    return 0;
}

static void test_parse(void **state)
{
    fx_t *f = *state;
    vqp_sw_dev_t *dev;
    char spec[128];
    static const char *bad[] = {
        "reorder=2",
        "bogus=1",
        "err=1:2",
        "err=1:2:0",
        "seed=-1",
        "seed=",
        "delay_us=abc",
        "err_prob=0.1:0",
        "kill=0x1000000",
        "reorder",
        "seed=1,,reorder=0.1",
    };
    unsigned i;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        assert_int_equal(vqp_sw_dev_set_faults(f->devs[0], bad[i]),
                         UCS_ERR_INVALID_PARAM);
        assert_true(sw_test_log_has("bad item"));
    }
    snprintf(spec, sizeof(spec),
             "seed=7,reorder=0.2,delay_us=50,delay_prob=0.5,err=%u:3:0x13,"
             "err_prob=0.001:0x15,kill=%u",
             f->qp[1].qpn, f->qp[1].qpn);
    assert_int_equal(vqp_sw_dev_set_faults(f->devs[0], spec), UCS_OK);
    assert_int_equal(vqp_sw_dev_set_faults(f->devs[0], ""), UCS_OK);

    /* Through the environment at open: a bad string fails the open. */
    setenv("VQP_SW_FAULTS", "reorder=0.5,nonsense", 1);
    dev = NULL;
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev), UCS_ERR_INVALID_PARAM);
    assert_null(dev);
    assert_true(sw_test_log_has("invalid VQP_SW_FAULTS"));
    setenv("VQP_SW_FAULTS", "seed=3,err_prob=0.5", 1);
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev), UCS_OK);
    unsetenv("VQP_SW_FAULTS");
    vqp_sw_dev_close(dev);
}

static void test_targeted_error(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    char spec[64];
    unsigned i;

    snprintf(spec, sizeof(spec), "err=%u:2:0x14", f->qp[0].qpn);
    assert_int_equal(vqp_sw_dev_set_faults(f->devs[0], spec), UCS_OK);
    for (i = 0; i < 4; ++i) {
        fx_nop(f, 0, CU);
    }
    for (i = 0; i < 4; ++i) {
        assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
        assert_int_equal(be16toh(cqe.wqe_counter), i);
        if (i < 2) {
            assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        } else {
            assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
            assert_int_equal(sw_test_cqe_synd(&cqe),
                             i == 2 ? MLX5_CQE_SYNDROME_REMOTE_OP_ERR
                                    : MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
        }
    }
    assert_int_equal(vqp_sw_qp_state(f->qp[0].qp), IBV_QPS_ERR);
}

static void test_kill(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    char spec[64];

    snprintf(spec, sizeof(spec), "kill=%u", f->qp[0].qpn);
    assert_int_equal(vqp_sw_dev_set_faults(f->devs[0], spec), UCS_OK);
    fx_nop(f, 0, CU);
    fx_nop(f, 0, 0);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_synd(&cqe), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(be16toh(cqe.wqe_counter), 1);
    /* The other QP is untouched. */
    assert_int_equal(vqp_sw_qp_state(f->qp[1].qp), IBV_QPS_RTS);
}

/* Index of the first WQE failed by err_prob, for three QP lifetimes. */
static void run_err_prob(uint64_t seed, unsigned out[3])
{
    struct mlx5_cqe64 cqe;
    vqp_sw_qp_attr_t qa;
    char spec[64];
    fx_t f;
    unsigned r, i;

    assert_int_equal(fx_init(&f, 64, 8, 7, 2), 0);
    snprintf(spec, sizeof(spec), "seed=%lu,err_prob=0.05", (unsigned long)seed);
    assert_int_equal(vqp_sw_dev_set_faults(f.devs[0], spec), UCS_OK);
    memset(&qa, 0, sizeof(qa));
    for (r = 0; r < 3; ++r) {
        out[r] = UINT32_MAX;
        for (i = 0; i < 1000 && out[r] == UINT32_MAX; ++i) {
            fx_nop(&f, 0, CU);
            assert_int_equal(fx_poll(&f, 0, 0, &cqe), 0);
            if (sw_test_cqe_opcode(&cqe) == MLX5_CQE_REQ_ERR) {
                assert_int_equal(sw_test_cqe_synd(&cqe),
                                 MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
                out[r] = be16toh(cqe.wqe_counter);
            }
        }
        assert_int_not_equal(out[r], UINT32_MAX);
        qa.qp_state = IBV_QPS_RESET;
        assert_int_equal(vqp_sw_qp_modify(f.qp[0].qp, &qa), UCS_OK);
        f.qp[0].sq_pi = f.qp[0].rq_pi = 0;
        assert_int_equal(sw_test_qp_connect(&f.qp[0], &f.addr[1], f.qp[1].qpn,
                                            SW_TEST_ACCESS_ALL, 7, 2),
                         UCS_OK);
    }
    fx_fini(&f);
}

static void test_err_prob_deterministic(void **state)
{
    unsigned a[3], b[3];

    run_err_prob(1234, a);
    run_err_prob(1234, b);
    assert_memory_equal(a, b, sizeof(a));
}

/* A SEND from A to B, then NOPs, under err_prob and delays: out[0] is the
 * SEND's syndrome (0: it succeeded), out[1] the index of the first NOP
 * failed (UINT32_MAX: none in 300). With @a hold, another thread holds B's
 * segment lock while A's engine runs 50 times: the SEND is retried after
 * each busy stall. */
static void run_drawn_once(uint64_t seed, int hold, unsigned out[2])
{
    sw_test_lock_holder_t holder;
    struct mlx5_cqe64 cqe;
    char spec[96];
    unsigned i;
    fx_t f;

    assert_int_equal(fx_init(&f, 64, 8, 7, 2), 0);
    snprintf(spec, sizeof(spec),
             "seed=%lu,err_prob=0.3,delay_us=1,delay_prob=0.5",
             (unsigned long)seed);
    assert_int_equal(vqp_sw_dev_set_faults(f.devs[0], spec), UCS_OK);
    sw_test_post_recv(&f.qp[1], f.buf[1], 64, f.lkey[1]);
    if (hold) {
        assert_int_equal(sw_test_lock_hold(&holder, f.devs[1]), 0);
    }
    fx_send(&f, 0, MLX5_OPCODE_SEND, 0, 32, 0);
    if (hold) {
        for (i = 0; i < 50; ++i) {
            vqp_sw_progress(f.devs[0]);
        }
        /* Still waiting for the lock, not failed: the first draw said so
         * (the caller checks), and the retries did not draw again. */
        assert_int_equal(f.qp[0].qp->stall, VQP_SW_STALL_BUSY);
        assert_null(sw_test_cq_peek(&f.scq[0]));
        sw_test_lock_release(&holder);
    }
    assert_int_equal(fx_poll(&f, 0, 0, &cqe), 0);
    out[0] =
        (sw_test_cqe_opcode(&cqe) == MLX5_CQE_REQ) ? 0 : sw_test_cqe_synd(&cqe);
    out[1] = UINT32_MAX;
    for (i = 0; (out[0] == 0) && (i < 300) && (out[1] == UINT32_MAX); ++i) {
        fx_nop(&f, 0, CU);
        assert_int_equal(fx_poll(&f, 0, 0, &cqe), 0);
        if (sw_test_cqe_opcode(&cqe) == MLX5_CQE_REQ_ERR) {
            out[1] = be16toh(cqe.wqe_counter);
        }
    }
    fx_fini(&f);
}

/* Fault decisions are drawn once per WQE: a WQE retried after stalls gets
 * the same fate, and the WQEs after it the same draws, as without them. */
static void test_fault_drawn_once(void **state)
{
    unsigned plain[2], held[2];

    (void)state;
    run_drawn_once(11, 0, plain);
    /* The seed's premise: its first WQE is not failed, a later one is. */
    assert_int_equal(plain[0], 0);
    assert_int_not_equal(plain[1], UINT32_MAX);
    run_drawn_once(11, 1, held);
    assert_memory_equal(plain, held, sizeof(plain));
}

/* Two QPs of one device share a CQ; returns the CQE order as qpn<<16|wqe. */
static void run_reorder(uint64_t seed, double p, uint32_t *seq, unsigned n)
{
    vqp_sw_dev_t *dev;
    vqp_sw_dev_addr_t addr;
    sw_test_cq_t cq;
    sw_test_qp_t q[2];
    struct mlx5_cqe64 cqe;
    char spec[64];
    unsigned i, k;

    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev), UCS_OK);
    vqp_sw_dev_address(dev, &addr);
    snprintf(spec, sizeof(spec), "seed=%lu,reorder=%g", (unsigned long)seed, p);
    assert_int_equal(vqp_sw_dev_set_faults(dev, spec), UCS_OK);
    assert_int_equal(sw_test_cq_create(dev, 256, &cq), UCS_OK);
    for (k = 0; k < 2; ++k) {
        assert_int_equal(
            sw_test_qp_create(dev, &cq, &cq, NULL, 64, 0, 0, &q[k]), UCS_OK);
    }
    /* The two QPs are each other's peer (same device). */
    for (k = 0; k < 2; ++k) {
        assert_int_equal(sw_test_qp_connect(&q[k], &addr, q[!k].qpn,
                                            SW_TEST_ACCESS_ALL, 7, 2),
                         UCS_OK);
    }
    for (i = 0; i < n / 2; ++i) {
        for (k = 0; k < 2; ++k) {
            sw_test_ctrl(&q[k], MLX5_OPCODE_NOP, 1, CU, 0);
            sw_test_ring(&q[k], 1);
        }
        if ((i % 10) == 9) {
            vqp_sw_progress(dev);
        }
    }
    for (i = 0; i < n; ++i) {
        assert_int_equal(sw_test_poll(&dev, 1, &cq, &cqe, 2000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        seq[i] = ((sw_test_cqe_qpn(&cqe) == q[1].qpn) << 16) |
                 be16toh(cqe.wqe_counter);
    }
    for (k = 0; k < 2; ++k) {
        vqp_sw_qp_destroy(q[k].qp);
    }
    vqp_sw_dev_close(dev);
}

static void test_reorder(void **state)
{
    enum { N = 100 };
    uint32_t a[N], b[N], plain[N];
    uint32_t next[2] = {0, 0};
    unsigned i, moved = 0;

    run_reorder(99, 0.0, plain, N);
    run_reorder(99, 0.3, a, N);
    run_reorder(99, 0.3, b, N);
    /* Same seed, same sequence. */
    assert_memory_equal(a, b, sizeof(a));
    for (i = 0; i < N; ++i) {
        /* Within a QP: strictly in posting order. */
        assert_int_equal(a[i] & 0xffff, next[a[i] >> 16]);
        ++next[a[i] >> 16];
        moved += a[i] != plain[i];
    }
    assert_int_equal(next[0], N / 2);
    assert_int_equal(next[1], N / 2);
    /* Across QPs: some CQEs did overtake others. */
    assert_true(moved > 0);
}

static void test_delay(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    uint64_t t0;
    int i;

    assert_int_equal(vqp_sw_dev_set_faults(f->devs[0], "delay_us=20000"),
                     UCS_OK);
    memset(f->buf[0], 0x42, 16);
    t0 = sw_test_now_ms();
    fx_write(f, 0, 0, 0, 16, CU);
    for (i = 0; i < 5; ++i) {
        vqp_sw_progress(f->devs[0]);
    }
    if (sw_test_now_ms() - t0 < 15) {
        /* Not placed yet while the delay runs. */
        assert_int_equal(f->buf[1][0], 0);
    }
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_true(sw_test_now_ms() - t0 >= 20);
    assert_int_equal(f->buf[1][0], 0x42);
}

int main(void)
{
#define T(_t) cmocka_unit_test_setup_teardown(_t, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_parse),
        T(test_targeted_error),
        T(test_kill),
        cmocka_unit_test(test_err_prob_deterministic),
        cmocka_unit_test(test_fault_drawn_once),
        cmocka_unit_test(test_reorder),
        T(test_delay),
    };
    int ret;
#undef T

    ucs_log_push_handler(sw_test_log_handler);
    ret = cmocka_run_group_tests(tests, NULL, NULL);
    ucs_log_pop_handler();
    return ret;
}
