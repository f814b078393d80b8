//! The thin shell over Linux: thread priorities by thread id, PI futexes in shared
//! pages, memfds, and descriptor passing. Everything unsafe in the crate is here.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use ictus_rt::thread::Policy;
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::thread::futex;

/// Bytes in a shared page (the status page and each connection's page).
pub(crate) const PAGE: usize = 4096;

/// The calling thread's id.
pub(crate) fn gettid() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

fn attr_for(policy: Policy) -> libc::sched_attr {
    let mut attr = libc::sched_attr {
        size: std::mem::size_of::<libc::sched_attr>() as u32,
        sched_policy: 0,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: 0,
        sched_deadline: 0,
        sched_period: 0,
    };
    match policy {
        Policy::Other { nice } => {
            attr.sched_policy = libc::SCHED_OTHER as u32;
            attr.sched_nice = nice;
        }
        Policy::Fifo { priority } => {
            attr.sched_policy = libc::SCHED_FIFO as u32;
            attr.sched_priority = u32::from(priority);
        }
        Policy::RoundRobin { priority } => {
            attr.sched_policy = libc::SCHED_RR as u32;
            attr.sched_priority = u32::from(priority);
        }
        Policy::Deadline { runtime, deadline, period } => {
            attr.sched_policy = 6; // SCHED_DEADLINE
            attr.sched_runtime = runtime.as_nanos() as u64;
            attr.sched_deadline = deadline.as_nanos() as u64;
            attr.sched_period = period.as_nanos() as u64;
        }
    }
    attr
}

