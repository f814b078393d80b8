//! The receiving side of a real-time port: its main connection, its clients'
//! connections, the queue of preallocated buffers, reading and replying. Who receives,
//! and at what priority, is the receiver group's business (`group.rs`).
//!
//! As the nucleus's calls do (`doc/ipc.md`, *Calls*), requests travel on the port's
//! **main connection**, the one every send right reaches, each naming its client's
//! connection by a token, and the port's receiver waits in one `recvmmsg` there: it
//! wakes for the first datagram and drains what queued behind it in the same call. The
//! kernel stamps every datagram with the sender's pid (`SO_PASSCRED`); a connection is
//! kept under the pid of the process that made it (`SO_PEERCRED`), so a task names only
//! its own connections, whatever token it guesses. Replies go through the client's
//! **reply pipe** (the OS layer's, shared with the nucleus), or on the connection when
//! they do not fit one pipe write. The connections themselves carry the connection's
//! answer and large replies, and their hang-up is the client's death, which the space's
//! notifier reports (as it does for a port's kept call channels).
//!
//! Status page words (written by the port, read-only to clients): [`W_MAGIC`], the tid
//! of the receiver waiting for messages ([`W_POLLER`], the one a sender raises before
//! waking it) and the priority it waits at ([`W_POLLER_AT`], +1; 0 when unknown), the
//! tid of the receiver serving most recently ([`W_BUSY`], the one a waiting synchronous
//! sender inherits into) and the number of the waiting receiver's current wait
//! ([`W_EPOCH`]). Connection page words (the client's memfd): [`C_PI`], the PI futex
//! word, and the client's note of its hand-off: the thread it raised (or found at its
//! priority), the priority, and the wait it saw ([`C_RAISED_TID`], [`C_RAISED_PRIO`],
//! [`C_RAISED_EPOCH`]).

use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ictus_ipc::{HangUpWatch, Space};

use crate::attr::{PortAttrs, Priority};
use crate::error::ReplyError;
use crate::queue::MessageQueue;
use crate::sys::{self, pipe, Batch, RecvMsg, Sent, SharedPage, BATCH, FUTEX_TID_MASK};
use crate::wire::{Kind, RtHeader, FLAG_ON_SOCKET, RT_HEADER_LEN};

pub(crate) const STATUS_MAGIC: u32 = u32::from_le_bytes(*b"RTS2");
pub(crate) const W_MAGIC: usize = 0;
pub(crate) const W_POLLER: usize = 1;
pub(crate) const W_BUSY: usize = 2;
pub(crate) const W_POLLER_AT: usize = 3;
pub(crate) const W_EPOCH: usize = 4;
pub(crate) const C_PI: usize = 0;
pub(crate) const C_RAISED_TID: usize = 1;
pub(crate) const C_RAISED_PRIO: usize = 2;
pub(crate) const C_RAISED_EPOCH: usize = 3;

/// Most connections one port accepts.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most receivers one port (or port set) may have associated.
pub const MAX_RECEIVERS: usize = 64;
/// Hand-off notes kept between two looks of the receivers (more: they are all in doubt).
const NOTES: usize = 64;

/// A client thread's connection, as the port keeps it.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) page: SharedPage,
    /// The write end of the client's reply pipe, until the connection is closed (so
    /// that a client waiting on its pipe sees the end at once) or the client let go of
    /// the read end.
    pipe: Mutex<Option<OwnedFd>>,
    /// The process that made the connection (`SO_PEERCRED`); only its requests may name it.
    pid: u32,
}

