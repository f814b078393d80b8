//! The receiving side of a real-time port: connections, the queue of preallocated
//! buffers, receivers associated with the port, dispatch and hand-off.
//!
//! Status page words (written by the port, read-only to clients): 0 magic, 1 the tid of
//! the receiver waiting in `epoll` (the *poller*: the one a sender raises before waking
//! it), 2 the tid of the receiver serving a request most recently (the one a waiting
//! synchronous sender inherits into). Connection page words (the client's memfd):
//! 0 the PI futex word, 1 and 2 the client's note "I raised tid to priority".

use std::io::IoSlice;
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ictus_rt::thread::Policy;
use rustix::event::epoll;

use crate::attr::{Handoff, PortAttrs, Priority, Queueing};
use crate::error::{AssociateError, ReceiveError, ReplyError};
use crate::prio;
use crate::queue::{choose_receiver, Entry, MessageQueue, Waiting};
use crate::sys::{self, Recv, Sent, SharedPage, FUTEX_TID_MASK};
use crate::wire::{Kind, RtHeader, RT_HEADER_LEN};

pub(crate) const STATUS_MAGIC: u32 = u32::from_le_bytes(*b"RTS1");
pub(crate) const W_MAGIC: usize = 0;
pub(crate) const W_POLLER: usize = 1;
pub(crate) const W_BUSY: usize = 2;
pub(crate) const C_PI: usize = 0;
pub(crate) const C_RAISED_TID: usize = 1;
pub(crate) const C_RAISED_PRIO: usize = 2;

const TOKEN_MAIN: u64 = u64::MAX;
const TOKEN_WAKE: u64 = u64::MAX - 1;
/// Most connections one port accepts.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most receivers one port may have associated.
pub const MAX_RECEIVERS: usize = 64;

/// A connection from one client thread.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) page: Arc<SharedPage>,
}

#[derive(Debug)]
struct ReceiverSlot {
    tid: u32,
    base: Policy,
    assoc: Priority,
    word: Arc<AtomicU32>,
    assigned: Option<Entry>,
    /// The priority a hand-off gave this thread, if it is not at its base.
    applied: Option<Priority>,
    /// Connection pages whose PI word names this receiver but whose request another
    /// receiver answered: released when this one next receives.
    releases: Releases,
}

#[derive(Debug)]
pub(crate) struct State {
    conns: Vec<Option<Conn>>,
    generations: Vec<u32>,
    pub(crate) queue: MessageQueue,
    receivers: Vec<Option<ReceiverSlot>>,
    waiting: Vec<Waiting>,
    poller: Option<usize>,
    ready: Vec<u64>,
    /// The real-time port set this port is a member of: its receivers are the set's,
    /// and it has none of its own.
    pub(crate) in_set: bool,
}

/// Counters of a port, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Message buffers not in use.
    pub free_buffers: usize,
    /// All message buffers.
    pub buffers: usize,
    /// Messages waiting.
    pub waiting: usize,
    /// Open client connections.
    pub connections: usize,
    /// Receivers associated.
    pub receivers: usize,
    /// Malformed datagrams refused (their connections closed).
    pub malformed: u64,
}

/// The shared state of a real-time port.
#[derive(Debug)]
pub(crate) struct PortInner {
    pub(crate) attrs: PortAttrs,
    main_recv: OwnedFd,
    send_source: OwnedFd,
    pub(crate) epoll: OwnedFd,
    wake: OwnedFd,
    status_fd: OwnedFd,
    pub(crate) status: SharedPage,
    state: Mutex<State>,
    pub(crate) dead: AtomicBool,
    malformed: AtomicU64,
}

fn token(index: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | index as u64
}

