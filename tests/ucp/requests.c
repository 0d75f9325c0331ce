/*
 * requests.c — UCP's request contract on ucxpy's libucp.so.0, with no MPI.
 *
 * One process, one worker, an endpoint to itself.  Each check prints
 * "ok - <name>" or "not ok - <name>: why" (TAP-like); the exit status is the
 * number of failed checks.  tests/test_ucp_capi.py builds and runs it.
 *
 * What it pins down:
 *  - request memory: request_init runs once per pool object, the caller's
 *    request_size bytes are at the handle;
 *  - a send done now returns NULL; a receive with NO_IMM_CMPL returns a
 *    request even when its message is already there, and its callback runs
 *    only from a later ucp_worker_progress (check_status says INPROGRESS
 *    until then);
 *  - release before completion: the callback still runs, once; free
 *    before completion: it does not;
 *  - cancel completes a receive with UCS_ERR_CANCELED within the call;
 *  - truncation, full 64-bit tags and masks, matched probe + msg_recv,
 *    synchronous send (done only after the match), generic datatypes;
 *  - active messages: eager data in the handler, rendezvous kept by
 *    UCS_INPROGRESS and received later by ucp_am_recv_data_nbx; a
 *    UCP_AM_FLAG_PERSISTENT_DATA handler keeps eager and large data alike
 *    (FLAG_DATA) until ucp_am_data_release; one
 *    handler call per ucp_worker_progress, in order;
 *  - a caller-allocated request (UCP_OP_ATTR_FIELD_REQUEST) done within the
 *    call tests as done;
 *  - RMA: ALLOCATE'd memory, packed keys, put/get, flush; atomics (op_nbx,
 *    post, fetch_nb, the blocking forms), rkey_ptr, context_print_info.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>

typedef struct {
    int magic;                             /* set by request_init */
    int calls;                             /* completion callbacks seen */
    ucs_status_t status;
    ucp_tag_recv_info_t info;
} user_req_t;

static int failures, inits;
static ucp_worker_h worker;
static ucp_ep_h ep;

#define CHECK(name, cond, ...)                                                         \
    do {                                                                               \
        if (cond) {                                                                    \
            printf("ok - %s\n", name);                                                 \
        } else {                                                                       \
            printf("not ok - %s: ", name);                                             \
            printf(__VA_ARGS__);                                                       \
            printf("\n");                                                              \
            failures++;                                                                \
        }                                                                              \
    } while (0)

static void request_init(void *request)
{
    ((user_req_t *)request)->magic = 0x5eed;
    inits++;
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    user_req_t *r = request;
    r->calls++;
    r->status = status;
    (void)user_data;
}

static void recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user_data)
{
    user_req_t *r = request;
    r->calls++;
    r->status = status;
    r->info = *info;
    if (user_data != NULL)
        *(int *)user_data += 1;
}

/* Pool objects keep the caller's bytes from their last use (UCP: request_init
 * runs once): a request handed out by a post is reset here, before any
 * progress can complete it. */
static void fresh(user_req_t *r)
{
    if (r != NULL && !UCS_PTR_IS_ERR(r)) {
        r->calls = 0;
        r->status = UCS_INPROGRESS;
    }
}

static void progress_until(user_req_t *r, int calls)
{
    for (int i = 0; i < 1000000 && r->calls < calls; i++)
        ucp_worker_progress(worker);
}

static void progress_n(int n)
{
    for (int i = 0; i < n; i++)
        ucp_worker_progress(worker);
}

static ucp_request_param_t recv_param(void *user_data)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = recv_cb,
        .user_data = user_data,
    };
    return p;
}

static ucp_request_param_t send_param(void)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.send = send_cb};
    return p;
}

static void send_now(const void *buf, size_t n, ucp_tag_t tag)
{
    ucp_request_param_t sp = send_param();
    void *s = ucp_tag_send_nbx(ep, buf, n, tag, &sp);
    fresh(s);
    if (UCS_PTR_IS_ERR(s)) {
        printf("# send failed: %s\n", ucs_status_string(UCS_PTR_STATUS(s)));
        exit(99);
    }
    if (s != NULL) {
        progress_until(s, 1);
        ucp_request_free(s);
    }
}

