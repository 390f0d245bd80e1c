/*
 * The hardware implementation (dev_hw.c) against a scripted fake of
 * libibverbs and mlx5dv, linked in with ld --wrap: enumeration and port
 * filtering, name parsing, limits and bandwidth, RoCE GID selection, the
 * exact verbs attributes and masks of every QP transition (IB and RoCE), the
 * per-QP UDP source port, the extended atomic sizes read from crafted
 * QUERY_HCA_CAP outputs over a fake DevX, and every verbs and DevX failure
 * path with its UCS status or log line.
 * The real queue behaviour is covered by the smoke program on a ConnectX.
 */
#include <config.h>

#include <dev/vqp_dev.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <ucs/config/global_opts.h>

#include "test_dev_log.h"

/* ------------------------------------------------------------ fake world */

#define FAKE_MAX_DEVS  4
#define FAKE_MAX_PORTS 2
#define FAKE_MAX_GIDS  6
#define FAKE_MAX_MOD   8

typedef struct fake_gid {
    int valid;
    union ibv_gid gid;
    uint32_t type;
} fake_gid_t;

typedef struct fake_port {
    enum ibv_port_state state;
    uint8_t link_layer;
    uint16_t lid;
    enum ibv_mtu active_mtu;
    uint8_t speed, width;
    fake_gid_t gids[FAKE_MAX_GIDS];
} fake_port_t;

typedef struct fake_dev {
    const char *name;
    int mlx5;
    int fail_open;
    unsigned num_ports;
    fake_port_t ports[FAKE_MAX_PORTS];
} fake_dev_t;

typedef struct fake_modify {
    struct ibv_qp_attr attr;
    int mask;
} fake_modify_t;

static struct {
    int no_kernel; /* ibv_get_device_list: NULL, ENOSYS */
    unsigned num_devs;
    fake_dev_t devs[FAKE_MAX_DEVS];
    uint32_t max_inline; /* largest inline a QP accepts */
    int fail_query_device, fail_alloc_pd, fail_dealloc_pd;
    int fail_reg_mr, fail_create_cq, fail_create_srq;
    unsigned reg_mr_access; /* of the last ibv_reg_mr */
    int fail_create_qp, fail_init_obj, fail_destroy;
    int fail_create_ah, fail_init_obj_ah, fail_destroy_ah;
    enum ibv_qp_state fail_modify_to; /* 0: none (RESET is never failed) */
    int fail_modify_errno;
    int sport_ret;
    /* thread domains: offered by the context (its verbs ops), failures */
    int td_ops, fail_alloc_td, fail_parent_domain, fail_dealloc_td;
    /* what the code under test did */
    unsigned open_ctx, pds, mrs, cqs, srqs, qps, ahs, tds, parent_pds;
    struct ibv_pd *last_pd;     /* of the last ibv_alloc_pd */
    struct ibv_pd *last_parent; /* of the last parent domain */
    struct ibv_td *last_td;     /* the last parent domain's */
    struct ibv_pd *last_qp_pd;  /* of the last ibv_create_qp */
    enum ibv_qp_type last_qp_type;
    struct ibv_ah_attr ah_attr; /* of the last ibv_create_ah */
    int cqe_size_asked, srqn_asked;
    unsigned num_modify;
    fake_modify_t modify[FAKE_MAX_MOD];
    int sport_calls;
    uint16_t sport;
    uint32_t next_num;
    /* DevX: the HCA capabilities QUERY_HCA_CAP returns, and failures; index
     * 0 is the general page, 1 the atomic page */
    int cap_atomic;              /* cmd_hca_cap.atomic */
    uint16_t cap_ops;            /* atomic_caps.atomic_operations */
    uint16_t cap_size_qp;        /* atomic_caps.atomic_size_qp */
    unsigned cap_endian;         /* atomic_req_8B_endianness_mode */
    int devx_open_errno;         /* mlx5dv_open_device fails with it */
    int devx_ret[2], devx_errno; /* mlx5dv_devx_general_cmd fails so */
    uint8_t devx_status[2];      /* command status in the output */
    int fail_devx_close;
    /* what the code under test did */
    unsigned devx_opens, devx_cmds;
    uint32_t devx_flags;
    char devx_dev[IBV_SYSFS_NAME_MAX];
    uint16_t devx_op_mod[4];
} world;

typedef struct fake_ctx {
    struct verbs_context vctx;
    fake_dev_t *dev;
    int devx; /* opened by mlx5dv_open_device with DevX */
} fake_ctx_t;

static fake_dev_t *ctx_dev(struct ibv_context *ctx)
{
    return ucs_container_of(ctx, fake_ctx_t, vctx.context)->dev;
}

static fake_dev_t *add_dev(const char *name, int mlx5, unsigned num_ports)
{
    fake_dev_t *dev = &world.devs[world.num_devs++];

    dev->name      = name;
    dev->mlx5      = mlx5;
    dev->num_ports = num_ports;
    return dev;
}

static fake_port_t *ib_port(fake_dev_t *dev, unsigned port, uint16_t lid)
{
    fake_port_t *p = &dev->ports[port - 1];

    p->state                            = IBV_PORT_ACTIVE;
    p->link_layer                       = IBV_LINK_LAYER_INFINIBAND;
    p->lid                              = lid;
    p->active_mtu                       = IBV_MTU_4096;
    p->speed                            = 32; /* EDR */
    p->width                            = 2;  /* 4x */
    p->gids[0].valid                    = 1;
    p->gids[0].gid.global.subnet_prefix = htobe64(0xfe80000000000000ull);
    p->gids[0].gid.global.interface_id  = htobe64(0x1122334455667788ull);
    p->gids[0].type                     = IBV_GID_TYPE_IB;
    return p;
}

static void set_gid(fake_port_t *p, unsigned idx, int ipv4, uint32_t type,
                    uint8_t last)
{
    fake_gid_t *g = &p->gids[idx];

    memset(g, 0, sizeof(*g));
    g->valid = 1;
    g->type  = type;
    if (ipv4) {
        g->gid.raw[10] = 0xff;
        g->gid.raw[11] = 0xff;
        g->gid.raw[12] = 10;
    } else {
        g->gid.raw[0] = 0xfe;
        g->gid.raw[1] = 0x80;
    }
    g->gid.raw[15] = last;
}

static fake_port_t *eth_port(fake_dev_t *dev, unsigned port)
{
    fake_port_t *p = &dev->ports[port - 1];

    memset(p, 0, sizeof(*p));
    p->state      = IBV_PORT_ACTIVE;
    p->link_layer = IBV_LINK_LAYER_ETHERNET;
    p->active_mtu = IBV_MTU_1024;
    p->speed      = 64; /* HDR lane rate: 50G PAM4 */
    p->width      = 2;  /* 4x: 200 Gb/s */
    set_gid(p, 0, 0, IBV_GID_TYPE_ROCE_V1, 1);
    set_gid(p, 1, 0, IBV_GID_TYPE_ROCE_V2, 1);
    set_gid(p, 2, 1, IBV_GID_TYPE_ROCE_V1, 2);
    set_gid(p, 3, 1, IBV_GID_TYPE_ROCE_V2, 2);
    return p;
}

/* The machine of most tests: mlx5_0 with an active IB port 1 and a down
 * port 2, mlx5_1 with one RoCE port, and a non-mlx5 device. */
static void default_world(void)
{
    fake_dev_t *dev;

    dev = add_dev("mlx5_0", 1, 2);
    ib_port(dev, 1, 0x11);
    ib_port(dev, 2, 0x12)->state = IBV_PORT_DOWN;
    dev                          = add_dev("mlx5_1", 1, 1);
    eth_port(dev, 1);
    dev = add_dev("rxe0", 0, 1);
    eth_port(dev, 1);
}

static int world_setup(void **state)
{
    memset(&world, 0, sizeof(world));
    world.max_inline = 256;
    world.next_num   = 0x100;
    /* A ConnectX as Linux sets it up: all four atomic operations on 4 and 8
     * bytes, 8-byte replies switched to host order by the kernel. */
    world.cap_atomic  = 1;
    world.cap_ops     = 0xf;
    world.cap_size_qp = 0xc;
    world.cap_endian  = 1;
    default_world();
    return test_log_setup(state);
}

static int world_teardown(void **state)
{
    /* Whatever a test did, nothing verbs handed out may be left over. */
    assert_int_equal(world.open_ctx, 0);
    assert_int_equal(world.pds, 0);
    assert_int_equal(world.mrs, 0);
    assert_int_equal(world.cqs, 0);
    assert_int_equal(world.srqs, 0);
    assert_int_equal(world.qps, 0);
    assert_int_equal(world.ahs, 0);
    return test_log_teardown(state);
}

/* ------------------------------------------------------------ wrapped verbs */

struct ibv_device **__wrap_ibv_get_device_list(int *num);
void __wrap_ibv_free_device_list(struct ibv_device **list);
const char *__wrap_ibv_get_device_name(struct ibv_device *device);
bool __wrap_mlx5dv_is_supported(struct ibv_device *device);
struct ibv_context *__wrap_ibv_open_device(struct ibv_device *device);
int __wrap_ibv_close_device(struct ibv_context *ctx);
int __wrap_ibv_query_device(struct ibv_context *ctx,
                            struct ibv_device_attr *attr);
