//! `ictus bench mars`: paper 001's Tables 1–3 on today's Linux, beside nginx, fio and
//! curl from Debian, and a `splice` loop.
//!
//! **The slow disk.** This VM's disk is fast and cached by the host, so a slow disk is
//! made visible: each "disk" is a loop device `U` (where the I/O scheduler runs:
//! mq-deadline or BFQ) stacked on a loop device `L` over a file, and `L`'s reads are
//! throttled with the cgroup-v1 blkio controller (`blkio.throttle.read_bps_device`) for
//! one cgroup that holds the experiment and every peer it starts. On this kernel the v1
//! throttle is per cgroup and not hierarchical, and the loop driver charges a stacked
//! read to the cgroup of the process that issued it, so one cgroup is the only way all
//! readers share one budget, as they share a real disk; the throttle sits below `U`'s
//! scheduler, as a disk's queue does. Device-mapper (dm-delay), null_blk, nbd and ublk
//! are not in this kernel, and cgroup v2's `io.max` is not available (blkio is bound to
//! the v1 hierarchy). Needs root; without it, Tables 1–2 are skipped (and the notes
//! say so) and the HTTP comparison runs on plain files.
//!
//! Everything made — loop devices, the cgroup, the ext4 mount nginx serves from,
//! files, child processes — is torn down when the experiment ends, fails or is
//! interrupted (SIGINT/SIGTERM/SIGHUP stop the run at the next check), and a run
//! sweeps what an earlier, killed run left.
//!
//! - **Table 1**: read/send (pread of the volume's stripe pieces through the page cache
//!   and `send`) against stream read/send (our engine: O_DIRECT into registered buffers,
//!   zero-copy send), on one disk and striped over two. Headline
//!   `mars_striped_vs_single`.
//! - **Table 2**: one real-time stream at 40 % of a disk's rate under 0–4 background
//!   readers (fio, O_DIRECT, libaio depth 8) — ours (the engine's paced stream,
//!   BFQ on the disk, the engine thread at best-effort 0 and the background readers at
//!   best-effort 7: the kernel's I/O priority classes for the I/O we cannot queue),
//!   nginx with mq-deadline, nginx with BFQ and `ionice -c1`. Rate held, late slots,
//!   worst lateness, background throughput left. Headlines `mars_rt_held_4bg`,
//!   `mars_bg_vs_bfq`.
//! - **Table 3**: three streams paced by upcalls of 60, 75 and 120 ms through the engine:
//!   late slots (001 Table 3 on real streams; `ictus bench rtu` has the CPU side).
//! - **HTTP**: throughput and sender CPU-seconds per GB of ours, nginx (sendfile on) and a
//!   splice loop, on unthrottled storage. Headlines `mars_http_vs_nginx`,
//!   `mars_cpu_per_gb_vs_splice`.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_bench::report::{Better, Headline, PaperFigure, Report};
use ictus_bench::{BenchError, Conditions, LatencyRecorder};
use serde_json::{json, Value};

use crate::{EngineConfig, StartOptions, Volume};

/// Experiment name.
pub const EXPERIMENT: &str = "mars";
/// Where in the papers.
pub const PAPER: &str = "001 Tables 1-3";

/// Options.
#[derive(Clone, Debug, Default)]
pub struct MarsBenchOptions {
    /// Seconds, not minutes.
    pub quick: bool,
    /// Where to write the JSON.
    pub json: Option<PathBuf>,
}

/// Runs the experiment and prints its table.
pub fn main(quick: bool, json: Option<PathBuf>) -> Result<(), BenchError> {
    let report = run(&MarsBenchOptions { quick, json })?;
    report.print_table();
    Ok(())
}

fn err(context: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::io(context, io::Error::other(e.to_string()))
}

/// Set by SIGINT, SIGTERM or SIGHUP: the run stops at its next check and tears down.
fn stop_flag() -> &'static Arc<AtomicBool> {
    static F: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    F.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

fn stopped() -> bool {
    stop_flag().load(Ordering::Relaxed)
}

fn check_stop() -> Result<(), BenchError> {
    if stopped() {
        return Err(err("mars", "interrupted"));
    }
    Ok(())
}

/// Sleeps, waking early if interrupted.
fn nap(d: Duration) -> Result<(), BenchError> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check_stop()?;
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

