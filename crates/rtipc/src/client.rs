//! The sending side: a client thread's connection to a real-time port.
//!
//! A client thread connects once: it offers the port a connection of its own (a
//! socketpair end), a shared page and the write end of a reply pipe, and the port
//! answers with its attributes, the connection's token and its status page. From then
//! on a request is one datagram on the port's main connection naming the token, and
//! its reply one read of the pipe (or, for a reply too large for one pipe write, a word
//! on the pipe and a datagram on the connection): the nucleus's call, with the priority
//! work of the paper around it.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_ipc::Name;
use rustix::io::Errno;

use crate::attr::{Handoff, PortAttrs, Priority, Queueing};
use crate::error::SendError;
use crate::port::{
    PortInner, C_PI, C_RAISED_EPOCH, C_RAISED_PRIO, C_RAISED_TID, STATUS_MAGIC, W_BUSY, W_EPOCH, W_MAGIC, W_POLLER,
    W_POLLER_AT,
};
use crate::prio;
use crate::sys::{self, pipe, Recv, Sent, SharedPage, FUTEX_TID_MASK};
use crate::wire::{Kind, RtHeader, FLAG_SYNC, RT_HEADER_LEN};

/// How long one wait on a PI word lasts before the client looks again (a safety net;
/// the server normally wakes it by unlocking the word).
const PI_SLICE: Duration = Duration::from_millis(50);
/// How long a client with nobody to inherit into waits for its reply before looking
/// again for a receiver to inherit into.
const IDLE_SLICE: Duration = Duration::from_millis(1);

/// Options of one send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// The message's priority for a port with [`Handoff::Message`] (the header priority);
    /// other ports use the sender's own. `None`: the sender's own.
    pub priority: Option<Priority>,
    /// Do not wait when the port's queue is full.
    pub nonblocking: bool,
    /// How long a call waits for its reply (`None`: for ever). A call without one is a
    /// single blocking read; with one, a `poll` comes first.
    pub timeout: Option<Duration>,
}

/// One thread's connection to a real-time port (its send right, connected). Each thread
/// connects for itself: a connection carries one synchronous call at a time, with that
/// thread's priority, and stays on the thread.
#[derive(Debug)]
pub struct RtClient {
    name: Name,
    /// The port's main connection (this task's send right): requests go here.
    main: OwnedFd,
    /// This thread's connection: the port's answer, and replies too large for the pipe.
    fd: OwnedFd,
    /// The read end of the reply pipe, until a call times out (a late reply must never
    /// answer the next call; replies then come on the connection) or the pipe fails.
    pipe: Option<OwnedFd>,
    token: u32,
    page: SharedPage,
    status: SharedPage,
    attrs: PortAttrs,
    server_pid: u32,
    tid: u32,
    native: Priority,
    seq: u32,
    verified: [u32; 8],
    /// Room for whatever of a pipe read does not fit the caller's reply buffer.
    spill: Box<[u8]>,
    /// A connection belongs to the thread that made it (its thread id and priority are
    /// read at connect), so it cannot be sent to another thread.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl RtClient {
    /// Connects through a send right's descriptor: offers a new connection, a shared
    /// page and a reply pipe; a real-time port answers with its attributes, the
    /// connection's token and its status page. A plain port refuses the real-time
    /// message (it closes what it got), which is [`SendError::InvalidDest`]; so is
    /// silence for `timeout`.
    pub(crate) fn connect(
        main: OwnedFd,
        name: Name,
        local: Option<&Arc<PortInner>>,
        timeout: Duration,
    ) -> Result<RtClient, SendError> {
        if !sys::is_seqpacket(main.as_fd()) {
            return Err(SendError::InvalidDest(name, "not a port"));
        }
        let server_pid = sys::peer_pid(main.as_fd()).ok_or(SendError::InvalidDest(name, "port has no creator"))?;
        let (mine, theirs) = sys::seqpacket_pair()?;
        let (page_fd, page) = SharedPage::create("ictus-rtipc-conn")?;
        let (pipe_r, pipe_w) = pipe::pair().map_err(std::io::Error::from)?;
        match local {
            Some(port) => {
                port.accept_local(theirs, page_fd, pipe_w).map_err(|why| SendError::InvalidDest(name, why))?;
            }
            None => {
                let head = RtHeader::new(Kind::Connect).encode();
                let fds = [theirs.as_fd(), page_fd.as_fd(), pipe_w.as_fd()];
                match sys::send(main.as_fd(), &[IoSlice::new(&head)], &fds, true)? {
                    Sent::Ok => {}
                    Sent::WouldBlock => return Err(SendError::WouldBlock),
                    Sent::Dead => return Err(SendError::InvalidDest(name, "the port is dead")),
                }
            }
        }
        if !sys::wait_readable(mine.as_fd(), Some(timeout))? {
            return Err(SendError::InvalidDest(name, "no real-time port answered"));
        }
        let mut head = [0u8; RT_HEADER_LEN];
        let mut body = [0u8; 32];
        let mut fds: Vec<OwnedFd> = Vec::new();
        let (len, truncated) = match sys::recv(mine.as_fd(), &mut head, &mut body, &mut fds, true)? {
            Recv::Datagram { len, truncated } => (len, truncated),
            Recv::HungUp | Recv::Empty => {
                return Err(SendError::InvalidDest(name, "a plain port: it refused the real-time message"))
            }
        };
        let bad = |why| SendError::InvalidDest(name, why);
        if truncated || len < RT_HEADER_LEN {
            return Err(bad("malformed answer"));
        }
        let h = RtHeader::parse_parts(&head, len - RT_HEADER_LEN, fds.len()).map_err(|_| bad("malformed answer"))?;
        if h.kind != Kind::Accept || h.len != 20 {
            return Err(bad("unexpected answer"));
        }
        let attrs = PortAttrs::decode(&body[..16]).ok_or(bad("bad attributes"))?;
        let status = SharedPage::map_untrusted(fds[0].as_fd(), true).map_err(bad)?;
        if status.word(W_MAGIC).load(Ordering::Acquire) != STATUS_MAGIC {
            return Err(bad("bad status page"));
        }
        Ok(RtClient {
            name,
            main,
            fd: mine,
            pipe: Some(pipe_r),
            token: h.conn,
            page,
            status,
            attrs,
            server_pid,
            tid: sys::gettid(),
            native: prio::native_priority(),
            seq: 0,
            verified: [0; 8],
            spill: vec![0u8; pipe::PIPE_BUF + 1].into_boxed_slice(),
            _not_send: std::marker::PhantomData,
        })
    }

