//! The send path: resolve, plan, transmit, then commit or undo.
//!
//! 1. **Resolve** the destination into a [`Target`] (a shared send end, or a send-once
//!    right taken out of the table while it is used) and every right the message names
//!    into a [`Plan`] (`plan`): nothing is taken for good yet.
//! 2. **Place**: a message to a send right takes a place in the destination's queue
//!    (its queue page, `queue`), waiting while the queue is full ([`take_place`]), and
//!    goes out marked *counted*; one larger than the port takes is refused here.
//! 3. **Route**: [`Route::choose`] is the one place that decides how the message
//!    leaves — one write to a kept call channel's reply pipe, one datagram, or one
//!    datagram with the in-line data in a sealed memfd beside it — and
//!    [`Route::after_refusal`] the one place that decides what to try when the kernel
//!    refuses a route.
//! 4. **Transmit**: seal out-of-line regions, encode the head, hand the message to the
//!    kernel along the route; the outcome is a [`Delivery`]. A message not delivered
//!    gives its place back.
//! 5. **Commit** what the plan took (a moved right leaves the table, a made send right
//!    counts) if it was delivered; otherwise **undo** it all, and a dead destination
//!    becomes a dead name.
//!
//! `send` and `call` both go through [`Space::send_message`]; a call only supplies its
//! own reply right ([`ReplySlot`]) and, often, its already resolved destination.

use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use ictus_abi::{
    Datagram, Descriptor, Head, Header, Name, ReplyKind, DESCRIPTOR_LEN, HEADER_LEN, HEAD_MAX, INLINE_DATAGRAM_MAX,
    PIPE_MESSAGE_MAX,
};
use rustix::io::Errno;

use crate::channel::{point_to_connection, reply_through_pipe, SenderQueue};
use crate::error::SendError;
use crate::message::{Message, SendOptions};
use crate::plan::Plan;
use crate::port::{Ident, RecvPort, DOORBELL};
use crate::queue::{Place, QueuePage, Settings, Words, RING_EVERY, SMALL_DATAGRAM};
use crate::space::Space;
use crate::sys::{self, SendOutcome};
use crate::table::{Entry, PortEntry, SendOnce, Table};

/// Heads of messages with up to four descriptors are built on the stack.
const SMALL_HEAD: usize = HEADER_LEN + 4 * DESCRIPTOR_LEN;

/// The reply right a message carries, as its sender supplies it.
pub(crate) enum ReplySlot {
    /// The message's own `reply`, a right of the sender's taken by its disposition (or
    /// none).
    FromMessage,
    /// A send-once right made for this call alone.
    Once(OwnedFd),
    /// A new call channel offered to the server, with its reply pipe's write end (if
    /// one could be made) and its token.
    Channel { fd: OwnedFd, pipe: Option<OwnedFd>, token: u32 },
    /// Answer on the call channel the server keeps under this token.
    OnChannel(u32),
}

/// Where a message goes, resolved.
pub(crate) enum Target {
    /// A send end shared by every send right to the port, and how a message to it is
    /// counted against the port's queue limit.
    Shared(Arc<OwnedFd>, Queue),
    /// A send-once right, taken out of the table (its name reserved) until the send
    /// commits or undoes, so that no other thread can use it too. Not held back by the
    /// queue limit, as in Mach.
    Once(SendOnce),
}

/// How a message to a shared send end finds the destination's queue page.
pub(crate) enum Queue {
    /// The destination is this space's own receive right.
    Own(Arc<RecvPort>),
    /// A send right to the port of this identity: its page is in the space's pool once
    /// found (and here already if the caller looked).
    Right(Ident, Option<Arc<SenderQueue>>),
    /// A send right whose port's identity is not known: sent uncounted.
    Unknown,
}

/// The destination's queue page and settings, for one send.
enum Counter {
    Own(Arc<RecvPort>, Settings),
    Sender(Arc<SenderQueue>),
}

impl Counter {
    #[inline]
    fn page(&self) -> &QueuePage {
        match self {
            Counter::Own(p, _) => &p.page,
            Counter::Sender(q) => &q.page,
        }
    }

    #[inline]
    fn settings(&self) -> Settings {
        match self {
            Counter::Own(_, s) => *s,
            Counter::Sender(q) => q.settings,
        }
    }
}

impl Target {
    #[inline]
    fn fd(&self) -> &Arc<OwnedFd> {
        match self {
            Target::Shared(fd, _) => fd,
            Target::Once(so) => &so.fd,
        }
    }

