/*
 * test_dp_tag.c — the data plane's tagged receives (tag.c) and its shm inbox
 * consumer (inbox.c) from a plain C program:
 *   - one worker: delivery into a posted buffer, truncation handed off, the
 *     unexpected queue taken by a later receive or probe, cancel, the done
 *     list's order;
 *   - two processes: a forked producer pushes eager frames (and, last, one
 *     of another kind) into a ring in shared memory; the consumer's inbox
 *     takes them in order into posted receives and the unexpected queue,
 *     leaves a frame of an unregistered connection and the other kind in
 *     the ring, and every byte is checked;
 *   - threads: one thread posts and cancels receives while another
 *     dispatches the inbox (the worker's lock; ThreadSanitizer's variant);
 *   - a C sender's lane (lane.c) into that inbox, and a C caller's progress
 *     (ucxdp_inbox_progress): an external owner's receives on their own
 *     done list, and the reasons it gives to run Python's progress.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dp.h"
#include "ucxpy_native.h"

#define EAGER 2                            /* the eager frames' am id here */
#define OTHER 9
#define CONN 0x1234567890ULL
#define STRANGER 0x777ULL
#define RING_CAP (1 << 16)
#define NMSG 200

static ucxdp_tag_recv_t recv_of(int64_t source, uint64_t tag, uint64_t mask, void *buf,
                                uint64_t cap)
{
    ucxdp_tag_recv_t r;

    memset(&r, 0, sizeof(r));
    r.m.source = source;
    r.m.tag = tag;
    r.m.mask = mask;
    r.buffer = buf;
    r.capacity = cap;
    return r;
}

/* the done list's receives, in order, into out[] (at most n); how many */
static int take_done(ucxdp_worker_t *w, ucxdp_tag_recv_t **out, int n)
{
    ucxdp_link_t list, *l;
    int k = 0;

    ucxdp_tag_take_done(w, UCXDP_OWNER_PY, &list);
    for (l = list.next; l != &list && k < n; l = l->next)
        out[k++] = UCXDP_DONE_RECV(l);
    return k;
}

