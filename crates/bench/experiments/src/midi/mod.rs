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
//! - `midi_fifo_p99_vs_cyclictest`: the fixed-priority windows' interval-error p99 under
//!   CPU load against cyclictest's wake-up latency p99 in the same windows (target ≤ 1.5):
//!   each side's p99 within each of three windows, the median across them (`Plan`).
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

mod analysis;
mod chord;
mod receiver;
mod window;

use std::time::{Duration, Instant};

use ictus_bench::experiment::no_args;
use ictus_bench::load::{self, LoadKind};
use ictus_bench::windows::Windowed;
use ictus_bench::{format_ns, BenchError, Conditions, Experiment, Options, Outcome};
use ictus_bench::{Better, Headline, LatencyRecorder, Notes, PaperFigure, Report};
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use serde_json::json;

use crate::peers::cyclictest::interval_errors as cyclictest_interval_errors;
pub use analysis::{analyse, message_for, number_of, parse_steal, parse_task_faults, Analysis};
use analysis::{format_steal, median_ns, read_steal, steal_ms};
pub use chord::{CHORD_BUDGET_US, CHORD_SIZES, CHORD_VS_ONE_WRITE};
use window::{merge, side_by_side, timer_cpus, window, Window, Worst};

/// `ictus bench midi`.
pub static MIDI: Experiment = Experiment {
    name: "midi",
    about: "MIDI latency under load (000 Table 1, Figure 1): 100 messages/s through the output library onto the \
            virtual cable, timesharing / fixed priority / deadline, under loads, beside cyclictest in the same window",
    figures: &[4, 5],
    quick_s: 40.0,
    full_s: 575.0,
    roles: &[&receiver::ROLE],
    args: no_args,
    run,
};

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

/// Options of the experiment.
#[derive(Clone, Debug, Default)]
pub struct MidiOptions {
    /// A few seconds per window, loads none and CPU.
    pub quick: bool,
    /// Print progress to standard error.
    pub progress: bool,
}

/// Every cyclictest wake-up latency of several runs in one recorder; `None` without
/// samples.
fn cyclictest_recorder(runs: &[Vec<u64>]) -> Option<LatencyRecorder> {
    let r = recorder(&runs.concat());
    (r.count() > 0).then_some(r)
}

/// cyclictest's interval errors over several runs (see
/// [`crate::peers::cyclictest::interval_errors`]).
fn cyclictest_errors(runs: &[Vec<u64>]) -> Vec<u64> {
    runs.iter().flat_map(|r| cyclictest_interval_errors(r, INTERVAL.as_nanos() as u64)).collect()
}

fn recorder(samples: &[u64]) -> LatencyRecorder {
    let mut r = LatencyRecorder::new();
    r.record_all(samples);
    r
}

