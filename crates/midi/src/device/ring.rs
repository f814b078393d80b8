//! The byte ring a cable carries MIDI in: single producer (the cable's sending end), single
//! consumer (its receiving end), in a memfd both map, with one wake-up flag each way.
//!
//! This is the paper's shared page (000 §4.3: the driver put bytes into a circular
//! buffer in a page it shared with the input server, advanced a counter, and raised a
//! semaphore) turned round for output, with the wake-up asked for only when the other
//! side sleeps.
//!
//! # Layout (one memfd of [`FILE_LEN`] bytes)
//!
//! | offset | what | written by |
//! | --- | --- | --- |
//! | 0 | `head: u64`, bytes ever written | the writer |
//! | 64 | `tail: u64`, bytes ever read | the reader |
//! | 128 | `reader_waiting: u32` | [`WAKE_ONCE`] set by the reader before it sleeps, cleared by the writer that wakes it; [`WAKE_EVERY`] set by a reader that wants a wake-up for every write |
//! | 192 | `writer_waiting: u32` | set by the writer when the ring is full, cleared by the reader that wakes it |
//! | 4096 | [`CAPACITY`] bytes of data, byte `i` of the stream at `i mod CAPACITY` | the writer |
//!
//! # Protocol
//!
//! Each side keeps its own counter privately and only *writes* it to the shared page;
//! what it reads of the other side's counter is checked (`head − tail` between 0 and
//! [`CAPACITY`]) before use, so a peer that scribbles on the page can make the reader
//! read nonsense bytes or the writer see a full ring, never read or write outside it.
//!
//! - *Write* (whole or not at all): load `tail`; if the free room is short, set
//!   `writer_waiting`, load `tail` again, and if it is still short answer *full*.
//!   Otherwise copy the bytes in, publish the new `head`, and if `reader_waiting` is set,
//!   clear it and wake the reader. A write's bytes therefore appear to the reader all
//!   at once, never a part of one.
//! - *Read*: load `head`, copy bytes out, publish the new `tail`; if `writer_waiting` is
//!   set, clear it and wake the writer.
//! - *Sleep* (reader): set `reader_waiting`, load `head` again; sleep only if nothing
//!   came. The writer stores `head` and then loads `reader_waiting`, the reader stores
//!   `reader_waiting` and then loads `head`, all `SeqCst`: one of the two sees the
//!   other's store, so a write is never left unannounced to a sleeping reader (the same
//!   argument for the writer's sleep). A burst wakes the reader once.
//!
//! The wake-ups themselves travel on the cable's socket (see `cable.rs`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use ictus_sys::memfd::{self, SealFlags, Size};
use ictus_sys::mm::Mapping;
pub use ictus_sys::mm::Protection;

/// Bytes of MIDI a ring holds: twice what an ALSA raw MIDI device buffers by default
/// (4096). Writes of up to half of it are taken whole, so whenever a writer is told
/// *full*, at least 4 KiB are waiting for the reader.
pub const CAPACITY: usize = 8192;
/// Where the data starts (the counters have the first page to themselves).
pub const DATA_AT: usize = 4096;
/// The memfd's length.
pub const FILE_LEN: usize = DATA_AT + CAPACITY;
const HEAD_AT: usize = 0;
const TAIL_AT: usize = 64;
const READER_WAITING_AT: usize = 128;
const WRITER_WAITING_AT: usize = 192;

/// What the first message of a cable connection says, beside the memfd.
pub const SETUP: [u8; 8] = *b"ictusMC1";

/// `reader_waiting`: wake me at the next write (the writer clears it).
pub const WAKE_ONCE: u32 = 1;
/// `reader_waiting`: wake me at every write (the writer leaves it): a reader that wants
/// each write's kernel arrival stamp (the latency experiment's instrument).
pub const WAKE_EVERY: u32 = 2;

/// The memory of one ring.
pub trait RingMem {
    /// The writer's counter.
    fn head(&self) -> &AtomicU64;
    /// The reader's counter.
    fn tail(&self) -> &AtomicU64;
    /// Set while the reader sleeps (or may sleep) waiting for bytes.
    fn reader_waiting(&self) -> &AtomicU32;
    /// Set while the writer waits for room.
    fn writer_waiting(&self) -> &AtomicU32;
    /// The [`CAPACITY`] data bytes.
    fn data(&self) -> &[AtomicU8];
}

