/*
 * Checks of the UCT- and UCP-level test programs: a failed one prints where
 * and why and exits the process with status 1. A program that wants more
 * context in the message defines its own CHECK before including this.
 */
#ifndef VQP_TEST_CHECK_H_
#define VQP_TEST_CHECK_H_

#include <ucs/type/status.h>

#include <stdio.h>
#include <stdlib.h>

#ifndef CHECK
#define CHECK(_cond, ...)                                                    \
    do {                                                                     \
        if (!(_cond)) {                                                      \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, \
                    #_cond);                                                 \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            exit(1);                                                         \
        }                                                                    \
    } while (0)
#endif

#define CHECK_OK(_expr)                                                 \
    do {                                                                \
        ucs_status_t _st = (_expr);                                     \
        CHECK(_st == UCS_OK, "%s: %s", #_expr, ucs_status_string(_st)); \
    } while (0)

#endif
