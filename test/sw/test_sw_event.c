/*
 * Completion events of the software device (vqp_sw_dev_event_fd /
 * vqp_sw_dev_arm): a peer's deposit wakes an armed device, in this process
 * and across processes; nothing wakes a device that did not arm; one-sided
 * WRITEs wake nobody; arm says BUSY while work is pending (posted WQEs,
 * inbound records, unpolled CQEs, drained wakeups, CQEs past an armed CQ's
 * consumer index); a malformed arm doorbell, a broken event fd and a peer
 * whose socket is gone are errors or are ignored as documented.
 */
#include <config.h>

#include "sw_test_fx.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define A 0
#define B 1

/* 1 if @a fd becomes readable within @a ms, 0 if not. */
static int readable(int fd, int ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int ret;

    do {
        ret = poll(&pfd, 1, ms);
    } while ((ret < 0) && (errno == EINTR));
    assert_true(ret >= 0);
    return (ret > 0) && (pfd.revents & POLLIN);
}

/* Progress @a dev (only it) a few rounds. */
static void spin(vqp_sw_dev_t *dev)
{
    int i;

    for (i = 0; i < 20; ++i) {
        vqp_sw_progress(dev);
    }
}

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));

    if ((f == NULL) || (fx_init(f, 64, 16, 7, 7) != 0)) {
        return -1;
    }
    sw_test_log_buf[0] = '\0';
    ucs_log_push_handler(sw_test_log_handler);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    ucs_log_pop_handler();
    fx_fini(*state);
    free(*state);
    return 0;
}

static void test_arm_idle_and_wakeup(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    int fd, fd2;

    assert_int_equal(vqp_sw_dev_event_fd(f->devs[B], &fd), UCS_OK);
    assert_int_equal(vqp_sw_dev_event_fd(f->devs[B], &fd2), UCS_OK);
    assert_int_equal(fd, fd2); /* one fd per device */
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_OK);
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_OK); /* re-arm: idle */
    assert_false(readable(fd, 0));

    /* A's engine deposits a SEND for armed B: B's fd fires. */
    sw_test_post_recv(&f->qp[B], f->buf[B], 256, f->lkey[B]);
    memcpy(f->buf[A], "wake", 4);
    fx_send(f, A, MLX5_OPCODE_SEND, 0, 4, 0);
    spin(f->devs[A]);
    assert_true(readable(fd, 1000));
    /* The sender's completion is its own engine's: no help from B. */
    assert_non_null(sw_test_cq_peek(&f->scq[A]));
    sw_test_cq_pop(&f->scq[A]);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_OK);

    /* Drained wakeup: busy once; then the undelivered record: busy. */
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_ERR_BUSY);
    assert_false(readable(fd, 0));
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_ERR_BUSY);
    vqp_sw_progress(f->devs[B]);
    /* Delivered, CQE not polled yet: still busy. */
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_ERR_BUSY);
    assert_int_equal(fx_poll(f, B, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_memory_equal(f->buf[B], "wake", 4);
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_OK);

    /* One wakeup per arm: a second deposit after the first woke B sends
     * nothing more. */
    sw_test_post_recv(&f->qp[B], f->buf[B], 256, f->lkey[B]);
    sw_test_post_recv(&f->qp[B], f->buf[B], 256, f->lkey[B]);
    fx_send(f, A, MLX5_OPCODE_SEND, 0, 4, 0);
    spin(f->devs[A]);
    fx_send(f, A, MLX5_OPCODE_SEND, 0, 4, 0);
    spin(f->devs[A]);
    assert_true(readable(fd, 1000));
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_ERR_BUSY);
    assert_false(readable(fd, 0));
    assert_string_equal(sw_test_log_buf, "");
}

