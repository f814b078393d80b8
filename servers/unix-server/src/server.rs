//! The server: a thread pool over one epoll (004 §3.2's pool of C threads).
//!
//! - The **session socket** (`SOCK_SEQPACKET`) is inherited by every process of the
//!   session as [`SESSION_FD`](ictus_unix_emul::wire::SESSION_FD). The library sends
//!   on it a hello carrying one end of a fresh socketpair: a connection per program
//!   thread. The server checks that what came is one `AF_UNIX SOCK_SEQPACKET` socket
//!   and turns on `SO_PASSCRED`, so every request carries its sender's pid, uid and gid
//!   as the kernel saw them.
//! - Every connection is in the epoll, edge-triggered: a request's arrival wakes one
//!   worker, which takes it, serves it and answers; the connection needs no re-arming
//!   (an `epoll_ctl` per request saved), since the library sends a connection's next
//!   request only after the reply to the last (a client that sends two at once finds
//!   its second served with its next, or never: it harms only itself). A peer that
//!   dies wakes a worker with its hang-up, or fails the reply's send: either drops
//!   the connection. When every worker is busy (a blocking open of a FIFO,
//!   a connect) the pool grows, up to [`MAX_WORKERS`].
//! - At stop, an eventfd in the epoll (level-triggered, never read) wakes every
//!   worker at once; `ictus unix run` waits for its program's last hang-up on a
//!   condition variable ([`Server::wait_programs`]), not by polling.
//! - A process that exits or is killed (even by `kill -9`) closes its connections:
//!   the kernel hangs them up, the server drops them. Nothing else is kept per process
//!   but the path of its last exec (for `/proc/PID/exe`), kept until the program ends
//!   (a process's connections close at every exec, so their end is no sign of its).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Condvar;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ictus_unix_emul::sysno as nr;
use ictus_unix_emul::wire::{self, Request};

use crate::ops::{self, Session};
use crate::sys;

/// Most worker threads.
pub const MAX_WORKERS: usize = 64;
/// Workers started at once.
pub const MIN_WORKERS: usize = 2;
/// The epoll token of the stop signal.
const STOP_TOKEN: u64 = u64::MAX;
/// The epoll token of the mount table (`/proc/self/mountinfo`: a mount or unmount).
const MOUNTS_TOKEN: u64 = u64::MAX - 1;
/// Tokens of generation pages' watches (`crate::watch`) have this bit.
const WATCH_BIT: u64 = 1 << 62;

struct Conn {
    fd: OwnedFd,
    /// The process that made the connection (the library makes it in the process
    /// that uses it): its pid and a pidfd of it (`SO_PEERPIDFD`), which the
    /// descriptors a request names are taken from — only from a request that
    /// process sent (the stamped pid says). Once per connection, where a pidfd per
    /// message (`SO_PASSPIDFD`) cost every request a pidfd made and closed.
    maker: Option<(i32, OwnedFd)>,
    /// Made by the server and handed over in an exec's reply ([`hand_over`]): its
    /// peer credentials are the server's own, so the maker's pidfd is the only
    /// process descriptors are ever taken from.
    handed: bool,
    /// The working directory its relative paths start from.
    cwd: ops::CwdCache,
    /// The session of the program it belongs to (its policy, its counts).
    session: Arc<Session>,
}

/// A program's session socket (the server's end) and the session it is served in.
type Program = (Arc<OwnedFd>, Arc<Session>);

