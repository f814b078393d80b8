//! The server end: every client's channel, one flag, one place to wait.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_ipc::{
    Credentials, Disposition, Message, Name, PortArg, ReceiveError, ReceiveOptions, Received, SendOptions, Space,
};
use rustix::event::epoll;
use rustix::fs::SealFlags;

use crate::client::WaitConfig;
use crate::error::{CloseReason, ReplyError, ServerError};
use crate::layout::{self, Geometry};
use crate::record::{self, Corrupt, Kind, PoolRef};
use crate::ring::{Consumer, Peeked, Producer, ReserveError};
use crate::segment::{Payload, Segment, ShmRing};
use crate::setup;
use crate::sync::Ordering;
use crate::sys::{self, Mapping};
use crate::wake::{self, Sleeper, WakeBy, Waker};

/// A client of a server, as the server names it. Never reused within a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

/// How the server sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SleepMode {
    /// `futex_waitv` on every client's doorbell word (up to 128 clients; more fall
    /// back to `Poll`). The fastest wake-up.
    Futex,
    /// `epoll` over every client's doorbell eventfd, the service port and the links:
    /// new channels and hang-ups wake it at once, and [`Server::as_fd`] nests in
    /// another event loop.
    Poll,
}

/// A server's limits and manners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// The most channels at once.
    pub max_channels: usize,
    /// The most bytes of one channel's memory.
    pub max_channel_bytes: u64,
    /// How the server waits.
    pub wait: WaitConfig,
    /// How it sleeps.
    pub sleep: SleepMode,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_channels: 1024,
            max_channel_bytes: 256 << 20,
            wait: WaitConfig::default(),
            sleep: SleepMode::Futex,
        }
    }
}

/// Something that happened to a channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A client opened a channel.
    Opened {
        /// Its id.
        client: ClientId,
        /// Who asked, as the kernel verified (pid, uid, gid of the request).
        credentials: Credentials,
        /// The channel's geometry.
        geometry: Geometry,
    },
    /// A channel ended; its memory and descriptors are released.
    Closed {
        /// Its id.
        client: ClientId,
        /// Why.
        reason: CloseReason,
    },
}

/// Counters of a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Records consumed.
    pub records: u64,
    /// Times the server blocked.
    pub blocks: u64,
    /// Wake-up system calls made to wake clients.
    pub wakeups: u64,
    /// Clients cut off for corrupting their channel.
    pub cut_off: u64,
    /// Channels opened.
    pub opened: u64,
}

#[derive(Debug)]
struct Chan {
    id: ClientId,
    seg: Arc<Segment>,
    req: Consumer<ShmRing>,
    rep: Producer<ShmRing>,
    client: Waker,
    doorbell: OwnedFd,
    event: OwnedFd,
    held: Vec<bool>,
    rel_head: u64,
    consumed: bool,
    /// The channel's memfd, for [`Server::channel_fd`].
    memfd: OwnedFd,
    // Dropped before `link` (field order): the watch ends before the link closes.
    _watch: crate::watch::Watch,
    link: OwnedFd,
}

impl Chan {
    /// Wake the client if it sleeps: after replies.
    fn wake(&mut self, stats: &mut ServerStats) {
        let flag = self.seg.word32(layout::CLIENT_FLAG);
        let how = self.client.check(flag);
        self.wake_by(how, stats);
    }

    /// Wake the client if it sleeps waiting for room (its flag says so): after
    /// consuming its records or giving a pool buffer back. A client asleep for
    /// replies is left asleep: room does not end its wait, and waking it only made it
    /// look, find nothing, and sleep again (doc/shm.md).
    fn wake_for_room(&mut self, stats: &mut ServerStats) {
        let flag = self.seg.word32(layout::CLIENT_FLAG);
        let how = self.client.check_room(flag);
        self.wake_by(how, stats);
    }

    fn wake_by(&mut self, how: Option<WakeBy>, stats: &mut ServerStats) {
        match how {
            None => {}
            Some(WakeBy::Futex) => {
                let bell = self.seg.word32(layout::REP_BELL);
                wake::ring(bell);
                let _ = sys::futex_wake(bell);
                stats.wakeups += 1;
            }
            Some(WakeBy::Eventfd) => {
                let _ = sys::signal(self.event.as_fd());
                stats.wakeups += 1;
            }
        }
    }

