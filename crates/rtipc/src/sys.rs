//! The thin shell over Linux: thread priorities by thread id, PI futexes in shared
//! pages, memfds, descriptor passing, batched receives and reply pipes. Every system call of the crate is made
//! here; scheduling attributes come from `ictus-rt`, and mappings, memfds and
//! descriptor passing from the OS layer, `ictus-sys`, so the crate has no `unsafe`.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use ictus_rt::thread::Policy;
use ictus_sys::memfd::{SealFlags, Size};
use ictus_sys::mm::{Mapping, Protection};
use ictus_sys::socket;
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use rustix::thread::futex;

/// Bytes in a shared page (the status page and each connection's page).
pub(crate) const PAGE: usize = 4096;

/// The calling thread's id.
pub(crate) fn gettid() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

/// `sched_setattr(tid, policy)`: sets the scheduling class of any thread the caller may
/// change (its own process's, or any with `CAP_SYS_NICE`).
///
/// # References
/// - [`sched_setattr(2)`](https://man7.org/linux/man-pages/man2/sched_setattr.2.html)
pub(crate) fn set_thread_policy(tid: u32, policy: Policy) -> io::Result<()> {
    ictus_rt::thread::set_thread_policy(tid, policy)
}

/// `sched_getattr(tid)`: the thread's own (not inherited) scheduling class.
pub use ictus_rt::thread::thread_policy;

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
    map: Mapping,
}

impl SharedPage {
    /// A new memfd of one page, sealed against shrinking and growing (so that a peer
    /// can never make our mapping fault), and its writable mapping.
    pub(crate) fn create(name: &str) -> io::Result<(OwnedFd, SharedPage)> {
        let fd = ictus_sys::memfd::create(name, PAGE as u64)?;
        ictus_sys::memfd::add_seals(fd.as_fd(), SealFlags::SHRINK | SealFlags::GROW)?;
        let page = SharedPage::map(fd.as_fd(), true)?;
        Ok((fd, page))
    }

