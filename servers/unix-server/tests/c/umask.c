/* The modes of what a program creates follow its umask as it changes: in the
 * process, in a vfork child that shares its memory but not its umask, in a fork
 * child, in a thread (threads share the umask), after a signal handler changed it;
 * and a socket file made by bind (the kernel applies the binder's umask).
 * Prints each name with its mode; the test compares with the native run's.
 * argv[1]: an empty scratch directory. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void make(const char *name) {
    int fd = open(name, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd >= 0) close(fd);
    char d[64];
    snprintf(d, sizeof d, "%s.d", name);
    mkdir(d, 0777);
}

static void *thread(void *arg) {
    (void)arg;
    umask(077);
    make("thread");
    return NULL;
}

static void on_usr1(int sig) {
    (void)sig;
    umask(0);
}

static void show(const char *name) {
    struct stat st;
    char d[64];
    snprintf(d, sizeof d, "%s.d", name);
    printf("%s %s\n", name, stat(name, &st) == 0 ? (snprintf(d + 32, 32, "%o", st.st_mode & 07777), d + 32) : "missing");
    snprintf(d, sizeof d, "%s.d", name);
    printf("%s %s\n", d, stat(d, &st) == 0 ? (snprintf(d + 32, 32, "%o", st.st_mode & 07777), d + 32) : "missing");
}

int main(int argc, char **argv) {
    if (argc < 2 || chdir(argv[1]) != 0) return 2;
    make("start");
    umask(027);
    make("set");
    pid_t p = vfork();
    if (p == 0) {
        umask(0);
        make("vfork-child");
        _exit(0);
    }
    waitpid(p, NULL, 0);
    make("after-vfork");
    umask(0);
    umask(002);
    make("set-again");
    p = fork();
    if (p == 0) {
        make("fork-child");
        umask(070);
        make("fork-child-set");
        _exit(0);
    }
    waitpid(p, NULL, 0);
    make("after-fork");
    pthread_t t;
    pthread_create(&t, NULL, thread, NULL);
    pthread_join(t, NULL);
    make("after-thread");
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    make("after-handler");
    /* The umask of a creat through the raw call, too. */
    umask(022);
    long fd = syscall(SYS_creat, "raw", 0777);
    if (fd >= 0) close((int)fd);
    /* A socket file: the kernel applies the umask of whoever binds. */
    umask(027);
    struct sockaddr_un sun = {.sun_family = AF_UNIX, .sun_path = "sock"};
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&sun, sizeof sun) != 0) printf("bind failed\n");
    const char *names[] = {"start", "set", "vfork-child", "after-vfork", "set-again", "fork-child", "fork-child-set",
                           "after-fork", "thread", "after-thread", "after-handler", "raw", "sock"};
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) show(names[i]);
    return 0;
}
