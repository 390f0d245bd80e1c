/*
 * UD sends of the mlx5 data path: every byte of the WQE (ctrl, datagram
 * segment with dqp_dct/qkey over a copied AV, data or inline segments),
 * wrap at the ring end, a full ring, refused arguments, the source QPN and
 * GRH flag of a receive CQE; then the same WQEs driving the software
 * device end to end (datagrams both ways, GRH room, byte count, source QPN,
 * immediate).
 */
#include <config.h>

#include "mlx5_fake.h"

#include <sw/vqp_sw.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <sched.h>

#define DQPN 0xabcdefu
#define QKEY 0x01020304u

typedef struct {
    fake_qp_t *qp;
    vqp_mlx5_txwq_t wq;
    uint32_t bf_toggle;
    struct mlx5_wqe_av av;
} ud_fixture_t;

static uint8_t payload[1024];

static int ud_setup(void **state)
{
    ud_fixture_t *f = calloc(1, sizeof(*f));
    unsigned i;

    for (i = 0; i < sizeof(payload); ++i) {
        payload[i] = (uint8_t)(i * 5 + 3);
    }
    fake_log_start();
    f->qp = fake_qp_new(64, 0, 0);
    assert_int_equal(vqp_mlx5_txwq_init(&f->wq, &f->qp->dv, FAKE_QPN, 256, 1,
                                        VQP_MLX5_DB_BF, &f->bf_toggle),
                     UCS_OK);
    /* An AV as an AH hands it out: the QPN/qkey words left 0, the rest
     * filled with a pattern the WQE must carry unchanged. */
    memset(&f->av, 0, sizeof(f->av));
    f->av.stat_rate_sl = 0x35;
    f->av.fl_mlid      = 0x12;
    f->av.rlid         = htobe16(0x1234);
    f->av.rmac[0]      = 0x02;
    f->av.rmac[5]      = 0x66;
    f->av.tclass       = 0x20;
    f->av.hop_limit    = 64;
    f->av.grh_gid_fl   = htobe32((1u << 30) | 0x54321);
    for (i = 0; i < sizeof(f->av.rgid); ++i) {
        f->av.rgid[i] = (uint8_t)(0xf0 + i);
    }
    *state = f;
    return 0;
}

static int ud_teardown(void **state)
{
    ud_fixture_t *f = *state;

    fake_qp_free(f->qp);
    free(f);
    fake_log_stop();
    return 0;
}

/* Segment @a n (16-byte units) of the WQE at @a index, wrapped. */
static void *seg_at(ud_fixture_t *f, uint16_t index, unsigned n)
{
    size_t off = ((size_t)(index & f->wq.mask) * 4 + n) * 16;
    size_t len = (size_t)(f->wq.mask + 1) * MLX5_SEND_WQE_BB;

    return (char *)f->wq.qstart + off % len;
}

static void check_ctrl(ud_fixture_t *f, uint16_t index, uint8_t opcode,
                       unsigned ds, uint8_t fm_ce_se, __be32 imm)
{
    struct mlx5_wqe_ctrl_seg *ctrl = seg_at(f, index, 0);

    assert_int_equal(be32toh(ctrl->opmod_idx_opcode),
                     ((uint32_t)index << 8) | opcode);
    assert_int_equal(be32toh(ctrl->qpn_ds), (FAKE_QPN << 8) | ds);
    assert_int_equal(ctrl->signature, 0);
    assert_int_equal(ctrl->fm_ce_se, fm_ce_se);
    assert_int_equal(ctrl->imm, imm);
}

