/*
 * Device control over the software device: open and limits, MR
 * registration, CQ/SRQ/QP creation filling the mlx5dv structures, connecting
 * two QPs across two device instances in one process and across two forked
 * processes (each proven by an RDMA write), and every error path: bad
 * parameters, objects still in use, invalid transitions, unreachable peers.
 */
#include <config.h>

#include <dev/vqp_dev.h>
#include <mlx5/vqp_mlx5.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dev_wqe.h"
#include "test_dev_log.h"

#define ACCESS_ALL                                      \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)
#define BUF_LEN 8192
#define TIMEOUT 5.0

static int is_pow2(uint32_t v)
{
    return (v != 0) && !(v & (v - 1));
}

static vqp_dev_t *open_sw(void)
{
    vqp_dev_t *dev = NULL;

    assert_int_equal(vqp_dev_open(VQP_DEV_SW_NAME, NULL, &dev), UCS_OK);
    assert_non_null(dev);
    return dev;
}

/* One endpoint: a device, a CQ, a QP on it and a registered buffer. */
typedef struct endpoint {
    vqp_dev_t *dev;
    vqp_dev_cq_t *cq;
    struct mlx5dv_cq dv_cq;
    vqp_dev_qp_t *qp;
    struct mlx5dv_qp dv_qp;
    vqp_dev_qp_caps_t caps;
    vqp_dev_mr_t *mr;
    uint32_t lkey, rkey;
    char *buf;
    uint16_t sq_pi; /* next send WQE index */
    uint32_t cq_ci; /* next CQE index */
} endpoint_t;

/* No cmocka asserts here: forked children run these too. Returns 0 on
 * success. */
static int ep_init(endpoint_t *ep, vqp_dev_t *dev)
{
    vqp_dev_qp_init_t init = {};

    memset(ep, 0, sizeof(*ep));
    ep->dev = dev;
    ep->buf = calloc(1, BUF_LEN);
    if ((ep->buf == NULL) ||
        (vqp_dev_mr_reg(ep->dev, ep->buf, BUF_LEN, ACCESS_ALL, &ep->mr,
                        &ep->lkey, &ep->rkey) != UCS_OK) ||
        (vqp_dev_cq_create(ep->dev, 64, &ep->cq, &ep->dv_cq) != UCS_OK)) {
        return -1;
    }
    init.send_cq      = ep->cq;
    init.recv_cq      = ep->cq;
    init.max_send_wr  = 16;
    init.max_send_sge = 1;
    init.max_recv_wr  = 16;
    init.max_recv_sge = 1;
    return (vqp_dev_qp_create(ep->dev, &init, &ep->qp, &ep->dv_qp, &ep->caps) ==
            UCS_OK)
               ? 0
               : -1;
}

static void ep_addr(const endpoint_t *ep, vqp_dev_qp_addr_t *addr)
{
    vqp_dev_address(ep->dev, &addr->dev);
    addr->qpn = ep->caps.qpn;
}

/* Returns 0 when everything, the device included, went away cleanly. */
static int ep_cleanup(endpoint_t *ep)
{
    int ret = 0;

    ret |= (vqp_dev_qp_destroy(ep->qp) != UCS_OK);
    ret |= (vqp_dev_cq_destroy(ep->cq) != UCS_OK);
    ret |= (vqp_dev_mr_dereg(ep->mr) != UCS_OK);
    ret |= (vqp_dev_close(ep->dev) != UCS_OK);
    free(ep->buf);
    return ret ? -1 : 0;
}

/* ------------------------------------------------------------ device */

static void test_open_query_close(void **state)
{
    vqp_dev_t *dev1 = open_sw(), *dev2 = open_sw();
    vqp_dev_addr_t addr1, addr2;
    vqp_dev_attr_t attr;

    vqp_dev_query(dev1, &attr);
    assert_string_equal(attr.name, VQP_DEV_SW_NAME);
    assert_int_equal(attr.link, VQP_DEV_LINK_SW);
    assert_true(attr.max_qp_wr >= 16);
    assert_true(attr.max_sge >= 1);
    assert_true(attr.max_cqe >= 64);
    assert_true(attr.max_srq_wr >= 16);
    assert_true(attr.max_msg_sz >= BUF_LEN);
    assert_true(attr.max_rd_atom >= 1);
    assert_int_equal(attr.ext_atomic_sizes, 4 | 8);
    assert_int_equal(attr.path_mtu, 4096);
    assert_true(attr.bandwidth > 1e9);
    assert_int_equal(attr.gid_index, -1);

    /* Two instances in one process: same pid, distinct instances. */
    vqp_dev_address(dev1, &addr1);
    vqp_dev_address(dev2, &addr2);
    assert_int_equal(addr1.type, VQP_DEV_ADDR_SW);
    assert_int_equal(addr1.sw.pid, getpid());
    assert_int_equal(addr2.sw.pid, getpid());
    assert_int_not_equal(addr1.sw.instance, addr2.sw.instance);
    assert_int_equal(vqp_dev_is_reachable(dev1, &addr2), UCS_OK);

    assert_int_equal(vqp_dev_close(dev1), UCS_OK);
    assert_int_equal(vqp_dev_close(dev2), UCS_OK);
    assert_int_equal(vqp_dev_close(NULL), UCS_OK);
}