    /// Whether this is a reply right on a call channel the port keeps: the reply says
    /// so, and the caller pools the channel.
    #[inline]
    fn kept(&self) -> bool {
        matches!(self, Target::Once(so) if so.channel.is_some())
    }

    /// The kept call channel's reply pipe, if it has one.
    #[inline]
    fn pipe(&self) -> Option<&OwnedFd> {
        match self {
            Target::Once(so) => so.pipe.as_deref(),
            Target::Shared(..) => None,
        }
    }

    /// Give a send-once right back to the table, under its reserved name. Returns the
    /// send end, to turn the name into a dead name if its port has died.
    fn put_back(self, t: &mut Table, dest: Name) -> Arc<OwnedFd> {
        match self {
            Target::Shared(fd, _) => fd,
            Target::Once(so) => {
                let fd = so.fd.clone();
                t.restore(dest, Entry::SendOnce(so));
                fd
            }
        }
    }
}

/// How a message leaves. Chosen in one place, [`Route::choose`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// One write to a kept call channel's reply pipe: a reply of in-line data only that
    /// fits `PIPE_BUF` (about half a datagram's cost).
    Pipe,
    /// One datagram carrying the in-line data.
    Datagram,
    /// One datagram, the in-line data copied into a sealed memfd beside it.
    BigInline,
}

impl Route {
    /// The route for a message whose plan is made and whose out-of-line regions are
    /// sealed. `large` says whether its place in the destination's queue may hold a
    /// datagram larger than `SMALL_DATAGRAM` (`queue::Sizes`); if not, larger in-line
    /// data goes in a memfd, so that every counted message fits the port's buffer.
    #[inline]
    fn choose(msg: &Message, plan: &Plan, target: &Target, large: bool) -> Route {
        let len = msg.data.len();
        if len > INLINE_DATAGRAM_MAX {
            Route::BigInline
        } else if target.pipe().is_some() && plan.is_plain() && HEADER_LEN + len <= PIPE_MESSAGE_MAX {
            Route::Pipe
        } else if !large && len != 0 && HEADER_LEN + plan.descriptors().len() * DESCRIPTOR_LEN + len > SMALL_DATAGRAM {
            Route::BigInline
        } else {
            Route::Datagram
        }
    }

    /// The route to try when this one was refused: the pipe is full or its reader
    /// gone (the reply goes on the connection, where a word on the pipe sends the
    /// caller); the port's buffer can never hold the datagram (the in-line data goes in
    /// a memfd). `None`: nothing else can carry it.
    fn after_refusal(self, msg: &Message) -> Option<Route> {
        match self {
            Route::Pipe => Some(Route::Datagram),
            Route::Datagram if !msg.data.is_empty() => Some(Route::BigInline),
            Route::Datagram | Route::BigInline => None,
        }
    }
}

/// How a transmission ended. Anything else is an error of the send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    /// The kernel took the message.
    Sent,
    /// The destination's queue stayed full until the deadline.
    QueueFull,
    /// The destination's receive right is gone.
    PortDead,
}

impl Space {
    /// Send a message to the port named by `dest` (a send or send-once right; a
    /// receive right sends to its own port).
    ///
    /// Rights in the message are taken by their dispositions only if the send
    /// succeeds. Out-of-line buffers are moved out of `msg` in every case.
    pub fn send(&self, dest: Name, msg: &mut Message, opts: SendOptions) -> Result<(), SendError> {
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        self.send_message(dest, None, msg, ReplySlot::FromMessage, deadline)
    }

    /// The send path: resolve (unless the caller resolved the destination already),
    /// transmit, then commit or undo.
    pub(crate) fn send_message(
        &self,
        dest: Name,
        target: Option<Target>,
        msg: &mut Message,
        reply: ReplySlot,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let mut plan = Plan::new();
        let target = self.resolve(dest, target, msg, reply, &mut plan)?;
        let delivery = self.transmit(&target, msg, &mut plan, deadline);
        self.finish(dest, target, &mut plan, delivery)
    }

    /// Resolve the destination and every right the message names into `plan`. On
    /// failure nothing has been taken.
    #[inline]
    fn resolve(
        &self,
        dest: Name,
        target: Option<Target>,
        msg: &Message,
        reply: ReplySlot,
        plan: &mut Plan,
    ) -> Result<Target, SendError> {
        match reply {
            ReplySlot::FromMessage => {}
            ReplySlot::OnChannel(token) => {
                plan.token = token;
                plan.reply = ReplyKind::OnChannel;
            }
            own => plan_own_reply(own, plan),
        }
        let names_rights = msg.reply.is_some() || !msg.ports.is_empty();
        match target {
            // Nothing to look up: the common case takes no lock.
            Some(target) if !names_rights => Ok(target),
            None if !names_rights => resolve_target(&mut self.table(), dest),
            target => self.resolve_rights(dest, target, msg, plan),
        }
    }