    /// The port's attributes.
    pub fn attrs(&self) -> PortAttrs {
        self.attrs
    }

    /// The port's name in the space it was connected from.
    pub fn name(&self) -> Name {
        self.name
    }

    /// Whether a receiver of the port is waiting for messages right now (as its status
    /// page says). For tests and diagnostics.
    pub fn receiver_waiting(&self) -> bool {
        self.status.word(W_POLLER).load(Ordering::Acquire) != 0
    }

    /// Reads the calling thread's priority again (it is read once, at connect).
    pub fn refresh_priority(&mut self) {
        self.native = prio::native_priority();
    }

    fn priority_for(&self, sync: bool, opts: &SendOptions) -> Priority {
        let p = match (self.attrs.handoff, opts.priority) {
            (Handoff::Message, Some(p)) => p,
            _ => prio::sending_priority(sync, self.native),
        };
        p.min(self.attrs.ceiling)
    }

    /// Whether `tid` is one of the server's threads (checked once per thread id).
    fn verified(&mut self, tid: u32) -> bool {
        if tid == 0 {
            return false;
        }
        if self.verified.contains(&tid) {
            return true;
        }
        if !sys::is_thread_of(self.server_pid, tid) {
            return false;
        }
        self.verified.rotate_right(1);
        self.verified[0] = tid;
        true
    }

    /// Raises the waiting receiver to `priority` before the message wakes it — unless
    /// it waits at that priority already — and notes it in the shared page (with the
    /// number of the receiver's wait) so the receiver knows its priority.
    fn raise_receiver(&mut self, priority: Priority) -> bool {
        let mut raised = 0;
        let mut epoch = 0;
        if self.attrs.handoff != Handoff::Off {
            // The poller first, then its wait and the priority it waits at: the port
            // writes them in the other order, so both belong to this wait or a later one.
            let poller = self.status.word(W_POLLER).load(Ordering::SeqCst);
            epoch = self.status.word(W_EPOCH).load(Ordering::SeqCst);
            let at = self.status.word(W_POLLER_AT).load(Ordering::SeqCst);
            if self.verified(poller) && (at == u32::from(priority) + 1 || prio::hand_off(poller, priority)) {
                raised = poller;
            }
        }
        self.page.word(C_RAISED_PRIO).store(u32::from(priority), Ordering::Relaxed);
        self.page.word(C_RAISED_EPOCH).store(epoch, Ordering::Relaxed);
        self.page.word(C_RAISED_TID).store(raised, Ordering::Release);
        raised != 0
    }

