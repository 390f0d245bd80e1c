/*
 * Extended (masked) atomic capabilities of an mlx5 HCA. Verbs does not report
 * them: they are in the HCA capability pages, read with the firmware command
 * QUERY_HCA_CAP through DevX (general capabilities: does the HCA do atomics;
 * atomic capabilities: which operations, which operand sizes on RC QPs, and
 * the byte order of 8-byte replies). The parsers are pure functions of the
 * command output so they can be tested on hand-built buffers; the query opens
 * a DevX context of its own, since the device's verbs context may not be one.
 */
#include <config.h>

#include "dev_int.h"

#include <ucs/debug/log.h>
#include <endian.h>
#include <errno.h>
#include <string.h>

/* QUERY_HCA_CAP command (PRM, rdma-core providers/mlx5/mlx5_ifc.h). */
#define VQP_HCA_CAP_OPCODE      0x100
#define VQP_HCA_CAP_OPMOD_CUR   0x1 /* current values, not the maximum */
#define VQP_HCA_CAP_TYPE_GEN    0x0 /* op_mod bits 15:1: capability page */
#define VQP_HCA_CAP_TYPE_ATOMIC 0x3
#define VQP_HCA_CAP_IN_LEN      16 /* opcode, uid, op_mod, function id */
/* Output: status (byte 0), syndrome (bytes 4..7), 8 reserved bytes, then
 * the 4096-byte capability page. */
#define VQP_HCA_CAP_OUT_HDR 16
#define VQP_HCA_CAP_OUT_LEN (VQP_HCA_CAP_OUT_HDR + 4096)

/*
 * Fields of the capability page as bit offset and width; bits are numbered
 * from the most significant bit of big-endian dword 0. None of them crosses
 * a dword.
 */
typedef struct vqp_hca_cap_field {
    unsigned bit; /* offset from the start of the page */
    unsigned width;
    const char *name;
} vqp_hca_cap_field_t;

/* cmd_hca_cap.atomic: the HCA executes RDMA atomics at all. */
static const vqp_hca_cap_field_t vqp_cap_gen_atomic = {0x21e, 1, "atomic"};
/* atomic_caps: reply byte order of 8-byte atomics (0: big-endian, 1: host
 * order; the kernel selects host order whenever the HCA offers it). */
static const vqp_hca_cap_field_t vqp_cap_atomic_endian = {
    0x40, 2, "atomic_req_8B_endianness_mode"};
/* atomic_caps: operations, bit 0 CS, 1 FA, 2 masked CS, 3 masked FA. */
static const vqp_hca_cap_field_t vqp_cap_atomic_ops = {0x90, 16,
                                                       "atomic_operations"};
/* atomic_caps: operand sizes on RC QPs, bit n: 2^n bytes. */
static const vqp_hca_cap_field_t vqp_cap_atomic_size_qp = {0xb0, 16,
                                                           "atomic_size_qp"};

#define VQP_ATOMIC_OPS_MASKED_CS (1u << 2)
#define VQP_ATOMIC_OPS_MASKED_FA (1u << 3)

/* Bytes of output that hold @a field. */
static size_t vqp_hca_cap_field_end(const vqp_hca_cap_field_t *field)
{
    return VQP_HCA_CAP_OUT_HDR + (field->bit / 32 + 1) * sizeof(uint32_t);
}

static uint32_t vqp_hca_cap_get(const uint8_t *out,
                                const vqp_hca_cap_field_t *field)
{
    uint32_t dword;

    memcpy(&dword, out + VQP_HCA_CAP_OUT_HDR + (field->bit / 32) * 4,
           sizeof(dword));
    return (be32toh(dword) >> (32 - field->width - field->bit % 32)) &
           (uint32_t)((1ull << field->width) - 1);
}

/* Common checks of an output: present, long enough for @a last (the field
 * furthest into the page), and a successful command. */
