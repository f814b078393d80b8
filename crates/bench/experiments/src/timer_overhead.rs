//! The `timer-overhead` experiment: what one timer wake-up costs the rest of the CPU
//! (paper 000 §6).
//!
//! The paper ran "a background process \[that\] simply loops to consume all the available
//! processing power", reading "many lines of code and … many memory addresses" to
//! defeat the cache, once with the clock interrupting at 100 Hz and once at 2000 Hz, and
//! solved for the cost of one interrupt: 67 µs, so that a 1 kHz clock would take 6.7 %
//! of the CPU. Today's kernels are tickless, so a timer costs only when it fires for
//! someone; we measure what a **periodic wake-up of a thread** costs a background loop
//! on the same CPU: the hrtimer interrupt, the switch to the waking thread and back,
//! and the cache the loop has to refill.
//!
//! The loop (timesharing, nice 0) walks an 8 MiB buffer one cache line at a time in
//! 64 KiB chunks and counts chunks. On the same CPU, a timer thread (`SCHED_FIFO 50`
//! when permitted, so that each wake-up preempts the loop at once) wakes at 100 Hz,
//! 1 kHz and 10 kHz by one of three mechanisms:
//!
//! - **ours, sleep-until**: `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)` on a grid
//!   of absolute times (the in-process clock service's sleep);
//! - **ours, upcall**: an empty Real-Time Upcall at that period on the
//!   [`ictus_rt::runtime`] dispatcher (pinned to the CPU, so `SCHED_FIFO`, not deadline);
//! - **peer, timerfd**: a periodic `timerfd` (`CLOCK_MONOTONIC`) read by a blocked
//!   thread, what an event loop (tokio, libevent, systemd) uses. A POSIX timer
//!   delivering a signal was rejected as the peer: a signal runs on the interrupted loop
//!   itself, with no switch, which is a different thing, and no real-time program takes
//!   its periodic work in a signal handler.
//!
//! Each measurement window runs the loop alone (the baseline) or beside one timer; the
//! windows are interleaved in rounds, rotating the order, and each condition's lost
//! work is taken against its own round's baseline. Cost of one wake-up = lost loop time
//! / wake-ups; over the three rates it is fitted by least squares through the origin
//! (lost fraction = cost × wake-ups per second), as the paper solved its two points.
//!
//! Headline `timer_wakeup_cost_ns`: ours (sleep-until) against the timerfd peer, lower
//! is better.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ictus_bench::experiment::no_args;
use ictus_bench::plot::{Axis, Plot, Scale, Series, TickFormat};
use ictus_bench::rounds::rotation;
use ictus_bench::{BenchError, Conditions, Experiment, Options, Outcome};
use ictus_bench::{Better, Headline, PaperFigure, Report};
use ictus_rt::runtime::{Runtime, RuntimeConfig};
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_rt::{AdmissionPolicy, UpcallSpec};
use serde_json::json;

/// `ictus bench timer-overhead`.
pub static TIMER_OVERHEAD: Experiment = Experiment {
    name: NAME,
    about: "Timer overhead (000 §6): a background loop's work lost to a timer waking a thread at 100 Hz, \
            1 kHz and 10 kHz (clock_nanosleep and upcalls beside timerfd)",
    figures: &[3],
    quick_s: 12.0,
    full_s: 180.0,
    roles: &[],
    args: no_args,
    run,
};

/// Experiment name, as in `ictus bench timer-overhead`.
pub const NAME: &str = "timer-overhead";
/// Where in the papers it comes from.
pub const PAPER: &str = "000 §6";
/// The headline's stable name.
pub const HEADLINE: &str = "timer_wakeup_cost_ns";
/// Timer rates, Hz.
pub const RATES: [u32; 3] = [100, 1_000, 10_000];
/// The loop's working set: larger than a typical L2, so wake-ups cost cache refills.
pub const WORKING_SET: usize = 8 << 20;
/// Bytes the loop walks per counted chunk.
pub const CHUNK: usize = 64 << 10;
/// The timer thread's fixed priority, when permitted.
pub const TIMER_PRIORITY: u8 = 50;
/// The paper's cost of one clock interrupt, ns.
pub const PAPER_COST_NS: f64 = 67_000.0;

/// How a timer wakes its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// `clock_nanosleep(TIMER_ABSTIME)` on a grid (ours).
    SleepUntil,
    /// An empty upcall on the ictus upcall dispatcher (ours).
    Upcall,
    /// A periodic `timerfd` (the peer).
    Timerfd,
}

