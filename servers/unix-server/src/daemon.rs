//! `ictus unix-server`: one long-lived server for several programs at once, each
//! started by `ictus unix run --server`, registered with the name server, with a
//! control interface on an ictus port for its counts, its programs and its policy.
//!
//! - **The control port** ([`ictus_unix_api::UnixControl`], registered with the name
//!   server as `unix` by [`ictus_server::Registrar`], again whenever the name server
//!   restarts; gone with the server's ports, even after `kill -9`): counts in total
//!   and per program, the programs served, the policy read and replaced. Anyone the
//!   name server hands the port to may read; only this server's user and root may
//!   replace the policy, by the uid the kernel stamped on the request.
//! - **A policy change** takes effect for programs started after it: each program is
//!   served in a session of its own ([`Session::sibling`] of the policy's template),
//!   which keeps the policy (view, filter, Landlock rules, generation page) it started
//!   with. A seccomp filter can only be tightened, so a running program could never be
//!   given a looser one; it keeps all of its own policy rather than half of each.
//! - **The run socket** (`SOCK_SEQPACKET`, `$XDG_RUNTIME_DIR/ictus/unix-server.sock`,
//!   else `/tmp/ictus-$EUID/unix-server.sock`, in a directory of this user's only)
//!   stays for one thing a port cannot do: hand the caller the descriptors its program
//!   needs (the session socket, the program and its interpreter, the filter, the
//!   generation page, the count page) — ports carry port rights and memory, not arbitrary descriptors
//!   — and learn the caller's working directory from its kernel-stamped pid. It accepts
//!   only this user (and root), by `SO_PEERCRED`. A request is one datagram:
//!   `RUN\0PATH=…\0argv0\0argv1…`: the server finds the program from the caller's
//!   working directory and `$PATH` (in the view), makes the program a session and
//!   answers `OK\0loader\0chdir\0network\0kinds\0args…` with the descriptors
//!   attached, `kinds` naming them in order (`spfg`: session socket, program, filter,
//!   generation page; then `c`, the count page, and `i`, the interpreter, when there
//!   are). The caller checks each for what it is said to be (and that the server is
//!   its own user's) before its program gets them, starts the first process itself
//!   (so it is the program's parent, with the caller's terminal, and waits for it) and
//!   says `STARTED\0pid`. With the count page, programs under a policy whose view
//!   hides nothing make their read-only lookups natively, as under a private server,
//!   and their counts reach `ictus unix stats`.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ictus_idl::{Context, Dispatched};
use ictus_ipc::{Received, Space};
use ictus_server::{Loop, Registrar, Serve, ServicePorts};
use ictus_unix_api::{
    Counts, NativeLookups, PolicyChange, Programs, ServerStats, UnixControl, UnixControlServer, UnixError,
};

use crate::launch::{
    self, policy_from_text, prepare, snapshot, start_server, Ended, Prepared, RunError, RunOptions, Snapshot,
};
use crate::ops::Session;
use crate::policy::Policy;
use crate::server::Server;
use crate::sys;

/// The control socket's default path.
pub fn default_socket_path() -> PathBuf {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(d) if d.is_dir() => d.join("ictus"),
        _ => PathBuf::from(format!("/tmp/ictus-{}", sys::euid())),
    };
    dir.join("unix-server.sock")
}

fn io(e: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = data.split(|&b| b == 0).collect();
    if v.last() == Some(&&b""[..]) {
        v.pop();
    }
    v
}

/// Options of `ictus unix-server`.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// The policy programs get until it is changed [default: the host's tree,
    /// network on].
    pub policy: Option<PathBuf>,
    /// The run socket [default: [`default_socket_path`]].
    pub socket: Option<PathBuf>,
    /// The name server's socket [default: as `ictus_name_api::Client::connect` finds
    /// it].
    pub name_server: Option<PathBuf>,
    /// The name to register the control port under [default:
    /// [`ictus_unix_api::SERVICE_NAME`]].
    pub name: Option<String>,
}