    /// [`Space::resolve`] for a message that names rights: the destination (if need
    /// be) and the rights under one lock of the table.
    #[inline(never)]
    fn resolve_rights(
        &self,
        dest: Name,
        target: Option<Target>,
        msg: &Message,
        plan: &mut Plan,
    ) -> Result<Target, SendError> {
        // No liveness check here: the send itself finds a dead port (EPIPE).
        let mut t = self.table();
        let target = match target {
            Some(target) => target,
            None => resolve_target(&mut t, dest)?,
        };
        let resolved = match msg.reply {
            Some(r) => self.resolve_reply(&mut t, r, plan),
            None => Ok(()),
        }
        .and_then(|()| self.resolve_body(&mut t, &msg.ports, plan));
        if let Err(e) = resolved {
            self.inner.undo(&mut t, plan.take_undo());
            target.put_back(&mut t, dest);
            return Err(e);
        }
        Ok(target)
    }

    /// Take a place in the destination's queue (a shared send end), seal the
    /// out-of-line regions, then hand the message to the kernel along the chosen route,
    /// and along the next one while a route is refused. A message that is not
    /// delivered gives its place back.
    #[inline]
    fn transmit(
        &self,
        target: &Target,
        msg: &mut Message,
        plan: &mut Plan,
        deadline: Option<Instant>,
    ) -> Result<Delivery, SendError> {
        let counter = self.counter(target);
        if let Some(c) = &counter {
            let limit = c.settings().limit;
            if msg.data.len() as u64 > u64::from(limit) {
                return Err(SendError::TooLarge { size: msg.data.len() as u64, limit });
            }
        }
        if !msg.ool.is_empty() {
            seal_regions(msg, plan)?;
        }
        let (counted, large) = match &counter {
            None => (false, true),
            Some(c) => match take_place(c, target.fd().as_fd(), deadline) {
                Ok(large) => (true, large),
                Err(delivery) => return Ok(delivery),
            },
        };
        let delivery = transmit_placed(target, msg, plan, deadline, counted, large);
        if counted && !matches!(delivery, Ok(Delivery::Sent)) {
            if let Some(c) = &counter {
                c.page().words().cancel();
            }
        }
        delivery
    }

    /// How a message to `target` is counted: `None` for a send-once right, or when the
    /// destination's queue page cannot be found (the message then goes uncounted, held
    /// back by the kernel's buffer alone).
    #[inline]
    fn counter(&self, target: &Target) -> Option<Counter> {
        match target {
            Target::Once(_) | Target::Shared(_, Queue::Unknown) => None,
            Target::Shared(_, Queue::Own(p)) => Some(Counter::Own(p.clone(), p.settings())),
            Target::Shared(fd, Queue::Right(ident, cached)) => {
                let cached = match cached {
                    Some(q) => Some(q.clone()),
                    None => self.inner.pool.queue(*ident),
                };
                match cached {
                    Some(q) if !q.stale() => Some(Counter::Sender(q)),
                    cached => self.find_queue(*ident, fd.as_fd(), cached).map(Counter::Sender),
                }
            }
        }
    }

    /// Find the destination's queue page from the note on its send end (or read the
    /// note again, its settings having changed), and keep it for the next send.
    #[cold]
    #[inline(never)]
    fn find_queue(
        &self,
        ident: Ident,
        fd: BorrowedFd<'_>,
        cached: Option<Arc<SenderQueue>>,
    ) -> Option<Arc<SenderQueue>> {
        let generation = self.inner.pool.generation();
        let found = match cached {
            Some(q) => q.refreshed(fd),
            None => SenderQueue::find(fd),
        };
        let q = Arc::new(found?);
        self.inner.pool.keep_queue(ident, q.clone(), generation);
        Some(q)
    }

    /// Commit what the plan took if the message was delivered; otherwise undo it all,
    /// and turn a destination whose port has died into a dead name.
    #[inline]
    fn finish(
        &self,
        dest: Name,
        target: Target,
        plan: &mut Plan,
        delivery: Result<Delivery, SendError>,
    ) -> Result<(), SendError> {
        match delivery {
            Ok(Delivery::Sent) => {
                if matches!(target, Target::Once(_)) || plan.has_commits() {
                    self.commit_sent(dest, target, plan);
                }
                Ok(())
            }
            failed => Err(self.undo_failed(dest, target, plan, failed)),
        }
    }

