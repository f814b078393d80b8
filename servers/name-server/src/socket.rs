//! The well-known socket: how a task without a bootstrap right finds the name server.
//!
//! # Where it is
//!
//! - `$XDG_RUNTIME_DIR/ictus/name-server.sock` when `XDG_RUNTIME_DIR` is set to an
//!   absolute path naming a directory (the per-user, `0700`, tmpfs directory that
//!   `systemd-logind` and `pam_systemd` make);
//! - otherwise `/tmp/ictus-$UID/name-server.sock` (`$UID` the effective uid, in
//!   decimal). `/tmp` is named literally, not taken from `TMPDIR`, so that a server
//!   and a client with different environments still meet.
//! - `--socket PATH` (and [`crate::Client::connect_socket`]) overrides both.
//!
//! The server makes the `ictus` (or `ictus-$UID`) directory with mode `0700` if it is
//! missing, and refuses to start unless it is a real directory (not a symbolic link)
//! owned by the effective uid with no group or world permissions: in a shared `/tmp`
//! another user could otherwise make the directory first and put their own socket in
//! it. An explicit `--socket PATH` is used as given; its directory must exist.
//!
//! # What it does
//!
//! It is an `AF_UNIX SOCK_SEQPACKET` listening socket (mode `0600`). On each connection
//! the server reads the peer's `SO_PEERCRED`; a peer whose uid is neither the server's
//! nor root is refused (closed unanswered). Any other peer gets one datagram, the
//! 8-byte [`HANDSHAKE`] with one descriptor in `SCM_RIGHTS`: a send right to the
//! server's service port. The client checks that the server's `SO_PEERCRED` uid is its
//! own or root, that the bytes are the handshake and that exactly one descriptor came,
//! then inserts the right into its space ([`ictus_ipc::Space::insert_send_fd`], which
//! checks it is a port socket). Everything after that goes through ports.
//!
//! # One server per path, and stale paths
//!
//! Beside the socket the server keeps a lock file, `PATH.lock`, holding an exclusive
//! `flock` for as long as it runs. The kernel drops the lock when the process dies,
//! even by `kill -9`, so:
//!
//! - if the lock is held, another server is running: refuse to start ("already
//!   running");
//! - otherwise, if something is at `PATH`: if it is not a socket, refuse (the server
//!   never removes what it did not make); if connecting to it succeeds, a server that
//!   does not take the lock answers there: refuse; if the connection is refused
//!   (`ECONNREFUSED`: a server killed by `kill -9` left it), remove it and bind afresh.
//!
//! On a clean exit (`SIGTERM`, `SIGINT`, or [`crate::server::Running::stop`]) the server
//! removes the socket — only if the path still names the socket it bound — and the lock
//! file. After `kill -9` both stay behind, harmlessly, until the next server reclaims
//! them.

use std::ffi::OsStr;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// The bytes the server sends with the service right: "ICNS", then protocol version 1.
pub const HANDSHAKE: [u8; 8] = *b"ICNS\x01\0\0\0";
/// The socket's file name inside its directory.
pub const SOCKET_FILE: &str = "name-server.sock";

/// Why the socket's path or directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The directory is not safe to use.
    #[error("{path}: {why}; refusing to use it for the name server's socket")]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The directory could not be made or examined.
    #[error("{path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The default socket path for this process's environment and effective uid, without
/// making or checking anything.
pub fn default_socket_path() -> PathBuf {
    let xdg = std::env::var_os("XDG_RUNTIME_DIR");
    socket_path_for(xdg.as_deref(), euid())
}

/// The default socket path for a value of `XDG_RUNTIME_DIR` and a uid: see the
/// module documentation.
pub fn socket_path_for(xdg_runtime_dir: Option<&OsStr>, uid: u32) -> PathBuf {
    socket_dir_for(xdg_runtime_dir, uid).join(SOCKET_FILE)
}

fn socket_dir_for(xdg_runtime_dir: Option<&OsStr>, uid: u32) -> PathBuf {
    match xdg_runtime_dir.map(Path::new) {
        Some(dir) if dir.is_absolute() && dir.is_dir() => dir.join("ictus"),
        _ => PathBuf::from(format!("/tmp/ictus-{uid}")),
    }
}

