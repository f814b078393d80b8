//! Exact queue limits: a port's *queue page* (`doc/ipc.md`, *Queue limits*).
//!
//! Mach counts a port's messages: with a queue limit of N, N messages queue, the next
//! sender blocks (or times out, or fails at once when asked not to wait) and wakes when
//! one is received; send-once rights are not held back. The kernel's socket buffer
//! counts bytes, with slack both ways, so it cannot say that on its own. Here it stays
//! the hard bound on memory (nothing a sender does can queue more than it holds), and
//! the count lives in one page of shared memory per port, which every sender maps:
//!
//! - senders write `sent` (places taken, by compare-and-swap) and `waiters`;
//! - the receiver writes `released` (places given back; blocked senders sleep on it)
//!   and `version` (bumped when the port's settings change).
//!
//! The settings themselves (queue limit, how many places may hold large datagrams, the
//! largest message) are not in the page: they are the bytes of the *note* the port puts
//! in the queue of each of its connections' send ends, beside the page's memfd
//! ([`Note`]). Only the port can write there, and the kernel keeps the bytes, so no
//! sender can change what another reads; a sender peeks the note once and again when
//! `version` moves.
//!
//! A sender takes a place before it sends and marks the message *counted*; the receiver
//! gives one place back per counted message it takes off the queue. The page's words
//! are claims: the receiver keeps its own count of places given back ([`Ledger`]) and
//! writes it out again with every message and every doorbell. What a hostile holder of
//! a send right can do, and what bounds it:
//!
//! - claim fewer places than it takes (send uncounted, lower `sent`, raise
//!   `released`): others may queue more than the limit, never more than the kernel's
//!   buffer holds;
//! - claim places it never uses (raise `sent`, lower `released`), so that honest
//!   senders find the queue full while it is empty: a blocked sender rings the port (a
//!   doorbell datagram) when the kernel says nothing of its connection is queued; the
//!   receiver writes its own `released` again at once, and, finding its queue empty
//!   twice [`GRACE`] apart with the same places still out, gives them back
//!   ([`Ledger::audit`]): honest senders then wait at most about `GRACE` longer than
//!   Mach would make them, each time the trick is played;
//! - lower `waiters` so that the receiver does not wake sleepers: sleepers wake on
//!   their own every [`RING_EVERY`] and look again;
//! - move `version`: senders peek the note again (a system call), and read the same.
//!
//! An honest sender that stalls longer than `GRACE` between taking its place and
//! sending may have its place given back meanwhile: the only way a port of honest
//! senders holds more than its limit, by one message per such sender, for as long as
//! that message is queued.
//!
//! The pure rules ([`Words`], [`Ledger`], [`Sizes`], [`Note`]) take the page's words
//! and the time as parameters and are tested on their own; [`QueuePage`] is the memfd.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ictus_sys::memfd::{SealFlags, Size};
use ictus_sys::mm::{Mapping, Protection};

use crate::port::MAX_QLIMIT;
use crate::sys;

/// Bytes in a queue page: one page of memory.
pub(crate) const PAGE_LEN: usize = 4096;

/// The page's first word: `"ICQ1"`, so a sender knows what it mapped.
const MAGIC: u32 = u32::from_le_bytes(*b"ICQ1");

// The receiver's words, in the page's first cache line.
const MAGIC_AT: usize = 0;
const RELEASED_AT: usize = 4;
const VERSION_AT: usize = 8;
// The senders' words, in a cache line of their own.
const SENT_AT: usize = 64;
const WAITERS_AT: usize = 68;

/// How long places must stay out while the queue is empty before the receiver gives
/// them back (see the module documentation).
pub(crate) const GRACE: Duration = Duration::from_millis(200);

/// How often a blocked sender wakes on its own, looks again, and rings the port if
/// nothing of its connection is queued.
pub(crate) const RING_EVERY: Duration = Duration::from_millis(100);

/// A datagram of at most this many bytes is *small*: a header, a few descriptors and a
/// little in-line data. Every queued message may be small; only the first
/// [`Settings::large`] places may hold larger datagrams (see [`Sizes`]).
pub(crate) const SMALL_DATAGRAM: usize = 512;

