//! Real-time port sets: receivers associated with a set take messages from every member
//! port, the most urgent first, with the member port's hand-off, inheritance and
//! dispatch.
//!
//! A set is one `epoll` over its members' own `epoll`s (as the nucleus's port sets are)
//! plus an `eventfd` to wake the receiver polling it. Each member keeps its connections
//! and its queue of preallocated buffers; a set receiver drains every member into its
//! own queue, compares the members' next messages with [`order_key`] (each under its own
//! port's queueing), and takes the greatest. A port in a set has no receivers of its own,
//! so only the set's receivers ever take from its queue (under the set's lock, then the
//! port's: always in that order).
//!
//! The set's receivers publish themselves on every member's status page as a port's
//! receivers do on their port's (the poller; the one that took a message most recently,
//! from whichever member), so a sender on any member raises the polling set receiver
//! before waking it, and a synchronous sender on a priority-inheritance member that
//! finds no receiver waiting inherits into the set receiver busy serving the set.

use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ictus_ipc::Name;
use ictus_rt::thread::Policy;
use rustix::event::epoll;

use crate::attr::{Handoff, Priority, MAX_MESSAGE, MAX_PRIORITY};
use crate::error::{AssociateError, MemberError, ReceiveError, ReplyError};
use crate::port::{send_reply, PortInner, Releases, Request, W_BUSY, W_POLLER};
use crate::prio;
use crate::queue::{choose_receiver, order_key, Entry, Waiting};
use crate::sys;
use crate::MAX_RECEIVERS;

/// Most ports one real-time port set may hold.
pub const MAX_MEMBERS: usize = 64;

const TOKEN_WAKE: u64 = u64::MAX;
const TOKEN_MEMBER: u64 = 0;

/// A message given to a set receiver but not yet taken by it.
type Assigned = (Name, Arc<PortInner>, Entry);

#[derive(Debug)]
struct SetSlot {
    tid: u32,
    base: Policy,
    assoc: Priority,
    word: Arc<AtomicU32>,
    assigned: Option<Assigned>,
    /// The priority a hand-off gave this thread, if it is not at its base.
    applied: Option<Priority>,
    /// While it polled, its tid was on every member's status page: senders of several
    /// ports may have raised it, so its priority is set again when it next takes a
    /// message (or waits).
    unknown: bool,
    /// Connection pages whose PI word names this receiver but whose request another
    /// receiver answered: released when this one next receives.
    releases: Releases,
}

#[derive(Debug)]
struct SetState {
    members: Vec<(Name, Arc<PortInner>)>,
    receivers: Vec<Option<SetSlot>>,
    waiting: Vec<Waiting>,
    poller: Option<usize>,
}

/// The shared state of a real-time port set.
#[derive(Debug)]
pub(crate) struct SetInner {
    epoll: OwnedFd,
    wake: OwnedFd,
    state: Mutex<SetState>,
    dead: AtomicBool,
}