    fn release_slot(&mut self, slot: u32) {
        if let Some(h) = self.held.get_mut(slot as usize) {
            *h = false;
        }
        self.seg.release_entry(self.rel_head).store(slot, Ordering::Relaxed);
        self.rel_head += 1;
        // SYNC POINT: pairs with the client's Acquire load in `reclaim`.
        self.seg.word64(layout::REL_HEAD).store(self.rel_head, Ordering::Release);
    }
}

const SERVICE: u64 = u64::MAX;
const LINK: u64 = 1 << 62;

/// The server end of shared-memory channels: a service port where clients ask for
/// channels, one channel per client, one flag all clients read.
#[derive(Debug)]
pub struct Server {
    space: Space,
    service: Name,
    page: Mapping,
    page_fd: OwnedFd,
    sleeper: Sleeper,
    armed: bool,
    chans: Vec<Chan>,
    ep: OwnedFd,
    events: VecDeque<Event>,
    next: usize,
    next_id: u64,
    config: ServerConfig,
    received: Received,
    last_control: Instant,
    /// Raised by the link watcher when a client's link hangs up.
    pending: Arc<AtomicBool>,
    /// The doorbell values read before the last sleep, one per channel.
    bells: Vec<u32>,
    stats: ServerStats,
}

impl Server {
    /// A server with a new service port (a receive right in `space`): give clients
    /// send rights to it (register it with the name server, or pass it on).
    pub fn new(space: &Space, config: ServerConfig) -> Result<Server, ServerError> {
        let service = space.allocate_port()?;
        // Clients' calls keep channels that the notifier watches: start it now, so that
        // the server's descriptors are the same from here on.
        space.start_notifier()?;
        let page_fd = sys::memfd("ictus-shm-server", layout::PAGE)?;
        let page = sys::map(page_fd.as_fd(), layout::PAGE as usize, true)?;
        // The server's own writable mapping exists; from now on nobody can make
        // another (F_SEAL_FUTURE_WRITE), so clients read the flag and never write it.
        sys::seal(page_fd.as_fd(), SealFlags::FUTURE_WRITE)?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let svc = space.pollable_fd(service)?;
        epoll::add(&ep, &svc, epoll::EventData::new_u64(SERVICE), epoll::EventFlags::IN)?;
        // The epoll keeps the pollable descriptor's file alive.
        drop(svc);
        Ok(Server {
            space: space.clone(),
            service,
            page,
            page_fd,
            sleeper: Sleeper::new(),
            armed: false,
            chans: Vec::new(),
            ep,
            events: VecDeque::new(),
            next: 0,
            next_id: 1,
            config,
            received: Received::new(),
            last_control: Instant::now(),
            pending: Arc::new(AtomicBool::new(false)),
            bells: Vec::new(),
            stats: ServerStats::default(),
        })
    }

