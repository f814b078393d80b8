//! The library's connections to the server: one `SOCK_SEQPACKET` socket per thread,
//! made on first use by sending one end of a fresh socketpair on the session socket
//! every process inherits ([`SESSION_FD`]). The kernel stamps every request with the
//! sender's pid, uid and gid, and hangs the socket up when the process dies.
//!
//! Threads, `fork` and `vfork` are not intercepted: the table finds out lazily.
//! A thread is keyed by (pid, tid); a process whose pid is not the table's owner is
//! a fork child (its memory is its own: it closes the inherited connections and takes
//! the table over) or a `vfork`/`CLONE_VM` child that shares its parent's memory
//! (`kcmp(KCMP_VM)` says which): that one must not touch the table, and makes a
//! connection per call.

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::sys::{self, syscall6};
use crate::wire::{self, CONN_HI, MAX_FDS, RESERVED_LO, SESSION_FD};

const SLOTS: usize = (CONN_HI - RESERVED_LO) as usize;

struct Slot {
    key: AtomicU64,
    fd: AtomicI32,
    busy: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot { key: AtomicU64::new(0), fd: AtomicI32::new(-1), busy: AtomicU32::new(0) };
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static OWNER: AtomicI32 = AtomicI32::new(0);

const AF_UNIX: u64 = 1;
const SOCK_SEQPACKET: u64 = 5;
const SOCK_CLOEXEC: u64 = 0o2000000;
const F_DUPFD_CLOEXEC: u64 = 1030;
const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;
const MSG_CMSG_CLOEXEC: u64 = 0x4000_0000;
const MSG_NOSIGNAL: u64 = 0x4000;
const KCMP_VM: u64 = 1;

#[repr(C)]
struct Iovec {
    base: *const u8,
    len: usize,
}

#[repr(C)]
struct Msghdr {
    name: *mut u8,
    namelen: u32,
    iov: *const Iovec,
    iovlen: usize,
    control: *mut u8,
    controllen: usize,
    flags: i32,
}

/// Room for the control messages of a reply: the server's credentials (the
/// library's end has `SO_PASSCRED`, so the kernel adds them: 16 + 12, padded to 32)
/// and [`MAX_FDS`] descriptors (16 + 12, padded to 32).
const CMSG_ROOM: usize = 64;

#[repr(C, align(8))]
struct Cmsg([u8; CMSG_ROOM]);

/// Why a call could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// A descriptor to attach is not open (the program passed a bad one).
    BadFd,
    /// No connection could be made (descriptors exhausted).
    NoConnection,
}

fn send(fd: i32, bytes: &[u8], fds: &[i32]) -> i64 {
    let iov = Iovec { base: bytes.as_ptr(), len: bytes.len() };
    let mut cmsg = Cmsg([0; CMSG_ROOM]);
    let mut msg = Msghdr {
        name: core::ptr::null_mut(),
        namelen: 0,
        iov: &iov,
        iovlen: 1,
        control: core::ptr::null_mut(),
        controllen: 0,
        flags: 0,
    };
    if !fds.is_empty() {
        let n = fds.len().min(MAX_FDS);
        let len = 16 + 4 * n;
        cmsg.0[0..8].copy_from_slice(&(len as u64).to_le_bytes());
        cmsg.0[8..12].copy_from_slice(&SOL_SOCKET.to_le_bytes());
        cmsg.0[12..16].copy_from_slice(&SCM_RIGHTS.to_le_bytes());
        for (i, f) in fds.iter().take(n).enumerate() {
            cmsg.0[16 + 4 * i..20 + 4 * i].copy_from_slice(&f.to_le_bytes());
        }
        msg.control = cmsg.0.as_mut_ptr();
        msg.controllen = (len + 7) & !7;
    }
    loop {
        // SAFETY: msg points at live buffers for the duration of the call (sendmsg(2)).
        let r = unsafe { syscall6(sys::SYS_SENDMSG, fd as u64, &msg as *const Msghdr as u64, MSG_NOSIGNAL, 0, 0, 0) };
        if r != -4 {
            return r;
        }
    }
}

