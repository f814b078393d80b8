//! `ictus unix-server`: one long-lived server for several programs at once, each
//! started by `ictus unix run --server`, all under the same policy, with a control
//! interface for its counts and its policy.
//!
//! The control socket (`SOCK_SEQPACKET`, `$XDG_RUNTIME_DIR/ictus/unix-server.sock`,
//! else `/tmp/ictus-$EUID/unix-server.sock`, in a directory of this user's only)
//! accepts only this user (and root), by `SO_PEERCRED`. A request is one datagram:
//!
//! - `RUN\0PATH=…\0argv0\0argv1…`: the server finds the program from the caller's
//!   working directory and `$PATH` (in the view), makes the program a session socket
//!   and answers `OK\0loader\0chdir\0network\0args…` with the session socket, the
//!   program, the filter, the generation page and the interpreter attached; the caller
//!   starts the first process itself (so it is the program's parent, with the
//!   caller's terminal, and waits for it) and says `STARTED\0pid`.
//! - `STATS`: the counts, as text. `POLICY`: the policy, as the server read it.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::launch::{self, load_policy, prepare, snapshot, start_server, Ended, Prepared, RunError, RunOptions};
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

/// Serve programs until this process is stopped.
pub fn serve(policy: Option<&Path>, socket: Option<&Path>) -> Result<(), RunError> {
    let policy = load_policy(policy)?;
    let (server, loader) = start_server(policy)?;
    let path = socket.map(Path::to_path_buf).unwrap_or_else(default_socket_path);
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        let _ = std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir);
    }
    // A path left by a server that was killed: nobody answers on it.
    if path.exists() && sys::seqpacket_connect(&path).is_err() {
        let _ = std::fs::remove_file(&path);
    }
    let listener = sys::seqpacket_listen(&path).map_err(|e| RunError::Setup(io(e)))?;
    eprintln!("ictus unix-server: serving on {} (pid {})", path.display(), std::process::id());
    let server = Arc::new(server);
    let loader = Arc::new(loader);
    sys::stop_on_int_and_term();
    let r = serve_on(&server, &loader, listener);
    // Stopped: the path goes with us (a path left by kill -9 is reclaimed above).
    let _ = std::fs::remove_file(&path);
    eprintln!("ictus unix-server: stopped; removed {}", path.display());
    r
}

/// Accept control connections on `listener` for `server`, a thread each.
pub fn serve_on(server: &Arc<Server>, loader: &Arc<PathBuf>, listener: OwnedFd) -> Result<(), RunError> {
    loop {
        let conn = match sys::accept(listener.as_fd()) {
            Ok(c) => c,
            Err(libc::EINTR) if sys::stopping() => return Ok(()),
            Err(libc::EINTR) | Err(libc::ECONNABORTED) => continue,
            Err(e) => return Err(RunError::Setup(io(e))),
        };
        let (server, loader) = (Arc::clone(server), Arc::clone(loader));
        std::thread::spawn(move || control(&server, &loader, conn));
    }
}

fn control(server: &Server, loader: &Path, conn: OwnedFd) {
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
    match parts.first().copied() {
        Some(b"RUN") => {
            let path_env = parts.get(1).and_then(|p| p.strip_prefix(b"PATH=")).map(|p| OsString::from_vec(p.to_vec()));
            let argv: Vec<OsString> = parts.iter().skip(2).map(|a| OsString::from_vec(a.to_vec())).collect();
            let cwd = sys::readlink(Path::new(&format!("/proc/{pid}/cwd")))
                .map(|b| PathBuf::from(std::ffi::OsStr::from_bytes(&b)))
                .unwrap_or_else(|_| PathBuf::from("/"));
            match prepare(server, loader, pid, &cwd, path_env.as_deref(), &argv) {
                Ok(p) => {
                    let mut data = b"OK\0".to_vec();
                    data.extend_from_slice(p.loader.as_os_str().as_bytes());
                    data.push(0);
                    data.extend_from_slice(p.chdir_to.as_deref().map_or(&b""[..], |c| c.as_os_str().as_bytes()));
                    data.push(0);
                    data.extend_from_slice(if p.network { b"1\0" } else { b"0\0" });
                    for a in &p.args {
                        data.extend_from_slice(a.as_bytes());
                        data.push(0);
                    }
                    let mut fds = vec![p.session.as_fd(), p.prog.as_fd(), p.filter.as_fd(), p.generation.as_fd()];
                    if let Some(i) = &p.interp {
                        fds.push(i.as_fd());
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
                                let mut exes = server.session().exes.lock().unwrap_or_else(|e| e.into_inner());
                                if let Some(h) = exes.remove(&pid) {
                                    exes.insert(child, h);
                                }
                            }
                        }
                    }
                }
                Err(e) => {
                    let _ = sys::send(conn.as_fd(), format!("ERR\0{e}").as_bytes(), &[]);
                }
            }
        }
        Some(b"STATS") => {
            let s = snapshot(server.session());
            let text = format!(
                "programs running {}\nconnections open {}\nconnections made {}\nrequests served {}\nmalformed {}\nworkers {}\nrefused {:?}\n",
                server.programs(),
                server.connections(),
                s.connections,
                s.served,
                s.malformed,
                server.workers(),
                s.refused
            );
            let _ = sys::send(conn.as_fd(), text.as_bytes(), &[]);
        }
        Some(b"POLICY") => {
            let _ = sys::send(conn.as_fd(), format!("{:#?}\n", server.session().policy).as_bytes(), &[]);
        }
        _ => {
            let _ = sys::send(conn.as_fd(), b"ERR\0unknown request", &[]);
        }
    }
}

/// Ask a running server something (`STATS`, `POLICY`): its answer as text.
pub fn query(socket: Option<&Path>, what: &str) -> Result<String, RunError> {
    let path = socket.map(Path::to_path_buf).unwrap_or_else(default_socket_path);
    let conn = sys::seqpacket_connect(&path)
        .map_err(|e| RunError::Setup(std::io::Error::other(format!("{}: {}", path.display(), io(e)))))?;
    sys::send(conn.as_fd(), what.as_bytes(), &[]).map_err(|e| RunError::Setup(io(e)))?;
    let mut buf = vec![0u8; 64 * 1024];
    let m = sys::recv(conn.as_fd(), &mut buf, false)
        .map_err(|e| RunError::Setup(io(e)))?
        .ok_or_else(|| RunError::Setup(io(libc::ECONNRESET)))?;
    Ok(String::from_utf8_lossy(&buf[..m.len]).into_owned())
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
        Some(b"OK") if parts.len() >= 4 && (m.fds.len() == 4 || m.fds.len() == 5) => {
            let mut fds = m.fds.into_iter();
            let mut next = || fds.next().ok_or_else(|| RunError::Setup(io(libc::EIO)));
            let (session, prog, filter, generation) = (next()?, next()?, next()?, next()?);
            let interp = next().ok();
            let chdir = parts[2];
            let p = Prepared {
                session,
                prog,
                interp,
                filter,
                generation,
                counts: None,
                loader: PathBuf::from(std::ffi::OsStr::from_bytes(parts[1])),
                args: parts[4..].iter().map(|a| OsString::from_vec(a.to_vec())).collect(),
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