    /// A delivered message: a used send-once right's name is free again, and what the
    /// plan took is taken for good.
    #[inline(never)]
    fn commit_sent(&self, dest: Name, target: Target, plan: &mut Plan) {
        let commits = plan.take_commit();
        let mut t = self.table();
        if let Target::Once(_) = target {
            t.release(dest);
            self.inner.cancel_requests(dest);
        }
        self.inner.commit(&mut t, commits);
    }

    /// A message that was not delivered: everything goes back, and a destination whose
    /// port died becomes a dead name. Returns the send's error.
    #[cold]
    #[inline(never)]
    fn undo_failed(
        &self,
        dest: Name,
        target: Target,
        plan: &mut Plan,
        delivery: Result<Delivery, SendError>,
    ) -> SendError {
        let mut t = self.table();
        self.inner.undo(&mut t, plan.take_undo());
        let fd = target.put_back(&mut t, dest);
        match delivery {
            Ok(Delivery::Sent) => unreachable!("delivered messages are committed"),
            Ok(Delivery::QueueFull) => SendError::TimedOut,
            Ok(Delivery::PortDead) => {
                self.inner.make_dead(&mut t, dest, &fd);
                SendError::InvalidDest(dest)
            }
            Err(e) => e,
        }
    }
}

/// Hand the message to the kernel along the chosen route, and along the next one while
/// a route is refused: marked counted if it took a place, its in-line data in a memfd
/// unless it may be `large`.
#[inline]
fn transmit_placed(
    target: &Target,
    msg: &Message,
    plan: &Plan,
    deadline: Option<Instant>,
    counted: bool,
    large: bool,
) -> Result<Delivery, SendError> {
    let route = Route::choose(msg, plan, target, large);
    let head = head(msg, plan, target, counted);
    if route == Route::BigInline || !plan.is_bare() {
        return transmit_from(route, head, target, msg, plan, deadline);
    }
    // The common case: in-line data in the datagram (or the pipe), a header and
    // nothing else.
    let header = plain_head(head, msg.data.len(), 0);
    match attempt(route, target, &[IoSlice::new(&header), IoSlice::new(&msg.data)], &[], deadline)? {
        Attempt::Done(delivery) => Ok(delivery),
        Attempt::Refused => {
            let next = route.after_refusal(msg).ok_or(SendError::Os(Errno::MSGSIZE))?;
            transmit_from(next, head, target, msg, plan, deadline)
        }
    }
}

/// Take a place in the destination's queue, waiting while it is full until `deadline`
/// (`None`: for ever; a past deadline: not at all). `Ok` says whether the place may
/// hold a large datagram; otherwise how the send ended (`QueueFull`, `PortDead`).
#[inline]
fn take_place(c: &Counter, end: BorrowedFd<'_>, deadline: Option<Instant>) -> Result<bool, Delivery> {
    match c.page().words().reserve(&c.settings()) {
        Place::Taken { large, .. } => Ok(large),
        Place::Full => wait_for_place(c, end, deadline),
    }
}

/// [`take_place`] when the queue is full: sleep on the page's `released` word until the
/// receiver gives a place back (it wakes one sleeper per message it takes), waking on
/// one's own every `RING_EVERY` to look again; ring the port (a doorbell) when the
/// kernel says nothing of this connection is queued, so that it looks for places taken
/// and never used (`queue::Ledger::audit`).
#[cold]
#[inline(never)]
fn wait_for_place(c: &Counter, end: BorrowedFd<'_>, deadline: Option<Instant>) -> Result<bool, Delivery> {
    sleep_for_place(
        c,
        end,
        deadline,
        || false,
        |w, settings| match w.reserve(settings) {
            Place::Taken { large, .. } => Some(large),
            Place::Full => None,
        },
    )
}

