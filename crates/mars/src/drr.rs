//! Deficit Round Robin over storage request classes (001 §4.2–4.3, after Shreedhar and
//! Varghese).
//!
//! Each class (real-time, non-real-time, or any weighted class) has a FIFO queue of
//! requests and a **quantum in sectors** (512 bytes). Work is dispatched in rounds: when
//! the round's work queue is empty, the next is formed by visiting each class that has
//! requests once, adding its quantum to its deficit and moving requests from the head of
//! its queue while they fit in the deficit. A class found empty keeps no deficit ("its
//! quantum is not carried over to the next round"). The round's work queue is then
//! **sorted by position** (C-SCAN from the last position dispatched, so the head sweeps
//! one way) and dispatched in that order.
//!
//! - **Shares**: a class backlogged for *K* rounds gets between `K·Q − M` and `K·Q + M`
//!   sectors, where *M* is the largest request; classes share in proportion to quanta.
//! - **No starvation**: a backlogged class is served in every round.
//! - **O(1) per request**: the active classes are a list, so an empty class costs nothing;
//!   since every quantum is at least the largest request, each visit moves at least one
//!   request, so visits never exceed requests. (The position sort of a round of *k*
//!   requests adds O(log k) per request; the paper asks for it to cut seeks.)
//! - **Quanta change at run time** ([`Drr::set_quantum`]), effective from the next round.
//!
//! Pure: no clock, no I/O. The engine calls [`Drr::enqueue`] and [`Drr::dispatch`].

use std::collections::VecDeque;

/// Bytes per sector, the unit of quanta.
pub const SECTOR: u64 = 512;

/// A class's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u16);

/// One storage request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request<T> {
    /// Where on the device (bytes or sectors: only the order matters).
    pub position: u64,
    /// Size in sectors (at least 1).
    pub sectors: u32,
    /// The caller's.
    pub payload: T,
}

/// What a class has been given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Requests enqueued.
    pub enqueued: u64,
    /// Requests dispatched.
    pub dispatched: u64,
    /// Sectors dispatched.
    pub sectors: u64,
    /// Rounds in which the class was served.
    pub rounds_served: u64,
}

#[derive(Debug)]
struct Class<T> {
    name: String,
    quantum: u32,
    deficit: u64,
    /// Sectors served outside the rounds ([`Drr::charge`]) not yet paid from a quantum.
    debt: u64,
    queue: VecDeque<Request<T>>,
    active: bool,
    stats: ClassStats,
}

/// Why a request or setting was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DrrError {
    /// No class with this id.
    #[error("no class {0:?}")]
    NoClass(ClassId),
    /// A quantum below the largest request would break the O(1) bound.
    #[error("quantum {quantum} sectors is below the largest request ({max_request} sectors)")]
    QuantumTooSmall {
        /// Asked.
        quantum: u32,
        /// The scheduler's largest request.
        max_request: u32,
    },
    /// A request of zero sectors or above the largest allowed.
    #[error("request of {0} sectors (1 to the largest request)")]
    BadSize(u32),
    /// Too many classes.
    #[error("at most {0} classes")]
    TooManyClasses(usize),
}

/// The scheduler, generic over the request payload.
#[derive(Debug)]
pub struct Drr<T> {
    classes: Vec<Class<T>>,
    active: VecDeque<usize>,
    work: VecDeque<(ClassId, Request<T>)>,
    max_request: u32,
    head: u64,
    rounds: u64,
    ops: u64,
    queued: usize,
}

/// Most classes a scheduler holds.
pub const MAX_CLASSES: usize = 64;

impl<T> Drr<T> {
    /// A scheduler whose requests are at most `max_request` sectors.
    pub fn new(max_request: u32) -> Drr<T> {
        Drr {
            classes: Vec::new(),
            active: VecDeque::new(),
            work: VecDeque::new(),
            max_request: max_request.max(1),
            head: 0,
            rounds: 0,
            ops: 0,
            queued: 0,
        }
    }

    /// The largest request, in sectors.
    pub fn max_request(&self) -> u32 {
        self.max_request
    }