/// How many large datagrams a port's buffer is sized for, at most.
const LARGE_WANTED: u32 = 4;

/// Room beyond the queue limit, in small datagrams, for what is not counted: doorbells,
/// notifications (which Mach sends whatever the limit).
const UNCOUNTED_ROOM: usize = 8;

/// A port's settings, as its note says them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Bumped with every change; the page's `version` says when to look again.
    pub(crate) version: u32,
    /// The queue limit, in messages (`1..=MAX_QLIMIT`).
    pub(crate) qlimit: u32,
    /// How many of the first places may hold a large datagram.
    pub(crate) large: u32,
    /// The most in-line bytes a message may carry.
    pub(crate) limit: u32,
}

/// The note a port puts in the queue of each of its connections' send ends, with the
/// page's memfd beside it: `"ICQPAGE1"`, then the [`Settings`] as four `u32` (LE). A
/// sender peeks it (`MSG_PEEK` copies the descriptor and leaves the datagram).
pub(crate) struct Note;

impl Note {
    const MAGIC: [u8; 8] = *b"ICQPAGE1";
    /// Bytes in a note.
    pub(crate) const LEN: usize = 24;

    /// The note's bytes for these settings.
    pub(crate) fn encode(s: Settings) -> [u8; Note::LEN] {
        let mut b = [0u8; Note::LEN];
        b[..8].copy_from_slice(&Note::MAGIC);
        for (i, v) in [s.version, s.qlimit, s.large, s.limit].into_iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Settings from a note's bytes: `None` unless they are exactly a note with a queue
    /// limit in range and no more large places than places.
    pub(crate) fn parse(b: &[u8]) -> Option<Settings> {
        if b.len() != Note::LEN || b[..8] != Note::MAGIC {
            return None;
        }
        let word = |i: usize| u32::from_le_bytes(b[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes"));
        let s = Settings { version: word(0), qlimit: word(1), large: word(2), limit: word(3) };
        let ok = (1..=MAX_QLIMIT).contains(&s.qlimit)
            && s.large <= s.qlimit
            && u64::from(s.limit) <= ictus_abi::BIG_INLINE_MAX;
        ok.then_some(s)
    }
}

/// The words of a queue page (or of any memory laid out the same way, for tests).
#[derive(Clone, Copy)]
pub(crate) struct Words<'a> {
    pub(crate) released: &'a AtomicU32,
    pub(crate) version: &'a AtomicU32,
    pub(crate) sent: &'a AtomicU32,
    pub(crate) waiters: &'a AtomicU32,
}

/// A sender's look at the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// A place was taken: the message is the `position`-th queued (1 is the first), and
    /// may be a large datagram if `large`.
    Taken { position: u32, large: bool },
    /// The queue holds `qlimit` messages.
    Full,
}

/// Messages queued by the counts `sent` and `released`: a difference that reads as
/// negative (a hostile `sent`, or a place given back early) counts as none.
#[inline]
fn queued(sent: u32, released: u32) -> u32 {
    let d = sent.wrapping_sub(released) as i32;
    d.max(0) as u32
}

impl Words<'_> {
    /// Messages queued, as the page says.
    pub(crate) fn queued(&self) -> u32 {
        queued(self.sent.load(Ordering::Acquire), self.released.load(Ordering::Acquire))
    }

    /// Take a place in a queue with these settings, if there is one.
    #[inline]
    pub(crate) fn reserve(&self, settings: &Settings) -> Place {
        let mut sent = self.sent.load(Ordering::Relaxed);
        loop {
            let q = queued(sent, self.released.load(Ordering::Acquire));
            if q >= settings.qlimit {
                return Place::Full;
            }
            // SYNC POINT: the place is taken before the message is sent (Release), and
            // the receiver reads `sent` after taking the message (Acquire).
            match self.sent.compare_exchange_weak(sent, sent.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    let position = q + 1;
                    return Place::Taken { position, large: position <= settings.large };
                }
                Err(now) => sent = now,
            }
        }
    }

    /// Give back a place taken for a message that was not sent.
    pub(crate) fn cancel(&self) {
        self.sent.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the receiver keeps of a port's count, in its own memory: the places it gave
/// back, and an audit under way.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    released: AtomicU32,
    audit: Mutex<Option<Audit>>,
}

