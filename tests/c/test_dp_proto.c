/*
 * test_dp_proto.c — a protocol plug-in's C half run by the data plane
 * (native/dp/proto.c, proto.h), with the shipped one, pipelined-copy's
 * (native/proto/pipelined_copy.c), from a plain C program.  One process,
 * one worker whose lane goes into its own inbox (both sides here):
 *   - an external caller's send of the plug-in's sizes goes to the C half
 *     (its offer, not the stock one), an external receive takes the offer,
 *     the clear-to-send comes back, and the fragments (more than the ring
 *     holds: some owed, pushed by later passes) fill the receive: every
 *     byte checked, both ended OK, the counters moved;
 *   - what the C half leaves, in the inbox and in order: an offer with no
 *     receive, with a receive of Python's, with one too small; then taken
 *     once an external receive fits;
 *   - frames Python's path read (ucxdp_proto_frame): ids of the Python half
 *     and unknown connections are left, a clear-to-send of a send gone is
 *     taken and dropped;
 *   - a failed peer: its send waiting for its clear-to-send and a receive
 *     waiting for fragments end with CONNECTION_RESET;
 *   - a table of another ABI is refused.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "dp.h"
#include "proto.h"
#include "ucxpy_native.h"

uintptr_t ucxpy_pipelined_copy_ops(void);

#define PLUGIN 19                          /* wire.AmId.PLUGIN */
#define EAGER 2
#define CONN 0x61ULL
#define PEER 3
#define RING_CAP (1 << 16)
#define SIZE 100000
#define FRAG 1000

static ucxdp_tag_recv_t recv_for(uint64_t tag, void *buf, uint64_t cap, uint8_t owner)
{
    ucxdp_tag_recv_t r;

    memset(&r, 0, sizeof r);
    r.m.source = UCXDP_ANY_SOURCE;
    r.m.tag = tag;
    r.m.mask = ~(uint64_t)0;
    r.buffer = buf;
    r.capacity = cap;
    r.owner = owner;
    return r;
}

/* progress until `r` is done (or ~1000 passes): 1 when it is */
static int progress_until_done(ucxdp_worker_t *w, ucxdp_inbox_t *in, ucxdp_tag_recv_t *r)
{
    ucxdp_link_t list;
    unsigned flags;

    for (int i = 0; i < 1000; i++) {
        ucxdp_inbox_progress(w, in, 64, &flags);
        ucxdp_tag_take_done(w, UCXDP_OWNER_EXT, &list);
        if (list.next != &list) {
            int found = list.next == &r->done && r->done.next == &list;
            return found;
        }
    }
    return 0;
}

