//! The client end of a channel.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_ipc::{Message, Name, ReceiveOptions, Received, RightKind, SendOptions, Space};
use rustix::event::epoll;
use rustix::fs::SealFlags;

use crate::error::{CloseReason, ConnectError, RecvError, SendError};
use crate::layout::{self, Geometry};
use crate::record::{self, Kind};
use crate::ring::{Consumer, Peeked, Producer, Reservation, ReserveError};
use crate::segment::{Payload, Segment, ShmRing};
use crate::setup;
use crate::sync::Ordering;
use crate::sys::{self, Mapping};
use crate::wake::{self, Sleeper, WakeBy, Waker};

/// How a side waits: spin first, then block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitConfig {
    /// How long to poll the rings before blocking. Zero blocks at once (the right
    /// choice when both ends share a CPU); a long spin gives the lowest latency when
    /// each end has a CPU of its own.
    pub spin: Duration,
    /// How long one block may last before the side checks that its peer is alive and
    /// (server) looks for new channels. Wake-ups never wait for it.
    pub liveness: Duration,
}

impl Default for WaitConfig {
    fn default() -> Self {
        WaitConfig { spin: Duration::from_micros(20), liveness: Duration::from_millis(20) }
    }
}

/// What a client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// The channel's rings and pool.
    pub geometry: Geometry,
    /// How this end waits.
    pub wait: WaitConfig,
    /// How long set-up may take.
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            geometry: Geometry::new(64 << 10, 64 << 10, 0, 0).expect("a valid default"),
            wait: WaitConfig::default(),
            timeout: Duration::from_secs(10),
        }
    }
}

/// Counters of one client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Records committed.
    pub sent: u64,
    /// Wake-up system calls made to wake the server (`FUTEX_WAKE` or eventfd writes).
    pub wakeups: u64,
    /// Replies consumed.
    pub received: u64,
    /// Times this end blocked.
    pub blocks: u64,
}

/// The client end of a shared-memory channel: a request ring it produces, a reply
/// ring it consumes, an optional pool of large buffers, and the link whose hang-up
/// tells it the server is gone.
#[derive(Debug)]
pub struct Client {
    seg: Arc<Segment>,
    req: Producer<ShmRing>,
    rep: Consumer<ShmRing>,
    page: Mapping,
    server: Waker,
    sleeper: Sleeper,
    armed: bool,
    doorbell: OwnedFd,
    event: OwnedFd,
    link: OwnedFd,
    ep: OwnedFd,
    free: Vec<u32>,
    lent: Vec<bool>,
    rel_tail: u64,
    wait: WaitConfig,
    closed: Option<CloseReason>,
    stats: ClientStats,
    fired: Arc<AtomicBool>,
    // Dropped before `link` (field order): the watch ends before the link closes.
    _watch: crate::watch::Watch,
}

fn invalid(s: impl Into<String>) -> ConnectError {
    ConnectError::Invalid(s.into())
}