    /// The service port (a receive right in the server's space).
    pub fn service(&self) -> Name {
        self.service
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    /// The clients with open channels.
    pub fn clients(&self) -> Vec<ClientId> {
        self.chans.iter().map(|c| c.id).collect()
    }

    /// Change how the server waits.
    pub fn set_wait(&mut self, wait: WaitConfig) {
        self.config.wait = wait;
    }

    fn control_due(&self) -> bool {
        self.pending.load(Ordering::Relaxed) || self.last_control.elapsed() >= self.config.wait.liveness
    }

    /// Handle channel requests and hang-ups now.
    pub fn poll_control(&mut self) {
        self.last_control = Instant::now();
        self.pending.store(false, Ordering::Relaxed);
        let mut evs = Vec::with_capacity(16);
        loop {
            evs.clear();
            match epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut evs),
                Some(&rustix::event::Timespec::default()),
            ) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
            if evs.is_empty() {
                return;
            }
            for ev in &evs {
                let d = ev.data.u64();
                if d == SERVICE {
                    self.accept_all();
                } else if d & LINK != 0 {
                    let id = ClientId(d & !LINK);
                    if let Some(i) = self.index(id) {
                        if sys::link_event(self.chans[i].link.as_fd()) {
                            self.close_at(i, CloseReason::PeerGone, false);
                        }
                    }
                } else if let Some(i) = self.index(ClientId(d)) {
                    sys::drain(self.chans[i].doorbell.as_fd());
                }
            }
            if evs.len() < evs.capacity() {
                return;
            }
        }
    }

    fn index(&self, id: ClientId) -> Option<usize> {
        self.chans.iter().position(|c| c.id == id)
    }

    fn accept_all(&mut self) {
        loop {
            let opts = ReceiveOptions { timeout: Some(Duration::ZERO), populate_ool: false };
            match self.space.receive(self.service, &mut self.received, opts) {
                Ok(()) => {}
                Err(ReceiveError::Malformed { .. }) => continue,
                Err(_) => return,
            }
            let Some(reply) = self.received.reply else { continue };
            if self.received.id != setup::OPEN {
                let _ = self.space.deallocate(reply.name);
                continue;
            }
            let credentials = self.received.sender;
            let answer = setup::decode_open(self.received.data()).map_err(|e| e.to_string()).and_then(|g| {
                if g.total() > self.config.max_channel_bytes {
                    Err(format!("{} bytes exceed this server's limit of {}", g.total(), self.config.max_channel_bytes))
                } else if self.chans.len() >= self.config.max_channels {
                    Err("this server has no room for another channel".into())
                } else {
                    self.open(g).map_err(|e| format!("cannot make the channel: {e}"))
                }
            });
            let mut msg = match answer {
                Ok((id, geometry, name)) => {
                    self.events.push_back(Event::Opened { client: id, credentials, geometry });
                    self.stats.opened += 1;
                    let mut m = Message::new(setup::OPEN_OK, id.0.to_le_bytes().to_vec());
                    m.ports.push(PortArg::new(name, Disposition::MoveSend));
                    m
                }
                Err(why) => Message::new(setup::OPEN_REFUSED, why.into_bytes()),
            };
            if self.space.send(reply.name, &mut msg, SendOptions::NONBLOCKING).is_err() {
                // The client gave up; its link end dies with the message, and the
                // channel's hang-up follows.
                for p in &msg.ports {
                    let _ = self.space.deallocate(p.name);
                }
            }
        }
    }

    fn open(&mut self, geo: Geometry) -> Result<(ClientId, Geometry, Name), ServerError> {
        let fd = sys::memfd("ictus-shm-channel", geo.total())?;
        sys::seal(fd.as_fd(), SealFlags::empty())?;
        let total = usize::try_from(geo.total()).map_err(|_| rustix::io::Errno::NOMEM)?;
        let seg = Arc::new(Segment { map: sys::map(fd.as_fd(), total, true)?, geo });
        seg.write_header();
        let doorbell = sys::eventfd()?;
        let event = sys::eventfd()?;
        let (mine, theirs) = sys::link()?;
        sys::send_fds(
            mine.as_fd(),
            &setup::encode_hello(&geo),
            &[fd.as_fd(), self.page_fd.as_fd(), doorbell.as_fd(), event.as_fd()],
        )?;
        let id = ClientId(self.next_id);
        self.next_id += 1;
        epoll::add(
            &self.ep,
            &mine,
            epoll::EventData::new_u64(id.0 | LINK),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )?;
        epoll::add(&self.ep, &doorbell, epoll::EventData::new_u64(id.0), epoll::EventFlags::IN)?;
        let name = self.space.insert_send_fd(theirs)?;
        let watch = crate::watch::watch(mine.as_fd(), seg.clone(), layout::REQ_BELL, self.pending.clone())?;
        self.chans.push(Chan {
            id,
            req: Consumer::new(seg.request(), geo.request),
            rep: Producer::new(seg.reply(), geo.reply),
            held: vec![false; geo.pool.slots as usize],
            seg,
            client: Waker::new(),
            doorbell,
            event,
            rel_head: 0,
            consumed: false,
            memfd: fd,
            _watch: watch,
            link: mine,
        });
        Ok((id, geo, name))
    }

    /// The memfd behind a client's channel (rings and pool), to hand pool buffers to
    /// something that maps them itself (a display server's X server, through MIT-SHM's
    /// `ShmAttachFd`) at [`Incoming::pool_offset`] or [`Held::offset`]. The memfd is
    /// sealed against shrinking and growing, so no mapping of it can fault; the client
    /// can write it, so what is read there is the client's data, trusted as such.
    pub fn channel_fd(&self, client: ClientId) -> Option<BorrowedFd<'_>> {
        self.chans.iter().find(|c| c.id == client).map(|c| c.memfd.as_fd())
    }

    /// Give a held pool buffer back to its client (see [`Incoming::hold`]). Returns
    /// whether it went back: `false` if the channel has closed since (its memory went
    /// with it, nothing to return) or the hold is not this channel's.
    pub fn release(&mut self, held: Held) -> bool {
        let Some(chan) = self.chans.iter_mut().find(|c| c.id == held.client && Arc::ptr_eq(&c.seg, &held.seg)) else {
            return false;
        };
        if !chan.held.get(held.slot as usize).copied().unwrap_or(false) {
            return false;
        }
        chan.release_slot(held.slot);
        chan.consumed = true;
        true
    }

    /// Give a held pool buffer back to its client, as [`Server::release`] does, and
    /// keep seeing it: the [`Viewed`] keeps the memory mapped and reads whatever the
    /// client writes there from now on (it may lend the buffer again at once and write
    /// its next payload into it). For a display server that gives a frame's buffer
    /// back as soon as the screen has the frame, so that the client writes its next
    /// frame into the same (cached) buffer, yet repaints from it until that frame
    /// replaces it. A view releases nothing when dropped: the slot is the client's
    /// again, and if it comes back in a record, that record's own hold owns it.
    /// `Err(held)` when [`Server::release`] would return `false`.
    pub fn release_viewed(&mut self, held: Held) -> Result<Viewed, Held> {
        let Some(chan) = self.chans.iter_mut().find(|c| c.id == held.client && Arc::ptr_eq(&c.seg, &held.seg)) else {
            return Err(held);
        };
        if !chan.held.get(held.slot as usize).copied().unwrap_or(false) {
            return Err(held);
        }
        chan.release_slot(held.slot);
        chan.consumed = true;
        let Held { client, slot, len, offset, seg } = held;
        Ok(Viewed { client, slot, len, offset, seg })
    }

    /// End a client's channel (the client sees its link hang up). Returns whether it
    /// existed.
    pub fn close(&mut self, client: ClientId) -> bool {
        match self.index(client) {
            Some(i) => {
                self.close_at(i, CloseReason::Local, false);
                true
            }
            None => false,
        }
    }

    fn close_at(&mut self, i: usize, reason: CloseReason, cut: bool) {
        let c = self.chans.remove(i);
        if cut {
            self.stats.cut_off += 1;
            let mut notice = setup::LINK_CUT.to_vec();
            notice.extend_from_slice(reason.to_string().as_bytes());
            notice.truncate(500);
            let _ = sys::send_fds(c.link.as_fd(), &notice, &[]);
        }
        let _ = epoll::delete(&self.ep, &c.link);
        let _ = epoll::delete(&self.ep, &c.doorbell);
        if self.next > i {
            self.next -= 1;
        }
        self.events.push_back(Event::Closed { client: c.id, reason });
        // Dropping `c` unmaps the memory and closes the link and eventfds.
    }

    fn cut_off(&mut self, i: usize, c: Corrupt) {
        self.close_at(i, CloseReason::Corrupt(c), true);
    }

    /// The next thing to handle, without blocking: a channel event, or a record from
    /// a client (clients taken in turn). A client whose ring is corrupt is cut off
    /// here (an [`Event::Closed`] follows) and never harms the others.
    pub fn try_next(&mut self) -> Option<Next<'_>> {
        if self.armed {
            self.sleeper.end(self.page.atomic_u32(layout::SERVER_FLAG));
            self.armed = false;
        }
        if self.control_due() {
            self.poll_control();
        }
        if let Some(e) = self.events.pop_front() {
            return Some(Next::Event(e));
        }
        let n = self.chans.len();
        let mut tried = 0;
        while tried < n && !self.chans.is_empty() {
            let i = self.next % self.chans.len();
            self.next = i + 1;
            tried += 1;
            let chan = &mut self.chans[i];
            match chan.req.peek() {
                Ok(None) => {
                    if chan.consumed {
                        chan.consumed = false;
                        chan.wake_for_room(&mut self.stats);
                    }
                }
                Ok(Some(p)) => {
                    let pool = if p.frame.kind == Kind::Pool {
                        let word = chan.req.payload_word(&p, 0);
                        match record::decode_pool_ref(word, chan.seg.geo.pool) {
                            Ok(r) if chan.held[r.slot as usize] => {
                                self.cut_off(i, Corrupt::SlotHeld(r.slot));
                                return self.events.pop_front().map(Next::Event);
                            }
                            Ok(r) => {
                                chan.held[r.slot as usize] = true;
                                Some(r)
                            }
                            Err(c) => {
                                self.cut_off(i, c);
                                return self.events.pop_front().map(Next::Event);
                            }
                        }
                    } else {
                        None
                    };
                    let id = chan.id;
                    return Some(Next::Record(Incoming { server: self, i, id, p: Some(p), pool }));
                }
                Err(c) => {
                    self.cut_off(i, c);
                    return self.events.pop_front().map(Next::Event);
                }
            }
        }
        None
    }

    fn anything_ready(&self) -> bool {
        !self.events.is_empty() || self.pending.load(Ordering::Relaxed) || self.chans.iter().any(|c| c.req.ready())
    }

    /// Wait until there is something to handle (spin, then block), or the timeout
    /// passes. Returns whether there is.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool, ServerError> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        if self.anything_ready() {
            return Ok(true);
        }
        let mut k = 0u32;
        while !self.config.wait.spin.is_zero() {
            if self.anything_ready() {
                return Ok(true);
            }
            std::hint::spin_loop();
            k = k.wrapping_add(1);
            if k % 64 == 0 {
                let e = start.elapsed();
                if e >= self.config.wait.spin || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
            }
        }
        loop {
            // Wake clients that wait for room we made.
            let mut stats = self.stats;
            for c in self.chans.iter_mut().filter(|c| c.consumed) {
                c.consumed = false;
                c.wake_for_room(&mut stats);
            }
            self.stats = stats;
            if self.control_due() {
                self.poll_control();
            }
            if !self.events.is_empty() {
                return Ok(true);
            }
            let now = Instant::now();
            let mut block = self.config.wait.liveness;
            if let Some(d) = deadline {
                if now >= d {
                    return Ok(false);
                }
                block = block.min(d - now);
            }
            let futex =
                self.config.sleep == SleepMode::Futex && !self.chans.is_empty() && self.chans.len() <= sys::WAITV_MAX;
            let page = &self.page;
            let flag = page.atomic_u32(layout::SERVER_FLAG);
            // The bells first, then the flag: a ring for this sleep, even one for a
            // record already consumed, comes after these reads and ends the wait.
            self.bells.clear();
            if futex {
                self.bells.extend(self.chans.iter().map(|c| wake::read_bell(c.seg.word32(layout::REQ_BELL))));
            }
            self.sleeper.announce(flag, !futex);
            // The server owns the truth: with the flag up, look at every ring again
            // before sleeping; a record published before a client read the flag is
            // seen here, one published after it is followed by a wake-up.
            if self.chans.iter().any(|c| c.req.ready()) {
                self.sleeper.end(flag);
                return Ok(true);
            }
            self.stats.blocks += 1;
            // In epoll, the service port and the links are watched too: a channel
            // request or a hang-up ends the sleep and is handled at once (left alone,
            // the still-readable port would end every following sleep at once, a busy
            // loop until the next look at the controls).
            let mut control = false;
            let r = if futex {
                let bells = self.chans.iter().zip(&self.bells).map(|(c, &v)| (c.seg.word32(layout::REQ_BELL), v));
                sys::futex_waitv(bells, block)
            } else {
                let mut evs = Vec::with_capacity(4);
                let ts = rustix::event::Timespec {
                    tv_sec: block.as_secs() as i64,
                    tv_nsec: i64::from(block.subsec_nanos()),
                };
                match epoll::wait(&self.ep, rustix::buffer::spare_capacity(&mut evs), Some(&ts)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {
                        control = evs.iter().any(|e| e.data.u64() == SERVICE || e.data.u64() & LINK != 0);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            };
            self.sleeper.end(flag);
            if control {
                self.poll_control();
            }
            if let Err(e) = r {
                if e == rustix::io::Errno::NOSYS && futex {
                    // A kernel before 5.16: sleep in epoll from now on.
                    self.config.sleep = SleepMode::Poll;
                    continue;
                }
                return Err(e.into());
            }
            if self.anything_ready() {
                return Ok(true);
            }
        }
    }

    /// Prepare to wait in `poll`/`epoll` on [`Server::as_fd`]: announces a sleep
    /// woken by eventfd. Returns `false` if there is already something to handle.
    /// After the descriptor fires, call [`Server::try_next`].
    pub fn arm(&mut self) -> bool {
        self.poll_control();
        let flag = self.page.atomic_u32(layout::SERVER_FLAG);
        self.sleeper.announce(flag, true);
        if self.anything_ready() {
            self.sleeper.end(flag);
            return false;
        }
        self.armed = true;
        true
    }

    /// Send a record to a client, unasked (events, input): copied into its reply ring.
    pub fn send_to(&mut self, client: ClientId, tag: u32, data: &[u8]) -> Result<(), ReplyError> {
        let i = self.index(client).ok_or(ReplyError::NoClient)?;
        self.reply_at(i, tag, data)
    }

    fn reply_at(&mut self, i: usize, tag: u32, data: &[u8]) -> Result<(), ReplyError> {
        let chan = &mut self.chans[i];
        let max = chan.seg.geo.reply.max_payload() as usize;
        let len = u32::try_from(data.len()).map_err(|_| ReplyError::TooLarge { len: data.len(), max })?;
        let r = match chan.rep.reserve(len) {
            Ok(r) => r,
            Err(ReserveError::Full) => return Err(ReplyError::Full),
            Err(ReserveError::TooLarge { .. }) => return Err(ReplyError::TooLarge { len: data.len(), max }),
            Err(ReserveError::Corrupt(c)) => {
                self.cut_off(i, c);
                return Err(ReplyError::NoClient);
            }
        };
        let dst = chan.rep.mem().bytes(r.payload_at(), data.len());
        // SAFETY: the reserved bytes are inside the reply ring and not yet committed,
        // so the client does not read them; `data` is our own memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        chan.rep.commit(r, Kind::Inline, tag);
        chan.wake(&mut self.stats);
        Ok(())
    }
}

