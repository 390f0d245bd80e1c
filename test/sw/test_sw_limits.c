/*
 * Software device: every resource limit and invalid argument of the
 * object API ends in a clear status and a log line, and leaves the device
 * usable (nothing half-created).
 */
#include <config.h>

#include "sw_test_util.h"

#include "sw/sw_int.h" /* VQP_SW_BB, VQP_SW_ARENA_SIZE */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <pthread.h>
#include <unistd.h>
#include <ucs/time/time.h>

static vqp_sw_dev_t *dev;

static int setup(void **state)
{
    sw_test_log_buf[0] = '\0';
    return vqp_sw_dev_open("vqp_sw0", &dev) == UCS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    vqp_sw_dev_close(dev);
    return 0;
}

static void test_null_and_bad_args(void **state)
{
    vqp_sw_qp_init_attr_t attr;
    sw_test_cq_t cq, other_cq;
    vqp_sw_dev_t *other;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
    sw_test_qp_t q;
    char buf[16];

    assert_int_equal(vqp_sw_mr_dereg(NULL), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("mr_dereg(NULL)"));
    assert_int_equal(vqp_sw_cq_destroy(NULL), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("cq_destroy(NULL)"));
    assert_int_equal(vqp_sw_srq_destroy(NULL), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("srq_destroy(NULL)"));
    assert_int_equal(vqp_sw_qp_destroy(NULL), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("qp_destroy(NULL)"));
    assert_int_equal(vqp_sw_dev_open(NULL, &other), UCS_ERR_NO_DEVICE);
    assert_true(sw_test_log_has("unknown device name '(null)'"));

    assert_int_equal(vqp_sw_mr_reg(dev, NULL, 64, 0, &mr, &lkey, &rkey),
                     UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("NULL address"));
    assert_int_equal(
        vqp_sw_mr_reg(dev, (void *)(UINTPTR_MAX - 8), 64, 0, &mr, &lkey, &rkey),
        UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("wraps"));
    assert_int_equal(sw_test_cq_create(dev, 1u << 21, &cq),
                     UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("cq_create with 2097152 entries"));

    /* A QP needs CQs of its own device. */
    assert_int_equal(sw_test_cq_create(dev, 8, &cq), UCS_OK);
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &other), UCS_OK);
    assert_int_equal(sw_test_cq_create(other, 8, &other_cq), UCS_OK);
    memset(&attr, 0, sizeof(attr));
    attr.send_cq     = cq.cq;
    attr.max_send_wr = 8;
    assert_int_equal(vqp_sw_qp_create(dev, &attr, &q.qp, &q.dv, &q.qpn),
                     UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("needs a send and a recv CQ"));
    attr.recv_cq = other_cq.cq;
    assert_int_equal(vqp_sw_qp_create(dev, &attr, &q.qp, &q.dv, &q.qpn),
                     UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("needs a send and a recv CQ"));
    /* A receive queue without scatter entries is refused. */
    attr.recv_cq     = cq.cq;
    attr.max_recv_wr = 4;
    assert_int_equal(vqp_sw_qp_create(dev, &attr, &q.qp, &q.dv, &q.qpn),
                     UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("qp_create limits exceeded"));
    vqp_sw_dev_close(other);
    assert_int_equal(vqp_sw_cq_destroy(cq.cq), UCS_OK);
    (void)buf;
}

static void test_too_many_mrs(void **state)
{
    vqp_sw_dev_attr_t attr;
    vqp_sw_mr_t **mrs, *mr;
    uint32_t lkey, rkey, i;
    static char buf[64];

    vqp_sw_dev_query(dev, &attr);
    mrs = calloc(attr.max_mr, sizeof(*mrs));
    for (i = 0; i < attr.max_mr; ++i) {
        assert_int_equal(
            vqp_sw_mr_reg(dev, buf, sizeof(buf), 0, &mrs[i], &lkey, &rkey),
            UCS_OK);
    }
    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf), 0, &mr, &lkey, &rkey),
                     UCS_ERR_EXCEEDS_LIMIT);
    assert_true(sw_test_log_has("too many memory regions"));
    /* A freed slot is reusable, under a new key; the lowest free one is
     * taken first. */
    assert_int_equal(vqp_sw_mr_dereg(mrs[9]), UCS_OK);
    assert_int_equal(vqp_sw_mr_dereg(mrs[5]), UCS_OK);
    assert_int_equal(
        vqp_sw_mr_reg(dev, buf, sizeof(buf), 0, &mrs[5], &lkey, &rkey), UCS_OK);
    assert_int_equal(lkey & (attr.max_mr - 1), 5);
    assert_int_equal(
        vqp_sw_mr_reg(dev, buf, sizeof(buf), 0, &mrs[9], &lkey, &rkey), UCS_OK);
    assert_int_equal(lkey & (attr.max_mr - 1), 9);
    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf), 0, &mr, &lkey, &rkey),
                     UCS_ERR_EXCEEDS_LIMIT);
    /* The last slot, freed, is found again. */
    assert_int_equal(vqp_sw_mr_dereg(mrs[attr.max_mr - 1]), UCS_OK);
    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf), 0,
                                   &mrs[attr.max_mr - 1], &lkey, &rkey),
                     UCS_OK);
    assert_int_equal(lkey & (attr.max_mr - 1), attr.max_mr - 1);
    free(mrs); /* the rest go with the device */
}