/// An audit: when the receiver first found its queue empty with places out, and the
/// counts then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Audit {
    since: Instant,
    sent: u32,
    released: u32,
}

impl Ledger {
    /// A ledger that has given back `released` places (a moved receive right goes on
    /// from what its page says).
    pub(crate) fn starting_at(released: u32) -> Ledger {
        Ledger { released: AtomicU32::new(released), audit: Mutex::new(None) }
    }

    /// Places given back so far.
    pub(crate) fn released(&self) -> u32 {
        self.released.load(Ordering::Acquire)
    }

    /// Messages queued by this ledger: places taken (as the page claims) not given back.
    pub(crate) fn queued(&self, w: &Words<'_>) -> u32 {
        queued(w.sent.load(Ordering::Acquire), self.released())
    }

    /// A counted message was taken off the queue: give its place back, if one is out.
    /// Returns whether senders may be sleeping (the caller wakes one).
    #[inline]
    pub(crate) fn release(&self, w: &Words<'_>) -> bool {
        let sent = w.sent.load(Ordering::Acquire);
        let _ = self
            .released
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| (queued(sent, r) > 0).then(|| r.wrapping_add(1)));
        self.publish(w);
        w.waiters.load(Ordering::Relaxed) != 0
    }

    /// Write the places given back into the page, again until no other thread has
    /// given one back meanwhile (so the page ends with the latest count, whatever a
    /// sender wrote there).
    pub(crate) fn publish(&self, w: &Words<'_>) {
        loop {
            let v = self.released();
            // SYNC POINT: senders read `released` (Acquire) before taking a place.
            w.released.store(v, Ordering::Release);
            if self.released() == v {
                return;
            }
        }
    }

    /// A doorbell arrived: write the count out again, and look for places taken and
    /// never used. `empty` says whether the port's queue is empty now (the caller asks
    /// the kernel only if [`Ledger::queued`] is not zero). Returns how many places were
    /// given back (the caller then wakes every sleeper).
    pub(crate) fn audit(&self, w: &Words<'_>, now: Instant, empty: bool) -> u32 {
        self.publish(w);
        let sent = w.sent.load(Ordering::Acquire);
        let released = self.released();
        let out = queued(sent, released);
        let mut audit = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        if out == 0 || !empty {
            *audit = None;
            return 0;
        }
        let Some(a) = *audit else {
            *audit = Some(Audit { since: now, sent, released });
            return 0;
        };
        if now.saturating_duration_since(a.since) < GRACE {
            return 0;
        }
        *audit = None;
        // Places out when the audit began that no message has come for since.
        let stale = queued(a.sent, a.released).saturating_sub(released.wrapping_sub(a.released));
        let mut given = 0;
        let _ = self.released.fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
            given = stale.min(queued(sent, r));
            (given > 0).then(|| r.wrapping_add(given))
        });
        self.publish(w);
        given
    }
}

/// How much kernel memory datagrams take (their buffers' true size), measured once
/// per process on a socketpair (`SIOCOUTQ`): what a port's buffer is sized by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sizes {
    /// A datagram of [`SMALL_DATAGRAM`] bytes.
    pub(crate) small: usize,
    /// A datagram of `DATAGRAM_MAX` bytes.
    pub(crate) large: usize,
}

impl Sizes {
    /// This kernel's sizes (with a conservative guess if it will not say).
    pub(crate) fn here() -> Sizes {
        static SIZES: OnceLock<Sizes> = OnceLock::new();
        *SIZES.get_or_init(|| Sizes::measure().unwrap_or(Sizes { small: 2048, large: 80 << 10 }))
    }

