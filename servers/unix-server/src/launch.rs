//! `ictus unix run [--policy FILE] -- CMD ARGS…`: a private server in this process,
//! and the program's first process: the session socket, the program and its
//! interpreter on the loader's descriptors, the seccomp filter on a sealed memfd
//! for the loader to install, Landlock (exec only the loader; no signals or
//! ptrace out of the session), then exec of the loader.

#![allow(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ictus_unix_emul::wire;

use crate::filter::{self, FilterPolicy};
use crate::ops::{Session, Stats};
use crate::policy::Policy;
use crate::server::Server;
use crate::sys;
use crate::view::View;

/// The loader built with this crate.
static LOADER: &[u8] = include_bytes!(env!("ICTUS_UNIX_LOADER_BUILT"));

/// Why `ictus unix run` could not start the program.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The policy file could not be read.
    #[error("reading the policy {0}: {1}")]
    PolicyFile(PathBuf, std::io::Error),
    /// The policy file is wrong.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// A bind mount's host path does not exist.
    #[error("the policy binds {0}, which does not exist: {1}")]
    Bind(PathBuf, std::io::Error),
    /// No program given.
    #[error("no program to run")]
    NoProgram,
    /// The program could not be found or opened in the view.
    #[error("{0}: {1}")]
    Program(String, std::io::Error),
    /// Setting up failed.
    #[error("setting up the session: {0}")]
    Setup(std::io::Error),
}

/// How the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

/// Options of `ictus unix run`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The policy file [default: the host's tree, network on].
    pub policy: Option<PathBuf>,
    /// The program and its arguments.
    pub argv: Vec<OsString>,
    /// Say nothing about missing privileges.
    pub quiet: bool,
    /// Send the program's standard output to this file instead of ours.
    pub stdout: Option<PathBuf>,
}