/// The other side's counter is impossible: it scribbled on the shared page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the cable's shared ring is corrupt: {what} {value} bytes")]
pub struct Corrupt {
    /// What was found.
    pub what: &'static str,
    /// The impossible count.
    pub value: u64,
}

/// Why a write was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// Not enough room now (the writer asked to be woken when there is).
    Full,
    /// The reader's counter is impossible.
    Corrupt(Corrupt),
}

impl From<Corrupt> for PushError {
    fn from(c: Corrupt) -> PushError {
        PushError::Corrupt(c)
    }
}

fn span(from: u64, to: u64, what: &'static str) -> Result<u64, Corrupt> {
    let n = to.wrapping_sub(from);
    if n > CAPACITY as u64 {
        Err(Corrupt { what, value: n })
    } else {
        Ok(n)
    }
}

/// The writer's side of a ring.
#[derive(Debug, Default)]
pub struct Producer {
    head: u64,
}

impl Producer {
    /// A writer for a fresh (all-zero) ring.
    pub fn new() -> Producer {
        Producer { head: 0 }
    }

    /// Bytes written and not yet taken by the reader.
    pub fn unread(&self, mem: &impl RingMem) -> Result<u64, Corrupt> {
        // SYNC POINT: Acquire pairs with the reader's tail store after it copied the
        // bytes out, so the room it frees is really free.
        span(mem.tail().load(Ordering::SeqCst), self.head, "unread")
    }

    /// Put `bytes` in the ring, all of them or none (`bytes.len() ≤ CAPACITY`).
    /// `Ok(Some(head))` when the reader asked to be woken (it was, or may be, asleep):
    /// the caller wakes it, and may tell it where this write ends (`head`).
    pub fn push(&mut self, mem: &impl RingMem, bytes: &[u8]) -> Result<Option<u64>, PushError> {
        let len = bytes.len() as u64;
        assert!(bytes.len() <= CAPACITY, "a write of {} bytes does not fit a ring of {CAPACITY}", bytes.len());
        if CAPACITY as u64 - self.unread(mem)? < len && !self.room_or_ask(mem, bytes.len())? {
            return Err(PushError::Full);
        }
        let data = mem.data();
        for (i, &b) in bytes.iter().enumerate() {
            data[((self.head + i as u64) % CAPACITY as u64) as usize].store(b, Ordering::Relaxed);
        }
        self.head += len;
        // SYNC POINT: the head store publishes the bytes (Release, via SeqCst) to the
        // reader's Acquire load; SeqCst orders it before the load of `reader_waiting`
        // (see the module documentation).
        mem.head().store(self.head, Ordering::SeqCst);
        let wake = match mem.reader_waiting().load(Ordering::SeqCst) {
            0 => false,
            WAKE_EVERY => true,
            // Clear a wake-once flag only: never turn a wake-every reader off.
            _ => mem.reader_waiting().compare_exchange(WAKE_ONCE, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok(),
        };
        Ok(wake.then_some(self.head))
    }

    /// Whether `need` bytes fit now; if not, ask the reader to wake us when it takes
    /// some (sets `writer_waiting`, then looks again).
    pub fn room_or_ask(&self, mem: &impl RingMem, need: usize) -> Result<bool, Corrupt> {
        let need = need.min(CAPACITY) as u64;
        if CAPACITY as u64 - self.unread(mem)? >= need {
            return Ok(true);
        }
        // SYNC POINT: SeqCst store then load, against the reader's tail store then
        // `writer_waiting` load: one side sees the other.
        mem.writer_waiting().store(1, Ordering::SeqCst);
        Ok(CAPACITY as u64 - self.unread(mem)? >= need)
    }
}

/// The reader's side of a ring.
#[derive(Debug, Default)]
pub struct Consumer {
    tail: u64,
    every: bool,
}

impl Consumer {
    /// A reader for a fresh ring.
    pub fn new() -> Consumer {
        Consumer { tail: 0, every: false }
    }

    /// A reader that asks to be woken at every write, with where it ends (see
    /// [`WAKE_EVERY`]).
    pub fn waking_at_every_write(mem: &impl RingMem) -> Consumer {
        mem.reader_waiting().store(WAKE_EVERY, Ordering::SeqCst);
        Consumer { tail: 0, every: true }
    }

