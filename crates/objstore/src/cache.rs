//! A node's stripe cache: chunks of clips fetched from the store, kept in one memfd so
//! that MARS's engine reads them like any device — by descriptor, through io_uring,
//! into its registered buffers (`Storage::devices` and `Storage::plan` of
//! `servers/mars-server/src/volume.rs`). The cache is also what a node reports to the
//! director as the clips it has cached.
//!
//! Slots of `chunk` bytes; a chunk is looked up by (clip, chunk index). A slot holds one
//! contiguous part of its chunk — all of it, or a part fetched first because a stream
//! needs it now (a resume, a seek) — and grows when a part touching it is inserted. A plan
//! of a range pins the slots it names until it is released, so a read in flight never
//! sees its slot reused (a part added to a pinned slot is written only outside what the
//! slot already held, where no planned read can be); unpinned slots are evicted least
//! recently used first.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Why the cache refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    /// Every slot is pinned by a plan not yet released.
    #[error("every one of the {0} cache slots is pinned")]
    Full(usize),
    /// A part that is empty or crosses a chunk boundary.
    #[error("part at {offset} of {len} bytes: not within one chunk of {chunk} bytes")]
    BadChunk {
        /// Offset given.
        offset: u64,
        /// Length given.
        len: u64,
        /// The cache's chunk size.
        chunk: u64,
    },
    /// The memfd could not be made or written.
    #[error("stripe cache memfd: {0}")]
    Io(String),
}

/// One read of a planned range: `len` bytes at `offset` of the cache's descriptor, into
/// the caller's buffer at `at` (the shape of MARS's `DeviceRead`, on device 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheRead {
    /// Offset in the cache's memfd.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Where in the caller's buffer.
    pub at: u64,
}

/// A plan of a range: the reads, and the slots pinned until [`StripeCache::release`].
#[derive(Debug, PartialEq, Eq)]
pub struct Lease {
    /// The reads, in order.
    pub reads: Vec<CacheRead>,
    slots: Vec<usize>,
}

#[derive(Debug)]
struct Slot {
    key: Option<(String, u64)>,
    /// The part held: `len` bytes from `from` within the chunk.
    from: u64,
    len: u64,
    last_use: u64,
    pins: u32,
}

/// The cache.
#[derive(Debug)]
pub struct StripeCache {
    fd: OwnedFd,
    chunk: u64,
    slots: Vec<Slot>,
    index: HashMap<(String, u64), usize>,
    clock: u64,
}

impl StripeCache {
    /// A cache of `slots` chunks of `chunk` bytes, in a memfd whose size is sealed.
    pub fn new(chunk: u64, slots: usize) -> Result<StripeCache, CacheError> {
        if chunk == 0 || slots == 0 {
            return Err(CacheError::BadChunk { offset: 0, len: 0, chunk });
        }
        let bytes = chunk.checked_mul(slots as u64).ok_or(CacheError::Io("size overflows".into()))?;
        let fd = ictus_sys::memfd::create("ictus-stripe-cache", bytes).map_err(|e| CacheError::Io(e.to_string()))?;
        ictus_sys::memfd::add_seals(
            fd.as_fd(),
            ictus_sys::memfd::SealFlags::SHRINK | ictus_sys::memfd::SealFlags::GROW | ictus_sys::memfd::SealFlags::SEAL,
        )
        .map_err(|e| CacheError::Io(e.to_string()))?;
        let slots = (0..slots).map(|_| Slot { key: None, from: 0, len: 0, last_use: 0, pins: 0 }).collect();
        Ok(StripeCache { fd, chunk, slots, index: HashMap::new(), clock: 0 })
    }

    /// The descriptor the engine reads (its only device).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Bytes per chunk.
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Whether any part of the chunk at `offset` of `clip` is held.
    pub fn contains(&self, clip: &str, offset: u64) -> bool {
        offset % self.chunk == 0 && self.index.contains_key(&(clip.to_string(), offset / self.chunk))
    }

    /// Whether `[offset, offset + len)` of `clip`, within one chunk, is held.
    pub fn holds(&self, clip: &str, offset: u64, len: u64) -> bool {
        let (ci, within) = (offset / self.chunk, offset % self.chunk);
        self.index.get(&(clip.to_string(), ci)).is_some_and(|&i| {
            let s = &self.slots[i];
            s.from <= within && within.saturating_add(len) <= s.from + s.len
        })
    }