fn io(e: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

/// Load a policy (the default if `None`) with its host paths made canonical.
pub fn load_policy(path: Option<&Path>) -> Result<Policy, RunError> {
    match path {
        Some(f) => {
            let text = std::fs::read_to_string(f).map_err(|e| RunError::PolicyFile(f.to_path_buf(), e))?;
            policy_from_text(&text)
        }
        None => policy_from_text(""),
    }
}

/// A policy's text checked as [`load_policy`] checks a file: parsed (an empty text is
/// the default policy), its bind mounts' host paths existing and made canonical.
pub fn policy_from_text(text: &str) -> Result<Policy, RunError> {
    let mut p = Policy::parse(text)?;
    for m in &mut p.mounts {
        m.host = std::fs::canonicalize(&m.host).map_err(|e| RunError::Bind(m.host.clone(), e))?;
    }
    Ok(p)
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in bytes {
        h = (h ^ *b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The loader as a file (Landlock rules name files): written once per build into a
/// private directory of this user (`$XDG_RUNTIME_DIR/ictus`, else `/tmp/ictus-$EUID`).
///
/// Returns its path and a descriptor of it holding a shared `flock`: every server
/// keeps that descriptor (programs get copies of it for their `execve`), and a loader
/// of another build is removed only by whoever gets its exclusive lock — so one build's
/// `ictus unix run` never removes the loader a running server of another build still
/// starts programs from (it did: two builds side by side failed each other's runs with
/// "setting up the session: No such file or directory"). The locks are the kernel's
/// and die with their holders, `kill -9` included.
pub fn loader_path() -> std::io::Result<(PathBuf, OwnedFd)> {
    use std::io::Read;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    let lock = |f: &std::fs::File, op: libc::c_int| {
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let open = |p: &Path| std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(p);
    if let Some(p) = std::env::var_os("ICTUS_UNIX_LOADER") {
        let f = open(Path::new(&p))?;
        return Ok((PathBuf::from(p), f.into()));
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(d) if d.is_dir() => d.join("ictus"),
        _ => PathBuf::from(format!("/tmp/ictus-{euid}")),
    };
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!("{} is not a private directory of this user", dir.display())));
    }
    let path = dir.join(format!("unix-loader-{:016x}", fnv(LOADER)));
    // The file this process last found to hold this build's bytes (device, inode):
    // a server started again in the same process (`ictus bench unix` starts one per
    // run) need not read it again while it is the same file, still linked, under
    // the shared lock that keeps other builds from removing it.
    static CHECKED: std::sync::Mutex<Option<(u64, u64)>> = std::sync::Mutex::new(None);
    let mine = 'found: {
        // A few rounds at most: each retry means another build removed the file
        // between our open and our lock, which it does only once.
        for _ in 0..8 {
            if let Ok(mut f) = open(&path) {
                lock(&f, libc::LOCK_SH)?;
                let meta = f.metadata()?;
                let linked = meta.nlink() > 0;
                let id = (meta.dev(), meta.ino());
                let mut checked = CHECKED.lock().unwrap_or_else(|p| p.into_inner());
                if linked && meta.len() == LOADER.len() as u64 && *checked == Some(id) {
                    break 'found f;
                }
                let mut bytes = Vec::with_capacity(LOADER.len());
                if linked && f.read_to_end(&mut bytes).is_ok() && bytes == LOADER {
                    *checked = Some(id);
                    break 'found f;
                }
                if linked {
                    // Not this build's bytes under this build's name (a torn copy of
                    // an older version): write it again below.
                    drop(f);
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let tmp = dir.join(format!(".unix-loader-{}", std::process::id()));
            std::fs::write(&tmp, LOADER)?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o555))?;
            let f = open(&tmp)?;
            lock(&f, libc::LOCK_SH)?;
            std::fs::rename(&tmp, &path)?;
            break 'found f;
        }
        return Err(std::io::Error::other(format!("{} keeps disappearing", path.display())));
    };
    // Loaders of other builds: removed when no server holds them.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("unix-loader-") && e.path() != path {
                if let Ok(f) = open(&e.path()) {
                    if lock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
    }
    Ok((path, mine.into()))
}

/// Start a server for `policy`: the loader, the view, the generation page, the
/// thread pool. Programs join it with [`prepare`].
pub fn start_server(policy: Policy) -> Result<(Server, PathBuf), RunError> {
    let (loader_path, loader) = loader_path().map_err(RunError::Setup)?;
    let session = Arc::new(new_session(policy, &Arc::new(loader))?);
    let server = Server::start(session).map_err(|e| RunError::Setup(io(e)))?;
    Ok((server, loader_path))
}

/// Whether the session's sends with a destination or control data are served (see
/// [`FilterPolicy::served_sends`]): where the view confines paths, and the kernel
/// attaches a pidfd of a request's sender (the server takes the descriptors named
/// with it; without, a sender that dies mid-request could have its pid reused, and
/// such sends, and `AF_UNIX` datagram sockets, stay refused as before).
pub fn served_sends(policy: &Policy) -> bool {
    policy.confines_paths() && crate::server::pidfd_support()
}

/// Whether the libraries may do read-only lookups natively: the view confines
/// nothing such a lookup could reveal (no `hide`, no bind mount, no other root; `ro`
/// lines restrict only writes, and writes stay served). See `ictus_unix_emul::lookup`.
fn native_lookups(policy: &Policy) -> bool {
    !policy.confines_paths()
}

/// Whether, besides, `access(W_OK)` may be native: nothing in the view is read-only
/// (an `ro` line or a read-only bind answers `EROFS`, which only the server knows).
pub fn native_write_access(policy: &Policy) -> bool {
    native_lookups(policy) && policy.readonly.is_empty() && policy.mounts.iter().all(|m| !m.readonly)
}

/// A session for `policy`: its view and a generation page of its own (a page holds
/// the refused calls and the failed look-ups of one view), counts from zero.
pub fn new_session(policy: Policy, loader: &Arc<OwnedFd>) -> Result<Session, RunError> {
    // Where the view's names are the host's (`ro` lines refuse only writes), kept
    // failures are watched (see `watch`); any other view's page is bumped every
    // second instead.
    let generation = sys::GenerationPage::new(!policy.confines_paths()).map_err(|e| RunError::Setup(io(e)))?;
    generation.set_refused(policy.refused.iter().map(|r| r.0));
    if native_lookups(&policy) {
        let write = if native_write_access(&policy) { wire::GEN_FLAG_NATIVE_WRITE_ACCESS } else { 0 };
        generation.set_flags(wire::GEN_FLAG_NATIVE_LOOKUPS | write);
    }
    let counts = sys::CountPage::new().map_err(|e| RunError::Setup(io(e)))?;
    Ok(Session {
        view: Arc::new(View::new(&policy)),
        policy: Arc::new(policy),
        loader: Arc::clone(loader),
        stats: Stats::default(),
        exes: Default::default(),
        generation: Arc::new(generation),
        counts: Some(counts),
    })
}

/// Everything the first process of a program needs: its descriptors (moved to the
/// library's numbers before exec), its argv for the loader, where to start.
#[derive(Debug)]
pub struct Prepared {
    /// The session socket's client end.
    pub session: OwnedFd,
    /// The program.
    pub prog: OwnedFd,
    /// Its interpreter.
    pub interp: Option<OwnedFd>,
    /// The seccomp filter, on a sealed memfd.
    pub filter: OwnedFd,
    /// The generation page.
    pub generation: OwnedFd,
    /// The count page (without it the libraries do every lookup through the server).
    pub counts: Option<OwnedFd>,
    /// The loader file.
    pub loader: PathBuf,
    /// The argv after the loader's own `argv[0]`.
    pub args: Vec<OsString>,
    /// A host directory to start in, when the caller's is outside the view.
    pub chdir_to: Option<PathBuf>,
    /// Sockets other than `AF_UNIX` allowed (for Landlock's scoping).
    pub network: bool,
}

/// Prepare a program for the process `pid` (whose working directory and `$PATH`
/// decide where the program is found), as `argv`, to be served in `session`.
pub fn prepare(
    server: &Server,
    session: &Arc<Session>,
    loader: &Path,
    pid: i32,
    cwd: &Path,
    path_env: Option<&OsStr>,
    argv: &[OsString],
) -> Result<Prepared, RunError> {
    let policy = &session.policy;
    let filter_bytes = filter::build(&FilterPolicy {
        network: policy.network,
        unix_datagrams: !policy.confines_paths() || served_sends(policy),
        served_sends: served_sends(policy),
        served_listings: !policy.hidden.is_empty(),
        served_fd_changes: !policy.readonly.is_empty() || policy.mounts.iter().any(|m| m.readonly),
        native_lookups: native_lookups(policy),
        native_write_access: native_write_access(policy),
        refused: policy.refused.iter().map(|r| r.0).collect(),
    });
    let argv0 = argv.first().ok_or(RunError::NoProgram)?;
    let (reply, used) = find_program(session, pid, path_env, argv0.as_bytes())?;
    let mut fds = reply.fds.into_iter();
    let _loader_fd = fds.next();
    let prog = fds.next().ok_or_else(|| RunError::Setup(io(libc::EIO)))?;
    let interp = fds.next();
    let mut args: Vec<OsString> = Vec::new();
    let data = &reply.data;
    let count = data.first().copied().unwrap_or(0) as usize;
    let mut prefix: Vec<OsString> =
        data.get(1..).unwrap_or(&[]).split(|&b| b == 0).take(count).map(|s| OsString::from_vec(s.to_vec())).collect();
    if count > 0 {
        args.append(&mut prefix);
        args.push(OsString::from_vec(used));
        args.extend(argv.iter().skip(1).cloned());
    } else {
        args.extend(argv.iter().cloned());
    }
    let filter = sys::memfd_with(c"ictus-unix-filter", &filter_bytes).map_err(|e| RunError::Setup(io(e)))?;
    let chdir_to = if session.view.view_of(cwd).is_some() {
        None
    } else {
        Some(session.view.host_of(Path::new("/")).map(|h| h.0).unwrap_or_else(|| PathBuf::from("/")))
    };
    let generation = session.generation.fd().try_clone_to_owned().map_err(RunError::Setup)?;
    let counts = session.counts.as_ref().map(|c| c.fd().try_clone_to_owned()).transpose().map_err(RunError::Setup)?;
    let session_socket = server.add_program(Arc::clone(session)).map_err(|e| RunError::Setup(io(e)))?;
    Ok(Prepared {
        session: session_socket,
        prog,
        interp,
        filter,
        generation,
        counts,
        loader: loader.to_path_buf(),
        args,
        chdir_to,
        network: policy.network,
    })
}

/// Landlock as far as this kernel has it.
struct Landlock {
    ruleset: Option<OwnedFd>,
    abi: i64,
}

const LANDLOCK_ACCESS_FS_EXECUTE: u64 = 1;
const LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1;
const LANDLOCK_SCOPE_SIGNAL: u64 = 2;

fn landlock(loader: &Path, network: bool) -> Landlock {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute (landlock(7)).
    let abi = unsafe { libc::syscall(444, std::ptr::null::<u8>(), 0usize, 1u32) };
    if abi < 1 {
        return Landlock { ruleset: None, abi };
    }
    #[repr(C)]
    struct Attr {
        fs: u64,
        net: u64,
        scoped: u64,
    }
    let mut scoped = 0;
    if abi >= 6 {
        scoped = LANDLOCK_SCOPE_SIGNAL | if network { 0 } else { LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET };
    }
    let attr = Attr { fs: LANDLOCK_ACCESS_FS_EXECUTE, net: 0, scoped };
    let size = if abi >= 6 {
        24
    } else if abi >= 4 {
        16
    } else {
        8
    };
    // SAFETY: attr is a landlock_ruleset_attr of at least `size` bytes.
    let fd = unsafe { libc::syscall(444, &attr as *const Attr, size as usize, 0u32) };
    if fd < 0 {
        return Landlock { ruleset: None, abi };
    }
    // SAFETY: a new descriptor.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let Ok(c) = sys::cpath(loader) else { return Landlock { ruleset: None, abi } };
    let Ok(file) = sys::openat2(None, &c, (libc::O_PATH | libc::O_CLOEXEC) as u64, 0, 0) else {
        return Landlock { ruleset: None, abi };
    };
    #[repr(C, packed)]
    struct PathBeneath {
        allowed: u64,
        parent_fd: i32,
    }
    let rule = PathBeneath { allowed: LANDLOCK_ACCESS_FS_EXECUTE, parent_fd: file.as_raw_fd() };
    // SAFETY: LANDLOCK_RULE_PATH_BENEATH with a valid rule (landlock_add_rule(2)).
    let r = unsafe { libc::syscall(445, ruleset.as_raw_fd(), 1u32, &rule as *const PathBeneath, 0u32) };
    if r < 0 {
        return Landlock { ruleset: None, abi };
    }
    Landlock { ruleset: Some(ruleset), abi }
}

/// Say once what the kernel did not grant, and what it costs.
fn report_landlock(l: &Landlock, quiet: bool) {
    if quiet {
        return;
    }
    if l.ruleset.is_none() {
        eprintln!(
            "ictus unix: Landlock is not available (ABI {}): a program that bypasses the library can exec files the view hides, and signal or trace processes outside the session",
            l.abi
        );
    } else if l.abi < 6 {
        eprintln!("ictus unix: Landlock ABI {} has no signal scoping: a program can signal processes of this user outside the session", l.abi);
    }
}

/// Find the program: a path with a slash as given, else the first executable in
/// `$PATH`, in the view. Returns the exec reply (loader, program, interpreter, argv
/// prefix) and the path used.
fn find_program(
    session: &Session,
    me: i32,
    path_env: Option<&OsStr>,
    argv0: &[u8],
) -> Result<(crate::ops::Reply, Vec<u8>), RunError> {
    let name = String::from_utf8_lossy(argv0).into_owned();
    let candidates: Vec<Vec<u8>> = if argv0.contains(&b'/') {
        vec![argv0.to_vec()]
    } else {
        let path = path_env.map(OsStr::to_os_string).unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        path.as_bytes()
            .split(|&b| b == b':')
            .map(|d| {
                let mut p = if d.is_empty() { b".".to_vec() } else { d.to_vec() };
                p.push(b'/');
                p.extend_from_slice(argv0);
                p
            })
            .collect()
    };
    let mut last = libc::ENOENT;
    for c in candidates {
        match crate::ops::exec_path(session, me, &c) {
            Ok(r) => return Ok((r, c)),
            Err(e) => {
                if e != libc::ENOENT {
                    last = e;
                }
            }
        }
    }
    Err(RunError::Program(name, io(last)))
}

/// What the server counted in a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Requests served.
    pub served: u64,
    /// Requests refused as malformed.
    pub malformed: u64,
    /// Connections made.
    pub connections: u64,
    /// Connections still open when the program ended (after a settling wait for the
    /// session's other processes).
    pub open: u64,
    /// Refused calls, by name (or number).
    pub refused: std::collections::BTreeMap<String, u64>,
    /// Read-only lookups the libraries did natively, without a request (when the
    /// view allows it: `ictus_unix_emul::lookup`), as they reported them: opens,
    /// `newfstatat`, `statx`, `faccessat2`, `readlinkat`, `getcwd`.
    pub native_lookups: [u64; ictus_unix_emul::wire::COUNT_KINDS],
    /// Generation bumps (every kept failure of the session stale), by cause.
    pub generation_bumps: GenerationBumps,
    /// Name-bucket bumps (failures with a component of one name stale).
    pub name_bumps: u64,
    /// Failed lookups the server walked again, watching, before they were kept.
    pub failure_walks: u64,
}