/// The default socket path, with its directory made (mode `0700`) if missing and
/// checked to be private to us.
pub fn prepare_default_socket_path() -> Result<PathBuf, PathError> {
    let xdg = std::env::var_os("XDG_RUNTIME_DIR");
    let dir = socket_dir_for(xdg.as_deref(), euid());
    ensure_private_dir(&dir)?;
    Ok(dir.join(SOCKET_FILE))
}

/// Make `dir` with mode `0700` if it does not exist, then check that it is a real
/// directory owned by the effective uid with no group or world permissions.
pub fn ensure_private_dir(dir: &Path) -> Result<(), PathError> {
    let io = |source| PathError::Io { path: dir.to_owned(), source };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    check_private_dir(dir, euid())
}

/// Check that `dir` is a real directory owned by `uid` with no group or world
/// permissions.
pub fn check_private_dir(dir: &Path, uid: u32) -> Result<(), PathError> {
    let unsafe_dir = |why: String| PathError::Unsafe { path: dir.to_owned(), why };
    let md = std::fs::symlink_metadata(dir).map_err(|source| PathError::Io { path: dir.to_owned(), source })?;
    if md.file_type().is_symlink() {
        return Err(unsafe_dir("it is a symbolic link".into()));
    }
    if !md.is_dir() {
        return Err(unsafe_dir("it is not a directory".into()));
    }
    if md.uid() != uid {
        return Err(unsafe_dir(format!("it is owned by uid {}, not {uid}", md.uid())));
    }
    if md.mode() & 0o077 != 0 {
        return Err(unsafe_dir(format!("its mode is {:o}; group and others must have no access", md.mode() & 0o7777)));
    }
    Ok(())
}

/// Whether a peer with this uid may be served (or trusted) by a process with `ours`.
pub fn peer_allowed(peer: u32, ours: u32) -> bool {
    peer == ours || peer == 0
}

/// Why the server could not listen.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Another server holds the path.
    #[error("a name server is already running at {0}")]
    AlreadyRunning(PathBuf),
    /// Something that is not a socket is at the path.
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    /// The path is too long for a Unix socket address.
    #[error("{0}: path too long for a Unix socket (at most 107 bytes)")]
    PathTooLong(PathBuf),
    /// The default path's directory is unsafe or could not be made.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A system call failed.
    #[error("{path}: {what}: {errno}")]
    Os {
        /// The socket path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        errno: Errno,
    },
}

/// The server's listening socket and the lock that makes it the only one on its path.
#[derive(Debug)]
pub struct Listener {
    path: PathBuf,
    lock_path: PathBuf,
    socket: OwnedFd,
    /// Held for the listener's lifetime; closing it releases the lock.
    _lock: OwnedFd,
    /// The device and inode of the socket we bound, so we remove only our own.
    bound: (u64, u64),
}

