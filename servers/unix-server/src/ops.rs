//! The calls the server serves, in the view. Every path is resolved by
//! [`View::resolve`] from the caller's working directory (the kernel's, read from
//! `/proc/PID/cwd`) or from the directory descriptor it attached; the operation is
//! then done on the host relative to the parent directory opened with no symbolic
//! link on its path, with the final component never followed.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ictus_unix_emul::elf;
use ictus_unix_emul::sysno::{self as nr, errno, Class};
use ictus_unix_emul::wire::{self, Request};

use crate::policy::Policy;
use crate::sys::{self, cpath, Res};
use crate::view::{Lookup, Node, Resolved, View};

/// What the server holds for a session.
#[derive(Debug)]
pub struct Session {
    /// The view.
    pub view: Arc<View>,
    /// The policy.
    pub policy: Arc<Policy>,
    /// The loader, opened `O_PATH`.
    pub loader: Arc<OwnedFd>,
    /// Counters.
    pub stats: Stats,
    /// What each process last exec'd (host path), for `/proc/PID/exe`.
    pub exes: Mutex<HashMap<i32, PathBuf>>,
    /// The namespace generation the libraries' failed-lookup caches follow.
    pub generation: Arc<sys::GenerationPage>,
    /// What the libraries did natively (without it they do every lookup through
    /// the server).
    pub counts: Option<sys::CountPage>,
}

impl Session {
    /// A session for one more program under the same policy: the view, the loader
    /// and the generation page (with its table of failed look-ups, which only
    /// programs of the same view may share) are this one's; the counts and exec
    /// records are the new program's own.
    pub fn sibling(&self) -> Session {
        Session {
            view: Arc::clone(&self.view),
            policy: Arc::clone(&self.policy),
            loader: Arc::clone(&self.loader),
            stats: Stats::default(),
            exes: Mutex::default(),
            generation: Arc::clone(&self.generation),
            counts: sys::CountPage::new().ok(),
        }
    }
}

/// The server's counters.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests served.
    pub served: AtomicU64,
    /// Requests refused as malformed.
    pub malformed: AtomicU64,
    /// Connections made.
    pub connections: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Refused calls by number.
    pub refused: Mutex<HashMap<u32, u64>>,
}

/// A reply to send.
#[derive(Debug, Default)]
pub struct Reply {
    /// The result or `-errno`.
    pub result: i64,
    /// Data after the header.
    pub data: Vec<u8>,
    /// Descriptors to hand over.
    pub fds: Vec<OwnedFd>,
}

impl Reply {
    fn err(e: i32) -> Reply {
        Reply { result: -(e as i64), ..Reply::default() }
    }
    fn ok(v: i64) -> Reply {
        Reply { result: v, ..Reply::default() }
    }
}

fn res(r: Res<i64>) -> Reply {
    match r {
        Ok(v) => Reply::ok(v),
        Err(e) => Reply::err(e),
    }
}

/// The host file system as the walk sees it, for one caller.
struct HostFs<'a> {
    pid: i32,
    session: &'a Session,
}

impl Lookup for HostFs<'_> {
    fn node(&self, host: &Path) -> Node {
        let b = host.as_os_str().as_bytes();
        if b == b"/proc/self" {
            return Node::Symlink(self.pid.to_string().into_bytes());
        }
        if b == b"/proc/thread-self" {
            return Node::Symlink(format!("{0}/task/{0}", self.pid).into_bytes());
        }
        if foreign_proc_entry(self.pid, b) {
            // Another process's ptrace-guarded entries (fd/, cwd, mem…): the server
            // could read them; the program may not.
            return Node::Missing;
        }
        match sys::lstat_mode(host) {
            Err(_) => Node::Missing,
            Ok(m) if m & libc::S_IFMT == libc::S_IFLNK => {
                if let Some(rest) = b.strip_prefix(b"/proc/") {
                    // /proc/PID/exe names the loader: show the program instead.
                    if let Some(pid) =
                        rest.strip_suffix(b"/exe").and_then(|p| std::str::from_utf8(p).ok()?.parse::<i32>().ok())
                    {
                        // A fork child runs its parent's program until it execs.
                        let exes = self.session.exes.lock().unwrap_or_else(|e| e.into_inner());
                        let mut p = pid;
                        for _ in 0..64 {
                            if let Some(exe) = exes.get(&p) {
                                return Node::Symlink(exe.as_os_str().as_bytes().to_vec());
                            }
                            match parent_pid(p) {
                                Some(pp) if pp > 1 => p = pp,
                                _ => break,
                            }
                        }
                    }
                }
                match sys::readlink(host) {
                    Ok(t)
                        if b.starts_with(b"/proc/")
                            && (t.first() != Some(&b'/') && t.contains(&b':') || t.ends_with(b" (deleted)")) =>
                    {
                        Node::Magic
                    }
                    Ok(t) => Node::Symlink(t),
                    Err(_) => Node::Missing,
                }
            }
            Ok(_) => Node::Other,
        }
    }
}

