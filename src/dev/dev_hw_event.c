/*
 * Device control on mlx5 hardware: the completion channel behind
 * vqp_dev_event_fd / vqp_dev_event_arm. Events are read without blocking,
 * acknowledged at once (ibv_destroy_cq waits for unacknowledged ones), and
 * each advances its CQ's arm sequence number: a ConnectX ignores an arm that
 * repeats the number of one that already fired.
 */
#include <config.h>

#include "dev_hw_event.h"

#include <ucs/debug/log.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>

ucs_status_t vqp_dev_hw_channel_create(struct ibv_context *ctx,
                                       const char *name, ucs_log_level_t level,
                                       struct ibv_comp_channel **channel_p)
{
    struct ibv_comp_channel *channel;
    int flags;

    channel = ibv_create_comp_channel(ctx);
    if (channel == NULL) {
        ucs_log(level,
                "%s: ibv_create_comp_channel failed: %m: no completion "
                "events",
                name);
        return UCS_ERR_IO_ERROR;
    }
    flags = fcntl(channel->fd, F_GETFL);
    if ((flags < 0) || (fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) < 0)) {
        ucs_log(level,
                "%s: cannot make the completion channel fd %d "
                "non-blocking: %m: no completion events",
                name, channel->fd);
        ibv_destroy_comp_channel(channel);
        return UCS_ERR_IO_ERROR;
    }
    *channel_p = channel;
    return UCS_OK;
}

void vqp_dev_hw_channel_destroy(struct ibv_comp_channel *channel,
                                const char *name)
{
    if ((channel != NULL) && (ibv_destroy_comp_channel(channel) != 0)) {
        ucs_warn("%s: ibv_destroy_comp_channel failed: %m", name);
    }
}

ucs_status_t vqp_dev_hw_channel_drain(struct ibv_comp_channel *channel,
                                      const char *name, unsigned *count_p)
{
    struct ibv_cq *ibcq;
    vqp_dev_cq_t *cq;
    void *context;

    *count_p = 0;
    for (;;) {
        if (ibv_get_cq_event(channel, &ibcq, &context) != 0) {
            if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
                return UCS_OK;
            }
            if (errno == EINTR) {
                continue;
            }
            ucs_error("%s: ibv_get_cq_event on fd %d failed: %m", name,
                      channel->fd);
            return UCS_ERR_IO_ERROR;
        }
        ibv_ack_cq_events(ibcq, 1);
        cq = context;
        if (cq != NULL) {
            ++cq->arm_sn;
        }
        ++*count_p;
    }
}