fn lock_path_of(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

fn address(path: &Path) -> Result<SocketAddrUnix, ListenError> {
    SocketAddrUnix::new(path).map_err(|_| ListenError::PathTooLong(path.to_owned()))
}

impl Listener {
    /// Take the lock beside `path`, reclaim a stale socket there, bind and listen. See
    /// the module documentation.
    pub fn bind(path: &Path) -> Result<Listener, ListenError> {
        let os = |what: &'static str| move |errno: Errno| ListenError::Os { path: path.to_owned(), what, errno };
        let addr = address(path)?;
        let lock_path = lock_path_of(path);
        let lock = take_lock(&lock_path).map_err(|e| match e {
            Errno::WOULDBLOCK => ListenError::AlreadyRunning(path.to_owned()),
            e => ListenError::Os { path: lock_path.clone(), what: "locking", errno: e },
        })?;
        // We hold the lock: whatever is at the path was left by a server that died,
        // unless it is not ours at all.
        match std::fs::symlink_metadata(path) {
            Ok(md) if !md.file_type().is_socket() => return Err(ListenError::NotASocket(path.to_owned())),
            Ok(_) => match probe(&addr) {
                Ok(()) => return Err(ListenError::AlreadyRunning(path.to_owned())),
                Err(Errno::CONNREFUSED) | Err(Errno::NOENT) => match rustix::fs::unlink(path) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(os("removing the stale socket")(e)),
                },
                Err(e) => return Err(os("probing the existing socket")(e)),
            },
            Err(_) => {}
        }
        let socket = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(os("socket"))?;
        rustix::net::bind(&socket, &addr).map_err(|e| match e {
            Errno::ADDRINUSE => ListenError::AlreadyRunning(path.to_owned()),
            e => os("bind")(e),
        })?;
        let st = rustix::fs::stat(path).map_err(os("stat"))?;
        let bound = (st.st_dev, st.st_ino);
        let listener = Listener { path: path.to_owned(), lock_path, socket, _lock: lock, bound };
        // From here on, dropping `listener` removes what we made.
        rustix::fs::chmod(path, Mode::from_raw_mode(0o600)).map_err(os("chmod"))?;
        rustix::net::listen(&listener.socket, 128).map_err(os("listen"))?;
        Ok(listener)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The listening descriptor, for `poll`.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// Accept every waiting connection; hand each allowed peer a fresh descriptor from
    /// `right` (a send right to the service port). Never blocks. Returns how many
    /// peers were served and how many refused.
    pub fn serve_pending(&self, mut right: impl FnMut() -> Option<OwnedFd>) -> (usize, usize) {
        let ours = euid();
        let (mut served, mut refused) = (0, 0);
        // Bounded, so that a flood of connections cannot starve the ports.
        for _ in 0..64 {
            let conn = match rustix::net::accept_with(&self.socket, SocketFlags::CLOEXEC) {
                Ok(c) => c,
                Err(Errno::INTR) | Err(Errno::CONNABORTED) => continue,
                Err(_) => break, // EAGAIN: none left; anything else: try again on the next wake-up
            };
            let allowed =
                rustix::net::sockopt::socket_peercred(&conn).is_ok_and(|c| peer_allowed(c.uid.as_raw(), ours));
            if !allowed {
                refused += 1;
                continue;
            }
            let Some(fd) = right() else { continue };
            let fds = [fd.as_fd()];
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                continue;
            }
            let sent = rustix::net::sendmsg(
                &conn,
                &[IoSlice::new(&HANDSHAKE)],
                &mut control,
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            );
            if sent.is_ok() {
                served += 1;
            }
        }
        (served, refused)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Remove the socket only if the path still names the one we bound.
        if let Ok(st) = rustix::fs::stat(&self.path) {
            if (st.st_dev, st.st_ino) == self.bound {
                let _ = rustix::fs::unlink(&self.path);
            }
        }
        // We still hold the lock, so no other server is between its open and its flock
        // on this file in a way that matters: one that opened it will find, after
        // locking, that the path no longer names its file, and start over.
        let _ = rustix::fs::unlink(&self.lock_path);
    }
}

/// Open (creating) and exclusively lock the lock file, without waiting. Retries if the
/// file was removed between our open and our lock.
fn take_lock(path: &Path) -> Result<OwnedFd, Errno> {
    for _ in 0..16 {
        let fd = rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )?;
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive)?;
        let mine = rustix::fs::fstat(&fd)?;
        match rustix::fs::stat(path) {
            Ok(st) if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino) => return Ok(fd),
            _ => continue,
        }
    }
    Err(Errno::AGAIN)
}

/// Try to connect to `addr`; Ok if something accepted.
fn probe(addr: &SocketAddrUnix) -> Result<(), Errno> {
    let s = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    rustix::net::connect(&s, addr)
}

/// Why a client could not get the service right from the socket.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Nothing listens at the path (missing, or left by a dead server).
    #[error("no name server is running at {0} (start one with `ictus name-server`)")]
    NotRunning(PathBuf),
    /// The server is not ours or root's.
    #[error("the name server at {path} runs as uid {uid}, neither ours ({ours}) nor root; not trusting it")]
    Untrusted {
        /// The socket path.
        path: PathBuf,
        /// The server's uid.
        uid: u32,
        /// Ours.
        ours: u32,
    },
    /// The server closed without the handshake (it refused us, or is not a name server).
    #[error("the name server at {path} refused us or sent no valid handshake: {why}")]
    BadHandshake {
        /// The socket path.
        path: PathBuf,
        /// What was wrong.
        why: &'static str,
    },
    /// The handshake did not come in time.
    #[error("the name server at {0} did not answer in time")]
    TimedOut(PathBuf),
    /// The path is too long for a Unix socket address.
    #[error("{0}: path too long for a Unix socket (at most 107 bytes)")]
    PathTooLong(PathBuf),
    /// A system call failed.
    #[error("{path}: {what}: {errno}")]
    Os {
        /// The socket path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        errno: Errno,
    },
}

