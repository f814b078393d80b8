//! `ictus bench alarm`: how late the clock's wake-ups are (000 §3.1, §5).
//!
//! Lateness is delivered − requested, for periodic wake-ups at 100 Hz and 1 kHz, by
//! five mechanisms measured **in the same window** (they run at once, so each sees the
//! same load, including the others):
//!
//! - **in-process sleep-until**: a thread sleeping with `clock_nanosleep(CLOCK_MONOTONIC,
//!   TIMER_ABSTIME)` on a grid of absolute deadlines ([`ictus_clock_server::local`]),
//!   lateness = `clock_gettime` after waking − deadline;
//! - **clock-server alarm**: a thread receiving the clock server's alarm messages on a
//!   port (the server in a child process of its own, benchmark role `clock-server`,
//!   its thread one priority above the measuring threads). It
//!   keeps a few alarms set ahead on the same grid; lateness = time after the receive −
//!   the alarm's requested time. It waits as [`AlarmWait::DEFAULT`] says: on the port
//!   with its own timer until 50 µs before the alarm's time, then polling (the server
//!   itself wakes 100 µs ahead and sends at the time; `doc/clock.md`). The
//!   server's own share (its `sent` stamp − requested) is a row of its own, and a
//!   second receiver on a grid of its own waits in a plain blocking receive
//!   ([`AlarmWait::BLOCK`]), the way the alarm was received before;
//! - **upcall**: a Real-Time Upcall with the same period ([`ictus_rt::runtime`]),
//!   lateness = start of the function − release;
//! - **cyclictest** (Debian `rt-tests`), the peer: one thread, the same interval, the
//!   same scheduling class and priority, as many loops, its histogram parsed
//!   (1 µs buckets, floored: this favours the peer by up to 1 µs).
//!
//! Our four grids are staggered by a quarter of a period, so that our own threads are
//! not all woken at the same instant (they would then measure their queueing behind
//! one another on a two-CPU machine rather than the mechanisms). Which quarter a grid
//! sits at shapes its p99 under a periodic load, so the in-process sleeper and the two
//! clock-server receivers trade their quarters each third of a window ([`Grid`]): each
//! spends a third of its wake-ups at each of the three, the same for all (the upcall's
//! period is fixed, and keeps the fourth).
//!
//! Each window runs under timesharing (`SCHED_OTHER`) and under fixed priority
//! (`SCHED_FIFO` 80), with no load and with each load of [`crate::load`] (quick mode:
//! none and CPU). Headlines: `alarm_p99_vs_cyclictest` (in-process fixed-priority p99
//! at 100 Hz under CPU load against cyclictest's p99 in the same window, target ≤ 1.5)
//! and `clock_server_alarm_p99_vs_inprocess` (the clock server's alarm p99 against the
//! in-process p99, same window, target ≤ 2). Both take each side's p99 within each of
//! three such windows and the median across them (`EXTRA_HEADLINE_WINDOWS`).

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ictus_bench::child::{fd_arg, num_arg, reap, spawn_child};
use ictus_bench::load;
use ictus_bench::plot::{Axis, Plot, Scale, Series, TickFormat};
use ictus_bench::windows::Windowed;
use ictus_bench::{BenchError, Conditions, Experiment, Options, Outcome, Role};
use ictus_bench::{Better, Headline, LatencyRecorder, Notes, PaperFigure, Report};
use ictus_clock_server::local::sleep_until;
use ictus_clock_server::{AlarmMessage, AlarmReceiver, AlarmWait, Client, Server};
use ictus_ipc::{Disposition, Message, Name, PortArg, ReceiveOptions, Received, RightKind, SendOptions, Space};
use ictus_rt::runtime::{Runtime, RuntimeConfig};
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_rt::{clock, AdmissionPolicy, Time, UpcallSpec, When};

use crate::peers::cyclictest::{self, parse_histogram};

/// `ictus bench alarm`.
pub static ALARM: Experiment = Experiment {
    name: "alarm",
    about: "Wake-up lateness (000 §3.1, §5): in-process sleep-until, clock-server alarm messages and upcalls at \
            100 Hz and 1 kHz, timesharing and fixed priority, under loads, beside cyclictest in the same window",
    figures: &[],
    quick_s: 30.0,
    full_s: 400.0,
    roles: &[&CLOCK_SERVER_ROLE],
    args,
    run,
};

/// `--pin-clock-pair CPU`.
fn args() -> Vec<clap::Arg> {
    vec![clap::Arg::new("pin-clock-pair")
        .long("pin-clock-pair")
        .value_name("CPU")
        .value_parser(ictus_args::cpu())
        .help(format!(
            "Pin the clock server and its receiving client together on this CPU under fixed priority (not \
             pinned by default; see doc/clock.md); {}",
            ictus_args::cpu_range_help()
        ))]
}

/// The fixed priority of the measuring threads and of cyclictest.
pub const FIFO_PRIORITY: u8 = 80;
/// Alarms the clock-server receiver keeps set ahead of the one it waits for.
const ALARMS_AHEAD: u64 = 4;

/// How the measuring threads are scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sched {
    /// `SCHED_OTHER` nice 0.
    Timesharing,
    /// `SCHED_FIFO` at this priority.
    Fixed(u8),
}

