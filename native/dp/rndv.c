/*
 * rndv.c — the shm rendezvous, per message in C: the offer, its read by
 * CMA, and the answer.
 *
 * Theory of operation.  A tagged send of at least the endpoint's rendezvous
 * threshold is offered, not copied: the sender registers the send (Python's
 * RendezvousProtocol keeps it under its id, with the buffer, until the
 * answer) and pushes a TAG_RTS frame into the peer's inbox through the
 * connection's lane (lane.c): wire.RTS (tag, send id, size, address), then
 * the shm key of the buffer, shm_md.RKEY ("SHMK", our pid, base, length).
 * The receiver matches the offer like any message (tag.c); the receive that
 * takes it reads the bytes whole from the sender's memory with one
 * process_vm_readv (when the key names the peer of its lane, covers them,
 * and CMA to that peer works), then pushes the answer, an RNDV_ATS frame
 * (wire.ATS: send id, status OK), on its own lane back to the sender, whose
 * ATS handler completes the send.
 *
 *     sender                         receiver
 *     ucxdp_lane_rts ── TAG_RTS ──>  match ── ucxdp_lane_get (CMA read)
 *     send completes <── RNDV_ATS ── ucxdp_lane_ats
 *
 * Everything else is the caller's path, which these functions decline to
 * (UCXDP_ERR_NO_RESOURCE, nothing done): a lane that is not open (Python has
 * frames queued before), a full ring, a key of another kind or process, CMA
 * that does not work here, a short read (Python's path reads again and
 * reports the error), an offer the receiver splits.  The transport fills in
 * the lane's pids and whether CMA works; it never sees a tag.
 */
#include <string.h>

#include "dp.h"
#include "ucxpy_native.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "wire.RTS, wire.ATS and shm_md.RKEY are little-endian: they are written as is"
#endif

#define RTS_SIZE 32                        /* wire.RTS: tag, sreq id, size, address */
#define SHM_KEY_SIZE 24                    /* shm_md.RKEY: magic, pid, base, length */
#define ATS_SIZE 9                         /* wire.ATS: sreq id, status */

static const char shm_key_magic[4] = {'S', 'H', 'M', 'K'};

ucxdp_status_t ucxdp_lane_rts(ucxdp_worker_t *w, const ucxdp_lane_t *lane, uint64_t tag,
                              uint64_t sreq_id, const void *buffer, uint64_t length, int *wake)
{
    uint8_t hdr[RTS_SIZE + SHM_KEY_SIZE];
    uint64_t addr = (uint64_t)(uintptr_t)buffer;
    uint64_t rts[4] = {tag, sreq_id, length, addr};
    int rc;

    *wake = 0;
    if (!lane->open || lane->dead || lane->rts_am_id == 0 || lane->pid == 0)
        return UCXDP_ERR_NO_RESOURCE;
    memcpy(hdr, rts, RTS_SIZE);
    memcpy(hdr + RTS_SIZE, shm_key_magic, 4);
    memcpy(hdr + RTS_SIZE + 4, &lane->pid, 4);
    memcpy(hdr + RTS_SIZE + 8, &addr, 8);
    memcpy(hdr + RTS_SIZE + 16, &length, 8);
    rc = ucxpy_ring_push(lane->ring, lane->rts_am_id, hdr, sizeof hdr, NULL, 0);
    if (rc < 0)
        return UCXDP_ERR_NO_RESOURCE;
    *wake = rc == 1;
    UCXDP_COUNT(w, rndv_offer, 1);
    return UCXDP_OK;
}

