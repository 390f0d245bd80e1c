/*
 * Software device, single process (two instances): objects, the state
 * machine, every opcode with its CQEs, inline, gather lists, BB wrap-around,
 * SRQ and the doorbell/BlueFlame areas.
 */
#include <config.h>

#include "sw_test_fx.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

static const uint8_t CU = MLX5_WQE_CTRL_CQ_UPDATE;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));

    *state = f;
    return fx_init(f, 64, 16, 7, 3);
}

static int teardown(void **state)
{
    fx_fini(*state);
    free(*state);
    return 0;
}

static void test_objects(void **state)
{
    vqp_sw_dev_attr_t attr;
    vqp_sw_qp_attr_t qa;
    vqp_sw_dev_t *dev, *bad = NULL;
    vqp_sw_mr_t *mr;
    sw_test_cq_t cq;
    sw_test_qp_t q;
    uint32_t lkey, rkey;
    char buf[64];

    assert_int_equal(vqp_sw_dev_open("mlx5_0", &bad), UCS_ERR_NO_DEVICE);
    assert_null(bad);
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev), UCS_OK);
    vqp_sw_dev_query(dev, &attr);
    assert_true(attr.max_qp >= 256);
    assert_true(attr.max_inline >= 128);
    assert_true(attr.max_sge >= 2);
    /* Rights are checked as ibv_reg_mr checks them. */
    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf),
                                   IBV_ACCESS_REMOTE_WRITE, &mr, &lkey, &rkey),
                     UCS_ERR_INVALID_PARAM);
    assert_int_equal(
        vqp_sw_mr_reg(dev, buf, sizeof(buf), 1u << 20, &mr, &lkey, &rkey),
        UCS_ERR_INVALID_PARAM);
    assert_int_equal(vqp_sw_mr_reg(dev, buf, sizeof(buf),
                                   IBV_ACCESS_LOCAL_WRITE, &mr, &lkey, &rkey),
                     UCS_OK);
    assert_int_not_equal(lkey, MLX5_INVALID_LKEY);
    assert_int_not_equal(lkey, 0);
    assert_int_equal(vqp_sw_mr_dereg(mr), UCS_OK);
    assert_int_equal(sw_test_cq_create(dev, 0, &cq), UCS_ERR_INVALID_PARAM);
    assert_int_equal(sw_test_cq_create(dev, 100, &cq), UCS_OK);
    /* Rounded to a power of two, all entries invalid with owner 0. */
    assert_int_equal(cq.dv.cqe_cnt, 128);
    assert_int_equal(cq.dv.cqe_size, 64);
    assert_int_equal(((struct mlx5_cqe64 *)cq.dv.buf)[127].op_own, 0xf0);
    /* Arming writes the doorbell at cq_uar + 0x20 (MLX5_CQ_DOORBELL). */
    memset(cq.dv.cq_uar, 0x5c, 0x28);
    assert_int_equal(sw_test_qp_create(dev, &cq, &cq, NULL, 0, 4, 0, &q),
                     UCS_ERR_INVALID_PARAM);
    assert_int_equal(sw_test_qp_create(dev, &cq, &cq, NULL, 8, 4, 4096, &q),
                     UCS_ERR_INVALID_PARAM);
    assert_int_equal(sw_test_qp_create(dev, &cq, &cq, NULL, 10, 3, 64, &q),
                     UCS_OK);
    assert_int_equal(q.dv.sq.wqe_cnt, 16);
    assert_int_equal(q.dv.sq.stride, 64);
    assert_int_equal(q.dv.rq.wqe_cnt, 4);
    assert_int_equal(q.dv.rq.stride, 32);
    assert_int_equal(q.dv.bf.size, 256);
    memset(q.dv.bf.reg, 0xab, 2 * q.dv.bf.size); /* really writable */
    assert_int_equal(q.qpn >> 24, 0);
    assert_int_not_equal(q.qpn, 0);
    /* A CQ in use cannot go away. */
    assert_int_equal(vqp_sw_cq_destroy(cq.cq), UCS_ERR_BUSY);

    memset(&qa, 0, sizeof(qa));
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_RESET);
    qa.qp_state = IBV_QPS_RTS;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_ERR_INVALID_PARAM);
    qa.qp_state = IBV_QPS_RTR;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_ERR_INVALID_PARAM);
    qa.qp_state        = IBV_QPS_INIT;
    qa.qp_access_flags = 1u << 30;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_ERR_INVALID_PARAM);
    qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_OK);
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_INIT);
    qa.qp_state    = IBV_QPS_RTR;
    qa.dest_qp_num = 0; /* no QPN 0 */
    vqp_sw_dev_address(dev, &qa.dest_dev);
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_ERR_INVALID_PARAM);
    qa.dest_qp_num       = q.qpn; /* loopback to itself */
    qa.dest_dev.instance = 9999;  /* no such device */
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_ERR_UNREACHABLE);
    vqp_sw_dev_address(dev, &qa.dest_dev);
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_OK);
    qa.qp_state  = IBV_QPS_RTS;
    qa.retry_cnt = 8;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_ERR_INVALID_PARAM);
    qa.retry_cnt = 7;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_OK);
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_RTS);
    qa.qp_state = IBV_QPS_INIT;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_ERR_INVALID_PARAM);
    qa.qp_state = IBV_QPS_ERR;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_OK);
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_ERR);
    qa.qp_state = IBV_QPS_RTS;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_ERR_INVALID_PARAM);
    qa.qp_state = IBV_QPS_RESET;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &qa), UCS_OK);
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_RESET);
    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);
    assert_int_equal(vqp_sw_cq_destroy(cq.cq), UCS_OK);
    vqp_sw_dev_close(dev);
}

