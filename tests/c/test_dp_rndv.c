/*
 * test_dp_rndv.c — the data plane's shm rendezvous (rndv.c) and tcp eager
 * path (tcp.c) from a plain C program:
 *   - two processes, each with an inbox (a ring in shared memory): the
 *     forked sender offers a buffer (ucxdp_lane_rts); the receiver reads the
 *     offer's frame, checks its layout (wire.RTS and the shm key), reads the
 *     sender's bytes by CMA (ucxdp_lane_get) and answers (ucxdp_lane_ats);
 *     the sender sees ATS(OK) for its send id, and every byte is checked.
 *     What the receiver must decline (a key of another process or kind, a
 *     range outside the key, CMA not known to work, a dead lane) does
 *     nothing;
 *   - an external caller's sends and the inbox (one process, CMA to itself):
 *     an offer the inbox leaves for Python's path (no receive, a receive of
 *     Python's, one too small, a closed lane) and one it takes for an
 *     external receive, read, answered, and the answer taken back; a send
 *     failed with its peer; a send Python's path adopted, whose answer the
 *     inbox leaves to it; an answer owed while the lane's ring is full;
 *   - the tcp eager path on a stream socket pair: a frame written whole and
 *     read straight into a receive, both ways (small and large); another
 *     frame first, or a frame not all there, is given back as spill, which
 *     is exactly the stream's next bytes.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dp.h"
#include "ucxpy_native.h"

#define RTS 3                              /* the frames' am ids here (wire.AmId's) */
#define ATS 6
#define EAGER 2
#define OTHER_AM 9
#define CONN_TO_RECEIVER 0x51ULL
#define CONN_TO_SENDER 0x52ULL
#define RING_CAP (1 << 16)
#define SIZE 100000
#define SREQ 0xABCDEF01ULL

static void *map_ring(size_t *size)
{
    void *mem;

    *size = ucxpy_ring_mem_size(RING_CAP);
    mem = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED || ucxpy_ring_init(mem, *size) != 0)
        return NULL;
    return mem;
}

/* a lane into `ring` with this file's frame ids, naming our pid, closed */
static ucxdp_lane_t lane_into(ucxpy_ring_t *ring)
{
    ucxdp_lane_t lane;

    memset(&lane, 0, sizeof lane);
    lane.ring = ring;
    lane.eager_am_id = EAGER;
    lane.rts_am_id = RTS;
    lane.ats_am_id = ATS;
    lane.max_frame = 1024;
    lane.pid = (uint32_t)getpid();
    return lane;
}

/* the next frame of `ring` (polled for up to ~5 s): 1 and `out` filled, or 0 */
static int next_frame(ucxpy_ring_t *ring, uint64_t out[UCXPY_RING_PEEK_OUT])
{
    for (int i = 0; i < 500000; i++) {
        int rc = ucxpy_ring_peek(ring, out);
        if (rc == 1)
            return 1;
        if (rc < 0)
            return 0;
        usleep(10);
    }
    return 0;
}

/* the sender: offers `SIZE` bytes, waits for the answer; exit status 0 when
 * ATS(OK) for SREQ came */
static int sender(void *to_receiver, void *own, size_t size)
{
    ucxpy_ring_t tx, rx;
    ucxdp_worker_t *w;
    ucxdp_lane_t lane;
    uint64_t out[UCXPY_RING_PEEK_OUT], id;
    unsigned char *buf = malloc(SIZE);
    int wake;

    if (buf == NULL || ucxdp_worker_create(&w) != UCXDP_OK
            || ucxpy_ring_attach_producer(&tx, to_receiver, size, CONN_TO_RECEIVER,
                                          (uint32_t)getpid()) != 0
            || ucxpy_ring_attach(&rx, own, size) != 0)
        return 2;
    for (int i = 0; i < SIZE; i++)
        buf[i] = (unsigned char)(i * 7 + 3);
    lane = lane_into(&tx);
    if (ucxdp_lane_rts(w, &lane, 77, SREQ, buf, SIZE, &wake) != UCXDP_ERR_NO_RESOURCE)
        return 3;                          /* (not open yet) */
    lane.open = 1;
    if (ucxdp_lane_rts(w, &lane, 77, SREQ, buf, SIZE, &wake) != UCXDP_OK)
        return 4;
    if (!next_frame(&rx, out) || out[0] != ATS || out[2] != 9)
        return 5;
    memcpy(&id, rx.data + out[1], 8);
    if (id != SREQ || rx.data[out[1] + 8] != 0)
        return 6;
    ucxpy_ring_release(&rx);
    ucxdp_worker_destroy(w);
    free(buf);                             /* (only now: the receiver has read it) */
    return 0;
}

