//! Messages on Unix-domain sockets with descriptors and credentials: `sendmsg(2)` and
//! `recvmsg(2)` with `SCM_RIGHTS` and `SCM_CREDENTIALS`.
//!
//! Two things go wrong with control messages unless they are done with care, and both
//! leak descriptors:
//!
//! - **Alignment.** A control buffer must be aligned for `struct cmsghdr`. rustix aligns
//!   an unaligned buffer by skipping its first bytes, which leaves a length that is not
//!   a multiple of the alignment, and glibc's `CMSG_NXTHDR` then refuses a full
//!   `SCM_RIGHTS` message: the descriptors in it stay installed in the process, owned by
//!   nobody. The buffers here are aligned by their type.
//! - **Room.** A sender may attach up to `SCM_MAX_FD` (253) descriptors. With less
//!   room the kernel installs what fits, sets `MSG_CTRUNC` and drops the rest; a
//!   receiver that then refuses the message must still close what was installed.
//!   [`recvmsg`] always has room for 253 descriptors and a credential, takes ownership
//!   of every descriptor the kernel installed (as [`OwnedFd`]s, close-on-exec) before
//!   it looks at anything else, and reports truncation of data and control separately:
//!   the caller decides, and whatever it decides, nothing is left unowned.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// The kernel's limit on descriptors in one `SCM_RIGHTS` message (`SCM_MAX_FD` in
/// `include/net/scm.h`).
pub const SCM_MAX_FD: usize = 253;

/// A sender's identity as the kernel stamped it on a message (`struct ucred`).
///
/// A process cannot claim another's pid, uid or gid unless it holds `CAP_SYS_ADMIN`
/// (pid) or `CAP_SETUID`/`CAP_SETGID` (ids), as `unix(7)` describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ucred {
    /// Process id (thread group id); 0 for a sender in a pid namespace the receiver
    /// cannot see.
    pub pid: u32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// What one [`recvmsg`] produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvMsg {
    /// Bytes placed in the buffers (for a truncated datagram, fewer than were sent).
    pub bytes: usize,
    /// The sender's credentials, if the socket has `SO_PASSCRED` on.
    pub creds: Option<Ucred>,
    /// `MSG_TRUNC`: the datagram was longer than the buffers; the rest is lost.
    pub truncated: bool,
    /// `MSG_CTRUNC`: the control data did not fit; descriptors beyond the room were
    /// closed by the kernel. Cannot happen for `SCM_RIGHTS` within the kernel's limit.
    pub control_truncated: bool,
}

/// A control-message buffer aligned for `struct cmsghdr`.
#[repr(C, align(8))]
struct Aligned<const N: usize>([MaybeUninit<u8>; N]);

/// Room for [`SCM_MAX_FD`] descriptors.
const SEND_CONTROL: usize = rustix::cmsg_space!(ScmRights(SCM_MAX_FD));
/// Room for [`SCM_MAX_FD`] descriptors and one credential.
const RECV_CONTROL: usize = rustix::cmsg_space!(ScmRights(SCM_MAX_FD), ScmCredentials(1));

/// `sendmsg(fd, &{ .msg_iov = bufs, .msg_control = SCM_RIGHTS(fds) }, flags)`: send the
/// bytes of `bufs`, gathered, with the descriptors `fds`.
///
/// Returns the number of bytes sent. `EINVAL` for more than [`SCM_MAX_FD`]
/// descriptors, as the kernel would. Nothing is retried: `EINTR` and `EAGAIN` go to the
/// caller, who knows whether to wait.
///
/// # References
/// - [`sendmsg(2)`](https://man7.org/linux/man-pages/man2/sendmsg.2.html)
/// - [`unix(7)`](https://man7.org/linux/man-pages/man7/unix.7.html), `SCM_RIGHTS`
/// - [`cmsg(3)`](https://man7.org/linux/man-pages/man3/cmsg.3.html)
pub fn sendmsg(
    fd: BorrowedFd<'_>,
    bufs: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
    flags: SendFlags,
) -> rustix::io::Result<usize> {
    if fds.len() > SCM_MAX_FD {
        return Err(Errno::INVAL);
    }
    let mut space = Aligned([MaybeUninit::<u8>::uninit(); SEND_CONTROL]);
    let mut control = SendAncillaryBuffer::new(&mut space.0);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        // Cannot happen: the buffer is aligned and sized for SCM_MAX_FD descriptors.
        return Err(Errno::INVAL);
    }
    rustix::net::sendmsg(fd, bufs, &mut control, flags)
}

