//! The record format of a ring, and its decoder for untrusted rings. No system calls,
//! no shared memory: values in, a checked [`Frame`] or a [`Corrupt`] out.
//!
//! A ring is `cap` bytes (a power of two, at least [`MIN_RING`]) addressed by two
//! free-running 64-bit byte counters: the producer's `head` and the consumer's `tail`;
//! a counter's position in the ring is `counter % cap`. Every record starts on a
//! [`ALIGN`]-byte boundary with a 16-byte header, two little words:
//!
//! ```text
//! word 0: len: u32 | kind: u8 | zero: u8 | zero: u16     (bits 0-31, 32-39, 40-47, 48-63)
//! word 1: tag: u32 | seq: u32
//! ```
//!
//! then `len` payload bytes, padded to [`ALIGN`]. A record never wraps: when the space
//! left before the end of the ring is too small, the producer first writes a *pad*
//! record that fills it exactly. `seq` counts records (pads too) from zero, so the
//! consumer can tell a stale or replayed header from the next one. A *pool* record
//! carries no data in the ring; its 16-byte payload names a slot of the channel's
//! buffer pool and the length used in it (see [`PoolRef`]).
//!
//! The consumer copies `head` and each header out of shared memory once, then checks
//! them here before it uses them, so a producer that writes nonsense is caught, never
//! obeyed: every error is a [`Corrupt`] naming what was wrong.

/// Alignment of records and length of a record header, in bytes.
pub const ALIGN: u64 = 16;
/// Length of a record header, in bytes.
pub const HEADER_LEN: u64 = 16;
/// The smallest ring, in bytes.
pub const MIN_RING: u64 = 256;
/// The largest ring, in bytes.
pub const MAX_RING: u64 = 1 << 30;
/// Length of a pool record's payload: slot, length, and eight zero bytes.
pub const POOL_REF_LEN: u32 = 16;

/// What a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Payload bytes in the ring itself.
    Inline,
    /// A reference to a slot of the buffer pool.
    Pool,
    /// Filler up to the end of the ring.
    Pad,
}

impl Kind {
    /// The wire value.
    pub const fn code(self) -> u8 {
        match self {
            Kind::Inline => 1,
            Kind::Pool => 2,
            Kind::Pad => 3,
        }
    }

    /// The kind for a wire value.
    pub const fn from_code(code: u8) -> Option<Kind> {
        match code {
            1 => Some(Kind::Inline),
            2 => Some(Kind::Pool),
            3 => Some(Kind::Pad),
            _ => None,
        }
    }
}

/// The shape of a ring, as its consumer knows it (never read from shared memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    /// Bytes in the ring: a power of two in `MIN_RING..=MAX_RING`.
    pub cap: u64,
}

impl RingGeometry {
    /// A geometry, if `cap` is a power of two in range.
    pub const fn new(cap: u64) -> Option<RingGeometry> {
        if cap.is_power_of_two() && cap >= MIN_RING && cap <= MAX_RING {
            Some(RingGeometry { cap })
        } else {
            None
        }
    }

    /// The largest record (header, payload and padding) this ring carries: half of it,
    /// so a record and the pad before it always fit once the ring is empty.
    pub const fn max_record(self) -> u64 {
        self.cap / 2
    }

    /// The largest payload of one in-line record.
    pub const fn max_payload(self) -> u64 {
        self.max_record() - HEADER_LEN
    }
}

/// The bytes a record of `len` payload bytes takes in the ring.
pub const fn record_len(len: u64) -> u64 {
    HEADER_LEN + len.div_ceil(ALIGN) * ALIGN
}

/// Encodes a header as its two words.
pub const fn encode(kind: Kind, len: u32, tag: u32, seq: u32) -> [u64; 2] {
    [len as u64 | (kind.code() as u64) << 32, tag as u64 | (seq as u64) << 32]
}

/// A checked record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// What it is.
    pub kind: Kind,
    /// Payload bytes (for a pad: the bytes it skips after its header).
    pub len: u32,
    /// The application's tag.
    pub tag: u32,
    /// Bytes to advance the tail by once the record is consumed.
    pub advance: u64,
}

/// A checked reference to a slot of the buffer pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolRef {
    /// The slot index.
    pub slot: u32,
    /// Bytes used in the slot.
    pub len: u32,
}

/// The shape of a buffer pool, as its consumer knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolGeometry {
    /// Number of slots.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_size: u32,
}

