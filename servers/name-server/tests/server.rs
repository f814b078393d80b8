//! The name server in one process: a server thread, clients in other spaces.
//!
//! No test asserts a duration; waits are bounded by a generous watchdog only.

use std::path::Path;

use ictus_ipc::*;
use ictus_name_server::protocol::{self, LIST, LOOKUP, REGISTER, UNREGISTER, UNREGISTER_WITH_RIGHT};
use ictus_name_server::server;
use ictus_name_server::socket::FetchError;
use ictus_name_server::{Client, ClientError, ConnectError, ServeError};
use ictus_server::ListenError;
use ictus_testkit::{wait_until, NameServer, TempDir, WATCHDOG};

/// A client in a space of its own, its calls bounded by the watchdog.
fn connect(path: &Path) -> (Space, Client) {
    let space = Space::new();
    let client = Client::connect_socket(&space, path).expect("connect").with_timeout(WATCHDOG);
    (space, client)
}

fn rcv(space: &Space, port: Name) -> Received {
    let mut r = Received::new();
    space.receive(port, &mut r, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() }).expect("receive");
    r
}

/// Send a hand-made request and return the reply.
fn raw_call(space: &Space, server: Name, mut msg: Message) -> Received {
    let mut r = Received::new();
    let opts = ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() };
    space.call(server, &mut msg, &mut r, SendOptions { timeout: Some(WATCHDOG) }, opts).expect("the server answers");
    r
}

/// The return code of the reply to `request`: its id checked, its code known.
fn code_of(request: i32, r: &Received) -> ReturnCode {
    assert_eq!(r.id, protocol::reply_id(request), "reply id");
    let code = u32::from_le_bytes(r.data().get(..4).expect("a return code").try_into().unwrap());
    ReturnCode::from_code(code).expect("a known code")
}

fn request(id: i32, data: &[u8], ports: Vec<PortArg>) -> Message {
    Message { id, data: data.to_vec(), ports, ..Message::default() }
}

/// A name as the interface encodes a `String`: a `u32` LE length, then the bytes.
fn name_arg(name: &[u8]) -> Vec<u8> {
    [&(name.len() as u32).to_le_bytes()[..], name].concat()
}

#[test]
fn register_lookup_unregister_list() {
    let running = NameServer::start();
    let (a, ns_a) = connect(&running.socket());
    let (b, ns_b) = connect(&running.socket());
    assert_eq!(ns_a.list().unwrap(), Vec::<String>::new());

    let p = a.allocate_port().unwrap();
    ns_a.register("clock", p).unwrap();
    let q = a.allocate_port_with_send().unwrap();
    ns_a.register("métronome ♩", q).unwrap();
    assert_eq!(ns_b.list().unwrap(), ["clock", "métronome ♩"]);

    // The right B gets reaches A's port.
    let right = ns_b.lookup("clock").unwrap();
    assert_eq!(b.right_kinds(right).unwrap(), vec![RightKind::Send]);
    b.send(right, &mut Message::new(42, b"tick".to_vec()), SendOptions::default()).unwrap();
    let m = rcv(&a, p);
    assert_eq!((m.id, m.data()), (42, &b"tick"[..]));
    // Looking up again gives the same (coalesced) name.
    assert_eq!(ns_b.lookup("clock").unwrap(), right);
    assert_eq!(b.refs(right, RightKind::Send).unwrap(), 2);

    ns_a.unregister("clock").unwrap();
    assert!(matches!(ns_b.lookup("clock"), Err(ClientError::NotFound(n)) if n == "clock"));
    assert!(matches!(ns_a.unregister("clock"), Err(ClientError::NotFound(_))));
    assert_eq!(ns_b.list().unwrap(), ["métronome ♩"]);
    // A lookup does not stop the owner's unregistering.
    ns_a.unregister("métronome ♩").unwrap();
    assert_eq!(ns_a.list().unwrap(), Vec::<String>::new());
    running.stop();
}

