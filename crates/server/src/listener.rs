//! A well-known socket that hands one of a server's ports to the tasks of its user: how
//! a task without a right finds the name server, and how the clock's control port
//! reaches only its user and root. The client's half, and where the sockets live, are
//! in `ictus_name_api::socket`.
//!
//! # What it does
//!
//! It is an `AF_UNIX SOCK_SEQPACKET` listening socket (mode `0600`). On each connection
//! the server reads the peer's `SO_PEERCRED`; a peer whose uid is neither the server's
//! nor root is refused (closed unanswered). Any other peer gets one datagram, the
//! 8-byte [`HANDSHAKE`] with one descriptor in `SCM_RIGHTS`: a send right to the port
//! the server hands out.
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
//!   (`ECONNREFUSED`: a server killed by `kill -9` left it), remove it and bind afresh
//!   ([`Listener::reclaimed`] then says so: the new server is a restart).
//!
//! On a clean exit (`SIGTERM`, `SIGINT`, or a running server's `stop`) the listener is
//! dropped, which removes the socket — only if the path still names the socket it
//! bound — and the lock file. After `kill -9` both stay behind, harmlessly, until the
//! next server reclaims them.
//!
//! # A socket from the service manager
//!
//! Under systemd (a `.socket` unit with `ListenSequentialPacket=`) or
//! `systemd-socket-activate --seqpacket`, the socket already exists when the server
//! starts: it was made by the service manager, which passes it as descriptor 3
//! (`LISTEN_FDS`, `LISTEN_PID`; [`ictus_sys::activation`]) and queues the connections
//! that arrive before the server runs — the first client's connect is what starts it.
//! [`Listener::activated_or_bind`] takes that socket when one was passed, after
//! checking that it is exactly one listening `AF_UNIX SOCK_SEQPACKET` socket bound to
//! the very path the server was asked for (anything else is refused: a unit and a
//! server that disagree on the path would leave clients waiting at a socket nobody
//! serves). The lock is taken as for a socket of our own, so a second server started
//! by hand on the path still refuses to start; but the socket belongs to the service
//! manager: the server never removes it, and it outlives the server, so that the next
//! connection starts the server again. The lock file tells a restart after a crash
//! here: a clean exit removes it, `kill -9` leaves it behind.

use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use ictus_name_api::socket::{euid, peer_allowed, PathError, HANDSHAKE};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

/// Why the server could not listen.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Another server holds the path.
    #[error(transparent)]
    AlreadyRunning(Occupied),
    /// Something that is not a socket is at the path.
    #[error("{0} exists and is not a socket; refusing to remove it: move it away, or give another socket path")]
    NotASocket(PathBuf),
    /// The socket the service manager passed is not the one asked for.
    #[error("{path}: the socket the service manager passed (LISTEN_FDS) {why}; check the .socket unit's ListenSequentialPacket= against the server's socket path")]
    Activation {
        /// The path the server was asked to serve.
        path: PathBuf,
        /// What is wrong with the passed socket.
        why: String,
    },
    /// The path is too long for a Unix socket address.
    #[error("{0}: too long for a Unix socket address (at most 107 bytes); give a shorter path")]
    PathTooLong(PathBuf),
    /// The default path's directory is unsafe or could not be made.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A system call failed.
    #[error("{path}: {what} failed: {errno}")]
    Os {
        /// The socket path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        errno: Errno,
    },
}

/// A socket path another server holds: which kind of server would have taken it, and
/// where.
#[derive(Debug, thiserror::Error)]
#[error("a {server} is already running at {path}: stop it first, or give another socket path")]
pub struct Occupied {
    /// What kind of server wanted the path (`"clock server"`).
    pub server: &'static str,
    /// The path.
    pub path: PathBuf,
}

