/*
 * Multi-QP core, randomized: seeded trials of random configurations (QP
 * count, one or two devices per side, load balancing, fragment size, stripe
 * threshold, ring sizes, completions by callback or by poll, the CQ's poll
 * budget and size, a second pair of virtual QPs with WRITEs of its own on
 * the same CQs) and random operation streams (WRITE, WRITE_IMM, READ, SEND,
 * SEND_IMM, every atomic on 4 and 8 bytes, FLUSH, PROBE; signaled or not,
 * fenced, inline, with bad remote keys), polled at random moments with
 * random batch sizes, posts from inside completion callbacks, CQEs of
 * different QPs reordered and WQEs delayed by the software device, data QPs
 * killed on either side, the sender's send QP killed, transport errors on
 * random WQEs. Each trial checks the core's contract against a model of
 * what was posted: every signaled operation reported exactly once, reports
 * in posting order, an unsignaled one reported only when it failed, no
 * failure while a data QP survives (but for what has no other QP once the
 * send QP died), the data of every operation in place (an inline one's as
 * it was at the post; a fenced READ of the last WRITE's region reads that
 * WRITE's data), notifications and receives in order with their immediate
 * data, atomic results and words, the statistics, every WQE counted once;
 * and, when the trial ends by destroying the sender or by vqp_cancel with
 * operations in flight, each unreported one reported once, done or
 * canceled.
 *
 * VQP_RANDOM_SEED=S runs the trials S, S + 1, ...; VQP_RANDOM_TRIALS=N how
 * many (default 100; 10 under valgrind). A failure prints the trial's seed
 * and configuration, and VQP_RANDOM_VERBOSE=1 prints every trial's.
 */
#include <config.h>

#include "../../src/core/vqp_int.h"

#include <ucs/arch/bitops.h>
#include <ucs/sys/math.h>

#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_SIZE   (24u << 20)
#define ATOMIC_OFF 0u         /* b: the fetch-and-add counter */
#define RECV_OFF   4096u      /* b: SEND receive buffers */
#define RECV_LEN   16384u     /* bytes per receive buffer */
#define RECV_BUFS  32u        /* receive buffers (<= max_recvs) */
#define ARENA_OFF  (1u << 20) /* both: operation regions from here */
#define MAX_OPS    1201u      /* with the final FLUSH */
#define MAX_STEPS  4000000u

