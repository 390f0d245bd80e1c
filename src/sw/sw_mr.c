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
#include <ucs/time/time.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define VQP_SW_ACCESS_ALL                               \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* Access that makes ibv_reg_mr pin the pages for writing (the kernel's
 * ib_access_writable): read-only memory cannot be registered with it. */
#define VQP_SW_ACCESS_WRITABLE                          \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
     IBV_ACCESS_REMOTE_ATOMIC)

/* The layout of the kernel's struct procmap_query (uapi linux/fs.h, Linux
 * 6.11; bookworm's headers predate it): one ioctl on /proc/self/maps
 * returns the mapping that covers an address, with its rights. */
typedef struct vqp_sw_procmap_query {
    uint64_t size; /* of this struct: the kernel's ABI version */
    uint64_t query_flags;
    uint64_t query_addr;
    uint64_t vma_start;
    uint64_t vma_end;
    uint64_t vma_flags;
    uint64_t vma_page_size;
    uint64_t vma_offset;
    uint64_t inode;
    uint32_t dev_major;
    uint32_t dev_minor;
    uint32_t vma_name_size;
    uint32_t build_id_size;
    uint64_t vma_name_addr;
    uint64_t build_id_addr;
} vqp_sw_procmap_query_t;

_Static_assert(sizeof(vqp_sw_procmap_query_t) == 104,
               "struct procmap_query of Linux 6.11");

#define VQP_SW_PROCMAP_QUERY    _IOWR('f', 17, vqp_sw_procmap_query_t)
#define VQP_SW_PROCMAP_READABLE 0x01ull
#define VQP_SW_PROCMAP_WRITABLE 0x02ull

/* ibv_reg_mr pins every page (get_user_pages) and fails with EFAULT where it
 * cannot: a page that is not mapped, not readable (PROT_NONE), or read-only
 * while the access asks for a write right. A region that passed here would
 * only fail on an HCA (a cache merging regions across freed memory, UCP
 * sending from read-only pages without taking its fallback). */
#define VQP_SW_MR_CHECK_PAGES 4096u

/* The mapping of @a addr: 0, or an errno (ENOENT: none covers it). */
static int vqp_sw_maps_query(int fd, uintptr_t addr, vqp_sw_procmap_query_t *q)
{
    memset(q, 0, sizeof(*q));
    q->size       = sizeof(*q);
    q->query_addr = addr;
    return (ioctl(fd, VQP_SW_PROCMAP_QUERY, q) == 0) ? 0 : errno;
}

/* /proc/self/maps where the kernel answers PROCMAP_QUERY, else -1: opened
 * once per device (its owner's; a forked child gets -1: the descriptor
 * would show its parent's mappings). */
static int vqp_sw_maps_fd(vqp_sw_dev_t *dev)
{
    int fd       = __atomic_load_n(&dev->maps_fd, __ATOMIC_ACQUIRE);
    int expected = VQP_SW_MAPS_UNKNOWN;
    vqp_sw_procmap_query_t q;
    int err;

    if (dev->pid != vqp_sw_pid()) {
        return -1;
    }
    if (fd != VQP_SW_MAPS_UNKNOWN) {
        return fd;
    }
    fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ucs_debug("vqp_sw %s: cannot open /proc/self/maps (%m): memory "
                  "rights are not checked at registration",
                  dev->name);
    } else if ((err = vqp_sw_maps_query(fd, (uintptr_t)dev, &q)) != 0) {
        ucs_debug("vqp_sw %s: PROCMAP_QUERY failed (%s; Linux before 6.11?): "
                  "memory rights are not checked at registration",
                  dev->name, strerror(err));
        close(fd);
        fd = -1;
    }
    if (!__atomic_compare_exchange_n(&dev->maps_fd, &expected, fd, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        if (fd >= 0) {
            close(fd); /* another thread was first */
        }
        fd = expected;
    }
    return fd;
}

/* Without PROCMAP_QUERY: mincore reports ENOMEM for an unmapped page,
 * resident or not, one syscall per VQP_SW_MR_CHECK_PAGES; rights unknown. */
