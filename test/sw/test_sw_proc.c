/*
 * Software device across processes (fork): a child opens its own device
 * instance, the two exchange addresses over pipes, and both progress their
 * own engines. Covers one-sided data movement with process_vm_*, atomics,
 * two-sided delivery, RNR across processes, a dead peer (transport retry
 * error, not a hang), stale segment cleanup and the vqp_sw_stat tool.
 */
#include <config.h>

#include "sw_test_util.h"

#include "sw/sw_int.h" /* segment header, to forge a stale one */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUF 65536

/* What each side tells the other. */
typedef struct peer_info {
    vqp_sw_dev_addr_t addr;
    uint32_t qpn;
    uint32_t rkey;
    uint64_t buf;
} peer_info_t;

typedef struct side {
    vqp_sw_dev_t *dev;
    sw_test_cq_t scq, rcq;
    sw_test_qp_t qp;
    uint8_t *buf;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
    peer_info_t peer;
} side_t;

typedef struct proc {
    pid_t child;
    int to_child, from_child;
} proc_t;

static int xwrite(int fd, const void *p, size_t n)
{
    return write(fd, p, n) == (ssize_t)n ? 0 : -1;
}

static int xread(int fd, void *p, size_t n)
{
    size_t got = 0;
    ssize_t r;

    while (got < n) {
        r = read(fd, (char *)p + got, n - got);
        if (r <= 0) {
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

static int side_open(side_t *s, uint8_t rnr_retry)
{
    memset(s, 0, sizeof(*s));
    s->buf = aligned_alloc(64, BUF);
    memset(s->buf, 0, BUF);
    if ((vqp_sw_dev_open("vqp_sw0", &s->dev) != UCS_OK) ||
        (vqp_sw_mr_reg(s->dev, s->buf, BUF, SW_TEST_ACCESS_ALL, &s->mr,
                       &s->lkey, &s->rkey) != UCS_OK) ||
        (sw_test_cq_create(s->dev, 256, &s->scq) != UCS_OK) ||
        (sw_test_cq_create(s->dev, 256, &s->rcq) != UCS_OK) ||
        (sw_test_qp_create(s->dev, &s->scq, &s->rcq, NULL, 64, 32, 64,
                           &s->qp) != UCS_OK)) {
        return -1;
    }
    (void)rnr_retry;
    return 0;
}

static void side_info(side_t *s, peer_info_t *info)
{
    vqp_sw_dev_address(s->dev, &info->addr);
    info->qpn  = s->qp.qpn;
    info->rkey = s->rkey;
    info->buf  = (uintptr_t)s->buf;
}

static int side_connect(side_t *s, uint8_t rnr_retry)
{
    return sw_test_qp_connect(&s->qp, &s->peer.addr, s->peer.qpn,
                              SW_TEST_ACCESS_ALL, rnr_retry, 3) == UCS_OK
               ? 0
               : -1;
}

static void side_close(side_t *s)
{
    vqp_sw_qp_destroy(s->qp.qp);
    vqp_sw_dev_close(s->dev);
    free(s->buf);
}

static int side_poll(side_t *s, sw_test_cq_t *cq, struct mlx5_cqe64 *cqe)
{
    return sw_test_poll(&s->dev, 1, cq, cqe, 3000);
}

/*
 * Child modes: 'e' echo: receive N messages, send each back with imm+1;
 * 'p' passive: progress until told to stop; 'x' exit right after connect
 * without closing (a crash as far as the device can tell).
 */
static int child_main(int rfd, int wfd)
{
    struct mlx5_cqe64 cqe;
    side_t s;
    char mode, stop;
    unsigned i, n;
    uint32_t len;
    int fl;

    if ((side_open(&s, 7) != 0)) {
        return 10;
    }
    side_info(&s, &s.peer); /* placeholder overwritten below */
    {
        peer_info_t me;

        side_info(&s, &me);
        if ((xwrite(wfd, &me, sizeof(me)) != 0) ||
            (xread(rfd, &s.peer, sizeof(s.peer)) != 0) ||
            (xread(rfd, &mode, 1) != 0) || (side_connect(&s, 7) != 0)) {
            return 11;
        }
    }
    for (i = 0; i < 16; ++i) {
        sw_test_post_recv(&s.qp, s.buf + i * 1024, 1024, s.lkey);
    }
    if (xwrite(wfd, "r", 1) != 0) {
        return 12;
    }
    if (mode == 'x') {
        _exit(0);
    }
    if (mode == 'c') {
        /* Collect: forward n responder CQEs and their first 64 bytes. */
        if (xread(rfd, &n, sizeof(n)) != 0) {
            return 20;
        }
        for (i = 0; i < n; ++i) {
            if ((side_poll(&s, &s.rcq, &cqe) != 0) ||
                (xwrite(wfd, &cqe, sizeof(cqe)) != 0) ||
                (xwrite(wfd, s.buf + (be16toh(cqe.wqe_counter) % 16) * 1024,
                        64) != 0) ||
                (xwrite(wfd, s.buf + 32768, 64) != 0)) {
                return 21;
            }
        }
    }
    if (mode == 'e') {
        if (xread(rfd, &n, sizeof(n)) != 0) {
            return 13;
        }
        for (i = 0; i < n; ++i) {
            if ((side_poll(&s, &s.rcq, &cqe) != 0) ||
                (sw_test_cqe_opcode(&cqe) != MLX5_CQE_RESP_SEND_IMM)) {
                return 14;
            }
            len = be32toh(cqe.byte_cnt);
            sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND_IMM, 2,
                         MLX5_WQE_CTRL_CQ_UPDATE,
                         htobe32(be32toh(cqe.imm_inval_pkey) + 1));
            if (be16toh(cqe.wqe_counter) != i) {
                return 16;
            }
            sw_test_dseg(&s.qp, 1, s.buf + (i % 16) * 1024, len, s.lkey);
            sw_test_ring(&s.qp, 2);
            if ((side_poll(&s, &s.scq, &cqe) != 0) ||
                (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
                return 15;
            }
            /* The reply is out: its buffer can take a message again. */
            sw_test_post_recv(&s.qp, s.buf + (i % 16) * 1024, 1024, s.lkey);
        }
    }
    /* Progress (one-sided ops need none, but be a good citizen) until the
     * parent says stop. */
    fl = fcntl(rfd, F_GETFL);
    fcntl(rfd, F_SETFL, fl | O_NONBLOCK);
    for (;;) {
        vqp_sw_progress(s.dev);
        /* A byte, or EOF: the parent is done or gone. */
        if (read(rfd, &stop, 1) >= 0) {
            break;
        }
        sched_yield();
    }
    side_close(&s);
    return 0;
}

static void proc_start(proc_t *p, side_t *s, char mode, uint8_t rnr_retry)
{
    int to_child[2], from_child[2];
    peer_info_t me;
    char c;

    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    p->child = fork();
    assert_true(p->child >= 0);
    if (p->child == 0) {
        /* Never outlive a test that failed half-way. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_child[1]);
        close(from_child[0]);
        int rc = child_main(to_child[0], from_child[1]);

        if (rc != 0) {
            fprintf(stderr, "child failed at step %d\n", rc);
        }
        _exit(rc);
    }
    close(to_child[0]);
    close(from_child[1]);
    p->to_child   = to_child[1];
    p->from_child = from_child[0];
    assert_int_equal(side_open(s, rnr_retry), 0);
    assert_int_equal(xread(p->from_child, &s->peer, sizeof(s->peer)), 0);
    side_info(s, &me);
    assert_int_equal(xwrite(p->to_child, &me, sizeof(me)), 0);
    assert_int_equal(xwrite(p->to_child, &mode, 1), 0);
    assert_int_equal(side_connect(s, rnr_retry), 0);
    assert_int_equal(xread(p->from_child, &c, 1), 0);
}

static void proc_stop(proc_t *p, side_t *s)
{
    int status;

    assert_int_equal(xwrite(p->to_child, "s", 1), 0);
    assert_int_equal(waitpid(p->child, &status, 0), p->child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(p->to_child);
    close(p->from_child);
    side_close(s);
}

static void test_one_sided(void **state)
{
    struct mlx5_cqe64 cqe;
    uint64_t *result;
    side_t s;
    proc_t p;
    unsigned i;

    proc_start(&p, &s, 'p', 7);
    /* WRITE 32 KiB into the child, READ it back into another range. */
    for (i = 0; i < 32768; ++i) {
        s.buf[i] = (uint8_t)(i * 7);
    }
    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_WRITE, 3, 0, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf + 1024, s.peer.rkey);
    sw_test_dseg(&s.qp, 2, s.buf, 32768, s.lkey);
    sw_test_ring(&s.qp, 3);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_READ, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf + 1024, s.peer.rkey);
    sw_test_dseg(&s.qp, 2, s.buf + 32768, 32768, s.lkey);
    sw_test_ring(&s.qp, 3);
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be32toh(cqe.byte_cnt), 32768);
    assert_memory_equal(s.buf, s.buf + 32768, 32768);

    /* Fetch-and-add twice on the child's first word (zeroed, then 5). */
    result = (uint64_t *)(s.buf + 100 * 8);
    for (i = 0; i < 2; ++i) {
        sw_test_ctrl(&s.qp, MLX5_OPCODE_ATOMIC_FA, 4, MLX5_WQE_CTRL_CQ_UPDATE,
                     0);
        sw_test_raddr(&s.qp, 1, s.peer.buf + BUF - 8, s.peer.rkey);
        sw_test_atomic(&s.qp, 2, 5, 0);
        sw_test_dseg(&s.qp, 3, result, 8, s.lkey);
        sw_test_ring(&s.qp, 4);
        assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be64toh(*result), 5 * i);
    }
    /* A bad rkey across processes: 0x13. */
    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf, s.peer.rkey + 1);
    sw_test_dseg(&s.qp, 2, s.buf, 8, s.lkey);
    sw_test_ring(&s.qp, 3);
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    proc_stop(&p, &s);
}

