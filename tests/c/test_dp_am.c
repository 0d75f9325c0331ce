/*
 * test_dp_am.c — the data plane's active messages (am.c) from a plain C
 * program, one process, a lane into its own inbox:
 *   - an eager active message pushed by ucxdp_lane_am has wire.AM's layout
 *     (u16 id, u16 user header length, the user header; the data as the
 *     payload), which Python's path reads (ucxpy/am.py);
 *   - the inbox hands a claimed id's messages to the hook, in order, with
 *     the connection's source, header and data, interleaved with tagged
 *     eager messages it matches;
 *   - it leaves to the caller's path, and stops there: an unclaimed id, a
 *     claim given back, a size the protocol table gives to Python, a header
 *     longer than its frame, a connection not registered, a worker without
 *     a hook;
 *   - the send declines (nothing pushed): a lane without the frame id, a
 *     closed or dead lane, a header above UCXDP_AM_HEADER_MAX, data above
 *     the frame's limit; a bad id is refused by claim.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "dp.h"
#include "ucxpy_native.h"

#define EAGER 2                            /* the frames' am ids here (wire.AmId's) */
#define AM_EAGER 8
#define CONN 0x61ULL
#define SOURCE 5
#define RING_CAP (1 << 16)

static struct {
    int calls;
    int64_t source;
    unsigned id;
    uint8_t header[64], data[256];
    uint64_t header_length, length;
    int order_ok;
} got;

static void hook(void *arg, int64_t source, unsigned id, const void *header,
                 uint64_t header_length, const void *data, uint64_t length)
{
    CHECK(arg == &got);
    if (got.calls > 0 && ((const uint8_t *)data)[0] != got.data[0] + 1)
        got.order_ok = 0;
    got.calls++;
    got.source = source;
    got.id = id;
    got.header_length = header_length;
    got.length = length;
    memcpy(got.header, header, header_length < sizeof got.header ? header_length : sizeof got.header);
    memcpy(got.data, data, length < sizeof got.data ? length : sizeof got.data);
}