    /// Adds a class with its quantum (at least the largest request).
    pub fn add_class(&mut self, name: &str, quantum: u32) -> Result<ClassId, DrrError> {
        if self.classes.len() >= MAX_CLASSES {
            return Err(DrrError::TooManyClasses(MAX_CLASSES));
        }
        self.check_quantum(quantum)?;
        self.classes.push(Class {
            name: name.to_string(),
            quantum,
            deficit: 0,
            debt: 0,
            queue: VecDeque::new(),
            active: false,
            stats: ClassStats::default(),
        });
        Ok(ClassId((self.classes.len() - 1) as u16))
    }

    fn check_quantum(&self, quantum: u32) -> Result<(), DrrError> {
        if quantum < self.max_request {
            return Err(DrrError::QuantumTooSmall { quantum, max_request: self.max_request });
        }
        Ok(())
    }

    /// Changes a class's quantum; the next round formed uses it.
    pub fn set_quantum(&mut self, class: ClassId, quantum: u32) -> Result<(), DrrError> {
        self.check_quantum(quantum)?;
        self.class_mut(class)?.quantum = quantum;
        Ok(())
    }

    /// A class's quantum and name.
    pub fn class(&self, class: ClassId) -> Option<(&str, u32)> {
        self.classes.get(usize::from(class.0)).map(|c| (c.name.as_str(), c.quantum))
    }

    /// Every class: id, name, quantum, statistics.
    pub fn classes(&self) -> impl Iterator<Item = (ClassId, &str, u32, ClassStats)> {
        self.classes.iter().enumerate().map(|(i, c)| (ClassId(i as u16), c.name.as_str(), c.quantum, c.stats))
    }

    fn class_mut(&mut self, class: ClassId) -> Result<&mut Class<T>, DrrError> {
        self.classes.get_mut(usize::from(class.0)).ok_or(DrrError::NoClass(class))
    }

    /// Queues a request in its class; O(1).
    pub fn enqueue(&mut self, class: ClassId, req: Request<T>) -> Result<(), (DrrError, Request<T>)> {
        if req.sectors == 0 || req.sectors > self.max_request {
            return Err((DrrError::BadSize(req.sectors), req));
        }
        let Some(c) = self.classes.get_mut(usize::from(class.0)) else {
            return Err((DrrError::NoClass(class), req));
        };
        c.queue.push_back(req);
        c.stats.enqueued += 1;
        if !c.active {
            c.active = true;
            self.active.push_back(usize::from(class.0));
        }
        self.queued += 1;
        self.ops += 1;
        Ok(())
    }

    /// The next request to dispatch, forming a round when the last is used up.
    pub fn dispatch(&mut self) -> Option<(ClassId, Request<T>)> {
        self.next_round();
        let (class, req) = self.work.pop_front()?;
        self.head = req.position;
        self.queued -= 1;
        let c = &mut self.classes[usize::from(class.0)];
        c.stats.dispatched += 1;
        c.stats.sectors += u64::from(req.sectors);
        Some((class, req))
    }

    /// Counts `sectors` of `class` served outside the rounds — a caller that sends a
    /// request's successors together with it (a spliced download's pieces linked
    /// behind the one dispatched) — against the class's deficit, and what the deficit
    /// does not cover against its next quanta (kept while the class is empty, so a
    /// class cannot take more than its share by going idle between batches). O(1).
    pub fn charge(&mut self, class: ClassId, sectors: u32) -> Result<(), DrrError> {
        let c = self.classes.get_mut(usize::from(class.0)).ok_or(DrrError::NoClass(class))?;
        let s = u64::from(sectors);
        let from_deficit = s.min(c.deficit);
        c.deficit -= from_deficit;
        c.debt += s - from_deficit;
        c.stats.dispatched += 1;
        c.stats.sectors += s;
        Ok(())
    }

    /// The class of the request [`Drr::dispatch`] would return next (forming a round
    /// if the last is used up), without taking it: a caller whose device queue has room
    /// for some classes only can wait for the next completion instead.
    pub fn peek_class(&mut self) -> Option<ClassId> {
        self.next_round();
        self.work.front().map(|(class, _)| *class)
    }