int main(void)
{
    size_t size = ucxpy_ring_mem_size(RING_CAP);
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    const ucxdp_proto_ops_t *ops = (const ucxdp_proto_ops_t *)ucxpy_pipelined_copy_ops();
    ucxdp_proto_ops_t other;
    const uint64_t sizes[1][2] = {{1000, UINT64_MAX}};
    ucxpy_ring_t rx, tx;
    ucxdp_worker_t *w;
    ucxdp_inbox_t in;
    ucxdp_lane_t lane;
    ucxdp_rndv_send_t s, s2;
    ucxdp_tag_recv_t r, py, small;
    ucxdp_tag_unexp_t *u;
    ucxdp_link_t list;
    ucxdp_counters_t c;
    uint64_t out[UCXPY_RING_PEEK_OUT];
    unsigned char *src = malloc(SIZE), *dst = calloc(1, SIZE);
    unsigned flags;
    int wake;

    CHECK(mem != MAP_FAILED && ucxpy_ring_init(mem, size) == 0 && src != NULL && dst != NULL);
    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    CHECK(ucxpy_ring_attach(&rx, mem, size) == 0);
    CHECK(ucxpy_ring_attach_producer(&tx, mem, size, CONN, (uint32_t)getpid()) == 0);
    CHECK(ucxdp_inbox_init(&in, &rx, EAGER) == UCXDP_OK);
    CHECK(ucxdp_inbox_add_conn(&in, CONN, PEER) == UCXDP_OK);
    w->inbox = &in;                        /* (the binding's Inbox does this) */
    memset(&lane, 0, sizeof lane);
    lane.ring = &tx;
    lane.eager_am_id = EAGER;
    lane.max_frame = 1024;
    lane.open = 1;
    ucxdp_inbox_set_lane(&in, CONN, &lane);
    for (int i = 0; i < SIZE; i++)
        src[i] = (unsigned char)(i * 13 + 5);

    /* a table of another ABI, no sizes, no frame id: refused */
    other = *ops;
    other.abi = UCXDP_PROTO_ABI + 1;
    CHECK(ucxdp_proto_set(w, &other, FRAG, PLUGIN, sizes, 1) == UCXDP_ERR_INVALID_PARAM);
    CHECK(ucxdp_proto_set(w, ops, FRAG, PLUGIN, sizes, 0) == UCXDP_ERR_INVALID_PARAM);
    CHECK(ucxdp_proto_set(w, ops, FRAG, 0, sizes, 1) == UCXDP_ERR_INVALID_PARAM);
    CHECK(ucxdp_proto_set(w, ops, FRAG, PLUGIN, sizes, 1) == UCXDP_OK);
    CHECK(ucxdp_proto_covers(w, SIZE) && !ucxdp_proto_covers(w, 999));

    /* a send the C half runs, into an external receive posted first */
    r = recv_for(77, dst, SIZE, UCXDP_OWNER_EXT);
    CHECK(ucxdp_tag_post(w, &r, &u) == UCXDP_OK && u == NULL);
    s = (ucxdp_rndv_send_t){.buffer = src, .length = SIZE, .peer = PEER};
    CHECK(ucxdp_rndv_send(w, &lane, &s, 77, &wake) == UCXDP_OK && (s.id & UCXDP_RNDV_EXT_ID));
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && out[0] == PLUGIN);     /* (its offer, not an RTS) */
    CHECK(progress_until_done(w, &in, &r));
    CHECK(r.status == UCXDP_OK && r.info_tag == 77 && r.info_length == SIZE
          && r.info_source == PEER && memcmp(dst, src, SIZE) == 0);
    ucxdp_rndv_take_done(w, &list);
    CHECK(list.next == &s.link && s.status == UCXDP_OK);
    ucxdp_worker_counters(w, &c);
    CHECK(c.proto_send == 1 && c.proto_recv == 1 && c.rndv_offer == 0);
    CHECK(c.proto_frame >= 2 + SIZE / FRAG);       /* (the offer, the CTS, every fragment) */
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && flags == 0);
    CHECK(ucxpy_ring_peek(&rx, out) == 0 && !w->proto_owed);   /* (nothing owed now) */

    /* left in the inbox: no receive, a receive of Python's, one too small */
    memset(dst, 0, SIZE);
    s = (ucxdp_rndv_send_t){.buffer = src, .length = 5000, .peer = PEER};
    CHECK(ucxdp_rndv_send(w, &lane, &s, 78, &wake) == UCXDP_OK);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    py = recv_for(78, dst, SIZE, UCXDP_OWNER_PY);
    CHECK(ucxdp_tag_post(w, &py, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxdp_tag_cancel(w, &py) == 1);
    small = recv_for(78, dst, 4999, UCXDP_OWNER_EXT);
    CHECK(ucxdp_tag_post(w, &small, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxdp_tag_cancel(w, &small) == 1);
    /* the same offer, once a receive fits */
    r = recv_for(78, dst, SIZE, UCXDP_OWNER_EXT);
    CHECK(ucxdp_tag_post(w, &r, &u) == UCXDP_OK && u == NULL);
    CHECK(progress_until_done(w, &in, &r) && r.status == UCXDP_OK && r.info_length == 5000
          && memcmp(dst, src, 5000) == 0);
    ucxdp_rndv_take_done(w, &list);
    CHECK(list.next == &s.link && s.status == UCXDP_OK);

    /* frames Python's path read: the Python half's ids, unknown
     * connections; a clear-to-send of no send waiting is dropped */
    {
        uint8_t cts[17] = {2}, frag[17] = {3}, offer[25] = {1};
        uint64_t ids[3] = {5, 6, 0};
        memcpy(cts + 1, ids, 16);
        memcpy(frag + 1, ids, 16);
        CHECK(ucxdp_proto_frame(w, CONN, cts, sizeof cts, NULL, 0) == 0);
        CHECK(ucxdp_proto_frame(w, CONN, frag, sizeof frag, src, 10) == 0);
        ids[0] = 78;
        ids[1] = 1;
        ids[2] = 100;
        memcpy(offer + 1, ids, 24);
        r = recv_for(78, dst, SIZE, UCXDP_OWNER_EXT);
        CHECK(ucxdp_tag_post(w, &r, &u) == UCXDP_OK && u == NULL);
        CHECK(ucxdp_proto_frame(w, 0x7777, offer, sizeof offer, NULL, 0) == 0);
        CHECK(ucxdp_proto_frame(w, CONN, offer, 10, NULL, 0) == 0);   /* (a bad header) */
        CHECK(ucxdp_tag_cancel(w, &r) == 1);
        ids[0] = UCXDP_RNDV_EXT_ID | 999;
        memcpy(cts + 1, ids, 16);
        CHECK(ucxdp_proto_frame(w, CONN, cts, sizeof cts, NULL, 0) == 1);
        CHECK(ucxpy_ring_peek(&rx, out) == 0);
    }

    /* a failed peer: a send waiting for its CTS, a receive for fragments */
    s2 = (ucxdp_rndv_send_t){.buffer = src, .length = SIZE, .peer = PEER};
    CHECK(ucxdp_rndv_send(w, &lane, &s2, 79, &wake) == UCXDP_OK);
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && out[0] == PLUGIN);
    {
        /* the offer, read as another sender's: its CTS goes to our own
         * inbox, where the send takes it and pushes its fragments */
        lane.open = 0;                     /* (the CTS is owed: the lane is busy) */
        r = recv_for(79, dst, SIZE, UCXDP_OWNER_EXT);
        CHECK(ucxdp_tag_post(w, &r, &u) == UCXDP_OK && u == NULL);
        CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 1 && w->proto_owed);
        ucxdp_rndv_fail_peer(w, PEER, UCXDP_ERR_CONNECTION_RESET);
        ucxdp_rndv_take_done(w, &list);
        CHECK(list.next == &s2.link && s2.status == UCXDP_ERR_CONNECTION_RESET);
        ucxdp_tag_take_done(w, UCXDP_OWNER_EXT, &list);
        CHECK(list.next == &r.done && r.status == UCXDP_ERR_CONNECTION_RESET);
        lane.open = 1;
        CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && flags == 0);
        CHECK(!w->proto_owed && ucxpy_ring_peek(&rx, out) == 0);
    }

    ucxdp_worker_destroy(w);
    ucxdp_inbox_cleanup(&in);
    munmap(mem, size);
    free(src);
    free(dst);
    if (failures == 0)
        printf("test_dp_proto: OK\n");
    return failures != 0;
}
