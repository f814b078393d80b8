//! Memory mappings: `mmap(2)`, `munmap(2)`, `madvise(2)`, as a value that unmaps
//! itself.
//!
//! A [`Mapping`] owns a range of the address space. Shared mappings of files (memfds,
//! mostly) may be changed by other processes at any time, so the mapping hands out
//! raw pointers and atomics, which are sound under concurrent change; a byte slice,
//! which Rust assumes nobody changes while it is borrowed, only through `unsafe`
//! methods whose callers say why that holds (a memfd sealed against writing, one that
//! nobody else has yet).
//!
//! A shared mapping of a file faults with `SIGBUS` where the file is shorter than the
//! mapping. Callers map only files they have checked are long enough and sealed
//! against shrinking (see [`crate::memfd::check`]).

use std::fmt;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::io::Errno;
pub use rustix::mm::Advice;
use rustix::mm::{MapFlags, ProtFlags};

/// What a mapping may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// `PROT_READ`.
    Read,
    /// `PROT_READ | PROT_WRITE`.
    ReadWrite,
}

impl Protection {
    fn flags(self) -> ProtFlags {
        match self {
            Protection::Read => ProtFlags::READ,
            Protection::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
        }
    }
}

/// A mapping of `len` bytes at an address the kernel chose, unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is a range of the address space owned by this value; nothing in it
// is tied to a thread, and the bytes are reached only through raw pointers, atomics or
// `unsafe` views whose callers vouch for them.
unsafe impl Send for Mapping {}
// SAFETY: shared access hands out raw pointers, atomics, and (through `unsafe`) `&[u8]`
// views; changing the mapping itself (advice, `&mut [u8]`) needs `&mut`.
unsafe impl Sync for Mapping {}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl Mapping {
    /// `mmap(NULL, len, prot, MAP_SHARED, fd, 0)`: map the first `len` bytes of a file.
    ///
    /// `EINVAL` for a length of zero. The caller has checked that the file is at least
    /// `len` bytes long and cannot shrink, or accepts that an access past its end
    /// faults with `SIGBUS`.
    ///
    /// # References
    /// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html)
    pub fn shared(fd: BorrowedFd<'_>, len: usize, prot: Protection) -> rustix::io::Result<Mapping> {
        Mapping::map_shared(fd, len, prot, MapFlags::SHARED)
    }

    /// `mmap(NULL, len, prot, MAP_SHARED | MAP_POPULATE, fd, 0)`: as [`Mapping::shared`],
    /// with every page present before this returns (one system call instead of a fault
    /// per page).
    ///
    /// # References
    /// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html), `MAP_POPULATE`
    pub fn shared_populated(fd: BorrowedFd<'_>, len: usize, prot: Protection) -> rustix::io::Result<Mapping> {
        Mapping::map_shared(fd, len, prot, MapFlags::SHARED | MapFlags::POPULATE)
    }

