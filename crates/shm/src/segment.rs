//! A channel's shared memory, mapped: the rings as [`RingMem`], payloads as views.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::layout::{self, Geometry};
use crate::ring::RingMem;
use crate::sync::{AtomicU32, AtomicU64};
use crate::sys::Mapping;

/// A mapped channel and the geometry this side trusts (never re-read from memory).
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) map: Mapping,
    pub(crate) geo: Geometry,
}

impl Segment {
    pub(crate) fn word32(&self, off: usize) -> &AtomicU32 {
        self.map.atomic_u32(off)
    }

    pub(crate) fn word64(&self, off: usize) -> &AtomicU64 {
        self.map.atomic_u64(off)
    }

    /// Write the header (server side, before the client sees the memory).
    pub(crate) fn write_header(&self) {
        use crate::sync::Ordering::Relaxed;
        let g = &self.geo;
        self.word64(layout::OFF_MAGIC).store(layout::MAGIC, Relaxed);
        self.word32(layout::OFF_VERSION).store(layout::VERSION, Relaxed);
        self.word64(layout::OFF_REQ_CAP).store(g.request.cap, Relaxed);
        self.word64(layout::OFF_REP_CAP).store(g.reply.cap, Relaxed);
        self.word32(layout::OFF_SLOTS).store(g.pool.slots, Relaxed);
        self.word32(layout::OFF_SLOT_SIZE).store(g.pool.slot_size, Relaxed);
        self.word64(layout::OFF_TOTAL).store(g.total(), Relaxed);
    }

    /// Whether the header says what this side was told (client side).
    pub(crate) fn header_matches(&self) -> bool {
        use crate::sync::Ordering::Relaxed;
        let g = &self.geo;
        self.word64(layout::OFF_MAGIC).load(Relaxed) == layout::MAGIC
            && self.word32(layout::OFF_VERSION).load(Relaxed) == layout::VERSION
            && self.word64(layout::OFF_REQ_CAP).load(Relaxed) == g.request.cap
            && self.word64(layout::OFF_REP_CAP).load(Relaxed) == g.reply.cap
            && self.word32(layout::OFF_SLOTS).load(Relaxed) == g.pool.slots
            && self.word32(layout::OFF_SLOT_SIZE).load(Relaxed) == g.pool.slot_size
            && self.word64(layout::OFF_TOTAL).load(Relaxed) == g.total()
    }

    /// The request ring.
    pub(crate) fn request(self: &Arc<Self>) -> ShmRing {
        ShmRing {
            seg: self.clone(),
            head: layout::REQ_HEAD,
            tail: layout::REQ_TAIL,
            data: self.geo.request_at() as usize,
            words: (self.geo.request.cap / 8) as usize,
        }
    }

    /// The reply ring.
    pub(crate) fn reply(self: &Arc<Self>) -> ShmRing {
        ShmRing {
            seg: self.clone(),
            head: layout::REP_HEAD,
            tail: layout::REP_TAIL,
            data: self.geo.reply_at() as usize,
            words: (self.geo.reply.cap / 8) as usize,
        }
    }

    /// Entry `i` of the release ring.
    pub(crate) fn release_entry(&self, i: u64) -> &AtomicU32 {
        let slots = u64::from(self.geo.pool.slots.max(1));
        self.word32(layout::REL_RING + (i % slots) as usize * 4)
    }

    /// Pool slot `slot`, `len` bytes of it.
    pub(crate) fn slot(&self, slot: u32, len: usize) -> *mut u8 {
        assert!(slot < self.geo.pool.slots && len <= self.geo.pool.slot_size as usize);
        self.map.ptr_at(self.geo.slot_at(slot) as usize, len)
    }
}

/// One ring of a mapped channel.
#[derive(Debug, Clone)]
pub(crate) struct ShmRing {
    pub(crate) seg: Arc<Segment>,
    head: usize,
    tail: usize,
    data: usize,
    words: usize,
}

impl ShmRing {
    /// `len` bytes at ring offset `at`.
    pub(crate) fn bytes(&self, at: u64, len: usize) -> *mut u8 {
        assert!(at as usize + len <= self.words * 8);
        self.seg.map.ptr_at(self.data + at as usize, len)
    }
}

impl RingMem for ShmRing {
    fn head(&self) -> &AtomicU64 {
        self.seg.word64(self.head)
    }

    fn tail(&self) -> &AtomicU64 {
        self.seg.word64(self.tail)
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.words);
        self.seg.word64(self.data + i * 8)
    }
}

/// A payload in shared memory, read in place.
///
/// The bytes live in memory the other process can write. The channel's *structure*
/// (counters, headers, lengths, slots) is copied out once and checked, so a peer that
/// keeps writing cannot make this side read outside the channel; but the *payload* is
/// the peer's data, and a misbehaving peer may change it while it is read. Treat it
/// as untrusted input, parsed once: copy it out ([`Payload::copy_to`],
/// [`Payload::to_vec`]) before parsing anything whose consistency matters, or hand
/// its address to something that copies ([`Payload::as_ptr`]: a device, the kernel,
/// a display).
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a> {
    ptr: *const u8,
    len: usize,
    _mem: PhantomData<&'a Segment>,
}

impl<'a> Payload<'a> {
    pub(crate) fn new(ptr: *const u8, len: usize) -> Payload<'a> {
        Payload { ptr, len, _mem: PhantomData }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte (valid while the record is held).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Copy the first `dst.len()` bytes (at most [`Payload::len`]) into `dst`;
    /// returns how many were copied.
    pub fn copy_to(&self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len);
        // SAFETY: `ptr..ptr+len` is inside the mapping for `'a` (checked when the
        // payload was made); `dst` is separate local memory. A concurrent write by the
        // peer can only change which bytes are copied.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, dst.as_mut_ptr(), n) };
        n
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.copy_to(&mut v);
        v
    }

    /// Reads one byte per 4 KiB page and the last byte, returning their sum: to touch
    /// a large payload in place (a receiver that maps what it receives).
    pub fn touch_pages(&self) -> u64 {
        let mut sum = 0u64;
        let mut i = 0;
        while i < self.len {
            // SAFETY: `i < len`, inside the mapping; a volatile read of one byte the
            // peer may be writing yields some byte, never anything undefined.
            sum += u64::from(unsafe { self.ptr.add(i).read_volatile() });
            i += 4096;
        }
        if self.len > 0 {
            // SAFETY: the last byte, as above.
            sum += u64::from(unsafe { self.ptr.add(self.len - 1).read_volatile() });
        }
        sum
    }

    /// The bytes as a slice, in place.
    ///
    /// # Safety
    ///
    /// The peer must not write these bytes while the slice lives: a well-behaved peer
    /// does not write a record after committing it, but a misbehaving one can, and
    /// Rust assumes memory behind a `&[u8]` does not change. Use it for data from a
    /// peer that is trusted not to do that, or where a torn read is harmless and the
    /// compiler's assumption cannot matter (bytes handed straight to a copy).
    pub unsafe fn as_slice(&self) -> &'a [u8] {
        // SAFETY: in bounds for `'a`; immutability is the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
