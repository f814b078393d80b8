//! The single-producer single-consumer ring protocol, over any memory that offers
//! the ring's two counters and its words as atomics ([`RingMem`]): shared memory in a
//! channel, loom's atomics in the model check.
//!
//! The producer owns `head`, the consumer `tail`; neither takes a lock. A record is
//! *reserved* (room found, a pad placed before it if it would cross the end of the
//! ring), written in place, then *committed*: its header is written and the head is
//! published with a Release store. The consumer loads the head with Acquire, reads
//! the header words once, checks them ([`crate::record::decode`]), hands the record
//! out, and on *release* publishes the new tail with a Release store, which the
//! producer's Acquire load pairs with before it reuses the bytes.
//!
//! Each side keeps its own counter privately and only ever *writes* it to shared
//! memory: what it reads of the other side's counter is checked
//! ([`crate::record::check_head`], [`crate::record::check_tail`]) before use.

use crate::record::{self, Corrupt, Frame, Kind, RingGeometry, HEADER_LEN};
use crate::sync::{AtomicU64, Ordering};

/// The memory of one ring.
pub trait RingMem {
    /// The producer's counter.
    fn head(&self) -> &AtomicU64;
    /// The consumer's counter.
    fn tail(&self) -> &AtomicU64;
    /// Word `i` of the ring's bytes, `i < cap / 8`.
    fn word(&self, i: usize) -> &AtomicU64;
}

/// Why room could not be reserved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveError {
    /// The record is larger than the ring carries in one piece.
    TooLarge {
        /// Payload bytes asked for.
        len: u64,
        /// The largest payload.
        max: u64,
    },
    /// Not enough free room now; the consumer has not caught up.
    Full,
    /// The consumer's counter is nonsense.
    Corrupt(Corrupt),
}

impl From<Corrupt> for ReserveError {
    fn from(c: Corrupt) -> ReserveError {
        ReserveError::Corrupt(c)
    }
}

impl core::fmt::Display for ReserveError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ReserveError::TooLarge { len, max } => {
                write!(f, "a record of {len} bytes exceeds the ring's largest payload of {max} bytes")
            }
            ReserveError::Full => f.write_str("the ring is full"),
            ReserveError::Corrupt(c) => core::fmt::Display::fmt(c, f),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ReserveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // `#[error(transparent)]` before: the corruption is the error itself.
            ReserveError::Corrupt(c) => c.source(),
            _ => None,
        }
    }
}

/// Room reserved for one record.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation is only sent by committing it"]
pub struct Reservation {
    pad: u64,
    at: u64,
    len: u32,
}

impl Reservation {
    /// Byte offset of the payload in the ring.
    pub fn payload_at(&self) -> u64 {
        self.at + HEADER_LEN
    }

    /// Payload bytes reserved.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether no payload bytes were reserved.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shrink the payload to `len` bytes (never grow it).
    pub fn truncate(&mut self, len: u32) {
        self.len = self.len.min(len);
    }
}

/// The producer side of a ring.
#[derive(Debug)]
pub struct Producer<M> {
    mem: M,
    ring: RingGeometry,
    head: u64,
    tail_seen: u64,
    seq: u32,
}

impl<M: RingMem> Producer<M> {
    /// The producer of a fresh ring (both counters zero).
    pub fn new(mem: M, ring: RingGeometry) -> Self {
        Producer { mem, ring, head: 0, tail_seen: 0, seq: 0 }
    }

    /// The ring's memory.
    pub fn mem(&self) -> &M {
        &self.mem
    }

    /// The ring's geometry.
    pub fn geometry(&self) -> RingGeometry {
        self.ring
    }

    /// Free bytes, reading the consumer's counter.
    pub fn free(&mut self) -> Result<u64, Corrupt> {
        // SYNC POINT: pairs with the consumer's Release store of the tail: the bytes
        // it released are no longer read when we write them again.
        let tail = self.mem.tail().load(Ordering::Acquire);
        let free = record::check_tail(self.head, tail, self.tail_seen, self.ring)?;
        self.tail_seen = tail;
        Ok(free)
    }

