//! The driver's ring: the paper's shared page and semaphore (000 §4.3, §4.5).
//!
//! In the paper, the MIDI interrupt handler copies the bytes it reads from the
//! MPU-401 into a circular buffer in a wired page shared with the input server,
//! advances a counter in that page, and raises a semaphore; the server keeps its own
//! counter, reads until the two are equal, and waits on the semaphore again.
//!
//! Here the page is a **memfd** mapped shared (`MAP_SHARED`), its size sealed, so the
//! driver could live in another process (a privileged one that owns the device, as the
//! paper's kernel did) with nothing changed but who maps it; today the driver is a
//! thread of the server. The semaphore is an **eventfd**, because the server waits in
//! one `poll` for the ring, its ports and its stop channel together — a futex cannot
//! be polled. The driver rings it only when the server said it was going to sleep (a
//! "waiting" word in the page), so a burst of reads costs one wake-up.
//!
//! # Layout (all little-endian, in the memfd)
//!
//! | offset | field | written by |
//! | --- | --- | --- |
//! | 0 | `head: u64` — slots published | driver |
//! | 64 | `tail: u64` — slots consumed | server |
//! | 128 | `waiting: u32` — the server is about to sleep | both (swap) |
//! | 136 | `overflow: u64` — bytes dropped because the ring was full | driver |
//! | 192 + 128·i | slot `i`: `time_ns: u64`, `len: u32`, 4 bytes pad, 112 data bytes | driver |
//!
//! Each read of the device becomes one or more slots stamped with the time the read
//! returned (`CLOCK_MONOTONIC`), the paper's interrupt time. A full ring drops bytes
//! and counts them (the interrupt handler could not wait either).
//!
//! # Trust
//!
//! The server copies every slot out before looking at it and checks what it copied:
//! a head more than a ring ahead of its own counter, or behind it, and a slot length
//! over 112 are counted as corrupt ([`Consumer::corrupt`]) and skipped, never used as
//! an index. Its own counter is private; the shared `tail` is only what it tells the
//! driver. The synchronisation is Release/Acquire on `head` and `tail` and a SeqCst
//! pair on `head`/`waiting` (the sleeper's check and the waker's swap).
//!
//! Every byte of the page is reached through atomics of the mapping
//! ([`ictus_sys::mm::Mapping::atomic_u64`]): a slot is written and copied out as sixteen
//! relaxed 64-bit words, so whatever the other side does to the page is never a data
//! race, and this module needs no `unsafe`. The memfd, its seals and the mapping are
//! the OS layer's ([`ictus_sys::memfd`], [`ictus_sys::mm`]).
//!
//! # Why not the shared-memory channel's ring
//!
//! `ictus_shm::ring` is a ring of variable-size records between a server and a client
//! it does not trust; this one is a lossy stream of timestamped bytes from a driver,
//! and three of its needs are not that ring's:
//!
//! - **A corrupt slot loses its bytes, not the stream.** The channel's consumer treats
//!   any inconsistency as the client's fault and ends the channel; MIDI input must go
//!   on. Fixed-size slots are what make that possible: after a bad slot the next one is
//!   at a known place, and after a wild head the consumer starts again at the
//!   producer's. With variable-size records a bad header leaves no way to find the next.
//! - **A full ring drops the newest bytes and counts them** in the page, as the
//!   interrupt handler that cannot wait did; the channel's producer is told `Full` and
//!   waits or refuses its caller.
//! - **One sleeper, one waker, one bell.** The channel's wake-up flag is written only by
//!   the server, because many untrusted clients wake it; here the one producer swaps a
//!   "waiting" word the consumer sets, and rings an eventfd the server polls with its
//!   ports.
//!
//! What they share is the discipline: counters copied once and checked, Release/Acquire
//! on publication, SeqCst around the sleep decision, no lock.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use ictus_rt::Time;
use ictus_sys::memfd::{self, SealFlags};
use ictus_sys::mm::{Mapping, Protection};
use rustix::event::{eventfd, EventfdFlags};
use rustix::io::Errno;

