//! Ports between processes and threads: messages cross intact, and nothing leaks,
//! whoever dies.
//!
//! Children are this test binary run again with `--exact child_…` and
//! `ICTUS_TEST_ROLE` set; without that variable the `child_…` functions return at once
//! (they pass as no-ops in the normal run). A child gets its first right as its
//! bootstrap port and dies with its parent (`PR_SET_PDEATHSIG`).
//!
//! Every wait is bounded by a watchdog and waits for an event; no test asserts a
//! duration. Tests in this binary run one at a time (`common::serial`) because they
//! count the whole process's descriptors and mappings.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use ictus_ipc::*;
use ictus_testkit::{gettid, wait_all_asleep, wait_thread_asleep};
use rustix::event::{epoll, Timespec};

// Message ids of the parent–child protocols.
const HELLO: i32 = 1000;
const DONE: i32 = 1001;
const READY: i32 = 1002;
const FULL: i32 = 1003;
const GIFTS: i32 = 1004;
const GOT_REQUEST: i32 = 1005;
const GO: i32 = 1006;
const FINISH: i32 = 1007;
const PING: i32 = 1008;
const CHATTER: i32 = 1009;
const REQUEST: i32 = 1010;
const MOVED: i32 = 1011;
const ONE_WAY: i32 = 1012;
const ON_ONCE: i32 = 1013;
const LAST_CALL: i32 = 1014;

const OOL_LEN: usize = 2 << 20;
const BIG_LEN: usize = 5 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

fn ool_of(len: usize, seed: u8) -> OolBuffer {
    OolBuffer::from_slice(&pattern(len, seed)).expect("out-of-line buffer")
}

fn me() -> Credentials {
    Credentials {
        pid: std::process::id(),
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
    }
}

fn send(s: &Space, dest: Name, mut m: Message) {
    if let Err(e) = s.send(dest, &mut m, SendOptions::default()) {
        panic!("send {} to {dest}: {e}", m.id);
    }
}

fn with_ports(id: i32, data: &[u8], ports: &[(Name, Disposition)]) -> Message {
    let mut m = Message::new(id, data.to_vec());
    m.ports = ports.iter().map(|&(n, d)| PortArg::new(n, d)).collect();
    m
}

/// In a child: the bootstrap right, and a port of our own whose send right went to
/// the parent in a `HELLO`.
fn child_hello(s: &Space) -> (Name, Name) {
    let boot = s.take_bootstrap().expect("take_bootstrap").expect("a bootstrap right");
    let mine = s.allocate_port().expect("allocate");
    send(s, boot, with_ports(HELLO, &[], &[(mine, Disposition::MakeSend)]));
    (boot, mine)
}

/// In the parent: the child's `HELLO`, checked, and the send right it carries.
#[track_caller]
fn parent_hello(s: &Space, boot: Name, child: &ChildGuard) -> Name {
    let hello = recv(s, boot);
    assert_eq!(hello.id, HELLO);
    assert_eq!(hello.sender, Credentials { pid: child.pid(), ..me() }, "the kernel's word on the sender");
    assert_eq!(hello.ports.len(), 1);
    assert_eq!(hello.ports[0].kind, RightKind::Send);
    hello.ports[0].name
}

// ----- 1. a round trip across processes ---------------------------------------------------

/// In-line, out-of-line and big in-line data, and send, send-once and receive rights
/// (with messages queued on the receive right) cross to a child intact; the child
/// answers through each right, and each side sees the other's pid, uid and gid as the
/// kernel verified them. Afterwards the parent holds exactly what it held before.
#[test]
fn round_trip_across_processes() {
    let _serial = serial();
    let traces = fs_traces();
    let base = Resources::settled();
    {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let mut cmd = child_command("child_round_trip", "round-trip");
        s.give_bootstrap(&mut cmd, boot).unwrap();
        let child = ChildGuard::spawn(cmd, "round-trip");
        let c = parent_hello(&s, boot, &child);

        send(&s, c, Message::new(1, b"in-line, across processes".to_vec()));

        let mut m = Message::new(2, Vec::new());
        m.ool.push(ool_of(OOL_LEN, 0x5a));
        send(&s, c, m);
        assert_eq!(memfd_mappings(), base.memfd_maps, "the sender's mapping leaves with the buffer");

        send(&s, c, Message::new(3, pattern(BIG_LEN, 3)));

        let x = s.allocate_port().unwrap();
        let y = s.allocate_port().unwrap();
        let z = s.allocate_port_with_send().unwrap();
        for i in 0..3u8 {
            send(&s, z, Message::new(40 + i32::from(i), vec![i; 100]));
        }
        send(
            &s,
            c,
            with_ports(
                4,
                b"rights",
                &[(x, Disposition::MakeSend), (y, Disposition::MakeSendOnce), (z, Disposition::MoveReceive)],
            ),
        );
        assert_eq!(s.right_kinds(z).unwrap(), vec![RightKind::Send], "the receive right left");
        // Sent after the move: it queues behind the others, for the new holder.
        send(&s, z, Message::new(43, vec![3; 100]));

        let child_creds = Credentials { pid: child.pid(), ..me() };
        let on_x = recv(&s, x);
        assert_eq!((on_x.id, on_x.data(), on_x.sender), (10, &b"through the send right"[..], child_creds));
        let on_y = recv(&s, y);
        assert_eq!((on_y.id, on_y.data(), on_y.sender), (11, &b"through the send-once right"[..], child_creds));
        let done = recv(&s, boot);
        assert_eq!((done.id, done.sender), (DONE, child_creds));
        assert_eq!(done.ool.len(), 1);
        assert_eq!(&done.ool[0][..], &pattern(64 << 10, 0x77)[..], "out-of-line data from the child");
        assert_eq!(memfd_mappings(), base.memfd_maps + 1, "the region we hold is mapped once");
        drop(done);
        assert_eq!(memfd_mappings(), base.memfd_maps, "and unmapped when dropped");
        child.expect_success();

        for n in [boot, x, y] {
            s.destroy(n).unwrap();
        }
        // The child has exited: its port and the moved one are dead names now.
        for n in [c, z] {
            assert_eq!(s.right_kinds(n).unwrap(), vec![RightKind::DeadName]);
            s.deallocate(n).unwrap();
        }
        assert_eq!(s.stats().names, 0);
    }
    assert_back_to(&base, "round trip");
    assert_no_new_traces(&traces, "no socket or shared-memory file appeared");
}