    /// The bytes a record of `len` payload bytes takes at the head: its own length, and
    /// the pad before it when it would not fit before the end of the ring.
    fn want(&self, len: u32) -> (u64, u64) {
        let need = record::record_len(u64::from(len));
        let to_end = self.ring.cap - self.head % self.ring.cap;
        let pad = if to_end < need { to_end } else { 0 };
        (pad, pad + need)
    }

    /// Whether a record of `len` payload bytes fits now, pad included: what a producer
    /// waiting for room waits for ([`Producer::reserve`] succeeds when this is true).
    /// Comparing the free bytes with the record's length alone is wrong at the end of
    /// the ring, where the record also needs its pad: a waiter would see room, fail to
    /// reserve, and look again without sleeping until the consumer caught up.
    pub fn has_room(&mut self, len: u32) -> Result<bool, Corrupt> {
        let (_, want) = self.want(len);
        Ok(self.free()? >= want)
    }

    /// Reserve room for a record of `len` payload bytes.
    pub fn reserve(&mut self, len: u32) -> Result<Reservation, ReserveError> {
        let need = record::record_len(u64::from(len));
        if need > self.ring.max_record() {
            return Err(ReserveError::TooLarge { len: u64::from(len), max: self.ring.max_payload() });
        }
        let (pad, want) = self.want(len);
        let free = self.ring.cap - (self.head - self.tail_seen);
        if free < want && self.free()? < want {
            return Err(ReserveError::Full);
        }
        Ok(Reservation { pad, at: (self.head + pad) % self.ring.cap, len })
    }

    fn write_header(&self, at: u64, raw: [u64; 2]) {
        let i = (at / 8) as usize;
        self.mem.word(i).store(raw[0], Ordering::Relaxed);
        self.mem.word(i + 1).store(raw[1], Ordering::Relaxed);
    }

    /// Write word `index` of the payload of a reservation (for pool references and
    /// the model check; payload bytes are otherwise written through the mapping).
    pub fn write_payload_word(&self, r: &Reservation, index: usize, value: u64) {
        debug_assert!((index as u64 + 1) * 8 <= record::record_len(u64::from(r.len)) - HEADER_LEN);
        self.mem.word((r.payload_at() / 8) as usize + index).store(value, Ordering::Relaxed);
    }

    /// Commit a reservation whose payload has been written: write the pad (if any) and
    /// the header, then publish the head.
    pub fn commit(&mut self, r: Reservation, kind: Kind, tag: u32) {
        if r.pad != 0 {
            let at = self.head % self.ring.cap;
            self.write_header(at, record::encode(Kind::Pad, (r.pad - HEADER_LEN) as u32, 0, self.seq));
            self.seq = self.seq.wrapping_add(1);
        }
        self.write_header(r.at, record::encode(kind, r.len, tag, self.seq));
        self.seq = self.seq.wrapping_add(1);
        self.head += r.pad + record::record_len(u64::from(r.len));
        // SYNC POINT: pairs with the consumer's Acquire load of the head: the payload
        // and header written above are visible before the head that covers them.
        self.mem.head().store(self.head, Ordering::Release);
    }

    /// The head as published.
    pub fn head(&self) -> u64 {
        self.head
    }
}

/// A record found by [`Consumer::peek`]: read it, then [`Consumer::release`] it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peeked {
    /// The checked header.
    pub frame: Frame,
    /// Byte offset of the header in the ring.
    pub at: u64,
    raw: [u64; 2],
}

impl Peeked {
    /// Byte offset of the payload in the ring.
    pub fn payload_at(&self) -> u64 {
        self.at + HEADER_LEN
    }
}

/// The consumer side of a ring.
#[derive(Debug)]
pub struct Consumer<M> {
    mem: M,
    ring: RingGeometry,
    tail: u64,
    head_seen: u64,
    seq: u32,
}