impl Mechanism {
    /// All, in report order.
    pub const ALL: [Mechanism; 3] = [Mechanism::SleepUntil, Mechanism::Upcall, Mechanism::Timerfd];

    /// The name in rows.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::SleepUntil => "clock_nanosleep TIMER_ABSTIME",
            Mechanism::Upcall => "ictus upcall",
            Mechanism::Timerfd => "timerfd",
        }
    }
}

/// One window's result.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    chunks: u64,
    /// Wall time the loop ran.
    seconds: f64,
    /// CPU time this process used meanwhile (loop, timer, interrupts taken on them).
    cpu_seconds: f64,
    wakeups: u64,
}

impl Window {
    /// Loop work per CPU-second of this process: what other processes take from the
    /// CPU does not count against the timer, what the timer costs does.
    fn rate(&self) -> f64 {
        if self.cpu_seconds > 0.0 {
            self.chunks as f64 / self.cpu_seconds
        } else {
            0.0
        }
    }

    /// Loop work per wall-clock second (reported; noisier on a shared machine).
    fn wall_rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.chunks as f64 / self.seconds
        } else {
            0.0
        }
    }
}

fn process_cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// The CPU everything runs on: the last one this process may use (CPU 0 usually takes
/// more of the machine's interrupts).
fn chosen_cpu() -> usize {
    ictus_rt::thread::current_affinity().ok().and_then(|c| c.last().copied()).unwrap_or(0)
}

/// Runs the loop for `window`, beside a timer of `mech` at `hz` if given.
fn measure(cpu: usize, timer: Option<(Mechanism, u32)>, window: Duration, granted: &mut Option<String>) -> Window {
    let stop = Arc::new(AtomicBool::new(false));
    let wakeups = Arc::new(AtomicU64::new(0));
    // The window opens once the loop and the timer (set up, first wake-up armed) are ready.
    let start = Arc::new(Barrier::new(if timer.is_some() { 3 } else { 2 }));
    let looper = {
        let stop = Arc::clone(&stop);
        let start = Arc::clone(&start);
        std::thread::spawn(move || {
            configure_current_thread(&ThreadRequest {
                policy: Some(Policy::Other { nice: 0 }),
                cpus: Some(vec![cpu]),
                ..ThreadRequest::default()
            });
            let buf = vec![1u64; WORKING_SET / 8];
            let mut sum = 0u64;
            let mut pos = 0usize;
            let mut chunks = 0u64;
            start.wait();
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let words = CHUNK / 8;
                // One load per 64-byte line.
                for i in (pos..pos + words).step_by(8) {
                    sum = sum.wrapping_add(buf[i]);
                }
                pos = (pos + words) % buf.len();
                chunks += 1;
            }
            std::hint::black_box(sum);
            Window { chunks, seconds: t0.elapsed().as_secs_f64(), cpu_seconds: 0.0, wakeups: 0 }
        })
    };
    let timer_thread = timer.map(|(mech, hz)| {
        let stop = Arc::clone(&stop);
        let wakeups = Arc::clone(&wakeups);
        let start = Arc::clone(&start);
        std::thread::spawn(move || run_timer(mech, hz, cpu, &stop, &wakeups, &start))
    });
    start.wait();
    let cpu0 = process_cpu_seconds();
    std::thread::sleep(window);
    stop.store(true, Ordering::Relaxed);
    let cpu1 = process_cpu_seconds();
    let mut w = looper.join().unwrap_or_default();
    w.cpu_seconds = cpu1 - cpu0;
    if let Some(t) = timer_thread {
        if let Ok(g) = t.join() {
            granted.get_or_insert(g);
        }
    }
    w.wakeups = wakeups.load(Ordering::Relaxed);
    w
}