struct Shared {
    /// The session [`Server::add_session_socket`] adds programs to.
    session: Arc<Session>,
    ep: OwnedFd,
    /// Session sockets (server ends), one per program started, by token, each with
    /// the session its connections are served in.
    listeners: Mutex<HashMap<u64, Program>>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    idle: AtomicUsize,
    workers: AtomicUsize,
    stop: AtomicBool,
    /// Level-triggered in the epoll, signalled once at stop: wakes every worker.
    stop_fd: OwnedFd,
    /// Wakes the generation thread at stop.
    stop_gate: (Mutex<()>, Condvar),
    /// Notified whenever a program or a connection goes (see [`Server::wait_programs`]).
    changed: (Mutex<()>, Condvar),
    /// Generation pages whose watch is in the epoll, by token (without [`WATCH_BIT`]).
    watched: Mutex<Vec<Arc<sys::GenerationPage>>>,
    /// The mount table, polled for changes (`POLLPRI`), if it could be opened.
    _mounts: Option<std::fs::File>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    /// Every generation page in use: programs started under other policies
    /// (`ictus unix-server`) have pages of their own.
    fn pages(&self) -> Vec<Arc<sys::GenerationPage>> {
        let mut pages = vec![Arc::clone(&self.session.generation)];
        for (_, session) in self.listeners.lock().unwrap_or_else(|p| p.into_inner()).values() {
            if !pages.iter().any(|p| Arc::ptr_eq(p, &session.generation)) {
                pages.push(Arc::clone(&session.generation));
            }
        }
        for page in self.watched.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if !pages.iter().any(|p| Arc::ptr_eq(p, page)) {
                pages.push(Arc::clone(page));
            }
        }
        pages
    }

    /// Put `page`'s watch in the epoll, once.
    fn watch_page(&self, page: &Arc<sys::GenerationPage>) -> Result<(), i32> {
        let Some(w) = page.watch() else { return Ok(()) };
        let mut watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        if watched.iter().any(|p| Arc::ptr_eq(p, page)) {
            return Ok(());
        }
        sys::epoll_add_edge(self.ep.as_fd(), w.fd(), WATCH_BIT | watched.len() as u64)?;
        watched.push(Arc::clone(page));
        Ok(())
    }

    fn notify_changed(&self) {
        let _g = self.changed.0.lock().unwrap_or_else(|p| p.into_inner());
        self.changed.1.notify_all();
    }
}

/// A running server.
pub struct Server {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("workers", &self.shared.workers.load(Ordering::Relaxed)).finish()
    }
}

impl Server {
    /// Serve `session`; programs join it through [`Server::add_session_socket`].
    pub fn start(session: Arc<Session>) -> Result<Server, i32> {
        let ep = sys::epoll()?;
        let stop_fd = sys::eventfd()?;
        sys::epoll_add_level(ep.as_fd(), stop_fd.as_fd(), STOP_TOKEN)?;
        // A mount or unmount anywhere may make a kept failure's path resolve.
        let mounts = std::fs::File::open("/proc/self/mountinfo").ok();
        let mounts = mounts.filter(|m| sys::epoll_add_priority(ep.as_fd(), m.as_fd(), MOUNTS_TOKEN).is_ok());
        let shared = Arc::new(Shared {
            session,
            ep,
            listeners: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            idle: AtomicUsize::new(0),
            workers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            stop_fd,
            stop_gate: (Mutex::new(()), Condvar::new()),
            changed: (Mutex::new(()), Condvar::new()),
            watched: Mutex::new(Vec::new()),
            _mounts: mounts,
            threads: Mutex::new(Vec::new()),
        });
        shared.watch_page(&shared.session.generation)?;
        for _ in 0..MIN_WORKERS {
            spawn_worker(&shared);
        }
        // Names created outside the session reach watched pages through their
        // watches (`crate::watch`). What is left to a timer: the libraries' "not a
        // link" answers (kept by them alone, never watched: dropped every second by
        // the unlink count), and every kept failure of a page without a watch (a
        // view other than the host's tree, or no inotify).
        let s = Arc::clone(&shared);
        let t = std::thread::Builder::new()
            .name("unix-generation".into())
            .spawn(move || {
                let mut gate = s.stop_gate.0.lock().unwrap_or_else(|p| p.into_inner());
                let mut next = Instant::now() + Duration::from_secs(1);
                while !s.stop.load(Ordering::Acquire) {
                    let now = Instant::now();
                    if now >= next {
                        for page in s.pages() {
                            if page.watch().is_some() {
                                page.bump_unlinks();
                            } else {
                                page.bump(sys::BUMP_TIMER);
                            }
                        }
                        next = now + Duration::from_secs(1);
                        continue;
                    }
                    gate = s.stop_gate.1.wait_timeout(gate, next - now).unwrap_or_else(|p| p.into_inner()).0;
                }
            })
            .expect("spawning the generation thread");
        shared.threads.lock().unwrap_or_else(|p| p.into_inner()).push(t);
        Ok(Server { shared })
    }

