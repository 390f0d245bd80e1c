/*
 * rc_vqp endpoint: one virtual QP per endpoint. Maps every UCT operation to
 * one core operation, turns core completions back into uct_completion_t
 * calls and active-message handler calls, reports peer failure once per
 * endpoint, and keeps UCT's pending queue on the interface's arbiter.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <config.h>

#include "rc_vqp.h"
#include "rc_vqp_memcheck.h"

#include <ucs/datastruct/mpool.inl>
#include <uct/base/uct_iov.inl>
#include <ucs/debug/log.h>
#include <string.h>

#define UCT_RC_VQP_EP_IFACE(_ep) \
    ucs_derived_of((_ep)->super.super.iface, uct_rc_vqp_iface_t)

typedef struct {
    uct_pending_purge_callback_t cb;
    void *arg;
} uct_rc_vqp_purge_args_t;

/* ----------------------------------------------------------- completions */

void uct_rc_vqp_ep_set_failed(uct_rc_vqp_ep_t *ep, ucs_status_t status)
{
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);

    /* Canceled operations are the user's own doing (flush(CANCEL), destroy):
     * no peer failure to report. */
    if ((status == UCS_ERR_CANCELED) || (ep->flags & UCT_RC_VQP_EP_FAILED)) {
        return;
    }
    ep->flags |= UCT_RC_VQP_EP_FAILED;
    if (ep->flags & UCT_RC_VQP_EP_PASSIVE) {
        /* The user never saw this endpoint: nobody to tell. */
        uct_rc_vqp_cm_ep_failed(ep);
        return;
    }
    uct_iface_handle_ep_err(&iface->super.super, &ep->super.super, status);
}

void uct_rc_vqp_ep_vqp_failed(void *arg, ucs_status_t status)
{
    /* Not the user's cancel (the core does not call then): a QP flushed
     * without an error of its own is a connection that went away. */
    uct_rc_vqp_ep_set_failed(
        arg, (status == UCS_ERR_CANCELED) ? UCS_ERR_CONNECTION_RESET : status);
}

/* Requests wait in the pending queue, and the caller is not the one of them
 * being dispatched: the operation must queue behind them. Operations need
 * different resources (an inline one room on the send QP now, a bcopy one
 * only a place in the core's ring), so one refused for want of its own could
 * otherwise be overtaken by a later one of another kind, and UCP matches
 * messages in the order they arrive. PENDING is set whenever the queue is
 * not empty, so the common case is one test of the flags. */
static UCS_F_ALWAYS_INLINE int uct_rc_vqp_ep_behind_pending(uct_rc_vqp_ep_t *ep)
{
    return ((ep->flags & (UCT_RC_VQP_EP_PENDING | UCT_RC_VQP_EP_DISPATCH)) ==
            UCT_RC_VQP_EP_PENDING) &&
           !ucs_arbiter_group_is_empty(&ep->arb_group);
}

/* Room for one more operation (connected, the core has room, nothing
 * queued ahead of it). */
static UCS_F_ALWAYS_INLINE int uct_rc_vqp_ep_has_room(uct_rc_vqp_ep_t *ep)
{
    return !(ep->flags & UCT_RC_VQP_EP_NOT_READY) &&
           (vqp_send_avail(ep->vqp) != 0) && !uct_rc_vqp_ep_behind_pending(ep);
}

/* Every operation would be accepted now: room (for an RMA operation of
 * max_iov entries too), an AM credit, room for inline data on the send QP,
 * and a bounce buffer (none is left only at TX_MAX_BUFS: an unlimited pool
 * grows). pending_add says BUSY only then, because UCP retries a BUSY at
 * once, without progress. */
static UCS_F_ALWAYS_INLINE int uct_rc_vqp_ep_can_send(uct_rc_vqp_ep_t *ep)
{
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    ucs_mpool_t *tx_mp        = &iface->tx_mp;

    return !(ep->flags & UCT_RC_VQP_EP_NOT_READY) && (ep->fc_credits > 0) &&
           (vqp_send_avail_inline(ep->vqp, (ep->flags & UCT_RC_VQP_EP_FENCE)
                                               ? VQP_SEND_FENCE
                                               : 0) >= iface->rma_max_iov) &&
           (!ucs_mpool_is_empty(tx_mp) || (tx_mp->data->quota > 0));
}

/* The immediate of an outgoing AM: its id, the credits owed, and whether
 * it spends the last credit. */
static UCS_F_ALWAYS_INLINE uint32_t uct_rc_vqp_ep_am_imm(uct_rc_vqp_ep_t *ep,
                                                         uint8_t id)
{
    unsigned credits = ucs_min(ep->fc_to_return, UCT_RC_VQP_IMM_CRED_MAX);

    return id | (credits << UCT_RC_VQP_IMM_CRED_SHIFT) |
           ((ep->fc_credits == 1) ? UCT_RC_VQP_IMM_LAST : 0);
}

/* An AM went out carrying @a imm: its credit is spent, the returned ones
 * are no longer owed. */
static UCS_F_ALWAYS_INLINE void uct_rc_vqp_ep_am_sent(uct_rc_vqp_ep_t *ep,
                                                      uint32_t imm)
{
    --ep->fc_credits;
    ep->fc_to_return -= imm >> UCT_RC_VQP_IMM_CRED_SHIFT;
}

/* Return credits explicitly once half the sender's credits are owed and no
 * AM went back to carry them (one-directional traffic), or at once when the
 * sender spent its last one. Half of the credits, not of the window: the
 * sender never has more than the window less the reserve, so a threshold
 * above that (FC_WND_SIZE 5 or 6) was never reached and its AMs stopped for
 * good. */
static void uct_rc_vqp_ep_grant(uct_rc_vqp_ep_t *ep)
{
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    unsigned credits = ucs_min(ep->fc_to_return, UCT_RC_VQP_IMM_CRED_MAX);
    vqp_send_wr_t wr;
    ucs_status_t status;

    if (credits == 0) {
        ep->flags &= ~UCT_RC_VQP_EP_GRANT_NOW; /* an AM carried them */
        return;
    }
    if (((credits < iface->fc_grant_thresh) &&
         !(ep->flags & UCT_RC_VQP_EP_GRANT_NOW)) ||
        !(ep->flags & UCT_RC_VQP_EP_CONNECTED)) {
        return;
    }
    memset(&wr, 0, sizeof(wr));
    wr.opcode = VQP_OP_SEND_IMM;
    wr.flags  = VQP_SEND_INLINE;
    wr.imm    = UCT_RC_VQP_IMM_GRANT | (credits << UCT_RC_VQP_IMM_CRED_SHIFT);
    status    = vqp_post_send(ep->vqp, &wr);
    if (status == UCS_OK) {
        ep->fc_to_return -= credits;
        ep->flags &= ~UCT_RC_VQP_EP_GRANT_NOW;
    } else if ((status == UCS_ERR_NO_RESOURCE) &&
               !(ep->flags & UCT_RC_VQP_EP_GRANT)) {
        /* No room now. The peer may be out of credits and send nothing
         * more, so the next message received is no chance to come:
         * progress tries again. */
        ep->flags |= UCT_RC_VQP_EP_GRANT;
        ucs_list_add_tail(&iface->grant_eps, &ep->grant_list);
    }
}