impl Client {
    /// Ask the server behind `service` (a send right in `space`) for a channel.
    pub fn connect(space: &Space, service: Name, opts: ClientOptions) -> Result<Client, ConnectError> {
        let mut msg = Message::new(setup::OPEN, setup::encode_open(&opts.geometry));
        let mut got = Received::new();
        let ropts = ReceiveOptions { timeout: Some(opts.timeout), populate_ool: false };
        space.call(service, &mut msg, &mut got, SendOptions { timeout: Some(opts.timeout) }, ropts)?;
        if got.id == setup::OPEN_REFUSED {
            return Err(ConnectError::Refused(String::from_utf8_lossy(got.data()).into_owned()));
        }
        let link = match (got.id, got.ports.as_slice()) {
            (setup::OPEN_OK, [right]) if right.kind == RightKind::Send => {
                let fd = space.send_right_fd(right.name).map_err(|e| invalid(format!("link: {e}")));
                let _ = space.deallocate(right.name);
                fd?
            }
            _ => {
                for r in &got.ports {
                    let _ = space.deallocate(r.name);
                }
                return Err(invalid(format!("answer id {} with {} rights", got.id, got.ports.len())));
            }
        };
        let mut buf = [0u8; 64];
        let (n, fds) = sys::recv_fds(link.as_fd(), &mut buf, opts.timeout)?;
        let geo = setup::decode_hello(&buf[..n]).map_err(|e| invalid(e.to_string()))?;
        let [seg_fd, page_fd, doorbell, event]: [OwnedFd; 4] =
            fds.try_into().map_err(|v: Vec<OwnedFd>| invalid(format!("{} descriptors, expected 4", v.len())))?;
        sys::check_memfd(seg_fd.as_fd(), geo.total(), SealFlags::SHRINK | SealFlags::GROW)
            .map_err(|e| invalid(format!("channel memory: {e}")))?;
        sys::check_memfd(page_fd.as_fd(), layout::PAGE, SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE)
            .map_err(|e| invalid(format!("server page: {e}")))?;
        if !sys::is_eventfd(doorbell.as_fd()) || !sys::is_eventfd(event.as_fd()) {
            return Err(invalid("wake-up descriptors are not eventfds"));
        }
        let total = usize::try_from(geo.total()).map_err(|_| invalid("too large"))?;
        let seg = Arc::new(Segment { map: sys::map(seg_fd.as_fd(), total, true)?, geo });
        if !seg.header_matches() {
            return Err(invalid("the memory's header does not match"));
        }
        let page = sys::map(page_fd.as_fd(), layout::PAGE as usize, false)?;
        drop((seg_fd, page_fd));
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(&ep, &event, epoll::EventData::new_u64(0), epoll::EventFlags::IN)?;
        epoll::add(&ep, &link, epoll::EventData::new_u64(1), epoll::EventFlags::IN | epoll::EventFlags::RDHUP)?;
        let slots = geo.pool.slots;
        let fired = Arc::new(AtomicBool::new(false));
        let watch = crate::watch::watch(link.as_fd(), seg.clone(), layout::REP_BELL, fired.clone())?;
        Ok(Client {
            req: Producer::new(seg.request(), geo.request),
            rep: Consumer::new(seg.reply(), geo.reply),
            seg,
            page,
            server: Waker::new(),
            sleeper: Sleeper::new(),
            armed: false,
            doorbell,
            event,
            link,
            ep,
            free: (0..slots).rev().collect(),
            lent: vec![false; slots as usize],
            rel_tail: 0,
            wait: opts.wait,
            closed: None,
            stats: ClientStats::default(),
            fired,
            _watch: watch,
        })
    }

    /// The channel's geometry.
    pub fn geometry(&self) -> Geometry {
        self.seg.geo
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Change how this end waits.
    pub fn set_wait(&mut self, wait: WaitConfig) {
        self.wait = wait;
    }

    /// Why the channel is closed, if it is (checks the link).
    pub fn closed(&mut self) -> Option<&CloseReason> {
        if self.closed.is_none() && sys::link_event(self.link.as_fd()) {
            self.closed = Some(self.close_reason());
        }
        self.closed.as_ref()
    }

    /// Why the link fired: a cut-off notice, or a hang-up.
    fn close_reason(&self) -> CloseReason {
        let mut buf = [0u8; 512];
        match sys::recv_fds(self.link.as_fd(), &mut buf, Duration::ZERO) {
            Ok((n, _)) if n >= 4 && &buf[..4] == setup::LINK_CUT => {
                CloseReason::CutOff(String::from_utf8_lossy(&buf[4..n]).into_owned())
            }
            _ => CloseReason::PeerGone,
        }
    }

    fn check_open(&mut self) -> Result<(), CloseReason> {
        match &self.closed {
            Some(r) => Err(r.clone()),
            None => Ok(()),
        }
    }

    fn fail(&mut self, reason: CloseReason) -> CloseReason {
        self.closed.get_or_insert(reason).clone()
    }

    fn reserve(&mut self, len: usize) -> Result<Reservation, SendError> {
        self.check_open().map_err(SendError::Closed)?;
        let max = self.seg.geo.request.max_payload() as usize;
        let len32 = u32::try_from(len).map_err(|_| SendError::TooLarge { len, max })?;
        match self.req.reserve(len32) {
            Ok(r) => Ok(r),
            Err(ReserveError::Full) => {
                // Full is where a dead server shows first; say so rather than "full".
                if sys::hung_up(self.link.as_fd()) {
                    let reason = self.close_reason();
                    return Err(SendError::Closed(self.fail(reason)));
                }
                Err(SendError::Full)
            }
            Err(ReserveError::TooLarge { .. }) => Err(SendError::TooLarge { len, max }),
            Err(ReserveError::Corrupt(c)) => Err(SendError::Closed(self.fail(CloseReason::Corrupt(c)))),
        }
    }

    /// Borrow `len` bytes in the request ring to write a record in place; commit it
    /// with [`Loan::commit`]. Dropping the loan sends nothing.
    pub fn loan(&mut self, len: usize) -> Result<Loan<'_>, SendError> {
        let r = self.reserve(len)?;
        Ok(Loan { client: self, r: Some(r) })
    }

