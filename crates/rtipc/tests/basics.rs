//! Real-time ports within one process: calls, asynchronous sends, priority order,
//! dispatch, the paper's errors, nested calls, and port death.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use ictus_ipc::{ReceiveOptions, Received, Space};
use ictus_rtipc::{
    AssociateError, Dispatch, Handoff, PortAttrs, Queueing, ReceiveError, RtSpace, SendError, SendOptions,
};

const WATCHDOG: Option<Duration> = Some(Duration::from_secs(30));

fn opts() -> SendOptions {
    SendOptions { timeout: WATCHDOG, ..SendOptions::default() }
}

/// An echo server thread on `port`: replies with the request's body and priority.
fn echo_server(rt: &RtSpace, port: ictus_ipc::Name) -> thread::JoinHandle<()> {
    let rt = rt.clone();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let mut r = rt.associate(port, None).expect("associate");
        tx.send(()).expect("ready");
        let mut req = r.request_buffer();
        while r.receive(&mut req, None).is_ok() {
            if req.sync {
                let mut out = req.data().to_vec();
                out.push(req.priority);
                let _ = r.reply(&mut req, &out);
            }
        }
    });
    rx.recv().expect("server ready");
    h
}

#[test]
fn call_round_trips_under_every_policy() {
    for q in [Queueing::Fifo, Queueing::Priority, Queueing::PriorityInheritance] {
        for h in [Handoff::Off, Handoff::Sender, Handoff::Message] {
            let rt = RtSpace::new(Space::new());
            let port = rt.allocate(PortAttrs::new(q, h)).expect("allocate");
            let server = echo_server(&rt, port);
            let mut c = rt.connect(port).expect("connect");
            assert_eq!(c.attrs(), PortAttrs::new(q, h));
            let mut reply = [0u8; 64];
            for i in 0..50u8 {
                let n = c.call(&[i, 1, 2], &mut reply, opts()).expect("call");
                assert_eq!(&reply[..3], &[i, 1, 2]);
                assert_eq!(n, 4);
            }
            let stats = rt.stats(port).expect("stats");
            assert_eq!(stats.free_buffers, stats.buffers);
            rt.destroy(port).expect("destroy");
            server.join().expect("server");
            // The port is gone: the client sees it.
            assert!(matches!(c.call(b"x", &mut reply, opts()), Err(SendError::ServerDied)));
        }
    }
}

#[test]
fn message_priority_travels_in_the_header() {
    let rt = RtSpace::new(Space::new());
    let port = rt
        .allocate(PortAttrs { ceiling: 60, ..PortAttrs::new(Queueing::Priority, Handoff::Message) })
        .expect("allocate");
    let server = echo_server(&rt, port);
    let mut c = rt.connect(port).expect("connect");
    let mut reply = [0u8; 8];
    // Without real-time privilege the hand-off itself is refused; the priority still
    // travels and orders the queue.
    let n = c.call(b"a", &mut reply, SendOptions { priority: Some(42), ..opts() }).expect("call");
    assert_eq!(reply[n - 1], 42);
    // Claims above the ceiling are lowered to it.
    let n = c.call(b"a", &mut reply, SendOptions { priority: Some(99), ..opts() }).expect("call");
    assert_eq!(reply[n - 1], 60);
    rt.destroy(port).expect("destroy");
    server.join().expect("server");
}

#[test]
fn priority_queue_serves_the_most_urgent_first_and_fifo_does_not() {
    for (q, expect) in [(Queueing::Fifo, vec![10u8, 30, 20]), (Queueing::Priority, vec![30u8, 20, 10])] {
        let rt = RtSpace::new(Space::new());
        let port = rt.allocate(PortAttrs::new(q, Handoff::Message)).expect("allocate");
        // Three asynchronous messages queue up before any receiver exists.
        let mut clients: Vec<_> = (0..3).map(|_| rt.connect(port).expect("connect")).collect();
        for (c, p) in clients.iter_mut().zip([10u8, 30, 20]) {
            c.send(&[p], SendOptions { priority: Some(p), ..opts() }).expect("send");
        }
        let rt2 = rt.clone();
        let got = thread::spawn(move || {
            let mut r = rt2.associate(port, None).expect("associate");
            let mut req = r.request_buffer();
            let mut got = Vec::new();
            for _ in 0..3 {
                r.receive(&mut req, WATCHDOG).expect("receive");
                assert!(!req.sync);
                assert!(matches!(r.reply(&mut req, b"no"), Err(ictus_rtipc::ReplyError::NotSynchronous)));
                got.push(req.data()[0]);
            }
            got
        })
        .join()
        .expect("receiver");
        assert_eq!(got, expect, "{q:?}");
        rt.destroy(port).expect("destroy");
    }
}

