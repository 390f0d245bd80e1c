/*
 * Microbenchmark of the bare mlx5 data path: ns (and, where the CPU counter
 * is available, instructions) per WQE posted with its doorbell, and per CQE
 * polled and decoded. No device runs: posts go to a host-memory ring whose
 * BBs are reclaimed as a CQE would reclaim them, polls read a CQ ring that
 * is refilled outside the timed region. The numbers are the baseline the
 * multi-QP core is measured against; compare them only as ratios within
 * one run. Prints one "BENCH mlx5 ..." line per case.
 */
#include <config.h>

#include <mlx5/vqp_mlx5.h>

#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SQ_BBS    1024
#define CQ_CNT    4096
#define POSTS     (1u << 20)
#define CQ_PASSES 256
#define REPEATS   5
#define SIG_EVERY 16

static int perf_fd = -1;

/* Instruction counter of this thread, user space only; -1 when the CPU or
 * VM does not expose it (the benchmark then reports time only). */
static void counter_open(void)
{
    struct perf_event_attr attr;

    memset(&attr, 0, sizeof(attr));
    attr.size           = sizeof(attr);
    attr.type           = PERF_TYPE_HARDWARE;
    attr.config         = PERF_COUNT_HW_INSTRUCTIONS;
    attr.exclude_kernel = 1;
    attr.exclude_hv     = 1;
    perf_fd = (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
}

static uint64_t counter_read(void)
{
    uint64_t v = 0;

    if ((perf_fd < 0) || (read(perf_fd, &v, sizeof(v)) != sizeof(v))) {
        return 0;
    }
    return v;
}

static double now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

typedef struct {
    double ns;
    uint64_t insns;
} sample_t;

static void report(const char *name, sample_t best, unsigned ops)
{
    char insn[32] = "n/a";

    if (perf_fd >= 0) {
        snprintf(insn, sizeof(insn), "%.1f", (double)best.insns / ops);
    }
    printf("%-22s %7.2f ns/op  %6s insn/op\n", name, best.ns / ops, insn);
    printf("BENCH mlx5 case=%s ns_per_op=%.3f insn_per_op=%s ops=%u\n", name,
           best.ns / ops, insn, ops);
}

static sample_t better(sample_t a, sample_t b)
{
    return (a.ns <= b.ns) ? a : b;
}

typedef enum {
    OP_WRITE,
    OP_WRITE_INL8,
    OP_WRITE_INL64,
    OP_SEND_INL8,
    OP_READ,
    OP_FA,
    OP_WRITE_3SGE,
    OP_NOP
} op_t;

static const char *op_names[] = {"write_ptr",  "write_inl8", "write_inl64",
                                 "send_inl8",  "read",       "atomic_fa",
                                 "write_3sge", "nop"};

/* One timed run of POSTS posts of @a op; every SIG_EVERY-th post brings a
 * CQE by policy, and the loop reclaims the ring at that WQE as a poller
 * seeing its CQE would. */
static sample_t run_post(vqp_mlx5_txwq_t *wq, op_t op, const uint8_t *buf)
{
    vqp_mlx5_sge_t sge[3] = {{(uintptr_t)buf, 8, 0x10},
                             {(uintptr_t)buf + 64, 8, 0x10},
                             {(uintptr_t)buf + 128, 8, 0x10}};
    vqp_mlx5_sge_t s64    = {(uintptr_t)buf, 64, 0x10};
    vqp_mlx5_sge_t res    = {(uintptr_t)buf + 256, 8, 0x10};
    uint64_t i0;
    sample_t s;
    unsigned i;
    double t0;
    int idx = 0;

    i0 = counter_read();
    t0 = now_ns();
    for (i = 0; i < POSTS; ++i) {
        switch (op) {
        case OP_WRITE:
            idx = vqp_mlx5_post_write(wq, sge, 1, 0x1000, 0x20, 0);
            break;
        case OP_WRITE_INL8:
            idx =
                vqp_mlx5_post_write(wq, sge, 1, 0x1000, 0x20, VQP_MLX5_INLINE);
            break;
        case OP_WRITE_INL64:
            idx =
                vqp_mlx5_post_write(wq, &s64, 1, 0x1000, 0x20, VQP_MLX5_INLINE);
            break;
        case OP_SEND_INL8:
            idx = vqp_mlx5_post_send(wq, sge, 1, VQP_MLX5_INLINE);
            break;
        case OP_READ:
            idx = vqp_mlx5_post_read(wq, sge, 1, 0x1000, 0x20, 0);
            break;
        case OP_FA:
            idx = vqp_mlx5_post_atomic_fa(wq, &res, 0x1000, 0x20, 1, 0);
            break;
        case OP_WRITE_3SGE:
            idx = vqp_mlx5_post_write(wq, sge, 3, 0x1000, 0x20, 0);
            break;
        case OP_NOP:
            idx = vqp_mlx5_post_nop(wq, 0);
            break;
        }
        if ((i % SIG_EVERY) == SIG_EVERY - 1) {
            vqp_mlx5_txwq_complete(wq, (uint16_t)idx);
        }
    }
    s.ns    = now_ns() - t0;
    s.insns = counter_read() - i0;
    if (idx < 0) {
        fprintf(stderr, "post failed: %d\n", idx);
        exit(1);
    }
    return s;
}

static void bench_post(vqp_mlx5_db_mode_t mode, const char *mode_name)
{
    struct mlx5dv_qp dv = {0};
    __be32 dbrec[2]     = {0};
    static uint64_t bf[64];
    uint8_t *buf = aligned_alloc(64, 4096);
    char name[64];
    vqp_mlx5_txwq_t wq = {0};
    uint32_t bf_toggle = 0;
    sample_t best;
    unsigned op, r;

    memset(buf, 1, 4096);
    dv.dbrec      = dbrec;
    dv.sq.buf     = aligned_alloc(64, SQ_BBS * MLX5_SEND_WQE_BB);
    dv.sq.wqe_cnt = SQ_BBS;
    dv.sq.stride  = MLX5_SEND_WQE_BB;
    dv.bf.reg     = bf;
    dv.bf.size    = sizeof(bf) / 2;
    memset(dv.sq.buf, 0, SQ_BBS * MLX5_SEND_WQE_BB);

    for (op = 0; op <= OP_NOP; ++op) {
        if (vqp_mlx5_txwq_init(&wq, &dv, 0x100, 64, SIG_EVERY, mode,
                               &bf_toggle) != UCS_OK) {
            exit(1);
        }
        run_post(&wq, op, buf); /* warm-up */
        best = run_post(&wq, op, buf);
        for (r = 1; r < REPEATS; ++r) {
            best = better(best, run_post(&wq, op, buf));
        }
        snprintf(name, sizeof(name), "post_%s_%s", op_names[op], mode_name);
        report(name, best, POSTS);
    }
    free(dv.sq.buf);
    free(buf);
}

/* Write CQ_CNT good CQEs for the pass after @a ci, as the device would. */
static void cq_fill(struct mlx5_cqe64 *ring, uint32_t ci)
{
    uint8_t owner = ((ci / CQ_CNT) & 1);
    unsigned i;

    for (i = 0; i < CQ_CNT; ++i) {
        ring[i].sop_drop_qpn = htobe32(0x100);
        ring[i].wqe_counter  = htobe16((uint16_t)i);
        ring[i].byte_cnt     = htobe32(64);
        ring[i].op_own       = (MLX5_CQE_REQ << 4) | owner;
    }
}

static void bench_poll(void)
{
    struct mlx5_cqe64 *ring = aligned_alloc(64, CQ_CNT * sizeof(*ring));
    struct mlx5dv_cq dv     = {0};
    __be32 dbrec[2]         = {0};
    struct mlx5_cqe64 *cqe;
    vqp_mlx5_cq_t cq = {0};
    sample_t s, best = {1e30, 0};
    uint64_t sum = 0, i0;
    unsigned pass, n;
    double t0;

    memset(ring, 0, CQ_CNT * sizeof(*ring));
    dv.buf      = ring;
    dv.dbrec    = dbrec;
    dv.cqe_cnt  = CQ_CNT;
    dv.cqe_size = sizeof(*ring);
    if (vqp_mlx5_cq_init(&cq, &dv) != UCS_OK) {
        exit(1);
    }
    for (pass = 0; pass < CQ_PASSES; ++pass) {
        cq_fill(ring, cq.ci); /* untimed: the device's work */
        i0 = counter_read();
        t0 = now_ns();
        for (n = 0; (cqe = vqp_mlx5_cq_poll(&cq)) != NULL; ++n) {
            if (ucs_unlikely(vqp_mlx5_cqe_status(cqe) != UCS_OK)) {
                exit(1);
            }
            sum += vqp_mlx5_cqe_wqe_counter(cqe) + vqp_mlx5_cqe_qpn(cqe);
            if ((n % SIG_EVERY) == SIG_EVERY - 1) {
                vqp_mlx5_cq_update_ci(&cq);
            }
        }
        s.ns    = now_ns() - t0;
        s.insns = counter_read() - i0;
        if (n != CQ_CNT) {
            fprintf(stderr, "polled %u of %u CQEs\n", n, CQ_CNT);
            exit(1);
        }
        if (pass > 0) {
            best = better(best, s);
        }
    }
    /* An empty poll: the cost of asking when nothing is there. */
    report("poll_cqe", best, CQ_CNT);
    i0 = counter_read();
    t0 = now_ns();
    for (n = 0; n < POSTS; ++n) {
        sum += (vqp_mlx5_cq_poll(&cq) != NULL);
    }
    s.ns    = now_ns() - t0;
    s.insns = counter_read() - i0;
    report("poll_empty", s, POSTS);
    if (sum == 0) {
        printf("(checksum 0)\n");
    }
    free(ring);
}

int main(void)
{
    counter_open();
    printf("mlx5 data path microbenchmark: best of %d runs, %u posts each,"
           " signal every %d; instructions %s\n",
           REPEATS, POSTS, SIG_EVERY,
           (perf_fd >= 0) ? "counted" : "not available here");
    bench_post(VQP_MLX5_DB_RECORD, "dbrec");
    bench_post(VQP_MLX5_DB_BF, "bf");
    bench_poll();
    return 0;
}