/// `sched_setattr(tid, policy)`: sets the scheduling class of any thread the caller may
/// change (its own process's, or any with `CAP_SYS_NICE`).
///
/// # References
/// - [`sched_setattr(2)`](https://man7.org/linux/man-pages/man2/sched_setattr.2.html)
pub(crate) fn set_thread_policy(tid: u32, policy: Policy) -> io::Result<()> {
    let attr = attr_for(policy);
    // SAFETY: sched_setattr(tid, attr, 0) reads `attr.size` bytes from `attr`, a live
    // sched_attr whose size field is its own size; it touches no other memory.
    let rc =
        unsafe { libc::syscall(libc::SYS_sched_setattr, tid as libc::pid_t, &attr as *const libc::sched_attr, 0u32) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `sched_getattr(tid)`: the thread's own (not inherited) scheduling class.
pub fn thread_policy(tid: u32) -> io::Result<Policy> {
    let mut attr = attr_for(Policy::DEFAULT);
    let size = attr.size;
    // SAFETY: sched_getattr writes at most `size` bytes into `attr`, a live, writable
    // sched_attr of exactly that size.
    let rc = unsafe {
        libc::syscall(libc::SYS_sched_getattr, tid as libc::pid_t, &mut attr as *mut libc::sched_attr, size, 0u32)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let prio = u8::try_from(attr.sched_priority).unwrap_or(u8::MAX);
    Ok(match attr.sched_policy as i32 {
        libc::SCHED_FIFO => Policy::Fifo { priority: prio },
        libc::SCHED_RR => Policy::RoundRobin { priority: prio },
        6 => Policy::Deadline {
            runtime: Duration::from_nanos(attr.sched_runtime),
            deadline: Duration::from_nanos(attr.sched_deadline),
            period: Duration::from_nanos(attr.sched_period),
        },
        _ => Policy::Other { nice: attr.sched_nice },
    })
}

/// A thread's *effective* priority as the scheduler uses it, inheritance included:
/// field 18 of `/proc/<pid>/task/<tid>/stat` (`-1 - rt_priority` for a real-time
/// thread, `nice + 20` otherwise). For tests and diagnostics.
pub fn effective_priority(pid: u32, tid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(15)?.parse().ok()
}

/// Whether `tid` is a thread of process `pid` (so a peer cannot make us change the
/// priority of some other process's thread).
pub(crate) fn is_thread_of(pid: u32, tid: u32) -> bool {
    rustix::fs::stat(format!("/proc/{pid}/task/{tid}")).is_ok()
}

/// `FUTEX_LOCK_PI2` (monotonic deadline) on a word shared between processes, falling
/// back to `FUTEX_LOCK_PI` on kernels before 5.14. The kernel boosts the thread whose
/// id is in the word through its `rt_mutex` priority-inheritance chain while we wait.
pub(crate) fn lock_pi(word: &AtomicU32, timeout: Duration) -> Result<(), Errno> {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let deadline = add(now, timeout);
    match futex::lock_pi2(word, futex::Flags::empty(), Some(&deadline)) {
        Err(Errno::NOSYS) => {
            let now = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
            futex::lock_pi(word, futex::Flags::empty(), Some(&add(now, timeout)))
        }
        other => other,
    }
}

fn add(t: rustix::time::Timespec, d: Duration) -> rustix::time::Timespec {
    let mut sec = t.tv_sec.saturating_add(d.as_secs() as i64);
    let mut nsec = t.tv_nsec + i64::from(d.subsec_nanos());
    if nsec >= 1_000_000_000 {
        nsec -= 1_000_000_000;
        sec = sec.saturating_add(1);
    }
    rustix::time::Timespec { tv_sec: sec, tv_nsec: nsec }
}

/// `FUTEX_UNLOCK_PI`: gives the word to its highest-priority waiter (or clears it).
pub(crate) fn unlock_pi(word: &AtomicU32) -> Result<(), Errno> {
    futex::unlock_pi(word, futex::Flags::empty())
}

/// `FUTEX_WAIT` on a process-private word, with a timeout.
pub(crate) fn wait_private(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts =
        timeout.map(|d| rustix::time::Timespec { tv_sec: d.as_secs() as i64, tv_nsec: i64::from(d.subsec_nanos()) });
    let _ = futex::wait(word, futex::Flags::PRIVATE, expected, ts.as_ref());
}

/// `FUTEX_WAKE` on a process-private word.
pub(crate) fn wake_private(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::PRIVATE, 1);
}

/// The kernel's owner-died and waiters bits of a PI futex word.
pub(crate) const FUTEX_TID_MASK: u32 = !(futex::WAITERS | futex::OWNER_DIED);

/// A shared page: a memfd of [`PAGE`] bytes mapped `MAP_SHARED`.
#[derive(Debug)]
pub(crate) struct SharedPage {
    ptr: NonNull<u8>,
}

// SAFETY: the page is plain shared memory accessed only through atomics.
unsafe impl Send for SharedPage {}
// SAFETY: as above; every access is an atomic load or store.
unsafe impl Sync for SharedPage {}

impl SharedPage {
    /// A new memfd of one page, sealed against shrinking and growing (so that a peer
    /// can never make our mapping fault), and its writable mapping.
    pub(crate) fn create(name: &str) -> io::Result<(OwnedFd, SharedPage)> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, PAGE as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)?;
        let page = SharedPage::map(fd.as_fd(), true)?;
        Ok((fd, page))
    }

    /// Checks an untrusted descriptor (a regular file of exactly one page that can
    /// never shrink; `read_only` also needs it sealed against future writes by anyone
    /// else) and maps it.
    pub(crate) fn map_untrusted(fd: BorrowedFd<'_>, read_only: bool) -> Result<SharedPage, &'static str> {
        use rustix::fs::{FileType, SealFlags};
        let st = rustix::fs::fstat(fd).map_err(|_| "cannot stat the shared page")?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_size as usize != PAGE {
            return Err("shared page is not a one-page memory file");
        }
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| "shared page is not sealable")?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err("shared page is not sealed against shrinking");
        }
        SharedPage::map(fd, !read_only).map_err(|_| "cannot map the shared page")
    }

    fn map(fd: BorrowedFd<'_>, writable: bool) -> io::Result<SharedPage> {
        use rustix::mm::{MapFlags, ProtFlags};
        let prot = if writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        // SAFETY: a fresh shared mapping of a file at least PAGE bytes long (checked or
        // made so, and sealed against shrinking); the kernel chooses the address, so
        // nothing existing is replaced.
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), PAGE, prot, MapFlags::SHARED, fd, 0)? };
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SharedPage { ptr })
    }

    /// The `index`-th 32-bit word of the page.
    pub(crate) fn word(&self, index: usize) -> &AtomicU32 {
        assert!(index < PAGE / 4);
        // SAFETY: the mapping is PAGE bytes, page-aligned, alive as long as `self`, and
        // the index is in bounds; AtomicU32 has the alignment and size of u32, and all
        // access to shared memory goes through atomics.
        unsafe { &*(self.ptr.as_ptr().add(index * 4) as *const AtomicU32) }
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping this value made; no reference into it
        // outlives `self` (words borrow from `self`).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), PAGE) };
    }
}

