/*
 * UCP with error handling (UCP_ERR_HANDLING_MODE_PEER) over rc_vqp alone,
 * two processes: the rendezvous lane is rc_vqp's (its memory domain offers
 * UCT_MD_FLAG_INVALIDATE), a large tag message arrives intact, and when the
 * receiver dies with a rendezvous send outstanding (its RTS received, the
 * data never fetched), UCP invalidates the send buffer's registration
 * through rc_vqp's memory domain and completes the send once, with an
 * error, after the endpoint's error callback.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>

#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../uct/test_check.h"

#define BIG      (1u << 20) /* far above the rendezvous threshold */
#define TAG_DATA 7
#define TAG_LAST 9

static ucp_context_h context;
static ucp_worker_h worker;
static int err_calls;
static ucs_status_t err_status;
static int invalidations; /* rc_vqp's debug line for each */

typedef struct {
    int done;
    ucs_status_t status;
} req_t;

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Seconds for a wait that takes milliseconds natively: memcheck runs the
 * program tens of times slower, and make check-valgrind runs two at once. */
static double timeout_sec(double seconds)
{
    return (getenv("VQP_TEST_VALGRIND") != NULL) ? 10 * seconds : seconds;
}

static ucs_log_func_rc_t count_log(const char *file, unsigned line,
                                   const char *function, ucs_log_level_t level,
                                   const ucs_log_component_config_t *comp,
                                   const char *message, va_list ap)
{
    char text[256];

    vsnprintf(text, sizeof(text), message, ap);
    if (strstr(text, "rc_vqp: invalidated") != NULL) {
        ++invalidations;
    }
    /* Only errors and warnings are printed: the run sets debug level to
     * see rc_vqp's invalidation line. */
    return (level <= UCS_LOG_LEVEL_WARN) ? UCS_LOG_FUNC_RC_CONTINUE
                                         : UCS_LOG_FUNC_RC_STOP;
}

static void err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ++err_calls;
    err_status = status;
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    req_t *r = user_data;

    ++r->done;
    r->status = status;
}

static void recv_cb(void *request, ucs_status_t status,
                    const ucp_tag_recv_info_t *info, void *user_data)
{
    req_t *r = user_data;

    ++r->done;
    r->status = status;
}

/* Waits for @a r (a request pointer or status from a _nbx call). */
static ucs_status_t wait_req(void *ptr, req_t *r, double seconds,
                             const char *what)
{
    double deadline = now() + timeout_sec(seconds);

    if (!UCS_PTR_IS_PTR(ptr)) {
        return UCS_PTR_STATUS(ptr);
    }
    while (r->done == 0) {
        CHECK(now() < deadline, "%s: not complete in %.0f s", what, seconds);
        ucp_worker_progress(worker);
    }
    ucp_request_free(ptr);
    return r->status;
}

static void init_ucp(void)
{
    ucp_params_t params         = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                                   .features   = UCP_FEATURE_TAG};
    ucp_worker_params_t wparams = {.field_mask =
                                       UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                   .thread_mode = UCS_THREAD_MODE_SINGLE};

    CHECK_OK(ucp_init(&params, NULL, &context));
    CHECK_OK(ucp_worker_create(context, &wparams, &worker));
}

/* By words: under valgrind a loop per byte of a large buffer takes
 * seconds. */
static void fill(char *buf, size_t len, unsigned seed)
{
    uint64_t *w = (uint64_t *)buf;
    size_t i;

    for (i = 0; i < len / sizeof(*w); ++i) {
        w[i] = i * 0x9e3779b97f4a7c15ull + seed;
    }
}

/* The receiver: takes one large message and checks it, then waits for the
 * next one's RTS (probed, never received) and dies with it outstanding. */
static void receiver(int sock)
{
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv = recv_cb};
    char *buf = malloc(BIG), *want = malloc(BIG);
    ucp_tag_recv_info_t info;
    ucp_address_t *addr;
    size_t addr_len;
    req_t r = {0};
    void *ptr;
    double deadline;

    init_ucp();
    CHECK_OK(ucp_worker_get_address(worker, &addr, &addr_len));
    CHECK(write(sock, &addr_len, sizeof(addr_len)) == sizeof(addr_len), "w");
    CHECK(write(sock, addr, addr_len) == (ssize_t)addr_len, "write");

    rp.user_data = &r;
    ptr          = ucp_tag_recv_nbx(worker, buf, BIG, TAG_DATA, ~0ull, &rp);
    CHECK_OK(wait_req(ptr, &r, 60, "receiver: first message"));
    fill(want, BIG, 1);
    CHECK(memcmp(buf, want, BIG) == 0, "receiver: data differs");

    deadline = now() + timeout_sec(60);
    while (ucp_tag_probe_nb(worker, TAG_LAST, ~0ull, 0, &info) == NULL) {
        CHECK(now() < deadline, "receiver: no RTS of the second message");
        ucp_worker_progress(worker);
    }
    CHECK(info.length == BIG, "receiver: probed %zu bytes", info.length);
    /* Dies with the sender's rendezvous outstanding, as a crash would:
     * no cleanup (and under valgrind no exit-time leak check, which takes
     * tens of seconds for a UCP process). */
    kill(getpid(), SIGKILL);
    _exit(1);
}