    /// Bytes read so far (the stream offset of the next byte).
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Bytes waiting to be read.
    pub fn available(&self, mem: &impl RingMem) -> Result<u64, Corrupt> {
        // SYNC POINT: Acquire (via SeqCst) pairs with the writer's head store: the bytes
        // before `head` are written.
        span(self.tail, mem.head().load(Ordering::SeqCst), "available")
    }

    /// Take up to `buf.len()` bytes: how many, and whether the writer asked to be woken
    /// (the caller wakes it).
    pub fn pop(&mut self, mem: &impl RingMem, buf: &mut [u8]) -> Result<(usize, bool), Corrupt> {
        self.pop_until(mem, buf, u64::MAX)
    }

    /// [`Consumer::pop`], taking no byte at or past stream offset `end`.
    pub fn pop_until(&mut self, mem: &impl RingMem, buf: &mut [u8], end: u64) -> Result<(usize, bool), Corrupt> {
        let upto = end.saturating_sub(self.tail);
        let n = (self.available(mem)?.min(upto) as usize).min(buf.len());
        if n == 0 {
            return Ok((0, false));
        }
        let data = mem.data();
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = data[((self.tail + i as u64) % CAPACITY as u64) as usize].load(Ordering::Relaxed);
        }
        self.tail += n as u64;
        // SYNC POINT: Release (via SeqCst) after the bytes were copied out, paired with
        // the writer's load before it reuses them; SeqCst orders it before the load of
        // `writer_waiting`.
        mem.tail().store(self.tail, Ordering::SeqCst);
        let wake =
            mem.writer_waiting().load(Ordering::SeqCst) != 0 && mem.writer_waiting().swap(0, Ordering::SeqCst) != 0;
        Ok((n, wake))
    }

    /// Ask to be woken by the next write, then look again: whether bytes are waiting
    /// (then do not sleep).
    pub fn arm(&self, mem: &impl RingMem) -> Result<bool, Corrupt> {
        // SYNC POINT: SeqCst store then load, against the writer's head store then
        // `reader_waiting` load.
        mem.reader_waiting().store(if self.every { WAKE_EVERY } else { WAKE_ONCE }, Ordering::SeqCst);
        Ok(self.available(mem)? > 0)
    }
}

/// A ring in a memfd, mapped.
#[derive(Debug)]
pub struct SharedRing {
    map: Mapping,
}

