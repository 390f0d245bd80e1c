/*
 * Software mlx5 device: device instances, their shared-memory segments
 * (naming, creation, stale cleanup), per-process instance numbers,
 * the segment lock, the queue-memory arena, and the engine's entry points
 * (progress, the SQ doorbell) with their re-entrancy guard.
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Instance numbers are unique per process (never reused: a peer caching
 * (pid, instance) never meets a different device under the same name). */
static pthread_mutex_t vqp_sw_instance_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t vqp_sw_next_instance;

/* "vqp_sw-<uid>-", or "vqp_sw.<ns>-<uid>-" with VQP_SW_NAMESPACE=<ns>:
 * separate namespaces never see (or clean) each other's segments, e.g.
 * concurrent test runs. */
void vqp_sw_shm_prefix(char *buf, size_t len, uint32_t uid)
{
    const char *ns = getenv("VQP_SW_NAMESPACE");
    size_t i;

    if ((ns != NULL) && (*ns != '\0')) {
        for (i = 0; ns[i] != '\0'; ++i) {
            if (!isalnum((unsigned char)ns[i]) || (i >= 32)) {
                ucs_warn("vqp_sw: ignoring VQP_SW_NAMESPACE '%s' (use up to "
                         "32 letters and digits)",
                         ns);
                ns = NULL;
                break;
            }
        }
    }
    if ((ns != NULL) && (*ns != '\0')) {
        snprintf(buf, len, "vqp_sw.%s-%u-", ns, uid);
    } else {
        snprintf(buf, len, "vqp_sw-%u-", uid);
    }
}

void vqp_sw_shm_name(char *buf, size_t len, uint32_t uid, uint32_t pid,
                     uint32_t instance)
{
    char prefix[64];

    vqp_sw_shm_prefix(prefix, sizeof(prefix), uid);
    snprintf(buf, len, "/%s%u-%u", prefix, pid, instance);
}

/* True when @a ret (of a lock or trylock) means the caller holds it. A peer
 * that died holding the lock leaves it inconsistent, not held: every
 * critical section leaves shared state valid at each store. */
static bool vqp_sw_lock_taken(vqp_sw_shm_t *shm, int ret)
{
    if (ret == EOWNERDEAD) {
        ucs_debug("vqp_sw: lock of pid %u recovered from a dead holder",
                  shm->pid);
        pthread_mutex_consistent(&shm->lock);
        return true;
    }
    return ret == 0;
}

void vqp_sw_lock(vqp_sw_shm_t *shm)
{
    vqp_sw_lock_taken(shm, pthread_mutex_lock(&shm->lock));
}

bool vqp_sw_trylock(vqp_sw_shm_t *shm)
{
    return vqp_sw_lock_taken(shm, pthread_mutex_trylock(&shm->lock));
}

void vqp_sw_unlock(vqp_sw_shm_t *shm)
{
    pthread_mutex_unlock(&shm->lock);
}

void *vqp_sw_arena_alloc(vqp_sw_dev_t *dev, size_t size, size_t *pages_p,
                         uint64_t *off_p)
{
    size_t pages = (size + VQP_SW_PAGE - 1) / VQP_SW_PAGE;
    size_t i, run = 0;
    void *ptr;

    /* First fit, from the lowest page that may be free: tens of thousands
     * of QPs would otherwise walk every used page on each create. */
    for (i = dev->arena_low; i < dev->arena_pages; ++i) {
        run = dev->arena_used[i] ? 0 : run + 1;
        if (run == pages) {
            i = i + 1 - pages;
            memset(dev->arena_used + i, 1, pages);
            if (i == dev->arena_low) {
                dev->arena_low = i + pages;
            }
            *off_p   = dev->shm->arena_off + i * VQP_SW_PAGE;
            *pages_p = pages;
            ptr      = (uint8_t *)dev->shm + *off_p;
            memset(ptr, 0, pages * VQP_SW_PAGE);
            return ptr;
        }
    }
    ucs_error("vqp_sw %s: queue memory exhausted (%zu bytes requested, arena "
              "%lu bytes)",
              dev->name, size, VQP_SW_ARENA_SIZE);
    return NULL;
}

