//! Receivers: the threads associated with a real-time port, or with a real-time port
//! set (`rt_mach_port_associate`), and the one receive loop they share.
//!
//! A port's receivers are a **group** with one member, the port; a set's are a group
//! whose members are the set's ports. A receiver takes the most urgent message waiting
//! in any member (each member's next message under its own queueing: a FIFO member's
//! count as priority 0), is given it under that port's dispatch policy, raised under its
//! hand-off, inherited into under its inheritance. One waiting receiver of a group
//! *polls* — for a port, it blocks in one `recvmmsg` on the port's main connection; for
//! a set, in the set's `epoll` over its members' main connections — and the others sleep
//! on private futexes; the one that reads gives what it read to the others, raising
//! each before waking it.
//!
//! **Hand-off, and when it ends.** The paper's rule is that a hand-off lasts "until the
//! receiver issues a next message receive call". A receiver that finds a message
//! waiting goes straight to its priority; one that finds none is, from then on, waiting:
//! it does not run, so its priority matters to nobody until something wakes it, and
//! what wakes it is a sender, who sets it to the message's priority first. So a
//! receiver that has nothing to do keeps the priority its last message gave it for a
//! short **grace** ([`GRACE`]) and says so on the status page (the priority it waits at);
//! a sender of that priority then has nothing to change and makes no system call, and
//! only a receiver left idle for the whole grace goes back to its own priority. Every
//! path that returns to the caller without a message (time-out, a dead port) goes back
//! first. A back-to-back client costs no `sched_setattr` at all, where raising before
//! every message and lowering after it costs two (about 3 µs a round trip here, half a
//! plain call).
//!
//! **What a receiver knows of its priority.** Senders change it with `sched_setattr`,
//! which no lock orders against the receiver's own changes. Each wait has a number
//! ([`W_EPOCH`]); a sender notes, beside its request, whom it set to which priority (or
//! found there) during which wait. A receiver believes one such note of its own wait;
//! notes that disagree, or that come from another wait with another priority, leave it
//! in doubt, and a receiver in doubt sets its priority itself before it serves.

use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ictus_ipc::Name;
use ictus_rt::thread::Policy;
use rustix::event::epoll;

use crate::attr::{Handoff, Priority, Queueing, MAX_MESSAGE, MAX_PRIORITY};
use crate::error::{AssociateError, ReceiveError, ReplyError};
use crate::port::{send_reply, Note, PortInner, Read, Releases, Request, Wait, W_BUSY, W_EPOCH, W_POLLER, W_POLLER_AT};
use crate::prio;
use crate::queue::{choose_receiver, order_key, Entry, Waiting};
use crate::sys;
use crate::MAX_RECEIVERS;

/// How long a receiver with nothing to do keeps the priority its last message gave it.
pub const GRACE: Duration = Duration::from_millis(2);
/// The longest one futex wait of a receiver that does not poll (a safety net).
const SLICE: Duration = Duration::from_millis(50);

/// Wait numbers, process-wide, so that a port moving between groups never meets an old
/// number again; never zero.
static EPOCHS: AtomicU32 = AtomicU32::new(0);

fn next_epoch() -> u32 {
    loop {
        let e = EPOCHS.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if e != 0 {
            return e;
        }
    }
}

/// A message given to a receiver but not yet taken by it: the member it came to, and
/// the message.
type Assigned = (Name, Arc<PortInner>, Entry);

/// What the senders said they set a polling receiver to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Nothing,
    One(Priority),
    Many,
}

#[derive(Debug)]
struct Slot {
    tid: u32,
    base: Policy,
    assoc: Priority,
    word: Arc<AtomicU32>,
    assigned: Option<Assigned>,
    /// The priority this thread is at, as far as it knows (`None`: its own, `base`).
    belief: Option<Priority>,
    /// Senders may have set its priority unknown to it.
    doubt: bool,
    /// The number of its last wait as the group's poller.
    epoch: u32,
    /// What senders noted during that wait.
    seen: Seen,
    /// Since when it has had nothing to do at a priority a hand-off gave it.
    idle_since: Option<Instant>,
    /// Connections whose PI word names this receiver but whose request another
    /// receiver answered: released when this one next receives.
    releases: Releases,
}