static void test_two_sided_echo(void **state)
{
    struct mlx5_cqe64 cqe;
    unsigned i, n = 40;
    side_t s;
    proc_t p;

    proc_start(&p, &s, 'e', 7);
    assert_int_equal(xwrite(p.to_child, &n, sizeof(n)), 0);
    for (i = 0; i < 16; ++i) {
        sw_test_post_recv(&s.qp, s.buf + 32768 + i * 1024, 1024, s.lkey);
    }
    for (i = 0; i < n; ++i) {
        memset(s.buf, 'a' + (i % 26), 100 + i);
        sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND_IMM, 2, MLX5_WQE_CTRL_CQ_UPDATE,
                     htobe32(i * 10));
        sw_test_dseg(&s.qp, 1, s.buf, 100 + i, s.lkey);
        sw_test_ring(&s.qp, 2);
        assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(side_poll(&s, &s.rcq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND_IMM);
        assert_int_equal(be32toh(cqe.imm_inval_pkey), i * 10 + 1);
        assert_int_equal(be32toh(cqe.byte_cnt), 100 + i);
        assert_int_equal(be32toh(cqe.flags_rqpn) & 0xffffff, s.peer.qpn);
        assert_int_equal(be16toh(cqe.wqe_counter), i);
        assert_memory_equal(s.buf + 32768 + (i % 16) * 1024, s.buf, 100 + i);
        sw_test_post_recv(&s.qp, s.buf + 32768 + (i % 16) * 1024, 1024, s.lkey);
    }
    proc_stop(&p, &s);
}

