/*
 * Device and QP addresses: packed sizes, round trips of every kind, the type
 * byte, every malformed input, reachability rules (on fake devices built
 * from the internal header, so IB and RoCE are covered without hardware) and
 * the UDP source port spreading.
 */
#include <config.h>

#include <dev/dev_int.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <endian.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_dev_log.h"

static vqp_dev_addr_t addr_ib(uint16_t lid, uint64_t subnet)
{
    vqp_dev_addr_t addr;

    memset(&addr, 0, sizeof(addr));
    addr.type   = VQP_DEV_ADDR_IB;
    addr.ib.lid = lid;
    if (subnet != 0) {
        addr.ib.has_gid                  = 1;
        addr.ib.gid.global.subnet_prefix = htobe64(subnet);
        addr.ib.gid.global.interface_id  = htobe64(0x0002c90300a1b2c3ull);
    }
    return addr;
}

static vqp_dev_addr_t addr_roce(int ipv4, uint8_t last)
{
    vqp_dev_addr_t addr;

    memset(&addr, 0, sizeof(addr));
    addr.type = VQP_DEV_ADDR_ROCE;
    if (ipv4) {
        addr.roce.gid.raw[10] = 0xff;
        addr.roce.gid.raw[11] = 0xff;
        addr.roce.gid.raw[12] = 192;
        addr.roce.gid.raw[13] = 168;
    } else {
        addr.roce.gid.raw[0] = 0xfe;
        addr.roce.gid.raw[1] = 0x80;
    }
    addr.roce.gid.raw[15] = last;
    return addr;
}

static vqp_dev_addr_t addr_sw(uint32_t pid, uint32_t instance)
{
    vqp_dev_addr_t addr;

    memset(&addr, 0, sizeof(addr));
    addr.type        = VQP_DEV_ADDR_SW;
    addr.sw.pid      = pid;
    addr.sw.instance = instance;
    return addr;
}

/* Packs, checks size and type byte, unpacks, compares field by field. */
static void check_round_trip(const vqp_dev_addr_t *addr, size_t expect_size,
                             uint32_t qpn)
{
    uint8_t buf[VQP_DEV_QP_ADDR_PACKED_MAX + 8];
    vqp_dev_qp_addr_t qp_addr, out;
    size_t len, used;

    assert_int_equal(vqp_dev_addr_packed_size(addr), expect_size);
    memset(buf, 0xa5, sizeof(buf));
    assert_int_equal(vqp_dev_addr_pack(addr, buf, sizeof(buf), &len), UCS_OK);
    assert_int_equal(len, expect_size);
    assert_int_equal(buf[0], addr->type);
    assert_int_equal(buf[len], 0xa5); /* nothing written past the end */

    qp_addr.dev = *addr;
    qp_addr.qpn = qpn;
    assert_int_equal(vqp_dev_qp_addr_packed_size(&qp_addr), expect_size + 3);
    assert_int_equal(vqp_dev_qp_addr_pack(&qp_addr, buf, sizeof(buf), &len),
                     UCS_OK);
    assert_int_equal(len, expect_size + 3);
    assert_true(len <= VQP_DEV_QP_ADDR_PACKED_MAX);

    memset(&out, 0x5a, sizeof(out));
    assert_int_equal(vqp_dev_qp_addr_unpack(buf, len, &out, &used), UCS_OK);
    assert_int_equal(used, len);
    assert_int_equal(out.qpn, qpn);
    assert_int_equal(out.dev.type, addr->type);
    switch (addr->type) {
    case VQP_DEV_ADDR_IB:
        assert_int_equal(out.dev.ib.lid, addr->ib.lid);
        assert_int_equal(out.dev.ib.has_gid, addr->ib.has_gid);
        if (addr->ib.has_gid) {
            assert_memory_equal(out.dev.ib.gid.raw, addr->ib.gid.raw, 16);
        }
        break;
    case VQP_DEV_ADDR_ROCE:
        assert_memory_equal(out.dev.roce.gid.raw, addr->roce.gid.raw, 16);
        break;
    default:
        assert_int_equal(out.dev.sw.pid, addr->sw.pid);
        assert_int_equal(out.dev.sw.instance, addr->sw.instance);
        break;
    }

    /* A longer buffer (an address followed by more data) is fine too. */
    assert_int_equal(vqp_dev_qp_addr_unpack(buf, sizeof(buf), &out, &used),
                     UCS_OK);
    assert_int_equal(used, len);
}