static ucs_status_t vqp_hca_cap_check(const char *name, const char *what,
                                      const void *out, size_t len,
                                      const vqp_hca_cap_field_t *last)
{
    const uint8_t *bytes = out;
    uint32_t syndrome;

    if (out == NULL) {
        ucs_error("%s: QUERY_HCA_CAP(%s): no output buffer", name, what);
        return UCS_ERR_INVALID_PARAM;
    }
    if (len < vqp_hca_cap_field_end(last)) {
        ucs_error("%s: QUERY_HCA_CAP(%s) output of %zu bytes is too short: "
                  "%s needs %zu",
                  name, what, len, last->name, vqp_hca_cap_field_end(last));
        return UCS_ERR_INVALID_PARAM;
    }
    if (bytes[0] != 0) {
        memcpy(&syndrome, bytes + 4, sizeof(syndrome));
        /* The device answered, just not with capabilities: not fatal to
         * the caller, who goes on without what it asked for. */
        ucs_warn("%s: QUERY_HCA_CAP(%s) failed: status 0x%x, syndrome 0x%x",
                 name, what, bytes[0], be32toh(syndrome));
        return UCS_ERR_IO_ERROR;
    }
    return UCS_OK;
}

ucs_status_t vqp_dev_hw_caps_parse_general(const char *name, const void *out,
                                           size_t len, int *atomic_p)
{
    ucs_status_t status;

    status = vqp_hca_cap_check(name, "general", out, len, &vqp_cap_gen_atomic);
    if (status != UCS_OK) {
        return status;
    }
    *atomic_p = vqp_hca_cap_get(out, &vqp_cap_gen_atomic);
    return UCS_OK;
}

ucs_status_t vqp_dev_hw_caps_parse_atomic(const char *name, const void *out,
                                          size_t len, uint32_t *sizes_p)
{
    ucs_status_t status;
    uint32_t ops, sizes, endian;

    status =
        vqp_hca_cap_check(name, "atomic", out, len, &vqp_cap_atomic_size_qp);
    if (status != UCS_OK) {
        return status;
    }
    ops    = vqp_hca_cap_get(out, &vqp_cap_atomic_ops);
    sizes  = vqp_hca_cap_get(out, &vqp_cap_atomic_size_qp);
    endian = vqp_hca_cap_get(out, &vqp_cap_atomic_endian);

    /* Every extended operation of the data path is a masked CS or masked FA
     * (swap, and, or, cswap32: CS; xor, fadd32: FA): both or none. */
    if ((ops & (VQP_ATOMIC_OPS_MASKED_CS | VQP_ATOMIC_OPS_MASKED_FA)) !=
        (VQP_ATOMIC_OPS_MASKED_CS | VQP_ATOMIC_OPS_MASKED_FA)) {
        ucs_debug("%s: atomic_operations 0x%x lack masked CS and FA: no "
                  "extended atomics",
                  name, ops);
        *sizes_p = 0;
        return UCS_OK;
    }
    /* 4-byte replies are always big-endian, 8-byte ones only in endianness
     * mode 0. The core reads either order (vqp_dev_attr_t.atomic_be_sizes)
     * for the basic atomics; the extended 8-byte ones stay limited to mode
     * 0 (conservative: this path never ran on a ConnectX). */
    sizes &= sizeof(uint32_t) | sizeof(uint64_t);
    if ((sizes & sizeof(uint64_t)) && (endian != 0)) {
        ucs_debug("%s: 8-byte atomics reply in %s (endianness mode %u), the "
                  "data path expects big-endian: no 8-byte extended atomics",
                  name, (endian == 1) ? "host order" : "an unknown order",
                  endian);
        sizes &= ~(uint32_t)sizeof(uint64_t);
    }
    ucs_debug("%s: atomic_operations 0x%x, atomic_size_qp 0x%x, endianness "
              "mode %u: extended atomics on sizes 0x%x",
              name, ops, vqp_hca_cap_get(out, &vqp_cap_atomic_size_qp), endian,
              sizes);
    *sizes_p = sizes;
    return UCS_OK;
}