int __wrap__ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port,
                             uint32_t index, struct ibv_gid_entry *entry,
                             uint32_t flags, size_t size);
int __wrap_ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index,
                         union ibv_gid *gid);
struct ibv_pd *__wrap_ibv_alloc_pd(struct ibv_context *ctx);
int __wrap_ibv_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *__wrap_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
                                 int access);
struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
                                       size_t len, uint64_t iova,
                                       unsigned access);
int __wrap_ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_cq *__wrap_ibv_create_cq(struct ibv_context *ctx, int cqe,
                                    void *cq_context,
                                    struct ibv_comp_channel *channel,
                                    int comp_vector);
int __wrap_ibv_destroy_cq(struct ibv_cq *cq);
struct ibv_cq_ex *
__wrap_mlx5dv_create_cq(struct ibv_context *ctx,
                        struct ibv_cq_init_attr_ex *cq_attr,
                        struct mlx5dv_cq_init_attr *mlx5_attr);
int __wrap_mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t type);
struct ibv_srq *__wrap_ibv_create_srq(struct ibv_pd *pd,
                                      struct ibv_srq_init_attr *attr);
int __wrap_ibv_destroy_srq(struct ibv_srq *srq);
struct ibv_qp *__wrap_ibv_create_qp(struct ibv_pd *pd,
                                    struct ibv_qp_init_attr *attr);
int __wrap_ibv_destroy_qp(struct ibv_qp *qp);
int __wrap_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
int __wrap_mlx5dv_modify_qp_udp_sport(struct ibv_qp *qp, uint16_t sport);
struct ibv_ah *__wrap_ibv_create_ah(struct ibv_pd *pd,
                                    struct ibv_ah_attr *attr);
int __wrap_ibv_destroy_ah(struct ibv_ah *ah);
struct ibv_context *__wrap_mlx5dv_open_device(struct ibv_device *device,
                                              struct mlx5dv_context_attr *attr);
int __wrap_mlx5dv_devx_general_cmd(struct ibv_context *ctx, const void *in,
                                   size_t inlen, void *out, size_t outlen);

struct ibv_device **__wrap_ibv_get_device_list(int *num)
{
    struct ibv_device **list;
    unsigned i;

    if (world.no_kernel) {
        errno = ENOSYS;
        return NULL;
    }
    list = calloc(world.num_devs + 1, sizeof(*list));
    for (i = 0; i < world.num_devs; ++i) {
        list[i] = calloc(1, sizeof(**list));
        strcpy(list[i]->name, world.devs[i].name);
    }
    *num = world.num_devs;
    return list;
}

void __wrap_ibv_free_device_list(struct ibv_device **list)
{
    unsigned i;

    for (i = 0; list[i] != NULL; ++i) {
        free(list[i]);
    }
    free(list);
}

static fake_dev_t *find_dev(struct ibv_device *device)
{
    unsigned i;

    for (i = 0; i < world.num_devs; ++i) {
        if (!strcmp(world.devs[i].name, device->name)) {
            return &world.devs[i];
        }
    }
    fail_msg("unknown fake device %s", device->name);
    return NULL;
}

const char *__wrap_ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

bool __wrap_mlx5dv_is_supported(struct ibv_device *device)
{
    return find_dev(device)->mlx5;
}

static int fake_query_port(struct ibv_context *ctx, uint8_t port,
                           struct ibv_port_attr *attr, size_t len)
{
    fake_dev_t *dev = ctx_dev(ctx);
    fake_port_t *p;

    if ((port == 0) || (port > dev->num_ports)) {
        return EINVAL;
    }
    p = &dev->ports[port - 1];
    memset(attr, 0, len);
    attr->state        = p->state;
    attr->link_layer   = p->link_layer;
    attr->lid          = p->lid;
    attr->active_mtu   = p->active_mtu;
    attr->active_speed = p->speed;
    attr->active_width = p->width;
    attr->max_msg_sz   = 1u << 30;
    attr->gid_tbl_len  = FAKE_MAX_GIDS;
    return 0;
}

static struct ibv_td *fake_alloc_td(struct ibv_context *ctx,
                                    struct ibv_td_init_attr *attr)
{
    struct ibv_td *td;

    assert_int_equal(attr->comp_mask, 0);
    if (world.fail_alloc_td) {
        errno = world.fail_alloc_td;
        return NULL;
    }
    td          = calloc(1, sizeof(*td));
    td->context = ctx;
    ++world.tds;
    return td;
}

static int fake_dealloc_td(struct ibv_td *td)
{
    free(td);
    --world.tds;
    return world.fail_dealloc_td;
}

/* A parent domain is a PD to the rest of verbs (ibv_dealloc_pd frees it). */
static struct ibv_pd *
fake_alloc_parent_domain(struct ibv_context *ctx,
                         struct ibv_parent_domain_init_attr *attr)
{
    struct ibv_pd *pd;

    assert_ptr_equal(attr->pd, world.last_pd);
    assert_non_null(attr->td);
    assert_ptr_equal(attr->td->context, ctx);
    if (world.fail_parent_domain) {
        errno = world.fail_parent_domain;
        return NULL;
    }
    pd          = calloc(1, sizeof(*pd));
    pd->context = ctx;
    ++world.pds;
    ++world.parent_pds;
    world.last_parent = pd;
    world.last_td     = attr->td;
    return pd;
}

struct ibv_context *__wrap_ibv_open_device(struct ibv_device *device)
{
    fake_dev_t *dev = find_dev(device);
    fake_ctx_t *ctx;

    if (dev->fail_open) {
        errno = EACCES;
        return NULL;
    }
    ctx                  = calloc(1, sizeof(*ctx));
    ctx->dev             = dev;
    ctx->vctx.sz         = sizeof(ctx->vctx);
    ctx->vctx.query_port = fake_query_port;
    if (world.td_ops) {
        ctx->vctx.alloc_td            = fake_alloc_td;
        ctx->vctx.dealloc_td          = fake_dealloc_td;
        ctx->vctx.alloc_parent_domain = fake_alloc_parent_domain;
    }
    ctx->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    ctx->vctx.context.device     = device;
    ++world.open_ctx;
    return &ctx->vctx.context;
}

int __wrap_ibv_close_device(struct ibv_context *ctx)
{
    fake_ctx_t *fctx = ucs_container_of(ctx, fake_ctx_t, vctx.context);
    int devx         = fctx->devx;

    free(fctx);
    --world.open_ctx;
    if (devx && world.fail_devx_close) {
        errno = EIO;
        return EIO;
    }
    return 0;
}

struct ibv_context *__wrap_mlx5dv_open_device(struct ibv_device *device,
                                              struct mlx5dv_context_attr *attr)
{
    struct ibv_context *ctx;

    ++world.devx_opens;
    world.devx_flags = attr->flags;
    strcpy(world.devx_dev, device->name);
    if (world.devx_open_errno) {
        errno = world.devx_open_errno;
        return NULL;
    }
    ctx = __wrap_ibv_open_device(device);
    assert_non_null(ctx);
    ucs_container_of(ctx, fake_ctx_t, vctx.context)->devx = 1;
    return ctx;
}

/* QUERY_HCA_CAP answered from the world, fields at their PRM positions:
 * output byte 0 status, 4..7 syndrome, the page from byte 16; general page
 * "atomic" at page bit 0x21e (byte 67, mask 0x02); atomic page: endianness
 * mode in the top two bits of byte 8, atomic_operations bytes 18-19,
 * atomic_size_qp bytes 22-23 (big-endian). */
int __wrap_mlx5dv_devx_general_cmd(struct ibv_context *ctx, const void *in,
                                   size_t inlen, void *out, size_t outlen)
{
    const uint8_t *cmd = in;
    uint8_t *page      = (uint8_t *)out + 16;
    uint16_t op_mod;
    int idx;

    /* Only a DevX context may run commands. */
    assert_true(ucs_container_of(ctx, fake_ctx_t, vctx.context)->devx);
    assert_int_equal(inlen, 16);
    assert_true(outlen >= 16 + 4096); /* the firmware writes a whole page */
    assert_int_equal((cmd[0] << 8) | cmd[1], 0x100); /* QUERY_HCA_CAP */
    op_mod                                   = (cmd[6] << 8) | cmd[7];
    world.devx_op_mod[world.devx_cmds++ % 4] = op_mod; /* the last ones */
    idx                                      = ((op_mod >> 1) == 3) ? 1 : 0;
    assert_true((op_mod >> 1) == (idx ? 3 : 0)); /* general or atomic */
    if (world.devx_ret[idx] != 0) {
        errno = world.devx_errno;
        return world.devx_ret[idx];
    }
    memset(out, 0, outlen);
    ((uint8_t *)out)[0] = world.devx_status[idx];
    if (world.devx_status[idx] != 0) {
        ((uint8_t *)out)[4] = 0xab; /* syndrome 0xab0000cd */
        ((uint8_t *)out)[7] = 0xcd;
    }
    if (idx == 0) {
        page[67] = world.cap_atomic ? 0x02 : 0;
    } else {
        page[8]  = world.cap_endian << 6;
        page[18] = world.cap_ops >> 8;
        page[19] = world.cap_ops & 0xff;
        page[22] = world.cap_size_qp >> 8;
        page[23] = world.cap_size_qp & 0xff;
    }
    return 0;
}

