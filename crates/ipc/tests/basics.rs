//! Single-process behaviour of ports, rights and messages, between threads.

use std::time::Duration;

use ictus_ipc::*;

fn rcv(space: &Space, port: Name) -> Received {
    let mut r = Received::new();
    space.receive(port, &mut r, watchdog()).expect("receive");
    r
}

/// Receive options that give up after a generous watchdog, never a measured duration.
fn watchdog() -> ReceiveOptions {
    ReceiveOptions { timeout: Some(Duration::from_secs(20)), ..Default::default() }
}

/// A server space with a port, and a client space with a send right to it:
/// `(server, port, client, the client's name for the port)`.
fn server_and_client() -> (Space, Name, Space, Name) {
    let s = Space::new();
    let p = s.allocate_port().unwrap();
    let client = Space::new();
    let (cp, _) = client.extract_right(&s, p, Disposition::MakeSend).unwrap();
    (s, p, client, cp)
}

#[test]
fn send_and_receive_inline_with_seqno_and_credentials() {
    let s = Space::new();
    let p = s.allocate_port_with_send().unwrap();
    for i in 0..3 {
        s.send(p, &mut Message::new(100 + i, vec![i as u8; 64]), SendOptions::default()).unwrap();
    }
    for i in 0..3 {
        let m = rcv(&s, p);
        assert_eq!(m.id, 100 + i);
        assert_eq!(m.data(), &vec![i as u8; 64][..]);
        assert_eq!(m.seqno, i as u64);
        assert_eq!(m.sender.pid, std::process::id());
        assert_eq!(m.port, p);
    }
}

#[test]
fn big_inline_and_ool_arrive_intact() {
    let s = Space::new();
    let p = s.allocate_port_with_send().unwrap();
    let big: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
    let mut m = Message::new(1, big.clone());
    let mut ool = OolBuffer::new(1 << 20).unwrap();
    for (i, b) in ool.iter_mut().enumerate() {
        *b = (i % 13) as u8;
    }
    m.ool.push(ool);
    s.send(p, &mut m, SendOptions::default()).unwrap();
    assert!(m.ool.is_empty(), "the buffer moved");
    let r = rcv(&s, p);
    assert_eq!(r.data(), &big[..]);
    assert_eq!(r.ool.len(), 1);
    assert!(r.ool[0].iter().enumerate().all(|(i, &b)| b == (i % 13) as u8));
}

#[test]
fn send_rights_coalesce_and_count() {
    let s = Space::new();
    let p = s.allocate_port().unwrap();
    let carrier = s.allocate_port_with_send().unwrap();
    let mut m = Message::new(1, vec![]);
    m.ports = vec![PortArg::new(p, Disposition::MakeSend), PortArg::new(p, Disposition::MakeSend)];
    s.send(carrier, &mut m, SendOptions::default()).unwrap();
    let r = rcv(&s, carrier);
    // Both rights land on the receive right's own name, as in Mach.
    assert_eq!(r.ports[0].name, p);
    assert_eq!(r.ports[1].name, p);
    assert_eq!(s.refs(p, RightKind::Send).unwrap(), 2);
    assert_eq!(s.port_status(p).unwrap().mscount, 2);
    s.mod_refs(p, RightKind::Send, -2).unwrap();
    assert_eq!(s.right_kinds(p).unwrap(), vec![RightKind::Receive]);
}

#[test]
fn destroying_receive_right_makes_dead_names() {
    let a = Space::new();
    let b = Space::new();
    let p = a.allocate_port().unwrap();
    let (n, kind) = b.extract_right(&a, p, Disposition::MakeSend).unwrap();
    assert_eq!(kind, RightKind::Send);
    a.destroy(p).unwrap();
    let err = b.send(n, &mut Message::new(1, vec![]), SendOptions::default()).unwrap_err();
    assert!(matches!(err, SendError::InvalidDest(_)), "{err}");
    assert_eq!(b.right_kinds(n).unwrap(), vec![RightKind::DeadName]);
    b.deallocate(n).unwrap();
    assert!(b.right_kinds(n).is_err());
}