impl Sched {
    fn name(self) -> &'static str {
        match self {
            Sched::Timesharing => "timesharing",
            Sched::Fixed(_) => "fixed",
        }
    }

    fn policy(self) -> Policy {
        match self {
            Sched::Timesharing => Policy::Other { nice: 0 },
            Sched::Fixed(p) => Policy::Fifo { priority: p },
        }
    }

    /// Put the calling thread in this class (as far as permitted); what it got.
    fn apply(self) -> String {
        self.apply_on(None)
    }

    /// The same, and on this CPU only.
    fn apply_on(self, cpu: Option<usize>) -> String {
        let req = ThreadRequest { policy: Some(self.policy()), cpus: cpu.map(|c| vec![c]), ..ThreadRequest::default() };
        let granted = configure_current_thread(&req);
        match (cpu, &granted.cpus) {
            (Some(c), Some(cpus)) if cpus == &[c] => format!("{} on CPU {c}", granted.describe()),
            _ => granted.describe(),
        }
    }
}

/// What was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    /// `clock_nanosleep(TIMER_ABSTIME)` in the measuring thread.
    InProcess,
    /// Alarm messages from the clock server, as received by a receiver that waits on
    /// its own timer until the alarm's time, then polls ([`AlarmWait::DEFAULT`]).
    ClockServer,
    /// The same, received by a plain blocking receive ([`AlarmWait::BLOCK`]): what
    /// the clock server's alarms cost before the receiver polled.
    ClockServerBlocking,
    /// The clock server's send time of the same messages.
    ClockServerSent,
    /// A Real-Time Upcall.
    Upcall,
    /// cyclictest, the peer.
    Cyclictest,
}

impl Mechanism {
    /// The name in rows.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::InProcess => "in-process sleep-until",
            Mechanism::ClockServer => "clock-server alarm",
            Mechanism::ClockServerBlocking => "clock-server alarm (blocking receive)",
            Mechanism::ClockServerSent => "clock-server alarm (sent)",
            Mechanism::Upcall => "upcall",
            Mechanism::Cyclictest => "cyclictest",
        }
    }
}

/// Options of the experiment.
#[derive(Clone, Debug, Default)]
pub struct AlarmOptions {
    /// Seconds per window instead of tens of seconds, and only no load and CPU load.
    pub quick: bool,
    /// Print progress to standard error.
    pub progress: bool,
    /// Pin the clock server and its receiving client together on this CPU under fixed
    /// priority (`None`, the default: no pinning). Sharing a CPU spares the alarm an
    /// interprocessor wake-up (tens of µs on a VM) but leaves the pair nowhere to go
    /// when that CPU stalls; see `doc/clock.md`.
    pub pin_clock_pair: Option<usize>,
}

/// `ictus bench alarm [--pin-clock-pair CPU]`.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    run_with(&AlarmOptions { quick: opts.quick, progress: opts.progress, pin_clock_pair: pin_clock_pair(opts) })
}

/// `--pin-clock-pair`, read as the type its parser makes.
fn pin_clock_pair(opts: &Options) -> Option<usize> {
    opts.arg::<ictus_args::Cpu>("pin-clock-pair").map(ictus_args::Cpu::get)
}

/// One window's distributions.
struct Window {
    load: &'static str,
    sched: Sched,
    rate_hz: u64,
    results: Vec<(Mechanism, LatencyRecorder, String)>,
}

impl Window {
    fn get(&self, m: Mechanism) -> Option<&LatencyRecorder> {
        self.results.iter().find(|(mm, r, _)| *mm == m && r.count() > 0).map(|(_, r, _)| r)
    }
}

/// Start cyclictest for `loops` wake-ups at `interval`, scheduled as `sched`.
fn start_cyclictest(sched: Sched, interval: Duration, loops: u64) -> std::io::Result<std::process::Child> {
    let (prio, policy) = match sched {
        Sched::Timesharing => (0, "other"),
        Sched::Fixed(p) => (p, "fifo"),
    };
    cyclictest::spawn_histogram(policy, prio, interval, loops)
}

/// The quarters of the period the rotating grids sit at (the upcall keeps the
/// second).
const QUARTERS: [u32; 3] = [0, 1, 3];

/// A grid of `loops` deadlines one `interval` apart from `t0`, whose place within the
/// period rotates **every period**: deadline k is at
/// `t0 + k·interval + QUARTERS[(lane + (k − 1) mod 3) % 3]·interval/4`. Three grids on
/// lanes 0, 1 and 2 are a quarter of a period apart at every instant, and in any three
/// consecutive periods each visits each quarter once: a periodic disturbance at one
/// phase falls on each of them alike *and at the same times*, so a disturbance that
/// comes and goes within a window is shared too. (Until 2026-11-26 the grids traded
/// quarters only each third of a window, and a 100 ms stall of the whole machine at a
/// fixed phase, whose length changed within the window, decided the headline: see
/// `doc/clock.md`, *The 100 ms stall*.) Deadlines always increase (a step back from the
/// last quarter to the first still leaves a quarter of a period).
#[derive(Clone, Copy, Debug)]
struct Grid {
    t0: Time,
    interval: Duration,
    loops: u64,
    lane: usize,
}