int __wrap_ibv_query_device(struct ibv_context *ctx,
                            struct ibv_device_attr *attr)
{
    if (world.fail_query_device) {
        errno = EIO;
        return EIO;
    }
    memset(attr, 0, sizeof(*attr));
    attr->phys_port_cnt  = ctx_dev(ctx)->num_ports;
    attr->max_qp_wr      = 32768;
    attr->max_sge        = 30;
    attr->max_cqe        = 4194303;
    attr->max_srq_wr     = 32767;
    attr->max_qp_rd_atom = 16;
    return 0;
}

int __wrap__ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port,
                             uint32_t index, struct ibv_gid_entry *entry,
                             uint32_t flags, size_t size)
{
    fake_gid_t *g;

    if ((index >= FAKE_MAX_GIDS) || (port > ctx_dev(ctx)->num_ports)) {
        return EINVAL;
    }
    g = &ctx_dev(ctx)->ports[port - 1].gids[index];
    if (!g->valid) {
        return ENODATA;
    }
    memset(entry, 0, size);
    entry->gid       = g->gid;
    entry->gid_index = index;
    entry->port_num  = port;
    entry->gid_type  = g->type;
    return 0;
}

int __wrap_ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index,
                         union ibv_gid *gid)
{
    *gid = ctx_dev(ctx)->ports[port - 1].gids[index].gid;
    return 0;
}

struct ibv_pd *__wrap_ibv_alloc_pd(struct ibv_context *ctx)
{
    struct ibv_pd *pd;

    if (world.fail_alloc_pd) {
        errno = ENOMEM;
        return NULL;
    }
    pd            = calloc(1, sizeof(*pd));
    pd->context   = ctx;
    world.last_pd = pd;
    ++world.pds;
    return pd;
}

int __wrap_ibv_dealloc_pd(struct ibv_pd *pd)
{
    world.parent_pds -= (pd == world.last_parent);
    free(pd);
    --world.pds;
    if (world.fail_dealloc_pd) {
        errno = EBUSY;
        return EBUSY;
    }
    return 0;
}

static struct ibv_mr *fake_reg_mr(struct ibv_pd *pd, unsigned access)
{
    struct ibv_mr *mr;

    world.reg_mr_access = access;
    if (world.fail_reg_mr) {
        errno = world.fail_reg_mr;
        return NULL;
    }
    mr       = calloc(1, sizeof(*mr));
    mr->pd   = pd;
    mr->lkey = world.next_num++;
    mr->rkey = world.next_num++;
    ++world.mrs;
    return mr;
}

struct ibv_mr *__wrap_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
                                 int access)
{
    return fake_reg_mr(pd, (unsigned)access);
}

struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
                                       size_t len, uint64_t iova,
                                       unsigned access)
{
    return fake_reg_mr(pd, access);
}

int __wrap_ibv_dereg_mr(struct ibv_mr *mr)
{
    if (world.fail_destroy) {
        return world.fail_destroy;
    }
    free(mr);
    --world.mrs;
    return 0;
}

struct ibv_cq *__wrap_ibv_create_cq(struct ibv_context *ctx, int cqe,
                                    void *cq_context,
                                    struct ibv_comp_channel *channel,
                                    int comp_vector)
{
    ++world.cqs;
    return calloc(1, sizeof(struct ibv_cq_ex));
}

int __wrap_ibv_destroy_cq(struct ibv_cq *cq)
{
    if (world.fail_destroy) {
        return world.fail_destroy;
    }
    free(cq);
    --world.cqs;
    return 0;
}

struct ibv_cq_ex *__wrap_mlx5dv_create_cq(struct ibv_context *ctx,
                                          struct ibv_cq_init_attr_ex *cq_attr,
                                          struct mlx5dv_cq_init_attr *mlx5_attr)
{
    struct ibv_cq_ex *cq;

    world.cqe_size_asked =
        (mlx5_attr->comp_mask & MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE)
            ? (int)mlx5_attr->cqe_size
            : 0;
    if (world.fail_create_cq) {
        errno = world.fail_create_cq;
        return NULL;
    }
    cq      = calloc(1, sizeof(*cq));
    cq->cqe = cq_attr->cqe;
    ++world.cqs;
    return cq;
}

/* The AV an mlx5 AH holds: a pattern the copy must keep. */
static struct mlx5_wqe_av fake_av = {
    .stat_rate_sl = 0x03,
    .rlid         = 0x4200,
    .grh_gid_fl   = 0x40,
    .rgid         = {0xfe, 0x80, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14},
};

int __wrap_mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t type)
{
    static uint64_t ring[64];
    static __be32 dbrec[2];
    static uint64_t bf[64]; /* a BlueFlame register: two 256-byte halves */

    if (world.fail_init_obj) {
        return world.fail_init_obj;
    }
    if (type == MLX5DV_OBJ_CQ) {
        memset(obj->cq.out, 0, sizeof(*obj->cq.out));
        obj->cq.out->buf      = ring;
        obj->cq.out->dbrec    = dbrec;
        obj->cq.out->cqe_cnt  = 8;
        obj->cq.out->cqe_size = 64;
        obj->cq.out->cqn      = world.next_num++;
    } else if (type == MLX5DV_OBJ_SRQ) {
        world.srqn_asked  = !!(obj->srq.out->comp_mask & MLX5DV_SRQ_MASK_SRQN);
        obj->srq.out->buf = ring;
        obj->srq.out->dbrec  = dbrec;
        obj->srq.out->stride = 32;
        obj->srq.out->srqn   = world.next_num++;
    } else if (type == MLX5DV_OBJ_QP) {
        memset(obj->qp.out, 0, sizeof(*obj->qp.out));
        obj->qp.out->bf.reg     = bf;
        obj->qp.out->bf.size    = 256;
        obj->qp.out->sq.buf     = ring;
        obj->qp.out->sq.wqe_cnt = 8;
        obj->qp.out->sq.stride  = 64;
        obj->qp.out->dbrec      = dbrec;
    } else if (type == MLX5DV_OBJ_AH) {
        if (world.fail_init_obj_ah) {
            return world.fail_init_obj_ah;
        }
        obj->ah.out->av = &fake_av;
    } else {
        fail_msg("unexpected mlx5dv_init_obj type 0x%lx", (unsigned long)type);
    }
    return 0;
}

struct ibv_srq *__wrap_ibv_create_srq(struct ibv_pd *pd,
                                      struct ibv_srq_init_attr *attr)
{
    if (world.fail_create_srq) {
        errno = world.fail_create_srq;
        return NULL;
    }
    ++world.srqs;
    return calloc(1, sizeof(struct ibv_srq));
}

int __wrap_ibv_destroy_srq(struct ibv_srq *srq)
{
    if (world.fail_destroy) {
        return world.fail_destroy;
    }
    free(srq);
    --world.srqs;
    return 0;
}

struct ibv_qp *__wrap_ibv_create_qp(struct ibv_pd *pd,
                                    struct ibv_qp_init_attr *attr)
{
    struct ibv_qp *qp;

    if (attr->cap.max_inline_data > world.max_inline) {
        errno = EINVAL;
        return NULL;
    }
    if (world.fail_create_qp && (attr->cap.max_send_wr > 1)) {
        errno = world.fail_create_qp; /* the inline probe still works */
        return NULL;
    }
    assert_true((attr->qp_type == IBV_QPT_RC) || (attr->qp_type == IBV_QPT_UD));
    assert_int_equal(attr->sq_sig_all, 0);
    world.last_qp_type = attr->qp_type;
    /* Devices round up: grant a power of two and room for 2 more WRs. */
    attr->cap.max_send_wr += 2;
    world.last_qp_pd = pd;
    qp               = calloc(1, sizeof(*qp));
    qp->qp_num       = world.next_num++;
    qp->pd           = pd;
    ++world.qps;
    return qp;
}

int __wrap_ibv_destroy_qp(struct ibv_qp *qp)
{
    if (world.fail_destroy) {
        return world.fail_destroy;
    }
    free(qp);
    --world.qps;
    return 0;
}

int __wrap_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    assert_true(world.num_modify < FAKE_MAX_MOD);
    world.modify[world.num_modify].attr = *attr;
    world.modify[world.num_modify].mask = mask;
    ++world.num_modify;
    if ((world.fail_modify_to != 0) &&
        (attr->qp_state == world.fail_modify_to)) {
        return world.fail_modify_errno;
    }
    return 0;
}

int __wrap_mlx5dv_modify_qp_udp_sport(struct ibv_qp *qp, uint16_t sport)
{
    ++world.sport_calls;
    world.sport = sport;
    /* Only valid in RTS: the last transition must have been to RTS. */
    assert_int_equal(world.modify[world.num_modify - 1].attr.qp_state,
                     IBV_QPS_RTS);
    return world.sport_ret;
}

struct ibv_ah *__wrap_ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
    world.ah_attr = *attr;
    if (world.fail_create_ah) {
        errno = world.fail_create_ah;
        return NULL;
    }
    ++world.ahs;
    return calloc(1, sizeof(struct ibv_ah));
}

int __wrap_ibv_destroy_ah(struct ibv_ah *ah)
{
    if (world.fail_destroy_ah) {
        return world.fail_destroy_ah;
    }
    free(ah);
    --world.ahs;
    return 0;
}

