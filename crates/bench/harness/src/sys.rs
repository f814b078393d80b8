//! The benchmark's Linux calls that need `unsafe`, in one place.
//!
//! Everything else in the harness and in the experiments is safe code over `rustix` and
//! the standard library; what `rustix` does not wrap (`getrusage`, `mincore`,
//! `SO_TIMESTAMPNS` and its control message), what is unsafe by nature (`mmap`, code
//! that runs between `fork` and `exec`, taking ownership of an inherited descriptor)
//! lives here, each call with the man page that makes it sound.
//!
//! This is the benchmark's share of the OS layer that issue 14 asks for; when the
//! workspace's shared one (`ictus-sys`) lands, these wrappers become calls into it, and
//! nothing outside this file changes.
//!
//! # References
//!
//! mmap(2), munmap(2), madvise(2), mincore(2), getrusage(2), fcntl(2), prctl(2)
//! (`PR_SET_PDEATHSIG`), setsockopt(2), socket(7) (`SO_TIMESTAMPNS`), recvmsg(2),
//! cmsg(3).

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

use rustix::mm::{MapFlags, ProtFlags};
use rustix::process::Signal;

// ---------------------------------------------------------------------------------
// Memory mappings.

/// A shared mapping of a file or memfd, unmapped on drop.
///
/// Its bytes are reachable only through raw pointers ([`Mapping::area`]) or
/// [`Mapping::as_slice`], whose caller promises that nothing changes them meanwhile:
/// another process may share the mapping, so no safe `&[u8]` can be handed out.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; every access through it
// is either atomic or raw (with its own obligations), so moving it or sharing it
// between threads adds no hazard.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` hands out only atomics and raw pointers.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` shared, read-write (a memfd both ends of a
    /// peer use). Fails if the file is shorter than `len`, which would turn accesses
    /// past its end into `SIGBUS`.
    pub fn shared(fd: impl AsFd, len: usize) -> io::Result<Mapping> {
        Self::map(fd.as_fd(), len, ProtFlags::READ | ProtFlags::WRITE)
    }

    /// Maps the first `len` bytes of `file` shared, read-only: touching them faults the
    /// file's pages in; mapping them does not.
    pub fn file_readonly(file: &File, len: usize) -> io::Result<Mapping> {
        Self::map(file.as_fd(), len, ProtFlags::READ)
    }

    fn map(fd: BorrowedFd<'_>, len: usize, prot: ProtFlags) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot map zero bytes"));
        }
        let file_len = rustix::fs::fstat(fd)?.st_size;
        if u64::try_from(file_len).map_or(true, |l| l < len as u64) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the file is smaller than the mapping"));
        }
        // SAFETY: a new mapping at an address the kernel picks (null hint, no
        // MAP_FIXED) aliases no Rust object; `len` bytes of the file exist (checked
        // above), so the whole range is backed (mmap(2)).
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0)? };
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { base, len })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: mappings have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 32-bit atomic at `offset`, which must be 4-byte aligned and inside the
    /// mapping (else this panics).
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset % 4 == 0 && offset.checked_add(4).is_some_and(|end| end <= self.len), "bad atomic offset");
        // SAFETY: the address is inside the mapping and 4-byte aligned (the base is
        // page-aligned), and the mapping lives as long as the borrow of `self`. Every
        // user of the shared word accesses it atomically, which is what `AtomicU32`
        // permits through a shared reference.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// The 64-bit atomic at `offset`, 8-byte aligned and inside the mapping.
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset % 8 == 0 && offset.checked_add(8).is_some_and(|end| end <= self.len), "bad atomic offset");
        // SAFETY: as for `atomic_u32`, with 8-byte alignment checked.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// A raw pointer to the `len` bytes at `offset`, which must be inside the mapping
    /// (else this panics). Reading or writing through it is the caller's business.
    pub fn area(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "area outside the mapping");
        // SAFETY: `offset + len` is within the mapping (checked above), so the result
        // points into the same allocation (pointer::add).
        unsafe { self.base.as_ptr().add(offset) }
    }

    /// The mapped bytes.
    ///
    /// # Safety
    ///
    /// While the slice lives, nothing may write to the mapped bytes (through this
    /// mapping, another one, or `write(2)` to the file) nor truncate the file, which
    /// would raise `SIGBUS` on access.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `base` starts a live, readable mapping of `len` bytes that lasts as
        // long as the borrow of `self`; the caller promises its content does not
        // change meanwhile.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// Fraction of the mapping's pages in the page cache (`mincore`); it observes
    /// without faulting anything in.
    pub fn resident_fraction(&self) -> io::Result<f64> {
        let page = rustix::param::page_size();
        let pages = self.len.div_ceil(page);
        let mut vec = vec![0u8; pages];
        // SAFETY: `base` is page-aligned (returned by mmap) and `len` bytes from it are
        // mapped; `vec` has one writable byte per page of that range (mincore(2)).
        let rc = unsafe { libc::mincore(self.base.as_ptr().cast(), self.len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are exactly what mmap returned and was given; no
        // borrow of the mapping outlives `self` (munmap(2)).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Private anonymous memory, unmapped on drop; only this value reaches it, so its
/// bytes are an ordinary `&mut [u8]`.
#[derive(Debug)]
pub struct AnonMemory {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: private anonymous memory owned by this value alone; access goes through
// `&mut self`, so the borrow checker serializes it.
unsafe impl Send for AnonMemory {}

impl AnonMemory {
    /// `len` bytes of zeroed memory, reserved lazily (`MAP_NORESERVE`): pages are
    /// allocated as they are first touched.
    pub fn new(len: usize) -> io::Result<AnonMemory> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot map zero bytes"));
        }
        // SAFETY: a fresh anonymous private mapping at an address the kernel picks
        // aliases nothing (mmap(2)).
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )?
        };
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(AnonMemory { base, len })
    }

    /// The memory.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` readable, writable bytes owned by this value alone; the
        // exclusive borrow of `self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }

    /// Gives the pages back to the kernel; the next touch faults in zeroed pages.
    pub fn discard(&mut self) {
        // SAFETY: the range is this value's own private anonymous mapping, and no
        // reference into it is alive (exclusive borrow); MADV_DONTNEED only replaces
        // its contents with zero pages (madvise(2)).
        let _ = unsafe { rustix::mm::madvise(self.base.as_ptr().cast(), self.len, rustix::mm::Advice::LinuxDontNeed) };
    }
}

