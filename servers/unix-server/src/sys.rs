//! The server's system calls: the one unsafe layer. Each wrapper takes and returns
//! owned descriptors and byte strings, and answers `Err(errno)`.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// A result with an errno.
pub type Res<T> = Result<T, i32>;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

fn check(r: libc::c_long) -> Res<libc::c_long> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// A path as a C string (paths from the view never contain NUL).
pub fn cpath(p: &Path) -> Res<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)
}

/// `openat2(dirfd, path, how)`.
pub fn openat2(dir: Option<BorrowedFd<'_>>, path: &CStr, flags: u64, mode: u64, resolve: u64) -> Res<OwnedFd> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow { flags, mode, resolve };
    let dfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: path is a C string, how a valid open_how of the size passed (openat2(2)).
    let r = unsafe {
        libc::syscall(libc::SYS_openat2, dfd, path.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
    };
    // SAFETY: a new descriptor the kernel returned, owned by nobody else.
    check(r).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`.
pub const NO_LINKS: u64 = 0x04 | 0x02;
/// `RESOLVE_NO_MAGICLINKS`.
pub const NO_MAGICLINKS: u64 = 0x02;

/// Open a host directory with no symbolic link anywhere on its path, as `O_PATH`.
pub fn open_dir_nolinks(host: &Path) -> Res<OwnedFd> {
    let c = cpath(host)?;
    openat2(None, &c, (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64, 0, NO_LINKS)
}

/// `lstat(path)`'s mode, or the errno.
pub fn lstat_mode(path: &Path) -> Res<u32> {
    let c = cpath(path)?;
    // SAFETY: st is plain data the kernel fills (lstat(2)).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: c is a C string, st a valid struct stat.
    check(unsafe { libc::lstat(c.as_ptr(), &mut st) } as libc::c_long)?;
    Ok(st.st_mode)
}

/// `readlinkat(dir, name)`.
pub fn readlinkat(dir: Option<BorrowedFd<'_>>, name: &CStr) -> Res<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let dfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: buf has buf.len() bytes (readlinkat(2)).
    let n = unsafe { libc::readlinkat(dfd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = check(n as libc::c_long)? as usize;
    buf.truncate(n);
    Ok(buf)
}

/// `readlink(path)`.
pub fn readlink(path: &Path) -> Res<Vec<u8>> {
    let c = cpath(path)?;
    readlinkat(None, &c)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`'s file type bits (`S_IFMT`), or the errno.
pub fn lstat_type_at(dir: BorrowedFd<'_>, name: &CStr) -> Res<u32> {
    // SAFETY: st is plain data the kernel fills (fstatat(2)).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: name is a C string, st a valid struct stat.
    let r = unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    check(r as libc::c_long)?;
    Ok(st.st_mode & libc::S_IFMT)
}

/// `fstat(fd)`'s device and inode.
pub fn dev_ino(fd: BorrowedFd<'_>) -> Res<(u64, u64)> {
    // SAFETY: st is plain data the kernel fills (fstat(2)).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid struct stat.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } as libc::c_long)?;
    Ok((st.st_dev, st.st_ino))
}

/// `fstatfs(fd)`'s file system type.
pub fn fs_type(fd: BorrowedFd<'_>) -> Res<i64> {
    // SAFETY: sf is plain data the kernel fills (fstatfs(2)).
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid struct statfs.
    check(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sf) } as libc::c_long)?;
    Ok(sf.f_type as i64)
}

