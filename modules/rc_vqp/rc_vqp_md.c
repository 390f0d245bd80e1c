/*
 * rc_vqp component and memory domains: device discovery (one memory domain
 * per hardware port, and the software device when no hardware is present or
 * the user asks for it), memory registration and remote keys. The module
 * registers itself from a constructor (UCX 1.13 loads only the modules fixed
 * at its build, so rc_vqp arrives by LD_PRELOAD or an application's dlopen),
 * after the ABI guard has accepted the UCX library it was loaded into.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <config.h>

#include "rc_vqp.h"
#include "rc_vqp_abi.h"

#include <ucm/api/ucm.h>
#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/compiler.h>
#include <ucs/sys/string.h>
#include <ucs/sys/sys.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *uct_rc_vqp_sw_names[] = {
    [UCT_RC_VQP_SW_NO]   = "n",
    [UCT_RC_VQP_SW_YES]  = "y",
    [UCT_RC_VQP_SW_AUTO] = "auto",
    [UCT_RC_VQP_SW_LAST] = NULL,
};

#define UCT_RC_VQP_SW_ENV "UCX_RC_VQP_SW"

static ucs_config_field_t uct_rc_vqp_md_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_rc_vqp_md_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_table)},

    {"SW", "auto",
     "Offer the software mlx5 device " VQP_DEV_SW_NAME " (a device in shared\n"
     "memory that moves data between processes of this host):\n"
     " y    - always, next to any hardware device\n"
     " n    - never\n"
     " auto - only when no mlx5 device is present, so that a host with real\n"
     "        HCAs never ends up on it by accident",
     ucs_offsetof(uct_rc_vqp_md_config_t, sw),
     UCS_CONFIG_TYPE_ENUM(uct_rc_vqp_sw_names)},

    {"RCACHE", "auto",
     "Keep memory registrations in a registration cache until the memory is\n"
     "unmapped (UCX's RCACHE_* settings below size it). UCP registers every\n"
     "rendezvous buffer through the memory domain; without the cache each\n"
     "message registers and deregisters its buffer with the device.\n"
     " y    - always; opening the memory domain fails if UCM's memory events\n"
     "        are unavailable\n"
     " try  - when UCM's memory events are available\n"
     " n    - never\n"
     " auto - try on an HCA; never on the software device, where a\n"
     "        registration only records the region",
     ucs_offsetof(uct_rc_vqp_md_config_t, rcache_mode),
     UCS_CONFIG_TYPE_TERNARY_AUTO},

    {"", "", NULL, ucs_offsetof(uct_rc_vqp_md_config_t, rcache),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_rcache_table)},

    {NULL}};

/* Every registration allows every access: UCT's memory handles carry no
 * rights, and one key serves puts, gets and atomics alike. */
#define UCT_RC_VQP_MR_ACCESS                            \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* A cached registration: the memory handle UCT sees is @a memh. */
typedef struct uct_rc_vqp_rcache_region {
    ucs_rcache_region_t super;
    uct_rc_vqp_memh_t memh;
} uct_rc_vqp_rcache_region_t;

/*
 * Invalidation without the cache. Registrations of one range share a
 * record (the cache would give them one region): an invalidation completes
 * once its own registration and those of the same range made before it
 * are gone, as the memory stays reachable through those. Later ones do not
 * hold it (a buffer sent again and again would, for ever). Invalidations
 * asked with no registration in between wait for the same ones: the first
 * heads the others in its range's list.
 */
typedef struct uct_rc_vqp_md_inval {
    ucs_list_link_t list; /* in its range's heads, or in its head's same */
    ucs_list_link_t same; /* head: the others with its seq */
    uint64_t seq;         /* head: waits for those numbered up to it */
    unsigned waits;       /* head: how many of those are live */
    uct_completion_t *comp;
} uct_rc_vqp_md_inval_t;