static void test_eager_and_rules(void)
{
    char msg[] = "hello, ucp";
    char buf[64] = {0};
    int seen = 0;
    send_now(msg, sizeof(msg), 0x1234567890abcdefULL);
    ucp_request_param_t rp = recv_param(&seen);
    user_req_t *r = ucp_tag_recv_nbx(worker, buf, sizeof(buf), 0x1234567890abcdefULL,
                                     UINT64_MAX, &rp);
    fresh(r);
    CHECK("recv with NO_IMM_CMPL returns a request", r != NULL && !UCS_PTR_IS_ERR(r),
          "got %p", (void *)r);
    if (r == NULL || UCS_PTR_IS_ERR(r))
        return;
    CHECK("request_init ran on the request", r->magic == 0x5eed, "magic %#x", r->magic);
    CHECK("no callback before progress", r->calls == 0 && seen == 0, "calls %d", r->calls);
    CHECK("check_status INPROGRESS before progress",
          ucp_request_check_status(r) == UCS_INPROGRESS, "status %d",
          ucp_request_check_status(r));
    progress_until(r, 1);
    CHECK("callback once from progress, with user_data", r->calls == 1 && seen == 1,
          "calls %d seen %d", r->calls, seen);
    CHECK("64-bit tag and length delivered",
          r->info.sender_tag == 0x1234567890abcdefULL && r->info.length == sizeof(msg) &&
              !strcmp(buf, msg),
          "tag %#llx length %zu", (unsigned long long)r->info.sender_tag, r->info.length);
    CHECK("check_status OK after", ucp_request_check_status(r) == UCS_OK, "status %d",
          ucp_request_check_status(r));
    ucp_request_free(r);
}

/* UCP_OP_ATTR_FIELD_REQUEST (Open MPI's pml): a receive whose message is
 * already there completes within the call, and the caller's request then
 * tests as done, with the message's tag and length. */
static void test_caller_request(ucp_context_h ctx)
{
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_REQUEST_SIZE};
    ucp_context_query(ctx, &ca);
    char *mem = calloc(1, ca.request_size + 64), got[16] = {0};
    void *req = mem + ca.request_size;
    send_now("caller", 7, 0xc0ffee);
    progress_n(4);
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST, .request = req};
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker, got, sizeof(got), 0xc0ffee, ~0ull, &p);
    ucp_tag_recv_info_t info = {0};
    ucs_status_t st = ucp_request_test(req, &info);
    CHECK("a caller's request done within the call tests as done",
          (r == NULL || r == req) && st == UCS_OK && info.length == 7 &&
          info.sender_tag == 0xc0ffee && !strcmp(got, "caller"),
          "ret %p status %s length %zu", r, ucs_status_string(st), info.length);
    free(mem);
}

static void test_release_before_completion(void)
{
    char buf[16];
    int seen = 0;
    ucp_request_param_t rp = recv_param(&seen);
    user_req_t *r = ucp_tag_recv_nbx(worker, buf, sizeof(buf), 77, UINT64_MAX, &rp);
    fresh(r);
    ucp_request_release(r);
    send_now("x", 2, 77);
    progress_n(2000);
    CHECK("released request's callback still runs, once", seen == 1, "seen %d", seen);

    /* ucp_request_free before completion: no callback (Open MPI reuses what
     * its callback would touch) */
    seen = 0;
    r = ucp_tag_recv_nbx(worker, buf, sizeof(buf), 78, UINT64_MAX, &rp);
    fresh(r);
    ucp_request_free(r);
    send_now("y", 2, 78);
    progress_n(2000);
    CHECK("a freed request's callback does not run", seen == 0, "seen %d", seen);
}

static void test_cancel(void)
{
    char buf[16];
    int seen = 0;
    ucp_request_param_t rp = recv_param(&seen);
    user_req_t *r = ucp_tag_recv_nbx(worker, buf, sizeof(buf), 999, UINT64_MAX, &rp);
    fresh(r);
    ucp_request_cancel(worker, r);
    CHECK("cancel completes the receive within the call, with UCS_ERR_CANCELED",
          r->calls == 1 && r->status == UCS_ERR_CANCELED &&
              ucp_request_check_status(r) == UCS_ERR_CANCELED,
          "calls %d status %s", r->calls, ucs_status_string(r->status));
    progress_n(100);
    CHECK("a cancelled request's callback runs once", r->calls == 1, "calls %d", r->calls);
    ucp_request_free(r);
}

