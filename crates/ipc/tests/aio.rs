//! Ports as futures (`ictus_ipc::aio`, feature `tokio`): receive, send with a time-out,
//! call and port sets on a current-thread runtime, a server killed with `kill -9` in the
//! middle of a call, and no thread per port.

mod common;

use std::os::fd::AsFd;
use std::time::Duration;

use common::*;
use ictus_ipc::aio::{AsyncCaller, AsyncReceiver, AsyncSender, RegisterError};
use ictus_ipc::{
    CallError, Disposition, Message, PortArg, ReceiveError, Received, RightKind, SendError, SendOptions, Space,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// Bound a future by the watchdog, so a lost wake-up fails the test instead of hanging.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(WATCHDOG, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: still waiting after the {WATCHDOG:?} watchdog (a lost wake-up?)"),
    }
}

/// The tests of this file (the harness names each test's thread after it).
const TESTS: &[&str] = &[
    "receivers_wake_for_messages_sent_from_other_threads",
    "a_port_set_wakes_for_any_member_even_one_added_later",
    "a_send_to_a_full_queue_waits_for_room_or_times_out",
    "a_send_wakes_for_room_that_no_dequeue_makes",
    "a_call_wakes_for_room_that_no_dequeue_makes",
    "a_send_to_a_dead_port_fails_at_once",
    "many_callers_and_a_server_share_one_thread",
    "a_call_that_times_out_never_takes_a_late_reply_for_the_next",
    "replies_of_every_shape_arrive_and_a_dropped_request_is_server_died",
    "a_caller_must_supply_no_reply_right_of_its_own",
    "registering_outside_a_runtime_is_an_error_not_a_panic",
    "aio_dying_server_child",
    "a_server_killed_mid_call_ends_the_call_at_once",
];

/// This process's threads, by name.
fn threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn receivers_wake_for_messages_sent_from_other_threads() {
    let _s = serial();
    let space = Space::new();
    let ports: Vec<_> = (0..8).map(|_| space.allocate_port_with_send().expect("port")).collect();
    runtime().block_on(async {
        let receivers: Vec<_> = ports.iter().map(|&p| AsyncReceiver::new(&space, p).expect("register")).collect();
        // Messages arrive later, from another thread, while every receiver waits.
        let sender_space = space.clone();
        let sent = ports.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            for round in 0..50u32 {
                for (i, &p) in sent.iter().enumerate() {
                    let data = [i as u8, round as u8];
                    sender_space.send(p, &mut Message::new(1, data.to_vec()), SendOptions::default()).expect("send");
                }
            }
        });
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut tasks = Vec::new();
                for (i, r) in receivers.into_iter().enumerate() {
                    tasks.push(tokio::task::spawn_local(async move {
                        let mut msg = Received::new();
                        for round in 0..50u32 {
                            bounded("receive", r.receive(&mut msg)).await.expect("receive");
                            assert_eq!(msg.data(), [i as u8, round as u8], "in order, each to its own port");
                        }
                    }));
                }
                for t in tasks {
                    t.await.expect("receiver task");
                }
            })
            .await;
        t.join().expect("sender thread");
    });
}

#[test]
fn a_port_set_wakes_for_any_member_even_one_added_later() {
    let _s = serial();
    let space = Space::new();
    let set = space.allocate_port_set().expect("set");
    let a = space.allocate_port_with_send().expect("a");
    space.move_member(a, set).expect("a into the set");
    runtime().block_on(async {
        let r = AsyncReceiver::new(&space, set).expect("register the set");
        let b = space.allocate_port_with_send().expect("b");
        space.move_member(b, set).expect("b into the set after registration");
        let mut msg = Received::new();
        let s2 = space.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            s2.send(b, &mut Message::new(2, b"to b".to_vec()), SendOptions::default()).expect("send b");
            s2.send(a, &mut Message::new(1, b"to a".to_vec()), SendOptions::default()).expect("send a");
        });
        let mut got = Vec::new();
        for _ in 0..2 {
            bounded("set receive", r.receive(&mut msg)).await.expect("receive");
            got.push((msg.port, msg.data().to_vec()));
        }
        got.sort();
        let mut want = vec![(a, b"to a".to_vec()), (b, b"to b".to_vec())];
        want.sort();
        assert_eq!(got, want);
        t.join().expect("sender");
        // Nothing more: a receive with a time-out says so.
        let e = r.receive_timeout(&mut msg, Duration::from_millis(30)).await.expect_err("empty");
        assert!(matches!(e, ReceiveError::TimedOut), "{e:?}");
    });
}

