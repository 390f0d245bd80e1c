/*
 * UCT-level integration test of rc_vqp (issue 6): two forked processes drive
 * a connected endpoint pair through the public UCT API only and check data
 * integrity for put/get short/bcopy/zcopy, AM short/short_iov/bcopy/zcopy and
 * atomics over a matrix of sizes, QP counts and load-balancing schemes; UCT
 * semantics (return codes, exactly-once completions never run inside the
 * posting call, flush of ep and iface, fence, pending add/dispatch/purge, AM
 * descriptors kept by the handler, rx_headroom); bad input; injected QP
 * errors (invisible to the user); and a killed peer (error handler once,
 * every operation completed, bounded time).
 *
 * Usage: test_uct_pair [--full] [--only SUBSTRING]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "uct_pair.h"

#include <ucs/config/global_opts.h>
#include <ucs/debug/log.h>
#include <ucs/sys/math.h>

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define KiB 1024ul
#define MiB (1024ul * 1024ul)

#define GUARD      64 /* bytes checked untouched around a region */
#define GUARD_BYTE 0xee
#define REGION_OFF (8 * KiB) /* data regions start here (+ step % 8) */
#define BUF_SLACK  (16 * KiB)

enum { MSG_HELLO = 0, MSG_READY, MSG_DONE, MSG_VERDICT, MSG_END };

typedef enum {
    OP_PUT_SHORT,
    OP_PUT_BCOPY,
    OP_PUT_ZCOPY,
    OP_GET_BCOPY,
    OP_GET_ZCOPY,
    OP_AM_SHORT,
    OP_AM_SHORT_IOV,
    OP_AM_BCOPY,
    OP_AM_ZCOPY,
    OP_LAST
} op_t;

static const char *op_names[] = {"put_short",    "put_bcopy", "put_zcopy",
                                 "get_bcopy",    "get_zcopy", "am_short",
                                 "am_short_iov", "am_bcopy",  "am_zcopy"};

typedef enum {
    SC_MATRIX,
    SC_SEMANTICS,
    SC_FAULTS,
    SC_KILL_BUSY,
    SC_KILL_IDLE,
    SC_FENCE_UNSIGNALED,
    SC_AM_NULL,
    SC_CONNECT,
    SC_CONNECT_SLOW,
    SC_CONNECT_BUSY,
    SC_EVENTS
} sc_kind_t;

typedef struct scenario {
    const char *name;
    sc_kind_t kind;
    pair_config_t cfg;
    const size_t *sizes;    /* SC_MATRIX; 0-terminated */
    const char *faults;     /* VQP_SW_FAULTS of the initiator */
    const char *faults_all; /* VQP_SW_FAULTS of both sides */
    const char *exec;       /* VQP_SW_EXEC of both sides; NULL: default */
    const char *disabled;   /* non-NULL: skipped, with the reason (a TODO) */
} scenario_t;

static void *module_handle;

/* ------------------------------------------------------ receive side (AM) */

#define MAX_KEPT    64
#define FLOOD_MAGIC 0xf100df100df100dull
#define FLOOD_COUNT 2000

typedef struct am_state {
    op_t op;
    size_t size;
    uint32_t seed;
    unsigned hlen;
    int keep;
    int count;
    int bad;
    char why[160];
    size_t headroom;
    int nkept;
    int desc_seen;
    int flood; /* sem_am_flood: sequence numbers in order */
    void *kept[MAX_KEPT];
    size_t kept_len[MAX_KEPT];
    uint64_t kept_hash[MAX_KEPT];
} am_state_t;