/// The parent of `pid`, from `/proc/PID/status`.
fn parent_pid(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The view directory relative paths start from: the attached directory
/// descriptor's, or the caller's working directory.
fn base(s: &Session, pid: i32, dirfd: Option<&OwnedFd>) -> Res<PathBuf> {
    let link = match dirfd {
        Some(fd) => format!("/proc/self/fd/{}", fd.as_raw_fd()),
        None => format!("/proc/{pid}/cwd"),
    };
    let host = sys::readlink(Path::new(&link))?;
    match s.view.view_of(Path::new(OsStr::from_bytes(&host))) {
        Some(v) => Ok(v),
        None if dirfd.is_none() => Ok(PathBuf::from("/")),
        None => Err(errno::EACCES),
    }
}

/// One path argument of a request.
struct Arg<'a> {
    path: &'a [u8],
    dirfd: Option<&'a OwnedFd>,
    /// The connection's working directory and the request's generation of it.
    cwd: Option<(&'a CwdCache, u64)>,
}

/// A connection's working directory, opened from `/proc/PID/cwd` for the identity
/// view's relative paths and kept while the caller's generation of it
/// ([`RequestHeader::cwd`](ictus_unix_emul::wire::RequestHeader::cwd)) and pid stay
/// the same: the open of `/proc/PID/cwd` (a ptrace access check and a descriptor)
/// costs as much as the call served. The descriptor follows the directory as the
/// kernel's working directory does (a rename, a removal). A library that lies about
/// the generation walks from a directory it was in before; in the identity view it
/// could name any directory by its absolute path anyway.
#[derive(Debug, Default)]
pub struct CwdCache(Mutex<Option<(i32, u64, Arc<OwnedFd>)>>);

impl CwdCache {
    fn get(&self, pid: i32, generation: u64) -> Res<Arc<OwnedFd>> {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((p, g, fd)) = c.as_ref() {
            if (*p, *g) == (pid, generation) {
                return Ok(Arc::clone(fd));
            }
        }
        let fd = Arc::new(open_cwd(pid)?);
        *c = Some((pid, generation, Arc::clone(&fd)));
        Ok(fd)
    }
}

fn open_cwd(pid: i32) -> Res<OwnedFd> {
    let cwd = CString::new(format!("/proc/{pid}/cwd")).map_err(|_| libc::EINVAL)?;
    sys::openat2(None, &cwd, (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64, 0, 0)
}

fn resolve(s: &Session, pid: i32, a: &Arg<'_>, follow: bool) -> Res<Resolved> {
    let b = base(s, pid, a.dirfd)?;
    s.view.resolve(&b, a.path, follow, &HostFs { pid, session: s })
}

/// The parent directory (opened with no link on its path) and the final name.
fn parent(r: &Resolved) -> Res<(OwnedFd, CString)> {
    match (r.host.parent(), r.host.file_name()) {
        (Some(p), Some(n)) => Ok((sys::open_dir_nolinks(p)?, CString::new(n.as_bytes()).map_err(|_| libc::EINVAL)?)),
        _ => Ok((sys::open_dir_nolinks(&r.host)?, CString::new(".").expect("no NUL"))),
    }
}

/// Where a path argument lands on the host: a directory (an owned descriptor, a
/// descriptor of the request, or the server's working directory for absolute paths)
/// and a name relative to it, with the `AT_SYMLINK_NOFOLLOW` to pass.
struct Place {
    dir: Option<Arc<OwnedFd>>,
    raw_dir: libc::c_long,
    name: CString,
    nofollow: libc::c_long,
    readonly: bool,
    /// The walk's result (`None` on the identity fast path).
    walked: Option<Resolved>,
}

impl Place {
    fn fd(&self) -> libc::c_long {
        self.dir.as_ref().map_or(self.raw_dir, |d| d.as_raw_fd() as libc::c_long)
    }
    fn borrowed(&self) -> Option<BorrowedFd<'_>> {
        match &self.dir {
            Some(d) => Some(d.as_fd()),
            // SAFETY: raw_dir is AT_FDCWD or a descriptor of the request, alive for the
            // request's length, which outlives this Place.
            None if self.raw_dir >= 0 => Some(unsafe { BorrowedFd::borrow_raw(self.raw_dir as i32) }),
            None => None,
        }
    }
    fn writable(&self) -> Res<()> {
        if self.readonly {
            Err(errno::EROFS)
        } else {
            Ok(())
        }
    }
}

/// Whether the view is the host's own tree, unchanged: then the kernel's own walk is
/// the view's, and paths go to it as they are (but `/proc/self` and `/dev/fd`, which
/// would name the server).
fn identity_view(s: &Session) -> bool {
    identity_policy(&s.policy)
}

/// Whether `p`'s view is the host's tree as it is: nothing hidden, read-only or
/// mounted elsewhere.
pub fn identity_policy(p: &Policy) -> bool {
    p.mounts.len() == 1
        && p.mounts[0].host == Path::new("/")
        && !p.mounts[0].readonly
        && p.hidden.is_empty()
        && p.readonly.is_empty()
}

/// `/proc/self…`, `/proc/thread-self…`, `/dev/fd/…`, `/dev/std{in,out,err}` name the
/// caller, not the server.
fn rewrite_self(pid: i32, path: &[u8]) -> Vec<u8> {
    let own = |rest: &[u8]| [format!("/proc/{pid}").as_bytes(), rest].concat();
    if let Some(rest) = path.strip_prefix(b"/proc/self") {
        if rest.is_empty() || rest[0] == b'/' {
            return own(rest);
        }
    }
    if let Some(rest) = path.strip_prefix(b"/proc/thread-self") {
        if rest.is_empty() || rest[0] == b'/' {
            return [format!("/proc/{pid}/task/{pid}").as_bytes(), rest].concat();
        }
    }
    if let Some(rest) = path.strip_prefix(b"/dev/fd/") {
        return own(&[b"/fd/", rest].concat());
    }
    match path {
        b"/dev/stdin" => own(b"/fd/0"),
        b"/dev/stdout" => own(b"/fd/1"),
        b"/dev/stderr" => own(b"/fd/2"),
        _ => path.to_vec(),
    }
}

fn locate(s: &Session, pid: i32, a: &Arg<'_>, follow: bool) -> Res<Place> {
    let nofollow = libc::AT_SYMLINK_NOFOLLOW as libc::c_long;
    if identity_view(s) {
        if a.path.is_empty() {
            return Err(errno::ENOENT);
        }
        let mut path = rewrite_self(pid, a.path);
        if foreign_proc_entry(pid, &path) {
            // Another process's ptrace-guarded /proc entries, named directly.
            return Err(errno::ENOENT);
        }
        // /proc/PID/exe is the loader to the kernel: the program, as exec'd, instead.
        if follow && path.starts_with(b"/proc/") && path.ends_with(b"/exe") {
            if let Node::Symlink(t) = (HostFs { pid, session: s }).node(Path::new(OsStr::from_bytes(&path))) {
                path = t;
            }
        }
        let name = CString::new(path.clone()).map_err(|_| libc::EINVAL)?;
        let (dir, raw_dir) = if path[0] == b'/' {
            (None, libc::AT_FDCWD as libc::c_long)
        } else if let Some(fd) = a.dirfd {
            (None, fd.as_raw_fd() as libc::c_long)
        } else {
            let fd = match a.cwd {
                Some((cache, generation)) => cache.get(pid, generation)?,
                None => Arc::new(open_cwd(pid)?),
            };
            (Some(fd), -1)
        };
        return Ok(Place {
            dir,
            raw_dir,
            name,
            nofollow: if follow { 0 } else { nofollow },
            readonly: false,
            walked: None,
        });
    }
    let r = resolve(s, pid, a, follow)?;
    let (dir, name) = parent(&r)?;
    Ok(Place { dir: Some(Arc::new(dir)), raw_dir: -1, name, nofollow, readonly: r.readonly, walked: Some(r) })
}

fn writable(r: &Resolved) -> Res<()> {
    if r.readonly {
        Err(errno::EROFS)
    } else {
        Ok(())
    }
}

fn raw(nr: libc::c_long, a: [libc::c_long; 6]) -> Res<i64> {
    // SAFETY: every call below passes descriptors it owns, C strings it made and
    // buffers it allocated, each of the size the call expects.
    unsafe { sys::raw(nr, a) }
}

fn fdl(fd: &impl AsFd) -> libc::c_long {
    fd.as_fd().as_raw_fd() as libc::c_long
}
fn cs(c: &CStr) -> libc::c_long {
    c.as_ptr() as libc::c_long
}

/// Serve one request from `pid` on a connection whose working directory `cwd` keeps,
/// with the descriptors `fds` attached in argument order.
pub fn serve(s: &Session, pid: i32, cwd: &CwdCache, req: &Request<'_>, fds: &[OwnedFd]) -> Reply {
    s.stats.served.fetch_add(1, Ordering::Relaxed);
    let h = &req.header;
    let a = h.args;
    // Descriptor arguments, by argument index.
    let mut fd_of: [Option<&OwnedFd>; 6] = [None; 6];
    let mut k = 0;
    for (i, slot) in fd_of.iter_mut().enumerate() {
        if h.fd_args & (1 << i) != 0 {
            *slot = fds.get(k);
            k += 1;
        }
    }
    if let Some(e) = s.policy.refusal(h.op) {
        return refuse(s, h.op, e);
    }
    // Read before serving, as the libraries do: a lookup that races with a change is
    // kept under what the change makes stale.
    let shared = shared_missing_key(s, pid, cwd, req).map(|(key, p)| (key, s.generation.generation_for(p)));
    let mut reply = serve_op(s, pid, cwd, req, &fd_of);
    // A name may have appeared (or gone): the libraries' cached failed lookups and
    // "not a link" answers are stale. (Bumped after the change, so a lookup that
    // raced with it is cached under the old generation and dropped.) Where the view
    // is the host's tree, a file create bumps only its name's bucket and an unlink
    // only the unlink count (see `ictus_unix_emul::cache`).
    const AT_REMOVEDIR: u64 = 0x200;
    // Where the view's names are the host's (nothing hidden or mounted elsewhere;
    // `ro` lines refuse only writes), failures are watched and kept as the host's.
    let identity = !s.policy.confines_paths();
    if reply.result >= 0 {
        match h.op {
            nr::OPENAT if a[2] & O_CREAT != 0 && identity => {
                if let Some(p) = req.path1 {
                    s.generation.bump_name(last_name(p), sys::BUMP_SERVED);
                }
                // Through a final link, the file made has the link target's name.
                match reply.fds.first().map(|f| sys::readlink(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())))) {
                    Some(Ok(real)) => s.generation.bump_name(last_name(&real), sys::BUMP_SERVED),
                    _ => s.generation.bump(sys::BUMP_SERVED),
                }
            }
            nr::UNLINKAT if a[2] & AT_REMOVEDIR == 0 && identity => s.generation.bump_unlinks(),
            // A directory, node, link or moved name made: as a file made, only the
            // lookups with a component of that name (or names, for an exchange) can
            // now succeed. A rename may move a watched directory: the watch forgets
            // which paths name watched directories before the event is read.
            nr::MKDIRAT | nr::MKNODAT | nr::RENAMEAT2 | nr::LINKAT | nr::SYMLINKAT if identity => {
                if h.op == nr::RENAMEAT2 {
                    if let Some(w) = s.generation.watch() {
                        w.forget_paths();
                    }
                }
                // "Not a link" answers: a rename can put a link where a file was.
                s.generation.bump_unlinks();
                for p in [req.path1, req.path2].into_iter().flatten() {
                    s.generation.bump_name(last_name(p), sys::BUMP_SERVED);
                }
            }
            nr::OPENAT if a[2] & O_CREAT != 0 => s.generation.bump(sys::BUMP_SERVED),
            nr::OPENAT2 | nr::MKDIRAT | nr::MKNODAT | nr::RENAMEAT2 | nr::LINKAT | nr::SYMLINKAT | nr::BIND => {
                s.generation.bump(sys::BUMP_SERVED)
            }
            nr::UNLINKAT => {
                s.generation.bump(sys::BUMP_SERVED);
                s.generation.bump_unlinks();
            }
            _ => {}
        }
    }
    // A failure is kept only once every directory its walk reads is watched, so
    // that a change made outside the session reaches the page (see `watch`).
    if identity && reply.result == -(errno::ENOENT as i64) && reply.data.is_empty() && !keep_failure(s, pid, cwd, req) {
        reply.data = vec![1];
    }
    // ... and one that may be kept is published to every library of the session.
    if let (true, Some((key, generation))) =
        (identity && reply.result == -(errno::ENOENT as i64) && reply.data.is_empty(), shared)
    {
        s.generation.remember_missing(key, generation);
    }
    reply
}

/// The key under which a failed lookup is published to every library of the session
/// (the shared table on the generation memfd), with its path: a path looked up by a
/// call the libraries cache, keyed as they key it ([`ictus_unix_emul::cache::key`]):
/// an absolute one, or one relative to the working directory, keyed with that
/// directory's identity where the libraries compute it too (they may do read-only
/// lookups themselves). Per-process answers stay per process: no component that
/// could name `/proc` or `/dev` however the path is spelled.
fn shared_missing_key<'r>(s: &Session, pid: i32, cwd: &CwdCache, req: &Request<'r>) -> Option<(u64, &'r [u8])> {
    const NOFOLLOW: u64 = 0x100;
    const O_NOFOLLOW: u64 = 0o400000;
    let a = req.header.args;
    let follow = match req.header.op {
        nr::OPENAT if a[2] & (O_CREAT | 0o20000000) == 0 => a[2] & O_NOFOLLOW == 0,
        nr::NEWFSTATAT | nr::FACCESSAT2 => a[3] & NOFOLLOW == 0,
        nr::STATX => a[2] & NOFOLLOW == 0,
        nr::READLINKAT => false,
        // A program path that is missing (execvp tries every $PATH directory): the
        // walk below tells it from a missing interpreter, which fails the same way.
        nr::EXECVEAT => a[4] & NOFOLLOW == 0,
        _ => return None,
    };
    let path = req.path1?;
    if path.is_empty() || path.split(|&b| b == b'/').any(|c| c == b"proc" || c == b"dev") {
        return None;
    }
    if path[0] == b'/' {
        return Some((ictus_unix_emul::cache::key_in(path, follow, None)?, path));
    }
    let native = s.generation.flags() & ictus_unix_emul::wire::GEN_FLAG_NATIVE_LOOKUPS != 0;
    if req.header.fd_args != 0 || !native {
        return None;
    }
    let dir = cwd.get(pid, req.header.cwd).ok()?;
    let (dev, ino) = sys::dev_ino(dir.as_fd()).ok()?;
    Some((ictus_unix_emul::cache::key_in(path, follow, Some(ictus_unix_emul::cache::cwd_id(dev, ino)))?, path))
}