/// The server's listening socket and the lock that makes it the only one on its path.
#[derive(Debug)]
pub struct Listener {
    path: PathBuf,
    lock_path: PathBuf,
    socket: OwnedFd,
    /// Held for the listener's lifetime; closing it releases the lock.
    _lock: OwnedFd,
    /// The device and inode of the socket we bound, so we remove only our own; `None`
    /// for a socket the service manager passed, which is never ours to remove.
    bound: Option<(u64, u64)>,
    /// Whether a socket left by a server that died was at the path.
    reclaimed: bool,
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
    /// Take the lock beside `path`, reclaim a stale socket there, bind and listen, for
    /// a `server` (`"name server"`, said in errors). See the module documentation.
    pub fn bind(path: &Path, server: &'static str) -> Result<Listener, ListenError> {
        let occupied = || ListenError::AlreadyRunning(Occupied { server, path: path.to_owned() });
        let os = |what: &'static str| move |errno: Errno| ListenError::Os { path: path.to_owned(), what, errno };
        let addr = address(path)?;
        let lock_path = lock_path_of(path);
        let (lock, _) = take_lock(&lock_path).map_err(|e| match e {
            Errno::WOULDBLOCK => occupied(),
            e => ListenError::Os { path: lock_path.clone(), what: "locking", errno: e },
        })?;
        // We hold the lock: whatever is at the path was left by a server that died,
        // unless it is not ours at all.
        let mut reclaimed = false;
        match std::fs::symlink_metadata(path) {
            Ok(md) if !md.file_type().is_socket() => return Err(ListenError::NotASocket(path.to_owned())),
            Ok(_) => match probe(&addr) {
                Ok(()) => return Err(occupied()),
                Err(Errno::CONNREFUSED) | Err(Errno::NOENT) => match rustix::fs::unlink(path) {
                    Ok(()) => reclaimed = true,
                    Err(Errno::NOENT) => {}
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
            Errno::ADDRINUSE => occupied(),
            e => os("bind")(e),
        })?;
        let st = rustix::fs::stat(path).map_err(os("stat"))?;
        let bound = Some((st.st_dev, st.st_ino));
        let listener = Listener { path: path.to_owned(), lock_path, socket, _lock: lock, bound, reclaimed };
        // From here on, dropping `listener` removes what we made.
        rustix::fs::chmod(path, Mode::from_raw_mode(0o600)).map_err(os("chmod"))?;
        rustix::net::listen(&listener.socket, 128).map_err(os("listen"))?;
        Ok(listener)
    }

    /// The socket the service manager passed (see the module documentation), if it
    /// passed one; otherwise [`Listener::bind`]. `server` is said in errors.
    pub fn activated_or_bind(path: &Path, server: &'static str) -> Result<Listener, ListenError> {
        let refuse = |why: String| ListenError::Activation { path: path.to_owned(), why };
        let mut fds = ictus_sys::activation::take_listen_fds().map_err(|e| refuse(e.to_string()))?;
        let socket = match fds.len() {
            0 => return Listener::bind(path, server),
            1 => fds.pop().expect("one"),
            n => return Err(refuse(format!("is {n} descriptors; one listening socket was expected"))),
        };
        check_passed(&socket, path).map_err(refuse)?;
        let lock_path = lock_path_of(path);
        let (lock, existed) = take_lock(&lock_path).map_err(|e| match e {
            Errno::WOULDBLOCK => ListenError::AlreadyRunning(Occupied { server, path: path.to_owned() }),
            e => ListenError::Os { path: lock_path.clone(), what: "locking", errno: e },
        })?;
        // The accept loop must never block. The flag is on the open file description
        // the service manager shares; it only polls the socket, so that is harmless.
        let flags = rustix::fs::fcntl_getfl(&socket).map_err(|errno| ListenError::Os {
            path: path.to_owned(),
            what: "fcntl",
            errno,
        })?;
        rustix::fs::fcntl_setfl(&socket, flags | OFlags::NONBLOCK).map_err(|errno| ListenError::Os {
            path: path.to_owned(),
            what: "fcntl",
            errno,
        })?;
        Ok(Listener { path: path.to_owned(), lock_path, socket, _lock: lock, bound: None, reclaimed: existed })
    }

    /// Whether the socket was passed by a service manager (and is left to it on exit).
    pub fn activated(&self) -> bool {
        self.bound.is_none()
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether binding removed a socket that a server which died (`kill -9`, a crash)
    /// had left at the path: this server is a restart of that one.
    pub fn reclaimed(&self) -> bool {
        self.reclaimed
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
            let sent = ictus_sys::socket::sendmsg(
                conn.as_fd(),
                &[IoSlice::new(&HANDSHAKE)],
                &[fd.as_fd()],
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
        // Remove the socket only if the path still names the one we bound; a passed
        // socket is the service manager's.
        if let (Ok(st), Some(bound)) = (rustix::fs::stat(&self.path), self.bound) {
            if (st.st_dev, st.st_ino) == bound {
                let _ = rustix::fs::unlink(&self.path);
            }
        }
        // We still hold the lock, so no other server is between its open and its flock
        // on this file in a way that matters: one that opened it will find, after
        // locking, that the path no longer names its file, and start over.
        let _ = rustix::fs::unlink(&self.lock_path);
    }
}

/// Check that a socket the service manager passed is one listening `AF_UNIX
/// SOCK_SEQPACKET` socket bound to `path`; say what is wrong if not.
fn check_passed(socket: &OwnedFd, path: &Path) -> Result<(), String> {
    use rustix::net::sockopt;
    let os = |what: &str, e: Errno| format!("cannot be examined ({what}: {e})");
    if !rustix::fs::fstat(socket).is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Socket) {
        return Err("is not a socket".into());
    }
    let family = sockopt::socket_domain(socket).map_err(|e| os("SO_DOMAIN", e))?;
    if family != AddressFamily::UNIX {
        return Err(format!("is not a Unix socket (family {})", family.as_raw()));
    }
    let kind = sockopt::socket_type(socket).map_err(|e| os("SO_TYPE", e))?;
    if kind != SocketType::SEQPACKET {
        return Err(format!(
            "is not a SOCK_SEQPACKET socket (type {}): a stream or datagram socket cannot carry the handshake",
            kind.as_raw()
        ));
    }
    if !sockopt::socket_acceptconn(socket).map_err(|e| os("SO_ACCEPTCONN", e))? {
        return Err("is not listening".into());
    }
    let name = rustix::net::getsockname(socket).map_err(|e| os("getsockname", e))?;
    let bound = SocketAddrUnix::try_from(name).ok().and_then(|a| a.path_bytes().map(<[u8]>::to_vec));
    match bound {
        Some(b) if b == path.as_os_str().as_bytes() => Ok(()),
        Some(b) => Err(format!("is bound to {}, not to the path asked for", String::from_utf8_lossy(&b))),
        None => Err("is not bound to a path (unnamed or abstract)".into()),
    }
}

/// Open (creating) and exclusively lock the lock file, without waiting. Retries if the
/// file was removed between our open and our lock. Also says whether the file was
/// there before (left by a server that did not exit cleanly, or held by a running one).
fn take_lock(path: &Path) -> Result<(OwnedFd, bool), Errno> {
    for _ in 0..16 {
        let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let mode = Mode::from_raw_mode(0o600);
        let (fd, existed) = match rustix::fs::open(path, flags | OFlags::CREATE | OFlags::EXCL, mode) {
            Ok(fd) => (fd, false),
            Err(Errno::EXIST) => match rustix::fs::open(path, flags, mode) {
                Ok(fd) => (fd, true),
                Err(Errno::NOENT) => continue, // removed between the two opens
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        };
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive)?;
        let mine = rustix::fs::fstat(&fd)?;
        match rustix::fs::stat(path) {
            Ok(st) if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino) => return Ok((fd, existed)),
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
