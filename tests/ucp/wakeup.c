/*
 * wakeup.c — ucp_worker_get_efd / ucp_worker_arm on ucxpy's libucp, two
 * processes.
 *
 * The parent and a forked child each make a libucp worker (UCP_FEATURE_WAKEUP)
 * and swap worker addresses through pipes; the transport is the test's
 * (UCXPY_TLS).  The child sleeps as a progress thread does (NIXL's): progress
 * until nothing happens, ucp_worker_arm, and poll() on the worker's event
 * descriptor; it tells the parent (a pipe) once it is armed, and the parent
 * then waits 200 ms and sends.  Each check prints "ok - <name>" or
 * "not ok - <name>: why"; the exit status is the number of failed checks.
 *
 * What it pins down:
 *  - an 8 B message, a 1 MiB one (rendezvous) and an active message each
 *    wake the sleeping child: poll() returns the descriptor readable, long
 *    before its 20 s limit, and the data arrives whole;
 *  - ucp_worker_arm says UCS_ERR_BUSY while a message waits unprogressed;
 *  - without UCP_FEATURE_WAKEUP the context has no event descriptor
 *    (UCS_ERR_INVALID_PARAM), as UCX's;
 *  - a worker made with the caller's epoll set (UCP_WORKER_PARAM_FIELD_EVENT_FD)
 *    has none of its own to give (UCS_ERR_UNSUPPORTED), and arm puts its
 *    descriptors in the caller's set.
 */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "pair.h"

#define BIG (1 << 20)
#define TAG_SMALL 0x10
#define TAG_BIG 0x20
#define TAG_BUSY 0x30
#define AM_ID 3
#define SLEEP_LIMIT_MS 20000

static ucp_ep_h ep;
static int am_seen;
static uint64_t am_value;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)param;
    if (length == sizeof am_value)
        memcpy(&am_value, data, sizeof am_value);
    am_seen++;
    return UCS_OK;
}

static void setup(int rfd, int wfd)
{
    ucp_address_t *addr;
    void *peer;

    pair_setup(UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP, rfd, wfd, &addr, &peer);
    ucp_worker_release_address(worker, addr);
    ep = pair_ep(peer);
    free(peer);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB,
                                 .id = AM_ID, .cb = am_cb};
    if (ucp_worker_set_am_recv_handler(worker, &hp) != UCS_OK) {
        printf("not ok - %sam handler\n", who);
        exit(97);
    }
}

static void teardown(void)
{
    ucp_request_param_t p = {.op_attr_mask = 0};
    wait_req(ucp_ep_close_nbx(ep, &p), NULL);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
}

static void sync_byte(int rfd, int wfd, char c)
{
    char got = 0;
    if (write(wfd, &c, 1) != 1 || read(rfd, &got, 1) != 1 || got != c) {
        printf("not ok - %ssync %c\n", who, c);
        exit(97);
    }
}

/* Sleep as a progress thread does until `done` (polled after each pass):
 * progress, arm, poll the event descriptor.  Tells the parent (wfd) once,
 * when first armed.  Returns how many times poll() said readable, or -1 when
 * it ran into its limit. */
static int sleep_until(int efd, int wfd, int *done)
{
    int told = 0, woken = 0;
    double start = now_ms();

    while (!*done) {
        while (ucp_worker_progress(worker) != 0)
            ;
        if (*done)
            break;
        ucs_status_t st = ucp_worker_arm(worker);
        if (st == UCS_ERR_BUSY)
            continue;
        if (st != UCS_OK) {
            printf("# %sarm: %s\n", who, ucs_status_string(st));
            return -1;
        }
        if (!told) {
            char c = 'A';
            if (write(wfd, &c, 1) != 1)
                return -1;
            told = 1;
        }
        struct pollfd p = {.fd = efd, .events = POLLIN};
        int left = SLEEP_LIMIT_MS - (int)(now_ms() - start);
        int n = left > 0 ? poll(&p, 1, left) : 0;
        if (n == 0)
            return -1;
        if (n > 0)
            woken++;
    }
    return woken;
}

static struct {
    ucp_tag_recv_info_t info;
    int done;
} rx;

static void recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user_data)
{
    (void)request, (void)status, (void)user_data;
    rx.info = *info;
    rx.done = 1;
}

static int child(int rfd, int wfd)
{
    static uint8_t big[BIG];
    uint64_t small = 0;
    int efd = -1, woken;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
                             .cb.recv = recv_cb};

    who = "child: ";
    setup(rfd, wfd);
    CHECK("get_efd", ucp_worker_get_efd(worker, &efd) == UCS_OK && efd >= 0, "efd %d", efd);

    /* an 8 B message wakes the sleeper */
    rx.done = 0;
    void *r = ucp_tag_recv_nbx(worker, &small, sizeof small, TAG_SMALL, ~0ull, &p);
    if (r == NULL)
        rx.done = 1;
    woken = sleep_until(efd, wfd, &rx.done);
    CHECK("an 8 B message wakes the armed worker", woken > 0 && small == 0x1122334455667788ull,
          "woken %d, data %llx", woken, (unsigned long long)small);
    if (r != NULL && !UCS_PTR_IS_ERR(r))
        ucp_request_free(r);

    /* a rendezvous wakes it (the offer, then the data) */
    rx.done = 0;
    r = ucp_tag_recv_nbx(worker, big, BIG, TAG_BIG, ~0ull, &p);
    if (r == NULL)
        rx.done = 1;
    woken = sleep_until(efd, wfd, &rx.done);
    int whole = 1;
    for (size_t i = 0; i < BIG; i++)
        whole &= big[i] == (uint8_t)(i * 13 + 1);
    CHECK("a 1 MiB rendezvous wakes the armed worker", woken > 0 && whole && rx.info.length == BIG,
          "woken %d, whole %d, length %zu", woken, whole, rx.info.length);
    if (r != NULL && !UCS_PTR_IS_ERR(r))
        ucp_request_free(r);

    /* an active message wakes it */
    woken = sleep_until(efd, wfd, &am_seen);
    CHECK("an active message wakes the armed worker", woken > 0 && am_value == 77,
          "woken %d, value %llu", woken, (unsigned long long)am_value);

    /* a message waiting unprogressed: arm says busy */
    sync_byte(rfd, wfd, 'B');               /* the parent sent it before answering */
    usleep(200000);
    ucs_status_t st = ucp_worker_arm(worker);
    CHECK("arm is busy while a message waits", st == UCS_ERR_BUSY, "%s", ucs_status_string(st));
    small = 0;
    rx.done = 0;
    r = ucp_tag_recv_nbx(worker, &small, sizeof small, TAG_BUSY, ~0ull, &p);
    if (r == NULL)
        rx.done = 1;
    while (!rx.done)
        ucp_worker_progress(worker);
    CHECK("then it is received", small == 42, "%llu", (unsigned long long)small);
    if (r != NULL && !UCS_PTR_IS_ERR(r))
        ucp_request_free(r);

    sync_byte(rfd, wfd, 'E');
    teardown();
    return failures;
}