    /// The clips with at least one chunk held (what the node reports to the director).
    pub fn clips(&self) -> BTreeSet<String> {
        self.index.keys().map(|(c, _)| c.clone()).collect()
    }

    /// Puts `bytes`, the part of `clip` at `offset` (within one chunk: a whole chunk, the
    /// clip's shorter tail, or a part a stream needs first), in the chunk's slot if it has
    /// one — merged with what the slot holds when the two touch or overlap, else in place
    /// of it unless the slot is pinned — or in a free or least recently used unpinned slot.
    pub fn insert(&mut self, clip: &str, offset: u64, bytes: &[u8]) -> Result<(), CacheError> {
        let len = bytes.len() as u64;
        let (ci, within) = (offset / self.chunk, offset % self.chunk);
        if len == 0 || within + len > self.chunk {
            return Err(CacheError::BadChunk { offset, len, chunk: self.chunk });
        }
        let key = (clip.to_string(), ci);
        self.clock += 1;
        // What of the slot to write (bytes within the chunk), and what it then holds.
        let (slot, write, held) = match self.index.get(&key) {
            Some(&i) => {
                let s = &self.slots[i];
                let (a, b, c, d) = (within, within + len, s.from, s.from + s.len);
                if a <= d && c <= b {
                    // Touching or overlapping: merged. A pinned slot gets only the new
                    // bytes outside its held part (a planned read lies within it).
                    let (lo, hi) = (a.min(c), b.max(d));
                    let mut w = Vec::new();
                    if s.pins == 0 {
                        w.push((a, b));
                    } else {
                        if a < c {
                            w.push((a, c));
                        }
                        if b > d {
                            w.push((d, b));
                        }
                    }
                    (i, w, (lo, hi - lo))
                } else if s.pins > 0 {
                    // Apart from a part being read: keep that one.
                    self.slots[i].last_use = self.clock;
                    return Ok(());
                } else {
                    (i, vec![(a, b)], (a, len))
                }
            }
            None => {
                let victim = (0..self.slots.len())
                    .filter(|&i| self.slots[i].pins == 0)
                    .min_by_key(|&i| (self.slots[i].key.is_some(), self.slots[i].last_use))
                    .ok_or(CacheError::Full(self.slots.len()))?;
                if let Some(old) = self.slots[victim].key.take() {
                    self.index.remove(&old);
                }
                (victim, vec![(within, within + len)], (within, len))
            }
        };
        let at = slot as u64 * self.chunk;
        for (lo, hi) in write {
            let src = &bytes[(lo - within) as usize..(hi - within) as usize];
            let mut done = 0usize;
            while done < src.len() {
                let n = rustix::io::pwrite(&self.fd, &src[done..], at + lo + done as u64)
                    .map_err(|e| CacheError::Io(e.to_string()))?;
                done += n;
            }
        }
        let s = &mut self.slots[slot];
        s.key = Some(key.clone());
        (s.from, s.len) = held;
        s.last_use = self.clock;
        self.index.insert(key, slot);
        Ok(())
    }

    /// The reads covering `[start, start + len)` of `clip` if every chunk of it is held
    /// (their slots pinned until the lease is released), else `None`.
    pub fn plan(&mut self, clip: &str, start: u64, len: u64) -> Option<Lease> {
        let end = start.checked_add(len)?;
        let mut reads = Vec::new();
        let mut slots = Vec::new();
        let mut pos = start;
        while pos < end {
            let ci = pos / self.chunk;
            let &slot = self.index.get(&(clip.to_string(), ci))?;
            let within = pos - ci * self.chunk;
            let (from, held) = (self.slots[slot].from, self.slots[slot].from + self.slots[slot].len);
            if within < from || within >= held {
                return None;
            }
            let n = (held - within).min(end - pos);
            reads.push(CacheRead { offset: slot as u64 * self.chunk + within, len: n, at: pos - start });
            slots.push(slot);
            pos += n;
        }
        self.clock += 1;
        for &s in &slots {
            self.slots[s].pins += 1;
            self.slots[s].last_use = self.clock;
        }
        Some(Lease { reads, slots })
    }

    /// The reads of `lease` are done: its slots may be reused.
    pub fn release(&mut self, lease: Lease) {
        for s in lease.slots {
            self.slots[s].pins -= 1;
        }
    }

