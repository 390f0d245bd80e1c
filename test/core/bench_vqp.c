/*
 * Core microbenchmark (issue 7): ns and instructions per operation for
 * posting and for completing RDMA WRITEs through the multi-QP core (libvqp),
 * against bare mlx5 posts and CQE polls of the same WQEs on the same
 * software device; allocations per operation; memory per endpoint and per QP.
 *
 * One cycle: post K operations (timed), let the software device execute them
 * (untimed: device progress until the last CQE is in the CQ; the device runs
 * with VQP_SW_EXEC=progress, so nothing executes at the doorbell inside the
 * timed posts), complete them
 * (timed). During the timed completion the device is stopped: this program
 * links with --wrap=vqp_dev_progress and the wrapper returns 0 at once, so
 * vqp_cq_poll() measures the core's CQE handling and nothing of the device.
 * The bare baseline posts the same WQEs round robin on N bare QPs of the
 * same devices and polls them as a minimal user would (status, QP by QPN,
 * SQ space back, consumer index per batch). Compare figures only as ratios
 * within one run. Under callgrind (--insn) it counts instructions instead.
 */
/* Before config.h: UCX's configuration defines NVALGRIND, which would turn
 * the client requests into no-ops. */
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define BENCH_HAVE_CALLGRIND 1
#endif
#endif

#include <config.h>

#include "../../src/core/vqp_int.h"

#include <ucs/sys/math.h>

#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef BENCH_HAVE_CALLGRIND
#define BENCH_HAVE_CALLGRIND 0
#endif

/* Counting allocations by interposing malloc would fight a sanitizer's own
 * interposition: sanitized builds report "n/a". */
#define BENCH_COUNT_ALLOCS 1
#if defined(__SANITIZE_ADDRESS__)
#undef BENCH_COUNT_ALLOCS
#define BENCH_COUNT_ALLOCS 0
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#undef BENCH_COUNT_ALLOCS
#define BENCH_COUNT_ALLOCS 0
#endif
#endif

#define OP_BYTES_DEFAULT (64u * 1024) /* bytes per operation */
#define MAX_OPS          65536u       /* operations in flight at most */
#define RING_MAX         16384u     /* a QP's fragment ring: SQ of 32768 BBs */
#define CQ_ENTRIES       (1u << 20) /* the software device's largest CQ */
#define MAX_RECVS        256u       /* vqp_params_default */
#define POLL_BATCH       64u        /* completions asked per vqp_cq_poll */
#define QP_TABLE         1024u      /* bare QPs by QPN low bits */
#define DEVICE_STEPS     20000000u
/* Polls in a row that return nothing before a cycle is declared stuck: a
 * call may consume max_poll CQEs of fragments and report no operation. */
#define IDLE_POLLS (1u << 20)

static const unsigned num_qps_list[] = {1, 16, 128, 1024};
static const unsigned ops_list[]     = {1, 16, 256, 1024, 4096, 16384, 65536};
/* Shapes of an operation: SHAPE_WHOLE is one below the stripe threshold,
 * posted whole on the send QP (UCT's short and small zcopy operations take
 * that path); 1 and 16 are striped into that many fragments over the data
 * QPs. */
#define SHAPE_WHOLE 0u
static const unsigned frags_list[] = {SHAPE_WHOLE, 1, 16};

/* ------------------------------------------------------------ options */

static struct {
    const char *out;    /* JSON lines, appended */
    const char *cg_out; /* callgrind output file (--insn) */
    int insn;           /* count instructions under callgrind */
    int quick;
    unsigned op_bytes;
    unsigned rounds;
    unsigned round_ops; /* operations per timed round at least */
    unsigned only[3];   /* --only N,K,F: one configuration (0: all) */
    int only_whole;     /* --only N,K,w: the whole shape only */
    int cb; /* completions by callback, as the UCT transport takes them */
} opt = {NULL, NULL, 0, 0, OP_BYTES_DEFAULT, 7, 16384, {0, 0, 0}, 0, 0};

static FILE *out_file;