impl Conn {
    fn close(&self) {
        let _ = rustix::net::shutdown(&*self.fd, rustix::net::Shutdown::Both);
        self.pipe.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

#[derive(Debug)]
struct ConnSlot {
    conn: Arc<Conn>,
    watch: Option<HangUpWatch>,
}

/// A connection's place in the port's table.
#[derive(Debug)]
enum Slot {
    /// An open connection.
    Open(ConnSlot),
    /// Its client hung up (died, or let go of it). Requests it sent before may still
    /// wait in the main connection's kernel queue: they are delivered as Mach delivers a
    /// message queued before its sender died, and their replies have nowhere to go
    /// ([`ReplyError::ClientGone`]). Kept, with the process that made the connection,
    /// only until nothing from before the hang-up can still be in the kernel's queue
    /// ([`PortInner::forget_hung_up`]).
    HungUp { pid: u32 },
}

/// Who sent a request, by the token it names.
enum From {
    Open(Arc<Conn>),
    HungUp,
}

/// A client's note of a hand-off, read with its request: it set thread `tid` to
/// `priority` (or found it waiting there) while the receivers' wait numbered `epoch`
/// was on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Note {
    pub(crate) tid: u32,
    pub(crate) priority: Priority,
    pub(crate) epoch: u32,
}

#[derive(Debug)]
pub(crate) struct State {
    conns: Vec<Option<Slot>>,
    /// Slots that are [`Slot::HungUp`].
    hung_up: usize,
    generations: Vec<u16>,
    pub(crate) queue: MessageQueue,
    /// The real-time port set this port is a member of: its receivers are the set's,
    /// and it has none of its own.
    pub(crate) in_set: bool,
    /// Hand-off notes read since the receivers last looked.
    pub(crate) notes: Vec<Note>,
    /// Notes were dropped for lack of room: every receiver's priority is in doubt.
    pub(crate) notes_lost: bool,
    /// Buffers lent to a read under way (free: no message is in them).
    reading: usize,
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
    /// Connections whose client hung up, kept until what it sent before is read from
    /// the kernel's queue (then forgotten: nothing of a dead client stays).
    pub hung_up: usize,
    /// Receivers associated.
    pub receivers: usize,
    /// Malformed datagrams refused.
    pub malformed: u64,
}

/// How [`PortInner::read`] may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Not at all: take what is queued.
    Now,
    /// For the first datagram, up to this long (`None`: for ever).
    Block(Option<Duration>),
}

/// What a [`PortInner::read`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// Datagrams came (messages, connections, doorbells), and nothing was left queued
    /// behind them when they were taken.
    Drained,
    /// Datagrams came, as many as there was room for: more may be queued.
    Got,
    /// Nothing came: the queue was empty, the wait timed out or was interrupted.
    Nothing,
    /// No free buffer to read into: the datagrams stay in the kernel's queue.
    NoRoom,
    /// The port was destroyed.
    Dead,
}

/// The shared state of a real-time port.
#[derive(Debug)]
pub(crate) struct PortInner {
    pub(crate) attrs: PortAttrs,
    space: Space,
    main_recv: OwnedFd,
    send_source: OwnedFd,
    status_fd: OwnedFd,
    pub(crate) status: SharedPage,
    state: Mutex<State>,
    pub(crate) dead: AtomicBool,
    malformed: AtomicU64,
    /// The receive time-out set on the main connection, in nanoseconds (0: none).
    timer: AtomicU64,
}

fn token(index: usize, generation: u16) -> u32 {
    (u32::from(generation) << 16) | index as u32
}