ucxdp_status_t ucxdp_lane_get(ucxdp_worker_t *w, const ucxdp_lane_t *lane, const void *key,
                              size_t key_length, uint64_t remote_addr, void *buffer,
                              uint64_t length)
{
    const uint8_t *k = key;
    uint32_t pid;
    uint64_t base, extent;

    if (key_length != SHM_KEY_SIZE || memcmp(k, shm_key_magic, 4) != 0 || !lane->cma
            || lane->dead)
        return UCXDP_ERR_NO_RESOURCE;
    memcpy(&pid, k + 4, 4);
    memcpy(&base, k + 8, 8);
    memcpy(&extent, k + 16, 8);
    if (pid == 0 || pid != lane->peer_pid || remote_addr < base
            || remote_addr + length < remote_addr || remote_addr + length > base + extent)
        return UCXDP_ERR_NO_RESOURCE;
    if (length != 0 && ucxpy_cma_read((int)pid, buffer, remote_addr, (size_t)length)
                       != (int64_t)length)
        return UCXDP_ERR_NO_RESOURCE;
    UCXDP_COUNT(w, rndv_get, 1);
    UCXDP_COUNT(w, rndv_get_bytes, length);
    return UCXDP_OK;
}

ucxdp_status_t ucxdp_lane_ats(ucxdp_worker_t *w, const ucxdp_lane_t *lane, uint64_t sreq_id,
                              uint8_t status, int *wake)
{
    uint8_t hdr[ATS_SIZE];
    int rc;

    *wake = 0;
    if (!lane->open || lane->dead || lane->ats_am_id == 0)
        return UCXDP_ERR_NO_RESOURCE;
    memcpy(hdr, &sreq_id, 8);
    hdr[8] = status;
    rc = ucxpy_ring_push(lane->ring, lane->ats_am_id, hdr, sizeof hdr, NULL, 0);
    if (rc < 0)
        return UCXDP_ERR_NO_RESOURCE;
    *wake = rc == 1;
    UCXDP_COUNT(w, rndv_ats, 1);
    return UCXDP_OK;
}

/* -- an external caller's sends, and the frames the inbox takes ------------------------
 *
 * A C caller (libucp) offers a send with ucxdp_rndv_send: the offer goes as
 * above, with an id of its own (UCXDP_RNDV_EXT_ID set: Python's ids are
 * small), and the send waits in the worker's list until its answer.  The
 * answer comes back into our inbox as an RNDV_ATS frame, which the inbox's
 * dispatch takes (ucxdp_rndv_take_frame) without Python; Python's path, when
 * it handles such a frame itself, records it the same way (the binding's
 * Worker.rndv_answered).  A receiver that wants the data otherwise (frames,
 * a split) asks by Python's protocol, whose sender side then adopts the send
 * (ucxdp_rndv_adopt: its bytes move by Python's protocol, and the ATS goes
 * to Python's path, which answers the send in the end).  A peer that
 * fails answers its sends with CONNECTION_RESET (ucxdp_rndv_fail_peer, from
 * Python's failure path).
 *
 * On the receiving side the inbox takes an RTS frame of a registered
 * connection when the receive it matches first is an external caller's
 * (libucp's) with room for it, the offer is at most `rndv_max` bytes (read
 * whole: below the split floor, as Python's path decides), and the
 * connection has an open lane back whose peer CMA reaches: the bytes are read
 * into the receive, which goes on its owner's done list, and the ATS is
 * pushed on that lane (or owed, and pushed by a later dispatch, when the
 * lane's ring is full).  Anything else stays in the inbox for Python's path,
 * in order: another receive first, a receive of Python's, an unexpected
 * offer, truncation, a read that fails.
 */

ucxdp_status_t ucxdp_rndv_send(ucxdp_worker_t *w, const ucxdp_lane_t *lane,
                               ucxdp_rndv_send_t *s, uint64_t tag, int *wake)
{
    ucxdp_status_t st;

    pthread_mutex_lock(&w->lock);
    s->id = UCXDP_RNDV_EXT_ID | ++w->send_ids;
    if (w->proto != NULL && ucxdp_proto_covers(w, s->length)) {
        st = ucxdp_proto_send_locked(w, lane, s, tag, wake);   /* (a plug-in's sizes) */
        pthread_mutex_unlock(&w->lock);
        return st;
    }
    st = ucxdp_lane_rts(w, lane, tag, s->id, s->buffer, s->length, wake);
    if (st == UCXDP_OK) {
        s->status = UCXDP_INPROGRESS;
        ucxdp_list_append(&w->sends, &s->link);
    }
    pthread_mutex_unlock(&w->lock);
    return st;
}

