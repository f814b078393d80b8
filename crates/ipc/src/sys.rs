//! The thin shell over Linux: every system call the nucleus makes is made here.
//!
//! Sockets, pipes, polling, epoll and eventfds through rustix; descriptor passing,
//! memfds, seals and socket diagnostics through the OS layer, `ictus-sys`, which also
//! maps out-of-line memory for `ool`. The rest of the crate is plain Rust over owned
//! descriptors and calls these functions, so what the nucleus asks of the kernel, and
//! how it treats each answer (`EINTR`, `EAGAIN`, a hang-up), is written once.
//!
//! The only `unsafe` of the module is the bootstrap descriptor's hand-over across
//! `fork`/`exec` ([`inherit_as`], [`take_inherited`]).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use ictus_sys::memfd::{SealFlags, Size};
use rustix::event::{epoll, poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use crate::message::Credentials;

/// Create one connection: `(send end, receive end)` of a `SOCK_SEQPACKET` socketpair.
/// The receive end asks for the sender's credentials on every message.
///
/// # References
/// - [`socketpair(2)`](https://man7.org/linux/man-pages/man2/socketpair.2.html)
/// - [`unix(7)`](https://man7.org/linux/man-pages/man7/unix.7.html), `SO_PASSCRED`
pub(crate) fn connection() -> rustix::io::Result<(OwnedFd, OwnedFd)> {
    let (s, r) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    rustix::net::sockopt::set_socket_passcred(&r, true)?;
    Ok((s, r))
}

/// A call channel's reply pipe: `(read end, write end)` (the OS layer's reply pipes,
/// shared with the real-time ports).
pub(crate) fn reply_pipe() -> rustix::io::Result<(OwnedFd, OwnedFd)> {
    ictus_sys::pipe::pair()
}

/// Check that an untrusted descriptor is the write end of a pipe.
pub(crate) fn is_pipe_write_end(fd: BorrowedFd<'_>) -> bool {
    ictus_sys::pipe::is_write_end(fd)
}

/// Write one message to a reply pipe in one piece, never waiting (`RWF_NOWAIT`: the
/// pipe's file status flags are shared with whoever else holds its write end).
pub(crate) fn pipe_write(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> rustix::io::Result<()> {
    ictus_sys::pipe::write_nowait(fd, bufs)
}

/// Read one message from a reply pipe into `buf`, waiting until `deadline` (`None`:
/// for ever). `Ok(0)`: every write end is closed.
pub(crate) fn pipe_read(fd: BorrowedFd<'_>, buf: &mut [u8], deadline: Option<Instant>) -> rustix::io::Result<usize> {
    if deadline.is_some() && !wait_until(fd, PollFlags::IN, deadline)? {
        return Err(Errno::AGAIN);
    }
    ictus_sys::pipe::read(fd, &mut [IoSliceMut::new(buf)])
}

/// Ask for a send buffer of `bytes` on a connection's send end, and return what the
/// kernel granted: it doubles what it is given and caps it at twice `wmem_max`
/// (socket(7), `SO_SNDBUF`), so half is asked for and the result read back.
///
/// # References
/// - [`socket(7)`](https://man7.org/linux/man-pages/man7/socket.7.html), `SO_SNDBUF`
pub(crate) fn set_send_buffer(send_end: BorrowedFd<'_>, bytes: usize) -> rustix::io::Result<usize> {
    rustix::net::sockopt::set_socket_send_buffer_size(send_end, (bytes / 2).max(1))?;
    rustix::net::sockopt::socket_send_buffer_size(send_end)
}

/// Check that an untrusted descriptor is an `AF_UNIX` `SOCK_SEQPACKET` socket, the only
/// kind of object that can stand for a port.
pub(crate) fn is_port_socket(fd: BorrowedFd<'_>) -> bool {
    matches!(rustix::net::sockopt::socket_type(fd), Ok(SocketType::SEQPACKET))
        && matches!(rustix::net::sockopt::socket_domain(fd), Ok(AddressFamily::UNIX))
}

/// The kernel's identity of a socket: the device and inode of its file. Every
/// descriptor for the same send end, in any process, has the same identity.
pub(crate) fn identity(fd: BorrowedFd<'_>) -> rustix::io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// The token a call channel is known by: the inode number of the client's end, which
/// the client reads with `fstat` and a port's new holder can find again as the peer of
/// its own end (`UNIX_DIAG_PEER`). Socket inode numbers are 32-bit counters.
pub(crate) fn channel_token(client_end: BorrowedFd<'_>) -> rustix::io::Result<u32> {
    Ok(token_of_inode(identity(client_end)?.1))
}

/// A channel token from an inode number (never zero).
pub(crate) fn token_of_inode(ino: u64) -> u32 {
    (ino as u32).max(1)
}

/// Outcome of a send attempt.
pub(crate) enum SendOutcome {
    Sent,
    /// The queue is full and the caller asked not to wait, or the wait timed out.
    WouldBlock,
    /// The receive end is gone: the port is dead.
    Dead,
    /// The datagram is larger than the connection's buffer can ever hold.
    TooLarge,
}

/// Send one datagram with descriptors, waiting while the queue is full until
/// `deadline` (`None`: forever; a past deadline: do not wait).
///
/// The send end's file status flags are shared with every task holding the right, so
/// blocking is never taken from `O_NONBLOCK`: each call passes `MSG_DONTWAIT` and waits
/// in `poll` itself.
pub(crate) fn send(
    fd: BorrowedFd<'_>,
    bufs: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
    deadline: Option<Instant>,
) -> rustix::io::Result<SendOutcome> {
    let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    if fds.is_empty() && bufs.iter().map(|b| b.len()).sum::<usize>() <= ictus_sys::socket::GATHER_MAX {
        // A small datagram without descriptors is gathered and sent with `send`: on
        // this kind of machine `sendmsg` costs measurably more per call.
        return send_with(fd, deadline, || ictus_sys::socket::send_gathered(fd, bufs, flags));
    }
    send_with(fd, deadline, || ictus_sys::socket::sendmsg(fd, bufs, fds, flags))
}

/// [`send`]'s outcome handling around one non-blocking send attempt.
fn send_with(
    fd: BorrowedFd<'_>,
    deadline: Option<Instant>,
    mut attempt: impl FnMut() -> rustix::io::Result<usize>,
) -> rustix::io::Result<SendOutcome> {
    loop {
        match attempt() {
            Ok(_) => return Ok(SendOutcome::Sent),
            Err(Errno::AGAIN) => {
                if !wait_until(fd, PollFlags::OUT, deadline)? {
                    return Ok(SendOutcome::WouldBlock);
                }
            }
            Err(Errno::INTR) => {}
            Err(Errno::PIPE | Errno::CONNREFUSED | Errno::CONNRESET | Errno::NOTCONN) => return Ok(SendOutcome::Dead),
            Err(Errno::MSGSIZE) => return Ok(SendOutcome::TooLarge),
            Err(e) => return Err(e),
        }
    }
}

/// Wait until `fd` is ready for `what` or has hung up. Returns false on time-out.
fn wait_until(fd: BorrowedFd<'_>, what: PollFlags, deadline: Option<Instant>) -> rustix::io::Result<bool> {
    loop {
        let timeout = deadline.map(|d| timespec(d.saturating_duration_since(Instant::now())));
        let mut pfd = [PollFd::new(&fd, what)];
        match poll(&mut pfd, timeout.as_ref()) {
            Ok(0) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(false);
                }
            }
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Wait until `fd` is readable or has hung up. Returns false on time-out.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, deadline: Option<Instant>) -> rustix::io::Result<bool> {
    wait_until(fd, PollFlags::IN, deadline)
}

/// Set a socket's receive time-out (`SO_RCVTIMEO`; `None`: wait for ever). A blocking
/// receive that times out fails with `EAGAIN`. A zero duration would mean "for ever" to
/// the kernel, so it is raised to one microsecond.
pub(crate) fn set_receive_timeout(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> rustix::io::Result<()> {
    let t = timeout.map(|t| t.max(Duration::from_micros(1)));
    rustix::net::sockopt::set_socket_timeout(fd, rustix::net::sockopt::Timeout::Recv, t)
}

/// Whether a connection end has hung up (its peer end is closed everywhere).
pub(crate) fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = [PollFd::new(&fd, PollFlags::empty())];
    matches!(poll(&mut pfd, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(n) if n > 0)
        && pfd[0].revents().contains(PollFlags::HUP)
}

pub(crate) fn timespec(d: Duration) -> Timespec {
    Timespec { tv_sec: d.as_secs().min(i64::MAX as u64) as i64, tv_nsec: i64::from(d.subsec_nanos()) }
}

/// What one receive call produced.
pub(crate) enum RecvOutcome {
    /// A datagram of this many bytes, with its descriptors and the sender's
    /// credentials; `truncated` if it (or its descriptors) did not fit.
    Datagram { len: usize, creds: Option<Credentials>, truncated: bool },
    /// Nothing queued (non-blocking call).
    Empty,
    /// A zero-length read: the connection hung up, or a peer sent an empty datagram.
    Zero,
}

/// Receive one datagram into `buf`, appending its descriptors to `fds`.
///
/// The OS layer's `recvmsg` has room for the kernel's limit of descriptors and owns
/// every one it received, so a sender that attaches more than a message may carry is
/// refused by the decoder with each of them closed, never left installed and unowned.
pub(crate) fn recv(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    nonblocking: bool,
) -> rustix::io::Result<RecvOutcome> {
    let flags = if nonblocking { RecvFlags::DONTWAIT } else { RecvFlags::empty() };
    loop {
        match ictus_sys::socket::recvmsg(fd, &mut [IoSliceMut::new(buf)], fds, flags) {
            Err(Errno::AGAIN) => return Ok(RecvOutcome::Empty),
            // The peer was closed with datagrams unread in its own queue (a port's note,
            // `queue::Note`, sits in every send end's queue): the kernel reports that
            // once as an error on this end (`unix_release_sock`), and what was queued
            // here is still there. Look again.
            Err(Errno::INTR | Errno::CONNRESET) => {}
            Err(e) => return Err(e),
            Ok(m) => {
                let truncated = m.truncated || m.control_truncated;
                if m.bytes == 0 && fds.is_empty() && !truncated {
                    return Ok(RecvOutcome::Zero);
                }
                let creds = m.creds.map(|c| Credentials { pid: c.pid, uid: c.uid, gid: c.gid });
                return Ok(RecvOutcome::Datagram { len: m.bytes, creds, truncated });
            }
        }
    }
}

/// Peek at the next datagram queued on `fd` without taking it (`MSG_PEEK`): its bytes
/// into `buf`, copies of its descriptors appended to `fds`. Never waits; `EAGAIN` when
/// nothing is queued. Returns the bytes placed.
pub(crate) fn peek(fd: BorrowedFd<'_>, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> rustix::io::Result<usize> {
    loop {
        match ictus_sys::socket::recvmsg(fd, &mut [IoSliceMut::new(buf)], fds, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
            Ok(m) => return Ok(m.bytes),
        }
    }
}

/// `FUTEX_WAKE` on a word in shared memory (not private: the sleepers may be in other
/// processes that map the same file): wake up to `n` threads sleeping on it.
///
/// # References
/// - [`futex(2)`](https://man7.org/linux/man-pages/man2/futex.2.html), `FUTEX_WAKE`
pub(crate) fn futex_wake(word: &AtomicU32, n: u32) {
    let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), n);
}

/// `FUTEX_WAIT` on a word in shared memory while it holds `expected`, for at most
/// `timeout`. Returns on a wake-up, a changed value, a signal or the time-out alike:
/// the caller looks again.
///
/// # References
/// - [`futex(2)`](https://man7.org/linux/man-pages/man2/futex.2.html), `FUTEX_WAIT`
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let t = timespec(timeout);
    let _ = rustix::thread::futex::wait(word, rustix::thread::futex::Flags::empty(), expected, Some(&t));
}

/// An anonymous, sealable memfd of `len` bytes.
pub(crate) fn memfd(len: usize) -> rustix::io::Result<OwnedFd> {
    ictus_sys::memfd::create("ictus-ool", len as u64)
}

/// The seals that make a memfd immutable for everyone who holds it.
pub(crate) fn immutable_seals() -> SealFlags {
    SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL
}

/// Seal a memfd so that nobody, its sender included, can change it again.
/// Fails with `EBUSY` while a writable shared mapping of it exists.
///
/// The kernel also refuses (`EBUSY`) while it sees extra references to the file's pages
/// (`memfd_wait_for_pins`); a freshly written page briefly holds one (a per-CPU LRU
/// batch), and under load the kernel's own short wait can run out. That is transient,
/// so try again for a while before giving up.
pub(crate) fn seal(fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
    let mut tries = 0;
    loop {
        match ictus_sys::memfd::add_seals(fd, immutable_seals()) {
            Err(rustix::io::Errno::BUSY) if tries < 200 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
            other => return other,
        }
    }
}

/// Check an untrusted descriptor: a regular file, at least `len` bytes, sealed against
/// writing, shrinking and growing.
pub(crate) fn check_sealed_memfd(fd: BorrowedFd<'_>, len: u64) -> Result<(), &'static str> {
    use ictus_sys::memfd::CheckError;
    let need = SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW;
    ictus_sys::memfd::check(fd, Size::AtLeast(len), need).map_err(|e| match e {
        CheckError::Stat(_) => "cannot stat out-of-line descriptor",
        CheckError::NotRegular => "out-of-line descriptor is not a memory file",
        CheckError::TooShort { .. } | CheckError::WrongSize { .. } => {
            "out-of-line memory is shorter than its descriptor says"
        }
        CheckError::NotSealable(_) => "out-of-line memory is not sealable",
        CheckError::MissingSeals { .. } => "out-of-line memory is not sealed against writing",
    })
}

/// The inode of the socket at the other end of a received `AF_UNIX` socket, as the
/// kernel's socket diagnostics say (`None`: the kernel cannot say).
pub(crate) fn peer_inode(fd: BorrowedFd<'_>) -> rustix::io::Result<Option<u64>> {
    ictus_sys::sockdiag::peer_inode(fd)
}

/// Whether `fd` is the same open file as `other` (for tests).
#[cfg(test)]
pub(crate) fn same_file(a: impl std::os::fd::AsFd, b: impl std::os::fd::AsFd) -> bool {
    matches!((identity(a.as_fd()), identity(b.as_fd())), (Ok(x), Ok(y)) if x == y)
}

/// A close-on-exec duplicate of a descriptor.
pub(crate) fn dup(fd: BorrowedFd<'_>) -> rustix::io::Result<OwnedFd> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0)
}

/// Write all of `data` to a file from its start (`pwrite`, retried until done).
pub(crate) fn write_all_at(fd: BorrowedFd<'_>, data: &[u8]) -> rustix::io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        match rustix::io::pwrite(fd, &data[off..], off as u64) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => off += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// ----- sockets: who, and how --------------------------------------------------------

/// This process's pid and real uid and gid, as the kernel stamps them on its messages
/// (`Credentials`).
pub(crate) fn own_credentials() -> Credentials {
    Credentials {
        pid: rustix::process::getpid().as_raw_nonzero().get() as u32,
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
    }
}

/// The pid of the process that created a socket's peer end (`SO_PEERCRED`), if the
/// kernel can say (0 for one in a pid namespace this process cannot see).
pub(crate) fn peer_pid(fd: BorrowedFd<'_>) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(fd).ok().map(|c| rustix::process::Pid::as_raw(Some(c.pid)) as u32)
}

/// Ask for the sender's credentials on every message received on `fd` (`SO_PASSCRED`).
pub(crate) fn set_passcred(fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
    rustix::net::sockopt::set_socket_passcred(fd, true)
}

/// `shutdown(fd, SHUT_RDWR)`: threads blocked on the connection wake, and its peer sees
/// the hang-up at once, even while another descriptor of it stays open.
pub(crate) fn shut_down(fd: BorrowedFd<'_>) {
    let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
}

// ----- epoll and eventfds -----------------------------------------------------------

/// A new close-on-exec epoll.
pub(crate) fn epoll() -> rustix::io::Result<OwnedFd> {
    epoll::create(epoll::CreateFlags::CLOEXEC)
}

/// What an epoll watches a descriptor for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interest {
    /// Readable (a message, or a hang-up), level-triggered.
    Readable,
    /// A hang-up (always reported), once: the watch is disarmed by its first event.
    HangUpOnce,
}

/// Watch `fd` in `ep` for `interest`, reported with `data`. `EEXIST` if `fd`'s file is
/// already watched there.
pub(crate) fn epoll_add(
    ep: BorrowedFd<'_>,
    fd: BorrowedFd<'_>,
    data: u64,
    interest: Interest,
) -> rustix::io::Result<()> {
    let flags = match interest {
        Interest::Readable => epoll::EventFlags::IN,
        Interest::HangUpOnce => epoll::EventFlags::ONESHOT,
    };
    epoll::add(ep, fd, epoll::EventData::new_u64(data), flags)
}

/// Stop watching `fd` in `ep`. Said explicitly: the file may live on elsewhere, and an
/// epoll forgets a file only when its last descriptor anywhere is closed.
pub(crate) fn epoll_delete(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>) {
    let _ = epoll::delete(ep, fd);
}

/// What one wait in an epoll saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// An event with this datum.
    Event(u64),
    /// Nothing yet: interrupted, or woken early; look again.
    Again,
    /// The deadline passed.
    TimedOut,
}

/// Wait in an epoll for one event until `deadline` (`None`: for ever).
pub(crate) fn epoll_wait_one(ep: BorrowedFd<'_>, deadline: Option<Instant>) -> rustix::io::Result<Waited> {
    let mut events = [epoll::Event { flags: epoll::EventFlags::empty(), data: epoll::EventData::new_u64(0) }; 1];
    let timeout = deadline.map(|d| timespec(d.saturating_duration_since(Instant::now())));
    match epoll::wait(ep, &mut events, timeout.as_ref()) {
        Ok(0) if deadline.is_some_and(|d| Instant::now() >= d) => Ok(Waited::TimedOut),
        Ok(0) | Err(Errno::INTR) => Ok(Waited::Again),
        Ok(_) => Ok(Waited::Event(events[0].data.u64())),
        Err(e) => Err(e),
    }
}

/// Room for the events of one epoll wait, kept between waits.
pub(crate) struct Events(Vec<epoll::Event>);

impl Events {
    /// Room for `n` events.
    pub(crate) fn with_capacity(n: usize) -> Events {
        Events(Vec::with_capacity(n.max(1)))
    }

    /// Wait in `ep` for ever for events (an interrupted wait returns with none).
    pub(crate) fn wait(&mut self, ep: BorrowedFd<'_>) -> rustix::io::Result<()> {
        self.0.clear();
        match epoll::wait(ep, rustix::buffer::spare_capacity(&mut self.0), None) {
            Ok(_) | Err(Errno::INTR) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The data of the events the last wait saw.
    pub(crate) fn data(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().map(|e| e.data.u64())
    }
}

/// A new close-on-exec, non-blocking eventfd.
pub(crate) fn eventfd() -> rustix::io::Result<OwnedFd> {
    rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
}

/// Add one to an eventfd: whoever waits on it wakes.
pub(crate) fn eventfd_signal(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

// ----- the bootstrap descriptor -----------------------------------------------------

/// Make `fd` the descriptor number `target` of the program `cmd` will execute (not
/// close-on-exec there). `fd` lives in the closure, so it stays open in the parent,
/// and thus in the child, until `cmd` is dropped.
///
/// # References
/// - [`dup2(2)`](https://man7.org/linux/man-pages/man2/dup2.2.html),
///   [`fcntl(2)`](https://man7.org/linux/man-pages/man2/fcntl.2.html) `F_SETFD`
/// - [`signal-safety(7)`](https://man7.org/linux/man-pages/man7/signal-safety.7.html)
#[allow(unsafe_code)]
pub(crate) fn inherit_as(cmd: &mut std::process::Command, fd: OwnedFd, target: i32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and calls only dup2
    // and fcntl, which are async-signal-safe (signal-safety(7)); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let raw = fd.as_raw_fd();
            if raw == target {
                if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Take ownership of descriptor number `raw`, which this process's parent handed it
/// (as [`inherit_as`] does), if it is open and a port socket: a close-on-exec
/// duplicate, with the inherited number closed. `EINVAL` otherwise (nothing closed).
#[allow(unsafe_code)]
pub(crate) fn take_inherited(raw: i32) -> rustix::io::Result<OwnedFd> {
    if raw < 0 {
        return Err(Errno::INVAL);
    }
    // SAFETY: the number was handed to this process by its parent for it to own, and
    // is only borrowed until it is checked to be open and a port socket.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    if rustix::io::fcntl_getfd(borrowed).is_err() || !is_port_socket(borrowed) {
        return Err(Errno::INVAL);
    }
    let fd = rustix::io::fcntl_dupfd_cloexec(borrowed, 0)?;
    // SAFETY: `raw` is ours (see above) and nothing else refers to it.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
    Ok(fd)
}
