/*
 * pair.h — what the two-process harnesses share (dataplane.c, wakeup.c): a
 * parent and its forked child, each with a libucp worker, their addresses
 * swapped through pipes; TAP-like checks ("ok - <name>" or "not ok - <name>:
 * why", the child's prefixed by `who`), and waiting for a request.
 *
 * A header of static definitions, included once by each program.
 */
#ifndef UCXPY_TESTS_PAIR_H
#define UCXPY_TESTS_PAIR_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

static int failures;
static const char *who = "";
static ucp_context_h ctx;
static ucp_worker_h worker;

#define CHECK(name, cond, ...)                                                         \
    do {                                                                               \
        if (cond) {                                                                    \
            printf("ok - %s%s\n", who, name);                                          \
        } else {                                                                       \
            printf("not ok - %s%s: ", who, name);                                      \
            printf(__VA_ARGS__);                                                       \
            printf("\n");                                                              \
            failures++;                                                                \
        }                                                                              \
        fflush(stdout);                                                                \
    } while (0)

/* Wait for `r` (a request, NULL, or an error pointer): its status, and its
 * tag info for receives (`info`, or NULL). */
static ucs_status_t wait_req(void *r, ucp_tag_recv_info_t *info)
{
    ucs_status_t st;

    if (r == NULL)
        return UCS_OK;
    if (UCS_PTR_IS_ERR(r))
        return UCS_PTR_STATUS(r);
    for (long i = 0; (st = ucp_request_check_status(r)) == UCS_INPROGRESS; i++) {
        ucp_worker_progress(worker);
        if (i > 200000000L) {
            printf("# %sstuck waiting\n", who);
            exit(98);
        }
    }
    if (info != NULL)
        ucp_tag_recv_request_test(r, info);
    ucp_request_free(r);
    return st;
}

/* ucp_init with `features`, a worker, and the peer's address through the
 * pipes (malloc'd into *peer); this worker's own address in *addr (the
 * caller releases it).  Exits 97 on failure. */
static void pair_setup(uint64_t features, int rfd, int wfd, ucp_address_t **addr, void **peer)
{
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = features};
    ucp_worker_params_t wp = {.field_mask = 0};
    size_t len, peer_len;

    if (ucp_init(&params, NULL, &ctx) != UCS_OK || ucp_worker_create(ctx, &wp, &worker) != UCS_OK
            || ucp_worker_get_address(worker, addr, &len) != UCS_OK) {
        printf("not ok - %ssetup\n", who);
        exit(97);
    }
    if (write(wfd, &len, sizeof len) != sizeof len || write(wfd, *addr, len) != (ssize_t)len
            || read(rfd, &peer_len, sizeof peer_len) != sizeof peer_len
            || (*peer = malloc(peer_len)) == NULL
            || read(rfd, *peer, peer_len) != (ssize_t)peer_len) {
        printf("not ok - %saddress exchange\n", who);
        exit(97);
    }
}

/* An endpoint to the worker at `address`; exits 97 on failure. */
static ucp_ep_h pair_ep(void *address)
{
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address = address};
    ucp_ep_h e;
    if (ucp_ep_create(worker, &ep_params, &e) != UCS_OK) {
        printf("not ok - %sep_create\n", who);
        exit(97);
    }
    return e;
}

#endif