static void test_truncation_and_mask(void)
{
    char big[100], small[10];
    memset(big, 7, sizeof(big));
    send_now(big, sizeof(big), 0xAB00);
    ucp_request_param_t rp = recv_param(NULL);
    user_req_t *r = ucp_tag_recv_nbx(worker, small, sizeof(small), 0xAB55, 0xFF00, &rp);
    fresh(r);
    progress_until(r, 1);
    CHECK("masked match and truncation", r->status == UCS_ERR_MESSAGE_TRUNCATED,
          "status %s", ucs_status_string(r->status));
    ucp_request_free(r);
}

static void test_probe(void)
{
    ucp_tag_recv_info_t info;
    int v = 41, got = 0;
    send_now(&v, sizeof(v), 5);
    ucp_tag_message_h m = NULL;
    for (int i = 0; i < 100000 && m == NULL; i++) {
        ucp_worker_progress(worker);
        m = ucp_tag_probe_nb(worker, 5, UINT64_MAX, 1, &info);
    }
    CHECK("matched probe finds the message", m != NULL && info.length == sizeof(v),
          "length %zu", m ? info.length : 0);
    if (m == NULL)
        return;
    CHECK("probed message is off the queue", ucp_tag_probe_nb(worker, 5, UINT64_MAX, 0, &info)
                                                 == NULL, "found again");
    ucp_request_param_t rp = recv_param(NULL);
    user_req_t *r = ucp_tag_msg_recv_nbx(worker, &got, sizeof(got), m, &rp);
    fresh(r);
    progress_until(r, 1);
    CHECK("msg_recv receives it", r->status == UCS_OK && got == 41, "got %d", got);
    ucp_request_free(r);
}

static void test_sync_send(void)
{
    int v = 3, got = 0;
    ucp_request_param_t sp = send_param();
    user_req_t *s = ucp_tag_send_sync_nbx(ep, &v, sizeof(v), 31, &sp);
    fresh(s);
    CHECK("sync send returns a request", s != NULL && !UCS_PTR_IS_ERR(s), "got %p", (void *)s);
    if (s == NULL || UCS_PTR_IS_ERR(s))
        return;
    progress_n(2000);
    CHECK("sync send not done before the match", s->calls == 0, "calls %d", s->calls);
    ucp_request_param_t rp = recv_param(NULL);
    user_req_t *r = ucp_tag_recv_nbx(worker, &got, sizeof(got), 31, UINT64_MAX, &rp);
    fresh(r);
    progress_until(s, 1);
    progress_until(r, 1);
    CHECK("sync send done after the match", s->calls == 1 && got == 3, "calls %d got %d",
          s->calls, got);
    ucp_request_free(r);
    ucp_request_free(s);
}

/* generic datatype: every other int of the buffer */
static void *start_pack(void *ctx, const void *buf, size_t count)
{
    (void)ctx;
    size_t *st = malloc(2 * sizeof(size_t));
    st[0] = (size_t)buf;
    st[1] = count;
    return st;
}

static void *start_unpack(void *ctx, void *buf, size_t count)
{
    return start_pack(ctx, buf, count);
}

static size_t packed_size(void *state)
{
    return ((size_t *)state)[1] * sizeof(int);
}

static size_t pack(void *state, size_t offset, void *dest, size_t max)
{
    const int *src = (const int *)((size_t *)state)[0];
    size_t n = ((size_t *)state)[1];
    (void)offset;
    for (size_t i = 0; i < n && (i + 1) * sizeof(int) <= max; i++)
        ((int *)dest)[i] = src[2 * i];
    return n * sizeof(int);
}

static ucs_status_t unpack(void *state, size_t offset, const void *src, size_t length)
{
    int *dst = (int *)((size_t *)state)[0];
    (void)offset;
    for (size_t i = 0; i < length / sizeof(int); i++)
        dst[2 * i] = ((const int *)src)[i];
    return UCS_OK;
}

static void finish(void *state)
{
    free(state);
}

