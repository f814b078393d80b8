/*
 * Port ping-pong between two processes.
 *
 * The parent makes a port and hands a send right to it to a child it starts (a
 * descriptor inherited across exec). The child makes its own service port and sends
 * the parent a send right to it in a message; then the parent calls the child ROUNDS
 * times (ictus_call: a request, and a reply through a reply right the call supplies)
 * and the child answers each with "pong" and the request's number.
 *
 *   cc pingpong.c $(pkg-config --cflags --libs ictus) -o pingpong && ./pingpong
 */
#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

enum { HELLO = 1, PING = 2, STOP = 3, ROUNDS = 1000 };

static int child(int fd) {
    ictus_space *space;
    CHECK(ictus_space_task(&space));
    ictus_name parent, service;
    CHECK(ictus_port_insert_send_fd(space, fd, &parent)); /* the descriptor is consumed */
    CHECK(ictus_port_allocate(space, &service));

    /* Hello: a send right to our service port, made from its receive right. */
    ictus_message *msg;
    CHECK(ictus_message_new(HELLO, NULL, 0, &msg));
    CHECK(ictus_message_add_right(msg, service, ICTUS_MAKE_SEND));
    CHECK(ictus_send(space, parent, msg, SECONDS(10)));
    CHECK(ictus_port_deallocate(space, parent));

    ictus_received *req;
    CHECK(ictus_received_new(&req));
    for (;;) {
        CHECK(ictus_receive(space, service, req, SECONDS(30)));
        if (ictus_received_id(req) == STOP)
            break;
        ictus_name reply_to;
        ictus_right_kind kind;
        CHECK(ictus_received_take_reply(req, &reply_to, &kind));
        size_t len;
        const uint8_t *data = ictus_received_data(req, &len);
        uint32_t n = 0;
        if (len == sizeof n)
            memcpy(&n, data, sizeof n);
        char pong[32];
        int m = snprintf(pong, sizeof pong, "pong %u", n);
        CHECK(ictus_message_set(msg, PING + 100, (const uint8_t *)pong, (size_t)m));
        /* A send-once reply right is used up by the reply. */
        CHECK(ictus_send(space, reply_to, msg, SECONDS(10)));
        if (kind != ICTUS_RIGHT_SEND_ONCE)
            CHECK(ictus_port_deallocate(space, reply_to));
    }
    ictus_received_free(req);
    ictus_message_free(msg);
    CHECK(ictus_port_destroy(space, service));
    ictus_space_free(space);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "child") == 0)
        return child(atoi(argv[2]));

    ictus_space *space;
    CHECK(ictus_space_task(&space));
    ictus_name setup;
    CHECK(ictus_port_allocate(space, &setup));
    int fd;
    CHECK(ictus_port_send_right_fd(space, setup, &fd));

    pid_t pid = spawn_child_with_fd(argv[0], fd);
    if (pid < 0) {
        perror("fork");
        return 1;
    }

    ictus_received *reply;
    CHECK(ictus_received_new(&reply));
    CHECK(ictus_receive(space, setup, reply, SECONDS(30)));
    ictus_name server;
    ictus_right_kind kind;
    if (ictus_received_id(reply) != HELLO || ictus_received_right_count(reply) != 1) {
        fprintf(stderr, "pingpong: the child's hello is not what was expected\n");
        return 1;
    }
    CHECK(ictus_received_right(reply, 0, &server, &kind));
    ictus_credentials who;
    CHECK(ictus_received_sender(reply, &who));

    ictus_message *req;
    CHECK(ictus_message_new(PING, NULL, 0, &req));
    for (uint32_t i = 0; i < ROUNDS; i++) {
        CHECK(ictus_message_set(req, PING, (const uint8_t *)&i, sizeof i));
        CHECK(ictus_call(space, server, req, reply, SECONDS(30)));
        char want[32];
        int m = snprintf(want, sizeof want, "pong %u", i);
        size_t len;
        const uint8_t *got = ictus_received_data(reply, &len);
        if (ictus_received_id(reply) != PING + 100 || len != (size_t)m || memcmp(got, want, len) != 0) {
            fprintf(stderr, "pingpong: round %u: a wrong reply\n", i);
            return 1;
        }
    }
    CHECK(ictus_message_set(req, STOP, NULL, 0));
    CHECK(ictus_send(space, server, req, SECONDS(10)));

    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "pingpong: the child failed (status %d)\n", status);
        return 1;
    }
    printf("pingpong: %d round trips with pid %u (uid %u), which exited cleanly\n", ROUNDS, who.pid, who.uid);

    ictus_message_free(req);
    ictus_received_free(reply);
    CHECK(ictus_port_deallocate(space, server));
    CHECK(ictus_port_destroy(space, setup));
    ictus_space_free(space);
    return 0;
}