/* The datagram segment: the AV copied, dqp_dct and qkey filled. */
static void check_datagram(ud_fixture_t *f, uint16_t index, uint32_t dqpn,
                           uint32_t qkey)
{
    struct mlx5_wqe_av expect = f->av, got;

    memcpy(&got, seg_at(f, index, 1), 16);
    memcpy((char *)&got + 16, seg_at(f, index, 2), 16);
    memcpy((char *)&got + 32, seg_at(f, index, 3), 16);
    expect.dqp_dct       = htobe32(dqpn | MLX5_EXTENDED_UD_AV);
    expect.key.qkey.qkey = htobe32(qkey);
    assert_memory_equal(&got, &expect, sizeof(got));
    assert_int_equal(sizeof(struct mlx5_wqe_datagram_seg), 48);
}

static void check_dseg(ud_fixture_t *f, uint16_t index, unsigned n,
                       const void *addr, uint32_t len, uint32_t lkey)
{
    struct mlx5_wqe_data_seg *d = seg_at(f, index, n);

    assert_int_equal(be32toh(d->byte_count), len);
    assert_int_equal(be32toh(d->lkey), lkey);
    assert_int_equal(be64toh(d->addr), (uintptr_t)addr);
}

static void test_gather(void **state)
{
    ud_fixture_t *f             = *state;
    const vqp_mlx5_sge_t sge[3] = {{(uintptr_t)payload, 100, 0x11},
                                   {(uintptr_t)payload + 100, 0, 0x22},
                                   {(uintptr_t)payload + 200, 300, 0x33}};
    int idx;

    /* Two non-empty SGEs: ctrl + 3 + 2 = ds 6, two BBs. */
    idx = vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, sge, 3,
                                VQP_MLX5_SIGNALED);
    assert_int_equal(idx, 0);
    check_ctrl(f, 0, MLX5_OPCODE_SEND, 6, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_datagram(f, 0, DQPN, QKEY);
    check_dseg(f, 0, 4, payload, 100, 0x11);
    check_dseg(f, 0, 5, payload + 200, 300, 0x33);
    assert_int_equal(f->wq.pi, 2);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 2);
    /* BlueFlame copy of both BBs. */
    assert_memory_equal(f->qp->bf, seg_at(f, 0, 0), 128);

    /* No data at all: ctrl + datagram, one BB; SEND_IMM carries imm. */
    idx = vqp_mlx5_post_ud_send_imm(&f->wq, &f->av, 7, 0x80000000u, NULL, 0,
                                    htobe32(0xcafe), 0);
    assert_int_equal(idx, 2);
    check_ctrl(f, 2, MLX5_OPCODE_SEND_IMM, 4, MLX5_WQE_CTRL_CQ_UPDATE,
               htobe32(0xcafe));
    check_datagram(f, 2, 7, 0x80000000u);
    assert_int_equal(f->wq.pi, 3);
    expect_no_log();
}

static void test_inline(void **state)
{
    ud_fixture_t *f             = *state;
    const vqp_mlx5_sge_t sge[2] = {{(uintptr_t)payload, 10, 0x11},
                                   {(uintptr_t)payload + 10, 30, 0x22}};
    struct mlx5_wqe_inl_data_seg *iseg;
    uint8_t got[40];
    int idx;

    /* 40 bytes inline: 4 + 40 -> 3 units, ds 7, two BBs. */
    idx = vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, sge, 2,
                                VQP_MLX5_INLINE);
    assert_int_equal(idx, 0);
    check_ctrl(f, 0, MLX5_OPCODE_SEND, 7, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_datagram(f, 0, DQPN, QKEY);
    iseg = seg_at(f, 0, 4);
    assert_int_equal(be32toh(iseg->byte_count), 40 | MLX5_INLINE_SEG);
    memcpy(got, iseg + 1, 12);
    memcpy(got + 12, seg_at(f, 0, 5), 16);
    memcpy(got + 28, seg_at(f, 0, 6), 12);
    assert_memory_equal(got, payload, 40);

    /* Above the QP's max_inline (256): pointers instead. */
    const vqp_mlx5_sge_t big = {(uintptr_t)payload, 257, 0x44};

    idx = vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, &big, 1,
                                VQP_MLX5_INLINE);
    assert_int_equal(idx, 2);
    check_ctrl(f, 2, MLX5_OPCODE_SEND, 5, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_dseg(f, 2, 4, payload, 257, 0x44);
    expect_no_log();
}

