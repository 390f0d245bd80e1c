/*
 * The QUERY_HCA_CAP parsers of dev_hw_caps.c on hand-built command outputs:
 * fields written byte by byte at their PRM positions (worked out here from
 * the bit offsets, independently of the parser's tables), every combination
 * of operations, operand sizes and reply byte order that decides the
 * extended atomic sizes, neighbouring and reserved bits that must not count,
 * and short, missing and failed outputs.
 */
#include <config.h>

#include <dev/dev_int.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>
#include <ucs/config/global_opts.h>

#include "test_dev_log.h"

/*
 * Output layout: status byte 0, syndrome bytes 4..7 (big-endian), the
 * capability page from byte 16. Page bit b is in page byte b / 8, mask
 * 0x80 >> (b % 8):
 *   general  atomic                         bit 0x21e: byte 16 + 67, 0x02
 *            (roce 0x21d: 0x04, extended_retry_count 0x21f: 0x01)
 *   atomic   atomic_req_8B_endianness_mode bits 0x40-0x41: byte 16 + 8,
 *            the top two bits
 *            atomic_operations bits 0x90-0x9f: bytes 16 + 18, 19 (BE)
 *            atomic_size_qp    bits 0xb0-0xbf: bytes 16 + 22, 23 (BE)
 *            atomic_size_dc    bits 0xd0-0xdf: bytes 16 + 26, 27 (BE)
 */
#define OUT_LEN       (16 + 4096)
#define GEN_ATOMIC    (16 + 67)
#define GEN_MIN_LEN   (16 + 68) /* through the dword holding "atomic" */
#define AT_ENDIAN     (16 + 8)
#define AT_OPS        (16 + 18)
#define AT_SIZE_QP    (16 + 22)
#define AT_SIZE_DC    (16 + 26)
#define AT_MIN_LEN    (16 + 24) /* through the dword of atomic_size_qp */
#define OPS_CS        0x1
#define OPS_FA        0x2
#define OPS_MASKED_CS 0x4
#define OPS_MASKED_FA 0x8
#define OPS_ALL       (OPS_CS | OPS_FA | OPS_MASKED_CS | OPS_MASKED_FA)

static uint8_t out[OUT_LEN];

static void put16(unsigned at, uint16_t value)
{
    out[at]     = value >> 8;
    out[at + 1] = value & 0xff;
}

/* An atomic page: @a fill for every reserved bit, then the fields. */
static void atomic_page(uint8_t fill, uint16_t ops, uint16_t size_qp,
                        uint16_t size_dc, unsigned endian)
{
    memset(out, fill, sizeof(out));
    memset(out, 0, 16); /* status OK, syndrome 0 */
    out[AT_ENDIAN] = (out[AT_ENDIAN] & 0x3f) | (endian << 6);
    put16(AT_OPS, ops);
    put16(AT_SIZE_QP, size_qp);
    put16(AT_SIZE_DC, size_dc);
}

static uint32_t parse_atomic(void)
{
    uint32_t sizes = 0xdead;

    assert_int_equal(
        vqp_dev_hw_caps_parse_atomic("hca", out, sizeof(out), &sizes), UCS_OK);
    return sizes;
}


/* ------------------------------------------------------------ general */

static void test_general_atomic_bit(void **state)
{
    int atomic = -1;

    memset(out, 0, sizeof(out));
    out[GEN_ATOMIC] = 0x02;
    assert_int_equal(
        vqp_dev_hw_caps_parse_general("hca", out, sizeof(out), &atomic),
        UCS_OK);
    assert_int_equal(atomic, 1);

    /* Its neighbours (roce, extended_retry_count) and every other bit set,
     * the atomic bit clear. */
    memset(out, 0xff, sizeof(out));
    memset(out, 0, 16);
    out[GEN_ATOMIC] = 0xfd;
    assert_int_equal(
        vqp_dev_hw_caps_parse_general("hca", out, sizeof(out), &atomic),
        UCS_OK);
    assert_int_equal(atomic, 0);

    /* Only the dword holding the bit is needed. */
    memset(out, 0, sizeof(out));
    out[GEN_ATOMIC] = 0x02;
    assert_int_equal(
        vqp_dev_hw_caps_parse_general("hca", out, GEN_MIN_LEN, &atomic),
        UCS_OK);
    assert_int_equal(atomic, 1);
    assert_int_equal(test_log_count, 0);
}