#[test]
fn send_once_is_once_and_its_death_notifies() {
    let s = Space::new();
    let p = s.allocate_port().unwrap();
    let (so, _) = s.extract_right(&s, p, Disposition::MakeSendOnce).unwrap();
    s.send(so, &mut Message::new(5, vec![1]), SendOptions::default()).unwrap();
    assert!(s.right_kinds(so).is_err(), "a send-once right is consumed");
    assert_eq!(rcv(&s, p).id, 5);
    // A second send-once right dropped unused gives a send-once notification.
    let (so2, _) = s.extract_right(&s, p, Disposition::MakeSendOnce).unwrap();
    s.deallocate(so2).unwrap();
    let n = rcv(&s, p);
    assert_eq!(n.id, NotifyId::SendOnce.id());
}

#[test]
fn call_gets_reply_and_dead_server_is_an_error() {
    let s = Space::new();
    let p = s.allocate_port_with_send().unwrap();
    let server = {
        let s = s.clone();
        std::thread::spawn(move || {
            let req = rcv(&s, p);
            let reply = req.reply.unwrap();
            assert_eq!(reply.kind, RightKind::SendOnce);
            s.send(reply.name, &mut Message::new(req.id + 1, req.data().to_vec()), SendOptions::default()).unwrap();
            // Second request: drop its reply right unanswered.
            let req = rcv(&s, p);
            s.deallocate(req.reply.unwrap().name).unwrap();
        })
    };
    let mut reply = Received::new();
    s.call(p, &mut Message::new(10, b"ping".to_vec()), &mut reply, SendOptions::default(), ReceiveOptions::default())
        .unwrap();
    assert_eq!((reply.id, reply.data()), (11, &b"ping"[..]));
    let err = s
        .call(p, &mut Message::new(10, vec![]), &mut reply, SendOptions::default(), ReceiveOptions::default())
        .unwrap_err();
    assert!(matches!(err, CallError::ServerDied), "{err}");
    server.join().unwrap();
}

/// A dead-name request on the reply right of a call that came over a call channel
/// fires when the caller goes: the channel is watched twice then (by its port, and by
/// the request), which the notifier must allow.
#[test]
fn dead_name_on_a_call_channel_reply_right_fires_when_the_caller_goes() {
    let (s, p, client, cp) = server_and_client();
    let notify = s.allocate_port().unwrap();
    let server = {
        let s = s.clone();
        std::thread::spawn(move || {
            let first = rcv(&s, p);
            s.send(first.reply.unwrap().name, &mut Message::new(2, vec![]), SendOptions::default()).unwrap();
            let second = rcv(&s, p);
            let reply = second.reply.unwrap().name;
            s.request_notification(reply, NotifyKind::DeadName, Some(PortArg::new(notify, Disposition::MakeSendOnce)))
                .unwrap();
            reply
        })
    };
    let mut r = Received::new();
    client.call(cp, &mut Message::new(1, vec![]), &mut r, SendOptions::default(), ReceiveOptions::default()).unwrap();
    // The second call gives up; its channel goes with it.
    let quick = ReceiveOptions { timeout: Some(std::time::Duration::from_millis(300)), ..ReceiveOptions::default() };
    let err = client.call(cp, &mut Message::new(1, vec![]), &mut r, SendOptions::default(), quick).unwrap_err();
    assert!(matches!(err, CallError::Receive(ReceiveError::TimedOut)), "{err}");
    let reply = server.join().unwrap();
    let n = rcv(&s, notify);
    assert_eq!(n.id, NotifyId::DeadName.id());
    assert_eq!(NotifyId::parse_body(n.data()).map(|(name, _)| name), Some(reply));
}

