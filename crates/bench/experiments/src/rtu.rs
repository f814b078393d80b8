//! The `rtu` experiment: periodic stream work with Real-Time Upcalls, with and without
//! CPU load (paper 001 §5.3, Table 3).
//!
//! MARS ran "three concurrent copies of this test program with single stream and RTU
//! periods of 60, 75, 120 ms", each job reading a stream's data and sending it on, "in
//! presence and absence of the CPU intensive background load", and "observed that no
//! deadlines are missed". We run three upcalls with those periods on the ictus upcall
//! runtime ([`ictus_rt::runtime`]: one dispatcher thread, rate-monotonic, no preemption
//! among upcalls, admission-controlled, with a `SCHED_DEADLINE` reservation when
//! permitted, else `SCHED_FIFO`). Each job does stream-like work: it reads the next
//! slice of a 64 MiB "file" (larger than the caches, so it streams from memory) in
//! 64 KiB pieces, each copied into a send buffer and checksummed, sized so that the
//! three together use about half of a CPU (calibrated at start; each upcall declares
//! 1.5× its calibrated cost to admission control).
//!
//! The peer is what a program does without upcalls: the same work in three plain
//! timesharing threads (`SCHED_OTHER` nice 0), each sleeping until its next period
//! (`clock_nanosleep(TIMER_ABSTIME)`). Each peer thread keeps its accounts with the same
//! pure [`Dispatcher`] logic, so a miss means the same on both sides: a job that
//! finished after its deadline (the end of its period), or a period whose job never ran
//! because the previous one overran.
//!
//! Conditions: no load, and a CPU load ([`crate::load`], `cpu`, a separate timesharing
//! process with [`LOAD_THREADS_PER_CPU`] busy threads per CPU). Ours and the peer take
//! turns (A B, then B A), never running at once.
//!
//! Headline `rtu_misses_loaded`: ours = deadline misses of the three upcalls under CPU
//! load; peer = misses of the timesharing threads in the same conditions; lower is
//! better. Target: ours 0.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ictus_bench::experiment::no_args;
use ictus_bench::load::{spawn_with, LoadConfig, LoadKind};
use ictus_bench::plot::{Axis, Plot, Scale, Series, TickFormat};
use ictus_bench::{BenchError, Conditions, Experiment, Options, Outcome};
use ictus_bench::{Better, Headline, LatencyRecorder, PaperFigure, Report};
use ictus_rt::runtime::{Runtime, RuntimeConfig};
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_rt::{clock, AdmissionPolicy, Decision, Dispatcher, Time, UpcallSpec, UpcallStats};

/// `ictus bench rtu`.
pub static RTU: Experiment = Experiment {
    name: NAME,
    about: "Periodic streams (001 Table 3): three upcalls of 60, 75 and 120 ms doing stream work, with and \
            without CPU load, counting deadline misses, beside timesharing threads",
    figures: &[10],
    quick_s: 20.0,
    full_s: 260.0,
    roles: &[],
    args: no_args,
    run,
};

/// Experiment name, as in `ictus bench rtu`.
pub const NAME: &str = "rtu";
/// Where in the papers it comes from.
pub const PAPER: &str = "001 §5.3, Table 3";
/// The headline's stable name.
pub const HEADLINE: &str = "rtu_misses_loaded";
/// The upcalls' periods, as in the paper.
pub const PERIODS_MS: [u64; 3] = [60, 75, 120];
/// The three streams' total CPU utilisation, as calibrated.
pub const UTILISATION: f64 = 0.5;
/// Each upcall declares this many times its calibrated cost to admission control.
pub const WCET_MARGIN: f64 = 1.5;
/// The "file" each stream reads from.
pub const SOURCE_BYTES: usize = 64 << 20;
/// Busy threads per CPU in the loaded condition.
pub const LOAD_THREADS_PER_CPU: usize = 2;

/// One stream's work: read the next `bytes` of the source in [`PIECE`]-sized pieces,
/// each copied into a send buffer and checksummed, as a server reading a file and
/// writing it to a socket would.
#[derive(Debug)]
struct Stream {
    source: Arc<Vec<u8>>,
    send: Vec<u8>,
    bytes: usize,
    offset: usize,
    checksum: u64,
}

