/*
 * ucp_calls.c — the cost of single UCP calls on ucxpy's libucp.so.0 (C -> core).
 *
 * One process, one worker, an endpoint to itself (loopback: no peer, so
 * what is measured is the call path, not a transport).  Prints one line per
 * operation: name, calls, ns per call.  bench/ucp_bench.py runs it beside
 * the same operations on ucxpy's Python API.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ucp/api/ucp.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);  /* CPU time: robust to a shared machine */
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int done;
static void cb(void *r, ucs_status_t s, const ucp_tag_recv_info_t *i, void *u)
{
    (void)r; (void)s; (void)i; (void)u;
    done++;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_worker_params_t wp = {.field_mask = 0};
    ucp_address_t *addr;
    size_t len;
    ucp_ep_h ep;
    char buf[8] = "payload", in[8];

    ucp_init(&params, NULL, &ctx);
    ucp_worker_create(ctx, &wp, &w);
    ucp_worker_get_address(w, &addr, &len);
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = addr};
    ucp_ep_create(w, &ep_params, &ep);

    double t0 = now();
    for (int i = 0; i < n; i++)
        ucp_worker_progress(w);
    printf("progress_idle %d %.0f\n", n, (now() - t0) / n * 1e9);

    ucp_request_param_t sp = {.op_attr_mask = 0};
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FLAG_NO_IMM_CMPL, .cb.recv = cb};
    t0 = now();
    for (int i = 0; i < n; i++) {
        void *s = ucp_tag_send_nbx(ep, buf, 8, 5, &sp);
        if (s != NULL) {
            while (!ucp_request_is_completed(s))
                ucp_worker_progress(w);
            ucp_request_free(s);
        }
        void *r = ucp_tag_recv_nbx(w, in, 8, 5, (ucp_tag_t)-1, &rp);
        while (!ucp_request_is_completed(r))
            ucp_worker_progress(w);
        ucp_request_free(r);
    }
    printf("send_recv_8B %d %.0f\n", n, (now() - t0) / n * 1e9);
    ucp_disconnect_nb(ep);
    ucp_worker_release_address(w, addr);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    return done == n ? 0 : 1;
}
