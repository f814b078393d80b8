/* A check every example uses: on failure, say which call failed and why, and exit. */
#ifndef ICTUS_EXAMPLE_CHECK_H
#define ICTUS_EXAMPLE_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <ictus.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        ictus_error check_err_ = (call);                                             \
        if (check_err_ != ICTUS_OK) {                                                \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,        \
                    ictus_strerror(check_err_), ictus_last_error());                 \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#define SECONDS(n) ((int64_t)(n) * 1000000000LL)
#endif
