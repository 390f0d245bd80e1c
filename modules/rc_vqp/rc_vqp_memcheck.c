/*
 * Valgrind client requests without UCX's NVALGRIND (rc_vqp_memcheck.h):
 * this file must not include config.h or any UCX header.
 */
#include "rc_vqp_memcheck.h"

#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define UCT_RC_VQP_HAVE_MEMCHECK 1
#endif
#endif

#ifdef UCT_RC_VQP_HAVE_MEMCHECK

int uct_rc_vqp_memcheck;

static void __attribute__((constructor)) uct_rc_vqp_memcheck_init(void)
{
    uct_rc_vqp_memcheck = RUNNING_ON_VALGRIND != 0;
}

void uct_rc_vqp_memcheck_defined(const void *p, size_t n)
{
    (void)VALGRIND_MAKE_MEM_DEFINED(p, n);
}

#else /* built without valgrind's headers: nothing to tell */

int uct_rc_vqp_memcheck;

void uct_rc_vqp_memcheck_defined(const void *p, size_t n)
{
    (void)p;
    (void)n;
}

#endif