static void test_rendezvous_two_processes(void)
{
    size_t size;
    void *inbox_r = map_ring(&size), *inbox_s = map_ring(&size);
    ucxpy_ring_t rx, tx;
    ucxdp_worker_t *w;
    ucxdp_lane_t lane;
    uint64_t out[UCXPY_RING_PEEK_OUT], rts[4], base, length;
    unsigned char key[24], bad[24], *got = malloc(SIZE);
    uint32_t pid;
    ucxdp_counters_t c;
    pid_t child;
    int status, wake;

    CHECK(inbox_r != NULL && inbox_s != NULL && got != NULL);
    child = fork();
    if (child == 0)
        _exit(sender(inbox_r, inbox_s, size));
    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    CHECK(ucxpy_ring_attach(&rx, inbox_r, size) == 0);
    CHECK(ucxpy_ring_attach_producer(&tx, inbox_s, size, CONN_TO_SENDER,
                                     (uint32_t)getpid()) == 0);
    lane = lane_into(&tx);
    lane.peer_pid = (uint32_t)child;
    lane.open = 1;

    /* the offer: wire.RTS, then shm_md.RKEY naming the sender */
    CHECK(next_frame(&rx, out) && out[0] == RTS && out[2] == 32 + 24 && out[4] == 0
          && out[5] == CONN_TO_RECEIVER);
    memcpy(rts, rx.data + out[1], 32);
    memcpy(key, rx.data + out[1] + 32, 24);
    memcpy(&pid, key + 4, 4);
    memcpy(&base, key + 8, 8);
    memcpy(&length, key + 16, 8);
    CHECK(rts[0] == 77 && rts[1] == SREQ && rts[2] == SIZE && memcmp(key, "SHMK", 4) == 0);
    CHECK(pid == (uint32_t)child && base == rts[3] && length == SIZE);
    ucxpy_ring_release(&rx);

    /* declined, nothing read: CMA not known to work, another process's key,
     * another kind of key, outside the key, a dead lane */
    memset(got, 0, SIZE);
    CHECK(ucxdp_lane_get(w, &lane, key, 24, rts[3], got, SIZE) == UCXDP_ERR_NO_RESOURCE);
    lane.cma = 1;
    memcpy(bad, key, 24);
    pid = (uint32_t)getpid();
    memcpy(bad + 4, &pid, 4);
    CHECK(ucxdp_lane_get(w, &lane, bad, 24, rts[3], got, SIZE) == UCXDP_ERR_NO_RESOURCE);
    memcpy(bad, key, 24);
    bad[0] = 'X';
    CHECK(ucxdp_lane_get(w, &lane, bad, 24, rts[3], got, SIZE) == UCXDP_ERR_NO_RESOURCE);
    CHECK(ucxdp_lane_get(w, &lane, key, 23, rts[3], got, SIZE) == UCXDP_ERR_NO_RESOURCE);
    CHECK(ucxdp_lane_get(w, &lane, key, 24, rts[3] + 1, got, SIZE) == UCXDP_ERR_NO_RESOURCE);
    CHECK(ucxdp_lane_get(w, &lane, key, 24, rts[3] - 1, got, 10) == UCXDP_ERR_NO_RESOURCE);
    lane.dead = 1;
    CHECK(ucxdp_lane_get(w, &lane, key, 24, rts[3], got, SIZE) == UCXDP_ERR_NO_RESOURCE);
    CHECK(ucxdp_lane_ats(w, &lane, SREQ, 0, &wake) == UCXDP_ERR_NO_RESOURCE);
    lane.dead = 0;
    for (int i = 0; i < SIZE; i++)
        if (got[i] != 0) {
            CHECK(!"a declined read wrote nothing");
            break;
        }

    /* the read and the answer */
    CHECK(ucxdp_lane_get(w, &lane, key, 24, rts[3], got, SIZE) == UCXDP_OK);
    for (int i = 0; i < SIZE; i++)
        if (got[i] != (unsigned char)(i * 7 + 3)) {
            CHECK(!"every byte of the offer read");
            break;
        }
    CHECK(ucxdp_lane_get(w, &lane, key, 24, rts[3] + 5, got, 0) == UCXDP_OK);
    CHECK(ucxdp_lane_ats(w, &lane, SREQ, 0, &wake) == UCXDP_OK);
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ucxdp_worker_counters(w, &c);
    CHECK(c.rndv_get == 2 && c.rndv_get_bytes == SIZE && c.rndv_ats == 1);
    ucxdp_worker_destroy(w);
    free(got);
    munmap(inbox_r, size);
    munmap(inbox_s, size);
}