/// Connect to the server's socket at `path` and take the send right it hands out (as a
/// raw descriptor, for [`ictus_ipc::Space::insert_send_fd`]).
pub fn fetch_service_fd(path: &Path, timeout: Duration) -> Result<OwnedFd, FetchError> {
    let os = |what: &'static str| move |errno: Errno| FetchError::Os { path: path.to_owned(), what, errno };
    let bad = |why: &'static str| FetchError::BadHandshake { path: path.to_owned(), why };
    let addr =
        SocketAddrUnix::new(path.as_os_str().as_bytes()).map_err(|_| FetchError::PathTooLong(path.to_owned()))?;
    let s = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .map_err(os("socket"))?;
    match rustix::net::connect(&s, &addr) {
        Ok(()) => {}
        Err(Errno::NOENT) | Err(Errno::CONNREFUSED) | Err(Errno::NOTDIR) => {
            return Err(FetchError::NotRunning(path.to_owned()))
        }
        Err(e) => return Err(os("connect")(e)),
    }
    let ours = euid();
    let peer = rustix::net::sockopt::socket_peercred(&s).map_err(os("SO_PEERCRED"))?;
    if !peer_allowed(peer.uid.as_raw(), ours) {
        return Err(FetchError::Untrusted { path: path.to_owned(), uid: peer.uid.as_raw(), ours });
    }
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(FetchError::TimedOut(path.to_owned()));
        }
        let ts = rustix::time::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
        let mut fds = [PollFd::new(&s, PollFlags::IN)];
        match poll(&mut fds, Some(&ts)) {
            Ok(0) => continue,
            Ok(_) => break,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(os("poll")(e)),
        }
    }
    let mut buf = [0u8; 64];
    // Room for more than one descriptor, so that extra ones are seen (and closed).
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        match rustix::net::recvmsg(
            &s,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
        ) {
            Ok(m) => break m,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(os("recvmsg")(e)),
        }
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = m {
            fds.extend(r);
        }
    }
    if msg.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) {
        return Err(bad("truncated"));
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Err(bad("closed without a word"));
    }
    if buf[..msg.bytes] != HANDSHAKE {
        return Err(bad("wrong handshake bytes"));
    }
    if fds.len() != 1 {
        return Err(bad("not exactly one descriptor"));
    }
    Ok(fds.pop().expect("one"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_path_rules() {
        let tmp = std::env::temp_dir();
        assert_eq!(socket_path_for(Some(tmp.as_os_str()), 1000), tmp.join("ictus").join(SOCKET_FILE));
        assert_eq!(socket_path_for(None, 1000), Path::new("/tmp/ictus-1000/name-server.sock"));
        assert_eq!(socket_path_for(Some(OsStr::new("")), 7), Path::new("/tmp/ictus-7/name-server.sock"));
        assert_eq!(socket_path_for(Some(OsStr::new("relative/dir")), 7), Path::new("/tmp/ictus-7/name-server.sock"));
        assert_eq!(
            socket_path_for(Some(OsStr::new("/nonexistent/xdg")), 7),
            Path::new("/tmp/ictus-7/name-server.sock")
        );
        // A file, not a directory.
        assert_eq!(
            socket_path_for(Some(OsStr::new("/proc/self/status")), 7),
            Path::new("/tmp/ictus-7/name-server.sock")
        );
    }

    #[test]
    fn private_dir_checks() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("ictus-ns-dircheck-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let d = base.join("private");
        ensure_private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        ensure_private_dir(&d).unwrap(); // again: it exists, still fine
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(ensure_private_dir(&d), Err(PathError::Unsafe { .. })));
        let link = base.join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(matches!(check_private_dir(&link, euid()), Err(PathError::Unsafe { .. })));
        let file = base.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(check_private_dir(&file, euid()), Err(PathError::Unsafe { .. })));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(check_private_dir(&d, euid().wrapping_add(1)), Err(PathError::Unsafe { .. })));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn only_our_uid_or_root_is_served() {
        assert!(peer_allowed(1000, 1000));
        assert!(peer_allowed(0, 1000));
        assert!(!peer_allowed(1001, 1000));
        assert!(peer_allowed(0, 0));
        assert!(!peer_allowed(1000, 0));
    }
}
