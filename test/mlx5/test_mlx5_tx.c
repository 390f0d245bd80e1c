/*
 * Send-queue tests of the mlx5 data path: WQE bytes of every operation,
 * inline vs pointer data, ring wrap-around, signaling policy, fence bits,
 * room accounting and the four doorbell modes. No device: the SQ is host
 * memory, the BlueFlame register an array and the hook a counter.
 */
#include <config.h>

#include "mlx5_fake.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

typedef struct {
    fake_qp_t *qp;
    vqp_mlx5_txwq_t wq;
    uint32_t bf_toggle; /* its register's next half */
} tx_fixture_t;

static uint8_t payload[1024];

static int tx_setup_n(void **state, uint32_t bbs, unsigned sig_every,
                      vqp_mlx5_db_mode_t mode)
{
    tx_fixture_t *f = calloc(1, sizeof(*f));
    unsigned i;

    for (i = 0; i < sizeof(payload); ++i) {
        payload[i] = (uint8_t)(i * 7 + 1);
    }
    fake_log_start();
    f->qp = fake_qp_new(bbs, 0, 0);
    assert_int_equal(vqp_mlx5_txwq_init(&f->wq, &f->qp->dv, FAKE_QPN, 256,
                                        sig_every, mode, &f->bf_toggle),
                     UCS_OK);
    *state = f;
    return 0;
}

static int tx_setup(void **state)
{
    return tx_setup_n(state, 64, 1, VQP_MLX5_DB_BF);
}

static int tx_teardown(void **state)
{
    tx_fixture_t *f = *state;

    fake_qp_free(f->qp);
    free(f);
    fake_log_stop();
    return 0;
}

static struct mlx5_wqe_ctrl_seg *ctrl_at(tx_fixture_t *f, uint16_t index)
{
    return vqp_mlx5_txwq_bb(&f->wq, index);
}

/* The segment @a n (16-byte units) after the ctrl of WQE @a index, wrapped. */
static void *seg_at(tx_fixture_t *f, uint16_t index, unsigned n)
{
    size_t off = ((size_t)(index & f->wq.mask) * 4 + n) * 16;
    size_t len = (size_t)(f->wq.mask + 1) * MLX5_SEND_WQE_BB;

    return (char *)f->wq.qstart + off % len;
}

static void check_ctrl(tx_fixture_t *f, uint16_t index, uint8_t opcode,
                       unsigned ds, uint8_t fm_ce_se, __be32 imm)
{
    struct mlx5_wqe_ctrl_seg *ctrl = ctrl_at(f, index);

    assert_int_equal(be32toh(ctrl->opmod_idx_opcode),
                     ((uint32_t)index << 8) | opcode);
    assert_int_equal(be32toh(ctrl->qpn_ds), (FAKE_QPN << 8) | ds);
    assert_int_equal(ctrl->signature, 0);
    assert_int_equal(ctrl->fm_ce_se, fm_ce_se);
    assert_int_equal(ctrl->imm, imm);
}

static void check_raddr(void *seg, uint64_t raddr, uint32_t rkey)
{
    struct mlx5_wqe_raddr_seg *r = seg;

    assert_int_equal(be64toh(r->raddr), raddr);
    assert_int_equal(be32toh(r->rkey), rkey);
    assert_int_equal(r->reserved, 0);
}

static void check_dseg(void *seg, const vqp_mlx5_sge_t *sge)
{
    struct mlx5_wqe_data_seg *d = seg;

    assert_int_equal(be32toh(d->byte_count), sge->length);
    assert_int_equal(be32toh(d->lkey), sge->lkey);
    assert_int_equal(be64toh(d->addr), sge->addr);
}

static void test_init_rejects(void **state)
{
    fake_qp_t *qp      = fake_qp_new(64, 0, 0);
    vqp_mlx5_txwq_t wq = {0};
    uint32_t toggle    = 0;

    fake_log_start();

    qp->dv.sq.stride = 128;
    assert_int_equal(vqp_mlx5_txwq_init(&wq, &qp->dv, 1, 0, 1, 0, &toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "need a ring of 64-byte BBs");
    qp->dv.sq.stride  = 64;
    qp->dv.sq.wqe_cnt = 48; /* not a power of two */
    assert_int_equal(vqp_mlx5_txwq_init(&wq, &qp->dv, 1, 0, 1, 0, &toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "48 BBs");
    qp->dv.sq.wqe_cnt = 16; /* cannot hold two of the largest WQEs */
    assert_int_equal(vqp_mlx5_txwq_init(&wq, &qp->dv, 1, 0, 1, 0, &toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "16 BBs");
    qp->dv.sq.wqe_cnt = 64;
    assert_int_equal(
        vqp_mlx5_txwq_init(&wq, &qp->dv, 0x1000000, 0, 1, 0, &toggle),
        UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "qpn 0x1000000");
    assert_int_equal(vqp_mlx5_txwq_init(&wq, &qp->dv, 1,
                                        VQP_MLX5_MAX_INLINE + 1, 1, 0, &toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "max_inline 973");
    assert_int_equal(vqp_mlx5_txwq_init(&wq, &qp->dv, 1, 0, 0, 0, &toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "sig_every 0");
    assert_int_equal(vqp_mlx5_txwq_init(&wq, &qp->dv, 1, 0, 65, 0, &toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "sig_every 65");
    qp->dv.dbrec = NULL;
    assert_int_equal(vqp_mlx5_txwq_init(&wq, &qp->dv, 1, 0, 1, 0, &toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "dbrec (nil)");
    qp->dv.dbrec = qp->dbrec;

    /* Missing BlueFlame buffer or register: fall back, never write past. */
    qp->dv.bf.size = 0;
    assert_int_equal(
        vqp_mlx5_txwq_init(&wq, &qp->dv, 1, 0, 4, VQP_MLX5_DB_BF, &toggle),
        UCS_OK);
    assert_int_equal(wq.db_mode, VQP_MLX5_DB_MMIO);
    qp->dv.bf.reg = NULL;
    assert_int_equal(
        vqp_mlx5_txwq_init(&wq, &qp->dv, 1, 0, 4, VQP_MLX5_DB_BF, &toggle),
        UCS_OK);
    assert_int_equal(wq.db_mode, VQP_MLX5_DB_RECORD);
    assert_int_equal(vqp_mlx5_txwq_avail(&wq), 64);
    expect_no_log();
    fake_qp_free(qp);
    fake_log_stop();
}

/* Everything a post touches fits one cache line. */
static void test_state_size(void **state)
{
    assert_int_equal(sizeof(vqp_mlx5_txwq_t), 64);
}

static void test_write_pointer(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1122334455667788ull, 4096, 0xabcd};
    int idx;

    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0xfeedface0000ull, 0x5678, 0);
    assert_int_equal(idx, 0);
    check_ctrl(f, 0, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_raddr(seg_at(f, 0, 1), 0xfeedface0000ull, 0x5678);
    check_dseg(seg_at(f, 0, 2), &sge);
    assert_int_equal(f->wq.pi, 1);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 1);
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 63);

    /* BlueFlame: the whole BB went to the first half of the register. */
    assert_memory_equal(f->qp->bf, ctrl_at(f, 0), 64);

    /* The next one goes to the other half and returns its own index. */
    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0x1000, 0x5678, 0);
    assert_int_equal(idx, 1);
    assert_memory_equal((char *)f->qp->bf + FAKE_BF_SIZE, ctrl_at(f, 1), 64);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 2);
    assert_int_equal(f->bf_toggle, 0);
}

/* VQP_MLX5_HAS_ROOM (the caller checked room) builds the same WQE as a
 * post that checks room itself. */
static void test_write_has_room(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1122334455667788ull, 4096, 0xabcd};
    char wqe[64];
    int idx;

    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0xfeedface0000ull, 0x5678,
                              VQP_MLX5_SIGNALED);
    assert_int_equal(idx, 0);
    memcpy(wqe, ctrl_at(f, 0), sizeof(wqe));
    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0xfeedface0000ull, 0x5678,
                              VQP_MLX5_SIGNALED | VQP_MLX5_HAS_ROOM);
    assert_int_equal(idx, 1);
    check_ctrl(f, 1, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    /* Only the WQE index in the ctrl segment differs. */
    assert_memory_equal(wqe + 4, (char *)ctrl_at(f, 1) + 4, sizeof(wqe) - 4);
    assert_int_equal(f->wq.pi, 2);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 2);
}

