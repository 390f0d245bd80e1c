/*
 * Software device: UD QPs. Datagrams both ways between two processes
 * (payload behind the 40-byte GRH, byte count, source QPN, immediate, the
 * GRH's GIDs), replies addressed from the GRH; and in one process (two
 * device instances): drops for a wrong qkey, QPN, QP type or state, no
 * receive, a dead or closed destination (sender completes successfully and
 * counts the drop); errors for a wrong opcode, a bad datagram segment, a
 * payload above the MTU, a bad lkey (QP to SQE, RQ still working, SQE ->
 * RTS), a receive too small (receiver's error CQE); the modify rules of UD;
 * ud_drop / ud_dup fault injection repeating exactly for a seed; a
 * destination whose segment lock is held elsewhere (the datagram waits, is
 * neither dropped nor lost).
 */
#include <config.h>

#include "sw_test_lock.h"
#include "sw_test_util.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUF   65536
#define RBUF  8192 /* receive buffer size (GRH + up to the MTU and more) */
#define NRECV 6    /* receive buffers at the start of buf */
#define QKEY  0x1234567u
#define GRH   VQP_SW_UD_GRH
#define CU    MLX5_WQE_CTRL_CQ_UPDATE

typedef struct ud_side {
    vqp_sw_dev_t *dev;
    vqp_sw_dev_addr_t addr;
    sw_test_cq_t scq, rcq;
    sw_test_qp_t qp;
    uint8_t *buf;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
} ud_side_t;

/* What a process tells the other. */
typedef struct ud_info {
    vqp_sw_dev_addr_t addr;
    uint32_t qpn;
} ud_info_t;

static ucs_status_t ud_qp_modify(sw_test_qp_t *q, enum ibv_qp_state state,
                                 uint32_t qkey)
{
    vqp_sw_qp_attr_t a;

    memset(&a, 0, sizeof(a));
    a.qp_state = state;
    a.qkey     = qkey;
    return vqp_sw_qp_modify(q->qp, &a);
}

/* UD QP of 64 send BBs, 64 receives of 1 SGE, max_inline 512, in RTS. */
static ucs_status_t ud_qp_make(vqp_sw_dev_t *dev, sw_test_cq_t *scq,
                               sw_test_cq_t *rcq, uint32_t qkey,
                               sw_test_qp_t *q)
{
    vqp_sw_qp_init_attr_t attr;
    ucs_status_t status;

    memset(q, 0, sizeof(*q));
    memset(&attr, 0, sizeof(attr));
    attr.send_cq         = scq->cq;
    attr.recv_cq         = rcq->cq;
    attr.max_send_wr     = 64;
    attr.max_recv_wr     = 64;
    attr.max_recv_sge    = 1;
    attr.max_inline_data = 512;
    status = vqp_sw_ud_qp_create(dev, &attr, &q->qp, &q->dv, &q->qpn);
    if (status == UCS_OK) {
        status = ud_qp_modify(q, IBV_QPS_INIT, qkey);
    }
    if (status == UCS_OK) {
        status = ud_qp_modify(q, IBV_QPS_RTR, 0);
    }
    if (status == UCS_OK) {
        status = ud_qp_modify(q, IBV_QPS_RTS, 0);
    }
    return status;
}

static int ud_open(ud_side_t *s)
{
    memset(s, 0, sizeof(*s));
    s->buf = aligned_alloc(64, BUF);
    memset(s->buf, 0, BUF);
    if ((vqp_sw_dev_open("vqp_sw0", &s->dev) != UCS_OK) ||
        (vqp_sw_mr_reg(s->dev, s->buf, BUF, SW_TEST_ACCESS_ALL, &s->mr,
                       &s->lkey, &s->rkey) != UCS_OK) ||
        (sw_test_cq_create(s->dev, 256, &s->scq) != UCS_OK) ||
        (sw_test_cq_create(s->dev, 256, &s->rcq) != UCS_OK) ||
        (ud_qp_make(s->dev, &s->scq, &s->rcq, QKEY, &s->qp) != UCS_OK)) {
        return -1;
    }
    vqp_sw_dev_address(s->dev, &s->addr);
    return 0;
}

static void ud_close(ud_side_t *s)
{
    if (s->dev != NULL) {
        vqp_sw_qp_destroy(s->qp.qp);
        vqp_sw_dev_close(s->dev);
    }
    free(s->buf);
}

static uint8_t *ud_rbuf(ud_side_t *s, unsigned i)
{
    return s->buf + (size_t)i * RBUF;
}

static void ud_post_recvs(ud_side_t *s, unsigned n, uint32_t len)
{
    unsigned i;

    for (i = 0; i < n; ++i) {
        sw_test_post_recv(&s->qp, ud_rbuf(s, s->qp.rq_pi % NRECV), len,
                          s->lkey);
    }
}

/* A UD SEND/SEND_IMM as a ConnectX takes it: ctrl, datagram segment (the
 * AV with dqp_dct and qkey), one data segment or inline data. Rings;
 * returns the WQE index. */
static uint16_t ud_send(sw_test_qp_t *q, uint8_t opcode,
                        const struct mlx5_wqe_av *av, uint32_t dqpn,
                        uint32_t qkey, const void *data, uint32_t len,
                        uint32_t lkey, uint32_t imm_be, int inl)
{
    struct mlx5_wqe_datagram_seg dg;
    unsigned ds = 4;

    memcpy(&dg.av, av, sizeof(dg.av));
    dg.av.dqp_dct       = htobe32(dqpn | MLX5_EXTENDED_UD_AV);
    dg.av.key.qkey.qkey = htobe32(qkey);
    sw_test_wqe_put(q, 1, &dg, sizeof(dg));
    if (inl) {
        ds += sw_test_inline(q, 4, data, len);
    } else {
        sw_test_dseg(q, 4, data, len, lkey);
        ++ds;
    }
    sw_test_ctrl(q, opcode, ds, CU, imm_be);
    return sw_test_ring(q, ds);
}

