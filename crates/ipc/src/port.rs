//! A receive right: the connections that reach a port, and its state.
//!
//! A port is reached through *connections*, each an `AF_UNIX SOCK_SEQPACKET`
//! socketpair whose receive end the port holds:
//!
//! - the **main** connection, whose send end is shared by every send right (copying a
//!   send right passes the same socket, so every holder's descriptor has the same
//!   inode: the kernel's own name for the port, used to merge names);
//! - one **once** connection per outstanding send-once right, read at most once and
//!   then closed, so the kernel itself enforces "once", and a send-once right dropped
//!   unused shows as a hang-up: the send-once notification;
//! - one **call channel** per client that has made calls to the port: a connection the
//!   client made and offered with its first request, kept under (the client's pid as
//!   the kernel stamped it, the client's token). The client's later requests arrive on
//!   the main connection naming the token, and their replies go back on the channel,
//!   so a call costs no descriptor passing and no new socket, and the port's receiver
//!   still waits on the main connection alone. A channel is not read by the port; it
//!   counts as a send right for no-senders.
//!
//! The port keeps the main send end as its *send source* to make send rights from,
//! unless a no-senders notification is armed: then it lets go of it, so the kernel
//! reports a hang-up when the last send right anywhere is closed.
//!
//! Its queue limit is counted in its *queue page* (`queue`): every main connection's
//! send end has a note in its own receive queue that leads senders to it.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ictus_abi::Name;

use crate::queue::{Ledger, QueuePage, Settings, Sizes};
use crate::set::PortSet;
use crate::sys::{self, Interest};

/// The kernel identity of a send end: (device, inode).
pub(crate) type Ident = (u64, u64);

/// The first byte of a one-byte datagram that only wakes a receiver blocked on the
/// main connection so that it looks at the port's connections again.
pub(crate) const DOORBELL: u8 = 0xdb;

/// The epoll event datum of a port's wake eventfd (connection ids start at 1).
pub(crate) const WAKE_EVENT: u64 = u64::MAX;

/// Mach's default queue limit is 5 messages; ictus ports queue more by default, so
/// that a burst of one-way messages does not hold senders back.
pub const DEFAULT_QLIMIT: u32 = 128;
/// The largest queue limit, in messages.
pub const MAX_QLIMIT: u32 = 65_536;

static NEXT_PORT_ID: AtomicU64 = AtomicU64::new(1);

/// What a connection of a port is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnKind {
    /// Reached by send rights.
    Main,
    /// Reached by one send-once right; read at most once.
    Once,
}

/// Which call channel a request names: the sender's pid as the kernel stamped it
/// (`SCM_CREDENTIALS`), and the token the sender gave the channel (the inode number of
/// the sender's end of it, which the receiver can recompute from the kernel).
pub(crate) type ChannelKey = (u32, u32);

/// Hashing for the maps looked up on every call: a port's channel table (whose tokens
/// are the clients' choice) and a space's channel pool (keyed by port identities). The
/// mix is keyed with a per-process random seed (and folded, so that every bit of the
/// key reaches the bucket index): a client cannot pick keys that collide. SipHash would
/// cost a measurable share of a call.
#[derive(Clone, Copy)]
pub(crate) struct KeyHash(u64);

impl Default for KeyHash {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        // std's RandomState is keyed from the kernel's entropy once per process.
        KeyHash(*SEED.get_or_init(|| {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish() | 1
        }))
    }
}

impl std::hash::BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(self.0)
    }
}

pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29) ^ (h >> 47)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(31);
    }
}

/// A call channel the port keeps: the receiver's end (replies are written to it) and
/// the notifier watch that tells the port when the client's end hangs up.
pub(crate) struct Channel {
    pub(crate) fd: Arc<OwnedFd>,
    /// The write end of the client's reply pipe, if it offered one: plain replies go
    /// there (see `doc/ipc.md`). Never passed on; dropped when the receive right moves
    /// or the client hangs up.
    pub(crate) pipe: Option<Arc<OwnedFd>>,
    pub(crate) watch: Option<u64>,
    /// The client's end hung up, and requests it sent before may still be unread: the
    /// channel stays so that they are delivered (their replies find the caller gone),
    /// until nothing from before the hang-up can be unread
    /// (`Inner::forget_hung_up_channels`).
    pub(crate) hung_up: bool,
}

pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) kind: ConnKind,
}