fn run_cmd(cmd: &mut Command) -> Result<String, BenchError> {
    let out = cmd.output().map_err(|e| err(&format!("{cmd:?}"), e))?;
    if !out.status.success() {
        return Err(err(&format!("{cmd:?}"), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

const BLKIO: &str = "/sys/fs/cgroup/blkio";
const PREFIX: &str = "ictus-mars-bench-";

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Everything the experiment made, torn down in reverse on drop.
#[derive(Debug)]
struct Rig {
    dir: PathBuf,
    loops: Vec<String>,
    mounts: Vec<PathBuf>,
    cgroup: Option<PathBuf>,
    children: Vec<Child>,
}

impl Rig {
    fn new(dir: PathBuf) -> Rig {
        Rig { dir, loops: Vec::new(), mounts: Vec::new(), cgroup: None, children: Vec::new() }
    }

    fn stop_children(&mut self) {
        for c in &mut self.children {
            // Our own children, by pid.
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(c.id() as i32).expect("a child's pid is positive"),
                rustix::process::Signal::TERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for c in &mut self.children {
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.children.clear();
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop_children();
        for m in self.mounts.drain(..).rev() {
            let _ = Command::new("umount").arg(&m).status();
        }
        for l in self.loops.drain(..).rev() {
            let _ = Command::new("losetup").args(["-d", &l]).status();
        }
        if let Some(cg) = self.cgroup.take() {
            // Back to the root group, then remove ours.
            let _ = fs::write(format!("{BLKIO}/cgroup.procs"), std::process::id().to_string());
            let _ = fs::remove_dir(&cg);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Removes what an earlier run that was killed left: loop devices over its files, its
/// mount, its cgroup, its directory.
fn sweep_stale(base: &Path) {
    let stale = |name: &str| -> bool {
        name.find(PREFIX)
            .and_then(|i| name[i + PREFIX.len()..].split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|p| p != std::process::id() && !pid_alive(p))
    };
    if let Ok(mounts) = fs::read_to_string("/proc/self/mounts") {
        for m in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|m| stale(m)) {
            let _ = Command::new("umount").arg(m).status();
        }
    }
    // Upper loops first: a lower loop is busy while an upper one uses it.
    for _ in 0..2 {
        if let Ok(out) = Command::new("losetup").args(["-n", "-O", "NAME,BACK-FILE", "-l"]).output() {
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                let mut f = l.split_whitespace();
                if let (Some(dev), Some(back)) = (f.next(), f.next()) {
                    if stale(back) {
                        let _ = Command::new("losetup").args(["-d", dev]).status();
                    }
                }
            }
        }
    }
    if let Ok(rd) = fs::read_dir(BLKIO) {
        for e in rd.flatten() {
            if stale(&e.file_name().to_string_lossy()) {
                let _ = fs::remove_dir(e.path());
            }
        }
    }
    if let Ok(rd) = fs::read_dir(base) {
        for e in rd.flatten() {
            if stale(&e.file_name().to_string_lossy()) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

fn losetup(rig: &mut Rig, backing: &Path) -> Result<String, BenchError> {
    let dev = run_cmd(Command::new("losetup").args(["--show", "-f", "--direct-io=on"]).arg(backing))?;
    rig.loops.push(dev.clone());
    Ok(dev)
}

fn majmin(dev: &str) -> Result<String, BenchError> {
    let name = dev.trim_start_matches("/dev/");
    let s = fs::read_to_string(format!("/sys/block/{name}/dev")).map_err(|e| err(dev, e))?;
    Ok(s.trim().to_string())
}

fn set_scheduler(dev: &str, sched: &str) -> Result<(), BenchError> {
    let name = dev.trim_start_matches("/dev/");
    fs::write(format!("/sys/block/{name}/queue/scheduler"), sched)
        .map_err(|e| err(&format!("{dev} scheduler {sched}"), e))
}

/// A throttled "disk": an upper loop over a lower loop over a file.
#[derive(Clone, Debug)]
struct Disk {
    upper: String,
}

struct SlowRig {
    rig: Rig,
    disks: Vec<Disk>,
    rate: u64,
}

fn make_slow_rig(dir: &Path, n: usize, size: u64, rate: u64) -> Result<SlowRig, String> {
    if !rustix::process::geteuid().is_root() {
        return Err("not root: loop devices and blkio throttling need root".into());
    }
    if !Path::new(&format!("{BLKIO}/blkio.throttle.read_bps_device")).exists() {
        return Err(format!("no cgroup-v1 blkio throttle at {BLKIO}"));
    }
    let mut rig = Rig::new(dir.to_path_buf());
    let mut disks = Vec::new();
    let cg = PathBuf::from(format!("{BLKIO}/{PREFIX}{}", std::process::id()));
    fs::create_dir_all(&cg).map_err(|e| format!("creating {}: {e}", cg.display()))?;
    rig.cgroup = Some(cg.clone());
    for i in 0..n {
        let f = dir.join(format!("disk{i}.img"));
        File::create(&f).and_then(|x| x.set_len(size)).map_err(|e| format!("{}: {e}", f.display()))?;
        let lower = losetup(&mut rig, &f).map_err(|e| e.to_string())?;
        let upper = losetup(&mut rig, Path::new(&lower)).map_err(|e| e.to_string())?;
        let mm = majmin(&lower).map_err(|e| e.to_string())?;
        fs::write(cg.join("blkio.throttle.read_bps_device"), format!("{mm} {rate}"))
            .map_err(|e| format!("throttling {lower}: {e}"))?;
        disks.push(Disk { upper });
    }
    // The experiment itself (and so the engine, and every child) reads as this group.
    fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| format!("joining the cgroup: {e}"))?;
    Ok(SlowRig { rig, disks, rate })
}

fn drop_cache(dev: &str) {
    if let Ok(f) = File::open(dev) {
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
    }
}

/// A client that reads a response and records when each byte arrived.
struct Received {
    status: u16,
    bytes: u64,
    /// (ns since the request was sent, cumulative body bytes) at each read.
    marks: Vec<(u64, u64)>,
    elapsed: Duration,
}

fn http_get(port: u16, path: &str, limit: Option<u64>, deadline: Duration) -> Result<Received, BenchError> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| err("connect", e))?;
    s.set_read_timeout(Some(Duration::from_millis(200))).map_err(|e| err("socket", e))?;
    let _ = s.set_nodelay(true);
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| err("send", e))?;
    let t0 = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    let mut head = Vec::new();
    let mut status = 0;
    let mut body = 0u64;
    let mut marks = Vec::new();
    let mut in_body = false;
    loop {
        check_stop()?;
        if t0.elapsed() > deadline || limit.is_some_and(|l| body >= l) {
            break;
        }
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(err("recv", e)),
        };
        let mut data = &buf[..n];
        if !in_body {
            head.extend_from_slice(data);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            status = String::from_utf8_lossy(&head[..end])
                .split_whitespace()
                .nth(1)
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            let extra = head.len() - (end + 4);
            data = &buf[n - extra..n];
            in_body = true;
        }
        body += data.len() as u64;
        marks.push((t0.elapsed().as_nanos() as u64, body));
    }
    Ok(Received { status, bytes: body, marks, elapsed: t0.elapsed() })
}

/// Slot analysis of a stream that should deliver `rate` bytes/s in `chunk`-byte slots:
/// slot k is due when byte (k+1)·chunk has arrived, by (k+1)·chunk/rate + one period
/// of allowance (the first chunk's start-up). Returns (slots, late, worst lateness ns,
/// lateness samples).
fn slots(r: &Received, rate: f64, chunk: u64, window_bytes: u64) -> (u64, u64, u64, Vec<u64>) {
    let period_ns = chunk as f64 / rate * 1e9;
    let n = window_bytes / chunk;
    let (mut late, mut worst) = (0, 0);
    let mut samples = Vec::new();
    let mut i = 0;
    for k in 0..n {
        let need = (k + 1) * chunk;
        while i < r.marks.len() && r.marks[i].1 < need {
            i += 1;
        }
        let due = ((k + 2) as f64 * period_ns) as u64;
        let at = r.marks.get(i).map_or(u64::MAX, |m| m.0);
        let lateness = at.saturating_sub(due);
        if lateness > 0 {
            late += 1;
        }
        worst = worst.max(lateness.min(u64::MAX / 2));
        samples.push(lateness.min(u64::MAX / 2));
    }
    (n, late, worst, samples)
}

/// nginx serving `root` on `port`, single process (so its pid is the one that sends).
fn start_nginx(rig: &mut Rig, dir: &Path, root: &Path, port: u16, ionice_rt: bool) -> Result<u32, BenchError> {
    let conf = dir.join(format!("nginx-{port}.conf"));
    let tmp = dir.join("nginx-tmp");
    fs::create_dir_all(&tmp).map_err(|e| err("nginx dir", e))?;
    let text = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx-{port}.pid;\nerror_log {d}/nginx-{port}.err warn;\n\
         events {{ worker_connections 1024; }}\nhttp {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  \
         client_body_temp_path {t}/body;\n  proxy_temp_path {t}/proxy;\n  fastcgi_temp_path {t}/fcgi;\n  uwsgi_temp_path {t}/uwsgi;\n  \
         scgi_temp_path {t}/scgi;\n  server {{\n    listen 127.0.0.1:{port};\n    root {r};\n  }}\n}}\n",
        d = dir.display(),
        t = tmp.display(),
        r = root.display()
    );
    fs::write(&conf, text).map_err(|e| err("nginx conf", e))?;
    let mut cmd = if ionice_rt {
        let mut c = Command::new("ionice");
        c.args(["-c1", "-n0", "nginx"]);
        c
    } else {
        Command::new("nginx")
    };
    cmd.arg("-p").arg(dir).arg("-c").arg(&conf).arg("-e").arg(dir.join(format!("nginx-{port}.err")));
    let child =
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().map_err(|e| err("nginx", e))?;
    let pid = child.id();
    rig.children.push(child);
    // Ready when *this* nginx answers: the port was free when chosen, but another
    // program on the machine could have taken it since, so ask for a file only this
    // run wrote.
    let token = format!("ictus-{}-{port}", std::process::id());
    let sentinel = format!("{token}.txt");
    fs::write(root.join(&sentinel), &token).map_err(|e| err("nginx sentinel", e))?;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let ok = TcpStream::connect(("127.0.0.1", port)).is_ok()
            && http_get(port, &sentinel, None, Duration::from_secs(2))
                .is_ok_and(|g| g.status == 200 && g.marks.last().is_some_and(|m| m.1 == token.len() as u64));
        if ok {
            let _ = fs::remove_file(root.join(&sentinel));
            return Ok(pid);
        }
        if Instant::now() > end {
            let _ = fs::remove_file(root.join(&sentinel));
            return Err(err("nginx", format!("port {port} does not answer as the nginx this run started")));
        }
        nap(Duration::from_millis(20))?;
    }
}

fn free_port() -> Result<u16, BenchError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| err("port", e))?;
    Ok(l.local_addr().map_err(|e| err("port", e))?.port())
}