/// Why `ictus unix-server` could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The policy, the loader or the thread pool.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The run socket.
    #[error("the run socket {0}: {1}")]
    Socket(PathBuf, std::io::Error),
    /// The control port's loop.
    #[error(transparent)]
    Loop(#[from] ictus_server::ServeError),
    /// The registration with the name server.
    #[error(transparent)]
    Register(#[from] ictus_server::RegisterError),
    /// The control port could not be made.
    #[error("the control port: {0}")]
    Rights(#[from] ictus_ipc::RightsError),
}

/// One policy: its number, its text as given, and the session programs started under
/// it are made from ([`Session::sibling`]).
#[derive(Debug)]
struct Epoch {
    number: u64,
    text: String,
    template: Arc<Session>,
}

/// A program started through the run socket.
#[derive(Debug)]
struct Program {
    id: u64,
    pid: u32,
    policy: u64,
    argv: Vec<String>,
    session: Arc<Session>,
}

/// The long-lived server: the thread pool, the policy in force, the programs served.
#[derive(Debug)]
pub struct Daemon {
    server: Server,
    loader: PathBuf,
    current: Mutex<Arc<Epoch>>,
    programs: Mutex<Vec<Program>>,
    /// The counts of programs whose sessions are gone.
    retired: Mutex<Snapshot>,
    started: AtomicU64,
    uid: u32,
}

impl Daemon {
    /// A server whose programs get `policy` (its text `text`) until it is changed.
    pub fn start(policy: Policy, text: String) -> Result<Daemon, RunError> {
        let (server, loader) = start_server(policy)?;
        let template = Arc::clone(server.session());
        Ok(Daemon {
            server,
            loader,
            current: Mutex::new(Arc::new(Epoch { number: 1, text, template })),
            programs: Mutex::new(Vec::new()),
            retired: Mutex::new(Snapshot::default()),
            started: AtomicU64::new(0),
            uid: sys::euid(),
        })
    }

    fn current(&self) -> Arc<Epoch> {
        Arc::clone(&self.current.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Programs whose sessions nothing holds any more (no process, no connection)
    /// leave the list; their counts go to the total of those that ended. A session
    /// only this list holds can count nothing more, so the total is exact.
    fn prune(&self, programs: &mut Vec<Program>) {
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        programs.retain(|p| {
            if Arc::strong_count(&p.session) > 1 {
                return true;
            }
            let s = snapshot(&p.session);
            retired.served += s.served;
            retired.malformed += s.malformed;
            retired.connections += s.connections;
            add_native(&mut retired.native_lookups, &s.native_lookups);
            for (call, n) in s.refused {
                *retired.refused.entry(call).or_default() += n;
            }
            false
        });
    }

    /// The policy in force: its number and text.
    pub fn policy(&self) -> (u64, String) {
        let e = self.current();
        (e.number, e.text.clone())
    }

    /// Replace the policy for programs started from now on, if `uid` (kernel-stamped)
    /// may; an invalid text changes nothing and says why.
    pub fn set_policy(&self, uid: u32, text: &str) -> Result<PolicyChange, UnixError> {
        if uid != self.uid && uid != 0 {
            return Err(UnixError::NotAllowed);
        }
        if text.len() > ictus_unix_api::MAX_POLICY {
            return Err(UnixError::TooLong);
        }
        let loaded = policy_from_text(text).and_then(|p| launch::new_session(p, &self.current().template.loader));
        let session = match loaded {
            Ok(s) => s,
            Err(e) => return Ok(PolicyChange::Invalid(e.to_string())),
        };
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let number = current.number + 1;
        *current = Arc::new(Epoch { number, text: text.to_owned(), template: Arc::new(session) });
        eprintln!("ictus unix-server: policy {number} in force for programs started from now on (uid {uid})");
        Ok(PolicyChange::Installed(number))
    }

    /// The counts, all programs together.
    pub fn stats(&self) -> ServerStats {
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        self.prune(&mut programs);
        let mut total = self.retired.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for p in programs.iter() {
            let s = snapshot(&p.session);
            total.served += s.served;
            total.malformed += s.malformed;
            total.connections += s.connections;
            total.open += s.open;
            add_native(&mut total.native_lookups, &s.native_lookups);
            for (call, n) in s.refused {
                *total.refused.entry(call).or_default() += n;
            }
        }
        ServerStats {
            total: counts(total),
            programs_running: self.server.programs() as u64,
            programs_started: self.started.load(Ordering::Relaxed),
            workers: self.server.workers() as u64,
            policy: self.current().number,
            pid: std::process::id(),
            uid: self.uid,
        }
    }

    /// The programs served now, with their counts.
    pub fn programs(&self) -> Vec<ictus_unix_api::Program> {
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        self.prune(&mut programs);
        programs
            .iter()
            .map(|p| ictus_unix_api::Program {
                id: p.id,
                pid: p.pid,
                policy: p.policy,
                argv: p.argv.clone(),
                counts: counts(snapshot(&p.session)),
            })
            .collect()
    }

    /// A session for a new program under the policy in force, listed from now on.
    fn new_program(&self, argv: &[OsString]) -> (u64, Arc<Session>) {
        let epoch = self.current();
        let session = Arc::new(epoch.template.sibling());
        let id = self.started.fetch_add(1, Ordering::Relaxed) + 1;
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        self.prune(&mut programs);
        programs.push(Program {
            id,
            pid: 0,
            policy: epoch.number,
            argv: argv.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
            session: Arc::clone(&session),
        });
        (id, session)
    }

    fn program_started(&self, id: u64, pid: i32) {
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = programs.iter_mut().find(|p| p.id == id) {
            p.pid = pid.max(0) as u32;
        }
    }
}

fn counts(s: Snapshot) -> Counts {
    Counts {
        served: s.served,
        malformed: s.malformed,
        connections: s.connections,
        open: s.open,
        refused: s.refused.into_iter().collect(),
        native: NativeLookups::from_array(s.native_lookups),
    }
}

/// Native lookups of another program added to a sum (saturating: each program
/// writes its own count page and could put anything there).
fn add_native(sum: &mut [u64; ictus_unix_emul::wire::COUNT_KINDS], more: &[u64; ictus_unix_emul::wire::COUNT_KINDS]) {
    for (s, m) in sum.iter_mut().zip(more) {
        *s = s.saturating_add(*m);
    }
}

/// The control port's methods.
struct Methods(Arc<Daemon>);

impl UnixControl for Methods {
    fn stats(&self) -> Result<ServerStats, UnixError> {
        Ok(self.0.stats())
    }
    fn programs(&self) -> Result<Programs, UnixError> {
        Ok(Programs(self.0.programs()))
    }
    fn policy(&self) -> Result<(u64, String), UnixError> {
        Ok(self.0.policy())
    }
    fn set_policy(&self, cx: &Context, text: String) -> Result<PolicyChange, UnixError> {
        self.0.set_policy(cx.sender.uid, &text)
    }
}

/// The control port's loop: its requests, and the run socket's connections (a
/// thread each: a run waits for its caller to start the program).
struct Core {
    requests: ictus_idl::Server,
    listener: OwnedFd,
    daemon: Arc<Daemon>,
}

impl Serve for Core {
    const NAME: &'static str = "unix-server";
    fn request(&mut self, msg: &mut Received) -> Dispatched {
        self.requests.handle(msg)
    }
    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.listener.as_fd()]
    }
    fn ready(&mut self, _index: usize) -> Result<(), ictus_server::ServeError> {
        // Readable: a connection is queued, so this does not block.
        match sys::accept(self.listener.as_fd()) {
            Ok(conn) => {
                let daemon = Arc::clone(&self.daemon);
                std::thread::spawn(move || control(&daemon, conn));
            }
            Err(e) => eprintln!("ictus unix-server: accepting on the run socket: {}", io(e)),
        }
        Ok(())
    }
}

/// The run socket at `path`, its directory made private if missing; a path left by a
/// server that was killed (nobody answers on it) is taken over. Removed on drop.
struct RunSocket {
    fd: Option<OwnedFd>,
    path: PathBuf,
}

impl RunSocket {
    fn bind(path: PathBuf) -> Result<RunSocket, ServeError> {
        if let Some(dir) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir);
        }
        if path.exists() && sys::seqpacket_connect(&path).is_err() {
            let _ = std::fs::remove_file(&path);
        }
        match sys::seqpacket_listen(&path) {
            Ok(fd) => Ok(RunSocket { fd: Some(fd), path }),
            Err(e) => Err(ServeError::Socket(path, io(e))),
        }
    }
}

