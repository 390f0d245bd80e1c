/*
 * vqp_sw_stat: lists the software device instances of this user found in
 * /dev/shm (owner pid, instance, alive or stale), their QPs with state,
 * peer (UD: qkey) and counters; --clean removes the segments of dead
 * owners.
 */
#include <config.h>

#include "sw_int.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void vqp_sw_stat_usage(FILE *f)
{
    fprintf(f, "usage: vqp_sw_stat [--clean] [--help]\n"
               "  lists live software mlx5 devices, their QPs and counters\n"
               "  --clean  remove segments whose owner process is gone\n"
               "  VQP_SW_NAMESPACE=<ns> selects a namespace of devices\n");
}

static void vqp_sw_stat_show(const char *path, const vqp_sw_shm_t *shm,
                             bool alive)
{
    const vqp_sw_shm_qp_t *qp;
    unsigned i, n_mr = 0;

    for (i = 0; i < VQP_SW_MAX_MR; ++i) {
        n_mr += (shm->mr[i].key != 0);
    }
    printf("device %s pid %u instance %u %s mrs %u inbound %lu/%u "
           "staged %lu/%u progress_calls %lu\n",
           path, shm->pid, shm->instance,
           alive ? "alive" : (shm->alive ? "stale (owner dead)" : "closed"),
           n_mr, (unsigned long)(shm->in_head - shm->in_tail), VQP_SW_INBOUND,
           (unsigned long)(shm->stage_head - shm->stage_tail),
           VQP_SW_STAGE_SIZE, (unsigned long)shm->progress_calls);
    for (i = 0; i < VQP_SW_MAX_QP; ++i) {
        qp = &shm->qp[i];
        if (qp->qpn == 0) {
            continue;
        }
        if (qp->type == VQP_SW_QPT_UD) {
            printf("  qp 0x%06x %-5s ud qkey 0x%08x rq wqes %lu bytes %lu "
                   "errors %lu flushed %lu recv %lu ud_dropped %lu "
                   "out_of_buffer %lu\n",
                   qp->qpn, vqp_sw_state_str((enum ibv_qp_state)qp->state),
                   qp->qkey, (unsigned long)qp->wqes, (unsigned long)qp->bytes,
                   (unsigned long)qp->errors, (unsigned long)qp->flushed,
                   (unsigned long)qp->recv_msgs, (unsigned long)qp->ud_dropped,
                   (unsigned long)qp->out_of_buffer);
            continue;
        }
        printf("  qp 0x%06x %-5s peer %u:%u:0x%06x %s wqes %lu bytes %lu "
               "errors %lu rnr_retries %lu retries %lu flushed %lu "
               "recv %lu\n",
               qp->qpn, vqp_sw_state_str((enum ibv_qp_state)qp->state),
               qp->dest_pid, qp->dest_instance, qp->dest_qpn,
               (qp->srq_index == VQP_SW_NO_SRQ) ? "rq" : "srq",
               (unsigned long)qp->wqes, (unsigned long)qp->bytes,
               (unsigned long)qp->errors, (unsigned long)qp->rnr_retries,
               (unsigned long)qp->retries, (unsigned long)qp->flushed,
               (unsigned long)qp->recv_msgs);
    }
}

int main(int argc, char **argv)
{
    char prefix[64], path[300];
    unsigned found = 0, removed = 0;
    bool clean = false, alive;
    struct dirent *de;
    vqp_sw_shm_t *shm;
    struct stat st;
    DIR *dir;
    int i, fd;

    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--clean")) {
            clean = true;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            vqp_sw_stat_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "vqp_sw_stat: unknown argument '%s'\n", argv[i]);
            vqp_sw_stat_usage(stderr);
            return 2;
        }
    }
    vqp_sw_shm_prefix(prefix, sizeof(prefix), getuid());
    dir = opendir("/dev/shm");
    if (dir == NULL) {
        perror("vqp_sw_stat: /dev/shm");
        return 1;
    }
    while ((de = readdir(dir)) != NULL) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "/%s", de->d_name);
        fd = shm_open(path, O_RDONLY, 0);
        if ((fd < 0) || (fstat(fd, &st) != 0) ||
            ((size_t)st.st_size < sizeof(vqp_sw_shm_t))) {
            printf("device %s unreadable or truncated\n", path);
            if (fd >= 0) {
                close(fd);
            }
            continue;
        }
        shm = mmap(NULL, sizeof(*shm), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (shm == MAP_FAILED) {
            continue;
        }
        ++found;
        if ((shm->magic != VQP_SW_MAGIC) || (shm->version != VQP_SW_VERSION)) {
            printf("device %s has an unknown format (version %u)\n", path,
                   shm->version);
            alive = false;
        } else {
            alive = shm->alive && vqp_sw_pid_alive(shm->pid, shm->start_time);
            vqp_sw_stat_show(path, shm, alive);
        }
        munmap(shm, sizeof(*shm));
        if (clean && !alive) {
            if (shm_unlink(path) == 0) {
                printf("removed %s\n", path);
                ++removed;
            }
        }
    }
    closedir(dir);
    printf("%u device(s)%s", found, clean ? "" : "\n");
    if (clean) {
        printf(", %u removed\n", removed);
    }
    return 0;
}