#[test]
fn duplicate_register_is_name_exists_and_one_port_may_have_many_names() {
    let running = NameServer::start();
    let (a, ns) = connect(&running.socket());
    let p = a.allocate_port().unwrap();
    let other = a.allocate_port().unwrap();
    ns.register("x", p).unwrap();
    assert!(matches!(ns.register("x", other), Err(ClientError::NameExists(n)) if n == "x"));
    assert!(matches!(ns.register("x", p), Err(ClientError::NameExists(_))));
    // The same port under a second name: one name in the server, two references.
    ns.register("y", p).unwrap();
    let base = 3; // the server's port set, service port and notify port
    assert_eq!(running.space().names().len(), base + 1);
    ns.unregister("x").unwrap();
    let (b, ns_b) = connect(&running.socket());
    let r = ns_b.lookup("y").unwrap();
    b.send(r, &mut Message::new(7, vec![]), SendOptions::default()).unwrap();
    assert_eq!(rcv(&a, p).id, 7);
    ns.unregister("y").unwrap();
    assert_eq!(running.space().names().len(), base, "the server let go of the right");
    running.stop();
}

#[test]
fn lookup_of_a_missing_name_is_not_found() {
    let running = NameServer::start();
    let (_a, ns) = connect(&running.socket());
    assert!(matches!(ns.lookup("nobody"), Err(ClientError::NotFound(n)) if n == "nobody"));
    assert!(matches!(ns.unregister("nobody"), Err(ClientError::NotFound(_))));
    // Invalid names are refused before anything is sent.
    assert!(matches!(ns.lookup(""), Err(ClientError::InvalidName(_))));
    assert!(matches!(ns.lookup("a\nb"), Err(ClientError::InvalidName(_))));
    running.stop();
}