impl Drop for RunSocket {
    fn drop(&mut self) {
        if self.fd.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Serve programs until `stop` is readable (see [`ictus_server::serve_until_signalled`]).
pub fn serve(opts: &ServeOptions, stop: BorrowedFd<'_>) -> Result<(), ServeError> {
    let text = match &opts.policy {
        Some(f) => std::fs::read_to_string(f).map_err(|e| RunError::PolicyFile(f.clone(), e))?,
        None => String::new(),
    };
    let policy = policy_from_text(&text)?;
    let daemon = Arc::new(Daemon::start(policy, text)?);
    let mut socket = RunSocket::bind(opts.socket.clone().unwrap_or_else(default_socket_path))?;
    let space = Space::task();
    let ports = ServicePorts::<1>::allocate(&space)?;
    ports.set_message_limit(ictus_unix_api::MESSAGE_LIMIT)?;
    let requests = ictus_idl::Server::new(&space, ports.set())
        .with_reply_timeout(std::time::Duration::ZERO)
        .with(UnixControlServer(Methods(Arc::clone(&daemon))));
    let port = ports.service(0);
    let listener = socket.fd.take().expect("bound");
    let mut server = Loop::new(&space, ports, Core { requests, listener, daemon });
    let name = opts.name.as_deref().unwrap_or(ictus_unix_api::SERVICE_NAME);
    let names = match Registrar::start("unix-server", opts.name_server.as_deref(), &space, &[(name, port)]) {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&socket.path);
            return Err(e.into());
        }
    };
    eprintln!(
        "ictus unix-server: control port registered as {name:?}; programs start on {} (pid {})",
        socket.path.display(),
        std::process::id()
    );
    let r = server.run(None, stop);
    names.stop();
    drop(server);
    let _ = std::fs::remove_file(&socket.path);
    eprintln!("ictus unix-server: stopped; removed {}", socket.path.display());
    Ok(r?)
}