static void test_write_zero_length(void **state)
{
    tx_fixture_t *f        = *state;
    vqp_mlx5_sge_t sges[3] = {{0x1000, 0, 1}, {0x2000, 16, 2}, {0x3000, 0, 3}};
    int idx;

    /* No data at all: ctrl + raddr only. */
    idx = vqp_mlx5_post_write(&f->wq, NULL, 0, 0x4000, 9, 0);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_WRITE, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    idx = vqp_mlx5_post_write(&f->wq, sges, 1, 0x4000, 9, 0);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_WRITE, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);

    /* Zero-length entries vanish: 0 would mean 2 GiB to the device. */
    idx = vqp_mlx5_post_write(&f->wq, sges, 3, 0x4000, 9, 0);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_dseg(seg_at(f, idx, 2), &sges[1]);
}

/* read_rdma gives back what a WRITE / WRITE_IMM / READ was posted with,
 * also in the ring's last BB and after the index passed the ring's size;
 * a WQE without data segment reads as an empty buffer. */
static void test_read_rdma(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1122334455667788ull, 4096, 0xabcd};
    vqp_mlx5_sge_t got;
    uint64_t raddr;
    uint32_t rkey;
    unsigned i;
    __be32 imm;
    int idx[4];

    for (i = 0; i < 62; ++i) {
        vqp_mlx5_txwq_complete(&f->wq, (uint16_t)vqp_mlx5_post_nop(&f->wq, 0));
    }
    idx[0] = vqp_mlx5_post_write(&f->wq, &sge, 1, 0xfeedface0000ull, 0x5678,
                                 VQP_MLX5_HAS_ROOM);
    idx[1] = vqp_mlx5_post_write_imm(&f->wq, &sge, 1, 0xabc0, 0x9a,
                                     htobe32(0xdeadbeef), 0);
    idx[2] = vqp_mlx5_post_read(&f->wq, &sge, 1, 0x777000, 0x42, 0);
    idx[3] = vqp_mlx5_post_write(&f->wq, NULL, 0, 0x4000, 9, 0);
    assert_int_equal(idx[1], 63); /* the ring's last BB */
    assert_int_equal(idx[3], 65); /* past the ring's size */

    vqp_mlx5_txwq_read_rdma(&f->wq, (uint16_t)idx[0], &raddr, &rkey, &got,
                            &imm);
    assert_true(raddr == 0xfeedface0000ull);
    assert_int_equal(rkey, 0x5678);
    assert_true(got.addr == sge.addr);
    assert_int_equal(got.length, sge.length);
    assert_int_equal(got.lkey, sge.lkey);
    assert_int_equal(imm, 0);
    vqp_mlx5_txwq_read_rdma(&f->wq, (uint16_t)idx[1], &raddr, &rkey, &got,
                            &imm);
    assert_true(raddr == 0xabc0);
    assert_int_equal(rkey, 0x9a);
    assert_true(got.addr == sge.addr);
    assert_int_equal(be32toh(imm), 0xdeadbeef);
    vqp_mlx5_txwq_read_rdma(&f->wq, (uint16_t)idx[2], &raddr, &rkey, &got,
                            &imm);
    assert_true(raddr == 0x777000);
    assert_int_equal(rkey, 0x42);
    assert_int_equal(got.length, sge.length);
    assert_int_equal(got.lkey, sge.lkey);
    vqp_mlx5_txwq_read_rdma(&f->wq, (uint16_t)idx[3], &raddr, &rkey, &got,
                            &imm);
    assert_true(raddr == 0x4000);
    assert_int_equal(rkey, 9);
    assert_true(got.addr == 0);
    assert_int_equal(got.length, 0);
    assert_int_equal(got.lkey, 0);
}