impl PortInner {
    pub(crate) fn allocate(attrs: PortAttrs) -> Result<Arc<PortInner>, crate::AllocateError> {
        attrs.validate()?;
        let (send_source, main_recv) = sys::seqpacket_pair()?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(std::io::Error::from)?;
        let wake =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
                .map_err(std::io::Error::from)?;
        epoll::add(&epoll, &main_recv, epoll::EventData::new_u64(TOKEN_MAIN), epoll::EventFlags::IN)
            .map_err(std::io::Error::from)?;
        epoll::add(&epoll, &wake, epoll::EventData::new_u64(TOKEN_WAKE), epoll::EventFlags::IN)
            .map_err(std::io::Error::from)?;
        let (status_fd, status) = SharedPage::create("ictus-rtipc-status")?;
        status.word(W_MAGIC).store(STATUS_MAGIC, Ordering::Release);
        sys::seal_read_only_for_others(status_fd.as_fd())?;
        let state = State {
            conns: Vec::new(),
            generations: Vec::new(),
            queue: MessageQueue::new(attrs.queueing, attrs.buffers, attrs.buffer_size),
            receivers: Vec::new(),
            waiting: Vec::with_capacity(MAX_RECEIVERS),
            poller: None,
            ready: Vec::with_capacity(MAX_CONNECTIONS + 2),
            in_set: false,
        };
        Ok(Arc::new(PortInner {
            attrs,
            main_recv,
            send_source,
            epoll,
            wake,
            status_fd,
            status,
            state: Mutex::new(state),
            dead: AtomicBool::new(false),
            malformed: AtomicU64::new(0),
        }))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A duplicate of the port's send end: a send right.
    pub(crate) fn send_right(&self) -> std::io::Result<OwnedFd> {
        Ok(rustix::io::fcntl_dupfd_cloexec(&self.send_source, 0)?)
    }

    pub(crate) fn stats(&self) -> PortStats {
        let st = self.lock();
        PortStats {
            free_buffers: st.queue.free(),
            buffers: self.attrs.buffers as usize,
            waiting: st.queue.len(),
            connections: st.conns.iter().flatten().count(),
            receivers: st.receivers.iter().flatten().count(),
            malformed: self.malformed.load(Ordering::Relaxed),
        }
    }

    /// Whether receivers of its own are associated.
    pub(crate) fn has_receivers(st: &State) -> bool {
        st.receivers.iter().any(Option::is_some)
    }

    /// Destroys the port: receivers get `PortDied`, clients a hang-up.
    pub(crate) fn destroy(&self) {
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut st = self.lock();
        for c in st.conns.iter_mut() {
            if let Some(conn) = c.take() {
                let _ = rustix::net::shutdown(&*conn.fd, rustix::net::Shutdown::Both);
            }
        }
        let _ = rustix::net::shutdown(&self.main_recv, rustix::net::Shutdown::Both);
        for r in st.receivers.iter().flatten() {
            r.word.fetch_add(1, Ordering::SeqCst);
            sys::wake_private(&r.word);
        }
        drop(st);
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Associates the calling thread.
    pub(crate) fn associate(self: &Arc<Self>, priority: Option<Priority>) -> Result<Receiver, AssociateError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(AssociateError::PortDied);
        }
        if prio::native_cached().is_some() {
            return Err(AssociateError::AlreadyAssociated);
        }
        let tid = sys::gettid();
        if let Some(p) = priority {
            // DISP_WORK's `priop`: the receiver's own priority.
            if !prio::hand_off(tid, p) {
                // Refused (no privilege): keep the thread's class; warned once.
            }
        }
        let base = sys::thread_policy(0).unwrap_or(Policy::DEFAULT);
        let assoc = prio::priority_of(base);
        let mut st = self.lock();
        if st.in_set {
            return Err(AssociateError::InSet);
        }
        if st.receivers.iter().flatten().count() >= MAX_RECEIVERS {
            return Err(AssociateError::AlreadyAssociated);
        }
        let slot = ReceiverSlot {
            tid,
            base,
            assoc,
            word: Arc::new(AtomicU32::new(0)),
            assigned: None,
            applied: None,
            releases: Releases::with_capacity(MAX_CONNECTIONS.min(64)),
        };
        let id = match st.receivers.iter().position(Option::is_none) {
            Some(i) => {
                st.receivers[i] = Some(slot);
                i
            }
            None => {
                st.receivers.push(Some(slot));
                st.receivers.len() - 1
            }
        };
        drop(st);
        prio::set_native(Some(assoc));
        Ok(Receiver { port: Arc::clone(self), id, tid, _not_send: PhantomData })
    }