#[test]
fn a_send_to_a_full_queue_waits_for_room_or_times_out() {
    let _s = serial();
    let space = Space::new();
    let port = space.allocate_port().expect("port");
    space.set_qlimit(port, 1).expect("qlimit");
    let dest = space.insert_send_fd(space.send_right_fd(port).expect("a send right's descriptor")).expect("send right");
    runtime().block_on(async {
        let sender = AsyncSender::new(&space, dest).expect("register");
        // Fill the queue.
        let mut filled = 0;
        loop {
            match space.send(dest, &mut Message::new(1, vec![0; 512]), SendOptions::NONBLOCKING) {
                Ok(()) => filled += 1,
                Err(SendError::TimedOut) => break,
                Err(e) => panic!("filling: {e}"),
            }
            assert!(filled < 10_000, "the queue limit does not hold");
        }
        let e = sender.send(&mut Message::new(2, vec![0; 512]), Some(Duration::from_millis(30))).await;
        assert!(matches!(e, Err(SendError::TimedOut)), "a full queue times out: {e:?}");
        // A reader makes room on another thread: the waiting send goes.
        let s2 = space.clone();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            for _ in 0..filled {
                recv(&s2, port);
            }
        });
        bounded("send", sender.send(&mut Message::new(3, b"last".to_vec()), None)).await.expect("send after room");
        reader.join().expect("reader");
        let last = recv(&space, port);
        assert_eq!((last.id, last.data()), (3, &b"last"[..]));
    });
}

/// Where a port's queue page keeps `sent`, the places senders have taken
/// (`crates/ipc/src/queue.rs`, `SENT_AT`).
const PAGE_SENT_AT: u64 = 64;

