#include <stdio.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
int main(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    printf("inet %s\n", s >= 0 ? "ok" : strerror(errno));
    int u = socket(AF_UNIX, SOCK_STREAM, 0);
    printf("unix %s\n", u >= 0 ? "ok" : strerror(errno));
    printf("getpid %s\n", getpid() > 0 ? "ok" : strerror(errno));
    return 0;
}