/// The wait of a sender whose destination's queue is full, for every sender that waits
/// (the blocking [`wait_for_place`], the async sender's [`RoomWait`]): count as a
/// waiter, `look` (take a place, or only see one), and sleep on the page's `released`
/// word until the receiver gives a place back, ringing the port now and then. Ends
/// with what `look` found, or `QueueFull` at the deadline or once `stop` says so (a
/// wake-up that came meanwhile is passed on to the next sleeper), or `PortDead`.
fn sleep_for_place<T>(
    c: &Counter,
    end: BorrowedFd<'_>,
    deadline: Option<Instant>,
    stop: impl Fn() -> bool,
    look: impl Fn(&Words<'_>, &Settings) -> Option<T>,
) -> Result<T, Delivery> {
    let w = c.page().words();
    let settings = c.settings();
    let mut rang: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) || stop() {
            return Err(Delivery::QueueFull);
        }
        w.waiters.fetch_add(1, Ordering::AcqRel);
        let seen = w.released.load(Ordering::Acquire);
        // Look again now that this sender counts as a waiter: a place given back
        // before is seen here, one given back after wakes it.
        if let Some(found) = look(&w, &settings) {
            w.waiters.fetch_sub(1, Ordering::AcqRel);
            return Ok(found);
        }
        if rang.is_none_or(|t| now.saturating_duration_since(t) >= RING_EVERY)
            && ictus_sys::socket::outq_len(end).is_ok_and(|n| n == 0)
        {
            let _ = sys::send(end, &[IoSlice::new(&[DOORBELL])], &[], Some(now));
            rang = Some(now);
        }
        let wait = deadline.map_or(RING_EVERY, |d| d.saturating_duration_since(now).min(RING_EVERY));
        sys::futex_wait(w.released, seen, wait);
        w.waiters.fetch_sub(1, Ordering::AcqRel);
        if sys::hung_up(end) {
            return Err(Delivery::PortDead);
        }
        if let Some(found) = look(&w, &settings) {
            return Ok(found);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) || stop() {
            // Giving up: if a wake-up meant for a sender came here, pass it on.
            c.page().wake(1);
            return Err(Delivery::QueueFull);
        }
    }
}

#[cfg(feature = "tokio")]
/// What a [`RoomWait`] came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// The queue shows a free place (not taken: another sender may take it first).
    Free,
    /// Still full at the deadline, or the wait was stopped.
    Full,
    /// The destination's port is dead.
    Dead,
}

#[cfg(feature = "tokio")]
/// A wait for room in a destination's queue that takes no place: the async sender
/// (`aio`) runs [`RoomWait::wait`] on a blocking thread of its runtime, then tries its
/// send without blocking. It sleeps on the same futex word, and counts as a waiter the
/// same way, as a blocked [`Space::send`]: the receiver's wake-up for the place it gives
/// back reaches it. (The send end's writability does not do: the kernel makes it
/// writable when the receiver dequeues, before the receiver gives the place back.)
pub(crate) struct RoomWait {
    counter: Counter,
    end: Arc<OwnedFd>,
}

#[cfg(feature = "tokio")]
impl RoomWait {
    /// Whether the queue is full by the page's count.
    pub(crate) fn full(&self) -> bool {
        self.counter.page().words().queued() >= self.counter.settings().qlimit
    }

    /// Sleep until the queue shows room, its port dies, `deadline` passes, or `stop`
    /// says so.
    pub(crate) fn wait(&self, deadline: Option<Instant>, stop: impl Fn() -> bool) -> Room {
        let look = |w: &Words<'_>, settings: &Settings| (w.queued() < settings.qlimit).then_some(());
        match sleep_for_place(&self.counter, self.end.as_fd(), deadline, stop, look) {
            Ok(()) => Room::Free,
            Err(Delivery::PortDead) => Room::Dead,
            Err(_) => Room::Full,
        }
    }

    /// Pass a wake-up this wait took, and will not use, on to the next sleeper.
    pub(crate) fn pass_on(&self) {
        self.counter.page().wake(1);
    }
}

#[cfg(feature = "tokio")]
impl Space {
    /// The wait for room in `dest`'s queue (a send right, or a receive right's own
    /// port): `None` for a destination no queue page holds back (a send-once right, or
    /// a port whose page was not found), where the kernel's buffer is the only bound.
    pub(crate) fn room_wait(&self, dest: Name) -> Result<Option<RoomWait>, SendError> {
        let target = resolve_target(&mut self.table(), dest)?;
        match (self.counter(&target), target) {
            (Some(counter), Target::Shared(end, _)) => Ok(Some(RoomWait { counter, end })),
            (_, target) => {
                target.put_back(&mut self.table(), dest);
                Ok(None)
            }
        }
    }
}

/// The head a message's header is built from.
#[inline]
fn head(msg: &Message, plan: &Plan, target: &Target, counted: bool) -> Head {
    Head { id: msg.id, reply: plan.reply, token: plan.token, kept: target.kept(), counted }
}

