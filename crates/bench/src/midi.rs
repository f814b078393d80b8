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
//!   with a hardware FIFO: bytes leave when written). A producer thread (timesharing,
//!   as an application's own thread would be) keeps the queue about a second ahead,
//!   100 messages a second. The output threads run in one
//!   of three classes: **timesharing** (`SCHED_OTHER`), **fixed priority**
//!   (`SCHED_FIFO` 80), **deadline** (`SCHED_DEADLINE`, 1 ms every 10 ms, implicit
//!   deadline); all with 1 ns timer slack, so only the class differs;
//! - **the receiver**: a separate process (role `midi-receiver`, this binary
//!   re-executed), `SCHED_FIFO` 90 with its memory locked — the paper's instrument —
//!   holding the cable's receiving end. The paper's instrument stamped arrivals in its
//!   interrupt handler, so its own scheduling was not measured; here the kernel stamps
//!   the wake-up the cable sends the receiver at each write, as it is queued to the
//!   receiver's socket (`SO_TIMESTAMPNS`, `CableIn::with_arrival_stamps`), and the
//!   receiver's own clock reading after it wakes is reported beside it as a second row.
//!   Message `k` is identified by its bytes, so lost ones are seen;
//! - **the loads**: none, CPU, disk, network, memory ([`crate::load`], each its own
//!   process group of timesharing threads);
//! - **the peer**: `cyclictest` (Debian rt-tests) in the same window, one thread at
//!   100 Hz, the same class and priority as the output threads (`SCHED_FIFO` 80 for
//!   fixed priority and deadline windows; `SCHED_OTHER` for timesharing), as many
//!   loops as messages; every wake-up's latency is read (`-v -N`,
//!   [`parse_cyclictest_samples`]), so that its interval error can be computed too
//!   ([`cyclictest_interval_errors`]).
//!
//! The measure is the paper's: the **interval error**, |interval − 10 ms| between
//! consecutive arrivals (both present). Because sender and receiver share the clock,
//! the **delivery latency** (arrival − due time) is reported too, which the paper
//! could not measure across machines.
//!
//! The output library runs a timer thread on each CPU in the timesharing and
//! fixed-priority windows (`timer_cpus`; a deadline thread cannot be pinned): on this
//! VM the host stops one virtual CPU for milliseconds now and then, and a single timer
//! thread was as late as cyclictest's, as often.
//!
//! The sending process locks its memory (`mlockall`, for every window alike, undone at
//! the end; refused without privileges, then noted) and each window records the steal
//! time of every CPU (`/proc/stat`), the page faults of the output threads while
//! messages were due, and where its worst interval error happened: when, on which CPU
//! the output library wrote the two messages (the cable is wrapped to note each write's
//! time and CPU) and on which CPU the receiver ran.
//!
//! # The windows
//!
//! Table 1's rows come from windows of one class each, as the paper measured: per load,
//! rounds of a timesharing, a fixed-priority and a deadline window, cyclictest in each.
//! Under CPU load there is also one **side-by-side window**: a fixed-priority output and
//! a timesharing output of the same library at once, each on its own cable with its own
//! receiver and producer, the timesharing messages due [`SIDE_OFFSET`] after the
//! fixed-priority ones, so both meet the same machine at the same time and only the
//! class differs.
//!
//! # Headlines
//!
//! - `midi_fifo_p99_vs_cyclictest`: the fixed-priority window's interval-error p99 under
//!   CPU load against cyclictest's wake-up latency p99 in the same window (target ≤ 1.5).
//!   Beside it, without target, the same measure on both sides
//!   (`midi_fifo_p99_vs_cyclictest_interval`: cyclictest's interval error) and delivery
//!   latency against wake-up latency (`midi_fifo_latency_p99_vs_cyclictest`): an
//!   interval error counts a late message twice and a steady delay not at all;
//! - `midi_fifo_vs_timesharing_max`: from the side-by-side window, cut into
//!   [`SEGMENT_SECS`]-second segments: the median over the segments of the
//!   fixed-priority output's worst interval error in each, against the same for the
//!   timesharing output (target ≤ 0.5). Every sample counts, none is capped; the median
//!   of segment maxima is the worst case of a typical five seconds, which a single
//!   stall of the machine does not decide;
//! - `midi_fifo_vs_timesharing_abs_max` (no target), beside it: the single worst
//!   interval error of each class in that window.
//!
//! Where the worst cases come from (stalls of the virtual CPU by the host, other
//! programs' kernel sections in a kernel that does not preempt) and the full runs are
//! in `doc/midi.md`.
//!
//! # Chords
//!
//! Issue 25's experiment ([`CHORD_SIZES`]): chords due at one instant through the output
//! library onto a cable, beside one write of the same bytes to a socket pair by a thread
//! of the same class sleeping until the due time, alternating, no load; from the due
//! time to the read that completes the chord. Headlines `midi_chord256_last_us` (p99,
//! absolute target [`CHORD_BUDGET_US`]) and `midi_chord256_vs_one_write` (medians,
//! target [`CHORD_VS_ONE_WRITE`]).

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ictus_midi::device::cable::{CableIn, CableOut};
use ictus_midi::device::{sleep_until, Device};
use ictus_midi::output::{Close, Output, OutputOptions};
use ictus_midi::{Kind, Message, Parser};
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_rt::{clock, Time};
use serde_json::json;

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
/// The side-by-side window is cut into segments of this many seconds; the headline
/// `midi_fifo_vs_timesharing_max` compares the medians of the segments' worst errors.
pub const SEGMENT_SECS: u64 = 5;
/// In the side-by-side window, the timesharing output's messages are due this long
/// after the fixed-priority output's: half a period, so that its timer threads wake
/// alone. (Due at the same instants, the timesharing threads ran right after the
/// fixed-priority ones had written and slept — the scheduling point their wake-up
/// made — and so borrowed the fixed priority's promptness: in one run, with a timer
/// thread on each CPU, 134 µs against 119 µs. With one timer thread, a stall of the
/// virtual CPU could hit one output and miss the other at any offset but zero; with a
/// timer thread on each CPU, a stall of one virtual CPU delays neither.)
pub const SIDE_OFFSET: Duration = Duration::from_millis(5);

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
    /// For each of `errors`, the number of the pair's first message.
    pub pairs: Vec<u64>,
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
            a.pairs.push(k as u64);
        }
    }
    a
}

impl Analysis {
    /// The worst interval error and the number of its pair's first message.
    pub fn worst(&self) -> Option<(u64, u64)> {
        self.errors.iter().zip(&self.pairs).map(|(&e, &k)| (e, k)).max_by_key(|&(e, _)| e)
    }

    /// The worst interval error of each segment of `per` messages (a pair belongs to
    /// the segment of its first message), for the segments that have a pair.
    pub fn segment_worsts(&self, per: u64) -> Vec<u64> {
        let mut worst: Vec<Option<u64>> = Vec::new();
        for (&e, &k) in self.errors.iter().zip(&self.pairs) {
            let i = (k / per.max(1)) as usize;
            if worst.len() <= i {
                worst.resize(i + 1, None);
            }
            worst[i] = Some(worst[i].map_or(e, |w| w.max(e)));
        }
        worst.into_iter().flatten().collect()
    }
}

/// The median of nanosecond counts.
fn median_ns(values: &[u64]) -> Option<f64> {
    crate::stats::median(values.iter().map(|&v| v as f64))
}

/// Steal time per CPU from the text of `/proc/stat`: `(cpu, steal)` in clock ticks
/// (`USER_HZ`), the eighth number of each `cpuN` line. Lines that do not parse are
/// left out.
pub fn parse_steal(stat: &str) -> Vec<(usize, u64)> {
    stat.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let cpu = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let steal = f.nth(7)?.parse().ok()?;
            Some((cpu, steal))
        })
        .collect()
}

/// Minor and major page faults from the text of `/proc/<pid>/task/<tid>/stat`
/// (fields 10 and 12, counted after the command name, which may hold spaces and
/// parentheses).
pub fn parse_task_faults(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid pgrp session tty_nr tpgid flags minflt(10) cminflt majflt(12).
    Some((f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?))
}

/// Per-CPU steal ticks now (empty where `/proc/stat` cannot be read).
fn read_steal() -> Vec<(usize, u64)> {
    std::fs::read_to_string("/proc/stat").map(|s| parse_steal(&s)).unwrap_or_default()
}

