/*
 * UCT-level integration tests: the harness behind uct_pair.h. Opens one side
 * of a connected rc_vqp endpoint pair through the public UCT API (component,
 * memory domain "vqp_sw0", interface, endpoint, registered buffer, address
 * and rkey exchange over a socketpair), and provides bounded progress, the
 * control-message channel, completion bookkeeping, flushes and patterns.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "uct_pair.h"

#include <ucs/sys/compiler_def.h>

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

const char *pair_role_name = "driver";

double pair_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- socket */

static void sock_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    ssize_t n;

    while (len > 0) {
        n = write(fd, p, len);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        CHECK(n > 0, "write to the peer failed: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static void sock_read_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    ssize_t n;

    while (len > 0) {
        n = read(fd, p, len);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        CHECK(n > 0, "the peer closed the control channel (%s)",
              (n == 0) ? "EOF" : strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static void sock_send_blob(int fd, const void *buf, size_t len)
{
    uint64_t l = len;

    sock_write_all(fd, &l, sizeof(l));
    sock_write_all(fd, buf, len);
}

static void *sock_recv_blob(int fd, size_t *len_p)
{
    uint64_t l;
    void *buf;

    sock_read_all(fd, &l, sizeof(l));
    CHECK(l < 65536, "blob of %lu bytes", (unsigned long)l);
    buf = calloc(1, l + 1);
    CHECK(buf != NULL, "out of memory");
    sock_read_all(fd, buf, l);
    *len_p = l;
    return buf;
}

void pair_send(pair_t *p, uint32_t type, uint32_t step, uint64_t arg)
{
    pair_msg_t msg = {.type = type, .step = step, .arg = arg};

    sock_write_all(p->sock, &msg, sizeof(msg));
}

void pair_recv(pair_t *p, uint32_t type, uint32_t step, pair_msg_t *msg)
{
    struct pollfd pfd = {.fd = p->sock, .events = POLLIN};
    double deadline   = pair_now() + PAIR_WAIT_SEC;

    /* The peer may need us to progress (active messages) before it
     * answers: poll the channel between progress calls. */
    while (poll(&pfd, 1, 0) == 0) {
        CHECK(pair_now() < deadline,
              "no control message %u (step %u) from the peer within %.0f s",
              type, step, PAIR_WAIT_SEC);
        pair_progress(p);
    }
    sock_read_all(p->sock, msg, sizeof(*msg));
    CHECK((msg->type == type) && (msg->step == step),
          "control message %u/%u, expected %u/%u (sides out of step)",
          msg->type, msg->step, type, step);
}

/* -------------------------------------------------------------- progress */

unsigned pair_progress(pair_t *p)
{
    unsigned count = uct_worker_progress(p->worker);

    if (count == 0) {
        sched_yield();
    }
    return count;
}

int pair_wait_int(pair_t *p, const int *flag, int value)
{
    double deadline = pair_now() + PAIR_WAIT_SEC;

    while (*(volatile const int *)flag < value) {
        if (pair_now() > deadline) {
            return 0;
        }
        pair_progress(p);
    }
    return 1;
}

/* ----------------------------------------------------------- completions */

static void test_comp_cb(uct_completion_t *self)
{
    test_comp_t *c = ucs_container_of(self, test_comp_t, uc);

    ++c->calls;
    if (c->in_call) {
        ++c->early;
    }
}

void test_comp_init(test_comp_t *c, int count)
{
    c->uc.func   = test_comp_cb;
    c->uc.count  = count;
    c->uc.status = UCS_OK;
    c->calls     = 0;
    c->in_call   = 1;
    c->early     = 0;
}

void test_comp_returned(test_comp_t *c, ucs_status_t status, const char *op)
{
    c->in_call = 0;
    CHECK(c->early == 0,
          "%s: the completion ran inside the call that returned %s", op,
          ucs_status_string(status));
    if (status != UCS_INPROGRESS) {
        CHECK(c->calls == 0, "%s returned %s but also ran its completion", op,
              ucs_status_string(status));
    }
}

void test_comp_wait(pair_t *p, test_comp_t *c, ucs_status_t expect,
                    const char *op)
{
    int i;

    CHECK(pair_wait_int(p, &c->calls, 1),
          "%s: no completion within %.0f s (count %d)", op, PAIR_WAIT_SEC,
          c->uc.count);
    for (i = 0; i < 32; ++i) {
        pair_progress(p);
    }
    CHECK(c->calls == 1, "%s: completion ran %d times", op, c->calls);
    CHECK(c->uc.count == 0, "%s: completion count %d after it ran", op,
          c->uc.count);
    CHECK(c->uc.status == expect, "%s: completed with %s, expected %s", op,
          ucs_status_string(c->uc.status), ucs_status_string(expect));
}

void pair_flush_ep(pair_t *p)
{
    double deadline = pair_now() + PAIR_WAIT_SEC;
    ucs_status_t status;
    test_comp_t comp;

    for (;;) {
        test_comp_init(&comp, 1);
        status = uct_ep_flush(p->ep, 0, &comp.uc);
        test_comp_returned(&comp, status, "uct_ep_flush");
        if (status != UCS_ERR_NO_RESOURCE) {
            break;
        }
        CHECK(pair_now() < deadline, "uct_ep_flush: NO_RESOURCE for %.0f s",
              PAIR_WAIT_SEC);
        pair_progress(p);
    }
    if (status == UCS_INPROGRESS) {
        test_comp_wait(p, &comp, UCS_OK, "uct_ep_flush");
    } else {
        CHECK_STATUS(status, UCS_OK);
    }
}

void pair_flush_iface(pair_t *p)
{
    double deadline = pair_now() + PAIR_WAIT_SEC;
    ucs_status_t status;

    /* UCP's way: poll without a completion until it says UCS_OK. */
    while ((status = uct_iface_flush(p->iface, 0, NULL)) != UCS_OK) {
        CHECK((status == UCS_INPROGRESS) || (status == UCS_ERR_NO_RESOURCE),
              "uct_iface_flush returned %s", ucs_status_string(status));
        CHECK(pair_now() < deadline, "uct_iface_flush not done in %.0f s",
              PAIR_WAIT_SEC);
        pair_progress(p);
    }
}

/* -------------------------------------------------------------- patterns */

static inline uint8_t pattern_byte(size_t i, uint32_t seed)
{
    uint32_t x = (uint32_t)i * 2654435761u + seed * 40503u;

    return (uint8_t)((x >> 24) ^ (uint32_t)(i >> 12) ^ seed);
}

void pattern_fill(uint8_t *dst, size_t len, uint32_t seed)
{
    size_t i;

    for (i = 0; i < len; ++i) {
        dst[i] = pattern_byte(i, seed);
    }
}

long pattern_check(const uint8_t *src, size_t len, uint32_t seed)
{
    size_t i;

    for (i = 0; i < len; ++i) {
        if (src[i] != pattern_byte(i, seed)) {
            return (long)i;
        }
    }
    return -1;
}

uint64_t pattern_u64(uint32_t seed)
{
    return 0x9e3779b97f4a7c15ull * (seed + 1) ^ 0x5bd1e995ull;
}

/* ----------------------------------------------------------------- setup */

static ucs_status_t pair_err_handler(void *arg, uct_ep_h ep,
                                     ucs_status_t status)
{
    pair_t *p = arg;

    ++p->err_calls;
    p->err_ep     = ep;
    p->err_status = status;
    return UCS_OK;
}

static uct_component_h pair_find_component(void)
{
    uct_component_attr_t attr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
    uct_component_h *components, found = NULL;
    unsigned i, count;

    CHECK_STATUS(uct_query_components(&components, &count), UCS_OK);
    for (i = 0; i < count; ++i) {
        CHECK_STATUS(uct_component_query(components[i], &attr), UCS_OK);
        if (!strcmp(attr.name, "rc_vqp")) {
            found = components[i];
        }
    }
    uct_release_component_list(components);
    CHECK(found != NULL, "component rc_vqp is not registered");
    return found;
}

static void pair_modify(uct_iface_config_t *config, const char *name,
                        const char *value)
{
    if (value != NULL) {
        CHECK_STATUS(uct_config_modify(config, name, value), UCS_OK);
    }
}

void pair_init(pair_t *p, const pair_config_t *cfg, int is_initiator, int sock)
{
    uct_iface_params_t params = {0};
    uct_ep_params_t ep_params = {0};
    uct_iface_config_t *config;
    uct_md_config_t *md_config;
    size_t dev_len, len, rkey_len;
    uct_md_attr_t md_attr;
    void *dev_addr, *rkey_buf, *peer_rkey;
    uint64_t hello[2];
    char num[32];

    memset(p, 0, sizeof(*p));
    p->cfg          = cfg;
    p->is_initiator = is_initiator;
    p->sock         = sock;
    p->component    = pair_find_component();

    CHECK_STATUS(uct_md_config_read(p->component, NULL, NULL, &md_config),
                 UCS_OK);
    CHECK_STATUS(uct_md_open(p->component, "vqp_sw0", md_config, &p->md),
                 UCS_OK);
    uct_config_release(md_config);
    CHECK_STATUS(uct_md_query(p->md, &md_attr), UCS_OK);
    CHECK(md_attr.cap.flags & UCT_MD_FLAG_REG, "md cannot register");

    CHECK_STATUS(ucs_async_context_create(cfg->async_thread
                                              ? UCS_ASYNC_MODE_THREAD_SPINLOCK
                                              : UCS_ASYNC_MODE_POLL,
                                          &p->async),
                 UCS_OK);
    CHECK_STATUS(
        uct_worker_create(p->async, UCS_THREAD_MODE_SINGLE, &p->worker),
        UCS_OK);

    CHECK_STATUS(uct_md_iface_config_read(p->md, "rc_vqp", NULL, NULL, &config),
                 UCS_OK);
    snprintf(num, sizeof(num), "%u",
             (!is_initiator && cfg->target_num_qps) ? cfg->target_num_qps
                                                    : cfg->num_qps);
    pair_modify(config, "NUM_QPS", num);
    pair_modify(config, "LB", cfg->lb);
    pair_modify(config, "FRAG_SIZE", cfg->frag_size);
    pair_modify(config, "STRIPE_THRESH", cfg->stripe_thresh);
    pair_modify(config, "TX_QUEUE_LEN", cfg->tx_queue_len);
    pair_modify(config, "CONNECT_TIMEOUT", cfg->connect_timeout);
    pair_modify(config, "KEEPALIVE_INTERVAL", cfg->keepalive);

    params.field_mask =
        UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
        UCT_IFACE_PARAM_FIELD_RX_HEADROOM | UCT_IFACE_PARAM_FIELD_ERR_HANDLER |
        UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG |
        UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS;
    params.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
    params.mode.device.tl_name  = "rc_vqp";
    params.mode.device.dev_name = "vqp_sw0";
    params.rx_headroom          = cfg->rx_headroom;
    params.err_handler          = pair_err_handler;
    params.err_handler_arg      = p;
    params.err_handler_flags    = 0;
    CHECK_STATUS(uct_iface_open(p->md, p->worker, &params, config, &p->iface),
                 UCS_OK);
    uct_config_release(config);
    CHECK_STATUS(uct_iface_query(p->iface, &p->attr), UCS_OK);
    CHECK(p->attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_EP, "no CONNECT_TO_EP");
    CHECK(p->attr.cap.flags & UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE,
          "no ERRHANDLE_PEER_FAILURE");
    CHECK(p->attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE,
          "no CONNECT_TO_IFACE");
    uct_iface_progress_enable(p->iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);

    if (!cfg->to_iface) {
        ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE;
        ep_params.iface      = p->iface;
        CHECK_STATUS(uct_ep_create(&ep_params, &p->ep), UCS_OK);
    }

    p->buf = mmap(NULL, cfg->buf_size, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p->buf != MAP_FAILED, "mmap of %zu bytes failed", cfg->buf_size);
    CHECK_STATUS(uct_md_mem_reg(p->md, p->buf, cfg->buf_size,
                                UCT_MD_MEM_ACCESS_ALL, &p->memh),
                 UCS_OK);

    /* Exchange: pid + buffer, device address, endpoint address, rkey. */
    dev_len  = p->attr.device_addr_len;
    dev_addr = calloc(1, dev_len);
    CHECK_STATUS(uct_iface_get_device_address(p->iface, dev_addr), UCS_OK);
    p->ep_addr_len = p->attr.ep_addr_len;
    p->own_ep_addr = calloc(1, p->ep_addr_len);
    if (cfg->to_iface) {
        /* The interface address travels where the endpoint's would. */
        CHECK(p->attr.iface_addr_len > 0, "iface_addr_len is 0");
        p->ep_addr_len = p->attr.iface_addr_len;
        CHECK_STATUS(uct_iface_get_address(p->iface, p->own_ep_addr), UCS_OK);
    } else {
        CHECK_STATUS(uct_ep_get_address(p->ep, p->own_ep_addr), UCS_OK);
    }
    rkey_len = md_attr.rkey_packed_size;
    rkey_buf = calloc(1, rkey_len);
    CHECK_STATUS(uct_md_mkey_pack(p->md, p->memh, rkey_buf), UCS_OK);

    hello[0] = (uint64_t)getpid();
    hello[1] = (uintptr_t)p->buf;
    sock_send_blob(sock, hello, sizeof(hello));
    sock_send_blob(sock, dev_addr, dev_len);
    sock_send_blob(sock, p->own_ep_addr, p->ep_addr_len);
    sock_send_blob(sock, rkey_buf, rkey_len);

    {
        uint64_t *peer_hello = sock_recv_blob(sock, &len);

        CHECK(len == sizeof(hello), "hello of %zu bytes", len);
        p->peer_pid   = (pid_t)peer_hello[0];
        p->remote_buf = peer_hello[1];
        free(peer_hello);
    }
    p->peer_dev_addr = sock_recv_blob(sock, &len);
    CHECK(len == dev_len, "peer device address of %zu bytes, ours %zu", len,
          dev_len);
    p->peer_ep_addr = sock_recv_blob(sock, &len);
    CHECK(len == p->ep_addr_len, "peer ep address of %zu bytes, ours %zu", len,
          p->ep_addr_len);
    peer_rkey = sock_recv_blob(sock, &len);
    CHECK(len == rkey_len, "peer rkey of %zu bytes", len);

    CHECK(uct_iface_is_reachable(p->iface, p->peer_dev_addr, NULL),
          "peer device address not reachable");
    CHECK_STATUS(uct_rkey_unpack(p->component, peer_rkey, &p->rkey), UCS_OK);
    if (cfg->to_iface) {
        CHECK(
            uct_iface_is_reachable(p->iface, p->peer_dev_addr, p->peer_ep_addr),
            "peer interface address not reachable");
        p->peer_iface_addr = p->peer_ep_addr;
        p->ep              = pair_ep_to_iface(p, p->peer_iface_addr);
        pair_wait_connected(p, p->ep);
        /* Our virtual QP's address, for the tests that read QPNs in it. */
        free(p->own_ep_addr);
        p->ep_addr_len  = p->attr.ep_addr_len;
        p->own_ep_addr  = calloc(1, p->ep_addr_len);
        p->peer_ep_addr = NULL;
        CHECK_STATUS(uct_ep_get_address(p->ep, p->own_ep_addr), UCS_OK);
    } else {
        CHECK_STATUS(
            uct_ep_connect_to_ep(p->ep, p->peer_dev_addr, p->peer_ep_addr),
            UCS_OK);
    }
    free(peer_rkey);
    free(rkey_buf);
    free(dev_addr);

    /* Both endpoints connected before any traffic. */
    pair_send(p, 0, 0, 0);
    {
        pair_msg_t msg;

        pair_recv(p, 0, 0, &msg);
    }
}

void pair_cleanup(pair_t *p)
{
    uct_rkey_release(p->component, &p->rkey);
    if (p->ep != NULL) {
        uct_ep_destroy(p->ep);
    }
    CHECK_STATUS(uct_md_mem_dereg(p->md, p->memh), UCS_OK);
    munmap(p->buf, p->cfg->buf_size);
    uct_iface_close(p->iface);
    uct_worker_destroy(p->worker);
    ucs_async_context_destroy(p->async);
    uct_md_close(p->md);
    free(p->own_ep_addr);
    free(p->peer_dev_addr);
    free(p->peer_ep_addr);
    free(p->peer_iface_addr);
}

uct_ep_h pair_ep_to_iface(pair_t *p, const void *iface_addr)
{
    uct_ep_params_t ep_params = {0};
    uct_ep_h ep;

    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE |
                           UCT_EP_PARAM_FIELD_DEV_ADDR |
                           UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep_params.iface      = p->iface;
    ep_params.dev_addr   = p->peer_dev_addr;
    ep_params.iface_addr = iface_addr;
    CHECK_STATUS(uct_ep_create(&ep_params, &ep), UCS_OK);
    return ep;
}

double pair_wait_connected(pair_t *p, uct_ep_h ep)
{
    double t0 = pair_now(), deadline = t0 + PAIR_WAIT_SEC;
    uint64_t zero = 0;
    ucs_status_t status;

    /* Word 0 of the peer's buffer is never used by the tests: write 0. */
    while ((status = uct_ep_put_short(ep, &zero, sizeof(zero), p->remote_buf,
                                      p->rkey.rkey)) == UCS_ERR_NO_RESOURCE) {
        CHECK(pair_now() < deadline,
              "endpoint to the peer interface not connected in %.0f s",
              PAIR_WAIT_SEC);
        pair_progress(p);
    }
    CHECK_STATUS(status, UCS_OK);
    return pair_now() - t0;
}
