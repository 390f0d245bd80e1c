/*
 * Small two-sided messages (SEND/SEND_IMM of at most VQP_SW_SMALL_SEND
 * bytes): the requester takes the receive WQE and checks it as for any
 * SEND, the payload travels in the inbound record, and the receiver's
 * engine scatters it right before the CQE. Covers data integrity (single
 * and two processes, inline and gather), scatter over several receive
 * SGEs, the threshold, SRQ, RNR, local length errors, the receiver's own
 * re-check, placement order against later WRITEs and large SENDs on the
 * same QP, and a dead (unreaped) peer; and SENDs and an atomic against a
 * target whose segment lock another holder keeps.
 */
#include <config.h>

#include "sw_test_util.h"

#include "sw_test_lock.h"
#include "sw/sw_int.h" /* VQP_SW_SMALL_SEND */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUF     131072
#define SENT    0xee /* receive buffers start with this byte */
#define RQ_SGE  4
#define SRQ_SGE 4

/* Two devices (like two hosts), one connected QP pair whose receive WQEs
 * take RQ_SGE segments; optionally side 1 receives through an SRQ. */
typedef struct sm {
    vqp_sw_dev_t *devs[2];
    vqp_sw_dev_addr_t addr[2];
    sw_test_cq_t scq[2], rcq[2];
    sw_test_qp_t qp[2];
    sw_test_srq_t srq;
    bool use_srq;
    uint8_t *buf[2];
    vqp_sw_mr_t *mr[2];
    uint32_t lkey[2], rkey[2];
} sm_t;

static int sm_init(sm_t *m, bool use_srq, uint8_t rnr_retry)
{
    vqp_sw_qp_init_attr_t attr;
    int i;

    memset(m, 0, sizeof(*m));
    m->use_srq = use_srq;
    for (i = 0; i < 2; ++i) {
        if (vqp_sw_dev_open("vqp_sw0", &m->devs[i]) != UCS_OK) {
            return -1;
        }
        vqp_sw_dev_address(m->devs[i], &m->addr[i]);
        m->buf[i] = aligned_alloc(64, BUF);
        memset(m->buf[i], SENT, BUF);
        if ((vqp_sw_mr_reg(m->devs[i], m->buf[i], BUF, SW_TEST_ACCESS_ALL,
                           &m->mr[i], &m->lkey[i], &m->rkey[i]) != UCS_OK) ||
            (sw_test_cq_create(m->devs[i], 64, &m->scq[i]) != UCS_OK) ||
            (sw_test_cq_create(m->devs[i], 64, &m->rcq[i]) != UCS_OK)) {
            return -1;
        }
        memset(&attr, 0, sizeof(attr));
        attr.send_cq         = m->scq[i].cq;
        attr.recv_cq         = m->rcq[i].cq;
        attr.max_send_wr     = 64;
        attr.max_inline_data = 512;
        if ((i == 1) && use_srq) {
            if (vqp_sw_srq_create(m->devs[1], 16, SRQ_SGE, &m->srq.srq,
                                  &m->srq.dv) != UCS_OK) {
                return -1;
            }
            attr.srq = m->srq.srq;
        } else {
            attr.max_recv_wr  = 16;
            attr.max_recv_sge = RQ_SGE;
        }
        memset(&m->qp[i], 0, sizeof(m->qp[i]));
        if (vqp_sw_qp_create(m->devs[i], &attr, &m->qp[i].qp, &m->qp[i].dv,
                             &m->qp[i].qpn) != UCS_OK) {
            return -1;
        }
    }
    for (i = 0; i < 2; ++i) {
        if (sw_test_qp_connect(&m->qp[i], &m->addr[!i], m->qp[!i].qpn,
                               SW_TEST_ACCESS_ALL, rnr_retry, 3) != UCS_OK) {
            return -1;
        }
    }
    return 0;
}

static void sm_fini(sm_t *m)
{
    int i;

    for (i = 0; i < 2; ++i) {
        vqp_sw_qp_destroy(m->qp[i].qp);
    }
    if (m->use_srq) {
        vqp_sw_srq_destroy(m->srq.srq);
    }
    for (i = 0; i < 2; ++i) {
        vqp_sw_dev_close(m->devs[i]);
        free(m->buf[i]);
    }
}

/* Receive WQE on side 1 with @a n segments at addr[i], len[i] bytes under
 * @a lkey (then MLX5_INVALID_LKEY). Returns its wqe_counter. */
static uint16_t sm_post_segs(sm_t *m, unsigned n, uint8_t *const *addr,
                             const uint32_t *len, uint32_t lkey)
{
    struct mlx5_wqe_data_seg *d;
    sw_test_qp_t *q = &m->qp[1];
    uint16_t idx;
    unsigned i, max;

    if (m->use_srq) {
        idx = (uint16_t)m->srq.dv.head;
        d = (void *)((uint8_t *)m->srq.dv.buf + (size_t)idx * m->srq.dv.stride +
                     sizeof(struct mlx5_wqe_srq_next_seg));
        max = SRQ_SGE;
    } else {
        idx = q->rq_pi;
        d   = (void *)((uint8_t *)q->dv.rq.buf +
                     (size_t)(q->rq_pi & (q->dv.rq.wqe_cnt - 1)) *
                         q->dv.rq.stride);
        max = q->dv.rq.stride / sizeof(*d);
    }
    for (i = 0; i < max; ++i) {
        d[i].byte_count = htobe32(i < n ? len[i] : 0);
        d[i].lkey       = htobe32(i < n ? lkey : MLX5_INVALID_LKEY);
        d[i].addr       = htobe64(i < n ? (uintptr_t)addr[i] : 0);
    }
    if (m->use_srq) {
        m->srq.dv.head = be16toh(
            ((struct mlx5_wqe_srq_next_seg
                  *)((uint8_t *)d - sizeof(struct mlx5_wqe_srq_next_seg)))
                ->next_wqe_index);
        ++m->srq.counter;
        __atomic_thread_fence(__ATOMIC_RELEASE);
        *m->srq.dv.dbrec = htobe32(m->srq.counter);
    } else {
        ++q->rq_pi;
        __atomic_thread_fence(__ATOMIC_RELEASE);
        q->dv.dbrec[MLX5_RCV_DBR] = htobe32(q->rq_pi);
    }
    return idx;
}

/* The same at B.buf + off[i] under B's key. */
static uint16_t sm_post_recv(sm_t *m, unsigned n, const unsigned *off,
                             const uint32_t *len)
{
    uint8_t *addr[RQ_SGE];
    unsigned i;

    for (i = 0; i < n; ++i) {
        addr[i] = m->buf[1] + off[i];
    }
    return sm_post_segs(m, n, addr, len, m->lkey[1]);
}

static uint16_t sm_recv1(sm_t *m, unsigned off, uint32_t len)
{
    return sm_post_recv(m, 1, &off, &len);
}

/* SEND or SEND_IMM of A.buf[loff, +len) from side 0, gather or inline. */
static uint16_t sm_send(sm_t *m, uint8_t opcode, unsigned loff, uint32_t len,
                        uint32_t imm_be, bool inl)
{
    sw_test_qp_t *q = &m->qp[0];
    unsigned ds     = 2;

    if (inl) {
        ds = 1 + sw_test_inline(q, 1, m->buf[0] + loff, len);
    } else if (len == 0) {
        ds = 1; /* byte_count 0 would mean 2 GiB */
    } else {
        sw_test_dseg(q, 1, m->buf[0] + loff, len, m->lkey[0]);
    }
    sw_test_ctrl(q, opcode, ds, MLX5_WQE_CTRL_CQ_UPDATE, imm_be);
    return sw_test_ring(q, ds);
}

