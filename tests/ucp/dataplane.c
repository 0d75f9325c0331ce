/*
 * dataplane.c — libucp's tag path on ucxpy's data plane, two processes.
 *
 * The parent and a forked child each make a libucp worker, swap worker
 * addresses through pipes and talk over shm (the test sets UCXPY_TLS).
 * Each check prints "ok - <name>" or "not ok - <name>: why" (TAP-like, the
 * child's lines prefixed "# child: " on failure); the exit status is the
 * number of failed checks.  tests/test_ucp_capi.py builds and runs it and
 * reads both workers' reports (UCXPY_UCP_REPORT): the data plane's counters
 * and how often libucp entered Python.
 *
 * What it pins down, on the receiver's side (the child), each with data
 * checked:
 *  - a ping-pong of 8 B messages: receives posted in the data plane, frames
 *    sent by it (the report shows it, and how few entries into Python);
 *  - unexpected eager messages taken by later receives, in order per tag,
 *    a masked receive, and one that does not fit (truncation);
 *  - a posted receive a larger eager message does not fit;
 *  - cancel of a posted receive: UCS_ERR_CANCELED within the call;
 *  - rendezvous (1 MiB) into a receive posted before the offer (Python's
 *    path adopts it) and after it (the receive takes Python's offer);
 *  - a synchronous send into a posted receive;
 *  - rendezvous of 384 KiB (below the split floor) into receives posted
 *    before the offers: the data plane offers, reads and answers each
 *    (native/dp/rndv.c; the reports show it);
 *  - active messages: ones that arrived before their id had a handler,
 *    held and then delivered in order when it got one; then 2000 eager
 *    ones of 8-207 B with a 16 B header, sent and taken by the data plane
 *    (native/dp/am.c), with a 1 MiB one (rendezvous: Python's path, its
 *    data received by ucp_am_recv_data_nbx) among them, every handler call
 *    in send order with its header and data checked.
 *
 * `dataplane pingpong` runs the ping-pong alone (its reports then count
 * the entries into Python of a steady 8 B exchange, and nothing else).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "pair.h"

#define PINGS 20000
#define UNEXP 50
#define BIG (1 << 20)
#define MID (384 * 1024)                   /* over shm's eager limit, below its split floor */
#define MIDS 8
#define TAG_MID 0x500
#define TAG_PING 0x100
#define TAG_UNEXP 0x200
#define TAG_GO 0x300
#define TAG_BIG 0x400
#define TAG_SYNC 0x500
#define TAG_SELF 0x600                     /* to itself, once */

#define AM_ID 7
#define AM_HELD_ID 8
#define AMS 2000
#define AM_HELD 20
#define AM_BIG_AT (AMS / 2)                /* the rendezvous one */

static int pingpong_only;
static ucp_ep_h ep, self_ep;

static ucs_status_t send_tag(const void *buf, size_t n, ucp_tag_t tag)
{
    ucp_request_param_t p = {.op_attr_mask = 0};
    return wait_req(ucp_tag_send_nbx(ep, buf, n, tag, &p), NULL);
}

static void *recv_post(void *buf, size_t n, ucp_tag_t tag, ucp_tag_t mask,
                       ucp_tag_recv_info_t *info)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO,
                             .recv_info.tag_info = info};
    return ucp_tag_recv_nbx(worker, buf, n, tag, mask, &p);
}

static ucs_status_t recv_tag(void *buf, size_t n, ucp_tag_t tag, ucp_tag_t mask,
                             ucp_tag_recv_info_t *info)
{
    void *r = recv_post(buf, n, tag, mask, info);
    return r == NULL ? UCS_OK : wait_req(r, info);
}

static void setup(int rfd, int wfd)
{
    ucp_address_t *addr;
    void *peer;

    pair_setup(UCP_FEATURE_TAG | UCP_FEATURE_AM, rfd, wfd, &addr, &peer);
    /* as MPICH does: an endpoint to itself too, used once and kept (the
     * steady exchange's progress must not enter Python for it) */
    uint64_t out = 0x5e1f, in = 0;
    ucp_request_param_t sp = {.op_attr_mask = 0}, rp = {.op_attr_mask = 0};
    ucp_tag_recv_info_t info;
    self_ep = pair_ep(addr);
    if (wait_req(ucp_tag_send_nbx(self_ep, &out, sizeof out, TAG_SELF, &sp), NULL) != UCS_OK
            || wait_req(ucp_tag_recv_nbx(worker, &in, sizeof in, TAG_SELF, ~0ull, &rp), &info) != UCS_OK
            || in != out) {
        printf("not ok - %sa message to itself\n", who);
        exit(97);
    }
    ucp_worker_release_address(worker, addr);
    ep = pair_ep(peer);
    free(peer);
}

