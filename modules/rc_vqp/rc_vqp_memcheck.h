/*
 * Telling valgrind's memcheck about memory the device wrote. An HCA's DMA,
 * and the software device's engine in another process, write into this
 * process's buffers without memcheck seeing it, so it would take received
 * bytes for uninitialised (UCX's own ib transports mark them the same way).
 * UCX's config.h defines NVALGRIND, which turns valgrind's client requests
 * into nothing in any file that includes it; rc_vqp_memcheck.c includes no
 * UCX header, so its requests work under valgrind, and cost one test of a
 * flag outside it.
 */
#ifndef UCT_RC_VQP_MEMCHECK_H_
#define UCT_RC_VQP_MEMCHECK_H_

#include <stddef.h>

/* Non-zero when running under valgrind (set when the module loads). */
extern int uct_rc_vqp_memcheck;

/* Marks [p, p + n) defined for memcheck; the caller tests the flag. */
void uct_rc_vqp_memcheck_defined(const void *p, size_t n);

/* [p, p + n) was written by the device. */
#define UCT_RC_VQP_DEVICE_WROTE(_p, _n)                 \
    do {                                                \
        if (__builtin_expect(uct_rc_vqp_memcheck, 0)) { \
            uct_rc_vqp_memcheck_defined(_p, _n);        \
        }                                               \
    } while (0)

#endif