/// `k` background readers (one fio process) on `dev` from `offset`, for `secs`.
/// Background readers: `k` fio jobs reading `span` bytes of the device from `offset`
/// for `secs`, at I/O priority `prio` (class, level) if given.
#[derive(Clone, Copy, Debug)]
struct Bg {
    k: usize,
    offset: u64,
    span: u64,
    secs: f64,
    prio: Option<(u8, u8)>,
}

fn start_fio(rig: &mut Rig, dev: &str, bg: &Bg, out: &Path) -> Result<Option<usize>, BenchError> {
    let Bg { k, offset, span, secs, prio } = *bg;
    if k == 0 {
        return Ok(None);
    }
    // The priority is the process's (ionice), which BFQ schedules by; fio's own
    // `prioclass` is a per-I/O priority, which BFQ ignores.
    let mut cmd = match prio {
        Some((c, l)) => {
            let mut c2 = Command::new("ionice");
            c2.arg(format!("-c{c}")).arg(format!("-n{l}")).arg("fio");
            c2
        }
        None => Command::new("fio"),
    };
    cmd.args([
        "--name=bg",
        "--rw=read",
        "--bs=128k",
        "--ioengine=libaio",
        "--iodepth=8",
        "--direct=1",
        "--time_based",
        "--group_reporting",
        "--output-format=json",
    ])
    .arg(format!("--filename={dev}"))
    .arg(format!("--numjobs={k}"))
    .arg(format!("--offset={offset}"))
    .arg(format!("--size={}", span / k as u64))
    .arg(format!("--offset_increment={}", span / k as u64))
    .arg(format!("--runtime={:.1}", secs))
    .arg(format!("--output={}", out.display()));
    let child =
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().map_err(|e| err("fio", e))?;
    rig.children.push(child);
    Ok(Some(rig.children.len() - 1))
}

fn wait_child(rig: &mut Rig, idx: Option<usize>, limit: Duration) -> Result<(), BenchError> {
    let Some(i) = idx else { return Ok(()) };
    let end = Instant::now() + limit;
    loop {
        check_stop()?;
        match rig.children[i].try_wait() {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = rig.children[i].kill();
                let _ = rig.children[i].wait();
                return Ok(());
            }
        }
    }
}

fn fio_bw(out: &Path) -> f64 {
    let Ok(text) = fs::read_to_string(out) else { return 0.0 };
    // fio may print notes before the JSON.
    let Some(start) = text.find('{') else { return 0.0 };
    let Ok(v) = serde_json::from_str::<Value>(&text[start..]) else { return 0.0 };
    v["jobs"].as_array().map_or(0.0, |jobs| jobs.iter().map(|j| j["read"]["bw_bytes"].as_f64().unwrap_or(0.0)).sum())
}

/// CPU nanoseconds a thread or process has run (`schedstat`).
fn cpu_ns(path: &str) -> u64 {
    fs::read_to_string(path).ok().and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok())).unwrap_or(0)
}

/// CPU ns of this process's engine threads (`ictus-mars` and io_uring workers).
fn engine_cpu_ns() -> u64 {
    let mut total = 0;
    if let Ok(rd) = fs::read_dir("/proc/self/task") {
        for t in rd.flatten() {
            let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() == "ictus-mars" || comm.starts_with("iou-wrk") {
                total += cpu_ns(&t.path().join("schedstat").to_string_lossy());
            }
        }
    }
    total
}

fn thread_cpu_ns() -> u64 {
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    cpu_ns(&format!("/proc/self/task/{tid}/schedstat"))
}