/// Steal between two readings, per CPU, in ms.
fn steal_ms(before: &[(usize, u64)], after: &[(usize, u64)]) -> Vec<(usize, u64)> {
    let tick_ms = 1000 / rustix::param::clock_ticks_per_second().max(1);
    after
        .iter()
        .filter_map(|&(cpu, a)| {
            let b = before.iter().find(|&&(c, _)| c == cpu)?.1;
            Some((cpu, a.saturating_sub(b) * tick_ms))
        })
        .collect()
}

fn format_steal(ms: &[(usize, u64)]) -> String {
    if ms.is_empty() {
        return "unknown".into();
    }
    ms.iter().map(|(c, v)| format!("cpu{c} {v} ms")).collect::<Vec<_>>().join(", ")
}

/// Page faults (minor, major) of output `id`'s two threads so far; `None` if they
/// cannot be found.
fn output_faults(id: u64) -> Option<(u64, u64)> {
    let names = [Output::thread_name(id, "timer"), Output::thread_name(id, "send")];
    let mut total = (0, 0);
    let mut found = 0;
    for e in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if names.iter().any(|n| n == comm.trim()) {
            let (min, maj) = parse_task_faults(&std::fs::read_to_string(e.path().join("stat")).ok()?)?;
            total = (total.0 + min, total.1 + maj);
            found += 1;
        }
    }
    (found == 2).then_some(total)
}

/// When the output library wrote message `k`, and on which CPU.
#[derive(Clone, Copy, Debug)]
struct WriteRecord {
    k: u32,
    at: u64,
    cpu: u32,
}

/// The write records of one output, shared with its [`LoggedCable`].
type WriteLog = Arc<Mutex<Vec<WriteRecord>>>;

/// The sending end of a cable that notes the time and CPU of every write (a clock
/// reading and `getcpu`, tens of ns), to tell where an outlier happened.
#[derive(Debug)]
struct LoggedCable {
    inner: CableOut,
    log: WriteLog,
}

impl Device for LoggedCable {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> std::io::Result<usize> {
        self.inner.read(buf, timeout)
    }
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let at = clock::now().as_nanos();
        let cpu = rustix::thread::sched_getcpu() as u32;
        let n = self.inner.write(bytes)?;
        // The output library writes the messages due together in one write, each as a
        // whole note-on (no running status): a record for each note written whole.
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        for note in bytes[..n].chunks_exact(3) {
            if let &[0x90, key, vel] = note {
                if vel >= 1 {
                    let k = u64::from(key) + 128 * u64::from(vel - 1);
                    log.push(WriteRecord { k: k as u32, at, cpu });
                }
            }
        }
        Ok(n)
    }
    fn wait_writable(&mut self, timeout: Option<Duration>) -> std::io::Result<bool> {
        self.inner.wait_writable(timeout)
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd()
    }
    fn lost_bytes(&self) -> u64 {
        self.inner.lost_bytes()
    }
}

/// Where and when a window's worst interval error happened.
#[derive(Clone, Debug)]
struct Worst {
    error: u64,
    /// Seconds after the window's first due time that the interval ended.
    at_s: f64,
    /// The CPUs the output library wrote the pair's two messages on.
    writer_cpus: (Option<u32>, Option<u32>),
    /// The CPU the receiver ran on when the second message arrived.
    receiver_cpu: Option<u32>,
    /// How late after its due time the output library wrote the pair's second message.
    write_late: Option<i64>,
}

impl Worst {
    fn describe(&self) -> String {
        let c = |c: Option<u32>| c.map_or("?".to_string(), |c| c.to_string());
        let late = self.write_late.map_or("?".to_string(), |l| {
            if l < 0 {
                format!("-{}", format_ns(-l as f64))
            } else {
                format_ns(l as f64)
            }
        });
        format!(
            "{} at {:.2} s: written on cpu {} then {} (the second {late} after its time), received on cpu {}",
            format_ns(self.error as f64),
            self.at_s,
            c(self.writer_cpus.0),
            c(self.writer_cpus.1),
            c(self.receiver_cpu)
        )
    }
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
    /// Run side by side with the other class (the headline's window), not alone.
    side: bool,
    granted: String,
    /// On the kernel's arrival stamps.
    analysis: Analysis,
    /// On the receiver's own clock readings after each read (its wake-up included).
    analysis_user: Analysis,
    /// cyclictest's wake-up latencies, ns, one run (in wake-up order) per window.
    cyclictest: Vec<Vec<u64>>,
    output_late: u64,
    sent: u64,
    /// Steal time per CPU during the window, ms.
    steal: Vec<(usize, u64)>,
    /// Page faults (minor, major) of the output threads while messages were due.
    faults: Option<(u64, u64)>,
    /// The worst interval error, where and when.
    worst: Option<Worst>,
}

impl Window {
    /// How a row names it.
    fn label(&self) -> String {
        if self.side {
            format!("{} side by side, {}", self.load, self.sched.name())
        } else {
            format!("{} {}", self.load, self.sched.name())
        }
    }
}

/// Every cyclictest wake-up latency of several runs in one recorder; `None` without
/// samples.
fn cyclictest_recorder(runs: &[Vec<u64>]) -> Option<LatencyRecorder> {
    let r = recorder(&runs.concat());
    (r.count() > 0).then_some(r)
}

/// cyclictest's interval errors over several runs (see [`cyclictest_interval_errors`]).
fn cyclictest_errors(runs: &[Vec<u64>]) -> Vec<u64> {
    runs.iter().flat_map(|r| cyclictest_interval_errors(r, INTERVAL.as_nanos() as u64)).collect()
}

/// The paper's measure on cyclictest's wake-ups: |interval − nominal| between
/// consecutive wake-ups, from their latencies (`latencies[i]` = wake-up `i` − its due
/// time). cyclictest's due times are `nominal` apart, except that after a wake-up late
/// by more than a period it skips the periods already past (its `next += interval`
/// while `now > next`); so wake-up `i + 1` is due `m·nominal` after wake-up `i`'s due
/// time, `m = max(1, ⌈latencies[i] / nominal⌉)`, and the interval between the two
/// wake-ups is `m·nominal + latencies[i + 1] − latencies[i]`.
pub fn cyclictest_interval_errors(latencies: &[u64], nominal: u64) -> Vec<u64> {
    let nominal = i128::from(nominal.max(1));
    latencies
        .windows(2)
        .map(|w| {
            let (a, b) = (i128::from(w[0]), i128::from(w[1]));
            let periods = ((a + nominal - 1) / nominal).max(1);
            ((periods - 1) * nominal + b - a).unsigned_abs() as u64
        })
        .collect()
}

/// cyclictest's per-wake-up output (`-v -N`): lines `thread: cycle: latency`, the
/// latency in ns. The latencies of thread 0, in cycle order; an error if a line that
/// looks like a sample does not parse, if cycles are missing, or if there are none.
pub fn parse_cyclictest_samples(text: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').map(str::trim).collect();
        if fields.len() != 3 || !fields.iter().all(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let parse = |f: &str| f.parse::<u64>().map_err(|e| format!("cyclictest line {line:?}: {e}"));
        let (thread, cycle, latency) = (parse(fields[0])?, parse(fields[1])?, parse(fields[2])?);
        if thread != 0 {
            continue;
        }
        if cycle != out.len() as u64 {
            return Err(format!("cyclictest: cycle {cycle} where {} was expected", out.len()));
        }
        out.push(latency);
    }
    if out.is_empty() {
        return Err("cyclictest printed no samples".into());
    }
    Ok(out)
}