static void test_not_armed_no_wakeup(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    int fd;

    assert_int_equal(vqp_sw_dev_event_fd(f->devs[B], &fd), UCS_OK);
    sw_test_post_recv(&f->qp[B], f->buf[B], 256, f->lkey[B]);
    fx_send(f, A, MLX5_OPCODE_SEND_IMM, 0, 8, htobe32(7));
    spin(f->devs[A]);
    assert_non_null(sw_test_cq_peek(&f->scq[A]));
    assert_false(readable(fd, 200));
    /* Arming now finds the record: no sleep. */
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_ERR_BUSY);
    assert_int_equal(fx_poll(f, B, 1, &cqe), 0);
    assert_int_equal(be32toh(cqe.imm_inval_pkey), 7);
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_OK);
}

static void test_write_wakes_nobody(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    int fd;

    assert_int_equal(vqp_sw_dev_event_fd(f->devs[B], &fd), UCS_OK);
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_OK);
    memcpy(f->buf[A] + 64, "one-sided", 9);
    fx_write(f, A, 64, 128, 9, MLX5_WQE_CTRL_CQ_UPDATE);
    /* Posted, not executed: A is busy until its engine ran and the CQE
     * was polled. */
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_ERR_BUSY);
    assert_string_equal(sw_test_log_buf, "");
    assert_int_equal(fx_poll(f, A, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_memory_equal(f->buf[B] + 128, "one-sided", 9);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_OK);
    /* No CQE at the target: no wakeup, and B stays armed. */
    assert_false(readable(fd, 200));
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_OK);

    /* A WRITE_IMM does make a CQE at B: it wakes B. */
    sw_test_post_recv(&f->qp[B], f->buf[B], 256, f->lkey[B]);
    sw_test_ctrl(&f->qp[A], MLX5_OPCODE_RDMA_WRITE_IMM, 3,
                 MLX5_WQE_CTRL_CQ_UPDATE, htobe32(5));
    sw_test_raddr(&f->qp[A], 1, (uintptr_t)f->buf[B] + 256, f->rkey[B]);
    sw_test_dseg(&f->qp[A], 2, f->buf[A], 8, f->lkey[A]);
    sw_test_ring(&f->qp[A], 3);
    spin(f->devs[A]);
    assert_true(readable(fd, 1000));
}

static void test_responder_error_wakes(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    int fd;

    /* A WRITE_IMM with a bad rkey: B's QP must enter ERROR, which only
     * B's engine does; the error flag wakes B. */
    assert_int_equal(vqp_sw_dev_event_fd(f->devs[B], &fd), UCS_OK);
    sw_test_post_recv(&f->qp[B], f->buf[B], 256, f->lkey[B]);
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_OK);
    sw_test_ctrl(&f->qp[A], MLX5_OPCODE_RDMA_WRITE_IMM, 3,
                 MLX5_WQE_CTRL_CQ_UPDATE, htobe32(5));
    sw_test_raddr(&f->qp[A], 1, (uintptr_t)f->buf[B], f->rkey[B] ^ 0x100);
    sw_test_dseg(&f->qp[A], 2, f->buf[A], 8, f->lkey[A]);
    sw_test_ring(&f->qp[A], 3);
    spin(f->devs[A]);
    assert_true(sw_test_log_has("refused"));
    assert_true(readable(fd, 1000));
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_ERR_BUSY); /* drained */
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_ERR_BUSY); /* error */
    assert_int_equal(fx_poll(f, B, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_ERR);
    assert_int_equal(vqp_sw_qp_state(f->qp[B].qp), IBV_QPS_ERR);
}

/* Writes the 8-byte arm doorbell and its record as vqp_mlx5_cq_arm does. */
static void arm_cq(sw_test_cq_t *c, uint32_t cmd, uint32_t ci, uint32_t cqn,
                   uint32_t record)
{
    uint32_t val = (1u << 28) | cmd | (ci & 0xffffff);

    c->dv.dbrec[1] = htobe32(record ? record : val);
    *(volatile uint64_t *)((char *)c->dv.cq_uar + MLX5_CQ_DOORBELL) =
        htobe64(((uint64_t)val << 32) | cqn);
}