/// Where a notification goes: a send or send-once right held by the request.
pub(crate) struct NotifyTarget {
    pub(crate) fd: Arc<OwnedFd>,
}

pub(crate) struct RecvState {
    pub(crate) conns: Vec<Conn>,
    /// Call channels by (client pid, token).
    pub(crate) channels: HashMap<ChannelKey, Channel, KeyHash>,
    pub(crate) send_source: Option<Arc<OwnedFd>>,
    pub(crate) ident: Option<Ident>,
    pub(crate) mscount: u32,
    pub(crate) qlimit: u32,
    /// How many of the first places may hold large datagrams (see `queue::Sizes`).
    pub(crate) large: u32,
    /// The version of the settings in the connections' notes.
    pub(crate) version: u32,
    pub(crate) epoll: Option<Arc<OwnedFd>>,
    /// An eventfd in the epoll that wakes every waiter when the port dies or moves.
    wake: Option<OwnedFd>,
    next_conn: u64,
    pub(crate) no_senders: Option<NotifyTarget>,
    pub(crate) ns_watches: Vec<u64>,
    /// While a no-senders request is armed: how to watch connections made later.
    pub(crate) ns_watcher: Option<crate::notify::Watcher>,
    /// The port itself, for watches made from inside its state.
    this: Weak<RecvPort>,
    pub(crate) port_destroyed: Option<NotifyTarget>,
    pub(crate) set: Option<Weak<PortSet>>,
    /// The receive right was destroyed: waiters get `PortDied`.
    pub(crate) dead: bool,
    /// The receive right moved to another task: waiters get `PortChanged`.
    pub(crate) moved: bool,
}

pub(crate) struct RecvPort {
    pub(crate) id: u64,
    pub(crate) st: Mutex<RecvState>,
    pub(crate) seqno: AtomicU64,
    /// This port's name in the space that holds it.
    pub(crate) name: AtomicU32,
    /// The queue page, shared with every sender, and this receiver's own count.
    pub(crate) page: QueuePage,
    pub(crate) ledger: Ledger,
    /// The most in-line bytes a message may carry (the receiver's own copy; senders
    /// read it in the connections' notes).
    pub(crate) limit: AtomicU32,
    /// Bumped when the receive right moves between spaces of this process, so that a
    /// thread of the old space waiting on it stops (`PortChanged`).
    pub(crate) epoch: AtomicU64,
    /// Receives under way on this port, from the moment one chooses how to wait (under
    /// the state's lock, before it can take a datagram) until what it took has been
    /// checked: while any is, a request naming a hung-up call channel may have been
    /// taken off the main connection and not yet looked up.
    pub(crate) reading: AtomicU32,
    /// Call channels kept although their client hung up (`Channel::hung_up`); changed
    /// under the state's lock, read without it by a receive that ends.
    pub(crate) hung_up: AtomicU32,
}

/// The descriptors and state of a receive right on its way to another task.
pub(crate) struct Packed {
    pub(crate) info: ictus_abi::ReceiveRightInfo,
    pub(crate) fds: Vec<Arc<OwnedFd>>,
    /// The call channels (their descriptors are also among `fds`), kept so that a
    /// failed move can put them back; their watches are cancelled once it succeeds.
    pub(crate) channels: Vec<(ChannelKey, Channel)>,
    /// The notification requests that travel with the right (their notify rights are
    /// the last of `fds`), kept so that a failed move can put them back.
    pub(crate) no_senders: Option<NotifyTarget>,
    pub(crate) port_destroyed: Option<NotifyTarget>,
}

/// What a receive right is made of when it is made again from parts (a moved right).
pub(crate) struct Parts {
    pub(crate) send_source: Option<Arc<OwnedFd>>,
    pub(crate) ident: Option<Ident>,
    pub(crate) conns: Vec<(Arc<OwnedFd>, ConnKind)>,
    pub(crate) qlimit: u32,
    pub(crate) limit: u32,
    pub(crate) page: QueuePage,
    /// Places given back so far.
    pub(crate) released: u32,
}