impl Drop for AnonMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference outlives
        // `self` (munmap(2)).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

// ---------------------------------------------------------------------------------
// Processes.

/// A command for a process that must not outlive its parent: the child gets
/// `death_signal` when the thread that spawned it exits (`PR_SET_PDEATHSIG`), and may
/// inherit some descriptors under their own numbers.
///
/// The lifetime ties the inherited descriptors to the command: they stay open until
/// it is spawned.
#[derive(Debug)]
pub struct GuardedCommand<'fd> {
    command: Command,
    inherit: Vec<RawFd>,
    death_signal: Signal,
    check_parent: bool,
    fds: PhantomData<BorrowedFd<'fd>>,
}

impl<'fd> GuardedCommand<'fd> {
    /// `program` with `args`, standard input from `/dev/null`, dying with
    /// `death_signal` when the spawning thread exits.
    pub fn new(program: impl AsRef<std::ffi::OsStr>, death_signal: Signal) -> Self {
        let mut command = Command::new(program);
        command.stdin(Stdio::null());
        GuardedCommand { command, inherit: Vec::new(), death_signal, check_parent: false, fds: PhantomData }
    }

    /// The command, to add arguments and set its standard streams or process group.
    pub fn command(&mut self) -> &mut Command {
        &mut self.command
    }

    /// Keeps `fds` open in the child under the same numbers (their close-on-exec flag
    /// is cleared in the child only, between fork and exec, so the parent's copies and
    /// other children spawned meanwhile are unaffected).
    pub fn inherit(mut self, fds: &[BorrowedFd<'fd>]) -> Self {
        self.inherit.extend(fds.iter().map(AsRawFd::as_raw_fd));
        self
    }

    /// Fails the spawn if the parent has already exited by the time the death signal
    /// is armed (the signal would then never come).
    pub fn check_parent(mut self) -> Self {
        self.check_parent = true;
        self
    }

    /// Starts the process.
    pub fn spawn(mut self) -> io::Result<Child> {
        let inherit = std::mem::take(&mut self.inherit);
        let signal = self.death_signal;
        let parent = self.check_parent.then(rustix::process::getpid);
        let before_exec = move || -> io::Result<()> {
            // Only async-signal-safe work happens here (raw system calls, no
            // allocation): this runs in the forked child of a possibly multi-threaded
            // parent.
            for &fd in &inherit {
                // SAFETY: `fd` belongs to a descriptor borrowed for 'fd, which outlives
                // this spawn, and fork duplicated it into this child, so it is open here.
                let fd = unsafe { BorrowedFd::borrow_raw(fd) };
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            }
            rustix::process::set_parent_process_death_signal(Some(signal))?;
            if let Some(parent) = parent {
                if rustix::process::getppid() != Some(parent) {
                    return Err(io::Error::other("the parent exited during spawn"));
                }
            }
            Ok(())
        };
        // SAFETY: the closure only makes async-signal-safe system calls (fcntl, prctl,
        // getppid) on data captured before the fork, and allocates nothing
        // (CommandExt::pre_exec, signal-safety(7)).
        unsafe {
            self.command.pre_exec(before_exec);
        }
        self.command.spawn()
    }
}

/// Takes ownership of descriptor `fd`, inherited from the parent: fails unless it is
/// open and above the standard three. Call it at most once per descriptor.
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd <= 2 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("fd {fd} is a standard stream")));
    }
    // SAFETY: F_GETFD reads descriptor flags and touches no memory; on a closed
    // descriptor it fails with EBADF, which is what we test for (fcntl(2)).
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open (checked above) and was inherited for this role
    // alone; nothing else in this freshly exec'd process refers to it, so the OwnedFd
    // is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