static uint16_t sm_write(sm_t *m, unsigned loff, unsigned roff, uint32_t len)
{
    sw_test_qp_t *q = &m->qp[0];

    sw_test_ctrl(q, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(q, 1, (uintptr_t)m->buf[1] + roff, m->rkey[1]);
    sw_test_dseg(q, 2, m->buf[0] + loff, len, m->lkey[0]);
    return sw_test_ring(q, 3);
}

static int sm_poll(sm_t *m, int side, int recv, struct mlx5_cqe64 *cqe)
{
    return sw_test_poll(m->devs, 2, recv ? &m->rcq[side] : &m->scq[side], cqe,
                        3000);
}

/* Progresses only side @a side until its send CQ has a CQE. */
static int sm_poll_only(sm_t *m, int side, struct mlx5_cqe64 *cqe)
{
    return sw_test_poll(&m->devs[side], 1, &m->scq[side], cqe, 3000);
}

static void fill(uint8_t *p, size_t len, unsigned seed)
{
    size_t i;

    for (i = 0; i < len; ++i) {
        p[i] = (uint8_t)(seed * 31 + i * 7 + 1);
    }
}

static bool all_sent(const uint8_t *p, size_t len)
{
    size_t i;

    for (i = 0; i < len; ++i) {
        if (p[i] != SENT) {
            return false;
        }
    }
    return true;
}

static void check_resp(const struct mlx5_cqe64 *cqe, uint8_t opcode,
                       uint32_t len, uint16_t wqe, uint32_t imm_be,
                       uint32_t src_qpn)
{
    assert_int_equal(sw_test_cqe_opcode(cqe), opcode);
    assert_int_equal(be32toh(cqe->byte_cnt), len);
    assert_int_equal(be16toh(cqe->wqe_counter), wqe);
    assert_int_equal(be32toh(cqe->flags_rqpn) & 0xffffff, src_qpn);
    if (opcode == MLX5_CQE_RESP_SEND_IMM) {
        assert_int_equal(cqe->imm_inval_pkey, imm_be);
    }
}

/* Sizes around and below the threshold, SEND and SEND_IMM, gather and
 * inline: byte-exact data, nothing written past the message, CQE fields. */
static void test_small_integrity(void **state)
{
    static const uint32_t sizes[] = {0, 1, 8, 63, 200, VQP_SW_SMALL_SEND};
    struct mlx5_cqe64 cqe;
    unsigned i, k, n = 0;
    uint16_t rwqe, swqe;
    uint8_t opcode;
    bool inl;
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        for (k = 0; k < 4; ++k, ++n) {
            opcode = (k & 1) ? MLX5_OPCODE_SEND_IMM : MLX5_OPCODE_SEND;
            inl    = (k & 2) != 0;
            memset(m.buf[1], SENT, 1024);
            fill(m.buf[0], sizes[i], n);
            rwqe = sm_recv1(&m, 64, 512);
            swqe = sm_send(&m, opcode, 0, sizes[i], htobe32(0x1000 + n), inl);
            assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
            check_resp(&cqe,
                       (opcode == MLX5_OPCODE_SEND_IMM) ? MLX5_CQE_RESP_SEND_IMM
                                                        : MLX5_CQE_RESP_SEND,
                       sizes[i], rwqe, htobe32(0x1000 + n), m.qp[0].qpn);
            assert_memory_equal(m.buf[1] + 64, m.buf[0], sizes[i]);
            assert_true(all_sent(m.buf[1], 64));
            assert_true(
                all_sent(m.buf[1] + 64 + sizes[i], 1024 - 64 - sizes[i]));
            assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
            assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
            assert_int_equal(be16toh(cqe.wqe_counter), swqe);
            assert_int_equal(be32toh(cqe.byte_cnt), sizes[i]);
        }
    }
    sm_fini(&m);
}

/* The payload of a small or staged SEND is placed by the receiver's
 * engine, so it is not in the buffer before the receiver progresses; one
 * byte more than VQP_SW_STAGE_SEND and the requester places it. All end
 * byte-exact with one CQE each. */