/// Bytes per read/send step of a stream job.
pub const PIECE: usize = 64 << 10;

impl Stream {
    fn new(source: Arc<Vec<u8>>, bytes: usize) -> Stream {
        Stream { source, send: vec![0; PIECE], bytes: bytes.max(64), offset: 0, checksum: 0 }
    }

    fn job(&mut self) {
        self.job_until(None);
    }

    /// The job, abandoned between pieces once `until` has passed; whether it finished.
    fn job_until(&mut self, until: Option<Time>) -> bool {
        let src = &self.source;
        let mut done = 0;
        let mut sum = self.checksum;
        while done < self.bytes {
            if until.is_some_and(|u| clock::now() >= u) {
                return false;
            }
            let take = (self.bytes - done).min(PIECE).min(src.len() - self.offset);
            self.send[..take].copy_from_slice(&src[self.offset..self.offset + take]);
            for i in (0..take).step_by(64) {
                sum = sum.wrapping_mul(31).wrapping_add(u64::from(self.send[i]));
            }
            done += take;
            self.offset = (self.offset + take) % src.len();
        }
        self.checksum = std::hint::black_box(sum);
        true
    }
}

fn source() -> Arc<Vec<u8>> {
    Arc::new((0..SOURCE_BYTES).map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8).collect())
}

/// The fastest of `runs` jobs: the least disturbed by whatever else the machine runs.
fn fastest_job_seconds(s: &mut Stream, runs: usize) -> f64 {
    (0..runs)
        .map(|_| {
            let t0 = Instant::now();
            s.job();
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Bytes per second a stream job reads, from the fastest of several 8 MiB jobs.
fn calibrate(source: &Arc<Vec<u8>>) -> f64 {
    let mut s = Stream::new(Arc::clone(source), 8 << 20);
    s.job(); // warm up
    (8u64 << 20) as f64 / fastest_job_seconds(&mut s, 9).max(1e-9)
}

/// Sizes each stream's job for its share of [`UTILISATION`]: from the calibrated rate,
/// then once more from timing jobs of that size.
fn sized_specs(source: &Arc<Vec<u8>>, rate: f64) -> Vec<(Duration, usize, Duration)> {
    let mut out = specs(rate);
    for (period, bytes, wcet) in out.iter_mut() {
        let target = period.mul_f64(UTILISATION / PERIODS_MS.len() as f64).as_secs_f64();
        let mut s = Stream::new(Arc::clone(source), *bytes);
        let took = fastest_job_seconds(&mut s, 5);
        if took > 0.0 {
            *bytes = ((*bytes as f64) * target / took) as usize;
        }
        *wcet = Duration::from_secs_f64(target * WCET_MARGIN);
    }
    out
}

/// Whose run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Ours,
    Peer,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Ours => "ictus upcalls",
            Who::Peer => "timesharing threads",
        }
    }
}

/// One stream's result in one window.
#[derive(Clone, Debug)]
struct StreamResult {
    period_ms: u64,
    stats: UpcallStats,
    /// Response times (ns) of completed jobs: finish − release.
    response: Vec<u64>,
    /// Execution times (ns) of completed jobs: finish − start.
    exec: Vec<u64>,
}

fn specs(bytes_rate: f64) -> Vec<(Duration, usize, Duration)> {
    PERIODS_MS
        .iter()
        .map(|&p| {
            let period = Duration::from_millis(p);
            let cost = period.mul_f64(UTILISATION / PERIODS_MS.len() as f64);
            let bytes = (cost.as_secs_f64() * bytes_rate) as usize;
            (period, bytes, cost.mul_f64(WCET_MARGIN))
        })
        .collect()
}