    /// Send a copy of `data` as one record.
    pub fn send(&mut self, tag: u32, data: &[u8]) -> Result<(), SendError> {
        let mut loan = self.loan(data.len())?;
        loan.copy_from_slice(data);
        loan.commit(tag);
        Ok(())
    }

    /// As [`Client::send`], waiting (spin, then block) while the ring is full.
    pub fn send_wait(&mut self, tag: u32, data: &[u8], timeout: Option<Duration>) -> Result<(), SendError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            match self.send(tag, data) {
                Err(SendError::Full) => {}
                other => return other,
            }
            // Room for this record where the head is (its pad included): a
            // corrupt tail ends the wait, and the send says why.
            let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
            match self.wait_for(deadline, true, |c| c.req.has_room(len).unwrap_or(true)) {
                Ok(()) => {}
                Err(RecvError::TimedOut) => return Err(SendError::TimedOut),
                Err(RecvError::Closed(r)) => return Err(SendError::Closed(r)),
            }
        }
    }

    fn committed(&mut self) {
        self.stats.sent += 1;
        let flag = self.page.atomic_u32(layout::SERVER_FLAG);
        match self.server.check(flag) {
            None => {}
            Some(WakeBy::Futex) => {
                let bell = self.seg.word32(layout::REQ_BELL);
                wake::ring(bell);
                let _ = sys::futex_wake(bell);
                self.stats.wakeups += 1;
            }
            Some(WakeBy::Eventfd) => {
                let _ = sys::signal(self.doorbell.as_fd());
                self.stats.wakeups += 1;
            }
        }
    }

    fn reclaim(&mut self) -> Result<(), CloseReason> {
        let head = self.seg.word64(layout::REL_HEAD).load(Ordering::Acquire);
        let slots = u64::from(self.seg.geo.pool.slots);
        if head.wrapping_sub(self.rel_tail) > slots {
            return Err(self.fail(CloseReason::Corrupt(record::Corrupt::Head {
                head,
                tail: self.rel_tail,
                cap: slots,
            })));
        }
        while self.rel_tail != head {
            let slot = self.seg.release_entry(self.rel_tail).load(Ordering::Relaxed);
            match self.lent.get_mut(slot as usize) {
                Some(l) if *l => {
                    *l = false;
                    self.free.push(slot);
                }
                _ => return Err(self.fail(CloseReason::Corrupt(record::Corrupt::SlotNotLent(slot)))),
            }
            self.rel_tail += 1;
        }
        // SYNC POINT: Release pairs with nothing the server relies on: it never reads
        // this counter (it trusts no client counter it does not need); kept for tools.
        self.seg.word64(layout::REL_TAIL).store(self.rel_tail, Ordering::Release);
        Ok(())
    }

    /// Borrow a buffer of `len` bytes from the channel's pool to write a large payload
    /// in place (a frame, written once and never copied); commit it with
    /// [`PoolLoan::commit`], which sends a small record naming it. The server returns
    /// the buffer when it is done.
    pub fn loan_pool(&mut self, len: usize) -> Result<PoolLoan<'_>, SendError> {
        self.check_open().map_err(SendError::Closed)?;
        let pool = self.seg.geo.pool;
        if pool.slots == 0 {
            return Err(SendError::NoPool);
        }
        if len > pool.slot_size as usize {
            return Err(SendError::TooLarge { len, max: pool.slot_size as usize });
        }
        if self.free.is_empty() {
            self.reclaim().map_err(SendError::Closed)?;
        }
        let Some(slot) = self.free.pop() else {
            return Err(SendError::Full);
        };
        self.lent[slot as usize] = true;
        Ok(PoolLoan { client: self, slot: Some(slot), len })
    }

    /// Pool buffers free to lend now (after taking back what the server returned).
    pub fn pool_free(&mut self) -> usize {
        let _ = self.reclaim();
        self.free.len()
    }

    /// Wait (spin, then block) until a pool buffer is free to lend, for at most
    /// `timeout`. The sleep says it waits for room, so the server's wake-up when it
    /// gives a buffer back reaches it (and only such a sleep: doc/shm.md).
    pub fn wait_pool(&mut self, timeout: Option<Duration>) -> Result<(), SendError> {
        if self.seg.geo.pool.slots == 0 {
            return Err(SendError::NoPool);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        self.wait_for(deadline, true, |c| c.pool_free() > 0).map_err(|e| match e {
            RecvError::TimedOut => SendError::TimedOut,
            RecvError::Closed(r) => SendError::Closed(r),
        })
    }

    /// The next reply, if one is there.
    pub fn try_recv(&mut self) -> Result<Option<Reply<'_>>, RecvError> {
        if self.armed {
            self.sleeper.end(self.seg.clone().word32(layout::CLIENT_FLAG));
            self.armed = false;
        }
        // Replies the server sent before it went away are still delivered; after a
        // corrupt reply ring nothing is.
        if let Some(r @ CloseReason::Corrupt(_)) = &self.closed {
            return Err(RecvError::Closed(r.clone()));
        }
        match self.rep.peek() {
            Ok(Some(p)) => Ok(Some(Reply { client: self, p: Some(p) })),
            Ok(None) => {
                if let Some(r) = &self.closed {
                    return Err(RecvError::Closed(r.clone()));
                }
                if sys::hung_up(self.link.as_fd()) && !self.rep.ready() {
                    let reason = self.close_reason();
                    return Err(RecvError::Closed(self.fail(reason)));
                }
                Ok(None)
            }
            Err(c) => Err(RecvError::Closed(self.fail(CloseReason::Corrupt(c)))),
        }
    }

    /// The next reply, waiting for it: spin, then block, for at most `timeout`.
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Reply<'_>, RecvError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        if !self.rep.ready() {
            self.wait_for(deadline, false, |c| c.rep.ready())?;
        }
        match self.try_recv()? {
            Some(r) => Ok(r),
            None => Err(RecvError::TimedOut),
        }
    }

    /// Spin, then block, until `done` or the deadline; the server's wake-ups and its
    /// death end a block. `room`: `done` waits for room (in the request ring, or a pool
    /// buffer), so the sleep asks for the server's wake-ups for room too; without it,
    /// room the server makes does not wake it ([`wake::ROOM`]).
    fn wait_for(
        &mut self,
        deadline: Option<Instant>,
        room: bool,
        done: impl Fn(&mut Client) -> bool,
    ) -> Result<(), RecvError> {
        let start = Instant::now();
        let mut k = 0u32;
        while !self.wait.spin.is_zero() {
            if done(self) {
                return Ok(());
            }
            std::hint::spin_loop();
            k = k.wrapping_add(1);
            if k % 64 == 0 && start.elapsed() >= self.wait.spin {
                break;
            }
        }
        let seg = self.seg.clone();
        let flag = seg.word32(layout::CLIENT_FLAG);
        let bell = seg.word32(layout::REP_BELL);
        loop {
            // What is already there counts even if the server has gone since.
            if done(self) {
                return Ok(());
            }
            self.check_open().map_err(RecvError::Closed)?;
            let fired = self.fired.load(Ordering::SeqCst);
            if fired {
                // The link fired: the server closed, died, or cut us off.
                if let Some(r) = self.closed() {
                    return Err(RecvError::Closed(r.clone()));
                }
            }
            // The bell first, then the flag: a ring for this sleep, even one for a
            // record already consumed, comes after this read and ends the wait.
            let seen = wake::read_bell(bell);
            self.sleeper.announce_for(flag, false, room);
            if done(self) {
                self.sleeper.end(flag);
                return Ok(());
            }
            if !fired && self.fired.load(Ordering::SeqCst) {
                self.sleeper.end(flag);
                continue;
            }
            let now = Instant::now();
            let mut block = self.wait.liveness;
            if let Some(d) = deadline {
                if now >= d {
                    self.sleeper.end(flag);
                    return Err(RecvError::TimedOut);
                }
                block = block.min(d - now);
            }
            self.stats.blocks += 1;
            let r = sys::futex_wait(bell, seen, block);
            self.sleeper.end(flag);
            if r.is_err() || bell.load(Ordering::Relaxed) == seen {
                // Timed out (or spurious): is the server still there?
                if sys::hung_up(self.link.as_fd()) {
                    let reason = self.close_reason();
                    self.fail(reason);
                }
            }
            if done(self) {
                return Ok(());
            }
        }
    }

    /// Prepare to wait in `poll`/`epoll` on [`Client::as_fd`]: announces a sleep
    /// woken by eventfd, for replies and for room alike. Returns `false` if a reply is
    /// already there (do not wait: receive). After the descriptor fires, call
    /// [`Client::try_recv`] (and retry a send that found the ring full).
    pub fn arm(&mut self) -> bool {
        self.arm_for(true)
    }

    /// As [`Client::arm`]; without `room`, the sleep is for replies only, and the
    /// server's wake-ups for room it made (records consumed, pool buffers given back)
    /// do not fire the descriptor.
    pub fn arm_for(&mut self, room: bool) -> bool {
        let seg = self.seg.clone();
        let flag = seg.word32(layout::CLIENT_FLAG);
        // Drain first, then announce: a signal for this sleep stays pending.
        sys::drain(self.event.as_fd());
        self.sleeper.announce_for(flag, true, room);
        if self.rep.ready() {
            self.sleeper.end(flag);
            return false;
        }
        self.armed = true;
        true
    }

    /// Store `value` at byte `offset` of this channel's shared memory, as a client that
    /// ignores the protocol would: for tests that play a hostile client (the memory is
    /// this client's to write anyway; the server must survive whatever is there).
    #[doc(hidden)]
    pub fn scribble(&self, offset: usize, value: u64) {
        self.seg.word64(offset).store(value, Ordering::SeqCst);
    }

    /// Read the word at byte `offset` of this channel's shared memory (for tests).
    #[doc(hidden)]
    pub fn peek_word(&self, offset: usize) -> u64 {
        self.seg.word64(offset).load(Ordering::SeqCst)
    }

    /// Close the channel: the server learns of it from the link's hang-up.
    pub fn close(self) {}
}