/// The queue page of the port a send end reaches, from the note at the head of the send
/// end's queue, as any holder of a send right can get it (peeked: the note stays).
fn queue_page(send_end: std::os::fd::BorrowedFd<'_>) -> std::os::fd::OwnedFd {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    #[repr(C, align(8))]
    struct Control([std::mem::MaybeUninit<u8>; rustix::cmsg_space!(ScmRights(1))]);
    let mut space = Control([std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))]);
    let mut control = RecvAncillaryBuffer::new(&mut space.0);
    let mut buf = [0u8; 64];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let flags = RecvFlags::PEEK | RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT;
    rustix::net::recvmsg(send_end, &mut iov, &mut control, flags).expect("peek the note");
    let mut fds: Vec<_> = control
        .drain()
        .filter_map(|m| match m {
            RecvAncillaryMessage::ScmRights(r) => Some(r),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(fds.len(), 1, "the note carries the queue page");
    fds.pop().expect("page")
}

/// Room that appears with no message taken off the queue — places a holder of a send
/// right claimed in the queue page and never used, given back by the receiver's audit —
/// comes with no event on the send end at all, only with the page's wake-up. An async
/// sender waits for that wake-up and rings the port as a blocked sender does, so it gets
/// the room; one that waited for the send end's writability would wait for ever (as it
/// also could when its try landed between a receiver's dequeue, which makes the send end
/// writable, and that receiver giving the place back).
#[test]
fn a_send_wakes_for_room_that_no_dequeue_makes() {
    let _s = serial();
    let space = Space::new();
    let port = space.allocate_port().expect("port");
    let dest = claim_every_place(&space, port, 1);
    runtime().block_on(async {
        let sender = AsyncSender::new(&space, dest).expect("register");
        let e = sender.send(&mut Message::new(1, b"early".to_vec()), Some(Duration::from_millis(30))).await;
        assert!(matches!(e, Err(SendError::TimedOut)), "the claimed place fills the queue: {e:?}");
        // A receiver waits; only the sender's doorbell makes it look at the queue.
        let s2 = space.clone();
        let receiver = std::thread::spawn(move || recv(&s2, port));
        bounded("send", sender.send(&mut Message::new(2, b"after the audit".to_vec()), None))
            .await
            .expect("send once the claimed place is given back");
        let got = receiver.join().expect("receiver");
        assert_eq!((got.id, got.data()), (2, &b"after the audit"[..]));
    });
}

/// A hostile holder of a send right to `port` claims every place of its queue (qlimit
/// `places`) in the queue page, and never sends: the queue is full with nothing in it.
fn claim_every_place(space: &Space, port: ictus_ipc::Name, places: u32) -> ictus_ipc::Name {
    space.set_qlimit(port, places).expect("qlimit");
    let send_end = space.send_right_fd(port).expect("a send right's descriptor");
    let page = queue_page(send_end.as_fd());
    let mut word = [0u8; 4];
    rustix::io::pread(&page, &mut word, PAGE_SENT_AT).expect("read sent");
    let claimed = u32::from_le_bytes(word).wrapping_add(places).to_le_bytes();
    rustix::io::pwrite(&page, &claimed, PAGE_SENT_AT).expect("claim the places");
    space.insert_send_fd(send_end).expect("send right")
}

/// As [`a_send_wakes_for_room_that_no_dequeue_makes`], for a call's request.
#[test]
fn a_call_wakes_for_room_that_no_dequeue_makes() {
    let _s = serial();
    let space = Space::new();
    let service = space.allocate_port().expect("service");
    let dest = claim_every_place(&space, service, 2);
    runtime().block_on(async {
        let mut caller = AsyncCaller::new(&space, dest).expect("caller");
        let mut reply = Received::new();
        let s2 = space.clone();
        // The server waits; only the caller's doorbell makes it look at the queue.
        let server = std::thread::spawn(move || {
            let mut req = recv(&s2, service);
            let to = req.reply.take().expect("reply right");
            let mut answer = Message::new(req.id + 100, req.data().to_vec());
            s2.send(to.name, &mut answer, SendOptions::default()).expect("reply");
        });
        bounded("call", caller.call(&mut Message::new(5, b"after the audit".to_vec()), &mut reply, None))
            .await
            .expect("call once the claimed places are given back");
        assert_eq!((reply.id, reply.data()), (105, &b"after the audit"[..]));
        server.join().expect("server");
    });
}

#[test]
fn a_send_to_a_dead_port_fails_at_once() {
    let _s = serial();
    let space = Space::new();
    let port = space.allocate_port().expect("port");
    let dest = space.insert_send_fd(space.send_right_fd(port).expect("fd")).expect("send right");
    runtime().block_on(async {
        let sender = AsyncSender::new(&space, dest).expect("register");
        space.destroy(port).expect("destroy the receive right");
        bounded("dead", sender.dead()).await;
        let e = sender.send(&mut Message::new(1, Vec::new()), None).await.expect_err("dead");
        assert!(matches!(e, SendError::InvalidDest(_)), "{e:?}");
    });
}

/// A server task that answers every request with its data reversed, through the
/// request's reply right, until it gets id 0.
async fn reverse_server(space: Space, service: ictus_ipc::Name) {
    let r = AsyncReceiver::new(&space, service).expect("register the service");
    let mut req = Received::new();
    loop {
        bounded("server receive", r.receive(&mut req)).await.expect("server receive");
        if req.id == 0 {
            return;
        }
        let Some(to) = req.reply.take() else { continue };
        let mut data = req.data().to_vec();
        data.reverse();
        let mut reply = Message::new(req.id + 100, data);
        ictus_ipc::aio::send(&space, to.name, &mut reply, Some(WATCHDOG)).await.expect("reply");
        if to.kind != RightKind::SendOnce {
            space.deallocate(to.name).expect("release the reply right");
        }
    }
}

#[test]
fn many_callers_and_a_server_share_one_thread() {
    let _s = serial();
    let space = Space::new();
    let service = space.allocate_port_with_send().expect("service");
    let before = threads();
    runtime().block_on(async {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let server = tokio::task::spawn_local(reverse_server(space.clone(), service));
                let mut callers = Vec::new();
                for c in 0..16u8 {
                    let space = space.clone();
                    callers.push(tokio::task::spawn_local(async move {
                        let mut caller = AsyncCaller::new(&space, service).expect("caller");
                        let mut reply = Received::new();
                        for i in 0..20u8 {
                            let mut msg = Message::new(7, vec![c, i, 0xff]);
                            bounded("call", caller.call(&mut msg, &mut reply, Some(WATCHDOG))).await.expect("call");
                            assert_eq!((reply.id, reply.data()), (107, &[0xff, i, c][..]));
                        }
                    }));
                }
                for c in callers {
                    c.await.expect("caller task");
                }
                space.send(service, &mut Message::new(0, Vec::new()), SendOptions::default()).expect("stop");
                server.await.expect("server task");
            })
            .await;
    });
    // 17 ports in use at once, none with a thread of its own (the space's notifier
    // thread may have started: at most one more).
    // Threads that came: at most the space's notifier. (The test harness may have
    // started other tests' threads meanwhile, each named after its test and waiting for
    // `serial`: not ours.)
    let mut new = threads();
    for t in &before {
        if let Some(i) = new.iter().position(|n| n == t) {
            new.remove(i);
        }
    }
    new.retain(|n| n != "ictus-notifier" && !TESTS.iter().any(|t| t.starts_with(n.as_str())));
    assert!(new.is_empty(), "threads {before:?} gained {new:?}: a thread per port?");
}

