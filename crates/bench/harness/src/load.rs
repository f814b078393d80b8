//! Load generators for the papers' "under load" columns: `ictus load cpu|disk|net|mem`.
//!
//! The papers measured with "a single, compute-bound process" (000 §5), "a compile in an
//! uncached AFS volume" and "CPU intensive background processes" (001 §5.3). These
//! generators reproduce those conditions without other tools, always bounded in time
//! (at most [`MAX_DURATION`]) and confined to this machine:
//!
//! - `cpu`: one busy thread per CPU the process may use, at normal priority, doing
//!   integer work that stays in registers and L1 (a compute-bound process);
//! - `disk`: threads that write a file in 1 MiB chunks, `fdatasync` it, drop its pages
//!   from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`) and read it back, so
//!   every pass goes to the device. The files are **unnamed** (`O_TMPFILE`, or created
//!   and unlinked at once where the file system lacks it), so nothing is left behind
//!   even after `kill -9`;
//! - `net`: TCP streams over loopback only (`127.0.0.1`, ephemeral ports), a sender
//!   and a receiver thread per stream;
//! - `mem`: threads that fault in a large anonymous buffer page by page, copy one half
//!   onto the other (`memcpy`), and give the pages back (`MADV_DONTNEED`) so the next
//!   pass faults again. The buffer is bounded: an eighth of RAM, at most 2 GiB.
//!
//! [`run`] runs a load in the calling process until its duration has passed.
//! [`spawn`] re-executes the current binary as a separate process (role [`ROLE`]) that
//! competes as an ordinary timesharing process: it resets
//! itself to `SCHED_OTHER` nice 0 on every online CPU, whatever the spawning thread had.
//! The process is its own process group, is killed with its group when the
//! [`LoadProcess`] is dropped, and dies with the spawning thread (`PR_SET_PDEATHSIG`).

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::child::{child_command, reap_status};
use crate::conditions::{disk_share, DISK_RESERVE};
use crate::experiment::Role;
use crate::report::NoteSink;
use crate::sys::AnonMemory;
use crate::BenchError;

/// The longest a load may run.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// The size of each disk load thread's file.
pub const DISK_FILE_BYTES: u64 = 32 << 20;
/// The most memory the `mem` load touches.
pub const MEM_CAP_BYTES: u64 = 2 << 30;
/// The most threads (or streams) a load starts.
pub const MAX_THREADS: usize = 256;
const CHUNK: usize = 1 << 20;

/// A kind of background load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadKind {
    /// Busy loops on every CPU.
    Cpu,
    /// Write, sync, drop from the cache and read back files.
    Disk,
    /// Loopback TCP streams.
    Net,
    /// Page faults and memory copies over a large buffer.
    Mem,
}

impl LoadKind {
    /// Every kind, in the order the experiments list them.
    pub const ALL: [LoadKind; 4] = [LoadKind::Cpu, LoadKind::Disk, LoadKind::Net, LoadKind::Mem];

    /// The name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            LoadKind::Cpu => "cpu",
            LoadKind::Disk => "disk",
            LoadKind::Net => "net",
            LoadKind::Mem => "mem",
        }
    }

    /// What [`LoadSummary::work`] counts for this kind.
    pub fn unit(self) -> &'static str {
        match self {
            LoadKind::Cpu => "loop iterations",
            LoadKind::Disk => "bytes written and read back",
            LoadKind::Net => "bytes received",
            LoadKind::Mem => "bytes copied",
        }
    }
}

impl fmt::Display for LoadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown load name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown load {0:?} (expected cpu, disk, net or mem)")]
pub struct UnknownLoad(pub String);

impl FromStr for LoadKind {
    type Err = UnknownLoad;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LoadKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| UnknownLoad(s.to_string()))
    }
}

/// How to run a load; [`Default`] picks sensible values per kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadConfig {
    /// Threads (streams for `net`). Default: one per usable CPU for `cpu` and `mem`,
    /// two for `disk`, one stream per two CPUs (at least one) for `net`.
    pub threads: Option<usize>,
    /// Where the `disk` load puts its (unnamed) files. Default: `/var/tmp` (usually on
    /// disk, unlike `/tmp`), else the temporary directory.
    pub dir: Option<PathBuf>,
}

/// What a load did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoadSummary {
    /// The kind of load.
    pub kind: LoadKind,
    /// Threads (or streams) it ran.
    pub threads: usize,
    /// How long it ran, in seconds.
    pub seconds: f64,
    /// Units of work done (see [`LoadKind::unit`]).
    pub work: u64,
    /// What `work` counts.
    pub unit: String,
}