static void die(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    fprintf(stderr, "bench_vqp: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void json(const char *fmt, ...)
{
    va_list ap;

    if (out_file == NULL) {
        return;
    }
    va_start(ap, fmt);
    vfprintf(out_file, fmt, ap);
    va_end(ap);
    fputc('\n', out_file);
    fflush(out_file);
}

/* ------------------------------------------------------------ allocations */

static int alloc_counting;
static uint64_t alloc_calls;
static int64_t alloc_live; /* usable bytes allocated minus freed */

#if BENCH_COUNT_ALLOCS
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t align, size_t size);
extern void __libc_free(void *ptr);

static inline void *alloc_note(void *p)
{
    if (alloc_counting && (p != NULL)) {
        ++alloc_calls;
        alloc_live += malloc_usable_size(p);
    }
    return p;
}

static inline void free_note(void *p)
{
    if (alloc_counting && (p != NULL)) {
        alloc_live -= malloc_usable_size(p);
    }
}

void *malloc(size_t size)
{
    return alloc_note(__libc_malloc(size));
}

void *calloc(size_t n, size_t size)
{
    return alloc_note(__libc_calloc(n, size));
}

void *realloc(void *ptr, size_t size)
{
    free_note(ptr);
    return alloc_note(__libc_realloc(ptr, size));
}

void free(void *ptr)
{
    free_note(ptr);
    __libc_free(ptr);
}

void *memalign(size_t align, size_t size)
{
    return alloc_note(__libc_memalign(align, size));
}

void *aligned_alloc(size_t align, size_t size)
{
    return alloc_note(__libc_memalign(align, size));
}

int posix_memalign(void **ptr, size_t align, size_t size)
{
    void *p;

    if ((align < sizeof(void *)) || (align & (align - 1))) {
        return EINVAL;
    }
    p = alloc_note(__libc_memalign(align, size));
    if (p == NULL) {
        return ENOMEM;
    }
    *ptr = p;
    return 0;
}
#endif

static void alloc_start(void)
{
    alloc_counting = 1;
}

static void alloc_stop(void)
{
    alloc_counting = 0;
}

/* ------------------------------------------------------------ device stop */

unsigned __real_vqp_dev_progress(vqp_dev_t *dev);
unsigned __wrap_vqp_dev_progress(vqp_dev_t *dev);

static int device_stopped;

/* Every vqp_dev_progress() call of this program and of the core lands here
 * (ld --wrap): while a completion phase is timed the device does nothing. */
unsigned __wrap_vqp_dev_progress(vqp_dev_t *dev)
{
    if (device_stopped) {
        return 0;
    }
    return __real_vqp_dev_progress(dev);
}

/* ------------------------------------------------------------ measuring */

static double timer_ovh; /* ns of one now_ns() pair, subtracted per phase */

static double now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Median of many back-to-back timer pairs: robust to a busy neighbour. */
static void timer_calibrate(void)
{
    enum { N = 20001 };
    static double d[N];
    double t0;
    unsigned i;

    for (i = 0; i < N; ++i) {
        t0   = now_ns();
        d[i] = now_ns() - t0;
    }
    qsort(d, N, sizeof(d[0]), cmp_double);
    timer_ovh = d[N / 2];
}

/* Phase accounting: time (timing run) or instructions (under callgrind). */
typedef struct phase {
    double ns;
    double t0;
    uint64_t allocs;
    int collect; /* --insn: this phase's instructions are counted */
} phase_t;

static unsigned cg_dumps;

static void phase_begin(phase_t *ph)
{
    alloc_start();
#if BENCH_HAVE_CALLGRIND
    if (opt.insn) {
        if (ph->collect) {
            CALLGRIND_TOGGLE_COLLECT;
        }
        return;
    }
#endif
    ph->t0 = now_ns();
}

static void phase_end(phase_t *ph, uint64_t allocs0)
{
    double t1 = 0;

#if BENCH_HAVE_CALLGRIND
    if (opt.insn) {
        if (ph->collect) {
            CALLGRIND_TOGGLE_COLLECT;
        }
    } else
#endif
    {
        t1 = now_ns();
        ph->ns += t1 - ph->t0 - timer_ovh;
    }
    alloc_stop();
    ph->allocs += alloc_calls - allocs0;
}

/* Instructions collected since the last cg_zero(), read back from the dump
 * callgrind writes on request ("summary:" line of <cg_out>.<n>). */
static void cg_zero(void)
{
#if BENCH_HAVE_CALLGRIND
    CALLGRIND_ZERO_STATS;
#endif
}

static uint64_t cg_read(void)
{
    char path[4096], line[256];
    uint64_t ir = 0;
    int found   = 0;
    FILE *f;

#if BENCH_HAVE_CALLGRIND
    CALLGRIND_DUMP_STATS_AT("bench_vqp");
#endif
    snprintf(path, sizeof(path), "%s.%u", opt.cg_out, ++cg_dumps);
    f = fopen(path, "r");
    if (f == NULL) {
        die("cannot open callgrind dump %s: %m", path);
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "summary: %lu", &ir) == 1) {
            found = 1;
        }
    }
    fclose(f);
    if (getenv("BENCH_CG_KEEP") == NULL) { /* for callgrind_annotate */
        unlink(path);
    }
    if (!found) {
        die("no summary in %s", path);
    }
    return ir;
}

/* ------------------------------------------------------------ sides */

typedef struct side {
    vqp_dev_t *dev;
    char *buf;
    vqp_dev_mr_t *mr;
    uint32_t lkey;
    uint32_t rkey;
    vqp_cq_t *cq;
    vqp_t *vqp;
} side_t;

static void side_open(side_t *s, size_t buf_size)
{
    memset(s, 0, sizeof(*s));
    if (vqp_dev_open(VQP_DEV_SW_NAME, NULL, &s->dev) != UCS_OK) {
        die("cannot open the software device");
    }
    s->buf = aligned_alloc(4096, buf_size);
    if (s->buf == NULL) {
        die("out of memory");
    }
    memset(s->buf, 0x5a, buf_size);
    if (vqp_dev_mr_reg(s->dev, s->buf, buf_size,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ,
                       &s->mr, &s->lkey, &s->rkey) != UCS_OK) {
        die("memory registration failed");
    }
}

static void side_close(side_t *s)
{
    vqp_dev_mr_dereg(s->mr);
    if (vqp_dev_close(s->dev) != UCS_OK) {
        die("device still busy at close");
    }
    free(s->buf);
}

static void cq_open(side_t *s, uint32_t cqe)
{
    vqp_cq_params_t cqp;

    vqp_cq_params_default(&cqp);
    cqp.devs[0]  = s->dev;
    cqp.num_devs = 1;
    cqp.cqe      = cqe;
    if (vqp_cq_create(&cqp, &s->cq) != UCS_OK) {
        die("vqp_cq_create(%u CQEs) failed", cqe);
    }
}

static void cq_close(side_t *s)
{
    if (vqp_cq_destroy(s->cq) != UCS_OK) {
        die("vqp_cq_destroy failed");
    }
    s->cq = NULL;
}

/* Run both devices until the CQE @a count - 1 after the consumer index is
 * written: everything posted has executed. */
static void device_run(vqp_dev_t *a, vqp_dev_t *b, const vqp_mlx5_cq_t *cq,
                       uint32_t count)
{
    uint32_t index = cq->ci + count - 1;
    struct mlx5_cqe64 *cqe;
    unsigned steps;

    if (count == 0) {
        return;
    }
    for (steps = 0; steps < DEVICE_STEPS; ++steps) {
        cqe = vqp_mlx5_cq_get(cq, index);
        if (vqp_mlx5_cqe_is_sw_owned(*(volatile uint8_t *)&cqe->op_own, index,
                                     cq->log_cnt)) {
            return;
        }
        vqp_dev_progress(a);
        vqp_dev_progress(b);
    }
    die("the device did not complete %u WQEs", count);
}

/* ------------------------------------------------------------ core */

typedef struct result {
    double post_ns;
    double comp_ns;
    double post_insn;
    double comp_insn;
    double allocs; /* per operation, both phases */
    unsigned wqes; /* WQEs per operation */
} result_t;

