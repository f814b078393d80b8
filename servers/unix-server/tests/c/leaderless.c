// A process whose main thread has exited (pthread_exit in main) while another thread
// runs: that thread's calls that name a descriptor work as natively (the server
// takes descriptors through the calling thread, not through the exited leader).
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int dir = -1;

static void *run(void *arg) {
    (void)arg;
    // Let the main thread exit first (not needed for the answer, only for the case).
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    char buf[64] = {0};
    int f = openat(dir, "file", O_RDONLY);
    const char *why = f >= 0 ? "ok" : strerror(errno);
    int n = f >= 0 ? (int)read(f, buf, sizeof buf - 1) : -1;
    struct stat st;
    int r = fstatat(dir, "file", &st, 0);
    // Standard output: a descriptor opened by the shell (no path for the server to
    // resolve through this process's /proc entries; see doc/unix.md, Known gaps).
    printf("openat %s\nread %d %s\nfstatat %d size %lld\n", why, n, buf, r, r == 0 ? (long long)st.st_size : -1LL);
    fflush(stdout);
    exit(0);
}

int main(int argc, char **argv) {
    if (argc != 2) return 1;
    dir = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (dir < 0) return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, run, NULL) != 0) return 1;
    pthread_exit(NULL);
}