impl fmt::Display for LoadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = if self.seconds > 0.0 { self.work as f64 / self.seconds } else { 0.0 };
        write!(
            f,
            "load {}: {} threads, {:.1} s, {} {} ({:.3e}/s)",
            self.kind, self.threads, self.seconds, self.work, self.unit, rate
        )
    }
}

fn invalid(context: &str, msg: impl Into<String>) -> BenchError {
    BenchError::io(context, io::Error::new(io::ErrorKind::InvalidInput, msg.into()))
}

fn check_duration(duration: Duration) -> Result<(), BenchError> {
    if duration.is_zero() || duration > MAX_DURATION {
        return Err(invalid("load duration", format!("must be positive and at most {} s", MAX_DURATION.as_secs())));
    }
    Ok(())
}

fn usable_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn default_threads(kind: LoadKind) -> usize {
    match kind {
        LoadKind::Cpu | LoadKind::Mem => usable_cpus(),
        LoadKind::Disk => 2,
        LoadKind::Net => (usable_cpus() / 2).max(1),
    }
}

fn threads_for(kind: LoadKind, cfg: &LoadConfig) -> Result<usize, BenchError> {
    let n = cfg.threads.unwrap_or_else(|| default_threads(kind));
    if n == 0 || n > MAX_THREADS {
        return Err(invalid("load threads", format!("must be 1..={MAX_THREADS}")));
    }
    Ok(n)
}

/// The directory the disk load writes in.
pub fn default_disk_dir() -> PathBuf {
    let var_tmp = Path::new("/var/tmp");
    if var_tmp.is_dir() {
        var_tmp.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Runs a load with the default configuration in this process for `duration`
/// (at most [`MAX_DURATION`]).
pub fn run(kind: LoadKind, duration: Duration) -> Result<LoadSummary, BenchError> {
    run_with(kind, duration, &LoadConfig::default())
}

/// Runs a load in this process for `duration` (at most [`MAX_DURATION`]).
pub fn run_with(kind: LoadKind, duration: Duration, cfg: &LoadConfig) -> Result<LoadSummary, BenchError> {
    run_until(kind, duration, cfg, &AtomicBool::new(false))
}

/// As [`run_with`], also stopping early when `stop` becomes true.
pub fn run_until(
    kind: LoadKind,
    duration: Duration,
    cfg: &LoadConfig,
    stop: &AtomicBool,
) -> Result<LoadSummary, BenchError> {
    check_duration(duration)?;
    let threads = threads_for(kind, cfg)?;
    let start = Instant::now();
    let end = start + duration;
    let done = || stop.load(Ordering::Relaxed) || Instant::now() >= end;
    let work = match kind {
        LoadKind::Cpu => cpu(threads, &done),
        LoadKind::Disk => disk(threads, cfg.dir.clone().unwrap_or_else(default_disk_dir), &done)?,
        LoadKind::Net => net(threads, &done)?,
        LoadKind::Mem => mem(threads, &done)?,
    };
    Ok(LoadSummary { kind, threads, seconds: start.elapsed().as_secs_f64(), work, unit: kind.unit().to_string() })
}

/// Runs `threads` copies of `body(index, counter)` until `done`, returning the counters'
/// sum. The first error of any thread is returned.
fn workers<D, F>(threads: usize, done: &D, body: F) -> Result<u64, BenchError>
where
    D: Fn() -> bool + Sync,
    F: Fn(usize, &AtomicU64, &dyn Fn() -> bool) -> Result<(), BenchError> + Sync,
{
    let total = AtomicU64::new(0);
    let mut first_error = None;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let total = &total;
                let body = &body;
                s.spawn(move || body(i, total, done))
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(BenchError::io("load thread", io::Error::other("panicked")));
                }
            }
        }
    });
    match first_error {
        Some(e) => Err(e),
        None => Ok(total.into_inner()),
    }
}

fn cpu<D: Fn() -> bool + Sync>(threads: usize, done: &D) -> u64 {
    workers(threads, done, |i, total, done| {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ i as u64;
        let mut n = 0u64;
        loop {
            // A batch of dependent integer work between clock reads.
            for _ in 0..10_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            std::hint::black_box(x);
            n += 1;
            if done() {
                break;
            }
        }
        total.fetch_add(n, Ordering::Relaxed);
        Ok(())
    })
    .unwrap_or(0)
}