    /// Forms rounds until one has work, if the last is used up. Without
    /// [`Drr::charge`] the first round formed has work (every quantum is at least the
    /// largest request); a class in debt is visited until its quanta have paid, one
    /// visit per quantum charged, which keeps the cost O(1) per request.
    fn next_round(&mut self) {
        while self.work.is_empty() && !self.active.is_empty() {
            self.form_round();
        }
    }

    /// Forms the next round's work queue (the paper's `sd_form_workqueue`).
    fn form_round(&mut self) {
        let visits = self.active.len();
        if visits == 0 {
            return;
        }
        self.rounds += 1;
        for _ in 0..visits {
            let Some(i) = self.active.pop_front() else { break };
            self.ops += 1;
            let c = &mut self.classes[i];
            c.deficit += u64::from(c.quantum);
            let paid = c.debt.min(c.deficit);
            c.debt -= paid;
            c.deficit -= paid;
            let mut served = false;
            while let Some(head) = c.queue.front() {
                if u64::from(head.sectors) > c.deficit {
                    break;
                }
                c.deficit -= u64::from(head.sectors);
                if let Some(req) = c.queue.pop_front() {
                    self.work.push_back((ClassId(i as u16), req));
                    self.ops += 1;
                    served = true;
                }
            }
            if served {
                c.stats.rounds_served += 1;
            }
            if c.queue.is_empty() {
                c.deficit = 0;
                c.active = false;
            } else {
                self.active.push_back(i);
            }
        }
        // C-SCAN from the head: positions at or past it ascending, then the rest.
        let head = self.head;
        self.work.make_contiguous().sort_by_key(|(_, r)| (r.position < head, r.position));
    }