#[test]
fn a_call_that_times_out_never_takes_a_late_reply_for_the_next() {
    let _s = serial();
    let space = Space::new();
    let service = space.allocate_port_with_send().expect("service");
    runtime().block_on(async {
        let mut caller = AsyncCaller::new(&space, service).expect("caller");
        let mut reply = Received::new();
        let e = caller
            .call(&mut Message::new(1, b"first".to_vec()), &mut reply, Some(Duration::from_millis(20)))
            .await
            .expect_err("nobody answers");
        assert!(matches!(e, CallError::Receive(ReceiveError::TimedOut)), "{e:?}");
        // The server answers the first request late, then the second.
        let mut req = recv(&space, service);
        let late = req.reply.take().expect("a reply right");
        assert_eq!(late.kind, RightKind::SendOnce, "a call channel's reply right");
        // The caller dropped the channel when its call timed out: the late reply has
        // nowhere to go.
        let late = space.send(late.name, &mut Message::new(101, b"late".to_vec()), SendOptions::default());
        assert!(matches!(late, Err(SendError::InvalidDest(_))), "{late:?}");
        let s2 = space.clone();
        let server = std::thread::spawn(move || {
            let mut req = recv(&s2, service);
            let to = req.reply.take().expect("reply right");
            s2.send(to.name, &mut Message::new(102, b"second".to_vec()), SendOptions::default()).expect("reply");
        });
        bounded("second call", caller.call(&mut Message::new(2, b"second".to_vec()), &mut reply, Some(WATCHDOG)))
            .await
            .expect("second call");
        assert_eq!((reply.id, reply.data()), (102, &b"second"[..]), "the late reply went to the old channel");
        server.join().expect("server");
    });
}

#[test]
fn replies_of_every_shape_arrive_and_a_dropped_request_is_server_died() {
    let _s = serial();
    let (client, server) = (Space::new(), Space::new());
    let port = server.allocate_port().expect("service");
    let service = client.insert_send_fd(server.send_right_fd(port).expect("fd")).expect("send right");
    // The server thread: plain, big (more than a pipe write), with a right, and dropped.
    let s2 = server.clone();
    let t = std::thread::spawn(move || {
        for round in 0..3 {
            for shape in 0..4 {
                let mut req = recv(&s2, port);
                let to = req.reply.take().expect("reply right");
                assert_eq!(req.id, shape);
                let mut reply = match shape {
                    0 => Message::new(100, vec![round as u8; 16]),
                    1 => Message::new(101, vec![round as u8; 10_000]),
                    2 => {
                        let mut m = Message::new(102, Vec::new());
                        let gift = s2.allocate_port().expect("gift");
                        m.ports.push(PortArg::new(gift, Disposition::MoveReceive));
                        m
                    }
                    _ => {
                        s2.deallocate(to.name).expect("drop the reply right unused");
                        continue;
                    }
                };
                s2.send(to.name, &mut reply, SendOptions::default()).expect("reply");
            }
        }
    });
    runtime().block_on(async {
        let mut caller = AsyncCaller::new(&client, service).expect("caller");
        let mut reply = Received::new();
        for round in 0..3u8 {
            let call = |id| Message::new(id, Vec::new());
            bounded("plain", caller.call(&mut call(0), &mut reply, None)).await.expect("plain");
            assert_eq!((reply.id, reply.data()), (100, &[round; 16][..]));
            bounded("big", caller.call(&mut call(1), &mut reply, None)).await.expect("big");
            assert_eq!((reply.id, reply.data().len()), (101, 10_000));
            bounded("right", caller.call(&mut call(2), &mut reply, None)).await.expect("with a right");
            assert_eq!((reply.id, reply.ports.len()), (102, 1));
            assert_eq!(reply.ports[0].kind, RightKind::Receive);
            client.destroy(reply.ports[0].name).expect("the gift");
            let e = bounded("dropped", caller.call(&mut call(3), &mut reply, None)).await.expect_err("dropped");
            assert!(matches!(e, CallError::ServerDied), "{e:?}");
        }
    });
    t.join().expect("server");
}

