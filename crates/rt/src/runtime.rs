//! Real-Time Upcalls on the real clock: a dispatcher thread running the pure
//! [`Dispatcher`] (001 §4.5).
//!
//! [`Runtime::start`] starts one thread, `ictus-rtu`, that loops:
//!
//! 1. ask the dispatcher what to do at `clock::now()`;
//! 2. [`Decision::Run`]: call that upcall's function **to completion** on this thread
//!    (nothing else runs on it meanwhile, so there is no asynchronous preemption among
//!    upcalls), then report the completion; the dispatcher counts it late if it
//!    finished after its deadline and skips the periods it overran;
//! 3. [`Decision::Idle`]: sleep until the next release, on an **absolute**
//!    `CLOCK_MONOTONIC` time, or until a request from another thread changes the set.
//!
//! Other threads create, run (resume), suspend and destroy upcalls and read their
//! counters through a [`RuntimeHandle`]. Creation goes through the dispatcher's
//! admission control ([`crate::admission`]): a guaranteed runtime refuses a set it
//! cannot guarantee.
//!
//! # The dispatcher's CPU
//!
//! The admission test assumes the dispatcher has the CPU whenever it has work. Each
//! time the set of upcalls changes, the dispatcher thread asks for, in order:
//!
//! 1. a `SCHED_DEADLINE` reservation sized from the admitted set ([`reservation_for`]):
//!    bandwidth = utilisation × margin + 5 %, at most 95 %, over a reservation period
//!    of a twentieth of the shortest deadline (1–50 ms), so the longest the kernel can
//!    withhold the CPU from a runnable dispatcher, about two reservation periods, is a
//!    tenth of the tightest deadline;
//! 2. else `SCHED_FIFO` at [`RuntimeConfig::fifo_priority`];
//! 3. else timesharing, as it is.
//!
//! What it got is in [`RuntimeHandle::granted`]; a refusal warns once (see
//! [`crate::thread`]). Only the reservation guarantees the CPU; a fixed priority only
//! puts the dispatcher ahead of timesharing work.
//!
//! # Waking
//!
//! The dispatcher sleeps in `futex(FUTEX_WAIT_BITSET)` on a request counter, with an
//! absolute `CLOCK_MONOTONIC` timeout: the same high-resolution timer as
//! `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`, with no drift from converting to a
//! relative sleep, but one that another thread can cut short by bumping the counter
//! and calling `FUTEX_WAKE`. `clock_nanosleep` itself can only be interrupted by a
//! signal, which would also interrupt the upcalls' own system calls.
//!
//! # Failures of an upcall
//!
//! A function that panics is caught: its job is completed, the upcall is suspended and
//! counted in [`RuntimeStats::panicked`], and the others go on.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use crate::admission::Task;
use crate::clock;
use crate::thread::{configure_current_thread_preferring, Granted, Policy, ThreadRequest};
use crate::time::Time;
use crate::upcall::{
    AdmissionError, AdmissionPolicy, Decision, DestroyError, Dispatcher, Job, UnknownUpcall, UpcallId, UpcallInfo,
    UpcallSpec, UpcallStats,
};

/// An upcall's function: called with the job it serves, runs to completion.
pub type UpcallFn = Box<dyn FnMut(&Job) + Send + 'static>;

/// How to run the dispatcher.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeConfig {
    /// Guaranteed (admission-controlled, the default) or best effort.
    pub admission: AdmissionPolicy,
    /// Ask for a `SCHED_DEADLINE` reservation when the set's costs are known.
    pub use_deadline: bool,
    /// The `SCHED_FIFO` priority to fall back on; `None`: do not ask for one.
    pub fifo_priority: Option<u8>,
    /// The reservation's bandwidth is the set's utilisation times this, plus 5 %.
    pub margin: f64,
    /// CPUs for the dispatcher thread (a deadline reservation then cannot be had, see
    /// [`crate::thread`]).
    pub cpus: Option<Vec<usize>>,
    /// `mlockall` the process (see [`crate::thread`] before asking).
    pub lock_memory: bool,
    /// The most upcalls.
    pub limit: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            admission: AdmissionPolicy::Guaranteed,
            use_deadline: true,
            fifo_priority: Some(80),
            margin: 1.25,
            cpus: None,
            lock_memory: false,
            limit: crate::upcall::DEFAULT_UPCALL_LIMIT,
        }
    }
}

