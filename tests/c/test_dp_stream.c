/*
 * test_dp_stream.c — a tcp connection's reader in C (stream.c), on a stream
 * socket pair, one process:
 *   - not lent: nothing read;
 *   - whole tagged eager frames (written by ucxdp_tcp_eager_send, the tcp
 *     eager path's own writer) taken in order: into a posted receive, the
 *     others kept as unexpected messages, every byte checked;
 *   - a frame that arrives in parts waits in the buffer for its rest;
 *   - it stops, giving back exactly the stream's next bytes, at another
 *     frame (after taking the eager ones before it), at an eager frame above
 *     its limit, at bytes that are not a frame; at the end of the stream;
 *     when the transport reclaims it;
 *   - eager active messages (written by ucxdp_stream_am_send) of an id a C
 *     handler claimed go to the worker's hook, in order with the tagged
 *     frames around them; one of an unclaimed id stops the reader and is
 *     given back whole; a send when a frame written now would not be next
 *     is declined.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "dp.h"

#define EAGER 2                            /* the frames' am ids here (wire.AmId's) */
#define OTHER 9
#define SOURCE 4
#define MAX 4096
#define AM 8                               /* wire.AmId.AM_EAGER */

static struct {
    int calls;
    int64_t source;
    unsigned id;
    uint8_t header[16], data[64];
    uint64_t header_length, length;
} seen;

static void hook(void *arg, int64_t source, unsigned id, const void *header,
                 uint64_t header_length, const void *data, uint64_t length)
{
    (void)arg;
    seen.calls++;
    seen.source = source;
    seen.id = id;
    seen.header_length = header_length;
    seen.length = length;
    memcpy(seen.header, header, header_length < 16 ? header_length : 16);
    memcpy(seen.data, data, length < 64 ? length : 64);
}

/* a frame of `am_id` with an 8-byte header `tag` and `n` payload bytes */
static size_t frame(uint8_t *out, unsigned am_id, uint64_t tag, const uint8_t *payload, size_t n)
{
    ucxdp_tcp_eager_head(out, am_id, tag, n);
    memcpy(out + UCXDP_TCP_EAGER_HEAD, payload, n);
    return UCXDP_TCP_EAGER_HEAD + n;
}

static ucxdp_tag_recv_t recv_for(uint64_t tag, void *buf, uint64_t capacity)
{
    ucxdp_tag_recv_t r;

    memset(&r, 0, sizeof r);
    r.m.source = -1;
    r.m.tag = tag;
    r.m.mask = UINT64_MAX;
    r.buffer = buf;
    r.capacity = capacity;
    r.owner = UCXDP_OWNER_EXT;
    return r;
}

