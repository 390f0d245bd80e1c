/*
 * UCT glue, randomized: seeded trials of random interface configurations
 * (QP count, load balancing, fragment size, stripe threshold, fragments in
 * flight per QP, TX queue, receive queue, flow-control window, bounce
 * buffer size, inline limit, CQ size, rx_headroom, CQE reordering and WQE
 * delays of the software device) and random streams of every operation of
 * uct.h that rc_vqp offers (put and get short/bcopy/zcopy, the zcopy ones
 * and AM zcopy cut into up to 4 iov entries, AM short, short_iov, bcopy,
 * zcopy, every atomic on 4 and 8 bytes, ep and iface
 * flush, fence), on up to three endpoints: one interface to another, the
 * other way, an interface to itself; connected by interface address (the
 * connection manager, so the first operations wait) or endpoint to
 * endpoint (one connection for both directions). In "split" trials (one in
 * four; UCT_RANDOM_SPLIT=PCT sets the share) the other interface lives in
 * a peer process (this program run again with --peer): data then moves
 * between processes, and the peer receives the AMs and keeps descriptors;
 * its buffer and the AM bookkeeping are shared memory, so the model here
 * sees them. The endpoints then all start here: up to two to the peer and
 * one to itself (by interface address), or one (endpoint to endpoint). In
 * three split trials in ten the peer is killed (SIGKILL) at a random
 * point: the endpoints to it must fail cleanly, the others not at all.
 * Operations refused with UCS_ERR_NO_RESOURCE go to the pending queue, in
 * order, and later ones queue behind them, as UCP does; AM handlers keep
 * descriptors at random and release them later. A trial ends by draining
 * (flush, every AM delivered), by flush(CANCEL) or by destroying the endpoints
 * with operations in flight.
 *
 * The model checks what uct.h and UCX's conventions promise: every
 * completion runs once, never inside the posting call, with UCS_OK (or,
 * at a cancel or destroy, UCS_ERR_CANCELED); an operation that returned
 * UCS_OK gets no completion; a flush completes after the completions of
 * every operation posted before it, and an iface flush that says UCS_OK
 * left nothing outstanding; after a flush every put and atomic is in
 * place; a get reads what the puts before it left (a fenced get also a
 * put in flight before the fence); fetching atomics return the model's
 * value; AMs arrive exactly once, in order, with their data, and a kept
 * descriptor stays intact until released; pending callbacks run in the
 * order of pending_add; a purge returns exactly the requests still queued;
 * no error handler call. In "events" trials (three in ten;
 * UCT_RANDOM_EVENTS=PCT) waits sleep on the interfaces' event fds once
 * they are armed, and no wakeup may be lost.
 *
 * UCT_RANDOM_SEED=S runs the trials S, S + 1, ...; UCT_RANDOM_TRIALS=N how
 * many (default 200, about 6 s; 30 under valgrind); UCT_RANDOM_VERBOSE=1
 * prints every trial's configuration (a failure prints its own).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ucs/sys/compiler_def.h>
#include <uct/api/uct.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AM_ID     7
#define AM_MAGIC  0xa5ull
#define MAX_EPS   3
#define SLOTS     8 /* data slots per endpoint, remote and local */
#define WORDS     8 /* atomic words per endpoint */
#define SLOT_SIZE 65536u
#define MAX_OPS   384u /* operation records live at once */
#define FIFO_LEN  512u /* > MAX_OPS, a power of two */
#define AM_RING   2048u
#define MAX_KEPT  16u
#define MAX_HDR   64u
#define WAIT_SEC  30.0

/* Per side: the areas other endpoints write into, then its own endpoints'
 * local source and destination slots. */
#define RAREA_SIZE (SLOTS * SLOT_SIZE + WORDS * 8u)
#define LAREA_SIZE (2u * SLOTS * SLOT_SIZE)
#define SIDE_BUF   ((MAX_EPS * (RAREA_SIZE + LAREA_SIZE) + 4095u) & ~4095u)

static char trial_desc[512];
static uint64_t trial_seed;
static int is_peer; /* the peer process of a split trial */