/* With the largest max_inline the data path allows, the UD limit binds:
 * 940 bytes fill the 63 units of a WQE inline, 941 go by pointer. */
static void test_inline_limit(void **state)
{
    ud_fixture_t *f    = *state;
    fake_qp_t *qp      = fake_qp_new(64, 0, 0);
    vqp_mlx5_sge_t sge = {(uintptr_t)payload, VQP_MLX5_UD_MAX_INLINE, 9};
    struct mlx5_wqe_inl_data_seg *iseg;
    vqp_mlx5_txwq_t wq;
    int idx;

    assert_int_equal(vqp_mlx5_txwq_init(&wq, &qp->dv, FAKE_QPN,
                                        VQP_MLX5_MAX_INLINE, 1,
                                        VQP_MLX5_DB_RECORD, NULL),
                     UCS_OK);
    idx = vqp_mlx5_post_ud_send(&wq, &f->av, DQPN, QKEY, &sge, 1,
                                VQP_MLX5_INLINE);
    assert_int_equal(idx, 0);
    assert_int_equal(
        be32toh(((struct mlx5_wqe_ctrl_seg *)qp->dv.sq.buf)->qpn_ds) & 0x3f,
        VQP_MLX5_MAX_DS);
    iseg = (void *)((char *)qp->dv.sq.buf + 64);
    assert_int_equal(be32toh(iseg->byte_count),
                     VQP_MLX5_UD_MAX_INLINE | MLX5_INLINE_SEG);
    assert_memory_equal(iseg + 1, payload, VQP_MLX5_UD_MAX_INLINE);
    assert_int_equal(wq.pi, 16);
    ++sge.length;
    idx = vqp_mlx5_post_ud_send(&wq, &f->av, DQPN, QKEY, &sge, 1,
                                VQP_MLX5_INLINE);
    assert_int_equal(idx, 16);
    assert_int_equal(
        be32toh(((struct mlx5_wqe_ctrl_seg *)((char *)qp->dv.sq.buf + 16 * 64))
                    ->qpn_ds) &
            0x3f,
        5);
    iseg = (void *)((char *)qp->dv.sq.buf + 17 * 64);
    assert_int_equal(be32toh(iseg->byte_count), VQP_MLX5_UD_MAX_INLINE + 1);
    fake_qp_free(qp);
    expect_no_log();
}

/* A WQE at the last BB: the datagram segment stays in its BB, the data
 * segment wraps to the ring start. */
static void test_wrap(void **state)
{
    ud_fixture_t *f          = *state;
    const vqp_mlx5_sge_t sge = {(uintptr_t)payload, 64, 0x55};
    vqp_mlx5_sge_t inl       = {(uintptr_t)payload, 20, 0};
    struct mlx5_wqe_inl_data_seg *iseg;
    unsigned i;

    for (i = 0; i < 63; ++i) {
        assert_int_equal(vqp_mlx5_post_nop(&f->wq, 0), (int)i);
        vqp_mlx5_txwq_complete(&f->wq, (uint16_t)i);
    }
    assert_int_equal(
        vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, &sge, 1, 0), 63);
    check_ctrl(f, 63, MLX5_OPCODE_SEND, 5, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_datagram(f, 63, DQPN, QKEY);
    assert_ptr_equal(seg_at(f, 63, 4), f->wq.qstart);
    check_dseg(f, 63, 4, payload, 64, 0x55);
    vqp_mlx5_txwq_complete(&f->wq, 63);
    assert_int_equal(f->wq.pi, 65);
    /* Inline data wrapping: at index 127 (BB 63) again. */
    for (i = 65; i < 127; ++i) {
        assert_int_equal(vqp_mlx5_post_nop(&f->wq, 0), (int)i);
        vqp_mlx5_txwq_complete(&f->wq, (uint16_t)i);
    }
    assert_int_equal(vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, &inl, 1,
                                           VQP_MLX5_INLINE),
                     127);
    iseg = seg_at(f, 127, 4);
    assert_ptr_equal(iseg, f->wq.qstart);
    assert_int_equal(be32toh(iseg->byte_count), 20 | MLX5_INLINE_SEG);
    assert_memory_equal(iseg + 1, payload, 12);
    assert_memory_equal(seg_at(f, 127, 5), payload + 12, 8);
    expect_no_log();
}