int main(void)
{
    static ucxdp_stream_t s;
    static uint8_t payload[3 * MAX], out[4 * MAX], got[MAX];
    ucxdp_worker_t *w = NULL;
    ucxdp_tag_recv_t r;
    ucxdp_tag_unexp_t *u;
    ucxdp_link_t list;
    ucxdp_counters_t c;
    const uint8_t *spill;
    int sv[2];
    size_t n, k;

    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)(i * 13 + 5);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    ucxdp_stream_init(&s, sv[0], SOURCE, EAGER, MAX);

    /* not lent: nothing read */
    CHECK(ucxdp_tcp_eager_send(w, sv[1], EAGER, 0x10, payload, 8) == 0);
    CHECK(ucxdp_stream_progress(w, &s, 64) == 0 && s.end == 0);

    /* lent: three eager frames, in order; one into a posted receive */
    r = recv_for(0x11, got, sizeof got);
    CHECK(ucxdp_tag_post(w, &r, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_tcp_eager_send(w, sv[1], EAGER, 0x11, payload + 1, 100) == 0);
    CHECK(ucxdp_tcp_eager_send(w, sv[1], EAGER, 0x10, payload + 2, MAX) == 0);
    s.lent = 1;
    CHECK(ucxdp_stream_progress(w, &s, 64) == 3 && s.lent && s.start == s.end);
    ucxdp_tag_take_done(w, UCXDP_OWNER_EXT, &list);
    CHECK(list.next == &r.done && r.status == UCXDP_OK && r.info_length == 100
          && r.info_source == SOURCE && memcmp(got, payload + 1, 100) == 0);
    u = ucxdp_tag_probe(w, -1, 0x10, UINT64_MAX, 1);
    CHECK(u != NULL && u->length == 8 && memcmp(u->data, payload, 8) == 0);
    if (u != NULL)
        ucxdp_tag_unexp_free(w, u);
    u = ucxdp_tag_probe(w, -1, 0x10, UINT64_MAX, 1);
    CHECK(u != NULL && u->length == MAX && memcmp(u->data, payload + 2, MAX) == 0);
    if (u != NULL)
        ucxdp_tag_unexp_free(w, u);

    /* a frame in parts: it waits for its rest */
    n = frame(out, EAGER, 0x12, payload + 3, 1000);
    CHECK(write(sv[1], out, 30) == 30);
    CHECK(ucxdp_stream_progress(w, &s, 64) == 0 && s.lent && s.end - s.start == 30);
    CHECK(write(sv[1], out + 30, n - 30) == (ssize_t)(n - 30));
    CHECK(ucxdp_stream_progress(w, &s, 64) == 1 && s.lent);
    u = ucxdp_tag_probe(w, -1, 0x12, UINT64_MAX, 1);
    CHECK(u != NULL && u->length == 1000 && memcmp(u->data, payload + 3, 1000) == 0);
    if (u != NULL)
        ucxdp_tag_unexp_free(w, u);

    /* an eager frame, another frame, an eager frame: the first taken, the
     * rest given back as the stream's next bytes */
    n = frame(out, EAGER, 0x13, payload, 16);
    k = frame(out + n, OTHER, 0x99, payload + 4, 40);
    k += frame(out + n + k, EAGER, 0x14, payload + 5, 24);
    CHECK(write(sv[1], out, n + k) == (ssize_t)(n + k));
    CHECK(ucxdp_stream_progress(w, &s, 64) == 1 && !s.lent && s.stopped == UCXDP_STREAM_FRAME);
    CHECK(ucxdp_stream_take(&s, &spill) == k && memcmp(spill, out + n, k) == 0);
    CHECK(ucxdp_stream_progress(w, &s, 64) == 0);         /* (not lent: nothing) */
    u = ucxdp_tag_probe(w, -1, 0x13, UINT64_MAX, 1);
    CHECK(u != NULL && u->length == 16);
    if (u != NULL)
        ucxdp_tag_unexp_free(w, u);
    CHECK(ucxdp_tag_probe(w, -1, 0x14, UINT64_MAX, 0) == NULL);

    /* an eager frame above the reader's limit: given back whole */
    n = frame(out, EAGER, 0x15, payload, MAX + 1);
    CHECK(write(sv[1], out, n) == (ssize_t)n);
    s.lent = 1;
    CHECK(ucxdp_stream_progress(w, &s, 64) == 0 && !s.lent && s.stopped == UCXDP_STREAM_FRAME);
    CHECK(ucxdp_stream_take(&s, &spill) == n && memcmp(spill, out, n) == 0);

    /* bytes that are not a frame */
    memset(out, 0x5A, 32);
    CHECK(write(sv[1], out, 32) == 32);
    s.lent = 1;
    CHECK(ucxdp_stream_progress(w, &s, 64) == 0 && !s.lent && s.stopped == UCXDP_STREAM_CORRUPT);
    CHECK(ucxdp_stream_take(&s, &spill) == 32);

    /* the limit: frames beyond it wait for the next call */
    for (int i = 0; i < 5; i++)
        CHECK(ucxdp_tcp_eager_send(w, sv[1], EAGER, 0x20, payload, 8) == 0);
    s.lent = 1;
    CHECK(ucxdp_stream_progress(w, &s, 2) == 2 && s.lent);
    CHECK(ucxdp_stream_progress(w, &s, 64) == 3 && s.lent);
    for (int i = 0; i < 5; i++) {
        u = ucxdp_tag_probe(w, -1, 0x20, UINT64_MAX, 1);
        CHECK(u != NULL);
        if (u != NULL)
            ucxdp_tag_unexp_free(w, u);
    }

    /* active messages: a claimed id's, between two tagged frames, all in
     * order; an unclaimed id's given back whole; a send out of turn declined */
    {
        uint8_t head[UCXDP_STREAM_AM_HEAD_MAX];
        uint64_t rest;
        size_t hl;
        s.am_eager_id = AM;
        ucxdp_am_set_hook(w, hook, NULL);
        CHECK(ucxdp_am_claim(w, 7, 1) == UCXDP_OK);
        s.out_open = 0;
        CHECK(ucxdp_stream_am_send(w, &s, 7, "hd", 2, payload, 10, &rest, head, &hl)
              == UCXDP_ERR_NO_RESOURCE);
        s.out_open = 1;
        s.fd = sv[1];                      /* (written on the other end, read on this one) */
        CHECK(ucxdp_tcp_eager_send(w, sv[1], EAGER, 0x30, payload, 8) == 0);
        CHECK(ucxdp_stream_am_send(w, &s, 7, "hdr", 3, payload + 9, 50, &rest, head, &hl)
              == UCXDP_OK && hl == UCXDP_TCP_PREFIX + 4 + 3);
        CHECK(ucxdp_tcp_eager_send(w, sv[1], EAGER, 0x31, payload, 8) == 0);
        s.fd = sv[0];
        s.lent = 1;
        CHECK(ucxdp_stream_progress(w, &s, 64) == 3 && s.lent);
        CHECK(seen.calls == 1 && seen.id == 7 && seen.source == SOURCE && seen.header_length == 3
              && memcmp(seen.header, "hdr", 3) == 0 && seen.length == 50
              && memcmp(seen.data, payload + 9, 50) == 0);
        for (uint64_t t = 0x30; t <= 0x31; t++) {
            u = ucxdp_tag_probe(w, -1, t, UINT64_MAX, 1);
            CHECK(u != NULL);
            if (u != NULL)
                ucxdp_tag_unexp_free(w, u);
        }
        /* a frame header longer than wire.AM and its user header: taken,
         * the extra bytes skipped (as the inbox's reader and Python's do) */
        {
            uint8_t raw[UCXDP_TCP_PREFIX + 4 + 3 + 5];
            uint16_t am[2] = {7, 3};
            ucxdp_tcp_prefix(raw, AM, 4 + 3 + 5, 12);
            memcpy(raw + UCXDP_TCP_PREFIX, am, 4);
            memcpy(raw + UCXDP_TCP_PREFIX + 4, "xyz", 3);
            memset(raw + UCXDP_TCP_PREFIX + 7, 0xee, 5);
            CHECK(ucxdp_tcp_frame_send(sv[1], raw, sizeof raw, payload + 1, 12) == 0);
            CHECK(ucxdp_stream_progress(w, &s, 64) == 1 && s.lent);
            CHECK(seen.calls == 2 && seen.header_length == 3
                  && memcmp(seen.header, "xyz", 3) == 0 && seen.length == 12
                  && memcmp(seen.data, payload + 1, 12) == 0);
        }
        s.fd = sv[1];
        CHECK(ucxdp_stream_am_send(w, &s, 6, NULL, 0, payload, 20, &rest, head, &hl) == UCXDP_OK);
        s.fd = sv[0];
        CHECK(ucxdp_stream_progress(w, &s, 64) == 0 && !s.lent && s.stopped == UCXDP_STREAM_FRAME);
        CHECK(ucxdp_stream_take(&s, &spill) == UCXDP_TCP_PREFIX + 4 + 20 && seen.calls == 2);
        ucxdp_am_set_hook(w, NULL, NULL);
        s.lent = 1;
    }

    /* reclaimed by the transport; then the end of the stream */
    ucxdp_stream_reclaim(&s);
    CHECK(!s.lent && s.stopped == UCXDP_STREAM_RECLAIMED);
    s.lent = 1;
    close(sv[1]);
    CHECK(ucxdp_stream_progress(w, &s, 64) == 0 && !s.lent && s.stopped == UCXDP_STREAM_EOF);

    ucxdp_worker_counters(w, &c);
    CHECK(c.tcp_recv == 3 + 1 + 1 + 5 + 2 && c.am_recv == 2 && c.am_send == 2);
    close(sv[0]);
    ucxdp_worker_destroy(w);
    if (failures)
        fprintf(stderr, "test_dp_stream: %d checks failed\n", failures);
    else
        printf("test_dp_stream: OK\n");
    return failures != 0;
}
