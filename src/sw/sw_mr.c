/*
 * Software mlx5 device: memory regions. Keys are slot index plus a
 * generation so a stale key never matches a reused slot; the table lives in
 * the shared segment so a peer validates our rkeys without asking us.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>
#include <ucs/sys/math.h>
#include <ucs/sys/sys.h>

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#define VQP_SW_ACCESS_ALL                               \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* ibv_reg_mr pins every page and fails with EFAULT where one is not mapped;
 * a region that passed here over a hole would only fail on an HCA (a cache
 * merging regions across freed memory, say). mincore reports ENOMEM for an
 * unmapped page, resident or not, one syscall per VQP_SW_MR_CHECK_PAGES. */
#define VQP_SW_MR_CHECK_PAGES 4096u

static ucs_status_t vqp_sw_mr_check_mapped(vqp_sw_dev_t *dev, void *addr,
                                           size_t length, ucs_log_level_t level)
{
    unsigned char vec[VQP_SW_MR_CHECK_PAGES];
    size_t page = ucs_get_page_size();
    uintptr_t start, end, chunk;

    start = ucs_align_down((uintptr_t)addr, page);
    end   = ucs_align_up((uintptr_t)addr + length, page);
    for (; start < end; start += chunk) {
        chunk = ucs_min(end - start, (uintptr_t)VQP_SW_MR_CHECK_PAGES * page);
        if (mincore((void *)start, chunk, vec) == 0) {
            continue;
        }
        if (errno == ENOMEM) {
            ucs_log(level,
                    "vqp_sw %s: cannot register %p+%zu: memory at 0x%lx..0x%lx "
                    "is not mapped",
                    dev->name, addr, length, (unsigned long)start,
                    (unsigned long)(start + chunk));
            return UCS_ERR_INVALID_ADDR;
        }
        ucs_error("vqp_sw %s: mincore(0x%lx, %lu) failed: %m", dev->name,
                  (unsigned long)start, (unsigned long)chunk);
        return UCS_ERR_IO_ERROR;
    }
    return UCS_OK;
}

static ucs_status_t vqp_sw_mr_reg_locked(vqp_sw_dev_t *dev, void *addr,
                                         size_t length, unsigned access,
                                         ucs_log_level_t level,
                                         vqp_sw_mr_t **mr_p, uint32_t *lkey_p,
                                         uint32_t *rkey_p)
{
    vqp_sw_shm_mr_t *ent;
    vqp_sw_mr_t *mr;
    uint32_t i, gen, key;

    if (access & ~VQP_SW_ACCESS_ALL) {
        ucs_error("vqp_sw %s: mr_reg access 0x%x has unsupported flags 0x%x",
                  dev->name, access, access & ~VQP_SW_ACCESS_ALL);
        return UCS_ERR_INVALID_PARAM;
    }
    /* As ibv_reg_mr: remote write/atomic need local write. */
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE)) {
        ucs_error("vqp_sw %s: mr_reg: REMOTE_WRITE/REMOTE_ATOMIC require "
                  "LOCAL_WRITE (access 0x%x)",
                  dev->name, access);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((addr == NULL) && (length > 0)) {
        ucs_error("vqp_sw %s: mr_reg of NULL address", dev->name);
        return UCS_ERR_INVALID_PARAM;
    }
    if ((uintptr_t)addr + length < (uintptr_t)addr) {
        ucs_error("vqp_sw %s: mr_reg range %p+%zu wraps", dev->name, addr,
                  length);
        return UCS_ERR_INVALID_PARAM;
    }
    for (i = 0; i < VQP_SW_MAX_MR; ++i) {
        if (dev->mrs[i] == NULL) {
            break;
        }
    }
    if (i == VQP_SW_MAX_MR) {
        ucs_log(level, "vqp_sw %s: too many memory regions (max %u)", dev->name,
                VQP_SW_MAX_MR);
        return UCS_ERR_EXCEEDS_LIMIT;
    }
    mr = calloc(1, sizeof(*mr));
    if (mr == NULL) {
        ucs_error("vqp_sw %s: cannot allocate MR", dev->name);
        return UCS_ERR_NO_MEMORY;
    }
    /* Generation starts at 1: no key is 0 or MLX5_INVALID_LKEY (0x100). */
    gen = (dev->mr_gen[i] + 1) & ((1u << (32 - VQP_SW_MR_BITS)) - 1);
    if (gen == 0) {
        gen = 1;
    }
    dev->mr_gen[i] = gen;
    key            = (gen << VQP_SW_MR_BITS) | i;
    ent            = &dev->shm->mr[i];
    ent->access    = access;
    ent->addr      = (uintptr_t)addr;
    ent->length    = length;
    __atomic_store_n(&ent->key, key, __ATOMIC_RELEASE);
    mr->dev     = dev;
    mr->index   = i;
    dev->mrs[i] = mr;
    *mr_p       = mr;
    *lkey_p     = key;
    *rkey_p     = key;
    return UCS_OK;
}

