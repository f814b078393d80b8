//! The program's `sendto` with an address, `sendmsg` and `sendmmsg`, where the view
//! confines paths (the filter traps them there: the kernel would resolve an
//! `AF_UNIX` destination path in the host's tree, and the filter cannot read an
//! address).
//!
//! - No destination and no control data: sent natively, as the program asked
//!   (`sendto` without an address, one buffer; `writev` for several without flags;
//!   gathered into one buffer otherwise, so a datagram stays one datagram).
//! - Otherwise a request `SENDMSG` to the server: the socket and the descriptors of
//!   `SCM_RIGHTS` by number (the server takes them from this process), the
//!   address, the control data and the bytes copied into the request. The server
//!   resolves an `AF_UNIX` path in the view as `connect` does, checks the control
//!   data, and sends on the program's socket.
//!
//! Everything read from the program is checked as the kernel would: lengths
//! (`EINVAL`, `EMSGSIZE`, `ENOBUFS`), pointers (`EFAULT`, copied with
//! `process_vm_readv`, never a fault in the library). A request holds at most
//! [`wire::MAX_REQUEST`] bytes: a larger datagram is `EMSGSIZE`, a stream socket
//! sends what fits (a short count, as a non-blocking one may).

use crate::sys::{self, syscall6};
use crate::sysno::{self as nr, errno};
use crate::wire;

const SYS_WRITEV: u32 = 20;
/// `sizeof(struct sockaddr_storage)`.
const MAX_NAME: usize = 128;
/// The kernel's `UIO_MAXIOV`.
const MAX_IOV: usize = 1024;
const MAX_CONTROL: usize = wire::MAX_SEND_CONTROL;
const MSG_NOSIGNAL: u64 = 0x4000;
const SIGPIPE: u64 = 13;
const SOCK_STREAM: i32 = 1;

/// A private anonymous mapping, unmapped on drop: the handler may run on a small
/// stack, and a request with its data is up to 64 KiB.
struct Scratch {
    at: u64,
    len: usize,
}