impl Grid {
    /// Deadline `k` (1..=loops).
    fn at(&self, k: u64) -> Time {
        let quarter = QUARTERS[(self.lane + (k.saturating_sub(1) % 3) as usize) % 3];
        self.t0 + self.interval * k as u32 + self.interval * quarter / 4
    }
}

/// The in-process sleeper: the grid's deadlines, missed ones skipped as cyclictest
/// does.
fn in_process(sched: Sched, grid: Grid) -> (Vec<u64>, String) {
    let granted = sched.apply();
    let loops = grid.loops;
    let mut samples = Vec::with_capacity(loops as usize);
    let mut k = 1u64;
    while k <= loops {
        let deadline = grid.at(k);
        sleep_until(deadline);
        let now = clock::now();
        samples.push((now - deadline).as_nanos() as u64);
        k += 1;
        while k <= loops && grid.at(k) <= now {
            k += 1;
        }
    }
    (samples, granted)
}

/// The clock-server receiver: alarms on the same grid, a few set ahead, each waited
/// for as `wait` says.
fn server_alarms(
    sched: Sched,
    cpu: Option<usize>,
    clock_fd: std::os::fd::OwnedFd,
    wait: AlarmWait,
    grid: Grid,
) -> Result<(Vec<u64>, Vec<u64>, String), String> {
    let loops = grid.loops;
    let granted = sched.apply_on(cpu);
    let space = Space::new();
    let right = space.insert_send_fd(clock_fd).map_err(|e| e.to_string())?;
    let client = Client::from_right(&space, right).with_timeout(Duration::from_secs(10));
    let port = space.allocate_port().map_err(|e| e.to_string())?;
    let receiver = AlarmReceiver::new(&space, port, wait).map_err(|e| e.to_string())?;
    let at = |k: u64| grid.at(k);
    let mut next = 1u64;
    while next <= loops.min(ALARMS_AHEAD) {
        client.set_alarm(When::At(at(next)), port, next).map_err(|e| e.to_string())?;
        next += 1;
    }
    let (mut received, mut sent) = (Vec::with_capacity(loops as usize), Vec::with_capacity(loops as usize));
    let mut msg = Received::new();
    for k in 1..=loops {
        // Due at `at(k)` unless one was lost (then the next is only later: we block).
        receiver
            .receive(at(k), &mut msg, Some(Duration::from_secs(10)))
            .map_err(|e| format!("waiting for an alarm: {e}"))?;
        let now = clock::now();
        let alarm = AlarmMessage::parse(&msg).map_err(|e| e.to_string())?;
        received.push((now - alarm.requested).as_nanos() as u64);
        sent.push((alarm.sent - alarm.requested).as_nanos() as u64);
        if next <= loops {
            client.set_alarm(When::At(at(next)), port, next).map_err(|e| e.to_string())?;
            next += 1;
        }
    }
    let st = receiver.stats();
    let granted = format!(
        "{granted}; {} early, {} there on waking, {} polled, {} blocked",
        st.early, st.on_waking, st.polled, st.blocked
    );
    Ok((received, sent, granted))
}

/// The clock server's role.
pub static CLOCK_SERVER_ROLE: Role = Role { name: "clock-server", run: clock_server_role };

/// The benchmark child role `clock-server`: a clock server in a process of its own.
/// Arguments: a descriptor holding a send right to the parent's port (the server sends
/// a send right to its clock port there), a descriptor whose end of file stops it, the
/// `SCHED_FIFO` priority of its thread (0: timesharing) and the CPU to run on.
pub fn clock_server_role(args: &[String]) -> i32 {
    let run = || -> Result<(), String> {
        let reply = fd_arg(args.first().map_or("", String::as_str)).map_err(|e| format!("reply fd: {e}"))?;
        let stop = fd_arg(args.get(1).map_or("", String::as_str)).map_err(|e| format!("stop fd: {e}"))?;
        let priority = num_arg(args, 2, "priority").map_err(|e| e.to_string())?;
        let sched = match u8::try_from(priority) {
            Ok(0) => Sched::Timesharing,
            Ok(p) => Sched::Fixed(p.min(99)),
            Err(_) => return Err(format!("bad priority {priority}")),
        };
        // "none": not pinned.
        let cpu = num_arg(args, 3, "cpu").ok();
        sched.apply_on(cpu);
        let space = Space::task();
        let mut server = Server::new(space.clone()).map_err(|e| e.to_string())?;
        let parent = space.insert_send_fd(reply).map_err(|e| e.to_string())?;
        let mut msg = Message {
            id: 1,
            ports: vec![PortArg::new(server.clock_port(), Disposition::MakeSend)],
            ..Message::default()
        };
        space
            .send(parent, &mut msg, SendOptions { timeout: Some(Duration::from_secs(10)) })
            .map_err(|e| format!("handing the clock port over: {e}"))?;
        let _ = space.deallocate(parent);
        server.run(None, stop.as_fd()).map_err(|e| e.to_string())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("clock-server role: {e}");
            1
        }
    }
}

/// A clock server in a child process, and a send right to its clock port.
struct ServerProcess {
    child: Child,
    stop: Option<UnixStream>,
    space: Space,
    clock: Name,
}

