/*
 * Execution at the SQ doorbell (VQP_SW_EXEC): vqp_sw_qp_doorbell runs the
 * requester of that QP right away, as a NIC starts on WQEs after the
 * doorbell. A process that posts and then never progresses still delivers
 * (across processes, fork); only that QP's rung WQEs run, all of them in one
 * call; errors, flushes and RNR as with progress-driven execution; progress
 * mode leaves everything to vqp_sw_progress; a doorbell rung inside the
 * engine (from a log handler) is deferred to the end of the engine call.
 */
#include <config.h>

#include "sw_test_fx.h"

#include "sw/sw_int.h" /* progress_calls: proof that nobody progressed */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* Rings as mlx5 software does (record, 8-byte doorbell), then tells the
 * device, where a NIC would get the MMIO write. */
static uint16_t ring_db(sw_test_qp_t *q, unsigned ds)
{
    uint16_t idx = sw_test_ring(q, ds);

    vqp_sw_qp_doorbell(q->qp);
    return idx;
}

static uint64_t progress_calls(vqp_sw_dev_t *dev)
{
    return dev->shm->progress_calls;
}

static void write_wqe(fx_t *f, sw_test_qp_t *q, int s, unsigned loff,
                      unsigned roff, uint32_t len, uint8_t flags)
{
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, flags, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[!s] + roff, f->rkey[!s]);
    sw_test_dseg(q, 2, f->buf[s] + loff, len, f->lkey[s]);
}

/* A second connected pair A2 <-> B2 on the fixture's devices. */
typedef struct pair2 {
    sw_test_cq_t cq[2];
    sw_test_qp_t qp[2];
} pair2_t;

static void pair2_init(fx_t *f, pair2_t *p)
{
    int i;

    for (i = 0; i < 2; ++i) {
        assert_int_equal(sw_test_cq_create(f->devs[i], 64, &p->cq[i]), UCS_OK);
        assert_int_equal(sw_test_qp_create(f->devs[i], &p->cq[i], &p->cq[i],
                                           NULL, 64, 16, 128, &p->qp[i]),
                         UCS_OK);
    }
    for (i = 0; i < 2; ++i) {
        assert_int_equal(sw_test_qp_connect(&p->qp[i], &f->addr[!i],
                                            p->qp[!i].qpn, SW_TEST_ACCESS_ALL,
                                            7, 3),
                         UCS_OK);
    }
}

static void pair2_fini(pair2_t *p)
{
    int i;

    for (i = 0; i < 2; ++i) {
        assert_int_equal(vqp_sw_qp_destroy(p->qp[i].qp), UCS_OK);
        assert_int_equal(vqp_sw_cq_destroy(p->cq[i].cq), UCS_OK);
    }
}

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    int ret;

    setenv("VQP_SW_EXEC", "doorbell", 1);
    ret = fx_init(f, 256, 16, 7, 3);
    setenv("VQP_SW_EXEC", "progress", 1); /* the harness's */
    *state = f;
    return ret;
}

static int teardown(void **state)
{
    fx_fini(*state);
    free(*state);
    return 0;
}

/* Opens a device with VQP_SW_EXEC=@a exec (NULL: unset) and checks the
 * mode it reports. */
static void check_exec_mode(const char *exec, uint32_t doorbell, uint32_t idle)
{
    vqp_sw_dev_attr_t attr;
    vqp_sw_dev_t *dev;

    if (exec == NULL) {
        unsetenv("VQP_SW_EXEC");
    } else {
        setenv("VQP_SW_EXEC", exec, 1);
    }
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev), UCS_OK);
    vqp_sw_dev_query(dev, &attr);
    assert_int_equal(attr.exec_doorbell, doorbell);
    assert_int_equal(attr.exec_idle, idle);
    vqp_sw_dev_close(dev);
    setenv("VQP_SW_EXEC", "progress", 1); /* the harness's */
}

/* Each value of @a values in environment variable @a var fails the open
 * with UCS_ERR_INVALID_PARAM and the log line @a fmt names (with the value);
 * the variable is unset afterwards. */
static void check_bad_env(const char *var, const char *const *values,
                          unsigned count, const char *fmt)
{
    vqp_sw_dev_t *dev;
    char line[128];
    unsigned i;

    for (i = 0; i < count; ++i) {
        setenv(var, values[i], 1);
        dev = NULL;
        assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev),
                         UCS_ERR_INVALID_PARAM);
        assert_null(dev);
        snprintf(line, sizeof(line), fmt, values[i]);
        assert_true(sw_test_log_has(line));
    }
    unsetenv(var);
}