/// Why a runtime request failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Refused by admission control, or the spec is invalid.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// No such upcall.
    #[error(transparent)]
    Unknown(#[from] UnknownUpcall),
    /// An upcall tried to destroy itself while it runs; suspend it instead, or destroy
    /// it from another thread.
    #[error("{0} cannot destroy itself while it runs")]
    DestroyFromItself(UpcallId),
    /// The dispatcher thread has stopped.
    #[error("the upcall dispatcher has stopped")]
    Stopped,
    /// The dispatcher thread could not be started.
    #[error("starting the dispatcher thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Counters of the runtime as a whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Jobs run.
    pub jobs: u64,
    /// Upcall functions that panicked (each was then suspended).
    pub panicked: u64,
    /// Times the dispatcher re-applied its scheduling class after the set changed.
    pub reconfigurations: u64,
}

struct State {
    dispatcher: Dispatcher,
    functions: HashMap<UpcallId, UpcallFn>,
    /// Final counters of destroyed upcalls are not kept; this is the running job's id
    /// while its function is out of `functions`.
    running: Option<UpcallId>,
    granted: Option<Granted>,
    stats: RuntimeStats,
    /// Bumped whenever the set changes: the dispatcher should resize its reservation.
    config_wanted: u64,
    /// The `config_wanted` the dispatcher's current scheduling class was chosen for.
    config_applied: u64,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled after each completion (for `destroy` of a running upcall) and when the
    /// dispatcher has configured itself.
    changed: Condvar,
    /// Bumped by every request; the dispatcher sleeps on it (futex).
    requests: AtomicU32,
    config: RuntimeConfig,
    dispatcher_thread: Mutex<Option<ThreadId>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave `State` inconsistent in a way
        // that matters more than stopping would: carry on with the data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the dispatcher. Call after changing the state, lock released or not.
    fn poke(&self) {
        // SYNC POINT: the increment (Release) pairs with the dispatcher's load under
        // the lock (Acquire) before it decides to sleep.
        self.requests.fetch_add(1, Ordering::Release);
        let _ = rustix::thread::futex::wake(&self.requests, rustix::thread::futex::Flags::PRIVATE, 1);
    }
}

/// A running upcall dispatcher. Dropping it stops the dispatcher thread (after the job
/// running, if any) and drops every upcall.
pub struct Runtime {
    handle: RuntimeHandle,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("handle", &self.handle).finish()
    }
}

/// A handle on a [`Runtime`] for other threads (and for upcalls themselves).
#[derive(Clone)]
pub struct RuntimeHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for RuntimeHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.shared.lock();
        f.debug_struct("RuntimeHandle")
            .field("upcalls", &(s.functions.len() + usize::from(s.running.is_some())))
            .field("granted", &s.granted.as_ref().map(Granted::describe))
            .finish()
    }
}

impl Runtime {
    /// Starts the dispatcher thread and waits until it has configured its scheduling.
    pub fn start(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                dispatcher: Dispatcher::with_limit(config.admission, config.limit),
                functions: HashMap::new(),
                running: None,
                granted: None,
                stats: RuntimeStats::default(),
                config_wanted: 1,
                config_applied: 0,
                shutdown: false,
            }),
            changed: Condvar::new(),
            requests: AtomicU32::new(0),
            config,
            dispatcher_thread: Mutex::new(None),
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ictus-rtu".to_string())
            .spawn(move || dispatch(&for_thread))
            .map_err(RuntimeError::Spawn)?;
        let handle = RuntimeHandle { shared };
        {
            let mut s = handle.shared.lock();
            while s.granted.is_none() && !s.shutdown {
                s = handle.shared.changed.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        }
        Ok(Runtime { handle, thread: Some(thread) })
    }

    /// A handle for other threads.
    pub fn handle(&self) -> RuntimeHandle {
        self.handle.clone()
    }
}