/* Fragments each data QP may have in flight: the largest power of two (up
 * to what an SQ of the device holds) for which one CQ takes the receives
 * the core keeps posted (2 x max_outstanding on each DQPLB data QP,
 * MAX_RECVS on the send QP), a cover entry per QP, and a CQE for every
 * fragment-ring entry of the data QPs and the send QP (RING_MAX, its ring
 * with max_ops = MAX_OPS) in flight. A single QP is the send QP. */
static uint32_t qp_cap(unsigned num_qps)
{
    uint32_t cap = RING_MAX;

    if (num_qps == 1) {
        return cap;
    }
    for (; cap > 1; cap /= 2) {
        if ((uint64_t)num_qps * 3 * cap + MAX_RECVS + num_qps + 1 + RING_MAX <=
            CQ_ENTRIES) {
            break;
        }
    }
    return cap;
}

/* Operations of opt.op_bytes: striped into fragments of @a frag_size, or
 * whole on the send QP when @a whole (the threshold above them). */
static void core_pair_create(side_t *a, side_t *b, unsigned num_qps,
                             uint64_t frag_size, int whole, vqp_comp_cb_t cb,
                             void *arg)
{
    char addr_a[64 * 1024], addr_b[64 * 1024];
    vqp_params_t params;
    size_t len_a, len_b;
    ucs_status_t status;

    vqp_params_default(&params);
    params.num_qps          = num_qps;
    params.lb               = VQP_LB_DQPLB;
    params.frag_size        = frag_size;
    params.stripe_threshold = whole ? 2 * frag_size : frag_size;
    params.max_outstanding  = qp_cap(num_qps);
    params.max_recvs        = MAX_RECVS;
    params.max_ops          = MAX_OPS;
    cq_open(a, CQ_ENTRIES);
    cq_open(b, CQ_ENTRIES);
    params.cq       = a->cq;
    params.comp_cb  = cb;
    params.comp_arg = arg;
    status          = vqp_create(&params, &a->vqp);
    if (status != UCS_OK) {
        die("vqp_create(N=%u): %s", num_qps, ucs_status_string(status));
    }
    params.cq       = b->cq;
    params.comp_cb  = NULL;
    params.comp_arg = NULL;
    status          = vqp_create(&params, &b->vqp);
    if (status != UCS_OK) {
        die("vqp_create(N=%u): %s", num_qps, ucs_status_string(status));
    }
    if ((vqp_address_pack(a->vqp, addr_a, sizeof(addr_a), &len_a) != UCS_OK) ||
        (vqp_address_pack(b->vqp, addr_b, sizeof(addr_b), &len_b) != UCS_OK) ||
        (vqp_connect(a->vqp, addr_b, len_b) != UCS_OK) ||
        (vqp_connect(b->vqp, addr_a, len_a) != UCS_OK)) {
        die("connecting virtual QPs of %u QPs failed", num_qps);
    }
}

static void core_pair_destroy(side_t *a, side_t *b)
{
    vqp_destroy(a->vqp);
    vqp_destroy(b->vqp);
    a->vqp = b->vqp = NULL;
    cq_close(a);
    cq_close(b);
}

typedef struct core_run {
    side_t *a;
    side_t *b;
    vqp_send_wr_t wr;
    uint64_t next_id;   /* wr_id of the next post */
    uint64_t expect_id; /* wr_id of the next completion */
    unsigned wqes;      /* WQEs posted by the last cycle */
    unsigned got;       /* --cb: completions of the current cycle */
    unsigned bad;       /* --cb: out of order or failed */
} core_run_t;

/* --cb: what a completion callback must do at least (the transport's looks
 * up the user's completion from wr_id the same way). */
static void core_comp_cb(void *arg, const vqp_wc_t *wc)
{
    core_run_t *r = arg;

    r->bad |= (wc->wr_id != r->expect_id++) | (wc->status != UCS_OK);
    ++r->got;
}

static void core_cycle(core_run_t *r, unsigned ops, phase_t *post,
                       phase_t *comp)
{
    vqp_mlx5_cq_t *pcq = &r->a->cq->devs[0].cq;
    vqp_wc_t wcs[POLL_BATCH];
    unsigned i, n, got, idle, bad = 0;
    vqp_stats_t s0, s1;
    uint64_t allocs0;
    ucs_status_t status;

    vqp_query_stats(r->a->vqp, &s0);
    allocs0 = alloc_calls;
    phase_begin(post);
    for (i = 0; i < ops; ++i) {
        r->wr.wr_id = r->next_id++;
        status      = vqp_post_send(r->a->vqp, &r->wr);
        if (ucs_unlikely(status != UCS_OK)) {
            break;
        }
    }
    phase_end(post, allocs0);
    if (i != ops) {
        die("vqp_post_send %u of %u: %s", i, ops, ucs_status_string(status));
    }
    vqp_query_stats(r->a->vqp, &s1);
    r->wqes = s1.frags_posted - s0.frags_posted;

    device_run(r->a->dev, r->b->dev, pcq, r->wqes);

    device_stopped = 1;
    allocs0        = alloc_calls;
    phase_begin(comp);
    if (opt.cb) {
        r->got = 0;
        for (idle = 0; (r->got < ops) && (idle < IDLE_POLLS);) {
            n    = vqp_cq_progress(r->a->cq);
            idle = (n == 0) ? idle + 1 : 0;
        }
        got = r->got;
        bad = r->bad;
    } else {
        for (got = 0, idle = 0; (got < ops) && (idle < IDLE_POLLS);) {
            n = vqp_cq_poll(r->a->cq, wcs, POLL_BATCH);
            for (i = 0; i < n; ++i) {
                bad |= (wcs[i].wr_id != r->expect_id++) |
                       (wcs[i].status != UCS_OK);
            }
            got += n;
            idle = (n == 0) ? idle + 1 : 0;
        }
    }
    phase_end(comp, allocs0);
    device_stopped = 0;
    if ((got != ops) || bad) {
        vqp_query_stats(r->a->vqp, &s1);
        die("core: %u of %u completions (%s); %lu ops posted, %lu completed,"
            " %lu WQEs posted, %u QPs alive; CQ ci %u, op_own 0x%x",
            got, ops, bad ? "out of order or failed" : "in order",
            s1.ops_posted, s1.ops_completed, s1.frags_posted, s1.qps_alive,
            pcq->ci, vqp_mlx5_cq_get(pcq, pcq->ci)->op_own);
    }
}