/* VQP_SW_EXEC at open: auto (the default, also empty), progress or
 * doorbell; VQP_SW_IDLE_US: 100..1000000. Anything else fails the open
 * with a log line. */
static void test_env(void **state)
{
    static const char *const bad[] = {"sometimes", "Doorbell", "progress ", "1",
                                      "Auto"};
    static const char *const bad_us[] = {"99", "1000001", "1ms", "-5", " "};
    vqp_sw_dev_t *dev;

    check_exec_mode(NULL, 0, 1);
    check_exec_mode("", 0, 1);
    check_exec_mode("auto", 0, 1);
    check_exec_mode("progress", 0, 0);
    check_exec_mode("doorbell", 1, 0);
    check_bad_env("VQP_SW_EXEC", bad, sizeof(bad) / sizeof(bad[0]),
                  "invalid VQP_SW_EXEC '%s' (auto, progress or doorbell)");
    check_bad_env("VQP_SW_IDLE_US", bad_us, sizeof(bad_us) / sizeof(bad_us[0]),
                  "invalid VQP_SW_IDLE_US '%s' (100..1000000 microseconds)");
    /* Only the idle executor reads it. */
    setenv("VQP_SW_IDLE_US", "1ms", 1);
    setenv("VQP_SW_EXEC", "progress", 1);
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev), UCS_OK);
    vqp_sw_dev_close(dev);
    setenv("VQP_SW_EXEC", "progress", 1); /* the harness's */
    setenv("VQP_SW_IDLE_US", "100", 1);
    check_exec_mode(NULL, 0, 1);
    unsetenv("VQP_SW_IDLE_US");
}

/* ------------------------------------------------ across processes (fork) */

#define PBUF 65536

typedef struct peer_info {
    vqp_sw_dev_addr_t addr;
    uint32_t qpn;
    uint32_t rkey;
    uint64_t buf;
} peer_info_t;

typedef struct side {
    vqp_sw_dev_t *dev;
    sw_test_cq_t scq, rcq;
    sw_test_qp_t qp;
    uint8_t *buf;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
    peer_info_t me, peer;
} side_t;