impl ServerProcess {
    /// Start one whose thread runs as `sched` on `cpu`.
    fn start(sched: Sched, cpu: Option<usize>) -> Result<ServerProcess, BenchError> {
        let err = |what: &str, e: String| {
            BenchError::io(format!("starting the clock server: {what}"), std::io::Error::other(e))
        };
        let space = Space::new();
        let port = space.allocate_port().map_err(|e| err("port", e.to_string()))?;
        let reply = space.send_right_fd(port).map_err(|e| err("right", e.to_string()))?;
        let (stop, stop_child) = UnixStream::pair().map_err(|e| BenchError::io("stop channel", e))?;
        let priority = match sched {
            Sched::Fixed(p) => p.saturating_add(1).min(99),
            Sched::Timesharing => 0,
        };
        let args = [
            reply.as_raw_fd().to_string(),
            stop_child.as_raw_fd().to_string(),
            priority.to_string(),
            cpu.map_or_else(|| "none".to_string(), |c| c.to_string()),
        ];
        let child = spawn_child(&CLOCK_SERVER_ROLE, &args, &[reply.as_fd(), stop_child.as_fd()])
            .map_err(|e| BenchError::io("spawning the clock server", e))?;
        drop((reply, stop_child));
        let mut msg = Received::new();
        let opts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), ..ReceiveOptions::default() };
        let received = space.receive(port, &mut msg, opts);
        let clock = match (received, msg.ports.first()) {
            (Ok(()), Some(r)) if r.kind == RightKind::Send && msg.ports.len() == 1 => r.name,
            (r, _) => {
                let mut p = ServerProcess { child, stop: Some(stop), space, clock: Name::NULL };
                p.stop_now();
                return Err(err("no clock port came back", format!("{r:?}")));
            }
        };
        let _ = space.mod_refs(port, RightKind::Receive, -1);
        Ok(ServerProcess { child, stop: Some(stop), space, clock })
    }

    /// A new send right to the clock port, as a descriptor.
    fn clock_fd(&self) -> Result<OwnedFd, BenchError> {
        self.space
            .send_right_fd(self.clock)
            .map_err(|e| BenchError::io("clock right", std::io::Error::other(e.to_string())))
    }

    fn stop_now(&mut self) {
        drop(self.stop.take());
        reap(&mut self.child, Duration::from_secs(5));
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Run one window: every mechanism at once, on grids staggered by a quarter of the
/// period, the in-process sleeper's and the clock-server receivers' trading quarters
/// each third of the window ([`Grid`]).
fn window(
    sched: Sched,
    rate_hz: u64,
    secs: u64,
    server_cpu: Option<usize>,
    clock_fds: [std::os::fd::OwnedFd; 2],
    notes: &mut Notes,
) -> Window {
    let interval = Duration::from_nanos(1_000_000_000 / rate_hz);
    let loops = secs * rate_hz;
    // Our four grids are staggered by a quarter of the period: woken at one instant, our
    // threads would queue behind one another on two CPUs, and that is not what any of
    // them costs. (cyclictest's phase is its own.)
    let t0 = clock::now() + Duration::from_millis(100);
    let grid = move |lane: usize| Grid { t0, interval, loops, lane };
    let t_upcall = t0 + interval * 2 / 4;
    let [clock_fd, blocking_fd] = clock_fds;
    let end = t_upcall + interval * loops as u32;

    let cyclictest = start_cyclictest(sched, interval, loops);
    let sleeper = std::thread::spawn(move || in_process(sched, grid(0)));
    let wait = AlarmWait::DEFAULT;
    let receiver = std::thread::spawn(move || server_alarms(sched, server_cpu, clock_fd, wait, grid(1)));
    let blocking = std::thread::spawn(move || server_alarms(sched, server_cpu, blocking_fd, AlarmWait::BLOCK, grid(2)));
    let upcall = Upcall::start(sched, interval, t_upcall, end, notes);
    sleep_until(end + interval);
    let (upcall_samples, upcall_granted) = upcall.finish();

    let mut results = Vec::new();
    let (ours, granted) = sleeper.join().unwrap_or_else(|_| (Vec::new(), "panicked".into()));
    results.push((Mechanism::InProcess, recorded(&ours), granted));
    match receiver.join() {
        Ok(Ok((received, sent, granted))) => {
            results.push((Mechanism::ClockServer, recorded(&received), granted));
            let on = server_cpu.map_or_else(String::new, |c| format!(" on CPU {c}"));
            let server = match sched {
                Sched::Fixed(p) => format!("server: SCHED_FIFO {}{on}", p.saturating_add(1).min(99)),
                Sched::Timesharing => format!("server: SCHED_OTHER nice 0{on}"),
            };
            results.push((Mechanism::ClockServerSent, recorded(&sent), server));
        }
        Ok(Err(e)) => notes.not_measured(format!("clock-server alarms ({} {rate_hz} Hz)", sched.name()), e),
        Err(_) => notes.not_measured(
            format!("clock-server alarms ({} {rate_hz} Hz)", sched.name()),
            "the clock-server receiver panicked",
        ),
    }
    match blocking.join() {
        Ok(Ok((received, _, granted))) => results.push((Mechanism::ClockServerBlocking, recorded(&received), granted)),
        Ok(Err(e)) => notes.not_measured(format!("clock-server alarms, blocking ({} {rate_hz} Hz)", sched.name()), e),
        Err(_) => notes.not_measured(
            format!("clock-server alarms, blocking ({} {rate_hz} Hz)", sched.name()),
            "the blocking clock-server receiver panicked",
        ),
    }
    results.push((Mechanism::Upcall, recorded(&upcall_samples), upcall_granted));
    match cyclictest {
        Ok(child) => match cyclictest_histogram(child) {
            Ok(recorder) => {
                let policy = match sched {
                    Sched::Timesharing => "SCHED_OTHER".to_string(),
                    Sched::Fixed(p) => format!("SCHED_FIFO {p}"),
                };
                results.push((Mechanism::Cyclictest, recorder, policy));
            }
            Err(e) => notes.not_measured(format!("cyclictest ({} {rate_hz} Hz)", sched.name()), e),
        },
        Err(e) => notes.not_measured(
            format!("cyclictest ({} {rate_hz} Hz)", sched.name()),
            format!("could not run ({e}); install Debian rt-tests (scripts/setup.sh)"),
        ),
    }
    Window { load: "none", sched, rate_hz, results }
}

fn recorded(samples: &[u64]) -> LatencyRecorder {
    let mut r = LatencyRecorder::new();
    r.record_all(samples);
    r
}

/// cyclictest's latencies, once it has finished.
fn cyclictest_histogram(mut child: Child) -> Result<LatencyRecorder, String> {
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    let _ = child.wait();
    parse_histogram(&text).map(|h| h.recorder())
}

/// The upcall of a window: its dispatcher in the window's class, released on its grid
/// from `t_upcall`; lateness = start of the function − release, for releases before
/// `end`.
struct Upcall {
    runtime: Option<Runtime>,
    samples: Arc<Mutex<Vec<u64>>>,
    granted: String,
}

impl Upcall {
    fn start(sched: Sched, interval: Duration, t_upcall: Time, end: Time, notes: &mut Notes) -> Upcall {
        let config = RuntimeConfig {
            admission: AdmissionPolicy::BestEffort,
            use_deadline: false,
            fifo_priority: match sched {
                Sched::Fixed(p) => Some(p),
                Sched::Timesharing => None,
            },
            ..RuntimeConfig::default()
        };
        let samples = Arc::new(Mutex::new(Vec::new()));
        let rt = match Runtime::start(config) {
            Ok(rt) => rt,
            Err(e) => {
                notes.not_measured("upcalls", format!("the upcall runtime could not start: {e}"));
                return Upcall { runtime: None, samples, granted: "not started".into() };
            }
        };
        let granted = rt.granted().map_or_else(|| "unknown".into(), |g| g.describe());
        let shared = Arc::clone(&samples);
        let created = rt.create(UpcallSpec::periodic(interval), move |job| {
            let now = clock::now();
            if job.release < end {
                shared.lock().unwrap_or_else(|p| p.into_inner()).push((now - job.release).as_nanos() as u64);
            }
        });
        match created {
            Ok(id) => {
                sleep_until(t_upcall);
                if let Err(e) = rt.resume(id) {
                    notes.not_measured("upcalls", format!("could not run: {e}"));
                }
            }
            Err(e) => notes.not_measured("upcalls", format!("could not be created: {e}")),
        }
        Upcall { runtime: Some(rt), samples, granted }
    }

    /// Stops the dispatcher; the latencies and the class it obtained.
    fn finish(self) -> (Vec<u64>, String) {
        drop(self.runtime);
        let samples = std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()));
        (samples, self.granted)
    }
}

