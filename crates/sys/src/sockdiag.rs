//! Asking the kernel who is at the other end of a Unix socket, through
//! `NETLINK_SOCK_DIAG`: no `getsockopt` tells the peer of a socket received from
//! elsewhere, but the kernel's socket diagnostics do.
//!
//! One request, one reply, on a netlink socket opened for the call and closed after it:
//! no descriptor outlives the call, so nothing is shared across threads or `fork`, and
//! leak checks that count descriptors see nothing. The messages are built and parsed
//! as plain bytes in host byte order; the reply is untrusted and every length in it is
//! checked.
//!
//! ```text
//! struct nlmsghdr      { u32 nlmsg_len; u16 nlmsg_type; u16 nlmsg_flags; u32 nlmsg_seq; u32 nlmsg_pid; }  // 16
//! struct unix_diag_req { u8 sdiag_family; u8 sdiag_protocol; u16 pad; u32 udiag_states;
//!                        u32 udiag_ino; u32 udiag_show; u32 udiag_cookie[2]; }                          // 24
//! struct unix_diag_msg { u8 udiag_family; u8 udiag_type; u8 udiag_state; u8 pad;
//!                        u32 udiag_ino; u32 udiag_cookie[2]; }                                          // 16
//! struct rtattr        { u16 rta_len; u16 rta_type; }  // then the payload, padded to 4 bytes
//! struct nlmsgerr      { i32 error; struct nlmsghdr msg; ... }  // error is -errno, 0 for an ack
//! ```
//!
//! # References
//! - [`sock_diag(7)`](https://man7.org/linux/man-pages/man7/sock_diag.7.html)
//! - [`netlink(7)`](https://man7.org/linux/man-pages/man7/netlink.7.html)
//! - `include/uapi/linux/unix_diag.h`, `include/uapi/linux/sock_diag.h`, `include/uapi/linux/netlink.h`

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::FileType;
use rustix::io::Errno;
use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const AF_UNIX: u8 = 1;
const UDIAG_SHOW_PEER: u32 = 0x4;
const UNIX_DIAG_PEER: u16 = 2;
const UNIX_DIAG_MSG_LEN: usize = 16;
const INET_DIAG_NOCOOKIE: u32 = !0;
const REQUEST_LEN: usize = NLMSG_HDRLEN + 24;

/// Sequence numbers for requests, so that a reply is matched to its request.
static SEQ: AtomicU32 = AtomicU32::new(1);

/// What is wrong with a reply from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// The kernel refused the request with this error (other than `ENOENT`).
    Kernel(Errno),
    /// The reply ends before a header or field it announces.
    Truncated,
    /// A length or value in the reply is impossible.
    Malformed,
    /// A message of a type that does not answer this request.
    UnexpectedType(u16),
    /// The reply answers another request.
    WrongSeq(u32),
    /// The reply describes another socket.
    WrongInode(u32),
}