static void test_small_threshold(void **state)
{
    static const uint32_t sizes[] = {VQP_SW_SMALL_SEND, VQP_SW_SMALL_SEND + 1,
                                     VQP_SW_STAGE_SEND, VQP_SW_STAGE_SEND + 1};
    const uint32_t area           = 2 * VQP_SW_STAGE_SEND;
    struct mlx5_cqe64 cqe;
    uint16_t rwqe;
    unsigned i;
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        memset(m.buf[1], SENT, area);
        fill(m.buf[0], sizes[i], i + 5);
        rwqe = sm_recv1(&m, 0, area);
        sm_send(&m, MLX5_OPCODE_SEND, 0, sizes[i], 0, false);
        /* Only the requester runs: its SEND completes (the receive WQE is
         * taken and the message accepted) either way. */
        assert_int_equal(sm_poll_only(&m, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_null(sw_test_cq_peek(&m.rcq[1]));
        if (sizes[i] <= VQP_SW_STAGE_SEND) {
            assert_true(all_sent(m.buf[1], area));
        } else {
            assert_memory_equal(m.buf[1], m.buf[0], sizes[i]);
        }
        assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
        check_resp(&cqe, MLX5_CQE_RESP_SEND, sizes[i], rwqe, 0, m.qp[0].qpn);
        assert_memory_equal(m.buf[1], m.buf[0], sizes[i]);
        assert_true(all_sent(m.buf[1] + sizes[i], area - sizes[i]));
    }
    sm_fini(&m);
}

/* Staged SENDs of many sizes and alignments, gathered from three local
 * segments and scattered over receive SGEs, through enough rounds that
 * the staging ring wraps several times (payloads that would straddle its
 * end start at its beginning): every byte lands, nothing past the
 * message, CQEs in order; the ring's tail follows its head once all are
 * placed. */
static void test_stage_wrap(void **state)
{
    const unsigned rounds = 3 * VQP_SW_STAGE_SIZE / 4096;
    const uint32_t slot   = VQP_SW_STAGE_SEND + 64;
    struct mlx5_cqe64 cqe;
    uint32_t len, part, rlen[2];
    unsigned i, k, roff[2];
    vqp_sw_shm_t *shm;
    uint16_t rwqe[4];
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    shm = m.devs[1]->shm;
    for (i = 0; i < rounds; i += 4) {
        for (k = 0; k < 4; ++k) {
            len = VQP_SW_SMALL_SEND + 1 +
                  ((i + k) * 2237u) % (VQP_SW_STAGE_SEND - VQP_SW_SMALL_SEND);
            memset(m.buf[1] + k * slot, SENT, slot);
            roff[0] = k * slot;
            rlen[0] = 100 + k;
            roff[1] = k * slot + rlen[0];
            rlen[1] = slot - rlen[0];
            rwqe[k] = sm_post_recv(&m, 2, roff, rlen);
            fill(m.buf[0] + 32768, len, i + k);
            /* Three gather segments of the payload. */
            part = len / 3;
            sw_test_dseg(&m.qp[0], 1, m.buf[0] + 32768, part, m.lkey[0]);
            sw_test_dseg(&m.qp[0], 2, m.buf[0] + 32768 + part, part, m.lkey[0]);
            sw_test_dseg(&m.qp[0], 3, m.buf[0] + 32768 + 2 * part,
                         len - 2 * part, m.lkey[0]);
            sw_test_ctrl(&m.qp[0], MLX5_OPCODE_SEND_IMM, 4,
                         MLX5_WQE_CTRL_CQ_UPDATE, htobe32(i + k));
            sw_test_ring(&m.qp[0], 4);
            assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
            assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
            assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
            check_resp(&cqe, MLX5_CQE_RESP_SEND_IMM, len, rwqe[k],
                       htobe32(i + k), m.qp[0].qpn);
            assert_memory_equal(m.buf[1] + k * slot, m.buf[0] + 32768, len);
            assert_true(all_sent(m.buf[1] + k * slot + len, slot - len));
        }
    }
    assert_true(shm->stage_head > 2 * VQP_SW_STAGE_SIZE);
    assert_int_equal(shm->stage_tail, shm->stage_head);
    sm_fini(&m);
}

/* A receiver that does not progress: staged SENDs fill its staging ring,
 * then the next ones go by process_vm_writev (placed by the requester at
 * once) instead of waiting; once the receiver runs, every message is in
 * place with its CQE in posting order. */
static void test_stage_full(void **state)
{
    const uint32_t len = VQP_SW_STAGE_SEND, slot = VQP_SW_STAGE_SEND;
    const unsigned fit = VQP_SW_STAGE_SIZE / VQP_SW_STAGE_SEND;
    const unsigned n   = fit + 3;
    uint8_t *rbuf      = aligned_alloc(64, (size_t)n * slot);
    struct mlx5_cqe64 cqe;
    sw_test_cq_t scq, rcq;
    sw_test_qp_t qa, qb;
    uint32_t lkey, rkey;
    vqp_sw_mr_t *mr;
    unsigned i, placed = 0;
    sm_t m;

    /* A deeper pair on sm_init's devices: n messages in flight. */
    assert_int_equal(sm_init(&m, false, 7), 0);
    assert_non_null(rbuf);
    memset(rbuf, SENT, (size_t)n * slot);
    assert_int_equal(vqp_sw_mr_reg(m.devs[1], rbuf, (size_t)n * slot,
                                   SW_TEST_ACCESS_ALL, &mr, &lkey, &rkey),
                     UCS_OK);
    assert_int_equal(sw_test_cq_create(m.devs[0], 256, &scq), UCS_OK);
    assert_int_equal(sw_test_cq_create(m.devs[1], 256, &rcq), UCS_OK);
    assert_int_equal(
        sw_test_qp_create(m.devs[0], &scq, &scq, NULL, 256, 0, 0, &qa), UCS_OK);
    assert_int_equal(
        sw_test_qp_create(m.devs[1], &rcq, &rcq, NULL, 1, 256, 0, &qb), UCS_OK);
    assert_int_equal(
        sw_test_qp_connect(&qa, &m.addr[1], qb.qpn, SW_TEST_ACCESS_ALL, 7, 3),
        UCS_OK);
    assert_int_equal(
        sw_test_qp_connect(&qb, &m.addr[0], qa.qpn, SW_TEST_ACCESS_ALL, 7, 3),
        UCS_OK);
    fill(m.buf[0], BUF, 3);
    for (i = 0; i < n; ++i) {
        sw_test_post_recv(&qb, rbuf + (size_t)i * slot, slot, lkey);
    }
    for (i = 0; i < n; ++i) {
        sw_test_dseg(&qa, 1, m.buf[0] + (i % 3) * 64, len, m.lkey[0]);
        sw_test_ctrl(&qa, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
        sw_test_ring(&qa, 2);
    }
    /* Only the requester runs: all complete; the ring took `fit`, the rest
     * were placed by the requester. */
    for (i = 0; i < n; ++i) {
        assert_int_equal(sw_test_poll(&m.devs[0], 1, &scq, &cqe, 3000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    }
    for (i = 0; i < n; ++i) {
        if (!all_sent(rbuf + (size_t)i * slot, slot)) {
            assert_memory_equal(rbuf + (size_t)i * slot,
                                m.buf[0] + (i % 3) * 64, len);
            ++placed;
        }
    }
    assert_int_equal(placed, n - fit);
    for (i = 0; i < n; ++i) {
        assert_int_equal(sw_test_poll(m.devs, 2, &rcq, &cqe, 3000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
        assert_int_equal(be16toh(cqe.wqe_counter), i);
        assert_int_equal(be32toh(cqe.byte_cnt), len);
        assert_memory_equal(rbuf + (size_t)i * slot, m.buf[0] + (i % 3) * 64,
                            len);
    }
    vqp_sw_qp_destroy(qa.qp);
    vqp_sw_qp_destroy(qb.qp);
    vqp_sw_cq_destroy(scq.cq);
    vqp_sw_cq_destroy(rcq.cq);
    vqp_sw_mr_dereg(mr);
    free(rbuf);
    sm_fini(&m);
}

/* What the two processes read and write per message sits on separate
 * cache lines: a record's seq, header and a 24-byte payload share the
 * record's first line; the owner's life lock word (peers load it before
 * every small SEND) is not on the line of its robust-list links, which
 * glibc rewrites whenever the owner takes or releases another robust
 * mutex. */
static void test_small_line_layout(void **state)
{
    size_t lock = offsetof(vqp_sw_shm_t, life.__data.__lock);
    size_t list = offsetof(vqp_sw_shm_t, life.__data.__list);

    assert_true(offsetof(vqp_sw_shm_rec_t, data) + 24 <= 64);
    assert_int_equal(sizeof(vqp_sw_shm_rec_t) % 64, 0);
    assert_int_equal(offsetof(vqp_sw_shm_t, in) % 64, 0);
    assert_int_not_equal(lock / 64, list / 64);
    assert_int_not_equal(lock / 64, (list + 15) / 64);
    assert_int_not_equal(lock / 64, offsetof(vqp_sw_shm_t, arena_off) / 64);
}

/* The owner takes a record when its seq says it is published, not when
 * in_head moved: a record whose seq still holds the previous lap's value
 * is left alone (no CQE, no data placed) until the seq is stored. Small
 * payloads share the record's first cache line with the seq. */
static void test_small_record_seq(void **state)
{
    vqp_sw_shm_t *shm;
    vqp_sw_shm_rec_t *rec;
    struct mlx5_cqe64 cqe;
    uint16_t rwqe;
    uint32_t seq;
    unsigned i;
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    fill(m.buf[0], 24, 3);
    rwqe = sm_recv1(&m, 0, 64);
    sm_send(&m, MLX5_OPCODE_SEND, 0, 24, 0, false);
    assert_int_equal(sm_poll_only(&m, 0, &cqe), 0);
    shm = m.devs[1]->shm;
    assert_int_equal(shm->in_head, shm->in_tail + 1);
    rec = &shm->in[shm->in_tail & (VQP_SW_INBOUND - 1)];
    seq = __atomic_load_n(&rec->seq, __ATOMIC_ACQUIRE);
    assert_int_equal(seq, (uint32_t)(shm->in_tail + 1));
    /* As if the producer had not stored the seq yet. */
    __atomic_store_n(&rec->seq, seq - VQP_SW_INBOUND, __ATOMIC_RELEASE);
    for (i = 0; i < 10; ++i) {
        vqp_sw_progress(m.devs[1]);
    }
    assert_null(sw_test_cq_peek(&m.rcq[1]));
    assert_true(all_sent(m.buf[1], 64));
    assert_int_equal(shm->in_tail + 1, shm->in_head);
    __atomic_store_n(&rec->seq, seq, __ATOMIC_RELEASE);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND, 24, rwqe, 0, m.qp[0].qpn);
    assert_memory_equal(m.buf[1], m.buf[0], 24);
    assert_true(all_sent(m.buf[1] + 24, 40));
    assert_int_equal(shm->in_tail, shm->in_head);
    sm_fini(&m);
}

/* One receive WQE of four segments with gaps between them: a small
 * message fills them in order, exactly, and stops mid-segment. */
static void test_small_scatter(void **state)
{
    static const unsigned off[RQ_SGE] = {100, 200, 300, 1000};
    static const uint32_t len[RQ_SGE] = {5, 17, 40, 300};
    static const uint32_t msgs[]      = {100, 62, 3};
    struct mlx5_cqe64 cqe;
    unsigned i, s, done, chunk;
    uint16_t rwqe;
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    for (i = 0; i < 3; ++i) {
        memset(m.buf[1], SENT, 2048);
        fill(m.buf[0], msgs[i], i);
        rwqe = sm_post_recv(&m, RQ_SGE, off, len);
        sm_send(&m, MLX5_OPCODE_SEND_IMM, 0, msgs[i], htobe32(7), i == 2);
        assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
        check_resp(&cqe, MLX5_CQE_RESP_SEND_IMM, msgs[i], rwqe, htobe32(7),
                   m.qp[0].qpn);
        for (s = 0, done = 0; s < RQ_SGE; ++s) {
            chunk = (len[s] < msgs[i] - done) ? len[s] : msgs[i] - done;
            assert_memory_equal(m.buf[1] + off[s], m.buf[0] + done, chunk);
            assert_true(all_sent(m.buf[1] + off[s] + chunk, len[s] - chunk));
            done += chunk;
        }
        assert_int_equal(done, msgs[i]);
        assert_true(all_sent(m.buf[1], off[0]));
        assert_true(
            all_sent(m.buf[1] + off[0] + len[0], off[1] - off[0] - len[0]));
        assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    }
    sm_fini(&m);
}

/* A small message larger than its receive WQE: requester 0x12, responder
 * RESP_ERR 0x01 on that WQE and ERROR (the next RQ WQE and the next SEND
 * flushed), nothing written. */
static void test_small_local_length(void **state)
{
    static const unsigned off[2] = {0, 64};
    static const uint32_t len[2] = {10, 6};
    struct mlx5_cqe64 cqe;
    uint16_t rwqe, rwqe2, swqe, swqe2;
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    fill(m.buf[0], 100, 3);
    rwqe               = sm_post_recv(&m, 2, off, len);
    rwqe2              = sm_recv1(&m, 512, 512);
    sw_test_log_buf[0] = '\0';
    ucs_log_push_handler(sw_test_log_handler);
    swqe = sm_send(&m, MLX5_OPCODE_SEND, 0, 17, 0, false);
    assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
    ucs_log_pop_handler();
    assert_true(sw_test_log_has("17-byte message does not fit receive WQE"));
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
    assert_int_equal(be16toh(cqe.wqe_counter), swqe);
    swqe2 = sm_send(&m, MLX5_OPCODE_SEND, 0, 4, 0, false);
    assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_synd(&cqe), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(be16toh(cqe.wqe_counter), swqe2);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
    assert_int_equal(be16toh(cqe.wqe_counter), rwqe);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    assert_int_equal(sw_test_cqe_synd(&cqe), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    assert_int_equal(be16toh(cqe.wqe_counter), rwqe2);
    assert_int_equal(vqp_sw_qp_state(m.qp[1].qp), IBV_QPS_ERR);
    assert_true(all_sent(m.buf[1], 1024));
    sm_fini(&m);
}

/* Through an SRQ: a burst of small, threshold and large messages (one
 * merged run mixing both placements), in order, wqe_counter = SRQ entry,
 * srqn set, data in place. */
static void test_small_srq(void **state)
{
    static const uint32_t sizes[] = {
        10, VQP_SW_SMALL_SEND, 1, VQP_SW_SMALL_SEND + 1, 2000, 0, 77};
    const unsigned n = sizeof(sizes) / sizeof(sizes[0]);
    uint16_t rwqe[sizeof(sizes) / sizeof(sizes[0])];
    static const uint32_t len2[2] = {40, 2048 - 40};
    struct mlx5_cqe64 cqe;
    unsigned off2[2], i;
    sm_t m;

    assert_int_equal(sm_init(&m, true, 7), 0);
    fill(m.buf[0], 8192, 9);
    for (i = 0; i < n; ++i) {
        /* Two segments: 40 bytes, then the rest of a 2 KiB slot. */
        off2[0] = i * 2048;
        off2[1] = i * 2048 + 40;
        rwqe[i] = sm_post_recv(&m, 2, off2, len2);
    }
    for (i = 0; i < n; ++i) {
        sm_send(&m, MLX5_OPCODE_SEND_IMM, i * 16, sizes[i], htobe32(i), false);
    }
    for (i = 0; i < n; ++i) {
        assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
        check_resp(&cqe, MLX5_CQE_RESP_SEND_IMM, sizes[i], rwqe[i], htobe32(i),
                   m.qp[0].qpn);
        assert_int_equal(be32toh(cqe.srqn_uidx) & 0xffffff, m.srq.dv.srqn);
        assert_memory_equal(m.buf[1] + i * 2048, m.buf[0] + i * 16, sizes[i]);
        assert_true(all_sent(m.buf[1] + i * 2048 + sizes[i], 2048 - sizes[i]));
    }
    for (i = 0; i < n; ++i) {
        assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    }
    sm_fini(&m);
}

/* No receive WQE: a small SEND waits (RNR) without touching anything,
 * then goes through once one is posted; with a spent budget 0x16. */
static void test_small_rnr(void **state)
{
    struct mlx5_cqe64 cqe;
    uint16_t rwqe;
    unsigned i;
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    fill(m.buf[0], 64, 1);
    sm_send(&m, MLX5_OPCODE_SEND, 0, 64, 0, false);
    for (i = 0; i < 50; ++i) {
        vqp_sw_progress(m.devs[0]);
        vqp_sw_progress(m.devs[1]);
        usleep(20);
    }
    assert_null(sw_test_cq_peek(&m.scq[0]));
    assert_null(sw_test_cq_peek(&m.rcq[1]));
    rwqe = sm_recv1(&m, 128, 64);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND, 64, rwqe, 0, m.qp[0].qpn);
    assert_memory_equal(m.buf[1] + 128, m.buf[0], 64);
    assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    sm_fini(&m);

    assert_int_equal(sm_init(&m, false, 2), 0);
    sm_send(&m, MLX5_OPCODE_SEND, 0, 8, 0, true);
    assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe),
                     MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
    assert_null(sw_test_cq_peek(&m.rcq[1]));
    assert_true(all_sent(m.buf[1], BUF));
    sm_fini(&m);
}

/* Small SEND, then a WRITE elsewhere, a WRITE over the small SEND's receive
 * buffer, and a large SEND, posted together on one QP. The receiver sees
 * its two CQEs in order with the data in place, and the overlapping WRITE
 * lands after the SEND's payload, as in posting order: it waits for the
 * receiver to place that payload. */
static void test_small_order(void **state)
{
    struct mlx5_cqe64 cqe;
    uint16_t r1, r2, s[4];
    unsigned i;
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    fill(m.buf[0], 4096, 4);
    r1   = sm_recv1(&m, 0, 64);
    r2   = sm_recv1(&m, 4096, 2048);
    s[0] = sm_send(&m, MLX5_OPCODE_SEND, 0, 32, 0, false);
    s[1] = sm_write(&m, 1000, 8192, 100);
    s[2] = sm_write(&m, 2000, 16, 8); /* inside the small SEND's buffer */
    s[3] = sm_send(&m, MLX5_OPCODE_SEND_IMM, 2048, 1500, htobe32(5), false);
    /* Only the requester runs: the first two complete, the overlapping
     * WRITE waits for the payload to be placed, and so does the rest. */
    for (i = 0; i < 2; ++i) {
        assert_int_equal(sm_poll_only(&m, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), s[i]);
    }
    for (i = 0; i < 20; ++i) {
        vqp_sw_progress(m.devs[0]);
    }
    assert_null(sw_test_cq_peek(&m.scq[0]));
    assert_memory_equal(m.buf[1] + 8192, m.buf[0] + 1000, 100);
    assert_true(all_sent(m.buf[1], 64));
    assert_true(all_sent(m.buf[1] + 4096, 2048));
    /* Both run now. */
    for (i = 2; i < 4; ++i) {
        assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), s[i]);
    }
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND, 32, r1, 0, m.qp[0].qpn);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND_IMM, 1500, r2, htobe32(5), m.qp[0].qpn);
    assert_memory_equal(m.buf[1], m.buf[0], 16);
    assert_memory_equal(m.buf[1] + 16, m.buf[0] + 2000, 8);
    assert_memory_equal(m.buf[1] + 24, m.buf[0] + 24, 8);
    assert_true(all_sent(m.buf[1] + 32, 32));
    assert_memory_equal(m.buf[1] + 4096, m.buf[0] + 2048, 1500);
    assert_memory_equal(m.buf[1] + 8192, m.buf[0] + 1000, 100);
    sm_fini(&m);
}

