/*
 * The built module loaded into a UCX process with dlopen(RTLD_GLOBAL), as an
 * application (or LD_PRELOAD) does. Built twice: against the real module,
 * which must register component, memory domain and transport, and against a
 * copy with a deliberately skewed ABI size, which must register nothing.
 */
#include <config.h>

#include <uct/api/uct.h>

#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

static void *module_handle;

static int load_module(void **state)
{
    module_handle = dlopen(RC_VQP_MODULE, RTLD_NOW | RTLD_GLOBAL);
    if (module_handle == NULL) {
        fprintf(stderr, "dlopen(%s): %s\n", RC_VQP_MODULE, dlerror());
        return -1;
    }
    return 0;
}

static uct_component_h find_component(const char *name)
{
    uct_component_attr_t attr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
    uct_component_h *components, found = NULL;
    unsigned i, count;

    assert_int_equal(uct_query_components(&components, &count), UCS_OK);
    for (i = 0; i < count; ++i) {
        assert_int_equal(uct_component_query(components[i], &attr), UCS_OK);
        if (!strcmp(attr.name, name)) {
            found = components[i];
        }
    }
    uct_release_component_list(components);
    return found;
}

static void test_registration_state(void **state)
{
    int (*is_registered)(void) =
        (int (*)(void))dlsym(module_handle, "uct_rc_vqp_is_registered");

    assert_non_null(is_registered);
    assert_int_equal(is_registered(), RC_VQP_EXPECT_REGISTERED);
    if (RC_VQP_EXPECT_REGISTERED) {
        assert_non_null(find_component("rc_vqp"));
    } else {
        assert_null(find_component("rc_vqp"));
    }
    /* UCX's own components are unaffected either way. */
    assert_non_null(find_component("self"));
}

#if RC_VQP_EXPECT_REGISTERED
static uct_md_h open_md(uct_component_h component)
{
    uct_component_attr_t attr;
    uct_md_config_t *md_config;
    uct_md_h md;

    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    assert_int_equal(uct_component_query(component, &attr), UCS_OK);
    assert_int_equal(attr.md_resource_count, 1);
    attr.field_mask   = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = calloc(1, sizeof(*attr.md_resources));
    assert_int_equal(uct_component_query(component, &attr), UCS_OK);
    /* No mlx5 device here: the software device is offered (SW=auto). */
    assert_string_equal(attr.md_resources[0].md_name, "vqp_sw0");

    assert_int_equal(uct_md_config_read(component, NULL, NULL, &md_config),
                     UCS_OK);
    assert_int_equal(
        uct_md_open(component, attr.md_resources[0].md_name, md_config, &md),
        UCS_OK);
    uct_config_release(md_config);
    free(attr.md_resources);
    return md;
}

static void test_md_and_transport(void **state)
{
    uct_component_h component = find_component("rc_vqp");
    uct_tl_resource_desc_t *resources;
    unsigned num_resources;
    uct_md_attr_t md_attr;
    uct_md_h md;

    assert_non_null(component);
    md = open_md(component);
    assert_int_equal(uct_md_query(md, &md_attr), UCS_OK);
    assert_string_equal(md_attr.component_name, "rc_vqp");
    assert_true(md_attr.cap.flags & UCT_MD_FLAG_REG);
    assert_true(md_attr.cap.flags & UCT_MD_FLAG_NEED_RKEY);
    assert_int_equal(md_attr.rkey_packed_size, 4);
    assert_int_equal(uct_md_query_tl_resources(md, &resources, &num_resources),
                     UCS_OK);
    assert_int_equal(num_resources, 1);
    assert_string_equal(resources[0].tl_name, "rc_vqp");
    assert_string_equal(resources[0].dev_name, "vqp_sw0");
    uct_release_tl_resource_list(resources);
    uct_md_close(md);
}

/* UCX_RC_VQP_SW=n hides the software device; y offers it. */
static void test_sw_device_switch(void **state)
{
    uct_component_attr_t attr = {
        .field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT};
    uct_component_h component = find_component("rc_vqp");

    setenv("UCX_RC_VQP_SW", "n", 1);
    assert_int_equal(uct_component_query(component, &attr), UCS_OK);
    assert_int_equal(attr.md_resource_count, 0);
    setenv("UCX_RC_VQP_SW", "y", 1);
    assert_int_equal(uct_component_query(component, &attr), UCS_OK);
    assert_int_equal(attr.md_resource_count, 1);
    unsetenv("UCX_RC_VQP_SW");
}

static void test_config_from_environment(void **state)
{
    uct_component_h component = find_component("rc_vqp");
    uct_iface_config_t *config;
    char value[64];
    uct_md_h md;

    md = open_md(component);
    setenv("UCX_RC_VQP_NUM_QPS", "7", 1);
    setenv("UCX_RC_VQP_LB", "spray", 1);
    assert_int_equal(
        uct_md_iface_config_read(md, "rc_vqp", NULL, NULL, &config), UCS_OK);
    assert_int_equal(uct_config_get(config, "NUM_QPS", value, sizeof(value)),
                     UCS_OK);
    assert_string_equal(value, "7");
    assert_int_equal(uct_config_get(config, "LB", value, sizeof(value)),
                     UCS_OK);
    assert_string_equal(value, "spray");
    uct_config_release(config);

    /* A value that is not one of the documented choices is refused. */
    setenv("UCX_RC_VQP_LB", "roundrobin", 1);
    assert_int_not_equal(
        uct_md_iface_config_read(md, "rc_vqp", NULL, NULL, &config), UCS_OK);
    unsetenv("UCX_RC_VQP_LB");
    unsetenv("UCX_RC_VQP_NUM_QPS");
    uct_md_close(md);
}

static void test_iface_open_without_device(void **state)
{
    uct_component_h component = find_component("rc_vqp");
    uct_iface_params_t params = {0};
    ucs_async_context_t *async;
    uct_iface_config_t *config;
    uct_worker_h worker;
    uct_iface_h iface;
    uct_md_h md;

    md = open_md(component);
    assert_int_equal(
        ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async),
        UCS_OK);
    assert_int_equal(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker),
                     UCS_OK);
    assert_int_equal(
        uct_md_iface_config_read(md, "rc_vqp", NULL, NULL, &config), UCS_OK);
    params.field_mask =
        UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE;
    params.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
    params.mode.device.tl_name  = "rc_vqp";
    params.mode.device.dev_name = "mlx5_0:1";
    assert_int_equal(uct_iface_open(md, worker, &params, config, &iface),
                     UCS_ERR_NO_DEVICE);
    uct_config_release(config);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    uct_md_close(md);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registration_state),
#if RC_VQP_EXPECT_REGISTERED
        cmocka_unit_test(test_md_and_transport),
        cmocka_unit_test(test_sw_device_switch),
        cmocka_unit_test(test_config_from_environment),
        cmocka_unit_test(test_iface_open_without_device),
#endif
    };
    return cmocka_run_group_tests(tests, load_module, NULL);
}