static uint64_t fnv1a(const uint8_t *p, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;

    for (i = 0; i < len; ++i) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

static uint32_t step_seed(unsigned step)
{
    return step * 2654435761u + 17;
}

static size_t am_expected_len(const am_state_t *s)
{
    switch (s->op) {
    case OP_AM_SHORT:
        return sizeof(uint64_t) + s->size;
    case OP_AM_ZCOPY:
        return s->hlen + s->size;
    default:
        return s->size;
    }
}

static ucs_status_t am_handler(void *arg, void *data, size_t length,
                               unsigned flags)
{
    pair_t *p     = arg;
    am_state_t *s = p->am_state;
    uint8_t *d    = data;
    uint64_t hdr;
    long bad = -1;

    if (s->flood) {
        uint64_t seq;

        if ((length != 16) || (memcpy(&hdr, d, 8), hdr != FLOOD_MAGIC)) {
            s->bad = 1;
            snprintf(s->why, sizeof(s->why), "flood: message %d: %zu bytes",
                     s->count, length);
        } else {
            memcpy(&seq, d + 8, 8);
            if ((seq != (uint64_t)s->count) && !s->bad) {
                s->bad = 1;
                snprintf(s->why, sizeof(s->why),
                         "flood: message %d carries sequence %lu (lost, "
                         "duplicated or reordered)",
                         s->count, (unsigned long)seq);
            }
        }
        ++s->count;
        return UCS_OK;
    }
    ++s->count;
    if (length != am_expected_len(s)) {
        s->bad = 1;
        snprintf(s->why, sizeof(s->why), "%s: %zu bytes arrived, expected %zu",
                 op_names[s->op], length, am_expected_len(s));
        return UCS_OK;
    }
    switch (s->op) {
    case OP_AM_SHORT:
        memcpy(&hdr, d, sizeof(hdr));
        if (hdr != pattern_u64(s->seed)) {
            s->bad = 1;
            snprintf(s->why, sizeof(s->why),
                     "am_short: header 0x%lx, expected 0x%lx",
                     (unsigned long)hdr, (unsigned long)pattern_u64(s->seed));
            return UCS_OK;
        }
        bad = pattern_check(d + sizeof(hdr), s->size, s->seed);
        break;
    case OP_AM_ZCOPY:
        bad = pattern_check(d, s->hlen, s->seed ^ 0xabcu);
        if (bad >= 0) {
            s->bad = 1;
            snprintf(s->why, sizeof(s->why),
                     "am_zcopy: header byte %ld of %u differs", bad, s->hlen);
            return UCS_OK;
        }
        bad = pattern_check(d + s->hlen, s->size, s->seed);
        break;
    default:
        bad = pattern_check(d, s->size, s->seed);
        break;
    }
    if (bad >= 0) {
        s->bad = 1;
        snprintf(s->why, sizeof(s->why), "%s: payload byte %ld of %zu differs",
                 op_names[s->op], bad, s->size);
        return UCS_OK;
    }
    if (flags & UCT_CB_PARAM_FLAG_DESC) {
        s->desc_seen = 1;
    }
    if (s->keep && (flags & UCT_CB_PARAM_FLAG_DESC) && (s->nkept < MAX_KEPT)) {
        /* The headroom is ours while we own the descriptor. */
        memset(d - s->headroom, 0xa5, s->headroom);
        s->kept[s->nkept]      = data;
        s->kept_len[s->nkept]  = length;
        s->kept_hash[s->nkept] = fnv1a(d, length);
        ++s->nkept;
        return UCS_INPROGRESS;
    }
    return UCS_OK;
}

/* Kept descriptors must still hold their data (no receive reused them). */
static void am_release_kept(pair_t *p)
{
    am_state_t *s = p->am_state;
    const uint8_t *d;
    size_t i;
    int k;

    for (k = 0; k < s->nkept; ++k) {
        d = s->kept[k];
        CHECK(fnv1a(d, s->kept_len[k]) == s->kept_hash[k],
              "kept AM descriptor %d (%zu bytes) changed before its release", k,
              s->kept_len[k]);
        for (i = 0; i < s->headroom; ++i) {
            CHECK(d[(long)i - (long)s->headroom] == 0xa5,
                  "headroom of kept descriptor %d changed", k);
        }
        uct_iface_release_desc((uint8_t *)s->kept[k] - s->headroom);
    }
    s->nkept = 0;
}

static void pair_setup(pair_t *p, const scenario_t *sc, int initiator, int sock,
                       am_state_t *am)
{
    memset(am, 0, sizeof(*am));
    pair_init(p, &sc->cfg, initiator, sock);
    am->headroom = sc->cfg.rx_headroom;
    p->am_state  = am;
    CHECK_STATUS(
        uct_iface_set_am_handler(p->iface, AM_ID_DATA, am_handler, p, 0),
        UCS_OK);
}

/* ------------------------------------------------------ operation helpers */

typedef struct pack_arg {
    const uint8_t *src;
    size_t len;
    int calls;
} pack_arg_t;

static size_t pack_cb(void *dest, void *arg)
{
    pack_arg_t *a = arg;

    ++a->calls;
    memcpy(dest, a->src, a->len);
    return a->len;
}

typedef struct unpack_arg {
    uint8_t *dst;
    size_t len;
    int calls;
    size_t got;
} unpack_arg_t;

static void unpack_cb(void *arg, const void *data, size_t length)
{
    unpack_arg_t *a = arg;

    ++a->calls;
    a->got = length;
    memcpy(a->dst, data, ucs_min(length, a->len));
}

static uct_iov_t make_iov(pair_t *p, void *buf, size_t len)
{
    uct_iov_t iov = {
        .buffer = buf, .length = len, .memh = p->memh, .stride = 0, .count = 1};
    return iov;
}

/* Retry an op while it says NO_RESOURCE (progressing), bounded. */
#define RETRY(_p, _st, _call)                                           \
    do {                                                                \
        double _deadline = pair_now() + PAIR_WAIT_SEC;                  \
        for (;;) {                                                      \
            _st = (_call);                                              \
            if (_st != UCS_ERR_NO_RESOURCE) {                           \
                break;                                                  \
            }                                                           \
            CHECK(pair_now() < _deadline, "%s: NO_RESOURCE for %.0f s", \
                  #_call, PAIR_WAIT_SEC);                               \
            pair_progress(_p);                                          \
        }                                                               \
    } while (0)

/* A zcopy/get with its own completion: INPROGRESS -> exactly one completion
 * after the call returned; UCS_OK -> none. */
#define ZCOPY_OP(_p, _name, _call_with_comp)                                \
    do {                                                                    \
        test_comp_t _c;                                                     \
        ucs_status_t _st;                                                   \
        double _deadline = pair_now() + PAIR_WAIT_SEC;                      \
        for (;;) {                                                          \
            test_comp_init(&_c, 1);                                         \
            _st = _call_with_comp(&_c.uc);                                  \
            test_comp_returned(&_c, _st, _name);                            \
            if (_st != UCS_ERR_NO_RESOURCE) {                               \
                break;                                                      \
            }                                                               \
            CHECK(pair_now() < _deadline, "%s: NO_RESOURCE", _name);        \
            pair_progress(_p);                                              \
        }                                                                   \
        CHECK((_st == UCS_OK) || (_st == UCS_INPROGRESS), "%s returned %s", \
              _name, ucs_status_string(_st));                               \
        if (_st == UCS_INPROGRESS) {                                        \
            test_comp_wait(_p, &_c, UCS_OK, _name);                         \
        }                                                                   \
    } while (0)

static void post_put(pair_t *p, op_t op, uint8_t *src, size_t size,
                     uint64_t raddr)
{
    uct_rkey_t rkey = p->rkey.rkey;
    pack_arg_t pa   = {.src = src, .len = size};
    uct_iov_t iov   = make_iov(p, src, size);
    ucs_status_t st;
    ssize_t ret;
    double deadline;

    switch (op) {
    case OP_PUT_SHORT:
        RETRY(p, st, uct_ep_put_short(p->ep, src, size, raddr, rkey));
        CHECK_STATUS(st, UCS_OK);
        break;
    case OP_PUT_BCOPY:
        deadline = pair_now() + PAIR_WAIT_SEC;
        for (;;) {
            pa.calls = 0;
            ret      = uct_ep_put_bcopy(p->ep, pack_cb, &pa, raddr, rkey);
            if (ret != UCS_ERR_NO_RESOURCE) {
                break;
            }
            CHECK(pa.calls == 0, "put_bcopy packed, then said NO_RESOURCE");
            CHECK(pair_now() < deadline, "put_bcopy: NO_RESOURCE");
            pair_progress(p);
        }
        CHECK(ret == (ssize_t)size, "put_bcopy returned %zd, expected %zu", ret,
              size);
        CHECK(pa.calls == 1, "pack_cb ran %d times", pa.calls);
        break;
    case OP_PUT_ZCOPY:
#define PUT_ZCOPY(_comp) uct_ep_put_zcopy(p->ep, &iov, 1, raddr, rkey, _comp)
        ZCOPY_OP(p, "put_zcopy", PUT_ZCOPY);
#undef PUT_ZCOPY
        break;
    default:
        CHECK(0, "not a put: %d", op);
    }
}

static void post_get(pair_t *p, op_t op, uint8_t *dst, size_t size,
                     uint64_t raddr)
{
    uct_rkey_t rkey = p->rkey.rkey;
    unpack_arg_t ua = {.dst = dst, .len = size};
    uct_iov_t iov   = make_iov(p, dst, size);

    switch (op) {
    case OP_GET_BCOPY:
#define GET_BCOPY(_comp) \
    uct_ep_get_bcopy(p->ep, unpack_cb, &ua, size, raddr, rkey, _comp)
        ZCOPY_OP(p, "get_bcopy", GET_BCOPY);
#undef GET_BCOPY
        CHECK(ua.calls == 1, "get_bcopy: unpack_cb ran %d times", ua.calls);
        CHECK(ua.got == size, "get_bcopy: unpack_cb got %zu bytes, asked %zu",
              ua.got, size);
        break;
    case OP_GET_ZCOPY:
#define GET_ZCOPY(_comp) uct_ep_get_zcopy(p->ep, &iov, 1, raddr, rkey, _comp)
        ZCOPY_OP(p, "get_zcopy", GET_ZCOPY);
#undef GET_ZCOPY
        break;
    default:
        CHECK(0, "not a get: %d", op);
    }
}

static unsigned am_hlen(const pair_t *p)
{
    return (unsigned)ucs_min(16ul, p->attr.cap.am.max_hdr);
}

static void post_am(pair_t *p, op_t op, size_t size, uint32_t seed)
{
    uint8_t *src  = p->buf + REGION_OFF;
    uint64_t hdr  = pattern_u64(seed);
    pack_arg_t pa = {.src = src, .len = size};
    uint8_t zhdr[16];
    uct_iov_t iov;
    ucs_status_t st;
    ssize_t ret;
    double deadline;

    pattern_fill(src, size, seed);
    switch (op) {
    case OP_AM_SHORT:
        RETRY(p, st, uct_ep_am_short(p->ep, AM_ID_DATA, hdr, src, size));
        CHECK_STATUS(st, UCS_OK);
        break;
    case OP_AM_SHORT_IOV:
        iov = make_iov(p, src, size);
        RETRY(p, st, uct_ep_am_short_iov(p->ep, AM_ID_DATA, &iov, 1));
        CHECK_STATUS(st, UCS_OK);
        break;
    case OP_AM_BCOPY:
        deadline = pair_now() + PAIR_WAIT_SEC;
        for (;;) {
            pa.calls = 0;
            ret      = uct_ep_am_bcopy(p->ep, AM_ID_DATA, pack_cb, &pa, 0);
            if (ret != UCS_ERR_NO_RESOURCE) {
                break;
            }
            CHECK(pa.calls == 0, "am_bcopy packed, then said NO_RESOURCE");
            CHECK(pair_now() < deadline, "am_bcopy: NO_RESOURCE");
            pair_progress(p);
        }
        CHECK(ret == (ssize_t)size, "am_bcopy returned %zd, expected %zu", ret,
              size);
        CHECK(pa.calls == 1, "pack_cb ran %d times", pa.calls);
        break;
    case OP_AM_ZCOPY:
        pattern_fill(zhdr, am_hlen(p), seed ^ 0xabcu);
        iov = make_iov(p, src, size);
#define AM_ZCOPY(_comp) \
    uct_ep_am_zcopy(p->ep, AM_ID_DATA, zhdr, am_hlen(p), &iov, 1, 0, _comp)
        ZCOPY_OP(p, "am_zcopy", AM_ZCOPY);
#undef AM_ZCOPY
        break;
    default:
        CHECK(0, "not an AM: %d", op);
    }
}

static int op_fits(const pair_t *p, op_t op, size_t size)
{
    const uct_iface_attr_t *a = &p->attr;
    size_t buf_room           = p->cfg->buf_size - REGION_OFF - 8 - GUARD;

    if (size > buf_room) {
        return 0;
    }
    switch (op) {
    case OP_PUT_SHORT:
        return size <= a->cap.put.max_short;
    case OP_PUT_BCOPY:
        return size <= a->cap.put.max_bcopy;
    case OP_PUT_ZCOPY:
        return size <= a->cap.put.max_zcopy;
    case OP_GET_BCOPY:
        return size <= a->cap.get.max_bcopy;
    case OP_GET_ZCOPY:
        return size <= a->cap.get.max_zcopy;
    case OP_AM_SHORT:
        return size + sizeof(uint64_t) <= a->cap.am.max_short;
    case OP_AM_SHORT_IOV:
        /* Below 8 bytes UCX's generic am_short_iov pads the header with
         * zeros: the receiver sees 8 bytes, which is not what was sent. */
        return (size >= 8) && (size <= a->cap.am.max_short);
    case OP_AM_BCOPY:
        return size <= a->cap.am.max_bcopy;
    case OP_AM_ZCOPY:
        return am_hlen(p) + size <= a->cap.am.max_zcopy;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------ data steps */

static size_t step_off(unsigned step)
{
    return REGION_OFF + (step % 8);
}

/* 0 if the region holds pattern @a seed and its guards are intact, else
 * 1 + the offset of the first bad byte (guards: negative side first). */
static uint64_t region_verify(const uint8_t *region, size_t size, uint32_t seed,
                              const char *what)
{
    long bad = pattern_check(region, size, seed);
    int i;

    if (bad >= 0) {
        fprintf(stderr, "[%s] %s: byte %ld of %zu differs (0x%02x)\n",
                pair_role_name, what, bad, size, region[bad]);
        return 1 + (uint64_t)bad;
    }
    for (i = 0; i < GUARD; ++i) {
        if ((region[-GUARD + i] != GUARD_BYTE) ||
            (region[size + i] != GUARD_BYTE)) {
            fprintf(stderr, "[%s] %s: guard byte %d around %zu bytes changed\n",
                    pair_role_name, what, i, size);
            return 1 + size + (uint64_t)i;
        }
    }
    return 0;
}

/* Put: the target verifies after the initiator's flush completed. */
static void step_put(pair_t *p, unsigned step, op_t op, size_t size,
                     int iface_flush)
{
    uint8_t *region = p->buf + step_off(step);
    uint32_t seed   = step_seed(step);
    pair_msg_t msg;
    char what[64];

    snprintf(what, sizeof(what), "%s %zu B (step %u)", op_names[op], size,
             step);
    if (!p->is_initiator) {
        memset(region - GUARD, GUARD_BYTE, size + 2 * GUARD);
        pair_send(p, MSG_READY, step, 0);
        pair_recv(p, MSG_DONE, step, &msg);
        pair_send(p, MSG_VERDICT, step,
                  region_verify(region, size, seed, what));
        return;
    }
    pair_recv(p, MSG_READY, step, &msg);
    pattern_fill(region, size, seed);
    post_put(p, op, region, size, p->remote_buf + step_off(step));
    if (iface_flush) {
        pair_flush_iface(p);
    } else {
        pair_flush_ep(p);
    }
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_VERDICT, step, &msg);
    CHECK(msg.arg == 0, "%s: the target saw wrong data (bad byte %lu)", what,
          (unsigned long)(msg.arg - 1));
}

/* Get: the initiator verifies after its completion. */
static void step_get(pair_t *p, unsigned step, op_t op, size_t size)
{
    uint8_t *region = p->buf + step_off(step);
    uint32_t seed   = step_seed(step);
    pair_msg_t msg;
    uint64_t verdict;
    char what[64];

    snprintf(what, sizeof(what), "%s %zu B (step %u)", op_names[op], size,
             step);
    if (!p->is_initiator) {
        pattern_fill(region, size, seed);
        pair_send(p, MSG_READY, step, 0);
        pair_recv(p, MSG_DONE, step, &msg);
        return;
    }
    pair_recv(p, MSG_READY, step, &msg);
    memset(region - GUARD, GUARD_BYTE, size + 2 * GUARD);
    post_get(p, op, region, size, p->remote_buf + step_off(step));
    verdict = region_verify(region, size, seed, what);
    pair_send(p, MSG_DONE, step, verdict);
    CHECK(verdict == 0, "%s: wrong data at byte %lu", what,
          (unsigned long)(verdict - 1));
}

/* AM: the handler verifies at the target. */
static void step_am(pair_t *p, unsigned step, op_t op, size_t size, int keep)
{
    am_state_t *s = p->am_state;
    uint32_t seed = step_seed(step);
    pair_msg_t msg;

    if (!p->is_initiator) {
        s->op    = op;
        s->size  = size;
        s->seed  = seed;
        s->hlen  = am_hlen(p);
        s->keep  = keep;
        s->count = 0;
        s->bad   = 0;
        pair_send(p, MSG_READY, step, 0);
        pair_recv(p, MSG_DONE, step, &msg);
        CHECK(pair_wait_int(p, &s->count, 1),
              "%s %zu B: no active message within %.0f s", op_names[op], size,
              PAIR_WAIT_SEC);
        pair_progress(p);
        CHECK(s->count == 1, "%s %zu B: %d messages arrived", op_names[op],
              size, s->count);
        CHECK(!s->bad, "%s", s->why);
        pair_send(p, MSG_VERDICT, step, 0);
        return;
    }
    pair_recv(p, MSG_READY, step, &msg);
    post_am(p, op, size, seed);
    pair_flush_ep(p);
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_VERDICT, step, &msg);
}

/* The value an atomic leaves on a @a size-byte word holding @a old. */
static uint64_t atomic_apply(uct_atomic_op_t op, uint64_t old, uint64_t v,
                             unsigned size)
{
    uint64_t mask = (size == 8) ? UINT64_MAX : UINT32_MAX;

    switch (op) {
    case UCT_ATOMIC_OP_ADD:
        return (old + v) & mask;
    case UCT_ATOMIC_OP_AND:
        return old & v & mask;
    case UCT_ATOMIC_OP_OR:
        return (old | v) & mask;
    case UCT_ATOMIC_OP_XOR:
        return (old ^ v) & mask;
    default: /* UCT_ATOMIC_OP_SWAP */
        return v & mask;
    }
}

static const char *atomic_names[] = {"add",  "and",   "or",     "xor",
                                     "swap", "cswap", "op_last"};

/* Target words of the atomics step, at this offset of each side's buffer:
 * 64-bit, then 32-bit, then a 32-bit guard no atomic may touch. */
#define ATOMIC_OFF 64

/* One post or fetch atomic on the peer's @a size-byte word whose value is
 * *@a expect; checks the fetched old value (4-byte results write 4 bytes)
 * and advances *@a expect. */
static void atomic_one(pair_t *p, unsigned size, int fetch, uct_atomic_op_t op,
                       uint64_t value, uint64_t *expect)
{
    uint64_t raddr  = p->remote_buf + ATOMIC_OFF + ((size == 8) ? 0 : 8);
    uct_rkey_t rkey = p->rkey.rkey;
    uint32_t r32[2] = {0, 0x600dcafe};
    uint64_t r64    = 0, got;
    ucs_status_t st;
    char what[64];

    snprintf(what, sizeof(what), "atomic%u_%s(%s)", size * 8,
             fetch ? "fetch" : "post", atomic_names[op]);
    if (!fetch) {
        RETRY(p, st,
              (size == 8) ? uct_ep_atomic64_post(p->ep, op, value, raddr, rkey)
                          : uct_ep_atomic32_post(p->ep, op, (uint32_t)value,
                                                 raddr, rkey));
        CHECK(st == UCS_OK, "%s returned %s", what, ucs_status_string(st));
        pair_flush_ep(p); /* no ordering between operations without it */
    } else {
#define FETCH(_comp)                                                           \
    ((size == 8)                                                               \
         ? uct_ep_atomic64_fetch(p->ep, op, value, &r64, raddr, rkey, _comp)   \
         : uct_ep_atomic32_fetch(p->ep, op, (uint32_t)value, r32, raddr, rkey, \
                                 _comp))
        ZCOPY_OP(p, what, FETCH);
#undef FETCH
        got = (size == 8) ? r64 : r32[0];
        CHECK(got == *expect, "%s: result 0x%lx, expected 0x%lx", what,
              (unsigned long)got, (unsigned long)*expect);
        CHECK(r32[1] == 0x600dcafe, "%s: wrote past its 4-byte result", what);
    }
    *expect = atomic_apply(op, *expect, value, size);
}

/* cswap32 that hits or misses (compare is the value or not). */
static void atomic_cswap32(pair_t *p, uint32_t compare, uint32_t swap,
                           uint32_t *expect)
{
    uint64_t raddr  = p->remote_buf + ATOMIC_OFF + 8;
    uint32_t r32[2] = {0, 0x600dcafe};

#define CSWAP32(_comp) \
    uct_ep_atomic_cswap32(p->ep, compare, swap, raddr, p->rkey.rkey, r32, _comp)
    ZCOPY_OP(p, "atomic_cswap32", CSWAP32);
#undef CSWAP32
    CHECK(r32[0] == *expect, "cswap32 (%s) result 0x%x, expected 0x%x",
          (compare == *expect) ? "hit" : "miss", r32[0], *expect);
    CHECK(r32[1] == 0x600dcafe, "cswap32 wrote past its 4-byte result");
    if (compare == *expect) {
        *expect = swap;
    }
}

/* Atomics: post add, fetch-add, cswap hit and miss, with result values. */
static void step_atomics(pair_t *p, unsigned step)
{
    uint64_t *target = (uint64_t *)(p->buf + 64);
    uint64_t v0 = pattern_u64(step), swap = pattern_u64(step + 1);
    uint64_t raddr            = p->remote_buf + 64, result;
    uct_rkey_t rkey           = p->rkey.rkey;
    const uct_iface_attr_t *a = &p->attr;
    pair_msg_t msg;
    ucs_status_t st;

    const uint64_t post_ops =
        UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_AND) |
        UCS_BIT(UCT_ATOMIC_OP_OR) | UCS_BIT(UCT_ATOMIC_OP_XOR);
    const uint64_t fetch_ops =
        post_ops | UCS_BIT(UCT_ATOMIC_OP_SWAP) | UCS_BIT(UCT_ATOMIC_OP_CSWAP);
    uint32_t *t32 = (uint32_t *)(p->buf + ATOMIC_OFF + 8);
    uint32_t w0   = (uint32_t)pattern_u64(step + 2), e32c;
    uint64_t e64, e32;
    uct_atomic_op_t op;
    unsigned i, size;

    if (!p->is_initiator) {
        *target = v0;
        t32[0]  = w0;
        t32[1]  = 0x5a5a5a5a; /* guard */
        pair_send(p, MSG_READY, step, 0);
        pair_recv(p, MSG_DONE, step, &msg);
        pair_send(p, MSG_VERDICT, step, *target);
        pair_send(p, MSG_VERDICT, step,
                  ((uint64_t)t32[1] << 32) | (uint64_t)t32[0]);
        return;
    }
    /* Every operation a ConnectX offers through rc_mlx5 with extended
     * atomics, which the software device has: UCP's atomic lanes need the
     * flags. */
    CHECK((a->cap.atomic64.op_flags & post_ops) == post_ops,
          "atomic64 op_flags 0x%lx lack some of 0x%lx",
          (unsigned long)a->cap.atomic64.op_flags, (unsigned long)post_ops);
    CHECK((a->cap.atomic64.fop_flags & fetch_ops) == fetch_ops,
          "atomic64 fop_flags 0x%lx lack some of 0x%lx",
          (unsigned long)a->cap.atomic64.fop_flags, (unsigned long)fetch_ops);
    CHECK((a->cap.atomic32.op_flags & post_ops) == post_ops,
          "atomic32 op_flags 0x%lx lack some of 0x%lx",
          (unsigned long)a->cap.atomic32.op_flags, (unsigned long)post_ops);
    CHECK((a->cap.atomic32.fop_flags & fetch_ops) == fetch_ops,
          "atomic32 fop_flags 0x%lx lack some of 0x%lx",
          (unsigned long)a->cap.atomic32.fop_flags, (unsigned long)fetch_ops);
    pair_recv(p, MSG_READY, step, &msg);

    RETRY(p, st,
          uct_ep_atomic64_post(p->ep, UCT_ATOMIC_OP_ADD, 5, raddr, rkey));
    CHECK_STATUS(st, UCS_OK);
    pair_flush_ep(p); /* no ordering between operations without it */

#define FADD(_comp)                                                          \
    uct_ep_atomic64_fetch(p->ep, UCT_ATOMIC_OP_ADD, 7, &result, raddr, rkey, \
                          _comp)
    result = 0;
    ZCOPY_OP(p, "atomic64_fetch(add)", FADD);
#undef FADD
    CHECK(result == v0 + 5, "fetch-add result 0x%lx, expected 0x%lx",
          (unsigned long)result, (unsigned long)(v0 + 5));

#define CSWAP(_cmp, _comp) \
    uct_ep_atomic_cswap64(p->ep, _cmp, swap, raddr, rkey, &result, _comp)
#define CSWAP_HIT(_comp)  CSWAP(v0 + 12, _comp)
#define CSWAP_MISS(_comp) CSWAP(v0, _comp)
    result = 0;
    ZCOPY_OP(p, "atomic_cswap64(hit)", CSWAP_HIT);
    CHECK(result == v0 + 12, "cswap (hit) result 0x%lx, expected 0x%lx",
          (unsigned long)result, (unsigned long)(v0 + 12));
    result = 0;
    ZCOPY_OP(p, "atomic_cswap64(miss)", CSWAP_MISS);
    CHECK(result == swap, "cswap (miss) result 0x%lx, expected 0x%lx",
          (unsigned long)result, (unsigned long)swap);
#undef CSWAP_MISS
#undef CSWAP_HIT
#undef CSWAP

    /* Every post and fetch operation on both sizes, with varied operands;
     * the 32-bit word and its guard sit right after the 64-bit one. */
    e64 = swap;
    e32 = w0;
    for (size = 8; size >= 4; size -= 4) {
        for (i = 0; i < 2; ++i) {
            for (op = UCT_ATOMIC_OP_ADD; op <= UCT_ATOMIC_OP_SWAP; ++op) {
                if ((i == 0) && (op == UCT_ATOMIC_OP_SWAP)) {
                    continue; /* post has no swap */
                }
                atomic_one(p, size, i, op, pattern_u64(step + 10 + op + 8 * i),
                           (size == 8) ? &e64 : &e32);
            }
        }
    }
    e32c = (uint32_t)e32;
    atomic_cswap32(p, e32c + 1, 0x12345678, &e32c); /* miss */
    atomic_cswap32(p, e32c, 0x12345678, &e32c);     /* hit */
    CHECK(e32c == 0x12345678, "cswap32 did not swap");
    atomic_cswap32(p, 0x87654321, 0x11111111, &e32c); /* miss */

    pair_flush_ep(p);
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_VERDICT, step, &msg);
    CHECK(msg.arg == e64, "target value after atomics 0x%lx, expected 0x%lx",
          (unsigned long)msg.arg, (unsigned long)e64);
    pair_recv(p, MSG_VERDICT, step, &msg);
    CHECK((uint32_t)msg.arg == e32c,
          "32-bit target value after atomics 0x%x, expected 0x%x",
          (uint32_t)msg.arg, e32c);
    CHECK((msg.arg >> 32) == 0x5a5a5a5a,
          "the 32-bit atomics changed the next word to 0x%x",
          (uint32_t)(msg.arg >> 32));
}