/// What one attempt along a route came to.
enum Attempt {
    /// The kernel took the message, or gave a final answer.
    Done(Delivery),
    /// The route refused the message: try the next.
    Refused,
}

/// Hand the message's head and in-line data (`bufs`) and its descriptors (`fds`) to
/// the kernel along `route`, once.
#[inline]
fn attempt(
    route: Route,
    target: &Target,
    bufs: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
    deadline: Option<Instant>,
) -> Result<Attempt, SendError> {
    if route == Route::Pipe {
        let sent = reply_through_pipe(target.pipe(), bufs);
        return Ok(if sent { Attempt::Done(Delivery::Sent) } else { Attempt::Refused });
    }
    Ok(match sys::send(target.fd().as_fd(), bufs, fds, deadline)? {
        SendOutcome::Sent => {
            // A kept call channel's reply that went on the connection: the word on its
            // pipe that sends the caller there.
            point_to_connection(target.pipe(), target.kept());
            Attempt::Done(Delivery::Sent)
        }
        SendOutcome::WouldBlock => Attempt::Done(Delivery::QueueFull),
        SendOutcome::Dead => Attempt::Done(Delivery::PortDead),
        SendOutcome::TooLarge => Attempt::Refused,
    })
}

/// Transmit from `route` on, each refused route giving way to the next: any message,
/// descriptors, big in-line data and all.
#[inline(never)]
fn transmit_from(
    mut route: Route,
    head: Head,
    target: &Target,
    msg: &Message,
    plan: &Plan,
    deadline: Option<Instant>,
) -> Result<Delivery, SendError> {
    let mut big: Option<(OwnedFd, u64)> = None;
    loop {
        if route == Route::BigInline && big.is_none() {
            big = Some(big_inline(&msg.data)?);
        }
        let (inline, big_len) = match &big {
            Some((_, len)) => (&[][..], *len),
            None => (&msg.data[..], 0),
        };
        let (plain, mut small, mut large);
        let bytes: &[u8] = if plan.descriptors().is_empty() {
            plain = plain_head(head, inline.len(), big_len);
            &plain
        } else {
            small = [0u8; SMALL_HEAD];
            large = Vec::new();
            encode_head(head, plan.descriptors(), inline.len(), big_len, &mut small, &mut large)?
        };
        let bufs = [IoSlice::new(bytes), IoSlice::new(inline)];
        let fds = plan.wire_fds(big.as_ref().map(|(fd, _)| fd.as_fd()));
        match attempt(route, target, &bufs, &fds, deadline)? {
            Attempt::Done(delivery) => return Ok(delivery),
            Attempt::Refused => route = route.after_refusal(msg).ok_or(SendError::Os(Errno::MSGSIZE))?,
        }
    }
}

/// A reply right the caller made itself goes first in the plan.
#[inline(never)]
fn plan_own_reply(reply: ReplySlot, plan: &mut Plan) {
    match reply {
        ReplySlot::Once(fd) => plan.own_reply(fd, ReplyKind::SendOnce),
        ReplySlot::Channel { fd, pipe, token } => {
            plan.token = token;
            match pipe {
                Some(pipe) => {
                    plan.own_reply(fd, ReplyKind::ChannelPipe);
                    plan.push_owned(pipe);
                }
                None => plan.own_reply(fd, ReplyKind::Channel),
            }
        }
        ReplySlot::FromMessage | ReplySlot::OnChannel(_) => unreachable!("no reply right of the caller's"),
    }
}

/// Out-of-line regions: give up each mapping, seal the memfd, and plan to send it.
#[inline(never)]
fn seal_regions(msg: &mut Message, plan: &mut Plan) -> Result<(), SendError> {
    for buf in msg.ool.drain(..) {
        let (fd, len) = buf.seal()?;
        plan.push_region(fd, len);
    }
    Ok(())
}

/// The head of a message without descriptors (the common case): the fixed header
/// alone, as `Datagram::encode_head` writes it; its checks hold by construction (the
/// token comes with a channel reply kind, the in-line data fits its route).
#[inline]
fn plain_head(head: Head, inline_len: usize, big_len: u64) -> [u8; HEADER_LEN] {
    let header = Header {
        id: head.id,
        reply: head.reply,
        token: head.token,
        kept: head.kept,
        on_socket: false,
        counted: head.counted,
        ndesc: 0,
        nfds: (head.reply.fds() + usize::from(big_len != 0)) as u8,
        inline_len: inline_len as u32,
        big_len,
    };
    let mut out = [0u8; HEADER_LEN];
    header.encode(&mut out);
    out
}