static void test_write_signaled_and_not(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    uint16_t idx;
    vqp_sw_qp_counters_t c;

    memset(f->buf[0], 0x5a, 100);
    fx_write(f, 0, 0, 1000, 100, 0); /* unsignaled: no CQE */
    memset(f->buf[0] + 200, 0x33, 50);
    idx = fx_write(f, 0, 200, 2000, 50, CU);
    assert_int_equal(idx, 1);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be16toh(cqe.wqe_counter), idx);
    assert_int_equal(sw_test_cqe_qpn(&cqe), f->qp[0].qpn);
    assert_int_equal(be32toh(cqe.sop_drop_qpn) >> 24, MLX5_OPCODE_RDMA_WRITE);
    assert_int_equal(cqe.op_own & 1, 0); /* first pass: owner 0 */
    assert_memory_equal(f->buf[1] + 1000, f->buf[0], 100);
    assert_memory_equal(f->buf[1] + 2000, f->buf[0] + 200, 50);
    assert_true(fx_cq_empty(f, 0, 0));
    vqp_sw_qp_counters(f->qp[0].qp, &c);
    assert_int_equal(c.wqes, 2);
    assert_int_equal(c.bytes, 150);
}

static void test_write_gather_inline_zero(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    struct mlx5_cqe64 cqe;
    const char msg[] = "inline payload of forty-odd bytes......";
    unsigned units;
    uint16_t idx;

    /* Three-entry gather list into one remote range. */
    memcpy(f->buf[0], "aaaa", 4);
    memcpy(f->buf[0] + 100, "bbbbbb", 6);
    memcpy(f->buf[0] + 300, "cc", 2);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 5, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + 500, f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0], 4, f->lkey[0]);
    sw_test_dseg(q, 3, f->buf[0] + 100, 6, f->lkey[0]);
    sw_test_dseg(q, 4, f->buf[0] + 300, 2, f->lkey[0]);
    sw_test_ring(q, 5);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_memory_equal(f->buf[1] + 500, "aaaabbbbbbcc", 12);

    /* Inline write: data carried in the WQE. */
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 0, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + 700, f->rkey[1]);
    units = sw_test_inline(q, 2, msg, sizeof(msg));
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 2 + units, CU, 0);
    idx = sw_test_ring(q, 2 + units);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be16toh(cqe.wqe_counter), idx);
    assert_string_equal((char *)f->buf[1] + 700, msg);

    /* Zero-length write (ds 2) is valid and completes; it touches no
     * memory, so its rkey is not checked (UCX flushes this way, rkey 0). */
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 2, CU, 0);
    sw_test_raddr(q, 1, 0, 0);
    idx = sw_test_ring(q, 2);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be16toh(cqe.wqe_counter), idx);
    assert_int_equal(be32toh(cqe.byte_cnt), 0);
}

/* A run of WRITEs posted together: remote ranges that continue the previous
 * one, the same range written again (directly after, after a zero-length
 * WRITE, after an adjacent one), an inline one replaced by a gathered one.
 * Every WQE completes in order and counts; memory holds the last data
 * written to each byte. */
static void test_write_run_merge(void **state)
{
    static const char *const data[] = {
        "AAAAAAAA", "BBBBBBBB", "CCCCCCCC", "EEEEEEEE",
        "FFFFFFFF", "GG",       "HHHHHH",   "IIIIIIIIIIIIIIII"};
    fx_t *f          = *state;
    sw_test_qp_t *q  = &f->qp[0];
    const char inl[] = "DDDDDDDD";
    uint16_t idx[9];
    struct mlx5_cqe64 cqe;
    vqp_sw_qp_counters_t c;
    unsigned i, units;

    for (i = 0; i < 8; ++i) {
        memcpy(f->buf[0] + 100 * i, data[i], strlen(data[i]));
    }
    idx[0] = fx_write(f, 0, 0, 1000, 8, CU);           /* A at 1000 */
    idx[1] = fx_write(f, 0, 100, 1008, 8, CU);         /* B continues it */
    idx[2] = fx_write(f, 0, 200, 1008, 8, CU);         /* C over B (joined) */
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 0, CU, 0); /* D inline, 3000 */
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + 3000, f->rkey[1]);
    units = sw_test_inline(q, 2, inl, 8);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 2 + units, CU, 0);
    idx[3] = sw_test_ring(q, 2 + units);
    idx[4] = fx_write(f, 0, 300, 3000, 8, CU);         /* E replaces D */
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 2, CU, 0); /* zero length */
    sw_test_raddr(q, 1, 0, 0);
    idx[5] = sw_test_ring(q, 2);
    idx[6] = fx_write(f, 0, 400, 3000, 8, CU);         /* F replaces E */
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 4, CU, 0); /* GG HHHHHH after F */
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + 3008, f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0] + 500, 2, f->lkey[0]);
    sw_test_dseg(q, 3, f->buf[0] + 600, 6, f->lkey[0]);
    idx[7] = sw_test_ring(q, 4);
    idx[8] = fx_write(f, 0, 700, 2000, 16, CU); /* I elsewhere */
    for (i = 0; i < 9; ++i) {
        assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), idx[i]);
    }
    assert_memory_equal(f->buf[1] + 1000, "AAAAAAAACCCCCCCC", 16);
    assert_memory_equal(f->buf[1] + 3000, "FFFFFFFFGGHHHHHH", 16);
    assert_memory_equal(f->buf[1] + 2000, data[7], 16);
    assert_int_equal(f->buf[1][999], f->buf[1][1016]); /* nothing around */
    assert_int_equal(f->buf[1][2999], f->buf[1][3016]);
    vqp_sw_qp_counters(q->qp, &c);
    assert_int_equal(c.wqes, 9);
    assert_int_equal(c.bytes, 7 * 8 + 16);
}