static void pair_end(pair_t *p, unsigned step)
{
    pair_msg_t msg;

    /* Neither side tears down while the other still sends. */
    pair_send(p, MSG_END, step, 0);
    pair_recv(p, MSG_END, step, &msg);
}

static void run_matrix(pair_t *p, const scenario_t *sc)
{
    unsigned step = 1, ops_run = 0, keep_steps = 0;
    am_state_t *s = p->am_state;
    const size_t *size;
    op_t op;

    for (size = sc->sizes; *size != 0; ++size) {
        for (op = 0; op < OP_LAST; ++op, ++step) {
            if (!op_fits(p, op, *size)) {
                continue;
            }
            ++ops_run;
            switch (op) {
            case OP_PUT_SHORT:
            case OP_PUT_BCOPY:
            case OP_PUT_ZCOPY:
                step_put(p, step, op, *size, step & 1);
                break;
            case OP_GET_BCOPY:
            case OP_GET_ZCOPY:
                step_get(p, step, op, *size);
                break;
            default:
                keep_steps += (step % 3) == 0;
                step_am(p, step, op, *size, (step % 3) == 0);
                break;
            }
        }
    }
    step_atomics(p, step++);
    if (!p->is_initiator) {
        if (keep_steps > 0) {
            CHECK(s->desc_seen, "no AM handler call carried "
                                "UCT_CB_PARAM_FLAG_DESC: cannot keep data");
            CHECK(s->nkept > 0, "no descriptor was kept");
        }
        am_release_kept(p);
    }
    pair_end(p, step);
    if (p->is_initiator) {
        printf("  %u data operations verified, atomics verified\n", ops_run);
    }
}

/* ------------------------------------------------------- semantics steps */

typedef struct test_pending {
    uct_pending_req_t req;
    pair_t *p;
    uint64_t raddr;
    uint64_t value;
    int calls;
    int purged;
} test_pending_t;

static ucs_status_t pending_cb(uct_pending_req_t *self)
{
    test_pending_t *t = ucs_container_of(self, test_pending_t, req);
    ucs_status_t st;

    ++t->calls;
    st = uct_ep_put_short(t->p->ep, &t->value, sizeof(t->value), t->raddr,
                          t->p->rkey.rkey);
    CHECK((st == UCS_OK) || (st == UCS_ERR_NO_RESOURCE),
          "put_short from a pending callback returned %s",
          ucs_status_string(st));
    return st;
}

static void purge_cb(uct_pending_req_t *self, void *arg)
{
    test_pending_t *t = ucs_container_of(self, test_pending_t, req);

    ++t->purged;
    ++*(int *)arg;
}

/* Post 64-byte put_zcopy operations without progress until the endpoint
 * says NO_RESOURCE; all share @a comp (guard count). Returns the number
 * accepted. */
static unsigned fill_until_no_resource(pair_t *p, test_comp_t *comp)
{
    uct_iov_t iov = make_iov(p, p->buf + REGION_OFF, 64);
    unsigned n;
    ucs_status_t st;

    for (n = 0; n < 100000; ++n) {
        comp->in_call = 1;
        st = uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf + 4 * MiB,
                              p->rkey.rkey, &comp->uc);
        comp->in_call = 0;
        CHECK(comp->early == 0, "put_zcopy: completion ran inside the call");
        if (st == UCS_ERR_NO_RESOURCE) {
            return n;
        }
        CHECK((st == UCS_OK) || (st == UCS_INPROGRESS), "put_zcopy: %s",
              ucs_status_string(st));
        if (st == UCS_INPROGRESS) {
            ++comp->uc.count;
        }
    }
    CHECK(0,
          "put_zcopy never returned NO_RESOURCE in %u posts without "
          "progress",
          n);
    return n;
}

/* Drop the guard of a shared completion and wait for it. */
static void shared_comp_finish(pair_t *p, test_comp_t *comp, const char *what)
{
    if (--comp->uc.count == 0) {
        comp->uc.func(&comp->uc);
    }
    test_comp_wait(p, comp, UCS_OK, what);
}

static void sem_pending(pair_t *p, unsigned step)
{
    uint8_t *vals = p->buf + 128;
    test_pending_t req[3];
    test_comp_t comp;
    pair_msg_t msg;
    unsigned n, i;
    int purged = 0;

    if (!p->is_initiator) {
        memset(vals, 0, 3 * 8);
        pair_send(p, MSG_READY, step, 0);
        pair_recv(p, MSG_DONE, step, &msg);
        for (i = 0; i < 2; ++i) {
            uint64_t v;
            memcpy(&v, vals + 8 * i, 8);
            CHECK(v == pattern_u64(100 + i),
                  "pending request %u: target holds 0x%lx", i,
                  (unsigned long)v);
        }
        pair_send(p, MSG_VERDICT, step, 0);
        return;
    }
    pair_recv(p, MSG_READY, step, &msg);
    memset(req, 0, sizeof(req));
    for (i = 0; i < 3; ++i) {
        req[i].req.func = pending_cb;
        req[i].p        = p;
        req[i].raddr    = p->remote_buf + 128 + 8 * i;
        req[i].value    = pattern_u64(100 + i);
    }

    /* Resources available: BUSY, not queued. */
    CHECK_STATUS(uct_ep_pending_add(p->ep, &req[0].req, 0), UCS_ERR_BUSY);

    test_comp_init(&comp, 1);
    comp.in_call = 0;
    n            = fill_until_no_resource(p, &comp);
    CHECK(n > 0, "NO_RESOURCE before any operation");
    CHECK_STATUS(uct_ep_pending_add(p->ep, &req[0].req, 0), UCS_OK);
    CHECK_STATUS(uct_ep_pending_add(p->ep, &req[1].req, 0), UCS_OK);
    CHECK(req[0].calls == 0, "pending callback ran inside pending_add");
    /* Dispatched once resources return. */
    CHECK(pair_wait_int(p, &req[1].calls, 1) && (req[0].calls >= 1),
          "pending requests not dispatched within %.0f s (calls %d, %d)",
          PAIR_WAIT_SEC, req[0].calls, req[1].calls);
    shared_comp_finish(p, &comp, "shared completion of the filling puts");
    CHECK(comp.early == 0, "shared completion ran early");

    /* Purge hands queued requests back without running them. */
    test_comp_init(&comp, 1);
    comp.in_call = 0;
    fill_until_no_resource(p, &comp);
    req[2].calls = 0;
    CHECK_STATUS(uct_ep_pending_add(p->ep, &req[2].req, 0), UCS_OK);
    uct_ep_pending_purge(p->ep, purge_cb, &purged);
    CHECK(purged == 1 && req[2].purged == 1, "purge returned %d requests",
          purged);
    shared_comp_finish(p, &comp, "shared completion of the filling puts");
    CHECK(req[2].calls == 0, "purged request was dispatched");

    pair_flush_ep(p);
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_VERDICT, step, &msg);
}

/* put (no completion), fence, get of the same bytes: the get must see the
 * put's data. */
static void sem_fence_put_get(pair_t *p, unsigned step, uint8_t *src,
                              uint64_t raddr, size_t size, uint8_t *back,
                              int with_comp)
{
    uct_iov_t iov = make_iov(p, src, size);
    uint32_t seed = step_seed(step) + 1;
    uint64_t verdict;
    ucs_status_t st;
    test_comp_t comp;

    pattern_fill(src, size, seed);
    test_comp_init(&comp, 1);
    RETRY(p, st,
          uct_ep_put_zcopy(p->ep, &iov, 1, raddr, p->rkey.rkey,
                           with_comp ? &comp.uc : NULL));
    test_comp_returned(&comp, st, "put_zcopy before fence");
    CHECK((st == UCS_OK) || (st == UCS_INPROGRESS), "put_zcopy: %s",
          ucs_status_string(st));
    CHECK_STATUS(uct_ep_fence(p->ep, 0), UCS_OK);
    memset(back - GUARD, GUARD_BYTE, size + 2 * GUARD);
    post_get(p, OP_GET_ZCOPY, back, size, raddr);
    verdict = region_verify(back, size, seed, "put, fence, get");
    CHECK(verdict == 0, "put, fence, get read stale data at byte %lu",
          (unsigned long)(verdict - 1));
    if (with_comp && (st == UCS_INPROGRESS)) {
        test_comp_wait(p, &comp, UCS_OK, "put_zcopy before fence");
    }
    pair_flush_ep(p);
}

/* put_short / put_zcopy without a completion, fence, then a get: the get
 * must complete and see the data (once hung: the fenced get waited for
 * operations that never get a CQE of their own). */
static void run_fence_unsignaled(pair_t *p, const scenario_t *sc)
{
    uint64_t value = pattern_u64(7), back = 0;
    uint8_t *region = p->buf + REGION_OFF;

    if (p->is_initiator) {
        post_put(p, OP_PUT_SHORT, (uint8_t *)&value, 8, p->remote_buf + 64);
        CHECK_STATUS(uct_ep_fence(p->ep, 0), UCS_OK);
        {
            unpack_arg_t ua = {.dst = (uint8_t *)&back, .len = 8};
#define GET8(_comp)                                                \
    uct_ep_get_bcopy(p->ep, unpack_cb, &ua, 8, p->remote_buf + 64, \
                     p->rkey.rkey, _comp)
            ZCOPY_OP(p, "get_bcopy after put_short + fence", GET8);
#undef GET8
        }
        CHECK(back == value, "put_short, fence, get_bcopy read 0x%lx",
              (unsigned long)back);
        sem_fence_put_get(p, 1, region, p->remote_buf + REGION_OFF, 2 * MiB,
                          region + 3 * MiB, 0);
    }
    pair_end(p, 2);
}

/* fence: a striped put, fence, a small put into its last bytes: the small
 * one must win. Then (another region) a put without completion, fence, a
 * get of the same bytes must read what the put wrote. */
static void sem_fence(pair_t *p, unsigned step)
{
    const size_t size = 2 * MiB + 13;
    uint8_t *region   = p->buf + step_off(step);
    uint64_t raddr    = p->remote_buf + step_off(step);
    uint32_t seed     = step_seed(step);
    uint64_t tail     = pattern_u64(seed), got;
    pair_msg_t msg;
    uint64_t verdict;

    if (!p->is_initiator) {
        memset(region - GUARD, GUARD_BYTE, size + 2 * GUARD);
        pair_send(p, MSG_READY, step, 0);
        pair_recv(p, MSG_DONE, step, &msg);
        memcpy(&got, region + size - 8, 8);
        /* The tail holds the fenced put_short, the rest the put_zcopy. */
        verdict = (got == tail)
                      ? (uint64_t)(1 + pattern_check(region, size - 8, seed))
                      : 1 + size - 8;
        pair_send(p, MSG_VERDICT, step, verdict);
        return;
    }
    pair_recv(p, MSG_READY, step, &msg);
    pattern_fill(region, size, seed);
    post_put(p, OP_PUT_ZCOPY, region, size, raddr);
    CHECK_STATUS(uct_ep_fence(p->ep, 0), UCS_OK);
    post_put(p, OP_PUT_SHORT, (uint8_t *)&tail, 8, raddr + size - 8);
    pair_flush_ep(p);
    sem_fence_put_get(p, step, region + 4 * MiB, raddr + 4 * MiB, size,
                      region + 7 * MiB, 1);
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_VERDICT, step, &msg);
    CHECK(msg.arg == 0,
          "put, fence, put: the later put did not win "
          "(bad byte %lu)",
          (unsigned long)(msg.arg - 1));
}

/* Many puts without completions; one flush covers them all. */
static void sem_flush_many(pair_t *p, unsigned step, int iface_flush)
{
    const size_t size = MiB + 13;
    const unsigned n  = 6;
    uint32_t seed     = step_seed(step);
    pair_msg_t msg;
    ucs_status_t st;
    uct_iov_t iov;
    unsigned i;
    char what[64];

    if (!p->is_initiator) {
        for (i = 0; i < n; ++i) {
            memset(p->buf + REGION_OFF + i * (size + GUARD) - GUARD, GUARD_BYTE,
                   size + 2 * GUARD);
        }
        pair_send(p, MSG_READY, step, 0);
        pair_recv(p, MSG_DONE, step, &msg);
        for (i = 0; i < n; ++i) {
            snprintf(what, sizeof(what), "put %u of %u before flush", i, n);
            CHECK(region_verify(p->buf + REGION_OFF + i * (size + GUARD), size,
                                seed + i, what) == 0,
                  "%s(%s) completed before the puts were visible",
                  iface_flush ? "uct_iface_flush" : "uct_ep_flush", what);
        }
        pair_send(p, MSG_VERDICT, step, 0);
        return;
    }
    pair_recv(p, MSG_READY, step, &msg);
    for (i = 0; i < n; ++i) {
        uint8_t *src = p->buf + REGION_OFF + i * (size + GUARD);

        pattern_fill(src, size, seed + i);
        iov = make_iov(p, src, size);
        RETRY(p, st,
              uct_ep_put_zcopy(p->ep, &iov, 1,
                               p->remote_buf + REGION_OFF + i * (size + GUARD),
                               p->rkey.rkey, NULL));
        CHECK((st == UCS_OK) || (st == UCS_INPROGRESS), "put_zcopy: %s",
              ucs_status_string(st));
    }
    if (iface_flush) {
        pair_flush_iface(p);
    } else {
        pair_flush_ep(p);
    }
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_VERDICT, step, &msg);
}