/// The classic splice loop: file → pipe → socket, for one connection.
fn splice_server(listener: TcpListener, file: PathBuf, len: u64) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return 0 };
        // Read the whole request head: closing with part of it unread would reset the
        // connection.
        let mut req = Vec::new();
        let mut b = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 65536 {
            match s.read(&mut b) {
                Ok(0) | Err(_) => return 0,
                Ok(n) => req.extend_from_slice(&b[..n]),
            }
        }
        let cpu0 = thread_cpu_ns();
        let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
        let Ok(f) = File::open(&file) else { return 0 };
        let Ok((pr, pw)) = rustix::pipe::pipe() else { return 0 };
        let _ = rustix::pipe::fcntl_setpipe_size(&pw, 1 << 20);
        let mut off = 0u64;
        while off < len {
            let want = (1usize << 20).min((len - off) as usize);
            let Ok(n) = rustix::pipe::splice(&f, Some(&mut off), &pw, None, want, rustix::pipe::SpliceFlags::MORE)
            else {
                break;
            };
            if n == 0 {
                break;
            }
            let mut left = n;
            while left > 0 {
                match rustix::pipe::splice(&pr, None, &s, None, left, rustix::pipe::SpliceFlags::MORE) {
                    Ok(0) | Err(_) => return thread_cpu_ns() - cpu0,
                    Ok(m) => left -= m,
                }
            }
        }
        thread_cpu_ns() - cpu0
    })
}

fn write_file(path: &Path, len: usize, seed: u64) -> Result<(), BenchError> {
    let mut f = File::create(path).map_err(|e| err("writing the clip", e))?;
    let mut x = seed | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let n = left.min(buf.len());
        f.write_all(&buf[..n]).map_err(|e| err("writing the clip", e))?;
        left -= n;
    }
    f.sync_all().map_err(|e| err("writing the clip", e))
}

/// Plain read/send: pread 256 KiB at a time through the stripe map (page cache), send.
fn read_send(comps: &[PathBuf], name: &str, bytes: u64) -> Result<f64, BenchError> {
    let v = Volume::open(comps).map_err(|e| err("volume", e))?;
    let s = v.label.find(name).cloned().ok_or_else(|| err("volume", "no clip"))?;
    let files: Vec<File> = comps.iter().map(File::open).collect::<Result<_, _>>().map_err(|e| err("open", e))?;
    for c in comps {
        drop_cache(&c.to_string_lossy());
    }
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| err("sink", e))?;
    let addr = l.local_addr().map_err(|e| err("sink", e))?;
    let sink = std::thread::spawn(move || {
        let mut n = 0u64;
        if let Ok((mut c, _)) = l.accept() {
            let mut b = vec![0u8; 1 << 20];
            while let Ok(k) = c.read(&mut b) {
                if k == 0 {
                    break;
                }
                n += k as u64;
            }
        }
        n
    });
    let mut sock = TcpStream::connect(addr).map_err(|e| err("sink", e))?;
    let t0 = Instant::now();
    let mut buf = vec![0u8; 256 << 10];
    let total = bytes.min(s.len);
    let mut done = 0;
    while done < total {
        check_stop()?;
        let n = (buf.len() as u64).min(total - done);
        for p in v.geometry().map(s.start + done, n) {
            files[usize::from(p.component)]
                .read_exact_at(&mut buf[p.at as usize..(p.at + p.len) as usize], p.offset)
                .map_err(|e| err("pread", e))?;
        }
        sock.write_all(&buf[..n as usize]).map_err(|e| err("send", e))?;
        done += n;
    }
    drop(sock);
    let got = sink.join().unwrap_or(0);
    let secs = t0.elapsed().as_secs_f64();
    if got != total {
        return Err(err("read/send", format!("sink got {got} of {total} bytes")));
    }
    Ok(total as f64 / secs)
}

/// Runs the experiment.
pub fn run(opts: &MarsBenchOptions) -> Result<Report, BenchError> {
    stop_flag().store(false, Ordering::Relaxed);
    let mut sig_ids = Vec::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        if let Ok(id) = signal_hook::flag::register(sig, Arc::clone(stop_flag())) {
            sig_ids.push(id);
        }
    }
    let result = run_inner(opts);
    for id in sig_ids {
        signal_hook::low_level::unregister(id);
    }
    result
}