#[test]
fn plain_ports_are_refused_with_the_papers_errors() {
    let space = Space::new();
    let rt = RtSpace::new(space.clone());
    let plain = space.allocate_port_with_send().expect("plain port");
    // Associating with a plain port: invalid name.
    let e = rt.associate(plain, None).expect_err("plain port");
    assert!(matches!(e, AssociateError::InvalidName(n) if n == plain));
    assert_eq!(e.code(), ictus_ipc::ReturnCode::InvalidName);
    // Sending a real-time message to a plain port: invalid destination. The plain
    // port's receiver refuses the real-time datagram (and closes what came with it).
    let s2 = space.clone();
    let receiver = thread::spawn(move || {
        let mut m = Received::new();
        s2.receive(plain, &mut m, ReceiveOptions { timeout: Some(Duration::from_secs(30)), ..Default::default() })
    });
    let e = rt.connect(plain).expect_err("plain port");
    assert!(matches!(e, SendError::InvalidDest(n, _) if n == plain), "{e}");
    assert_eq!(e.code(), ictus_ipc::ReturnCode::SendInvalidDest);
    assert!(matches!(receiver.join().expect("receiver"), Err(ictus_ipc::ReceiveError::Malformed { .. })));
    // With nobody receiving on the plain port, silence is refused too.
    let e = rt.connect_timeout(plain, Duration::from_millis(100)).expect_err("silent plain port");
    assert!(matches!(e, SendError::InvalidDest(..)));
    // A name that is nothing at all.
    let rt_port = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    rt.destroy(rt_port).expect("destroy");
    assert!(matches!(rt.connect(rt_port), Err(SendError::InvalidDest(..))));
    assert!(matches!(rt.associate(rt_port, None), Err(AssociateError::InvalidName(_))));
}

#[test]
fn dissociated_threads_can_associate_again_but_not_twice() {
    let rt = RtSpace::new(Space::new());
    let a = rt.allocate(PortAttrs::FIFO_OFF).expect("allocate");
    let b = rt.allocate(PortAttrs::FIFO_OFF).expect("allocate");
    let r = rt.associate(a, None).expect("associate");
    assert!(matches!(rt.associate(b, None), Err(AssociateError::AlreadyAssociated)));
    r.dissociate();
    let mut r = rt.associate(b, None).expect("associate again");
    let mut req = r.request_buffer();
    assert!(matches!(r.receive(&mut req, Some(Duration::from_millis(10))), Err(ReceiveError::TimedOut)));
    assert_eq!(rt.stats(b).expect("stats").receivers, 1);
    drop(r);
    assert_eq!(rt.stats(b).expect("stats").receivers, 0);
}

#[test]
fn dispatch_by_priority_picks_the_fitting_receiver() {
    let rt = RtSpace::new(Space::new());
    let attrs = PortAttrs { dispatch: Dispatch::Priority, ..PortAttrs::new(Queueing::Priority, Handoff::Message) };
    let port = rt.allocate(attrs).expect("allocate");
    // Two receivers; their associated priorities are what the thread runs at, so
    // without privilege both are 0 and the test checks only that both serve.
    let (tx, rx) = mpsc::channel();
    let mut servers = Vec::new();
    // Both receivers are associated before the first call (and so before the port is
    // destroyed: a late one would find the port gone).
    let ready = std::sync::Arc::new(std::sync::Barrier::new(3));
    for k in 0..2u8 {
        let rt = rt.clone();
        let tx = tx.clone();
        let ready = ready.clone();
        servers.push(thread::spawn(move || {
            let mut r = rt.associate(port, None).expect("associate");
            ready.wait();
            let mut req = r.request_buffer();
            while r.receive(&mut req, None).is_ok() {
                let _ = tx.send(k);
                let _ = r.reply(&mut req, &[k]);
            }
        }));
    }
    ready.wait();
    let mut c = rt.connect(port).expect("connect");
    let mut reply = [0u8; 4];
    for _ in 0..40 {
        c.call(b"x", &mut reply, opts()).expect("call");
    }
    drop(tx);
    rt.destroy(port).expect("destroy");
    for s in servers {
        s.join().expect("server");
    }
    assert_eq!(rx.iter().count(), 40);
}