/* ------------------------------------------------------------ bare */

typedef struct bare_qp {
    vqp_dev_qp_t *qp;
    vqp_mlx5_txwq_t tx;
    uint32_t qpn;
} bare_qp_t;

typedef struct bare {
    vqp_dev_cq_t *dev_cq[2];
    /* The register half of the QPs of each CQ, shared as the core's. */
    uint32_t bf_toggle[2];
    vqp_mlx5_cq_t cq; /* sender's */
    bare_qp_t *qps[2];
    bare_qp_t *by_qpn[QP_TABLE];
    unsigned num_qps;
    unsigned rr;
} bare_t;

/* N QPs on each side, sized as the core's data QPs, connected pairwise. */
static void bare_create(bare_t *bare, side_t *s[2], unsigned num_qps)
{
    uint32_t cap           = qp_cap(num_qps);
    vqp_dev_qp_init_t init = {0};
    vqp_dev_qp_addr_t remote;
    vqp_dev_qp_caps_t caps;
    struct mlx5dv_cq dvcq;
    struct mlx5dv_qp dv;
    bare_qp_t *q;
    unsigned i, j;

    memset(bare, 0, sizeof(*bare));
    bare->num_qps = num_qps;
    for (j = 0; j < 2; ++j) {
        if (vqp_dev_cq_create(s[j]->dev, CQ_ENTRIES, &bare->dev_cq[j], &dvcq) !=
            UCS_OK) {
            die("bare CQ");
        }
        if ((j == 0) && (vqp_mlx5_cq_init(&bare->cq, &dvcq) != UCS_OK)) {
            die("bare CQ init");
        }
        bare->qps[j] = calloc(num_qps, sizeof(bare_qp_t));
        if (bare->qps[j] == NULL) {
            die("out of memory");
        }
        for (i = 0; i < num_qps; ++i) {
            q            = &bare->qps[j][i];
            init.send_cq = bare->dev_cq[j];
            init.recv_cq = bare->dev_cq[j];
            /* QP 0 takes the whole shape's WQEs, as the core's send QP
             * (its ring is max_ops, as large as the device allows). */
            init.max_send_wr  = (i == 0) ? 2 * RING_MAX : ucs_max(2 * cap, 64u);
            init.max_send_sge = 1;
            init.max_recv_wr  = 1;
            init.max_recv_sge = 1;
            init.max_inline   = 64;
            if (vqp_dev_qp_create(s[j]->dev, &init, &q->qp, &dv, &caps) !=
                UCS_OK) {
                die("bare QP %u of %u", i, num_qps);
            }
            q->qpn = caps.qpn;
            if (vqp_mlx5_txwq_init(
                    &q->tx, &dv, caps.qpn,
                    ucs_min(caps.max_inline, (uint32_t)VQP_MLX5_MAX_INLINE),
                    ucs_max(((i == 0) ? RING_MAX : cap) / 2, 1u),
                    VQP_MLX5_DB_BF, &bare->bf_toggle[j]) != UCS_OK) {
                die("bare SQ init");
            }
            if (j == 0) {
                if (bare->by_qpn[q->qpn % QP_TABLE] != NULL) {
                    die("bare QPN table collision");
                }
                bare->by_qpn[q->qpn % QP_TABLE] = q;
            }
        }
    }
    for (i = 0; i < num_qps; ++i) {
        for (j = 0; j < 2; ++j) {
            vqp_dev_address(s[1 - j]->dev, &remote.dev);
            remote.qpn = bare->qps[1 - j][i].qpn;
            if (vqp_dev_qp_connect(bare->qps[j][i].qp, &remote, NULL) !=
                UCS_OK) {
                die("bare connect");
            }
        }
    }
}

static void bare_destroy(bare_t *bare)
{
    unsigned i, j;

    for (j = 0; j < 2; ++j) {
        for (i = 0; i < bare->num_qps; ++i) {
            vqp_dev_qp_destroy(bare->qps[j][i].qp);
        }
        free(bare->qps[j]);
        vqp_dev_cq_destroy(bare->dev_cq[j]);
    }
}

/* Post @a ops operations of @a wqes WQEs each as the core would place them
 * (fragment j at offset j * len), round robin over the QPs, or all on QP 0
 * when @a one_qp (the core's whole operations on its send QP); then poll. */
static void bare_cycle(bare_t *bare, side_t *a, side_t *b, unsigned ops,
                       unsigned wqes, uint32_t len, int one_qp, phase_t *post,
                       phase_t *comp)
{
    unsigned num_qps = one_qp ? 1 : bare->num_qps;
    uint32_t total   = ops * wqes;
    vqp_mlx5_sge_t sge;
    struct mlx5_cqe64 *cqe;
    unsigned i, j, n, done, idle;
    uint64_t allocs0;
    bare_qp_t *q;
    int ret = 0, bad = 0;

    sge.lkey = a->lkey;
    allocs0  = alloc_calls;
    phase_begin(post);
    for (i = 0; i < ops; ++i) {
        for (j = 0; j < wqes; ++j) {
            q          = &bare->qps[0][bare->rr];
            bare->rr   = (bare->rr + 1 >= num_qps) ? 0 : bare->rr + 1;
            sge.addr   = (uintptr_t)a->buf + (uint64_t)j * len;
            sge.length = len;
            ret        = vqp_mlx5_post_write(&q->tx, &sge, 1,
                                             (uintptr_t)b->buf + (uint64_t)j * len,
                                             b->rkey, VQP_MLX5_SIGNALED);
            if (ucs_unlikely(ret < 0)) {
                break;
            }
        }
    }
    phase_end(post, allocs0);
    if (ret < 0) {
        die("bare post: %s", ucs_status_string((ucs_status_t)ret));
    }

    device_run(a->dev, b->dev, &bare->cq, total);

    device_stopped = 1;
    allocs0        = alloc_calls;
    phase_begin(comp);
    for (done = 0, idle = 0; (done < total) && (idle < IDLE_POLLS);) {
        for (n = 0; n < POLL_BATCH; ++n) {
            cqe = vqp_mlx5_cq_poll(&bare->cq);
            if (cqe == NULL) {
                break;
            }
            bad |= (vqp_mlx5_cqe_status(cqe) != UCS_OK);
            q = bare->by_qpn[vqp_mlx5_cqe_qpn(cqe) % QP_TABLE];
            vqp_mlx5_txwq_complete(&q->tx, vqp_mlx5_cqe_wqe_counter(cqe));
        }
        if (n != 0) {
            vqp_mlx5_cq_update_ci(&bare->cq);
        }
        done += n;
        idle = (n == 0) ? idle + 1 : 0;
    }
    phase_end(comp, allocs0);
    device_stopped = 0;
    if ((done != total) || bad) {
        die("bare: %u of %u CQEs%s", done, total, bad ? ", with errors" : "");
    }
}

