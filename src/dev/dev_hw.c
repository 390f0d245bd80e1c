/*
 * Device control on mlx5 hardware: enumerates HCA ports with libibverbs,
 * creates PD, MRs, CQs, SRQs and RC QPs with verbs, exposes their queue
 * memory with mlx5dv_init_obj and connects QPs with ibv_modify_qp (IB by LID,
 * RoCE by GID) plus a per-QP UDP source port on RoCE. With no RDMA support in
 * the kernel or no mlx5 device it lists nothing and opens nothing.
 */
#include <config.h>

#include "dev_hw_event.h"

#include <ucs/debug/log.h>
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct vqp_dev_hw {
    vqp_dev_t super;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    uint8_t port;
    int gid_index;                    /* GID used as source, -1 on IB local */
    struct ibv_comp_channel *channel; /* every CQ's events; NULL: none */
} vqp_dev_hw_t;

typedef struct vqp_dev_hw_mr {
    vqp_dev_mr_t super;
    struct ibv_mr *mr;
} vqp_dev_hw_mr_t;

/* A CQ is polled by one thread (a UCX worker's), and the QPs whose sends
 * complete on it are posted by that thread: they share a thread domain, so
 * rdma-core gives them a BlueFlame register no QP of another CQ uses. */
typedef struct vqp_dev_hw_cq {
    vqp_dev_cq_t super;
    struct ibv_cq *cq;
    struct ibv_td *td; /* NULL: none (QPs on the plain PD, 8-byte doorbells) */
    struct ibv_pd *pd; /* the parent domain of the PD and td, or NULL */
} vqp_dev_hw_cq_t;

typedef struct vqp_dev_hw_srq {
    vqp_dev_srq_t super;
    struct ibv_srq *srq;
} vqp_dev_hw_srq_t;

typedef struct vqp_dev_hw_qp {
    vqp_dev_qp_t super;
    struct ibv_qp *qp;
} vqp_dev_hw_qp_t;

typedef struct vqp_dev_hw_ah {
    vqp_dev_ah_t super;
    struct ibv_ah *ah;
} vqp_dev_hw_ah_t;

#define vqp_dev_hw(_dev) ucs_container_of(_dev, vqp_dev_hw_t, super)

/* errno of a failed verbs call as a UCS status. */
static ucs_status_t vqp_dev_hw_errno_status(int err)
{
    switch (err) {
    case ENOMEM:
        return UCS_ERR_NO_MEMORY;
    case EINVAL:
        return UCS_ERR_INVALID_PARAM;
    case EOPNOTSUPP:
    case ENOSYS:
        return UCS_ERR_UNSUPPORTED;
    case EBUSY:
        return UCS_ERR_BUSY;
    case EFAULT: /* ibv_reg_mr: pages not mapped or not writable */
        return UCS_ERR_INVALID_ADDR;
    case ENODEV:
        return UCS_ERR_NO_DEVICE;
    default:
        return UCS_ERR_IO_ERROR;
    }
}

/* ibv_get_device_list, where "no RDMA in this kernel" means an empty list. */
static struct ibv_device **vqp_dev_hw_get_devices(int *num_p)
{
    struct ibv_device **devices;

    devices = ibv_get_device_list(num_p);
    if (devices == NULL) {
        ucs_debug("no RDMA devices: ibv_get_device_list() failed: %m");
        *num_p = 0;
    }
    return devices;
}

/* ------------------------------------------------------------ enumeration */

static const char *vqp_dev_hw_link_str(vqp_dev_link_t link)
{
    return (link == VQP_DEV_LINK_ETHERNET) ? "Ethernet" : "InfiniBand";
}

static vqp_dev_link_t vqp_dev_hw_link(const struct ibv_port_attr *port_attr)
{
    /* Old kernels leave the link layer unspecified for IB ports. */
    return (port_attr->link_layer == IBV_LINK_LAYER_ETHERNET)
               ? VQP_DEV_LINK_ETHERNET
               : VQP_DEV_LINK_IB;
}

ucs_status_t vqp_dev_hw_list(unsigned flags, vqp_dev_info_t **list_p,
                             unsigned *count_p)
{
    struct ibv_device_attr dev_attr;
    struct ibv_port_attr port_attr;
    struct ibv_device **devices;
    struct ibv_context *ctx;
    vqp_dev_info_t *grown;
    int num_devices, i;
    unsigned port;
    int active;

    devices = vqp_dev_hw_get_devices(&num_devices);
    for (i = 0; i < num_devices; ++i) {
        if (!mlx5dv_is_supported(devices[i])) {
            ucs_debug("%s: not an mlx5 device, skipped",
                      ibv_get_device_name(devices[i]));
            continue;
        }
        ctx = ibv_open_device(devices[i]);
        if (ctx == NULL) {
            ucs_debug("%s: cannot open: %m", ibv_get_device_name(devices[i]));
            continue;
        }
        if (ibv_query_device(ctx, &dev_attr) != 0) {
            ucs_debug("%s: ibv_query_device failed: %m",
                      ibv_get_device_name(devices[i]));
            ibv_close_device(ctx);
            continue;
        }
        for (port = 1; port <= dev_attr.phys_port_cnt; ++port) {
            if (ibv_query_port(ctx, port, &port_attr) != 0) {
                continue;
            }
            active = (port_attr.state == IBV_PORT_ACTIVE);
            if (!active && !(flags & VQP_DEV_LIST_INACTIVE)) {
                ucs_debug("%s:%u: port not active, skipped",
                          ibv_get_device_name(devices[i]), port);
                continue;
            }
            grown = realloc(*list_p, (*count_p + 1) * sizeof(**list_p));
            if (grown == NULL) {
                ibv_close_device(ctx);
                ibv_free_device_list(devices);
                ucs_error("vqp_dev_list: out of memory");
                return UCS_ERR_NO_MEMORY;
            }
            *list_p = grown;
            memset(&grown[*count_p], 0, sizeof(grown[*count_p]));
            snprintf(grown[*count_p].name, VQP_DEV_NAME_MAX, "%s:%u",
                     ibv_get_device_name(devices[i]), port);
            grown[*count_p].link   = vqp_dev_hw_link(&port_attr);
            grown[*count_p].active = active;
            ++*count_p;
        }
        ibv_close_device(ctx);
    }
    if (devices != NULL) {
        ibv_free_device_list(devices);
    }
    return UCS_OK;
}