#[test]
fn child_round_trip() {
    if !child_role("round-trip") {
        return;
    }
    let s = Space::task();
    let (boot, c) = child_hello(&s);
    let parent = Credentials { pid: parent_pid(), ..me() };

    let m = recv(&s, c);
    assert_eq!((m.id, m.data(), m.sender, m.seqno), (1, &b"in-line, across processes"[..], parent, 0));

    let m = recv(&s, c);
    assert_eq!((m.id, m.sender, m.data().len(), m.ool.len()), (2, parent, 0, 1));
    assert_eq!(m.ool[0].len(), OOL_LEN);
    assert!(m.ool[0][..] == pattern(OOL_LEN, 0x5a)[..], "out-of-line content");
    assert!(memfd_mappings() >= 1, "the region is mapped here");
    drop(m);

    let m = recv(&s, c);
    assert_eq!((m.id, m.sender), (3, parent));
    assert!(m.data() == &pattern(BIG_LEN, 3)[..], "big in-line content");

    let m = recv(&s, c);
    assert_eq!((m.id, m.data(), m.sender), (4, &b"rights"[..], parent));
    let kinds: Vec<RightKind> = m.ports.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![RightKind::Send, RightKind::SendOnce, RightKind::Receive]);
    let (x, y, z) = (m.ports[0].name, m.ports[1].name, m.ports[2].name);

    // The receive right brought its queue, in order, with its sequence numbers.
    for i in 0..4u8 {
        let q = recv(&s, z);
        assert_eq!((q.id, q.seqno, q.sender), (40 + i32::from(i), u64::from(i), parent));
        assert_eq!(q.data(), &[i; 100][..]);
        assert_eq!(q.port, z);
    }

    send(&s, x, Message::new(10, b"through the send right".to_vec()));
    send(&s, y, Message::new(11, b"through the send-once right".to_vec()));
    assert!(s.right_kinds(y).is_err(), "the send-once right was used up");

    let mut done = Message::new(DONE, Vec::new());
    done.ool.push(ool_of(64 << 10, 0x77));
    send(&s, boot, done);
}

// ----- 2. kill -9, and nothing leaks ------------------------------------------------------

/// A child holding (a) the only send right to a port with a no-senders request armed,
/// (b) receive rights whose send rights the parent holds with dead-name requests armed
/// (its own port, and one moved to it with a message queued), (c) an out-of-line
/// region, and that is (d) blocked in a receive in one thread and in a send to a full
/// queue in another, is killed with SIGKILL.
///
/// The parent gets exactly the three notifications (from itself), the names become dead
/// names that refuse sends, and once everything is released the parent holds exactly
/// the descriptors and mappings it held before, and no file appeared anywhere.
#[test]
fn kill9_notifies_and_leaks_nothing() {
    let _serial = serial();
    let traces = fs_traces();
    let base = Resources::settled();
    {
        let s = Space::new();
        let notify = s.allocate_port().unwrap();
        let boot = s.allocate_port().unwrap();
        let full = s.allocate_port().unwrap();
        s.set_qlimit(full, 1).unwrap();
        let q = s.allocate_port_with_send().unwrap();

        let mut cmd = child_command("child_victim", "victim");
        s.give_bootstrap(&mut cmd, boot).unwrap();
        let child = ChildGuard::spawn(cmd, "victim");
        let pid = child.pid();

        // (a) From here on the child's is the only send right to `boot`.
        s.request_notification(boot, NotifyKind::NoSenders, Some(PortArg::new(notify, Disposition::MakeSendOnce)))
            .unwrap();
        assert!(!s.port_status(boot).unwrap().has_send_source);
        assert_empty(&s, notify);

        let c = parent_hello(&s, boot, &child);
        // (b) Its own port, and `q` once moved.
        s.request_notification(c, NotifyKind::DeadName, Some(PortArg::new(notify, Disposition::MakeSendOnce))).unwrap();
        send(&s, q, Message::new(50, b"queued before the move".to_vec()));
        let mut gifts = with_ports(GIFTS, &[], &[(q, Disposition::MoveReceive), (full, Disposition::MakeSend)]);
        // (c)
        gifts.ool.push(ool_of(1 << 20, 9));
        send(&s, c, gifts);
        s.request_notification(q, NotifyKind::DeadName, Some(PortArg::new(notify, Disposition::MakeSendOnce))).unwrap();

        // (d) The child says when it holds everything and its queue-filling thread
        // found `full` full; then it blocks in both threads.
        let mut said: Vec<i32> = (0..2).map(|_| recv(&s, boot).id).collect();
        said.sort_unstable();
        assert_eq!(said, vec![READY, FULL]);
        assert!(maps_of(&pid.to_string()) >= 1, "the child maps the region it received");
        if !wait_all_asleep(pid) {
            eprintln!("note: the victim's threads were not all seen asleep; killing it anyway");
        }
        assert_empty(&s, notify);
        child.kill9();

        // Three notifications, sent by this task from the kernel's hang-ups.
        let mut seen = BTreeMap::new();
        for _ in 0..3 {
            let n = recv(&s, notify);
            assert_eq!(n.sender.pid, std::process::id(), "a notification comes from the task that asked");
            assert_eq!(n.port, notify);
            assert!(n.ports.is_empty() && n.ool.is_empty() && n.reply.is_none());
            let (name, count) = NotifyId::parse_body(n.data()).expect("notification body");
            assert!(seen.insert((n.id, name), count).is_none(), "duplicate notification {n:?}");
        }
        let expected = BTreeMap::from([
            ((NotifyId::DeadName.id(), c), 0),
            ((NotifyId::DeadName.id(), q), 0),
            // The make-send count: one send right was made, the bootstrap.
            ((NotifyId::NoSenders.id(), boot), 1),
        ]);
        assert_eq!(seen, expected);
        assert_empty(&s, notify);

        for n in [c, q] {
            let err = s.send(n, &mut Message::new(1, vec![]), SendOptions::NONBLOCKING).unwrap_err();
            assert!(matches!(err, SendError::InvalidDest(d) if d == n), "{err}");
            assert_eq!(s.right_kinds(n).unwrap(), vec![RightKind::DeadName]);
            // Its own reference and the notification's, as in Mach.
            assert_eq!(s.refs(n, RightKind::DeadName).unwrap(), 2);
            s.mod_refs(n, RightKind::DeadName, -2).unwrap();
            assert!(s.right_kinds(n).is_err());
        }

        // What the dead child had queued on `full` is still there, and is its.
        let mut fillers = 0;
        loop {
            let mut r = Received::new();
            match s.receive(full, &mut r, within(Duration::ZERO)) {
                Ok(()) => {
                    assert_eq!((r.id, r.sender.pid), (60, pid));
                    fillers += 1;
                }
                Err(ReceiveError::TimedOut) => break,
                Err(e) => panic!("draining the full queue: {e}"),
            }
        }
        assert!(fillers >= 1);
        // `boot` has no senders left: nothing can arrive on it.
        assert_empty(&s, boot);

        for n in [notify, boot, full] {
            s.destroy(n).unwrap();
        }
        assert_eq!(s.stats().names, 0);
    }
    assert_back_to(&base, "kill -9");
    assert_no_new_traces(&traces, "no socket or shared-memory file appeared");
}

#[test]
fn child_victim() {
    if !child_role("victim") {
        return;
    }
    let s = Space::task();
    let (boot, c) = child_hello(&s);
    let gifts = recv(&s, c);
    assert_eq!(gifts.id, GIFTS);
    let kinds: Vec<RightKind> = gifts.ports.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![RightKind::Receive, RightKind::Send]);
    assert!(gifts.ool[0][..] == pattern(1 << 20, 9)[..]);
    let (q, full) = (gifts.ports[0].name, gifts.ports[1].name);
    assert_eq!(recv(&s, q).id, 50);

    let filler = {
        let s = s.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            loop {
                match s.send(full, &mut Message::new(60, vec![0; 64]), SendOptions::NONBLOCKING) {
                    Ok(()) => n += 1,
                    Err(SendError::TimedOut) => break,
                    Err(e) => panic!("filling: {e}"),
                }
                assert!(n < 100_000, "the queue limit does not hold");
            }
            send(&s, boot, Message::new(FULL, n.to_le_bytes().to_vec()));
            // Blocks: the queue is full and the parent does not drain it.
            let r = s.send(full, &mut Message::new(60, vec![0; 64]), SendOptions::default());
            panic!("the victim was to die blocked in a send, got {r:?}");
        })
    };
    send(&s, boot, Message::new(READY, Vec::new()));
    let mut r = Received::new();
    let res = s.receive(c, &mut r, ReceiveOptions::default());
    drop((gifts, filler));
    panic!("the victim was to die blocked in a receive, got {res:?}");
}