/// Receive one message; returns (bytes, descriptors received).
fn recv(fd: i32, buf: &mut [u8], fds: &mut [i32; MAX_FDS], cloexec: bool) -> Result<(usize, usize), i64> {
    let iov = Iovec { base: buf.as_mut_ptr(), len: buf.len() };
    let mut cmsg = Cmsg([0; CMSG_ROOM]);
    let mut msg = Msghdr {
        name: core::ptr::null_mut(),
        namelen: 0,
        iov: &iov,
        iovlen: 1,
        control: cmsg.0.as_mut_ptr(),
        controllen: CMSG_ROOM,
        flags: 0,
    };
    let flags = if cloexec { MSG_CMSG_CLOEXEC } else { 0 };
    let n = loop {
        // SAFETY: msg points at live buffers (recvmsg(2)).
        let r = unsafe { syscall6(sys::SYS_RECVMSG, fd as u64, &mut msg as *mut Msghdr as u64, flags, 0, 0, 0) };
        if r != -4 {
            break r;
        }
    };
    if n <= 0 {
        return Err(if n == 0 { -32 } else { n });
    }
    let mut got = 0;
    let mut at = 0usize;
    let room = msg.controllen.min(CMSG_ROOM);
    while at + 16 <= room {
        let word = |i: usize| cmsg.0[i..i + 4].try_into().map(i32::from_le_bytes).unwrap_or(0);
        let len = u64::from_le_bytes(cmsg.0[at..at + 8].try_into().unwrap_or([0; 8])) as usize;
        if len < 16 || at + len > room {
            break;
        }
        if word(at + 8) == SOL_SOCKET && word(at + 12) == SCM_RIGHTS {
            let count = (len - 16) / 4;
            for i in 0..count {
                let fd = word(at + 16 + 4 * i);
                if got < MAX_FDS {
                    fds[got] = fd;
                    got += 1;
                } else {
                    sys::close(fd);
                }
            }
        }
        at += (len + 7) & !7;
    }
    if msg.flags & 0x8 != 0 {
        // MSG_CTRUNC: descriptors were lost; the reply cannot be trusted.
        for f in fds.iter().take(got) {
            sys::close(*f);
        }
        return Err(-5);
    }
    Ok((n as usize, got))
}

fn new_connection() -> Result<i32, CallError> {
    let mut pair = [0i32; 2];
    // SAFETY: pair has room for two descriptors (socketpair(2)).
    let r = unsafe { syscall6(53, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair.as_mut_ptr() as u64, 0, 0) };
    if r < 0 {
        return Err(CallError::NoConnection);
    }
    // Credentials on every request from the first one: with SO_PASSCRED on the
    // sending end the kernel stamps each message, whatever the server's end had set
    // when it was sent (setsockopt(2), socket(7)).
    let one: i32 = 1;
    // SAFETY: an int option.
    unsafe { syscall6(54, pair[0] as u64, 1, 16, &one as *const i32 as u64, 4, 0) };
    let sent = send(SESSION_FD, &wire::HELLO, &[pair[1]]);
    sys::close(pair[1]);
    if sent < 0 {
        sys::close(pair[0]);
        sys::fatal(&[b"the session socket is gone; the Unix server has stopped"], 127);
    }
    // SAFETY: no pointers.
    let moved = unsafe { syscall6(sys::SYS_FCNTL, pair[0] as u64, F_DUPFD_CLOEXEC, RESERVED_LO as u64, 0, 0, 0) };
    sys::close(pair[0]);
    if moved < 0 {
        return Err(CallError::NoConnection);
    }
    if moved >= CONN_HI as i64 {
        sys::close(moved as i32);
        return Err(CallError::NoConnection);
    }
    Ok(moved as i32)
}

/// Whether this process shares its memory with its parent (a `vfork` child).
fn shares_parent_memory() -> bool {
    // SAFETY: no pointers.
    let ppid = unsafe { syscall6(sys::SYS_GETPPID, 0, 0, 0, 0, 0, 0) };
    // SAFETY: no pointers (kcmp(2)).
    unsafe { syscall6(sys::SYS_KCMP, sys::getpid() as u64, ppid as u64, KCMP_VM, 0, 0, 0) == 0 }
}

/// Take the table over in a fork child: the connections in it are the parent's,
/// inherited; close this process's copies.
fn adopt(pid: i32) {
    for s in &TABLE {
        if s.key.load(Ordering::Relaxed) != 0 {
            let fd = s.fd.swap(-1, Ordering::Relaxed);
            if fd >= 0 {
                sys::close(fd);
            }
            s.key.store(0, Ordering::Relaxed);
            s.busy.store(0, Ordering::Relaxed);
        }
    }
    OWNER.store(pid, Ordering::Release);
}

/// Free the slots of this process's threads that have exited.
fn reclaim(pid: i32) {
    for s in &TABLE {
        let key = s.key.load(Ordering::Acquire);
        if key >> 32 != pid as u64 || s.busy.load(Ordering::Acquire) != 0 {
            continue;
        }
        let tid = key as u32 as u64;
        // SAFETY: signal 0 only checks existence (tgkill(2)).
        if unsafe { syscall6(sys::SYS_TGKILL, pid as u64, tid, 0, 0, 0, 0) } == -3
            && s.busy.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            let fd = s.fd.swap(-1, Ordering::AcqRel);
            if fd >= 0 {
                sys::close(fd);
            }
            s.key.store(0, Ordering::Release);
            s.busy.store(0, Ordering::Release);
        }
    }
}