static int xfer(int fd, void *p, size_t n, int out)
{
    size_t done = 0;
    ssize_t r;

    while (done < n) {
        r = out ? write(fd, (char *)p + done, n - done)
                : read(fd, (char *)p + done, n - done);
        if (r <= 0) {
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

static int side_open(side_t *s)
{
    memset(s, 0, sizeof(*s));
    s->buf = aligned_alloc(64, PBUF);
    memset(s->buf, 0, PBUF);
    if ((vqp_sw_dev_open("vqp_sw0", &s->dev) != UCS_OK) ||
        (vqp_sw_mr_reg(s->dev, s->buf, PBUF, SW_TEST_ACCESS_ALL, &s->mr,
                       &s->lkey, &s->rkey) != UCS_OK) ||
        (sw_test_cq_create(s->dev, 64, &s->scq) != UCS_OK) ||
        (sw_test_cq_create(s->dev, 64, &s->rcq) != UCS_OK) ||
        (sw_test_qp_create(s->dev, &s->scq, &s->rcq, NULL, 64, 16, 128,
                           &s->qp) != UCS_OK)) {
        return -1;
    }
    vqp_sw_dev_address(s->dev, &s->me.addr);
    s->me.qpn  = s->qp.qpn;
    s->me.rkey = s->rkey;
    s->me.buf  = (uintptr_t)s->buf;
    return 0;
}

static int side_connect(side_t *s)
{
    return sw_test_qp_connect(&s->qp, &s->peer.addr, s->peer.qpn,
                              SW_TEST_ACCESS_ALL, 7, 3) == UCS_OK
               ? 0
               : -1;
}

static void side_close(side_t *s)
{
    vqp_sw_qp_destroy(s->qp.qp);
    vqp_sw_dev_close(s->dev);
    free(s->buf);
}

#define SMALL_LEN 64    /* payload inside the inbound record */
#define LARGE_LEN 4000  /* placed by the requester (process_vm_writev) */
#define WRITE_LEN 16384 /* RDMA WRITE */
#define WRITE_OFF 32768

static uint8_t pattern(unsigned i, unsigned salt)
{
    return (uint8_t)(i * 13 + salt);
}

/* The receiving child: posts two receives, says ready, and when told to
 * look (the sender sleeps in read() meanwhile) checks the WRITE's bytes
 * and takes both SENDs from its RQ with its own progress. Exit code: the
 * first check that failed. */
static int receiver_main(int rfd, int wfd)
{
    struct mlx5_cqe64 cqe;
    unsigned i, k;
    char cmd;
    side_t s;

    if ((side_open(&s) != 0) || (xfer(wfd, &s.me, sizeof(s.me), 1) != 0) ||
        (xfer(rfd, &s.peer, sizeof(s.peer), 0) != 0) ||
        (side_connect(&s) != 0)) {
        return 10;
    }
    sw_test_post_recv(&s.qp, s.buf, 1024, s.lkey);
    sw_test_post_recv(&s.qp, s.buf + 8192, 8192, s.lkey);
    if ((xfer(wfd, "r", 1, 1) != 0) || (xfer(rfd, &cmd, 1, 0) != 0)) {
        return 11;
    }
    for (i = 0; i < WRITE_LEN; ++i) {
        if (s.buf[WRITE_OFF + i] != pattern(i, 3)) {
            return 12;
        }
    }
    for (k = 0; k < 2; ++k) {
        if ((sw_test_poll(&s.dev, 1, &s.rcq, &cqe, 3000) != 0) ||
            (sw_test_cqe_opcode(&cqe) != MLX5_CQE_RESP_SEND) ||
            (be16toh(cqe.wqe_counter) != k) ||
            (be32toh(cqe.byte_cnt) != (k ? LARGE_LEN : SMALL_LEN))) {
            return 13 + k;
        }
        for (i = 0; i < (k ? LARGE_LEN : SMALL_LEN); ++i) {
            if (s.buf[k * 8192 + i] != pattern(i, 1 + k)) {
                return 15 + k;
            }
        }
    }
    if (xfer(wfd, "k", 1, 1) != 0) {
        return 17;
    }
    (void)xfer(rfd, &cmd, 1, 0); /* EOF: the sender is done */
    side_close(&s);
    return 0;
}

/* The next CQE of @a cq, which a thread other than this one may write:
 * waits up to 2 s for it, calling no progress. */
static struct mlx5_cqe64 *cq_wait_peek(sw_test_cq_t *cq)
{
    struct mlx5_cqe64 *cqe;
    unsigned ms;

    for (ms = 0; ms < 2000; ++ms) {
        cqe = sw_test_cq_peek(cq);
        if (cqe != NULL) {
            return cqe;
        }
        usleep(1000);
    }
    return NULL;
}

/* The sender posts a small SEND, a large SEND and a WRITE, never calls
 * progress, and sleeps in read() while the receiver looks: the data and both
 * messages are there. With @a mode doorbell the sender's CQEs were in its CQ
 * at once; with auto (the default) the idle executor ran them within
 * milliseconds. */
static void across_processes(const char *mode)
{
    int to_child[2], from_child[2], status;
    int idle = !strcmp(mode, "auto");
    struct mlx5_cqe64 *cqe;
    pid_t child;
    unsigned i;
    side_t s;
    char c;

    setenv("VQP_SW_EXEC", mode, 1); /* the child's too */
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_child[1]);
        close(from_child[0]);
        status = receiver_main(to_child[0], from_child[1]);
        if (status != 0) {
            fprintf(stderr, "receiver failed at step %d\n", status);
        }
        _exit(status);
    }
    close(to_child[0]);
    close(from_child[1]);
    assert_int_equal(side_open(&s), 0);
    setenv("VQP_SW_EXEC", "progress", 1); /* the harness's */
    assert_int_equal(xfer(from_child[0], &s.peer, sizeof(s.peer), 0), 0);
    assert_int_equal(xfer(to_child[1], &s.me, sizeof(s.me), 1), 0);
    assert_int_equal(side_connect(&s), 0);
    assert_int_equal(xfer(from_child[0], &c, 1, 0), 0);

    for (i = 0; i < LARGE_LEN; ++i) {
        s.buf[i]        = pattern(i, 1);
        s.buf[8192 + i] = pattern(i, 2);
    }
    for (i = 0; i < WRITE_LEN; ++i) {
        s.buf[WRITE_OFF + i] = pattern(i, 3);
    }
    /* Small inline SEND, large SEND from a data segment, WRITE. */
    sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 1 + (4 + SMALL_LEN + 15) / 16,
                 MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_inline(&s.qp, 1, s.buf, SMALL_LEN);
    ring_db(&s.qp, 1 + (4 + SMALL_LEN + 15) / 16);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_dseg(&s.qp, 1, s.buf + 8192, LARGE_LEN, s.lkey);
    ring_db(&s.qp, 2);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf + WRITE_OFF, s.peer.rkey);
    sw_test_dseg(&s.qp, 2, s.buf + WRITE_OFF, WRITE_LEN, s.lkey);
    ring_db(&s.qp, 3);

    /* Our CQEs, without a progress call. */
    for (i = 0; i < 3; ++i) {
        cqe = idle ? cq_wait_peek(&s.scq) : sw_test_cq_peek(&s.scq);
        assert_non_null(cqe);
        assert_int_equal(sw_test_cqe_opcode(cqe), MLX5_CQE_REQ);
        sw_test_cq_pop(&s.scq);
    }
    assert_null(sw_test_cq_peek(&s.scq));

    /* Asleep in read() while the receiver checks. */
    assert_int_equal(xfer(to_child[1], "c", 1, 1), 0);
    assert_int_equal(xfer(from_child[0], &c, 1, 0), 0);
    assert_int_equal(c, 'k');
    if (idle) { /* nobody but the executor progressed */
        assert_true(vqp_sw_dev_idle_runs(s.dev) >= 1);
        assert_int_equal(progress_calls(s.dev), s.dev->idle_calls);
    } else {
        assert_int_equal(progress_calls(s.dev), 0);
    }
    close(to_child[1]);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(from_child[0]);
    side_close(&s);
}

