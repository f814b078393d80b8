//! The wake-up protocol: one "asleep" flag per sleeper, written only by the sleeper,
//! and one doorbell per waker.
//!
//! The paper (002 §3) kept one bit in a page shared by the server and every client:
//! the server set it before blocking, and a client that posted a request while it was
//! set sent one wake-up message and *cleared* it, so many clients woke the server with
//! one message. Its footnote admits the flaw: a client that clears the bit without
//! sending the message keeps the server asleep while every other client believes it
//! was woken. Here the sleeper owns the truth:
//!
//! - the flag is written only by the sleeper (the server's is in a page the clients
//!   map read-only, sealed against writable mappings); a waker only *reads* it;
//! - the flag says whether the sleeper is asleep, how to wake it (futex or eventfd),
//!   and which sleep this is (an epoch); a waker wakes at most once per sleep, so a
//!   burst of records costs at most one wake-up per client per sleep, and usually one
//!   in all, since the first wake-up ends the sleep;
//! - the flag also says what the sleeper waits for: a sleeper that waits for *room*
//!   (the ring it produces into was full, or every pool buffer is lent) sets the
//!   [`ROOM`] bit, and a waker that only made room ([`Waker::check_room`]) wakes only
//!   such a sleep; a sleeper waiting for records is not woken by room it does not need
//!   (which cost it a context-switch pair for nothing, then a sleep again);
//! - a waker wakes by ringing *its own* doorbell: a futex word that only it (and the
//!   sleeper) can write, bumped and then woken (`FUTEX_WAKE`), or its own eventfd. The
//!   server waits on all its clients' doorbells at once (`futex_waitv`, or `epoll`
//!   over the eventfds), so what one client does to its doorbell never hides another's;
//! - the sleeper reads the doorbells, *then* announces its sleep, re-checks every
//!   ring, and sleeps only if all are still empty, on the doorbell values it read: a
//!   bell rung after it read them makes the wait return at once. Announce and publish
//!   are each followed by a SeqCst fence before the other side's word is read (the
//!   store-buffer pattern), so either the waker sees "asleep" or the sleeper sees the
//!   record; and a waker that saw "asleep" rings after the sleeper read the bell
//!   (its Acquire read of the flag orders it), so its ring ends the wait. Reading the
//!   bell after announcing would be wrong: a ring for this sleep about a record
//!   already consumed would be read, not felt, and the waker would stay silent for
//!   the next record of the same sleep (the loom model found exactly that).
//!
//! Nothing a waker writes can keep the sleeper from serving others: the worst a
//! client can do is wake the server needlessly, which costs the server a scan.

use crate::sync::{fence, AtomicU32, Ordering};

/// The word's "asleep" bit.
pub const ASLEEP: u32 = 1;
/// The word's "wake me through my eventfd, not a futex" bit.
pub const POLL: u32 = 2;
/// The word's "I wait for room too" bit: a waker that only made room (consumed
/// records of a ring the sleeper produces into, gave back a pool buffer) wakes only a
/// sleep that says so ([`Waker::check_room`]).
pub const ROOM: u32 = 4;
/// Where the epoch starts in the word (above the three bits).
const EPOCH_SHIFT: u32 = 3;

/// How to wake a sleeper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeBy {
    /// `FUTEX_WAKE` on its word.
    Futex,
    /// A write to its eventfd (it waits in `poll`/`epoll`).
    Eventfd,
}

/// The sleeper's side: announces and ends sleeps.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sleeper {
    epoch: u32,
}

impl Sleeper {
    /// A sleeper that has not slept yet.
    pub const fn new() -> Sleeper {
        Sleeper { epoch: 0 }
    }

    /// Announce a sleep in `word`, woken by eventfd if `poll`, after reading the
    /// doorbells ([`read_bell`]) or draining the eventfd. Returns the word's value.
    /// After this, check every source of work, and sleep (on the bell values read
    /// before) only if there is none; either way call [`Sleeper::end`] afterwards.
    /// The sleep waits for records, not for room: see [`Sleeper::announce_for`].
    pub fn announce(&mut self, word: &AtomicU32, poll: bool) -> u32 {
        self.announce_for(word, poll, false)
    }

    /// As [`Sleeper::announce`]; with `room`, the sleep waits for room as well (the
    /// ring this side produces into is full, or its pool is all lent), and a waker
    /// that only made room wakes it. Check for room after announcing, as for records.
    pub fn announce_for(&mut self, word: &AtomicU32, poll: bool, room: bool) -> u32 {
        self.epoch = self.epoch.wrapping_add(1) & (u32::MAX >> EPOCH_SHIFT);
        let value = self.epoch << EPOCH_SHIFT | ASLEEP | if poll { POLL } else { 0 } | if room { ROOM } else { 0 };
        word.store(value, Ordering::SeqCst);
        // SYNC POINT: store-buffer pattern with `Waker::check`: the announcement is
        // visible before we read any ring's head.
        fence(Ordering::SeqCst);
        value
    }