    /// Requests queued or in the current round's work queue.
    pub fn len(&self) -> usize {
        self.queued
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Rounds formed so far.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// Elementary steps taken (class visits and request moves), for the O(1) bound.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// Drops every queued request whose payload matches (a closed stream's), returning
    /// them.
    pub fn remove_if(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for c in &mut self.classes {
            let mut kept = VecDeque::with_capacity(c.queue.len());
            for r in c.queue.drain(..) {
                if pred(&r.payload) {
                    out.push(r.payload);
                } else {
                    kept.push_back(r);
                }
            }
            c.queue = kept;
        }
        let mut kept = VecDeque::with_capacity(self.work.len());
        for (class, r) in self.work.drain(..) {
            if pred(&r.payload) {
                out.push(r.payload);
            } else {
                kept.push_back((class, r));
            }
        }
        self.work = kept;
        // Classes left empty stay in the active list until the next round visits them,
        // which resets them: that costs one visit, still O(1) per request.
        self.queued -= out.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(position: u64, sectors: u32) -> Request<u64> {
        Request { position, sectors, payload: position }
    }

    #[test]
    fn a_charged_class_pays_from_its_next_quanta() {
        let mut d = Drr::new(100);
        let a = d.add_class("a", 100).unwrap();
        let b = d.add_class("b", 100).unwrap();
        // `a` took 250 sectors outside the rounds: its next two visits pay for them.
        d.charge(a, 250).unwrap();
        assert_eq!(d.classes().find(|c| c.0 == a).unwrap().3.sectors, 250);
        for p in 0..4 {
            d.enqueue(a, req(p, 100)).unwrap();
            d.enqueue(b, req(100 + p, 100)).unwrap();
        }
        let mut order = Vec::new();
        while let Some((class, _)) = d.dispatch() {
            order.push(class);
        }
        // Rounds 1 and 2: only b (a pays 100 + 100); round 3: a has 50 left of its
        // quantum, under a request, so b again; then a's 150 fits one request each round.
        assert_eq!(&order[..3], &[b, b, b]);
        assert_eq!(order.iter().filter(|&&c| c == a).count(), 4);
        assert!(d.charge(ClassId(9), 1).is_err());
    }

    #[test]
    fn peek_names_the_class_dispatch_returns_without_taking_it() {
        let mut d = Drr::new(128);
        let rt = d.add_class("rt", 128).unwrap();
        let nrt = d.add_class("nrt", 128).unwrap();
        assert_eq!(d.peek_class(), None);
        d.enqueue(nrt, req(100, 128)).unwrap();
        d.enqueue(rt, req(200, 128)).unwrap();
        for _ in 0..2 {
            let class = d.peek_class().unwrap();
            assert_eq!(d.peek_class(), Some(class), "peeking twice changes nothing");
            let (got, _) = d.dispatch().unwrap();
            assert_eq!(got, class);
        }
        assert_eq!(d.peek_class(), None);
        assert_eq!(d.len(), 0);
        assert_eq!(d.rounds(), 1);
    }

    #[test]
    fn a_round_takes_a_quantum_per_class_sorted_by_position() {
        let mut d = Drr::new(128);
        let rt = d.add_class("rt", 256).unwrap();
        let nrt = d.add_class("nrt", 128).unwrap();
        for p in [900, 100, 500] {
            d.enqueue(rt, req(p, 128)).unwrap();
        }
        for p in [300, 700] {
            d.enqueue(nrt, req(p, 128)).unwrap();
        }
        // Round 1: rt's first two (900, 100) and nrt's first (300), sorted from head 0.
        let round: Vec<u64> = (0..3).map(|_| d.dispatch().unwrap().1.position).collect();
        assert_eq!(round, vec![100, 300, 900]);
        // Round 2: rt 500, nrt 700; C-SCAN from 900 wraps to the start.
        let round: Vec<u64> = (0..2).map(|_| d.dispatch().unwrap().1.position).collect();
        assert_eq!(round, vec![500, 700]);
        assert!(d.dispatch().is_none());
        assert_eq!(d.rounds(), 2);
    }

    #[test]
    fn quanta_are_checked_and_changed_at_run_time() {
        let mut d: Drr<u64> = Drr::new(64);
        assert!(matches!(d.add_class("x", 63), Err(DrrError::QuantumTooSmall { .. })));
        let a = d.add_class("a", 64).unwrap();
        let b = d.add_class("b", 64).unwrap();
        d.set_quantum(a, 192).unwrap();
        assert!(d.set_quantum(ClassId(9), 100).is_err());
        for i in 0..6 {
            d.enqueue(a, req(i, 64)).unwrap();
            d.enqueue(b, req(100 + i, 64)).unwrap();
        }
        let mut got = [0, 0];
        for _ in 0..4 {
            let (c, _) = d.dispatch().unwrap();
            got[usize::from(c.0)] += 1;
        }
        assert_eq!(got, [3, 1], "a's quantum is three times b's");
        assert!(d.enqueue(a, req(0, 65)).is_err());
        assert!(d.enqueue(a, req(0, 0)).is_err());
    }

    #[test]
    fn an_empty_class_keeps_no_deficit() {
        let mut d = Drr::new(100);
        let a = d.add_class("a", 150).unwrap();
        d.enqueue(a, req(1, 100)).unwrap();
        assert_eq!(d.dispatch().unwrap().1.position, 1); // deficit 50 left, queue empty → 0
        d.enqueue(a, req(2, 100)).unwrap();
        d.enqueue(a, req(3, 100)).unwrap();
        d.dispatch().unwrap();
        // With a carried deficit of 50, both would have fitted in one round (200).
        assert_eq!(d.rounds(), 2);
        assert!(d.dispatch().is_some());
        assert_eq!(d.rounds(), 3);
    }

    #[test]
    fn removing_a_streams_requests() {
        let mut d = Drr::new(8);
        let a = d.add_class("a", 8).unwrap();
        for p in 0..10 {
            d.enqueue(a, req(p, 8)).unwrap();
        }
        d.dispatch().unwrap();
        let gone = d.remove_if(|&p| p % 2 == 1);
        assert_eq!(gone.len(), 5);
        assert_eq!(d.len(), 4);
        let rest: Vec<u64> = std::iter::from_fn(|| d.dispatch().map(|(_, r)| r.payload)).collect();
        assert_eq!(rest, vec![2, 4, 6, 8]);
    }
}