static void fill(uint8_t *p, size_t len, unsigned seed)
{
    size_t i;

    for (i = 0; i < len; ++i) {
        p[i] = (uint8_t)(i * 7 + seed);
    }
}

/* The GRH at the start of a receive buffer names @a from and @a to. */
static int grh_ok(const uint8_t *rbuf, const vqp_sw_dev_addr_t *from,
                  const vqp_sw_dev_addr_t *to, uint32_t paylen)
{
    const struct ibv_grh *grh = (const void *)rbuf;
    struct mlx5_wqe_av av_from, av_to;

    vqp_sw_ah_av(from, &av_from);
    vqp_sw_ah_av(to, &av_to);
    return ((be32toh(grh->version_tclass_flow) >> 28) == 6) &&
           (grh->next_hdr == 0x1b) && (be16toh(grh->paylen) == paylen) &&
           !memcmp(grh->sgid.raw, av_from.rgid, 16) &&
           !memcmp(grh->dgid.raw, av_to.rgid, 16);
}

/* IB PayLen of a GRH: BTH, DETH, [ImmDt], payload padded to 4, ICRC. */
static uint32_t grh_paylen(uint32_t len, int imm)
{
    return 12 + 8 + (imm ? 4 : 0) + ((len + 3) & ~3u) + 4;
}

static int ud_poll(vqp_sw_dev_t **devs, unsigned n, sw_test_cq_t *cq,
                   struct mlx5_cqe64 *cqe)
{
    return sw_test_poll(devs, n, cq, cqe, 3000);
}

/* Nothing arrives on @a cq within a few rounds of progress. */
static int ud_cq_quiet(vqp_sw_dev_t **devs, unsigned n, sw_test_cq_t *cq)
{
    unsigned i, j;

    for (i = 0; i < 50; ++i) {
        for (j = 0; j < n; ++j) {
            vqp_sw_progress(devs[j]);
        }
    }
    return sw_test_cq_peek(cq) == NULL;
}

static uint64_t ud_dropped(ud_side_t *s)
{
    vqp_sw_qp_counters_t c;

    vqp_sw_qp_counters(s->qp.qp, &c);
    return c.ud_dropped;
}

/* Datagrams that reached @a s's QP while it had no receive posted. */
static uint64_t out_of_buffer(ud_side_t *s)
{
    vqp_sw_qp_counters_t c;

    vqp_sw_qp_counters(s->qp.qp, &c);
    return c.out_of_buffer;
}

/* ------------------------------------------------------ two processes */

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

/* The sizes the parent sends (inline, gather small, gather large). */
static const uint32_t proc_len[] = {50, 100, 3000, 0, 4096};
#define NPROC (sizeof(proc_len) / sizeof(proc_len[0]))

/*
 * Child: 'e' echo: for each datagram, report its CQE and the first
 * GRH + 64 bytes, then send the payload back to the sender named by the
 * GRH's SGID and the CQE's source QPN (SEND_IMM: imm + 1). 'x': report
 * ready, then wait to be killed. 'c': report ready, close and exit.
 */
static int ud_child(int rfd, int wfd)
{
    vqp_sw_dev_addr_t from;
    struct mlx5_cqe64 cqe;
    struct mlx5_wqe_av av;
    const struct ibv_grh *grh;
    ud_info_t me, peer;
    ud_side_t s;
    uint32_t len, be;
    uint8_t *rb;
    unsigned i;
    char mode;

    if (ud_open(&s) != 0) {
        return 10;
    }
    ud_post_recvs(&s, NRECV, RBUF);
    me.addr = s.addr;
    me.qpn  = s.qp.qpn;
    if ((xwrite(wfd, &me, sizeof(me)) != 0) ||
        (xread(rfd, &peer, sizeof(peer)) != 0) || (xread(rfd, &mode, 1) != 0)) {
        return 11;
    }
    if (mode == 'x') {
        xwrite(wfd, "r", 1);
        for (;;) {
            pause();
        }
    }
    if (mode == 'c') {
        ud_close(&s);
        xwrite(wfd, "r", 1);
        return 0;
    }
    for (i = 0; i < NPROC; ++i) {
        if (ud_poll(&s.dev, 1, &s.rcq, &cqe) != 0) {
            return 12;
        }
        rb = ud_rbuf(&s, be16toh(cqe.wqe_counter) % NRECV);
        if ((xwrite(wfd, &cqe, sizeof(cqe)) != 0) ||
            (xwrite(wfd, rb, GRH + 64) != 0)) {
            return 13;
        }
        /* Reply to where it came from: the GRH's SGID is the device. */
        grh = (const void *)rb;
        memcpy(&be, grh->sgid.raw + 8, 4);
        from.pid = be32toh(be);
        memcpy(&be, grh->sgid.raw + 12, 4);
        from.instance = be32toh(be);
        vqp_sw_ah_av(&from, &av);
        len = be32toh(cqe.byte_cnt) - GRH;
        memcpy(s.buf + BUF - 8192, rb + GRH, len);
        if (sw_test_cqe_opcode(&cqe) == MLX5_CQE_RESP_SEND_IMM) {
            ud_send(&s.qp, MLX5_OPCODE_SEND_IMM, &av,
                    be32toh(cqe.flags_rqpn) & 0xffffff, QKEY,
                    s.buf + BUF - 8192, len, s.lkey,
                    htobe32(be32toh(cqe.imm_inval_pkey) + 1), len <= 256);
        } else {
            ud_send(&s.qp, MLX5_OPCODE_SEND, &av,
                    be32toh(cqe.flags_rqpn) & 0xffffff, QKEY,
                    s.buf + BUF - 8192, len, s.lkey, 0, len <= 256);
        }
        if ((ud_poll(&s.dev, 1, &s.scq, &cqe) != 0) ||
            (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
            return 14;
        }
        sw_test_post_recv(&s.qp, rb, RBUF, s.lkey);
    }
    /* Progress until the parent is done (EOF or a byte). */
    fcntl(rfd, F_SETFL, fcntl(rfd, F_GETFL) | O_NONBLOCK);
    while (read(rfd, &mode, 1) < 0) {
        vqp_sw_progress(s.dev);
        sched_yield();
    }
    ud_close(&s);
    return 0;
}

typedef struct ud_proc {
    pid_t child;
    int to_child, from_child;
    ud_info_t peer;
} ud_proc_t;

static void ud_proc_start(ud_proc_t *p, ud_side_t *s, char mode)
{
    int to_child[2], from_child[2], rc;
    ud_info_t me;

    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    p->child = fork();
    assert_true(p->child >= 0);
    if (p->child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_child[1]);
        close(from_child[0]);
        rc = ud_child(to_child[0], from_child[1]);
        if (rc != 0) {
            fprintf(stderr, "UD child failed at step %d\n", rc);
        }
        _exit(rc);
    }
    close(to_child[0]);
    close(from_child[1]);
    p->to_child   = to_child[1];
    p->from_child = from_child[0];
    assert_int_equal(ud_open(s), 0);
    assert_int_equal(xread(p->from_child, &p->peer, sizeof(p->peer)), 0);
    me.addr = s->addr;
    me.qpn  = s->qp.qpn;
    assert_int_equal(xwrite(p->to_child, &me, sizeof(me)), 0);
    assert_int_equal(xwrite(p->to_child, &mode, 1), 0);
}

