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