typedef struct {
    vqp_sw_mr_t *mr;
    int done;
} dereg_arg_t;

static void *dereg_thread(void *arg)
{
    dereg_arg_t *d = arg;

    if (vqp_sw_mr_dereg(d->mr) == UCS_OK) {
        __atomic_store_n(&d->done, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* A peer's access that passed the key check (one-sided data moving
 * without the owner's lock, or a SEND placed under it) holds off the
 * region's dereg, as an HCA does not touch a region after ibv_dereg_mr
 * returned; meanwhile the key is refused and the slot not reused. */
static void test_dereg_waits_for_access(void **state)
{
    static char buf[4096] __attribute__((aligned(64)));
    const unsigned mask = VQP_SW_MAX_MR - 1;
    uint32_t lkey, key, key2, other;
    dereg_arg_t d = {0};
    vqp_sw_mr_t *mr2;
    pthread_t thread;

    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf), SW_TEST_ACCESS_ALL,
                                   &d.mr, &lkey, &key),
                     UCS_OK);
    assert_null(vqp_sw_mr_access_begin(dev->shm, key, (uintptr_t)buf + 64, 8,
                                       IBV_ACCESS_REMOTE_WRITE));
    /* A refused access is not counted. */
    assert_non_null(vqp_sw_mr_access_begin(dev->shm, key, (uintptr_t)buf, 8192,
                                           IBV_ACCESS_REMOTE_WRITE));
    assert_int_equal(dev->shm->mr[key & mask].users, 1);

    assert_int_equal(pthread_create(&thread, NULL, dereg_thread, &d), 0);
    usleep(100000);
    assert_int_equal(__atomic_load_n(&d.done, __ATOMIC_ACQUIRE), 0);
    /* The key went before the wait: no new access passes. */
    assert_string_equal(vqp_sw_mr_access_begin(dev->shm, key, (uintptr_t)buf, 8,
                                               IBV_ACCESS_REMOTE_WRITE),
                        "key not registered");
    /* The slot is not free yet: another registration takes another. */
    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf), SW_TEST_ACCESS_ALL,
                                   &mr2, &lkey, &other),
                     UCS_OK);
    assert_int_not_equal(other & mask, key & mask);
    vqp_sw_mr_access_end(dev->shm, key);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(d.done, 1);
    assert_int_equal(dev->shm->mr[key & mask].users, 0);
    /* Free now: the lowest free slot again, under a new key. */
    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf), SW_TEST_ACCESS_ALL,
                                   &d.mr, &lkey, &key2),
                     UCS_OK);
    assert_int_equal(key2 & mask, key & mask);
    assert_int_not_equal(key2, key);
    assert_int_equal(vqp_sw_mr_dereg(mr2), UCS_OK);

    /* A peer placing a SEND holds our segment's lock from the lkey check
     * to the end of the copy: the dereg waits for the lock too. */
    d.done = 0;
    vqp_sw_lock(dev->shm);
    assert_int_equal(pthread_create(&thread, NULL, dereg_thread, &d), 0);
    usleep(100000);
    assert_int_equal(__atomic_load_n(&d.done, __ATOMIC_ACQUIRE), 0);
    vqp_sw_unlock(dev->shm);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(d.done, 1);
}

/* An access never ended (its process died in the transfer) holds a dereg
 * for a bounded time only, with a warning; the slot is usable after. */