static void test_across_processes(void **state)
{
    across_processes("doorbell");
}

/* A process that posts and then only sleeps (the default mode): what a
 * UCP sender does before waiting on its peer's event fd. */
static void test_across_processes_idle(void **state)
{
    across_processes("auto");
}

/* ---------------------------------------------------- threads (one lock) */

#define THREAD_WRITES 4096
#define THREAD_BATCH  16
#define THREAD_CYCLES 200

typedef struct threads_arg {
    fx_t *f;
    int failed; /* the step that failed, 0: none */
} threads_arg_t;

/* WRITEs on the fixture's pair in batches, progressed to their CQEs by
 * this thread while the other one progresses both devices too: each WQE
 * runs once (one CQE each, in order), with its data. */
static void *thread_data(void *p)
{
    threads_arg_t *a = p;
    fx_t *f          = a->f;
    struct mlx5_cqe64 *cqe;
    uint16_t wqe[THREAD_BATCH];
    unsigned i, j, spins;

    for (i = 0; (i < THREAD_WRITES / THREAD_BATCH) && (a->failed == 0); ++i) {
        for (j = 0; j < THREAD_BATCH; ++j) {
            memset(f->buf[0] + j * 256, (int)(i + j + 1), 256);
            write_wqe(f, &f->qp[0], 0, j * 256, j * 256, 256,
                      MLX5_WQE_CTRL_CQ_UPDATE);
            wqe[j] = sw_test_ring(&f->qp[0], 3);
        }
        for (j = 0; (j < THREAD_BATCH) && (a->failed == 0); ++j) {
            for (spins = 0; ((cqe = sw_test_cq_peek(&f->scq[0])) == NULL) &&
                            (spins < 10000000);
                 ++spins) {
                vqp_sw_progress(f->devs[0]);
                vqp_sw_progress(f->devs[1]);
            }
            if ((cqe == NULL) || (sw_test_cqe_opcode(cqe) != MLX5_CQE_REQ)) {
                a->failed = 1;
            } else if (be16toh(cqe->wqe_counter) != wqe[j]) {
                a->failed = 2;
            } else if (f->buf[1][j * 256 + 255] != (uint8_t)(i + j + 1)) {
                a->failed = 3;
            }
            sw_test_cq_pop(&f->scq[0]);
        }
        for (spins = 0; spins < 100; ++spins) {
            vqp_sw_progress(f->devs[0]);
        }
        if (sw_test_cq_peek(&f->scq[0]) != NULL) {
            a->failed = 4; /* a WQE that ran twice */
        }
    }
    return NULL;
}

/* Control calls on the same devices meanwhile: QPs, CQs and MRs come and
 * go (the device's QP list changes under the other thread's progress). */
