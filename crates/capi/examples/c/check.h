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

#include <fcntl.h>
#include <unistd.h>

/* Start this program again as `argv0 child FD`, the descriptor `fd` (a send right)
 * inherited across exec; the parent's copy is closed. Returns the child's pid, or -1. */
static inline pid_t spawn_child_with_fd(const char *argv0, int fd) {
    pid_t pid = fork();
    if (pid == 0) {
        /* Only async-signal-safe calls between fork and exec. */
        char arg[16], digits[16];
        int k = 0, v = fd;
        do { digits[k++] = (char)('0' + v % 10); v /= 10; } while (v > 0);
        for (int i = 0; i < k; i++) arg[i] = digits[k - 1 - i];
        arg[k] = '\0';
        fcntl(fd, F_SETFD, 0); /* keep the send right across exec */
        execl("/proc/self/exe", argv0, "child", arg, (char *)NULL);
        _exit(127);
    }
    close(fd);
    return pid;
}
#endif