/// The classes the measuring threads run in, each window.
const SCHEDS: [Sched; 2] = [Sched::Timesharing, Sched::Fixed(FIFO_PRIORITY)];
/// The rates of the windows, Hz.
const RATES: [u64; 2] = [100, 1000];

/// More fixed-priority 100 Hz windows under CPU load, after the first: the headlines
/// take the p99 within each of these windows, on both sides, and the median across
/// them. The VM stalls every CPU for 1–9 ms every 100 ms; in one 3-s window whether a
/// grid's few worst wake-ups met a stall decided its p99 (`doc/clock.md`).
const EXTRA_HEADLINE_WINDOWS: usize = 2;

/// Seconds per window by rate: 300 wake-ups at 100 Hz in quick mode (a p99 that is the
/// third-worst sample: a smoke test), 2000 in full; more at 1 kHz in less time.
fn secs_for(quick: bool, rate: u64) -> u64 {
    match (quick, rate) {
        (true, 100) => 3,
        (true, _) => 1,
        (false, 100) => 20,
        (false, _) => 10,
    }
}

/// Runs the experiment with options of its own.
pub fn run_with(opts: &AlarmOptions) -> Result<Outcome, BenchError> {
    let mut conditions = Conditions::capture_before();
    let mut notes = Notes::new();

    // The measured windows: per load, per class, a window per rate.
    let per_load =
        Duration::from_secs(SCHEDS.len() as u64 * RATES.iter().map(|&r| secs_for(opts.quick, r) + 3).sum::<u64>() + 10)
            + Duration::from_secs((secs_for(opts.quick, 100) + 3) * EXTRA_HEADLINE_WINDOWS as u64);
    let mut windows = Vec::new();
    load::each_load(
        &load::standard_loads(opts.quick),
        &mut notes,
        |kind| load::spawn(kind, per_load),
        |load, notes| {
            for sched in SCHEDS {
                windows.extend(class_windows(load::load_name(load), sched, opts, notes)?);
            }
            Ok::<_, BenchError>(())
        },
    )?;

    // Rows, headlines, the paper's figures.
    let rt = ictus_rt::thread::rt_privileges();
    conditions.rt_privileges = rt;
    conditions.pinned = match opts.pin_clock_pair {
        Some(cpu) => format!("fixed priority: clock server and its receiving client on CPU {cpu}; the rest unpinned"),
        None => "none".to_string(),
    };
    let mut report = Report::new("alarm", "000 §3.1, §5 (Table 1); 001 §4.5", opts.quick, conditions.finish());
    report.conditions.policy =
        format!("measuring threads SCHED_OTHER and SCHED_FIFO {FIFO_PRIORITY} (see rows' granted)");
    if !rt {
        notes.not_measured(
            "fixed-priority rows",
            "real-time scheduling was refused: they ran timesharing (see granted)",
        );
    }
    add_rows(&mut report, &windows);
    add_headlines(&mut report, &windows);
    add_paper_figures(&mut report, &windows);
    notes.push(format!(
        "{} s per 100 Hz window, {} s per 1 kHz window; the five mechanisms run at once in each window, so each is \
         part of the others' load; under CPU load at fixed priority {} more 100 Hz windows, for the headlines' \
         median over windows",
        secs_for(opts.quick, 100),
        secs_for(opts.quick, 1000),
        EXTRA_HEADLINE_WINDOWS
    ));
    notes.push("cyclictest sets /dev/cpu_dma_latency to 0 while it runs, for every mechanism in its window alike");
    notes.push("the machine is shared with other builds: absolute numbers are noisy, ratios from one window less so");
    report.add_notes(notes);
    Ok(Outcome::new(report, plot(&windows)))
}