static void *thread_control(void *p)
{
    threads_arg_t *a = p;
    fx_t *f          = a->f;
    uint32_t lkey, rkey;
    sw_test_cq_t cq;
    sw_test_qp_t qp;
    vqp_sw_mr_t *mr;
    unsigned i, j;
    char *buf;

    buf = malloc(4096);
    for (i = 0; (i < THREAD_CYCLES) && (a->failed == 0); ++i) {
        if ((vqp_sw_mr_reg(f->devs[i & 1], buf, 4096, SW_TEST_ACCESS_ALL, &mr,
                           &lkey, &rkey) != UCS_OK) ||
            (sw_test_cq_create(f->devs[i & 1], 64, &cq) != UCS_OK) ||
            (sw_test_qp_create(f->devs[i & 1], &cq, &cq, NULL, 64, 16, 128,
                               &qp) != UCS_OK)) {
            a->failed = 10;
            break;
        }
        for (j = 0; j < 200; ++j) {
            vqp_sw_progress(f->devs[0]);
            vqp_sw_progress(f->devs[1]);
        }
        if ((vqp_sw_qp_destroy(qp.qp) != UCS_OK) ||
            (vqp_sw_cq_destroy(cq.cq) != UCS_OK) ||
            (vqp_sw_mr_dereg(mr) != UCS_OK)) {
            a->failed = 11;
        }
    }
    free(buf);
    return NULL;
}

/* Threads sharing the devices (UCX workers of one context on one memory
 * domain) take turns in the engine and in control calls: every WRITE
 * completes once with its data, every control call succeeds. */
static void test_threads_share_devices(void **state)
{
    threads_arg_t data, ctl;
    pthread_t th[2];
    fx_t f;

    setenv("VQP_SW_EXEC", "progress", 1);
    assert_int_equal(fx_init(&f, 256, 16, 7, 3), 0);
    setenv("VQP_SW_EXEC", "progress", 1); /* the harness's */
    data.f      = &f;
    data.failed = 0;
    ctl.f       = &f;
    ctl.failed  = 0;
    assert_int_equal(pthread_create(&th[0], NULL, thread_data, &data), 0);
    assert_int_equal(pthread_create(&th[1], NULL, thread_control, &ctl), 0);
    assert_int_equal(pthread_join(th[0], NULL), 0);
    assert_int_equal(pthread_join(th[1], NULL), 0);
    assert_int_equal(data.failed, 0);
    assert_int_equal(ctl.failed, 0);
    assert_null(sw_test_cq_peek(&f.scq[0])); /* each CQE once */
    fx_fini(&f);
}

/* The device lock: threads that contend sleep and wake (its futex path),
 * each increment of a plain counter under it survives, it nests in one
 * thread, and a trylock from another thread fails while it is held. */
#define LOCK_THREADS 4
#define LOCK_ROUNDS  200000

static unsigned long lock_counter;

static void *thread_lock(void *p)
{
    unsigned i;

    for (i = 0; i < LOCK_ROUNDS; ++i) {
        vqp_sw_dev_lock();
        ++lock_counter;
        if ((i & 1023) == 0) {
            sched_yield(); /* held across a yield: the others sleep */
        }
        vqp_sw_dev_unlock();
    }
    return NULL;
}

static void *thread_trylock(void *p)
{
    *(int *)p = vqp_sw_dev_trylock();
    if (*(int *)p) {
        vqp_sw_dev_unlock();
    }
    return NULL;
}

static void test_device_lock(void **state)
{
    pthread_t th[LOCK_THREADS];
    int got = -1;
    unsigned i;

    lock_counter = 0;
    for (i = 0; i < LOCK_THREADS; ++i) {
        assert_int_equal(pthread_create(&th[i], NULL, thread_lock, NULL), 0);
    }
    for (i = 0; i < LOCK_THREADS; ++i) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
    }
    assert_int_equal(lock_counter, (unsigned long)LOCK_THREADS * LOCK_ROUNDS);

    vqp_sw_dev_lock();
    assert_true(vqp_sw_dev_trylock()); /* nests */
    vqp_sw_dev_unlock();
    assert_int_equal(pthread_create(&th[0], NULL, thread_trylock, &got), 0);
    assert_int_equal(pthread_join(th[0], NULL), 0);
    assert_int_equal(got, 0); /* still held here */
    vqp_sw_dev_unlock();
    assert_int_equal(pthread_create(&th[0], NULL, thread_trylock, &got), 0);
    assert_int_equal(pthread_join(th[0], NULL), 0);
    assert_int_equal(got, 1);
}

/* ------------------------------------------------------ in one process */

