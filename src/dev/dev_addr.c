/*
 * Device and QP addresses: their packed wire forms and the reachability
 * rules. Every packed form starts with the address type byte, so a peer of
 * another kind (IB, RoCE, software) is recognised, never misread. Multi-byte
 * fields are big-endian on the wire, whatever the hosts are.
 */
#include <config.h>

#include "dev_int.h"

#include <ucs/debug/log.h>
#include <ucs/sys/compiler_def.h>
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* IB port without a GID: LID only (the common single-subnet fabric). */
typedef struct UCS_S_PACKED vqp_dev_packed_ib {
    uint8_t type;
    uint8_t flags; /* VQP_DEV_PACKED_IB_GID: a GID follows */
    uint16_t lid;
} vqp_dev_packed_ib_t;

typedef struct UCS_S_PACKED vqp_dev_packed_gid {
    uint8_t raw[16];
} vqp_dev_packed_gid_t;

typedef struct UCS_S_PACKED vqp_dev_packed_roce {
    uint8_t type;
    vqp_dev_packed_gid_t gid;
} vqp_dev_packed_roce_t;

typedef struct UCS_S_PACKED vqp_dev_packed_sw {
    uint8_t type;
    uint32_t pid;
    uint32_t instance;
} vqp_dev_packed_sw_t;

/* The 24-bit QPN after the device address. */
typedef struct UCS_S_PACKED vqp_dev_packed_qpn {
    uint8_t hi;
    uint16_t lo;
} vqp_dev_packed_qpn_t;

enum { VQP_DEV_PACKED_IB_GID = 1u << 0 };

/* Default IB subnet prefix (fe80::/64): no routing needed. */
#define VQP_DEV_IB_DEFAULT_SUBNET 0xfe80000000000000ull

_Static_assert(sizeof(vqp_dev_packed_ib_t) + sizeof(vqp_dev_packed_gid_t) <=
                   VQP_DEV_ADDR_PACKED_MAX,
               "IB address too large");
_Static_assert(sizeof(vqp_dev_packed_roce_t) <= VQP_DEV_ADDR_PACKED_MAX,
               "RoCE address too large");
_Static_assert(sizeof(vqp_dev_packed_sw_t) <= VQP_DEV_ADDR_PACKED_MAX,
               "software address too large");
_Static_assert(sizeof(vqp_dev_packed_qpn_t) + VQP_DEV_ADDR_PACKED_MAX ==
                   VQP_DEV_QP_ADDR_PACKED_MAX,
               "QP address size");

static const char *vqp_dev_addr_type_str(unsigned type)
{
    switch (type) {
    case VQP_DEV_ADDR_IB:
        return "InfiniBand";
    case VQP_DEV_ADDR_ROCE:
        return "RoCE";
    case VQP_DEV_ADDR_SW:
        return "software";
    default:
        return "unknown";
    }
}

const char *vqp_dev_addr_str(const vqp_dev_addr_t *addr, char *buf, size_t max)
{
    char gid[INET6_ADDRSTRLEN]; /* inet_ntop cannot fail into this */

    if (max == 0) {
        return buf;
    }
    switch (addr->type) {
    case VQP_DEV_ADDR_IB:
        if (addr->ib.has_gid) {
            inet_ntop(AF_INET6, addr->ib.gid.raw, gid, sizeof(gid));
            snprintf(buf, max, "lid 0x%x gid %s", addr->ib.lid, gid);
        } else {
            snprintf(buf, max, "lid 0x%x", addr->ib.lid);
        }
        break;
    case VQP_DEV_ADDR_ROCE:
        inet_ntop(AF_INET6, addr->roce.gid.raw, gid, sizeof(gid));
        snprintf(buf, max, "gid %s", gid);
        break;
    case VQP_DEV_ADDR_SW:
        snprintf(buf, max, "sw pid %u instance %u", addr->sw.pid,
                 addr->sw.instance);
        break;
    default:
        snprintf(buf, max, "unknown address type 0x%x", (unsigned)addr->type);
        break;
    }
    return buf;
}

static int vqp_dev_gid_is_zero(const union ibv_gid *gid)
{
    static const union ibv_gid zero;

    return !memcmp(gid->raw, zero.raw, sizeof(zero.raw));
}