struct uct_rc_vqp_md_range {
    uintptr_t address;
    size_t length;
    unsigned live;          /* registrations of the range */
    ucs_list_link_t invals; /* heads, by seq */
};

static inline khint_t uct_rc_vqp_range_hash(uct_rc_vqp_range_key_t key)
{
    return kh_int64_hash_func(key.address ^
                              (key.length * 0x9e3779b97f4a7c15ull));
}

static inline int uct_rc_vqp_range_equal(uct_rc_vqp_range_key_t a,
                                         uct_rc_vqp_range_key_t b)
{
    return (a.address == b.address) && (a.length == b.length);
}

KHASH_IMPL(uct_rc_vqp_ranges, uct_rc_vqp_range_key_t, uct_rc_vqp_md_range_t *,
           1, uct_rc_vqp_range_hash, uct_rc_vqp_range_equal);

/* Invokes the completions of the heads in @a heads and of those behind
 * them, and frees them. */
static void uct_rc_vqp_md_complete(ucs_list_link_t *heads)
{
    uct_rc_vqp_md_inval_t *head, *inval, *tmp;

    while (!ucs_list_is_empty(heads)) {
        head = ucs_list_extract_head(heads, uct_rc_vqp_md_inval_t, list);
        ucs_list_for_each_safe(inval, tmp, &head->same, list)
        {
            uct_invoke_completion(inval->comp, UCS_OK);
            ucs_free(inval);
        }
        uct_invoke_completion(head->comp, UCS_OK);
        ucs_free(head);
    }
}

/* Read before any config object exists (UCT asks for MD resources first). */
static uct_rc_vqp_sw_mode_t uct_rc_vqp_sw_mode(void)
{
    const char *value = getenv(UCT_RC_VQP_SW_ENV);
    unsigned i;

    if (value == NULL) {
        return UCT_RC_VQP_SW_AUTO;
    }
    for (i = 0; i < UCT_RC_VQP_SW_LAST; ++i) {
        if (!strcasecmp(value, uct_rc_vqp_sw_names[i])) {
            return i;
        }
    }
    if (!strcasecmp(value, "yes") || !strcmp(value, "1")) {
        return UCT_RC_VQP_SW_YES;
    }
    if (!strcasecmp(value, "no") || !strcmp(value, "0")) {
        return UCT_RC_VQP_SW_NO;
    }
    ucs_warn("rc_vqp: %s=%s is not one of y, n, auto: using auto",
             UCT_RC_VQP_SW_ENV, value);
    return UCT_RC_VQP_SW_AUTO;
}

static ucs_status_t
uct_rc_vqp_query_md_resources(uct_component_t *component,
                              uct_md_resource_desc_t **resources_p,
                              unsigned *num_resources_p)
{
    uct_rc_vqp_sw_mode_t sw = uct_rc_vqp_sw_mode();
    uct_md_resource_desc_t *resources;
    vqp_dev_info_t *list;
    unsigned i, count, hw = 0;
    ucs_status_t status;

    status = vqp_dev_list(VQP_DEV_LIST_SW, &list, &count);
    if (status != UCS_OK) {
        return uct_md_query_empty_md_resource(resources_p, num_resources_p);
    }
    for (i = 0; i < count; ++i) {
        hw += (list[i].link != VQP_DEV_LINK_SW);
    }

    resources = ucs_calloc(ucs_max(count, 1u), sizeof(*resources),
                           "rc_vqp_md_resources");
    if (resources == NULL) {
        vqp_dev_list_free(list);
        return UCS_ERR_NO_MEMORY;
    }
    *num_resources_p = 0;
    for (i = 0; i < count; ++i) {
        if ((list[i].link == VQP_DEV_LINK_SW) &&
            ((sw == UCT_RC_VQP_SW_NO) ||
             ((sw == UCT_RC_VQP_SW_AUTO) && (hw > 0)))) {
            continue;
        }
        ucs_snprintf_zero(resources[*num_resources_p].md_name, UCT_MD_NAME_MAX,
                          "%s", list[i].name);
        ++*num_resources_p;
    }
    vqp_dev_list_free(list);
    *resources_p = resources;
    return UCS_OK;
}