/* Inline and data segments mixed in one gather list, in any order (UCX's
 * AM zcopy: inline header, then data segments); inline bytes count
 * against max_inline together. */
static void test_mixed_gather(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    struct mlx5_cqe64 cqe;
    unsigned units;

    sw_test_post_recv(&f->qp[1], f->buf[1], 256, f->lkey[1]);
    memcpy(f->buf[0], "-data-one-", 10);
    memcpy(f->buf[0] + 64, "=data-two=", 10);
    units = sw_test_inline(q, 1, "HDR:", 4);
    sw_test_dseg(q, 1 + units, f->buf[0], 10, f->lkey[0]);
    sw_test_dseg(q, 2 + units, f->buf[0] + 64, 10, f->lkey[0]);
    sw_test_ctrl(q, MLX5_OPCODE_SEND, 3 + units, CU, 0);
    sw_test_ring(q, 3 + units);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(be32toh(cqe.byte_cnt), 24);
    assert_memory_equal(f->buf[1], "HDR:-data-one-=data-two=", 24);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);

    /* A WRITE with a data segment, then inline bytes. */
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + 512, f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0], 10, f->lkey[0]);
    units = sw_test_inline(q, 3, "+tail", 5);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3 + units, CU, 0);
    sw_test_ring(q, 3 + units);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_memory_equal(f->buf[1] + 512, "-data-one-+tail", 15);
}

static void test_read(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    struct mlx5_cqe64 cqe;

    memcpy(f->buf[1] + 64, "remote-bytes", 12);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_READ, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)f->buf[1] + 64, f->rkey[1]);
    sw_test_dseg(q, 2, f->buf[0] + 4000, 12, f->lkey[0]);
    sw_test_ring(q, 3);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be32toh(cqe.byte_cnt), 12);
    assert_int_equal(be32toh(cqe.sop_drop_qpn) >> 24, MLX5_OPCODE_RDMA_READ);
    assert_memory_equal(f->buf[0] + 4000, "remote-bytes", 12);
}

static void test_send_variants(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    uint16_t idx;

    sw_test_post_recv(&f->qp[1], f->buf[1] + 100, 64, f->lkey[1]);
    sw_test_post_recv(&f->qp[1], f->buf[1] + 200, 64, f->lkey[1]);
    sw_test_post_recv(&f->qp[1], f->buf[1] + 300, 64, f->lkey[1]);
    memcpy(f->buf[0], "hello", 5);
    memcpy(f->buf[0] + 16, "with-imm", 8);
    idx = fx_send(f, 0, MLX5_OPCODE_SEND, 0, 5, 0);
    fx_send(f, 0, MLX5_OPCODE_SEND_IMM, 16, 8, htobe32(0xdeadbeef));
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be16toh(cqe.wqe_counter), idx);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(be32toh(cqe.byte_cnt), 5);
    assert_int_equal(be16toh(cqe.wqe_counter), 0);
    assert_int_equal(sw_test_cqe_qpn(&cqe), f->qp[1].qpn);
    assert_int_equal(be32toh(cqe.flags_rqpn) & 0xffffff, f->qp[0].qpn);
    assert_memory_equal(f->buf[1] + 100, "hello", 5);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND_IMM);
    assert_int_equal(be32toh(cqe.imm_inval_pkey), 0xdeadbeef);
    assert_int_equal(be16toh(cqe.wqe_counter), 1);
    assert_memory_equal(f->buf[1] + 200, "with-imm", 8);

    /* WRITE_IMM: data at raddr, a receive WQE consumed for the notice. */
    memcpy(f->buf[0] + 32, "written", 7);
    sw_test_ctrl(&f->qp[0], MLX5_OPCODE_RDMA_WRITE_IMM, 3, CU, htobe32(77));
    sw_test_raddr(&f->qp[0], 1, (uintptr_t)f->buf[1] + 3000, f->rkey[1]);
    sw_test_dseg(&f->qp[0], 2, f->buf[0] + 32, 7, f->lkey[0]);
    sw_test_ring(&f->qp[0], 3);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_WR_IMM);
    assert_int_equal(be32toh(cqe.imm_inval_pkey), 77);
    assert_int_equal(be32toh(cqe.byte_cnt), 7);
    assert_int_equal(be16toh(cqe.wqe_counter), 2);
    assert_memory_equal(f->buf[1] + 3000, "written", 7);
    /* The send CQ saw the SEND_IMM and WRITE_IMM completions too. */
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(be32toh(cqe.sop_drop_qpn) >> 24,
                     MLX5_OPCODE_RDMA_WRITE_IMM);
}