static void ud_proc_wait(ud_proc_t *p, int sig)
{
    int status;

    assert_int_equal(waitpid(p->child, &status, 0), p->child);
    if (sig != 0) {
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), sig);
    } else {
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    close(p->to_child);
    close(p->from_child);
}

static void test_two_processes(void **state)
{
    uint8_t hdr[GRH + 64], *rb;
    struct mlx5_cqe64 cqe;
    struct mlx5_wqe_av av;
    ud_proc_t p;
    ud_side_t s;
    unsigned i;
    int imm;

    ud_proc_start(&p, &s, 'e');
    ud_post_recvs(&s, NRECV, RBUF);
    vqp_sw_ah_av(&p.peer.addr, &av);
    for (i = 0; i < NPROC; ++i) {
        imm = (i % 2) == 1;
        fill(s.buf + BUF - 8192, proc_len[i], i);
        ud_send(&s.qp, imm ? MLX5_OPCODE_SEND_IMM : MLX5_OPCODE_SEND, &av,
                p.peer.qpn, QKEY, s.buf + BUF - 8192, proc_len[i], s.lkey,
                htobe32(0xabc000 + i), (i == 0) || (proc_len[i] == 0));
        assert_int_equal(ud_poll(&s.dev, 1, &s.scq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);

        /* What the child received. */
        assert_int_equal(xread(p.from_child, &cqe, sizeof(cqe)), 0);
        assert_int_equal(xread(p.from_child, hdr, sizeof(hdr)), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe),
                         imm ? MLX5_CQE_RESP_SEND_IMM : MLX5_CQE_RESP_SEND);
        assert_int_equal(be32toh(cqe.byte_cnt), GRH + proc_len[i]);
        assert_int_equal(be32toh(cqe.flags_rqpn) & 0xffffff, s.qp.qpn);
        assert_int_equal((be32toh(cqe.flags_rqpn) >> 28) & 3, 1); /* GRH */
        assert_int_equal(sw_test_cqe_qpn(&cqe), p.peer.qpn);
        if (imm) {
            assert_int_equal(be32toh(cqe.imm_inval_pkey), 0xabc000 + i);
        }
        assert_true(
            grh_ok(hdr, &s.addr, &p.peer.addr, grh_paylen(proc_len[i], imm)));
        assert_memory_equal(hdr + GRH, s.buf + BUF - 8192,
                            proc_len[i] < 64 ? proc_len[i] : 64);

        /* Its reply, addressed from our GRH. */
        assert_int_equal(ud_poll(&s.dev, 1, &s.rcq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe),
                         imm ? MLX5_CQE_RESP_SEND_IMM : MLX5_CQE_RESP_SEND);
        assert_int_equal(be32toh(cqe.byte_cnt), GRH + proc_len[i]);
        assert_int_equal(be32toh(cqe.flags_rqpn) & 0xffffff, p.peer.qpn);
        if (imm) {
            assert_int_equal(be32toh(cqe.imm_inval_pkey), 0xabc000 + i + 1);
        }
        rb = ud_rbuf(&s, be16toh(cqe.wqe_counter) % NRECV);
        assert_true(
            grh_ok(rb, &p.peer.addr, &s.addr, grh_paylen(proc_len[i], imm)));
        assert_memory_equal(rb + GRH, s.buf + BUF - 8192, proc_len[i]);
        sw_test_post_recv(&s.qp, rb, RBUF, s.lkey);
    }
    assert_int_equal(ud_dropped(&s), 0);
    assert_int_equal(xwrite(p.to_child, "s", 1), 0);
    ud_proc_wait(&p, 0);
    ud_close(&s);
}