static void test_generic_datatype(void)
{
    ucp_generic_dt_ops_t ops = {start_pack, start_unpack, packed_size, pack, unpack, finish};
    ucp_datatype_t dt;
    int src[8] = {1, -1, 2, -1, 3, -1, 4, -1}, dst[8] = {0};
    ucp_dt_create_generic(&ops, NULL, &dt);
    ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = dt};
    void *s = ucp_tag_send_nbx(ep, src, 4, 8, &sp);
    fresh(s);
    ucp_request_param_t rp = recv_param(NULL);
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    rp.datatype = dt;
    user_req_t *r = ucp_tag_recv_nbx(worker, dst, 4, 8, UINT64_MAX, &rp);
    fresh(r);
    progress_until(r, 1);
    if (s != NULL && !UCS_PTR_IS_ERR(s))
        ucp_request_free(s);
    CHECK("generic datatype packs and unpacks",
          r->status == UCS_OK && dst[0] == 1 && dst[2] == 2 && dst[6] == 4 && dst[1] == 0,
          "status %s dst %d %d %d", ucs_status_string(r->status), dst[0], dst[2], dst[6]);
    ucp_request_free(r);
    ucp_dt_destroy(dt);
}

/* active messages */
static int am_eager_seen, am_rndv_seen;
static void *kept_desc;
static size_t kept_length;

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        am_rndv_seen++;
        kept_desc = data;
        kept_length = length;
        return UCS_INPROGRESS;
    }
    if (header_length == 4 && !memcmp(header, "HDR", 4) && length == 6 && !memcmp(data, "data!", 6))
        am_eager_seen++;
    return UCS_OK;
}

static void am_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    user_req_t *r = request;
    r->calls++;
    r->status = status;
    r->info.length = length;
    (void)user_data;
}

static void set_handler(unsigned id, ucp_am_recv_callback_t cb)
{
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
        .id = id,
        .cb = cb,
    };
    ucp_worker_set_am_recv_handler(worker, &hp);
}

static void test_active_messages(void)
{
    set_handler(9, am_cb);
    ucp_request_param_t sp = send_param();
    void *s = ucp_am_send_nbx(ep, 9, "HDR", 4, "data!", 6, &sp);
    fresh(s);
    if (s != NULL && !UCS_PTR_IS_ERR(s)) {
        progress_until(s, 1);
        ucp_request_free(s);
    }
    for (int i = 0; i < 100000 && !am_eager_seen; i++)
        ucp_worker_progress(worker);
    CHECK("eager active message: header and data in the handler", am_eager_seen == 1,
          "seen %d", am_eager_seen);

    size_t n = 4 << 20;
    char *big = malloc(n), *dst = calloc(1, n);
    memset(big, 0x5a, n);
    s = ucp_am_send_nbx(ep, 9, "HDR", 4, big, n, &sp);
    fresh(s);
    for (int i = 0; i < 1000000 && !am_rndv_seen; i++)
        ucp_worker_progress(worker);
    CHECK("rendezvous active message: offered with FLAG_RNDV", am_rndv_seen == 1 &&
              kept_length == n, "seen %d length %zu", am_rndv_seen, kept_length);
    if (am_rndv_seen) {
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
                                  .cb.recv_am = am_recv_cb};
        user_req_t *r = ucp_am_recv_data_nbx(worker, kept_desc, dst, n, &rp);
        fresh(r);
        if (r != NULL && !UCS_PTR_IS_ERR(r)) {
            progress_until(r, 1);
            ucp_request_free(r);
        }
        CHECK("kept descriptor received later", dst[0] == 0x5a && dst[n - 1] == 0x5a,
              "bytes %d %d", dst[0], dst[n - 1]);
    }
    if (s != NULL && !UCS_PTR_IS_ERR(s)) {
        progress_until(s, 1);
        ucp_request_free(s);
    }
    free(big);
    free(dst);
}

/* UCP_AM_FLAG_PERSISTENT_DATA: the handler always sees FLAG_DATA (a 1 MiB
 * message too: received whole first, never an offer) and keeps the data by
 * returning UCS_INPROGRESS until ucp_am_data_release. */
static void *kept_data[2];
static size_t kept_len[2];
static int persist_seen, persist_flags_ok = 1;

static ucs_status_t persist_cb(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) ||
            (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
        persist_flags_ok = 0;
    if (persist_seen < 2) {
        kept_data[persist_seen] = data;
        kept_len[persist_seen] = length;
    }
    persist_seen++;
    return UCS_INPROGRESS;
}