    /// Accepts a connection: checks the client's socket and page, registers them, and
    /// answers with the attributes and the status page.
    fn accept(&self, st: &mut State, conn_fd: OwnedFd, page_fd: OwnedFd) -> Result<(), &'static str> {
        if !sys::is_seqpacket(conn_fd.as_fd()) {
            return Err("connection is not a SOCK_SEQPACKET socket");
        }
        let page = SharedPage::map_untrusted(page_fd.as_fd(), false)?;
        if st.conns.iter().flatten().count() >= MAX_CONNECTIONS {
            return Err("too many connections");
        }
        let index = match st.conns.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                st.conns.push(None);
                st.generations.push(0);
                st.conns.len() - 1
            }
        };
        st.generations[index] = st.generations[index].wrapping_add(1);
        let tok = token(index, st.generations[index]);
        let mut body = [0u8; 20];
        body[..16].copy_from_slice(&self.attrs.encode());
        body[16..20].copy_from_slice(&rustix::process::getpid().as_raw_nonzero().get().to_le_bytes());
        let head = RtHeader { kind: Kind::Accept, flags: 0, priority: 0, seq: 0, len: 20 }.encode();
        match sys::send(conn_fd.as_fd(), &[IoSlice::new(&head), IoSlice::new(&body)], &[self.status_fd.as_fd()], true) {
            Ok(Sent::Ok) => {}
            _ => return Err("could not answer the connection"),
        }
        epoll::add(&self.epoll, &conn_fd, epoll::EventData::new_u64(tok), epoll::EventFlags::IN)
            .map_err(|_| "epoll refused the connection")?;
        st.conns[index] = Some(Conn { fd: Arc::new(conn_fd), page: Arc::new(page) });
        Ok(())
    }

    pub(crate) fn accept_local(&self, conn_fd: OwnedFd, page_fd: OwnedFd) -> Result<(), &'static str> {
        let mut st = self.lock();
        self.accept(&mut st, conn_fd, page_fd)
    }

    pub(crate) fn conn(&self, st: &State, tok: u64) -> Option<Conn> {
        let index = (tok & 0xffff_ffff) as usize;
        let generation = (tok >> 32) as u32;
        if st.generations.get(index) != Some(&generation) {
            return None;
        }
        st.conns.get(index)?.clone()
    }

    fn close_conn(&self, st: &mut State, tok: u64) {
        let index = (tok & 0xffff_ffff) as usize;
        if self.conn(st, tok).is_none() {
            return;
        }
        if let Some(conn) = st.conns[index].take() {
            let _ = epoll::delete(&self.epoll, &*conn.fd);
        }
        // Its waiting messages go, and their buffers come back.
        st.queue.remove_conn(tok);
        for r in st.receivers.iter_mut().flatten() {
            if r.assigned.is_some_and(|e| e.conn == tok) {
                if let Some(e) = r.assigned.take() {
                    st.queue.release(e.slot);
                }
            }
        }
    }

    /// Reads what is ready: connection requests on the main connection, one message
    /// from each ready connection (level-triggered `epoll` reports the rest again).
    pub(crate) fn drain(&self, st: &mut State) {
        let mut i = 0;
        while i < st.ready.len() {
            let tok = st.ready[i];
            match tok {
                TOKEN_WAKE => {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&self.wake, &mut b);
                    st.ready.remove(i);
                }
                TOKEN_MAIN => {
                    self.drain_main(st);
                    st.ready.remove(i);
                }
                _ => {
                    let Some(conn) = self.conn(st, tok) else {
                        st.ready.remove(i);
                        continue;
                    };
                    let Some(slot) = st.queue.reserve() else {
                        // Every buffer is in use: the message stays in the kernel's queue.
                        i += 1;
                        continue;
                    };
                    st.ready.remove(i);
                    self.read_one(st, tok, &conn, slot);
                }
            }
        }
    }

    fn read_one(&self, st: &mut State, tok: u64, conn: &Conn, slot: u32) {
        let mut head = [0u8; RT_HEADER_LEN];
        let mut fds = Vec::new();
        let outcome = sys::recv(conn.fd.as_fd(), &mut head, st.queue.buffer_mut(slot), &mut fds, true);
        match outcome {
            Ok(Recv::Datagram { len, truncated }) => {
                let body_len = len.saturating_sub(RT_HEADER_LEN);
                let parsed = if truncated {
                    Err("message larger than the port's buffers")
                } else if len < RT_HEADER_LEN {
                    Err("short message")
                } else {
                    check_header(&head, body_len, fds.len())
                };
                drop(fds);
                match parsed.and_then(|h| if h.kind == Kind::Request { Ok(h) } else { Err("not a request") }) {
                    Ok(h) => {
                        let priority = h.priority.min(self.attrs.ceiling);
                        // The client's note of a hand-off it made (a hint: a false one
                        // only costs its own request its priority).
                        let raised_tid = conn.page.word(C_RAISED_TID).load(Ordering::Acquire);
                        let raised_prio = conn.page.word(C_RAISED_PRIO).load(Ordering::Acquire);
                        if raised_tid != 0 && raised_prio <= 99 {
                            if let Some(r) = st.receivers.iter_mut().flatten().find(|r| r.tid == raised_tid) {
                                r.applied = Some(raised_prio as Priority);
                            }
                        }
                        let _ = st.queue.commit(slot, tok, priority, h.seq, h.is_sync(), h.len);
                    }
                    Err(_) => {
                        st.queue.release(slot);
                        self.malformed.fetch_add(1, Ordering::Relaxed);
                        self.close_conn(st, tok);
                    }
                }
            }
            Ok(Recv::Empty) => st.queue.release(slot),
            Ok(Recv::HungUp) | Err(_) => {
                st.queue.release(slot);
                self.close_conn(st, tok);
            }
        }
    }

    fn drain_main(&self, st: &mut State) {
        for _ in 0..16 {
            let mut head = [0u8; RT_HEADER_LEN];
            let mut body = [0u8; 64];
            let mut fds = Vec::new();
            match sys::recv(self.main_recv.as_fd(), &mut head, &mut body, &mut fds, true) {
                Ok(Recv::Datagram { len, truncated }) => {
                    let ok = !truncated
                        && len >= RT_HEADER_LEN
                        && matches!(check_header(&head, len - RT_HEADER_LEN, fds.len()), Ok(h) if h.kind == Kind::Connect);
                    if ok && fds.len() == 2 {
                        let page = fds.pop().expect("two");
                        let conn = fds.pop().expect("two");
                        if self.accept(st, conn, page).is_err() {
                            self.malformed.fetch_add(1, Ordering::Relaxed);
                        }
                    } else {
                        // A plain message, or garbage: its descriptors close with `fds`.
                        self.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => return,
            }
        }
    }

    /// Waits in `epoll` (up to `timeout`) and adds what is ready to the ready list.
    pub(crate) fn poll_ready(&self, st: &mut State, timeout: Option<Duration>) {
        let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 16];
        let ts = timeout
            .map(|l| rustix::event::Timespec { tv_sec: l.as_secs() as i64, tv_nsec: i64::from(l.subsec_nanos()) });
        if let Ok((ready, _)) = epoll::wait(&self.epoll, &mut events[..], ts.as_ref()) {
            for ev in ready.iter() {
                let tok = ev.data.u64();
                if !st.ready.contains(&tok) {
                    st.ready.push(tok);
                }
            }
        }
    }

    /// Gives waiting messages to waiting receivers, raising each before waking it.
    fn dispatch(&self, st: &mut State, me: usize) {
        while let Some(next) = st.queue.peek().copied() {
            let Some(i) = choose_receiver(self.attrs.dispatch, &st.waiting, next.priority) else { break };
            let w = st.waiting.remove(i);
            let e = st.queue.pop().expect("peeked");
            let handoff = self.attrs.handoff != Handoff::Off;
            let poller = st.poller;
            let Some(r) = st.receivers.get_mut(w.id).and_then(Option::as_mut) else { continue };
            r.assigned = Some(e);
            if w.id != me {
                if handoff && r.applied != Some(e.priority) && prio::hand_off(r.tid, e.priority) {
                    r.applied = Some(e.priority);
                }
                if poller == Some(w.id) {
                    let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
                } else {
                    r.word.fetch_add(1, Ordering::SeqCst);
                    sys::wake_private(&r.word);
                }
            }
        }
    }
}

