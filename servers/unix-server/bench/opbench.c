/* The operations of 004 §5.3-5.4, each timed alone: `opbench DIR OP N` prints N
 * lines, the nanoseconds each repetition took. Run natively, under ictus and under
 * proot by `ictus bench unix`, which compares the distributions. getpid is timed
 * over batches of GETPID_BATCH calls (each line: the batch's time divided by it), so
 * that the clock's own cost does not swamp a call of a few nanoseconds. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static char big[1 << 20];
#define GETPID_BATCH 100

static void cwd(int kib) {
    int fd = open("cwd.tmp", O_CREAT | O_WRONLY | O_TRUNC, 0644);
    for (int i = 0; i < kib; i++) write(fd, big, 1024);
    close(fd);
    unlink("cwd.tmp");
}

int main(int argc, char **argv) {
    if (argc != 4 || chdir(argv[1]) != 0) return 2;
    const char *op = argv[2];
    int n = atoi(argv[3]);
    char buf[8192];
    char abs_path[4096];
    snprintf(abs_path, sizeof abs_path, "%s/a/b/c/d/foo", argv[1]);
    int fd = open("foo", O_RDONLY);
    long long *t = calloc(n, sizeof *t);
    for (int i = 0; i < n; i++) {
        long long s = now();
        long long per = 1;
        if (!strcmp(op, "getpid")) {
            for (int k = 0; k < GETPID_BATCH; k++) getpid();
            per = GETPID_BATCH;
        } else if (!strcmp(op, "getpid_raw")) syscall(SYS_getpid);
        else if (!strcmp(op, "lseek")) lseek(fd, 0, SEEK_SET);
        else if (!strcmp(op, "lseek_read1")) { lseek(fd, 0, SEEK_SET); read(fd, buf, 1); }
        else if (!strcmp(op, "lseek_read8k")) { lseek(fd, 0, SEEK_SET); read(fd, buf, 8192); }
        else if (!strcmp(op, "open_read_close")) { int f = open("foo", O_RDONLY); read(f, buf, 8192); close(f); }
        else if (!strcmp(op, "open_read_close_abs")) { int f = open(abs_path, O_RDONLY); read(f, buf, 8192); close(f); }
        else if (!strcmp(op, "failed_open")) { if (open("xxx", O_RDONLY) >= 0) return 3; }
        else if (!strcmp(op, "stat")) { struct stat st; stat("foo", &st); }
        else if (!strcmp(op, "fork_exit_wait")) { pid_t p = fork(); if (p == 0) _exit(0); waitpid(p, NULL, 0); }
        else if (!strcmp(op, "fork_exec_wait")) { pid_t p = fork(); if (p == 0) { execl("/bin/true", "true", NULL); _exit(1); } waitpid(p, NULL, 0); }
        else if (!strcmp(op, "cwd0")) cwd(0);
        else if (!strcmp(op, "cwd10k")) cwd(10);
        else if (!strcmp(op, "cwd100k")) cwd(100);
        else if (!strcmp(op, "write1m")) { int f = open("w.tmp", O_CREAT | O_WRONLY | O_TRUNC, 0644); write(f, big, sizeof big); close(f); }
        else if (!strcmp(op, "read_cached") || !strcmp(op, "read_uncached")) {
            int f = open("mib", O_RDONLY);
            if (op[5] == 'u') { s = now(); posix_fadvise(f, 0, 0, POSIX_FADV_DONTNEED); s = now(); }
            while (read(f, big, sizeof big) > 0) {}
            close(f);
        } else return 4;
        t[i] = (now() - s) / per;
    }
    for (int i = 0; i < n; i++) printf("%lld\n", t[i]);
    return 0;
}