static void test_round_trips(void **state)
{
    vqp_dev_addr_t ib_local = addr_ib(0x1234, 0);
    vqp_dev_addr_t ib_gid   = addr_ib(0xbfff, 0xfec0000000001234ull);
    vqp_dev_addr_t roce4    = addr_roce(1, 7);
    vqp_dev_addr_t roce6    = addr_roce(0, 9);
    vqp_dev_addr_t sw       = addr_sw(0x7fffabcd, 0xdeadbeef);

    check_round_trip(&ib_local, 4, 0xabcdef);
    check_round_trip(&ib_gid, 20, 0x000001);
    check_round_trip(&roce4, 17, 0xffffff);
    check_round_trip(&roce6, 17, 0x123456);
    check_round_trip(&sw, 9, 0);
    assert_int_equal(VQP_DEV_QP_ADDR_PACKED_MAX, 23);
}

static void test_wire_is_big_endian(void **state)
{
    vqp_dev_qp_addr_t addr = {.dev = addr_sw(0x01020304, 0x05060708),
                              .qpn = 0x0a0b0c};
    const uint8_t expect[] = {
        VQP_DEV_ADDR_SW, 1, 2, 3, 4, 5, 6, 7, 8, 0xa, 0xb, 0xc};
    uint8_t buf[32];
    size_t len;

    assert_int_equal(vqp_dev_qp_addr_pack(&addr, buf, sizeof(buf), &len),
                     UCS_OK);
    assert_int_equal(len, sizeof(expect));
    assert_memory_equal(buf, expect, sizeof(expect));
}

static void test_kinds_never_confused(void **state)
{
    vqp_dev_addr_t kinds[3] = {addr_ib(5, 0), addr_roce(1, 1), addr_sw(1, 0)};
    uint8_t buf[3][VQP_DEV_ADDR_PACKED_MAX];
    vqp_dev_addr_t out;
    size_t len;
    int i;

    for (i = 0; i < 3; ++i) {
        assert_int_equal(
            vqp_dev_addr_pack(&kinds[i], buf[i], sizeof(buf[i]), &len), UCS_OK);
        assert_int_equal(vqp_dev_addr_unpack(buf[i], len, &out, NULL), UCS_OK);
        assert_int_equal(out.type, kinds[i].type);
    }
    assert_int_not_equal(buf[0][0], buf[1][0]);
    assert_int_not_equal(buf[0][0], buf[2][0]);
    assert_int_not_equal(buf[1][0], buf[2][0]);
}