/* A datagram to a process that died (segment left behind) or closed its
 * device: dropped, success CQE at the sender, no error logged. */
static void test_dead_destination(void **state)
{
    struct mlx5_cqe64 cqe;
    struct mlx5_wqe_av av;
    ud_proc_t p;
    ud_side_t s;
    char c;
    int round;

    for (round = 0; round < 2; ++round) {
        ud_proc_start(&p, &s, round == 0 ? 'x' : 'c');
        assert_int_equal(xread(p.from_child, &c, 1), 0);
        if (round == 0) {
            kill(p.child, SIGKILL);
            ud_proc_wait(&p, SIGKILL);
        } else {
            ud_proc_wait(&p, 0);
        }
        vqp_sw_ah_av(&p.peer.addr, &av);
        fill(s.buf, 300, 1);
        ud_send(&s.qp, MLX5_OPCODE_SEND, &av, p.peer.qpn, QKEY, s.buf, 300,
                s.lkey, 0, 0);
        ud_send(&s.qp, MLX5_OPCODE_SEND, &av, p.peer.qpn, QKEY, s.buf, 20,
                s.lkey, 0, 1);
        assert_int_equal(ud_poll(&s.dev, 1, &s.scq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(ud_poll(&s.dev, 1, &s.scq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(ud_dropped(&s), 2);
        assert_int_equal(vqp_sw_qp_state(s.qp.qp), IBV_QPS_RTS);
        assert_string_equal(sw_test_log_buf, "");
        ud_close(&s);
    }
}

/* ------------------------------------------------------ one process */

typedef struct ud_pair {
    ud_side_t s[2];
    vqp_sw_dev_t *devs[2];
    struct mlx5_wqe_av av[2]; /* av[i]: towards side i */
} ud_pair_t;

static int pair_setup(void **state)
{
    ud_pair_t *u = calloc(1, sizeof(*u));
    int i;

    *state             = u;
    sw_test_log_buf[0] = '\0';
    for (i = 0; i < 2; ++i) {
        if (ud_open(&u->s[i]) != 0) {
            return -1;
        }
        u->devs[i] = u->s[i].dev;
        vqp_sw_ah_av(&u->s[i].addr, &u->av[i]);
    }
    return 0;
}

static int pair_teardown(void **state)
{
    ud_pair_t *u = *state;

    ud_close(&u->s[0]);
    ud_close(&u->s[1]);
    free(u);
    return 0;
}

/* Side @a from sends @a len bytes of pattern @a seed to side @a to's QP. */
static uint16_t pair_send(ud_pair_t *u, int from, int to, uint32_t qkey,
                          uint32_t len, unsigned seed)
{
    ud_side_t *s = &u->s[from];
    uint8_t *src = s->buf + BUF - 8192;

    fill(src, len, seed);
    return ud_send(&s->qp, MLX5_OPCODE_SEND, &u->av[to], u->s[to].qp.qpn, qkey,
                   src, len, s->lkey, 0, 0);
}

static void pair_expect_req(ud_pair_t *u, int side, uint8_t synd)
{
    struct mlx5_cqe64 cqe;

    assert_int_equal(ud_poll(u->devs, 2, &u->s[side].scq, &cqe), 0);
    if (synd == 0) {
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    } else {
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
        assert_int_equal(sw_test_cqe_synd(&cqe), synd);
    }
}

/* Side @a to receives @a len bytes of pattern @a seed from @a from. */
static void pair_expect_recv(ud_pair_t *u, int from, int to, uint32_t len,
                             unsigned seed)
{
    uint8_t expect[RBUF];
    struct mlx5_cqe64 cqe;
    uint8_t *rb;

    assert_int_equal(ud_poll(u->devs, 2, &u->s[to].rcq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
    assert_int_equal(be32toh(cqe.byte_cnt), GRH + len);
    assert_int_equal(be32toh(cqe.flags_rqpn) & 0xffffff, u->s[from].qp.qpn);
    rb = ud_rbuf(&u->s[to], be16toh(cqe.wqe_counter) % NRECV);
    assert_true(
        grh_ok(rb, &u->s[from].addr, &u->s[to].addr, grh_paylen(len, 0)));
    fill(expect, len, seed);
    assert_memory_equal(rb + GRH, expect, len);
}

static void test_same_process(void **state)
{
    ud_pair_t *u = *state;

    ud_post_recvs(&u->s[0], 2, RBUF);
    ud_post_recvs(&u->s[1], 2, RBUF);
    pair_send(u, 0, 1, QKEY, 200, 1);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 1, 200, 1);
    pair_send(u, 1, 0, QKEY, 1000, 2);
    pair_expect_req(u, 1, 0);
    pair_expect_recv(u, 1, 0, 1000, 2);
    /* To itself (same device, same QP). */
    pair_send(u, 0, 0, QKEY, 7, 3);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 0, 7, 3);

    assert_int_equal(ud_dropped(&u->s[0]) + ud_dropped(&u->s[1]), 0);
}

/* Datagrams nothing takes: dropped and counted, the sender completes, and
 * the receive they did not take still serves the next good one. */
static void test_drops(void **state)
{
    ud_pair_t *u = *state;
    struct mlx5_wqe_av av;
    sw_test_cq_t cq;
    sw_test_qp_t q, rc;
    uint64_t dropped = 0;

    /* No receive posted. */
    pair_send(u, 0, 1, QKEY, 64, 1);
    pair_expect_req(u, 0, 0);
    assert_true(ud_cq_quiet(u->devs, 2, &u->s[1].rcq));
    assert_int_equal(ud_dropped(&u->s[0]), ++dropped);
    /* The receiver counts it too (out_of_buffer), the sender does not. */
    assert_int_equal(out_of_buffer(&u->s[1]), 1);
    assert_int_equal(out_of_buffer(&u->s[0]), 0);

    ud_post_recvs(&u->s[1], 1, RBUF);
    /* Wrong qkey. */
    pair_send(u, 0, 1, QKEY + 1, 64, 2);
    pair_expect_req(u, 0, 0);
    assert_int_equal(ud_dropped(&u->s[0]), ++dropped);
    /* Not for want of a receive: out_of_buffer stays. */
    assert_int_equal(out_of_buffer(&u->s[1]), 1);
    /* No QP with that QPN, and a QPN whose generation is stale. */
    ud_send(&u->s[0].qp, MLX5_OPCODE_SEND, &u->av[1], 0xffffff, QKEY,
            u->s[0].buf, 8, u->s[0].lkey, 0, 0);
    pair_expect_req(u, 0, 0);
    ud_send(&u->s[0].qp, MLX5_OPCODE_SEND, &u->av[1],
            u->s[1].qp.qpn + (1u << 10), QKEY, u->s[0].buf, 8, u->s[0].lkey, 0,
            0);
    pair_expect_req(u, 0, 0);
    dropped += 2;
    assert_int_equal(ud_dropped(&u->s[0]), dropped);
    /* An RC QP with that QPN (receive posted): not UD, dropped. */
    assert_int_equal(sw_test_cq_create(u->devs[1], 16, &cq), UCS_OK);
    assert_int_equal(
        sw_test_qp_create(u->devs[1], &cq, &cq, NULL, 32, 4, 0, &rc), UCS_OK);
    assert_int_equal(
        sw_test_qp_connect(&rc, &u->s[0].addr, u->s[0].qp.qpn, 0, 7, 7),
        UCS_OK);
    sw_test_post_recv(&rc, u->s[1].buf + BUF - 4096, 4096, u->s[1].lkey);
    ud_send(&u->s[0].qp, MLX5_OPCODE_SEND, &u->av[1], rc.qpn, QKEY, u->s[0].buf,
            8, u->s[0].lkey, 0, 0);
    pair_expect_req(u, 0, 0);
    assert_int_equal(ud_dropped(&u->s[0]), ++dropped);
    assert_true(ud_cq_quiet(u->devs, 2, &cq));
    /* A UD QP in INIT: not receiving yet. */
    memset(&q, 0, sizeof(q));
    {
        vqp_sw_qp_init_attr_t attr = {.send_cq      = cq.cq,
                                      .recv_cq      = cq.cq,
                                      .max_send_wr  = 32,
                                      .max_recv_wr  = 4,
                                      .max_recv_sge = 1};

        assert_int_equal(
            vqp_sw_ud_qp_create(u->devs[1], &attr, &q.qp, &q.dv, &q.qpn),
            UCS_OK);
    }
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_INIT, QKEY), UCS_OK);
    sw_test_post_recv(&q, u->s[1].buf + BUF - 4096, 4096, u->s[1].lkey);
    ud_send(&u->s[0].qp, MLX5_OPCODE_SEND, &u->av[1], q.qpn, QKEY, u->s[0].buf,
            8, u->s[0].lkey, 0, 0);
    pair_expect_req(u, 0, 0);
    assert_int_equal(ud_dropped(&u->s[0]), ++dropped);
    assert_true(ud_cq_quiet(u->devs, 2, &cq));
    /* ... in RTR it receives (into the receive posted before). */
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_RTR, 0), UCS_OK);
    ud_send(&u->s[0].qp, MLX5_OPCODE_SEND, &u->av[1], q.qpn, QKEY, u->s[0].buf,
            8, u->s[0].lkey, 0, 0);
    pair_expect_req(u, 0, 0);
    {
        struct mlx5_cqe64 cqe;

        assert_int_equal(ud_poll(u->devs, 2, &cq, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
        assert_int_equal(sw_test_cqe_qpn(&cqe), q.qpn);
    }
    /* A device that does not exist (pid 1 runs no device). */
    av = u->av[1];
    {
        vqp_sw_dev_addr_t nowhere = {.pid = 1, .instance = 77};

        vqp_sw_ah_av(&nowhere, &av);
    }
    ud_send(&u->s[0].qp, MLX5_OPCODE_SEND, &av, u->s[1].qp.qpn, QKEY,
            u->s[0].buf, 8, u->s[0].lkey, 0, 0);
    pair_expect_req(u, 0, 0);
    assert_int_equal(ud_dropped(&u->s[0]), ++dropped);

    /* The right one lands in the receive none of the above took. */
    pair_send(u, 0, 1, QKEY, 64, 9);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 1, 64, 9);
    /* A qkey with the high bit set means the sender QP's own qkey. */
    ud_post_recvs(&u->s[1], 1, RBUF);
    pair_send(u, 0, 1, 0x80000000u, 16, 10);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 1, 16, 10);
    assert_int_equal(ud_dropped(&u->s[0]), dropped);
    assert_string_equal(sw_test_log_buf, "");

    /* vqp_sw_stat shows the UD QP, its qkey and the drops. */
    {
        char cmd[256], out[65536], needle[160];
        size_t n;
        FILE *f;

        snprintf(cmd, sizeof(cmd), "%s", VQP_SW_STAT);
        f = popen(cmd, "r");
        assert_non_null(f);
        n      = fread(out, 1, sizeof(out) - 1, f);
        out[n] = '\0';
        assert_int_equal(pclose(f), 0);
        snprintf(needle, sizeof(needle),
                 "qp 0x%06x RTS   ud qkey 0x%08x rq wqes %lu", u->s[0].qp.qpn,
                 QKEY, (unsigned long)dropped + 3);
        assert_non_null(strstr(out, needle));
        snprintf(needle, sizeof(needle), "ud_dropped %lu out_of_buffer 0\n",
                 (unsigned long)dropped);
        assert_non_null(strstr(out, needle));
        /* The receiver's line: the one datagram it had no receive for. */
        snprintf(needle, sizeof(needle),
                 "qp 0x%06x RTS   ud qkey 0x%08x rq wqes", u->s[1].qp.qpn,
                 QKEY);
        assert_non_null(strstr(out, needle));
        assert_non_null(strstr(strstr(out, needle), "out_of_buffer 1\n"));
    }

    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);
    assert_int_equal(vqp_sw_qp_destroy(rc.qp), UCS_OK);
    assert_int_equal(vqp_sw_cq_destroy(cq.cq), UCS_OK);
}