/// The server's pollable descriptor: an epoll over the service port, every client's
/// link and doorbell eventfd. Readable when a channel request, a hang-up, or (after
/// [`Server::arm`]) a record may be waiting.
impl AsFd for Server {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ep.as_fd()
    }
}

/// A pool buffer kept by the server after its record was consumed ([`Incoming::hold`]).
/// Its memory stays mapped while the hold lives, even if the channel closes.
#[derive(Debug)]
pub struct Held {
    client: ClientId,
    slot: u32,
    len: u32,
    offset: u64,
    seg: Arc<Segment>,
}

impl Held {
    /// Whose buffer it is.
    pub fn client(&self) -> ClientId {
        self.client
    }

    /// Byte offset of the buffer in the channel's memfd ([`Server::channel_fd`]).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes used in the buffer.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether no bytes are used.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, in place (the client's data: see [`Payload`]).
    pub fn payload(&self) -> Payload<'_> {
        Payload::new(self.seg.slot(self.slot, self.len as usize), self.len as usize)
    }
}

/// A pool buffer given back to its client but still seen by the server
/// ([`Server::release_viewed`]): what the client writes there now, read in place.
/// Its memory stays mapped while the view lives, even if the channel closes.
#[derive(Debug)]
pub struct Viewed {
    client: ClientId,
    slot: u32,
    len: u32,
    offset: u64,
    seg: Arc<Segment>,
}