/// Ours: the three upcalls on one runtime for `window`.
fn run_ours(
    source: &Arc<Vec<u8>>,
    specs: &[(Duration, usize, Duration)],
    window: Duration,
    granted: &mut Option<String>,
) -> Result<Vec<StreamResult>, BenchError> {
    let rt = Runtime::start(RuntimeConfig::default()).map_err(|e| BenchError::io("upcall runtime", io_err(e)))?;
    let mut ids = Vec::new();
    let mut recorders = Vec::new();
    for (period, bytes, wcet) in specs {
        let mut stream = Stream::new(Arc::clone(source), *bytes);
        let rec = Arc::new(Mutex::new((Vec::<u64>::new(), Vec::<u64>::new())));
        let r = Arc::clone(&rec);
        let id = rt
            .create(UpcallSpec::periodic(*period).with_cost(*wcet), move |job| {
                let started = clock::now();
                stream.job();
                let finished = clock::now();
                if let Ok(mut r) = r.lock() {
                    r.0.push(finished.saturating_duration_since(job.release).as_nanos() as u64);
                    r.1.push(finished.saturating_duration_since(started).as_nanos() as u64);
                }
            })
            .map_err(|e| BenchError::io("admission of the three upcalls", io_err(e)))?;
        ids.push(id);
        recorders.push(rec);
    }
    // Let the dispatcher take its reservation for the full set before releasing.
    let _ = rt.wait_configured();
    rt.resume_all(&ids).map_err(|e| BenchError::io("resume", io_err(e)))?;
    std::thread::sleep(window);
    for id in &ids {
        let _ = rt.suspend(*id);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while rt.running().is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if let Some(g) = rt.granted() {
        granted.get_or_insert(g.describe());
    }
    let mut out = Vec::new();
    for ((id, rec), &p) in ids.iter().zip(&recorders).zip(&PERIODS_MS) {
        let stats = rt.stats(*id).unwrap_or_default();
        let (response, exec) = rec.lock().map(|r| r.clone()).unwrap_or_default();
        out.push(StreamResult { period_ms: p, stats, response, exec });
    }
    Ok(out)
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// The peer: one timesharing thread per stream, sleeping until its next period.
fn run_peer(source: &Arc<Vec<u8>>, specs: &[(Duration, usize, Duration)], window: Duration) -> Vec<StreamResult> {
    let start = clock::now().saturating_add(Duration::from_millis(5));
    let end = start.saturating_add(window);
    let handles: Vec<_> = specs
        .iter()
        .zip(PERIODS_MS)
        .map(|(&(period, bytes, _), p)| {
            let mut stream = Stream::new(Arc::clone(source), bytes);
            std::thread::spawn(move || {
                configure_current_thread(&ThreadRequest {
                    policy: Some(Policy::Other { nice: 0 }),
                    ..ThreadRequest::default()
                });
                let mut response = Vec::new();
                let mut exec = Vec::new();
                // The same accounting as the upcalls', kept by this thread alone.
                let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
                let Ok(id) = d.create(UpcallSpec::periodic(period)) else {
                    return StreamResult { period_ms: p, stats: UpcallStats::default(), response, exec };
                };
                let _ = d.resume(id, start);
                loop {
                    let now = clock::now();
                    if now >= end {
                        break;
                    }
                    match d.next(now) {
                        Ok(Decision::Run(job)) => {
                            let started = clock::now();
                            // A job still running when the window closes is abandoned
                            // and not counted (in the peer's favour), so that a starved
                            // thread cannot stretch the experiment.
                            if !stream.job_until(Some(end)) {
                                break;
                            }
                            let finished = clock::now();
                            let _ = d.complete(id, finished);
                            response.push(finished.saturating_duration_since(job.release).as_nanos() as u64);
                            exec.push(finished.saturating_duration_since(started).as_nanos() as u64);
                        }
                        Ok(Decision::Idle { until: Some(t) }) => sleep_until(t.min(end)),
                        _ => break,
                    }
                }
                StreamResult { period_ms: p, stats: d.stats(id).unwrap_or_default(), response, exec }
            })
        })
        .collect();
    handles.into_iter().filter_map(|h| h.join().ok()).collect()
}

fn sleep_until(t: Time) {
    let ts = rustix::time::Timespec {
        tv_sec: (t.as_nanos() / 1_000_000_000) as i64,
        tv_nsec: (t.as_nanos() % 1_000_000_000) as _,
    };
    let _ = rustix::thread::clock_nanosleep_absolute(rustix::thread::ClockId::Monotonic, &ts);
}

/// Accumulated results of one (who, load) condition over its windows.
#[derive(Clone, Debug)]
struct Totals {
    who: Who,
    loaded: bool,
    per_stream: Vec<StreamResult>,
}

impl Totals {
    fn add(&mut self, results: Vec<StreamResult>) {
        for r in results {
            match self.per_stream.iter_mut().find(|s| s.period_ms == r.period_ms) {
                Some(s) => {
                    let a = &mut s.stats;
                    let b = r.stats;
                    a.released += b.released;
                    a.completed += b.completed;
                    a.late += b.late;
                    a.skipped += b.skipped;
                    a.worst_lateness = a.worst_lateness.max(b.worst_lateness);
                    a.worst_response = a.worst_response.max(b.worst_response);
                    s.response.extend_from_slice(&r.response);
                    s.exec.extend_from_slice(&r.exec);
                }
                None => self.per_stream.push(r),
            }
        }
    }

    fn misses(&self) -> u64 {
        self.per_stream.iter().map(|s| s.stats.misses()).sum()
    }

    /// Σ median execution time / period: the CPU share the streams really used.
    fn utilisation(&self) -> f64 {
        self.per_stream
            .iter()
            .map(|s| {
                let mut r = LatencyRecorder::new();
                r.record_all(&s.exec);
                r.quantile(0.5) as f64 / (s.period_ms as f64 * 1e6)
            })
            .sum()
    }
}

/// Runs the experiment.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    let conditions = Conditions::capture_before();
    let (window, rounds) = if opts.quick { (Duration::from_secs(3), 1) } else { (Duration::from_secs(30), 2) };

    // Set-up: the "file", and each stream's job sized for its share of the CPU.
    let src = source();
    let sizing = size_jobs(&src)?;

    // The measured windows: without load, then under CPU load; ours and the peer take
    // turns, never at once.
    let mut granted = None;
    let mut totals: Vec<Totals> = Vec::new();
    for loaded in [false, true] {
        let _load = match loaded {
            true => Some(start_cpu_load(window * 2 * rounds as u32 + Duration::from_secs(60))?),
            false => None,
        };
        for round in 0..rounds {
            let order = if round % 2 == 0 { [Who::Ours, Who::Peer] } else { [Who::Peer, Who::Ours] };
            for who in order {
                let results = match who {
                    Who::Ours => run_ours(&src, &sizing.specs, window, &mut granted)?,
                    Who::Peer => run_peer(&src, &sizing.specs, window),
                };
                match totals.iter_mut().find(|t| t.who == who && t.loaded == loaded) {
                    Some(t) => t.add(results),
                    None => totals.push(Totals { who, loaded, per_stream: results }),
                }
            }
        }
    }

    // Rows, the headline, the paper's figure.
    let mut conditions = conditions.finish();
    conditions.policy =
        format!("dispatcher {}; peer threads SCHED_OTHER nice 0", granted.as_deref().unwrap_or("unknown"));
    let mut report = Report::new(NAME, PAPER, opts.quick, conditions);
    report.hidden_in_table =
        ["mean_ns", "implementation", "load", "worst_response_ns"].iter().map(|s| s.to_string()).collect();
    let series = add_rows(&mut report, &totals);
    add_headline_and_figure(&mut report, &totals);
    add_notes(&mut report, &sizing, &totals, window, rounds);
    let plot = Plot {
        title: "Response time p99 of periodic stream jobs (001 Table 3)".to_string(),
        x: Axis { label: "period (ms)".to_string(), scale: Scale::Linear, ticks: TickFormat::Plain },
        y: Axis {
            label: "p99 response (finish − release)".to_string(),
            scale: Scale::Log10,
            ticks: TickFormat::Nanoseconds,
        },
        series,
    };
    Ok(Outcome::new(report, plot.render()))
}

/// How the jobs were sized: the calibrated rate, each stream's (period, bytes per job,
/// declared WCET), and the class the sizing ran in.
struct Sizing {
    rate: f64,
    specs: Vec<(Duration, usize, Duration)>,
    policy: String,
}

/// Sizes the jobs on a thread with the dispatcher's fixed priority (when permitted), so
/// that other processes do not inflate the timings the sizes come from.
fn size_jobs(src: &Arc<Vec<u8>>) -> Result<Sizing, BenchError> {
    let src = Arc::clone(src);
    std::thread::spawn(move || {
        let g = configure_current_thread(&ThreadRequest {
            policy: Some(Policy::Fifo { priority: 80 }),
            ..ThreadRequest::default()
        });
        let rate = calibrate(&src);
        Sizing { rate, specs: sized_specs(&src, rate), policy: g.describe() }
    })
    .join()
    .map_err(|_| BenchError::io("rtu: sizing the jobs", std::io::Error::other("panicked")))
}

/// The loaded condition's CPU load: a separate timesharing process with
/// [`LOAD_THREADS_PER_CPU`] busy threads per CPU, for `duration`.
fn start_cpu_load(duration: Duration) -> Result<ictus_bench::load::LoadProcess, BenchError> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cfg = LoadConfig { threads: Some(cpus * LOAD_THREADS_PER_CPU), dir: None };
    spawn_with(LoadKind::Cpu, duration, &cfg)
}