fn check_header(head: &[u8; RT_HEADER_LEN], body_len: usize, nfds: usize) -> Result<RtHeader, &'static str> {
    RtHeader::parse_parts(head, body_len, nfds).map_err(|_| "malformed real-time header")
}

/// A message given to a receiver. Make one per receiver ([`Receiver::request_buffer`])
/// and reuse it: receiving never allocates.
#[derive(Debug)]
pub struct Request {
    pub(crate) buf: Vec<u8>,
    pub(crate) len: usize,
    /// The message's priority (as claimed by the sender, capped by the port's ceiling).
    pub priority: Priority,
    /// Whether the sender waits for a reply (synchronous mode).
    pub sync: bool,
    pub(crate) seq: u32,
    pub(crate) conn: Option<Conn>,
    pub(crate) replied: bool,
    /// Whether it came from a priority-inheritance port (its client may wait in a PI
    /// futex naming a receiver).
    pub(crate) inherit: bool,
}

impl Request {
    /// The message body.
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A thread associated with a real-time port (`rt_mach_port_associate`). Only the
/// associated thread can receive: the handle cannot leave it.
#[derive(Debug)]
pub struct Receiver {
    port: Arc<PortInner>,
    id: usize,
    tid: u32,
    _not_send: PhantomData<*const ()>,
}

impl Receiver {
    /// A request buffer sized for this port (the only allocation; do it once).
    pub fn request_buffer(&self) -> Request {
        Request {
            buf: vec![0; self.port.attrs.buffer_size as usize],
            len: 0,
            priority: 0,
            sync: false,
            seq: 0,
            conn: None,
            replied: false,
            inherit: false,
        }
    }