impl SetInner {
    pub(crate) fn new() -> std::io::Result<Arc<SetInner>> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let wake =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        epoll::add(&epoll, &wake, epoll::EventData::new_u64(TOKEN_WAKE), epoll::EventFlags::IN)?;
        Ok(Arc::new(SetInner {
            epoll,
            wake,
            state: Mutex::new(SetState {
                members: Vec::with_capacity(MAX_MEMBERS),
                receivers: Vec::new(),
                waiting: Vec::with_capacity(MAX_RECEIVERS),
                poller: None,
            }),
            dead: AtomicBool::new(false),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, SetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the receiver polling the set, so that it looks again.
    fn kick(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// The member ports' names.
    pub(crate) fn member_names(&self) -> Vec<Name> {
        self.lock().members.iter().map(|(n, _)| *n).collect()
    }

    /// Whether `port` is a member.
    pub(crate) fn contains(&self, port: &Arc<PortInner>) -> bool {
        self.lock().members.iter().any(|(_, p)| Arc::ptr_eq(p, port))
    }

    /// Number of receivers associated.
    pub(crate) fn receiver_count(&self) -> usize {
        self.lock().receivers.iter().flatten().count()
    }

    /// Adds a port that is in no set and has no receivers of its own.
    pub(crate) fn add(&self, name: Name, port: &Arc<PortInner>) -> Result<(), MemberError> {
        let mut st = self.lock();
        if self.dead.load(Ordering::SeqCst) {
            return Err(MemberError::InvalidRight(name));
        }
        if st.members.len() >= MAX_MEMBERS {
            return Err(MemberError::Full);
        }
        {
            let mut ps = port.lock();
            if PortInner::has_receivers(&ps) {
                return Err(MemberError::Associated(name));
            }
            epoll::add(&self.epoll, &port.epoll, epoll::EventData::new_u64(TOKEN_MEMBER), epoll::EventFlags::IN)
                .map_err(std::io::Error::from)?;
            ps.in_set = true;
        }
        st.members.push((name, Arc::clone(port)));
        drop(st);
        self.kick();
        Ok(())
    }

    /// Takes a port out of the set: messages given to a set receiver but not yet taken
    /// go back to the port's queue, and the set's receivers leave its status page.
    pub(crate) fn remove(&self, port: &Arc<PortInner>) -> bool {
        let mut st = self.lock();
        let Some(i) = st.members.iter().position(|(_, p)| Arc::ptr_eq(p, port)) else { return false };
        let (_, port) = st.members.remove(i);
        let _ = epoll::delete(&self.epoll, &port.epoll);
        {
            let mut ps = port.lock();
            for r in st.receivers.iter_mut().flatten() {
                if r.assigned.as_ref().is_some_and(|(_, p, _)| Arc::ptr_eq(p, &port)) {
                    if let Some((_, _, e)) = r.assigned.take() {
                        let _ = ps.queue.commit(e.slot, e.conn, e.priority, e.seq, e.sync, e.len);
                    }
                }
            }
            ps.in_set = false;
        }
        // The port has no receivers of its own: nobody of it polls or serves now.
        port.status.word(W_POLLER).store(0, Ordering::SeqCst);
        port.status.word(W_BUSY).store(0, Ordering::SeqCst);
        drop(st);
        self.kick();
        true
    }

    /// Destroys the set: its receivers get `PortDied`, its members leave it (they live on).
    pub(crate) fn destroy(&self) {
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        let members: Vec<Arc<PortInner>> = self.lock().members.iter().map(|(_, p)| Arc::clone(p)).collect();
        for p in &members {
            self.remove(p);
        }
        let st = self.lock();
        for r in st.receivers.iter().flatten() {
            r.word.fetch_add(1, Ordering::SeqCst);
            sys::wake_private(&r.word);
        }
        drop(st);
        self.kick();
    }

    /// Associates the calling thread with the set.
    pub(crate) fn associate(self: &Arc<Self>, priority: Option<Priority>) -> Result<SetReceiver, AssociateError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(AssociateError::PortDied);
        }
        if prio::native_cached().is_some() {
            return Err(AssociateError::AlreadyAssociated);
        }
        let tid = sys::gettid();
        if let Some(p) = priority {
            // DISP_WORK's `priop`; refused without privilege (warned once).
            let _ = prio::hand_off(tid, p);
        }
        let base = sys::thread_policy(0).unwrap_or(Policy::DEFAULT);
        let assoc = prio::priority_of(base);
        let mut st = self.lock();
        if st.receivers.iter().flatten().count() >= MAX_RECEIVERS {
            return Err(AssociateError::AlreadyAssociated);
        }
        let slot = SetSlot {
            tid,
            base,
            assoc,
            word: Arc::new(AtomicU32::new(0)),
            assigned: None,
            applied: None,
            unknown: false,
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
        Ok(SetReceiver { set: Arc::clone(self), id, tid, _not_send: PhantomData })
    }

    /// Reads what each live member has ready into its queue (accepting connections too).
    fn collect(&self, st: &SetState) {
        for (_, p) in &st.members {
            if p.dead.load(Ordering::SeqCst) {
                // Destroyed while a member (its epoll stays readable): stop watching it.
                let _ = epoll::delete(&self.epoll, &p.epoll);
                continue;
            }
            let mut ps = p.lock();
            p.poll_ready(&mut ps, Some(Duration::ZERO));
            p.drain(&mut ps);
        }
    }

    /// Gives the most urgent waiting messages across the members to waiting receivers,
    /// raising each (under its port's hand-off) before waking it.
    fn dispatch(&self, st: &mut SetState, me: usize) {
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
            // Still the head: only the set's receivers take from a member, under the set's lock.
            let Some(e) = port.lock().queue.pop() else { break };
            st.waiting.remove(wi);
            let handoff = port.attrs.handoff != Handoff::Off;
            let poller = st.poller;
            let Some(r) = st.receivers.get_mut(w.id).and_then(Option::as_mut) else { break };
            r.assigned = Some((name, port, e));
            if w.id != me {
                if handoff && (r.applied != Some(e.priority) || r.unknown) && prio::hand_off(r.tid, e.priority) {
                    r.applied = Some(e.priority);
                    r.unknown = false;
                }
                if poller == Some(w.id) {
                    self.kick();
                } else {
                    r.word.fetch_add(1, Ordering::SeqCst);
                    sys::wake_private(&r.word);
                }
            }
        }
    }

    /// Wakes the first waiting receiver so that it takes over polling.
    fn pass_polling_on(st: &SetState) {
        if st.poller.is_none() {
            if let Some(w) = st.waiting.first().copied() {
                if let Some(r) = st.receivers.get(w.id).and_then(Option::as_ref) {
                    r.word.fetch_add(1, Ordering::SeqCst);
                    sys::wake_private(&r.word);
                }
            }
        }
    }
}

/// A thread associated with a real-time port set (`rt_mach_port_associate` on a set).
/// It receives from every member port, the most urgent message first: the members' next
/// messages are compared by priority — a FIFO member's messages count as priority 0, as
/// a FIFO port itself ignores priorities — and by arrival among equals. Hand-off,
/// inheritance and dispatch are those of the port the message came to. Only the
/// associated thread can receive: the handle cannot leave it.
#[derive(Debug)]
pub struct SetReceiver {
    set: Arc<SetInner>,
    id: usize,
    tid: u32,
    _not_send: PhantomData<*const ()>,
}

impl SetReceiver {
    /// A request buffer for any member (the largest message a port may carry; the only
    /// allocation: do it once).
    pub fn request_buffer(&self) -> Request {
        Request {
            buf: vec![0; MAX_MESSAGE as usize],
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

    /// Receives the next message from the set's members; returns the name of the member
    /// port it came to. Hand-off and inheritance from the previous message end here.
    /// `req` must be [`MAX_MESSAGE`] bytes ([`SetReceiver::request_buffer`]).
    pub fn receive(&mut self, req: &mut Request, timeout: Option<Duration>) -> Result<Name, ReceiveError> {
        let need = MAX_MESSAGE as usize;
        if req.buf.len() < need {
            return Err(ReceiveError::BufferTooSmall { have: req.buf.len(), need });
        }
        prio::set_inherited(None);
        req.conn = None;
        let set = &*self.set;
        let deadline = timeout.map(|t| Instant::now() + t);
        let me = self.id;
        let mut st = set.lock();
        self.release_pending(&mut st);
        let assoc = self.slot(&st).assoc;
        st.waiting.push(Waiting { id: me, priority: assoc });
        let (name, port, entry) = loop {
            if set.dead.load(Ordering::SeqCst) {
                st.waiting.retain(|w| w.id != me);
                return Err(ReceiveError::PortDied);
            }
            if let Some(a) = self.slot_mut(&mut st).assigned.take() {
                break a;
            }
            set.collect(&st);
            set.dispatch(&mut st, me);
            if self.slot(&st).assigned.is_some() {
                continue;
            }
            for (_, p) in &st.members {
                let _ = p.status.word(W_BUSY).compare_exchange(self.tid, 0, Ordering::SeqCst, Ordering::SeqCst);
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
            // Back to our own priority before we say we are the one waiting.
            let slot = self.slot_mut(&mut st);
            if slot.applied.is_some() || slot.unknown {
                prio::restore(slot.tid, slot.base);
                slot.applied = None;
                slot.unknown = false;
            }
            let room = st.members.iter().all(|(_, p)| p.lock().queue.free() > 0);
            if st.poller.is_none() && room {
                st.poller = Some(me);
                for (_, p) in &st.members {
                    p.status.word(W_POLLER).store(self.tid, Ordering::SeqCst);
                }
                drop(st);
                let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 8];
                let ts = left.map(|l| rustix::event::Timespec {
                    tv_sec: l.as_secs() as i64,
                    tv_nsec: i64::from(l.subsec_nanos()),
                });
                let _ = epoll::wait(&set.epoll, &mut events[..], ts.as_ref());
                st = set.lock();
                st.poller = None;
                for (_, p) in &st.members {
                    let _ = p.status.word(W_POLLER).compare_exchange(self.tid, 0, Ordering::SeqCst, Ordering::SeqCst);
                }
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&set.wake, &mut b);
                // A sender of any member may have raised us meanwhile.
                self.slot_mut(&mut st).unknown = true;
            } else {
                let word = Arc::clone(&self.slot(&st).word);
                let seen = word.load(Ordering::SeqCst);
                drop(st);
                sys::wait_private(&word, seen, left.or(Some(Duration::from_millis(50))));
                st = set.lock();
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
            req.inherit = port.attrs.queueing == crate::attr::Queueing::PriorityInheritance;
        }
        // We serve the set now: a synchronous sender on any member that finds no
        // receiver waiting inherits into us.
        for (_, p) in &st.members {
            p.status.word(W_BUSY).store(self.tid, Ordering::SeqCst);
        }
        SetInner::pass_polling_on(&st);
        let want = match port.attrs.handoff {
            Handoff::Off => None,
            Handoff::Sender | Handoff::Message => Some(entry.priority.min(MAX_PRIORITY)),
        };
        let slot = self.slot_mut(&mut st);
        match want {
            Some(p) => {
                if (slot.applied != Some(p) || slot.unknown) && prio::hand_off(slot.tid, p) {
                    slot.applied = Some(p);
                    slot.unknown = false;
                }
            }
            None => {
                if slot.applied.is_some() || slot.unknown {
                    prio::restore(slot.tid, slot.base);
                    slot.applied = None;
                    slot.unknown = false;
                }
            }
        }
        drop(st);
        prio::set_inherited(if entry.sync { Some(entry.priority) } else { None });
        Ok(name)
    }

    fn slot<'a>(&self, st: &'a SetState) -> &'a SetSlot {
        st.receivers[self.id].as_ref().expect("associated receiver has a slot")
    }

    fn slot_mut<'a>(&self, st: &'a mut SetState) -> &'a mut SetSlot {
        st.receivers[self.id].as_mut().expect("associated receiver has a slot")
    }