fn control(daemon: &Daemon, conn: OwnedFd) {
    let Ok((pid, uid, _)) = sys::peer_cred(conn.as_fd()) else { return };
    if uid != sys::euid() && uid != 0 {
        let _ = sys::send(conn.as_fd(), b"ERR\0this server serves its own user only", &[]);
        return;
    }
    let mut buf = vec![0u8; 256 * 1024];
    let Ok(Some(m)) = sys::recv(conn.as_fd(), &mut buf, false) else { return };
    if m.truncated {
        let _ = sys::send(conn.as_fd(), b"ERR\0request too long", &[]);
        return;
    }
    let parts = split(&buf[..m.len]);
    if parts.first().copied() != Some(b"RUN") {
        let _ = sys::send(
            conn.as_fd(),
            b"ERR\0unknown request (counts and the policy are on the control port: `ictus unix stats`)",
            &[],
        );
        return;
    }
    let path_env = parts.get(1).and_then(|p| p.strip_prefix(b"PATH=")).map(|p| OsString::from_vec(p.to_vec()));
    let argv: Vec<OsString> = parts.iter().skip(2).map(|a| OsString::from_vec(a.to_vec())).collect();
    let cwd = sys::readlink(Path::new(&format!("/proc/{pid}/cwd")))
        .map(|b| PathBuf::from(std::ffi::OsStr::from_bytes(&b)))
        .unwrap_or_else(|_| PathBuf::from("/"));
    if argv.is_empty() {
        let _ = sys::send(conn.as_fd(), format!("ERR\0{}", RunError::NoProgram).as_bytes(), &[]);
        return;
    }
    let (id, session) = daemon.new_program(&argv);
    match prepare(&daemon.server, &session, &daemon.loader, pid, &cwd, path_env.as_deref(), &argv) {
        Ok(p) => {
            let mut data = b"OK\0".to_vec();
            data.extend_from_slice(p.loader.as_os_str().as_bytes());
            data.push(0);
            data.extend_from_slice(p.chdir_to.as_deref().map_or(&b""[..], |c| c.as_os_str().as_bytes()));
            data.push(0);
            data.extend_from_slice(if p.network { b"1\0" } else { b"0\0" });
            let mut fds = vec![p.session.as_fd(), p.prog.as_fd(), p.filter.as_fd(), p.generation.as_fd()];
            let mut kinds = REQUIRED_FDS.to_vec();
            if let Some(c) = &p.counts {
                fds.push(c.as_fd());
                kinds.push(FD_COUNTS);
            }
            if let Some(i) = &p.interp {
                fds.push(i.as_fd());
                kinds.push(FD_INTERP);
            }
            data.extend_from_slice(&kinds);
            data.push(0);
            for a in &p.args {
                data.extend_from_slice(a.as_bytes());
                data.push(0);
            }
            if sys::send(conn.as_fd(), &data, &fds).is_err() {
                return;
            }
            drop(fds);
            drop(p);
            // The caller says which pid the program's first process has.
            if let Ok(Some(m)) = sys::recv(conn.as_fd(), &mut buf, false) {
                let parts = split(&buf[..m.len]);
                if let (Some(b"STARTED"), Some(child)) = (parts.first().copied(), parts.get(1)) {
                    if let Some(child) = std::str::from_utf8(child).ok().and_then(|c| c.parse::<i32>().ok()) {
                        let mut exes = session.exes.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(h) = exes.remove(&pid) {
                            exes.insert(child, h);
                        }
                        drop(exes);
                        daemon.program_started(id, child);
                    }
                }
            }
        }
        Err(e) => {
            let _ = sys::send(conn.as_fd(), format!("ERR\0{e}").as_bytes(), &[]);
        }
    }
}