static void test_write_imm_send(void **state)
{
    tx_fixture_t *f        = *state;
    vqp_mlx5_sge_t sges[2] = {{0x1000, 100, 7}, {0x9000, 200, 8}};
    __be32 imm             = htobe32(0xdeadbeef);
    int idx;

    idx = vqp_mlx5_post_write_imm(&f->wq, sges, 2, 0x7000, 3, imm, 0);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_WRITE_IMM, 4, MLX5_WQE_CTRL_CQ_UPDATE,
               imm);
    check_raddr(seg_at(f, idx, 1), 0x7000, 3);
    check_dseg(seg_at(f, idx, 2), &sges[0]);
    check_dseg(seg_at(f, idx, 3), &sges[1]);

    idx = vqp_mlx5_post_send(&f->wq, sges, 2, 0);
    check_ctrl(f, idx, MLX5_OPCODE_SEND, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_dseg(seg_at(f, idx, 1), &sges[0]);
    check_dseg(seg_at(f, idx, 2), &sges[1]);

    idx = vqp_mlx5_post_send_imm(&f->wq, sges, 1, imm, VQP_MLX5_SOLICITED);
    check_ctrl(f, idx, MLX5_OPCODE_SEND_IMM, 2,
               MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED, imm);
    check_dseg(seg_at(f, idx, 1), &sges[0]);

    /* An empty SEND is a ctrl segment alone. */
    idx = vqp_mlx5_post_send(&f->wq, NULL, 0, VQP_MLX5_INLINE);
    check_ctrl(f, idx, MLX5_OPCODE_SEND, 1, MLX5_WQE_CTRL_CQ_UPDATE, 0);
}

