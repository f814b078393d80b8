//! The thin unsafe shell: a window's pixels in a memfd (made, sealed and mapped
//! through `ictus-sys`), seen here as `u32`s; and a client's frame bytes handed to a
//! copy in place.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ictus_sys::memfd::{self, SealFlags};
use ictus_sys::mm::{Mapping, Protection};

/// `w × h` pixels of `u32` in a memfd sealed against shrinking and growing, mapped
/// shared and writable here; the X server maps it read-only (MIT-SHM `ShmAttachFd`).
#[derive(Debug)]
pub struct Pixels {
    map: Mapping,
    len: usize,
    fd: OwnedFd,
    /// Width.
    pub w: usize,
    /// Height.
    pub h: usize,
}

impl Pixels {
    /// New pixels, all `color`.
    pub fn new(w: usize, h: usize, color: u32) -> rustix::io::Result<Pixels> {
        let len = w.checked_mul(h).filter(|&n| n > 0).ok_or(rustix::io::Errno::INVAL)?;
        let bytes = len.checked_mul(4).ok_or(rustix::io::Errno::INVAL)?;
        let fd = memfd::create("ictus-display-window", bytes as u64)?;
        // Nobody can shrink it under a mapping (ours or the X server's): no SIGBUS.
        memfd::add_seals(fd.as_fd(), SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Mapping::shared(fd.as_fd(), bytes, Protection::ReadWrite)?;
        let mut px = Pixels { map, len, fd, w, h };
        px.as_mut_slice().fill(color);
        Ok(px)
    }

    /// The pixels.
    pub fn as_slice(&self) -> &[u32] {
        // SAFETY: the mapping holds `len` u32s (4 × len bytes, page-aligned so aligned
        // for u32) for as long as `self`; in this process only `&mut self` writes them,
        // and the only other mapping, the X server's, is read-only, so nothing changes
        // them while this borrow lives.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<u32>(), self.len) }
    }

    /// The pixels, to draw on.
    pub fn as_mut_slice(&mut self) -> &mut [u32] {
        // SAFETY: as for `as_slice`; `&mut self` makes this the only reference here.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().cast::<u32>(), self.len) }
    }

    /// The pixels as bytes (little-endian `0x00RRGGBB`), to fill in place.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len * 4;
        // SAFETY: the same memory as `as_mut_slice`, viewed as bytes (no alignment
        // needed, every bit pattern valid), borrowed mutably from `self`.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr(), n) }
    }

    /// The memfd, to attach to the X server.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Hands a client's shared bytes to `f` as a slice, for a straight copy.
///
/// The client may write the bytes while `f` runs (they are in its memory): `f` must
/// only copy them somewhere (a torn read gives the client a torn picture of its own,
/// nothing else), never parse them.
pub fn with_shared<R>(p: ictus_shm::Payload<'_>, f: impl FnOnce(&[u8]) -> R) -> R {
    // SAFETY: the payload is mapped for its lifetime (checked by ictus-shm); the only
    // use of the slice is a copy, where a concurrent write by the client changes which
    // bytes are copied and nothing the compiler relies on (see Payload::as_slice).
    f(unsafe { p.as_slice() })
}