void uct_rc_vqp_iface_grant_progress(uct_rc_vqp_iface_t *iface)
{
    ucs_list_link_t owed;
    uct_rc_vqp_ep_t *ep;

    /* Each once: one that finds no room again waits for the next call. */
    ucs_list_head_init(&owed);
    ucs_list_splice_tail(&owed, &iface->grant_eps);
    ucs_list_head_init(&iface->grant_eps);
    while (!ucs_list_is_empty(&owed)) {
        ep = ucs_list_extract_head(&owed, uct_rc_vqp_ep_t, grant_list);
        ep->flags &= ~UCT_RC_VQP_EP_GRANT;
        uct_rc_vqp_ep_grant(ep);
    }
}

static void uct_rc_vqp_ep_recv(uct_rc_vqp_ep_t *ep, const vqp_wc_t *wc)
{
    uct_rc_vqp_iface_t *iface  = UCT_RC_VQP_EP_IFACE(ep);
    uct_rc_vqp_rx_desc_t *desc = (void *)(uintptr_t)wc->wr_id;
    void *data = UCS_PTR_BYTE_OFFSET(desc + 1, iface->rx_headroom);
    ucs_status_t status;

    if (wc->status != UCS_OK) {
        /* Its QP failed while receiving: the SRQ keeps the buffer. */
        uct_rc_vqp_iface_post_recv(iface, desc);
        return;
    }
    UCT_RC_VQP_DEVICE_WROTE(data, wc->byte_len);
    ep->flags &= ~UCT_RC_VQP_EP_UNCONFIRMED; /* the active side is up */
    if (wc->flags & VQP_WC_WITH_IMM) {
        ep->fc_credits += wc->imm >> UCT_RC_VQP_IMM_CRED_SHIFT;
        if (wc->imm >> UCT_RC_VQP_IMM_CRED_SHIFT) {
            ucs_arbiter_group_schedule(&iface->arbiter, &ep->arb_group);
        }
        if (wc->imm & UCT_RC_VQP_IMM_GRANT) {
            uct_rc_vqp_iface_post_recv(iface, desc);
            return;
        }
        ++ep->fc_to_return;
        if (wc->imm & UCT_RC_VQP_IMM_LAST) {
            ep->flags |= UCT_RC_VQP_EP_GRANT_NOW;
        }
    }
    if (!(wc->flags & VQP_WC_WITH_IMM)) {
        ucs_error("rc_vqp ep %p: message of %lu bytes without an AM id:"
                  " dropped",
                  ep, wc->byte_len);
    } else {
        status =
            uct_iface_invoke_am(&iface->super, wc->imm & UCT_RC_VQP_AM_ID_MASK,
                                data, wc->byte_len, UCT_CB_PARAM_FLAG_DESC);
        if (status == UCS_INPROGRESS) {
            /* The handler keeps the buffer; post a fresh one instead. */
            uct_rc_vqp_iface_post_recv(iface, NULL);
            uct_rc_vqp_ep_grant(ep);
            return;
        }
    }
    uct_rc_vqp_iface_post_recv(iface, desc);
    uct_rc_vqp_ep_grant(ep);
}

/* A flush(CANCEL) waiting for the operations in flight: completes once
 * none is left. */
static void uct_rc_vqp_ep_cancel_check(uct_rc_vqp_ep_t *ep)
{
    uct_completion_t *comp = ep->cancel_comp;

    if ((comp != NULL) && (vqp_ops_in_flight(ep->vqp) == 0)) {
        ep->cancel_comp = NULL;
        --UCT_RC_VQP_EP_IFACE(ep)->cancel_waiting;
        uct_invoke_completion(comp, UCS_OK);
    }
}

void uct_rc_vqp_iface_cancel_progress(uct_rc_vqp_iface_t *iface)
{
    uct_rc_vqp_ep_t *ep, *tmp;

    ucs_list_for_each_safe(ep, tmp, &iface->eps, list)
    {
        uct_rc_vqp_ep_cancel_check(ep);
    }
}

void uct_rc_vqp_ep_completion(void *arg, const vqp_wc_t *wc)
{
    uct_rc_vqp_ep_t *ep       = arg;
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    uct_rc_vqp_tx_desc_t *desc;
    uct_completion_t *comp;

    if ((wc->opcode == VQP_OP_RECV) || (wc->opcode == VQP_OP_RECV_NOTIFY)) {
        uct_rc_vqp_ep_recv(ep, wc);
        return;
    }

    if (wc->wr_id & UCT_RC_VQP_WR_DESC) {
        desc = (void *)(uintptr_t)(wc->wr_id & ~UCT_RC_VQP_WR_DESC);
        if ((wc->status == UCS_OK) && (desc->unpack_cb != NULL)) {
            UCT_RC_VQP_DEVICE_WROTE(desc + 1, desc->length);
            desc->unpack_cb(desc->unpack_arg, desc + 1, desc->length);
        }
        comp = desc->comp;
        ucs_mpool_put(desc);
    } else {
        comp = (uct_completion_t *)(uintptr_t)wc->wr_id;
    }
    if (comp != NULL) {
        uct_invoke_completion(comp, wc->status);
    }
    if (wc->status != UCS_OK) {
        uct_rc_vqp_ep_set_failed(ep, wc->status);
    }
    uct_rc_vqp_ep_cancel_check(ep);
    /* Room for one more operation: pending requests may go on. */
    ucs_arbiter_group_schedule(&iface->arbiter, &ep->arb_group);
}

/* ------------------------------------------------------------ checks */

/* UCT's argument checks, in every build (UCX compiles its own only with
 * parameter checking on). An id beyond the table would reach the handler of
 * another id, since the receiver masks it. */