/// A row per implementation, load and stream; returns the plot's series (p99
/// response against period).
fn add_rows(report: &mut Report, totals: &[Totals]) -> Vec<Series> {
    let mut series = Vec::new();
    for t in totals {
        let load = if t.loaded { "cpu load" } else { "no load" };
        let mut points = Vec::new();
        for s in &t.per_stream {
            let mut recorder = LatencyRecorder::new();
            recorder.record_all(&s.response);
            let row = recorder
                .row(format!("{} {} ms, {load}", if t.who == Who::Ours { "upcall" } else { "thread" }, s.period_ms))
                .with("implementation", t.who.name())
                .with("load", load)
                .with("period_ms", s.period_ms)
                .with("released", s.stats.released)
                .with("completed", s.stats.completed)
                .with("late", s.stats.late)
                .with("skipped", s.stats.skipped)
                .with("misses", s.stats.misses())
                .with("worst_response_ns", s.stats.worst_response.as_nanos() as u64)
                .with("exec_p50_ns", {
                    let mut e = LatencyRecorder::new();
                    e.record_all(&s.exec);
                    e.quantile(0.5)
                });
            report.rows.push(row.to_value());
            points.push((s.period_ms as f64, recorder.quantile(0.99) as f64));
        }
        series.push(Series { name: format!("{}, {load}", t.who.name()), points });
    }
    series
}