static void test_ring_full(void **state)
{
    ud_fixture_t *f          = *state;
    const vqp_mlx5_sge_t sge = {(uintptr_t)payload, 8, 0x11};
    uint16_t pi;
    int i, idx;

    /* 2-BB WQEs (ds 5) fill the 64-BB ring in 32 posts. */
    for (i = 0; i < 32; ++i) {
        idx = vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, &sge, 1, 0);
        assert_int_equal(idx, 2 * i);
    }
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 0);
    pi = f->wq.pi;
    assert_int_equal(
        vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, &sge, 1, 0),
        UCS_ERR_NO_RESOURCE);
    /* Nothing written or rung for the refused post. */
    assert_int_equal(f->wq.pi, pi);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), pi);
    /* One completion frees room for exactly one more. */
    vqp_mlx5_txwq_complete(&f->wq, 0);
    assert_int_equal(
        vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, &sge, 1, 0), 64);
    assert_int_equal(
        vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, &sge, 1, 0),
        UCS_ERR_NO_RESOURCE);
    expect_no_log();
}

static void test_refused(void **state)
{
    ud_fixture_t *f           = *state;
    vqp_mlx5_sge_t sge[17]    = {};
    const vqp_mlx5_sge_t huge = {(uintptr_t)payload, 0x80000000u, 1};

    assert_int_equal(
        vqp_mlx5_post_ud_send(&f->wq, &f->av, 0x1000000, QKEY, sge, 1, 0),
        UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "dest QPN 0x1000000");
    assert_int_equal(vqp_mlx5_post_ud_send(&f->wq, NULL, DQPN, QKEY, sge, 1, 0),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "AV (nil)");
    assert_int_equal(
        vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, sge, 17, 0),
        UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "17 SGEs");
    assert_int_equal(
        vqp_mlx5_post_ud_send(&f->wq, &f->av, DQPN, QKEY, &huge, 1, 0),
        UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "at most 2^31 bytes");
    assert_int_equal(f->wq.pi, 0);
    assert_int_equal(VQP_MLX5_UD_MAX_INLINE, 59 * 16 - 4);
}

static void test_cqe_fields(void **state)
{
    struct mlx5_cqe64 cqe;

    memset(&cqe, 0, sizeof(cqe));
    cqe.flags_rqpn = htobe32((1u << 28) | (5u << 24) | 0x123456);
    assert_int_equal(vqp_mlx5_cqe_src_qpn(&cqe), 0x123456);
    assert_true(vqp_mlx5_cqe_has_grh(&cqe));
    cqe.flags_rqpn = htobe32(0x0fabcdef);
    assert_int_equal(vqp_mlx5_cqe_src_qpn(&cqe), 0xabcdef);
    assert_false(vqp_mlx5_cqe_has_grh(&cqe));
}

/* ------------------------------------------ end to end, software device */

#define E2E_BUF  65536
#define E2E_QKEY 0x4242u

typedef struct ud_ep {
    vqp_sw_dev_t *dev;
    vqp_sw_dev_addr_t addr;
    vqp_sw_cq_t *cq_h;
    vqp_sw_qp_t *qp_h;
    vqp_sw_mr_t *mr;
    uint32_t qpn, lkey, rkey;
    uint8_t *buf;
    vqp_mlx5_txwq_t sq;
    uint32_t bf_toggle;
    vqp_mlx5_rxwq_t rq;
    vqp_mlx5_cq_t cq;
} ud_ep_t;