static void teardown(void)
{
    ucp_request_param_t p = {.op_attr_mask = 0};
    wait_req(ucp_ep_close_nbx(ep, &p), NULL);
    wait_req(ucp_ep_close_nbx(self_ep, &p), NULL);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seed * 31 + i * 7);
}

static int same(const uint8_t *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (uint8_t)(seed * 31 + i * 7))
            return 0;
    return 1;
}

/* -- active messages ------------------------------------------------------- */
static size_t am_length(uint32_t seq)
{
    return seq == AM_BIG_AT ? BIG : 8 + seq % 200;
}

static ucs_status_t am_send(unsigned id, uint32_t seq)
{
    static uint8_t *data;
    uint8_t header[16];
    ucp_request_param_t p = {.op_attr_mask = 0};

    if (data == NULL)
        data = malloc(BIG);
    memset(header, 0xA5, sizeof header);
    memcpy(header, &seq, sizeof seq);
    fill(data, am_length(seq), seq);
    return wait_req(ucp_am_send_nbx(ep, id, header, sizeof header, data, am_length(seq), &p),
                    NULL);
}

/* what the receiver's handlers saw, per id */
static struct {
    uint32_t count;                        /* calls, in order */
    int bad;                               /* a header, length, data or order wrong */
    void *desc;                            /* a rendezvous message kept, to receive */
    size_t desc_length;
} seen[2];

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    int k = (int)(intptr_t)arg;
    uint32_t seq;

    if (header_length != 16) {
        seen[k].bad = 1;
        return UCS_OK;
    }
    memcpy(&seq, header, sizeof seq);
    if (seq != seen[k].count || length != am_length(seq) || ((const uint8_t *)header)[15] != 0xA5)
        seen[k].bad = 1;
    seen[k].count++;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        seen[k].desc = data;
        seen[k].desc_length = length;
        return UCS_INPROGRESS;             /* kept: received by the test's loop */
    }
    if (!same(data, length, seq))
        seen[k].bad = 1;
    return UCS_OK;
}

static ucs_status_t am_handler(unsigned id, int k)
{
    ucp_am_handler_param_t p = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID
                                    | UCP_AM_HANDLER_PARAM_FIELD_CB
                                    | UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                .id = id, .cb = am_cb, .arg = (void *)(intptr_t)k};
    return ucp_worker_set_am_recv_handler(worker, &p);
}

/* the sender: the parent */
static void sender(void)
{
    uint64_t v, got;
    uint8_t *big = malloc(BIG), small[64];
    ucp_tag_recv_info_t info;

    for (uint64_t i = 0; i < PINGS; i++) {
        v = i * 3 + 1;
        send_tag(&v, sizeof v, TAG_PING);
        if (recv_tag(&got, sizeof got, TAG_PING, UINT64_MAX, &info) != UCS_OK || got != v + 1) {
            CHECK("ping-pong", 0, "round %llu: %llu back", (unsigned long long)i,
                  (unsigned long long)got);
            break;
        }
    }
    if (pingpong_only)
        return;
    /* unexpected ones: all sent before the child posts a receive */
    for (unsigned i = 0; i < UNEXP; i++) {
        fill(small, sizeof small, i);
        send_tag(small, 8 + i % 40, TAG_UNEXP | (i % 3));
    }
    fill(small, sizeof small, 77);
    send_tag(small, 64, TAG_UNEXP | 0xF0);         /* taken by an 8-byte receive */
    send_tag(small, 1, TAG_GO);                    /* the child posts now */
    recv_tag(small, 1, TAG_GO, UINT64_MAX, &info); /* it posted: a receive too small, */
    fill(small, sizeof small, 78);
    send_tag(small, 64, TAG_UNEXP | 0xF1);         /* which this does not fit */
    recv_tag(small, 1, TAG_GO, UINT64_MAX, &info); /* it posted the big receive */
    fill(big, BIG, 5);
    send_tag(big, BIG, TAG_BIG);                   /* into a receive posted before */
    fill(big, BIG, 6);
    {                                              /* offered before its receive */
        ucp_request_param_t p = {.op_attr_mask = 0};
        void *offer = ucp_tag_send_nbx(ep, big, BIG, TAG_BIG | 1, &p);
        send_tag(small, 1, TAG_GO);
        CHECK("rendezvous send of an offer taken by a later receive",
              wait_req(offer, NULL) == UCS_OK, "failed");
    }
    v = 0x5157;
    {
        ucp_request_param_t p = {.op_attr_mask = 0};
        CHECK("synchronous send into a posted receive",
              wait_req(ucp_tag_send_sync_nbx(ep, &v, sizeof v, TAG_SYNC, &p), NULL) == UCS_OK,
              "failed");
    }
    recv_tag(small, 1, TAG_GO, UINT64_MAX, &info); /* it posted the 384 KiB receives */
    for (unsigned i = 0; i < MIDS; i++) {
        fill(big, MID, 10 + i);
        send_tag(big, MID, TAG_MID | i);
    }
    recv_tag(small, 1, TAG_GO, UINT64_MAX, &info); /* the 384 KiB ones arrived */
    for (uint32_t i = 0; i < AM_HELD; i++)         /* before their id has a handler */
        am_send(AM_HELD_ID, i);
    send_tag(small, 1, TAG_GO);
    recv_tag(small, 1, TAG_GO, UINT64_MAX, &info); /* the child's handlers are set */
    {
        int ok = 1;
        for (uint32_t i = 0; i < AMS; i++)
            ok &= am_send(AM_ID, i) == UCS_OK;
        CHECK("active messages sent", ok, "a send failed");
    }
    recv_tag(small, 1, TAG_GO, UINT64_MAX, &info); /* the child is done */
    free(big);
}

