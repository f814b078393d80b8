//! Real-time port sets within one process: the most urgent message across members,
//! moving ports in and out, the paper's errors, dissociation, clients that go away, and
//! hand-off and inheritance through a set receiver.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use ictus_ipc::{Name, ReturnCode, Space};
use ictus_rtipc::{
    AssociateError, Handoff, MemberError, PortAttrs, Queueing, ReceiveError, RtSpace, SendOptions, MAX_MESSAGE,
};

const WATCHDOG: Option<Duration> = Some(Duration::from_secs(30));

fn opts() -> SendOptions {
    SendOptions { timeout: WATCHDOG, ..SendOptions::default() }
}

/// Queues one asynchronous message of priority `p` (body `[p]`) on `port`, from its own
/// connection, before anyone receives.
fn send_at(rt: &RtSpace, port: Name, p: u8) -> ictus_rtipc::RtClient {
    let mut c = rt.connect(port).expect("connect");
    c.send(&[p], SendOptions { priority: Some(p), ..opts() }).expect("send");
    c
}

/// A thread associated with `set` that receives `n` messages: (member, body[0]).
fn receive_n(rt: &RtSpace, set: Name, n: usize) -> Vec<(Name, u8)> {
    let rt = rt.clone();
    thread::spawn(move || {
        let mut r = rt.associate_set(set, None).expect("associate with the set");
        let mut req = r.request_buffer();
        (0..n)
            .map(|_| {
                let from = r.receive(&mut req, WATCHDOG).expect("receive");
                (from, req.data()[0])
            })
            .collect()
    })
    .join()
    .expect("receiver")
}

#[test]
fn a_set_receiver_takes_the_most_urgent_message_across_members() {
    let rt = RtSpace::new(Space::new());
    let msg = |q| PortAttrs::new(q, Handoff::Message);
    let a = rt.allocate(msg(Queueing::Priority)).expect("allocate");
    let b = rt.allocate(msg(Queueing::PriorityInheritance)).expect("allocate");
    let set = rt.allocate_set().expect("allocate set");
    rt.move_member(a, set).expect("a into the set");
    rt.move_member(b, set).expect("b into the set");
    assert_eq!(rt.set_members(set).expect("members"), vec![a, b]);
    let _c: Vec<_> = [(a, 10), (b, 30), (a, 20), (b, 5), (a, 25)].iter().map(|&(p, x)| send_at(&rt, p, x)).collect();
    let got = receive_n(&rt, set, 5);
    // Priority order across both ports.
    assert_eq!(got, vec![(b, 30), (a, 25), (a, 20), (a, 10), (b, 5)]);
    for p in [a, b] {
        let s = rt.stats(p).expect("stats");
        assert_eq!((s.free_buffers, s.waiting), (s.buffers, 0));
    }
}

#[test]
fn fifo_members_keep_arrival_order_and_count_as_priority_zero() {
    // Only FIFO members: arrival order across ports, priorities ignored.
    let rt = RtSpace::new(Space::new());
    let fifo = PortAttrs::new(Queueing::Fifo, Handoff::Message);
    let a = rt.allocate(fifo).expect("allocate");
    let b = rt.allocate(fifo).expect("allocate");
    let set = rt.allocate_set().expect("allocate set");
    rt.move_member(a, set).expect("move");
    rt.move_member(b, set).expect("move");
    let _c: Vec<_> = [(a, 10), (b, 30), (a, 20), (b, 5), (a, 40)].iter().map(|&(p, x)| send_at(&rt, p, x)).collect();
    let got = receive_n(&rt, set, 5);
    // Each member's messages in arrival order, whatever their priorities (a priority
    // order would give 40 and 30 first). Across members the order is the one the set
    // read them in (see `doc/rt-ipc.md`).
    let of = |port: Name| got.iter().filter(|(n, _)| *n == port).map(|(_, x)| *x).collect::<Vec<_>>();
    assert_eq!(of(a), vec![10, 20, 40]);
    assert_eq!(of(b), vec![30, 5]);

    // A FIFO member beside a priority member: the FIFO port's messages compete at
    // priority 0, in arrival order with the priority member's priority-0 messages.
    let rt = RtSpace::new(Space::new());
    let f = rt.allocate(fifo).expect("allocate");
    let p = rt.allocate(PortAttrs::new(Queueing::Priority, Handoff::Message)).expect("allocate");
    let set = rt.allocate_set().expect("allocate set");
    rt.move_member(f, set).expect("move");
    rt.move_member(p, set).expect("move");
    let _c: Vec<_> = [(f, 50), (p, 0), (p, 7), (f, 60), (p, 1)].iter().map(|&(n, x)| send_at(&rt, n, x)).collect();
    let got = receive_n(&rt, set, 5);
    // The priority member's messages above 0 first, by priority; then the priority-0
    // ones, the FIFO member's in their arrival order.
    assert_eq!(got[..2], [(p, 7), (p, 1)]);
    let rest: Vec<_> = got[2..].iter().filter(|(n, _)| *n == f).map(|(_, x)| *x).collect();
    assert_eq!(rest, vec![50, 60]);
    assert!(got[2..].contains(&(p, 0)));
}