    /// Sends; returns whether a waiting receiver was raised to the message's priority.
    fn send_request(&mut self, body: &[u8], sync: bool, opts: &SendOptions) -> Result<bool, SendError> {
        let max = self.attrs.buffer_size as usize;
        if body.len() > max {
            return Err(SendError::TooLarge { len: body.len(), max });
        }
        let priority = self.priority_for(sync, opts);
        self.seq = self.seq.wrapping_add(1);
        let head = RtHeader {
            kind: Kind::Request,
            flags: if sync { FLAG_SYNC } else { 0 },
            priority,
            seq: self.seq,
            len: body.len() as u32,
            conn: self.token,
        }
        .encode();
        let raised = self.raise_receiver(priority);
        match sys::send(self.main.as_fd(), &[IoSlice::new(&head), IoSlice::new(body)], &[], opts.nonblocking)? {
            Sent::Ok => Ok(raised),
            Sent::WouldBlock => Err(SendError::WouldBlock),
            Sent::Dead => Err(SendError::ServerDied),
        }
    }

    /// Sends a message without waiting for a reply (asynchronous mode): it carries the
    /// thread's native priority, not one it inherited.
    pub fn send(&mut self, body: &[u8], opts: SendOptions) -> Result<(), SendError> {
        self.send_request(body, false, &opts).map(|_| ())
    }

    /// Sends a request and waits for its reply (synchronous mode): the request carries
    /// the priority this thread runs at, inherited ones included, and on a
    /// priority-inheritance port the receiver serving it inherits this thread's
    /// priority through a PI futex while it waits. Returns the reply's length in `reply`.
    pub fn call(&mut self, body: &[u8], reply: &mut [u8], opts: SendOptions) -> Result<usize, SendError> {
        let raised = self.send_request(body, true, &opts)?;
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        // A waiting receiver raised to our priority before it woke cannot be held up by
        // anything below us until it answers, so inheritance is only needed when no
        // receiver was waiting (all busy) or hand-off is off or refused.
        let got = if self.attrs.queueing == Queueing::PriorityInheritance && !raised {
            self.wait_inheriting(reply, deadline)
        } else {
            self.wait_reply(reply, deadline)
        };
        if matches!(got, Err(SendError::TimedOut)) {
            // A late reply must never answer the next call: without the pipe, replies
            // come on the connection, where each names its call.
            self.pipe = None;
        }
        got
    }

    /// Waits for the reply: one read of the pipe (after a `poll`, with a deadline), or,
    /// without a pipe, on the connection.
    fn wait_reply(&mut self, reply: &mut [u8], deadline: Option<Instant>) -> Result<usize, SendError> {
        loop {
            let got = match &self.pipe {
                Some(p) => {
                    if deadline.is_some() && !sys::wait_readable(p.as_fd(), left(deadline)?)? {
                        return Err(SendError::TimedOut);
                    }
                    self.take_reply(reply, false)?
                }
                None => {
                    if !sys::wait_readable(self.fd.as_fd(), left(deadline)?)? {
                        return Err(SendError::TimedOut);
                    }
                    self.try_socket_reply(reply)?
                }
            };
            if let Some(n) = got {
                return Ok(n);
            }
        }
    }

    /// The reply, if it is there (unless `nonblocking`, waiting for it on the pipe).
    /// Replies to earlier, abandoned calls, which only the connection can hold, are
    /// skipped.
    fn take_reply(&mut self, reply: &mut [u8], nonblocking: bool) -> Result<Option<usize>, SendError> {
        let Some(p) = &self.pipe else { return self.try_socket_reply(reply) };
        let mut head = [0u8; RT_HEADER_LEN];
        let room = reply.len();
        let n = {
            let mut bufs = [IoSliceMut::new(&mut head), IoSliceMut::new(reply), IoSliceMut::new(&mut self.spill)];
            let read =
                if nonblocking { pipe::read_nowait(p.as_fd(), &mut bufs) } else { pipe::read(p.as_fd(), &mut bufs) };
            match read {
                Ok(0) => return Err(SendError::ServerDied),
                Ok(n) => n,
                Err(Errno::AGAIN) => return Ok(None),
                Err(e) => return Err(SendError::Os(e.into())),
            }
        };
        // Exactly one reply to this call, or the pipe is not to be trusted again.
        let parsed = if n < RT_HEADER_LEN {
            Err("a short reply".to_string())
        } else {
            RtHeader::parse_parts(&head, n - RT_HEADER_LEN, 0).map_err(|e| e.to_string())
        };
        match parsed {
            Ok(h) if h.kind == Kind::Reply && h.seq == self.seq => {
                if h.on_socket() {
                    // The reply did not fit the pipe: it is on the connection already.
                    return match self.try_socket_reply(reply)? {
                        Some(n) => Ok(Some(n)),
                        None => Err(SendError::BadReply("the reply was not on the connection".into())),
                    };
                }
                if h.len as usize > room {
                    return Err(SendError::BadReply("reply larger than the buffer".into()));
                }
                Ok(Some(h.len as usize))
            }
            Ok(h) => {
                self.pipe = None;
                Err(SendError::BadReply(format!(
                    "{:?} {} on the reply pipe where reply {} was expected",
                    h.kind, h.seq, self.seq
                )))
            }
            Err(e) => {
                self.pipe = None;
                Err(SendError::BadReply(e))
            }
        }
    }