static void test_persistent_active_messages(void)
{
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = 11, .cb = persist_cb,
        .flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA,
    };
    ucp_worker_set_am_recv_handler(worker, &hp);
    ucp_request_param_t sp = send_param();
    size_t n = 1 << 20;
    char *big = malloc(n);
    memset(big, 0x3c, n);
    void *s1 = ucp_am_send_nbx(ep, 11, "H", 2, "kept", 5, &sp);
    void *s2 = ucp_am_send_nbx(ep, 11, "H", 2, big, n, &sp);
    for (int i = 0; i < 1000000 && persist_seen < 2; i++)
        ucp_worker_progress(worker);
    for (int i = 0; i < 1000; i++)              /* (the data outlives more progress) */
        ucp_worker_progress(worker);
    CHECK("persistent handler: FLAG_DATA for eager and large messages alike",
          persist_seen == 2 && persist_flags_ok, "seen %d flags %d", persist_seen,
          persist_flags_ok);
    CHECK("persistent handler: kept eager data intact after the handler",
          persist_seen >= 1 && kept_len[0] == 5 && memcmp(kept_data[0], "kept", 5) == 0,
          "length %zu", kept_len[0]);
    CHECK("persistent handler: kept large data whole",
          persist_seen >= 2 && kept_len[1] == n && ((char *)kept_data[1])[0] == 0x3c &&
              ((char *)kept_data[1])[n - 1] == 0x3c, "length %zu", kept_len[1]);
    for (int i = 0; i < persist_seen && i < 2; i++)
        ucp_am_data_release(worker, kept_data[i]);
    void *sends[2] = {s1, s2};
    for (int i = 0; i < 2; i++) {
        if (sends[i] != NULL && !UCS_PTR_IS_ERR(sends[i])) {
            progress_until(sends[i], 1);
            ucp_request_free(sends[i]);
        }
    }
    free(big);
}

/* One active-message callback per progress call, in order: a caller that
 * counts them between calls (MPICH's PSCW) sees every count. */
static char burst_seen[8];
static int burst_calls;

static ucs_status_t burst_cb(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)param;
    if (length == 1 && burst_calls < (int)sizeof(burst_seen))
        burst_seen[burst_calls] = *(const char *)data;
    burst_calls++;
    return UCS_OK;
}

static void test_active_message_burst(void)
{
    set_handler(10, burst_cb);
    ucp_request_param_t sp = send_param();
    for (const char *c = "abc"; *c; c++) {
        void *s = ucp_am_send_nbx(ep, 10, NULL, 0, c, 1, &sp);
        if (s != NULL && !UCS_PTR_IS_ERR(s)) {
            progress_until(s, 1);
            ucp_request_free(s);
        }
    }
    int most = 0;
    for (int i = 0; i < 100000 && burst_calls < 3; i++) {
        int before = burst_calls;
        ucp_worker_progress(worker);
        if (burst_calls - before > most)
            most = burst_calls - before;
    }
    CHECK("active messages: one callback per progress call, in order",
          burst_calls == 3 && most == 1 && !memcmp(burst_seen, "abc", 3),
          "%d callbacks, at most %d in one call, order %.3s", burst_calls, most, burst_seen);
}

/* Wait for a request of ucp_*_nbx / _nb (NULL: done), then free it. */
static ucs_status_t wait_ptr(ucs_status_ptr_t r)
{
    if (r == NULL || UCS_PTR_IS_ERR(r))
        return UCS_PTR_STATUS(r);
    ucs_status_t st;
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS)
        ucp_worker_progress(worker);
    ucp_request_free(r);
    return st;
}