static void test_dereg_dead_accessor(void **state)
{
    static char buf[64];
    ucs_time_t start;
    uint32_t lkey, key, key2;
    vqp_sw_mr_t *mr;
    double waited;

    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf), SW_TEST_ACCESS_ALL,
                                   &mr, &lkey, &key),
                     UCS_OK);
    assert_null(vqp_sw_mr_access_begin(dev->shm, key, (uintptr_t)buf, 8,
                                       IBV_ACCESS_REMOTE_READ));
    start = ucs_get_time();
    assert_int_equal(vqp_sw_mr_dereg(mr), UCS_OK);
    waited = ucs_time_to_sec(ucs_get_time() - start);
    assert_true(waited >= 0.9);
    assert_true(sw_test_log_has("1 peer access(es) still counted"));
    assert_int_equal(dev->shm->mr[key & (VQP_SW_MAX_MR - 1)].users, 0);
    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf), SW_TEST_ACCESS_ALL,
                                   &mr, &lkey, &key2),
                     UCS_OK);
    start = ucs_get_time();
    assert_int_equal(vqp_sw_mr_dereg(mr), UCS_OK);
    assert_true(ucs_time_to_sec(ucs_get_time() - start) < 0.5);
}

static void test_too_many_cqs_srqs_qps(void **state)
{
    vqp_sw_dev_attr_t attr;
    sw_test_cq_t *cqs, extra;
    sw_test_srq_t *srqs, srq;
    sw_test_qp_t *qps, q;
    uint32_t i;

    vqp_sw_dev_query(dev, &attr);
    cqs = calloc(attr.max_cq, sizeof(*cqs));
    for (i = 0; i < attr.max_cq; ++i) {
        assert_int_equal(sw_test_cq_create(dev, 1, &cqs[i]), UCS_OK);
    }
    assert_int_equal(sw_test_cq_create(dev, 1, &extra), UCS_ERR_EXCEEDS_LIMIT);
    assert_true(sw_test_log_has("too many CQs"));

    srqs = calloc(attr.max_srq, sizeof(*srqs));
    for (i = 0; i < attr.max_srq; ++i) {
        assert_int_equal(
            vqp_sw_srq_create(dev, 1, 1, &srqs[i].srq, &srqs[i].dv), UCS_OK);
    }
    assert_int_equal(vqp_sw_srq_create(dev, 1, 1, &srq.srq, &srq.dv),
                     UCS_ERR_EXCEEDS_LIMIT);
    assert_true(sw_test_log_has("too many SRQs"));

    qps = calloc(attr.max_qp, sizeof(*qps));
    for (i = 0; i < attr.max_qp; ++i) {
        assert_int_equal(
            sw_test_qp_create(dev, &cqs[0], &cqs[1], NULL, 1, 0, 0, &qps[i]),
            UCS_OK);
    }
    assert_int_equal(
        sw_test_qp_create(dev, &cqs[0], &cqs[1], NULL, 1, 0, 0, &q),
        UCS_ERR_EXCEEDS_LIMIT);
    assert_true(sw_test_log_has("too many QPs"));
    /* QPNs are unique; a destroyed slot comes back with a new QPN. */
    assert_int_not_equal(qps[0].qpn, qps[1].qpn);
    assert_int_equal(vqp_sw_qp_destroy(qps[7].qp), UCS_OK);
    assert_int_equal(
        sw_test_qp_create(dev, &cqs[0], &cqs[1], NULL, 1, 0, 0, &q), UCS_OK);
    assert_int_not_equal(q.qpn, qps[7].qpn);
    assert_int_equal(q.qpn & (attr.max_qp - 1), qps[7].qpn & (attr.max_qp - 1));
    free(qps);
    free(srqs);
    free(cqs); /* the objects go with the device */
}