/// A client that lets go of its send right while a call is under way does not keep the
/// call's channel afterwards: the port sees no senders once the call is answered.
#[test]
fn a_send_right_dropped_during_a_call_leaves_no_channel_behind() {
    let (s, p, client, cp) = server_and_client();
    let notify = s.allocate_port().unwrap();
    s.request_notification(p, NotifyKind::NoSenders, Some(PortArg::new(notify, Disposition::MakeSendOnce))).unwrap();
    let (got, got_rx) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let server = {
        let s = s.clone();
        std::thread::spawn(move || {
            for round in 0..2 {
                let req = rcv(&s, p);
                if round == 1 {
                    got.send(()).unwrap();
                    go_rx.recv().unwrap();
                }
                s.send(req.reply.unwrap().name, &mut Message::new(2, vec![]), SendOptions::default()).unwrap();
            }
        })
    };
    let caller = {
        let client = client.clone();
        std::thread::spawn(move || {
            let mut r = Received::new();
            for _ in 0..2 {
                client
                    .call(cp, &mut Message::new(1, vec![]), &mut r, SendOptions::default(), ReceiveOptions::default())
                    .unwrap();
            }
        })
    };
    // The second call (on the channel the first left in the pool) is with the server:
    // let go of the send right now, then let the server answer.
    got_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    client.deallocate(cp).unwrap();
    go.send(()).unwrap();
    caller.join().unwrap();
    server.join().unwrap();
    let n = rcv(&s, notify);
    assert_eq!(n.id, NotifyId::NoSenders.id());
}

/// Calls whose callers gave up before the server read them (their call channels closed
/// while the requests were queued) are delivered all the same, as Mach delivers a
/// message whose sender is gone: one on a kept channel, one that offered a new channel.
/// Their reply rights lead nowhere, so a reply fails with `InvalidDest` and leaves a dead
/// name; the port keeps the hung-up channels until the requests are read, then none, and
/// later calls work as before.
#[test]
fn requests_of_callers_that_hung_up_are_delivered_with_dead_replies() {
    let (s, p, client, cp) = server_and_client();
    let answer = move |s: &Space, id: i32| {
        let req = rcv(s, p);
        assert_eq!(req.id, id);
        s.send(req.reply.unwrap().name, &mut Message::new(id + 1, vec![]), SendOptions::default()).unwrap();
    };
    let server = {
        let s = s.clone();
        std::thread::spawn(move || answer(&s, 10))
    };
    let mut r = Received::new();
    client.call(cp, &mut Message::new(10, vec![]), &mut r, SendOptions::default(), watchdog()).unwrap();
    server.join().unwrap();
    assert_eq!(s.port_status(p).unwrap().channels, 1);
    // Nobody receives: both calls give up, and their channels close with them (the
    // first was the kept one, so the second offers a new one).
    let quick = ReceiveOptions { timeout: Some(Duration::from_millis(20)), ..ReceiveOptions::default() };
    for id in [20, 30] {
        let err = client.call(cp, &mut Message::new(id, vec![]), &mut r, SendOptions::default(), quick).unwrap_err();
        assert!(matches!(err, CallError::Receive(ReceiveError::TimedOut)), "{err}");
    }
    // The port saw the kept channel hang up, and keeps it for the queued request.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while s.port_status(p).unwrap().hung_up_channels != 1 {
        assert!(std::time::Instant::now() < until, "the hang-up was never seen: {:?}", s.port_status(p));
        std::thread::sleep(Duration::from_millis(1));
    }
    for id in [20, 30] {
        let req = rcv(&s, p);
        assert_eq!(req.id, id);
        let reply = req.reply.expect("a reply right");
        assert_eq!(reply.kind, RightKind::SendOnce);
        let err = s.send(reply.name, &mut Message::new(id + 1, vec![]), SendOptions::default()).unwrap_err();
        assert!(matches!(err, SendError::InvalidDest(n) if n == reply.name), "{err}");
        assert_eq!(s.right_kinds(reply.name).unwrap(), vec![RightKind::DeadName]);
        s.mod_refs(reply.name, RightKind::DeadName, -1).unwrap();
    }
    // The channel offered by the second call hangs up as soon as the port keeps it:
    // forgotten when the notifier sees that, nothing of either channel stays.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while s.port_status(p).unwrap().channels != 0 {
        assert!(std::time::Instant::now() < until, "a channel stayed: {:?}", s.port_status(p));
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = s.port_status(p).unwrap();
    assert_eq!((st.hung_up_channels, st.msgcount, st.connections), (0, 0, 1), "{st:?}");
    assert_eq!(s.stats().malformed, 0);
    // The client calls again, on a new channel.
    let server = {
        let s = s.clone();
        std::thread::spawn(move || answer(&s, 40))
    };
    client.call(cp, &mut Message::new(40, vec![]), &mut r, SendOptions::default(), watchdog()).unwrap();
    assert_eq!(r.id, 41);
    server.join().unwrap();
    assert_eq!(s.port_status(p).unwrap().channels, 1);
}

