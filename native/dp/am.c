/*
 * am.c — active messages: the shm eager send, and the arrivals of the ids an
 * external caller's handlers run.
 *
 * Theory of operation.  An eager active message is one frame (wire.AmId
 * AM_EAGER): its header is wire.AM (the message's 16-bit id and its user
 * header's length, little-endian) followed by the user header; its payload
 * is the data.  Python's path (ucxpy/am.py) reads and writes the same
 * frame, so either side of a connection may be C or Python.
 *
 * Send: a C caller (libucp) pushes the frame into the peer's inbox as the
 * tagged eager send does (lane.c), when the lane is open (or writes it on a
 * tcp connection: stream.c, which also reads them); anything else
 * (a closed lane, a full ring, a header above UCXDP_AM_HEADER_MAX) is
 * declined and goes by Python's path, which also runs every rendezvous.
 *
 * Receive: handlers written in C (libucp's) claim their ids on the worker,
 * which names one hook for their arrivals.  The inbox's dispatch then takes
 * a claimed id's eager frame of a registered connection and calls the hook
 * with views of the header and data (the hook copies what it keeps), under
 * the worker's lock; any other active message stops the dispatch there and
 * Python's path runs it — an unclaimed id (Python's handlers, or messages
 * held until a handler comes), an offer (AM_RTS), a size the protocol
 * table gives to Python — so a connection's messages still reach the
 * handlers in the order they were sent.
 */
#include <stdlib.h>
#include <string.h>

#include "dp.h"
#include "ucxpy_native.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "wire.AM is little-endian: it is read and written as is"
#endif

#define AM_HEAD UCXDP_AM_HEAD

void ucxdp_am_set_hook(ucxdp_worker_t *w, ucxdp_am_hook_t hook, void *arg)
{
    pthread_mutex_lock(&w->lock);
    w->am_hook = hook;
    w->am_arg = arg;
    pthread_mutex_unlock(&w->lock);
}

ucxdp_status_t ucxdp_am_claim(ucxdp_worker_t *w, unsigned id, int on)
{
    ucxdp_status_t st = UCXDP_OK;

    if (id >= UCXDP_AM_IDS)
        return UCXDP_ERR_INVALID_PARAM;
    pthread_mutex_lock(&w->lock);
    if (w->am_claimed == NULL && on)
        w->am_claimed = calloc(UCXDP_AM_IDS / 8, 1);
    if (w->am_claimed == NULL)
        st = on ? UCXDP_ERR_NO_MEMORY : UCXDP_OK;
    else if (on)
        w->am_claimed[id / 8] |= (uint8_t)(1u << (id % 8));
    else
        w->am_claimed[id / 8] &= (uint8_t)~(1u << (id % 8));
    pthread_mutex_unlock(&w->lock);
    return st;
}

size_t ucxdp_am_head(uint8_t *out, unsigned id, const void *header, uint64_t header_length)
{
    uint16_t h[2] = {(uint16_t)id, (uint16_t)header_length};

    memcpy(out, h, AM_HEAD);
    if (header_length)
        memcpy(out + AM_HEAD, header, (size_t)header_length);
    return AM_HEAD + (size_t)header_length;
}

ucxdp_status_t ucxdp_lane_am(ucxdp_worker_t *w, const ucxdp_lane_t *lane, unsigned id,
                             const void *header, uint64_t header_length, const void *buffer,
                             uint64_t length, int *wake)
{
    uint8_t head[AM_HEAD + UCXDP_AM_HEADER_MAX];
    int rc;

    *wake = 0;
    if (lane->am_eager_id == 0 || !lane->open || lane->dead || id >= UCXDP_AM_IDS
            || header_length > UCXDP_AM_HEADER_MAX || length > lane->max_frame)
        return UCXDP_ERR_NO_RESOURCE;
    rc = ucxpy_ring_push(lane->ring, lane->am_eager_id, head,
                         ucxdp_am_head(head, id, header, header_length), buffer, (size_t)length);
    if (rc < 0)                            /* full, busy, closed, corrupt: Python's path */
        return UCXDP_ERR_NO_RESOURCE;
    *wake = rc == 1;
    UCXDP_COUNT(w, am_send, 1);
    return UCXDP_OK;
}

void ucxdp_inbox_am(ucxdp_inbox_t *in, unsigned am_eager_id)
{
    in->am_eager_id = am_eager_id;
}

int ucxdp_am_runs(const ucxdp_worker_t *w, unsigned id)
{
    return w->am_hook != NULL && w->am_claimed != NULL && id < UCXDP_AM_IDS
        && (w->am_claimed[id / 8] & (1u << (id % 8)));
}

int ucxdp_am_take_frame(ucxdp_worker_t *w, ucxdp_inbox_t *in, const ucxdp_conn_t *c,
                        const uint64_t *out, int *wake)
{
    const uint8_t *hdr = in->ring->data + out[1];
    uint16_t h[2];

    *wake = 0;
    if (c == NULL || in->am_eager_id == 0 || out[0] != in->am_eager_id || out[2] < AM_HEAD
            || ucxdp_inbox_handed(in, out[4]))
        return 0;
    memcpy(h, hdr, AM_HEAD);
    if (!ucxdp_am_runs(w, h[0]) || AM_HEAD + (uint64_t)h[1] > out[2])
        return 0;                          /* (Python's handler, or a malformed header:
                                              Python's path reports it) */
    w->am_hook(w->am_arg, c->source, h[0], hdr + AM_HEAD, h[1], in->ring->data + out[3],
               out[4]);
    UCXDP_COUNT(w, am_recv, 1);
    if (ucxpy_ring_release(in->ring) == UCXPY_RING_NOTIFY)
        *wake = 1;
    return 1;
}
