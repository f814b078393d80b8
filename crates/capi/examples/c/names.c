/*
 * The name server from C: register a port under a name, look the name up, send a
 * message through the right the look-up gave, receive it, list the names, unregister.
 *
 *   ictus name-server &
 *   cc names.c $(pkg-config --cflags --libs ictus) -o names && ./names [SOCKET]
 */
#include <string.h>

#include "check.h"

int main(int argc, char **argv) {
    const char *socket = argc > 1 ? argv[1] : NULL; /* NULL: the default socket */
    ictus_space *space;
    CHECK(ictus_space_task(&space));
    ictus_name_client *names;
    CHECK(ictus_name_client_connect(space, socket, &names));

    ictus_name port;
    CHECK(ictus_port_allocate(space, &port));
    CHECK(ictus_name_register(names, "c-example", port));

    ictus_name found;
    CHECK(ictus_name_lookup(names, "c-example", &found));
    ictus_message *msg;
    CHECK(ictus_message_new(42, (const uint8_t *)"found you", 9, &msg));
    CHECK(ictus_send(space, found, msg, SECONDS(10)));

    ictus_received *got;
    CHECK(ictus_received_new(&got));
    CHECK(ictus_receive(space, port, got, SECONDS(10)));
    size_t len;
    const uint8_t *data = ictus_received_data(got, &len);
    printf("received id %d: %.*s\n", ictus_received_id(got), (int)len, (const char *)data);

    /* A name nobody registered is ICTUS_ERR_NOT_FOUND, with the server's words. */
    ictus_name none;
    ictus_error e = ictus_name_lookup(names, "no-such-name", &none);
    printf("looking up no-such-name: %s (%s)\n", ictus_strerror(e), ictus_last_error());
    if (e != ICTUS_ERR_NOT_FOUND)
        return 1;

    char list[4096];
    size_t n;
    CHECK(ictus_name_list(names, list, sizeof list, &n));
    printf("registered:\n%s", list);

    CHECK(ictus_name_unregister(names, "c-example"));
    ictus_received_free(got);
    ictus_message_free(msg);
    CHECK(ictus_port_deallocate(space, found));
    CHECK(ictus_port_destroy(space, port));
    ictus_name_client_free(names);
    ictus_space_free(space);
    return 0;
}
