//! The receive path: wait, read one datagram, check what arrived, then insert it.
//!
//! - **Wait and read** ([`Inner::receive_port`]): straight in `recvmsg` on the main
//!   connection when it is the port's only one, else in the port's epoll; doorbells
//!   are skipped, a send-once connection is read at most once, a hang-up is told from
//!   an empty datagram by asking the kernel.
//! - **Check** (`incoming::check`): the bytes, every descriptor's kind, the descriptors
//!   and the sender's identity together, into one validated [`Incoming`], or a refusal.
//!   Nothing is inserted anywhere yet; a limit on what a receiver accepts is one more
//!   check there.
//! - **Insert** ([`Inner::insert`]): the work that can still fail (reading big in-line
//!   data, mapping out-of-line regions) first, then the rights into the space's table,
//!   under one lock.
//!
//! A reply to a call takes the same check and insert ([`Inner::accept`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use ictus_abi::{Name, NotifyId};

use crate::error::ReceiveError;
use crate::incoming::{self, Arrival, Data, Incoming, Item, Refused, Reply};
use crate::message::{Credentials, ReceiveOptions, Received, ReceivedRight, RightKind};
use crate::ool::OolRegion;
use crate::port::{ConnKind, RecvPort, DOORBELL, MAX_QLIMIT};
use crate::set::PortSet;
use crate::space::{Inner, Space};
use crate::sys::{self, RecvOutcome, Waited};
use crate::table::{Entry, PortEntry, SendOnce, Table};

/// A refused message, as the receiver sees it.
pub(crate) fn malformed(why: Refused, sender: Option<Credentials>) -> ReceiveError {
    ReceiveError::Malformed { reason: why.to_string(), sender }
}

impl Space {
    /// Receive a message from a receive right or port set.
    ///
    /// A malformed message is destroyed (its descriptors closed, nothing inserted),
    /// counted, and reported as [`ReceiveError::Malformed`]; receiving again goes on
    /// with the next message.
    pub fn receive(&self, name: Name, into: &mut Received, opts: ReceiveOptions) -> Result<(), ReceiveError> {
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        enum Source {
            Port(Arc<RecvPort>),
            Set(Arc<PortSet>),
        }
        let src = match self.table().get(name) {
            Ok(Entry::Port(PortEntry { recv: Some(p), .. })) => Source::Port(p.clone()),
            Ok(Entry::Set(s)) => Source::Set(s.clone()),
            _ => return Err(ReceiveError::InvalidName(name)),
        };
        match src {
            Source::Port(p) => self.inner.receive_port(self, &p, into, deadline, opts),
            Source::Set(s) => loop {
                let Some(id) = wait_one(s.ep.as_fd(), deadline)? else { continue };
                let Some(port) = s.member(id) else { continue };
                match self.inner.receive_port(self, &port, into, Some(Instant::now()), opts) {
                    Err(ReceiveError::TimedOut) | Err(ReceiveError::PortDied) => continue,
                    other => return other,
                }
            },
        }
    }
}