/* ------------------------------------------------------------ device */

/* Splits "mlx5_0:1" into device name and port; port 0 means "first active".
 */
static ucs_status_t vqp_dev_hw_parse_name(const char *name, char *ibdev,
                                          unsigned *port_p)
{
    const char *colon = strrchr(name, ':');
    char *end;
    unsigned long port;

    if (colon == NULL) {
        strcpy(ibdev, name); /* length checked by the caller */
        *port_p = 0;
        return UCS_OK;
    }
    port = strtoul(colon + 1, &end, 10);
    if ((colon == name) || (colon[1] == '\0') || (*end != '\0') ||
        (port == 0) || (port > 255)) {
        ucs_error("device name '%s' is not <device>:<port 1..255>", name);
        return UCS_ERR_INVALID_PARAM;
    }
    memcpy(ibdev, name, colon - name);
    ibdev[colon - name] = '\0';
    *port_p             = port;
    return UCS_OK;
}

/* Data rate of one lane in bits/s and the encoding efficiency, from the
 * ibv_port_attr.active_speed code. */
static double vqp_dev_hw_lane_rate(uint8_t speed)
{
    switch (speed) {
    case 1: /* SDR, 8b/10b */
        return 2.5e9 * 0.8;
    case 2: /* DDR */
        return 5.0e9 * 0.8;
    case 4: /* QDR */
        return 10.0e9 * 0.8;
    case 8: /* FDR10, 64b/66b */
        return 10.3125e9 * 64 / 66;
    case 16: /* FDR */
        return 14.0625e9 * 64 / 66;
    case 32: /* EDR */
        return 25.78125e9 * 64 / 66;
    case 64: /* HDR lane */
        return 53.125e9 * 64 / 66;
    case 128: /* NDR lane */
        return 106.25e9 * 64 / 66;
    default:
        return 0;
    }
}

static unsigned vqp_dev_hw_lanes(uint8_t width)
{
    switch (width) {
    case 1:
        return 1;
    case 2:
        return 4;
    case 4:
        return 8;
    case 8:
        return 12;
    case 16:
        return 2;
    default:
        return 0;
    }
}

/* Picks the source GID of a RoCE port: the configured index, or the first
 * RoCE v2 GID, IPv4-mapped ones first (they route on most fabrics). */
static ucs_status_t vqp_dev_hw_select_gid(vqp_dev_hw_t *hw, int gid_tbl_len,
                                          int wanted, union ibv_gid *gid_p)
{
    static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0,    0,
                                          0, 0, 0, 0, 0xff, 0xff};
    struct ibv_gid_entry entry;
    int best = -1, best_v4 = 0, i, v4;

    if (wanted >= 0) {
        if ((wanted >= gid_tbl_len) ||
            ibv_query_gid_ex(hw->ctx, hw->port, wanted, &entry, 0)) {
            ucs_error("%s: GID index %d is not valid (table of %d)",
                      hw->super.attr.name, wanted, gid_tbl_len);
            return UCS_ERR_INVALID_PARAM;
        }
        hw->gid_index = wanted;
        *gid_p        = entry.gid;
        return UCS_OK;
    }

    for (i = 0; i < gid_tbl_len; ++i) {
        /* Empty entries fail with ENODATA: skip them. */
        if (ibv_query_gid_ex(hw->ctx, hw->port, i, &entry, 0) ||
            (entry.gid_type != IBV_GID_TYPE_ROCE_V2)) {
            continue;
        }
        v4 = !memcmp(entry.gid.raw, v4_prefix, sizeof(v4_prefix));
        if ((best < 0) || (v4 && !best_v4)) {
            best    = i;
            best_v4 = v4;
            *gid_p  = entry.gid;
        }
    }
    if (best < 0) {
        ucs_error("%s: no RoCE v2 GID on the port (is an IP address "
                  "configured on its netdev?); set a GID index explicitly",
                  hw->super.attr.name);
        return UCS_ERR_NO_DEVICE;
    }
    hw->gid_index = best;
    ucs_debug("%s: using RoCE v2 GID index %d (%s)", hw->super.attr.name, best,
              best_v4 ? "IPv4" : "IPv6");
    return UCS_OK;
}

/* Largest inline size a QP accepts: verbs reports no limit, so create a
 * throw-away QP with decreasing requests. */
static uint32_t vqp_dev_hw_probe_inline(vqp_dev_hw_t *hw)
{
    struct ibv_qp_init_attr init;
    struct ibv_qp *qp;
    struct ibv_cq *cq;
    uint32_t size, granted = 0;

    cq = ibv_create_cq(hw->ctx, 1, NULL, NULL, 0);
    if (cq == NULL) {
        return 0;
    }
    for (size = 1024; (size >= 16) && (granted == 0); size /= 2) {
        memset(&init, 0, sizeof(init));
        init.send_cq             = cq;
        init.recv_cq             = cq;
        init.qp_type             = IBV_QPT_RC;
        init.cap.max_send_wr     = 1;
        init.cap.max_send_sge    = 1;
        init.cap.max_recv_wr     = 1;
        init.cap.max_recv_sge    = 1;
        init.cap.max_inline_data = size;
        qp                       = ibv_create_qp(hw->pd, &init);
        if (qp != NULL) {
            granted = init.cap.max_inline_data;
            ibv_destroy_qp(qp);
        }
    }
    ibv_destroy_cq(cq);
    return granted;
}