static void test_general_malformed(void **state)
{
    int atomic = -1;

    memset(out, 0, sizeof(out));
    out[GEN_ATOMIC] = 0x02;
    assert_int_equal(
        vqp_dev_hw_caps_parse_general("hca", out, GEN_MIN_LEN - 1, &atomic),
        UCS_ERR_INVALID_PARAM);
    expect_log("hca: QUERY_HCA_CAP(general) output of 83 bytes is too short: "
               "atomic needs 84");
    assert_int_equal(vqp_dev_hw_caps_parse_general("hca", out, 0, &atomic),
                     UCS_ERR_INVALID_PARAM);
    expect_log("output of 0 bytes is too short");
    assert_int_equal(
        vqp_dev_hw_caps_parse_general("hca", NULL, sizeof(out), &atomic),
        UCS_ERR_INVALID_PARAM);
    expect_log("hca: QUERY_HCA_CAP(general): no output buffer");

    /* A failed command: the page means nothing. */
    out[0] = 0x02; /* BAD_OP */
    out[4] = 0x0a;
    out[7] = 0x5b;
    assert_int_equal(
        vqp_dev_hw_caps_parse_general("hca", out, sizeof(out), &atomic),
        UCS_ERR_IO_ERROR);
    expect_log("hca: QUERY_HCA_CAP(general) failed: status 0x2, syndrome "
               "0xa00005b");
    assert_int_equal(atomic, -1); /* untouched on every error */
}

/* ------------------------------------------------------------ atomic */

static void test_atomic_sizes(void **state)
{
    /* What a ConnectX under Linux reports: the kernel sets 8-byte replies to
     * host order, which the data path cannot read; 4-byte ones stay BE. */
    atomic_page(0, OPS_ALL, 0x0c, 0x0c, 1);
    assert_int_equal(parse_atomic(), 4);
    /* Big-endian 8-byte replies: both sizes. */
    atomic_page(0, OPS_ALL, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 4 | 8);
    /* One size only. */
    atomic_page(0, OPS_ALL, 0x08, 0x08, 0);
    assert_int_equal(parse_atomic(), 8);
    atomic_page(0, OPS_ALL, 0x04, 0x04, 1);
    assert_int_equal(parse_atomic(), 4);
    atomic_page(0, OPS_ALL, 0x08, 0x08, 1);
    assert_int_equal(parse_atomic(), 0);
    /* Sizes the data path does not post (1, 2, 16, 32 bytes) are ignored. */
    atomic_page(0, OPS_ALL, 0x3f, 0x3f, 0);
    assert_int_equal(parse_atomic(), 4 | 8);
    atomic_page(0, OPS_ALL, 0x33, 0x33, 0);
    assert_int_equal(parse_atomic(), 0);
    /* Reserved endianness modes are not big-endian either. */
    atomic_page(0, OPS_ALL, 0x0c, 0x0c, 2);
    assert_int_equal(parse_atomic(), 4);
    atomic_page(0, OPS_ALL, 0x0c, 0x0c, 3);
    assert_int_equal(parse_atomic(), 4);
    assert_int_equal(test_log_count, 0);
}

static void test_atomic_operations(void **state)
{
    /* Both masked forms are needed; the basic ones are not posted. */
    atomic_page(0, OPS_CS | OPS_FA | OPS_MASKED_CS, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 0);
    atomic_page(0, OPS_CS | OPS_FA | OPS_MASKED_FA, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 0);
    atomic_page(0, OPS_CS | OPS_FA, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 0);
    atomic_page(0, OPS_MASKED_CS | OPS_MASKED_FA, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 4 | 8);
    /* Unknown operation bits do not matter. */
    atomic_page(0, 0xfff0 | OPS_MASKED_CS | OPS_MASKED_FA, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 4 | 8);
    atomic_page(0, 0xfff3, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 0);
}

