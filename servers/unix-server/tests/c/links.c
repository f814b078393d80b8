/* readlink's answers through the library's cache: "not a link" (EINVAL) and "missing"
 * (ENOENT) repeated, then the path changed by this process (rmdir, symlink, unlink,
 * rename) and by a child process — each change seen at once. Prints one line per
 * answer. Run in an empty directory. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void rl(const char *p) {
    char buf[64];
    ssize_t n = readlink(p, buf, sizeof buf - 1);
    if (n < 0) printf("%s %s\n", p, strerror(errno));
    else { buf[n] = 0; printf("%s -> %s\n", p, buf); }
}

int main(void) {
    mkdir("x", 0755);
    for (int i = 0; i < 3; i++) rl("x");
    char abs[4096];
    if (!getcwd(abs, sizeof abs - 2)) return 1;
    strcat(abs, "/x");
    rl(abs);
    rmdir("x");
    rl("x");
    rl("x");
    symlink("t1", "x");
    rl("x");
    unlink("x");
    rl("x");
    mkdir("x", 0755);
    rl("x");
    rmdir("x");
    symlink("t2", "y");
    rename("y", "x");
    rl("x");
    unlink("x");
    mkdir("x", 0755);
    rl("x");
    if (fork() == 0) {
        rmdir("x");
        symlink("t3", "x");
        _exit(0);
    }
    wait(NULL);
    rl("x");
    rl(abs);
    return 0;
}