impl RecvPort {
    /// A new port with one main connection and its send source.
    pub(crate) fn new() -> rustix::io::Result<Arc<RecvPort>> {
        let (s, r) = sys::connection()?;
        let ident = sys::identity(s.as_fd())?;
        let large = size_buffer(s.as_fd(), DEFAULT_QLIMIT)?;
        let page = QueuePage::new()?;
        let settings = Settings { version: 1, qlimit: DEFAULT_QLIMIT, large, limit: ictus_abi::BIG_INLINE_MAX as u32 };
        page.post_note(r.as_fd(), settings, true);
        let port = RecvPort::from_parts(Parts {
            send_source: Some(Arc::new(s)),
            ident: Some(ident),
            conns: vec![(Arc::new(r), ConnKind::Main)],
            qlimit: DEFAULT_QLIMIT,
            limit: settings.limit,
            page,
            released: 0,
        });
        port.lock().large = large;
        Ok(port)
    }

    /// A receive right from its parts. Its sequence number and make-send count start
    /// at zero, as a moved right's do in Mach.
    pub(crate) fn from_parts(parts: Parts) -> Arc<RecvPort> {
        let Parts { send_source, ident, conns, qlimit, limit, page, released } = parts;
        let conns: Vec<Conn> =
            conns.into_iter().enumerate().map(|(i, (fd, kind))| Conn { id: i as u64 + 1, fd, kind }).collect();
        let next_conn = conns.len() as u64 + 1;
        let version = page.words().version.load(Ordering::Relaxed);
        Arc::new_cyclic(|this| RecvPort {
            id: NEXT_PORT_ID.fetch_add(1, Ordering::Relaxed),
            st: Mutex::new(RecvState {
                conns,
                channels: HashMap::default(),
                send_source,
                ident,
                mscount: 0,
                qlimit,
                large: 0,
                version: version.max(1),
                epoll: None,
                wake: None,
                next_conn,
                no_senders: None,
                ns_watches: Vec::new(),
                ns_watcher: None,
                this: this.clone(),
                port_destroyed: None,
                set: None,
                dead: false,
                moved: false,
            }),
            seqno: AtomicU64::new(0),
            name: AtomicU32::new(0),
            ledger: Ledger::starting_at(released),
            page,
            limit: AtomicU32::new(limit),
            epoch: AtomicU64::new(0),
            reading: AtomicU32::new(0),
            hung_up: AtomicU32::new(0),
        })
    }

    /// The receive right moved to another space of this process (`extract_right`,
    /// `insert_right`): as in Mach, its sequence number and make-send count start again
    /// at zero, and threads of the old space waiting on it stop (`PortChanged`).
    pub(crate) fn moved_within(&self) {
        self.seqno.store(0, Ordering::Relaxed);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let mut st = self.lock();
        st.mscount = 0;
        st.wake_waiters();
    }

    /// A receive right that arrived from another task: the settings its notes say.
    /// How many places may hold large datagrams follows from the buffer of its send
    /// source; without one (a no-senders request is armed) none may, which keeps the
    /// count exact at the cost of a memfd for large messages.
    pub(crate) fn settle_settings(&self) {
        let mut st = self.lock();
        let large = st.send_source.as_ref().and_then(|s| rustix::net::sockopt::socket_send_buffer_size(s).ok());
        st.large = large.map_or(0, |b| Sizes::here().large_places(b, st.qlimit));
    }

    /// Change the port's settings (`change` sets the queue limit in its state; the
    /// message limit is set before): size the buffer of the connection whose send end
    /// the port holds again, put a note with the new settings on it in place of the
    /// old, tell senders to read it again (the page's `version`), and wake those
    /// waiting for a place. A connection whose send end the port does not hold (one
    /// made while a no-senders request was armed) keeps its note: senders on it go on
    /// with the settings it was made with.
    pub(crate) fn change_settings(&self, change: impl FnOnce(&mut RecvState)) -> rustix::io::Result<()> {
        let mut st = self.lock();
        change(&mut st);
        if let Some(src) = st.send_source.clone() {
            st.large = size_buffer(src.as_fd(), st.qlimit)?;
            take_notes(src.as_fd());
        }
        st.version = st.version.wrapping_add(1).max(1);
        let settings = st.settings(self.limit.load(Ordering::Relaxed));
        for fd in st.mains() {
            self.page.post_note(fd.as_fd(), settings, false);
        }
        drop(st);
        self.page.words().version.store(settings.version, Ordering::Release);
        self.page.wake(u32::MAX);
        Ok(())
    }

    /// The settings senders read in the connections' notes.
    pub(crate) fn settings(&self) -> Settings {
        self.lock().settings(self.limit.load(Ordering::Relaxed))
    }

