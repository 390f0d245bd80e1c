/*
 * UCT-level test of rc_vqp inside one process, as UCX's own tests and many
 * applications use a transport: two interfaces of one memory domain (one
 * software device instance) connected to each other, an interface connected
 * to itself, and an endpoint pair connected endpoint to endpoint. Each
 * exchanges an AM, a put and a get whose data is checked.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>
#include <uct/api/v2/uct_v2.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_check.h"

#define AM_ID    5
#define BUF_SIZE (1u << 20)

typedef struct side {
    uct_iface_h iface;
    uct_iface_attr_t attr;
    void *dev_addr;
    void *iface_addr;
    int am_count;
    char am_data[64];
    void *am_ptr; /* where the last AM's data was */
    unsigned am_flags;
    int am0_count; /* AMs that reached id 0 */
} side_t;

static uct_component_h component;
static uct_md_h md;
/* Settings of the interfaces open_side_ex opens: NULL, or names and values
 * in turn, ending with NULL */
static const char *const *side_cfg;
/* The error handler of the interfaces open_side_ex opens, or NULL */
static uct_error_handler_t side_err_handler;
static uct_worker_h worker;
static ucs_async_context_t *async;

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static ucs_status_t am_cb(void *arg, void *data, size_t length, unsigned flags)
{
    side_t *s = arg;

    ++s->am_count;
    s->am_ptr   = data;
    s->am_flags = flags;
    memcpy(s->am_data, data,
           length < sizeof(s->am_data) ? length : sizeof(s->am_data));
    return UCS_OK;
}

static ucs_status_t am0_cb(void *arg, void *data, size_t length, unsigned flags)
{
    ++((side_t *)arg)->am0_count;
    return UCS_OK;
}

/* @a cq_len / @a rx_len: NULL for the defaults; @a align_fields: which of
 * UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT / _AM_ALIGN_OFFSET to pass. Returns
 * uct_iface_open's status (the side is usable only on UCS_OK). */