/// A caller that goes while the server waits on an empty queue: its channel is
/// forgotten then (a doorbell wakes the waiting receiver, which finds nothing of the
/// caller's unread), not only when the next message comes.
#[test]
fn the_channel_of_a_caller_gone_while_the_server_waits_is_forgotten() {
    let s = Space::new();
    let p = s.allocate_port_with_send().unwrap();
    let client = Space::new();
    let (cp, _) = client.extract_right(&s, p, Disposition::CopySend).unwrap();
    let server = {
        let s = s.clone();
        std::thread::spawn(move || {
            let req = rcv(&s, p);
            s.send(req.reply.unwrap().name, &mut Message::new(2, vec![]), SendOptions::default()).unwrap();
            // Waits here, on an empty queue, until the end.
            rcv(&s, p).id
        })
    };
    let mut r = Received::new();
    client.call(cp, &mut Message::new(1, vec![]), &mut r, SendOptions::default(), watchdog()).unwrap();
    assert_eq!(s.port_status(p).unwrap().channels, 1);
    drop(client);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while s.port_status(p).unwrap().channels != 0 {
        assert!(std::time::Instant::now() < until, "the channel stayed: {:?}", s.port_status(p));
        std::thread::sleep(Duration::from_millis(1));
    }
    s.send(p, &mut Message::new(3, vec![]), SendOptions::default()).unwrap();
    assert_eq!(server.join().unwrap(), 3);
    assert_eq!(s.stats().malformed, 0);
}