    /// Messages queued and counted against the queue limit: places taken (as the
    /// page claims) and not given back.
    pub(crate) fn counted(&self) -> u32 {
        self.ledger.queued(&self.page.words())
    }

    /// A counted message was taken off the main connection: give its place back, and
    /// wake a sender sleeping for one.
    #[inline]
    pub(crate) fn release(&self) {
        if self.ledger.release(&self.page.words()) {
            self.page.wake(1);
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, RecvState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn name(&self) -> Name {
        Name(self.name.load(Ordering::Relaxed))
    }
}

/// Take every note queued at a send end the port holds (only notes are ever sent to
/// a send end).
fn take_notes(send_end: BorrowedFd<'_>) {
    let mut buf = [0u8; 64];
    let mut fds = Vec::new();
    while matches!(sys::recv(send_end, &mut buf, &mut fds, true), Ok(sys::RecvOutcome::Datagram { .. })) {
        fds.clear();
    }
}

/// Size a main connection's send buffer for `qlimit` counted messages (`queue::Sizes`)
/// and return how many places may hold large datagrams in what the kernel granted.
pub(crate) fn size_buffer(send_end: BorrowedFd<'_>, qlimit: u32) -> rustix::io::Result<u32> {
    let sizes = Sizes::here();
    let got = sys::set_send_buffer(send_end, sizes.buffer_wanted(qlimit))?;
    if !sizes.holds(got, qlimit) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!(
                "ictus: a queue limit of {qlimit} messages needs a {} KiB socket buffer and the kernel gave {} KiB \
                 (net.core.wmem_max): senders may be held back before that many messages are queued",
                sizes.buffer_wanted(qlimit) >> 10,
                got >> 10
            )
        });
    }
    Ok(sizes.large_places(got, qlimit))
}

impl RecvState {
    /// The settings senders read in the connections' notes.
    pub(crate) fn settings(&self, limit: u32) -> Settings {
        Settings { version: self.version, qlimit: self.qlimit, large: self.large.min(self.qlimit), limit }
    }

    /// Wake every thread waiting on this port: through the epoll, and with a doorbell
    /// for one blocked on the main connection alone (a doorbell that nobody reads here
    /// travels on and is ignored).
    pub(crate) fn wake_waiters(&self) {
        if let Some(w) = &self.wake {
            sys::eventfd_signal(w.as_fd());
        }
        self.ring_doorbell();
    }

    /// Ring the port's doorbell: wake one receiver blocked on the main connection so
    /// that it looks at the port again (best effort: a full queue has its receivers
    /// awake anyway; without a send source there is nothing to ring it through).
    pub(crate) fn ring_doorbell(&self) {
        if let Some(src) = &self.send_source {
            let _ = sys::send(src.as_fd(), &[std::io::IoSlice::new(&[DOORBELL])], &[], Some(std::time::Instant::now()));
        }
    }