#[test]
fn malformed_requests_get_error_replies_and_leave_nothing_behind() {
    let running = NameServer::start();
    let (a, ns) = connect(&running.socket());
    let server = ns.server_port();
    let base = running.space().names().len();
    let p = a.allocate_port().unwrap();
    let send = |n| PortArg::new(n, Disposition::MakeSend);

    // Unknown ids, including one whose reply id wraps, and the one past the last method.
    let r = raw_call(&a, server, request(9999, b"", vec![]));
    assert_eq!((r.id, code_of(9999, &r)), (10099, ReturnCode::MigBadId));
    let r = raw_call(&a, server, request(i32::MAX, b"x", vec![send(p)]));
    assert_eq!((r.id, code_of(i32::MAX, &r)), (i32::MIN + 99, ReturnCode::MigBadId));
    let r = raw_call(&a, server, request(UNREGISTER_WITH_RIGHT + 1, &name_arg(b"x"), vec![]));
    assert_eq!(code_of(UNREGISTER_WITH_RIGHT + 1, &r), ReturnCode::MigBadId);
    // A forged dead-name notification on the service port is just an unknown id.
    // (From here on `p` is registered: every right to it that a bad request brings
    // coalesces with the registration's in the server, which must not be touched.)
    ns.register("kept", p).unwrap();
    for i in 1..8 {
        let body = NotifyId::body(Name::new(i, 1), 0).to_vec();
        let r = raw_call(&a, server, request(NotifyId::DeadName.id(), &body, vec![]));
        assert_eq!(code_of(NotifyId::DeadName.id(), &r), ReturnCode::MigBadId);
    }
    assert_eq!(ns.list().unwrap(), ["kept"]);

    // Register: wrong number or kind of rights.
    let bad = |msg: Message| code_of(msg.id, &raw_call(&a, server, msg));
    let n = name_arg(b"n");
    assert_eq!(bad(request(REGISTER, &n, vec![])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(REGISTER, &n, vec![send(p), send(p)])), ReturnCode::MigBadArguments);
    assert_eq!(
        bad(request(REGISTER, &n, vec![PortArg::new(p, Disposition::MakeSendOnce)])),
        ReturnCode::MigBadArguments
    );
    // A receive right sent to the name server is destroyed: our send right goes dead.
    let victim = a.allocate_port_with_send().unwrap();
    let (victim_send, _) = a.extract_right(&a, victim, Disposition::MakeSend).unwrap();
    assert_eq!(
        bad(request(REGISTER, &n, vec![PortArg::new(victim, Disposition::MoveReceive)])),
        ReturnCode::MigBadArguments
    );
    assert_eq!(a.right_kinds(victim_send).unwrap(), vec![RightKind::DeadName]);
    // Names: empty, too long, control characters reach the methods, which refuse them;
    // not UTF-8 does not decode.
    for name in [&b""[..], &[b'a'; 256], b"a\0b", b"a\nb", b"\x1b[31m", b"\xff\xfe"] {
        let expected =
            if std::str::from_utf8(name).is_ok() { ReturnCode::InvalidArgument } else { ReturnCode::MigBadArguments };
        let arg = name_arg(name);
        assert_eq!(bad(request(REGISTER, &arg, vec![send(p)])), expected, "{name:?}");
        assert_eq!(bad(request(LOOKUP, &arg, vec![])), expected, "{name:?}");
        assert_eq!(bad(request(UNREGISTER, &arg, vec![])), expected, "{name:?}");
        assert_eq!(bad(request(UNREGISTER_WITH_RIGHT, &arg, vec![send(p)])), expected, "{name:?}");
    }
    // The longest name is fine.
    let longest = "é".repeat(127) + "a";
    assert_eq!(longest.len(), 255);
    assert_eq!(bad(request(REGISTER, &name_arg(longest.as_bytes()), vec![send(p)])), ReturnCode::Success);
    ns.unregister(&longest).unwrap();
    // Strings that do not decode: a length past the data, bytes after the name, a bare
    // name without its length (the old encoding).
    let kept = name_arg(b"kept");
    assert_eq!(bad(request(LOOKUP, &kept[..kept.len() - 1], vec![])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(LOOKUP, &[&kept[..], b"x"].concat(), vec![])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(LOOKUP, b"kept", vec![])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(LOOKUP, &[0xff; 4], vec![])), ReturnCode::MigBadArguments);
    // Other shapes: rights where none belong, or too many; data for LIST; memory.
    assert_eq!(bad(request(LOOKUP, &kept, vec![send(p)])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(UNREGISTER, &kept, vec![send(p)])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(UNREGISTER_WITH_RIGHT, &kept, vec![])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(UNREGISTER_WITH_RIGHT, &kept, vec![send(p), send(p)])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(LIST, b"x", vec![])), ReturnCode::MigBadArguments);
    assert_eq!(bad(request(LIST, b"", vec![send(p)])), ReturnCode::MigBadArguments);
    let mut with_ool = request(REGISTER, &n, vec![send(p)]);
    with_ool.ool.push(OolBuffer::new(4096).unwrap());
    assert_eq!(bad(with_ool), ReturnCode::MigBadArguments);
    // A copy of our right to the service port itself: in the server it coalesces with
    // the service port's receive right, which must survive the refusal.
    assert_eq!(
        bad(request(LOOKUP, &kept, vec![PortArg::new(server, Disposition::CopySend)])),
        ReturnCode::MigBadArguments
    );
    assert_eq!(bad(request(9999, b"", vec![PortArg::new(server, Disposition::CopySend)])), ReturnCode::MigBadId);
    assert_eq!(ns.list().unwrap(), ["kept"]);

    // No reply right: nothing to answer, nothing kept.
    a.send(server, &mut request(9999, b"", vec![send(p)]), SendOptions::default()).unwrap();
    a.send(server, &mut request(LOOKUP, &kept, vec![send(p)]), SendOptions::default()).unwrap();
    // A send (not send-once) reply right is answered and then released.
    let reply_port = a.allocate_port().unwrap();
    let mut m = request(LIST, b"", vec![]);
    m.reply = Some(PortArg::new(reply_port, Disposition::MakeSend));
    a.send(server, &mut m, SendOptions::default()).unwrap();
    let r = rcv(&a, reply_port);
    assert_eq!(code_of(LIST, &r), ReturnCode::Success);

    // Still serving, and holding nothing but the one registration.
    assert_eq!(ns.list().unwrap(), ["kept"]);
    assert_eq!(running.space().names().len(), base + 1);
    assert_eq!(running.space().refs(running.service_port(), RightKind::Send).unwrap(), 0);
    ns.unregister("kept").unwrap();
    assert_eq!(running.space().names().len(), base);
    running.stop();
}