/* Invalid requests: a clear error status, nothing started, no crash. */
static void sem_bad_input(pair_t *p)
{
    const uct_iface_attr_t *a = &p->attr;
    uint8_t *buf              = p->buf + REGION_OFF;
    uct_iov_t iov             = make_iov(p, buf, 4096), iov2[17];
    uct_ep_params_t ep_params = {.field_mask = UCT_EP_PARAM_FIELD_IFACE,
                                 .iface      = p->iface};
    unpack_arg_t ua           = {.dst = buf, .len = a->cap.get.max_bcopy + 1};
    uint64_t result;
    uint32_t result32;
    unsigned unsupported;
    size_t i;
    uct_atomic_op_t aop;
    uint8_t *bad_addr;
    test_comp_t comp;
    ucs_status_t st;
    uct_ep_h ep2;

    /* zcopy without memh on an md that needs one */
    iov.memh = UCT_MEM_HANDLE_NULL;
    test_comp_init(&comp, 1);
    st =
        uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf, p->rkey.rkey, &comp.uc);
    test_comp_returned(&comp, st, "put_zcopy without memh");
    CHECK(UCS_STATUS_IS_ERR(st) && (st != UCS_ERR_NO_RESOURCE),
          "put_zcopy without memh returned %s", ucs_status_string(st));

    /* get_bcopy larger than max_bcopy */
    test_comp_init(&comp, 1);
    st = uct_ep_get_bcopy(p->ep, unpack_cb, &ua, a->cap.get.max_bcopy + 1,
                          p->remote_buf, p->rkey.rkey, &comp.uc);
    test_comp_returned(&comp, st, "oversized get_bcopy");
    CHECK(UCS_STATUS_IS_ERR(st) && (st != UCS_ERR_NO_RESOURCE),
          "get_bcopy of max_bcopy+1 returned %s", ucs_status_string(st));

    /* more iov entries than max_iov, for put and get */
    CHECK((a->cap.put.max_iov < 17) && (a->cap.get.max_iov < 17),
          "max_iov put %zu get %zu", a->cap.put.max_iov, a->cap.get.max_iov);
    for (i = 0; i <= a->cap.put.max_iov; ++i) {
        iov2[i] = make_iov(p, buf + 64 * i, 64);
    }
    test_comp_init(&comp, 1);
    st = uct_ep_put_zcopy(p->ep, iov2, a->cap.put.max_iov + 1, p->remote_buf,
                          p->rkey.rkey, &comp.uc);
    test_comp_returned(&comp, st, "put_zcopy with max_iov + 1 entries");
    CHECK(st == UCS_ERR_INVALID_PARAM,
          "put_zcopy with %zu > max_iov entries returned %s",
          a->cap.put.max_iov + 1, ucs_status_string(st));
    test_comp_init(&comp, 1);
    st = uct_ep_get_zcopy(p->ep, iov2, a->cap.get.max_iov + 1, p->remote_buf,
                          p->rkey.rkey, &comp.uc);
    test_comp_returned(&comp, st, "get_zcopy with max_iov + 1 entries");
    CHECK(st == UCS_ERR_INVALID_PARAM,
          "get_zcopy with %zu > max_iov entries returned %s",
          a->cap.get.max_iov + 1, ucs_status_string(st));

    /* Unsupported atomics: every operation an interface does not advertise
     * (post swap and cswap, fetch cswap, which has its own call, and no
     * operation beyond the last) returns UNSUPPORTED and completes nothing.
     * The advertised ones are exercised by the atomics step. */
    unsupported = 0;
    for (aop = UCT_ATOMIC_OP_ADD; aop <= UCT_ATOMIC_OP_LAST; ++aop) {
        if (!(a->cap.atomic64.op_flags & UCS_BIT(aop))) {
            CHECK_STATUS(uct_ep_atomic64_post(p->ep, aop, 1, p->remote_buf + 64,
                                              p->rkey.rkey),
                         UCS_ERR_UNSUPPORTED);
            ++unsupported;
        }
        if (!(a->cap.atomic32.op_flags & UCS_BIT(aop))) {
            CHECK_STATUS(uct_ep_atomic32_post(p->ep, aop, 1, p->remote_buf + 72,
                                              p->rkey.rkey),
                         UCS_ERR_UNSUPPORTED);
            ++unsupported;
        }
        if (!(a->cap.atomic64.fop_flags & UCS_BIT(aop)) ||
            (aop == UCT_ATOMIC_OP_CSWAP)) {
            test_comp_init(&comp, 1);
            st = uct_ep_atomic64_fetch(p->ep, aop, 1, &result,
                                       p->remote_buf + 64, p->rkey.rkey,
                                       &comp.uc);
            test_comp_returned(&comp, st, "atomic64_fetch");
            CHECK(st == UCS_ERR_UNSUPPORTED, "atomic64_fetch(%s) returned %s",
                  atomic_names[aop], ucs_status_string(st));
            ++unsupported;
        }
        if (!(a->cap.atomic32.fop_flags & UCS_BIT(aop)) ||
            (aop == UCT_ATOMIC_OP_CSWAP)) {
            test_comp_init(&comp, 1);
            st = uct_ep_atomic32_fetch(p->ep, aop, 1, &result32,
                                       p->remote_buf + 72, p->rkey.rkey,
                                       &comp.uc);
            test_comp_returned(&comp, st, "atomic32_fetch");
            CHECK(st == UCS_ERR_UNSUPPORTED, "atomic32_fetch(%s) returned %s",
                  atomic_names[aop], ucs_status_string(st));
            ++unsupported;
        }
    }
    /* post: swap, cswap, last on both sizes; fetch: cswap, last on both */
    CHECK(unsupported >= 10, "only %u unsupported atomic calls checked",
          unsupported);

    /* an AM short larger than max_short */
    st = uct_ep_am_short(p->ep, AM_ID_DATA, 0, buf, a->cap.am.max_short);
    CHECK(UCS_STATUS_IS_ERR(st) && (st != UCS_ERR_NO_RESOURCE),
          "am_short of 8+max_short bytes returned %s", ucs_status_string(st));

    if (p->cfg->to_iface) {
        /* connected to the interface already */
        st = uct_ep_connect_to_ep(p->ep, p->peer_dev_addr, p->own_ep_addr);
        CHECK(st == UCS_ERR_INVALID_PARAM,
              "connect_to_ep on an endpoint created from an interface address"
              " returned %s",
              ucs_status_string(st));
    }

    /* connecting to a corrupted endpoint address (ours has the format) */
    bad_addr = malloc(p->ep_addr_len);
    CHECK(bad_addr != NULL, "out of memory");
    CHECK_STATUS(uct_ep_create(&ep_params, &ep2), UCS_OK);
    memcpy(bad_addr, p->own_ep_addr, p->ep_addr_len);
    bad_addr[0] ^= 0x5a; /* version of the address */
    st = uct_ep_connect_to_ep(ep2, p->peer_dev_addr, (void *)bad_addr);
    CHECK(UCS_STATUS_IS_ERR(st),
          "connect_to_ep with a corrupted version byte returned %s",
          ucs_status_string(st));
    uct_ep_destroy(ep2);
    CHECK_STATUS(uct_ep_create(&ep_params, &ep2), UCS_OK);
    memcpy(bad_addr, p->own_ep_addr, p->ep_addr_len);
    memset(bad_addr + 8, 0xff, p->ep_addr_len - 8); /* QP addresses */
    st = uct_ep_connect_to_ep(ep2, p->peer_dev_addr, (void *)bad_addr);
    CHECK(UCS_STATUS_IS_ERR(st),
          "connect_to_ep with garbage QP addresses returned %s",
          ucs_status_string(st));
    uct_ep_destroy(ep2);
    free(bad_addr);

    /* The connected endpoint is unharmed by all of that. */
    CHECK(p->err_calls == 0, "error handler ran after bad input");
    pair_flush_ep(p);
}

/* The target of a step whose AMs are 16 bytes, FLOOD_MAGIC and a sequence
 * number (the handler's flood mode): after @a delay_us without progress,
 * @a count of them must arrive, in order, each once. */
static void flood_target(pair_t *p, unsigned step, int count,
                         useconds_t delay_us, const char *what)
{
    am_state_t *s = p->am_state;
    pair_msg_t msg;

    s->flood = 1;
    s->count = 0;
    s->bad   = 0;
    pair_send(p, MSG_READY, step, 0);
    usleep(delay_us);
    CHECK(pair_wait_int(p, &s->count, count), "%s: %d of %d messages arrived",
          what, s->count, count);
    CHECK(!s->bad, "%s: %s", what, s->why);
    pair_recv(p, MSG_DONE, step, &msg);
    CHECK(s->count == count, "%s: %d messages arrived, expected %d", what,
          s->count, count);
    s->flood = 0;
    pair_send(p, MSG_VERDICT, step, 0);
}

/* Many AMs while the target does not progress: the sender must get
 * NO_RESOURCE (not overrun the receiver), and every message must arrive
 * exactly once and in order (UCP's tag matching relies on FIFO per ep). */
static void sem_am_flood(pair_t *p, unsigned step)
{
    unsigned no_res = 0;
    double deadline;
    pair_msg_t msg;
    ucs_status_t st;
    uint64_t i;

    if (!p->is_initiator) {
        /* No progress at first: receive buffers run out. */
        flood_target(p, step, FLOOD_COUNT, 200000, "flood");
        return;
    }
    pair_recv(p, MSG_READY, step, &msg);
    for (i = 0; i < FLOOD_COUNT; ++i) {
        deadline = pair_now() + PAIR_WAIT_SEC;
        while ((st = uct_ep_am_short(p->ep, AM_ID_DATA, FLOOD_MAGIC, &i,
                                     sizeof(i))) == UCS_ERR_NO_RESOURCE) {
            ++no_res;
            CHECK(pair_now() < deadline, "flood: NO_RESOURCE for %.0f s",
                  PAIR_WAIT_SEC);
            pair_progress(p);
        }
        CHECK_STATUS(st, UCS_OK);
    }
    CHECK(no_res > 0,
          "flood: %d AMs to a target that did not progress "
          "never returned NO_RESOURCE",
          FLOOD_COUNT);
    pair_flush_ep(p);
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_VERDICT, step, &msg);
    CHECK(p->err_calls == 0, "flood: error handler ran (%s)",
          ucs_status_string(p->err_status));
}

/* Pending requests keep their place: while one waits, every operation of
 * the endpoint says NO_RESOURCE, also one whose own resources are there.
 * A fence with a put in flight refuses inline operations (they cannot wait
 * in the core) but would let an am_bcopy queue behind the put: that
 * am_bcopy overtook the queued am_short, and UCP matches messages in the
 * order they arrive. */
typedef struct order_pending {
    uct_pending_req_t req;
    pair_t *p;
    uint64_t seq;
    int bcopy;
    int calls;
} order_pending_t;

static size_t order_pack_cb(void *dest, void *arg)
{
    const uint64_t *seq = arg;
    uint64_t magic      = FLOOD_MAGIC;

    memcpy(dest, &magic, sizeof(magic));
    memcpy((char *)dest + sizeof(magic), seq, sizeof(*seq));
    return sizeof(magic) + sizeof(*seq);
}

static ucs_status_t order_am(pair_t *p, uint64_t *seq, int bcopy)
{
    ssize_t len;

    if (!bcopy) {
        return uct_ep_am_short(p->ep, AM_ID_DATA, FLOOD_MAGIC, seq,
                               sizeof(*seq));
    }
    len = uct_ep_am_bcopy(p->ep, AM_ID_DATA, order_pack_cb, seq, 0);
    return (len >= 0) ? UCS_OK : (ucs_status_t)len;
}

static ucs_status_t order_pending_cb(uct_pending_req_t *self)
{
    order_pending_t *t = ucs_container_of(self, order_pending_t, req);
    ucs_status_t st;

    ++t->calls;
    st = order_am(t->p, &t->seq, t->bcopy);
    CHECK((st == UCS_OK) || (st == UCS_ERR_NO_RESOURCE),
          "AM %lu from a pending callback returned %s", (unsigned long)t->seq,
          ucs_status_string(st));
    return st;
}

#define ORDER_COUNT 3

static void sem_pending_order(pair_t *p, unsigned step)
{
    uct_iov_t iov = make_iov(p, p->buf + REGION_OFF, MiB + 13);
    uint64_t word = pattern_u64(step), seq = 1;
    order_pending_t req[2];
    uint8_t back[8];
    unpack_arg_t ua = {.dst = back, .len = sizeof(back)};
    test_comp_t comp, gcomp;
    pair_msg_t msg;
    ucs_status_t st;
    unsigned i;

    if (!p->is_initiator) {
        flood_target(p, step, ORDER_COUNT, 0, "pending order");
        return;
    }
    pair_recv(p, MSG_READY, step, &msg);
    memset(req, 0, sizeof(req));
    for (i = 0; i < 2; ++i) {
        req[i].req.func = order_pending_cb;
        req[i].p        = p;
        req[i].seq      = i;
        req[i].bcopy    = i;
    }

    /* No progress from here to the dispatch: the put stays in flight. */
    test_comp_init(&comp, 1);
    RETRY(p, st,
          uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf + REGION_OFF,
                           p->rkey.rkey, &comp.uc));
    test_comp_returned(&comp, st, "put_zcopy before the fence");
    CHECK_STATUS(st, UCS_INPROGRESS);
    CHECK_STATUS(uct_ep_fence(p->ep, 0), UCS_OK);
    CHECK_STATUS(order_am(p, &req[0].seq, 0), UCS_ERR_NO_RESOURCE);
    CHECK_STATUS(uct_ep_pending_add(p->ep, &req[0].req, 0), UCS_OK);

    /* Queued ahead: nothing may overtake it. */
    CHECK_STATUS(order_am(p, &seq, 1), UCS_ERR_NO_RESOURCE);
    CHECK_STATUS(uct_ep_put_short(p->ep, &word, sizeof(word),
                                  p->remote_buf + 64, p->rkey.rkey),
                 UCS_ERR_NO_RESOURCE);
    CHECK_STATUS(uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf + REGION_OFF,
                                  p->rkey.rkey, NULL),
                 UCS_ERR_NO_RESOURCE);
    test_comp_init(&gcomp, 1);
    CHECK_STATUS(uct_ep_get_bcopy(p->ep, unpack_cb, &ua, sizeof(back),
                                  p->remote_buf + 64, p->rkey.rkey, &gcomp.uc),
                 UCS_ERR_NO_RESOURCE);
    CHECK_STATUS(uct_ep_flush(p->ep, 0, NULL), UCS_ERR_NO_RESOURCE);
    CHECK_STATUS(uct_ep_pending_add(p->ep, &req[1].req, 0), UCS_OK);
    CHECK(req[0].calls == 0, "pending callback ran without progress");

    CHECK(pair_wait_int(p, &req[1].calls, 1),
          "pending requests not dispatched within %.0f s (calls %d, %d)",
          PAIR_WAIT_SEC, req[0].calls, req[1].calls);
    seq = 2;
    RETRY(p, st, order_am(p, &seq, 0));
    CHECK_STATUS(st, UCS_OK);
    test_comp_wait(p, &comp, UCS_OK, "put_zcopy before the fence");
    CHECK(gcomp.calls == 0, "refused get_bcopy completed");
    pair_flush_ep(p);
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_VERDICT, step, &msg);
}

/* Destroying an endpoint with operations in flight completes each of them
 * once (UCT: canceled), without an error-handler call. Last step: the ep is
 * gone afterwards. */
static void sem_destroy_in_flight(pair_t *p)
{
    test_comp_t comp[4];
    uct_iov_t iov = make_iov(p, p->buf + REGION_OFF, MiB + 13);
    unsigned i, accepted = 0;
    ucs_status_t st;
    int k;

    for (i = 0; i < 4; ++i) {
        test_comp_init(&comp[i], 1);
        st = uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf + REGION_OFF,
                              p->rkey.rkey, &comp[i].uc);
        test_comp_returned(&comp[i], st, "put_zcopy before destroy");
        CHECK((st == UCS_INPROGRESS) || (st == UCS_ERR_NO_RESOURCE),
              "put_zcopy: %s", ucs_status_string(st));
        if (st == UCS_INPROGRESS) {
            ++accepted;
        } else {
            comp[i].calls = -1;
        }
    }
    CHECK(accepted > 0, "nothing accepted");
    uct_ep_destroy(p->ep);
    p->ep = NULL;
    for (k = 0; k < 64; ++k) {
        pair_progress(p);
    }
    for (i = 0; i < 4; ++i) {
        CHECK((comp[i].calls < 0) || (comp[i].calls == 1),
              "operation %u in flight at ep_destroy completed %d times", i,
              comp[i].calls);
    }
    CHECK(p->err_calls == 0, "ep_destroy ran the error handler (%s)",
          ucs_status_string(p->err_status));
}

/* flush(CANCEL) with operations in flight: every operation completes once
 * (done or canceled), the flush completes once, nothing hangs; the ep is
 * unusable afterwards and is destroyed. Last step. */