/* ::ffff:a.b.c.d, the form of a RoCE v2 GID built from an IPv4 address. */
static int vqp_dev_gid_is_ipv4(const union ibv_gid *gid)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0,    0,
                                       0, 0, 0, 0, 0xff, 0xff};

    return !memcmp(gid->raw, prefix, sizeof(prefix));
}

static uint64_t vqp_dev_ib_subnet(const vqp_dev_addr_t *addr)
{
    return addr->ib.has_gid ? be64toh(addr->ib.gid.global.subnet_prefix)
                            : VQP_DEV_IB_DEFAULT_SUBNET;
}

size_t vqp_dev_addr_packed_size(const vqp_dev_addr_t *addr)
{
    switch (addr->type) {
    case VQP_DEV_ADDR_IB:
        return sizeof(vqp_dev_packed_ib_t) +
               (addr->ib.has_gid ? sizeof(vqp_dev_packed_gid_t) : 0);
    case VQP_DEV_ADDR_ROCE:
        return sizeof(vqp_dev_packed_roce_t);
    case VQP_DEV_ADDR_SW:
        return sizeof(vqp_dev_packed_sw_t);
    default:
        return 0;
    }
}

size_t vqp_dev_qp_addr_packed_size(const vqp_dev_qp_addr_t *addr)
{
    size_t size = vqp_dev_addr_packed_size(&addr->dev);

    return (size == 0) ? 0 : size + sizeof(vqp_dev_packed_qpn_t);
}

static ucs_status_t vqp_dev_addr_check(const vqp_dev_addr_t *addr)
{
    switch (addr->type) {
    case VQP_DEV_ADDR_IB:
        if (addr->ib.lid == 0) {
            ucs_error("InfiniBand address with LID 0 (port not configured by "
                      "a subnet manager)");
            return UCS_ERR_INVALID_PARAM;
        }
        return UCS_OK;
    case VQP_DEV_ADDR_ROCE:
        if (vqp_dev_gid_is_zero(&addr->roce.gid)) {
            ucs_error("RoCE address with an all-zero GID");
            return UCS_ERR_INVALID_PARAM;
        }
        return UCS_OK;
    case VQP_DEV_ADDR_SW:
        if (addr->sw.pid == 0) {
            ucs_error("software device address with process id 0");
            return UCS_ERR_INVALID_PARAM;
        }
        return UCS_OK;
    default:
        ucs_error("device address of unknown type 0x%x", (unsigned)addr->type);
        return UCS_ERR_INVALID_PARAM;
    }
}

