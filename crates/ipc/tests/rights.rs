//! Name-space operations and notifications within one process.

use std::time::Duration;

use ictus_ipc::*;

const WATCHDOG: Duration = Duration::from_secs(20);

fn rcv(space: &Space, port: Name) -> Received {
    let mut r = Received::new();
    space.receive(port, &mut r, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() }).expect("receive");
    r
}

fn notification(space: &Space, port: Name, id: NotifyId) -> (Name, u32) {
    let m = rcv(space, port);
    assert_eq!(m.id, id.id(), "expected {id:?}, got id {}", m.id);
    assert_eq!(m.sender.pid, std::process::id(), "notifications come from this task");
    NotifyId::parse_body(m.data()).expect("notification body")
}

#[test]
fn names_are_local_and_stale_names_fail() {
    let a = Space::new();
    let p = a.allocate_port_with_send().unwrap();
    a.destroy(p).unwrap();
    let q = a.allocate_port().unwrap();
    assert_eq!(p.index(), q.index(), "the slot is reused");
    assert_ne!(p, q, "under a new generation");
    assert!(matches!(a.right_kinds(p), Err(RightsError::InvalidName(_))));
    // Another space has nothing under these names.
    let b = Space::new();
    assert!(matches!(b.send(q, &mut Message::new(1, vec![]), SendOptions::default()), Err(SendError::InvalidDest(_))));
}

#[test]
fn mod_refs_limits() {
    let s = Space::new();
    let p = s.allocate_port_with_send().unwrap();
    assert_eq!(s.mod_refs(p, RightKind::Send, -2), Err(RightsError::InvalidValue));
    s.mod_refs(p, RightKind::Send, (UREFS_MAX - 1) as i32).unwrap();
    assert!(matches!(s.mod_refs(p, RightKind::Send, 1), Err(RightsError::UrefsOverflow(_))));
    assert_eq!(s.mod_refs(p, RightKind::SendOnce, 1), Err(RightsError::InvalidRight(p)));
    // Dropping the receive right leaves the send right under the same name, now dead.
    s.mod_refs(p, RightKind::Receive, -1).unwrap();
    assert_eq!(s.right_kinds(p).unwrap(), vec![RightKind::DeadName]);
    assert_eq!(s.refs(p, RightKind::DeadName).unwrap(), UREFS_MAX);
}

#[test]
fn insert_right_under_chosen_name_and_extract() {
    let a = Space::new();
    let b = Space::new();
    let p = a.allocate_port().unwrap();
    let chosen = Name::new(77, 3);
    a.insert_right(&b, chosen, p, Disposition::MakeSend).unwrap();
    assert_eq!(b.right_kinds(chosen).unwrap(), vec![RightKind::Send]);
    assert!(matches!(a.insert_right(&b, chosen, p, Disposition::MakeSend), Err(RightsError::NameExists(_))));
    // A refused move leaves the right where it was.
    assert!(matches!(a.insert_right(&b, chosen, p, Disposition::MoveReceive), Err(RightsError::NameExists(_))));
    assert_eq!(a.right_kinds(p).unwrap(), vec![RightKind::Receive]);
    b.send(chosen, &mut Message::new(9, vec![]), SendOptions::default()).unwrap();
    assert_eq!(rcv(&a, p).id, 9);
    // Move the receive right itself to b: the queued message goes with it, and the
    // receive right lands on the name b already uses for that port.
    a.send(p, &mut Message::new(10, vec![]), SendOptions::default()).unwrap();
    let (moved, kind) = b.extract_right(&a, p, Disposition::MoveReceive).unwrap();
    assert_eq!(kind, RightKind::Receive);
    assert_eq!(moved, chosen);
    assert!(a.right_kinds(p).is_err());
    assert_eq!(rcv(&b, moved).id, 10);
}