/* Every two-sided opcode and ATOMIC_CS across processes: the child sends
 * back each responder CQE with the received bytes. */
static void test_two_sided_opcodes(void **state)
{
    struct mlx5_cqe64 cqe, rcqe;
    uint8_t data[64], wdata[64];
    uint64_t *result;
    unsigned n = 3;
    side_t s;
    proc_t p;

    proc_start(&p, &s, 'c', 7);
    assert_int_equal(xwrite(p.to_child, &n, sizeof(n)), 0);
    memcpy(s.buf, "plain-send", 10);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_dseg(&s.qp, 1, s.buf, 10, s.lkey);
    sw_test_ring(&s.qp, 2);
    memcpy(s.buf + 100, "write-with-imm", 14);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_WRITE_IMM, 3, MLX5_WQE_CTRL_CQ_UPDATE,
                 htobe32(0xabc));
    sw_test_raddr(&s.qp, 1, s.peer.buf + 32768, s.peer.rkey);
    sw_test_dseg(&s.qp, 2, s.buf + 100, 14, s.lkey);
    sw_test_ring(&s.qp, 3);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_NOP, 1, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_ring(&s.qp, 1);
    /* CS on the child's last word (0): matches, swaps in 9. */
    result = (uint64_t *)(s.buf + 512);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_ATOMIC_CS, 4, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf + BUF - 8, s.peer.rkey);
    sw_test_atomic(&s.qp, 2, 9, 0);
    sw_test_dseg(&s.qp, 3, result, 8, s.lkey);
    sw_test_ring(&s.qp, 4);
    memcpy(s.buf + 200, "second", 6);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND_IMM, 2, MLX5_WQE_CTRL_CQ_UPDATE,
                 htobe32(7));
    sw_test_dseg(&s.qp, 1, s.buf + 200, 6, s.lkey);
    sw_test_ring(&s.qp, 2);
    /* Requester side: five CQEs in posting order. */
    {
        static const uint8_t ops[5] = {
            MLX5_OPCODE_SEND, MLX5_OPCODE_RDMA_WRITE_IMM, MLX5_OPCODE_NOP,
            MLX5_OPCODE_ATOMIC_CS, MLX5_OPCODE_SEND_IMM};
        unsigned i;

        for (i = 0; i < 5; ++i) {
            assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
            assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
            assert_int_equal(be32toh(cqe.sop_drop_qpn) >> 24, ops[i]);
        }
    }
    assert_int_equal(be64toh(*result), 0);
    /* Responder side, as the child saw it. */
    assert_int_equal(xread(p.from_child, &rcqe, sizeof(rcqe)), 0);
    assert_int_equal(xread(p.from_child, data, 64), 0);
    assert_int_equal(xread(p.from_child, wdata, 64), 0);
    assert_int_equal(sw_test_cqe_opcode(&rcqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(be32toh(rcqe.byte_cnt), 10);
    assert_int_equal(be32toh(rcqe.flags_rqpn) & 0xffffff, s.qp.qpn);
    assert_memory_equal(data, "plain-send", 10);
    assert_int_equal(xread(p.from_child, &rcqe, sizeof(rcqe)), 0);
    assert_int_equal(xread(p.from_child, data, 64), 0);
    assert_int_equal(xread(p.from_child, wdata, 64), 0);
    assert_int_equal(sw_test_cqe_opcode(&rcqe), MLX5_CQE_RESP_WR_IMM);
    assert_int_equal(be32toh(rcqe.imm_inval_pkey), 0xabc);
    assert_int_equal(be32toh(rcqe.byte_cnt), 14);
    assert_int_equal(be16toh(rcqe.wqe_counter), 1);
    assert_memory_equal(wdata, "write-with-imm", 14);
    assert_int_equal(xread(p.from_child, &rcqe, sizeof(rcqe)), 0);
    assert_int_equal(xread(p.from_child, data, 64), 0);
    assert_int_equal(xread(p.from_child, wdata, 64), 0);
    assert_int_equal(sw_test_cqe_opcode(&rcqe), MLX5_CQE_RESP_SEND_IMM);
    assert_int_equal(be32toh(rcqe.imm_inval_pkey), 7);
    assert_int_equal(be16toh(rcqe.wqe_counter), 2);
    assert_memory_equal(data, "second", 6);
    /* The CS landed in the child's memory: read it back. */
    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_READ, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf + BUF - 8, s.peer.rkey);
    sw_test_dseg(&s.qp, 2, result, 8, s.lkey);
    sw_test_ring(&s.qp, 3);
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(*result, 9);
    proc_stop(&p, &s);
}

/* Masked (extended) atomics on another process's memory, several in flight:
 * each operation UCX builds from them on 4 and 8 bytes, mixed with plain
 * 8-byte ones on the same words; results big-endian in their size; final
 * values read back with RDMA READ. */