static void test_one_worker(void)
{
    ucxdp_worker_t *w;
    char a[8], b[4], c[8];
    ucxdp_tag_recv_t ra = recv_of(1, 7, UCXDP_FULL_MASK, a, sizeof a);
    ucxdp_tag_recv_t rb = recv_of(1, 7, UCXDP_FULL_MASK, b, sizeof b);
    ucxdp_tag_recv_t rc = recv_of(UCXDP_ANY_SOURCE, 0, 0, c, sizeof c);
    ucxdp_tag_recv_t *done[4];
    ucxdp_tag_unexp_t *u;
    ucxdp_counters_t k;

    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    CHECK(ucxdp_tag_post(w, &ra, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_tag_post(w, &rb, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_tag_eager(w, 1, 7, "hello", 5) == UCXDP_OK);      /* into a */
    CHECK(ucxdp_tag_eager(w, 1, 7, "toolong", 7) == UCXDP_OK);    /* b: 4 bytes: handoff */
    CHECK(ucxdp_tag_eager(w, 2, 9, "early", 5) == UCXDP_OK);      /* unexpected */
    CHECK(take_done(w, done, 4) == 2 && done[0] == &ra && done[1] == &rb);
    CHECK(ra.status == UCXDP_OK && ra.info_length == 5 && memcmp(a, "hello", 5) == 0);
    CHECK(ra.info_source == 1 && ra.info_tag == 7 && ra.handoff == NULL);
    CHECK(rb.status == UCXDP_HANDOFF && rb.info_length == 7
          && memcmp(rb.handoff, "toolong", 7) == 0);
    free(rb.handoff);
    CHECK(take_done(w, done, 4) == 0);
    /* a probe leaves it; a receive takes it */
    u = ucxdp_tag_probe(w, UCXDP_ANY_SOURCE, 0, 0, 0);
    CHECK(u != NULL && u->length == 5 && u->m.source == 2 && u->user == NULL);
    CHECK(ucxdp_tag_post(w, &rc, &u) == UCXDP_OK && u != NULL);
    CHECK(u != NULL && memcmp(u->data, "early", 5) == 0 && u->m.tag == 9);
    ucxdp_tag_unexp_free(w, u);
    CHECK(ucxdp_tag_probe(w, UCXDP_ANY_SOURCE, 0, 0, 0) == NULL);
    /* cancel: once */
    CHECK(ucxdp_tag_post(w, &rc, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_tag_cancel(w, &rc) == 1 && ucxdp_tag_cancel(w, &rc) == 0);
    /* a message the caller's path runs: matched, not on the done list */
    CHECK(ucxdp_tag_post(w, &ra, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_tag_match(w, 1, 7) == &ra && ucxdp_tag_match(w, 1, 7) == NULL);
    CHECK(take_done(w, done, 4) == 0);
    /* return_done puts taken ones back in front, in order */
    CHECK(ucxdp_tag_post(w, &ra, &u) == UCXDP_OK && ucxdp_tag_post(w, &rb, &u) == UCXDP_OK);
    CHECK(ucxdp_tag_eager(w, 1, 7, "1", 1) == UCXDP_OK);
    {
        ucxdp_link_t list;
        ucxdp_tag_take_done(w, UCXDP_OWNER_PY, &list);
        CHECK(ucxdp_tag_eager(w, 1, 7, "2", 1) == UCXDP_OK);
        ucxdp_tag_return_done(w, UCXDP_OWNER_PY, &list);
    }
    CHECK(take_done(w, done, 4) == 2 && done[0] == &ra && done[1] == &rb);
    ucxdp_worker_counters(w, &k);
    CHECK(k.tag_eager == 5 && k.tag_expected == 3 && k.tag_handoff == 1 && k.tag_unexpected == 1);
    ucxdp_worker_destroy(w);
}

/* -- two processes through a ring in shared memory -------------------------------- */
static void *map_ring(size_t *size)
{
    void *mem;

    *size = ucxpy_ring_mem_size(RING_CAP);
    mem = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return NULL;
    if (ucxpy_ring_init(mem, *size) != 0)
        return NULL;
    return mem;
}

static size_t msg_size(int i)
{
    return (size_t)(i * 37) % 300;         /* 0 .. 299 bytes */
}

static void fill(unsigned char *p, int i, size_t n)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (unsigned char)(i * 31 + k);
}

static void push(ucxpy_ring_t *r, unsigned am_id, uint64_t tag, const void *p, size_t n)
{
    int rc;

    while ((rc = ucxpy_ring_push(r, am_id, &tag, sizeof tag, p, n)) == UCXPY_RING_FULL
           || rc == UCXPY_RING_BUSY)
        usleep(100);
}

static int producer(void *mem, size_t size)
{
    ucxpy_ring_t r, stranger;
    unsigned char buf[300];

    if (ucxpy_ring_attach_producer(&r, mem, size, CONN, (uint32_t)getpid()) != 0
            || ucxpy_ring_attach_producer(&stranger, mem, size, STRANGER,
                                          (uint32_t)getpid()) != 0)
        return 2;
    for (int i = 0; i < NMSG; i++) {
        size_t n = msg_size(i);
        fill(buf, i, n);
        push(&r, EAGER, (uint64_t)(i % 3), buf, n);
    }
    push(&stranger, EAGER, 0, "x", 1);      /* a connection the consumer never registered */
    push(&r, OTHER, 0, "y", 1);
    return 0;
}

static void test_two_processes(void)
{
    size_t size;
    void *mem = map_ring(&size);
    ucxpy_ring_t ring;
    ucxdp_worker_t *w;
    ucxdp_inbox_t in;
    static unsigned char bufs[NMSG][300];
    static ucxdp_tag_recv_t recvs[NMSG];
    uint64_t out[UCXPY_RING_PEEK_OUT];
    int got = 0, status, wake, bad;
    long n, taken = 0;
    pid_t pid;

    CHECK(mem != NULL);
    if (mem == NULL)
        return;
    CHECK(ucxpy_ring_attach(&ring, mem, size) == 0);
    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    CHECK(ucxdp_inbox_init(&in, &ring, EAGER) == UCXDP_OK);
    CHECK(ucxdp_inbox_add_conn(&in, CONN, 5) == UCXDP_OK);
    /* receives for the even-numbered messages of tag 0 .. 2, posted first;
     * the others arrive unexpected */
    for (int i = 0; i < NMSG; i += 2) {
        ucxdp_tag_unexp_t *u;
        recvs[i] = recv_of(5, (uint64_t)(i % 3), UCXDP_FULL_MASK, bufs[i], sizeof bufs[i]);
        CHECK(ucxdp_tag_post(w, &recvs[i], &u) == UCXDP_OK && u == NULL);
    }
    pid = fork();
    if (pid == 0)
        _exit(producer(mem, size));
    /* take frames until the stranger's is at the front */
    for (int spins = 0; taken < NMSG + 0 && spins < 2000000; spins++) {
        n = ucxdp_inbox_dispatch(w, &in, 64, 100, &wake, &bad);
        CHECK(!bad);
        taken += n;
        if (n == 0)
            usleep(10);
    }
    CHECK(taken == NMSG);
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* the stranger's frame stays, in order, and stops the consumer; a
     * blocking receive's shortcut does not take it either */
    {
        char one[8];
        uint64_t got = 0;
        ucxpy_ring_t mine;

        CHECK(ucxdp_inbox_dispatch(w, &in, 64, 0, &wake, &bad) == 0);
        CHECK(ucxdp_inbox_try_recv(w, &in, STRANGER, 0, 0, one, 8, 0, &got, &wake) == -2);
        CHECK(ucxpy_ring_peek(&ring, out) == 1 && out[5] == STRANGER);
        CHECK(ucxpy_ring_release(&ring) >= 0);
        CHECK(ucxdp_inbox_dispatch(w, &in, 64, 0, &wake, &bad) == 0);  /* OTHER: not ours */
        CHECK(ucxdp_inbox_try_recv(w, &in, CONN, 0, 0, one, 8, 0, &got, &wake) == -2);
        CHECK(ucxpy_ring_peek(&ring, out) == 1 && out[0] == OTHER && out[5] == CONN);
        CHECK(ucxpy_ring_release(&ring) >= 0);
        CHECK(ucxdp_inbox_try_recv(w, &in, CONN, 0, 0, one, 8, 3, &got, &wake) == -1);
        /* an eager message of CONN: taken when its tag matches under the
         * mask and it fits, else left */
        CHECK(ucxpy_ring_attach_producer(&mine, mem, size, CONN, (uint32_t)getpid()) == 0);
        push(&mine, EAGER, 0x1234, "payload", 7);
        CHECK(ucxdp_inbox_try_recv(w, &in, CONN, 0x1200, ~(uint64_t)0xFF, one, 4, 0, &got,
                                   &wake) == -2);                    /* too small */
        CHECK(ucxdp_inbox_try_recv(w, &in, CONN, 0x1235, UCXDP_FULL_MASK, one, 8, 0, &got,
                                   &wake) == -2);                    /* another tag */
        CHECK(ucxdp_inbox_try_recv(w, &in, CONN, 0x1200, ~(uint64_t)0xFF, one, 8, 0, &got,
                                   &wake) == 7);
        CHECK(got == 0x1234 && memcmp(one, "payload", 7) == 0);
    }
    /* the posted ones got the even-numbered messages of their tag, in order:
     * message i (tag i % 3) goes to the oldest receive of that tag */
    {
        ucxdp_tag_recv_t *done[NMSG];
        int k = take_done(w, done, NMSG), next[3] = {0, 0, 0};
        int order[3][NMSG], counts[3] = {0, 0, 0};

        for (int i = 0; i < NMSG; i += 2)          /* the receives of each tag, posted order */
            order[i % 3][counts[i % 3]++] = i;
        for (int d = 0; d < k; d++) {
            ucxdp_tag_recv_t *r = done[d];
            int t = (int)r->info_tag, i = order[t][next[t]++];
            CHECK(r == &recvs[i] && r->status == UCXDP_OK && r->info_source == 5);
            got++;
        }
        CHECK(got == NMSG / 2);
        /* which message went where: the j-th message of tag t to the j-th
         * receive of tag t; the rest are unexpected, oldest first */
        int msgs[3][NMSG], nm[3] = {0, 0, 0};
        unsigned char want[300];
        for (int i = 0; i < NMSG; i++)
            msgs[i % 3][nm[i % 3]++] = i;
        for (int t = 0; t < 3; t++)
            for (int j = 0; j < counts[t]; j++) {
                int i = msgs[t][j];
                ucxdp_tag_recv_t *r = &recvs[order[t][j]];
                fill(want, i, msg_size(i));
                CHECK(r->info_length == msg_size(i)
                      && memcmp(r->buffer, want, msg_size(i)) == 0);
            }
        for (int t = 0; t < 3; t++)
            for (int j = counts[t]; j < nm[t]; j++) {
                int i = msgs[t][j];
                ucxdp_tag_unexp_t *u = ucxdp_tag_probe(w, 5, (uint64_t)t, UCXDP_FULL_MASK, 1);
                fill(want, i, msg_size(i));
                CHECK(u != NULL && u->length == msg_size(i)
                      && memcmp(u->data, want, msg_size(i)) == 0);
                ucxdp_tag_unexp_free(w, u);
            }
        CHECK(w->matcher.nunexp == 0 && ucxdp_match_posted_count(&w->matcher) == 0);
    }
    ucxdp_inbox_forget_conn(&in, CONN);
    CHECK(in.nconns == 0);
    ucxdp_inbox_cleanup(&in);
    ucxdp_worker_destroy(w);
    munmap(mem, size);
}

/* -- the connection table: growth and deletion ------------------------------------- */
static void test_conns(void)
{
    ucxdp_inbox_t in;
    uint64_t ids[500];

    CHECK(ucxdp_inbox_init(&in, NULL, EAGER) == UCXDP_OK);
    CHECK(ucxdp_inbox_add_conn(&in, 0, 1) == UCXDP_ERR_INVALID_PARAM);
    for (int i = 0; i < 500; i++) {
        ids[i] = 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1);
        CHECK(ucxdp_inbox_add_conn(&in, ids[i], i) == UCXDP_OK);
    }
    CHECK(in.nconns == 500 && in.cap >= 1000);
    for (int i = 0; i < 500; i += 2)
        ucxdp_inbox_forget_conn(&in, ids[i]);
    CHECK(in.nconns == 250);
    for (int i = 0; i < 500; i++) {
        int found = 0;
        for (size_t s = 0; s < in.cap; s++)
            if (in.conns[s].conn == ids[i])
                found = in.conns[s].source == i;
        CHECK(found == (i % 2));
    }
    ucxdp_inbox_cleanup(&in);
}

/* -- the unexpected messages' pool: blocks come back by the room they have ---------- */
static void test_pool(void)
{
    ucxdp_worker_t *w;
    ucxdp_tag_unexp_t *a, *b, *c, *small;

    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    a = ucxdp_tag_unexp_alloc(w, 60 * 1024);       /* the 64 KiB class */
    CHECK(a != NULL && a->room >= 60 * 1024);
    memset(a->data, 0xAB, 60 * 1024);             /* (ASan: the room is there) */
    a->length = 60 * 1024;
    ucxdp_tag_unexp_free(w, a);
    b = ucxdp_tag_unexp_alloc(w, 40 * 1024);       /* same class: the same block */
    CHECK(b == a);
    c = ucxdp_tag_unexp_alloc(w, 100 * 1024);      /* a larger class: another one */
    CHECK(c != NULL && c != a && c->room >= 100 * 1024);
    /* a caller's message that says a large length but carries nothing: kept
     * by its room, never handed out as a large block */
    small = ucxdp_tag_unexp_alloc(w, 0);
    small->length = 1 << 20;
    ucxdp_tag_unexp_free(w, small);
    small = ucxdp_tag_unexp_alloc(w, 1 << 20);
    CHECK(small != NULL && small->room >= (1 << 20));
    memset(small->data, 0, 1 << 20);
    ucxdp_tag_unexp_free(w, small);
    ucxdp_tag_unexp_free(w, b);
    ucxdp_tag_unexp_free(w, c);
    ucxdp_worker_destroy(w);                       /* frees what the pool keeps (ASan: no leak) */
}

/* -- threads: posts and cancels beside a dispatcher --------------------------------- */
typedef struct {
    ucxdp_worker_t *w;
    int stop;
} shared_t;

static void *poster(void *arg)
{
    shared_t *s = arg;
    char buf[8];

    for (int i = 0; i < 20000; i++) {
        ucxdp_tag_recv_t r = recv_of(3, 1000 + (uint64_t)(i % 5), UCXDP_FULL_MASK, buf, 8);
        ucxdp_tag_unexp_t *u;
        ucxdp_tag_post(s->w, &r, &u);
        if (u != NULL)
            ucxdp_tag_unexp_free(s->w, u);
        else
            ucxdp_tag_cancel(s->w, &r);
    }
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_threads(void)
{
    shared_t s = {NULL, 0};
    pthread_t t;
    char buf[8];
    int n = 0;

    CHECK(ucxdp_worker_create(&s.w) == UCXDP_OK);
    CHECK(pthread_create(&t, NULL, poster, &s) == 0);
    while (!__atomic_load_n(&s.stop, __ATOMIC_ACQUIRE)) {
        ucxdp_tag_recv_t r = recv_of(4, 1, UCXDP_FULL_MASK, buf, 8);
        ucxdp_tag_unexp_t *u;
        ucxdp_tag_post(s.w, &r, &u);
        ucxdp_tag_eager(s.w, 4, 1, "abc", 3);
        n += take_done(s.w, &(ucxdp_tag_recv_t *){NULL}, 1);
    }
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(n > 0 && ucxdp_match_posted_count(&s.w->matcher) == 0);
    ucxdp_worker_destroy(s.w);
}

static void test_lane_and_progress(void)
{
    size_t size;
    void *mem = map_ring(&size);
    ucxpy_ring_t ring, tx;
    ucxdp_worker_t *w;
    ucxdp_inbox_t in;
    ucxdp_lane_t lane;
    ucxdp_tag_recv_t ext, py, *done[4];
    ucxdp_tag_unexp_t *u;
    ucxdp_link_t list;
    ucxdp_counters_t c;
    unsigned char big[2048], a[16], b[16];
    uint64_t v = 0x1122334455667788ULL;
    unsigned flags;
    int wake;

    CHECK(mem != NULL && ucxdp_worker_create(&w) == UCXDP_OK);
    CHECK(ucxpy_ring_attach(&ring, mem, size) == 0);
    CHECK(ucxpy_ring_attach_producer(&tx, mem, size, CONN, (uint32_t)getpid()) == 0);
    CHECK(ucxdp_inbox_init(&in, &ring, EAGER) == UCXDP_OK);
    CHECK(ucxdp_inbox_add_conn(&in, CONN, 3) == UCXDP_OK);
    memset(&lane, 0, sizeof(lane));
    lane.ring = &tx;
    lane.eager_am_id = EAGER;
    lane.max_frame = 1024;

    /* closed, dead, too large: declined, nothing sent */
    CHECK(ucxdp_lane_eager(w, &lane, 7, &v, sizeof v, &wake) == UCXDP_ERR_NO_RESOURCE);
    lane.open = 1;
    memset(big, 1, sizeof big);
    CHECK(ucxdp_lane_eager(w, &lane, 7, big, sizeof big, &wake) == UCXDP_ERR_NO_RESOURCE);
    lane.dead = 1;
    CHECK(ucxdp_lane_eager(w, &lane, 7, &v, sizeof v, &wake) == UCXDP_ERR_NO_RESOURCE);
    lane.dead = 0;
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && flags == 0);

    /* an external owner's receive and one of Python's: each on its list */
    ext = recv_of(UCXDP_ANY_SOURCE, 7, UCXDP_FULL_MASK, a, sizeof a);
    ext.owner = UCXDP_OWNER_EXT;
    py = recv_of(3, 8, UCXDP_FULL_MASK, b, sizeof b);
    CHECK(ucxdp_tag_post(w, &ext, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_tag_post(w, &py, &u) == UCXDP_OK && u == NULL);
    CHECK(ucxdp_lane_eager(w, &lane, 8, "pyth", 4, &wake) == UCXDP_OK);
    CHECK(ucxdp_lane_eager(w, &lane, 7, &v, sizeof v, &wake) == UCXDP_OK);
    /* (LEFT: Python's pass delivers its receive) */
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 2 && flags == UCXDP_INBOX_LEFT);
    ucxdp_tag_take_done(w, UCXDP_OWNER_EXT, &list);
    CHECK(list.next == &ext.done && ext.done.next == &list);
    CHECK(ext.status == UCXDP_OK && ext.info_source == 3 && ext.info_length == sizeof v
          && memcmp(a, &v, sizeof v) == 0);
    CHECK(take_done(w, done, 4) == 1 && done[0] == &py && memcmp(b, "pyth", 4) == 0);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && flags == 0);
    ucxdp_worker_counters(w, &c);
    CHECK(c.tag_send == 2 && c.tag_expected == 2);

    /* a frame of another kind is left, and says so; so does py_busy */
    CHECK(ucxpy_ring_push(&tx, OTHER, &v, sizeof v, "z", 1) >= 0);
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0 && flags == UCXDP_INBOX_LEFT);
    in.py_busy = 1;
    CHECK(ucxdp_inbox_progress(w, &in, 64, &flags) == 0
          && flags == (UCXDP_INBOX_LEFT | UCXDP_INBOX_BUSY));
    ucxdp_inbox_cleanup(&in);
    ucxdp_worker_destroy(w);
    munmap(mem, size);
}

int main(void)
{
    test_one_worker();
    test_lane_and_progress();
    test_pool();
    test_conns();
    test_two_processes();
    test_threads();
    if (failures)
        fprintf(stderr, "test_dp_tag: %d checks failed\n", failures);
    else
        printf("test_dp_tag: OK\n");
    return failures != 0;
}