/* the send `id` in list `head`, or NULL */
static ucxdp_rndv_send_t *find_locked(ucxdp_link_t *head, uint64_t id)
{
    for (ucxdp_link_t *l = head->next; l != head; l = l->next)
        if (UCXDP_DONE_SEND(l)->id == id)
            return UCXDP_DONE_SEND(l);
    return NULL;
}

ucxdp_rndv_send_t *ucxdp_rndv_find_locked(ucxdp_worker_t *w, uint64_t id)
{
    return find_locked(&w->sends, id);
}

/* the answer to send `id`, waiting (`adopted`: or Python's path's) */
static int answered_locked(ucxdp_worker_t *w, uint64_t id, uint8_t status, int adopted)
{
    ucxdp_rndv_send_t *s = find_locked(&w->sends, id);

    if (s == NULL && adopted)
        s = find_locked(&w->adopted, id);
    if (s == NULL)
        return 0;
    ucxdp_list_remove(&s->link);
    /* wire.ATS_ERROR (2): the receiver could not read; OK and DROPPED (a
     * receive too small, which the receiver reports) complete the send */
    s->status = status == 2 ? UCXDP_ERR_CONNECTION_RESET : UCXDP_OK;
    ucxdp_list_append(&w->sends_done, &s->link);
    UCXDP_COUNT(w, rndv_answered, 1);
    return 1;
}

int ucxdp_rndv_answered(ucxdp_worker_t *w, uint64_t id, uint8_t status)
{
    int found;

    pthread_mutex_lock(&w->lock);
    found = answered_locked(w, id, status, 1);
    pthread_mutex_unlock(&w->lock);
    return found;
}

ucxdp_rndv_send_t *ucxdp_rndv_adopt(ucxdp_worker_t *w, uint64_t id)
{
    ucxdp_rndv_send_t *s;

    pthread_mutex_lock(&w->lock);
    s = find_locked(&w->sends, id);
    if (s != NULL) {
        ucxdp_list_remove(&s->link);
        ucxdp_list_append(&w->adopted, &s->link);
    }
    pthread_mutex_unlock(&w->lock);
    return s;
}

void ucxdp_rndv_fail_peer(ucxdp_worker_t *w, int64_t peer, ucxdp_status_t status)
{
    ucxdp_link_t *l, *next;

    ucxdp_link_t *lists[2] = {&w->sends, &w->adopted};

    pthread_mutex_lock(&w->lock);
    if (w->proto != NULL)
        ucxdp_proto_fail_peer_locked(w, peer);     /* (before its sends go) */
    for (int k = 0; k < 2; k++)
        for (l = lists[k]->next; l != lists[k]; l = next) {
            ucxdp_rndv_send_t *s = UCXDP_DONE_SEND(l);
            next = l->next;
            if (s->peer == peer) {
                ucxdp_list_remove(l);
                s->status = status;
                ucxdp_list_append(&w->sends_done, l);
            }
        }
    pthread_mutex_unlock(&w->lock);
}

void ucxdp_rndv_take_done(ucxdp_worker_t *w, ucxdp_link_t *out)
{
    pthread_mutex_lock(&w->lock);
    ucxdp_list_take_all(&w->sends_done, out);
    pthread_mutex_unlock(&w->lock);
}

/* An answer went into the ring of the peer behind connection `conn`, which
 * sleeps: Python's path wakes it (the binding's Inbox.take_wakes, reported
 * as a producer to wake, which brings a C caller's progress into Python). */