/// Kilobytes of this process's memory that are locked (`VmLck`), if known.
fn locked_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmLck:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Lock this process's memory (`mlockall(MCL_CURRENT | MCL_FUTURE)`) unless something
/// already locked some of it; whether this call locked it. A refusal is noted.
fn lock_memory(notes: &mut Notes) -> bool {
    if locked_kib().is_some_and(|k| k > 0) {
        notes.push("the sender's memory was already (partly) locked; left as it was");
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
    let _ = rustix::mm::munlockall();
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
/// The paper's Table 1 (worst delay beyond the nominal 10 ms), by our load.
const TABLE1: &[(&str, &str, &str, &str, f64, f64)] = &[
    ("none", "No Load", ">11 ms", ">6 ms", 11.6e6, 6.7e6),
    ("cpu", "Computation Load", ">200 ms", ">6 ms", 200e6, 6e6),
    ("disk", "AFS Load (a compile in an uncached AFS volume)", ">10000 ms", ">159 ms", 10_000e6, 159e6),
    ("net", "X11 + Network Load", ">155 ms", ">11 ms", 155e6, 11e6),
];

/// Runs the experiment with the command line's options.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    run_with(&MidiOptions { quick: opts.quick, progress: opts.progress })
}

/// Windows of `secs` seconds, `rounds` rounds of every class per load, and under CPU
/// load `extra_fixed` more fixed-priority windows (the headline
/// `midi_fifo_p99_vs_cyclictest` takes the median over the fixed-priority windows under
/// CPU load); the side-by-side window's length.
struct Plan {
    secs: u64,
    rounds: usize,
    extra_fixed: usize,
    side_secs: u64,
}

impl Plan {
    /// `--quick`: 2-s windows, one round, three fixed-priority windows under CPU load,
    /// a side-by-side window of three segments. On this VM every CPU stalls for 1–9 ms
    /// every 100 ms; a message 10 ms apart meets a stall at a phase fixed for the whole
    /// window, so one short window's tail is a lottery. Three windows and three
    /// segments give the medians something to choose from; windows of 2 s (200
    /// messages, not 300) pay for them.
    const QUICK: Plan = Plan { secs: 2, rounds: 1, extra_fixed: 2, side_secs: 3 * SEGMENT_SECS };
    /// 15-s windows, two rounds, a third fixed-priority window under CPU load, twelve
    /// segments side by side.
    const FULL: Plan = Plan { secs: 15, rounds: 2, extra_fixed: 1, side_secs: 12 * SEGMENT_SECS };

    /// The windows of a load, in the order they run (the side-by-side window aside).
    fn classes(&self, cpu_load: bool) -> Vec<Sched> {
        let mut order: Vec<Sched> = (0..self.rounds).flat_map(|_| Sched::ALL).collect();
        if cpu_load {
            order.extend(std::iter::repeat(Sched::Fixed).take(self.extra_fixed));
        }
        order
    }
}

/// The fixed-priority windows under CPU load, each on its own (before [`merge`]), as
/// (ours, cyclictest) pairs for `midi_fifo_p99_vs_cyclictest` and its two companions.
#[derive(Debug, Default)]
struct P99Windows {
    /// Our interval-error p99 against cyclictest's wake-up latency p99.
    vs_latency: Option<Windowed>,
    /// Our interval-error p99 against cyclictest's interval-error p99.
    vs_interval: Option<Windowed>,
    /// Our delivery-latency p99 against cyclictest's wake-up latency p99.
    latency: Option<Windowed>,
}

/// The 99th percentile of a window's samples (ns); `None` without samples.
fn p99(samples: &[u64]) -> Option<f64> {
    (!samples.is_empty()).then(|| recorder(samples).quantile(0.99) as f64)
}

/// [`P99Windows`] from the windows as measured (not merged): the p99 is taken within
/// each window, on both sides, and the median across windows.
fn p99_windows(windows: &[Window]) -> P99Windows {
    let fixed: Vec<&Window> =
        windows.iter().filter(|w| w.load == "cpu" && w.sched == Sched::Fixed && !w.side).collect();
    let peer = |w: &Window| p99(&w.cyclictest.concat());
    P99Windows {
        vs_latency: Windowed::new(fixed.iter().filter_map(|w| Some((p99(&w.analysis.errors)?, peer(w)?)))),
        vs_interval: Windowed::new(
            fixed.iter().filter_map(|w| Some((p99(&w.analysis.errors)?, p99(&cyclictest_errors(&w.cyclictest))?))),
        ),
        latency: Windowed::new(fixed.iter().filter_map(|w| Some((p99(&w.analysis.latencies)?, peer(w)?)))),
    }
}

/// Runs the experiment with options of its own.
pub fn run_with(opts: &MidiOptions) -> Result<Outcome, BenchError> {
    let mut conditions = Conditions::capture_before();
    let plan = if opts.quick { Plan::QUICK } else { Plan::FULL };
    let mut notes = Notes::new();

    // Set-up: lock this process's memory (the sender's), for every window alike, so
    // that no output thread waits for a page; the receivers lock theirs. Undone at the
    // end.
    let locked = lock_memory(&mut notes);
    let steal_start = read_steal();
    let started = Instant::now();

    // The measured windows, per load: rounds of one class each, and under CPU load the
    // side-by-side window.
    let mut windows = Vec::new();
    load::each_load(
        &loads(opts.quick),
        &mut notes,
        |kind| load::spawn_with(kind, per_load(&plan, kind), &load_config(kind)),
        |load, notes| {
            windows.extend(load_windows(load, &plan, opts, notes));
            Ok::<_, BenchError>(())
        },
    )?;
    let p99s = p99_windows(&windows);
    let windows = merge(windows);
    if opts.progress {
        eprintln!(
            "midi: chords of {:?} events due at one instant, ours and one write side by side",
            chord::CHORD_SIZES
        );
    }
    let chords = chord::chords(if opts.quick { 100 } else { 500 }, &mut notes);
    let steal_run = steal_ms(&steal_start, &read_steal());
    if locked {
        unlock_memory();
    }

    // Rows, Table 1 and Figure 1 beside ours, headlines.
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
    notes.push_front(
        format!(
            "steal time (the host running something else on a virtual CPU, /proc/stat) during the {:.0} s run: {}; per window in the rows ('steal')",
            started.elapsed().as_secs_f64(),
            format_steal(&steal_run)
        ),
    );
    if !report.conditions.rt_privileges {
        notes.not_measured(
            "fixed-priority and deadline rows",
            "real-time scheduling was refused: they ran timesharing (see granted)",
        );
    }
    add_rows(&mut report, &windows, &mut notes);
    let fig1 = add_paper_figures(&mut report, &windows);
    add_headlines(&mut report, &windows, &p99s, &mut notes);
    match &chords {
        Ok(c) => chord::report_chords(&mut report, c, &mut notes),
        Err(e) => notes.not_measured("the chord experiment", e),
    }
    add_notes(&mut notes, &windows, &plan, locked);
    report.add_notes(notes);
    Ok(plots(report, &windows, fig1))
}

/// The loads a run measures under: `--quick` only the CPU load, where every headline is
/// measured (its windows without load fed only Table 1's "No Load" row, and cost a
/// fifth of the run); a full run the standard five, no load first.
fn loads(quick: bool) -> Vec<Option<LoadKind>> {
    match quick {
        true => vec![Some(LoadKind::Cpu)],
        false => load::standard_loads(false),
    }
}

/// How long a load runs: its phase's windows and a margin.
fn per_load(plan: &Plan, kind: LoadKind) -> Duration {
    let side = if kind == LoadKind::Cpu { plan.side_secs + 5 } else { 0 };
    Duration::from_secs((plan.secs + 3) * plan.classes(kind == LoadKind::Cpu).len() as u64 + 20 + side)
}

/// The windows of one load: `plan.rounds` rounds of a window per class, and under CPU
/// load the side-by-side window. A window that fails is noted.
fn load_windows(load: Option<LoadKind>, plan: &Plan, opts: &MidiOptions, notes: &mut Notes) -> Vec<Window> {
    let load_name = load::load_name(load);
    let mut windows = Vec::new();
    for (k, sched) in plan.classes(load == Some(LoadKind::Cpu)).into_iter().enumerate() {
        if opts.progress {
            eprintln!("midi: load {load_name}, {}, {} s (window {})", sched.name(), plan.secs, k + 1);
        }
        match window(load_name, sched, plan.secs, notes) {
            Ok(w) => windows.push(w),
            Err(e) => notes.not_measured(format!("{load_name} {} window", sched.name()), e),
        }
    }
    if load == Some(LoadKind::Cpu) {
        if opts.progress {
            eprintln!("midi: load {load_name}, fixed and timesharing side by side, {} s", plan.side_secs);
        }
        match side_by_side(load_name, plan.side_secs, notes) {
            Ok(ws) => windows.extend(ws),
            Err(e) => notes.not_measured(format!("{load_name} side-by-side window"), e),
        }
    }
    windows
}

/// The window a figure or headline reads (not a side-by-side one).
fn find<'w>(windows: &'w [Window], load: &str, sched: Sched) -> Option<&'w Window> {
    windows.iter().find(|w| w.load == load && w.sched == sched && !w.side)
}