fn recorder(samples: &[u64]) -> LatencyRecorder {
    let mut r = LatencyRecorder::new();
    r.record_all(samples);
    r
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
/// none), `u64` the receiver's own clock reading after the read, `u32` the CPU the
/// receiver ran on.
const RECORD: usize = 24;

/// The receiver process: `CABLE COUNT FD MAX_MS`. Binds the cable, writes `R` on the
/// descriptor, then records the arrival of each message (`RECORD` bytes) until it
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
        // The kernel stamps each write's wake-up of this receiver (`SO_TIMESTAMPNS`) as
        // the writer makes it: the paper's instrument stamped arrivals in its interrupt
        // handler, so its own scheduling was not part of what it measured.
        let mut input = CableIn::open(cable).map_err(|e| format!("cable {cable}: {e}"))?.with_arrival_stamps();
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
            let (n, stamp) = match input.read_stamped(&mut buf, Some(Duration::from_millis(100))) {
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                Err(e) => return Err(e.to_string()),
            };
            let user = clock::now();
            let cpu = rustix::thread::sched_getcpu() as u32;
            last = Some(Instant::now());
            let kernel = stamp.map_or(0, |s| (i128::from(s) - offset).clamp(0, i128::from(u64::MAX)) as u64);
            for &b in &buf[..n] {
                for m in parser.feed(b, user) {
                    if let Some(k) = number_of(&m) {
                        records.extend_from_slice(&(k as u32).to_le_bytes());
                        records.extend_from_slice(&kernel.to_le_bytes());
                        records.extend_from_slice(&user.as_nanos().to_le_bytes());
                        records.extend_from_slice(&cpu.to_le_bytes());
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

/// Arrival records: `(number, kernel stamp, receiver's reading)` and `(number, CPU)`;
/// a missing kernel stamp is the receiver's reading.
fn parse_records(bytes: &[u8]) -> (Arrivals, Arrivals, Vec<(u64, u32)>) {
    let mut kernel = Vec::new();
    let mut user = Vec::new();
    let mut cpus = Vec::new();
    for c in bytes.chunks_exact(RECORD) {
        let k = u64::from(u32::from_le_bytes(c[..4].try_into().unwrap_or([0; 4])));
        let kt = u64::from_le_bytes(c[4..12].try_into().unwrap_or([0; 8]));
        let ut = u64::from_le_bytes(c[12..20].try_into().unwrap_or([0; 8]));
        let cpu = u32::from_le_bytes(c[20..24].try_into().unwrap_or([0; 4]));
        user.push((k, Time::from_nanos(ut)));
        kernel.push((k, Time::from_nanos(if kt == 0 { ut } else { kt })));
        cpus.push((k, cpu));
    }
    (kernel, user, cpus)
}

/// cyclictest running in a window, its output read as it comes (a pipe would fill
/// with a long window's samples).
struct Cyclictest {
    child: Child,
    reader: Option<JoinHandle<String>>,
}

impl Cyclictest {
    /// One thread at 100 Hz in `sched`'s class for `loops` wake-ups, each printed in
    /// ns (`-v -N`).
    fn start(sched: Sched, loops: u64) -> std::io::Result<Cyclictest> {
        let (policy, prio) = sched.cyclictest_policy();
        let mut child = crate::alarm::cyclictest_command(policy, prio, INTERVAL, loops, &["-v", "-N"]).spawn()?;
        let mut out = child.stdout.take();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(out) = out.as_mut() {
                let _ = out.read_to_string(&mut text);
            }
            text
        });
        Ok(Cyclictest { child, reader: Some(reader) })
    }

    /// Its wake-up latencies, once it has finished.
    fn finish(mut self) -> Result<Vec<u64>, String> {
        let text = self.reader.take().and_then(|r| r.join().ok()).unwrap_or_default();
        let status = self.child.wait().map_err(|e| e.to_string())?;
        parse_cyclictest_samples(&text).map_err(|e| format!("{e} (exit {status})"))
    }
}

impl Drop for Cyclictest {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Kilobytes of this process's memory that are locked (`VmLck`), if known.
fn locked_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmLck:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Lock this process's memory (`mlockall(MCL_CURRENT | MCL_FUTURE)`) unless something
/// already locked some of it; whether this call locked it. A refusal is noted.
fn lock_memory(notes: &mut Vec<String>) -> bool {
    if locked_kib().is_some_and(|k| k > 0) {
        notes.push("the sender's memory was already (partly) locked; left as it was".into());
        return false;
    }
    let g = configure_current_thread(&ThreadRequest { lock_memory: true, ..ThreadRequest::default() });
    match g.refusal(ictus_rt::thread::RefusalKind::MemoryLock) {
        Some(r) => {
            notes.push(format!("the sender's memory could not be locked: {r}"));
            false
        }
        None => true,
    }
}

/// Undo [`lock_memory`].
fn unlock_memory() {
    // SAFETY: munlockall takes no arguments and changes no memory contents.
    unsafe {
        libc::munlockall();
    }
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

/// A receiver process holding one cable, and the thread collecting its records. One
/// dropped without [`Receiver::finish`] (a window that failed) is killed and reaped.
struct Receiver {
    cable: String,
    child: Option<Child>,
    reader: Option<JoinHandle<Vec<u8>>>,
}

impl Receiver {
    /// Start a receiver for `n` messages and wait until it holds its cable.
    fn start(n: u64) -> Result<Receiver, BenchError> {
        let cable = unique_cable();
        let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| BenchError::io("midi: pipe", e.into()))?;
        let mut rd = std::fs::File::from(rd);
        let max_ms = (AHEAD + INTERVAL * n as u32 + Duration::from_secs(10)).as_millis();
        let args =
            vec![cable.clone(), n.to_string(), std::os::fd::AsRawFd::as_raw_fd(&wr).to_string(), max_ms.to_string()];
        let mut child = spawn_child("midi-receiver", &args, &[wr.as_fd()])
            .map_err(|e| BenchError::io("midi: spawn receiver", e))?;
        drop(wr);
        let mut ready = [0u8; 1];
        if rd.read_exact(&mut ready).is_err() || ready != *b"R" {
            let status = reap_status(&mut child, Duration::from_secs(5));
            return Err(BenchError::io(
                "midi: the receiver did not start",
                std::io::Error::other(format!("{status:?}")),
            ));
        }
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = rd.read_to_end(&mut all);
            all
        });
        Ok(Receiver { cable, child: Some(child), reader: Some(reader) })
    }

    /// The records it wrote, once it has exited.
    fn finish(mut self) -> Vec<u8> {
        let records = self.reader.take().and_then(|r| r.join().ok()).unwrap_or_default();
        if let Some(mut child) = self.child.take() {
            let _ = reap_status(&mut child, Duration::from_secs(5));
        }
        records
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An output library on a logged cable, its threads in class `sched`, with a timer
/// thread on each CPU where the class allows it ([`timer_cpus`]).
fn open_output(cable: &str, sched: Sched, n: u64) -> Result<(Output, WriteLog, String), BenchError> {
    let device = CableOut::open(cable, None).map_err(|e| BenchError::io("midi: cable", std::io::Error::other(e)))?;
    // Written through once here, so that the output threads' first writes to it take no
    // page fault (its memory may be reused heap that the receiver's fork made
    // copy-on-write).
    let mut records = vec![WriteRecord { k: 0, at: 0, cpu: 0 }; n as usize + 16];
    records.clear();
    let log = Arc::new(Mutex::new(records));
    let device = LoggedCable { inner: device, log: Arc::clone(&log) };
    let options = OutputOptions { thread: sched.request(), timer_cpus: timer_cpus(sched), ..OutputOptions::default() };
    let output = Output::open(Box::new(device), options)
        .map_err(|e| BenchError::io("midi: output", std::io::Error::other(e.to_string())))?;
    let threads = output.granted();
    let mut granted: Vec<String> = threads.iter().map(|(role, g)| format!("{role}: {}", g.describe())).collect();
    if threads.iter().any(|(_, g)| g.refusal(ictus_rt::thread::RefusalKind::Affinity).is_some()) {
        granted.push("CPU placement refused".into());
    }
    Ok((output, log, granted.join(", ")))
}

/// The CPUs the output library runs a timer thread on, in every window of class
/// `sched` (`OutputOptions::timer_cpus`): one on each CPU this process may use, racing
/// for each due message, so that a virtual CPU the host stops at a due time (or a CPU
/// busy in a kernel section that does not preempt) delays no message while the other
/// runs. Not for deadline threads: the kernel refuses to pin them (a deadline task
/// must span its root domain), so those windows keep one timer thread.
fn timer_cpus(sched: Sched) -> Vec<usize> {
    match sched {
        Sched::Timesharing | Sched::Fixed => ictus_rt::thread::current_affinity().unwrap_or_default(),
        Sched::Deadline => Vec::new(),
    }
}

/// The producer: keeps `n` messages, due at `t0 + k·INTERVAL`, queued about [`AHEAD`]
/// ahead, calling `at_start` once just before `t0`; returns when all are queued and
/// `at_start` has run. Failed puts are noted.
fn produce(output: &Output, n: u64, t0: Time, mut at_start: impl FnMut(), failures: &mut Vec<String>) {
    let mut next = 0u64;
    let mut started = false;
    loop {
        let now = clock::now();
        while next < n && t0 + INTERVAL * next as u32 <= now + AHEAD {
            if let Some(m) = message_for(next) {
                if let Err(e) = output.put(m, t0 + INTERVAL * next as u32) {
                    failures.push(format!("put failed: {e}"));
                }
            }
            next += 1;
        }
        if !started && now + Duration::from_millis(60) >= t0 {
            sleep_until(t0);
            at_start();
            started = true;
        }
        if next >= n && started {
            break;
        }
        sleep_until(now + Duration::from_millis(50));
    }
}

/// What one output's run measured, put together from the receiver's records, the
/// write log and the steal and fault counts.
#[allow(clippy::too_many_arguments)]
fn assemble(
    load: &'static str,
    sched: Sched,
    side: bool,
    granted: String,
    records: &[u8],
    log: &Mutex<Vec<WriteRecord>>,
    closed: &ictus_midi::output::Closed,
    n: u64,
    t0: Time,
    steal: Vec<(usize, u64)>,
    faults: Option<(u64, u64)>,
    notes: &mut Vec<String>,
) -> Window {
    let (kernel, user, rx_cpus) = parse_records(records);
    let label =
        if side { format!("{load} side by side, {}", sched.name()) } else { format!("{load} {}", sched.name()) };
    let stamped = records.chunks_exact(RECORD).filter(|c| c[4..12] != [0; 8]).count();
    if stamped < kernel.len() {
        notes.push(format!(
            "{label}: {} of {} arrivals had no kernel timestamp (the receiver's own reading was used)",
            kernel.len() - stamped,
            kernel.len()
        ));
    }
    let analysis = analyse(&kernel, n, t0, INTERVAL);
    let analysis_user = analyse(&user, n, t0, INTERVAL);
    let worst = analysis.worst().map(|(error, k)| {
        let log = log.lock().unwrap_or_else(|e| e.into_inner());
        let wrote = |k: u64| log.iter().find(|r| u64::from(r.k) == k);
        let due = (t0 + INTERVAL * (k + 1) as u32).as_nanos();
        Worst {
            error,
            at_s: (INTERVAL * (k + 1) as u32).as_secs_f64(),
            writer_cpus: (wrote(k).map(|r| r.cpu), wrote(k + 1).map(|r| r.cpu)),
            receiver_cpu: rx_cpus.iter().find(|&&(j, _)| j == k + 1).map(|&(_, c)| c),
            write_late: wrote(k + 1).map(|r| r.at as i64 - due as i64),
        }
    });
    Window {
        load,
        sched,
        side,
        granted,
        analysis,
        analysis_user,
        cyclictest: Vec::new(),
        output_late: closed.stats.late + closed.stats.out_of_order,
        sent: closed.stats.sent,
        steal,
        faults,
        worst,
    }
}

fn faults_between(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    let (a, b) = (a?, b?);
    Some((b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)))
}

/// Run one window: `secs` seconds of messages, output threads in `sched`.
fn window(load: &'static str, sched: Sched, secs: u64, notes: &mut Vec<String>) -> Result<Window, BenchError> {
    let n = (secs * RATE_HZ).min(MAX_MESSAGES);
    let receiver = Receiver::start(n)?;
    let (output, log, granted) = open_output(&receiver.cable, sched, n)?;

    // The producer (this thread) is timesharing in every window, as an application's
    // own thread would be. It shares the output library's lock with the output threads;
    // the lock inherits priority, so a producer preempted while holding it runs at the
    // priority of a real-time output thread waiting for it (the paper found this
    // inversion in C-Threads' locks and had none to prevent it).
    let t0 = clock::now() + AHEAD + Duration::from_millis(20);
    let last_due = t0 + INTERVAL * (n.saturating_sub(1)) as u32;
    let mut cyclictest = None;
    let mut failures = Vec::new();
    let (mut steal0, mut faults0) = (Vec::new(), None);
    produce(
        &output,
        n,
        t0,
        || {
            steal0 = read_steal();
            faults0 = output_faults(output.id());
            cyclictest = Some(Cyclictest::start(sched, n));
        },
        &mut failures,
    );
    sleep_until(last_due + Duration::from_millis(200));
    let steal = steal_ms(&steal0, &read_steal());
    let faults = faults_between(faults0, output_faults(output.id()));
    let closed = output.close(Close::Drain);
    let records = receiver.finish();
    for f in failures {
        notes.push(format!("{load} {}: {f}", sched.name()));
    }
    let mut w = assemble(load, sched, false, granted, &records, &log, &closed, n, t0, steal, faults, notes);

    w.cyclictest = match cyclictest {
        Some(Ok(c)) => match c.finish() {
            Ok(samples) => vec![samples],
            Err(e) => {
                notes.push(format!("cyclictest ({load}, {}): {e}", sched.name()));
                Vec::new()
            }
        },
        Some(Err(e)) => {
            notes.push(format!("cyclictest could not run ({e}); install Debian rt-tests (scripts/setup.sh)"));
            Vec::new()
        }
        None => Vec::new(),
    };
    Ok(w)
}

/// The side-by-side window: a fixed-priority output and a timesharing output of the
/// same library, at once, under the same load, each on its own cable with its own
/// receiver and its own (timesharing) producer, so that both meet the same
/// machine at the same time — the host's stalls of a virtual CPU, other programs'
/// kernel sections — and only the class differs. Each has a timer thread on every CPU
/// ([`timer_cpus`]); the timesharing output's messages are due [`SIDE_OFFSET`] after
/// the fixed-priority output's.
fn side_by_side(load: &'static str, secs: u64, notes: &mut Vec<String>) -> Result<Vec<Window>, BenchError> {
    let n = (secs * RATE_HZ).min(MAX_MESSAGES);
    let rx_fixed = Receiver::start(n)?;
    let rx_ts = Receiver::start(n)?;
    let (out_fixed, log_fixed, granted_fixed) = open_output(&rx_fixed.cable, Sched::Fixed, n)?;
    let (out_ts, log_ts, granted_ts) = open_output(&rx_ts.cable, Sched::Timesharing, n)?;
    let t0 = clock::now() + AHEAD + Duration::from_millis(20);
    let t0_ts = t0 + SIDE_OFFSET;
    let last_due = t0_ts + INTERVAL * (n.saturating_sub(1)) as u32;
    let mut steal0 = Vec::new();
    let (mut faults0_fixed, mut faults0_ts) = (None, None);
    let (mut fail_fixed, mut fail_ts) = (Vec::new(), Vec::new());
    std::thread::scope(|scope| {
        // Both producers timesharing, as in the other windows (see `window`).
        let ts = scope.spawn(|| {
            produce(&out_ts, n, t0_ts, || faults0_ts = output_faults(out_ts.id()), &mut fail_ts);
        });
        let fixed = scope.spawn(|| {
            produce(
                &out_fixed,
                n,
                t0,
                || {
                    steal0 = read_steal();
                    faults0_fixed = output_faults(out_fixed.id());
                },
                &mut fail_fixed,
            );
        });
        let _ = ts.join();
        let _ = fixed.join();
    });
    sleep_until(last_due + Duration::from_millis(200));
    let steal = steal_ms(&steal0, &read_steal());
    let faults_fixed = faults_between(faults0_fixed, output_faults(out_fixed.id()));
    let faults_ts = faults_between(faults0_ts, output_faults(out_ts.id()));
    let closed_fixed = out_fixed.close(Close::Drain);
    let closed_ts = out_ts.close(Close::Drain);
    let (rec_fixed, rec_ts) = (rx_fixed.finish(), rx_ts.finish());
    for f in fail_fixed {
        notes.push(format!("{load} side by side, fixed: {f}"));
    }
    for f in fail_ts {
        notes.push(format!("{load} side by side, timesharing: {f}"));
    }
    let fixed = assemble(
        load,
        Sched::Fixed,
        true,
        granted_fixed,
        &rec_fixed,
        &log_fixed,
        &closed_fixed,
        n,
        t0,
        steal.clone(),
        faults_fixed,
        notes,
    );
    let ts = assemble(
        load,
        Sched::Timesharing,
        true,
        granted_ts,
        &rec_ts,
        &log_ts,
        &closed_ts,
        n,
        t0_ts,
        steal,
        faults_ts,
        notes,
    );
    Ok(vec![fixed, ts])
}

/// Merge the windows of the same load, class and kind (rounds).
fn merge(windows: Vec<Window>) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    for w in windows {
        match out.iter_mut().find(|o| o.load == w.load && o.sched == w.sched && o.side == w.side) {
            Some(o) => {
                // Later rounds' pairs are numbered after the earlier rounds' messages.
                let offset = o.analysis.pairs.iter().max().map_or(0, |m| m + 2);
                o.analysis.errors.extend(w.analysis.errors);
                o.analysis.pairs.extend(w.analysis.pairs.iter().map(|k| k + offset));
                o.analysis.intervals.extend(w.analysis.intervals);
                o.analysis.latencies.extend(w.analysis.latencies);
                o.analysis.lost += w.analysis.lost;
                o.analysis_user.errors.extend(w.analysis_user.errors);
                o.analysis.strays += w.analysis.strays;
                o.output_late += w.output_late;
                o.sent += w.sent;
                o.cyclictest.extend(w.cyclictest);
                for (cpu, ms) in w.steal {
                    match o.steal.iter_mut().find(|(c, _)| *c == cpu) {
                        Some((_, v)) => *v += ms,
                        None => o.steal.push((cpu, ms)),
                    }
                }
                o.faults = match (o.faults, w.faults) {
                    (Some(a), Some(b)) => Some((a.0 + b.0, a.1 + b.1)),
                    _ => None,
                };
                if w.worst.as_ref().map(|x| x.error) > o.worst.as_ref().map(|x| x.error) {
                    o.worst = w.worst;
                }
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
    let side_secs: u64 = if opts.quick { SEGMENT_SECS } else { 12 * SEGMENT_SECS };
    let mut notes = Vec::new();
    // Lock this process's memory (the sender's), for every window alike, so that no
    // output thread waits for a page; the receivers lock theirs. Undone at the end.
    let locked = lock_memory(&mut notes);
    let steal_start = read_steal();
    let started = Instant::now();
    let loads: Vec<Option<LoadKind>> = if opts.quick {
        vec![None, Some(LoadKind::Cpu)]
    } else {
        vec![None, Some(LoadKind::Cpu), Some(LoadKind::Disk), Some(LoadKind::Net), Some(LoadKind::Mem)]
    };
    let mut windows = Vec::new();
    for load in &loads {
        let load_name = load.map_or("none", LoadKind::name);
        let side = *load == Some(LoadKind::Cpu);
        let per_load = Duration::from_secs(
            (secs + 3) * (Sched::ALL.len() * rounds) as u64 + 20 + if side { side_secs + 5 } else { 0 },
        );
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
        if side {
            if opts.progress {
                eprintln!("midi: load {load_name}, fixed and timesharing side by side, {side_secs} s");
            }
            match side_by_side(load_name, side_secs, &mut notes) {
                Ok(ws) => windows.extend(ws),
                Err(e) => notes.push(format!("{load_name} side by side: {e}")),
            }
        }
        if let Some(p) = running {
            p.stop();
        }
    }
    let windows = merge(windows);
    if opts.progress {
        eprintln!("midi: chords of {CHORD_SIZES:?} events due at one instant, ours and one write side by side");
    }
    let chord_trials = if opts.quick { 100 } else { 500 };
    let chords = chords(chord_trials, &mut notes);
    let steal_run = steal_ms(&steal_start, &read_steal());
    if locked {
        unlock_memory();
    }

    conditions.rt_privileges = ictus_rt::thread::rt_privileges();
    let mut report = Report::new("midi", "000 §5, Table 1 and Figure 1", opts.quick, conditions.finish());
    report.conditions.policy = format!(
        "output threads timesharing / SCHED_FIFO {FIFO_PRIORITY} / SCHED_DEADLINE (see rows' granted); receiver SCHED_FIFO {RECEIVER_PRIORITY}"
    );
    report.conditions.pinned = match timer_cpus(Sched::Fixed) {
        cpus if cpus.len() > 1 => format!(
            "the output library's timer threads, one on each of cpus {cpus:?} (timesharing and fixed-priority windows; a deadline thread cannot be pinned); nothing else"
        ),
        _ => "none".into(),
    };
    notes.insert(
        0,
        format!(
            "steal time (the host running something else on a virtual CPU, /proc/stat) during the {:.0} s run: {}; per window in the rows ('steal')",
            started.elapsed().as_secs_f64(),
            format_steal(&steal_run)
        ),
    );
    if !report.conditions.rt_privileges {
        notes.push(
            "real-time scheduling was refused: fixed-priority and deadline rows ran timesharing (see granted)".into(),
        );
    }
    let per_segment = SEGMENT_SECS * RATE_HZ;
    for w in &windows {
        let a = &w.analysis;
        let label = w.label();
        let base = |case: String, r: &LatencyRecorder, what: &str| {
            let mut row = r
                .row(case)
                .with("load", w.load)
                .with("sched", w.sched.name())
                .with("measure", what)
                .with("granted", w.granted.as_str())
                .with("lost", a.lost)
                .with("late_puts", w.output_late)
                .with("steal", format_steal(&w.steal))
                .with(
                    "output_faults",
                    w.faults.map_or("unknown".to_string(), |(min, maj)| format!("{min} minor, {maj} major")),
                )
                .with("worst", w.worst.as_ref().map_or("-".to_string(), Worst::describe))
                .to_value();
            if w.side {
                let seg = a.segment_worsts(per_segment);
                row["segment_s"] = json!(SEGMENT_SECS);
                row["median_segment_worst_ns"] = json!(median_ns(&seg));
                row["segment_worsts_ns"] = json!(seg);
            }
            row
        };
        if !a.errors.is_empty() {
            report.rows.push(base(
                format!("{label}: interval error"),
                &recorder(&a.errors),
                "interval error |Δ − 10 ms|",
            ));
        }
        if !w.analysis_user.errors.is_empty() {
            report.rows.push(base(
                format!("{label}: interval error, receiver's reading"),
                &recorder(&w.analysis_user.errors),
                "interval error on the receiver's clock reading after its wake-up",
            ));
        }
        if !a.latencies.is_empty() {
            report.rows.push(base(format!("{label}: delivery latency"), &recorder(&a.latencies), "arrival − due"));
        }
        let (p, prio) = w.sched.cyclictest_policy();
        let cyclictest_row = |case: &str, r: &LatencyRecorder, what: &str| {
            r.row(format!("{} {}: {case}", w.load, w.sched.name()))
                .with("load", w.load)
                .with("sched", w.sched.name())
                .with("measure", what)
                .with("granted", format!("{p} {prio}"))
                .with("lost", 0u64)
                .with("late_puts", 0u64)
                .to_value()
        };
        if let Some(c) = cyclictest_recorder(&w.cyclictest) {
            report.rows.push(cyclictest_row("cyclictest", &c, "cyclictest wake-up latency, 100 Hz"));
            let errors = cyclictest_errors(&w.cyclictest);
            if !errors.is_empty() {
                report.rows.push(cyclictest_row(
                    "cyclictest, interval error",
                    &recorder(&errors),
                    "interval error |Δ − 10 ms| between cyclictest's consecutive wake-ups",
                ));
            }
        }
        if a.strays > 0 {
            notes.push(format!("{} {}: {} arrivals were not ours or came twice", w.load, w.sched.name(), a.strays));
        }
    }
    report.hidden_in_table = ["load", "sched", "measure", "mean_ns", "output_faults", "worst", "segment_worsts_ns"]
        .into_iter()
        .map(String::from)
        .collect();

    let find = |load: &str, sched: Sched| windows.iter().find(|w| w.load == load && w.sched == sched && !w.side);
    let find_side = |sched: Sched| windows.iter().find(|w| w.side && w.sched == sched);
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
            let peer_name = |what: &str| {
                format!("cyclictest (rt-tests) SCHED_FIFO {FIFO_PRIORITY}, 100 Hz, same window, CPU load: {what}")
            };
            let ours = recorder(&w.analysis.errors).quantile(0.99) as f64;
            report.headline.push(
                Headline::new(
                    "midi_fifo_p99_vs_cyclictest",
                    ours,
                    c.quantile(0.99) as f64,
                    peer_name("its wake-up latency p99; ours is the interval error p99"),
                    "ns",
                    Better::Lower,
                )
                .with_target(1.5),
            );
            // The same measure on both sides: the interval error counts a late message
            // twice (the interval before it and the one after), a wake-up latency once.
            let errors = cyclictest_errors(&w.cyclictest);
            if !errors.is_empty() {
                report.headline.push(Headline::new(
                    "midi_fifo_p99_vs_cyclictest_interval",
                    ours,
                    recorder(&errors).quantile(0.99) as f64,
                    peer_name("the interval error p99 between its consecutive wake-ups, ours likewise"),
                    "ns",
                    Better::Lower,
                ));
            }
            if !w.analysis.latencies.is_empty() {
                report.headline.push(Headline::new(
                    "midi_fifo_latency_p99_vs_cyclictest",
                    recorder(&w.analysis.latencies).quantile(0.99) as f64,
                    c.quantile(0.99) as f64,
                    peer_name("its wake-up latency p99; ours is the delivery latency p99 (arrival − due)"),
                    "ns",
                    Better::Lower,
                ));
            }
        }
    }
    match (find_side(Sched::Fixed), find_side(Sched::Timesharing)) {
        (Some(f), Some(t)) if !f.analysis.errors.is_empty() && !t.analysis.errors.is_empty() => {
            let (seg_f, seg_t) = (f.analysis.segment_worsts(per_segment), t.analysis.segment_worsts(per_segment));
            let (abs_f, abs_t) = (max_err(f).unwrap_or(0), max_err(t).unwrap_or(0));
            if let (Some(ours), Some(peer)) = (median_ns(&seg_f), median_ns(&seg_t)) {
                report.headline.push(
                    Headline::new(
                        "midi_fifo_vs_timesharing_max",
                        ours,
                        peer,
                        format!(
                            "timesharing threads of the same output library, side by side in one window under CPU load, due {} ms after ours; ours and peer are the median over {} {SEGMENT_SECS}-s segments of each segment's worst interval error; absolute worst: fixed {}, timesharing {}",
                            SIDE_OFFSET.as_millis(),
                            seg_f.len().min(seg_t.len()),
                            format_ns(abs_f as f64),
                            format_ns(abs_t as f64)
                        ),
                        "ns",
                        Better::Lower,
                    )
                    .with_target(0.5),
                );
            }
            report.headline.push(Headline::new(
                "midi_fifo_vs_timesharing_abs_max",
                abs_f as f64,
                abs_t as f64,
                "timesharing, the same side-by-side window: the single worst interval error of each class, no segments",
                "ns",
                Better::Lower,
            ));
            notes.push(format!(
                "side by side under CPU load, worst of each {SEGMENT_SECS}-s segment: fixed {}; timesharing {}",
                seg_f.iter().map(|&v| format_ns(v as f64)).collect::<Vec<_>>().join(", "),
                seg_t.iter().map(|&v| format_ns(v as f64)).collect::<Vec<_>>().join(", ")
            ));
        }
        _ => notes.push("the side-by-side window did not run: no midi_fifo_vs_timesharing_max".into()),
    }
    match &chords {
        Ok(c) => report_chords(&mut report, c, &mut notes),
        Err(e) => notes.push(format!("the chord experiment failed: {e}")),
    }
    for w in windows.iter().filter(|w| w.load == "cpu" && w.sched != Sched::Deadline) {
        if let Some(worst) = &w.worst {
            notes.push(format!(
                "{}: worst interval error {}; steal {}; output threads' page faults {}",
                w.label(),
                worst.describe(),
                format_steal(&w.steal),
                w.faults.map_or("unknown".to_string(), |(min, maj)| format!("{min} minor, {maj} major"))
            ));
        }
    }
    notes.push(format!(
        "{secs} s per window, {rounds} round(s) of timesharing, fixed priority and deadline per load (Table 1: each class in its own window); under CPU load also one {side_secs}-s window with a fixed-priority and a timesharing output side by side (each its own cable, receiver and producer; producers timesharing in every window, the output library's lock inheriting priority; the timesharing messages due {} ms after the fixed-priority ones, so that its threads wake alone); the output library runs a timer thread on each CPU in the timesharing and fixed-priority windows, one in the deadline windows (a deadline thread cannot be pinned); 100 messages/s enqueued {} s ahead; receivers SCHED_FIFO {RECEIVER_PRIORITY}, memory locked; the sender's memory {}",
        SIDE_OFFSET.as_millis(),
        AHEAD.as_secs(),
        if locked { "locked too (mlockall), for every window alike" } else { "not locked (see above)" }
    ));
    notes.push("interval error is the paper's measure, on the kernel's arrival stamps (SO_TIMESTAMPNS; the rows 'receiver's reading' add the receiver's own wake-up); cyclictest measures wake-up lateness, one wake-up per period, and its rows 'interval error' apply the paper's measure to its consecutive wake-ups (read with -v -N); an interval error counts a late message twice and a steady delay not at all; a due message is written by the output library's timer thread itself when the byte sender is idle (one wake-up, as in cyclictest), and handed to the byte sender only when the device is full or messages are queued".into());
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

// ---------------------------------------------------------------------------------
// The chord experiment (issue 25): many events due at one instant.
// ---------------------------------------------------------------------------------

/// The chord sizes: events due at one instant.
pub const CHORD_SIZES: [usize; 3] = [16, 64, 256];

/// The chord headline's size and its absolute budget: a dense instant (a game
/// soundtrack's reset of 16 channels, an orchestral downbeat) arrives whole within a
/// millisecond, as ALSA's sequencer delivers it to a virtual port.
pub const CHORD_HEADLINE: usize = 256;
/// `midi_chord256_last_us`'s target, µs.
pub const CHORD_BUDGET_US: f64 = 1000.0;
/// `midi_chord256_vs_one_write`'s target.
pub const CHORD_VS_ONE_WRITE: f64 = 3.0;

/// The `i`-th event of a chord: a note-on, each of the chord distinct.
fn chord_event(i: usize) -> Message {
    let key = (24 + i % 96) as u8;
    let vel = (1 + i / 96) as u8;
    Message::note_on((i % 16) as u8, key, vel, Time::ZERO).expect("a valid note")
}

/// A chord of `n` events, as the bytes one write carries (no running status, as the
/// output library writes by default).
fn chord_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| chord_event(i).bytes().to_vec()).collect()
}

/// Which side a chord trial measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChordSide {
    /// The output library: `n` messages put due at one instant, its timer thread writing
    /// them onto the cable; the receiver reads the cable.
    Ours,
    /// The floor: a thread of the same class sleeping until the due time and writing the
    /// same bytes with one `write` to a `SOCK_STREAM` socket pair; the same receiver
    /// reads the other end.
    OneWrite,
}