/// `send(socket(AF_NETLINK, SOCK_DGRAM, NETLINK_SOCK_DIAG), { SOCK_DIAG_BY_FAMILY,
/// unix_diag_req { AF_UNIX, udiag_ino, UDIAG_SHOW_PEER } })` then `recv`: the inode of
/// the socket at the other end of a connected `AF_UNIX` socket, asked of the kernel
/// (`UNIX_DIAG_PEER`), or `None` if the kernel
/// cannot say (no peer, sock_diag unavailable, or the module not loaded). The kernel
/// looks the socket up in the caller's network namespace, so a socket from another
/// namespace also gives `None`. `ENOTSOCK` if `fd` is not a socket.
///
/// # References
/// - [`sock_diag(7)`](https://man7.org/linux/man-pages/man7/sock_diag.7.html), `UDIAG_SHOW_PEER`
/// - [`netlink(7)`](https://man7.org/linux/man-pages/man7/netlink.7.html)
pub fn peer_inode(fd: BorrowedFd<'_>) -> rustix::io::Result<Option<u64>> {
    let st = rustix::fs::fstat(fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Socket {
        return Err(Errno::NOTSOCK);
    }
    // sockfs inode numbers are 32-bit (`get_next_ino`), as is `udiag_ino`.
    let Ok(ino) = u32::try_from(st.st_ino) else { return Ok(None) };
    let nl = match open() {
        Ok(nl) => nl,
        Err(Errno::AFNOSUPPORT | Errno::PROTONOSUPPORT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    rustix::net::send(&nl, &request(ino, seq), SendFlags::empty())?;
    let mut buf = [0u8; 8192];
    // The kernel answers within `send`, so the reply is already queued: never wait.
    let (n, _) = rustix::net::recv(&nl, &mut buf[..], RecvFlags::DONTWAIT)?;
    match parse_reply(buf.get(..n).unwrap_or(&[]), ino, seq) {
        // A peer that has been closed may show as inode 0.
        Ok(peer) => Ok(peer.filter(|&p| p != 0).map(u64::from)),
        Err(ParseError::Kernel(e)) => Err(e),
        Err(_) => Err(Errno::PROTO),
    }
}

/// A netlink socket to the kernel's sock_diag. The kernel handles a request to it in
/// the sender's `send` call and queues the reply before `send` returns.
fn open() -> rustix::io::Result<OwnedFd> {
    rustix::net::socket_with(AddressFamily::NETLINK, SocketType::DGRAM, SocketFlags::CLOEXEC, Some(netlink::SOCK_DIAG))
}

/// `nlmsghdr` + `unix_diag_req` asking for the peer of socket `ino`.
fn request(ino: u32, seq: u32) -> Vec<u8> {
    let mut r = Vec::with_capacity(REQUEST_LEN);
    r.extend_from_slice(&(REQUEST_LEN as u32).to_ne_bytes()); // nlmsg_len
    r.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes()); // nlmsg_type
    r.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes()); // nlmsg_flags
    r.extend_from_slice(&seq.to_ne_bytes()); // nlmsg_seq
    r.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel
    r.extend_from_slice(&[AF_UNIX, 0, 0, 0]); // sdiag_family, sdiag_protocol, pad
    r.extend_from_slice(&(!0u32).to_ne_bytes()); // udiag_states: all
    r.extend_from_slice(&ino.to_ne_bytes()); // udiag_ino
    r.extend_from_slice(&UDIAG_SHOW_PEER.to_ne_bytes()); // udiag_show
    r.extend_from_slice(&INET_DIAG_NOCOOKIE.to_ne_bytes()); // udiag_cookie[0]
    r.extend_from_slice(&INET_DIAG_NOCOOKIE.to_ne_bytes()); // udiag_cookie[1]
    r
}

/// Parse the kernel's reply to request `seq` about socket `ino` (public for fuzzing and
/// tests): `Some(peer inode)`,
/// `None` if the socket has no peer or the kernel does not know it (`ENOENT`).
/// Only the first message of `buf` is read; nothing in it is trusted.
pub fn parse_reply(buf: &[u8], ino: u32, seq: u32) -> Result<Option<u32>, ParseError> {
    if buf.len() < NLMSG_HDRLEN {
        return Err(ParseError::Truncated);
    }
    let len = u32_at(buf, 0)? as usize;
    if len < NLMSG_HDRLEN {
        return Err(ParseError::Malformed);
    }
    let msg = buf.get(..len).ok_or(ParseError::Truncated)?;
    let (ty, got_seq) = (u16_at(msg, 4)?, u32_at(msg, 8)?);
    if got_seq != seq {
        return Err(ParseError::WrongSeq(got_seq));
    }
    let body = &msg[NLMSG_HDRLEN..];
    match ty {
        NLMSG_ERROR => match u32_at(body, 0)? as i32 {
            0 => Ok(None), // an ack carries no answer
            e if e == -Errno::NOENT.raw_os_error() => Ok(None),
            e if (-4095..0).contains(&e) => Err(ParseError::Kernel(Errno::from_raw_os_error(-e))),
            _ => Err(ParseError::Malformed),
        },
        SOCK_DIAG_BY_FAMILY => {
            let head = body.get(..UNIX_DIAG_MSG_LEN).ok_or(ParseError::Truncated)?;
            if head[0] != AF_UNIX {
                return Err(ParseError::Malformed);
            }
            let got_ino = u32_at(head, 4)?;
            if got_ino != ino {
                return Err(ParseError::WrongInode(got_ino));
            }
            let mut attrs = &body[UNIX_DIAG_MSG_LEN..];
            while attrs.len() >= 4 {
                let (rta_len, rta_type) = (u16_at(attrs, 0)? as usize, u16_at(attrs, 2)?);
                if rta_len < 4 {
                    return Err(ParseError::Malformed);
                }
                let attr = attrs.get(..rta_len).ok_or(ParseError::Truncated)?;
                if rta_type == UNIX_DIAG_PEER {
                    return u32_at(attr, 4).map(Some);
                }
                attrs = attrs.get((rta_len + 3) & !3..).unwrap_or(&[]);
            }
            Ok(None)
        }
        other => Err(ParseError::UnexpectedType(other)),
    }
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, ParseError> {
    let s = b.get(at..at.saturating_add(2)).ok_or(ParseError::Truncated)?;
    Ok(u16::from_ne_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, ParseError> {
    let s = b.get(at..at.saturating_add(4)).ok_or(ParseError::Truncated)?;
    Ok(u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap()
    }

    fn ino_of(fd: &OwnedFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    #[test]
    fn socketpair_peers_name_each_other() {
        let (a, b) = pair();
        let Some(pa) = peer_inode(a.as_fd()).unwrap() else {
            eprintln!("skipped: the kernel does not answer NETLINK_SOCK_DIAG for AF_UNIX");
            return;
        };
        assert_eq!(pa, ino_of(&b));
        assert_eq!(peer_inode(b.as_fd()).unwrap(), Some(ino_of(&a)));
        let b_ino = ino_of(&b);
        drop(b);
        assert_ne!(peer_inode(a.as_fd()).unwrap(), Some(b_ino));
    }

    #[test]
    fn unconnected_and_non_sockets() {
        let s = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        assert_eq!(peer_inode(s.as_fd()).unwrap(), None);
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert_eq!(peer_inode(r.as_fd()), Err(Errno::NOTSOCK));
    }

    fn msg(ty: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = ((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&[0, 0]);
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(body);
        m
    }

    fn diag(ino: u32, attrs: &[(u16, u16, &[u8])]) -> Vec<u8> {
        msg(SOCK_DIAG_BY_FAMILY, 7, &diag_body(ino, attrs))
    }

    fn diag_body(ino: u32, attrs: &[(u16, u16, &[u8])]) -> Vec<u8> {
        let mut b = vec![AF_UNIX, 5, 1, 0];
        b.extend_from_slice(&ino.to_ne_bytes());
        b.extend_from_slice(&[0xff; 8]);
        for &(len, ty, payload) in attrs {
            b.extend_from_slice(&len.to_ne_bytes());
            b.extend_from_slice(&ty.to_ne_bytes());
            b.extend_from_slice(payload);
            b.resize((b.len() + 3) & !3, 0);
        }
        b
    }

    #[test]
    fn parses_crafted_replies() {
        let peer = 4242u32.to_ne_bytes();
        let name: &[u8] = b"\0abc";
        // Good replies: peer after another attribute, and none at all.
        assert_eq!(parse_reply(&diag(9, &[(8, 0, name), (8, UNIX_DIAG_PEER, &peer)]), 9, 7), Ok(Some(4242)));
        assert_eq!(parse_reply(&diag(9, &[(8, 0, name)]), 9, 7), Ok(None));
        assert_eq!(parse_reply(&diag(9, &[]), 9, 7), Ok(None));
        // Errors from the kernel.
        let err = |e: i32| msg(NLMSG_ERROR, 7, &[&e.to_ne_bytes()[..], &[0; 16]].concat());
        assert_eq!(parse_reply(&err(-2), 9, 7), Ok(None));
        assert_eq!(parse_reply(&err(-13), 9, 7), Err(ParseError::Kernel(Errno::ACCESS)));
        assert_eq!(parse_reply(&err(i32::MIN), 9, 7), Err(ParseError::Malformed));
        assert_eq!(parse_reply(&msg(NLMSG_ERROR, 7, &[0, 0]), 9, 7), Err(ParseError::Truncated));
        // Not this request, not this socket, not this kind of message.
        let good = diag(9, &[(8, UNIX_DIAG_PEER, &peer)]);
        assert_eq!(parse_reply(&good, 9, 8), Err(ParseError::WrongSeq(7)));
        assert_eq!(parse_reply(&good, 10, 7), Err(ParseError::WrongInode(9)));
        assert_eq!(parse_reply(&msg(3, 7, &[]), 9, 7), Err(ParseError::UnexpectedType(3)));
        // Truncated headers and bodies, at every length.
        for n in 0..good.len() {
            assert!(parse_reply(&good[..n], 9, 7).is_err(), "{n} bytes");
        }
        // nlmsg_len beyond the buffer, or shorter than a header.
        let mut long = good.clone();
        long[..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(parse_reply(&long, 9, 7), Err(ParseError::Truncated));
        long[..4].copy_from_slice(&3u32.to_ne_bytes());
        assert_eq!(parse_reply(&long, 9, 7), Err(ParseError::Malformed));
        // rta_len past the end, zero, or too short for the peer's u32.
        assert_eq!(parse_reply(&diag(9, &[(u16::MAX, 0, name)]), 9, 7), Err(ParseError::Truncated));
        assert_eq!(parse_reply(&diag(9, &[(0, 0, name)]), 9, 7), Err(ParseError::Malformed));
        assert_eq!(parse_reply(&diag(9, &[(6, UNIX_DIAG_PEER, &[1, 2])]), 9, 7), Err(ParseError::Truncated));
        // An unaligned last attribute whose padding runs off the end ends the walk.
        let mut odd = diag_body(9, &[(5, 0, &[1])]);
        odd.truncate(UNIX_DIAG_MSG_LEN + 5);
        assert_eq!(parse_reply(&msg(SOCK_DIAG_BY_FAMILY, 7, &odd), 9, 7), Ok(None));
        // Not AF_UNIX.
        let mut inet = diag_body(9, &[]);
        inet[0] = 2;
        assert_eq!(parse_reply(&msg(SOCK_DIAG_BY_FAMILY, 7, &inet), 9, 7), Err(ParseError::Malformed));
    }
}
