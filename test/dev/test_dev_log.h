/*
 * Test helper: captures UCS error and warning log lines so that tests can
 * check that a failure says what was wrong, and keeps them off the output.
 */
#ifndef TEST_DEV_LOG_H_
#define TEST_DEV_LOG_H_

#include <ucs/config/global_opts.h>
#include <ucs/debug/log.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static char test_log_last[1024];
static unsigned test_log_count;

static ucs_log_func_rc_t
test_log_handler(const char *file, unsigned line, const char *function,
                 ucs_log_level_t level,
                 const ucs_log_component_config_t *comp_conf,
                 const char *message, va_list ap)
{
    if (level > UCS_LOG_LEVEL_WARN) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    vsnprintf(test_log_last, sizeof(test_log_last), message, ap);
    ++test_log_count;
    return UCS_LOG_FUNC_RC_STOP;
}

static inline int test_log_setup(void **state)
{
    test_log_last[0] = '\0';
    test_log_count   = 0;
    ucs_log_push_handler(test_log_handler);
    return 0;
}

static inline int test_log_teardown(void **state)
{
    ucs_log_pop_handler();
    return 0;
}

/* The last error/warning contains @a _text; forget it for the next check. */
#define expect_log(_text)                                             \
    do {                                                              \
        if (strstr(test_log_last, (_text)) == NULL) {                 \
            fail_msg("log '%s' does not contain '%s'", test_log_last, \
                     (_text));                                        \
        }                                                             \
        test_log_last[0] = '\0';                                      \
    } while (0)

/* Diag and debug lines (a reason logged below warning level), collected
 * between test_debug_start() and test_debug_stop() with the log level
 * raised. */
static char test_debug_text[16384];
static ucs_log_level_t test_debug_saved_level;

static ucs_log_func_rc_t
test_debug_handler(const char *file, unsigned line, const char *function,
                   ucs_log_level_t level,
                   const ucs_log_component_config_t *comp_conf,
                   const char *message, va_list ap)
{
    size_t used = strlen(test_debug_text);

    if ((level < UCS_LOG_LEVEL_DIAG) || (level > UCS_LOG_LEVEL_DEBUG)) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    vsnprintf(test_debug_text + used, sizeof(test_debug_text) - used, message,
              ap);
    strncat(test_debug_text, "\n",
            sizeof(test_debug_text) - strlen(test_debug_text) - 1);
    return UCS_LOG_FUNC_RC_STOP;
}

static inline void test_debug_start(void)
{
    test_debug_text[0]     = '\0';
    test_debug_saved_level = ucs_global_opts.log_component.log_level;
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DEBUG;
    ucs_log_push_handler(test_debug_handler);
}

static inline void test_debug_stop(void)
{
    ucs_log_pop_handler();
    ucs_global_opts.log_component.log_level = test_debug_saved_level;
}

/* The debug lines so far contain @a _text (they are kept). */
#define expect_debug(_text)                                                   \
    do {                                                                      \
        if (strstr(test_debug_text, (_text)) == NULL) {                       \
            fail_msg("debug log '%s' does not contain '%s'", test_debug_text, \
                     (_text));                                                \
        }                                                                     \
    } while (0)

/* The same, then forget them for the next check. */
#define expect_debug_consume(_text) \
    do {                            \
        expect_debug(_text);        \
        test_debug_text[0] = '\0';  \
    } while (0)

#endif
