/*
 * rc_vqp component and memory domain: what UCX sees of the transport before
 * any interface is opened.
 */
#ifndef UCT_RC_VQP_MD_H_
#define UCT_RC_VQP_MD_H_

#include <uct/base/uct_md.h>
#include <ucs/datastruct/khash.h>
#include <ucs/datastruct/list.h>
#include <ucs/memory/rcache.h>
#include <ucs/type/spinlock.h>

#define UCT_RC_VQP_NAME "rc_vqp"

#include <dev/vqp_dev.h>

/* Whether the software mlx5 device is offered (UCX_RC_VQP_SW). */
typedef enum uct_rc_vqp_sw_mode {
    UCT_RC_VQP_SW_NO,
    UCT_RC_VQP_SW_YES,
    UCT_RC_VQP_SW_AUTO, /* only when no mlx5 device is present */
    UCT_RC_VQP_SW_LAST
} uct_rc_vqp_sw_mode_t;

typedef struct uct_rc_vqp_md_config {
    uct_md_config_t super;
    int sw;                        /* uct_rc_vqp_sw_mode_t */
    int rcache_mode;               /* ucs_ternary_auto_value_t: RCACHE */
    uct_md_rcache_config_t rcache; /* RCACHE_*: UCT's registration cache */
} uct_rc_vqp_md_config_t;

/* Registrations of one address range, without the cache (rc_vqp_md.c). */
typedef struct uct_rc_vqp_md_range uct_rc_vqp_md_range_t;

typedef struct uct_rc_vqp_range_key {
    uintptr_t address;
    size_t length;
} uct_rc_vqp_range_key_t;

KHASH_TYPE(uct_rc_vqp_ranges, uct_rc_vqp_range_key_t, uct_rc_vqp_md_range_t *);

/* One memory domain per device (an HCA port or the software device), so
 * that memory keys and the interface's QPs share one protection domain. */
typedef struct uct_rc_vqp_md {
    uct_md_t super;
    vqp_dev_t *dev;
    /* Registrations cached until their memory is unmapped (or evicted):
     * UCP 1.13 registers every rendezvous buffer anew through the MD, and
     * an ibv_reg_mr per message costs more than the transfer. NULL when
     * RCACHE=n or UCM's memory events are unavailable. */
    ucs_rcache_t *rcache;
    ucs_linear_func_t reg_cost; /* md_attr.reg_cost */
    /* Without the cache: the registrations by address range, with the
     * invalidations that wait for registrations of theirs to go (the memory
     * is reachable through those). Under the lock: UCP may register from
     * any thread. */
    ucs_spinlock_t lock;
    khash_t(uct_rc_vqp_ranges) ranges;
    uint64_t reg_seq;
} uct_rc_vqp_md_t;

extern uct_component_t uct_rc_vqp_component;

#endif