#[test]
fn calls_through_a_set_round_trip_under_every_policy() {
    let rt = RtSpace::new(Space::new());
    let set = rt.allocate_set().expect("allocate set");
    let mut ports = Vec::new();
    for q in [Queueing::Fifo, Queueing::Priority, Queueing::PriorityInheritance] {
        for h in [Handoff::Off, Handoff::Sender, Handoff::Message] {
            let port = rt.allocate(PortAttrs::new(q, h)).expect("allocate");
            rt.move_member(port, set).expect("move");
            ports.push(port);
        }
    }
    let rt2 = rt.clone();
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        let mut r = rt2.associate_set(set, None).expect("associate");
        tx.send(()).expect("ready");
        let mut req = r.request_buffer();
        while let Ok(from) = r.receive(&mut req, None) {
            let mut out = req.data().to_vec();
            out.extend_from_slice(&from.0.to_le_bytes());
            let _ = r.reply(&mut req, &out);
        }
    });
    rx.recv().expect("ready");
    let mut reply = [0u8; 16];
    for &port in &ports {
        let mut c = rt.connect(port).expect("connect");
        for i in 0..20u8 {
            let n = c.call(&[i], &mut reply, opts()).expect("call");
            assert_eq!(reply[0], i);
            assert_eq!(&reply[1..n], &port.0.to_le_bytes());
        }
    }
    rt.destroy(set).expect("destroy set");
    server.join().expect("server");
    // The members live on, out of the set, with every buffer free.
    for &port in &ports {
        let s = rt.stats(port).expect("stats");
        assert_eq!(s.free_buffers, s.buffers);
    }
}

#[test]
fn a_port_moved_out_of_the_set_is_no_longer_received_through_it() {
    let rt = RtSpace::new(Space::new());
    let a = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    let b = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    let set = rt.allocate_set().expect("allocate set");
    rt.move_member(a, set).expect("move");
    rt.move_member(b, set).expect("move");
    // While in the set, the port is received from only through the set.
    assert!(matches!(rt.associate(a, None), Err(AssociateError::InSet)));
    let mut ca = rt.connect(a).expect("connect");
    let mut cb = rt.connect(b).expect("connect");
    ca.send(b"a1", opts()).expect("send");
    let (to_rx, from_test) = mpsc::channel::<()>();
    let (to_test, results) = mpsc::channel::<Result<(Name, Vec<u8>), ReceiveError>>();
    let rt2 = rt.clone();
    let receiver = thread::spawn(move || {
        let mut r = rt2.associate_set(set, None).expect("associate");
        let mut req = r.request_buffer();
        while from_test.recv().is_ok() {
            let got = r.receive(&mut req, Some(Duration::from_millis(200))).map(|n| (n, req.data().to_vec()));
            to_test.send(got).expect("result");
        }
    });
    to_rx.send(()).expect("go");
    assert_eq!(results.recv().expect("result").expect("a1"), (a, b"a1".to_vec()));
    // Out of the set (Name::NULL: out of any set).
    rt.move_member(a, Name::NULL).expect("move out");
    assert_eq!(rt.set_members(set).expect("members"), vec![b]);
    ca.send(b"a2", opts()).expect("send");
    cb.send(b"b1", opts()).expect("send");
    to_rx.send(()).expect("go");
    assert_eq!(results.recv().expect("result").expect("b1"), (b, b"b1".to_vec()));
    to_rx.send(()).expect("go");
    assert!(matches!(results.recv().expect("result"), Err(ReceiveError::TimedOut)));
    // The port's own receiver gets what was sent to it after it left.
    let rt3 = rt.clone();
    let own = thread::spawn(move || {
        let mut r = rt3.associate(a, None).expect("associate with the port again");
        // Now it has a receiver of its own: it cannot join a set.
        assert!(matches!(rt3.move_member(a, set), Err(MemberError::Associated(n)) if n == a));
        let mut req = r.request_buffer();
        r.receive(&mut req, WATCHDOG).expect("receive");
        req.data().to_vec()
    });
    assert_eq!(own.join().expect("own receiver"), b"a2");
    drop(to_rx);
    receiver.join().expect("receiver");
    // Moving into the set it is already in, and from one set into another.
    let other = rt.allocate_set().expect("allocate set");
    rt.move_member(b, set).expect("no-op");
    rt.move_member(b, other).expect("move across");
    assert!(rt.set_members(set).expect("members").is_empty());
    assert_eq!(rt.set_members(other).expect("members"), vec![b]);
    // Destroying a member takes it out of its set.
    rt.destroy(b).expect("destroy");
    assert!(rt.set_members(other).expect("members").is_empty());
}