static void uct_rc_vqp_md_close(uct_md_h uct_md)
{
    uct_rc_vqp_md_t *md = ucs_derived_of(uct_md, uct_rc_vqp_md_t);
    uct_rc_vqp_md_range_t *range;
    ucs_status_t status;

    if (md->rcache != NULL) {
        /* Deregisters what is still cached, before the device goes. */
        ucs_rcache_destroy(md->rcache);
    }
    status = vqp_dev_close(md->dev);
    /* Registrations never released went with the device, and with them
     * the last way to the memory of the invalidations waiting for them. */
    kh_foreach_value(&md->ranges, range, {
        ucs_diag("rc_vqp: memory domain closed with %u registration(s) of "
                 "%p+%zu",
                 range->live, (void *)range->address, range->length);
        uct_rc_vqp_md_complete(&range->invals);
        ucs_free(range);
    });
    kh_destroy_inplace(uct_rc_vqp_ranges, &md->ranges);
    ucs_spinlock_destroy(&md->lock);
    if (status != UCS_OK) {
        ucs_warn("rc_vqp: closing device with objects still alive: %s",
                 ucs_status_string(status));
    }
    ucs_free(md);
}

static ucs_status_t uct_rc_vqp_md_query(uct_md_h uct_md, uct_md_attr_t *attr)
{
    uct_rc_vqp_md_t *md = ucs_derived_of(uct_md, uct_rc_vqp_md_t);

    memset(attr, 0, sizeof(*attr));
    attr->cap.flags = UCT_MD_FLAG_REG | UCT_MD_FLAG_NEED_MEMH |
                      UCT_MD_FLAG_NEED_RKEY | UCT_MD_FLAG_INVALIDATE;
    attr->cap.reg_mem_types    = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    attr->cap.access_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    attr->cap.max_reg          = ULONG_MAX;
    /* No allocation (no UCT_MD_FLAG_ALLOC), but no limit either, as UCX's
     * IB MD says: UCX's p2p tests size their host buffers by it, and skip
     * every transfer test of a transport whose MD says 0. */
    attr->cap.max_alloc    = ULONG_MAX;
    attr->rkey_packed_size = sizeof(uct_rc_vqp_rkey_buf_t);
    attr->reg_cost         = md->reg_cost;
    memset(&attr->local_cpus, 0xff, sizeof(attr->local_cpus));
    return UCS_OK;
}

/* @a hide_errors: the caller retries or falls back (UCT's
 * UCT_MD_MEM_FLAG_HIDE_ERRORS, the cache's retry of a merged region), so a
 * refusal logs at diag level. */
static ucs_status_t uct_rc_vqp_memh_reg(uct_rc_vqp_md_t *md, void *address,
                                        size_t length, int hide_errors,
                                        uct_rc_vqp_memh_t *memh)
{
    memh->address = (uintptr_t)address;
    memh->length  = length;
    return vqp_dev_mr_reg(md->dev, address, length,
                          UCT_RC_VQP_MR_ACCESS |
                              (hide_errors ? VQP_DEV_MR_HIDE_ERRORS : 0),
                          &memh->mr, &memh->lkey, &memh->rkey);
}

/* Under the lock: @a memh leaves its range; the invalidations it held
 * back and are free now move to @a done. */
static void uct_rc_vqp_md_unlink(uct_rc_vqp_md_t *md, uct_rc_vqp_memh_t *memh,
                                 ucs_list_link_t *done)
{
    uct_rc_vqp_md_range_t *range = memh->range;
    uct_rc_vqp_md_inval_t *head, *tmp;

    --range->live;
    ucs_list_for_each_safe(head, tmp, &range->invals, list)
    {
        if ((memh->seq <= head->seq) && (--head->waits == 0)) {
            ucs_list_del(&head->list);
            ucs_list_add_tail(done, &head->list);
        }
    }
}

