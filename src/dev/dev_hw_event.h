/*
 * Device control on mlx5 hardware: completion events over a verbs
 * completion channel. Separate from dev_hw.c so the verbs it calls can be
 * replaced in a test (test/dev/test_dev_hw_event.c). Not for use outside
 * src/dev.
 */
#ifndef VQP_DEV_HW_EVENT_H_
#define VQP_DEV_HW_EVENT_H_

#include "dev_int.h"

#include <ucs/debug/log_def.h>

/* A completion channel with a non-blocking fd. Failure: a UCS status and a
 * log line at @a level (the device opens without events). */
ucs_status_t vqp_dev_hw_channel_create(struct ibv_context *ctx,
                                       const char *name, ucs_log_level_t level,
                                       struct ibv_comp_channel **channel_p);
void vqp_dev_hw_channel_destroy(struct ibv_comp_channel *channel,
                                const char *name);

/* Consumes every pending event of @a channel: acknowledges it and advances
 * the arm sequence number of its CQ (the CQ's context is its vqp_dev_cq_t).
 * *count_p: events consumed. UCS_ERR_IO_ERROR (logged) if reading fails for
 * another reason than "nothing pending". */
ucs_status_t vqp_dev_hw_channel_drain(struct ibv_comp_channel *channel,
                                      const char *name, unsigned *count_p);

#endif