static void test_multi_bb(void **state)
{
    tx_fixture_t *f = *state;
    vqp_mlx5_sge_t sges[VQP_MLX5_MAX_SGE + 1];
    unsigned i;
    int idx;

    for (i = 0; i <= VQP_MLX5_MAX_SGE; ++i) {
        sges[i] = (vqp_mlx5_sge_t){0x10000 * (i + 1), 64 + i, 100 + i};
    }
    /* 2 + 5 segments = 7 ds = 2 BBs. */
    idx = vqp_mlx5_post_write(&f->wq, sges, 5, 0x1, 2, 0);
    assert_int_equal(idx, 0);
    check_ctrl(f, 0, MLX5_OPCODE_RDMA_WRITE, 7, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    for (i = 0; i < 5; ++i) {
        check_dseg(seg_at(f, 0, 2 + i), &sges[i]);
    }
    assert_int_equal(f->wq.pi, 2);
    assert_int_equal(vqp_mlx5_ctrl_num_bb(ctrl_at(f, 0)), 2);
    assert_memory_equal(f->qp->bf, ctrl_at(f, 0), 128);

    /* The largest gather list: 18 ds = 5 BBs. */
    idx = vqp_mlx5_post_read(&f->wq, sges, VQP_MLX5_MAX_SGE, 0x1, 2, 0);
    assert_int_equal(idx, 2);
    check_ctrl(f, 2, MLX5_OPCODE_RDMA_READ, 18, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_dseg(seg_at(f, 2, 17), &sges[VQP_MLX5_MAX_SGE - 1]);
    assert_int_equal(f->wq.pi, 7);

    /* One more is refused and nothing moves. */
    assert_int_equal(
        vqp_mlx5_post_write(&f->wq, sges, VQP_MLX5_MAX_SGE + 1, 0x1, 2, 0),
        UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "17 SGEs, at most 16");
    assert_int_equal(f->wq.pi, 7);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 7);

    /* A data segment holds 31 bits; a WQE moves at most 2 GiB. */
    sges[0].length = 0x80000000u;
    assert_int_equal(vqp_mlx5_post_write(&f->wq, sges, 1, 0x1, 2, 0),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "message of 2147483648 bytes in 1 SGEs");
    sges[0].length = 0x7fffffffu;
    sges[1].length = 2;
    assert_int_equal(vqp_mlx5_post_read(&f->wq, sges, 2, 0x1, 2, 0),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "message of 2147483649 bytes in 2 SGEs");
    assert_int_equal(f->wq.pi, 7);
    sges[1].length = 1; /* exactly 2 GiB in two pieces */
    idx            = vqp_mlx5_post_read(&f->wq, sges, 2, 0x1, 2, 0);
    assert_int_equal(idx, 7);
    check_dseg(seg_at(f, 7, 2), &sges[0]);
    check_dseg(seg_at(f, 7, 3), &sges[1]);
}

static void test_inline(void **state)
{
    tx_fixture_t *f = *state;
    vqp_mlx5_sge_t sges[3];
    struct mlx5_wqe_inl_data_seg *iseg;
    int idx;

    sges[0] = (vqp_mlx5_sge_t){(uintptr_t)payload, 20, 1};
    sges[1] = (vqp_mlx5_sge_t){(uintptr_t)&payload[100], 0, 1};
    sges[2] = (vqp_mlx5_sge_t){(uintptr_t)&payload[200], 30, 1};

    /* 4 + 20 bytes pad to 2 ds: ctrl + raddr + 2 = 4. */
    idx = vqp_mlx5_post_write(&f->wq, sges, 1, 0x5000, 6, VQP_MLX5_INLINE);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_WRITE, 4, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_raddr(seg_at(f, idx, 1), 0x5000, 6);
    iseg = seg_at(f, idx, 2);
    assert_int_equal(be32toh(iseg->byte_count), 20 | MLX5_INLINE_SEG);
    assert_memory_equal(iseg + 1, payload, 20);

    /* Several SGEs are packed back to back: 4 + 50 bytes = 4 ds. */
    idx = vqp_mlx5_post_send(&f->wq, sges, 3, VQP_MLX5_INLINE);
    check_ctrl(f, idx, MLX5_OPCODE_SEND, 5, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    iseg = seg_at(f, idx, 1);
    assert_int_equal(be32toh(iseg->byte_count), 50 | MLX5_INLINE_SEG);
    assert_memory_equal(iseg + 1, payload, 20);
    assert_memory_equal((char *)(iseg + 1) + 20, &payload[200], 30);
    assert_int_equal(vqp_mlx5_ctrl_num_bb(ctrl_at(f, idx)), 2);

    /* Exactly max_inline (256) still goes inline: 2 + 17 ds. */
    sges[0].length = 256;
    idx = vqp_mlx5_post_write_imm(&f->wq, sges, 1, 0x5000, 6, 0x01020304,
                                  VQP_MLX5_INLINE);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_WRITE_IMM, 19, MLX5_WQE_CTRL_CQ_UPDATE,
               0x01020304);
    iseg = seg_at(f, idx, 2);
    assert_int_equal(be32toh(iseg->byte_count), 256 | MLX5_INLINE_SEG);
    assert_memory_equal(iseg + 1, payload, 256);

    /* One byte more falls back to a pointer, as does no INLINE flag. */
    sges[0].length = 257;
    idx = vqp_mlx5_post_write(&f->wq, sges, 1, 0x5000, 6, VQP_MLX5_INLINE);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_dseg(seg_at(f, idx, 2), &sges[0]);
    sges[0].length = 8;
    idx            = vqp_mlx5_post_send(&f->wq, sges, 1, 0);
    check_ctrl(f, idx, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_dseg(seg_at(f, idx, 1), &sges[0]);

    /* READ never goes inline: the data travels the other way. */
    idx = vqp_mlx5_post_read(&f->wq, sges, 1, 0x5000, 6, VQP_MLX5_INLINE);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_READ, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_dseg(seg_at(f, idx, 2), &sges[0]);
}

static void test_atomics_nop(void **state)
{
    tx_fixture_t *f       = *state;
    vqp_mlx5_sge_t result = {0xaaaa0000, 8, 0x44};
    struct mlx5_wqe_atomic_seg *a;
    uint16_t pi;
    int idx;

    idx = vqp_mlx5_post_atomic_fa(&f->wq, &result, 0xbeef0008, 0x99, 5, 0);
    check_ctrl(f, idx, MLX5_OPCODE_ATOMIC_FA, 4, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    check_raddr(seg_at(f, idx, 1), 0xbeef0008, 0x99);
    a = seg_at(f, idx, 2);
    assert_int_equal(be64toh(a->swap_add), 5);
    assert_int_equal(a->compare, 0);
    check_dseg(seg_at(f, idx, 3), &result);

    idx = vqp_mlx5_post_atomic_cs(&f->wq, &result, 0xbeef0010, 0x99,
                                  0x1111222233334444ull, 0x5555, 0);
    check_ctrl(f, idx, MLX5_OPCODE_ATOMIC_CS, 4, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    a = seg_at(f, idx, 2);
    assert_int_equal(be64toh(a->swap_add), 0x5555);
    assert_int_equal(be64toh(a->compare), 0x1111222233334444ull);
    check_dseg(seg_at(f, idx, 3), &result);

    idx = vqp_mlx5_post_nop(&f->wq, VQP_MLX5_FENCE);
    check_ctrl(f, idx, MLX5_OPCODE_NOP, 1,
               MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE, 0);

    /* The result buffer must be exactly 8 bytes; nothing is written else. */
    pi            = f->wq.pi;
    result.length = 4;
    assert_int_equal(vqp_mlx5_post_atomic_fa(&f->wq, &result, 0, 0, 1, 0),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "must be one 8-byte SGE");
    assert_int_equal(f->wq.pi, pi);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), pi);
}

static void put_be(uint8_t *p, uint64_t v, unsigned bytes)
{
    unsigned i;

    for (i = 0; i < bytes; ++i) {
        p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    }
}

/* The whole WQE at @a index (ds segments, wrapped) equals @a expect. */
static void check_wqe_bytes(tx_fixture_t *f, uint16_t index,
                            const uint8_t *expect, unsigned ds)
{
    unsigned i;

    for (i = 0; i < ds; ++i) {
        assert_memory_equal(seg_at(f, index, i), expect + 16 * i, 16);
    }
}

/* Expected masked atomic WQE: ctrl (signaled), raddr, operands, data seg. */
static unsigned expect_masked(uint8_t *e, uint16_t index, uint8_t opcode,
                              unsigned size, uint64_t raddr, uint32_t rkey,
                              uint64_t swap_add, uint64_t compare,
                              uint64_t swap_mask, uint64_t compare_mask,
                              const vqp_mlx5_sge_t *res, uint8_t fm_ce_se)
{
    int cs      = (opcode == MLX5_OPCODE_ATOMIC_MASKED_CS);
    unsigned ds = (cs && (size == 8)) ? 5 : 4;
    uint8_t *a  = e + 32;

    memset(e, 0, 80);
    e[0] = (size == 8) ? 0x09 : 0x08; /* opmod: extended, log2(size) - 2 */
    put_be(e + 1, index, 2);
    e[3] = opcode;
    put_be(e + 4, ((uint32_t)FAKE_QPN << 8) | ds, 4);
    e[11] = fm_ce_se;
    put_be(e + 16, raddr, 8);
    put_be(e + 24, rkey, 4);
    put_be(a, swap_add, size);
    put_be(a + size, compare, size);
    if (cs) {
        put_be(a + 2 * size, swap_mask, size);
        put_be(a + 3 * size, compare_mask, size);
    }
    put_be(e + 16 * (ds - 1), res->length, 4);
    put_be(e + 16 * (ds - 1) + 4, res->lkey, 4);
    put_be(e + 16 * (ds - 1) + 8, res->addr, 8);
    return ds;
}

static void test_masked_atomics(void **state)
{
    tx_fixture_t *f   = *state;
    vqp_mlx5_sge_t r4 = {0xaaaa0004, 4, 0x45}, r8 = {0xaaaa0008, 8, 0x46};
    static const uint8_t ops[] = {MLX5_OPCODE_ATOMIC_MASKED_CS,
                                  MLX5_OPCODE_ATOMIC_MASKED_FA};
    uint8_t expect[80];
    unsigned size, o, ds;
    uint16_t pi;
    int idx;

    /* Garbage in the ring must be overwritten, reserved bytes zeroed. */
    memset(f->qp->dv.sq.buf, 0xa5, 64 * 64);
    for (o = 0; o < 2; ++o) {
        for (size = 4; size <= 8; size += 4) {
            /* Values wider than the operand are cut to its size. */
            idx = vqp_mlx5_post_masked_atomic(
                &f->wq, ops[o], size, (size == 4) ? &r4 : &r8,
                0xbeef0000 + size, 0x99, 0x1122334455667788ull,
                0x99aabbccddeeff00ull, 0x0123456789abcdefull,
                0xfedcba9876543210ull, 0);
            assert_true(idx >= 0);
            ds = expect_masked(
                expect, (uint16_t)idx, ops[o], size, 0xbeef0000 + size, 0x99,
                (size == 4) ? 0x55667788 : 0x1122334455667788ull,
                (size == 4) ? 0xddeeff00 : 0x99aabbccddeeff00ull,
                (size == 4) ? 0x89abcdef : 0x0123456789abcdefull,
                (size == 4) ? 0x76543210 : 0xfedcba9876543210ull,
                (size == 4) ? &r4 : &r8, MLX5_WQE_CTRL_CQ_UPDATE);
            check_wqe_bytes(f, (uint16_t)idx, expect, ds);
            assert_int_equal(vqp_mlx5_ctrl_num_bb(ctrl_at(f, (uint16_t)idx)),
                             (ds == 5) ? 2 : 1);
            assert_int_equal(f->wq.pi, (uint16_t)(idx + ((ds == 5) ? 2 : 1)));
            assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), f->wq.pi);
        }
    }

    /* Fence and unsignaled flags go through as for other WQEs. */
    f->wq.sig_every = 4;
    f->wq.sig_left  = 4;
    idx =
        vqp_mlx5_post_masked_atomic(&f->wq, MLX5_OPCODE_ATOMIC_MASKED_CS, 4,
                                    &r4, 0x100, 7, 1, 2, 3, 4, VQP_MLX5_FENCE);
    expect_masked(expect, (uint16_t)idx, MLX5_OPCODE_ATOMIC_MASKED_CS, 4, 0x100,
                  7, 1, 2, 3, 4, &r4, MLX5_WQE_CTRL_FENCE);
    check_wqe_bytes(f, (uint16_t)idx, expect, 4);

    /* Refused requests write nothing and ring nothing. */
    pi = f->wq.pi;
    assert_int_equal(vqp_mlx5_post_masked_atomic(&f->wq, MLX5_OPCODE_ATOMIC_CS,
                                                 8, &r8, 0, 0, 0, 0, 0, 0, 0),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "need MASKED_CS or MASKED_FA on 4 or 8");
    assert_int_equal(vqp_mlx5_post_masked_atomic(&f->wq,
                                                 MLX5_OPCODE_ATOMIC_MASKED_FA,
                                                 2, &r4, 0, 0, 0, 0, 0, 0, 0),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "need MASKED_CS or MASKED_FA on 4 or 8");
    assert_int_equal(vqp_mlx5_post_masked_atomic(&f->wq,
                                                 MLX5_OPCODE_ATOMIC_MASKED_FA,
                                                 4, &r8, 0, 0, 0, 0, 0, 0, 0),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "need a 4-byte result");
    assert_int_equal(vqp_mlx5_post_masked_atomic(&f->wq,
                                                 MLX5_OPCODE_ATOMIC_MASKED_CS,
                                                 8, &r4, 0, 0, 0, 0, 0, 0, 0),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "need a 8-byte result");
    assert_int_equal(
        vqp_mlx5_post_masked_atomic(&f->wq, MLX5_OPCODE_ATOMIC_MASKED_CS, 4,
                                    &r4, 0x1002, 0, 0, 0, 0, 0, 0),
        UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "4-byte aligned address");
    assert_int_equal(
        vqp_mlx5_post_masked_atomic(&f->wq, MLX5_OPCODE_ATOMIC_MASKED_FA, 8,
                                    &r8, 0x1004, 0, 0, 0, 0, 0, 0),
        UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "8-byte aligned address");
    assert_int_equal(f->wq.pi, pi);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), pi);
}

