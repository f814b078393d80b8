// The same port ping-pong from C++: RAII owners over the C handles, and the two
// processes of c/pingpong.c (the child is this program again).
//
//   c++ -std=c++17 pingpong.cpp $(pkg-config --cflags --libs ictus) -o pingpong_cpp
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include <ictus.h>

namespace {

// An ictus error as a C++ exception, with the library's own words.
struct Error : std::runtime_error {
    explicit Error(const std::string &what) : std::runtime_error(what) {}
};

void check(ictus_error e, const char *what) {
    if (e != ICTUS_OK)
        throw Error(std::string(what) + ": " + ictus_strerror(e) + ": " + ictus_last_error());
}

// Owning handles: each frees its C handle once, with the matching function.
struct SpaceFree { void operator()(ictus_space *s) const { ictus_space_free(s); } };
struct MessageFree { void operator()(ictus_message *m) const { ictus_message_free(m); } };
struct ReceivedFree { void operator()(ictus_received *r) const { ictus_received_free(r); } };
using Space = std::unique_ptr<ictus_space, SpaceFree>;
using Message = std::unique_ptr<ictus_message, MessageFree>;
using Received = std::unique_ptr<ictus_received, ReceivedFree>;

Space task_space() {
    ictus_space *s = nullptr;
    check(ictus_space_task(&s), "ictus_space_task");
    return Space(s);
}
Message message(int32_t id) {
    ictus_message *m = nullptr;
    check(ictus_message_new(id, nullptr, 0, &m), "ictus_message_new");
    return Message(m);
}
Received received() {
    ictus_received *r = nullptr;
    check(ictus_received_new(&r), "ictus_received_new");
    return Received(r);
}
std::string data(const Received &r) {
    size_t len = 0;
    const uint8_t *p = ictus_received_data(r.get(), &len);
    return std::string(reinterpret_cast<const char *>(p), len);
}

constexpr int32_t HELLO = 1, PING = 2, STOP = 3;
constexpr int ROUNDS = 1000;
constexpr int64_t SECONDS = 1000000000LL;

int child(int fd) {
    Space space = task_space();
    ictus_name parent, service;
    check(ictus_port_insert_send_fd(space.get(), fd, &parent), "insert the parent's right");
    check(ictus_port_allocate(space.get(), &service), "allocate the service port");
    Message msg = message(HELLO);
    check(ictus_message_add_right(msg.get(), service, ICTUS_MAKE_SEND), "add the right");
    check(ictus_send(space.get(), parent, msg.get(), 10 * SECONDS), "send hello");
    check(ictus_port_deallocate(space.get(), parent), "deallocate");
    Received req = received();
    for (;;) {
        check(ictus_receive(space.get(), service, req.get(), 30 * SECONDS), "receive");
        if (ictus_received_id(req.get()) == STOP)
            break;
        ictus_name to;
        ictus_right_kind kind;
        check(ictus_received_take_reply(req.get(), &to, &kind), "take the reply right");
        std::string pong = "pong " + data(req);
        check(ictus_message_set(msg.get(), PING + 100, reinterpret_cast<const uint8_t *>(pong.data()), pong.size()),
              "set");
        check(ictus_send(space.get(), to, msg.get(), 10 * SECONDS), "reply");
    }
    check(ictus_port_destroy(space.get(), service), "destroy");
    return 0;
}

int parent(const char *self) {
    Space space = task_space();
    ictus_name setup;
    check(ictus_port_allocate(space.get(), &setup), "allocate");
    int fd = -1;
    check(ictus_port_send_right_fd(space.get(), setup, &fd), "send right descriptor");
    std::string arg = std::to_string(fd);
    pid_t pid = fork();
    if (pid == 0) {
        fcntl(fd, F_SETFD, 0);
        execl("/proc/self/exe", self, "child", arg.c_str(), static_cast<char *>(nullptr));
        _exit(127);
    }
    close(fd);
    if (pid < 0)
        throw Error("fork failed");
    Received reply = received();
    check(ictus_receive(space.get(), setup, reply.get(), 30 * SECONDS), "receive hello");
    ictus_name server;
    ictus_right_kind kind;
    check(ictus_received_right(reply.get(), 0, &server, &kind), "the child's right");
    Message req = message(PING);
    for (int i = 0; i < ROUNDS; i++) {
        std::string n = std::to_string(i);
        check(ictus_message_set(req.get(), PING, reinterpret_cast<const uint8_t *>(n.data()), n.size()), "set");
        check(ictus_call(space.get(), server, req.get(), reply.get(), 30 * SECONDS), "call");
        if (data(reply) != "pong " + n)
            throw Error("round " + n + ": got \"" + data(reply) + "\"");
    }
    check(ictus_message_set(req.get(), STOP, nullptr, 0), "set");
    check(ictus_send(space.get(), server, req.get(), 10 * SECONDS), "stop");
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw Error("the child failed");
    check(ictus_port_deallocate(space.get(), server), "deallocate");
    check(ictus_port_destroy(space.get(), setup), "destroy");
    std::cout << "pingpong (C++): " << ROUNDS << " round trips, the child exited cleanly\n";
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        if (argc == 3 && std::strcmp(argv[1], "child") == 0)
            return child(std::atoi(argv[2]));
        return parent(argv[0]);
    } catch (const std::exception &e) {
        std::cerr << "pingpong: " << e.what() << "\n";
        return 1;
    }
}