    /// This receiver's thread id.
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// The port's attributes.
    pub fn attrs(&self) -> PortAttrs {
        self.port.attrs
    }

    /// Receives the next message by the port's policies. Hand-off and inheritance from
    /// the previous message end here: the thread returns to its own priority (or goes
    /// straight to the next message's, under hand-off).
    pub fn receive(&mut self, req: &mut Request, timeout: Option<Duration>) -> Result<(), ReceiveError> {
        let need = self.port.attrs.buffer_size as usize;
        if req.buf.len() < need {
            return Err(ReceiveError::BufferTooSmall { have: req.buf.len(), need });
        }
        prio::set_inherited(None);
        req.conn = None;
        let port = &*self.port;
        let deadline = timeout.map(|t| Instant::now() + t);
        let me = self.id;
        let mut st = port.lock();
        self.release_pending(&mut st);
        let assoc = self.slot(&st).assoc;
        st.waiting.push(Waiting { id: me, priority: assoc });
        let entry = loop {
            if port.dead.load(Ordering::SeqCst) {
                st.waiting.retain(|w| w.id != me);
                return Err(ReceiveError::PortDied);
            }
            if let Some(e) = self.slot_mut(&mut st).assigned.take() {
                break e;
            }
            if !st.queue.is_empty() {
                // Messages are waiting; look for newer ones before choosing, so that
                // the choice is made over everything pending (a zero-timeout poll).
                port.poll_ready(&mut st, Some(Duration::ZERO));
            }
            port.drain(&mut st);
            port.dispatch(&mut st, me);
            if self.slot(&st).assigned.is_some() {
                continue;
            }
            if port.status.word(W_BUSY).load(Ordering::Relaxed) == self.tid {
                port.status.word(W_BUSY).store(0, Ordering::Release);
            }
            let left = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        st.waiting.retain(|w| w.id != me);
                        return Err(ReceiveError::TimedOut);
                    }
                    Some(left)
                }
                None => None,
            };
            // Nothing for us: go back to our own priority before blocking, and only
            // then say we are the one waiting, so that a sender who raises us does so
            // after this restore (the note it leaves is then true).
            let (base, applied) = (self.slot(&st).base, self.slot(&st).applied);
            if applied.is_some() {
                prio::restore(self.tid, base);
                self.slot_mut(&mut st).applied = None;
            }
            if st.poller.is_none() && st.queue.free() > 0 {
                st.poller = Some(me);
                port.status.word(W_POLLER).store(self.tid, Ordering::SeqCst);
                drop(st);
                let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 16];
                let ts = left.map(|l| rustix::event::Timespec {
                    tv_sec: l.as_secs() as i64,
                    tv_nsec: i64::from(l.subsec_nanos()),
                });
                let got = epoll::wait(&port.epoll, &mut events[..], ts.as_ref());
                st = port.lock();
                st.poller = None;
                port.status.word(W_POLLER).store(0, Ordering::SeqCst);
                if let Ok((ready, _)) = got {
                    for ev in ready.iter() {
                        let tok = ev.data.u64();
                        if !st.ready.contains(&tok) {
                            st.ready.push(tok);
                        }
                    }
                }
            } else {
                let word = Arc::clone(&self.slot(&st).word);
                let seen = word.load(Ordering::SeqCst);
                drop(st);
                sys::wait_private(&word, seen, left.or(Some(Duration::from_millis(50))));
                st = port.lock();
            }
        };
        st.waiting.retain(|w| w.id != me);
        // Copy the body out and free the buffer at once.
        let len = entry.len as usize;
        req.buf[..len].copy_from_slice(st.queue.body(entry.slot, entry.len));
        st.queue.release(entry.slot);
        req.len = len;
        req.priority = entry.priority;
        req.sync = entry.sync;
        req.seq = entry.seq;
        req.replied = false;
        req.conn = port.conn(&st, entry.conn);
        req.inherit = port.attrs.queueing == Queueing::PriorityInheritance;
        port.status.word(W_BUSY).store(self.tid, Ordering::SeqCst);
        // If we were the poller and others wait, hand the polling on.
        if st.poller.is_none() {
            if let Some(w) = st.waiting.first().copied() {
                if let Some(r) = st.receivers.get(w.id).and_then(Option::as_ref) {
                    r.word.fetch_add(1, Ordering::SeqCst);
                    sys::wake_private(&r.word);
                }
            }
        }
        let applied = self.slot(&st).applied;
        let want = match port.attrs.handoff {
            Handoff::Off => None,
            Handoff::Sender | Handoff::Message => Some(entry.priority),
        };
        if let Some(p) = want {
            if applied != Some(p) && prio::hand_off(self.tid, p) {
                self.slot_mut(&mut st).applied = Some(p);
            }
        }
        drop(st);
        prio::set_inherited(if entry.sync { Some(entry.priority) } else { None });
        Ok(())
    }

    fn slot<'a>(&self, st: &'a State) -> &'a ReceiverSlot {
        st.receivers[self.id].as_ref().expect("associated receiver has a slot")
    }

    fn slot_mut<'a>(&self, st: &'a mut State) -> &'a mut ReceiverSlot {
        st.receivers[self.id].as_mut().expect("associated receiver has a slot")
    }

    fn release_pending(&self, st: &mut State) {
        self.slot_mut(st).releases.release_all(self.tid);
    }

    /// Answers a synchronous request and ends the inheritance its sender gave us.
    pub fn reply(&mut self, req: &mut Request, body: &[u8]) -> Result<(), ReplyError> {
        let port = &self.port;
        send_reply(req, body, self.tid, |w, page| {
            // It inherited into another receiver of this port: that one lets go when it
            // next receives.
            let mut st = port.lock();
            if let Some(r) = st.receivers.iter_mut().flatten().find(|r| r.tid == w) {
                r.releases.defer(page);
            }
        })
    }

    /// Breaks the association (`rt_mach_port_not_associate`) and returns the thread to
    /// its own priority.
    pub fn dissociate(self) {
        drop(self);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut st = self.port.lock();
        self.release_pending(&mut st);
        st.waiting.retain(|w| w.id != self.id);
        if let Some(r) = st.receivers[self.id].take() {
            if let Some(e) = r.assigned {
                // Give an undelivered message back to the queue's owner: requeue it.
                let (conn, prio, seq, sync, len) = (e.conn, e.priority, e.seq, e.sync, e.len);
                let _ = st.queue.commit(e.slot, conn, prio, seq, sync, len);
            }
            if r.applied.is_some() {
                prio::restore(r.tid, r.base);
            }
        }
        if st.poller.is_none() {
            if let Some(w) = st.waiting.first().copied() {
                if let Some(r) = st.receivers.get(w.id).and_then(Option::as_ref) {
                    r.word.fetch_add(1, Ordering::SeqCst);
                    sys::wake_private(&r.word);
                }
            }
        }
        drop(st);
        prio::set_native(None);
        prio::set_inherited(None);
    }
}