    /// The main connections' receive ends.
    pub(crate) fn mains(&self) -> impl Iterator<Item = &Arc<OwnedFd>> + '_ {
        self.conns.iter().filter(|c| c.kind == ConnKind::Main).map(|c| &c.fd)
    }

    /// Whether nothing waits on any main connection (`SIOCINQ`).
    pub(crate) fn mains_empty(&self) -> bool {
        self.mains().all(|fd| ictus_sys::socket::inq_len(fd.as_fd()).is_ok_and(|n| n == 0))
    }

    /// Whether no request waits on any main connection: each holds fewer bytes than a
    /// message's header (`SIOCINQ`, which for `SOCK_SEQPACKET` counts every queued
    /// datagram), so at most doorbells, which name no call channel.
    pub(crate) fn mains_hold_no_request(&self) -> bool {
        self.mains().all(|fd| ictus_sys::socket::inq_len(fd.as_fd()).is_ok_and(|n| n < ictus_abi::HEADER_LEN))
    }

    /// Add a connection, registering it with the port's epoll and waking a receiver
    /// blocked on the main connection alone.
    pub(crate) fn add_conn(&mut self, fd: Arc<OwnedFd>, kind: ConnKind) -> rustix::io::Result<u64> {
        let id = self.next_conn;
        self.next_conn += 1;
        if let Some(ep) = &self.epoll {
            sys::epoll_add(ep.as_fd(), fd.as_fd(), id, Interest::Readable)?;
        }
        self.conns.push(Conn { id, fd, kind });
        self.ring_doorbell();
        Ok(id)
    }

    pub(crate) fn remove_conn(&mut self, id: u64) -> Option<Conn> {
        let i = self.conns.iter().position(|c| c.id == id)?;
        let c = self.conns.remove(i);
        if let Some(ep) = &self.epoll {
            sys::epoll_delete(ep.as_fd(), c.fd.as_fd());
        }
        Some(c)
    }

    pub(crate) fn conn(&self, id: u64) -> Option<(Arc<OwnedFd>, ConnKind)> {
        self.conns.iter().find(|c| c.id == id).map(|c| (c.fd.clone(), c.kind))
    }

    /// The port's epoll, made on first need, holding every connection.
    pub(crate) fn ensure_epoll(&mut self) -> rustix::io::Result<Arc<OwnedFd>> {
        if let Some(ep) = &self.epoll {
            return Ok(ep.clone());
        }
        let ep = sys::epoll()?;
        for c in &self.conns {
            sys::epoll_add(ep.as_fd(), c.fd.as_fd(), c.id, Interest::Readable)?;
        }
        let wake = sys::eventfd()?;
        sys::epoll_add(ep.as_fd(), wake.as_fd(), WAKE_EVENT, Interest::Readable)?;
        let ep = Arc::new(ep);
        self.epoll = Some(ep.clone());
        self.wake = Some(wake);
        Ok(ep)
    }

    /// A send end for a new send right: the send source, or a fresh main connection
    /// when the port let go of its source (a no-senders request is armed).
    /// Returns the descriptor and whether a new connection was made.
    pub(crate) fn send_end(&mut self) -> rustix::io::Result<(Arc<OwnedFd>, Ident, Option<u64>)> {
        if let (Some(src), Some(ident)) = (&self.send_source, self.ident) {
            return Ok((src.clone(), ident, None));
        }
        let (s, r) = sys::connection()?;
        self.large = size_buffer(s.as_fd(), self.qlimit)?;
        let ident = sys::identity(s.as_fd())?;
        if let Some(port) = self.this.upgrade() {
            port.page.post_note(r.as_fd(), self.settings(port.limit.load(Ordering::Relaxed)), true);
        }
        let r = Arc::new(r);
        let id = self.add_conn(r.clone(), ConnKind::Main)?;
        self.watch_for_no_senders(r);
        if self.no_senders.is_none() {
            self.send_source = Some(Arc::new(s));
            self.ident = Some(ident);
            return Ok((self.send_source.clone().expect("just set"), ident, Some(id)));
        }
        Ok((Arc::new(s), ident, Some(id)))
    }

    /// A connection that reaches the port like a send right was added: if a no-senders
    /// request is armed, the notifier must watch it too.
    pub(crate) fn watch_for_no_senders(&mut self, fd: Arc<OwnedFd>) {
        if self.no_senders.is_some() {
            if let Some(w) = &self.ns_watcher {
                if let Ok(id) = w.watch_no_senders(self.this.clone(), fd) {
                    self.ns_watches.push(id);
                }
            }
        }
    }

    /// A new send-once right: a fresh connection read at most once.
    pub(crate) fn send_once_end(&mut self) -> rustix::io::Result<(OwnedFd, u64)> {
        let (s, r) = sys::connection()?;
        let id = self.add_conn(Arc::new(r), ConnKind::Once)?;
        Ok((s, id))
    }

    /// Whether no send right to this port exists anywhere: the port holds no send
    /// source and every main connection and call channel has hung up.
    pub(crate) fn no_senders_now(&self) -> bool {
        self.send_source.is_none()
            && self.conns.iter().filter(|c| c.kind == ConnKind::Main).all(|c| sys::hung_up(c.fd.as_fd()))
            && self.channels.values().all(|c| sys::hung_up(c.fd.as_fd()))
    }

    /// Keep a client's call channel under `key`. A channel already under that key
    /// (only its own client could have put it there) is replaced and returned.
    pub(crate) fn add_channel(&mut self, key: ChannelKey, channel: Channel) -> Option<Channel> {
        self.channels.insert(key, channel)
    }

    /// Forget the call channel under `key` if it is still `fd` and its client has not
    /// hung up. A hung-up channel leads nowhere, and may stand for more than one
    /// request still unread (`Inner::rekey_moved` keeps one per dead caller): it stays
    /// until `Inner::forget_hung_up_channels` lets it go.
    pub(crate) fn remove_channel(&mut self, key: ChannelKey, fd: &Arc<OwnedFd>) -> Option<Channel> {
        match self.channels.get(&key) {
            Some(c) if Arc::ptr_eq(&c.fd, fd) && !c.hung_up => self.channels.remove(&key),
            _ => None,
        }
    }

    /// Take the port's descriptors and state to move the receive right elsewhere, with
    /// its notification requests. The port is gone from here afterwards (`moved`);
    /// [`RecvState::unpack`] puts everything back if the move fails.
    pub(crate) fn pack(&mut self, port: &RecvPort) -> Packed {
        // Wake every thread waiting on this port, so it finds the port gone.
        self.wake_waiters();
        let mut fds = Vec::new();
        // The queue page first: it is the port's, and comes with every move.
        if let Some(page) = port.page.fd().and_then(|fd| sys::dup(fd).ok()) {
            fds.push(Arc::new(page));
        }
        let has_send_source = self.send_source.is_some();
        if let Some(src) = self.send_source.take() {
            fds.push(src);
        }
        let conns = std::mem::take(&mut self.conns);
        let count = |kind: ConnKind, fds: &mut Vec<Arc<OwnedFd>>| {
            let mut n = 0usize;
            for c in conns.iter().filter(|c| c.kind == kind) {
                fds.push(c.fd.clone());
                n += 1;
            }
            n
        };
        let mains = count(ConnKind::Main, &mut fds) as u16;
        let onces = count(ConnKind::Once, &mut fds) as u8;
        let channels: Vec<(ChannelKey, Channel)> = self.channels.drain().collect();
        // Hung-up channels travel too: requests queued behind them move with the port,
        // and the new holder keeps them for those (`Inner::rekey_moved`).
        port.hung_up.store(0, Ordering::SeqCst);
        fds.extend(channels.iter().map(|(_, c)| c.fd.clone()));
        let no_senders = self.no_senders.take();
        let port_destroyed = self.port_destroyed.take();
        fds.extend(no_senders.iter().chain(port_destroyed.iter()).map(|t| t.fd.clone()));
        if let Some(ep) = &self.epoll {
            for c in &conns {
                sys::epoll_delete(ep.as_fd(), c.fd.as_fd());
            }
        }
        self.moved = true;
        Packed {
            info: ictus_abi::ReceiveRightInfo {
                has_send_source,
                main_conns: mains,
                once_conns: onces,
                channel_conns: u8::try_from(channels.len()).unwrap_or(u8::MAX),
                qlimit: self.qlimit,
                message_limit: port.limit.load(Ordering::Relaxed),
                released: port.ledger.released(),
                no_senders: no_senders.is_some(),
                port_destroyed: port_destroyed.is_some(),
            },
            fds,
            channels,
            no_senders,
            port_destroyed,
        }
    }

    /// Put back what [`RecvState::pack`] took, when the move failed.
    pub(crate) fn unpack(&mut self, p: Packed) {
        let conns = usize::from(p.info.main_conns) + usize::from(p.info.once_conns);
        let mut fds = p.fds.into_iter();
        let _page = fds.next();
        if p.info.has_send_source {
            self.send_source = fds.next();
        }
        self.moved = false;
        for (i, fd) in fds.take(conns).enumerate() {
            if let Some(kind) = conn_kind_at(&p.info, i) {
                let _ = self.add_conn(fd, kind);
            }
        }
        let hung_up = p.channels.iter().filter(|(_, c)| c.hung_up).count() as u32;
        self.channels.extend(p.channels);
        if let Some(port) = self.this.upgrade() {
            port.hung_up.fetch_add(hung_up, Ordering::SeqCst);
        }
        self.no_senders = p.no_senders;
        self.port_destroyed = p.port_destroyed;
    }
}

/// The kind of the `i`-th connection of a packed receive right (after its queue page
/// and send source), main connections first, then once connections; `None` for a call
/// channel (they come after).
pub(crate) fn conn_kind_at(info: &ictus_abi::ReceiveRightInfo, i: usize) -> Option<ConnKind> {
    let mains = usize::from(info.main_conns);
    let onces = usize::from(info.once_conns);
    if i < mains {
        Some(ConnKind::Main)
    } else if i < mains + onces {
        Some(ConnKind::Once)
    } else {
        None
    }
}