#define CHECK(_cond, ...)                                                    \
    do {                                                                     \
        if (!(_cond)) {                                                      \
            fprintf(stderr, "%s%s:%d: trial %" PRIu64 " (%s): CHECK(%s): ",  \
                    is_peer ? "peer: " : "", __FILE__, __LINE__, trial_seed, \
                    trial_desc, #_cond);                                     \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

#include "test_check.h"

/* ------------------------------------------------------------------ rng */

typedef struct rng {
    uint64_t s;
} rng_t;

static rng_t rng;

static uint64_t rng_next(void)
{
    uint64_t z = (rng.s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static unsigned rng_below(unsigned n)
{
    return (unsigned)(rng_next() % n);
}

static int rng_pct(unsigned pct)
{
    return rng_below(100) < pct;
}

/* A length in [lo, hi], small ones as likely as large ones. */
static size_t rng_len(size_t lo, size_t hi)
{
    size_t top;

    if (hi <= lo) {
        return lo;
    }
    top = 1;
    while ((top < hi - lo) && rng_pct(70)) {
        top <<= 1;
    }
    if (top > hi - lo) {
        top = hi - lo;
    }
    return lo + (size_t)(rng_next() % (top + 1));
}

static uint8_t pat(uint32_t seed, size_t i)
{
    uint32_t x = seed * 2654435761u + (uint32_t)i * 40503u + (uint32_t)(i >> 8);

    return (uint8_t)(x ^ (x >> 15));
}

static void pat_fill(uint8_t *dst, size_t len, uint32_t seed, size_t from)
{
    size_t i;

    for (i = 0; i < len; ++i) {
        dst[i] = pat(seed, from + i);
    }
}

/* --------------------------------------------------------------- model */

typedef enum {
    K_PUT_SHORT,
    K_PUT_BCOPY,
    K_PUT_ZCOPY,
    K_GET_BCOPY,
    K_GET_ZCOPY,
    K_AM_SHORT,
    K_AM_SHORT_IOV,
    K_AM_BCOPY,
    K_AM_ZCOPY,
    K_ATOMIC_POST,
    K_ATOMIC_FETCH,
    K_ATOMIC_CSWAP,
    K_FLUSH,
    K_LAST
} kind_t;

static const char *kind_name[K_LAST] = {
    "put_short",    "put_bcopy",    "put_zcopy", "get_bcopy", "get_zcopy",
    "am_short",     "am_short_iov", "am_bcopy",  "am_zcopy",  "atomic_post",
    "atomic_fetch", "atomic_cswap", "flush"};

enum { OP_FREE, OP_QUEUED, OP_POSTED, OP_PURGED };

struct tep;

typedef struct op {
    uct_completion_t comp;
    uct_pending_req_t preq;
    struct tep *ep;
    kind_t kind;
    int state;
    uint64_t seq;
    int in_call;    /* the posting call runs */
    int has_comp;   /* a completion will run */
    int done;       /* completed: by its callback, or at once */
    int calls;      /* completion callbacks */
    int retired;    /* its effects were checked and released */
    int packs;      /* pack/unpack callback calls */
    unsigned slot;  /* remote slot or word */
    unsigned lsrc;  /* local source slot held (zcopy), or ~0 */
    unsigned ldst;  /* local destination slot held (gets), or ~0 */
    size_t off;     /* in the remote slot (word: 0 or 4) */
    uint32_t amseq; /* AMs: the endpoint's AM number */
    size_t len;
    uint32_t seed;
    unsigned hdr_len; /* am_zcopy */
    uint8_t hdr[MAX_HDR];
    unsigned size; /* atomics: 4 or 8 */
    uct_atomic_op_t aop;
    uint64_t value, compare, expect;
    union {
        uint64_t u64;
        uint32_t u32;
    } result;
    uint8_t *expect_data; /* gets: the model's bytes at the post */
    struct op *next_free;
} op_t;

typedef struct slot {
    unsigned busy;    /* operations on it not retired */
    uint64_t max_seq; /* of the operations ever put on it */
    uint8_t *shadow;  /* the model's bytes */
} slot_t;

typedef struct word {
    unsigned busy;
    uint64_t max_seq;
    uint8_t shadow[8];
} word_t;

typedef struct side side_t;

/* An endpoint's AMs: the sender counts and records each one's length, the
 * receiver counts what arrived. In a split trial the receiver may be the
 * peer process: these live in memory both map. */
typedef struct am_track {
    uint32_t sent;
    uint32_t rcvd;
    uint32_t dst; /* the index of the receiving side */
    uint32_t len[AM_RING];
} am_track_t;

typedef struct shared {
    am_track_t am[MAX_EPS];
    uint32_t peer_ep_failed; /* the peer's endpoint saw an error */
} shared_t;

typedef struct tep {
    unsigned idx;
    side_t *src, *dst;
    uct_ep_h ep;
    int active;               /* created and not destroyed */
    uint8_t *rarea;           /* in dst's buffer */
    uint8_t *src_area;        /* in src's buffer: SLOTS source slots */
    uint8_t *dst_area;        /* then SLOTS destination slots */
    uint8_t stage[SLOT_SIZE]; /* short and bcopy sources */
    slot_t slots[SLOTS];
    word_t words[WORDS];
    int src_busy[SLOTS], dst_busy[SLOTS];
    uint64_t next_seq, fence_seq;
    op_t *posted[FIFO_LEN]; /* posted, not yet retired, in order */
    unsigned posted_head, posted_tail;
    op_t *pend[FIFO_LEN]; /* in UCT's pending queue, in order */
    unsigned pend_head, pend_tail;
    am_track_t *am;
    unsigned ops_posted, ops_pending, flushes;
    unsigned data_ops;         /* posted, flushes not counted */
    unsigned data_ops_at_kill; /* when the peer process was killed */
    /* Chaos trials: the endpoint saw an error (a completion, a call's
     * status or its error handler), how often the handler ran, and what
     * the model found wrong (only a failed endpoint may have that). */
    int failed;
    unsigned errors; /* completions and calls with an error, not ending */
    char first_error[96];
    unsigned err_calls;
    unsigned mismatches;
    char mismatch[256];
} tep_t;

struct side {
    unsigned index;
    /* In the peer process (split trials): no interface here; its buffer
     * is mapped here too, at rdelta bytes from where the peer has it. */
    int remote;
    uintptr_t rdelta;
    void *peer_ep_addr; /* endpoint to endpoint: the peer's endpoint */
    int mapped;         /* buf is split_map (not allocated) */
    int event_fd;
    uct_iface_h iface;
    uct_iface_attr_t attr;
    void *dev_addr, *iface_addr;
    uint8_t *buf;
    uct_mem_h memh;
    uct_rkey_bundle_t rkey;
    struct {
        void *desc;
        uint8_t *data;
        size_t len;
        uint32_t seed;
    } kept[MAX_KEPT];
    unsigned nkept;
    unsigned am_calls;
};

typedef struct config {
    unsigned num_qps;
    const char *lb;
    unsigned frag, stripe, max_outstanding, tx_queue_len, rx_queue_len;
    unsigned fc_wnd, seg_size, max_inline, cq_len;
    unsigned tx_bufs; /* TX_MAX_BUFS; 0: unlimited */
    size_t headroom;
    int to_iface; /* else endpoint to endpoint */
    unsigned nep; /* 1..3 */
    unsigned ops; /* operations to issue */
    int end;      /* END_* */
    const char *faults;
    unsigned keep_pct; /* AM descriptors kept */
    int chaos;         /* endpoints may fail: errors injected, or kill */
    int async_thread;  /* the worker's async context in thread mode */
    int split;         /* the other interface in a peer process */
    int kill;          /* split: the peer is killed (SIGKILL) mid-trial */
    int events;        /* waits sleep on the interfaces' event fds */
    unsigned kill_at;  /* after this many operations */
} config_t;

enum { END_DRAIN, END_CANCEL, END_DESTROY };
static const char *end_name[] = {"drain", "cancel", "destroy"};

static uct_component_h component;
static uct_component_h *components;
static uct_md_h md;
static uct_worker_h worker;
static ucs_async_context_t *async;
static side_t sides[2];
static tep_t eps[MAX_EPS];
static unsigned nep;
static config_t cfg;
static op_t op_pool[MAX_OPS];
static op_t *free_ops;
static unsigned ops_live;
/* Ending by cancel or destroy: completions may say UCS_ERR_CANCELED, the
 * model no longer knows the data (purged puts never ran). */
static int ending;
static int verbose;
static unsigned long total_ops, total_pending, total_kept, total_comp;
static unsigned long total_reconnects, total_split, total_kill_failed;
static unsigned long total_peer_am, total_peer_sent;
static unsigned long total_sleeps, total_sleep_timeouts, total_lost_wakeups;
static unsigned long total_pending_cb;
static shared_t local_shared;
static shared_t *shared   = &local_shared;
static unsigned split_pct = 25, events_pct = 30;
static char self_exe[PATH_MAX];
/* Split trials: the peer process, its control socket, the memory shared
 * with it (the peer side's buffer, then shared_t) and where it is here. */
static pid_t peer_pid = -1;
static int peer_sock  = -1;
static uint8_t *split_map;
static int peer_ending;  /* in the peer: errors on its endpoint expected */
static uct_ep_h peer_ep; /* in the peer: its endpoint (endpoint to endpoint) */
static unsigned peer_err_calls;
static int peer_killed;

#define SPLIT_MAP (SIDE_BUF + ((sizeof(shared_t) + 4095u) & ~4095u))

/* Split, endpoint to endpoint: the peer sends AMs back on its endpoint (the
 * one connection carries both directions, as UCP's wireup makes it), as
 * endpoint 1 would (nep is 1 then); its_failed says its endpoint failed
 * (what it sent may be lost). */
#define PEER_AM_EP 1u

static int peer_streams(void)
{
    return cfg.split && !cfg.to_iface;
}

static uint32_t am_sent(const tep_t *e)
{
    return e->am->sent;
}

static uint32_t am_rcvd(const tep_t *e)
{
    return __atomic_load_n(&e->am->rcvd, __ATOMIC_ACQUIRE);
}

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void dump_state(void)
{
    unsigned i;

    for (i = 0; i < nep; ++i) {
        tep_t *e = &eps[i];
        op_t *h  = (e->posted_head != e->posted_tail)
                       ? e->posted[e->posted_head % FIFO_LEN]
                       : NULL;
        op_t *p  = (e->pend_head != e->pend_tail)
                       ? e->pend[e->pend_head % FIFO_LEN]
                       : NULL;

        fprintf(stderr,
                "  ep %u: seq %" PRIu64 " posted %u (in flight %u) pending %u"
                " flushes %u am sent %u received %u; oldest in flight: %s"
                " seq %" PRIu64 " done %d; first pending: %s seq %" PRIu64 "\n",
                i, e->next_seq, e->ops_posted, e->posted_tail - e->posted_head,
                e->pend_tail - e->pend_head, e->flushes, am_sent(e), am_rcvd(e),
                h ? kind_name[h->kind] : "-", h ? h->seq : 0, h ? h->done : 0,
                p ? kind_name[p->kind] : "-", p ? p->seq : 0);
    }
}

/* Split trials, here: the peer process must live until told to quit (it
 * exits on a failed check of its own, which it printed). */
static void peer_check(void)
{
    int st;

    if ((peer_pid > 0) && (waitpid(peer_pid, &st, WNOHANG) == peer_pid)) {
        peer_pid = -1;
        CHECK(0, "the peer process ended (%s %d)",
              WIFEXITED(st) ? "exit status" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
}

/* A wait's progress. In event trials, as UCP's ucp_worker_wait: after a few
 * idle calls, arm every interface here and sleep on their event fds. An
 * armed interface must wake the sleeper for every completion and arrival:
 * a sleep that times out, after which the next progress call delivers a
 * completion or an AM, is a lost wakeup. */
static void wait_progress(void)
{
    static unsigned idle;
    struct pollfd fds[2];
    unsigned i, nfds = 0, am_calls;
    unsigned long comps, pends;
    ucs_status_t st;
    int rc;

    if ((uct_worker_progress(worker) != 0) || !cfg.events || (++idle < 4)) {
        return;
    }
    idle = 0;
    for (i = 0; i < 2; ++i) {
        if (sides[i].remote || (sides[i].iface == NULL)) {
            continue;
        }
        st = uct_iface_event_arm(sides[i].iface,
                                 UCT_EVENT_SEND_COMP | UCT_EVENT_RECV);
        if (st == UCS_ERR_BUSY) {
            return;
        }
        CHECK_OK(st);
        fds[nfds].fd       = sides[i].event_fd;
        fds[nfds++].events = POLLIN;
    }
    rc = poll(fds, nfds, 200);
    CHECK(rc >= 0, "poll: %s", strerror(errno));
    ++total_sleeps;
    if (rc > 0) {
        return;
    }
    ++total_sleep_timeouts;
    comps    = total_comp;
    pends    = total_pending_cb;
    am_calls = sides[0].am_calls + (sides[1].remote ? 0 : sides[1].am_calls);
    uct_worker_progress(worker);
    if ((comps != total_comp) || (pends != total_pending_cb) ||
        (am_calls !=
         sides[0].am_calls + (sides[1].remote ? 0 : sides[1].am_calls))) {
        ++total_lost_wakeups;
        CHECK(0,
              "lost wakeup: a sleep of 200 ms on armed interfaces ended"
              " without an event, then progress delivered %lu completions,"
              " %lu pending requests and %u AMs",
              total_comp - comps, total_pending_cb - pends,
              sides[0].am_calls + (sides[1].remote ? 0 : sides[1].am_calls) -
                  am_calls);
    }
}

/* Control messages between the test and its peer process (split trials):
 * one datagram each (SOCK_SEQPACKET). */
enum {
    MSG_HELLO = 1, /* arg: the trial's seed */
    MSG_ADDR,      /* arg: the peer's buffer; data: addr_lens_t, addresses */
    MSG_CONNECT,   /* data: addr_lens_t, device and endpoint address */
    MSG_ENDING,    /* errors of the peer's endpoint are expected now */
    MSG_QUIT,
    MSG_ACK,
    MSG_BYE /* arg: the peer's AM handler calls */
};

#define MSG_MAX 2048u

typedef struct msg {
    uint32_t type;
    uint32_t len;
    uint64_t arg;
    uint8_t data[MSG_MAX];
} msg_t;

typedef struct addr_lens {
    uint32_t dev, iface, rkey, ep;
} addr_lens_t;

static void msg_send(uint32_t type, uint64_t arg, const void *data, size_t len)
{
    msg_t m;
    ssize_t n;

    CHECK(len <= MSG_MAX, "message of %zu bytes", len);
    m.type = type;
    m.len  = (uint32_t)len;
    m.arg  = arg;
    if (len > 0) {
        memcpy(m.data, data, len);
    }
    n = send(peer_sock, &m, offsetof(msg_t, data) + len, MSG_NOSIGNAL);
    CHECK(n == (ssize_t)(offsetof(msg_t, data) + len), "sending message %u: %s",
          type, strerror(errno));
}

/* Wait for the message of @a type, progressing meanwhile (the other
 * process may need this one's progress before it answers). */
static void msg_recv(uint32_t type, msg_t *m)
{
    double deadline = now() + WAIT_SEC;
    ssize_t n;

    while ((n = recv(peer_sock, m, sizeof(*m), MSG_DONTWAIT)) < 0) {
        CHECK((errno == EAGAIN) || (errno == EWOULDBLOCK) || (errno == EINTR),
              "receiving message %u: %s", type, strerror(errno));
        CHECK(now() < deadline, "no message %u in %.0f s", type, WAIT_SEC);
        if (worker != NULL) {
            uct_worker_progress(worker);
        }
    }
    CHECK(n > 0, "waiting for message %u: the %s process went away", type,
          is_peer ? "test" : "peer");
    CHECK((n >= (ssize_t)offsetof(msg_t, data)) && (m->type == type) &&
              (n == (ssize_t)(offsetof(msg_t, data) + m->len)),
          "message %u of %zd bytes, expected %u", m->type, n, type);
}

/* Chaos, endpoint to endpoint: what UCP's keepalive does (uct_ep_check)
 * every 0.1 s of a wait. An endpoint waiting for credits sends nothing, so
 * it would not notice that the peer's side failed. (Through the connection
 * manager the peer's released passive endpoint says so, DROP: no keepalive
 * there, so that the test sees that it does; but a killed peer sends
 * nothing.) */
static void keepalive(double *next)
{
    unsigned i;

    if (!cfg.chaos || (cfg.to_iface && !peer_killed) || ending ||
        (now() < *next)) {
        return;
    }
    *next = now() + 0.1;
    for (i = 0; i < nep; ++i) {
        if (eps[i].active && !eps[i].failed) {
            (void)uct_ep_check(eps[i].ep, 0, NULL);
        }
    }
}

#define WAIT_FOR(_cond, ...)                  \
    do {                                      \
        double _deadline  = now() + WAIT_SEC; \
        double _keepalive = now() + 0.1;      \
        while (!(_cond)) {                    \
            if (now() > _deadline) {          \
                dump_state();                 \
                CHECK(0, __VA_ARGS__);        \
            }                                 \
            wait_progress();                  \
            keepalive(&_keepalive);           \
            peer_check();                     \
        }                                     \
    } while (0)

/* ------------------------------------------------------ slots and words */

/* What the model found wrong: fails the trial, but in a chaos trial only
 * if the endpoint ends without an error (data of a failed one is lost). */
#define MODEL_CHECK(_e, _cond, ...)                                            \
    do {                                                                       \
        if (!(_cond)) {                                                        \
            if (!cfg.chaos) {                                                  \
                CHECK(0, __VA_ARGS__);                                         \
            }                                                                  \
            if ((_e)->mismatches++ == 0) {                                     \
                snprintf((_e)->mismatch, sizeof((_e)->mismatch), __VA_ARGS__); \
            }                                                                  \
        }                                                                      \
    } while (0)

static void verify_slot(tep_t *e, unsigned s)
{
    const uint8_t *mem = e->rarea + (size_t)s * SLOT_SIZE;
    size_t i;

    if (ending || e->failed || !memcmp(mem, e->slots[s].shadow, SLOT_SIZE)) {
        return;
    }
    for (i = 0; (i < SLOT_SIZE) && (mem[i] == e->slots[s].shadow[i]); ++i) {
    }
    MODEL_CHECK(e, 0, "ep %u slot %u byte %zu: 0x%02x, the model says 0x%02x",
                e->idx, s, i, mem[i], e->slots[s].shadow[i]);
}

static void verify_word(tep_t *e, unsigned w)
{
    const uint8_t *mem = e->rarea + (size_t)SLOTS * SLOT_SIZE + w * 8u;

    if (ending || e->failed) {
        return;
    }
    MODEL_CHECK(e, !memcmp(mem, e->words[w].shadow, 8),
                "ep %u atomic word %u: 0x%016" PRIx64
                ", the model says 0x%016" PRIx64,
                e->idx, w, *(const uint64_t *)mem,
                *(const uint64_t *)e->words[w].shadow);
}

static uint8_t *lsrc(tep_t *e, unsigned ls)
{
    return e->src_area + (size_t)ls * SLOT_SIZE;
}

static uint8_t *ldst(tep_t *e, unsigned ls)
{
    return e->dst_area + (size_t)ls * SLOT_SIZE;
}

/* After a local completion: the source may be reused (scribbled, so a late
 * read would send garbage the remote check sees). */
static void release_src(tep_t *e, op_t *op)
{
    if (op->lsrc == ~0u) {
        return;
    }
    memset(lsrc(e, op->lsrc), 0x5c, SLOT_SIZE);
    e->src_busy[op->lsrc] = 0;
    op->lsrc              = ~0u;
}

static void release_dst(tep_t *e, op_t *op)
{
    if (op->ldst != ~0u) {
        e->dst_busy[op->ldst] = 0;
        op->ldst              = ~0u;
    }
}

static int is_put(kind_t k)
{
    return (k == K_PUT_SHORT) || (k == K_PUT_BCOPY) || (k == K_PUT_ZCOPY);
}

static int is_get(kind_t k)
{
    return (k == K_GET_BCOPY) || (k == K_GET_ZCOPY);
}

static int is_atomic(kind_t k)
{
    return (k == K_ATOMIC_POST) || (k == K_ATOMIC_FETCH) ||
           (k == K_ATOMIC_CSWAP);
}

/* Its effect is known in place: release what it holds and check the slot
 * or word once nothing else is on it. */
static void op_retire(op_t *op)
{
    tep_t *e = op->ep;

    if (op->retired) {
        return;
    }
    op->retired = 1;
    release_src(e, op);
    if (is_put(op->kind) || is_get(op->kind)) {
        CHECK(e->slots[op->slot].busy > 0, "slot %u not busy", op->slot);
        if (--e->slots[op->slot].busy == 0) {
            verify_slot(e, op->slot);
        }
    } else if (is_atomic(op->kind)) {
        CHECK(e->words[op->slot].busy > 0, "word %u not busy", op->slot);
        if (--e->words[op->slot].busy == 0) {
            verify_word(e, op->slot);
        }
    }
    release_dst(e, op);
}

static void op_free(op_t *op)
{
    free(op->expect_data);
    op->expect_data = NULL;
    op->state       = OP_FREE;
    op->next_free   = free_ops;
    free_ops        = op;
    --ops_live;
}

/* Free the retired operations at the head of the posted FIFO. */
static void fifo_trim(tep_t *e)
{
    op_t *op;

    while (e->posted_head != e->posted_tail) {
        op = e->posted[e->posted_head % FIFO_LEN];
        if (!op->retired || (op->has_comp && !op->done)) {
            break;
        }
        ++e->posted_head;
        op_free(op);
    }
}

/* The data a get fetched, or a fetching atomic's result. */
static void check_fetched(op_t *op)
{
    tep_t *e = op->ep;
    const uint8_t *got;
    size_t i;

    if (is_get(op->kind)) {
        got = ldst(e, op->ldst);
        for (i = 0; (i < op->len) && (got[i] == op->expect_data[i]); ++i) {
        }
        MODEL_CHECK(e, i == op->len,
                    "ep %u %s seq %" PRIu64 " slot %u+%zu len %zu: byte %zu"
                    " is 0x%02x, expected 0x%02x",
                    e->idx, kind_name[op->kind], op->seq, op->slot, op->off,
                    op->len, i, got[i], op->expect_data[i]);
        for (i = op->len; (i < op->len + 64) && (i < SLOT_SIZE); ++i) {
            CHECK(got[i] == 0xee,
                  "ep %u %s seq %" PRIu64 " len %zu wrote byte %zu past it",
                  e->idx, kind_name[op->kind], op->seq, op->len, i);
        }
        release_dst(e, op);
    } else if ((op->kind == K_ATOMIC_FETCH) || (op->kind == K_ATOMIC_CSWAP)) {
        uint64_t r = (op->size == 8) ? op->result.u64 : op->result.u32;

        MODEL_CHECK(e, r == op->expect,
                    "ep %u %s%u op %d seq %" PRIu64 ": result 0x%" PRIx64
                    ", expected 0x%" PRIx64,
                    e->idx, kind_name[op->kind], op->size * 8, (int)op->aop,
                    op->seq, r, op->expect);
    }
}

static void flush_done(op_t *fl);

static void op_done(op_t *op, ucs_status_t status)
{
    tep_t *e = op->ep;

    op->done = 1;
    /* At the end, canceled; and endpoint to endpoint, the peer's cancel
     * may fail what was still in flight on the shared connection. */
    CHECK((status == UCS_OK) || cfg.chaos ||
              (ending && ((status == UCS_ERR_CANCELED) || !cfg.to_iface)),
          "ep %u %s seq %" PRIu64 " completed with %s", e->idx,
          kind_name[op->kind], op->seq, ucs_status_string(status));
    if (status != UCS_OK) {
        if (cfg.chaos && !ending) {
            e->failed = 1;
            if (e->errors++ == 0) {
                snprintf(e->first_error, sizeof(e->first_error),
                         "%s seq %" PRIu64 " %s (%s)", kind_name[op->kind],
                         op->seq, ucs_status_string(status),
                         op->has_comp ? "completion" : "returned");
            }
        }
        op_retire(op);
        fifo_trim(e);
        return;
    }
    if ((op->kind == K_PUT_ZCOPY) || (op->kind == K_AM_ZCOPY)) {
        release_src(e, op);
    } else if (is_get(op->kind) || (op->kind == K_ATOMIC_FETCH) ||
               (op->kind == K_ATOMIC_CSWAP)) {
        check_fetched(op);
        op_retire(op);
    } else if (op->kind == K_FLUSH) {
        flush_done(op);
        op_retire(op);
    }
    fifo_trim(e);
}

static void comp_cb(uct_completion_t *self)
{
    op_t *op = ucs_container_of(self, op_t, comp);

    ++total_comp;
    CHECK(op->state == OP_POSTED,
          "ep %u %s seq %" PRIu64 ": completion of an operation in state %d",
          op->ep->idx, kind_name[op->kind], op->seq, op->state);
    CHECK(!op->in_call,
          "ep %u %s seq %" PRIu64 ": completion inside the posting call",
          op->ep->idx, kind_name[op->kind], op->seq);
    CHECK(op->has_comp && (++op->calls == 1) && !op->done,
          "ep %u %s seq %" PRIu64 ": completion %d (returned %s)", op->ep->idx,
          kind_name[op->kind], op->seq, op->calls,
          op->has_comp ? "UCS_INPROGRESS" : "UCS_OK");
    CHECK(self->count == 0, "completion ran with count %d", self->count);
    op_done(op, self->status);
}

/* Everything posted before the flush has completed and is in place. */
static void flush_done(op_t *fl)
{
    tep_t *e = fl->ep;
    unsigned i;
    op_t *op;

    for (i = e->posted_head; i != e->posted_tail; ++i) {
        op = e->posted[i % FIFO_LEN];
        if (op->seq >= fl->seq) {
            break;
        }
        CHECK(!op->has_comp || op->done,
              "ep %u: flush seq %" PRIu64 " completed before %s seq %" PRIu64,
              e->idx, fl->seq, kind_name[op->kind], op->seq);
        op_retire(op);
    }
}

/* ------------------------------------------------------ pack callbacks */

static size_t pack_put(void *dest, void *arg)
{
    op_t *op = arg;

    ++op->packs;
    pat_fill(dest, op->len, op->seed, op->off);
    return op->len;
}

static uint64_t am_hdr(const tep_t *e, uint32_t seq)
{
    return (AM_MAGIC << 56) | ((uint64_t)e->idx << 48) | seq;
}

/* An AM's bytes: the 8-byte header word, then the pattern from byte 8. */
static void am_fill(const op_t *op, uint8_t *dst, size_t from, size_t len)
{
    uint64_t hdr = am_hdr(op->ep, op->amseq);
    size_t i;

    for (i = 0; i < len; ++i) {
        dst[i] = (from + i < 8) ? ((const uint8_t *)&hdr)[from + i]
                                : pat(op->seed, from + i);
    }
}

static size_t pack_am(void *dest, void *arg)
{
    op_t *op = arg;

    ++op->packs;
    am_fill(op, dest, 0, op->len);
    return op->len;
}

static void unpack_get(void *arg, const void *data, size_t length)
{
    op_t *op = arg;

    CHECK(length == op->len, "get_bcopy unpacked %zu bytes of %zu", length,
          op->len);
    CHECK(++op->packs == 1, "get_bcopy unpacked %d times", op->packs);
    memcpy(ldst(op->ep, op->ldst), data, length);
}

static uint32_t am_seed(unsigned ep, uint32_t seq)
{
    return seq * 977u + ep * 131u + 17u;
}

/* -------------------------------------------------------------- posting */

/* Remote addresses are the target side's own (the peer process maps its
 * buffer elsewhere). */
static uint64_t raddr_slot(const tep_t *e, const op_t *op)
{
    return (uintptr_t)(e->rarea + (size_t)op->slot * SLOT_SIZE + op->off) +
           e->dst->rdelta;
}

static uint64_t raddr_word(const tep_t *e, const op_t *op)
{
    return (uintptr_t)(e->rarea + (size_t)SLOTS * SLOT_SIZE + op->slot * 8u +
                       op->off) +
           e->dst->rdelta;
}

static ucs_status_t post_atomic(op_t *op, uct_ep_h ep, uct_rkey_t rkey)
{
    uint64_t ra = raddr_word(op->ep, op);

    if (op->kind == K_ATOMIC_CSWAP) {
        return (op->size == 8)
                   ? uct_ep_atomic_cswap64(ep, op->compare, op->value, ra, rkey,
                                           &op->result.u64, &op->comp)
                   : uct_ep_atomic_cswap32(ep, (uint32_t)op->compare,
                                           (uint32_t)op->value, ra, rkey,
                                           &op->result.u32, &op->comp);
    } else if (op->kind == K_ATOMIC_FETCH) {
        return (op->size == 8)
                   ? uct_ep_atomic64_fetch(ep, op->aop, op->value,
                                           &op->result.u64, ra, rkey, &op->comp)
                   : uct_ep_atomic32_fetch(ep, op->aop, (uint32_t)op->value,
                                           &op->result.u32, ra, rkey,
                                           &op->comp);
    }
    return (op->size == 8)
               ? uct_ep_atomic64_post(ep, op->aop, op->value, ra, rkey)
               : uct_ep_atomic32_post(ep, op->aop, (uint32_t)op->value, ra,
                                      rkey);
}

/* @a len bytes at @a p as up to @a max_iov (at most 4) iov entries like
 * @a tmpl, cut where @a seed says (empty entries too); the entry count. */
static size_t iov_split(uct_iov_t *iov, const uct_iov_t *tmpl, uint8_t *p,
                        size_t len, uint32_t seed, size_t max_iov)
{
    size_t n = 1 + (seed >> 8) % ((max_iov < 4) ? max_iov : 4), cut, i;

    for (i = 0; i < n; ++i) {
        cut           = (i == n - 1) ? len : (seed >> (4 * i)) % (len + 1);
        iov[i]        = *tmpl;
        iov[i].buffer = p;
        iov[i].length = cut;
        p += cut;
        len -= cut;
    }
    return n;
}

/* am_zcopy of @a op's payload in pieces of its source slot: the receiver
 * must see them joined. */
static ucs_status_t am_zcopy_split(op_t *op, uct_ep_h ep, const uct_iov_t *tmpl)
{
    uct_iov_t iov[4];
    size_t n =
        iov_split(iov, tmpl, lsrc(op->ep, op->lsrc), op->len - op->hdr_len,
                  op->seed, op->ep->src->attr.cap.am.max_iov);

    return uct_ep_am_zcopy(ep, AM_ID, op->hdr, op->hdr_len, iov, n, 0,
                           &op->comp);
}

/* One attempt: the status UCT returned (a bcopy's length checked and
 * turned into UCS_OK). */
static ucs_status_t op_call(op_t *op)
{
    tep_t *e        = op->ep;
    uct_ep_h ep     = e->ep;
    uct_rkey_t rkey = e->dst->rkey.rkey;
    uct_iov_t iov   = {.memh = e->src->memh, .count = 1, .stride = 0};
    uct_iov_t iovs[4];
    size_t cnt;
    ssize_t n;

    switch (op->kind) {
    case K_PUT_SHORT:
        pat_fill(e->stage, op->len, op->seed, op->off);
        return uct_ep_put_short(ep, e->stage, (unsigned)op->len,
                                raddr_slot(e, op), rkey);
    case K_PUT_BCOPY:
        op->packs = 0;
        n         = uct_ep_put_bcopy(ep, pack_put, op, raddr_slot(e, op), rkey);
        if (n < 0) {
            CHECK((n != UCS_ERR_NO_RESOURCE) || (op->packs == 0),
                  "put_bcopy packed, then said NO_RESOURCE");
            return (ucs_status_t)n;
        }
        CHECK(((size_t)n == op->len) && (op->packs == 1),
              "put_bcopy returned %zd (len %zu), packed %d times", n, op->len,
              op->packs);
        return UCS_OK;
    case K_PUT_ZCOPY:
        /* in pieces (up to max_iov) that land one after another */
        cnt = iov_split(iovs, &iov, lsrc(e, op->lsrc) + op->off, op->len,
                        op->seed, e->src->attr.cap.put.max_iov);
        return uct_ep_put_zcopy(ep, iovs, cnt, raddr_slot(e, op), rkey,
                                &op->comp);
    case K_GET_BCOPY:
        op->packs = 0;
        return uct_ep_get_bcopy(ep, unpack_get, op, op->len, raddr_slot(e, op),
                                rkey, &op->comp);
    case K_GET_ZCOPY:
        cnt = iov_split(iovs, &iov, ldst(e, op->ldst), op->len, op->seed,
                        e->src->attr.cap.get.max_iov);
        return uct_ep_get_zcopy(ep, iovs, cnt, raddr_slot(e, op), rkey,
                                &op->comp);
    case K_AM_SHORT:
        am_fill(op, e->stage, 0, op->len);
        return uct_ep_am_short(ep, AM_ID, am_hdr(e, op->amseq), e->stage + 8,
                               (unsigned)(op->len - 8));
    case K_AM_SHORT_IOV:
        am_fill(op, e->stage, 0, op->len);
        iov.buffer = e->stage;
        iov.length = op->len;
        iov.memh   = UCT_MEM_HANDLE_NULL;
        return uct_ep_am_short_iov(ep, AM_ID, &iov, 1);
    case K_AM_BCOPY:
        op->packs = 0;
        n         = uct_ep_am_bcopy(ep, AM_ID, pack_am, op, 0);
        if (n < 0) {
            return (ucs_status_t)n;
        }
        CHECK(((size_t)n == op->len) && (op->packs == 1),
              "am_bcopy returned %zd (len %zu), packed %d times", n, op->len,
              op->packs);
        return UCS_OK;
    case K_AM_ZCOPY:
        return am_zcopy_split(op, ep, &iov);
    case K_ATOMIC_POST:
    case K_ATOMIC_FETCH:
    case K_ATOMIC_CSWAP:
        return post_atomic(op, ep, rkey);
    case K_FLUSH:
        return uct_ep_flush(ep, 0, &op->comp);
    default:
        CHECK(0, "kind %d", (int)op->kind);
    }
    return UCS_ERR_INVALID_PARAM;
}

/* Try to post: UCS_ERR_NO_RESOURCE leaves the operation as it was. */
static ucs_status_t op_try(op_t *op)
{
    tep_t *e = op->ep;
    ucs_status_t st;

    op->in_call     = 1;
    op->comp.func   = comp_cb;
    op->comp.count  = 1;
    op->comp.status = UCS_OK;
    st              = op_call(op);
    op->in_call     = 0;
    if ((op->kind == K_PUT_SHORT) || (op->kind == K_AM_SHORT) ||
        (op->kind == K_AM_SHORT_IOV)) {
        /* Copied by the call: a later change must not matter. */
        memset(e->stage, 0xa3, op->len + op->off);
    }
    if (st == UCS_ERR_NO_RESOURCE) {
        CHECK(op->calls == 0, "%s said NO_RESOURCE and completed",
              kind_name[op->kind]);
        return st;
    }
    /* Chaos: an endpoint that failed refuses with its error (never as a
     * bad argument); the operation ends there, without a completion. */
    CHECK((st == UCS_OK) || (st == UCS_INPROGRESS) ||
              ((cfg.chaos || (ending && !cfg.to_iface)) &&
               (st != UCS_ERR_INVALID_PARAM) && (st != UCS_ERR_UNSUPPORTED)),
          "ep %u %s seq %" PRIu64 " len %zu: %s", e->idx, kind_name[op->kind],
          op->seq, op->len, ucs_status_string(st));
    CHECK(op->calls == 0, "%s: completion inside the call",
          kind_name[op->kind]);
    op->state    = OP_POSTED;
    op->has_comp = (st == UCS_INPROGRESS);
    CHECK((e->posted_head == e->posted_tail) ||
              (e->posted[(e->posted_tail - 1) % FIFO_LEN]->seq < op->seq),
          "ep %u: seq %" PRIu64 " posted after a later one", e->idx, op->seq);
    e->posted[e->posted_tail++ % FIFO_LEN] = op;
    ++e->ops_posted;
    if (op->kind == K_FLUSH) {
        ++e->flushes;
    } else {
        ++e->data_ops;
    }
    if ((st == UCS_OK) || UCS_STATUS_IS_ERR(st)) {
        op_done(op, st);
    }
    return st;
}

static ucs_status_t pending_cb(uct_pending_req_t *self)
{
    op_t *op = ucs_container_of(self, op_t, preq);
    tep_t *e = op->ep;
    ucs_status_t st;

    ++total_pending_cb;
    CHECK(op->state == OP_QUEUED,
          "pending callback of an operation in "
          "state %d",
          op->state);
    CHECK((e->pend_head != e->pend_tail) &&
              (e->pend[e->pend_head % FIFO_LEN] == op),
          "ep %u: pending %s seq %" PRIu64 " dispatched out of order", e->idx,
          kind_name[op->kind], op->seq);
    st = op_try(op);
    if (st == UCS_ERR_NO_RESOURCE) {
        return st;
    }
    ++e->pend_head;
    return UCS_OK;
}

static void pend_add(op_t *op)
{
    tep_t *e = op->ep;
    unsigned tries;
    ucs_status_t st;

    op->preq.func = pending_cb;
    for (tries = 0;; ++tries) {
        CHECK(tries < 1000, "pending_add says BUSY and the operation "
                            "NO_RESOURCE, 1000 times");
        st = uct_ep_pending_add(e->ep, &op->preq, 0);
        if (st == UCS_OK) {
            op->state                          = OP_QUEUED;
            e->pend[e->pend_tail++ % FIFO_LEN] = op;
            ++total_pending;
            return;
        }
        CHECK(st == UCS_ERR_BUSY, "pending_add: %s", ucs_status_string(st));
        /* BUSY: resources now. Only when nothing is queued may the
         * operation go ahead. */
        if ((e->pend_head == e->pend_tail) &&
            (op_try(op) != UCS_ERR_NO_RESOURCE)) {
            return;
        }
    }
}

static void issue(op_t *op)
{
    tep_t *e = op->ep;

    ++total_ops;
    if ((e->pend_head != e->pend_tail) || (op_try(op) == UCS_ERR_NO_RESOURCE)) {
        pend_add(op);
    }
}

/* ------------------------------------------------------ building ops */

static void flush_nocomp(tep_t *e);
static void purge(tep_t *e);

static op_t *op_alloc(tep_t *e, kind_t kind)
{
    double deadline = now() + WAIT_SEC, next = now() + 0.1;
    unsigned i, n                            = 0;
    op_t *op;

    /* Every record in use: most wait for a flush to say they are in place,
     * and there is no record for one. */
    while (free_ops == NULL) {
        if (now() > deadline) {
            dump_state();
            CHECK(0, "no operation record freed in %.0f s", WAIT_SEC);
        }
        wait_progress();
        keepalive(&next);
        if ((++n % 16) == 0) {
            for (i = 0; i < nep; ++i) {
                if (eps[i].failed) {
                    purge(&eps[i]); /* chaos: its queue holds records */
                }
                flush_nocomp(&eps[i]);
            }
        }
    }
    op       = free_ops;
    free_ops = op->next_free;
    ++ops_live;
    memset(op, 0, sizeof(*op));
    op->ep   = e;
    op->kind = kind;
    op->seq  = e->next_seq++;
    op->lsrc = ~0u;
    op->ldst = ~0u;
    return op;
}

/* May an operation (program order: next) touch a slot or word that has
 * @a busy operations on it, the last with @a max_seq? Only when they are
 * before a fence. */
static int may_touch(const tep_t *e, unsigned busy, uint64_t max_seq)
{
    return (busy == 0) || (max_seq < e->fence_seq);
}

static int free_local(const int *busy)
{
    unsigned i, start = rng_below(SLOTS);

    for (i = 0; i < SLOTS; ++i) {
        if (!busy[(start + i) % SLOTS]) {
            return (int)((start + i) % SLOTS);
        }
    }
    return -1;
}

static int pick_slot(tep_t *e)
{
    unsigned i, start = rng_below(SLOTS), s;

    for (i = 0; i < SLOTS; ++i) {
        s = (start + i) % SLOTS;
        if (may_touch(e, e->slots[s].busy, e->slots[s].max_seq)) {
            return (int)s;
        }
    }
    return -1;
}

static size_t min_size(size_t a, size_t b)
{
    return (a < b) ? a : b;
}

static int new_put_get(tep_t *e, kind_t kind)
{
    const uct_iface_attr_t *a = &e->src->attr;
    int s = pick_slot(e), ls = 0;
    size_t max;
    op_t *op;

    if (s < 0) {
        return 0;
    }
    switch (kind) {
    case K_PUT_SHORT:
        max = a->cap.put.max_short;
        break;
    case K_PUT_BCOPY:
        max = a->cap.put.max_bcopy;
        break;
    case K_GET_BCOPY:
        max = a->cap.get.max_bcopy;
        break;
    case K_PUT_ZCOPY:
        max = a->cap.put.max_zcopy;
        break;
    default:
        max = a->cap.get.max_zcopy;
        break;
    }
    max = min_size(max, SLOT_SIZE - 64);
    if (kind == K_PUT_ZCOPY) {
        ls = free_local(e->src_busy);
    } else if (is_get(kind)) {
        ls = free_local(e->dst_busy);
    }
    if (ls < 0) {
        return 0;
    }
    op       = op_alloc(e, kind);
    op->slot = (unsigned)s;
    op->len  = rng_len(is_get(kind) ? 1 : 0, max);
    op->off  = rng_below((unsigned)(SLOT_SIZE - op->len + 1));
    op->seed = (uint32_t)rng_next();
    e->slots[s].busy++;
    e->slots[s].max_seq = op->seq;
    if (is_put(kind)) {
        pat_fill(e->slots[s].shadow + op->off, op->len, op->seed, op->off);
        if (kind == K_PUT_ZCOPY) {
            op->lsrc        = (unsigned)ls;
            e->src_busy[ls] = 1;
            pat_fill(lsrc(e, (unsigned)ls) + op->off, op->len, op->seed,
                     op->off);
        }
    } else {
        op->ldst        = (unsigned)ls;
        e->dst_busy[ls] = 1;
        memset(ldst(e, (unsigned)ls), 0xee, min_size(op->len + 64, SLOT_SIZE));
        op->expect_data = malloc(op->len);
        CHECK(op->expect_data != NULL, "out of memory");
        memcpy(op->expect_data, e->slots[s].shadow + op->off, op->len);
    }
    issue(op);
    return 1;
}

static int new_am(tep_t *e, kind_t kind)
{
    const uct_iface_attr_t *a = &e->src->attr;
    size_t max;
    int ls = -1;
    op_t *op;

    if (am_sent(e) - am_rcvd(e) >= AM_RING) {
        return 0;
    }
    switch (kind) {
    case K_AM_SHORT:
    case K_AM_SHORT_IOV:
        max = a->cap.am.max_short;
        break;
    case K_AM_BCOPY:
        max = a->cap.am.max_bcopy;
        break;
    default:
        max = min_size(a->cap.am.max_zcopy, SLOT_SIZE); /* header included */
        ls  = free_local(e->src_busy);
        if (ls < 0) {
            return 0;
        }
        break;
    }
    if ((max < 8) || ((kind == K_AM_ZCOPY) && (a->cap.am.max_hdr < 8))) {
        return 0;
    }
    op        = op_alloc(e, kind);
    op->amseq = e->am->sent++;
    op->seed  = am_seed(e->idx, op->amseq);
    op->len   = rng_len(8, max);
    if (kind == K_AM_ZCOPY) {
        op->hdr_len = (unsigned)rng_len(
            8, min_size(min_size(a->cap.am.max_hdr, MAX_HDR), op->len));
        am_fill(op, op->hdr, 0, op->hdr_len);
        op->lsrc        = (unsigned)ls;
        e->src_busy[ls] = 1;
        am_fill(op, lsrc(e, (unsigned)ls), op->hdr_len, op->len - op->hdr_len);
    }
    e->am->len[op->amseq % AM_RING] = (uint32_t)op->len;
    issue(op);
    return 1;
}

static void word_apply(uint8_t *w, unsigned size, uct_atomic_op_t aop,
                       uint64_t value, uint64_t compare, int cswap,
                       uint64_t *old_p)
{
    uint64_t old = 0, nv;

    memcpy(&old, w, size);
    if (cswap) {
        nv = (old == compare) ? value : old;
    } else {
        switch (aop) {
        case UCT_ATOMIC_OP_ADD:
            nv = old + value;
            break;
        case UCT_ATOMIC_OP_AND:
            nv = old & value;
            break;
        case UCT_ATOMIC_OP_OR:
            nv = old | value;
            break;
        case UCT_ATOMIC_OP_XOR:
            nv = old ^ value;
            break;
        default: /* SWAP */
            nv = value;
            break;
        }
    }
    memcpy(w, &nv, size); /* little-endian: the low bytes of the word */
    *old_p = old;
}

static int new_atomic(tep_t *e, kind_t kind)
{
    const uct_iface_attr_t *a          = &e->src->attr;
    static const uct_atomic_op_t ops[] = {UCT_ATOMIC_OP_ADD, UCT_ATOMIC_OP_AND,
                                          UCT_ATOMIC_OP_OR, UCT_ATOMIC_OP_XOR,
                                          UCT_ATOMIC_OP_SWAP};
    unsigned size = rng_pct(50) ? 8 : 4, i, w = rng_below(WORDS);
    uint64_t flags, mask = (size == 8) ? ~0ull : 0xffffffffull, old;
    uct_atomic_op_t aop;
    op_t *op;

    if (!may_touch(e, e->words[w].busy, e->words[w].max_seq)) {
        return 0;
    }
    if (kind == K_ATOMIC_CSWAP) {
        flags =
            (size == 8) ? a->cap.atomic64.fop_flags : a->cap.atomic32.fop_flags;
        if (!(flags & UCS_BIT(UCT_ATOMIC_OP_CSWAP))) {
            return 0;
        }
        aop = UCT_ATOMIC_OP_CSWAP;
    } else {
        flags = (size == 8)
                    ? ((kind == K_ATOMIC_POST) ? a->cap.atomic64.op_flags
                                               : a->cap.atomic64.fop_flags)
                    : ((kind == K_ATOMIC_POST) ? a->cap.atomic32.op_flags
                                               : a->cap.atomic32.fop_flags);
        i     = rng_below(5);
        aop   = ops[i];
        if (!(flags & UCS_BIT(aop))) {
            return 0;
        }
    }
    op          = op_alloc(e, kind);
    op->slot    = w;
    op->size    = size;
    op->off     = (size == 4) ? 4 * rng_below(2) : 0;
    op->aop     = aop;
    op->value   = rng_next() & mask;
    op->compare = rng_next() & mask;
    if ((kind == K_ATOMIC_CSWAP) && rng_pct(60)) {
        op->compare = 0;
        memcpy(&op->compare, e->words[w].shadow + op->off, size);
    }
    word_apply(e->words[w].shadow + op->off, size, aop, op->value, op->compare,
               kind == K_ATOMIC_CSWAP, &old);
    op->expect = old;
    e->words[w].busy++;
    e->words[w].max_seq = op->seq;
    issue(op);
    return 1;
}

static void new_flush(tep_t *e)
{
    issue(op_alloc(e, K_FLUSH));
}

/* flush(ep) without a completion: UCS_OK says everything posted is done. */
static void flush_nocomp(tep_t *e)
{
    ucs_status_t st = uct_ep_flush(e->ep, 0, NULL);
    unsigned i;
    op_t *op;

    if (st != UCS_OK) {
        CHECK((st == UCS_INPROGRESS) || (st == UCS_ERR_NO_RESOURCE) ||
                  (cfg.chaos && e->failed),
              "flush(ep, NULL): %s", ucs_status_string(st));
        return;
    }
    /* (A failed endpoint's queue waits for the purge, as in UCX's rc.) */
    CHECK((e->pend_head == e->pend_tail) || e->failed,
          "ep %u: flush said UCS_OK with %u operations pending", e->idx,
          e->pend_tail - e->pend_head);
    for (i = e->posted_head; i != e->posted_tail; ++i) {
        op = e->posted[i % FIFO_LEN];
        CHECK(!op->has_comp || op->done,
              "ep %u: flush(NULL) said UCS_OK before %s seq %" PRIu64
              " completed",
              e->idx, kind_name[op->kind], op->seq);
        op_retire(op);
    }
    fifo_trim(e);
}

/* iface flush: UCS_OK says every endpoint of the interface is done. */
static void flush_iface(side_t *s)
{
    ucs_status_t st = uct_iface_flush(s->iface, 0, NULL);
    unsigned i, j;
    op_t *op;

    if (st != UCS_OK) {
        CHECK((st == UCS_INPROGRESS) || (st == UCS_ERR_NO_RESOURCE) ||
                  cfg.chaos,
              "iface_flush: %s", ucs_status_string(st));
        return;
    }
    for (j = 0; j < nep; ++j) {
        tep_t *e = &eps[j];

        if (!e->active || (e->src != s) || e->failed) {
            continue;
        }
        CHECK(e->pend_head == e->pend_tail,
              "iface flush said UCS_OK with ep %u's %u operations pending", j,
              e->pend_tail - e->pend_head);
        for (i = e->posted_head; i != e->posted_tail; ++i) {
            op = e->posted[i % FIFO_LEN];
            CHECK(!op->has_comp || op->done,
                  "iface flush said UCS_OK before ep %u's %s seq %" PRIu64
                  " completed",
                  j, kind_name[op->kind], op->seq);
            op_retire(op);
        }
        fifo_trim(e);
    }
}

/* ------------------------------------------------------------- AM side */

static ucs_status_t am_cb(void *arg, void *data, size_t length, unsigned flags)
{
    side_t *s = arg;
    uint64_t hdr;
    unsigned idx;
    uint32_t seq;
    const uint8_t *p = data;
    am_track_t *t;
    size_t i;

    ++s->am_calls;
    CHECK(length >= 8, "AM of %zu bytes", length);
    memcpy(&hdr, data, 8);
    CHECK((hdr >> 56) == AM_MAGIC, "AM header 0x%016" PRIx64, hdr);
    idx = (unsigned)(hdr >> 48) & 0xff;
    seq = (uint32_t)hdr;
    CHECK((idx < nep) || ((idx == PEER_AM_EP) && peer_streams()),
          "AM from endpoint %u", idx);
    t = &shared->am[idx];
    CHECK(t->dst == s->index, "ep %u's AM reached the wrong interface", idx);
    CHECK(seq == t->rcvd, "ep %u: AM %u arrived, expected %u (sent %u)", idx,
          seq, t->rcvd, t->sent);
    CHECK(length == t->len[seq % AM_RING], "ep %u AM %u: %zu bytes, sent %u",
          idx, seq, length, t->len[seq % AM_RING]);
    for (i = 8; i < length; ++i) {
        CHECK(p[i] == pat(am_seed(idx, seq), i),
              "ep %u AM %u (%zu bytes): byte %zu differs", idx, seq, length, i);
    }
    __atomic_store_n(&t->rcvd, seq + 1, __ATOMIC_RELEASE);
    if ((flags & UCT_CB_PARAM_FLAG_DESC) && (s->nkept < MAX_KEPT) &&
        rng_pct(cfg.keep_pct)) {
        s->kept[s->nkept].desc = (uint8_t *)data - cfg.headroom;
        s->kept[s->nkept].data = data;
        s->kept[s->nkept].len  = length;
        s->kept[s->nkept].seed = am_seed(idx, seq);
        ++s->nkept;
        ++total_kept;
        return UCS_INPROGRESS;
    }
    return UCS_OK;
}

static void release_kept(side_t *s, unsigned n)
{
    unsigned k, i;
    size_t j;

    while ((n-- > 0) && (s->nkept > 0)) {
        k = rng_below(s->nkept);
        for (j = 8; j < s->kept[k].len; ++j) {
            CHECK(s->kept[k].data[j] == pat(s->kept[k].seed, j),
                  "a kept AM descriptor changed at byte %zu", j);
        }
        uct_iface_release_desc(s->kept[k].desc);
        for (i = k + 1; i < s->nkept; ++i) {
            s->kept[i - 1] = s->kept[i];
        }
        --s->nkept;
    }
}

static ucs_status_t err_cb(void *arg, uct_ep_h ep, ucs_status_t status)
{
    unsigned i;

    if (is_peer) {
        /* Its one endpoint (endpoint to endpoint): the trial's end or
         * chaos may fail it, once. */
        CHECK(peer_ending || cfg.chaos, "error handler: %s",
              ucs_status_string(status));
        CHECK((ep == peer_ep) && (arg == &sides[1]),
              "error handler for an endpoint the peer does not have");
        CHECK(++peer_err_calls == 1, "error handler called %u times",
              peer_err_calls);
        __atomic_store_n(&shared->peer_ep_failed, 1, __ATOMIC_RELEASE);
        return UCS_OK;
    }

    CHECK(ending || cfg.chaos, "error handler: ep %p %s", (void *)ep,
          ucs_status_string(status));
    for (i = 0; (i < nep) && (eps[i].ep != ep); ++i) {
    }
    CHECK(i < nep, "error handler for an endpoint the user does not have");
    CHECK(eps[i].src == arg, "error handler of the wrong interface");
    CHECK(++eps[i].err_calls == 1, "ep %u: error handler called %u times", i,
          eps[i].err_calls);
    if (cfg.chaos) {
        eps[i].failed = 1;
    }
    return UCS_OK;
}

/* -------------------------------------------------------------- setup */

static void cfg_set(uct_iface_config_t *c, const char *name, unsigned v)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%u", v);
    CHECK_OK(uct_config_modify(c, name, buf));
}

/* Side @a index's interface, and its buffer: @a buf when mapped (the peer
 * process's), else allocated. */
static ucs_status_t side_open(side_t *s, unsigned index, uint8_t *buf)
{
    uct_iface_params_t params = {0};
    uct_iface_config_t *c;
    ucs_status_t st;

    memset(s, 0, sizeof(*s));
    s->index = index;
    CHECK_OK(uct_md_iface_config_read(md, "rc_vqp", NULL, NULL, &c));
    cfg_set(c, "NUM_QPS", cfg.num_qps);
    CHECK_OK(uct_config_modify(c, "LB", cfg.lb));
    cfg_set(c, "FRAG_SIZE", cfg.frag);
    cfg_set(c, "STRIPE_THRESH", cfg.stripe);
    cfg_set(c, "MAX_OUTSTANDING", cfg.max_outstanding);
    cfg_set(c, "TX_QUEUE_LEN", cfg.tx_queue_len);
    cfg_set(c, "RX_QUEUE_LEN", cfg.rx_queue_len);
    cfg_set(c, "FC_WND_SIZE", cfg.fc_wnd);
    cfg_set(c, "SEG_SIZE", cfg.seg_size);
    cfg_set(c, "MAX_INLINE", cfg.max_inline);
    cfg_set(c, "CQ_LEN", cfg.cq_len);
    if (cfg.tx_bufs != 0) {
        cfg_set(c, "TX_MAX_BUFS", cfg.tx_bufs);
    }
    if (cfg.chaos) { /* a peer's QP that failed is found dead sooner */
        CHECK_OK(uct_config_modify(c, "TIMEOUT", "1ms"));
    }
    if (cfg.kill) { /* an endpoint connecting to the killed peer gives up */
        CHECK_OK(uct_config_modify(c, "CONNECT_TIMEOUT", "1s"));
    }
    params.field_mask =
        UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
        UCT_IFACE_PARAM_FIELD_RX_HEADROOM | UCT_IFACE_PARAM_FIELD_ERR_HANDLER |
        UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG |
        UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS;
    params.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
    params.mode.device.tl_name  = "rc_vqp";
    params.mode.device.dev_name = "vqp_sw0";
    params.rx_headroom          = cfg.headroom;
    params.err_handler          = err_cb;
    params.err_handler_arg      = s;
    st = uct_iface_open(md, worker, &params, c, &s->iface);
    uct_config_release(c);
    if (st != UCS_OK) {
        return st;
    }
    CHECK_OK(uct_iface_query(s->iface, &s->attr));
    s->dev_addr   = calloc(1, s->attr.device_addr_len);
    s->iface_addr = calloc(1, s->attr.iface_addr_len);
    CHECK_OK(uct_iface_get_device_address(s->iface, s->dev_addr));
    CHECK_OK(uct_iface_get_address(s->iface, s->iface_addr));
    CHECK_OK(uct_iface_set_am_handler(s->iface, AM_ID, am_cb, s, 0));
    uct_iface_progress_enable(s->iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    s->event_fd = -1;
    if (s->attr.cap.event_flags & UCT_IFACE_FLAG_EVENT_FD) {
        CHECK_OK(uct_iface_event_fd_get(s->iface, &s->event_fd));
    }
    if (buf != NULL) {
        s->buf    = buf; /* its contents are the other process's to set */
        s->mapped = 1;
    } else {
        s->buf = aligned_alloc(4096, SIDE_BUF);
        CHECK(s->buf != NULL, "out of memory");
        memset(s->buf, 0, SIDE_BUF);
    }
    CHECK_OK(
        uct_md_mem_reg(md, s->buf, SIDE_BUF, UCT_MD_MEM_ACCESS_ALL, &s->memh));
    return UCS_OK;
}

static void side_rkey(side_t *s)
{
    uct_md_attr_t md_attr;
    void *rkey_buf;

    CHECK_OK(uct_md_query(md, &md_attr));
    rkey_buf = calloc(1, md_attr.rkey_packed_size);
    CHECK_OK(uct_md_mkey_pack(md, s->memh, rkey_buf));
    CHECK_OK(uct_rkey_unpack(component, rkey_buf, &s->rkey));
    free(rkey_buf);
}

static void side_close(side_t *s)
{
    if (!s->remote) {
        release_kept(s, MAX_KEPT);
    }
    if (!is_peer) {
        uct_rkey_release(component, &s->rkey);
    }
    if (!s->remote) {
        CHECK_OK(uct_md_mem_dereg(md, s->memh));
        uct_iface_close(s->iface);
    }
    if (!s->remote && !s->mapped) {
        free(s->buf);
    }
    free(s->dev_addr);
    free(s->iface_addr);
    free(s->peer_ep_addr);
}

/* Side @a i if it is in this process, else side 0. */
static side_t *local_side(unsigned i)
{
    return sides[i].remote ? &sides[0] : &sides[i];
}

static void tep_init(tep_t *e, unsigned idx, side_t *src, side_t *dst)
{
    unsigned s;

    memset(e, 0, offsetof(tep_t, slots));
    memset(e->slots, 0, sizeof(e->slots));
    memset(e->words, 0, sizeof(e->words));
    memset(e->src_busy, 0, sizeof(e->src_busy));
    memset(e->dst_busy, 0, sizeof(e->dst_busy));
    e->next_seq    = 1;
    e->fence_seq   = 0;
    e->posted_head = e->posted_tail = e->pend_head = e->pend_tail = 0;
    e->am = &shared->am[idx];
    memset(e->am, 0, sizeof(*e->am));
    e->am->dst    = dst->index;
    e->ops_posted = e->ops_pending = e->flushes = 0;
    e->failed                                   = 0;
    e->errors = e->err_calls = e->mismatches = 0;
    e->idx                                   = idx;
    e->src                                   = src;
    e->dst                                   = dst;
    e->rarea = dst->buf + (size_t)idx * RAREA_SIZE;
    e->src_area =
        src->buf + (size_t)MAX_EPS * RAREA_SIZE + (size_t)idx * LAREA_SIZE;
    e->dst_area = e->src_area + (size_t)SLOTS * SLOT_SIZE;
    for (s = 0; s < SLOTS; ++s) {
        e->slots[s].shadow = malloc(SLOT_SIZE);
        CHECK(e->slots[s].shadow != NULL, "out of memory");
        pat_fill(e->slots[s].shadow, SLOT_SIZE, 1000u + idx * 16u + s, 0);
        memcpy(e->rarea + (size_t)s * SLOT_SIZE, e->slots[s].shadow, SLOT_SIZE);
    }
    for (s = 0; s < WORDS; ++s) {
        uint64_t v = rng_next();

        memcpy(e->words[s].shadow, &v, 8);
        memcpy(e->rarea + (size_t)SLOTS * SLOT_SIZE + s * 8u, &v, 8);
    }
}

static uct_ep_h ep_to_iface(side_t *from, side_t *to)
{
    uct_ep_params_t p = {0};
    uct_ep_h ep;

    p.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                   UCT_EP_PARAM_FIELD_IFACE_ADDR;
    p.iface      = from->iface;
    p.dev_addr   = to->dev_addr;
    p.iface_addr = to->iface_addr;
    CHECK_OK(uct_ep_create(&p, &ep));
    return ep;
}

/* Split, endpoint to endpoint: ep 0 and the peer's endpoint (created with
 * its interface, its address came with the interface's). */
static void connect_peer_ep(void)
{
    uct_ep_params_t p = {.field_mask = UCT_EP_PARAM_FIELD_IFACE,
                         .iface      = sides[0].iface};
    uint8_t buf[MSG_MAX];
    addr_lens_t l = {.dev = (uint32_t)sides[0].attr.device_addr_len,
                     .ep  = (uint32_t)sides[0].attr.ep_addr_len};
    msg_t m;

    CHECK(sizeof(l) + l.dev + l.ep <= sizeof(buf), "addresses too long");
    CHECK_OK(uct_ep_create(&p, &eps[0].ep));
    memcpy(buf, &l, sizeof(l));
    memcpy(buf + sizeof(l), sides[0].dev_addr, l.dev);
    CHECK_OK(uct_ep_get_address(eps[0].ep,
                                (uct_ep_addr_t *)(buf + sizeof(l) + l.dev)));
    msg_send(MSG_CONNECT, 0, buf, sizeof(l) + l.dev + l.ep);
    msg_recv(MSG_ACK, &m);
    CHECK_OK(uct_ep_connect_to_ep(eps[0].ep, sides[1].dev_addr,
                                  sides[1].peer_ep_addr));
}

static void connect_eps(void)
{
    uct_ep_params_t p = {.field_mask = UCT_EP_PARAM_FIELD_IFACE};
    void *addr0, *addr1;
    unsigned i;

    if (cfg.to_iface) {
        for (i = 0; i < nep; ++i) {
            eps[i].ep = ep_to_iface(eps[i].src, eps[i].dst);
        }
    } else if (cfg.split) {
        connect_peer_ep();
    } else {
        /* One connection, used both ways (as UCP's wireup makes it). */
        p.iface = sides[0].iface;
        CHECK_OK(uct_ep_create(&p, &eps[0].ep));
        p.iface = sides[1].iface;
        CHECK_OK(uct_ep_create(&p, &eps[1].ep));
        addr0 = calloc(1, sides[0].attr.ep_addr_len);
        addr1 = calloc(1, sides[1].attr.ep_addr_len);
        CHECK_OK(uct_ep_get_address(eps[0].ep, addr0));
        CHECK_OK(uct_ep_get_address(eps[1].ep, addr1));
        CHECK_OK(uct_ep_connect_to_ep(eps[0].ep, sides[1].dev_addr, addr1));
        CHECK_OK(uct_ep_connect_to_ep(eps[1].ep, sides[0].dev_addr, addr0));
        free(addr0);
        free(addr1);
    }
    for (i = 0; i < nep; ++i) {
        eps[i].active = 1;
    }
}

static void pick_config(void)
{
    static const unsigned frags[]   = {1024, 4096, 16384, 65536, 1048576};
    static const unsigned stripes[] = {512, 4096, 16384, 65536, 524288};
    static const unsigned outs[]    = {1, 2, 4, 16};
    static const unsigned txq[]     = {2, 8, 32, 256};
    static const unsigned rxq[]     = {16, 64, 512, 4095};
    static const unsigned fcw[]     = {5, 8, 32, 128};
    static const unsigned segs[]    = {256, 1024, 8192};
    static const unsigned inl[]     = {8, 32, 128, 256};
    static const unsigned cqs[]     = {64, 512, 4096, 65536};
    static const size_t heads[]     = {0, 8, 40};
    static const char *faults[]     = {
            NULL, "seed=%u,reorder=0.3", "seed=%u,delay_us=20,delay_prob=0.05",
            "seed=%u,reorder=0.2,delay_us=5,delay_prob=0.1"};
#define PICK(_a) ((_a)[rng_below(sizeof(_a) / sizeof((_a)[0]))])

    memset(&cfg, 0, sizeof(cfg));
    cfg.num_qps         = rng_pct(20) ? 1 : 1 + rng_below(8);
    cfg.lb              = rng_pct(50) ? "dqplb" : "spray";
    cfg.frag            = PICK(frags);
    cfg.stripe          = PICK(stripes);
    cfg.max_outstanding = PICK(outs);
    cfg.tx_queue_len    = PICK(txq);
    cfg.rx_queue_len    = PICK(rxq);
    cfg.fc_wnd          = PICK(fcw);
    cfg.seg_size        = PICK(segs);
    cfg.max_inline      = PICK(inl);
    cfg.cq_len          = PICK(cqs);
    /* The receive queue's entries (a power of two) and one entry per QP of
     * up to four virtual QPs per interface (two endpoints, two passive). */
    while (cfg.cq_len <
           2 * (cfg.rx_queue_len + 1) + 4 * (cfg.num_qps + 1) + 8) {
        cfg.cq_len *= 2;
    }
    cfg.headroom = PICK(heads);
    cfg.to_iface = rng_pct(60);
    cfg.nep      = cfg.to_iface ? 1 + rng_below(3) : 2;
    cfg.ops      = 100 + rng_below(700);
    cfg.end = rng_pct(60) ? END_DRAIN : rng_pct(50) ? END_CANCEL : END_DESTROY;
    cfg.faults       = PICK(faults);
    cfg.keep_pct     = rng_pct(50) ? 0 : PICK(((const unsigned[]){5, 30}));
    cfg.chaos        = rng_pct(30);
    cfg.async_thread = rng_pct(50);
    cfg.split        = rng_below(100) < split_pct;
    if (cfg.split && !cfg.to_iface) {
        cfg.nep = 1; /* the peer's endpoint is the other half */
    }
    /* A killed peer: what a failed endpoint may do is allowed (chaos), but
     * no transport errors are injected, so only the endpoints to it may
     * fail. */
    cfg.events = rng_below(100) < events_pct;
    cfg.kill   = cfg.split && rng_pct(30);
    if (cfg.kill) {
        cfg.chaos   = 1;
        cfg.kill_at = rng_below(cfg.ops);
    }
    /* From the seed, not the generator: the trials drawn before stay the
     * same. A quarter of them bound the bounce buffers to 1..8. */
    cfg.tx_bufs = ((trial_seed >> 3) % 4 == 0) ? 1 + (trial_seed >> 5) % 8 : 0;
#undef PICK
}

static void describe(void)
{
    snprintf(trial_desc, sizeof(trial_desc),
             "qps %u %s frag %u stripe %u outstanding %u txq %u rxq %u fc %u"
             " seg %u inline %u cq %u headroom %zu %s eps %u ops %u end %s"
             " faults %s%s keep %u%%%s%s%s%s tx_bufs %u",
             cfg.num_qps, cfg.lb, cfg.frag, cfg.stripe, cfg.max_outstanding,
             cfg.tx_queue_len, cfg.rx_queue_len, cfg.fc_wnd, cfg.seg_size,
             cfg.max_inline, cfg.cq_len, cfg.headroom,
             cfg.to_iface ? "to-iface" : "ep-to-ep", cfg.nep, cfg.ops,
             end_name[cfg.end], cfg.faults ? cfg.faults : "none",
             cfg.chaos ? " chaos" : "", cfg.keep_pct,
             cfg.async_thread ? " async thread" : "", cfg.split ? " split" : "",
             cfg.kill ? " kill" : "", cfg.events ? " events" : "", cfg.tx_bufs);
}

static void md_open(void)
{
    uct_md_config_t *mc;
    char faults[160];
    size_t len = 0;

    /* Chaos: transport errors (retries exceeded) on random WQEs. */
    if (cfg.faults != NULL) {
        len = (size_t)snprintf(faults, sizeof(faults), cfg.faults,
                               (unsigned)trial_seed);
    } else if (cfg.chaos) {
        len = (size_t)snprintf(faults, sizeof(faults), "seed=%u",
                               (unsigned)trial_seed);
    }
    if (cfg.chaos && !cfg.kill) {
        snprintf(faults + len, sizeof(faults) - len, ",err_prob=0.003:0x15");
    }
    if ((cfg.faults != NULL) || cfg.chaos) {
        setenv("VQP_SW_FAULTS", faults, 1);
    } else {
        unsetenv("VQP_SW_FAULTS");
    }
    CHECK_OK(uct_md_config_read(component, NULL, NULL, &mc));
    CHECK_OK(uct_md_open(component, "vqp_sw0", mc, &md));
    uct_config_release(mc);
}

/* uct_iface_fence: every endpoint of the interface, as uct_ep_fence. */
static void iface_fence(side_t *s)
{
    unsigned i;

    for (i = 0; i < nep; ++i) {
        if (eps[i].active && (eps[i].src == s) &&
            (eps[i].pend_head != eps[i].pend_tail)) {
            return; /* as for uct_ep_fence: UCP fences with none queued */
        }
    }
    CHECK_OK(uct_iface_fence(s->iface, 0));
    for (i = 0; i < nep; ++i) {
        if (eps[i].active && (eps[i].src == s)) {
            eps[i].fence_seq = eps[i].next_seq;
        }
    }
}

/* ---------------------------------------------------- the peer process */

/* Split trials: the peer process (this program with --peer SOCK MEMFD) and
 * the memory shared with it: the peer side's buffer, then shared_t. */
static void split_start(void)
{
    int sv[2], fd;

    fd = memfd_create("uct_random", 0);
    CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
    CHECK(ftruncate(fd, SPLIT_MAP) == 0, "ftruncate: %s", strerror(errno));
    split_map =
        mmap(NULL, SPLIT_MAP, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(split_map != MAP_FAILED, "mmap: %s", strerror(errno));
    shared = (shared_t *)(split_map + SIDE_BUF);
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0, "socketpair: %s",
          strerror(errno));
    /* The peer gets them as descriptors 3 and 4, and nothing else of this
     * process (a device's descriptors would outlive it there). */
    fflush(stdout);
    fflush(stderr);
    peer_pid = fork();
    CHECK(peer_pid >= 0, "fork: %s", strerror(errno));
    if (peer_pid == 0) {
        int a = fcntl(sv[1], F_DUPFD, 100), b = fcntl(fd, F_DUPFD, 100);

        if ((a < 0) || (b < 0) || (dup2(a, 3) != 3) || (dup2(b, 4) != 4) ||
            (close_range(5, ~0u, 0) != 0)) {
            _exit(126);
        }
        execl(self_exe, self_exe, "--peer", "3", "4", (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    close(fd);
    peer_sock = sv[0];
    msg_send(MSG_HELLO, trial_seed, NULL, 0);
}

static void *dup_bytes(const uint8_t *p, size_t len)
{
    void *d = malloc(len ? len : 1);

    CHECK(d != NULL, "out of memory");
    memcpy(d, p, len);
    return d;
}

/* The side in the peer process, as this process uses it: its addresses,
 * its rkey and its buffer (mapped here at another address). */
static void side_remote(side_t *s)
{
    const uint8_t *p;
    addr_lens_t l;
    msg_t m;

    memset(s, 0, sizeof(*s));
    s->index  = 1;
    s->remote = 1;
    msg_recv(MSG_ADDR, &m);
    CHECK(m.len >= sizeof(l), "MSG_ADDR of %u bytes", m.len);
    memcpy(&l, m.data, sizeof(l));
    CHECK(m.len == sizeof(l) + l.dev + l.iface + l.rkey + l.ep,
          "MSG_ADDR of %u bytes", m.len);
    p             = m.data + sizeof(l);
    s->dev_addr   = dup_bytes(p, l.dev);
    s->iface_addr = dup_bytes(p + l.dev, l.iface);
    CHECK_OK(uct_rkey_unpack(component, p + l.dev + l.iface, &s->rkey));
    if (l.ep > 0) {
        s->peer_ep_addr = dup_bytes(p + l.dev + l.iface + l.rkey, l.ep);
    }
    s->buf    = split_map;
    s->rdelta = (uintptr_t)m.arg - (uintptr_t)split_map;
}

/* The trial's end: the peer closes and exits with 0. */
static void split_finish(void)
{
    double deadline = now() + WAIT_SEC;
    msg_t m;
    int st;

    if (peer_killed) {
        return;
    }
    msg_send(MSG_QUIT, 0, NULL, 0);
    msg_recv(MSG_BYE, &m);
    total_peer_am += m.arg;
    if (m.len == sizeof(uint64_t)) {
        total_peer_sent += *(const uint64_t *)m.data;
    }
    while (waitpid(peer_pid, &st, WNOHANG) == 0) {
        CHECK(now() < deadline, "the peer process did not exit");
        uct_worker_progress(worker);
    }
    peer_pid = -1;
    CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0),
          "the peer process ended"
          " with status 0x%x",
          st);
    close(peer_sock);
    peer_sock = -1;
}

static void split_unmap(void)
{
    CHECK(munmap(split_map, SPLIT_MAP) == 0, "munmap: %s", strerror(errno));
    split_map = NULL;
    shared    = &local_shared;
}

/* SIGKILL: the peer dies wherever it is (a device lock held, a WQE half
 * executed, a passive endpoint's credits not granted). */
static void split_kill(void)
{
    unsigned i;
    int st;

    CHECK(kill(peer_pid, SIGKILL) == 0, "kill: %s", strerror(errno));
    CHECK(waitpid(peer_pid, &st, 0) == peer_pid, "waitpid: %s",
          strerror(errno));
    peer_pid = -1;
    close(peer_sock);
    peer_sock   = -1;
    peer_killed = 1;
    for (i = 0; i < nep; ++i) {
        eps[i].data_ops_at_kill = eps[i].data_ops;
    }
}

/* Errors on the peer's endpoint may come from now on. */
static void split_ending(void)
{
    msg_t m;

    if (peer_killed) {
        return;
    }
    msg_send(MSG_ENDING, 0, NULL, 0);
    msg_recv(MSG_ACK, &m);
}

static void component_open(void);

typedef struct peer_am {
    uint32_t seq;
    size_t len;
} peer_am_t;

static void peer_am_fill(uint8_t *dst, uint32_t seq, size_t len)
{
    uint64_t hdr = (AM_MAGIC << 56) | ((uint64_t)PEER_AM_EP << 48) | seq;
    size_t i;

    memcpy(dst, &hdr, 8);
    for (i = 8; i < len; ++i) {
        dst[i] = pat(am_seed(PEER_AM_EP, seq), i);
    }
}

static size_t peer_pack_am(void *dest, void *arg)
{
    const peer_am_t *a = arg;

    peer_am_fill(dest, a->seq, a->len);
    return a->len;
}

/* In the peer: one AM back on its endpoint, short or bcopy; refused ones
 * are not retried (the next one may be another). Its length is recorded
 * before the send: the test's handler may see it before the call returns. */
static void peer_send_am(void)
{
    am_track_t *t             = &shared->am[PEER_AM_EP];
    const uct_iface_attr_t *a = &sides[1].attr;
    uint8_t buf[SLOT_SIZE];
    uint64_t hdr;
    peer_am_t am;
    ucs_status_t st;
    ssize_t n;

    am.seq = t->sent;
    if (am.seq - __atomic_load_n(&t->rcvd, __ATOMIC_ACQUIRE) >= AM_RING) {
        return;
    }
    if (rng_pct(50) && (a->cap.am.max_short >= 8)) {
        am.len                   = rng_len(8, a->cap.am.max_short);
        t->len[am.seq % AM_RING] = (uint32_t)am.len;
        peer_am_fill(buf, am.seq, am.len);
        memcpy(&hdr, buf, 8);
        st = uct_ep_am_short(peer_ep, AM_ID, hdr, buf + 8,
                             (unsigned)(am.len - 8));
    } else {
        am.len = rng_len(8, min_size(a->cap.am.max_bcopy, SLOT_SIZE));
        t->len[am.seq % AM_RING] = (uint32_t)am.len;
        n = uct_ep_am_bcopy(peer_ep, AM_ID, peer_pack_am, &am, 0);
        CHECK((n < 0) || ((size_t)n == am.len), "am_bcopy returned %zd of %zu",
              n, am.len);
        st = (n < 0) ? (ucs_status_t)n : UCS_OK;
    }
    if (st == UCS_OK) {
        __atomic_store_n(&t->sent, am.seq + 1, __ATOMIC_RELEASE);
        ++total_ops;
    } else {
        CHECK((st == UCS_ERR_NO_RESOURCE) || cfg.chaos || peer_ending,
              "peer AM: %s", ucs_status_string(st));
    }
}

/* The peer process: side 1 of trial HELLO's seed; receives AMs (checked
 * against the shared AM records) and keeps descriptors for a while, until
 * told to quit. */
static int peer_main(int sock, int memfd)
{
    uct_ep_params_t p = {.field_mask = UCT_EP_PARAM_FIELD_IFACE};
    uct_md_attr_t md_attr;
    uint8_t buf[MSG_MAX];
    const uint8_t *d;
    int connected = 0;
    addr_lens_t l;
    unsigned i;
    ssize_t n;
    msg_t m;

    is_peer   = 1;
    peer_sock = sock;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    msg_recv(MSG_HELLO, &m);
    trial_seed = m.arg;
    rng.s      = trial_seed * 0x2545f4914f6cdd1dull;
    pick_config();
    describe();
    CHECK(cfg.split, "not a split trial");
    nep   = cfg.nep;
    rng.s = ~trial_seed; /* its own choices: which AMs it keeps */
    split_map =
        mmap(NULL, SPLIT_MAP, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    CHECK(split_map != MAP_FAILED, "mmap: %s", strerror(errno));
    close(memfd);
    shared                     = (shared_t *)(split_map + SIDE_BUF);
    shared->am[PEER_AM_EP].dst = 0; /* its AMs go to side 0 */
    component_open();
    CHECK_OK(ucs_async_context_create(
        cfg.async_thread ? UCS_ASYNC_MODE_THREAD_SPINLOCK : UCS_ASYNC_MODE_POLL,
        &async));
    CHECK_OK(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker));
    md_open();
    CHECK_OK(side_open(&sides[1], 1, split_map));

    l.dev   = (uint32_t)sides[1].attr.device_addr_len;
    l.iface = (uint32_t)sides[1].attr.iface_addr_len;
    CHECK_OK(uct_md_query(md, &md_attr));
    l.rkey = (uint32_t)md_attr.rkey_packed_size;
    l.ep   = cfg.to_iface ? 0 : (uint32_t)sides[1].attr.ep_addr_len;
    CHECK(sizeof(l) + l.dev + l.iface + l.rkey + l.ep <= sizeof(buf),
          "addresses too long");
    memcpy(buf, &l, sizeof(l));
    memcpy(buf + sizeof(l), sides[1].dev_addr, l.dev);
    memcpy(buf + sizeof(l) + l.dev, sides[1].iface_addr, l.iface);
    CHECK_OK(
        uct_md_mkey_pack(md, sides[1].memh, buf + sizeof(l) + l.dev + l.iface));
    if (!cfg.to_iface) {
        p.iface = sides[1].iface;
        CHECK_OK(uct_ep_create(&p, &peer_ep));
        CHECK_OK(uct_ep_get_address(
            peer_ep,
            (uct_ep_addr_t *)(buf + sizeof(l) + l.dev + l.iface + l.rkey)));
    }
    msg_send(MSG_ADDR, (uintptr_t)split_map, buf,
             sizeof(l) + l.dev + l.iface + l.rkey + l.ep);

    for (;;) {
        n = recv(peer_sock, &m, sizeof(m), MSG_DONTWAIT);
        if (n < 0) {
            CHECK((errno == EAGAIN) || (errno == EWOULDBLOCK) ||
                      (errno == EINTR),
                  "receiving: %s", strerror(errno));
        } else if (n == 0) {
            CHECK(0, "the test process went away");
        } else if (m.type == MSG_CONNECT) {
            CHECK(!cfg.to_iface && (m.len >= sizeof(l)), "MSG_CONNECT");
            memcpy(&l, m.data, sizeof(l));
            d = m.data + sizeof(l);
            CHECK_OK(uct_ep_connect_to_ep(peer_ep, (const uct_device_addr_t *)d,
                                          (const uct_ep_addr_t *)(d + l.dev)));
            connected = 1;
            msg_send(MSG_ACK, 0, NULL, 0);
        } else if (m.type == MSG_ENDING) {
            peer_ending = 1;
            msg_send(MSG_ACK, 0, NULL, 0);
        } else if (m.type == MSG_QUIT) {
            break;
        } else {
            CHECK(0, "message %u", m.type);
        }
        if ((uct_worker_progress(worker) > 0) && rng_pct(5)) {
            release_kept(&sides[1], 1 + rng_below(4));
        }
        if (connected && !peer_ending && (peer_err_calls == 0) && rng_pct(10)) {
            peer_send_am();
        }
    }
    if (peer_ep != NULL) {
        uct_ep_destroy(peer_ep);
    }
    for (i = 0; i < 100; ++i) {
        uct_worker_progress(worker);
    }
    side_close(&sides[1]);
    msg_send(MSG_BYE, sides[1].am_calls, &total_ops, sizeof(total_ops));
    uct_md_close(md);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    uct_release_component_list(components);
    return 0;
}

static int all_done(const tep_t *e);

/* An endpoint closed as UCP closes one (flush, every AM delivered) and a
 * new one to the same interface: the peer's passive endpoint goes (DISC)
 * and a new one comes; the model's state carries on (AM numbers too). */
static void reconnect(tep_t *e)
{
    new_flush(e);
    WAIT_FOR((e->pend_head == e->pend_tail) && all_done(e),
             "ep %u: the flush before its reconnect did not complete", e->idx);
    WAIT_FOR(am_rcvd(e) == am_sent(e), "ep %u: AMs not delivered", e->idx);
    uct_ep_destroy(e->ep);
    e->ep = ep_to_iface(e->src, e->dst);
    ++total_reconnects;
}

/* ------------------------------------------------------------- endings */

static void purge_cb(uct_pending_req_t *req, void *arg)
{
    op_t *op = ucs_container_of(req, op_t, preq);
    tep_t *e = arg;

    CHECK(op->ep == e, "purged a request of another endpoint");
    CHECK(op->state == OP_QUEUED, "purged a request in state %d", op->state);
    op->state = OP_PURGED;
}

/* Purge: exactly the requests still queued come back. */
static void purge(tep_t *e)
{
    unsigned i;
    op_t *op;

    uct_ep_pending_purge(e->ep, purge_cb, e);
    for (i = e->pend_head; i != e->pend_tail; ++i) {
        op = e->pend[i % FIFO_LEN];
        CHECK(op->state == OP_PURGED,
              "ep %u: queued %s seq %" PRIu64 " not purged", e->idx,
              kind_name[op->kind], op->seq);
        op_retire(op);
        op_free(op);
    }
    e->pend_head = e->pend_tail;
}

static int all_done(const tep_t *e)
{
    return e->posted_head == e->posted_tail;
}

static void check_all_completed(tep_t *e);

/* Chaos: every operation of a failed endpoint still completes, once (no
 * zombies); what it did is unknowable. */
static int failed_done(const tep_t *e)
{
    unsigned i;
    op_t *op;

    for (i = e->posted_head; i != e->posted_tail; ++i) {
        op = e->posted[i % FIFO_LEN];
        if (op->has_comp && !op->done) {
            return 0;
        }
    }
    return 1;
}

/* The peer's AMs (peer_streams) all arrived, or its endpoint failed (what
 * it sent may be lost then), or it was killed. */
static int peer_stream_done(void)
{
    const am_track_t *t = &shared->am[PEER_AM_EP];

    return !peer_streams() || peer_killed ||
           __atomic_load_n(&shared->peer_ep_failed, __ATOMIC_ACQUIRE) ||
           (__atomic_load_n(&t->rcvd, __ATOMIC_ACQUIRE) ==
            __atomic_load_n(&t->sent, __ATOMIC_ACQUIRE));
}

static int drained(void)
{
    const tep_t *e;
    unsigned i;

    if (!peer_stream_done()) {
        return 0;
    }
    for (i = 0; i < nep; ++i) {
        e = &eps[i];
        if ((e->pend_head != e->pend_tail) ||
            (e->failed ? !failed_done(e)
                       : (!all_done(e) || (am_rcvd(e) != am_sent(e))))) {
            return 0;
        }
    }
    return 1;
}

static void end_drain(void)
{
    unsigned i, rounds = 0;
    tep_t *e;

    /* Flush until everything is retired and every AM arrived (one flush
     * retires what was posted before it; the AMs need the receiver's
     * progress). A failed endpoint's queue is purged instead. */
    while (!drained()) {
        CHECK(++rounds < 1000, "not drained after 1000 flush rounds");
        for (i = 0; i < nep; ++i) {
            if (eps[i].failed) {
                purge(&eps[i]);
            } else {
                new_flush(&eps[i]);
            }
        }
        WAIT_FOR(({
                     int _ok = 1;
                     for (i = 0; i < nep; ++i) {
                         e = &eps[i];
                         _ok &= e->failed ? failed_done(e)
                                          : ((e->pend_head == e->pend_tail) &&
                                             all_done(e));
                     }
                     _ok;
                 }),
                 "the final flushes did not complete");
        WAIT_FOR(({
                     int _ok = 1;
                     for (i = 0; i < nep; ++i) {
                         _ok &= eps[i].failed ||
                                (am_rcvd(&eps[i]) == am_sent(&eps[i]));
                     }
                     _ok &&peer_stream_done();
                 }),
                 "AMs not delivered");
    }
    for (i = 0; i < nep; ++i) {
        unsigned s;

        e = &eps[i];
        /* A killed peer: only it fails endpoints (nothing injected), and
         * every endpoint that used it after its death learned of it. */
        CHECK(!cfg.kill || !e->failed || e->dst->remote,
              "ep %u failed, its interface is not the killed peer's", i);
        CHECK(!peer_killed || !e->dst->remote || e->failed ||
                  (e->data_ops == e->data_ops_at_kill),
              "ep %u: %u operations after the peer was killed, no error", i,
              e->data_ops - e->data_ops_at_kill);
        total_kill_failed += peer_killed && e->failed;
        if (e->failed) {
            check_all_completed(e);
            /* An error is reported to the handler (once: err_cb). */
            CHECK((e->errors == 0) || (e->err_calls == 1),
                  "ep %u: %u errors, the error handler not called; the"
                  " first: %s",
                  i, e->errors, e->first_error);
            continue;
        }
        for (s = 0; s < SLOTS; ++s) {
            CHECK(e->slots[s].busy == 0, "slot busy after the drain");
            verify_slot(e, s);
        }
        for (s = 0; s < WORDS; ++s) {
            verify_word(e, s);
        }
    }
    flush_iface(&sides[0]);
    if (!sides[1].remote) {
        flush_iface(&sides[1]);
    }
}

static unsigned cancel_done;

static void cancel_comp_cb(uct_completion_t *self)
{
    CHECK(self->count == 0, "cancel flush completion with count %d",
          self->count);
    ++cancel_done;
}

/* Every operation posted has completed once: nothing left in flight. */
static void check_all_completed(tep_t *e)
{
    unsigned i;
    op_t *op;

    for (i = e->posted_head; i != e->posted_tail; ++i) {
        op = e->posted[i % FIFO_LEN];
        CHECK(!op->has_comp || op->done,
              "ep %u: %s seq %" PRIu64 " never completed", e->idx,
              kind_name[op->kind], op->seq);
        op_retire(op);
    }
    fifo_trim(e);
    CHECK(all_done(e), "ep %u: %u operations left", e->idx,
          e->posted_tail - e->posted_head);
}

static void end_cancel(void)
{
    uct_completion_t comps[MAX_EPS];
    unsigned i, want = 0;
    ucs_status_t st;

    ending      = 1;
    cancel_done = 0;
    for (i = 0; i < nep; ++i) {
        purge(&eps[i]);
    }
    for (i = 0; i < nep; ++i) {
        comps[i].func   = cancel_comp_cb;
        comps[i].count  = 1;
        comps[i].status = UCS_OK;
        st = uct_ep_flush(eps[i].ep, UCT_FLUSH_FLAG_CANCEL, &comps[i]);
        CHECK((st == UCS_OK) || (st == UCS_INPROGRESS), "flush(CANCEL): %s",
              ucs_status_string(st));
        want += (st == UCS_INPROGRESS);
    }
    WAIT_FOR(cancel_done == want, "flush(CANCEL) did not complete");
    for (i = 0; i < nep; ++i) {
        check_all_completed(&eps[i]);
    }
}

static void end_destroy(void)
{
    unsigned i;

    ending = 1;
    for (i = 0; i < nep; ++i) {
        purge(&eps[i]);
    }
    for (i = 0; i < nep; ++i) {
        uct_ep_destroy(eps[i].ep);
        eps[i].active = 0;
        check_all_completed(&eps[i]);
    }
}

/* --------------------------------------------------------------- trial */

static void run_trial(void)
{
    unsigned i, issued = 0, r;
    ucs_status_t st;
    tep_t *e;

    pick_config();
    describe();
    if (verbose) {
        printf("# trial %" PRIu64 ": %s\n", trial_seed, trial_desc);
        fflush(stdout);
    }
    if (cfg.split) {
        split_start(); /* before this process's threads start */
        ++total_split;
    }
    /* UCP's async context runs a thread (the connection manager's timer
     * then runs beside the progress calls); poll mode has none. */
    CHECK_OK(ucs_async_context_create(
        cfg.async_thread ? UCS_ASYNC_MODE_THREAD_SPINLOCK : UCS_ASYNC_MODE_POLL,
        &async));
    CHECK_OK(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker));
    md_open();
    st = side_open(&sides[0], 0, NULL);
    if ((st == UCS_OK) && !cfg.split) {
        st = side_open(&sides[1], 1, NULL);
        if (st != UCS_OK) {
            side_close(&sides[0]);
        }
    }
    CHECK(st == UCS_OK, "interface open: %s", ucs_status_string(st));
    side_rkey(&sides[0]);
    if (cfg.split) {
        side_remote(&sides[1]);
    } else {
        side_rkey(&sides[1]);
    }

    ending      = 0;
    peer_killed = 0;
    nep         = cfg.nep;
    free_ops    = NULL;
    ops_live    = 0;
    for (i = 0; i < MAX_OPS; ++i) {
        op_pool[i].state     = OP_FREE;
        op_pool[i].next_free = free_ops;
        free_ops             = &op_pool[i];
    }
    /* ep 0: A to B; ep 1: B to A (split: A to B again, the peer process
     * has no model); ep 2: A to itself. */
    tep_init(&eps[0], 0, &sides[0], &sides[1]);
    if (nep > 1) {
        tep_init(&eps[1], 1, &sides[cfg.split ? 0 : 1],
                 &sides[cfg.split ? 1 : 0]);
    }
    if (nep > 2) {
        tep_init(&eps[2], 2, &sides[0], &sides[0]);
    }
    connect_eps();
    if (rng_pct(50)) {
        /* Connected first (a flush completes once its endpoint is): the
         * operations then meet a running connection, not a pending queue
         * that fills while the connection manager works. */
        for (i = 0; i < nep; ++i) {
            new_flush(&eps[i]);
        }
        WAIT_FOR(({
                     int _ok = 1;
                     for (i = 0; i < nep; ++i) {
                         _ok &= all_done(&eps[i]) &&
                                (eps[i].pend_head == eps[i].pend_tail);
                     }
                     _ok;
                 }),
                 "the first flushes did not complete");
    }

    while (issued < cfg.ops) {
        if ((issued % 64) == 0) {
            peer_check();
        }
        if (cfg.kill && !peer_killed && (issued >= cfg.kill_at)) {
            split_kill();
        }
        e = &eps[rng_below(nep)];
        if (e->failed) {
            for (i = 0; (i < nep) && eps[i].failed; ++i) {
            }
            if (i == nep) {
                break; /* chaos: nothing left to use */
            }
            continue;
        }
        r = rng_below(100);
        if (r < 8) {
            issued += new_put_get(e, K_PUT_SHORT);
        } else if (r < 15) {
            issued += new_put_get(e, K_PUT_BCOPY);
        } else if (r < 27) {
            issued += new_put_get(e, K_PUT_ZCOPY);
        } else if (r < 32) {
            issued += new_put_get(e, K_GET_BCOPY);
        } else if (r < 41) {
            issued += new_put_get(e, K_GET_ZCOPY);
        } else if (r < 48) {
            issued += new_am(e, K_AM_SHORT);
        } else if (r < 51) {
            issued += new_am(e, K_AM_SHORT_IOV);
        } else if (r < 57) {
            issued += new_am(e, K_AM_BCOPY);
        } else if (r < 63) {
            issued += new_am(e, K_AM_ZCOPY);
        } else if (r < 67) {
            issued += new_atomic(e, K_ATOMIC_POST);
        } else if (r < 72) {
            issued += new_atomic(e, K_ATOMIC_FETCH);
        } else if (r < 75) {
            issued += new_atomic(e, K_ATOMIC_CSWAP);
        } else if (r < 78) {
            new_flush(e);
            ++issued;
        } else if (r < 80) {
            flush_nocomp(e);
        } else if (r < 81) {
            flush_iface(local_side(rng_below(2)));
        } else if (r < 85) {
            /* A fence with requests queued would order them only by
             * rc_vqp's own rule; UCP fences with none queued. */
            if (e->pend_head == e->pend_tail) {
                CHECK_OK(uct_ep_fence(e->ep, 0));
                e->fence_seq = e->next_seq;
            }
        } else if (r < 87) {
            release_kept(local_side(rng_below(2)), 1 + rng_below(4));
        } else if (r < 88) {
            iface_fence(local_side(rng_below(2)));
        } else if (r < 89) {
            /* UCP's keepalive: a PROBE among the operations. */
            st = uct_ep_check(e->ep, 0, NULL);
            CHECK((st == UCS_OK) || cfg.chaos, "ep_check: %s",
                  ucs_status_string(st));
        } else if ((r < 90) && cfg.to_iface && !cfg.chaos &&
                   (cfg.cq_len >= 4096) && rng_pct(20)) {
            /* (Not with a small CQ: a new endpoint's reservation needs CQ
             * credits free now, which WQEs in flight may hold.) */
            reconnect(e);
        } else {
            unsigned n = rng_below(4);

            while (n-- > 0) {
                uct_worker_progress(worker);
            }
        }
    }

    if (cfg.split) {
        split_ending();
    }
    switch (cfg.end) {
    case END_DRAIN:
        end_drain();
        break;
    case END_CANCEL:
        end_cancel();
        break;
    default:
        end_destroy();
        break;
    }
    for (i = 0; i < nep; ++i) {
        e = &eps[i];
        if (e->active) {
            uct_ep_destroy(e->ep);
            e->active = 0;
        }
    }
    /* Let passive endpoints see their peers go. */
    for (i = 0; i < 100; ++i) {
        uct_worker_progress(worker);
    }
    if (cfg.split) {
        split_finish();
    }
    CHECK(ops_live == 0, "%u operation records still in use", ops_live);
    side_close(&sides[0]);
    side_close(&sides[1]);
    if (cfg.split) {
        split_unmap();
    }
    for (i = 0; i < nep; ++i) {
        unsigned s;

        for (s = 0; s < SLOTS; ++s) {
            free(eps[i].slots[s].shadow);
        }
    }
    uct_md_close(md);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
}

static void component_open(void)
{
    uct_component_attr_t cattr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
    unsigned i, count;

    CHECK(dlopen(RC_VQP_MODULE, RTLD_NOW | RTLD_GLOBAL) != NULL, "dlopen: %s",
          dlerror());
    setenv("UCX_RC_VQP_SW", "y", 1);
    CHECK_OK(uct_query_components(&components, &count));
    for (i = 0; i < count; ++i) {
        CHECK_OK(uct_component_query(components[i], &cattr));
        if (!strcmp(cattr.name, "rc_vqp")) {
            component = components[i];
        }
    }
    CHECK(component != NULL, "no rc_vqp component");
}

int main(int argc, char **argv)
{
    const char *s   = getenv("UCT_RANDOM_SEED");
    const char *n   = getenv("UCT_RANDOM_TRIALS");
    const char *sp  = getenv("UCT_RANDOM_SPLIT");
    const char *ev  = getenv("UCT_RANDOM_EVENTS");
    uint64_t first  = (s != NULL) ? strtoull(s, NULL, 0) : 1;
    unsigned trials = (n != NULL) ? (unsigned)strtoul(n, NULL, 0)
                      : (getenv("VQP_TEST_VALGRIND") != NULL) ? 30
                                                              : 200;
    unsigned i;
    ssize_t len;

    verbose = (getenv("UCT_RANDOM_VERBOSE") != NULL);
    if (sp != NULL) {
        split_pct = (unsigned)strtoul(sp, NULL, 0);
    }
    if (ev != NULL) {
        events_pct = (unsigned)strtoul(ev, NULL, 0);
    }
    if ((argc == 4) && !strcmp(argv[1], "--peer")) {
        return peer_main(atoi(argv[2]), atoi(argv[3]));
    }
    len = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    CHECK((len > 0) && ((size_t)len < sizeof(self_exe) - 1),
          "readlink(/proc/self/exe): %s", strerror(errno));
    self_exe[len] = '\0';
    component_open();

    for (i = 0; i < trials; ++i) {
        trial_seed = first + i;
        rng.s      = trial_seed * 0x2545f4914f6cdd1dull;
        run_trial();
    }
    printf("# %lu operations, %lu queued as pending, %lu completions,"
           " %lu AM descriptors kept here, %lu reconnects, %lu split trials"
           " (%lu AMs received by peers, %lu sent by them, %lu endpoints"
           " failed by a killed peer at a drain), %lu sleeps on event fds"
           " (%lu timed out, %lu lost wakeups)\n",
           total_ops, total_pending, total_comp, total_kept, total_reconnects,
           total_split, total_peer_am, total_peer_sent, total_kill_failed,
           total_sleeps, total_sleep_timeouts, total_lost_wakeups);
    uct_release_component_list(components);
    printf("%u passed, 0 failed\n", trials);
    return 0;
}