/// A non-blocking, close-on-exec inotify instance.
pub fn inotify() -> Res<OwnedFd> {
    // SAFETY: no pointers (inotify_init1(2)).
    let r = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    // SAFETY: a new descriptor.
    check(r as libc::c_long).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Let a detached process drop the last reference to `fd` after the caller's own.
///
/// Closing an inotify instance that holds watches waits for an SRCU grace period
/// (`fsnotify_destroy_group` flushes the mark reaper, which runs `synchronize_srcu`):
/// 7–14 ms on a two-CPU VM, paid by whoever drops the last reference — for a private
/// server that is `ictus unix run` on its way out, with its caller (a shell, `make`)
/// waiting for its exit status. Here a grandchild (reparented at once, so nobody has
/// to reap it) keeps a reference to `fd` and nothing else until the returned pipe
/// end is dropped; the caller drops it after its own close, and the grace period is
/// waited in the grandchild's exit instead.
///
/// Best effort: where a fork fails nothing is handed off (`None`, or a grandchild
/// that never came), and the caller's close is the last one, as without this.
pub fn keep_until_dropped(fd: BorrowedFd<'_>) -> Option<OwnedFd> {
    let mut p = [0 as libc::c_int; 2];
    // SAFETY: p has room for two descriptors (pipe2(2)).
    check(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } as libc::c_long).ok()?;
    // SAFETY: two new descriptors, owned from here on.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    let (keep, end) = (fd.as_raw_fd(), r.as_raw_fd());
    // SAFETY: fork(2) of a multithreaded process: the child and the grandchild make
    // only async-signal-safe calls (sigprocmask, fork, close_range, read, _exit).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above; nothing here returns.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            // No handler of the parent's runs here (SIGKILL and SIGSTOP still apply).
            libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
            if libc::fork() != 0 {
                libc::_exit(0);
            }
            // Every descriptor but the two goes: a pipe's reader upstream (the caller's
            // standard output) must not wait for this process.
            let (lo, hi) = (keep.min(end) as libc::c_uint, keep.max(end) as libc::c_uint);
            if lo > 0 {
                libc::syscall(libc::SYS_close_range, 0, lo - 1, 0);
            }
            if hi > lo + 1 {
                libc::syscall(libc::SYS_close_range, lo + 1, hi - 1, 0);
            }
            libc::syscall(libc::SYS_close_range, hi + 1, libc::c_uint::MAX, 0);
            let mut b = 0u8;
            while libc::read(end, (&mut b as *mut u8).cast(), 1) < 0 && *libc::__errno_location() == libc::EINTR {}
            libc::_exit(0);
        }
    }
    if pid < 0 {
        return None;
    }
    let mut status = 0;
    // SAFETY: our own child (waitpid(2)); it exits at once.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
    drop(r);
    Some(w)
}

/// Watch the directory `dir` (a descriptor, `O_PATH` will do) for `mask`.
pub fn inotify_watch(inotify: BorrowedFd<'_>, dir: BorrowedFd<'_>, mask: u32) -> Res<()> {
    let c = CString::new(format!("/proc/self/fd/{}", dir.as_raw_fd())).map_err(|_| libc::EINVAL)?;
    // SAFETY: c is a C string (inotify_add_watch(2); the magic link names dir's inode).
    check(unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), c.as_ptr(), mask) } as libc::c_long).map(|_| ())
}

/// Read what is queued on a non-blocking descriptor into `buf`: the bytes read, 0
/// when nothing is.
pub fn read_nonblocking(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Res<usize> {
    // SAFETY: buf has buf.len() writable bytes (read(2)).
    match check(unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } as libc::c_long) {
        Ok(n) => Ok(n as usize),
        Err(libc::EAGAIN) => Ok(0),
        Err(e) => Err(e),
    }
}

/// A raw system call whose result is a number.
///
/// # Safety
/// The arguments must be valid for `nr`, as for any system call.
pub unsafe fn raw(nr: libc::c_long, a: [libc::c_long; 6]) -> Res<libc::c_long> {
    // SAFETY: the caller's contract.
    check(unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) })
}

/// Give this thread a file-system context of its own (`unshare(CLONE_FS)`: working
/// directory, root and umask, copied) with umask 0, so that what it creates for a
/// program gets the mode the program's umask says, not also the server's own.
/// Whether it could (`unshare` of `CLONE_FS` needs no privilege).
pub fn private_umask_zero() -> bool {
    // SAFETY: no pointers (unshare(2)).
    if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
        return false;
    }
    // SAFETY: no pointers (umask(2)), on this thread's own context now.
    unsafe { libc::umask(0) };
    PRIVATE_FS.set(true);
    true
}