fn run_inner(opts: &MarsBenchOptions) -> Result<Report, BenchError> {
    let conditions = Conditions::capture_before();
    crate::cli::raise_nofile();
    let base = std::env::var_os("ICTUS_MARS_BENCH_DIR").map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    sweep_stale(&base);
    let dir = base.join(format!("{PREFIX}{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| err("bench dir", e))?;
    let mut notes = Vec::new();
    let mut rows = Vec::new();
    let mut headlines = Vec::new();
    let mut figures = Vec::new();
    let quick = opts.quick;

    // ---- the slow disks: Tables 1 and 2 ----
    let rate: u64 = 40 << 20; // bytes/s per disk
    let clip_len: u64 = if quick { 96 << 20 } else { 320 << 20 };
    let disk_size: u64 = clip_len * 2 + (256 << 20);
    // ICTUS_MARS_BENCH_ONLY=http runs only the HTTP comparison (no root needed).
    let only_http = std::env::var("ICTUS_MARS_BENCH_ONLY").is_ok_and(|v| v == "http");
    let slow =
        if only_http { Err("ICTUS_MARS_BENCH_ONLY=http".to_string()) } else { make_slow_rig(&dir, 4, disk_size, rate) };
    let mut rig_guard: Option<SlowRig> = None;
    match slow {
        Err(why) => notes.push(format!(
            "Tables 1 and 2 skipped: could not make a slow disk here ({why}); the HTTP comparison ran on plain files"
        )),
        Ok(s) => {
            rig_guard = Some(s);
        }
    }
    if let Some(slow) = rig_guard.as_mut() {
        let r = slow_tables(slow, &dir, clip_len, quick, &mut rows, &mut headlines, &mut figures, &mut notes);
        if let Err(e) = r {
            if stopped() {
                return Err(e);
            }
            notes.push(format!("Tables 1 and 2 stopped: {e}"));
        }
    }
    drop(rig_guard);
    check_stop()?;

    // ---- HTTP throughput and CPU per GB, unthrottled ----
    let mut rig = Rig::new(dir.join("http"));
    fs::create_dir_all(&rig.dir).map_err(|e| err("http dir", e))?;
    let http_dir = rig.dir.clone();
    if let Err(e) = http_section(&mut rig, &http_dir, quick, &mut rows, &mut headlines, &mut notes) {
        if stopped() {
            return Err(e);
        }
        notes.push(format!("HTTP comparison stopped: {e}"));
    }
    drop(rig);
    let _ = fs::remove_dir_all(&dir);

    let conditions = conditions.finish();
    let mut report = Report::new(EXPERIMENT, PAPER, quick, conditions);
    report.rows = rows;
    report.headline = headlines;
    report.paper_figures = figures;
    report.notes = notes;
    if let Some(path) = &opts.json {
        report.write_json(path).map_err(|e| BenchError::io("writing the JSON", e))?;
    }
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn slow_tables(
    slow: &mut SlowRig,
    dir: &Path,
    clip_len: u64,
    quick: bool,
    rows: &mut Vec<Value>,
    headlines: &mut Vec<Headline>,
    figures: &mut Vec<PaperFigure>,
    notes: &mut Vec<String>,
) -> Result<(), BenchError> {
    let d = slow.disks.clone();
    let rate = slow.rate as f64;
    notes.push(format!(
        "slow disk: loop device (scheduler) over a loop device throttled to {:.0} MB/s by cgroup-v1 blkio.throttle.read_bps_device, one cgroup holding the experiment and every peer; 4 such disks",
        rate / 1e6
    ));
    let clip = dir.join("clip.bin");
    write_file(&clip, clip_len as usize, 19)?;
    // Volumes: single on disk 0, striped on disks 1+2; nginx's ext4 on disk 3.
    let single = vec![PathBuf::from(&d[0].upper)];
    let striped = vec![PathBuf::from(&d[1].upper), PathBuf::from(&d[2].upper)];
    for comps in [&single, &striped] {
        let mut v = Volume::create(comps, 64 << 10, None).map_err(|e| err("volume", e))?;
        v.add_file("clip.bin", &clip, 4.0).map_err(|e| err("volume add", e))?;
        if comps == &single {
            // What the background downloads of Table 2's DRR condition read.
            v.add_file("bg.bin", &clip, 4.0).map_err(|e| err("volume add", e))?;
        }
    }
    run_cmd(
        Command::new("mkfs.ext4").args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]).arg(&d[3].upper),
    )?;
    let mnt = dir.join("www");
    fs::create_dir_all(&mnt).map_err(|e| err("mount point", e))?;
    run_cmd(Command::new("mount").arg(&d[3].upper).arg(&mnt))?;
    slow.rig.mounts.push(mnt.clone());
    fs::copy(&clip, mnt.join("clip.bin")).map_err(|e| err("copy to ext4", e))?;
    run_cmd(&mut Command::new("sync"))?;

    // ---- Table 1 ----
    let t1_bytes: u64 = if quick { 48 << 20 } else { 256 << 20 };
    let rounds = if quick { 1 } else { 3 };
    let mut t1: Vec<(&str, &str, Vec<f64>)> = vec![
        ("read/send", "single", vec![]),
        ("stream read/send", "single", vec![]),
        ("read/send", "striped", vec![]),
        ("stream read/send", "striped", vec![]),
    ];
    for _ in 0..rounds {
        for (method, layout, runs) in t1.iter_mut() {
            check_stop()?;
            let comps = if *layout == "single" { &single } else { &striped };
            let r = if *method == "read/send" {
                read_send(comps, "clip.bin", t1_bytes)?
            } else {
                let server = crate::start(&StartOptions {
                    volume: comps.clone(),
                    listen: Some("127.0.0.1:0".into()),
                    capability: Some(rate),
                    engine: EngineConfig { device_depth: 8, window: 8, ..EngineConfig::default() },
                    force_fallback: false,
                })
                .map_err(|e| err("server", e))?;
                let port = server.addr.map_or(0, |a| a.port());
                let got = http_get(port, "clip.bin", Some(t1_bytes), Duration::from_secs(600))?;
                server.stop();
                got.bytes as f64 / got.elapsed.as_secs_f64()
            };
            runs.push(r);
        }
    }
    let med = |v: &[f64]| ictus_bench::stats::median(v.iter().copied()).unwrap_or(0.0);
    for (method, layout, runs) in &t1 {
        rows.push(json!({
            "case": format!("Table 1: {method}, {layout}"),
            "table": 1, "method": method, "layout": layout,
            "mb_s": med(runs) / 1e6, "min_mb_s": runs.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
            "max_mb_s": runs.iter().copied().fold(0.0, f64::max) / 1e6, "runs": runs.len(),
        }));
    }
    let stream_single = med(&t1[1].2);
    let stream_striped = med(&t1[3].2);
    headlines.push(
        Headline::new(
            "mars_striped_vs_single",
            stream_striped / 1e6,
            stream_single / 1e6,
            "stream read/send on one disk",
            "MB/s",
            Better::Higher,
        )
        .with_target(1.6),
    );
    figures.push(
        PaperFigure::new(
            "stream read/send, striped over 2 disks",
            "17.65 MB/s (+60 % over one disk)",
            Some(17.65),
            "MB/s",
            Better::Higher,
        )
        .ours(
            Some(stream_striped / 1e6),
            format!("{:.1} MB/s ({:.2}× one disk)", stream_striped / 1e6, stream_striped / stream_single.max(1.0)),
        ),
    );
    figures.push(
        PaperFigure::new("read/send, one disk", "10.90 MB/s", Some(10.9), "MB/s", Better::Higher)
            .ours(Some(med(&t1[0].2) / 1e6), format!("{:.1} MB/s", med(&t1[0].2) / 1e6)),
    );

    // ---- Table 2 ----
    let stream_rate = rate * 0.4;
    let secs: f64 = if quick { 4.0 } else { 10.0 };
    let window_bytes = (stream_rate * secs) as u64;
    let ks: Vec<usize> = if quick { vec![0, 4] } else { vec![0, 1, 2, 3, 4] };
    let t2_rounds = if quick { 1 } else { 3 };
    let chunk: u64 = 256 << 10;
    let bg_offset = clip_len + (64 << 20);
    let bg_span = disk_size_of(&d[0].upper).saturating_sub(bg_offset).max(64 << 20);
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Who {
        Ours,
        OursDrr,
        NginxDeadline,
        NginxBfqRt,
    }
    let name = |w: Who| match w {
        Who::Ours => "ictus mars (DRR, paced, BFQ; background at best-effort 7)",
        Who::OursDrr => "ictus mars, background as downloads through its DRR (the paper's NRT queue)",
        Who::NginxDeadline => "nginx sendfile, mq-deadline",
        Who::NginxBfqRt => "nginx sendfile, BFQ + ionice -c1",
    };
    /// What one (implementation, background readers) condition gave over its runs.
    struct Acc {
        who: Who,
        k: usize,
        held: u32,
        runs: u32,
        late: u64,
        slots: u64,
        worst: u64,
        bg: Vec<f64>,
        lateness: Vec<u64>,
        achieved: Vec<f64>,
    }
    let mut acc: Vec<Acc> = Vec::new();
    for &k in &ks {
        for round in 0..t2_rounds {
            let mut order = [Who::Ours, Who::NginxDeadline, Who::OursDrr, Who::NginxBfqRt];
            order.rotate_left(round % 4);
            for who in order {
                check_stop()?;
                let (dev, sched) = match who {
                    Who::Ours => (&d[0].upper, "bfq"),
                    Who::OursDrr => (&d[0].upper, "mq-deadline"),
                    Who::NginxDeadline => (&d[3].upper, "mq-deadline"),
                    Who::NginxBfqRt => (&d[3].upper, "bfq"),
                };
                set_scheduler(dev, sched)?;
                drop_cache(dev);
                let fio_out = dir.join(format!("fio-{k}-{round}-{who:?}.json"));
                let bg_prio = if who == Who::Ours { Some((2, 7)) } else { None };
                let nginx_dev_offset = if who == Who::Ours { bg_offset } else { disk_size_of(dev) / 2 };
                let span = if who == Who::Ours { bg_span } else { disk_size_of(dev) / 2 - (16 << 20) };
                // The stream, then the background started at once beside it.
                let (received, server) = match who {
                    Who::Ours => {
                        let server = crate::start(&StartOptions {
                            volume: single.clone(),
                            listen: Some("127.0.0.1:0".into()),
                            capability: Some(rate),
                            // Read-ahead deep enough to keep its share of a queue that
                            // others fill too (the paper's mmbuf chains), and the
                            // engine's reads at best-effort 0.
                            engine: EngineConfig {
                                ioprio: Some((2, 0)),
                                device_depth: 16,
                                window: 16,
                                ..EngineConfig::default()
                            },
                            force_fallback: false,
                        })
                        .map_err(|e| err("server", e))?;
                        let port = server.addr.map_or(0, |a| a.port());
                        let fio = start_fio(
                            &mut slow.rig,
                            dev,
                            &Bg { k, offset: nginx_dev_offset, span, secs: secs + 1.0, prio: bg_prio },
                            &fio_out,
                        )?;
                        let got = http_get(
                            port,
                            &format!("clip.bin?rate={}", stream_rate as u64),
                            Some(window_bytes),
                            Duration::from_secs_f64(secs * 3.0),
                        )?;
                        wait_child(&mut slow.rig, fio, Duration::from_secs_f64(secs + 30.0))?;
                        (got, Some(server))
                    }
                    Who::OursDrr => {
                        // The background readers are clients of the server: full-speed
                        // downloads of another stream, queued by DRR in the non-real-time
                        // class, as 001 §5.2's background read()s went to the NRTQ.
                        let server = crate::start(&StartOptions {
                            volume: single.clone(),
                            listen: Some("127.0.0.1:0".into()),
                            capability: Some(rate),
                            engine: EngineConfig::default(),
                            force_fallback: false,
                        })
                        .map_err(|e| err("server", e))?;
                        let port = server.addr.map_or(0, |a| a.port());
                        let dur = Duration::from_secs_f64(secs);
                        let downloads: Vec<_> = (0..k)
                            .map(|_| std::thread::spawn(move || http_get(port, "bg.bin", None, dur).map(|g| g.bytes)))
                            .collect();
                        let got = http_get(
                            port,
                            &format!("clip.bin?rate={}", stream_rate as u64),
                            Some(window_bytes),
                            Duration::from_secs_f64(secs * 3.0),
                        )?;
                        let mut bg_bytes = 0u64;
                        for d in downloads {
                            bg_bytes += d.join().map_err(|_| err("download", "panicked"))??;
                        }
                        fs::write(
                            &fio_out,
                            format!("{{\"jobs\":[{{\"read\":{{\"bw_bytes\":{}}}}}]}}", bg_bytes as f64 / secs),
                        )
                        .map_err(|e| err("bg result", e))?;
                        (got, Some(server))
                    }
                    _ => {
                        // nginx reads the file through the page cache: empty it first.
                        if let Ok(f) = File::open(mnt.join("clip.bin")) {
                            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
                        }
                        let port = free_port()?;
                        let before = slow.rig.children.len();
                        start_nginx(&mut slow.rig, dir, &mnt, port, who == Who::NginxBfqRt)?;
                        let fio = start_fio(
                            &mut slow.rig,
                            dev,
                            &Bg { k, offset: nginx_dev_offset, span, secs: secs + 1.0, prio: bg_prio },
                            &fio_out,
                        )?;
                        let got = http_get_paced(
                            port,
                            "clip.bin",
                            stream_rate,
                            window_bytes,
                            Duration::from_secs_f64(secs * 3.0),
                        )?;
                        wait_child(&mut slow.rig, fio, Duration::from_secs_f64(secs + 30.0))?;
                        // Stop this nginx (ours, by pid) and forget the finished children.
                        let mut mine: Vec<Child> = slow.rig.children.drain(before..).collect();
                        for c in &mut mine {
                            let _ = c.kill();
                            let _ = c.wait();
                        }
                        (got, None)
                    }
                };
                drop(server);
                let bg = fio_bw(&fio_out);
                let (n, late, worst, samples) = slots(&received, stream_rate, chunk, window_bytes);
                let achieved = received.bytes.min(window_bytes) as f64
                    / (received
                        .marks
                        .iter()
                        .find(|m| m.1 >= window_bytes)
                        .map_or(received.elapsed.as_secs_f64(), |m| m.0 as f64 / 1e9))
                    .max(1e-9);
                let held =
                    received.status / 100 == 2 && received.bytes >= window_bytes && late as f64 <= 0.01 * n as f64;
                let e = match acc.iter_mut().position(|a| a.who == who && a.k == k) {
                    Some(i) => &mut acc[i],
                    None => {
                        acc.push(Acc {
                            who,
                            k,
                            held: 0,
                            runs: 0,
                            late: 0,
                            slots: 0,
                            worst: 0,
                            bg: vec![],
                            lateness: vec![],
                            achieved: vec![],
                        });
                        acc.last_mut().expect("just pushed")
                    }
                };
                e.held += u32::from(held);
                e.runs += 1;
                e.late += late;
                e.slots += n;
                e.worst = e.worst.max(worst);
                e.bg.push(bg);
                e.lateness.extend(samples);
                e.achieved.push(achieved);
            }
        }
    }
    for Acc { who, k, held, runs, late, slots: n, worst, bg, lateness: lat, achieved } in &acc {
        let mut rec = LatencyRecorder::new();
        rec.record_all(lat);
        rows.push(
            rec.row(format!("Table 2: {}, {k} background", name(*who)))
                .with("table", 2)
                .with("implementation", name(*who))
                .with("background_readers", *k as u64)
                .with("stream_mb_s_target", stream_rate / 1e6)
                .with("stream_mb_s", med(achieved) / 1e6)
                .with("held_runs", u64::from(*held))
                .with("runs", u64::from(*runs))
                .with("late_slots", *late)
                .with("slots", *n)
                .with("max_lateness_ns", *worst)
                .with("background_mb_s", med(bg) / 1e6)
                .to_value(),
        );
    }
    let find = |w: Who, k: usize| acc.iter().find(|a| a.who == w && a.k == k);
    let kmax = *ks.last().unwrap_or(&0);
    let held_frac = |w: Who| find(w, kmax).map_or(0.0, |a| f64::from(a.held) / f64::from(a.runs.max(1)));
    let mut h = Headline::new(
        "mars_rt_held_4bg",
        held_frac(Who::Ours),
        held_frac(Who::NginxDeadline),
        "nginx sendfile with mq-deadline: fraction of runs holding the rate",
        "fraction of runs",
        Better::Higher,
    );
    h.target = Some(1.0);
    h.met = Some(held_frac(Who::Ours) >= 1.0);
    headlines.push(h);
    let bg_of = |w: Who| find(w, kmax).map_or(0.0, |a| med(&a.bg));
    headlines.push(
        Headline::new(
            "mars_bg_vs_bfq",
            bg_of(Who::Ours) / 1e6,
            bg_of(Who::NginxBfqRt) / 1e6,
            "background throughput left by nginx with BFQ + ionice -c1",
            "MB/s",
            Better::Higher,
        )
        .with_target(2.0),
    );
    figures.push(
        PaperFigure::new(
            format!("real-time stream under {kmax} background readers"),
            "stream time ≈ 21–22 s with or without load (normal read/send: 21 s → 567 s)",
            None,
            "",
            Better::Higher,
        )
        .ours(
            None,
            format!(
                "ours held {}/{} runs ({} late slots), nginx+mq-deadline {}/{} , nginx+BFQ+RT {}/{}",
                find(Who::Ours, kmax).map_or(0, |a| a.held),
                find(Who::Ours, kmax).map_or(0, |a| a.runs),
                find(Who::Ours, kmax).map_or(0, |a| a.late),
                find(Who::NginxDeadline, kmax).map_or(0, |a| a.held),
                find(Who::NginxDeadline, kmax).map_or(0, |a| a.runs),
                find(Who::NginxBfqRt, kmax).map_or(0, |a| a.held),
                find(Who::NginxBfqRt, kmax).map_or(0, |a| a.runs),
            ),
        ),
    );
    notes.push(format!(
        "Table 2: stream {:.1} MB/s ({} KiB slots) for {secs} s on a {:.0} MB/s disk; background: fio, one job per reader, sequential 128 KiB O_DIRECT reads, libaio depth 8, from beyond the clip on the same disk; a run holds the rate if the stream delivered its window with at most 1 % of slots late (a slot is late if its last byte arrived more than one period after its due time); nginx's client reads at the stream rate (a player's paced pull), ours is paced by the server",
        stream_rate / 1e6,
        chunk >> 10,
        rate / 1e6
    ));

    // ---- Table 3: three upcall-paced streams ----
    check_stop()?;
    let server = crate::start(&StartOptions {
        volume: striped.clone(),
        listen: Some("127.0.0.1:0".into()),
        capability: Some(rate * 2.0),
        engine: EngineConfig::default(),
        force_fallback: false,
    })
    .map_err(|e| err("server", e))?;
    let port = server.addr.map_or(0, |a| a.port());
    let t3_secs = if quick { 3.0 } else { 20.0 };
    let handles: Vec<_> = [60u64, 75, 120]
        .iter()
        .map(|&p| {
            let r = chunk as f64 / (p as f64 / 1000.0);
            let bytes = (r * t3_secs) as u64;
            std::thread::spawn(move || {
                (
                    p,
                    r,
                    http_get(
                        port,
                        &format!("clip.bin?rate={}", r as u64),
                        Some(bytes),
                        Duration::from_secs_f64(t3_secs * 3.0),
                    )
                    .map(|g| slots(&g, r, chunk, bytes)),
                )
            })
        })
        .collect();
    let mut t3_late = 0;
    for h in handles {
        let (p, r, res) = h.join().map_err(|_| err("table 3", "a client panicked"))?;
        let (n, late, worst, samples) = res?;
        t3_late += late;
        let mut rec = LatencyRecorder::new();
        rec.record_all(&samples);
        rows.push(
            rec.row(format!("Table 3: stream paced by a {p} ms upcall"))
                .with("table", 3)
                .with("period_ms", p)
                .with("rate_mb_s", r / 1e6)
                .with("slots", n)
                .with("late_slots", late)
                .with("max_lateness_ns", worst)
                .to_value(),
        );
    }
    server.stop();
    figures.push(
        PaperFigure::new(
            "deadline misses, streams paced by 60/75/120 ms upcalls",
            "none missed",
            Some(0.0),
            "late slots",
            Better::Lower,
        )
        .ours(Some(t3_late as f64), format!("{t3_late} late slots (client-side, over {t3_secs} s)")),
    );
    Ok(())
}

fn disk_size_of(dev: &str) -> u64 {
    File::open(dev).and_then(|mut f| io::Seek::seek(&mut f, io::SeekFrom::End(0))).unwrap_or(0)
}

/// A player's paced pull: reads at most `rate` bytes/s (a token bucket), so a server
/// that does not pace is paced by TCP's flow control.
fn http_get_paced(port: u16, path: &str, rate: f64, window: u64, deadline: Duration) -> Result<Received, BenchError> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| err("connect", e))?;
    s.set_read_timeout(Some(Duration::from_millis(100))).map_err(|e| err("socket", e))?;
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| err("send", e))?;
    let t0 = Instant::now();
    let mut buf = vec![0u8; 64 << 10];
    let mut head = Vec::new();
    let (mut status, mut body, mut in_body) = (0u16, 0u64, false);
    let mut marks = Vec::new();
    while body < window && t0.elapsed() < deadline {
        check_stop()?;
        // Allowed so far: one slot ahead of the rate.
        let allowed = (t0.elapsed().as_secs_f64() * rate) as u64 + (256 << 10);
        if in_body && body >= allowed {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let want = if in_body { ((allowed - body) as usize).min(buf.len()) } else { buf.len() };
        let n = match s.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(err("recv", e)),
        };
        let mut data = &buf[..n];
        if !in_body {
            head.extend_from_slice(data);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            status = String::from_utf8_lossy(&head[..end])
                .split_whitespace()
                .nth(1)
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            let extra = head.len() - (end + 4);
            data = &buf[n - extra..n];
            in_body = true;
        }
        body += data.len() as u64;
        marks.push((t0.elapsed().as_nanos() as u64, body));
    }
    Ok(Received { status, bytes: body, marks, elapsed: t0.elapsed() })
}