impl Inner {
    /// Receive one message from a port: wait, read, check, insert.
    pub(crate) fn receive_port(
        &self,
        space: &Space,
        p: &Arc<RecvPort>,
        rcv: &mut Received,
        deadline: Option<Instant>,
        opts: ReceiveOptions,
    ) -> Result<(), ReceiveError> {
        let mut fds = Vec::new();
        loop {
            // Choose how to wait: straight on the main connection when it is the only
            // one and a doorbell can reach it; otherwise through the port's epoll.
            let direct = {
                let mut st = p.lock();
                if st.dead {
                    return Err(ReceiveError::PortDied);
                }
                if st.conns.len() == 1 && st.conns[0].kind == ConnKind::Main && st.send_source.is_some() {
                    Ok((st.conns[0].fd.clone(), st.conns[0].id))
                } else {
                    Err(st.ensure_epoll()?)
                }
            };
            let (fd, cid, kind, nonblocking) = match direct {
                Ok((fd, cid)) => {
                    if deadline.is_some() && !sys::wait_readable(fd.as_fd(), deadline)? {
                        return Err(ReceiveError::TimedOut);
                    }
                    (fd, cid, ConnKind::Main, deadline.is_some())
                }
                Err(ep) => {
                    let Some(cid) = wait_one(ep.as_fd(), deadline)? else { continue };
                    // The wake event (or a connection already gone): look again.
                    let Some((fd, kind)) = p.lock().conn(cid) else { continue };
                    (fd, cid, kind, true)
                }
            };
            fds.clear();
            match sys::recv(fd.as_fd(), &mut rcv.buf, &mut fds, nonblocking)? {
                RecvOutcome::Empty => continue,
                RecvOutcome::Zero => {
                    if !sys::hung_up(fd.as_fd()) {
                        return Err(self.count_malformed(malformed(Refused::Empty, None)));
                    }
                    p.lock().remove_conn(cid);
                    if kind == ConnKind::Once {
                        // A send-once right died unused: the send-once notification.
                        rcv.reset();
                        rcv.id = NotifyId::SendOnce.id();
                        rcv.seqno = p.seqno.fetch_add(1, Ordering::Relaxed);
                        rcv.sender = self.me;
                        rcv.port = p.name();
                        let body = NotifyId::body(p.name(), 0);
                        rcv.buf[..8].copy_from_slice(&body);
                        rcv.data_start = 0;
                        rcv.data_end = 8;
                        return Ok(());
                    }
                    self.check_no_senders(p);
                    continue;
                }
                RecvOutcome::Datagram { len, creds, truncated } => {
                    if kind == ConnKind::Once {
                        // Read at most once: closing the connection makes the kernel
                        // refuse anything more sent on this send-once right.
                        p.lock().remove_conn(cid);
                    }
                    if kind == ConnKind::Main && len == 1 && rcv.buf[0] == DOORBELL && fds.is_empty() {
                        continue;
                    }
                    if truncated {
                        return Err(self.count_malformed(malformed(Refused::Truncated, creds)));
                    }
                    let seqno = p.seqno.fetch_add(1, Ordering::Relaxed);
                    let arrival = if kind == ConnKind::Main { Arrival::Main(p) } else { Arrival::Once };
                    self.accept(space, rcv, len, creds, &mut fds, opts.populate_ool, arrival)?;
                    rcv.seqno = seqno;
                    rcv.port = p.name();
                    return Ok(());
                }
            }
        }
    }

    /// Check the datagram of `len` bytes in `rcv`'s buffer and its descriptors `fds`,
    /// then insert it into `space`. Returns the reply's "channel kept" flag. A refused
    /// message is counted, and every one of its descriptors closed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accept(
        &self,
        space: &Space,
        rcv: &mut Received,
        len: usize,
        creds: Option<Credentials>,
        fds: &mut Vec<OwnedFd>,
        populate: bool,
        arrival: Arrival<'_>,
    ) -> Result<bool, ReceiveError> {
        let incoming = incoming::check(&rcv.buf[..len], creds, fds, arrival)
            .map_err(|why| self.count_malformed(malformed(why, creds)))?;
        self.insert(space, rcv, incoming, populate)
    }

    /// Map a body's out-of-line regions into `rcv`, all or none; the rights are left.
    fn map_regions(
        &self,
        body: Vec<Item>,
        rcv: &mut Received,
        populate: bool,
        sender: Credentials,
    ) -> Result<Vec<Item>, ReceiveError> {
        let mut rights = Vec::with_capacity(body.len());
        let mut ool = Vec::new();
        for item in body {
            match item {
                Item::Ool(fd, len) => match OolRegion::map(fd, len, populate) {
                    Ok(region) => ool.push(region),
                    Err(e) => return Err(self.count_malformed(malformed(Refused::OolMapping(e), Some(sender)))),
                },
                right => rights.push(right),
            }
        }
        if !ool.is_empty() {
            rcv.ool = ool;
        }
        Ok(rights)
    }

    /// Insert a checked message into `space` and describe it in `rcv`. Reading big
    /// in-line data and mapping out-of-line regions come first, so that a message they
    /// fail for inserts nothing.
    #[inline]
    fn insert(&self, space: &Space, rcv: &mut Received, m: Incoming, populate: bool) -> Result<bool, ReceiveError> {
        let Incoming { id, kept, sender, data, reply, body } = m;
        let fail = |why: Refused| self.count_malformed(malformed(why, Some(sender)));
        rcv.reset();
        match data {
            Data::Datagram(range) => {
                rcv.data_start = range.start;
                rcv.data_end = range.end;
            }
            Data::Memfd(fd, len) => {
                sys::read_all_at(fd.as_fd(), len as usize, &mut rcv.big).map_err(|e| fail(Refused::BigInline(e)))?;
                rcv.is_big = true;
            }
        }
        // A plain message has an empty body: nothing to walk, nothing to allocate.
        let rights = if body.is_empty() { body } else { self.map_regions(body, rcv, populate, sender)? };
        if reply.is_some() || !rights.is_empty() {
            let mut t = space.table();
            let send_once = |so| Entry::SendOnce(so);
            rcv.reply = match reply {
                None => None,
                Some(Reply::Send(fd, ident)) => {
                    t.insert_send(fd, ident).ok().map(|n| ReceivedRight { name: n, kind: RightKind::Send })
                }
                Some(Reply::SendOnce(fd)) => t.alloc(send_once(SendOnce::plain(Arc::new(fd)))).ok().map(once_right),
                // A client's new call channel: the port keeps it for the client's later
                // calls, and this request's reply goes back on it.
                Some(Reply::Channel { port, fd, pipe, token }) => {
                    let so = self.accept_offer(space, &port, sender, token, fd, pipe);
                    t.alloc(send_once(so)).ok().map(once_right)
                }
                // A later call from the same client: answered back on its channel.
                Some(Reply::OnChannel(so)) => t.alloc(send_once(so)).ok().map(once_right),
            };
            let moved_channels = if rights.is_empty() { Vec::new() } else { insert_rights(&mut t, rcv, rights) };
            drop(t);
            if !moved_channels.is_empty() {
                for (port, channels) in moved_channels {
                    self.rekey_moved(space, &port, channels);
                }
            }
        }
        rcv.id = id;
        rcv.sender = sender;
        Ok(kept)
    }
}