/* Send a WQE that must fail with @a synd and the log line @a text; then
 * the QP is in SQE: a good SEND behind it is flushed, the RQ still
 * receives, and SQE -> RTS makes it send again. */
static void expect_send_error(ud_pair_t *u, uint8_t synd, const char *text)
{
    pair_expect_req(u, 0, synd);
    assert_true(sw_test_log_has(text));
    assert_int_equal(vqp_sw_qp_state(u->s[0].qp.qp), IBV_QPS_SQE);
    pair_send(u, 0, 1, QKEY, 8, 1);
    pair_expect_req(u, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    ud_post_recvs(&u->s[0], 1, RBUF);
    pair_send(u, 1, 0, QKEY, 33, 4);
    pair_expect_req(u, 1, 0);
    pair_expect_recv(u, 1, 0, 33, 4);
    assert_int_equal(ud_qp_modify(&u->s[0].qp, IBV_QPS_RTS, 0), UCS_OK);
    ud_post_recvs(&u->s[1], 1, RBUF);
    pair_send(u, 0, 1, QKEY, 12, 5);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 1, 12, 5);
}

static void test_send_errors(void **state)
{
    ud_pair_t *u    = *state;
    sw_test_qp_t *q = &u->s[0].qp;
    struct mlx5_wqe_av av;
    struct mlx5_wqe_datagram_seg dg;

    /* RDMA WRITE, READ and NOP are not UD operations. */
    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, CU, 0);
    sw_test_raddr(q, 1, (uintptr_t)u->s[1].buf, u->s[1].rkey);
    sw_test_dseg(q, 2, u->s[0].buf, 8, u->s[0].lkey);
    sw_test_ring(q, 3);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR, "on a UD QP");
    sw_test_ctrl(q, MLX5_OPCODE_NOP, 1, CU, 0);
    sw_test_ring(q, 1);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR, "on a UD QP");

    /* A SEND without a datagram segment (RC layout). */
    sw_test_ctrl(q, MLX5_OPCODE_SEND, 2, CU, 0);
    sw_test_dseg(q, 1, u->s[0].buf, 8, u->s[0].lkey);
    sw_test_ring(q, 2);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                      "no datagram segment");

    /* Datagram segments the device cannot take. */
    av = u->av[1];
    av.rgid[5] ^= 1;
    ud_send(q, MLX5_OPCODE_SEND, &av, u->s[1].qp.qpn, QKEY, u->s[0].buf, 8,
            u->s[0].lkey, 0, 0);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                      "not a software device GID");
    av            = u->av[1];
    av.grh_gid_fl = 0;
    ud_send(q, MLX5_OPCODE_SEND, &av, u->s[1].qp.qpn, QKEY, u->s[0].buf, 8,
            u->s[0].lkey, 0, 0);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR, "no GRH");
    av      = u->av[1];
    av.rlid = htobe16(3);
    ud_send(q, MLX5_OPCODE_SEND, &av, u->s[1].qp.qpn, QKEY, u->s[0].buf, 8,
            u->s[0].lkey, 0, 0);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR, "LID fields");
    av = u->av[1];
    av.grh_gid_fl |= htobe32(1u << 20); /* SGID index 1 */
    ud_send(q, MLX5_OPCODE_SEND, &av, u->s[1].qp.qpn, QKEY, u->s[0].buf, 8,
            u->s[0].lkey, 0, 0);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR, "SGID index");
    /* dqp_dct without the extended-AV bit. */
    memcpy(&dg.av, &u->av[1], sizeof(dg.av));
    dg.av.dqp_dct       = htobe32(u->s[1].qp.qpn);
    dg.av.key.qkey.qkey = htobe32(QKEY);
    sw_test_wqe_put(q, 1, &dg, sizeof(dg));
    sw_test_dseg(q, 4, u->s[0].buf, 8, u->s[0].lkey);
    sw_test_ctrl(q, MLX5_OPCODE_SEND, 5, CU, 0);
    sw_test_ring(q, 5);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                      "MLX5_EXTENDED_UD_AV");

    /* Above the path MTU: a local length error; the MTU itself passes. */
    pair_send(u, 0, 1, QKEY, VQP_SW_UD_MAX_MSG + 1, 6);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR,
                      "exceeds the path MTU");
    ud_post_recvs(&u->s[1], 1, RBUF);
    pair_send(u, 0, 1, QKEY, VQP_SW_UD_MAX_MSG, 7);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 1, VQP_SW_UD_MAX_MSG, 7);

    /* A bad lkey. */
    ud_send(q, MLX5_OPCODE_SEND, &u->av[1], u->s[1].qp.qpn, QKEY, u->s[0].buf,
            8, u->s[0].lkey + 0x100, 0, 0);
    expect_send_error(u, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR, "lkey");
    assert_int_equal(ud_dropped(&u->s[0]), 0);
}