/* The 64-bit masked CS takes 2 BBs; its masks segment or its data segment
 * may be the first of the ring. No room: refused, nothing written. */
static void test_masked_atomic_wrap(void **state)
{
    tx_fixture_t *f   = *state;
    vqp_mlx5_sge_t r8 = {0xcccc0008, 8, 0x47};
    uint8_t expect[80];
    unsigned i;
    uint16_t pi;
    int idx;

    for (i = 0; i < 63; ++i) {
        vqp_mlx5_txwq_complete(&f->wq, (uint16_t)vqp_mlx5_post_nop(&f->wq, 0));
    }
    memset(f->qp->dv.sq.buf, 0xa5, 64 * 64);
    idx = vqp_mlx5_post_masked_atomic(&f->wq, MLX5_OPCODE_ATOMIC_MASKED_CS, 8,
                                      &r8, 0x2000, 0x31, 5, 6, 7, 8, 0);
    assert_int_equal(idx, 63);
    expect_masked(expect, 63, MLX5_OPCODE_ATOMIC_MASKED_CS, 8, 0x2000, 0x31, 5,
                  6, 7, 8, &r8, MLX5_WQE_CTRL_CQ_UPDATE);
    check_wqe_bytes(f, 63, expect, 5);
    /* The data segment is the first of the ring. */
    assert_memory_equal(f->qp->dv.sq.buf, expect + 64, 16);
    assert_int_equal(f->wq.pi, 65);
    vqp_mlx5_txwq_complete(&f->wq, (uint16_t)idx);

    /* Fill the ring but one BB: the 2-BB WQE does not fit. */
    for (i = 0; i < 63; ++i) {
        assert_true(vqp_mlx5_post_nop(&f->wq, 0) >= 0);
    }
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 1);
    pi = f->wq.pi;
    assert_int_equal(
        vqp_mlx5_post_masked_atomic(&f->wq, MLX5_OPCODE_ATOMIC_MASKED_CS, 8,
                                    &r8, 0x2000, 0x31, 5, 6, 7, 8, 0),
        UCS_ERR_NO_RESOURCE);
    assert_int_equal(f->wq.pi, pi);
    /* A 1-BB masked atomic still fits. */
    idx = vqp_mlx5_post_masked_atomic(&f->wq, MLX5_OPCODE_ATOMIC_MASKED_FA, 8,
                                      &r8, 0x2000, 0x31, 5, ~0ull, 0, 0, 0);
    expect_masked(expect, (uint16_t)idx, MLX5_OPCODE_ATOMIC_MASKED_FA, 8,
                  0x2000, 0x31, 5, ~0ull, 0, 0, &r8, MLX5_WQE_CTRL_CQ_UPDATE);
    check_wqe_bytes(f, (uint16_t)idx, expect, 4);
}

static void test_fence(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1000, 8, 1};
    int idx;

    idx = vqp_mlx5_post_read(&f->wq, &sge, 1, 0x2000, 2, 0);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_READ, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0x2000, 2, VQP_MLX5_FENCE);
    check_ctrl(f, idx, MLX5_OPCODE_RDMA_WRITE, 3,
               MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE, 0);
    assert_int_equal(ctrl_at(f, idx)->fm_ce_se & 0xe0, 0x80);
}

/* Unsignaled posts with a forced CQE every 4 posts, on request, and when the
 * ring is nearly full. */