    /// A new session socket: the server keeps one end, the caller gives the other to
    /// the first process of a program (every process of it inherits it).
    pub fn add_session_socket(&self) -> Result<OwnedFd, i32> {
        self.add_program(Arc::clone(&self.shared.session))
    }

    /// A new session socket for a program served in `session` (its own policy and
    /// counts: `ictus unix-server` gives each program one).
    pub fn add_program(&self, session: Arc<Session>) -> Result<OwnedFd, i32> {
        let (server_end, client_end) = sys::seqpacket_pair()?;
        self.shared.watch_page(&session.generation)?;
        let token = self.shared.next.fetch_add(1, Ordering::Relaxed);
        // Every hello then carries a pidfd of its sender (see `with_sender_pidfd`), or
        // on an older kernel its pid.
        if pidfd_support() {
            sys::pass_pidfd(server_end.as_fd())?;
        } else {
            sys::pass_credentials(server_end.as_fd())?;
        }
        let fd = Arc::new(server_end);
        self.shared.listeners.lock().unwrap_or_else(|p| p.into_inner()).insert(token, (Arc::clone(&fd), session));
        if let Err(e) = sys::epoll_arm(self.shared.ep.as_fd(), fd.as_fd(), token, true) {
            self.shared.listeners.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
            return Err(e);
        }
        Ok(client_end)
    }