/// The last component of a path.
fn last_name(p: &[u8]) -> &[u8] {
    p.split(|&b| b == b'/').rev().find(|c| !c.is_empty()).unwrap_or(b"")
}

/// For a lookup the libraries cache (the calls and paths `Req::missing_before` takes)
/// that failed: whether the failure may be kept — its walk, done again by the
/// server as the kernel does it, ends at a missing name with every directory it
/// read watched ([`crate::watch::Watch::failure_walk`]). Without a watch (the
/// kernel gave none) a failure is kept only if its walk met no link, and the page
/// is bumped every second instead. Anything unexpected keeps nothing.
fn keep_failure(s: &Session, pid: i32, cwd: &CwdCache, req: &Request<'_>) -> bool {
    let h = &req.header;
    let (cacheable, follow) = match h.op {
        nr::OPENAT => (h.args[2] & (O_CREAT | 0o20000000) == 0, h.args[2] & 0o400000 == 0),
        nr::NEWFSTATAT | nr::FACCESSAT2 => (true, h.args[3] & 0x100 == 0),
        nr::STATX | nr::EXECVEAT => (true, h.args[if h.op == nr::STATX { 2 } else { 4 }] & 0x100 == 0),
        nr::READLINKAT => (true, false),
        _ => (false, false),
    };
    let Some(path) = req.path1 else { return true };
    if !cacheable || path.is_empty() || h.fd_args != 0 {
        // Not kept by the libraries anyway.
        return true;
    }
    let dir = if path[0] == b'/' {
        None
    } else {
        match cwd.get(pid, h.cwd) {
            Ok(d) => Some(d),
            Err(_) => return false,
        }
    };
    if let Some(w) = s.generation.watch() {
        return w.failure_walk(&s.generation, dir.as_deref().map(|d| d.as_fd()), path, follow);
    }
    let Ok(c) = CString::new(path) else { return false };
    let fl = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    matches!(sys::openat2(dir.as_deref().map(|d| d.as_fd()), &c, fl, 0, sys::NO_LINKS), Err(errno::ENOENT))
}

