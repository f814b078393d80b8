//! The kernel's arrival stamp on a message of a Unix socket (`SO_TIMESTAMPNS`): the time
//! the sender's message was queued to the receiving socket, taken in the sender's system
//! call. The latency experiment's instrument reads it from a cable's wake-ups
//! ([`super::cable::CableIn::read_stamped`]), so the receiver's own scheduling is not
//! part of what it measures, as the paper's interrupt-time stamps were not.
//!
//! rustix parses no timestamp control messages, hence the raw calls here.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, 1)`.
///
/// # References
/// - [`socket(7)`](https://man7.org/linux/man-pages/man7/socket.7.html), `SO_TIMESTAMPNS`
pub(crate) fn enable(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: `fd` is a socket we hold; the option value is a live `c_int` whose size is
    // passed with it (setsockopt(2)).
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
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

/// `recvmsg(fd, …, MSG_DONTWAIT | MSG_CMSG_CLOEXEC)` of one message into `buf`: its
/// length and its `SCM_TIMESTAMPNS` stamp (`CLOCK_REALTIME` ns) if it has one.
/// Descriptors a peer attached are closed. `Ok((0, _))` is the peer's hang-up on a
/// connection.
///
/// # References
/// - [`recvmsg(2)`](https://man7.org/linux/man-pages/man2/recvmsg.2.html)
/// - [`cmsg(3)`](https://man7.org/linux/man-pages/man3/cmsg.3.html)
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
    #[repr(C, align(8))]
    struct Control([u8; 256]);
    let mut control = Control([0; 256]);
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is a valid "no name, no iov, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    // SAFETY: `msg` points at `iov` (our buffer and its length) and `control`, both live
    // for the call; recvmsg(2) writes only within them.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stamp = None;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, bounded by the
    // `msg_controllen` it set (cmsg(3)). A timestamp's payload is a `timespec`, read
    // unaligned; an SCM_RIGHTS payload is `int`s, each a descriptor the kernel installed
    // in this process and nobody else owns, closed here by its `OwnedFd`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let payload = ((*c).cmsg_len as usize).saturating_sub(data.offset_from(c.cast::<u8>()) as usize);
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(data.cast::<libc::timespec>());
                stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                for i in 0..payload / std::mem::size_of::<libc::c_int>() {
                    let raw = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                    drop(OwnedFd::from_raw_fd(raw));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, stamp))
}