#[test]
fn nested_synchronous_calls_carry_the_priority_and_asynchronous_ones_do_not() {
    // Front server: on each request calls the back server synchronously (id 1) or
    // sends to it asynchronously (id 2). The back server reports the priority its
    // messages carried. The client's priority is given in the header (HANDOFF_MSG) so
    // the test needs no privilege.
    let rt = RtSpace::new(Space::new());
    let front = rt.allocate(PortAttrs::new(Queueing::Priority, Handoff::Message)).expect("allocate");
    let back = rt.allocate(PortAttrs::new(Queueing::Priority, Handoff::Sender)).expect("allocate");
    let (seen_tx, seen_rx) = mpsc::channel();
    let rt_b = rt.clone();
    let (ready_tx, ready_rx) = mpsc::channel();
    let back_server = thread::spawn(move || {
        let mut r = rt_b.associate(back, None).expect("associate");
        ready_tx.send(()).expect("ready");
        let mut req = r.request_buffer();
        while r.receive(&mut req, None).is_ok() {
            let _ = seen_tx.send((req.sync, req.priority));
            if req.sync {
                let _ = r.reply(&mut req, b"ok");
            }
        }
    });
    ready_rx.recv().expect("back ready");
    let rt_f = rt.clone();
    let front_server = thread::spawn(move || {
        let mut r = rt_f.associate(front, None).expect("associate");
        let mut to_back = rt_f.connect(back).expect("connect back");
        let mut req = r.request_buffer();
        let mut reply = [0u8; 8];
        while r.receive(&mut req, None).is_ok() {
            if req.data() == b"sync" {
                to_back.call(b"nested", &mut reply, opts()).expect("nested call");
            } else {
                to_back.send(b"nested", opts()).expect("nested send");
            }
            let _ = r.reply(&mut req, b"done");
        }
    });
    let mut c = rt.connect(front).expect("connect");
    let mut reply = [0u8; 8];
    c.call(b"sync", &mut reply, SendOptions { priority: Some(70), ..opts() }).expect("call");
    assert_eq!(seen_rx.recv_timeout(Duration::from_secs(30)).expect("back saw it"), (true, 70));
    c.call(b"async", &mut reply, SendOptions { priority: Some(70), ..opts() }).expect("call");
    let (sync, p) = seen_rx.recv_timeout(Duration::from_secs(30)).expect("back saw it");
    assert!(!sync);
    assert!(p < 70, "an asynchronous nested send carries the front server's own priority, got {p}");
    rt.destroy(front).expect("destroy");
    rt.destroy(back).expect("destroy");
    front_server.join().expect("front");
    back_server.join().expect("back");
}

#[test]
fn hostile_datagrams_close_only_their_connection() {
    use std::os::fd::AsFd;
    let rt = RtSpace::new(Space::new());
    let port = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    let server = echo_server(&rt, port);
    // A plain ictus message sent to the real-time port's main connection is refused.
    let mut m = ictus_ipc::Message::new(1, b"plain".to_vec());
    rt.space().send(port, &mut m, ictus_ipc::SendOptions::default()).expect("plain send goes out");
    // Garbage on the main connection too.
    let fd = rt.space().send_right_fd(port).expect("fd");
    rustix::net::send(fd.as_fd(), b"garbage", rustix::net::SendFlags::empty()).expect("send");
    let mut good = rt.connect(port).expect("connect");
    let mut reply = [0u8; 8];
    good.call(b"hi", &mut reply, opts()).expect("call still works");
    let stats = rt.stats(port).expect("stats");
    assert!(stats.malformed >= 2, "{stats:?}");
    assert_eq!(stats.free_buffers, stats.buffers);
    rt.destroy(port).expect("destroy");
    server.join().expect("server");
}

#[test]
fn oversized_messages_are_refused_before_sending() {
    let rt = RtSpace::new(Space::new());
    let port = rt.allocate(PortAttrs { buffer_size: 64, ..PortAttrs::PRIO_ON }).expect("allocate");
    let mut c = rt.connect(port).expect("connect");
    let e = c.send(&[0; 65], opts()).expect_err("too large");
    assert!(matches!(e, SendError::TooLarge { len: 65, max: 64 }));
    assert!(rt.allocate(PortAttrs { buffers: 0, ..PortAttrs::PRIO_ON }).is_err());
}

fn privileged() -> bool {
    let ok = ictus_rt::thread::rt_privileges();
    if !ok {
        println!("skipped: SCHED_FIFO is refused here (needs root, CAP_SYS_NICE or RLIMIT_RTPRIO)");
    }
    ok
}

