/*
 * Software mlx5 device: the idle executor (VQP_SW_EXEC=auto).
 *
 * A NIC executes what was rung whether or not the process that rang it
 * ever calls into the driver again. This engine runs inside its owner's
 * calls, so a process that posts and then waits on something else (its
 * peer's event fd, a socket, a sleep) would keep its WQEs forever. One
 * thread per process visits every device of this mode each period and
 * progresses those whose owner made no progress call since the previous
 * visit: posted work leaves within one to two periods, and an owner that
 * progresses keeps the executor out of its way (a visit that finds the
 * device lock held skips the period).
 */
#include <config.h>

#include "sw_int.h"

#include <ucs/debug/log.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VQP_SW_IDLE_US_DEFAULT 1000u
#define VQP_SW_IDLE_US_MIN     100u
#define VQP_SW_IDLE_US_MAX     1000000u

/* The devices on the list: under the device lock. */
static vqp_sw_dev_t *vqp_sw_idle_devs;
static unsigned vqp_sw_idle_count;

/* The thread: started and stopped under ctl (never taken by the thread
 * itself, so a stop may join with it held); it sleeps on cond under mutex,
 * where stop is set. */
static struct {
    pthread_mutex_t ctl;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    pthread_t thread;
    bool running;
    bool stop;
    unsigned period_us;
} vqp_sw_idle = {
    .ctl   = PTHREAD_MUTEX_INITIALIZER,
    .mutex = PTHREAD_MUTEX_INITIALIZER,
};

void vqp_sw_idle_add(vqp_sw_dev_t *dev)
{
    dev->idle_calls  = dev->shm->progress_calls;
    dev->idle_next   = vqp_sw_idle_devs;
    vqp_sw_idle_devs = dev;
    __atomic_add_fetch(&vqp_sw_idle_count, 1, __ATOMIC_RELAXED);
}