/* Only overlap waits: with two small SENDs still unplaced (buffers at 0 and
 * 12 KiB), a WRITE between them, and one after, go ahead at once; the
 * receiver later places both payloads, CQEs in order. */
static void test_small_order_disjoint(void **state)
{
    struct mlx5_cqe64 cqe;
    uint16_t r[2], s[4];
    unsigned i;
    sm_t m;

    assert_int_equal(sm_init(&m, false, 7), 0);
    fill(m.buf[0], 4096, 6);
    r[0] = sm_recv1(&m, 0, 128);
    r[1] = sm_recv1(&m, 12288, 128);
    s[0] = sm_send(&m, MLX5_OPCODE_SEND, 0, 100, 0, false);
    s[1] = sm_send(&m, MLX5_OPCODE_SEND, 200, 50, 0, true);
    s[2] = sm_write(&m, 1000, 6000, 64);
    s[3] = sm_write(&m, 2000, 12288 + 128, 32); /* right after buffer 2 */
    for (i = 0; i < 4; ++i) {
        assert_int_equal(sm_poll_only(&m, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(be16toh(cqe.wqe_counter), s[i]);
    }
    assert_memory_equal(m.buf[1] + 6000, m.buf[0] + 1000, 64);
    assert_memory_equal(m.buf[1] + 12288 + 128, m.buf[0] + 2000, 32);
    assert_true(all_sent(m.buf[1], 128));
    assert_true(all_sent(m.buf[1] + 12288, 128));
    assert_null(sw_test_cq_peek(&m.rcq[1]));
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND, 100, r[0], 0, m.qp[0].qpn);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND, 50, r[1], 0, m.qp[0].qpn);
    assert_memory_equal(m.buf[1], m.buf[0], 100);
    assert_memory_equal(m.buf[1] + 12288, m.buf[0] + 200, 50);
    assert_true(all_sent(m.buf[1] + 100, 28));
    sm_fini(&m);
}

