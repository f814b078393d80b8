//! The thin unsafe shell: a window's pixels in a memfd, mapped into the server and
//! (read-only, through MIT-SHM's `ShmAttachFd`) into the X server.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// `w × h` pixels of `u32` in a sealed-size memfd, mapped shared and writable here.
#[derive(Debug)]
pub struct Pixels {
    ptr: NonNull<u32>,
    len: usize,
    fd: OwnedFd,
    /// Width.
    pub w: usize,
    /// Height.
    pub h: usize,
}

// SAFETY: the mapping is owned by this value; access goes through `&self`/`&mut self`
// (one writer, guarded by the window's lock). The X server maps the same memory
// read-only in another process, outside Rust's reach; it only reads.
unsafe impl Send for Pixels {}
// SAFETY: shared access hands out only `&[u32]` views of memory nothing else in this
// process writes while they live (writes need `&mut self`).
unsafe impl Sync for Pixels {}

impl Pixels {
    /// New pixels, all `color`.
    pub fn new(w: usize, h: usize, color: u32) -> rustix::io::Result<Pixels> {
        let len = w.checked_mul(h).filter(|&n| n > 0).ok_or(rustix::io::Errno::INVAL)?;
        let bytes = len * 4;
        let fd = rustix::fs::memfd_create("ictus-display-window", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, bytes as u64)?;
        // Nobody can shrink it under a mapping (ours or the X server's): no SIGBUS.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        // SAFETY: a fresh shared mapping of a file `bytes` long (sealed against
        // shrinking), at an address the kernel chooses: it aliases no Rust object.
        // mmap(2).
        let p = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), bytes, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)?
        };
        let ptr = NonNull::new(p.cast::<u32>()).ok_or(rustix::io::Errno::NOMEM)?;
        let mut px = Pixels { ptr, len, fd, w, h };
        px.as_mut_slice().fill(color);
        Ok(px)
    }

    /// The pixels.
    pub fn as_slice(&self) -> &[u32] {
        // SAFETY: `ptr` maps `len` u32s (page-aligned) for as long as `self` lives;
        // writes in this process need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The pixels, to draw on.
    pub fn as_mut_slice(&mut self) -> &mut [u32] {
        // SAFETY: as for `as_slice`; `&mut self` makes this the only reference here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The memfd, to attach to the X server.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Pixels {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, with its length; no slice outlives `self`.
        // munmap(2).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len * 4) };
    }
}

/// Slack of this thread's timers: 1 ns, so a frame's timed wake-up is not deferred
/// by the default 50 µs (`PR_SET_TIMERSLACK`, no privilege needed).
pub fn exact_timers() {
    // SAFETY: prctl(2) with PR_SET_TIMERSLACK takes an integer and touches no memory.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
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

/// Make a child started by `cmd` die with the thread that starts it
/// (`PR_SET_PDEATHSIG`), so that a test killed midway leaves no Xvfb behind.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    let pre = || -> std::io::Result<()> {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
        Ok(())
    };
    // SAFETY: the closure makes one async-signal-safe system call (prctl) and
    // allocates nothing, as required between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, pre);
    }
}

/// A `u32` slice as its bytes (little-endian on the machines ictus runs on).
pub fn u32_bytes_mut(s: &mut [u32]) -> &mut [u8] {
    let len = s.len() * 4;
    // SAFETY: u8 has no alignment requirement and every bit pattern is valid; the
    // byte slice covers exactly the u32 slice's memory and borrows it mutably.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), len) }
}