/* ------------------------------------------------------------ helpers */

typedef struct hw_ep {
    vqp_dev_t *dev;
    vqp_dev_cq_t *cq;
    struct mlx5dv_cq dv_cq;
    vqp_dev_qp_t *qp;
    struct mlx5dv_qp dv_qp;
    vqp_dev_qp_caps_t caps;
} hw_ep_t;

static void hw_ep_open(hw_ep_t *ep, const char *name)
{
    vqp_dev_qp_init_t init = {};

    assert_int_equal(vqp_dev_open(name, NULL, &ep->dev), UCS_OK);
    assert_int_equal(vqp_dev_cq_create(ep->dev, 64, &ep->cq, &ep->dv_cq),
                     UCS_OK);
    init.send_cq      = ep->cq;
    init.recv_cq      = ep->cq;
    init.max_send_wr  = 64;
    init.max_send_sge = 2;
    init.max_recv_wr  = 64;
    init.max_recv_sge = 1;
    init.max_inline   = 128;
    assert_int_equal(
        vqp_dev_qp_create(ep->dev, &init, &ep->qp, &ep->dv_qp, &ep->caps),
        UCS_OK);
}

static void hw_ep_close(hw_ep_t *ep)
{
    assert_int_equal(vqp_dev_qp_destroy(ep->qp), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(ep->cq), UCS_OK);
    assert_int_equal(vqp_dev_close(ep->dev), UCS_OK);
}

static const fake_modify_t *find_modify(enum ibv_qp_state state)
{
    unsigned i;

    for (i = 0; i < world.num_modify; ++i) {
        if (world.modify[i].attr.qp_state == state) {
            return &world.modify[i];
        }
    }
    fail_msg("no transition to state %d", state);
    return NULL;
}

/* ------------------------------------------------------------ tests */

static void test_no_kernel_support(void **state)
{
    vqp_dev_info_t *list;
    vqp_dev_t *dev = NULL;
    unsigned count;

    world.no_kernel = 1;
    assert_int_equal(vqp_dev_list(0, &list, &count), UCS_OK);
    assert_int_equal(count, 0);
    vqp_dev_list_free(list);
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("device 'mlx5_0:1' not found (0 RDMA devices present)");
    assert_null(dev);
}

static void test_enumeration(void **state)
{
    vqp_dev_info_t *list;
    unsigned count;

    assert_int_equal(vqp_dev_list(0, &list, &count), UCS_OK);
    /* rxe0 is not mlx5, mlx5_0:2 is down. */
    assert_int_equal(count, 2);
    assert_string_equal(list[0].name, "mlx5_0:1");
    assert_int_equal(list[0].link, VQP_DEV_LINK_IB);
    assert_string_equal(list[1].name, "mlx5_1:1");
    assert_int_equal(list[1].link, VQP_DEV_LINK_ETHERNET);
    vqp_dev_list_free(list);

    assert_int_equal(
        vqp_dev_list(VQP_DEV_LIST_INACTIVE | VQP_DEV_LIST_SW, &list, &count),
        UCS_OK);
    assert_int_equal(count, 4);
    assert_string_equal(list[1].name, "mlx5_0:2");
    assert_false(list[1].active);
    assert_string_equal(list[3].name, VQP_DEV_SW_NAME);
    vqp_dev_list_free(list);

    /* A device that cannot be opened is skipped, the rest is listed. */
    world.devs[0].fail_open = 1;
    assert_int_equal(vqp_dev_list(0, &list, &count), UCS_OK);
    assert_int_equal(count, 1);
    assert_string_equal(list[0].name, "mlx5_1:1");
    vqp_dev_list_free(list);
}

