/* A program that attacks the emulation library from inside: it maps its own code in
 * the library's address range and calls system calls from there with registers of
 * its choosing, overwrites the library's data, and sends garbage to the server.
 * argv[1]: a hidden path; argv[2]: the pid of the server (outside the session);
 * argv[3]: the host path of a datagram socket the view hides. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gadget.h"

int main(int argc, char **argv) {
    pid_t server = atoi(argv[2]);
    make_gadget();
    printf("open hidden from library range: %s\n", e(gadget(257, -100, (long)argv[1], O_RDONLY, 0, 0, 0)));
    char *args[] = {"true", NULL};
    printf("exec from library range: %s\n", e(gadget(322, -100, (long)"/bin/true", (long)args, (long)args, 0, 0)));
    printf("inet socket from library range: %s\n", e(gadget(41, AF_INET, SOCK_STREAM, 0, 0, 0, 0)));
    printf("signal the server from library range: %s\n", e(gadget(62, server, 0, 0, 0, 0, 0)));
    printf("ptrace the server: %s\n", e(gadget(101, 16 /* PTRACE_ATTACH */, server, 0, 0, 0, 0)));
    printf("mount: %s\n", e(gadget(165, (long)"none", (long)"/tmp", (long)"tmpfs", 0, 0, 0)));
    /* Through the server, which is not confined: another process's memory and
     * descriptors, directly and through a link of its own making. */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", server);
    printf("server memory: %s\n", e(open(path, O_RDWR) < 0 ? -errno : 0));
    snprintf(path, sizeof path, "/proc/%d/fd/0", server);
    printf("server descriptor: %s\n", e(open(path, O_RDONLY) < 0 ? -errno : 0));
    snprintf(path, sizeof path, "/proc/%d/mem", server);
    unlink("/tmp/ictus-hostile-link");
    symlink(path, "/tmp/ictus-hostile-link");
    printf("server memory by a link: %s\n", e(open("/tmp/ictus-hostile-link", O_RDWR) < 0 ? -errno : 0));
    unlink("/tmp/ictus-hostile-link");
    snprintf(path, sizeof path, "/proc/%d/status", server);
    printf("server status: %s\n", e(open(path, O_RDONLY) < 0 ? -errno : 0));
    printf("own memory: %s\n", e(open("/proc/self/mem", O_RDWR) < 0 ? -errno : 0));
    /* Datagrams to a socket the view hides, by its host path: a send with an address
     * is resolved by the kernel, so where the view confines paths the filter traps
     * every sendmsg — and ends the process that makes one from the library's code,
     * which never does — and every sendto with an address, from anywhere. */
    if (argc > 3) {
        struct sockaddr_un to = {.sun_family = AF_UNIX};
        snprintf(to.sun_path, sizeof to.sun_path, "%s", argv[3]);
        int s = socket(AF_UNIX, SOCK_DGRAM, 0);
        struct iovec iov = {"leak", 4};
        struct msghdr m = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &iov, .msg_iovlen = 1};
        fflush(stdout);
        pid_t k = fork();
        if (k == 0) {
            printf("sendmsg from library range: %s\n", e(gadget(46, s, (long)&m, 0, 0, 0, 0)));
            fflush(stdout);
            _exit(0);
        }
        int st = 0;
        waitpid(k, &st, 0);
        if (WIFSIGNALED(st)) printf("sendmsg from library range: killed by %s\n", sigabbrev_np(WTERMSIG(st)));
        k = fork();
        if (k == 0) {
            printf("sendmmsg from library range: %s\n", e(gadget(307, s, (long)&m, 1, 0, 0, 0)));
            fflush(stdout);
            _exit(0);
        }
        waitpid(k, &st, 0);
        if (WIFSIGNALED(st)) printf("sendmmsg from library range: killed by %s\n", sigabbrev_np(WTERMSIG(st)));
        printf("sendto from library range: %s\n", e(gadget(44, s, (long)"leak", 4, 0, (long)&to, sizeof to)));
        printf("sendmsg: %s\n", e(sendmsg(s, &m, 0) < 0 ? -errno : 0));
        printf("sendto: %s\n", e(sendto(s, "leak", 4, 0, (struct sockaddr *)&to, sizeof to) < 0 ? -errno : 0));
        close(s);
    }
    fflush(stdout);
    /* Garbage on its own connection (the library made connection 960 above). */
    pid_t c = fork();
    if (c == 0) {
        int fd = open("/etc/hostname", O_RDONLY); /* makes this process's connection */
        (void)fd;
        unsigned char junk[200];
        for (int i = 0; i < 50; i++) {
            for (unsigned j = 0; j < sizeof junk; j++) junk[j] = (unsigned char)(rand() >> 7);
            send(960, junk, 1 + (i * 7) % sizeof junk, MSG_DONTWAIT);
        }
        _exit(0);
    }
    waitpid(c, NULL, 0);
    /* Scribble over the library's data and bss, then make a call: it may break
     * itself (crash, hang), nothing else. */
    c = fork();
    if (c == 0) {
        alarm(3);
        FILE *m = fopen("/proc/self/maps", "r");
        char line[256];
        unsigned long lo, hi;
        char perms[8];
        while (m && fgets(line, sizeof line, m)) {
            if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo >= 0x5000000 && hi <= 0x50f0000 && perms[1] == 'w')
                memset((void *)lo, 0xff, hi - lo);
        }
        int fd = open("/etc/hostname", O_RDONLY);
        _exit(fd >= 0 ? 0 : 1);
    }
    int st;
    waitpid(c, &st, 0);
    printf("scribbler ended\n");
    return 0;
}
