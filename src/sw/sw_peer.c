/*
 * Software mlx5 device: peers. Mapping (and caching) another instance's
 * segment, telling whether its process is still the one that created it,
 * and moving data to and from it (process_vm_writev/readv, or memcpy when
 * the peer lives in this process).
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

uint64_t vqp_sw_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t vqp_sw_proc_start_time(uint32_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long long start = 0;
    ssize_t n;
    int fd, field;

    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    fd = open(path, O_RDONLY);
    if (fd < 0) {
        return 0;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    /* The command name may hold spaces: fields count from the last ')'. */
    p = strrchr(buf, ')');
    /* A zombie has no memory left to reach: as good as gone. */
    if ((p == NULL) || (p[1] != ' ') || (p[2] == 'Z') || (p[2] == 'X')) {
        return 0;
    }
    for (field = 2; (field < 22) && (p != NULL); ++field) {
        p = strchr(p + 1, ' ');
    }
    if ((p == NULL) || (sscanf(p + 1, "%llu", &start) != 1)) {
        return 0;
    }
    return start;
}

bool vqp_sw_pid_alive(uint32_t pid, uint64_t start_time)
{
    if ((kill((pid_t)pid, 0) != 0) && (errno == ESRCH)) {
        return false;
    }
    /* A zombie or a reused pid has another (or no) start time. */
    return vqp_sw_proc_start_time(pid) == start_time;
}

/* This process's pid, without a getpid() system call per transfer (glibc
 * does not cache it; on small transfers the call costs as much as the
 * copy). Reset in a forked child, which has another pid. */
static uint32_t vqp_sw_pid_cache;
static pthread_once_t vqp_sw_pid_once = PTHREAD_ONCE_INIT;

static void vqp_sw_pid_forked(void)
{
    vqp_sw_pid_cache = 0;
}

static void vqp_sw_pid_register(void)
{
    pthread_atfork(NULL, NULL, vqp_sw_pid_forked);
}

static inline uint32_t vqp_sw_self_pid(void)
{
    if (ucs_unlikely(vqp_sw_pid_cache == 0)) {
        pthread_once(&vqp_sw_pid_once, vqp_sw_pid_register);
        vqp_sw_pid_cache = (uint32_t)getpid();
    }
    return vqp_sw_pid_cache;
}

uint32_t vqp_sw_pid(void)
{
    return vqp_sw_self_pid();
}

int vqp_sw_xfer(uint32_t pid, bool to_remote, const struct iovec *local,
                unsigned n_local, const struct iovec *remote, unsigned n_remote)
{
    size_t total = 0, done;
    ssize_t ret;
    unsigned i, li, ri;
    size_t loff, roff, chunk;

    for (i = 0; i < n_local; ++i) {
        total += local[i].iov_len;
    }
    if (total == 0) {
        return 0;
    }
    if (pid == vqp_sw_self_pid()) {
        /* Same process: the syscall would only add cost. */
        li = ri = 0;
        loff = roff = 0;
        done        = 0;
        while (done < total) {
            chunk = local[li].iov_len - loff;
            if (remote[ri].iov_len - roff < chunk) {
                chunk = remote[ri].iov_len - roff;
            }
            if (to_remote) {
                memmove((uint8_t *)remote[ri].iov_base + roff,
                        (uint8_t *)local[li].iov_base + loff, chunk);
            } else {
                memmove((uint8_t *)local[li].iov_base + loff,
                        (uint8_t *)remote[ri].iov_base + roff, chunk);
            }
            done += chunk;
            loff += chunk;
            roff += chunk;
            if (loff == local[li].iov_len) {
                ++li;
                loff = 0;
            }
            if ((ri < n_remote) && (roff == remote[ri].iov_len)) {
                ++ri;
                roff = 0;
            }
        }
        return 0;
    }
    ret =
        to_remote
            ? process_vm_writev((pid_t)pid, local, n_local, remote, n_remote, 0)
            : process_vm_readv((pid_t)pid, local, n_local, remote, n_remote, 0);
    if (ret < 0) {
        return errno;
    }
    done = (size_t)ret;
    while (done < total) {
        /* A partial transfer ends on an iovec boundary; retry the rest. */
        struct iovec l[VQP_SW_RUN_IOV], r[VQP_SW_RUN_IOV];
        size_t skip = done, nl = 0, nr = 0;

        for (i = 0; i < n_local; ++i) {
            if (skip >= local[i].iov_len) {
                skip -= local[i].iov_len;
                continue;
            }
            l[nl].iov_base = (uint8_t *)local[i].iov_base + skip;
            l[nl].iov_len  = local[i].iov_len - skip;
            ++nl;
            skip = 0;
        }
        skip = done;
        for (i = 0; i < n_remote; ++i) {
            if (skip >= remote[i].iov_len) {
                skip -= remote[i].iov_len;
                continue;
            }
            r[nr].iov_base = (uint8_t *)remote[i].iov_base + skip;
            r[nr].iov_len  = remote[i].iov_len - skip;
            ++nr;
            skip = 0;
        }
        ret = to_remote ? process_vm_writev((pid_t)pid, l, nl, r, nr, 0)
                        : process_vm_readv((pid_t)pid, l, nl, r, nr, 0);
        if (ret < 0) {
            return errno;
        }
        if (ret == 0) {
            return EFAULT;
        }
        done += (size_t)ret;
    }
    return 0;
}