void vqp_sw_idle_remove(vqp_sw_dev_t *dev)
{
    vqp_sw_dev_t **link;

    for (link = &vqp_sw_idle_devs; *link != NULL; link = &(*link)->idle_next) {
        if (*link == dev) {
            *link = dev->idle_next;
            __atomic_sub_fetch(&vqp_sw_idle_count, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

uint64_t vqp_sw_dev_idle_runs(const vqp_sw_dev_t *dev)
{
    uint64_t runs;

    vqp_sw_dev_lock();
    runs = dev->idle_runs;
    vqp_sw_dev_unlock();
    return runs;
}

/* One period's visit. A device whose owner progressed since the last visit
 * needs nothing; the others are progressed until idle (bounded), as the
 * owner's own loop would. */
static void vqp_sw_idle_visit(void)
{
    vqp_sw_dev_t *dev;
    unsigned i;

    if (!vqp_sw_dev_trylock()) {
        return; /* an owner is in the engine or a control call: busy */
    }
    for (dev = vqp_sw_idle_devs; dev != NULL; dev = dev->idle_next) {
        if (dev->shm->progress_calls == dev->idle_calls) {
            for (i = 0; (i < 64) && (vqp_sw_progress(dev) != 0); ++i) {
            }
            dev->idle_runs += (i > 0);
        }
        dev->idle_calls = dev->shm->progress_calls;
    }
    vqp_sw_dev_unlock();
}

static void *vqp_sw_idle_main(void *arg)
{
    struct timespec deadline;
    uint64_t ns;

    (void)arg;
    pthread_mutex_lock(&vqp_sw_idle.mutex);
    while (!vqp_sw_idle.stop) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        ns = (uint64_t)deadline.tv_nsec + vqp_sw_idle.period_us * 1000ull;
        deadline.tv_sec += (time_t)(ns / 1000000000ull);
        deadline.tv_nsec = (long)(ns % 1000000000ull);
        while (!vqp_sw_idle.stop &&
               (pthread_cond_timedwait(&vqp_sw_idle.cond, &vqp_sw_idle.mutex,
                                       &deadline) != ETIMEDOUT)) {
        }
        if (vqp_sw_idle.stop) {
            break;
        }
        pthread_mutex_unlock(&vqp_sw_idle.mutex);
        vqp_sw_idle_visit();
        pthread_mutex_lock(&vqp_sw_idle.mutex);
    }
    pthread_mutex_unlock(&vqp_sw_idle.mutex);
    return NULL;
}

/* VQP_SW_IDLE_US: the period, in microseconds. */
static ucs_status_t vqp_sw_idle_period(unsigned *period_p)
{
    const char *env = getenv("VQP_SW_IDLE_US");
    unsigned long val;
    char *end;

    *period_p = VQP_SW_IDLE_US_DEFAULT;
    if ((env == NULL) || (*env == '\0')) {
        return UCS_OK;
    }
    errno = 0;
    val   = strtoul(env, &end, 10);
    if ((errno != 0) || (*end != '\0') || (val < VQP_SW_IDLE_US_MIN) ||
        (val > VQP_SW_IDLE_US_MAX)) {
        ucs_error("vqp_sw: invalid VQP_SW_IDLE_US '%s' (%u..%u microseconds)",
                  env, VQP_SW_IDLE_US_MIN, VQP_SW_IDLE_US_MAX);
        return UCS_ERR_INVALID_PARAM;
    }
    *period_p = (unsigned)val;
    return UCS_OK;
}

ucs_status_t vqp_sw_idle_start(void)
{
    pthread_condattr_t cattr;
    ucs_status_t status = UCS_OK;
    unsigned period;
    int ret;

    status = vqp_sw_idle_period(&period);
    if (status != UCS_OK) {
        return status;
    }
    pthread_mutex_lock(&vqp_sw_idle.ctl);
    if (!vqp_sw_idle.running) {
        pthread_condattr_init(&cattr);
        pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
        pthread_cond_init(&vqp_sw_idle.cond, &cattr);
        pthread_condattr_destroy(&cattr);
        vqp_sw_idle.stop      = false;
        vqp_sw_idle.period_us = period;
        ret = pthread_create(&vqp_sw_idle.thread, NULL, vqp_sw_idle_main, NULL);
        if (ret == 0) {
            vqp_sw_idle.running = true;
            ucs_debug("vqp_sw: idle executor started (period %u us)", period);
        } else {
            ucs_error("vqp_sw: cannot start the idle executor thread: %s",
                      strerror(ret));
            pthread_cond_destroy(&vqp_sw_idle.cond);
            status = UCS_ERR_NO_RESOURCE;
        }
    }
    pthread_mutex_unlock(&vqp_sw_idle.ctl);
    return status;
}

/* Stops the thread if it runs and @a always or no device is listed. */
static void vqp_sw_idle_stop(bool always)
{
    pthread_mutex_lock(&vqp_sw_idle.ctl);
    if (vqp_sw_idle.running &&
        (always ||
         (__atomic_load_n(&vqp_sw_idle_count, __ATOMIC_RELAXED) == 0))) {
        pthread_mutex_lock(&vqp_sw_idle.mutex);
        vqp_sw_idle.stop = true;
        pthread_cond_signal(&vqp_sw_idle.cond);
        pthread_mutex_unlock(&vqp_sw_idle.mutex);
        pthread_join(vqp_sw_idle.thread, NULL);
        pthread_cond_destroy(&vqp_sw_idle.cond);
        vqp_sw_idle.running = false;
        ucs_debug("vqp_sw: idle executor stopped");
    }
    pthread_mutex_unlock(&vqp_sw_idle.ctl);
}

void vqp_sw_idle_stop_unused(void)
{
    vqp_sw_idle_stop(false);
}

/* A process that exits (or unloads this library) with devices still open:
 * the thread must not run into UCS's own destructors, which run after this
 * one (UCS is loaded before us). */
static void __attribute__((destructor)) vqp_sw_idle_fini(void)
{
    vqp_sw_idle_stop(true);
}

void vqp_sw_idle_forked(void)
{
    /* The parent's thread and devices stay the parent's. Called with the
     * device lock held (fork waits for it), so the list is consistent. */
    pthread_mutex_init(&vqp_sw_idle.ctl, NULL);
    pthread_mutex_init(&vqp_sw_idle.mutex, NULL);
    vqp_sw_idle.running = false;
    vqp_sw_idle.stop    = false;
    vqp_sw_idle_devs    = NULL;
    vqp_sw_idle_count   = 0;
}