static void test_send_inline_and_empty(void **state)
{
    fx_t *f         = *state;
    sw_test_qp_t *q = &f->qp[0];
    struct mlx5_cqe64 cqe;
    unsigned units;

    sw_test_post_recv(&f->qp[1], f->buf[1] + 100, 64, f->lkey[1]);
    sw_test_post_recv(&f->qp[1], f->buf[1] + 200, 64, f->lkey[1]);
    units = sw_test_inline(q, 1, "tiny", 4);
    sw_test_ctrl(q, MLX5_OPCODE_SEND, 1 + units, CU, 0);
    sw_test_ring(q, 1 + units);
    sw_test_ctrl(q, MLX5_OPCODE_SEND, 1, CU, 0); /* zero-length send */
    sw_test_ring(q, 1);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(be32toh(cqe.byte_cnt), 4);
    assert_memory_equal(f->buf[1] + 100, "tiny", 4);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(be32toh(cqe.byte_cnt), 0);
    assert_int_equal(be16toh(cqe.wqe_counter), 1);

    /* Zero-length WRITE_IMM: only the notification, no rkey needed. */
    sw_test_post_recv(&f->qp[1], f->buf[1] + 300, 64, f->lkey[1]);
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE_IMM, 2, CU, htobe32(5));
    sw_test_raddr(q, 1, 0, 0);
    sw_test_ring(q, 2);
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_WR_IMM);
    assert_int_equal(be32toh(cqe.byte_cnt), 0);
    assert_int_equal(be32toh(cqe.imm_inval_pkey), 5);
    assert_int_equal(be16toh(cqe.wqe_counter), 2);
}

static void test_atomics(void **state)
{
    fx_t *f          = *state;
    sw_test_qp_t *q  = &f->qp[0];
    uint64_t *remote = (uint64_t *)(f->buf[1] + 64);
    uint64_t *result = (uint64_t *)(f->buf[0] + 128);
    struct mlx5_cqe64 cqe;

    *remote = 40;
    sw_test_ctrl(q, MLX5_OPCODE_ATOMIC_FA, 4, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)remote, f->rkey[1]);
    sw_test_atomic(q, 2, 2, 0);
    sw_test_dseg(q, 3, result, 8, f->lkey[0]);
    sw_test_ring(q, 4);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be32toh(cqe.byte_cnt), 8);
    assert_int_equal(*remote, 42);
    assert_int_equal(be64toh(*result), 40); /* returned big-endian */

    /* CS that fails leaves memory alone, one that matches swaps. */
    sw_test_ctrl(q, MLX5_OPCODE_ATOMIC_CS, 4, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)remote, f->rkey[1]);
    sw_test_atomic(q, 2, 100, 41);
    sw_test_dseg(q, 3, result, 8, f->lkey[0]);
    sw_test_ring(q, 4);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(*remote, 42);
    assert_int_equal(be64toh(*result), 42);
    sw_test_ctrl(q, MLX5_OPCODE_ATOMIC_CS, 4, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)remote, f->rkey[1]);
    sw_test_atomic(q, 2, 100, 42);
    sw_test_dseg(q, 3, result, 8, f->lkey[0]);
    sw_test_ring(q, 4);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(be32toh(cqe.sop_drop_qpn) >> 24, MLX5_OPCODE_ATOMIC_CS);
    assert_int_equal(*remote, 100);
    assert_int_equal(be64toh(*result), 42);
}

/* One masked atomic on the peer's word at @a roff of @a size bytes: returns
 * the old value as the device returned it (big-endian, size bytes). */
static uint64_t masked(fx_t *f, uint8_t op, unsigned size, unsigned roff,
                       uint64_t swap_add, uint64_t compare, uint64_t swap_mask,
                       uint64_t compare_mask)
{
    uint8_t *res = f->buf[0] + 256;
    struct mlx5_cqe64 cqe;
    uint32_t r32;
    uint64_t r64;

    memset(res, 0xee, 16);
    sw_test_masked(&f->qp[0], op, SW_TEST_EXT_OPMOD(size), size,
                   SW_TEST_EXT_DS(op, size), (uintptr_t)f->buf[1] + roff,
                   f->rkey[1], swap_add, compare, swap_mask, compare_mask, res,
                   size, f->lkey[0]);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be32toh(cqe.sop_drop_qpn) >> 24, op);
    assert_int_equal(be32toh(cqe.byte_cnt), size);
    /* Only the result's own bytes are written. */
    assert_int_equal(res[size], 0xee);
    if (size == 4) {
        memcpy(&r32, res, 4);
        return be32toh(r32);
    }
    memcpy(&r64, res, 8);
    return be64toh(r64);
}

/* Every use of the extended atomics UCX makes (rc_mlx5's mapping), on 4 and
 * 8 bytes: fetch-add, swap, compare-and-swap, and, or, xor; plus a masked
 * compare and a field-boundary add. */