ucs_status_t vqp_sw_mr_reg_log(vqp_sw_dev_t *dev, void *addr, size_t length,
                               unsigned access, ucs_log_level_t level,
                               vqp_sw_mr_t **mr_p, uint32_t *lkey_p,
                               uint32_t *rkey_p)
{
    ucs_status_t status;

    /* Outside the device lock: the page tables are the kernel's. */
    if ((addr != NULL) && (length > 0) &&
        ((uintptr_t)addr + length > (uintptr_t)addr)) {
        status = vqp_sw_mr_check_mapped(dev, addr, length, level);
        if (status != UCS_OK) {
            return status;
        }
    }
    return VQP_SW_LOCKED(vqp_sw_mr_reg_locked(dev, addr, length, access, level,
                                              mr_p, lkey_p, rkey_p));
}

ucs_status_t vqp_sw_mr_reg(vqp_sw_dev_t *dev, void *addr, size_t length,
                           unsigned access, vqp_sw_mr_t **mr_p,
                           uint32_t *lkey_p, uint32_t *rkey_p)
{
    return vqp_sw_mr_reg_log(dev, addr, length, access, UCS_LOG_LEVEL_ERROR,
                             mr_p, lkey_p, rkey_p);
}

static ucs_status_t vqp_sw_mr_dereg_locked(vqp_sw_mr_t *mr)
{
    if (mr == NULL) {
        ucs_error("vqp_sw: mr_dereg(NULL)");
        return UCS_ERR_INVALID_PARAM;
    }
    /* Key first: a reader that saw the old key re-checks it afterwards. */
    __atomic_store_n(&mr->dev->shm->mr[mr->index].key, 0, __ATOMIC_RELEASE);
    mr->dev->mrs[mr->index] = NULL;
    free(mr);
    return UCS_OK;
}

ucs_status_t vqp_sw_mr_dereg(vqp_sw_mr_t *mr)
{
    return VQP_SW_LOCKED(vqp_sw_mr_dereg_locked(mr));
}

const char *vqp_sw_mr_check(const vqp_sw_shm_t *shm, uint32_t key,
                            uint64_t addr, uint64_t len, unsigned access)
{
    const vqp_sw_shm_mr_t *ent = &shm->mr[key & (VQP_SW_MAX_MR - 1)];
    uint64_t base, length;
    unsigned rights;

    if (__atomic_load_n(&ent->key, __ATOMIC_ACQUIRE) != key) {
        return "key not registered";
    }
    base   = ent->addr;
    length = ent->length;
    rights = ent->access;
    if (__atomic_load_n(&ent->key, __ATOMIC_ACQUIRE) != key) {
        return "key deregistered concurrently";
    }
    if ((addr < base) || (addr + len < addr) || (addr + len > base + length)) {
        return "range outside the region";
    }
    if ((rights & access) != access) {
        return "region lacks the access right";
    }
    return NULL;
}