impl PortInner {
    pub(crate) fn allocate(space: &Space, attrs: PortAttrs) -> Result<Arc<PortInner>, crate::AllocateError> {
        attrs.validate()?;
        let (send_source, main_recv) = sys::seqpacket_pair()?;
        sys::set_passcred(main_recv.as_fd())?;
        let (status_fd, status) = SharedPage::create("ictus-rtipc-status")?;
        status.word(W_MAGIC).store(STATUS_MAGIC, Ordering::Release);
        sys::seal_read_only_for_others(status_fd.as_fd())?;
        let state = State {
            conns: Vec::new(),
            hung_up: 0,
            generations: Vec::new(),
            queue: MessageQueue::new(attrs.queueing, attrs.buffers, attrs.buffer_size),
            in_set: false,
            notes: Vec::with_capacity(NOTES),
            notes_lost: false,
            reading: 0,
        };
        Ok(Arc::new(PortInner {
            attrs,
            space: space.clone(),
            main_recv,
            send_source,
            status_fd,
            status,
            state: Mutex::new(state),
            dead: AtomicBool::new(false),
            malformed: AtomicU64::new(0),
            timer: AtomicU64::new(0),
        }))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A duplicate of the port's send end: a send right.
    pub(crate) fn send_right(&self) -> std::io::Result<OwnedFd> {
        Ok(rustix::io::fcntl_dupfd_cloexec(&self.send_source, 0)?)
    }

    /// The main connection's receive end (a port set's epoll watches it).
    pub(crate) fn main_recv(&self) -> &OwnedFd {
        &self.main_recv
    }

    /// Wakes a receiver blocked on the main connection.
    pub(crate) fn ring(&self) {
        sys::ring(self.send_source.as_fd());
    }

    pub(crate) fn stats(&self, receivers: usize) -> PortStats {
        let st = self.lock();
        PortStats {
            free_buffers: st.queue.free() + st.reading,
            buffers: self.attrs.buffers as usize,
            waiting: st.queue.len(),
            connections: st.conns.iter().flatten().filter(|s| matches!(s, Slot::Open(_))).count(),
            hung_up: st.hung_up,
            receivers,
            malformed: self.malformed.load(Ordering::Relaxed),
        }
    }

    /// Destroys the port: a receiver waiting on it wakes (and its group sees the port
    /// dead), every client sees its connection and reply pipe end.
    pub(crate) fn destroy(&self) {
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = rustix::net::shutdown(&self.main_recv, rustix::net::Shutdown::Both);
        let slots: Vec<ConnSlot> = {
            let mut st = self.lock();
            st.hung_up = 0;
            st.conns
                .iter_mut()
                .filter_map(|s| match s.take() {
                    Some(Slot::Open(s)) => Some(s),
                    _ => None,
                })
                .collect()
        };
        for s in slots {
            if let Some(w) = s.watch {
                self.space.cancel_hang_up(w);
            }
            s.conn.close();
        }
    }

    /// Reads what the main connection holds into free buffers, waiting for the first
    /// datagram if asked to: requests are queued, connections accepted, doorbells
    /// dropped, anything else refused and counted. One `recvmmsg`; the buffers are lent
    /// out of the queue meanwhile, so nobody waits for the port's lock while this waits.
    pub(crate) fn read(self: &Arc<Self>, wait: Wait) -> Read {
        if self.dead.load(Ordering::SeqCst) {
            return Read::Dead;
        }
        // A wait reads two: one is what it waits for, a second says whether more were
        // queued behind it (a priority queue must see those before it chooses). A look
        // without waiting takes up to a batch.
        let want = match wait {
            Wait::Now => BATCH,
            Wait::Block(_) => 2,
        };
        let mut slots = [0u32; BATCH];
        let mut bufs: [Box<[u8]>; BATCH] = Default::default();
        let k = {
            let mut st = self.lock();
            let k = st.queue.free().min(want);
            for (slot, buf) in slots.iter_mut().zip(bufs.iter_mut()).take(k) {
                *slot = st.queue.reserve().expect("counted free");
                *buf = st.queue.lend(*slot);
            }
            st.reading += k;
            k
        };
        if k == 0 {
            return Read::NoRoom;
        }
        let nonblocking = match wait {
            Wait::Now => true,
            Wait::Block(t) => {
                self.set_timer(t);
                false
            }
        };
        let mut heads = [[0u8; RT_HEADER_LEN]; BATCH];
        let mut fds: [Vec<OwnedFd>; BATCH] = Default::default();
        let mut out = [RecvMsg { bytes: 0, creds: None, truncated: false, control_truncated: false }; BATCH];
        let result = sys::recv_batch(
            self.main_recv.as_fd(),
            &mut heads[..k],
            &mut bufs[..k],
            &mut fds[..k],
            &mut out[..k],
            nonblocking,
        );
        let n = match result {
            Ok(Batch::Got(n)) => n,
            _ => 0,
        };
        let mut outcome = match n {
            0 => Read::Nothing,
            n if n < k => Read::Drained,
            _ => Read::Got,
        };
        let mut st = self.lock();
        st.reading -= k;
        for i in 0..k {
            st.queue.give_back(slots[i], std::mem::take(&mut bufs[i]));
            if i < n {
                if !self.take(&mut st, slots[i], &heads[i], &out[i], std::mem::take(&mut fds[i])) {
                    outcome = Read::Dead;
                }
            } else {
                st.queue.release(slots[i]);
            }
        }
        self.forget_hung_up(&mut st);
        drop(st);
        if outcome == Read::Dead {
            self.destroy();
        }
        outcome
    }

    /// Sets the main connection's receive time-out for a wait of `t`, when what is set
    /// would not do: none where one is needed, longer than `t` (by more than 1/16), or
    /// much shorter. So a receiver waiting again and again with about the same time-out
    /// makes no system call for it. A time-out is a lower bound, late by up to 1/16.
    fn set_timer(&self, t: Option<Duration>) {
        let want = t.map_or(0, |t| (t.as_nanos() as u64).max(1));
        let have = self.timer.load(Ordering::Relaxed);
        let fits = match (want, have) {
            (0, h) => h == 0,
            (_, 0) => false,
            (w, h) => h >= w / 2 && h <= w + w / 16,
        };
        if !fits && sys::set_receive_timeout(self.main_recv.as_fd(), t).is_ok() {
            self.timer.store(want, Ordering::Relaxed);
        }
    }

    /// Handles one datagram read into `slot`: a request is queued there, the rest free
    /// it. False: the main connection hung up (the port is being destroyed).
    fn take(
        self: &Arc<Self>,
        st: &mut State,
        slot: u32,
        head: &[u8; RT_HEADER_LEN],
        m: &RecvMsg,
        fds: Vec<OwnedFd>,
    ) -> bool {
        let truncated = sys::truncated(m, fds.len());
        let pid = m.creds.map(|c| c.pid);
        if m.bytes == 0 && fds.is_empty() && !truncated {
            st.queue.release(slot);
            return false;
        }
        let parsed = if m.bytes < RT_HEADER_LEN {
            Err(())
        } else {
            RtHeader::parse_parts(head, m.bytes - RT_HEADER_LEN, fds.len()).map_err(|_| ())
        };
        match parsed {
            Ok(h) if h.kind == Kind::Request => {
                let from = pid.and_then(|pid| self.sender(st, h.conn, pid));
                match from {
                    Some(From::Open(c)) if !truncated => {
                        // The client's note of a hand-off it made (a hint: a false one
                        // only costs its own request its priority).
                        let note = Note {
                            tid: c.page.word(C_RAISED_TID).load(Ordering::Acquire),
                            priority: c.page.word(C_RAISED_PRIO).load(Ordering::Acquire).min(255) as u8,
                            epoch: c.page.word(C_RAISED_EPOCH).load(Ordering::Acquire),
                        };
                        if note.tid != 0 && note.priority <= crate::attr::MAX_PRIORITY {
                            if st.notes.len() < NOTES {
                                st.notes.push(note);
                            } else {
                                st.notes_lost = true;
                            }
                        }
                        let priority = h.priority.min(self.attrs.ceiling);
                        let _ = st.queue.commit(slot, u64::from(h.conn), priority, h.seq, h.is_sync(), h.len);
                    }
                    Some(From::HungUp) if !truncated => {
                        // Sent before its client hung up: delivered all the same (its
                        // reply will find the client gone).
                        let priority = h.priority.min(self.attrs.ceiling);
                        let _ = st.queue.commit(slot, u64::from(h.conn), priority, h.seq, h.is_sync(), h.len);
                    }
                    Some(From::Open(_)) => {
                        // Larger than the port's buffers: refused, and its sender's
                        // connection closed.
                        st.queue.release(slot);
                        self.refused();
                        self.close_conn(st, h.conn);
                    }
                    Some(From::HungUp) => {
                        st.queue.release(slot);
                        self.refused();
                    }
                    None => {
                        // A connection the sender did not make, or one closed since.
                        st.queue.release(slot);
                        self.refused();
                    }
                }
            }
            Ok(h) if h.kind == Kind::Connect && !truncated => {
                st.queue.release(slot);
                if self.accept(st, fds, pid).is_err() {
                    self.refused();
                }
            }
            Ok(h) if h.kind == Kind::Wake => st.queue.release(slot),
            _ => {
                // A plain message, garbage, a kind that has no business here: its
                // descriptors close with `fds`.
                st.queue.release(slot);
                self.refused();
            }
        }
        true
    }

    fn refused(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    /// The connection a token names, if it is open and (with `pid`) that process made it.
    fn conn_of(&self, st: &State, tok: u32, pid: Option<u32>) -> Option<Arc<Conn>> {
        let index = (tok & 0xffff) as usize;
        let generation = (tok >> 16) as u16;
        if st.generations.get(index) != Some(&generation) {
            return None;
        }
        let Slot::Open(s) = st.conns.get(index)?.as_ref()? else { return None };
        (pid.is_none() || pid == Some(s.conn.pid)).then(|| Arc::clone(&s.conn))
    }

    /// Who sent a request naming `tok`, as the kernel stamped its pid: a connection that
    /// process made, open or hung up since. `None`: not one of its connections.
    fn sender(&self, st: &State, tok: u32, pid: u32) -> Option<From> {
        let index = (tok & 0xffff) as usize;
        let generation = (tok >> 16) as u16;
        if st.generations.get(index) != Some(&generation) {
            return None;
        }
        match st.conns.get(index)?.as_ref()? {
            Slot::Open(s) if s.conn.pid == pid => Some(From::Open(Arc::clone(&s.conn))),
            Slot::HungUp { pid: p } if *p == pid => Some(From::HungUp),
            _ => None,
        }
    }

    /// Forgets the hung-up connections once nothing they sent can still be unread: no
    /// read is under way (its datagrams would not have been taken yet) and the main
    /// connection's kernel queue is empty (`FIONREAD`, which for `SOCK_SEQPACKET`
    /// counts every queued datagram). A client's requests are queued before its
    /// connection can hang up (an `AF_UNIX` send is complete when it returns), so none
    /// can come later. One `ioctl`, and only while some connection is hung up.
    fn forget_hung_up(&self, st: &mut State) {
        if st.hung_up == 0 || st.reading != 0 {
            return;
        }
        if rustix::io::ioctl_fionread(&self.main_recv).ok() != Some(0) {
            return;
        }
        for s in &mut st.conns {
            if matches!(s, Some(Slot::HungUp { .. })) {
                *s = None;
            }
        }
        st.hung_up = 0;
    }

    /// The connection a queued message came on, if it is still open.
    pub(crate) fn conn(&self, st: &State, tok: u64) -> Option<Arc<Conn>> {
        self.conn_of(st, tok as u32, None)
    }

    /// Accepts a connection offered on the main connection by process `pid` (as the
    /// kernel stamped the offer): its socket must be one that process made, its page a
    /// sealed one-page memfd, its pipe the write end of a pipe.
    fn accept(self: &Arc<Self>, st: &mut State, fds: Vec<OwnedFd>, pid: Option<u32>) -> Result<(), &'static str> {
        let pid = pid.filter(|&p| p != 0).ok_or("the kernel cannot name the client's process")?;
        let [conn, page, pipe_w]: [OwnedFd; 3] =
            fds.try_into().map_err(|_| "a connection offer has three descriptors")?;
        if !sys::is_seqpacket(conn.as_fd()) {
            return Err("connection is not a SOCK_SEQPACKET socket");
        }
        if sys::peer_pid(conn.as_fd()) != Some(pid) {
            return Err("the connection was made by another process");
        }
        if !pipe::is_write_end(pipe_w.as_fd()) {
            return Err("the reply pipe is not a pipe's write end");
        }
        let page = SharedPage::map_untrusted(page.as_fd(), false)?;
        self.register(st, Conn { fd: Arc::new(conn), page, pipe: Mutex::new(Some(pipe_w)), pid })
    }

    /// Accepts a connection made in this task for a port of this task (no receiver
    /// needs to be waiting).
    pub(crate) fn accept_local(
        self: &Arc<Self>,
        conn: OwnedFd,
        page: OwnedFd,
        pipe_w: OwnedFd,
    ) -> Result<(), &'static str> {
        let mut st = self.lock();
        self.accept(&mut st, vec![conn, page, pipe_w], Some(sys::getpid()))
    }