static void test_masked_atomics_across(void **state)
{
    const uint8_t CS = MLX5_OPCODE_ATOMIC_MASKED_CS;
    const uint8_t FA = MLX5_OPCODE_ATOMIC_MASKED_FA;
    /* The child's buffer is zeroed: w64 = child word BUF-16, the 4-byte
     * words are its halves (host order, little-endian here) and BUF-8. */
    const uint64_t w64 = 16, w32 = 8;
    struct mlx5_cqe64 cqe;
    uint8_t *res;
    uint32_t r32[8];
    uint64_t r64[8], *back;
    unsigned i, n = 0;
    side_t s;
    proc_t p;

    (void)state;
    proc_start(&p, &s, 'p', 7);
    res  = s.buf + 4096;
    back = (uint64_t *)(s.buf + 8192);
    memset(res, 0xee, 128);
#define RES(_i) (res + 16 * (_i))
    /* 4 bytes at BUF-8: fadd 7 -> 7, swap 0x100 -> 0x100, cswap miss,
     * cswap hit -> 0x1ff, and 0xf0 -> 0xf0, or 0x3 -> 0xf3, xor 0xff ->
     * 0x0c. */
    sw_test_masked(&s.qp, FA, 0x8, 4, 4, s.peer.buf + BUF - w32, s.peer.rkey, 7,
                   0, 0, 0, RES(n++), 4, s.lkey);
    sw_test_masked(&s.qp, CS, 0x8, 4, 4, s.peer.buf + BUF - w32, s.peer.rkey,
                   0x100, 0, ~0u, 0, RES(n++), 4, s.lkey);
    sw_test_masked(&s.qp, CS, 0x8, 4, 4, s.peer.buf + BUF - w32, s.peer.rkey,
                   0x1ff, 0x101, ~0u, ~0u, RES(n++), 4, s.lkey);
    sw_test_masked(&s.qp, CS, 0x8, 4, 4, s.peer.buf + BUF - w32, s.peer.rkey,
                   0x1ff, 0x100, ~0u, ~0u, RES(n++), 4, s.lkey);
    sw_test_masked(&s.qp, CS, 0x8, 4, 4, s.peer.buf + BUF - w32, s.peer.rkey,
                   0xf0, 0, ~0xf0u, 0, RES(n++), 4, s.lkey);
    sw_test_masked(&s.qp, CS, 0x8, 4, 4, s.peer.buf + BUF - w32, s.peer.rkey,
                   0x3, 0, 0x3, 0, RES(n++), 4, s.lkey);
    sw_test_masked(&s.qp, FA, 0x8, 4, 4, s.peer.buf + BUF - w32, s.peer.rkey,
                   0xff, ~0u, 0, 0, RES(n++), 4, s.lkey);
    for (i = 0; i < n; ++i) {
        assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        memcpy(&r32[i], RES(i), 4);
        assert_int_equal(RES(i)[4], 0xee);
    }
    assert_int_equal(be32toh(r32[0]), 0);
    assert_int_equal(be32toh(r32[1]), 7);
    assert_int_equal(be32toh(r32[2]), 0x100);
    assert_int_equal(be32toh(r32[3]), 0x100);
    assert_int_equal(be32toh(r32[4]), 0x1ff);
    assert_int_equal(be32toh(r32[5]), 0xf0);
    assert_int_equal(be32toh(r32[6]), 0xf3);

    /* 8 bytes at BUF-16: plain fadd 5, masked swap, masked fadd with a
     * carry into the high half, masked xor, masked cswap on the low 4
     * bytes of its high half, then a 4-byte fadd on its high half. */
    n = 0;
    sw_test_ctrl(&s.qp, MLX5_OPCODE_ATOMIC_FA, 4, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf + BUF - w64, s.peer.rkey);
    sw_test_atomic(&s.qp, 2, 5, 0);
    sw_test_dseg(&s.qp, 3, RES(n++), 8, s.lkey);
    sw_test_ring(&s.qp, 4);
    sw_test_masked(&s.qp, CS, 0x9, 8, 5, s.peer.buf + BUF - w64, s.peer.rkey,
                   0xfffffffffull, 0, ~0ull, 0, RES(n++), 8, s.lkey);
    sw_test_masked(&s.qp, FA, 0x9, 8, 4, s.peer.buf + BUF - w64, s.peer.rkey, 1,
                   0, 0, 0, RES(n++), 8, s.lkey);
    sw_test_masked(&s.qp, FA, 0x9, 8, 4, s.peer.buf + BUF - w64, s.peer.rkey,
                   0xff000000000000ffull, ~0ull, 0, 0, RES(n++), 8, s.lkey);
    sw_test_masked(&s.qp, CS, 0x9, 8, 5, s.peer.buf + BUF - w64, s.peer.rkey,
                   0x1234ull << 32, 0x10ull << 32, ~0ull << 32, 0xffffull << 32,
                   RES(n++), 8, s.lkey);
    sw_test_masked(&s.qp, FA, 0x8, 4, 4, s.peer.buf + BUF - w64 + 4,
                   s.peer.rkey, 1, 0, 0, 0, RES(n++), 4, s.lkey);
    for (i = 0; i < n; ++i) {
        assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        memcpy(&r64[i], RES(i), 8);
    }
    assert_int_equal(be64toh(r64[0]), 0);
    assert_int_equal(be64toh(r64[1]), 5);
    assert_int_equal(be64toh(r64[2]), 0xfffffffffull);
    assert_int_equal(be64toh(r64[3]), 0x1000000000ull);
    assert_int_equal(be64toh(r64[4]), 0xff000010000000ffull);
    memcpy(&r32[0], RES(5), 4);
    assert_int_equal(be32toh(r32[0]), 0x1234);
    assert_int_equal(RES(5)[4], 0xee);

    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_READ, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf + BUF - 16, s.peer.rkey);
    sw_test_dseg(&s.qp, 2, back, 16, s.lkey);
    sw_test_ring(&s.qp, 3);
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(back[0], 0x00001235000000ffull);
    memcpy(&r32[0], (uint8_t *)back + 8, 4);
    assert_int_equal(r32[0], 0x0c);