/* A receive too small for GRH + payload: the receiver's WQE completes with
 * a local length error and its QP enters ERR; the sender completes. */
static void test_recv_too_small(void **state)
{
    ud_pair_t *u = *state;
    struct mlx5_cqe64 cqe;

    sw_test_post_recv(&u->s[1].qp, ud_rbuf(&u->s[1], 0), GRH + 10,
                      u->s[1].lkey);
    sw_test_post_recv(&u->s[1].qp, ud_rbuf(&u->s[1], 1), RBUF, u->s[1].lkey);
    pair_send(u, 0, 1, QKEY, 11, 1);
    pair_expect_req(u, 0, 0);
    assert_int_equal(ud_poll(u->devs, 2, &u->s[1].rcq, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
    assert_int_equal(be16toh(cqe.wqe_counter), 0);
    assert_int_equal(vqp_sw_qp_state(u->s[1].qp.qp), IBV_QPS_ERR);
    /* The other receive is flushed. */
    assert_int_equal(ud_poll(u->devs, 2, &u->s[1].rcq, &cqe), 0);
    assert_int_equal(sw_test_cqe_synd(&cqe), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(ud_dropped(&u->s[0]), 0);
    /* GRH + 10 exactly fits. */
    assert_int_equal(ud_qp_modify(&u->s[1].qp, IBV_QPS_RESET, 0), UCS_OK);
    u->s[1].qp.rq_pi = 0;
    assert_int_equal(ud_qp_modify(&u->s[1].qp, IBV_QPS_INIT, QKEY), UCS_OK);
    assert_int_equal(ud_qp_modify(&u->s[1].qp, IBV_QPS_RTR, 0), UCS_OK);
    sw_test_post_recv(&u->s[1].qp, ud_rbuf(&u->s[1], 0), GRH + 10,
                      u->s[1].lkey);
    pair_send(u, 0, 1, QKEY, 10, 2);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 1, 10, 2);
}

static void test_modify_rules(void **state)
{
    ud_pair_t *u = *state;
    vqp_sw_qp_init_attr_t attr;
    sw_test_srq_t srq;
    vqp_sw_qp_attr_t a;
    sw_test_cq_t cq;
    sw_test_qp_t q;

    assert_int_equal(sw_test_cq_create(u->devs[0], 16, &cq), UCS_OK);
    memset(&attr, 0, sizeof(attr));
    attr.send_cq     = cq.cq;
    attr.recv_cq     = cq.cq;
    attr.max_send_wr = 32;
    /* No SRQ for UD on the software device. */
    memset(&srq, 0, sizeof(srq));
    assert_int_equal(vqp_sw_srq_create(u->devs[0], 8, 1, &srq.srq, &srq.dv),
                     UCS_OK);
    attr.srq = srq.srq;
    assert_int_equal(
        vqp_sw_ud_qp_create(u->devs[0], &attr, &q.qp, &q.dv, &q.qpn),
        UCS_ERR_UNSUPPORTED);
    assert_true(sw_test_log_has("SRQ"));
    attr.srq = NULL;
    assert_int_equal(
        vqp_sw_ud_qp_create(u->devs[0], &attr, &q.qp, &q.dv, &q.qpn), UCS_OK);
    /* Controlled qkey (high bit): privileged. */
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_INIT, 0x80000001u),
                     UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("high bit"));
    /* RC attributes on UD. */
    memset(&a, 0, sizeof(a));
    a.qp_state        = IBV_QPS_INIT;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &a), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("RC attributes"));
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_INIT, 5), UCS_OK);
    memset(&a, 0, sizeof(a));
    a.qp_state    = IBV_QPS_RTR;
    a.dest_qp_num = 0x400;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &a), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("RC attributes"));
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_RTR, 5), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("set in INIT"));
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_RTR, 0), UCS_OK);
    memset(&a, 0, sizeof(a));
    a.qp_state  = IBV_QPS_RTS;
    a.retry_cnt = 3;
    assert_int_equal(vqp_sw_qp_modify(q.qp, &a), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("RC attributes"));
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_RTS, 0), UCS_OK);
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_RTS);
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_ERR, 5), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("set in INIT only"));
    assert_int_equal(vqp_sw_qp_state(q.qp), IBV_QPS_RTS);
    /* SQE -> RTS is for UD; RTR -> SQE is no transition at all. */
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_SQE, 0), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("invalid transition"));
    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);

    /* A qkey on an RC QP. */
    assert_int_equal(
        sw_test_qp_create(u->devs[0], &cq, &cq, NULL, 32, 0, 0, &q), UCS_OK);
    assert_int_equal(ud_qp_modify(&q, IBV_QPS_INIT, 5), UCS_ERR_INVALID_PARAM);
    assert_true(sw_test_log_has("UD QPs only"));
    assert_int_equal(vqp_sw_qp_destroy(q.qp), UCS_OK);
    assert_int_equal(vqp_sw_srq_destroy(srq.srq), UCS_OK);
    assert_int_equal(vqp_sw_cq_destroy(cq.cq), UCS_OK);
}

