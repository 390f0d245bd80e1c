/*
 * UCT-level integration tests: the two-process harness. One side of a pair
 * (initiator or target) opens the rc_vqp memory domain, an interface and an
 * endpoint through the public UCT API only, registers a large buffer and
 * exchanges addresses and rkeys with its peer over a socketpair. Also the
 * checking macros, the data patterns and the bounded progress/wait helpers
 * used by test_uct_pair.c.
 */
#ifndef TEST_UCT_PAIR_H_
#define TEST_UCT_PAIR_H_

#include <uct/api/uct.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

/* Any failed check ends the process that saw it; the driver reports it. */
#define CHECK(_cond, _fmt, ...)                                                \
    do {                                                                       \
        if (!(_cond)) {                                                        \
            fprintf(stderr, "[%s pid %d] %s:%d: CHECK(%s) failed: " _fmt "\n", \
                    pair_role_name, (int)getpid(), __FILE__, __LINE__, #_cond, \
                    ##__VA_ARGS__);                                            \
            fflush(stderr);                                                    \
            _exit(1);                                                          \
        }                                                                      \
    } while (0)

#define CHECK_STATUS(_expr, _expected)                                   \
    do {                                                                 \
        ucs_status_t _st = (_expr);                                      \
        CHECK(_st == (_expected), "%s returned %s, expected %s", #_expr, \
              ucs_status_string(_st), ucs_status_string(_expected));     \
    } while (0)

#define AM_ID_DATA 3 /* every active message of the tests */

/* Bounded waits: no test may hang, on any failure. */
#define PAIR_WAIT_SEC 20.0

extern const char *pair_role_name;

typedef struct pair_config {
    unsigned num_qps;
    const char *lb;            /* "dqplb" / "spray" */
    const char *frag_size;     /* UCX memunits, NULL = default */
    const char *stripe_thresh; /* NULL = default */
    const char *tx_queue_len;  /* NULL = default */
    size_t buf_size;           /* registered buffer of each side */
    size_t rx_headroom;
    /* Create the endpoints from the peer's interface address (the
     * connection manager) instead of connecting endpoint to endpoint. */
    int to_iface;
    unsigned target_num_qps;     /* 0: num_qps; else the target's own count */
    const char *connect_timeout; /* NULL = default */
    const char *keepalive;       /* KEEPALIVE_INTERVAL, NULL = default */
    /* The worker's async context in thread mode (as UCP's) instead of poll
     * mode: the interface's timers then run without progress calls. */
    int async_thread;
} pair_config_t;

/* A completion that records how often and when it ran. */
typedef struct test_comp {
    uct_completion_t uc;
    int calls;
    int in_call; /* set while the posting call has not returned */
    int early;   /* ran while in_call was set */
} test_comp_t;

typedef struct pair {
    const pair_config_t *cfg;
    int is_initiator;
    int sock;
    pid_t peer_pid;
    uct_component_h component;
    uct_md_h md;
    ucs_async_context_t *async;
    uct_worker_h worker;
    uct_iface_h iface;
    uct_iface_attr_t attr;
    uct_ep_h ep;
    uint8_t *buf;
    uct_mem_h memh;
    uint64_t remote_buf;
    uct_rkey_bundle_t rkey;
    void *own_ep_addr;
    size_t ep_addr_len;
    void *peer_dev_addr;
    void *peer_ep_addr;
    void *peer_iface_addr; /* to_iface: the peer interface's address */
    /* error handler */
    int err_calls;
    uct_ep_h err_ep;
    ucs_status_t err_status;
    /* active-message receive side (see test_uct_pair.c) */
    void *am_state;
} pair_t;

/* An endpoint to the peer's interface address (to_iface pairs). */
uct_ep_h pair_ep_to_iface(pair_t *p, const void *iface_addr);
/* Progress until an 8-byte put_short on @a ep stops returning NO_RESOURCE:
 * the endpoint is connected. Returns the seconds it took. */
double pair_wait_connected(pair_t *p, uct_ep_h ep);

/* Setup and teardown of one side. */
void pair_init(pair_t *p, const pair_config_t *cfg, int is_initiator, int sock);
void pair_cleanup(pair_t *p);

/* Progress once; yield the CPU when nothing happened. */
unsigned pair_progress(pair_t *p);
double pair_now(void);

/* Progress until *flag >= value or PAIR_WAIT_SEC passes; 1 if reached. */
int pair_wait_int(pair_t *p, const int *flag, int value);

/* Control messages: fixed-size, sent blocking, received while progressing. */
typedef struct pair_msg {
    uint32_t type;
    uint32_t step;
    uint64_t arg;
} pair_msg_t;

void pair_send(pair_t *p, uint32_t type, uint32_t step, uint64_t arg);
void pair_recv(pair_t *p, uint32_t type, uint32_t step, pair_msg_t *msg);

/* Completions. */
void test_comp_init(test_comp_t *c, int count);
void test_comp_returned(test_comp_t *c, ucs_status_t status, const char *op);
/* Wait for the single completion of an INPROGRESS operation, then check it
 * stays single and carries @a expect. */
void test_comp_wait(pair_t *p, test_comp_t *c, ucs_status_t expect,
                    const char *op);

/* flush(ep) with a completion, or flush(iface) by polling. */
void pair_flush_ep(pair_t *p);
void pair_flush_iface(pair_t *p);

/* Data patterns: byte i of pattern @a seed. */
void pattern_fill(uint8_t *dst, size_t len, uint32_t seed);
/* Index of the first mismatch, or -1. */
long pattern_check(const uint8_t *src, size_t len, uint32_t seed);
uint64_t pattern_u64(uint32_t seed);

#endif