    /// Programs whose processes are not all gone.
    pub fn programs(&self) -> usize {
        self.shared.listeners.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The session [`Server::add_session_socket`] adds programs to.
    pub fn session(&self) -> &Arc<Session> {
        &self.shared.session
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Worker threads now.
    pub fn workers(&self) -> usize {
        self.shared.workers.load(Ordering::Relaxed)
    }

    /// Wait until every program's processes are gone ([`Server::programs`] is 0).
    pub fn wait_programs(&self) {
        let mut g = self.shared.changed.0.lock().unwrap_or_else(|p| p.into_inner());
        while self.programs() > 0 {
            g = self.shared.changed.1.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Wait up to `limit` until no connection is open; whether none is.
    pub fn wait_connections(&self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut g = self.shared.changed.0.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if self.connections() == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            g = self.shared.changed.1.wait_timeout(g, end - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        sys::eventfd_signal(self.shared.stop_fd.as_fd());
        {
            let _g = self.shared.stop_gate.0.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.stop_gate.1.notify_all();
        }
        let threads = std::mem::take(&mut *self.shared.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        self.shared.conns.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

fn spawn_worker(shared: &Arc<Shared>) {
    shared.workers.fetch_add(1, Ordering::AcqRel);
    shared.idle.fetch_add(1, Ordering::AcqRel);
    let s = Arc::clone(shared);
    let t = std::thread::Builder::new()
        .name("unix-server".into())
        .spawn(move || worker(&s))
        .expect("spawning a server thread");
    shared.threads.lock().unwrap_or_else(|p| p.into_inner()).push(t);
}

fn worker(s: &Arc<Shared>) {
    let mut buf = vec![0u8; wire::MAX_REQUEST];
    while !s.stop.load(Ordering::Acquire) {
        let ev = match sys::epoll_wait_one(s.ep.as_fd(), 1000) {
            Ok(Some(ev)) => ev,
            Ok(None) => continue,
            Err(_) => break,
        };
        if ev.0 == STOP_TOKEN {
            break;
        }
        if ev.0 == MOUNTS_TOKEN {
            for page in s.pages() {
                if let Some(w) = page.watch() {
                    w.forget_paths();
                }
                page.bump(sys::BUMP_MOUNTS);
            }
            continue;
        }
        if ev.0 & WATCH_BIT != 0 && ev.0 != STOP_TOKEN {
            let page = s.watched.lock().unwrap_or_else(|p| p.into_inner()).get((ev.0 & !WATCH_BIT) as usize).cloned();
            if let Some((page, w)) = page.as_ref().and_then(|p| p.watch().map(|w| (p, w))) {
                w.drain(page);
            }
            continue;
        }
        if s.idle.fetch_sub(1, Ordering::AcqRel) == 1
            && s.workers.load(Ordering::Acquire) < MAX_WORKERS
            && !s.stop.load(Ordering::Acquire)
        {
            spawn_worker(s);
        }
        let listener = s.listeners.lock().unwrap_or_else(|p| p.into_inner()).get(&ev.0).cloned();
        match listener {
            Some((l, session)) => accept_hellos(s, ev.0, &l, &session),
            None => serve_conn(s, ev.0, &mut buf),
        }
        s.idle.fetch_add(1, Ordering::AcqRel);
    }
}

fn accept_hellos(s: &Arc<Shared>, token: u64, listener: &OwnedFd, session: &Arc<Session>) {
    let mut buf = [0u8; 64];
    loop {
        match sys::recv(listener.as_fd(), &mut buf, true) {
            Ok(Some(m)) => {
                // The hello names the connection by its number in the sender; the
                // kernel's pidfd of the sender (or, before Linux 6.5, its stamped pid)
                // says whose. Descriptors attached (an older library, or a program
                // sending on the session socket) are not used: they close as m drops.
                // A hello that names its thread: descriptors are taken through that
                // thread (checked to be the sender's), so a process whose main thread
                // has exited can still lend them.
                let hello = &buf[..m.len];
                let thread = wire::hello_thread(hello).and_then(|tid| sender_thread(&m, tid));
                let taken = match (wire::parse_hello(hello), m.truncated || !m.fds.is_empty(), &thread) {
                    (Some(n), false, Some(t)) => sys::pidfd_getfd(t.as_fd(), n).ok(),
                    (Some(n), false, None) => with_sender_pidfd(&m, |p| sys::pidfd_getfd(p, n).ok()).ok().flatten(),
                    _ => None,
                };
                let Some(fd) =
                    taken.filter(|fd| sys::socket_kind(fd.as_fd()) == Some((libc::SOCK_SEQPACKET, libc::AF_UNIX)))
                else {
                    session.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if sys::pass_credentials(fd.as_fd()).is_err() {
                    continue;
                }
                let maker =
                    match (sys::peer_cred(fd.as_fd()), thread.map(Ok).unwrap_or_else(|| sys::peer_pidfd(fd.as_fd()))) {
                        (Ok((pid, _, _)), Ok(p)) if pid > 0 => Some((pid, p)),
                        _ => None,
                    };
                let ct = s.next.fetch_add(1, Ordering::Relaxed);
                let conn = Arc::new(Conn {
                    fd,
                    maker,
                    handed: false,
                    cwd: ops::CwdCache::default(),
                    session: Arc::clone(session),
                });
                s.conns.lock().unwrap_or_else(|p| p.into_inner()).insert(ct, Arc::clone(&conn));
                session.stats.connections.fetch_add(1, Ordering::Relaxed);
                session.stats.open.fetch_add(1, Ordering::Relaxed);
                if sys::epoll_add_edge(s.ep.as_fd(), conn.fd.as_fd(), ct).is_err() {
                    drop_conn(s, ct);
                }
            }
            Err(libc::EAGAIN) => break,
            Err(libc::EINTR) => continue,
            Ok(None) | Err(_) => {
                // Every process of this program is gone (or the socket broke).
                s.listeners.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
                s.notify_changed();
                return;
            }
        }
    }
    let _ = sys::epoll_arm(s.ep.as_fd(), listener.as_fd(), token, false);
}

/// A pidfd of a message's sender: the one the kernel attached (`SCM_PIDFD`), or,
/// on a kernel without it (before 6.5), one opened by the pid it stamped — which
/// names another process if the sender has died and its pid been reused in
/// between (said once at start: [`pidfd_support`]).
fn with_sender_pidfd<T>(m: &sys::Received, f: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> T) -> Result<T, i32> {
    match (&m.pidfd, m.cred) {
        (Some(p), _) => Ok(f(p.as_fd())),
        (None, Some((pid, _, _))) if pid > 0 && !pidfd_support() => sys::pidfd_open(pid).map(|p| f(p.as_fd())),
        _ => Err(libc::EBADF),
    }
}

/// A pidfd of the thread `tid` that a hello names, if it is a thread of the
/// message's sender (the kernel's pidfd of the sender and the thread's pidfd name
/// one thread group): a thread of another process, a thread gone, a kernel without
/// thread pidfds (6.9) or `PIDFD_GET_INFO` (6.13) give `None`, and the hello is
/// taken through the sender's pidfd as before.
fn sender_thread(m: &sys::Received, tid: i32) -> Option<OwnedFd> {
    let t = sys::pidfd_open_thread(tid).ok()?;
    let tgid = sys::pidfd_tgid(t.as_fd()).ok()?;
    let sender = with_sender_pidfd(m, sys::pidfd_tgid).ok()?.ok()?;
    (tgid == sender).then_some(t)
}

/// Whether this kernel attaches a pidfd of the sender to each message
/// (`SO_PASSPIDFD`, Linux 6.5); says once if not.
pub fn pidfd_support() -> bool {
    static SUPPORT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORT.get_or_init(|| {
        let ok = sys::seqpacket_pair().is_ok_and(|(a, _)| sys::pass_pidfd(a.as_fd()).is_ok());
        if !ok {
            eprintln!(
                "ictus unix: this kernel has no SO_PASSPIDFD (Linux 6.5): descriptors named in requests are \
                 taken from the process with the stamped pid, which a process that dies mid-request could \
                 have handed on to another; addressed datagram sends stay refused under views that confine paths"
            );
        }
        ok
    })
}

/// The descriptors a request names (argument `i` for each bit `i` of `fd_args`, in
/// order), taken from the sender with `pidfd_getfd`: the same open files the
/// program holds. A number that is not a descriptor of the sender, or one of the
/// library's reserved ones, is `EBADF`; so is every one named by a process other
/// than the connection's maker (a `vfork` child on its parent's connection: the
/// library lends one only for calls that name none).
fn take_fds(m: &sys::Received, conn: &Conn, req: &Request<'_>) -> Result<Vec<OwnedFd>, i32> {
    // Descriptors are ints: the kernel reads the lower half of the register.
    let mut numbers: Vec<i32> =
        (0..6).filter(|i| req.header.fd_args & (1 << i) != 0).map(|i| req.header.args[i] as u32 as i32).collect();
    if req.header.op == nr::SENDMSG {
        // A send's SCM_RIGHTS name descriptors too, after its socket.
        let (_, control, _) = ops::send_parts(req)?;
        for c in ops::parse_control(control)? {
            if let ops::SendControl::Rights(r) = c {
                numbers.extend_from_slice(&r);
            }
        }
    }
    if numbers.is_empty() {
        return Ok(Vec::new());
    }
    let take = |pidfd: std::os::fd::BorrowedFd<'_>| -> Result<Vec<OwnedFd>, i32> {
        numbers
            .iter()
            .map(|&n| {
                if !(0..wire::RESERVED_LO).contains(&n) {
                    return Err(libc::EBADF);
                }
                sys::pidfd_getfd(pidfd, n)
            })
            .collect()
    };
    let taken = match (&conn.maker, m.cred) {
        // The maker's pidfd names the thread that made the connection where the
        // hello named it: if that thread is gone (another took over its slot), the
        // process's, as before.
        (Some((maker, pidfd)), Some((pid, _, _))) if *maker == pid => take(pidfd.as_fd()).or_else(|e| {
            // Never for a handed connection: its peer is this server.
            if e == libc::ESRCH && !conn.handed {
                sys::peer_pidfd(conn.fd.as_fd()).and_then(|p| take(p.as_fd()))
            } else {
                Err(e)
            }
        }),
        (Some(_), _) => Err(libc::EBADF),
        (None, _) => with_sender_pidfd(m, take)?,
    };
    taken.map_err(|e| if e == libc::ESRCH { libc::EBADF } else { e })
}

/// A connection for the image `pid` is about to exec, made here and handed over in
/// the exec's reply (the library end): the new image's first request needs no
/// socket made, no hello and no `pidfd_getfd` of it. Its maker is `pid` (the
/// kernel's stamp on the exec request), through a pidfd opened now: descriptors a
/// request names are taken only from a request stamped with that pid, through that
/// pidfd, so if `pid` died meanwhile and its number was reused, they are taken from
/// nobody (the pidfd names the dead process). `None`: none could be made; the new
/// image makes its own as before.
fn hand_over(s: &Arc<Shared>, session: &Arc<Session>, pid: i32) -> Option<OwnedFd> {
    let (fd, end) = sys::seqpacket_pair().ok()?;
    // Credentials on every request, as a connection the library makes has them.
    sys::pass_credentials(fd.as_fd()).ok()?;
    sys::pass_credentials(end.as_fd()).ok()?;
    let pidfd = sys::pidfd_open(pid).ok()?;
    let ct = s.next.fetch_add(1, Ordering::Relaxed);
    let conn = Arc::new(Conn {
        fd,
        maker: Some((pid, pidfd)),
        handed: true,
        cwd: ops::CwdCache::default(),
        session: Arc::clone(session),
    });
    s.conns.lock().unwrap_or_else(|p| p.into_inner()).insert(ct, Arc::clone(&conn));
    session.stats.connections.fetch_add(1, Ordering::Relaxed);
    session.stats.open.fetch_add(1, Ordering::Relaxed);
    if sys::epoll_add_edge(s.ep.as_fd(), conn.fd.as_fd(), ct).is_err() {
        drop_conn(s, ct);
        return None;
    }
    Some(end)
}

fn drop_conn(s: &Arc<Shared>, token: u64) {
    let gone = s.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
    if let Some(c) = gone {
        c.session.stats.open.fetch_sub(1, Ordering::Relaxed);
        s.notify_changed();
    }
}

fn serve_conn(s: &Arc<Shared>, token: u64, buf: &mut [u8]) {
    let Some(conn) = s.conns.lock().unwrap_or_else(|p| p.into_inner()).get(&token).cloned() else { return };
    let m = loop {
        match sys::recv(conn.fd.as_fd(), buf, true) {
            Ok(Some(m)) => break m,
            Ok(None) => return drop_conn(s, token),
            // Interrupted: the edge is spent, so take the message now.
            Err(libc::EINTR) => continue,
            // A wake-up for what another worker took: the next arrival wakes one again.
            Err(libc::EAGAIN) => return,
            Err(_) => return drop_conn(s, token),
        }
    };
    // Descriptors come by number (taken from the sender), never attached: a message
    // with any attached is malformed.
    let mut exec_by = None;
    let mut reply = match (m.truncated || !m.fds.is_empty(), m.cred) {
        (false, Some((pid, _, _))) if pid > 0 => match Request::parse(&buf[..m.len]) {
            Ok(req) => match take_fds(&m, &conn, &req) {
                Ok(fds) if req.header.op == nr::SENDMSG => {
                    ops::serve_send(&conn.session, m.cred.unwrap_or_default(), &req, &fds)
                }
                Ok(fds) => {
                    exec_by = (req.header.op == nr::EXECVEAT).then_some(pid);
                    ops::serve(&conn.session, pid, &conn.cwd, &req, &fds)
                }
                Err(e) => ops::Reply { result: -(e as i64), ..ops::Reply::default() },
            },
            Err(_) => malformed(&conn.session),
        },
        _ => malformed(&conn.session),
    };
    drop(m);
    if let (Some(pid), 0, Some(count)) = (exec_by, reply.result, reply.data.first_mut()) {
        if !reply.fds.is_empty() && reply.fds.len() < wire::MAX_REPLY_FDS {
            if let Some(end) = hand_over(s, &conn.session, pid) {
                reply.fds.push(end);
                *count |= wire::EXEC_HANDS_CONNECTION;
            }
        }
    }
    let mut out = Vec::with_capacity(wire::REPLY_HEADER + reply.data.len());
    out.resize(wire::REPLY_HEADER, 0);
    wire::encode_reply_header(&mut out, reply.result, reply.fds.len() as u32, reply.data.len() as u32);
    out.extend_from_slice(&reply.data);
    let fds: Vec<_> = reply.fds.iter().map(|f| f.as_fd()).collect();
    if sys::send(conn.fd.as_fd(), &out, &fds).is_err() {
        drop_conn(s, token);
    }
}

fn malformed(s: &Session) -> ops::Reply {
    s.stats.malformed.fetch_add(1, Ordering::Relaxed);
    ops::Reply { result: -(libc::EINVAL as i64), ..ops::Reply::default() }
}