/// Kill -9 at several points of a stream of messages that each carry a send right, a
/// send-once right and an out-of-line region: whatever was in flight is delivered or
/// destroyed, the rights become dead names with exact reference counts, and once
/// released the parent holds exactly what it held before.
#[test]
fn kill9_mid_stream_leaks_nothing() {
    let _serial = serial();
    let traces = fs_traces();
    let base = Resources::settled();
    for kill_after in [0usize, 1, 5, 40] {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let mut cmd = child_command("child_chatter", "chatter");
        s.give_bootstrap(&mut cmd, boot).unwrap();
        let child = ChildGuard::spawn(cmd, "chatter");
        let pid = child.pid();
        let mut held = Vec::new();
        for _ in 0..kill_after {
            held.push(recv(&s, boot));
        }
        child.kill9();
        // Drain what was queued when it died.
        loop {
            let mut r = Received::new();
            match s.receive(boot, &mut r, within(Duration::ZERO)) {
                Ok(()) => held.push(r),
                Err(ReceiveError::TimedOut) => break,
                Err(e) => panic!("draining: {e}"),
            }
        }
        assert!(held.len() >= kill_after);
        let mut send_names = BTreeSet::new();
        for (i, m) in held.iter().enumerate() {
            assert_eq!((m.id, m.sender.pid, m.data()), (CHATTER, pid, &(i as u64).to_le_bytes()[..]));
            assert_eq!(m.ool.len(), 1);
            assert!(m.ool[0][..] == pattern(8192, i as u8)[..]);
            assert_eq!(m.ports.len(), 2);
            send_names.insert(m.ports[0].name);
            // The send-once right's port died with the child.
            assert_eq!(s.right_kinds(m.ports[1].name).unwrap(), vec![RightKind::DeadName]);
            s.deallocate(m.ports[1].name).unwrap();
        }
        // Every send right named the child's one port: one name, one reference each.
        assert!(send_names.len() <= 1);
        if let Some(&n) = send_names.first() {
            assert_eq!(s.right_kinds(n).unwrap(), vec![RightKind::DeadName]);
            assert_eq!(s.refs(n, RightKind::DeadName).unwrap() as usize, held.len());
            s.mod_refs(n, RightKind::DeadName, -(held.len() as i32)).unwrap();
        }
        drop(held);
        s.destroy(boot).unwrap();
        assert_eq!(s.stats().names, 0, "kill after {kill_after}: names left {:?}", s.names());
        drop(s);
        assert_back_to(&base, &format!("kill -9 after {kill_after} messages"));
    }
    assert_no_new_traces(&traces, "no socket or shared-memory file appeared");
}

#[test]
fn child_chatter() {
    if !child_role("chatter") {
        return;
    }
    let s = Space::task();
    let boot = s.take_bootstrap().unwrap().expect("bootstrap");
    let mine = s.allocate_port().unwrap();
    for i in 0u64.. {
        let mut m =
            with_ports(CHATTER, &i.to_le_bytes(), &[(mine, Disposition::MakeSend), (mine, Disposition::MakeSendOnce)]);
        m.ool.push(ool_of(8192, i as u8));
        send(&s, boot, m);
    }
}

// ----- 3. a server killed mid-call -----------------------------------------------------------

/// A call across processes is answered (with the server's credentials), a second call
/// (on the channel the first one left) reaches the server too, and kill -9 of the
/// server while it holds that request makes the client's `call` end with
/// `CallError::ServerDied` instead of hanging. Afterwards nothing of the call is left.
#[test]
fn call_to_server_killed_holding_the_request_is_server_died() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let mut cmd = child_command("child_server", "server");
        s.give_bootstrap(&mut cmd, boot).unwrap();
        let child = ChildGuard::spawn(cmd, "server");
        let c = parent_hello(&s, boot, &child);
        let mut reply = Received::new();
        s.call(c, &mut Message::new(REQUEST, b"first".to_vec()), &mut reply, SendOptions::default(), within(WATCHDOG))
            .expect("first call");
        assert_eq!((reply.id, reply.data()), (REQUEST + 1, &b"first"[..]));
        assert_eq!(reply.sender, Credentials { pid: child.pid(), ..me() });
        let (tx, rx) = mpsc::channel();
        let caller = {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut reply = Received::new();
                let r = s.call(
                    c,
                    &mut Message::new(REQUEST, b"please".to_vec()),
                    &mut reply,
                    SendOptions::default(),
                    within(WATCHDOG * 2),
                );
                tx.send(r).unwrap();
            })
        };
        // The server has the request (and its reply right) when it says so.
        assert_eq!(recv(&s, boot).id, GOT_REQUEST);
        child.kill9();
        let r = rx.recv_timeout(WATCHDOG * 3).expect("call hung after the server died");
        assert!(matches!(r, Err(CallError::ServerDied)), "{r:?}");
        caller.join().unwrap();
        s.destroy(boot).unwrap();
        s.deallocate(c).unwrap();
    }
    assert_back_to(&base, "call to killed server");
}

#[test]
fn child_server() {
    if !child_role("server") {
        return;
    }
    let s = Space::task();
    let (boot, c) = child_hello(&s);
    let first = recv(&s, c);
    assert_eq!((first.id, first.data()), (REQUEST, &b"first"[..]));
    let reply = first.reply.expect("a reply right");
    send(&s, reply.name, Message::new(REQUEST + 1, first.data().to_vec()));
    let req = recv(&s, c);
    assert_eq!((req.id, req.data()), (REQUEST, &b"please"[..]));
    assert_eq!(req.reply.map(|r| r.kind), Some(RightKind::SendOnce));
    send(&s, boot, Message::new(GOT_REQUEST, Vec::new()));
    let mut r = Received::new();
    let res = s.receive(c, &mut r, ReceiveOptions::default());
    panic!("the server was to die holding the request, got {res:?}");
}