impl Slot {
    /// `Some(p)`, unless `p` is the thread's own class anyway.
    fn normal(&self, p: Option<Priority>) -> Option<Priority> {
        p.filter(|&p| prio::policy_for(p) != self.base)
    }

    /// The thread is at `p` (`None`: its own priority).
    fn now_at(&mut self, p: Option<Priority>) {
        self.belief = self.normal(p);
        self.doubt = false;
    }

    /// Back to its own priority, if it may be elsewhere.
    fn restore(&mut self) {
        if self.belief.is_some() || self.doubt {
            prio::restore(self.tid, self.base);
        }
        self.belief = None;
        self.doubt = false;
        self.idle_since = None;
    }

    /// At `p` for a message, setting it unless it is there already.
    fn serve_at(&mut self, p: Option<Priority>) {
        let want = self.normal(p);
        if !self.doubt && self.belief == want {
            return;
        }
        match want {
            Some(p) => {
                if prio::hand_off(self.tid, p) {
                    self.now_at(Some(p));
                }
            }
            None => self.restore(),
        }
    }

    /// A sender's note naming this thread. `polling`: it is the poller, in wait `epoch`.
    fn heard(&mut self, n: Note, polling: bool) {
        if polling && n.epoch == self.epoch {
            self.seen = match self.seen {
                Seen::Nothing => Seen::One(n.priority),
                Seen::One(p) if p == n.priority => Seen::One(p),
                _ => Seen::Many,
            };
        } else if self.normal(Some(n.priority)) != self.belief {
            // A sender that read an older wait, or set it after its wait: in doubt.
            self.doubt = true;
        }
    }

    /// Its wait as the poller is over: what the senders noted is where it is now.
    fn end_wait(&mut self) {
        match std::mem::replace(&mut self.seen, Seen::Nothing) {
            Seen::Nothing => {}
            Seen::One(p) if !self.doubt => self.belief = self.normal(Some(p)),
            Seen::One(_) | Seen::Many => self.doubt = true,
        }
    }

    /// How much longer it keeps a hand-off's priority while it has nothing to do; back
    /// to its own priority (now) when the grace is over or it is in doubt.
    fn grace_left(&mut self, now: Instant) -> Option<Duration> {
        if self.doubt {
            self.restore();
            return None;
        }
        self.belief?;
        let since = *self.idle_since.get_or_insert(now);
        match GRACE.checked_sub(now.saturating_duration_since(since)) {
            Some(left) if !left.is_zero() => Some(left),
            _ => {
                self.restore();
                None
            }
        }
    }

    /// The priority it waits at, for the status page (+1; 0: unknown).
    fn waits_at(&self) -> u32 {
        if self.doubt {
            return 0;
        }
        match self.belief {
            Some(p) => u32::from(p) + 1,
            None => {
                let own = prio::priority_of(self.base);
                if prio::policy_for(own) == self.base {
                    u32::from(own) + 1
                } else {
                    0
                }
            }
        }
    }
}

/// How a group's poller waits.
#[derive(Debug)]
enum How {
    /// On its port's main connection.
    Port,
    /// In an epoll over the members' main connections, plus an eventfd to wake it.
    Set { epoll: OwnedFd, wake: OwnedFd },
}

#[derive(Debug)]
pub(crate) struct GroupState {
    pub(crate) members: Vec<(Name, Arc<PortInner>)>,
    receivers: Vec<Option<Slot>>,
    waiting: Vec<Waiting>,
    poller: Option<usize>,
}

/// The receivers of a real-time port or port set.
#[derive(Debug)]
pub(crate) struct Group {
    how: How,
    state: Mutex<GroupState>,
    pub(crate) dead: AtomicBool,
}

/// What the poller waits on, taken from the group while it holds the lock.
enum Poll {
    Port(Arc<PortInner>),
    Set,
}