/// Replies of every shape reach a caller on its kept call channel: plain ones through
/// the channel's reply pipe; ones too big for a pipe write (in a datagram, or in a
/// memfd) and ones carrying rights on the connection, where the pipe sends the caller;
/// a forwarded reply right's answer after the port let go of the pipe; and a destroyed
/// one as `ServerDied`. Each reply is credited to the task that sent it.
#[test]
fn replies_of_every_shape_reach_a_kept_call_channel() {
    let (s, p, client, cp) = server_and_client();
    let helper = Space::new();
    let hp = helper.allocate_port().unwrap();
    let (to_helper, _) = s.extract_right(&helper, hp, Disposition::MakeSend).unwrap();
    let gift = s.allocate_port().unwrap();
    let big = vec![7u8; 100 << 10];
    let rounds = 9;
    let server = {
        let (s, big) = (s.clone(), big.clone());
        std::thread::spawn(move || {
            for round in 0..rounds {
                let req = rcv(&s, p);
                let to = req.reply.unwrap().name;
                let mut m = Message::new(100 + round, req.data().to_vec());
                match round {
                    3 => m.data = big.clone(),
                    7 => m.data = vec![9u8; 10 << 10],
                    4 => m.ports.push(PortArg::new(gift, Disposition::MakeSend)),
                    5 => {
                        // Forwarded: the helper task answers.
                        let mut fwd = Message::new(1, Vec::new());
                        fwd.ports.push(PortArg::new(to, Disposition::MoveSendOnce));
                        s.send(to_helper, &mut fwd, SendOptions::default()).unwrap();
                        continue;
                    }
                    6 => {
                        s.deallocate(to).unwrap();
                        continue;
                    }
                    _ => {}
                }
                s.send(to, &mut m, SendOptions::default()).unwrap();
            }
        })
    };
    let forwarder = {
        let helper = helper.clone();
        std::thread::spawn(move || {
            let fwd = rcv(&helper, hp);
            let right = fwd.ports[0];
            assert_eq!(right.kind, RightKind::SendOnce);
            helper
                .send(right.name, &mut Message::new(105, b"from the helper".to_vec()), SendOptions::default())
                .unwrap();
        })
    };
    let me = std::process::id();
    let mut r = Received::new();
    for round in 0..rounds {
        let data = format!("call {round}").into_bytes();
        let got = client.call(cp, &mut Message::new(1, data.clone()), &mut r, SendOptions::default(), watchdog());
        match round {
            6 => {
                assert!(matches!(got, Err(CallError::ServerDied)), "round 6: {got:?}");
                continue;
            }
            _ => got.unwrap_or_else(|e| panic!("round {round}: {e}")),
        }
        assert_eq!(r.id, 100 + round, "round {round}");
        assert_eq!(r.sender.pid, me, "round {round}");
        match round {
            3 => assert_eq!(r.data(), &big[..]),
            4 => {
                assert_eq!(r.ports.len(), 1);
                assert_eq!(r.ports[0].kind, RightKind::Send);
                assert_eq!(r.data(), &data[..]);
            }
            5 => assert_eq!(r.data(), b"from the helper"),
            7 => assert_eq!(r.data(), &[9u8; 10 << 10][..]),
            _ => assert_eq!(r.data(), &data[..], "round {round}"),
        }
    }
    server.join().unwrap();
    forwarder.join().unwrap();
}

// ----- queue limits, moved receive rights, message limits (issues 15 and 23) ----------------