    /// Keeps a checked connection, watched for its client's death, and answers it with
    /// the port's attributes, its token and the status page.
    fn register(self: &Arc<Self>, st: &mut State, conn: Conn) -> Result<(), &'static str> {
        self.forget_hung_up(st);
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
        let generation = st.generations[index].wrapping_add(1).max(1);
        st.generations[index] = generation;
        let tok = token(index, generation);
        let weak = Arc::downgrade(self);
        let watch = self
            .space
            .watch_hang_up(Arc::clone(&conn.fd), move || {
                if let Some(p) = weak.upgrade() {
                    p.hung_up(tok);
                }
            })
            .map_err(|_| "cannot watch the connection")?;
        let mut body = [0u8; 20];
        body[..16].copy_from_slice(&self.attrs.encode());
        body[16..20].copy_from_slice(&sys::getpid().to_le_bytes());
        let head = RtHeader { len: 20, conn: tok, ..RtHeader::new(Kind::Accept) }.encode();
        let bufs = [IoSlice::new(&head), IoSlice::new(&body)];
        if !matches!(sys::send(conn.fd.as_fd(), &bufs, &[self.status_fd.as_fd()], true), Ok(Sent::Ok)) {
            self.space.cancel_hang_up(watch);
            return Err("could not answer the connection");
        }
        st.conns[index] = Some(Slot::Open(ConnSlot { conn: Arc::new(conn), watch: Some(watch) }));
        Ok(())
    }

    /// The notifier saw a client's connection hang up: close it, and keep its place as
    /// hung up while requests it sent before may still be unread. The requests that
    /// already wait in the port's queue stay there: Mach delivers a message queued
    /// before its sender died.
    fn hung_up(&self, tok: u32) {
        let mut st = self.lock();
        if self.conn_of(&st, tok, None).is_some() {
            let index = (tok & 0xffff) as usize;
            if let Some(Slot::Open(s)) = st.conns[index].take() {
                s.conn.close();
                st.conns[index] = Some(Slot::HungUp { pid: s.conn.pid });
                st.hung_up += 1;
            }
            self.forget_hung_up(&mut st);
        }
    }

    /// Closes a connection of the port's own accord (its client misbehaved).
    fn close_conn(&self, st: &mut State, tok: u32) {
        if self.conn_of(st, tok, None).is_none() {
            return;
        }
        if let Some(Slot::Open(s)) = st.conns[(tok & 0xffff) as usize].take() {
            if let Some(w) = s.watch {
                self.space.cancel_hang_up(w);
            }
            s.conn.close();
        }
        st.queue.remove_conn(u64::from(tok));
    }
}