thread_local! {
    /// This thread has a file-system context of its own ([`private_umask_zero`]).
    static PRIVATE_FS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` with this thread's umask `mask`, for a call whose kernel side applies the
/// caller's umask and takes no mode (`bind` of a socket path), then back to 0. Only
/// on a thread with a context of its own; elsewhere `f` runs with the umask it has
/// (changing it would change it for every thread of the server).
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    if !PRIVATE_FS.get() {
        return f();
    }
    // SAFETY: no pointers (umask(2)); this thread's own context.
    unsafe { libc::umask(mask & 0o777) };
    let r = f();
    // SAFETY: as above.
    unsafe { libc::umask(0) };
    r
}

/// The umask of process `pid` (from `/proc/PID/status`), 0o022 if unreadable.
pub fn umask_of(pid: i32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Umask:")).and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// `SO_TYPE` and `SO_DOMAIN` of a socket.
pub fn socket_kind(fd: BorrowedFd<'_>) -> Option<(i32, i32)> {
    let get = |opt| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: v and len are valid for an int option (getsockopt(2)).
        let r = unsafe {
            libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, opt, (&mut v as *mut libc::c_int).cast(), &mut len)
        };
        (r == 0).then_some(v)
    };
    Some((get(libc::SO_TYPE)?, get(libc::SO_DOMAIN)?))
}

/// Turn on `SO_PASSCRED`: every message then carries the sender's credentials.
pub fn pass_credentials(fd: BorrowedFd<'_>) -> Res<()> {
    let one: libc::c_int = 1;
    // SAFETY: an int option (setsockopt(2)).
    let r = unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PASSCRED, (&one as *const libc::c_int).cast(), 4)
    };
    check(r as libc::c_long).map(|_| ())
}

/// `SO_PASSPIDFD` (Linux 6.5): every message received carries a pidfd of its sender.
const SO_PASSPIDFD: libc::c_int = 76;
/// `SCM_PIDFD`: the control message that carries it.
const SCM_PIDFD: libc::c_int = 4;

/// Turn on `SO_PASSPIDFD`: every message then carries a pidfd of the process that
/// sent it (`SCM_PIDFD`), made by the kernel when the message was sent — the process
/// itself, even if it has died and its pid been reused since. `ENOPROTOOPT` before
/// Linux 6.5.
pub fn pass_pidfd(fd: BorrowedFd<'_>) -> Res<()> {
    let one: libc::c_int = 1;
    // SAFETY: an int option (setsockopt(2), unix(7)).
    let r = unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, SO_PASSPIDFD, (&one as *const libc::c_int).cast(), 4)
    };
    check(r as libc::c_long).map(|_| ())
}

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that made the peer's end
/// (for a socketpair, the process that called `socketpair`), fixed when it was made.
pub fn peer_pidfd(fd: BorrowedFd<'_>) -> Res<OwnedFd> {
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int option and its length (getsockopt(2), unix(7)).
    let r = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, 77, (&mut v as *mut libc::c_int).cast(), &mut len)
    };
    check(r as libc::c_long)?;
    if v < 0 {
        return Err(libc::ESRCH);
    }
    // SAFETY: a new descriptor the kernel gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(v) })
}

/// `pidfd_open(pid, 0)`: a pidfd of the process `pid` names now (open to pid reuse:
/// only where the kernel has no `SCM_PIDFD`).
pub fn pidfd_open(pid: i32) -> Res<OwnedFd> {
    // SAFETY: no pointers (pidfd_open(2)).
    let r = unsafe { libc::syscall(434, pid as libc::c_long, 0 as libc::c_long) };
    // SAFETY: a new descriptor the kernel gave us.
    check(r).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_open(tid, PIDFD_THREAD)`: a pidfd of the thread `tid` (Linux 6.9), through
/// which `pidfd_getfd` reaches the thread's files even when its process's main
/// thread has exited.
pub fn pidfd_open_thread(tid: i32) -> Res<OwnedFd> {
    // SAFETY: no pointers (pidfd_open(2); PIDFD_THREAD is O_EXCL).
    let r = unsafe { libc::syscall(434, tid as libc::c_long, libc::O_EXCL as libc::c_long) };
    // SAFETY: a new descriptor the kernel gave us.
    check(r).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The thread-group id of the task a pidfd refers to (`PIDFD_GET_INFO`, Linux 6.13).
pub fn pidfd_tgid(pidfd: BorrowedFd<'_>) -> Res<u32> {
    /// `struct pidfd_info`, its first version (64 bytes).
    #[repr(C)]
    struct PidfdInfo {
        mask: u64,
        cgroupid: u64,
        pid: u32,
        tgid: u32,
        rest: [u32; 10],
    }
    const PIDFD_INFO_PID: u64 = 1;
    // _IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, struct pidfd_info): read/write, 64 bytes.
    const PIDFD_GET_INFO: libc::c_ulong = 0xC040_FF0B;
    const _: () = assert!(std::mem::size_of::<PidfdInfo>() == 64);
    let mut info = PidfdInfo { mask: PIDFD_INFO_PID, cgroupid: 0, pid: 0, tgid: 0, rest: [0; 10] };
    // SAFETY: a valid struct pidfd_info the kernel fills (ioctl_pidfd(2)).
    check(unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_INFO, &mut info) } as libc::c_long)?;
    if info.mask & PIDFD_INFO_PID == 0 || info.tgid == 0 {
        return Err(libc::ESRCH);
    }
    Ok(info.tgid)
}

/// `pidfd_getfd(pidfd, fd, 0)`: a copy of descriptor `fd` of the process `pidfd`
/// refers to (the same open file, close-on-exec). Needs ptrace access to it
/// (`PTRACE_MODE_ATTACH_REALCREDS`): `EPERM` otherwise, `EBADF` if it has no such
/// descriptor, `ESRCH` if it has exited.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, fd: i32) -> Res<OwnedFd> {
    // SAFETY: no pointers (pidfd_getfd(2)).
    let r = unsafe { libc::syscall(438, pidfd.as_raw_fd() as libc::c_long, fd as libc::c_long, 0 as libc::c_long) };
    // SAFETY: a new descriptor the kernel gave us.
    check(r).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// One received message.