/* Map (or find the cached mapping of) a peer instance's segment. */
static vqp_sw_peer_t *vqp_sw_peer_open(vqp_sw_dev_t *dev,
                                       const vqp_sw_dev_addr_t *addr,
                                       ucs_log_level_t level)
{
    char name[VQP_SW_NAME_MAX];
    vqp_sw_peer_t *peer, *free_slot = NULL;
    vqp_sw_shm_t *shm;
    struct stat st;
    unsigned i;
    int fd, err;

    for (i = 0; i < VQP_SW_MAX_PEERS; ++i) {
        peer = &dev->peers[i];
        if (peer->shm == NULL) {
            if (free_slot == NULL) {
                free_slot = peer;
            }
        } else if ((peer->pid == addr->pid) &&
                   (peer->instance == addr->instance) && !peer->dead) {
            ++peer->refs;
            return peer;
        }
    }
    if (free_slot == NULL) {
        ucs_error("vqp_sw %s: too many peer devices (max %u)", dev->name,
                  VQP_SW_MAX_PEERS);
        return NULL;
    }
    vqp_sw_shm_name(name, sizeof(name), (uint32_t)getuid(), addr->pid,
                    addr->instance);
    fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        err = errno;
        if ((level < UCS_LOG_LEVEL_DIAG) && (kill((pid_t)addr->pid, 0) != 0) &&
            (errno == ESRCH)) {
            /* Its process ended (a peer failure, not a wrong address). */
            level = UCS_LOG_LEVEL_DIAG;
        }
        ucs_log(level, "vqp_sw %s: peer device %s not found: %s", dev->name,
                name, strerror(err));
        return NULL;
    }
    if ((fstat(fd, &st) != 0) || ((size_t)st.st_size < sizeof(vqp_sw_shm_t))) {
        ucs_error("vqp_sw %s: peer segment %s is too small", dev->name, name);
        close(fd);
        return NULL;
    }
    shm = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
               0);
    close(fd);
    if (shm == MAP_FAILED) {
        ucs_error("vqp_sw %s: mmap of peer %s failed: %m", dev->name, name);
        return NULL;
    }
    if ((__atomic_load_n(&shm->magic, __ATOMIC_ACQUIRE) != VQP_SW_MAGIC) ||
        (shm->version != VQP_SW_VERSION) ||
        (shm->hdr_size != sizeof(vqp_sw_shm_t))) {
        ucs_log(level,
                "vqp_sw %s: peer segment %s has another format (version "
                "%u, header %u bytes; ours %u, %zu)",
                dev->name, name, shm->version, shm->hdr_size, VQP_SW_VERSION,
                sizeof(vqp_sw_shm_t));
        munmap(shm, (size_t)st.st_size);
        return NULL;
    }
    free_slot->pid             = addr->pid;
    free_slot->instance        = addr->instance;
    free_slot->start_time      = shm->start_time;
    free_slot->shm             = shm;
    free_slot->size            = (size_t)st.st_size;
    free_slot->dead            = false;
    free_slot->life_unreliable = false;
    free_slot->refs            = 1;
    free_slot->in_tail_seen    = 0; /* a lower bound of any tail */
    free_slot->stage_tail_seen = 0;
    return free_slot;
}

vqp_sw_peer_t *vqp_sw_peer_get(vqp_sw_dev_t *dev, const vqp_sw_dev_addr_t *addr)
{
    return vqp_sw_peer_open(dev, addr, UCS_LOG_LEVEL_ERROR);
}

vqp_sw_peer_t *vqp_sw_peer_get_quiet(vqp_sw_dev_t *dev,
                                     const vqp_sw_dev_addr_t *addr)
{
    return vqp_sw_peer_open(dev, addr, UCS_LOG_LEVEL_DEBUG);
}

void vqp_sw_peer_put(vqp_sw_dev_t *dev, vqp_sw_peer_t *peer)
{
    if ((peer == NULL) || (--peer->refs > 0)) {
        return;
    }
    munmap(peer->shm, peer->size);
    memset(peer, 0, sizeof(*peer));
}

bool vqp_sw_peer_alive(vqp_sw_peer_t *peer, uint32_t self_pid)
{
    int word;

    if (peer->dead) {
        return false;
    }
    if (peer->pid == self_pid) {
        return true;
    }
    if (!peer->life_unreliable) {
        /* glibc's robust mutex word: owner TID, or FUTEX_OWNER_DIED once
         * the kernel released it for a thread that ended. */
        word =
            __atomic_load_n(&peer->shm->life.__data.__lock, __ATOMIC_ACQUIRE);
        if (((word & FUTEX_TID_MASK) != 0) && !(word & FUTEX_OWNER_DIED)) {
            return true;
        }
        /* Closed, dead, or only the opening thread ended: ask the slow
         * way, and ask kill() per message from now on if it lives. */
        if (!vqp_sw_peer_check(peer)) {
            return false;
        }
        peer->life_unreliable = true;
    }
    if ((kill((pid_t)peer->pid, 0) != 0) && (errno == ESRCH)) {
        peer->dead = true;
        return false;
    }
    return true;
}

/* False once the peer instance is closed or its process is gone. */
bool vqp_sw_peer_check(vqp_sw_peer_t *peer)
{
    if (peer->dead) {
        return false;
    }
    if (!__atomic_load_n(&peer->shm->alive, __ATOMIC_ACQUIRE) ||
        !vqp_sw_pid_alive(peer->pid, peer->start_time)) {
        peer->dead = true;
    }
    return !peer->dead;
}
