//! `ictus bench midi`: the paper's MIDI latency experiment (000 §5, Table 1 and
//! Figure 1).
//!
//! The paper's program enqueued 100 MIDI messages a second, about a second ahead,
//! through its output library; another machine timestamped their arrivals in its
//! driver and the intervals between them were compared with the nominal 10 ms, on an
//! idle machine and under loads, with the output threads timesharing and at fixed
//! priority. Here:
//!
//! - **the sender**: this process, through the output library
//!   ([`ictus_midi::output::Output`]: a timed queue, a timer thread that sleeps until
//!   the head is due, a byte-sender thread) onto the virtual cable, unpaced (a UART
//!   with a hardware FIFO: bytes leave when written). A producer thread keeps the
//!   queue about a second ahead, 100 messages a second. The output threads run in one
//!   of three classes: **timesharing** (`SCHED_OTHER`), **fixed priority**
//!   (`SCHED_FIFO` 80), **deadline** (`SCHED_DEADLINE`, 1 ms every 10 ms, implicit
//!   deadline); all with 1 ns timer slack, so only the class differs;
//! - **the receiver**: a separate process (role `midi-receiver`, this binary
//!   re-executed), `SCHED_FIFO` 90 with its memory locked — the paper's instrument —
//!   holding the cable's receiving end. The paper's instrument stamped arrivals in its
//!   interrupt handler, so its own scheduling was not measured; here the kernel stamps
//!   each datagram as it is queued to the receiver's socket (`SO_TIMESTAMPNS`), and the
//!   receiver's own clock reading after it wakes is reported beside it as a second row.
//!   Message `k` is identified by its bytes, so lost ones are seen;
//! - **the loads**: none, CPU, disk, network, memory ([`crate::load`], each its own
//!   process group of timesharing threads);
//! - **the peer**: `cyclictest` (Debian rt-tests) in the same window, one thread at
//!   100 Hz, the same class and priority as the output threads (`SCHED_FIFO` 80 for
//!   fixed priority and deadline windows; `SCHED_OTHER` for timesharing), as many
//!   loops as messages; its histogram is parsed by [`crate::alarm::parse_cyclictest`].
//!
//! The measure is the paper's: the **interval error**, |interval − 10 ms| between
//! consecutive arrivals (both present). Because sender and receiver share the clock,
//! the **delivery latency** (arrival − due time) is reported too, which the paper
//! could not measure across machines.
//!
//! Headlines: `midi_fifo_p99_vs_cyclictest` (fixed-priority interval-error p99 under
//! CPU load against cyclictest's p99 in the same window, target ≤ 1.5) and
//! `midi_fifo_vs_timesharing_max` (fixed-priority worst interval error under CPU load
//! against timesharing's under the same load, target ≤ 0.5).

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use ictus_midi::device::cable::CableOut;
use ictus_midi::device::sleep_until;
use ictus_midi::output::{Close, Output, OutputOptions};
use ictus_midi::{Kind, Message, Parser};
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_rt::{clock, Time};
use serde_json::json;

use crate::alarm::{parse_cyclictest, CyclictestHistogram, CYCLICTEST_HIST_US};
use crate::child::{fd_arg, num_arg, reap_status, spawn_child};
use crate::load::{self, LoadKind};
use crate::report::{Better, Headline, PaperFigure, Report};
use crate::stats::LatencyRecorder;
use crate::{format_ns, BenchError, Conditions};

/// Messages per second.
pub const RATE_HZ: u64 = 100;
/// The nominal interval.
pub const INTERVAL: Duration = Duration::from_millis(10);
/// How far ahead messages are enqueued.
pub const AHEAD: Duration = Duration::from_secs(1);
/// The fixed priority of the output threads and of cyclictest.
pub const FIFO_PRIORITY: u8 = 80;
/// The receiver's fixed priority.
pub const RECEIVER_PRIORITY: u8 = 90;
/// The most messages one window can tell apart (key × velocity 1..=127).
pub const MAX_MESSAGES: u64 = 128 * 127;

/// How the output threads are scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sched {
    /// `SCHED_OTHER` nice 0.
    Timesharing,
    /// `SCHED_FIFO` [`FIFO_PRIORITY`].
    Fixed,
    /// `SCHED_DEADLINE` 1 ms every 10 ms, implicit deadline (10 ms). A constrained
    /// deadline (say 2 ms) is worse here: a thread that wakes after its deadline but
    /// before its next period is throttled until that period starts (the kernel's
    /// `dl_check_constrained_dl`), which delayed every message by ~0.6 ms on this VM.
    Deadline,
}

impl Sched {
    /// Every class, in the order windows run.
    pub const ALL: [Sched; 3] = [Sched::Timesharing, Sched::Fixed, Sched::Deadline];