static UCS_F_ALWAYS_INLINE ucs_status_t uct_rc_vqp_check_am_id(uint8_t id)
{
    if (ucs_unlikely(id >= UCT_AM_ID_MAX)) {
        ucs_error("rc_vqp: invalid active message id %u (valid range: 0..%d)",
                  id, (int)UCT_AM_ID_MAX - 1);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

static UCS_F_ALWAYS_INLINE ucs_status_t
uct_rc_vqp_check_length(const char *what, size_t length, size_t max)
{
    if (ucs_unlikely(length > max)) {
        ucs_error("rc_vqp: invalid %s length %zu (at most %zu)", what, length,
                  max);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

/* ------------------------------------------------------------ operations */

/* Post @a wr, fenced if the user asked for a fence since the last one. */
static UCS_F_ALWAYS_INLINE ucs_status_t uct_rc_vqp_ep_post(uct_rc_vqp_ep_t *ep,
                                                           vqp_send_wr_t *wr)
{
    ucs_status_t status;

    if (ucs_unlikely(ep->flags &
                     (UCT_RC_VQP_EP_FENCE | UCT_RC_VQP_EP_NOT_READY |
                      UCT_RC_VQP_EP_PENDING | UCT_RC_VQP_EP_FAILED))) {
        if (ep->flags & UCT_RC_VQP_EP_FAILED) {
            /* Reported failed (or canceled): nothing more goes out, also
             * when QPs of the virtual QP survived the error. */
            return UCS_ERR_ENDPOINT_TIMEOUT;
        }
        if (ep->flags & UCT_RC_VQP_EP_NOT_READY) {
            /* Still connecting: wait in the pending queue. */
            return UCS_ERR_NO_RESOURCE;
        }
        if (uct_rc_vqp_ep_behind_pending(ep)) {
            return UCS_ERR_NO_RESOURCE;
        }
        if (ep->flags & UCT_RC_VQP_EP_FENCE) {
            wr->flags |= VQP_SEND_FENCE;
        }
    }
    status = vqp_post_send(ep->vqp, wr);
    if (ucs_likely(status == UCS_OK)) {
        ep->flags &= ~UCT_RC_VQP_EP_FENCE;
    }
    return status;
}

static UCS_F_ALWAYS_INLINE void
uct_rc_vqp_wr_init(vqp_send_wr_t *wr, vqp_opcode_t opcode, uint64_t wr_id,
                   unsigned flags, const void *laddr, uint64_t length,
                   uint32_t lkey, uint64_t raddr, uct_rkey_t rkey)
{
    wr->wr_id       = wr_id;
    wr->opcode      = opcode;
    wr->flags       = flags;
    wr->local_addr  = (uintptr_t)laddr;
    wr->length      = length;
    wr->remote_addr = raddr;
    wr->lkey[0]     = lkey;
    wr->rkey[0]     = (uint32_t)rkey;
    wr->imm         = 0;
    wr->compare_add = 0;
    wr->swap        = 0;
}

/* A bounce buffer, only when the endpoint can take an operation: bcopy
 * must not call pack_cb for an operation it then refuses. */
static UCS_F_ALWAYS_INLINE uct_rc_vqp_tx_desc_t *
uct_rc_vqp_ep_get_desc(uct_rc_vqp_ep_t *ep)
{
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    uct_rc_vqp_tx_desc_t *desc;

    if (ucs_unlikely(!uct_rc_vqp_ep_has_room(ep))) {
        /* A ring full of unsignaled operations empties only behind a
         * signaled WQE (the core's own refusal is not reached here). */
        vqp_cover_in_flight(ep->vqp);
        return NULL;
    }
    desc = ucs_mpool_get_inline(&iface->tx_mp);
    if (ucs_likely(desc != NULL)) {
        desc->comp      = NULL;
        desc->unpack_cb = NULL;
    }
    return desc;
}

static UCS_F_ALWAYS_INLINE uint64_t uct_rc_vqp_desc_wr_id(void *desc)
{
    return (uintptr_t)desc | UCT_RC_VQP_WR_DESC;
}

/* Entry @a i of a put_zcopy / get_zcopy: its local key (0 for an empty
 * entry without a memory handle). */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_rc_vqp_iov_entry_check(const uct_iov_t *iov, size_t i, uint32_t *lkey_p)
{
    const uct_rc_vqp_memh_t *memh = iov->memh;

    if (iov->stride != 0 && iov->count > 1) {
        ucs_error("rc_vqp: iov %zu: strided iov is not supported", i);
        return UCS_ERR_UNSUPPORTED;
    }
    if ((memh == UCT_MEM_HANDLE_NULL) && (uct_iov_get_length(iov) != 0)) {
        ucs_error("rc_vqp: zcopy iov %zu from %p without a memory handle", i,
                  iov->buffer);
        return UCS_ERR_INVALID_PARAM;
    }
    *lkey_p = (memh == UCT_MEM_HANDLE_NULL) ? 0 : memh->lkey;
    return UCS_OK;
}

ucs_status_t uct_rc_vqp_ep_put_short(uct_ep_h tl_ep, const void *buffer,
                                     unsigned length, uint64_t remote_addr,
                                     uct_rkey_t rkey)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    vqp_send_wr_t wr;

    if (uct_rc_vqp_check_length(
            "put_short", length,
            UCT_RC_VQP_EP_IFACE(ep)->vqp_params.max_inline) != UCS_OK) {
        return UCS_ERR_INVALID_PARAM;
    }
    uct_rc_vqp_wr_init(&wr, VQP_OP_WRITE, 0, VQP_SEND_INLINE, buffer, length, 0,
                       remote_addr, rkey);
    return uct_rc_vqp_ep_post(ep, &wr);
}

/* What a pack callback returned, against the bounce buffer it filled: more
 * than max_bcopy would send the bytes after the buffer (other descriptors),
 * so it is refused (UCT_IFACE_FLAG_ERRHANDLE_BCOPY_LEN). The buffer has
 * UCT_RC_VQP_BCOPY_SLACK bytes more, so a callback that wrote a little
 * beyond max_bcopy overwrote nothing else. */
static UCS_F_ALWAYS_INLINE ucs_status_t uct_rc_vqp_check_packed(
    uct_rc_vqp_iface_t *iface, const char *what, size_t length)
{
    if (ucs_likely(length <= iface->seg_size)) {
        return UCS_OK;
    }
    ucs_error("rc_vqp: %s packed length %zu is more than max_bcopy %zu", what,
              length, iface->seg_size);
    return UCS_ERR_INVALID_PARAM;
}

ssize_t uct_rc_vqp_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb,
                                void *arg, uint64_t remote_addr,
                                uct_rkey_t rkey)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_tx_desc_t *desc;
    ucs_status_t status;
    vqp_send_wr_t wr;
    size_t length;

    desc = uct_rc_vqp_ep_get_desc(ep);
    if (desc == NULL) {
        return UCS_ERR_NO_RESOURCE;
    }
    length = pack_cb(desc + 1, arg);
    status =
        uct_rc_vqp_check_packed(UCT_RC_VQP_EP_IFACE(ep), "put_bcopy", length);
    if (ucs_unlikely(status != UCS_OK)) {
        ucs_mpool_put(desc);
        return status;
    }
    uct_rc_vqp_wr_init(&wr, VQP_OP_WRITE, uct_rc_vqp_desc_wr_id(desc),
                       VQP_SEND_SIGNALED, desc + 1, length, desc->lkey,
                       remote_addr, rkey);
    status = uct_rc_vqp_ep_post(ep, &wr);
    if (status != UCS_OK) {
        ucs_mpool_put(desc);
        return status;
    }
    return length;
}

static void uct_rc_vqp_iov_comp_done(uct_completion_t *self)
{
    uct_rc_vqp_iov_comp_t *ic = ucs_derived_of(self, uct_rc_vqp_iov_comp_t);
    uct_completion_t *user    = ic->user;
    ucs_status_t status       = self->status;

    ucs_mpool_put(ic); /* before the user's callback, which may post */
    uct_invoke_completion(user, status);
}

/* put_zcopy / get_zcopy of several iov entries: a core operation for each
 * non-empty one, at consecutive remote addresses. All are posted or none:
 * the endpoint must have a slot for each. With a completion, they share one
 * counter that calls it once, with the first error. */
static UCS_F_NOINLINE ucs_status_t uct_rc_vqp_ep_zcopy_iov(
    uct_rc_vqp_ep_t *ep, vqp_opcode_t opcode, unsigned flags,
    const uct_iov_t *iov, size_t iovcnt, uint64_t remote_addr, uct_rkey_t rkey,
    uct_completion_t *comp)
{
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    uint32_t lkey[UCT_RC_VQP_RMA_MAX_IOV];
    uct_rc_vqp_iov_comp_t *ic = NULL;
    uint64_t wr_id            = (uintptr_t)comp;
    unsigned count = 0, posted = 0;
    ucs_status_t status;
    vqp_send_wr_t wr;
    size_t i, length;

    if (iovcnt > iface->rma_max_iov) {
        ucs_error("rc_vqp: %s_zcopy of %zu iov entries, at most %u",
                  (opcode == VQP_OP_READ) ? "get" : "put", iovcnt,
                  iface->rma_max_iov);
        return UCS_ERR_INVALID_PARAM;
    }
    for (i = 0; i < iovcnt; ++i) {
        status = uct_rc_vqp_iov_entry_check(&iov[i], i, &lkey[i]);
        if (status != UCS_OK) {
            return status;
        }
        count += (uct_iov_get_length(&iov[i]) != 0);
    }
    if (ep->flags & UCT_RC_VQP_EP_FAILED) {
        return UCS_ERR_ENDPOINT_TIMEOUT;
    }
    if (vqp_send_avail(ep->vqp) < count) {
        /* The slots free up as operations complete, also unsignaled ones
         * behind a signaled WQE. */
        vqp_cover_in_flight(ep->vqp);
        return UCS_ERR_NO_RESOURCE;
    }
    if ((comp != NULL) && (count > 1)) {
        ic = ucs_mpool_get(&iface->iov_comp_mp);
        if (ic == NULL) {
            ucs_error("rc_vqp: no memory for the completion of a %s_zcopy",
                      (opcode == VQP_OP_READ) ? "get" : "put");
            return UCS_ERR_NO_MEMORY;
        }
        ic->super.func   = uct_rc_vqp_iov_comp_done;
        ic->super.count  = (int)count;
        ic->super.status = UCS_OK;
        ic->user         = comp;
        wr_id            = (uintptr_t)ic;
    }
    for (i = 0; i < iovcnt; ++i, remote_addr += length) {
        length = uct_iov_get_length(&iov[i]);
        if (length == 0) {
            continue;
        }
        uct_rc_vqp_wr_init(&wr, opcode, wr_id, flags, iov[i].buffer, length,
                           lkey[i], remote_addr, rkey);
        status = uct_rc_vqp_ep_post(ep, &wr);
        if (ucs_likely(status == UCS_OK)) {
            ++posted;
            continue;
        }
        if (posted == 0) { /* not connected yet, queued requests ahead */
            if (ic != NULL) {
                ucs_mpool_put(ic);
            }
            return status;
        }
        /* Not expected after the checks above; the entries posted are in
         * flight, so the operation ends with this error. */
        ucs_error("rc_vqp: %s_zcopy iov %zu refused after %u entries: %s",
                  (opcode == VQP_OP_READ) ? "get" : "put", i, posted,
                  ucs_status_string(status));
        if (ic != NULL) {
            /* Those posted may have completed (a post can fail its own
             * operation at once): only the entries not posted go. */
            uct_completion_update_status(&ic->super, status);
            ic->super.count -= (int)(count - posted);
            if (ic->super.count == 0) {
                uct_rc_vqp_iov_comp_done(&ic->super);
            }
        }
        break;
    }
    return UCS_INPROGRESS;
}

/* put_zcopy / get_zcopy: one core operation on the user's registered
 * buffer, which stays in use until the completion. A get is always signaled:
 * its data is usable only once its completion is seen. */
static UCS_F_ALWAYS_INLINE ucs_status_t uct_rc_vqp_ep_zcopy(
    uct_ep_h tl_ep, vqp_opcode_t opcode, const uct_iov_t *iov, size_t iovcnt,
    uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    unsigned flags =
        ((comp != NULL) || (opcode == VQP_OP_READ)) ? VQP_SEND_SIGNALED : 0;
    ucs_status_t status;
    vqp_send_wr_t wr;
    uint32_t lkey;
    size_t length;

    length = (iovcnt == 0) ? 0 : uct_iov_total_length(iov, iovcnt);
    if (length == 0) {
        return UCS_OK;
    }
    if (ucs_unlikely(length > UCT_RC_VQP_EP_IFACE(ep)->rma_max_zcopy)) {
        /* One WQE could not carry it (the device fails it, or the WQE
         * builder refuses it). */
        ucs_error("rc_vqp: %s_zcopy of %zu bytes, at most %lu",
                  (opcode == VQP_OP_READ) ? "get" : "put", length,
                  UCT_RC_VQP_EP_IFACE(ep)->rma_max_zcopy);
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_unlikely(iovcnt != 1)) {
        return uct_rc_vqp_ep_zcopy_iov(ep, opcode, flags, iov, iovcnt,
                                       remote_addr, rkey, comp);
    }
    status = uct_rc_vqp_iov_entry_check(iov, 0, &lkey);
    if (status != UCS_OK) {
        return status;
    }
    uct_rc_vqp_wr_init(&wr, opcode, (uintptr_t)comp, flags, iov->buffer, length,
                       lkey, remote_addr, rkey);
    status = uct_rc_vqp_ep_post(ep, &wr);
    return (status == UCS_OK) ? UCS_INPROGRESS : status;
}

ucs_status_t uct_rc_vqp_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                     size_t iovcnt, uint64_t remote_addr,
                                     uct_rkey_t rkey, uct_completion_t *comp)
{
    return uct_rc_vqp_ep_zcopy(tl_ep, VQP_OP_WRITE, iov, iovcnt, remote_addr,
                               rkey, comp);
}