#[test]
fn plain_ports_and_plain_port_sets_are_refused_with_the_papers_errors() {
    let space = Space::new();
    let rt = RtSpace::new(space.clone());
    let plain_set = space.allocate_port_set().expect("plain set");
    let plain_port = space.allocate_port_with_send().expect("plain port");
    let rt_port = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    let rt_set = rt.allocate_set().expect("allocate set");
    // Associating with a plain port set: KERN_INVALID_NAME, as in the paper.
    let e = rt.associate_set(plain_set, None).expect_err("plain set");
    assert!(matches!(e, AssociateError::InvalidName(n) if n == plain_set));
    assert_eq!(e.code(), ReturnCode::InvalidName);
    assert!(matches!(rt.associate_set(rt_port, None), Err(AssociateError::InvalidName(_))));
    assert!(matches!(rt.associate(rt_set, None), Err(AssociateError::InvalidName(_))));
    // Moving: a plain port or a plain set is the wrong right (KERN_INVALID_RIGHT).
    let e = rt.move_member(plain_port, rt_set).expect_err("plain port");
    assert!(matches!(e, MemberError::InvalidRight(n) if n == plain_port));
    assert_eq!(e.code(), ReturnCode::InvalidRight);
    let e = rt.move_member(rt_port, plain_set).expect_err("plain set");
    assert!(matches!(e, MemberError::InvalidRight(n) if n == plain_set));
    assert!(matches!(rt.move_member(rt_set, rt_set), Err(MemberError::InvalidRight(_))));
    assert!(matches!(rt.set_members(plain_set), Err(MemberError::InvalidRight(_))));
    // A name that denotes nothing: KERN_INVALID_NAME.
    let gone = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    rt.destroy(gone).expect("destroy");
    let e = rt.move_member(gone, rt_set).expect_err("nothing");
    assert!(matches!(e, MemberError::InvalidName(n) if n == gone));
    assert_eq!(e.code(), ReturnCode::InvalidName);
    assert!(rt.set_members(rt_set).expect("members").is_empty());
    // The plain set's members are untouched by all this.
    assert!(space.set_members(plain_set).expect("plain members").is_empty());
}

#[test]
fn threads_dissociate_from_a_set() {
    let rt = RtSpace::new(Space::new());
    let a = rt.allocate(PortAttrs::FIFO_OFF).expect("allocate");
    let set = rt.allocate_set().expect("allocate set");
    rt.move_member(a, set).expect("move");
    let mut r = rt.associate_set(set, None).expect("associate");
    // One association per thread: a port or a set.
    assert!(matches!(rt.associate_set(set, None), Err(AssociateError::AlreadyAssociated)));
    let b = rt.allocate(PortAttrs::FIFO_OFF).expect("allocate");
    assert!(matches!(rt.associate(b, None), Err(AssociateError::AlreadyAssociated)));
    assert_eq!(rt.set_receivers(set), Some(1));
    let mut req = r.request_buffer();
    assert_eq!(req.data().len(), 0);
    assert!(matches!(r.receive(&mut req, Some(Duration::from_millis(10))), Err(ReceiveError::TimedOut)));
    r.dissociate();
    assert_eq!(rt.set_receivers(set), Some(0));
    // Free to associate with a port now, and with the set again.
    let rb = rt.associate(b, None).expect("associate with a port");
    let mut small = rb.request_buffer();
    drop(rb);
    let mut r = rt.associate_set(set, None).expect("associate again");
    assert!(matches!(
        r.receive(&mut small, Some(Duration::from_millis(10))),
        Err(ReceiveError::BufferTooSmall { need, .. }) if need == MAX_MESSAGE as usize
    ));
    // Messages sent while nobody is associated wait for the next receiver.
    let mut c = rt.connect(a).expect("connect");
    c.send(b"later", opts()).expect("send");
    let mut req = r.request_buffer();
    assert_eq!(r.receive(&mut req, WATCHDOG).expect("receive"), a);
    assert_eq!(req.data(), b"later");
    drop(r);
    // Destroying the set ends a waiting receiver with PortDied.
    let rt2 = rt.clone();
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let mut r = rt2.associate_set(set, None).expect("associate");
        tx.send(()).expect("ready");
        let mut req = r.request_buffer();
        r.receive(&mut req, WATCHDOG)
    });
    rx.recv().expect("ready");
    rt.destroy(set).expect("destroy");
    assert!(matches!(waiter.join().expect("waiter"), Err(ReceiveError::PortDied)));
    assert!(matches!(rt.associate_set(set, None), Err(AssociateError::InvalidName(_))));
}