static ucs_status_t vqp_dev_hw_init_port(vqp_dev_hw_t *hw,
                                         const struct ibv_device_attr *dev_attr,
                                         const vqp_dev_open_params_t *params)
{
    vqp_dev_attr_t *attr = &hw->super.attr;
    vqp_dev_addr_t *addr = &hw->super.addr;
    struct ibv_port_attr port_attr;
    union ibv_gid gid;
    ucs_status_t status;

    if (ibv_query_port(hw->ctx, hw->port, &port_attr) != 0) {
        ucs_error("%s: ibv_query_port failed: %m", attr->name);
        return UCS_ERR_NO_DEVICE;
    }
    if (port_attr.state != IBV_PORT_ACTIVE) {
        ucs_error("%s: port is not active (state %d)", attr->name,
                  port_attr.state);
        return UCS_ERR_NO_DEVICE;
    }

    attr->link        = vqp_dev_hw_link(&port_attr);
    attr->max_qp_wr   = dev_attr->max_qp_wr;
    attr->max_sge     = dev_attr->max_sge;
    attr->max_cqe     = dev_attr->max_cqe;
    attr->max_srq_wr  = dev_attr->max_srq_wr;
    attr->max_rd_atom = dev_attr->max_qp_rd_atom;

    /* 0 when the HCA does not say: no limit known. */
    attr->max_mr = (dev_attr->max_mr > 0) ? (uint32_t)dev_attr->max_mr : 0;
    /* Extended atomics and the byte order of fetched values: from the HCA
     * capabilities (DevX), dev_hw_caps.c. Without them: Linux reports
     * verbs atomics only after switching 8-byte replies to host order. */
    attr->atomic_be_sizes =
        sizeof(uint32_t) |
        ((dev_attr->atomic_cap == IBV_ATOMIC_HCA) ? 0 : sizeof(uint64_t));
    attr->ext_atomic_sizes = vqp_dev_hw_ext_atomic_sizes(
        hw->ctx, attr->name, &attr->atomic_be_sizes);
    attr->max_msg_sz = port_attr.max_msg_sz;
    attr->path_mtu   = vqp_dev_mtu_bytes(port_attr.active_mtu);
    /* A UD message is one packet: the active MTU bounds its payload. */
    attr->max_ud_msg = attr->path_mtu;
    attr->bandwidth  = vqp_dev_hw_lane_rate(port_attr.active_speed) *
                      vqp_dev_hw_lanes(port_attr.active_width) / 8;
    attr->max_inline = vqp_dev_hw_probe_inline(hw);
    hw->gid_index    = -1;

    memset(addr, 0, sizeof(*addr));
    if (attr->link == VQP_DEV_LINK_ETHERNET) {
        status = vqp_dev_hw_select_gid(hw, port_attr.gid_tbl_len,
                                       params->gid_index, &gid);
        if (status != UCS_OK) {
            return status;
        }
        addr->type     = VQP_DEV_ADDR_ROCE;
        addr->roce.gid = gid;
    } else {
        if (port_attr.lid == 0) {
            ucs_error("%s: IB port has no LID (no subnet manager?)",
                      attr->name);
            return UCS_ERR_NO_DEVICE;
        }
        addr->type   = VQP_DEV_ADDR_IB;
        addr->ib.lid = port_attr.lid;
        /* Only a routed subnet (non-default prefix) needs GIDs on the wire. */
        if ((ibv_query_gid(hw->ctx, hw->port, 0, &gid) == 0) &&
            (be64toh(gid.global.subnet_prefix) != 0xfe80000000000000ull)) {
            addr->ib.has_gid = 1;
            addr->ib.gid     = gid;
            hw->gid_index    = 0;
        }
    }
    attr->gid_index = hw->gid_index;
    ucs_debug("%s: %s link, MTU %u, %.1f Gb/s, max_inline %u", attr->name,
              vqp_dev_hw_link_str(attr->link), attr->path_mtu,
              attr->bandwidth * 8 / 1e9, attr->max_inline);
    return UCS_OK;
}

/* First active port of an open device, 0 if none. */
static unsigned vqp_dev_hw_first_active(struct ibv_context *ctx,
                                        unsigned num_ports)
{
    struct ibv_port_attr port_attr;
    unsigned port;

    for (port = 1; port <= num_ports; ++port) {
        if ((ibv_query_port(ctx, port, &port_attr) == 0) &&
            (port_attr.state == IBV_PORT_ACTIVE)) {
            return port;
        }
    }
    return 0;
}

static const vqp_dev_ops_t vqp_dev_hw_ops;

