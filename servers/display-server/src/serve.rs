//! The three transports, one thread each, all executing requests through
//! [`Session::execute`] on the shared [`Core`].

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ictus_display::{proto, service, Transport};
use ictus_ipc::{
    Disposition, Message, Name, NotifyKind, PortArg, ReceiveOptions, Received, RightKind, SendOptions, Space,
};
use ictus_shm::{ClientId, Event, Next};
use rustix::event::epoll;

use crate::core::{lock, Core, FrameSrc, Out, Outbox, Session, Waker};

/// Largest record of messages sent to a shared-memory client at once.
const SHM_OUT_MAX: usize = 16 << 10;

/// Take up to `max` bytes of plain messages from an outbox, in order.
fn take_msgs(outbox: &Outbox, max: usize) -> Vec<u8> {
    let mut q = lock(&outbox.q);
    let mut bytes = Vec::new();
    while let Some(Out::Msg(m)) = q.front() {
        if !bytes.is_empty() && bytes.len() + m.len() > max {
            break;
        }
        let Some(Out::Msg(m)) = q.pop_front() else { unreachable!() };
        bytes.extend_from_slice(&m);
    }
    bytes
}

fn put_back(outbox: &Outbox, bytes: Vec<u8>) {
    if !bytes.is_empty() {
        lock(&outbox.q).push_front(Out::Msg(bytes));
    }
}

// ---------------------------------------------------------------- shared memory