#[derive(Debug)]
pub struct Received {
    /// Bytes.
    pub len: usize,
    /// Descriptors that came with it.
    pub fds: Vec<OwnedFd>,
    /// The sender's pid, uid, gid, if credentials came.
    pub cred: Option<(i32, u32, u32)>,
    /// A pidfd of the sender, if the socket has `SO_PASSPIDFD`.
    pub pidfd: Option<OwnedFd>,
    /// The datagram or its control data was cut.
    pub truncated: bool,
}

/// `recvmsg` with room for `max_fds` descriptors and credentials; descriptors are
/// close-on-exec. `Ok(None)` at end of stream (hang-up).
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], dontwait: bool) -> Res<Option<Received>> {
    // Room for SCM_RIGHTS of up to 8 descriptors, SCM_CREDENTIALS and SCM_PIDFD.
    let mut control = [0u64; 20];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let flags = libc::MSG_CMSG_CLOEXEC | if dontwait { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: msg points at live buffers (recvmsg(2)).
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) };
    let n = check(n as libc::c_long)? as usize;
    let mut fds = Vec::new();
    let mut cred = None;
    let mut pidfd = None;
    // SAFETY: walking the control messages the kernel wrote, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let u: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::ucred);
                cred = Some((u.pid, u.uid, u.gid));
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == SCM_PIDFD {
                let f = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const RawFd);
                if f >= 0 {
                    pidfd = Some(OwnedFd::from_raw_fd(f));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() && cred.is_none() && pidfd.is_none() {
        return Ok(None);
    }
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok(Some(Received { len: n, fds, cred, pidfd, truncated }))
}

/// `sendmsg` of `bytes` with `fds` attached.
pub fn send(fd: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Res<()> {
    let mut control = [0u64; 8];
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        assert!(fds.len() <= 8);
        // SAFETY: CMSG_SPACE of at most 8 descriptors fits the 64-byte buffer; the
        // header and data are written with the libc macros.
        unsafe {
            let space = libc::CMSG_SPACE((fds.len() * 4) as u32) as usize;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as usize;
            let data = libc::CMSG_DATA(c) as *mut RawFd;
            for (i, f) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), f.as_raw_fd());
            }
        }
    }
    // SAFETY: msg points at live buffers (sendmsg(2)).
    let r = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    check(r as libc::c_long).map(|_| ())
}

/// A `SOCK_SEQPACKET` socketpair, close-on-exec.
pub fn seqpacket_pair() -> Res<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for two (socketpair(2)).
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) };
    check(r as libc::c_long)?;
    // SAFETY: two new descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `epoll_create1(EPOLL_CLOEXEC)`.
pub fn epoll() -> Res<OwnedFd> {
    // SAFETY: no pointers.
    let r = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    // SAFETY: a new descriptor.
    check(r as libc::c_long).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Add or re-arm `fd` in `ep`, one-shot, for input and hang-up, with `token`.
pub fn epoll_arm(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>, token: u64, add: bool) -> Res<()> {
    let mut ev =
        libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32, u64: token };
    let op = if add { libc::EPOLL_CTL_ADD } else { libc::EPOLL_CTL_MOD };
    // SAFETY: ev is a valid event (epoll_ctl(2)).
    let r = unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) };
    check(r as libc::c_long).map(|_| ())
}

/// Add `fd` to `ep`, level-triggered, for input, with `token`: every waiter sees it
/// until it is read (the server's stop signal, which nobody reads).
pub fn epoll_add_level(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>, token: u64) -> Res<()> {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
    // SAFETY: ev is a valid event (epoll_ctl(2)).
    let r = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) };
    check(r as libc::c_long).map(|_| ())
}

/// Add `fd` to `ep`, edge-triggered, for input and hang-up, with `token`: one event
/// per arrival, never re-armed (see the server's connections).
pub fn epoll_add_edge(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>, token: u64) -> Res<()> {
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32, u64: token };
    // SAFETY: ev is a valid event (epoll_ctl(2)).
    let r = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) };
    check(r as libc::c_long).map(|_| ())
}

