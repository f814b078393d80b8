//! The well-known socket: how a task without a bootstrap right finds the name server
//! (this module: where it is, and the client's half of the handshake), and how any
//! server hands out one of its ports to the tasks of its user (the listening half is
//! `ictus_server::Listener`, which the name server and the clock's control socket use).
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
//! missing ([`prepare_default_socket_path`]), and refuses to start unless it is a real
//! directory (not a symbolic link) owned by the effective uid with no group or world
//! permissions: in a shared `/tmp` another user could otherwise make the directory
//! first and put their own socket in it. An explicit `--socket PATH` is used as given;
//! its directory must exist.
//!
//! # The handshake
//!
//! The socket is an `AF_UNIX SOCK_SEQPACKET` listening socket (mode `0600`). On each
//! connection the server reads the peer's `SO_PEERCRED`; a peer whose uid is neither
//! the server's nor root is refused (closed unanswered). Any other peer gets one
//! datagram, the 8-byte [`HANDSHAKE`] with one descriptor in `SCM_RIGHTS`: a send right
//! to the server's service port. The client ([`fetch_service_fd`]) checks that the
//! server's `SO_PEERCRED` uid is its own or root, that the bytes are the handshake and
//! that exactly one descriptor came, then inserts the right into its space
//! ([`ictus_ipc::Space::insert_send_fd`], which checks it is a port socket). Everything
//! after that goes through ports.
//!
//! One server per path, stale paths left by `kill -9`, and the lock file beside the
//! socket are the listening half's business (see `ictus_server::Listener`).

use std::ffi::OsStr;
use std::io::IoSliceMut;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};

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

/// Why a client could not get the service right from the socket.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Nothing listens at the path (missing, or left by a dead server).
    #[error("no name server is running at {0}: start `ictus name-server` first")]
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
    // Every descriptor that came is owned (and closed on refusal), however many.
    let mut fds: Vec<OwnedFd> = Vec::new();
    let msg = loop {
        match ictus_sys::socket::recvmsg(s.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut fds, RecvFlags::DONTWAIT) {
            Ok(m) => break m,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(os("recvmsg")(e)),
        }
    };
    if msg.truncated || msg.control_truncated {
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