/// Insert a body's rights into the table, in order, describing each in `rcv.ports`.
/// Returns the moved receive rights that came with call channels, to key again once
/// the table is unlocked.
fn insert_rights(t: &mut Table, rcv: &mut Received, rights: Vec<Item>) -> Vec<(Arc<RecvPort>, Vec<OwnedFd>)> {
    let mut moved_channels = Vec::new();
    for item in rights {
        match item {
            Item::Send(fd, ident) => {
                if let Ok(n) = t.insert_send(fd, ident) {
                    rcv.ports.push(ReceivedRight { name: n, kind: RightKind::Send });
                }
            }
            Item::SendOnce(fd) => {
                if let Ok(n) = t.alloc(Entry::SendOnce(SendOnce::plain(Arc::new(fd)))) {
                    rcv.ports.push(once_right(n));
                }
            }
            Item::Receive(r) => {
                let (send_source, ident) = match r.source {
                    Some((fd, ident)) => (Some(Arc::new(fd)), Some(ident)),
                    None => (None, None),
                };
                let mut conns = Vec::with_capacity(r.conns.len());
                for (fd, kind) in r.conns {
                    let _ = sys::set_passcred(fd.as_fd());
                    conns.push((Arc::new(fd), kind));
                }
                let info = r.info;
                let port = RecvPort::from_parts(
                    send_source,
                    ident,
                    conns,
                    info.seqno,
                    info.mscount,
                    info.qlimit.min(MAX_QLIMIT),
                );
                if !r.channels.is_empty() {
                    moved_channels.push((port.clone(), r.channels));
                }
                if let Ok(n) = t.insert_receive(port, ident) {
                    rcv.ports.push(ReceivedRight { name: n, kind: RightKind::Receive });
                }
            }
            Item::Ool(..) => unreachable!("regions were mapped above"),
        }
    }
    moved_channels
}

fn once_right(name: Name) -> ReceivedRight {
    ReceivedRight { name, kind: RightKind::SendOnce }
}

/// Wait in an epoll for one event until `deadline`: its datum, `None` to look again
/// (interrupted, or woken early), or `TimedOut` once the deadline has passed.
fn wait_one(ep: BorrowedFd<'_>, deadline: Option<Instant>) -> Result<Option<u64>, ReceiveError> {
    match sys::epoll_wait_one(ep, deadline)? {
        Waited::Event(datum) => Ok(Some(datum)),
        Waited::Again => Ok(None),
        Waited::TimedOut => Err(ReceiveError::TimedOut),
    }
}