impl Group {
    /// The receivers of one port.
    pub(crate) fn for_port(name: Name, port: Arc<PortInner>) -> Arc<Group> {
        Group::with(How::Port, vec![(name, port)])
    }

    /// The receivers of a port set, which has no members yet.
    pub(crate) fn for_set() -> std::io::Result<Arc<Group>> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let wake =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        epoll::add(&epoll, &wake, epoll::EventData::new_u64(u64::MAX), epoll::EventFlags::IN)?;
        Ok(Group::with(How::Set { epoll, wake }, Vec::with_capacity(crate::MAX_MEMBERS)))
    }

    fn with(how: How, members: Vec<(Name, Arc<PortInner>)>) -> Arc<Group> {
        Arc::new(Group {
            how,
            state: Mutex::new(GroupState {
                members,
                receivers: Vec::new(),
                waiting: Vec::with_capacity(MAX_RECEIVERS),
                poller: None,
            }),
            dead: AtomicBool::new(false),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_set(&self) -> bool {
        matches!(self.how, How::Set { .. })
    }

    /// The set's epoll (a port's group has none).
    pub(crate) fn epoll(&self) -> Option<&OwnedFd> {
        match &self.how {
            How::Set { epoll, .. } => Some(epoll),
            How::Port => None,
        }
    }

    /// Wakes the receiver polling the group, so that it looks again.
    pub(crate) fn kick(&self, st: &GroupState) {
        match &self.how {
            How::Set { wake, .. } => {
                let _ = rustix::io::write(wake, &1u64.to_ne_bytes());
            }
            How::Port => {
                if let Some((_, p)) = st.members.first() {
                    p.ring();
                }
            }
        }
    }

    /// Number of receivers associated.
    pub(crate) fn receiver_count(&self) -> usize {
        self.receiver_count_locked(&self.lock())
    }

    /// Number of receivers associated, under the group's lock.
    pub(crate) fn receiver_count_locked(&self, st: &GroupState) -> usize {
        st.receivers.iter().flatten().count()
    }

    /// Messages of `port` given to receivers but not taken yet go back to its queue.
    pub(crate) fn give_back(&self, st: &mut GroupState, port: &Arc<PortInner>) {
        let mut ps = port.lock();
        for r in st.receivers.iter_mut().flatten() {
            if r.assigned.as_ref().is_some_and(|(_, p, _)| Arc::ptr_eq(p, port)) {
                if let Some((_, _, e)) = r.assigned.take() {
                    let _ = ps.queue.commit(e.slot, e.conn, e.priority, e.seq, e.sync, e.len);
                }
            }
        }
    }

    /// Whether the group can no longer give messages: destroyed, or its port is.
    fn is_dead(&self, st: &GroupState) -> bool {
        self.dead.load(Ordering::SeqCst)
            || (!self.is_set() && st.members.first().is_none_or(|(_, p)| p.dead.load(Ordering::SeqCst)))
    }

    /// Destroys the group: its receivers end with `PortDied`.
    pub(crate) fn destroy(&self) {
        if !self.dead.swap(true, Ordering::SeqCst) {
            self.wake_all();
        }
    }

    /// Wakes every receiver, and the poller, so that they look again.
    pub(crate) fn wake_all(&self) {
        let st = self.lock();
        for r in st.receivers.iter().flatten() {
            r.word.fetch_add(1, Ordering::SeqCst);
            sys::wake_private(&r.word);
        }
        self.kick(&st);
    }

    /// Associates the calling thread. `check` runs under the group's lock before the
    /// receiver is added (a port's group refuses while the port is in a set).
    pub(crate) fn associate(
        self: &Arc<Self>,
        priority: Option<Priority>,
        check: impl FnOnce(&GroupState) -> Result<(), AssociateError>,
    ) -> Result<Receiver, AssociateError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(AssociateError::PortDied);
        }
        if prio::native_cached().is_some() {
            return Err(AssociateError::AlreadyAssociated);
        }
        let tid = sys::gettid();
        if let Some(p) = priority {
            // DISP_WORK's `priop`: the receiver's own priority. Refused without
            // privilege (warned once): the thread keeps its class.
            let _ = prio::hand_off(tid, p);
        }
        let base = sys::thread_policy(0).unwrap_or(Policy::DEFAULT);
        let assoc = prio::priority_of(base);
        let mut st = self.lock();
        check(&st)?;
        if st.receivers.iter().flatten().count() >= MAX_RECEIVERS {
            return Err(AssociateError::AlreadyAssociated);
        }
        let slot = Slot {
            tid,
            base,
            assoc,
            word: Arc::new(AtomicU32::new(0)),
            assigned: None,
            belief: None,
            doubt: false,
            epoch: 0,
            seen: Seen::Nothing,
            idle_since: None,
            releases: Releases::with_capacity(64),
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
        Ok(Receiver { group: Arc::clone(self), id, tid, yield_next: false, _not_send: PhantomData })
    }

    /// Reads what the members hold, without waiting, where that can change the choice:
    /// every member of a set; a port whose queue orders by priority and already has
    /// messages (a newer one may be more urgent). A port's empty queue is filled by its
    /// poller's blocking read instead, which returns at once if anything is queued.
    fn collect(&self, st: &GroupState, drained: bool) {
        for (_, p) in &st.members {
            if p.dead.load(Ordering::SeqCst) {
                if let Some(ep) = self.epoll() {
                    // Destroyed while a member (its connection stays readable).
                    let _ = epoll::delete(ep, p.main_recv());
                }
                continue;
            }
            let look = self.is_set() || (!drained && p.attrs.queueing != Queueing::Fifo && !p.lock().queue.is_empty());
            if look {
                p.read(Wait::Now);
            }
        }
    }

    /// Hands the senders' notes read since the last look to the receivers they name.
    fn absorb(st: &mut GroupState) {
        let GroupState { members, receivers, poller, .. } = st;
        for (_, p) in members.iter() {
            let mut ps = p.lock();
            let lost = std::mem::replace(&mut ps.notes_lost, false);
            for n in ps.notes.drain(..) {
                if let Some((i, r)) = receivers
                    .iter_mut()
                    .enumerate()
                    .find_map(|(i, r)| r.as_mut().filter(|r| r.tid == n.tid).map(|r| (i, r)))
                {
                    r.heard(n, *poller == Some(i));
                }
            }
            if lost {
                for r in receivers.iter_mut().flatten() {
                    r.doubt = true;
                }
            }
        }
    }

    /// Whether every member has a free buffer to read into.
    fn room(st: &GroupState) -> bool {
        st.members.iter().all(|(_, p)| p.lock().queue.free() > 0)
    }

    /// Publishes receiver `me` as the poller on every member's status page: its tid, the
    /// priority it waits at, and the number of this wait (that last, before the tid).
    fn publish(st: &mut GroupState, me: usize) {
        let epoch = next_epoch();
        let GroupState { members, receivers, .. } = st;
        let Some(r) = receivers.get_mut(me).and_then(Option::as_mut) else { return };
        r.epoch = epoch;
        r.seen = Seen::Nothing;
        let at = r.waits_at();
        for (_, p) in members.iter() {
            p.status.word(W_POLLER_AT).store(at, Ordering::SeqCst);
            p.status.word(W_EPOCH).store(epoch, Ordering::SeqCst);
            p.status.word(W_POLLER).store(r.tid, Ordering::SeqCst);
        }
    }

    /// Takes receiver `tid` off the status pages as the poller.
    fn unpublish(st: &GroupState, tid: u32) {
        for (_, p) in &st.members {
            if p.status.word(W_POLLER).compare_exchange(tid, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                p.status.word(W_POLLER_AT).store(0, Ordering::SeqCst);
            }
        }
    }

    /// Gives the most urgent waiting messages across the members to waiting receivers,
    /// raising each (under its port's hand-off) before waking it.
    fn dispatch(&self, st: &mut GroupState, me: usize) {
        while !st.waiting.is_empty() {
            let mut best: Option<(usize, (u8, u64), Priority)> = None;
            for (i, (_, p)) in st.members.iter().enumerate() {
                if p.dead.load(Ordering::SeqCst) {
                    continue;
                }
                if let Some(h) = p.lock().queue.peek() {
                    let k = order_key(p.attrs.queueing, h);
                    if best.is_none_or(|(_, bk, _)| k > bk) {
                        best = Some((i, k, h.priority));
                    }
                }
            }
            let Some((i, _, priority)) = best else { break };
            let (name, port) = (st.members[i].0, Arc::clone(&st.members[i].1));
            let Some(wi) = choose_receiver(port.attrs.dispatch, &st.waiting, priority) else { break };
            let w = st.waiting[wi];
            if st.receivers.get(w.id).and_then(Option::as_ref).is_none() {
                st.waiting.remove(wi);
                continue;
            }
            // Still the head: only the group's receivers take from a member, under the
            // group's lock.
            let Some(e) = port.lock().queue.pop() else { break };
            st.waiting.remove(wi);
            let handoff = port.attrs.handoff != Handoff::Off;
            let polling = st.poller == Some(w.id);
            let Some(r) = st.receivers.get_mut(w.id).and_then(Option::as_mut) else { break };
            r.assigned = Some((name, port, e));
            if w.id == me {
                continue;
            }
            if handoff {
                let want = r.normal(Some(e.priority));
                if (r.doubt || r.belief != want) && prio::hand_off(r.tid, e.priority) {
                    r.now_at(Some(e.priority));
                    if polling {
                        // Set under a wait whose priority senders may still rely on: no
                        // longer, and it sets itself again when it takes this message.
                        r.doubt = true;
                        for (_, p) in &st.members {
                            p.status.word(W_POLLER_AT).store(0, Ordering::SeqCst);
                        }
                    }
                }
            }
            if polling {
                self.kick(st);
            } else if let Some(r) = st.receivers.get(w.id).and_then(Option::as_ref) {
                r.word.fetch_add(1, Ordering::SeqCst);
                sys::wake_private(&r.word);
            }
        }
    }

    /// Wakes the first waiting receiver so that it takes over polling.
    fn pass_polling_on(st: &GroupState) {
        if st.poller.is_none() {
            if let Some(w) = st.waiting.first().copied() {
                if let Some(r) = st.receivers.get(w.id).and_then(Option::as_ref) {
                    r.word.fetch_add(1, Ordering::SeqCst);
                    sys::wake_private(&r.word);
                }
            }
        }
    }

    /// The poller's wait, without the group's lock: its port's main connection (read
    /// into the port's buffers as it wakes), or the set's epoll. Whether the port's
    /// queue was drained by it (nothing more to look for before choosing).
    fn wait(&self, on: Poll, timeout: Option<Duration>) -> bool {
        match (on, &self.how) {
            (Poll::Port(p), _) => p.read(Wait::Block(timeout)) == Read::Drained,
            (Poll::Set, How::Set { epoll, wake }) => {
                let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 8];
                let ts = timeout.map(|l| rustix::event::Timespec {
                    tv_sec: l.as_secs() as i64,
                    tv_nsec: i64::from(l.subsec_nanos()),
                });
                let _ = epoll::wait(epoll, &mut events[..], ts.as_ref());
                let mut b = [0u8; 8];
                let _ = rustix::io::read(wake, &mut b);
                false
            }
            (Poll::Set, How::Port) => false,
        }
    }
}