ucs_status_t uct_rc_vqp_ep_get_bcopy(uct_ep_h tl_ep,
                                     uct_unpack_callback_t unpack_cb, void *arg,
                                     size_t length, uint64_t remote_addr,
                                     uct_rkey_t rkey, uct_completion_t *comp)
{
    uct_rc_vqp_ep_t *ep       = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    uct_rc_vqp_tx_desc_t *desc;
    ucs_status_t status;
    vqp_send_wr_t wr;

    if (uct_rc_vqp_check_length("get_bcopy", length, iface->seg_size) !=
        UCS_OK) {
        return UCS_ERR_INVALID_PARAM;
    }
    desc = uct_rc_vqp_ep_get_desc(ep);
    if (desc == NULL) {
        return UCS_ERR_NO_RESOURCE;
    }
    desc->comp       = comp;
    desc->unpack_cb  = unpack_cb;
    desc->unpack_arg = arg;
    desc->length     = length;
    uct_rc_vqp_wr_init(&wr, VQP_OP_READ, uct_rc_vqp_desc_wr_id(desc),
                       VQP_SEND_SIGNALED, desc + 1, length, desc->lkey,
                       remote_addr, rkey);
    status = uct_rc_vqp_ep_post(ep, &wr);
    if (status != UCS_OK) {
        ucs_mpool_put(desc);
        return status;
    }
    return UCS_INPROGRESS;
}

ucs_status_t uct_rc_vqp_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                     size_t iovcnt, uint64_t remote_addr,
                                     uct_rkey_t rkey, uct_completion_t *comp)
{
    return uct_rc_vqp_ep_zcopy(tl_ep, VQP_OP_READ, iov, iovcnt, remote_addr,
                               rkey, comp);
}

/* An AM whose message (header and payload, @a length bytes, checked) is in
 * @a data: inline, posted within the call. */
static UCS_F_ALWAYS_INLINE ucs_status_t uct_rc_vqp_ep_am_inline(
    uct_rc_vqp_ep_t *ep, uint8_t id, const void *data, unsigned length)
{
    ucs_status_t status;
    vqp_send_wr_t wr;

    if (ucs_unlikely(ep->fc_credits <= 0)) {
        return UCS_ERR_NO_RESOURCE;
    }
    uct_rc_vqp_wr_init(&wr, VQP_OP_SEND_IMM, 0, VQP_SEND_INLINE, data, length,
                       0, 0, 0);
    wr.imm = uct_rc_vqp_ep_am_imm(ep, id);
    status = uct_rc_vqp_ep_post(ep, &wr);
    if (ucs_likely(status == UCS_OK)) {
        uct_rc_vqp_ep_am_sent(ep, wr.imm);
    }
    return status;
}