    /// End the sleep (or the attempt): wakers stop waking.
    pub fn end(&self, word: &AtomicU32) {
        word.store(self.epoch << EPOCH_SHIFT, Ordering::Relaxed);
    }
}

/// The waker's side: remembers which sleep it has already woken.
#[derive(Clone, Copy, Debug, Default)]
pub struct Waker {
    last: u32,
}

impl Waker {
    /// A waker that has woken nothing yet.
    pub const fn new() -> Waker {
        Waker { last: 0 }
    }

    /// Call after publishing work (the head's Release store): whether the sleeper
    /// must be woken, and how. `None` when it is awake or this waker already woke
    /// this sleep. To wake by futex, [`ring`] the doorbell, then `FUTEX_WAKE` it.
    pub fn check(&mut self, word: &AtomicU32) -> Option<WakeBy> {
        // SYNC POINT: store-buffer pattern with `Sleeper::announce`: our published
        // head is visible before we read the sleeper's word.
        fence(Ordering::SeqCst);
        // SYNC POINT: Acquire pairs with the announcement (a SeqCst store): the
        // sleeper's read of the bell happened before any ring that follows.
        let value = word.load(Ordering::Acquire);
        self.decide(value)
    }

    /// As [`Waker::check`], after making room only (records consumed from a ring the
    /// sleeper produces into, a pool buffer given back): wakes only a sleep announced
    /// as waiting for room ([`Sleeper::announce_for`]). A sleep that waits for records
    /// stays asleep, and can still be woken once by [`Waker::check`] when they come.
    pub fn check_room(&mut self, word: &AtomicU32) -> Option<WakeBy> {
        // SYNC POINT: store-buffer pattern with `Sleeper::announce_for`, as in `check`:
        // the room we made (a Release store of a tail or a release head) is visible
        // before we read the sleeper's word, so either we see its sleep or it sees
        // the room when it checks after announcing.
        fence(Ordering::SeqCst);
        // SYNC POINT: Acquire pairs with the announcement, as in `check`.
        let value = word.load(Ordering::Acquire);
        self.decide_room(value)
    }

    /// The decision of [`Waker::check_room`] for a word value already read.
    pub fn decide_room(&mut self, value: u32) -> Option<WakeBy> {
        if value & ROOM == 0 {
            return None;
        }
        self.decide(value)
    }

    /// The decision of [`Waker::check`] for a word value already read.
    pub fn decide(&mut self, value: u32) -> Option<WakeBy> {
        if value & ASLEEP == 0 || value == self.last {
            return None;
        }
        self.last = value;
        Some(if value & POLL != 0 { WakeBy::Eventfd } else { WakeBy::Futex })
    }
}

/// Ring a futex doorbell: change its value so that a sleeper that read it before
/// does not block on it (then `FUTEX_WAKE` it).
pub fn ring(bell: &AtomicU32) {
    // SYNC POINT: Release pairs with the sleeper's Acquire read of the bell: a sleeper
    // that reads the new value sees the records published before it.
    bell.fetch_add(1, Ordering::Release);
}