/// The most bytes [`send_gathered`] sends.
pub const GATHER_MAX: usize = 512;

/// `send(fd, concat(bufs), len, flags)`: one message of the bytes of `bufs`, gathered
/// on the stack, without descriptors. For small messages `send` costs measurably less
/// than `sendmsg`, which copies and checks a message header and an iovec array from
/// user memory. `EMSGSIZE` for more than [`GATHER_MAX`] bytes. Nothing is retried.
///
/// # References
/// - [`send(2)`](https://man7.org/linux/man-pages/man2/send.2.html)
#[inline]
pub fn send_gathered(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>], flags: SendFlags) -> rustix::io::Result<usize> {
    let mut one = [MaybeUninit::<u8>::uninit(); GATHER_MAX];
    let mut at = 0;
    for b in bufs {
        if b.len() > GATHER_MAX - at {
            return Err(Errno::MSGSIZE);
        }
        // SAFETY: `at + b.len() <= GATHER_MAX` (checked just above), so the copy stays
        // inside `one`, and a slice of bytes is a valid source for its whole length.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), one.as_mut_ptr().add(at).cast::<u8>(), b.len()) };
        at += b.len();
    }
    // SAFETY: the first `at` bytes were all written just above.
    let one: &[u8] = unsafe { std::slice::from_raw_parts(one.as_ptr().cast::<u8>(), at) };
    rustix::net::send(fd, one, flags)
}