/* Sends @a n datagrams A -> B (B has 2n receives) under fault spec
 * @a spec on A; returns how many arrived, per-datagram counts in @a got. */
static unsigned fault_run(ud_pair_t *u, const char *spec, unsigned n,
                          uint8_t *got)
{
    struct mlx5_cqe64 cqe;
    unsigned i, arrived = 0;
    uint8_t *rb;

    assert_int_equal(vqp_sw_dev_set_faults(u->devs[0], spec), UCS_OK);
    memset(got, 0, n);
    for (i = 0; i < n; ++i) {
        /* Two receives outstanding: room for a duplicate. */
        while ((uint16_t)(u->s[1].qp.rq_pi - u->s[1].rcq.ci) < 2) {
            sw_test_post_recv(&u->s[1].qp,
                              ud_rbuf(&u->s[1], u->s[1].qp.rq_pi % 2), 64,
                              u->s[1].lkey);
        }
        pair_send(u, 0, 1, QKEY, 1, i);
        pair_expect_req(u, 0, 0);
        while (!ud_cq_quiet(u->devs, 2, &u->s[1].rcq)) {
            assert_int_equal(ud_poll(u->devs, 2, &u->s[1].rcq, &cqe), 0);
            assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
            rb = ud_rbuf(&u->s[1], be16toh(cqe.wqe_counter) % 2);
            assert_int_equal(rb[GRH], (uint8_t)i);
            ++got[i];
            ++arrived;
        }
    }
    return arrived;
}