/* More peer devices than the per-device cache holds. */
static void test_too_many_peers(void **state)
{
    /* One more than the device's peer table (sw_int.h: VQP_SW_MAX_PEERS). */
    enum { N = 1025 };
    static vqp_sw_dev_t *peers[N];
    static sw_test_qp_t qps[N];
    vqp_sw_dev_addr_t addr;
    vqp_sw_qp_attr_t qa;
    sw_test_cq_t cq;
    unsigned i, ok = 0;
    ucs_status_t status;

    assert_int_equal(sw_test_cq_create(dev, 8, &cq), UCS_OK);
    memset(&qa, 0, sizeof(qa));
    for (i = 0; i < N; ++i) {
        assert_int_equal(vqp_sw_dev_open("vqp_sw0", &peers[i]), UCS_OK);
        assert_int_equal(
            sw_test_qp_create(dev, &cq, &cq, NULL, 1, 0, 0, &qps[i]), UCS_OK);
        qa.qp_state = IBV_QPS_INIT;
        assert_int_equal(vqp_sw_qp_modify(qps[i].qp, &qa), UCS_OK);
        vqp_sw_dev_address(peers[i], &addr);
        qa.qp_state    = IBV_QPS_RTR;
        qa.dest_dev    = addr;
        qa.dest_qp_num = 0x400;
        status         = vqp_sw_qp_modify(qps[i].qp, &qa);
        if (status == UCS_OK) {
            ++ok;
        } else {
            assert_int_equal(status, UCS_ERR_UNREACHABLE);
        }
    }
    assert_int_equal(ok, N - 1);
    assert_true(sw_test_log_has("too many peer devices"));
    for (i = 0; i < N; ++i) {
        vqp_sw_qp_destroy(qps[i].qp);
        vqp_sw_dev_close(peers[i]);
    }
}

/* Queue memory comes back: a freed SQ's pages are the first that a later
 * queue of that size gets (first fit from the lowest free page), and QPs of
 * the largest SQ created and destroyed for more than the whole arena in all
 * never run it out. */
static void test_arena_reuse(void **state)
{
    vqp_sw_dev_attr_t attr;
    sw_test_qp_t keep, a, b, q;
    size_t sq_bytes, rounds, i;
    sw_test_cq_t cq;
    void *hole;

    vqp_sw_dev_query(dev, &attr);
    sq_bytes = (size_t)attr.max_qp_wr * VQP_SW_BB;
    assert_int_equal(sw_test_cq_create(dev, 8, &cq), UCS_OK);
    assert_int_equal(sw_test_qp_create(dev, &cq, &cq, NULL, 8, 0, 0, &keep),
                     UCS_OK);
    assert_int_equal(
        sw_test_qp_create(dev, &cq, &cq, NULL, attr.max_qp_wr, 0, 0, &a),
        UCS_OK);
    assert_int_equal(sw_test_qp_create(dev, &cq, &cq, NULL, 8, 0, 0, &b),
                     UCS_OK);
    hole = a.dv.sq.buf;
    assert_int_equal(vqp_sw_qp_destroy(a.qp), UCS_OK);
    assert_int_equal(
        sw_test_qp_create(dev, &cq, &cq, NULL, attr.max_qp_wr, 0, 0, &q),
        UCS_OK);
    assert_ptr_equal(q.dv.sq.buf, hole);
    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);

    rounds = VQP_SW_ARENA_SIZE / sq_bytes + 16;
    for (i = 0; i < rounds; ++i) {
        assert_int_equal(
            sw_test_qp_create(dev, &cq, &cq, NULL, attr.max_qp_wr, 0, 0, &q),
            UCS_OK);
        assert_ptr_equal(q.dv.sq.buf, hole);
        assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);
    }
    assert_false(sw_test_log_has("queue memory exhausted"));
    assert_int_equal(vqp_sw_qp_destroy(keep.qp), UCS_OK);
    assert_int_equal(vqp_sw_qp_destroy(b.qp), UCS_OK);
    assert_int_equal(vqp_sw_cq_destroy(cq.cq), UCS_OK);
}

int main(void)
{
#define T(_t) cmocka_unit_test_setup_teardown(_t, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_null_and_bad_args),     T(test_too_many_mrs),
        T(test_too_many_cqs_srqs_qps), T(test_too_many_peers),
        T(test_arena_reuse),           T(test_dereg_waits_for_access),
        T(test_dereg_dead_accessor),
    };
    int ret;
#undef T

    if (getenv("VQP_TEST_VALGRIND") != NULL) {
        /* make check-valgrind: 1025 device instances of a few GB of sparse
         * shared memory each need more address space than valgrind
         * manages (the opens fail with no memory); the rest runs. */
        cmocka_set_skip_filter("test_too_many_peers");
    }
    ucs_log_push_handler(sw_test_log_handler);
    ret = cmocka_run_group_tests(tests, NULL, NULL);
    ucs_log_pop_handler();
    return ret;
}
