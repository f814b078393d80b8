/* A program that makes itself non-dumpable (as key agents do), then asks for what
 * needs its descriptors lent to the server (taken with pidfd_getfd, which needs
 * ptrace access): a new thread's connection, an open relative to a directory
 * descriptor, a datagram with a descriptor to a socket of its own by path. Run under
 * a server of the same user (not root) and a view that confines paths. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

static const char *dir;

static void *thread(void *arg) {
    (void)arg;
    struct stat st;
    printf("thread stat %s\n", stat(dir, &st) == 0 ? "ok" : strerrorname_np(errno));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    dir = argv[1];
    printf("set %d\n", prctl(PR_SET_DUMPABLE, 0, 0, 0, 0));
    pthread_t t;
    pthread_create(&t, NULL, thread, NULL);
    pthread_join(t, NULL);
    int d = open(dir, O_RDONLY | O_DIRECTORY);
    int f = openat(d, "nodump.txt", O_RDWR | O_CREAT | O_TRUNC, 0600);
    printf("openat %s\n", f >= 0 ? "ok" : strerrorname_np(errno));
    int r = socket(AF_UNIX, SOCK_DGRAM, 0), s = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/nodump.sock", dir);
    unlink(a.sun_path);
    printf("bind %s\n", bind(r, (struct sockaddr *)&a, sizeof a) == 0 ? "ok" : strerrorname_np(errno));
    char ctl[CMSG_SPACE(sizeof(int))] __attribute__((aligned(8))) = {0};
    struct iovec iov = {"fd", 2};
    struct msghdr m = {.msg_name = &a, .msg_namelen = sizeof a, .msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &f, sizeof f);
    ssize_t n = sendmsg(s, &m, 0);
    printf("sendmsg %s\n", n == 2 ? "ok" : strerrorname_np(errno));
    printf("dumpable %d\n", prctl(PR_GET_DUMPABLE, 0, 0, 0, 0));
    unlink(a.sun_path);
    return 0;
}