static void sem_cancel_in_flight(pair_t *p)
{
    test_comp_t comp[4], fcomp;
    uct_iov_t iov = make_iov(p, p->buf + REGION_OFF, MiB + 13);
    unsigned i, accepted = 0;
    ucs_status_t st;
    int k;

    for (i = 0; i < 4; ++i) {
        test_comp_init(&comp[i], 1);
        st = uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf + REGION_OFF,
                              p->rkey.rkey, &comp[i].uc);
        test_comp_returned(&comp[i], st, "put_zcopy before flush(CANCEL)");
        CHECK((st == UCS_INPROGRESS) || (st == UCS_ERR_NO_RESOURCE),
              "put_zcopy: %s", ucs_status_string(st));
        if (st == UCS_INPROGRESS) {
            ++accepted;
        } else {
            comp[i].calls = -1;
        }
    }
    CHECK(accepted > 0, "nothing accepted");
    test_comp_init(&fcomp, 1);
    st = uct_ep_flush(p->ep, UCT_FLUSH_FLAG_CANCEL, &fcomp.uc);
    test_comp_returned(&fcomp, st, "flush(CANCEL)");
    CHECK((st == UCS_OK) || (st == UCS_INPROGRESS), "flush(CANCEL): %s",
          ucs_status_string(st));
    if (st == UCS_INPROGRESS) {
        CHECK(pair_wait_int(p, &fcomp.calls, 1),
              "flush(CANCEL) with %u operations in flight never completed",
              accepted);
    }
    for (k = 0; k < 64; ++k) {
        pair_progress(p);
    }
    CHECK(fcomp.calls <= 1, "flush(CANCEL) completed %d times", fcomp.calls);
    for (i = 0; i < 4; ++i) {
        CHECK((comp[i].calls < 0) || (comp[i].calls == 1),
              "operation %u in flight at flush(CANCEL) completed %d times "
              "(status %s)",
              i, comp[i].calls, ucs_status_string(comp[i].uc.status));
        CHECK((comp[i].calls < 0) || (comp[i].uc.status == UCS_OK) ||
                  (comp[i].uc.status == UCS_ERR_CANCELED),
              "operation %u completed with %s after flush(CANCEL)", i,
              ucs_status_string(comp[i].uc.status));
    }
    CHECK(p->err_calls <= 1, "error handler ran %d times", p->err_calls);
    uct_ep_destroy(p->ep);
    p->ep = NULL;
}

static void run_semantics(pair_t *p, const scenario_t *sc)
{
    unsigned step = 1;

    sem_pending(p, step++);
    sem_fence(p, step++);
    sem_flush_many(p, step++, 0);
    sem_flush_many(p, step++, 1);
    sem_am_flood(p, step++);
    sem_pending_order(p, step++);
    if (p->is_initiator) {
        sem_bad_input(p);
    }
    pair_end(p, step++);
    CHECK(p->err_calls == 0, "error handler ran %d times", p->err_calls);
    if (p->is_initiator && !strcmp(sc->cfg.lb, "spray")) {
        sem_cancel_in_flight(p);
    } else if (p->is_initiator) {
        sem_destroy_in_flight(p);
    }
    pair_end(p, step);
}

/* ---------------------------------------------------------- fault steps */

/* QPN of QP @a i in a packed endpoint address (format version 2): a 9-byte
 * header whose last byte counts the device addresses, those addresses (9
 * bytes each on the software device, type 0x5f), then per QP its 24-bit QPN
 * (big-endian) and, with several devices, a device index; see
 * docs/architecture.md. */
static uint32_t ep_addr_qpn(const pair_t *p, unsigned i)
{
    const uint8_t *a = (const uint8_t *)p->own_ep_addr;
    unsigned num_devs, d;
    size_t off = 9, entry;

    CHECK(p->ep_addr_len >= off, "address of %zu bytes", p->ep_addr_len);
    CHECK(a[0] == 2, "address format version %u", a[0]);
    num_devs = a[8];
    entry    = 3 + (num_devs > 1);
    for (d = 0; d < num_devs; ++d, off += 9) {
        CHECK(a[off] == 0x5f, "device address %u type 0x%02x", d, a[off]);
    }
    off += entry * i;
    CHECK(off + entry <= p->ep_addr_len, "no QP %u in the address", i);
    return ((uint32_t)a[off] << 16) | ((uint32_t)a[off + 1] << 8) | a[off + 2];
}

static void run_faults(pair_t *p, const scenario_t *sc)
{
    const size_t size = 4 * MiB + 13;
    unsigned step     = 1, r;

    for (r = 0; r < 4; ++r) {
        step_put(p, step, OP_PUT_ZCOPY, size, r & 1);
        ++step;
        step_get(p, step, OP_GET_ZCOPY, size);
        ++step;
    }
    /* Striped traffic after the faults still works, small ops as well. */
    step_put(p, step, OP_PUT_BCOPY, 1000, 0);
    ++step;
    step_am(p, step, OP_AM_BCOPY, 1000, 0);
    ++step;
    pair_end(p, step);
    CHECK(p->err_calls == 0,
          "error handler ran (%s) although QPs survived: the injected QP "
          "error was visible to the user",
          ucs_status_string(p->err_status));
}

/* ------------------------------------------------------- killed peer */

#define KILL_OPS 12

static void wait_peer_gone(pair_t *p)
{
    double deadline = pair_now() + 5.0;

    CHECK(kill(p->peer_pid, SIGKILL) == 0, "kill(%d): %s", (int)p->peer_pid,
          strerror(errno));
    while (!((kill(p->peer_pid, 0) != 0) && (errno == ESRCH))) {
        CHECK(pair_now() < deadline, "peer %d still exists after SIGKILL",
              (int)p->peer_pid);
        usleep(1000);
    }
}

static void after_failure_checks(pair_t *p, double t0, const char *what)
{
    double deadline, detect = pair_now() - t0;
    test_comp_t comp;
    ucs_status_t st;
    uct_iov_t iov = make_iov(p, p->buf + REGION_OFF, 4096);

    /* Exactly once, for our endpoint, with an error. */
    deadline = pair_now() + 0.3;
    while (pair_now() < deadline) {
        pair_progress(p);
    }
    CHECK(p->err_calls == 1, "%s: error handler ran %d times", what,
          p->err_calls);
    CHECK(p->err_ep == p->ep, "%s: error handler got ep %p, ours is %p", what,
          (void *)p->err_ep, (void *)p->ep);
    CHECK(UCS_STATUS_IS_ERR(p->err_status), "%s: handler status %s", what,
          ucs_status_string(p->err_status));
    printf("  %s: error handler once (%s) after %.3f s\n", what,
           ucs_status_string(p->err_status), detect);

    /* Later operations fail (now or through their completion). */
    test_comp_init(&comp, 1);
    st =
        uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf, p->rkey.rkey, &comp.uc);
    test_comp_returned(&comp, st, "put_zcopy after failure");
    CHECK(st != UCS_OK, "%s: put_zcopy on the failed ep returned UCS_OK", what);
    if (st == UCS_INPROGRESS) {
        CHECK(pair_wait_int(p, &comp.calls, 1),
              "%s: put_zcopy after failure never completed", what);
        CHECK(UCS_STATUS_IS_ERR(comp.uc.status),
              "%s: put_zcopy after failure completed with %s", what,
              ucs_status_string(comp.uc.status));
    }

    /* flush(CANCEL), as UCP does on a failed lane, completes. */
    test_comp_init(&comp, 1);
    st = uct_ep_flush(p->ep, UCT_FLUSH_FLAG_CANCEL, &comp.uc);
    test_comp_returned(&comp, st, "flush(CANCEL) after failure");
    CHECK((st == UCS_OK) || (st == UCS_INPROGRESS) || UCS_STATUS_IS_ERR(st),
          "flush(CANCEL): %s", ucs_status_string(st));
    if (st == UCS_INPROGRESS) {
        CHECK(pair_wait_int(p, &comp.calls, 1),
              "%s: flush(CANCEL) never completed", what);
    }
    CHECK(p->err_calls == 1, "%s: error handler ran %d times", what,
          p->err_calls);
}

static void run_kill_busy(pair_t *p, const scenario_t *sc)
{
    const size_t size = 2 * MiB + 5;
    test_comp_t comp[KILL_OPS];
    unpack_arg_t ua[KILL_OPS]  = {};
    uint64_t results[KILL_OPS] = {};
    unsigned i, accepted = 0, failed = 0;
    uct_iov_t iov;
    ucs_status_t st;
    pair_msg_t msg;
    double t0;

    if (!p->is_initiator) {
        pair_send(p, MSG_READY, 1, 0);
        pair_recv(p, MSG_DONE, 1, &msg); /* killed before it comes */
        CHECK(0, "the target was not killed");
    }
    pair_recv(p, MSG_READY, 1, &msg);
    for (i = 0; i < KILL_OPS; ++i) {
        /* A mix: striped puts and gets, a get_bcopy, a fetch-add. */
        test_comp_init(&comp[i], 1);
        switch (i % 4) {
        case 0:
            iov = make_iov(p, p->buf + REGION_OFF, size);
            st  = uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf + REGION_OFF,
                                   p->rkey.rkey, &comp[i].uc);
            break;
        case 1:
            iov = make_iov(p, p->buf + REGION_OFF + 3 * MiB, size);
            st  = uct_ep_get_zcopy(p->ep, &iov, 1, p->remote_buf + REGION_OFF,
                                   p->rkey.rkey, &comp[i].uc);
            break;
        case 2:
            ua[i].dst = p->buf + REGION_OFF + 6 * MiB + i * 4096;
            ua[i].len = 4096;
            st        = uct_ep_get_bcopy(p->ep, unpack_cb, &ua[i], 4096,
                                         p->remote_buf + REGION_OFF, p->rkey.rkey,
                                         &comp[i].uc);
            break;
        default:
            st = uct_ep_atomic64_fetch(p->ep, UCT_ATOMIC_OP_ADD, 1, &results[i],
                                       p->remote_buf + 64, p->rkey.rkey,
                                       &comp[i].uc);
            break;
        }
        test_comp_returned(&comp[i], st, "operation before the kill");
        CHECK((st == UCS_INPROGRESS) || (st == UCS_ERR_NO_RESOURCE),
              "operation %u before the kill: %s", i, ucs_status_string(st));
        if (st == UCS_INPROGRESS) {
            ++accepted;
        } else {
            comp[i].calls = -1; /* not started */
        }
    }
    CHECK(accepted > 0, "nothing accepted");
    t0 = pair_now();
    wait_peer_gone(p);
    for (i = 0; i < KILL_OPS; ++i) {
        if (comp[i].calls < 0) {
            continue;
        }
        CHECK(pair_wait_int(p, &comp[i].calls, 1),
              "operation %u of %u in flight at the kill never completed "
              "(%.0f s)",
              i, accepted, PAIR_WAIT_SEC);
        failed += UCS_STATUS_IS_ERR(comp[i].uc.status);
    }
    CHECK(pair_wait_int(p, &p->err_calls, 1),
          "error handler not called within %.0f s of the kill", PAIR_WAIT_SEC);
    for (i = 0; i < KILL_OPS; ++i) {
        CHECK(comp[i].calls <= 1, "operation %u completed %d times", i,
              comp[i].calls);
    }
    CHECK(failed > 0,
          "all %u operations in flight succeeded against a "
          "killed peer",
          accepted);
    printf("  %u of %u operations in flight failed\n", failed, accepted);
    after_failure_checks(p, t0, "killed peer with traffic");
}

/* Diagnostics of the connection manager releasing a passive endpoint. */
static int released_passive;
static char no_answer_line[256]; /* the last "no answer" diagnostic */

static ucs_log_func_rc_t released_log(const char *file, unsigned line,
                                      const char *function,
                                      ucs_log_level_t level,
                                      const ucs_log_component_config_t *comp,
                                      const char *message, va_list ap)
{
    char text[256];

    vsnprintf(text, sizeof(text), message, ap);
    /* Both lines name the peer's device ("peer sw pid N instance M"). */
    if ((strstr(text, "unreachable, released") != NULL) &&
        (strstr(text, " peer sw pid ") != NULL)) {
        ++released_passive;
    }
    if (strstr(text, "no answer from") != NULL) {
        snprintf(no_answer_line, sizeof(no_answer_line), "%s", text);
    }
    /* Diagnostics were raised for this line only: keep the rest quiet. */
    return (level == UCS_LOG_LEVEL_DIAG) ? UCS_LOG_FUNC_RC_STOP
                                         : UCS_LOG_FUNC_RC_CONTINUE;
}

/* The peer's connection to our interface address left a passive endpoint
 * here that nobody calls uct_ep_check on: the interface's keepalive must
 * find the peer gone and release it (once). */
static void wait_passive_released(pair_t *p, double t0)
{
    double deadline = pair_now() + PAIR_WAIT_SEC;

    while ((released_passive == 0) && (pair_now() < deadline)) {
        pair_progress(p);
    }
    CHECK(released_passive == 1,
          "passive endpoint of the dead peer released %d times in %.0f s",
          released_passive, PAIR_WAIT_SEC);
    printf("  passive endpoint of the killed peer released after %.3f s\n",
           pair_now() - t0);
    ucs_log_pop_handler();
}

static void run_kill_idle(pair_t *p, const scenario_t *sc)
{
    const char *env = getenv("UCT_PAIR_DEAD_PEER_SEC");
    double limit    = (env != NULL) ? atof(env) : PAIR_WAIT_SEC;
    pair_msg_t msg;
    ucs_status_t st;
    double t0, deadline;

    if (!p->is_initiator) {
        /* Our RTU (posted when the REP came) must have gone before we are
         * killed: until it arrives the initiator's passive endpoint is
         * unconfirmed, and its keepalive leaves it alone. The engine runs
         * in progress; a loaded machine may not run the idle one in time. */
        for (deadline = pair_now() + 0.05; pair_now() < deadline;) {
            pair_progress(p);
        }
        pair_send(p, MSG_READY, 1, 0);
        pair_recv(p, MSG_DONE, 1, &msg);
        CHECK(0, "the target was not killed");
    }
    pair_recv(p, MSG_READY, 1, &msg);
    if (sc->cfg.keepalive != NULL) {
        ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DIAG;
        ucs_log_push_handler(released_log);
    }
    t0 = pair_now();
    wait_peer_gone(p);
    if (getenv("UCT_PAIR_IDLE_PROBE_PUT") != NULL) {
        /* Diagnostic: an 8-byte put instead of the keepalive probe. */
        uint64_t v = 1;

        st =
            uct_ep_put_short(p->ep, &v, sizeof(v), p->remote_buf, p->rkey.rkey);
        CHECK_STATUS(st, UCS_OK);
    }
    /* What UCP's keepalive does on a p2p lane. */
    st = uct_ep_check(p->ep, 0, NULL);
    CHECK((st == UCS_OK) || (st == UCS_INPROGRESS), "uct_ep_check: %s",
          ucs_status_string(st));
    deadline = pair_now() + limit;
    while ((p->err_calls == 0) && (pair_now() < deadline)) {
        pair_progress(p);
    }
    CHECK(p->err_calls > 0,
          "error handler not called within %.0f s after uct_ep_check on a "
          "dead peer",
          limit);
    after_failure_checks(p, t0, "killed idle peer + ep_check");
    st = uct_ep_check(p->ep, 0, NULL);
    CHECK(!UCS_STATUS_IS_ERR(st) || (st == p->err_status),
          "uct_ep_check after failure: %s", ucs_status_string(st));
    pair_progress(p);
    CHECK(p->err_calls == 1, "error handler ran %d times", p->err_calls);
    if (sc->cfg.keepalive != NULL) {
        wait_passive_released(p, t0);
    }
}

/* ---------------------------------------------- connection manager */

typedef struct connect_pending {
    uct_pending_req_t req;
    pair_t *p;
    uct_ep_h ep;
    uint64_t raddr;
    uint64_t value;
    int calls;
    int order;
    int *seq;
} connect_pending_t;