/// A receive right moved to another task while a call to it is queued: the call's
/// channel moves with it (its key found again from the kernel: the creator's pid and the
/// inode of the caller's end), the new holder's reply reaches the caller, and a later
/// call on the same channel reaches the new holder. A one-way message sent before a
/// call is received before it (they travel on the same connection).
#[test]
fn a_receive_right_moved_with_a_call_in_flight_answers_it() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let mut cmd = child_command("child_mover", "mover");
        s.give_bootstrap(&mut cmd, boot).unwrap();
        let child = ChildGuard::spawn(cmd, "mover");
        let c = parent_hello(&s, boot, &child);
        let mut reply = Received::new();
        s.call(c, &mut Message::new(REQUEST, b"first".to_vec()), &mut reply, SendOptions::default(), within(WATCHDOG))
            .expect("first call");
        assert_eq!((reply.id, reply.data()), (REQUEST + 1, &b"first"[..]));
        let ready = recv(&s, boot);
        assert_eq!((ready.id, ready.ports.len()), (READY, 1));
        let ctl = ready.ports[0].name;
        send(&s, c, Message::new(PING, b"one-way".to_vec()));
        let (tid_tx, tid_rx) = mpsc::channel();
        let (tx, rx) = mpsc::channel();
        let caller = {
            let s = s.clone();
            std::thread::spawn(move || {
                tid_tx.send(gettid()).unwrap();
                let mut reply = Received::new();
                let r = s.call(
                    c,
                    &mut Message::new(REQUEST, b"in flight".to_vec()),
                    &mut reply,
                    SendOptions::default(),
                    within(WATCHDOG * 2),
                );
                tx.send(r.map(|()| (reply.id, reply.data().to_vec(), reply.sender))).unwrap();
            })
        };
        // Once the caller sleeps, its request is queued behind the one-way message; then
        // the child moves the receive right here.
        assert!(wait_thread_asleep(tid_rx.recv_timeout(WATCHDOG).unwrap()), "the caller never blocked");
        send(&s, ctl, Message::new(GO, Vec::new()));
        let moved = recv(&s, boot);
        assert_eq!(moved.id, MOVED);
        assert_eq!(moved.ports.len(), 1);
        assert_eq!(moved.ports[0], ReceivedRight { name: c, kind: RightKind::Receive }, "merged with our send right");
        let one_way = recv(&s, c);
        assert_eq!((one_way.id, one_way.data(), one_way.reply), (PING, &b"one-way"[..], None));
        let req = recv(&s, c);
        assert_eq!(req.data(), b"in flight");
        let r = req.reply.expect("the queued call's reply right came with the receive right");
        send(&s, r.name, Message::new(REQUEST + 1, b"answered by the new holder".to_vec()));
        let got = rx.recv_timeout(WATCHDOG * 3).expect("the call in flight hung").expect("the call in flight");
        assert_eq!(got, (REQUEST + 1, b"answered by the new holder".to_vec(), me()));
        caller.join().unwrap();
        // The channel is still kept: a third call travels on it, to us now.
        let server = {
            let s = s.clone();
            std::thread::spawn(move || {
                let req = recv(&s, c);
                send(&s, req.reply.expect("reply right").name, Message::new(REQUEST + 1, req.data().to_vec()));
            })
        };
        s.call(c, &mut Message::new(REQUEST, b"third".to_vec()), &mut reply, SendOptions::default(), within(WATCHDOG))
            .expect("third call");
        assert_eq!(reply.data(), b"third");
        server.join().unwrap();
        child.expect_success();
        s.destroy(c).unwrap();
        s.destroy(boot).unwrap();
        s.deallocate(ctl).unwrap();
    }
    assert_back_to(&base, "receive right moved with a call in flight");
}

#[test]
fn child_mover() {
    if !child_role("mover") {
        return;
    }
    let s = Space::task();
    let (boot, c) = child_hello(&s);
    let first = recv(&s, c);
    send(&s, first.reply.expect("a reply right").name, Message::new(REQUEST + 1, first.data().to_vec()));
    // Told when the one-way message and the second call are both queued, unread.
    let ctl = s.allocate_port().unwrap();
    send(&s, boot, with_ports(READY, &[], &[(ctl, Disposition::MakeSend)]));
    assert_eq!(recv(&s, ctl).id, GO);
    send(&s, boot, with_ports(MOVED, &[], &[(c, Disposition::MoveReceive)]));
}

/// Kill -9 of a server that never dequeued the request: the request (and the reply
/// right in it) dies with the server's queue, and `call` ends with `ServerDied`.
#[test]
fn call_to_server_killed_with_request_queued_is_server_died() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let mut cmd = child_command("child_deaf_server", "deaf-server");
        s.give_bootstrap(&mut cmd, boot).unwrap();
        let child = ChildGuard::spawn(cmd, "deaf-server");
        let c = parent_hello(&s, boot, &child);
        let (tid_tx, tid_rx) = mpsc::channel();
        let (tx, rx) = mpsc::channel();
        let caller = {
            let s = s.clone();
            std::thread::spawn(move || {
                tid_tx.send(gettid()).unwrap();
                let mut reply = Received::new();
                let r = s.call(
                    c,
                    &mut Message::new(REQUEST, b"anyone?".to_vec()),
                    &mut reply,
                    SendOptions::default(),
                    within(WATCHDOG * 2),
                );
                tx.send(r).unwrap();
            })
        };
        // Once the caller sleeps, its request is queued (a send to a queue with room
        // never sleeps) and it waits for the reply.
        let tid = tid_rx.recv_timeout(WATCHDOG).unwrap();
        assert!(wait_thread_asleep(tid), "the caller never blocked");
        child.kill9();
        let r = rx.recv_timeout(WATCHDOG * 3).expect("call hung after the server died");
        assert!(matches!(r, Err(CallError::ServerDied)), "{r:?}");
        caller.join().unwrap();
        s.destroy(boot).unwrap();
        s.deallocate(c).unwrap();
    }
    assert_back_to(&base, "call to killed deaf server");
}

#[test]
fn child_deaf_server() {
    if !child_role("deaf-server") {
        return;
    }
    let s = Space::task();
    let (_boot, _c) = child_hello(&s);
    let elsewhere = s.allocate_port().unwrap();
    let mut r = Received::new();
    let res = s.receive(elsewhere, &mut r, ReceiveOptions::default());
    panic!("the server was to die without reading, got {res:?}");
}

/// Threads of the dying caller, each with a call channel of its own.
const CALLERS: u32 = 4;

