/*
 * Hardware smoke test for device control (run by contrib/hw-smoke.sh): opens
 * the first mlx5 port, connects two RC QPs on it in loopback (RoCE: on two
 * different UDP source ports) and does one RDMA write with a hand-built WQE,
 * then checks the data and the CQE; then a second write with completion
 * events: the CQ armed, the event fd must fire (hardware: a completion
 * channel event; the software device runs its engine only when progressed, so
 * there the check is that the arm sees the CQE and re-arming settles it). With
 * no mlx5 device it says so and exits 0. "--sw" runs the same steps on the
 * software device, which keeps this program tested on machines without HCAs.
 *
 * Usage: vqp_dev_smoke [--sw] [device]   (device e.g. mlx5_0:1)
 * Exit: 0 passed or no device, 1 failed.
 */
#include <config.h>

#include <dev/vqp_dev.h>

#include "dev_wqe.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMOKE_LEN     4096
#define SMOKE_CQE     64
#define SMOKE_TIMEOUT 5.0 /* seconds */

#define SMOKE_CHECK(_cond, ...)                                     \
    do {                                                            \
        if (!(_cond)) {                                             \
            fprintf(stderr, "vqp_dev_smoke: FAILED: " __VA_ARGS__); \
            fprintf(stderr, "\n");                                  \
            exit(1);                                                \
        }                                                           \
    } while (0)

/* Picks the device: the one named; with --sw the software device; else the
 * first active mlx5 port. Returns 0 when there is none. */
static int smoke_pick(int use_sw, const char *wanted, char *name)
{
    vqp_dev_info_t *list;
    unsigned count, i;
    int found = 0;

    if (wanted != NULL) {
        snprintf(name, VQP_DEV_NAME_MAX, "%s", wanted);
        return 1;
    }
    SMOKE_CHECK(vqp_dev_list(use_sw ? VQP_DEV_LIST_SW : 0, &list, &count) ==
                    UCS_OK,
                "vqp_dev_list");
    for (i = 0; (i < count) && !found; ++i) {
        if ((list[i].link == VQP_DEV_LINK_SW) == !!use_sw) {
            snprintf(name, VQP_DEV_NAME_MAX, "%s", list[i].name);
            found = 1;
        }
    }
    vqp_dev_list_free(list);
    return found;
}

