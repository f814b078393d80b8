//! The receive path: wait, read one datagram, check what arrived, then insert it.
//!
//! - **Wait and read** ([`Inner::receive_port`]): straight in `recvmsg` on the main
//!   connection when it is the port's only one, else in the port's epoll; a send-once
//!   connection is read at most once, a hang-up is told from an empty datagram by
//!   asking the kernel. A counted message gives its place in the queue back at once
//!   (`queue`); a doorbell only makes the port look at its queue again. A message
//!   larger than the port takes is refused by its header, unread ([`oversized`]).
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

use ictus_abi::{ReplyKind, COUNTED_FLAG, FLAGS_OFFSET, HEAD_MAX, INLINE_DATAGRAM_MAX};

use crate::channel::{self, Reading};
use crate::error::ReceiveError;
use crate::incoming::{self, oversized, Arrival, Data, Incoming, Item, Oversized, Refused, Reply};
use crate::message::{Credentials, ReceiveOptions, Received, ReceivedRight, RightKind};
use crate::ool::OolRegion;
use crate::port::{ConnKind, NotifyTarget, Parts, RecvPort, DOORBELL, MAX_QLIMIT};
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
        // What `into` held of the last message (a big in-line mapping, regions) goes
        // now, not when the next message comes.
        into.reset();
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
                    Err(ReceiveError::TimedOut | ReceiveError::PortDied | ReceiveError::PortChanged) => continue,
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
        let epoch = p.epoch.load(Ordering::Acquire);
        loop {
            // Choose how to wait: straight on the main connection when it is the only
            // one and a doorbell can reach it; otherwise through the port's epoll.
            let (direct, _reading) = {
                let mut st = p.lock();
                if st.dead {
                    return Err(ReceiveError::PortDied);
                }
                if st.moved || p.epoch.load(Ordering::Acquire) != epoch {
                    return Err(ReceiveError::PortChanged);
                }
                let direct = if st.conns.len() == 1 && st.conns[0].kind == ConnKind::Main && st.send_source.is_some() {
                    Ok((st.conns[0].fd.clone(), st.conns[0].id))
                } else {
                    Err(st.ensure_epoll()?)
                };
                // Under way until this turn of the loop ends: what it takes is checked
                // (a request naming a call channel looked up) before then.
                (direct, Reading::begin(self, p))
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
            // Room for the head and as many in-line bytes as the port takes: a longer
            // datagram is cut short by the kernel, its rest never copied.
            let limit = p.limit.load(Ordering::Relaxed);
            let room = HEAD_MAX + (limit as usize).min(INLINE_DATAGRAM_MAX);
            match sys::recv(fd.as_fd(), &mut rcv.buf[..room], &mut fds, nonblocking)? {
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
                    if kind == ConnKind::Main {
                        if len == 1 && rcv.buf[0] == DOORBELL && fds.is_empty() {
                            doorbell(p);
                            continue;
                        }
                        if counted(&rcv.buf[..len]) {
                            p.release();
                        } else {
                            uncounted(p);
                        }
                    }
                    if let Some(big) = oversized(&rcv.buf[..len], limit) {
                        return Err(self.refuse_too_large(p, big, limit, creds, &mut fds, kind));
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
                // Mapped, read-only, for as long as the message is held: no copy, and
                // nothing of it stays once the message goes (`Received::reset`).
                rcv.big = Some(OolRegion::map(fd, len, populate).map_err(|e| fail(Refused::BigInline(e)))?);
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
            let arrived = if rights.is_empty() { Vec::new() } else { insert_rights(&mut t, rcv, rights) };
            drop(t);
            for a in arrived {
                self.settle_moved(space, a);
            }
        }
        rcv.id = id;
        rcv.sender = sender;
        Ok(kept)
    }
}

/// A receive right that arrived, inserted: what is left to do once the table is
/// unlocked (its call channels keyed again, its requests armed in this space).
pub(crate) struct Arrived {
    port: Arc<RecvPort>,
    channels: Vec<OwnedFd>,
    no_senders: Option<OwnedFd>,
    port_destroyed: Option<OwnedFd>,
}

/// Insert a body's rights into the table, in order, describing each in `rcv.ports`.
/// Returns the receive rights that came, to settle once the table is unlocked.
fn insert_rights(t: &mut Table, rcv: &mut Received, rights: Vec<Item>) -> Vec<Arrived> {
    let mut arrived = Vec::new();
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
                let port = RecvPort::from_parts(Parts {
                    send_source,
                    ident,
                    conns,
                    qlimit: info.qlimit.min(MAX_QLIMIT),
                    limit: info.message_limit,
                    page: r.page,
                    released: info.released,
                });
                port.settle_settings();
                arrived.push(Arrived {
                    port: port.clone(),
                    channels: r.channels,
                    no_senders: r.no_senders,
                    port_destroyed: r.port_destroyed,
                });
                if let Ok(n) = t.insert_receive(port, ident) {
                    rcv.ports.push(ReceivedRight { name: n, kind: RightKind::Receive });
                }
            }
            Item::Ool(..) => unreachable!("regions were mapped above"),
        }
    }
    arrived
}

