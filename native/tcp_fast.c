/* The tcp transport's native fast path: an eager receive read from the
 * socket itself, an eager send in one system call (part of ucxpy._fastpath).
 *
 * Theory of operation
 * -------------------
 * A blocking tagged receive from a peer behind a tcp connection normally
 * takes a progress pass: epoll, a read into the connection's FrameReader
 * (ucxpy/transports/tcp_frames.py), the frame cut out and dispatched through
 * the core's matcher.  When nothing of that connection is buffered in
 * Python, the next bytes of the socket are the next frame, so this C call
 * can take it from the socket itself.  Two ways, by the receive's size:
 *
 *   small (24 + capacity <= 32 KiB + 24 bytes): one plain recv of at most
 *   24 + capacity bytes into a bounce buffer, as UCX's tcp transport reads.
 *   A whole matching frame is copied into the receive buffer: one system
 *   call per message (a copy in cache costs less than a second call: 16 KiB
 *   0.5 us faster than the large way).  The rest of a matching frame read
 *   in part is polled for, by a caller that spins.  Whatever else was read
 *   (another frame, part of one, bytes behind a frame shorter than the
 *   buffer, a frame still late) is the head of the stream and goes back to
 *   Python as ``spill``, which the caller puts in front of the connection's
 *   FrameReader (TcpEndpoint._spill), in order.
 *
 *   large: recv(MSG_PEEK) of up to 1056 bytes (the poll) shows the frame's
 *   head; a matching frame is then read with one recvmsg of exactly its
 *   bytes, prefix and header into a scratch array and the payload straight
 *   into the receive buffer: two system calls, no copy.  A frame of up to
 *   32 KiB is read as soon as its head is there; if only part of it was,
 *   the rest is polled for, and when it is late (its sender may be waiting
 *   for us) what was read goes back as ``spill``, which fits the reader.  A
 *   larger frame is read only once FIONREAD says all of it has arrived.
 *
 * The frame layout is tcp_frames.PREFIX (little-endian: magic u16, am_id
 * u8, flags u8, header length u16, pad u16, payload length u64) followed by
 * the 8-byte little-endian tag (wire.EAGER).
 *
 * tcp_recv_tag(fd, am_id, tag, mask, buffer, spins) -> (n, tag, spill)
 *   n >= 0: the frame's payload length, its tag; -1: no whole frame within
 *   ``spins`` polls (or an error or end of stream on the socket, which the
 *   Python path reports); -2: the next frame is another one (or only part
 *   of it had arrived).  ``spill``: None, or the bytes read past what was
 *   taken, to be parsed before anything else of this connection.
 *
 * The send side is the mirror image: when nothing is queued before it, an
 * eager frame (prefix, tag, payload) goes out with one sendmsg from a
 * 24-byte stack header and the caller's buffer, no bytes object built.
 *
 * tcp_send_tag(fd, am_id, tag, buffer, max_payload) -> left
 *   the bytes of the frame (24 + len(buffer)) the socket did not take: 0
 *   when it took all of it, else the caller queues that tail; -1: none
 *   taken (full socket, or an error the Python path reports); -100:
 *   payload over ``max_payload``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "pyfastcall.h"
#include "tcp_fast.h"
#include "ucxpy_native.h"

#define TCP_FRAME_MAGIC 0xC5A7
#define TCP_PREFIX      16
#define TCP_EAGER_HEAD  (TCP_PREFIX + 8)
#define TCP_PEEK        1056    /* bytes a poll peeks at: a 1 KiB payload and its head */
#define TCP_READ_MAX    (32 * 1024 + TCP_EAGER_HEAD)  /* a frame read before it is whole:
                                   the spill of its part fits the reader (64 KiB) */
#ifndef TCP_SMALL_MAX
#define TCP_SMALL_MAX   TCP_READ_MAX    /* the largest frame the small way reads */
#endif
#define TCP_REST_SPINS  256     /* polls for the rest of a frame read in part
                                   (none when the caller does not spin) */

typedef struct tcp_eager_head {
    uint16_t magic;
    uint8_t  am_id;
    uint8_t  flags;
    uint16_t hlen;
    uint16_t pad;
    uint64_t plen;
    uint64_t tag;
} tcp_eager_head_t;

_Static_assert(sizeof(tcp_eager_head_t) == TCP_EAGER_HEAD, "tcp eager frame head");

/* bytes readable on ``fd`` now, or -1 on error */
static long readable(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) < 0 ? -1 : n;
}

