/*
 * Completion channels for the verbs mocks (ld --wrap): dev_hw.c creates one
 * per device at open, which the real libibverbs would try on a fake context.
 * This fake hands out channels over an eventfd and checks at exit that every
 * one was destroyed.
 */
#include <config.h>

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct ibv_comp_channel *
__wrap_ibv_create_comp_channel(struct ibv_context *context);
int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *channel);

static int mock_channels;

static void mock_channel_check(void)
{
    if (mock_channels != 0) {
        fprintf(stderr, "%d completion channels not destroyed\n",
                mock_channels);
        _exit(99);
    }
}

struct ibv_comp_channel *
__wrap_ibv_create_comp_channel(struct ibv_context *context)
{
    static int registered;
    struct ibv_comp_channel *channel = calloc(1, sizeof(*channel));

    if (!registered) {
        registered = 1;
        atexit(mock_channel_check);
    }
    if (channel == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    channel->context = context;
    channel->fd      = eventfd(0, EFD_CLOEXEC);
    if (channel->fd < 0) {
        free(channel);
        return NULL;
    }
    ++mock_channels;
    return channel;
}

int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    close(channel->fd);
    free(channel);
    --mock_channels;
    return 0;
}