static void test_signaling(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1000, 8, 1};
    unsigned i, n;
    int idx, last = -1;

    tx_teardown(state);
    tx_setup_n(state, 64, 4, VQP_MLX5_DB_BF);
    f = *state;

    for (i = 0; i < 8; ++i) {
        idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
        assert_int_equal(ctrl_at(f, idx)->fm_ce_se,
                         ((i % 4) == 3) ? MLX5_WQE_CTRL_CQ_UPDATE : 0);
    }
    /* An explicit request restarts the count. */
    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
    assert_int_equal(ctrl_at(f, idx)->fm_ce_se, 0);
    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, VQP_MLX5_SIGNALED);
    assert_int_equal(ctrl_at(f, idx)->fm_ce_se, MLX5_WQE_CTRL_CQ_UPDATE);
    for (i = 0; i < 3; ++i) {
        idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
        assert_int_equal(ctrl_at(f, idx)->fm_ce_se, 0);
    }
    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
    assert_int_equal(ctrl_at(f, idx)->fm_ce_se, MLX5_WQE_CTRL_CQ_UPDATE);

    /* Fill the ring: every post that leaves less than the largest WQE's
     * room is signaled, so the newest WQE always brings a CQE. */
    n = 0;
    while ((idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0)) >= 0) {
        if (vqp_mlx5_txwq_avail(&f->wq) < VQP_MLX5_MAX_BB) {
            assert_int_equal(ctrl_at(f, idx)->fm_ce_se,
                             MLX5_WQE_CTRL_CQ_UPDATE);
        }
        last = idx;
        ++n;
    }
    assert_int_equal(idx, UCS_ERR_NO_RESOURCE);
    expect_no_log(); /* a full ring is back-pressure, not an error */
    assert_int_equal(n, 64 - 14);
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 0);
    assert_int_equal(ctrl_at(f, last)->fm_ce_se, MLX5_WQE_CTRL_CQ_UPDATE);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 64);

    /* Its CQE frees the whole ring. */
    vqp_mlx5_txwq_complete(&f->wq, (uint16_t)last);
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 64);
    assert_int_equal(f->wq.ci, 64);
}

/* A CQE for a WQE frees exactly up to its end, using its own size. */
static void test_complete_accounting(void **state)
{
    tx_fixture_t *f = *state;
    vqp_mlx5_sge_t sges[5];
    unsigned i;
    int a, b, c;

    for (i = 0; i < 5; ++i) {
        sges[i] = (vqp_mlx5_sge_t){0x1000 * (i + 1), 8, 1};
    }
    a = vqp_mlx5_post_write(&f->wq, sges, 5, 0, 0, 0); /* 2 BBs */
    b = vqp_mlx5_post_nop(&f->wq, 0);                  /* 1 BB */
    c = vqp_mlx5_post_read(&f->wq, sges, 5, 0, 0, 0);  /* 2 BBs */
    assert_int_equal(a, 0);
    assert_int_equal(b, 2);
    assert_int_equal(c, 3);
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 59);
    vqp_mlx5_txwq_complete(&f->wq, (uint16_t)a);
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 61);
    vqp_mlx5_txwq_complete(&f->wq, (uint16_t)c);
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 64);
}

/* WQEs and inline data that run past the ring end continue at its start;
 * the BlueFlame copy follows the wrap. */
static void test_wrap(void **state)
{
    tx_fixture_t *f = *state;
    vqp_mlx5_sge_t sges[5], in;
    struct mlx5_wqe_inl_data_seg *iseg;
    uint8_t expect[128];
    char *start, *last_bb;
    unsigned i;
    int idx;

    for (i = 0; i < 5; ++i) {
        sges[i] = (vqp_mlx5_sge_t){0x1000 * (i + 1), 8 + i, 1 + i};
    }
    /* Advance to the last BB. */
    for (i = 0; i < 63; ++i) {
        idx = vqp_mlx5_post_nop(&f->wq, 0);
        vqp_mlx5_txwq_complete(&f->wq, (uint16_t)idx);
    }
    assert_int_equal(f->wq.pi, 63);

    /* 7 ds: ctrl, raddr, 2 data segs in BB 63; 3 data segs in BB 0. */
    memset(f->qp->dv.sq.buf, 0xa5, 64);
    idx = vqp_mlx5_post_write(&f->wq, sges, 5, 0xabc, 0x11, 0);
    assert_int_equal(idx, 63);
    check_ctrl(f, 63, MLX5_OPCODE_RDMA_WRITE, 7, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    start   = f->qp->dv.sq.buf;
    last_bb = start + 63 * 64;
    check_raddr(last_bb + 16, 0xabc, 0x11);
    check_dseg(last_bb + 32, &sges[0]);
    check_dseg(last_bb + 48, &sges[1]);
    check_dseg(start, &sges[2]);
    check_dseg(start + 16, &sges[3]);
    check_dseg(start + 32, &sges[4]);
    assert_int_equal(f->wq.pi, 65);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 65);
    memcpy(expect, last_bb, 64);
    memcpy(expect + 64, start, 64);
    assert_memory_equal((char *)f->qp->bf + f->wq.bf_size - f->bf_toggle,
                        expect, 128);
    vqp_mlx5_txwq_complete(&f->wq, (uint16_t)idx);

    /* Inline data split by the ring end: advance to BB 63 again. */
    while ((f->wq.pi & f->wq.mask) != 63) {
        idx = vqp_mlx5_post_nop(&f->wq, 0);
        vqp_mlx5_txwq_complete(&f->wq, (uint16_t)idx);
    }
    /* ctrl + raddr + 4-byte header leave 28 bytes in BB 63. */
    in  = (vqp_mlx5_sge_t){(uintptr_t)payload, 100, 0};
    idx = vqp_mlx5_post_write(&f->wq, &in, 1, 0xdef, 0x22, VQP_MLX5_INLINE);
    check_ctrl(f, (uint16_t)idx, MLX5_OPCODE_RDMA_WRITE, 9,
               MLX5_WQE_CTRL_CQ_UPDATE, 0);
    iseg = (void *)(last_bb + 32);
    assert_int_equal(be32toh(iseg->byte_count), 100 | MLX5_INLINE_SEG);
    assert_memory_equal(last_bb + 36, payload, 28);
    assert_memory_equal(start, payload + 28, 72);
    assert_int_equal(vqp_mlx5_ctrl_num_bb(ctrl_at(f, (uint16_t)idx)), 3);
}

/* The 16-bit producer index wraps: the ctrl index field and the record
 * follow it, and accounting stays right across the wrap. */