impl Scratch {
    fn new(len: usize) -> Result<Scratch, i64> {
        let len = len.max(1).div_ceil(4096) * 4096;
        // SAFETY: a fresh private anonymous mapping (mmap(2)).
        let at = unsafe { syscall6(sys::SYS_MMAP, 0, len as u64, 3, 0x22, u64::MAX, 0) };
        if at < 0 {
            return Err(-(errno::ENOMEM as i64));
        }
        Ok(Scratch { at: at as u64, len })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is ours, readable and writable, `len` bytes, alive until drop.
        unsafe { core::slice::from_raw_parts_mut(self.at as *mut u8, self.len) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new.
        unsafe { syscall6(sys::SYS_MUNMAP, self.at, self.len as u64, 0, 0, 0, 0) };
    }
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A checked `struct msghdr` of the program.
struct Msg {
    name: u64,
    namelen: usize,
    iov: u64,
    iovlen: usize,
    control: u64,
    controllen: usize,
}

fn read_msghdr(ptr: u64) -> Result<Msg, i64> {
    let mut m = [0u8; 56];
    if ptr == 0 || sys::read_own(&mut m, ptr) != 56 {
        return Err(-(errno::EFAULT as i64));
    }
    let name = le64(&m, 0);
    // An int in the kernel: negative is EINVAL; longer than an address is cut
    // (copy_msghdr_from_user).
    let namelen = u32::from_le_bytes([m[8], m[9], m[10], m[11]]) as i32;
    if namelen < 0 {
        return Err(-(errno::EINVAL as i64));
    }
    let iovlen = le64(&m, 24);
    if iovlen > MAX_IOV as u64 {
        return Err(-(errno::EMSGSIZE as i64));
    }
    let controllen = le64(&m, 40);
    if controllen > i32::MAX as u64 || controllen > MAX_CONTROL as u64 {
        return Err(-(errno::ENOBUFS as i64));
    }
    let namelen = if name == 0 { 0 } else { (namelen as usize).min(MAX_NAME) };
    Ok(Msg {
        name,
        namelen,
        iov: le64(&m, 16),
        iovlen: iovlen as usize,
        control: le64(&m, 32),
        controllen: controllen as usize,
    })
}

/// The program's iovec array, checked: `(base, len)` pairs and their total.
fn read_iov(m: &Msg, into: &mut [u8]) -> Result<usize, i64> {
    let bytes = &mut into[..16 * m.iovlen];
    if m.iovlen > 0 && sys::read_own(bytes, m.iov) != bytes.len() as i64 {
        return Err(-(errno::EFAULT as i64));
    }
    let mut total: u64 = 0;
    for i in 0..m.iovlen {
        let len = le64(bytes, 16 * i + 8);
        total = total.checked_add(len).filter(|t| *t <= i64::MAX as u64).ok_or(-(errno::EINVAL as i64))?;
    }
    Ok(total as usize)
}

/// Gather up to `room` bytes of the iovecs in `iov` into `out`.
fn gather(iov: &[u8], n: usize, out: &mut [u8]) -> Result<usize, i64> {
    let mut at = 0;
    for i in 0..n {
        if at == out.len() {
            break;
        }
        let (base, len) = (le64(iov, 16 * i), le64(iov, 16 * i + 8) as usize);
        let take = len.min(out.len() - at);
        if take > 0 && sys::read_own(&mut out[at..at + take], base) != take as i64 {
            return Err(-(errno::EFAULT as i64));
        }
        at += take;
    }
    Ok(at)
}

fn socket_type(fd: u64) -> i32 {
    let mut v = 0i32;
    let mut len = 4u32;
    // SAFETY: an int option and its length (getsockopt(2): SOL_SOCKET, SO_TYPE).
    let r =
        unsafe { syscall6(sys::SYS_GETSOCKOPT, fd, 1, 3, &mut v as *mut i32 as u64, &mut len as *mut u32 as u64, 0) };
    if r < 0 {
        -1
    } else {
        v
    }
}

/// A send refused by a full pipe raises `SIGPIPE` unless the program said
/// `MSG_NOSIGNAL`, as the kernel would have (the server sends with it).
fn pipe_signal(r: i64, flags: u64) -> i64 {
    if r == -(errno::EPIPE as i64) && flags & MSG_NOSIGNAL == 0 {
        // SAFETY: no pointers (tgkill(2)) — this thread, as the kernel signals it.
        unsafe { syscall6(sys::SYS_TGKILL, sys::getpid() as u64, sys::gettid() as u64, SIGPIPE, 0, 0, 0) };
    }
    r
}

/// Ask the server to send `data` on `fd` to `name` with `control`.
fn served(fd: u64, flags: u64, name: &[u8], control: &[u8], data: &[u8]) -> i64 {
    let len = wire::REQUEST_HEADER + name.len() + control.len() + data.len();
    let mut out = match Scratch::new(wire::MAX_REQUEST.max(len)) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let buf = out.bytes();
    let args = [fd, flags, name.len() as u64, control.len() as u64, data.len() as u64, 0];
    let Some(n) = wire::encode_request(buf, nr::SENDMSG, crate::cache::cwd_generation(), 1, args, None, None, &[])
    else {
        return -(errno::EMSGSIZE as i64);
    };
    let mut at = n;
    for part in [name, control, data] {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    buf[20..24].copy_from_slice(&((name.len() + control.len() + data.len()) as u32).to_le_bytes());
    let ans = match crate::conn::call(buf, at, false) {
        Ok(a) => a,
        Err(_) => return -(errno::EMFILE as i64),
    };
    for f in ans.fds.iter().take(ans.nfds) {
        sys::close(*f);
    }
    pipe_signal(ans.result, flags)
}

/// How many data bytes fit in a request beside `name` and `control`; a datagram
/// larger than that is `EMSGSIZE`, a stream sends a prefix.
fn fits(fd: u64, total: usize, name: usize, control: usize) -> Result<usize, i64> {
    let room = wire::MAX_REQUEST - wire::REQUEST_HEADER - name - control;
    if total <= room {
        Ok(total)
    } else if socket_type(fd) == SOCK_STREAM {
        Ok(room)
    } else {
        Err(-(errno::EMSGSIZE as i64))
    }
}

/// One `sendmsg(fd, msg, flags)` of the program.
fn sendmsg(fd: u64, msg: u64, flags: u64) -> i64 {
    let m = match read_msghdr(msg) {
        Ok(m) => m,
        Err(e) => return e,
    };
    // Room for the iovecs, then the name and control data.
    let mut scratch = match Scratch::new(16 * MAX_IOV + MAX_NAME + MAX_CONTROL) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let s = scratch.bytes();
    let (iov, rest) = s.split_at_mut(16 * MAX_IOV);
    let total = match read_iov(&m, iov) {
        Ok(t) => t,
        Err(e) => return e,
    };
    if m.namelen == 0 && m.controllen == 0 {
        // Nothing the filter could not see: natively, one datagram as asked.
        return match m.iovlen {
            // SAFETY: no buffer, no address (sendto(2)).
            0 => unsafe { syscall6(nr::SENDTO, fd, 0, 0, flags, 0, 0) },
            // SAFETY: the program's own buffer, which the kernel checks; no address.
            1 => unsafe { syscall6(nr::SENDTO, fd, le64(iov, 0), le64(iov, 8), flags, 0, 0) },
            // SAFETY: the program's own iovecs, which the kernel checks: writev on a
            // socket is a sendmsg without address, control data or flags (socket(7)).
            _ if flags == 0 => unsafe { syscall6(SYS_WRITEV, fd, m.iov, m.iovlen as u64, 0, 0, 0) },
            _ => {
                let mut data = match Scratch::new(total) {
                    Ok(d) => d,
                    Err(e) => return e,
                };
                let got = match gather(iov, m.iovlen, &mut data.bytes()[..total]) {
                    Ok(g) => g,
                    Err(e) => return e,
                };
                // SAFETY: our own buffer of `got` bytes; no address.
                unsafe { syscall6(nr::SENDTO, fd, data.at, got as u64, flags, 0, 0) }
            }
        };
    }
    let (name, rest) = rest.split_at_mut(MAX_NAME);
    let name = &mut name[..m.namelen];
    if !name.is_empty() && sys::read_own(name, m.name) != name.len() as i64 {
        return -(errno::EFAULT as i64);
    }
    let control = &mut rest[..m.controllen];
    if !control.is_empty() && sys::read_own(control, m.control) != control.len() as i64 {
        return -(errno::EFAULT as i64);
    }
    let take = match fits(fd, total, name.len(), control.len()) {
        Ok(t) => t,
        Err(e) => return e,
    };
    let mut data = match Scratch::new(take) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let got = match gather(iov, m.iovlen, &mut data.bytes()[..take]) {
        Ok(g) => g,
        Err(e) => return e,
    };
    served(fd, flags, name, control, &data.bytes()[..got])
}

/// Answer a trapped `sendto` (with an address), `sendmsg` or `sendmmsg`.
pub fn emulate(n: u32, a: [u64; 6]) -> i64 {
    match n {
        nr::SENDTO => {
            let (fd, buf, len, flags, addr, addrlen) = (a[0], a[1], a[2] as usize, a[3], a[4], a[5] as u32 as i32);
            if addr == 0 || addrlen == 0 {
                // SAFETY: the program's own pointer, which the kernel checks; no address.
                return unsafe { syscall6(nr::SENDTO, fd, buf, len as u64, flags, 0, 0) };
            }
            if addrlen < 0 || addrlen as usize > MAX_NAME {
                return -(errno::EINVAL as i64);
            }
            let mut name = [0u8; MAX_NAME];
            let name = &mut name[..addrlen as usize];
            if sys::read_own(name, addr) != name.len() as i64 {
                return -(errno::EFAULT as i64);
            }
            let take = match fits(fd, len, name.len(), 0) {
                Ok(t) => t,
                Err(e) => return e,
            };
            let mut data = match Scratch::new(take) {
                Ok(d) => d,
                Err(e) => return e,
            };
            let d = &mut data.bytes()[..take];
            if take > 0 && sys::read_own(d, buf) != take as i64 {
                return -(errno::EFAULT as i64);
            }
            served(fd, flags, name, &[], d)
        }
        nr::SENDMSG => sendmsg(a[0], a[1], a[2]),
        nr::SENDMMSG => {
            // sendmmsg(fd, msgvec, vlen, flags): each `struct mmsghdr` is a msghdr and
            // the count sent (64 bytes); stops at the first failure, which is the
            // answer only if nothing was sent.
            let (fd, vec, vlen, flags) = (a[0], a[1], (a[2] as u32 as usize).min(MAX_IOV), a[3]);
            let mut sent = 0;
            while sent < vlen {
                let at = vec.wrapping_add(64 * sent as u64);
                let r = sendmsg(fd, at, flags);
                if r < 0 {
                    return if sent == 0 { r } else { sent as i64 };
                }
                if sys::write_own(at + 56, &(r as u32).to_le_bytes()) != 4 {
                    return if sent == 0 { -(errno::EFAULT as i64) } else { sent as i64 };
                }
                sent += 1;
            }
            sent as i64
        }
        _ => -(errno::ENOSYS as i64),
    }
}