/* Progress mode: the doorbell executes nothing, progress does it all. */
static void test_progress_mode(void **state)
{
    struct mlx5_cqe64 cqe;
    fx_t f;

    setenv("VQP_SW_EXEC", "progress", 1);
    assert_int_equal(fx_init(&f, 64, 16, 7, 3), 0);
    unsetenv("VQP_SW_EXEC");
    memset(f.buf[0], 0x5a, 256);
    write_wqe(&f, &f.qp[0], 0, 0, 0, 256, MLX5_WQE_CTRL_CQ_UPDATE);
    ring_db(&f.qp[0], 3);
    usleep(5000); /* five idle executor periods: there is none */
    assert_null(sw_test_cq_peek(&f.scq[0]));
    assert_int_equal(f.buf[1][0], 0);
    assert_int_equal(fx_poll(&f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_memory_equal(f.buf[0], f.buf[1], 256);
    fx_fini(&f);
}

/* The poll skips a QP whose SQ doorbell record holds the value it had when
 * the QP last ran dry. The record carries 16 bits of the producer index, so
 * that value comes back 65536 WQEs later: a QP that never ran dry in between
 * and has WQEs then must still run (it stalled there for good before). */
static void test_doorbell_record_wraps(void **state)
{
    const uint16_t depth = 128; /* WQEs kept rung ahead of the device */
    struct mlx5_cqe64 cqe;
    uint32_t posted = 0;
    unsigned stuck  = 0;
    vqp_sw_qp_t *qp;
    uint16_t ci;
    fx_t f;

    setenv("VQP_SW_EXEC", "progress", 1);
    assert_int_equal(fx_init(&f, 256, 16, 7, 3), 0);
    unsetenv("VQP_SW_EXEC");
    qp = f.qp[0].qp;
    vqp_sw_progress(f.devs[0]); /* dry at record 0 */
    while (posted < 65536 + 4 * depth) {
        ci = qp->sq_ci;
        while ((uint16_t)(posted - ci) < depth) {
            fx_nop(&f, 0, 0);
            ++posted;
        }
        vqp_sw_progress(f.devs[0]); /* runs at most a budget: never dry */
        if (qp->sq_ci == ci) {
            assert_true(++stuck < 100); /* WQEs rung, none executed */
        } else {
            stuck = 0;
        }
    }
    fx_nop(&f, 0, MLX5_WQE_CTRL_CQ_UPDATE);
    assert_int_equal(fx_poll(&f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    fx_fini(&f);
}

/* The doorbell runs that QP's WQEs and nothing else: not another QP's rung
 * ones, not the inbound records of the device. */
static void test_only_that_qp(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 *cqe;
    pair2_t p;

    pair2_init(f, &p);
    sw_test_post_recv(&f->qp[0], f->buf[0] + 4096, 1024, f->lkey[0]);
    memset(f->buf[0], 0x11, 64);
    memset(f->buf[1] + 1024, 0x22, 64);

    /* A2 rings without telling the device; B sends to A with a doorbell
     * (executed by B: a record waits in A's inbound ring). */
    write_wqe(f, &p.qp[0], 0, 0, 2048, 64, MLX5_WQE_CTRL_CQ_UPDATE);
    sw_test_ring(&p.qp[0], 3);
    sw_test_ctrl(&f->qp[1], MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_dseg(&f->qp[1], 1, f->buf[1] + 1024, 64, f->lkey[1]);
    ring_db(&f->qp[1], 2);
    assert_non_null(sw_test_cq_peek(&f->scq[1]));

    /* A's doorbell on its first QP. */
    write_wqe(f, &f->qp[0], 0, 0, 0, 64, MLX5_WQE_CTRL_CQ_UPDATE);
    ring_db(&f->qp[0], 3);
    cqe = sw_test_cq_peek(&f->scq[0]);
    assert_non_null(cqe);
    assert_int_equal(sw_test_cqe_opcode(cqe), MLX5_CQE_REQ);
    assert_memory_equal(f->buf[1], f->buf[0], 64);
    assert_null(sw_test_cq_peek(&p.cq[0])); /* A2: not run */
    assert_int_equal(f->buf[1][2048], 0);
    assert_null(sw_test_cq_peek(&f->rcq[0])); /* record: not delivered */
    assert_int_equal(f->buf[0][4096], 0);
    assert_int_equal(progress_calls(f->devs[0]), 0);

    /* Progress does the rest. */
    vqp_sw_progress(f->devs[0]);
    assert_non_null(sw_test_cq_peek(&p.cq[0]));
    assert_int_equal(f->buf[1][2048], 0x11);
    cqe = sw_test_cq_peek(&f->rcq[0]);
    assert_non_null(cqe);
    assert_int_equal(sw_test_cqe_opcode(cqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(f->buf[0][4096], 0x22);
    pair2_fini(&p);
}

/* One doorbell for a batch of 200 WQEs: all run in that call (more than the
 * poll's per-QP budget). */
static void test_batch(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 *cqe;
    unsigned i, n = 200;
    uint16_t first = f->qp[0].sq_pi;

    for (i = 0; i < n; ++i) {
        f->buf[0][i] = (uint8_t)(i + 1);
        write_wqe(f, &f->qp[0], 0, i, i, 1,
                  (i == n - 1) ? MLX5_WQE_CTRL_CQ_UPDATE : 0);
        ++f->qp[0].sq_pi; /* one BB each; the record comes once */
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    f->qp[0].dv.dbrec[MLX5_SND_DBR] = htobe32(f->qp[0].sq_pi);
    vqp_sw_qp_doorbell(f->qp[0].qp);
    cqe = sw_test_cq_peek(&f->scq[0]);
    assert_non_null(cqe);
    assert_int_equal(be16toh(cqe->wqe_counter), (uint16_t)(first + n - 1));
    assert_memory_equal(f->buf[1], f->buf[0], n);
    assert_int_equal(progress_calls(f->devs[0]), 0);
}

/* Errors at the doorbell are what progress reports: RNR leaves the SEND
 * waiting (no CQE) until a receive is posted and progress runs; a bad WQE
 * gets its error CQE and log line at once, the QP is in ERR, a later WQE is
 * flushed at its doorbell; a doorbell in RESET is ignored with its log
 * line. */
static void test_errors(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe, *c;
    sw_test_qp_t rq;

    /* RNR: B -> A, A has no receive yet. */
    sw_test_ctrl(&f->qp[1], MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_dseg(&f->qp[1], 1, f->buf[1], 32, f->lkey[1]);
    ring_db(&f->qp[1], 2);
    assert_null(sw_test_cq_peek(&f->scq[1]));
    sw_test_post_recv(&f->qp[0], f->buf[0] + 1024, 1024, f->lkey[0]);
    assert_int_equal(fx_poll(f, 1, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(fx_poll(f, 0, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);

    sw_test_ctrl(&f->qp[0], 0x1f, 1, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    ring_db(&f->qp[0], 1);
    assert_true(sw_test_log_has("unsupported opcode 0x1f"));
    c = sw_test_cq_peek(&f->scq[0]);
    assert_non_null(c);
    assert_int_equal(sw_test_cqe_opcode(c), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(c), MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    sw_test_cq_pop(&f->scq[0]);
    assert_int_equal(vqp_sw_qp_state(f->qp[0].qp), IBV_QPS_ERR);
    write_wqe(f, &f->qp[0], 0, 0, 0, 8, 0); /* unsignaled: flushed anyway */
    ring_db(&f->qp[0], 3);
    c = sw_test_cq_peek(&f->scq[0]);
    assert_non_null(c);
    assert_int_equal(sw_test_cqe_synd(c), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(be16toh(c->wqe_counter), 1);
    sw_test_cq_pop(&f->scq[0]);

    /* RESET */
    assert_int_equal(sw_test_qp_create(f->devs[0], &f->scq[0], &f->scq[0], NULL,
                                       64, 0, 0, &rq),
                     UCS_OK);
    sw_test_ctrl(&rq, MLX5_OPCODE_NOP, 1, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    ring_db(&rq, 1);
    assert_true(sw_test_log_has("rung in state RESET"));
    assert_null(sw_test_cq_peek(&f->scq[0]));
    assert_int_equal(vqp_sw_qp_destroy(rq.qp), UCS_OK);
}

/* Re-entrancy: a log handler (running inside the engine, on the error it
 * reports) posts on another QP of this device and on a QP of the other
 * device and rings both doorbells, and calls progress. Progress does
 * nothing there; the doorbells run when the outer doorbell's engine call
 * ends, before it returns. */
static fx_t *reenter_fx;
static pair2_t *reenter_p;
static int reenter_calls;
static unsigned reenter_progress = 99;

static ucs_log_func_rc_t
reenter_handler(const char *file, unsigned line, const char *function,
                ucs_log_level_t level,
                const ucs_log_component_config_t *comp_conf,
                const char *message, va_list ap)
{
    fx_t *f = reenter_fx;

    if ((f != NULL) && (level == UCS_LOG_LEVEL_ERROR) &&
        (reenter_calls++ == 0)) {
        write_wqe(f, &reenter_p->qp[0], 0, 0, 512, 32, MLX5_WQE_CTRL_CQ_UPDATE);
        ring_db(&reenter_p->qp[0], 3);
        write_wqe(f, &reenter_p->qp[1], 1, 0, 768, 32, MLX5_WQE_CTRL_CQ_UPDATE);
        ring_db(&reenter_p->qp[1], 3);
        reenter_progress = vqp_sw_progress(f->devs[0]);
        /* Nothing ran yet: the outer engine call is still going. */
        if ((sw_test_cq_peek(&reenter_p->cq[0]) != NULL) ||
            (sw_test_cq_peek(&reenter_p->cq[1]) != NULL)) {
            reenter_progress = 98;
        }
    }
    return sw_test_log_handler(file, line, function, level, comp_conf, message,
                               ap);
}

static void test_reentrant(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 *c;
    uint64_t calls;
    pair2_t p;

    pair2_init(f, &p);
    memset(f->buf[0], 0x33, 64);
    memset(f->buf[1], 0x44, 64);
    calls      = progress_calls(f->devs[0]);
    reenter_fx = f;
    reenter_p  = &p;
    ucs_log_push_handler(reenter_handler);
    sw_test_ctrl(&f->qp[0], 0x1f, 1, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    ring_db(&f->qp[0], 1);
    ucs_log_pop_handler();
    reenter_fx = NULL;
    assert_int_equal(reenter_calls, 1);
    assert_int_equal(reenter_progress, 0);
    assert_int_equal(progress_calls(f->devs[0]), calls);
    assert_true(sw_test_log_has("unsupported opcode 0x1f"));

    c = sw_test_cq_peek(&f->scq[0]);
    assert_non_null(c);
    assert_int_equal(sw_test_cqe_opcode(c), MLX5_CQE_REQ_ERR);
    c = sw_test_cq_peek(&p.cq[0]);
    assert_non_null(c);
    assert_int_equal(sw_test_cqe_opcode(c), MLX5_CQE_REQ);
    assert_memory_equal(f->buf[1] + 512, f->buf[0], 32);
    c = sw_test_cq_peek(&p.cq[1]);
    assert_non_null(c);
    assert_int_equal(sw_test_cqe_opcode(c), MLX5_CQE_REQ);
    assert_memory_equal(f->buf[0] + 768, f->buf[1], 32);
    pair2_fini(&p);
}

/* A completion handler that posts again: the new WQE runs at its doorbell
 * too (nothing of the engine is on the stack while CQEs are handled). */
static void test_post_from_completion(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 *c;
    unsigned i;

    memset(f->buf[0], 0x77, 1024);
    write_wqe(f, &f->qp[0], 0, 0, 0, 64, MLX5_WQE_CTRL_CQ_UPDATE);
    ring_db(&f->qp[0], 3);
    for (i = 1; i < 16; ++i) {
        c = sw_test_cq_peek(&f->scq[0]);
        assert_non_null(c);
        assert_int_equal(be16toh(c->wqe_counter), i - 1);
        sw_test_cq_pop(&f->scq[0]);
        write_wqe(f, &f->qp[0], 0, i * 64, i * 64, 64, MLX5_WQE_CTRL_CQ_UPDATE);
        ring_db(&f->qp[0], 3);
    }
    assert_non_null(sw_test_cq_peek(&f->scq[0]));
    assert_memory_equal(f->buf[1], f->buf[0], 1024);
    assert_int_equal(progress_calls(f->devs[0]), 0);
}

int main(void)
{
#define T(_t) cmocka_unit_test_setup_teardown(_t, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_across_processes),
        cmocka_unit_test(test_across_processes_idle),
        cmocka_unit_test(test_threads_share_devices),
        cmocka_unit_test(test_device_lock),
        cmocka_unit_test(test_progress_mode),
        cmocka_unit_test(test_doorbell_record_wraps),
        T(test_only_that_qp),
        T(test_batch),
        T(test_errors),
        T(test_reentrant),
        T(test_post_from_completion),
    };
    int ret;
#undef T

    ucs_log_push_handler(sw_test_log_handler);
    ret = cmocka_run_group_tests(tests, NULL, NULL);
    ucs_log_pop_handler();
    return ret;
}