#[test]
fn receive_right_moves_in_a_message_with_its_queue() {
    let s = Space::new();
    let t = Space::new();
    let carrier = t.allocate_port().unwrap();
    let (to_t, _) = s.extract_right(&t, carrier, Disposition::MakeSend).unwrap();
    let p = s.allocate_port_with_send().unwrap();
    s.send(p, &mut Message::new(1, b"queued".to_vec()), SendOptions::default()).unwrap();
    let mut m = Message::new(2, vec![]);
    m.ports.push(PortArg::new(p, Disposition::MoveReceive));
    s.send(to_t, &mut m, SendOptions::default()).unwrap();
    // s keeps its send right; the name now denotes only that.
    assert_eq!(s.right_kinds(p).unwrap(), vec![RightKind::Send]);
    let got = rcv(&t, carrier);
    let r = got.ports[0];
    assert_eq!(r.kind, RightKind::Receive);
    let q = rcv(&t, r.name);
    assert_eq!((q.id, q.data(), q.seqno), (1, &b"queued"[..], 0));
    s.send(p, &mut Message::new(3, vec![]), SendOptions::default()).unwrap();
    assert_eq!(rcv(&t, r.name).seqno, 1, "the sequence number travelled too");
}

#[test]
fn dead_name_notification() {
    let s = Space::new();
    let other = Space::new();
    let notify = s.allocate_port().unwrap();
    let p = other.allocate_port().unwrap();
    let (n, _) = s.extract_right(&other, p, Disposition::MakeSend).unwrap();
    s.request_notification(n, NotifyKind::DeadName, Some(PortArg::new(notify, Disposition::MakeSendOnce))).unwrap();
    other.destroy(p).unwrap();
    let (name, _) = notification(&s, notify, NotifyId::DeadName);
    assert_eq!(name, n);
    assert_eq!(s.right_kinds(n).unwrap(), vec![RightKind::DeadName]);
    // One reference from the right, one carried by the notification.
    assert_eq!(s.refs(n, RightKind::DeadName).unwrap(), 2);
}

#[test]
fn no_senders_notification_when_last_send_right_goes() {
    let s = Space::new();
    let client = Space::new();
    let notify = s.allocate_port().unwrap();
    let p = s.allocate_port().unwrap();
    let (c1, _) = client.extract_right(&s, p, Disposition::MakeSend).unwrap();
    s.request_notification(p, NotifyKind::NoSenders, Some(PortArg::new(notify, Disposition::MakeSendOnce))).unwrap();
    client.send(c1, &mut Message::new(4, vec![]), SendOptions::default()).unwrap();
    client.deallocate(c1).unwrap();
    let (name, mscount) = notification(&s, notify, NotifyId::NoSenders);
    assert_eq!((name, mscount), (p, 1));
    // The message sent before the last right went is still there.
    assert_eq!(rcv(&s, p).id, 4);
    // A new send right can still be made; the port lives on.
    let (c2, _) = client.extract_right(&s, p, Disposition::MakeSend).unwrap();
    client.send(c2, &mut Message::new(5, vec![]), SendOptions::default()).unwrap();
    assert_eq!(rcv(&s, p).id, 5);
}

#[test]
fn no_senders_fires_at_once_when_none_exist() {
    let s = Space::new();
    let notify = s.allocate_port().unwrap();
    let p = s.allocate_port().unwrap();
    s.request_notification(p, NotifyKind::NoSenders, Some(PortArg::new(notify, Disposition::MakeSendOnce))).unwrap();
    assert_eq!(notification(&s, notify, NotifyId::NoSenders).0, p);
}

#[test]
fn port_destroyed_notification_hands_the_receive_right_on() {
    let s = Space::new();
    let notify = s.allocate_port().unwrap();
    let p = s.allocate_port_with_send().unwrap();
    s.send(p, &mut Message::new(6, vec![]), SendOptions::default()).unwrap();
    s.request_notification(p, NotifyKind::PortDestroyed, Some(PortArg::new(notify, Disposition::MakeSendOnce)))
        .unwrap();
    s.mod_refs(p, RightKind::Receive, -1).unwrap();
    let m = rcv(&s, notify);
    assert_eq!(m.id, NotifyId::PortDestroyed.id());
    assert_eq!(m.ports.len(), 1);
    assert_eq!(m.ports[0].kind, RightKind::Receive);
    // The receive right came back under the name that still held the send right.
    assert_eq!(m.ports[0].name, p);
    assert_eq!(rcv(&s, p).id, 6);
}