#undef RES
    proc_stop(&p, &s);
}

/* Child posted 16 receives; the 17th SEND waits in RNR (rnr_retry 7) until
 * the child reposts, which it does only while echoing. Here: the child is
 * passive, so rnr_retry 1 ends in 0x16 after the 16 that fit. */
static void test_rnr_across(void **state)
{
    struct mlx5_cqe64 cqe;
    vqp_sw_qp_counters_t c;
    unsigned i;
    side_t s;
    proc_t p;

    proc_start(&p, &s, 'p', 1);
    for (i = 0; i < 17; ++i) {
        sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 1, MLX5_WQE_CTRL_CQ_UPDATE, 0);
        sw_test_ring(&s.qp, 1);
    }
    for (i = 0; i < 16; ++i) {
        assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    }
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
    assert_int_equal(be16toh(cqe.wqe_counter), 16);
    vqp_sw_qp_counters(s.qp.qp, &c);
    assert_int_equal(c.rnr_retries, 1);
    proc_stop(&p, &s);
}

static int shm_exists(const vqp_sw_dev_addr_t *a)
{
    char name[96];
    struct stat st;

    snprintf(name, sizeof(name), "/dev/shm/vqp_sw.%s-%u-%u-%u",
             getenv("VQP_SW_NAMESPACE"), getuid(), a->pid, a->instance);
    return stat(name, &st) == 0;
}

static int run_stat(const char *args, char *out, size_t len)
{
    char cmd[512];
    size_t n;
    FILE *f;

    snprintf(cmd, sizeof(cmd), "%s %s", VQP_SW_STAT, args);
    f = popen(cmd, "r");
    if (f == NULL) {
        return -1;
    }
    n      = fread(out, 1, len - 1, f);
    out[n] = '\0';
    return pclose(f);
}

/* The child dies without closing: WRITEs end in 0x15 (not a hang), its
 * segment is stale, the tool reports and removes it, and a new open
 * would too. */
static void test_dead_peer(void **state)
{
    struct mlx5_cqe64 cqe;
    char out[16384], needle[128];
    int status;
    side_t s;
    proc_t p;

    proc_start(&p, &s, 'x', 7);
    assert_int_equal(waitpid(p.child, &status, 0), p.child);
    assert_true(shm_exists(&s.peer.addr));
    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, s.peer.buf, s.peer.rkey);
    sw_test_dseg(&s.qp, 2, s.buf, 64, s.lkey);
    sw_test_ring(&s.qp, 3);
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);

    /* The tool lists our live device with its QP, and the dead one. */
    assert_int_equal(run_stat("", out, sizeof(out)), 0);
    snprintf(needle, sizeof(needle), "pid %u instance %u alive",
             s.peer.addr.pid, s.peer.addr.instance);
    assert_null(strstr(out, needle));
    snprintf(needle, sizeof(needle), "pid %u instance %u stale",
             s.peer.addr.pid, s.peer.addr.instance);
    assert_non_null(strstr(out, needle));
    snprintf(needle, sizeof(needle), "qp 0x%06x ERR", s.qp.qpn);
    assert_non_null(strstr(out, needle));
    assert_non_null(strstr(out, "retries 3"));
    assert_non_null(strstr(out, " staged 0/")); /* nothing waits staged */
    assert_int_equal(run_stat("--clean", out, sizeof(out)), 0);
    assert_false(shm_exists(&s.peer.addr));
    assert_non_null(strstr(out, "removed"));
    assert_int_equal(run_stat("--bogus", out, sizeof(out)) >> 8, 2);
    close(p.to_child);
    close(p.from_child);
    side_close(&s);
}

/* SEND to a peer that died with receives posted: the payload cannot be
 * placed (the process is gone), so it ends in 0x15 too, never a success. */
static void test_dead_peer_send(void **state)
{
    struct mlx5_cqe64 cqe;
    int status;
    side_t s;
    proc_t p;

    proc_start(&p, &s, 'x', 7);
    assert_int_equal(waitpid(p.child, &status, 0), p.child);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_dseg(&s.qp, 1, s.buf, 64, s.lkey);
    sw_test_ring(&s.qp, 2);
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
    close(p.to_child);
    close(p.from_child);
    side_close(&s);

    /* The same without payload: nothing to place, still not a success. */
    proc_start(&p, &s, 'x', 7);
    assert_int_equal(waitpid(p.child, &status, 0), p.child);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 1, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_ring(&s.qp, 1);
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
    close(p.to_child);
    close(p.from_child);
    side_close(&s);
}

/* A zero-length WRITE moves nothing but still needs the responder's
 * acknowledgement: to a dead peer it ends in 0x15 (keepalive probes). */