/// Sends the reply to a synchronous request received by thread `tid`, and ends the
/// inheritance its sender gave: if the client's PI word names `tid` it is released now;
/// if it names another receiver, `elsewhere(that tid, page)` records it for that one.
pub(crate) fn send_reply(
    req: &mut Request,
    body: &[u8],
    tid: u32,
    elsewhere: impl FnOnce(u32, Arc<SharedPage>),
) -> Result<(), ReplyError> {
    if !req.sync {
        return Err(ReplyError::NotSynchronous);
    }
    if req.replied {
        return Err(ReplyError::AlreadyReplied);
    }
    if body.len() > crate::attr::MAX_MESSAGE as usize {
        return Err(ReplyError::TooLarge(body.len()));
    }
    req.replied = true;
    let conn = req.conn.take().ok_or(ReplyError::ClientGone)?;
    let head = RtHeader { kind: Kind::Reply, flags: 0, priority: 0, seq: req.seq, len: body.len() as u32 }.encode();
    // Never block on a client: a synchronous client has room for its one reply.
    let sent = sys::send(conn.fd.as_fd(), &[IoSlice::new(&head), IoSlice::new(body)], &[], true)?;
    // SYNC POINT: the reply is queued before we look at the client's PI word; the
    // client stores the word before it looks for the reply (see client.rs).
    fence(Ordering::SeqCst);
    if req.inherit {
        let w = conn.page.word(C_PI).load(Ordering::SeqCst) & FUTEX_TID_MASK;
        if w == tid {
            release_pi(&conn.page, tid);
        } else if w != 0 {
            elsewhere(w, Arc::clone(&conn.page));
        }
    }
    match sent {
        Sent::Ok => Ok(()),
        Sent::WouldBlock | Sent::Dead => Err(ReplyError::ClientGone),
    }
}