/// Wait, without a measured duration, until `cond` holds (a generous watchdog).
#[track_caller]
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < until, "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Mach's queue limit, exactly: with qlimit N, N messages queue whoever sends them
/// (three client spaces, each with its own mapping of the port's queue page, and the
/// receiver itself), the next non-blocking send fails, a blocked sender wakes when one
/// message is received, and a send-once right is not held back. `msgcount` says how
/// many are queued all along.
#[test]
fn qlimit_is_exact_for_any_number_of_senders() {
    for qlimit in [1u32, 2, 5, 14] {
        let s = Space::new();
        let p = s.allocate_port().unwrap();
        s.set_qlimit(p, qlimit).unwrap();
        let clients: Vec<(Space, Name)> = (0..3)
            .map(|_| {
                let c = Space::new();
                let (cp, _) = c.extract_right(&s, p, Disposition::MakeSend).unwrap();
                (c, cp)
            })
            .collect();
        let mut sent = 0u32;
        'fill: loop {
            for (i, (c, cp)) in clients.iter().enumerate() {
                match c.send(*cp, &mut Message::new(i as i32, vec![i as u8; 64]), SendOptions::NONBLOCKING) {
                    Ok(()) => sent += 1,
                    Err(SendError::TimedOut) => break 'fill,
                    Err(e) => panic!("qlimit {qlimit}: {e}"),
                }
                assert!(sent <= qlimit, "qlimit {qlimit}: more messages queued than the limit");
            }
        }
        assert_eq!(sent, qlimit, "qlimit {qlimit}: messages queued before a sender was refused");
        assert_eq!(s.port_status(p).unwrap().msgcount, qlimit);
        for (c, cp) in &clients {
            let r = c.send(*cp, &mut Message::new(9, vec![0; 8]), SendOptions::NONBLOCKING);
            assert!(matches!(r, Err(SendError::TimedOut)), "qlimit {qlimit}: {r:?}");
        }
        // The receiver's own send right is held back the same way.
        s.insert_right(&s, p, p, Disposition::MakeSend).unwrap();
        let r = s.send(p, &mut Message::new(9, vec![0; 8]), SendOptions::NONBLOCKING);
        assert!(matches!(r, Err(SendError::TimedOut)), "qlimit {qlimit}: the receiver's own right: {r:?}");
        // A send-once right is not held back by the limit.
        let (once, _) = clients[0].0.extract_right(&s, p, Disposition::MakeSendOnce).unwrap();
        clients[0].0.send(once, &mut Message::new(50, vec![5; 8]), SendOptions::NONBLOCKING).unwrap();
        eventually("the send-once message is counted", || s.port_status(p).unwrap().msgcount == qlimit + 1);

        // Two blocked senders; each received message lets exactly one of them in.
        let blocked: Vec<_> = clients
            .iter()
            .take(2)
            .map(|(c, cp)| {
                let (c, cp) = (c.clone(), *cp);
                std::thread::spawn(move || c.send(cp, &mut Message::new(77, vec![7; 8]), SendOptions::default()))
            })
            .collect();
        let mut got = Vec::new();
        for round in 0..2 {
            got.push(rcv(&s, p).id);
            eventually("a blocked sender takes the place given back", || {
                s.port_status(p).unwrap().msgcount >= qlimit + u32::from(!got.contains(&50))
            });
            let status = s.port_status(p).unwrap();
            assert!(
                status.msgcount <= qlimit + u32::from(!got.contains(&50)),
                "qlimit {qlimit} round {round}: {} queued",
                status.msgcount
            );
        }
        // The rest: the queued ones, and whichever blocked sender is still waiting.
        while got.len() < qlimit as usize + 3 {
            got.push(rcv(&s, p).id);
            assert!(s.port_status(p).unwrap().msgcount <= qlimit, "qlimit {qlimit}: {got:?}");
        }
        for b in blocked {
            b.join().unwrap().unwrap();
        }
        let mut r = Received::new();
        let nothing = s.receive(p, &mut r, ReceiveOptions { timeout: Some(Duration::ZERO), ..Default::default() });
        assert!(matches!(nothing, Err(ReceiveError::TimedOut)), "qlimit {qlimit}: one message too many: {got:?}");
        assert_eq!(got.iter().filter(|&&id| id == 77).count(), 2);
        assert_eq!(got.iter().filter(|&&id| id == 50).count(), 1);
        assert_eq!(s.port_status(p).unwrap().msgcount, 0);
    }
}

/// A sender waiting on a full queue with a timeout gives up, and its place is not lost:
/// the queue takes exactly qlimit again afterwards.
#[test]
fn a_sender_that_gives_up_takes_no_place() {
    let (s, p, client, cp) = server_and_client();
    s.set_qlimit(p, 2).unwrap();
    for i in 0..2 {
        client.send(cp, &mut Message::new(i, vec![]), SendOptions::NONBLOCKING).unwrap();
    }
    let r = client.send(cp, &mut Message::new(2, vec![]), SendOptions { timeout: Some(Duration::from_millis(30)) });
    assert!(matches!(r, Err(SendError::TimedOut)), "{r:?}");
    assert_eq!(rcv(&s, p).id, 0);
    client.send(cp, &mut Message::new(3, vec![]), SendOptions::NONBLOCKING).unwrap();
    let r = client.send(cp, &mut Message::new(4, vec![]), SendOptions::NONBLOCKING);
    assert!(matches!(r, Err(SendError::TimedOut)), "{r:?}");
    assert_eq!((rcv(&s, p).id, rcv(&s, p).id), (1, 3));
}