/* the receiver: the child */
static void receiver(void)
{
    uint64_t got = 0, v;
    uint8_t *big = calloc(1, BIG), small[64], one;
    ucp_tag_recv_info_t info;
    int ok = 1;
    ucs_status_t st;

    for (uint64_t i = 0; i < PINGS && ok; i++) {
        st = recv_tag(&got, sizeof got, TAG_PING, UINT64_MAX, &info);
        ok = st == UCS_OK && got == i * 3 + 1 && info.length == 8 && info.sender_tag == TAG_PING;
        v = got + 1;
        send_tag(&v, sizeof v, TAG_PING);
    }
    CHECK("8 B ping-pong, every message checked", ok, "got %llu", (unsigned long long)got);
    if (pingpong_only)
        return;

    recv_tag(&one, 1, TAG_GO, UINT64_MAX, &info);  /* every unexpected one is here */
    ok = 1;
    /* per tag, in order: tag 0's, then tag 1's by a masked receive, then 2's */
    for (unsigned t = 0; t < 3; t++) {
        for (unsigned i = t; i < UNEXP; i += 3) {
            memset(small, 0, sizeof small);
            st = t == 1 ? recv_tag(small, sizeof small, TAG_UNEXP | 1, ~(ucp_tag_t)0xC, &info)
                        : recv_tag(small, sizeof small, TAG_UNEXP | t, UINT64_MAX, &info);
            if (st != UCS_OK || info.length != 8 + i % 40 || info.sender_tag != (TAG_UNEXP | t)
                    || !same(small, info.length, i)) {
                ok = 0;
                printf("# unexpected %u (tag %u): status %d, length %zu, tag %llx\n", i, t, st,
                       info.length, (unsigned long long)info.sender_tag);
            }
        }
    }
    CHECK("unexpected eager messages, in order per tag, a masked receive", ok, "see above");
    st = recv_tag(small, 8, TAG_UNEXP | 0xF0, UINT64_MAX, &info);
    CHECK("an unexpected message larger than its receive: truncated",
          st == UCS_ERR_MESSAGE_TRUNCATED, "status %d", st);

    void *posted = recv_post(small, 8, TAG_UNEXP | 0xF1, UINT64_MAX, &info);
    void *cancelled = recv_post(small, 8, 0xDEAD, UINT64_MAX, &info);
    ucp_request_cancel(worker, cancelled);
    CHECK("cancel of a posted receive completes it within the call",
          ucp_request_check_status(cancelled) == UCS_ERR_CANCELED, "status %d",
          ucp_request_check_status(cancelled));
    ucp_request_free(cancelled);
    send_tag(&one, 1, TAG_GO);
    st = wait_req(posted, &info);
    CHECK("a posted receive an eager message does not fit: truncated",
          st == UCS_ERR_MESSAGE_TRUNCATED, "status %d", st);

    posted = recv_post(big, BIG, TAG_BIG, UINT64_MAX, &info);
    send_tag(&one, 1, TAG_GO);
    st = wait_req(posted, &info);
    CHECK("rendezvous into a receive posted before the offer",
          st == UCS_OK && info.length == BIG && same(big, BIG, 5), "status %d, length %zu", st,
          info.length);
    recv_tag(&one, 1, TAG_GO, UINT64_MAX, &info);  /* the second offer is here */
    memset(big, 0, BIG);
    st = recv_tag(big, BIG, TAG_BIG | 1, UINT64_MAX, &info);
    CHECK("rendezvous: a receive posted after the offer takes it",
          st == UCS_OK && info.length == BIG && same(big, BIG, 6), "status %d, length %zu", st,
          info.length);
    got = 0;
    st = recv_tag(&got, sizeof got, TAG_SYNC, UINT64_MAX, &info);
    CHECK("a synchronous send's message", st == UCS_OK && got == 0x5157, "status %d", st);

    {
        void *mids[MIDS];
        ucp_tag_recv_info_t infos[MIDS];
        uint8_t *mid = calloc(MIDS, MID);

        for (unsigned i = 0; i < MIDS; i++)
            mids[i] = recv_post(mid + (size_t)i * MID, MID, TAG_MID | i, UINT64_MAX, &infos[i]);
        send_tag(&one, 1, TAG_GO);
        ok = 1;
        for (unsigned i = 0; i < MIDS; i++) {
            st = wait_req(mids[i], &infos[i]);
            if (st != UCS_OK || infos[i].length != MID || !same(mid + (size_t)i * MID, MID, 10 + i)) {
                ok = 0;
                printf("# 384 KiB rendezvous %u: status %d, length %zu\n", i, st, infos[i].length);
            }
        }
        CHECK("rendezvous of 384 KiB into receives posted before the offers", ok, "see above");
        free(mid);
    }
    send_tag(&one, 1, TAG_GO);
    recv_tag(&one, 1, TAG_GO, UINT64_MAX, &info);  /* the held ones came before it */
    st = am_handler(AM_HELD_ID, 1);
    for (int i = 0; i < 100 && seen[1].count < AM_HELD; i++)
        ucp_worker_progress(worker);
    CHECK("active messages held until their id has a handler, then delivered in order",
          st == UCS_OK && seen[1].count == AM_HELD && !seen[1].bad, "status %d, %u calls, bad %d",
          st, seen[1].count, seen[1].bad);
    st = am_handler(AM_ID, 0);
    send_tag(&one, 1, TAG_GO);
    {
        ucs_status_t rst = UCS_OK;
        int received = 0;

        while (seen[0].count < AMS && !seen[0].bad) {
            ucp_worker_progress(worker);
            if (seen[0].desc != NULL) {    /* the rendezvous one: its data, now */
                ucp_request_param_t p = {.op_attr_mask = 0};
                memset(big, 0, BIG);
                rst = wait_req(ucp_am_recv_data_nbx(worker, seen[0].desc, big,
                                                    seen[0].desc_length, &p), NULL);
                received = rst == UCS_OK && same(big, BIG, AM_BIG_AT);
                seen[0].desc = NULL;
            }
        }
        CHECK("active messages: eager ones and a rendezvous one, in send order, each checked",
              st == UCS_OK && seen[0].count == AMS && !seen[0].bad && received,
              "status %d, %u calls, bad %d, rendezvous %d (%d)", st, seen[0].count, seen[0].bad,
              received, rst);
    }
    send_tag(&one, 1, TAG_GO);
    free(big);
}

int main(int argc, char **argv)
{
    int to_child[2], to_parent[2], status = 0;
    pid_t pid;

    pingpong_only = argc > 1 && strcmp(argv[1], "pingpong") == 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (pipe(to_child) < 0 || pipe(to_parent) < 0)
        return 97;
    pid = fork();
    if (pid < 0)
        return 97;
    if (pid == 0) {
        who = "child: ";
        setup(to_child[0], to_parent[1]);
        receiver();
        teardown();
        return failures;
    }
    setup(to_parent[0], to_child[1]);
    sender();
    teardown();
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
        printf("not ok - the child ended abnormally\n");
        failures++;
    } else {
        failures += WEXITSTATUS(status);
    }
    printf("%d failed\n", failures);
    return failures;
}