static ucs_status_t connect_pending_cb(uct_pending_req_t *self)
{
    connect_pending_t *t = ucs_container_of(self, connect_pending_t, req);
    ucs_status_t st;

    ++t->calls;
    t->order = (*t->seq)++;
    st       = uct_ep_put_short(t->ep, &t->value, sizeof(t->value), t->raddr,
                                t->p->rkey.rkey);
    CHECK((st == UCS_OK) || (st == UCS_ERR_NO_RESOURCE),
          "put_short from a pending callback returned %s",
          ucs_status_string(st));
    return st;
}

static void connect_purge_cb(uct_pending_req_t *self, void *arg)
{
    ++*(int *)arg;
}

static size_t connect_pack_cb(void *dest, void *arg)
{
    ++*(int *)arg;
    return 8;
}

/* A second endpoint to the same interface: operations posted while it
 * connects wait in the pending queue and go, in order, once it is up. */
static void connect_pending_step(pair_t *p, unsigned step)
{
    const uint64_t raddr = p->remote_buf + REGION_OFF;
    connect_pending_t t[3];
    int seq = 0, packs = 0, i;
    uint64_t v = 7;
    pair_msg_t msg;
    uct_ep_h ep;

    if (!p->is_initiator) {
        uint64_t *w = (uint64_t *)(p->buf + REGION_OFF);

        pair_recv(p, MSG_READY, step, &msg);
        for (i = 0; i < 3; ++i) {
            CHECK(w[i] == 0x1000 + (uint64_t)i,
                  "word %d written by a pending put is 0x%lx", i,
                  (unsigned long)w[i]);
        }
        pair_send(p, MSG_DONE, step, 0);
        return;
    }
    ep = pair_ep_to_iface(p, p->peer_iface_addr);
    CHECK_STATUS(uct_ep_put_short(ep, &v, sizeof(v), raddr, p->rkey.rkey),
                 UCS_ERR_NO_RESOURCE);
    CHECK(uct_ep_am_bcopy(ep, AM_ID_DATA, connect_pack_cb, &packs, 0) ==
              UCS_ERR_NO_RESOURCE,
          "am_bcopy on a connecting endpoint did not say NO_RESOURCE");
    CHECK(packs == 0, "am_bcopy packed %d times for a refused operation",
          packs);
    CHECK_STATUS(uct_ep_check(ep, 0, NULL), UCS_OK);
    for (i = 0; i < 3; ++i) {
        memset(&t[i], 0, sizeof(t[i]));
        t[i].p        = p;
        t[i].ep       = ep;
        t[i].raddr    = raddr + 8 * i;
        t[i].value    = 0x1000 + i;
        t[i].seq      = &seq;
        t[i].req.func = connect_pending_cb;
        CHECK_STATUS(uct_ep_pending_add(ep, &t[i].req, 0), UCS_OK);
    }
    CHECK(pair_wait_int(p, &t[2].calls, 1),
          "pending requests of a connecting endpoint never ran");
    for (i = 0; i < 3; ++i) {
        CHECK(t[i].order == i, "pending request %d ran as number %d", i,
              t[i].order);
    }
    CHECK_STATUS(uct_ep_put_short(ep, &v, sizeof(v), raddr + 64, p->rkey.rkey),
                 UCS_OK);
    {
        uct_ep_h saved = p->ep;

        p->ep = ep;
        pair_flush_ep(p);
        p->ep = saved;
    }
    pair_send(p, MSG_READY, step, 0);
    pair_recv(p, MSG_DONE, step, &msg);
    uct_ep_destroy(ep);
}

/* Interface addresses that are bad or never answer. */
static void connect_errors_step(pair_t *p, const scenario_t *sc)
{
    size_t len          = p->attr.iface_addr_len;
    uct_ep_params_t eps = {0};
    ucs_log_level_t level;
    uint8_t bad[64];
    char want[64];
    connect_pending_t t;
    double t0, limit;
    int seq = 0, purged = 0;
    uint64_t v = 1;
    ucs_status_t st;
    uct_ep_h ep;

    CHECK(len <= sizeof(bad), "iface address of %zu bytes", len);

    /* Destroyed while connecting: nothing reported, nothing left. */
    ep = pair_ep_to_iface(p, p->peer_iface_addr);
    uct_ep_destroy(ep);
    t0 = pair_now();
    while (pair_now() < t0 + 0.2) {
        pair_progress(p);
    }
    CHECK(p->err_calls == 0, "destroying a connecting ep called the error"
                             " handler");

    /* Another format version (the top byte) is refused. */
    memcpy(bad, p->peer_iface_addr, len);
    bad[3] ^= 0x7f;
    CHECK(!uct_iface_is_reachable(p->iface, p->peer_dev_addr,
                                  (const uct_iface_addr_t *)bad),
          "an interface address of another version is reachable");
    eps.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                     UCT_EP_PARAM_FIELD_IFACE_ADDR;
    eps.iface      = p->iface;
    eps.dev_addr   = p->peer_dev_addr;
    eps.iface_addr = (const uct_iface_addr_t *)bad;
    CHECK_STATUS(uct_ep_create(&eps, &ep), UCS_ERR_INVALID_PARAM);
    /* An interface address without a device address. */
    eps.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_IFACE_ADDR;
    eps.iface_addr = p->peer_iface_addr;
    CHECK_STATUS(uct_ep_create(&eps, &ep), UCS_ERR_INVALID_PARAM);

    /* A QPN nobody listens on: requests go unanswered until the connect
     * timeout; then the error handler runs once and pending requests stay
     * for the user to purge. */
    memcpy(bad, p->peer_iface_addr, len);
    bad[0] = 0x00;
    bad[1] = 0xf0;
    bad[2] = 0xff;
    ep     = pair_ep_to_iface(p, (const uct_iface_addr_t *)bad);
    level  = ucs_global_opts.log_component.log_level;
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DIAG;
    ucs_log_push_handler(released_log);
    no_answer_line[0] = '\0';
    t0                = pair_now();
    CHECK_STATUS(
        uct_ep_put_short(ep, &v, sizeof(v), p->remote_buf, p->rkey.rkey),
        UCS_ERR_NO_RESOURCE);
    memset(&t, 0, sizeof(t));
    t.p        = p;
    t.ep       = ep;
    t.seq      = &seq;
    t.req.func = connect_pending_cb;
    CHECK_STATUS(uct_ep_pending_add(ep, &t.req, 0), UCS_OK);
    CHECK(pair_wait_int(p, &p->err_calls, 1),
          "no error for an endpoint whose peer never answers");
    ucs_log_pop_handler();
    ucs_global_opts.log_component.log_level = level;
    /* The diagnostic says which device did not answer, not only a QPN. */
    snprintf(want, sizeof(want), "no answer from sw pid %u instance ",
             (unsigned)p->peer_pid);
    CHECK(strstr(no_answer_line, want) != NULL,
          "the timeout's diagnostic does not name the peer: '%s'",
          no_answer_line);
    limit = atof(sc->cfg.connect_timeout);
    CHECK((pair_now() - t0 > 0.8 * limit) && (pair_now() - t0 < limit + 3),
          "connect error after %.2f s, timeout %.1f s", pair_now() - t0, limit);
    CHECK(p->err_ep == ep, "error handler got ep %p, not %p", (void *)p->err_ep,
          (void *)ep);
    CHECK_STATUS(p->err_status, UCS_ERR_ENDPOINT_TIMEOUT);
    printf("  unanswered connect: error handler once after %.2f s\n",
           pair_now() - t0);
    st = uct_ep_put_short(ep, &v, sizeof(v), p->remote_buf, p->rkey.rkey);
    CHECK(UCS_STATUS_IS_ERR(st) && (st != UCS_ERR_NO_RESOURCE),
          "put_short on the failed ep returned %s", ucs_status_string(st));
    CHECK(t.calls == 0, "a pending request ran on a failed endpoint");
    uct_ep_pending_purge(ep, connect_purge_cb, &purged);
    CHECK(purged == 1, "purge found %d requests, 1 was queued", purged);
    uct_ep_destroy(ep);
    pair_progress(p);
    CHECK(p->err_calls == 1, "error handler ran %d times", p->err_calls);
    p->err_calls = 0;
}

static void run_connect(pair_t *p, const scenario_t *sc)
{
    unsigned step = 1;

    connect_pending_step(p, step++);
    if (p->is_initiator) {
        connect_errors_step(p, sc);
    }
    /* The first endpoint still works after all that. */
    step_put(p, step, OP_PUT_BCOPY, 1000, 0);
    ++step;
    step_am(p, step, OP_AM_BCOPY, 1000, 0);
    ++step;
    pair_end(p, step);
    CHECK(p->err_calls == 0, "error handler ran: %s",
          ucs_status_string(p->err_status));
}

/* Initiator of the connect scenarios: @a ep to the target's interface got
 * its put out; flush it, tell the target to check it, wait for its word. */
static void connected_put_finish(pair_t *p, uct_ep_h ep)
{
    uct_ep_h saved = p->ep;
    pair_msg_t msg;

    p->ep = ep;
    pair_flush_ep(p);
    p->ep = saved;
    CHECK(p->err_calls == 0, "error handler ran: %s",
          ucs_status_string(p->err_status));
    pair_send(p, MSG_READY, 1, 0);
    pair_recv(p, MSG_DONE, 1, &msg);
    uct_ep_destroy(ep);
    pair_end(p, 2);
}

/* The active side of a connection reads the REP only seconds later (a
 * process busy with another worker, as Open MPI's after its osc created
 * endpoints), while the target's keepalive runs every 0.3 s: the passive
 * endpoint must wait for it, not be probed and released as unreachable,
 * and the connection must then carry data. */
#define SLOW_CONNECT_SEC 2.5

static void run_connect_slow(pair_t *p, const scenario_t *sc)
{
    const uint64_t raddr = p->remote_buf + REGION_OFF;
    uint64_t v           = 0x5107c0;
    double deadline;
    pair_msg_t msg;
    ucs_status_t st;
    uct_ep_h ep;

    if (!p->is_initiator) {
        uint64_t *w = (uint64_t *)(p->buf + REGION_OFF);

        ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DIAG;
        ucs_log_push_handler(released_log);
        /* Progresses (keepalive included) while the initiator is silent. */
        pair_recv(p, MSG_READY, 1, &msg);
        ucs_log_pop_handler();
        CHECK(released_passive == 0,
              "the passive endpoint of a connection still being set up was "
              "released as unreachable (%d)",
              released_passive);
        CHECK(w[0] == v, "the put over the slow connection wrote 0x%lx",
              (unsigned long)w[0]);
        pair_send(p, MSG_DONE, 1, 0);
        pair_end(p, 2);
        return;
    }
    ep = pair_ep_to_iface(p, p->peer_iface_addr); /* the REQ goes now */
    usleep((useconds_t)(SLOW_CONNECT_SEC * 1e6));
    deadline = pair_now() + PAIR_WAIT_SEC;
    while ((st = uct_ep_put_short(ep, &v, sizeof(v), raddr, p->rkey.rkey)) ==
           UCS_ERR_NO_RESOURCE) {
        CHECK(pair_now() < deadline, "not connected after %.0f s",
              PAIR_WAIT_SEC);
        pair_progress(p);
    }
    CHECK_STATUS(st, UCS_OK);
    connected_put_finish(p, ep);
    printf("  connected after %.1f s of silence; the put arrived\n",
           SLOW_CONNECT_SEC);
}

/* The target does not progress its interface for BUSY_TARGET_SEC, three
 * times the connect timeout (a long computation; its worker's async context
 * in thread mode, as UCP's): its async responder answers each REQ with an
 * MRA, so the connection waits instead of failing, and carries data once
 * the target progresses again. Without the responder the error handler runs
 * after the timeout. */
#define BUSY_TARGET_SEC 3.0

/* MRAs the initiator received ("the peer is busy" at debug level). */
static int busy_answers;

static ucs_log_func_rc_t busy_log(const char *file, unsigned line,
                                  const char *function, ucs_log_level_t level,
                                  const ucs_log_component_config_t *comp,
                                  const char *message, va_list ap)
{
    char text[256];

    if (level < UCS_LOG_LEVEL_DEBUG) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    vsnprintf(text, sizeof(text), message, ap);
    busy_answers += (strstr(text, "the peer is busy") != NULL);
    return UCS_LOG_FUNC_RC_STOP; /* debug output raised for this count */
}

static void run_connect_busy(pair_t *p, const scenario_t *sc)
{
    const uint64_t raddr = p->remote_buf + REGION_OFF;
    double limit         = atof(sc->cfg.connect_timeout);
    uint64_t v           = 0xb05ec0;
    double t0, t_conn, deadline;
    ucs_log_level_t level;
    pair_msg_t msg;
    ucs_status_t st;
    uct_ep_h ep;

    if (!p->is_initiator) {
        uint64_t *w = (uint64_t *)(p->buf + REGION_OFF);

        usleep((useconds_t)(BUSY_TARGET_SEC * 1e6)); /* no progress call */
        pair_recv(p, MSG_READY, 1, &msg);
        CHECK(w[0] == v, "the put over the delayed connection wrote 0x%lx",
              (unsigned long)w[0]);
        pair_send(p, MSG_DONE, 1, 0);
        pair_end(p, 2);
        return;
    }
    level = ucs_global_opts.log_component.log_level;
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DEBUG;
    ucs_log_push_handler(busy_log);
    busy_answers = 0;
    t0           = pair_now();
    ep       = pair_ep_to_iface(p, p->peer_iface_addr); /* the REQ goes now */
    deadline = t0 + BUSY_TARGET_SEC + PAIR_WAIT_SEC;
    while ((st = uct_ep_put_short(ep, &v, sizeof(v), raddr, p->rkey.rkey)) ==
           UCS_ERR_NO_RESOURCE) {
        CHECK(p->err_calls == 0,
              "the connection failed after %.2f s (timeout %.1f s): %s",
              pair_now() - t0, limit, ucs_status_string(p->err_status));
        CHECK(pair_now() < deadline, "not connected after %.0f s",
              deadline - t0);
        pair_progress(p);
    }
    CHECK_STATUS(st, UCS_OK);
    t_conn = pair_now() - t0;
    ucs_log_pop_handler();
    ucs_global_opts.log_component.log_level = level;
    CHECK(t_conn > 0.8 * BUSY_TARGET_SEC,
          "connected after %.2f s: the target was to be silent for %.1f s",
          t_conn, BUSY_TARGET_SEC);
    /* Each REQ that reached the busy target got an MRA; after one, the
     * next REQ waits two retry intervals, at most half a timeout (here
     * half: 0.5 s), not the retry pace (a quarter of the timeout here, 13
     * answers in 3 s). */
    CHECK((busy_answers >= 1) &&
              (busy_answers <= (int)(BUSY_TARGET_SEC / (limit / 2)) + 2),
          "%d busy answers (MRA) in %.1f s, timeout %.1f s: the requester "
          "kept resending its REQ at the retry pace",
          busy_answers, t_conn, limit);
    connected_put_finish(p, ep);
    printf("  connected after %.1f s with a connect timeout of %.1f s, %d "
           "busy answers; the put arrived\n",
           t_conn, limit, busy_answers);
}

/* ------------------------------------------------------ events (sleep) */

/* Both sides sleep in poll() on the interface's event fd whenever
 * uct_iface_event_arm says UCS_OK, and must still exchange every AM and see
 * every put/get completion. A poll() that times out while work was waiting
 * is a lost wakeup: the check fails instead of hanging. */
#define EV_AM_MAGIC 0xe7e7e7e7e7e7e7e7ull
#define EV_ROUNDS   20
#define EV_POLL_MS  3000

typedef struct ev_stats {
    unsigned arms, busy, sleeps, wakeups;
} ev_stats_t;

#define EV_PAUSE_US 200000

