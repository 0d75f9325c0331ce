/*
 * test_dp_match.c — the data plane's matcher (match.c) from a plain C
 * program: MPI's order among exact, bucketed and wildcard receives, the
 * unexpected queue searched oldest first, probes, cancels, and hashes that
 * grow under thousands of entries.  (tests/test_dp_match.py compares it with
 * the Python reference on random sequences.)
 */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "match.h"

#define BUCKET (~(uint64_t)0xFF)
#define N 5000

static ucxdp_recv_t recv_of(int64_t source, uint64_t tag, uint64_t mask)
{
    ucxdp_recv_t r = {.source = source, .tag = tag, .mask = mask};
    return r;
}

static void test_order(void)
{
    ucxdp_matcher_t m;
    ucxdp_recv_t exact = recv_of(1, 0x105, UCXDP_FULL_MASK);
    ucxdp_recv_t wild = recv_of(UCXDP_ANY_SOURCE, 0x105, UCXDP_FULL_MASK);
    ucxdp_recv_t bucket = recv_of(1, 0x100, BUCKET);
    ucxdp_recv_t exact2 = recv_of(1, 0x105, UCXDP_FULL_MASK);
    int err;

    CHECK(ucxdp_match_init(&m) == 0);
    CHECK(ucxdp_match_set_bucket_mask(&m, BUCKET) == 0);
    /* posted in this order: the earliest one a message matches wins */
    CHECK(ucxdp_match_post(&m, &wild, &err) == NULL && err == 0);
    CHECK(ucxdp_match_post(&m, &exact, &err) == NULL);
    CHECK(ucxdp_match_post(&m, &bucket, &err) == NULL);
    CHECK(ucxdp_match_post(&m, &exact2, &err) == NULL);
    CHECK(ucxdp_match_set_bucket_mask(&m, 0) == -1);    /* not while posted */
    CHECK(ucxdp_match_posted_count(&m) == 4);
    CHECK(ucxdp_match_arrived(&m, 2, 0x105) == &wild);   /* any source */
    CHECK(ucxdp_match_arrived(&m, 1, 0x1FF) == &bucket); /* the low byte left out */
    CHECK(ucxdp_match_arrived(&m, 1, 0x105) == &exact);
    CHECK(ucxdp_match_arrived(&m, 1, 0x105) == &exact2);
    CHECK(ucxdp_match_arrived(&m, 1, 0x105) == NULL);
    CHECK(!ucxdp_match_is_posted(&exact) && ucxdp_match_posted_count(&m) == 0);
    /* cancel */
    CHECK(ucxdp_match_post(&m, &exact, &err) == NULL);
    CHECK(ucxdp_match_remove(&m, &exact) == 1 && ucxdp_match_remove(&m, &exact) == 0);
    CHECK(ucxdp_match_arrived(&m, 1, 0x105) == NULL);
    ucxdp_match_cleanup(&m);
}

static void test_unexpected(void)
{
    ucxdp_matcher_t m;
    ucxdp_unexp_t u[4] = {{.source = 1, .tag = 7}, {.source = 2, .tag = 7},
                          {.source = 1, .tag = 8}, {.source = 1, .tag = 7}};
    ucxdp_recv_t any = recv_of(UCXDP_ANY_SOURCE, 7, UCXDP_FULL_MASK);
    ucxdp_recv_t one = recv_of(1, 7, UCXDP_FULL_MASK);
    int err;

    CHECK(ucxdp_match_init(&m) == 0);
    for (int i = 0; i < 4; i++)
        CHECK(ucxdp_match_unexpected(&m, &u[i]) == 0);
    CHECK(ucxdp_match_probe(&m, 1, 0, 0, 0) == &u[0]);             /* oldest, any tag */
    CHECK(ucxdp_match_probe(&m, 1, 8, UCXDP_FULL_MASK, 1) == &u[2]); /* removed */
    CHECK(ucxdp_match_probe(&m, 1, 8, UCXDP_FULL_MASK, 0) == NULL);
    CHECK(ucxdp_match_post(&m, &any, &err) == &u[0] && !ucxdp_match_is_posted(&any));
    CHECK(ucxdp_match_post(&m, &any, &err) == &u[1]);
    CHECK(ucxdp_match_post(&m, &one, &err) == &u[3]);
    CHECK(ucxdp_match_post(&m, &one, &err) == NULL && ucxdp_match_is_posted(&one));
    ucxdp_match_remove(&m, &one);
    ucxdp_match_cleanup(&m);
}

/* thousands of keys: the hashes double and each key keeps its order */
static void test_growth(void)
{
    ucxdp_matcher_t m;
    ucxdp_recv_t *r = calloc(2 * N, sizeof(*r));
    ucxdp_unexp_t *u = calloc(N, sizeof(*u));
    int err, ok = 1;

    CHECK(ucxdp_match_init(&m) == 0);
    for (int i = 0; i < 2 * N; i++) {
        r[i] = recv_of(i % 7, (uint64_t)(i % N), UCXDP_FULL_MASK);
        CHECK(ucxdp_match_post(&m, &r[i], &err) == NULL);
    }
    CHECK(m.exact.nbuckets >= N);
    for (int i = 0; i < 2 * N; i++)
        ok &= ucxdp_match_arrived(&m, i % 7, (uint64_t)(i % N)) == &r[i];
    CHECK(ok && ucxdp_match_posted_count(&m) == 0);
    for (int i = 0; i < N; i++) {
        u[i].source = i % 3;
        u[i].tag = (uint64_t)(i % 100);
        ucxdp_match_unexpected(&m, &u[i]);
    }
    ok = 1;
    for (int i = 0; i < N; i++)
        ok &= ucxdp_match_probe(&m, i % 3, (uint64_t)(i % 100), UCXDP_FULL_MASK, 1) == &u[i];
    CHECK(ok && m.nunexp == 0);
    ucxdp_match_cleanup(&m);
    free(r);
    free(u);
}

int main(void)
{
    test_order();
    test_unexpected();
    test_growth();
    if (failures)
        fprintf(stderr, "test_dp_match: %d checks failed\n", failures);
    else
        printf("test_dp_match: OK\n");
    return failures != 0;
}