static void test_open_ib(void **state)
{
    vqp_dev_addr_t addr;
    vqp_dev_attr_t attr;
    vqp_dev_t *dev;

    /* No port given: the first active one. */
    assert_int_equal(vqp_dev_open("mlx5_0", NULL, &dev), UCS_OK);
    vqp_dev_query(dev, &attr);
    assert_string_equal(attr.name, "mlx5_0:1");
    assert_int_equal(attr.link, VQP_DEV_LINK_IB);
    assert_int_equal(attr.max_qp_wr, 32768);
    assert_int_equal(attr.max_sge, 30);
    assert_int_equal(attr.max_cqe, 4194303);
    assert_int_equal(attr.max_srq_wr, 32767);
    assert_int_equal(attr.max_rd_atom, 16);
    /* From the fake HCA's capabilities: 8-byte replies in host order. */
    assert_int_equal(attr.ext_atomic_sizes, 4);
    assert_int_equal(attr.max_msg_sz, 1u << 30);
    assert_int_equal(attr.path_mtu, 4096);
    assert_int_equal(attr.max_inline, 256); /* probed: 1024, 512 refused */
    assert_int_equal(attr.gid_index, -1);
    /* EDR 4x: 4 x 25.78125 Gb/s with 64b/66b = 100 Gb/s of data. */
    assert_true((attr.bandwidth > 12.49e9) && (attr.bandwidth < 12.51e9));
    vqp_dev_address(dev, &addr);
    assert_int_equal(addr.type, VQP_DEV_ADDR_IB);
    assert_int_equal(addr.ib.lid, 0x11);
    assert_false(addr.ib.has_gid); /* default subnet: LID only */
    assert_int_equal(vqp_dev_progress(dev), 0);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);

    /* A routed subnet puts the GID in the address. */
    world.devs[0].ports[0].gids[0].gid.global.subnet_prefix =
        htobe64(0xfec0000000000007ull);
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_OK);
    vqp_dev_address(dev, &addr);
    assert_true(addr.ib.has_gid);
    assert_int_equal(be64toh(addr.ib.gid.global.subnet_prefix),
                     0xfec0000000000007ull);
    assert_int_equal(vqp_dev_addr_packed_size(&addr), 20);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_open_errors(void **state)
{
    vqp_dev_t *dev = NULL;

    assert_int_equal(vqp_dev_open("mlx5_0:3", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("no such port (the device has 2)");
    assert_int_equal(vqp_dev_open("mlx5_0:2", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("port is not active");
    assert_int_equal(vqp_dev_open("rxe0:1", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("is not an mlx5 device");
    assert_int_equal(vqp_dev_open("mlx5_7", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("device 'mlx5_7' not found (3 RDMA devices present)");

    world.devs[0].ports[0].state = IBV_PORT_INIT;
    assert_int_equal(vqp_dev_open("mlx5_0", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("mlx5_0: no active port");
    world.devs[0].ports[0].state = IBV_PORT_ACTIVE;

    world.devs[0].ports[0].lid = 0;
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("IB port has no LID");
    world.devs[0].ports[0].lid = 0x11;

    world.devs[0].fail_open = 1;
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("ibv_open_device failed");
    world.devs[0].fail_open = 0;

    world.fail_query_device = 1;
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_ERR_IO_ERROR);
    expect_log("ibv_query_device failed");
    world.fail_query_device = 0;

    world.fail_alloc_pd = 1;
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_ERR_NO_MEMORY);
    expect_log("ibv_alloc_pd failed");
    world.fail_alloc_pd = 0;
    assert_null(dev);

    /* A PD that does not go away is reported, the device still closes. */
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_OK);
    world.fail_dealloc_pd = 1;
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
    expect_log("ibv_dealloc_pd failed");
}

static void test_roce_gid_selection(void **state)
{
    vqp_dev_open_params_t params;
    fake_port_t *port = &world.devs[1].ports[0];
    vqp_dev_addr_t addr;
    vqp_dev_attr_t attr;
    vqp_dev_t *dev;

    /* Default: the IPv4-mapped RoCE v2 GID (index 3). */
    assert_int_equal(vqp_dev_open("mlx5_1:1", NULL, &dev), UCS_OK);
    vqp_dev_query(dev, &attr);
    assert_int_equal(attr.link, VQP_DEV_LINK_ETHERNET);
    assert_int_equal(attr.gid_index, 3);
    assert_int_equal(attr.path_mtu, 1024);
    assert_true((attr.bandwidth > 25.7e9) && (attr.bandwidth < 25.8e9));
    vqp_dev_address(dev, &addr);
    assert_int_equal(addr.type, VQP_DEV_ADDR_ROCE);
    assert_memory_equal(addr.roce.gid.raw, port->gids[3].gid.raw, 16);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);

    /* Without an IPv4 RoCE v2 GID: the IPv6 one. */
    port->gids[3].valid = 0;
    assert_int_equal(vqp_dev_open("mlx5_1:1", NULL, &dev), UCS_OK);
    vqp_dev_query(dev, &attr);
    assert_int_equal(attr.gid_index, 1);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);

    /* An explicit index wins, even a RoCE v1 one. */
    vqp_dev_open_params_default(&params);
    params.gid_index = 2;
    assert_int_equal(vqp_dev_open("mlx5_1:1", &params, &dev), UCS_OK);
    vqp_dev_query(dev, &attr);
    assert_int_equal(attr.gid_index, 2);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);

    params.gid_index = 3; /* now empty */
    assert_int_equal(vqp_dev_open("mlx5_1:1", &params, &dev),
                     UCS_ERR_INVALID_PARAM);
    expect_log("GID index 3 is not valid");
    params.gid_index = 99;
    assert_int_equal(vqp_dev_open("mlx5_1:1", &params, &dev),
                     UCS_ERR_INVALID_PARAM);
    expect_log("GID index 99 is not valid (table of 6)");

    /* No RoCE v2 GID at all (no IP address on the netdev). */
    port->gids[1].valid = 0;
    assert_int_equal(vqp_dev_open("mlx5_1:1", NULL, &dev), UCS_ERR_NO_DEVICE);
    expect_log("no RoCE v2 GID on the port");
}

static void test_queues(void **state)
{
    vqp_dev_qp_init_t init = {};
    struct mlx5dv_srq dv_srq;
    struct mlx5dv_cq dv_cq;
    struct mlx5dv_qp dv_qp;
    vqp_dev_qp_caps_t caps;
    uint32_t lkey, rkey;
    vqp_dev_srq_t *srq;
    vqp_dev_qp_t *qp;
    vqp_dev_cq_t *cq;
    vqp_dev_mr_t *mr;
    vqp_dev_t *dev;
    char buf[64];

    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_OK);

    assert_int_equal(vqp_dev_mr_reg(dev, buf, sizeof(buf),
                                    IBV_ACCESS_LOCAL_WRITE, &mr, &lkey, &rkey),
                     UCS_OK);
    assert_int_not_equal(lkey, rkey);
    assert_int_equal(world.mrs, 1);

    assert_int_equal(vqp_dev_cq_create(dev, 64, &cq, &dv_cq), UCS_OK);
    assert_int_equal(world.cqe_size_asked, 64);
    assert_int_equal(dv_cq.cqe_size, 64);
    assert_non_null(dv_cq.buf);

    assert_int_equal(vqp_dev_srq_create(dev, 64, 1, &srq, &dv_srq), UCS_OK);
    assert_true(world.srqn_asked);
    assert_true(dv_srq.comp_mask & MLX5DV_SRQ_MASK_SRQN);

    init.send_cq      = cq;
    init.recv_cq      = cq;
    init.srq          = srq;
    init.max_send_wr  = 100;
    init.max_send_sge = 1;
    init.max_inline   = 200;
    assert_int_equal(vqp_dev_qp_create(dev, &init, &qp, &dv_qp, &caps), UCS_OK);
    assert_int_equal(caps.max_send_wr, 102); /* what the device granted */
    assert_int_equal(caps.max_inline, 200);
    assert_int_equal(dv_qp.sq.stride, 64);

    /* Destroy failures keep the objects (and their accounting). */
    world.fail_destroy = EBUSY;
    assert_int_equal(vqp_dev_qp_destroy(qp), UCS_ERR_BUSY);
    expect_log("ibv_destroy_qp");
    assert_int_equal(vqp_dev_srq_destroy(srq), UCS_ERR_BUSY);
    expect_log("still used by 1 QPs");
    assert_int_equal(vqp_dev_mr_dereg(mr), UCS_ERR_BUSY);
    expect_log("ibv_dereg_mr failed");
    world.fail_destroy = 0;

    assert_int_equal(vqp_dev_qp_destroy(qp), UCS_OK);
    world.fail_destroy = EINVAL;
    assert_int_equal(vqp_dev_srq_destroy(srq), UCS_ERR_INVALID_PARAM);
    expect_log("ibv_destroy_srq");
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_ERR_INVALID_PARAM);
    expect_log("ibv_destroy_cq");
    world.fail_destroy = 0;
    assert_int_equal(vqp_dev_close(dev), UCS_ERR_BUSY);
    expect_log("3 MRs/CQs/SRQs/QPs/AHs are still alive");
    assert_int_equal(vqp_dev_srq_destroy(srq), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_OK);
    assert_int_equal(vqp_dev_mr_dereg(mr), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_queue_create_errors(void **state)
{
    vqp_dev_qp_init_t init = {};
    struct mlx5dv_srq dv_srq;
    struct mlx5dv_cq dv_cq;
    struct mlx5dv_qp dv_qp;
    vqp_dev_qp_caps_t caps;
    uint32_t lkey, rkey;
    vqp_dev_srq_t *srq;
    vqp_dev_qp_t *qp;
    vqp_dev_cq_t *cq;
    vqp_dev_mr_t *mr;
    vqp_dev_t *dev;
    unsigned count;
    char buf[64];

    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_OK);

    world.fail_reg_mr = EFAULT;
    assert_int_equal(vqp_dev_mr_reg(dev, buf, sizeof(buf),
                                    IBV_ACCESS_LOCAL_WRITE, &mr, &lkey, &rkey),
                     UCS_ERR_INVALID_ADDR);
    expect_log("ibv_reg_mr");
    /* A caller that retries: the failure is not logged as an error. */
    count = test_log_count;
    assert_int_equal(
        vqp_dev_mr_reg(dev, buf, sizeof(buf),
                       IBV_ACCESS_LOCAL_WRITE | VQP_DEV_MR_HIDE_ERRORS, &mr,
                       &lkey, &rkey),
        UCS_ERR_INVALID_ADDR);
    assert_int_equal(test_log_count, count);
    assert_int_equal(world.reg_mr_access, IBV_ACCESS_LOCAL_WRITE);
    world.fail_reg_mr = ENOMEM;
    assert_int_equal(vqp_dev_mr_reg(dev, buf, sizeof(buf),
                                    IBV_ACCESS_LOCAL_WRITE, &mr, &lkey, &rkey),
                     UCS_ERR_NO_MEMORY);
    expect_log("Cannot allocate memory");
    world.fail_reg_mr = 0;

    world.fail_create_cq = ENOMEM;
    assert_int_equal(vqp_dev_cq_create(dev, 64, &cq, &dv_cq),
                     UCS_ERR_NO_MEMORY);
    expect_log("mlx5dv_create_cq(64) failed");
    world.fail_create_cq = 0;
    world.fail_init_obj  = EOPNOTSUPP;
    assert_int_equal(vqp_dev_cq_create(dev, 64, &cq, &dv_cq),
                     UCS_ERR_UNSUPPORTED);
    expect_log("mlx5dv_init_obj(CQ) failed");
    assert_int_equal(world.cqs, 0); /* the verbs CQ was destroyed again */
    world.fail_init_obj = 0;

    assert_int_equal(vqp_dev_cq_create(dev, 64, &cq, &dv_cq), UCS_OK);
    world.fail_create_srq = ENOSYS;
    assert_int_equal(vqp_dev_srq_create(dev, 16, 1, &srq, &dv_srq),
                     UCS_ERR_UNSUPPORTED);
    expect_log("ibv_create_srq(16 x 1) failed");
    world.fail_create_srq = 0;
    world.fail_init_obj   = EINVAL;
    assert_int_equal(vqp_dev_srq_create(dev, 16, 1, &srq, &dv_srq),
                     UCS_ERR_INVALID_PARAM);
    expect_log("mlx5dv_init_obj(SRQ) failed");
    assert_int_equal(world.srqs, 0);
    world.fail_init_obj = 0;

    init.send_cq         = cq;
    init.recv_cq         = cq;
    init.max_send_wr     = 16;
    init.max_recv_wr     = 16;
    init.max_recv_sge    = 1;
    world.fail_create_qp = ENOMEM;
    assert_int_equal(vqp_dev_qp_create(dev, &init, &qp, &dv_qp, &caps),
                     UCS_ERR_NO_MEMORY);
    expect_log("ibv_create_qp(RC, sq 16, rq 16, inline 0) failed");
    world.fail_create_qp = 0;
    world.fail_init_obj  = EIO;
    assert_int_equal(vqp_dev_qp_create(dev, &init, &qp, &dv_qp, &caps),
                     UCS_ERR_IO_ERROR);
    expect_log("mlx5dv_init_obj(QP) failed");
    assert_int_equal(world.qps, 0);
    world.fail_init_obj = 0;

    /* The CQ is not counted as used by QPs that were never created. */
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_connect_ib(void **state)
{
    vqp_dev_connect_params_t params;
    const fake_modify_t *m;
    vqp_dev_qp_addr_t remote;
    hw_ep_t ep;

    hw_ep_open(&ep, "mlx5_0:1");
    memset(&remote, 0, sizeof(remote));
    remote.dev.type   = VQP_DEV_ADDR_IB;
    remote.dev.ib.lid = 0x42;
    remote.qpn        = 0xabcdef;
    vqp_dev_connect_params_default(&params);
    params.sl              = 3;
    params.min_rnr_timer   = 7;
    params.udp_sport_index = 5; /* IB: no UDP, ignored */
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, &params), UCS_OK);
    assert_int_equal(world.num_modify, 3);

    m = find_modify(IBV_QPS_INIT);
    assert_int_equal(m->mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS);
    assert_int_equal(m->attr.port_num, 1);
    assert_int_equal(m->attr.qp_access_flags, params.access);

    m = find_modify(IBV_QPS_RTR);
    assert_int_equal(m->mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER);
    assert_int_equal(m->attr.dest_qp_num, 0xabcdef);
    assert_int_equal(m->attr.path_mtu, IBV_MTU_4096);
    assert_int_equal(m->attr.min_rnr_timer, 7);
    assert_int_equal(m->attr.max_dest_rd_atomic, 16);
    assert_int_equal(m->attr.ah_attr.dlid, 0x42);
    assert_int_equal(m->attr.ah_attr.sl, 3);
    assert_int_equal(m->attr.ah_attr.port_num, 1);
    assert_int_equal(m->attr.ah_attr.is_global, 0);

    m = find_modify(IBV_QPS_RTS);
    assert_int_equal(m->mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC);
    assert_int_equal(m->attr.timeout, params.timeout);
    assert_int_equal(m->attr.retry_cnt, params.retry_cnt);
    assert_int_equal(m->attr.rnr_retry, params.rnr_retry);
    assert_int_equal(m->attr.max_rd_atomic, 16);
    assert_int_equal(world.sport_calls, 0);
    assert_int_equal(vqp_dev_qp_udp_sport(ep.qp), 0);

    /* Error: the state alone. Reset and reconnect across subnets: GRH. */
    assert_int_equal(vqp_dev_qp_set_error(ep.qp), UCS_OK);
    assert_int_equal(world.modify[3].attr.qp_state, IBV_QPS_ERR);
    assert_int_equal(world.modify[3].mask, IBV_QP_STATE);
    assert_int_equal(vqp_dev_qp_reset(ep.qp), UCS_OK);
    assert_int_equal(world.modify[4].attr.qp_state, IBV_QPS_RESET);
    world.num_modify          = 0;
    remote.dev.ib.has_gid     = 1;
    remote.dev.ib.gid.raw[0]  = 0xfe;
    remote.dev.ib.gid.raw[1]  = 0xc0;
    remote.dev.ib.gid.raw[15] = 9;
    params.hop_limit          = 5;
    params.path_mtu           = 2048;
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, &params), UCS_OK);
    m = find_modify(IBV_QPS_RTR);
    assert_int_equal(m->attr.path_mtu, IBV_MTU_2048);
    assert_int_equal(m->attr.ah_attr.is_global, 1);
    assert_int_equal(m->attr.ah_attr.grh.hop_limit, 5);
    assert_int_equal(m->attr.ah_attr.grh.sgid_index, 0);
    assert_memory_equal(m->attr.ah_attr.grh.dgid.raw, remote.dev.ib.gid.raw,
                        16);
    hw_ep_close(&ep);
}

