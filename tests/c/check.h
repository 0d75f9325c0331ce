/*
 * check.h — the C tests' one assertion: CHECK(cond) reports a failed check
 * by file, line and text and counts it; a test's main returns failures != 0.
 */
#ifndef UCXPY_TESTS_CHECK_H
#define UCXPY_TESTS_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);    \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

#endif
