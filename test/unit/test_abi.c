/* ABI guard: matching sizes pass, any mismatch is refused with a message. */
#include <config.h>

#include "../../modules/rc_vqp/rc_vqp_abi.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>

static void test_installed_ucx_matches(void **state)
{
    uct_rc_vqp_abi_entry_t entries[16];
    unsigned i, count;
    char msg[512] = "";

    count = uct_rc_vqp_abi_collect(entries, 16);
    assert_true(count >= 5);
    for (i = 0; i < count; ++i) {
        /* A size of 0 would mean we read a symbol that is not a class. */
        assert_true(entries[i].library_size > 0);
        assert_int_equal(entries[i].library_size, entries[i].header_size);
    }
    assert_int_equal(uct_rc_vqp_abi_check(entries, count, msg, sizeof(msg)),
                     UCS_OK);
    assert_string_equal(msg, "");
    assert_int_equal(uct_rc_vqp_abi_verify(), UCS_OK);
}

static void test_mismatch_refused(void **state)
{
    uct_rc_vqp_abi_entry_t entries[3] = {
        {"type_a", 16, 16},
        {"uct_base_iface_t", 1280, 1288},
        {"type_c", 8, 8},
    };
    char msg[512] = "";

    assert_int_equal(uct_rc_vqp_abi_check(entries, 3, msg, sizeof(msg)),
                     UCS_ERR_UNSUPPORTED);
    assert_non_null(strstr(msg, "sizeof(uct_base_iface_t) is 1280 in libuct"));
    assert_non_null(strstr(msg, "1288 in rc_vqp"));
    assert_non_null(strstr(msg, "not registered"));
}

static void test_mismatch_in_last_entry(void **state)
{
    uct_rc_vqp_abi_entry_t entries[2] = {{"a", 8, 8}, {"b", 24, 16}};
    char msg[512]                     = "";

    assert_int_equal(uct_rc_vqp_abi_check(entries, 2, msg, sizeof(msg)),
                     UCS_ERR_UNSUPPORTED);
    assert_non_null(strstr(msg, "sizeof(b) is 24"));
    /* An empty table has nothing to refuse. */
    assert_int_equal(uct_rc_vqp_abi_check(entries, 0, msg, sizeof(msg)),
                     UCS_OK);
}

static void test_collect_respects_max(void **state)
{
    uct_rc_vqp_abi_entry_t entries[2];

    assert_int_equal(uct_rc_vqp_abi_collect(entries, 2), 2);
    assert_int_equal(uct_rc_vqp_abi_collect(entries, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_installed_ucx_matches),
        cmocka_unit_test(test_mismatch_refused),
        cmocka_unit_test(test_mismatch_in_last_entry),
        cmocka_unit_test(test_collect_respects_max),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