void ucxdp_inbox_peer_wake(ucxdp_inbox_t *in, uint64_t conn)
{
    if (in->nwake < UCXDP_INBOX_OWED)
        in->wake_conns[in->nwake++] = conn;
    else
        in->wake_all = 1;
    __atomic_store_n(&in->owed_wake, 1, __ATOMIC_RELAXED);
}

void ucxdp_rndv_push_owed(ucxdp_worker_t *w, ucxdp_inbox_t *in)
{
    int k = 0, wake;

    for (int i = 0; i < in->nowed; i++) {
        ucxdp_owed_ats_t *o = &in->owed[i];
        if (o->lane == NULL || o->lane->dead)
            continue;                      /* (the peer is gone: nothing waits) */
        if (o->lane->open && ucxdp_lane_ats(w, o->lane, o->sreq_id, 0, &wake) == UCXDP_OK) {
            if (wake)
                ucxdp_inbox_peer_wake(in, o->conn);
            continue;
        }
        in->owed[k++] = *o;
    }
    in->nowed = k;
}

int ucxdp_rndv_take_frame(ucxdp_worker_t *w, ucxdp_inbox_t *in, const ucxdp_conn_t *c,
                          const uint64_t *out, int *wake)
{
    const uint8_t *hdr = in->ring->data + out[1];
    uint64_t rts[4], id;
    ucxdp_lane_t *lane;
    ucxdp_tag_recv_t *r;
    int ats_wake;

    *wake = 0;
    if (in->ats_am_id != 0 && out[0] == in->ats_am_id) {
        if (out[2] != ATS_SIZE || out[4] != 0)
            return 0;
        memcpy(&id, hdr, 8);
        /* (one of Python's sends, one Python's path adopted, or one that
         * failed meanwhile: Python's path takes the answer) */
        if (!(id & UCXDP_RNDV_EXT_ID) || !answered_locked(w, id, hdr[8], 0))
            return 0;
        *wake = ucxpy_ring_release(in->ring) == UCXPY_RING_NOTIFY;
        return 1;
    }
    if (in->rts_am_id == 0 || out[0] != in->rts_am_id || c == NULL
            || out[2] != RTS_SIZE + SHM_KEY_SIZE || out[4] != 0 || in->nowed >= UCXDP_INBOX_OWED)
        return 0;
    lane = c->lane;
    if (lane == NULL || !lane->open || lane->dead || !lane->cma)
        return 0;
    memcpy(rts, hdr, RTS_SIZE);            /* tag, sreq id, size, address */
    if (rts[2] > in->rndv_max || ucxdp_inbox_handed(in, rts[2]))
        return 0;
    r = ucxdp_tag_peek_ext(w, c->source, rts[0], rts[2]);
    if (r == NULL)
        return 0;                          /* (unexpected, Python's, or too small: Python's path) */
    /* read first: a read that fails leaves the receive posted and the frame
     * to Python's path, which reads again and reports */
    if (ucxdp_lane_get(w, lane, hdr + RTS_SIZE, SHM_KEY_SIZE, rts[3], r->buffer, rts[2])
            != UCXDP_OK)
        return 0;
    ucxdp_match_arrived(&w->matcher, c->source, rts[0]);    /* (r, out of the matcher) */
    r->info_source = c->source;
    r->info_tag = rts[0];
    r->info_length = rts[2];
    r->handoff = NULL;
    r->status = UCXDP_OK;
    ucxdp_tag_done_locked(w, r);
    UCXDP_COUNT(w, rndv_expected, 1);
    if (ucxdp_lane_ats(w, lane, rts[1], 0, &ats_wake) != UCXDP_OK) {
        in->owed[in->nowed].lane = lane;
        in->owed[in->nowed].conn = c->conn;
        in->owed[in->nowed].sreq_id = rts[1];
        in->nowed++;
    } else if (ats_wake) {
        ucxdp_inbox_peer_wake(in, c->conn);
    }
    *wake = ucxpy_ring_release(in->ring) == UCXPY_RING_NOTIFY;
    return 1;
}
