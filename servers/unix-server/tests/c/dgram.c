/* AF_UNIX datagram sockets under a policy: `dgram PATH` makes a datagram socket (and
 * a datagram socket pair, and a SOCK_RAW one, which AF_UNIX makes a datagram socket)
 * and sends "hello" to the socket bound at PATH. Under a view that confines paths the
 * send is served: PATH is resolved in the view, not in the host's tree. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

static const char *said(int r) { return r >= 0 ? "ok" : strerror(errno); }

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int sv[2];
    printf("socketpair %s\n", said(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv)));
    printf("raw %s\n", said(socket(AF_UNIX, SOCK_RAW, 0)));
    printf("stream %s\n", said(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0)));
    int s = socket(AF_UNIX, SOCK_DGRAM, 0);
    printf("socket %s\n", said(s));
    if (s >= 0) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", argv[1]);
        printf("sendto %s\n", said(sendto(s, "hello", 5, 0, (struct sockaddr *)&a, sizeof a)));
    }
    return 0;
}