/// The worst interval error of a window.
fn max_err(w: &Window) -> Option<u64> {
    w.analysis.errors.iter().copied().max()
}

/// Per window: the interval error (on the kernel's stamps and on the receiver's
/// reading), the delivery latency, and cyclictest's two measures.
fn add_rows(report: &mut Report, windows: &[Window], notes: &mut Notes) {
    let per_segment = SEGMENT_SECS * RATE_HZ;
    for w in windows {
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
}

/// The paper's Table 1 (as rows, and as figures) and Figure 1 beside ours; returns the
/// window Figure 1 is drawn from.
fn add_paper_figures<'w>(report: &mut Report, windows: &'w [Window]) -> Option<&'w Window> {
    // Table 1 beside ours.
    for &(load, paper_load, ts, fp, _, _) in TABLE1 {
        let ours = |s: Sched| find(windows, load, s).and_then(max_err).map_or("-".to_string(), |v| format_ns(v as f64));
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
            let v = find(windows, load, sched).and_then(max_err).map(|v| v as f64);
            let quick = report.quick;
            report.paper_figures.push(match v {
                Some(v) => f.ours(Some(v), format!("max interval error {}", format_ns(v))),
                None if quick && !loads(true).iter().any(|l| load::load_name(*l) == load) => {
                    f.ours(None, format!("not measured: --quick runs no {load} load (the full run does)"))
                }
                None => f.ours(None, format!("not measured: no {} window under the {load} load", sched.name())),
            });
        }
    }
    let fig1 = find(windows, "cpu", Sched::Fixed).or_else(|| find(windows, "none", Sched::Fixed));
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

    fig1
}