    /// Its name in rows.
    pub fn name(self) -> &'static str {
        match self {
            Sched::Timesharing => "timesharing",
            Sched::Fixed => "fixed",
            Sched::Deadline => "deadline",
        }
    }

    /// What the output threads ask for.
    pub fn request(self) -> ThreadRequest {
        let policy = match self {
            Sched::Timesharing => Policy::Other { nice: 0 },
            Sched::Fixed => Policy::Fifo { priority: FIFO_PRIORITY },
            Sched::Deadline => Policy::Deadline {
                runtime: Duration::from_millis(1),
                deadline: Duration::from_millis(10),
                period: Duration::from_millis(10),
            },
        };
        ThreadRequest { policy: Some(policy), timer_slack: Some(Duration::from_nanos(1)), ..ThreadRequest::default() }
    }

    /// cyclictest's class for the same window.
    fn cyclictest_policy(self) -> (&'static str, u8) {
        match self {
            Sched::Timesharing => ("other", 0),
            Sched::Fixed | Sched::Deadline => ("fifo", FIFO_PRIORITY),
        }
    }
}

/// The message that stands for number `k` (`k < MAX_MESSAGES`): a note on whose key
/// and velocity spell `k`.
pub fn message_for(k: u64) -> Option<Message> {
    if k >= MAX_MESSAGES {
        return None;
    }
    Message::note_on(0, (k % 128) as u8, (1 + k / 128) as u8, Time::ZERO).ok()
}

/// The number a received message stands for.
pub fn number_of(m: &Message) -> Option<u64> {
    match (m.kind(), m.bytes()) {
        (Kind::NoteOn, &[_, key, vel]) if vel >= 1 => Some(u64::from(key) + 128 * u64::from(vel - 1)),
        _ => None,
    }
}

/// What one window measured, from the arrival times by message number.
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    /// |interval − nominal| for consecutive pairs both received, ns, in order.
    pub errors: Vec<u64>,
    /// The intervals themselves, ns, in order (for Figure 1).
    pub intervals: Vec<u64>,
    /// arrival − due, ns, for every message received.
    pub latencies: Vec<u64>,
    /// Messages sent but never received.
    pub lost: u64,
    /// Arrivals that were not one of ours, or came twice.
    pub strays: u64,
}

/// Analyse arrivals `(k, t)` of messages `0..n`, message `k` due at `t0 + k·interval`.
pub fn analyse(arrivals: &[(u64, Time)], n: u64, t0: Time, interval: Duration) -> Analysis {
    let mut at: Vec<Option<Time>> = vec![None; n as usize];
    let mut a = Analysis::default();
    for &(k, t) in arrivals {
        match at.get_mut(k as usize) {
            Some(slot @ None) => *slot = Some(t),
            _ => a.strays += 1,
        }
    }
    let nominal = interval.as_nanos() as i128;
    for (k, t) in at.iter().enumerate() {
        let Some(t) = *t else {
            a.lost += 1;
            continue;
        };
        let due = t0 + interval * k as u32;
        a.latencies.push((t - due).as_nanos() as u64);
        if let Some(Some(next)) = at.get(k + 1) {
            let d = next.as_nanos() as i128 - t.as_nanos() as i128;
            a.intervals.push(d.max(0) as u64);
            a.errors.push((d - nominal).unsigned_abs() as u64);
        }
    }
    a
}

/// Options of the experiment.
#[derive(Clone, Debug, Default)]
pub struct MidiOptions {
    /// A few seconds per window, loads none and CPU.
    pub quick: bool,
    /// Write the JSON (and the SVGs beside it) here.
    pub json: Option<PathBuf>,
    /// Print progress to standard error.
    pub progress: bool,
}

/// `ictus bench midi [--quick] [--json FILE]`.
pub fn main(quick: bool, json: Option<PathBuf>) -> Result<(), BenchError> {
    let report = run(&MidiOptions { quick, json, progress: true })?;
    report.print_table();
    Ok(())
}

/// One window's results.
#[derive(Debug)]
struct Window {
    load: &'static str,
    sched: Sched,
    granted: String,
    /// On the kernel's arrival stamps.
    analysis: Analysis,
    /// On the receiver's own clock readings after each read (its wake-up included).
    analysis_user: Analysis,
    cyclictest: Vec<CyclictestHistogram>,
    output_late: u64,
    sent: u64,
}