/* Under the lock: the invalidation of @a memh (already unlinked) completes
 * at once unless registrations of its range are live. */
static void uct_rc_vqp_md_invalidate(uct_rc_vqp_md_t *md,
                                     const uct_rc_vqp_memh_t *memh,
                                     uct_rc_vqp_md_inval_t *inval,
                                     ucs_list_link_t *done)
{
    uct_rc_vqp_md_range_t *range = memh->range;
    uct_rc_vqp_md_inval_t *last;

    ucs_list_head_init(&inval->same);
    inval->seq   = md->reg_seq; /* every live one is older */
    inval->waits = range->live;
    ucs_debug("rc_vqp: invalidated %p+%zu key 0x%x, %u other registration(s) "
              "of the range live",
              (void *)memh->address, memh->length, memh->rkey, range->live);
    if (range->live == 0) {
        ucs_list_add_tail(done, &inval->list);
        return;
    }
    if (!ucs_list_is_empty(&range->invals)) {
        last = ucs_list_tail(&range->invals, uct_rc_vqp_md_inval_t, list);
        if (last->seq == inval->seq) {
            ucs_list_add_tail(&last->same, &inval->list);
            return;
        }
    }
    ucs_list_add_tail(&range->invals, &inval->list);
}

/* Under the lock: @a memh joins the record of its range. */
static ucs_status_t uct_rc_vqp_md_link(uct_rc_vqp_md_t *md,
                                       uct_rc_vqp_memh_t *memh)
{
    uct_rc_vqp_range_key_t key = {memh->address, memh->length};
    uct_rc_vqp_md_range_t *range;
    khiter_t iter;
    int ret;

    iter = kh_put(uct_rc_vqp_ranges, &md->ranges, key, &ret);
    if (ret == UCS_KH_PUT_FAILED) {
        return UCS_ERR_NO_MEMORY;
    } else if (ret == UCS_KH_PUT_KEY_PRESENT) {
        range = kh_val(&md->ranges, iter);
    } else {
        range = ucs_malloc(sizeof(*range), "rc_vqp_range");
        if (range == NULL) {
            kh_del(uct_rc_vqp_ranges, &md->ranges, iter);
            return UCS_ERR_NO_MEMORY;
        }
        range->address = memh->address;
        range->length  = memh->length;
        range->live    = 0;
        ucs_list_head_init(&range->invals);
        kh_val(&md->ranges, iter) = range;
    }
    ++range->live;
    memh->range = range;
    memh->seq   = ++md->reg_seq;
    return UCS_OK;
}

/* Under the lock: a range without registrations has no invalidation
 * waiting either (each waits for live ones); its record goes. */
static void uct_rc_vqp_md_range_put(uct_rc_vqp_md_t *md,
                                    uct_rc_vqp_md_range_t *range)
{
    uct_rc_vqp_range_key_t key = {range->address, range->length};

    if (range->live > 0) {
        return;
    }
    ucs_assert(ucs_list_is_empty(&range->invals));
    kh_del(uct_rc_vqp_ranges, &md->ranges,
           kh_get(uct_rc_vqp_ranges, &md->ranges, key));
    ucs_free(range);
}

