/* Changes to a file through a descriptor: rofd FILE prints, for each way, "ok" or
 * the error. Under a policy that makes FILE read-only, every one must fail with
 * "Read-only file system", as through a descriptor of a read-only mount. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

static void say(const char *what, long r) {
    printf("%s %s\n", what, r == 0 ? "ok" : strerror(errno));
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int fd = open(argv[1], O_RDONLY);
    int pfd = open(argv[1], O_PATH);
    if (fd < 0 || pfd < 0) { perror("open"); return 1; }
    const char *mode = argv[2];
    if (strcmp(mode, "served") == 0) {
        /* The forms the server serves (a path argument, here empty or null). */
        say("fchmodat2-empty", syscall(452, pfd, "", 0606, AT_EMPTY_PATH));
        say("fchownat-empty", fchownat(pfd, "", 2, 2, AT_EMPTY_PATH));
        struct timespec ts[2] = {{1, 0}, {1, 0}};
        say("utimensat-empty", utimensat(pfd, "", ts, AT_EMPTY_PATH));
        say("utimensat-null", syscall(SYS_utimensat, fd, NULL, ts, 0));
    } else {
        /* The descriptor-only calls, which run natively. */
        say("fchmod", fchmod(fd, 0606));
        say("fchown", fchown(fd, 2, 2));
        say("fsetxattr", fsetxattr(fd, "user.ictus", "1", 1, 0));
        say("fremovexattr", fremovexattr(fd, "user.ictus"));
    }
    return 0;
}