static void test_connect_roce(void **state)
{
    vqp_dev_connect_params_t params;
    const fake_modify_t *m;
    vqp_dev_qp_addr_t remote;
    hw_ep_t ep;

    hw_ep_open(&ep, "mlx5_1:1");
    memset(&remote, 0, sizeof(remote));
    remote.dev.type             = VQP_DEV_ADDR_ROCE;
    remote.dev.roce.gid.raw[10] = 0xff;
    remote.dev.roce.gid.raw[11] = 0xff;
    remote.dev.roce.gid.raw[12] = 10;
    remote.dev.roce.gid.raw[15] = 77;
    remote.qpn                  = 0x1234;
    vqp_dev_connect_params_default(&params);
    params.traffic_class   = 106;
    params.udp_sport_base  = 0x100;
    params.udp_sport_index = 6;
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, &params), UCS_OK);
    m = find_modify(IBV_QPS_RTR);
    assert_int_equal(m->attr.path_mtu, IBV_MTU_1024);
    assert_int_equal(m->attr.ah_attr.is_global, 1);
    assert_int_equal(m->attr.ah_attr.dlid, 0);
    assert_int_equal(m->attr.ah_attr.grh.sgid_index, 3);
    assert_int_equal(m->attr.ah_attr.grh.traffic_class, 106);
    assert_int_equal(m->attr.ah_attr.grh.hop_limit, 64);
    assert_memory_equal(m->attr.ah_attr.grh.dgid.raw, remote.dev.roce.gid.raw,
                        16);
    /* The source port, set once in RTS (checked by the fake). */
    assert_int_equal(world.sport_calls, 1);
    assert_int_equal(world.sport, vqp_dev_udp_sport(0x100, 6));
    assert_int_equal(vqp_dev_qp_udp_sport(ep.qp), world.sport);

    /* A NIC that cannot set it: connected anyway, NIC's own port. */
    assert_int_equal(vqp_dev_qp_reset(ep.qp), UCS_OK);
    assert_int_equal(vqp_dev_qp_udp_sport(ep.qp), 0);
    world.num_modify = 0;
    world.sport_ret  = EOPNOTSUPP;
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, &params), UCS_OK);
    assert_int_equal(vqp_dev_qp_state(ep.qp), IBV_QPS_RTS);
    assert_int_equal(vqp_dev_qp_udp_sport(ep.qp), 0);

    /* Any other failure fails the connect and leaves the QP in RESET. */
    assert_int_equal(vqp_dev_qp_reset(ep.qp), UCS_OK);
    world.num_modify = 0;
    world.sport_ret  = EINVAL;
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, &params),
                     UCS_ERR_INVALID_PARAM);
    expect_log("mlx5dv_modify_qp_udp_sport");
    assert_int_equal(vqp_dev_qp_state(ep.qp), IBV_QPS_RESET);
    assert_int_equal(world.modify[world.num_modify - 1].attr.qp_state,
                     IBV_QPS_RESET);

    /* Index -1: the source port is left alone. */
    world.sport_ret        = 0;
    world.sport_calls      = 0;
    params.udp_sport_index = -1;
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, &params), UCS_OK);
    assert_int_equal(world.sport_calls, 0);

    /* RoCE cannot reach an IB peer; nothing is touched. */
    assert_int_equal(vqp_dev_qp_reset(ep.qp), UCS_OK);
    world.num_modify      = 0;
    remote.dev.type       = VQP_DEV_ADDR_IB;
    remote.dev.ib.lid     = 3;
    remote.dev.ib.has_gid = 0;
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, &params),
                     UCS_ERR_UNREACHABLE);
    expect_log("cannot reach remote QP 0x1234");
    assert_int_equal(world.num_modify, 0);
    hw_ep_close(&ep);
}

static void test_modify_failure(void **state)
{
    vqp_dev_qp_addr_t remote;
    hw_ep_t ep;

    hw_ep_open(&ep, "mlx5_0:1");
    memset(&remote, 0, sizeof(remote));
    remote.dev.type   = VQP_DEV_ADDR_IB;
    remote.dev.ib.lid = 0x42;
    remote.qpn        = 0x77;

    world.fail_modify_to    = IBV_QPS_RTR;
    world.fail_modify_errno = EINVAL;
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("ibv_modify_qp(INIT -> RTR) failed");
    /* Back to RESET: INIT, RTR (failed), RESET. */
    assert_int_equal(world.num_modify, 3);
    assert_int_equal(world.modify[2].attr.qp_state, IBV_QPS_RESET);
    assert_int_equal(vqp_dev_qp_state(ep.qp), IBV_QPS_RESET);

    world.fail_modify_to    = IBV_QPS_ERR;
    world.fail_modify_errno = EIO;
    assert_int_equal(vqp_dev_qp_set_error(ep.qp), UCS_ERR_IO_ERROR);
    expect_log("ibv_modify_qp(RESET -> ERROR) failed");
    assert_int_equal(vqp_dev_qp_state(ep.qp), IBV_QPS_RESET);

    world.fail_modify_to = 0;
    assert_int_equal(vqp_dev_qp_connect(ep.qp, &remote, NULL), UCS_OK);
    hw_ep_close(&ep);
}

/* ------------------------------------------------------------ datagrams */

static void ud_qp_open(vqp_dev_t *dev, vqp_dev_cq_t **cq, vqp_dev_qp_t **qp,
                       ucs_status_t expect)
{
    vqp_dev_ud_qp_init_t init = {};
    struct mlx5dv_cq dv_cq;
    struct mlx5dv_qp dv;
    vqp_dev_qp_caps_t caps;

    if (*cq == NULL) {
        assert_int_equal(vqp_dev_cq_create(dev, 64, cq, &dv_cq), UCS_OK);
    }
    init.send_cq      = *cq;
    init.recv_cq      = *cq;
    init.max_send_wr  = 32;
    init.max_send_sge = 1;
    init.max_recv_wr  = 32;
    init.max_recv_sge = 1;
    init.max_inline   = 64;
    init.qkey         = 0x1ee7;
    assert_int_equal(vqp_dev_ud_qp_create(dev, &init, qp, &dv, &caps), expect);
    if (expect == UCS_OK) {
        assert_int_equal(caps.max_send_wr, 34); /* what the device granted */
        assert_int_equal(caps.max_inline, 64);
        assert_int_equal(dv.sq.stride, 64);
    }
}

/* Each CQ gets a thread domain, and the QPs whose sends complete on it are
 * created on its parent domain, so that they ring a BlueFlame register no
 * QP of another CQ (another thread) copies into. Without one they go on the
 * plain PD with no BlueFlame size: 8-byte doorbells, which cannot tear. */