static void test_arm_doorbell(void **state)
{
    fx_t *f         = *state;
    sw_test_cq_t *c = &f->scq[A];
    struct mlx5_cqe64 cqe;
    unsigned i;

    /* Well-formed, at the consumer index: armed. */
    arm_cq(c, MLX5_CQ_DB_REQ_NOT, c->ci, c->dv.cqn, 0);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_OK);
    /* Another CQ's number, a bad command, a record that differs, a
     * consumer index ahead of the producer: refused with a log line. */
    arm_cq(c, MLX5_CQ_DB_REQ_NOT, c->ci, f->rcq[A].dv.cqn, 0);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("invalid arm doorbell"));
    arm_cq(c, 2u << 24, c->ci, c->dv.cqn, 0);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("invalid arm doorbell"));
    arm_cq(c, MLX5_CQ_DB_REQ_NOT, c->ci, c->dv.cqn, 0x12345);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("invalid arm doorbell"));
    arm_cq(c, MLX5_CQ_DB_REQ_NOT_SOL, c->ci + 3, c->dv.cqn, 0);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("ahead of the producer"));

    /* A CQE past the armed index fires at once on a ConnectX: busy, even
     * once the consumer index record says it was polled. */
    arm_cq(c, MLX5_CQ_DB_REQ_NOT, c->ci, c->dv.cqn, 0);
    fx_nop(f, A, MLX5_WQE_CTRL_CQ_UPDATE);
    assert_int_equal(fx_poll(f, A, 0, &cqe), 0);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_ERR_BUSY);
    /* That arm fired and is used up: nothing pending any more. */
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_OK);
    /* An arm that more CQEs than the ring holds went past (polled as they
     * came) fired long ago: busy once, no error (UCP arms idle interfaces
     * whose last arm is that old). */
    arm_cq(c, MLX5_CQ_DB_REQ_NOT, c->ci, c->dv.cqn, 0);
    for (i = 0; i < c->dv.cqe_cnt + 5; ++i) {
        fx_nop(f, A, MLX5_WQE_CTRL_CQ_UPDATE);
        assert_int_equal(fx_poll(f, A, 0, &cqe), 0);
    }
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_ERR_BUSY);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_OK);
    arm_cq(c, MLX5_CQ_DB_REQ_NOT, c->ci, c->dv.cqn, 0);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_OK);
    /* CQ 0 armed at index 0 with sequence 0 is an all-zero doorbell: a
     * valid arm, not "never armed". */
    assert_int_equal(f->scq[B].dv.cqn, 0);
    f->scq[B].dv.dbrec[1]                                                  = 0;
    *(volatile uint64_t *)((char *)f->scq[B].dv.cq_uar + MLX5_CQ_DOORBELL) = 0;
    fx_nop(f, B, MLX5_WQE_CTRL_CQ_UPDATE);
    assert_int_equal(fx_poll(f, B, 0, &cqe), 0);
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_ERR_BUSY);
    assert_string_equal(sw_test_log_buf, "");
}

static void test_bad_fd_and_args(void **state)
{
    fx_t *f = *state;
    int fd, p[2];

    assert_int_equal(vqp_sw_dev_event_fd(NULL, &fd), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("NULL argument"));
    assert_int_equal(vqp_sw_dev_event_fd(f->devs[A], NULL),
                     UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("NULL argument"));
    assert_int_equal(vqp_sw_dev_arm(NULL), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("dev_arm(NULL)"));

    /* The user replaced the device's fd with something that is not its
     * socket: the drain fails with a log line, not a hang or a crash. */
    assert_int_equal(vqp_sw_dev_event_fd(f->devs[A], &fd), UCS_OK);
    assert_int_equal(pipe(p), 0);
    assert_int_equal(dup2(p[0], fd), fd);
    close(p[0]);
    close(p[1]);
    assert_int_equal(vqp_sw_dev_arm(f->devs[A]), UCS_ERR_IO_ERROR);
    assert_true(sw_test_log_has("draining the event socket"));
}