ucs_status_t uct_rc_vqp_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t hdr,
                                    const void *buffer, unsigned length)
{
    uct_rc_vqp_ep_t *ep       = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);

    if ((uct_rc_vqp_check_am_id(id) != UCS_OK) ||
        (uct_rc_vqp_check_length("am_short", sizeof(hdr) + (size_t)length,
                                 iface->vqp_params.max_inline) != UCS_OK)) {
        return UCS_ERR_INVALID_PARAM;
    }
    {
        /* Header and payload must arrive as one buffer: gathered here (the
         * length is checked first, so the stack holds it), the WQE takes
         * them inline within the post. */
        char data[sizeof(hdr) + length];

        memcpy(data, &hdr, sizeof(hdr));
        if (length != 0) {
            memcpy(data + sizeof(hdr), buffer, length);
        }
        return uct_rc_vqp_ep_am_inline(ep, id, data, sizeof(data));
    }
}

/* Checks @a iov for the AM calls that gather it into one message (at most
 * UCT_RC_VQP_AM_MAX_IOV entries, none strided) and returns the bytes it
 * holds in @a length_p. */
static ucs_status_t uct_rc_vqp_am_iov_check(const char *what,
                                            const uct_iov_t *iov, size_t iovcnt,
                                            size_t *length_p)
{
    size_t i;

    if (iovcnt > UCT_RC_VQP_AM_MAX_IOV) {
        ucs_error("rc_vqp: %s with %zu iov entries (at most %d)", what, iovcnt,
                  UCT_RC_VQP_AM_MAX_IOV);
        return UCS_ERR_INVALID_PARAM;
    }
    *length_p = 0;
    for (i = 0; i < iovcnt; ++i) {
        if ((iov[i].stride != 0) && (iov[i].count > 1)) {
            ucs_error("rc_vqp: %s iov %zu: strided iov is not supported", what,
                      i);
            return UCS_ERR_INVALID_PARAM;
        }
        *length_p += uct_iov_get_length(&iov[i]);
    }
    return UCS_OK;
}

/* Each entry's count x length bytes (stride 0: contiguous), what
 * uct_iov_get_length() counts; UCX's uct_iov_to_buffer() copies only length
 * of each, which would leave the rest of the message stale. */
static void uct_rc_vqp_am_iov_gather(void *dst, const uct_iov_t *iov,
                                     size_t iovcnt)
{
    size_t i, n;

    for (i = 0; i < iovcnt; ++i) {
        n = uct_iov_get_length(&iov[i]);
        memcpy(dst, iov[i].buffer, n);
        dst = UCS_PTR_BYTE_OFFSET(dst, n);
    }
}

/* The iov's bytes as one message: the first 8 are the AM header (zeros
 * fill a shorter one, as UCX's generic am_short_iov does). */
ucs_status_t uct_rc_vqp_ep_am_short_iov(uct_ep_h tl_ep, uint8_t id,
                                        const uct_iov_t *iov, size_t iovcnt)
{
    uct_rc_vqp_ep_t *ep       = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    size_t length;

    if ((uct_rc_vqp_check_am_id(id) != UCS_OK) ||
        (uct_rc_vqp_am_iov_check("am_short_iov", iov, iovcnt, &length) !=
         UCS_OK) ||
        (uct_rc_vqp_check_length("am_short", ucs_max(length, sizeof(uint64_t)),
                                 iface->vqp_params.max_inline) != UCS_OK)) {
        return UCS_ERR_INVALID_PARAM;
    }
    {
        char data[ucs_max(length, sizeof(uint64_t))];

        memset(data, 0, sizeof(uint64_t));
        uct_rc_vqp_am_iov_gather(data, iov, iovcnt);
        return uct_rc_vqp_ep_am_inline(ep, id, data, sizeof(data));
    }
}

ssize_t uct_rc_vqp_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id,
                               uct_pack_callback_t pack_cb, void *arg,
                               unsigned flags)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_tx_desc_t *desc;
    ucs_status_t status;
    vqp_send_wr_t wr;
    size_t length;

    if (uct_rc_vqp_check_am_id(id) != UCS_OK) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_unlikely(ep->fc_credits <= 0)) {
        return UCS_ERR_NO_RESOURCE;
    }
    desc = uct_rc_vqp_ep_get_desc(ep);
    if (desc == NULL) {
        return UCS_ERR_NO_RESOURCE;
    }
    length = pack_cb(desc + 1, arg);
    status =
        uct_rc_vqp_check_packed(UCT_RC_VQP_EP_IFACE(ep), "am_bcopy", length);
    if (ucs_unlikely(status != UCS_OK)) {
        ucs_mpool_put(desc);
        return status;
    }
    uct_rc_vqp_wr_init(&wr, VQP_OP_SEND_IMM, uct_rc_vqp_desc_wr_id(desc),
                       VQP_SEND_SIGNALED, desc + 1, length, desc->lkey, 0, 0);
    wr.imm = uct_rc_vqp_ep_am_imm(ep, id);
    status = uct_rc_vqp_ep_post(ep, &wr);
    if (status != UCS_OK) {
        ucs_mpool_put(desc);
        return status;
    }
    uct_rc_vqp_ep_am_sent(ep, wr.imm);
    return length;
}

/* am_zcopy copies the user's buffers (below): one that its memory handle
 * does not cover is refused here, as the NIC's lkey check refuses it for
 * the other zcopy operations, instead of the copy faulting on it. */
static ucs_status_t uct_rc_vqp_iov_check_range(const uct_iov_t *iov,
                                               size_t iovcnt)
{
    const uct_rc_vqp_memh_t *memh;
    uintptr_t start;
    size_t i, extent;

    for (i = 0; i < iovcnt; ++i) {
        memh = iov[i].memh;
        if ((memh == UCT_MEM_HANDLE_NULL) || (iov[i].count == 0) ||
            (iov[i].length == 0)) {
            continue;
        }
        start  = (uintptr_t)iov[i].buffer;
        extent = iov[i].count * iov[i].length;
        if ((start < memh->address) || (start - memh->address > memh->length) ||
            (extent > memh->length - (start - memh->address))) {
            ucs_error("rc_vqp: am_zcopy iov %zu: %p+%zu is outside its memory"
                      " handle's registration 0x%lx+%zu (lkey 0x%x)",
                      i, iov[i].buffer, extent, memh->address, memh->length,
                      memh->lkey);
            return UCS_ERR_INVALID_PARAM;
        }
    }
    return UCS_OK;
}

