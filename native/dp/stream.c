/*
 * stream.c — a tcp connection's reader in C: the tagged eager frames at the
 * head of the stream, read from the socket and matched without Python.
 *
 * Theory of operation.  The tcp transport frames a stream (tcp_frames.PREFIX,
 * then the header, then the payload; tcp.c has the layout).  While the
 * transport has nothing of a connection's stream buffered in Python, it may
 * *lend* the connection's reading to the data plane: `lent` set, the socket
 * and the source its messages match as named (ucxdp_stream_t).  A C caller's
 * progress (libucp's, which has no Python per message) then reads the socket
 * into the stream's buffer and takes, in order, each whole tagged eager frame
 * (`eager_am_id`, an 8-byte tag as the header, a payload of at most
 * `eager_max` bytes), which the worker's matcher delivers as the shm inbox's
 * frames (ucxdp_tag_eager), and each whole eager active message of an id
 * an external caller's handler runs (`am_eager_id`: am.c's frame), which
 * goes to that handler's hook as the inbox's do.  It stops — clears `lent`
 * and says why in `stopped` — at the first thing it does not run: another frame (a
 * rendezvous, an active message, a close), a frame it cannot hold, bytes
 * that are not a frame, the end of the stream or an error.  What it read and
 * did not take stays in the buffer, [start, end): the head of the stream,
 * which the transport takes back (ucxdp_stream_take) and parses before it
 * reads the socket again.  So a connection's frames are handled in order,
 * by whichever side, and MPI's order holds.
 *
 * A frame read in part waits in the buffer for the rest (the next progress
 * call reads on); one larger than the buffer stops the reader at once.  The
 * buffer is no larger than the transport's reader (64 KiB), which takes its
 * bytes back whole.
 *
 * The caller serializes a stream's use (libucp's lock, as for the inbox):
 * the transport changes `lent` only while the data plane does not run it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "dp.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tcp_frames.PREFIX and wire.EAGER are little-endian: they are read as is"
#endif

#define PREFIX UCXDP_TCP_PREFIX           /* tcp_frames.PREFIX: magic, am id, flags, hlen, plen */
#define AM_HEAD UCXDP_AM_HEAD

void ucxdp_stream_init(ucxdp_stream_t *s, int fd, int64_t source, unsigned eager_am_id,
                       uint64_t eager_max)
{
    s->fd = fd;
    s->source = source;
    s->eager_am_id = eager_am_id;
    s->eager_max = eager_max < UCXDP_STREAM_BUF - PREFIX - 8 ? eager_max
                                                              : UCXDP_STREAM_BUF - PREFIX - 8;
    s->lent = 0;
    s->stopped = 0;
    s->out_open = 0;
    s->dead = 0;
    s->am_eager_id = 0;
    s->start = s->end = 0;
}

static void stop(ucxdp_stream_t *s, uint32_t why)
{
    s->stopped = why;
    __atomic_store_n(&s->lent, 0, __ATOMIC_RELEASE);
}

/* The active message whose prefix `p` heads the buffer (`have` bytes
 * there), when an external caller's handler runs its id: 1 taken (the hook
 * called), 0 not all there yet, -1 the reader stopped (anything else). */
static int take_am(ucxdp_worker_t *w, ucxdp_stream_t *s, const ucxdp_tcp_head_t *p,
                   uint64_t have)
{
    const uint8_t *f = s->buf + s->start + PREFIX;
    uint64_t whole = PREFIX + (uint64_t)p->hlen + p->plen;
    uint16_t h[2];

    if (p->hlen < AM_HEAD || whole > UCXDP_STREAM_BUF) {
        stop(s, UCXDP_STREAM_FRAME);
        return -1;
    }
    if (have < PREFIX + AM_HEAD)
        return 0;
    memcpy(h, f, AM_HEAD);
    /* (as the inbox's reader, am.c, and Python's, ucxpy/am.py: a frame
     * header longer than wire.AM and the user header is taken, the rest
     * skipped; a shorter one is Python's path's to report) */
    if (!ucxdp_am_runs(w, h[0]) || AM_HEAD + (uint64_t)h[1] > p->hlen) {
        stop(s, UCXDP_STREAM_FRAME);       /* (Python's handler, or held: the transport's) */
        return -1;
    }
    if (have < whole)
        return 0;
    w->am_hook(w->am_arg, s->source, h[0], f + AM_HEAD, h[1], f + p->hlen, p->plen);
    s->start += whole;
    UCXDP_COUNT(w, am_recv, 1);
    return 1;
}