/// Wait, without a measured duration, until `cond` holds (the watchdog).
#[track_caller]
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + WATCHDOG;
    while !cond() {
        assert!(std::time::Instant::now() < until, "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Start the dying caller on `boot`, answer each of its threads' first call (so the
/// port keeps a call channel per thread), wait until its last calls, a one-way message
/// and a send-once message are all queued and unread, `kill -9` it, and wait until the
/// port has seen every channel hang up. Returns the dead caller's pid and the name
/// of the send right its hello gave (see [`parent_hello`]).
fn queue_requests_then_kill_the_caller(s: &Space, boot: Name) -> (u32, Name) {
    let mut cmd = child_command("child_dying_caller", "dying-caller");
    s.give_bootstrap(&mut cmd, boot).unwrap();
    let child = ChildGuard::spawn(cmd, "dying-caller");
    let pid = child.pid();
    let c = parent_hello(s, boot, &child);
    send(s, c, with_ports(GIFTS, &[], &[(boot, Disposition::MakeSendOnce)]));
    let queued = |n: u32| move || s.port_status(boot).unwrap().msgcount == n;
    // Each caller's first call offers a channel of its own (all are queued before any
    // is answered, so none finds another's in the pool): answered, the port keeps them.
    eventually("the first calls queued", queued(CALLERS));
    for _ in 0..CALLERS {
        let req = recv(s, boot);
        assert_eq!((req.id, req.sender.pid), (REQUEST, pid));
        send(s, req.reply.expect("a reply right").name, Message::new(REQUEST + 1, Vec::new()));
    }
    // Then each calls again on its kept channel, and the child sends one message on
    // its send right and one on the send-once right: all queued, none read.
    eventually("the last sends queued", queued(CALLERS + 2));
    assert!(wait_all_asleep(pid), "the child's threads never all blocked");
    assert_eq!(s.port_status(boot).unwrap().channels, CALLERS);
    child.kill9();
    // The port sees every channel hang up, and keeps each while its request waits.
    eventually("the hang-ups seen", || s.port_status(boot).unwrap().hung_up_channels == CALLERS);
    (pid, c)
}

/// A client killed (`kill -9`) right after several sends — calls on its kept call
/// channels, a one-way message, a message on a send-once right — loses none of them, as
/// Mach delivers a message queued before its sender died: the server receives each one
/// with the dead client's credentials, a reply to a call fails cleanly (`InvalidDest`,
/// leaving a dead name), and then the port keeps no channel of the client's, nothing is
/// refused as malformed, and the server holds exactly what it held before.
#[test]
fn requests_of_a_client_killed_after_sending_are_delivered() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let (pid, c) = queue_requests_then_kill_the_caller(&s, boot);
        let mut calls = BTreeSet::new();
        let mut others = BTreeSet::new();
        for _ in 0..CALLERS + 2 {
            let m = recv(&s, boot);
            assert_eq!(m.sender, Credentials { pid, ..me() }, "the kernel's word on the sender");
            match m.id {
                LAST_CALL => {
                    let reply = m.reply.expect("a reply right");
                    assert_eq!(reply.kind, RightKind::SendOnce);
                    let err = s.send(reply.name, &mut Message::new(LAST_CALL + 1, vec![]), SendOptions::NONBLOCKING);
                    assert!(matches!(err, Err(SendError::InvalidDest(n)) if n == reply.name), "{err:?}");
                    assert_eq!(s.right_kinds(reply.name).unwrap(), vec![RightKind::DeadName]);
                    s.mod_refs(reply.name, RightKind::DeadName, -1).unwrap();
                    assert!(calls.insert(m.data().to_vec()), "a call delivered twice");
                }
                ONE_WAY | ON_ONCE => {
                    assert!(m.reply.is_none());
                    assert!(others.insert(m.id));
                }
                other => panic!("unexpected message {other}"),
            }
        }
        assert_eq!(calls.len() as u32, CALLERS);
        assert_eq!(others, BTreeSet::from([ONE_WAY, ON_ONCE]));
        let st = s.port_status(boot).unwrap();
        assert_eq!(
            (st.channels, st.hung_up_channels, st.msgcount, st.sorights, st.connections),
            (0, 0, 0, 0, 1),
            "{st:?}"
        );
        assert_eq!(s.stats().malformed, 0);
        assert_empty(&s, boot);
        s.destroy(boot).unwrap();
        s.deallocate(c).unwrap();
        assert_eq!(s.stats().names, 0);
    }
    assert_back_to(&base, "a client killed after sending");
}

#[test]
fn child_dying_caller() {
    if !child_role("dying-caller") {
        return;
    }
    let s = Space::task();
    let (boot, mine) = child_hello(&s);
    let gifts = recv(&s, mine);
    assert_eq!(gifts.id, GIFTS);
    assert_eq!(gifts.ports[0].kind, RightKind::SendOnce);
    let once = gifts.ports[0].name;
    let all_pooled = std::sync::Arc::new(std::sync::Barrier::new(CALLERS as usize + 1));
    let callers: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (s, all_pooled) = (s.clone(), all_pooled.clone());
            std::thread::spawn(move || {
                let mut r = Received::new();
                s.call(boot, &mut Message::new(REQUEST, vec![]), &mut r, SendOptions::default(), within(WATCHDOG))
                    .expect("first call");
                all_pooled.wait();
                let res = s.call(
                    boot,
                    &mut Message::new(LAST_CALL, i.to_le_bytes().to_vec()),
                    &mut r,
                    SendOptions::default(),
                    ReceiveOptions::default(),
                );
                panic!("the caller was to die waiting for its reply, got {res:?}");
            })
        })
        .collect();
    all_pooled.wait();
    send(&s, boot, Message::new(ONE_WAY, Vec::new()));
    send(&s, once, Message::new(ON_ONCE, Vec::new()));
    let mut r = Received::new();
    let res = s.receive(mine, &mut r, ReceiveOptions::default());
    drop(callers);
    panic!("the child was to die blocked in a receive, got {res:?}");
}

/// The same dying caller, but its requests are received by another task: once the
/// caller is killed (`kill -9`) with its requests queued and the port has seen its call
/// channels hang up, the receive right moves to a second child. Mach moves the queued
/// messages with the port, so the new holder receives every one of them with the dead
/// caller's credentials; a reply fails cleanly (`InvalidDest`, a dead name), nothing is
/// refused as malformed, and afterwards the new holder keeps no channel and holds the
/// descriptors and mappings it held before the right came; the old holder too.
#[test]
fn requests_of_a_killed_caller_move_with_the_receive_right() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let (pid, c) = queue_requests_then_kill_the_caller(&s, boot);

        let boot2 = s.allocate_port().unwrap();
        let mut cmd = child_command("child_new_holder", "new-holder");
        s.give_bootstrap(&mut cmd, boot2).unwrap();
        let holder = ChildGuard::spawn(cmd, "new-holder");
        let h = parent_hello(&s, boot2, &holder);
        send(&s, h, with_ports(MOVED, &pid.to_le_bytes(), &[(boot, Disposition::MoveReceive)]));
        holder.expect_success();
        assert!(s.right_kinds(boot).is_err(), "the receive right left, and no other right to it was held");
        s.deallocate(c).unwrap();
        s.deallocate(h).unwrap();
        s.destroy(boot2).unwrap();
        assert_eq!(s.stats().names, 0);
    }
    assert_back_to(&base, "requests of a killed caller moved with the receive right");
}

#[test]
fn child_new_holder() {
    if !child_role("new-holder") {
        return;
    }
    let s = Space::task();
    let (_boot, mine) = child_hello(&s);
    let base = Resources::settled();
    let moved = recv(&s, mine);
    assert_eq!((moved.id, moved.ports.len()), (MOVED, 1));
    assert_eq!(moved.ports[0].kind, RightKind::Receive);
    let pid = u32::from_le_bytes(moved.data().try_into().expect("the dead caller's pid"));
    let port = moved.ports[0].name;
    let st = s.port_status(port).unwrap();
    // The dead caller's hung-up channels came along, kept as one: they all lead nowhere.
    assert_eq!((st.msgcount, st.channels, st.hung_up_channels), (CALLERS + 2, 1, 1), "{st:?}");
    let mut calls = BTreeSet::new();
    let mut others = BTreeSet::new();
    for _ in 0..CALLERS + 2 {
        let m = recv(&s, port);
        assert_eq!(m.sender.pid, pid, "the kernel's word on the sender");
        match m.id {
            LAST_CALL => {
                let reply = m.reply.expect("a reply right");
                assert_eq!(reply.kind, RightKind::SendOnce);
                let err = s.send(reply.name, &mut Message::new(LAST_CALL + 1, vec![]), SendOptions::NONBLOCKING);
                assert!(matches!(err, Err(SendError::InvalidDest(n)) if n == reply.name), "{err:?}");
                assert_eq!(s.right_kinds(reply.name).unwrap(), vec![RightKind::DeadName]);
                s.mod_refs(reply.name, RightKind::DeadName, -1).unwrap();
                assert!(calls.insert(m.data().to_vec()), "a call delivered twice");
            }
            ONE_WAY | ON_ONCE => {
                assert!(m.reply.is_none());
                assert!(others.insert(m.id));
            }
            other => panic!("unexpected message {other}"),
        }
    }
    assert_eq!(calls.len() as u32, CALLERS);
    assert_eq!(others, BTreeSet::from([ONE_WAY, ON_ONCE]));
    let st = s.port_status(port).unwrap();
    assert_eq!((st.channels, st.hung_up_channels, st.msgcount, st.sorights, st.connections), (0, 0, 0, 0, 1), "{st:?}");
    assert_eq!(s.stats().malformed, 0);
    assert_empty(&s, port);
    s.destroy(port).unwrap();
    assert_back_to(&base, "the new holder, once the moved port is gone");
}