    fn measure() -> rustix::io::Result<Sizes> {
        let (a, b) = sys::connection()?;
        let one = |len: usize| -> rustix::io::Result<usize> {
            let bytes = vec![0u8; len];
            sys::send(a.as_fd(), &[std::io::IoSlice::new(&bytes)], &[], Some(Instant::now()))?;
            let truesize = ictus_sys::socket::outq_len(a.as_fd())?;
            let mut buf = vec![0u8; len];
            let mut fds = Vec::new();
            sys::recv(b.as_fd(), &mut buf, &mut fds, true)?;
            Ok(truesize)
        };
        let small = one(SMALL_DATAGRAM)?;
        let large = one(ictus_abi::DATAGRAM_MAX)?;
        if small == 0 || large <= small {
            return Err(rustix::io::Errno::INVAL);
        }
        Ok(Sizes { small, large })
    }

    /// The send buffer a port with this queue limit asks for: every place small, the
    /// first few large, and room for what is not counted.
    pub(crate) fn buffer_wanted(&self, qlimit: u32) -> usize {
        let n = qlimit as usize;
        (n + UNCOUNTED_ROOM)
            .saturating_mul(self.small)
            .saturating_add((qlimit.min(LARGE_WANTED) as usize).saturating_mul(self.large - self.small))
    }

    /// How many places may hold large datagrams in a buffer of `sndbuf` bytes, so that
    /// `qlimit` counted messages always fit: a large one only in the first places, the
    /// rest small (a message whose datagram would be large goes with its in-line data
    /// in a memfd beyond them). Zero if even small ones do not all fit: the kernel's
    /// buffer then holds senders back before the count does.
    pub(crate) fn large_places(&self, sndbuf: usize, qlimit: u32) -> u32 {
        let small_all = (qlimit as usize + UNCOUNTED_ROOM).saturating_mul(self.small);
        let spare = sndbuf.saturating_sub(small_all);
        let n = spare / (self.large - self.small);
        u32::try_from(n).unwrap_or(u32::MAX).min(qlimit)
    }

    /// Whether `qlimit` small messages and the uncounted room fit in `sndbuf`.
    pub(crate) fn holds(&self, sndbuf: usize, qlimit: u32) -> bool {
        (qlimit as usize + UNCOUNTED_ROOM).saturating_mul(self.small) <= sndbuf
    }
}

/// A port's queue page: a memfd of one page, sealed against shrinking and growing (so
/// a mapping of it cannot fault), mapped shared and writable.
pub(crate) struct QueuePage {
    map: Mapping,
    /// The memfd: kept by the receiver (it travels with the receive right and in the
    /// note on each connection); senders keep only the mapping.
    fd: Option<OwnedFd>,
}

impl std::fmt::Debug for QueuePage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePage").field("queued", &self.words().queued()).finish()
    }
}

impl QueuePage {
    /// A new page.
    pub(crate) fn new() -> rustix::io::Result<QueuePage> {
        let fd = ictus_sys::memfd::create("ictus-queue", PAGE_LEN as u64)?;
        ictus_sys::memfd::add_seals(fd.as_fd(), SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Mapping::shared(fd.as_fd(), PAGE_LEN, Protection::ReadWrite)?;
        map.atomic_u32(MAGIC_AT).store(MAGIC, Ordering::Release);
        Ok(QueuePage { map, fd: Some(fd) })
    }

    /// Map an untrusted page that came with a receive right (`keep` the memfd) or in a
    /// connection's note (senders): a memfd of exactly one page that cannot shrink or
    /// grow, with the magic word. `None` if it is anything else.
    pub(crate) fn adopt(fd: OwnedFd, keep: bool) -> Option<QueuePage> {
        ictus_sys::memfd::check(fd.as_fd(), Size::Exactly(PAGE_LEN as u64), SealFlags::SHRINK | SealFlags::GROW)
            .ok()?;
        let map = Mapping::shared(fd.as_fd(), PAGE_LEN, Protection::ReadWrite).ok()?;
        if map.atomic_u32(MAGIC_AT).load(Ordering::Acquire) != MAGIC {
            return None;
        }
        Some(QueuePage { map, fd: keep.then_some(fd) })
    }

    /// The page's words.
    #[inline]
    pub(crate) fn words(&self) -> Words<'_> {
        Words {
            released: self.map.atomic_u32(RELEASED_AT),
            version: self.map.atomic_u32(VERSION_AT),
            sent: self.map.atomic_u32(SENT_AT),
            waiters: self.map.atomic_u32(WAITERS_AT),
        }
    }

