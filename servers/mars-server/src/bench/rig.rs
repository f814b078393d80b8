//! What the experiment builds and starts, and takes down again: the slow disks (loop
//! devices and a cgroup-v1 blkio throttle), nginx's ext4 mount, files, nginx and fio.
//!
//! Everything made is recorded in a [`Rig`] the moment it exists and undone in reverse
//! when the rig is dropped — at the end, on an error, or after SIGINT/SIGTERM/SIGHUP
//! (which stop the run at its next [`check_stop`]). A run also sweeps what an earlier
//! run that was killed left: its name carries its pid, and a pid that is no longer
//! alive marks its leftovers ([`sweep_stale`]).

use std::fs::{self, File};
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_bench::BenchError;
use serde_json::Value;

/// A bench error with a context.
pub fn err(context: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::io(context, io::Error::other(e.to_string()))
}

/// Set by SIGINT, SIGTERM or SIGHUP: the run stops at its next check and tears down.
pub fn stop_flag() -> &'static Arc<AtomicBool> {
    static F: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    F.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// SIGINT, SIGTERM and SIGHUP set [`stop_flag`] (cleared here) while this lives, so an
/// interrupted run still tears its rig down; the handlers go with it.
#[derive(Debug)]
pub struct StopOnSignals(Vec<signal_hook::SigId>);

impl StopOnSignals {
    /// Clears the flag and registers the handlers.
    pub fn register() -> Self {
        stop_flag().store(false, Ordering::Relaxed);
        let ids = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP]
            .into_iter()
            .filter_map(|sig| signal_hook::flag::register(sig, Arc::clone(stop_flag())).ok())
            .collect();
        StopOnSignals(ids)
    }
}