/// Data bytes per slot.
pub const SLOT_DATA: usize = 112;
/// Bytes per slot.
pub const SLOT_SIZE: usize = 128;
/// Slots in the server's ring (64 KiB of slots: 57 KiB of MIDI, 18 s of a saturated
/// 31250-baud line).
pub const DEFAULT_SLOTS: usize = 512;
/// The most slots a ring may have.
pub const MAX_SLOTS: usize = 1 << 16;

const HEAD: usize = 0;
const TAIL: usize = 64;
const WAITING: usize = 128;
const OVERFLOW: usize = 136;
const SLOTS_AT: usize = 192;

/// Why a ring could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The slot count is zero or above [`MAX_SLOTS`].
    #[error("a ring needs 1 to {MAX_SLOTS} slots, not {0}")]
    BadSize(usize),
    /// A system call failed.
    #[error("making the ring ({what}): {source}")]
    Os {
        /// Which step.
        what: &'static str,
        /// The error.
        source: Errno,
    },
}

fn os(what: &'static str) -> impl FnOnce(Errno) -> RingError {
    move |source| RingError::Os { what, source }
}

/// The mapped memfd and the bell; shared by the two ends.
#[derive(Debug)]
struct Shared {
    map: Mapping,
    slots: usize,
    bell: OwnedFd,
    _memfd: OwnedFd,
}

impl Shared {
    fn word64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset + 8 <= SLOTS_AT);
        self.map.atomic_u64(offset)
    }

    fn word32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= SLOTS_AT);
        self.map.atomic_u32(offset)
    }

    /// Word `w` of the slot for counter `index`.
    fn slot_word(&self, index: u64, w: usize) -> &AtomicU64 {
        let i = (index % self.slots as u64) as usize;
        self.map.atomic_u64(SLOTS_AT + i * SLOT_SIZE + w * 8)
    }
}