/* ------------------------------------------------------------ driver */

typedef struct config {
    unsigned num_qps;
    unsigned ops;
    unsigned frags; /* fragments per operation asked for */
} config_t;

static unsigned cycles_for(unsigned ops)
{
    unsigned c;

    if (opt.insn) { /* counts repeat exactly: few cycles suffice */
        return (ops >= 64) ? 1 : 64 / ops;
    }
    /* A cycle of the largest K is a round on its own: the device moves
     * K x op_bytes between two cycles. */
    c = opt.round_ops / ops;
    return ucs_max(c, (ops >= opt.round_ops) ? 1u : 2u);
}

/* Best of opt.rounds rounds (time), or one round of each phase (insn). */
typedef void (*cycle_fn_t)(void *arg, unsigned ops, phase_t *post,
                           phase_t *comp);

static void measure(cycle_fn_t fn, void *arg, unsigned ops, result_t *res)
{
    unsigned cycles = cycles_for(ops), c, r;
    phase_t post, comp, dummy;
    double best_post = 1e30, best_comp = 1e30;
    uint64_t allocs = 0;

    memset(&dummy, 0, sizeof(dummy));
    fn(arg, ops, &dummy, &dummy); /* warm-up */

    if (opt.insn) {
        /* Posts collected in one pass, completions in another; the rest of
         * the program runs uninstrumented (--instr-atstart=no). */
#if BENCH_HAVE_CALLGRIND
        CALLGRIND_START_INSTRUMENTATION;
#endif
        memset(&post, 0, sizeof(post));
        memset(&comp, 0, sizeof(comp));
        post.collect = 1;
        comp.collect = 1;
        cg_zero();
        for (c = 0; c < cycles; ++c) {
            fn(arg, ops, &post, &dummy);
        }
        res->post_insn = (double)cg_read() / (cycles * ops);
        cg_zero();
        for (c = 0; c < cycles; ++c) {
            fn(arg, ops, &dummy, &comp);
        }
        res->comp_insn = (double)cg_read() / (cycles * ops);
#if BENCH_HAVE_CALLGRIND
        CALLGRIND_STOP_INSTRUMENTATION;
#endif
        res->allocs =
            (double)(post.allocs + comp.allocs) / (2.0 * cycles * ops);
        return;
    }

    for (r = 0; r < opt.rounds; ++r) {
        memset(&post, 0, sizeof(post));
        memset(&comp, 0, sizeof(comp));
        for (c = 0; c < cycles; ++c) {
            fn(arg, ops, &post, &comp);
        }
        best_post = ucs_min(best_post, post.ns / (cycles * ops));
        best_comp = ucs_min(best_comp, comp.ns / (cycles * ops));
        allocs += post.allocs + comp.allocs;
    }
    res->post_ns = best_post;
    res->comp_ns = best_comp;
    res->allocs  = (double)allocs / ((double)opt.rounds * cycles * ops);
}

static void core_cycle_fn(void *arg, unsigned ops, phase_t *post, phase_t *comp)
{
    core_cycle(arg, ops, post, comp);
}

typedef struct bare_run {
    bare_t *bare;
    side_t *a;
    side_t *b;
    unsigned wqes;
    uint32_t len;
    int one_qp;
} bare_run_t;

static void bare_cycle_fn(void *arg, unsigned ops, phase_t *post, phase_t *comp)
{
    bare_run_t *r = arg;

    bare_cycle(r->bare, r->a, r->b, ops, r->wqes, r->len, r->one_qp, post,
               comp);
}

static int feasible(unsigned num_qps, unsigned ops, unsigned frags)
{
    uint32_t cap  = qp_cap(num_qps);
    uint64_t wqes = (num_qps == 1) ? ops : (uint64_t)ops * frags;

    if (frags == SHAPE_WHOLE) {
        /* the send QP's ring (and bare QP 0's SQ) */
        return ops <= RING_MAX;
    }
    /* Every WQE of a cycle posted at once: one QP's ring, or an even share
     * of the data QPs' rings. */
    return (ops <= MAX_OPS) && ((wqes + num_qps - 1) / num_qps <= cap);
}

static void print_header(void)
{
    if (opt.insn) {
        printf("\n%5s %5s %5s %6s | %9s %9s %9s | %9s %9s %9s | %6s\n", "N",
               "K", "frags", "WQE/op", "core post", "core comp", "core sum",
               "bare post", "bare poll", "bare sum", "ratio");
        printf("%31s (instructions per operation)\n", "");
    } else {
        printf("\n%5s %5s %5s %6s | %9s %9s %9s | %9s %9s %9s | %6s %9s\n", "N",
               "K", "frags", "WQE/op", "core post", "core comp", "core sum",
               "bare post", "bare poll", "bare sum", "ratio", "allocs/op");
        printf("%31s (ns per operation)\n", "");
    }
}