impl Inner {
    /// A receive right arrived in `space`: key its call channels again, and arm the
    /// requests that travelled with it here, as Mach keeps them with the port.
    fn settle_moved(&self, space: &Space, a: Arrived) {
        if !a.channels.is_empty() {
            self.rekey_moved(space, &a.port, a.channels);
        }
        if let Some(fd) = a.port_destroyed {
            a.port.lock().port_destroyed = Some(NotifyTarget { fd: Arc::new(fd) });
        }
        if let Some(fd) = a.no_senders {
            let _ = self.arm_no_senders(space, &a.port, NotifyTarget { fd: Arc::new(fd) });
        }
    }

    /// A message larger than the port takes: destroy it unread, answer its reply right
    /// (if any) with a too-large notice so that a caller hears why, and count it.
    fn refuse_too_large(
        &self,
        p: &Arc<RecvPort>,
        big: Oversized,
        limit: u32,
        creds: Option<Credentials>,
        fds: &mut Vec<OwnedFd>,
        kind: ConnKind,
    ) -> ReceiveError {
        let h = big.header;
        let reply = fds.first().filter(|fd| sys::is_port_socket(fd.as_fd()));
        match (h.reply, kind) {
            (ReplyKind::Send | ReplyKind::SendOnce, _) => {
                if let Some(fd) = reply {
                    channel::too_large(fd, None, false, limit);
                }
            }
            (ReplyKind::Channel | ReplyKind::ChannelPipe, ConnKind::Main) => {
                if let Some(fd) = reply.filter(|fd| channel::is_foreign(p, fd.as_fd())) {
                    channel::too_large(fd, None, false, limit);
                }
            }
            (ReplyKind::OnChannel, ConnKind::Main) => {
                if let Some(so) = creds.and_then(|c| channel::kept(p, c, h.token)) {
                    channel::too_large(&so.fd, so.pipe.as_deref(), true, limit);
                }
            }
            _ => {}
        }
        fds.clear();
        self.count_too_large();
        ReceiveError::TooLarge { size: big.size, limit, sender: creds }
    }
}

/// Whether a datagram's header says it was counted against the queue limit (read
/// before anything else is checked: a sender that lies only gives places back early).
#[inline]
fn counted(bytes: &[u8]) -> bool {
    bytes.len() >= FLAGS_OFFSET + 2
        && u16::from_le_bytes([bytes[FLAGS_OFFSET], bytes[FLAGS_OFFSET + 1]]) & COUNTED_FLAG != 0
}

/// A doorbell on the main connection: a blocked sender asks the port to look at its
/// queue (the port's own doorbells, which only wake its receivers, come here too).
/// The count is written out again, places taken and never used are given back after
/// the grace (`queue::Ledger::audit`), and sleepers are woken to look again.
fn doorbell(p: &RecvPort) {
    let w = p.page.words();
    let empty = p.ledger.queued(&w) > 0 && p.lock().mains_empty();
    let given = p.ledger.audit(&w, Instant::now(), empty);
    if given > 0 || w.waiters.load(Ordering::Relaxed) != 0 {
        p.page.wake(u32::MAX);
    }
}

/// An uncounted message on the main connection: a notification, or a sender that did
/// not find the port's queue page. If a note was taken from a connection's send end,
/// put another there.
#[cold]
fn uncounted(p: &RecvPort) {
    let st = p.lock();
    let settings = st.settings(p.limit.load(Ordering::Relaxed));
    for fd in st.mains() {
        p.page.post_note(fd.as_fd(), settings, false);
    }
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