/// An unnamed file in `dir`: `O_TMPFILE`, or a named file unlinked at once.
fn unnamed_file(dir: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    match rustix::fs::open(dir, OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, Mode::from_raw_mode(0o600)) {
        Ok(fd) => Ok(File::from(fd)),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::ISDIR => {
            for attempt in 0..100u32 {
                let path = dir.join(format!(".ictus-load-{}-{attempt}", std::process::id()));
                match std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path) {
                    Ok(f) => {
                        std::fs::remove_file(&path)?;
                        return Ok(f);
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(io::Error::other("could not create a temporary file"))
        }
        Err(e) => Err(e.into()),
    }
}

fn disk<D: Fn() -> bool + Sync>(threads: usize, dir: PathBuf, done: &D) -> Result<u64, BenchError> {
    if !dir.is_dir() {
        return Err(invalid("disk load", format!("{} is not a directory", dir.display())));
    }
    let file_bytes = match crate::conditions::free_bytes(&dir) {
        // Each thread's file: an equal share of what is free beyond the reserve, in whole
        // chunks (1 MiB), at most DISK_FILE_BYTES.
        Some(free) => disk_share(free, threads as u64, DISK_FILE_BYTES).ok_or_else(|| {
            invalid(
                "disk load",
                format!(
                    "{}: {} MiB free, too little for {threads} files of 1 MiB beside {} MiB left for the rest of the machine",
                    dir.display(),
                    free >> 20,
                    DISK_RESERVE >> 20
                ),
            )
        })?,
        None => DISK_FILE_BYTES,
    };
    workers(threads, done, |i, total, done| {
        let ctx = |what: &str| format!("disk load in {}: {what}", dir.display());
        let file = unnamed_file(&dir).map_err(|e| BenchError::io(ctx("create"), e))?;
        let mut buf = vec![(i as u8).wrapping_add(1); CHUNK];
        let mut back = vec![0u8; CHUNK];
        let mut bytes = 0u64;
        let chunks = file_bytes / CHUNK as u64;
        'pass: loop {
            for c in 0..chunks {
                buf[0] = buf[0].wrapping_add(1);
                file.write_all_at(&buf, c * CHUNK as u64).map_err(|e| BenchError::io(ctx("write"), e))?;
                bytes += CHUNK as u64;
                if done() {
                    break 'pass;
                }
            }
            rustix::fs::fdatasync(&file).map_err(|e| BenchError::io(ctx("fdatasync"), e.into()))?;
            // Clean pages can be dropped; the read-back then comes from the device.
            let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
            for c in 0..chunks {
                file.read_exact_at(&mut back, c * CHUNK as u64).map_err(|e| BenchError::io(ctx("read"), e))?;
                bytes += CHUNK as u64;
                if done() {
                    break 'pass;
                }
            }
        }
        total.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    })
}

fn net<D: Fn() -> bool + Sync>(streams: usize, done: &D) -> Result<u64, BenchError> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_err(|e| BenchError::io("net load: bind 127.0.0.1", e))?;
    let addr = listener.local_addr().map_err(|e| BenchError::io("net load: local_addr", e))?;
    let mut pairs = Vec::with_capacity(streams);
    for _ in 0..streams {
        let tx = TcpStream::connect(addr).map_err(|e| BenchError::io("net load: connect", e))?;
        let ours = tx.local_addr().map_err(|e| BenchError::io("net load: local_addr", e))?;
        // Only our own connections: anything else that reaches the port is dropped.
        let mut rx = None;
        for _ in 0..16 {
            let (conn, peer) = listener.accept().map_err(|e| BenchError::io("net load: accept", e))?;
            if peer == ours {
                rx = Some(conn);
                break;
            }
        }
        let rx = rx.ok_or_else(|| invalid("net load", "foreign connections crowd the loopback port"))?;
        pairs.push((tx, rx));
    }
    drop(listener);
    let pairs: Vec<_> = pairs.into_iter().map(|(tx, rx)| std::sync::Mutex::new(Some((tx, rx)))).collect();
    workers(streams * 2, done, |i, total, done| {
        let (stream, sending) = {
            let mut slot = pairs[i / 2].lock().map_err(|_| BenchError::io("net load", io::Error::other("poisoned")))?;
            let (tx, rx) = slot.as_mut().ok_or_else(|| invalid("net load", "stream taken"))?;
            let s = if i % 2 == 0 { tx.try_clone() } else { rx.try_clone() };
            (s.map_err(|e| BenchError::io("net load: clone", e))?, i % 2 == 0)
        };
        run_stream(stream, sending, total, done)
    })
}