static ucs_status_t uct_rc_vqp_mem_reg(uct_md_h uct_md, void *address,
                                       size_t length, unsigned flags,
                                       uct_mem_h *memh_p)
{
    uct_rc_vqp_md_t *md = ucs_derived_of(uct_md, uct_rc_vqp_md_t);
    ucs_rcache_region_t *rregion;
    uct_rc_vqp_memh_t *memh;
    ucs_status_t status;

    if (md->rcache != NULL) {
        status = ucs_rcache_get(md->rcache, address, length,
                                PROT_READ | PROT_WRITE, &flags, &rregion);
        if (status != UCS_OK) {
            return status;
        }
        *memh_p = &ucs_derived_of(rregion, uct_rc_vqp_rcache_region_t)->memh;
        return UCS_OK;
    }

    memh = ucs_malloc(sizeof(*memh), "rc_vqp_memh");
    if (memh == NULL) {
        ucs_error("rc_vqp: out of memory registering %p+%zu", address, length);
        return UCS_ERR_NO_MEMORY;
    }
    status = uct_rc_vqp_memh_reg(md, address, length,
                                 flags & UCT_MD_MEM_FLAG_HIDE_ERRORS, memh);
    if (status != UCS_OK) {
        ucs_free(memh);
        return status;
    }
    ucs_spin_lock(&md->lock);
    status = uct_rc_vqp_md_link(md, memh);
    ucs_spin_unlock(&md->lock);
    if (status != UCS_OK) {
        ucs_error("rc_vqp: out of memory registering %p+%zu", address, length);
        vqp_dev_mr_dereg(memh->mr);
        ucs_free(memh);
        return status;
    }
    *memh_p = memh;
    return UCS_OK;
}

static void uct_rc_vqp_rcache_invalidated(void *arg)
{
    uct_invoke_completion(arg, UCS_OK);
}

/* UCX's own checks (UCT_MD_MEM_DEREG_CHECK_PARAMS) are compiled only with
 * parameter checking; these are always on. A diag line: UCX's tests pass
 * bad parameters on purpose and count error lines as failures. */
static ucs_status_t
uct_rc_vqp_mem_dereg_check(const uct_md_mem_dereg_params_t *params,
                           unsigned *flags_p, uct_completion_t **comp_p)
{
    uct_mem_h memh =
        UCT_MD_MEM_DEREG_FIELD_VALUE(params, memh, FIELD_MEMH, NULL);
    unsigned flags =
        UCT_MD_MEM_DEREG_FIELD_VALUE(params, flags, FIELD_FLAGS, 0);
    uct_completion_t *comp =
        UCT_MD_MEM_DEREG_FIELD_VALUE(params, comp, FIELD_COMPLETION, NULL);

    if (memh == NULL) {
        ucs_diag("rc_vqp: mem_dereg without a memory handle (field_mask "
                 "0x%lx)",
                 (unsigned long)params->field_mask);
        return UCS_ERR_INVALID_PARAM;
    }
    if (flags & ~UCT_MD_MEM_DEREG_FLAG_INVALIDATE) {
        ucs_diag("rc_vqp: mem_dereg of %p with unknown flags 0x%x", memh,
                 flags & ~UCT_MD_MEM_DEREG_FLAG_INVALIDATE);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE) && (comp == NULL)) {
        ucs_diag("rc_vqp: mem_dereg of %p with INVALIDATE needs a completion",
                 memh);
        return UCS_ERR_INVALID_PARAM;
    }
    *flags_p = flags;
    *comp_p  = comp;
    return UCS_OK;
}