/* Progress until the child says it is armed, and for 200 ms more (it is
 * asleep in poll by then): over tcp, a connection the parent started needs
 * the parent's progress too. */
static void wait_armed(int rfd)
{
    struct pollfd pf = {.fd = rfd, .events = POLLIN};
    char c;
    double until;

    while (poll(&pf, 1, 0) == 0)
        ucp_worker_progress(worker);
    if (read(rfd, &c, 1) != 1 || c != 'A') {
        printf("not ok - the child never armed\n");
        exit(97);
    }
    for (until = now_ms() + 200; now_ms() < until;)
        ucp_worker_progress(worker);
}

static int parent(int rfd, int wfd)
{
    static uint8_t big[BIG];
    uint64_t small = 0x1122334455667788ull, value = 77, busy = 42;
    ucp_request_param_t p = {.op_attr_mask = 0};

    setup(rfd, wfd);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (uint8_t)(i * 13 + 1);
    wait_armed(rfd);
    CHECK("send 8 B", wait_req(ucp_tag_send_nbx(ep, &small, sizeof small, TAG_SMALL, &p), NULL) == UCS_OK,
          "failed");
    wait_armed(rfd);
    CHECK("send 1 MiB", wait_req(ucp_tag_send_nbx(ep, big, BIG, TAG_BIG, &p), NULL) == UCS_OK,
          "failed");
    wait_armed(rfd);
    CHECK("send an active message",
          wait_req(ucp_am_send_nbx(ep, AM_ID, NULL, 0, &value, sizeof value, &p), NULL) == UCS_OK,
          "failed");
    /* (the child is awake now: it waits for 'B') */
    char c;
    if (read(rfd, &c, 1) != 1 || c != 'B')
        exit(97);
    CHECK("send one more", wait_req(ucp_tag_send_nbx(ep, &busy, sizeof busy, TAG_BUSY, &p), NULL) == UCS_OK,
          "failed");
    c = 'B';
    if (write(wfd, &c, 1) != 1)
        exit(97);
    /* serve the child (a rendezvous' data, acknowledgements) until it ends */
    struct pollfd pf = {.fd = rfd, .events = POLLIN};
    while (poll(&pf, 1, 0) == 0)
        ucp_worker_progress(worker);
    if (read(rfd, &c, 1) != 1 || c != 'E' || write(wfd, &c, 1) != 1)
        exit(97);

    /* the feature and the caller's own epoll set */
    ucp_params_t plain = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_context_h ctx2;
    ucp_worker_h w2;
    ucp_worker_params_t wp = {.field_mask = 0};
    int fd = -1;
    if (ucp_init(&plain, NULL, &ctx2) == UCS_OK && ucp_worker_create(ctx2, &wp, &w2) == UCS_OK) {
        ucs_status_t st = ucp_worker_get_efd(w2, &fd);
        CHECK("no event descriptor without UCP_FEATURE_WAKEUP", st == UCS_ERR_INVALID_PARAM,
              "%s", ucs_status_string(st));
        ucp_worker_destroy(w2);
        ucp_cleanup(ctx2);
    }
    int mine = epoll_create1(0);
    ucp_worker_params_t wpe = {.field_mask = UCP_WORKER_PARAM_FIELD_EVENT_FD, .event_fd = mine};
    if (ucp_worker_create(ctx, &wpe, &w2) == UCS_OK) {
        ucs_status_t st = ucp_worker_get_efd(w2, &fd);
        CHECK("the caller's epoll set: no descriptor of its own", st == UCS_ERR_UNSUPPORTED,
              "%s", ucs_status_string(st));
        while (ucp_worker_progress(w2) != 0)
            ;
        st = ucp_worker_arm(w2);
        struct epoll_event evs[8];
        int ready = epoll_wait(mine, evs, 8, 0);
        CHECK("arm puts its descriptors in the caller's set", st == UCS_OK && ready == 0,
              "arm %s, %d ready", ucs_status_string(st), ready);
        ucp_worker_destroy(w2);
    }
    close(mine);
    teardown();
    return failures;
}

int main(void)
{
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0)
        return 99;
    pid_t pid = fork();
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(child(down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    int mine = parent(up[0], down[1]), status = 0;
    waitpid(pid, &status, 0);
    int theirs = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
    printf("%d failed\n", mine + theirs);
    return mine + theirs != 0;
}