static void test_pack_errors(void **state)
{
    vqp_dev_addr_t addr = addr_ib(0x10, 0xfec0000000000001ull);
    vqp_dev_qp_addr_t qp_addr;
    uint8_t buf[64];
    size_t len;

    /* Too small by one byte, for the device and for the QPN part. */
    memset(buf, 0xa5, sizeof(buf));
    assert_int_equal(vqp_dev_addr_pack(&addr, buf, 19, &len),
                     UCS_ERR_BUFFER_TOO_SMALL);
    expect_log("needs 20 bytes, buffer has 19");
    assert_int_equal(buf[0], 0xa5);

    qp_addr.dev = addr;
    qp_addr.qpn = 1;
    assert_int_equal(vqp_dev_qp_addr_pack(&qp_addr, buf, 22, &len),
                     UCS_ERR_BUFFER_TOO_SMALL);
    expect_log("QP address needs 23 bytes, buffer has 22");

    qp_addr.qpn = 0x1000000;
    assert_int_equal(vqp_dev_qp_addr_pack(&qp_addr, buf, sizeof(buf), &len),
                     UCS_ERR_INVALID_PARAM);
    expect_log("does not fit 24 bits");

    addr = addr_ib(0, 0);
    assert_int_equal(vqp_dev_addr_pack(&addr, buf, sizeof(buf), &len),
                     UCS_ERR_INVALID_PARAM);
    expect_log("LID 0");

    addr = addr_roce(1, 0);
    memset(&addr.roce.gid, 0, sizeof(addr.roce.gid));
    assert_int_equal(vqp_dev_addr_pack(&addr, buf, sizeof(buf), &len),
                     UCS_ERR_INVALID_PARAM);
    expect_log("all-zero GID");

    addr = addr_sw(0, 1);
    assert_int_equal(vqp_dev_addr_pack(&addr, buf, sizeof(buf), &len),
                     UCS_ERR_INVALID_PARAM);
    expect_log("process id 0");

    addr.type = (vqp_dev_addr_type_t)0x42;
    assert_int_equal(vqp_dev_addr_packed_size(&addr), 0);
    assert_int_equal(vqp_dev_addr_pack(&addr, buf, sizeof(buf), &len),
                     UCS_ERR_INVALID_PARAM);
    expect_log("unknown type 0x42");

    assert_int_equal(vqp_dev_addr_pack(NULL, buf, sizeof(buf), &len),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL argument");
    assert_int_equal(vqp_dev_qp_addr_pack(&qp_addr, NULL, 0, &len),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL argument");
}

static void test_unpack_errors(void **state)
{
    vqp_dev_addr_t kinds[3] = {addr_ib(9, 0xfec0000000000001ull),
                               addr_roce(0, 3), addr_sw(getpid(), 2)};
    vqp_dev_qp_addr_t qp_addr, out;
    uint8_t buf[64];
    size_t len, cut;
    int i;

    /* Every truncation of every kind is refused. */
    for (i = 0; i < 3; ++i) {
        qp_addr.dev = kinds[i];
        qp_addr.qpn = 0x42;
        assert_int_equal(vqp_dev_qp_addr_pack(&qp_addr, buf, sizeof(buf), &len),
                         UCS_OK);
        for (cut = 0; cut < len; ++cut) {
            assert_int_equal(vqp_dev_qp_addr_unpack(buf, cut, &out, NULL),
                             UCS_ERR_INVALID_ADDR);
            assert_true(test_log_last[0] != '\0');
            test_log_last[0] = '\0';
        }
    }
    assert_int_equal(vqp_dev_addr_unpack(buf, 0, &out.dev, NULL),
                     UCS_ERR_INVALID_ADDR);
    expect_log("empty device address");

    /* Cut inside the IB GID, and inside the QPN. */
    qp_addr.dev = kinds[0];
    vqp_dev_qp_addr_pack(&qp_addr, buf, sizeof(buf), &len);
    assert_int_equal(vqp_dev_addr_unpack(buf, 10, &out.dev, NULL),
                     UCS_ERR_INVALID_ADDR);
    expect_log("InfiniBand device address truncated: 10 bytes, needs 20");
    assert_int_equal(vqp_dev_qp_addr_unpack(buf, 21, &out, NULL),
                     UCS_ERR_INVALID_ADDR);
    expect_log("QP address truncated: 21 bytes, needs 23");

    /* Unknown IB flags. */
    buf[1] |= 0x80;
    assert_int_equal(vqp_dev_addr_unpack(buf, len, &out.dev, NULL),
                     UCS_ERR_INVALID_ADDR);
    expect_log("unknown flags 0x81");

    /* Unknown type byte, e.g. garbage or another transport's address. */
    buf[0] = 0x00;
    assert_int_equal(vqp_dev_qp_addr_unpack(buf, len, &out, NULL),
                     UCS_ERR_INVALID_ADDR);
    expect_log("unknown type 0x00");

    /* Well-formed but invalid contents. */
    memset(buf, 0, sizeof(buf));
    buf[0] = VQP_DEV_ADDR_ROCE;
    assert_int_equal(vqp_dev_addr_unpack(buf, 17, &out.dev, NULL),
                     UCS_ERR_INVALID_ADDR);
    expect_log("all-zero GID");
    buf[0] = VQP_DEV_ADDR_IB;
    assert_int_equal(vqp_dev_addr_unpack(buf, 4, &out.dev, NULL),
                     UCS_ERR_INVALID_ADDR);
    expect_log("LID 0");
    buf[0] = VQP_DEV_ADDR_SW;
    assert_int_equal(vqp_dev_addr_unpack(buf, 9, &out.dev, NULL),
                     UCS_ERR_INVALID_ADDR);
    expect_log("process id 0");

    assert_int_equal(vqp_dev_addr_unpack(NULL, 9, &out.dev, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL argument");
    assert_int_equal(vqp_dev_qp_addr_unpack(buf, 9, NULL, NULL),
                     UCS_ERR_INVALID_PARAM);
    expect_log("NULL argument");
}

/* A device object with just a name and an address: enough for the
 * reachability rules, which look at nothing else. */
static vqp_dev_t fake_dev(vqp_dev_addr_t addr)
{
    vqp_dev_t dev;

    memset(&dev, 0, sizeof(dev));
    strcpy(dev.attr.name, "fake:1");
    dev.addr = addr;
    return dev;
}

static void test_reachability(void **state)
{
    vqp_dev_t ib    = fake_dev(addr_ib(1, 0));
    vqp_dev_t ib_rt = fake_dev(addr_ib(1, 0xfec0000000000001ull));
    vqp_dev_t roce4 = fake_dev(addr_roce(1, 1));
    vqp_dev_t roce6 = fake_dev(addr_roce(0, 1));
    vqp_dev_t sw    = fake_dev(addr_sw(getpid(), 0));
    vqp_dev_addr_t r;
    pid_t child;
    int status;

    /* Same kind, same subnet / family: reachable. */
    r = addr_ib(2, 0);
    assert_int_equal(vqp_dev_is_reachable(&ib, &r), UCS_OK);
    r = addr_ib(2, 0xfec0000000000001ull);
    assert_int_equal(vqp_dev_is_reachable(&ib_rt, &r), UCS_OK);
    /* Other subnet with a GID: routed, reachable. */
    r = addr_ib(2, 0xfec0000000000002ull);
    assert_int_equal(vqp_dev_is_reachable(&ib_rt, &r), UCS_OK);
    assert_int_equal(vqp_dev_is_reachable(&ib, &r), UCS_OK);
    /* Other subnet without a GID: no way to route. */
    r = addr_ib(2, 0);
    assert_int_equal(vqp_dev_is_reachable(&ib_rt, &r), UCS_ERR_UNREACHABLE);

    r = addr_roce(1, 2);
    assert_int_equal(vqp_dev_is_reachable(&roce4, &r), UCS_OK);
    assert_int_equal(vqp_dev_is_reachable(&roce6, &r), UCS_ERR_UNREACHABLE);
    r = addr_roce(0, 2);
    assert_int_equal(vqp_dev_is_reachable(&roce6, &r), UCS_OK);
    assert_int_equal(vqp_dev_is_reachable(&roce4, &r), UCS_ERR_UNREACHABLE);

    /* Kinds never mix. */
    r = addr_sw(getpid(), 1);
    assert_int_equal(vqp_dev_is_reachable(&sw, &r), UCS_OK);
    assert_int_equal(vqp_dev_is_reachable(&ib, &r), UCS_ERR_UNREACHABLE);
    assert_int_equal(vqp_dev_is_reachable(&roce4, &r), UCS_ERR_UNREACHABLE);
    r = addr_ib(2, 0);
    assert_int_equal(vqp_dev_is_reachable(&sw, &r), UCS_ERR_UNREACHABLE);
    assert_int_equal(vqp_dev_is_reachable(&roce4, &r), UCS_ERR_UNREACHABLE);
    r = addr_roce(1, 2);
    assert_int_equal(vqp_dev_is_reachable(&ib, &r), UCS_ERR_UNREACHABLE);

    /* A software peer whose process has exited. */
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        _exit(0);
    }
    assert_int_equal(waitpid(child, &status, 0), child);
    r = addr_sw(child, 0);
    assert_int_equal(vqp_dev_is_reachable(&sw, &r), UCS_ERR_UNREACHABLE);

    /* Invalid addresses are unreachable too. */
    r = addr_sw(0, 0);
    assert_int_equal(vqp_dev_is_reachable(&sw, &r), UCS_ERR_UNREACHABLE);
    expect_log("process id 0");
}

static void test_udp_sport(void **state)
{
    uint8_t seen[0x4000] = {0};
    unsigned i;
    uint16_t sport;

    /* 16384 consecutive indices: all in the dynamic range, all distinct. */
    for (i = 0; i < 0x4000; ++i) {
        sport = vqp_dev_udp_sport(0x1234, i);
        assert_true(sport >= 0xC000);
        assert_int_equal(seen[sport - 0xC000], 0);
        seen[sport - 0xC000] = 1;
    }
    /* The base shifts the whole set, so virtual QPs can use different ports. */
    assert_int_not_equal(vqp_dev_udp_sport(0, 3), vqp_dev_udp_sport(16, 3));
    assert_int_equal(vqp_dev_udp_sport(0, 0x4000), vqp_dev_udp_sport(0, 0));
}

/* Log names: each kind says what identifies it; a short buffer truncates. */
static void test_addr_str(void **state)
{
    char buf[VQP_DEV_ADDR_STR_MAX], tiny[8];
    vqp_dev_addr_t addr;

    (void)state;
    addr = addr_ib(0x1a, 0);
    assert_string_equal(vqp_dev_addr_str(&addr, buf, sizeof(buf)), "lid 0x1a");
    addr = addr_ib(0x1a, 0xfe80000000000000ull);
    assert_string_equal(vqp_dev_addr_str(&addr, buf, sizeof(buf)),
                        "lid 0x1a gid fe80::2:c903:a1:b2c3");
    addr = addr_roce(1, 7);
    assert_string_equal(vqp_dev_addr_str(&addr, buf, sizeof(buf)),
                        "gid ::ffff:192.168.0.7");
    addr = addr_roce(0, 9);
    assert_string_equal(vqp_dev_addr_str(&addr, buf, sizeof(buf)),
                        "gid fe80::9");
    addr = addr_sw(4321, 2);
    assert_string_equal(vqp_dev_addr_str(&addr, buf, sizeof(buf)),
                        "sw pid 4321 instance 2");
    assert_string_equal(vqp_dev_addr_str(&addr, tiny, sizeof(tiny)), "sw pid ");
    addr.type = (vqp_dev_addr_type_t)0x33;
    assert_string_equal(vqp_dev_addr_str(&addr, buf, sizeof(buf)),
                        "unknown address type 0x33");
    /* No room at all: nothing written, the buffer comes back. */
    tiny[0] = 'x';
    assert_ptr_equal(vqp_dev_addr_str(&addr, tiny, 0), tiny);
    assert_int_equal(tiny[0], 'x');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_wire_is_big_endian),
        cmocka_unit_test(test_kinds_never_confused),
        cmocka_unit_test(test_pack_errors),
        cmocka_unit_test(test_unpack_errors),
        cmocka_unit_test(test_reachability),
        cmocka_unit_test(test_udp_sport),
        cmocka_unit_test(test_addr_str),
    };
    return cmocka_run_group_tests(tests, test_log_setup, test_log_teardown);
}