fn serve_op(s: &Session, pid: i32, cwd: &CwdCache, req: &Request<'_>, fd_of: &[Option<&OwnedFd>; 6]) -> Reply {
    let h = &req.header;
    let a = h.args;
    const AT_SYMLINK_NOFOLLOW: u64 = 0x100;
    const AT_EMPTY_PATH: u64 = 0x1000;
    let here = Some((cwd, h.cwd));
    let arg1 = |dir: usize| Arg { path: req.path1.unwrap_or(b""), dirfd: fd_of[dir], cwd: here };
    let arg2 = |dir: usize| Arg { path: req.path2.unwrap_or(b""), dirfd: fd_of[dir], cwd: here };
    let empty_with_fd = |dir: usize, flags: u64| {
        flags & AT_EMPTY_PATH != 0 && req.path1.map_or(true, |p| p.is_empty()) && fd_of[dir].is_some()
    };
    match h.op {
        nr::OPENAT | nr::OPENAT2 => {
            let (flags, mode, resolve_flags) = if h.op == nr::OPENAT2 {
                if req.extra.len() != 24 {
                    return Reply::err(errno::EINVAL);
                }
                let w = |i: usize| u64::from_le_bytes(req.extra[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
                (w(0), w(1), w(2))
            } else {
                (a[2] & 0xffff_ffff, a[3] & 0o7777, 0)
            };
            open(s, pid, &arg1(0), flags, mode, resolve_flags, h.op == nr::OPENAT2).with_fd()
        }
        nr::NEWFSTATAT | nr::STATX => {
            let flags = if h.op == nr::NEWFSTATAT { a[3] } else { a[2] };
            let mut buf = vec![0u8; if h.op == nr::NEWFSTATAT { 144 } else { 256 }];
            let r = (|| -> Res<i64> {
                if empty_with_fd(0, flags) {
                    let fd = fd_of[0].expect("checked");
                    return if h.op == nr::NEWFSTATAT {
                        raw(libc::SYS_fstat, [fdl(fd), buf.as_mut_ptr() as _, 0, 0, 0, 0])
                    } else {
                        let e = CString::default();
                        raw(libc::SYS_statx, [fdl(fd), cs(&e), AT_EMPTY_PATH as _, a[3] as _, buf.as_mut_ptr() as _, 0])
                    };
                }
                let p = locate(s, pid, &arg1(0), flags & AT_SYMLINK_NOFOLLOW == 0)?;
                if p.walked.is_none() {
                    let fd = pin(pid, &p, 0)?;
                    let e = CString::default();
                    return if h.op == nr::NEWFSTATAT {
                        raw(libc::SYS_newfstatat, [fdl(&fd), cs(&e), buf.as_mut_ptr() as _, AT_EMPTY_PATH as _, 0, 0])
                    } else {
                        let fl = (flags & !AT_SYMLINK_NOFOLLOW) | AT_EMPTY_PATH;
                        raw(libc::SYS_statx, [fdl(&fd), cs(&e), fl as _, a[3] as _, buf.as_mut_ptr() as _, 0])
                    };
                }
                let (dir, name) = (p.fd(), &p.name);
                if h.op == nr::NEWFSTATAT {
                    raw(libc::SYS_newfstatat, [dir, cs(name), buf.as_mut_ptr() as _, p.nofollow, 0, 0])
                } else {
                    let fl = (flags & !(AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)) as libc::c_long | p.nofollow;
                    raw(libc::SYS_statx, [dir, cs(name), fl, a[3] as _, buf.as_mut_ptr() as _, 0])
                }
            })();
            match r {
                Ok(v) => Reply { result: v, data: buf, fds: vec![] },
                Err(e) => Reply::err(e),
            }
        }
        nr::FACCESSAT2 => res((|| {
            let p = locate(s, pid, &arg1(0), a[3] & AT_SYMLINK_NOFOLLOW == 0)?;
            if a[2] & 2 != 0 && p.readonly {
                return Err(errno::EROFS);
            }
            let fl = (a[3] & 0x200) as libc::c_long | p.nofollow; // AT_EACCESS
            if p.walked.is_none() {
                let fd = pin(pid, &p, 0)?;
                let fl = (a[3] & 0x200 | AT_EMPTY_PATH) as libc::c_long;
                return raw(libc::SYS_faccessat2, [fdl(&fd), cs(c""), a[2] as _, fl, 0, 0]);
            }
            raw(libc::SYS_faccessat2, [p.fd(), cs(&p.name), a[2] as _, fl, 0, 0])
        })()),
        nr::READLINKAT => {
            let r = (|| {
                if empty_with_fd(0, AT_EMPTY_PATH) {
                    return sys::readlinkat(fd_of[0].map(|f| f.as_fd()), c"");
                }
                // /proc/self and /proc/thread-self are links to the caller (the walk's
                // HostFs says the same); rewritten, they would name a directory.
                match req.path1 {
                    Some(b"/proc/self") => return Ok(pid.to_string().into_bytes()),
                    Some(b"/proc/thread-self") => return Ok(format!("{pid}/task/{pid}").into_bytes()),
                    _ => {}
                }
                let p = locate(s, pid, &arg1(0), false)?;
                let Some(r) = &p.walked else {
                    // The kernel's walk; /proc/PID/exe shows the program, not the loader.
                    let name = p.name.as_bytes();
                    if name.starts_with(b"/proc/") && name.ends_with(b"/exe") {
                        if let Node::Symlink(t) = (HostFs { pid, session: s }).node(Path::new(OsStr::from_bytes(name)))
                        {
                            return Ok(t);
                        }
                    }
                    let fd = pin(pid, &p, 0)?;
                    // readlinkat(fd, "") of what is not a link answers ENOENT; the
                    // kernel's answer for a path is EINVAL.
                    let mut st = [0u8; 144];
                    raw(libc::SYS_newfstatat, [fdl(&fd), cs(c""), st.as_mut_ptr() as _, AT_EMPTY_PATH as _, 0, 0])?;
                    let mode = u32::from_le_bytes(st[24..28].try_into().expect("4 bytes"));
                    if mode & libc::S_IFMT != libc::S_IFLNK {
                        return Err(libc::EINVAL);
                    }
                    return sys::readlinkat(Some(fd.as_fd()), c"");
                };
                let link = {
                    let h = HostFs { pid, session: s };
                    h.node(&r.host)
                };
                match link {
                    Node::Symlink(t) if r.host.starts_with("/proc/") && t.first() == Some(&b'/') => Ok(s
                        .view
                        .view_of(Path::new(OsStr::from_bytes(&t)))
                        .map_or(t, |v| v.into_os_string().into_vec())),
                    Node::Symlink(t) => Ok(t),
                    _ => sys::readlinkat(p.borrowed(), &p.name),
                }
            })();
            match r {
                Ok(t) => Reply { result: t.len() as i64, data: t, fds: vec![] },
                Err(e) => Reply::err(e),
            }
        }
        nr::GETCWD => match base(s, pid, None) {
            Ok(v) => {
                let mut t = v.into_os_string().into_vec();
                t.push(0);
                if t.len() as u64 > a[1] {
                    return Reply::err(libc::ERANGE);
                }
                Reply { result: t.len() as i64, data: t, fds: vec![] }
            }
            Err(e) => Reply::err(e),
        },
        nr::CHDIR => match (|| {
            let p = locate(s, pid, &arg1(0), true)?;
            if p.walked.is_none() {
                // The kernel walks, following a final link as chdir does (a link to a
                // directory, /bin on a merged /usr), under the open's rules.
                return pin(pid, &p, libc::O_DIRECTORY as u64);
            }
            // The walk followed every link: the final component is none.
            let fl = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
            sys::openat2(p.borrowed(), &p.name, fl, 0, 0)
        })() {
            Ok(fd) => Reply { result: 0, data: vec![], fds: vec![fd] },
            Err(e) => Reply::err(e),
        },
        nr::MKDIRAT | nr::MKNODAT => res((|| {
            let p = locate(s, pid, &arg1(0), false)?;
            p.writable()?;
            let (dir, name) = (p.fd(), &p.name);
            let mode = (a[2] as u32 & !sys::umask_of(pid)) as libc::c_long;
            if h.op == nr::MKDIRAT {
                raw(libc::SYS_mkdirat, [dir, cs(name), mode & 0o7777, 0, 0, 0])
            } else {
                let mode = (a[2] as u32 & libc::S_IFMT) as libc::c_long | (mode & 0o7777);
                raw(libc::SYS_mknodat, [dir, cs(name), mode, a[3] as _, 0, 0])
            }
        })()),
        nr::UNLINKAT => res((|| {
            let p = locate(s, pid, &arg1(0), false)?;
            p.writable()?;
            let (dir, name) = (p.fd(), &p.name);
            raw(libc::SYS_unlinkat, [dir, cs(name), (a[2] & 0x200) as _, 0, 0, 0])
        })()),
        nr::RENAMEAT2 | nr::LINKAT => res((|| {
            let follow1 = h.op == nr::LINKAT && a[4] & 0x400 != 0; // AT_SYMLINK_FOLLOW
            let r1 = resolve(s, pid, &arg1(0), follow1)?;
            let r2 = resolve(s, pid, &arg2(2), false)?;
            writable(&r2)?;
            if h.op == nr::RENAMEAT2 {
                writable(&r1)?;
            }
            let (d1, n1) = parent(&r1)?;
            let (d2, n2) = parent(&r2)?;
            if h.op == nr::RENAMEAT2 {
                raw(libc::SYS_renameat2, [fdl(&d1), cs(&n1), fdl(&d2), cs(&n2), (a[4] & 0x7) as _, 0])
            } else {
                raw(libc::SYS_linkat, [fdl(&d1), cs(&n1), fdl(&d2), cs(&n2), 0, 0])
            }
        })()),
        nr::SYMLINKAT => res((|| {
            let target = CString::new(req.path1.unwrap_or(b"")).map_err(|_| libc::EINVAL)?;
            let p = locate(s, pid, &arg2(1), false)?;
            p.writable()?;
            let (dir, name) = (p.fd(), &p.name);
            raw(libc::SYS_symlinkat, [cs(&target), dir, cs(name), 0, 0, 0])
        })()),
        nr::FCHMODAT2 => res((|| {
            if empty_with_fd(0, a[3]) {
                let e = CString::default();
                return raw(452, [fdl(fd_of[0].expect("checked")), cs(&e), a[2] as _, AT_EMPTY_PATH as _, 0, 0]);
            }
            let p = locate(s, pid, &arg1(0), a[3] & AT_SYMLINK_NOFOLLOW == 0)?;
            p.writable()?;
            if p.walked.is_none() {
                let fd = pin_to_change(pid, &p)?;
                return raw(452, [fdl(&fd), cs(c""), (a[2] & 0o7777) as _, p.nofollow | AT_EMPTY_PATH as i64, 0, 0]);
            }
            let (dir, name) = (p.fd(), &p.name);
            raw(452, [dir, cs(name), (a[2] & 0o7777) as _, p.nofollow, 0, 0])
        })()),
        nr::FCHOWNAT => res((|| {
            if empty_with_fd(0, a[4]) {
                let e = CString::default();
                return raw(
                    libc::SYS_fchownat,
                    [fdl(fd_of[0].expect("checked")), cs(&e), a[2] as _, a[3] as _, AT_EMPTY_PATH as _, 0],
                );
            }
            let p = locate(s, pid, &arg1(0), a[4] & AT_SYMLINK_NOFOLLOW == 0)?;
            p.writable()?;
            if p.walked.is_none() {
                let fd = pin_to_change(pid, &p)?;
                let fl = p.nofollow | AT_EMPTY_PATH as i64;
                return raw(libc::SYS_fchownat, [fdl(&fd), cs(c""), a[2] as u32 as _, a[3] as u32 as _, fl, 0]);
            }
            let (dir, name) = (p.fd(), &p.name);
            raw(libc::SYS_fchownat, [dir, cs(name), a[2] as u32 as _, a[3] as u32 as _, p.nofollow, 0])
        })()),
        nr::UTIMENSAT => res((|| {
            let times = if req.extra.len() == 32 { req.extra.as_ptr() as libc::c_long } else { 0 };
            if req.path1.is_none() {
                let fd = fd_of[0].ok_or(errno::EBADF)?;
                return raw(libc::SYS_utimensat, [fdl(fd), 0, times, 0, 0, 0]);
            }
            if empty_with_fd(0, a[3]) {
                let e = CString::default();
                return raw(
                    libc::SYS_utimensat,
                    [fdl(fd_of[0].expect("checked")), cs(&e), times, AT_EMPTY_PATH as _, 0, 0],
                );
            }
            let p = locate(s, pid, &arg1(0), a[3] & AT_SYMLINK_NOFOLLOW == 0)?;
            p.writable()?;
            if p.walked.is_none() {
                let fd = pin_to_change(pid, &p)?;
                return raw(libc::SYS_utimensat, [fdl(&fd), cs(c""), times, p.nofollow | AT_EMPTY_PATH as i64, 0, 0]);
            }
            let (dir, name) = (p.fd(), &p.name);
            raw(libc::SYS_utimensat, [dir, cs(name), times, p.nofollow, 0, 0])
        })()),
        nr::TRUNCATE => res((|| {
            let p = locate(s, pid, &arg1(0), true)?;
            p.writable()?;
            let fl = (libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY) as u64;
            // The kernel's walk follows a final link, as truncate does; after the
            // view's walk there is none.
            let fd = if p.walked.is_none() {
                open_pinned(pid, &p, fl)?
            } else {
                sys::openat2(p.borrowed(), &p.name, fl | O_NOFOLLOW, 0, 0)?
            };
            raw(libc::SYS_ftruncate, [fdl(&fd), a[1] as _, 0, 0, 0, 0])
        })()),
        nr::STATFS => {
            let mut buf = vec![0u8; 120];
            let r = (|| {
                let p = locate(s, pid, &arg1(0), true)?;
                let fd = if p.walked.is_none() {
                    pin(pid, &p, 0)?
                } else {
                    sys::openat2(
                        p.borrowed(),
                        &p.name,
                        (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
                        0,
                        0,
                    )?
                };
                raw(libc::SYS_fstatfs, [fdl(&fd), buf.as_mut_ptr() as _, 0, 0, 0, 0])
            })();
            match r {
                Ok(v) => Reply { result: v, data: buf, fds: vec![] },
                Err(e) => Reply::err(e),
            }
        }
        nr::EXECVEAT => match exec(s, pid, &arg1(0), a[4]) {
            Ok(r) => r,
            Err(e) => Reply::err(e),
        },
        nr::INOTIFY_ADD_WATCH => res((|| {
            let fd = fd_of[0].ok_or(errno::EBADF)?;
            let r = resolve(s, pid, &arg1(1), a[2] & 0x0200_0000 == 0)?;
            let p = cpath(&r.host)?;
            raw(libc::SYS_inotify_add_watch, [fdl(fd), cs(&p), (a[2] | 0x0200_0000) as _, 0, 0, 0])
        })()),
        nr::GETDENTS | nr::GETDENTS64 => listing(s, h.op, fd_of[0], a[2]),
        nr::CONNECT | nr::BIND => res(sock_addr_call(s, pid, h.op, fd_of[0], req.extra)),
        nr::SOCKET | nr::SOCKETPAIR => refuse(s, h.op, errno::EACCES),
        nr::SETUID
        | nr::SETREUID
        | nr::SETRESUID
        | nr::SETFSUID
        | nr::SETGID
        | nr::SETREGID
        | nr::SETRESGID
        | nr::SETFSGID => identity(s, pid, h.op, a),
        n => match nr::class(n) {
            Class::Refused(e) => refuse(s, n, e),
            _ => refuse(s, n, errno::ENOSYS),
        },
    }
}

/// `getdents64`/`getdents` on the program's directory `fd` (the filter sends them
/// here when the policy hides something), without the entries the view hides: the
/// names of hidden view paths whose parent is this directory, found by the host
/// directory's device and inode (so a directory reached by another view path hides
/// the same names: a listing shows less, never more). A batch that was all hidden
/// is read on, so an empty answer still means the end.
fn listing(s: &Session, op: u32, fd: Option<&OwnedFd>, count: u64) -> Reply {
    let Some(fd) = fd else { return Reply::err(errno::EBADF) };
    let cap = (count as u32 as usize).min(wire::MAX_REPLY - wire::REPLY_HEADER);
    let hidden = match hidden_names_in(s, fd) {
        Ok(h) => h,
        Err(e) => return Reply::err(e),
    };
    let mut buf = vec![0u8; cap];
    loop {
        let n = match raw(op as libc::c_long, [fdl(fd), buf.as_mut_ptr() as _, cap as _, 0, 0, 0]) {
            Ok(n) => (n as usize).min(cap),
            Err(e) => return Reply::err(e),
        };
        let kept = drop_entries(&mut buf[..n], op == nr::GETDENTS64, &hidden);
        if kept > 0 || n == 0 {
            buf.truncate(kept);
            return Reply { result: kept as i64, data: buf, fds: vec![] };
        }
    }
}

/// The names the view hides directly inside the directory open as `dir`.
fn hidden_names_in(s: &Session, dir: &OwnedFd) -> Res<Vec<Vec<u8>>> {
    use std::os::unix::fs::MetadataExt;
    if s.policy.hidden.is_empty() {
        return Ok(Vec::new());
    }
    let st = std::fs::File::from(dir.try_clone().map_err(|e| e.raw_os_error().unwrap_or(errno::EBADF))?)
        .metadata()
        .map_err(|e| e.raw_os_error().unwrap_or(errno::EIO))?;
    let mut names = Vec::new();
    for h in &s.policy.hidden {
        let (Some(parent), Some(name)) = (h.parent(), h.file_name()) else { continue };
        let Some((host, _)) = s.view.host_of(parent) else { continue };
        if let Ok(m) = std::fs::metadata(&host) {
            if m.dev() == st.dev() && m.ino() == st.ino() {
                names.push(name.as_bytes().to_vec());
            }
        }
    }
    Ok(names)
}

/// Remove the records named in `hidden` from a `getdents64` (`is64`) or `getdents`
/// buffer, in place; returns the bytes kept. Records are the kernel's; a malformed
/// one ends the walk there (what follows is dropped, never read past the buffer).
pub fn drop_entries(buf: &mut [u8], is64: bool, hidden: &[Vec<u8>]) -> usize {
    if hidden.is_empty() {
        return buf.len();
    }
    let name_at = if is64 { 19 } else { 18 };
    let (mut at, mut kept) = (0usize, 0usize);
    while at + name_at <= buf.len() {
        let reclen = u16::from_le_bytes([buf[at + 16], buf[at + 17]]) as usize;
        if reclen < name_at || at + reclen > buf.len() {
            break;
        }
        let field = &buf[at + name_at..at + reclen];
        let name = &field[..field.iter().position(|&b| b == 0).unwrap_or(field.len())];
        if !hidden.iter().any(|h| h.as_slice() == name) {
            buf.copy_within(at..at + reclen, kept);
            kept += reclen;
        }
        at += reclen;
    }
    kept
}

/// The identity calls change nothing here: the server acts with the session's one
/// identity, so a program may not take another. A call that keeps every id as it is
/// (`setresuid(-1, -1, -1)`, `setuid(getuid())` with all ids equal, as make and
/// shells do) succeeds; any real change is refused with `EPERM` and counted.
fn identity(s: &Session, pid: i32, op: u32, a: [u64; 6]) -> Reply {
    let gid = matches!(op, nr::SETGID | nr::SETREGID | nr::SETRESGID | nr::SETFSGID);
    let key = if gid { "Gid:" } else { "Uid:" };
    let ids: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        })
        .unwrap_or_default();
    let Some(&current) = ids.first() else { return Reply::err(errno::EPERM) };
    let all_same = ids.iter().all(|&i| i == current);
    let n = match op {
        nr::SETUID | nr::SETGID | nr::SETFSUID | nr::SETFSGID => 1,
        nr::SETREUID | nr::SETREGID => 2,
        _ => 3,
    };
    let keeps = a.iter().take(n).all(|&x| x as u32 == u32::MAX || x as u32 == current);
    if all_same && keeps {
        // setfsuid/setfsgid answer the previous id.
        return Reply::ok(if matches!(op, nr::SETFSUID | nr::SETFSGID) { current as i64 } else { 0 });
    }
    refuse(s, op, errno::EPERM)
}

trait WithFd {
    fn with_fd(self) -> Reply;
}
impl WithFd for Result<OwnedFd, i32> {
    fn with_fd(self) -> Reply {
        match self {
            Ok(fd) => Reply { result: 0, data: vec![], fds: vec![fd] },
            Err(e) => Reply::err(e),
        }
    }
}
fn refuse(s: &Session, nr: u32, e: i32) -> Reply {
    *s.stats.refused.lock().unwrap_or_else(|p| p.into_inner()).entry(nr).or_default() += 1;
    Reply::err(e)
}

const O_ACCMODE: u64 = 3;
const O_CREAT: u64 = 0o100;
const O_EXCL: u64 = 0o200;
const O_TRUNC: u64 = 0o1000;
const O_APPEND: u64 = 0o2000;
const O_NOFOLLOW: u64 = 0o400000;
const O_TMPFILE: u64 = 0o20200000;

fn open(
    s: &Session,
    pid: i32,
    a: &Arg<'_>,
    flags: u64,
    mode: u64,
    resolve_flags: u64,
    openat2_request: bool,
) -> Res<OwnedFd> {
    if resolve_flags & !0x3f != 0 {
        return Err(errno::EINVAL);
    }
    if a.path.is_empty() {
        return Err(errno::ENOENT);
    }
    let creat = flags & O_CREAT != 0;
    let follow = flags & O_NOFOLLOW == 0 && !(creat && flags & O_EXCL != 0) && resolve_flags & 0x04 == 0;
    let mode = if creat || flags & O_TMPFILE == O_TMPFILE { mode & !(sys::umask_of(pid) as u64) & 0o7777 } else { 0 };
    if identity_view(s) {
        // The kernel walks, with the program's own flags and resolve flags — but not
        // through /proc magic links, unless the path names the caller's own
        // /proc/PID (its /dev/fd): the server's own links would hand out what the
        // server holds.
        let p = locate(s, pid, a, follow)?;
        let fl = flags
            | if flags & libc::O_PATH as u64 != 0 { libc::O_CLOEXEC } else { libc::O_NOCTTY | libc::O_CLOEXEC } as u64;
        // openat ignores flag bits openat2 refuses: dropped here, so both answer alike.
        let fl = if openat2_request { fl } else { sanitize_open_flags(fl) };
        let fd = match sys::openat2(p.borrowed(), &p.name, fl, mode, resolve_flags | sys::NO_MAGICLINKS) {
            Err(libc::ELOOP) if own_proc(pid, p.name.as_bytes()) && resolve_flags & sys::NO_MAGICLINKS == 0 => {
                sys::openat2(p.borrowed(), &p.name, fl, mode, resolve_flags)?
            }
            r => r?,
        };
        proc_check(pid, &fd, flags)?;
        return Ok(fd);
    }
    let b = base(s, pid, a.dirfd)?;
    let r = s.view.resolve(&b, a.path, follow, &HostFs { pid, session: s })?;
    // RESOLVE_BENEATH / RESOLVE_IN_ROOT: nothing outside the starting directory.
    if resolve_flags & 0x18 != 0 {
        let mut depth = 0i32;
        let climbs = a.path.split(|&c| c == b'/').any(|c| {
            match c {
                b"" | b"." => {}
                b".." => depth -= 1,
                _ => depth += 1,
            }
            depth < 0
        });
        if climbs || a.path.first() == Some(&b'/') || !r.view.starts_with(&b) {
            return Err(libc::EXDEV);
        }
    }
    let writes =
        flags & O_ACCMODE != 0 || flags & (O_CREAT | O_TRUNC | O_APPEND) != 0 || flags & O_TMPFILE == O_TMPFILE;
    if writes {
        writable(&r)?;
    }
    // The server never takes a controlling terminal for itself; the descriptor's
    // close-on-exec is the receiver's to choose (MSG_CMSG_CLOEXEC).
    let extra =
        if flags & libc::O_PATH as u64 != 0 { libc::O_CLOEXEC } else { libc::O_NOCTTY | libc::O_CLOEXEC } as u64;
    let open_final = |dir: Option<BorrowedFd<'_>>, name: &CStr, fl: u64| -> Res<OwnedFd> {
        if openat2_request {
            // openat2 checks its flags strictly: let the kernel judge the program's.
            sys::openat2(dir, name, fl, mode, 0)
        } else {
            let d = dir.map_or(libc::AT_FDCWD as libc::c_long, |d| d.as_raw_fd() as libc::c_long);
            // SAFETY: a descriptor openat returned is new and ours.
            raw(libc::SYS_openat, [d, cs(name), fl as _, mode as _, 0, 0])
                .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
        }
    };
    if r.magic {
        // /proc/PID/fd/N and friends: open what the link designates — the caller's
        // own only.
        if !own_proc(pid, r.host.as_os_str().as_bytes()) {
            return Err(errno::EACCES);
        }
        let p = cpath(&r.host)?;
        return open_final(None, &p, flags | extra);
    }
    let (dir, name) = parent(&r)?;
    // The final component is not a link (the walk followed it), unless the program
    // asked not to follow: O_NOFOLLOW keeps a link swapped in since from being
    // followed. O_PATH|O_NOFOLLOW opens a link itself, as asked.
    let fd = open_final(Some(dir.as_fd()), &name, flags | extra | O_NOFOLLOW)?;
    proc_check(pid, &fd, flags)?;
    Ok(fd)
}