static void test_fault_drop_dup(void **state)
{
    ud_pair_t *u = *state;
    uint8_t got1[64], got2[64];
    vqp_sw_qp_counters_t c;
    unsigned n1, n2, i, twice = 0;
    static const char *bad[] = {"ud_drop=1.5", "ud_dup=x",
                                "ud_drop=", "ud_dup=-0.1"};

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        assert_int_equal(vqp_sw_dev_set_faults(u->devs[0], bad[i]),
                         UCS_ERR_INVALID_PARAM);
        assert_true(sw_test_log_has("ud_drop=P, ud_dup=P"));
    }
    /* Drop half: some arrive, some not, each at most once. */
    n1 = fault_run(u, "seed=11,ud_drop=0.5", 64, got1);
    assert_in_range(n1, 8, 56);
    vqp_sw_qp_counters(u->s[0].qp.qp, &c);
    assert_int_equal(c.ud_dropped, 64 - n1);
    for (i = 0; i < 64; ++i) {
        assert_in_range(got1[i], 0, 1);
    }
    /* The same seed drops the same datagrams. */
    n2 = fault_run(u, "seed=11,ud_drop=0.5", 64, got2);
    assert_int_equal(n1, n2);
    assert_memory_equal(got1, got2, 64);
    /* Another seed, another pattern. */
    fault_run(u, "seed=12,ud_drop=0.5", 64, got2);
    assert_memory_not_equal(got1, got2, 64);

    /* Duplicate every one. */
    assert_int_equal(fault_run(u, "seed=1,ud_dup=1", 16, got1), 32);
    for (i = 0; i < 16; ++i) {
        assert_int_equal(got1[i], 2);
    }
    /* Duplicate some, repeatably. */
    n1 = fault_run(u, "seed=5,ud_dup=0.5", 64, got1);
    assert_in_range(n1, 64 + 8, 128 - 8);
    for (i = 0; i < 64; ++i) {
        assert_in_range(got1[i], 1, 2);
        twice += (got1[i] == 2);
    }
    assert_int_equal(n1, 64 + twice);
    assert_int_equal(fault_run(u, "seed=5,ud_dup=0.5", 64, got2), n1);
    assert_memory_equal(got1, got2, 64);
    /* err_prob is for RC QPs (retries, responders): every datagram goes,
     * the UD QP stays up (each send's CQE is checked a success). */
    assert_int_equal(fault_run(u, "seed=5,err_prob=1:0x15", 16, got1), 16);
    assert_int_equal(vqp_sw_dev_set_faults(u->devs[0], NULL), UCS_OK);
}

/* The destination's segment lock held elsewhere (a peer process
 * descheduled inside its critical section): the datagram waits in the send
 * queue, neither dropped nor completed, and arrives once the lock is free;
 * the next one goes through at once. */
static void test_dest_lock_held(void **state)
{
    ud_pair_t *u = *state;
    sw_test_lock_holder_t holder;

    ud_post_recvs(&u->s[1], 2, RBUF);
    assert_int_equal(sw_test_lock_hold(&holder, u->s[1].dev), 0);
    pair_send(u, 0, 1, QKEY, 100, 1);
    assert_true(ud_cq_quiet(u->devs, 2, &u->s[0].scq));
    assert_true(ud_cq_quiet(u->devs, 2, &u->s[1].rcq));
    assert_int_equal(ud_dropped(&u->s[0]), 0);
    sw_test_lock_release(&holder);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 1, 100, 1);
    pair_send(u, 0, 1, QKEY, 200, 2);
    pair_expect_req(u, 0, 0);
    pair_expect_recv(u, 0, 1, 200, 2);
    assert_int_equal(ud_dropped(&u->s[0]), 0);
    assert_int_equal(out_of_buffer(&u->s[1]), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_dead_destination),
        cmocka_unit_test_setup_teardown(test_same_process, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_drops, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(test_send_errors, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_recv_too_small, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_modify_rules, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_dest_lock_held, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_fault_drop_dup, pair_setup,
                                        pair_teardown),
    };

    char ns[32];

    /* Our own namespace: vqp_sw_stat lists only our devices, and devices
     * other tests open meanwhile do not clean the segment a killed child
     * leaves. */
    snprintf(ns, sizeof(ns), "swud%u", (unsigned)getpid());
    setenv("VQP_SW_NAMESPACE", ns, 1);
    ucs_log_push_handler(sw_test_log_handler);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