    fn map_shared(fd: BorrowedFd<'_>, len: usize, prot: Protection, flags: MapFlags) -> rustix::io::Result<Mapping> {
        if len == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: a fresh mapping at an address the kernel chooses (a null hint without
        // MAP_FIXED) replaces nothing and aliases no Rust object. mmap(2).
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot.flags(), flags, fd, 0)? };
        Ok(Mapping { ptr: NonNull::new(ptr.cast()).ok_or(Errno::NOMEM)?, len })
    }

    /// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
    /// MAP_NORESERVE, -1, 0)`: private zero-filled memory, no swap reserved for it.
    ///
    /// # References
    /// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html), `MAP_ANONYMOUS`,
    ///   `MAP_NORESERVE`
    pub fn anonymous(len: usize) -> rustix::io::Result<Mapping> {
        if len == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses replaces
        // nothing and aliases no Rust object. mmap(2).
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )?
        };
        Ok(Mapping { ptr: NonNull::new(ptr.cast()).ok_or(Errno::NOMEM)?, len })
    }

    /// Length in bytes (never zero).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: empty mappings cannot be made.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// `len` bytes at byte `offset`, as a raw pointer. Panics if the range is not inside
    /// the mapping.
    pub fn ptr_at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "bytes {offset}+{len} outside a mapping of {}",
            self.len
        );
        // SAFETY: `offset + len <= self.len` (checked above), so the result stays inside
        // the mapping.
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// The 32-bit atomic at byte `offset`. Panics if it is not 4-byte aligned or not
    /// inside the mapping.
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset % 4 == 0, "atomic_u32 at unaligned offset {offset}");
        let p = self.ptr_at(offset, 4);
        // SAFETY: in bounds (ptr_at), 4-byte aligned (the mapping is page-aligned and the
        // offset a multiple of 4), alive as long as `self`. Memory shared with other
        // processes is sound to reach through atomics, whatever they do to it.
        unsafe { &*p.cast::<AtomicU32>() }
    }

    /// The 64-bit atomic at byte `offset`. Panics if it is not 8-byte aligned or not
    /// inside the mapping.
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset % 8 == 0, "atomic_u64 at unaligned offset {offset}");
        let p = self.ptr_at(offset, 8);
        // SAFETY: as for `atomic_u32`, 8-byte aligned.
        unsafe { &*p.cast::<AtomicU64>() }
    }

    /// The whole mapping as bytes.
    ///
    /// # Safety
    ///
    /// While the slice lives, nobody may change the mapped bytes: not another mapping of
    /// the same file in this or another process, not a `write(2)` to the file. A memfd
    /// sealed with `F_SEAL_WRITE` guarantees it.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives; that they
        // do not change while borrowed is the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole mapping as writable bytes.
    ///
    /// # Safety
    ///
    /// The mapping is writable ([`Protection::ReadWrite`] or anonymous), and while the
    /// slice lives nobody else reads or writes the mapped bytes: no other mapping of
    /// the same file is used, in this or another process (a file nobody else holds, or
    /// a private mapping).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` bytes for as long as `self` lives; `&mut self` makes
        // this the only view through this mapping, and the caller vouches for the rest.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// `madvise(ptr, len, advice)` over the whole mapping: for example
    /// [`Advice::LinuxHugepage`] before the first write, so that the pages placed are
    /// transparent huge pages where the system allows it, or [`Advice::LinuxDontNeed`]
    /// to give pages back (an anonymous private mapping then reads as zeros again).
    /// Takes `&mut self` because some advice changes what the mapping reads.
    ///
    /// # References
    /// - [`madvise(2)`](https://man7.org/linux/man-pages/man2/madvise.2.html)
    pub fn advise(&mut self, advice: Advice) -> rustix::io::Result<()> {
        // SAFETY: advice on exactly the range this value mapped; no `&[u8]` borrowed from
        // it is alive (`&mut self`), so advice that discards contents breaks no borrow.
        unsafe { rustix::mm::madvise(self.ptr.as_ptr().cast(), self.len, advice) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range mmap returned; nothing borrowed from the mapping
        // outlives it (every view borrows `self`). munmap(2).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The system's policy for transparent huge pages in shared memory: the bracketed
/// word of `/sys/kernel/mm/transparent_hugepage/shmem_enabled` (`always`, `within_size`,
/// `advise`, `never`, `deny`, `force`), which decides whether [`Advice::LinuxHugepage`]
/// gives a memfd mapping 2 MiB pages. `None` if the kernel does not say.
///
/// # References
/// - [Transparent Hugepage Support](https://docs.kernel.org/admin-guide/mm/transhuge.html),
///   `shmem_enabled`
pub fn shmem_thp_policy() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok()?;
    bracketed(&s).map(str::to_string)
}

/// The word between the first `[` and the following `]`.
fn bracketed(s: &str) -> Option<&str> {
    let start = s.find('[')? + 1;
    let end = start + s[start..].find(']')?;
    Some(&s[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering;

    #[test]
    fn shared_mappings_of_one_file_see_each_other() {
        let fd = crate::memfd::create("mm-test", 8192).unwrap();
        let a = Mapping::shared(fd.as_fd(), 8192, Protection::ReadWrite).unwrap();
        let b = Mapping::shared_populated(fd.as_fd(), 8192, Protection::Read).unwrap();
        a.atomic_u64(4096).store(0x1122_3344_5566_7788, Ordering::SeqCst);
        a.atomic_u32(8188).store(9, Ordering::SeqCst);
        assert_eq!(b.atomic_u64(4096).load(Ordering::SeqCst), 0x1122_3344_5566_7788);
        assert_eq!(b.atomic_u32(8188).load(Ordering::SeqCst), 9);
        assert_eq!(a.len(), 8192);
        assert!(!a.is_empty());
    }

    #[test]
    fn empty_mappings_are_refused() {
        let fd = crate::memfd::create("mm-test", 4096).unwrap();
        assert_eq!(Mapping::shared(fd.as_fd(), 0, Protection::Read).unwrap_err(), Errno::INVAL);
        assert_eq!(Mapping::anonymous(0).unwrap_err(), Errno::INVAL);
    }

    #[test]
    #[should_panic(expected = "outside a mapping")]
    fn atomics_outside_the_mapping_panic() {
        let m = Mapping::anonymous(4096).unwrap();
        let _ = m.atomic_u32(4096);
    }

    #[test]
    #[should_panic(expected = "unaligned")]
    fn unaligned_atomics_panic() {
        let m = Mapping::anonymous(4096).unwrap();
        let _ = m.atomic_u64(4);
    }

    #[test]
    fn anonymous_memory_reads_as_zeros_again_after_dont_need() {
        let mut m = Mapping::anonymous(1 << 16).unwrap();
        // SAFETY: a private anonymous mapping nobody else can reach.
        unsafe { m.as_mut_slice() }.fill(7);
        m.advise(Advice::LinuxDontNeed).unwrap();
        // SAFETY: as above.
        assert!(unsafe { m.as_slice() }.iter().all(|&b| b == 0));
        // Huge-page advice is accepted (or ignored) on any range.
        let _ = m.advise(Advice::LinuxHugepage);
    }

    #[test]
    fn the_policy_is_the_bracketed_word() {
        assert_eq!(bracketed("always within_size [advise] never deny force\n"), Some("advise"));
        assert_eq!(bracketed("[never]"), Some("never"));
        assert_eq!(bracketed("always never"), None);
        assert_eq!(bracketed("[unterminated"), None);
        if let Some(p) = shmem_thp_policy() {
            assert!(!p.is_empty() && !p.contains(' '));
        }
    }
}