int main(void)
{
    size_t size = ucxpy_ring_mem_size(RING_CAP);
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ucxpy_ring_t rx, tx;
    ucxdp_worker_t *w = NULL;
    ucxdp_inbox_t in;
    ucxdp_lane_t lane;
    ucxdp_tag_recv_t r;
    ucxdp_tag_unexp_t *u;
    ucxdp_link_t list;
    uint64_t out[UCXPY_RING_PEEK_OUT], tag = 0x42, ranges[1][2] = {{1000, 2000}};
    uint8_t header[UCXDP_AM_HEADER_MAX + 1], data[4096];
    uint16_t am[2];
    unsigned flags;
    int wake;

    CHECK(mem != MAP_FAILED && ucxpy_ring_init(mem, size) == 0);
    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    CHECK(ucxpy_ring_attach(&rx, mem, size) == 0);
    CHECK(ucxpy_ring_attach_producer(&tx, mem, size, CONN, (uint32_t)getpid()) == 0);
    CHECK(ucxdp_inbox_init(&in, &rx, EAGER) == UCXDP_OK);
    CHECK(ucxdp_inbox_add_conn(&in, CONN, SOURCE) == UCXDP_OK);
    ucxdp_inbox_am(&in, AM_EAGER);
    memset(&lane, 0, sizeof lane);
    lane.ring = &tx;
    lane.eager_am_id = EAGER;
    lane.am_eager_id = AM_EAGER;
    lane.max_frame = 1024;
    lane.open = 1;
    for (size_t i = 0; i < sizeof header; i++)
        header[i] = (uint8_t)(i + 3);
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 7);

    /* the frame's layout: wire.AM, the user header, the data */
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 12, data, 40, &wake) == UCXDP_OK);
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && out[0] == AM_EAGER && out[2] == 4 + 12
          && out[4] == 40 && out[5] == CONN);
    memcpy(am, rx.data + out[1], sizeof am);
    CHECK(am[0] == 300 && am[1] == 12);
    CHECK(memcmp(rx.data + out[1] + 4, header, 12) == 0);
    CHECK(memcmp(rx.data + out[3], data, 40) == 0);

    /* no hook, or the id unclaimed: left, and the dispatch stops there */
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxdp_am_claim(w, 300, 1) == UCXDP_OK);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    ucxdp_am_set_hook(w, hook, &got);
    CHECK(ucxdp_am_claim(w, 301, 1) == UCXDP_OK && ucxdp_am_claim(w, 301, 0) == UCXDP_OK);
    CHECK(ucxdp_am_claim(w, UCXDP_AM_IDS, 1) == UCXDP_ERR_INVALID_PARAM);

    /* claimed, with a hook: handed over (source, id, header, data) */
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 1 && got.calls == 1);
    CHECK(got.source == SOURCE && got.id == 300 && got.header_length == 12 && got.length == 40);
    CHECK(memcmp(got.header, header, 12) == 0 && memcmp(got.data, data, 40) == 0);

    /* in order, between tagged eager messages the inbox matches */
    got.calls = 0;
    got.order_ok = 1;
    r = (ucxdp_tag_recv_t){.buffer = data + 2048, .capacity = 64, .owner = UCXDP_OWNER_EXT};
    r.m.source = -1;
    r.m.tag = tag;
    r.m.mask = UINT64_MAX;
    CHECK(ucxdp_tag_post(w, &r, &u) == UCXDP_OK && u == NULL);
    for (int i = 0; i < 5; i++) {
        uint8_t d[8] = {(uint8_t)(10 + i)};
        CHECK(ucxdp_lane_am(w, &lane, 300, header, 0, d, sizeof d, &wake) == UCXDP_OK);
        if (i == 2)
            CHECK(ucxdp_lane_eager(w, &lane, tag, data, 16, &wake) == UCXDP_OK);
    }
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 6 && !(flags & UCXDP_INBOX_LEFT));
    CHECK(got.calls == 5 && got.order_ok && got.header_length == 0 && got.data[0] == 14);
    ucxdp_tag_take_done(w, UCXDP_OWNER_EXT, &list);
    CHECK(list.next == &r.done && r.status == UCXDP_OK && r.info_length == 16
          && r.info_source == SOURCE);

    /* a receive of Python's (libucp's post fell back to Python's path while
     * another thread was in it) matched by the C caller's pass: the pass
     * says Python's progress must run, every time, until Python takes it
     * (the mpi4py wheel's Spawn hung with it on Python's done list) */
    r = (ucxdp_tag_recv_t){.buffer = data + 2048, .capacity = 64, .owner = UCXDP_OWNER_PY};
    r.m.source = -1;
    r.m.tag = tag;
    r.m.mask = UINT64_MAX;
    CHECK(ucxdp_tag_post(w, &r, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_lane_eager(w, &lane, tag, data, 16, &wake) == UCXDP_OK);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 1 && (flags & UCXDP_INBOX_LEFT)
          && w->py_done);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    ucxdp_tag_take_done(w, UCXDP_OWNER_PY, &list);
    CHECK(list.next == &r.done && r.status == UCXDP_OK && !w->py_done);
    ucxdp_tag_return_done(w, UCXDP_OWNER_PY, &list);      /* (an exception: kept, in order) */
    CHECK(w->py_done);
    ucxdp_tag_take_done(w, UCXDP_OWNER_PY, &list);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && !(flags & UCXDP_INBOX_LEFT));

    /* left: a claim given back, a size the protocol table gives to Python,
     * a header longer than its frame, a connection not registered */
    got.calls = 0;
    CHECK(ucxdp_am_claim(w, 300, 0) == UCXDP_OK);
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 4, data, 8, &wake) == UCXDP_OK);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && ucxpy_ring_release(&rx) >= 0);
    CHECK(ucxdp_am_claim(w, 300, 1) == UCXDP_OK);
    CHECK(ucxdp_inbox_hand_sizes(&in, (const uint64_t (*)[2])ranges, 1) == UCXDP_OK);
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 4, data, 1000, &wake) == UCXDP_OK);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && ucxpy_ring_release(&rx) >= 0);
    CHECK(ucxdp_inbox_hand_sizes(&in, (const uint64_t (*)[2])ranges, 0) == UCXDP_OK);
    am[0] = 300;
    am[1] = 200;                           /* (a header of 200 bytes announced, 4 sent) */
    memcpy(header, am, sizeof am);
    CHECK(ucxpy_ring_push(&tx, AM_EAGER, header, 8, data, 8) >= 0);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && ucxpy_ring_release(&rx) >= 0);
    ucxdp_inbox_forget_conn(&in, CONN);
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 4, data, 8, &wake) == UCXDP_OK);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && ucxpy_ring_release(&rx) >= 0);
    CHECK(got.calls == 0);

    /* the hook taken away: left */
    CHECK(ucxdp_inbox_add_conn(&in, CONN, SOURCE) == UCXDP_OK);
    ucxdp_am_set_hook(w, NULL, NULL);
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 4, data, 8, &wake) == UCXDP_OK);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && ucxpy_ring_release(&rx) >= 0);
    CHECK(got.calls == 0);

    /* the send declines, nothing pushed */
    CHECK(ucxdp_lane_am(w, &lane, 300, header, UCXDP_AM_HEADER_MAX + 1, data, 8, &wake)
          == UCXDP_ERR_NO_RESOURCE);
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 4, data, 1025, &wake) == UCXDP_ERR_NO_RESOURCE);
    CHECK(ucxdp_lane_am(w, &lane, UCXDP_AM_IDS, header, 4, data, 8, &wake)
          == UCXDP_ERR_NO_RESOURCE);
    lane.open = 0;
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 4, data, 8, &wake) == UCXDP_ERR_NO_RESOURCE);
    lane.open = 1;
    lane.dead = 1;
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 4, data, 8, &wake) == UCXDP_ERR_NO_RESOURCE);
    lane.dead = 0;
    lane.am_eager_id = 0;
    CHECK(ucxdp_lane_am(w, &lane, 300, header, 4, data, 8, &wake) == UCXDP_ERR_NO_RESOURCE);
    CHECK(ucxpy_ring_peek(&rx, out) == 0);

    {
        ucxdp_counters_t c;
        ucxdp_worker_counters(w, &c);
        CHECK(c.am_send == 10 && c.am_recv == 6 && c.tag_eager == 2);
    }
    ucxdp_inbox_cleanup(&in);
    ucxdp_worker_destroy(w);
    munmap(mem, size);
    if (failures)
        fprintf(stderr, "test_dp_am: %d checks failed\n", failures);
    else
        printf("test_dp_am: OK\n");
    return failures != 0;
}