    /// A reply on the connection if one is queued (replies to earlier, abandoned calls
    /// are skipped).
    fn try_socket_reply(&self, reply: &mut [u8]) -> Result<Option<usize>, SendError> {
        loop {
            let mut head = [0u8; RT_HEADER_LEN];
            let mut fds = Vec::new();
            match sys::recv(self.fd.as_fd(), &mut head, reply, &mut fds, true)? {
                Recv::Empty => return Ok(None),
                Recv::HungUp => return Err(SendError::ServerDied),
                Recv::Datagram { len, truncated } => {
                    if truncated || len < RT_HEADER_LEN {
                        return Err(SendError::BadReply("reply larger than the buffer, or short".into()));
                    }
                    let h = RtHeader::parse_parts(&head, len - RT_HEADER_LEN, fds.len())
                        .map_err(|e| SendError::BadReply(e.to_string()))?;
                    if h.kind != Kind::Reply || h.on_socket() {
                        return Err(SendError::BadReply(format!("{:?} where a reply was expected", h.kind)));
                    }
                    if h.seq == self.seq {
                        return Ok(Some(h.len as usize));
                    }
                }
            }
        }
    }

    /// Waits for the reply while the kernel boosts the receiver serving the port:
    /// the PI word is set to that receiver's thread id and we block in `FUTEX_LOCK_PI`
    /// on it, so the kernel's `rt_mutex` chain raises it (and, if it is itself blocked
    /// in a call, whatever it waits for). The receiver unlocks the word after replying.
    fn wait_inheriting(&mut self, reply: &mut [u8], deadline: Option<Instant>) -> Result<usize, SendError> {
        // The first look for the reply is after the word is set (below).
        let mut first = true;
        loop {
            if !first {
                if let Some(n) = self.take_reply(reply, true)? {
                    return Ok(n);
                }
            }
            first = false;
            let left = left(deadline)?;
            let busy = self.status.word(W_BUSY).load(Ordering::Acquire);
            let target = if busy != 0 { busy } else { self.status.word(W_POLLER).load(Ordering::Acquire) };
            if target == self.tid || !self.verified(target) {
                let slice = left.map_or(IDLE_SLICE, |l| l.min(IDLE_SLICE));
                let waits_on = self.pipe.as_ref().map_or(self.fd.as_fd(), |p| p.as_fd());
                sys::wait_readable(waits_on, Some(slice))?;
                continue;
            }
            let w = self.page.word(C_PI);
            if w.compare_exchange(0, target, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                // A stale value (a hostile server, or an earlier time-out): clear it.
                w.store(0, Ordering::SeqCst);
                continue;
            }
            // SYNC POINT: the word is visible before we look for the reply; the receiver
            // queues the reply before it looks at the word (see port.rs, `send_reply`).
            fence(Ordering::SeqCst);
            if let Some(n) = self.take_reply(reply, true)? {
                let _ = self.page.word(C_PI).compare_exchange(target, 0, Ordering::SeqCst, Ordering::SeqCst);
                return Ok(n);
            }
            let w = self.page.word(C_PI);
            let slice = left.map_or(PI_SLICE, |l| l.min(PI_SLICE));
            match sys::lock_pi(w, slice) {
                Ok(()) => {
                    // We own the word now (the receiver let go, or died): give it back.
                    if w.compare_exchange(self.tid, 0, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                        let _ = sys::unlock_pi(w);
                        w.store(0, Ordering::SeqCst);
                    }
                }
                Err(Errno::TIMEDOUT) | Err(Errno::INTR) | Err(Errno::AGAIN) => {
                    let v = w.load(Ordering::SeqCst);
                    if v & FUTEX_TID_MASK == target {
                        let _ = w.compare_exchange(v, 0, Ordering::SeqCst, Ordering::SeqCst);
                    }
                }
                Err(_) => {
                    // The thread is gone or the word is inconsistent: clear it and wait
                    // for the reply for a moment.
                    w.store(0, Ordering::SeqCst);
                    let waits_on = self.pipe.as_ref().map_or(self.fd.as_fd(), |p| p.as_fd());
                    sys::wait_readable(waits_on, Some(IDLE_SLICE))?;
                }
            }
        }
    }
}

fn left(deadline: Option<Instant>) -> Result<Option<Duration>, SendError> {
    match deadline {
        None => Ok(None),
        Some(d) => {
            let l = d.saturating_duration_since(Instant::now());
            if l.is_zero() {
                Err(SendError::TimedOut)
            } else {
                Ok(Some(l))
            }
        }
    }
}