static void test_masked_atomics(void **state)
{
    const uint8_t CS = MLX5_OPCODE_ATOMIC_MASKED_CS;
    const uint8_t FA = MLX5_OPCODE_ATOMIC_MASKED_FA;
    fx_t *f          = *state;
    uint32_t *w32    = (uint32_t *)(f->buf[1] + 64);
    uint64_t *w64    = (uint64_t *)(f->buf[1] + 128);

    /* 4 bytes; the neighbouring 4 bytes stay untouched. */
    w32[0] = 0xfffffffe;
    w32[1] = 0x5a5a5a5a;
    assert_int_equal(masked(f, FA, 4, 64, 3, 0, 0, 0), 0xfffffffe);
    assert_int_equal(w32[0], 1); /* wraps in 32 bits */
    assert_int_equal(w32[1], 0x5a5a5a5a);
    assert_int_equal(masked(f, CS, 4, 64, 0xabcd, 0, ~0u, 0), 1); /* swap */
    assert_int_equal(w32[0], 0xabcd);
    /* cswap: compare mask all ones; a miss changes nothing. */
    assert_int_equal(masked(f, CS, 4, 64, 7, 0xabce, ~0u, ~0u), 0xabcd);
    assert_int_equal(w32[0], 0xabcd);
    assert_int_equal(masked(f, CS, 4, 64, 7, 0xabcd, ~0u, ~0u), 0xabcd);
    assert_int_equal(w32[0], 7);
    /* and: swap v under mask ~v; or: swap v under mask v; xor: FA with
     * every bit a field boundary. */
    w32[0] = 0xf0f0f0f0;
    assert_int_equal(masked(f, CS, 4, 64, 0xff00ff00, 0, ~0xff00ff00u, 0),
                     0xf0f0f0f0);
    assert_int_equal(w32[0], 0xf000f000);
    assert_int_equal(masked(f, CS, 4, 64, 0x0000000f, 0, 0x0000000f, 0),
                     0xf000f000);
    assert_int_equal(w32[0], 0xf000f00f);
    assert_int_equal(masked(f, FA, 4, 64, 0xffff0001, ~0u, 0, 0), 0xf000f00f);
    assert_int_equal(w32[0], 0x0ffff00e);
    /* Compare under a mask: only the low byte must match. */
    w32[0] = 0x12345678;
    assert_int_equal(masked(f, CS, 4, 64, 0xaa, 0xffffff78, 0xff, 0xff),
                     0x12345678);
    assert_int_equal(w32[0], 0x123456aa);
    assert_int_equal(w32[1], 0x5a5a5a5a);

    /* 8 bytes. */
    w64[0] = 0xffffffffffffffffull;
    w64[1] = 0x5a5a5a5a5a5a5a5aull;
    assert_int_equal(masked(f, FA, 8, 128, 2, 0, 0, 0), ~0ull);
    assert_int_equal(w64[0], 1);
    assert_int_equal(masked(f, CS, 8, 128, 0x1122334455667788ull, 0, ~0ull, 0),
                     1);
    assert_int_equal(w64[0], 0x1122334455667788ull);
    assert_int_equal(
        masked(f, CS, 8, 128, 5, 0x1122334455667789ull, ~0ull, ~0ull),
        0x1122334455667788ull);
    assert_int_equal(w64[0], 0x1122334455667788ull);
    assert_int_equal(
        masked(f, CS, 8, 128, 5, 0x1122334455667788ull, ~0ull, ~0ull),
        0x1122334455667788ull);
    assert_int_equal(w64[0], 5);
    w64[0] = 0xff00ff00ff00ff00ull;
    assert_int_equal(masked(f, CS, 8, 128, 0x0ff00ff00ff00ff0ull, 0,
                            ~0x0ff00ff00ff00ff0ull, 0),
                     0xff00ff00ff00ff00ull);
    assert_int_equal(w64[0], 0x0f000f000f000f00ull);
    assert_int_equal(masked(f, CS, 8, 128, 0x8000000000000001ull, 0,
                            0x8000000000000001ull, 0),
                     0x0f000f000f000f00ull);
    assert_int_equal(w64[0], 0x8f000f000f000f01ull);
    assert_int_equal(masked(f, FA, 8, 128, 0xffffffff00000001ull, ~0ull, 0, 0),
                     0x8f000f000f000f01ull);
    assert_int_equal(w64[0], 0x70fff0ff0f000f00ull);
    /* Field boundary at bit 31: two 32-bit adds, no carry between them. */
    w64[0] = 0x00000001ffffffffull;
    assert_int_equal(masked(f, FA, 8, 128, 0x0000000100000001ull,
                            0x0000000080000000ull, 0, 0),
                     0x00000001ffffffffull);
    assert_int_equal(w64[0], 0x0000000200000000ull);
    assert_int_equal(w64[1], 0x5a5a5a5a5a5a5a5aull);
}

static void test_nop_and_cq_wrap(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    unsigned i;
    uint16_t idx;

    /* 150 signaled NOPs through a 64-entry CQ: owner bit flips each pass. */
    for (i = 0; i < 150; ++i) {
        idx = fx_nop(f, 0, CU);
        assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), idx);
        assert_int_equal(cqe.op_own & 1, ((f->scq[0].ci - 1) >> 6) & 1);
    }
}