/* Take the whole eager frames at the head of the buffer (the worker's lock
 * held) until `*taken` reaches `limit`; 0 to go on reading, 1 when the
 * reader stopped or the limit is reached. */
static int take_frames(ucxdp_worker_t *w, ucxdp_stream_t *s, long *taken, long limit)
{
    ucxdp_tcp_head_t p;
    uint64_t tag, have, whole;

    while (*taken < limit) {
        have = s->end - s->start;
        if (have < PREFIX)
            return 0;
        memcpy(&p, s->buf + s->start, PREFIX);
        if (p.magic != UCXDP_TCP_FRAME_MAGIC) {
            stop(s, UCXDP_STREAM_CORRUPT);
            return 1;
        }
        if (s->am_eager_id != 0 && p.am_id == s->am_eager_id && p.flags == 0) {
            int rc = take_am(w, s, &p, have);
            if (rc != 1)
                return rc < 0;             /* (-1: stopped; 0: its rest, read on) */
            (*taken)++;
            continue;
        }
        if (p.am_id != s->eager_am_id || p.flags != 0 || p.hlen != 8 || p.plen > s->eager_max) {
            stop(s, UCXDP_STREAM_FRAME);   /* (the transport's frame: it parses it) */
            return 1;
        }
        whole = PREFIX + 8 + p.plen;
        if (have < whole)
            return 0;                      /* (its rest: read on) */
        memcpy(&tag, s->buf + s->start + PREFIX, 8);
        if (ucxdp_tag_eager_locked(w, s->source, tag, s->buf + s->start + PREFIX + 8, p.plen)
                != UCXDP_OK) {
            stop(s, UCXDP_STREAM_FRAME);   /* (no memory: the transport's path tries) */
            return 1;
        }
        s->start += whole;
        (*taken)++;
        UCXDP_COUNT(w, tcp_recv, 1);
    }
    return 1;
}

long ucxdp_stream_progress(ucxdp_worker_t *w, ucxdp_stream_t *s, long limit)
{
    long taken = 0;
    ssize_t n;
    int done;

    if (!__atomic_load_n(&s->lent, __ATOMIC_ACQUIRE))
        return 0;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        done = take_frames(w, s, &taken, limit);
        pthread_mutex_unlock(&w->lock);
        if (done || !s->lent)
            return taken;
        if (s->start == s->end)
            s->start = s->end = 0;
        else if (s->end == UCXDP_STREAM_BUF) {
            if (s->start == 0) {           /* (a frame larger than the buffer) */
                stop(s, UCXDP_STREAM_FRAME);
                return taken;
            }
            memmove(s->buf, s->buf + s->start, s->end - s->start);
            s->end -= s->start;
            s->start = 0;
        }
        n = recv(s->fd, s->buf + s->end, UCXDP_STREAM_BUF - s->end, MSG_DONTWAIT);
        if (n > 0) {
            s->end += (uint64_t)n;
            continue;
        }
        if (n == 0)
            stop(s, UCXDP_STREAM_EOF);
        else if (errno == EINTR)
            continue;
        else if (errno != EAGAIN && errno != EWOULDBLOCK)
            stop(s, UCXDP_STREAM_ERROR);
        return taken;
    }
}

size_t ucxdp_stream_take(ucxdp_stream_t *s, const uint8_t **bytes)
{
    size_t n = (size_t)(s->end - s->start);

    *bytes = s->buf + s->start;
    s->start = s->end = 0;
    return n;
}

void ucxdp_stream_reclaim(ucxdp_stream_t *s)
{
    if (__atomic_load_n(&s->lent, __ATOMIC_ACQUIRE))
        stop(s, UCXDP_STREAM_RECLAIMED);
}