/// A descriptor that is readable when a reply may be waiting (after [`Client::arm`])
/// or the server is gone: an epoll of the reply eventfd and the link, for `poll`,
/// `epoll` or an async runtime.
impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ep.as_fd()
    }
}

/// Space borrowed in the request ring: write the record in place, then commit.
#[derive(Debug)]
pub struct Loan<'a> {
    client: &'a mut Client,
    r: Option<Reservation>,
}

impl Loan<'_> {
    /// Send only the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        if let Some(r) = &mut self.r {
            r.truncate(u32::try_from(len).unwrap_or(u32::MAX));
        }
    }

    /// Commit the record: the server may see it from now on.
    pub fn commit(mut self, tag: u32) {
        if let Some(r) = self.r.take() {
            self.client.req.commit(r, Kind::Inline, tag);
            self.client.committed();
        }
    }
}

impl std::ops::Deref for Loan<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let r = self.r.as_ref().expect("a live loan");
        let p = self.client.req.mem().bytes(r.payload_at(), r.len() as usize);
        // SAFETY: the reserved bytes are inside the ring and belong to this producer
        // until committed (the server reads only committed records); `&self` borrows
        // the client, so no other loan exists.
        unsafe { std::slice::from_raw_parts(p, r.len() as usize) }
    }
}