static void report(const config_t *cfg, const result_t *core,
                   const result_t *bare)
{
    const char *shape = (cfg->frags == SHAPE_WHOLE) ? "whole" : "striped";
    char allocs[32], frags[16];
    double cs, bs;

    snprintf(frags, sizeof(frags), "%u", cfg->frags);
    if (cfg->frags == SHAPE_WHOLE) {
        snprintf(frags, sizeof(frags), "whole");
    }

    if (opt.insn) {
        cs = core->post_insn + core->comp_insn;
        bs = bare->post_insn + bare->comp_insn;
        printf("%5u %5u %5s %6u | %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f |"
               " %6.2f\n",
               cfg->num_qps, cfg->ops, frags, core->wqes, core->post_insn,
               core->comp_insn, cs, bare->post_insn, bare->comp_insn, bs,
               cs / bs);
        json("{\"bench\":\"core\",\"metric\":\"insn_per_op\",\"n\":%u,"
             "\"ops\":%u,\"shape\":\"%s\",\"frags_per_op\":%u,"
             "\"wqes_per_op\":%u,"
             "\"op_bytes\":%u,\"core_post\":%.1f,\"core_comp\":%.1f,"
             "\"bare_post\":%.1f,\"bare_poll\":%.1f,\"ratio\":%.3f}",
             cfg->num_qps, cfg->ops, shape, cfg->frags, core->wqes,
             opt.op_bytes, core->post_insn, core->comp_insn, bare->post_insn,
             bare->comp_insn, cs / bs);
        return;
    }
    cs = core->post_ns + core->comp_ns;
    bs = bare->post_ns + bare->comp_ns;
    snprintf(allocs, sizeof(allocs), "%.3g", core->allocs);
    printf("%5u %5u %5s %6u | %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f | %6.2f"
           " %9s\n",
           cfg->num_qps, cfg->ops, frags, core->wqes, core->post_ns,
           core->comp_ns, cs, bare->post_ns, bare->comp_ns, bs, cs / bs,
           BENCH_COUNT_ALLOCS ? allocs : "n/a");
    json("{\"bench\":\"core\",\"metric\":\"ns_per_op\",\"n\":%u,\"ops\":%u,"
         "\"shape\":\"%s\",\"frags_per_op\":%u,\"wqes_per_op\":%u,"
         "\"op_bytes\":%u,"
         "\"core_post\":%.2f,\"core_comp\":%.2f,\"bare_post\":%.2f,"
         "\"bare_poll\":%.2f,\"ratio\":%.3f,\"core_allocs_per_op\":%g,"
         "\"bare_allocs_per_op\":%g,\"allocs_counted\":%s}",
         cfg->num_qps, cfg->ops, shape, cfg->frags, core->wqes, opt.op_bytes,
         core->post_ns, core->comp_ns, bare->post_ns, bare->comp_ns, cs / bs,
         core->allocs, bare->allocs, BENCH_COUNT_ALLOCS ? "true" : "false");
}

/* What one vqp_dev_progress() of an idle software device costs with the
 * core's QPs on it: paid by every iface progress in the end-to-end path,
 * never inside the core's timed regions here. */
static double idle_progress_ns(vqp_dev_t *dev)
{
    const unsigned calls = 2000;
    unsigned i;
    double t0;

    vqp_dev_progress(dev);
    t0 = now_ns();
    for (i = 0; i < calls; ++i) {
        vqp_dev_progress(dev);
    }
    return (now_ns() - t0 - timer_ovh) / calls;
}

static void run_num_qps(unsigned num_qps)
{
    result_t core[ucs_static_array_size(frags_list)]
                 [ucs_static_array_size(ops_list)];
    result_t bare;
    side_t a, b, *sides[2] = {&a, &b};
    core_run_t run;
    bare_run_t brun;
    bare_t bq;
    config_t cfg;
    double idle = 0;
    unsigned fi, ki;
    int whole;

    memset(core, 0, sizeof(core));
    side_open(&a, opt.op_bytes);
    side_open(&b, opt.op_bytes);

    for (fi = 0; fi < ucs_static_array_size(frags_list); ++fi) {
        whole = (frags_list[fi] == SHAPE_WHOLE);
        core_pair_create(&a, &b, num_qps,
                         whole ? opt.op_bytes : opt.op_bytes / frags_list[fi],
                         whole, opt.cb ? core_comp_cb : NULL, &run);
        if ((fi == 0) && !opt.insn) {
            idle = idle_progress_ns(a.dev);
            json("{\"bench\":\"core\",\"metric\":\"idle_device_progress_"
                 "ns\",\"n\":%u,\"pqps\":%u,\"ns\":%.1f}",
                 num_qps, a.vqp->num_pqps, idle);
        }
        memset(&run, 0, sizeof(run)); /* after: the callback's argument */
        run.a              = &a;
        run.b              = &b;
        run.wr.opcode      = VQP_OP_WRITE;
        run.wr.flags       = VQP_SEND_SIGNALED;
        run.wr.local_addr  = (uintptr_t)a.buf;
        run.wr.length      = opt.op_bytes;
        run.wr.remote_addr = (uintptr_t)b.buf;
        run.wr.lkey[0]     = a.lkey;
        run.wr.rkey[0]     = b.rkey;
        for (ki = 0; ki < ucs_static_array_size(ops_list); ++ki) {
            if (!feasible(num_qps, ops_list[ki], frags_list[fi]) ||
                (opt.quick && (ki % 2 == 1)) ||
                /* counts are flat in K: spare the slow simulation */
                (opt.insn && (ops_list[ki] != 1) && (ops_list[ki] != 256) &&
                 (ops_list[ki] != 4096)) ||
                (opt.only[1] && (opt.only[1] != ops_list[ki])) ||
                (opt.only_whole && (frags_list[fi] != SHAPE_WHOLE)) ||
                (opt.only[2] && (opt.only[2] != frags_list[fi]))) {
                continue;
            }
            measure(core_cycle_fn, &run, ops_list[ki], &core[fi][ki]);
            core[fi][ki].wqes = run.wqes / ops_list[ki];
        }
        core_pair_destroy(&a, &b);
    }

    bare_create(&bq, sides, num_qps);
    for (fi = 0; fi < ucs_static_array_size(frags_list); ++fi) {
        for (ki = 0; ki < ucs_static_array_size(ops_list); ++ki) {
            if (core[fi][ki].wqes == 0) {
                continue;
            }
            memset(&bare, 0, sizeof(bare));
            brun.bare   = &bq;
            brun.a      = &a;
            brun.b      = &b;
            brun.wqes   = core[fi][ki].wqes;
            brun.len    = opt.op_bytes / brun.wqes;
            brun.one_qp = (frags_list[fi] == SHAPE_WHOLE);
            measure(bare_cycle_fn, &brun, ops_list[ki], &bare);
            bare.wqes   = brun.wqes;
            cfg.num_qps = num_qps;
            cfg.ops     = ops_list[ki];
            cfg.frags   = frags_list[fi];
            report(&cfg, &core[fi][ki], &bare);
        }
    }
    bare_destroy(&bq);
    if (!opt.insn) {
        printf("%31s idle vqp_dev_progress of the software device with these"
               " QPs: %.0f ns per call (never in the timed regions)\n",
               "", idle);
    }
    side_close(&a);
    side_close(&b);
}

