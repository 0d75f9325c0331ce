/*
 * lane.c — the shm eager send: a peer's inbox as a C sender sees it.
 *
 * Theory of operation.  Python's shm transport connects to a peer's inbox
 * (a ring in shared memory, native/ring.c) and keeps, per connection, a
 * ucxdp_lane_t: the ring, the frame id of eager messages, the largest
 * payload a frame may carry, and two flags it keeps current.  `open` says
 * that a frame pushed now is next in the connection's order (nothing of
 * Python's is queued before it, the connection is accepted and not
 * closing); `dead` that the connection is gone for good (its ring is about
 * to be unmapped: it is set first).  A C caller (libucp) then sends an
 * eager message as Python's fast path does, one frame (an 8-byte
 * little-endian tag header and the payload) pushed into the ring, without
 * the interpreter; anything else (a closed lane, a full ring, a message too
 * large) is declined and goes by Python's path, which queues or reports.
 *
 * The caller serializes with Python (libucp's lock): the flags change only
 * in Python's path, never during a push.
 */
#include "dp.h"
#include "ucxpy_native.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "an eager frame's tag is little-endian (ucxpy.wire.EAGER): it is written as is"
#endif

ucxdp_status_t ucxdp_lane_eager(ucxdp_worker_t *w, const ucxdp_lane_t *lane, uint64_t tag,
                                const void *buffer, uint64_t length, int *wake)
{
    int rc;

    *wake = 0;
    if (!lane->open || lane->dead || length > lane->max_frame)
        return UCXDP_ERR_NO_RESOURCE;
    rc = ucxpy_ring_push(lane->ring, lane->eager_am_id, &tag, sizeof tag, buffer,
                         (size_t)length);
    if (rc < 0)                            /* full, busy, closed, corrupt: Python's path */
        return UCXDP_ERR_NO_RESOURCE;
    *wake = rc == 1;
    UCXDP_COUNT(w, tag_send, 1);
    return UCXDP_OK;
}