/* -- an external caller's sends, through the inbox ---------------------------------- */
static ucxdp_tag_recv_t recv_for(uint64_t tag, void *buf, uint64_t cap, uint8_t owner)
{
    ucxdp_tag_recv_t r;

    memset(&r, 0, sizeof r);
    r.m.source = 3;
    r.m.tag = tag;
    r.m.mask = UCXDP_FULL_MASK;
    r.buffer = buf;
    r.capacity = cap;
    r.owner = owner;
    return r;
}

static void test_inbox_rendezvous(void)
{
    size_t size;
    void *mem = map_ring(&size);
    ucxpy_ring_t rx, tx;
    ucxdp_worker_t *w;
    ucxdp_inbox_t in;
    ucxdp_lane_t lane;
    ucxdp_rndv_send_t s1, s2, s3;
    ucxdp_tag_recv_t ext, py, small;
    ucxdp_tag_unexp_t *u;
    ucxdp_link_t list;
    ucxdp_counters_t c;
    uint64_t out[UCXPY_RING_PEEK_OUT];
    static unsigned char src[SIZE], dst[SIZE];
    unsigned flags;
    int wake;

    CHECK(mem != NULL && ucxdp_worker_create(&w) == UCXDP_OK);
    CHECK(ucxpy_ring_attach(&rx, mem, size) == 0);
    CHECK(ucxpy_ring_attach_producer(&tx, mem, size, CONN_TO_RECEIVER, (uint32_t)getpid()) == 0);
    CHECK(ucxdp_inbox_init(&in, &rx, EAGER) == UCXDP_OK);
    CHECK(ucxdp_inbox_add_conn(&in, CONN_TO_RECEIVER, 3) == UCXDP_OK);
    ucxdp_inbox_rndv(&in, RTS, ATS, 1 << 20);
    lane = lane_into(&tx);                 /* (into our own inbox: both sides here) */
    lane.peer_pid = (uint32_t)getpid();
    lane.cma = lane.open = 1;
    ucxdp_inbox_set_lane(&in, CONN_TO_RECEIVER, &lane);
    for (int i = 0; i < SIZE; i++)
        src[i] = (unsigned char)(i * 5 + 1);

    /* offered; no receive: left (Python's path queues it) */
    s1 = (ucxdp_rndv_send_t){.buffer = src, .length = SIZE, .peer = 3};
    CHECK(ucxdp_rndv_send(w, &lane, &s1, 77, &wake) == UCXDP_OK && (s1.id & UCXDP_RNDV_EXT_ID));
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    /* a receive of Python's, or one too small: left too */
    py = recv_for(77, dst, SIZE, UCXDP_OWNER_PY);
    CHECK(ucxdp_tag_post(w, &py, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxdp_tag_cancel(w, &py) == 1);
    small = recv_for(77, dst, SIZE - 1, UCXDP_OWNER_EXT);
    CHECK(ucxdp_tag_post(w, &small, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxdp_tag_cancel(w, &small) == 1);
    /* a closed lane back: left (its answer could not go now) */
    ext = recv_for(77, dst, SIZE, UCXDP_OWNER_EXT);
    CHECK(ucxdp_tag_post(w, &ext, &u) == UCXDP_OK && u == NULL);
    lane.open = 0;
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    lane.open = 1;
    /* an external receive: read, answered, and the answer taken back */
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 2 && flags == 0);
    ucxdp_tag_take_done(w, UCXDP_OWNER_EXT, &list);
    CHECK(list.next == &ext.done && ext.status == UCXDP_OK && ext.info_length == SIZE
          && ext.info_tag == 77 && memcmp(dst, src, SIZE) == 0);
    ucxdp_rndv_take_done(w, &list);
    CHECK(list.next == &s1.link && s1.link.next == &list && s1.status == UCXDP_OK);

    /* a peer that fails answers its sends with an error */
    s2 = (ucxdp_rndv_send_t){.buffer = src, .length = 10, .peer = 3};
    CHECK(ucxdp_rndv_send(w, &lane, &s2, 78, &wake) == UCXDP_OK);
    ucxdp_rndv_fail_peer(w, 4, UCXDP_ERR_CONNECTION_RESET);        /* (another peer) */
    ucxdp_rndv_take_done(w, &list);
    CHECK(list.next == &list);
    ucxdp_rndv_fail_peer(w, 3, UCXDP_ERR_CONNECTION_RESET);
    ucxdp_rndv_take_done(w, &list);
    CHECK(list.next == &s2.link && s2.status == UCXDP_ERR_CONNECTION_RESET);
    CHECK(ucxdp_rndv_answered(w, s2.id, 0) == 0);                   /* (too late: dropped) */
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && out[0] == RTS);
    ucxpy_ring_release(&rx);

    /* a send Python's path adopted: its answer is left to that path */
    s3 = (ucxdp_rndv_send_t){.buffer = src, .length = 100, .peer = 3};
    CHECK(ucxdp_rndv_send(w, &lane, &s3, 79, &wake) == UCXDP_OK);
    CHECK(ucxdp_rndv_adopt(w, s3.id) == &s3 && ucxdp_rndv_adopt(w, s3.id) == NULL);
    CHECK(ucxpy_ring_peek(&rx, out) == 1 && out[0] == RTS);
    ucxpy_ring_release(&rx);
    CHECK(ucxdp_lane_ats(w, &lane, s3.id, 0, &wake) == UCXDP_OK);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && (flags & UCXDP_INBOX_LEFT));
    CHECK(ucxdp_rndv_answered(w, s3.id, 0) == 1);
    ucxdp_rndv_take_done(w, &list);
    CHECK(list.next == &s3.link && s3.status == UCXDP_OK);
    ucxpy_ring_release(&rx);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && flags == 0);

    /* an answer the lane back cannot take now (its ring is full) is owed,
     * and a later dispatch pushes it */
    {
        ucxpy_ring_t filler;
        ucxdp_rndv_send_t s4 = {.buffer = src, .length = 100, .peer = 3};
        static unsigned char pad[4000];
        int n = 0;

        CHECK(ucxpy_ring_attach_producer(&filler, mem, size, 0x99, (uint32_t)getpid()) == 0);
        CHECK(ucxdp_rndv_send(w, &lane, &s4, 80, &wake) == UCXDP_OK);
        while (ucxpy_ring_push(&filler, OTHER_AM, NULL, 0, pad, sizeof pad) >= 0)
            n++;
        while (ucxpy_ring_push(&filler, OTHER_AM, NULL, 0, pad, 1) >= 0)
            n++;                               /* (full to the last byte) */
        ext = recv_for(80, dst, SIZE, UCXDP_OWNER_EXT);
        CHECK(ucxdp_tag_post(w, &ext, &u) == UCXDP_OK && u == NULL);
        CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 1 && (flags & UCXDP_INBOX_LEFT));
        CHECK(in.nowed == 1 && memcmp(dst, src, 100) == 0);
        for (int i = 0; i < n; i++) {          /* (Python's path takes the filler) */
            CHECK(ucxpy_ring_peek(&rx, out) == 1 && out[0] == OTHER_AM);
            ucxpy_ring_release(&rx);
        }
        /* the answer goes now, and comes back: the send is answered */
        CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 1 && in.nowed == 0);
        ucxdp_rndv_take_done(w, &list);
        CHECK(list.next == &s4.link && s4.status == UCXDP_OK);
        ucxdp_tag_take_done(w, UCXDP_OWNER_EXT, &list);
        CHECK(list.next == &ext.done);
    }

    ucxdp_worker_counters(w, &c);
    CHECK(c.rndv_offer == 4 && c.rndv_expected == 2 && c.rndv_answered == 3);
    ucxdp_inbox_cleanup(&in);
    ucxdp_worker_destroy(w);
    munmap(mem, size);
}

