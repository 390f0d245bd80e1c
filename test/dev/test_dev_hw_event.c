/*
 * Completion events of the hardware implementation (dev_hw_event.c, dev.c)
 * against a scripted fake of the verbs completion channel, linked in with ld
 * --wrap as test_dev_hw_mock does for the rest of verbs: the channel's fd is
 * made non-blocking, every event read is acknowledged on its CQ and advances
 * that CQ's arm sequence number, "nothing pending" ends the drain and any
 * other failure is an error with a log line; vqp_dev_cq_arm writes the mlx5
 * arm doorbell and its record with the sequence number, command and consumer
 * index; a device without events refuses every event call.
 */
#include <config.h>

#include "dev/dev_hw_event.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_dev_log.h"

#define MAX_EVENTS 8

static struct {
    int fail_create; /* ibv_create_comp_channel: NULL with this errno */
    int bad_fd;      /* hand out a channel whose fd is not open */
    unsigned channels;
    /* ibv_get_cq_event: these CQs, then fail with end_errno */
    unsigned n_events, next_event;
    struct ibv_cq *ev_cq[MAX_EVENTS];
    void *ev_ctx[MAX_EVENTS];
    int end_errno;
    unsigned eintr; /* EINTR this many times first */
    /* what the code under test did */
    unsigned acks[2];
    unsigned destroyed;
} world;

static struct ibv_cq fake_cq[2];

struct ibv_comp_channel *
__wrap_ibv_create_comp_channel(struct ibv_context *context);
int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *channel);
int __wrap_ibv_get_cq_event(struct ibv_comp_channel *channel,
                            struct ibv_cq **cq, void **cq_context);
void __wrap_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents);

struct ibv_comp_channel *
__wrap_ibv_create_comp_channel(struct ibv_context *context)
{
    struct ibv_comp_channel *channel;
    int p[2];

    if (world.fail_create) {
        errno = world.fail_create;
        return NULL;
    }
    channel = calloc(1, sizeof(*channel));
    assert_non_null(channel);
    channel->context = context;
    if (world.bad_fd) {
        channel->fd = 1000; /* not open */
    } else {
        assert_int_equal(pipe(p), 0);
        close(p[1]);
        channel->fd = p[0];
    }
    ++world.channels;
    return channel;
}

int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    if (!world.bad_fd) {
        close(channel->fd);
    }
    free(channel);
    --world.channels;
    ++world.destroyed;
    return 0;
}

int __wrap_ibv_get_cq_event(struct ibv_comp_channel *channel,
                            struct ibv_cq **cq, void **cq_context)
{
    /* The code reads events only from a non-blocking fd. */
    assert_true(fcntl(channel->fd, F_GETFL) & O_NONBLOCK);
    if (world.eintr > 0) {
        --world.eintr;
        errno = EINTR;
        return -1;
    }
    if (world.next_event == world.n_events) {
        errno = world.end_errno;
        return -1;
    }
    *cq         = world.ev_cq[world.next_event];
    *cq_context = world.ev_ctx[world.next_event];
    ++world.next_event;
    return 0;
}

void __wrap_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    assert_true((cq == &fake_cq[0]) || (cq == &fake_cq[1]));
    world.acks[cq - fake_cq] += nevents;
}

static int setup(void **state)
{
    memset(&world, 0, sizeof(world));
    world.end_errno = EAGAIN;
    return test_log_setup(state);
}

static int teardown(void **state)
{
    assert_int_equal(world.channels, 0); /* nothing leaked */
    return test_log_teardown(state);
}

static void add_event(unsigned i, vqp_dev_cq_t *cq)
{
    world.ev_cq[world.n_events]  = &fake_cq[i];
    world.ev_ctx[world.n_events] = cq;
    ++world.n_events;
}

static void test_channel_create(void **state)
{
    struct ibv_comp_channel *channel = NULL;

    assert_int_equal(vqp_dev_hw_channel_create(NULL, "mlx5_0:1",
                                               UCS_LOG_LEVEL_ERROR, &channel),
                     UCS_OK);
    assert_non_null(channel);
    assert_true(fcntl(channel->fd, F_GETFL) & O_NONBLOCK);
    assert_int_equal(world.channels, 1);
    vqp_dev_hw_channel_destroy(channel, "mlx5_0:1");
    assert_int_equal(world.destroyed, 1);
    vqp_dev_hw_channel_destroy(NULL, "mlx5_0:1"); /* none: nothing */
    assert_int_equal(world.destroyed, 1);
    assert_int_equal(test_log_count, 0);
}

static void test_channel_create_fails(void **state)
{
    struct ibv_comp_channel *channel = NULL;

    world.fail_create = ENOMEM;
    assert_int_equal(vqp_dev_hw_channel_create(NULL, "mlx5_0:1",
                                               UCS_LOG_LEVEL_ERROR, &channel),
                     UCS_ERR_IO_ERROR);
    expect_log("ibv_create_comp_channel failed");
    assert_null(channel);

    /* An fd that cannot be made non-blocking: the channel is given back. */
    world.fail_create = 0;
    world.bad_fd      = 1;
    assert_int_equal(vqp_dev_hw_channel_create(NULL, "mlx5_0:1",
                                               UCS_LOG_LEVEL_ERROR, &channel),
                     UCS_ERR_IO_ERROR);
    expect_log("non-blocking");
    assert_null(channel);
    assert_int_equal(world.destroyed, 1);
}

