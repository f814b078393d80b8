//! The socket transport, X11's own: a listening `AF_UNIX` stream socket and its
//! connections in one epoll, requests back to back in the byte stream.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ictus_display::proto;
use rustix::event::epoll;

use super::take_msgs;
use crate::core::{Core, Outbox, Session, Waker};

struct SockClient {
    stream: UnixStream,
    session: Session,
    /// Bytes read, `inbuf[..filled]`; the rest is room, zeroed once, not per read.
    inbuf: Vec<u8>,
    filled: usize,
    outbuf: Vec<u8>,
    /// Whether the epoll waits for room to write (changed only when that changes).
    want_out: bool,
}

/// Room for reading at least this much at once.
const READ_ROOM: usize = 64 << 10;

const LISTENER: u64 = u64::MAX;
const WAKE: u64 = u64::MAX - 1;
/// Bytes read per client per turn, so that one client's flood does not starve others.
const READ_TURN: usize = 256 << 10;
/// Bytes waiting for a client that does not read before it is cut off.
const OUT_MAX: usize = 16 << 20;

/// The socket transport: a listening `AF_UNIX` stream socket and its connections in
/// one epoll.
pub(crate) fn run(core: Arc<Core>, listener: UnixListener, wake: Arc<Waker>) {
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
                        if !peer.is_ok_and(|p| ictus_name_api::socket::peer_allowed(p, uid)) {
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
                        conns.insert(
                            key,
                            SockClient {
                                stream,
                                session,
                                inbuf: vec![0; READ_ROOM],
                                filled: 0,
                                outbuf: Vec::new(),
                                want_out: false,
                            },
                        );
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
/// close the connection (end of file, error, or a malformed request). A read that
/// does not fill the room it was given has taken everything there was: the epoll
/// (level-triggered) says when more comes, so no second read finds nothing.
fn read_client(core: &Core, c: &mut SockClient) -> bool {
    let mut got = 0;
    loop {
        // Room for at least a read's worth, and for the whole request being read.
        let need = proto::peek_len(&c.inbuf[..c.filled]).ok().flatten().unwrap_or(0);
        let want = (c.filled + READ_ROOM).max(need);
        if c.inbuf.len() < want {
            c.inbuf.resize(want, 0);
        }
        let room = c.inbuf.len() - c.filled;
        match c.stream.read(&mut c.inbuf[c.filled..]) {
            Ok(0) => return false,
            Ok(n) => {
                c.filled += n;
                got += n;
                if n < room {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
        if got >= READ_TURN {
            break;
        }
    }
    let mut end = 0;
    loop {
        match proto::peek_len(&c.inbuf[end..c.filled]) {
            Ok(Some(n)) if c.filled - end >= n => end += n,
            Ok(_) => break,
            Err(_) => {
                core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
    }
    if end > 0 {
        let ok = c.session.execute(core, &c.inbuf[..end]).is_ok();
        c.inbuf.copy_within(end..c.filled, 0);
        c.filled -= end;
        if !ok {
            core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
            return false;
        }
    }
    // A large request's room goes back once it is done.
    if c.filled <= READ_ROOM && c.inbuf.len() > 4 * READ_ROOM {
        c.inbuf.truncate(READ_ROOM);
        c.inbuf.shrink_to_fit();
    }
    true
}

/// Write what waits; `false` to close (error, or a client that does not read).
fn write_client(ep: &OwnedFd, key: u64, c: &mut SockClient) -> bool {
    let more = take_msgs(&c.session.outbox, usize::MAX);
    if c.outbuf.is_empty() && more.is_empty() {
        return true;
    }
    c.outbuf.extend_from_slice(&more);
    match c.stream.write(&c.outbuf) {
        Ok(n) => {
            c.outbuf.drain(..n);
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(_) => return false,
    }
    let want_out = !c.outbuf.is_empty();
    if want_out != c.want_out {
        let mut flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if want_out {
            flags |= epoll::EventFlags::OUT;
        }
        let _ = epoll::modify(ep, &c.stream, epoll::EventData::new_u64(key), flags);
        c.want_out = want_out;
    }
    c.outbuf.len() <= OUT_MAX
}

/// The wake-up of the socket thread.
pub(crate) fn waker() -> rustix::io::Result<Arc<Waker>> {
    let fd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
    Ok(Arc::new(Waker::Fd(fd)))
}
