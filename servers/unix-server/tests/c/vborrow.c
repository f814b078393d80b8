/* A vfork child borrows its parent's connection to the server for a call that
 * names no descriptor. Killed while the server is still answering (an open of a
 * FIFO for writing, which waits for a reader), it leaves that answer on the
 * connection: the parent's next calls must still get their own answers.
 * Usage: vborrow DIR. Prints what it saw; the test compares with a native run. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    char fifo[4096], made[4096], dir[4096];
    snprintf(fifo, sizeof fifo, "%s/fifo", argv[1]);
    snprintf(made, sizeof made, "%s/made", argv[1]);
    snprintf(dir, sizeof dir, "%s/dir", argv[1]);
    /* A served call first: the parent has a connection of its own to lend. */
    if (mkfifo(fifo, 0600) != 0)
        return 3;
    int p[2];
    if (pipe(p) != 0)
        return 4;
    pid_t killer = fork();
    if (killer == 0) {
        pid_t victim;
        close(p[1]);
        if (read(p[0], &victim, sizeof victim) != sizeof victim)
            _exit(5);
        usleep(300000); /* the child is waiting in its open by now */
        kill(victim, SIGKILL);
        _exit(0);
    }
    pid_t child = vfork();
    if (child == 0) {
        pid_t me = getpid();
        if (write(p[1], &me, sizeof me) != sizeof me)
            _exit(6);
        open(fifo, O_WRONLY); /* waits for a reader: killed meanwhile */
        _exit(7);
    }
    close(p[0]);
    close(p[1]);
    int st = 0;
    waitpid(child, &st, 0);
    waitpid(killer, NULL, 0);
    printf("child %s\n", WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL ? "killed" : "not killed");
    /* A reader: the open the child asked for completes now, and its answer goes to
     * the connection it used. */
    int r = open(fifo, O_RDONLY | O_NONBLOCK);
    usleep(300000);
    int fd = open(made, O_WRONLY | O_CREAT | O_EXCL, 0600);
    struct stat a, b;
    int same = fd >= 0 && fstat(fd, &a) == 0 && stat(made, &b) == 0 && a.st_ino == b.st_ino && S_ISREG(a.st_mode);
    printf("create %s\n", same ? "ok" : "wrong");
    printf("mkdir %d\n", mkdir(dir, 0700));
    printf("rename %d\n", rename(made, fifo));
    if (r >= 0)
        close(r);
    return 0;
}