/* ------------------------------------------------------------ memory */

/* Heap bytes the core itself allocates for one virtual QP, computed from
 * the ring sizes vqp_create chose, by purpose. */
typedef struct core_mem {
    size_t fixed;   /* vqp_t, operation ring, atomic results, recv ids */
    size_t pqps;    /* vqp_pqp_t array, fragment rings, rx_wr_id arrays */
    size_t replay;  /* replay ring */
    size_t window;  /* DQPLB send/receive windows, arrived notifications */
    size_t slots;   /* 4-byte receive slots of the core's own receives */
    size_t wc_ring; /* share reserved in the CQ's completion ring */
} core_mem_t;

static size_t core_mem_total(const core_mem_t *m)
{
    return m->fixed + m->pqps + m->replay + m->window + m->slots + m->wc_ring;
}

static void core_mem(const vqp_t *vqp, const vqp_params_t *p, core_mem_t *m)
{
    unsigned i;
    uint32_t rq;

    memset(m, 0, sizeof(*m));
    m->fixed = sizeof(*vqp) +
               (vqp->op_mask + 1) * (sizeof(vqp_op_t) + sizeof(vqp_op_ext_t)) +
               (vqp->op_mask + 1) * sizeof(uint64_t) +
               (vqp->nrecv_mask + 1) * sizeof(uint64_t);
    m->pqps = vqp->num_pqps * sizeof(vqp_pqp_t);
    for (i = 0; i < vqp->num_pqps; ++i) {
        const vqp_pqp_t *pqp = &vqp->qps[i];

        rq = 1;
        if ((pqp == vqp->send_qp) || (pqp->role == VQP_ROLE_NOTIFY)) {
            rq = p->max_recvs;
        } else if ((vqp->lb == VQP_LB_DQPLB) && (vqp->num_qps > 1)) {
            rq = 2 * p->max_outstanding;
        }
        if (pqp->frag_shift == ucs_ilog2(sizeof(vqp_frag_t))) { /* own ring */
            m->pqps += (pqp->frag_mask + 1) * sizeof(vqp_frag_t);
        }
        m->pqps += ucs_roundup_pow2(rq) * sizeof(uint64_t);
    }
    if (vqp->data_frags != NULL) { /* the data QPs' rings, interleaved */
        m->pqps += (size_t)(vqp->data_frag_mask + 1) << vqp->data_frag_shift;
    }
    m->replay = (vqp->replay_mask + 1) * sizeof(vqp_frag_t);
    /* send_acked (send_window bytes; win = 2 * send_window at creation),
     * win_state + win_imm, arrived_imm + arrived_failed */
    m->window = (vqp->win_mask + 1) / 2 + (vqp->win_mask + 1) * (1 + 4) +
                (vqp->arrived_mask + 1) * (4 + 1);
    m->slots   = vqp->slots_len;
    m->wc_ring = vqp->wc_reserve * sizeof(vqp_wc_t);
}

/* Queue memory the device reads and writes for @a vqp's QPs (SQ and RQ). */
static size_t device_queue_bytes(const vqp_t *vqp)
{
    size_t total = 0;
    unsigned i;

    for (i = 0; i < vqp->num_pqps; ++i) {
        total += (vqp->qps[i].tx.mask + 1) * MLX5_SEND_WQE_BB +
                 (vqp->qps[i].rx.mask + 1) * vqp->qps[i].rx.stride;
    }
    return total;
}

static void run_memory(void)
{
    unsigned i, n;
    size_t total, dev_b;
    char heap_s[32];
    core_mem_t m;
    int64_t heap;
    vqp_params_t p;
    side_t a;
    vqp_t *vqp;

    printf("\nMemory per endpoint: one virtual QP, default parameters (DQPLB,"
           " max_outstanding 128 or the largest that fits a CQ of %u,"
           " max_ops 1024, max_recvs 256); bytes\n",
           CQ_ENTRIES);
    printf("%5s %5s %7s | %10s %9s %10s %10s %9s %8s %8s | %10s | %10s |"
           " %10s %9s\n",
           "N", "QPs", "max_out", "core heap", "fixed", "QP rings", "replay",
           "windows", "slots", "wc ring", "measured", "dev queues", "core/QP",
           "queues/QP");
    side_open(&a, 4096);
    cq_open(&a, CQ_ENTRIES);
    for (i = 0; i < ucs_static_array_size(num_qps_list); ++i) {
        n = num_qps_list[i];
        vqp_params_default(&p);
        p.num_qps         = n;
        p.cq              = a.cq;
        p.max_outstanding = ucs_min(p.max_outstanding, qp_cap(n));
        alloc_live        = 0;
        alloc_start();
        if (vqp_create(&p, &vqp) != UCS_OK) {
            die("vqp_create(N=%u) with default parameters failed", n);
        }
        alloc_stop();
        heap = alloc_live;
        core_mem(vqp, &p, &m);
        total = core_mem_total(&m);
        dev_b = device_queue_bytes(vqp);
        snprintf(heap_s, sizeof(heap_s), "%ld", (long)heap);
        printf("%5u %5u %7u | %10zu %9zu %10zu %10zu %9zu %8zu %8zu | %10s |"
               " %10zu | %10zu %9zu\n",
               n, vqp->num_pqps, p.max_outstanding, total, m.fixed, m.pqps,
               m.replay, m.window, m.slots, m.wc_ring,
               BENCH_COUNT_ALLOCS ? heap_s : "n/a", dev_b,
               total / vqp->num_pqps, dev_b / vqp->num_pqps);
        json("{\"bench\":\"core\",\"metric\":\"memory\",\"n\":%u,"
             "\"pqps\":%u,\"max_outstanding\":%u,\"core_heap_bytes\":%zu,"
             "\"fixed\":%zu,"
             "\"qp_rings\":%zu,\"replay\":%zu,\"windows\":%zu,"
             "\"slots\":%zu,\"cq_wc_share\":%zu,\"device_queue_bytes\":%zu,"
             "\"measured_heap_bytes\":%ld,\"measured\":%s}",
             n, vqp->num_pqps, p.max_outstanding, total, m.fixed, m.pqps,
             m.replay, m.window, m.slots, m.wc_ring, dev_b, (long)heap,
             BENCH_COUNT_ALLOCS ? "true" : "false");
        vqp_destroy(vqp);
    }
    printf("(core heap: computed from the core's ring sizes, with its share"
           " of the CQ's completion ring; measured: heap bytes the whole"
           " process allocated during vqp_create, the software device's"
           " included; the CQ's completion ring grew in the first one)\n");
    cq_close(&a);
    side_close(&a);
}