ucs_status_t uct_rc_vqp_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id,
                                    const void *header, unsigned header_length,
                                    const uct_iov_t *iov, size_t iovcnt,
                                    unsigned flags, uct_completion_t *comp)
{
    uct_rc_vqp_ep_t *ep       = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    uct_rc_vqp_tx_desc_t *desc;
    ucs_status_t status;
    vqp_send_wr_t wr;
    size_t length;

    if (uct_rc_vqp_am_iov_check("am_zcopy", iov, iovcnt, &length) != UCS_OK) {
        return UCS_ERR_INVALID_PARAM;
    }
    length += header_length;
    if ((uct_rc_vqp_check_am_id(id) != UCS_OK) ||
        (uct_rc_vqp_check_length("am_zcopy header", header_length,
                                 UCT_RC_VQP_AM_MAX_HDR(iface->seg_size)) !=
         UCS_OK) ||
        (uct_rc_vqp_check_length("am_zcopy", length, iface->seg_size) !=
         UCS_OK) ||
        (uct_rc_vqp_iov_check_range(iov, iovcnt) != UCS_OK)) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_unlikely(ep->fc_credits <= 0)) {
        return UCS_ERR_NO_RESOURCE;
    }
    desc = uct_rc_vqp_ep_get_desc(ep);
    if (desc == NULL) {
        return UCS_ERR_NO_RESOURCE;
    }
    /* The receiver sees one contiguous message; AM sizes are bounded by the
     * segment, so gathering into the registered buffer costs one copy and
     * frees the user's buffers at once (completed: UCS_OK). */
    memcpy(desc + 1, header, header_length);
    uct_rc_vqp_am_iov_gather(UCS_PTR_BYTE_OFFSET(desc + 1, header_length), iov,
                             iovcnt);
    uct_rc_vqp_wr_init(&wr, VQP_OP_SEND_IMM, uct_rc_vqp_desc_wr_id(desc),
                       VQP_SEND_SIGNALED, desc + 1, length, desc->lkey, 0, 0);
    wr.imm = uct_rc_vqp_ep_am_imm(ep, id);
    status = uct_rc_vqp_ep_post(ep, &wr);
    if (status != UCS_OK) {
        ucs_mpool_put(desc);
        return status;
    }
    uct_rc_vqp_ep_am_sent(ep, wr.imm);
    return UCS_OK;
}

/* The core's opcode for UCT atomic @a op on @a size bytes, or
 * UCS_ERR_UNSUPPORTED: 64-bit add (and cswap, its own call) are basic;
 * everything else needs the device's extended atomics of that size; swap
 * only fetches (as in rc_mlx5); cswap is not an op of post/fetch. */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_rc_vqp_atomic_opcode(const uct_rc_vqp_iface_t *iface, unsigned op,
                         unsigned size, int fetch, vqp_opcode_t *vop)
{
    switch (op) {
    case UCT_ATOMIC_OP_ADD:
        *vop = VQP_OP_ATOMIC_FA;
        if (size == sizeof(uint64_t)) {
            return UCS_OK;
        }
        break;
    case UCT_ATOMIC_OP_AND:
        *vop = VQP_OP_ATOMIC_AND;
        break;
    case UCT_ATOMIC_OP_OR:
        *vop = VQP_OP_ATOMIC_OR;
        break;
    case UCT_ATOMIC_OP_XOR:
        *vop = VQP_OP_ATOMIC_XOR;
        break;
    case UCT_ATOMIC_OP_SWAP:
        *vop = VQP_OP_ATOMIC_SWAP;
        if (!fetch) {
            return UCS_ERR_UNSUPPORTED;
        }
        break;
    default:
        return UCS_ERR_UNSUPPORTED;
    }
    return (iface->ext_atomic_sizes & size) ? UCS_OK : UCS_ERR_UNSUPPORTED;
}

/* An atomic on @a size (8 or 4) bytes; the old value lands at @a result
 * in host order when it completes. */
static ucs_status_t uct_rc_vqp_ep_atomic(uct_rc_vqp_ep_t *ep,
                                         vqp_opcode_t opcode, unsigned size,
                                         uint64_t compare_add, uint64_t swap,
                                         void *result, uint64_t remote_addr,
                                         uct_rkey_t rkey,
                                         uct_completion_t *comp)
{
    ucs_status_t status;
    vqp_send_wr_t wr;

    if (remote_addr & (size - 1)) {
        ucs_error("rc_vqp: %u-bit atomic at unaligned address 0x%lx", size * 8,
                  remote_addr);
        return UCS_ERR_INVALID_PARAM;
    }
    uct_rc_vqp_wr_init(&wr, opcode, (uintptr_t)comp, VQP_SEND_SIGNALED, result,
                       size, 0, remote_addr, rkey);
    wr.compare_add = compare_add;
    wr.swap        = swap;
    status         = uct_rc_vqp_ep_post(ep, &wr);
    return (status == UCS_OK) ? UCS_INPROGRESS : status;
}

/* post: no result for the user; it lands in the interface's scratch word. */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_rc_vqp_ep_atomic_post(uct_ep_h tl_ep, unsigned opcode, unsigned size,
                          uint64_t value, uint64_t remote_addr, uct_rkey_t rkey)
{
    uct_rc_vqp_ep_t *ep       = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    vqp_opcode_t vop;
    ucs_status_t status;

    status = uct_rc_vqp_atomic_opcode(iface, opcode, size, 0, &vop);
    if (status != UCS_OK) {
        return status;
    }
    status = uct_rc_vqp_ep_atomic(ep, vop, size, value, 0, &iface->scratch,
                                  remote_addr, rkey, NULL);
    return (status == UCS_INPROGRESS) ? UCS_OK : status;
}

static UCS_F_ALWAYS_INLINE ucs_status_t uct_rc_vqp_ep_atomic_fetch(
    uct_ep_h tl_ep, unsigned opcode, unsigned size, uint64_t value,
    void *result, uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    vqp_opcode_t vop;
    ucs_status_t status;

    status = uct_rc_vqp_atomic_opcode(UCT_RC_VQP_EP_IFACE(ep), opcode, size, 1,
                                      &vop);
    if (status != UCS_OK) {
        return status;
    }
    return uct_rc_vqp_ep_atomic(ep, vop, size, value, 0, result, remote_addr,
                                rkey, comp);
}

ucs_status_t uct_rc_vqp_ep_atomic64_post(uct_ep_h tl_ep, unsigned opcode,
                                         uint64_t value, uint64_t remote_addr,
                                         uct_rkey_t rkey)
{
    return uct_rc_vqp_ep_atomic_post(tl_ep, opcode, sizeof(uint64_t), value,
                                     remote_addr, rkey);
}

ucs_status_t uct_rc_vqp_ep_atomic32_post(uct_ep_h tl_ep, unsigned opcode,
                                         uint32_t value, uint64_t remote_addr,
                                         uct_rkey_t rkey)
{
    return uct_rc_vqp_ep_atomic_post(tl_ep, opcode, sizeof(uint32_t), value,
                                     remote_addr, rkey);
}

ucs_status_t uct_rc_vqp_ep_atomic64_fetch(uct_ep_h tl_ep,
                                          uct_atomic_op_t opcode,
                                          uint64_t value, uint64_t *result,
                                          uint64_t remote_addr, uct_rkey_t rkey,
                                          uct_completion_t *comp)
{
    return uct_rc_vqp_ep_atomic_fetch(tl_ep, opcode, sizeof(uint64_t), value,
                                      result, remote_addr, rkey, comp);
}

ucs_status_t uct_rc_vqp_ep_atomic32_fetch(uct_ep_h tl_ep,
                                          uct_atomic_op_t opcode,
                                          uint32_t value, uint32_t *result,
                                          uint64_t remote_addr, uct_rkey_t rkey,
                                          uct_completion_t *comp)
{
    return uct_rc_vqp_ep_atomic_fetch(tl_ep, opcode, sizeof(uint32_t), value,
                                      result, remote_addr, rkey, comp);
}

ucs_status_t uct_rc_vqp_ep_atomic_cswap64(uct_ep_h tl_ep, uint64_t compare,
                                          uint64_t swap, uint64_t remote_addr,
                                          uct_rkey_t rkey, uint64_t *result,
                                          uct_completion_t *comp)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);

    return uct_rc_vqp_ep_atomic(ep, VQP_OP_ATOMIC_CS, sizeof(uint64_t), compare,
                                swap, result, remote_addr, rkey, comp);
}

