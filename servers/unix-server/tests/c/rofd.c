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
    } else if (strcmp(mode, "xattr") == 0) {
        /* Attributes through a descriptor of a writable file: served where the policy
         * has read-only paths, answered as natively (the output is compared). */
        int wfd = open(argv[1], O_RDWR);
        if (wfd < 0) { perror("open rw"); return 1; }
        char big[9000];
        memset(big, 'v', sizeof big);
        say("fsetxattr", fsetxattr(wfd, "user.ictus", "hello", 5, 0));
        char got[16] = {0};
        long n = fgetxattr(wfd, "user.ictus", got, sizeof got);
        printf("fgetxattr %ld %s\n", n, n > 0 ? got : strerror(errno));
        say("fsetxattr-create-exists", fsetxattr(wfd, "user.ictus", "x", 1, XATTR_CREATE));
        say("fsetxattr-empty-value", fsetxattr(wfd, "user.empty", NULL, 0, 0));
        say("fsetxattr-bad-value", syscall(SYS_fsetxattr, wfd, "user.ictus", (void *)8, 5, 0));
        say("fsetxattr-bad-name", syscall(SYS_fsetxattr, wfd, (void *)8, "1", 1, 0));
        say("fsetxattr-empty-name", fsetxattr(wfd, "", "1", 1, 0));
        say("fsetxattr-4k", fsetxattr(wfd, "user.big", big, 4096, 0));
        say("fremovexattr", fremovexattr(wfd, "user.ictus"));
        say("fremovexattr-again", fremovexattr(wfd, "user.ictus"));
        say("fremovexattr-bad-name", syscall(SYS_fremovexattr, wfd, (void *)8));
        say("fsetxattr-bad-fd", fsetxattr(999, "user.ictus", "1", 1, 0));
    } else {
        /* The descriptor-only calls, which run natively. */
        say("fchmod", fchmod(fd, 0606));
        say("fchown", fchown(fd, 2, 2));
        say("fsetxattr", fsetxattr(fd, "user.ictus", "1", 1, 0));
        say("fremovexattr", fremovexattr(fd, "user.ictus"));
    }
    return 0;
}