static void ud_ep_open(ud_ep_t *ep)
{
    vqp_sw_qp_init_attr_t attr = {};
    vqp_sw_qp_attr_t qa;
    struct mlx5dv_cq dcq;
    struct mlx5dv_qp dqp;
    static const enum ibv_qp_state path[] = {IBV_QPS_INIT, IBV_QPS_RTR,
                                             IBV_QPS_RTS};
    unsigned i;

    memset(ep, 0, sizeof(*ep));
    ep->buf = aligned_alloc(4096, E2E_BUF);
    memset(ep->buf, 0, E2E_BUF);
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &ep->dev), UCS_OK);
    vqp_sw_dev_address(ep->dev, &ep->addr);
    assert_int_equal(vqp_sw_mr_reg(ep->dev, ep->buf, E2E_BUF,
                                   IBV_ACCESS_LOCAL_WRITE, &ep->mr, &ep->lkey,
                                   &ep->rkey),
                     UCS_OK);
    assert_int_equal(vqp_sw_cq_create(ep->dev, 64, &ep->cq_h, &dcq), UCS_OK);
    assert_int_equal(vqp_mlx5_cq_init(&ep->cq, &dcq), UCS_OK);
    attr.send_cq         = ep->cq_h;
    attr.recv_cq         = ep->cq_h;
    attr.max_send_wr     = 64;
    attr.max_recv_wr     = 16;
    attr.max_recv_sge    = 1;
    attr.max_inline_data = 128;
    assert_int_equal(
        vqp_sw_ud_qp_create(ep->dev, &attr, &ep->qp_h, &dqp, &ep->qpn), UCS_OK);
    for (i = 0; i < 3; ++i) {
        memset(&qa, 0, sizeof(qa));
        qa.qp_state = path[i];
        qa.qkey     = (i == 0) ? E2E_QKEY : 0;
        assert_int_equal(vqp_sw_qp_modify(ep->qp_h, &qa), UCS_OK);
    }
    assert_int_equal(vqp_mlx5_txwq_init(&ep->sq, &dqp, ep->qpn, 128, 1,
                                        VQP_MLX5_DB_BF, &ep->bf_toggle),
                     UCS_OK);
    assert_int_equal(vqp_mlx5_rxwq_init(&ep->rq, &dqp), UCS_OK);
}

static void ud_ep_close(ud_ep_t *ep)
{
    assert_int_equal(vqp_sw_qp_destroy(ep->qp_h), UCS_OK);
    vqp_sw_dev_close(ep->dev);
    free(ep->buf);
}

static struct mlx5_cqe64 *ud_ep_poll(ud_ep_t *eps, ud_ep_t *ep)
{
    struct mlx5_cqe64 *cqe;
    unsigned i;

    for (i = 0; i < 1000000; ++i) {
        vqp_sw_progress(eps[0].dev);
        vqp_sw_progress(eps[1].dev);
        cqe = vqp_mlx5_cq_poll(&ep->cq);
        if (cqe != NULL) {
            vqp_mlx5_cq_update_ci(&ep->cq);
            return cqe;
        }
        sched_yield();
    }
    return NULL;
}