// ---------------------------------------------------------------------------------
// Resource usage.

/// The calling process's CPU time and page faults so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// User CPU time.
    pub user: Duration,
    /// System CPU time.
    pub sys: Duration,
    /// Page faults served without I/O.
    pub minor_faults: u64,
    /// Page faults that needed I/O.
    pub major_faults: u64,
}

/// `getrusage(RUSAGE_SELF)`: every thread of the process, io_uring's kernel workers
/// included; zeros if the call fails.
pub fn process_usage() -> Usage {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` points to writable memory for one rusage that outlives the call
    // (getrusage(2)).
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return Usage::default();
    }
    // SAFETY: all-zero bytes are a valid rusage (integers only), and getrusage has
    // filled it in.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.clamp(0, 999_999) * 1000) as u32);
    Usage {
        user: tv(ru.ru_utime),
        sys: tv(ru.ru_stime),
        minor_faults: ru.ru_minflt.max(0) as u64,
        major_faults: ru.ru_majflt.max(0) as u64,
    }
}

// ---------------------------------------------------------------------------------
// Sockets.

/// Asks the kernel to stamp each datagram of socket `fd` with the time it was queued
/// to the socket (`SO_TIMESTAMPNS`, `CLOCK_REALTIME`), read with [`recv_stamped`].
pub fn enable_receive_timestamps(fd: impl AsFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: `fd` is an open socket; the option value is a live `c_int` whose size is
    // passed with it (setsockopt(2), socket(7) `SO_TIMESTAMPNS`).
    let r = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            std::ptr::from_ref(&one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One datagram into `buf` without blocking (`MSG_DONTWAIT`): its length and the
/// kernel's stamp (`CLOCK_REALTIME` ns) if the socket has [`enable_receive_timestamps`];
/// `None` if nothing is queued.
pub fn recv_stamped(fd: impl AsFd, buf: &mut [u8]) -> io::Result<Option<(usize, Option<u64>)>> {
    #[repr(C, align(8))]
    struct Control([u8; 128]);
    let mut control = Control([0; 128]);
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is a valid "no name, no iov, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    // SAFETY: `msg` points at `iov` (our buffer and its length) and `control`, all
    // live for the call (recvmsg(2)).
    let n = unsafe { libc::recvmsg(fd.as_fd().as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    let mut stamp = None;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, bounded by
    // the `msg_controllen` it set (cmsg(3)); the timestamp is read unaligned from
    // inside a header of type SCM_TIMESTAMPNS, whose payload is a `timespec`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some((n as usize, stamp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_mapping_of_a_memfd_is_checked_and_shared() {
        let fd = rustix::fs::memfd_create("ictus-sys-test", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
        rustix::fs::ftruncate(&fd, 8192).expect("size");
        assert!(Mapping::shared(&fd, 8193).is_err(), "larger than the file");
        assert!(Mapping::shared(&fd, 0).is_err());
        let a = Mapping::shared(&fd, 8192).expect("map");
        let b = Mapping::shared(&fd, 8192).expect("map again");
        a.atomic_u32(4).store(7, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(b.atomic_u32(4).load(std::sync::atomic::Ordering::SeqCst), 7);
        a.atomic_u64(8).store(9, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(b.atomic_u64(8).load(std::sync::atomic::Ordering::SeqCst), 9);
        assert!(std::panic::catch_unwind(|| a.atomic_u32(2).load(std::sync::atomic::Ordering::SeqCst)).is_err());
        assert!(std::panic::catch_unwind(|| a.area(8000, 193)).is_err());
        assert!((0.0..=1.0).contains(&a.resident_fraction().expect("mincore")));
    }

    #[test]
    fn anonymous_memory_is_zeroed_again_after_discard() {
        let mut m = AnonMemory::new(3 * 4096).expect("map");
        m.as_mut_slice()[5000] = 3;
        m.discard();
        assert!(m.as_mut_slice().iter().all(|&b| b == 0));
    }

    #[test]
    fn inherited_descriptors_are_checked() {
        assert!(take_inherited_fd(1).is_err());
        assert!(take_inherited_fd(1_000_000).is_err());
    }

    #[test]
    fn datagrams_carry_the_kernels_stamp() {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::DGRAM, SocketFlags::CLOEXEC, None)
            .expect("socketpair");
        enable_receive_timestamps(&b).expect("SO_TIMESTAMPNS");
        let mut buf = [0u8; 8];
        assert_eq!(recv_stamped(&b, &mut buf).expect("empty"), None);
        rustix::net::send(&a, b"hi", rustix::net::SendFlags::empty()).expect("send");
        let (n, stamp) = recv_stamped(&b, &mut buf).expect("recv").expect("a datagram");
        assert_eq!(&buf[..n], b"hi");
        assert!(stamp.is_some_and(|s| s > 0));
    }

    #[test]
    fn usage_grows() {
        let a = process_usage();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        let b = process_usage();
        assert!(b.user + b.sys >= a.user + a.sys);
    }
}