fn run_stream(mut s: TcpStream, sending: bool, total: &AtomicU64, done: &dyn Fn() -> bool) -> Result<(), BenchError> {
    let mut buf = vec![0x5au8; 64 * 1024];
    let timeout = Some(Duration::from_millis(100));
    if sending {
        s.set_write_timeout(timeout).map_err(|e| BenchError::io("net load", e))?;
        while !done() {
            match s.write(&buf) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(BenchError::io("net load: send", e)),
            }
        }
        let _ = s.shutdown(std::net::Shutdown::Write);
    } else {
        s.set_read_timeout(timeout).map_err(|e| BenchError::io("net load", e))?;
        let mut bytes = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes += n as u64,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if done() {
                        break;
                    }
                }
                Err(e) => return Err(BenchError::io("net load: receive", e)),
            }
        }
        total.fetch_add(bytes, Ordering::Relaxed);
    }
    Ok(())
}

/// The `mem` load's buffer: an eighth of RAM, at most [`MEM_CAP_BYTES`].
pub fn mem_buffer_bytes() -> u64 {
    let info = rustix::system::sysinfo();
    let ram = u64::from(info.mem_unit.max(1)).saturating_mul(info.totalram as u64);
    (ram / 8).clamp(CHUNK as u64 * 2, MEM_CAP_BYTES)
}

fn mem<D: Fn() -> bool + Sync>(threads: usize, done: &D) -> Result<u64, BenchError> {
    let page = rustix::param::page_size();
    let per_thread = (mem_buffer_bytes() / threads as u64) as usize / (2 * page) * (2 * page);
    let per_thread = per_thread.max(2 * page);
    workers(threads, done, |_, total, done| {
        let mut region = AnonMemory::new(per_thread).map_err(|e| BenchError::io("mem load: mmap", e))?;
        let half = per_thread / 2;
        let mut copied = 0u64;
        'pass: loop {
            let buf = region.as_mut_slice();
            let (a, b) = buf.split_at_mut(half);
            for start in (0..half).step_by(CHUNK) {
                let end = (start + CHUNK).min(half);
                // Fault every page of the source chunk in, then copy it.
                for off in (start..end).step_by(page) {
                    a[off] = a[off].wrapping_add(1);
                }
                b[start..end].copy_from_slice(&a[start..end]);
                copied += (end - start) as u64;
                if done() {
                    break 'pass;
                }
            }
            region.discard();
        }
        total.fetch_add(copied, Ordering::Relaxed);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------
// As a separate process.

/// A load running in its own process (group). Dropping it kills the group with
/// `SIGKILL` and reaps the process.
#[derive(Debug)]
pub struct LoadProcess {
    child: Child,
    kind: LoadKind,
    duration: Duration,
    started: Instant,
}

/// Starts a load with the default configuration as a separate process.
pub fn spawn(kind: LoadKind, duration: Duration) -> Result<LoadProcess, BenchError> {
    spawn_with(kind, duration, &LoadConfig::default())
}

/// Starts a load as a separate process: `current_exe() __bench-child load KIND MS
/// THREADS DIR` ([`ROLE`]), in a process group of its own. It dies with the spawning
/// thread (`PR_SET_PDEATHSIG`), so spawn from a thread that lives as long as the
/// measurement.
pub fn spawn_with(kind: LoadKind, duration: Duration, cfg: &LoadConfig) -> Result<LoadProcess, BenchError> {
    check_duration(duration)?;
    threads_for(kind, cfg)?;
    let dir = cfg.dir.as_ref().map_or("-".to_string(), |d| d.to_string_lossy().into_owned());
    let args = [kind.name().to_string(), duration.as_millis().to_string(), cfg.threads.unwrap_or(0).to_string(), dir];
    let mut command = child_command(&ROLE, &args, &[]).map_err(|e| BenchError::io("load: current_exe", e))?;
    command.command().stdout(std::process::Stdio::piped()).process_group(0);
    let child = command.spawn().map_err(|e| BenchError::io("load: spawn", e))?;
    Ok(LoadProcess { child, kind, duration, started: Instant::now() })
}

impl LoadProcess {
    /// The load process's id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The kind of load.
    pub fn kind(&self) -> LoadKind {
        self.kind
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the load to end by itself (its duration plus a grace period, after
    /// which it is killed) and returns what it reported.
    pub fn finish(mut self) -> Result<LoadSummary, BenchError> {
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            stdout.read_to_string(&mut out).map_err(|e| BenchError::io("load: read summary", e))?;
        }
        let grace = self.duration.saturating_sub(self.started.elapsed()) + Duration::from_secs(30);
        let status = reap_status(&mut self.child, grace).map_err(|e| BenchError::io("load: wait", e))?;
        if !status.success() {
            return Err(invalid("load process", format!("exited with {status}")));
        }
        parse_summary(&out).ok_or_else(|| invalid("load process", format!("no summary in {out:?}")))
    }

    /// Kills the load now (the whole process group) and reaps it.
    pub fn stop(mut self) {
        self.kill_group();
    }

    fn kill_group(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LoadProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill_group();
        }
    }
}

fn parse_summary(out: &str) -> Option<LoadSummary> {
    let line = out.lines().rev().find(|l| l.starts_with('{'))?;
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    Some(LoadSummary {
        kind: v.get("kind")?.as_str()?.parse().ok()?,
        threads: usize::try_from(v.get("threads")?.as_u64()?).ok()?,
        seconds: v.get("seconds")?.as_f64()?,
        work: v.get("work")?.as_u64()?,
        unit: v.get("unit")?.as_str()?.to_string(),
    })
}

/// The `load` child role, which every binary that embeds the harness runs.
pub static ROLE: Role = Role { name: "load", run: load_role };

/// The `load` child role: `KIND MILLISECONDS THREADS(0 = default) DIR(- = default)`.
/// Resets itself to timesharing on every online CPU, runs the load and prints its
/// summary as one JSON line on standard output.
pub fn load_role(args: &[String]) -> i32 {
    let parsed = (|| -> Result<(LoadKind, Duration, LoadConfig), String> {
        let [kind, ms, threads, dir] = args else { return Err("expected KIND MS THREADS DIR".into()) };
        let kind: LoadKind = kind.parse().map_err(|e: UnknownLoad| e.to_string())?;
        let ms: u64 = ms.parse().map_err(|_| format!("bad duration {ms:?}"))?;
        let threads: usize = threads.parse().map_err(|_| format!("bad thread count {threads:?}"))?;
        let cfg =
            LoadConfig { threads: (threads > 0).then_some(threads), dir: (dir != "-").then(|| PathBuf::from(dir)) };
        Ok((kind, Duration::from_millis(ms), cfg))
    })();
    let (kind, duration, cfg) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("load: {e}");
            return 2;
        }
    };
    become_timesharing();
    match run_with(kind, duration, &cfg) {
        Ok(summary) => {
            let line = serde_json::to_string(&summary).unwrap_or_default();
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            0
        }
        Err(e) => {
            eprintln!("load: {e}");
            1
        }
    }
}