/// Seals the status page so that clients can map it only read-only.
pub(crate) fn seal_read_only_for_others(fd: BorrowedFd<'_>) -> io::Result<()> {
    use rustix::fs::SealFlags;
    rustix::fs::fcntl_add_seals(fd, SealFlags::FUTURE_WRITE | SealFlags::SEAL)?;
    Ok(())
}

/// A `SOCK_SEQPACKET` socketpair.
pub(crate) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

/// Whether an untrusted descriptor is an `AF_UNIX SOCK_SEQPACKET` socket.
pub(crate) fn is_seqpacket(fd: BorrowedFd<'_>) -> bool {
    matches!(rustix::net::sockopt::socket_type(fd), Ok(SocketType::SEQPACKET))
        && matches!(rustix::net::sockopt::socket_domain(fd), Ok(AddressFamily::UNIX))
}

/// The process that created a socket's peer end (`SO_PEERCRED`).
pub(crate) fn peer_pid(fd: BorrowedFd<'_>) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(fd).ok().map(|c| c.pid.as_raw_nonzero().get() as u32)
}

#[repr(C, align(8))]
struct Aligned<const N: usize>([MaybeUninit<u8>; N]);

/// How a send went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    Ok,
    /// Queue full (non-blocking).
    WouldBlock,
    /// The other end is gone.
    Dead,
}

/// Sends one datagram (header + body) with descriptors; blocks while the queue is full
/// unless `nonblocking`.
pub(crate) fn send(
    fd: BorrowedFd<'_>,
    bufs: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
    nonblocking: bool,
) -> io::Result<Sent> {
    let mut space = Aligned([MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))]);
    let mut control = SendAncillaryBuffer::new(&mut space.0);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::from(Errno::TOOMANYREFS));
    }
    let mut flags = SendFlags::NOSIGNAL;
    if nonblocking {
        flags |= SendFlags::DONTWAIT;
    }
    loop {
        match rustix::net::sendmsg(fd, bufs, &mut control, flags) {
            Ok(_) => return Ok(Sent::Ok),
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return Ok(Sent::WouldBlock),
            Err(Errno::PIPE | Errno::CONNREFUSED | Errno::CONNRESET | Errno::NOTCONN) => return Ok(Sent::Dead),
            Err(e) => return Err(e.into()),
        }
    }
}

/// What a receive produced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recv {
    /// A datagram of this many bytes (`truncated` if it or its descriptors did not fit).
    Datagram { len: usize, truncated: bool },
    /// Nothing queued (non-blocking).
    Empty,
    /// The other end hung up.
    HungUp,
}

/// The most descriptors accepted beside one datagram; more are closed and the datagram
/// refused (control truncated).
const RECV_FDS: usize = 4;

/// Receives one datagram into `head` then `body`, appending descriptors to `fds`.
pub(crate) fn recv(
    fd: BorrowedFd<'_>,
    head: &mut [u8],
    body: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    nonblocking: bool,
) -> io::Result<Recv> {
    let mut space = Aligned([MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(RECV_FDS))]);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if nonblocking {
        flags |= RecvFlags::DONTWAIT;
    }
    loop {
        let mut control = RecvAncillaryBuffer::new(&mut space.0);
        let mut iov = [IoSliceMut::new(head), IoSliceMut::new(body)];
        match rustix::net::recvmsg(fd, &mut iov, &mut control, flags) {
            Ok(m) => {
                for msg in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(received) = msg {
                        fds.extend(received);
                    }
                }
                let truncated = m.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC);
                if m.bytes == 0 && fds.is_empty() && !truncated {
                    return Ok(Recv::HungUp);
                }
                return Ok(Recv::Datagram { len: m.bytes, truncated });
            }
            Err(Errno::AGAIN) => return Ok(Recv::Empty),
            Err(Errno::INTR) => {}
            Err(Errno::CONNRESET | Errno::NOTCONN) => return Ok(Recv::HungUp),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until `fd` is readable or hung up; false on time-out.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags};
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let left = deadline.map(|d| {
            let l = d.saturating_duration_since(std::time::Instant::now());
            rustix::event::Timespec { tv_sec: l.as_secs() as i64, tv_nsec: i64::from(l.subsec_nanos()) }
        });
        let mut pfd = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut pfd, left.as_ref()) {
            Ok(0) => {
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    return Ok(false);
                }
            }
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Pins the calling thread to one CPU (`sched_setaffinity`).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// Sets the calling thread's scheduling class; for tests, benchmarks and receivers.
pub fn set_current_policy(policy: Policy) -> io::Result<()> {
    set_thread_policy(0, policy)
}
