/* Bad pointers to every call whose arguments the library copies: a wild pointer,
 * NULL, a page the program cannot read, and strings that run into such a page
 * without their NUL. The kernel answers EFAULT (or ENAMETOOLONG); the library must
 * answer the same, never fault itself. Each call is made three times from one site
 * (the first trap, the trap that patches it, the patched path). A string that ends
 * exactly at its page's end must still be read whole. Prints one line per case; the
 * test compares the lines with the native run's.
 * argv[1]: a scratch directory (the program's working directory). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *err(long r) {
    static char b[32];
    if (r >= 0) return "ok";
    switch (-r) {
    case EFAULT: return "EFAULT";
    case ENOENT: return "ENOENT";
    case ENAMETOOLONG: return "ENAMETOOLONG";
    case EEXIST: return "EEXIST";
    case EINVAL: return "EINVAL";
    default: snprintf(b, sizeof b, "errno %ld", -r); return b;
    }
}

/* A raw call: -errno on failure, as the kernel answers. */
static long call(long n, long a, long b, long c, long d, long e) {
    long r = syscall(n, a, b, c, d, e, 0);
    return r < 0 ? -errno : r;
}

#define THRICE(what, expr)                                                            \
    do {                                                                              \
        const char *first = NULL;                                                     \
        for (int k_ = 0; k_ < 3; k_++) {                                              \
            long r_ = (expr);                                                         \
            if (r_ >= 0 && n_closes) close((int)r_);                                  \
            const char *s_ = err(r_);                                                 \
            if (!first) first = strdup(s_);                                           \
            else if (strcmp(first, s_)) printf("%s: changed %s -> %s\n", what, first, s_); \
        }                                                                             \
        printf("%s: %s\n", what, first);                                              \
    } while (0)

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || chdir(argv[1]) != 0) return 2;
    int n_closes = 0;
    long page = sysconf(_SC_PAGESIZE);
    /* Five pages: readable, not accessible (PROT_NONE keeps others from mapping
     * there), readable, not accessible, readable. */
    char *m = mmap(NULL, 5 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + page, page, PROT_NONE) != 0 || mprotect(m + 3 * page, page, PROT_NONE) != 0)
        return 3;
    /* A name with no NUL before the first inaccessible page. */
    char *straddle = m + page - 8;
    memcpy(straddle, "abcdefgh", 8);
    /* "ictus-badptr-missing" ending exactly at the third page's end, with its NUL. */
    const char *whole = "ictus-badptr-missing";
    char *at_end = m + 3 * page - strlen(whole) - 1;
    memcpy(at_end, whole, strlen(whole) + 1);
    /* A path too long for PATH_MAX, in readable memory. */
    char *longp = m + 4 * page;
    memset(longp, 'a', page - 1);
    longp[page - 1] = 0;
    long wild = 0x10, none = (long)(m + page);
    struct { const char *name; long p; } bad[] = {
        {"null", 0}, {"wild", wild}, {"unreadable", none}, {"straddle", (long)straddle}, {"long", (long)longp},
    };
    char st[256], buf[64];
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long p = bad[i].p;
        char what[64];
#define CASE(nm, expr) do { snprintf(what, sizeof what, "%s %s", nm, bad[i].name); THRICE(what, expr); } while (0)
        n_closes = 1;
        CASE("open", call(SYS_openat, AT_FDCWD, p, O_RDONLY, 0, 0));
        CASE("open write", call(SYS_openat, AT_FDCWD, p, O_WRONLY, 0, 0));
        CASE("creat", call(SYS_openat, AT_FDCWD, p, O_WRONLY | O_CREAT | O_EXCL, 0644, 0));
        n_closes = 0;
        CASE("stat", call(SYS_newfstatat, AT_FDCWD, p, (long)st, 0, 0));
        if (p != 0) CASE("stat empty-path flag", call(SYS_newfstatat, AT_FDCWD, p, (long)st, AT_EMPTY_PATH, 0));
        CASE("lstat", call(SYS_newfstatat, AT_FDCWD, p, (long)st, AT_SYMLINK_NOFOLLOW, 0));
        CASE("statx", call(SYS_statx, AT_FDCWD, p, 0, STATX_BASIC_STATS, (long)st));
        CASE("access", call(SYS_faccessat2, AT_FDCWD, p, R_OK, 0, 0));
        CASE("access W", call(SYS_faccessat2, AT_FDCWD, p, W_OK, 0, 0));
        CASE("readlink", call(SYS_readlinkat, AT_FDCWD, p, (long)buf, sizeof buf, 0));
        CASE("mkdir", call(SYS_mkdirat, AT_FDCWD, p, 0755, 0, 0));
        CASE("unlink", call(SYS_unlinkat, AT_FDCWD, p, 0, 0, 0));
        CASE("rename to", call(SYS_renameat2, AT_FDCWD, (long)whole, AT_FDCWD, p, 0));
        CASE("rename from", call(SYS_renameat2, AT_FDCWD, p, AT_FDCWD, (long)"ictus-badptr-new", 0));
        CASE("symlink", call(SYS_symlinkat, (long)whole, AT_FDCWD, p, 0, 0));
        char *args[] = {"true", NULL};
        CASE("execve", call(SYS_execve, p, (long)args, (long)args, 0, 0));
        if (p != (long)longp) CASE("getcwd", call(SYS_getcwd, p, 64, 0, 0, 0));
    }
    /* The string that ends at its page's end is read whole: a missing name. */
    n_closes = 1;
    THRICE("open at page end", call(SYS_openat, AT_FDCWD, (long)at_end, O_RDONLY, 0, 0));
    n_closes = 0;
    THRICE("stat at page end", call(SYS_newfstatat, AT_FDCWD, (long)at_end, (long)st, 0, 0));
    THRICE("readlink at page end", call(SYS_readlinkat, AT_FDCWD, (long)at_end, (long)buf, sizeof buf, 0));
    THRICE("access at page end", call(SYS_faccessat2, AT_FDCWD, (long)at_end, F_OK, 0, 0));
    /* And a good one after all that: the library is alive and answers. */
    THRICE("stat /", call(SYS_newfstatat, AT_FDCWD, (long)"/", (long)st, 0, 0));
    return 0;
}