static void test_dead_peer_zero_write(void **state)
{
    struct mlx5_cqe64 cqe;
    int status;
    side_t s;
    proc_t p;

    proc_start(&p, &s, 'x', 7);
    assert_int_equal(waitpid(p.child, &status, 0), p.child);
    sw_test_ctrl(&s.qp, MLX5_OPCODE_RDMA_WRITE, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(&s.qp, 1, 0, 0);
    sw_test_ring(&s.qp, 2);
    assert_int_equal(side_poll(&s, &s.scq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
    close(p.to_child);
    close(p.from_child);
    side_close(&s);
}

/* A crashed owner's segment is removed when any process opens a device. */
static void test_stale_cleanup_on_open(void **state)
{
    vqp_sw_dev_addr_t addr;
    vqp_sw_dev_t *dev;
    int fds[2], status;
    pid_t child;

    assert_int_equal(pipe(fds), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        if (vqp_sw_dev_open("vqp_sw0", &dev) != UCS_OK) {
            _exit(1);
        }
        vqp_sw_dev_address(dev, &addr);
        xwrite(fds[1], &addr, sizeof(addr));
        kill(getpid(), SIGKILL);
    }
    close(fds[1]);
    assert_int_equal(xread(fds[0], &addr, sizeof(addr)), 0);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status));
    assert_true(shm_exists(&addr));
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev), UCS_OK);
    assert_false(shm_exists(&addr));
    vqp_sw_dev_close(dev);
    close(fds[0]);
}

#define SRQ_MSGS 300