/// The timer side: wakes at `hz` until `stop`, counting wake-ups; returns the policy
/// it ran with.
fn run_timer(mech: Mechanism, hz: u32, cpu: usize, stop: &AtomicBool, wakeups: &AtomicU64, start: &Barrier) -> String {
    let period = Duration::from_nanos(1_000_000_000 / u64::from(hz.max(1)));
    let req = ThreadRequest {
        policy: Some(Policy::Fifo { priority: TIMER_PRIORITY }),
        cpus: Some(vec![cpu]),
        timer_slack: Some(Duration::ZERO),
        ..ThreadRequest::default()
    };
    match mech {
        Mechanism::SleepUntil => {
            let granted = configure_current_thread(&req);
            start.wait();
            let mut next = ictus_rt::clock::now().saturating_add(period);
            while !stop.load(Ordering::Relaxed) {
                let ts = rustix::time::Timespec {
                    tv_sec: (next.as_nanos() / 1_000_000_000) as i64,
                    tv_nsec: (next.as_nanos() % 1_000_000_000) as _,
                };
                let _ = rustix::thread::clock_nanosleep_absolute(rustix::thread::ClockId::Monotonic, &ts);
                wakeups.fetch_add(1, Ordering::Relaxed);
                next = next.saturating_add(period);
                let now = ictus_rt::clock::now();
                if next < now {
                    next = now.saturating_add(period); // overrun: no catch-up burst
                }
            }
            granted.describe()
        }
        Mechanism::Timerfd => {
            let granted = configure_current_thread(&req);
            use rustix::time::{timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags};
            let ts = rustix::time::Timespec { tv_sec: period.as_secs() as i64, tv_nsec: period.subsec_nanos() as _ };
            let spec = Itimerspec { it_interval: ts, it_value: ts };
            let fd = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC)
                .and_then(|fd| timerfd_settime(&fd, rustix::time::TimerfdTimerFlags::empty(), &spec).map(|_| fd));
            start.wait();
            let Ok(fd) = fd else { return "timerfd unavailable".to_string() };
            let mut buf = [0u8; 8];
            while !stop.load(Ordering::Relaxed) {
                if rustix::io::read(&fd, &mut buf).is_ok() {
                    wakeups.fetch_add(1, Ordering::Relaxed);
                }
            }
            granted.describe()
        }
        Mechanism::Upcall => {
            let config = RuntimeConfig {
                admission: AdmissionPolicy::BestEffort,
                use_deadline: false,
                fifo_priority: Some(TIMER_PRIORITY),
                cpus: Some(vec![cpu]),
                ..RuntimeConfig::default()
            };
            let counter = Arc::new(AtomicU64::new(0));
            let c = Arc::clone(&counter);
            let started = Runtime::start(config).and_then(|rt| {
                let id = rt.create(UpcallSpec::periodic(period), move |_| {
                    c.fetch_add(1, Ordering::Relaxed);
                })?;
                Ok((rt, id))
            });
            start.wait();
            let Ok((rt, id)) = started else { return "upcall runtime unavailable".to_string() };
            let _ = rt.resume(id);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = rt.suspend(id);
            wakeups.store(counter.load(Ordering::Relaxed), Ordering::Relaxed);
            rt.granted().map_or("unknown".to_string(), |g| g.describe())
        }
    }
}

/// The median of the finite values; NaN (null in the JSON) when there are none.
fn median(v: Vec<f64>) -> f64 {
    ictus_bench::stats::median(v).unwrap_or(f64::NAN)
}

/// Least squares through the origin: the slope `c` of `y = c x`.
pub fn slope_through_origin(points: &[(f64, f64)]) -> Option<f64> {
    let (sxy, sxx) = points
        .iter()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .fold((0.0, 0.0), |(sxy, sxx), (x, y)| (sxy + x * y, sxx + x * x));
    (sxx > 0.0).then(|| sxy / sxx)
}

/// One condition's results over the rounds.
#[derive(Clone, Debug, Default)]
struct Condition {
    lost_fraction: Vec<f64>,
    wakeups_per_s: Vec<f64>,
    rate: Vec<f64>,
    wall_rate: Vec<f64>,
}

/// The baseline's and every condition's results over the rounds.
struct Rounds {
    /// (mechanism, rate) of each condition.
    cases: Vec<(Mechanism, u32)>,
    /// One entry per case.
    results: Vec<Condition>,
    /// The loop's rate alone, per round.
    baseline_rates: Vec<f64>,
    /// How the timer threads ran.
    granted: Option<String>,
}

/// Runs the experiment.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    let conditions = Conditions::capture_before();
    let (window, rounds) = if opts.quick { (Duration::from_millis(200), 5) } else { (Duration::from_millis(1500), 9) };
    let cpu = chosen_cpu();

    let measured = measure_rounds(cpu, window, rounds);

    let mut conditions = conditions.finish();
    conditions.pinned = format!("loop and timer on CPU {cpu}");
    conditions.policy = format!("timer {}, loop SCHED_OTHER nice 0", measured.granted.as_deref().unwrap_or("unknown"));
    let mut report = Report::new(NAME, PAPER, opts.quick, conditions);
    let (fits, series) = add_rows(&mut report, &measured, rounds);
    add_headlines_and_figures(&mut report, &fits);
    add_notes(&mut report, measured.granted.as_deref(), window, rounds);
    let plot = Plot {
        title: "Background work lost to a periodic timer (000 §6)".to_string(),
        x: Axis { label: "wake-ups per second".to_string(), scale: Scale::Log10, ticks: TickFormat::Plain },
        y: Axis { label: "loop work lost (%)".to_string(), scale: Scale::Linear, ticks: TickFormat::Plain },
        series,
    };
    Ok(Outcome::new(report, plot.render()))
}

