/* Read-only lookups from the program and from the library's code range.
 * argv[1]: a file to look up; argv[2]: a directory to create files in; argv[3]: how
 * many read-only opens and stats (and creates, and access(W_OK) checks) to make
 * through glibc.
 * The program maps its own code inside the library's address range (as hostile.c)
 * and calls the lookups from there directly: what the filter lets through natively
 * must be only what the policy shows anyway. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gadget.h"

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const char *file = argv[1];
    int k = atoi(argv[3]);
    struct stat st;
    int bad = 0;
    for (int i = 0; i < k; i++) {
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0) bad++; else close(fd);
        if (stat(file, &st) != 0) bad++;
    }
    for (int i = 0; i < k; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/w%d", argv[2], i);
        int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) bad++; else close(fd);
    }
    printf("glibc lookups failed: %d\n", bad);
    int unwritable = 0;
    for (int i = 0; i < k; i++)
        if (access(file, W_OK) != 0) unwritable += errno == EROFS;
    printf("glibc write checks EROFS: %d\n", unwritable);
    make_gadget();
    char buf[256], stx[256];
    long fd = gadget(257, -100, (long)file, O_RDONLY, 0, 0, 0);
    printf("library-range open read-only: %s\n", e(fd));
    if (fd >= 0) close((int)fd);
    printf("library-range open for writing: %s\n", e(fd = gadget(257, -100, (long)file, O_WRONLY, 0, 0, 0)));
    if (fd >= 0) close((int)fd);
    printf("library-range open truncating: %s\n", e(fd = gadget(257, -100, (long)file, O_RDONLY | O_TRUNC, 0, 0, 0)));
    if (fd >= 0) close((int)fd);
    printf("library-range stat: %s\n", e(gadget(262, -100, (long)file, (long)&st, 0, 0, 0)));
    printf("library-range statx: %s\n", e(gadget(332, -100, (long)file, 0, 0x7ff, (long)stx, 0)));
    printf("library-range access read: %s\n", e(gadget(439, -100, (long)file, R_OK, 0, 0, 0)));
    printf("library-range access write: %s\n", e(gadget(439, -100, (long)file, W_OK, 0, 0, 0)));
    printf("library-range readlink: %s\n", e(gadget(267, -100, (long)file, (long)buf, sizeof buf, 0, 0)));
    printf("open: %s\n", e(open(file, O_RDONLY) < 0 ? -errno : 0));
    printf("stat: %s\n", e(stat(file, &st) < 0 ? -errno : 0));
    return 0;
}