static void sender(int sock, pid_t child)
{
    ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.send = send_cb};
    ucp_ep_params_t ep_params;
    char *buf  = malloc(BIG);
    char *buf2 = malloc(BIG);
    req_t r1 = {0}, r2 = {0}, r3 = {0};
    ucp_address_t *addr;
    size_t addr_len;
    ucp_request_param_t cp;
    void *p2, *p3, *ptr;
    double deadline;
    ucs_status_t st;
    ucp_ep_h ep;
    int wstatus;

    CHECK(read(sock, &addr_len, sizeof(addr_len)) == sizeof(addr_len), "r");
    addr = malloc(addr_len);
    CHECK(read(sock, addr, addr_len) == (ssize_t)addr_len, "read");
    init_ucp();

    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address         = addr;
    ep_params.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb  = err_cb;
    ep_params.err_handler.arg = NULL;
    CHECK_OK(ucp_ep_create(worker, &ep_params, &ep));

    fill(buf, BIG, 1);
    sp.user_data = &r1;
    st = wait_req(ucp_tag_send_nbx(ep, buf, BIG, TAG_DATA, &sp), &r1, 60,
                  "sender: first message");
    CHECK_OK(st);
    printf("ok - %u-byte tag message with error handling arrives intact\n",
           BIG);

    /* The second waits for the receiver's get that never comes. */
    sp.user_data = &r2;
    p2           = ucp_tag_send_nbx(ep, buf2, BIG, TAG_LAST, &sp);
    CHECK(UCS_PTR_IS_PTR(p2), "second send completed at once: %s",
          ucs_status_string(UCS_PTR_STATUS(p2)));
    deadline = now() + timeout_sec(60);
    while (waitpid(child, &wstatus, WNOHANG) == 0) {
        CHECK(now() < deadline, "receiver did not exit");
        ucp_worker_progress(worker);
    }
    CHECK(WIFSIGNALED(wstatus) && (WTERMSIG(wstatus) == SIGKILL),
          "receiver failed (status 0x%x)", wstatus);
    CHECK(r2.done == 0, "rendezvous send completed before the failure");

    /* rc_vqp's invalidation line is at debug level, which only this part
     * runs at (count_log prints only warnings and errors; UCS read
     * UCX_LOG_LEVEL when it loaded). */
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DEBUG;
    /* Traffic to the dead peer makes the endpoint's QPs notice. */
    sp.user_data = &r3;
    p3           = ucp_tag_send_nbx(ep, buf, 8, TAG_DATA, &sp);
    deadline     = now() + timeout_sec(120);
    while ((err_calls == 0) || (r2.done == 0)) {
        CHECK(now() < deadline, "in 120 s: %d error callbacks, send %d",
              err_calls, r2.done);
        ucp_worker_progress(worker);
    }
    st = wait_req(p2, &r2, 10, "sender: rendezvous send");
    CHECK(UCS_STATUS_IS_ERR(st), "rendezvous send completed with %s",
          ucs_status_string(st));
    CHECK(r2.done == 1, "rendezvous send completed %d times", r2.done);
    CHECK(err_calls == 1, "error callback ran %d times", err_calls);
    CHECK(invalidations >= 1,
          "the send completed without invalidating its registration");
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_WARN;
    printf("ok - receiver died with a rendezvous outstanding: error callback "
           "once (%s), send completed once (%s) after %d invalidation(s)\n",
           ucs_status_string(err_status), ucs_status_string(st), invalidations);
    (void)wait_req(p3, &r3, 10, "sender: small send");

    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags        = UCP_EP_CLOSE_FLAG_FORCE;
    ptr             = ucp_ep_close_nbx(ep, &cp);
    deadline        = now() + timeout_sec(10);
    while (UCS_PTR_IS_PTR(ptr) &&
           (ucp_request_check_status(ptr) == UCS_INPROGRESS)) {
        CHECK(now() < deadline, "endpoint close not done in 10 s");
        ucp_worker_progress(worker);
    }
    if (UCS_PTR_IS_PTR(ptr)) {
        ucp_request_free(ptr);
    }
    free(addr);
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    free(buf);
    free(buf2);
}

int main(void)
{
    int sv[2];
    pid_t child;

    CHECK(dlopen(RC_VQP_MODULE, RTLD_NOW | RTLD_GLOBAL) != NULL, "dlopen: %s",
          dlerror());
    setenv("UCX_TLS", "rc_vqp", 1);
    setenv("UCX_NET_DEVICES", "vqp_sw0", 1);
    setenv("UCX_RC_VQP_SW", "y", 1);
    /* A dead peer is found in about a second. */
    setenv("UCX_RC_VQP_TIMEOUT", "50ms", 1);
    setenv("UCX_RC_VQP_RETRY_COUNT", "3", 1);
    ucs_log_push_handler(count_log);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %m");
    child = fork();
    CHECK(child >= 0, "fork: %m");
    if (child == 0) {
        close(sv[0]);
        receiver(sv[1]);
        return 0;
    }
    close(sv[1]);
    sender(sv[0], child);
    printf("2 passed, 0 failed\n");
    return 0;
}