// ----- 4. threads ---------------------------------------------------------------------------

const SENDERS: u32 = 4;
const PER_SENDER: u32 = 300;

fn spawn_senders(senders: Vec<(Space, Name)>) -> Vec<std::thread::JoinHandle<()>> {
    senders
        .into_iter()
        .enumerate()
        .map(|(k, (s, dest))| {
            std::thread::spawn(move || {
                for seq in 0..PER_SENDER {
                    let mut data = (k as u32).to_le_bytes().to_vec();
                    data.extend_from_slice(&seq.to_le_bytes());
                    send(&s, dest, Message::new(1, data));
                }
            })
        })
        .collect()
}

fn sender_and_seq(r: &Received) -> (u32, u32) {
    let d = r.data();
    assert_eq!(d.len(), 8, "{r:?}");
    (u32::from_le_bytes(d[..4].try_into().unwrap()), u32::from_le_bytes(d[4..].try_into().unwrap()))
}

/// Several threads send to one port at once (through one space, and through send
/// rights in spaces of their own), and one or several threads receive: every message
/// arrives exactly once, with a distinct sequence number, and each sender's messages
/// arrive in the order sent.
#[test]
fn threads_send_and_receive_concurrently_without_loss() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let p = s.allocate_port_with_send().unwrap();
        let senders = |s: &Space| -> Vec<(Space, Name)> {
            (0..SENDERS)
                .map(|k| {
                    if k % 2 == 0 {
                        (s.clone(), p)
                    } else {
                        let other = Space::new();
                        let (n, _) = other.extract_right(s, p, Disposition::CopySend).unwrap();
                        (other, n)
                    }
                })
                .collect()
        };
        let total = (SENDERS * PER_SENDER) as usize;

        // One receiver: each sender's messages in order, sequence numbers in order.
        let threads = spawn_senders(senders(&s));
        let mut next = vec![0u32; SENDERS as usize];
        for i in 0..total {
            let r = recv(&s, p);
            assert_eq!(r.seqno, i as u64);
            let (k, seq) = sender_and_seq(&r);
            assert_eq!(seq, next[k as usize], "sender {k} out of order");
            next[k as usize] += 1;
        }
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_empty(&s, p);

        // Three receivers.
        const RECEIVERS: usize = 3;
        const STOP: i32 = 2;
        let receivers: Vec<_> = (0..RECEIVERS)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    loop {
                        let r = recv(&s, p);
                        if r.id == STOP {
                            return got;
                        }
                        let (k, seq) = sender_and_seq(&r);
                        got.push((k, seq, r.seqno));
                    }
                })
            })
            .collect();
        spawn_senders(senders(&s)).into_iter().for_each(|t| t.join().unwrap());
        // Queued behind every data message: each receiver takes exactly one.
        for _ in 0..RECEIVERS {
            send(&s, p, Message::new(STOP, Vec::new()));
        }
        let mut all = BTreeSet::new();
        let mut seqnos = BTreeSet::new();
        for t in receivers {
            let got = t.join().unwrap();
            let mut last: BTreeMap<u32, u32> = BTreeMap::new();
            for (k, seq, seqno) in got {
                assert!(all.insert((k, seq)), "({k}, {seq}) received twice");
                assert!(seqnos.insert(seqno), "sequence number {seqno} given twice");
                if let Some(prev) = last.insert(k, seq) {
                    assert!(prev < seq, "one receiver saw sender {k}'s {seq} after {prev}");
                }
            }
        }
        assert_eq!(all.len(), total, "messages lost");
        assert_empty(&s, p);
        s.destroy(p).unwrap();
    }
    assert_back_to(&base, "threads");
}

// ----- 5. queue limits --------------------------------------------------------------------

/// With a queue limit of 1 to 4, non-blocking sends eventually time out; a blocking
/// sender in another thread sleeps until the receiver drains, then completes, and its
/// message arrives after all that were queued before it.
#[test]
fn qlimit_blocks_senders_until_the_receiver_drains() {
    let _serial = serial();
    let base = Resources::settled();
    let mut accepted = Vec::new();
    for qlimit in 1..=4u32 {
        let s = Space::new();
        let p = s.allocate_port_with_send().unwrap();
        s.set_qlimit(p, qlimit).unwrap();
        assert_eq!(s.port_status(p).unwrap().qlimit, qlimit);

        let mut n = 0usize;
        loop {
            match s.send(p, &mut Message::new(1, (n as u32).to_le_bytes().to_vec()), SendOptions::NONBLOCKING) {
                Ok(()) => n += 1,
                Err(SendError::TimedOut) => break,
                Err(e) => panic!("qlimit {qlimit}: {e}"),
            }
            assert!(n < 10_000, "qlimit {qlimit}: the queue never filled");
        }
        assert!(n >= 1, "qlimit {qlimit}: not even one message fits");
        // A bounded wait on a full queue times out too.
        let r = s.send(p, &mut Message::new(1, vec![0; 4]), SendOptions { timeout: Some(Duration::from_millis(20)) });
        assert!(matches!(r, Err(SendError::TimedOut)), "{r:?}");
        accepted.push(n);

        let (tid_tx, tid_rx) = mpsc::channel();
        let (sent_tx, sent_rx) = mpsc::channel();
        let blocked = {
            let s = s.clone();
            std::thread::spawn(move || {
                tid_tx.send(gettid()).unwrap();
                let r = s.send(p, &mut Message::new(2, vec![0xbb; 4]), SendOptions::default());
                sent_tx.send(r.is_ok()).unwrap();
            })
        };
        let tid = tid_rx.recv_timeout(WATCHDOG).unwrap();
        assert!(wait_thread_asleep(tid), "qlimit {qlimit}: the sender never blocked");
        assert!(sent_rx.try_recv().is_err(), "qlimit {qlimit}: a send completed on a full queue");
        for i in 0..n {
            let r = recv(&s, p);
            assert_eq!((r.id, r.data()), (1, &(i as u32).to_le_bytes()[..]), "qlimit {qlimit}");
        }
        let last = recv(&s, p);
        assert_eq!(last.id, 2, "qlimit {qlimit}: the blocked sender's message comes last");
        assert_eq!(sent_rx.recv_timeout(WATCHDOG), Ok(true), "qlimit {qlimit}: the blocked sender never finished");
        blocked.join().unwrap();
        assert_empty(&s, p);
        s.destroy(p).unwrap();
    }
    // A larger limit never holds fewer messages.
    assert!(accepted.windows(2).all(|w| w[0] <= w[1]), "messages accepted per limit: {accepted:?}");
    assert_back_to(&base, "qlimit");
}

// ----- 6. port sets and pollable descriptors across processes --------------------------------