/// The shared-memory transport: every client's ring, one server flag, one thread.
pub(crate) fn shm_loop(core: Arc<Core>, mut server: ictus_shm::Server, liveness: Duration) {
    let mut sessions: HashMap<ClientId, Session> = HashMap::new();
    let mut backdoor: Option<ClientId> = None;
    let mut batch = Vec::with_capacity(64 << 10);
    let waker = || lock(&core.shm_waker).clone();
    while !core.stop.load(Ordering::Acquire) {
        if let Err(e) = server.wait(Some(liveness)) {
            eprintln!("ictus display: shared-memory transport stops: {e}");
            break;
        }
        for h in std::mem::take(&mut *lock(&core.release)) {
            server.release(h);
        }
        loop {
            let mut close = None;
            let event = match server.try_next() {
                None => break,
                Some(Next::Event(e)) => Some(e),
                Some(Next::Record(r)) => {
                    let id = r.client();
                    match sessions.get_mut(&id) {
                        _ if Some(id) == backdoor => {}
                        None => {}
                        Some(s) => match (r.tag(), r.is_pool()) {
                            (service::TAG_ATTACH, true) => {
                                let seg = s.channel_seg;
                                if let Some(held) = r.hold() {
                                    s.attach(&core, FrameSrc::Held { held, seg });
                                }
                            }
                            (service::TAG_BATCH, false) => {
                                // Shared memory the client can still write: copy, then parse.
                                batch.clear();
                                batch.resize(r.payload().len(), 0);
                                r.payload().copy_to(&mut batch);
                                drop(r);
                                if s.execute(&core, &batch).is_err() {
                                    close = Some(id);
                                }
                            }
                            _ => close = Some(id),
                        },
                    }
                    None
                }
            };
            match event {
                Some(Event::Opened { client, geometry, .. }) => {
                    if backdoor.is_none() {
                        // The first channel is the server's own (see `Waker::Shm`).
                        backdoor = Some(client);
                        continue;
                    }
                    let Some(w) = waker() else { continue };
                    let mut s = Session::new(&core, Outbox::new(w));
                    if let (Some(x), true) = (&core.x, geometry.pool.slots > 0) {
                        if x.has_shm() && geometry.total() <= u64::from(u32::MAX) {
                            if let Some(fd) = server.channel_fd(client) {
                                s.channel_seg = x.attach(fd).ok();
                                let _ = x.flush();
                            }
                        }
                    }
                    sessions.insert(client, s);
                }
                Some(Event::Closed { client, .. }) => {
                    if let Some(s) = sessions.remove(&client) {
                        s.close(&core);
                    }
                }
                None => {}
            }
            if let Some(id) = close {
                core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
                server.close(id);
            }
        }
        // Deliver what waits.
        let mut cut = Vec::new();
        for (id, s) in &sessions {
            loop {
                let bytes = take_msgs(&s.outbox, SHM_OUT_MAX);
                if bytes.is_empty() {
                    break;
                }
                match server.send_to(*id, 1, &bytes) {
                    Ok(()) => {}
                    Err(ictus_shm::ReplyError::Full) => {
                        put_back(&s.outbox, bytes);
                        if lock(&s.outbox.q).len() > core.limits.outbox {
                            cut.push(*id);
                        }
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        for id in cut {
            core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
            server.close(id);
        }
    }
    for (_, s) in sessions.drain() {
        s.close(&core);
    }
}

// ---------------------------------------------------------------- ports

struct PortClient {
    session: Session,
    events: Name,
}

/// What the port thread needs to answer connection requests.
pub(crate) struct PortSetup {
    pub space: Space,
    pub service: Name,
    pub shm_service: Option<Name>,
    pub socket_path: Option<PathBuf>,
    pub set: Name,
    pub backdoor: Name,
    pub notify: Name,
}

fn open_reply(core: &Core, p: &PortSetup, rcv: &Received, clients: &mut HashMap<Name, PortClient>) -> Message {
    let refuse = |why: &str| Message::new(service::OPEN_REFUSED, why.as_bytes().to_vec());
    let d = rcv.data();
    if d.len() != 8 {
        return refuse("an open request is 8 bytes");
    }
    let version = u32::from_le_bytes(d[..4].try_into().expect("4 bytes"));
    if version != proto::VERSION {
        return refuse(&format!("protocol version {version}; this server speaks {}", proto::VERSION));
    }
    let Some(t) = Transport::from_code(d[4]) else { return refuse("unknown transport") };
    let mut data = proto::VERSION.to_le_bytes().to_vec();
    data.extend_from_slice(&core.screen.0.to_le_bytes());
    data.extend_from_slice(&core.screen.1.to_le_bytes());
    let mut m = Message::new(service::OPEN_OK, Vec::new());
    match t {
        Transport::Socket => match &p.socket_path {
            Some(path) => data.extend_from_slice(path.to_string_lossy().as_bytes()),
            None => return refuse("this server has no socket transport"),
        },
        Transport::Shm => match p.shm_service {
            Some(s) => m.ports.push(PortArg::new(s, Disposition::MakeSend)),
            None => return refuse("this server has no shared-memory transport"),
        },
        Transport::Port => {
            let events = match rcv.ports.as_slice() {
                [r] if r.kind == RightKind::Send => r.name,
                _ => return refuse("a port connection brings one send right, to its event port"),
            };
            let Ok(port) = p.space.allocate_port() else { return refuse("no port") };
            // The no-senders request comes after the answer has made the client's send
            // right (see `port_loop`): asked now, with no sender yet, it would fire at once.
            if p.space.move_member(port, p.set).is_err() {
                let _ = p.space.destroy(port);
                return refuse("cannot set up the request port");
            }
            let waker = Arc::new(Waker::Port { space: p.space.clone(), port: p.backdoor });
            let session = Session::new(core, Outbox::new(waker));
            // The event right now belongs to the client's entry (the message's list of
            // rights is cleaned up by the caller, so take a reference of our own).
            let _ = p.space.mod_refs(events, RightKind::Send, 1);
            clients.insert(port, PortClient { session, events });
            m.ports.push(PortArg::new(port, Disposition::MakeSend));
        }
    }
    m.data = data;
    m
}

fn close_port_client(core: &Core, space: &Space, port: Name, clients: &mut HashMap<Name, PortClient>) {
    if let Some(c) = clients.remove(&port) {
        c.session.close(core);
        let _ = space.deallocate(c.events);
        let _ = space.destroy(port);
    }
}

/// The port transport: the service port, every client's request port and the notify
/// port in one port set.
pub(crate) fn port_loop(core: Arc<Core>, p: PortSetup) {
    let space = p.space.clone();
    let mut clients: HashMap<Name, PortClient> = HashMap::new();
    let mut rcv = Received::new();
    let me = std::process::id();
    while !core.stop.load(Ordering::Acquire) {
        let opts = ReceiveOptions { timeout: Some(Duration::from_millis(100)), populate_ool: false };
        match space.receive(p.set, &mut rcv, opts) {
            Ok(()) => {}
            Err(ictus_ipc::ReceiveError::TimedOut) | Err(ictus_ipc::ReceiveError::Malformed { .. }) => {
                deliver_ports(&core, &space, &mut clients);
                continue;
            }
            Err(e) => {
                if !core.stop.load(Ordering::Acquire) {
                    eprintln!("ictus display: port transport stops: {e}");
                }
                break;
            }
        }
        let port = rcv.port;
        let reply = rcv.reply.map(|r| r.name);
        let rights: Vec<Name> = rcv.ports.iter().map(|r| r.name).collect();
        if port == p.service {
            if rcv.id == service::OPEN {
                let mut m = open_reply(&core, &p, &rcv, &mut clients);
                let new_port = m.ports.first().map(|a| a.name).filter(|n| clients.contains_key(n));
                let sent = reply.is_some_and(|r| space.send(r, &mut m, SendOptions::NONBLOCKING).is_ok());
                if let Some(port) = new_port {
                    let notify = PortArg::new(p.notify, Disposition::MakeSendOnce);
                    if !sent || space.request_notification(port, NotifyKind::NoSenders, Some(notify)).is_err() {
                        // The caller gave up, or the port cannot be watched: forget it.
                        close_port_client(&core, &space, port, &mut clients);
                    }
                }
            } else if let Some(r) = reply {
                let _ = space.deallocate(r);
            }
        } else if port == p.notify {
            // Believe only notifications from this task (see doc/ipc.md).
            if rcv.sender.pid == me && rcv.id == ictus_abi::NotifyId::NoSenders.id() {
                if let Some((name, _)) = ictus_abi::NotifyId::parse_body(rcv.data()) {
                    close_port_client(&core, &space, name, &mut clients);
                }
            }
        } else if port == p.backdoor {
            // A wake-up: deliver below.
        } else if let Some(c) = clients.get_mut(&port) {
            let ok = match rcv.id {
                service::BATCH | service::BATCH_SYNC => {
                    for r in std::mem::take(&mut rcv.ool) {
                        c.session.attach(&core, FrameSrc::Ool(r));
                    }
                    c.session.reply = if rcv.id == service::BATCH_SYNC { reply } else { None };
                    let ok = c.session.execute(&core, rcv.data()).is_ok();
                    if let Some(r) = c.session.reply.take() {
                        // A sync call without a sync in it: nothing to answer.
                        let _ = space.deallocate(r);
                    }
                    ok
                }
                _ => false,
            };
            if !ok {
                core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
                close_port_client(&core, &space, port, &mut clients);
            }
        } else if let Some(r) = reply {
            let _ = space.deallocate(r);
        }
        for r in rights {
            let _ = space.deallocate(r);
        }
        deliver_ports(&core, &space, &mut clients);
    }
    let ports: Vec<Name> = clients.keys().copied().collect();
    for port in ports {
        close_port_client(&core, &space, port, &mut clients);
    }
}

fn deliver_ports(core: &Core, space: &Space, clients: &mut HashMap<Name, PortClient>) {
    let mut dead = Vec::new();
    for (port, c) in clients.iter() {
        loop {
            let front = lock(&c.session.outbox.q).pop_front();
            match front {
                None => break,
                Some(Out::PortReply { reply, bytes }) => {
                    let mut m = Message::new(service::SYNCED, bytes);
                    if space.send(reply, &mut m, SendOptions::NONBLOCKING).is_err() {
                        let _ = space.deallocate(reply);
                    }
                }
                Some(Out::Msg(first)) => {
                    let mut bytes = first;
                    let more = take_msgs(&c.session.outbox, 60 << 10);
                    bytes.extend_from_slice(&more);
                    let mut m = Message::new(service::EVENTS, bytes);
                    match space.send(c.events, &mut m, SendOptions::NONBLOCKING) {
                        Ok(()) => {}
                        // Its queue is full: it is not reading. Drop, and count.
                        Err(ictus_ipc::SendError::TimedOut) => {
                            core.stats.errors.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            dead.push(*port);
                            break;
                        }
                    }
                }
            }
        }
    }
    for port in dead {
        close_port_client(core, space, port, clients);
    }
}

// ---------------------------------------------------------------- socket

struct SockClient {
    stream: UnixStream,
    session: Session,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
}

const LISTENER: u64 = u64::MAX;
const WAKE: u64 = u64::MAX - 1;
/// Bytes read per client per turn, so that one client's flood does not starve others.
const READ_TURN: usize = 256 << 10;
/// Bytes waiting for a client that does not read before it is cut off.
const OUT_MAX: usize = 16 << 20;

/// The socket transport: a listening `AF_UNIX` stream socket and its connections in
/// one epoll.
pub(crate) fn socket_loop(core: Arc<Core>, listener: UnixListener, wake: Arc<Waker>) {
    let Waker::Fd(wake_fd) = &*wake else { return };
    let Ok(ep) = epoll::create(epoll::CreateFlags::CLOEXEC) else { return };
    let _ = listener.set_nonblocking(true);
    let _ = epoll::add(&ep, &listener, epoll::EventData::new_u64(LISTENER), epoll::EventFlags::IN);
    let _ = epoll::add(&ep, wake_fd, epoll::EventData::new_u64(WAKE), epoll::EventFlags::IN);
    let mut conns: HashMap<u64, SockClient> = HashMap::new();
    let mut next = 0u64;
    let uid = rustix::process::geteuid().as_raw();
    let mut evs = Vec::with_capacity(64);
    while !core.stop.load(Ordering::Acquire) {
        evs.clear();
        let t = rustix::event::Timespec { tv_sec: 0, tv_nsec: 100_000_000 };
        match epoll::wait(&ep, rustix::buffer::spare_capacity(&mut evs), Some(&t)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                eprintln!("ictus display: socket transport stops: {e}");
                break;
            }
        }
        let mut closed = Vec::new();
        for ev in &evs {
            match ev.data.u64() {
                LISTENER => {
                    while let Ok((stream, _)) = listener.accept() {
                        let peer = rustix::net::sockopt::socket_peercred(&stream).map(|c| c.uid.as_raw());
                        if !peer.is_ok_and(|p| ictus_name_server::socket::peer_allowed(p, uid)) {
                            continue;
                        }
                        let _ = stream.set_nonblocking(true);
                        let key = next;
                        next += 1;
                        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
                        if epoll::add(&ep, &stream, epoll::EventData::new_u64(key), flags).is_err() {
                            continue;
                        }
                        let session = Session::new(&core, Outbox::new(wake.clone()));
                        conns.insert(key, SockClient { stream, session, inbuf: Vec::new(), outbuf: Vec::new() });
                    }
                }
                WAKE => {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(wake_fd, &mut b);
                }
                key => {
                    let Some(c) = conns.get_mut(&key) else { continue };
                    if !read_client(&core, c) {
                        closed.push(key);
                    }
                }
            }
        }
        for (key, c) in conns.iter_mut() {
            if !write_client(&ep, *key, c) {
                core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
                closed.push(*key);
            }
        }
        for key in closed {
            if let Some(c) = conns.remove(&key) {
                let _ = epoll::delete(&ep, &c.stream);
                c.session.close(&core);
            }
        }
    }
    for (_, c) in conns.drain() {
        c.session.close(&core);
    }
}

/// Read what is there (up to a turn) and execute every complete request; `false` to
/// close the connection (end of file, error, or a malformed request).
fn read_client(core: &Core, c: &mut SockClient) -> bool {
    let mut got = 0;
    loop {
        let at = c.inbuf.len();
        let room = (64 << 10).max(proto::peek_len(&c.inbuf).ok().flatten().unwrap_or(0).saturating_sub(at));
        c.inbuf.resize(at + room, 0);
        match c.stream.read(&mut c.inbuf[at..]) {
            Ok(0) => {
                c.inbuf.truncate(at);
                return false;
            }
            Ok(n) => {
                c.inbuf.truncate(at + n);
                got += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                c.inbuf.truncate(at);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => c.inbuf.truncate(at),
            Err(_) => return false,
        }
        if got >= READ_TURN {
            break;
        }
    }
    let mut end = 0;
    loop {
        match proto::peek_len(&c.inbuf[end..]) {
            Ok(Some(n)) if c.inbuf.len() - end >= n => end += n,
            Ok(_) => break,
            Err(_) => {
                core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
    }
    if end > 0 {
        let ok = c.session.execute(core, &c.inbuf[..end]).is_ok();
        c.inbuf.drain(..end);
        if !ok {
            core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
            return false;
        }
    }
    true
}

/// Write what waits; `false` to close (error, or a client that does not read).
fn write_client(ep: &OwnedFd, key: u64, c: &mut SockClient) -> bool {
    let more = take_msgs(&c.session.outbox, usize::MAX);
    c.outbuf.extend_from_slice(&more);
    if c.outbuf.is_empty() {
        return true;
    }
    match c.stream.write(&c.outbuf) {
        Ok(n) => {
            c.outbuf.drain(..n);
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(_) => return false,
    }
    let flags = if c.outbuf.is_empty() {
        epoll::EventFlags::IN | epoll::EventFlags::RDHUP
    } else {
        epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::OUT
    };
    let _ = epoll::modify(ep, &c.stream, epoll::EventData::new_u64(key), flags);
    let _ = c.stream.as_raw_fd();
    c.outbuf.len() <= OUT_MAX
}

/// The wake-up of the socket thread.
pub(crate) fn socket_waker() -> rustix::io::Result<Arc<Waker>> {
    let fd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
    Ok(Arc::new(Waker::Fd(fd)))
}