/// Why a memfd that came with a cable connection was refused.
#[derive(Debug, thiserror::Error)]
pub enum RingCheckError {
    /// Not a memory file of [`FILE_LEN`] bytes sealed against resizing (a shrink would
    /// make our mapping fault).
    #[error("not the cable's ring: {0}")]
    NotARing(#[from] memfd::CheckError),
    /// Mapping it failed.
    #[error("mapping the cable's ring: {0}")]
    Map(#[from] io::Error),
}

impl SharedRing {
    /// A new ring: `memfd_create`, sized to [`FILE_LEN`], sealed against resizing (and
    /// against further seals), mapped read-write. Returns the file, to send to the
    /// reader, and the mapping.
    ///
    /// # References
    /// - [`memfd_create(2)`](https://man7.org/linux/man-pages/man2/memfd_create.2.html)
    /// - [`fcntl(2)`](https://man7.org/linux/man-pages/man2/fcntl.2.html), "File Sealing"
    pub fn create() -> io::Result<(OwnedFd, SharedRing)> {
        let fd = memfd::create("ictus-midi-cable", FILE_LEN as u64)?;
        memfd::add_seals(fd.as_fd(), SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Mapping::shared_populated(fd.as_fd(), FILE_LEN, Protection::ReadWrite)?;
        Ok((fd, SharedRing { map }))
    }

    /// Map a ring that came from elsewhere, after checking that it is a memory file of
    /// [`FILE_LEN`] bytes sealed against resizing (so the mapping cannot fault).
    pub fn open(fd: &OwnedFd, prot: Protection) -> Result<SharedRing, RingCheckError> {
        memfd::check(fd.as_fd(), Size::Exactly(FILE_LEN as u64), SealFlags::SHRINK | SealFlags::GROW)?;
        Ok(SharedRing { map: Mapping::shared_populated(fd.as_fd(), FILE_LEN, prot).map_err(io::Error::from)? })
    }
}

impl RingMem for SharedRing {
    fn head(&self) -> &AtomicU64 {
        self.map.atomic_u64(HEAD_AT)
    }
    fn tail(&self) -> &AtomicU64 {
        self.map.atomic_u64(TAIL_AT)
    }
    fn reader_waiting(&self) -> &AtomicU32 {
        self.map.atomic_u32(READER_WAITING_AT)
    }
    fn writer_waiting(&self) -> &AtomicU32 {
        self.map.atomic_u32(WRITER_WAITING_AT)
    }
    fn data(&self) -> &[AtomicU8] {
        let p = self.map.ptr_at(DATA_AT, CAPACITY);
        // SAFETY: `ptr_at` checked that the CAPACITY bytes are inside the mapping, which
        // lives as long as `self`; `AtomicU8` has the size and alignment of `u8`, and
        // memory another process may change at any time is sound to reach through
        // atomics (never through `&[u8]`).
        unsafe { std::slice::from_raw_parts(p.cast::<AtomicU8>(), CAPACITY) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A ring on the heap, for the protocol's tests.
    #[derive(Debug)]
    pub(crate) struct HeapRing {
        head: AtomicU64,
        tail: AtomicU64,
        reader_waiting: AtomicU32,
        writer_waiting: AtomicU32,
        data: Vec<AtomicU8>,
    }

    impl HeapRing {
        pub(crate) fn new() -> HeapRing {
            HeapRing {
                head: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                reader_waiting: AtomicU32::new(0),
                writer_waiting: AtomicU32::new(0),
                data: (0..CAPACITY).map(|_| AtomicU8::new(0)).collect(),
            }
        }
    }

    impl RingMem for HeapRing {
        fn head(&self) -> &AtomicU64 {
            &self.head
        }
        fn tail(&self) -> &AtomicU64 {
            &self.tail
        }
        fn reader_waiting(&self) -> &AtomicU32 {
            &self.reader_waiting
        }
        fn writer_waiting(&self) -> &AtomicU32 {
            &self.writer_waiting
        }
        fn data(&self) -> &[AtomicU8] {
            &self.data
        }
    }

    #[test]
    fn whole_writes_or_none_and_the_wake_ups_asked_for() {
        let ring = HeapRing::new();
        let (mut w, mut r) = (Producer::new(), Consumer::new());
        // Nobody asked to be woken yet.
        assert_eq!(w.push(&ring, &[1, 2, 3]), Ok(None));
        assert!(r.arm(&ring).unwrap(), "bytes were there before the reader armed");
        assert_eq!(w.push(&ring, &[4]), Ok(Some(4)), "an armed reader is woken once");
        assert_eq!(w.push(&ring, &[5]), Ok(None));
        let mut buf = [0u8; 16];
        assert_eq!(r.pop(&ring, &mut buf).unwrap(), (5, false));
        assert_eq!(&buf[..5], &[1, 2, 3, 4, 5]);
        // Fill to the brim, then one more byte is refused whole.
        let big = vec![7u8; CAPACITY];
        assert_eq!(w.push(&ring, &big), Ok(None));
        assert_eq!(w.push(&ring, &[8]), Err(PushError::Full));
        // The writer asked: the read that frees room wakes it.
        assert_eq!(r.pop(&ring, &mut buf).unwrap(), (16, true));
        assert_eq!(w.push(&ring, &[8; 16]), Ok(None));
        assert_eq!(w.push(&ring, &[8]), Err(PushError::Full));
        assert_eq!(w.unread(&ring).unwrap(), CAPACITY as u64);
    }

    #[test]
    fn a_reader_may_ask_for_every_write_and_read_one_at_a_time() {
        let ring = HeapRing::new();
        let mut w = Producer::new();
        let mut r = Consumer::waking_at_every_write(&ring);
        assert_eq!(w.push(&ring, &[1, 2]), Ok(Some(2)));
        assert_eq!(w.push(&ring, &[3]), Ok(Some(3)), "every write, not only the first");
        assert!(r.arm(&ring).unwrap());
        assert_eq!(w.push(&ring, &[4]), Ok(Some(4)), "arming does not turn it into wake-once");
        let mut buf = [0u8; 8];
        assert_eq!(r.pop_until(&ring, &mut buf, 2).unwrap(), (2, false));
        assert_eq!(&buf[..2], &[1, 2]);
        assert_eq!(r.pop_until(&ring, &mut buf, 2).unwrap(), (0, false));
        assert_eq!(r.pop(&ring, &mut buf).unwrap(), (2, false));
        assert_eq!(r.tail(), 4);
    }

    #[test]
    fn a_scribbled_counter_is_refused_not_used() {
        let ring = HeapRing::new();
        let (mut w, r) = (Producer::new(), Consumer::new());
        ring.head.store(CAPACITY as u64 + 1, Ordering::SeqCst);
        assert!(r.available(&ring).is_err());
        ring.head.store(0, Ordering::SeqCst);
        ring.tail.store(5, Ordering::SeqCst);
        assert!(matches!(w.push(&ring, &[1]), Err(PushError::Corrupt(_))));
    }

    proptest! {
        /// Any interleaving of writes and reads of any sizes delivers the bytes written,
        /// in order, each once, and never holds more than the capacity.
        #[test]
        fn bytes_in_order(ops in proptest::collection::vec((any::<bool>(), 1usize..3000), 1..200)) {
            let ring = HeapRing::new();
            let (mut w, mut r) = (Producer::new(), Consumer::new());
            let (mut next, mut want, mut got) = (0u8, Vec::new(), Vec::new());
            for (write, n) in ops {
                if write {
                    let bytes: Vec<u8> = (0..n).map(|_| { next = next.wrapping_add(1); next }).collect();
                    match w.push(&ring, &bytes) {
                        Ok(_) => want.extend_from_slice(&bytes),
                        Err(PushError::Full) => {
                            next = next.wrapping_sub(n as u8);
                            prop_assert!(w.unread(&ring).unwrap() + n as u64 > CAPACITY as u64);
                        }
                        Err(e) => prop_assert!(false, "{e:?}"),
                    }
                } else {
                    let mut buf = vec![0u8; n];
                    let (k, _) = r.pop(&ring, &mut buf).unwrap();
                    got.extend_from_slice(&buf[..k]);
                }
                prop_assert!(w.unread(&ring).unwrap() <= CAPACITY as u64);
            }
            let mut buf = vec![0u8; CAPACITY];
            let (k, _) = r.pop(&ring, &mut buf).unwrap();
            got.extend_from_slice(&buf[..k]);
            prop_assert_eq!(got, want);
        }
    }

    /// A writer and a reader on two threads, each sleeping only by the protocol (armed
    /// flags, a wake-up per set flag): everything arrives, in order, and neither sleeps
    /// for ever (a lost wake-up would hang this test until its watchdog).
    #[test]
    fn two_threads_never_lose_a_wake_up() {
        use std::sync::mpsc::{channel, RecvTimeoutError};
        use std::sync::Arc;
        use std::time::Duration;
        let ring = Arc::new(HeapRing::new());
        let (wake_reader, reader_bell) = channel::<()>();
        let (wake_writer, writer_bell) = channel::<()>();
        let total: usize = 2_000_000;
        let writer = {
            let ring = Arc::clone(&ring);
            std::thread::spawn(move || {
                let mut w = Producer::new();
                let mut sent = 0usize;
                let mut i = 0u8;
                while sent < total {
                    let n = (1 + (sent * 7) % 300).min(total - sent);
                    let bytes: Vec<u8> = (0..n).map(|k| i.wrapping_add(k as u8)).collect();
                    match w.push(&*ring, &bytes) {
                        Ok(wake) => {
                            if wake.is_some() {
                                let _ = wake_reader.send(());
                            }
                            sent += n;
                            i = i.wrapping_add(n as u8);
                        }
                        Err(PushError::Full) => match writer_bell.recv_timeout(Duration::from_secs(60)) {
                            Ok(()) => {}
                            Err(RecvTimeoutError::Timeout) => panic!("the writer was never woken"),
                            Err(RecvTimeoutError::Disconnected) => return,
                        },
                        Err(e) => panic!("{e:?}"),
                    }
                }
            })
        };
        let mut r = Consumer::new();
        let mut buf = vec![0u8; 1000];
        let mut got = 0usize;
        let mut expect = 0u8;
        while got < total {
            let (n, wake) = r.pop(&*ring, &mut buf).unwrap();
            if wake {
                let _ = wake_writer.send(());
            }
            for &b in &buf[..n] {
                assert_eq!(b, expect, "byte {got}");
                expect = expect.wrapping_add(1);
                got += 1;
            }
            if n == 0 && !r.arm(&*ring).unwrap() {
                reader_bell.recv_timeout(Duration::from_secs(60)).expect("the reader was never woken");
            }
        }
        writer.join().unwrap();
    }
}