/// Make a ring of `slots` slots: its producer (the driver's end) and consumer (the
/// server's end).
pub fn ring(slots: usize) -> Result<(Producer, Consumer), RingError> {
    if slots == 0 || slots > MAX_SLOTS {
        return Err(RingError::BadSize(slots));
    }
    let len = SLOTS_AT + slots * SLOT_SIZE;
    let memfd = memfd::create("ictus-midi-ring", len as u64).map_err(os("memfd_create"))?;
    memfd::add_seals(memfd.as_fd(), SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(os("F_ADD_SEALS"))?;
    // The kernel zero-fills the memfd, so every counter starts at zero; the size is
    // sealed, so the mapping can never fault.
    let map = Mapping::shared(memfd.as_fd(), len, Protection::ReadWrite).map_err(os("mmap"))?;
    let bell = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(os("eventfd"))?;
    let shared = Arc::new(Shared { map, slots, bell, _memfd: memfd });
    Ok((Producer { shared: Arc::clone(&shared), head: 0, rings: 0 }, Consumer { shared, tail: 0, corrupt: 0 }))
}

/// The driver's end: publishes timestamped bytes and rings the bell.
#[derive(Debug)]
pub struct Producer {
    shared: Arc<Shared>,
    head: u64,
    rings: u64,
}

impl Producer {
    /// Publish `bytes`, read at `time`, in as many slots as they need; returns how
    /// many were published (the rest, if the ring was full, are dropped and counted in
    /// [`Producer::overflow`]). Wakes the consumer if it is waiting.
    pub fn push(&mut self, time: Time, bytes: &[u8]) -> usize {
        let s = &*self.shared;
        let mut pushed = 0;
        for chunk in bytes.chunks(SLOT_DATA) {
            // SYNC POINT: Acquire on `tail` — the consumer is done with the slots
            // before it, so they may be overwritten.
            let tail = s.word64(TAIL).load(Ordering::Acquire);
            if self.head.wrapping_sub(tail) >= s.slots as u64 {
                break;
            }
            // The slot is unpublished (head − tail < slots): the consumer does not read
            // it until the head below says so.
            let mut raw = [0u8; SLOT_SIZE];
            raw[..8].copy_from_slice(&time.as_nanos().to_le_bytes());
            raw[8..12].copy_from_slice(&(chunk.len() as u32).to_le_bytes());
            raw[16..16 + chunk.len()].copy_from_slice(chunk);
            for (w, bytes) in raw.chunks_exact(8).enumerate() {
                let word = u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
                s.slot_word(self.head, w).store(word, Ordering::Relaxed);
            }
            self.head = self.head.wrapping_add(1);
            // SYNC POINT: Release on `head` — publishes the slot just written.
            s.word64(HEAD).store(self.head, Ordering::Release);
            pushed += chunk.len();
        }
        let dropped = bytes.len() - pushed;
        if dropped > 0 {
            s.word64(OVERFLOW).fetch_add(dropped as u64, Ordering::Relaxed);
        }
        // SYNC POINT: SeqCst fence between publishing `head` and reading `waiting`,
        // paired with the consumer's between setting `waiting` and reading `head`:
        // either it sees the new head, or we see it waiting.
        fence(Ordering::SeqCst);
        if pushed > 0 && s.word32(WAITING).swap(0, Ordering::SeqCst) != 0 {
            self.rings += 1;
            let _ = rustix::io::write(&s.bell, &1u64.to_ne_bytes());
        }
        pushed
    }

    /// Bytes dropped so far because the ring was full.
    pub fn overflow(&self) -> u64 {
        self.shared.word64(OVERFLOW).load(Ordering::Relaxed)
    }

    /// How many times the bell was rung.
    pub fn rings(&self) -> u64 {
        self.rings
    }
}

/// One slot as the consumer copied it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// When the driver's read returned.
    pub time: Time,
    len: usize,
    data: [u8; SLOT_DATA],
}

impl Chunk {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

/// The server's end: takes slots in order, checks them, sleeps on the bell.
#[derive(Debug)]
pub struct Consumer {
    shared: Arc<Shared>,
    tail: u64,
    corrupt: u64,
}

impl Consumer {
    /// The next published slot, copied out and checked; `None` if there is none. A
    /// corrupt slot (or counter) is skipped and counted.
    pub fn pop(&mut self) -> Option<Chunk> {
        let s = &*self.shared;
        loop {
            // SYNC POINT: Acquire on `head`, paired with the producer's Release.
            let head = s.word64(HEAD).load(Ordering::Acquire);
            let avail = head.wrapping_sub(self.tail);
            if avail == 0 {
                return None;
            }
            if avail > s.slots as u64 {
                // Not a ring's worth ahead of us: the counter is garbage. Resynchronise
                // at the producer's head and say so.
                self.corrupt += 1;
                self.tail = head;
                s.word64(TAIL).store(self.tail, Ordering::Release);
                return None;
            }
            // The slot is published (Acquire above): the producer does not write it until
            // we advance `tail`. Copy it out, once, and look only at the copy.
            let mut raw = [0u8; SLOT_SIZE];
            for (w, bytes) in raw.chunks_exact_mut(8).enumerate() {
                bytes.copy_from_slice(&s.slot_word(self.tail, w).load(Ordering::Relaxed).to_le_bytes());
            }
            self.tail = self.tail.wrapping_add(1);
            // SYNC POINT: Release on `tail` — the slot may be reused.
            s.word64(TAIL).store(self.tail, Ordering::Release);
            let time = u64::from_le_bytes(raw[..8].try_into().unwrap_or([0; 8]));
            let len = u32::from_le_bytes(raw[8..12].try_into().unwrap_or([0; 4])) as usize;
            if len > SLOT_DATA || len == 0 {
                self.corrupt += 1;
                continue;
            }
            let mut data = [0u8; SLOT_DATA];
            data.copy_from_slice(&raw[16..]);
            return Some(Chunk { time: Time::from_nanos(time), len, data });
        }
    }