/// One trial for the receiver: where to read, what must come, and when it was due.
struct ChordTrial {
    side: ChordSide,
    expect: Vec<u8>,
    due: Time,
}

/// The receiver thread: reads each trial's bytes from its side until all have come and
/// answers the time of the read that completed them, minus the due time (ns), or why not.
fn chord_receiver(
    mut cable: CableIn,
    pair: OwnedFd,
    trials: std::sync::mpsc::Receiver<ChordTrial>,
    results: std::sync::mpsc::Sender<Result<u64, String>>,
) {
    configure_current_thread(&ThreadRequest {
        policy: Some(Policy::Fifo { priority: RECEIVER_PRIORITY }),
        timer_slack: Some(Duration::from_nanos(1)),
        ..ThreadRequest::default()
    });
    let mut buf = vec![0u8; 16 * 1024];
    let mut got = Vec::with_capacity(16 * 1024);
    let watchdog = Duration::from_secs(5);
    for t in trials {
        got.clear();
        let deadline = clock::now() + watchdog;
        let mut last = clock::now();
        let outcome = loop {
            if got.len() >= t.expect.len() {
                break if got == t.expect {
                    Ok(last.saturating_duration_since(t.due).as_nanos() as u64)
                } else {
                    Err(format!("{:?} chord of {} bytes arrived changed", t.side, t.expect.len()))
                };
            }
            let left = deadline.saturating_duration_since(clock::now());
            if left.is_zero() {
                break Err(format!("{:?}: {} of {} bytes in {watchdog:?}", t.side, got.len(), t.expect.len()));
            }
            let n = match t.side {
                ChordSide::Ours => match cable.read(&mut buf, Some(left)) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                    Err(e) => break Err(format!("cable: {e}")),
                },
                ChordSide::OneWrite => {
                    match ictus_midi::device::wait_fd(pair.as_fd(), rustix::event::PollFlags::IN, Some(left)) {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(e) => break Err(format!("socket pair: {e}")),
                    }
                    match rustix::io::read(&pair, &mut buf) {
                        Ok(n) => n,
                        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
                        Err(e) => break Err(format!("socket pair: {e}")),
                    }
                }
            };
            last = clock::now();
            got.extend_from_slice(&buf[..n]);
        };
        if results.send(outcome).is_err() {
            return;
        }
    }
}