typedef struct rng {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static unsigned rng_below(rng_t *r, unsigned n)
{
    return (unsigned)(rng_next(r) % n);
}

/* True with probability pct / 100. */
static int rng_pct(rng_t *r, unsigned pct)
{
    return rng_below(r, 100) < pct;
}

/* One side: one or two devices (a virtual QP over both: keys per device),
 * one buffer registered on each. */
typedef struct side {
    unsigned num_devs;
    vqp_dev_t *dev[2];
    vqp_cq_t *cq;
    vqp_t *vqp;
    char *buf;
    vqp_dev_mr_t *mr[2];
    uint32_t lkey[2];
    uint32_t rkey[2];
} side_t;

/* What the model knows of one posted operation. */
typedef struct model_op {
    vqp_opcode_t opcode;
    unsigned flags;
    uint64_t loff;
    uint64_t roff;
    uint64_t len;
    uint32_t imm;
    int inl_scribbled; /* inline: source overwritten after the post */
    int bad;           /* posted with a wrong remote key: must fail */
    /* Whose pattern the data carries: its own id, or for a fenced READ of
     * what an earlier WRITE wrote, that WRITE's. */
    unsigned data_id;
    int fence_read;
    /* Atomics on a word of their own: its value before and after, and
     * the operands. */
    uint64_t atomic_old;
    uint64_t atomic_new;
    unsigned reports;
    ucs_status_t status;
} model_op_t;

/* A second pair of virtual QPs on the same CQs, with WRITEs of its own:
 * its QPs' CQEs interleave with the main pair's, they share the CQ credits
 * and the CQ's list of virtual QPs to advance. */
#define BG_MAX 2000
#define BG_ID  100000u /* pattern ids of its operations */

typedef struct bg {
    vqp_t *a, *b;
    unsigned posted, reported, signaled;
    int64_t last;
    uint64_t off[BG_MAX], len[BG_MAX];
    uint8_t sig[BG_MAX], rep[BG_MAX], failed[BG_MAX];
} bg_t;

typedef struct trial {
    uint64_t seed;
    rng_t rng;
    /* configuration */
    unsigned num_qps;
    unsigned num_devs;   /* per side */
    uint32_t cqe;        /* the CQs' entries, small to run out of credits; 0:
                          * the default */
    uint32_t max_covers; /* the CQs' cover entries; 0: the default */
    vqp_lb_t lb;
    uint64_t frag_size;
    uint64_t stripe_threshold;
    unsigned max_outstanding;
    unsigned max_ops;
    int use_cb;
    int reorder;
    int exec_auto;
    unsigned kills;      /* data QPs to kill during the trial */
    int kill_send_at;    /* operation index to kill a's send QP at, or -1 */
    int delays;          /* the sender's device delays some WQEs */
    int destroy_end;     /* end by destroying a with operations in flight */
    int cancel_end;      /* end by vqp_cancel with operations in flight */
    unsigned ops_target; /* operations to post */
    /* state */
    side_t a, b;
    model_op_t ops[MAX_OPS];
    unsigned posted;       /* operations accepted */
    int64_t last_report;   /* wr_id of the newest report, -1: none */
    unsigned reports;      /* reports seen on a */
    unsigned unsig_failed; /* unsignaled operations reported (failed) */
    uint64_t arena;        /* next free offset of the regions */
    unsigned kill_at[8];   /* operation indices to kill a QP at */
    uint8_t kill_b[8];     /* ... on the receiver's side instead */
    unsigned killed;
    uint64_t killed_qps; /* bit per QP pair killed (either side) */
    int send_killed;     /* a's send QP was killed */
    int bad_ops;         /* the trial posts some operations with a bad key */
    int chaos;           /* random transport errors (fault injection) */
    int bad_posted;      /* one was posted: anything may fail from now on */
    unsigned notif_seen; /* notifications b received (slots used) */
    int last_write;      /* the newest WRITE with data, or -1 */
    vqp_srq_t *srq;      /* b's SENDs land in a shared receive queue */
    bg_t *bg;            /* the second pair, or NULL */
    unsigned signaled_reports;
    int destroying;
    unsigned cb_depth;
    int in_post; /* inside vqp_post_send of operation [posted] */
    /* receiver */
    unsigned imm_posted;       /* WRITE_IMM operations posted */
    unsigned imm_ops[MAX_OPS]; /* their operation indices, in order */
    unsigned notify_slots;     /* notification slots posted on b */
    unsigned notifies;         /* notifications received on b */
    unsigned send_posted;      /* SEND / SEND_IMM operations posted */
    unsigned send_ops[MAX_OPS];
    unsigned recv_posted; /* receive buffers posted on b */
    unsigned recvs;       /* receives completed on b */
    unsigned fa_posted;   /* fetch-and-add operations posted */
    unsigned fa_ops[MAX_OPS];
} trial_t;

static int verbose;

static void trial_describe(const trial_t *t, char *buf, size_t max)
{
    snprintf(buf, max,
             "seed %" PRIu64 ": %u QPs on %u devices %s%s, frag %" PRIu64
             " stripe %" PRIu64
             ", max_outstanding %u, max_ops %u, CQ %u covers %u, %s%s%s%s, "
             "%u kills at "
             "ops "
             "%u%s %u%s %u%s, send QP kill at %d, %u ops%s%s",
             t->seed, t->num_qps, t->num_devs,
             (t->lb == VQP_LB_DQPLB) ? "dqplb" : "spray",
             (t->srq != NULL) ? " (b on an SRQ)" : "", t->frag_size,
             t->stripe_threshold, t->max_outstanding, t->max_ops, t->cqe,
             t->max_covers, t->use_cb ? "callback" : "poll",
             t->reorder ? ", reorder" : "", t->exec_auto ? ", exec auto" : "",
             t->delays ? ", delays" : "", t->kills, t->kill_at[0],
             t->kill_b[0] ? "b" : "", t->kill_at[1], t->kill_b[1] ? "b" : "",
             t->kill_at[2], t->kill_b[2] ? "b" : "", t->kill_send_at,
             t->ops_target,
             t->bad_ops ? ", bad keys"
             : t->chaos ? ", random transport errors"
                        : "",
             t->destroy_end  ? ", destroy in flight"
             : t->cancel_end ? ", cancel in flight"
                             : "");
}

/* Fail with the trial's seed and configuration in the message. */
static void trial_fail(const trial_t *t, const char *fmt, ...)
{
    char what[256], conf[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    trial_describe(t, conf, sizeof(conf));
    fail_msg("%s [%s%s; posted %u, reports %u, last %" PRId64 "]", what, conf,
             (t->bg != NULL) ? ", a second pair" : "", t->posted, t->reports,
             t->last_report);
}

#define CHECK(_t, _cond, ...)              \
    do {                                   \
        if (!(_cond)) {                    \
            trial_fail((_t), __VA_ARGS__); \
        }                                  \
    } while (0)

/* The bytes of operation @a id's data: a pattern that differs by id. */
static void pattern(char *dst, uint64_t len, unsigned id)
{
    uint64_t i;

    for (i = 0; i < len; ++i) {
        dst[i] = (char)((i * 131u) ^ (id * 29u) ^ (i >> 9) ^ 0x5c);
    }
}

static int pattern_ok(const char *p, uint64_t len, unsigned id)
{
    uint64_t i;

    for (i = 0; i < len; ++i) {
        if (p[i] != (char)((i * 131u) ^ (id * 29u) ^ (i >> 9) ^ 0x5c)) {
            return 0;
        }
    }
    return 1;
}

static void side_open(trial_t *t, side_t *s, const char *faults)
{
    vqp_cq_params_t cqp;
    unsigned d;

    memset(s, 0, sizeof(*s));
    s->num_devs = t->num_devs;
    s->buf      = aligned_alloc(4096, BUF_SIZE);
    assert_non_null(s->buf);
    memset(s->buf, 0, BUF_SIZE);
    vqp_cq_params_default(&cqp);
    for (d = 0; d < s->num_devs; ++d) {
        if (faults != NULL) {
            setenv("VQP_SW_FAULTS", faults, 1);
        } else {
            unsetenv("VQP_SW_FAULTS");
        }
        setenv("VQP_SW_EXEC", t->exec_auto ? "auto" : "progress", 1);
        assert_int_equal(vqp_dev_open(VQP_DEV_SW_NAME, NULL, &s->dev[d]),
                         UCS_OK);
        unsetenv("VQP_SW_FAULTS");
        unsetenv("VQP_SW_EXEC");
        assert_int_equal(vqp_dev_mr_reg(s->dev[d], s->buf, BUF_SIZE,
                                        IBV_ACCESS_LOCAL_WRITE |
                                            IBV_ACCESS_REMOTE_WRITE |
                                            IBV_ACCESS_REMOTE_READ |
                                            IBV_ACCESS_REMOTE_ATOMIC,
                                        &s->mr[d], &s->lkey[d], &s->rkey[d]),
                         UCS_OK);
        cqp.devs[d] = s->dev[d];
    }
    cqp.num_devs = s->num_devs;
    cqp.max_poll = 1 + rng_below(&t->rng, 64);
    if (t->cqe != 0) {
        cqp.cqe = t->cqe;
    }
    if (t->max_covers != 0) {
        cqp.max_covers = t->max_covers;
    }
    assert_int_equal(vqp_cq_create(&cqp, &s->cq), UCS_OK);
}

static void side_close(side_t *s)
{
    unsigned d;

    if (s->vqp != NULL) {
        vqp_destroy(s->vqp);
        s->vqp = NULL;
    }
    assert_int_equal(vqp_cq_destroy(s->cq), UCS_OK);
    for (d = 0; d < s->num_devs; ++d) {
        assert_int_equal(vqp_dev_mr_dereg(s->mr[d]), UCS_OK);
        assert_int_equal(vqp_dev_close(s->dev[d]), UCS_OK);
    }
    free(s->buf);
}

/* The keys of @a wr for a's buffer (local) and b's (remote). */
static void set_keys(const trial_t *t, vqp_send_wr_t *wr)
{
    unsigned d;

    for (d = 0; d < t->num_devs; ++d) {
        wr->lkey[d] = t->a.lkey[d];
        wr->rkey[d] = t->b.rkey[d];
    }
}

static void post_one(trial_t *t);

/* Operations that may fail once a's send QP was killed: SENDs and atomics
 * have no other QP, an inline one is not replayed, and a PROBE fails when
 * no SEND can reach the peer. The idempotent ones are replayed. */
static int op_may_fail(const trial_t *t, const model_op_t *op)
{
    if (t->bad_posted) {
        /* Its QPs die (a remote access error is not replayed): with the
         * last data QP or the send QP gone, others fail too. */
        return 1;
    }
    if (!t->send_killed) {
        return 0;
    }
    switch (op->opcode) {
    case VQP_OP_SEND:
    case VQP_OP_SEND_IMM:
    case VQP_OP_PROBE:
        return 1;
    default:
        return ((op->opcode >= VQP_OP_ATOMIC_FA) &&
                (op->opcode <= VQP_OP_ATOMIC_XOR)) ||
               ((op->flags & VQP_SEND_INLINE) != 0);
    }
}

/* An atomic on a word of its own: the old value returned in host order
 * (4 bytes written for a 4-byte one), the new value in place. */
static void check_atomic(trial_t *t, unsigned id)
{
    const model_op_t *op = &t->ops[id];
    uint64_t res = 0, word = 0;

    if (op->len == 4) {
        uint32_t r32, w32;

        memcpy(&r32, t->a.buf + op->loff, 4);
        memcpy(&w32, t->b.buf + op->roff, 4);
        res  = r32;
        word = w32;
        CHECK(t, *(uint32_t *)(t->a.buf + op->loff + 4) == 0xdeadbeefu,
              "4-byte atomic %u wrote 8 bytes of its result", id);
        CHECK(t, *(uint32_t *)(t->b.buf + op->roff + 4) == 0xfeedf00du,
              "4-byte atomic %u changed the next 4 bytes", id);
    } else {
        memcpy(&res, t->a.buf + op->loff, 8);
        memcpy(&word, t->b.buf + op->roff, 8);
    }
    CHECK(t, res == op->atomic_old,
          "atomic %u (opcode %d, %" PRIu64 " bytes) returned 0x%" PRIx64
          ", not 0x%" PRIx64,
          id, op->opcode, op->len, res, op->atomic_old);
    CHECK(t, word == op->atomic_new,
          "atomic %u (opcode %d, %" PRIu64 " bytes) left 0x%" PRIx64
          ", not 0x%" PRIx64,
          id, op->opcode, op->len, word, op->atomic_new);
}

/* A report on a (callback or poll): the contract's checks. */
static void on_report(trial_t *t, const vqp_wc_t *wc)
{
    model_op_t *op;
    uint64_t id = wc->wr_id;

    CHECK(t, (id < t->posted) || (t->in_post && (id == t->posted)),
          "report of wr_id %" PRIu64 " never posted (opcode %d)", id,
          wc->opcode);
    op = &t->ops[id];
    CHECK(t, op->reports == 0, "wr_id %" PRIu64 " reported twice", id);
    CHECK(t, (int64_t)id > t->last_report,
          "wr_id %" PRIu64 " reported after %" PRId64 " (posting order)", id,
          t->last_report);
    CHECK(t, wc->opcode == op->opcode, "wr_id %" PRIu64 ": opcode %d, not %d",
          id, wc->opcode, op->opcode);
    op->reports    = 1;
    op->status     = wc->status;
    t->last_report = (int64_t)id;
    ++t->reports;
    if (!(op->flags & VQP_SEND_SIGNALED)) {
        CHECK(t, wc->status != UCS_OK,
              "unsignaled wr_id %" PRIu64 " reported with success", id);
        ++t->unsig_failed;
    } else {
        ++t->signaled_reports;
    }
    if (t->destroying) {
        CHECK(t, (wc->status == UCS_OK) || (wc->status == UCS_ERR_CANCELED),
              "wr_id %" PRIu64 " at destroy or cancel: %s", id,
              ucs_status_string(wc->status));
        return;
    }
    CHECK(t, !op->bad || (wc->status != UCS_OK),
          "wr_id %" PRIu64 " with a bad key succeeded", id);
    if ((wc->status != UCS_OK) && op_may_fail(t, op)) {
        return;
    }
    CHECK(t, wc->status == UCS_OK, "wr_id %" PRIu64 " (opcode %d) failed: %s",
          id, op->opcode, ucs_status_string(wc->status));
    if ((op->opcode != VQP_OP_FLUSH) && (op->opcode != VQP_OP_PROBE)) {
        CHECK(t, wc->byte_len == op->len,
              "wr_id %" PRIu64 ": byte_len %" PRIu64 ", not %" PRIu64, id,
              wc->byte_len, op->len);
    }
    /* The data is in place when the report comes. */
    switch (op->opcode) {
    case VQP_OP_WRITE:
    case VQP_OP_WRITE_IMM:
        CHECK(t, pattern_ok(t->b.buf + op->roff, op->len, (unsigned)id),
              "wr_id %" PRIu64 ": WRITE of %" PRIu64 " bytes not in place", id,
              op->len);
        break;
    case VQP_OP_READ:
        if (op->fence_read && (t->ops[op->data_id].status != UCS_OK)) {
            break; /* what it reads back never got there */
        }
        CHECK(t, pattern_ok(t->a.buf + op->loff, op->len, op->data_id),
              "wr_id %" PRIu64 ": READ of %" PRIu64 " bytes not in place%s", id,
              op->len,
              op->fence_read ? " (fenced, after the WRITE it reads)" : "");
        break;
    case VQP_OP_ATOMIC_CS:
    case VQP_OP_ATOMIC_SWAP:
    case VQP_OP_ATOMIC_AND:
    case VQP_OP_ATOMIC_OR:
    case VQP_OP_ATOMIC_XOR:
        check_atomic(t, (unsigned)id);
        break;
    default:
        break;
    }
}

static void trial_cb(void *arg, const vqp_wc_t *wc)
{
    trial_t *t = arg;

    CHECK(t, wc->vqp == t->a.vqp, "callback with another virtual QP");
    on_report(t, wc);
    /* Posts from inside the report, sometimes several deep. */
    if (!t->destroying && !t->in_post && (t->posted < t->ops_target) &&
        (t->cb_depth < 3) && rng_pct(&t->rng, 15)) {
        ++t->cb_depth;
        post_one(t);
        --t->cb_depth;
    }
}

/* A report of the second pair: once, in order, its data in place. */
static void bg_report(trial_t *t, const vqp_wc_t *wc)
{
    bg_t *bg    = t->bg;
    uint64_t id = wc->wr_id;

    CHECK(t, wc->vqp == bg->a, "second pair: report of another virtual QP");
    CHECK(t, id < bg->posted, "second pair: wr_id %" PRIu64 " never posted",
          id);
    CHECK(t, !bg->rep[id], "second pair: wr_id %" PRIu64 " reported twice", id);
    CHECK(t, (int64_t)id > bg->last,
          "second pair: wr_id %" PRIu64 " after %" PRId64, id, bg->last);
    bg->rep[id] = 1;
    bg->last    = (int64_t)id;
    bg->reported += bg->sig[id];
    if ((wc->status != UCS_OK) && t->chaos) {
        bg->failed[id] = 1; /* its device injects errors too */
        return;
    }
    CHECK(t, wc->status == UCS_OK, "second pair: wr_id %" PRIu64 " failed: %s",
          id, ucs_status_string(wc->status));
    CHECK(t, bg->sig[id], "second pair: unsignaled wr_id %" PRIu64 " reported",
          id);
    CHECK(t,
          pattern_ok(t->b.buf + bg->off[id], bg->len[id], BG_ID + (unsigned)id),
          "second pair: WRITE %" PRIu64 " not in place at its report", id);
}

static void bg_cb(void *arg, const vqp_wc_t *wc)
{
    bg_report(arg, wc);
}

/* The receiver: notifications and receives in order, buffers reposted. */
static void post_recv_buf(trial_t *t)
{
    vqp_recv_wr_t rwr = {0};
    unsigned slot     = t->recv_posted % RECV_BUFS;

    rwr.wr_id   = t->recv_posted;
    rwr.addr    = (uintptr_t)t->b.buf + RECV_OFF + (uint64_t)slot * RECV_LEN;
    rwr.length  = RECV_LEN;
    rwr.lkey[0] = t->b.lkey[0];
    rwr.lkey[1] = t->b.lkey[1];
    memset(t->b.buf + RECV_OFF + (uint64_t)slot * RECV_LEN, 0xa5, RECV_LEN);
    CHECK(t,
          ((t->srq != NULL) ? vqp_srq_post_recv(t->srq, &rwr)
                            : vqp_post_recv(t->b.vqp, &rwr)) == UCS_OK,
          "receive post failed");
    ++t->recv_posted;
}

static void post_notify_slot(trial_t *t)
{
    vqp_recv_wr_t rwr = {0};

    rwr.wr_id = 1000000 + t->notify_slots;
    CHECK(t, vqp_post_recv(t->b.vqp, &rwr) == UCS_OK, "slot post failed");
    ++t->notify_slots;
}

static void on_b_wc(trial_t *t, const vqp_wc_t *wc)
{
    const model_op_t *op;
    unsigned id, slot;

    if ((wc->opcode == VQP_OP_RECV_NOTIFY) && (t->num_qps > 1)) {
        CHECK(t, wc->wr_id == 1000000 + t->notif_seen,
              "notification %u in slot %" PRIu64, t->notif_seen, wc->wr_id);
        ++t->notif_seen;
        if (wc->status != UCS_OK) {
            /* DQPLB: a WRITE_IMM whose data failed for good is notified as
             * failed, in its place; and once b has no data QP left, every
             * slot it holds fails. */
            CHECK(t, t->bad_posted || t->destroying,
                  "notification %u failed: %s", t->notif_seen - 1,
                  ucs_status_string(wc->status));
            ++t->notifies;
            return;
        }
        CHECK(t, t->notifies < t->imm_posted, "notification never sent");
        /* SPRAY notifies nothing for a WRITE_IMM whose data failed. */
        while (t->bad_posted && (t->notifies + 1 < t->imm_posted) &&
               (t->ops[t->imm_ops[t->notifies]].imm != wc->imm)) {
            ++t->notifies;
        }
        id = t->imm_ops[t->notifies];
        op = &t->ops[id];
        CHECK(t, (wc->flags & VQP_WC_WITH_IMM) && (wc->imm == op->imm),
              "notification %u: imm 0x%x, not 0x%x", t->notifies, wc->imm,
              op->imm);
        CHECK(t, pattern_ok(t->b.buf + op->roff, op->len, id),
              "WRITE_IMM %u: data not in place at its notification", id);
        ++t->notifies;
        return;
    }
    if ((wc->status != UCS_OK) && (t->bad_posted || t->destroying)) {
        /* The responder's QP failed too (a remote access error ends it on
         * both sides): its receives are flushed. */
        return;
    }
    CHECK(t, wc->status == UCS_OK, "receiver completion failed: %s",
          ucs_status_string(wc->status));
    /* A receive buffer: SENDs, and with one QP also WRITE_IMMs, take the
     * next one in the order they were posted. */
    CHECK(t, t->recvs < t->send_posted, "receive of a SEND never sent");
    CHECK(t, wc->wr_id == t->recvs, "receive %u in buffer %" PRIu64, t->recvs,
          wc->wr_id);
    id   = t->send_ops[t->recvs];
    op   = &t->ops[id];
    slot = t->recvs % RECV_BUFS;
    if (op->opcode == VQP_OP_WRITE_IMM) {
        CHECK(t, wc->opcode == VQP_OP_RECV_NOTIFY,
              "WRITE_IMM %u: receiver opcode %d", id, wc->opcode);
        CHECK(t, wc->byte_len == 0, "WRITE_IMM %u: byte_len %" PRIu64, id,
              wc->byte_len);
        CHECK(t, (wc->flags & VQP_WC_WITH_IMM) && (wc->imm == op->imm),
              "WRITE_IMM %u: imm 0x%x, not 0x%x", id, wc->imm, op->imm);
        CHECK(t, pattern_ok(t->b.buf + op->roff, op->len, id),
              "WRITE_IMM %u: data not in place at its notification", id);
        ++t->recvs;
        post_recv_buf(t);
        return;
    }
    CHECK(t, wc->opcode == VQP_OP_RECV, "receiver opcode %d", wc->opcode);
    CHECK(t, wc->byte_len == op->len,
          "SEND %u: %" PRIu64 " bytes, not %" PRIu64, id, wc->byte_len,
          op->len);
    CHECK(t,
          pattern_ok(t->b.buf + RECV_OFF + (uint64_t)slot * RECV_LEN, op->len,
                     id),
          "SEND %u: data differs", id);
    if (op->opcode == VQP_OP_SEND_IMM) {
        CHECK(t, (wc->flags & VQP_WC_WITH_IMM) && (wc->imm == op->imm),
              "SEND_IMM %u: imm 0x%x, not 0x%x", id, wc->imm, op->imm);
    }
    ++t->recvs;
    post_recv_buf(t);
}

/* b's completions by callback (a virtual QP on an SRQ takes no other). */
static void b_cb(void *arg, const vqp_wc_t *wc)
{
    trial_t *t = arg;

    CHECK(t, wc->vqp == t->b.vqp, "b's callback with another virtual QP");
    on_b_wc(t, wc);
}

/* One progress round of both sides, polling random batch sizes. */
static unsigned progress(trial_t *t)
{
    vqp_wc_t wcs[64];
    unsigned n, i, got = 0;

    if (t->use_cb) {
        got += vqp_cq_progress(t->a.cq);
    } else {
        n = vqp_cq_poll(t->a.cq, wcs, 1 + rng_below(&t->rng, 64));
        for (i = 0; i < n; ++i) {
            if ((t->bg != NULL) && (wcs[i].vqp == t->bg->a)) {
                bg_report(t, &wcs[i]);
            } else {
                on_report(t, &wcs[i]);
            }
        }
        got += n;
    }
    if (t->srq != NULL) {
        return got + vqp_cq_progress(t->b.cq); /* b_cb */
    }
    n = vqp_cq_poll(t->b.cq, wcs, 1 + rng_below(&t->rng, 64));
    for (i = 0; i < n; ++i) {
        on_b_wc(t, &wcs[i]);
    }
    return got + n;
}

/* A region of @a len bytes in both buffers (8-byte aligned), or 0 when the
 * arena is used up. */
static uint64_t arena_take(trial_t *t, uint64_t len)
{
    uint64_t off = t->arena;

    if (off + len + 8 > BUF_SIZE) {
        return 0;
    }
    t->arena = (off + len + 8 + 7) & ~7ull;
    return off;
}

static uint64_t random_len(trial_t *t)
{
    unsigned k = rng_below(&t->rng, 100);

    if (k < 8) {
        return 0;
    } else if (k < 35) {
        return 1 + rng_below(&t->rng, 128);
    } else if (k < 60) {
        return 1 + rng_below(&t->rng, (unsigned)t->stripe_threshold);
    } else if (k < 85) {
        return t->stripe_threshold +
               rng_below(&t->rng, (unsigned)(4 * t->frag_size));
    }
    return rng_below(&t->rng, (unsigned)(16 * t->frag_size)) + 1;
}

/* Kill the data QPs planned for the operations posted so far: one of a
 * (its fragments in flight are replayed) or of b (a's WQEs to it fail, and
 * are replayed), never the send QP of either side and never the last pair
 * left; and a's send QP when planned. */
static void maybe_kill(trial_t *t)
{
    unsigned first, i, tries;
    vqp_pqp_t *pqp = NULL;
    side_t *s;

    while ((t->killed < t->kills) && (t->posted >= t->kill_at[t->killed])) {
        s = t->kill_b[t->killed] ? &t->b : &t->a;
        /* DQPLB's send QP is the extra one; SPRAY sends on data QP 0. */
        first = (s->vqp->send_qp == &s->vqp->qps[0]) ? 1 : 0;
        for (tries = 0; tries < 64; ++tries) {
            i   = first + rng_below(&t->rng, t->num_qps - first);
            pqp = &s->vqp->qps[i];
            if (!(t->killed_qps & UCS_BIT(i)) && (pqp != s->vqp->send_qp)) {
                break;
            }
        }
        if ((tries < 64) &&
            ((unsigned)ucs_popcount(t->killed_qps) + 1 < t->num_qps - first)) {
            CHECK(t, vqp_dev_qp_set_error(pqp->dev_qp) == UCS_OK,
                  "killing QP %u failed", i);
            t->killed_qps |= UCS_BIT(i);
        }
        ++t->killed;
    }
    if ((t->kill_send_at >= 0) && !t->send_killed &&
        (t->posted >= (unsigned)t->kill_send_at)) {
        CHECK(t, vqp_dev_qp_set_error(t->a.vqp->send_qp->dev_qp) == UCS_OK,
              "killing the send QP failed");
        t->send_killed = 1;
    }
}

/* An atomic other than the shared counter's: its own word at the op's
 * offset in b with a random value, random operands, the model's result. */
static void model_atomic(trial_t *t, model_op_t *op, vqp_send_wr_t *wr)
{
    uint64_t mask = (op->len == 4) ? UINT32_MAX : UINT64_MAX;
    uint64_t old  = rng_next(&t->rng) & mask;
    uint64_t x    = rng_next(&t->rng) & mask, nv;
    uint32_t old32;

    wr->compare_add = x;
    wr->swap        = rng_next(&t->rng) & mask;
    switch (op->opcode) {
    case VQP_OP_ATOMIC_CS:
        if (rng_pct(&t->rng, 50)) {
            wr->compare_add = old; /* a hit */
        }
        nv = (wr->compare_add == old) ? wr->swap : old;
        break;
    case VQP_OP_ATOMIC_SWAP:
        nv = x;
        break;
    case VQP_OP_ATOMIC_AND:
        nv = old & x;
        break;
    case VQP_OP_ATOMIC_OR:
        nv = old | x;
        break;
    default:
        nv = old ^ x;
        break;
    }
    op->atomic_old = old;
    op->atomic_new = nv & mask;
    if (op->len == 4) {
        old32 = (uint32_t)old;
        memcpy(t->b.buf + op->roff, &old32, 4);
        memset(t->a.buf + op->loff, 0x11, 4);
        memcpy(t->a.buf + op->loff + 4, &(uint32_t){0xdeadbeefu}, 4);
        memcpy(t->b.buf + op->roff + 4, &(uint32_t){0xfeedf00du}, 4);
    } else {
        memcpy(t->b.buf + op->roff, &old, 8);
        memset(t->a.buf + op->loff, 0x11, 8);
    }
}

/* vqp_post_send, again after progress while the core has no room; from
 * inside a callback it gives up at once (UCS_ERR_NO_RESOURCE). While one of
 * the main pair's operations is posted, its report may come (a FLUSH with
 * nothing ahead of it), and callbacks post nothing of their own (this one
 * has the next index). */
static ucs_status_t post_retry(trial_t *t, vqp_t *vqp, const vqp_send_wr_t *wr)
{
    ucs_status_t status;
    unsigned tries;

    t->in_post = (vqp == t->a.vqp);
    for (tries = 0; (status = vqp_post_send(vqp, wr)) == UCS_ERR_NO_RESOURCE;
         ++tries) {
        CHECK(t, tries < MAX_STEPS,
              "wr_id %" PRIu64 " (opcode %d, flags 0x%x, %" PRIu64
              " bytes) refused for %u tries (%u in flight)",
              wr->wr_id, wr->opcode, wr->flags, wr->length, tries,
              vqp_ops_in_flight(vqp));
        if (t->cb_depth > 0) {
            break; /* the caller gives this one up and goes on */
        }
        progress(t);
    }
    t->in_post = 0;
    return status;
}

/* A fenced READ of the region the newest WRITE wrote, into a region of
 * its own: the fence makes it start after that WRITE completed, so it reads
 * the WRITE's data, whatever QPs each went on. */
static void post_fenced_read(trial_t *t, unsigned id)
{
    const model_op_t *w = &t->ops[t->last_write];
    model_op_t *op      = &t->ops[id];
    vqp_send_wr_t wr    = {0};
    ucs_status_t status;
    uint64_t off;

    off = arena_take(t, w->len);
    if (off == 0) {
        t->ops_target = id;
        return;
    }
    memset(t->a.buf + off, 0, w->len);
    wr.wr_id  = id;
    wr.opcode = VQP_OP_READ;
    wr.flags  = VQP_SEND_FENCE | (rng_pct(&t->rng, 80) ? VQP_SEND_SIGNALED : 0);
    wr.length = w->len;
    wr.local_addr  = (uintptr_t)t->a.buf + off;
    wr.remote_addr = (uintptr_t)t->b.buf + w->roff;
    set_keys(t, &wr);
    op->opcode     = VQP_OP_READ;
    op->flags      = wr.flags;
    op->loff       = off;
    op->roff       = w->roff;
    op->len        = w->len;
    op->data_id    = (unsigned)t->last_write;
    op->fence_read = 1;
    status         = post_retry(t, t->a.vqp, &wr);
    if (status == UCS_ERR_NO_RESOURCE) {
        return;
    }
    if ((status != UCS_OK) && op_may_fail(t, op)) {
        return;
    }
    CHECK(t, status == UCS_OK, "fenced READ %u failed at the post: %s", id,
          ucs_status_string(status));
    ++t->posted;
    maybe_kill(t);
}

/* Post one random operation (retrying while the core has no room). */
static void post_one(trial_t *t)
{
    unsigned id      = t->posted, k;
    vqp_send_wr_t wr = {0};
    model_op_t *op   = &t->ops[id];
    uint64_t len, off;
    ucs_status_t status;
    uint64_t *res;

    if (id >= t->ops_target) {
        return;
    }
    memset(op, 0, sizeof(*op));
    op->data_id = id;
    if ((t->last_write >= 0) && rng_pct(&t->rng, 4)) {
        post_fenced_read(t, id);
        return;
    }
    k        = rng_below(&t->rng, 100);
    len      = random_len(t);
    wr.flags = rng_pct(&t->rng, 80) ? VQP_SEND_SIGNALED : 0;
    if (rng_pct(&t->rng, 4)) {
        wr.flags |= VQP_SEND_FENCE;
    }
    if (k < 40) {
        wr.opcode = VQP_OP_WRITE;
    } else if (k < 55) {
        wr.opcode = VQP_OP_READ;
    } else if (k < 67) {
        wr.opcode = VQP_OP_WRITE_IMM;
        /* The receiver's window of notifications it keeps; with one QP a
         * WRITE_IMM takes a receive buffer, as a SEND does. */
        if ((t->num_qps > 1) ? ((t->imm_posted - t->notifies) >= 48)
                             : ((t->send_posted - t->recvs) >= RECV_BUFS)) {
            wr.opcode = VQP_OP_WRITE;
        }
    } else if (k < 80) {
        wr.opcode = rng_pct(&t->rng, 50) ? VQP_OP_SEND : VQP_OP_SEND_IMM;
        len       = ucs_min(len, RECV_LEN);
        /* No more SENDs in flight than buffers posted. */
        if ((t->send_posted - t->recvs) >= RECV_BUFS) {
            wr.opcode = VQP_OP_WRITE;
        }
    } else if (k < 86) {
        wr.opcode = VQP_OP_ATOMIC_FA; /* on the shared counter */
        len       = 8;
    } else if (k < 92) {
        wr.opcode = VQP_OP_ATOMIC_CS + rng_below(&t->rng, 5);
        len       = rng_pct(&t->rng, 50) ? 4 : 8;
    } else if (k < 97) {
        wr.opcode = VQP_OP_FLUSH;
        len       = 0;
    } else {
        wr.opcode = VQP_OP_PROBE;
        len       = 0;
    }
    if (((wr.opcode == VQP_OP_WRITE) || (wr.opcode == VQP_OP_SEND) ||
         (wr.opcode == VQP_OP_SEND_IMM)) &&
        (len <= 64) && rng_pct(&t->rng, 40)) {
        wr.flags |= VQP_SEND_INLINE;
    }
    /* FLUSH and PROBE report always. */
    if ((wr.opcode == VQP_OP_FLUSH) || (wr.opcode == VQP_OP_PROBE)) {
        wr.flags |= VQP_SEND_SIGNALED;
        wr.flags &= ~(unsigned)VQP_SEND_FENCE;
    }

    /* a 4-byte atomic's region has room for the guard after its result */
    off =
        arena_take(t, (len == 4) && (wr.opcode >= VQP_OP_ATOMIC_FA) ? 8 : len);
    if ((off == 0) && (len != 0)) {
        t->ops_target = id; /* the arena is used up: the trial ends here */
        return;
    }
    wr.wr_id       = id;
    wr.length      = len;
    wr.local_addr  = (uintptr_t)t->a.buf + off;
    wr.remote_addr = (uintptr_t)t->b.buf + off;
    set_keys(t, &wr);
    wr.imm = (uint32_t)(id * 2654435761u);
    if (t->bad_ops && (len > 0) && (wr.opcode <= VQP_OP_READ) &&
        !(wr.flags & VQP_SEND_INLINE) && rng_pct(&t->rng, 1)) {
        wr.rkey[0] ^= 0x5a5a00; /* on every device it may go to */
        wr.rkey[1] ^= 0x5a5a00;
        op->bad = 1;
    }
    op->opcode = wr.opcode;
    op->flags  = wr.flags;
    op->loff   = off;
    op->roff   = off;
    op->len    = len;
    op->imm    = wr.imm;
    switch (wr.opcode) {
    case VQP_OP_READ:
        pattern(t->b.buf + off, len, id);
        memset(t->a.buf + off, 0, len);
        break;
    case VQP_OP_ATOMIC_FA:
        wr.remote_addr = (uintptr_t)t->b.buf + ATOMIC_OFF;
        wr.compare_add = 1;
        res            = (uint64_t *)(t->a.buf + off);
        *res           = UINT64_MAX;
        break;
    case VQP_OP_ATOMIC_CS:
    case VQP_OP_ATOMIC_SWAP:
    case VQP_OP_ATOMIC_AND:
    case VQP_OP_ATOMIC_OR:
    case VQP_OP_ATOMIC_XOR:
        model_atomic(t, op, &wr);
        break;
    case VQP_OP_WRITE_IMM:
        if ((t->num_qps > 1) && (t->notify_slots - t->notifies < 48)) {
            post_notify_slot(t);
        }
        /* fall through */
    default:
        pattern(t->a.buf + off, len, id);
        break;
    }

    status = post_retry(t, t->a.vqp, &wr);
    if (status == UCS_ERR_NO_RESOURCE) {
        return; /* from a callback: given up */
    }
    if ((status != UCS_OK) && op_may_fail(t, op)) {
        return; /* refused: its QP is gone; not posted */
    }
    CHECK(t, status == UCS_OK, "post of wr_id %u (opcode %d) failed: %s", id,
          wr.opcode, ucs_status_string(status));
    ++t->posted;
    t->bad_posted |= op->bad;
    if ((wr.opcode == VQP_OP_WRITE) && (len > 0) && !op->bad) {
        t->last_write = (int)id;
    }
    if (wr.flags & VQP_SEND_INLINE) {
        /* Copied at the post: what the source holds later does not count. */
        memset(t->a.buf + off, 0xee, len);
        op->inl_scribbled = 1;
    }
    switch (wr.opcode) {
    case VQP_OP_WRITE_IMM:
        if (t->num_qps > 1) {
            t->imm_ops[t->imm_posted++] = id;
        } else {
            t->send_ops[t->send_posted++] = id;
        }
        break;
    case VQP_OP_SEND:
    case VQP_OP_SEND_IMM:
        t->send_ops[t->send_posted++] = id;
        break;
    case VQP_OP_ATOMIC_FA:
        t->fa_ops[t->fa_posted++] = id;
        break;
    default:
        break;
    }
    maybe_kill(t);
}

/* A signaled FLUSH as the last operation. */
static void post_flush(trial_t *t)
{
    vqp_send_wr_t wr = {0};
    ucs_status_t status;

    CHECK(t, t->posted < MAX_OPS, "no room for the final FLUSH");
    memset(&t->ops[t->posted], 0, sizeof(t->ops[0]));
    wr.wr_id                 = t->posted;
    wr.opcode                = VQP_OP_FLUSH;
    wr.flags                 = VQP_SEND_SIGNALED;
    t->ops[t->posted].opcode = VQP_OP_FLUSH;
    t->ops[t->posted].flags  = wr.flags;
    status                   = post_retry(t, t->a.vqp, &wr);
    if ((status != UCS_OK) && t->bad_posted) {
        if (verbose) {
            print_message("final FLUSH refused: %s\n",
                          ucs_status_string(status));
        }
        return; /* no data QP is left: everything fails, nothing to cover */
    }
    CHECK(t, status == UCS_OK, "final FLUSH failed: %s",
          ucs_status_string(status));
    ++t->posted;
}

static void bg_create(trial_t *t, const vqp_params_t *tmpl);

static void trial_setup(trial_t *t, uint64_t seed)
{
    static const uint64_t frag_sizes[] = {4096, 8192, 16384};
    static const unsigned qps[]        = {1, 2, 3, 4, 5, 8};
    char faults[128], conf[512];
    vqp_params_t params;
    char addr_a[4096], addr_b[4096];
    size_t len_a, len_b;
    ucs_status_t status;
    unsigned i;

    memset(t, 0, sizeof(*t));
    t->seed        = seed;
    t->rng.s       = seed * 0x2545f4914f6cdd1dull + 1;
    t->last_report = -1;
    t->last_write  = -1;
    t->num_qps     = qps[rng_below(&t->rng, ucs_static_array_size(qps))];
    t->num_devs    = rng_pct(&t->rng, 25) ? 2 : 1;
    t->cqe         = rng_pct(&t->rng, 30) ? (64u << rng_below(&t->rng, 3)) : 0;
    /* Half the small CQs keep 1..4 cover entries, fewer than their QPs:
     * covers wait for others' CQEs. From the seed, not the generator, so
     * the other draws of a seed stay as they were. */
    t->max_covers = ((t->cqe != 0) && (seed & 1)) ? 1 + (seed >> 1) % 4 : 0;
    t->lb         = rng_pct(&t->rng, 50) ? VQP_LB_DQPLB : VQP_LB_SPRAY;
    t->frag_size  = frag_sizes[rng_below(&t->rng, 3)];
    t->stripe_threshold = t->frag_size >> rng_below(&t->rng, 3);
    t->max_outstanding  = 2u << rng_below(&t->rng, 4); /* 2..16 */
    t->max_ops          = 8u << rng_below(&t->rng, 5); /* 8..128 */
    t->use_cb           = rng_pct(&t->rng, 60);
    t->reorder          = rng_pct(&t->rng, 40);
    t->exec_auto        = rng_pct(&t->rng, 25);
    t->ops_target       = 150 + rng_below(&t->rng, MAX_OPS - 151);
    t->arena            = ARENA_OFF;
    if ((t->num_qps >= 2) && rng_pct(&t->rng, 40)) {
        t->kills = 1 + rng_below(&t->rng, t->num_qps - 1);
        t->kills = ucs_min(t->kills, 3u);
        for (i = 0; i < t->kills; ++i) {
            t->kill_at[i] = rng_below(&t->rng, t->ops_target);
            t->kill_b[i]  = rng_pct(&t->rng, 35);
        }
        /* in order of the operation index */
        for (i = 1; i < t->kills; ++i) {
            if (t->kill_at[i] < t->kill_at[i - 1]) {
                uint32_t x = t->kill_at[i];
                uint8_t b  = t->kill_b[i];

                t->kill_at[i]     = t->kill_at[i - 1];
                t->kill_at[i - 1] = x;
                t->kill_b[i]      = t->kill_b[i - 1];
                t->kill_b[i - 1]  = b;
                i                 = 0;
            }
        }
    }
    t->kill_send_at = -1;
    if ((t->num_qps >= 2) && rng_pct(&t->rng, 12)) {
        t->kill_send_at = (int)rng_below(&t->rng, t->ops_target);
    }
    t->delays  = rng_pct(&t->rng, 20);
    t->bad_ops = (t->num_qps >= 2) && rng_pct(&t->rng, 15);
    /* Transport errors on random WQEs of the sender's device (any QP, the
     * send QP's included): from the start anything may fail. */
    t->chaos       = (t->num_qps >= 2) && rng_pct(&t->rng, 12);
    t->bad_posted  = t->chaos;
    t->destroy_end = t->use_cb && rng_pct(&t->rng, 20);
    t->cancel_end  = !t->destroy_end && rng_pct(&t->rng, 12);
    if (verbose) {
        trial_describe(t, conf, sizeof(conf));
        print_message("trial %s\n", conf);
    }

    snprintf(faults, sizeof(faults), "seed=%" PRIu64 "%s%s%s", seed,
             t->reorder ? ",reorder=0.3" : "",
             t->delays ? ",delay_us=20,delay_prob=0.02" : "",
             t->chaos ? ",err_prob=0.002:0x15" : "");
    side_open(t, &t->a, (t->reorder || t->delays || t->chaos) ? faults : NULL);
    side_open(t, &t->b, NULL);

    vqp_params_default(&params);
    params.num_qps          = t->num_qps;
    params.lb               = t->lb;
    params.frag_size        = t->frag_size;
    params.stripe_threshold = t->stripe_threshold;
    params.max_outstanding  = t->max_outstanding;
    params.max_ops          = t->max_ops;
    params.max_recvs        = 64;
    /* A WQE to a killed peer QP fails after 3 retries of 262 us, not of a
     * default timeout meant for real networks. */
    params.connect.timeout   = 6;
    params.connect.retry_cnt = 3;
    params.cq                = t->a.cq;
    if (t->use_cb) {
        params.comp_cb  = trial_cb;
        params.comp_arg = t;
    }
    status = vqp_create(&params, &t->a.vqp);
    if ((status == UCS_ERR_EXCEEDS_LIMIT) && (t->cqe != 0)) {
        /* the receives it reserves do not fit: a CQ of the default size */
        vqp_cq_params_t cqp;
        unsigned d;

        vqp_cq_params_default(&cqp);
        for (side_t *sd = &t->a; sd != NULL;
             sd         = (sd == &t->a) ? &t->b : NULL) {
            assert_int_equal(vqp_cq_destroy(sd->cq), UCS_OK);
            for (d = 0; d < sd->num_devs; ++d) {
                cqp.devs[d] = sd->dev[d];
            }
            cqp.num_devs = sd->num_devs;
            assert_int_equal(vqp_cq_create(&cqp, &sd->cq), UCS_OK);
        }
        if (verbose) {
            print_message("CQ of %u entries too small: the default\n", t->cqe);
        }
        t->cqe        = 0;
        t->max_covers = 0;
        params.cq     = t->a.cq;
        status        = vqp_create(&params, &t->a.vqp);
    }
    assert_int_equal(status, UCS_OK);
    params.cq      = t->b.cq;
    params.comp_cb = NULL;
    if (rng_pct(&t->rng, 30)) {
        assert_int_equal(vqp_srq_create(t->b.cq, RECV_BUFS, &t->srq), UCS_OK);
        params.srq      = t->srq;
        params.comp_cb  = b_cb;
        params.comp_arg = t;
    }
    assert_int_equal(vqp_create(&params, &t->b.vqp), UCS_OK);
    assert_int_equal(vqp_address_pack(t->a.vqp, addr_a, sizeof(addr_a), &len_a),
                     UCS_OK);
    assert_int_equal(vqp_address_pack(t->b.vqp, addr_b, sizeof(addr_b), &len_b),
                     UCS_OK);
    assert_int_equal(vqp_connect(t->a.vqp, addr_b, len_b), UCS_OK);
    assert_int_equal(vqp_connect(t->b.vqp, addr_a, len_a), UCS_OK);
    for (i = 0; i < RECV_BUFS; ++i) {
        post_recv_buf(t);
    }
    if (rng_pct(&t->rng, 35)) {
        bg_create(t, &params);
    }
}

static void dump_vqp(const vqp_t *vqp)
{
    const vqp_pqp_t *q;
    const vqp_op_t *op;
    unsigned i;

    fprintf(stderr,
            "vqp: ops head %u disp %u tail %u, replay %u..%u, fatal %d, "
            "canceling %d, fast_ops 0x%x, alive %u, credit_wait %d, dirty %d\n",
            vqp->op_head, vqp->op_disp, vqp->op_tail, vqp->replay_head,
            vqp->replay_tail, vqp->fatal, vqp->canceling, vqp->fast_ops,
            vqp->alive, vqp->credit_wait, vqp->dirty);
    for (i = 0; i < vqp->num_pqps; ++i) {
        q = &vqp->qps[i];
        fprintf(stderr,
                "  qp %u 0x%x role %d alive %d err %d frags %u..%u limit %u "
                "sq pi %u ci %u credits %d\n",
                i, q->qpn, q->role, q->alive, q->error, q->frag_head,
                q->frag_tail, q->frag_limit, q->tx.pi, q->tx.ci,
                q->cdev->credits);
    }
    for (i = vqp->op_head; i != vqp->op_tail; ++i) {
        op = &vqp->ops[i & vqp->op_mask];
        fprintf(stderr,
                "  op %u wr_id %" PRIu64 " opcode %d flags 0x%x status %d "
                "remaining %u nfrags %u posted %u\n",
                i, op->wr_id, op->opcode, op->flags, op->status, op->remaining,
                op->nfrags, op->posted);
    }
}

/* Everything posted reported, received, and the data in place. */
static void trial_drain_and_check(trial_t *t)
{
    unsigned steps, i, want_reports = 0, id, want_recvs, fa_ok = 0;
    uint64_t *counter, *seen;
    const model_op_t *op;
    vqp_stats_t stats;

    /* An unsignaled operation completes when a later CQE covers it: a
     * FLUSH at the end covers every one (vqp_ops_in_flight then 0). */
    post_flush(t);
    for (i = 0; i < t->posted; ++i) {
        want_reports += (t->ops[i].flags & VQP_SEND_SIGNALED) ? 1 : 0;
    }
    for (steps = 0; steps < MAX_STEPS; ++steps) {
        progress(t);
        if ((t->signaled_reports == want_reports) &&
            (vqp_ops_in_flight(t->a.vqp) == 0) &&
            (t->bad_posted || (t->notifies == t->imm_posted)) &&
            (t->send_killed || t->bad_posted || (t->recvs == t->send_posted))) {
            break;
        }
        if ((steps & 255) == 255) {
            sched_yield();
        }
    }
    if (steps >= MAX_STEPS) {
        dump_vqp(t->a.vqp);
    }
    CHECK(t, steps < MAX_STEPS,
          "drain timed out: %u of %u reports, %u in flight, %u/%u "
          "notifications, %u/%u receives",
          t->signaled_reports, want_reports, vqp_ops_in_flight(t->a.vqp),
          t->notifies, t->imm_posted, t->recvs, t->send_posted);
    /* Nothing more comes. */
    for (steps = 0; steps < 200; ++steps) {
        progress(t);
    }
    CHECK(t, t->signaled_reports == want_reports, "%u reports, %u expected",
          t->signaled_reports, want_reports);
    CHECK(t, t->send_killed || t->bad_posted || (t->unsig_failed == 0),
          "%u unsignaled operations failed", t->unsig_failed);
    /* Every SEND reported done arrived (a failed one may have or not; the
     * ones after it could not). */
    for (want_recvs = t->send_posted; want_recvs > 0; --want_recvs) {
        op = &t->ops[t->send_ops[want_recvs - 1]];
        if (op->reports && (op->status == UCS_OK)) {
            break;
        }
    }
    CHECK(t, t->recvs >= want_recvs, "%u receives, SEND %u succeeded", t->recvs,
          want_recvs);

    for (id = 0; id < t->posted; ++id) {
        op = &t->ops[id];
        switch (op->opcode) {
        case VQP_OP_WRITE:
        case VQP_OP_WRITE_IMM:
            if ((op->status != UCS_OK) && op_may_fail(t, op)) {
                break;
            }
            CHECK(t, pattern_ok(t->b.buf + op->roff, op->len, id),
                  "WRITE %u (%" PRIu64 " bytes%s) not in place at the end", id,
                  op->len, op->inl_scribbled ? ", inline" : "");
            break;
        case VQP_OP_READ:
            if (((op->status != UCS_OK) && op_may_fail(t, op)) ||
                (op->fence_read && (t->ops[op->data_id].status != UCS_OK))) {
                break;
            }
            CHECK(t, pattern_ok(t->a.buf + op->loff, op->len, op->data_id),
                  "READ %u (%" PRIu64 " bytes) not in place at the end", id,
                  op->len);
            break;
        case VQP_OP_ATOMIC_CS:
        case VQP_OP_ATOMIC_SWAP:
        case VQP_OP_ATOMIC_AND:
        case VQP_OP_ATOMIC_OR:
        case VQP_OP_ATOMIC_XOR:
            if ((op->status == UCS_OK) || !op_may_fail(t, op)) {
                check_atomic(t, id);
            }
            break;
        default:
            break;
        }
    }
    /* Fetch-and-add of 1: results below the counter, once each; the
     * counter counts them all, and at most the failed ones besides. */
    counter = (uint64_t *)(t->b.buf + ATOMIC_OFF);
    CHECK(t, *counter <= t->fa_posted, "counter %" PRIu64 " after %u adds",
          *counter, t->fa_posted);
    seen = calloc(t->fa_posted + 1, sizeof(*seen));
    assert_non_null(seen);
    for (i = 0; i < t->fa_posted; ++i) {
        const model_op_t *fa = &t->ops[t->fa_ops[i]];
        uint64_t r           = *(uint64_t *)(t->a.buf + fa->loff);

        if ((fa->status != UCS_OK) && op_may_fail(t, fa)) {
            continue;
        }
        CHECK(t, (r < *counter) && !seen[r],
              "fetch-and-add %u returned %" PRIu64, t->fa_ops[i], r);
        seen[r] = 1;
        ++fa_ok;
    }
    free(seen);
    CHECK(t, t->send_killed || t->bad_posted || (*counter == fa_ok),
          "counter %" PRIu64 " after %u adds", *counter, fa_ok);

    /* Every WQE counted once: a fragment counted after its operation's
     * report would leave its slot's count below zero. */
    for (i = 0; i <= t->a.vqp->op_mask; ++i) {
        CHECK(t, t->a.vqp->ops[i].remaining == 0,
              "operation slot %u: %u WQEs left after the drain", i,
              t->a.vqp->ops[i].remaining);
    }
    vqp_query_stats(t->a.vqp, &stats);
    if (verbose) {
        print_message("  %" PRIu64 " credit waits, %" PRIu64
                      " cover waits, %" PRIu64 " replays\n",
                      stats.credit_waits, stats.cover_waits,
                      stats.frags_replayed);
    }
    CHECK(t, stats.ops_posted == t->posted, "stats: %" PRIu64 " posted, not %u",
          stats.ops_posted, t->posted);
    CHECK(t, stats.ops_completed == t->posted,
          "stats: %" PRIu64 " completed, not %u", stats.ops_completed,
          t->posted);
    for (id = 0; id < t->posted; ++id) {
        CHECK(t, !t->ops[id].bad || (t->ops[id].reports == 1),
              "wr_id %u with a bad key was not reported", id);
    }
    if ((t->killed_qps == 0) && !t->send_killed && !t->bad_posted) {
        CHECK(t, stats.frags_replayed == 0, "%" PRIu64 " replays, no kill",
              stats.frags_replayed);
    }
}

/* Destroy a with operations in flight: each unreported one once. */
static void trial_destroy_in_flight(trial_t *t)
{
    unsigned i, reported_before = t->reports;

    (void)reported_before;
    t->destroying = 1;
    vqp_destroy(t->a.vqp);
    t->a.vqp = NULL;
    for (i = 0; i < t->posted; ++i) {
        if (t->ops[i].flags & VQP_SEND_SIGNALED) {
            CHECK(t, t->ops[i].reports == 1,
                  "wr_id %u not reported by the destroy", i);
        }
    }
}

/* vqp_cancel with operations in flight: each reported once, done or
 * canceled; later posts fail; then nothing is in flight. */
static void trial_cancel_in_flight(trial_t *t)
{
    vqp_send_wr_t wr = {0};
    unsigned i, steps, want = 0;

    for (i = rng_below(&t->rng, 20); i > 0; --i) {
        progress(t);
    }
    t->destroying = 1;
    vqp_cancel(t->a.vqp);
    wr.opcode      = VQP_OP_WRITE;
    wr.flags       = VQP_SEND_SIGNALED;
    wr.wr_id       = t->posted;
    wr.length      = 8;
    wr.local_addr  = (uintptr_t)t->a.buf + ARENA_OFF;
    wr.remote_addr = (uintptr_t)t->b.buf + ARENA_OFF;
    set_keys(t, &wr);
    CHECK(t, vqp_post_send(t->a.vqp, &wr) != UCS_OK,
          "a post after vqp_cancel was accepted");
    for (i = 0; i < t->posted; ++i) {
        want += (t->ops[i].flags & VQP_SEND_SIGNALED) ? 1 : 0;
    }
    for (steps = 0; (steps < MAX_STEPS) && ((t->signaled_reports < want) ||
                                            (vqp_ops_in_flight(t->a.vqp) != 0));
         ++steps) {
        progress(t);
    }
    if (steps >= MAX_STEPS) {
        dump_vqp(t->a.vqp);
    }
    CHECK(t, steps < MAX_STEPS,
          "cancel: %u of %u reports, %u in flight after %u steps",
          t->signaled_reports, want, vqp_ops_in_flight(t->a.vqp), steps);
    for (steps = 0; steps < 200; ++steps) {
        progress(t);
    }
    CHECK(t, t->signaled_reports == want, "cancel: %u reports, %u expected",
          t->signaled_reports, want);
    for (i = 0; i <= t->a.vqp->op_mask; ++i) {
        CHECK(t, t->a.vqp->ops[i].remaining == 0,
              "cancel: operation slot %u: %u WQEs left", i,
              t->a.vqp->ops[i].remaining);
    }
}

/* One WRITE of the second pair (@a flush: its final FLUSH instead). */
static void bg_post(trial_t *t, int flush)
{
    bg_t *bg         = t->bg;
    unsigned k       = bg->posted;
    vqp_send_wr_t wr = {0};
    uint64_t len = 0, off = 0;
    ucs_status_t status;

    if (k >= BG_MAX) {
        return;
    }
    if (!flush) {
        len = random_len(t);
        off = arena_take(t, len);
        if ((off == 0) && (len != 0)) {
            return;
        }
        pattern(t->a.buf + off, len, BG_ID + k);
    }
    wr.wr_id       = k;
    wr.opcode      = flush ? VQP_OP_FLUSH : VQP_OP_WRITE;
    wr.flags       = (flush || rng_pct(&t->rng, 80)) ? VQP_SEND_SIGNALED : 0;
    wr.length      = len;
    wr.local_addr  = (uintptr_t)t->a.buf + off;
    wr.remote_addr = (uintptr_t)t->b.buf + off;
    set_keys(t, &wr);
    bg->off[k] = off;
    bg->len[k] = len;
    bg->sig[k] = (wr.flags & VQP_SEND_SIGNALED) != 0;
    ++bg->posted; /* a FLUSH may be reported inside its post */
    status = post_retry(t, bg->a, &wr);
    if ((status != UCS_OK) && t->chaos) {
        bg->failed[k] = 1; /* refused: no QP left */
        return;
    }
    CHECK(t, status == UCS_OK, "second pair: post failed: %s",
          ucs_status_string(status));
    bg->signaled += bg->sig[k];
}

static void bg_create(trial_t *t, const vqp_params_t *tmpl)
{
    static const unsigned qps[] = {1, 2, 4};
    vqp_params_t params         = *tmpl;
    char addr_a[4096], addr_b[4096];
    size_t len_a, len_b;
    bg_t *bg;

    bg = calloc(1, sizeof(*bg));
    assert_non_null(bg);
    bg->last               = -1;
    params.num_qps         = qps[rng_below(&t->rng, 3)];
    params.lb              = rng_pct(&t->rng, 50) ? VQP_LB_DQPLB : VQP_LB_SPRAY;
    params.max_outstanding = 8;
    params.max_ops         = 64;
    params.max_recvs       = 0; /* WRITEs only: nothing to receive */
    params.srq             = NULL;
    params.cq              = t->a.cq;
    params.comp_cb         = t->use_cb ? bg_cb : NULL;
    params.comp_arg        = t;
    if (vqp_create(&params, &bg->a) != UCS_OK) {
        free(bg); /* a small CQ has no room for its QPs: without it */
        return;
    }
    params.cq      = t->b.cq;
    params.comp_cb = NULL;
    if (vqp_create(&params, &bg->b) != UCS_OK) {
        vqp_destroy(bg->a);
        free(bg);
        return;
    }
    assert_int_equal(vqp_address_pack(bg->a, addr_a, sizeof(addr_a), &len_a),
                     UCS_OK);
    assert_int_equal(vqp_address_pack(bg->b, addr_b, sizeof(addr_b), &len_b),
                     UCS_OK);
    assert_int_equal(vqp_connect(bg->a, addr_b, len_b), UCS_OK);
    assert_int_equal(vqp_connect(bg->b, addr_a, len_a), UCS_OK);
    t->bg = bg;
}

/* The second pair's operations all reported, their data in place. */
static void bg_drain_and_destroy(trial_t *t)
{
    bg_t *bg = t->bg;
    unsigned steps, k;

    if (bg == NULL) {
        return;
    }
    bg_post(t, 1);
    for (steps = 0; (steps < MAX_STEPS) && ((bg->reported < bg->signaled) ||
                                            (vqp_ops_in_flight(bg->a) != 0));
         ++steps) {
        progress(t);
    }
    CHECK(t, steps < MAX_STEPS, "second pair: %u of %u reports, %u in flight",
          bg->reported, bg->signaled, vqp_ops_in_flight(bg->a));
    for (k = 0; k < bg->posted; ++k) {
        if (bg->failed[k]) {
            continue;
        }
        CHECK(t, bg->rep[k] == bg->sig[k], "second pair: wr_id %u reported %d",
              k, bg->rep[k]);
        CHECK(t, pattern_ok(t->b.buf + bg->off[k], bg->len[k], BG_ID + k),
              "second pair: WRITE %u not in place at the end", k);
    }
    if (verbose) {
        print_message("  second pair: %u operations, %u reported\n", bg->posted,
                      bg->reported);
    }
    vqp_destroy(bg->a);
    vqp_destroy(bg->b);
    free(bg);
    t->bg = NULL;
}

static void run_trial(uint64_t seed)
{
    trial_t *t = calloc(1, sizeof(*t));
    unsigned k;

    assert_non_null(t);
    trial_setup(t, seed);
    while (t->posted < t->ops_target) {
        k = rng_below(&t->rng, 100);
        if ((t->bg != NULL) && rng_pct(&t->rng, 15)) {
            bg_post(t, 0);
        } else if (k < 60) {
            post_one(t);
        } else if (k < 63) {
            /* a burst without polling */
            for (k = rng_below(&t->rng, 32);
                 (k > 0) && (t->posted < t->ops_target); --k) {
                post_one(t);
            }
        } else {
            progress(t);
        }
    }
    if (t->cancel_end) {
        trial_cancel_in_flight(t);
    } else if (t->destroy_end) {
        /* Let some complete, then destroy with the rest in flight. */
        for (k = rng_below(&t->rng, 20); k > 0; --k) {
            progress(t);
        }
        trial_destroy_in_flight(t);
        /* The receiver may still see what arrived; drain it. */
        for (k = 0; k < 1000; ++k) {
            vqp_wc_t wcs[64];
            unsigned n, i;

            if (t->srq != NULL) {
                vqp_cq_progress(t->b.cq); /* b_cb, failures left out */
                continue;
            }
            n = vqp_cq_poll(t->b.cq, wcs, 64);
            for (i = 0; i < n; ++i) {
                if (wcs[i].status == UCS_OK) {
                    on_b_wc(t, &wcs[i]);
                }
            }
        }
    } else {
        trial_drain_and_check(t);
    }
    bg_drain_and_destroy(t);
    side_close(&t->a);
    if (t->srq != NULL) {
        vqp_destroy(t->b.vqp);
        t->b.vqp = NULL;
        assert_int_equal(vqp_srq_destroy(t->srq, NULL, NULL), UCS_OK);
    }
    side_close(&t->b);
    free(t);
}

static void test_random(void **state)
{
    const char *s = getenv("VQP_RANDOM_SEED");
    const char *n = getenv("VQP_RANDOM_TRIALS");
    uint64_t seed = (s != NULL) ? strtoull(s, NULL, 0) : 1;
    unsigned trials, i;

    trials  = (n != NULL) ? (unsigned)strtoul(n, NULL, 0)
              : (getenv("VQP_TEST_VALGRIND") != NULL) ? 10
                                                      : 100;
    verbose = (getenv("VQP_RANDOM_VERBOSE") != NULL);
    for (i = 0; i < trials; ++i) {
        run_trial(seed + i);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