    /// Say that we are about to sleep on the bell. Returns `false` (and takes it back)
    /// if a slot was published meanwhile: pop again instead of sleeping.
    pub fn prepare_sleep(&self) -> bool {
        let s = &*self.shared;
        s.word32(WAITING).store(1, Ordering::SeqCst);
        // SYNC POINT: see `Producer::push`.
        fence(Ordering::SeqCst);
        if s.word64(HEAD).load(Ordering::SeqCst) != self.tail {
            s.word32(WAITING).store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Reset the bell after waking (it stays readable until read).
    pub fn clear_bell(&self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.shared.bell, &mut buf);
    }

    /// The bell's descriptor, readable when the producer rang it.
    pub fn bell(&self) -> BorrowedFd<'_> {
        self.shared.bell.as_fd()
    }

    /// Slots (or counters) found corrupt and skipped.
    pub fn corrupt(&self) -> u64 {
        self.corrupt
    }

    /// Bytes the producer dropped because the ring was full.
    pub fn overflow(&self) -> u64 {
        self.shared.word64(OVERFLOW).load(Ordering::Relaxed)
    }

    /// Scribble over the shared head counter, as a hostile or broken producer might
    /// (for tests of [`Consumer::pop`]'s checks).
    #[doc(hidden)]
    pub fn corrupt_head_for_test(&self, head: u64) {
        self.shared.word64(HEAD).store(head, Ordering::Release);
    }