ucs_status_t vqp_dev_hw_open(const char *name,
                             const vqp_dev_open_params_t *params,
                             vqp_dev_t **dev_p)
{
    char ibdev[VQP_DEV_NAME_MAX];
    struct ibv_device_attr dev_attr;
    struct ibv_device **devices;
    struct ibv_device *device = NULL;
    vqp_dev_hw_t *hw;
    ucs_status_t status;
    unsigned port;
    int num_devices, i;

    status = vqp_dev_hw_parse_name(name, ibdev, &port);
    if (status != UCS_OK) {
        return status;
    }

    devices = vqp_dev_hw_get_devices(&num_devices);
    for (i = 0; i < num_devices; ++i) {
        if (!strcmp(ibv_get_device_name(devices[i]), ibdev)) {
            device = devices[i];
        }
    }
    if (device == NULL) {
        ucs_error("device '%s' not found (%d RDMA devices present)", name,
                  num_devices);
        status = UCS_ERR_NO_DEVICE;
        goto out_free_list;
    }
    if (!mlx5dv_is_supported(device)) {
        ucs_error("device '%s' is not an mlx5 device", name);
        status = UCS_ERR_NO_DEVICE;
        goto out_free_list;
    }

    hw = calloc(1, sizeof(*hw));
    if (hw == NULL) {
        ucs_error("%s: out of memory", name);
        status = UCS_ERR_NO_MEMORY;
        goto out_free_list;
    }
    hw->super.ops = &vqp_dev_hw_ops;
    hw->ctx       = ibv_open_device(device);
    if (hw->ctx == NULL) {
        ucs_error("%s: ibv_open_device failed: %m", name);
        status = UCS_ERR_NO_DEVICE;
        goto out_free;
    }
    if (ibv_query_device(hw->ctx, &dev_attr) != 0) {
        ucs_error("%s: ibv_query_device failed: %m", name);
        status = UCS_ERR_IO_ERROR;
        goto out_close;
    }
    if (port == 0) {
        port = vqp_dev_hw_first_active(hw->ctx, dev_attr.phys_port_cnt);
        if (port == 0) {
            ucs_error("%s: no active port", name);
            status = UCS_ERR_NO_DEVICE;
            goto out_close;
        }
    } else if (port > dev_attr.phys_port_cnt) {
        ucs_error("%s: no such port (the device has %u)", name,
                  dev_attr.phys_port_cnt);
        status = UCS_ERR_NO_DEVICE;
        goto out_close;
    }
    hw->port = port;
    /* ibdev came from a name that fit VQP_DEV_NAME_MAX: cannot truncate;
     * checked anyway so the compiler sees it at every optimisation level. */
    if (snprintf(hw->super.attr.name, VQP_DEV_NAME_MAX, "%.*s:%u",
                 VQP_DEV_NAME_MAX - 12, ibdev, port) >= VQP_DEV_NAME_MAX) {
        ucs_error("%s: device name too long", name);
        status = UCS_ERR_INVALID_PARAM;
        goto out_close;
    }

    hw->pd = ibv_alloc_pd(hw->ctx);
    if (hw->pd == NULL) {
        ucs_error("%s: ibv_alloc_pd failed: %m", name);
        status = UCS_ERR_NO_MEMORY;
        goto out_close;
    }
    status = vqp_dev_hw_init_port(hw, &dev_attr, params);
    if (status != UCS_OK) {
        goto out_dealloc_pd;
    }
    /* Created with the device, as CQs attach to it only at creation; a
     * device without one still works, without events. */
    hw->super.attr.comp_events =
        vqp_dev_hw_channel_create(hw->ctx, name, UCS_LOG_LEVEL_DIAG,
                                  &hw->channel) == UCS_OK;
    /* QPs of different CQs never copy into one BlueFlame register: each CQ
     * has a thread domain, or its QPs ring 8-byte doorbells. */
    hw->super.attr.qp_db_private = 1;

    ibv_free_device_list(devices);
    *dev_p = &hw->super;
    return UCS_OK;

out_dealloc_pd:
    ibv_dealloc_pd(hw->pd);
out_close:
    ibv_close_device(hw->ctx);
out_free:
    free(hw);
out_free_list:
    if (devices != NULL) {
        ibv_free_device_list(devices);
    }
    return status;
}

static void vqp_dev_hw_close(vqp_dev_t *dev)
{
    vqp_dev_hw_t *hw = vqp_dev_hw(dev);

    vqp_dev_hw_channel_destroy(hw->channel, dev->attr.name);
    if (ibv_dealloc_pd(hw->pd) != 0) {
        ucs_warn("%s: ibv_dealloc_pd failed: %m", dev->attr.name);
    }
    if (ibv_close_device(hw->ctx) != 0) {
        ucs_warn("%s: ibv_close_device failed: %m", dev->attr.name);
    }
    free(hw);
}

static unsigned vqp_dev_hw_progress(vqp_dev_t *dev)
{
    return 0; /* the HCA runs on its own */
}

/* ------------------------------------------------------------ queues */