static void test_drain(void **state)
{
    struct ibv_comp_channel *channel;
    vqp_dev_cq_t cq[2];
    unsigned count = 99;

    memset(cq, 0, sizeof(cq));
    cq[1].arm_sn = 3;
    assert_int_equal(vqp_dev_hw_channel_create(NULL, "mlx5_0:1",
                                               UCS_LOG_LEVEL_ERROR, &channel),
                     UCS_OK);
    /* Nothing pending. */
    assert_int_equal(vqp_dev_hw_channel_drain(channel, "mlx5_0:1", &count),
                     UCS_OK);
    assert_int_equal(count, 0);

    /* Three events on two CQs, an EINTR on the way: each acknowledged on
     * its CQ, each advancing its CQ's sequence number (2 bits wrap in the
     * doorbell, the counter itself may grow). */
    add_event(0, &cq[0]);
    add_event(1, &cq[1]);
    add_event(0, &cq[0]);
    world.eintr = 1;
    assert_int_equal(vqp_dev_hw_channel_drain(channel, "mlx5_0:1", &count),
                     UCS_OK);
    assert_int_equal(count, 3);
    assert_int_equal(world.acks[0], 2);
    assert_int_equal(world.acks[1], 1);
    assert_int_equal(cq[0].arm_sn, 2);
    assert_int_equal(cq[1].arm_sn, 4);

    /* A read that fails for another reason is an error, after the events
     * before it were consumed. */
    add_event(1, &cq[1]);
    world.end_errno = EIO;
    assert_int_equal(vqp_dev_hw_channel_drain(channel, "mlx5_0:1", &count),
                     UCS_ERR_IO_ERROR);
    expect_log("ibv_get_cq_event");
    assert_int_equal(count, 1);
    assert_int_equal(world.acks[1], 2);
    vqp_dev_hw_channel_destroy(channel, "mlx5_0:1");
}

static void test_cq_arm_doorbell(void **state)
{
    uint64_t uar[8] __attribute__((aligned(64)));
    vqp_dev_t dev;
    vqp_dev_cq_t cq;
    __be32 dbrec[2];
    uint32_t val;

    memset(&dev, 0, sizeof(dev));
    memset(&cq, 0, sizeof(cq));
    memset(uar, 0, sizeof(uar));
    memset(dbrec, 0, sizeof(dbrec));
    strcpy(dev.attr.name, "mlx5_0:1");
    dev.attr.comp_events = 1;
    cq.dev               = &dev;
    cq.cqn               = 0x4a;
    cq.arm_uar           = (char *)uar;
    cq.arm_dbrec         = dbrec;
    cq.arm_sn            = 6; /* 2 in the doorbell's two bits */

    /* REQ_NOT: sequence number in bits 29:28, consumer index in 23:0; the
     * record holds the same word, the 8-byte doorbell adds the CQN. */
    assert_int_equal(vqp_dev_cq_arm(&cq, 0x1234567, 0), UCS_OK);
    val = (2u << 28) | MLX5_CQ_DB_REQ_NOT | 0x234567;
    assert_int_equal(be32toh(dbrec[1]), val);
    assert_int_equal(be64toh(uar[MLX5_CQ_DOORBELL / 8]),
                     ((uint64_t)val << 32) | 0x4a);
    assert_int_equal(dbrec[0], 0); /* the consumer index record untouched */

    assert_int_equal(vqp_dev_cq_arm(&cq, 5, 1), UCS_OK);
    val = (2u << 28) | MLX5_CQ_DB_REQ_NOT_SOL | 5;
    assert_int_equal(be32toh(dbrec[1]), val);
    assert_int_equal(be64toh(uar[MLX5_CQ_DOORBELL / 8]),
                     ((uint64_t)val << 32) | 0x4a);

    /* No doorbell page: refused by the data path with a log line. */
    cq.arm_uar = NULL;
    assert_int_equal(vqp_dev_cq_arm(&cq, 5, 0), UCS_ERR_UNSUPPORTED);
    expect_log("no doorbell page");
}

static void test_no_events(void **state)
{
    vqp_dev_t dev;
    vqp_dev_cq_t cq;
    int fd;

    memset(&dev, 0, sizeof(dev));
    memset(&cq, 0, sizeof(cq));
    strcpy(dev.attr.name, "mlx5_0:1");
    cq.dev = &dev;
    /* The channel could not be created at open: every call says so. */
    assert_int_equal(vqp_dev_event_fd(&dev, &fd), UCS_ERR_UNSUPPORTED);
    expect_log("no completion events");
    assert_int_equal(vqp_dev_event_arm(&dev), UCS_ERR_UNSUPPORTED);
    expect_log("no completion events");
    assert_int_equal(vqp_dev_cq_arm(&cq, 0, 0), UCS_ERR_UNSUPPORTED);
    expect_log("no completion events");
    /* NULL arguments. */
    assert_int_equal(vqp_dev_event_fd(NULL, &fd), UCS_ERR_INVALID_PARAM);
    expect_log("NULL device");
    assert_int_equal(vqp_dev_event_arm(NULL), UCS_ERR_INVALID_PARAM);
    expect_log("NULL device");
    assert_int_equal(vqp_dev_cq_arm(NULL, 0, 0), UCS_ERR_INVALID_PARAM);
    expect_log("NULL CQ");
    dev.attr.comp_events = 1;
    assert_int_equal(vqp_dev_event_fd(&dev, NULL), UCS_ERR_INVALID_PARAM);
    expect_log("NULL output argument");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_channel_create, setup, teardown),
        cmocka_unit_test_setup_teardown(test_channel_create_fails, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_drain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cq_arm_doorbell, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_events, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