static void test_thread_domains(void **state)
{
    vqp_dev_qp_init_t init = {};
    vqp_dev_cq_t *cq[2] = {NULL, NULL}, *plain = NULL;
    struct ibv_pd *parent, *pd;
    struct mlx5dv_cq dv_cq;
    struct mlx5dv_qp dv;
    vqp_dev_qp_caps_t caps;
    vqp_dev_qp_t *qp[2];
    vqp_dev_attr_t attr;
    vqp_dev_t *dev;

    world.td_ops = 1;
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_OK);
    pd = world.last_pd;
    vqp_dev_query(dev, &attr);
    assert_true(attr.qp_db_private); /* QPs of different CQs */
    assert_int_equal(vqp_dev_cq_create(dev, 64, &cq[0], &dv_cq), UCS_OK);
    assert_int_equal(world.tds, 1);
    assert_int_equal(world.parent_pds, 1);
    assert_int_equal(world.pds, 2);
    parent = world.last_parent;

    init.send_cq      = cq[0];
    init.recv_cq      = cq[0];
    init.max_send_wr  = 16;
    init.max_send_sge = 1;
    init.max_inline   = 64;
    assert_int_equal(vqp_dev_qp_create(dev, &init, &qp[0], &dv, &caps), UCS_OK);
    assert_ptr_equal(world.last_qp_pd, parent);
    assert_int_equal(dv.bf.size, 256); /* BlueFlame: its own register */
    /* A UD QP (the connection manager's) on a CQ of its own: another
     * domain. */
    world.num_modify = 0;
    ud_qp_open(dev, &cq[1], &qp[1], UCS_OK);
    assert_int_equal(world.tds, 2);
    assert_ptr_equal(world.last_qp_pd, world.last_parent);
    assert_ptr_not_equal(world.last_parent, parent);
    assert_int_equal(vqp_dev_qp_destroy(qp[1]), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq[1]), UCS_OK);
    assert_int_equal(world.tds, 1);

    /* No thread domain left: the CQ works, its QPs ring 8-byte doorbells
     * on the plain PD. */
    world.fail_alloc_td = ENOMEM;
    assert_int_equal(vqp_dev_cq_create(dev, 64, &plain, &dv_cq), UCS_OK);
    assert_int_equal(world.tds, 1);
    init.send_cq = plain;
    init.recv_cq = plain;
    assert_int_equal(vqp_dev_qp_create(dev, &init, &qp[1], &dv, &caps), UCS_OK);
    assert_ptr_equal(world.last_qp_pd, pd);
    assert_non_null(dv.bf.reg);
    assert_int_equal(dv.bf.size, 0);
    assert_int_equal(vqp_dev_qp_destroy(qp[1]), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(plain), UCS_OK);
    world.fail_alloc_td = 0;

    /* A parent domain refused: its thread domain goes back, as above. */
    world.fail_parent_domain = ENOMEM;
    plain                    = NULL;
    world.num_modify         = 0;
    ud_qp_open(dev, &plain, &qp[1], UCS_OK);
    assert_int_equal(world.tds, 1);
    assert_int_equal(world.parent_pds, 1);
    assert_ptr_equal(world.last_qp_pd, pd);
    assert_int_equal(vqp_dev_qp_destroy(qp[1]), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(plain), UCS_OK);
    world.fail_parent_domain = 0;

    /* A domain that cannot be freed is reported; the CQ is gone. */
    assert_int_equal(vqp_dev_qp_destroy(qp[0]), UCS_OK);
    world.fail_dealloc_td = EBUSY;
    assert_int_equal(vqp_dev_cq_destroy(cq[0]), UCS_OK);
    expect_log("ibv_dealloc_td");
    world.fail_dealloc_td = 0;
    assert_int_equal(world.tds, 0);
    assert_int_equal(world.pds, 1);
    assert_int_equal(world.cqs, 0);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
    assert_int_equal(world.pds, 0);
}