int main(int argc, char **argv)
{
    const unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                            IBV_ACCESS_REMOTE_READ;
    char name[VQP_DEV_NAME_MAX];
    vqp_dev_qp_init_t init = {};
    vqp_dev_connect_params_t params;
    vqp_dev_qp_caps_t caps[2];
    vqp_dev_qp_addr_t addr[2];
    struct mlx5dv_qp dv_qp[2];
    struct mlx5dv_cq dv_cq;
    struct mlx5_cqe64 *cqe = NULL;
    vqp_dev_mr_t *src_mr, *dst_mr;
    vqp_dev_qp_t *qp[2];
    vqp_dev_cq_t *cq;
    vqp_dev_attr_t attr;
    uint32_t lkey, rkey, unused;
    const char *wanted = NULL;
    int use_sw         = 0, i;
    int opcode;
    char *src, *dst;
    vqp_dev_t *dev;

    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--sw")) {
            use_sw = 1;
        } else if (argv[i][0] != '-') {
            wanted = argv[i];
        } else {
            fprintf(stderr, "usage: %s [--sw] [device]\n", argv[0]);
            return 1;
        }
    }
    if (!smoke_pick(use_sw, wanted, name)) {
        printf("vqp_dev_smoke: no mlx5 device found, nothing to test\n");
        return 0;
    }

    SMOKE_CHECK(vqp_dev_open(name, NULL, &dev) == UCS_OK, "open %s", name);
    vqp_dev_query(dev, &attr);
    printf("vqp_dev_smoke: %s: link %s, MTU %u, %.1f Gb/s, max_qp_wr %u, "
           "max_sge %u, max_inline %u, max_msg_sz %llu\n",
           attr.name,
           (attr.link == VQP_DEV_LINK_IB)         ? "InfiniBand"
           : (attr.link == VQP_DEV_LINK_ETHERNET) ? "Ethernet (RoCE)"
                                                  : "software",
           attr.path_mtu, attr.bandwidth * 8 / 1e9, attr.max_qp_wr,
           attr.max_sge, attr.max_inline, (unsigned long long)attr.max_msg_sz);

    src = aligned_alloc(4096, SMOKE_LEN);
    dst = aligned_alloc(4096, SMOKE_LEN);
    SMOKE_CHECK((src != NULL) && (dst != NULL), "out of memory");
    for (i = 0; i < SMOKE_LEN; ++i) {
        src[i] = (char)(i * 7 + 3);
    }
    memset(dst, 0, SMOKE_LEN);
    SMOKE_CHECK(vqp_dev_mr_reg(dev, src, SMOKE_LEN, access, &src_mr, &lkey,
                               &unused) == UCS_OK,
                "register source buffer");
    SMOKE_CHECK(vqp_dev_mr_reg(dev, dst, SMOKE_LEN, access, &dst_mr, &unused,
                               &rkey) == UCS_OK,
                "register destination buffer");
    SMOKE_CHECK(vqp_dev_cq_create(dev, SMOKE_CQE, &cq, &dv_cq) == UCS_OK,
                "create CQ");
    SMOKE_CHECK(dv_cq.cqe_size == 64, "CQE size %u, expected 64",
                dv_cq.cqe_size);

    init.send_cq      = cq;
    init.recv_cq      = cq;
    init.max_send_wr  = 16;
    init.max_send_sge = 1;
    init.max_recv_wr  = 16;
    init.max_recv_sge = 1;
    for (i = 0; i < 2; ++i) {
        SMOKE_CHECK(vqp_dev_qp_create(dev, &init, &qp[i], &dv_qp[i],
                                      &caps[i]) == UCS_OK,
                    "create QP %d", i);
        vqp_dev_address(dev, &addr[i].dev);
        addr[i].qpn = caps[i].qpn;
    }
    /* A ConnectX gives the QPs of one CQ its thread domain's register (the
     * same address), or none of BlueFlame size (8-byte doorbells). */
    printf("vqp_dev_smoke: QPs 0x%x and 0x%x: BlueFlame %u and %u bytes, "
           "register %p and %p\n",
           caps[0].qpn, caps[1].qpn, dv_qp[0].bf.size, dv_qp[1].bf.size,
           dv_qp[0].bf.reg, dv_qp[1].bf.reg);
    /* Loopback: each QP is the other's peer; distinct source ports on RoCE. */
    vqp_dev_connect_params_default(&params);
    for (i = 0; i < 2; ++i) {
        params.udp_sport_index = i;
        SMOKE_CHECK(vqp_dev_qp_connect(qp[i], &addr[1 - i], &params) == UCS_OK,
                    "connect QP 0x%x to QP 0x%x", caps[i].qpn, caps[1 - i].qpn);
        printf("vqp_dev_smoke: QP 0x%x -> QP 0x%x in RTS, UDP source port "
               "%u\n",
               caps[i].qpn, caps[1 - i].qpn, vqp_dev_qp_udp_sport(qp[i]));
    }

    /* On RoCE the two QPs must leave on different UDP source ports, unless
     * the NIC cannot set them (both 0). */
    if ((attr.link == VQP_DEV_LINK_ETHERNET) &&
        (vqp_dev_qp_udp_sport(qp[0]) != 0)) {
        SMOKE_CHECK(vqp_dev_qp_udp_sport(qp[0]) != vqp_dev_qp_udp_sport(qp[1]),
                    "both QPs got UDP source port %u",
                    vqp_dev_qp_udp_sport(qp[0]));
    }

    dev_wqe_post_write(&dv_qp[0], caps[0].qpn, 0, src, lkey, dst, rkey,
                       SMOKE_LEN);
    opcode = dev_wqe_poll(&dev, 1, &dv_cq, 0, SMOKE_TIMEOUT, &cqe);
    SMOKE_CHECK(opcode >= 0, "no completion within %.0f s", SMOKE_TIMEOUT);
    if (opcode != MLX5_CQE_REQ) {
        SMOKE_CHECK(0, "completion opcode %d, syndrome 0x%x", opcode,
                    ((struct mlx5_err_cqe *)cqe)->syndrome);
    }
    SMOKE_CHECK((be32toh(cqe->sop_drop_qpn) & 0xffffff) == caps[0].qpn,
                "CQE for QP 0x%x, expected 0x%x",
                be32toh(cqe->sop_drop_qpn) & 0xffffff, caps[0].qpn);
    SMOKE_CHECK(be16toh(cqe->wqe_counter) == 0, "CQE wqe_counter %u",
                be16toh(cqe->wqe_counter));
    SMOKE_CHECK(!memcmp(src, dst, SMOKE_LEN), "destination data differs");
    printf("vqp_dev_smoke: RDMA write of %d bytes verified on %s\n", SMOKE_LEN,
           attr.name);

    if (attr.comp_events) {
        struct pollfd pfd = {.events = POLLIN};
        ucs_status_t status;

        SMOKE_CHECK(vqp_dev_event_fd(dev, &pfd.fd) == UCS_OK, "event fd");
        status = vqp_dev_event_arm(dev);
        SMOKE_CHECK(status == UCS_OK, "device arm: %s",
                    ucs_status_string(status));
        SMOKE_CHECK(vqp_dev_cq_arm(cq, 1, 0) == UCS_OK, "arm CQ");
        memset(dst, 0, SMOKE_LEN);
        dev_wqe_post_write(&dv_qp[0], caps[0].qpn, 1, src, lkey, dst, rkey,
                           SMOKE_LEN);
        if (attr.link != VQP_DEV_LINK_SW) {
            /* The HCA completes it on its own: sleep until the event. */
            SMOKE_CHECK(poll(&pfd, 1, (int)(SMOKE_TIMEOUT * 1000)) == 1,
                        "no completion event within %.0f s", SMOKE_TIMEOUT);
        }
        opcode = dev_wqe_poll(&dev, 1, &dv_cq, 1, SMOKE_TIMEOUT, &cqe);
        SMOKE_CHECK(opcode == MLX5_CQE_REQ, "second write: opcode %d", opcode);
        SMOKE_CHECK(!memcmp(src, dst, SMOKE_LEN), "second write: data differs");
        /* The event (hardware) or the CQE past the armed index (software)
         * makes the next arm busy; armed again past it, the device is idle. */
        status = vqp_dev_event_arm(dev);
        SMOKE_CHECK(status == UCS_ERR_BUSY, "arm after the event: %s",
                    ucs_status_string(status));
        SMOKE_CHECK(vqp_dev_cq_arm(cq, 2, 0) == UCS_OK, "re-arm CQ");
        status = vqp_dev_event_arm(dev);
        SMOKE_CHECK(status == UCS_OK, "arm when idle: %s",
                    ucs_status_string(status));
        printf("vqp_dev_smoke: completion event verified on %s\n", attr.name);
    } else {
        printf("vqp_dev_smoke: %s has no completion events\n", attr.name);
    }

    for (i = 0; i < 2; ++i) {
        SMOKE_CHECK(vqp_dev_qp_destroy(qp[i]) == UCS_OK, "destroy QP");
    }
    SMOKE_CHECK(vqp_dev_cq_destroy(cq) == UCS_OK, "destroy CQ");
    SMOKE_CHECK(vqp_dev_mr_dereg(src_mr) == UCS_OK, "deregister");
    SMOKE_CHECK(vqp_dev_mr_dereg(dst_mr) == UCS_OK, "deregister");
    SMOKE_CHECK(vqp_dev_close(dev) == UCS_OK, "close");
    free(src);
    free(dst);
    printf("vqp_dev_smoke: PASSED\n");
    return 0;
}