    fn release_pending(&self, st: &mut SetState) {
        self.slot_mut(st).releases.release_all(self.tid);
    }

    /// Answers a synchronous request and ends the inheritance its sender gave us.
    pub fn reply(&mut self, req: &mut Request, body: &[u8]) -> Result<(), ReplyError> {
        let set = &self.set;
        send_reply(req, body, self.tid, |w, page| {
            // It inherited into another receiver of the set: that one lets go when it
            // next receives.
            let mut st = set.lock();
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

impl Drop for SetReceiver {
    fn drop(&mut self) {
        let mut st = self.set.lock();
        self.release_pending(&mut st);
        st.waiting.retain(|w| w.id != self.id);
        if let Some(r) = st.receivers[self.id].take() {
            if let Some((_, port, e)) = r.assigned {
                // Give an undelivered message back to its port's queue.
                let _ = port.lock().queue.commit(e.slot, e.conn, e.priority, e.seq, e.sync, e.len);
            }
            if r.applied.is_some() || r.unknown {
                prio::restore(r.tid, r.base);
            }
            for (_, p) in &st.members {
                for w in [W_POLLER, W_BUSY] {
                    let _ = p.status.word(w).compare_exchange(r.tid, 0, Ordering::SeqCst, Ordering::SeqCst);
                }
            }
        }
        SetInner::pass_polling_on(&st);
        drop(st);
        if !self.set.dead.load(Ordering::SeqCst) {
            // Another receiver may have to take over polling, or the messages given to us.
            self.set.kick();
        }
        prio::set_native(None);
        prio::set_inherited(None);
    }
}
