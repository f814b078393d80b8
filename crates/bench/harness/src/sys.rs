//! The benchmark's Linux calls that need `unsafe`, in one place.
//!
//! Everything else in the harness and in the experiments is safe code over `rustix`,
//! the workspace's OS layer (`ictus-sys`: mappings, memfds) and the standard library.
//! What neither wraps and the benchmark alone needs lives here, each call with the man
//! page that makes it sound: `mincore` (is a file's page cached?), `getrusage`,
//! `SO_TIMESTAMPNS` and its control message, the code that runs between `fork` and
//! `exec`, taking ownership of an inherited descriptor; and, over `ictus-sys`'s
//! [`Mapping`], a length check before mapping a file and private memory as a plain
//! `&mut [u8]`.
//!
//! # References
//!
//! mincore(2), getrusage(2), fcntl(2), prctl(2) (`PR_SET_PDEATHSIG`), setsockopt(2),
//! socket(7) (`SO_TIMESTAMPNS`), recvmsg(2), cmsg(3).

#![allow(unsafe_code)]

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rustix::process::Signal;

// ---------------------------------------------------------------------------------
// Memory mappings: the workspace's OS layer's, and what the benchmark adds.

pub use ictus_sys::mm::{Mapping, Protection};

/// Maps the first `len` bytes of a file shared, after checking that the file is at
/// least that long: a mapping past the end of a file turns accesses into `SIGBUS`.
pub fn map_file(fd: impl AsFd, len: usize, prot: Protection) -> io::Result<Mapping> {
    let file_len = rustix::fs::fstat(fd.as_fd())?.st_size;
    if u64::try_from(file_len).map_or(true, |l| l < len as u64) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the file is smaller than the mapping"));
    }
    Ok(Mapping::shared(fd.as_fd(), len, prot)?)
}

/// Fraction of a mapping's pages in the page cache (`mincore`); it observes without
/// faulting anything in.
pub fn resident_fraction(map: &Mapping) -> io::Result<f64> {
    let page = rustix::param::page_size();
    let pages = map.len().div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: the mapping starts page-aligned (mmap returned it) and its `len` bytes are
    // mapped while `map` is borrowed; `vec` has one writable byte per page of that
    // range (mincore(2)).
    let rc = unsafe { libc::mincore(map.as_ptr().cast(), map.len(), vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64)
}

/// Private anonymous memory that only this value reaches, so its bytes are an
/// ordinary `&mut [u8]`.
#[derive(Debug)]
pub struct AnonMemory(Mapping);

impl AnonMemory {
    /// `len` bytes of zeroed memory, reserved lazily (`MAP_NORESERVE`): pages are
    /// allocated as they are first touched.
    pub fn new(len: usize) -> io::Result<AnonMemory> {
        Ok(AnonMemory(Mapping::anonymous(len)?))
    }

    /// The memory.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: a private anonymous mapping (writable) that this value alone holds: no
        // other mapping of it exists, and `&mut self` makes this the only view.
        unsafe { self.0.as_mut_slice() }
    }

    /// Gives the pages back to the kernel; the next touch faults in zeroed pages.
    pub fn discard(&mut self) {
        let _ = self.0.advise(ictus_sys::mm::Advice::LinuxDontNeed);
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
    fn a_file_is_mapped_only_if_long_enough() {
        let fd = ictus_sys::memfd::create("ictus-bench-sys-test", 8192).expect("memfd");
        assert!(map_file(&fd, 8193, Protection::ReadWrite).is_err(), "larger than the file");
        let a = map_file(&fd, 8192, Protection::ReadWrite).expect("map");
        let b = map_file(&fd, 8192, Protection::Read).expect("map again");
        a.atomic_u32(4).store(7, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(b.atomic_u32(4).load(std::sync::atomic::Ordering::SeqCst), 7);
        assert!((0.0..=1.0).contains(&resident_fraction(&b).expect("mincore")));
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