static ucs_status_t
uct_rc_vqp_mem_dereg(uct_md_h uct_md, const uct_md_mem_dereg_params_t *params)
{
    uct_rc_vqp_md_t *md = ucs_derived_of(uct_md, uct_rc_vqp_md_t);
    uct_rc_vqp_rcache_region_t *region;
    uct_rc_vqp_memh_t *memh;
    ucs_status_t status;

    uct_rc_vqp_md_inval_t *inval = NULL;
    UCS_LIST_HEAD(done);
    uct_completion_t *comp;
    unsigned flags;

    status = uct_rc_vqp_mem_dereg_check(params, &flags, &comp);
    if (status != UCS_OK) {
        return status;
    }
    memh = params->memh;
    if (md->rcache != NULL) {
        /* The device registration stays until the memory is unmapped or
         * the cache evicts it; an invalidated one leaves the cache and
         * completes once every user of it has put it (then deregistered:
         * its key no longer passes, at the device's own guarantee). */
        region = ucs_container_of(memh, uct_rc_vqp_rcache_region_t, memh);
        if (flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE) {
            ucs_debug("rc_vqp: invalidating cached region %p+%zu key 0x%x",
                      (void *)memh->address, memh->length, memh->rkey);
            ucs_rcache_region_invalidate(md->rcache, &region->super,
                                         uct_rc_vqp_rcache_invalidated, comp);
        }
        ucs_rcache_region_put(md->rcache, &region->super);
        return UCS_OK;
    }
    if (flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE) {
        /* Before anything changes: out of memory leaves it registered. */
        inval = ucs_malloc(sizeof(*inval), "rc_vqp_inval");
        if (inval == NULL) {
            ucs_error("rc_vqp: out of memory invalidating %p+%zu",
                      (void *)memh->address, memh->length);
            return UCS_ERR_NO_MEMORY;
        }
        inval->comp = comp;
    }
    ucs_spin_lock(&md->lock);
    uct_rc_vqp_md_unlink(md, memh, &done);
    if (flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE) {
        uct_rc_vqp_md_invalidate(md, memh, inval, &done);
    }
    uct_rc_vqp_md_range_put(md, memh->range);
    ucs_spin_unlock(&md->lock);
    /* Completions after the device dereg, which returns once no access
     * through the key is in progress. */
    status = vqp_dev_mr_dereg(memh->mr);
    ucs_free(memh);
    uct_rc_vqp_md_complete(&done);
    return status;
}

/* The cache registers the region around what was asked, aligned to
 * RCACHE_ADDR_ALIGN, or a merge of it with overlapping cached regions. */
static ucs_status_t uct_rc_vqp_rcache_mem_reg_cb(void *context,
                                                 ucs_rcache_t *rcache,
                                                 void *arg,
                                                 ucs_rcache_region_t *rregion,
                                                 uint16_t rcache_flags)
{
    uct_rc_vqp_rcache_region_t *region =
        ucs_derived_of(rregion, uct_rc_vqp_rcache_region_t);

    /* @a arg: the uct_md_mem_reg flags given to ucs_rcache_get. */
    int hide_errors = (rcache_flags & UCS_RCACHE_MEM_REG_HIDE_ERRORS) ||
                      (*(const unsigned *)arg & UCT_MD_MEM_FLAG_HIDE_ERRORS);

    return uct_rc_vqp_memh_reg(context, (void *)rregion->super.start,
                               rregion->super.end - rregion->super.start,
                               hide_errors, &region->memh);
}

static void uct_rc_vqp_rcache_mem_dereg_cb(void *context, ucs_rcache_t *rcache,
                                           ucs_rcache_region_t *rregion)
{
    uct_rc_vqp_rcache_region_t *region =
        ucs_derived_of(rregion, uct_rc_vqp_rcache_region_t);

    /* The device logs its own failure; the region is gone for the cache
     * either way. */
    (void)vqp_dev_mr_dereg(region->memh.mr);
}

static void uct_rc_vqp_rcache_dump_region_cb(void *context,
                                             ucs_rcache_t *rcache,
                                             ucs_rcache_region_t *rregion,
                                             char *buf, size_t max)
{
    uct_rc_vqp_rcache_region_t *region =
        ucs_derived_of(rregion, uct_rc_vqp_rcache_region_t);

    snprintf(buf, max, "lkey 0x%x rkey 0x%x", region->memh.lkey,
             region->memh.rkey);
}

static ucs_rcache_ops_t uct_rc_vqp_rcache_ops = {
    .mem_reg     = uct_rc_vqp_rcache_mem_reg_cb,
    .mem_dereg   = uct_rc_vqp_rcache_mem_dereg_cb,
    .dump_region = uct_rc_vqp_rcache_dump_region_cb,
};

/* With RCACHE=try (or auto on an HCA), a cache that cannot be created
 * (UCM's memory events disabled or unavailable) leaves registration
 * uncached. */