ucs_status_t uct_rc_vqp_ep_atomic_cswap32(uct_ep_h tl_ep, uint32_t compare,
                                          uint32_t swap, uint64_t remote_addr,
                                          uct_rkey_t rkey, uint32_t *result,
                                          uct_completion_t *comp)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);

    if (!(UCT_RC_VQP_EP_IFACE(ep)->ext_atomic_sizes & sizeof(uint32_t))) {
        return UCS_ERR_UNSUPPORTED;
    }
    return uct_rc_vqp_ep_atomic(ep, VQP_OP_ATOMIC_CS, sizeof(uint32_t), compare,
                                swap, result, remote_addr, rkey, comp);
}

/* ------------------------------------------------ flush, fence, pending */

ucs_status_t uct_rc_vqp_ep_flush(uct_ep_h tl_ep, unsigned flags,
                                 uct_completion_t *comp)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    ucs_status_t status;
    vqp_send_wr_t wr;

    if (flags & UCT_FLUSH_FLAG_CANCEL) {
        /* Outstanding operations complete as canceled; the endpoint is
         * unusable afterwards, as UCT says. */
        vqp_cancel(ep->vqp);
        ep->flags |= UCT_RC_VQP_EP_FAILED;
        if (vqp_ops_in_flight(ep->vqp) == 0) {
            return UCS_OK;
        }
        if (comp != NULL) {
            if (ep->cancel_comp != NULL) {
                return UCS_ERR_NO_RESOURCE; /* one at a time */
            }
            /* No QP is left to carry a marker: the completion runs once
             * nothing is in flight (an operation that succeeded unsignaled
             * ends without a completion: progress checks too). */
            ep->cancel_comp = comp;
            ++UCT_RC_VQP_EP_IFACE(ep)->cancel_waiting;
        }
        return UCS_INPROGRESS;
    }
    /* Operations still waiting for the connection or in the pending queue
     * are not in the core yet: UCT wants UCS_ERR_NO_RESOURCE then, so that
     * the caller queues the flush behind them (UCP's fence would otherwise
     * complete before a put or get waiting there was even posted). */
    if (!(ep->flags & UCT_RC_VQP_EP_FAILED) &&
        ((ep->flags & UCT_RC_VQP_EP_NOT_READY) ||
         uct_rc_vqp_ep_behind_pending(ep))) {
        return UCS_ERR_NO_RESOURCE;
    }
    if (vqp_ops_in_flight(ep->vqp) == 0) {
        return UCS_OK;
    }
    uct_rc_vqp_wr_init(&wr, VQP_OP_FLUSH, (uintptr_t)comp,
                       (comp != NULL) ? VQP_SEND_SIGNALED : 0, NULL, 0, 0, 0,
                       0);
    status = vqp_post_send(ep->vqp, &wr);
    return (status == UCS_OK) ? UCS_INPROGRESS : status;
}

ucs_status_t uct_rc_vqp_ep_fence(uct_ep_h tl_ep, unsigned flags)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);

    /* Operations of one endpoint run on many QPs: the next one must wait
     * for all earlier ones, not only for those on its own QP. */
    if (vqp_ops_in_flight(ep->vqp) != 0) {
        ep->flags |= UCT_RC_VQP_EP_FENCE;
    }
    return UCS_OK;
}

ucs_status_t uct_rc_vqp_ep_check(uct_ep_h tl_ep, unsigned flags,
                                 uct_completion_t *comp)
{
    uct_rc_vqp_ep_t *ep = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    ucs_status_t status;
    vqp_send_wr_t wr;

    if (flags != 0) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ep->flags & (UCT_RC_VQP_EP_FAILED | UCT_RC_VQP_EP_NOT_READY)) {
        /* Reported already, or connecting: the connect timeout will tell. */
        return UCS_OK;
    }
    /* The core's probe: a zero-length write on every QP, so a dead peer
     * fails them all at once and the error is reported once. Posted even
     * with operations in flight: those may all have executed already, the
     * last one without a completion to come. */
    uct_rc_vqp_wr_init(&wr, VQP_OP_PROBE, 0, 0, NULL, 0, 0, 0, 0);
    status = vqp_post_send(ep->vqp, &wr);
    return (status == UCS_ERR_NO_RESOURCE) ? UCS_OK : status;
}

ucs_status_t uct_rc_vqp_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *req,
                                       unsigned flags)
{
    uct_rc_vqp_ep_t *ep       = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);

    /* BUSY only when the request could go now and would not overtake
     * earlier ones (a flush refused because of them must queue). */
    if (uct_rc_vqp_ep_can_send(ep) &&
        ucs_arbiter_group_is_empty(&ep->arb_group)) {
        return UCS_ERR_BUSY;
    }
    UCS_STATIC_ASSERT(sizeof(uct_pending_req_priv_arb_t) <=
                      UCT_PENDING_REQ_PRIV_LEN);
    uct_pending_req_arb_group_push(&ep->arb_group, req);
    /* Scheduled by progress once the endpoint has room again. */
    if (!(ep->flags & UCT_RC_VQP_EP_PENDING)) {
        ep->flags |= UCT_RC_VQP_EP_PENDING;
        ucs_list_add_tail(&iface->pending_eps, &ep->pending_list);
    }
    return UCS_OK;
}

void uct_rc_vqp_iface_schedule_pending(uct_rc_vqp_iface_t *iface)
{
    uct_rc_vqp_ep_t *ep, *tmp;

    ucs_list_for_each_safe(ep, tmp, &iface->pending_eps, pending_list)
    {
        if (ucs_arbiter_group_is_empty(&ep->arb_group)) {
            ep->flags &= ~UCT_RC_VQP_EP_PENDING;
            ucs_list_del(&ep->pending_list);
        } else if (uct_rc_vqp_ep_can_send(ep)) {
            ucs_arbiter_group_schedule(&iface->arbiter, &ep->arb_group);
        } else if ((ep->flags & UCT_RC_VQP_EP_FENCE) ||
                   (vqp_send_avail(ep->vqp) < iface->rma_max_iov)) {
            /* Waiting for room, or (fenced inline) for nothing in flight,
             * and unsignaled WQEs complete only behind a signaled one. A
             * refused post asks for that, but none is made while the
             * endpoint cannot send, and grants may have gone since. */
            vqp_cover_in_flight(ep->vqp);
        }
    }
}

ucs_arbiter_cb_result_t
uct_rc_vqp_ep_process_pending(ucs_arbiter_t *arbiter,
                              ucs_arbiter_group_t *group,
                              ucs_arbiter_elem_t *elem, void *arg)
{
    uct_pending_req_t *req = ucs_container_of(elem, uct_pending_req_t, priv);
    uct_rc_vqp_ep_t *ep = ucs_container_of(group, uct_rc_vqp_ep_t, arb_group);
    ucs_status_t status;

    ep->flags |= UCT_RC_VQP_EP_DISPATCH;
    status = req->func(req);
    ep->flags &= ~UCT_RC_VQP_EP_DISPATCH;
    if (status == UCS_OK) {
        return UCS_ARBITER_CB_RESULT_REMOVE_ELEM;
    } else if (status == UCS_INPROGRESS) {
        return UCS_ARBITER_CB_RESULT_NEXT_GROUP;
    } else if (uct_rc_vqp_ep_can_send(ep)) {
        /* Refused for another reason than room: try the others first. */
        return UCS_ARBITER_CB_RESULT_RESCHED_GROUP;
    }
    return UCS_ARBITER_CB_RESULT_DESCHED_GROUP;
}