static void test_pi_wrap16(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1000, 8, 1};
    unsigned i;
    int idx;

    for (i = 0; i < 0x10000 - 2; ++i) {
        idx = vqp_mlx5_post_send(&f->wq, &sge, 1, 0);
        vqp_mlx5_txwq_complete(&f->wq, (uint16_t)idx);
    }
    assert_int_equal(f->wq.pi, 0xfffe);
    idx = vqp_mlx5_post_send(&f->wq, &sge, 1, 0);
    assert_int_equal(idx, 0xfffe);
    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
    assert_int_equal(idx, 0xffff);
    check_ctrl(f, 0xffff, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE,
               0);
    idx = vqp_mlx5_post_send(&f->wq, &sge, 1, 0);
    assert_int_equal(idx, 0);
    check_ctrl(f, 0, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 1);
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 61);
    vqp_mlx5_txwq_complete(&f->wq, 0);
    assert_int_equal(vqp_mlx5_txwq_avail(&f->wq), 64);
}

/* 8-byte doorbells (ctrl bytes 0..7) alternate between the two halves. */
static void test_db_mmio(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1000, 8, 1};
    uint64_t *bf;
    int idx;

    tx_teardown(state);
    tx_setup_n(state, 64, 1, VQP_MLX5_DB_MMIO);
    f  = *state;
    bf = f->qp->bf;

    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
    assert_memory_equal(&bf[0], ctrl_at(f, idx), 8);
    assert_int_equal(bf[1], 0); /* nothing past the 8 bytes */
    idx = vqp_mlx5_post_send(&f->wq, &sge, 1, 0);
    assert_memory_equal(&bf[FAKE_BF_SIZE / 8], ctrl_at(f, idx), 8);
    assert_int_equal(bf[FAKE_BF_SIZE / 8 + 1], 0);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 2);
}

/* Doorbell record only: the register is never touched. */
static void test_db_record(void **state)
{
    tx_fixture_t *f                     = *state;
    vqp_mlx5_sge_t sge                  = {0x1000, 8, 1};
    uint64_t zero[2 * FAKE_BF_SIZE / 8] = {0};

    tx_teardown(state);
    tx_setup_n(state, 64, 1, VQP_MLX5_DB_RECORD);
    f = *state;
    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 2);
    assert_memory_equal(f->qp->bf, zero, sizeof(zero));
}

/* A WQE larger than the BlueFlame buffer gets an 8-byte doorbell. */
static void test_db_bf_too_big(void **state)
{
    tx_fixture_t *f   = *state;
    vqp_mlx5_sge_t in = {(uintptr_t)payload, 256, 0};
    uint64_t *bf      = f->qp->bf;
    int idx;

    /* 1 + 17 ds = 5 BBs = 320 bytes > 256. */
    idx = vqp_mlx5_post_send(&f->wq, &in, 1, VQP_MLX5_INLINE);
    assert_int_equal(vqp_mlx5_ctrl_num_bb(ctrl_at(f, idx)), 5);
    assert_memory_equal(&bf[0], ctrl_at(f, idx), 8);
    assert_int_equal(bf[1], 0);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 5);
}

/* VQP_MLX5_MORE batches: no record or doorbell until flush, which names the
 * newest WQE with an 8-byte doorbell. */
static void test_db_batch(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1000, 8, 1};
    uint64_t *bf       = f->qp->bf;
    int idx;

    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, VQP_MLX5_MORE);
    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, VQP_MLX5_MORE);
    idx = vqp_mlx5_post_send(&f->wq, &sge, 1, VQP_MLX5_MORE);
    assert_int_equal(f->qp->dbrec[MLX5_SND_DBR], 0);
    assert_int_equal(bf[0], 0);

    vqp_mlx5_txwq_flush(&f->wq);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 3);
    assert_memory_equal(&bf[0], ctrl_at(f, idx), 8);
    assert_int_equal(bf[1], 0);
    assert_int_equal(f->bf_toggle, FAKE_BF_SIZE);

    /* Nothing new: flushing again writes nothing. */
    f->qp->dbrec[MLX5_SND_DBR] = 0;
    vqp_mlx5_txwq_flush(&f->wq);
    assert_int_equal(f->qp->dbrec[MLX5_SND_DBR], 0);
    assert_int_equal(f->bf_toggle, FAKE_BF_SIZE);

    /* A lone WQE after a batch goes by BlueFlame again. */
    idx = vqp_mlx5_post_send(&f->wq, &sge, 1, 0);
    assert_memory_equal((char *)bf + FAKE_BF_SIZE, ctrl_at(f, idx), 64);

    /* A post without MORE after batched ones rings for all of them with the
     * 8-byte doorbell: a BlueFlame copy would carry only the newest WQE. */
    memset(bf, 0, 2 * FAKE_BF_SIZE);
    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, VQP_MLX5_MORE);
    idx = vqp_mlx5_post_send(&f->wq, &sge, 1, 0);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 6);
    assert_memory_equal(&bf[0], ctrl_at(f, idx), 8);
    assert_int_equal(bf[1], 0);
}

/* ring_last: a WQE posted with MORE and rung after the caller's own
 * bookkeeping goes as its post would have: BlueFlame when it alone is new,
 * the 8-byte doorbell naming it when batched WQEs precede it. */
/* QPs that ring one register (a ConnectX thread domain's) share its half:
 * consecutive BlueFlame copies alternate halves whichever QP posts; a QP
 * with a register needs the shared word, which must hold one of its halves. */
