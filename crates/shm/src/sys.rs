//! The thin shell over Linux: memfds and their seals, mappings, eventfds, futexes,
//! the channel's link socket and descriptor passing. Every system call of the crate is
//! made here: mappings, memfds and descriptor passing through the OS layer
//! (`ictus-sys`), the rest with rustix.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

pub(crate) use ictus_sys::mm::Mapping;
use ictus_sys::mm::Protection;
use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fs::SealFlags;
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use rustix::thread::futex;

/// Map `len` bytes of `fd` shared, writable or read-only. The caller has checked
/// that the file is at least `len` bytes long and cannot shrink (sealed), so no
/// access within the mapping can fault with `SIGBUS`.
pub(crate) fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> rustix::io::Result<Mapping> {
    Mapping::shared(fd, len, if writable { Protection::ReadWrite } else { Protection::Read })
}

/// A new memfd of `len` bytes (zero-filled), with sealing allowed.
pub(crate) fn memfd(name: &str, len: u64) -> rustix::io::Result<OwnedFd> {
    ictus_sys::memfd::create(name, len)
}

/// Seal a memfd made by [`memfd`] against shrinking and growing — so a mapping of it
/// can never fault with `SIGBUS` — and against further seals, plus `extra` (for
/// example `FUTURE_WRITE` once the owner's writable mapping exists).
pub(crate) fn seal(fd: BorrowedFd<'_>, extra: SealFlags) -> rustix::io::Result<()> {
    ictus_sys::memfd::add_seals(fd, extra | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
}

/// Check an untrusted descriptor: a memfd (regular file) of exactly `len` bytes
/// carrying at least the seals `need`.
pub(crate) fn check_memfd(fd: BorrowedFd<'_>, len: u64, need: SealFlags) -> Result<(), String> {
    ictus_sys::memfd::check(fd, ictus_sys::memfd::Size::Exactly(len), need).map_err(|e| e.to_string())
}

/// Whether an untrusted descriptor is an eventfd.
pub(crate) fn is_eventfd(fd: BorrowedFd<'_>) -> bool {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    std::fs::read_link(path).is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

/// A new non-blocking eventfd.
pub(crate) fn eventfd() -> rustix::io::Result<OwnedFd> {
    rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
}

/// Add one to an eventfd. A full counter (it cannot be, short of 2^64 - 1 writes
/// unread) is as good as a wake-up.
pub(crate) fn signal(fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
    match rustix::io::write(fd, &1u64.to_ne_bytes()) {
        Ok(_) | Err(Errno::AGAIN) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Empty an eventfd; returns whether it had been signalled.
pub(crate) fn drain(fd: BorrowedFd<'_>) -> bool {
    let mut b = [0u8; 8];
    matches!(rustix::io::read(fd, &mut b), Ok(8))
}

fn timespec(d: Duration) -> Timespec {
    Timespec { tv_sec: d.as_secs().min(i64::MAX as u64) as i64, tv_nsec: i64::from(d.subsec_nanos()) }
}

/// `FUTEX_WAKE` one waiter of a word in shared memory (not private: other processes
/// wait on it). Returns whether the system call was made successfully.
pub(crate) fn futex_wake(word: &AtomicU32) -> rustix::io::Result<()> {
    futex::wake(word, futex::Flags::empty(), 1).map(|_| ())
}

/// `FUTEX_WAIT` on a word in shared memory while it holds `expected`, for at most
/// `timeout`. Returns normally on a wake-up, a changed value, a signal or the timeout.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> rustix::io::Result<()> {
    match futex::wait(word, futex::Flags::empty(), expected, Some(&timespec(timeout))) {
        Ok(()) | Err(Errno::AGAIN | Errno::INTR | Errno::TIMEDOUT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The most futexes one `futex_waitv` waits on.
pub(crate) const WAITV_MAX: usize = 128;

/// `futex_waitv` on words in shared memory, each while it holds its expected value,
/// for at most `timeout`. Linux 5.16 or later; `ENOSYS` before.
pub(crate) fn futex_waitv<'a>(
    words: impl Iterator<Item = (&'a AtomicU32, u32)>,
    timeout: Duration,
) -> rustix::io::Result<()> {
    let mut waits = [futex::Wait::new(); WAITV_MAX];
    let mut n = 0;
    for (w, (word, expected)) in waits.iter_mut().zip(words) {
        w.val = u64::from(expected);
        w.uaddr = futex::WaitPtr::new(word.as_ptr().cast());
        w.flags = futex::WaitFlags::SIZE_U32;
        n += 1;
    }
    debug_assert!(n > 0);
    // futex_waitv takes an absolute time on the given clock.
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let end = Duration::new(now.tv_sec as u64, now.tv_nsec as u32) + timeout;
    let deadline = timespec(end);
    match futex::waitv(&waits[..n], futex::WaitvFlags::empty(), Some(&deadline), rustix::time::ClockId::Monotonic) {
        Ok(_) | Err(Errno::AGAIN | Errno::INTR | Errno::TIMEDOUT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A channel's link: a `SOCK_SEQPACKET` socketpair, one end per side.
pub(crate) fn link() -> rustix::io::Result<(OwnedFd, OwnedFd)> {
    rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
}

/// Whether the other end of a link has closed (or sent something, which a link never
/// should after set-up: it is treated the same).
pub(crate) fn link_event(fd: BorrowedFd<'_>) -> bool {
    let mut p = [PollFd::new(&fd, PollFlags::IN | PollFlags::RDHUP)];
    matches!(rustix::event::poll(&mut p, Some(&timespec(Duration::ZERO))), Ok(n) if n > 0)
}

/// Whether the other end of a link has closed.
pub(crate) fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut p = [PollFd::new(&fd, PollFlags::RDHUP)];
    match rustix::event::poll(&mut p, Some(&timespec(Duration::ZERO))) {
        Ok(n) if n > 0 => p[0].revents().intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR),
        _ => false,
    }
}

/// Wait until one of `fds` is readable or hung up, for at most `timeout`.
pub(crate) fn poll_in(fds: &[BorrowedFd<'_>], timeout: Duration) -> rustix::io::Result<()> {
    let mut p: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(fd, PollFlags::IN | PollFlags::RDHUP)).collect();
    match rustix::event::poll(&mut p, Some(&timespec(timeout))) {
        Ok(_) | Err(Errno::INTR) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The most descriptors a link message carries.
pub(crate) const LINK_FDS: usize = 4;

/// Send one datagram with descriptors on a link, without blocking.
pub(crate) fn send_fds(link: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> rustix::io::Result<()> {
    if fds.len() > LINK_FDS {
        return Err(Errno::TOOMANYREFS);
    }
    ictus_sys::socket::sendmsg(link, &[IoSlice::new(data)], fds, SendFlags::DONTWAIT | SendFlags::NOSIGNAL)?;
    Ok(())
}

/// Receive one datagram with up to [`LINK_FDS`] descriptors from a link, waiting at
/// most `timeout`. A truncated datagram, or one with more descriptors, is refused, and
/// every descriptor that came with it closed.
pub(crate) fn recv_fds(
    link: BorrowedFd<'_>,
    buf: &mut [u8],
    timeout: Duration,
) -> rustix::io::Result<(usize, Vec<OwnedFd>)> {
    poll_in(&[link], timeout)?;
    let mut fds = Vec::new();
    let msg = ictus_sys::socket::recvmsg(link, &mut [IoSliceMut::new(buf)], &mut fds, RecvFlags::DONTWAIT)?;
    if msg.truncated || msg.control_truncated || fds.len() > LINK_FDS {
        return Err(Errno::MSGSIZE);
    }
    Ok((msg.bytes, fds))
}

/// The number of open descriptors of this process (for leak checks).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The number of mappings of this process whose path mentions `name` (for leak checks).
pub fn mappings_named(name: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().filter(|l| l.contains(name)).count())
}

#[cfg(test)]
#[allow(unsafe_code)] // `mprotect`, expected to be refused.
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering;

    /// What the server's page rests on: once sealed `F_SEAL_FUTURE_WRITE`, the owner's
    /// mapping stays writable and nobody can make another, nor turn a read-only one
    /// writable, nor `write(2)` to it.
    #[test]
    fn a_future_write_seal_keeps_the_flag_the_servers() {
        let fd = memfd("test-page", 4096).expect("memfd");
        let owner = map(fd.as_fd(), 4096, true).expect("owner's mapping");
        seal(fd.as_fd(), SealFlags::FUTURE_WRITE).expect("seal");
        check_memfd(fd.as_fd(), 4096, SealFlags::FUTURE_WRITE | SealFlags::SHRINK | SealFlags::GROW).expect("seals");
        owner.atomic_u32(0).store(7, Ordering::SeqCst);
        assert!(map(fd.as_fd(), 4096, true).is_err(), "a second writable mapping");
        assert!(rustix::io::write(&fd, &[1]).is_err(), "write(2)");
        let reader = map(fd.as_fd(), 4096, false).expect("read-only mapping");
        assert_eq!(reader.atomic_u32(0).load(Ordering::SeqCst), 7);
        // SAFETY: changes the protection of a mapping we own; no Rust reference is
        // invalidated, since the call is expected to fail.
        let r = unsafe {
            rustix::mm::mprotect(
                reader.ptr_at(0, 4096).cast(),
                4096,
                rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE,
            )
        };
        assert!(r.is_err(), "mprotect to writable");
        assert!(rustix::fs::ftruncate(&fd, 0).is_err(), "shrinking");
        assert!(rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE).is_err(), "sealed against seals");
    }
}