/// PI words a receiver inherited through and must let go of when it next receives,
/// because another receiver answered the request (bounded, allocated at association:
/// nothing allocates on the receive path).
#[derive(Debug)]
pub(crate) struct Releases(Vec<Arc<SharedPage>>);

impl Releases {
    pub(crate) fn with_capacity(n: usize) -> Releases {
        Releases(Vec::with_capacity(n))
    }

    /// Record `page` for later, if there is room (the capacity is fixed at association).
    pub(crate) fn defer(&mut self, page: Arc<SharedPage>) {
        if self.0.len() < self.0.capacity() {
            self.0.push(page);
        }
    }

    /// Let go of every recorded word that names `tid`.
    pub(crate) fn release_all(&mut self, tid: u32) {
        while let Some(page) = self.0.pop() {
            release_pi(&page, tid);
        }
    }
}

/// Lets go of a connection's PI word if it names `tid`: its waiting client gets it (and
/// the kernel ends the boost), or it is cleared if nobody waits yet.
pub(crate) fn release_pi(page: &SharedPage, tid: u32) {
    let w = page.word(C_PI);
    for _ in 0..8 {
        let v = w.load(Ordering::SeqCst);
        if v & FUTEX_TID_MASK != tid {
            return;
        }
        if v == tid {
            if w.compare_exchange(v, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                return;
            }
        } else {
            // Waiters: the kernel hands the word over and unboosts us.
            let _ = sys::unlock_pi(w);
            return;
        }
    }
}