/// Every cyclictest sample of several runs in one recorder (overflows at each run's
/// maximum, as [`CyclictestHistogram::recorder`] does); `None` without samples.
fn cyclictest_recorder(runs: &[CyclictestHistogram]) -> Option<LatencyRecorder> {
    let mut r = LatencyRecorder::new();
    for h in runs {
        for &(us, n) in &h.buckets {
            for _ in 0..n {
                r.record(us * 1000);
            }
        }
        for _ in 0..h.overflows {
            r.record(h.max_us.unwrap_or(CYCLICTEST_HIST_US) * 1000);
        }
    }
    (r.count() > 0).then_some(r)
}

fn recorder(samples: &[u64]) -> LatencyRecorder {
    let mut r = LatencyRecorder::new();
    r.record_all(samples);
    r
}

/// The receiving end of a cable, bound by the receiver itself so that the kernel
/// stamps each datagram when it is queued to the socket (`SO_TIMESTAMPNS`): the
/// paper's instrument stamped arrivals in its interrupt handler, so its own scheduling
/// was not part of what it measured; the kernel's stamp does the same here. The
/// address is the cable's ([`ictus_midi::device::cable::address_name`]), so the
/// output library's [`CableOut`] reaches it unchanged.
#[derive(Debug)]
struct StampedCable {
    fd: OwnedFd,
}

impl StampedCable {
    fn open(name: &str) -> std::io::Result<StampedCable> {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        let one: libc::c_int = 1;
        // SAFETY: `fd` is an open socket; the option value is a live `c_int` whose size
        // is passed with it (setsockopt(2), socket(7) `SO_TIMESTAMPNS`).
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                std::ptr::from_ref(&one).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let addr = SocketAddrUnix::new_abstract_name(
            ictus_midi::device::cable::address_name(name, rustix::process::geteuid().as_raw()).as_bytes(),
        )?;
        rustix::net::bind(&fd, &addr)?;
        Ok(StampedCable { fd })
    }