static void test_atomic_field_positions(void **state)
{
    /* RC QPs go by atomic_size_qp, never atomic_size_dc. */
    atomic_page(0, OPS_ALL, 0x0c, 0x00, 0);
    assert_int_equal(parse_atomic(), 4 | 8);
    atomic_page(0, OPS_ALL, 0x00, 0x0c, 0);
    assert_int_equal(parse_atomic(), 0);
    atomic_page(0, OPS_ALL, 0x04, 0x0c, 0);
    assert_int_equal(parse_atomic(), 4);

    /* Every reserved bit set (among them supported_atomic_req_8B_
     * endianness_mode_1 and the upper halves of the operation and size
     * dwords): only the fields count. */
    atomic_page(0xff, OPS_ALL, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 4 | 8);
    atomic_page(0xff, OPS_ALL, 0x0c, 0x0c, 1);
    assert_int_equal(parse_atomic(), 4);
    atomic_page(0xff, 0, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 0);
    atomic_page(0xff, OPS_ALL, 0, 0xffff, 0);
    assert_int_equal(parse_atomic(), 0);

    /* The mode is the top two bits of its byte: bit 0x41 alone is mode 1. */
    atomic_page(0, OPS_ALL, 0x0c, 0x0c, 0);
    out[AT_ENDIAN] = 0x40;
    assert_int_equal(parse_atomic(), 4);
    out[AT_ENDIAN] = 0x3f;
    assert_int_equal(parse_atomic(), 4 | 8);
}

static void test_atomic_debug_reasons(void **state)
{
    test_debug_start();
    atomic_page(0, OPS_ALL, 0x0c, 0x0c, 1);
    assert_int_equal(parse_atomic(), 4);
    atomic_page(0, OPS_CS | OPS_FA, 0x0c, 0x0c, 0);
    assert_int_equal(parse_atomic(), 0);
    test_debug_stop();
    expect_debug("hca: 8-byte atomics reply in host order (endianness mode "
                 "1), the data path expects big-endian");
    expect_debug("hca: atomic_operations 0x3 lack masked CS and FA");
    expect_debug("atomic_size_qp 0xc, endianness mode 1: extended atomics on "
                 "sizes 0x4");
}

static void test_atomic_malformed(void **state)
{
    uint32_t sizes = 0xdead;

    atomic_page(0, OPS_ALL, 0x0c, 0x0c, 0);
    assert_int_equal(
        vqp_dev_hw_caps_parse_atomic("hca", out, AT_MIN_LEN, &sizes), UCS_OK);
    assert_int_equal(sizes, 4 | 8);

    sizes = 0xdead;
    assert_int_equal(
        vqp_dev_hw_caps_parse_atomic("hca", out, AT_MIN_LEN - 1, &sizes),
        UCS_ERR_INVALID_PARAM);
    expect_log("hca: QUERY_HCA_CAP(atomic) output of 39 bytes is too short: "
               "atomic_size_qp needs 40");
    assert_int_equal(vqp_dev_hw_caps_parse_atomic("hca", out, 16, &sizes),
                     UCS_ERR_INVALID_PARAM);
    expect_log("output of 16 bytes is too short");
    assert_int_equal(
        vqp_dev_hw_caps_parse_atomic("hca", NULL, sizeof(out), &sizes),
        UCS_ERR_INVALID_PARAM);
    expect_log("hca: QUERY_HCA_CAP(atomic): no output buffer");

    out[0] = 0x03; /* BAD_PARAM, e.g. a page the HCA does not have */
    out[4] = 0x12;
    out[5] = 0x34;
    out[6] = 0x56;
    out[7] = 0x78;
    assert_int_equal(
        vqp_dev_hw_caps_parse_atomic("hca", out, sizeof(out), &sizes),
        UCS_ERR_IO_ERROR);
    expect_log("hca: QUERY_HCA_CAP(atomic) failed: status 0x3, syndrome "
               "0x12345678");
    assert_int_equal(sizes, 0xdead); /* untouched on every error */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_general_atomic_bit, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test_setup_teardown(test_general_malformed, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test_setup_teardown(test_atomic_sizes, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test_setup_teardown(test_atomic_operations, test_log_setup,
                                        test_log_teardown),
        cmocka_unit_test_setup_teardown(test_atomic_field_positions,
                                        test_log_setup, test_log_teardown),
        cmocka_unit_test_setup_teardown(test_atomic_debug_reasons,
                                        test_log_setup, test_log_teardown),
        cmocka_unit_test_setup_teardown(test_atomic_malformed, test_log_setup,
                                        test_log_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