    /// Checks an untrusted descriptor (a regular file of exactly one page that can
    /// never shrink; `read_only` also needs it sealed against future writes by anyone
    /// else) and maps it.
    pub(crate) fn map_untrusted(fd: BorrowedFd<'_>, read_only: bool) -> Result<SharedPage, &'static str> {
        use ictus_sys::memfd::CheckError;
        ictus_sys::memfd::check(fd, Size::Exactly(PAGE as u64), SealFlags::SHRINK | SealFlags::GROW).map_err(|e| {
            match e {
                CheckError::Stat(_) => "cannot stat the shared page",
                CheckError::NotRegular | CheckError::TooShort { .. } | CheckError::WrongSize { .. } => {
                    "shared page is not a one-page memory file"
                }
                CheckError::NotSealable(_) => "shared page is not sealable",
                CheckError::MissingSeals { .. } => "shared page is not sealed against shrinking",
            }
        })?;
        SharedPage::map(fd, !read_only).map_err(|_| "cannot map the shared page")
    }

    fn map(fd: BorrowedFd<'_>, writable: bool) -> io::Result<SharedPage> {
        let prot = if writable { Protection::ReadWrite } else { Protection::Read };
        // A file at least PAGE bytes long (checked or made so, and sealed against
        // shrinking), so no access to the mapping can fault.
        Ok(SharedPage { map: Mapping::shared(fd, PAGE, prot)? })
    }

    /// The `index`-th 32-bit word of the page.
    pub(crate) fn word(&self, index: usize) -> &AtomicU32 {
        self.map.atomic_u32(index * 4)
    }
}

/// Seals the status page so that clients can map it only read-only.
pub(crate) fn seal_read_only_for_others(fd: BorrowedFd<'_>) -> io::Result<()> {
    ictus_sys::memfd::add_seals(fd, SealFlags::FUTURE_WRITE | SealFlags::SEAL)?;
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

/// How a send went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    Ok,
    /// Queue full (non-blocking).
    WouldBlock,
    /// The other end is gone.
    Dead,
}

/// The most descriptors one datagram of the crate carries (a connection's end, its
/// page and its reply pipe's write end).
const SEND_FDS: usize = 3;

/// Sends one datagram (header + body) with descriptors; unless `nonblocking`, waits
/// while the queue is full. Every attempt is `MSG_DONTWAIT` and the wait is a `poll`:
/// a port's main send end is shared by every holder of a send right, so its file
/// status flags (`O_NONBLOCK`) are nobody's to rely on, as in the nucleus. A small
/// datagram without descriptors goes with `send`, cheaper than `sendmsg` here.
pub(crate) fn send(
    fd: BorrowedFd<'_>,
    bufs: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
    nonblocking: bool,
) -> io::Result<Sent> {
    if fds.len() > SEND_FDS {
        return Err(io::Error::from(Errno::TOOMANYREFS));
    }
    let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    let small = fds.is_empty() && bufs.iter().map(|b| b.len()).sum::<usize>() <= socket::GATHER_MAX;
    loop {
        let sent = if small { socket::send_gathered(fd, bufs, flags) } else { socket::sendmsg(fd, bufs, fds, flags) };
        match sent {
            Ok(_) => return Ok(Sent::Ok),
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) if nonblocking => return Ok(Sent::WouldBlock),
            Err(Errno::AGAIN) => {
                wait_for(fd, rustix::event::PollFlags::OUT, None)?;
            }
            Err(Errno::PIPE | Errno::CONNREFUSED | Errno::CONNRESET | Errno::NOTCONN) => return Ok(Sent::Dead),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Rings a port's doorbell: a header-only [`Kind::Wake`](crate::wire::Kind::Wake)
/// datagram on its main connection, which wakes the receiver waiting there. Never
/// waits: a full queue wakes that receiver anyway.
pub(crate) fn ring(send_end: BorrowedFd<'_>) {
    let head = crate::wire::RtHeader::new(crate::wire::Kind::Wake).encode();
    let _ = socket::send_gathered(send_end, &[IoSlice::new(&head)], SendFlags::NOSIGNAL | SendFlags::DONTWAIT);
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

/// The most descriptors accepted beside one datagram; with more the datagram is
/// refused as truncated (and every one of them closed by its owner, the caller's list).
const RECV_FDS: usize = 4;

/// Receives one datagram into `head` then `body`, appending descriptors to `fds`.
pub(crate) fn recv(
    fd: BorrowedFd<'_>,
    head: &mut [u8],
    body: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    nonblocking: bool,
) -> io::Result<Recv> {
    let flags = if nonblocking { RecvFlags::DONTWAIT } else { RecvFlags::empty() };
    loop {
        let mut iov = [IoSliceMut::new(&mut *head), IoSliceMut::new(&mut *body)];
        let before = fds.len();
        match socket::recvmsg(fd, &mut iov, fds, flags) {
            Ok(m) => {
                // Every descriptor that came is owned by `fds`; more than a datagram of
                // this crate carries makes it refused (and they are closed with it).
                let truncated = m.truncated || m.control_truncated || fds.len() - before > RECV_FDS;
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

/// Most datagrams one [`recv_batch`] takes.
pub(crate) const BATCH: usize = 8;

/// What a [`recv_batch`] produced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Batch {
    /// This many datagrams (at least one).
    Got(usize),
    /// Nothing: a non-blocking read found the queue empty, or the wait timed out.
    Empty,
    /// Interrupted by a signal: look again.
    Interrupted,
}

/// One datagram's outcome in a [`recv_batch`].
pub(crate) use ictus_sys::socket::RecvMsg;

/// Receives up to `heads.len()` datagrams from a port's main connection in one
/// `recvmmsg`, datagram `i` into `heads[i]` then `bodies[i]`, its descriptors into
/// `fds[i]`: waiting for the first (up to the socket's receive time-out) unless
/// `nonblocking`, then taking what else is queued without waiting (`MSG_WAITFORONE`).
pub(crate) fn recv_batch(
    fd: BorrowedFd<'_>,
    heads: &mut [[u8; crate::wire::RT_HEADER_LEN]],
    bodies: &mut [Box<[u8]>],
    fds: &mut [Vec<OwnedFd>],
    out: &mut [RecvMsg],
    nonblocking: bool,
) -> io::Result<Batch> {
    let n = heads.len().min(bodies.len()).min(BATCH);
    let mut pairs = heads.iter_mut().zip(bodies.iter_mut()).take(n);
    let mut iovs: [[IoSliceMut<'_>; 2]; BATCH] = std::array::from_fn(|_| match pairs.next() {
        Some((head, body)) => [IoSliceMut::new(head), IoSliceMut::new(body)],
        None => [IoSliceMut::new(&mut []), IoSliceMut::new(&mut [])],
    });
    let mut each = iovs.iter_mut();
    let mut lists: [&mut [IoSliceMut<'_>]; BATCH] =
        std::array::from_fn(|_| each.next().map_or(&mut [][..], |iov| iov.as_mut_slice()));
    let flags = if nonblocking { RecvFlags::DONTWAIT } else { RecvFlags::empty() };
    match socket::recvmmsg(fd, &mut lists[..n], fds, out, flags, true) {
        Ok(0) | Err(Errno::AGAIN) => Ok(Batch::Empty),
        Ok(k) => Ok(Batch::Got(k)),
        Err(Errno::INTR) => Ok(Batch::Interrupted),
        Err(e) => Err(e.into()),
    }
}

/// Whether a datagram of a batch is refused whole: cut short, or with more descriptors
/// than any datagram of the crate carries.
pub(crate) fn truncated(m: &RecvMsg, fds: usize) -> bool {
    m.truncated || m.control_truncated || fds > RECV_FDS
}

/// Sets a socket's receive time-out (`SO_RCVTIMEO`; `None`: none). A blocking receive
/// that times out fails with `EAGAIN`. Zero would mean "for ever" to the kernel, so it
/// is raised to a microsecond.
pub(crate) fn set_receive_timeout(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<()> {
    let t = timeout.map(|t| t.max(Duration::from_micros(1)));
    rustix::net::sockopt::set_socket_timeout(fd, rustix::net::sockopt::Timeout::Recv, t)?;
    Ok(())
}

/// Asks for the sender's credentials on every datagram received on `fd` (`SO_PASSCRED`).
pub(crate) fn set_passcred(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::net::sockopt::set_socket_passcred(fd, true)?;
    Ok(())
}

/// `sched_yield()`: to the back of the calling thread's priority list.
///
/// # References
/// - [`sched_yield(2)`](https://man7.org/linux/man-pages/man2/sched_yield.2.html)
pub(crate) fn yield_now() {
    rustix::thread::sched_yield();
}

/// This process's id.
pub(crate) fn getpid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

pub(crate) use ictus_sys::pipe;

/// Waits until `fd` is ready for `what` or hung up; false on time-out.
fn wait_for(fd: BorrowedFd<'_>, what: rustix::event::PollFlags, timeout: Option<Duration>) -> io::Result<bool> {
    use rustix::event::{poll, PollFd};
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let left = deadline.map(|d| {
            let l = d.saturating_duration_since(std::time::Instant::now());
            rustix::event::Timespec { tv_sec: l.as_secs() as i64, tv_nsec: i64::from(l.subsec_nanos()) }
        });
        let mut pfd = [PollFd::new(&fd, what)];
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

/// Waits until `fd` is readable or hung up; false on time-out.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    wait_for(fd, rustix::event::PollFlags::IN, timeout)
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