impl<M: RingMem> Consumer<M> {
    /// The consumer of a fresh ring (both counters zero).
    pub fn new(mem: M, ring: RingGeometry) -> Self {
        Consumer { mem, ring, tail: 0, head_seen: 0, seq: 0 }
    }

    /// The ring's memory.
    pub fn mem(&self) -> &M {
        &self.mem
    }

    /// Whether the producer has published anything not yet consumed: one load, no
    /// checks (a wild head reads as "ready", and [`Consumer::peek`] then finds out).
    pub fn ready(&self) -> bool {
        self.head_seen != self.tail || self.mem.head().load(Ordering::Acquire) != self.tail
    }

    /// The next record, checked, or `None` if the ring is empty.
    pub fn peek(&mut self) -> Result<Option<Peeked>, Corrupt> {
        loop {
            if self.head_seen == self.tail {
                // SYNC POINT: pairs with the producer's Release store of the head.
                let head = self.mem.head().load(Ordering::Acquire);
                record::check_head(self.tail, head, self.ring)?;
                self.head_seen = head;
                if head == self.tail {
                    return Ok(None);
                }
            }
            let committed = record::check_head(self.tail, self.head_seen, self.ring)?;
            let at = self.tail % self.ring.cap;
            let i = (at / 8) as usize;
            let raw = [self.mem.word(i).load(Ordering::Relaxed), self.mem.word(i + 1).load(Ordering::Relaxed)];
            let frame = record::decode(raw, self.tail, committed, self.seq, self.ring)?;
            if frame.kind == Kind::Pad {
                self.tail += frame.advance;
                self.seq = self.seq.wrapping_add(1);
                continue;
            }
            return Ok(Some(Peeked { frame, at, raw }));
        }
    }

    /// Word `index` of a peeked record's payload, read once.
    pub fn payload_word(&self, p: &Peeked, index: usize) -> u64 {
        debug_assert!((index as u64 + 1) * 8 <= p.frame.advance - HEADER_LEN);
        self.mem.word((p.payload_at() / 8) as usize + index).load(Ordering::Relaxed)
    }

    /// Consume a peeked record. With `verify`, its header is read again first and a
    /// change since [`Consumer::peek`] (the producer wrote after committing) is an error.
    pub fn release(&mut self, p: Peeked, verify: bool) -> Result<(), Corrupt> {
        debug_assert_eq!(p.at, self.tail % self.ring.cap);
        if verify {
            let i = (p.at / 8) as usize;
            let now = [self.mem.word(i).load(Ordering::Relaxed), self.mem.word(i + 1).load(Ordering::Relaxed)];
            if now != p.raw {
                return Err(Corrupt::Rewritten { pos: p.at });
            }
        }
        self.tail += p.frame.advance;
        self.seq = self.seq.wrapping_add(1);
        // SYNC POINT: pairs with the producer's Acquire load of the tail: we are done
        // reading these bytes before it may write them again.
        self.mem.tail().store(self.tail, Ordering::Release);
        Ok(())
    }