static ucs_status_t open_side_ex(side_t *s, const char *cq_len,
                                 const char *rx_len, uint64_t align_fields,
                                 size_t align, size_t align_offset)
{
    uct_iface_params_t params = {0};
    uct_iface_config_t *config;
    ucs_status_t status;
    unsigned i;

    memset(s, 0, sizeof(*s));
    CHECK_OK(uct_md_iface_config_read(md, "rc_vqp", NULL, NULL, &config));
    CHECK_OK(uct_config_modify(config, "NUM_QPS", "4"));
    for (i = 0; (side_cfg != NULL) && (side_cfg[i] != NULL); i += 2) {
        CHECK_OK(uct_config_modify(config, side_cfg[i], side_cfg[i + 1]));
    }
    if (cq_len != NULL) {
        CHECK_OK(uct_config_modify(config, "CQ_LEN", cq_len));
        CHECK_OK(uct_config_modify(config, "RX_QUEUE_LEN", rx_len));
    }
    params.field_mask =
        UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE;
    params.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
    params.mode.device.tl_name  = "rc_vqp";
    params.mode.device.dev_name = "vqp_sw0";
    params.field_mask |= align_fields;
    params.am_alignment    = align;
    params.am_align_offset = align_offset;
    if (side_err_handler != NULL) {
        params.field_mask |= UCT_IFACE_PARAM_FIELD_ERR_HANDLER;
        params.err_handler = side_err_handler;
    }
    status = uct_iface_open(md, worker, &params, config, &s->iface);
    uct_config_release(config);
    if (status != UCS_OK) {
        return status;
    }
    CHECK_OK(uct_iface_query(s->iface, &s->attr));
    s->dev_addr   = calloc(1, s->attr.device_addr_len);
    s->iface_addr = calloc(1, s->attr.iface_addr_len);
    CHECK_OK(uct_iface_get_device_address(s->iface, s->dev_addr));
    CHECK_OK(uct_iface_get_address(s->iface, s->iface_addr));
    CHECK_OK(uct_iface_set_am_handler(s->iface, AM_ID, am_cb, s, 0));
    CHECK_OK(uct_iface_set_am_handler(s->iface, 0, am0_cb, s, 0));
    uct_iface_progress_enable(s->iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    return UCS_OK;
}

static void open_side_cq(side_t *s, const char *cq_len, const char *rx_len)
{
    CHECK_OK(open_side_ex(s, cq_len, rx_len, 0, 0, 0));
}

static void open_side(side_t *s)
{
    open_side_cq(s, NULL, NULL);
}

/* An interface with the settings @a cfg (as side_cfg) and the error
 * handler @a handler. */
static void open_side_err(side_t *s, const char *const *cfg,
                          uct_error_handler_t handler)
{
    side_cfg         = cfg;
    side_err_handler = handler;
    open_side(s);
    side_err_handler = NULL;
    side_cfg         = NULL;
}

static void close_side(side_t *s)
{
    uct_iface_close(s->iface);
    free(s->dev_addr);
    free(s->iface_addr);
}

/* An endpoint of @a from to the interface address of @a to. */
static uct_ep_h ep_to_iface(const side_t *from, const side_t *to)
{
    uct_ep_params_t ep_params = {0};
    uct_ep_h ep;

    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE |
                           UCT_EP_PARAM_FIELD_DEV_ADDR |
                           UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep_params.iface      = from->iface;
    ep_params.dev_addr   = to->dev_addr;
    ep_params.iface_addr = to->iface_addr;
    CHECK_OK(uct_ep_create(&ep_params, &ep));
    return ep;
}

static void wait_int(const int *v, int want, const char *what)
{
    double deadline = now() + 20;

    while (*(volatile const int *)v < want) {
        CHECK(now() < deadline, "%s: not done in 20 s", what);
        uct_worker_progress(worker);
    }
}

typedef struct {
    uct_completion_t uc;
    int done;
} test_comp_t;

static void comp_cb(uct_completion_t *self)
{
    ++ucs_container_of(self, test_comp_t, uc)->done;
}

/* AM, put, get from @a ep to @a dst, whose buffer @a rbuf is registered. */
static void exchange(uct_ep_h ep, side_t *dst, char *lbuf, uct_mem_h lmemh,
                     char *rbuf, uct_rkey_t rkey, const char *what)
{
    double deadline = now() + 20;
    uint64_t hdr    = 0x1122334455667788ull;
    uct_iov_t iov   = {0};
    test_comp_t comp;
    ucs_status_t st;
    int am0 = dst->am_count, i;

    /* An endpoint to an interface address connects in the background. */
    while ((st = uct_ep_am_short(ep, AM_ID, hdr, "loop", 4)) ==
           UCS_ERR_NO_RESOURCE) {
        CHECK(now() < deadline, "%s: am_short NO_RESOURCE for 20 s", what);
        uct_worker_progress(worker);
    }
    CHECK(st == UCS_OK, "%s: am_short: %s", what, ucs_status_string(st));
    wait_int(&dst->am_count, am0 + 1, what);
    CHECK(!memcmp(dst->am_data, &hdr, 8) &&
              !memcmp(dst->am_data + 8, "loop", 4),
          "%s: AM payload differs", what);

    for (i = 0; i < 4096; ++i) {
        lbuf[i] = (char)(i * 7 + 3);
    }
    memset(rbuf, 0, 8192);
    iov.buffer     = lbuf;
    iov.length     = 4096;
    iov.memh       = lmemh;
    iov.count      = 1;
    comp.uc.func   = comp_cb;
    comp.uc.count  = 1;
    comp.uc.status = UCS_OK;
    comp.done      = 0;
    st = uct_ep_put_zcopy(ep, &iov, 1, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(st == UCS_INPROGRESS || st == UCS_OK, "%s: put_zcopy: %s", what,
          ucs_status_string(st));
    if (st == UCS_INPROGRESS) {
        wait_int(&comp.done, 1, what);
    }
    CHECK(!memcmp(rbuf, lbuf, 4096), "%s: put data differs", what);

    memset(lbuf + 4096, 0, 4096);
    iov.buffer    = lbuf + 4096;
    comp.uc.count = 1;
    comp.done     = 0;
    st = uct_ep_get_zcopy(ep, &iov, 1, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(st == UCS_INPROGRESS, "%s: get_zcopy: %s", what,
          ucs_status_string(st));
    wait_int(&comp.done, 1, what);
    CHECK(comp.uc.status == UCS_OK, "%s: get completed with %s", what,
          ucs_status_string(comp.uc.status));
    CHECK(!memcmp(lbuf + 4096, lbuf, 4096), "%s: get data differs", what);
    printf("ok - %s\n", what);
}

static size_t pack_cb(void *dest, void *arg)
{
    memcpy(dest, arg, 16);
    return 16;
}

/* A pack callback that writes and returns @a arg (a size_t) bytes. */
static size_t pack_n_cb(void *dest, void *arg)
{
    size_t n = *(const size_t *)arg;

    memset(dest, 0x5c, n);
    return n;
}

/* Arguments UCT refuses (UCS_ERR_INVALID_PARAM), each before anything is
 * sent: an AM id beyond UCT_AM_ID_MAX (which the receiver would mask into
 * another id), an am_zcopy header beyond max_hdr, a put_short beyond
 * max_short, a put_zcopy or get_zcopy beyond max_zcopy. */
static void bad_arguments(uct_ep_h ep, side_t *src, side_t *dst, char *lbuf,
                          uct_mem_h lmemh, char *rbuf, uct_rkey_t rkey)
{
    char hdr[512] = {0};
    uct_iov_t iov = {.buffer = lbuf, .length = 16, .memh = lmemh, .count = 1};
    int am0       = dst->am0_count;
    int am        = dst->am_count;
    ucs_status_t st;
    ssize_t len;
    unsigned i;

    CHECK(src->attr.cap.am.max_hdr < sizeof(hdr), "max_hdr %zu",
          src->attr.cap.am.max_hdr);
    st = uct_ep_am_short(ep, UCT_AM_ID_MAX, 0, "x", 1);
    CHECK(st == UCS_ERR_INVALID_PARAM, "am_short id 32: %s",
          ucs_status_string(st));
    len = uct_ep_am_bcopy(ep, UCT_AM_ID_MAX, pack_cb, hdr, 0);
    CHECK(len == UCS_ERR_INVALID_PARAM, "am_bcopy id 32: %zd", len);
    st = uct_ep_am_zcopy(ep, UCT_AM_ID_MAX, hdr, 8, &iov, 1, 0, NULL);
    CHECK(st == UCS_ERR_INVALID_PARAM, "am_zcopy id 32: %s",
          ucs_status_string(st));
    st = uct_ep_am_zcopy(ep, AM_ID, hdr, src->attr.cap.am.max_hdr + 1, &iov, 1,
                         0, NULL);
    CHECK(st == UCS_ERR_INVALID_PARAM, "am_zcopy header max_hdr + 1: %s",
          ucs_status_string(st));
    st = uct_ep_put_short(ep, lbuf, src->attr.cap.put.max_short + 1,
                          (uintptr_t)rbuf, rkey);
    CHECK(st == UCS_ERR_INVALID_PARAM, "put_short of max_short + 1: %s",
          ucs_status_string(st));
    /* zcopy beyond max_zcopy, also as two entries: refused before the
     * buffer is looked at */
    {
        uct_iov_t big[2] = {iov, iov};

        big[0].length = src->attr.cap.put.max_zcopy + 1;
        st = uct_ep_put_zcopy(ep, big, 1, (uintptr_t)rbuf, rkey, NULL);
        CHECK(st == UCS_ERR_INVALID_PARAM, "put_zcopy of max_zcopy + 1: %s",
              ucs_status_string(st));
        big[0].length = src->attr.cap.get.max_zcopy + 1;
        st = uct_ep_get_zcopy(ep, big, 1, (uintptr_t)rbuf, rkey, NULL);
        CHECK(st == UCS_ERR_INVALID_PARAM, "get_zcopy of max_zcopy + 1: %s",
              ucs_status_string(st));
        big[0].length = src->attr.cap.put.max_zcopy / 2 + 1;
        big[1].length = big[0].length;
        st = uct_ep_put_zcopy(ep, big, 2, (uintptr_t)rbuf, rkey, NULL);
        CHECK(st == UCS_ERR_INVALID_PARAM,
              "put_zcopy of two entries over max_zcopy: %s",
              ucs_status_string(st));
    }
    /* A pack callback that returned max_bcopy + 1 (and wrote as much: the
     * buffer has room for a little more): refused, nothing sent
     * (UCT_IFACE_FLAG_ERRHANDLE_BCOPY_LEN). */
    CHECK(src->attr.cap.flags & UCT_IFACE_FLAG_ERRHANDLE_BCOPY_LEN,
          "flags 0x%lx", (unsigned long)src->attr.cap.flags);
    {
        size_t over = src->attr.cap.am.max_bcopy + 1;

        len = uct_ep_am_bcopy(ep, AM_ID, pack_n_cb, &over, 0);
        CHECK(len == UCS_ERR_INVALID_PARAM, "am_bcopy of max_bcopy + 1: %zd",
              len);
        over = src->attr.cap.put.max_bcopy + 1;
        memset(rbuf, 0, 16);
        len = uct_ep_put_bcopy(ep, pack_n_cb, &over, (uintptr_t)rbuf, rkey);
        CHECK(len == UCS_ERR_INVALID_PARAM, "put_bcopy of max_bcopy + 1: %zd",
              len);
    }
    /* far beyond: refused before anything is gathered on the stack */
    st = uct_ep_am_short(ep, AM_ID, 0, lbuf, 1u << 30);
    CHECK(st == UCS_ERR_INVALID_PARAM, "am_short of 1 GiB: %s",
          ucs_status_string(st));
    {
        uct_iov_t many[64];

        CHECK(src->attr.cap.am.max_iov < 64, "am max_iov %zu",
              src->attr.cap.am.max_iov);
        for (i = 0; i <= src->attr.cap.am.max_iov; ++i) {
            many[i] = iov;
        }
        st = uct_ep_am_zcopy(ep, AM_ID, hdr, 8, many,
                             src->attr.cap.am.max_iov + 1, 0, NULL);
        CHECK(st == UCS_ERR_INVALID_PARAM, "am_zcopy of max_iov + 1: %s",
              ucs_status_string(st));
        st = uct_ep_am_short_iov(ep, AM_ID, many, src->attr.cap.am.max_iov + 1);
        CHECK(st == UCS_ERR_INVALID_PARAM, "am_short_iov of max_iov + 1: %s",
              ucs_status_string(st));
    }
    /* Nothing arrived anywhere, and the endpoint still works. */
    for (i = 0; i < 1000; ++i) {
        uct_worker_progress(worker);
    }
    CHECK((dst->am0_count == am0) && (dst->am_count == am),
          "a refused AM arrived (id 0: %d, id %d: %d)", dst->am0_count - am0,
          AM_ID, dst->am_count - am);
    CHECK(rbuf[0] == 0, "a refused put_bcopy wrote 0x%x", (uint8_t)rbuf[0]);
    exchange(ep, dst, lbuf, lmemh, rbuf, rkey, "endpoint after bad arguments");
}

/* am_zcopy gathers its iov entries (up to max_iov; an empty one, one of
 * count 2) into one message after the header; a strided one (stride not 0,
 * count > 1) is refused, as by the other zcopy operations. */
static void am_zcopy_gather(uct_ep_h ep, side_t *src, side_t *dst, char *lbuf,
                            uct_mem_h lmemh)
{
    const char want[] = "HEADER!!abcdefghijklmnopqr";
    uct_iov_t iov[4]  = {{.buffer = lbuf + 100, .length = 5, .count = 1},
                         {.buffer = lbuf + 300, .length = 0, .count = 1},
                         {.buffer = lbuf + 500, .length = 7, .count = 1},
                         {.buffer = lbuf + 700, .length = 3, .count = 2}};
    test_comp_t comp  = {.uc = {.func = comp_cb, .count = 1}};
    int am            = dst->am_count;
    ucs_status_t st;
    unsigned i;

    CHECK(src->attr.cap.am.max_iov >= 4, "am max_iov %zu",
          src->attr.cap.am.max_iov);
    memcpy(lbuf + 100, "abcde", 5);
    memcpy(lbuf + 500, "fghijkl", 7);
    memcpy(lbuf + 700, "mnopqr", 6);
    for (i = 0; i < 4; ++i) {
        iov[i].memh = lmemh;
    }
    iov[3].stride = 10;
    st            = uct_ep_am_zcopy(ep, AM_ID, want, 8, iov, 4, 0, &comp.uc);
    CHECK(st == UCS_ERR_INVALID_PARAM, "am_zcopy of a strided iov: %s",
          ucs_status_string(st));
    st = uct_ep_am_short_iov(ep, AM_ID, iov, 4);
    CHECK(st == UCS_ERR_INVALID_PARAM, "am_short_iov of a strided iov: %s",
          ucs_status_string(st));
    iov[3].stride = 0;
    /* the same by am_short_iov: 26 bytes, the first 8 the header */
    st = uct_ep_am_short_iov(
        ep, AM_ID,
        (uct_iov_t[]){{.buffer = (void *)want, .length = 8, .count = 1}}, 1);
    CHECK(st == UCS_OK, "am_short_iov: %s", ucs_status_string(st));
    wait_int(&dst->am_count, am + 1, "am_short_iov of the header");
    am = dst->am_count;
    {
        uct_iov_t siov[5] = {{.buffer = (void *)want, .length = 8, .count = 1},
                             iov[0],
                             iov[1],
                             iov[2],
                             iov[3]};

        memset(dst->am_data, 0, sizeof(dst->am_data));
        st = uct_ep_am_short_iov(ep, AM_ID, siov, 5);
        CHECK(st == UCS_OK, "am_short_iov of 5 iov: %s", ucs_status_string(st));
        wait_int(&dst->am_count, am + 1, "am_short_iov of 5 iov");
        CHECK(!memcmp(dst->am_data, want, sizeof(want) - 1),
              "am_short_iov of 5 iov: received '%.*s'", (int)sizeof(want) - 1,
              dst->am_data);
        am = dst->am_count;
        memset(dst->am_data, 0, sizeof(dst->am_data));
    }
    st = uct_ep_am_zcopy(ep, AM_ID, want, 8, iov, 4, 0, &comp.uc);
    CHECK((st == UCS_OK) || (st == UCS_INPROGRESS), "am_zcopy of 4 iov: %s",
          ucs_status_string(st));
    wait_int(&dst->am_count, am + 1, "am_zcopy of 4 iov");
    CHECK(!memcmp(dst->am_data, want, sizeof(want) - 1),
          "am_zcopy of 4 iov: received '%.*s'", (int)sizeof(want) - 1,
          dst->am_data);
    if (st == UCS_INPROGRESS) {
        wait_int(&comp.done, 1, "am_zcopy of 4 iov: completion");
    }
    printf("ok - am_zcopy and am_short_iov gather their iov entries (an empty"
           " one, one of count 2), refuse a strided one\n");
}

/* uct_iface_params_t.am_alignment / am_align_offset: refused when
 * meaningless, honoured for the data AM handlers get in a descriptor. */
static void am_alignment(side_t *dst_default)
{
    static const char *const qps64[] = {"NUM_QPS", "64", NULL};
    static const size_t aligns[][2]  = {{256, 0}, {256, 3}, {4096, 100}};
    uint64_t both                    = UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT |
                    UCT_IFACE_PARAM_FIELD_AM_ALIGN_OFFSET;
    char payload[16] = "aligned payload";
    uintptr_t ptr;
    side_t s, d;
    uct_ep_h ep;
    unsigned i;

    CHECK(open_side_ex(&s, NULL, NULL, UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT, 0,
                       0) == UCS_ERR_INVALID_PARAM,
          "alignment 0 accepted");
    CHECK(open_side_ex(&s, NULL, NULL, UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT, 3,
                       0) == UCS_ERR_INVALID_PARAM,
          "alignment 3 accepted");
    CHECK(open_side_ex(&s, NULL, NULL, UCT_IFACE_PARAM_FIELD_AM_ALIGN_OFFSET, 0,
                       8) == UCS_ERR_INVALID_PARAM,
          "an offset without alignment accepted");
    /* Receive buffers that leave the CQ no room for an endpoint's QPs. */
    CHECK(open_side_ex(&s, "4096", "4095", 0, 0, 0) == UCS_ERR_INVALID_PARAM,
          "a CQ the receive queue fills accepted");
    /* Or leaves less than one endpoint's QPs need. */
    side_cfg = qps64;
    CHECK(open_side_ex(&s, "128", "63", 0, 0, 0) == UCS_ERR_INVALID_PARAM,
          "a CQ without room for an endpoint of 64 QPs accepted");
    side_cfg = NULL;

    /* Default: the payload is cache-line aligned. */
    CHECK(((uintptr_t)dst_default->am_ptr % 64) == 0,
          "default AM data at %p, not cache-line aligned", dst_default->am_ptr);

    for (i = 0; i < sizeof(aligns) / sizeof(aligns[0]); ++i) {
        open_side(&s);
        CHECK_OK(
            open_side_ex(&d, NULL, NULL, both, aligns[i][0], aligns[i][1]));
        ep = ep_to_iface(&s, &d);
        while (uct_ep_am_bcopy(ep, AM_ID, pack_cb, payload, 0) ==
               UCS_ERR_NO_RESOURCE) {
            uct_worker_progress(worker);
        }
        wait_int(&d.am_count, 1, "aligned AM");
        ptr = (uintptr_t)d.am_ptr;
        CHECK(d.am_flags & UCT_CB_PARAM_FLAG_DESC, "AM data not in a desc");
        CHECK(((ptr + aligns[i][1]) % aligns[i][0]) == 0,
              "AM data at %p: + %zu not aligned to %zu", d.am_ptr, aligns[i][1],
              aligns[i][0]);
        CHECK(!memcmp(d.am_data, payload, sizeof(payload)),
              "aligned AM payload differs");
        uct_ep_destroy(ep);
        close_side(&s);
        close_side(&d);
    }
    printf("ok - AM alignment parameters\n");
}

#define MANY_EPS    120
#define PUTS_PER_EP 8
#define PUT_LEN     1024

/* Many endpoints on an interface whose CQ is far smaller than what they
 * could have in flight together (each may track hundreds of WQEs): an
 * endpoint reserves no CQ entries for its sends, posts wait for CQ room
 * instead, and every put completes with its data. With their passive peers
 * on the other interface they take 1200 QPs of the one device instance. */
static void many_endpoints(side_t *dst, char *lbuf, uct_mem_h lmemh, char *rbuf,
                           uct_rkey_t rkey)
{
    uct_ep_params_t ep_params = {0};
    static test_comp_t comps[MANY_EPS];
    uct_ep_h eps[MANY_EPS];
    double deadline;
    uct_iov_t iov = {0};
    ucs_status_t st;
    unsigned e, k, off;
    side_t c;
    int am0;

    /* 1024 entries: 512 for the SRQ (256 buffers, rounded up), 64 kept for
     * covering NOPs; 600 QPs, more than the CQ has entries left (until each
     * QP stopped keeping one, 2048 were needed). */
    open_side_cq(&c, "1024", "256");
    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE |
                           UCT_EP_PARAM_FIELD_DEV_ADDR |
                           UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep_params.iface      = c.iface;
    ep_params.dev_addr   = dst->dev_addr;
    ep_params.iface_addr = dst->iface_addr;
    for (e = 0; e < MANY_EPS; ++e) {
        CHECK_OK(uct_ep_create(&ep_params, &eps[e]));
    }
    for (k = 0; k < MANY_EPS * PUTS_PER_EP * PUT_LEN; ++k) {
        lbuf[k] = (char)(k * 13 + k / 4096);
    }
    memset(rbuf, 0, MANY_EPS * PUTS_PER_EP * PUT_LEN);
    /* An AM on each first: it waits for the connection. */
    am0      = dst->am_count;
    deadline = now() + 20;
    for (e = 0; e < MANY_EPS; ++e) {
        while ((st = uct_ep_am_short(eps[e], AM_ID, e, "many", 4)) ==
               UCS_ERR_NO_RESOURCE) {
            CHECK(now() < deadline, "many endpoints: am_short stuck");
            uct_worker_progress(worker);
        }
        CHECK_OK(st);
    }
    wait_int(&dst->am_count, am0 + MANY_EPS, "many endpoints: AMs");
    /* 960 puts in flight at once, more than the CQ's 447 free entries. */
    for (k = 0; k < PUTS_PER_EP; ++k) {
        for (e = 0; e < MANY_EPS; ++e) {
            off                = (e * PUTS_PER_EP + k) * PUT_LEN;
            iov.buffer         = lbuf + off;
            iov.length         = PUT_LEN;
            iov.memh           = lmemh;
            iov.count          = 1;
            comps[e].uc.func   = comp_cb;
            comps[e].uc.count  = (k == 0) ? PUTS_PER_EP : comps[e].uc.count;
            comps[e].done      = (k == 0) ? 0 : comps[e].done;
            comps[e].uc.status = UCS_OK;
            while ((st = uct_ep_put_zcopy(
                        eps[e], &iov, 1, (uintptr_t)rbuf + off, rkey,
                        &comps[e].uc)) == UCS_ERR_NO_RESOURCE) {
                CHECK(now() < deadline, "many endpoints: put stuck");
                uct_worker_progress(worker);
            }
            CHECK(st == UCS_INPROGRESS, "put_zcopy: %s", ucs_status_string(st));
        }
    }
    for (e = 0; e < MANY_EPS; ++e) {
        wait_int(&comps[e].done, 1, "many endpoints: puts");
        CHECK(comps[e].uc.status == UCS_OK, "endpoint %u: puts %s", e,
              ucs_status_string(comps[e].uc.status));
    }
    CHECK(!memcmp(rbuf, lbuf, MANY_EPS * PUTS_PER_EP * PUT_LEN),
          "many endpoints: put data differs");
    for (e = 0; e < MANY_EPS; ++e) {
        uct_ep_destroy(eps[e]);
    }
    close_side(&c);
    printf("ok - %d endpoints (%d QPs) on an interface with a CQ of 1024"
           " entries\n",
           MANY_EPS, MANY_EPS * 5);
}

/* A process that did not progress its interface for longer than
 * CONNECT_TIMEOUT (descheduled, or busy with other work) was not asking its
 * peer in that time: the endpoint must still connect once the interface is
 * progressed again, to a peer that answers. (The first progress after such
 * a stall used to fail it with UCS_ERR_ENDPOINT_TIMEOUT.) */
static void stalled_connect(void)
{
    static const char *const cfg[] = {"CONNECT_TIMEOUT", "0.2s", NULL};
    ucs_status_t st;
    double deadline;
    side_t c, d;
    uct_ep_h ep;
    int am0;

    side_cfg = cfg;
    open_side(&c);
    open_side(&d);
    side_cfg = NULL;
    ep       = ep_to_iface(&c, &d);
    usleep(600 * 1000); /* three connect timeouts without progress */
    am0      = d.am_count;
    deadline = now() + 20;
    while ((st = uct_ep_am_short(ep, AM_ID, 7, "stal", 4)) ==
           UCS_ERR_NO_RESOURCE) {
        CHECK(now() < deadline, "stalled connect: am_short stuck");
        uct_worker_progress(worker);
    }
    CHECK(st == UCS_OK,
          "am_short after a 0.6 s stall with a connect timeout of 0.2 s: %s",
          ucs_status_string(st));
    wait_int(&d.am_count, am0 + 1, "stalled connect: AM");
    CHECK(!memcmp(d.am_data + 8, "stal", 4), "stalled connect: AM payload");
    uct_ep_destroy(ep);
    close_side(&c);
    close_side(&d);
    printf("ok - an endpoint connects after its interface was not progressed"
           " for three connect timeouts\n");
}

/* Flow control: the receiver returns credits in a grant once half the
 * window is owed. A grant that finds no room (here the AM handler fills the
 * receiver's operation ring just before it) must still go out once there is
 * room: the sender, out of credits, sends nothing more that would give the
 * receiver another chance. */
#define GRANT_WND     "8"
#define GRANT_CREDITS 4 /* the window less the 4 kept for grants */

static struct {
    uct_ep_h back; /* receiver -> sender */
    char *buf;
    uct_mem_h memh;
    uint64_t raddr;
    uct_rkey_t rkey;
    int ams;
    int puts;
} grant;

static ucs_status_t grant_am_cb(void *arg, void *data, size_t length,
                                unsigned flags)
{
    uct_iov_t iov = {
        .buffer = grant.buf, .length = 64, .memh = grant.memh, .count = 1};
    ucs_status_t st;

    if (++grant.ams == GRANT_CREDITS) { /* the grant is due right after */
        while (((st = uct_ep_put_zcopy(grant.back, &iov, 1, grant.raddr,
                                       grant.rkey, NULL)) == UCS_OK) ||
               (st == UCS_INPROGRESS)) {
            CHECK(++grant.puts < 100000, "grant: the ring never filled");
        }
        CHECK(st == UCS_ERR_NO_RESOURCE, "grant: put_zcopy %s",
              ucs_status_string(st));
    }
    return UCS_OK;
}

static void grant_without_room(char *lbuf, uct_mem_h lmemh, char *rbuf,
                               uct_rkey_t rkey)
{
    static const char *const cfg[] = {"FC_WND_SIZE", GRANT_WND, "TX_QUEUE_LEN",
                                      "16", NULL};
    uct_ep_params_t ep_params      = {0};
    void *addr_c, *addr_d;
    ucs_status_t st;
    double deadline;
    uct_ep_h ep;
    side_t c, d;
    int i;

    side_cfg = cfg;
    open_side(&c);
    open_side(&d);
    side_cfg = NULL;
    CHECK_OK(uct_iface_set_am_handler(d.iface, AM_ID, grant_am_cb, NULL, 0));
    /* Endpoint to endpoint: the receiver's endpoint, which owes the grant,
     * is the one its AM handler fills. */
    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE;
    ep_params.iface      = c.iface;
    CHECK_OK(uct_ep_create(&ep_params, &ep));
    ep_params.iface = d.iface;
    CHECK_OK(uct_ep_create(&ep_params, &grant.back));
    addr_c = calloc(1, c.attr.ep_addr_len);
    addr_d = calloc(1, d.attr.ep_addr_len);
    CHECK_OK(uct_ep_get_address(ep, addr_c));
    CHECK_OK(uct_ep_get_address(grant.back, addr_d));
    CHECK_OK(uct_ep_connect_to_ep(ep, d.dev_addr, addr_d));
    CHECK_OK(uct_ep_connect_to_ep(grant.back, c.dev_addr, addr_c));
    grant.ams   = 0;
    grant.puts  = 0;
    grant.buf   = lbuf;
    grant.memh  = lmemh;
    grant.raddr = (uintptr_t)rbuf;
    grant.rkey  = rkey;

    /* The credits, then one more AM, which needs the grant. */
    deadline = now() + 10;
    for (i = 0; i <= GRANT_CREDITS; ++i) {
        while ((st = uct_ep_am_short(ep, AM_ID, i, "gr", 2)) ==
               UCS_ERR_NO_RESOURCE) {
            CHECK(now() < deadline,
                  "AM %d of a window of %s stuck: no credit grant came back"
                  " (%d AMs received, %d puts filled the receiver's ring)",
                  i, GRANT_WND, grant.ams, grant.puts);
            uct_worker_progress(worker);
        }
        CHECK_OK(st);
    }
    wait_int(&grant.ams, GRANT_CREDITS + 1, "grant: the last AM");
    CHECK(grant.puts > 0, "grant: no put filled the ring");
    uct_ep_destroy(ep);
    uct_ep_destroy(grant.back);
    free(addr_c);
    free(addr_d);
    close_side(&c);
    close_side(&d);
    printf("ok - a credit grant that found no room goes out later (%d puts"
           " filled the ring)\n",
           grant.puts);
}

/* The smallest flow-control windows: FC_WND_SIZE 5 leaves the sender one
 * credit (4 are kept for grants), 6 two. The receiver must return them
 * before it owes more than that, or one-directional AMs stop for good; also
 * when its own window is larger (interfaces configured differently). */
static void small_windows(void)
{
    static const char *const wnds[][2] = {
        {"5", "5"},   {"6", "6"},    {"7", "7"},  {"8", "8"},
        {"5", "128"}, {"16", "128"}, {"128", "5"}};
    const char *cfg[] = {"FC_WND_SIZE", NULL, NULL};
    ucs_status_t st;
    double deadline;
    unsigned w;
    uct_ep_h ep;
    side_t c, d;
    int i;

    for (w = 0; w < sizeof(wnds) / sizeof(wnds[0]); ++w) {
        side_cfg = cfg;
        cfg[1]   = wnds[w][0];
        open_side(&c);
        cfg[1] = wnds[w][1];
        open_side(&d);
        side_cfg = NULL;
        ep       = ep_to_iface(&c, &d);
        deadline = now() + 10;
        for (i = 0; i < 40; ++i) {
            while ((st = uct_ep_am_short(ep, AM_ID, i, "wn", 2)) ==
                   UCS_ERR_NO_RESOURCE) {
                CHECK(now() < deadline,
                      "FC_WND_SIZE %s, the receiver's %s: AM %d stuck without"
                      " credits (%d received)",
                      wnds[w][0], wnds[w][1], i, d.am_count);
                uct_worker_progress(worker);
            }
            CHECK_OK(st);
        }
        wait_int(&d.am_count, 40, "small window: the last AM");
        uct_ep_destroy(ep);
        close_side(&c);
        close_side(&d);
    }
    printf("ok - one-directional AMs with FC_WND_SIZE 5 to 8, and windows"
           " smaller than the receiver's\n");
}

static struct {
    uct_ep_h ep;
    char *buf;
    uint64_t raddr;
    uct_rkey_t rkey;
    int calls;
    int posted;
} fenced;

static ucs_status_t fenced_pending_cb(uct_pending_req_t *req)
{
    ucs_status_t st;

    ++fenced.calls;
    st = uct_ep_put_short(fenced.ep, fenced.buf, 8, fenced.raddr, fenced.rkey);
    if (st == UCS_OK) {
        fenced.posted = 1;
    }
    return st;
}

/* A fenced put_short waits in the pending queue for the puts before it;
 * meanwhile its endpoint sends a credit grant, an unsignaled WQE behind the
 * NOP the refused post asked for. The pending request must still go. */
static void fence_behind_grant(char *lbuf, uct_mem_h lmemh, char *rbuf,
                               uct_rkey_t rkey)
{
    static const char *const cfg[] = {"FC_WND_SIZE", "8", NULL};
    uct_ep_params_t ep_params      = {.field_mask = UCT_EP_PARAM_FIELD_IFACE};
    uct_pending_req_t req          = {.func = fenced_pending_cb};
    void *addr_c, *addr_d;
    uct_ep_h back;
    ucs_status_t st;
    side_t c, d;
    int i;

    (void)lmemh;
    side_cfg = cfg;
    open_side(&c);
    open_side(&d);
    side_cfg        = NULL;
    ep_params.iface = c.iface;
    CHECK_OK(uct_ep_create(&ep_params, &fenced.ep));
    ep_params.iface = d.iface;
    CHECK_OK(uct_ep_create(&ep_params, &back));
    addr_c = calloc(1, c.attr.ep_addr_len);
    addr_d = calloc(1, d.attr.ep_addr_len);
    CHECK_OK(uct_ep_get_address(fenced.ep, addr_c));
    CHECK_OK(uct_ep_get_address(back, addr_d));
    CHECK_OK(uct_ep_connect_to_ep(fenced.ep, d.dev_addr, addr_d));
    CHECK_OK(uct_ep_connect_to_ep(back, c.dev_addr, addr_c));
    fenced.buf    = lbuf;
    fenced.raddr  = (uintptr_t)rbuf;
    fenced.rkey   = rkey;
    fenced.calls  = 0;
    fenced.posted = 0;

    /* Unsignaled puts in flight, a fence, a put refused behind them. */
    for (i = 0; i < 4; ++i) {
        CHECK_OK(uct_ep_put_short(fenced.ep, lbuf, 8, (uintptr_t)rbuf, rkey));
    }
    CHECK_OK(uct_ep_fence(fenced.ep, 0));
    st = uct_ep_put_short(fenced.ep, lbuf, 8, (uintptr_t)rbuf, rkey);
    CHECK(st == UCS_ERR_NO_RESOURCE, "fenced put_short: %s",
          ucs_status_string(st));
    CHECK_OK(uct_ep_pending_add(fenced.ep, &req, 0));
    /* The peer's AMs make c owe a grant (half of its 4 credits). */
    for (i = 0; i < 3; ++i) {
        CHECK_OK(uct_ep_am_short(back, AM_ID, i, "fg", 2));
    }
    wait_int(&c.am_count, 3, "fence behind a grant: the peer's AMs");
    wait_int(&fenced.posted, 1, "fence behind a grant: the pending put");
    uct_ep_destroy(fenced.ep);
    uct_ep_destroy(back);
    free(addr_c);
    free(addr_d);
    close_side(&c);
    close_side(&d);
    printf("ok - a fenced request queued behind unsignaled WQEs goes after a"
           " credit grant (%d attempts)\n",
           fenced.calls);
}

static size_t pack8_cb(void *dest, void *arg)
{
    memcpy(dest, arg, 8);
    return 8;
}

/* TX_QUEUE_LEN 2: two unsignaled put_shorts fill the endpoint's ring, and
 * only a signaled WQE after them completes them. A put_bcopy refused for
 * room (before the core sees it) must get room back by progress alone, and
 * so must a request queued for it. */
static void full_ring_unsignaled(char *lbuf, char *rbuf, uct_rkey_t rkey)
{
    static const char *const cfg[] = {"TX_QUEUE_LEN", "2", NULL};
    uct_pending_req_t req          = {.func = fenced_pending_cb};
    double deadline;
    ssize_t n;
    side_t c, d;
    int round, i;

    side_cfg = cfg;
    open_side(&c);
    open_side(&d);
    side_cfg     = NULL;
    fenced.ep    = ep_to_iface(&c, &d);
    fenced.buf   = lbuf;
    fenced.raddr = (uintptr_t)rbuf;
    fenced.rkey  = rkey;
    deadline     = now() + 10;
    while (uct_ep_put_short(fenced.ep, lbuf, 8, (uintptr_t)rbuf, rkey) ==
           UCS_ERR_NO_RESOURCE) { /* connecting */
        CHECK(now() < deadline, "full ring: not connected in 10 s");
        uct_worker_progress(worker);
    }
    for (round = 0; round < 2; ++round) {
        /* Empty, then exactly full of unsignaled puts: no post refused. */
        while (uct_ep_flush(fenced.ep, 0, NULL) != UCS_OK) {
            CHECK(now() < deadline + 10, "full ring: flush not done");
            uct_worker_progress(worker);
        }
        for (i = 0; i < 2; ++i) {
            CHECK_OK(
                uct_ep_put_short(fenced.ep, lbuf, 8, (uintptr_t)rbuf, rkey));
        }
        if (round == 0) {
            n = uct_ep_put_bcopy(fenced.ep, pack8_cb, lbuf, (uintptr_t)rbuf,
                                 rkey);
            CHECK(n == UCS_ERR_NO_RESOURCE, "full ring: put_bcopy said %zd", n);
            deadline = now() + 10;
            while ((n = uct_ep_put_bcopy(fenced.ep, pack8_cb, lbuf,
                                         (uintptr_t)rbuf, rkey)) ==
                   UCS_ERR_NO_RESOURCE) {
                CHECK(now() < deadline,
                      "full ring: put_bcopy refused for 10 s");
                uct_worker_progress(worker);
            }
            CHECK(n == 8, "full ring: put_bcopy said %zd", n);
        } else {
            /* Queued without a refused call first. */
            fenced.posted = 0;
            CHECK_OK(uct_ep_pending_add(fenced.ep, &req, 0));
            wait_int(&fenced.posted, 1, "full ring: the pending put");
        }
    }
    uct_ep_destroy(fenced.ep);
    close_side(&c);
    close_side(&d);
    printf("ok - a ring full of unsignaled puts gets room back\n");
}

/* A memory domain on vqp_sw0 with md settings @a name = @a value and
 * @a name2 = @a value2 (NULL: not set); returns uct_md_open's status. */
static ucs_status_t open_md_with2(const char *name, const char *value,
                                  const char *name2, const char *value2,
                                  uct_md_h *md_p)
{
    uct_md_config_t *cfg;
    ucs_status_t st;

    CHECK_OK(uct_md_config_read(component, NULL, NULL, &cfg));
    if (name != NULL) {
        CHECK_OK(uct_config_modify(cfg, name, value));
    }
    if (name2 != NULL) {
        CHECK_OK(uct_config_modify(cfg, name2, value2));
    }
    st = uct_md_open(component, "vqp_sw0", cfg, md_p);
    uct_config_release(cfg);
    return st;
}

static ucs_status_t open_md_with(const char *name, const char *value,
                                 uct_md_h *md_p)
{
    return open_md_with2(name, value, NULL, NULL, md_p);
}

/* The key a peer would use for @a memh (the packed rkey is the key). */
static uint32_t packed_key(uct_md_h m, uct_mem_h memh)
{
    uint32_t key = 0;

    CHECK_OK(uct_md_mkey_pack(m, memh, &key));
    return key;
}

/* Registers @a len bytes at @a p and returns the key; *memh_p keeps the
 * handle. */
static uint32_t reg_key(uct_md_h m, void *p, size_t len, uct_mem_h *memh_p)
{
    CHECK_OK(uct_md_mem_reg(m, p, len, UCT_MD_MEM_ACCESS_ALL, memh_p));
    return packed_key(m, *memh_p);
}

static uint32_t reg_dereg_key(uct_md_h m, void *p, size_t len)
{
    uct_mem_h memh;
    uint32_t key = reg_key(m, p, len, &memh);

    CHECK_OK(uct_md_mem_dereg(m, memh));
    return key;
}

/* Without the cache every registration is the device's own: a buffer
 * registered twice has two keys. */
static void expect_uncached(uct_md_h m, const char *what)
{
    char *buf = aligned_alloc(4096, 8192);
    uct_mem_h m1, m2;

    CHECK(reg_key(m, buf, 8192, &m1) != reg_key(m, buf, 8192, &m2),
          "%s: one buffer registered twice got one key", what);
    CHECK_OK(uct_md_mem_dereg(m, m1));
    CHECK_OK(uct_md_mem_dereg(m, m2));
    free(buf);
}

/* UCP (1.13) registers every rendezvous buffer through the memory domain:
 * the registration cache must return the same registration for memory
 * registered before, and a new one once the memory was unmapped. */
static void registration_cache(side_t *src, side_t *dst, char *lbuf,
                               uct_mem_h lmemh)
{
    const size_t len = 65536;
    uct_md_attr_t attr_c, attr_n;
    uct_rkey_bundle_t bundle;
    uint32_t k1, k2, key;
    uct_mem_h m1, m2;
    uct_md_h md_n, md_2;
    char *buf, *p, *pages;
    uct_ep_h ep;

    buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
               -1, 0);
    CHECK(buf != MAP_FAILED, "mmap: %m");
    k1 = reg_key(md, buf, len, &m1);
    k2 = reg_key(md, buf + 4096, 4096, &m2);
    CHECK(k2 == k1, "a range inside a registered one got another key");
    CHECK_OK(uct_md_mem_dereg(md, m2));
    CHECK_OK(uct_md_mem_dereg(md, m1));
    CHECK(reg_dereg_key(md, buf, len) == k1,
          "registered again after deregistration: not the cached key");

    /* Unmapped and mapped anew at the same address: other pages, so the
     * old registration must not be handed out again. */
    CHECK(munmap(buf, len) == 0, "munmap: %m");
    p = mmap(buf, len, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(p == buf, "mmap at %p again: %p (%m)", buf, p);
    key = reg_key(md, buf, len, &m1);
    CHECK(key != k1, "memory mapped anew got the unmapped memory's key");
    CHECK_OK(uct_rkey_unpack(component, &key, &bundle));
    ep = ep_to_iface(src, dst);
    exchange(ep, dst, lbuf, lmemh, buf, bundle.rkey,
             "registration cache: put and get into memory mapped anew at an "
             "unmapped registration's address");
    uct_ep_destroy(ep);
    uct_rkey_release(component, &bundle);
    CHECK_OK(uct_md_mem_dereg(md, m1));
    CHECK(munmap(buf, len) == 0, "munmap: %m");

    /* The default on the software device (auto) is no cache. */
    CHECK_OK(open_md_with(NULL, NULL, &md_n));
    expect_uncached(md_n, "RCACHE=auto on the software device");
    uct_md_close(md_n);

    /* RCACHE=n: no cache, and UCP is told registration costs more. */
    CHECK_OK(open_md_with("RCACHE", "n", &md_n));
    expect_uncached(md_n, "RCACHE=n");
    CHECK_OK(uct_md_query(md, &attr_c));
    CHECK_OK(uct_md_query(md_n, &attr_n));
    CHECK(attr_c.reg_cost.c < attr_n.reg_cost.c,
          "cached registration reported at %g s, uncached at %g s",
          attr_c.reg_cost.c, attr_n.reg_cost.c);
    uct_md_close(md_n);

    /* RCACHE_MAX_REGIONS=2: a third region evicts the least recently
     * used unused one. Pages 0, 2 and 4: never merged. */
    CHECK_OK(open_md_with2("RCACHE", "try", "RCACHE_MAX_REGIONS", "2", &md_2));
    pages = aligned_alloc(4096, 5 * 4096);
    k1    = reg_dereg_key(md_2, pages, 4096);
    k2    = reg_dereg_key(md_2, pages + 2 * 4096, 4096);
    CHECK(reg_dereg_key(md_2, pages, 4096) == k1, "evicted below the limit");
    (void)reg_dereg_key(md_2, pages + 4 * 4096, 4096);
    CHECK(reg_dereg_key(md_2, pages, 4096) == k1,
          "the most recently used region was evicted");
    CHECK(reg_dereg_key(md_2, pages + 2 * 4096, 4096) != k2,
          "three regions cached with RCACHE_MAX_REGIONS=2");
    uct_md_close(md_2);
    free(pages);
    printf("ok - registration cache: hits, invalidation on unmap, off by "
           "default on the software device, RCACHE=n, eviction\n");
}

/* Error and warning lines logged while registration_refused() runs. */
static unsigned refused_errors;
static char refused_text[512];

static ucs_log_func_rc_t refused_log(const char *file, unsigned line,
                                     const char *function,
                                     ucs_log_level_t level,
                                     const ucs_log_component_config_t *comp,
                                     const char *message, va_list ap)
{
    if (level > UCS_LOG_LEVEL_WARN) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    ++refused_errors;
    vsnprintf(refused_text, sizeof(refused_text), message, ap);
    return UCS_LOG_FUNC_RC_STOP;
}

/* Memory with an unmapped page in it, or read-only memory with write rights
 * (UCT_MD_MEM_ACCESS_ALL), cannot be registered (ibv_reg_mr says EFAULT;
 * the software device refuses it as well). The failure is
 * logged as an error, unless the caller asked UCT_MD_MEM_FLAG_HIDE_ERRORS:
 * UCP and the registration cache try such ranges and fall back. */
static void registration_refused(uct_md_h m, const char *what)
{
    const size_t page = 4096;
    uct_mem_h memh;
    char *buf;

    buf = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(buf != MAP_FAILED, "mmap: %m");
    CHECK(munmap(buf + page, page) == 0, "munmap: %m");
    ucs_log_push_handler(refused_log);
    refused_errors = 0;
    CHECK(uct_md_mem_reg(m, buf, 3 * page, UCT_MD_MEM_ACCESS_ALL, &memh) !=
              UCS_OK,
          "%s: memory with a hole registered", what);
    CHECK((refused_errors > 0) && (strstr(refused_text, "not mapped") != NULL),
          "%s: the refusal logged %u lines, the last '%s'", what,
          refused_errors, refused_text);
    refused_errors = 0;
    CHECK(uct_md_mem_reg(m, buf + page / 2, page,
                         UCT_MD_MEM_ACCESS_ALL | UCT_MD_MEM_FLAG_HIDE_ERRORS,
                         &memh) != UCS_OK,
          "%s: memory reaching into a hole registered", what);
    CHECK(refused_errors == 0, "%s: HIDE_ERRORS still logged '%s'", what,
          refused_text);
    /* Read-only memory cannot be pinned for writing either. */
    CHECK(mprotect(buf, page, PROT_READ) == 0, "mprotect: %m");
    CHECK(uct_md_mem_reg(m, buf, page, UCT_MD_MEM_ACCESS_ALL, &memh) != UCS_OK,
          "%s: read-only memory registered for writing", what);
    CHECK((refused_errors > 0) && (strstr(refused_text, "read-only") != NULL),
          "%s: the refusal logged %u lines, the last '%s'", what,
          refused_errors, refused_text);
    refused_errors = 0;
    CHECK(uct_md_mem_reg(m, buf, page,
                         UCT_MD_MEM_ACCESS_ALL | UCT_MD_MEM_FLAG_HIDE_ERRORS,
                         &memh) != UCS_OK,
          "%s: read-only memory registered for writing", what);
    CHECK(refused_errors == 0, "%s: HIDE_ERRORS still logged '%s'", what,
          refused_text);
    CHECK(mprotect(buf, page, PROT_READ | PROT_WRITE) == 0, "mprotect: %m");
    ucs_log_pop_handler();
    /* The mapped pages on either side still register. */
    CHECK_OK(uct_md_mem_reg(m, buf, page, UCT_MD_MEM_ACCESS_ALL, &memh));
    CHECK_OK(uct_md_mem_dereg(m, memh));
    CHECK_OK(
        uct_md_mem_reg(m, buf + 2 * page, page, UCT_MD_MEM_ACCESS_ALL, &memh));
    CHECK_OK(uct_md_mem_dereg(m, memh));
    CHECK(munmap(buf, page) == 0, "munmap: %m");
    CHECK(munmap(buf + 2 * page, page) == 0, "munmap: %m");
}

static void registration_hide_errors(void)
{
    uct_md_h md_n;

    registration_refused(md, "cached");
    CHECK_OK(open_md_with("RCACHE", "n", &md_n));
    registration_refused(md_n, "uncached");
    uct_md_close(md_n);
    printf("ok - memory with an unmapped page, and read-only memory for "
           "writing, are refused, logged as an error unless "
           "UCT_MD_MEM_FLAG_HIDE_ERRORS (cached and uncached)\n");
}

/* Run in a child with UCX_MEM_EVENTS=no: no cache can see unmaps. */
static int mem_events_off(void)
{
    uct_md_h m;

    CHECK(open_md_with("RCACHE", "y", &m) != UCS_OK,
          "RCACHE=y opened without memory events");
    CHECK_OK(open_md_with("RCACHE", "try", &m));
    expect_uncached(m, "RCACHE=try without memory events");
    uct_md_close(m);
    return 0;
}

static void registration_cache_no_events(void)
{
    char self[PATH_MAX];
    ssize_t len;
    int status;
    pid_t pid;

    /* The program's path, not /proc/self/exe itself: under valgrind that
     * is valgrind's tool, which refuses to run, and readlink of it names
     * the program. */
    len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    CHECK(len > 0, "readlink /proc/self/exe: %m");
    self[len] = '\0';
    fflush(stdout);
    pid = fork();
    CHECK(pid >= 0, "fork: %m");
    if (pid == 0) {
        setenv("UCX_MEM_EVENTS", "no", 1);
        execl(self, "test_uct_loopback", "--mem-events-off", (char *)NULL);
        _exit(127);
    }
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid: %m");
    CHECK(WIFEXITED(status) && (WEXITSTATUS(status) == 0),
          "the child without memory events failed (status 0x%x)", status);
    printf("ok - without memory events: RCACHE=y fails the memory domain, "
           "RCACHE=try registers uncached\n");
}

static int cancel_errors;

static ucs_status_t cancel_err_cb(void *arg, uct_ep_h ep, ucs_status_t status)
{
    ++cancel_errors;
    return UCS_OK;
}

/* flush(CANCEL) on an endpoint still connecting (UCP closes one so when a
 * peer goes away early): the REP that comes later must not connect the
 * canceled QPs (an error line, and the error handler called for the
 * user's own cancel); the endpoint is destroyed after it. */
static void cancel_while_connecting(void)
{
    ucs_status_t st;
    uct_ep_h ep;
    side_t c, d;
    int i;

    open_side(&d);
    side_err_handler = cancel_err_cb;
    open_side(&c);
    side_err_handler = NULL;
    cancel_errors    = 0;
    refused_errors   = 0;
    ucs_log_push_handler(refused_log);
    ep = ep_to_iface(&c, &d);
    st = uct_ep_flush(ep, UCT_FLUSH_FLAG_CANCEL, NULL);
    CHECK((st == UCS_OK) || (st == UCS_INPROGRESS), "flush(CANCEL): %s",
          ucs_status_string(st));
    for (i = 0; i < 10000; ++i) { /* the REQ, the REP */
        uct_worker_progress(worker);
    }
    ucs_log_pop_handler();
    CHECK(refused_errors == 0, "an error was logged: %s", refused_text);
    CHECK(cancel_errors == 0, "the error handler ran %d times", cancel_errors);
    uct_ep_destroy(ep);
    close_side(&c);
    close_side(&d);
    printf("ok - a REP after flush(CANCEL) of a connecting endpoint is"
           " ignored\n");
}

static ucs_status_t drop_status;

static ucs_status_t drop_err_cb(void *arg, uct_ep_h ep, ucs_status_t status)
{
    ++cancel_errors;
    drop_status = status;
    return UCS_OK;
}

/* The peer's passive endpoint fails (every RC WQE of the peer's device
 * fails: its credit grant is its first) while this side waits for AM
 * credits and sends nothing: the peer releases it and says so (DROP), and
 * the error handler reports it here, once. */
static void passive_failure_drop(void)
{
    static const char *const cfg[] = {"FC_WND_SIZE", "8", NULL};
    uct_md_config_t *md_config;
    uct_md_h md_main = md, md_bad;
    ucs_status_t st;
    double deadline;
    uct_ep_h ep;
    side_t c, d;
    int sent = 0;

    setenv("VQP_SW_FAULTS", "err_prob=1:0x15", 1);
    CHECK_OK(uct_md_config_read(component, NULL, NULL, &md_config));
    CHECK_OK(uct_md_open(component, "vqp_sw0", md_config, &md_bad));
    uct_config_release(md_config);
    unsetenv("VQP_SW_FAULTS");
    md       = md_bad; /* the peer's interface: a device of its own */
    side_cfg = cfg;
    open_side(&d);
    md               = md_main;
    side_err_handler = drop_err_cb;
    open_side(&c);
    side_err_handler = NULL;
    side_cfg         = NULL;
    cancel_errors    = 0;
    ep               = ep_to_iface(&c, &d);
    deadline         = now() + 10;
    while (cancel_errors == 0) {
        CHECK(now() < deadline,
              "no error reported in 10 s (%d AMs sent, %d received)", sent,
              d.am_count);
        st = uct_ep_am_short(ep, AM_ID, sent, "dr", 2);
        if (st == UCS_OK) {
            ++sent;
        } else {
            CHECK((st == UCS_ERR_NO_RESOURCE) || (cancel_errors > 0),
                  "am_short: %s", ucs_status_string(st));
        }
        uct_worker_progress(worker);
    }
    for (sent = 0; sent < 1000; ++sent) {
        uct_worker_progress(worker);
    }
    CHECK(cancel_errors == 1, "the error handler ran %d times", cancel_errors);
    CHECK(drop_status == UCS_ERR_CONNECTION_RESET, "reported %s",
          ucs_status_string(drop_status));
    uct_ep_destroy(ep);
    close_side(&c);
    close_side(&d);
    uct_md_close(md_bad);
    printf("ok - a passive endpoint that failed fails its active one"
           " (DROP)\n");
}

/* --------------------------------------- RX_MAX_BUFS: handlers keep all */

#define RXK_MAX 64

static struct {
    void *kept[RXK_MAX];
    int nkept;
    int keep;
    int count;
    uint64_t next; /* the sequence number the next AM must carry */
    int bad;
} rxk;

static ucs_status_t rxk_am_cb(void *arg, void *data, size_t length,
                              unsigned flags)
{
    uint64_t seq;

    memcpy(&seq, data, sizeof(seq));
    rxk.bad |= (length != 12) || (seq != rxk.next) ||
               !(flags & UCT_CB_PARAM_FLAG_DESC);
    ++rxk.next;
    ++rxk.count;
    if (rxk.keep && (rxk.nkept < RXK_MAX)) {
        rxk.kept[rxk.nkept++] = data;
        return UCS_INPROGRESS;
    }
    return UCS_OK;
}

/* An interface of RX_MAX_BUFS=32 whose AM handler keeps every buffer: 32
 * AMs arrive, the sender's next ones wait (RNR retries) until it runs out
 * of credits; once the handler's buffers are released they arrive, in
 * order, each once, and traffic goes on. */
static void rx_max_bufs(void)
{
    static const char *const cfg[] = {"RX_MAX_BUFS", "32", "RX_QUEUE_LEN", "63",
                                      NULL};
    double deadline, refused_since = 0;
    uint64_t sent = 0;
    ucs_status_t st;
    uct_ep_h ep;
    side_t c, d;
    int i;

    side_cfg = cfg;
    open_side(&d);
    side_cfg = NULL;
    open_side(&c);
    CHECK_OK(uct_iface_set_am_handler(d.iface, AM_ID, rxk_am_cb, NULL, 0));
    memset(&rxk, 0, sizeof(rxk));
    rxk.keep = 1;
    ep       = ep_to_iface(&c, &d);
    deadline = now() + 20;
    /* Until the sender was refused for half a second in a row. */
    while ((refused_since == 0) || (now() < refused_since + 0.5)) {
        CHECK(now() < deadline, "rx_max_bufs: never refused (%lu sent)",
              (unsigned long)sent);
        st = uct_ep_am_short(ep, AM_ID, sent, "keep", 4);
        if (st == UCS_OK) {
            ++sent;
            refused_since = 0;
        } else {
            CHECK(st == UCS_ERR_NO_RESOURCE, "am_short: %s",
                  ucs_status_string(st));
            if (refused_since == 0) {
                refused_since = now();
            }
        }
        uct_worker_progress(worker);
    }
    CHECK((rxk.count == 32) && (rxk.nkept == 32) && (sent > 32) && !rxk.bad,
          "rx_max_bufs: %d AMs arrived, %d kept, %lu sent, bad %d", rxk.count,
          rxk.nkept, (unsigned long)sent, rxk.bad);
    rxk.keep = 0;
    for (i = 0; i < rxk.nkept; ++i) {
        uct_iface_release_desc(rxk.kept[i]);
    }
    wait_int(&rxk.count, (int)sent, "rx_max_bufs: AMs after the release");
    for (i = 0; i < 200; ++i, ++sent) {
        while ((st = uct_ep_am_short(ep, AM_ID, sent, "more", 4)) ==
               UCS_ERR_NO_RESOURCE) {
            uct_worker_progress(worker);
        }
        CHECK_OK(st);
    }
    wait_int(&rxk.count, (int)sent, "rx_max_bufs: AMs after them");
    for (i = 0; i < 1000; ++i) {
        uct_worker_progress(worker);
    }
    CHECK((rxk.count == (int)sent) && !rxk.bad,
          "rx_max_bufs: %d AMs arrived of %lu, bad %d", rxk.count,
          (unsigned long)sent, rxk.bad);
    uct_ep_destroy(ep);
    close_side(&c);
    close_side(&d);
    printf("ok - RX_MAX_BUFS=32 with every buffer kept: 32 AMs arrive, the"
           " rest after the release, in order, once (%lu in all)\n",
           (unsigned long)sent);
}

/* ------------------------------------------------ access errors (NIC side) */

typedef enum {
    ACC_PUT_LOCAL,
    ACC_PUT_REMOTE,
    ACC_GET_LOCAL,
    ACC_GET_REMOTE,
    ACC_PUT_STRIPED_REMOTE,
    ACC_PUT_STRIPED_TAIL,
    ACC_GET_STRIPED_LOCAL,
    ACC_AM_ZCOPY_LOCAL,
    ACC_ATOMIC_REMOTE,
    ACC_LAST
} access_case_t;

static const char *const access_names[] = {
    [ACC_PUT_LOCAL]          = "put_zcopy from outside the local registration",
    [ACC_PUT_REMOTE]         = "put_zcopy to outside the remote registration",
    [ACC_GET_LOCAL]          = "get_zcopy into outside the local registration",
    [ACC_GET_REMOTE]         = "get_zcopy from outside the remote registration",
    [ACC_PUT_STRIPED_REMOTE] = "striped put_zcopy running past the remote "
                               "registration",
    [ACC_PUT_STRIPED_TAIL]   = "striped put_zcopy whose last fragment is "
                               "past the remote registration",
    [ACC_GET_STRIPED_LOCAL]  = "striped get_zcopy running past the local "
                               "registration",
    [ACC_AM_ZCOPY_LOCAL]     = "am_zcopy from outside the local registration"
                               " (refused at the call)",
    [ACC_ATOMIC_REMOTE]      = "fetching atomic add outside the remote "
                               "registration",
};

static struct {
    int calls;
    uct_ep_h ep;
    ucs_status_t status;
    int logged;      /* error lines */
    char text[2048]; /* their text, '|' after each */
} acc;

static ucs_status_t access_err_cb(void *arg, uct_ep_h ep, ucs_status_t status)
{
    ++acc.calls;
    acc.ep     = ep;
    acc.status = status;
    return UCS_OK;
}

static ucs_log_func_rc_t access_log(const char *file, unsigned line,
                                    const char *function, ucs_log_level_t level,
                                    const ucs_log_component_config_t *comp,
                                    const char *message, va_list ap)
{
    if (level > UCS_LOG_LEVEL_WARN) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    size_t len = strlen(acc.text);

    ++acc.logged;
    if (len + 2 < sizeof(acc.text)) {
        vsnprintf(acc.text + len, sizeof(acc.text) - len - 1, message, ap);
        strcat(acc.text, "|");
    }
    return UCS_LOG_FUNC_RC_STOP;
}

/* Operations a NIC refuses while executing them (UCT_IFACE_FLAG_ERRHANDLE_
 * ZCOPY_BUF and _REMOTE_MEM): a local buffer outside the memory handle's
 * registration, a remote address outside the rkey's, also for a striped
 * operation of which only some fragments are out of range. Each completes
 * once, with an error; the endpoint's error handler runs once, with the
 * endpoint; an error line says what the device refused; the endpoint
 * refuses what is posted after; nothing was written outside the ranges;
 * the interfaces go on working. */
static void access_errors(char *lbuf, uct_mem_h lmemh, char *rbuf,
                          uct_rkey_t rkey)
{
    /* FAILURE: the level of the failure's log line (diag by default) */
    static const char *const cfg[] = {
        "FRAG_SIZE", "64k", "STRIPE_THRESH", "64k", "FAILURE", "error", NULL};
    const size_t half = BUF_SIZE / 2, page = 4096;
    uct_iov_t iov = {.memh = lmemh, .count = 1};
    uint64_t hdr = 0x5a5a5a5a5a5a5a5aull, result = 0;
    uintptr_t raddr;
    test_comp_t comp;
    access_case_t c;
    ucs_status_t st;
    double deadline;
    char *hole;
    uct_ep_h ep;
    side_t s, d;
    int i;

    /* An address range with nothing mapped (nor registered) there. */
    hole = mmap(NULL, 16 * page, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(hole != MAP_FAILED, "mmap: %m");
    CHECK(munmap(hole, 16 * page) == 0, "munmap: %m");

    open_side_err(&d, cfg, NULL);
    open_side_err(&s, cfg, access_err_cb);
    for (c = 0; c < ACC_LAST; ++c) {
        ep = ep_to_iface(&s, &d);
        exchange(ep, &d, lbuf, lmemh, rbuf, rkey, "endpoint before an error");
        memset(acc.text, 0, sizeof(acc.text));
        acc.calls = acc.logged = 0;
        acc.ep                 = NULL;
        for (i = 0; i < (int)page; ++i) {
            lbuf[i] = (char)(i * 3 + c);
        }
        memset(rbuf, 0x77, BUF_SIZE);
        iov.buffer     = lbuf;
        iov.length     = 16;
        raddr          = (uintptr_t)rbuf;
        comp.uc.func   = comp_cb;
        comp.uc.count  = 1;
        comp.uc.status = UCS_OK;
        comp.done      = 0;
        ucs_log_push_handler(access_log);
        switch (c) {
        case ACC_PUT_LOCAL:
        case ACC_GET_LOCAL:
        case ACC_AM_ZCOPY_LOCAL:
            iov.buffer = hole;
            break;
        case ACC_PUT_REMOTE:
        case ACC_GET_REMOTE:
        case ACC_ATOMIC_REMOTE:
            raddr = (uintptr_t)hole;
            break;
        case ACC_PUT_STRIPED_REMOTE:
            /* 16 fragments of 64 KiB, the second half past the region */
            iov.length = BUF_SIZE;
            raddr      = (uintptr_t)rbuf + half;
            break;
        case ACC_PUT_STRIPED_TAIL:
            iov.length = BUF_SIZE;
            raddr      = (uintptr_t)rbuf + 64 * 1024;
            break;
        case ACC_GET_STRIPED_LOCAL:
            iov.buffer = lbuf + half;
            iov.length = BUF_SIZE;
            break;
        default:
            CHECK(0, "case %d", c);
        }
        switch (c) {
        case ACC_PUT_LOCAL:
        case ACC_PUT_REMOTE:
        case ACC_PUT_STRIPED_REMOTE:
        case ACC_PUT_STRIPED_TAIL:
            st = uct_ep_put_zcopy(ep, &iov, 1, raddr, rkey, &comp.uc);
            break;
        case ACC_GET_LOCAL:
        case ACC_GET_REMOTE:
        case ACC_GET_STRIPED_LOCAL:
            st = uct_ep_get_zcopy(ep, &iov, 1, raddr, rkey, &comp.uc);
            break;
        case ACC_AM_ZCOPY_LOCAL:
            st = uct_ep_am_zcopy(ep, AM_ID, &hdr, sizeof(hdr), &iov, 1, 0,
                                 &comp.uc);
            break;
        default:
            st = uct_ep_atomic64_fetch(ep, UCT_ATOMIC_OP_ADD, 1, &result, raddr,
                                       rkey, &comp.uc);
            break;
        }
        if (c == ACC_AM_ZCOPY_LOCAL) {
            /* rc_vqp copies AM data: it checks the range instead of the
             * NIC, and refuses at once; the endpoint is unharmed. */
            ucs_log_pop_handler();
            CHECK((st == UCS_ERR_INVALID_PARAM) && (acc.logged == 1) &&
                      (strstr(acc.text, "outside its memory handle") != NULL),
                  "%s: returned %s, %d error lines: '%s'", access_names[c],
                  ucs_status_string(st), acc.logged, acc.text);
            exchange(ep, &d, lbuf, lmemh, rbuf, rkey,
                     "endpoint after a refused am_zcopy");
            CHECK((acc.calls == 0) && (comp.done == 0),
                  "%s: error handler ran %d times, %d completions",
                  access_names[c], acc.calls, comp.done);
            uct_ep_destroy(ep);
            continue;
        }
        CHECK(st == UCS_INPROGRESS, "%s: posted with %s", access_names[c],
              ucs_status_string(st));
        deadline = now() + 20;
        while ((comp.done == 0) || (acc.calls == 0)) {
            CHECK(now() < deadline,
                  "%s: in 20 s, %d completions, %d error handler calls",
                  access_names[c], comp.done, acc.calls);
            uct_worker_progress(worker);
        }
        for (i = 0; i < 2000; ++i) { /* nothing more comes */
            uct_worker_progress(worker);
        }
        CHECK(comp.done == 1, "%s: completed %d times", access_names[c],
              comp.done);
        CHECK(UCS_STATUS_IS_ERR(comp.uc.status), "%s: completed with %s",
              access_names[c], ucs_status_string(comp.uc.status));
        CHECK((acc.calls == 1) && (acc.ep == ep) &&
                  UCS_STATUS_IS_ERR(acc.status),
              "%s: error handler ran %d times, endpoint %p (want %p), %s",
              access_names[c], acc.calls, (void *)acc.ep, (void *)ep,
              ucs_status_string(acc.status));
        CHECK(strstr(acc.text, (c == ACC_PUT_REMOTE) || (c == ACC_GET_REMOTE) ||
                                       (c == ACC_PUT_STRIPED_REMOTE) ||
                                       (c == ACC_PUT_STRIPED_TAIL) ||
                                       (c == ACC_ATOMIC_REMOTE)
                                   ? "remote access"
                                   : "local protection") != NULL,
              "%s: %d error lines: '%s'", access_names[c], acc.logged,
              acc.text);
        /* A failed endpoint refuses operations; nothing reaches the peer. */
        st = uct_ep_put_short(ep, lbuf, 8, (uintptr_t)rbuf, rkey);
        CHECK(UCS_STATUS_IS_ERR(st) && (st != UCS_ERR_NO_RESOURCE),
              "%s: put_short after the failure: %s", access_names[c],
              ucs_status_string(st));
        for (i = 0; i < 1000; ++i) {
            uct_worker_progress(worker);
        }
        ucs_log_pop_handler();
        CHECK(acc.calls == 1, "%s: error handler ran %d times", access_names[c],
              acc.calls);
        if ((c == ACC_PUT_LOCAL) || (c == ACC_GET_REMOTE) ||
            (c == ACC_ATOMIC_REMOTE)) {
            for (i = 0; i < (int)BUF_SIZE; ++i) {
                CHECK(rbuf[i] == 0x77, "%s: remote byte %d written",
                      access_names[c], i);
            }
        } else if (c == ACC_PUT_STRIPED_REMOTE) {
            for (i = 0; i < (int)half; ++i) {
                CHECK(rbuf[i] == 0x77, "%s: remote byte %d written",
                      access_names[c], i);
            }
        }
        uct_ep_destroy(ep);
        printf("ok - %s: completes once with an error, reported once (%s)\n",
               access_names[c], ucs_status_string(acc.status));
    }
    /* Both interfaces go on, also the other way. */
    ep = ep_to_iface(&s, &d);
    exchange(ep, &d, lbuf, lmemh, rbuf, rkey, "endpoint after access errors");
    uct_ep_destroy(ep);
    ep = ep_to_iface(&d, &s);
    exchange(ep, &s, lbuf, lmemh, rbuf, rkey,
             "the target's endpoint after access errors");
    uct_ep_destroy(ep);
    close_side(&s);
    close_side(&d);
}

static ucs_status_t tx_pending_cb(uct_pending_req_t *req);

static struct {
    uct_ep_h ep;
    int runs; /* pending callback calls that sent */
} txp;

static ssize_t am_bcopy8(uct_ep_h ep, uint64_t *payload)
{
    return uct_ep_am_bcopy(ep, AM_ID, pack8_cb, payload, 0);
}

static ucs_status_t tx_pending_cb(uct_pending_req_t *req)
{
    uint64_t payload = 0x7878;
    ssize_t len      = am_bcopy8(txp.ep, &payload);

    if (len < 0) {
        return (ucs_status_t)len;
    }
    ++txp.runs;
    return UCS_OK;
}

/* UCX_RC_VQP_TX_MAX_BUFS bounds the bounce buffers of an interface's bcopy
 * operations: with 4 and no progress, the fifth AM and a put_bcopy are
 * refused with UCS_ERR_NO_RESOURCE; a pending request sends once
 * completions released buffers; many more go through the 4. Invalid
 * values fail the interface's open with a line that names them. */
static void tx_max_bufs(char *rbuf, uct_rkey_t rkey)
{
    static const char *const cfg[] = {"TX_MAX_BUFS", "4", "TX_BUFS_GROW", "2",
                                      NULL};
    static const char *const bad[][4] = {
        {"TX_MAX_BUFS", "0", NULL},
        {"TX_MAX_BUFS", "-2", NULL},
        {"TX_BUFS_GROW", "0", NULL},
    };
    uct_pending_req_t req = {.func = tx_pending_cb};
    uint64_t payload      = 0x5151;
    int n                 = 0, i, am0;
    ucs_status_t st;
    ssize_t len;
    side_t c, d;

    open_side(&d);
    open_side_err(&c, cfg, NULL);
    txp.ep   = ep_to_iface(&c, &d);
    txp.runs = 0;
    /* Connected once an AM goes (am_short needs no buffer). */
    while (uct_ep_am_short(txp.ep, AM_ID, 0, "conn", 4) ==
           UCS_ERR_NO_RESOURCE) {
        uct_worker_progress(worker);
    }
    wait_int(&d.am_count, 1, "tx_max_bufs: connect");
    uct_ep_flush(txp.ep, UCT_FLUSH_FLAG_LOCAL, NULL);
    for (i = 0; i < 1000; ++i) {
        uct_worker_progress(worker);
    }
    am0 = d.am_count;
    while ((len = am_bcopy8(txp.ep, &payload)) >= 0) {
        CHECK(++n <= 4, "tx_max_bufs: %d AMs posted with 4 buffers", n);
    }
    CHECK((n == 4) && (len == UCS_ERR_NO_RESOURCE),
          "tx_max_bufs: %d AMs posted, then %zd", n, len);
    len = uct_ep_put_bcopy(txp.ep, pack8_cb, &payload, (uintptr_t)rbuf, rkey);
    CHECK(len == UCS_ERR_NO_RESOURCE, "tx_max_bufs: put_bcopy with none: %zd",
          len);
    CHECK_OK(uct_ep_pending_add(txp.ep, &req, 0));
    wait_int(&txp.runs, 1, "tx_max_bufs: the pending AM");
    wait_int(&d.am_count, am0 + 5, "tx_max_bufs: five AMs");
    for (i = 0; i < 300; ++i) {
        while ((len = am_bcopy8(txp.ep, &payload)) == UCS_ERR_NO_RESOURCE) {
            uct_worker_progress(worker);
        }
        CHECK(len >= 0, "tx_max_bufs: am_bcopy %d: %zd", i, len);
    }
    wait_int(&d.am_count, am0 + 305, "tx_max_bufs: 300 more AMs");
    uct_ep_destroy(txp.ep);
    close_side(&c);
    close_side(&d);

    for (i = 0; i < 3; ++i) {
        memset(acc.text, 0, sizeof(acc.text));
        acc.logged = 0;
        side_cfg   = bad[i];
        ucs_log_push_handler(access_log);
        st = open_side_ex(&c, NULL, NULL, 0, 0, 0);
        ucs_log_pop_handler();
        side_cfg = NULL;
        CHECK((st == UCS_ERR_INVALID_PARAM) &&
                  (strstr(acc.text, "invalid configuration") != NULL),
              "%s=%s: open returned %s, log '%s'", bad[i][0], bad[i][1],
              ucs_status_string(st), acc.text);
    }
    printf("ok - TX_MAX_BUFS=4: 4 bcopy operations, then NO_RESOURCE until "
           "completions; pending and 300 more go through; invalid values "
           "refused\n");
}

static uint32_t pack_inval_key(uct_md_h m, uct_mem_h memh)
{
    uct_md_mkey_pack_params_t params = {
        .field_mask = UCT_MD_MKEY_PACK_FIELD_FLAGS,
        .flags      = UCT_MD_MKEY_PACK_FLAG_INVALIDATE};
    uint32_t key = 0;

    CHECK_OK(uct_md_mkey_pack_v2(m, memh, &params, &key));
    return key;
}

static void comp_init(test_comp_t *c)
{
    c->uc.func   = comp_cb;
    c->uc.count  = 1;
    c->uc.status = UCS_OK;
    c->done      = 0;
}

static ucs_status_t dereg_invalidate(uct_md_h m, uct_mem_h memh, test_comp_t *c)
{
    uct_md_mem_dereg_params_t params = {
        .field_mask = UCT_MD_MEM_DEREG_FIELD_MEMH |
                      UCT_MD_MEM_DEREG_FIELD_FLAGS |
                      UCT_MD_MEM_DEREG_FIELD_COMPLETION,
        .memh  = memh,
        .flags = UCT_MD_MEM_DEREG_FLAG_INVALIDATE,
        .comp  = &c->uc};

    comp_init(c);
    return uct_md_mem_dereg_v2(m, &params);
}

/* A new endpoint of @a s works (through @a live / @a klive), but its
 * get_zcopy from @a tbuf under @a key is refused by the target: completes
 * once with an error, the error handler runs once, the device says the key
 * is not registered. */
static void expect_key_dead(side_t *s, side_t *d, char *lb, uct_mem_h lmemh,
                            char *live, uint32_t klive, char *tbuf,
                            uint32_t key, const char *what)
{
    uct_iov_t iov = {.buffer = lb, .length = 256, .memh = lmemh, .count = 1};
    uct_rkey_bundle_t bl, bk;
    double deadline;
    test_comp_t comp;
    ucs_status_t st;
    uct_ep_h ep;
    int i;

    CHECK_OK(uct_rkey_unpack(component, &klive, &bl));
    CHECK_OK(uct_rkey_unpack(component, &key, &bk));
    ep = ep_to_iface(s, d);
    exchange(ep, d, lb, lmemh, live, bl.rkey, "endpoint before the get");
    memset(acc.text, 0, sizeof(acc.text));
    acc.calls = acc.logged = 0;
    comp_init(&comp);
    ucs_log_push_handler(access_log);
    st = uct_ep_get_zcopy(ep, &iov, 1, (uintptr_t)tbuf, bk.rkey, &comp.uc);
    CHECK(st == UCS_INPROGRESS, "%s: get_zcopy: %s", what,
          ucs_status_string(st));
    deadline = now() + 20;
    while ((comp.done == 0) || (acc.calls == 0)) {
        CHECK(now() < deadline, "%s: in 20 s, %d completions, %d errors", what,
              comp.done, acc.calls);
        uct_worker_progress(worker);
    }
    for (i = 0; i < 2000; ++i) {
        uct_worker_progress(worker);
    }
    ucs_log_pop_handler();
    CHECK((comp.done == 1) && UCS_STATUS_IS_ERR(comp.uc.status) &&
              (acc.calls == 1),
          "%s: %d completions (%s), error handler %d times", what, comp.done,
          ucs_status_string(comp.uc.status), acc.calls);
    CHECK(strstr(acc.text, "key not registered") != NULL,
          "%s: the device did not refuse the key: '%s'", what, acc.text);
    uct_ep_destroy(ep);
    uct_rkey_release(component, &bl);
    uct_rkey_release(component, &bk);
    printf("ok - %s\n", what);
}

/* UCT_MD_FLAG_INVALIDATE (UCP requires it of rendezvous lanes connected
 * to an interface address when errors are handled): the completion comes
 * once the invalidated registration and the registrations of its range
 * made before it are gone, never while their memory is reachable; after
 * it, the key is refused. Later registrations do not hold it. Bad
 * parameters are refused and leave the registration intact. With the
 * registration cache (@a rcache "try") and without ("n"). */
static void invalidation(const char *rcache)
{
    static const char *const cfg[] = {"FAILURE", "error", NULL};
    const size_t len               = 65536;
    uct_md_mem_dereg_params_t bad;
    test_comp_t a, b, c, e, f;
    uint32_t k1, k2, klive, k9;
    uct_mem_h lmemh, mlive, m1, m2, m3, m4, m5, m6, m7, m8, m9;
    uct_rkey_bundle_t bundle;
    char *lb, *live, *tbuf;
    uct_md_attr_t attr;
    uct_md_h saved;
    side_t s, d;
    uct_ep_h ep;
    int cached;

    cached = strcmp(rcache, "n") != 0;
    saved  = md;
    CHECK_OK(open_md_with("RCACHE", rcache, &md));
    CHECK_OK(uct_md_query(md, &attr));
    CHECK(attr.cap.flags & UCT_MD_FLAG_INVALIDATE,
          "RCACHE=%s: no UCT_MD_FLAG_INVALIDATE", rcache);
    open_side(&d);
    open_side_err(&s, cfg, access_err_cb);
    lb   = aligned_alloc(4096, len);
    live = aligned_alloc(4096, len);
    tbuf = aligned_alloc(4096, len);
    CHECK_OK(uct_md_mem_reg(md, lb, len, UCT_MD_MEM_ACCESS_ALL, &lmemh));
    klive = reg_key(md, live, len, &mlive);

    /* Two registrations of the range; the first is invalidated. */
    CHECK_OK(uct_md_mem_reg(md, tbuf, len, UCT_MD_MEM_ACCESS_ALL, &m1));
    k1 = pack_inval_key(md, m1);
    CHECK_OK(uct_md_mem_reg(md, tbuf, len, UCT_MD_MEM_ACCESS_ALL, &m2));
    k2 = pack_inval_key(md, m2);
    CHECK(cached ? (k1 == k2) : (k1 != k2), "RCACHE=%s: keys 0x%x and 0x%x",
          rcache, k1, k2);
    CHECK_OK(uct_rkey_unpack(component, &k2, &bundle));
    ep = ep_to_iface(&s, &d);
    exchange(ep, &d, lb, lmemh, tbuf, bundle.rkey,
             "invalidation: the key before");
    uct_ep_destroy(ep);
    CHECK_OK(dereg_invalidate(md, m1, &a));
    CHECK(a.done == 0,
          "RCACHE=%s: invalidation completed while another registration of "
          "the range is live",
          rcache);
    if (!cached) {
        /* The invalidated registration's own key is gone already. */
        expect_key_dead(&s, &d, lb, lmemh, live, klive, tbuf, k1,
                        "invalidation: the invalidated key is refused");
    }
    ep = ep_to_iface(&s, &d);
    exchange(ep, &d, lb, lmemh, tbuf, bundle.rkey,
             "invalidation: the range's other registration still works");
    uct_ep_destroy(ep);
    uct_rkey_release(component, &bundle);
    CHECK_OK(uct_md_mem_dereg(md, m2));
    CHECK(a.done == 1, "RCACHE=%s: invalidation completed %d times", rcache,
          a.done);
    expect_key_dead(&s, &d, lb, lmemh, live, klive, tbuf, k2,
                    "invalidation: after the completion no key of the range "
                    "works");

    /* A registration made after the invalidation does not hold it. */
    CHECK_OK(uct_md_mem_reg(md, tbuf, len, UCT_MD_MEM_ACCESS_ALL, &m3));
    CHECK_OK(uct_md_mem_reg(md, tbuf, len, UCT_MD_MEM_ACCESS_ALL, &m4));
    CHECK_OK(dereg_invalidate(md, m3, &b));
    CHECK_OK(uct_md_mem_reg(md, tbuf, len, UCT_MD_MEM_ACCESS_ALL, &m5));
    CHECK(b.done == 0, "RCACHE=%s: completed before the older one went",
          rcache);
    CHECK_OK(uct_md_mem_dereg(md, m4));
    CHECK(b.done == 1, "RCACHE=%s: held by a later registration (%d)", rcache,
          b.done);
    CHECK_OK(uct_md_mem_dereg(md, m5));
    CHECK(b.done == 1, "RCACHE=%s: completed %d times", rcache, b.done);

    /* Two invalidations waiting for one registration: both complete. */
    CHECK_OK(uct_md_mem_reg(md, tbuf, len, UCT_MD_MEM_ACCESS_ALL, &m6));
    CHECK_OK(uct_md_mem_reg(md, tbuf, len, UCT_MD_MEM_ACCESS_ALL, &m7));
    CHECK_OK(uct_md_mem_reg(md, tbuf, len, UCT_MD_MEM_ACCESS_ALL, &m8));
    CHECK_OK(dereg_invalidate(md, m6, &c));
    CHECK_OK(dereg_invalidate(md, m7, &e));
    CHECK((c.done == 0) && (e.done == 0), "RCACHE=%s: completed early", rcache);
    CHECK_OK(uct_md_mem_dereg(md, m8));
    CHECK((c.done == 1) && (e.done == 1),
          "RCACHE=%s: two invalidations completed %d and %d times", rcache,
          c.done, e.done);

    /* Bad parameters: refused, the registration stays usable. */
    k9 = reg_key(md, tbuf, len, &m9);
    comp_init(&f);
    bad.field_mask = UCT_MD_MEM_DEREG_FIELD_MEMH | UCT_MD_MEM_DEREG_FIELD_FLAGS;
    bad.memh       = m9;
    bad.flags      = UCT_MD_MEM_DEREG_FLAG_INVALIDATE;
    bad.comp       = NULL;
    CHECK(uct_md_mem_dereg_v2(md, &bad) == UCS_ERR_INVALID_PARAM,
          "INVALIDATE without a completion accepted");
    bad.field_mask =
        UCT_MD_MEM_DEREG_FIELD_FLAGS | UCT_MD_MEM_DEREG_FIELD_COMPLETION;
    bad.comp = &f.uc;
    CHECK(uct_md_mem_dereg_v2(md, &bad) == UCS_ERR_INVALID_PARAM,
          "dereg without a memory handle accepted");
    bad.field_mask = UCT_MD_MEM_DEREG_FIELD_MEMH | UCT_MD_MEM_DEREG_FIELD_FLAGS;
    bad.flags      = 1u << 7;
    CHECK(uct_md_mem_dereg_v2(md, &bad) == UCS_ERR_INVALID_PARAM,
          "dereg with unknown flags accepted");
    CHECK(f.done == 0, "a refused dereg completed");
    CHECK_OK(uct_rkey_unpack(component, &k9, &bundle));
    ep = ep_to_iface(&s, &d);
    exchange(ep, &d, lb, lmemh, tbuf, bundle.rkey,
             "invalidation: a registration after refused deregs");
    uct_ep_destroy(ep);
    uct_rkey_release(component, &bundle);
    CHECK_OK(dereg_invalidate(md, m9, &f));
    CHECK(f.done == 1, "RCACHE=%s: a lone invalidation completed %d times",
          rcache, f.done);

    CHECK_OK(uct_md_mem_dereg(md, mlive));
    CHECK_OK(uct_md_mem_dereg(md, lmemh));
    close_side(&s);
    close_side(&d);
    uct_md_close(md);
    md = saved;
    free(lb);
    free(live);
    free(tbuf);
    printf("ok - memory invalidation with RCACHE=%s\n", rcache);
}

/* Fills @a iov with @a n entries of @a lbuf at the offsets and lengths of
 * @a spec (offset, length pairs); entry @a count2 (if < n) has count 2. */
static void rma_iov_fill(uct_iov_t *iov, char *lbuf, uct_mem_h lmemh,
                         const size_t (*spec)[2], unsigned n, unsigned count2)
{
    unsigned i;

    for (i = 0; i < n; ++i) {
        iov[i].buffer = lbuf + spec[i][0];
        iov[i].length = (i == count2) ? spec[i][1] / 2 : spec[i][1];
        iov[i].count  = (i == count2) ? 2 : 1;
        iov[i].stride = 0;
        iov[i].memh   = lmemh;
    }
}

static void wait_flushed(uct_ep_h ep, const char *what)
{
    double deadline = now() + 20;

    while (uct_ep_flush(ep, 0, NULL) != UCS_OK) {
        CHECK(now() < deadline, "%s: flush not done in 20 s", what);
        uct_worker_progress(worker);
    }
}

static struct {
    uct_ep_h ep;
    uct_iov_t *iov;
    unsigned n;
    uintptr_t raddr;
    uct_rkey_t rkey;
    test_comp_t *comp;
    int runs;
} iovp;

static ucs_status_t iov_pending_cb(uct_pending_req_t *req)
{
    ucs_status_t st = uct_ep_put_zcopy(iovp.ep, iovp.iov, iovp.n, iovp.raddr,
                                       iovp.rkey, &iovp.comp->uc);

    if (UCS_STATUS_IS_ERR(st)) {
        return st;
    }
    ++iovp.runs;
    return UCS_OK;
}

/* put_zcopy and get_zcopy of up to max_iov entries (8, fewer with a smaller
 * TX_QUEUE_LEN): the entries go to consecutive remote addresses, some of
 * them striped, an empty one skipped, one of count 2; the completion is
 * called once. Without one, a flush covers them. All entries or none: with
 * too few free slots the call says NO_RESOURCE and writes nothing, and
 * pending_add takes the request (not BUSY), which goes once there is room.
 * A bad entry is refused before anything is posted; an entry the target
 * refuses (past its registration) completes the operation once, with the
 * error; the failed endpoint refuses more with an error. */
static void rma_iov(char *lbuf, uct_mem_h lmemh, char *rbuf, uct_rkey_t rkey)
{
    static const char *const cfg[] = {
        "FRAG_SIZE",    "64k",     "STRIPE_THRESH",
        "64k",          "FAILURE", "error",
        "TX_QUEUE_LEN", "8",       NULL};
    static const char *const small_cfg[] = {"TX_QUEUE_LEN", "3", NULL};
    /* local offset (all in the first half), length: 348 KiB in all */
    static const size_t spec[8][2] = {
        {0, 100},   {4096, 0},      {8192, 4000},    {200000, 262144},
        {16384, 1}, {20480, 65536}, {470000, 16384}, {490000, 8192}};
    const size_t half     = BUF_SIZE / 2;
    uct_pending_req_t req = {.func = iov_pending_cb};
    test_comp_t comp, comp0;
    uct_iov_t iov[9];
    size_t off, total = 0;
    ucs_status_t st;
    unsigned i, j;
    uct_ep_h ep;
    side_t s, d;

    open_side_err(&d, cfg, NULL);
    open_side_err(&s, cfg, access_err_cb);
    CHECK((s.attr.cap.put.max_iov == 8) && (s.attr.cap.get.max_iov == 8),
          "max_iov put %zu get %zu", s.attr.cap.put.max_iov,
          s.attr.cap.get.max_iov);
    ep = ep_to_iface(&s, &d);
    exchange(ep, &d, lbuf, lmemh, rbuf, rkey, "rma_iov: connect");
    for (i = 0; i < 8; ++i) {
        total += spec[i][1];
    }

    /* put of 8 entries into the second half of rbuf */
    for (off = 0; off < half; ++off) {
        lbuf[off] = (char)(off * 13 + 1);
    }
    memset(rbuf, 0x33, BUF_SIZE);
    rma_iov_fill(iov, lbuf, lmemh, spec, 8, 2);
    comp_init(&comp);
    st = uct_ep_put_zcopy(ep, iov, 8, (uintptr_t)rbuf + half, rkey, &comp.uc);
    CHECK(st == UCS_INPROGRESS, "rma_iov: put_zcopy of 8: %s",
          ucs_status_string(st));
    wait_int(&comp.done, 1, "rma_iov: put_zcopy of 8");
    wait_flushed(ep, "rma_iov: put_zcopy of 8");
    CHECK((comp.done == 1) && (comp.uc.status == UCS_OK) &&
              (comp.uc.count == 0),
          "rma_iov: put completed %d times, %s, count %d", comp.done,
          ucs_status_string(comp.uc.status), comp.uc.count);
    for (i = 0, off = half; i < 8; off += spec[i][1], ++i) {
        CHECK(!memcmp(rbuf + off, lbuf + spec[i][0], spec[i][1]),
              "rma_iov: put entry %u differs", i);
    }
    for (j = 0; j < half; ++j) {
        CHECK(rbuf[j] == 0x33, "rma_iov: put wrote byte %u before", j);
    }
    for (off = half + total; off < BUF_SIZE; ++off) {
        CHECK(rbuf[off] == 0x33, "rma_iov: put wrote byte %zu after", off);
    }

    /* get of the same 8 entries back into the second half of lbuf, 64
     * bytes apart */
    memset(lbuf + half, 0, half);
    for (i = 0, off = half; i < 8; off += spec[i][1] + 64, ++i) {
        iov[i].buffer = lbuf + off;
    }
    comp_init(&comp);
    st = uct_ep_get_zcopy(ep, iov, 8, (uintptr_t)rbuf + half, rkey, &comp.uc);
    CHECK(st == UCS_INPROGRESS, "rma_iov: get_zcopy of 8: %s",
          ucs_status_string(st));
    wait_int(&comp.done, 1, "rma_iov: get_zcopy of 8");
    wait_flushed(ep, "rma_iov: get_zcopy of 8");
    CHECK((comp.done == 1) && (comp.uc.status == UCS_OK),
          "rma_iov: get completed %d times, %s", comp.done,
          ucs_status_string(comp.uc.status));
    for (i = 0, off = half; i < 8; off += spec[i][1] + 64, ++i) {
        CHECK(!memcmp(lbuf + off, lbuf + spec[i][0], spec[i][1]) &&
                  (lbuf[off + spec[i][1]] == 0),
              "rma_iov: get entry %u differs", i);
    }

    /* without a completion: a flush covers them */
    memset(rbuf, 0x33, BUF_SIZE);
    rma_iov_fill(iov, lbuf, lmemh, spec, 8, 8);
    st = uct_ep_put_zcopy(ep, iov, 8, (uintptr_t)rbuf, rkey, NULL);
    CHECK(st == UCS_INPROGRESS, "rma_iov: put_zcopy without comp: %s",
          ucs_status_string(st));
    wait_flushed(ep, "rma_iov: put_zcopy without comp");
    for (i = 0, off = 0; i < 8; off += spec[i][1], ++i) {
        CHECK(!memcmp(rbuf + off, lbuf + spec[i][0], spec[i][1]),
              "rma_iov: put entry %u without comp differs", i);
    }

    /* 6 slots free, 7 entries needed: refused whole, queued as pending */
    memset(rbuf, 0x33, BUF_SIZE);
    comp_init(&comp0);
    comp0.uc.count = 2;
    for (i = 0; i < 2; ++i) {
        st = uct_ep_get_zcopy(ep, iov, 1, (uintptr_t)rbuf + half, rkey,
                              &comp0.uc);
        CHECK(st == UCS_INPROGRESS, "rma_iov: get_zcopy: %s",
              ucs_status_string(st));
    }
    rma_iov_fill(iov, lbuf, lmemh, spec, 8, 8);
    comp_init(&comp);
    st = uct_ep_put_zcopy(ep, iov, 8, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(st == UCS_ERR_NO_RESOURCE, "rma_iov: put_zcopy of 7 in 6: %s",
          ucs_status_string(st));
    iovp.ep    = ep;
    iovp.iov   = iov;
    iovp.n     = 8;
    iovp.raddr = (uintptr_t)rbuf;
    iovp.rkey  = rkey;
    iovp.comp  = &comp;
    iovp.runs  = 0;
    CHECK_OK(uct_ep_pending_add(ep, &req, 0));
    CHECK((rbuf[0] == 0x33) && (comp.done == 0),
          "rma_iov: a refused put_zcopy wrote or completed");
    wait_int(&comp0.done, 1, "rma_iov: get_zcopy ahead");
    wait_int(&iovp.runs, 1, "rma_iov: the pending put_zcopy");
    wait_int(&comp.done, 1, "rma_iov: the pending put_zcopy's completion");
    CHECK(comp.uc.status == UCS_OK, "rma_iov: pending put completed with %s",
          ucs_status_string(comp.uc.status));
    for (i = 0, off = 0; i < 8; off += spec[i][1], ++i) {
        CHECK(!memcmp(rbuf + off, lbuf + spec[i][0], spec[i][1]),
              "rma_iov: pending put entry %u differs", i);
    }

    /* bad entries: refused before anything goes */
    memset(rbuf, 0x33, BUF_SIZE);
    memset(acc.text, 0, sizeof(acc.text));
    acc.calls = acc.logged = 0;
    ucs_log_push_handler(access_log);
    rma_iov_fill(iov, lbuf, lmemh, spec, 8, 8);
    iov[8] = iov[0];
    st     = uct_ep_put_zcopy(ep, iov, 9, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(st == UCS_ERR_INVALID_PARAM, "rma_iov: 9 entries: %s",
          ucs_status_string(st));
    st = uct_ep_get_zcopy(ep, iov, 9, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(st == UCS_ERR_INVALID_PARAM, "rma_iov: get of 9 entries: %s",
          ucs_status_string(st));
    iov[5].memh = UCT_MEM_HANDLE_NULL;
    st          = uct_ep_put_zcopy(ep, iov, 8, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(st == UCS_ERR_INVALID_PARAM, "rma_iov: entry without memh: %s",
          ucs_status_string(st));
    iov[5].memh   = lmemh;
    iov[6].count  = 2;
    iov[6].stride = 2 * iov[6].length;
    st = uct_ep_get_zcopy(ep, iov, 8, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(st == UCS_ERR_UNSUPPORTED, "rma_iov: strided entry: %s",
          ucs_status_string(st));
    ucs_log_pop_handler();
    CHECK((acc.logged == 4) && (strstr(acc.text, "at most 8") != NULL) &&
              (strstr(acc.text, "iov 5") != NULL) &&
              (strstr(acc.text, "iov 6: strided") != NULL),
          "rma_iov: %d error lines: '%s'", acc.logged, acc.text);
    for (i = 0; i < 1000; ++i) {
        uct_worker_progress(worker);
    }
    for (off = 0; off < BUF_SIZE; ++off) {
        CHECK(rbuf[off] == 0x33, "rma_iov: a refused call wrote byte %zu", off);
    }
    CHECK(comp.done == 1, "rma_iov: a refused call completed");

    /* the last entry runs past the target's registration: one completion,
     * with the error */
    memset(acc.text, 0, sizeof(acc.text));
    acc.calls = acc.logged = 0;
    ucs_log_push_handler(access_log);
    rma_iov_fill(iov, lbuf, lmemh, spec, 4, 4);
    comp_init(&comp);
    st = uct_ep_put_zcopy(ep, iov, 4,
                          (uintptr_t)rbuf + BUF_SIZE - 100 - 4000 - 1000, rkey,
                          &comp.uc);
    CHECK(st == UCS_INPROGRESS, "rma_iov: put past the region: %s",
          ucs_status_string(st));
    wait_int(&comp.done, 1, "rma_iov: put past the region");
    wait_int(&acc.calls, 1, "rma_iov: error handler");
    for (i = 0; i < 2000; ++i) {
        uct_worker_progress(worker);
    }
    CHECK((comp.done == 1) && UCS_STATUS_IS_ERR(comp.uc.status) &&
              (acc.calls == 1),
          "rma_iov: past the region: %d completions (%s), %d error handler "
          "calls",
          comp.done, ucs_status_string(comp.uc.status), acc.calls);
    rma_iov_fill(iov, lbuf, lmemh, spec, 3, 3);
    st = uct_ep_put_zcopy(ep, iov, 3, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(UCS_STATUS_IS_ERR(st) && (st != UCS_ERR_NO_RESOURCE),
          "rma_iov: put_zcopy on the failed endpoint: %s",
          ucs_status_string(st));
    ucs_log_pop_handler();
    uct_ep_destroy(ep);
    close_side(&s);

    /* TX_QUEUE_LEN below 8 bounds max_iov */
    open_side_err(&s, small_cfg, NULL);
    CHECK((s.attr.cap.put.max_iov == 3) && (s.attr.cap.get.max_iov == 3),
          "TX_QUEUE_LEN=3: max_iov put %zu get %zu", s.attr.cap.put.max_iov,
          s.attr.cap.get.max_iov);
    ep = ep_to_iface(&s, &d);
    exchange(ep, &d, lbuf, lmemh, rbuf, rkey, "rma_iov: TX_QUEUE_LEN=3");
    memset(rbuf, 0x33, BUF_SIZE);
    rma_iov_fill(iov, lbuf, lmemh, spec, 3, 3);
    comp_init(&comp);
    st = uct_ep_put_zcopy(ep, iov, 3, (uintptr_t)rbuf, rkey, &comp.uc);
    CHECK(st == UCS_INPROGRESS, "rma_iov: 3 entries in 3 slots: %s",
          ucs_status_string(st));
    wait_int(&comp.done, 1, "rma_iov: 3 entries in 3 slots");
    CHECK(!memcmp(rbuf, lbuf, 100) && !memcmp(rbuf + 100, lbuf + 8192, 4000),
          "rma_iov: 3 entries in 3 slots: data differs");
    uct_ep_destroy(ep);
    close_side(&s);
    close_side(&d);
    printf("ok - put_zcopy / get_zcopy of up to max_iov entries: data, one "
           "completion, all or nothing, pending, bad entries, an entry "
           "refused by the target\n");
}

int main(int argc, char **argv)
{
    uct_component_attr_t cattr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
    uct_component_h *components;
    uct_md_config_t *md_config;
    uct_ep_params_t ep_params = {0};
    uct_md_attr_t md_attr;
    uct_mem_h lmemh, rmemh;
    uct_rkey_bundle_t rkey;
    void *rkey_buf, *addr_a, *addr_b;
    uct_ep_h ep, ep2;
    unsigned i, count;
    char *lbuf, *rbuf;
    side_t a, b;

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
    if ((argc > 1) && !strcmp(argv[1], "--mem-events-off")) {
        return mem_events_off();
    }
    /* The registration cache is off by default on the software device:
     * these interfaces run with it. */
    CHECK_OK(uct_md_config_read(component, NULL, NULL, &md_config));
    CHECK_OK(uct_config_modify(md_config, "RCACHE", "try"));
    CHECK_OK(uct_md_open(component, "vqp_sw0", md_config, &md));
    uct_config_release(md_config);
    CHECK_OK(uct_md_query(md, &md_attr));
    CHECK_OK(ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async));
    CHECK_OK(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker));
    open_side(&a);
    open_side(&b);

    lbuf = aligned_alloc(4096, BUF_SIZE);
    rbuf = aligned_alloc(4096, BUF_SIZE);
    CHECK_OK(uct_md_mem_reg(md, lbuf, BUF_SIZE, UCT_MD_MEM_ACCESS_ALL, &lmemh));
    CHECK_OK(uct_md_mem_reg(md, rbuf, BUF_SIZE, UCT_MD_MEM_ACCESS_ALL, &rmemh));
    rkey_buf = calloc(1, md_attr.rkey_packed_size);
    CHECK_OK(uct_md_mkey_pack(md, rmemh, rkey_buf));
    CHECK_OK(uct_rkey_unpack(component, rkey_buf, &rkey));

    /* One interface to the other, by its address. */
    CHECK(uct_iface_is_reachable(a.iface, b.dev_addr, b.iface_addr),
          "b is not reachable from a");
    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE |
                           UCT_EP_PARAM_FIELD_DEV_ADDR |
                           UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep_params.iface      = a.iface;
    ep_params.dev_addr   = b.dev_addr;
    ep_params.iface_addr = b.iface_addr;
    CHECK_OK(uct_ep_create(&ep_params, &ep));
    exchange(ep, &b, lbuf, lmemh, rbuf, rkey.rkey,
             "interface to another interface of the process");
    bad_arguments(ep, &a, &b, lbuf, lmemh, rbuf, rkey.rkey);
    am_zcopy_gather(ep, &a, &b, lbuf, lmemh);
    uct_ep_destroy(ep);
    am_alignment(&b);

    /* An interface to itself. */
    ep_params.dev_addr   = a.dev_addr;
    ep_params.iface_addr = a.iface_addr;
    CHECK_OK(uct_ep_create(&ep_params, &ep));
    exchange(ep, &a, lbuf, lmemh, rbuf, rkey.rkey, "interface to itself");
    uct_ep_destroy(ep);

    /* Endpoint to endpoint, both in this process. */
    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE;
    ep_params.iface      = a.iface;
    CHECK_OK(uct_ep_create(&ep_params, &ep));
    ep_params.iface = b.iface;
    CHECK_OK(uct_ep_create(&ep_params, &ep2));
    addr_a = calloc(1, a.attr.ep_addr_len);
    addr_b = calloc(1, b.attr.ep_addr_len);
    CHECK_OK(uct_ep_get_address(ep, addr_a));
    CHECK_OK(uct_ep_get_address(ep2, addr_b));
    CHECK_OK(uct_ep_connect_to_ep(ep, b.dev_addr, addr_b));
    CHECK_OK(uct_ep_connect_to_ep(ep2, a.dev_addr, addr_a));
    exchange(ep, &b, lbuf, lmemh, rbuf, rkey.rkey,
             "endpoint to endpoint in the process");
    exchange(ep2, &a, lbuf, lmemh, rbuf, rkey.rkey,
             "endpoint to endpoint in the process, the other way");
    uct_ep_destroy(ep);
    uct_ep_destroy(ep2);
    free(addr_a);
    free(addr_b);

    many_endpoints(&b, lbuf, lmemh, rbuf, rkey.rkey);
    stalled_connect();
    grant_without_room(lbuf, lmemh, rbuf, rkey.rkey);
    small_windows();
    fence_behind_grant(lbuf, lmemh, rbuf, rkey.rkey);
    full_ring_unsignaled(lbuf, rbuf, rkey.rkey);
    cancel_while_connecting();
    passive_failure_drop();
    access_errors(lbuf, lmemh, rbuf, rkey.rkey);
    rx_max_bufs();
    tx_max_bufs(rbuf, rkey.rkey);
    rma_iov(lbuf, lmemh, rbuf, rkey.rkey);
    registration_cache(&a, &b, lbuf, lmemh);
    registration_cache_no_events();
    registration_hide_errors();
    invalidation("try");
    invalidation("n");

    uct_rkey_release(component, &rkey);
    free(rkey_buf);
    CHECK_OK(uct_md_mem_dereg(md, lmemh));
    CHECK_OK(uct_md_mem_dereg(md, rmemh));
    close_side(&a);
    close_side(&b);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    uct_md_close(md);
    uct_release_component_list(components);
    free(lbuf);
    free(rbuf);
    printf("25 passed, 0 failed\n");
    return 0;
}
