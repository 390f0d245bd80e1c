/*
 * Receive-side tests of the mlx5 data path: RQ scatter lists, terminators,
 * room and doorbell record; SRQ free list (posting, freeing out of order,
 * reuse). No device: the queues are host memory.
 */
#include <config.h>

#include "mlx5_fake.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

static void check_dseg(const struct mlx5_wqe_data_seg *d, uint64_t addr,
                       uint32_t len, uint32_t lkey)
{
    assert_int_equal(be32toh(d->byte_count), len);
    assert_int_equal(be32toh(d->lkey), lkey);
    assert_int_equal(be64toh(d->addr), addr);
}

static void check_end(const struct mlx5_wqe_data_seg *d)
{
    check_dseg(d, 0, 0, MLX5_INVALID_LKEY);
}

static void test_rq_init_rejects(void **state)
{
    fake_qp_t *qp      = fake_qp_new(64, 8, 64);
    vqp_mlx5_rxwq_t rq = {0};

    qp->dv.rq.stride = 48;
    assert_int_equal(vqp_mlx5_rxwq_init(&rq, &qp->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "8 WQEs of 48 bytes");
    qp->dv.rq.stride = 8;
    assert_int_equal(vqp_mlx5_rxwq_init(&rq, &qp->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "8 WQEs of 8 bytes");
    qp->dv.rq.stride  = 64;
    qp->dv.rq.wqe_cnt = 6;
    assert_int_equal(vqp_mlx5_rxwq_init(&rq, &qp->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "6 WQEs of 64 bytes");
    qp->dv.rq.wqe_cnt = 8;
    assert_int_equal(vqp_mlx5_rxwq_init(&rq, &qp->dv), UCS_OK);
    assert_int_equal(rq.max_sge, 4);
    assert_int_equal(vqp_mlx5_rxwq_avail(&rq), 8);
    fake_qp_free(qp);
}

static void test_rq_post(void **state)
{
    fake_qp_t *qp          = fake_qp_new(64, 8, 64);
    vqp_mlx5_sge_t sges[5] = {{0x1000, 100, 1},
                              {0x2000, 0, 2},
                              {0x3000, 300, 3},
                              {0x4000, 400, 4},
                              {0x5000, 500, 5}};
    struct mlx5_wqe_data_seg *wqe;
    vqp_mlx5_rxwq_t rq = {0};
    unsigned i;
    int idx;

    assert_int_equal(vqp_mlx5_rxwq_init(&rq, &qp->dv), UCS_OK);

    /* Short list: the zero-length entry is dropped, an end marker follows. */
    idx = vqp_mlx5_rxwq_post(&rq, sges, 3);
    assert_int_equal(idx, 0);
    wqe = qp->dv.rq.buf;
    check_dseg(&wqe[0], 0x1000, 100, 1);
    check_dseg(&wqe[1], 0x3000, 300, 3);
    check_end(&wqe[2]);

    /* Full list: no end marker, the next WQE is untouched. */
    idx = vqp_mlx5_rxwq_post(&rq, &sges[1], 4);
    assert_int_equal(idx, 1);
    wqe = (struct mlx5_wqe_data_seg *)((char *)qp->dv.rq.buf + 64);
    check_dseg(&wqe[0], 0x3000, 300, 3);
    check_dseg(&wqe[2], 0x5000, 500, 5);
    check_end(&wqe[3]);
    idx = vqp_mlx5_rxwq_post(&rq, &sges[2], 3);
    wqe = (struct mlx5_wqe_data_seg *)((char *)qp->dv.rq.buf + 2 * 64);
    check_dseg(&wqe[2], 0x5000, 500, 5);
    check_end(&wqe[3]);
    idx = vqp_mlx5_rxwq_post(&rq, sges, 4);
    wqe = (struct mlx5_wqe_data_seg *)((char *)qp->dv.rq.buf + 3 * 64);
    check_dseg(&wqe[2], 0x4000, 400, 4);
    check_end(&wqe[3]);
    assert_int_equal(idx, 3);
    assert_int_equal(((uint8_t *)qp->dv.rq.buf)[4 * 64], 0xa5);

    /* Too many SGEs: refused, nothing posted. */
    assert_int_equal(vqp_mlx5_rxwq_post(&rq, sges, 5), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "5 SGEs, at most 4");

    /* Not visible before the ring. */
    assert_int_equal(qp->dbrec[MLX5_RCV_DBR], 0);
    vqp_mlx5_rxwq_ring(&rq);
    assert_int_equal(be32toh(qp->dbrec[MLX5_RCV_DBR]), 4);
    assert_int_equal(qp->dbrec[MLX5_SND_DBR], 0);

    /* Fill, refuse, consume, wrap around the ring several times. */
    for (i = 4; i < 8; ++i) {
        assert_int_equal(vqp_mlx5_rxwq_post(&rq, sges, 1), i);
    }
    assert_int_equal(vqp_mlx5_rxwq_post(&rq, sges, 1), UCS_ERR_NO_RESOURCE);
    expect_no_log();
    for (i = 8; i < 8 * 5; ++i) {
        vqp_mlx5_rxwq_complete(&rq, (uint16_t)(i - 8));
        assert_int_equal(vqp_mlx5_rxwq_avail(&rq), 1);
        assert_int_equal(vqp_mlx5_rxwq_post(&rq, &sges[i % 5], 1), i);
        assert_int_equal(vqp_mlx5_rxwq_avail(&rq), 0);
    }
    vqp_mlx5_rxwq_ring(&rq);
    assert_int_equal(be32toh(qp->dbrec[MLX5_RCV_DBR]), 40);
    /* WQE 39 sits in slot 7 and carries sges[4]. */
    wqe = (struct mlx5_wqe_data_seg *)((char *)qp->dv.rq.buf + 7 * 64);
    check_dseg(&wqe[0], 0x5000, 500, 5);
    check_end(&wqe[1]);
    fake_qp_free(qp);
}

typedef struct fake_srq {
    struct mlx5dv_srq dv;
    __be32 dbrec;
} fake_srq_t;

static fake_srq_t *fake_srq_new(uint32_t cnt, uint32_t stride)
{
    fake_srq_t *srq = calloc(1, sizeof(*srq));

    srq->dv.buf    = aligned_alloc(64, (size_t)cnt * stride);
    srq->dv.dbrec  = &srq->dbrec;
    srq->dv.stride = stride;
    srq->dv.head   = 0;
    srq->dv.tail   = cnt - 1;
    memset(srq->dv.buf, 0xa5, (size_t)cnt * stride);
    return srq;
}

static void fake_srq_free(fake_srq_t *srq)
{
    free(srq->dv.buf);
    free(srq);
}

static struct mlx5_wqe_srq_next_seg *srq_wqe(fake_srq_t *f, uint16_t i)
{
    return (void *)((char *)f->dv.buf + (size_t)i * f->dv.stride);
}

static void test_srq_init_rejects(void **state)
{
    fake_srq_t *f      = fake_srq_new(8, 64);
    vqp_mlx5_srq_t srq = {0};
    unsigned i;

    f->dv.head = 1;
    assert_int_equal(vqp_mlx5_srq_init(&srq, &f->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "head 1 tail 7: not a new SRQ");
    f->dv.head = 0;
    f->dv.tail = 5; /* 6 WQEs */
    assert_int_equal(vqp_mlx5_srq_init(&srq, &f->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "6 WQEs of 64 bytes");
    f->dv.tail   = 7;
    f->dv.stride = 16; /* no room for a data segment */
    assert_int_equal(vqp_mlx5_srq_init(&srq, &f->dv), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "8 WQEs of 16 bytes");
    f->dv.stride = 64;
    assert_int_equal(vqp_mlx5_srq_init(&srq, &f->dv), UCS_OK);
    assert_int_equal(srq.max_sge, 3);

    /* The free list runs through the ring in order, as providers link it. */
    for (i = 0; i < 8; ++i) {
        assert_int_equal(be16toh(srq_wqe(f, i)->next_wqe_index), (i + 1) % 8);
    }
    fake_srq_free(f);
}

static void test_srq_post_free(void **state)
{
    fake_srq_t *f          = fake_srq_new(8, 64);
    vqp_mlx5_sge_t sges[4] = {
        {0x1000, 10, 1}, {0x2000, 20, 2}, {0x3000, 30, 3}, {0x4000, 40, 4}};
    struct mlx5_wqe_data_seg *d;
    vqp_mlx5_srq_t srq = {0};
    uint8_t posted[8];
    uint16_t victim;
    unsigned i;
    int idx;

    assert_int_equal(vqp_mlx5_srq_init(&srq, &f->dv), UCS_OK);

    /* One WQE stays on the list: 7 of 8 can be posted. */
    for (i = 0; i < 7; ++i) {
        idx = vqp_mlx5_srq_post(&srq, &sges[i % 4], 1);
        assert_int_equal(idx, i);
        d = (struct mlx5_wqe_data_seg *)(srq_wqe(f, i) + 1);
        check_dseg(&d[0], sges[i % 4].addr, sges[i % 4].length,
                   sges[i % 4].lkey);
        check_end(&d[1]);
    }
    assert_int_equal(vqp_mlx5_srq_post(&srq, sges, 1), UCS_ERR_NO_RESOURCE);
    expect_no_log();
    assert_int_equal(vqp_mlx5_srq_post(&srq, sges, 4), UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "4 SGEs, at most 3");

    /* Not visible before the ring; then the counter is the record. */
    assert_int_equal(f->dbrec, 0);
    vqp_mlx5_srq_ring(&srq);
    assert_int_equal(be32toh(f->dbrec), 7);

    /* Completions free out of order; each freed WQE links after the tail. */
    vqp_mlx5_srq_free(&srq, 4);
    assert_int_equal(be16toh(srq_wqe(f, 7)->next_wqe_index), 4);
    vqp_mlx5_srq_free(&srq, 1);
    assert_int_equal(be16toh(srq_wqe(f, 4)->next_wqe_index), 1);
    vqp_mlx5_srq_free(&srq, 6);
    assert_int_equal(be16toh(srq_wqe(f, 1)->next_wqe_index), 6);

    /* Posting walks the list: the old spare 7, then 4 and 1; 6 stays. */
    assert_int_equal(vqp_mlx5_srq_post(&srq, sges, 3), 7);
    d = (struct mlx5_wqe_data_seg *)(srq_wqe(f, 7) + 1);
    check_dseg(&d[2], 0x3000, 30, 3); /* full list: no end marker */
    assert_int_equal(vqp_mlx5_srq_post(&srq, &sges[1], 1), 4);
    assert_int_equal(vqp_mlx5_srq_post(&srq, &sges[2], 1), 1);
    assert_int_equal(vqp_mlx5_srq_post(&srq, sges, 1), UCS_ERR_NO_RESOURCE);
    expect_no_log();
    vqp_mlx5_srq_ring(&srq);
    assert_int_equal(be32toh(f->dbrec), 10);

    /* Recycle many times: a freed WQE waits at the tail while the spare
     * is handed out, so no WQE in use is ever posted twice. */
    memset(posted, 1, sizeof(posted));
    posted[6] = 0;
    for (i = 0; i < 1000; ++i) {
        victim = (uint16_t)((i * 5 + 3) % 8);
        if (!posted[victim]) {
            continue;
        }
        posted[victim] = 0;
        vqp_mlx5_srq_free(&srq, victim);
        idx = vqp_mlx5_srq_post(&srq, sges, 1);
        assert_true((idx >= 0) && (idx < 8));
        assert_int_not_equal(idx, victim);
        assert_false(posted[idx]);
        posted[idx] = 1;
        assert_int_equal(srq.head, victim);
        assert_int_equal(srq.tail, victim);
    }
    for (i = 0, idx = 0; i < 8; ++i) {
        idx += posted[i];
    }
    assert_int_equal(idx, 7);
    fake_srq_free(f);
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
        cmocka_unit_test(test_rq_init_rejects),
        cmocka_unit_test(test_rq_post),
        cmocka_unit_test(test_srq_init_rejects),
        cmocka_unit_test(test_srq_post_free),
    };

    return cmocka_run_group_tests(tests, log_setup, log_teardown);
}