/// Mach's rules for a moving receive right (`ipc_port_clear_receiver`): its sequence
/// number and make-send count start again at zero in the new holder, whether it moves
/// between spaces directly or in a message; queued messages, the queue limit and the
/// message limit go with it.
#[test]
fn a_moved_receive_right_starts_its_seqno_and_make_send_count_again() {
    for in_a_message in [false, true] {
        let (s, p, client, cp) = server_and_client();
        s.set_qlimit(p, 7).unwrap();
        s.set_message_limit(p, 1000).unwrap();
        for i in 0..3 {
            client.send(cp, &mut Message::new(i, vec![]), SendOptions::default()).unwrap();
        }
        assert_eq!(rcv(&s, p).seqno, 0);
        assert_eq!(rcv(&s, p).seqno, 1);
        let before = s.port_status(p).unwrap();
        assert_eq!((before.seqno, before.mscount, before.msgcount), (2, 1, 1));
        let t = Space::new();
        let q = if in_a_message {
            let carrier = t.allocate_port().unwrap();
            let (tc, _) = s.extract_right(&t, carrier, Disposition::MakeSend).unwrap();
            let mut m = Message::new(1, vec![]);
            m.ports = vec![PortArg::new(p, Disposition::MoveReceive)];
            s.send(tc, &mut m, SendOptions::default()).unwrap();
            let r = rcv(&t, carrier);
            assert_eq!(r.ports[0].kind, RightKind::Receive);
            r.ports[0].name
        } else {
            t.extract_right(&s, p, Disposition::MoveReceive).unwrap().0
        };
        let after = t.port_status(q).unwrap();
        assert_eq!(
            (after.seqno, after.mscount, after.qlimit, after.message_limit, after.msgcount),
            (0, 0, 7, 1000, 1),
            "in a message: {in_a_message}"
        );
        let r = rcv(&t, q);
        assert_eq!((r.id, r.seqno), (2, 0), "the first message the new holder receives");
        client.send(cp, &mut Message::new(3, vec![]), SendOptions::default()).unwrap();
        assert_eq!(rcv(&t, q).seqno, 1);
        // The old send right still reaches the port, and the limit still holds.
        let r = client.send(cp, &mut Message::new(4, vec![0; 1001]), SendOptions::default());
        assert!(matches!(r, Err(SendError::TooLarge { size: 1001, limit: 1000 })), "{r:?}");
    }
}

/// A port's message limit: a larger message is refused to its sender before anything
/// is sent, with the sizes; one at the limit arrives; big in-line data under a large
/// limit still arrives (mapped, and gone with the message).
#[test]
fn a_message_larger_than_the_port_takes_is_refused_to_its_sender() {
    let (s, p, client, cp) = server_and_client();
    assert_eq!(s.port_status(p).unwrap().message_limit, 1 << 30, "the default: the largest message");
    s.set_message_limit(p, 4096).unwrap();
    assert_eq!(s.port_status(p).unwrap().message_limit, 4096);
    let r = client.send(cp, &mut Message::new(1, vec![0; 4097]), SendOptions::default());
    match r {
        Err(e @ SendError::TooLarge { size: 4097, limit: 4096 }) => {
            assert_eq!(e.code(), ictus_abi::ReturnCode::SendTooLarge);
            assert!(e.to_string().contains("4096"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let mut r = Received::new();
    let mut m = Message::new(2, vec![1; 10]);
    let got = client.call(cp, &mut Message::new(3, vec![0; 5000]), &mut r, SendOptions::default(), watchdog());
    assert!(matches!(got, Err(CallError::Send(SendError::TooLarge { .. }))), "{got:?}");
    client.send(cp, &mut Message::new(4, vec![2; 4096]), SendOptions::default()).unwrap();
    assert_eq!(rcv(&s, p).data(), &[2; 4096][..]);
    assert!(matches!(s.set_message_limit(p, (1 << 30) + 1), Err(RightsError::InvalidValue)));
    s.set_message_limit(p, 8 << 20).unwrap();
    let big: Vec<u8> = (0..(6 << 20)).map(|i| (i % 253) as u8).collect();
    client.send(cp, &mut m, SendOptions::default()).unwrap();
    client.send(cp, &mut Message::new(5, big.clone()), SendOptions::default()).unwrap();
    assert_eq!(rcv(&s, p).id, 2);
    assert_eq!(rcv(&s, p).data(), &big[..]);
    assert_eq!(s.stats().too_large, 0, "every refusal happened at the sender");
}
