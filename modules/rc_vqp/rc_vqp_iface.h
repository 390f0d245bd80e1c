/*
 * rc_vqp transport definition: configuration (UCX_RC_VQP_*) and the
 * interface entry points UCX calls through uct_tl_t.
 */
#ifndef UCT_RC_VQP_IFACE_H_
#define UCT_RC_VQP_IFACE_H_

#include <uct/base/uct_iface.h>

/* Load balancing of one operation's fragments over the physical QPs. */
typedef enum uct_rc_vqp_lb {
    UCT_RC_VQP_LB_DQPLB, /* every fragment WRITE_IMM with a sequence number */
    UCT_RC_VQP_LB_SPRAY, /* plain WRITEs, then one notify on a separate QP */
    UCT_RC_VQP_LB_LAST
} uct_rc_vqp_lb_t;

typedef struct uct_rc_vqp_iface_config {
    uct_iface_config_t super;
    unsigned num_qps;          /* physical data QPs per endpoint */
    int lb;                    /* uct_rc_vqp_lb_t */
    size_t frag_size;          /* striping fragment size */
    size_t stripe_threshold;   /* smaller ops use one QP */
    unsigned max_outstanding;  /* fragments in flight per QP */
    unsigned tx_queue_len;     /* operations in flight per endpoint */
    unsigned rx_queue_len;     /* AM receive buffers of the interface (SRQ) */
    int rx_max_bufs;           /* receive buffers allocated at most; -1: any */
    int tx_max_bufs;           /* bcopy buffers allocated at most; -1: any */
    unsigned tx_bufs_grow;     /* bcopy buffers allocated at a time */
    unsigned fc_wnd_size;      /* AMs in flight per endpoint (credits) */
    size_t seg_size;           /* bcopy / AM buffer size */
    unsigned cq_len;           /* CQEs of the interface's CQ */
    size_t max_inline;         /* inline bytes asked of the QPs */
    double timeout;            /* ack timeout before a retry, seconds */
    unsigned retry_count;      /* retries before a transport error */
    double rnr_timeout;        /* wait before resending to a full RQ */
    double connect_timeout;    /* connection manager's give-up time */
    double keepalive_interval; /* probe of idle passive endpoints */
} uct_rc_vqp_iface_config_t;

extern ucs_config_field_t uct_rc_vqp_iface_config_table[];
extern const char *uct_rc_vqp_lb_names[];
extern uct_tl_t UCT_TL_NAME(rc_vqp);

/* Non-zero when the module's constructor registered the transport. */
int uct_rc_vqp_is_registered(void);

#endif