#[test]
fn clients_that_go_away_leave_no_state_in_the_members() {
    let rt = RtSpace::new(Space::new());
    let set = rt.allocate_set().expect("allocate set");
    let a = rt.allocate(PortAttrs::BPI_ON).expect("allocate");
    let b = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    rt.move_member(a, set).expect("move");
    rt.move_member(b, set).expect("move");
    let stop = Arc::new(AtomicBool::new(false));
    let rt2 = rt.clone();
    let stop2 = Arc::clone(&stop);
    let server = thread::spawn(move || {
        let mut r = rt2.associate_set(set, None).expect("associate");
        let mut req = r.request_buffer();
        while !stop2.load(Ordering::SeqCst) {
            if r.receive(&mut req, Some(Duration::from_millis(5))).is_ok() && req.sync {
                let _ = r.reply(&mut req, b"ok");
            }
        }
    });
    for round in 0..3 {
        for port in [a, b] {
            let mut c = rt.connect(port).expect("connect");
            let mut reply = [0u8; 8];
            c.call(b"hello", &mut reply, opts()).expect("call");
            // Messages left behind by a client that then goes away.
            for _ in 0..round + 2 {
                c.send(b"bye", opts()).expect("send");
            }
            drop(c);
        }
    }
    let until = Instant::now() + Duration::from_secs(30);
    for port in [a, b] {
        loop {
            let s = rt.stats(port).expect("stats");
            if s.connections == 0 && s.free_buffers == s.buffers && s.waiting == 0 {
                break;
            }
            assert!(Instant::now() < until, "stale state in {port}: {s:?}");
            thread::sleep(Duration::from_millis(2));
        }
    }
    stop.store(true, Ordering::SeqCst);
    server.join().expect("server");
}

fn privileged() -> bool {
    let ok = ictus_rt::thread::rt_privileges();
    if !ok {
        println!("skipped: SCHED_FIFO is refused here (needs root, CAP_SYS_NICE or RLIMIT_RTPRIO)");
    }
    ok
}