    /// The consumer's counter.
    pub fn tail(&self) -> u64 {
        self.tail
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::record::Corrupt;
    use std::vec::Vec;

    #[derive(Debug)]
    struct Local {
        head: AtomicU64,
        tail: AtomicU64,
        words: Vec<AtomicU64>,
    }

    impl RingMem for &Local {
        fn head(&self) -> &AtomicU64 {
            &self.head
        }
        fn tail(&self) -> &AtomicU64 {
            &self.tail
        }
        fn word(&self, i: usize) -> &AtomicU64 {
            &self.words[i]
        }
    }

    fn local(cap: u64) -> Local {
        Local {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            words: (0..cap / 8).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[test]
    fn records_go_round_and_round() {
        let ring = RingGeometry::new(256).expect("ring");
        let mem = local(256);
        let mut p = Producer::new(&mem, ring);
        let mut c = Consumer::new(&mem, ring);
        for n in 0..200u32 {
            let len = (n * 7) % 100;
            let r = p.reserve(len).expect("room");
            if len >= 8 {
                p.write_payload_word(&r, 0, u64::from(n));
            }
            p.commit(r, Kind::Inline, n);
            let got = c.peek().expect("valid").expect("a record");
            assert_eq!((got.frame.tag, got.frame.len), (n, len));
            if len >= 8 {
                assert_eq!(c.payload_word(&got, 0), u64::from(n));
            }
            c.release(got, true).expect("unchanged");
            assert_eq!(c.peek(), Ok(None));
        }
    }

    #[test]
    fn a_full_ring_says_so_and_too_large_is_refused() {
        let ring = RingGeometry::new(256).expect("ring");
        let mem = local(256);
        let mut p = Producer::new(&mem, ring);
        assert!(matches!(p.reserve(200), Err(ReserveError::TooLarge { .. })));
        for _ in 0..4 {
            let r = p.reserve(48).expect("room");
            p.commit(r, Kind::Inline, 0);
        }
        assert_eq!(p.reserve(0), Err(ReserveError::Full));
    }

    /// `has_room` is exactly "`reserve` would succeed", at every head position and
    /// fill level, including where a record needs a pad before the end of the ring
    /// (there, free bytes ≥ the record's length is not enough).
    #[test]
    fn has_room_agrees_with_reserve_across_the_wrap() {
        let ring = RingGeometry::new(256).expect("ring");
        let mut padded_refusals = 0;
        for start in 0..32u32 {
            for backlog in 0..4usize {
                let mem = local(256);
                let mut p = Producer::new(&mem, ring);
                let mut c = Consumer::new(&mem, ring);
                // Move the head round to `start * 8`, then leave `backlog` records behind.
                for _ in 0..start {
                    let r = p.reserve(0).expect("room");
                    p.commit(r, Kind::Inline, 0);
                    let got = c.peek().expect("valid").expect("a record");
                    c.release(got, true).expect("unchanged");
                }
                for _ in 0..backlog {
                    match p.reserve(24) {
                        Ok(r) => p.commit(r, Kind::Inline, 0),
                        Err(_) => break,
                    }
                }
                for len in (0..=ring.max_payload() as u32).step_by(8) {
                    let free = p.free().expect("valid");
                    let room = p.has_room(len).expect("valid");
                    assert_eq!(room, p.reserve(len).is_ok(), "len {len}, start {start}, backlog {backlog}");
                    if !room && free >= record::record_len(u64::from(len)) {
                        padded_refusals += 1;
                    }
                }
            }
        }
        assert!(padded_refusals > 0, "no case needed its pad: the test proved nothing");
    }

    #[test]
    fn a_tail_from_nowhere_is_caught() {
        let ring = RingGeometry::new(256).expect("ring");
        let mem = local(256);
        let mut p = Producer::new(&mem, ring);
        for _ in 0..4 {
            let r = p.reserve(48).expect("room");
            p.commit(r, Kind::Inline, 0);
        }
        mem.tail.store(1 << 40, Ordering::Relaxed);
        assert!(matches!(p.reserve(8), Err(ReserveError::Corrupt(Corrupt::Tail { .. }))));
    }

    #[test]
    fn a_header_rewritten_after_commit_is_caught() {
        let ring = RingGeometry::new(256).expect("ring");
        let mem = local(256);
        let mut p = Producer::new(&mem, ring);
        let mut c = Consumer::new(&mem, ring);
        let r = p.reserve(8).expect("room");
        p.commit(r, Kind::Inline, 1);
        let got = c.peek().expect("valid").expect("a record");
        mem.words[0].store(200, Ordering::Relaxed);
        assert_eq!(c.release(got, true), Err(Corrupt::Rewritten { pos: 0 }));
    }
}