/// `rounds` rounds: the loop alone, every (mechanism, rate) condition in an order that
/// rotates, the loop alone again; each condition's loss is taken against its own
/// round's baseline (the mean of the two).
fn measure_rounds(cpu: usize, window: Duration, rounds: usize) -> Rounds {
    let cases: Vec<(Mechanism, u32)> = RATES.iter().flat_map(|&hz| Mechanism::ALL.map(|m| (m, hz))).collect();
    let mut r =
        Rounds { results: vec![Condition::default(); cases.len()], cases, baseline_rates: Vec::new(), granted: None };
    // Warm-up: page in the buffer, settle the frequency governor.
    let _ = measure(cpu, None, window / 2, &mut r.granted);
    for round in 0..rounds {
        let base_a = measure(cpu, None, window, &mut r.granted);
        let mut windows = vec![Window::default(); r.cases.len()];
        for i in rotation(round * 2, r.cases.len()) {
            windows[i] = measure(cpu, Some(r.cases[i]), window, &mut r.granted);
        }
        let base_b = measure(cpu, None, window, &mut r.granted);
        let base = (base_a.rate() + base_b.rate()) / 2.0;
        r.baseline_rates.push(base);
        for (c, w) in r.results.iter_mut().zip(&windows) {
            c.rate.push(w.rate());
            c.wall_rate.push(w.wall_rate());
            c.lost_fraction.push(if base > 0.0 { 1.0 - w.rate() / base } else { f64::NAN });
            c.wakeups_per_s.push(if w.seconds > 0.0 { w.wakeups as f64 / w.seconds } else { 0.0 });
        }
    }
    r
}

/// The baseline row, a row per condition and per mechanism's fitted cost; returns the
/// fits and the plot's series (lost % against wake-ups per second).
fn add_rows(report: &mut Report, measured: &Rounds, rounds: usize) -> (Vec<(Mechanism, Option<f64>)>, Vec<Series>) {
    report.rows.push(json!({
        "case": "baseline (loop alone)",
        "mechanism": "none",
        "rate_hz": 0,
        "wakeups_per_s": 0.0,
        "work_chunks_per_cpu_s": median(measured.baseline_rates.clone()),
        "lost_pct": 0.0,
        "rounds": rounds,
    }));
    let mut fits = Vec::new();
    let mut series = Vec::new();
    for m in Mechanism::ALL {
        let mut points = Vec::new();
        for ((mm, hz), r) in measured.cases.iter().zip(&measured.results) {
            if *mm != m {
                continue;
            }
            let lost = median(r.lost_fraction.clone());
            let wps = median(r.wakeups_per_s.clone());
            let cost = if wps > 0.0 { lost / wps * 1e9 } else { f64::NAN };
            points.push((wps, lost));
            report.rows.push(json!({
                "case": format!("{} {} Hz", m.name(), hz),
                "mechanism": m.name(),
                "rate_hz": hz,
                "wakeups_per_s": wps,
                "work_chunks_per_cpu_s": median(r.rate.clone()),
                "work_chunks_per_wall_s": median(r.wall_rate.clone()),
                "lost_pct": lost * 100.0,
                "cost_per_wakeup_ns": cost,
                "rounds": rounds,
            }));
        }
        let fit = slope_through_origin(&points).map(|c| c * 1e9);
        fits.push((m, fit));
        series
            .push(Series { name: m.name().to_string(), points: points.iter().map(|(x, y)| (*x, y * 100.0)).collect() });
        report.rows.push(json!({
            "case": format!("{} fitted cost per wake-up", m.name()),
            "mechanism": m.name(),
            "cost_per_wakeup_ns": fit,
        }));
    }
    (fits, series)
}

