/*
 * tcp.c — the tcp eager path: an eager message written to, or read from, a
 * connection's socket whole, in C.
 *
 * Theory of operation.  The tcp transport frames a stream (tcp_frames.PREFIX,
 * little-endian: magic u16, am_id u8, flags u8, header length u16, pad u16,
 * payload length u64); an eager message's header is its 8-byte tag
 * (wire.EAGER).  The transport owns the socket and its queues and knows no
 * tags; when a frame written now would be next in the connection's order
 * (nothing queued) or the next bytes read are the next frame (nothing
 * buffered in Python), it lends the socket's descriptor to the caller, which
 * runs these.
 *
 * Send: one sendmsg of a 24-byte stack head and the caller's buffer.  What
 * the socket did not take is the caller's to queue (ucxdp_tcp_eager_head
 * rebuilds the head), in order, before anything else of the connection.
 *
 * Receive, for a blocking receive nothing posted or queued could take the
 * message from (the caller checked), two ways by its size:
 *
 *   small (HEAD + capacity <= SPILL_MAX): one plain recv of at most HEAD +
 *   capacity bytes into the caller's spill buffer, as UCX's tcp transport
 *   reads.  A whole matching frame is copied into the receive buffer: one
 *   system call per message (a copy in cache costs less than a second
 *   call).  The rest of a matching frame read in part is polled for, by a
 *   caller that spins.  Whatever else was read (another frame, part of one,
 *   bytes behind the frame) stays in the spill buffer, moved to its front:
 *   it is the head of the stream, which the caller parses first, in order.
 *
 *   large: recv(MSG_PEEK) of up to 1056 bytes shows the frame's head; a
 *   matching frame is then read with one recvmsg of exactly its bytes, head
 *   into a scratch array and payload straight into the receive buffer: two
 *   system calls, no copy.  A frame of up to 32 KiB is read as soon as its
 *   head is there; if only part of it arrived, the rest is polled for, and
 *   when it is late (its sender may be waiting for us) what was read goes
 *   back as spill.  A larger frame is read only once FIONREAD says all of
 *   it has arrived.
 *
 * No state is kept here: the caller's buffers are the only memory, so any
 * number of threads may run this on their own sockets.
 */
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "dp.h"
#include "ucxpy_native.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tcp_frames.PREFIX and wire.EAGER are little-endian: they are read and written as is"
#endif

#define FRAME_MAGIC UCXDP_TCP_FRAME_MAGIC
#define HEAD UCXDP_TCP_EAGER_HEAD
#define PEEK 1056                          /* bytes a poll peeks at: 1 KiB and its head */
#define READ_MAX UCXDP_TCP_SPILL_MAX       /* a frame read before it is whole: its spill
                                              fits the caller's reader (64 KiB) */
#define REST_SPINS 256                     /* polls for the rest of a frame read in part */

typedef ucxdp_tcp_head_t eager_head_t;

_Static_assert(sizeof(eager_head_t) == HEAD, "tcp eager frame head");

void ucxdp_tcp_prefix(uint8_t out[UCXDP_TCP_PREFIX], unsigned am_id, uint16_t header_length,
                      uint64_t length)
{
    eager_head_t h;

    memset(&h, 0, sizeof h);
    h.magic = FRAME_MAGIC;
    h.am_id = (uint8_t)am_id;
    h.hlen = header_length;
    h.plen = length;
    memcpy(out, &h, UCXDP_TCP_PREFIX);
}

void ucxdp_tcp_eager_head(uint8_t out[UCXDP_TCP_EAGER_HEAD], unsigned am_id, uint64_t tag,
                          uint64_t length)
{
    ucxdp_tcp_prefix(out, am_id, 8, length);
    memcpy(out + UCXDP_TCP_PREFIX, &tag, 8);
}

int64_t ucxdp_tcp_frame_send(int fd, const uint8_t *head, size_t head_length,
                             const void *buffer, uint64_t length)
{
    struct iovec iov[2];
    struct msghdr msg;
    ssize_t n;

    iov[0].iov_base = (void *)head;
    iov[0].iov_len = head_length;
    iov[1].iov_base = (void *)buffer;
    iov[1].iov_len = (size_t)length;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = length ? 2 : 1;
    n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0)
        return -1;
    return (int64_t)(head_length + length) - n;
}

int64_t ucxdp_tcp_eager_send(ucxdp_worker_t *w, int fd, unsigned am_id, uint64_t tag,
                             const void *buffer, uint64_t length)
{
    uint8_t head[HEAD];
    int64_t rest;

    ucxdp_tcp_eager_head(head, am_id, tag, length);
    rest = ucxdp_tcp_frame_send(fd, head, sizeof head, buffer, length);
    if (rest >= 0)
        UCXDP_COUNT(w, tcp_send, 1);
    return rest;
}

