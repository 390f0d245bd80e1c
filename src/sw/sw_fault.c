/*
 * Software mlx5 device: seeded fault injection. The configuration comes
 * from VQP_SW_FAULTS at open (or vqp_sw_dev_set_faults); every random
 * decision draws from one per-device generator, so the same seed and the
 * same sequence of calls give the same faults.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: tiny, good enough for fault decisions, fully determined by
 * the seed. */
static uint64_t vqp_sw_fault_next(vqp_sw_fault_t *f)
{
    uint64_t z = (f->rng += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double vqp_sw_fault_rand(vqp_sw_fault_t *f)
{
    return (double)(vqp_sw_fault_next(f) >> 11) * (1.0 / 9007199254740992.0);
}

static bool vqp_sw_parse_u64(const char *s, const char *end, uint64_t max,
                             uint64_t *v)
{
    char *e;

    if ((s == end) || (*s == '-')) {
        return false;
    }
    errno = 0;
    *v    = strtoull(s, &e, 0);
    return (errno == 0) && (e == end) && (*v <= max);
}

static bool vqp_sw_parse_prob(const char *s, const char *end, double *v)
{
    char *e;

    if (s == end) {
        return false;
    }
    errno = 0;
    *v    = strtod(s, &e);
    return (errno == 0) && (e == end) && (*v >= 0.0) && (*v <= 1.0);
}

static bool vqp_sw_parse_synd(const char *s, const char *end, uint8_t *synd)
{
    uint64_t v;

    if (!vqp_sw_parse_u64(s, end, 0xff, &v) || (v == 0)) {
        return false;
    }
    *synd = (uint8_t)v;
    return true;
}

static bool vqp_sw_fault_item(vqp_sw_fault_t *f, const char *key,
                              size_t key_len, const char *val, const char *end)
{
    const char *c1, *c2;
    uint64_t v, wqe;

#define VQP_SW_KEY(_k) ((key_len == strlen(_k)) && !strncmp(key, _k, key_len))
    if (VQP_SW_KEY("seed")) {
        if (!vqp_sw_parse_u64(val, end, UINT64_MAX, &v)) {
            return false;
        }
        f->rng = v;
        return true;
    } else if (VQP_SW_KEY("reorder")) {
        return vqp_sw_parse_prob(val, end, &f->reorder);
    } else if (VQP_SW_KEY("delay_us")) {
        if (!vqp_sw_parse_u64(val, end, 10000000, &v)) {
            return false;
        }
        f->delay_us = (unsigned)v;
        return true;
    } else if (VQP_SW_KEY("delay_prob")) {
        return vqp_sw_parse_prob(val, end, &f->delay_prob);
    } else if (VQP_SW_KEY("err_prob")) {
        c1 = memchr(val, ':', (size_t)(end - val));
        if (c1 != NULL) {
            return vqp_sw_parse_prob(val, c1, &f->err_prob) &&
                   vqp_sw_parse_synd(c1 + 1, end, &f->err_prob_synd);
        }
        return vqp_sw_parse_prob(val, end, &f->err_prob);
    } else if (VQP_SW_KEY("err")) {
        c1 = memchr(val, ':', (size_t)(end - val));
        c2 = c1 ? memchr(c1 + 1, ':', (size_t)(end - c1 - 1)) : NULL;
        if ((c2 == NULL) || (f->n_err == 8) ||
            !vqp_sw_parse_u64(val, c1, 0xffffff, &v) ||
            !vqp_sw_parse_u64(c1 + 1, c2, 0xffff, &wqe) ||
            !vqp_sw_parse_synd(c2 + 1, end, &f->err[f->n_err].synd)) {
            return false;
        }
        f->err[f->n_err].qpn   = (uint32_t)v;
        f->err[f->n_err++].wqe = (uint16_t)wqe;
        return true;
    } else if (VQP_SW_KEY("ud_drop")) {
        return vqp_sw_parse_prob(val, end, &f->ud_drop);
    } else if (VQP_SW_KEY("ud_dup")) {
        return vqp_sw_parse_prob(val, end, &f->ud_dup);
    } else if (VQP_SW_KEY("kill")) {
        if ((f->n_kill == 8) || !vqp_sw_parse_u64(val, end, 0xffffff, &v)) {
            return false;
        }
        f->kill[f->n_kill++] = (uint32_t)v;
        return true;
    }
#undef VQP_SW_KEY
    return false;
}

ucs_status_t vqp_sw_fault_parse(const char *spec, vqp_sw_fault_t *fault)
{
    vqp_sw_fault_t f;
    const char *p, *item_end, *eq;

    memset(&f, 0, sizeof(f));
    f.delay_prob    = 1.0;
    f.err_prob_synd = MLX5_CQE_SYNDROME_REMOTE_OP_ERR;
    if ((spec == NULL) || (*spec == '\0')) {
        *fault = f;
        return UCS_OK;
    }
    for (p = spec; *p != '\0';
         p = (*item_end == ',') ? item_end + 1 : item_end) {
        item_end = strchr(p, ',');
        if (item_end == NULL) {
            item_end = p + strlen(p);
        }
        eq = memchr(p, '=', (size_t)(item_end - p));
        if ((eq == NULL) ||
            !vqp_sw_fault_item(&f, p, (size_t)(eq - p), eq + 1, item_end)) {
            ucs_error("vqp_sw: fault spec '%s': bad item '%.*s' (expected "
                      "seed=N, reorder=P, delay_us=N, delay_prob=P, "
                      "err=QPN:WQE:SYND, err_prob=P[:SYND], kill=QPN, "
                      "ud_drop=P, ud_dup=P; P in [0,1])",
                      spec, (int)(item_end - p), p);
            return UCS_ERR_INVALID_PARAM;
        }
    }
    f.enabled = true;
    *fault    = f;
    return UCS_OK;
}

static ucs_status_t vqp_sw_dev_set_faults_locked(vqp_sw_dev_t *dev,
                                                 const char *spec)
{
    return vqp_sw_fault_parse(spec, &dev->fault);
}

ucs_status_t vqp_sw_dev_set_faults(vqp_sw_dev_t *dev, const char *spec)
{
    return VQP_SW_LOCKED(vqp_sw_dev_set_faults_locked(dev, spec));
}

/* Syndrome to inject on this WQE, or 0. A targeted error fires once. */
uint8_t vqp_sw_fault_wqe(vqp_sw_dev_t *dev, vqp_sw_qp_t *qp, uint16_t wqe)
{
    vqp_sw_fault_t *f = &dev->fault;
    unsigned i;
    uint8_t synd;

    if (!f->enabled) {
        return 0;
    }
    for (i = 0; i < f->n_err; ++i) {
        if ((f->err[i].qpn == qp->qpn) && (f->err[i].wqe == wqe)) {
            synd      = f->err[i].synd;
            f->err[i] = f->err[--f->n_err];
            return synd;
        }
    }
    /* Not a UD QP's: no retries, no responder, so none of the transport
     * errors err_prob stands for (a real one loses datagrams: ud_drop). */
    if ((f->err_prob > 0) && !qp->ud && (vqp_sw_fault_rand(f) < f->err_prob)) {
        return f->err_prob_synd;
    }
    return 0;
}

bool vqp_sw_fault_killed(vqp_sw_dev_t *dev, vqp_sw_qp_t *qp)
{
    vqp_sw_fault_t *f = &dev->fault;
    unsigned i;

    for (i = 0; i < f->n_kill; ++i) {
        if (f->kill[i] == qp->qpn) {
            f->kill[i] = f->kill[--f->n_kill];
            return true;
        }
    }
    return false;
}

unsigned vqp_sw_fault_ud_copies(vqp_sw_dev_t *dev)
{
    vqp_sw_fault_t *f = &dev->fault;

    if (!f->enabled) {
        return 1;
    }
    /* Both draws on every datagram when set, so the sequence of decisions
     * depends on the seed and the number of datagrams only. */
    if ((f->ud_drop > 0) && (vqp_sw_fault_rand(f) < f->ud_drop)) {
        return 0;
    }
    if ((f->ud_dup > 0) && (vqp_sw_fault_rand(f) < f->ud_dup)) {
        return 2;
    }
    return 1;
}