/* Atomics on the words at base+128.. of an ALLOCATE'd region; rkey_ptr. */
static void test_atomics(ucp_context_h ctx, uint64_t base, void *local, ucp_rkey_h rkey)
{
    uint64_t *w64 = (uint64_t *)((char *)local + 128);
    uint32_t *w32 = (uint32_t *)((char *)local + 144);
    uint64_t operand = 5, reply = 0;
    *w64 = 100;
    *w32 = 7;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE |
                                             UCP_OP_ATTR_FIELD_REPLY_BUFFER,
                             .datatype = ucp_dt_make_contig(8), .reply_buffer = &reply};
    ucs_status_t st = wait_ptr(ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &operand, 1, base + 128,
                                                 rkey, &p));
    CHECK("atomic_op_nbx fetch-add 64", st == UCS_OK && reply == 100 && *w64 == 105,
          "%s reply %llu word %llu", ucs_status_string(st), (unsigned long long)reply,
          (unsigned long long)*w64);
    operand = 105;                         /* compare */
    reply = 9;                             /* swapped in */
    st = wait_ptr(ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_CSWAP, &operand, 1, base + 128, rkey, &p));
    CHECK("atomic_op_nbx cswap: compare *buffer, store *reply, old to reply",
          st == UCS_OK && reply == 105 && *w64 == 9, "reply %llu word %llu",
          (unsigned long long)reply, (unsigned long long)*w64);
    uint32_t op32 = 3, reply32 = 0;
    p.datatype = ucp_dt_make_contig(4);
    p.reply_buffer = &reply32;
    st = wait_ptr(ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_XOR, &op32, 1, base + 144, rkey, &p));
    CHECK("atomic_op_nbx fetch-xor 32", st == UCS_OK && reply32 == 7 && *w32 == 4,
          "reply %u word %u", reply32, *w32);
    p.op_attr_mask &= ~UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    st = wait_ptr(ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_OR, &op32, 1, base + 144, rkey, &p));
    CHECK("atomic_op_nbx without a reply buffer: a post", st == UCS_OK && *w32 == 7,
          "%s word %u", ucs_status_string(st), *w32);
    st = ucp_atomic_post(ep, UCP_ATOMIC_POST_OP_ADD, 1000, 8, base + 128, rkey);
    ucs_status_t fl = ucp_ep_flush(ep);
    CHECK("atomic_post + flush", st == UCS_OK && fl == UCS_OK && *w64 == 1009,
          "%s/%s word %llu", ucs_status_string(st), ucs_status_string(fl),
          (unsigned long long)*w64);
    uint64_t result = 77;                  /* fetch_nb CSWAP: compare `value`, store *result */
    st = wait_ptr(ucp_atomic_fetch_nb(ep, UCP_ATOMIC_FETCH_OP_CSWAP, 1009, &result, 8,
                                      base + 128, rkey, NULL));
    CHECK("atomic_fetch_nb cswap", st == UCS_OK && result == 1009 && *w64 == 77,
          "result %llu word %llu", (unsigned long long)result, (unsigned long long)*w64);
    uint64_t old64 = 0;
    st = ucp_atomic_fadd64(ep, 3, base + 128, rkey, &old64);
    CHECK("blocking ucp_atomic_fadd64", st == UCS_OK && old64 == 77 && *w64 == 80,
          "old %llu word %llu", (unsigned long long)old64, (unsigned long long)*w64);
    st = wait_ptr(ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &operand, 1, base + 130, rkey, &p));
    CHECK("a misaligned atomic is an error", st != UCS_OK, "%s", ucs_status_string(st));

    void *mapped = NULL;
    st = ucp_rkey_ptr(rkey, base + 128, &mapped);
    CHECK("rkey_ptr maps ALLOCATE'd memory of this host",
          st == UCS_OK && mapped != NULL && *(uint64_t *)mapped == 80,
          "%s", ucs_status_string(st));
    if (st == UCS_OK) {
        *(uint64_t *)mapped = 4242;        /* a store through the mapping is the region's */
        CHECK("... the same memory", *w64 == 4242, "word %llu", (unsigned long long)*w64);
    }
    st = ucp_rkey_ptr(rkey, base + 4096, &mapped);
    CHECK("rkey_ptr outside the region is an error", st != UCS_OK, "%s", ucs_status_string(st));

    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    ucp_context_print_info(ctx, f);
    fclose(f);
    CHECK("print_info lists ucxpy's own resources",
          text != NULL && strstr(text, "flags -- self/") && strstr(text, "ucxpy") &&
          !strstr(text, "rc_verbs") && !strstr(text, "posix"), "%s", text);
    free(text);
}