/// Why a session's generation was bumped (every kept failure made stale), how often.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenerationBumps {
    /// Changes the server made for the session's programs (rmdir, unlink, and
    /// every change in a confining view).
    pub served: u64,
    /// Events of watched directories (a directory's own attributes, one moved or
    /// removed, a lost event queue).
    pub watch: u64,
    /// The once-a-second timer of a view without a watch (a confining one).
    pub timer: u64,
    /// Mounts and unmounts anywhere.
    pub mounts: u64,
}

impl GenerationBumps {
    /// All bumps.
    pub fn total(&self) -> u64 {
        self.served + self.watch + self.timer + self.mounts
    }
}

impl Snapshot {
    /// All native lookups.
    pub fn native_total(&self) -> u64 {
        // Saturating: the libraries write these, and a program can put anything on
        // its own session's page.
        self.native_lookups.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// The counters of a session now.
pub fn snapshot(session: &Session) -> Snapshot {
    use std::sync::atomic::Ordering::Relaxed;
    let refused = session
        .stats
        .refused
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(n, c)| (ictus_unix_emul::sysno::name(*n).map_or_else(|| n.to_string(), str::to_string), *c))
        .collect();
    let g = session.generation.counts();
    Snapshot {
        served: session.stats.served.load(Relaxed),
        malformed: session.stats.malformed.load(Relaxed),
        connections: session.stats.connections.load(Relaxed),
        open: session.stats.open.load(Relaxed),
        refused,
        native_lookups: session.counts.as_ref().map_or([0; ictus_unix_emul::wire::COUNT_KINDS], |c| c.native_lookups()),
        generation_bumps: GenerationBumps {
            served: g.bumps[sys::BUMP_SERVED].load(Relaxed),
            watch: g.bumps[sys::BUMP_WATCH].load(Relaxed),
            timer: g.bumps[sys::BUMP_TIMER].load(Relaxed),
            mounts: g.bumps[sys::BUMP_MOUNTS].load(Relaxed),
        },
        name_bumps: g.name_bumps.load(Relaxed),
        failure_walks: g.walks.load(Relaxed),
    }
}

/// Run a program under a private server; returns how it ended, once every process
/// it started has exited (as proot does: they need their server).
pub fn run(opts: &RunOptions) -> Result<Ended, RunError> {
    run_inner(opts, false).map(|r| r.0)
}

/// Run a program under a private server; returns how it ended and what the server
/// counted, once the processes it left have hung up (up to 10 s).
pub fn run_session(opts: &RunOptions) -> Result<(Ended, Snapshot), RunError> {
    run_inner(opts, true)
}

fn run_inner(opts: &RunOptions, settle: bool) -> Result<(Ended, Snapshot), RunError> {
    let policy = load_policy(opts.policy.as_deref())?;
    let (server, loader) = start_server(policy)?;
    let me = std::process::id() as i32;
    let cwd = std::env::current_dir().map_err(RunError::Setup)?;
    let prepared =
        prepare(&server, server.session(), &loader, me, &cwd, std::env::var_os("PATH").as_deref(), &opts.argv)?;
    let ended = spawn_and_wait(prepared, opts, |child| {
        let mut exes = server.session().exes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(host) = exes.remove(&me) {
            exes.insert(child, host);
        }
    })?;
    // Processes the program left running still need their server: like proot, wait
    // until the last one is gone (every process of the session holds the session
    // socket, so its hang-up says so), then return the first process's status.
    server.wait_programs();
    // Their connections hang up as they go; give the pool a moment to see it before
    // counting.
    if settle {
        server.wait_connections(std::time::Duration::from_secs(10));
    }
    let snap = snapshot(server.session());
    // The inotify instance's last close waits for the kernel (see
    // `sys::keep_until_dropped`): a detached process takes it, after ours.
    let keeper = server.session().generation.watch().and_then(|w| w.release_elsewhere());
    drop(server);
    drop(keeper);
    Ok((ended, snap))
}

/// Start the first process of a prepared program (Landlock, the descriptors, the
/// loader) and wait for it. `started` gets its pid.
pub fn spawn_and_wait(p: Prepared, opts: &RunOptions, started: impl FnOnce(i32)) -> Result<Ended, RunError> {
    let ll = landlock(&p.loader, p.network);
    report_landlock(&ll, opts.quiet);
    let ruleset = ll.ruleset.as_ref().map(|f| f.as_raw_fd());
    let chdir_to = match &p.chdir_to {
        Some(d) => Some(sys::cpath(d).map_err(|e| RunError::Setup(io(e)))?),
        None => None,
    };
    let mut cmd = Command::new(&p.loader);
    if let Some(out) = &opts.stdout {
        cmd.stdout(std::fs::File::create(out).map_err(RunError::Setup)?);
    }
    // The loader names the process after its argv[0] (the kernel named it after the
    // loader): the program as the caller named it, as a shell's exec would.
    cmd.arg0(opts.argv.first().cloned().unwrap_or_else(|| OsString::from_vec(handler_argv0())));
    cmd.args(&p.args[..]);
    let (c_end, p_fd, i_fd, f_fd, gen_fd, count_fd) = (
        p.session.as_raw_fd(),
        p.prog.as_raw_fd(),
        p.interp.as_ref().map_or(-1, |f| f.as_raw_fd()),
        p.filter.as_raw_fd(),
        p.generation.as_raw_fd(),
        p.counts.as_ref().map_or(-1, |f| f.as_raw_fd()),
    );
    // While the program runs, a terminal's SIGINT and SIGQUIT are for it, not us
    // (as system(3) does); the program gets them as they were before (ignored only if
    // they were ignored here).
    let (int_was_ignored, quit_was_ignored) = ignore_interactive_signals();
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for (sig, ignored) in [(libc::SIGINT, int_was_ignored), (libc::SIGQUIT, quit_was_ignored)] {
                libc::signal(sig, if ignored { libc::SIG_IGN } else { libc::SIG_DFL });
            }
            let moves =
                [(c_end, wire::SESSION_FD), (p_fd, wire::PROG_FD), (f_fd, wire::FILTER_FD), (gen_fd, wire::GEN_FD)];
            for (from, to) in moves {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (from, to) in [(i_fd, wire::INTERP_FD), (count_fd, wire::COUNT_FD)] {
                if from < 0 {
                    libc::close(to);
                } else if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Nothing the loader would take for a connection handed over by an exec.
            libc::close(wire::HANDED_FD);
            if let Some(d) = &chdir_to {
                if libc::chdir(d.as_ptr()) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // SIGSYS must reach the library's handler: default action, unblocked.
            libc::signal(libc::SIGSYS, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGSYS);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            if let Some(r) = ruleset {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if libc::syscall(446, r, 0u32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    drop(p);
    if let Ok(c) = &spawned {
        started(c.id() as i32);
    }
    let status = spawned.and_then(|mut c| c.wait());
    restore_signals();
    let status = status.map_err(RunError::Setup)?;
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => Ended::Code(c),
        (None, Some(s)) => Ended::Signal(s),
        _ => Ended::Code(127),
    })
}

fn handler_argv0() -> Vec<u8> {
    let a = ictus_unix_emul::handler::LOADER_ARGV0;
    a[..a.len() - 1].to_vec()
}

/// Programs running now under this process, and SIGINT's and SIGQUIT's dispositions
/// from before the first of them (several may run at once through the library API).
static INTERACTIVE: std::sync::Mutex<(usize, [libc::sighandler_t; 2])> = std::sync::Mutex::new((0, [0; 2]));

/// Ignore SIGINT and SIGQUIT while programs run; returns whether each was ignored
/// before the first program.
fn ignore_interactive_signals() -> (bool, bool) {
    let mut g = INTERACTIVE.lock().unwrap_or_else(|p| p.into_inner());
    if g.0 == 0 {
        // SAFETY: setting dispositions of this process.
        g.1 = unsafe { [libc::signal(libc::SIGINT, libc::SIG_IGN), libc::signal(libc::SIGQUIT, libc::SIG_IGN)] };
    }
    g.0 += 1;
    (g.1[0] == libc::SIG_IGN, g.1[1] == libc::SIG_IGN)
}

/// The last program has ended: SIGINT and SIGQUIT as they were.
fn restore_signals() {
    let mut g = INTERACTIVE.lock().unwrap_or_else(|p| p.into_inner());
    g.0 = g.0.saturating_sub(1);
    if g.0 == 0 {
        // SAFETY: restoring what was there.
        unsafe {
            libc::signal(libc::SIGINT, g.1[0]);
            libc::signal(libc::SIGQUIT, g.1[1]);
        }
    }
}

/// End this process the way the program ended (its exit code, or its signal with
/// the default action), so a shell sees the same status as a native run.
pub fn exit_like(e: Ended) -> ! {
    match e {
        Ended::Code(c) => std::process::exit(c),
        Ended::Signal(s) => {
            // SAFETY: default action, unblocked, then the signal to ourselves.
            unsafe {
                libc::signal(s, libc::SIG_DFL);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, s);
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                // No core file of ours for the program's crash.
                let lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                libc::setrlimit(libc::RLIMIT_CORE, &lim);
                libc::raise(s);
            }
            std::process::exit(128 + s)
        }
    }
}