/// `rtu_misses_loaded` (target: none at all) and the paper's "none missed".
fn add_headline_and_figure(report: &mut Report, totals: &[Totals]) {
    let misses = |who: Who, loaded: bool| {
        totals.iter().find(|t| t.who == who && t.loaded == loaded).map_or(0, Totals::misses) as f64
    };
    let ours = misses(Who::Ours, true);
    let peer = misses(Who::Peer, true);
    let mut h = Headline::new(
        HEADLINE,
        ours,
        peer,
        "the same work in 3 SCHED_OTHER threads sleeping until each period (clock_nanosleep)",
        "misses",
        Better::Lower,
    );
    // The target is absolute: no miss at all (ratio 0 whenever the peer missed).
    h.target = Some(0.0);
    h.met = Some(ours == 0.0);
    report.headline.push(h);
    report.paper_figures.push(
        PaperFigure::new(
            "deadline misses, upcalls of 60/75/120 ms, with CPU load",
            "none missed, with or without CPU load",
            Some(0.0),
            "misses",
            Better::Lower,
        )
        .ours(Some(ours), format!("{ours} under load, {} without", misses(Who::Ours, false))),
    );
}

/// How the numbers were made.
fn add_notes(report: &mut Report, sizing: &Sizing, totals: &[Totals], window: Duration, rounds: usize) {
    let per_job: Vec<String> = sizing
        .specs
        .iter()
        .zip(PERIODS_MS)
        .map(|((_, bytes, wcet), p)| {
            format!("{p} ms: {} KiB/job, declared WCET {:.1} ms", bytes >> 10, wcet.as_secs_f64() * 1e3)
        })
        .collect();
    report.notes.push(format!(
        "stream work: read a {} MiB source in 64 KiB pieces, copy each into a send buffer and checksum it; calibrated rate {:.0} MB/s (sized \
         under {}); utilisation {:.0} % as calibrated; {}",
        SOURCE_BYTES >> 20,
        sizing.rate / 1e6,
        sizing.policy,
        UTILISATION * 100.0,
        per_job.join("; ")
    ));
    let util: Vec<String> = totals
        .iter()
        .map(|t| {
            let load = if t.loaded { "cpu load" } else { "no load" };
            format!("{} {load} {:.0} %", t.who.name(), t.utilisation() * 100.0)
        })
        .collect();
    report.notes.push(format!("utilisation measured (Σ median job execution time / period): {}", util.join(", ")));
    report.notes.push(format!(
        "windows of {} s, {rounds} per implementation and load, ours and the peer alternating; CPU load = `ictus \
         load cpu` as a separate process, {LOAD_THREADS_PER_CPU} busy threads per CPU; \"no load\" means none of \
         ours: the machine is shared (load average {} before, {} after)",
        window.as_secs(),
        report.conditions.loadavg_before.map_or("?".to_string(), |l| format!("{l:.1}")),
        report.conditions.loadavg_after.map_or("?".to_string(), |l| format!("{l:.1}")),
    ));
    report.notes.push(
        "misses = jobs finished after their deadline (the end of their period) + periods skipped because the \
         previous job overran (a peer job still running when its window closes is abandoned, uncounted); response = finish − release, in the rows' percentiles; exec_p50 = median finish − \
         start"
            .to_string(),
    );
    if report.headline.first().is_some_and(|h| h.met == Some(false)) {
        report.notes.push(
            "ours missed: on a shared VM the hypervisor can take the vCPU away from even a deadline thread; the \
             rows show which upcall and by how much"
                .to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_jobs_wrap_around_the_source() {
        let src = Arc::new((0..1000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let mut s = Stream::new(Arc::clone(&src), 700);
        s.job();
        assert_eq!(s.offset, 700);
        assert_eq!(&s.send[..700], &src[..700]);
        s.job();
        // 300 bytes to the end of the source, then 400 from its start.
        assert_eq!(s.offset, 400);
        assert_eq!(&s.send[..400], &src[..400]);
        assert_eq!(&s.send[400..700], &src[400..700]);
        let mut t = Stream::new(Arc::clone(&src), 700);
        t.job();
        t.job();
        assert_eq!(s.checksum, t.checksum, "the work is deterministic");
    }

    #[test]
    fn the_paper_set_is_admitted_with_its_margin() {
        let specs = specs(1e9);
        let mut d = Dispatcher::default();
        for (period, _, wcet) in &specs {
            d.create(UpcallSpec::periodic(*period).with_cost(*wcet)).expect("admitted");
        }
        let u: f64 = specs.iter().map(|(p, _, c)| c.as_secs_f64() / p.as_secs_f64()).sum();
        assert!((u - UTILISATION * WCET_MARGIN).abs() < 1e-9);
    }

    #[test]
    fn ours_and_the_peer_both_run_every_stream() {
        let src = Arc::new(vec![7u8; 1 << 20]);
        let specs: Vec<_> =
            PERIODS_MS.iter().map(|&p| (Duration::from_millis(p), 4096, Duration::from_millis(1))).collect();
        let mut granted = None;
        // Generous windows: a timesharing thread on a loaded machine gets the CPU
        // within them; nothing here depends on how long a job takes.
        let ours = run_ours(&src, &specs, Duration::from_secs(2), &mut granted).expect("ours");
        let peer = run_peer(&src, &specs, Duration::from_secs(2));
        for results in [ours, peer] {
            assert_eq!(results.len(), 3);
            // The first job of each is released at the start and runs (a running job
            // always completes), whatever the machine's load.
            assert!(results.iter().all(|r| r.stats.released >= 1 && r.stats.completed >= 1), "{results:?}");
        }
        assert!(granted.is_some());
    }
}