/* bytes readable on `fd` now, or -1 */
static long readable(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) < 0 ? -1 : n;
}

/* the head `h` is of an eager frame of `am_id` whose tag matches and whose
 * payload fits `capacity` */
static int head_matches(const eager_head_t *h, unsigned am_id, uint64_t tag, uint64_t mask,
                        uint64_t capacity)
{
    return h->magic == FRAME_MAGIC && h->am_id == am_id && h->flags == 0 && h->hlen == 8
        && h->plen <= capacity && !((h->tag ^ tag) & mask);
}

/* Read into `dst` (which holds `have` of `want` bytes) until it holds them
 * all, the stream ends or fails, or `spins` polls found nothing (one that
 * reads something does not count: the sender is still writing).  How many
 * `dst` holds then. */
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

/* The small way: the spill buffer is the bounce buffer. */
static int64_t take_small(int fd, unsigned am_id, uint64_t tag, uint64_t mask, void *buf,
                          uint64_t capacity, uint64_t *got, uint8_t *spill, size_t *spilled,
                          int spins)
{
    eager_head_t h;
    uint64_t frame = 0;
    ssize_t n = recv(fd, spill, HEAD + capacity, MSG_DONTWAIT);

    if (n <= 0)
        return -1;                         /* (end of stream, errors: the caller's path) */
    memcpy(&h, spill, n >= HEAD ? HEAD : 0);
    if (n >= HEAD && head_matches(&h, am_id, tag, mask, capacity)) {
        frame = HEAD + h.plen;
        n = (ssize_t)read_rest(fd, spill, (uint64_t)n, frame, spins);
    }
    if (frame == 0 || (uint64_t)n < frame) {
        *spilled = (size_t)n;
        return -2;
    }
    memcpy(buf, spill + HEAD, (size_t)h.plen);
    *got = h.tag;
    *spilled = (size_t)((uint64_t)n - frame);
    memmove(spill, spill + frame, *spilled);
    return (int64_t)h.plen;
}

/* The large way. */
static int64_t take_large(int fd, unsigned am_id, uint64_t tag, uint64_t mask, void *buf,
                          uint64_t capacity, uint64_t *got, uint8_t *spill, size_t *spilled,
                          int spins)
{
    union {
        eager_head_t h;
        uint8_t bytes[PEEK];
    } peek;
    struct iovec iov[2];
    struct msghdr msg;
    uint64_t plen, frame;
    ssize_t n = recv(fd, peek.bytes, sizeof peek, MSG_PEEK | MSG_DONTWAIT), r;

    if (n < HEAD)
        return -1;
    if (!head_matches(&peek.h, am_id, tag, mask, capacity))
        return -2;
    plen = peek.h.plen;
    frame = HEAD + plen;
    /* a frame the reader could not hold whole waits until FIONREAD says all
     * of it is there: nothing of it is consumed before */
    if (frame > READ_MAX && (uint64_t)n < frame && (uint64_t)readable(fd) < frame)
        return -1;
    iov[0].iov_base = peek.bytes;
    iov[0].iov_len = HEAD;
    iov[1].iov_base = buf;
    iov[1].iov_len = (size_t)plen;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = plen ? 2 : 1;
    /* exactly this frame: nothing past it is read, nothing past its payload
     * written */
    r = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (r < HEAD)
        return r < 0 ? -1 : -3;            /* (the peek saw the head queued) */
    r = HEAD + (ssize_t)read_rest(fd, buf, (uint64_t)r - HEAD, plen, spins);
    if ((uint64_t)r == frame) {
        *got = peek.h.tag;
        return (int64_t)plen;
    }
    /* the rest is late: what was read goes back as spill, which the
     * caller's reader finishes */
    if (frame > READ_MAX)
        return -3;                         /* (FIONREAD said it was all there) */
    memcpy(spill, peek.bytes, HEAD);
    memcpy(spill + HEAD, buf, (size_t)r - HEAD);
    *spilled = (size_t)r;
    return -2;
}

int64_t ucxdp_tcp_eager_recv(ucxdp_worker_t *w, int fd, unsigned am_id, uint64_t tag,
                             uint64_t mask, void *buffer, uint64_t capacity, int spins,
                             uint64_t *got, uint8_t *spill, size_t *spill_length)
{
    int rest = spins > 0 ? REST_SPINS : 0;
    int64_t n;

    *got = 0;
    *spill_length = 0;
    for (;;) {
        n = capacity <= READ_MAX - HEAD
            ? take_small(fd, am_id, tag, mask, buffer, capacity, got, spill, spill_length, rest)
            : take_large(fd, am_id, tag, mask, buffer, capacity, got, spill, spill_length, rest);
        if (n != -1 || spins-- <= 0)
            break;
        ucxpy_cpu_relax();
    }
    if (n >= 0)
        UCXDP_COUNT(w, tcp_recv, 1);
    return n;
}