static void test_rma(ucp_context_h ctx)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL,
        .length = 4096,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    ucp_mem_h mh;
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    void *packed;
    size_t packed_len;
    ucp_rkey_h rkey;
    ucs_status_t st = ucp_mem_map(ctx, &mp, &mh);
    CHECK("mem_map ALLOCATE", st == UCS_OK, "%s", ucs_status_string(st));
    if (st != UCS_OK)
        return;
    ucp_mem_query(mh, &ma);
    ucp_rkey_pack(ctx, mh, &packed, &packed_len);
    st = ucp_ep_rkey_unpack(ep, packed, &rkey);
    ucp_rkey_buffer_release(packed);
    CHECK("rkey pack and unpack", st == UCS_OK && ma.length == 4096, "%s",
          ucs_status_string(st));
    char out[32] = "one-sided", in[32] = {0};
    uint64_t base = (uint64_t)(uintptr_t)ma.address;
    st = ucp_put_nbi(ep, out, sizeof(out), base + 64, rkey);
    ucs_status_t fl = ucp_ep_flush(ep);
    st = (st == UCS_OK || st == UCS_INPROGRESS) ? fl : st;
    CHECK("put_nbi + ep_flush lands", st == UCS_OK && !strcmp((char *)ma.address + 64, out),
          "%s", ucs_status_string(st));
    void *g = ucp_get_nb(ep, in, sizeof(in), base + 64, rkey, NULL);
    while (g != NULL && !UCS_PTR_IS_ERR(g) && !ucp_request_is_completed(g))
        ucp_worker_progress(worker);
    if (g != NULL && !UCS_PTR_IS_ERR(g))
        ucp_request_free(g);
    CHECK("get_nb reads it back", !strcmp(in, out), "got '%s'", in);
    st = ucp_put(ep, out, sizeof(out), base + 4096, rkey);
    CHECK("put outside the region is an error", st != UCS_OK, "%s", ucs_status_string(st));
    test_atomics(ctx, base, ma.address, rkey);
    ucp_rkey_destroy(rkey);
    ucp_mem_unmap(ctx, mh);

    /* an empty region (MPICH maps one for a window of size 0) */
    mp.length = 0;
    mp.flags = 0;
    mp.address = out;
    st = ucp_mem_map(ctx, &mp, &mh);
    CHECK("mem_map of 0 bytes", st == UCS_OK, "%s", ucs_status_string(st));
    if (st != UCS_OK)
        return;
    ucp_rkey_pack(ctx, mh, &packed, &packed_len);
    st = ucp_ep_rkey_unpack(ep, packed, &rkey);
    ucp_rkey_buffer_release(packed);
    CHECK("its key unpacks", st == UCS_OK, "%s", ucs_status_string(st));
    CHECK("0 bytes through it: done, more: an error",
          ucp_put_nbi(ep, out, 0, 0, rkey) == UCS_OK && ucp_put_nbi(ep, out, 8, 0, rkey) < 0,
          "statuses");
    ucp_rkey_destroy(rkey);
    ucp_mem_unmap(ctx, mh);
}

int main(void)
{
    ucp_config_t *config;
    ucp_context_h ctx;
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE |
                      UCP_PARAM_FIELD_REQUEST_INIT,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_RMA,
        .request_size = sizeof(user_req_t),
        .request_init = request_init,
    };
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_address_t *addr;
    size_t addr_len;

    if (ucp_config_read(NULL, NULL, &config) != UCS_OK ||
        ucp_init(&params, config, &ctx) != UCS_OK) {
        printf("not ok - ucp_init\n");
        return 1;
    }
    ucp_config_release(config);
    ucp_worker_create(ctx, &wp, &worker);
    ucp_worker_get_address(worker, &addr, &addr_len);
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address = addr};
    CHECK("endpoint to a worker address", ucp_ep_create(worker, &ep_params, &ep) == UCS_OK,
          "failed");
    ucp_worker_release_address(worker, addr);

    test_eager_and_rules();
    test_release_before_completion();
    test_caller_request(ctx);
    test_cancel();
    test_truncation_and_mask();
    test_probe();
    test_sync_send();
    test_generic_datatype();
    test_active_messages();
    test_active_message_burst();
    test_persistent_active_messages();
    test_rma(ctx);
    CHECK("request_init once per pool object", inits > 0 && inits < 20, "inits %d", inits);

    void *close = ucp_disconnect_nb(ep);
    while (close != NULL && !UCS_PTR_IS_ERR(close) && !ucp_request_is_completed(close))
        ucp_worker_progress(worker);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    printf("%d failed\n", failures);
    return failures;
}