/// `timer_wakeup_cost_ns` and `upcall_wakeup_cost_ns` against timerfd; the paper's
/// 67 µs and 6.7 % beside ours.
fn add_headlines_and_figures(report: &mut Report, fits: &[(Mechanism, Option<f64>)]) {
    let fit_of = |m: Mechanism| fits.iter().find(|(mm, _)| *mm == m).and_then(|(_, f)| *f);
    let ours = fit_of(Mechanism::SleepUntil);
    let peer = fit_of(Mechanism::Timerfd);
    if let (Some(o), Some(p)) = (ours, peer) {
        report.headline.push(Headline::new(
            HEADLINE,
            o,
            p,
            "timerfd (CLOCK_MONOTONIC) read by a thread",
            "ns",
            Better::Lower,
        ));
    }
    if let (Some(u), Some(p)) = (fit_of(Mechanism::Upcall), peer) {
        report.headline.push(Headline::new(
            "upcall_wakeup_cost_ns",
            u,
            p,
            "timerfd (CLOCK_MONOTONIC) read by a thread",
            "ns",
            Better::Lower,
        ));
    }
    let shown = |v: Option<f64>| v.map_or("not measured".to_string(), |c| format!("{:.1} µs", c / 1e3));
    report.paper_figures.push(
        PaperFigure::new(
            "cost of one clock interrupt / timer wake-up",
            "67 µs",
            Some(PAPER_COST_NS),
            "ns",
            Better::Lower,
        )
        .ours(ours.filter(|c| *c > 0.0), format!("clock_nanosleep wake-up: {}", shown(ours))),
    );
    let share = ours.map(|c| c * 1000.0 / 1e9 * 100.0);
    report.paper_figures.push(
        PaperFigure::new("CPU share of a 1 kHz timer", "6.7 %", Some(6.7), "%", Better::Lower)
            .ours(share.filter(|s| *s > 0.0), share.map_or("not measured".to_string(), |s| format!("{s:.3} %"))),
    );
}

/// How the numbers were made.
fn add_notes(report: &mut Report, granted: Option<&str>, window: Duration, rounds: usize) {
    report.notes.push(format!(
        "loop: {} KiB chunks over an {} MiB buffer, one load per 64-byte line, SCHED_OTHER nice 0; timer thread \
         {} on the same CPU; windows of {} ms, {rounds} rounds, conditions rotated, each against its round's \
         baseline (mean of one window before and one after)",
        CHUNK >> 10,
        WORKING_SET >> 20,
        granted.unwrap_or("?"),
        window.as_millis()
    ));
    report.notes.push(
        "work rate = loop chunks per CPU-second used by this process (CLOCK_PROCESS_CPUTIME_ID), so time other \
         processes take from the CPU is not blamed on the timer, while the timer thread's time, the interrupts \
         and the loop's cache refills are; work per wall-second is in the rows too"
            .to_string(),
    );
    report.notes.push(
        "cost per wake-up = lost fraction of the loop's work / wake-ups per second; fitted through the origin over \
         the three rates (the 10 kHz point dominates, as it should: at 100 Hz the loss is within the noise)"
            .to_string(),
    );
    report.notes.push(
        "the machine is shared: other processes on the CPU add noise to every window alike; a negative loss is \
         noise"
            .to_string(),
    );
    if granted.is_some_and(|g| !g.starts_with("SCHED_FIFO")) {
        report.notes.push(
            "no SCHED_FIFO: the timer thread is timesharing, so a wake-up may not preempt the loop at once".to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_through_origin_fits_a_line() {
        let c = slope_through_origin(&[(100.0, 0.001), (1000.0, 0.01), (10000.0, 0.1)]).expect("fit");
        assert!((c - 1e-5).abs() < 1e-12);
        assert_eq!(slope_through_origin(&[]), None);
        assert_eq!(slope_through_origin(&[(0.0, 1.0)]), None);
    }

    #[test]
    fn median_ignores_nan() {
        assert_eq!(median(vec![3.0, f64::NAN, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![1.0, 2.0]), 1.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn each_mechanism_wakes_its_thread() {
        let cpu = chosen_cpu();
        for m in Mechanism::ALL {
            // Longer windows until the timer has woken at least once (a watchdog, not
            // a timing assertion: on a loaded machine the first window may see none).
            let mut window = Duration::from_millis(50);
            loop {
                let mut granted = None;
                let w = measure(cpu, Some((m, 1000)), window, &mut granted);
                assert!(granted.is_some());
                if w.wakeups > 0 && w.chunks > 0 {
                    break;
                }
                assert!(window < Duration::from_secs(30), "{m:?}: the timer never woke: {w:?}");
                window *= 4;
            }
        }
    }
}
