/*
 * Device control without hardware: enumeration reports no mlx5 port when
 * verbs finds no device (as on every machine of this project) and succeeds,
 * the software device is listed only when asked for, and every way of naming
 * a device that does not exist or cannot exist fails cleanly with a log.
 */
#include <config.h>

#include <dev/vqp_dev.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>

#include "test_dev_log.h"

/* Number of devices verbs itself sees: the expectation for the hardware
 * part of the list, which can only be empty when this is 0. */
static int verbs_device_count(void)
{
    struct ibv_device **devices;
    int num = 0;

    devices = ibv_get_device_list(&num);
    if (devices == NULL) {
        return 0;
    }
    ibv_free_device_list(devices);
    return num;
}

static void test_list_hardware(void **state)
{
    vqp_dev_info_t *list = (void *)0x1;
    unsigned count       = 12345, i;

    assert_int_equal(vqp_dev_list(0, &list, &count), UCS_OK);
    for (i = 0; i < count; ++i) {
        assert_int_not_equal(list[i].link, VQP_DEV_LINK_SW);
        assert_non_null(strchr(list[i].name, ':'));
        assert_true(list[i].active);
    }
    if (verbs_device_count() == 0) {
        assert_int_equal(count, 0);
    }
    vqp_dev_list_free(list);

    assert_int_equal(vqp_dev_list(VQP_DEV_LIST_INACTIVE, &list, &count),
                     UCS_OK);
    if (verbs_device_count() == 0) {
        assert_int_equal(count, 0);
    }
    vqp_dev_list_free(list);
}

static void test_list_sw_only_when_asked(void **state)
{
    vqp_dev_info_t *list;
    unsigned count, hw_count, i, sw_seen = 0;

    assert_int_equal(vqp_dev_list(0, &list, &hw_count), UCS_OK);
    vqp_dev_list_free(list);

    assert_int_equal(vqp_dev_list(VQP_DEV_LIST_SW, &list, &count), UCS_OK);
    assert_int_equal(count, hw_count + 1);
    for (i = 0; i < count; ++i) {
        if (list[i].link == VQP_DEV_LINK_SW) {
            assert_string_equal(list[i].name, VQP_DEV_SW_NAME);
            assert_true(list[i].active);
            ++sw_seen;
        }
    }
    assert_int_equal(sw_seen, 1);
    vqp_dev_list_free(list);
}

static void test_list_bad_args(void **state)
{
    vqp_dev_info_t *list;
    unsigned count;

    assert_int_equal(vqp_dev_list(0x80, &list, &count), UCS_ERR_INVALID_PARAM);
    expect_log("unknown flags 0x80");
    assert_int_equal(vqp_dev_list(0, NULL, &count), UCS_ERR_INVALID_PARAM);
    expect_log("NULL output argument");
    assert_int_equal(vqp_dev_list(0, &list, NULL), UCS_ERR_INVALID_PARAM);
    expect_log("NULL output argument");
}

static void test_open_unknown_device(void **state)
{
    static const char *names[] = {"mlx5_0:1",    "mlx5_0",  "mlx5_99:2",
                                  "no_such_dev", "vqp_sw1", "VQP_SW0"};
    vqp_dev_t *dev             = NULL;
    unsigned i;

    if (verbs_device_count() != 0) {
        skip(); /* a machine with HCAs may have mlx5_0 */
    }
    for (i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
        assert_int_equal(vqp_dev_open(names[i], NULL, &dev), UCS_ERR_NO_DEVICE);
        assert_null(dev);
        expect_log(names[i]);
    }
}

static void test_open_bad_names(void **state)
{
    static const char *names[] = {"mlx5_0:",  ":1",         "mlx5_0:0",
                                  "mlx5_0:x", "mlx5_0:256", "mlx5_0:1x",
                                  "mlx5_0:-1"};
    char long_name[VQP_DEV_NAME_MAX + 1];
    vqp_dev_open_params_t params;
    vqp_dev_t *dev = NULL;
    unsigned i;

    for (i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
        assert_int_equal(vqp_dev_open(names[i], NULL, &dev),
                         UCS_ERR_INVALID_PARAM);
        expect_log("is not <device>:<port 1..255>");
    }

    memset(long_name, 'm', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    assert_int_equal(vqp_dev_open(long_name, NULL, &dev),
                     UCS_ERR_INVALID_PARAM);
    expect_log("empty or longer than 63 characters");
    assert_int_equal(vqp_dev_open("", NULL, &dev), UCS_ERR_INVALID_PARAM);
    expect_log("empty or longer");
    assert_int_equal(vqp_dev_open(NULL, NULL, &dev), UCS_ERR_INVALID_PARAM);
    expect_log("NULL name");
    vqp_dev_open_params_default(&params);
    assert_int_equal(params.gid_index, -1);
    assert_int_equal(vqp_dev_open("mlx5_0:1", &params, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL dev_p");
    params.gid_index = -2;
    assert_int_equal(vqp_dev_open("mlx5_0:1", &params, &dev),
                     UCS_ERR_INVALID_PARAM);
    expect_log("mlx5_0:1: GID index -2 is invalid (-1: automatic)");
    assert_null(dev);
}

static void test_connect_defaults(void **state)
{
    vqp_dev_connect_params_t params;

    memset(&params, 0xff, sizeof(params));
    vqp_dev_connect_params_default(&params);
    /* Values a real HCA accepts: IB encodings within range, every remote
     * right, the NIC's own source port unless an index is given. */
    assert_int_equal(params.access, IBV_ACCESS_REMOTE_WRITE |
                                        IBV_ACCESS_REMOTE_READ |
                                        IBV_ACCESS_REMOTE_ATOMIC);
    assert_true(params.min_rnr_timer <= 31);
    assert_true(params.timeout <= 31);
    assert_true(params.retry_cnt <= 7);
    assert_int_equal(params.rnr_retry, 7);
    assert_int_equal(params.udp_sport_index, -1);
    assert_int_equal(params.path_mtu, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_hardware),
        cmocka_unit_test(test_list_sw_only_when_asked),
        cmocka_unit_test(test_list_bad_args),
        cmocka_unit_test(test_open_unknown_device),
        cmocka_unit_test(test_open_bad_names),
        cmocka_unit_test(test_connect_defaults),
    };
    return cmocka_run_group_tests(tests, test_log_setup, test_log_teardown);
}