/// `recvmsg(fd, &{ .msg_iov = bufs, .msg_control = room for SCM_RIGHTS(253) and
/// SCM_CREDENTIALS }, flags | MSG_CMSG_CLOEXEC)`: receive one message into `bufs`,
/// appending every descriptor that came with it to `fds`.
///
/// Every descriptor the kernel installed is owned by `fds` when this returns, also when
/// the message was truncated, so a caller that refuses the message closes them all by
/// dropping them. They are close-on-exec (`MSG_CMSG_CLOEXEC` is always added), so none
/// leaks into a program another thread executes meanwhile. No sender address is asked
/// for: an `AF_UNIX` socket with `SO_PASSCRED` is auto-bound, so the kernel would copy
/// one out on every message for nothing (rustix's `recvmsg` always asks). The raw
/// system call is made, not glibc's wrapper, which also switches thread cancellation on
/// and off around it.
///
/// A zero-length result with no descriptors is either an empty datagram or, on a
/// connection, the peer's hang-up; only the caller can tell (`poll` for `POLLHUP`).
/// Nothing is retried: `EINTR` and `EAGAIN` go to the caller.
///
/// # References
/// - [`recvmsg(2)`](https://man7.org/linux/man-pages/man2/recvmsg.2.html)
/// - [`unix(7)`](https://man7.org/linux/man-pages/man7/unix.7.html), `SCM_RIGHTS`,
///   `SCM_CREDENTIALS`, `SO_PASSCRED`
/// - [`cmsg(3)`](https://man7.org/linux/man-pages/man3/cmsg.3.html)
pub fn recvmsg(
    fd: BorrowedFd<'_>,
    bufs: &mut [IoSliceMut<'_>],
    fds: &mut Vec<OwnedFd>,
    flags: RecvFlags,
) -> rustix::io::Result<RecvMsg> {
    let mut space = Aligned([MaybeUninit::<u8>::uninit(); RECV_CONTROL]);
    // SAFETY: an all-zero msghdr is a valid empty one (no name, no buffers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSliceMut` is ABI-compatible with `iovec` (std guarantees it on Unix).
    msg.msg_iov = bufs.as_mut_ptr().cast();
    msg.msg_iovlen = bufs.len() as _;
    msg.msg_control = space.0.as_mut_ptr().cast();
    msg.msg_controllen = RECV_CONTROL as _;
    let flags = flags.bits() as libc::c_int | libc::MSG_CMSG_CLOEXEC;
    // SAFETY: every pointer in `msg` refers to a live buffer of the stated length for
    // the duration of the call: the iovecs to `bufs` (each slice writable for its
    // length), the control buffer to `space`. recvmsg(2) writes only within them.
    let n = unsafe { libc::syscall(libc::SYS_recvmsg, fd.as_raw_fd(), &mut msg as *mut libc::msghdr, flags) };
    if n < 0 {
        return Err(Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)));
    }
    // SAFETY: the kernel has just filled `msg`; its control buffer is `space`, aligned
    // for cmsghdr, and the descriptors in it were installed for this call.
    let creds = unsafe { take_control(&msg, fds) };
    Ok(RecvMsg {
        bytes: n as usize,
        creds,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        control_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// Most messages one [`recvmmsg`] receives.
pub const BATCH_MAX: usize = 16;

/// Descriptors a message of a [`recvmmsg`] batch has room for, at least (with a
/// credential beside them); the kernel closes any beyond its room and says so
/// (`MSG_CTRUNC`).
pub const BATCH_FDS: usize = 4;

/// Room for [`BATCH_FDS`] descriptors and one credential.
const BATCH_CONTROL: usize = rustix::cmsg_space!(ScmRights(BATCH_FDS), ScmCredentials(1));

/// `recvmmsg(fd, msgs, n, flags | MSG_CMSG_CLOEXEC [| MSG_WAITFORONE], NULL)`: receive
/// up to `n` messages in one call, message `i` scattered into `bufs[i]`, its
/// descriptors appended to `fds[i]` and its outcome written to `out[i]`, where `n` is
/// the shortest of the three lists (at most [`BATCH_MAX`]). Returns how many arrived.
///
/// With `wait_for_one` the call waits (unless `flags` says `MSG_DONTWAIT`) for the
/// first message only and then takes what else is queued without waiting: one system
/// call both waits for work and drains what piled up behind it.
///
/// Each message has room for [`BATCH_FDS`] descriptors and a credential, less than
/// [`recvmsg`]'s room for the kernel's limit: a sender that attaches more finds the
/// excess closed by the kernel (`scm_detach_fds` installs what fits and releases the
/// rest), and the message says `control_truncated`. As with [`recvmsg`], every
/// descriptor that was installed is owned by `fds` when this returns; none is left
/// installed and unowned, whatever the caller decides.
///
/// # References
/// - [`recvmmsg(2)`](https://man7.org/linux/man-pages/man2/recvmmsg.2.html), `MSG_WAITFORONE`
/// - [`unix(7)`](https://man7.org/linux/man-pages/man7/unix.7.html), `SCM_RIGHTS`,
///   `SCM_CREDENTIALS`
pub fn recvmmsg(
    fd: BorrowedFd<'_>,
    bufs: &mut [&mut [IoSliceMut<'_>]],
    fds: &mut [Vec<OwnedFd>],
    out: &mut [RecvMsg],
    flags: RecvFlags,
    wait_for_one: bool,
) -> rustix::io::Result<usize> {
    let n = bufs.len().min(fds.len()).min(out.len()).min(BATCH_MAX);
    let mut space = [const { Aligned([MaybeUninit::<u8>::uninit(); BATCH_CONTROL]) }; BATCH_MAX];
    // Only the `n` headers in use are written (a batch of one does not clear sixteen).
    let mut msgs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; BATCH_MAX];
    for i in 0..n {
        // SAFETY: an all-zero mmsghdr is a valid empty one (no name, no buffers, no
        // control); the fields set below make it describe message `i`.
        let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
        // `IoSliceMut` is ABI-compatible with `iovec` (std guarantees it on Unix).
        m.msg_hdr.msg_iov = bufs[i].as_mut_ptr().cast();
        m.msg_hdr.msg_iovlen = bufs[i].len() as _;
        m.msg_hdr.msg_control = space[i].0.as_mut_ptr().cast();
        m.msg_hdr.msg_controllen = BATCH_CONTROL as _;
        msgs[i].write(m);
    }
    let mut flags = flags.bits() as libc::c_int | libc::MSG_CMSG_CLOEXEC;
    if wait_for_one {
        flags |= libc::MSG_WAITFORONE;
    }
    // SAFETY: the first `n` headers point at live buffers of the stated lengths for the
    // duration of the call: their iovecs at `bufs[i]` (each slice writable for its
    // length) and their control buffers at `space[i]`. recvmmsg(2) fills at most `n`
    // of them and writes only within those buffers; no timeout is passed.
    let got = unsafe {
        libc::syscall(
            libc::SYS_recvmmsg,
            fd.as_raw_fd(),
            msgs.as_mut_ptr().cast::<libc::mmsghdr>(),
            n as libc::c_uint,
            flags,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
    if got < 0 {
        return Err(Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)));
    }
    let got = (got as usize).min(n);
    for i in 0..got {
        // SAFETY: the first `n` headers were written above (`got` <= `n`).
        let m = unsafe { msgs[i].assume_init_ref() };
        // SAFETY: message `i` was filled by the kernel: its control buffer is aligned
        // and `msg_controllen` says what was written (see `take_control`).
        let creds = unsafe { take_control(&m.msg_hdr, &mut fds[i]) };
        out[i] = RecvMsg {
            bytes: m.msg_len as usize,
            creds,
            truncated: m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            control_truncated: m.msg_hdr.msg_flags & libc::MSG_CTRUNC != 0,
        };
    }
    Ok(got)
}

/// Takes ownership of every descriptor in a control buffer the kernel has just filled,
/// and returns the credential in it.
///
/// # Safety
/// `msg` must be a header a successful `recvmsg`/`recvmmsg` filled, with a control
/// buffer aligned for `cmsghdr` and `msg_controllen` as the kernel set it; its
/// `SCM_RIGHTS` descriptors must be owned by nobody yet (they were installed for that
/// call).
unsafe fn take_control(msg: &libc::msghdr, fds: &mut Vec<OwnedFd>) -> Option<Ucred> {
    let mut creds = None;
    // SAFETY: the CMSG_* macros walk the control buffer within `msg_controllen` (the
    // caller's contract); each SCM_RIGHTS entry is a descriptor installed for this call
    // and owned by nobody else, so taking it as an OwnedFd is what closes it whatever
    // the caller does next.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            let level = (*c).cmsg_level;
            let kind = (*c).cmsg_type;
            let data = libc::CMSG_DATA(c);
            let payload = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
                let p = data.cast::<libc::c_int>();
                for i in 0..payload / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(p.add(i).read_unaligned()));
                }
            } else if level == libc::SOL_SOCKET
                && kind == libc::SCM_CREDENTIALS
                && payload >= std::mem::size_of::<libc::ucred>()
            {
                let u = data.cast::<libc::ucred>().read_unaligned();
                creds = Some(Ucred { pid: u.pid as u32, uid: u.uid, gid: u.gid });
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    creds
}

/// `ioctl(fd, SIOCOUTQ, &n)`: on an `AF_UNIX` socket, the bytes of kernel memory its
/// sent datagrams still hold, each counted by its buffer's true size (`sk_wmem_alloc`),
/// until the peer takes it. Zero when the peer has read everything this socket (or any
/// other holder of the same open socket) sent.
///
/// # References
/// - [`unix(7)`](https://man7.org/linux/man-pages/man7/unix.7.html), `SIOCOUTQ`
///   (`SIOCOUTQ` is `TIOCOUTQ`: `include/uapi/linux/sockios.h`)
pub fn outq_len(fd: BorrowedFd<'_>) -> rustix::io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int through the pointer, which points to a
    // live, writable c_int for the duration of the call. unix(7).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if r < 0 {
        return Err(Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)));
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// `ioctl(fd, SIOCINQ, &n)`: on an `AF_UNIX` `SOCK_SEQPACKET` socket, the bytes of every
/// datagram waiting to be read (zero: nothing waits).
///
/// # References
/// - [`unix(7)`](https://man7.org/linux/man-pages/man7/unix.7.html), `SIOCINQ`
pub fn inq_len(fd: BorrowedFd<'_>) -> rustix::io::Result<usize> {
    rustix::io::ioctl_fionread(fd).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    use std::os::fd::AsFd;

    fn pair(kind: SocketType) -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(AddressFamily::UNIX, kind, SocketFlags::CLOEXEC, None).expect("socketpair")
    }

    #[test]
    fn descriptors_and_credentials_cross() {
        let (a, b) = pair(SocketType::SEQPACKET);
        rustix::net::sockopt::set_socket_passcred(&b, true).unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        let sent = sendmsg(
            a.as_fd(),
            &[IoSlice::new(b"he"), IoSlice::new(b"llo")],
            &[r.as_fd(), w.as_fd()],
            SendFlags::empty(),
        )
        .unwrap();
        assert_eq!(sent, 5);
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let m = recvmsg(b.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT).unwrap();
        assert_eq!((m.bytes, m.truncated, m.control_truncated), (5, false, false));
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(fds.len(), 2);
        let me = Ucred {
            pid: rustix::process::getpid().as_raw_nonzero().get() as u32,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        };
        assert_eq!(m.creds, Some(me));
        // The received write end reaches the original read end.
        rustix::io::write(&fds[1], b"x").unwrap();
        let mut one = [0u8; 1];
        assert_eq!(rustix::io::read(&r, &mut one).unwrap(), 1);
        // Close-on-exec, whatever the caller passed.
        assert!(rustix::io::fcntl_getfd(&fds[0]).unwrap().contains(rustix::io::FdFlags::CLOEXEC));
    }

    #[test]
    fn a_gathered_send_is_one_message() {
        let (a, b) = pair(SocketType::SEQPACKET);
        let parts = [IoSlice::new(b"head"), IoSlice::new(b""), IoSlice::new(b"body")];
        assert_eq!(send_gathered(a.as_fd(), &parts, SendFlags::empty()), Ok(8));
        let mut buf = [0u8; 16];
        let n = rustix::net::recv(&b, &mut buf, RecvFlags::DONTWAIT).unwrap().0;
        assert_eq!(&buf[..n], b"headbody");
        let big = [0u8; GATHER_MAX + 1];
        assert_eq!(send_gathered(a.as_fd(), &[IoSlice::new(&big)], SendFlags::empty()), Err(Errno::MSGSIZE));
        let exact = [7u8; GATHER_MAX];
        assert_eq!(
            send_gathered(a.as_fd(), &[IoSlice::new(&exact[..1]), IoSlice::new(&exact[1..])], SendFlags::empty()),
            Ok(GATHER_MAX)
        );
    }

    #[test]
    fn scattered_receive_and_no_credentials_without_passcred() {
        let (a, b) = pair(SocketType::SEQPACKET);
        sendmsg(a.as_fd(), &[IoSlice::new(b"headbody")], &[], SendFlags::empty()).unwrap();
        let (mut head, mut body) = ([0u8; 4], [0u8; 8]);
        let mut fds = Vec::new();
        let m = recvmsg(
            b.as_fd(),
            &mut [IoSliceMut::new(&mut head), IoSliceMut::new(&mut body)],
            &mut fds,
            RecvFlags::empty(),
        )
        .unwrap();
        assert_eq!((m.bytes, m.creds), (8, None));
        assert_eq!((&head, &body[..4]), (b"head", &b"body"[..]));
    }

    /// 253 copies of a pipe's read end arrive, all owned: once they and the original
    /// are dropped, no read end is open anywhere, which the write end sees (`EPIPE`).
    #[test]
    fn the_kernel_limit_of_descriptors_is_received_and_owned() {
        let (a, b) = pair(SocketType::SEQPACKET);
        let (r, w) = rustix::pipe::pipe().unwrap();
        let many: Vec<BorrowedFd<'_>> = (0..SCM_MAX_FD).map(|_| r.as_fd()).collect();
        sendmsg(a.as_fd(), &[IoSlice::new(b"x")], &many, SendFlags::empty()).unwrap();
        let too_many = [many.as_slice(), &[r.as_fd()]].concat();
        assert_eq!(sendmsg(a.as_fd(), &[IoSlice::new(b"x")], &too_many, SendFlags::empty()), Err(Errno::INVAL));
        let mut buf = [0u8; 1];
        let mut fds = Vec::new();
        let m = recvmsg(b.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT).unwrap();
        assert!(!m.control_truncated);
        assert_eq!(fds.len(), SCM_MAX_FD);
        drop((too_many, many));
        drop(r);
        assert!(rustix::io::write(&w, b"x").is_ok(), "the received read ends are open");
        drop(fds);
        assert_eq!(rustix::io::write(&w, b"x"), Err(Errno::PIPE), "every received read end closed by its owner");
    }

    #[test]
    fn a_truncated_datagram_is_reported_and_its_descriptors_owned() {
        let (a, b) = pair(SocketType::SEQPACKET);
        let (r, _w) = rustix::pipe::pipe().unwrap();
        sendmsg(a.as_fd(), &[IoSlice::new(&[7u8; 100])], &[r.as_fd()], SendFlags::empty()).unwrap();
        let mut buf = [0u8; 10];
        let mut fds = Vec::new();
        let m = recvmsg(b.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT).unwrap();
        assert!(m.truncated);
        assert_eq!((m.bytes, fds.len()), (10, 1));
    }

    #[test]
    fn queued_bytes_are_told_on_both_sides() {
        let (a, b) = pair(SocketType::SEQPACKET);
        assert_eq!((outq_len(a.as_fd()), inq_len(b.as_fd())), (Ok(0), Ok(0)));
        rustix::net::send(&a, &[1u8; 100], SendFlags::empty()).unwrap();
        rustix::net::send(&a, &[2u8; 50], SendFlags::empty()).unwrap();
        let out = outq_len(a.as_fd()).unwrap();
        assert!(out >= 150, "the kernel's memory for two datagrams: {out}");
        assert_eq!(inq_len(b.as_fd()), Ok(150), "the bytes of every datagram waiting");
        let mut buf = [0u8; 128];
        let mut fds = Vec::new();
        for _ in 0..2 {
            recvmsg(b.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT).unwrap();
        }
        assert_eq!((outq_len(a.as_fd()), inq_len(b.as_fd())), (Ok(0), Ok(0)));
    }

    /// Peeking a datagram that carries descriptors installs copies of them and leaves
    /// the datagram, descriptors and all, for the next reader.
    #[test]
    fn a_peek_copies_descriptors_and_leaves_the_datagram() {
        let (a, b) = pair(SocketType::SEQPACKET);
        let (r, w) = rustix::pipe::pipe().unwrap();
        sendmsg(a.as_fd(), &[IoSlice::new(b"page")], &[r.as_fd()], SendFlags::empty()).unwrap();
        drop(r);
        let mut buf = [0u8; 8];
        for _ in 0..2 {
            let mut fds = Vec::new();
            let m =
                recvmsg(b.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::PEEK | RecvFlags::DONTWAIT)
                    .unwrap();
            assert_eq!((m.bytes, fds.len()), (4, 1));
        }
        let mut fds = Vec::new();
        recvmsg(b.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT).unwrap();
        assert_eq!(fds.len(), 1, "still there for a real read");
        drop(fds);
        assert_eq!(rustix::io::write(&w, b"x"), Err(Errno::PIPE), "every copy was owned and closed");
    }

    #[test]
    fn errors_and_hang_ups() {
        let (a, b) = pair(SocketType::SEQPACKET);
        let mut buf = [0u8; 4];
        let mut fds = Vec::new();
        assert_eq!(
            recvmsg(b.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT),
            Err(Errno::AGAIN)
        );
        drop(a);
        let m = recvmsg(b.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT).unwrap();
        assert_eq!((m.bytes, fds.len()), (0, 0), "a hang-up reads as zero bytes");
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert_eq!(
            recvmsg(r.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT),
            Err(Errno::NOTSOCK)
        );
    }

    #[test]
    fn a_batch_waits_for_one_and_takes_what_is_queued() {
        let (a, b) = pair(SocketType::SEQPACKET);
        rustix::net::sockopt::set_socket_passcred(&b, true).unwrap();
        for m in [&b"one"[..], b"two", b"three"] {
            sendmsg(a.as_fd(), &[IoSlice::new(m)], &[], SendFlags::empty()).unwrap();
        }
        let (mut h0, mut h1, mut h2, mut h3) = ([0u8; 2], [0u8; 2], [0u8; 2], [0u8; 2]);
        let (mut b0, mut b1, mut b2, mut b3) = ([0u8; 8], [0u8; 8], [0u8; 8], [0u8; 8]);
        let mut s0 = [IoSliceMut::new(&mut h0), IoSliceMut::new(&mut b0)];
        let mut s1 = [IoSliceMut::new(&mut h1), IoSliceMut::new(&mut b1)];
        let mut s2 = [IoSliceMut::new(&mut h2), IoSliceMut::new(&mut b2)];
        let mut s3 = [IoSliceMut::new(&mut h3), IoSliceMut::new(&mut b3)];
        let mut bufs: [&mut [IoSliceMut<'_>]; 4] = [&mut s0, &mut s1, &mut s2, &mut s3];
        let mut fds: [Vec<OwnedFd>; 4] = Default::default();
        let mut out = [RecvMsg { bytes: 0, creds: None, truncated: false, control_truncated: false }; 4];
        let n = recvmmsg(b.as_fd(), &mut bufs, &mut fds, &mut out, RecvFlags::empty(), true).unwrap();
        assert_eq!(n, 3, "it did not wait for a fourth");
        assert_eq!(out.map(|m| m.bytes)[..3], [3, 3, 5]);
        assert!(out[..3].iter().all(|m| m.creds.is_some() && !m.truncated));
        assert_eq!((&h0, &b0[..1]), (b"on", &b"e"[..]));
        assert_eq!((&h2, &b2[..3]), (b"th", &b"ree"[..]));
        let n = recvmmsg(
            b.as_fd(),
            &mut [&mut [IoSliceMut::new(&mut b3)][..]],
            &mut fds,
            &mut out,
            RecvFlags::DONTWAIT,
            true,
        );
        assert_eq!(n, Err(Errno::AGAIN));
    }

    /// More descriptors than a batch message has room for: the kernel closes the rest,
    /// says so, and what was installed is owned (the pipe's write end sees every read
    /// end closed once they are dropped).
    #[test]
    fn a_batch_message_with_too_many_descriptors_leaks_none() {
        let (a, b) = pair(SocketType::SEQPACKET);
        let (r, w) = rustix::pipe::pipe().unwrap();
        let many: Vec<BorrowedFd<'_>> = (0..40).map(|_| r.as_fd()).collect();
        sendmsg(a.as_fd(), &[IoSlice::new(b"x")], &many, SendFlags::empty()).unwrap();
        drop(many);
        let mut buf = [0u8; 4];
        let mut fds: [Vec<OwnedFd>; 1] = Default::default();
        let mut out = [RecvMsg { bytes: 0, creds: None, truncated: false, control_truncated: false }];
        let n = recvmmsg(
            b.as_fd(),
            &mut [&mut [IoSliceMut::new(&mut buf)][..]],
            &mut fds,
            &mut out,
            RecvFlags::DONTWAIT,
            false,
        )
        .unwrap();
        assert_eq!(n, 1);
        assert!(out[0].control_truncated);
        assert!(fds[0].len() >= BATCH_FDS && fds[0].len() < 40, "{} installed", fds[0].len());
        drop(r);
        drop(fds);
        assert_eq!(rustix::io::write(&w, b"x"), Err(Errno::PIPE), "no read end left open anywhere");
    }
}