/// Whether `path` is an entry of another process's `/proc/PID` other than those `ps`
/// reads.
fn foreign_proc_entry(pid: i32, path: &[u8]) -> bool {
    let Some(rest) = path.strip_prefix(b"/proc/") else { return false };
    let mut parts = rest.split(|&b| b == b'/');
    let Some(n) = parts.next().and_then(|n| std::str::from_utf8(n).ok()).and_then(|n| n.parse::<i32>().ok()) else {
        return false;
    };
    if n == pid {
        return false;
    }
    let mut file = parts.next().unwrap_or(b"");
    if file == b"task" {
        if parts.next().is_none() {
            return false;
        }
        file = parts.next().unwrap_or(b"");
    }
    let safe = [&b""[..], b"stat", b"status", b"statm", b"cmdline", b"comm", b"cgroup", b"limits", b"schedstat"];
    !safe.contains(&file)
}

/// Whether `path` is under the caller's own `/proc/PID` (and stays there: no `..`,
/// which would climb to another process's entries).
fn own_proc(pid: i32, path: &[u8]) -> bool {
    let prefix = format!("/proc/{pid}/");
    path.starts_with(prefix.as_bytes()) && !path.split(|&b| b == b'/').any(|c| c == b"..")
}

/// The identity view's walk for the calls that look at what a path names without
/// opening it (`stat`, `statx`, `access`, `readlink`, `chdir`, `statfs`): an `O_PATH` open under the
/// open's own rules — no `/proc` magic link but under the caller's own `/proc/PID`,
/// and what it reached checked ([`proc_check`]) — so that a link the program made
/// into another process's `/proc/PID/fd` does not let the unconfined server look
/// through it for the program. The call is then made on the descriptor, so what was
/// checked is what is answered about.
fn pin(pid: i32, p: &Place, extra: u64) -> Res<OwnedFd> {
    let fl = (libc::O_PATH | libc::O_CLOEXEC) as u64 | extra | if p.nofollow != 0 { O_NOFOLLOW } else { 0 };
    open_pinned(pid, p, fl)
}