impl std::ops::Deref for Runtime {
    type Target = RuntimeHandle;
    fn deref(&self) -> &RuntimeHandle {
        &self.handle
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.handle.shared.lock().shutdown = true;
        self.handle.shared.poke();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl RuntimeHandle {
    fn live(&self) -> Result<MutexGuard<'_, State>, RuntimeError> {
        let s = self.shared.lock();
        if s.shutdown {
            return Err(RuntimeError::Stopped);
        }
        Ok(s)
    }

    /// Creates an upcall, suspended (the paper's `rtu_create`). Refused if admission
    /// control cannot guarantee the set with it.
    pub fn create(&self, spec: UpcallSpec, f: impl FnMut(&Job) + Send + 'static) -> Result<UpcallId, RuntimeError> {
        let mut s = self.live()?;
        let id = s.dispatcher.create(spec)?;
        s.functions.insert(id, Box::new(f));
        s.config_wanted += 1;
        drop(s);
        self.shared.poke();
        Ok(id)
    }

    /// Starts releasing an upcall now (the paper's `rtu_run`).
    pub fn resume(&self, id: UpcallId) -> Result<(), RuntimeError> {
        self.resume_all(&[id])
    }

    /// Starts releasing several upcalls at one instant, so that their first jobs are
    /// released together (in phase). Nothing is resumed if any id is unknown.
    pub fn resume_all(&self, ids: &[UpcallId]) -> Result<(), RuntimeError> {
        let mut s = self.live()?;
        if let Some(bad) = ids.iter().find(|id| s.dispatcher.state(**id).is_none()) {
            return Err(UnknownUpcall(*bad).into());
        }
        let now = clock::now();
        for id in ids {
            s.dispatcher.resume(*id, now)?;
        }
        drop(s);
        self.shared.poke();
        Ok(())
    }

    /// Stops releasing an upcall (the paper's `rtu_suspend`). A job already running
    /// completes; a released job that has not started is dropped.
    pub fn suspend(&self, id: UpcallId) -> Result<(), RuntimeError> {
        self.live()?.dispatcher.suspend(id)?;
        self.shared.poke();
        Ok(())
    }

    /// Destroys an upcall and returns its final counters. If its job is running, it is
    /// suspended and this waits for the job to complete.
    pub fn destroy(&self, id: UpcallId) -> Result<UpcallStats, RuntimeError> {
        let on_dispatcher = *self.shared.dispatcher_thread.lock().unwrap_or_else(|p| p.into_inner())
            == Some(std::thread::current().id());
        let mut s = self.live()?;
        loop {
            match s.dispatcher.destroy(id) {
                Ok(stats) => {
                    s.functions.remove(&id);
                    s.config_wanted += 1;
                    drop(s);
                    self.shared.poke();
                    return Ok(stats);
                }
                Err(DestroyError::Unknown(u)) => return Err(u.into()),
                Err(DestroyError::Running(_)) if on_dispatcher => return Err(RuntimeError::DestroyFromItself(id)),
                Err(DestroyError::Running(_)) => {
                    s.dispatcher.suspend(id)?;
                    s = self.shared.changed.wait(s).unwrap_or_else(|p| p.into_inner());
                    if s.shutdown {
                        return Err(RuntimeError::Stopped);
                    }
                }
            }
        }
    }

    /// An upcall's counters (released, completed, late, skipped, worst lateness and
    /// response); `misses()` is late + skipped.
    pub fn stats(&self, id: UpcallId) -> Option<UpcallStats> {
        self.shared.lock().dispatcher.stats(id)
    }

    /// Every upcall's spec, state and counters.
    pub fn upcalls(&self) -> Vec<UpcallInfo> {
        self.shared.lock().dispatcher.upcalls().collect()
    }

    /// The upcall whose job is running now, if any.
    pub fn running(&self) -> Option<UpcallId> {
        self.shared.lock().running
    }

    /// What the dispatcher thread was granted the last time it configured itself.
    pub fn granted(&self) -> Option<Granted> {
        self.shared.lock().granted.clone()
    }

    /// Waits until the dispatcher has chosen its scheduling class for the current set
    /// (after `create`/`destroy` it resizes its reservation on its next turn), and
    /// returns what it was granted. `None` if the runtime stopped.
    pub fn wait_configured(&self) -> Option<Granted> {
        let mut s = self.shared.lock();
        while s.config_applied != s.config_wanted && !s.shutdown {
            s = self.shared.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.shutdown {
            return None;
        }
        s.granted.clone()
    }

    /// Counters of the runtime as a whole.
    pub fn runtime_stats(&self) -> RuntimeStats {
        self.shared.lock().stats
    }

    /// The `SCHED_DEADLINE` reservation the current set calls for, if any.
    pub fn reservation(&self) -> Option<Policy> {
        let s = self.shared.lock();
        s.dispatcher.tasks().and_then(|t| reservation_for(&t, self.shared.config.margin))
    }
}

/// The `SCHED_DEADLINE` reservation for a set of tasks: `None` for an empty set.
///
/// Bandwidth `min(0.95, U × margin + 0.05)` of a reservation period `P` of a
/// twentieth of the shortest relative deadline, clamped to 1–50 ms; relative deadline
/// `P`. A runnable reserved thread waits at most about `2 (P − runtime)` for the CPU,
/// a tenth of the tightest deadline. This is sizing, not analysis: the admission test
/// still assumes the whole CPU (see `doc/rt.md`).
pub fn reservation_for(tasks: &[Task], margin: f64) -> Option<Policy> {
    let shortest = tasks.iter().map(Task::deadline).min()?;
    let utilisation: f64 = tasks.iter().map(Task::utilization).sum();
    let margin = if margin.is_finite() { margin.clamp(1.0, 10.0) } else { 1.0 };
    let bandwidth = (utilisation * margin + 0.05).clamp(0.05, 0.95);
    let period = (shortest / 20).clamp(Duration::from_millis(1), Duration::from_millis(50));
    let runtime = period.mul_f64(bandwidth).max(Duration::from_micros(50));
    Some(Policy::Deadline { runtime, deadline: period, period })
}

/// The dispatcher thread's body.
fn dispatch(shared: &Shared) {
    *shared.dispatcher_thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current().id());
    let mut s = shared.lock();
    loop {
        if s.shutdown {
            break;
        }
        if s.config_applied != s.config_wanted {
            let wanted = s.config_wanted;
            let tasks = s.dispatcher.tasks();
            drop(s);
            let granted = configure(&shared.config, tasks.as_deref());
            s = shared.lock();
            s.granted = Some(granted);
            s.config_applied = wanted;
            s.stats.reconfigurations += 1;
            shared.changed.notify_all();
            continue;
        }
        // SYNC POINT: read the request counter under the lock, before deciding; a
        // request made after this bumps it, and the futex wait below returns at once.
        let seen = shared.requests.load(Ordering::Acquire);
        let decision = match s.dispatcher.next(clock::now()) {
            Ok(d) => d,
            // Not reachable: this thread completes every job it starts.
            Err(_) => break,
        };
        match decision {
            Decision::Run(job) => {
                let Some(mut f) = s.functions.remove(&job.upcall) else {
                    // A function always exists for a live upcall; be safe anyway.
                    let _ = s.dispatcher.complete(job.upcall, clock::now());
                    continue;
                };
                s.running = Some(job.upcall);
                drop(s);
                let outcome = catch_unwind(AssertUnwindSafe(|| f(&job)));
                let finished = clock::now();
                s = shared.lock();
                let _ = s.dispatcher.complete(job.upcall, finished);
                s.running = None;
                s.stats.jobs += 1;
                if outcome.is_err() {
                    s.stats.panicked += 1;
                    let _ = s.dispatcher.suspend(job.upcall);
                    eprintln!("ictus: {} panicked; suspended", job.upcall);
                }
                s.functions.insert(job.upcall, f);
                shared.changed.notify_all();
            }
            Decision::Idle { until } => {
                drop(s);
                sleep_until(&shared.requests, seen, until);
                s = shared.lock();
            }
        }
    }
    s.shutdown = true;
    s.functions.clear();
    shared.changed.notify_all();
}

/// Applies the policy the set calls for to the calling (dispatcher) thread.
fn configure(config: &RuntimeConfig, tasks: Option<&[Task]>) -> Granted {
    let mut choices = Vec::new();
    if config.use_deadline {
        if let Some(res) = tasks.and_then(|t| reservation_for(t, config.margin)) {
            choices.push(res);
        }
    }
    if let Some(p) = config.fifo_priority {
        choices.push(Policy::Fifo { priority: p });
    }
    let req = ThreadRequest {
        policy: None,
        cpus: config.cpus.clone(),
        lock_memory: config.lock_memory,
        timer_slack: Some(Duration::ZERO),
    };
    configure_current_thread_preferring(&choices, &req)
}

/// Sleeps until `until` (absolute, `CLOCK_MONOTONIC`) or until `requests` moves past
/// `seen`, whichever is first. `None`: until a request.
fn sleep_until(requests: &AtomicU32, seen: u32, until: Option<Time>) {
    use rustix::thread::futex;
    let timeout = until.map(|t| rustix::time::Timespec {
        tv_sec: (t.as_nanos() / 1_000_000_000) as i64,
        tv_nsec: (t.as_nanos() % 1_000_000_000) as _,
    });
    // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout. It returns on a
    // wake, on the timeout (ETIMEDOUT), if the counter already moved (EAGAIN) or on a
    // signal (EINTR); in every case the loop re-reads the clock and decides again.
    let _ = futex::wait_bitset(requests, futex::Flags::PRIVATE, seen, timeout.as_ref(), NonZeroU32::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn reservation_is_sized_from_the_set() {
        assert_eq!(reservation_for(&[], 1.25), None);
        let t = |id, p, c| Task::implicit(UpcallId::from_raw(id), ms(p), ms(c)).expect("task");
        let set = [t(0, 60, 12), t(1, 75, 15), t(2, 120, 24)]; // U = 0.6
        let Some(Policy::Deadline { runtime, deadline, period }) = reservation_for(&set, 1.25) else { panic!() };
        assert_eq!(period, ms(3)); // 60 ms / 20
        assert_eq!(deadline, period);
        let bw = runtime.as_secs_f64() / period.as_secs_f64();
        assert!((bw - 0.8).abs() < 1e-6, "{bw}");
        // Saturates at 95 %, and periods stay within 1–50 ms.
        let heavy = [t(0, 10_000, 9_000)];
        let Some(Policy::Deadline { runtime, period, .. }) = reservation_for(&heavy, 2.0) else { panic!() };
        assert_eq!(period, ms(50));
        assert!((runtime.as_secs_f64() / period.as_secs_f64() - 0.95).abs() < 1e-6);
        let tight = [t(0, 2, 1)];
        let Some(Policy::Deadline { period, .. }) = reservation_for(&tight, f64::NAN) else { panic!() };
        assert_eq!(period, ms(1));
    }

    /// Waits for `cond` with a generous watchdog; never asserts how long it took.
    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(60), "watchdog: {what}");
            std::thread::sleep(ms(2));
        }
    }

    fn cost(period: u64, c: u64) -> UpcallSpec {
        UpcallSpec::periodic(ms(period)).with_cost(ms(c))
    }

    #[test]
    fn the_dispatcher_reports_the_class_it_got() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        let g = rt.granted().expect("configured before start returns");
        // No upcalls: no reservation to ask for, so FIFO if permitted.
        if crate::thread::rt_privileges() {
            assert_eq!(g.policy, Policy::Fifo { priority: 80 });
        } else {
            assert!(!g.policy.is_realtime());
        }
        let id = rt.create(cost(60, 5), |_| {}).expect("admitted");
        let want = rt.reservation().expect("a set with costs has a reservation");
        let g = rt.wait_configured().expect("configured for the new set");
        assert!(rt.runtime_stats().reconfigurations >= 2);
        // Granted, or refused with the kernel's reason (other tests' reservations may
        // hold the bandwidth at this moment: EBUSY).
        match g.refusal(crate::thread::RefusalKind::Deadline) {
            None => assert_eq!(g.policy, want, "{g:?}"),
            Some(r) => assert!(r.errno.is_some() && g.policy != want, "{g:?}"),
        }
        rt.destroy(id).expect("destroy");
    }

    #[test]
    fn upcalls_first_run_in_rate_monotonic_order() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        let (tx, rx) = mpsc::channel();
        let mut ids = Vec::new();
        // Created slowest first, so that id order is the opposite of priority order.
        for period in [3000u64, 2000, 1000] {
            let tx = tx.clone();
            ids.push(rt.create(cost(period, 1), move |job| tx.send(job.upcall).expect("send")).expect("admitted"));
        }
        rt.resume_all(&ids).expect("resume");
        let mut first = Vec::new();
        while first.len() < 3 {
            let id = rx.recv_timeout(Duration::from_secs(60)).expect("watchdog: upcalls run");
            if !first.contains(&id) {
                first.push(id);
            }
        }
        assert_eq!(first, vec![ids[2], ids[1], ids[0]], "shortest period first");
    }

    #[test]
    fn suspend_stops_runs_and_resume_restarts_them() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        let (tx, rx) = mpsc::channel();
        let a = rt.create(cost(10, 1), move |_| tx.send(()).expect("send")).expect("admitted");
        rt.resume(a).expect("resume");
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(60)).expect("watchdog: runs");
        }
        rt.suspend(a).expect("suspend");
        wait_for("not running", || rt.running() != Some(a));
        let frozen = rt.stats(a).expect("stats");
        while rx.try_recv().is_ok() {}
        // Give the dispatcher many chances to run it: another upcall runs 20 times.
        let (tx2, rx2) = mpsc::channel();
        let b = rt.create(cost(5, 1), move |_| tx2.send(()).expect("send")).expect("admitted");
        rt.resume(b).expect("resume");
        for _ in 0..20 {
            rx2.recv_timeout(Duration::from_secs(60)).expect("watchdog: b runs");
        }
        assert!(rx.try_recv().is_err(), "a suspended upcall ran");
        let s = rt.stats(a).expect("stats");
        assert_eq!((s.released, s.completed), (frozen.released, frozen.completed));
        rt.resume(a).expect("resume again");
        rx.recv_timeout(Duration::from_secs(60)).expect("watchdog: runs after resume");
    }

    #[test]
    fn destroy_removes_an_upcall_even_while_it_runs() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        let (started_tx, started_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let a = rt
            .create(cost(50, 1), move |_| {
                let _ = started_tx.send(());
                let _ = go_rx.recv_timeout(Duration::from_secs(60));
            })
            .expect("admitted");
        rt.resume(a).expect("resume");
        started_rx.recv_timeout(Duration::from_secs(60)).expect("watchdog: runs");
        assert_eq!(rt.running(), Some(a));
        let h = rt.handle();
        let destroyer = std::thread::spawn(move || h.destroy(a));
        // The destroyer waits for the job; let it finish.
        wait_for("destroy suspended it", || {
            rt.upcalls().iter().any(|u| u.id == a && u.state == crate::upcall::UpcallState::Suspended)
        });
        go_tx.send(()).expect("go");
        let stats = destroyer.join().expect("join").expect("destroyed");
        assert_eq!(stats.completed, 1);
        assert!(rt.stats(a).is_none());
        assert!(matches!(rt.resume(a), Err(RuntimeError::Unknown(_))));
        assert!(matches!(rt.destroy(a), Err(RuntimeError::Unknown(_))));
    }

    #[test]
    fn admission_refuses_a_set_it_cannot_guarantee() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        rt.create(cost(10, 2), |_| {}).expect("admitted");
        // Blocking by a 9 ms job makes the 10 ms upcall miss (see doc/rt.md).
        let err = rt.create(cost(100, 9), |_| {}).expect_err("refused");
        assert!(matches!(err, RuntimeError::Admission(AdmissionError::Unschedulable(_))), "{err}");
        assert!(matches!(rt.create(UpcallSpec::periodic(ms(10)), |_| {}), Err(RuntimeError::Admission(_))));
        assert_eq!(rt.upcalls().len(), 1);
    }

    #[test]
    fn an_overrunning_upcall_has_its_misses_counted() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        // Declares 1 ms, takes at least 30 ms: past its 10 ms deadline every time.
        let liar = rt.create(cost(10, 1), |_| std::thread::sleep(ms(30))).expect("admitted");
        let (tx, rx) = mpsc::channel();
        let honest = rt.create(cost(1000, 1), move |_| tx.send(()).expect("send")).expect("admitted");
        rt.resume_all(&[liar, honest]).expect("resume");
        wait_for("two overruns", || rt.stats(liar).is_some_and(|s| s.completed >= 2));
        let s = rt.stats(liar).expect("stats");
        assert!(s.late >= 2, "{s:?}");
        assert!(s.skipped >= 2, "each overrun skips the releases it covered: {s:?}");
        assert!(s.worst_lateness >= ms(20), "{s:?}");
        rx.recv_timeout(Duration::from_secs(60)).expect("the other upcall still runs");
        assert_eq!(rt.stats(honest).map(|s| s.completed >= 1), Some(true));
    }

    #[test]
    fn a_panicking_upcall_is_suspended_and_the_others_go_on() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        let bad = rt.create(cost(10, 1), |_| panic!("deliberate")).expect("admitted");
        let (tx, rx) = mpsc::channel();
        let good = rt.create(cost(20, 1), move |_| tx.send(()).expect("send")).expect("admitted");
        rt.resume_all(&[bad, good]).expect("resume");
        wait_for("the panic is caught", || rt.runtime_stats().panicked == 1);
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(60)).expect("watchdog: good runs");
        }
        assert_eq!(rt.stats(bad).map(|s| s.completed), Some(1));
        assert_eq!(rt.runtime_stats().panicked, 1);
    }

    #[test]
    fn an_upcall_can_suspend_itself_but_not_destroy_itself() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        let h = rt.handle();
        let (tx, rx) = mpsc::channel();
        let slot = Arc::new(Mutex::new(None::<UpcallId>));
        let me = Arc::clone(&slot);
        let id = rt
            .create(cost(10, 1), move |job| {
                let r = h.destroy(job.upcall);
                let _ = h.suspend(job.upcall);
                let _ = tx.send(matches!(r, Err(RuntimeError::DestroyFromItself(_))));
                let _ = me.lock().map(|mut m| *m = Some(job.upcall));
            })
            .expect("admitted");
        rt.resume(id).expect("resume");
        assert!(rx.recv_timeout(Duration::from_secs(60)).expect("watchdog"), "destroy from itself refused");
        wait_for("suspended", || rt.running().is_none());
        assert_eq!(rt.stats(id).map(|s| s.completed), Some(1));
        drop(rt);
        // The runtime is gone; the handle says so.
    }

    #[test]
    fn a_stopped_runtime_refuses_requests() {
        let rt = Runtime::start(RuntimeConfig::default()).expect("start");
        let h = rt.handle();
        drop(rt);
        assert!(matches!(h.create(cost(10, 1), |_| {}), Err(RuntimeError::Stopped)));
    }
}