/// The windows of one load and class: one clock server process of that class, its
/// thread one priority above the clients, then a window per rate. The server and its
/// client are pinned together only if asked, and only under fixed priority, where the
/// pair always preempts whatever else runs on its CPU.
fn class_windows(
    load: &'static str,
    sched: Sched,
    opts: &AlarmOptions,
    notes: &mut Notes,
) -> Result<Vec<Window>, BenchError> {
    let pin = match sched {
        Sched::Fixed(_) => opts.pin_clock_pair,
        Sched::Timesharing => None,
    };
    let server = ServerProcess::start(sched, pin)?;
    let mut windows = Vec::new();
    let extra = match (load, sched) {
        ("cpu", Sched::Fixed(_)) => EXTRA_HEADLINE_WINDOWS,
        _ => 0,
    };
    for rate in RATES.into_iter().chain(std::iter::repeat(100).take(extra)) {
        let secs = secs_for(opts.quick, rate);
        if opts.progress {
            eprintln!("alarm: load {load}, {}, {rate} Hz, {secs} s", sched.name());
        }
        let fds = [server.clock_fd()?, server.clock_fd()?];
        let mut w = window(sched, rate, secs, pin, fds, notes);
        w.load = load;
        windows.push(w);
    }
    Ok(windows)
}

/// A row per window and mechanism (windows of the same load, class and rate numbered).
fn add_rows(report: &mut Report, windows: &[Window]) {
    let same = |a: &Window, b: &Window| a.load == b.load && a.sched == b.sched && a.rate_hz == b.rate_hz;
    for (i, w) in windows.iter().enumerate() {
        let n = windows.iter().filter(|o| same(o, w)).count();
        let k = windows[..i].iter().filter(|o| same(o, w)).count() + 1;
        let nth = if n > 1 { format!(" (window {k} of {n})") } else { String::new() };
        for (m, r, granted) in &w.results {
            let case = format!("{} {} {} Hz{nth}: {}", w.load, w.sched.name(), w.rate_hz, m.name());
            let row = r
                .row(case)
                .with("load", w.load)
                .with("sched", w.sched.name())
                .with("rate_hz", w.rate_hz)
                .with("mechanism", m.name())
                .with("granted", granted.as_str());
            report.rows.push(row.to_value());
        }
    }
    report.hidden_in_table =
        vec!["load".into(), "sched".into(), "rate_hz".into(), "mechanism".into(), "mean_ns".into()];
}

/// The window a headline or figure reads.
fn find<'w>(windows: &'w [Window], load: &str, sched: Sched, rate: u64) -> Option<&'w Window> {
    windows.iter().find(|w| w.load == load && w.sched.name() == sched.name() && w.rate_hz == rate)
}

/// `ours` against `peer` in every fixed-priority 100 Hz window under CPU load: each
/// side's p99 within each window, the median across the windows.
fn headline_windows(windows: &[Window], ours: Mechanism, peer: Mechanism) -> Option<Windowed> {
    let fixed = Sched::Fixed(FIFO_PRIORITY);
    let p99 = |w: &Window, m: Mechanism| w.get(m).map(|r| r.quantile(0.99) as f64);
    Windowed::new(
        windows
            .iter()
            .filter(|w| w.load == "cpu" && w.sched == fixed && w.rate_hz == 100)
            .filter_map(|w| Some((p99(w, ours)?, p99(w, peer)?))),
    )
}