    /// Releases one pin of the slot holding byte `offset` of the cache's descriptor:
    /// for a reader that keeps the reads of a lease and gives each back as it completes
    /// (MARS's engine, one device read at a time). Returns whether a pin was held.
    pub fn release_at(&mut self, offset: u64) -> bool {
        let Some(s) = usize::try_from(offset / self.chunk).ok().and_then(|i| self.slots.get_mut(i)) else {
            return false;
        };
        if s.pins == 0 {
            return false;
        }
        s.pins -= 1;
        true
    }

    /// Forgets a lease without releasing its pins (they are released one read at a time
    /// with [`StripeCache::release_at`]); returns its reads.
    pub fn into_reads(lease: Lease) -> Vec<CacheRead> {
        lease.reads
    }

    /// Executes a plan with `pread` (for tests and tools; the engine uses io_uring).
    pub fn read(&self, lease: &Lease, buf: &mut [u8]) -> Result<(), CacheError> {
        for r in &lease.reads {
            let dst = &mut buf[r.at as usize..(r.at + r.len) as usize];
            let mut done = 0usize;
            while done < dst.len() {
                let n = rustix::io::pread(&self.fd, &mut dst[done..], r.offset + done as u64)
                    .map_err(|e| CacheError::Io(e.to_string()))?;
                if n == 0 {
                    return Err(CacheError::Io("short read of the cache".into()));
                }
                done += n;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plans_cross_chunks_and_pins_their_slots() {
        let mut c = StripeCache::new(100, 3).unwrap();
        let clip: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
        for off in [0u64, 100, 200] {
            c.insert("a", off, &clip[off as usize..(off as usize + 100).min(250)]).unwrap();
        }
        assert_eq!(c.clips(), BTreeSet::from(["a".to_string()]));
        let lease = c.plan("a", 50, 180).unwrap();
        assert_eq!(lease.reads.len(), 3);
        let mut buf = vec![0u8; 180];
        c.read(&lease, &mut buf).unwrap();
        assert_eq!(buf, clip[50..230]);
        // Past the tail: not held.
        assert!(c.plan("a", 240, 20).is_none());
        assert!(c.plan("b", 0, 1).is_none());
        // All three slots pinned: nothing can be evicted.
        assert_eq!(c.insert("b", 0, &[1; 100]), Err(CacheError::Full(3)));
        c.release(lease);
        c.insert("b", 0, &[1; 100]).unwrap();
        assert!(c.contains("b", 0));
        // Chunks must be chunks.
        // A part must lie within one chunk.
        assert!(matches!(c.insert("b", 95, &[1; 10]), Err(CacheError::BadChunk { .. })));
        assert!(matches!(c.insert("b", 100, &[1; 101]), Err(CacheError::BadChunk { .. })));
        assert!(matches!(c.insert("b", 100, &[]), Err(CacheError::BadChunk { .. })));
        // Pins given back read by read.
        let lease = c.plan("a", 100, 150).unwrap();
        let mut reads = StripeCache::into_reads(lease);
        assert_eq!(reads.len(), 2);
        reads.extend(StripeCache::into_reads(c.plan("b", 0, 100).unwrap()));
        assert_eq!(c.insert("d", 0, &[2; 100]), Err(CacheError::Full(3)));
        assert!(reads.iter().all(|r| c.release_at(r.offset)));
        assert!(!c.release_at(reads[0].offset), "a pin is given back once");
        assert!(!c.release_at(1 << 40));
        c.insert("d", 0, &[2; 100]).unwrap();
        // The memfd's size is sealed.
        assert!(rustix::fs::ftruncate(c.fd(), 1 << 20).is_err());
    }

    proptest! {
        /// Against a model (a map of what was inserted last): whatever a plan reads is the
        /// bytes inserted for that range; pinned chunks survive any insert; at most `slots`
        /// chunks are held.
        #[test]
        fn reads_what_was_inserted(ops in proptest::collection::vec((0u8..3, 0u8..2, 0u64..8, 1u64..64, any::<u8>()), 1..80)) {
            let chunk = 16u64;
            let mut c = StripeCache::new(chunk, 4).unwrap();
            let mut model: HashMap<(String, u64), Vec<u8>> = HashMap::new();
            let mut leases: Vec<(String, u64, u64, Lease)> = Vec::new();
            for (kind, clip, ci, len, fill) in ops {
                let name = format!("c{clip}");
                match kind {
                    0 => {
                        let bytes: Vec<u8> = (0..chunk).map(|i| fill.wrapping_add(i as u8)).collect();
                        match c.insert(&name, ci * chunk, &bytes) {
                            Ok(()) => {
                                let pinned = leases.iter().any(|(n, s, l, _)| n == &name && ci * chunk < s + l && *s < (ci + 1) * chunk);
                                if !pinned {
                                    model.insert((name.clone(), ci), bytes);
                                }
                            }
                            Err(CacheError::Full(_)) => prop_assert!(!leases.is_empty()),
                            Err(e) => prop_assert!(false, "{}", e),
                        }
                    }
                    1 => {
                        let start = ci * chunk + len % chunk;
                        if let Some(lease) = c.plan(&name, start, len) {
                            let mut buf = vec![0u8; len as usize];
                            c.read(&lease, &mut buf).unwrap();
                            for (i, b) in buf.iter().enumerate() {
                                let p = start + i as u64;
                                let want = model.get(&(name.clone(), p / chunk)).map(|v| v[(p % chunk) as usize]);
                                prop_assert_eq!(Some(*b), want, "byte {} of {}", p, name);
                            }
                            leases.push((name, start, len, lease));
                        }
                    }
                    _ => {
                        if let Some((_, _, _, l)) = leases.pop() {
                            c.release(l);
                        }
                    }
                }
                prop_assert!(c.index.len() <= 4);
                // The model forgets what the cache evicted.
                model.retain(|(n, ci), _| c.contains(n, ci * chunk));
            }
        }

        /// Parts of chunks, inserted in any order: a plan reads exactly the clip's bytes;
        /// an insert leaves its part held (unless the chunk's slot is pinned holding a
        /// part apart from it); and what a pinned slot held is never written — the test
        /// puts wrong bytes over the held part of a pinned slot, and every outstanding
        /// lease must still read the clip's bytes.
        #[test]
        fn parts_merge_and_never_change_under_a_read(ops in proptest::collection::vec((0u8..3, 0u8..2, 0u64..6, 0u64..16, 1u64..16), 1..120)) {
            let chunk = 16u64;
            let truth = |clip: u8, p: u64| (p as u8).wrapping_mul(7).wrapping_add(clip.wrapping_mul(101));
            let mut c = StripeCache::new(chunk, 3).unwrap();
            let mut leases: Vec<(u8, u64, Lease)> = Vec::new();
            for (kind, clip, ci, a, n) in ops {
                let name = format!("c{clip}");
                match kind {
                    0 => {
                        let (a, n) = (a.min(chunk - 1), n.min(chunk - a.min(chunk - 1)));
                        let off = ci * chunk + a;
                        let slot = c.index.get(&(name.clone(), ci)).map(|&i| (c.slots[i].from, c.slots[i].len, c.slots[i].pins));
                        let mut bytes: Vec<u8> = (off..off + n).map(|p| truth(clip, p)).collect();
                        let mut blocked = false;
                        if let Some((from, len, pins)) = slot {
                            let touching = a <= from + len && from <= a + n;
                            blocked = pins > 0 && !touching;
                            if pins > 0 {
                                for (i, b) in bytes.iter_mut().enumerate() {
                                    let w = a + i as u64;
                                    if w >= from && w < from + len {
                                        *b = !*b;
                                    }
                                }
                            }
                        }
                        match c.insert(&name, off, &bytes) {
                            Ok(()) => {
                                if !blocked {
                                    prop_assert!(c.holds(&name, off, n));
                                    if let Some((from, len, _)) = slot.filter(|&(f, l, _)| a <= f + l && f <= a + n) {
                                        prop_assert!(c.holds(&name, ci * chunk + from, len), "the held part stays held");
                                    }
                                }
                            }
                            Err(CacheError::Full(_)) => prop_assert!(!leases.is_empty()),
                            Err(e) => prop_assert!(false, "{}", e),
                        }
                    }
                    1 => {
                        let start = ci * chunk + a;
                        if let Some(lease) = c.plan(&name, start, n) {
                            leases.push((clip, start, lease));
                        }
                    }
                    _ => {
                        if let Some((_, _, l)) = leases.pop() {
                            c.release(l);
                        }
                    }
                }
                for (clip, start, lease) in &leases {
                    let len: u64 = lease.reads.iter().map(|r| r.len).sum();
                    let mut buf = vec![0u8; len as usize];
                    c.read(lease, &mut buf).unwrap();
                    for (i, b) in buf.iter().enumerate() {
                        prop_assert_eq!(*b, truth(*clip, start + i as u64), "byte {} of c{}", start + i as u64, clip);
                    }
                }
            }
        }
    }
}