/// The floor's writer thread: for each `(due, bytes)`, sleep until `due` and write the
/// bytes with one `write`.
fn chord_one_writer(pair: OwnedFd, jobs: std::sync::mpsc::Receiver<(Time, Vec<u8>)>) {
    configure_current_thread(&Sched::Fixed.request());
    for (due, bytes) in jobs {
        sleep_until(due);
        let mut off = 0;
        // One write takes it all (the socket's buffer is far larger than a chord); the
        // loop is only there so that a short write could not lose bytes.
        while off < bytes.len() {
            match rustix::io::write(&pair, &bytes[off..]) {
                Ok(n) => off += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    }
}

/// What the chord experiment measured: per size, ours and the floor (ns from due to the
/// last byte read), the output's counts.
#[derive(Debug)]
struct Chords {
    /// `(size, ours, one write)`.
    samples: Vec<(usize, Vec<u64>, Vec<u64>)>,
    /// The output library's writes per chord on the cable (its count over the trials).
    writes_per_chord: f64,
    granted: String,
}

/// The chord experiment: for each size, `trials` chords through the output library and
/// as many as one write to a socket pair, alternating (A B A B), each due a few
/// milliseconds after it is set up, nothing else loaded.
fn chords(trials: usize, notes: &mut Vec<String>) -> Result<Chords, BenchError> {
    let io = |what: &str, e: &dyn std::fmt::Display| {
        BenchError::io(format!("midi chords: {what}"), std::io::Error::other(e.to_string()))
    };
    let name = unique_cable();
    let cable = CableIn::open(&name).map_err(|e| io("cable", &e))?;
    let (pair_tx, pair_rx) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| io("socketpair", &e))?;
    let (trial_tx, trial_rx) = std::sync::mpsc::channel::<ChordTrial>();
    let (result_tx, result_rx) = std::sync::mpsc::channel();
    let receiver = std::thread::Builder::new()
        .name("chord-rx".into())
        .spawn(move || chord_receiver(cable, pair_rx, trial_rx, result_tx))
        .map_err(|e| io("thread", &e))?;
    let (job_tx, job_rx) = std::sync::mpsc::channel::<(Time, Vec<u8>)>();
    let writer = std::thread::Builder::new()
        .name("chord-write".into())
        .spawn(move || chord_one_writer(pair_tx, job_rx))
        .map_err(|e| io("thread", &e))?;
    let device = CableOut::open(&name, None).map_err(|e| io("cable", &e))?;
    let options = OutputOptions {
        thread: Sched::Fixed.request(),
        timer_cpus: timer_cpus(Sched::Fixed),
        ..OutputOptions::default()
    };
    let output = Output::open(Box::new(device), options).map_err(|e| io("output", &e))?;
    let granted =
        output.granted().iter().map(|(role, g)| format!("{role}: {}", g.describe())).collect::<Vec<_>>().join(", ");
    let lead = Duration::from_millis(4);
    let mut samples = Vec::new();
    let mut failures = 0usize;
    let mut chords_sent = 0u64;
    let writes_before = output.stats().writes;
    for n in CHORD_SIZES {
        let bytes = chord_bytes(n);
        let (mut ours, mut one) = (Vec::with_capacity(trials), Vec::with_capacity(trials));
        // Two of each first, not counted: the receiver's and writers' first pages.
        for k in 0..2 * trials + 4 {
            let side = if k % 2 == 0 { ChordSide::Ours } else { ChordSide::OneWrite };
            let due = clock::now() + lead;
            let _ = trial_tx.send(ChordTrial { side, expect: bytes.clone(), due });
            match side {
                ChordSide::Ours => {
                    for i in 0..n {
                        let _ = output.put(chord_event(i), due);
                    }
                    chords_sent += 1;
                }
                ChordSide::OneWrite => {
                    let _ = job_tx.send((due, bytes.clone()));
                }
            }
            match result_rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Ok(ns)) if k >= 4 => match side {
                    ChordSide::Ours => ours.push(ns),
                    ChordSide::OneWrite => one.push(ns),
                },
                Ok(Ok(_)) => {}
                Ok(Err(why)) => {
                    failures += 1;
                    if failures <= 3 {
                        notes.push(format!("chord of {n}: {why}"));
                    }
                }
                Err(_) => {
                    notes.push(format!("chord of {n}: the receiver stopped answering"));
                    break;
                }
            }
            // A pause, so that chords do not meet in the queues.
            std::thread::sleep(Duration::from_millis(1));
        }
        samples.push((n, ours, one));
    }
    let stats = output.close(Close::Drain).stats;
    drop(trial_tx);
    drop(job_tx);
    let _ = receiver.join();
    let _ = writer.join();
    if failures > 0 {
        notes.push(format!("chords: {failures} trials failed (the first are above)"));
    }
    if stats.late > 0 {
        notes.push(format!("chords: {} events were put after their due time (the producer was late)", stats.late));
    }
    Ok(Chords { samples, writes_per_chord: (stats.writes - writes_before) as f64 / chords_sent.max(1) as f64, granted })
}