    /// The memfd (the receiver's page only).
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Wake up to `n` senders sleeping on the queue.
    pub(crate) fn wake(&self, n: u32) {
        sys::futex_wake(self.words().released, n);
    }

    /// Put the note that leads senders to this page, with `settings`, in the queue of
    /// `recv_end`'s peer (the send end every send right of that connection shares),
    /// unless one is there already and `replace` is false (`SIOCOUTQ`: nothing but
    /// notes is ever sent that way).
    pub(crate) fn post_note(&self, recv_end: BorrowedFd<'_>, settings: Settings, replace: bool) {
        let Some(fd) = self.fd() else { return };
        if replace || ictus_sys::socket::outq_len(recv_end).is_ok_and(|n| n == 0) {
            let note = Note::encode(settings);
            let _ = sys::send(recv_end, &[std::io::IoSlice::new(&note)], &[fd], Some(Instant::now()));
        }
    }

    /// Find the page of the port a send end reaches, its settings and the page memfd's
    /// identity, from the note at the head of the send end's queue. `None` if there is
    /// none (a hostile holder took it, or the peer is not an ictus port): the sender
    /// then sends uncounted.
    pub(crate) fn find(send_end: BorrowedFd<'_>) -> Option<(QueuePage, Settings, (u64, u64))> {
        let (settings, fd) = peek_note(send_end)?;
        let file = sys::identity(fd.as_fd()).ok()?;
        Some((QueuePage::adopt(fd, false)?, settings, file))
    }

    /// The settings the note at the head of a send end's queue says, and its page
    /// memfd's identity (to tell whether it is still the page a sender has).
    pub(crate) fn read_note(send_end: BorrowedFd<'_>) -> Option<(Settings, (u64, u64))> {
        let (settings, fd) = peek_note(send_end)?;
        Some((settings, sys::identity(fd.as_fd()).ok()?))
    }
}