/// [`pin`] for the calls that change what a path names (`chmod`, `chown`,
/// `utimensat`): the same `O_PATH` walk, checked as a write — no other process's
/// `/proc` entry, not even those `ps` reads — and the change is then made on the
/// descriptor (`AT_EMPTY_PATH`). The kernel's plain walk from the server would follow
/// a link the program made into another process's `/proc/PID/fd` and change a file
/// only that process can reach.
fn pin_to_change(pid: i32, p: &Place) -> Res<OwnedFd> {
    let fl = (libc::O_PATH | libc::O_CLOEXEC) as u64 | if p.nofollow != 0 { O_NOFOLLOW } else { 0 };
    let fd = walk_pinned(pid, p, fl)?;
    proc_check(pid, &fd, libc::O_WRONLY as u64)?;
    Ok(fd)
}

/// [`pin`]'s open with the flags `fl` (`truncate` opens for writing).
fn open_pinned(pid: i32, p: &Place, fl: u64) -> Res<OwnedFd> {
    let fd = walk_pinned(pid, p, fl)?;
    proc_check(pid, &fd, fl)?;
    Ok(fd)
}

/// The open under the open's rules: no magic link but the caller's own `/proc/PID`'s.
fn walk_pinned(pid: i32, p: &Place, fl: u64) -> Res<OwnedFd> {
    match sys::openat2(p.borrowed(), &p.name, fl, 0, sys::NO_MAGICLINKS) {
        Err(libc::ELOOP) if own_proc(pid, p.name.as_bytes()) => sys::openat2(p.borrowed(), &p.name, fl, 0, 0),
        r => r,
    }
}

/// The flags openat2 accepts, from what openat would take (it ignores the rest).
fn sanitize_open_flags(fl: u64) -> u64 {
    if fl & libc::O_PATH as u64 != 0 {
        return fl & (libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64;
    }
    let valid = libc::O_ACCMODE
        | libc::O_CREAT
        | libc::O_EXCL
        | libc::O_NOCTTY
        | libc::O_TRUNC
        | libc::O_APPEND
        | libc::O_NONBLOCK
        | libc::O_DSYNC
        | libc::O_ASYNC
        | libc::O_DIRECT
        | libc::O_LARGEFILE
        | libc::O_DIRECTORY
        | libc::O_NOFOLLOW
        | libc::O_NOATIME
        | libc::O_CLOEXEC
        | libc::O_SYNC
        | libc::O_TMPFILE;
    fl & valid as u64
}

/// Whether `fd` is on a procfs (`PROC_SUPER_MAGIC`).
fn on_procfs(fd: &OwnedFd) -> Res<bool> {
    // SAFETY: st is plain data the kernel fills (fstat(2)); fd is open (O_PATH is fine).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    raw(libc::SYS_fstat, [fdl(fd), &mut st as *mut libc::stat as _, 0, 0, 0, 0])?;
    if libc::major(st.st_dev) != 0 {
        return Ok(false);
    }
    // SAFETY: as above (fstatfs(2)).
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    raw(libc::SYS_fstatfs, [fdl(fd), &mut sf as *mut libc::statfs as _, 0, 0, 0, 0])?;
    Ok(sf.f_type == libc::PROC_SUPER_MAGIC)
}

/// Another process's `/proc/PID` files: the server (same user, no Landlock) could
/// open what ptrace access guards — its own or another program's `mem`, `environ`,
/// `fd/*` — which the program itself could not. Only read-only opens of the files
/// `ps` reads are let through.
///
/// Most descriptors are on no procfs: an `fstat` tells (procfs, like every file
/// system without a block device, has a device number of major 0; only those are
/// looked at further, by `fstatfs`), which saves the `readlink` of
/// `/proc/self/fd/N` — the dearest of the checks — on nearly every served open and
/// stat. An entry of a procfs mounted elsewhere than `/proc` is refused: its path
/// says nothing about whose it is.
fn proc_check(pid: i32, fd: &OwnedFd, flags: u64) -> Res<()> {
    if !on_procfs(fd)? {
        return Ok(());
    }
    let Ok(path) = sys::readlink(Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd()))) else {
        return Err(errno::EACCES);
    };
    let Some(rest) = path.strip_prefix(b"/proc/") else {
        return if path == b"/proc" { Ok(()) } else { Err(errno::EACCES) };
    };
    let mut parts = rest.split(|&b| b == b'/');
    let Some(n) = parts.next().and_then(|n| std::str::from_utf8(n).ok()).and_then(|n| n.parse::<i32>().ok()) else {
        return Ok(());
    };
    if n == pid {
        return Ok(());
    }
    let mut file = parts.next().unwrap_or(b"");
    if file == b"task" {
        let _thread = parts.next();
        file = parts.next().unwrap_or(b"");
    }
    let safe =
        [&b""[..], b"stat", b"status", b"statm", b"cmdline", b"comm", b"cgroup", b"limits", b"schedstat", b"task"];
    let read_only = flags & O_ACCMODE == 0;
    if read_only && safe.contains(&file) && parts.next().is_none() {
        Ok(())
    } else {
        Err(errno::EACCES)
    }
}

/// The script interpreter line: `#!interp [arg]`.
fn shebang(head: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let line = head.strip_prefix(b"#!")?;
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    let line = &line[..end];
    let trim = |s: &[u8]| -> Vec<u8> {
        let s: &[u8] = match s.iter().position(|b| !b" \t".contains(b)) {
            Some(i) => &s[i..],
            None => &[],
        };
        let e = s.iter().rposition(|b| !b" \t\r".contains(b)).map_or(0, |i| i + 1);
        s[..e].to_vec()
    };
    let line = trim(line);
    if line.is_empty() {
        return None;
    }
    let sp = line.iter().position(|b| b" \t".contains(b));
    match sp {
        None => Some((line, None)),
        Some(i) => {
            let arg = trim(&line[i..]);
            Some((line[..i].to_vec(), if arg.is_empty() { None } else { Some(arg) }))
        }
    }
}

/// Open a program (or interpreter) to exec: `X_OK` for the caller, a regular file.
/// `named`: the host path is wanted (the program's, for `/proc/PID/exe`); an ELF
/// interpreter's is not, and reading it back through `/proc/self/fd` costs a path
/// rendering per exec.
fn open_exec(s: &Session, pid: i32, a: &Arg<'_>, follow: bool, named: bool) -> Res<(OwnedFd, Resolved)> {
    let p = locate(s, pid, a, follow)?;
    let nofollow = if p.walked.is_some() || !follow { libc::O_NOFOLLOW } else { 0 };
    raw(
        libc::SYS_faccessat2,
        [p.fd(), cs(&p.name), libc::X_OK as _, libc::AT_EACCESS as libc::c_long | p.nofollow, 0, 0],
    )?;
    let fl = (libc::O_RDONLY | libc::O_CLOEXEC | nofollow | libc::O_NOCTTY | libc::O_NONBLOCK) as u64;
    let fd = match sys::openat2(p.borrowed(), &p.name, fl, 0, sys::NO_MAGICLINKS) {
        Err(libc::ELOOP) if own_proc(pid, p.name.as_bytes()) => sys::openat2(p.borrowed(), &p.name, fl, 0, 0)?,
        r => r?,
    };
    // SAFETY: st is plain data the kernel fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    raw(libc::SYS_fstat, [fdl(&fd), &mut st as *mut libc::stat as _, 0, 0, 0, 0])?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(errno::EACCES);
    }
    // Only a file system without a block device (major 0) can be a procfs: the same
    // test proc_check starts with, without its fstat again (one per open_exec).
    if libc::major(st.st_dev) == 0 {
        proc_check(pid, &fd, 0)?;
    }
    let r = match p.walked {
        Some(r) => r,
        None if !named => Resolved { view: PathBuf::new(), host: PathBuf::new(), readonly: false, magic: false },
        None => {
            let host = sys::readlink(Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())))?;
            let host = PathBuf::from(OsStr::from_bytes(&host));
            Resolved { view: host.clone(), host, readonly: false, magic: false }
        }
    };
    Ok((fd, r))
}

fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], at: u64) -> Res<usize> {
    raw(libc::SYS_pread64, [fd.as_raw_fd() as _, buf.as_mut_ptr() as _, buf.len() as _, at as _, 0, 0])
        .map(|n| n as usize)
}

/// Exec: resolve the program in the view, follow `#!` lines (up to four deep, as
/// the kernel), open the ELF program and its interpreter, and hand them over with the
/// loader. The data is the argv prefix: a count, then NUL-terminated strings.
fn exec(s: &Session, pid: i32, a: &Arg<'_>, flags: u64) -> Res<Reply> {
    let mut prefix: Vec<Vec<u8>> = Vec::new();
    let (mut fd, mut r) = if flags & 0x1000 != 0 && a.path.is_empty() {
        let fd = a.dirfd.ok_or(errno::EBADF)?;
        // fexecve: reopen what the descriptor designates for reading (it may be O_PATH).
        let via = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|_| libc::EINVAL)?;
        let dup = sys::openat2(None, &via, (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY) as u64, 0, 0)?;
        let host = sys::readlink(Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())))?;
        let host = PathBuf::from(OsStr::from_bytes(&host));
        (dup, Resolved { view: PathBuf::new(), host, readonly: true, magic: false })
    } else {
        open_exec(s, pid, a, flags & 0x100 == 0, true)?
    };
    let mut depth = 0;
    // The first KiB: a `#!` line (the kernel reads 256 bytes of it), or the ELF
    // header, usually its program headers and its interpreter's path too — one read
    // where there were three or four per exec.
    let mut head = [0u8; 1024];
    let mut n;
    loop {
        n = pread(fd.as_fd(), &mut head, 0)?;
        if let Some((interp, arg)) = shebang(&head[..n.min(256)]) {
            depth += 1;
            if depth > 4 {
                return Err(errno::ELOOP);
            }
            let mut p = vec![interp.clone()];
            p.extend(arg);
            // Nested interpreters go in front.
            p.extend(std::mem::take(&mut prefix));
            prefix = p;
            let (f, rr) = open_exec(s, pid, &Arg { path: &interp, dirfd: None, cwd: None }, true, true)?;
            fd = f;
            r = rr;
            continue;
        }
        break;
    }
    if n < elf::EHDR_SIZE {
        return Err(errno::ENOEXEC);
    }
    let head = &head[..n];
    let h = elf::parse_ehdr(&head[..elf::EHDR_SIZE]).map_err(|_| errno::ENOEXEC)?;
    // Bytes [at, at + len) of the file: from the first KiB, or read.
    let bytes = |at: u64, len: usize| -> Res<Vec<u8>> {
        if let Some(b) = usize::try_from(at).ok().and_then(|a| head.get(a..a.checked_add(len)?)) {
            return Ok(b.to_vec());
        }
        let mut b = vec![0u8; len];
        if pread(fd.as_fd(), &mut b, at)? != len {
            return Err(errno::ENOEXEC);
        }
        Ok(b)
    };
    let table = bytes(h.phoff, h.phnum * elf::PHDR_SIZE)?;
    let mut interp_fd = None;
    for i in 0..h.phnum {
        let p = elf::phdr(&table, i).map_err(|_| errno::ENOEXEC)?;
        if p.kind == elf::PT_INTERP {
            if p.filesz == 0 || p.filesz > 4096 {
                return Err(errno::ENOEXEC);
            }
            let mut path = bytes(p.offset, p.filesz as usize)?;
            while path.last() == Some(&0) {
                path.pop();
            }
            let (f, _) = open_exec(s, pid, &Arg { path: &path, dirfd: None, cwd: None }, true, false).map_err(|e| {
                if e == errno::EACCES {
                    e
                } else {
                    errno::ENOENT
                }
            })?;
            interp_fd = Some(f);
        }
    }
    s.exes.lock().unwrap_or_else(|p| p.into_inner()).insert(pid, r.host.clone());
    let mut data = vec![prefix.len() as u8];
    for p in &prefix {
        data.extend_from_slice(p);
        data.push(0);
    }
    let loader = s.loader.try_clone().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let mut fds = vec![loader, fd];
    fds.extend(interp_fd);
    Ok(Reply { result: 0, data, fds })
}

/// `connect`/`bind` on the program's socket: a path of an `AF_UNIX` address is
/// resolved in the view (and reached through the parent directory's descriptor, so
/// host paths longer than `sun_path` work); other families only with the network on.
fn sock_addr_call(s: &Session, pid: i32, op: u32, fd: Option<&OwnedFd>, addr: &[u8]) -> Res<i64> {
    let fd = fd.ok_or(errno::EBADF)?;
    let call = if op == nr::CONNECT { libc::SYS_connect } else { libc::SYS_bind };
    let (sun, _dir) = host_address(s, pid, addr, op == nr::BIND)?;
    if op == nr::BIND {
        // The socket file is created with the program's umask.
        let _ = sys::umask_of(pid);
    }
    raw(call, [fdl(fd), sun.as_ptr() as _, sun.len() as _, 0, 0, 0])
}

/// The address the server uses for the program's `addr` (`connect`, `bind`, a
/// send's destination): an `AF_UNIX` path resolved in the view, as
/// `/proc/self/fd/DIR/name` with `DIR` (returned: keep it open for the call) the
/// parent directory opened without following links; abstract names and other
/// families as they are, only with the network on; unnamed as it is.
fn host_address(s: &Session, pid: i32, addr: &[u8], bind: bool) -> Res<(Vec<u8>, Option<OwnedFd>)> {
    if addr.len() < 2 {
        return Ok((addr.to_vec(), None));
    }
    let family = u16::from_le_bytes([addr[0], addr[1]]) as i32;
    if family != libc::AF_UNIX {
        if !s.policy.network {
            return Err(errno::EACCES);
        }
        return Ok((addr.to_vec(), None));
    }
    let path = &addr[2..];
    if path.is_empty() || path[0] == 0 {
        // Unnamed or abstract: no path to resolve. The server makes the call, so
        // Landlock's scoping of abstract sockets does not apply to it: with the
        // network off, abstract names (another program's, outside the session) are
        // refused here.
        if !s.policy.network && path.first() == Some(&0) {
            return Err(errno::EACCES);
        }
        return Ok((addr.to_vec(), None));
    }
    let path = &path[..path.iter().position(|&b| b == 0).unwrap_or(path.len())];
    let r = resolve(s, pid, &Arg { path, dirfd: None, cwd: None }, !bind)?;
    if bind {
        writable(&r)?;
    }
    let (dir, name) = parent(&r)?;
    let via = format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), String::from_utf8_lossy(name.as_bytes()));
    if via.len() >= 108 || via.as_bytes().contains(&0) {
        return Err(libc::ENAMETOOLONG);
    }
    let mut sun = Vec::with_capacity(2 + via.len() + 1);
    sun.extend_from_slice(&(libc::AF_UNIX as u16).to_le_bytes());
    sun.extend_from_slice(via.as_bytes());
    sun.push(0);
    Ok((sun, Some(dir)))
}

/// Most control data a send carries (the library's bound too).
pub const MAX_SEND_CONTROL: usize = wire::MAX_SEND_CONTROL;
/// The kernel's `SCM_MAX_FD`.
const MAX_RIGHTS: usize = 253;

/// A control message of a program's send, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendControl {
    /// `SCM_RIGHTS`: descriptor numbers of the sender.
    Rights(Vec<i32>),
    /// `SCM_CREDENTIALS`: the pid, uid and gid the sender claims.
    Credentials(i32, u32, u32),
}

/// The parts of a `SENDMSG` request (see `ictus_unix_emul::send`): arguments
/// `[fd, flags, name length, control length, data length]`, the extra bytes the
/// name, the control data and the data. `EINVAL` if they do not add up.
pub fn send_parts<'a>(req: &Request<'a>) -> Res<(&'a [u8], &'a [u8], &'a [u8])> {
    let a = req.header.args;
    let (nl, cl, dl) = (a[2], a[3], a[4]);
    if nl > 128 || cl > MAX_SEND_CONTROL as u64 || req.header.fd_args != 1 {
        return Err(errno::EINVAL);
    }
    let (nl, cl) = (nl as usize, cl as usize);
    if ((nl + cl) as u64).checked_add(dl) != Some(req.extra.len() as u64) {
        return Err(errno::EINVAL);
    }
    let (name, rest) = req.extra.split_at(nl);
    let (control, data) = rest.split_at(cl);
    Ok((name, control, data))
}