static ucs_status_t uct_rc_vqp_md_rcache_init(uct_rc_vqp_md_t *md,
                                              const uct_rc_vqp_md_config_t *cfg)
{
    ucs_rcache_params_t params;
    vqp_dev_attr_t attr;
    ucs_status_t status;

    vqp_dev_query(md->dev, &attr);
    if (attr.link == VQP_DEV_LINK_SW) {
        /* The software device only records a region. */
        md->reg_cost = ucs_linear_func_make(1e-6, 0);
    } else {
        /* ibv_reg_mr pins and maps the pages. */
        md->reg_cost = ucs_linear_func_make(16e-6, 0.06e-9);
    }
    /* auto: off on the software device. A registration there costs about
     * 80 ns; and with the cache on, 2 of 22 sanitizer runs of the 32-rank
     * MPI test lost one-sided data, not understood yet (docs/ucp-mpi.md). */
    if ((cfg->rcache_mode == UCS_NO) ||
        ((cfg->rcache_mode == UCS_AUTO) && (attr.link == VQP_DEV_LINK_SW))) {
        return UCS_OK;
    }

    uct_md_set_rcache_params(&params, &cfg->rcache);
    params.region_struct_size = sizeof(uct_rc_vqp_rcache_region_t);
    params.max_alignment      = ucs_get_page_size();
    params.ucm_events         = UCM_EVENT_VM_UNMAPPED;
    params.context            = md;
    params.ops                = &uct_rc_vqp_rcache_ops;
    /* Unused cached regions must not take the device's last MR slots from
     * registrations in use: the cache evicts beyond half of them. */
    if (attr.max_mr != 0) {
        params.max_regions = ucs_min(params.max_regions, attr.max_mr / 2);
    }
    status = ucs_rcache_create(&params, attr.name, NULL, &md->rcache);
    if (status != UCS_OK) {
        md->rcache = NULL;
        if (cfg->rcache_mode == UCS_YES) {
            ucs_error("rc_vqp %s: cannot create the registration cache "
                      "(RCACHE=y): %s",
                      attr.name, ucs_status_string(status));
            return status;
        }
        ucs_debug("rc_vqp %s: no registration cache (%s): registering "
                  "every buffer",
                  attr.name, ucs_status_string(status));
        return UCS_OK;
    }
    md->reg_cost =
        ucs_linear_func_make(uct_md_rcache_overhead(&cfg->rcache), 0);
    return UCS_OK;
}

static ucs_status_t
uct_rc_vqp_mkey_pack(uct_md_h uct_md, uct_mem_h uct_memh,
                     const uct_md_mkey_pack_params_t *params, void *rkey_buffer)
{
    const uct_rc_vqp_memh_t *memh = uct_memh;
    uct_rc_vqp_rkey_buf_t buf     = {.rkey = memh->rkey};

    memcpy(rkey_buffer, &buf, sizeof(buf));
    return UCS_OK;
}

static ucs_status_t uct_rc_vqp_rkey_unpack(uct_component_t *component,
                                           const void *rkey_buffer,
                                           uct_rkey_t *rkey_p, void **handle_p)
{
    uct_rc_vqp_rkey_buf_t buf;

    memcpy(&buf, rkey_buffer, sizeof(buf));
    *rkey_p   = buf.rkey;
    *handle_p = NULL;
    return UCS_OK;
}

static uct_md_ops_t uct_rc_vqp_md_ops = {
    .close     = uct_rc_vqp_md_close,
    .query     = uct_rc_vqp_md_query,
    .mem_alloc = (uct_md_mem_alloc_func_t)ucs_empty_function_return_unsupported,
    .mem_free  = (uct_md_mem_free_func_t)ucs_empty_function_return_unsupported,
    .mem_advise =
        (uct_md_mem_advise_func_t)ucs_empty_function_return_unsupported,
    .mem_reg   = uct_rc_vqp_mem_reg,
    .mem_dereg = uct_rc_vqp_mem_dereg,
    .mem_query = (uct_md_mem_query_func_t)ucs_empty_function_return_unsupported,
    .mkey_pack = uct_rc_vqp_mkey_pack,
    .is_sockaddr_accessible = (uct_md_is_sockaddr_accessible_func_t)
        ucs_empty_function_return_zero_int,
    .detect_memory_type =
        (uct_md_detect_memory_type_func_t)ucs_empty_function_return_unsupported,
};

