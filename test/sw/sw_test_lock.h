/*
 * A thread that holds a device's segment lock, as a peer process
 * descheduled inside its critical section would (tests of the engine's
 * behaviour against a busy target).
 */
#ifndef SW_TEST_LOCK_H
#define SW_TEST_LOCK_H

#include "sw/sw_int.h" /* vqp_sw_lock on the segment */

#include <pthread.h>
#include <unistd.h>

typedef struct sw_test_lock_holder {
    vqp_sw_shm_t *shm;
    pthread_t thread;
    int held;
    int release;
} sw_test_lock_holder_t;

static void *sw_test_lock_holder_run(void *arg)
{
    sw_test_lock_holder_t *h = arg;

    vqp_sw_lock(h->shm);
    __atomic_store_n(&h->held, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&h->release, __ATOMIC_ACQUIRE)) {
        usleep(1000);
    }
    vqp_sw_unlock(h->shm);
    return NULL;
}

/* Returns once the thread holds @a dev's segment lock; 0 on success. */
static inline int sw_test_lock_hold(sw_test_lock_holder_t *h, vqp_sw_dev_t *dev)
{
    h->shm     = dev->shm;
    h->held    = 0;
    h->release = 0;
    if (pthread_create(&h->thread, NULL, sw_test_lock_holder_run, h) != 0) {
        return -1;
    }
    while (!__atomic_load_n(&h->held, __ATOMIC_ACQUIRE)) {
        usleep(100);
    }
    return 0;
}

static inline void sw_test_lock_release(sw_test_lock_holder_t *h)
{
    __atomic_store_n(&h->release, 1, __ATOMIC_RELEASE);
    pthread_join(h->thread, NULL);
}

#endif