static void test_sw_end_to_end(void **state)
{
    static const uint32_t lens[] = {0, 20, 300, 4096};
    struct mlx5_wqe_av av[2];
    struct mlx5_cqe64 *cqe;
    vqp_mlx5_sge_t sge;
    ud_ep_t ep[2];
    unsigned i, s, r;
    uint16_t pi;
    int inl;

    ud_ep_open(&ep[0]);
    ud_ep_open(&ep[1]);
    vqp_sw_ah_av(&ep[0].addr, &av[0]);
    vqp_sw_ah_av(&ep[1].addr, &av[1]);
    for (i = 0; i < 8; ++i) {
        s   = i % 2; /* both ways */
        r   = !s;
        inl = (lens[i % 4] <= 128);
        memset(ep[r].buf, 0, 8192);
        sge.addr   = (uintptr_t)ep[r].buf;
        sge.length = 8192;
        sge.lkey   = ep[r].lkey;
        pi         = ep[r].rq.head;
        assert_int_equal(vqp_mlx5_rxwq_post(&ep[r].rq, &sge, 1), pi);
        vqp_mlx5_rxwq_ring(&ep[r].rq);

        memset(ep[s].buf + 16384, (int)(0x10 + i), lens[i % 4]);
        sge.addr   = (uintptr_t)ep[s].buf + 16384;
        sge.length = lens[i % 4];
        sge.lkey   = ep[s].lkey;
        if (i & 2) {
            assert_true(vqp_mlx5_post_ud_send_imm(
                            &ep[s].sq, &av[r], ep[r].qpn, E2E_QKEY, &sge, 1,
                            htobe32(0x900 + i),
                            VQP_MLX5_SIGNALED | (inl ? VQP_MLX5_INLINE : 0)) >=
                        0);
        } else {
            assert_true(vqp_mlx5_post_ud_send(
                            &ep[s].sq, &av[r], ep[r].qpn, E2E_QKEY, &sge, 1,
                            VQP_MLX5_SIGNALED | (inl ? VQP_MLX5_INLINE : 0)) >=
                        0);
        }
        cqe = ud_ep_poll(ep, &ep[s]);
        assert_non_null(cqe);
        assert_int_equal(vqp_mlx5_cqe_opcode(cqe), MLX5_CQE_REQ);
        vqp_mlx5_txwq_complete(&ep[s].sq, vqp_mlx5_cqe_wqe_counter(cqe));

        cqe = ud_ep_poll(ep, &ep[r]);
        assert_non_null(cqe);
        assert_int_equal(vqp_mlx5_cqe_opcode(cqe),
                         (i & 2) ? MLX5_CQE_RESP_SEND_IMM : MLX5_CQE_RESP_SEND);
        assert_int_equal(vqp_mlx5_cqe_byte_cnt(cqe), 40 + lens[i % 4]);
        assert_int_equal(vqp_mlx5_cqe_src_qpn(cqe), ep[s].qpn);
        assert_int_equal(vqp_mlx5_cqe_qpn(cqe), ep[r].qpn);
        assert_true(vqp_mlx5_cqe_has_grh(cqe));
        if (i & 2) {
            assert_int_equal(be32toh(vqp_mlx5_cqe_imm(cqe)), 0x900 + i);
        }
        vqp_mlx5_rxwq_complete(&ep[r].rq, vqp_mlx5_cqe_wqe_counter(cqe));
        assert_memory_equal(ep[r].buf + 40, ep[s].buf + 16384, lens[i % 4]);
        /* The GRH's DGID is the receiver's GID, as in the AV. */
        assert_memory_equal(ep[r].buf + 24, av[r].rgid, 16);
    }
    ud_ep_close(&ep[0]);
    ud_ep_close(&ep[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gather, ud_setup, ud_teardown),
        cmocka_unit_test_setup_teardown(test_inline, ud_setup, ud_teardown),
        cmocka_unit_test_setup_teardown(test_inline_limit, ud_setup,
                                        ud_teardown),
        cmocka_unit_test_setup_teardown(test_wrap, ud_setup, ud_teardown),
        cmocka_unit_test_setup_teardown(test_ring_full, ud_setup, ud_teardown),
        cmocka_unit_test_setup_teardown(test_refused, ud_setup, ud_teardown),
        cmocka_unit_test(test_cqe_fields),
        cmocka_unit_test(test_sw_end_to_end),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