/// A port set's and a port's pollable descriptors become readable in plain `poll` and
/// `epoll` when a message from another process arrives, and not before; a receive on
/// the set says which member it came from. A receive right moved out of a set (with a
/// message queued) leaves it, and works in a set in the other process.
#[test]
fn port_sets_and_pollable_fds_across_processes() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let (a, b, m) = (s.allocate_port().unwrap(), s.allocate_port().unwrap(), s.allocate_port_with_send().unwrap());
        let set = s.allocate_port_set().unwrap();
        for n in [a, b, m] {
            s.move_member(n, set).unwrap();
        }
        let set_fd = s.pollable_fd(set).unwrap();
        let a_fd = s.pollable_fd(a).unwrap();

        let mut cmd = child_command("child_pinger", "pinger");
        s.give_bootstrap(&mut cmd, boot).unwrap();
        let child = ChildGuard::spawn(cmd, "pinger");
        let c = parent_hello(&s, boot, &child);
        let child_creds = Credentials { pid: child.pid(), ..me() };

        // `m` goes to the child, from our set, with a message queued.
        send(&s, m, Message::new(70, b"queued in a set member".to_vec()));
        send(
            &s,
            c,
            with_ports(
                GIFTS,
                &[],
                &[(a, Disposition::MakeSend), (b, Disposition::MakeSend), (m, Disposition::MoveReceive)],
            ),
        );
        let mut members = s.set_members(set).unwrap();
        members.sort();
        let mut expected = vec![a, b];
        expected.sort();
        assert_eq!(members, expected);
        assert!(!readable(set_fd.as_fd(), Duration::ZERO), "nothing is queued in the set");

        // A message to `b` from the child: the set's descriptor in plain poll.
        send(&s, c, Message::new(GO, b"b".to_vec()));
        assert!(readable(set_fd.as_fd(), WATCHDOG), "the set never became readable");
        assert!(!readable(a_fd.as_fd(), Duration::ZERO), "`a` got nothing");
        let mut r = Received::new();
        s.receive(set, &mut r, within(Duration::ZERO)).expect("readable set has a message");
        assert_eq!((r.id, r.port, r.sender, r.data()), (PING, b, child_creds, &b"b"[..]));
        assert!(!readable(set_fd.as_fd(), Duration::ZERO), "drained");

        // A message to `a`: the port's own descriptor, through epoll.
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
        epoll::add(&ep, &a_fd, epoll::EventData::new_u64(7), epoll::EventFlags::IN).unwrap();
        send(&s, c, Message::new(GO, b"a".to_vec()));
        let mut events = Vec::with_capacity(4);
        let ts = Timespec { tv_sec: WATCHDOG.as_secs() as i64, tv_nsec: 0 };
        loop {
            events.clear();
            match epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), Some(&ts)) {
                Err(rustix::io::Errno::INTR) => continue,
                r => {
                    r.unwrap();
                    break;
                }
            }
        }
        assert_eq!(events.len(), 1, "epoll never reported `a`");
        assert_eq!(events[0].data.u64(), 7);
        assert!(readable(set_fd.as_fd(), Duration::ZERO), "the set sees its member's message too");
        let r = recv(&s, a);
        assert_eq!((r.id, r.port, r.sender, r.data()), (PING, a, child_creds, &b"a"[..]));
        assert!(!readable(a_fd.as_fd(), Duration::ZERO));
        assert!(!readable(set_fd.as_fd(), Duration::ZERO));

        send(&s, c, Message::new(FINISH, Vec::new()));
        assert_eq!(recv(&s, boot).id, DONE);
        child.expect_success();
        drop((ep, set_fd, a_fd));
        // Members first: each leaves the set as it is destroyed.
        for n in [a, b] {
            s.destroy(n).unwrap();
        }
        assert!(s.set_members(set).unwrap().is_empty());
        for n in [set, boot] {
            s.destroy(n).unwrap();
        }
        for n in [c, m] {
            s.deallocate(n).unwrap();
        }
        assert_eq!(s.stats().names, 0, "{:?}", s.names());
    }
    assert_back_to(&base, "port sets");
}

#[test]
fn child_pinger() {
    if !child_role("pinger") {
        return;
    }
    let s = Space::task();
    let (boot, c) = child_hello(&s);
    let gifts = recv(&s, c);
    assert_eq!(gifts.id, GIFTS);
    let (a, b, m) = (gifts.ports[0].name, gifts.ports[1].name, gifts.ports[2].name);
    assert_eq!(gifts.ports[2].kind, RightKind::Receive);

    // The moved member, in a set of ours, with its message still queued.
    let set = s.allocate_port_set().unwrap();
    s.move_member(m, set).unwrap();
    assert!(readable(s.pollable_fd(set).unwrap().as_fd(), WATCHDOG));
    let r = recv(&s, set);
    assert_eq!((r.id, r.port, r.data()), (70, m, &b"queued in a set member"[..]));

    loop {
        let r = recv(&s, c);
        match r.id {
            GO => {
                let dest = if r.data() == b"a" { a } else { b };
                send(&s, dest, Message::new(PING, r.data().to_vec()));
            }
            FINISH => break,
            other => panic!("unexpected message {other}"),
        }
    }
    send(&s, boot, Message::new(DONE, Vec::new()));
}

/// Run `f` in a thread of its own; [`Finishing::wait`] says whether it finished.
fn start(what: &str, f: impl FnOnce() + Send + 'static) -> Finishing {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    Finishing { what: what.to_string(), rx }
}

struct Finishing {
    what: String,
    rx: mpsc::Receiver<()>,
}

impl Finishing {
    /// An error (rather than a hang) if it does not finish by `deadline`. A deadlocked
    /// thread is left behind.
    fn wait(self, deadline: std::time::Instant) -> Result<(), String> {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(()) => Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(format!("{}: deadlocked", self.what)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(format!("{}: panicked", self.what)),
        }
    }
}

