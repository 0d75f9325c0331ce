/*
 * test_dp_rma.c — the data plane's RMA and atomics on mapped memory, from a
 * plain C program (no Python): two processes, each with its own worker, on
 * one shared region; threads on one worker; and every case the data plane
 * must decline without touching memory.
 *
 * Built and run by `make test-c` (and under ASan/UBSan by `make test-c-san`,
 * ThreadSanitizer by `make test-c-tsan`); tests/test_dp_c.py runs them.
 * Exit status 0 when every check held; a failed check names itself.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dp.h"

#define REGION 4096
#define BASE 0x7000000000ULL               /* the region's address "at the peer" */
#define ADDS 20000
#define THREADS 4

/* the shared region's layout: a guard word, then the words under test */
typedef struct {
    uint64_t guard;
    uint64_t counter;
    uint32_t counter32;
    uint32_t pad;
    char bytes[256];
} region_t;

static ucxdp_rkey_t key_of(region_t *r)
{
    ucxdp_rkey_t key = {
        .mapped = (char *)r, .base = BASE, .length = REGION, .guard = &r->guard,
        .guard_value = 42, .flags = UCXDP_RKEY_ATOMICS,
    };
    return key;
}

#define AT(field) (BASE + offsetof(region_t, field))

static void test_copies(ucxdp_worker_t *w, region_t *r)
{
    ucxdp_rkey_t key = key_of(r);
    char out[8] = {0};
    ucxdp_counters_t c;

    CHECK(ucxdp_put(w, &key, AT(bytes), "abcdefg", 8) == UCXDP_OK);
    CHECK(strcmp(r->bytes, "abcdefg") == 0);
    CHECK(ucxdp_get(w, &key, AT(bytes) + 2, out, 3) == UCXDP_OK && memcmp(out, "cde", 3) == 0);
    CHECK(ucxdp_put(w, &key, BASE + REGION - 1, "z", 1) == UCXDP_OK);   /* the last byte */
    CHECK(ucxdp_put(w, &key, BASE + REGION, "", 0) == UCXDP_OK);        /* empty, at the end */
    /* declined, nothing touched */
    CHECK(ucxdp_put(w, &key, BASE + REGION, "z", 1) == UCXDP_ERR_OUT_OF_RANGE);
    CHECK(ucxdp_put(w, &key, BASE + REGION - 1, "zz", 2) == UCXDP_ERR_OUT_OF_RANGE);
    CHECK(ucxdp_get(w, &key, BASE - 1, out, 1) == UCXDP_ERR_OUT_OF_RANGE);
    CHECK(ucxdp_get(w, &key, UINT64_MAX, out, 2) == UCXDP_ERR_OUT_OF_RANGE);
    ucxdp_worker_counters(w, &c);
    CHECK(c.put == 3 && c.get == 1 && c.put_bytes == 9 && c.get_bytes == 3);
}

static void test_atomics(ucxdp_worker_t *w, region_t *r)
{
    ucxdp_rkey_t key = key_of(r), no_amo = key_of(r);
    uint64_t old = 0;

    r->counter = 10;
    CHECK(ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_ADD, 5, 0, &old) == UCXDP_OK);
    CHECK(old == 10 && r->counter == 15);
    CHECK(ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_CSWAP, 7, 15, &old) == UCXDP_OK);
    CHECK(old == 15 && r->counter == 7);
    CHECK(ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_CSWAP, 9, 15, &old) == UCXDP_OK);
    CHECK(old == 7 && r->counter == 7);
    CHECK(ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_SWAP, 3, 0, &old) == UCXDP_OK);
    CHECK(old == 7 && r->counter == 3);
    CHECK(ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_XOR, 1, 0, NULL) == UCXDP_OK);
    CHECK(r->counter == 2);
    r->counter32 = 0xFFFFFFFFu;
    CHECK(ucxdp_atomic(w, &key, AT(counter32), 4, UCXDP_AMO_ADD, 2, 0, &old) == UCXDP_OK);
    CHECK(old == 0xFFFFFFFFu && r->counter32 == 1 && r->pad == 0);      /* wraps in 32 bits */
    /* declined, nothing touched */
    CHECK(ucxdp_atomic(w, &key, AT(counter) + 4, 8, UCXDP_AMO_ADD, 1, 0, &old)
          == UCXDP_ERR_INVALID_PARAM);                                  /* misaligned */
    CHECK(ucxdp_atomic(w, &key, AT(counter), 2, UCXDP_AMO_ADD, 1, 0, &old)
          == UCXDP_ERR_INVALID_PARAM);                                  /* no such size */
    CHECK(ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_LAST, 1, 0, &old)
          == UCXDP_ERR_INVALID_PARAM);                                  /* no such op */
    CHECK(ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_SWAP, 1, 0, NULL)
          == UCXDP_ERR_INVALID_PARAM);                                  /* swap must fetch */
    CHECK(ucxdp_atomic(w, &key, BASE + REGION - 4, 8, UCXDP_AMO_ADD, 1, 0, &old)
          == UCXDP_ERR_OUT_OF_RANGE);
    no_amo.flags = 0;
    CHECK(ucxdp_atomic(w, &no_amo, AT(counter), 8, UCXDP_AMO_ADD, 1, 0, &old)
          == UCXDP_ERR_INVALID_PARAM);                                  /* device atomics */
    CHECK(r->counter == 2);
}