/// `midi_fifo_p99_vs_cyclictest` and its companions from the fixed-priority windows
/// under CPU load (each window's p99 on both sides, the median across windows);
/// `midi_fifo_vs_timesharing_max` and `_abs_max` from the side-by-side window.
fn add_headlines(report: &mut Report, windows: &[Window], p99s: &P99Windows, notes: &mut Notes) {
    let per_segment = SEGMENT_SECS * RATE_HZ;
    let find_side = |sched: Sched| windows.iter().find(|w| w.side && w.sched == sched);
    let peer_name = |what: &str, n: usize| {
        format!(
            "cyclictest (rt-tests) SCHED_FIFO {FIFO_PRIORITY}, 100 Hz, same window, CPU load: {what}; each side's \
             p99 within each window, the median over {n} window(s)"
        )
    };
    if let Some(w) = &p99s.vs_latency {
        report.headline.push(
            Headline::new(
                "midi_fifo_p99_vs_cyclictest",
                w.ours,
                w.peer,
                peer_name("its wake-up latency p99; ours is the interval error p99", w.windows.len()),
                "ns",
                Better::Lower,
            )
            .with_target(1.5),
        );
        report.rows.extend(w.rows("cpu fixed: interval error p99 vs cyclictest wake-up p99", "ns"));
    }
    // The same measure on both sides: the interval error counts a late message twice
    // (the interval before it and the one after), a wake-up latency once.
    if let Some(w) = &p99s.vs_interval {
        report.headline.push(Headline::new(
            "midi_fifo_p99_vs_cyclictest_interval",
            w.ours,
            w.peer,
            peer_name("the interval error p99 between its consecutive wake-ups, ours likewise", w.windows.len()),
            "ns",
            Better::Lower,
        ));
    }
    if let Some(w) = &p99s.latency {
        report.headline.push(Headline::new(
            "midi_fifo_latency_p99_vs_cyclictest",
            w.ours,
            w.peer,
            peer_name("its wake-up latency p99; ours is the delivery latency p99 (arrival − due)", w.windows.len()),
            "ns",
            Better::Lower,
        ));
    }
    match (find_side(Sched::Fixed), find_side(Sched::Timesharing)) {
        (Some(f), Some(t)) if !f.analysis.errors.is_empty() && !t.analysis.errors.is_empty() => {
            let (seg_f, seg_t) = (f.analysis.segment_worsts(per_segment), t.analysis.segment_worsts(per_segment));
            let (abs_f, abs_t) = (max_err(f).unwrap_or(0), max_err(t).unwrap_or(0));
            if seg_f.len() == seg_t.len() {
                let pairs = seg_f.iter().zip(&seg_t).map(|(&a, &b)| (a as f64, b as f64));
                if let Some(w) = Windowed::new(pairs) {
                    report.rows.extend(w.rows("cpu side by side: segment worst, fixed vs timesharing", "ns"));
                }
            }
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
        _ => notes.not_measured("headline midi_fifo_vs_timesharing_max", "the side-by-side window did not run"),
    }
}

/// Where the worst cases fell, and how the numbers were made.
fn add_notes(notes: &mut Notes, windows: &[Window], plan: &Plan, locked: bool) {
    let (secs, rounds, side_secs) = (plan.secs, plan.rounds, plan.side_secs);
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
    notes.push("interval error is the paper's measure, on the kernel's arrival stamps (SO_TIMESTAMPNS; the rows 'receiver's reading' add the receiver's own wake-up); cyclictest measures wake-up lateness, one wake-up per period, and its rows 'interval error' apply the paper's measure to its consecutive wake-ups (read with -v -N); an interval error counts a late message twice and a steady delay not at all; a due message is written by the output library's timer thread itself when the byte sender is idle (one wake-up, as in cyclictest), and handed to the byte sender only when the device is full or messages are queued");
    notes.push("the cable is unpaced (a UART with a FIFO); cyclictest sets /dev/cpu_dma_latency to 0 while it runs, for everything in its window");
    notes.push("the paper's AFS load is set beside our disk load and its X11+network load beside our network load; memory load has no counterpart");
    notes.push("the machine is shared with other builds: absolute numbers are noisy, ratios from one window less so");
}

/// Figure 1 (fixed priority) as the main plot, and the same for timesharing.
fn plots(report: Report, windows: &[Window], fig1: Option<&Window>) -> Outcome {
    let figure1 = |w: &Window, class: &str| {
        let title = match class {
            "fixed priority" => format!("MIDI interarrival times, fixed priority, load {} (Figure 1)", w.load),
            _ => format!("MIDI interarrival times, {class}, load {}", w.load),
        };
        ictus_midi_server::monitor::figure1_svg(&w.analysis.intervals, 100, 20, &title)
    };
    let svg = match fig1 {
        Some(w) => figure1(w, "fixed priority"),
        None => ictus_midi_server::monitor::figure1_svg(&[], 100, 20, "MIDI interarrival times (no data)"),
    };
    let outcome = Outcome::new(report, svg);
    match find(windows, "cpu", Sched::Timesharing).or_else(|| find(windows, "none", Sched::Timesharing)) {
        Some(w) => outcome.with_plot("-timesharing", figure1(w, "timesharing")),
        None => outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_ask_for_what_they_say() {
        assert!(matches!(Sched::Fixed.request().policy, Some(Policy::Fifo { priority: FIFO_PRIORITY })));
        assert!(matches!(Sched::Deadline.request().policy, Some(Policy::Deadline { .. })));
        assert_eq!(Sched::Timesharing.cyclictest_policy(), ("other", 0));
        assert_eq!(Sched::Deadline.cyclictest_policy(), ("fifo", FIFO_PRIORITY));
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn quick_runs_three_fixed_windows_under_cpu_load() {
        let cpu = Plan::QUICK.classes(true);
        assert_eq!(cpu.iter().filter(|&&s| s == Sched::Fixed).count(), 3);
        assert_eq!(cpu.len(), 5);
        assert_eq!(Plan::QUICK.classes(false), Sched::ALL, "no extra windows without the load");
        assert_eq!(Plan::FULL.classes(true).iter().filter(|&&s| s == Sched::Fixed).count(), 3);
        assert_eq!(Plan::QUICK.side_secs / SEGMENT_SECS, 3, "three segments side by side");
        assert_eq!(loads(true), [Some(LoadKind::Cpu)], "quick: only the load of the headlines");
        assert_eq!(loads(false), load::standard_loads(false));
    }

    /// A window of `sched` under `load` whose interval errors are `errors` and whose
    /// cyclictest woke `peer` late.
    fn virtual_window(load: &'static str, sched: Sched, side: bool, errors: Vec<u64>, peer: Vec<u64>) -> Window {
        Window {
            load,
            sched,
            side,
            granted: String::new(),
            analysis: Analysis { latencies: errors.clone(), errors, ..Analysis::default() },
            analysis_user: Analysis::default(),
            cyclictest: vec![peer],
            output_late: 0,
            sent: 0,
            steal: Vec::new(),
            faults: None,
            worst: None,
        }
    }

    #[test]
    fn the_p99_is_taken_in_each_window_and_the_median_across() {
        // 200 samples per window: the p99 is the third worst. Window 2 met a 9 ms stall
        // three times on our side, window 3 on cyclictest's.
        let with_tail = |base: u64, tail: u64| {
            let mut v = vec![base; 197];
            v.extend([tail, tail, tail]);
            v
        };
        let windows = vec![
            virtual_window("cpu", Sched::Fixed, false, with_tail(50_000, 200_000), with_tail(40_000, 100_000)),
            virtual_window("cpu", Sched::Timesharing, false, with_tail(1, 50 * MS), with_tail(1, 1)),
            virtual_window("cpu", Sched::Fixed, false, with_tail(50_000, 9 * MS), with_tail(40_000, 120_000)),
            virtual_window("none", Sched::Fixed, false, with_tail(1, 1), with_tail(1, 1)),
            virtual_window("cpu", Sched::Fixed, true, with_tail(1, 1), Vec::new()),
            virtual_window("cpu", Sched::Fixed, false, with_tail(50_000, 250_000), with_tail(40_000, 9 * MS)),
        ];
        let p = p99_windows(&windows);
        let w = p.vs_latency.expect("three windows");
        assert_eq!(w.windows.len(), 3, "only the fixed windows under CPU load, not the side-by-side one");
        let near = |a: f64, b: u64| (a - b as f64).abs() <= b as f64 * 1e-3;
        assert!(near(w.ours, 250_000) && near(w.peer, 120_000), "{w:?}");
        assert!(p.latency.is_some());
        assert!(p99_windows(&windows[1..2]).vs_latency.is_none(), "no fixed window, no headline");
    }

    #[test]
    fn the_figure_is_well_formed() {
        let svg = ictus_midi_server::monitor::figure1_svg(&[10 * MS, 70 * MS], 100, 20, "t");
        ictus_bench::plot::check_well_formed(&svg).unwrap();
    }
}
