/*
 * rc_vqp interface events (uct_iface_event_fd_get / uct_iface_event_arm):
 * the device's event fd, and an arm that says UCS_ERR_BUSY whenever sleeping
 * could miss work. The order follows the device layer's rule: the device
 * first (it consumes what made the fd readable; the software device also
 * looks for work its engine has not done), then every CQ (the virtual CQ's
 * and the connection manager's), each checked for a CQE that arrived before
 * its arm.
 *
 * Work no device event announces is BUSY too: pending requests that could
 * go now, connection attempts (REQs are resent on a timer) and passive
 * endpoints to destroy. A request that waits for room or for a fence waits
 * for a completion, and one that waits for credits for a grant (a receive):
 * both are events, once a cover NOP makes sure that the WQEs in flight end
 * in a CQE (unsignaled ones complete silently). So a sender held back by a
 * full queue sleeps, as with UCX's rc, instead of spinning.
 * All event kinds (send completion, receive, solicited receive) are served
 * by the same arm: one CQ carries both directions.
 */
#include <config.h>

#include "rc_vqp.h"

#include <ucs/debug/log.h>

ucs_status_t uct_rc_vqp_iface_event_fd_get(uct_iface_h tl_iface, int *fd_p)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);

    /* The virtual CQ's own fd: one per interface, as UCP registers each
     * interface's fd (the device and its fd may be shared). */
    return vqp_cq_event_fd(iface->cq, fd_p);
}

ucs_status_t uct_rc_vqp_iface_event_arm(uct_iface_h tl_iface, unsigned events)
{
    uct_rc_vqp_iface_t *iface = ucs_derived_of(tl_iface, uct_rc_vqp_iface_t);
    uct_rc_vqp_cm_t *cm       = &iface->cm;
    ucs_status_t status;

    if (events & ~(unsigned)(UCT_EVENT_SEND_COMP | UCT_EVENT_RECV |
                             UCT_EVENT_RECV_SIG)) {
        ucs_error("rc_vqp: event_arm: unknown event flags 0x%x",
                  events & ~(unsigned)(UCT_EVENT_SEND_COMP | UCT_EVENT_RECV |
                                       UCT_EVENT_RECV_SIG));
        return UCS_ERR_INVALID_PARAM;
    }
    if (!ucs_list_is_empty(&iface->grant_eps) ||
        !ucs_list_is_empty(&cm->connecting) ||
        !ucs_list_is_empty(&cm->doomed)) {
        return UCS_ERR_BUSY;
    }
    /* What progress would do: endpoints that can send are scheduled, the
     * others get the cover their completion event needs. */
    if (!ucs_list_is_empty(&iface->pending_eps)) {
        uct_rc_vqp_iface_schedule_pending(iface);
    }
    if (!ucs_arbiter_is_empty(&iface->arbiter)) {
        return UCS_ERR_BUSY;
    }
    /* Buffers released since the last progress: posted before sleeping,
     * or senders waiting for them (RNR) would wait for this side too. */
    if (iface->rx_missing != 0) {
        uct_rc_vqp_iface_rx_refill(iface);
    }
    status = vqp_dev_event_arm(iface->dev);
    if (status != UCS_OK) {
        return status;
    }
    status = vqp_cq_arm(iface->cq);
    if (status != UCS_OK) {
        return status;
    }
    return uct_rc_vqp_cm_arm(iface);
}