    /// One datagram into `buf`, waiting at most `timeout`: its length and the kernel's
    /// stamp (`CLOCK_REALTIME` ns), or `None` if nothing came.
    fn recv(&self, buf: &mut [u8], timeout: Duration) -> std::io::Result<Option<(usize, Option<u64>)>> {
        if !ictus_midi::device::wait_fd(self.fd.as_fd(), rustix::event::PollFlags::IN, Some(timeout))? {
            return Ok(None);
        }
        #[repr(C, align(8))]
        struct Control([u8; 128]);
        let mut control = Control([0; 128]);
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: an all-zero msghdr is a valid "no name, no iov, no control" header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = control.0.len() as _;
        // SAFETY: `msg` points at `iov` (our buffer, its length) and `control`, all live
        // for the call (recvmsg(2)).
        let n = unsafe { libc::recvmsg(std::os::fd::AsRawFd::as_raw_fd(&self.fd), &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        let mut stamp = None;
        // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, bounded by
        // the `msg_controllen` it set (cmsg(3)); the timestamp is read unaligned from
        // inside a header of type SCM_TIMESTAMPNS, whose payload is a `timespec`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                    stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Some((n as usize, stamp)))
    }
}

/// `CLOCK_REALTIME − CLOCK_MONOTONIC`, ns, read as tightly as a few tries allow.
fn realtime_offset() -> i128 {
    let mut best = (u64::MAX, 0i128);
    for _ in 0..5 {
        let a = clock::now().as_nanos();
        let w = clock::wall().as_nanos();
        let b = clock::now().as_nanos();
        if b - a < best.0 {
            best = (b - a, i128::from(w) - i128::from(a + (b - a) / 2));
        }
    }
    best.1
}

/// Bytes per arrival record: `u32` number, `u64` kernel stamp (monotonic ns, 0 if
/// none), `u64` the receiver's own clock reading after the read.
const RECORD: usize = 20;

/// The receiver process: `CABLE COUNT FD MAX_MS`. Binds the cable, writes `R` on the
/// descriptor, then records the arrival of each message ([`RECORD`] bytes) until it
/// has `COUNT`, or a second passes without one after the first, or `MAX_MS` pass;
/// writes them and exits.
pub fn receiver_role(args: &[String]) -> i32 {
    let run = || -> Result<(), String> {
        let cable = args.first().ok_or("missing cable")?;
        let count = num_arg(args, 1, "count").map_err(|e| e.to_string())? as u64;
        let fd: OwnedFd = fd_arg(args.get(2).ok_or("missing fd")?).map_err(|e| e.to_string())?;
        let max = Duration::from_millis(num_arg(args, 3, "max ms").map_err(|e| e.to_string())? as u64);
        configure_current_thread(&ThreadRequest {
            policy: Some(Policy::Fifo { priority: RECEIVER_PRIORITY }),
            timer_slack: Some(Duration::from_nanos(1)),
            lock_memory: true,
            ..ThreadRequest::default()
        });
        let input = StampedCable::open(cable).map_err(|e| format!("cable {cable}: {e}"))?;
        let offset = realtime_offset();
        let mut out = std::fs::File::from(fd);
        std::io::Write::write_all(&mut out, b"R").map_err(|e| e.to_string())?;
        let mut parser = Parser::new();
        let mut buf = vec![0u8; ictus_midi::device::cable::MAX_DATAGRAM];
        let mut records: Vec<u8> = Vec::with_capacity(count as usize * RECORD);
        let (mut got, started) = (0u64, Instant::now());
        let mut last = None::<Instant>;
        while got < count
            && started.elapsed() < max
            && !matches!(last, Some(l) if l.elapsed() >= Duration::from_secs(1))
        {
            let Some((n, stamp)) = input.recv(&mut buf, Duration::from_millis(100)).map_err(|e| e.to_string())? else {
                continue;
            };
            let user = clock::now();
            last = Some(Instant::now());
            let kernel = stamp.map_or(0, |s| (i128::from(s) - offset).clamp(0, i128::from(u64::MAX)) as u64);
            for &b in &buf[..n] {
                for m in parser.feed(b, user) {
                    if let Some(k) = number_of(&m) {
                        records.extend_from_slice(&(k as u32).to_le_bytes());
                        records.extend_from_slice(&kernel.to_le_bytes());
                        records.extend_from_slice(&user.as_nanos().to_le_bytes());
                        got += 1;
                    }
                }
            }
        }
        std::io::Write::write_all(&mut out, &records).map_err(|e| e.to_string())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("midi-receiver: {e}");
            1
        }
    }
}

/// Arrivals: `(message number, time)`.
type Arrivals = Vec<(u64, Time)>;

/// Arrival records: `(number, kernel stamp, receiver's reading)`; a missing kernel
/// stamp is the receiver's reading.
fn parse_records(bytes: &[u8]) -> (Arrivals, Arrivals) {
    let mut kernel = Vec::new();
    let mut user = Vec::new();
    for c in bytes.chunks_exact(RECORD) {
        let k = u64::from(u32::from_le_bytes(c[..4].try_into().unwrap_or([0; 4])));
        let kt = u64::from_le_bytes(c[4..12].try_into().unwrap_or([0; 8]));
        let ut = u64::from_le_bytes(c[12..20].try_into().unwrap_or([0; 8]));
        user.push((k, Time::from_nanos(ut)));
        kernel.push((k, Time::from_nanos(if kt == 0 { ut } else { kt })));
    }
    (kernel, user)
}

fn start_cyclictest(sched: Sched, loops: u64) -> std::io::Result<Child> {
    let (policy, prio) = sched.cyclictest_policy();
    crate::alarm::spawn_cyclictest(policy, prio, INTERVAL, loops)
}

/// The load of a window. The CPU load is four busy threads per CPU: the paper's
/// computation load kept its one CPU busy with more work than it could run, and one
/// thread per CPU on today's two CPUs leaves the scheduler (EEVDF) an idle-enough machine
/// that timesharing's worst case is the VM's own stalls, not the load's.
fn load_config(kind: LoadKind) -> load::LoadConfig {
    let threads = match kind {
        LoadKind::Cpu => std::thread::available_parallelism().map_or(1, usize::from).checked_mul(4),
        _ => None,
    };
    load::LoadConfig { threads, ..load::LoadConfig::default() }
}

fn unique_cable() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("bench-midi-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Run one window: `secs` seconds of messages, output threads in `sched`.
fn window(load: &'static str, sched: Sched, secs: u64, notes: &mut Vec<String>) -> Result<Window, BenchError> {
    let n = (secs * RATE_HZ).min(MAX_MESSAGES);
    let cable = unique_cable();
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| BenchError::io("midi: pipe", e.into()))?;
    let mut rd = std::fs::File::from(rd);
    let max_ms = (AHEAD + INTERVAL * n as u32 + Duration::from_secs(10)).as_millis();
    let args = vec![cable.clone(), n.to_string(), std::os::fd::AsRawFd::as_raw_fd(&wr).to_string(), max_ms.to_string()];
    let mut child =
        spawn_child("midi-receiver", &args, &[wr.as_fd()]).map_err(|e| BenchError::io("midi: spawn receiver", e))?;
    drop(wr);
    let mut ready = [0u8; 1];
    if rd.read_exact(&mut ready).is_err() || ready != *b"R" {
        let status = reap_status(&mut child, Duration::from_secs(5));
        return Err(BenchError::io("midi: the receiver did not start", std::io::Error::other(format!("{status:?}"))));
    }
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = rd.read_to_end(&mut all);
        all
    });

    let device = CableOut::open(&cable, None).map_err(|e| BenchError::io("midi: cable", std::io::Error::other(e)))?;
    let options = OutputOptions { thread: sched.request(), ..OutputOptions::default() };
    let output = Output::open(Box::new(device), options)
        .map_err(|e| BenchError::io("midi: output", std::io::Error::other(e.to_string())))?;
    let granted: Vec<String> = output.granted().iter().map(|(role, g)| format!("{role}: {}", g.describe())).collect();
    let granted = granted.join(", ");

    // The producer (this thread) shares the output library's lock with its threads, and
    // that lock does not inherit priority: a timesharing producer preempted while
    // holding it would hold up the real-time threads (the priority inversion the paper
    // found in C-Threads). So in the real-time windows it runs at the fixed priority,
    // as an application using the library this way must; back to timesharing after.
    let producer = match sched {
        Sched::Timesharing => None,
        Sched::Fixed | Sched::Deadline => Some(configure_current_thread(&Sched::Fixed.request())),
    };
    let t0 = clock::now() + AHEAD + Duration::from_millis(20);
    let last_due = t0 + INTERVAL * (n.saturating_sub(1)) as u32;
    let mut next = 0u64;
    let mut cyclictest = None;
    loop {
        let now = clock::now();
        while next < n && t0 + INTERVAL * next as u32 <= now + AHEAD {
            if let Some(m) = message_for(next) {
                if let Err(e) = output.put(m, t0 + INTERVAL * next as u32) {
                    notes.push(format!("{load} {}: put failed: {e}", sched.name()));
                }
            }
            next += 1;
        }
        if cyclictest.is_none() && now + Duration::from_millis(60) >= t0 {
            sleep_until(t0);
            cyclictest = Some(start_cyclictest(sched, n));
        }
        if next >= n && cyclictest.is_some() {
            break;
        }
        sleep_until(now + Duration::from_millis(50));
    }
    sleep_until(last_due + Duration::from_millis(200));
    if producer.is_some() {
        configure_current_thread(&Sched::Timesharing.request());
    }
    let closed = output.close(Close::Drain);
    let records = reader.join().unwrap_or_default();
    let _ = reap_status(&mut child, Duration::from_secs(5));
    let (kernel, user) = parse_records(&records);
    let stamped = records.chunks_exact(RECORD).filter(|c| c[4..12] != [0; 8]).count();
    if stamped < kernel.len() {
        notes.push(format!(
            "{load} {}: {} of {} arrivals had no kernel timestamp (the receiver's own reading was used)",
            sched.name(),
            kernel.len() - stamped,
            kernel.len()
        ));
    }
    let analysis = analyse(&kernel, n, t0, INTERVAL);
    let analysis_user = analyse(&user, n, t0, INTERVAL);

    let cyclictest = match cyclictest {
        Some(Ok(mut c)) => {
            let mut text = String::new();
            if let Some(mut out) = c.stdout.take() {
                let _ = out.read_to_string(&mut text);
            }
            let _ = c.wait();
            match parse_cyclictest(&text) {
                Ok(h) => vec![h],
                Err(e) => {
                    notes.push(format!("cyclictest ({load}, {}): {e}", sched.name()));
                    Vec::new()
                }
            }
        }
        Some(Err(e)) => {
            notes.push(format!("cyclictest could not run ({e}); install Debian rt-tests (scripts/setup.sh)"));
            Vec::new()
        }
        None => Vec::new(),
    };
    Ok(Window {
        load,
        sched,
        granted,
        analysis,
        analysis_user,
        cyclictest,
        output_late: closed.stats.late + closed.stats.out_of_order,
        sent: closed.stats.sent,
    })
}

