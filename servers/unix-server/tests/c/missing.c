/* Failed lookups, cached by the library, must follow every change that makes them
 * succeed (or fail otherwise): files created here and by a child, through a final
 * link, at an intermediate name (ENOTDIR), a dangling link's target, an unlink under
 * a cached "not a link". Run in an empty directory given as argv[1]; prints one line
 * per lookup, compared with a native run. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void st(const char *what, const char *p) {
    struct stat s;
    int r = stat(p, &s);
    printf("%s stat %s\n", what, r == 0 ? "ok" : strerror(errno));
}

static void mk(const char *p) {
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    else printf("create %s: %s\n", p, strerror(errno));
}

int main(int argc, char **argv) {
    char abs[4096];
    if (argc < 2 || chdir(argv[1]) != 0) return 2;
    for (int round = 0; round < 2; round++) st("warm", "nothing-here");
    st("f before", "f"); st("f before", "f"); mk("f"); st("f after", "f");
    st("sub/g before", "sub/g"); mkdir("sub", 0755); st("sub/g after mkdir", "sub/g");
    mk("sub/g"); st("sub/g after", "sub/g");
    symlink("t", "L"); st("L dangling", "L"); st("L dangling", "L"); mk("t"); st("L after t", "L");
    symlink("u", "M"); st("u before", "u"); st("u before", "u"); mk("M"); st("u after create through M", "u");
    st("h/x before", "h/x"); st("h/x before", "h/x"); mk("h"); st("h/x after h", "h/x");
    snprintf(abs, sizeof abs, "%s/abs", argv[1]);
    st("abs before", abs); st("abs before", abs); mk("abs"); st("abs after", abs);
    st("k before", "k"); st("k before", "k");
    pid_t c = fork();
    if (c == 0) { mk("k"); _exit(0); }
    waitpid(c, NULL, 0);
    st("k after child", "k");
    printf("access a2 before %d\n", access("a2", F_OK) == 0 ? 0 : errno); mk("a2");
    printf("access a2 after %d\n", access("a2", F_OK) == 0 ? 0 : errno);
    char buf[64];
    printf("readlink f %s\n", readlink("f", buf, sizeof buf) >= 0 ? "link" : strerror(errno));
    printf("readlink f %s\n", readlink("f", buf, sizeof buf) >= 0 ? "link" : strerror(errno));
    unlink("f");
    printf("readlink f after unlink %s\n", readlink("f", buf, sizeof buf) >= 0 ? "link" : strerror(errno));
    return 0;
}