impl Viewed {
    /// Whose buffer it is.
    pub fn client(&self) -> ClientId {
        self.client
    }

    /// Byte offset of the buffer in the channel's memfd ([`Server::channel_fd`]).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes seen (those of the payload it held).
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether no bytes are seen.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes as the client has them now (the client's data: see [`Payload`]).
    pub fn payload(&self) -> Payload<'_> {
        Payload::new(self.seg.slot(self.slot, self.len as usize), self.len as usize)
    }
}

/// What [`Server::try_next`] found.
#[derive(Debug)]
pub enum Next<'a> {
    /// A channel opened or closed.
    Event(Event),
    /// A record from a client.
    Record(Incoming<'a>),
}

/// A record from a client, read in place; consumed when dropped (its pool buffer,
/// if any, goes back to the client).
#[derive(Debug)]
pub struct Incoming<'a> {
    server: &'a mut Server,
    i: usize,
    id: ClientId,
    p: Option<Peeked>,
    pool: Option<PoolRef>,
}

impl Incoming<'_> {
    /// Who sent it.
    pub fn client(&self) -> ClientId {
        self.id
    }

    /// The client's tag.
    pub fn tag(&self) -> u32 {
        self.p.as_ref().map_or(0, |p| p.frame.tag)
    }

    /// Whether the payload is a pool buffer (a loan) rather than bytes in the ring.
    pub fn is_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// The payload, in place: in the ring, or the pool buffer it names.
    pub fn payload(&self) -> Payload<'_> {
        let chan = &self.server.chans[self.i];
        match self.pool {
            Some(r) => Payload::new(chan.seg.slot(r.slot, r.len as usize), r.len as usize),
            None => {
                let p = self.p.as_ref().expect("a live record");
                let len = p.frame.len as usize;
                Payload::new(chan.req.mem().bytes(p.payload_at(), len), len)
            }
        }
    }

    /// For a pool record, the byte offset of its buffer in the channel's memfd
    /// ([`Server::channel_fd`]).
    pub fn pool_offset(&self) -> Option<u64> {
        self.pool.map(|r| self.server.chans[self.i].seg.geo.slot_at(r.slot))
    }

    /// Consume a pool record but keep its buffer: the ring moves on (the client's
    /// next records can be read) while the buffer stays lent to the server until
    /// [`Server::release`] gives it back — for a frame shown later than it arrives,
    /// or read by another process in the meantime. A hold dropped without release
    /// keeps the buffer from its client until the channel closes. An in-line record
    /// is consumed as when dropped, and gives `None`.
    pub fn hold(mut self) -> Option<Held> {
        let r = self.pool.take()?;
        let chan = &self.server.chans[self.i];
        let held = Held {
            client: self.id,
            slot: r.slot,
            len: r.len,
            offset: chan.seg.geo.slot_at(r.slot),
            seg: chan.seg.clone(),
        };
        // Dropping `self` now consumes the ring record but, with `pool` taken, not the slot.
        Some(held)
    }

    /// Leave the record where it is, unconsumed: the next [`Server::try_next`] that
    /// comes to this client returns it again (for instance when the reply ring is full
    /// because the client is not reading yet).
    pub fn retry_later(mut self) {
        if let (Some(r), Some(chan)) = (self.pool, self.server.chans.get_mut(self.i).filter(|c| c.id == self.id)) {
            chan.held[r.slot as usize] = false;
        }
        self.p = None;
    }

    /// Answer the client through its reply ring.
    pub fn reply(&mut self, tag: u32, data: &[u8]) -> Result<(), ReplyError> {
        if self.server.chans.get(self.i).map(|c| c.id) != Some(self.id) {
            return Err(ReplyError::NoClient);
        }
        self.server.reply_at(self.i, tag, data)
    }
}

impl Drop for Incoming<'_> {
    fn drop(&mut self) {
        let Some(p) = self.p.take() else { return };
        let Some(chan) = self.server.chans.get_mut(self.i).filter(|c| c.id == self.id) else { return };
        if let Some(r) = self.pool {
            chan.release_slot(r.slot);
        }
        match chan.req.release(p, true) {
            Ok(()) => {
                chan.consumed = true;
                self.server.stats.records += 1;
            }
            Err(c) => self.server.cut_off(self.i, c),
        }
    }
}