/// Merge the windows of the same load and class (rounds).
fn merge(windows: Vec<Window>) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    for w in windows {
        match out.iter_mut().find(|o| o.load == w.load && o.sched == w.sched) {
            Some(o) => {
                o.analysis.errors.extend(w.analysis.errors);
                o.analysis.intervals.extend(w.analysis.intervals);
                o.analysis.latencies.extend(w.analysis.latencies);
                o.analysis.lost += w.analysis.lost;
                o.analysis_user.errors.extend(w.analysis_user.errors);
                o.analysis.strays += w.analysis.strays;
                o.output_late += w.output_late;
                o.sent += w.sent;
                o.cyclictest.extend(w.cyclictest);
            }
            None => out.push(w),
        }
    }
    out
}

/// The paper's Table 1 (worst delay beyond the nominal 10 ms), by our load.
const TABLE1: &[(&str, &str, &str, &str, f64, f64)] = &[
    ("none", "No Load", ">11 ms", ">6 ms", 11.6e6, 6.7e6),
    ("cpu", "Computation Load", ">200 ms", ">6 ms", 200e6, 6e6),
    ("disk", "AFS Load (a compile in an uncached AFS volume)", ">10000 ms", ">159 ms", 10_000e6, 159e6),
    ("net", "X11 + Network Load", ">155 ms", ">11 ms", 155e6, 11e6),
];