#[test]
fn registration_vanishes_when_its_port_dies() {
    let running = NameServer::start();
    let (a, ns) = connect(&running.socket());
    let base = running.space().names().len();
    let p = a.allocate_port().unwrap();
    let q = a.allocate_port().unwrap();
    ns.register("victim", p).unwrap();
    ns.register("victim-too", p).unwrap();
    ns.register("survivor", q).unwrap();
    assert_eq!(running.space().names().len(), base + 2);
    a.mod_refs(p, RightKind::Receive, -1).unwrap();
    // The dead-name notification alone cleans up: wait without asking anything.
    wait_until("the server to drop the dead right", || running.space().names().len() == base + 1);
    assert_eq!(ns.list().unwrap(), ["survivor"]);
    assert!(matches!(ns.lookup("victim"), Err(ClientError::NotFound(_))));
    // The name is free again.
    let p2 = a.allocate_port().unwrap();
    ns.register("victim", p2).unwrap();
    running.stop();
}

#[test]
fn lookup_of_a_just_died_port_is_not_found() {
    // Whatever the order of the notification and the lookup, no dead right comes back.
    let running = NameServer::start();
    let (a, ns) = connect(&running.socket());
    for i in 0..20 {
        let p = a.allocate_port().unwrap();
        let name = format!("short-lived-{i}");
        ns.register(&name, p).unwrap();
        a.mod_refs(p, RightKind::Receive, -1).unwrap();
        assert!(matches!(ns.lookup(&name), Err(ClientError::NotFound(_))));
    }
    assert_eq!(ns.list().unwrap(), Vec::<String>::new());
    wait_until("every dead name to be destroyed", || running.space().names().len() == 3);
    running.stop();
}

#[test]
fn unregister_releases_the_servers_send_right() {
    let running = NameServer::start();
    let (a, ns) = connect(&running.socket());
    let p = a.allocate_port().unwrap();
    let q = a.allocate_port().unwrap();
    ns.register("watched", p).unwrap();
    // The server holds the only send right; after unregister nobody does.
    a.request_notification(p, NotifyKind::NoSenders, Some(PortArg::new(q, Disposition::MakeSendOnce))).unwrap();
    ns.unregister("watched").unwrap();
    let m = rcv(&a, q);
    assert_eq!(m.id, NotifyId::NoSenders.id());
    assert_eq!(NotifyId::parse_body(m.data()).unwrap().0, p);
    running.stop();
}

#[test]
fn unregister_with_the_right_from_another_space() {
    let running = NameServer::start();
    let (a, ns_a) = connect(&running.socket());
    let (b, ns_b) = connect(&running.socket());
    let p = a.allocate_port().unwrap();
    ns_a.register("shared", p).unwrap();
    let r = ns_b.lookup("shared").unwrap();
    let unrelated = b.allocate_port().unwrap();
    // (Same process, so the pid would do too; the cross-process case is in cli/tests/names.rs.)
    ns_b.unregister_with_right("shared", r).unwrap();
    assert!(matches!(ns_b.unregister_with_right("shared", unrelated), Err(ClientError::NotFound(_))));
    assert_eq!(ns_a.list().unwrap(), Vec::<String>::new());
    running.stop();
}

#[test]
fn many_clients_at_once() {
    let running = NameServer::start();
    let path = running.socket();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let (s, ns) = connect(&path);
                let p = s.allocate_port().unwrap();
                for i in 0..25 {
                    ns.register(&format!("t{t}-{i:02}"), p).unwrap();
                }
                for i in 0..25 {
                    let r = ns.lookup(&format!("t{t}-{i:02}")).unwrap();
                    s.deallocate(r).unwrap();
                }
                (s, p)
            })
        })
        .collect();
    let keep: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let (_s, ns) = connect(&path);
    let names = ns.list().unwrap();
    assert_eq!(names.len(), 100);
    assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted");
    drop(keep);
    running.stop();
}