/// `alarm_p99_vs_cyclictest` and `clock_server_alarm_p99_vs_inprocess`, from the
/// fixed-priority 100 Hz windows under CPU load ([`headline_windows`]), with a row
/// per window.
fn add_headlines(report: &mut Report, windows: &[Window]) {
    let across = |n: usize| format!("each side's p99 within each window, the median over {n} window(s)");
    if let Some(w) = headline_windows(windows, Mechanism::InProcess, Mechanism::Cyclictest) {
        report.headline.push(
            Headline::new(
                "alarm_p99_vs_cyclictest",
                w.ours,
                w.peer,
                format!(
                    "cyclictest (rt-tests) SCHED_FIFO {FIFO_PRIORITY}, 10 ms interval, same window, CPU load; {}",
                    across(w.windows.len())
                ),
                "ns",
                Better::Lower,
            )
            .with_target(1.5),
        );
        report.rows.extend(w.rows("cpu fixed 100 Hz: in-process p99 vs cyclictest p99", "ns"));
    }
    if let Some(w) = headline_windows(windows, Mechanism::ClockServer, Mechanism::InProcess) {
        report.headline.push(
            Headline::new(
                "clock_server_alarm_p99_vs_inprocess",
                w.ours,
                w.peer,
                format!(
                    "in-process clock_nanosleep(TIMER_ABSTIME), same window (SCHED_FIFO, 100 Hz, CPU load); {}",
                    across(w.windows.len())
                ),
                "ns",
                Better::Lower,
            )
            .with_target(2.0),
        );
        report.rows.extend(w.rows("cpu fixed 100 Hz: clock-server alarm p99 vs in-process p99", "ns"));
    }
}

/// The paper's Table 1 beside the clock-server alarms' worst delays.
fn add_paper_figures(report: &mut Report, windows: &[Window]) {
    // The paper's Table 1 (MIDI output at 100 Hz driven by the clock's alarms), as
    // context: the worst delay seen.
    let fixed = Sched::Fixed(FIFO_PRIORITY);
    let worst = |load: &str, sched: Sched| {
        find(windows, load, sched, 100).and_then(|w| w.get(Mechanism::ClockServer)).map(|r| r.quantile(1.0) as f64)
    };
    for (quantity, paper, paper_ns, load, sched) in [
        ("worst delay, fixed priority, no load", ">6 ms", 6e6, "none", fixed),
        ("worst delay, timesharing, no load", ">11 ms", 11e6, "none", Sched::Timesharing),
        ("worst delay, fixed priority, computation load", ">6 ms", 6e6, "cpu", fixed),
        ("worst delay, timesharing, computation load", ">200 ms", 200e6, "cpu", Sched::Timesharing),
    ] {
        let f = PaperFigure::new(quantity, paper, Some(paper_ns), "ns", Better::Lower);
        report.paper_figures.push(match worst(load, sched) {
            Some(v) => f.ours(Some(v), format!("clock-server alarm max {}", ictus_bench::format_ns(v))),
            None => f,
        });
    }
}