/* The receiver's next progress fails receive WQE @a rwqe with @a synd
 * (RESP_ERR, its QP in ERROR) and logs @a log. */
static void sm_expect_recv_fail(sm_t *m, uint16_t rwqe, uint8_t synd,
                                const char *log)
{
    struct mlx5_cqe64 cqe;

    sw_test_log_buf[0] = '\0';
    ucs_log_push_handler(sw_test_log_handler);
    assert_int_equal(sm_poll(m, 1, 1, &cqe), 0);
    ucs_log_pop_handler();
    assert_true(sw_test_log_has(log));
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_ERR);
    assert_int_equal(sw_test_cqe_synd(&cqe), synd);
    assert_int_equal(be16toh(cqe.wqe_counter), rwqe);
    assert_int_equal(vqp_sw_qp_state(m->qp[1].qp), IBV_QPS_ERR);
}

/* The receiver deregisters the buffer of a posted receive WQE after a
 * small or staged message took it but before its engine placed the
 * payload: its own check at placement refuses (RESP_ERR 0x04, ERROR),
 * nothing is written. */
static void test_small_owner_recheck(void **state)
{
    static const uint32_t sizes[] = {48, 3000};
    const uint32_t rlen           = 4096;
    struct mlx5_cqe64 cqe;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
    uint8_t *rbuf = aligned_alloc(64, 4096);
    uint16_t rwqe;
    unsigned i;
    sm_t m;

    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        assert_int_equal(sm_init(&m, false, 7), 0);
        memset(rbuf, SENT, 4096);
        assert_int_equal(vqp_sw_mr_reg(m.devs[1], rbuf, 4096,
                                       IBV_ACCESS_LOCAL_WRITE, &mr, &lkey,
                                       &rkey),
                         UCS_OK);
        rwqe = sm_post_segs(&m, 1, &rbuf, &rlen, lkey);
        fill(m.buf[0], sizes[i], 2);
        sm_send(&m, MLX5_OPCODE_SEND, 0, sizes[i], 0, false);
        assert_int_equal(sm_poll_only(&m, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(vqp_sw_mr_dereg(mr), UCS_OK);
        sm_expect_recv_fail(&m, rwqe, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR,
                            "changed after the message arrived");
        assert_true(all_sent(rbuf, 4096));
        /* The staged bytes are free again all the same. */
        assert_int_equal(m.devs[1]->shm->stage_tail,
                         m.devs[1]->shm->stage_head);
        sm_fini(&m);
    }
    free(rbuf);
}

/* The owner does not trust where a record says its staged payload is: a
 * stage_end beyond the ring's size past its tail, or closer to the tail
 * than the payload is long, fails the receive (RESP_ERR 0x02, ERROR,
 * logged) without placing anything or moving the ring's tail; a record
 * with byte_cnt above VQP_SW_STAGE_SEND likewise. */
static void test_stage_corrupt_record(void **state)
{
    vqp_sw_shm_rec_t *rec;
    struct mlx5_cqe64 cqe;
    vqp_sw_shm_t *shm;
    uint64_t tail;
    uint16_t rwqe;
    unsigned i;
    sm_t m;

    for (i = 0; i < 3; ++i) {
        assert_int_equal(sm_init(&m, false, 7), 0);
        shm  = m.devs[1]->shm;
        tail = shm->stage_tail;
        fill(m.buf[0], 1000, 8);
        rwqe = sm_recv1(&m, 0, 2048);
        sm_send(&m, MLX5_OPCODE_SEND, 0, 1000, 0, false);
        assert_int_equal(sm_poll_only(&m, 0, &cqe), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        rec = &shm->in[shm->in_tail & (VQP_SW_INBOUND - 1)];
        assert_int_equal(rec->flags, VQP_SW_REC_STAGED);
        assert_int_equal(rec->stage_end, (uint32_t)shm->stage_head);
        if (i == 0) {
            rec->stage_end += VQP_SW_STAGE_SIZE;
        } else if (i == 1) {
            rec->stage_end = (uint32_t)tail + 512; /* 1024 bytes needed */
        } else {
            rec->byte_cnt = VQP_SW_STAGE_SEND + 64;
        }
        sm_expect_recv_fail(&m, rwqe, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
                            "do not follow the ring's tail");
        assert_true(all_sent(m.buf[1], 2048));
        assert_int_equal(shm->stage_tail, tail);
        assert_int_equal(shm->in_tail, shm->in_head);
        sm_fini(&m);
    }
}

/* ---- across processes ---- */

typedef struct pinfo {
    vqp_sw_dev_addr_t addr;
    uint32_t qpn;
} pinfo_t;

typedef struct pside {
    vqp_sw_dev_t *dev;
    sw_test_cq_t scq, rcq;
    sw_test_qp_t qp;
    uint8_t *buf;
    vqp_sw_mr_t *mr;
    uint32_t lkey, rkey;
} pside_t;

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

static int pside_open(pside_t *s)
{
    memset(s, 0, sizeof(*s));
    s->buf = aligned_alloc(64, BUF);
    memset(s->buf, 0, BUF);
    return ((vqp_sw_dev_open("vqp_sw0", &s->dev) != UCS_OK) ||
            (vqp_sw_mr_reg(s->dev, s->buf, BUF, SW_TEST_ACCESS_ALL, &s->mr,
                           &s->lkey, &s->rkey) != UCS_OK) ||
            (sw_test_cq_create(s->dev, 256, &s->scq) != UCS_OK) ||
            (sw_test_cq_create(s->dev, 256, &s->rcq) != UCS_OK) ||
            (sw_test_qp_create(s->dev, &s->scq, &s->rcq, NULL, 256, 32, 512,
                               &s->qp) != UCS_OK))
               ? -1
               : 0;
}

/* Exchanges addresses with the other process and connects. */
static int pside_connect(pside_t *s, int rfd, int wfd)
{
    pinfo_t me, peer;

    vqp_sw_dev_address(s->dev, &me.addr);
    me.qpn = s->qp.qpn;
    if ((write(wfd, &me, sizeof(me)) != (ssize_t)sizeof(me)) ||
        (xread(rfd, &peer, sizeof(peer)) != 0)) {
        return -1;
    }
    return sw_test_qp_connect(&s->qp, &peer.addr, peer.qpn, SW_TEST_ACCESS_ALL,
                              7, 3) == UCS_OK
               ? 0
               : -1;
}

#define ECHO_SLOT 512

static void *opener_thread(void *arg)
{
    return (void *)(intptr_t)pside_open(arg);
}

#define PROD_SLOT     2048 /* staged payloads of 257 .. PROD_SLOT bytes */
#define PROD_INFLIGHT 16
#define PROD_RQ       32 /* receives the parent keeps posted per producer */

/* Length and byte @a j of message @a i of producer @a c. */
static uint32_t prod_len(unsigned c, unsigned i)
{
    return VQP_SW_SMALL_SEND + 1 +
           (i * 389u + c * 97u) % (PROD_SLOT - VQP_SW_SMALL_SEND);
}

static uint8_t prod_byte(unsigned c, unsigned i, uint32_t j)
{
    return (uint8_t)(c * 131u + i * 7u + j * 13u + 1);
}

/* Child producer @a c: @a n staged SEND_IMMs (imm = index) as fast as
 * PROD_INFLIGHT slots allow. Returns 0 or the step that failed. */
static int child_produce(pside_t *s, unsigned c, unsigned n)
{
    struct mlx5_cqe64 cqe;
    unsigned i, done = 0;
    uint8_t *slot;
    uint32_t len, j;

    for (i = 0; i < n; ++i) {
        if (i - done == PROD_INFLIGHT) {
            if ((sw_test_poll(&s->dev, 1, &s->scq, &cqe, 5000) != 0) ||
                (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
                return 21;
            }
            ++done;
        }
        slot = s->buf + (i % PROD_INFLIGHT) * PROD_SLOT;
        len  = prod_len(c, i);
        for (j = 0; j < len; ++j) {
            slot[j] = prod_byte(c, i, j);
        }
        sw_test_dseg(&s->qp, 1, slot, len, s->lkey);
        sw_test_ctrl(&s->qp, MLX5_OPCODE_SEND_IMM, 2, MLX5_WQE_CTRL_CQ_UPDATE,
                     htobe32(i));
        sw_test_ring(&s->qp, 2);
    }
    for (; done < n; ++done) {
        if ((sw_test_poll(&s->dev, 1, &s->scq, &cqe, 5000) != 0) ||
            (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
            return 22;
        }
    }
    return 0;
}

/* What a child of mode 'x' leaves open when it exits (not static: the
 * compiler would drop the store to a variable nobody reads). */
pside_t left_open;

/* Child: receive @a n messages into 512-byte slots and send each back
 * (same bytes, imm + 1); mode 'x': exit once the parent connected, receives
 * posted, without closing; mode 't': as 'e', but the device is opened by
 * a thread that ends before any traffic (its life lock turns owner-died
 * while the process lives on); modes 'p' and 'q': producers 0 and 1
 * (child_produce), once the parent says go. */
static int child_main(int rfd, int wfd, char mode, unsigned n)
{
    struct mlx5_cqe64 cqe;
    uint32_t len, imm;
    pthread_t th;
    void *ret = (void *)(intptr_t)-1;
    uint16_t wqe;
    unsigned i, ds;
    pside_t s;
    char c;

    if (mode == 't') {
        if ((pthread_create(&th, NULL, opener_thread, &s) != 0) ||
            (pthread_join(th, &ret) != 0) || (ret != NULL)) {
            return 15;
        }
    } else if (pside_open(&s) != 0) {
        return 10;
    }
    if (pside_connect(&s, rfd, wfd) != 0) {
        return 10;
    }
    for (i = 0; i < 16; ++i) {
        sw_test_post_recv(&s.qp, s.buf + i * ECHO_SLOT, ECHO_SLOT, s.lkey);
    }
    if ((write(wfd, "r", 1) != 1) || (mode == 'x')) {
        /* 'x' exits without closing, on purpose: what it leaves open stays
         * reachable (no leak for valgrind to report). It waits for the
         * parent's word first: until the parent has mapped its segment, a
         * device opened by any other process (make -j check) could remove
         * it as a dead process's leftover. */
        left_open = s;
        if (mode == 'x') {
            (void)xread(rfd, &c, 1);
        }
        return 0;
    }
    if ((mode == 'p') || (mode == 'q')) {
        /* Only once the parent's QP is connected and its receives posted:
         * a SEND to a QP not yet in RTR gets no ACK, and three retries of
         * about 1 ms fail ours if the parent is descheduled meanwhile. */
        if (xread(rfd, &c, 1) != 0) {
            return 16;
        }
        ret = (void *)(intptr_t)child_produce(&s, (unsigned)(mode - 'p'), n);
        if (ret != NULL) {
            return (int)(intptr_t)ret;
        }
        n = 0; /* nothing to echo */
    }
    for (i = 0; i < n; ++i) {
        if (sw_test_poll(&s.dev, 1, &s.rcq, &cqe, 5000) != 0) {
            return 11;
        }
        if (sw_test_cqe_opcode(&cqe) != MLX5_CQE_RESP_SEND_IMM) {
            return 12;
        }
        len = be32toh(cqe.byte_cnt);
        wqe = be16toh(cqe.wqe_counter);
        imm = be32toh(cqe.imm_inval_pkey) + 1;
        /* Echo from the receive slot (inline for odd imm), then repost. */
        if (len == 0) {
            ds = 1; /* byte_count 0 would mean 2 GiB */
        } else if (imm & 1) {
            ds = 1 +
                 sw_test_inline(&s.qp, 1, s.buf + (wqe % 16) * ECHO_SLOT, len);
        } else {
            ds = 2;
            sw_test_dseg(&s.qp, 1, s.buf + (wqe % 16) * ECHO_SLOT, len, s.lkey);
        }
        sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND_IMM, ds, MLX5_WQE_CTRL_CQ_UPDATE,
                     htobe32(imm));
        sw_test_ring(&s.qp, ds);
        if ((sw_test_poll(&s.dev, 1, &s.scq, &cqe, 5000) != 0) ||
            (sw_test_cqe_opcode(&cqe) != MLX5_CQE_REQ)) {
            return 13;
        }
        sw_test_post_recv(&s.qp, s.buf + (wqe % 16) * ECHO_SLOT, ECHO_SLOT,
                          s.lkey);
    }
    /* Stay until the parent is done with us. */
    if (xread(rfd, &c, 1) != 0) {
        return 14;
    }
    vqp_sw_qp_destroy(s.qp.qp);
    vqp_sw_dev_close(s.dev);
    free(s.buf);
    return 0;
}

/* A child in @a mode with its pipes; it connects once it reads our
 * address. */
static pid_t proc_fork(char mode, unsigned n, int *to_child, int *from_child)
{
    int a[2], b[2];
    pid_t pid;

    assert_int_equal(pipe(a), 0);
    assert_int_equal(pipe(b), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(a[1]);
        close(b[0]);
        _exit(child_main(a[0], b[1], mode, n));
    }
    close(a[0]);
    close(b[1]);
    *to_child   = a[1];
    *from_child = b[0];
    return pid;
}

static pid_t proc_start(pside_t *s, char mode, unsigned n, int *to_child,
                        int *from_child)
{
    pid_t pid = proc_fork(mode, n, to_child, from_child);
    char c;

    assert_int_equal(pside_open(s), 0);
    assert_int_equal(pside_connect(s, *from_child, *to_child), 0);
    assert_int_equal(xread(*from_child, &c, 1), 0);
    return pid;
}

/* Small and threshold-crossing SEND_IMMs echoed by another process, one at
 * a time and in bursts (merged runs), gather and inline both ways. */
static void test_small_two_process(void **state)
{
    static const uint32_t sizes[] = {1,   7,   8, 64, 255, VQP_SW_SMALL_SEND,
                                     257, 300, 0, 33, 128, 200};
    const unsigned n              = sizeof(sizes) / sizeof(sizes[0]);
    struct mlx5_cqe64 cqe;
    int to_child, from_child, status;
    unsigned i, j, k, got, ds;
    uint32_t len, imm;
    pside_t s;
    pid_t pid;

    pid = proc_start(&s, 'e', 2 * n, &to_child, &from_child);
    fill(s.buf, 8192, 11);
    for (i = 0; i < 16; ++i) {
        sw_test_post_recv(&s.qp, s.buf + 8192 + i * ECHO_SLOT, ECHO_SLOT,
                          s.lkey);
    }
    /* Round 0: one message at a time; round 1: all in one burst. */
    for (k = 0, got = 0; k < 2; ++k) {
        for (i = 0; i < n; ++i) {
            ds = (sizes[i] > 0) ? 2 : 1; /* byte_count 0 means 2 GiB */
            if (sizes[i] > 0) {
                sw_test_dseg(&s.qp, 1, s.buf + i * 256, sizes[i], s.lkey);
            }
            sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND_IMM, ds,
                         MLX5_WQE_CTRL_CQ_UPDATE, htobe32(2 * (k * n + i)));
            sw_test_ring(&s.qp, ds);
            if ((k == 1) && (i + 1 < n)) {
                continue;
            }
            for (j = got; j <= k * n + i; ++j, ++got) {
                assert_int_equal(sw_test_poll(&s.dev, 1, &s.rcq, &cqe, 3000),
                                 0);
                assert_int_equal(sw_test_cqe_opcode(&cqe),
                                 MLX5_CQE_RESP_SEND_IMM);
                len = be32toh(cqe.byte_cnt);
                imm = be32toh(cqe.imm_inval_pkey);
                assert_int_equal(imm, 2 * j + 1);
                assert_int_equal(len, sizes[j % n]);
                assert_memory_equal(
                    s.buf + 8192 + (be16toh(cqe.wqe_counter) % 16) * ECHO_SLOT,
                    s.buf + (j % n) * 256, len);
                sw_test_post_recv(
                    &s.qp,
                    s.buf + 8192 + (be16toh(cqe.wqe_counter) % 16) * ECHO_SLOT,
                    ECHO_SLOT, s.lkey);
            }
        }
    }
    for (i = 0; i < 2 * n; ++i) {
        assert_int_equal(sw_test_poll(&s.dev, 1, &s.scq, &cqe, 3000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    }
    assert_int_equal(write(to_child, "x", 1), 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(to_child);
    close(from_child);
    vqp_sw_qp_destroy(s.qp.qp);
    vqp_sw_dev_close(s.dev);
    free(s.buf);
}

/* The peer's device was opened by a thread that has ended; the process
 * lives on and serves it from another thread. Its life lock reads
 * owner-died, which must not be taken for a dead peer: small messages
 * still go through both ways (the requester asks kill() from then on). */
static void test_small_opener_thread_gone(void **state)
{
    static const uint32_t sizes[] = {8, 100, VQP_SW_SMALL_SEND};
    const unsigned n              = sizeof(sizes) / sizeof(sizes[0]);
    struct mlx5_cqe64 cqe;
    int to_child, from_child, status;
    unsigned i;
    pside_t s;
    pid_t pid;

    pid = proc_start(&s, 't', n, &to_child, &from_child);
    fill(s.buf, 4096, 21);
    for (i = 0; i < n; ++i) {
        sw_test_post_recv(&s.qp, s.buf + 8192 + i * ECHO_SLOT, ECHO_SLOT,
                          s.lkey);
    }
    for (i = 0; i < n; ++i) {
        sw_test_dseg(&s.qp, 1, s.buf + i * 512, sizes[i], s.lkey);
        sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND_IMM, 2, MLX5_WQE_CTRL_CQ_UPDATE,
                     htobe32(2 * i));
        sw_test_ring(&s.qp, 2);
        assert_int_equal(sw_test_poll(&s.dev, 1, &s.scq, &cqe, 3000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
        assert_int_equal(sw_test_poll(&s.dev, 1, &s.rcq, &cqe, 3000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND_IMM);
        assert_int_equal(be32toh(cqe.imm_inval_pkey), 2 * i + 1);
        assert_int_equal(be32toh(cqe.byte_cnt), sizes[i]);
        assert_memory_equal(s.buf + 8192 + i * ECHO_SLOT, s.buf + i * 512,
                            sizes[i]);
    }
    assert_int_equal(write(to_child, "x", 1), 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(to_child);
    close(from_child);
    vqp_sw_qp_destroy(s.qp.qp);
    vqp_sw_dev_close(s.dev);
    free(s.buf);
}

/* The peer exited without closing and is not reaped yet (a zombie): a small
 * SEND, which needs no syscall into it, still ends in 0x15, never in a
 * success nobody will ever see. */
static void test_small_dead_peer(void **state)
{
    static const uint32_t sizes[] = {64, 500}; /* receives of 512 */
    struct mlx5_cqe64 cqe;
    int to_child, from_child, status;
    siginfo_t si;
    unsigned i;
    pside_t s;
    pid_t pid;

    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        pid = proc_start(&s, 'x', 0, &to_child, &from_child);
        assert_int_equal(write(to_child, "x", 1), 1); /* we are connected */
        memset(&si, 0, sizeof(si));
        assert_int_equal(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
        sw_test_dseg(&s.qp, 1, s.buf, sizes[i], s.lkey);
        sw_test_ctrl(&s.qp, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE, 0);
        sw_test_ring(&s.qp, 2);
        assert_int_equal(sw_test_poll(&s.dev, 1, &s.scq, &cqe, 3000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ_ERR);
        assert_int_equal(sw_test_cqe_synd(&cqe),
                         MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        close(to_child);
        close(from_child);
        vqp_sw_qp_destroy(s.qp.qp);
        vqp_sw_dev_close(s.dev);
        free(s.buf);
    }
    /* A device opened now removes the last child's segment (a dead
     * process's, in this program's namespace, where nobody else would). */
    assert_int_equal(vqp_sw_dev_open("vqp_sw0", &s.dev), UCS_OK);
    vqp_sw_dev_close(s.dev);
}

/* Two producer processes send staged SEND_IMMs of 257 B .. 2 KiB at once
 * to two QPs of one device here (one staging ring, one lock, two
 * producers): every message arrives once, in its QP's order, byte-exact,
 * while the ring wraps several times. */
static void test_stage_two_producers(void **state)
{
    const unsigned n = 3000;
    struct mlx5_cqe64 cqe;
    int to[2], from[2], status;
    unsigned got[2] = {0, 0}, c, k;
    uint64_t stage0;
    uint32_t len, qpn, j;
    uint8_t *slot;
    uint16_t wqe;
    pside_t s, t;
    pid_t pid[2];
    char ready;

    /* Both forked before our device opens, so that neither inherits it
     * (and leaves it unreleased at its exit). The second producer talks to
     * another QP of the same device. */
    pid[0] = proc_fork('p', n, &to[0], &from[0]);
    pid[1] = proc_fork('q', n, &to[1], &from[1]);
    assert_int_equal(pside_open(&s), 0);
    assert_int_equal(pside_connect(&s, from[0], to[0]), 0);
    assert_int_equal(xread(from[0], &ready, 1), 0);
    t = s;
    assert_int_equal(
        sw_test_qp_create(s.dev, &s.scq, &s.rcq, NULL, 4, PROD_RQ, 0, &t.qp),
        UCS_OK);
    assert_int_equal(pside_connect(&t, from[1], to[1]), 0);
    assert_int_equal(xread(from[1], &ready, 1), 0);
    stage0 = s.dev->shm->stage_head;
    for (c = 0; c < 2; ++c) {
        for (k = 0; k < PROD_RQ; ++k) {
            sw_test_post_recv(c ? &t.qp : &s.qp,
                              s.buf + (c * PROD_RQ + k) * PROD_SLOT, PROD_SLOT,
                              s.lkey);
        }
        assert_int_equal(write(to[c], "g", 1), 1);
    }
    while ((got[0] < n) || (got[1] < n)) {
        assert_int_equal(sw_test_poll(&s.dev, 1, &s.rcq, &cqe, 5000), 0);
        assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND_IMM);
        qpn = sw_test_cqe_qpn(&cqe);
        assert_true((qpn == s.qp.qpn) || (qpn == t.qp.qpn));
        c   = (qpn == t.qp.qpn);
        wqe = be16toh(cqe.wqe_counter);
        len = be32toh(cqe.byte_cnt);
        assert_int_equal(be32toh(cqe.imm_inval_pkey), got[c]);
        assert_int_equal(len, prod_len(c, got[c]));
        slot = s.buf + (c * PROD_RQ + wqe % PROD_RQ) * PROD_SLOT;
        for (j = 0; j < len; ++j) {
            if (slot[j] != prod_byte(c, got[c], j)) {
                fail_msg("producer %u message %u byte %u: 0x%x, not 0x%x", c,
                         got[c], j, slot[j], prod_byte(c, got[c], j));
            }
        }
        ++got[c];
        sw_test_post_recv(c ? &t.qp : &s.qp, slot, PROD_SLOT, s.lkey);
    }
    assert_true(s.dev->shm->stage_head - stage0 > 2 * VQP_SW_STAGE_SIZE);
    assert_int_equal(s.dev->shm->stage_tail, s.dev->shm->stage_head);
    for (c = 0; c < 2; ++c) {
        assert_int_equal(write(to[c], "d", 1), 1);
        assert_int_equal(waitpid(pid[c], &status, 0), pid[c]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        close(to[c]);
        close(from[c]);
    }
    vqp_sw_qp_destroy(t.qp.qp);
    vqp_sw_qp_destroy(s.qp.qp);
    vqp_sw_dev_close(s.dev);
    free(s.buf);
}

/* The target's segment lock held elsewhere (a peer process descheduled in
 * its critical section): SENDs of each route (in the record, staged,
 * transferred by the requester) and an atomic wait as
 * backpressure, with no retry, RNR wait or error counted; the target's own
 * QP creation and connection do not wait for the lock; once it is free all
 * complete in posting order with their data. */
static void test_target_lock_held(void **state)
{
    const uint32_t large = 4 * VQP_SW_SMALL_SEND + 100;
    const uint32_t huge  = VQP_SW_STAGE_SEND + 100;
    sw_test_lock_holder_t holder;
    uint16_t w_small, w_large, w_huge, w_atomic;
    struct mlx5_cqe64 cqe;
    vqp_sw_qp_counters_t c;
    sw_test_qp_t extra;
    uint64_t *remote, *result;
    sw_test_qp_t *q;
    sm_t m;

    (void)state;
    assert_int_equal(sm_init(&m, false, 7), 0);
    q       = &m.qp[0];
    remote  = (uint64_t *)(m.buf[1] + BUF - 64);
    result  = (uint64_t *)(m.buf[0] + BUF - 64);
    *remote = 40;
    fill(m.buf[0], huge, 5);
    sm_recv1(&m, 0, 64);
    sm_recv1(&m, 4096, large);
    sm_recv1(&m, 8192, huge);

    assert_int_equal(sw_test_lock_hold(&holder, m.devs[1]), 0);
    w_small = sm_send(&m, MLX5_OPCODE_SEND, 0, 32, 0, false);
    w_large = sm_send(&m, MLX5_OPCODE_SEND, 0, large, 0, false);
    w_huge  = sm_send(&m, MLX5_OPCODE_SEND, 0, huge, 0, false);
    sw_test_ctrl(q, MLX5_OPCODE_ATOMIC_FA, 4, MLX5_WQE_CTRL_CQ_UPDATE, 0);
    sw_test_raddr(q, 1, (uintptr_t)remote, m.rkey[1]);
    sw_test_atomic(q, 2, 2, 0);
    sw_test_dseg(q, 3, result, 8, m.lkey[0]);
    w_atomic = sw_test_ring(q, 4);
    assert_int_equal(sw_test_poll(m.devs, 2, &m.scq[0], &cqe, 200), -1);
    assert_int_equal(sw_test_poll(m.devs, 2, &m.rcq[1], &cqe, 10), -1);
    assert_true(all_sent(m.buf[1], 64));
    assert_int_equal(*remote, 40);
    vqp_sw_qp_counters(q->qp, &c);
    assert_int_equal(c.retries, 0);
    assert_int_equal(c.rnr_retries, 0);
    assert_int_equal(c.errors, 0);
    assert_int_equal(vqp_sw_qp_state(q->qp), IBV_QPS_RTS);
    /* The owner's control path: a new QP up to RTS. */
    assert_int_equal(sw_test_qp_create(m.devs[1], &m.scq[1], &m.rcq[1], NULL,
                                       16, 16, 0, &extra),
                     UCS_OK);
    assert_int_equal(sw_test_qp_connect(&extra, &m.addr[0], m.qp[0].qpn,
                                        SW_TEST_ACCESS_ALL, 7, 3),
                     UCS_OK);
    sw_test_lock_release(&holder);

    assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be16toh(cqe.wqe_counter), w_small);
    assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
    assert_int_equal(be16toh(cqe.wqe_counter), w_large);
    assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
    assert_int_equal(be16toh(cqe.wqe_counter), w_huge);
    assert_int_equal(sm_poll(&m, 0, 0, &cqe), 0);
    assert_int_equal(sw_test_cqe_opcode(&cqe), MLX5_CQE_REQ);
    assert_int_equal(be16toh(cqe.wqe_counter), w_atomic);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND, 32, 0, 0, m.qp[0].qpn);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND, large, 1, 0, m.qp[0].qpn);
    assert_int_equal(sm_poll(&m, 1, 1, &cqe), 0);
    check_resp(&cqe, MLX5_CQE_RESP_SEND, huge, 2, 0, m.qp[0].qpn);
    assert_memory_equal(m.buf[1], m.buf[0], 32);
    assert_true(all_sent(m.buf[1] + 32, 32));
    assert_memory_equal(m.buf[1] + 4096, m.buf[0], large);
    assert_memory_equal(m.buf[1] + 8192, m.buf[0], huge);
    assert_int_equal(*remote, 42);
    assert_int_equal(be64toh(*result), 40);
    vqp_sw_qp_counters(q->qp, &c);
    assert_int_equal(c.retries + c.rnr_retries + c.errors, 0);
    assert_int_equal(vqp_sw_qp_destroy(extra.qp), UCS_OK);
    sm_fini(&m);
}

int main(void)
{
    /* The tests step each device's engine themselves and look at what one
     * step left: an idle executor (VQP_SW_EXEC=auto, the default) would run
     * a receiver the test left alone for a few milliseconds, which a loaded
     * machine makes happen. */
    setenv("VQP_SW_EXEC", "progress", 1);
    /* Our own namespace too: a device another test opens meanwhile must not
     * remove the segment of the dead peer test_small_dead_peer talks to. */
    char ns[32];
    snprintf(ns, sizeof(ns), "swsmall%u", (unsigned)getpid());
    setenv("VQP_SW_NAMESPACE", ns, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_integrity),
        cmocka_unit_test(test_small_threshold),
        cmocka_unit_test(test_stage_wrap),
        cmocka_unit_test(test_stage_full),
        cmocka_unit_test(test_small_record_seq),
        cmocka_unit_test(test_small_line_layout),
        cmocka_unit_test(test_small_scatter),
        cmocka_unit_test(test_small_local_length),
        cmocka_unit_test(test_small_srq),
        cmocka_unit_test(test_small_rnr),
        cmocka_unit_test(test_small_order),
        cmocka_unit_test(test_small_order_disjoint),
        cmocka_unit_test(test_small_owner_recheck),
        cmocka_unit_test(test_stage_corrupt_record),
        cmocka_unit_test(test_small_two_process),
        cmocka_unit_test(test_stage_two_producers),
        cmocka_unit_test(test_small_opener_thread_gone),
        cmocka_unit_test(test_small_dead_peer),
        cmocka_unit_test(test_target_lock_held),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