/// Run the experiment.
pub fn run(opts: &MidiOptions) -> Result<Report, BenchError> {
    let mut conditions = Conditions::capture_before();
    let (secs, rounds): (u64, usize) = if opts.quick { (3, 1) } else { (15, 2) };
    let loads: Vec<Option<LoadKind>> = if opts.quick {
        vec![None, Some(LoadKind::Cpu)]
    } else {
        vec![None, Some(LoadKind::Cpu), Some(LoadKind::Disk), Some(LoadKind::Net), Some(LoadKind::Mem)]
    };
    let mut notes = Vec::new();
    let mut windows = Vec::new();
    for load in &loads {
        let load_name = load.map_or("none", LoadKind::name);
        let per_load = Duration::from_secs((secs + 3) * (Sched::ALL.len() * rounds) as u64 + 20);
        let running = match load {
            Some(kind) => match load::spawn_with(*kind, per_load, &load_config(*kind)) {
                Ok(p) => Some(p),
                Err(e) => {
                    notes.push(format!("{load_name} load could not start: {e}; skipped"));
                    continue;
                }
            },
            None => None,
        };
        for round in 0..rounds {
            for sched in Sched::ALL {
                if opts.progress {
                    eprintln!("midi: load {load_name}, {}, {secs} s (round {})", sched.name(), round + 1);
                }
                match window(load_name, sched, secs, &mut notes) {
                    Ok(w) => windows.push(w),
                    Err(e) => notes.push(format!("{load_name} {}: {e}", sched.name())),
                }
            }
        }
        if let Some(p) = running {
            p.stop();
        }
    }
    let windows = merge(windows);

    conditions.rt_privileges = ictus_rt::thread::rt_privileges();
    let mut report = Report::new("midi", "000 §5, Table 1 and Figure 1", opts.quick, conditions.finish());
    report.conditions.policy = format!(
        "output threads timesharing / SCHED_FIFO {FIFO_PRIORITY} / SCHED_DEADLINE (see rows' granted); receiver SCHED_FIFO {RECEIVER_PRIORITY}"
    );
    if !report.conditions.rt_privileges {
        notes.push(
            "real-time scheduling was refused: fixed-priority and deadline rows ran timesharing (see granted)".into(),
        );
    }
    for w in &windows {
        let a = &w.analysis;
        let base = |case: String, r: &LatencyRecorder, what: &str| {
            r.row(case)
                .with("load", w.load)
                .with("sched", w.sched.name())
                .with("measure", what)
                .with("granted", w.granted.as_str())
                .with("lost", a.lost)
                .with("late_puts", w.output_late)
                .to_value()
        };
        if !a.errors.is_empty() {
            report.rows.push(base(
                format!("{} {}: interval error", w.load, w.sched.name()),
                &recorder(&a.errors),
                "interval error |Δ − 10 ms|",
            ));
        }
        if !w.analysis_user.errors.is_empty() {
            report.rows.push(base(
                format!("{} {}: interval error, receiver's reading", w.load, w.sched.name()),
                &recorder(&w.analysis_user.errors),
                "interval error on the receiver's clock reading after its wake-up",
            ));
        }
        if !a.latencies.is_empty() {
            report.rows.push(base(
                format!("{} {}: delivery latency", w.load, w.sched.name()),
                &recorder(&a.latencies),
                "arrival − due",
            ));
        }
        if let Some(c) = cyclictest_recorder(&w.cyclictest) {
            let (p, prio) = w.sched.cyclictest_policy();
            report.rows.push(
                c.row(format!("{} {}: cyclictest", w.load, w.sched.name()))
                    .with("load", w.load)
                    .with("sched", w.sched.name())
                    .with("measure", "cyclictest wake-up latency, 100 Hz")
                    .with("granted", format!("{p} {prio}"))
                    .with("lost", 0u64)
                    .with("late_puts", 0u64)
                    .to_value(),
            );
        }
        if a.strays > 0 {
            notes.push(format!("{} {}: {} arrivals were not ours or came twice", w.load, w.sched.name(), a.strays));
        }
    }
    report.hidden_in_table = vec!["load".into(), "sched".into(), "measure".into(), "mean_ns".into()];

    let find = |load: &str, sched: Sched| windows.iter().find(|w| w.load == load && w.sched == sched);
    let max_err = |w: &Window| w.analysis.errors.iter().copied().max();
    // Table 1 beside ours.
    for &(load, paper_load, ts, fp, _, _) in TABLE1 {
        let ours = |s: Sched| find(load, s).and_then(max_err).map_or("-".to_string(), |v| format_ns(v as f64));
        report.rows.push(json!({
            "case": format!("Table 1: {paper_load}"),
            "paper_timesharing": ts,
            "paper_fixed": fp,
            "ours_timesharing": ours(Sched::Timesharing),
            "ours_fixed": ours(Sched::Fixed),
            "ours_deadline": ours(Sched::Deadline),
            "ours_load": load,
        }));
    }
    for &(load, paper_load, ts, fp, ts_ns, fp_ns) in TABLE1 {
        for (sched, paper, paper_ns) in [(Sched::Timesharing, ts, ts_ns), (Sched::Fixed, fp, fp_ns)] {
            let f = PaperFigure::new(
                format!("worst delay, {}, {paper_load} (ours: load {load})", sched.name()),
                paper,
                Some(paper_ns),
                "ns",
                Better::Lower,
            );
            let v = find(load, sched).and_then(max_err).map(|v| v as f64);
            report.paper_figures.push(match v {
                Some(v) => f.ours(Some(v), format!("max interval error {}", format_ns(v))),
                None => f,
            });
        }
    }
    let fig1 = find("cpu", Sched::Fixed).or_else(|| find("none", Sched::Fixed));
    let f = PaperFigure::new(
        "interarrival plot (Figure 1): worst interval, fixed priority",
        "points cluster at 10 ms; a remote finger caused >60 ms",
        Some(60e6),
        "ns",
        Better::Lower,
    );
    report.paper_figures.push(match fig1.and_then(|w| w.analysis.intervals.iter().copied().max()) {
        Some(v) => f.ours(
            Some(v as f64),
            format!("worst interval {} (load {})", format_ns(v as f64), fig1.map_or("", |w| w.load)),
        ),
        None => f,
    });

    // Headlines.
    if let Some(w) = find("cpu", Sched::Fixed) {
        if let (Some(c), false) = (cyclictest_recorder(&w.cyclictest), w.analysis.errors.is_empty()) {
            let ours = recorder(&w.analysis.errors).quantile(0.99) as f64;
            let peer = c.quantile(0.99) as f64;
            report.headline.push(
                Headline::new(
                    "midi_fifo_p99_vs_cyclictest",
                    ours,
                    peer,
                    format!("cyclictest (rt-tests) SCHED_FIFO {FIFO_PRIORITY}, 100 Hz, same window, CPU load"),
                    "ns",
                    Better::Lower,
                )
                .with_target(1.5),
            );
        }
        if let (Some(ours), Some(peer)) = (max_err(w), find("cpu", Sched::Timesharing).and_then(max_err)) {
            report.headline.push(
                Headline::new(
                    "midi_fifo_vs_timesharing_max",
                    ours as f64,
                    peer as f64,
                    "the same output library with timesharing threads, CPU load",
                    "ns",
                    Better::Lower,
                )
                .with_target(0.5),
            );
        }
    }
    notes.push(format!(
        "{secs} s per window, {rounds} round(s) of timesharing, fixed priority and deadline per load; 100 messages/s enqueued {} s ahead; receiver SCHED_FIFO {RECEIVER_PRIORITY}, memory locked",
        AHEAD.as_secs()
    ));
    notes.push("interval error is the paper's measure, on the kernel's arrival stamps (SO_TIMESTAMPNS; the rows 'receiver's reading' add the receiver's own wake-up); cyclictest measures wake-up lateness, one wake-up per period: our interval error is a difference of two latencies; a due message is written by the output library's timer thread itself when the byte sender is idle (one wake-up, as in cyclictest), and handed to the byte sender only when the device is full or messages are queued".into());
    notes.push("the cable is unpaced (a UART with a FIFO); cyclictest sets /dev/cpu_dma_latency to 0 while it runs, for everything in its window".into());
    notes.push("the paper's AFS load is set beside our disk load and its X11+network load beside our network load; memory load has no counterpart".into());
    notes.push(
        "the machine is shared with other builds: absolute numbers are noisy, ratios from one window less so".into(),
    );
    report.notes = notes;

    if let Some(path) = &opts.json {
        let svg = match fig1 {
            Some(w) => ictus_midi_server::monitor::figure1_svg(
                &w.analysis.intervals,
                100,
                20,
                &format!("MIDI interarrival times, fixed priority, load {} (Figure 1)", w.load),
            ),
            None => ictus_midi_server::monitor::figure1_svg(&[], 100, 20, "MIDI interarrival times (no data)"),
        };
        report.write_json_and_plot(path, &svg)?;
        if let Some(w) = find("cpu", Sched::Timesharing).or_else(|| find("none", Sched::Timesharing)) {
            let ts = ictus_midi_server::monitor::figure1_svg(
                &w.analysis.intervals,
                100,
                20,
                &format!("MIDI interarrival times, timesharing, load {}", w.load),
            );
            let p = sibling(path, "-timesharing.svg");
            std::fs::write(&p, ts).map_err(|e| BenchError::io(format!("writing {}", p.display()), e))?;
        }
    }
    Ok(report)
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let stem = path.file_stem().map_or_else(|| "midi".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_midi::device::Device;

    const MS: u64 = 1_000_000;

    #[test]
    fn numbers_round_trip_through_messages() {
        for k in [0, 1, 127, 128, 5000, MAX_MESSAGES - 1] {
            let m = message_for(k).unwrap();
            assert_eq!(number_of(&m), Some(k));
        }
        assert!(message_for(MAX_MESSAGES).is_none());
        let off = Message::note_off(0, 1, 1, Time::ZERO).unwrap();
        assert_eq!(number_of(&off), None);
    }

    #[test]
    fn analysis_of_arrivals() {
        let t0 = Time::from_millis(1000);
        let t = |ms: u64, extra: u64| Time::from_nanos(ms * MS + extra);
        // 0 on time, 1 late by 2 ms, 2 lost, 3 on time, a duplicate of 3, a stray.
        let arrivals = [(0, t(1000, 0)), (1, t(1012, 0)), (3, t(1030, 500)), (3, t(1031, 0)), (99, t(1, 0))];
        let a = analyse(&arrivals, 4, t0, INTERVAL);
        assert_eq!(a.lost, 1);
        assert_eq!(a.strays, 2);
        // Only the pair (0, 1) is consecutive and present: 12 ms, error 2 ms.
        assert_eq!(a.intervals, vec![12 * MS]);
        assert_eq!(a.errors, vec![2 * MS]);
        assert_eq!(a.latencies, vec![0, 2 * MS, 500]);
        // An early interval is an error too.
        let a = analyse(&[(0, t(1000, 0)), (1, t(1007, 0))], 2, t0, INTERVAL);
        assert_eq!(a.errors, vec![3 * MS]);
    }

    #[test]
    fn records_parse() {
        let mut b = Vec::new();
        for (k, kt, ut) in [(7u32, 123u64, 130u64), (8, 0, 240)] {
            b.extend_from_slice(&k.to_le_bytes());
            b.extend_from_slice(&kt.to_le_bytes());
            b.extend_from_slice(&ut.to_le_bytes());
        }
        b.extend_from_slice(&[1, 2, 3]); // a torn tail is ignored
        let (kernel, user) = parse_records(&b);
        assert_eq!(kernel, vec![(7, Time::from_nanos(123)), (8, Time::from_nanos(240))]);
        assert_eq!(user, vec![(7, Time::from_nanos(130)), (8, Time::from_nanos(240))]);
    }

    #[test]
    fn the_kernel_stamps_arrivals_on_a_cable() {
        let name = unique_cable();
        let rx = StampedCable::open(&name).unwrap();
        let mut tx = CableOut::open(&name, None).unwrap();
        let before = clock::wall().as_nanos();
        tx.write(&[0x90, 1, 1]).unwrap();
        let mut buf = [0u8; 16];
        let (n, stamp) = rx.recv(&mut buf, Duration::from_secs(30)).unwrap().expect("a datagram");
        assert_eq!(&buf[..n], &[0x90, 1, 1]);
        let stamp = stamp.expect("AF_UNIX datagrams carry SO_TIMESTAMPNS");
        assert!(stamp >= before && stamp <= clock::wall().as_nanos());
        assert!(rx.recv(&mut buf, Duration::ZERO).unwrap().is_none());
    }

    #[test]
    fn classes_ask_for_what_they_say() {
        assert!(matches!(Sched::Fixed.request().policy, Some(Policy::Fifo { priority: FIFO_PRIORITY })));
        assert!(matches!(Sched::Deadline.request().policy, Some(Policy::Deadline { .. })));
        assert_eq!(Sched::Timesharing.cyclictest_policy(), ("other", 0));
        assert_eq!(Sched::Deadline.cyclictest_policy(), ("fifo", FIFO_PRIORITY));
    }

    #[test]
    fn the_figure_is_well_formed() {
        let svg = ictus_midi_server::monitor::figure1_svg(&[10 * MS, 70 * MS], 100, 20, "t");
        crate::svg::check_well_formed(&svg).unwrap();
    }

    #[test]
    fn sibling_paths() {
        assert_eq!(sibling(Path::new("/x/m.json"), "-timesharing.svg"), PathBuf::from("/x/m-timesharing.svg"));
    }
}