static ucs_status_t uct_rc_vqp_md_open(uct_component_t *component,
                                       const char *md_name,
                                       const uct_md_config_t *config,
                                       uct_md_h *md_p)
{
    uct_rc_vqp_md_t *md;
    ucs_status_t status;

    md = ucs_calloc(1, sizeof(*md), "rc_vqp_md");
    if (md == NULL) {
        ucs_error("rc_vqp: failed to allocate memory domain %s", md_name);
        return UCS_ERR_NO_MEMORY;
    }
    status = vqp_dev_open(md_name, NULL, &md->dev);
    if (status != UCS_OK) {
        ucs_free(md);
        return status;
    }
    kh_init_inplace(uct_rc_vqp_ranges, &md->ranges);
    status = ucs_spinlock_init(&md->lock, 0);
    if (status != UCS_OK) {
        vqp_dev_close(md->dev);
        ucs_free(md);
        return status;
    }
    status = uct_rc_vqp_md_rcache_init(
        md, ucs_derived_of(config, uct_rc_vqp_md_config_t));
    if (status != UCS_OK) {
        kh_destroy_inplace(uct_rc_vqp_ranges, &md->ranges);
        ucs_spinlock_destroy(&md->lock);
        vqp_dev_close(md->dev);
        ucs_free(md);
        return status;
    }
    md->super.ops       = &uct_rc_vqp_md_ops;
    md->super.component = component;
    *md_p               = &md->super;
    return UCS_OK;
}

uct_component_t uct_rc_vqp_component = {
    .query_md_resources = uct_rc_vqp_query_md_resources,
    .md_open            = uct_rc_vqp_md_open,
    .cm_open =
        (uct_component_cm_open_func_t)ucs_empty_function_return_unsupported,
    .rkey_unpack = uct_rc_vqp_rkey_unpack,
    .rkey_ptr =
        (uct_component_rkey_ptr_func_t)ucs_empty_function_return_unsupported,
    .rkey_release =
        (uct_component_rkey_release_func_t)ucs_empty_function_return_success,
    .name = UCT_RC_VQP_NAME,
    .md_config =
        {
            .name   = "rc_vqp memory domain",
            .prefix = "RC_VQP_",
            .table  = uct_rc_vqp_md_config_table,
            .size   = sizeof(uct_rc_vqp_md_config_t),
        },
    .cm_config   = UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY,
    .tl_list     = UCT_COMPONENT_TL_LIST_INITIALIZER(&uct_rc_vqp_component),
    .flags       = 0,
    .md_vfs_init = (uct_component_md_vfs_init_func_t)ucs_empty_function,
};

/* Set only when the constructor registered: unregistering what was never
 * registered corrupts UCX's lists. */
static int uct_rc_vqp_registered;

int uct_rc_vqp_is_registered(void)
{
    return uct_rc_vqp_registered;
}

UCS_F_CTOR void uct_rc_vqp_init(void)
{
    if (uct_rc_vqp_abi_verify() != UCS_OK) {
        return;
    }

    uct_component_register(&uct_rc_vqp_component);
    uct_tl_register(&uct_rc_vqp_component, &UCT_TL_NAME(rc_vqp));
    uct_rc_vqp_registered = 1;
}

UCS_F_DTOR void uct_rc_vqp_cleanup(void)
{
    if (!uct_rc_vqp_registered) {
        return;
    }

    uct_tl_unregister(&UCT_TL_NAME(rc_vqp));
    uct_component_unregister(&uct_rc_vqp_component);
    uct_rc_vqp_registered = 0;
}