/// The chord experiment's rows, headlines and notes.
fn report_chords(report: &mut Report, c: &Chords, notes: &mut Vec<String>) {
    let us = |ns: u64| ns as f64 / 1000.0;
    for (n, ours, one) in &c.samples {
        for (who, v) in [("output library → cable", ours), ("one write → socket pair (floor)", one)] {
            if v.is_empty() {
                continue;
            }
            report.rows.push(
                recorder(v)
                    .row(format!("chord of {n} events: {who}"))
                    .with("measure", "due → last event read by the receiver")
                    .with("events", *n as u64)
                    .with("bytes", (*n * 3) as u64)
                    .to_value(),
            );
        }
    }
    let Some((_, ours, one)) = c.samples.iter().find(|(n, ..)| *n == CHORD_HEADLINE) else {
        notes.push("the chord experiment did not run: no midi_chord256 headlines".into());
        return;
    };
    if ours.is_empty() || one.is_empty() {
        notes.push("the 256-event chords did not arrive: no midi_chord256 headlines".into());
        return;
    }
    let (o, f) = (recorder(ours), recorder(one));
    let mut last = Headline::new(
        "midi_chord256_last_us",
        us(o.quantile(0.99)),
        us(f.quantile(0.99)),
        format!(
            "p99 over {} chords of 256 events due at one instant, due → last event read (receiver SCHED_FIFO {RECEIVER_PRIORITY}); peer: the same bytes, one write to a socket pair by a thread sleeping until the due time; the target is absolute: ours ≤ {CHORD_BUDGET_US} µs",
            ours.len()
        ),
        "us",
        Better::Lower,
    );
    last.target = Some(CHORD_BUDGET_US);
    last.met = Some(last.ours <= CHORD_BUDGET_US);
    report.headline.push(last);
    report.headline.push(
        Headline::new(
            "midi_chord256_vs_one_write",
            us(o.quantile(0.5)),
            us(f.quantile(0.5)),
            format!(
                "median over {} chords of 256 events (A B A B in one run): ours through the output library and the cable against one write of the same bytes to a socket pair by a thread of the same class sleeping until the due time",
                ours.len()
            ),
            "us",
            Better::Lower,
        )
        .with_target(CHORD_VS_ONE_WRITE),
    );
    notes.push(format!(
        "chords: {}; the output library wrote {:.2} times per chord (one write carries a whole instant); both sides include the wake-up at the due time; ours also the queue, the encoding and the cable's ring and wake-up",
        c.granted, c.writes_per_chord
    ));
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
        for (k, kt, ut, cpu) in [(7u32, 123u64, 130u64, 1u32), (8, 0, 240, 0)] {
            b.extend_from_slice(&k.to_le_bytes());
            b.extend_from_slice(&kt.to_le_bytes());
            b.extend_from_slice(&ut.to_le_bytes());
            b.extend_from_slice(&cpu.to_le_bytes());
        }
        b.extend_from_slice(&[1, 2, 3]); // a torn tail is ignored
        let (kernel, user, cpus) = parse_records(&b);
        assert_eq!(kernel, vec![(7, Time::from_nanos(123)), (8, Time::from_nanos(240))]);
        assert_eq!(user, vec![(7, Time::from_nanos(130)), (8, Time::from_nanos(240))]);
        assert_eq!(cpus, vec![(7, 1), (8, 0)]);
    }

    #[test]
    fn worst_and_segments() {
        let t0 = Time::from_millis(1000);
        // Ten messages on time but for 3 (2 ms late) and 7 (5 ms late); 8 lost.
        let late = |k: u64| match k {
            3 => 2 * MS,
            7 => 5 * MS,
            _ => 0,
        };
        let arrivals: Vec<(u64, Time)> =
            (0..10).filter(|&k| k != 8).map(|k| (k, Time::from_nanos(1000 * MS + k * 10 * MS + late(k)))).collect();
        let a = analyse(&arrivals, 10, t0, INTERVAL);
        assert_eq!(a.pairs, vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(a.worst(), Some((5 * MS, 6)));
        // Segments of 4 messages: pairs 0..=3 (worst 2 ms), 4..=6 (worst 5 ms).
        assert_eq!(a.segment_worsts(4), vec![2 * MS, 5 * MS]);
        assert_eq!(a.segment_worsts(100), vec![5 * MS]);
        assert_eq!(Analysis::default().worst(), None);
        assert!(Analysis::default().segment_worsts(4).is_empty());
    }

    #[test]
    fn cyclictest_samples_parse() {
        let text = "# /dev/cpu_dma_latency set to 0us\nThread 0 Interval: 10500\n       0:       0:   17460\n       0:       1:   14531\n       1:       0:      99\n       0:       2:   15868\nT: 0 ( 3073) P:80 I:10000 C:      3 Min:  14531 Act:   15868 Avg:   15953 Max:   17460\n";
        assert_eq!(parse_cyclictest_samples(text).unwrap(), vec![17460, 14531, 15868]);
        assert!(parse_cyclictest_samples("").is_err());
        assert!(parse_cyclictest_samples("T: 0 ( 3073) P:80 I:10000 C: 0\n").is_err());
        let gap = "       0:       0:   17\n       0:       2:   15\n";
        assert!(parse_cyclictest_samples(gap).unwrap_err().contains("cycle 2"));
        let huge = "       0:       0:   99999999999999999999999\n";
        assert!(parse_cyclictest_samples(huge).is_err());
    }

    #[test]
    fn cyclictest_interval_errors_follow_its_skipping() {
        let t = 10_000_000u64;
        // On time, a little late, on time: the late wake-up makes two intervals wrong.
        assert_eq!(cyclictest_interval_errors(&[10, 510, 20], t), vec![500, 490]);
        // A wake-up 25 ms late: cyclictest skips the two periods already past, so the
        // next one is due three periods after it, 5 ms after the late wake-up.
        assert_eq!(cyclictest_interval_errors(&[25_000_000, 0], t), vec![5_000_000]);
        // Exactly one period late: the next is due at that same instant.
        assert_eq!(cyclictest_interval_errors(&[t, 0], t), vec![t]);
        assert!(cyclictest_interval_errors(&[5], t).is_empty());
        assert!(cyclictest_interval_errors(&[], t).is_empty());
        // The same measure as `analyse` on arrivals: wake-ups at due + latency.
        let lat = [3_000u64, 80_000, 4_000, 9_000];
        let arrivals: Vec<(u64, Time)> =
            lat.iter().enumerate().map(|(k, &l)| (k as u64, Time::from_nanos(t * k as u64 + l))).collect();
        let a = analyse(&arrivals, 4, Time::ZERO, Duration::from_nanos(t));
        assert_eq!(cyclictest_interval_errors(&lat, t), a.errors);
    }

    #[test]
    fn timer_threads_go_where_the_class_allows() {
        assert!(timer_cpus(Sched::Deadline).is_empty());
        let cpus = ictus_rt::thread::current_affinity().unwrap();
        assert_eq!(timer_cpus(Sched::Fixed), cpus);
        assert_eq!(timer_cpus(Sched::Timesharing), cpus);
    }

    #[test]
    fn steal_from_proc_stat() {
        let text = "cpu  10 0 20 30 4 0 5 9 0 0\ncpu0 5 0 10 15 2 0 2 4 0 0\ncpu1 5 0 10 15 2 0 3 5 0 0\nintr 1 2 3\ncpu2 1 2\n";
        assert_eq!(parse_steal(text), vec![(0, 4), (1, 5)]);
        assert!(parse_steal("").is_empty());
        let ms = steal_ms(&[(0, 4), (1, 5)], &[(0, 6), (1, 5), (2, 1)]);
        let tick = 1000 / rustix::param::clock_ticks_per_second();
        assert_eq!(ms, vec![(0, 2 * tick), (1, 0)]);
        assert_eq!(format_steal(&[(0, 20), (1, 0)]), "cpu0 20 ms, cpu1 0 ms");
        assert_eq!(format_steal(&[]), "unknown");
        // This machine's own /proc/stat parses (where there is one).
        if let Ok(text) = std::fs::read_to_string("/proc/stat") {
            assert!(!parse_steal(&text).is_empty());
        }
    }

    #[test]
    fn task_faults_parse() {
        let stat = "1234 (mo1 (timer) x) S 1 1234 1234 0 -1 4194368 17 0 3 0 5 6 0 0 -100 0 2 0";
        assert_eq!(parse_task_faults(stat), Some((17, 3)));
        assert_eq!(parse_task_faults("1234 (x) S 1"), None);
        assert_eq!(parse_task_faults("garbage"), None);
        let me = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        assert!(parse_task_faults(&me).is_some());
    }

    #[test]
    fn an_output_on_a_logged_cable_reports_its_writes_and_faults() {
        let name = unique_cable();
        let mut rx = CableIn::open(&name).unwrap();
        let (output, log, granted) = open_output(&name, Sched::Timesharing, 4).unwrap();
        assert!(granted.contains("timer"), "{granted}");
        assert!(output_faults(output.id()).is_some());
        for k in 0..3 {
            output.put_now(message_for(k).unwrap()).unwrap();
        }
        let mut buf = [0u8; 16];
        let mut got = 0;
        while got < 9 {
            got += rx.read(&mut buf, Some(Duration::from_secs(30))).unwrap();
        }
        let closed = output.close(Close::Drain);
        assert_eq!(closed.stats.sent, 3);
        let log = log.lock().unwrap();
        assert_eq!(log.iter().map(|r| r.k).collect::<Vec<_>>(), vec![0, 1, 2]);
        let cpus = ictus_rt::thread::current_affinity().unwrap();
        assert!(log.iter().all(|r| cpus.contains(&(r.cpu as usize)) && r.at > 0));
    }

    #[test]
    fn the_kernel_stamps_arrivals_on_a_cable() {
        let name = unique_cable();
        let mut rx = CableIn::open(&name).unwrap().with_arrival_stamps();
        let mut tx = CableOut::open(&name, None).unwrap();
        let mut buf = [0u8; 16];
        // The receiver takes the new sender and arms its ring: the next write wakes it.
        assert!(rx.read_stamped(&mut buf, Some(Duration::ZERO)).is_err());
        let before = clock::wall().as_nanos();
        tx.write(&[0x90, 1, 1]).unwrap();
        let (n, stamp) = rx.read_stamped(&mut buf, Some(Duration::from_secs(30))).unwrap();
        assert_eq!(&buf[..n], &[0x90, 1, 1]);
        let stamp = stamp.expect("a sleeping receiver's wake-up carries SO_TIMESTAMPNS");
        assert!(stamp >= before && stamp <= clock::wall().as_nanos());
        assert!(rx.read_stamped(&mut buf, Some(Duration::ZERO)).is_err());
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