/// The lateness tails (one wake-up in N later than x) of the headline window, with the
/// timesharing in-process sleeper of the same load for contrast.
fn plot(windows: &[Window]) -> String {
    let mut series = Vec::new();
    let tail = |r: &LatencyRecorder| -> Vec<(f64, f64)> {
        let n = r.count().max(1) as f64;
        let mut pts: Vec<(f64, f64)> = [0.5, 0.9, 0.99, 0.999, 0.9999]
            .iter()
            .filter(|q| 1.0 - **q >= 1.0 / n)
            .map(|q| (r.quantile(*q) as f64, 1.0 - q))
            .collect();
        pts.push((r.quantile(1.0) as f64, 1.0 / n));
        pts
    };
    let load = if windows.iter().any(|w| w.load == "cpu") { "cpu" } else { "none" };
    for sched in SCHEDS {
        let Some(w) = find(windows, load, sched, 100) else { continue };
        for (m, r, _) in &w.results {
            let wanted = match w.sched {
                Sched::Fixed(_) => *m != Mechanism::ClockServerSent,
                Sched::Timesharing => matches!(m, Mechanism::InProcess | Mechanism::Cyclictest),
            };
            if wanted && r.count() > 0 {
                let class = if w.sched == Sched::Timesharing { "TS" } else { "FIFO" };
                series.push(Series { name: format!("{} {class}", m.name()), points: tail(r) });
            }
        }
    }
    Plot {
        title: format!("Wake-up lateness at 100 Hz, load {load}: fraction of wake-ups later than x"),
        x: Axis {
            label: "lateness (delivered − requested)".into(),
            scale: Scale::Log10,
            ticks: TickFormat::Nanoseconds,
        },
        y: Axis { label: "fraction later".into(), scale: Scale::Log10, ticks: TickFormat::Plain },
        series,
    }
    .render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_clock_pair_is_read_as_its_parser_makes_it() {
        let affinity = ictus_bench::pin::current_affinity();
        let cpu: usize = affinity.split(',').next().and_then(|c| c.parse().ok()).expect("a CPU");
        let cmd = ictus_args::harden(ictus_bench::cli::command(&ALARM));
        let m = cmd.clone().try_get_matches_from(["alarm", "--pin-clock-pair", &cpu.to_string()]).expect("a CPU");
        let opts = ictus_bench::cli::invocation(&m).expect("valid").options;
        assert_eq!(pin_clock_pair(&opts), Some(cpu));
        let m = cmd.clone().try_get_matches_from(["alarm"]).expect("ok");
        assert_eq!(pin_clock_pair(&ictus_bench::cli::invocation(&m).expect("valid").options), None);
        for bad in ["-1", "nan", "1e300", "99999"] {
            assert!(cmd.clone().try_get_matches_from(["alarm", "--pin-clock-pair", bad]).is_err(), "{bad}");
        }
    }

    /// Three lanes are a quarter of a period apart at every deadline, never on the
    /// upcall's quarter; each spends a third of the window at each quarter; every
    /// lane's deadlines increase.
    #[test]
    fn rotating_grids_share_the_quarters_alike() {
        let interval = Duration::from_millis(10);
        let t0 = Time::from_nanos(1_000_000_000);
        for loops in [1u64, 2, 3, 300, 1000, 2000] {
            let grids: Vec<Grid> = (0..3).map(|lane| Grid { t0, interval, loops, lane }).collect();
            let quarter_of = |g: &Grid, k: u64| ((g.at(k) - (t0 + interval * k as u32)).as_nanos() / 2_500_000) as u32;
            let mut counts = [[0u64; 4]; 3];
            for k in 1..=loops {
                let mut seen: Vec<u32> = grids.iter().map(|g| quarter_of(g, k)).collect();
                for (lane, q) in seen.iter().enumerate() {
                    counts[lane][*q as usize] += 1;
                }
                seen.sort_unstable();
                assert_eq!(seen, vec![0, 1, 3], "loops {loops}, k {k}");
                for g in &grids {
                    if k > 1 {
                        assert!(g.at(k) > g.at(k - 1), "loops {loops}, k {k}");
                    }
                }
            }
            if loops % 3 == 0 {
                for c in counts {
                    assert_eq!(c, [loops / 3, loops / 3, 0, loops / 3], "loops {loops}");
                }
            }
            // Any three consecutive periods visit the three quarters, on every lane.
            for k in 1..=loops.saturating_sub(2) {
                for g in &grids {
                    let mut seen: Vec<u32> = (k..k + 3).map(|j| quarter_of(g, j)).collect();
                    seen.sort_unstable();
                    assert_eq!(seen, vec![0, 1, 3], "loops {loops}, k {k}, lane {}", g.lane);
                }
            }
        }
    }

    #[test]
    fn headlines_take_each_windows_p99_and_the_median_across() {
        let fixed = Sched::Fixed(FIFO_PRIORITY);
        // 100 wake-ups per side: the p99 is the worst but one.
        let side = |base: u64, tail: u64| {
            let mut r = LatencyRecorder::new();
            r.record_all(&[base; 98]);
            r.record_all(&[tail, tail]);
            r
        };
        let window = |load, sched, rate_hz, ours: LatencyRecorder, peer: LatencyRecorder| Window {
            load,
            sched,
            rate_hz,
            results: vec![(Mechanism::InProcess, ours, String::new()), (Mechanism::Cyclictest, peer, String::new())],
        };
        let windows = [
            window("cpu", fixed, 100, side(20_000, 60_000), side(20_000, 50_000)),
            window("cpu", fixed, 1000, side(1, 1), side(1, 1)),
            window("cpu", Sched::Timesharing, 100, side(1, 9_000_000), side(1, 1)),
            // A stall of the machine fell on our grid's worst wake-ups in this window.
            window("cpu", fixed, 100, side(20_000, 9_000_000), side(20_000, 55_000)),
            window("none", fixed, 100, side(1, 1), side(1, 1)),
            window("cpu", fixed, 100, side(20_000, 70_000), side(20_000, 9_000_000)),
        ];
        let w = headline_windows(&windows, Mechanism::InProcess, Mechanism::Cyclictest).expect("windows");
        assert_eq!(w.windows.len(), 3, "the fixed 100 Hz windows under CPU load only");
        let near = |a: f64, b: f64| (a - b).abs() <= b * 1e-3;
        assert!(near(w.ours, 70_000.0) && near(w.peer, 55_000.0), "{w:?}");
        assert!(headline_windows(&windows, Mechanism::ClockServer, Mechanism::InProcess).is_none());
        let mut report = Report::new("alarm", "000", true, Conditions::capture_before());
        add_headlines(&mut report, &windows);
        assert_eq!(report.headline.len(), 1);
        assert_eq!(report.rows.len(), 4, "a row per window, then the median");
        add_rows(&mut report, &windows);
        assert!(report.rows.iter().any(|r| r["case"] == "cpu fixed 100 Hz (window 3 of 3): cyclictest"));
        assert!(report.rows.iter().any(|r| r["case"] == "cpu fixed 1000 Hz: in-process sleep-until"));
    }

    #[test]
    fn the_plot_is_well_formed() {
        let mut r = LatencyRecorder::new();
        r.record_all(&[1_000, 2_000, 50_000]);
        let w = Window {
            load: "cpu",
            sched: Sched::Fixed(FIFO_PRIORITY),
            rate_hz: 100,
            results: vec![(Mechanism::InProcess, r.clone(), String::new()), (Mechanism::Cyclictest, r, String::new())],
        };
        let svg = plot(&[w]);
        ictus_bench::plot::check_well_formed(&svg).unwrap();
        assert!(svg.contains("cyclictest"));
    }
}