void vqp_sw_arena_free(vqp_sw_dev_t *dev, uint64_t off, size_t pages)
{
    size_t first = (off - dev->shm->arena_off) / VQP_SW_PAGE;

    memset(dev->arena_used + first, 0, pages);
    if (first < dev->arena_low) {
        dev->arena_low = first;
    }
    /* Give the pages back to tmpfs. */
    madvise((uint8_t *)dev->shm + off, pages * VQP_SW_PAGE, MADV_REMOVE);
}

static bool vqp_sw_pread_field(int fd, void *dst, size_t size, size_t offset)
{
    return pread(fd, dst, size, (off_t)offset) == (ssize_t)size;
}

/* Unlink segments whose owner is gone: the pid in the name no longer
 * exists, or it was reused (the header's start time differs; this covers a
 * leftover carrying our own pid, which would block our O_EXCL create). A
 * segment without a valid magic whose pid lives is being created: leave
 * it. */
static void vqp_sw_clean_stale(uint32_t uid)
{
    char prefix[64], path[300];
    struct dirent *de;
    unsigned pid, inst;
    uint64_t magic, start_time;
    uint32_t hdr_pid;
    bool stale;
    DIR *dir;
    int fd;

    vqp_sw_shm_prefix(prefix, sizeof(prefix), uid);
    dir = opendir("/dev/shm");
    if (dir == NULL) {
        return;
    }
    while ((de = readdir(dir)) != NULL) {
        if ((strncmp(de->d_name, prefix, strlen(prefix)) != 0) ||
            (sscanf(de->d_name + strlen(prefix), "%u-%u", &pid, &inst) != 2)) {
            continue;
        }
        if ((kill((pid_t)pid, 0) != 0) && (errno == ESRCH)) {
            stale = true;
        } else {
            snprintf(path, sizeof(path), "/%s", de->d_name);
            fd = shm_open(path, O_RDONLY, 0);
            if (fd < 0) {
                continue;
            }
            /* Only the fields we need: the header type holds every QP's
             * state (megabytes), no place for a stack copy. */
            stale = vqp_sw_pread_field(fd, &magic, sizeof(magic),
                                       offsetof(vqp_sw_shm_t, magic)) &&
                    (magic == VQP_SW_MAGIC) &&
                    vqp_sw_pread_field(fd, &hdr_pid, sizeof(hdr_pid),
                                       offsetof(vqp_sw_shm_t, pid)) &&
                    vqp_sw_pread_field(fd, &start_time, sizeof(start_time),
                                       offsetof(vqp_sw_shm_t, start_time)) &&
                    (hdr_pid == pid) && !vqp_sw_pid_alive(hdr_pid, start_time);
            close(fd);
        }
        if (stale) {
            snprintf(path, sizeof(path), "/%s", de->d_name);
            ucs_debug("vqp_sw: removing stale segment %s", path);
            shm_unlink(path);
        }
    }
    closedir(dir);
}

/* The device lock (see sw_int.h): a futex word, 0 free, 1 held, 2 held
 * with a thread asleep on it; and how deep this thread holds it. Every
 * progress call takes it: a compare-and-swap and an exchange, where a
 * pthread mutex cost an idle call 57 instructions. Waiters sleep (a thread
 * sharing the device, a control call, fork) instead of spinning on a holder
 * the scheduler may have taken off the CPU. */
static uint32_t vqp_sw_dev_word;
static __thread unsigned vqp_sw_dev_lock_depth
    __attribute__((tls_model("initial-exec")));

