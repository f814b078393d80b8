/* Sends with a destination or control data, as programs make them: `sends DIR` binds
 * a datagram socket at DIR/r.sock and sends to it by path with sendto, sendmsg (with
 * SCM_RIGHTS, and SCM_CREDENTIALS naming itself), sendmmsg; gathers several buffers
 * on a connected socket; and makes the mistakes the kernel answers with an errno.
 * It prints what it sent and what came: the same natively (DIR a host path) and
 * under a view where DIR is a bind mount (the server resolves it in the view).
 * `sends syslog` logs one line with syslog(3) instead. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

static void said(const char *what, long r) {
    if (r >= 0) printf("%s %ld\n", what, r);
    else printf("%s %s\n", what, strerrorname_np(errno));
}

static int receiver(const char *path) {
    int r = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    unlink(path);
    said("bind", bind(r, (struct sockaddr *)&a, sizeof a));
    int one = 1;
    setsockopt(r, SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
    return r;
}

/* Receive one datagram: its bytes, a descriptor it carried (its first line read),
 * and the uid of credentials it carried. */
static void take(int r) {
    char buf[256], ctl[256];
    struct iovec iov = {buf, sizeof buf - 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(r, &m, MSG_DONTWAIT);
    if (n < 0) { printf("got nothing (%s)\n", strerrorname_np(errno)); return; }
    buf[n] = 0;
    printf("got \"%s\"", buf);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int fd;
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
            char line[64] = {0};
            ssize_t k = pread(fd, line, sizeof line - 1, 0);
            if (k < 0) k = read(fd, line, sizeof line - 1);
            printf(" with a descriptor saying \"%.*s\"", k > 0 ? (int)k : 0, line);
            close(fd);
        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
            struct ucred u;
            memcpy(&u, CMSG_DATA(c), sizeof u);
            printf(" from uid %d", (int)u.uid);
        }
    }
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    if (strcmp(argv[1], "syslog") == 0) {
        openlog("ictus-sends", LOG_NDELAY, LOG_USER);
        syslog(LOG_INFO, "hello from syslog %d", 42);
        closelog();
        printf("logged\n");
        return 0;
    }
    char path[200];
    snprintf(path, sizeof path, "%s/r.sock", argv[1]);
    int r = receiver(path);
    struct sockaddr_un to = {.sun_family = AF_UNIX};
    snprintf(to.sun_path, sizeof to.sun_path, "%s", path);
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    said("sendto", sendto(s, "one", 3, 0, (struct sockaddr *)&to, sizeof to));
    take(r);

    /* A descriptor: a file written here, passed with its path's datagram. */
    char fpath[220];
    snprintf(fpath, sizeof fpath, "%s/passed.txt", argv[1]);
    int f = open(fpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    said("write", write(f, "through-fd", 10));
    char ctl[CMSG_SPACE(sizeof(int))] __attribute__((aligned(8))) = {0};
    struct iovec iov = {"two", 3};
    struct msghdr m = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &f, sizeof f);
    said("sendmsg with a descriptor", sendmsg(s, &m, 0));
    close(f);
    take(r);

    /* Credentials naming the sender itself. */
    char cctl[CMSG_SPACE(sizeof(struct ucred))] __attribute__((aligned(8))) = {0};
    struct ucred me = {getpid(), getuid(), getgid()};
    struct iovec iov3 = {"three", 5};
    struct msghdr m3 = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &iov3, .msg_iovlen = 1,
                        .msg_control = cctl, .msg_controllen = sizeof cctl};
    c = CMSG_FIRSTHDR(&m3);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_CREDENTIALS;
    c->cmsg_len = CMSG_LEN(sizeof me);
    memcpy(CMSG_DATA(c), &me, sizeof me);
    said("sendmsg with credentials", sendmsg(s, &m3, 0));
    take(r);

    /* Two at once, several buffers each. */
    struct iovec a4[2] = {{"fo", 2}, {"ur", 2}}, a5[1] = {{"five", 4}};
    struct mmsghdr mm[2] = {
        {.msg_hdr = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = a4, .msg_iovlen = 2}},
        {.msg_hdr = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = a5, .msg_iovlen = 1}},
    };
    said("sendmmsg", sendmmsg(s, mm, 2, 0));
    printf("lengths %u %u\n", mm[0].msg_len, mm[1].msg_len);
    take(r);
    take(r);

    /* Connected: no destination, several buffers, a flag: still one datagram. */
    said("connect", connect(s, (struct sockaddr *)&to, sizeof to));
    struct iovec g[3] = {{"si", 2}, {"", 0}, {"x", 1}};
    struct msghdr mg = {.msg_iov = g, .msg_iovlen = 3};
    said("gathered", sendmsg(s, &mg, MSG_DONTWAIT));
    said("gathered without flags", sendmsg(s, &mg, 0));
    take(r);
    take(r);

    /* Mistakes. */
    struct msghdr bad = m;
    bad.msg_control = NULL;
    bad.msg_controllen = 0;
    bad.msg_iovlen = 5000;
    said("too many buffers", sendmsg(s, &bad, 0));
    bad.msg_iovlen = 1;
    bad.msg_namelen = (socklen_t)-1;
    said("negative name length", sendmsg(s, &bad, 0));
    said("long address", sendto(s, "x", 1, 0, (struct sockaddr *)&to, 200));
    said("bad message pointer", sendmsg(s, (struct msghdr *)8, 0));
    char lie[CMSG_SPACE(sizeof(int))] __attribute__((aligned(8))) = {0};
    struct msghdr ml = m;
    ml.msg_control = lie;
    ml.msg_controllen = sizeof lie;
    c = CMSG_FIRSTHDR(&ml);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = 200; /* longer than the control data */
    said("control length past its end", sendmsg(s, &ml, 0));
    c->cmsg_len = CMSG_LEN(sizeof(int));
    int closed = 900;
    memcpy(CMSG_DATA(c), &closed, sizeof closed);
    said("a closed descriptor", sendmsg(s, &ml, 0));
    take(r);
    unlink(path);
    unlink(fpath);
    return 0;
}