/// Add `fd` to `ep` for priority events (`/proc/self/mountinfo`: the mount table
/// changed), with `token`.
pub fn epoll_add_priority(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>, token: u64) -> Res<()> {
    let mut ev = libc::epoll_event { events: libc::EPOLLPRI as u32, u64: token };
    // SAFETY: ev is a valid event (epoll_ctl(2)).
    let r = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) };
    check(r as libc::c_long).map(|_| ())
}

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> Res<OwnedFd> {
    // SAFETY: no pointers (eventfd(2)).
    let r = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    // SAFETY: a new descriptor.
    check(r as libc::c_long).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Add one to an eventfd's counter (wakes its waiters).
pub fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64 (eventfd(2)).
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Wait for one event: `(token, events)`, or `None` on timeout.
pub fn epoll_wait_one(ep: BorrowedFd<'_>, timeout_ms: i32) -> Res<Option<(u64, u32)>> {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: room for one event (epoll_wait(2)).
    let r = unsafe { libc::epoll_wait(ep.as_raw_fd(), &mut ev, 1, timeout_ms) };
    match check(r as libc::c_long) {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some((ev.u64, ev.events))),
        Err(libc::EINTR) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A sealed memfd holding `bytes` (the filter for the first loader): its size and
/// contents fixed for everyone who holds it.
pub fn memfd_with(name: &CStr, bytes: &[u8]) -> Res<OwnedFd> {
    use ictus_sys::memfd::{self, SealFlags};
    use std::io::Write;
    let name = name.to_str().map_err(|_| libc::EINVAL)?;
    let fd = memfd::create(name, 0).map_err(|e| e.raw_os_error())?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let fd = OwnedFd::from(f);
    memfd::add_seals(fd.as_fd(), SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL)
        .map_err(|e| e.raw_os_error())?;
    Ok(fd)
}

/// The namespace generation page: one 64-bit counter the server bumps whenever a
/// name may have appeared in the view, which every process of the session maps
/// read-only (the memfd is sealed `F_SEAL_FUTURE_WRITE`: no process can get a
/// writable mapping or `write` it) so the library can drop its cache of failed
/// lookups.
#[derive(Debug)]
pub struct GenerationPage {
    fd: OwnedFd,
    page: ictus_sys::mm::Mapping,
    /// One writer of the shared table at a time (a reader pairs a key with the
    /// generation words around it; two writers of one slot could mix theirs).
    /// Each set's next entry to replace when all are in use.
    writing: std::sync::Mutex<Vec<u8>>,
    /// The directories the kept failures walked, watched (where the view is the
    /// host's tree): changes made outside the session reach the page through it,
    /// not through a timer. `None`: bumped every second instead.
    watch: Option<crate::watch::Watch>,
    /// Name buckets met in the targets of links that kept failures went through
    /// (one bit per bucket): making such a name anywhere drops every failure.
    link_names: [std::sync::atomic::AtomicU64; ictus_unix_emul::wire::GEN_BUCKETS / 64],
    /// What moved the page, for `--stats` and tests.
    counts: GenerationCounts,
}

/// How often a session's kept failures were made stale, and why.
#[derive(Debug, Default)]
pub struct GenerationCounts {
    /// Generation bumps (every kept failure of the session stale), by cause.
    pub bumps: [std::sync::atomic::AtomicU64; BUMP_CAUSES],
    /// Name-bucket bumps (failures with a component of one name stale).
    pub name_bumps: std::sync::atomic::AtomicU64,
    /// Failed lookups walked again by the server, watching, before being kept.
    pub walks: std::sync::atomic::AtomicU64,
}

/// Why the generation was bumped: a change served in the session, a watched
/// directory's event, the timer (views without a watch), a mount or unmount.
pub const BUMP_CAUSES: usize = 4;
/// [`GenerationCounts::bumps`] index: a change the server made for a program.
pub const BUMP_SERVED: usize = 0;
/// … an event of a watched directory (or a lost event queue).
pub const BUMP_WATCH: usize = 1;
/// … the once-a-second timer of a page without a watch.
pub const BUMP_TIMER: usize = 2;
/// … a mount or unmount anywhere.
pub const BUMP_MOUNTS: usize = 3;

impl GenerationPage {
    /// Make the page, writable here, sealed against writers elsewhere; `watched`:
    /// with a watch of the directories kept failures walk (the view is the host's
    /// tree; see [`crate::watch`]), if the kernel gives one.
    pub fn new(watched: bool) -> Res<GenerationPage> {
        use ictus_sys::memfd::{self, SealFlags};
        use ictus_sys::mm::{Mapping, Protection};
        use ictus_unix_emul::wire::GEN_SIZE;
        let fd = memfd::create("ictus-unix-generation", GEN_SIZE as u64).map_err(|e| e.raw_os_error())?;
        // The server's writable mapping first: F_SEAL_FUTURE_WRITE keeps it and
        // refuses every later one.
        let page = Mapping::shared(fd.as_fd(), GEN_SIZE, Protection::ReadWrite).map_err(|e| e.raw_os_error())?;
        memfd::add_seals(fd.as_fd(), SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL)
            .map_err(|e| e.raw_os_error())?;
        let watch = if watched { crate::watch::Watch::new().ok() } else { None };
        Ok(GenerationPage {
            fd,
            page,
            writing: std::sync::Mutex::new(vec![
                0;
                ictus_unix_emul::wire::GEN_MISSING_SLOTS
                    / ictus_unix_emul::wire::GEN_MISSING_WAYS
            ]),
            watch,
            link_names: [const { std::sync::atomic::AtomicU64::new(0) }; ictus_unix_emul::wire::GEN_BUCKETS / 64],
            counts: GenerationCounts::default(),
        })
    }

    /// Something may have appeared (for the reason `cause`, a `BUMP_*`): every
    /// cached failure is stale.
    pub fn bump(&self, cause: usize) {
        self.counts.bumps[cause % BUMP_CAUSES].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.page.atomic_u64(0).fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// How often the page moved, and why.
    pub fn counts(&self) -> &GenerationCounts {
        &self.counts
    }

    /// A file named `name` was made: failures of paths with a component of that name
    /// are stale (see `ictus_unix_emul::cache`).
    pub fn bump_name(&self, name: &[u8], cause: usize) {
        use ictus_unix_emul::wire::GEN_BUCKETS_AT;
        use std::sync::atomic::Ordering;
        let b = ictus_unix_emul::cache::bucket_of(name);
        // A name met in a link's target is not in the failures' keys: all go.
        if self.link_names[b / 64].load(Ordering::Acquire) & (1 << (b % 64)) != 0 {
            self.bump(cause);
        }
        self.counts.name_bumps.fetch_add(1, Ordering::Relaxed);
        self.page.atomic_u32(GEN_BUCKETS_AT + 4 * b).fetch_add(1, Ordering::Release);
    }

    /// A kept failure went through a link whose target names `name`.
    pub fn mark_link_name(&self, name: &[u8]) {
        let b = ictus_unix_emul::cache::bucket_of(name);
        self.link_names[b / 64].fetch_or(1 << (b % 64), std::sync::atomic::Ordering::AcqRel);
    }

    /// The watch of the directories kept failures walked, if the page has one.
    pub fn watch(&self) -> Option<&crate::watch::Watch> {
        self.watch.as_ref()
    }

    /// The generation now (tests).
    pub fn generation(&self) -> u64 {
        self.page.atomic_u64(0).load(std::sync::atomic::Ordering::Acquire)
    }

    /// What a failed lookup of `path` is kept under now (as the libraries compute it).
    pub fn generation_for(&self, path: &[u8]) -> u64 {
        use ictus_unix_emul::wire::GEN_BUCKETS_AT;
        use std::sync::atomic::Ordering::Acquire;
        let g = self.page.atomic_u64(0).load(Acquire);
        let sum =
            ictus_unix_emul::cache::bucket_sum(path, |i| self.page.atomic_u32(GEN_BUCKETS_AT + 4 * i).load(Acquire));
        (g << 32) | sum as u64
    }

    /// Publish that the lookup `key` failed under `generation` (read before it), in
    /// one of the entries of its set: the one that holds `key` already, else an empty
    /// one, else one kept under an older generation (stale for every library), else
    /// the set's next in turn.
    pub fn remember_missing(&self, key: u64, generation: u64) {
        use ictus_unix_emul::wire::{GEN_MISSING_AT, GEN_MISSING_WAYS};
        use std::sync::atomic::Ordering::{Acquire, Release};
        let mut turn = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let set = ictus_unix_emul::cache::shared_set(key);
        let entry = |i: usize| {
            let at = GEN_MISSING_AT + 16 * (set + i);
            (self.page.atomic_u64(at), self.page.atomic_u64(at + 8))
        };
        let now = self.page.atomic_u64(0).load(Acquire);
        let way = (0..GEN_MISSING_WAYS)
            .find(|&i| entry(i).0.load(Acquire) == key)
            .or_else(|| (0..GEN_MISSING_WAYS).find(|&i| entry(i).0.load(Acquire) == 0))
            .or_else(|| (0..GEN_MISSING_WAYS).find(|&i| entry(i).1.load(Acquire) >> 32 != now & 0xffff_ffff))
            .unwrap_or_else(|| {
                let t = &mut turn[set / GEN_MISSING_WAYS];
                *t = t.wrapping_add(1);
                *t as usize % GEN_MISSING_WAYS
            });
        let (k, g) = entry(way);
        g.store(u64::MAX, Release);
        k.store(key, Release);
        g.store(generation, Release);
    }

    /// A name went: "not a link" answers are stale.
    pub fn bump_unlinks(&self) {
        self.page.atomic_u64(ictus_unix_emul::wire::GEN_UNLINKS_AT).fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// Mark the calls the policy refuses (a bit each at
    /// [`GEN_REFUSED_AT`](ictus_unix_emul::wire::GEN_REFUSED_AT), bit `n % 8` of byte
    /// `n / 8`, which on x86_64 is bit `n % 32` of the 32-bit word at `n / 32`): the
    /// libraries ask the server about them instead of answering themselves. Before
    /// any program runs.
    pub fn set_refused(&self, calls: impl IntoIterator<Item = u32>) {
        const _: () = assert!(ictus_unix_emul::wire::GEN_REFUSED_AT % 4 == 0);
        for n in calls {
            if n >= ictus_unix_emul::sysno::MAX_KNOWN {
                continue;
            }
            let word = self.page.atomic_u32(ictus_unix_emul::wire::GEN_REFUSED_AT + n as usize / 32 * 4);
            word.fetch_or(1 << (n % 32), std::sync::atomic::Ordering::Release);
        }
    }

    /// The session's flags.
    pub fn flags(&self) -> u64 {
        self.page.atomic_u64(ictus_unix_emul::wire::GEN_FLAGS_AT).load(std::sync::atomic::Ordering::Acquire)
    }

    /// Set the session's flags ([`GEN_FLAGS_AT`](ictus_unix_emul::wire::GEN_FLAGS_AT)).
    /// Before any program runs.
    pub fn set_flags(&self, flags: u64) {
        self.page.atomic_u64(ictus_unix_emul::wire::GEN_FLAGS_AT).store(flags, std::sync::atomic::Ordering::Release);
    }

    /// The descriptor to hand to the session's first process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The session's count page: what the libraries did without the server (their
/// native lookups, by kind), which every process maps writable
/// ([`COUNT_FD`](ictus_unix_emul::wire::COUNT_FD)). Its size is sealed, so the
/// server's own mapping can never fault; its contents are what the libraries report
/// (a program can misreport only its own session's numbers).
#[derive(Debug)]
pub struct CountPage {
    fd: OwnedFd,
    page: ictus_sys::mm::Mapping,
}

impl CountPage {
    /// Make the page.
    pub fn new() -> Res<CountPage> {
        use ictus_sys::memfd::{self, SealFlags};
        use ictus_sys::mm::{Mapping, Protection};
        use ictus_unix_emul::wire::COUNT_SIZE;
        let fd = memfd::create("ictus-unix-counts", COUNT_SIZE as u64).map_err(|e| e.raw_os_error())?;
        memfd::add_seals(fd.as_fd(), SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| e.raw_os_error())?;
        let page = Mapping::shared(fd.as_fd(), COUNT_SIZE, Protection::ReadWrite).map_err(|e| e.raw_os_error())?;
        Ok(CountPage { fd, page })
    }

    /// The native lookups of each kind (opens, `newfstatat`, `statx`, `faccessat2`,
    /// `readlinkat`, `getcwd`).
    pub fn native_lookups(&self) -> [u64; ictus_unix_emul::wire::COUNT_KINDS] {
        use ictus_unix_emul::wire::COUNT_NATIVE_AT;
        std::array::from_fn(|k| {
            self.page.atomic_u64(COUNT_NATIVE_AT + 8 * k).load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// The descriptor to hand to the session's first process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn sockaddr_un(path: &Path) -> Res<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    if b.len() >= a.sun_path.len() || b.contains(&0) {
        return Err(libc::ENAMETOOLONG);
    }
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    Ok((a, (std::mem::size_of::<libc::sa_family_t>() + b.len() + 1) as libc::socklen_t))
}

fn seqpacket() -> Res<OwnedFd> {
    // SAFETY: no pointers.
    let r = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    // SAFETY: a new descriptor.
    check(r as libc::c_long).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A listening `SOCK_SEQPACKET` socket bound at `path`.
pub fn seqpacket_listen(path: &Path) -> Res<OwnedFd> {
    let fd = seqpacket()?;
    let (a, len) = sockaddr_un(path)?;
    // SAFETY: a is a valid sockaddr_un of len bytes (bind(2), listen(2)).
    check(unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) } as libc::c_long)?;
    // SAFETY: no pointers.
    check(unsafe { libc::listen(fd.as_raw_fd(), 64) } as libc::c_long)?;
    Ok(fd)
}

/// A `SOCK_SEQPACKET` connection to `path`.
pub fn seqpacket_connect(path: &Path) -> Res<OwnedFd> {
    let fd = seqpacket()?;
    let (a, len) = sockaddr_un(path)?;
    // SAFETY: a is a valid sockaddr_un of len bytes (connect(2)).
    check(unsafe { libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) } as libc::c_long)?;
    Ok(fd)
}

/// `accept4(fd, SOCK_CLOEXEC)`.
pub fn accept(fd: BorrowedFd<'_>) -> Res<OwnedFd> {
    // SAFETY: null address pointers are allowed (accept(2)).
    let r = unsafe { libc::accept4(fd.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
    // SAFETY: a new descriptor.
    check(r as libc::c_long).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `SO_PEERCRED`: the peer's pid, uid, gid.
pub fn peer_cred(fd: BorrowedFd<'_>) -> Res<(i32, u32, u32)> {
    // SAFETY: ucred is plain data.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: c and len are valid for SO_PEERCRED (socket(7)).
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    check(r as libc::c_long)?;
    Ok((c.pid, c.uid, c.gid))
}

/// Whether `fd` is a regular file (`fstat`; an `O_PATH` descriptor is fine).
pub fn is_regular_file(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: stat is plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a struct stat the kernel fills (fstat(2)).
    let r = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_unix_emul::wire::{GEN_MISSING_AT, GEN_MISSING_WAYS};

    /// Keys of one set of the shared table, found by trying paths.
    fn keys_of_one_set(n: usize) -> Vec<u64> {
        let mut by_set = std::collections::HashMap::<usize, Vec<u64>>::new();
        for i in 0.. {
            let k = ictus_unix_emul::cache::key_in(format!("/usr/include/h{i}.h").as_bytes(), true, None).unwrap();
            let v = by_set.entry(ictus_unix_emul::cache::shared_set(k)).or_default();
            v.push(k);
            if v.len() == n {
                return v.clone();
            }
        }
        unreachable!()
    }

    fn published(page: &GenerationPage, key: u64, generation: u64) -> bool {
        let set = ictus_unix_emul::cache::shared_set(key);
        (set..set + GEN_MISSING_WAYS).any(|i| {
            let at = GEN_MISSING_AT + 16 * i;
            page.page.atomic_u64(at).load(Ordering::Acquire) == key
                && page.page.atomic_u64(at + 8).load(Ordering::Acquire) == generation
        })
    }

    use std::sync::atomic::Ordering;

    /// As many failures as a set has entries stay published together (two that
    /// shared a slot used to push each other out, and every compile asked both);
    /// one more replaces one, and a key published again takes its own entry.
    #[test]
    fn the_shared_table_keeps_a_sets_worth_of_failures() {
        let page = GenerationPage::new(false).unwrap();
        let keys = keys_of_one_set(GEN_MISSING_WAYS + 1);
        let g = page.generation_for(b"/usr/include/x.h");
        for &k in &keys[..GEN_MISSING_WAYS] {
            page.remember_missing(k, g);
        }
        for &k in &keys[..GEN_MISSING_WAYS] {
            page.remember_missing(k, g);
            assert!(published(&page, k, g));
        }
        assert!(keys[..GEN_MISSING_WAYS].iter().all(|&k| published(&page, k, g)));
        // A stale entry goes first.
        page.bump(BUMP_SERVED);
        let g2 = page.generation_for(b"/usr/include/x.h");
        page.remember_missing(keys[1], g2);
        page.remember_missing(keys[GEN_MISSING_WAYS], g2);
        assert!(published(&page, keys[1], g2) && published(&page, keys[GEN_MISSING_WAYS], g2));
        assert_eq!(
            keys.iter().filter(|&&k| published(&page, k, g) || published(&page, k, g2)).count(),
            GEN_MISSING_WAYS
        );
        assert_eq!(page.counts().bumps[BUMP_SERVED].load(Ordering::Relaxed), 1);
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut p = [0 as libc::c_int; 2];
        // SAFETY: room for two descriptors.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: two new descriptors.
        unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
    }

    /// One read: at once (`wait` false), or once the pipe is readable, with a
    /// watchdog of a minute (a keeper that held the end would otherwise hang the test).
    fn read_one(fd: BorrowedFd<'_>, wait: bool) -> Res<usize> {
        if wait {
            let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd (poll(2)).
            assert_eq!(unsafe { libc::poll(&mut p, 1, 60_000) }, 1, "watchdog: the pipe never ended");
        }
        // SAFETY: plain fcntl(2) on our descriptor.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        let mut b = [0u8; 1];
        // SAFETY: b has one writable byte.
        check(unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), 1) } as libc::c_long).map(|n| n as usize)
    }

    /// The kept descriptor outlives our close until the returned end is dropped, and
    /// the keeper holds nothing else (a pipe of ours it inherited ends when we close
    /// our end). No timing: EOF and EAGAIN say who holds a pipe's writing end.
    #[test]
    fn a_kept_descriptor_lives_until_the_keeper_is_let_go_and_nothing_else_is_kept() {
        let (kept_r, kept_w) = pipe();
        let (other_r, other_w) = pipe();
        let keeper = keep_until_dropped(kept_w.as_fd()).expect("fork");
        drop(kept_w);
        drop(other_w);
        // Nothing else is kept: the other pipe's only writer is gone.
        assert_eq!(read_one(other_r.as_fd(), true), Ok(0), "the keeper held a descriptor it was not given");
        // The kept end is still open (the keeper's): no EOF, no data.
        assert_eq!(read_one(kept_r.as_fd(), false), Err(libc::EAGAIN));
        drop(keeper);
        // Let go: the keeper exits and the last writer goes with it.
        assert_eq!(read_one(kept_r.as_fd(), true), Ok(0));
    }
}