/// A competing load must be an ordinary process: `SCHED_OTHER` nice 0, allowed on
/// every online CPU, whatever the thread that spawned it had.
fn become_timesharing() {
    use ictus_rt::thread::{configure_current_thread, parse_cpu_list, Policy, ThreadRequest};
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|t| parse_cpu_list(t.trim()));
    configure_current_thread(&ThreadRequest {
        policy: Some(Policy::Other { nice: 0 }),
        cpus,
        ..ThreadRequest::default()
    });
}

/// A [`LoadKind`] for each command-line name, for the CLI and experiments.
pub fn parse_kinds(names: &[String]) -> Result<Vec<LoadKind>, UnknownLoad> {
    names.iter().map(|n| n.parse()).collect()
}

// ---------------------------------------------------------------------------------
// Experiments under load.

/// The loads of the papers' "under load" columns: none and CPU in quick mode, every
/// kind in full mode (`None` is no load of ours).
pub fn standard_loads(quick: bool) -> Vec<Option<LoadKind>> {
    let mut loads = vec![None, Some(LoadKind::Cpu)];
    if !quick {
        loads.extend([Some(LoadKind::Disk), Some(LoadKind::Net), Some(LoadKind::Mem)]);
    }
    loads
}

/// The name of a load in rows and notes: its kind, or `none`.
pub fn load_name(load: Option<LoadKind>) -> &'static str {
    load.map_or("none", LoadKind::name)
}

