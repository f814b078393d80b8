//! Reply pipes: one small message per write, whole or not at all, never waiting on a
//! peer. The nucleus's call channels and the real-time ports answer calls through
//! them (`doc/ipc.md`, *Calls*; `doc/rt-ipc.md`).
//!
//! A pipe carries a small message for about half what a `SOCK_SEQPACKET` datagram
//! costs (no socket buffer to allocate, no credentials to attach). A write of at most
//! [`PIPE_BUF`] bytes is atomic: it goes in whole or, with `RWF_NOWAIT`, not at all. A
//! pipe keeps no message boundaries, so a reader that wants one message per read must
//! never let two be in the pipe at once; that is the caller's protocol (one call in
//! flight per pipe).
//!
//! The write end travels to another task, which can clear `O_NONBLOCK` on it or keep a
//! copy: so a writer never relies on the file's status flags and asks the kernel not to
//! wait for each write instead ([`write_nowait`]).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::io::{Errno, ReadWriteFlags};

/// Bytes a pipe write keeps whole (`PIPE_BUF`, pipe(7)).
pub const PIPE_BUF: usize = 4096;

/// `pipe2(O_CLOEXEC)`: `(read end, write end)`.
///
/// # References
/// - [`pipe(2)`](https://man7.org/linux/man-pages/man2/pipe.2.html)
pub fn pair() -> rustix::io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
}

/// Whether an untrusted descriptor is the write end of a pipe (`fstat` says FIFO,
/// `F_GETFL` says write-only).
pub fn is_write_end(fd: BorrowedFd<'_>) -> bool {
    let fifo = rustix::fs::fstat(fd)
        .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo);
    fifo && rustix::fs::fcntl_getfl(fd).is_ok_and(|f| f & rustix::fs::OFlags::RWMODE == rustix::fs::OFlags::WRONLY)
}

/// `pwritev2(fd, bufs, -1, RWF_NOWAIT)`: one message, gathered, at the pipe's own
/// position, without waiting for room. `Ok(())` only if all of it went; a message of
/// at most [`PIPE_BUF`] bytes goes whole or not at all (`EAGAIN` when the pipe is
/// full, `EPIPE` when no reader is left; a short write, which only a longer message
/// can see, is `EIO`). `EINTR` is retried.
///
/// # References
/// - [`pwritev2(2)`](https://man7.org/linux/man-pages/man2/pwritev2.2.html), `RWF_NOWAIT`
/// - [`pipe(7)`](https://man7.org/linux/man-pages/man7/pipe.7.html), `PIPE_BUF`
pub fn write_nowait(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> rustix::io::Result<()> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    loop {
        match rustix::io::pwritev2(fd, bufs, u64::MAX, ReadWriteFlags::NOWAIT) {
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
            Ok(n) => return if n == total { Ok(()) } else { Err(Errno::IO) },
        }
    }
}

/// `readv(fd, bufs)`, waiting for data: the bytes read (`0`: every write end is
/// closed). `EINTR` is retried.
///
/// # References
/// - [`readv(2)`](https://man7.org/linux/man-pages/man2/readv.2.html)
pub fn read(fd: BorrowedFd<'_>, bufs: &mut [IoSliceMut<'_>]) -> rustix::io::Result<usize> {
    loop {
        match rustix::io::readv(fd, bufs) {
            Err(Errno::INTR) => {}
            other => return other,
        }
    }
}

/// `preadv2(fd, bufs, -1, RWF_NOWAIT)`: what is in the pipe now, without waiting
/// (`EAGAIN`: nothing; `0`: every write end is closed). `EINTR` is retried.
///
/// # References
/// - [`preadv2(2)`](https://man7.org/linux/man-pages/man2/preadv2.2.html), `RWF_NOWAIT`
pub fn read_nowait(fd: BorrowedFd<'_>, bufs: &mut [IoSliceMut<'_>]) -> rustix::io::Result<usize> {
    loop {
        match rustix::io::preadv2(fd, bufs, u64::MAX, ReadWriteFlags::NOWAIT) {
            Err(Errno::INTR) => {}
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn one_message_whole_and_never_waiting() {
        let (r, w) = pair().unwrap();
        assert!(is_write_end(w.as_fd()));
        assert!(!is_write_end(r.as_fd()));
        let mut buf = [0u8; 16];
        assert_eq!(read_nowait(r.as_fd(), &mut [IoSliceMut::new(&mut buf)]), Err(Errno::AGAIN));
        write_nowait(w.as_fd(), &[IoSlice::new(b"he"), IoSlice::new(b"llo")]).unwrap();
        let (mut head, mut rest) = ([0u8; 2], [0u8; 8]);
        assert_eq!(read(r.as_fd(), &mut [IoSliceMut::new(&mut head), IoSliceMut::new(&mut rest)]), Ok(5));
        assert_eq!((&head, &rest[..3]), (b"he", &b"llo"[..]));
        // Fill the pipe: a message that does not fit is refused whole.
        let big = [7u8; PIPE_BUF];
        while write_nowait(w.as_fd(), &[IoSlice::new(&big)]).is_ok() {}
        assert_eq!(write_nowait(w.as_fd(), &[IoSlice::new(&big)]), Err(Errno::AGAIN));
        drop(r);
        assert_eq!(write_nowait(w.as_fd(), &[IoSlice::new(b"x")]), Err(Errno::PIPE));
    }

    #[test]
    fn end_of_file_when_the_writers_are_gone() {
        let (r, w) = pair().unwrap();
        drop(w);
        let mut buf = [0u8; 4];
        assert_eq!(read_nowait(r.as_fd(), &mut [IoSliceMut::new(&mut buf)]), Ok(0));
        assert_eq!(read(r.as_fd(), &mut [IoSliceMut::new(&mut buf)]), Ok(0));
    }
}
