#include <stdio.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>
int main(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    printf("inet %s\n", s >= 0 ? "ok" : strerror(errno));
    int u = socket(AF_UNIX, SOCK_STREAM, 0);
    printf("unix %s\n", u >= 0 ? "ok" : strerror(errno));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, "\0ictus-test-abstract", 21);
    int c = connect(u, (struct sockaddr *)&a, sizeof(sa_family_t) + 21);
    printf("abstract %s\n", c == 0 ? "ok" : strerror(errno));
    /* glibc's getpid cannot fail, so it returns the raw -errno and leaves errno alone. */
    int pid = getpid();
    printf("getpid %s\n", pid > 0 ? "ok" : pid == -EACCES ? "refused with EACCES" : "refused otherwise");
    return 0;
}