/// What was wrong with a ring. Each names the values it saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corrupt {
    /// The producer's counter is behind the consumer's or more than a ring ahead.
    Head {
        /// Head as read.
        head: u64,
        /// Our tail.
        tail: u64,
        /// Ring size.
        cap: u64,
    },
    /// The consumer's counter (read by the producer) is ahead of the head, more than a
    /// ring behind it, moved backwards, or is not aligned.
    Tail {
        /// Tail as read.
        tail: u64,
        /// Our head.
        head: u64,
        /// Ring size.
        cap: u64,
    },
    /// A counter is not a multiple of the record alignment.
    Misaligned(u64),
    /// The header's kind is not a known kind, or its reserved bits are not zero.
    BadHeader(u64),
    /// The header's sequence number is not the next one.
    Sequence {
        /// What the header said.
        found: u32,
        /// The next number.
        expected: u32,
    },
    /// The record runs past the committed bytes, past the end of the ring, or beyond
    /// the largest record.
    Overrun {
        /// Payload length claimed.
        len: u32,
        /// Ring position.
        pos: u64,
        /// Committed bytes from the tail.
        committed: u64,
        /// Bytes from the position to the end of the ring.
        to_end: u64,
        /// The largest record.
        max: u64,
    },
    /// A pad record that does not end exactly at the end of the ring.
    Pad {
        /// Length claimed.
        len: u32,
        /// Ring position.
        pos: u64,
    },
    /// A pool record whose length is not [`POOL_REF_LEN`].
    PoolRecord(u32),
    /// A pool reference to a slot that does not exist or with a length beyond it.
    PoolRef {
        /// Slot claimed.
        slot: u32,
        /// Length claimed.
        len: u32,
        /// Slots in the pool.
        slots: u32,
        /// Bytes per slot.
        slot_size: u32,
    },
    /// A pool slot referenced while the consumer still holds it from an earlier record.
    SlotHeld(u32),
    /// A pool slot returned that was not lent.
    SlotNotLent(u32),
    /// A record header changed after it was committed and read.
    Rewritten {
        /// Ring position.
        pos: u64,
    },
}