static ucs_status_t vqp_dev_hw_mr_reg(vqp_dev_t *dev, void *addr, size_t length,
                                      unsigned access, ucs_log_level_t level,
                                      vqp_dev_mr_t **mr_p, uint32_t *lkey_p,
                                      uint32_t *rkey_p)
{
    vqp_dev_hw_mr_t *mr;
    int err;

    mr = calloc(1, sizeof(*mr));
    if (mr == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    mr->mr = ibv_reg_mr(vqp_dev_hw(dev)->pd, addr, length, access);
    if (mr->mr == NULL) {
        err = errno;
        ucs_log(level, "%s: ibv_reg_mr(%p, %zu, access 0x%x) failed: %s",
                dev->attr.name, addr, length, access, strerror(err));
        free(mr);
        return vqp_dev_hw_errno_status(err);
    }
    *lkey_p = mr->mr->lkey;
    *rkey_p = mr->mr->rkey;
    *mr_p   = &mr->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_mr_dereg(vqp_dev_mr_t *super)
{
    vqp_dev_hw_mr_t *mr = ucs_container_of(super, vqp_dev_hw_mr_t, super);
    int err;

    err = ibv_dereg_mr(mr->mr);
    if (err != 0) {
        ucs_error("%s: ibv_dereg_mr failed: %s", super->dev->attr.name,
                  strerror(err));
        return vqp_dev_hw_errno_status(err);
    }
    free(mr);
    return UCS_OK;
}

/* The thread domain of @a cq's QPs. Without one (a provider or kernel that
 * has none, or no dedicated register left) its QPs go on the plain PD, where
 * rdma-core may share a register between QPs of several CQs: they ring with
 * 8-byte doorbells then (vqp_dev_hw_qp_bf), single stores that cannot tear,
 * instead of BlueFlame copies that could interleave with another thread's. */
static void vqp_dev_hw_cq_domain(vqp_dev_hw_t *hw, vqp_dev_hw_cq_t *cq)
{
    struct ibv_td_init_attr td_attr            = {};
    struct ibv_parent_domain_init_attr pd_attr = {};
    const char *step;
    int err;

    cq->td = ibv_alloc_td(hw->ctx, &td_attr);
    if (cq->td == NULL) {
        err  = errno;
        step = "ibv_alloc_td";
        goto none;
    }
    pd_attr.pd = hw->pd;
    pd_attr.td = cq->td;
    cq->pd     = ibv_alloc_parent_domain(hw->ctx, &pd_attr);
    if (cq->pd != NULL) {
        return;
    }
    err  = errno;
    step = "ibv_alloc_parent_domain";
    ibv_dealloc_td(cq->td);
    cq->td = NULL;
none:
    ucs_diag("%s: %s failed: %s; the QPs of CQ 0x%x ring 8-byte doorbells, "
             "no BlueFlame",
             hw->super.attr.name, step, strerror(err), cq->super.cqn);
}

/* The PD a QP whose sends complete on @a send_cq is created on. */
static struct ibv_pd *vqp_dev_hw_qp_pd(vqp_dev_t *dev, vqp_dev_cq_t *send_cq)
{
    vqp_dev_hw_cq_t *cq = ucs_container_of(send_cq, vqp_dev_hw_cq_t, super);

    return (cq->pd != NULL) ? cq->pd : vqp_dev_hw(dev)->pd;
}

/* A QP outside a thread domain may share its register with QPs that other
 * threads post on: no BlueFlame buffer for the data path, which then rings
 * with one 8-byte store. */
static void vqp_dev_hw_qp_bf(vqp_dev_cq_t *send_cq, struct mlx5dv_qp *dv)
{
    if (ucs_container_of(send_cq, vqp_dev_hw_cq_t, super)->td == NULL) {
        dv->bf.size = 0;
    }
}

static ucs_status_t vqp_dev_hw_cq_create(vqp_dev_t *dev, uint32_t cqe,
                                         vqp_dev_cq_t **cq_p,
                                         struct mlx5dv_cq *dv)
{
    struct ibv_cq_init_attr_ex cq_attr   = {};
    struct mlx5dv_cq_init_attr mlx5_attr = {};
    struct mlx5dv_obj obj                = {};
    struct ibv_cq_ex *cq_ex;
    vqp_dev_hw_cq_t *cq;
    int err;

    cq = calloc(1, sizeof(*cq));
    if (cq == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    /* 64-byte CQEs, uncompressed: the format the data path parses. Events
     * name the CQ by its vqp_dev_cq_t (the arm sequence number). */
    cq_attr.cqe         = cqe;
    cq_attr.channel     = vqp_dev_hw(dev)->channel;
    cq_attr.cq_context  = &cq->super;
    mlx5_attr.comp_mask = MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE;
    mlx5_attr.cqe_size  = 64;
    cq_ex = mlx5dv_create_cq(vqp_dev_hw(dev)->ctx, &cq_attr, &mlx5_attr);
    if (cq_ex == NULL) {
        err = errno;
        ucs_error("%s: mlx5dv_create_cq(%u) failed: %s", dev->attr.name, cqe,
                  strerror(err));
        free(cq);
        return vqp_dev_hw_errno_status(err);
    }
    cq->cq     = ibv_cq_ex_to_cq(cq_ex);
    obj.cq.in  = cq->cq;
    obj.cq.out = dv;
    err        = mlx5dv_init_obj(&obj, MLX5DV_OBJ_CQ);
    if (err != 0) {
        ucs_error("%s: mlx5dv_init_obj(CQ) failed: %s", dev->attr.name,
                  strerror(err));
        ibv_destroy_cq(cq->cq);
        free(cq);
        return vqp_dev_hw_errno_status(err);
    }
    cq->super.cqn = dv->cqn;
    vqp_dev_hw_cq_domain(vqp_dev_hw(dev), cq);
    *cq_p = &cq->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_cq_destroy(vqp_dev_cq_t *super)
{
    vqp_dev_hw_cq_t *cq = ucs_container_of(super, vqp_dev_hw_cq_t, super);
    int err;

    err = ibv_destroy_cq(cq->cq);
    if (err != 0) {
        ucs_error("%s: ibv_destroy_cq(0x%x) failed: %s", super->dev->attr.name,
                  super->cqn, strerror(err));
        return vqp_dev_hw_errno_status(err);
    }
    /* Its QPs are gone (a CQ with QPs is not destroyed): so are the users
     * of its domain. */
    if (cq->pd != NULL) {
        err = ibv_dealloc_pd(cq->pd);
        if (err != 0) {
            ucs_warn("%s: ibv_dealloc_pd(parent domain of CQ 0x%x) failed: %s",
                     super->dev->attr.name, super->cqn, strerror(err));
        }
        err = ibv_dealloc_td(cq->td);
        if (err != 0) {
            ucs_warn("%s: ibv_dealloc_td(CQ 0x%x) failed: %s",
                     super->dev->attr.name, super->cqn, strerror(err));
        }
    }
    free(cq);
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_srq_create(vqp_dev_t *dev, uint32_t max_wr,
                                          uint32_t max_sge,
                                          vqp_dev_srq_t **srq_p,
                                          struct mlx5dv_srq *dv)
{
    struct ibv_srq_init_attr srq_attr = {};
    struct mlx5dv_obj obj             = {};
    vqp_dev_hw_srq_t *srq;
    int err;

    srq = calloc(1, sizeof(*srq));
    if (srq == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    srq_attr.attr.max_wr  = max_wr;
    srq_attr.attr.max_sge = max_sge;
    srq->srq              = ibv_create_srq(vqp_dev_hw(dev)->pd, &srq_attr);
    if (srq->srq == NULL) {
        err = errno;
        ucs_error("%s: ibv_create_srq(%u x %u) failed: %s", dev->attr.name,
                  max_wr, max_sge, strerror(err));
        free(srq);
        return vqp_dev_hw_errno_status(err);
    }
    dv->comp_mask = MLX5DV_SRQ_MASK_SRQN; /* ask for the SRQ number too */
    obj.srq.in    = srq->srq;
    obj.srq.out   = dv;
    err           = mlx5dv_init_obj(&obj, MLX5DV_OBJ_SRQ);
    if (err != 0) {
        ucs_error("%s: mlx5dv_init_obj(SRQ) failed: %s", dev->attr.name,
                  strerror(err));
        ibv_destroy_srq(srq->srq);
        free(srq);
        return vqp_dev_hw_errno_status(err);
    }
    *srq_p = &srq->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_srq_destroy(vqp_dev_srq_t *super)
{
    vqp_dev_hw_srq_t *srq = ucs_container_of(super, vqp_dev_hw_srq_t, super);
    int err;

    err = ibv_destroy_srq(srq->srq);
    if (err != 0) {
        ucs_error("%s: ibv_destroy_srq(0x%x) failed: %s", super->dev->attr.name,
                  super->srqn, strerror(err));
        return vqp_dev_hw_errno_status(err);
    }
    free(srq);
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_qp_create(vqp_dev_t *dev,
                                         const vqp_dev_qp_init_t *init,
                                         vqp_dev_qp_t **qp_p,
                                         struct mlx5dv_qp *dv,
                                         vqp_dev_qp_caps_t *caps)
{
    struct ibv_qp_init_attr qp_attr = {};
    struct mlx5dv_obj obj           = {};
    vqp_dev_hw_qp_t *qp;
    int err;

    qp = calloc(1, sizeof(*qp));
    if (qp == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    qp_attr.send_cq =
        ucs_container_of(init->send_cq, vqp_dev_hw_cq_t, super)->cq;
    qp_attr.recv_cq =
        ucs_container_of(init->recv_cq, vqp_dev_hw_cq_t, super)->cq;
    if (init->srq != NULL) {
        qp_attr.srq = ucs_container_of(init->srq, vqp_dev_hw_srq_t, super)->srq;
    }
    qp_attr.qp_type             = IBV_QPT_RC;
    qp_attr.sq_sig_all          = 0; /* the data path asks per WQE */
    qp_attr.cap.max_send_wr     = init->max_send_wr;
    qp_attr.cap.max_send_sge    = init->max_send_sge;
    qp_attr.cap.max_recv_wr     = init->max_recv_wr;
    qp_attr.cap.max_recv_sge    = init->max_recv_sge;
    qp_attr.cap.max_inline_data = init->max_inline;

    qp->qp = ibv_create_qp(vqp_dev_hw_qp_pd(dev, init->send_cq), &qp_attr);
    if (qp->qp == NULL) {
        err = errno;
        ucs_error("%s: ibv_create_qp(RC, sq %u, rq %u, inline %u) failed: %s",
                  dev->attr.name, init->max_send_wr, init->max_recv_wr,
                  init->max_inline, strerror(err));
        free(qp);
        return vqp_dev_hw_errno_status(err);
    }
    obj.qp.in  = qp->qp;
    obj.qp.out = dv;
    err        = mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP);
    if (err != 0) {
        ucs_error("%s: mlx5dv_init_obj(QP) failed: %s", dev->attr.name,
                  strerror(err));
        ibv_destroy_qp(qp->qp);
        free(qp);
        return vqp_dev_hw_errno_status(err);
    }
    vqp_dev_hw_qp_bf(init->send_cq, dv);
    caps->qpn         = qp->qp->qp_num;
    caps->max_inline  = qp_attr.cap.max_inline_data;
    caps->max_send_wr = qp_attr.cap.max_send_wr;
    caps->max_recv_wr = qp_attr.cap.max_recv_wr;
    *qp_p             = &qp->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_qp_destroy(vqp_dev_qp_t *super)
{
    vqp_dev_hw_qp_t *qp = ucs_container_of(super, vqp_dev_hw_qp_t, super);
    int err;

    err = ibv_destroy_qp(qp->qp);
    if (err != 0) {
        ucs_error("%s: ibv_destroy_qp(0x%x) failed: %s", super->dev->attr.name,
                  super->qpn, strerror(err));
        return vqp_dev_hw_errno_status(err);
    }
    free(qp);
    return UCS_OK;
}

/* ------------------------------------------------------------ connection */

/* Address vector towards @a remote: LID on IB (plus a GRH across subnets),
 * GRH with the peer's GID on RoCE. */
static void vqp_dev_hw_fill_ah(const vqp_dev_hw_t *hw,
                               const vqp_dev_addr_t *remote,
                               const vqp_dev_connect_params_t *params,
                               struct ibv_ah_attr *ah)
{
    const vqp_dev_addr_t *local = &hw->super.addr;

    ah->port_num = hw->port;
    ah->sl       = params->sl;
    if (remote->type == VQP_DEV_ADDR_ROCE) {
        ah->is_global = 1;
        ah->grh.dgid  = remote->roce.gid;
    } else {
        ah->dlid = remote->ib.lid;
        /* Same subnet: LID routing only. Reachability was checked. */
        if (remote->ib.has_gid &&
            (!local->ib.has_gid ||
             memcmp(&local->ib.gid.global.subnet_prefix,
                    &remote->ib.gid.global.subnet_prefix, sizeof(uint64_t)))) {
            ah->is_global = 1;
            ah->grh.dgid  = remote->ib.gid;
        }
    }
    if (ah->is_global) {
        ah->grh.sgid_index    = (hw->gid_index < 0) ? 0 : hw->gid_index;
        ah->grh.hop_limit     = params->hop_limit;
        ah->grh.traffic_class = params->traffic_class;
    }
}

/* On RoCE, a distinct UDP source port per QP spreads the QPs of a virtual QP
 * over ECMP paths. NICs or kernels without it keep their default port. */
static ucs_status_t
vqp_dev_hw_set_udp_sport(vqp_dev_hw_qp_t *qp,
                         const vqp_dev_connect_params_t *params)
{
    vqp_dev_t *dev = qp->super.dev;
    uint16_t sport;
    int err;

    if ((dev->attr.link != VQP_DEV_LINK_ETHERNET) ||
        (params->udp_sport_index < 0)) {
        return UCS_OK;
    }
    sport = vqp_dev_udp_sport(params->udp_sport_base, params->udp_sport_index);
    err   = mlx5dv_modify_qp_udp_sport(qp->qp, sport);
    if ((err == EOPNOTSUPP) || (err == ENOTSUP)) {
        ucs_debug("%s: QP 0x%x: UDP source port not settable on this NIC",
                  dev->attr.name, qp->super.qpn);
        return UCS_OK;
    } else if (err != 0) {
        ucs_error("%s: QP 0x%x: mlx5dv_modify_qp_udp_sport(%u) failed: %s",
                  dev->attr.name, qp->super.qpn, sport, strerror(err));
        return vqp_dev_hw_errno_status(err);
    }
    qp->super.udp_sport = sport;
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_qp_modify(vqp_dev_qp_t *super,
                                         enum ibv_qp_state state,
                                         const vqp_dev_qp_addr_t *remote,
                                         const vqp_dev_connect_params_t *params)
{
    vqp_dev_hw_qp_t *qp     = ucs_container_of(super, vqp_dev_hw_qp_t, super);
    vqp_dev_hw_t *hw        = vqp_dev_hw(super->dev);
    struct ibv_qp_attr attr = {};
    int mask                = IBV_QP_STATE;
    int err;

    attr.qp_state = state;
    switch (state) {
    case IBV_QPS_INIT:
        attr.pkey_index      = 0;
        attr.port_num        = hw->port;
        attr.qp_access_flags = params->access;
        mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        break;
    case IBV_QPS_RTR:
        attr.path_mtu = vqp_dev_mtu_enum(
            params->path_mtu ? params->path_mtu : hw->super.attr.path_mtu);
        attr.dest_qp_num        = remote->qpn;
        attr.rq_psn             = 0;
        attr.max_dest_rd_atomic = hw->super.attr.max_rd_atom;
        attr.min_rnr_timer      = params->min_rnr_timer;
        vqp_dev_hw_fill_ah(hw, &remote->dev, params, &attr.ah_attr);
        mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        break;
    case IBV_QPS_RTS:
        attr.timeout       = params->timeout;
        attr.retry_cnt     = params->retry_cnt;
        attr.rnr_retry     = params->rnr_retry;
        attr.sq_psn        = 0;
        attr.max_rd_atomic = params->max_rd_atomic ? params->max_rd_atomic
                                                   : hw->super.attr.max_rd_atom;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
        break;
    default: /* RESET, ERR: the state alone */
        break;
    }

    err = ibv_modify_qp(qp->qp, &attr, mask);
    if (err != 0) {
        ucs_error("%s: QP 0x%x: ibv_modify_qp(%s -> %s) failed: %s",
                  hw->super.attr.name, super->qpn,
                  vqp_dev_qp_state_str(super->state),
                  vqp_dev_qp_state_str(state), strerror(err));
        return vqp_dev_hw_errno_status(err);
    }
    /* The source port can only be changed once the QP is in RTS. */
    if (state == IBV_QPS_RTS) {
        return vqp_dev_hw_set_udp_sport(qp, params);
    }
    return UCS_OK;
}

/* ------------------------------------------------------------ datagrams */

static ucs_status_t vqp_dev_hw_ud_qp_create(vqp_dev_t *dev,
                                            const vqp_dev_ud_qp_init_t *init,
                                            vqp_dev_qp_t **qp_p,
                                            struct mlx5dv_qp *dv,
                                            vqp_dev_qp_caps_t *caps)
{
    vqp_dev_hw_t *hw                = vqp_dev_hw(dev);
    struct ibv_qp_init_attr qp_attr = {};
    struct mlx5dv_obj obj           = {};
    struct ibv_qp_attr attr;
    vqp_dev_hw_qp_t *qp;
    const char *step;
    int err, mask;

    qp = calloc(1, sizeof(*qp));
    if (qp == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    qp_attr.send_cq =
        ucs_container_of(init->send_cq, vqp_dev_hw_cq_t, super)->cq;
    qp_attr.recv_cq =
        ucs_container_of(init->recv_cq, vqp_dev_hw_cq_t, super)->cq;
    qp_attr.qp_type             = IBV_QPT_UD;
    qp_attr.sq_sig_all          = 0;
    qp_attr.cap.max_send_wr     = init->max_send_wr;
    qp_attr.cap.max_send_sge    = init->max_send_sge;
    qp_attr.cap.max_recv_wr     = init->max_recv_wr;
    qp_attr.cap.max_recv_sge    = init->max_recv_sge;
    qp_attr.cap.max_inline_data = init->max_inline;

    qp->qp = ibv_create_qp(vqp_dev_hw_qp_pd(dev, init->send_cq), &qp_attr);
    if (qp->qp == NULL) {
        err = errno;
        ucs_error("%s: ibv_create_qp(UD, sq %u, rq %u, inline %u) failed: %s",
                  dev->attr.name, init->max_send_wr, init->max_recv_wr,
                  init->max_inline, strerror(err));
        free(qp);
        return vqp_dev_hw_errno_status(err);
    }
    obj.qp.in  = qp->qp;
    obj.qp.out = dv;
    err        = mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP);
    if (err != 0) {
        step = "mlx5dv_init_obj(QP)";
        goto err_destroy;
    }
    vqp_dev_hw_qp_bf(init->send_cq, dv);

    /* INIT (P_Key index 0, our port, the qkey), RTR, RTS (SQ PSN 0). */
    memset(&attr, 0, sizeof(attr));
    attr.qp_state   = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num   = hw->port;
    attr.qkey       = init->qkey;
    mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    err  = ibv_modify_qp(qp->qp, &attr, mask);
    if (err != 0) {
        step = "ibv_modify_qp(UD RESET -> INIT)";
        goto err_destroy;
    }
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTR;
    err           = ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE);
    if (err != 0) {
        step = "ibv_modify_qp(UD INIT -> RTR)";
        goto err_destroy;
    }
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn   = 0;
    err           = ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN);
    if (err != 0) {
        step = "ibv_modify_qp(UD RTR -> RTS)";
        goto err_destroy;
    }
    caps->qpn         = qp->qp->qp_num;
    caps->max_inline  = qp_attr.cap.max_inline_data;
    caps->max_send_wr = qp_attr.cap.max_send_wr;
    caps->max_recv_wr = qp_attr.cap.max_recv_wr;
    *qp_p             = &qp->super;
    return UCS_OK;

err_destroy:
    ucs_error("%s: UD QP 0x%x: %s failed: %s", dev->attr.name, qp->qp->qp_num,
              step, strerror(err));
    ibv_destroy_qp(qp->qp);
    free(qp);
    return vqp_dev_hw_errno_status(err);
}

static ucs_status_t vqp_dev_hw_ah_create(vqp_dev_t *dev,
                                         const vqp_dev_addr_t *remote,
                                         vqp_dev_ah_t **ah_p,
                                         struct mlx5_wqe_av *av)
{
    vqp_dev_hw_t *hw           = vqp_dev_hw(dev);
    struct ibv_ah_attr ah_attr = {};
    struct mlx5dv_obj obj      = {};
    struct mlx5dv_ah dv_ah     = {};
    vqp_dev_connect_params_t params;
    vqp_dev_hw_ah_t *ah;
    int err;

    ah = calloc(1, sizeof(*ah));
    if (ah == NULL) {
        ucs_error("%s: out of memory", dev->attr.name);
        return UCS_ERR_NO_MEMORY;
    }
    /* RoCE: GRH with the GID index in use; IB: the LID, and a GRH whenever
     * the peer sent its GID (the receiver then sees who sent it). */
    vqp_dev_connect_params_default(&params);
    vqp_dev_hw_fill_ah(hw, remote, &params, &ah_attr);
    if ((remote->type == VQP_DEV_ADDR_IB) && remote->ib.has_gid &&
        !ah_attr.is_global) {
        ah_attr.is_global         = 1;
        ah_attr.grh.dgid          = remote->ib.gid;
        ah_attr.grh.sgid_index    = (hw->gid_index < 0) ? 0 : hw->gid_index;
        ah_attr.grh.hop_limit     = params.hop_limit;
        ah_attr.grh.traffic_class = params.traffic_class;
    }
    ah->ah = ibv_create_ah(hw->pd, &ah_attr);
    if (ah->ah == NULL) {
        err = errno;
        ucs_error("%s: ibv_create_ah(%s, dlid %u, grh %d) failed: %s",
                  dev->attr.name,
                  (remote->type == VQP_DEV_ADDR_ROCE) ? "RoCE" : "IB",
                  ah_attr.dlid, ah_attr.is_global, strerror(err));
        free(ah);
        return vqp_dev_hw_errno_status(err);
    }
    obj.ah.in  = ah->ah;
    obj.ah.out = &dv_ah;
    err        = mlx5dv_init_obj(&obj, MLX5DV_OBJ_AH);
    if ((err == 0) && (dv_ah.av == NULL)) {
        err = EINVAL;
    }
    if (err != 0) {
        ucs_error("%s: mlx5dv_init_obj(AH) failed: %s", dev->attr.name,
                  strerror(err));
        ibv_destroy_ah(ah->ah);
        free(ah);
        return vqp_dev_hw_errno_status(err);
    }
    /* The AV stays valid while the AH lives; WQEs take a copy. */
    memcpy(av, dv_ah.av, sizeof(*av));
    *ah_p = &ah->super;
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_ah_destroy(vqp_dev_ah_t *super)
{
    vqp_dev_hw_ah_t *ah = ucs_container_of(super, vqp_dev_hw_ah_t, super);
    int err;

    err = ibv_destroy_ah(ah->ah);
    if (err != 0) {
        ucs_error("%s: ibv_destroy_ah failed: %s", super->dev->attr.name,
                  strerror(err));
        return vqp_dev_hw_errno_status(err);
    }
    free(ah);
    return UCS_OK;
}

static ucs_status_t vqp_dev_hw_event_fd(vqp_dev_t *dev, int *fd_p)
{
    *fd_p = vqp_dev_hw(dev)->channel->fd;
    return UCS_OK;
}

/* Events consumed mean CQEs to poll: busy, as UCX's IB interfaces say. */
static ucs_status_t vqp_dev_hw_event_arm(vqp_dev_t *dev)
{
    unsigned count;
    ucs_status_t status;

    status = vqp_dev_hw_channel_drain(vqp_dev_hw(dev)->channel, dev->attr.name,
                                      &count);
    if (status != UCS_OK) {
        return status;
    }
    return (count > 0) ? UCS_ERR_BUSY : UCS_OK;
}

static const vqp_dev_ops_t vqp_dev_hw_ops = {
    .close        = vqp_dev_hw_close,
    .progress     = vqp_dev_hw_progress,
    .mr_reg       = vqp_dev_hw_mr_reg,
    .mr_dereg     = vqp_dev_hw_mr_dereg,
    .cq_create    = vqp_dev_hw_cq_create,
    .cq_destroy   = vqp_dev_hw_cq_destroy,
    .srq_create   = vqp_dev_hw_srq_create,
    .srq_destroy  = vqp_dev_hw_srq_destroy,
    .qp_create    = vqp_dev_hw_qp_create,
    .qp_destroy   = vqp_dev_hw_qp_destroy,
    .qp_modify    = vqp_dev_hw_qp_modify,
    .ud_qp_create = vqp_dev_hw_ud_qp_create,
    .ah_create    = vqp_dev_hw_ah_create,
    .ah_destroy   = vqp_dev_hw_ah_destroy,
    .event_fd     = vqp_dev_hw_event_fd,
    .event_arm    = vqp_dev_hw_event_arm,
};