#[test]
fn a_caller_must_supply_no_reply_right_of_its_own() {
    let _s = serial();
    let space = Space::new();
    let service = space.allocate_port_with_send().expect("service");
    runtime().block_on(async {
        let mut caller = AsyncCaller::new(&space, service).expect("caller");
        let mut msg = Message::new(1, Vec::new());
        msg.reply = Some(PortArg::new(service, Disposition::MakeSendOnce));
        let e = caller.call(&mut msg, &mut Received::new(), None).await.expect_err("refused");
        assert!(matches!(e, CallError::Send(SendError::InvalidRight(_))), "{e:?}");
    });
}

#[test]
fn registering_outside_a_runtime_is_an_error_not_a_panic() {
    let _s = serial();
    let space = Space::new();
    let port = space.allocate_port().expect("port");
    let e = AsyncReceiver::new(&space, port).expect_err("no runtime");
    assert!(matches!(e, RegisterError::NoRuntime), "{e:?}");
    assert!(e.to_string().contains("tokio runtime"), "{e}");
    runtime().block_on(async {
        let e = AsyncReceiver::new(&space, ictus_ipc::Name::new(0x777, 3)).expect_err("no such name");
        assert!(matches!(e, RegisterError::Rights(_)), "{e:?}");
    });
}

const SERVER_ROLE: &str = "aio-dying-server";

/// The child: a server that takes one request and never answers (the parent kills it).
#[test]
fn aio_dying_server_child() {
    if !child_role(SERVER_ROLE) {
        return;
    }
    let space = Space::new();
    let parent = space.take_bootstrap().expect("bootstrap").expect("a bootstrap right");
    let service = space.allocate_port().expect("service");
    let mut hello = Message::new(1, Vec::new());
    hello.ports.push(PortArg::new(service, Disposition::MakeSend));
    space.send(parent, &mut hello, SendOptions::default()).expect("hello");
    let _req = recv(&space, service);
    space.send(parent, &mut Message::new(2, b"got it".to_vec()), SendOptions::default()).expect("got it");
    std::thread::sleep(WATCHDOG * 4);
}

#[test]
fn a_server_killed_mid_call_ends_the_call_at_once() {
    let _s = serial();
    let space = Space::new();
    let setup = space.allocate_port().expect("setup");
    let mut cmd = child_command("aio_dying_server_child", SERVER_ROLE);
    space.give_bootstrap(&mut cmd, setup).expect("bootstrap");
    let child = ChildGuard::spawn(cmd, "dying server");
    let hello = recv(&space, setup);
    let service = hello.ports[0].name;
    runtime().block_on(async {
        let mut caller = AsyncCaller::new(&space, service).expect("caller");
        let mut reply = Received::new();
        let mut msg = Message::new(5, b"never answered".to_vec());
        let call = caller.call(&mut msg, &mut reply, Some(WATCHDOG * 2));
        let kill = async {
            let setup_rx = AsyncReceiver::new(&space, setup).expect("setup receiver");
            let mut got = Received::new();
            bounded("got it", setup_rx.receive(&mut got)).await.expect("the server has the request");
            child.kill9();
        };
        let (result, ()) = tokio::join!(call, kill);
        assert!(matches!(result, Err(CallError::ServerDied)), "{result:?}");
    });
}