static void test_stale_key(ucxdp_worker_t *w, region_t *r)
{
    ucxdp_rkey_t key = key_of(r);
    uint64_t old;

    r->guard = 43;                         /* the owner unregistered the region */
    CHECK(ucxdp_put(w, &key, AT(bytes), "x", 1) == UCXDP_ERR_INVALID_ADDR);
    CHECK(ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_ADD, 1, 0, &old)
          == UCXDP_ERR_INVALID_ADDR);
    CHECK(r->bytes[0] == 'a' && r->counter == 2);
    r->guard = 42;
}

/* two processes, each with its own worker, add to one word concurrently */
static void test_two_processes(region_t *r)
{
    pid_t child;
    int status;

    r->counter = 0;
    child = fork();
    if (child == 0) {
        ucxdp_worker_t *w;
        ucxdp_rkey_t key = key_of(r);
        if (ucxdp_worker_create(&w) != UCXDP_OK)
            _exit(2);
        for (int i = 0; i < ADDS; i++)
            if (ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_ADD, 1, 0, NULL) != UCXDP_OK)
                _exit(3);
        ucxdp_worker_destroy(w);
        _exit(0);
    }
    ucxdp_worker_t *w;
    ucxdp_rkey_t key = key_of(r);
    uint64_t old;
    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    for (int i = 0; i < ADDS; i++)
        ucxdp_atomic(w, &key, AT(counter), 8, UCXDP_AMO_ADD, 1, 0, &old);
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(r->counter == 2 * ADDS);
    ucxdp_worker_destroy(w);
}

typedef struct {
    ucxdp_worker_t *w;
    region_t *r;
} thread_arg_t;

static void *adder(void *p)
{
    thread_arg_t *a = p;
    ucxdp_rkey_t key = key_of(a->r);
    uint64_t old;

    for (int i = 0; i < ADDS; i++)
        ucxdp_atomic(a->w, &key, AT(counter), 8, UCXDP_AMO_ADD, 1, 0, &old);
    return NULL;
}

/* threads share one worker: the word and the counters stay exact */
static void test_threads(region_t *r)
{
    ucxdp_worker_t *w;
    pthread_t t[THREADS];
    thread_arg_t a;
    ucxdp_counters_t c;

    CHECK(ucxdp_worker_create(&w) == UCXDP_OK);
    r->counter = 0;
    a.w = w;
    a.r = r;
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, adder, &a) == 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    ucxdp_worker_counters(w, &c);
    CHECK(r->counter == THREADS * ADDS && c.atomic == THREADS * ADDS);
    ucxdp_worker_destroy(w);
}

int main(void)
{
    region_t *r = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ucxdp_worker_t *w;

    if (r == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    r->guard = 42;
    if (ucxdp_worker_create(&w) != UCXDP_OK) {
        fprintf(stderr, "no worker\n");
        return 2;
    }
    test_copies(w, r);
    test_atomics(w, r);
    test_stale_key(w, r);
    ucxdp_worker_destroy(w);
    ucxdp_worker_destroy(NULL);            /* accepted */
    test_two_processes(r);
    test_threads(r);
    munmap(r, REGION);
    if (failures)
        fprintf(stderr, "test_dp_rma: %d checks failed\n", failures);
    else
        printf("test_dp_rma: OK\n");
    return failures != 0;
}