impl std::ops::DerefMut for Loan<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let r = self.r.as_ref().expect("a live loan");
        let p = self.client.req.mem().bytes(r.payload_at(), r.len() as usize);
        // SAFETY: as for `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(p, r.len() as usize) }
    }
}

/// A buffer borrowed from the channel's pool: write in place, then commit.
#[derive(Debug)]
pub struct PoolLoan<'a> {
    client: &'a mut Client,
    slot: Option<u32>,
    len: usize,
}

impl PoolLoan<'_> {
    /// Send only the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Commit: send a record naming the buffer. On error the buffer stays lent to
    /// nobody (it goes back to the free list).
    pub fn commit(self, tag: u32) -> Result<(), SendError> {
        self.publish(tag, true)
    }

    /// As [`PoolLoan::commit`], without waking the server: for a buffer that a record
    /// sent next refers to (a frame, then the request that shows it), so that the
    /// server is woken once, by that record, and finds both. A record committed
    /// quietly and followed by nothing waits until the server looks for another
    /// reason.
    pub fn commit_quietly(self, tag: u32) -> Result<(), SendError> {
        self.publish(tag, false)
    }

    fn publish(mut self, tag: u32, wake: bool) -> Result<(), SendError> {
        let slot = self.slot.take().expect("a live loan");
        let r = match self.client.reserve(record::POOL_REF_LEN as usize) {
            Ok(r) => r,
            Err(e) => {
                self.client.lent[slot as usize] = false;
                self.client.free.push(slot);
                return Err(e);
            }
        };
        self.client.req.write_payload_word(&r, 0, record::encode_pool_ref(slot, self.len as u32));
        self.client.req.write_payload_word(&r, 1, 0);
        self.client.req.commit(r, Kind::Pool, tag);
        if wake {
            self.client.committed();
        } else {
            self.client.stats.sent += 1;
        }
        Ok(())
    }
}