static void vqp_sw_dev_word_lock(void)
{
    uint32_t c = 0;

    if (__atomic_compare_exchange_n(&vqp_sw_dev_word, &c, 1, false,
                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        return;
    }
    /* Held: say a thread sleeps (2), and sleep while it stays held. */
    if (c != 2) {
        c = __atomic_exchange_n(&vqp_sw_dev_word, 2, __ATOMIC_ACQUIRE);
    }
    while (c != 0) {
        syscall(SYS_futex, &vqp_sw_dev_word, FUTEX_WAIT_PRIVATE, 2, NULL, NULL,
                0);
        c = __atomic_exchange_n(&vqp_sw_dev_word, 2, __ATOMIC_ACQUIRE);
    }
}

static void vqp_sw_dev_word_unlock(void)
{
    if (__atomic_exchange_n(&vqp_sw_dev_word, 0, __ATOMIC_RELEASE) == 2) {
        syscall(SYS_futex, &vqp_sw_dev_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL,
                0);
    }
}

void vqp_sw_dev_lock(void)
{
    if (vqp_sw_dev_lock_depth++ == 0) {
        vqp_sw_dev_word_lock();
    }
}

void vqp_sw_dev_unlock(void)
{
    if (--vqp_sw_dev_lock_depth == 0) {
        vqp_sw_dev_word_unlock();
    }
}

bool vqp_sw_dev_trylock(void)
{
    uint32_t c = 0;

    if (vqp_sw_dev_lock_depth > 0) {
        ++vqp_sw_dev_lock_depth;
        return true;
    }
    if (!__atomic_compare_exchange_n(&vqp_sw_dev_word, &c, 1, false,
                                     __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        return false;
    }
    vqp_sw_dev_lock_depth = 1;
    return true;
}

/* fork() while another thread (the idle executor, say) holds the lock
 * would leave the child a lock nobody releases: fork waits for it. */
static void vqp_sw_fork_prepare(void)
{
    vqp_sw_dev_lock();
}

static void vqp_sw_fork_parent(void)
{
    vqp_sw_dev_unlock();
}

static void vqp_sw_fork_child(void)
{
    vqp_sw_idle_forked();
    vqp_sw_dev_unlock();
}

static void vqp_sw_fork_register(void)
{
    pthread_atfork(vqp_sw_fork_prepare, vqp_sw_fork_parent, vqp_sw_fork_child);
}

static pthread_once_t vqp_sw_fork_once = PTHREAD_ONCE_INIT;

ucs_status_t vqp_sw_dev_open(const char *name, vqp_sw_dev_t **dev_p)
{
    pthread_mutexattr_t mattr;
    vqp_sw_dev_t *dev;
    const char *env;
    ucs_status_t status;
    int fd;

    if ((name == NULL) || (strncmp(name, "vqp_sw", 6) != 0)) {
        ucs_error("vqp_sw: unknown device name '%s' (expected vqp_sw<N>)",
                  name ? name : "(null)");
        return UCS_ERR_NO_DEVICE;
    }
    dev = calloc(1, sizeof(*dev));
    if (dev == NULL) {
        ucs_error("vqp_sw: cannot allocate device object");
        return UCS_ERR_NO_MEMORY;
    }
    env = getenv("VQP_SW_ATOMIC_REPLY");
    if ((env != NULL) && (*env != '\0') && strcmp(env, "be") &&
        strcmp(env, "host")) {
        ucs_error("vqp_sw: invalid VQP_SW_ATOMIC_REPLY '%s' (be or host)", env);
        free(dev);
        return UCS_ERR_INVALID_PARAM;
    }
    dev->atomic8_host = (env != NULL) && !strcmp(env, "host");
    env               = getenv("VQP_SW_EXEC");
    if ((env != NULL) && (*env != '\0') && strcmp(env, "doorbell") &&
        strcmp(env, "progress") && strcmp(env, "auto")) {
        ucs_error("vqp_sw: invalid VQP_SW_EXEC '%s' (auto, progress or "
                  "doorbell)",
                  env);
        free(dev);
        return UCS_ERR_INVALID_PARAM;
    }
    /* Not at the doorbell by default: that costs the merged WRITE runs of
     * the poll (one process_vm_writev per small WRITE; 8-byte puts at 1.0x
     * cma instead of 3.2x, docs/swdev.md). auto (the default) adds the idle
     * executor to progress: work a process left unprogressed still runs. */
    dev->exec_doorbell = (env != NULL) && !strcmp(env, "doorbell");
    dev->exec_idle = (env == NULL) || (*env == '\0') || !strcmp(env, "auto");
    env            = getenv("VQP_SW_FAULTS");
    if ((env != NULL) && (*env != '\0')) {
        status = vqp_sw_fault_parse(env, &dev->fault);
        if (status != UCS_OK) {
            ucs_error("vqp_sw: invalid VQP_SW_FAULTS '%s'", env);
            free(dev);
            return status;
        }
    }
    /* Peers of the same user read our memory with process_vm_*; Yama's
     * ptrace_scope=1 would otherwise refuse unrelated processes. */
#ifdef PR_SET_PTRACER
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
    vqp_sw_clean_stale((uint32_t)getuid());

    pthread_mutex_lock(&vqp_sw_instance_lock);
    dev->instance = vqp_sw_next_instance++;
    pthread_mutex_unlock(&vqp_sw_instance_lock);
    dev->pid      = (uint32_t)getpid();
    dev->next_gen = 1;
    dev->event_fd = -1;
    dev->wake_fd  = -1;
    dev->maps_fd  = VQP_SW_MAPS_UNKNOWN;
    vqp_sw_shm_name(dev->name, sizeof(dev->name), (uint32_t)getuid(), dev->pid,
                    dev->instance);
    dev->seg_size =
        ((sizeof(vqp_sw_shm_t) + VQP_SW_PAGE - 1) & ~(VQP_SW_PAGE - 1)) +
        VQP_SW_ARENA_SIZE;
    fd = shm_open(dev->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        ucs_error("vqp_sw: shm_open(%s) failed: %m", dev->name);
        free(dev);
        return UCS_ERR_IO_ERROR;
    }
    status = UCS_ERR_IO_ERROR; /* for the failures below, until the thread */
    if (ftruncate(fd, (off_t)dev->seg_size) != 0) {
        ucs_error("vqp_sw: ftruncate(%s, %zu) failed: %m", dev->name,
                  dev->seg_size);
        goto err_unlink;
    }
    dev->shm =
        mmap(NULL, dev->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (dev->shm == MAP_FAILED) {
        ucs_error("vqp_sw: mmap(%s) failed: %m", dev->name);
        goto err_unlink;
    }
    close(fd);
    fd               = -1;
    dev->arena_pages = VQP_SW_ARENA_SIZE / VQP_SW_PAGE;
    dev->arena_used  = calloc(dev->arena_pages, 1);
    if (dev->arena_used == NULL) {
        ucs_error("vqp_sw: cannot allocate arena map");
        goto err_unmap;
    }

    pthread_mutexattr_init(&mattr);
    pthread_mutexattr_setpshared(&mattr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&mattr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&dev->shm->lock, &mattr);
    pthread_mutex_init(&dev->shm->life, &mattr);
    pthread_mutexattr_destroy(&mattr);
    /* Held until close; the kernel marks it owner-died if we die first. */
    dev->life_tid = (pthread_mutex_lock(&dev->shm->life) == 0) ? gettid() : 0;
    dev->shm->version    = VQP_SW_VERSION;
    dev->shm->hdr_size   = sizeof(vqp_sw_shm_t);
    dev->shm->pid        = dev->pid;
    dev->shm->uid        = (uint32_t)getuid();
    dev->shm->start_time = vqp_sw_proc_start_time(dev->pid);
    dev->shm->instance   = dev->instance;
    dev->shm->seg_size   = dev->seg_size;
    dev->shm->arena_off  = dev->seg_size - VQP_SW_ARENA_SIZE;
    dev->shm->alive      = 1;
    /* Peers validate the magic last: publish it after everything else. */
    __atomic_store_n(&dev->shm->magic, VQP_SW_MAGIC, __ATOMIC_RELEASE);

    dev->attr.max_qp      = VQP_SW_MAX_QP;
    dev->attr.max_cq      = VQP_SW_MAX_CQ;
    dev->attr.max_srq     = VQP_SW_MAX_SRQ;
    dev->attr.max_mr      = VQP_SW_MAX_MR;
    dev->attr.max_qp_wr   = VQP_SW_MAX_QP_WR;
    dev->attr.max_cqe     = VQP_SW_MAX_CQE;
    dev->attr.max_srq_wr  = VQP_SW_MAX_QP_WR;
    dev->attr.max_sge     = VQP_SW_MAX_SGE;
    dev->attr.max_inline  = VQP_SW_MAX_INLINE;
    dev->attr.max_msg_sz  = VQP_SW_MAX_MSG;
    dev->attr.max_rd_atom = 16;
    dev->attr.atomic_be_sizes =
        sizeof(uint32_t) | (dev->atomic8_host ? 0 : sizeof(uint64_t));
    dev->attr.exec_doorbell = dev->exec_doorbell;

    dev->attr.exec_idle = dev->exec_idle;

    pthread_once(&vqp_sw_fork_once, vqp_sw_fork_register);

    if (dev->exec_idle) {
        /* Listed first: a close elsewhere stops the thread only when no
         * device is listed. */
        vqp_sw_dev_lock();
        vqp_sw_idle_add(dev);
        vqp_sw_dev_unlock();
        status = vqp_sw_idle_start();
        if (status != UCS_OK) {
            vqp_sw_dev_lock();
            vqp_sw_idle_remove(dev);
            vqp_sw_dev_unlock();
            goto err_life;
        }
    }
    ucs_debug("vqp_sw: opened %s as %s", name, dev->name);
    *dev_p = dev;
    return UCS_OK;

err_life:
    free(dev->arena_used);
    if (dev->life_tid != 0) {
        pthread_mutex_unlock(&dev->shm->life);
    }
err_unmap:
    munmap(dev->shm, dev->seg_size);
err_unlink:
    if (fd >= 0) {
        close(fd);
    }
    shm_unlink(dev->name);
    free(dev);
    return status;
}

/* This thread is inside the engine (of any device), and the devices that
 * got doorbells meanwhile. Initial-exec: one load, no call, on every poll;
 * a few bytes of the static TLS surplus where the library is dlopen'ed. */
static __thread bool vqp_sw_in_engine
    __attribute__((tls_model("initial-exec")));
static __thread vqp_sw_dev_t *vqp_sw_defer_devs
    __attribute__((tls_model("initial-exec")));

bool vqp_sw_engine_enter(void)
{
    if (vqp_sw_in_engine) {
        return false;
    }
    vqp_sw_dev_lock();
    vqp_sw_in_engine = true;
    return true;
}

/* A doorbell rung inside the engine: its QP runs when the engine call ends
 * (the outer call may be halfway through a CQE or hold a segment lock). */
static void vqp_sw_defer(vqp_sw_qp_t *qp)
{
    vqp_sw_dev_t *dev = qp->dev;
    unsigned i;

    for (i = 0; i < dev->n_deferred; ++i) {
        if (dev->deferred[i].qpn == qp->qpn) {
            return;
        }
    }
    if (dev->n_deferred == VQP_SW_DEFER_MAX) {
        ucs_debug("vqp_sw %s: QP 0x%x: doorbell inside the engine left to "
                  "progress (%u deferred already)",
                  dev->name, qp->qpn, VQP_SW_DEFER_MAX);
        return;
    }
    dev->deferred[dev->n_deferred].slot = qp->index;
    dev->deferred[dev->n_deferred].qpn  = qp->qpn;
    ++dev->n_deferred;
    if (!dev->defer_listed) {
        dev->defer_listed = true;
        dev->defer_next   = vqp_sw_defer_devs;
        vqp_sw_defer_devs = dev;
    }
}

/* A device closing drops its deferred doorbells. */
static void vqp_sw_defer_forget(vqp_sw_dev_t *dev)
{
    vqp_sw_dev_t **link;

    for (link = &vqp_sw_defer_devs; *link != NULL;
         link = &(*link)->defer_next) {
        if (*link == dev) {
            *link = dev->defer_next;
            break;
        }
    }
    dev->defer_listed = false;
    dev->n_deferred   = 0;
}

static void vqp_sw_ring_qp(vqp_sw_qp_t *qp);

void vqp_sw_engine_leave(void)
{
    vqp_sw_dev_t *dev;
    unsigned i, n;
    vqp_sw_qp_t *qp;
    struct {
        uint32_t slot;
        uint32_t qpn;
    } run[VQP_SW_DEFER_MAX];

    /* Still inside: doorbells rung by these runs are deferred again and
     * picked up by this loop. */
    while (vqp_sw_defer_devs != NULL) {
        dev               = vqp_sw_defer_devs;
        vqp_sw_defer_devs = dev->defer_next;
        dev->defer_listed = false;
        n                 = dev->n_deferred;
        memcpy(run, dev->deferred, n * sizeof(run[0]));
        dev->n_deferred = 0;
        for (i = 0; i < n; ++i) {
            qp = dev->qps[run[i].slot];
            if ((qp != NULL) && (qp->qpn == run[i].qpn)) {
                vqp_sw_ring_qp(qp);
            }
        }
    }
    vqp_sw_in_engine = false;
    vqp_sw_dev_unlock();
}

void vqp_sw_dev_close(vqp_sw_dev_t *dev)
{
    unsigned i;

    if (dev == NULL) {
        return;
    }
    vqp_sw_dev_lock();
    if (dev->exec_idle) {
        vqp_sw_idle_remove(dev);
    }
    for (i = 0; i < VQP_SW_MAX_QP; ++i) {
        if (dev->qps[i] != NULL) {
            ucs_warn("vqp_sw %s: closing with QP 0x%x still open", dev->name,
                     dev->qps[i]->qpn);
            vqp_sw_qp_destroy(dev->qps[i]);
        }
    }
    for (i = 0; i < VQP_SW_MAX_SRQ; ++i) {
        if (dev->srqs[i] != NULL) {
            vqp_sw_srq_destroy(dev->srqs[i]);
        }
    }
    for (i = 0; i < VQP_SW_MAX_CQ; ++i) {
        if (dev->cqs[i] != NULL) {
            vqp_sw_cq_destroy(dev->cqs[i]);
        }
    }
    for (i = 0; i < VQP_SW_MAX_MR; ++i) {
        if (dev->mrs[i] != NULL) {
            vqp_sw_mr_dereg(dev->mrs[i]);
        }
    }
    for (i = 0; i < VQP_SW_MAX_PEERS; ++i) {
        if (dev->peers[i].shm != NULL) {
            munmap(dev->peers[i].shm, dev->peers[i].size);
        }
    }
    vqp_sw_defer_forget(dev);
    __atomic_store_n(&dev->shm->alive, 0, __ATOMIC_RELEASE);
    vqp_sw_event_close(dev);
    if (dev->maps_fd >= 0) {
        close(dev->maps_fd);
    }
    shm_unlink(dev->name);
    if ((dev->life_tid == 0) || (dev->life_tid == gettid())) {
        if (dev->life_tid != 0) {
            pthread_mutex_unlock(&dev->shm->life);
        }
        munmap(dev->shm, dev->seg_size);
    } else {
        /* Another thread holds the life lock in its robust list (glibc
         * links the list through the mutex): the mapping must stay. */
        ucs_debug("vqp_sw %s: closed by another thread than the opener: "
                  "segment left mapped",
                  dev->name);
    }
    free(dev->arena_used);
    free(dev);
    vqp_sw_dev_unlock();
    vqp_sw_idle_stop_unused();
}

void vqp_sw_dev_query(const vqp_sw_dev_t *dev, vqp_sw_dev_attr_t *attr)
{
    *attr = dev->attr;
}

void vqp_sw_dev_address(const vqp_sw_dev_t *dev, vqp_sw_dev_addr_t *addr)
{
    addr->pid      = dev->pid;
    addr->instance = dev->instance;
}

/* One requester run of qp_list[i]; with nothing left, the poll skips it
 * until its doorbell record changes. With work left, no record value means
 * idle: the record holds 16 bits of the producer index, so the value last
 * seen idle comes back 65536 WQEs later, maybe with WQEs to run. */
static inline unsigned vqp_sw_run_qp(vqp_sw_dev_t *dev, unsigned i)
{
    vqp_sw_qp_t *qp = dev->qp_list[i];
    unsigned events;
    uint32_t db;

    events = vqp_sw_req_progress(qp);
    db     = __atomic_load_n(dev->scan[i].db, __ATOMIC_RELAXED);
    if ((uint16_t)be32toh(db) == qp->sq_ci) {
        dev->scan[i].idle = db | (dev->scan[i].idle & VQP_SW_SCAN_ERR);
    } else {
        dev->scan[i].idle |= VQP_SW_SCAN_BUSY;
    }
    return events;
}

/* The poll's visit of qp_list[i]: runs its requester unless it is idle
 * (doorbell unchanged since it had nothing left, not flushing) and @a all
 * is false; this runs for every QP on every poll. */
static inline unsigned vqp_sw_scan_qp(vqp_sw_dev_t *dev, unsigned i, bool all)
{
    if ((__atomic_load_n(dev->scan[i].db, __ATOMIC_RELAXED) ==
         dev->scan[i].idle) &&
        !all) {
        return 0;
    }
    dev->scan_hint = i;
    return vqp_sw_run_qp(dev, i);
}

/* What a NIC does after a doorbell: the requester takes every WQE rung so
 * far, in runs of the poll's budget, until none is left or the QP waits
 * (RNR, retry, backpressure) or fails. Bounded: the record is at most a
 * ring ahead. Nothing else runs: no inbound records, no other QP. */
static void vqp_sw_ring_qp(vqp_sw_qp_t *qp)
{
    unsigned runs = qp->sq_wqe_cnt / VQP_SW_WQE_BUDGET + 1;
    uint16_t pi;

    do {
        if (vqp_sw_run_qp(qp->dev, qp->list_pos) == 0) {
            return;
        }
        pi = (uint16_t)be32toh(
            __atomic_load_n(&qp->dbrec[MLX5_SND_DBR], __ATOMIC_ACQUIRE));
    } while ((pi != qp->sq_ci) && (--runs > 0));
}

void vqp_sw_qp_doorbell(vqp_sw_qp_t *qp)
{
    if (!qp->dev->exec_doorbell) {
        return;
    }
    if (!vqp_sw_engine_enter()) {
        vqp_sw_defer(qp);
        return;
    }
    vqp_sw_ring_qp(qp);
    vqp_sw_engine_leave();
}

unsigned vqp_sw_progress(vqp_sw_dev_t *dev)
{
    unsigned i, first, events = 0;
    uint32_t gen;
    uint64_t now;
    bool all;

    /* Called from inside the engine (a log handler, say): the outer call
     * is halfway through something; it does the work. */
    if (!vqp_sw_engine_enter()) {
        return 0;
    }
    ++dev->shm->progress_calls;
    /* Peers that died without a word are noticed here (and on ESRCH). */
    if ((dev->shm->progress_calls & 255) == 0) {
        now = vqp_sw_now_ns();
        if (now - dev->last_liveness > 10000000ull) {
            dev->last_liveness = now;
            for (i = 0; i < VQP_SW_MAX_PEERS; ++i) {
                if ((dev->peers[i].shm != NULL) && !dev->peers[i].dead) {
                    vqp_sw_peer_check(&dev->peers[i]);
                }
            }
        }
    }
    /* A peer set some QP's remote_err since the last look: visit all. */
    gen               = __atomic_load_n(&dev->shm->err_gen, __ATOMIC_ACQUIRE);
    all               = (gen != dev->err_gen_seen);
    dev->err_gen_seen = gen;
    /* From the QP that last had work: software that just posted on it
     * gets its WQE executed before the walk over the idle ones. */
    first = (dev->scan_hint < dev->n_qps) ? dev->scan_hint : 0;
    for (i = first; i < dev->n_qps; ++i) {
        events += vqp_sw_scan_qp(dev, i, all);
    }
    for (i = 0; i < first; ++i) {
        events += vqp_sw_scan_qp(dev, i, all);
    }
    /* Inbound records last: a responder CQE is written right before the
     * caller polls its CQ, not before a walk over the QPs. */
    if (vqp_sw_resp_pending(dev)) {
        events += vqp_sw_resp_progress(dev);
    }
    for (i = 0; dev->fault.enabled && (i < VQP_SW_MAX_CQ); ++i) {
        if ((dev->cqs[i] != NULL) && (dev->cqs[i]->n_held > 0)) {
            vqp_sw_cq_release_held(dev->cqs[i]);
        }
    }
    vqp_sw_engine_leave();
    return events;
}