enum Conn {
    Slot(&'static Slot, i32),
    Temporary(i32),
}

fn acquire() -> Result<Conn, CallError> {
    // The state page's pid (wiped on fork, not trusted while a child shares this
    // memory): one system call fewer per request. A program that scribbles on it
    // only misleads its own table; the server goes by the kernel's stamp.
    let pid = crate::state::answer(sys::SYS_GETPID) as i32;
    let owner = OWNER.load(Ordering::Acquire);
    if owner != pid {
        if owner != 0 && shares_parent_memory() {
            return new_connection().map(Conn::Temporary);
        }
        adopt(pid);
    }
    let key = ((pid as u64) << 32) | sys::gettid() as u32 as u64;
    for s in &TABLE {
        if s.key.load(Ordering::Acquire) == key {
            if s.busy.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                // Re-entered on this thread (a signal handler's call): a connection
                // of its own, so the replies cannot cross.
                return new_connection().map(Conn::Temporary);
            }
            let fd = s.fd.load(Ordering::Acquire);
            if fd >= 0 {
                return Ok(Conn::Slot(s, fd));
            }
            let fd = match new_connection() {
                Ok(fd) => fd,
                Err(e) => {
                    s.busy.store(0, Ordering::Release);
                    return Err(e);
                }
            };
            s.fd.store(fd, Ordering::Release);
            return Ok(Conn::Slot(s, fd));
        }
    }
    for round in 0..2 {
        for s in &TABLE {
            if s.key.load(Ordering::Acquire) == 0
                && s.busy.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                if s.key.compare_exchange(0, key, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                    s.busy.store(0, Ordering::Release);
                    continue;
                }
                let fd = match new_connection() {
                    Ok(fd) => fd,
                    Err(e) => {
                        s.key.store(0, Ordering::Release);
                        s.busy.store(0, Ordering::Release);
                        return Err(e);
                    }
                };
                s.fd.store(fd, Ordering::Release);
                return Ok(Conn::Slot(s, fd));
            }
        }
        if round == 0 {
            reclaim(pid);
        }
    }
    new_connection().map(Conn::Temporary)
}

fn release(c: Conn) {
    match c {
        Conn::Slot(s, _) => s.busy.store(0, Ordering::Release),
        Conn::Temporary(fd) => {
            sys::close(fd);
        }
    }
}

/// Every signal but SIGSYS and the synchronous ones (SIGILL, SIGTRAP, SIGBUS, SIGFPE,
/// SIGSEGV), which the kernel would force through anyway.
const BLOCK_DURING_CALL: u64 =
    !((1 << (31 - 1)) | (1 << (4 - 1)) | (1 << (5 - 1)) | (1 << (7 - 1)) | (1 << (8 - 1)) | (1 << (11 - 1)));

/// What a call returned: its result, the length of its data in the buffer, and the
/// descriptors that came with it.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// The call's result or `-errno`.
    pub result: i64,
    /// Where the data starts in the buffer.
    pub data_at: usize,
    /// Bytes of data.
    pub data_len: usize,
    /// Descriptors received (installed in this process).
    pub fds: [i32; MAX_FDS],
    /// How many.
    pub nfds: usize,
}

/// Send the request in `buf[..len]` with `fds` attached, and receive the reply into
/// `buf`. Signals other than SIGSYS and the synchronous ones wait until the reply is
/// in, so that a handler's own calls never cross this one's.
pub fn call(buf: &mut [u8], len: usize, fds: &[i32], cloexec: bool) -> Result<Answer, CallError> {
    let mut old = 0u64;
    let block = BLOCK_DURING_CALL;
    // SAFETY: both pointers are to live u64s; sigsetsize 8 (rt_sigprocmask(2)).
    unsafe { syscall6(sys::SYS_RT_SIGPROCMASK, 0, &block as *const u64 as u64, &mut old as *mut u64 as u64, 8, 0, 0) };
    let result = call_blocked(buf, len, fds, cloexec);
    // SAFETY: as above.
    unsafe { syscall6(sys::SYS_RT_SIGPROCMASK, 2, &old as *const u64 as u64, 0, 8, 0, 0) };
    result
}

fn call_blocked(buf: &mut [u8], len: usize, fds: &[i32], cloexec: bool) -> Result<Answer, CallError> {
    let conn = acquire()?;
    let fd = match conn {
        Conn::Slot(_, fd) | Conn::Temporary(fd) => fd,
    };
    let sent = send(fd, &buf[..len], fds);
    if sent < 0 {
        release(conn);
        if sent == -9 {
            return Err(CallError::BadFd);
        }
        sys::fatal(&[b"lost the connection to the Unix server"], 127);
    }
    let mut got = [-1i32; MAX_FDS];
    let r = recv(fd, buf, &mut got, cloexec);
    release(conn);
    let (n, nfds) = match r {
        Ok(x) => x,
        Err(_) => sys::fatal(&[b"the Unix server hung up"], 127),
    };
    match wire::parse_reply(&buf[..n], nfds) {
        Some((result, data)) => {
            let data_len = data.len();
            Ok(Answer { result, data_at: wire::REPLY_HEADER, data_len, fds: got, nfds })
        }
        None => {
            for f in got.iter().take(nfds) {
                sys::close(*f);
            }
            sys::fatal(&[b"malformed reply from the Unix server"], 127)
        }
    }
}