static void test_ud_ib(void **state)
{
    vqp_dev_cq_t *cq = NULL;
    struct mlx5_wqe_av av;
    vqp_dev_addr_t remote;
    vqp_dev_attr_t attr;
    vqp_dev_ah_t *ah;
    vqp_dev_qp_t *qp;
    vqp_dev_t *dev;

    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_OK);
    vqp_dev_query(dev, &attr);
    assert_int_equal(attr.max_ud_msg, 4096); /* the port's active MTU */
    world.num_modify = 0;
    ud_qp_open(dev, &cq, &qp, UCS_OK);
    assert_int_equal(world.last_qp_type, IBV_QPT_UD);
    assert_int_equal(vqp_dev_qp_state(qp), IBV_QPS_RTS);
    /* INIT with P_Key index 0, the port and the qkey; RTR; RTS with PSN. */
    assert_int_equal(world.num_modify, 3);
    assert_int_equal(world.modify[0].attr.qp_state, IBV_QPS_INIT);
    assert_int_equal(world.modify[0].mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
                                               IBV_QP_PORT | IBV_QP_QKEY);
    assert_int_equal(world.modify[0].attr.pkey_index, 0);
    assert_int_equal(world.modify[0].attr.port_num, 1);
    assert_int_equal(world.modify[0].attr.qkey, 0x1ee7);
    assert_int_equal(world.modify[1].attr.qp_state, IBV_QPS_RTR);
    assert_int_equal(world.modify[1].mask, IBV_QP_STATE);
    assert_int_equal(world.modify[2].attr.qp_state, IBV_QPS_RTS);
    assert_int_equal(world.modify[2].mask, IBV_QP_STATE | IBV_QP_SQ_PSN);
    assert_int_equal(world.modify[2].attr.sq_psn, 0);

    /* Same subnet, no GID: LID only. */
    memset(&remote, 0, sizeof(remote));
    remote.type   = VQP_DEV_ADDR_IB;
    remote.ib.lid = 0x42;
    assert_int_equal(vqp_dev_ah_create(dev, &remote, &ah, &av), UCS_OK);
    assert_int_equal(world.ah_attr.dlid, 0x42);
    assert_int_equal(world.ah_attr.port_num, 1);
    assert_int_equal(world.ah_attr.is_global, 0);
    assert_memory_equal(&av, &fake_av, sizeof(av));
    assert_int_equal(vqp_dev_close(dev), UCS_ERR_BUSY);
    expect_log("3 MRs/CQs/SRQs/QPs/AHs are still alive");
    world.fail_destroy_ah = EBUSY;
    assert_int_equal(vqp_dev_ah_destroy(ah), UCS_ERR_BUSY);
    expect_log("ibv_destroy_ah failed");
    world.fail_destroy_ah = 0;
    assert_int_equal(vqp_dev_ah_destroy(ah), UCS_OK);

    /* With the peer's GID (same subnet too): a GRH, our GID index 0. */
    remote.ib.has_gid                  = 1;
    remote.ib.gid.global.subnet_prefix = htobe64(0xfe80000000000000ull);
    remote.ib.gid.global.interface_id  = htobe64(0x99);
    assert_int_equal(vqp_dev_ah_create(dev, &remote, &ah, &av), UCS_OK);
    assert_int_equal(world.ah_attr.dlid, 0x42);
    assert_int_equal(world.ah_attr.is_global, 1);
    assert_memory_equal(&world.ah_attr.grh.dgid, &remote.ib.gid, 16);
    assert_int_equal(world.ah_attr.grh.sgid_index, 0);
    assert_int_equal(world.ah_attr.grh.hop_limit, 64);
    assert_int_equal(vqp_dev_ah_destroy(ah), UCS_OK);

    /* A UD QP is not connected. */
    {
        vqp_dev_qp_addr_t qa = {.dev = remote, .qpn = 0x55};

        assert_int_equal(vqp_dev_qp_connect(qp, &qa, NULL),
                         UCS_ERR_INVALID_PARAM);
        expect_log("UD QP");
    }
    assert_int_equal(vqp_dev_qp_destroy(qp), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_ud_roce(void **state)
{
    vqp_dev_cq_t *cq = NULL;
    struct mlx5_wqe_av av;
    vqp_dev_addr_t remote;
    vqp_dev_attr_t attr;
    vqp_dev_ah_t *ah;
    vqp_dev_qp_t *qp;
    vqp_dev_t *dev;

    assert_int_equal(vqp_dev_open("mlx5_1:1", NULL, &dev), UCS_OK);
    vqp_dev_query(dev, &attr);
    assert_int_equal(attr.max_ud_msg, 1024);
    ud_qp_open(dev, &cq, &qp, UCS_OK);
    memset(&remote, 0, sizeof(remote));
    remote.type             = VQP_DEV_ADDR_ROCE;
    remote.roce.gid.raw[10] = 0xff;
    remote.roce.gid.raw[11] = 0xff;
    remote.roce.gid.raw[12] = 10;
    remote.roce.gid.raw[15] = 9;
    assert_int_equal(vqp_dev_ah_create(dev, &remote, &ah, &av), UCS_OK);
    assert_int_equal(world.ah_attr.is_global, 1);
    assert_memory_equal(&world.ah_attr.grh.dgid, &remote.roce.gid, 16);
    assert_int_equal(world.ah_attr.grh.sgid_index, attr.gid_index);
    assert_int_equal(world.ah_attr.port_num, 1);
    assert_memory_equal(&av, &fake_av, sizeof(av));
    assert_int_equal(vqp_dev_ah_destroy(ah), UCS_OK);
    /* An IPv6 peer from an IPv4 GID: unreachable, no verbs call. */
    memset(&remote.roce.gid, 0, 16);
    remote.roce.gid.raw[0]  = 0xfe;
    remote.roce.gid.raw[1]  = 0x80;
    remote.roce.gid.raw[15] = 1;
    world.ah_attr.port_num  = 0;
    assert_int_equal(vqp_dev_ah_create(dev, &remote, &ah, &av),
                     UCS_ERR_UNREACHABLE);
    expect_log("unreachable");
    assert_int_equal(world.ah_attr.port_num, 0);
    assert_int_equal(vqp_dev_qp_destroy(qp), UCS_OK);
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

static void test_ud_failures(void **state)
{
    vqp_dev_cq_t *cq = NULL;
    struct mlx5_wqe_av av;
    vqp_dev_addr_t remote;
    vqp_dev_ah_t *ah;
    vqp_dev_qp_t *qp;
    vqp_dev_t *dev;
    static const struct {
        enum ibv_qp_state to;
        const char *text;
    } steps[] = {{IBV_QPS_INIT, "ibv_modify_qp(UD RESET -> INIT) failed"},
                 {IBV_QPS_RTR, "ibv_modify_qp(UD INIT -> RTR) failed"},
                 {IBV_QPS_RTS, "ibv_modify_qp(UD RTR -> RTS) failed"}};
    unsigned i;

    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_OK);
    world.fail_create_qp = ENOMEM;
    ud_qp_open(dev, &cq, &qp, UCS_ERR_NO_MEMORY);
    expect_log("ibv_create_qp(UD, sq 32, rq 32, inline 64) failed");
    world.fail_create_qp = 0;
    world.fail_init_obj  = EIO;
    ud_qp_open(dev, &cq, &qp, UCS_ERR_IO_ERROR);
    expect_log("mlx5dv_init_obj(QP) failed");
    world.fail_init_obj = 0;
    assert_int_equal(world.qps, 0);
    for (i = 0; i < 3; ++i) {
        world.fail_modify_to    = steps[i].to;
        world.fail_modify_errno = EINVAL;
        ud_qp_open(dev, &cq, &qp, UCS_ERR_INVALID_PARAM);
        expect_log(steps[i].text);
        assert_int_equal(world.qps, 0); /* destroyed again */
    }
    world.fail_modify_to = 0;

    memset(&remote, 0, sizeof(remote));
    remote.type          = VQP_DEV_ADDR_IB;
    remote.ib.lid        = 0x42;
    world.fail_create_ah = ENOMEM;
    assert_int_equal(vqp_dev_ah_create(dev, &remote, &ah, &av),
                     UCS_ERR_NO_MEMORY);
    expect_log("ibv_create_ah(IB, dlid 66, grh 0) failed");
    world.fail_create_ah   = 0;
    world.fail_init_obj_ah = EOPNOTSUPP;
    assert_int_equal(vqp_dev_ah_create(dev, &remote, &ah, &av),
                     UCS_ERR_UNSUPPORTED);
    expect_log("mlx5dv_init_obj(AH) failed");
    world.fail_init_obj_ah = 0;
    assert_int_equal(world.ahs, 0);
    assert_int_equal(vqp_dev_cq_destroy(cq), UCS_OK);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
}

/* ------------------------------------------------------------ ext atomics */


/* atomic_be_sizes of the last open_ext_atomic_sizes() */
static uint32_t last_be_sizes;

/* Opens mlx5_0:1 (which must work whatever DevX does) and returns its
 * ext_atomic_sizes; the DevX context is gone afterwards. */
static uint32_t open_ext_atomic_sizes(void)
{
    vqp_dev_attr_t attr;
    vqp_dev_t *dev;

    world.devx_cmds = 0;
    assert_int_equal(vqp_dev_open("mlx5_0:1", NULL, &dev), UCS_OK);
    vqp_dev_query(dev, &attr);
    assert_int_equal(vqp_dev_close(dev), UCS_OK);
    assert_int_equal(world.open_ctx, 0);
    last_be_sizes = attr.atomic_be_sizes;
    return attr.ext_atomic_sizes;
}

static void test_ext_atomics(void **state)
{
    /* The default fake HCA: both pages read, 4 bytes only (8-byte replies in
     * host order). */
    assert_int_equal(open_ext_atomic_sizes(), 4);
    assert_int_equal(last_be_sizes, 4); /* 8-byte fetches in host order */
    assert_int_equal(world.devx_opens, 1);
    assert_int_equal(world.devx_flags, MLX5DV_CONTEXT_FLAGS_DEVX);
    assert_string_equal(world.devx_dev, "mlx5_0");
    assert_int_equal(world.devx_cmds, 2);
    assert_int_equal(world.devx_op_mod[0], 0x1); /* general, current values */
    assert_int_equal(world.devx_op_mod[1], 0x7); /* atomic (3 << 1), current */

    /* Big-endian 8-byte replies: both sizes. */
    world.cap_endian = 0;
    assert_int_equal(open_ext_atomic_sizes(), 4 | 8);
    assert_int_equal(last_be_sizes, 4 | 8);
    world.cap_size_qp = 0x8;
    assert_int_equal(open_ext_atomic_sizes(), 8);
    world.cap_size_qp = 0x3; /* 1 and 2 bytes: nothing the data path posts */
    assert_int_equal(open_ext_atomic_sizes(), 0);
    world.cap_size_qp = 0xc;
    /* Masked CS without masked FA, or no masked operations: none. */
    world.cap_ops = 0x7;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    world.cap_ops = 0x3;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    assert_int_equal(world.devx_cmds, 2);
    world.cap_ops = 0xf;
    /* No atomics at all: the atomic page is not asked for. */
    world.cap_atomic = 0;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    assert_int_equal(world.devx_cmds, 1);
    assert_int_equal(test_log_count, 0);

    /* The RoCE device goes the same way, on its own device. */
    world.cap_atomic = 1;
    world.devx_cmds  = 0;
    {
        vqp_dev_attr_t attr;
        vqp_dev_t *dev;

        assert_int_equal(vqp_dev_open("mlx5_1:1", NULL, &dev), UCS_OK);
        vqp_dev_query(dev, &attr);
        assert_int_equal(attr.ext_atomic_sizes, 4 | 8);
        assert_string_equal(world.devx_dev, "mlx5_1");
        assert_int_equal(vqp_dev_close(dev), UCS_OK);
    }
}

static void test_ext_atomics_failures(void **state)
{
    test_debug_start();

    /* No DevX (old kernel or firmware): none, the device works. */
    world.devx_open_errno = EOPNOTSUPP;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    assert_int_equal(world.devx_cmds, 0);
    expect_debug_consume(
        "mlx5_0:1: no DevX context (mlx5dv_open_device: Operation "
        "not supported)");
    world.devx_open_errno = 0;

    /* The command refused as unsupported or not permitted: debug only. */
    world.devx_ret[0] = -1;
    world.devx_errno  = EPROTONOSUPPORT;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    expect_debug_consume("mlx5_0:1: DevX QUERY_HCA_CAP(general) not available: "
                         "Protocol not supported");
    /* A provider that returns the error instead of setting errno. */
    world.devx_ret[0] = EPERM;
    world.devx_errno  = EIO;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    expect_debug_consume("QUERY_HCA_CAP(general) not available: Operation not "
                         "permitted");
    assert_int_equal(test_log_count, 0);

    /* Any other failure is worth a warning; the device still opens. */
    world.devx_ret[0] = -1;
    world.devx_errno  = EIO;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    expect_log("mlx5_0:1: DevX QUERY_HCA_CAP(general) failed: Input/output "
               "error; no extended atomics");
    assert_int_equal(world.devx_cmds, 1);
    world.devx_ret[0] = 0;
    world.devx_ret[1] = -1;
    world.devx_errno  = ENOMEM;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    expect_log("mlx5_0:1: DevX QUERY_HCA_CAP(atomic) failed: Cannot allocate "
               "memory");
    world.devx_ret[1] = 0;

    /* The firmware answers with an error status. */
    world.devx_status[0] = 0x2;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    expect_log("mlx5_0:1: QUERY_HCA_CAP(general) failed: status 0x2, "
               "syndrome 0xab0000cd");
    assert_int_equal(world.devx_cmds, 1);
    world.devx_status[0] = 0;
    world.devx_status[1] = 0x3;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    expect_log("mlx5_0:1: QUERY_HCA_CAP(atomic) failed: status 0x3, "
               "syndrome 0xab0000cd");
    world.devx_status[1] = 0;

    /* Closing the DevX context fails: logged, the sizes stand. */
    world.fail_devx_close = 1;
    assert_int_equal(open_ext_atomic_sizes(), 4);
    expect_log("mlx5_0:1: ibv_close_device(DevX context) failed");
    world.fail_devx_close = 0;

    /* And the reasons for leaving sizes out reach the debug log. */
    test_debug_text[0] = '\0';
    assert_int_equal(open_ext_atomic_sizes(), 4);
    expect_debug_consume("mlx5_0:1: 8-byte atomics reply in host order");
    world.cap_atomic = 0;
    assert_int_equal(open_ext_atomic_sizes(), 0);
    expect_debug_consume("mlx5_0:1: the HCA does no atomics");
    test_debug_stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_no_kernel_support, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_enumeration, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_open_ib, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_roce_gid_selection, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_queues, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_queue_create_errors, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_connect_ib, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_connect_roce, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_thread_domains, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_ud_ib, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_ud_roce, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_ud_failures, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_modify_failure, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_ext_atomics, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(test_ext_atomics_failures, world_setup,
                                        world_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