#[test]
fn a_dead_server_is_an_error_not_a_hang() {
    let running = NameServer::start();
    let (a, ns) = connect(&running.socket());
    let p = a.allocate_port().unwrap();
    ns.register("x", p).unwrap();
    running.stop();
    // Default timeout is long; the answer must not depend on it.
    assert!(matches!(ns.list(), Err(ClientError::ServerDied)), "{:?}", ns.list());
    assert!(matches!(ns.lookup("x"), Err(ClientError::ServerDied)));
    // And the socket went with it.
    assert!(!running.socket().exists());
    let err = Client::connect_socket(&Space::new(), &running.socket()).unwrap_err();
    assert!(matches!(err, ConnectError::Socket(FetchError::NotRunning(_))), "{err}");
    assert!(err.to_string().contains("no name server is running"), "{err}");
}

#[test]
fn one_server_per_path_and_stale_paths_are_reclaimed() {
    let dir = TempDir::new("ns");
    let path = dir.join("ns.sock");
    let lock = dir.join("ns.sock.lock");
    let first = server::spawn(Space::new(), Some(&path)).unwrap();
    assert!(lock.exists());
    let second = server::spawn(Space::new(), Some(&path));
    assert!(matches!(second, Err(ServeError::Listen(ListenError::AlreadyRunning(_)))), "{second:?}");
    // The refused server removed nothing.
    connect(&path);
    first.stop().unwrap();
    assert!(!path.exists() && !lock.exists(), "a clean stop removes the socket and the lock");

    // A socket nobody listens on, as `kill -9` leaves it (and its lock file).
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    std::fs::write(&lock, b"").unwrap();
    assert!(path.exists());
    let running = server::spawn(Space::new(), Some(&path)).expect("the stale socket is reclaimed");
    let (_a, ns) = connect(&path);
    assert_eq!(ns.list().unwrap(), Vec::<String>::new());
    running.stop().unwrap();

    // Something that is not a socket is never removed.
    std::fs::write(&path, b"precious").unwrap();
    let refused = server::spawn(Space::new(), Some(&path));
    assert!(matches!(refused, Err(ServeError::Listen(ListenError::NotASocket(_)))), "{refused:?}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[test]
fn a_client_with_the_right_needs_no_socket() {
    let running = server::spawn(Space::new(), None).unwrap();
    let a = Space::new();
    let right = a.insert_send_fd(running.service_fd().unwrap()).unwrap();
    let ns = Client::from_right(&a, right).with_timeout(WATCHDOG);
    let p = a.allocate_port().unwrap();
    ns.register("direct", p).unwrap();
    assert_eq!(ns.list().unwrap(), ["direct"]);
    running.stop().unwrap();
}

#[test]
fn the_generated_stubs_carry_typed_errors() {
    use ictus_idl::{ClientError as Stub, SendRight};
    use ictus_name_server::protocol::NamesError;
    let running = NameServer::start();
    let (a, ns) = connect(&running.socket());
    let base = running.space().names().len();
    let stubs = ns.stubs();
    let p = a.allocate_port().unwrap();
    // Names are checked by the server's methods too, not only by `Client`.
    for name in ["", "a\nb"] {
        assert!(matches!(stubs.register(name, SendRight::make(p)), Err(Stub::Remote(NamesError::BadName))));
        assert!(matches!(stubs.lookup(name), Err(Stub::Remote(NamesError::BadName))));
    }
    assert!(matches!(stubs.lookup("nobody"), Err(Stub::Remote(NamesError::NotFound))));
    stubs.register("x", SendRight::make(p)).unwrap();
    assert!(matches!(stubs.register("x", SendRight::make(p)), Err(Stub::Remote(NamesError::NameExists))));
    assert_eq!(stubs.list().unwrap(), ["x"]);
    let r = stubs.lookup("x").unwrap();
    // Our own port: the right comes back under the receive right's name.
    assert_eq!((r.name, a.right_kinds(p).unwrap()), (p, vec![RightKind::Receive, RightKind::Send]));
    assert!(matches!(stubs.unregister_with_right("nobody", r), Err(Stub::Remote(NamesError::NotFound))));
    stubs.unregister_with_right("x", r).unwrap();
    // Refused registrations and spent proofs left nothing in the server.
    assert_eq!(running.space().names().len(), base);
    running.stop();
}

const ROLE: ictus_testkit::Role = ictus_testkit::Role { env: "ICTUS_NAME_SERVER_TEST_ROLE" };
const SOCKET_ENV: &str = "ICTUS_NAME_SERVER_TEST_SOCKET";

/// Roles of the re-executed test binary; does nothing in a normal test run.
#[test]
fn child_role() {
    let Some(role) = ROLE.current() else { return };
    let socket = std::path::PathBuf::from(std::env::var_os(SOCKET_ENV).expect("socket"));
    let space = Space::task();
    let ns = Client::connect_socket(&space, &socket).unwrap().with_timeout(WATCHDOG);
    match role.as_str() {
        // Another task: its own quota.
        "register-one" => {
            let p = space.allocate_port().unwrap();
            match ns.register("from-another-task", p) {
                Ok(()) => println!("ROLE: REGISTERED"),
                Err(e) => println!("ROLE: {e}"),
            }
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn one_task_may_hold_only_its_quota_of_names() {
    use ictus_name_server::protocol::{NamesError, MAX_NAMES_PER_CLIENT};
    let running = NameServer::start();
    let (a, ns) = connect(&running.socket());
    let p = a.allocate_port().unwrap();
    for i in 0..MAX_NAMES_PER_CLIENT {
        ns.register(&format!("n{i}"), p).unwrap();
    }
    // Every space of this process is one task to the server (one kernel-verified pid).
    let (b, ns_b) = connect(&running.socket());
    let q = b.allocate_port().unwrap();
    let err = ns_b.register("one-too-many", q).unwrap_err();
    assert!(matches!(err, ClientError::QuotaExceeded), "{err:?}");
    assert!(err.to_string().contains("quota per task") && err.to_string().contains("256"), "{err}");
    // The stubs carry the typed error, with its own code.
    let stubs = ns.stubs();
    let r = stubs.register("one-too-many", ictus_idl::SendRight::make(p));
    assert!(matches!(r, Err(ictus_idl::ClientError::Remote(NamesError::QuotaExceeded))), "{r:?}");
    assert_eq!(NamesError::QuotaExceeded.return_code(), ReturnCode::QuotaExceeded);
    // Another task is not held back by ours.
    let mut child = ictus_testkit::Proc::spawn(
        "a child task",
        ROLE.command("child_role", "register-one")
            .env(SOCKET_ENV, running.socket())
            .stdout(std::process::Stdio::piped()),
    );
    let rx = child.tagged_lines("ROLE: ");
    ictus_testkit::expect_line(&rx, "REGISTERED");
    child.wait_success();
    // The child's name went with it (its port died), and its count with it.
    wait_until("the child's name to vanish", || !running.has("from-another-task"));
    // One of ours gone, one more allowed.
    ns.unregister("n0").unwrap();
    ns_b.register("one-too-many", q).unwrap();
    assert_eq!(ns.list().unwrap().len(), MAX_NAMES_PER_CLIENT);
    running.stop();
}

#[test]
fn a_server_that_replaces_a_crashed_one_holds_lookups_until_the_name_is_back() {
    let dir = TempDir::new("ns");
    let path = dir.join("ns.sock");
    // A socket nobody listens on, as `kill -9` leaves it.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let running = server::spawn(Space::new(), Some(&path)).expect("the stale socket is reclaimed");
    // A look-up of a name not yet registered again waits for it.
    let waiting = {
        let path = path.clone();
        std::thread::spawn(move || {
            let (space, ns) = connect(&path);
            let right = ns.lookup("clock");
            right.map(|r| space.right_kinds(r).unwrap())
        })
    };
    let (a, ns) = connect(&path);
    // Let the look-up arrive first (it is answered either way; this only makes it the
    // held case most of the time).
    std::thread::sleep(std::time::Duration::from_millis(50));
    let p = a.allocate_port().unwrap();
    ns.register("clock", p).unwrap();
    assert_eq!(waiting.join().unwrap().unwrap(), vec![RightKind::Send]);
    // A name nobody registers is not found once the window closes, not never.
    assert!(matches!(ns.lookup("nobody"), Err(ClientError::NotFound(_))));
    // Names that are registered are answered at once, as ever.
    assert_eq!(ns.lookup("clock").unwrap(), p);
    running.stop().unwrap();
}