/// A receive right that is a member of a port set can be moved in a message, moved
/// with `extract_right`, and destroyed, and it leaves its set.
#[test]
fn moving_or_destroying_a_set_member_does_not_deadlock() {
    let _serial = serial();
    let member = |s: &Space| {
        let set = s.allocate_port_set().unwrap();
        let p = s.allocate_port().unwrap();
        s.move_member(p, set).unwrap();
        (set, p)
    };
    let results = [
        start("send with MoveReceive of a set member", move || {
            let s = Space::new();
            let (set, p) = member(&s);
            let carrier = s.allocate_port_with_send().unwrap();
            send(&s, carrier, with_ports(1, &[], &[(p, Disposition::MoveReceive)]));
            assert!(s.set_members(set).unwrap().is_empty());
            assert_eq!(recv(&s, carrier).ports[0].kind, RightKind::Receive);
        }),
        start("extract_right with MoveReceive of a set member", move || {
            let s = Space::new();
            let (set, p) = member(&s);
            let other = Space::new();
            let (_, kind) = other.extract_right(&s, p, Disposition::MoveReceive).unwrap();
            assert_eq!(kind, RightKind::Receive);
            assert!(s.set_members(set).unwrap().is_empty());
        }),
        start("destroy of a set member", move || {
            let s = Space::new();
            let (set, p) = member(&s);
            s.destroy(p).unwrap();
            assert!(s.set_members(set).unwrap().is_empty());
        }),
        start("mod_refs(Receive, -1) of a set member", move || {
            let s = Space::new();
            let (set, p) = member(&s);
            s.mod_refs(p, RightKind::Receive, -1).unwrap();
            assert!(s.set_members(set).unwrap().is_empty());
        }),
    ];
    let deadline = std::time::Instant::now() + WATCHDOG;
    let failed: Vec<String> = results.into_iter().filter_map(|r| r.wait(deadline).err()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

// ----- notifications for send rights made after the request -------------------------------

/// A no-senders request armed while a send right exists must also cover send rights
/// made later. Here a right is made (into another space) before the request and one
/// (the child's bootstrap) after it; the first is released, then the child is
/// killed, with nobody receiving on the port: the notification must come.
#[test]
fn no_senders_covers_send_rights_made_after_the_request() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let notify = s.allocate_port().unwrap();
        let p = s.allocate_port().unwrap();
        let other = Space::new();
        let (early, _) = other.extract_right(&s, p, Disposition::MakeSend).unwrap();
        s.request_notification(p, NotifyKind::NoSenders, Some(PortArg::new(notify, Disposition::MakeSendOnce)))
            .unwrap();
        assert_empty(&s, notify);
        // A send right made after the request, for a child.
        let mut cmd = child_command("child_holder", "holder");
        s.give_bootstrap(&mut cmd, p).unwrap();
        let child = ChildGuard::spawn(cmd, "holder");
        assert_eq!(recv(&s, p).id, READY);
        // The early right goes; the child's remains.
        other.deallocate(early).unwrap();
        drop(other);
        assert_empty(&s, notify);
        child.kill9();
        let n = recv(&s, notify);
        assert_eq!(n.id, NotifyId::NoSenders.id());
        assert_eq!(NotifyId::parse_body(n.data()), Some((p, 2)), "two send rights were made");
        for x in [notify, p] {
            s.destroy(x).unwrap();
        }
    }
    assert_back_to(&base, "no-senders after a late send right");
}

#[test]
fn child_holder() {
    if !child_role("holder") {
        return;
    }
    let s = Space::task();
    let boot = s.take_bootstrap().unwrap().expect("bootstrap");
    send(&s, boot, Message::new(READY, Vec::new()));
    let elsewhere = s.allocate_port().unwrap();
    let mut r = Received::new();
    let res = s.receive(elsewhere, &mut r, ReceiveOptions::default());
    panic!("the holder was to be killed, got {res:?}");
}

// ----- 11. exact queue limits and the trailer's ids across processes ---------------------------

/// Mach's queue limit across processes: with qlimit 5, a child fills exactly 5 places
/// and a second child, another process with its own mapping of the port's queue page,
/// finds the queue full at once; both then block, and each message the parent receives
/// lets exactly one of them in, never more than 5 queued.
#[test]
fn qlimit_is_exact_across_processes() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let boot = s.allocate_port().unwrap();
        let p = s.allocate_port().unwrap();
        s.set_qlimit(p, 5).unwrap();
        let mut children = Vec::new();
        let mut filled = Vec::new();
        for _ in 0..2 {
            let mut cmd = child_command("child_filler", "filler");
            s.give_bootstrap(&mut cmd, boot).unwrap();
            let child = ChildGuard::spawn(cmd, "filler");
            let c = parent_hello(&s, boot, &child);
            send(&s, c, with_ports(GO, &[], &[(p, Disposition::MakeSend)]));
            let full = recv(&s, boot);
            assert_eq!(full.id, FULL);
            filled.push(u32::from_le_bytes(full.data().try_into().unwrap()));
            children.push((child, c));
        }
        assert_eq!(filled, vec![5, 0], "the first child fills the queue, the second finds it full");
        assert_eq!(s.port_status(p).unwrap().msgcount, 5);
        let mut got = Vec::new();
        for i in 0..7 {
            let r = recv(&s, p);
            got.push(r.id);
            if i < 2 {
                // A blocked child takes the place given back, and no more.
                let until = std::time::Instant::now() + WATCHDOG;
                while s.port_status(p).unwrap().msgcount < 5 {
                    assert!(std::time::Instant::now() < until, "no blocked sender woke after receive {i}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            assert!(s.port_status(p).unwrap().msgcount <= 5, "more than the limit queued: {got:?}");
        }
        assert_eq!(got.iter().filter(|&&id| id == CHATTER).count(), 5, "{got:?}");
        assert_eq!(got.iter().filter(|&&id| id == DONE).count(), 2, "{got:?}");
        assert_empty(&s, p);
        for (child, c) in children {
            child.expect_success();
            s.deallocate(c).unwrap();
        }
        s.destroy(boot).unwrap();
        s.destroy(p).unwrap();
    }
    assert_back_to(&base, "exact queue limit across processes");
}

#[test]
fn child_filler() {
    if !child_role("filler") {
        return;
    }
    let s = Space::task();
    let (boot, c) = child_hello(&s);
    let go = recv(&s, c);
    assert_eq!(go.id, GO);
    let p = go.ports[0].name;
    let mut n = 0u32;
    loop {
        match s.send(p, &mut Message::new(CHATTER, n.to_le_bytes().to_vec()), SendOptions::NONBLOCKING) {
            Ok(()) => n += 1,
            Err(SendError::TimedOut) => break,
            Err(e) => panic!("fill: {e}"),
        }
        assert!(n <= 5, "more messages queued than the limit");
    }
    send(&s, boot, Message::new(FULL, n.to_le_bytes().to_vec()));
    // Blocks until the parent receives one.
    send(&s, p, Message::new(DONE, n.to_le_bytes().to_vec()));
}

/// The trailer's uid and gid are the sender's real ids, as the kernel stamps them
/// (`doc/ipc.md`, *Sender identity*): a sender with real uid 0 and effective uid 65534
/// arrives as uid 0 — the ids it can take back at will. Needs root to change ids.
#[test]
fn the_trailer_carries_the_senders_real_ids() {
    let _serial = serial();
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: changing the effective uid needs root");
        return;
    }
    let s = Space::new();
    let boot = s.allocate_port().unwrap();
    let mut cmd = child_command("child_seteuid", "seteuid");
    s.give_bootstrap(&mut cmd, boot).unwrap();
    let child = ChildGuard::spawn(cmd, "seteuid");
    let c = parent_hello(&s, boot, &child);
    let done = recv(&s, boot);
    assert_eq!(done.id, DONE);
    assert_eq!(done.data(), &65534u32.to_le_bytes()[..], "the child's effective uid when it sent");
    assert_eq!(done.sender, Credentials { pid: child.pid(), uid: 0, gid: 0 }, "its real ids");
    child.expect_success();
    s.deallocate(c).unwrap();
    s.destroy(boot).unwrap();
}

#[test]
fn child_seteuid() {
    if !child_role("seteuid") {
        return;
    }
    let s = Space::task();
    let (boot, _) = child_hello(&s);
    // Per thread (setresuid(2), the kernel's call): this thread sends.
    rustix::thread::set_thread_res_gid(None, rustix::process::Gid::from_raw(65534), None).expect("setegid");
    rustix::thread::set_thread_res_uid(None, rustix::process::Uid::from_raw(65534), None).expect("seteuid");
    let euid = rustix::process::geteuid().as_raw();
    send(&s, boot, Message::new(DONE, euid.to_le_bytes().to_vec()));
}
