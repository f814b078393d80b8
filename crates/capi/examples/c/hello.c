#include <stdio.h>
#include <string.h>
#include <ictus.h>

int main(void) {
    ictus_space *space = NULL;
    ictus_message *msg = NULL;
    ictus_received *got = NULL;
    ictus_name port;
    const char *text = "hello from C";
    size_t len = 0;
    int status = 1;
    if (ictus_space_task(&space) != ICTUS_OK || ictus_port_allocate_with_send(space, &port) != ICTUS_OK ||
        ictus_message_new(7, (const uint8_t *)text, strlen(text), &msg) != ICTUS_OK ||
        ictus_send(space, port, msg, -1) != ICTUS_OK || ictus_received_new(&got) != ICTUS_OK ||
        ictus_receive(space, port, got, 1000000000) != ICTUS_OK) {
        fprintf(stderr, "hello: %s\n", ictus_last_error());
        goto out;
    }
    const uint8_t *data = ictus_received_data(got, &len);
    printf("received id %d: %.*s\n", ictus_received_id(got), (int)len, (const char *)data);
    status = 0;
out:
    ictus_received_free(got);
    ictus_message_free(msg);
    ictus_space_free(space);
    return status;
}