/* WQEs of 3 BBs in a ring of 8 BBs: every few WQEs one wraps. */
static void test_sq_wraparound(void **state)
{
    fx_t *f           = *state;
    vqp_sw_dev_t *dev = f->devs[0];
    sw_test_qp_t q, *peer = &f->qp[1];
    vqp_sw_qp_attr_t qa;
    struct mlx5_cqe64 cqe;
    char payload[100];
    unsigned i, units, wrapped = 0;
    uint16_t idx;

    /* A second pair on the fixture's devices, with a small SQ. */
    assert_int_equal(
        sw_test_qp_create(dev, &f->scq[0], &f->rcq[0], NULL, 8, 0, 128, &q),
        UCS_OK);
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_ERR; /* re-point B's QP at the new QP */
    assert_int_equal(vqp_sw_qp_modify(peer->qp, &qa), UCS_OK);
    qa.qp_state = IBV_QPS_RESET;
    assert_int_equal(vqp_sw_qp_modify(peer->qp, &qa), UCS_OK);
    peer->sq_pi = peer->rq_pi = 0;
    assert_int_equal(
        sw_test_qp_connect(peer, &f->addr[0], q.qpn, SW_TEST_ACCESS_ALL, 7, 3),
        UCS_OK);
    assert_int_equal(sw_test_qp_connect(&q, &f->addr[1], peer->qpn,
                                        SW_TEST_ACCESS_ALL, 7, 3),
                     UCS_OK);
    while (fx_cq_empty(f, 1, 1) == 0) {
        sw_test_cq_pop(&f->rcq[1]); /* flushes of B's old receives */
    }
    for (i = 0; i < 20; ++i) {
        memset(payload, 'a' + i, sizeof(payload));
        sw_test_ctrl(&q, MLX5_OPCODE_RDMA_WRITE, 0, CU, 0);
        sw_test_raddr(&q, 1, (uintptr_t)f->buf[1] + i * 100, f->rkey[1]);
        units = sw_test_inline(&q, 2, payload, sizeof(payload));
        sw_test_ctrl(&q, MLX5_OPCODE_RDMA_WRITE, 2 + units, CU, 0);
        wrapped += ((q.sq_pi & 7) + (2 + units + 3) / 4) > 8;
        idx = sw_test_ring(&q, 2 + units);
        assert_int_equal(sw_test_poll(f->devs, 2, &f->scq[0], &cqe, 2000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), idx);
        assert_memory_equal(f->buf[1] + i * 100, payload, sizeof(payload));
    }
    assert_true(wrapped >= 5);
    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);
}