impl core::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Corrupt::Head { head, tail, cap } => {
                write!(f, "head {head} is out of range for tail {tail} in a ring of {cap} bytes")
            }
            Corrupt::Tail { tail, head, cap } => {
                write!(f, "tail {tail} is out of range for head {head} in a ring of {cap} bytes")
            }
            Corrupt::Misaligned(c) => write!(f, "counter {c} is not aligned to {ALIGN} bytes"),
            Corrupt::BadHeader(w) => write!(f, "bad record header word {w:#018x}"),
            Corrupt::Sequence { found, expected } => {
                write!(f, "record sequence number {found}, expected {expected}")
            }
            Corrupt::Overrun { len, pos, committed, to_end, max } => {
                write!(f, "record of {len} bytes at {pos} overruns (committed {committed}, to end {to_end}, max {max})")
            }
            Corrupt::Pad { len, pos } => write!(f, "pad of {len} bytes at {pos} does not end at the end of the ring"),
            Corrupt::PoolRecord(len) => write!(f, "pool record with a payload of {len} bytes"),
            Corrupt::PoolRef { slot, len, slots, slot_size } => {
                write!(f, "pool reference to slot {slot} with {len} bytes (pool of {slots} slots of {slot_size} bytes)")
            }
            Corrupt::SlotHeld(s) => write!(f, "pool slot {s} sent again while still held"),
            Corrupt::SlotNotLent(s) => write!(f, "pool slot {s} returned but not lent"),
            Corrupt::Rewritten { pos } => write!(f, "record header at {pos} was rewritten after commit"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Corrupt {}

/// Checks a head read from shared memory against our tail; returns the committed bytes.
pub fn check_head(tail: u64, head: u64, ring: RingGeometry) -> Result<u64, Corrupt> {
    if head % ALIGN != 0 {
        return Err(Corrupt::Misaligned(head));
    }
    let committed = head.wrapping_sub(tail);
    if committed > ring.cap {
        return Err(Corrupt::Head { head, tail, cap: ring.cap });
    }
    Ok(committed)
}

/// Checks a tail read from shared memory against our head and the last tail seen;
/// returns the free bytes.
pub fn check_tail(head: u64, tail: u64, last_tail: u64, ring: RingGeometry) -> Result<u64, Corrupt> {
    if tail % ALIGN != 0 {
        return Err(Corrupt::Misaligned(tail));
    }
    // The tail may only move forwards, from where it was up to the head; the producer
    // keeps `head - last_tail <= cap` itself.
    if tail.wrapping_sub(last_tail) > head.wrapping_sub(last_tail) {
        return Err(Corrupt::Tail { tail, head, cap: ring.cap });
    }
    Ok(ring.cap - head.wrapping_sub(tail))
}

/// Decodes the header `raw` found at counter `tail`, with `committed` bytes committed
/// from there (from [`check_head`]) and `seq` the next sequence number.
pub fn decode(raw: [u64; 2], tail: u64, committed: u64, seq: u32, ring: RingGeometry) -> Result<Frame, Corrupt> {
    let [w0, w1] = raw;
    let len = w0 as u32;
    let kind = Kind::from_code((w0 >> 32) as u8).ok_or(Corrupt::BadHeader(w0))?;
    if w0 >> 40 != 0 {
        return Err(Corrupt::BadHeader(w0));
    }
    let tag = w1 as u32;
    let found = (w1 >> 32) as u32;
    if found != seq {
        return Err(Corrupt::Sequence { found, expected: seq });
    }
    let pos = tail % ring.cap;
    let to_end = ring.cap - pos;
    let advance = record_len(u64::from(len));
    if kind == Kind::Pad {
        if advance != to_end || u64::from(len) + HEADER_LEN != to_end {
            return Err(Corrupt::Pad { len, pos });
        }
    } else if kind == Kind::Pool && len != POOL_REF_LEN {
        return Err(Corrupt::PoolRecord(len));
    }
    let max = if kind == Kind::Pad { ring.cap } else { ring.max_record() };
    if advance > committed || advance > to_end || advance > max {
        return Err(Corrupt::Overrun { len, pos, committed, to_end, max: ring.max_record() });
    }
    Ok(Frame { kind, len, tag, advance })
}

/// Encodes a pool reference as the first word of a pool record's payload.
pub const fn encode_pool_ref(slot: u32, len: u32) -> u64 {
    slot as u64 | (len as u64) << 32
}

/// Decodes and checks the first word of a pool record's payload.
pub fn decode_pool_ref(word: u64, pool: PoolGeometry) -> Result<PoolRef, Corrupt> {
    let slot = word as u32;
    let len = (word >> 32) as u32;
    if slot >= pool.slots || len > pool.slot_size {
        return Err(Corrupt::PoolRef { slot, len, slots: pool.slots, slot_size: pool.slot_size });
    }
    Ok(PoolRef { slot, len })
}

/// A record found by [`scan`]: its frame, where its payload starts in the ring, and
/// for a pool record the slot it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scanned {
    /// The checked header.
    pub frame: Frame,
    /// Byte offset of the payload in the ring.
    pub payload_at: u64,
    /// The pool reference of a pool record.
    pub pool: Option<PoolRef>,
}

/// Decodes every record of a ring image from `tail` to `head`, the way a consumer
/// does (pads skipped, pool slots tracked as held), stopping at the first error.
/// `words` is the ring, eight bytes a word (`cap / 8` words). This is what the fuzz
/// target and the tests drive; the live consumer makes the same calls on shared memory.
#[cfg(any(test, feature = "alloc"))]
pub fn scan(
    words: &[u64],
    tail: u64,
    head: u64,
    ring: RingGeometry,
    pool: PoolGeometry,
) -> Result<alloc::vec::Vec<Scanned>, Corrupt> {
    assert_eq!(words.len() as u64 * 8, ring.cap, "the image is one ring");
    let mut out = alloc::vec::Vec::new();
    let mut held = alloc::vec![false; pool.slots as usize];
    let mut tail = tail - tail % ALIGN;
    let mut seq = 0u32;
    let committed = check_head(tail, head, ring)?;
    let end = tail.wrapping_add(committed);
    while tail != end {
        let committed = end.wrapping_sub(tail);
        let i = (tail % ring.cap / 8) as usize;
        let frame = decode([words[i], words[i + 1]], tail, committed, seq, ring)?;
        let payload_at = tail % ring.cap + HEADER_LEN;
        let pool_ref = if frame.kind == Kind::Pool {
            let r = decode_pool_ref(words[i + 2], pool)?;
            let h = &mut held[r.slot as usize];
            if *h {
                return Err(Corrupt::SlotHeld(r.slot));
            }
            *h = true;
            Some(r)
        } else {
            None
        };
        if frame.kind != Kind::Pad {
            out.push(Scanned { frame, payload_at, pool: pool_ref });
        }
        tail = tail.wrapping_add(frame.advance);
        seq = seq.wrapping_add(1);
    }
    Ok(out)
}

