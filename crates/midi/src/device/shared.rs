//! A shared mapping of a memory file, reached only through atomics.
//!
//! The cable's ring ([`super::ring`]) lives in a memfd that two processes map. Either may
//! change any byte at any time, so nothing here hands out a `&[u8]`, which Rust assumes
//! nobody changes while it is borrowed: counters are `AtomicU64`/`AtomicU32` and the
//! ring's bytes `AtomicU8`, all sound to share with a peer that does anything at all.
//!
//! (The OS layer `ictus-sys` being written beside this has the same `Mapping`; this one
//! goes when that lands.)

use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

use rustix::mm::{MapFlags, ProtFlags};

/// What a mapping may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protection {
    /// `PROT_READ`: only loads (a store would fault).
    Read,
    /// `PROT_READ | PROT_WRITE`.
    ReadWrite,
}

/// `len` bytes of a file mapped shared, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is a range of the address space owned by this value; nothing in it
// is tied to a thread, and its bytes are reached only through atomics.
unsafe impl Send for Mapping {}
// SAFETY: shared access hands out atomics only.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `mmap(NULL, len, prot, MAP_SHARED | MAP_POPULATE, fd, 0)`.
    ///
    /// The caller has checked that the file is at least `len` bytes long and sealed
    /// against shrinking (`F_SEAL_SHRINK`), so no access inside the mapping can fault
    /// with `SIGBUS`.
    ///
    /// # References
    /// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html)
    pub(crate) fn shared(fd: BorrowedFd<'_>, len: usize, prot: Protection) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let flags = match prot {
            Protection::Read => ProtFlags::READ,
            Protection::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
        };
        // SAFETY: a fresh mapping at an address the kernel chooses (a null hint without
        // MAP_FIXED) replaces nothing and aliases no Rust object. mmap(2).
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, flags, MapFlags::SHARED | MapFlags::POPULATE, fd, 0)?
        };
        let ptr = NonNull::new(ptr.cast()).ok_or(io::ErrorKind::OutOfMemory)?;
        Ok(Mapping { ptr, len })
    }

    fn at(&self, offset: usize, len: usize, align: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len) && offset.is_multiple_of(align),
            "{len} bytes at {offset} (alignment {align}) outside a mapping of {}",
            self.len
        );
        // SAFETY: `offset + len <= self.len` (checked above): inside the mapping.
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// The 64-bit atomic at byte `offset` (8-aligned, inside; panics otherwise).
    pub(crate) fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        let p = self.at(offset, 8, 8);
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned, `offset` a
        // multiple of 8: checked in `at`), alive as long as `self`. Memory shared with
        // another process is sound to reach through atomics, whatever it does to it.
        unsafe { &*p.cast::<AtomicU64>() }
    }

    /// The 32-bit atomic at byte `offset` (4-aligned, inside; panics otherwise).
    pub(crate) fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        let p = self.at(offset, 4, 4);
        // SAFETY: as for `atomic_u64`, 4-aligned.
        unsafe { &*p.cast::<AtomicU32>() }
    }

    /// `len` bytes at `offset` as atomics (inside; panics otherwise).
    pub(crate) fn atomic_bytes(&self, offset: usize, len: usize) -> &[AtomicU8] {
        let p = self.at(offset, len, 1);
        // SAFETY: `len` bytes in bounds (checked in `at`), alive as long as `self`;
        // `AtomicU8` has the size and alignment of `u8`, and atomics are sound to share.
        unsafe { std::slice::from_raw_parts(p.cast::<AtomicU8>(), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping `mmap` returned, unmapped once, here; every
        // reference handed out borrowed `self`, so none outlives this. munmap(2).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