/* Errors that mean "DevX will not do this for us" rather than a fault. */
static int vqp_devx_unsupported(int err)
{
    return (err == EOPNOTSUPP) || (err == EPROTONOSUPPORT) || (err == EPERM);
}

/* One QUERY_HCA_CAP of page @a type into @a out; logs and returns non-zero
 * if the command could not be run. */
static int vqp_dev_hw_query_hca_cap(struct ibv_context *devx, const char *name,
                                    unsigned type, const char *what, void *out)
{
    uint8_t in[VQP_HCA_CAP_IN_LEN] = {};
    uint16_t opcode                = htobe16(VQP_HCA_CAP_OPCODE);
    uint16_t op_mod = htobe16((type << 1) | VQP_HCA_CAP_OPMOD_CUR);
    int ret, err;

    memcpy(in, &opcode, sizeof(opcode));     /* bits 0x00..0x0f */
    memcpy(in + 6, &op_mod, sizeof(op_mod)); /* bits 0x30..0x3f */
    memset(out, 0, VQP_HCA_CAP_OUT_LEN);
    ret =
        mlx5dv_devx_general_cmd(devx, in, sizeof(in), out, VQP_HCA_CAP_OUT_LEN);
    if (ret == 0) {
        return 0;
    }
    /* Older providers return the error without setting errno. */
    err = (ret > 0) ? ret : errno;
    if (vqp_devx_unsupported(err)) {
        ucs_debug("%s: DevX QUERY_HCA_CAP(%s) not available: %s; no extended "
                  "atomics",
                  name, what, strerror(err));
    } else {
        ucs_warn("%s: DevX QUERY_HCA_CAP(%s) failed: %s; no extended atomics",
                 name, what, strerror(err));
    }
    return -1;
}

uint32_t vqp_dev_hw_ext_atomic_sizes(struct ibv_context *ctx, const char *name,
                                     uint32_t *be_sizes_p)
{
    struct mlx5dv_context_attr dv_attr = {.flags = MLX5DV_CONTEXT_FLAGS_DEVX};
    uint8_t out[VQP_HCA_CAP_OUT_LEN];
    struct ibv_context *devx;
    uint32_t sizes = 0;
    int atomic;

    devx = mlx5dv_open_device(ctx->device, &dv_attr);
    if (devx == NULL) {
        ucs_debug("%s: no DevX context (mlx5dv_open_device: %m): the HCA "
                  "capabilities cannot be read, no extended atomics",
                  name);
        return 0;
    }
    if ((vqp_dev_hw_query_hca_cap(devx, name, VQP_HCA_CAP_TYPE_GEN, "general",
                                  out) != 0) ||
        (vqp_dev_hw_caps_parse_general(name, out, sizeof(out), &atomic) !=
         UCS_OK)) {
        goto out;
    }
    if (!atomic) {
        ucs_debug("%s: the HCA does no atomics: no extended atomics", name);
        goto out;
    }
    if ((vqp_dev_hw_query_hca_cap(devx, name, VQP_HCA_CAP_TYPE_ATOMIC, "atomic",
                                  out) != 0) ||
        (vqp_dev_hw_caps_parse_atomic(name, out, sizeof(out), &sizes) !=
         UCS_OK)) {
        sizes = 0;
    } else {
        /* Checked long enough by the parser. Mode 0: big-endian replies;
         * otherwise 8-byte ones land in host order. */
        *be_sizes_p = sizeof(uint32_t) |
                      ((vqp_hca_cap_get(out, &vqp_cap_atomic_endian) == 0)
                           ? sizeof(uint64_t)
                           : 0);
    }
out:
    if (ibv_close_device(devx) != 0) {
        ucs_warn("%s: ibv_close_device(DevX context) failed: %m", name);
    }
    return sizes;
}