static void test_srq(void **state)
{
    fx_t *f           = *state;
    vqp_sw_dev_t *dev = f->devs[1];
    sw_test_srq_t srq;
    sw_test_qp_t qa[2], qb[2];
    sw_test_cq_t rcq;
    struct mlx5_cqe64 cqe;
    uint16_t posted[4];
    unsigned i;

    memset(&srq, 0, sizeof(srq));
    assert_int_equal(vqp_sw_srq_create(dev, 0, 1, &srq.srq, &srq.dv),
                     UCS_ERR_INVALID_PARAM);
    assert_int_equal(vqp_sw_srq_create(dev, 3, 1, &srq.srq, &srq.dv), UCS_OK);
    assert_int_equal(srq.dv.head, 0);
    assert_int_equal(srq.dv.tail, 3);
    assert_int_equal(sw_test_cq_create(dev, 16, &rcq), UCS_OK);
    /* Two QPs on B share the SRQ; two QPs on A send to them. */
    for (i = 0; i < 2; ++i) {
        assert_int_equal(
            sw_test_qp_create(dev, &f->scq[1], &rcq, &srq, 8, 0, 0, &qb[i]),
            UCS_OK);
        assert_int_equal(sw_test_qp_create(f->devs[0], &f->scq[0], &f->rcq[0],
                                           NULL, 8, 0, 0, &qa[i]),
                         UCS_OK);
    }
    for (i = 0; i < 2; ++i) {
        assert_int_equal(sw_test_qp_connect(&qb[i], &f->addr[0], qa[i].qpn,
                                            SW_TEST_ACCESS_ALL, 7, 3),
                         UCS_OK);
        assert_int_equal(sw_test_qp_connect(&qa[i], &f->addr[1], qb[i].qpn,
                                            SW_TEST_ACCESS_ALL, 7, 3),
                         UCS_OK);
    }
    for (i = 0; i < 3; ++i) {
        posted[i] =
            sw_test_srq_post(&srq, f->buf[1] + 1000 + i * 100, 100, f->lkey[1]);
    }
    for (i = 0; i < 3; ++i) {
        f->buf[0][i] = (uint8_t)('x' + i);
        sw_test_ctrl(&qa[i & 1], MLX5_OPCODE_SEND, 2, CU, 0);
        sw_test_dseg(&qa[i & 1], 1, f->buf[0] + i, 1, f->lkey[0]);
        sw_test_ring(&qa[i & 1], 2);
        assert_int_equal(sw_test_poll(f->devs, 2, &rcq, &cqe, 2000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
        /* wqe_counter is the SRQ entry consumed, in list order. */
        assert_int_equal(be16toh(cqe.wqe_counter), posted[i]);
        assert_int_equal(sw_test_cqe_qpn(&cqe), qb[i & 1].qpn);
        assert_int_equal(be32toh(cqe.srqn_uidx), srq.dv.srqn);
        assert_int_equal(f->buf[1][1000 + posted[i] * 100], 'x' + i);
        sw_test_srq_free(&srq, posted[i]);
    }
    /* Freed entries come back through the list and are used again. */
    posted[3]     = sw_test_srq_post(&srq, f->buf[1] + 2000, 100, f->lkey[1]);
    f->buf[0][10] = 'z';
    sw_test_ctrl(&qa[0], MLX5_OPCODE_SEND, 2, CU, 0);
    sw_test_dseg(&qa[0], 1, f->buf[0] + 10, 1, f->lkey[0]);
    sw_test_ring(&qa[0], 2);
    assert_int_equal(sw_test_poll(f->devs, 2, &rcq, &cqe, 2000), 0);
    assert_int_equal(be16toh(cqe.wqe_counter), posted[3]);
    assert_int_equal(f->buf[1][2000], 'z');
    assert_int_equal(vqp_sw_srq_destroy(srq.srq), UCS_ERR_BUSY);
    for (i = 0; i < 2; ++i) {
        vqp_sw_qp_destroy(qa[i].qp);
        vqp_sw_qp_destroy(qb[i].qp);
    }
    assert_int_equal(vqp_sw_srq_destroy(srq.srq), UCS_OK);
}

/* ERR flushes a WQE posted later; RESET then reconnect makes it work. */
static void test_error_reset_reuse(void **state)
{
    fx_t *f = *state;
    vqp_sw_qp_attr_t qa;
    struct mlx5_cqe64 cqe;
    uint16_t idx;

    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_ERR;
    assert_int_equal(vqp_sw_qp_modify(f->qp[0].qp, &qa), UCS_OK);
    memset(f->buf[1], 0x77, 64);
    memset(f->buf[0], 0x11, 64);
    idx = fx_write(f, 0, 0, 0, 64, CU);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(be16toh(cqe.wqe_counter), idx);
    assert_int_equal(f->buf[1][0], 0x77);
    qa.qp_state = IBV_QPS_RESET;
    assert_int_equal(vqp_sw_qp_modify(f->qp[0].qp, &qa), UCS_OK);
    f->qp[0].sq_pi = f->qp[0].rq_pi = 0;
    assert_int_equal(sw_test_qp_connect(&f->qp[0], &f->addr[1], f->qp[1].qpn,
                                        SW_TEST_ACCESS_ALL, 7, 3),
                     UCS_OK);
    idx = fx_write(f, 0, 0, 0, 64, CU);
    assert_int_equal(idx, 0);
    assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_synd(&cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(f->buf[1][0], 0x11);
}

/* Destroying the first of three QPs of a device moves the last one into
 * its place in the engine's QP list: both survivors still execute posted
 * WQEs, and the moved one, put in ERROR, flushes a receive posted after
 * that (its doorbell record did not change: the engine must visit it for
 * its state). */
static void test_destroy_first_of_three(void **state)
{
    sw_test_qp_t qa[2], qb[2];
    struct mlx5_cqe64 cqe;
    vqp_sw_qp_attr_t attr;
    fx_t *f = *state;
    uint16_t idx;
    int i;

    for (i = 0; i < 2; ++i) {
        assert_int_equal(sw_test_qp_create(f->devs[0], &f->scq[0], &f->rcq[0],
                                           NULL, 64, 16, 128, &qa[i]),
                         UCS_OK);
        assert_int_equal(sw_test_qp_create(f->devs[1], &f->scq[1], &f->rcq[1],
                                           NULL, 64, 16, 128, &qb[i]),
                         UCS_OK);
        assert_int_equal(sw_test_qp_connect(&qa[i], &f->addr[1], qb[i].qpn,
                                            SW_TEST_ACCESS_ALL, 7, 3),
                         UCS_OK);
        assert_int_equal(sw_test_qp_connect(&qb[i], &f->addr[0], qa[i].qpn,
                                            SW_TEST_ACCESS_ALL, 7, 3),
                         UCS_OK);
    }
    assert_int_equal(vqp_sw_qp_destroy(f->qp[0].qp), UCS_OK);
    f->qp[0].qp = NULL;
    for (i = 1; i >= 0; --i) {
        memset(f->buf[0], 0x20 + i, 64);
        sw_test_ctrl(&qa[i], MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
        sw_test_raddr(&qa[i], 1, (uintptr_t)f->buf[1] + 64 * i, f->rkey[1]);
        sw_test_dseg(&qa[i], 2, f->buf[0], 64, f->lkey[0]);
        idx = sw_test_ring(&qa[i], 3);
        assert_int_equal(fx_poll(f, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(sw_test_cqe_qpn(&cqe), qa[i].qpn);
        assert_int_equal(be16toh(cqe.wqe_counter), idx);
        assert_int_equal(f->buf[1][64 * i], 0x20 + i);
    }
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_ERR;
    assert_int_equal(vqp_sw_qp_modify(qa[1].qp, &attr), UCS_OK);
    assert_true(fx_cq_empty(f, 0, 1));
    sw_test_post_recv(&qa[1], f->buf[0], 64, f->lkey[0]);
    assert_int_equal(fx_poll(f, 0, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(sw_test_cqe_qpn(&cqe), qa[1].qpn);
    for (i = 0; i < 2; ++i) {
        assert_int_equal(vqp_sw_qp_destroy(qa[i].qp), UCS_OK);
        assert_int_equal(vqp_sw_qp_destroy(qb[i].qp), UCS_OK);
    }
}

/* One progress call executes the posted WQEs of every QP, whichever QP
 * had work last (the engine starts its walk there and wraps around). */
static void test_progress_visits_all(void **state)
{
    sw_test_qp_t qa[2], qb[2], *q[3];
    struct mlx5_cqe64 *cqe;
    fx_t *f    = *state;
    unsigned n = 0;
    int i, round;

    for (i = 0; i < 2; ++i) {
        assert_int_equal(sw_test_qp_create(f->devs[0], &f->scq[0], &f->rcq[0],
                                           NULL, 64, 16, 128, &qa[i]),
                         UCS_OK);
        assert_int_equal(sw_test_qp_create(f->devs[1], &f->scq[1], &f->rcq[1],
                                           NULL, 64, 16, 128, &qb[i]),
                         UCS_OK);
        assert_int_equal(sw_test_qp_connect(&qa[i], &f->addr[1], qb[i].qpn,
                                            SW_TEST_ACCESS_ALL, 7, 3),
                         UCS_OK);
        assert_int_equal(sw_test_qp_connect(&qb[i], &f->addr[0], qa[i].qpn,
                                            SW_TEST_ACCESS_ALL, 7, 3),
                         UCS_OK);
    }
    q[0] = &f->qp[0];
    q[1] = &qa[0];
    q[2] = &qa[1];
    for (round = 0; round < 3; ++round) {
        /* QP @a round alone first: it is where the next walk starts. */
        sw_test_ctrl(q[round], MLX5_OPCODE_NOP, 1, CU, 0);
        sw_test_ring(q[round], 1);
        vqp_sw_progress(f->devs[0]);
        for (i = 0; i < 3; ++i) {
            sw_test_ctrl(q[i], MLX5_OPCODE_NOP, 1, CU, 0);
            sw_test_ring(q[i], 1);
        }
        vqp_sw_progress(f->devs[0]);
        for (n = 0; (cqe = sw_test_cq_peek(&f->scq[0])) != NULL; ++n) {
            assert_int_equal(sw_test_cqe_opcode(cqe), MLX5_CQE_REQ);
            sw_test_cq_pop(&f->scq[0]);
        }
        assert_int_equal(n, 4);
    }
    for (i = 0; i < 2; ++i) {
        assert_int_equal(vqp_sw_qp_destroy(qa[i].qp), UCS_OK);
        assert_int_equal(vqp_sw_qp_destroy(qb[i].qp), UCS_OK);
    }
}

/* WQEs rung before the QP is destroyed are executed, as a NIC would have
 * done long before the destroy command: the peer gets the SEND and the
 * WRITE. After ERR a destroy executes nothing. */
static void test_destroy_runs_rung_wqes(void **state)
{
    fx_t *f = *state;
    struct mlx5_cqe64 cqe;
    vqp_sw_qp_attr_t qa;

    sw_test_post_recv(&f->qp[1], f->buf[1] + 100, 64, f->lkey[1]);
    memcpy(f->buf[0], "last words", 10);
    memset(f->buf[0] + 1024, 0x5a, 512);
    fx_send(f, 0, MLX5_OPCODE_SEND, 0, 10, 0);
    fx_write(f, 0, 1024, 2048, 512, 0);
    assert_int_equal(vqp_sw_qp_destroy(f->qp[0].qp), UCS_OK);
    f->qp[0].qp = NULL;
    assert_int_equal(fx_poll(f, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(be32toh(cqe.byte_cnt), 10);
    assert_memory_equal(f->buf[1] + 100, "last words", 10);
    assert_memory_equal(f->buf[1] + 2048, f->buf[0] + 1024, 512);

    /* The other way, after ERR: flushed, nothing reaches the peer. */
    memset(f->buf[1] + 4096, 0x33, 64);
    memset(f->buf[0] + 4096, 0x44, 64);
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_ERR;
    assert_int_equal(vqp_sw_qp_modify(f->qp[1].qp, &qa), UCS_OK);
    fx_write(f, 1, 4096, 4096, 64, 0);
    assert_int_equal(vqp_sw_qp_destroy(f->qp[1].qp), UCS_OK);
    f->qp[1].qp = NULL;
    assert_true(fx_cq_empty(f, 0, 1));
    assert_int_equal(f->buf[0][4096], 0x44);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_objects),
        cmocka_unit_test_setup_teardown(test_write_signaled_and_not, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_write_gather_inline_zero, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_write_run_merge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed_gather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_variants, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_inline_and_empty, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_atomics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_masked_atomics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nop_and_cq_wrap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sq_wraparound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_srq, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_runs_rung_wqes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_error_reset_reuse, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_destroy_first_of_three, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_progress_visits_all, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