/// The head of a message with descriptors: on the stack for up to four (zeroing the
/// largest possible head costs more than a whole small message), on the heap beyond.
#[inline(never)]
fn encode_head<'a>(
    head: Head,
    descriptors: &[Descriptor],
    inline_len: usize,
    big_len: u64,
    small: &'a mut [u8; SMALL_HEAD],
    large: &'a mut Vec<u8>,
) -> Result<&'a [u8], SendError> {
    let need = HEADER_LEN + descriptors.len() * DESCRIPTOR_LEN;
    let buf: &mut [u8] = if need <= SMALL_HEAD {
        small
    } else {
        large.resize(need.min(HEAD_MAX), 0);
        large
    };
    let (_, n) = Datagram::encode_head(head, descriptors, inline_len, big_len, buf)?;
    Ok(&buf[..n])
}

/// The destination `dest` names: a send right's shared send end, a receive right's
/// send end (sending to one's own port), or a send-once right taken out of the table.
#[inline]
fn resolve_target(t: &mut Table, dest: Name) -> Result<Target, SendError> {
    let invalid = SendError::InvalidDest(dest);
    let port = match t.get(dest).map_err(|_| SendError::InvalidDest(dest))? {
        Entry::Port(PortEntry { send: Some(s), ident, .. }) => {
            let queue = ident.map_or(Queue::Unknown, |i| Queue::Right(i, None));
            return Ok(Target::Shared(s.fd.clone(), queue));
        }
        Entry::Port(PortEntry { recv: Some(p), .. }) => p.clone(),
        Entry::SendOnce(_) => {
            return match t.reserve(dest) {
                Ok(Entry::SendOnce(so)) => Ok(Target::Once(so)),
                _ => Err(invalid),
            }
        }
        _ => return Err(invalid),
    };
    let (fd, _, _) = port.lock().send_end().map_err(SendError::Os)?;
    Ok(Target::Shared(fd, Queue::Own(port)))
}

