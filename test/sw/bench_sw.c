/*
 * Benchmark of the software device across two processes: WRITE message
 * rate and bandwidth into a forked child, next to raw process_vm_writev
 * (what UCX's cma transport does per operation) measured in the same run.
 * Prints ratios; not a test (speed is never asserted in unit tests).
 */
#include <config.h>

#include "sw_test_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE_MAX_BENCH (1u << 20)

typedef struct info {
    vqp_sw_dev_addr_t addr;
    uint32_t qpn, rkey;
    uint64_t buf;
} info_t;

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct ep {
    vqp_sw_dev_t *dev;
    sw_test_cq_t cq, rcq;
    sw_test_qp_t qp;
    uint8_t *buf;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
} ep_t;

static void ep_open(ep_t *e)
{
    e->buf = aligned_alloc(4096, SIZE_MAX_BENCH);
    memset(e->buf, 1, SIZE_MAX_BENCH);
    if ((vqp_sw_dev_open("vqp_sw0", &e->dev) != UCS_OK) ||
        (vqp_sw_mr_reg(e->dev, e->buf, SIZE_MAX_BENCH,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &e->mr,
                       &e->lkey, &e->rkey) != UCS_OK) ||
        (sw_test_cq_create(e->dev, 4096, &e->cq) != UCS_OK) ||
        (sw_test_cq_create(e->dev, 256, &e->rcq) != UCS_OK) ||
        (sw_test_qp_create(e->dev, &e->cq, &e->rcq, NULL, 1024, 64, 64,
                           &e->qp) != UCS_OK)) {
        fprintf(stderr, "bench: setup failed\n");
        exit(1);
    }
}

/* @a n WRITEs of @a size bytes, one signaled every 64; returns ops/s. */
static double run_writes(ep_t *e, const info_t *peer, size_t size, unsigned n)
{
    struct mlx5_cqe64 *cqe;
    unsigned posted = 0, done = 0, inflight = 0;
    double t0 = now_s();

    while (done < n) {
        while ((posted < n) && (inflight < 512)) {
            uint8_t fl = ((posted % 64) == 63) || (posted == n - 1)
                             ? MLX5_WQE_CTRL_CQ_UPDATE
                             : 0;

            sw_test_ctrl(&e->qp, MLX5_OPCODE_RDMA_WRITE, 3, fl, 0);
            sw_test_raddr(&e->qp, 1,
                          peer->buf + (size <= 4096 ? (posted % 16) * 64 : 0),
                          peer->rkey);
            sw_test_dseg(&e->qp, 2, e->buf, (uint32_t)size, e->lkey);
            sw_test_ring(&e->qp, 3);
            ++posted;
            ++inflight;
        }
        vqp_sw_progress(e->dev);
        while ((cqe = sw_test_cq_peek(&e->cq)) != NULL) {
            unsigned upto = be16toh(cqe->wqe_counter);

            if (sw_test_cqe_opcode(cqe) != MLX5_CQE_REQ) {
                fprintf(stderr, "bench: error CQE\n");
                exit(1);
            }
            /* Every signaled CQE completes itself and the 63 before it. */
            (void)upto;
            done += (done + 64 <= n) ? 64 : n - done;
            inflight -= (inflight >= 64) ? 64 : inflight;
            sw_test_cq_pop(&e->cq);
        }
    }
    return n / (now_s() - t0);
}

/* 8-byte inline SEND and wait for the echo; returns the round trip in
 * us. @a echo: the child's side (receive, then send back). */
static double run_pingpong(ep_t *e, unsigned n, int echo)
{
    double t0        = now_s();
    uint64_t payload = 0;
    unsigned i;

    for (i = 0; i < 64; ++i) {
        sw_test_post_recv(&e->qp, e->buf + i * 64, 64, e->lkey);
    }
    for (i = 0; i < n; ++i) {
        if (!echo) {
            sw_test_inline(&e->qp, 1, &payload, 8);
            sw_test_ctrl(&e->qp, MLX5_OPCODE_SEND, 2, 0, 0);
            sw_test_ring(&e->qp, 2);
        }
        while (sw_test_cq_peek(&e->rcq) == NULL) {
            vqp_sw_progress(e->dev);
            sched_yield();
        }
        sw_test_cq_pop(&e->rcq);
        sw_test_post_recv(&e->qp, e->buf + (i % 64) * 64, 64, e->lkey);
        if (echo) {
            sw_test_inline(&e->qp, 1, &payload, 8);
            sw_test_ctrl(&e->qp, MLX5_OPCODE_SEND, 2, 0, 0);
            sw_test_ring(&e->qp, 2);
            vqp_sw_progress(e->dev);
        }
    }
    return (now_s() - t0) * 1e6 / n;
}

#define SEND_N 200000