/// `ictus unix run --server`: the program under a running server.
pub fn run_remote(socket: Option<&Path>, opts: &RunOptions) -> Result<Ended, RunError> {
    let path = socket.map(Path::to_path_buf).unwrap_or_else(default_socket_path);
    let conn = sys::seqpacket_connect(&path).map_err(|e| {
        RunError::Setup(std::io::Error::other(format!(
            "no Unix server on {}: {} (start `ictus unix-server`)",
            path.display(),
            io(e)
        )))
    })?;
    // The server decides what the program sees and serves its every lookup: it must
    // be this user's (or root's), as it takes only this user's programs.
    match sys::peer_cred(conn.as_fd()) {
        Ok((_, uid, _)) if uid == sys::euid() || uid == 0 => {}
        Ok((_, uid, _)) => {
            return Err(RunError::Setup(std::io::Error::other(format!(
                "the Unix server on {} runs as uid {uid}, not as this user",
                path.display()
            ))))
        }
        Err(e) => return Err(RunError::Setup(io(e))),
    }
    let mut req = b"RUN\0PATH=".to_vec();
    req.extend_from_slice(std::env::var_os("PATH").unwrap_or_default().as_bytes());
    req.push(0);
    for a in &opts.argv {
        req.extend_from_slice(a.as_bytes());
        req.push(0);
    }
    sys::send(conn.as_fd(), &req, &[]).map_err(|e| RunError::Setup(io(e)))?;
    let mut buf = vec![0u8; 256 * 1024];
    let m = sys::recv(conn.as_fd(), &mut buf, false)
        .map_err(|e| RunError::Setup(io(e)))?
        .ok_or_else(|| RunError::Setup(io(libc::ECONNRESET)))?;
    let parts = split(&buf[..m.len]);
    match parts.first().copied() {
        Some(b"OK") if parts.len() >= 5 => {
            let fds = checked_fds(parts[4], m.fds).map_err(|why| {
                RunError::Setup(std::io::Error::other(format!(
                    "the Unix server on {} answered with {why} (another build of ictus?)",
                    path.display()
                )))
            })?;
            let chdir = parts[2];
            let p = Prepared {
                session: fds.session,
                prog: fds.prog,
                interp: fds.interp,
                filter: fds.filter,
                generation: fds.generation,
                counts: fds.counts,
                loader: PathBuf::from(std::ffi::OsStr::from_bytes(parts[1])),
                args: parts[5..].iter().map(|a| OsString::from_vec(a.to_vec())).collect(),
                chdir_to: (!chdir.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(chdir))),
                network: parts[3] == b"1",
            };
            launch::spawn_and_wait(p, opts, |child| {
                let _ = sys::send(conn.as_fd(), format!("STARTED\0{child}").as_bytes(), &[]);
            })
        }
        Some(b"ERR") => Err(RunError::Setup(std::io::Error::other(
            String::from_utf8_lossy(parts.get(1).copied().unwrap_or(b"")).into_owned(),
        ))),
        _ => Err(RunError::Setup(io(libc::EPROTO))),
    }
}

