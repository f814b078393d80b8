//! Out-of-line memory: regions that travel by reference, never copied by ictus.
//!
//! A sender writes into an [`OolBuffer`], a `memfd` mapped into its address space.
//! Sending it moves it: the sender's mapping is removed, the memfd is sealed against
//! writing, shrinking and growing, and the descriptor travels with the message. The
//! receiver checks the seals before it trusts the region and maps it read-only as an
//! [`OolRegion`]. So the receiver knows that nobody — the sender included — can change
//! what it got, which is the guarantee Mach's copy-on-write gave.

use std::fmt;
use std::os::fd::{AsFd, OwnedFd};

use ictus_sys::mm::{Advice, Mapping, Protection};

use crate::sys;

/// Regions at least this large ask for transparent huge pages.
const HUGE_PAGE: usize = 2 << 20;

/// A writable out-of-line buffer, backed by an anonymous memfd.
pub struct OolBuffer {
    fd: OwnedFd,
    map: Mapping,
}

/// A received out-of-line region: read-only, sealed, never changing.
pub struct OolRegion {
    // Field order matters: the mapping is released before the descriptor.
    map: Mapping,
    _fd: OwnedFd,
}

/// Why an out-of-line buffer could not be made or sent.
#[derive(Debug, thiserror::Error)]
pub enum OolError {
    /// Zero-length regions are not sent; send nothing instead.
    #[error("out-of-line buffers must not be empty")]
    Empty,
    /// The region is larger than the wire allows.
    #[error("out-of-line buffer of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// The kernel refused.
    #[error("out-of-line memory: {0}")]
    Os(#[from] rustix::io::Errno),
}

impl OolBuffer {
    /// A zero-filled buffer of `len` bytes.
    pub fn new(len: usize) -> Result<OolBuffer, OolError> {
        if len == 0 {
            return Err(OolError::Empty);
        }
        if len as u64 > ictus_abi::OOL_MAX {
            return Err(OolError::TooLarge(len));
        }
        let fd = sys::memfd(len)?;
        let mut map = Mapping::shared(fd.as_fd(), len, Protection::ReadWrite)?;
        if len >= HUGE_PAGE {
            // Ask for 2 MiB pages before the first write places any: where the system
            // allows them for shared memory (transparent_hugepage/shmem_enabled =
            // advise), mapping, unmapping and freeing a 16 MiB region handles 8 pages
            // instead of 4096, about 35 times cheaper. Elsewhere the advice is ignored.
            let _ = map.advise(Advice::LinuxHugepage);
        }
        Ok(OolBuffer { fd, map })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Result<OolBuffer, OolError> {
        let mut b = OolBuffer::new(data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true: empty buffers cannot be made.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Give up the writable mapping and seal the memfd: from here on nobody can change
    /// its contents. The sealed descriptor is what travels.
    pub(crate) fn seal(self) -> Result<(OwnedFd, u64), OolError> {
        let OolBuffer { fd, map } = self;
        let len = map.len() as u64;
        drop(map);
        sys::seal(fd.as_fd())?;
        Ok((fd, len))
    }
}

impl std::ops::Deref for OolBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the memfd was made by `OolBuffer::new` and is owned by this buffer
        // alone: no other mapping or descriptor of it exists until `seal` gives up the
        // mapping, so nothing changes the bytes behind this borrow.
        unsafe { self.map.as_slice() }
    }
}

impl std::ops::DerefMut for OolBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`: this writable mapping is the only way to the memfd's
        // bytes, and `&mut self` makes this the only borrow of it.
        unsafe { self.map.as_mut_slice() }
    }
}

impl fmt::Debug for OolBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OolBuffer").field("len", &self.map.len()).finish()
    }
}

impl OolRegion {
    /// Map a received, already validated sealed memfd of `len` bytes read-only.
    /// `populate` maps every page up front (one system call instead of a fault per page).
    pub(crate) fn map(fd: OwnedFd, len: u64, populate: bool) -> rustix::io::Result<OolRegion> {
        let len = usize::try_from(len).map_err(|_| rustix::io::Errno::NOMEM)?;
        let map = if populate {
            Mapping::shared_populated(fd.as_fd(), len, Protection::Read)?
        } else {
            Mapping::shared(fd.as_fd(), len, Protection::Read)?
        };
        Ok(OolRegion { map, _fd: fd })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true: empty regions are refused on the wire.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl std::ops::Deref for OolRegion {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the memfd was checked to be sealed against writing, shrinking and
        // growing before it was mapped (`sys::check_sealed_memfd`, by the receive path),
        // so nobody, its sender included, can change these bytes again.
        unsafe { self.map.as_slice() }
    }
}

impl AsRef<[u8]> for OolRegion {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for OolRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OolRegion").field("len", &self.map.len()).finish()
    }
}