/// In-line data too large for a datagram (or for the port's buffer), copied into a
/// sealed memfd: still two copies, like Mach in-line, and one datagram per message.
#[inline(never)]
fn big_inline(data: &[u8]) -> Result<(OwnedFd, u64), SendError> {
    if data.len() as u64 > ictus_abi::BIG_INLINE_MAX {
        return Err(SendError::Invalid(ictus_abi::DecodeError::BadBigInline(data.len() as u64)));
    }
    let fd = sys::memfd(data.len())?;
    sys::write_all_at(fd.as_fd(), data)?;
    sys::seal(fd.as_fd())?;
    Ok((fd, data.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::PortArg;

    fn shared() -> Target {
        Target::Shared(Arc::new(sys::connection().unwrap().0), Queue::Unknown)
    }

    fn kept_reply(pipe: bool) -> Target {
        let fd = Arc::new(sys::connection().unwrap().0);
        let pipe = pipe.then(|| Arc::new(sys::reply_pipe().unwrap().1));
        Target::Once(SendOnce { fd, channel: Some((1, (2, 3))), pipe })
    }

    #[test]
    fn routes_are_chosen_in_one_place() {
        let plain = Plan::new();
        let small = Message::new(1, vec![0; 100]);
        let page = Message::new(1, vec![0; PIPE_MESSAGE_MAX - HEADER_LEN]);
        let over_a_page = Message::new(1, vec![0; PIPE_MESSAGE_MAX - HEADER_LEN + 1]);
        let huge = Message::new(1, vec![0; INLINE_DATAGRAM_MAX + 1]);
        // A plain reply that fits a pipe write goes through the kept channel's pipe.
        assert_eq!(Route::choose(&small, &plain, &kept_reply(true), true), Route::Pipe);
        assert_eq!(Route::choose(&page, &plain, &kept_reply(true), true), Route::Pipe);
        assert_eq!(Route::choose(&over_a_page, &plain, &kept_reply(true), true), Route::Datagram);
        // No pipe, or not a reply: a datagram.
        assert_eq!(Route::choose(&small, &plain, &kept_reply(false), true), Route::Datagram);
        assert_eq!(Route::choose(&small, &plain, &shared(), true), Route::Datagram);
        // Anything but in-line data goes on the connection.
        let mut with_right = Plan::new();
        with_right.reply = ReplyKind::SendOnce;
        assert_eq!(Route::choose(&small, &with_right, &kept_reply(true), true), Route::Datagram);
        let mut with_region = Plan::new();
        with_region.push_region(sys::memfd(1).unwrap(), 1);
        assert_eq!(Route::choose(&small, &with_region, &kept_reply(true), true), Route::Datagram);
        // More than a datagram carries: a memfd beside it, whatever the target.
        assert_eq!(Route::choose(&huge, &plain, &kept_reply(true), true), Route::BigInline);
        assert_eq!(Route::choose(&huge, &plain, &shared(), true), Route::BigInline);
        // A place beyond those that may hold a large datagram: more than a small
        // datagram's worth goes in a memfd; a small one, or nothing in-line, stays.
        let just_small = Message::new(1, vec![0; SMALL_DATAGRAM - HEADER_LEN]);
        let just_over = Message::new(1, vec![0; SMALL_DATAGRAM - HEADER_LEN + 1]);
        assert_eq!(Route::choose(&just_small, &plain, &shared(), false), Route::Datagram);
        assert_eq!(Route::choose(&just_over, &plain, &shared(), false), Route::BigInline);
        assert_eq!(Route::choose(&just_over, &plain, &shared(), true), Route::Datagram);
        assert_eq!(Route::choose(&Message::new(1, vec![]), &with_right, &shared(), false), Route::Datagram);
    }

    /// The plain header is what `Datagram::encode_head` writes for the same message.
    #[test]
    fn a_plain_head_is_the_wire_encoders() {
        for (reply, token) in [(ReplyKind::None, 0), (ReplyKind::OnChannel, 9), (ReplyKind::SendOnce, 0)] {
            for kept in [false, true] {
                for (inline_len, big_len) in [(0, 0), (64, 0), (INLINE_DATAGRAM_MAX, 0), (0, 100_000)] {
                    for counted in [false, true] {
                        let head = Head { id: -3, reply, token, kept, counted };
                        let fast = plain_head(head, inline_len, big_len);
                        let mut wire = [0u8; HEAD_MAX];
                        let (_, n) = Datagram::encode_head(head, &[], inline_len, big_len, &mut wire).unwrap();
                        assert_eq!(&fast[..], &wire[..n], "{reply:?} kept {kept} {inline_len} {big_len}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_refused_route_gives_way_to_the_next() {
        let data = Message::new(1, vec![1]);
        let empty = Message::new(1, Vec::new());
        assert_eq!(Route::Pipe.after_refusal(&data), Some(Route::Datagram));
        assert_eq!(Route::Datagram.after_refusal(&data), Some(Route::BigInline));
        // Nothing to move into a memfd, or already there: the send fails.
        assert_eq!(Route::Datagram.after_refusal(&empty), None);
        assert_eq!(Route::BigInline.after_refusal(&data), None);
    }

    /// A port whose buffer is smaller than a datagram: the in-line data goes through a
    /// memfd, and the receiver still gets it whole.
    #[test]
    fn a_datagram_too_large_for_the_port_goes_in_a_memfd() {
        let space = Space::new();
        let port = space.allocate_port_with_send().unwrap();
        space.set_qlimit(port, 1).unwrap();
        let data: Vec<u8> = (0..60_000u32).map(|i| i as u8).collect();
        space.send(port, &mut Message::new(3, data.clone()), SendOptions::default()).unwrap();
        let mut got = crate::Received::new();
        space.receive(port, &mut got, crate::ReceiveOptions::default()).unwrap();
        assert_eq!((got.id, got.data()), (3, &data[..]));
    }

    /// A failed send takes nothing: the rights it named stay, a send-once destination
    /// whose port died becomes a dead name.
    #[test]
    fn a_failed_send_takes_nothing() {
        let space = Space::new();
        let port = space.allocate_port().unwrap();
        let other = space.allocate_port_with_send().unwrap();
        let once = {
            let (name, _) = space.extract_right(&space, port, crate::Disposition::MakeSendOnce).unwrap();
            name
        };
        space.mod_refs(port, crate::RightKind::Receive, -1).unwrap();
        let mut msg = Message::new(1, b"x".to_vec());
        msg.ports.push(PortArg::new(other, crate::Disposition::MoveSend));
        assert!(
            matches!(space.send(once, &mut msg, SendOptions::default()), Err(SendError::InvalidDest(n)) if n == once)
        );
        assert_eq!(space.right_kinds(once).unwrap(), vec![crate::RightKind::DeadName]);
        assert_eq!(space.refs(other, crate::RightKind::Send).unwrap(), 1, "the moved send right stayed");
    }
}