/* the frame head at ``h`` is an eager frame of ``am_id`` whose tag matches
 * and whose payload fits ``capacity`` */
static int head_matches(const tcp_eager_head_t *h, uint8_t am_id, uint64_t tag, uint64_t mask,
                        uint64_t capacity)
{
    return h->magic == TCP_FRAME_MAGIC && h->am_id == am_id && h->flags == 0 && h->hlen == 8
        && h->plen <= capacity && !((h->tag ^ tag) & mask);
}

/* The bounce buffer of the small way: one frame of up to TCP_READ_MAX bytes
 * (a caller holds the GIL: one at a time) */
static union {
    tcp_eager_head_t h;
    uint8_t bytes[TCP_READ_MAX];
} bounce;

/* The rest of a frame read in part: reads into ``dst`` (which holds ``have``
 * of the ``want`` bytes) until it holds them all, the stream ends or fails,
 * or ``spins`` polls found nothing (one that reads something does not
 * count: the sender is still writing).  How many ``dst`` holds then. */
static uint64_t read_rest(int fd, uint8_t *dst, uint64_t have, uint64_t want, int spins)
{
    ssize_t r;

    while (have < want) {
        r = recv(fd, dst + have, want - have, MSG_DONTWAIT);
        if (r > 0) {
            have += (uint64_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                || spins-- <= 0)
            break;
        ucxpy_cpu_relax();
    }
    return have;
}

/* The small way (see the top): >= 0 payload taken, -1 nothing there, -2
 * another frame or part of one; ``*spill`` gets what was read and not taken.
 * The rest of a matching frame read in part is polled for (read_rest). */
static int64_t take_small(int fd, uint8_t am_id, uint64_t tag, uint64_t mask,
                          void *buf, uint64_t capacity, uint64_t *got_tag, PyObject **spill,
                          int spins)
{
    uint64_t frame = 0;
    ssize_t n = recv(fd, bounce.bytes, TCP_EAGER_HEAD + capacity, MSG_DONTWAIT);

    if (n <= 0)
        return -1;          /* (end of stream and errors: the Python path reports them) */
    if (n >= TCP_EAGER_HEAD && head_matches(&bounce.h, am_id, tag, mask, capacity)) {
        frame = TCP_EAGER_HEAD + bounce.h.plen;
        n = (ssize_t)read_rest(fd, bounce.bytes, (uint64_t)n, frame, spins);
    }
    if (frame == 0 || (uint64_t)n < frame) {
        *spill = PyBytes_FromStringAndSize((const char *)bounce.bytes, n);
        return *spill == NULL ? -4 : -2;
    }
    memcpy(buf, bounce.bytes + TCP_EAGER_HEAD, (size_t)bounce.h.plen);
    *got_tag = bounce.h.tag;
    if ((uint64_t)n > frame &&
            (*spill = PyBytes_FromStringAndSize((const char *)bounce.bytes + frame,
                                                n - (ssize_t)frame)) == NULL)
        return -4;
    return (int64_t)bounce.h.plen;
}

/* The large way (see the top): >= 0 payload taken, -1 not (yet) there, -2
 * another frame (nothing consumed), or a frame of ours that did not arrive
 * whole in time (what was read of it in ``*spill``). */
static int64_t take_large(int fd, uint8_t am_id, uint64_t tag, uint64_t mask,
                          void *buf, uint64_t capacity, uint64_t *got_tag, PyObject **spill,
                          int spins)
{
    union {
        tcp_eager_head_t h;
        uint8_t bytes[TCP_PEEK];
    } peek;
    struct iovec iov[2];
    struct msghdr msg;
    uint64_t plen, frame;
    ssize_t n = recv(fd, peek.bytes, sizeof peek, MSG_PEEK | MSG_DONTWAIT), got;

    if (n < TCP_EAGER_HEAD)
        return -1;
    if (!head_matches(&peek.h, am_id, tag, mask, capacity))
        return -2;
    plen = peek.h.plen;
    frame = TCP_EAGER_HEAD + plen;
    /* a frame the reader could not hold whole waits until FIONREAD says all
     * of it is there: nothing of it is consumed before */
    if (frame > TCP_READ_MAX && (uint64_t)n < frame && (uint64_t)readable(fd) < frame)
        return -1;
    iov[0].iov_base = peek.bytes;
    iov[0].iov_len = TCP_EAGER_HEAD;
    iov[1].iov_base = buf;
    iov[1].iov_len = (size_t)plen;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = plen ? 2 : 1;
    /* exactly this frame: nothing past it is read, nothing past its
     * payload written */
    got = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (got < TCP_EAGER_HEAD)
        return got < 0 ? -1 : -3;   /* (the peek saw the head queued) */
    /* part of it: the rest follows (its sender wrote it with one call);
     * polled for only by a caller that spins (one with a CPU to itself) */
    got = TCP_EAGER_HEAD + (ssize_t)read_rest(fd, buf, (uint64_t)got - TCP_EAGER_HEAD, plen,
                                              spins);
    if ((uint64_t)got == frame) {
        *got_tag = peek.h.tag;
        return (int64_t)plen;
    }
    /* the rest is late (its sender may be waiting for us): what was read
     * goes to the reader, which finishes the frame the Python way (the
     * payload bytes already in ``buf`` are its own, rewritten alike) */
    if (frame > TCP_READ_MAX)
        return -3;                  /* (FIONREAD said it was all there) */
    *spill = PyBytes_FromStringAndSize(NULL, got);
    if (*spill == NULL)
        return -4;
    memcpy(PyBytes_AS_STRING(*spill), peek.bytes, TCP_EAGER_HEAD);
    memcpy(PyBytes_AS_STRING(*spill) + TCP_EAGER_HEAD, buf, (size_t)got - TCP_EAGER_HEAD);
    return -2;
}

PyObject *
ucxpy_tcp_recv_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long tag, mask;
    int fd, am_id, spins;
    Py_buffer buf;
    uint64_t got = 0, capacity;
    PyObject *spill = NULL, *out;
    int64_t n;
    int rest;

    if (!fc_nargs("tcp_recv_tag", nargs, 6) || !fc_int(args[0], &fd) || !fc_int(args[1], &am_id)
            || !fc_ull(args[2], &tag) || !fc_ull(args[3], &mask) || !fc_int(args[5], &spins)
            || !fc_buffer(args[4], &buf, 1))
        return NULL;
    capacity = (uint64_t)buf.len;
    rest = spins > 0 ? TCP_REST_SPINS : 0;
    for (;;) {
        n = capacity <= TCP_SMALL_MAX - TCP_EAGER_HEAD
            ? take_small(fd, (uint8_t)am_id, tag, mask, buf.buf, capacity, &got, &spill, rest)
            : take_large(fd, (uint8_t)am_id, tag, mask, buf.buf, capacity, &got, &spill,
                         rest);
        if (n != -1 || spins-- <= 0)
            break;
        ucxpy_cpu_relax();
    }
    PyBuffer_Release(&buf);
    if (n == -4)
        return NULL;        /* (no memory for the spill: bytes read are lost, so raise) */
    if (n == -3) {
        /* a short read of a frame FIONREAD said was whole: the stream is
         * now out of step with the Python reader, which must not go on */
        PyErr_SetString(PyExc_OSError, "tcp fast path: short read of a queued frame");
        return NULL;
    }
    out = Py_BuildValue("(LKO)", (long long)n, (unsigned long long)got,
                        spill != NULL ? spill : Py_None);
    Py_XDECREF(spill);
    return out;
}