impl Drop for PoolLoan<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.client.lent[slot as usize] = false;
            self.client.free.push(slot);
        }
    }
}

impl std::ops::Deref for PoolLoan<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let p = self.client.seg.slot(self.slot.expect("a live loan"), self.len);
        // SAFETY: the slot is lent to this loan alone (the server holds no slot the
        // client has not committed) and `len` is within it.
        unsafe { std::slice::from_raw_parts(p, self.len) }
    }
}

impl std::ops::DerefMut for PoolLoan<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let p = self.client.seg.slot(self.slot.expect("a live loan"), self.len);
        // SAFETY: as for `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(p, self.len) }
    }
}

/// A reply, read in place; consumed when dropped.
#[derive(Debug)]
pub struct Reply<'a> {
    client: &'a mut Client,
    p: Option<Peeked>,
}

impl Reply<'_> {
    /// The server's tag.
    pub fn tag(&self) -> u32 {
        self.p.as_ref().map_or(0, |p| p.frame.tag)
    }

    /// The payload, in place.
    pub fn payload(&self) -> Payload<'_> {
        let p = self.p.as_ref().expect("a live reply");
        let len = p.frame.len as usize;
        Payload::new(self.client.rep.mem().bytes(p.payload_at(), len), len)
    }

    /// A copy of the payload.
    pub fn to_vec(&self) -> Vec<u8> {
        self.payload().to_vec()
    }
}

impl Drop for Reply<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.p.take() {
            if let Err(c) = self.client.rep.release(p, false) {
                self.client.fail(CloseReason::Corrupt(c));
            }
            self.client.stats.received += 1;
        }
    }
}