/* -- the tcp eager path --------------------------------------------------------------- */
static void write_all(int fd, const void *p, size_t n)
{
    const char *b = p;

    while (n > 0) {
        ssize_t k = write(fd, b, n);
        if (k <= 0)
            return;
        b += k;
        n -= (size_t)k;
    }
}

static void test_tcp_eager(void)
{
    static uint8_t spill[UCXDP_TCP_SPILL_MAX], big[200000], into[200000];
    uint8_t head[UCXDP_TCP_EAGER_HEAD], small[64];
    ucxdp_worker_t *w;
    uint64_t got;
    size_t spilled;
    int sv[2], sz = 1 << 20;
    ucxdp_counters_t c;

    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);

    /* nothing there */
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 5, UCXDP_FULL_MASK, small, sizeof small, 0,
                               &got, spill, &spilled) == -1 && spilled == 0);
    /* small: a whole frame (a buffer of its size: nothing read past it),
     * then one with another tag (spilled whole) */
    CHECK(ucxdp_tcp_eager_send(w, sv[0], EAGER, 5, "hello", 5) == 0);
    CHECK(ucxdp_tcp_eager_send(w, sv[0], EAGER, 6, "other", 5) == 0);
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 5, UCXDP_FULL_MASK, small, 5, 0, &got, spill,
                               &spilled) == 5);
    CHECK(got == 5 && memcmp(small, "hello", 5) == 0 && spilled == 0);
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 5, UCXDP_FULL_MASK, small, sizeof small, 0,
                               &got, spill, &spilled) == -2);
    ucxdp_tcp_eager_head(head, EAGER, 6, 5);
    CHECK(spilled == sizeof head + 5 && memcmp(spill, head, sizeof head) == 0
          && memcmp(spill + sizeof head, "other", 5) == 0);
    /* a masked receive takes what matches under its mask; bytes behind a
     * message a large buffer read come back as spill */
    CHECK(ucxdp_tcp_eager_send(w, sv[0], EAGER, 0x107, "ab", 2) == 0);
    CHECK(ucxdp_tcp_eager_send(w, sv[0], EAGER, 0x108, "cd", 2) == 0);
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 0x100, 0xF00, small, sizeof small, 0, &got,
                               spill, &spilled) == 2);
    ucxdp_tcp_eager_head(head, EAGER, 0x108, 2);
    CHECK(got == 0x107 && spilled == sizeof head + 2 && memcmp(spill, head, sizeof head) == 0);
    /* large: read straight into the buffer */
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 13);
    CHECK(ucxdp_tcp_eager_send(w, sv[0], EAGER, 9, big, 100000) == 0);
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 9, UCXDP_FULL_MASK, into, sizeof into, 100,
                               &got, spill, &spilled) == 100000);
    CHECK(got == 9 && memcmp(into, big, 100000) == 0 && spilled == 0);
    /* a large frame not all there stays in the socket until it is */
    ucxdp_tcp_eager_head(head, EAGER, 10, 100000);
    write_all(sv[0], head, sizeof head);
    write_all(sv[0], big, 50000);
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 10, UCXDP_FULL_MASK, into, sizeof into, 0,
                               &got, spill, &spilled) == -1 && spilled == 0);
    write_all(sv[0], big + 50000, 50000);
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 10, UCXDP_FULL_MASK, into, sizeof into, 0,
                               &got, spill, &spilled) == 100000);
    CHECK(memcmp(into, big, 100000) == 0);
    /* a small frame half there: what was read is the spill, in order */
    ucxdp_tcp_eager_head(head, EAGER, 11, 40);
    write_all(sv[0], head, sizeof head);
    write_all(sv[0], big, 10);
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 11, UCXDP_FULL_MASK, small, sizeof small, 0,
                               &got, spill, &spilled) == -2);
    CHECK(spilled == sizeof head + 10 && memcmp(spill, head, sizeof head) == 0
          && memcmp(spill + sizeof head, big, 10) == 0);
    /* a closed peer: no frame (the caller's path reports it) */
    close(sv[0]);
    CHECK(ucxdp_tcp_eager_recv(w, sv[1], EAGER, 11, UCXDP_FULL_MASK, small, sizeof small, 0,
                               &got, spill, &spilled) == -1);
    CHECK(ucxdp_tcp_eager_send(w, sv[1], EAGER, 1, "x", 1) == -1);
    ucxdp_worker_counters(w, &c);
    CHECK(c.tcp_send == 5 && c.tcp_recv == 4);
    close(sv[1]);
    ucxdp_worker_destroy(w);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    test_rendezvous_two_processes();
    test_inbox_rendezvous();
    test_tcp_eager();
    if (failures)
        fprintf(stderr, "test_dp_rndv: %d checks failed\n", failures);
    else
        printf("test_dp_rndv: OK\n");
    return failures != 0;
}