/// A message given to a receiver. Make one per receiver (`request_buffer`) and reuse
/// it: receiving never allocates.
#[derive(Debug)]
pub struct Request {
    pub(crate) buf: Vec<u8>,
    pub(crate) len: usize,
    /// The message's priority (as claimed by the sender, capped by the port's ceiling).
    pub priority: Priority,
    /// Whether the sender waits for a reply (synchronous mode).
    pub sync: bool,
    pub(crate) seq: u32,
    pub(crate) conn: Option<Arc<Conn>>,
    pub(crate) replied: bool,
    /// Whether it came from a priority-inheritance port (its client may wait in a PI
    /// futex naming a receiver).
    pub(crate) inherit: bool,
    /// Whether its receiver serves it at its sender's priority (a hand-off).
    pub(crate) handed_off: bool,
}

impl Request {
    pub(crate) fn with_capacity(n: usize) -> Request {
        Request {
            buf: vec![0; n],
            len: 0,
            priority: 0,
            sync: false,
            seq: 0,
            conn: None,
            replied: false,
            inherit: false,
            handed_off: false,
        }
    }

    /// The message body.
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Sends the reply to a synchronous request received by thread `tid`, and ends the
/// inheritance its sender gave: if the client's PI word names `tid` it is released now;
/// if it names another receiver, `elsewhere(that tid, conn)` records it for that one.
///
/// A reply that fits one pipe write goes through the client's reply pipe, never
/// waiting; a larger one, or one the pipe refuses (full, or its reader gone), goes on
/// the connection, and a word on the pipe says so.
pub(crate) fn send_reply(
    req: &mut Request,
    body: &[u8],
    tid: u32,
    elsewhere: impl FnOnce(u32, Arc<Conn>),
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
    let head = RtHeader { seq: req.seq, len: body.len() as u32, ..RtHeader::new(Kind::Reply) }.encode();
    let bufs = [IoSlice::new(&head), IoSlice::new(body)];
    let sent = {
        let mut pipe = conn.pipe.lock().unwrap_or_else(|p| p.into_inner());
        let through_pipe = match pipe.as_ref() {
            Some(p) if RT_HEADER_LEN + body.len() <= pipe::PIPE_BUF => match pipe::write_nowait(p.as_fd(), &bufs) {
                Ok(()) => true,
                Err(rustix::io::Errno::PIPE) => {
                    // The client let go of its pipe: replies go on the connection.
                    *pipe = None;
                    false
                }
                Err(_) => false,
            },
            _ => false,
        };
        if through_pipe {
            Sent::Ok
        } else {
            // Never block on a client: a synchronous client has room for its one reply.
            let sent = sys::send(conn.fd.as_fd(), &bufs, &[], true)?;
            if let Some(p) = pipe.as_ref() {
                let word = RtHeader { seq: req.seq, flags: FLAG_ON_SOCKET, ..RtHeader::new(Kind::Reply) }.encode();
                let _ = pipe::write_nowait(p.as_fd(), &[IoSlice::new(&word)]);
            }
            sent
        }
    };
    // SYNC POINT: the reply is queued before we look at the client's PI word; the
    // client stores the word before it looks for the reply (see client.rs).
    fence(Ordering::SeqCst);
    if req.inherit {
        let w = conn.page.word(C_PI).load(Ordering::SeqCst) & FUTEX_TID_MASK;
        if w == tid {
            release_pi(&conn.page, tid);
        } else if w != 0 {
            elsewhere(w, conn);
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
pub(crate) struct Releases(Vec<Arc<Conn>>);

impl Releases {
    pub(crate) fn with_capacity(n: usize) -> Releases {
        Releases(Vec::with_capacity(n))
    }

    /// Record `conn`'s word for later, if there is room (the capacity is fixed at
    /// association).
    pub(crate) fn defer(&mut self, conn: Arc<Conn>) {
        if self.0.len() < self.0.capacity() {
            self.0.push(conn);
        }
    }

    /// Let go of every recorded word that names `tid`.
    pub(crate) fn release_all(&mut self, tid: u32) {
        while let Some(conn) = self.0.pop() {
            release_pi(&conn.page, tid);
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