    /// Scribble a length into the slot at the consumer's position (for tests).
    #[doc(hidden)]
    pub fn corrupt_next_len_for_test(&self, len: u32) {
        let word = self.shared.slot_word(self.tail, 1);
        let old = word.load(Ordering::Relaxed);
        word.store(old & !0xffff_ffff | u64::from(len), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(n: u64) -> Time {
        Time::from_nanos(n)
    }

    #[test]
    fn bytes_come_out_in_order_with_their_times() {
        let (mut p, mut c) = ring(4).unwrap();
        assert_eq!(c.pop(), None);
        assert_eq!(p.push(t(5), &[0x90, 60, 100]), 3);
        let long: Vec<u8> = (0..200u32).map(|i| (i % 128) as u8).collect();
        assert_eq!(p.push(t(7), &long), 200);
        let a = c.pop().unwrap();
        assert_eq!((a.time, a.bytes()), (t(5), &[0x90, 60, 100][..]));
        let b = c.pop().unwrap();
        let d = c.pop().unwrap();
        assert_eq!((b.time, d.time), (t(7), t(7)));
        assert_eq!([b.bytes(), d.bytes()].concat(), long);
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn a_full_ring_drops_and_counts() {
        let (mut p, mut c) = ring(2).unwrap();
        assert_eq!(p.push(t(1), &[1; SLOT_DATA * 3]), SLOT_DATA * 2);
        assert_eq!(p.overflow(), SLOT_DATA as u64);
        assert_eq!(c.overflow(), SLOT_DATA as u64);
        c.pop().unwrap();
        assert_eq!(p.push(t(2), &[2]), 1);
        assert_eq!(c.pop().unwrap().bytes(), &[1; SLOT_DATA][..]);
        assert_eq!(c.pop().unwrap().bytes(), &[2][..]);
    }

    #[test]
    fn corrupt_counters_and_lengths_are_skipped_not_trusted() {
        let (_p, mut c) = ring(4).unwrap();
        c.corrupt_head_for_test(1_000_000);
        assert_eq!(c.pop(), None);
        assert_eq!(c.corrupt(), 1);
        // The consumer resynchronised at the bogus head; a producer starting over is
        // behind it, which is also not a ring's worth ahead.
        c.corrupt_head_for_test(999_999);
        assert_eq!(c.pop(), None);
        assert_eq!(c.corrupt(), 2);
        let (mut p2, mut c2) = ring(4).unwrap();
        p2.push(t(1), &[1, 2, 3]);
        p2.push(t(2), &[4]);
        c2.corrupt_next_len_for_test(10_000);
        assert_eq!(c2.pop().unwrap().bytes(), &[4][..]);
        assert_eq!(c2.corrupt(), 1);
    }

    #[test]
    fn the_bell_rings_only_for_a_sleeper() {
        let (mut p, mut c) = ring(8).unwrap();
        p.push(t(1), &[1]);
        assert_eq!(p.rings(), 0);
        // Something is there: no sleeping.
        assert!(!c.prepare_sleep());
        c.pop().unwrap();
        assert!(c.prepare_sleep());
        p.push(t(2), &[2]);
        assert_eq!(p.rings(), 1);
        let bell = c.bell();
        let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
        let mut fds = [rustix::event::PollFd::new(&bell, rustix::event::PollFlags::IN)];
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 1, "the bell rang");
        c.clear_bell();
        p.push(t(3), &[3]);
        assert_eq!(p.rings(), 1, "nobody was waiting");
    }

    #[test]
    fn two_threads() {
        let (mut p, mut c) = ring(8).unwrap();
        let n = 20_000u32;
        let h = std::thread::spawn(move || {
            let (mut i, mut refused) = (0u32, 0u64);
            while i < n {
                let b = [(i % 128) as u8];
                if p.push(t(u64::from(i)), &b) == 1 {
                    i += 1;
                } else {
                    refused += 1;
                    std::thread::yield_now();
                }
            }
            (p, refused)
        });
        let mut got = 0u32;
        while got < n {
            match c.pop() {
                Some(ch) => {
                    assert_eq!(ch.bytes(), &[(got % 128) as u8]);
                    assert_eq!(ch.time, t(u64::from(got)));
                    got += 1;
                }
                None => {
                    if c.prepare_sleep() {
                        let bell = c.bell();
                        let mut fds = [rustix::event::PollFd::new(&bell, rustix::event::PollFlags::IN)];
                        let timeout = rustix::time::Timespec { tv_sec: 30, tv_nsec: 0 };
                        rustix::event::poll(&mut fds, Some(&timeout)).unwrap();
                        c.clear_bell();
                    }
                }
            }
        }
        let (p, refused) = h.join().unwrap();
        // Every byte that found the ring full was counted (and then pushed again).
        assert_eq!(p.overflow(), refused);
        assert_eq!(c.corrupt(), 0);
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(matches!(ring(0), Err(RingError::BadSize(0))));
        assert!(matches!(ring(MAX_SLOTS + 1), Err(RingError::BadSize(_))));
    }

    proptest! {
        #[test]
        fn whatever_fits_comes_out_whole(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..300), 0..20)) {
            let (mut p, mut c) = ring(16).unwrap();
            let mut sent = Vec::new();
            let mut dropped = 0usize;
            for (i, ch) in chunks.iter().enumerate() {
                let n = p.push(t(i as u64), ch);
                sent.extend(ch[..n].iter().map(|&b| (i as u64, b)));
                dropped += ch.len() - n;
                // Drain now and then, so some pushes find the ring full and some not.
                if i % 3 == 2 {
                    while let Some(x) = c.pop() {
                        for &b in x.bytes() {
                            prop_assert_eq!(Some((x.time.as_nanos(), b)), sent.first().copied());
                            sent.remove(0);
                        }
                    }
                }
            }
            while let Some(x) = c.pop() {
                for &b in x.bytes() {
                    prop_assert_eq!(Some((x.time.as_nanos(), b)), sent.first().copied());
                    sent.remove(0);
                }
            }
            prop_assert!(sent.is_empty());
            prop_assert_eq!(p.overflow(), dropped as u64);
            prop_assert_eq!(c.corrupt(), 0);
        }
    }
}
