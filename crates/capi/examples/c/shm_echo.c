/*
 * An echo over a shared-memory channel between two processes.
 *
 * The parent runs a channel server (ictus_shm_server_new) and hands a send right to its
 * service port to a child it starts (a descriptor inherited across exec). The child
 * connects (ictus_shm_client_connect: two rings and a wake-up word in shared memory),
 * sends ROUNDS records and checks that each comes back upper-cased; then it closes the
 * channel, and the server sees it closed. The server waits in its own descriptor's
 * readiness (poll), as an event loop would, after announcing the wait with
 * ictus_shm_server_arm.
 *
 *   cc shm_echo.c $(pkg-config --cflags --libs ictus) -o shm_echo && ./shm_echo
 */
#include <ctype.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

enum { ECHO = 1, ROUNDS = 1000 };

static int child(int fd) {
    ictus_space *space;
    CHECK(ictus_space_task(&space));
    ictus_name service;
    CHECK(ictus_port_insert_send_fd(space, fd, &service)); /* the descriptor is consumed */

    ictus_shm_client *client;
    CHECK(ictus_shm_client_connect(space, service, NULL, &client));
    for (uint32_t i = 0; i < ROUNDS; i++) {
        char line[32], want[32];
        int m = snprintf(line, sizeof line, "echo %u", i);
        snprintf(want, sizeof want, "ECHO %u", i);
        CHECK(ictus_shm_client_send(client, ECHO, (const uint8_t *)line, (size_t)m, SECONDS(10)));
        uint8_t buf[32];
        uint32_t tag;
        size_t len;
        CHECK(ictus_shm_client_recv(client, SECONDS(10), &tag, buf, sizeof buf, &len));
        if (tag != ECHO || len != (size_t)m || memcmp(buf, want, len) != 0) {
            fprintf(stderr, "shm_echo: round %u: a wrong reply\n", i);
            return 1;
        }
    }
    ictus_shm_client_free(client);
    CHECK(ictus_port_deallocate(space, service));
    ictus_space_free(space);
    return 0;
}

/* Wait on the server's descriptor as an event loop would: announce the wait first. */
static void wait_readable(ictus_shm_server *server) {
    int armed = ictus_shm_server_arm(server);
    if (armed < 0) {
        fprintf(stderr, "shm_echo: no server\n");
        exit(1);
    }
    if (armed == 0)
        return; /* something is already waiting */
    struct pollfd p = {.fd = ictus_shm_server_fd(server), .events = POLLIN};
    if (poll(&p, 1, 30000) != 1) {
        fprintf(stderr, "shm_echo: nothing came within 30 s\n");
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "child") == 0)
        return child(atoi(argv[2]));

    ictus_space *space;
    CHECK(ictus_space_task(&space));
    ictus_shm_server *server;
    CHECK(ictus_shm_server_new(space, &server));
    int fd;
    CHECK(ictus_port_send_right_fd(space, ictus_shm_server_service(server), &fd));

    pid_t pid = spawn_child_with_fd(argv[0], fd);
    if (pid < 0) {
        perror("fork");
        return 1;
    }

    uint32_t echoed = 0, opened_pid = 0;
    int closed = 0;
    uint8_t buf[64];
    while (!closed) {
        wait_readable(server);
        for (;;) {
            ictus_shm_event ev;
            CHECK(ictus_shm_server_next(server, &ev, buf, sizeof buf));
            if (ev.kind == ICTUS_SHM_NONE)
                break;
            if (ev.kind == ICTUS_SHM_OPENED) {
                opened_pid = ev.pid;
            } else if (ev.kind == ICTUS_SHM_RECORD) {
                for (size_t i = 0; i < ev.len; i++)
                    buf[i] = (uint8_t)toupper(buf[i]);
                CHECK(ictus_shm_server_send(server, ev.client, ev.tag, buf, ev.len));
                echoed++;
            } else if (ev.kind == ICTUS_SHM_CLOSED) {
                closed = 1;
            }
        }
    }

    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "shm_echo: the child failed (status %d)\n", status);
        return 1;
    }
    if (opened_pid != (uint32_t)pid) {
        fprintf(stderr, "shm_echo: the channel was opened by pid %u, not the child %d\n", opened_pid, (int)pid);
        return 1;
    }
    printf("shm_echo: %u records echoed over a shared-memory channel with pid %u, which closed it\n", echoed,
           opened_pid);

    ictus_shm_server_free(server);
    ictus_space_free(space);
    return 0;
}