/// A thread associated with a real-time port or a real-time port set
/// (`rt_mach_port_associate`). It receives the most urgent message waiting — for a set,
/// across every member: the members' next messages are compared by priority (a FIFO
/// member's count as priority 0, as a FIFO port itself ignores priorities) and by
/// arrival among equals — with the hand-off, inheritance and dispatch of the port the
/// message came to. Only the associated thread can receive: the handle cannot leave it.
#[derive(Debug)]
pub struct Receiver {
    group: Arc<Group>,
    id: usize,
    tid: u32,
    /// The last reply went to a sender served at its own priority (see `receive`).
    yield_next: bool,
    _not_send: PhantomData<*const ()>,
}

impl Receiver {
    /// A request buffer for this port, or for any member of this set (the largest
    /// message a port may carry); the only allocation: do it once.
    pub fn request_buffer(&self) -> Request {
        Request::with_capacity(self.buffer_size())
    }

    fn buffer_size(&self) -> usize {
        if self.group.is_set() {
            return MAX_MESSAGE as usize;
        }
        self.group.lock().members.first().map_or(0, |(_, p)| p.attrs.buffer_size as usize)
    }

    /// This receiver's thread id.
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// Receives the next message by the port's (or the members') policies; returns the
    /// name of the port it came to. Hand-off and inheritance from the previous message
    /// end here: the thread goes straight to the next message's priority, or, with
    /// nothing to receive, back to its own (after the grace, unseen while it waits:
    /// see the module's documentation). `req` must be
    /// [`request_buffer`](Receiver::request_buffer)'s size.
    pub fn receive(&mut self, req: &mut Request, timeout: Option<Duration>) -> Result<Name, ReceiveError> {
        let need = self.buffer_size();
        if req.buf.len() < need {
            return Err(ReceiveError::BufferTooSmall { have: req.buf.len(), need });
        }
        prio::set_inherited(None);
        req.conn = None;
        let g = &*self.group;
        let deadline = timeout.map(|t| Instant::now() + t);
        let me = self.id;
        let mut st = g.lock();
        self.slot_mut(&mut st).releases.release_all(self.tid);
        let assoc = self.slot(&st).assoc;
        st.waiting.push(Waiting { id: me, priority: assoc });
        // Whether this receiver's own wait has just drained its port's queue.
        let mut drained = false;
        let (name, port, entry) = loop {
            if g.is_dead(&st) {
                return Err(self.leave(&mut st, ReceiveError::PortDied));
            }
            if let Some(a) = self.slot_mut(&mut st).assigned.take() {
                break a;
            }
            g.collect(&st, std::mem::take(&mut drained));
            Group::absorb(&mut st);
            g.dispatch(&mut st, me);
            if self.slot(&st).assigned.is_some() {
                continue;
            }
            for (_, p) in &st.members {
                let _ = p.status.word(W_BUSY).compare_exchange(self.tid, 0, Ordering::SeqCst, Ordering::SeqCst);
            }
            let now = Instant::now();
            let left = deadline.map(|d| d.saturating_duration_since(now));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(self.leave(&mut st, ReceiveError::TimedOut));
            }
            let grace = self.slot_mut(&mut st).grace_left(now);
            let wait = match (left, grace) {
                (Some(l), Some(g)) => Some(l.min(g)),
                (l, g) => l.or(g),
            };
            if st.poller.is_none() && Group::room(&st) {
                st.poller = Some(me);
                Group::publish(&mut st, me);
                let on = match st.members.first() {
                    Some((_, p)) if !g.is_set() => Poll::Port(Arc::clone(p)),
                    _ => Poll::Set,
                };
                drop(st);
                if std::mem::take(&mut self.yield_next) {
                    // Mach's hand-off scheduling. The sender we just answered at its own
                    // priority is runnable again and, on this CPU, waits behind us (a
                    // fixed priority does not preempt its equal). Let it run first, now
                    // that we are published as waiting at its priority: its next request
                    // then finds nothing to raise and nobody to inherit into, and our
                    // read below finds it queued instead of going to sleep and being
                    // woken (about 1.5 µs a round trip here). With nothing else of our
                    // priority runnable here, the yield returns at once.
                    sys::yield_now();
                }
                drained = g.wait(on, wait);
                st = g.lock();
                Group::absorb(&mut st);
                st.poller = None;
                Group::unpublish(&st, self.tid);
                self.slot_mut(&mut st).end_wait();
            } else {
                let word = Arc::clone(&self.slot(&st).word);
                let seen = word.load(Ordering::SeqCst);
                drop(st);
                sys::wait_private(&word, seen, Some(wait.map_or(SLICE, |w| w.min(SLICE))));
                st = g.lock();
            }
        };
        st.waiting.retain(|w| w.id != me);
        {
            let mut ps = port.lock();
            let len = entry.len as usize;
            req.buf[..len].copy_from_slice(ps.queue.body(entry.slot, entry.len));
            ps.queue.release(entry.slot);
            req.len = len;
            req.priority = entry.priority;
            req.sync = entry.sync;
            req.seq = entry.seq;
            req.replied = false;
            req.conn = port.conn(&ps, entry.conn);
            req.inherit = port.attrs.queueing == Queueing::PriorityInheritance;
        }
        // We serve now: a synchronous sender that finds no receiver waiting inherits
        // into us.
        for (_, p) in &st.members {
            p.status.word(W_BUSY).store(self.tid, Ordering::SeqCst);
        }
        Group::pass_polling_on(&st);
        let want = match port.attrs.handoff {
            Handoff::Off => None,
            Handoff::Sender | Handoff::Message => Some(entry.priority.min(MAX_PRIORITY)),
        };
        let slot = self.slot_mut(&mut st);
        slot.idle_since = None;
        slot.serve_at(want);
        // Serving at its sender's priority: the sender, woken by the reply, waits behind
        // this thread on its CPU (see the yield above).
        req.handed_off = want.is_some() && entry.sync && !slot.doubt && slot.normal(want) == slot.belief;
        drop(st);
        prio::set_inherited(if entry.sync { Some(entry.priority) } else { None });
        Ok(name)
    }

    /// Returns without a message: off the waiting list, back to its own priority.
    fn leave(&self, st: &mut GroupState, why: ReceiveError) -> ReceiveError {
        st.waiting.retain(|w| w.id != self.id);
        self.slot_mut(st).restore();
        why
    }

    fn slot<'a>(&self, st: &'a GroupState) -> &'a Slot {
        st.receivers[self.id].as_ref().expect("associated receiver has a slot")
    }

    fn slot_mut<'a>(&self, st: &'a mut GroupState) -> &'a mut Slot {
        st.receivers[self.id].as_mut().expect("associated receiver has a slot")
    }

    /// Answers a synchronous request and ends the inheritance its sender gave us.
    pub fn reply(&mut self, req: &mut Request, body: &[u8]) -> Result<(), ReplyError> {
        let g = &self.group;
        let handed_off = req.handed_off;
        send_reply(req, body, self.tid, |w, conn| {
            // It inherited into another receiver of the group: that one lets go when
            // it next receives.
            let mut st = g.lock();
            if let Some(r) = st.receivers.iter_mut().flatten().find(|r| r.tid == w) {
                r.releases.defer(conn);
            }
        })?;
        self.yield_next = handed_off;
        Ok(())
    }

    /// Breaks the association (`rt_mach_port_not_associate`) and returns the thread to
    /// its own priority.
    pub fn dissociate(self) {
        drop(self);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut st = self.group.lock();
        self.slot_mut(&mut st).releases.release_all(self.tid);
        st.waiting.retain(|w| w.id != self.id);
        if let Some(mut r) = st.receivers[self.id].take() {
            if let Some((_, port, e)) = r.assigned.take() {
                // Give an undelivered message back to its port's queue.
                let _ = port.lock().queue.commit(e.slot, e.conn, e.priority, e.seq, e.sync, e.len);
            }
            r.restore();
            for (_, p) in &st.members {
                for w in [W_POLLER, W_BUSY] {
                    let _ = p.status.word(w).compare_exchange(r.tid, 0, Ordering::SeqCst, Ordering::SeqCst);
                }
            }
        }
        Group::pass_polling_on(&st);
        if !self.group.dead.load(Ordering::SeqCst) {
            // Another receiver may have to take over polling, or the message given to us.
            self.group.kick(&st);
        }
        drop(st);
        prio::set_native(None);
        prio::set_inherited(None);
    }
}
