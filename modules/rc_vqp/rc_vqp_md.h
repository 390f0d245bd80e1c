/*
 * rc_vqp component and memory domain: what UCX sees of the transport before
 * any interface is opened.
 */
#ifndef UCT_RC_VQP_MD_H_
#define UCT_RC_VQP_MD_H_

#include <uct/base/uct_md.h>

#define UCT_RC_VQP_NAME "rc_vqp"

typedef struct uct_rc_vqp_md_config {
    uct_md_config_t super;
} uct_rc_vqp_md_config_t;

typedef struct uct_rc_vqp_md {
    uct_md_t super;
} uct_rc_vqp_md_t;

extern uct_component_t uct_rc_vqp_component;

#endif