/// Synchronous nested calls through two inheritance ports without hand-off: the client
/// inherits into the front server, which inherits into the back server while it waits,
/// so the kernel's PI chain runs the back server at the client's priority.
#[test]
fn inheritance_follows_nested_synchronous_calls_through_the_kernel() {
    use ictus_rt::thread::Policy;
    use ictus_rtipc::sys::{effective_priority, set_current_policy};
    if !privileged() {
        return;
    }
    let bpi_off = PortAttrs::new(Queueing::PriorityInheritance, Handoff::Off);
    let rt = RtSpace::new(Space::new());
    let front = rt.allocate(bpi_off).expect("allocate");
    let back = rt.allocate(bpi_off).expect("allocate");
    let pid = std::process::id();
    let (ready_tx, ready_rx) = mpsc::channel();
    let rt_b = rt.clone();
    let rtx = ready_tx.clone();
    let back_server = thread::spawn(move || {
        set_current_policy(Policy::Fifo { priority: 5 }).expect("fifo");
        let mut r = rt_b.associate(back, None).expect("associate");
        rtx.send(()).expect("ready");
        let mut req = r.request_buffer();
        while r.receive(&mut req, None).is_ok() {
            // -1 - rt_priority while the chain boosts us.
            let p = effective_priority(pid, r.tid()).unwrap_or(0);
            let _ = r.reply(&mut req, &p.to_le_bytes());
        }
    });
    let rt_f = rt.clone();
    let front_server = thread::spawn(move || {
        set_current_policy(Policy::Fifo { priority: 5 }).expect("fifo");
        let mut r = rt_f.associate(front, None).expect("associate");
        let mut to_back = rt_f.connect(back).expect("connect");
        ready_tx.send(()).expect("ready");
        let mut req = r.request_buffer();
        let mut reply = [0u8; 8];
        while r.receive(&mut req, None).is_ok() {
            let n = to_back.call(b"nested", &mut reply, opts()).expect("nested");
            let _ = r.reply(&mut req, &reply[..n]);
        }
    });
    ready_rx.recv().expect("ready");
    ready_rx.recv().expect("ready");
    let client = {
        let rt = rt.clone();
        thread::spawn(move || {
            set_current_policy(Policy::Fifo { priority: 40 }).expect("fifo");
            let mut c = rt.connect(front).expect("connect");
            let mut reply = [0u8; 8];
            let n = c.call(b"go", &mut reply, opts()).expect("call");
            i64::from_le_bytes(reply[..n].try_into().expect("8 bytes"))
        })
    };
    let seen = client.join().expect("client");
    assert_eq!(seen, -41, "the back server ran at prio field {seen}, not the client's 40");
    rt.destroy(front).expect("destroy");
    rt.destroy(back).expect("destroy");
    front_server.join().expect("front");
    back_server.join().expect("back");
}

/// Hand-off raises the receiver to the sender's priority for the request, and the
/// receiver is back at its own priority once it waits for the next one.
#[test]
fn handoff_lasts_until_the_next_receive() {
    use ictus_rt::thread::Policy;
    use ictus_rtipc::sys::{set_current_policy, thread_policy};
    if !privileged() {
        return;
    }
    let rt = RtSpace::new(Space::new());
    let port = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    let rt2 = rt.clone();
    let (tid_tx, tid_rx) = mpsc::channel();
    let server = thread::spawn(move || {
        set_current_policy(Policy::Fifo { priority: 3 }).expect("fifo");
        let mut r = rt2.associate(port, None).expect("associate");
        tid_tx.send(r.tid()).expect("tid");
        let mut req = r.request_buffer();
        while r.receive(&mut req, None).is_ok() {
            let during = thread_policy(0).expect("policy");
            let p = match during {
                Policy::Fifo { priority } => priority,
                _ => 0,
            };
            let _ = r.reply(&mut req, &[p]);
        }
    });
    let tid = tid_rx.recv().expect("tid");
    let rt3 = rt.clone();
    let during = thread::spawn(move || {
        set_current_policy(Policy::Fifo { priority: 33 }).expect("fifo");
        let mut c = rt3.connect(port).expect("connect");
        let mut reply = [0u8; 4];
        c.call(b"x", &mut reply, opts()).expect("call");
        reply[0]
    })
    .join()
    .expect("client");
    assert_eq!(during, 33);
    // Back to its own priority once it waits again (order of events, with a watchdog).
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while thread_policy(tid).ok() != Some(Policy::Fifo { priority: 3 }) {
        assert!(std::time::Instant::now() < until, "receiver stuck at {:?}", thread_policy(tid));
        thread::sleep(Duration::from_millis(1));
    }
    rt.destroy(port).expect("destroy");
    server.join().expect("server");
}

/// The fuzz target's seed corpus, replayed on stable with the fuzz target's checks.
#[test]
fn fuzz_corpus_replays() {
    use ictus_rtipc::wire::{RtHeader, RT_HEADER_LEN};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/rtipc_header");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let mut accepted = 0;
    for entry in entries.flatten() {
        let data = std::fs::read(entry.path()).expect("read seed");
        let Some((&nfds, bytes)) = data.split_first() else { continue };
        if let Ok(h) = RtHeader::parse(bytes, usize::from(nfds % 4)) {
            accepted += 1;
            assert_eq!(h.len as usize + RT_HEADER_LEN, bytes.len());
            assert_eq!(&h.encode()[..], &bytes[..RT_HEADER_LEN]);
        }
    }
    assert!(accepted >= 4, "the seeds hold valid messages");
}