static ucs_status_t vqp_sw_mr_check_mincore(vqp_sw_dev_t *dev, void *addr,
                                            size_t length, uintptr_t start,
                                            uintptr_t end,
                                            ucs_log_level_t level)
{
    unsigned char vec[VQP_SW_MR_CHECK_PAGES];
    size_t page = ucs_get_page_size();
    uintptr_t chunk;

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

static ucs_status_t vqp_sw_mr_check_pages(vqp_sw_dev_t *dev, void *addr,
                                          size_t length, unsigned access,
                                          ucs_log_level_t level)
{
    size_t page = ucs_get_page_size();
    uintptr_t start, end;
    vqp_sw_procmap_query_t q;
    const char *what;
    int fd, err;

    start = ucs_align_down((uintptr_t)addr, page);
    end   = ucs_align_up((uintptr_t)addr + length, page);
    fd    = vqp_sw_maps_fd(dev);
    if (fd < 0) {
        return vqp_sw_mr_check_mincore(dev, addr, length, start, end, level);
    }
    /* One query per mapping the range crosses. */
    for (; start < end; start = q.vma_end) {
        err = vqp_sw_maps_query(fd, start, &q);
        if (err == ENOENT) {
            ucs_log(level,
                    "vqp_sw %s: cannot register %p+%zu: memory at 0x%lx is "
                    "not mapped",
                    dev->name, addr, length, (unsigned long)start);
            return UCS_ERR_INVALID_ADDR;
        } else if (err != 0) {
            ucs_error("vqp_sw %s: PROCMAP_QUERY(0x%lx) failed: %s", dev->name,
                      (unsigned long)start, strerror(err));
            return UCS_ERR_IO_ERROR;
        }
        if (!(q.vma_flags & VQP_SW_PROCMAP_READABLE)) {
            what = "not readable";
        } else if ((access & VQP_SW_ACCESS_WRITABLE) &&
                   !(q.vma_flags & VQP_SW_PROCMAP_WRITABLE)) {
            what = "read-only, and the access asks for writing";
        } else {
            continue;
        }
        ucs_log(level,
                "vqp_sw %s: cannot register %p+%zu with access 0x%x: memory "
                "at 0x%lx..0x%lx is %s (an HCA cannot pin it)",
                dev->name, addr, length, access,
                (unsigned long)ucs_max(start, (uintptr_t)q.vma_start),
                (unsigned long)q.vma_end, what);
        return UCS_ERR_INVALID_ADDR;
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
    /* The lowest free slot, from below which none is: a registration
     * costs no walk over the regions in use. */
    for (i = dev->mr_free; i < VQP_SW_MAX_MR; ++i) {
        if (dev->mrs[i] == NULL) {
            break;
        }
    }
    dev->mr_free = i;
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
    mr->dev      = dev;
    mr->index    = i;
    dev->mrs[i]  = mr;
    dev->mr_free = i + 1;
    *mr_p        = mr;
    *lkey_p      = key;
    *rkey_p      = key;
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
        status = vqp_sw_mr_check_pages(dev, addr, length, access, level);
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

/* Dereg in three steps: the key goes (no new access passes the check),
 * the accesses already past it end, then the slot is free for another
 * registration (not before: the wait counts accesses per slot). */
static ucs_status_t vqp_sw_mr_revoke_locked(vqp_sw_mr_t *mr)
{
    if (mr == NULL) {
        ucs_error("vqp_sw: mr_dereg(NULL)");
        return UCS_ERR_INVALID_PARAM;
    }
    /* Key first: a reader that saw the old key re-checks it afterwards;
     * sequentially consistent against vqp_sw_mr_access_begin's count. */
    __atomic_store_n(&mr->dev->shm->mr[mr->index].key, 0, __ATOMIC_SEQ_CST);
    return UCS_OK;
}

static ucs_status_t vqp_sw_mr_release_locked(vqp_sw_mr_t *mr)
{
    mr->dev->mrs[mr->index] = NULL;
    mr->dev->mr_free        = ucs_min(mr->dev->mr_free, mr->index);
    return UCS_OK;
}

/* How long a dereg waits for a peer's access to its region to end before
 * it takes the peer for dead in the middle of it. */
#define VQP_SW_MR_DRAIN_TIMEOUT_SEC 1.0

/* Waits until no peer moves data under the slot's key any more. A transfer
 * is one syscall; an access still counted after the timeout was left by a
 * process that died in it (its count is dropped, with a warning). */
static void vqp_sw_mr_drain(vqp_sw_dev_t *dev, uint32_t index)
{
    vqp_sw_shm_mr_t *ent = &dev->shm->mr[index];
    ucs_time_t deadline  = 0;
    int32_t users;

    while ((users = __atomic_load_n(&ent->users, __ATOMIC_SEQ_CST)) > 0) {
        if (deadline == 0) {
            deadline =
                ucs_get_time() + ucs_time_from_sec(VQP_SW_MR_DRAIN_TIMEOUT_SEC);
        } else if (ucs_get_time() > deadline) {
            ucs_warn("vqp_sw %s: memory region slot %u: %d peer access(es) "
                     "still counted after %.0f s (a peer that died during a "
                     "transfer?); deregistered without them",
                     dev->name, index, users, VQP_SW_MR_DRAIN_TIMEOUT_SEC);
            __atomic_sub_fetch(&ent->users, users, __ATOMIC_SEQ_CST);
            return;
        }
        sched_yield();
    }
}

ucs_status_t vqp_sw_mr_dereg(vqp_sw_mr_t *mr)
{
    ucs_status_t status;

    status = VQP_SW_LOCKED(vqp_sw_mr_revoke_locked(mr));
    if (status != UCS_OK) {
        return status;
    }
    /* Outside the device lock: a peer's access takes no lock of ours, and
     * our own engine may need the lock to finish one. */
    vqp_sw_mr_drain(mr->dev, mr->index);
    /* A peer places a SEND into a receive buffer with the lkey checked and
     * the data moved in one hold of our segment's lock: taking the lock
     * once now waits for a placement that saw the old key. */
    vqp_sw_lock(mr->dev->shm);
    vqp_sw_unlock(mr->dev->shm);
    (void)VQP_SW_LOCKED(vqp_sw_mr_release_locked(mr));
    free(mr);
    return UCS_OK;
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