/// A failed download in the HTTP comparison is noted (with whose it was) and the run goes
/// on; an interruption still stops it.
fn noted<T>(notes: &mut Vec<String>, who: &str, r: Result<T, BenchError>) -> Result<Option<T>, BenchError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if stopped() => Err(e),
        Err(e) => {
            notes.push(format!("HTTP: a {who} download failed: {e}"));
            Ok(None)
        }
    }
}

fn http_section(
    rig: &mut Rig,
    dir: &Path,
    quick: bool,
    rows: &mut Vec<Value>,
    headlines: &mut Vec<Headline>,
    notes: &mut Vec<String>,
) -> Result<(), BenchError> {
    let len: u64 = if quick { 256 << 20 } else { 1 << 30 };
    let rounds = if quick { 2 } else { 5 };
    let clip = dir.join("clip.bin");
    write_file(&clip, len as usize, 23)?;
    let comp = dir.join("vol.img");
    {
        let mut v = Volume::create(std::slice::from_ref(&comp), 1 << 20, Some(len + (64 << 20)))
            .map_err(|e| err("volume", e))?;
        v.add_file("clip.bin", &clip, 4.0).map_err(|e| err("volume add", e))?;
    }
    let have_nginx = Command::new("nginx").arg("-v").stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    let server = crate::start(&StartOptions {
        volume: vec![comp.clone()],
        listen: Some("127.0.0.1:0".into()),
        capability: Some(1e9),
        engine: EngineConfig { device_depth: 8, window: 8, buf_size: 1 << 20, buffers: 64, ..EngineConfig::default() },
        force_fallback: false,
    })
    .map_err(|e| err("server", e))?;
    let ours_port = server.addr.map_or(0, |a| a.port());
    let nginx = if have_nginx {
        let port = free_port()?;
        start_nginx(rig, dir, dir, port, false).ok().map(|pid| (port, pid))
    } else {
        notes.push("nginx is not installed (scripts/setup.sh installs nginx-light): the nginx rows are missing".into());
        None
    };
    // (name, MB/s runs, CPU s/GB runs)
    let mut res: Vec<(&str, Vec<f64>, Vec<f64>)> =
        vec![("ictus mars", vec![], vec![]), ("nginx sendfile", vec![], vec![]), ("splice loop", vec![], vec![])];
    // Warm the page cache for nginx and splice (they serve from it; ours reads O_DIRECT).
    let _ = fs::read(&clip);
    for round in 0..rounds {
        let mut order = [0usize, 1, 2];
        order.rotate_left(round % 3);
        for i in order {
            check_stop()?;
            let (bytes, secs, cpu) = match i {
                0 => {
                    let c0 = engine_cpu_ns();
                    let Some(g) =
                        noted(notes, "ictus mars", http_get(ours_port, "clip.bin", None, Duration::from_secs(300)))?
                    else {
                        continue;
                    };
                    (g.bytes, g.elapsed.as_secs_f64(), engine_cpu_ns() - c0)
                }
                1 => {
                    let Some((port, pid)) = nginx else { continue };
                    let path = format!("/proc/{pid}/schedstat");
                    let c0 = cpu_ns(&path);
                    let Some(g) = noted(notes, "nginx", http_get(port, "clip.bin", None, Duration::from_secs(300)))?
                    else {
                        continue;
                    };
                    (g.bytes, g.elapsed.as_secs_f64(), cpu_ns(&path) - c0)
                }
                _ => {
                    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| err("splice", e))?;
                    let port = l.local_addr().map_err(|e| err("splice", e))?.port();
                    let t = splice_server(l, clip.clone(), len);
                    let Some(g) =
                        noted(notes, "splice loop", http_get(port, "clip.bin", None, Duration::from_secs(300)))?
                    else {
                        let _ = t.join();
                        continue;
                    };
                    let cpu = t.join().unwrap_or(0);
                    (g.bytes, g.elapsed.as_secs_f64(), cpu)
                }
            };
            if bytes != len {
                notes.push(format!("{}: got {bytes} of {len} bytes in one run", res[i].0));
                continue;
            }
            res[i].1.push(bytes as f64 / secs);
            res[i].2.push(cpu as f64 / 1e9 / (bytes as f64 / 1e9));
        }
    }
    server.stop();
    let med = |v: &[f64]| ictus_bench::stats::median(v.iter().copied()).unwrap_or(f64::NAN);
    for (name, mbs, cpu) in &res {
        if mbs.is_empty() {
            continue;
        }
        rows.push(json!({
            "case": format!("HTTP: {name}"), "table": "http", "implementation": name,
            "mb_s": med(mbs) / 1e6, "min_mb_s": mbs.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
            "max_mb_s": mbs.iter().copied().fold(0.0, f64::max) / 1e6, "cpu_s_per_gb": med(cpu), "runs": mbs.len(),
        }));
    }
    if !res[1].1.is_empty() {
        headlines.push(
            Headline::new(
                "mars_http_vs_nginx",
                med(&res[0].1) / 1e6,
                med(&res[1].1) / 1e6,
                "nginx 1.22 sendfile on",
                "MB/s",
                Better::Higher,
            )
            .with_target(1.0),
        );
    }
    headlines.push(
        Headline::new(
            "mars_cpu_per_gb_vs_splice",
            med(&res[0].2),
            med(&res[2].2),
            "a splice(2) loop file → pipe → socket",
            "CPU s/GB",
            Better::Lower,
        )
        .with_target(1.0),
    );
    notes.push(format!(
        "HTTP: one {} MiB download at a time over loopback, {rounds} rounds rotating the order; ours reads O_DIRECT from a volume file on the VM's disk (the host may cache it), nginx and the splice loop send from the page cache (warmed); sender CPU = schedstat of the sending threads (our engine thread and io_uring workers; nginx's one process; the splice thread); over loopback the kernel copies even zero-copy sends at delivery",
        len >> 20
    ));
    Ok(())
}