/* Receiver of the SEND rate run: consume SEND_N messages, reposting. */
static void recv_many(ep_t *e)
{
    unsigned i;

    for (i = 0; i < SEND_N; ++i) {
        while (sw_test_cq_peek(&e->rcq) == NULL) {
            vqp_sw_progress(e->dev);
            sched_yield();
        }
        sw_test_cq_pop(&e->rcq);
        sw_test_post_recv(&e->qp, e->buf + (i % 64) * 64, 64, e->lkey);
    }
}

/* SEND_N 8-byte inline SENDs, at most 32 in flight; returns msg/s. */
static double run_send_rate(ep_t *e)
{
    uint64_t payload = 0;
    unsigned posted = 0, done = 0;
    struct mlx5_cqe64 *cqe;
    double t0 = now_s();

    while (done < SEND_N) {
        while ((posted < SEND_N) && (posted - done < 32)) {
            sw_test_inline(&e->qp, 1, &payload, 8);
            sw_test_ctrl(&e->qp, MLX5_OPCODE_SEND, 2,
                         (posted % 16) == 15 ? MLX5_WQE_CTRL_CQ_UPDATE : 0, 0);
            sw_test_ring(&e->qp, 2);
            ++posted;
        }
        vqp_sw_progress(e->dev);
        while ((cqe = sw_test_cq_peek(&e->cq)) != NULL) {
            if (sw_test_cqe_opcode(cqe) != MLX5_CQE_REQ) {
                fprintf(stderr, "bench: SEND error CQE\n");
                exit(1);
            }
            done += 16;
            sw_test_cq_pop(&e->cq);
        }
        sched_yield();
    }
    return SEND_N / (now_s() - t0);
}

static double run_raw(pid_t pid, const info_t *peer, uint8_t *src, size_t size,
                      unsigned n)
{
    struct iovec l = {src, size}, r = {(void *)(uintptr_t)peer->buf, size};
    double t0 = now_s();
    unsigned i;

    for (i = 0; i < n; ++i) {
        if (process_vm_writev(pid, &l, 1, &r, 1, 0) != (ssize_t)size) {
            perror("process_vm_writev");
            exit(1);
        }
    }
    return n / (now_s() - t0);
}

int main(void)
{
    int to_child[2], to_parent[2];
    static const size_t sizes[] = {8, 4096, 65536, 1u << 20};
    info_t me, peer;
    ep_t e;
    pid_t pid;
    unsigned i, n;
    char c;

    if ((pipe(to_child) != 0) || (pipe(to_parent) != 0)) {
        return 1;
    }
    pid = fork();
    if (pid == 0) {
        /* Never outlive a failed run. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_child[1]);
        close(to_parent[0]);
        ep_open(&e);
        vqp_sw_dev_address(e.dev, &me.addr);
        me.qpn  = e.qp.qpn;
        me.rkey = e.rkey;
        me.buf  = (uintptr_t)e.buf;
        write(to_parent[1], &me, sizeof(me));
        read(to_child[0], &peer, sizeof(peer));
        sw_test_qp_connect(&e.qp, &peer.addr, peer.qpn, IBV_ACCESS_REMOTE_WRITE,
                           7, 7);
        write(to_parent[1], "r", 1);
        run_pingpong(&e, 20000, 1);
        recv_many(&e);
        /* One-sided: the target's engine has nothing to do; just wait. */
        read(to_child[0], &c, 1);
        vqp_sw_qp_destroy(e.qp.qp);
        vqp_sw_dev_close(e.dev);
        _exit(0);
    }
    read(to_parent[0], &peer, sizeof(peer));
    ep_open(&e);
    vqp_sw_dev_address(e.dev, &me.addr);
    me.qpn = e.qp.qpn;
    write(to_child[1], &me, sizeof(me));
    sw_test_qp_connect(&e.qp, &peer.addr, peer.qpn, IBV_ACCESS_REMOTE_WRITE, 7,
                       7);
    read(to_parent[0], &c, 1);
    printf("SEND ping-pong round trip, 8 B inline: %.2f us\n",
           run_pingpong(&e, 20000, 0));
    printf("SEND rate, 8 B inline, 32 in flight: %.0f msg/s\n",
           run_send_rate(&e));
    printf("%-8s %14s %14s %8s %12s %12s\n", "size", "vqp_sw op/s",
           "raw pvw op/s", "ratio", "vqp_sw MB/s", "raw MB/s");
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        double sw, raw;

        n   = sizes[i] <= 4096 ? 200000 : (sizes[i] <= 65536 ? 20000 : 2000);
        raw = run_raw(pid, &peer, e.buf, sizes[i], n);
        sw  = run_writes(&e, &peer, sizes[i], n);
        printf("%-8zu %14.0f %14.0f %8.2f %12.0f %12.0f\n", sizes[i], sw, raw,
               sw / raw, sw * sizes[i] / 1e6, raw * sizes[i] / 1e6);
    }
    write(to_child[1], "x", 1);
    waitpid(pid, NULL, 0);
    vqp_sw_qp_destroy(e.qp.qp);
    vqp_sw_dev_close(e.dev);
    return 0;
}