static int ev_am_count;
static int ev_am_bad;

static ucs_status_t ev_am_handler(void *arg, void *data, size_t length,
                                  unsigned flags)
{
    uint64_t hdr, seq;

    if (length != 16) {
        ev_am_bad = 1;
    } else {
        memcpy(&hdr, data, 8);
        memcpy(&seq, (uint8_t *)data + 8, 8);
        ev_am_bad |= (hdr != EV_AM_MAGIC) || (seq != (uint64_t)ev_am_count);
    }
    ++ev_am_count;
    return UCS_OK;
}

/* Progress until idle, then arm and sleep, until *flag >= value. */
static void ev_sleep_until_ev(pair_t *p, int fd, unsigned events,
                              const int *flag, int value, ev_stats_t *st,
                              const char *what)
{
    double deadline   = pair_now() + PAIR_WAIT_SEC;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ucs_status_t status;
    int ret;

    for (;;) {
        while (uct_worker_progress(p->worker) != 0) {
        }
        if (*(volatile const int *)flag >= value) {
            return;
        }
        CHECK(pair_now() < deadline, "%s: not done after %.0f s (%d of %d)",
              what, PAIR_WAIT_SEC, *flag, value);
        ++st->arms;
        status = uct_iface_event_arm(p->iface, events);
        if (status == UCS_ERR_BUSY) {
            ++st->busy;
            continue;
        }
        CHECK_STATUS(status, UCS_OK);
        ++st->sleeps;
        do {
            ret = poll(&pfd, 1, EV_POLL_MS);
        } while ((ret < 0) && (errno == EINTR));
        CHECK(ret >= 0, "poll: %m");
        if ((ret == 0) && (poll(&pfd, 1, 0) == 0)) {
            /* Armed and idle for seconds (and no wakeup that raced with the
             * timeout): nothing may have been waiting. */
            CHECK((uct_worker_progress(p->worker) == 0) &&
                      (*(volatile const int *)flag < value),
                  "%s: lost wakeup: work was waiting after %d ms asleep", what,
                  EV_POLL_MS);
            continue;
        }
        CHECK(pfd.revents & POLLIN, "poll revents 0x%x", pfd.revents);
        ++st->wakeups;
    }
}

static void ev_sleep_until(pair_t *p, int fd, const int *flag, int value,
                           ev_stats_t *st, const char *what)
{
    ev_sleep_until_ev(p, fd, UCT_EVENT_SEND_COMP | UCT_EVENT_RECV, flag, value,
                      st, what);
}

/* A request in the pending queue: the next AM of the sequence. */
typedef struct ev_pending {
    uct_pending_req_t req;
    pair_t *p;
    uint64_t seq;
    int done;
} ev_pending_t;

static ucs_status_t ev_pending_cb(uct_pending_req_t *self)
{
    ev_pending_t *r = ucs_container_of(self, ev_pending_t, req);
    ucs_status_t status;

    status = uct_ep_am_short(r->p->ep, AM_ID_DATA, EV_AM_MAGIC, &r->seq,
                             sizeof(r->seq));
    if (status == UCS_OK) {
        r->done = 1;
    }
    return status;
}

/* Progress and arm until arm says UCS_OK (bounded). */
static void ev_arm_idle(pair_t *p)
{
    double deadline = pair_now() + PAIR_WAIT_SEC;
    ucs_status_t status;

    while ((status = uct_iface_event_arm(p->iface, UCT_EVENT_SEND_COMP |
                                                       UCT_EVENT_RECV)) ==
           UCS_ERR_BUSY) {
        CHECK(pair_now() < deadline, "arm still BUSY after %.0f s",
              PAIR_WAIT_SEC);
        pair_progress(p);
    }
    CHECK_STATUS(status, UCS_OK);
}

static void ev_am_send(pair_t *p, uint64_t seq)
{
    double deadline = pair_now() + PAIR_WAIT_SEC;
    ucs_status_t status;

    while ((status = uct_ep_am_short(p->ep, AM_ID_DATA, EV_AM_MAGIC, &seq,
                                     sizeof(seq))) == UCS_ERR_NO_RESOURCE) {
        CHECK(pair_now() < deadline, "am_short: no resources for %.0f s",
              PAIR_WAIT_SEC);
        uct_worker_progress(p->worker);
    }
    CHECK_STATUS(status, UCS_OK);
}

static size_t ev_pack_cb(void *dest, void *arg)
{
    uint64_t words[2] = {EV_AM_MAGIC, *(const uint64_t *)arg};

    memcpy(dest, words, sizeof(words));
    return sizeof(words);
}

/* The same AM as ev_am_send's, by am_bcopy with UCT_SEND_FLAG_SIGNALED: what
 * a receiver armed for UCT_EVENT_RECV_SIG only is woken by. */
static void ev_am_send_signaled(pair_t *p, uint64_t seq)
{
    double deadline = pair_now() + PAIR_WAIT_SEC;
    ssize_t len;

    while ((len = uct_ep_am_bcopy(p->ep, AM_ID_DATA, ev_pack_cb, &seq,
                                  UCT_SEND_FLAG_SIGNALED)) ==
           UCS_ERR_NO_RESOURCE) {
        CHECK(pair_now() < deadline, "am_bcopy: no resources for %.0f s",
              PAIR_WAIT_SEC);
        uct_worker_progress(p->worker);
    }
    CHECK(len == 2 * sizeof(uint64_t), "am_bcopy: %zd", len);
}

static void run_events(pair_t *p, const scenario_t *sc)
{
    size_t len    = 1 * MiB + 4096; /* striped over the QPs */
    ev_stats_t st = {0};
    unsigned step = 1;
    test_comp_t comp;
    pair_msg_t msg;
    uct_iov_t iov;
    int fd, fd2, i, target_am = 0;
    ucs_status_t status;

    CHECK((p->attr.cap.event_flags &
           (UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV |
            UCT_IFACE_FLAG_EVENT_FD)) ==
              (UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV |
               UCT_IFACE_FLAG_EVENT_FD),
          "event flags 0x%lx", (unsigned long)p->attr.cap.event_flags);
    CHECK_STATUS(uct_iface_event_fd_get(p->iface, &fd), UCS_OK);
    CHECK_STATUS(uct_iface_event_fd_get(p->iface, &fd2), UCS_OK);
    CHECK(fd == fd2, "event fd changed: %d, then %d", fd, fd2);
    CHECK_STATUS(uct_iface_event_arm(p->iface, 0x100u), UCS_ERR_INVALID_PARAM);
    CHECK_STATUS(
        uct_iface_set_am_handler(p->iface, AM_ID_DATA, ev_am_handler, p, 0),
        UCS_OK);
    /* Both handlers in place before the first AM. */
    pair_send(p, MSG_READY, 0, 0);
    pair_recv(p, MSG_READY, 0, &msg);

    /* AM ping-pong: each side sleeps until the other's message arrives;
     * every other round armed for signaled receives only
     * (UCT_EVENT_RECV_SIG), with signaled AMs. */
    CHECK(p->attr.cap.event_flags & UCT_IFACE_FLAG_EVENT_RECV_SIG,
          "event flags 0x%lx", (unsigned long)p->attr.cap.event_flags);
    for (i = 0; i < EV_ROUNDS; ++i) {
        if (p->is_initiator) {
            (i & 1) ? ev_am_send_signaled(p, i) : ev_am_send(p, i);
        }
        ev_sleep_until_ev(
            p, fd,
            (i & 1) ? UCT_EVENT_RECV_SIG : UCT_EVENT_SEND_COMP | UCT_EVENT_RECV,
            &ev_am_count, i + 1, &st, p->is_initiator ? "AM reply" : "AM");
        if (!p->is_initiator) {
            (i & 1) ? ev_am_send_signaled(p, i) : ev_am_send(p, i);
        }
    }
    CHECK(!ev_am_bad, "an AM arrived with a wrong header or sequence");
    pair_send(p, MSG_DONE, step, 0);
    pair_recv(p, MSG_DONE, step, &msg);
    ++step;

    if (p->is_initiator) {
        iov.memh   = p->memh;
        iov.stride = 0;
        iov.count  = 1;

        /* put_zcopy: a posted WQE is pending work, arm says BUSY; the
         * completion comes while we sleep between arms. */
        pattern_fill(p->buf, len, 7);
        iov.buffer = p->buf;
        iov.length = len;
        test_comp_init(&comp, 1);
        status = uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf, p->rkey.rkey,
                                  &comp.uc);
        test_comp_returned(&comp, status, "put_zcopy");
        CHECK(status == UCS_INPROGRESS, "put_zcopy: %s",
              ucs_status_string(status));
        CHECK_STATUS(uct_iface_event_arm(p->iface, UCT_EVENT_SEND_COMP),
                     UCS_ERR_BUSY);
        ev_sleep_until(p, fd, &comp.calls, 1, &st, "put_zcopy completion");
        CHECK(comp.uc.status == UCS_OK, "put_zcopy: %s",
              ucs_status_string(comp.uc.status));
        pair_send(p, MSG_DONE, step, len);

        /* get_zcopy back into the second half. */
        memset(p->buf + len, 0, len);
        iov.buffer = p->buf + len;
        test_comp_init(&comp, 1);
        status = uct_ep_get_zcopy(p->ep, &iov, 1, p->remote_buf, p->rkey.rkey,
                                  &comp.uc);
        test_comp_returned(&comp, status, "get_zcopy");
        CHECK(status == UCS_INPROGRESS, "get_zcopy: %s",
              ucs_status_string(status));
        CHECK_STATUS(uct_iface_event_arm(p->iface, UCT_EVENT_SEND_COMP),
                     UCS_ERR_BUSY);
        ev_sleep_until(p, fd, &comp.calls, 1, &st, "get_zcopy completion");
        CHECK(comp.uc.status == UCS_OK, "get_zcopy: %s",
              ucs_status_string(comp.uc.status));
        CHECK(pattern_check(p->buf + len, len, 7) < 0,
              "get_zcopy brought back other data");

        /* A zero-length put: arm is BUSY while it is outstanding. */
        test_comp_init(&comp, 1);
        iov.length = 0;
        status = uct_ep_put_zcopy(p->ep, &iov, 1, p->remote_buf, p->rkey.rkey,
                                  &comp.uc);
        test_comp_returned(&comp, status, "put_zcopy 0");
        if (status == UCS_INPROGRESS) {
            CHECK_STATUS(uct_iface_event_arm(p->iface, UCT_EVENT_SEND_COMP),
                         UCS_ERR_BUSY);
            ev_sleep_until(p, fd, &comp.calls, 1, &st, "put_zcopy 0");
        }
        /* Idle: once progress has taken what the peer sent meanwhile
         * (credit grants), arm succeeds. */
        ev_arm_idle(p);
        pair_send(p, MSG_DONE, step + 1, 0);
    } else {
        pair_recv(p, MSG_DONE, step, &msg);
        CHECK(pattern_check(p->buf, msg.arg, 7) < 0,
              "put_zcopy data differs at the target");
        pair_recv(p, MSG_DONE, step + 1, &msg);
    }
    step += 2;

    /* One more AM each way after the RMA, both sides sleeping: each sends
     * only after a pause, so that the other is asleep by then however
     * slowly it runs (a loaded machine may otherwise always find the next
     * message there before it arms). */
    target_am = ev_am_count + 1;
    if (p->is_initiator) {
        usleep(EV_PAUSE_US);
        ev_am_send(p, ev_am_count);
        ev_sleep_until(p, fd, &ev_am_count, target_am, &st, "last AM reply");
    } else {
        ev_sleep_until(p, fd, &ev_am_count, target_am, &st, "last AM");
        usleep(EV_PAUSE_US);
        ev_am_send(p, ev_am_count - 1);
    }
    CHECK(!ev_am_bad, "an AM arrived with a wrong header or sequence");
    ++step;

    /* A sender out of credits sleeps (its pending request waits for a
     * grant, a receive event) instead of spinning on a BUSY arm while the
     * target does not progress; the grant wakes it. */
    if (p->is_initiator) {
        ev_stats_t st2 = {0};
        ev_pending_t r = {.p = p};
        uint64_t seq = ev_am_count, first = ev_am_count;
        double deadline = pair_now() + PAIR_WAIT_SEC;

        pair_send(p, MSG_DONE, step, 0);
        while ((status = uct_ep_am_short(p->ep, AM_ID_DATA, EV_AM_MAGIC, &seq,
                                         sizeof(seq))) == UCS_OK) {
            ++seq;
            CHECK(pair_now() < deadline, "am_short never refused");
        }
        CHECK_STATUS(status, UCS_ERR_NO_RESOURCE);
        r.req.func = ev_pending_cb;
        r.seq      = seq;
        CHECK_STATUS(uct_ep_pending_add(p->ep, &r.req, 0), UCS_OK);
        ev_sleep_until(p, fd, &r.done, 1, &st2, "pending AM");
        CHECK(st2.sleeps > 0,
              "never slept waiting for credits (%u arms, %u busy)", st2.arms,
              st2.busy);
        printf("  %s: %" PRIu64 " AMs, then asleep waiting for credits:"
               " %u arms, %u busy, %u sleeps, %u wakeups\n",
               pair_role_name, seq - first, st2.arms, st2.busy, st2.sleeps,
               st2.wakeups);
        pair_send(p, MSG_DONE, step + 1, seq + 1);
    } else {
        pair_recv(p, MSG_DONE, step, &msg);
        usleep(EV_PAUSE_US); /* the sender runs out of credits meanwhile */
        pair_recv(p, MSG_DONE, step + 1, &msg);
        ev_sleep_until(p, fd, &ev_am_count, (int)msg.arg, &st, "flood AMs");
    }
    CHECK(!ev_am_bad, "an AM arrived with a wrong header or sequence");
    step += 2;
    /* The point of it all: we really slept and were really woken. */
    CHECK(st.wakeups > 0, "never woken by the event fd (%u arms, %u busy)",
          st.arms, st.busy);
    printf("  %s: %u arms, %u busy, %u sleeps, %u wakeups\n", pair_role_name,
           st.arms, st.busy, st.sleeps, st.wakeups);
    pair_end(p, step);
    CHECK(p->err_calls == 0, "error handler ran: %s",
          ucs_status_string(p->err_status));
}

/* --------------------------------------------------------------- driver */

static int role_main(const scenario_t *sc, int initiator, int sock)
{
    am_state_t am;
    pair_t p;

    pair_role_name = initiator ? "initiator" : "target";
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (initiator && (sc->faults != NULL)) {
        setenv("VQP_SW_FAULTS", sc->faults, 1);
    } else if (sc->faults_all != NULL) {
        setenv("VQP_SW_FAULTS", sc->faults_all, 1);
    } else {
        unsetenv("VQP_SW_FAULTS");
    }
    if (sc->exec != NULL) {
        setenv("VQP_SW_EXEC", sc->exec, 1);
    } else {
        unsetenv("VQP_SW_EXEC");
    }
    pair_setup(&p, sc, initiator, sock, &am);
    if (initiator && (sc->faults != NULL)) {
        /* FAULTS_QP12 names QPNs of a fresh device: generation 1 above the
         * 16-bit slot i; slot 0 is the interface's connection-manager UD
         * QP. */
        CHECK((ep_addr_qpn(&p, 1) == 0x10002) &&
                  (ep_addr_qpn(&p, 2) == 0x10003),
              "data QPs are 0x%x/0x%x, the fault spec assumed 0x10002/0x10003",
              ep_addr_qpn(&p, 1), ep_addr_qpn(&p, 2));
    }
    switch (sc->kind) {
    case SC_MATRIX:
        run_matrix(&p, sc);
        break;
    case SC_SEMANTICS:
        run_semantics(&p, sc);
        break;
    case SC_FAULTS:
        run_faults(&p, sc);
        break;
    case SC_KILL_BUSY:
        run_kill_busy(&p, sc);
        break;
    case SC_KILL_IDLE:
        run_kill_idle(&p, sc);
        break;
    case SC_FENCE_UNSIGNALED:
        run_fence_unsignaled(&p, sc);
        break;
    case SC_CONNECT:
        run_connect(&p, sc);
        break;
    case SC_CONNECT_SLOW:
        run_connect_slow(&p, sc);
        break;
    case SC_CONNECT_BUSY:
        run_connect_busy(&p, sc);
        break;
    case SC_EVENTS:
        run_events(&p, sc);
        break;
    case SC_AM_NULL:
        /* UCX's generic am_short_iov sends 8 bytes as header + (NULL, 0) */
        step_am(&p, 1, OP_AM_SHORT_IOV, 8, 0);
        pair_end(&p, 2);
        break;
    }
    pair_cleanup(&p);
    return 0;
}