/// Runs `phase` once under each of `loads` in turn: each load a process of its own
/// started by `start` before its phase and stopped after it. A load that cannot start
/// is noted and its phase skipped; an error of a phase ends the whole run.
pub fn each_load<E, N: NoteSink>(
    loads: &[Option<LoadKind>],
    notes: &mut N,
    mut start: impl FnMut(LoadKind) -> Result<LoadProcess, BenchError>,
    mut phase: impl FnMut(Option<LoadKind>, &mut N) -> Result<(), E>,
) -> Result<(), E> {
    for &load in loads {
        let running = match load.map(&mut start) {
            Some(Ok(process)) => Some(process),
            Some(Err(e)) => {
                notes.not_measured(&format!("{} load", load_name(load)), &format!("the load could not start: {e}"));
                continue;
            }
            None => None,
        };
        let result = phase(load, notes);
        if let Some(process) = running {
            process.stop();
        }
        result?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_files_shrink_to_fit_a_nearly_full_disk() {
        assert_eq!(disk_share(100 << 30, 2, DISK_FILE_BYTES), Some(DISK_FILE_BYTES));
        // 127 MiB free: 63 MiB beyond the reserve, 31 whole MiB each.
        assert_eq!(disk_share(127 << 20, 2, DISK_FILE_BYTES), Some(31 << 20));
        assert_eq!(disk_share(DISK_RESERVE + (1 << 20), 1, DISK_FILE_BYTES), Some(1 << 20));
        assert_eq!(disk_share(DISK_RESERVE + (1 << 20), 2, DISK_FILE_BYTES), None);
        assert_eq!(disk_share(0, 0, DISK_FILE_BYTES), None);
    }

    #[test]
    fn names_round_trip() {
        for k in LoadKind::ALL {
            assert_eq!(k.to_string().parse::<LoadKind>(), Ok(k));
        }
        assert!("gpu".parse::<LoadKind>().is_err());
        assert!(parse_kinds(&["cpu".into(), "x".into()]).is_err());
    }

    #[test]
    fn durations_and_threads_are_bounded() {
        assert!(run(LoadKind::Cpu, Duration::ZERO).is_err());
        assert!(run(LoadKind::Cpu, MAX_DURATION + Duration::from_secs(1)).is_err());
        let cfg = LoadConfig { threads: Some(0), dir: None };
        assert!(run_with(LoadKind::Cpu, Duration::from_millis(1), &cfg).is_err());
        let cfg = LoadConfig { threads: Some(MAX_THREADS + 1), dir: None };
        assert!(spawn_with(LoadKind::Cpu, Duration::from_millis(1), &cfg).is_err());
        let cfg = LoadConfig { threads: Some(1), dir: Some("/nonexistent/ictus".into()) };
        assert!(run_with(LoadKind::Disk, Duration::from_millis(1), &cfg).is_err());
    }

    #[test]
    fn mem_buffer_is_bounded() {
        let b = mem_buffer_bytes();
        assert!(b <= MEM_CAP_BYTES && b >= 2 * CHUNK as u64);
    }

    #[test]
    fn summaries_parse_back() {
        let s = LoadSummary { kind: LoadKind::Net, threads: 2, seconds: 1.5, work: 42, unit: "bytes".into() };
        let line = serde_json::to_string(&s).expect("json");
        assert_eq!(parse_summary(&format!("noise\n{line}\n")), Some(s));
        assert_eq!(parse_summary("{\"kind\":\"x\"}"), None);
        assert_eq!(parse_summary(""), None);
    }

    #[test]
    fn every_load_runs_in_process_does_work_and_leaves_no_files() {
        let dir = std::env::temp_dir().join(format!("ictus-load-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for kind in LoadKind::ALL {
            let cfg = LoadConfig { threads: Some(2), dir: Some(dir.clone()) };
            let s = run_with(kind, Duration::from_millis(50), &cfg).expect("load runs");
            assert_eq!((s.kind, s.threads), (kind, 2));
            assert!(s.work > 0, "{s}");
        }
        assert_eq!(std::fs::read_dir(&dir).expect("readdir").count(), 0, "files left behind");
        std::fs::remove_dir(&dir).expect("rmdir");
    }

    #[test]
    fn a_stop_flag_ends_a_long_load() {
        let stop = AtomicBool::new(true);
        let s =
            run_until(LoadKind::Cpu, MAX_DURATION, &LoadConfig { threads: Some(1), dir: None }, &stop).expect("runs");
        assert!(s.work >= 1);
    }

    #[test]
    fn unnamed_files_have_no_name() {
        let dir = std::env::temp_dir().join(format!("ictus-load-unnamed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mut f = unnamed_file(&dir).expect("unnamed file");
        f.write_all(b"x").expect("write");
        assert_eq!(std::fs::read_dir(&dir).expect("readdir").count(), 0);
        drop(f);
        std::fs::remove_dir(&dir).expect("rmdir");
    }
}