static void test_peer_socket_gone(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    int fd, p[2];

    /* B armed, then its socket vanished (as when its process dies): A's
     * wakeup finds nobody and A's SEND still completes normally. */
    sw_test_post_recv(&f->qp[B], f->buf[B], 256, f->lkey[B]);
    assert_int_equal(vqp_sw_dev_arm(f->devs[B]), UCS_OK);
    assert_int_equal(vqp_sw_dev_event_fd(f->devs[B], &fd), UCS_OK);
    assert_int_equal(pipe(p), 0);
    assert_int_equal(dup2(p[0], fd), fd); /* closes the socket */
    close(p[0]);
    close(p[1]);
    fx_send(f, A, MLX5_OPCODE_SEND, 0, 4, 0);
    assert_int_equal(fx_poll(f, A, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_string_equal(sw_test_log_buf, "");
}

/* ------------------------------------------------------------ processes */

typedef struct info {
    vqp_sw_dev_addr_t addr;
    uint32_t qpn;
} info_t;

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

typedef struct side {
    vqp_sw_dev_t *dev;
    sw_test_cq_t scq, rcq;
    sw_test_qp_t qp;
    uint8_t *buf;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
} side_t;

static int side_open(side_t *s)
{
    memset(s, 0, sizeof(*s));
    s->buf = aligned_alloc(64, 4096);
    return ((s->buf != NULL) &&
            (vqp_sw_dev_open("vqp_sw0", &s->dev) == UCS_OK) &&
            (vqp_sw_mr_reg(s->dev, s->buf, 4096, SW_TEST_ACCESS_ALL, &s->mr,
                           &s->lkey, &s->rkey) == UCS_OK) &&
            (sw_test_cq_create(s->dev, 64, &s->scq) == UCS_OK) &&
            (sw_test_cq_create(s->dev, 64, &s->rcq) == UCS_OK) &&
            (sw_test_qp_create(s->dev, &s->scq, &s->rcq, NULL, 64, 16, 64,
                               &s->qp) == UCS_OK))
               ? 0
               : -1;
}

static int side_connect(side_t *s, int rfd, int wfd)
{
    info_t me, peer;

    vqp_sw_dev_address(s->dev, &me.addr);
    me.qpn = s->qp.qpn;
    if ((xfer(wfd, &me, sizeof(me), 1) != 0) ||
        (xfer(rfd, &peer, sizeof(peer), 0) != 0)) {
        return -1;
    }
    return (sw_test_qp_connect(&s->qp, &peer.addr, peer.qpn, SW_TEST_ACCESS_ALL,
                               7, 7) == UCS_OK)
               ? 0
               : -1;
}

static void side_close(side_t *s)
{
    vqp_sw_qp_destroy(s->qp.qp);
    vqp_sw_dev_close(s->dev);
    free(s->buf);
}

/* Sender: on each 's' one SEND, completed by its own engine, then 'd'. */
static int child_main(int rfd, int wfd)
{
    struct mlx5_cqe64 cqe;
    unsigned n = 0;
    side_t s;
    char c;

    if ((side_open(&s) != 0) || (side_connect(&s, rfd, wfd) != 0)) {
        return 1;
    }
    while ((xfer(rfd, &c, 1, 0) == 0) && (c == 's')) {
        snprintf((char *)s.buf, 16, "msg %u", n++);
        sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
        sw_test_dseg(&s.qp, 1, s.buf, 16, s.lkey);
        sw_test_ring(&s.qp, 2);
        if ((sw_test_poll(&s.dev, 1, &s.scq, &cqe, 5000) != 0) ||
            (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ) ||
            (xfer(wfd, "d", 1, 1) != 0)) {
            return 2;
        }
    }
    side_close(&s);
    return 0;
}

static void test_wakeup_across_processes(void **state)
{
    int to_child[2], from_child[2], status, fd, i;
    struct mlx5_cqe64 cqe;
    uint64_t t0, slept;
    pid_t child;
    side_t s;
    char c;

    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_child[1]);
        close(from_child[0]);
        _exit(child_main(to_child[0], from_child[1]));
    }
    close(to_child[0]);
    close(from_child[1]);
    assert_int_equal(side_open(&s), 0);
    assert_int_equal(side_connect(&s, from_child[0], to_child[1]), 0);
    assert_int_equal(vqp_sw_dev_event_fd(s.dev, &fd), UCS_OK);

    for (i = 0; i < 3; ++i) {
        sw_test_post_recv(&s.qp, s.buf + 1024, 64, s.lkey);
        /* Armed and asleep in poll(): only the child's engine can wake
         * us, and our engine does not run until then. */
        assert_int_equal(vqp_sw_dev_arm(s.dev), UCS_OK);
        assert_int_equal(xfer(to_child[1], "s", 1, 1), 0);
        t0 = sw_test_now_ms();
        assert_true(readable(fd, 5000));
        slept = sw_test_now_ms() - t0;
        assert_true(slept < 5000);
        assert_int_equal(xfer(from_child[0], &c, 1, 0), 0);
        assert_int_equal(vqp_sw_dev_arm(s.dev), UCS_ERR_BUSY);
        assert_int_equal(sw_test_poll(&s.dev, 1, &s.rcq, &cqe, 2000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
        assert_int_equal(atoi((char *)s.buf + 1024 + 4), i);
    }

    /* Not armed: the child's SEND completes, we are not woken. */
    sw_test_post_recv(&s.qp, s.buf + 1024, 64, s.lkey);
    assert_int_equal(xfer(to_child[1], "s", 1, 1), 0);
    assert_int_equal(xfer(from_child[0], &c, 1, 0), 0);
    assert_false(readable(fd, 300));
    assert_int_equal(vqp_sw_dev_arm(s.dev), UCS_ERR_BUSY);
    assert_int_equal(sw_test_poll(&s.dev, 1, &s.rcq, &cqe, 2000), 0);
    assert_int_equal(vqp_sw_dev_arm(s.dev), UCS_OK);

    /* The child ends; we stay armed: nothing wakes us, nothing hangs. */
    assert_int_equal(xfer(to_child[1], "x", 1, 1), 0);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_false(readable(fd, 100));
    close(to_child[1]);
    close(from_child[0]);
    side_close(&s);
}

/* Sender for the race below: spins on @a go (shared) for each message's
 * number, pauses a random few microseconds (as the parent does before it
 * arms, so the deposit lands anywhere around the arm), then sends. */
static int child_race_main(int rfd, int wfd, const uint32_t *go)
{
    struct mlx5_cqe64 cqe;
    volatile unsigned pause;
    uint32_t n = 0, want;
    side_t s;

    if ((side_open(&s) != 0) || (side_connect(&s, rfd, wfd) != 0)) {
        return 1;
    }
    srand((unsigned)getpid());
    for (;;) {
        while ((want = __atomic_load_n(go, __ATOMIC_ACQUIRE)) == n) {
        }
        if (want == UINT32_MAX) {
            break;
        }
        n = want;
        for (pause = rand() % 2048; pause > 0; --pause) {
        }
        sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
        sw_test_dseg(&s.qp, 1, s.buf, 16, s.lkey);
        sw_test_ring(&s.qp, 2);
        if ((sw_test_poll(&s.dev, 1, &s.scq, &cqe, 5000) != 0) ||
            (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
            return 2;
        }
    }
    side_close(&s);
    return 0;
}

/* Arm against a deposit racing it, many times: a lost wakeup is a sleep
 * that times out while the SEND waits in our segment. Our pause before the
 * arm adapts (longer after a sleep, shorter after finding the record) so
 * that arms keep landing around the deposit whatever the machine's speed.
 * Without the depositor's fence (or the arm's), a wakeup was lost within a
 * few thousand messages in every run. */
static void test_wakeup_race(void **state)
{
    int to_child[2], from_child[2], status, fd, i, slept = 0, found = 0;
    unsigned delay = 1024;
    uint64_t end;
    struct mlx5_cqe64 cqe;
    volatile unsigned pause;
    ucs_status_t st;
    uint32_t *go;
    bool asleep;
    pid_t child;
    side_t s;

    go = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
              -1, 0);
    assert_true(go != MAP_FAILED);
    *go = 0;
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_child[1]);
        close(from_child[0]);
        _exit(child_race_main(to_child[0], from_child[1], go));
    }
    close(to_child[0]);
    close(from_child[1]);
    assert_int_equal(side_open(&s), 0);
    assert_int_equal(side_connect(&s, from_child[0], to_child[1]), 0);
    assert_int_equal(vqp_sw_dev_event_fd(s.dev, &fd), UCS_OK);

    /* 5000 messages, and more (up to 50000, 60 s) until the race went
     * both ways 100 times: on a loaded machine the depositor may not run
     * beside us for a while, and found deposits are then rare. */
    end = sw_test_now_ms() + 60000;
    for (i = 1; (i <= 5000) || (((slept <= 100) || (found <= 100)) &&
                                (i <= 50000) && (sw_test_now_ms() < end));
         ++i) {
        sw_test_post_recv(&s.qp, s.buf + 1024, 64, s.lkey);
        __atomic_store_n(go, (uint32_t)i, __ATOMIC_RELEASE);
        for (pause = rand() % (2 * delay + 1); pause > 0; --pause) {
        }
        asleep = false;
        for (;;) {
            st = vqp_sw_dev_arm(s.dev);
            if (st == UCS_OK) {
                asleep = true;
                if (!readable(fd, 5000)) {
                    fail_msg("lost wakeup at message %d", i);
                }
            } else {
                assert_int_equal(st, UCS_ERR_BUSY);
            }
            vqp_sw_progress(s.dev);
            if (sw_test_cq_peek(&s.rcq) != NULL) {
                assert_int_equal(sw_test_poll(&s.dev, 1, &s.rcq, &cqe, 0), 0);
                assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
                break;
            }
        }
        if (asleep) {
            ++slept;
            /* up to about 10 ms: the depositor may wait for a core */
            delay += (delay < (1u << 23)) ? delay / 8 + 1 : 0;
        } else {
            ++found;
            delay -= delay / 8;
        }
        /* The wakeup of a sleep stays queued: the next arm drains it. */
    }
    print_message("%d messages: %d sleeps, %d found by the arm\n", i - 1, slept,
                  found);
    /* The race ran: many sleeps, and many deposits the arm found. */
    if ((slept <= 100) || (found <= 100)) {
        fail_msg("the race did not run both ways: %d messages, %d sleeps, %d"
                 " found, pause %u",
                 i - 1, slept, found, delay);
    }
    __atomic_store_n(go, UINT32_MAX, __ATOMIC_RELEASE);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(to_child[1]);
    close(from_child[0]);
    munmap(go, 4096);
    side_close(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_arm_idle_and_wakeup, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_not_armed_no_wakeup, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_write_wakes_nobody, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_responder_error_wakes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_arm_doorbell, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_fd_and_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_socket_gone, setup, teardown),
        cmocka_unit_test(test_wakeup_across_processes),
        cmocka_unit_test(test_wakeup_race),
    };
    char ns[32];

    /* Own namespace: socket and segment names of concurrent runs differ. */
    snprintf(ns, sizeof(ns), "swev%u", (unsigned)getpid());
    setenv("VQP_SW_NAMESPACE", ns, 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