static int run_scenario(const scenario_t *sc)
{
    int kills = (sc->kind == SC_KILL_BUSY) || (sc->kind == SC_KILL_IDLE);
    pid_t pids[2];
    int sv[2], status[2] = {0, 0}, done[2] = {0, 0}, i, ok = 1;
    double t0 = pair_now(), deadline = t0 + 120.0;

    printf("%s ...\n", sc->name);
    fflush(stdout);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("socketpair");
        return 0;
    }
    for (i = 0; i < 2; ++i) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(sv[1 - i]);
            _exit(role_main(sc, i == 0, sv[i]));
        }
    }
    close(sv[0]);
    close(sv[1]);
    while (!done[0] || !done[1]) {
        for (i = 0; i < 2; ++i) {
            if (!done[i] &&
                (waitpid(pids[i], &status[i], WNOHANG) == pids[i])) {
                done[i] = 1;
            }
        }
        if (pair_now() > deadline) {
            fprintf(stderr, "%s: HANG, killing the pair\n", sc->name);
            for (i = 0; i < 2; ++i) {
                if (!done[i]) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], &status[i], 0);
                    done[i] = 1;
                }
            }
            ok = 0;
        }
        usleep(2000);
    }
    for (i = 0; i < 2; ++i) {
        int expect_kill = kills && (i == 1);

        if (expect_kill
                ? !(WIFSIGNALED(status[i]) && (WTERMSIG(status[i]) == SIGKILL))
                : !(WIFEXITED(status[i]) && (WEXITSTATUS(status[i]) == 0))) {
            fprintf(stderr, "%s: %s ended with status 0x%x\n", sc->name,
                    i ? "target" : "initiator", status[i]);
            ok = 0;
        }
    }
    printf("%s: %s (%.2f s)\n", sc->name, ok ? "ok" : "FAILED",
           pair_now() - t0);
    fflush(stdout);
    return ok;
}

static const size_t ci_sizes[]    = {1, 8, 4095, 65537, MiB + 13, 9 * MiB, 0};
static const size_t ci_sizes_64[] = {65537, 9 * MiB + 3, 0};
static const size_t full_sizes[]  = {1,
                                     7,
                                     8,
                                     9,
                                     64,
                                     119,
                                     120,
                                     121,
                                     128,
                                     129,
                                     1000,
                                     4095,
                                     4096,
                                     4097,
                                     8184,
                                     8192,
                                     8193,
                                     65535,
                                     65537,
                                     256 * KiB + 1,
                                     MiB,
                                     MiB + 13,
                                     3 * MiB + 1,
                                     9 * MiB,
                                     16 * MiB + 5,
                                     33 * MiB - 1,
                                     64 * MiB,
                                     0};

#define CI_BUF   (10 * MiB + BUF_SLACK)
#define FULL_BUF (64 * MiB + BUF_SLACK)
#define HEADROOM 24

#define CFG(_qps, _lb, _frag, _thresh, _buf)                              \
    {                                                                     \
        .num_qps = _qps, .lb = _lb, .frag_size = _frag,                   \
        .stripe_thresh = _thresh, .tx_queue_len = NULL, .buf_size = _buf, \
        .rx_headroom = HEADROOM                                           \
    }

#define MATRIX(_name, _qps, _lb, _frag, _thresh, _buf, _sizes)       \
    {                                                                \
        .name = _name, .kind = SC_MATRIX,                            \
        .cfg = CFG(_qps, _lb, _frag, _thresh, _buf), .sizes = _sizes \
    }

/* The initiator's data QPs 1 and 2 (QPNs of a fresh device, checked by
 * run_faults): QP 1 fails its next WQE as if the peer stopped answering,
 * QP 2 fails its second WQE with "retry exceeded" (0x15). */
#define FAULTS_QP12 "kill=0x10002,err=0x10003:1:0x15"

#define SEMANTICS(_name, _qps, _lb, _headroom)        \
    {                                                 \
        .name = _name, .kind = SC_SEMANTICS, .cfg = { \
            .num_qps       = _qps,                    \
            .lb            = _lb,                     \
            .frag_size     = "256k",                  \
            .stripe_thresh = "64k",                   \
            .tx_queue_len  = "16",                    \
            .buf_size      = CI_BUF,                  \
            .rx_headroom   = _headroom                \
        }                                             \
    }

#define CFGI(_qps, _lb, _tqps)                                            \
    {                                                                     \
        .num_qps = _qps, .lb = _lb, .frag_size = "256k",                  \
        .stripe_thresh = "64k", .tx_queue_len = NULL, .buf_size = CI_BUF, \
        .rx_headroom = HEADROOM, .to_iface = 1, .target_num_qps = _tqps   \
    }

/* 4 QPs via the interface address, one more setting. */
#define CFGI_WITH(_field, _value)                                            \
    {                                                                        \
        .num_qps = 4, .lb = "dqplb", .frag_size = "256k",                    \
        .stripe_thresh = "64k", .buf_size = CI_BUF, .rx_headroom = HEADROOM, \
        .to_iface = 1, ._field = _value                                      \
    }

static const scenario_t ci_scenarios[] = {
    {.name  = "matrix qps=4 dqplb via interface address",
     .kind  = SC_MATRIX,
     .cfg   = CFGI(4, "dqplb", 0),
     .sizes = ci_sizes},
    {.name  = "matrix qps=4 spray via interface address, target qps=1",
     .kind  = SC_MATRIX,
     .cfg   = CFGI(4, "spray", 1),
     .sizes = ci_sizes},
    {.name  = "matrix qps=64 dqplb via interface address",
     .kind  = SC_MATRIX,
     .cfg   = CFGI(64, "dqplb", 0),
     .sizes = ci_sizes_64},
    {.name       = "matrix qps=4 dqplb via interface address, datagrams lost "
                   "and duplicated",
     .kind       = SC_MATRIX,
     .cfg        = CFGI(4, "dqplb", 0),
     .sizes      = ci_sizes_64,
     .faults_all = "seed=11,ud_drop=0.5,ud_dup=0.5"},
    {.name = "semantics qps=4 dqplb via interface address",
     .kind = SC_SEMANTICS,
     .cfg  = {.num_qps       = 4,
              .lb            = "dqplb",
              .frag_size     = "256k",
              .stripe_thresh = "64k",
              .tx_queue_len  = "16",
              .buf_size      = CI_BUF,
              .rx_headroom   = HEADROOM,
              .to_iface      = 1}},
    {.name = "connection manager: pending while connecting, bad addresses, "
             "no answer",
     .kind = SC_CONNECT,
     .cfg  = CFGI_WITH(connect_timeout, "1.5s")},
    /* Operations in flight at the kill: the device must not execute them
     * at the doorbell, before the peer is killed. */
    {.name = "killed peer with traffic qps=4 via interface address",
     .kind = SC_KILL_BUSY,
     .cfg  = CFGI(4, "dqplb", 0),
     .exec = "progress"},
    {.name = "connection manager: the active side reads the REP after "
             "2.5 s, keepalive 0.3 s",
     .kind = SC_CONNECT_SLOW,
     .cfg  = CFGI_WITH(keepalive, "0.3s")},
    {.name = "connection manager: the target does not progress for 3 s, "
             "connect timeout 1 s",
     .kind = SC_CONNECT_BUSY,
     .cfg  = {.num_qps         = 4,
              .lb              = "dqplb",
              .frag_size       = "256k",
              .stripe_thresh   = "64k",
              .buf_size        = CI_BUF,
              .rx_headroom     = HEADROOM,
              .to_iface        = 1,
              .connect_timeout = "1s",
              .async_thread    = 1}},
    {.name = "killed idle peer qps=4 via interface address, keepalive 0.3 s",
     .kind = SC_KILL_IDLE,
     .cfg  = CFGI_WITH(keepalive, "0.3s")},
    MATRIX("matrix qps=1 dqplb", 1, "dqplb", "1m", "64k", CI_BUF, ci_sizes),
    MATRIX("matrix qps=1 spray", 1, "spray", "1m", "64k", CI_BUF, ci_sizes),
    MATRIX("matrix qps=4 dqplb frag=256k", 4, "dqplb", "256k", "64k", CI_BUF,
           ci_sizes),
    MATRIX("matrix qps=4 spray frag=1m", 4, "spray", "1m", "64k", CI_BUF,
           ci_sizes),
    MATRIX("matrix qps=64 dqplb frag=64k", 64, "dqplb", "64k", "64k", CI_BUF,
           ci_sizes_64),
    MATRIX("matrix qps=64 spray frag=64k", 64, "spray", "64k", "64k", CI_BUF,
           ci_sizes_64),
    SEMANTICS("semantics qps=4 dqplb tx_queue_len=16", 4, "dqplb", HEADROOM),
    SEMANTICS("semantics qps=4 spray tx_queue_len=16", 4, "spray", 24),
    SEMANTICS("semantics qps=1 spray tx_queue_len=16", 1, "spray", 0),
    SEMANTICS("semantics qps=1 dqplb tx_queue_len=16", 1, "dqplb", 0),
    {.name   = "matrix qps=4 dqplb frag=256k + injected QP errors",
     .kind   = SC_MATRIX,
     .cfg    = CFG(4, "dqplb", "256k", "64k", CI_BUF),
     .sizes  = ci_sizes,
     .faults = FAULTS_QP12},
    {.name   = "matrix qps=4 spray frag=256k + injected QP errors",
     .kind   = SC_MATRIX,
     .cfg    = CFG(4, "spray", "256k", "64k", CI_BUF),
     .sizes  = ci_sizes,
     .faults = FAULTS_QP12},
    {.name   = "injected QP errors qps=4 dqplb (kill QP 1, error on QP 2)",
     .kind   = SC_FAULTS,
     .cfg    = CFG(4, "dqplb", "256k", "64k", CI_BUF),
     .faults = FAULTS_QP12},
    {.name   = "injected QP errors qps=4 spray (kill QP 1, error on QP 2)",
     .kind   = SC_FAULTS,
     .cfg    = CFG(4, "spray", "256k", "64k", CI_BUF),
     .faults = FAULTS_QP12},
    {.name   = "injected QP errors qps=64 dqplb frag=64k (kill QP 1, error "
               "on QP 2)",
     .kind   = SC_FAULTS,
     .cfg    = CFG(64, "dqplb", "64k", "64k", CI_BUF),
     .faults = FAULTS_QP12},
    {
        .name = "fence after operations without completion qps=1",
        .kind = SC_FENCE_UNSIGNALED,
        .cfg  = CFG(1, "dqplb", "256k", "64k", CI_BUF),
    },
    {
        .name = "fence after operations without completion qps=4",
        .kind = SC_FENCE_UNSIGNALED,
        .cfg  = CFG(4, "dqplb", "256k", "64k", CI_BUF),
    },
    {
        .name = "am_short_iov of 8 bytes (am_short with NULL, 0 payload)",
        .kind = SC_AM_NULL,
        .cfg  = CFG(1, "dqplb", "256k", "64k", CI_BUF),
    },
    {.name = "events: both sides sleep on the event fd qps=4",
     .kind = SC_EVENTS,
     .cfg  = CFG(4, "dqplb", "256k", "64k", CI_BUF)},
    {.name = "killed peer with traffic qps=4",
     .kind = SC_KILL_BUSY,
     .cfg  = CFG(4, "dqplb", "256k", "64k", CI_BUF),
     .exec = "progress"},
    /* ep_check's 0-byte WRITE probe must end in an error to a dead peer. */
    {.name = "killed idle peer qps=4",
     .kind = SC_KILL_IDLE,
     .cfg  = CFG(4, "dqplb", "256k", "64k", CI_BUF)},
};

static const char *full_lbs[]    = {"dqplb", "spray"};
static const unsigned full_qps[] = {1, 4, 64};
static const char *full_frags[]  = {"1m", "256k", "64k"};

int main(int argc, char **argv)
{
    const char *only = NULL;
    int full = 0, failed = 0, ran = 0, i, q, l;
    unsigned n;
    scenario_t sc;
    char *name;

    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--full")) {
            full = 1;
        } else if (!strcmp(argv[i], "--only") && (i + 1 < argc)) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--full] [--only SUBSTRING]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    module_handle = dlopen(RC_VQP_MODULE, RTLD_NOW | RTLD_GLOBAL);
    if (module_handle == NULL) {
        fprintf(stderr, "dlopen(%s): %s\n", RC_VQP_MODULE, dlerror());
        return 1;
    }

    if (!full) {
        for (n = 0; n < sizeof(ci_scenarios) / sizeof(ci_scenarios[0]); ++n) {
            if ((only != NULL) && !strstr(ci_scenarios[n].name, only)) {
                continue;
            }
            if ((ci_scenarios[n].disabled != NULL) &&
                (getenv("UCT_PAIR_RUN_DISABLED") == NULL)) {
                printf("%s: DISABLED (%s)\n", ci_scenarios[n].name,
                       ci_scenarios[n].disabled);
                continue;
            }
            ++ran;
            failed += !run_scenario(&ci_scenarios[n]);
        }
    } else {
        for (q = 0; q < 3; ++q) {
            for (l = 0; l < 2; ++l) {
                for (i = 0; i < 3; ++i) {
                    memset(&sc, 0, sizeof(sc));
                    if (asprintf(&name, "full qps=%u %s frag=%s", full_qps[q],
                                 full_lbs[l], full_frags[i]) < 0) {
                        return 1;
                    }
                    sc.name  = name;
                    sc.kind  = SC_MATRIX;
                    sc.cfg   = (pair_config_t)CFG(full_qps[q], full_lbs[l],
                                                  full_frags[i], "64k", FULL_BUF);
                    sc.sizes = full_sizes;
                    if ((only == NULL) || strstr(name, only)) {
                        ++ran;
                        failed += !run_scenario(&sc);
                    }
                    free(name);
                }
            }
        }
    }
    if (full) {
        for (q = 1; q < 3; ++q) {
            for (l = 0; l < 2; ++l) {
                memset(&sc, 0, sizeof(sc));
                if (asprintf(&name,
                             "full qps=%u %s frag=256k + injected QP "
                             "errors",
                             full_qps[q], full_lbs[l]) < 0) {
                    return 1;
                }
                sc.name   = name;
                sc.kind   = SC_MATRIX;
                sc.cfg    = (pair_config_t)CFG(full_qps[q], full_lbs[l], "256k",
                                               "64k", FULL_BUF);
                sc.sizes  = full_sizes;
                sc.faults = FAULTS_QP12;
                if ((only == NULL) || strstr(name, only)) {
                    ++ran;
                    failed += !run_scenario(&sc);
                }
                free(name);
            }
        }
    }
    printf("%d of %d scenarios failed\n", failed, ran);
    return (failed > 0) || (ran == 0);
}
