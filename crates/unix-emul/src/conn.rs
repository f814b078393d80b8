//! The library's connections to the server: one `SOCK_SEQPACKET` socket per thread,
//! made on first use: a fresh socketpair, one end named by number in a hello on the
//! session socket every process inherits ([`SESSION_FD`]); the server takes it with
//! `pidfd_getfd`. The first request follows at once on the new connection (no round
//! trip for the hello), and the library closes its copy of the server's end when the
//! first reply is in: the server has taken it then.
//! The kernel stamps every request with the sender's pid, uid and gid and a pidfd of
//! it, and hangs the socket up when the process dies.
//!
//! The library sends with `sendto` and no address, never `sendmsg`: descriptors a
//! request names go as numbers ([`crate::wire::RequestHeader::fd_args`]), so the
//! filter can trap every `sendmsg` and every addressed `sendto` from anywhere, the
//! library's code included (an address is what it cannot read).
//!
//! Threads, `fork` and `vfork` are not intercepted: the table finds out lazily.
//! A thread is keyed by (pid, tid); a process whose pid is not the table's owner is
//! a fork child (its memory is its own: it closes the inherited connections and takes
//! the table over) or a `vfork`/`CLONE_VM` child that shares its parent's memory
//! (`kcmp(KCMP_VM)` says which): that one must not take the table over. It borrows an
//! idle connection of the table's owner for a call that names no descriptors (the
//! `execve` a `vfork` child makes: no socket made, no hello, nothing for the server
//! to take), and makes a connection for that one call otherwise. A borrowed
//! connection is safe because the server goes by the pid the kernel stamps on each
//! request, not by who made the connection, and takes descriptors only from the maker
//! (hence the exception). The slot is marked lent with the borrower's pid meanwhile;
//! a borrower killed between its request and the reply leaves that mark, and the
//! owner, finding it on a process that no longer shares its memory, drops the
//! connection (a reply may be waiting in it) and makes a new one.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::sys::{self, syscall6};
use crate::wire::{self, CONN_HI, MAX_REPLY_FDS, RESERVED_LO, SESSION_FD};

const SLOTS: usize = (CONN_HI - RESERVED_LO) as usize;

struct Slot {
    key: AtomicU64,
    fd: AtomicI32,
    busy: AtomicU32,
    /// The library's copy of the server's end of a new connection, kept until the
    /// first reply shows the server has taken it; -1 after.
    pending: AtomicI32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot =
    Slot { key: AtomicU64::new(0), fd: AtomicI32::new(-1), busy: AtomicU32::new(0), pending: AtomicI32::new(-1) };
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
/// A slot's `busy` with this bit: lent to the memory-sharing child whose pid is in
/// the low bits (pids are below 2^22).
const LENT: u32 = 1 << 31;
const PR_GET_DUMPABLE: u64 = 3;
const PR_SET_DUMPABLE: u64 = 4;
/// Yama's `PR_SET_PTRACER`: which process may ptrace this one when
/// `kernel.yama.ptrace_scope` is 1 (`EINVAL` without Yama: ignored).
const PR_SET_PTRACER: u64 = 0x5961_6d61;
const SO_PEERCRED: u64 = 17;
const POLLIN: i16 = 1;
/// How long the library waits for the server to take a new connection before it
/// says why it could not (generous: a loaded machine).
const HELLO_TIMEOUT_MS: u64 = 20_000;

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
/// and [`MAX_REPLY_FDS`] descriptors (16 + 16).
const CMSG_ROOM: usize = 64;

#[repr(C, align(8))]
struct Cmsg([u8; CMSG_ROOM]);

/// Why a call could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// No connection could be made (descriptors exhausted).
    NoConnection,
}

fn send(fd: i32, bytes: &[u8]) -> i64 {
    loop {
        // SAFETY: bytes is a live buffer; no address (sendto(2)).
        let r = unsafe {
            syscall6(sys::SYS_SENDTO, fd as u64, bytes.as_ptr() as u64, bytes.len() as u64, MSG_NOSIGNAL, 0, 0)
        };
        if r != -4 {
            return r;
        }
    }
}