/* Sender child for the shared-SRQ test: SRQ_MSGS SENDs of {id, seq}. */
static int srq_child_main(int rfd, int wfd, uint32_t id)
{
    struct mlx5_cqe64 cqe;
    uint32_t msg[2], done = 0, i;
    peer_info_t me;
    side_t s;

    if (side_open(&s, 7) != 0) {
        return 30;
    }
    side_info(&s, &me);
    if ((xwrite(wfd, &me, sizeof(me)) != 0) ||
        (xread(rfd, &s.peer, sizeof(s.peer)) != 0) ||
        (side_connect(&s, 7) != 0)) {
        return 31;
    }
    for (i = 0; i < SRQ_MSGS; ++i) {
        msg[0] = id;
        msg[1] = i;
        /* Inline: the payload travels in the WQE. */
        sw_test_inline(&s.qp, 1, msg, sizeof(msg));
        sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 2,
                     ((i % 16) == 15) || (i == SRQ_MSGS - 1)
                         ? MLX5_WQE_CTRL_CQ_UPDATE
                         : 0,
                     0);
        sw_test_ring(&s.qp, 2);
        /* At most 32 in flight: wait for a signaled completion. */
        while (i + 1 - done > 32) {
            if ((side_poll(&s, &s.scq, &cqe) != 0) ||
                (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
                return 32;
            }
            done = be16toh(cqe.wqe_counter) + 1;
        }
    }
    while (done < SRQ_MSGS) {
        if ((side_poll(&s, &s.scq, &cqe) != 0) ||
            (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
            return 33;
        }
        done = be16toh(cqe.wqe_counter) + 1;
    }
    if (xread(rfd, msg, 1) != 0) { /* parent done */
        return 34;
    }
    side_close(&s);
    return 0;
}

/* Two sender processes into one SRQ at the same time: every message
 * arrives exactly once, in order per sender, and SRQ entries recycle. */
static void test_srq_two_senders(void **state)
{
    enum { N_CHILD = 2, N_ENTRIES = 32 };
    int to_child[N_CHILD][2], from_child[N_CHILD][2], status;
    uint32_t next[N_CHILD] = {0, 0}, msg[2], got = 0;
    sw_test_qp_t qp[N_CHILD];
    uint8_t *ebuf[64] = {NULL}, *buf;
    struct mlx5_cqe64 cqe;
    sw_test_srq_t srq;
    peer_info_t peer, me;
    pid_t child[N_CHILD];
    uint16_t idx;
    unsigned i;
    side_t s;

    assert_int_equal(side_open(&s, 7), 0);
    memset(&srq, 0, sizeof(srq));
    assert_int_equal(vqp_sw_srq_create(s.dev, N_ENTRIES, 1, &srq.srq, &srq.dv),
                     UCS_OK);
    /* Entry index -> its buffer: recycled entries move around the list. */
    for (i = 0; i < N_ENTRIES; ++i) {
        ebuf[sw_test_srq_post(&srq, s.buf + i * 64, 64, s.lkey)] =
            s.buf + i * 64;
    }
    for (i = 0; i < N_CHILD; ++i) {
        assert_int_equal(pipe(to_child[i]), 0);
        assert_int_equal(pipe(from_child[i]), 0);
        child[i] = fork();
        assert_true(child[i] >= 0);
        if (child[i] == 0) {
            int rc;

            prctl(PR_SET_PDEATHSIG, SIGKILL);
            rc = srq_child_main(to_child[i][0], from_child[i][1], i);

            if (rc != 0) {
                fprintf(stderr, "srq child %u failed at step %d\n", i, rc);
            }
            _exit(rc);
        }
        assert_int_equal(xread(from_child[i][0], &peer, sizeof(peer)), 0);
        assert_int_equal(
            sw_test_qp_create(s.dev, &s.scq, &s.rcq, &srq, 8, 0, 0, &qp[i]),
            UCS_OK);
        assert_int_equal(sw_test_qp_connect(&qp[i], &peer.addr, peer.qpn,
                                            SW_TEST_ACCESS_ALL, 7, 3),
                         UCS_OK);
        side_info(&s, &me);
        me.qpn = qp[i].qpn;
        assert_int_equal(xwrite(to_child[i][1], &me, sizeof(me)), 0);
    }
    while (got < N_CHILD * SRQ_MSGS) {
        assert_int_equal(side_poll(&s, &s.rcq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
        assert_int_equal(be32toh(cqe.byte_cnt), sizeof(msg));
        idx = be16toh(cqe.wqe_counter);
        assert_true(idx < 64);
        assert_non_null(ebuf[idx]);
        memcpy(msg, ebuf[idx], sizeof(msg));
        assert_true(msg[0] < N_CHILD);
        assert_int_equal(sw_test_cqe_qpn(&cqe), qp[msg[0]].qpn);
        assert_int_equal(msg[1], next[msg[0]]);
        ++next[msg[0]];
        ++got;
        buf       = ebuf[idx];
        ebuf[idx] = NULL;
        sw_test_srq_free(&srq, idx);
        ebuf[sw_test_srq_post(&srq, buf, 64, s.lkey)] = buf;
    }
    for (i = 0; i < N_CHILD; ++i) {
        assert_int_equal(xwrite(to_child[i][1], "d", 1), 0);
        assert_int_equal(waitpid(child[i], &status, 0), child[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        close(to_child[i][1]);
        close(from_child[i][0]);
        vqp_sw_qp_destroy(qp[i].qp);
    }
    assert_int_equal(vqp_sw_srq_destroy(srq.srq), UCS_OK);
    side_close(&s);
}

#define ATOM_OPS 300

/* Child of the atomics race: ATOM_OPS atomics on the parent's word at
 * offset 0, cycling through an 8-byte ATOMIC_FA of 1 << 32, a 4-byte
 * MASKED_FA of 1 on the low half and an 8-byte MASKED_FA of 1 << 32; each
 * waits for its completion. */
static int atom_child_main(int rfd, int wfd)
{
    struct mlx5_cqe64 cqe;
    uint8_t *res;
    peer_info_t me;
    unsigned i;
    side_t s;

    if (side_open(&s, 7) != 0) {
        return 40;
    }
    side_info(&s, &me);
    if ((xwrite(wfd, &me, sizeof(me)) != 0) ||
        (xread(rfd, &s.peer, sizeof(s.peer)) != 0) ||
        (side_connect(&s, 7) != 0) || (xwrite(wfd, "r", 1) != 0) ||
        (xread(rfd, &me, 1) != 0)) { /* both children connected: go */
        return 41;
    }
    res = s.buf + 64;
    for (i = 0; i < ATOM_OPS; ++i) {
        switch (i % 3) {
        case 0:
            sw_test_ctrl(&s.qp, MLX5_OPCODE_ATOMIC_FA, 4,
                         MLX5_WQE_CTRL_CQ_UPDATE, 0);
            sw_test_raddr(&s.qp, 1, s.peer.buf, s.peer.rkey);
            sw_test_atomic(&s.qp, 2, 1ull << 32, 0);
            sw_test_dseg(&s.qp, 3, res, 8, s.lkey);
            sw_test_ring(&s.qp, 4);
            break;
        case 1:
            sw_test_masked(&s.qp, MLX5_OPCODE_ATOMIC_MASKED_FA, 0x8, 4, 4,
                           s.peer.buf, s.peer.rkey, 1, 0, 0, 0, res, 4, s.lkey);
            break;
        default:
            sw_test_masked(&s.qp, MLX5_OPCODE_ATOMIC_MASKED_FA, 0x9, 8, 4,
                           s.peer.buf, s.peer.rkey, 1ull << 32, 0, 0, 0, res, 8,
                           s.lkey);
            break;
        }
        if ((side_poll(&s, &s.scq, &cqe) != 0) ||
            (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
            return 42;
        }
    }
    if ((xwrite(wfd, "d", 1) != 0) || (xread(rfd, &me, 1) != 0)) {
        return 43;
    }
    side_close(&s);
    return 0;
}

/* Two processes hammer one 8-byte word of a third with basic and masked
 * atomics of both sizes at once: the target's lock makes every
 * read-modify-write atomic with respect to all the others, so no update is
 * lost (the low half counts the 4-byte adds, the high half the 8-byte
 * ones). */
static void test_atomics_two_requesters(void **state)
{
    enum { N_CHILD = 2 };
    int to_child[N_CHILD][2], from_child[N_CHILD][2], status;
    sw_test_qp_t qp[N_CHILD];
    peer_info_t peer, me;
    pid_t child[N_CHILD];
    uint64_t word;
    unsigned i;
    char c;
    side_t s;

    (void)state;
    assert_int_equal(side_open(&s, 7), 0);
    for (i = 0; i < N_CHILD; ++i) {
        assert_int_equal(pipe(to_child[i]), 0);
        assert_int_equal(pipe(from_child[i]), 0);
        child[i] = fork();
        assert_true(child[i] >= 0);
        if (child[i] == 0) {
            int rc;

            prctl(PR_SET_PDEATHSIG, SIGKILL);
            rc = atom_child_main(to_child[i][0], from_child[i][1]);
            if (rc != 0) {
                fprintf(stderr, "atomics child %u failed at step %d\n", i, rc);
            }
            _exit(rc);
        }
        assert_int_equal(xread(from_child[i][0], &peer, sizeof(peer)), 0);
        assert_int_equal(
            sw_test_qp_create(s.dev, &s.scq, &s.rcq, NULL, 8, 8, 0, &qp[i]),
            UCS_OK);
        assert_int_equal(sw_test_qp_connect(&qp[i], &peer.addr, peer.qpn,
                                            SW_TEST_ACCESS_ALL, 7, 3),
                         UCS_OK);
        side_info(&s, &me);
        me.qpn = qp[i].qpn;
        assert_int_equal(xwrite(to_child[i][1], &me, sizeof(me)), 0);
        assert_int_equal(xread(from_child[i][0], &c, 1), 0);
    }
    for (i = 0; i < N_CHILD; ++i) {
        assert_int_equal(xwrite(to_child[i][1], "g", 1), 0);
    }
    for (i = 0; i < N_CHILD; ++i) {
        assert_int_equal(xread(from_child[i][0], &c, 1), 0);
        assert_int_equal(c, 'd');
    }
    __atomic_load(&((uint64_t *)s.buf)[0], &word, __ATOMIC_ACQUIRE);
    assert_int_equal(word >> 32, N_CHILD * (ATOM_OPS - ATOM_OPS / 3));
    assert_int_equal(word & 0xffffffff, N_CHILD * (ATOM_OPS / 3));
    for (i = 0; i < N_CHILD; ++i) {
        assert_int_equal(xwrite(to_child[i][1], "e", 1), 0);
        assert_int_equal(waitpid(child[i], &status, 0), child[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        close(to_child[i][1]);
        close(from_child[i][0]);
        vqp_sw_qp_destroy(qp[i].qp);
    }
    side_close(&s);
}

/* A leftover with our own pid (pid reuse after a crash) but another start
 * time is removed on open; our live devices are not. */
static void test_stale_own_pid(void **state)
{
    vqp_sw_dev_addr_t addr, live;
    vqp_sw_dev_t *dev, *keep;
    char name[96];
    vqp_sw_shm_t *hdr;
    int fd;

    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &keep), UCS_OK);
    vqp_sw_dev_address(keep, &live);
    /* Forge a header: our pid, another start time. */
    addr.pid      = (uint32_t)getpid();
    addr.instance = 999999;
    snprintf(name, sizeof(name), "/vqp_sw.%s-%u-%u-%u",
             getenv("VQP_SW_NAMESPACE"), getuid(), addr.pid, addr.instance);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    hdr             = calloc(1, sizeof(*hdr));
    hdr->magic      = VQP_SW_MAGIC;
    hdr->version    = VQP_SW_VERSION;
    hdr->hdr_size   = sizeof(*hdr);
    hdr->pid        = addr.pid;
    hdr->start_time = 1;
    hdr->alive      = 1;
    assert_int_equal(pwrite(fd, hdr, sizeof(*hdr), 0), (ssize_t)sizeof(*hdr));
    free(hdr);
    close(fd);
    assert_true(shm_exists(&addr));
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &dev), UCS_OK);
    assert_false(shm_exists(&addr));
    assert_true(shm_exists(&live));
    vqp_sw_dev_close(dev);
    vqp_sw_dev_close(keep);
}

/* A segment of another format version is refused at connect, with the
 * reason, not mapped and misread. */
static void test_peer_format_mismatch(void **state)
{
    vqp_sw_dev_addr_t addr;
    vqp_sw_qp_attr_t qa;
    vqp_sw_shm_t *hdr;
    side_t s;
    char name[96];
    int fd;

    assert_int_equal(side_open(&s, 7), 0);
    addr.pid      = (uint32_t)getpid();
    addr.instance = 888888;
    snprintf(name, sizeof(name), "/vqp_sw.%s-%u-%u-%u",
             getenv("VQP_SW_NAMESPACE"), getuid(), addr.pid, addr.instance);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    hdr             = calloc(1, sizeof(*hdr));
    hdr->magic      = VQP_SW_MAGIC;
    hdr->version    = VQP_SW_VERSION + 1;
    hdr->hdr_size   = sizeof(*hdr);
    hdr->pid        = addr.pid;
    hdr->start_time = vqp_sw_proc_start_time(addr.pid);
    hdr->alive      = 1;
    assert_int_equal(pwrite(fd, hdr, sizeof(*hdr), 0), (ssize_t)sizeof(*hdr));
    free(hdr);
    close(fd);
    sw_test_log_buf[0] = '\0';
    ucs_log_push_handler(sw_test_log_handler);
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_INIT;
    assert_int_equal(vqp_sw_qp_modify(s.qp.qp, &qa), UCS_OK);
    qa.qp_state    = IBV_QPS_RTR;
    qa.dest_dev    = addr;
    qa.dest_qp_num = 0x400;
    assert_int_equal(vqp_sw_qp_modify(s.qp.qp, &qa), UCS_ERR_UNREACHABLE);
    ucs_log_pop_handler();
    snprintf(name, sizeof(name), "has another format (version %u",
             VQP_SW_VERSION + 1);
    assert_true(sw_test_log_has(name));
    snprintf(name, sizeof(name), "/vqp_sw.%s-%u-%u-%u",
             getenv("VQP_SW_NAMESPACE"), getuid(), addr.pid, addr.instance);
    shm_unlink(name);
    side_close(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_sided),
        cmocka_unit_test(test_two_sided_echo),
        cmocka_unit_test(test_two_sided_opcodes),
        cmocka_unit_test(test_masked_atomics_across),
        cmocka_unit_test(test_rnr_across),
        cmocka_unit_test(test_srq_two_senders),
        cmocka_unit_test(test_atomics_two_requesters),
        cmocka_unit_test(test_dead_peer),
        cmocka_unit_test(test_dead_peer_send),
        cmocka_unit_test(test_dead_peer_zero_write),
        cmocka_unit_test(test_stale_cleanup_on_open),
        cmocka_unit_test(test_stale_own_pid),
        cmocka_unit_test(test_peer_format_mismatch),
    };
    char ns[32];

    /* Our own namespace: devices other tests open meanwhile must not clean
     * (or list) the stale segments these tests look at. */
    snprintf(ns, sizeof(ns), "swproc%u", (unsigned)getpid());
    setenv("VQP_SW_NAMESPACE", ns, 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
