//! The server in a separate process: 10,000 idle connections cost bounded memory and
//! do not stop a download; and the unprivileged path (uid nobody, a 64 KiB memory-lock
//! limit, so io_uring cannot register the buffers) still serves every byte.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::*;
use ictus_mars_server::EngineConfig;

const CHILD_ENV: &str = "ICTUS_MARS_SERVER_CHILD";

/// The child: serves the volume named in the environment; answers `stats` on standard
/// input with one line; stops at end of input.
#[test]
fn server_child() {
    let Ok(volume) = std::env::var(CHILD_ENV) else { return };
    if std::env::var("ICTUS_MARS_CHILD_NOBODY").is_ok() {
        let lim = rustix::process::Rlimit { current: Some(64 << 10), maximum: Some(64 << 10) };
        rustix::process::setrlimit(rustix::process::Resource::Memlock, lim).unwrap();
        // SAFETY: setgid(2)/setuid(2) with constant ids, in a single-purpose child before
        // it starts any thread of its own (the test harness's thread only waits).
        let (g, u) = unsafe { (libc::setgid(65534), libc::setuid(65534)) };
        assert_eq!((g, u), (0, 0), "dropping to nobody");
    }
    ictus_mars_server::cli::raise_nofile();
    let comps: Vec<std::path::PathBuf> = volume.split(',').map(Into::into).collect();
    let cfg = EngineConfig { max_connections: 12_000, ..EngineConfig::default() };
    let server = start(&comps, cfg, false);
    let h = server.handle.clone();
    let s = h.as_ref().and_then(|h| h.stats()).unwrap_or_default();
    println!(
        "PORT {} engine={} registered={} direct={} zero_copy={}",
        server.addr.unwrap().port(),
        h.is_some(),
        s.registered,
        s.direct,
        s.zero_copy
    );
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim() == "stats" {
            let s = h.as_ref().and_then(|h| h.stats()).unwrap_or_default();
            println!("STATS {} {} {}", s.connections, s.buffers_free, s.buffers);
        }
    }
    server.stop();
}

struct ChildServer {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    port: u16,
    first: String,
}

impl ChildServer {
    fn spawn(comps: &[std::path::PathBuf], nobody: bool) -> ChildServer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "server_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, comps.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if nobody {
            cmd.env("ICTUS_MARS_CHILD_NOBODY", "1");
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        // Built at once, so that Drop waits for the child whatever happens below.
        let mut cs = ChildServer { child, stdin, out, port: 0, first: String::new() };
        let mut line = String::new();
        loop {
            line.clear();
            assert!(cs.out.read_line(&mut line).unwrap() > 0, "the server child exited");
            // The harness may print its "test server_child ... " before ours on the line.
            if let Some((_, rest)) = line.split_once("PORT ") {
                cs.port = rest.split_whitespace().next().unwrap().parse().unwrap();
                cs.first = line.clone();
                return cs;
            }
        }
    }

    fn stats(&mut self) -> (u64, u64, u64) {
        writeln!(self.stdin.as_mut().unwrap(), "stats").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.out.read_line(&mut line).unwrap() > 0);
            if let Some((_, rest)) = line.split_once("STATS ") {
                let v: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap()).collect();
                return (v[0], v[1], v[2]);
            }
        }
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

fn download(port: u16, path: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET /{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    split_response(&all).2
}

#[test]
fn ten_thousand_connections_cost_bounded_memory() {
    ictus_mars_server::cli::raise_nofile();
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(1024);
    let n: usize = 10_000.min(limit.saturating_sub(200) as usize);
    if n < 10_000 {
        eprintln!("note: RLIMIT_NOFILE {limit} allows {n} connections, not 10,000");
    }
    let dir = TempDir::new("scale");
    let (comps, clip, _) = volume(dir.path());
    let mut server = ChildServer::spawn(&comps, false);
    assert!(download(server.port, "clip.bin") == clip);
    let before = server.rss_kib();
    let conns: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap()).collect();
    assert!(eventually(Duration::from_secs(120), || server.stats().0 as usize >= n));
    let (_, free, total) = server.stats();
    assert_eq!(free, total, "idle connections hold no buffer");
    // A download while they are all open.
    assert!(download(server.port, "clip.bin") == clip, "a download among 10,000 idle connections");
    let after = server.rss_kib();
    let per_conn = (after.saturating_sub(before) * 1024) / n as u64;
    eprintln!("{n} connections: RSS {before} KiB → {after} KiB, {per_conn} B per connection");
    assert!(per_conn < 4096, "an idle connection costs {per_conn} bytes of server memory");
    drop(conns);
    assert!(eventually(Duration::from_secs(120), || server.stats().0 == 0));
}

#[test]
fn unprivileged_without_registered_buffers_still_serves() {
    let dir = TempDir::new("nobody");
    let (comps, clip, _) = volume(dir.path());
    // Let uid nobody read the volume.
    for c in &comps {
        std::fs::set_permissions(c, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    }
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("skipped: dropping to nobody needs root (this run is already unprivileged)");
        return;
    }
    let mut server = ChildServer::spawn(&comps, true);
    // The ring fits a 64 KiB lock limit; 64 MiB of buffers do not, so they go unregistered.
    assert!(server.first.contains("engine=true registered=false"), "{}", server.first);
    assert!(download(server.port, "clip.bin") == clip, "every byte, unprivileged");
    let (_, free, total) = server.stats();
    assert_eq!(free, total);
}