/// Read a doorbell, before announcing a sleep (Acquire, see [`ring`]).
pub fn read_bell(bell: &AtomicU32) -> u32 {
    bell.load(Ordering::Acquire)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn one_wake_per_sleep_per_waker() {
        let word = AtomicU32::new(0);
        let mut s = Sleeper::new();
        let (mut a, mut b) = (Waker::new(), Waker::new());
        assert_eq!(a.check(&word), None);
        s.announce(&word, false);
        assert_eq!(a.check(&word), Some(WakeBy::Futex));
        assert_eq!(a.check(&word), None);
        assert_eq!(b.check(&word), Some(WakeBy::Futex));
        s.end(&word);
        assert_eq!(b.check(&word), None);
        s.announce(&word, true);
        assert_eq!(a.check(&word), Some(WakeBy::Eventfd));
    }

    /// Room wakes only a sleep that waits for room; a sleep for records is left
    /// alone by room and still woken, once, when a record comes.
    #[test]
    fn room_wakes_only_a_sleep_for_room() {
        let word = AtomicU32::new(0);
        let mut s = Sleeper::new();
        let mut w = Waker::new();
        s.announce(&word, false);
        assert_eq!(w.check_room(&word), None, "a sleep for records is not woken by room");
        assert_eq!(w.check(&word), Some(WakeBy::Futex), "but by a record, once");
        assert_eq!(w.check(&word), None);
        s.end(&word);
        assert_eq!(w.check_room(&word), None, "awake");
        s.announce_for(&word, true, true);
        assert_eq!(w.check_room(&word), Some(WakeBy::Eventfd));
        assert_eq!(w.check_room(&word), None, "once per sleep");
        assert_eq!(w.check(&word), None, "once per sleep, whatever the reason");
        s.end(&word);
        s.announce_for(&word, false, true);
        assert_eq!(w.check(&word), Some(WakeBy::Futex), "a record wakes a sleep for room too");
        assert_eq!(w.check_room(&word), None);
        // The epoch wraps inside its bits: the flags stay what was announced.
        let mut s = Sleeper { epoch: u32::MAX >> EPOCH_SHIFT };
        let v = s.announce_for(&word, false, false);
        assert_eq!(v, ASLEEP, "epoch 0 again, no flag bit set by the carry");
    }

    /// The protocol as two state machines, explored over every interleaving
    /// (sequentially consistent, which the SeqCst fences give the flag and the
    /// ring's counters), with the real `Sleeper` and `Waker`: a producer publishes
    /// `RECORDS` records, checking the flag after each; a consumer takes what is there,
    /// and when nothing is, reads the bell, announces, re-checks, and waits while the
    /// bell holds what it read. A state where the producer is done, records remain and
    /// the consumer waits on an unchanged bell is a lost wake-up. The loom model
    /// (`tests/loom.rs`) checks the same code on weak memory.
    #[test]
    fn no_interleaving_loses_a_wake_up() {
        const RECORDS: u32 = 3;
        #[derive(Clone, Copy, Debug)]
        enum C {
            Take,
            Bell,
            Announce,
            Recheck,
            Wait,
            End,
        }
        #[derive(Clone, Copy, Debug)]
        struct St {
            published: u32,
            consumed: u32,
            /// Producer: next step is publish (even) or check (odd) of record pc / 2.
            pc: u32,
            pending_wake: bool,
            flag: u32,
            bell: u32,
            seen: u32,
            c: C,
            sleeper: Sleeper,
            waker: Waker,
        }
        fn consumer_blocked(s: &St) -> bool {
            matches!(s.c, C::Wait) && s.bell == s.seen
        }
        fn explore(s: St, states: &mut u64) {
            *states += 1;
            let producer_done = s.pc == 2 * RECORDS && !s.pending_wake;
            if s.consumed == RECORDS {
                return;
            }
            assert!(!(producer_done && consumer_blocked(&s)), "lost wake-up: {s:?}");
            // Producer step.
            if s.pc < 2 * RECORDS || s.pending_wake {
                let mut n = s;
                if n.pending_wake {
                    // FUTEX_WAKE: ends a wait whose bell changed (it did: we rang).
                    n.pending_wake = false;
                } else if n.pc % 2 == 0 {
                    n.published += 1;
                    n.pc += 1;
                } else {
                    if n.waker.decide(n.flag).is_some() {
                        n.bell += 1;
                        n.pending_wake = true;
                    }
                    n.pc += 1;
                }
                explore(n, states);
            }
            // Consumer step (a blocked consumer cannot move).
            if !consumer_blocked(&s) {
                let mut n = s;
                n.c = match s.c {
                    C::Take if n.published > n.consumed => {
                        n.consumed += 1;
                        C::Take
                    }
                    C::Take => C::Bell,
                    C::Bell => {
                        n.seen = n.bell;
                        C::Announce
                    }
                    C::Announce => {
                        let w = AtomicU32::new(n.flag);
                        n.sleeper.announce(&w, false);
                        n.flag = w.load(Ordering::Relaxed);
                        C::Recheck
                    }
                    C::Recheck if n.published > n.consumed => C::End,
                    C::Recheck => C::Wait,
                    C::Wait => C::End,
                    C::End => {
                        let w = AtomicU32::new(n.flag);
                        n.sleeper.end(&w);
                        n.flag = w.load(Ordering::Relaxed);
                        C::Take
                    }
                };
                explore(n, states);
            }
        }
        let start = St {
            published: 0,
            consumed: 0,
            pc: 0,
            pending_wake: false,
            flag: 0,
            bell: 0,
            seen: 0,
            c: C::Take,
            sleeper: Sleeper::new(),
            waker: Waker::new(),
        };
        let mut states = 0;
        explore(start, &mut states);
        assert!(states > 1000, "explored {states} states");
    }
}