static void test_mr(void **state)
{
    vqp_dev_t *dev = open_sw();
    uint32_t lkey[2], rkey[2];
    vqp_dev_mr_t *mr[2];
    char buf[2][256];

    assert_int_equal(vqp_dev_mr_reg(dev, buf[0], sizeof(buf[0]), ACCESS_ALL,
                                    &mr[0], &lkey[0], &rkey[0]),
                     UCS_OK);
    assert_int_equal(vqp_dev_mr_reg(dev, buf[1], sizeof(buf[1]),
                                    IBV_ACCESS_LOCAL_WRITE, &mr[1], &lkey[1],
                                    &rkey[1]),
                     UCS_OK);
    assert_int_not_equal(lkey[0], lkey[1]);
    assert_int_not_equal(rkey[0], rkey[1]);

    /* The device cannot close under a live MR. */
    assert_int_equal(vqp_dev_close(dev), UCS_ERR_BUSY);
    expect_log("2 MRs/CQs/SRQs/QPs/AHs are still alive");

    assert_int_equal(vqp_dev_mr_dereg(mr[0]), UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(mr[1]), UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(NULL), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_mr_errors(void **state)
{
    vqp_dev_t *dev = open_sw();
    uint32_t lkey, rkey;
    vqp_dev_mr_t *mr;
    char buf[64];

    assert_int_equal(
        vqp_dev_mr_reg(dev, NULL, 64, ACCESS_ALL, &mr, &lkey, &rkey),
        UCS_ERR_INVALID_PARAM);
    expect_log("empty region");
    assert_int_equal(vqp_dev_mr_reg(dev, buf, 0, ACCESS_ALL, &mr, &lkey, &rkey),
                     UCS_ERR_INVALID_PARAM);
    expect_log("length 0: empty region");
    assert_int_equal(vqp_dev_mr_reg(dev, buf, sizeof(buf), IBV_ACCESS_MW_BIND,
                                    &mr, &lkey, &rkey),
                     UCS_ERR_INVALID_PARAM);
    expect_log("unsupported memory access flags 0x10");
    assert_int_equal(vqp_dev_mr_reg(dev, buf, sizeof(buf),
                                    IBV_ACCESS_REMOTE_WRITE, &mr, &lkey, &rkey),
                     UCS_ERR_INVALID_PARAM);
    expect_log("needs IBV_ACCESS_LOCAL_WRITE");
    assert_int_equal(
        vqp_dev_mr_reg(dev, buf, sizeof(buf), 0, NULL, &lkey, &rkey),
        UCS_ERR_INVALID_PARAM);
    expect_log("NULL device or output argument");
    assert_int_equal(
        vqp_dev_mr_reg(NULL, buf, sizeof(buf), 0, &mr, &lkey, &rkey),
        UCS_ERR_INVALID_PARAM);
    expect_log("NULL device or output argument");
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

/* As ibv_reg_mr: a range with an unmapped page is refused (an HCA cannot
 * pin it), loudly unless VQP_DEV_MR_HIDE_ERRORS; a region whose memory is
 * unmapped after registration stays valid until deregistered. */
static void test_mr_unmapped(void **state)
{
    vqp_dev_t *dev = open_sw();
    size_t page    = (size_t)sysconf(_SC_PAGESIZE);
    uint32_t lkey, rkey;
    unsigned count;
    vqp_dev_mr_t *mr;
    char *buf;

    buf = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    assert_int_equal(munmap(buf + page, page), 0);
    assert_int_equal(
        vqp_dev_mr_reg(dev, buf, 3 * page, ACCESS_ALL, &mr, &lkey, &rkey),
        UCS_ERR_INVALID_ADDR);
    expect_log("is not mapped");
    /* One byte into the hole is enough. */
    assert_int_equal(
        vqp_dev_mr_reg(dev, buf, page + 1, ACCESS_ALL, &mr, &lkey, &rkey),
        UCS_ERR_INVALID_ADDR);
    expect_log("is not mapped");
    count = test_log_count;
    assert_int_equal(vqp_dev_mr_reg(dev, buf + 2 * page - 1, 2,
                                    ACCESS_ALL | VQP_DEV_MR_HIDE_ERRORS, &mr,
                                    &lkey, &rkey),
                     UCS_ERR_INVALID_ADDR);
    assert_int_equal(test_log_count, count); /* nothing at error level */
    /* The pages around the hole register; the flag is no access bit. */
    assert_int_equal(vqp_dev_mr_reg(dev, buf + 2 * page, page,
                                    ACCESS_ALL | VQP_DEV_MR_HIDE_ERRORS, &mr,
                                    &lkey, &rkey),
                     UCS_OK);
    assert_int_equal(munmap(buf + 2 * page, page), 0);
    assert_int_equal(vqp_dev_mr_dereg(mr), UCS_OK);
    assert_int_equal(
        vqp_dev_mr_reg(dev, buf, page, ACCESS_ALL, &mr, &lkey, &rkey), UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(mr), UCS_OK);
    assert_int_equal(munmap(buf, page), 0);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

/* Whether this kernel answers PROCMAP_QUERY (Linux 6.11), which the
 * device needs to see a mapping's rights. */
static int kernel_has_procmap_query(void)
{
    uint64_t q[13] = {sizeof(q), 0, (uintptr_t)&q};
    int fd         = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int ok;

    if (fd < 0) {
        return 0;
    }
    ok = ioctl(fd, _IOWR('f', 17, uint64_t[13]), q) == 0;
    close(fd);
    return ok;
}

/* As ibv_reg_mr, which pins the pages (for writing when the access has
 * LOCAL_WRITE, REMOTE_WRITE or REMOTE_ATOMIC): PROT_NONE memory is refused
 * whatever the access, read-only memory with a write right; the check
 * covers every mapping of the range. */
static void test_mr_rights(void **state)
{
    vqp_dev_t *dev          = open_sw();
    size_t page             = (size_t)sysconf(_SC_PAGESIZE);
    const unsigned writes[] = {
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC, ACCESS_ALL};
    uint32_t lkey, rkey;
    vqp_dev_mr_t *mr;
    unsigned count, i;
    char *buf, msg[160];

    if (!kernel_has_procmap_query()) {
        vqp_dev_close(dev);
        skip(); /* the device cannot see rights there: mincore only */
    }
    buf = mmap(NULL, 3 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    for (i = 0; i < sizeof(writes) / sizeof(writes[0]); ++i) {
        assert_int_equal(
            vqp_dev_mr_reg(dev, buf + 8, 64, writes[i], &mr, &lkey, &rkey),
            UCS_ERR_INVALID_ADDR);
        expect_log("is read-only, and the access asks for writing");
    }
    /* What reading needs registers: a send's source, a remote READ's. */
    assert_int_equal(vqp_dev_mr_reg(dev, buf, 3 * page, IBV_ACCESS_REMOTE_READ,
                                    &mr, &lkey, &rkey),
                     UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(mr), UCS_OK);
    assert_int_equal(vqp_dev_mr_reg(dev, buf, page, 0, &mr, &lkey, &rkey),
                     UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(mr), UCS_OK);

    /* Three mappings (read-write, none, read-write): the last page's
     * address is named, the hole in the middle refused even for reading. */
    assert_int_equal(mprotect(buf, 3 * page, PROT_READ | PROT_WRITE), 0);
    assert_int_equal(mprotect(buf + page, page, PROT_NONE), 0);
    assert_int_equal(vqp_dev_mr_reg(dev, buf, 3 * page, 0, &mr, &lkey, &rkey),
                     UCS_ERR_INVALID_ADDR);
    snprintf(msg, sizeof(msg), "memory at %p..%p is not readable", buf + page,
             buf + 2 * page);
    expect_log(msg);
    assert_int_equal(mprotect(buf + page, page, PROT_READ), 0);
    assert_int_equal(
        vqp_dev_mr_reg(dev, buf, 3 * page, ACCESS_ALL, &mr, &lkey, &rkey),
        UCS_ERR_INVALID_ADDR);
    snprintf(msg, sizeof(msg), "memory at %p..%p is read-only", buf + page,
             buf + 2 * page);
    expect_log(msg);
    count = test_log_count;
    assert_int_equal(vqp_dev_mr_reg(dev, buf + page - 1, 2,
                                    ACCESS_ALL | VQP_DEV_MR_HIDE_ERRORS, &mr,
                                    &lkey, &rkey),
                     UCS_ERR_INVALID_ADDR);
    assert_int_equal(test_log_count, count); /* nothing at error level */
    assert_int_equal(vqp_dev_mr_reg(dev, buf, 3 * page, IBV_ACCESS_REMOTE_READ,
                                    &mr, &lkey, &rkey),
                     UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(mr), UCS_OK);
    /* Writable again: all three mappings pass with every right. */
    assert_int_equal(mprotect(buf + page, page, PROT_READ | PROT_WRITE), 0);
    assert_int_equal(
        vqp_dev_mr_reg(dev, buf, 3 * page, ACCESS_ALL, &mr, &lkey, &rkey),
        UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(mr), UCS_OK);
    assert_int_equal(munmap(buf, 3 * page), 0);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

/* ------------------------------------------------------------ queues */

static void test_cq(void **state)
{
    vqp_dev_t *dev = open_sw();
    struct mlx5dv_cq dv[2];
    struct mlx5_cqe64 *cqe = NULL;
    vqp_dev_cq_t *cq[2];
    vqp_dev_attr_t attr;
    uint32_t i;

    vqp_dev_query(dev, &attr);
    assert_int_equal(vqp_dev_cq_create(dev, 100, &cq[0], &dv[0]), UCS_OK);
    assert_int_equal(vqp_dev_cq_create(dev, 1, &cq[1], &dv[1]), UCS_OK);
    assert_non_null(dv[0].buf);
    assert_non_null(dv[0].dbrec);
    assert_true(is_pow2(dv[0].cqe_cnt));
    assert_true(dv[0].cqe_cnt >= 100);
    assert_int_equal(dv[0].cqe_size, 64);
    assert_int_not_equal(dv[0].cqn, dv[1].cqn);
    /* A new CQ holds only invalid CQEs, owned by hardware. */
    for (i = 0; i < dv[0].cqe_cnt; ++i) {
        cqe = (void *)((char *)dv[0].buf + i * dv[0].cqe_size);
        assert_int_equal(cqe->op_own >> 4, MLX5_CQE_INVALID);
    }

    assert_int_equal(vqp_dev_cq_create(dev, 0, &cq[1], &dv[1]),
                     UCS_ERR_INVALID_PARAM);
    expect_log("CQ of 0 entries requested");
    assert_int_equal(vqp_dev_cq_create(dev, attr.max_cqe + 1, &cq[1], &dv[1]),
                     UCS_ERR_INVALID_PARAM);
    expect_log("the device allows 1..");
    assert_int_equal(vqp_dev_cq_create(dev, 4, &cq[1], NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL device or output argument");

    assert_int_equal(vqp_dev_cq_destroy(cq[0]), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq[1]), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(NULL), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_srq(void **state)
{
    vqp_dev_t *dev = open_sw();
    struct mlx5dv_srq dv;
    vqp_dev_attr_t attr;
    vqp_dev_srq_t *srq;

    vqp_dev_query(dev, &attr);
    assert_int_equal(vqp_dev_srq_create(dev, 32, 2, &srq, &dv), UCS_OK);
    assert_non_null(dv.buf);
    assert_non_null(dv.dbrec);
    /* next-segment header plus two data segments, a power of two */
    assert_true(is_pow2(dv.stride));
    assert_true(dv.stride >= 16 * 3);
    assert_true(dv.comp_mask & MLX5DV_SRQ_MASK_SRQN);
    assert_true(dv.tail >= 31);
    assert_int_equal(vqp_dev_srq_destroy(srq), UCS_OK);

    assert_int_equal(vqp_dev_srq_create(dev, 0, 1, &srq, &dv),
                     UCS_ERR_INVALID_PARAM);
    expect_log("SRQ of 0 WQEs requested");
    assert_int_equal(vqp_dev_srq_create(dev, attr.max_srq_wr + 1, 1, &srq, &dv),
                     UCS_ERR_INVALID_PARAM);
    expect_log("SRQ of");
    assert_int_equal(vqp_dev_srq_create(dev, 8, 0, &srq, &dv),
                     UCS_ERR_INVALID_PARAM);
    expect_log("SRQ with 0 SGEs requested");
    assert_int_equal(vqp_dev_srq_create(dev, 8, attr.max_sge + 1, &srq, &dv),
                     UCS_ERR_INVALID_PARAM);
    expect_log("SGEs requested");
    assert_int_equal(vqp_dev_srq_create(NULL, 8, 1, &srq, &dv),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL device or output argument");
    assert_int_equal(vqp_dev_srq_destroy(NULL), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_qp(void **state)
{
    vqp_dev_t *dev         = open_sw();
    vqp_dev_qp_init_t init = {};
    struct mlx5dv_qp dv[2];
    struct mlx5dv_srq dv_srq;
    struct mlx5dv_cq dv_cq;
    vqp_dev_qp_caps_t caps[2];
    vqp_dev_srq_t *srq;
    vqp_dev_qp_t *qp[2];
    vqp_dev_cq_t *cq;
    vqp_dev_attr_t attr;

    vqp_dev_query(dev, &attr);
    assert_int_equal(vqp_dev_cq_create(dev, 64, &cq, &dv_cq), UCS_OK);
    assert_int_equal(vqp_dev_srq_create(dev, 64, 1, &srq, &dv_srq), UCS_OK);

    /* Own receive queue. */
    init.send_cq      = cq;
    init.recv_cq      = cq;
    init.max_send_wr  = 20;
    init.max_send_sge = 1;
    init.max_recv_wr  = 10;
    init.max_recv_sge = 1;
    init.max_inline   = (attr.max_inline < 64) ? attr.max_inline : 64;
    assert_int_equal(vqp_dev_qp_create(dev, &init, &qp[0], &dv[0], &caps[0]),
                     UCS_OK);
    assert_non_null(dv[0].sq.buf);
    assert_true(is_pow2(dv[0].sq.wqe_cnt));
    assert_true(dv[0].sq.wqe_cnt >= 20);
    assert_int_equal(dv[0].sq.stride, 64);
    assert_non_null(dv[0].rq.buf);
    assert_true(dv[0].rq.wqe_cnt >= 10);
    assert_true(is_pow2(dv[0].rq.stride));
    assert_non_null(dv[0].dbrec);
    assert_non_null(dv[0].bf.reg);
    assert_true(dv[0].bf.size > 0);
    assert_true(caps[0].qpn <= 0xffffff);
    assert_int_equal(caps[0].max_inline, init.max_inline);
    assert_true(caps[0].max_send_wr >= 20);
    assert_true(caps[0].max_recv_wr >= 10);
    assert_int_equal(vqp_dev_qp_state(qp[0]), IBV_QPS_RESET);
    assert_int_equal(vqp_dev_qp_udp_sport(qp[0]), 0);

    /* On the SRQ: no RQ of its own. */
    init.srq          = srq;
    init.max_recv_wr  = 0;
    init.max_recv_sge = 0;
    assert_int_equal(vqp_dev_qp_create(dev, &init, &qp[1], &dv[1], &caps[1]),
                     UCS_OK);
    assert_int_not_equal(caps[0].qpn, caps[1].qpn);
    assert_int_equal(caps[1].max_recv_wr, 0);

    /* CQ and SRQ cannot go while QPs use them, nor the device. */
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_ERR_BUSY);
    expect_log("is still used by 2 QPs");
    assert_int_equal(vqp_dev_srq_destroy(srq), UCS_ERR_BUSY);
    expect_log("is still used by 1 QPs");
    assert_int_equal(vqp_dev_close(dev), UCS_ERR_BUSY);
    expect_log("4 MRs/CQs/SRQs/QPs/AHs are still alive");

    assert_int_equal(vqp_dev_qp_destroy(qp[1]), UCS_OK);
    assert_int_equal(vqp_dev_srq_destroy(srq), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_ERR_BUSY);
    expect_log("is still used by 1 QPs");
    assert_int_equal(vqp_dev_qp_destroy(qp[0]), UCS_OK);
    assert_int_equal(vqp_dev_qp_destroy(NULL), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_qp_errors(void **state)
{
    vqp_dev_t *dev = open_sw(), *other = open_sw();
    vqp_dev_qp_init_t init = {}, bad;
    struct mlx5dv_srq dv_srq;
    struct mlx5dv_cq dv_cq;
    vqp_dev_qp_caps_t caps;
    vqp_dev_cq_t *cq, *other_cq;
    struct mlx5dv_qp dv;
    vqp_dev_srq_t *srq;
    vqp_dev_attr_t attr;
    vqp_dev_qp_t *qp;

    vqp_dev_query(dev, &attr);
    assert_int_equal(vqp_dev_cq_create(dev, 64, &cq, &dv_cq), UCS_OK);
    assert_int_equal(vqp_dev_cq_create(other, 64, &other_cq, &dv_cq), UCS_OK);
    assert_int_equal(vqp_dev_srq_create(dev, 64, 1, &srq, &dv_srq), UCS_OK);
    init.send_cq      = cq;
    init.recv_cq      = cq;
    init.max_send_wr  = 8;
    init.max_send_sge = 1;
    init.max_recv_wr  = 8;
    init.max_recv_sge = 1;

    bad         = init;
    bad.send_cq = NULL;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("needs a send CQ and a receive CQ");

    bad         = init;
    bad.recv_cq = other_cq;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("belong to another device");

    bad             = init;
    bad.max_send_wr = 0;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("QP with 0 send WQEs requested");
    bad.max_send_wr = attr.max_qp_wr + 1;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("send WQEs requested");

    bad              = init;
    bad.max_send_sge = attr.max_sge + 1;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("send SGEs requested");

    bad            = init;
    bad.max_inline = attr.max_inline + 1;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("inline bytes requested");

    bad     = init;
    bad.srq = srq; /* with its own RQ sizes still set */
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("a QP on an SRQ has no receive queue of its own");

    bad              = init;
    bad.max_recv_sge = 0;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("QP receive queue of 8 WQEs x 0 SGEs is invalid");
    bad.max_recv_sge = attr.max_sge + 1;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("is invalid");
    bad.max_recv_sge = 1;
    bad.max_recv_wr  = attr.max_qp_wr + 1;
    assert_int_equal(vqp_dev_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("is invalid");

    assert_int_equal(vqp_dev_qp_create(dev, NULL, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL device, attributes or output argument");
    assert_int_equal(vqp_dev_qp_create(dev, &init, &qp, &dv, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL device, attributes or output argument");

    /* Nothing was created by any of the failures. */
    assert_int_equal(vqp_dev_srq_destroy(srq), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(other_cq), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
    assert_int_equal(vqp_dev_close(other), UCS_OK);
}

/* Failures inside the software device reach the caller with its status
 * and log line, and leave nothing half-created behind. */
static void test_sw_failures_propagate(void **state)
{
    enum { MAX_TRY = 32768 }; /* above every table of the device */
    static vqp_dev_srq_t *srqs[MAX_TRY];
    static vqp_dev_cq_t *cqs[MAX_TRY];
    static vqp_dev_mr_t *mrs[MAX_TRY];
    struct mlx5dv_srq dv_srq;
    struct mlx5dv_cq dv_cq;
    vqp_dev_t *dev = NULL;
    uint32_t lkey, rkey;
    ucs_status_t status;
    unsigned n, i;
    char buf[64];

    setenv("VQP_SW_FAULTS", "no-such-fault", 1);
    assert_int_equal(vqp_dev_open(VQP_DEV_SW_NAME, NULL, &dev),
                     UCS_ERR_INVALID_PARAM);
    expect_log("VQP_SW_FAULTS");
    assert_null(dev);
    unsetenv("VQP_SW_FAULTS");

    /* Exhaust each table of the device: the first refusal is reported. */
    dev = open_sw();
    for (n = 0; n < MAX_TRY; ++n) {
        status = vqp_dev_srq_create(dev, 1, 1, &srqs[n], &dv_srq);
        if (status != UCS_OK) {
            break;
        }
    }
    assert_true((n > 0) && (n < MAX_TRY));
    assert_true(test_log_last[0] != '\0');
    test_log_last[0] = '\0';
    for (i = 0; i < n; ++i) {
        assert_int_equal(vqp_dev_srq_destroy(srqs[i]), UCS_OK);
    }

    for (n = 0; n < MAX_TRY; ++n) {
        status = vqp_dev_cq_create(dev, 1, &cqs[n], &dv_cq);
        if (status != UCS_OK) {
            break;
        }
    }
    assert_true((n > 0) && (n < MAX_TRY));
    assert_true(test_log_last[0] != '\0');
    test_log_last[0] = '\0';
    for (i = 0; i < n; ++i) {
        assert_int_equal(vqp_dev_cq_destroy(cqs[i]), UCS_OK);
    }

    for (n = 0; n < MAX_TRY; ++n) {
        status = vqp_dev_mr_reg(dev, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE,
                                &mrs[n], &lkey, &rkey);
        if (status != UCS_OK) {
            break;
        }
    }
    assert_true((n > 0) && (n < MAX_TRY));
    assert_true(test_log_last[0] != '\0');
    test_log_last[0] = '\0';
    for (i = 0; i < n; ++i) {
        assert_int_equal(vqp_dev_mr_dereg(mrs[i]), UCS_OK);
    }

    /* Every object was accounted exactly once: the device closes. */
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

/* ------------------------------------------------------------ connection */

/* @a from writes @a len bytes of its buffer into @a to's buffer; checks the
 * CQE and the data. */
static void check_write(endpoint_t *from, endpoint_t *to, uint32_t len,
                        uint8_t seed)
{
    vqp_dev_t *devs[2]     = {from->dev, to->dev};
    struct mlx5_cqe64 *cqe = NULL;
    uint32_t i;

    for (i = 0; i < len; ++i) {
        from->buf[i] = (char)(seed + i * 13);
    }
    memset(to->buf, 0, len);
    dev_wqe_post_write(&from->dv_qp, from->caps.qpn, from->sq_pi, from->buf,
                       from->lkey, to->buf, to->rkey, len);
    assert_int_equal(
        dev_wqe_poll(devs, 2, &from->dv_cq, from->cq_ci++, TIMEOUT, &cqe),
        MLX5_CQE_REQ);
    assert_int_equal(be32toh(cqe->sop_drop_qpn) & 0xffffff, from->caps.qpn);
    assert_int_equal(be16toh(cqe->wqe_counter), from->sq_pi);
    ++from->sq_pi;
    assert_memory_equal(from->buf, to->buf, len);
}

static void test_connect_two_instances(void **state)
{
    vqp_dev_connect_params_t params;
    vqp_dev_qp_addr_t addr_a, addr_b;
    endpoint_t a, b;

    assert_int_equal(ep_init(&a, open_sw()), 0);
    assert_int_equal(ep_init(&b, open_sw()), 0);
    ep_addr(&a, &addr_a);
    ep_addr(&b, &addr_b);
    assert_int_not_equal(addr_a.dev.sw.instance, addr_b.dev.sw.instance);

    vqp_dev_connect_params_default(&params);
    params.udp_sport_index = 3; /* no UDP on the software device: ignored */
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &params), UCS_OK);
    assert_int_equal(vqp_dev_qp_connect(b.qp, &addr_a, NULL), UCS_OK);
    assert_int_equal(vqp_dev_qp_state(a.qp), IBV_QPS_RTS);
    assert_int_equal(vqp_dev_qp_state(b.qp), IBV_QPS_RTS);
    assert_int_equal(vqp_dev_qp_udp_sport(a.qp), 0);

    check_write(&a, &b, 4096, 1);
    check_write(&b, &a, 1000, 2);
    check_write(&a, &b, BUF_LEN, 3);

    assert_int_equal(ep_cleanup(&a), 0);
    assert_int_equal(ep_cleanup(&b), 0);
}

/* The data path's doorbell reaches the software device: with
 * VQP_SW_EXEC=doorbell the QP's dv carries the doorbell hook, and a WRITE
 * posted through vqp_mlx5 has landed, with its CQE, before any progress
 * call. By default (progress) there is no hook (the BlueFlame register is
 * used as before) and the WRITE waits for progress. */
static void test_doorbell_exec(void **state)
{
    static const char *modes[] = {"doorbell", NULL};
    vqp_dev_qp_init_t init     = {};
    vqp_dev_qp_addr_t addr_a, addr_b;
    vqp_dev_t *devs[2];
    struct mlx5_cqe64 *cqe;
    vqp_mlx5_txwq_t wq;
    vqp_mlx5_cq_t cq;
    vqp_mlx5_sge_t sge;
    uint32_t toggle = 0;
    endpoint_t a, b;
    unsigned m, i;
    int hook;

    for (m = 0; m < 2; ++m) {
        hook = (modes[m] != NULL);
        if (hook) {
            setenv("VQP_SW_EXEC", modes[m], 1);
        } else {
            unsetenv("VQP_SW_EXEC");
        }
        assert_int_equal(ep_init(&a, open_sw()), 0);
        assert_int_equal(ep_init(&b, open_sw()), 0);
        setenv("VQP_SW_EXEC", "progress", 1); /* the harness's */
        /* The data path wants room for two of the largest WQEs. */
        assert_int_equal(vqp_dev_qp_destroy(a.qp), UCS_OK);
        init.send_cq      = a.cq;
        init.recv_cq      = a.cq;
        init.max_send_wr  = 64;
        init.max_send_sge = 1;
        assert_int_equal(
            vqp_dev_qp_create(a.dev, &init, &a.qp, &a.dv_qp, &a.caps), UCS_OK);
        ep_addr(&a, &addr_a);
        ep_addr(&b, &addr_b);
        assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, NULL), UCS_OK);
        assert_int_equal(vqp_dev_qp_connect(b.qp, &addr_a, NULL), UCS_OK);
        assert_int_equal(!!(a.dv_qp.comp_mask & VQP_MLX5_DV_QP_MASK_DB_HOOK),
                         hook);
        assert_int_equal(vqp_mlx5_txwq_init(&wq, &a.dv_qp, a.caps.qpn, 0, 1,
                                            VQP_MLX5_DB_BF, &toggle),
                         UCS_OK);
        assert_int_equal(wq.db_mode, hook ? VQP_MLX5_DB_HOOK : VQP_MLX5_DB_BF);
        assert_int_equal(vqp_mlx5_cq_init(&cq, &a.dv_cq), UCS_OK);

        for (i = 0; i < 512; ++i) {
            a.buf[i] = (char)(i * 7 + m);
        }
        memset(b.buf, 0, 512);
        sge.addr   = (uintptr_t)a.buf;
        sge.length = 512;
        sge.lkey   = a.lkey;
        assert_int_equal(vqp_mlx5_post_write(&wq, &sge, 1, (uintptr_t)b.buf,
                                             b.rkey, VQP_MLX5_SIGNALED),
                         0);
        cqe = vqp_mlx5_cq_poll(&cq);
        if (hook) {
            assert_non_null(cqe);
            assert_int_equal(vqp_mlx5_cqe_status(cqe), UCS_OK);
            assert_memory_equal(a.buf, b.buf, 512);
        } else {
            assert_null(cqe);
            assert_int_equal(b.buf[0], 0);
            devs[0] = a.dev;
            devs[1] = b.dev;
            assert_int_equal(dev_wqe_poll(devs, 2, &a.dv_cq, 0, TIMEOUT, &cqe),
                             MLX5_CQE_REQ);
            assert_memory_equal(a.buf, b.buf, 512);
        }
        assert_int_equal(ep_cleanup(&a), 0);
        assert_int_equal(ep_cleanup(&b), 0);
    }
}

/* The event calls reach the software device: a CQ armed through
 * vqp_dev_cq_arm passes its strict doorbell check, a CQE past the armed
 * index makes the device busy, re-arming at the new index settles it, and
 * a one-sided write wakes nobody. */
static void test_events(void **state)
{
    vqp_dev_qp_addr_t addr_a, addr_b;
    struct pollfd pfd;
    endpoint_t a, b;
    unsigned logs = test_log_count;
    vqp_dev_attr_t attr;
    int fd, fd2;

    assert_int_equal(ep_init(&a, open_sw()), 0);
    assert_int_equal(ep_init(&b, open_sw()), 0);
    vqp_dev_query(b.dev, &attr);
    assert_true(attr.comp_events);
    assert_true(attr.qp_db_private); /* a BlueFlame buffer per QP */
    ep_addr(&a, &addr_a);
    ep_addr(&b, &addr_b);
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, NULL), UCS_OK);
    assert_int_equal(vqp_dev_qp_connect(b.qp, &addr_a, NULL), UCS_OK);

    assert_int_equal(vqp_dev_event_fd(b.dev, &fd), UCS_OK);
    assert_int_equal(vqp_dev_event_fd(b.dev, &fd2), UCS_OK);
    assert_int_equal(fd, fd2);
    assert_int_equal(vqp_dev_event_arm(b.dev), UCS_OK);
    assert_int_equal(vqp_dev_cq_arm(b.cq, b.cq_ci, 0), UCS_OK);
    assert_int_equal(vqp_dev_event_arm(b.dev), UCS_OK);

    check_write(&a, &b, 100, 4); /* one-sided: B sleeps on */
    pfd.fd     = fd;
    pfd.events = POLLIN;
    assert_int_equal(poll(&pfd, 1, 100), 0);
    assert_int_equal(vqp_dev_event_arm(b.dev), UCS_OK);

    check_write(&b, &a, 100, 5); /* B's own CQE, past the armed index */
    assert_int_equal(vqp_dev_event_arm(b.dev), UCS_ERR_BUSY);
    assert_int_equal(vqp_dev_cq_arm(b.cq, b.cq_ci, 1), UCS_OK);
    assert_int_equal(vqp_dev_event_arm(b.dev), UCS_OK);
    assert_int_equal(test_log_count, logs); /* no error on the way */

    assert_int_equal(ep_cleanup(&a), 0);
    assert_int_equal(ep_cleanup(&b), 0);
}

static void test_set_error_flushes(void **state)
{
    vqp_dev_qp_addr_t addr_a, addr_b;
    vqp_dev_t *devs[2];
    struct mlx5_cqe64 *cqe = NULL;
    endpoint_t a, b;

    assert_int_equal(ep_init(&a, open_sw()), 0);
    assert_int_equal(ep_init(&b, open_sw()), 0);
    devs[0] = a.dev;
    devs[1] = b.dev;
    ep_addr(&a, &addr_a);
    ep_addr(&b, &addr_b);
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, NULL), UCS_OK);
    assert_int_equal(vqp_dev_qp_connect(b.qp, &addr_a, NULL), UCS_OK);

    assert_int_equal(vqp_dev_qp_set_error(a.qp), UCS_OK);
    assert_int_equal(vqp_dev_qp_state(a.qp), IBV_QPS_ERR);
    /* A WQE posted in ERROR completes with a flush error, data untouched. */
    memset(b.buf, 0x77, 64);
    dev_wqe_post_write(&a.dv_qp, a.caps.qpn, a.sq_pi, a.buf, a.lkey, b.buf,
                       b.rkey, 64);
    assert_int_equal(dev_wqe_poll(devs, 2, &a.dv_cq, a.cq_ci++, TIMEOUT, &cqe),
                     MLX5_CQE_REQ_ERR);
    assert_int_equal(((struct mlx5_err_cqe *)cqe)->syndrome,
                     MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal((uint8_t)b.buf[0], 0x77);

    /* Connecting needs RESET: from ERROR it is an invalid transition. */
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("is in state ERROR: connecting needs RESET");

    /* After a reset (empty rings: indices restart, the CQ goes on) the QP
     * connects again and works. */
    assert_int_equal(vqp_dev_qp_reset(a.qp), UCS_OK);
    a.sq_pi = 0;
    assert_int_equal(vqp_dev_qp_state(a.qp), IBV_QPS_RESET);
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, NULL), UCS_OK);
    check_write(&a, &b, 512, 4);

    assert_int_equal(ep_cleanup(&a), 0);
    assert_int_equal(ep_cleanup(&b), 0);
}

static void test_connect_errors(void **state)
{
    vqp_dev_connect_params_t params, bad;
    vqp_dev_qp_addr_t addr_a, addr_b, remote;
    endpoint_t a, b;
    pid_t child;
    int status;

    assert_int_equal(ep_init(&a, open_sw()), 0);
    assert_int_equal(ep_init(&b, open_sw()), 0);
    ep_addr(&a, &addr_a);
    ep_addr(&b, &addr_b);
    vqp_dev_connect_params_default(&params);

    /* Unreachable peers: another kind of device, a process that is gone. */
    memset(&remote, 0, sizeof(remote));
    remote.dev.type   = VQP_DEV_ADDR_IB;
    remote.dev.ib.lid = 7;
    remote.qpn        = 0x100;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &remote, &params),
                     UCS_ERR_UNREACHABLE);
    expect_log("cannot reach remote QP 0x100");
    remote.dev.type = VQP_DEV_ADDR_ROCE;
    memset(&remote.dev.roce.gid, 0x11, sizeof(remote.dev.roce.gid));
    assert_int_equal(vqp_dev_qp_connect(a.qp, &remote, &params),
                     UCS_ERR_UNREACHABLE);
    expect_log("cannot reach");

    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        _exit(0);
    }
    assert_int_equal(waitpid(child, &status, 0), child);
    /* A peer process that ended failed, it is no wrong address: said at
     * diag level (UCX's level for failures of peers), not as an error. */
    remote            = addr_b;
    remote.dev.sw.pid = child;
    test_debug_start();
    assert_int_equal(vqp_dev_qp_connect(a.qp, &remote, &params),
                     UCS_ERR_UNREACHABLE);
    test_debug_stop();
    expect_debug_consume("its process");
    assert_string_equal(test_log_last, "");
    assert_int_equal(vqp_dev_qp_state(a.qp), IBV_QPS_RESET);

    /* A live process without that device instance: the software device
     * finds no segment to attach to. */
    remote = addr_b;
    remote.dev.sw.instance += 1000;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &remote, &params),
                     UCS_ERR_UNREACHABLE);
    expect_log("not found");
    assert_int_equal(vqp_dev_qp_state(a.qp), IBV_QPS_RESET);

    remote     = addr_b;
    remote.qpn = 0x1000000;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &remote, &params),
                     UCS_ERR_INVALID_PARAM);
    expect_log("remote QPN 0x1000000 is not an RC QP number");
    remote.qpn = 1;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &remote, &params),
                     UCS_ERR_INVALID_PARAM);
    expect_log("remote QPN 0x1 is not an RC QP number (2..0xffffff)");

    /* Parameters out of range. */
    bad               = params;
    bad.min_rnr_timer = 32;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("min_rnr_timer 32");
    bad           = params;
    bad.retry_cnt = 8;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("retry_cnt 8");
    bad           = params;
    bad.rnr_retry = 9;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("rnr_retry 9");
    bad         = params;
    bad.timeout = 40;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("timeout 40");
    bad        = params;
    bad.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("has non-remote flags");
    bad          = params;
    bad.path_mtu = 1000;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("path MTU 1000");
    bad          = params;
    bad.path_mtu = 8192;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("path MTU 8192");
    bad               = params;
    bad.max_rd_atomic = 255;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("max_rd_atomic 255");
    bad                 = params;
    bad.udp_sport_index = -2;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log("udp_sport_index -2");
    assert_int_equal(vqp_dev_qp_connect(a.qp, NULL, &params),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL remote address");
    assert_int_equal(vqp_dev_qp_connect(NULL, &addr_b, &params),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL QP");
    assert_int_equal(vqp_dev_qp_set_error(NULL), UCS_ERR_INVALID_PARAM);
    expect_log("NULL QP");
    assert_int_equal(vqp_dev_qp_reset(NULL), UCS_ERR_INVALID_PARAM);
    expect_log("NULL QP");

    /* None of that moved the QP; now connect, and connecting twice fails. */
    assert_int_equal(vqp_dev_qp_state(a.qp), IBV_QPS_RESET);
    bad          = params;
    bad.path_mtu = 1024;
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &bad), UCS_OK);
    assert_int_equal(vqp_dev_qp_connect(a.qp, &addr_b, &params),
                     UCS_ERR_INVALID_PARAM);
    expect_log("is in state RTS: connecting needs RESET");
    assert_int_equal(vqp_dev_qp_state(a.qp), IBV_QPS_RTS);

    assert_int_equal(ep_cleanup(&a), 0);
    assert_int_equal(ep_cleanup(&b), 0);
}

/* ------------------------------------------------------------ two processes */

/* What each process sends the other: its QP address and its buffer. */
typedef struct fork_msg {
    uint8_t qp_addr[VQP_DEV_QP_ADDR_PACKED_MAX];
    uint32_t qp_addr_len;
    uint64_t buf;
    uint32_t rkey;
} fork_msg_t;

/* Reads exactly @a len bytes, progressing @a dev while waiting: the peer's
 * operations may need this side's engine. Gives up after TIMEOUT. */
static int read_full(int fd, void *buf, size_t len, vqp_dev_t *dev)
{
    double deadline = dev_wqe_now() + TIMEOUT;
    struct pollfd pfd;
    ssize_t n;

    while (len > 0) {
        if (dev != NULL) {
            vqp_dev_progress(dev);
        }
        pfd.fd     = fd;
        pfd.events = POLLIN;
        if (poll(&pfd, 1, 0) == 0) {
            if (dev_wqe_now() > deadline) {
                return -1;
            }
            sched_yield();
            continue;
        }
        n = read(fd, buf, len);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        buf = (char *)buf + n;
        len -= n;
    }
    return 0;
}

/* Forked code cannot use cmocka asserts: say which step failed and why. */
#define FORK_CHECK(_cond, _what)                                  \
    do {                                                          \
        if (!(_cond)) {                                           \
            fprintf(stderr, "pid %d: %s failed (last log: %s)\n", \
                    (int)getpid(), (_what), test_log_last);       \
            goto out;                                             \
        }                                                         \
    } while (0)

/* One side of the exchange, run by both processes: publish the QP address,
 * connect, confirm, write into the peer, wait for the peer's write, check
 * it. Returns 0 on success. */
static int fork_side(int rfd, int wfd, int first, uint8_t my_seed,
                     uint8_t peer_seed)
{
    struct mlx5_cqe64 *cqe = NULL;
    fork_msg_t msg         = {}, peer;
    vqp_dev_t *dev         = NULL;
    char token             = 't';
    vqp_dev_qp_addr_t me, remote;
    endpoint_t ep;
    int i, opcode, ret = -1;
    size_t len;

    /* Devices are opened one after the other: the software device's
     * stale-segment cleanup at open can remove a peer's segment that is
     * being created at the same moment (reported to the src/sw owner). */
    if (!first && (read_full(rfd, &peer, sizeof(peer), NULL) != 0)) {
        fprintf(stderr, "pid %d: receive address failed\n", (int)getpid());
        return -1;
    }
    if ((vqp_dev_open(VQP_DEV_SW_NAME, NULL, &dev) != UCS_OK)) {
        fprintf(stderr, "pid %d: open failed (last log: %s)\n", (int)getpid(),
                test_log_last);
        return -1;
    }
    FORK_CHECK(ep_init(&ep, dev) == 0, "endpoint setup");
    ep_addr(&ep, &me);
    FORK_CHECK(vqp_dev_qp_addr_pack(&me, msg.qp_addr, sizeof(msg.qp_addr),
                                    &len) == UCS_OK,
               "address pack");
    msg.qp_addr_len = len;
    msg.buf         = (uintptr_t)ep.buf;
    msg.rkey        = ep.rkey;
    FORK_CHECK(write(wfd, &msg, sizeof(msg)) == sizeof(msg), "send address");
    FORK_CHECK(!first || (read_full(rfd, &peer, sizeof(peer), dev) == 0),
               "receive address");
    FORK_CHECK(vqp_dev_qp_addr_unpack(peer.qp_addr, peer.qp_addr_len, &remote,
                                      NULL) == UCS_OK,
               "address unpack");
    FORK_CHECK(remote.dev.sw.pid != me.dev.sw.pid, "distinct processes");
    FORK_CHECK(vqp_dev_qp_connect(ep.qp, &remote, NULL) == UCS_OK, "connect");
    /* Both sides in RTS before any write, as a connection protocol would
     * ensure (an RC write to a QP still in RESET is refused). */
    FORK_CHECK((write(wfd, &token, 1) == 1) &&
                   (read_full(rfd, &token, 1, dev) == 0),
               "connect handshake");

    /* The peer's buffer is written from the first half of ours. */
    for (i = 0; i < BUF_LEN / 2; ++i) {
        ep.buf[i] = (char)(my_seed + i);
    }
    dev_wqe_post_write(&ep.dv_qp, ep.caps.qpn, 0, ep.buf, ep.lkey,
                       (char *)(uintptr_t)peer.buf + BUF_LEN / 2, peer.rkey,
                       BUF_LEN / 2);
    opcode = dev_wqe_poll(&dev, 1, &ep.dv_cq, 0, TIMEOUT, &cqe);
    if (opcode == MLX5_CQE_REQ_ERR) {
        fprintf(stderr, "pid %d: write completed with syndrome 0x%x\n",
                (int)getpid(), ((struct mlx5_err_cqe *)cqe)->syndrome);
    }
    FORK_CHECK(opcode == MLX5_CQE_REQ, "RDMA write completion");
    /* Tell the peer its data is in place; wait until ours is. */
    FORK_CHECK((write(wfd, &token, 1) == 1) &&
                   (read_full(rfd, &token, 1, dev) == 0),
               "write handshake");
    for (i = 0; i < BUF_LEN / 2; ++i) {
        FORK_CHECK(ep.buf[BUF_LEN / 2 + i] == (char)(peer_seed + i),
                   "data check");
    }
    /* Keep the process (and its memory) alive until the peer checked too. */
    FORK_CHECK((write(wfd, &token, 1) == 1) &&
                   (read_full(rfd, &token, 1, dev) == 0),
               "final handshake");
    ret = 0;
out:
    if (ep_cleanup(&ep) != 0) {
        ret = -1;
    }
    return ret;
}

static void test_connect_two_processes(void **state)
{
    int to_child[2], to_parent[2], status;
    pid_t child;

    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(to_parent), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        _exit(fork_side(to_child[0], to_parent[1], 1, 0x40, 0x10) ? 1 : 0);
    }
    close(to_child[0]);
    close(to_parent[1]);
    assert_int_equal(fork_side(to_parent[0], to_child[1], 0, 0x10, 0x40), 0);
    close(to_parent[0]);
    close(to_child[1]);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ------------------------------------------------------------ datagrams */

#define UD_QKEY 0x11223344u

/* One UD endpoint: a CQ, a UD QP in RTS and a registered buffer. */
typedef struct ud_ep {
    vqp_dev_t *dev;
    vqp_dev_cq_t *cq;
    struct mlx5dv_cq dv_cq;
    vqp_dev_qp_t *qp;
    struct mlx5dv_qp dv;
    vqp_dev_qp_caps_t caps;
    vqp_dev_mr_t *mr;
    uint32_t lkey, rkey;
    char *buf;
} ud_ep_t;

static void ud_ep_init(ud_ep_t *ep, vqp_dev_t *dev)
{
    vqp_dev_ud_qp_init_t init = {};

    memset(ep, 0, sizeof(*ep));
    ep->dev = dev;
    ep->buf = calloc(1, BUF_LEN);
    assert_non_null(ep->buf);
    assert_int_equal(vqp_dev_mr_reg(dev, ep->buf, BUF_LEN,
                                    IBV_ACCESS_LOCAL_WRITE, &ep->mr, &ep->lkey,
                                    &ep->rkey),
                     UCS_OK);
    assert_int_equal(vqp_dev_cq_create(dev, 64, &ep->cq, &ep->dv_cq), UCS_OK);
    init.send_cq      = ep->cq;
    init.recv_cq      = ep->cq;
    init.max_send_wr  = 16;
    init.max_send_sge = 1;
    init.max_recv_wr  = 8;
    init.max_recv_sge = 1;
    init.max_inline   = 64;
    init.qkey         = UD_QKEY;
    assert_int_equal(
        vqp_dev_ud_qp_create(dev, &init, &ep->qp, &ep->dv, &ep->caps), UCS_OK);
}

static void ud_ep_cleanup(ud_ep_t *ep)
{
    assert_int_equal(vqp_dev_qp_destroy(ep->qp), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(ep->cq), UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(ep->mr), UCS_OK);
    free(ep->buf);
}

static void test_ud_send_recv(void **state)
{
    vqp_dev_t *devs[2]        = {open_sw(), open_sw()};
    static const char msg[12] = "hello, UD!";
    struct mlx5_cqe64 *cqe;
    struct mlx5_wqe_av av;
    vqp_dev_addr_t addr;
    vqp_dev_attr_t attr;
    vqp_dev_ah_t *ah;
    ud_ep_t ep[2];

    vqp_dev_query(devs[0], &attr);
    assert_int_equal(attr.max_ud_msg, 4096);
    ud_ep_init(&ep[0], devs[0]);
    ud_ep_init(&ep[1], devs[1]);
    assert_int_equal(vqp_dev_qp_state(ep[0].qp), IBV_QPS_RTS);
    assert_true(ep[0].caps.qpn <= 0xffffff);
    assert_int_not_equal(ep[0].caps.qpn, 0);
    assert_true(ep[0].caps.max_send_wr >= 16);
    assert_true(ep[0].caps.max_recv_wr >= 8);
    assert_int_equal(ep[0].caps.max_inline, 64);
    assert_int_equal(ep[0].dv.sq.stride, 64);
    assert_non_null(ep[0].dv.rq.buf);

    vqp_dev_address(devs[1], &addr);
    assert_int_equal(vqp_dev_ah_create(devs[0], &addr, &ah, &av), UCS_OK);
    /* The software AV: GRH with the device's GID, QPN/qkey left to the
     * WQE. */
    assert_true(be32toh(av.grh_gid_fl) & (1u << 30));
    assert_int_equal(av.dqp_dct, 0);
    assert_int_equal(av.key.qkey.qkey, 0);

    /* B posts a receive; A sends; B sees GRH room + payload. */
    dev_wqe_post_recv(&ep[1].dv, 0, ep[1].buf, 256, ep[1].lkey);
    dev_wqe_post_ud_send(&ep[0].dv, ep[0].caps.qpn, 0, &av, ep[1].caps.qpn,
                         UD_QKEY, msg, sizeof(msg));
    assert_int_equal(dev_wqe_poll(devs, 2, &ep[0].dv_cq, 0, TIMEOUT, &cqe),
                     MLX5_CQE_REQ);
    assert_int_equal(dev_wqe_poll(devs, 2, &ep[1].dv_cq, 0, TIMEOUT, &cqe),
                     MLX5_CQE_RESP_SEND);
    assert_int_equal(be32toh(cqe->byte_cnt), VQP_DEV_UD_GRH_LEN + sizeof(msg));
    assert_int_equal(be32toh(cqe->flags_rqpn) & 0xffffff, ep[0].caps.qpn);
    assert_memory_equal(ep[1].buf + VQP_DEV_UD_GRH_LEN, msg, sizeof(msg));

    /* A wrong qkey is dropped: the sender completes, nothing arrives. */
    dev_wqe_post_recv(&ep[1].dv, 1, ep[1].buf + 256, 256, ep[1].lkey);
    dev_wqe_post_ud_send(&ep[0].dv, ep[0].caps.qpn, 2, &av, ep[1].caps.qpn,
                         UD_QKEY + 1, msg, sizeof(msg));
    assert_int_equal(dev_wqe_poll(devs, 2, &ep[0].dv_cq, 1, TIMEOUT, &cqe),
                     MLX5_CQE_REQ);
    assert_int_equal(dev_wqe_poll(devs, 2, &ep[1].dv_cq, 1, 0.05, &cqe), -1);

    /* The device stays busy while the AH lives. */
    ud_ep_cleanup(&ep[0]);
    ud_ep_cleanup(&ep[1]);
    assert_int_equal(vqp_dev_close(devs[0]), UCS_ERR_BUSY);
    expect_log("1 MRs/CQs/SRQs/QPs/AHs are still alive");
    assert_int_equal(vqp_dev_ah_destroy(ah), UCS_OK);
    assert_int_equal(vqp_dev_ah_destroy(NULL), UCS_OK);
    assert_int_equal(vqp_dev_close(devs[0]), UCS_OK);
    assert_int_equal(vqp_dev_close(devs[1]), UCS_OK);
}

static void test_ud_errors(void **state)
{
    vqp_dev_t *dev = open_sw(), *other = open_sw();
    vqp_dev_ud_qp_init_t init = {}, bad;
    vqp_dev_qp_addr_t remote;
    struct mlx5dv_cq dv_cq;
    struct mlx5dv_qp dv;
    vqp_dev_qp_caps_t caps;
    struct mlx5_wqe_av av;
    vqp_dev_cq_t *cq, *other_cq;
    vqp_dev_addr_t addr;
    vqp_dev_ah_t *ah;
    vqp_dev_qp_t *qp;
    unsigned logs0 = test_log_count;
    int child;

    assert_int_equal(vqp_dev_cq_create(dev, 16, &cq, &dv_cq), UCS_OK);
    assert_int_equal(vqp_dev_cq_create(other, 16, &other_cq, &dv_cq), UCS_OK);
    init.send_cq      = cq;
    init.recv_cq      = cq;
    init.max_send_wr  = 8;
    init.max_send_sge = 1;
    init.max_recv_wr  = 8;
    init.max_recv_sge = 1;
    init.qkey         = 7;

    assert_int_equal(vqp_dev_ud_qp_create(NULL, &init, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL");
    assert_int_equal(vqp_dev_ud_qp_create(dev, NULL, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL");
    assert_int_equal(vqp_dev_ud_qp_create(dev, &init, &qp, &dv, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL");
    bad      = init;
    bad.qkey = 0x80000000u;
    assert_int_equal(vqp_dev_ud_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("high bit");
    bad             = init;
    bad.max_send_wr = 0;
    assert_int_equal(vqp_dev_ud_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("send WQEs requested");
    bad              = init;
    bad.max_recv_sge = 0;
    assert_int_equal(vqp_dev_ud_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("receive queue");
    bad         = init;
    bad.recv_cq = other_cq;
    assert_int_equal(vqp_dev_ud_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("another device");
    bad         = init;
    bad.send_cq = NULL;
    assert_int_equal(vqp_dev_ud_qp_create(dev, &bad, &qp, &dv, &caps),
                     UCS_ERR_INVALID_PARAM);
    expect_log("send CQ");

    /* A UD QP is never connected. */
    assert_int_equal(vqp_dev_ud_qp_create(dev, &init, &qp, &dv, &caps), UCS_OK);
    vqp_dev_address(other, &remote.dev);
    remote.qpn = 0x400;
    assert_int_equal(vqp_dev_qp_connect(qp, &remote, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("UD QP");
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_ERR_BUSY);
    expect_log("still used");

    /* Address handles. */
    vqp_dev_address(other, &addr);
    assert_int_equal(vqp_dev_ah_create(NULL, &addr, &ah, &av),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL");
    assert_int_equal(vqp_dev_ah_create(dev, NULL, &ah, &av),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL");
    assert_int_equal(vqp_dev_ah_create(dev, &addr, NULL, &av),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL");
    assert_int_equal(vqp_dev_ah_create(dev, &addr, &ah, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL");
    /* Another kind of device. */
    memset(&addr, 0, sizeof(addr));
    addr.type   = VQP_DEV_ADDR_IB;
    addr.ib.lid = 5;
    assert_int_equal(vqp_dev_ah_create(dev, &addr, &ah, &av),
                     UCS_ERR_UNREACHABLE);
    expect_log("unreachable");
    /* A process that is gone. */
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        _exit(0);
    }
    assert_int_equal(waitpid(child, NULL, 0), child);
    vqp_dev_address(other, &addr);
    addr.sw.pid = (uint32_t)child;
    assert_int_equal(vqp_dev_ah_create(dev, &addr, &ah, &av),
                     UCS_ERR_UNREACHABLE);
    expect_log("unreachable");
    assert_int_equal(test_log_count - logs0, 16);

    assert_int_equal(vqp_dev_qp_destroy(qp), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(other_cq), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
    assert_int_equal(vqp_dev_close(other), UCS_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_query_close),
        cmocka_unit_test(test_mr),
        cmocka_unit_test(test_mr_errors),
        cmocka_unit_test(test_mr_unmapped),
        cmocka_unit_test(test_mr_rights),
        cmocka_unit_test(test_cq),
        cmocka_unit_test(test_srq),
        cmocka_unit_test(test_qp),
        cmocka_unit_test(test_qp_errors),
        cmocka_unit_test(test_sw_failures_propagate),
        cmocka_unit_test(test_connect_two_instances),
        cmocka_unit_test(test_doorbell_exec),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_set_error_flushes),
        cmocka_unit_test(test_connect_errors),
        cmocka_unit_test(test_connect_two_processes),
        cmocka_unit_test(test_ud_send_recv),
        cmocka_unit_test(test_ud_errors),
    };
    return cmocka_run_group_tests(tests, test_log_setup, test_log_teardown);
}