static ucs_arbiter_cb_result_t
uct_rc_vqp_ep_purge_cb(ucs_arbiter_t *arbiter, ucs_arbiter_group_t *group,
                       ucs_arbiter_elem_t *elem, void *arg)
{
    uct_pending_req_t *req = ucs_container_of(elem, uct_pending_req_t, priv);
    uct_rc_vqp_purge_args_t *args = arg;

    if (args->cb != NULL) {
        args->cb(req, args->arg);
    }
    return UCS_ARBITER_CB_RESULT_REMOVE_ELEM;
}

void uct_rc_vqp_ep_pending_purge(uct_ep_h tl_ep,
                                 uct_pending_purge_callback_t cb, void *arg)
{
    uct_rc_vqp_ep_t *ep          = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface    = UCT_RC_VQP_EP_IFACE(ep);
    uct_rc_vqp_purge_args_t args = {cb, arg};

    ucs_arbiter_group_purge(&iface->arbiter, &ep->arb_group,
                            uct_rc_vqp_ep_purge_cb, &args);
}

/* -------------------------------------------------------- connection */

ucs_status_t uct_rc_vqp_ep_get_address(uct_ep_h tl_ep, uct_ep_addr_t *addr)
{
    uct_rc_vqp_ep_t *ep       = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    size_t len;

    return vqp_address_pack(ep->vqp, addr, iface->ep_addr_len, &len);
}

ucs_status_t uct_rc_vqp_ep_connect_to_ep(uct_ep_h tl_ep,
                                         const uct_device_addr_t *dev_addr,
                                         const uct_ep_addr_t *ep_addr)
{
    uct_rc_vqp_ep_t *ep       = ucs_derived_of(tl_ep, uct_rc_vqp_ep_t);
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);

    if (ep->flags & (UCT_RC_VQP_EP_CONNECTED | UCT_RC_VQP_EP_NOT_READY)) {
        ucs_error("rc_vqp ep %p: already connected%s", ep,
                  (ep->flags & UCT_RC_VQP_EP_NOT_READY)
                      ? " (to an interface address)"
                      : "");
        return UCS_ERR_INVALID_PARAM;
    }
    return uct_rc_vqp_ep_connect_vqp(ep, ep_addr, iface->ep_addr_len);
}

ucs_status_t uct_rc_vqp_ep_connect_vqp(uct_rc_vqp_ep_t *ep, const void *addr,
                                       size_t len)
{
    uct_rc_vqp_iface_t *iface = UCT_RC_VQP_EP_IFACE(ep);
    ucs_status_t status;

    status = vqp_connect(ep->vqp, addr, len);
    if (status != UCS_OK) {
        return status;
    }
    ep->flags |= UCT_RC_VQP_EP_CONNECTED;
    ep->flags &= ~UCT_RC_VQP_EP_NOT_READY;
    /* Requests queued while connecting may go now. */
    ucs_arbiter_group_schedule(&iface->arbiter, &ep->arb_group);
    return UCS_OK;
}

UCS_CLASS_INIT_FUNC(uct_rc_vqp_ep_t, const uct_ep_params_t *params)
{
    uct_rc_vqp_iface_t *iface =
        ucs_derived_of(params->iface, uct_rc_vqp_iface_t);
    /* The connection manager creates passive endpoints with the QP count
     * and scheme of the peer's request. */
    vqp_params_t vqp_params = (iface->cm.passive_params != NULL)
                                  ? *iface->cm.passive_params
                                  : iface->vqp_params;
    vqp_dev_addr_t dev_addr;
    ucs_status_t status;
    uint32_t cm_qpn = 0;
    int to_iface;

    UCS_CLASS_CALL_SUPER_INIT(uct_base_ep_t, &iface->super);

    to_iface = !!(params->field_mask & UCT_EP_PARAM_FIELD_IFACE_ADDR);
    if (to_iface != !!(params->field_mask & UCT_EP_PARAM_FIELD_DEV_ADDR)) {
        ucs_error("rc_vqp: an endpoint to an interface needs both its device"
                  " and its interface address");
        return UCS_ERR_INVALID_PARAM;
    }
    if (to_iface) {
        if ((params->dev_addr == NULL) || (params->iface_addr == NULL)) {
            ucs_error("rc_vqp: NULL device or interface address");
            return UCS_ERR_INVALID_PARAM;
        }
        status = vqp_dev_addr_unpack(params->dev_addr, VQP_DEV_ADDR_PACKED_MAX,
                                     &dev_addr, NULL);
        if (status != UCS_OK) {
            ucs_error("rc_vqp: invalid device address");
            return status;
        }
        status =
            uct_rc_vqp_cm_unpack_iface_address(params->iface_addr, &cm_qpn);
        if (status != UCS_OK) {
            return status;
        }
        status = vqp_dev_is_reachable(iface->dev, &dev_addr);
        if (status != UCS_OK) {
            ucs_error("rc_vqp: the peer device is not reachable from %s",
                      UCT_RC_VQP_NAME);
            return status;
        }
    }
    vqp_params.comp_arg = self;
    status              = vqp_create(&vqp_params, &self->vqp);
    if (status != UCS_OK) {
        return status;
    }
    self->flags        = 0;
    self->fc_credits   = (int)iface->fc_wnd - UCT_RC_VQP_FC_RESERVE;
    self->fc_to_return = 0;
    self->cancel_comp  = NULL;
    self->conn         = NULL;
    ucs_arbiter_group_init(&self->arb_group);
    ucs_list_add_tail(&iface->eps, &self->list);
    if (to_iface) {
        status = uct_rc_vqp_cm_connect(self, &dev_addr, cm_qpn);
        if (status != UCS_OK) {
            ucs_list_del(&self->list);
            ucs_arbiter_group_cleanup(&self->arb_group);
            vqp_destroy(self->vqp);
            return status;
        }
    }
    return UCS_OK;
}

static void uct_rc_vqp_ep_purge_warn(uct_pending_req_t *req, void *arg)
{
    ucs_warn("rc_vqp ep %p: destroyed with pending request %p", arg, req);
}

UCS_CLASS_CLEANUP_FUNC(uct_rc_vqp_ep_t)
{
    uct_rc_vqp_ep_pending_purge(&self->super.super, uct_rc_vqp_ep_purge_warn,
                                self);
    /* Operations in flight complete as canceled (their completions run),
     * receive buffers return to the pool. */
    self->flags |= UCT_RC_VQP_EP_FAILED;
    vqp_destroy(self->vqp);
    uct_rc_vqp_cm_ep_cleanup(self);
    ucs_arbiter_group_cleanup(&self->arb_group);
    if (self->cancel_comp != NULL) { /* destroyed before it completed */
        --UCT_RC_VQP_EP_IFACE(self)->cancel_waiting;
    }
    if (self->flags & UCT_RC_VQP_EP_PENDING) {
        ucs_list_del(&self->pending_list);
    }
    if (self->flags & UCT_RC_VQP_EP_GRANT) {
        ucs_list_del(&self->grant_list);
    }
    ucs_list_del(&self->list);
}

UCS_CLASS_DEFINE(uct_rc_vqp_ep_t, uct_base_ep_t);
UCS_CLASS_DEFINE_NEW_FUNC(uct_rc_vqp_ep_t, uct_ep_t, const uct_ep_params_t *);
UCS_CLASS_DEFINE_DELETE_FUNC(uct_rc_vqp_ep_t, uct_ep_t);