int ucxdp_streams_add(ucxdp_worker_t *w, ucxdp_stream_t *s)
{
    int rc = 1;

    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < w->nstreams; i++)
        if (w->streams[i] == s) {
            rc = 0;
            goto out;
        }
    if (w->nstreams == w->streams_cap) {
        int cap = w->streams_cap ? 2 * w->streams_cap : 8;
        ucxdp_stream_t **a = realloc(w->streams, (size_t)cap * sizeof *a);
        if (a == NULL) {
            rc = -1;
            goto out;
        }
        w->streams = a;
        w->streams_cap = cap;
    }
    w->streams[w->nstreams++] = s;
out:
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int ucxdp_streams_remove(ucxdp_worker_t *w, ucxdp_stream_t *s)
{
    int removed = 0;

    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < w->nstreams; i++) {
        if (w->streams[i] == s) {
            w->streams[i] = w->streams[--w->nstreams];
            removed = 1;
            break;
        }
    }
    pthread_mutex_unlock(&w->lock);
    return removed;
}

long ucxdp_streams_progress(ucxdp_worker_t *w, long limit, int *left)
{
    long n = 0;

    *left = 0;
    /* (the list changes only in the transport's path, which the caller
     * serializes with this one) */
    for (int i = 0; i < w->nstreams; i++) {
        ucxdp_stream_t *s = w->streams[i];
        if (__atomic_load_n(&s->lent, __ATOMIC_ACQUIRE))
            n += ucxdp_stream_progress(w, s, limit - n > 0 ? limit - n : 1);
        if (!s->lent && s->stopped)
            *left = 1;
    }
    return n;
}

ucxdp_status_t ucxdp_stream_send(ucxdp_worker_t *w, ucxdp_stream_t *s, uint64_t tag,
                                 const void *buffer, uint64_t length, uint64_t *rest,
                                 uint8_t head[UCXDP_TCP_EAGER_HEAD])
{
    int64_t r;

    *rest = 0;
    if (!s->out_open || s->dead || length > s->eager_max)
        return UCXDP_ERR_NO_RESOURCE;
    r = ucxdp_tcp_eager_send(w, s->fd, s->eager_am_id, tag, buffer, length);
    if (r < 0)
        return UCXDP_ERR_NO_RESOURCE;
    if (r == 0)
        return UCXDP_OK;
    s->out_open = 0;                       /* (the rest goes first, by the transport) */
    *rest = (uint64_t)r;
    ucxdp_tcp_eager_head(head, s->eager_am_id, tag, length);
    return UCXDP_INPROGRESS;
}

ucxdp_status_t ucxdp_stream_am_send(ucxdp_worker_t *w, ucxdp_stream_t *s, unsigned id,
                                    const void *header, uint64_t header_length,
                                    const void *buffer, uint64_t length, uint64_t *rest,
                                    uint8_t head[UCXDP_STREAM_AM_HEAD_MAX], size_t *head_length)
{
    size_t n = PREFIX + AM_HEAD + (size_t)header_length;
    int64_t r;

    *rest = 0;
    *head_length = n;
    if (s->am_eager_id == 0 || !s->out_open || s->dead || id >= UCXDP_AM_IDS
            || header_length > UCXDP_AM_HEADER_MAX || length > s->eager_max)
        return UCXDP_ERR_NO_RESOURCE;
    ucxdp_tcp_prefix(head, s->am_eager_id, (uint16_t)(n - PREFIX), length);
    ucxdp_am_head(head + PREFIX, id, header, header_length);
    r = ucxdp_tcp_frame_send(s->fd, head, n, buffer, length);
    if (r < 0)
        return UCXDP_ERR_NO_RESOURCE;
    UCXDP_COUNT(w, am_send, 1);
    if (r == 0)
        return UCXDP_OK;
    s->out_open = 0;                       /* (the rest goes first, by the transport) */
    *rest = (uint64_t)r;
    return UCXDP_INPROGRESS;
}