PyObject *
ucxpy_tcp_send_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long tag;
    long long max_payload;
    int fd, am_id;
    Py_buffer buf;
    tcp_eager_head_t h;
    struct iovec iov[2];
    struct msghdr msg;
    ssize_t n, frame;

    if (!fc_nargs("tcp_send_tag", nargs, 5) || !fc_int(args[0], &fd) || !fc_int(args[1], &am_id)
            || !fc_ull(args[2], &tag) || !fc_ll(args[4], &max_payload)
            || !fc_buffer(args[3], &buf, 0))
        return NULL;
    if (buf.len > max_payload || am_id < 0 || am_id > 255) {
        PyBuffer_Release(&buf);
        return PyLong_FromLong(-100);
    }
    memset(&h, 0, sizeof h);
    h.magic = TCP_FRAME_MAGIC;
    h.am_id = (uint8_t)am_id;
    h.hlen = 8;
    h.plen = (uint64_t)buf.len;
    h.tag = (uint64_t)tag;
    iov[0].iov_base = &h;
    iov[0].iov_len = sizeof h;
    iov[1].iov_base = buf.buf;
    iov[1].iov_len = (size_t)buf.len;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = buf.len ? 2 : 1;
    frame = (ssize_t)(sizeof h + buf.len);
    n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(n <= 0 ? -1 : frame - n);
}