static void test_db_shared_register(void **state)
{
    fake_qp_t *qp[2]   = {fake_qp_new(64, 0, 0), fake_qp_new(64, 0, 0)};
    vqp_mlx5_sge_t sge = {0x1000, 8, 1};
    uint64_t *bf       = qp[0]->bf;
    vqp_mlx5_txwq_t wq[2];
    uint32_t toggle = 0, bad = 8;
    int idx, i;

    fake_log_start();
    qp[1]->dv.bf.reg = qp[0]->dv.bf.reg;
    for (i = 0; i < 2; ++i) {
        assert_int_equal(vqp_mlx5_txwq_init(&wq[i], &qp[i]->dv, FAKE_QPN + i,
                                            64, 1, VQP_MLX5_DB_BF, &toggle),
                         UCS_OK);
    }
    for (i = 0; i < 4; ++i) {
        idx = vqp_mlx5_post_write(&wq[i & 1], &sge, 1, 0x2000, 2, 0);
        assert_memory_equal((char *)bf + (i & 1) * FAKE_BF_SIZE,
                            vqp_mlx5_txwq_bb(&wq[i & 1], idx), 64);
        assert_int_equal(toggle, ((i + 1) & 1) * FAKE_BF_SIZE);
    }
    /* An 8-byte doorbell takes its turn too. */
    vqp_mlx5_post_write(&wq[0], &sge, 1, 0x2000, 2, VQP_MLX5_MORE);
    idx = vqp_mlx5_post_write(&wq[0], &sge, 1, 0x2000, 2, 0);
    assert_memory_equal(bf, vqp_mlx5_txwq_bb(&wq[0], idx), 8);
    idx = vqp_mlx5_post_write(&wq[1], &sge, 1, 0x2000, 2, 0);
    assert_memory_equal((char *)bf + FAKE_BF_SIZE,
                        vqp_mlx5_txwq_bb(&wq[1], idx), 64);
    assert_int_equal(toggle, 0);

    assert_int_equal(vqp_mlx5_txwq_init(&wq[0], &qp[0]->dv, FAKE_QPN, 64, 1,
                                        VQP_MLX5_DB_BF, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "register half (nil)");
    assert_int_equal(vqp_mlx5_txwq_init(&wq[0], &qp[0]->dv, FAKE_QPN, 64, 1,
                                        VQP_MLX5_DB_MMIO, &bad),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "(8): need");
    /* No register: no half to keep. */
    qp[0]->dv.bf.reg = NULL;
    assert_int_equal(vqp_mlx5_txwq_init(&wq[0], &qp[0]->dv, FAKE_QPN, 64, 1,
                                        VQP_MLX5_DB_BF, NULL),
                     UCS_OK);
    expect_no_log();
    fake_log_stop();
    fake_qp_free(qp[0]);
    fake_qp_free(qp[1]);
}

static void test_db_ring_last(void **state)
{
    tx_fixture_t *f    = *state;
    vqp_mlx5_sge_t sge = {0x1000, 8, 1};
    uint64_t *bf       = f->qp->bf;
    uint64_t *bf2      = (uint64_t *)((char *)bf + FAKE_BF_SIZE);
    int idx;

    idx = vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, VQP_MLX5_MORE);
    assert_int_equal(f->qp->dbrec[MLX5_SND_DBR], 0);
    vqp_mlx5_txwq_ring_last(&f->wq);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 1);
    assert_memory_equal(&bf[0], ctrl_at(f, idx), 64);
    assert_int_equal(f->bf_toggle, FAKE_BF_SIZE);

    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, VQP_MLX5_MORE);
    idx = vqp_mlx5_post_send(&f->wq, &sge, 1, VQP_MLX5_MORE);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 1);
    vqp_mlx5_txwq_ring_last(&f->wq);
    assert_int_equal(be32toh(f->qp->dbrec[MLX5_SND_DBR]), 3);
    assert_memory_equal(&bf2[0], ctrl_at(f, idx), 8);
    assert_int_equal(bf2[1], 0);
}

/* A device that is told by a call: the record first, then one call per
 * doorbell (a batch: one, at its flush); the register is never touched. */
static unsigned hook_calls;
static uint32_t hook_seen_pi;

static void hook_ring(void *arg)
{
    fake_qp_t *qp = arg;

    ++hook_calls;
    hook_seen_pi = be32toh(qp->dbrec[MLX5_SND_DBR]);
}

static void test_db_hook(void **state)
{
    tx_fixture_t *f                     = *state;
    vqp_mlx5_sge_t sge                  = {0x1000, 8, 1};
    uint64_t zero[2 * FAKE_BF_SIZE / 8] = {0};
    vqp_mlx5_db_hook_t hook             = {hook_ring, f->qp};

    f->qp->dv.comp_mask |= VQP_MLX5_DV_QP_MASK_DB_HOOK;
    f->qp->dv.tir_icm_addr = (uintptr_t)&hook;
    assert_int_equal(vqp_mlx5_txwq_init(&f->wq, &f->qp->dv, FAKE_QPN, 256, 1,
                                        VQP_MLX5_DB_BF, &f->bf_toggle),
                     UCS_OK);
    assert_int_equal(f->wq.db_mode, VQP_MLX5_DB_HOOK);
    hook_calls = 0;

    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, 0);
    assert_int_equal(hook_calls, 1);
    assert_int_equal(hook_seen_pi, 1);
    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, VQP_MLX5_MORE);
    vqp_mlx5_post_send(&f->wq, &sge, 1, VQP_MLX5_MORE);
    assert_int_equal(hook_calls, 1);
    vqp_mlx5_txwq_flush(&f->wq);
    assert_int_equal(hook_calls, 2);
    assert_int_equal(hook_seen_pi, 3);
    vqp_mlx5_txwq_flush(&f->wq); /* nothing new: no call */
    vqp_mlx5_post_write(&f->wq, &sge, 1, 0, 0, VQP_MLX5_MORE);
    vqp_mlx5_post_send(&f->wq, &sge, 1, 0); /* ends the batch */
    assert_int_equal(hook_calls, 3);
    assert_int_equal(hook_seen_pi, 5);
    assert_memory_equal(f->qp->bf, zero, sizeof(zero));

    /* A hook without a function, or the mode asked for without a hook. */
    hook.ring = NULL;
    assert_int_equal(vqp_mlx5_txwq_init(&f->wq, &f->qp->dv, FAKE_QPN, 256, 1,
                                        VQP_MLX5_DB_BF, &f->bf_toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "doorbell hook without a function");
    f->qp->dv.comp_mask = 0;
    assert_int_equal(vqp_mlx5_txwq_init(&f->wq, &f->qp->dv, FAKE_QPN, 256, 1,
                                        VQP_MLX5_DB_HOOK, &f->bf_toggle),
                     UCS_ERR_INVALID_PARAM);
    expect_log(UCS_LOG_LEVEL_ERROR, "a register mode");
    expect_no_log();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rejects),
        cmocka_unit_test(test_db_shared_register),
        cmocka_unit_test(test_state_size),
        cmocka_unit_test_setup_teardown(test_write_pointer, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_write_has_room, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_write_zero_length, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_write_imm_send, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_multi_bb, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_inline, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_atomics_nop, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_masked_atomics, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_masked_atomic_wrap, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_fence, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_signaling, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_complete_accounting, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_wrap, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_read_rdma, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_pi_wrap16, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_db_mmio, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_db_record, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_db_bf_too_big, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_db_batch, tx_setup, tx_teardown),
        cmocka_unit_test_setup_teardown(test_db_ring_last, tx_setup,
                                        tx_teardown),
        cmocka_unit_test_setup_teardown(test_db_hook, tx_setup, tx_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