/* ------------------------------------------------------------ main */

/* F of --only: a fragment count, or "w" for the whole shape. */
static int bench_parse_shape(const char *str, unsigned *frags, int *whole)
{
    char *end;

    if (strcmp(str, "w") == 0) {
        *whole = 1;
        return 1;
    }
    *frags = (unsigned)strtoul(str, &end, 10);
    return (*end == '\0') && (*frags != 0);
}

static void usage(void)
{
    printf("usage: bench_vqp [--out FILE] [--quick] [--op-bytes B]"
           " [--only N,K,F] [--cb] [--insn --cg-out FILE]\n"
           "  --out FILE    append one JSON line per configuration\n"
           "  --quick       fewer configurations and rounds\n"
           "  --op-bytes B  bytes per operation (default %u)\n"
           "  --only N,K,F  one configuration: QPs, operations, fragments\n"
           "                (F = w: whole, below the stripe threshold)\n"
           "  --cb          completions by callback (as the UCT transport"
           " takes them),\n"
           "                not by vqp_cq_poll\n"
           "  --insn        count instructions (run under valgrind"
           " --tool=callgrind\n"
           "                --collect-atstart=no --callgrind-out-file=FILE)\n",
           OP_BYTES_DEFAULT);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"out", required_argument, NULL, 'o'},
        {"quick", no_argument, NULL, 'q'},
        {"op-bytes", required_argument, NULL, 'b'},
        {"insn", no_argument, NULL, 'i'},
        {"cg-out", required_argument, NULL, 'c'},
        {"only", required_argument, NULL, 'n'},
        {"cb", no_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    vqp_dev_attr_t attr;
    vqp_dev_t *dev;
    char shape[16];
    unsigned i;
    int c;

    while ((c = getopt_long(argc, argv, "o:qb:ic:n:kh", longopts, NULL)) !=
           -1) {
        switch (c) {
        case 'o':
            opt.out = optarg;
            break;
        case 'q':
            opt.quick     = 1;
            opt.rounds    = 3;
            opt.round_ops = 2048;
            break;
        case 'b':
            opt.op_bytes = (unsigned)strtoul(optarg, NULL, 0);
            break;
        case 'i':
            opt.insn = 1;
            break;
        case 'k':
            opt.cb = 1;
            break;
        case 'c':
            opt.cg_out = optarg;
            break;
        case 'n':
            if ((sscanf(optarg, "%u,%u,%15s", &opt.only[0], &opt.only[1],
                        shape) != 3) ||
                !bench_parse_shape(shape, &opt.only[2], &opt.only_whole)) {
                die("--only N,K,F (for example 16,256,1; F = w: whole)");
            }
            break;
        default:
            usage();
            return c == 'h' ? 0 : 1;
        }
    }
    if ((opt.op_bytes < 16) || (opt.op_bytes % 16 != 0)) {
        die("--op-bytes must be a multiple of 16");
    }
    if (opt.insn) {
#if BENCH_HAVE_CALLGRIND
        if (!RUNNING_ON_VALGRIND || (opt.cg_out == NULL)) {
            die("--insn needs valgrind --tool=callgrind and --cg-out");
        }
#else
        /* make bench-core goes on with the timing figures only */
        printf("built without valgrind/callgrind.h: no instruction counts\n");
        return 0;
#endif
    }
    if (opt.out != NULL) {
        out_file = fopen(opt.out, "a");
        if (out_file == NULL) {
            die("cannot open %s: %m", opt.out);
        }
    }

    /* The device executes WQEs only in its (untimed) progress, not at the
     * doorbell inside the timed posts. */
    if (setenv("VQP_SW_EXEC", "progress", 1) != 0) {
        die("setenv: %m");
    }
    if (vqp_dev_open(VQP_DEV_SW_NAME, NULL, &dev) != UCS_OK) {
        die("cannot open the software device");
    }
    vqp_dev_query(dev, &attr);
    vqp_dev_close(dev);
    timer_calibrate();
    printf("core microbenchmark: %s; software device: %u WQEs per SQ at most;"
           " op = %u bytes; poll batch %u; allocations %s\n",
           opt.insn ? "instructions (callgrind)"
                    : "ns, best of rounds, timer overhead subtracted",
           attr.max_qp_wr, opt.op_bytes, POLL_BATCH,
           BENCH_COUNT_ALLOCS ? "counted" : "not counted (sanitizer)");
    if (!opt.insn) {
        printf("timer overhead %.1f ns per phase (subtracted)\n", timer_ovh);
    }

    print_header();
    for (i = 0; i < ucs_static_array_size(num_qps_list); ++i) {
        if ((opt.quick && (i == 1)) ||
            (opt.only[0] && (opt.only[0] != num_qps_list[i]))) {
            continue;
        }
        run_num_qps(num_qps_list[i]);
    }
    if (!opt.insn) {
        run_memory();
    }
    if (out_file != NULL) {
        fclose(out_file);
    }
    return 0;
}