ucs_status_t vqp_dev_addr_pack(const vqp_dev_addr_t *addr, void *buf,
                               size_t max, size_t *len_p)
{
    vqp_dev_packed_roce_t *roce;
    vqp_dev_packed_ib_t *ib;
    vqp_dev_packed_sw_t *sw;
    ucs_status_t status;
    size_t size;

    if ((addr == NULL) || (buf == NULL) || (len_p == NULL)) {
        ucs_error("vqp_dev_addr_pack: NULL argument");
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_dev_addr_check(addr);
    if (status != UCS_OK) {
        return status;
    }
    size = vqp_dev_addr_packed_size(addr);
    if (max < size) {
        ucs_error("%s device address needs %zu bytes, buffer has %zu",
                  vqp_dev_addr_type_str(addr->type), size, max);
        return UCS_ERR_BUFFER_TOO_SMALL;
    }

    switch (addr->type) {
    case VQP_DEV_ADDR_IB:
        ib        = buf;
        ib->type  = VQP_DEV_ADDR_IB;
        ib->flags = addr->ib.has_gid ? VQP_DEV_PACKED_IB_GID : 0;
        ib->lid   = htobe16(addr->ib.lid);
        if (addr->ib.has_gid) {
            memcpy(ib + 1, addr->ib.gid.raw, sizeof(vqp_dev_packed_gid_t));
        }
        break;
    case VQP_DEV_ADDR_ROCE:
        roce       = buf;
        roce->type = VQP_DEV_ADDR_ROCE;
        memcpy(roce->gid.raw, addr->roce.gid.raw, sizeof(roce->gid.raw));
        break;
    default: /* VQP_DEV_ADDR_SW, checked above */
        sw           = buf;
        sw->type     = VQP_DEV_ADDR_SW;
        sw->pid      = htobe32(addr->sw.pid);
        sw->instance = htobe32(addr->sw.instance);
        break;
    }
    *len_p = size;
    return UCS_OK;
}

static ucs_status_t vqp_dev_addr_truncated(unsigned type, size_t len,
                                           size_t need)
{
    ucs_error("%s device address truncated: %zu bytes, needs %zu",
              vqp_dev_addr_type_str(type), len, need);
    return UCS_ERR_INVALID_ADDR;
}

ucs_status_t vqp_dev_addr_unpack(const void *buf, size_t len,
                                 vqp_dev_addr_t *addr, size_t *used_p)
{
    const vqp_dev_packed_roce_t *roce;
    const vqp_dev_packed_ib_t *ib;
    const vqp_dev_packed_sw_t *sw;
    size_t need;
    uint8_t type;

    if ((buf == NULL) || (addr == NULL)) {
        ucs_error("vqp_dev_addr_unpack: NULL argument");
        return UCS_ERR_INVALID_PARAM;
    }
    if (len < 1) {
        ucs_error("empty device address");
        return UCS_ERR_INVALID_ADDR;
    }

    memset(addr, 0, sizeof(*addr));
    type = *(const uint8_t *)buf;
    switch (type) {
    case VQP_DEV_ADDR_IB:
        ib   = buf;
        need = sizeof(*ib);
        if (len < need) {
            return vqp_dev_addr_truncated(type, len, need);
        }
        if (ib->flags & ~VQP_DEV_PACKED_IB_GID) {
            ucs_error("InfiniBand device address with unknown flags 0x%x",
                      ib->flags);
            return UCS_ERR_INVALID_ADDR;
        }
        addr->ib.lid     = be16toh(ib->lid);
        addr->ib.has_gid = !!(ib->flags & VQP_DEV_PACKED_IB_GID);
        if (addr->ib.has_gid) {
            need += sizeof(vqp_dev_packed_gid_t);
            if (len < need) {
                return vqp_dev_addr_truncated(type, len, need);
            }
            memcpy(addr->ib.gid.raw, ib + 1, sizeof(addr->ib.gid.raw));
        }
        break;
    case VQP_DEV_ADDR_ROCE:
        roce = buf;
        need = sizeof(*roce);
        if (len < need) {
            return vqp_dev_addr_truncated(type, len, need);
        }
        memcpy(addr->roce.gid.raw, roce->gid.raw, sizeof(addr->roce.gid.raw));
        break;
    case VQP_DEV_ADDR_SW:
        sw   = buf;
        need = sizeof(*sw);
        if (len < need) {
            return vqp_dev_addr_truncated(type, len, need);
        }
        addr->sw.pid      = be32toh(sw->pid);
        addr->sw.instance = be32toh(sw->instance);
        break;
    default:
        ucs_error("device address of unknown type 0x%02x (not an rc_vqp "
                  "address, or from an incompatible version)",
                  type);
        return UCS_ERR_INVALID_ADDR;
    }
    addr->type = (vqp_dev_addr_type_t)type;

    if (vqp_dev_addr_check(addr) != UCS_OK) {
        return UCS_ERR_INVALID_ADDR;
    }
    if (used_p != NULL) {
        *used_p = need;
    }
    return UCS_OK;
}

ucs_status_t vqp_dev_qp_addr_pack(const vqp_dev_qp_addr_t *addr, void *buf,
                                  size_t max, size_t *len_p)
{
    vqp_dev_packed_qpn_t *qpn;
    ucs_status_t status;
    size_t len;

    if ((addr == NULL) || (buf == NULL) || (len_p == NULL)) {
        ucs_error("vqp_dev_qp_addr_pack: NULL argument");
        return UCS_ERR_INVALID_PARAM;
    }
    if (addr->qpn > 0xffffff) {
        ucs_error("QPN 0x%x does not fit 24 bits", addr->qpn);
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_dev_addr_pack(&addr->dev, buf, max, &len);
    if (status != UCS_OK) {
        return status;
    }
    if (max - len < sizeof(*qpn)) {
        ucs_error("QP address needs %zu bytes, buffer has %zu",
                  len + sizeof(*qpn), max);
        return UCS_ERR_BUFFER_TOO_SMALL;
    }
    qpn     = UCS_PTR_BYTE_OFFSET(buf, len);
    qpn->hi = addr->qpn >> 16;
    qpn->lo = htobe16(addr->qpn & 0xffff);
    *len_p  = len + sizeof(*qpn);
    return UCS_OK;
}

ucs_status_t vqp_dev_qp_addr_unpack(const void *buf, size_t len,
                                    vqp_dev_qp_addr_t *addr, size_t *used_p)
{
    const vqp_dev_packed_qpn_t *qpn;
    ucs_status_t status;
    size_t used;

    if ((buf == NULL) || (addr == NULL)) {
        ucs_error("vqp_dev_qp_addr_unpack: NULL argument");
        return UCS_ERR_INVALID_PARAM;
    }
    status = vqp_dev_addr_unpack(buf, len, &addr->dev, &used);
    if (status != UCS_OK) {
        return status;
    }
    if (len - used < sizeof(*qpn)) {
        ucs_error("QP address truncated: %zu bytes, needs %zu", len,
                  used + sizeof(*qpn));
        return UCS_ERR_INVALID_ADDR;
    }
    qpn       = UCS_PTR_BYTE_OFFSET(buf, used);
    addr->qpn = ((uint32_t)qpn->hi << 16) | be16toh(qpn->lo);
    if (used_p != NULL) {
        *used_p = used + sizeof(*qpn);
    }
    return UCS_OK;
}

int vqp_dev_sw_peer_gone(const vqp_dev_addr_t *remote)
{
    return (remote->type == VQP_DEV_ADDR_SW) &&
           (kill((pid_t)remote->sw.pid, 0) != 0) && (errno == ESRCH);
}

ucs_status_t vqp_dev_is_reachable(const vqp_dev_t *dev,
                                  const vqp_dev_addr_t *remote)
{
    const vqp_dev_addr_t *local = &dev->addr;

    if (vqp_dev_addr_check(remote) != UCS_OK) {
        return UCS_ERR_UNREACHABLE;
    }
    if (remote->type != local->type) {
        ucs_debug("%s: a %s device cannot reach a %s peer", dev->attr.name,
                  vqp_dev_addr_type_str(local->type),
                  vqp_dev_addr_type_str(remote->type));
        return UCS_ERR_UNREACHABLE;
    }

    switch (remote->type) {
    case VQP_DEV_ADDR_IB:
        /* Another subnet is reached through a router, which needs the
         * peer's GID in a GRH. */
        if ((vqp_dev_ib_subnet(local) != vqp_dev_ib_subnet(remote)) &&
            !remote->ib.has_gid) {
            ucs_debug("%s: IB peer LID %u is in another subnet and sent no "
                      "GID",
                      dev->attr.name, remote->ib.lid);
            return UCS_ERR_UNREACHABLE;
        }
        return UCS_OK;
    case VQP_DEV_ADDR_ROCE:
        /* A RoCE v2 packet is either IPv4 or IPv6 on both ends. */
        if (vqp_dev_gid_is_ipv4(&local->roce.gid) !=
            vqp_dev_gid_is_ipv4(&remote->roce.gid)) {
            ucs_debug("%s: RoCE GID families differ (local %s, remote %s)",
                      dev->attr.name,
                      vqp_dev_gid_is_ipv4(&local->roce.gid) ? "IPv4" : "IPv6",
                      vqp_dev_gid_is_ipv4(&remote->roce.gid) ? "IPv4" : "IPv6");
            return UCS_ERR_UNREACHABLE;
        }
        return UCS_OK;
    default: /* VQP_DEV_ADDR_SW: peers are processes on this host */
        if (vqp_dev_sw_peer_gone(remote)) {
            ucs_debug("%s: software peer process %u does not exist",
                      dev->attr.name, remote->sw.pid);
            return UCS_ERR_UNREACHABLE;
        }
        return UCS_OK;
    }
}