/// The descriptors of a `RUN` reply, in the order sent, named by one byte each in the
/// reply's fifth field: the session socket, the program, the filter and the
/// generation page always, then the count page and the interpreter when there are.
const REQUIRED_FDS: &[u8] = b"spfg";
const FD_COUNTS: u8 = b'c';
const FD_INTERP: u8 = b'i';

/// A `RUN` reply's descriptors, each checked for what it says it is.
#[derive(Debug)]
struct RunFds {
    session: OwnedFd,
    prog: OwnedFd,
    filter: OwnedFd,
    generation: OwnedFd,
    counts: Option<OwnedFd>,
    interp: Option<OwnedFd>,
}

/// Check the descriptors a `RUN` reply carried against the kinds it names, before the
/// program gets them: the session socket an `AF_UNIX` `SOCK_SEQPACKET` socket; the
/// program and its interpreter regular files; the filter a memfd sealed against any
/// change; the generation page a memfd of its full size sealed against resizing and
/// new writers; the count page a memfd of exactly its size sealed against resizing
/// (every library maps it writable: it must never fault). Anything else, or a count
/// of descriptors other than the kinds named, is refused with what was wrong.
fn checked_fds(kinds: &[u8], fds: Vec<OwnedFd>) -> Result<RunFds, String> {
    use ictus_sys::memfd::{check, SealFlags, Size};
    use ictus_unix_emul::wire::{COUNT_SIZE, GEN_SIZE};
    let optional = &kinds[REQUIRED_FDS.len().min(kinds.len())..];
    let well_formed =
        kinds.starts_with(REQUIRED_FDS) && matches!(optional, [] | [FD_COUNTS] | [FD_INTERP] | [FD_COUNTS, FD_INTERP]);
    if !well_formed {
        return Err(format!("descriptors named {:?}", String::from_utf8_lossy(kinds)));
    }
    if fds.len() != kinds.len() {
        return Err(format!("{} descriptors for the {} it named", fds.len(), kinds.len()));
    }
    let mut fds = fds.into_iter();
    let mut next = || fds.next().expect("counted above");
    let (session, prog, filter, generation) = (next(), next(), next(), next());
    let counts = optional.contains(&FD_COUNTS).then(&mut next);
    let interp = optional.contains(&FD_INTERP).then(&mut next);
    if sys::socket_kind(session.as_fd()) != Some((libc::SOCK_SEQPACKET, libc::AF_UNIX)) {
        return Err("a session socket that is not an AF_UNIX SOCK_SEQPACKET socket".into());
    }
    for (what, f) in [("program", Some(&prog)), ("interpreter", interp.as_ref())] {
        if let Some(f) = f {
            if !sys::is_regular_file(f.as_fd()) {
                return Err(format!("a {what} that is not a regular file"));
            }
        }
    }
    let fixed = SealFlags::SHRINK | SealFlags::GROW;
    check(filter.as_fd(), Size::AtLeast(8), fixed | SealFlags::WRITE)
        .map_err(|e| format!("a seccomp filter that is not a sealed memfd ({e})"))?;
    check(generation.as_fd(), Size::Exactly(GEN_SIZE as u64), fixed | SealFlags::FUTURE_WRITE)
        .map_err(|e| format!("a generation page that is not a sealed memfd ({e})"))?;
    if let Some(c) = &counts {
        check(c.as_fd(), Size::Exactly(COUNT_SIZE as u64), fixed)
            .map_err(|e| format!("a count page that is not a sealed memfd ({e})"))?;
    }
    Ok(RunFds { session, prog, filter, generation, counts, interp })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A well-formed set of descriptors, as the server sends them (`spfg`, the count
    /// page, the interpreter).
    fn good() -> Vec<OwnedFd> {
        let (session, _) = sys::seqpacket_pair().unwrap();
        let prog: OwnedFd = std::fs::File::open(std::env::current_exe().unwrap()).unwrap().into();
        let filter = sys::memfd_with(c"test-filter", &[0u8; 16]).unwrap();
        let generation = sys::GenerationPage::new(false).unwrap().fd().try_clone_to_owned().unwrap();
        let counts = sys::CountPage::new().unwrap().fd().try_clone_to_owned().unwrap();
        let interp = prog.try_clone().unwrap();
        vec![session, prog, filter, generation, counts, interp]
    }

    #[test]
    fn a_run_replys_descriptors_are_checked_before_use() {
        let ok = checked_fds(b"spfgci", good()).unwrap();
        assert!(ok.counts.is_some() && ok.interp.is_some());
        let mut four = good();
        four.truncate(4);
        let ok = checked_fds(b"spfg", four).unwrap();
        assert!(ok.counts.is_none() && ok.interp.is_none());
        let mut no_interp = good();
        no_interp.truncate(5);
        assert!(checked_fds(b"spfgc", no_interp).unwrap().interp.is_none());
        // Only the interpreter (a server without a count page): the fifth is it.
        let mut fds = good();
        fds.remove(4);
        assert!(checked_fds(b"spfgi", fds).unwrap().counts.is_none());

        // Kinds out of order, unknown, repeated, missing; counts that disagree.
        for kinds in [&b"spfgic"[..], b"spgf", b"spfgcc", b"spfgx", b"spf", b"", b"spfgcic"] {
            assert!(checked_fds(kinds, good()).is_err(), "{:?}", String::from_utf8_lossy(kinds));
        }
        let mut five = good();
        five.truncate(5);
        assert!(checked_fds(b"spfgci", five).unwrap_err().contains("5 descriptors for the 6"));

        // Each descriptor of the wrong kind.
        let unsealed = || ictus_sys::memfd::create("test-unsealed", ictus_unix_emul::wire::COUNT_SIZE as u64).unwrap();
        let regular = || -> OwnedFd { std::fs::File::open(std::env::current_exe().unwrap()).unwrap().into() };
        let socket = || sys::seqpacket_pair().unwrap().0;
        let cases: [(usize, OwnedFd, &str); 6] = [
            (0, regular(), "session socket"),
            (1, socket(), "program"),
            (2, unsealed(), "seccomp filter"),
            (3, sys::CountPage::new().unwrap().fd().try_clone_to_owned().unwrap(), "generation page"),
            (4, unsealed(), "count page"),
            (5, socket(), "interpreter"),
        ];
        for (i, wrong, what) in cases {
            let mut fds = good();
            fds[i] = wrong;
            let why = checked_fds(b"spfgci", fds).unwrap_err();
            assert!(why.contains(what), "{what}: {why}");
        }
        // A count page of another size (a mapping of COUNT_SIZE would fault past it).
        let short = ictus_sys::memfd::create("test-short", 64).unwrap();
        ictus_sys::memfd::add_seals(
            short.as_fd(),
            ictus_sys::memfd::SealFlags::SHRINK | ictus_sys::memfd::SealFlags::GROW,
        )
        .unwrap();
        let mut fds = good();
        fds[4] = short;
        assert!(checked_fds(b"spfgci", fds).unwrap_err().contains("count page"));
    }
}