/// Check a send's control data as the kernel would read it (`CMSG_NXTHDR`): each
/// message's length inside the data, at `SOL_SOCKET`, `SCM_RIGHTS` (at most 253
/// descriptors in all) or `SCM_CREDENTIALS`; anything else is `EINVAL` (the server
/// sends with its own privileges: it passes on nothing it cannot check).
pub fn parse_control(control: &[u8]) -> Res<Vec<SendControl>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let mut rights = 0usize;
    while control.len() - at >= 16 {
        let len = u64::from_le_bytes(control[at..at + 8].try_into().map_err(|_| errno::EINVAL)?);
        let level = i32::from_le_bytes(control[at + 8..at + 12].try_into().map_err(|_| errno::EINVAL)?);
        let kind = i32::from_le_bytes(control[at + 12..at + 16].try_into().map_err(|_| errno::EINVAL)?);
        if len < 16 || len > (control.len() - at) as u64 || level != libc::SOL_SOCKET {
            return Err(errno::EINVAL);
        }
        let body = &control[at + 16..at + len as usize];
        match kind {
            libc::SCM_RIGHTS if body.len() % 4 == 0 => {
                rights += body.len() / 4;
                if rights > MAX_RIGHTS {
                    return Err(errno::EINVAL);
                }
                out.push(SendControl::Rights(
                    body.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
                ));
            }
            libc::SCM_CREDENTIALS if body.len() == 12 => {
                let w = |i: usize| u32::from_le_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
                out.push(SendControl::Credentials(w(0) as i32, w(4), w(8)));
            }
            _ => return Err(errno::EINVAL),
        }
        at += (len as usize).div_ceil(8) * 8;
        if at > control.len() {
            break;
        }
    }
    Ok(out)
}

/// Serve a program's send with a destination or control data (`SENDMSG`): the
/// socket is `fds[0]`, the descriptors of its `SCM_RIGHTS` the rest, in order (the
/// caller took them from the sender). `cred` is what the kernel stamped on the
/// request: `SCM_CREDENTIALS` must name the sender itself (`EPERM` otherwise), and
/// are then left to the kernel, which stamps the server's own (a receiver sees the
/// server's pid, the program's user).
pub fn serve_send(s: &Session, cred: (i32, u32, u32), req: &Request<'_>, fds: &[OwnedFd]) -> Reply {
    s.stats.served.fetch_add(1, Ordering::Relaxed);
    if let Some(e) = s.policy.refusal(req.header.op) {
        return refuse(s, req.header.op, e);
    }
    res((|| {
        let (name, control, data) = send_parts(req)?;
        let sock = fds.first().ok_or(errno::EBADF)?;
        let mut rights: Vec<i32> = Vec::new();
        for c in parse_control(control)? {
            match c {
                SendControl::Rights(_) => {}
                SendControl::Credentials(p, u, g) if (p, u, g) == cred => {}
                SendControl::Credentials(..) => return Err(errno::EPERM),
            }
        }
        for f in &fds[1..] {
            rights.push(f.as_raw_fd());
        }
        let (addr, _dir) = if name.is_empty() { (Vec::new(), None) } else { host_address(s, cred.0, name, false)? };
        let mut cbuf = vec![0u64; (16 + 4 * rights.len()).div_ceil(8)];
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        // SAFETY: msghdr is plain data.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !addr.is_empty() {
            msg.msg_name = addr.as_ptr() as *mut libc::c_void;
            msg.msg_namelen = addr.len() as u32;
        }
        if !rights.is_empty() {
            let bytes = 16 + 4 * rights.len();
            // SAFETY: cbuf has room for one header and the descriptors (8-aligned).
            unsafe {
                let c = cbuf.as_mut_ptr() as *mut libc::cmsghdr;
                (*c).cmsg_len = bytes;
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                let d = (c as *mut u8).add(16) as *mut i32;
                for (i, f) in rights.iter().enumerate() {
                    std::ptr::write_unaligned(d.add(i), *f);
                }
            }
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = bytes;
        }
        let flags = (req.header.args[1] as u32 as libc::c_int) | libc::MSG_NOSIGNAL;
        // SAFETY: msg points at live buffers (sendmsg(2)).
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, flags) };
        if r < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        Ok(r as i64)
    })())
}

/// Resolve and open a program for exec from the working directory of `pid`, as
/// `execve(path)` would (for the first process of a session).
pub fn exec_path(s: &Session, pid: i32, path: &[u8]) -> Res<Reply> {
    exec(s, pid, &Arg { path, dirfd: None, cwd: None }, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, kind: i32, body: &[u8], len: Option<u64>) -> Vec<u8> {
        let mut c = Vec::new();
        c.extend_from_slice(&len.unwrap_or(16 + body.len() as u64).to_le_bytes());
        c.extend_from_slice(&level.to_le_bytes());
        c.extend_from_slice(&kind.to_le_bytes());
        c.extend_from_slice(body);
        c.resize(c.len().div_ceil(8) * 8, 0);
        c
    }

    #[test]
    fn a_sends_control_data_is_checked_as_the_kernel_reads_it() {
        let fds: Vec<u8> = [5i32, 7].iter().flat_map(|f| f.to_le_bytes()).collect();
        let cred: Vec<u8> = [42u32, 1000, 1000].iter().flat_map(|f| f.to_le_bytes()).collect();
        let mut both = cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &fds, None);
        both.extend(cmsg(libc::SOL_SOCKET, libc::SCM_CREDENTIALS, &cred, None));
        assert_eq!(
            parse_control(&both),
            Ok(vec![SendControl::Rights(vec![5, 7]), SendControl::Credentials(42, 1000, 1000)])
        );
        assert_eq!(parse_control(&[]), Ok(vec![]));
        // A length past the end, shorter than a header, another level or type, a
        // descriptor list that is not whole, credentials of the wrong size: EINVAL.
        for bad in [
            cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &fds, Some(200)),
            cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &fds, Some(8)),
            cmsg(0, libc::SCM_RIGHTS, &fds, None),
            cmsg(libc::SOL_SOCKET, 0x4, &fds, None),
            cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &fds[..6], None),
            cmsg(libc::SOL_SOCKET, libc::SCM_CREDENTIALS, &fds, None),
        ] {
            assert_eq!(parse_control(&bad), Err(errno::EINVAL), "{bad:?}");
        }
        // More than SCM_MAX_FD descriptors in all.
        let many: Vec<u8> = (0..200i32).flat_map(|f| f.to_le_bytes()).collect();
        let mut two = cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &many, None);
        two.extend(cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &many, None));
        assert_eq!(parse_control(&two), Err(errno::EINVAL));
    }

    #[test]
    fn a_sends_parts_must_add_up() {
        let mut buf = [0u8; 256];
        let n = wire::encode_request(&mut buf, nr::SENDMSG, 0, 1, [3, 0, 2, 0, 3, 0], None, None, b"abxyz").unwrap();
        let r = Request::parse(&buf[..n]).unwrap();
        assert_eq!(send_parts(&r), Ok((&b"ab"[..], &b""[..], &b"xyz"[..])));
        for args in [
            [3, 0, 2, 0, 4, 0],
            [3, 0, 129, 0, 0, 0],
            [3, 0, 0, 5000, 0, 0],
            [3, 0, u64::MAX, 0, 7, 0],
            [3, 0, 2, 0, u64::MAX, 0],
        ] {
            let n = wire::encode_request(&mut buf, nr::SENDMSG, 0, 1, args, None, None, b"abxyz").unwrap();
            assert_eq!(send_parts(&Request::parse(&buf[..n]).unwrap()), Err(errno::EINVAL), "{args:?}");
        }
        // The socket is the one descriptor argument.
        let n = wire::encode_request(&mut buf, nr::SENDMSG, 0, 3, [3, 0, 2, 0, 3, 0], None, None, b"abxyz").unwrap();
        assert_eq!(send_parts(&Request::parse(&buf[..n]).unwrap()), Err(errno::EINVAL));
    }

    #[test]
    fn shebang_lines() {
        assert_eq!(shebang(b"#!/bin/sh\necho"), Some((b"/bin/sh".to_vec(), None)));
        assert_eq!(
            shebang(b"#! /usr/bin/env  python3 -u \n"),
            Some((b"/usr/bin/env".to_vec(), Some(b"python3 -u".to_vec())))
        );
        assert_eq!(shebang(b"#!\n"), None);
        assert_eq!(shebang(b"\x7fELF"), None);
    }

    fn dirent64(ino: u64, name: &[u8]) -> Vec<u8> {
        let reclen = (19 + name.len() + 1).div_ceil(8) * 8;
        let mut r = vec![0u8; reclen];
        r[0..8].copy_from_slice(&ino.to_le_bytes());
        r[16..18].copy_from_slice(&(reclen as u16).to_le_bytes());
        r[18] = 4;
        r[19..19 + name.len()].copy_from_slice(name);
        r
    }

    #[test]
    fn hidden_entries_leave_a_listing() {
        let names: [&[u8]; 4] = [b".", b"secret", b"keep", b"secret2"];
        let mut buf: Vec<u8> = names.iter().enumerate().flat_map(|(i, n)| dirent64(i as u64 + 1, n)).collect();
        let all = buf.len();
        assert_eq!(drop_entries(&mut buf, true, &[]), all);
        let kept = drop_entries(&mut buf, true, &[b"secret".to_vec()]);
        let want: Vec<u8> =
            [&names[0], &names[2], &names[3]].iter().enumerate().flat_map(|(i, n)| dirent64([1, 3, 4][i], n)).collect();
        assert_eq!(&buf[..kept], &want[..]);
        // A record claiming more than the buffer ends the walk, within bounds.
        let mut bad = dirent64(9, b"x");
        bad[16..18].copy_from_slice(&1000u16.to_le_bytes());
        assert_eq!(drop_entries(&mut bad, true, &[b"y".to_vec()]), 0);
        let mut short = dirent64(9, b"x");
        short[16..18].copy_from_slice(&3u16.to_le_bytes());
        assert_eq!(drop_entries(&mut short, true, &[b"y".to_vec()]), 0);
    }
}