/// Peek the note at the head of a send end's queue: its settings and its memfd.
fn peek_note(send_end: BorrowedFd<'_>) -> Option<(Settings, OwnedFd)> {
    let mut buf = [0u8; Note::LEN + 1];
    let mut fds = Vec::new();
    let n = sys::peek(send_end, &mut buf, &mut fds).ok()?;
    let settings = Note::parse(&buf[..n])?;
    if fds.len() != 1 {
        return None;
    }
    Some((settings, fds.pop()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words in plain memory, laid out as in a page.
    #[derive(Default)]
    struct Mem([AtomicU32; 4]);

    impl Mem {
        fn words(&self) -> Words<'_> {
            Words { released: &self.0[0], version: &self.0[1], sent: &self.0[2], waiters: &self.0[3] }
        }
    }

    fn settings(qlimit: u32, large: u32) -> Settings {
        Settings { version: 1, qlimit, large, limit: 1 << 30 }
    }

    #[test]
    fn n_places_then_full_and_one_back_per_message_taken() {
        let m = Mem::default();
        let w = m.words();
        let s = settings(5, 2);
        let ledger = Ledger::default();
        for position in 1..=5 {
            assert_eq!(w.reserve(&s), Place::Taken { position, large: position <= 2 });
        }
        assert_eq!(w.reserve(&s), Place::Full);
        assert_eq!(ledger.queued(&w), 5);
        assert!(!ledger.release(&w), "nobody sleeps");
        assert_eq!(w.reserve(&s), Place::Taken { position: 5, large: false });
        assert_eq!(w.reserve(&s), Place::Full);
        // A message that was not sent gives its place back.
        w.cancel();
        assert_eq!(w.reserve(&s), Place::Taken { position: 5, large: false });
        w.waiters.store(1, Ordering::Relaxed);
        assert!(ledger.release(&w), "a sleeper is told to wake");
    }

    #[test]
    fn a_message_nobody_counted_gives_nothing_back() {
        let m = Mem::default();
        let w = m.words();
        let s = settings(2, 0);
        let ledger = Ledger::default();
        // Two counted messages, then three that were sent uncounted but flagged.
        assert!(matches!(w.reserve(&s), Place::Taken { .. }));
        assert!(matches!(w.reserve(&s), Place::Taken { .. }));
        for _ in 0..5 {
            ledger.release(&w);
        }
        assert_eq!((ledger.released(), ledger.queued(&w)), (2, 0), "never more back than taken");
        assert_eq!(w.released.load(Ordering::Relaxed), 2, "and the page says so");
    }

    #[test]
    fn what_a_sender_writes_is_only_a_claim() {
        let m = Mem::default();
        let w = m.words();
        let s = settings(3, 1);
        let ledger = Ledger::default();
        // `sent` pushed below `released` reads as an empty queue.
        w.sent.store(u32::MAX - 10, Ordering::Relaxed);
        assert_eq!(w.queued(), 0);
        assert!(matches!(w.reserve(&s), Place::Taken { position: 1, .. }));
        // `released` overwritten by a sender: the receiver's next release writes its own.
        w.sent.store(1, Ordering::Relaxed);
        w.released.store(1000, Ordering::Relaxed);
        ledger.release(&w);
        assert_eq!(w.released.load(Ordering::Relaxed), 1);
        // And so does a doorbell, at once: a `released` lowered to make the queue look
        // full is repaired by the first ring.
        w.sent.store(3, Ordering::Relaxed);
        w.released.store(0, Ordering::Relaxed);
        assert_eq!(w.reserve(&s), Place::Full);
        ledger.audit(&w, Instant::now(), false);
        assert_eq!(w.released.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn places_never_used_are_given_back_after_the_grace() {
        let m = Mem::default();
        let w = m.words();
        let s = settings(2, 0);
        let ledger = Ledger::default();
        let t0 = Instant::now();
        // A hostile sender takes both places and sends nothing.
        w.sent.store(2, Ordering::Relaxed);
        assert_eq!(w.reserve(&s), Place::Full);
        // A doorbell with the queue not empty: nothing to audit.
        assert_eq!(ledger.audit(&w, t0, false), 0);
        // Empty: the audit starts; too early to give anything back.
        assert_eq!(ledger.audit(&w, t0, true), 0);
        assert_eq!(ledger.audit(&w, t0 + GRACE / 2, true), 0);
        // The queue was seen non-empty in between: start again.
        assert_eq!(ledger.audit(&w, t0 + GRACE / 2, false), 0);
        assert_eq!(ledger.audit(&w, t0 + GRACE, true), 0);
        assert_eq!(ledger.audit(&w, t0 + GRACE * 2, true), 2, "both places back");
        assert_eq!(w.released.load(Ordering::Relaxed), 2);
        assert!(matches!(w.reserve(&s), Place::Taken { position: 1, .. }));
    }

    #[test]
    fn an_audit_gives_back_only_places_older_than_it() {
        let m = Mem::default();
        let w = m.words();
        let s = settings(4, 0);
        let ledger = Ledger::default();
        let t0 = Instant::now();
        // One place out (taken, never used), then the audit starts.
        assert!(matches!(w.reserve(&s), Place::Taken { .. }));
        assert_eq!(ledger.audit(&w, t0, true), 0);
        // Meanwhile a sender takes a place and its message is still on its way.
        assert!(matches!(w.reserve(&s), Place::Taken { .. }));
        assert_eq!(ledger.audit(&w, t0 + GRACE, true), 1, "only the place older than the audit");
        assert_eq!(ledger.queued(&w), 1);
        // Its message arrives: its place comes back, and nothing is left out.
        ledger.release(&w);
        assert_eq!(ledger.queued(&w), 0);
        // A message that came for an old place during the audit counts against it.
        assert!(matches!(w.reserve(&s), Place::Taken { .. }));
        assert!(matches!(w.reserve(&s), Place::Taken { .. }));
        assert_eq!(ledger.audit(&w, t0, true), 0);
        ledger.release(&w);
        assert_eq!(ledger.audit(&w, t0 + GRACE, true), 1);
        assert_eq!(ledger.queued(&w), 0);
    }

    #[test]
    fn a_buffer_holds_every_place_small_and_the_first_large() {
        let sizes = Sizes { small: 1280, large: 69_888 };
        for qlimit in [1, 5, 128, 1000] {
            let want = sizes.buffer_wanted(qlimit);
            assert_eq!(sizes.large_places(want, qlimit), qlimit.min(LARGE_WANTED), "qlimit {qlimit}");
            assert!(sizes.holds(want, qlimit));
            // The worst case the kernel sees before the last place: the large ones first,
            // then small ones, and still below the buffer (the kernel admits a datagram
            // while what is queued is below it).
            let large = sizes.large_places(want, qlimit) as usize;
            let worst = large * sizes.large + (qlimit as usize - large + UNCOUNTED_ROOM - 1) * sizes.small;
            assert!(worst < want, "qlimit {qlimit}: {worst} of {want}");
        }
        // A buffer the kernel capped: fewer large places, or none.
        assert_eq!(sizes.large_places(425_984, 128), 3);
        assert_eq!(sizes.large_places(425_984, 320), 0);
        assert!(!sizes.holds(425_984, 400));
    }

    #[test]
    fn this_kernel_says_how_big_datagrams_are() {
        let s = Sizes::measure().expect("SIOCOUTQ on a socketpair");
        assert!(s.small >= SMALL_DATAGRAM && s.large >= ictus_abi::DATAGRAM_MAX, "{s:?}");
    }

    #[test]
    fn notes_say_settings_and_nothing_else() {
        let s = Settings { version: 3, qlimit: 5, large: 2, limit: 4096 };
        assert_eq!(Note::parse(&Note::encode(s)), Some(s));
        let bad = |f: &dyn Fn(&mut [u8; Note::LEN])| {
            let mut b = Note::encode(s);
            f(&mut b);
            Note::parse(&b)
        };
        assert_eq!(bad(&|b| b[0] = b'X'), None, "magic");
        assert_eq!(bad(&|b| b[12..16].copy_from_slice(&0u32.to_le_bytes())), None, "no places");
        assert_eq!(bad(&|b| b[16..20].copy_from_slice(&6u32.to_le_bytes())), None, "more large than places");
        assert_eq!(bad(&|b| b[20..24].copy_from_slice(&u32::MAX.to_le_bytes())), None, "limit");
        assert_eq!(Note::parse(&Note::encode(s)[..Note::LEN - 1]), None, "short");
    }

    #[test]
    fn a_page_is_found_from_the_note_on_its_connection() {
        let page = QueuePage::new().unwrap();
        let s7 = Settings { version: 1, qlimit: 7, large: 1, limit: 4096 };
        let (s, r) = sys::connection().unwrap();
        page.post_note(r.as_fd(), s7, false);
        page.post_note(r.as_fd(), s7, false);
        let (found, settings, _) = QueuePage::find(s.as_fd()).expect("the page");
        assert_eq!(settings, s7);
        // The same memory: a place taken through one mapping shows in the other.
        assert!(matches!(found.words().reserve(&settings), Place::Taken { position: 1, .. }));
        assert_eq!(page.words().queued(), 1);
        // Peeking leaves the note for the next sender; only one was posted.
        assert!(QueuePage::find(s.as_fd()).is_some());
        assert_eq!(ictus_sys::socket::inq_len(s.as_fd()).unwrap(), Note::LEN);
        // Anything else is not a page.
        let (s2, r2) = sys::connection().unwrap();
        assert!(QueuePage::find(s2.as_fd()).is_none(), "no note");
        let bad = ictus_sys::memfd::create("not-a-page", PAGE_LEN as u64).unwrap();
        sys::send(r2.as_fd(), &[std::io::IoSlice::new(&Note::encode(s7))], &[bad.as_fd()], None).unwrap();
        assert!(QueuePage::find(s2.as_fd()).is_none(), "an unsealed memfd (it could shrink under the mapping)");
    }
}