#[test]
fn port_set_receives_from_members_and_is_pollable() {
    let s = Space::new();
    let set = s.allocate_port_set().unwrap();
    let a = s.allocate_port_with_send().unwrap();
    let b = s.allocate_port_with_send().unwrap();
    s.move_member(a, set).unwrap();
    s.move_member(b, set).unwrap();
    let mut members = s.set_members(set).unwrap();
    members.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(members, want);
    let fd = s.pollable_fd(set).unwrap();
    let mut pfd = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
    let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
    assert_eq!(rustix::event::poll(&mut pfd, Some(&zero)).unwrap(), 0, "nothing queued yet");
    s.send(b, &mut Message::new(2, vec![]), SendOptions::default()).unwrap();
    let w = rustix::event::Timespec { tv_sec: 20, tv_nsec: 0 };
    assert_eq!(rustix::event::poll(&mut pfd, Some(&w)).unwrap(), 1, "readable once a member has a message");
    let m = rcv(&s, set);
    assert_eq!((m.id, m.port), (2, b));
    s.send(a, &mut Message::new(1, vec![]), SendOptions::default()).unwrap();
    let m = rcv(&s, set);
    assert_eq!((m.id, m.port), (1, a));
    s.move_member(a, Name::NULL).unwrap();
    assert_eq!(s.set_members(set).unwrap(), vec![b]);
}

#[test]
fn receive_times_out_and_bad_names_are_refused() {
    let s = Space::new();
    let p = s.allocate_port_with_send().unwrap();
    let mut r = Received::new();
    let e = s
        .receive(p, &mut r, ReceiveOptions { timeout: Some(Duration::from_millis(1)), ..Default::default() })
        .unwrap_err();
    assert!(matches!(e, ReceiveError::TimedOut));
    assert_eq!(e.code(), ReturnCode::RcvTimedOut);
    let e = s.receive(Name::new(999, 1), &mut r, ReceiveOptions::default()).unwrap_err();
    assert!(matches!(e, ReceiveError::InvalidName(_)));
}

#[test]
fn reply_port_receives_through_a_made_send_once_right() {
    let s = Space::new();
    let service = s.allocate_port_with_send().unwrap();
    let reply_port = s.allocate_port().unwrap();
    let mut req = Message::new(1, vec![]);
    req.reply = Some(PortArg::new(reply_port, Disposition::MakeSendOnce));
    s.send(service, &mut req, SendOptions::default()).unwrap();
    assert_eq!(s.port_status(reply_port).unwrap().sorights, 1);
    let got = rcv(&s, service);
    let r = got.reply.unwrap();
    assert_eq!(r.kind, RightKind::SendOnce);
    s.send(r.name, &mut Message::new(2, vec![]), SendOptions::default()).unwrap();
    assert_eq!(rcv(&s, reply_port).id, 2);
    assert_eq!(s.port_status(reply_port).unwrap().sorights, 0);
}

#[test]
fn a_failed_move_leaves_the_receive_right_in_its_set() {
    let s = Space::new();
    let t = Space::new();
    let set = s.allocate_port_set().unwrap();
    let p = s.allocate_port_with_send().unwrap();
    s.move_member(p, set).unwrap();
    let q = t.allocate_port().unwrap();
    let (dead, _) = s.extract_right(&t, q, Disposition::MakeSend).unwrap();
    t.destroy(q).unwrap();
    let mut m = Message::new(1, vec![]);
    m.ports.push(PortArg::new(p, Disposition::MoveReceive));
    assert!(matches!(s.send(dead, &mut m, SendOptions::default()), Err(SendError::InvalidDest(_))));
    assert_eq!(s.right_kinds(p).unwrap(), vec![RightKind::Receive, RightKind::Send]);
    assert_eq!(s.set_members(set).unwrap(), vec![p]);
    s.send(p, &mut Message::new(7, vec![]), SendOptions::default()).unwrap();
    assert_eq!(rcv(&s, set).id, 7);
}
