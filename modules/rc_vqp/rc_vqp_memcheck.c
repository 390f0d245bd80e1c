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

int uct_rc_vqp_memcheck; /* 0 without valgrind's headers: nothing to tell */

#ifdef UCT_RC_VQP_HAVE_MEMCHECK
static void __attribute__((constructor)) uct_rc_vqp_memcheck_init(void)
{
    uct_rc_vqp_memcheck = RUNNING_ON_VALGRIND != 0;
}
#endif

void uct_rc_vqp_memcheck_defined(const void *p, size_t n)
{
#ifdef UCT_RC_VQP_HAVE_MEMCHECK
    (void)VALGRIND_MAKE_MEM_DEFINED(p, n);
#else
    (void)p;
    (void)n;
#endif
}