/// Hand-off through a set: the set receiver runs at the caller's priority for the
/// request, and the kernel boosts it (PI futex) for a caller of another member that
/// waits while it is busy.
#[test]
fn set_receivers_are_raised_and_inherit_like_port_receivers() {
    use ictus_rt::thread::Policy;
    use ictus_rtipc::sys::{effective_priority, set_current_policy, thread_policy};
    if !privileged() {
        return;
    }
    let rt = RtSpace::new(Space::new());
    let set = rt.allocate_set().expect("allocate set");
    let on = rt.allocate(PortAttrs::PRIO_ON).expect("allocate");
    let hold_port = rt.allocate(PortAttrs::new(Queueing::PriorityInheritance, Handoff::Off)).expect("allocate");
    let bpi = rt.allocate(PortAttrs::new(Queueing::PriorityInheritance, Handoff::Off)).expect("allocate");
    for p in [on, hold_port, bpi] {
        rt.move_member(p, set).expect("move");
    }
    let released = Arc::new(AtomicBool::new(false));
    let (tid_tx, tid_rx) = mpsc::channel();
    let rt2 = rt.clone();
    let released2 = Arc::clone(&released);
    let (held_tx, held_rx) = mpsc::channel();
    let server = thread::spawn(move || {
        set_current_policy(Policy::Fifo { priority: 3 }).expect("fifo");
        let mut r = rt2.associate_set(set, None).expect("associate");
        tid_tx.send(r.tid()).expect("tid");
        let mut req = r.request_buffer();
        while r.receive(&mut req, None).is_ok() {
            if req.data() == b"hold" {
                held_tx.send(()).expect("held");
                let until = Instant::now() + Duration::from_secs(60);
                while !released2.load(Ordering::SeqCst) && Instant::now() < until {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            let p = match thread_policy(0).expect("policy") {
                Policy::Fifo { priority } => priority,
                _ => 0,
            };
            let _ = r.reply(&mut req, &[p]);
        }
    });
    let tid = tid_rx.recv().expect("tid");
    let call_at = |port: Name, prio: u8, body: &'static [u8]| {
        let rt = rt.clone();
        thread::spawn(move || {
            set_current_policy(Policy::Fifo { priority: prio }).expect("fifo");
            let mut c = rt.connect(port).expect("connect");
            let mut reply = [0u8; 4];
            c.call(body, &mut reply, opts()).expect("call");
            reply[0]
        })
    };
    // Hand-off: raised to the caller's 33 while serving it.
    assert_eq!(call_at(on, 33, b"x").join().expect("client"), 33);
    // Inheritance: busy with a held request from one member, a caller at 40 on another
    // member waits in FUTEX_LOCK_PI on a word naming the set receiver: the kernel
    // raises it (prio field -1 - 40) while it still serves the held request.
    let holder = call_at(hold_port, 1, b"hold");
    let pid = std::process::id();
    held_rx.recv_timeout(Duration::from_secs(30)).expect("set receiver never took the held request");
    let waiter = call_at(bpi, 40, b"y");
    let until = Instant::now() + Duration::from_secs(30);
    while effective_priority(pid, tid) != Some(-41) {
        assert!(Instant::now() < until, "no boost: prio field {:?}", effective_priority(pid, tid));
        thread::sleep(Duration::from_millis(1));
    }
    released.store(true, Ordering::SeqCst);
    holder.join().expect("holder");
    waiter.join().expect("waiter");
    // Back to its own priority once it waits again.
    let until = Instant::now() + Duration::from_secs(30);
    while thread_policy(tid).ok() != Some(Policy::Fifo { priority: 3 }) {
        assert!(Instant::now() < until, "receiver stuck at {:?}", thread_policy(tid));
        thread::sleep(Duration::from_millis(1));
    }
    rt.destroy(set).expect("destroy");
    server.join().expect("server");
}

#[test]
fn several_receivers_share_a_set() {
    let rt = RtSpace::new(Space::new());
    let set = rt.allocate_set().expect("allocate set");
    let a = rt.allocate(PortAttrs::BPI_ON).expect("allocate");
    let b = rt.allocate(PortAttrs::new(Queueing::Fifo, Handoff::Off)).expect("allocate");
    rt.move_member(a, set).expect("move");
    rt.move_member(b, set).expect("move");
    let (ready_tx, ready_rx) = mpsc::channel();
    let servers: Vec<_> = (0..2)
        .map(|_| {
            let rt = rt.clone();
            let ready = ready_tx.clone();
            thread::spawn(move || {
                let mut r = rt.associate_set(set, None).expect("associate");
                ready.send(()).expect("ready");
                let mut req = r.request_buffer();
                let mut served = 0u32;
                while r.receive(&mut req, None).is_ok() {
                    let out = req.data().to_vec();
                    let _ = r.reply(&mut req, &out);
                    served += 1;
                }
                served
            })
        })
        .collect();
    for _ in 0..2 {
        ready_rx.recv().expect("server ready");
    }
    assert_eq!(rt.set_receivers(set), Some(2));
    let clients: Vec<_> = (0..4u8)
        .map(|i| {
            let rt = rt.clone();
            let port = if i % 2 == 0 { a } else { b };
            thread::spawn(move || {
                let mut c = rt.connect(port).expect("connect");
                let mut reply = [0u8; 8];
                for j in 0..50u8 {
                    let n = c.call(&[i, j], &mut reply, opts()).expect("call");
                    assert_eq!(&reply[..n], &[i, j]);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    rt.destroy(set).expect("destroy");
    let served: u32 = servers.into_iter().map(|s| s.join().expect("server")).sum();
    assert_eq!(served, 200);
    for p in [a, b] {
        let s = rt.stats(p).expect("stats");
        assert_eq!((s.free_buffers, s.waiting), (s.buffers, 0), "{s:?}");
    }
}
