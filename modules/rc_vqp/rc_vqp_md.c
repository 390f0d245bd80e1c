/*
 * rc_vqp component and memory domain. The module registers itself from a
 * constructor (UCX 1.13 loads only the modules fixed at its build, so rc_vqp
 * arrives by LD_PRELOAD or an application's dlopen), after the ABI guard has
 * accepted the UCX library it was loaded into.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <config.h>

#include "rc_vqp_abi.h"
#include "rc_vqp_iface.h"
#include "rc_vqp_md.h"

#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/compiler.h>
#include <limits.h>

static ucs_config_field_t uct_rc_vqp_md_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_rc_vqp_md_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_table)},

    {NULL}};

static void uct_rc_vqp_md_close(uct_md_h uct_md)
{
    ucs_free(ucs_derived_of(uct_md, uct_rc_vqp_md_t));
}

static ucs_status_t uct_rc_vqp_md_query(uct_md_h uct_md, uct_md_attr_t *attr)
{
    memset(attr, 0, sizeof(*attr));
    /* No device yet, so nothing can be registered. */
    attr->cap.flags            = 0;
    attr->cap.reg_mem_types    = 0;
    attr->cap.access_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    attr->rkey_packed_size     = 0;
    attr->reg_cost             = ucs_linear_func_make(0, 0);
    memset(&attr->local_cpus, 0xff, sizeof(attr->local_cpus));
    return UCS_OK;
}

static uct_md_ops_t uct_rc_vqp_md_ops = {
    .close     = uct_rc_vqp_md_close,
    .query     = uct_rc_vqp_md_query,
    .mem_alloc = (uct_md_mem_alloc_func_t)ucs_empty_function_return_unsupported,
    .mem_free  = (uct_md_mem_free_func_t)ucs_empty_function_return_unsupported,
    .mem_advise =
        (uct_md_mem_advise_func_t)ucs_empty_function_return_unsupported,
    .mem_reg   = (uct_md_mem_reg_func_t)ucs_empty_function_return_unsupported,
    .mem_dereg = (uct_md_mem_dereg_func_t)ucs_empty_function_return_unsupported,
    .mem_query = (uct_md_mem_query_func_t)ucs_empty_function_return_unsupported,
    .mkey_pack = (uct_md_mkey_pack_func_t)ucs_empty_function_return_unsupported,
    .is_sockaddr_accessible = (uct_md_is_sockaddr_accessible_func_t)
        ucs_empty_function_return_zero_int,
    .detect_memory_type =
        (uct_md_detect_memory_type_func_t)ucs_empty_function_return_unsupported,
};

static ucs_status_t uct_rc_vqp_md_open(uct_component_t *component,
                                       const char *md_name,
                                       const uct_md_config_t *config,
                                       uct_md_h *md_p)
{
    uct_rc_vqp_md_t *md;

    md = ucs_calloc(1, sizeof(*md), "rc_vqp_md");
    if (md == NULL) {
        ucs_error("rc_vqp: failed to allocate memory domain %s", md_name);
        return UCS_ERR_NO_MEMORY;
    }

    md->super.ops       = &uct_rc_vqp_md_ops;
    md->super.component = component;
    *md_p               = &md->super;
    return UCS_OK;
}

static ucs_status_t
uct_rc_vqp_query_md_resources(uct_component_t *component,
                              uct_md_resource_desc_t **resources_p,
                              unsigned *num_resources_p)
{
    return uct_md_query_single_md_resource(component, resources_p,
                                           num_resources_p);
}

uct_component_t uct_rc_vqp_component = {
    .query_md_resources = uct_rc_vqp_query_md_resources,
    .md_open            = uct_rc_vqp_md_open,
    .cm_open =
        (uct_component_cm_open_func_t)ucs_empty_function_return_unsupported,
    .rkey_unpack = uct_md_stub_rkey_unpack,
    .rkey_ptr =
        (uct_component_rkey_ptr_func_t)ucs_empty_function_return_unsupported,
    .rkey_release =
        (uct_component_rkey_release_func_t)ucs_empty_function_return_success,
    .name = UCT_RC_VQP_NAME,
    .md_config =
        {
            .name   = "rc_vqp memory domain",
            .prefix = "RC_VQP_",
            .table  = uct_rc_vqp_md_config_table,
            .size   = sizeof(uct_rc_vqp_md_config_t),
        },
    .cm_config   = UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY,
    .tl_list     = UCT_COMPONENT_TL_LIST_INITIALIZER(&uct_rc_vqp_component),
    .flags       = 0,
    .md_vfs_init = (uct_component_md_vfs_init_func_t)ucs_empty_function,
};

/* Set only when the constructor registered: unregistering what was never
 * registered corrupts UCX's lists. */
static int uct_rc_vqp_registered;

int uct_rc_vqp_is_registered(void)
{
    return uct_rc_vqp_registered;
}

UCS_F_CTOR void uct_rc_vqp_init(void)
{
    if (uct_rc_vqp_abi_verify() != UCS_OK) {
        return;
    }

    uct_component_register(&uct_rc_vqp_component);
    uct_tl_register(&uct_rc_vqp_component, &UCT_TL_NAME(rc_vqp));
    uct_rc_vqp_registered = 1;
}

UCS_F_DTOR void uct_rc_vqp_cleanup(void)
{
    if (!uct_rc_vqp_registered) {
        return;
    }

    uct_tl_unregister(&UCT_TL_NAME(rc_vqp));
    uct_component_unregister(&uct_rc_vqp_component);
    uct_rc_vqp_registered = 0;
}