/// Run `f` with this process dumpable: the server takes descriptors from it with
/// `pidfd_getfd` and reads its `/proc/PID` entries (working directory, umask), which
/// need ptrace access, and a process that made itself non-dumpable
/// (`PR_SET_DUMPABLE` 0, as agents holding keys do) refuses that to anyone but root
/// (its `/proc/PID` then belongs to root). It is made dumpable only for the call,
/// then put back: one `prctl` more per call for the others.
fn while_dumpable<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: no pointers (prctl(2): PR_GET_DUMPABLE).
    let was = unsafe { syscall6(sys::SYS_PRCTL, PR_GET_DUMPABLE, 0, 0, 0, 0, 0) };
    if was != 0 {
        return f();
    }
    // SAFETY: no pointers (PR_SET_DUMPABLE).
    unsafe { syscall6(sys::SYS_PRCTL, PR_SET_DUMPABLE, 1, 0, 0, 0, 0) };
    let r = f();
    // SAFETY: as above.
    unsafe { syscall6(sys::SYS_PRCTL, PR_SET_DUMPABLE, 0, 0, 0, 0, 0) };
    r
}

/// Receive one message into the `cap` bytes at `buf` (which need not be
/// initialized: the kernel writes the bytes it returns); returns (bytes, descriptors
/// received).
fn recv(
    fd: i32,
    buf: *mut u8,
    cap: usize,
    fds: &mut [i32; MAX_REPLY_FDS],
    cloexec: bool,
) -> Result<(usize, usize), i64> {
    let iov = Iovec { base: buf, len: cap };
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
                if got < MAX_REPLY_FDS {
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

/// A new connection: `(the library's end, its copy of the server's end)`, both in
/// the reserved range where the program cannot close them; the second is named in
/// the hello and closed after the first reply ([`call_blocked`]).
fn new_connection() -> Result<(i32, i32), CallError> {
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
    allow_server_to_trace();
    let mut moved = [-1i32; 2];
    for (m, fd) in moved.iter_mut().zip(pair) {
        // SAFETY: no pointers.
        let r = unsafe { syscall6(sys::SYS_FCNTL, fd as u64, F_DUPFD_CLOEXEC, RESERVED_LO as u64, 0, 0, 0) };
        sys::close(fd);
        *m = r as i32;
    }
    if moved.iter().any(|m| !(0..CONN_HI).contains(m)) {
        for m in moved.into_iter().filter(|&m| m >= 0) {
            sys::close(m);
        }
        return Err(CallError::NoConnection);
    }
    if send(SESSION_FD, &wire::encode_hello_from(moved[1], sys::gettid())) < 0 {
        sys::close(moved[0]);
        sys::close(moved[1]);
        sys::fatal(&[b"the session socket is gone; the Unix server has stopped"], 127);
    }
    Ok((moved[0], moved[1]))
}

/// Wait for the first reply on a new connection `fd`: if it never comes, the server
/// could not take the connection (`false`).
fn wait_first_reply(fd: i32) -> bool {
    #[repr(C)]
    struct PollFd {
        fd: i32,
        events: i16,
        revents: i16,
    }
    let mut p = PollFd { fd, events: POLLIN, revents: 0 };
    loop {
        // SAFETY: one pollfd (poll(2)).
        let r = unsafe { syscall6(sys::SYS_POLL, &mut p as *mut PollFd as u64, 1, HELLO_TIMEOUT_MS, 0, 0, 0) };
        if r != -4 {
            return r == 1;
        }
    }
}

/// Where Yama restricts ptrace to ancestors (`ptrace_scope` 1), let the server —
/// the process at the other end of the session socket, which is not always an
/// ancestor (`ictus unix-server`) — take descriptors from this one.
fn allow_server_to_trace() {
    if NO_YAMA.load(Ordering::Relaxed) {
        return;
    }
    let mut cred = [0i32; 3];
    let mut len = 12u32;
    // SAFETY: a struct ucred's room and its length (getsockopt(2), unix(7)).
    let r = unsafe {
        syscall6(
            sys::SYS_GETSOCKOPT,
            SESSION_FD as u64,
            SOL_SOCKET as u64,
            SO_PEERCRED,
            cred.as_mut_ptr() as u64,
            &mut len as *mut u32 as u64,
            0,
        )
    };
    if r == 0 && cred[0] > 0 {
        // SAFETY: no pointers (prctl(2), Yama).
        if unsafe { syscall6(sys::SYS_PRCTL, PR_SET_PTRACER, cred[0] as u64, 0, 0, 0, 0) } == -22 {
            // No Yama in this kernel (it cannot come later): two calls fewer per
            // connection from now on. (Yama answers EINVAL too for a pid that does
            // not exist, but this one is the live peer of the session socket.)
            NO_YAMA.store(true, Ordering::Relaxed);
        }
    }
}

/// `PR_SET_PTRACER` answered `EINVAL`: the kernel has no Yama.
static NO_YAMA: AtomicBool = AtomicBool::new(false);
/// This image has a handed connection and has not yet let the server trace it.
static TRACE_PENDING: AtomicBool = AtomicBool::new(false);

/// The loader, in a new image: the connection the server made for it and handed
/// over with the exec ([`wire::HANDED_FD`]), if any, becomes the main thread's
/// (moved into the reserved range, close-on-exec), so its first request needs no
/// socket made and no hello. The main thread's tid is the pid after an exec.
pub fn adopt_handed() {
    // SAFETY: no pointers (fcntl(2)); EBADF if nothing was handed over.
    let fd = unsafe { syscall6(sys::SYS_FCNTL, wire::HANDED_FD as u64, F_DUPFD_CLOEXEC, RESERVED_LO as u64, 0, 0, 0) };
    if fd < 0 {
        return;
    }
    sys::close(wire::HANDED_FD);
    let fd = fd as i32;
    let pid = crate::state::answer(sys::SYS_GETPID) as i32;
    if fd >= CONN_HI || pid <= 0 {
        sys::close(fd);
        return;
    }
    // Yama's exception is asked for at the first call on it (many images make none).
    TRACE_PENDING.store(true, Ordering::Relaxed);
    let s = &TABLE[0];
    s.fd.store(fd, Ordering::Release);
    s.key.store(((pid as u64) << 32) | pid as u32 as u64, Ordering::Release);
    OWNER.store(pid, Ordering::Release);
}

/// Whether this process shares its memory with its parent (a `vfork` child).
fn shares_parent_memory() -> bool {
    // SAFETY: no pointers.
    let ppid = unsafe { syscall6(sys::SYS_GETPPID, 0, 0, 0, 0, 0, 0) };
    shares_memory_with(ppid as i32)
}

/// Take the table over in a fork child: the connections in it are the parent's,
/// inherited; close this process's copies.
fn adopt(pid: i32) {
    for s in &TABLE {
        if s.key.load(Ordering::Relaxed) != 0 {
            for fd in [s.fd.swap(-1, Ordering::Relaxed), s.pending.swap(-1, Ordering::Relaxed)] {
                if fd >= 0 {
                    sys::close(fd);
                }
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
            for fd in [s.fd.swap(-1, Ordering::AcqRel), s.pending.swap(-1, Ordering::AcqRel)] {
                if fd >= 0 {
                    sys::close(fd);
                }
            }
            s.key.store(0, Ordering::Release);
            s.busy.store(0, Ordering::Release);
        }
    }
}

enum Conn {
    Slot(&'static Slot, i32),
    /// A connection of the table's owner, lent to this memory-sharing child.
    Borrowed(&'static Slot, i32),
    /// A connection for one call, and its pending end.
    Temporary(i32, i32),
}

fn temporary() -> Result<Conn, CallError> {
    new_connection().map(|(fd, pending)| Conn::Temporary(fd, pending))
}

fn in_slot(s: &'static Slot) -> Result<Conn, CallError> {
    let (fd, pending) = new_connection()?;
    s.pending.store(pending, Ordering::Release);
    s.fd.store(fd, Ordering::Release);
    Ok(Conn::Slot(s, fd))
}

/// Whether `pid` is alive and shares this process's memory (`kcmp(2)`: a process
/// that has exec'd, exited or gone has another memory, or none).
fn shares_memory_with(pid: i32) -> bool {
    // SAFETY: no pointers (kcmp(2)).
    unsafe { syscall6(sys::SYS_KCMP, sys::getpid() as u64, pid as u64, KCMP_VM, 0, 0, 0) == 0 }
}

/// In a memory-sharing child `pid`: an idle, established connection of the table's
/// owner, marked lent to `pid` until [`release`].
fn borrow(owner: i32, pid: i32) -> Option<Conn> {
    if pid <= 0 || pid as u32 & LENT != 0 {
        return None;
    }
    let ours = |s: &Slot| {
        s.key.load(Ordering::Acquire) >> 32 == owner as u64
            && s.fd.load(Ordering::Acquire) >= 0
            && s.pending.load(Ordering::Acquire) < 0
    };
    for s in &TABLE {
        if !ours(s) || s.busy.compare_exchange(0, LENT | pid as u32, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            continue;
        }
        // Checked again now that nobody else may change it.
        if ours(s) {
            return Some(Conn::Borrowed(s, s.fd.load(Ordering::Acquire)));
        }
        s.busy.store(0, Ordering::Release);
    }
    None
}

/// The owner's thread finds its slot busy with `mark`: if it is lent to a child that
/// no longer shares this memory (it was killed between request and reply), take the
/// slot back with a new connection (the old one may hold that reply).
fn take_back(s: &'static Slot, mark: u32) -> Option<Result<Conn, CallError>> {
    if mark & LENT == 0 || shares_memory_with((mark & !LENT) as i32) {
        return None;
    }
    s.busy.compare_exchange(mark, 1, Ordering::AcqRel, Ordering::Relaxed).ok()?;
    for fd in [s.fd.swap(-1, Ordering::AcqRel), s.pending.swap(-1, Ordering::AcqRel)] {
        if fd >= 0 {
            sys::close(fd);
        }
    }
    Some(in_slot(s).inspect_err(|_| s.busy.store(0, Ordering::Release)))
}

/// A connection for one call; `may_borrow`: the call names no descriptors.
fn acquire(may_borrow: bool) -> Result<Conn, CallError> {
    // The state page's pid (wiped on fork, not trusted while a child shares this
    // memory): one system call fewer per request. A program that scribbles on it
    // only misleads its own table; the server goes by the kernel's stamp.
    let pid = crate::state::answer(sys::SYS_GETPID) as i32;
    let owner = OWNER.load(Ordering::Acquire);
    if owner != pid {
        // A `vfork` child shares the table but not the descriptors: it borrows a
        // connection of the table's owner or makes one of its own for the call, never
        // one in the table — also when the parent has none yet (its first served call
        // is its child's exec): a connection the child put in the table would name a
        // descriptor only the child had, gone with its exec, for the parent's next
        // `vfork` child to borrow (`EBADF`: "lost the connection").
        if shares_parent_memory() {
            if owner != 0 && may_borrow {
                if let Some(c) = borrow(owner, pid) {
                    return Ok(c);
                }
            }
            return temporary();
        }
        adopt(pid);
    }
    // The table's own process (not a child borrowing from it: Yama's exception is
    // per process).
    if TRACE_PENDING.load(Ordering::Relaxed) && TRACE_PENDING.swap(false, Ordering::Relaxed) {
        allow_server_to_trace();
    }
    let key = ((pid as u64) << 32) | sys::gettid() as u32 as u64;
    for s in &TABLE {
        if s.key.load(Ordering::Acquire) == key {
            if let Err(mark) = s.busy.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed) {
                if let Some(c) = take_back(s, mark) {
                    return c;
                }
                // Re-entered on this thread (a signal handler's call), or lent to a
                // child that may still be in its call: a connection of its own, so
                // the replies cannot cross.
                return temporary();
            }
            let fd = s.fd.load(Ordering::Acquire);
            if fd >= 0 {
                return Ok(Conn::Slot(s, fd));
            }
            return in_slot(s).inspect_err(|_| s.busy.store(0, Ordering::Release));
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
                return in_slot(s).inspect_err(|_| {
                    s.key.store(0, Ordering::Release);
                    s.busy.store(0, Ordering::Release);
                });
            }
        }
        if round == 0 {
            reclaim(pid);
        }
    }
    temporary()
}

fn release(c: Conn) {
    match c {
        Conn::Slot(s, _) | Conn::Borrowed(s, _) => s.busy.store(0, Ordering::Release),
        Conn::Temporary(fd, pending) => {
            sys::close(fd);
            if pending >= 0 {
                sys::close(pending);
            }
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
    pub fds: [i32; MAX_REPLY_FDS],
    /// How many.
    pub nfds: usize,
}

/// Send the request in `buf[..len]` and receive the reply into `buf`, with this
/// process dumpable meanwhile (see [`while_dumpable`]). Signals other
/// than SIGSYS and the synchronous ones wait until the reply is in, so that a
/// handler's own calls never cross this one's.
pub fn call(buf: &mut [u8], len: usize, cloexec: bool) -> Result<Answer, CallError> {
    // SAFETY: buf is a live slice: its first len bytes (len <= its length, checked)
    // are initialized, and all of it is writable.
    unsafe { call_raw(buf.as_mut_ptr(), buf.len(), len.min(buf.len()), cloexec) }
}

/// [`call`] on a buffer that need not be initialized past the request: the reply is
/// received into the `cap` bytes at `buf` and only the bytes the kernel wrote are
/// read. The library's request buffers (8.8 KiB) are not zeroed per call.
///
/// # Safety
/// `buf` is valid for writing `cap` bytes, and its first `len` (`<= cap`) are
/// initialized.
pub unsafe fn call_raw(buf: *mut u8, cap: usize, len: usize, cloexec: bool) -> Result<Answer, CallError> {
    let mut old = 0u64;
    let block = BLOCK_DURING_CALL;
    // SAFETY: both pointers are to live u64s; sigsetsize 8 (rt_sigprocmask(2)).
    unsafe { syscall6(sys::SYS_RT_SIGPROCMASK, 0, &block as *const u64 as u64, &mut old as *mut u64 as u64, 8, 0, 0) };
    // SAFETY: as the caller's.
    let result = while_dumpable(|| unsafe { call_blocked(buf, cap, len, cloexec) });
    // SAFETY: as above.
    unsafe { syscall6(sys::SYS_RT_SIGPROCMASK, 2, &old as *const u64 as u64, 0, 8, 0, 0) };
    result
}

/// # Safety
/// As [`call_raw`]'s.
unsafe fn call_blocked(buf: *mut u8, cap: usize, len: usize, cloexec: bool) -> Result<Answer, CallError> {
    // SAFETY: the first len bytes are initialized (the caller's promise).
    let conn = acquire(!wire::names_descriptors(unsafe { core::slice::from_raw_parts(buf, len) }))?;
    let (fd, pending) = match conn {
        Conn::Slot(s, fd) => (fd, s.pending.load(Ordering::Acquire)),
        Conn::Borrowed(_, fd) => (fd, -1),
        Conn::Temporary(fd, pending) => (fd, pending),
    };
    // SAFETY: the first len bytes are initialized (the caller's promise).
    let sent = send(fd, unsafe { core::slice::from_raw_parts(buf, len) });
    if sent < 0 {
        release(conn);
        sys::fatal(&[b"lost the connection to the Unix server"], 127);
    }
    if pending >= 0 {
        // A new connection: the server takes it with pidfd_getfd (which needs ptrace
        // access); its first reply says it did, and the copy of its end may go.
        if !wait_first_reply(fd) {
            release(conn);
            sys::fatal(
                &[b"the Unix server did not take this process's connection (it takes it with pidfd_getfd, \
                    which needs ptrace access to the process: kernel.yama.ptrace_scope above 1?)"],
                127,
            );
        }
        if let Conn::Slot(s, _) = conn {
            s.pending.store(-1, Ordering::Release);
            sys::close(pending);
        }
    }
    let mut got = [-1i32; MAX_REPLY_FDS];
    let r = recv(fd, buf, cap, &mut got, cloexec);
    release(conn);
    let (n, nfds) = match r {
        Ok(x) => x,
        Err(_) => sys::fatal(&[b"the Unix server hung up"], 127),
    };
    // SAFETY: recvmsg wrote the first n bytes (n <= cap: a longer datagram is cut to
    // the iovec's length).
    match wire::parse_reply(unsafe { core::slice::from_raw_parts(buf, n) }, nfds) {
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