/// Decodes a fuzzer's input as a ring image and checks the decoder's promises,
/// panicking if one is broken (the `shm_record` fuzz target and its corpus replay).
///
/// Input: one byte choosing the ring size (256 B to 4 KiB), eight bytes of tail, two
/// bytes of how far the head is ahead, then the ring's bytes (zero-padded). Returns
/// how many records were accepted, `None` for a short input or a corrupt ring.
#[doc(hidden)]
#[cfg(any(test, feature = "alloc"))]
pub fn fuzz_scan(data: &[u8]) -> Option<usize> {
    let (&shift, rest) = data.split_first()?;
    let cap = MIN_RING << (shift % 5);
    let ring = RingGeometry::new(cap).expect("a valid size");
    let (tail, rest) = rest.split_first_chunk::<8>()?;
    let (ahead, rest) = rest.split_first_chunk::<2>()?;
    let tail = u64::from_le_bytes(*tail) & !(ALIGN - 1);
    let head = tail.wrapping_add(u64::from(u16::from_le_bytes(*ahead)) & !(ALIGN - 1) & 0x1fff);
    let mut words = alloc::vec![0u64; (cap / 8) as usize];
    for (w, chunk) in words.iter_mut().zip(rest.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(b);
    }
    let pool = PoolGeometry { slots: 8, slot_size: 4096 };
    let found = scan(&words, tail, head, ring, pool).ok()?;
    {
        let mut seen = alloc::vec![false; pool.slots as usize];
        for f in &found {
            assert!(f.payload_at >= HEADER_LEN && f.payload_at + u64::from(f.frame.len) <= cap, "{f:?}");
            assert!(f.frame.advance <= ring.max_record() && f.frame.kind != Kind::Pad);
            if let Some(p) = f.pool {
                assert!(p.slot < pool.slots && p.len <= pool.slot_size);
                assert!(!seen[p.slot as usize], "a slot handed out twice");
                seen[p.slot as usize] = true;
            }
        }
        assert!(head.wrapping_sub(tail) <= cap);
    }
    Some(found.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    const RING: RingGeometry = RingGeometry { cap: 256 };
    const POOL: PoolGeometry = PoolGeometry { slots: 4, slot_size: 4096 };

    #[test]
    fn geometry_wants_a_power_of_two_in_range() {
        assert!(RingGeometry::new(255).is_none());
        assert!(RingGeometry::new(128).is_none());
        assert!(RingGeometry::new(MAX_RING * 2).is_none());
        assert_eq!(RingGeometry::new(4096).map(RingGeometry::max_payload), Some(2048 - 16));
    }

    #[test]
    fn a_header_round_trips() {
        let raw = encode(Kind::Inline, 5, 77, 3);
        let f = decode(raw, 32, 64, 3, RING).expect("valid");
        assert_eq!(f, Frame { kind: Kind::Inline, len: 5, tag: 77, advance: 32 });
    }

    #[test]
    fn wild_heads_and_tails_are_refused() {
        assert!(matches!(check_head(100 * 16, 99 * 16, RING), Err(Corrupt::Head { .. })));
        assert!(matches!(check_head(0, 272, RING), Err(Corrupt::Head { .. })));
        assert!(matches!(check_head(0, 8, RING), Err(Corrupt::Misaligned(8))));
        assert_eq!(check_head(u64::MAX - 15, 16, RING), Ok(32));
        assert_eq!(check_tail(256, 0, 0, RING), Ok(0));
        assert!(matches!(check_tail(256, 272, 0, RING), Err(Corrupt::Tail { .. })));
        // A tail that moves backwards.
        assert!(matches!(check_tail(256, 32, 64, RING), Err(Corrupt::Tail { .. })));
    }

    #[test]
    fn bad_headers_are_refused() {
        assert!(matches!(decode([5 | 9 << 32, 0], 0, 64, 0, RING), Err(Corrupt::BadHeader(_))));
        assert!(matches!(decode([5 | 1 << 32 | 1 << 50, 0], 0, 64, 0, RING), Err(Corrupt::BadHeader(_))));
        assert!(matches!(decode(encode(Kind::Inline, 5, 0, 1), 0, 64, 0, RING), Err(Corrupt::Sequence { .. })));
        // Longer than what is committed, than the ring end, than the largest record.
        assert!(matches!(decode(encode(Kind::Inline, 40, 0, 0), 0, 32, 0, RING), Err(Corrupt::Overrun { .. })));
        assert!(matches!(decode(encode(Kind::Inline, 40, 0, 0), 224, 256, 0, RING), Err(Corrupt::Overrun { .. })));
        assert!(matches!(decode(encode(Kind::Inline, 200, 0, 0), 0, 256, 0, RING), Err(Corrupt::Overrun { .. })));
        assert!(matches!(decode(encode(Kind::Inline, u32::MAX, 0, 0), 0, 256, 0, RING), Err(Corrupt::Overrun { .. })));
        // A pad must end exactly at the end of the ring.
        assert!(decode(encode(Kind::Pad, 16, 0, 0), 224, 32, 0, RING).is_ok());
        assert!(matches!(decode(encode(Kind::Pad, 0, 0, 0), 224, 32, 0, RING), Err(Corrupt::Pad { .. })));
        assert!(matches!(decode(encode(Kind::Pool, 8, 0, 0), 0, 64, 0, RING), Err(Corrupt::PoolRecord(8))));
    }

    #[test]
    fn pool_references_are_checked() {
        assert_eq!(decode_pool_ref(encode_pool_ref(3, 4096), POOL), Ok(PoolRef { slot: 3, len: 4096 }));
        assert!(decode_pool_ref(encode_pool_ref(4, 1), POOL).is_err());
        assert!(decode_pool_ref(encode_pool_ref(0, 4097), POOL).is_err());
    }

    /// Writes records the way the producer does into a ring image.
    fn produce(records: &[(Kind, u32)], ring: RingGeometry) -> (Vec<u64>, u64) {
        let mut words = vec![0u64; (ring.cap / 8) as usize];
        let (mut head, mut seq) = (0u64, 0u32);
        for (i, &(kind, len)) in records.iter().enumerate() {
            let need = record_len(u64::from(len));
            let to_end = ring.cap - head % ring.cap;
            if to_end < need {
                let at = (head % ring.cap / 8) as usize;
                [words[at], words[at + 1]] = encode(Kind::Pad, (to_end - HEADER_LEN) as u32, 0, seq);
                seq += 1;
                head += to_end;
            }
            let at = (head % ring.cap / 8) as usize;
            [words[at], words[at + 1]] = encode(kind, len, i as u32, seq);
            if kind == Kind::Pool {
                words[at + 2] = encode_pool_ref(i as u32, 10);
            }
            seq += 1;
            head += need;
        }
        (words, head)
    }

    #[test]
    fn a_wrapped_ring_scans_back() {
        let ring = RingGeometry::new(256).expect("ring");
        let recs = [(Kind::Inline, 100), (Kind::Inline, 60), (Kind::Pool, 16)];
        let (words, head) = produce(&recs, ring);
        let got = scan(&words, 0, head, ring, POOL).expect("valid");
        assert_eq!(got.len(), 3);
        assert_eq!(got[2].pool, Some(PoolRef { slot: 2, len: 10 }));
    }

    #[test]
    fn a_slot_sent_twice_is_caught() {
        let ring = RingGeometry::new(256).expect("ring");
        let (mut words, head) = produce(&[(Kind::Pool, 16), (Kind::Pool, 16)], ring);
        words[6] = encode_pool_ref(0, 1);
        assert_eq!(scan(&words, 0, head, ring, POOL), Err(Corrupt::SlotHeld(0)));
    }

    proptest! {
        #[test]
        fn whatever_the_producer_writes_scans_back(lens in proptest::collection::vec(0u32..100, 0..6)) {
            let ring = RingGeometry::new(1024).expect("ring");
            let recs: Vec<(Kind, u32)> = lens.iter().map(|&l| (Kind::Inline, l)).collect();
            let (words, head) = produce(&recs, ring);
            let got = scan(&words, 0, head, ring, POOL).expect("valid");
            prop_assert_eq!(got.len(), recs.len());
            for (g, (_, l)) in got.iter().zip(&recs) {
                prop_assert_eq!(g.frame.len, *l);
                prop_assert!(g.payload_at + u64::from(*l) <= ring.cap);
            }
        }

        #[test]
        fn garbage_never_panics_and_never_overruns(
            words in proptest::collection::vec(any::<u64>(), 32),
            tail in any::<u64>(),
            ahead in 0u64..300,
        ) {
            let ring = RingGeometry::new(256).expect("ring");
            let tail = tail - tail % ALIGN;
            if let Ok(got) = scan(&words, tail, tail.wrapping_add(ahead), ring, POOL) {
                for g in got {
                    prop_assert!(g.payload_at + u64::from(g.frame.len) <= ring.cap);
                }
            }
        }
    }
}