impl Drop for StopOnSignals {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Whether the run was interrupted.
pub fn stopped() -> bool {
    stop_flag().load(Ordering::Relaxed)
}

/// An error if the run was interrupted.
pub fn check_stop() -> Result<(), BenchError> {
    if stopped() {
        return Err(err("mars", "interrupted"));
    }
    Ok(())
}

/// Sleeps, waking early if interrupted.
pub fn nap(d: Duration) -> Result<(), BenchError> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check_stop()?;
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

/// Runs a command to completion; its standard output, or an error with its standard
/// error.
pub fn run_cmd(cmd: &mut Command) -> Result<String, BenchError> {
    let out = cmd.output().map_err(|e| err(&format!("{cmd:?}"), e))?;
    if !out.status.success() {
        return Err(err(&format!("{cmd:?}"), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether `prog` runs (`prog ARG` exits 0).
pub fn have(prog: &str, arg: &str) -> bool {
    Command::new(prog).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

const BLKIO: &str = "/sys/fs/cgroup/blkio";
/// Every name the experiment gives a file, mount, cgroup or directory starts with this
/// and its pid.
pub const PREFIX: &str = "ictus-mars-bench-";

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Everything the experiment made, torn down in reverse on drop.
#[derive(Debug)]
pub struct Rig {
    /// The run's directory (removed last).
    pub dir: PathBuf,
    loops: Vec<String>,
    mounts: Vec<PathBuf>,
    cgroup: Option<PathBuf>,
    children: Vec<Child>,
}

impl Rig {
    /// A rig whose files live in `dir` (created here, removed on drop).
    pub fn new(dir: PathBuf) -> Result<Rig, BenchError> {
        fs::create_dir_all(&dir).map_err(|e| err(&format!("creating {}", dir.display()), e))?;
        Ok(Rig { dir, loops: Vec::new(), mounts: Vec::new(), cgroup: None, children: Vec::new() })
    }

    /// Records a child process; it is stopped when the rig is dropped, if not before.
    pub fn adopt(&mut self, child: Child) -> ChildId {
        self.children.push(child);
        ChildId(self.children.len() - 1)
    }

    /// The child's pid.
    pub fn pid(&self, id: ChildId) -> u32 {
        self.children[id.0].id()
    }

    /// Waits up to `limit` for the child to exit by itself, then kills it.
    pub fn wait_child(&mut self, id: ChildId, limit: Duration) -> Result<(), BenchError> {
        let end = Instant::now() + limit;
        let c = &mut self.children[id.0];
        loop {
            check_stop()?;
            match c.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return Ok(());
                }
            }
        }
    }

    /// Stops one child now (SIGTERM, then SIGKILL after 2 s) and reaps it; it stays
    /// recorded (stopping it again on drop does nothing).
    pub fn stop_child(&mut self, id: ChildId) {
        stop_children(std::slice::from_mut(&mut self.children[id.0]));
    }

    /// Stops (SIGTERM, then SIGKILL after 2 s) and reaps the children recorded since
    /// `from` ([`Rig::mark`]).
    pub fn stop_since(&mut self, from: usize) {
        let mut mine: Vec<Child> = self.children.drain(from.min(self.children.len())..).collect();
        stop_children(&mut mine);
    }

    /// How many children are recorded (for [`Rig::stop_since`]).
    pub fn mark(&self) -> usize {
        self.children.len()
    }
}

/// A child recorded by [`Rig::adopt`].
#[derive(Clone, Copy, Debug)]
pub struct ChildId(usize);

/// Stops our own children: SIGTERM to each, up to 2 s for all to go, then SIGKILL; reaps
/// them.
pub fn stop_children(children: &mut [Child]) {
    for c in children.iter_mut() {
        // Our own children, by pid, and only while not reaped: a reaped child's pid
        // may be another process's by now.
        if !matches!(c.try_wait(), Ok(None)) {
            continue;
        }
        if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    for c in children.iter_mut() {
        while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        stop_children(&mut self.children);
        self.children.clear();
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
/// mount, its cgroup, its directory under `base`.
pub fn sweep_stale(base: &Path) {
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

/// Names of what this process made and has not removed yet (loop devices over its
/// files, its mounts, its cgroup): empty after a clean teardown. For the checks at the
/// end of a run.
pub fn leftovers() -> Vec<String> {
    let mine = format!("{PREFIX}{}", std::process::id());
    let mut out = Vec::new();
    if let Ok(o) = Command::new("losetup").args(["-n", "-O", "NAME,BACK-FILE", "-l"]).output() {
        out.extend(String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.contains(&mine)).map(str::to_owned));
    }
    if let Ok(m) = fs::read_to_string("/proc/self/mounts") {
        out.extend(m.lines().filter(|l| l.contains(&mine)).map(str::to_owned));
    }
    if Path::new(&format!("{BLKIO}/{mine}")).exists() {
        out.push(format!("{BLKIO}/{mine}"));
    }
    out
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

/// Sets the I/O scheduler of a block device (`bfq`, `mq-deadline`, `none`).
pub fn set_scheduler(dev: &str, sched: &str) -> Result<(), BenchError> {
    let name = dev.trim_start_matches("/dev/");
    fs::write(format!("/sys/block/{name}/queue/scheduler"), sched)
        .map_err(|e| err(&format!("{dev} scheduler {sched}"), e))
}

/// Sets BFQ's `strict_guarantees` on a device whose scheduler is BFQ. Asked of every
/// BFQ condition, on or off: choosing `bfq` again where it already is keeps the
/// instance and its tunables, so one condition's setting would otherwise carry over to
/// the next.
pub fn set_bfq_strict(dev: &str, on: bool) -> Result<(), BenchError> {
    let name = dev.trim_start_matches("/dev/");
    fs::write(format!("/sys/block/{name}/queue/iosched/strict_guarantees"), if on { "1" } else { "0" })
        .map_err(|e| err(&format!("{dev} BFQ strict_guarantees"), e))
}

/// Throttled "disks" (an upper loop device, where the scheduler runs, over a lower
/// loop device over a file, whose reads are throttled) in the rig's cgroup.
#[derive(Debug)]
pub struct SlowDisks {
    /// The upper devices, `/dev/loopN`.
    pub disks: Vec<String>,
    /// The throttled lower device under each.
    pub lower: Vec<String>,
    /// Bytes/s each is throttled to.
    pub rate: u64,
}

/// Makes `n` slow disks of `size` bytes at `rate` bytes/s, and moves this process (so
/// the engine, and every child started later) into the cgroup that throttles them.
pub fn make_slow_disks(rig: &mut Rig, n: usize, size: u64, rate: u64) -> Result<SlowDisks, String> {
    if !rustix::process::geteuid().is_root() {
        return Err("not root: loop devices and blkio throttling need root".into());
    }
    if !Path::new(&format!("{BLKIO}/blkio.throttle.read_bps_device")).exists() {
        return Err(format!("no cgroup-v1 blkio throttle at {BLKIO}"));
    }
    let cg = PathBuf::from(format!("{BLKIO}/{PREFIX}{}", std::process::id()));
    fs::create_dir_all(&cg).map_err(|e| format!("creating {}: {e}", cg.display()))?;
    rig.cgroup = Some(cg.clone());
    let (mut disks, mut lowers) = (Vec::new(), Vec::new());
    for i in 0..n {
        let f = rig.dir.join(format!("disk{i}.img"));
        File::create(&f).and_then(|x| x.set_len(size)).map_err(|e| format!("{}: {e}", f.display()))?;
        let lower = losetup(rig, &f).map_err(|e| e.to_string())?;
        let upper = losetup(rig, Path::new(&lower)).map_err(|e| e.to_string())?;
        let mm = majmin(&lower).map_err(|e| e.to_string())?;
        fs::write(cg.join("blkio.throttle.read_bps_device"), format!("{mm} {rate}"))
            .map_err(|e| format!("throttling {lower}: {e}"))?;
        disks.push(upper);
        lowers.push(lower);
    }
    fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| format!("joining the cgroup: {e}"))?;
    Ok(SlowDisks { disks, lower: lowers, rate })
}

/// Formats `dev` as ext4 and mounts it at `mnt` (recorded in the rig).
pub fn mount_ext4(rig: &mut Rig, dev: &str, mnt: &Path) -> Result<(), BenchError> {
    run_cmd(Command::new("mkfs.ext4").args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]).arg(dev))?;
    fs::create_dir_all(mnt).map_err(|e| err("mount point", e))?;
    run_cmd(Command::new("mount").arg(dev).arg(mnt))?;
    rig.mounts.push(mnt.to_path_buf());
    Ok(())
}

/// Drops a file's or block device's pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`; dirty pages are written first).
pub fn drop_cache(path: &Path) {
    if let Ok(f) = File::open(path) {
        let _ = f.sync_data();
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
    }
}

/// How many of a file's pages are in the page cache, as a fraction (`mincore` of a
/// mapping would need unsafe; `fincore` from util-linux says it). `None` if unknown.
pub fn cached_fraction(path: &Path) -> Option<f64> {
    let out = Command::new("fincore").args(["-b", "-n", "-o", "RES,SIZE"]).arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut f = text.split_whitespace().map(|x| x.parse::<f64>());
    let (res, size) = (f.next()?.ok()?, f.next()?.ok()?);
    (size > 0.0).then(|| res / size)
}

/// A device's or file's size.
pub fn size_of(path: &str) -> u64 {
    File::open(path).and_then(|mut f| io::Seek::seek(&mut f, io::SeekFrom::End(0))).unwrap_or(0)
}

/// A free TCP port on the loopback (free when asked; see [`start_nginx`]).
pub fn free_port() -> Result<u16, BenchError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| err("port", e))?;
    Ok(l.local_addr().map_err(|e| err("port", e))?.port())
}

/// How a peer process runs: its CPU and I/O priority.
#[derive(Clone, Copy, Debug, Default)]
pub struct Priority {
    /// `chrt -f N`.
    pub fifo: Option<u8>,
    /// `ionice -cC -nN`.
    pub io: Option<(u8, u8)>,
}

impl Priority {
    /// `prog` wrapped in `chrt` and `ionice` as asked (each execs the next, so the
    /// child's pid is the program's).
    pub fn command(&self, prog: &str) -> Command {
        let mut words: Vec<String> = Vec::new();
        if let Some(p) = self.fifo {
            words.extend(["chrt".into(), "-f".into(), p.to_string()]);
        }
        if let Some((c, l)) = self.io {
            words.extend(["ionice".into(), format!("-c{c}"), format!("-n{l}")]);
        }
        words.push(prog.into());
        let mut cmd = Command::new(&words[0]);
        cmd.args(&words[1..]);
        cmd
    }
}

/// nginx serving `root` on `port`, single process (so its pid is the one that sends),
/// sendfile on; returns its pid once it answers as the nginx this run started.
pub fn start_nginx(rig: &mut Rig, root: &Path, port: u16, prio: Priority) -> Result<u32, BenchError> {
    let dir = rig.dir.clone();
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
    let mut cmd = prio.command("nginx");
    cmd.arg("-p").arg(&dir).arg("-c").arg(&conf).arg("-e").arg(dir.join(format!("nginx-{port}.err")));
    let child =
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().map_err(|e| err("nginx", e))?;
    let pid = child.id();
    rig.adopt(child);
    // Ready when *this* nginx answers: the port was free when chosen, but another
    // program on the machine could have taken it since, so ask for a file only this
    // run wrote.
    let token = format!("ictus-{}-{port}", std::process::id());
    let sentinel = root.join(format!("{token}.txt"));
    fs::write(&sentinel, &token).map_err(|e| err("nginx sentinel", e))?;
    let end = Instant::now() + Duration::from_secs(10);
    let result = loop {
        if fetch_small(port, &format!("{token}.txt")).is_some_and(|b| b == token.as_bytes()) {
            break Ok(pid);
        }
        if Instant::now() > end {
            break Err(err("nginx", format!("port {port} does not answer as the nginx this run started")));
        }
        if let Err(e) = nap(Duration::from_millis(20)) {
            break Err(e);
        }
    };
    let _ = fs::remove_file(&sentinel);
    result
}

/// A small GET's body, if the answer was 200.
fn fetch_small(port: u16, path: &str) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET /{path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").ok()?;
    let mut all = Vec::new();
    io::Read::read_to_end(&mut s, &mut all).ok()?;
    let end = all.windows(4).position(|w| w == b"\r\n\r\n")?;
    let ok = all.starts_with(b"HTTP/1.1 200");
    ok.then(|| all[end + 4..].to_vec())
}

/// Background readers: `k` fio jobs reading `span` bytes of `dev` from `offset`
/// (sequential 128 KiB `O_DIRECT` reads, libaio depth 8), for `secs`.
#[derive(Clone, Copy, Debug)]
pub struct Readers {
    /// Jobs.
    pub k: usize,
    /// First byte.
    pub offset: u64,
    /// Bytes they read between them (each its own part).
    pub span: u64,
    /// Seconds.
    pub secs: f64,
}

/// Starts the readers (one fio process, with the priority asked: `ionice` sets the
/// process's I/O priority, which BFQ schedules by; fio's own `prioclass` is a per-I/O
/// priority, which BFQ ignores). `None` for `k = 0`.
pub fn start_fio(
    rig: &mut Rig,
    dev: &str,
    r: &Readers,
    prio: Priority,
    out: &Path,
) -> Result<Option<ChildId>, BenchError> {
    if r.k == 0 {
        return Ok(None);
    }
    let part = (r.span / r.k as u64) & !0xfffff;
    let mut cmd = prio.command("fio");
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
    .arg(format!("--numjobs={}", r.k))
    .arg(format!("--offset={}", r.offset))
    .arg(format!("--size={part}"))
    .arg(format!("--offset_increment={part}"))
    .arg(format!("--runtime={:.1}", r.secs))
    .arg(format!("--output={}", out.display()));
    let child =
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().map_err(|e| err("fio", e))?;
    Ok(Some(rig.adopt(child)))
}

/// The readers' total throughput from fio's JSON (bytes/s), 0 if unreadable.
pub fn fio_bw(out: &Path) -> f64 {
    let Ok(text) = fs::read_to_string(out) else { return 0.0 };
    // fio may print notes before the JSON.
    let Some(start) = text.find('{') else { return 0.0 };
    let Ok(v) = serde_json::from_str::<Value>(&text[start..]) else { return 0.0 };
    v["jobs"].as_array().map_or(0.0, |jobs| jobs.iter().map(|j| j["read"]["bw_bytes"].as_f64().unwrap_or(0.0)).sum())
}

/// Writes `len` pseudo-random bytes to `path` and syncs them.
pub fn write_file(path: &Path, len: u64, seed: u64) -> Result<(), BenchError> {
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
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).map_err(|e| err("writing the clip", e))?;
        left -= n as u64;
    }
    f.sync_all().map_err(|e| err("writing the clip", e))
}

/// CPU nanoseconds a thread or single-threaded process has run (`schedstat`).
pub fn schedstat_ns(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

/// CPU nanoseconds and voluntary context switches (the times it slept: its wake-ups)
/// of this process's living threads named `name` (`/proc/self/task/*/schedstat` and
/// `status`).
pub fn threads_cpu_ns(name: &str) -> (u64, u64) {
    let Ok(dir) = fs::read_dir("/proc/self/task") else { return (0, 0) };
    let (mut cpu, mut wakes) = (0, 0);
    for t in dir.flatten() {
        let p = t.path();
        if fs::read_to_string(p.join("comm")).is_ok_and(|c| c.trim_end() == name) {
            cpu += fs::read_to_string(p.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse::<u64>().ok()))
                .unwrap_or(0);
            wakes += fs::read_to_string(p.join("status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(0);
        }
    }
    (cpu, wakes)
}

/// CPU nanoseconds of every thread this process has had, living and exited
/// (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`).
pub fn self_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
