//! Real-Time Upcalls: the dispatcher's decisions, without the threads (001 §4.5).
//!
//! An upcall is "a function in a user program that is invoked periodically in
//! real-time". The paper's interface is `rtu_create` (a function and its period),
//! `rtu_run` and `rtu_suspend`; here they are [`Dispatcher::create`],
//! [`Dispatcher::resume`] and [`Dispatcher::suspend`], plus [`Dispatcher::destroy`].
//! This module holds only the decisions: which upcall runs next and when the dispatcher
//! should wake. The shell that calls the functions (a thread, with a `SCHED_DEADLINE`
//! or `SCHED_FIFO` reservation when permitted) lives elsewhere and drives it like
//! [`crate::sim`] does on a virtual clock:
//!
//! ```text
//! loop {
//!     match dispatcher.next(now())? {
//!         Decision::Run(job) => { call the upcall's function; dispatcher.complete(job.upcall, now())?; }
//!         Decision::Idle { until: Some(t) } => sleep until t, or a request,
//!         Decision::Idle { until: None } => wait for a request,
//!     }
//! }
//! ```
//!
//! # Scheduling
//!
//! Rate-monotonic, as the paper's "variant of the Rate Monotonic (RM) scheduling
//! policy": whenever the CPU is free the dispatcher runs the released job with the
//! shortest period, ties going to the upcall created first (the lower [`UpcallId`]).
//! There is **no asynchronous preemption among upcalls**: once [`Dispatcher::next`] has
//! returned [`Decision::Run`], the dispatcher makes no other decision until that job is
//! reported finished with [`Dispatcher::complete`]; asking meanwhile is an error
//! ([`NextError::Busy`]). A higher-priority job released in the meantime waits; the
//! admission test ([`crate::admission`]) accounts for that wait.
//!
//! # Releases, suspension and resumption
//!
//! An upcall is created suspended. [`Dispatcher::resume`] at `now` releases its first
//! job at `now`; later jobs are released every period on that grid. Suspending discards
//! a job that has been released but not started (it is not counted as a miss) and stops
//! releases; a job already running finishes normally. Resuming releases the next job at
//! `now`, but never less than one period after the previous release, so that suspending
//! and resuming cannot squeeze jobs closer together than the admission test assumed.
//! Admitted upcalls keep their reservation while suspended, so resuming never fails.
//!
//! # Overruns
//!
//! An upcall has at most one outstanding job; there is no backlog. When a release
//! instant arrives and the upcall's previous job has not completed:
//!
//! - if that job has not started, it is **superseded**: it is dropped, counted as
//!   skipped (a miss), and the new release takes its place, so the dispatcher always
//!   works on the freshest job (with deadlines at most the period, the dropped job's
//!   deadline has already passed);
//! - if that job is running, the new release is **skipped** and counted as a miss;
//!   the job finishes (no preemption), is counted late if it finished after its
//!   deadline, and the upcall's next job is released at the next instant of its grid
//!   at or after the completion.
//!
//! If the dispatcher is consulted late (the shell was descheduled), release instants
//! that passed unseen are skipped the same way and only the latest is released. So
//! every period in which an upcall's job was released but did not complete by its
//! deadline, or was never released, adds exactly one miss: `misses = late + skipped`.
//!
//! # Time
//!
//! Every operation takes the time as a parameter, and none reads a clock. Time is
//! expected not to go backwards; if it does, nothing is released early and intervals
//! saturate at zero.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::admission::{self, Analysis, Refusal, Task};
use crate::time::{duration_nanos, Time};

/// How many upcalls [`Dispatcher::default`] accepts. It also bounds the cost of an
/// admission decision (see [`admission::MAX_BUSY_PERIOD_RELEASES`]).
pub const DEFAULT_UPCALL_LIMIT: usize = 64;

/// Names an upcall of one dispatcher. Issued in increasing order and never reused, so
/// among upcalls of equal period the lower id was created first and has priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UpcallId(u32);

impl UpcallId {
    /// The id as it travels on the wire.
    pub const fn as_raw(self) -> u32 {
        self.0
    }
    /// An id from the wire (or for analysing tasks that are not in a dispatcher).
    /// Looking up an id the dispatcher never issued finds nothing.
    pub const fn from_raw(raw: u32) -> UpcallId {
        UpcallId(raw)
    }
}

impl fmt::Display for UpcallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upcall #{}", self.0)
    }
}

/// What a client asks for when it creates an upcall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UpcallSpec {
    /// Time between releases.
    pub period: Duration,
    /// Relative deadline: each job must finish this long after its release. `None`
    /// means the period. Must not exceed the period.
    pub deadline: Option<Duration>,
    /// Worst-case execution time of one job, including the dispatch overhead. Optional
    /// in a [best-effort](AdmissionPolicy::BestEffort) dispatcher, required in a
    /// [guaranteed](AdmissionPolicy::Guaranteed) one.
    pub cost: Option<Duration>,
}

impl UpcallSpec {
    /// A periodic upcall with its deadline at the end of its period and no stated cost.
    pub const fn periodic(period: Duration) -> UpcallSpec {
        UpcallSpec { period, deadline: None, cost: None }
    }
    /// With this relative deadline.
    pub const fn with_deadline(self, deadline: Duration) -> UpcallSpec {
        UpcallSpec { deadline: Some(deadline), ..self }
    }
    /// With this worst-case cost.
    pub const fn with_cost(self, cost: Duration) -> UpcallSpec {
        UpcallSpec { cost: Some(cost), ..self }
    }
    /// The relative deadline in effect.
    pub fn relative_deadline(&self) -> Duration {
        self.deadline.unwrap_or(self.period)
    }
}

/// What is wrong with an [`UpcallSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The period is zero.
    #[error("the period must be positive")]
    ZeroPeriod,
    /// The period does not fit the clock (over 584 years).
    #[error("the period is too long")]
    PeriodTooLong,
    /// The deadline is zero.
    #[error("the deadline must be positive")]
    ZeroDeadline,
    /// The deadline is after the period (only constrained deadlines are supported, so
    /// that an upcall has at most one job outstanding).
    #[error("the deadline ({deadline:?}) must not exceed the period ({period:?})")]
    DeadlineAfterPeriod {
        /// The requested deadline.
        deadline: Duration,
        /// The requested period.
        period: Duration,
    },
    /// The cost is zero.
    #[error("the worst-case cost must be positive")]
    ZeroCost,
}

/// Period and deadline checks shared with [`admission::Task::new`].
pub(crate) fn check_timing(period: Duration, deadline: Duration) -> Result<(), SpecError> {
    if period.is_zero() {
        return Err(SpecError::ZeroPeriod);
    }
    if u64::try_from(period.as_nanos()).is_err() {
        return Err(SpecError::PeriodTooLong);
    }
    if deadline.is_zero() {
        return Err(SpecError::ZeroDeadline);
    }
    if deadline > period {
        return Err(SpecError::DeadlineAfterPeriod { deadline, period });
    }
    Ok(())
}

/// Whether a dispatcher guarantees deadlines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AdmissionPolicy {
    /// Every upcall must state its cost, and one is created only if the whole set,
    /// with it, passes the admission test.
    #[default]
    Guaranteed,
    /// Anything is accepted (up to the dispatcher's limit); nothing is guaranteed.
    /// Misses are still counted. For experiments, and for comparing against the
    /// guaranteed dispatcher.
    BestEffort,
}

/// Why [`Dispatcher::create`] refused an upcall.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    /// The spec is malformed.
    #[error("invalid upcall: {0}")]
    InvalidSpec(#[from] SpecError),
    /// A guaranteed dispatcher needs the worst-case cost to decide.
    #[error("a guaranteed upcall must state its worst-case cost")]
    MissingCost,
    /// The dispatcher already holds its limit of upcalls.
    #[error("too many upcalls (limit {limit})")]
    TooMany {
        /// The dispatcher's limit.
        limit: usize,
    },
    /// The dispatcher has issued every id.
    #[error("upcall ids exhausted")]
    IdsExhausted,
    /// With this upcall, some upcall (perhaps an existing one) could miss a deadline.
    #[error("refused: {0}")]
    Unschedulable(Box<Refusal>),
}

/// The named upcall does not exist (never created, or destroyed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no such upcall: {0}")]
pub struct UnknownUpcall(pub UpcallId);

/// Why [`Dispatcher::destroy`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DestroyError {
    /// No such upcall.
    #[error(transparent)]
    Unknown(#[from] UnknownUpcall),
    /// Its job is running; suspend it, and destroy it once the job completes.
    #[error("{0} is running; destroy it after its job completes")]
    Running(UpcallId),
}

/// Why [`Dispatcher::next`] made no decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NextError {
    /// A job is running; no other decision is made until it completes.
    #[error("{} is running; complete it first", .0.upcall)]
    Busy(Job),
}

/// Why [`Dispatcher::complete`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompleteError {
    /// This upcall is not the one running.
    #[error("{upcall} is not running (running: {running:?})")]
    NotRunning {
        /// The upcall named.
        upcall: UpcallId,
        /// The one actually running, if any.
        running: Option<UpcallId>,
    },
}

/// Whether an upcall is being released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpcallState {
    /// Not released (created, or suspended). A job already running still completes.
    Suspended,
    /// Released every period (the paper's `rtu_run`).
    Active,
}

/// One invocation of an upcall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Job {
    /// Whose.
    pub upcall: UpcallId,
    /// When it was released.
    pub release: Time,
    /// When it must have finished: release plus the relative deadline.
    pub deadline: Time,
    /// How many jobs of this upcall were released before this one.
    pub number: u64,
}

/// The dispatcher's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Call this job's upcall now, then report it with [`Dispatcher::complete`].
    Run(Job),
    /// Nothing is released. Sleep until `until` (the next release), or indefinitely if
    /// `None` (no upcall is active); a request (create, resume…) may change the answer.
    Idle {
        /// The next release, if any.
        until: Option<Time>,
    },
}

/// What [`Dispatcher::complete`] recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The job.
    pub job: Job,
    /// When it finished.
    pub finished_at: Time,
    /// Finish minus release.
    pub response: Duration,
    /// How far past its deadline it finished, if it did (finishing exactly at the
    /// deadline is on time).
    pub lateness: Option<Duration>,
}

/// Counters kept per upcall, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UpcallStats {
    /// Jobs released (including any later superseded or discarded by suspension).
    pub released: u64,
    /// Jobs that ran to completion.
    pub completed: u64,
    /// Completed jobs that finished after their deadline.
    pub late: u64,
    /// Periods whose job never ran: superseded before it started, or not released
    /// because the previous job was still running or the dispatcher was consulted late.
    pub skipped: u64,
    /// The longest time by which a job finished after its deadline (zero if none did).
    pub worst_lateness: Duration,
    /// The longest response time (finish minus release) of a completed job.
    pub worst_response: Duration,
}

impl UpcallStats {
    /// Deadline misses: late completions plus skipped periods.
    pub fn misses(&self) -> u64 {
        self.late + self.skipped
    }
}

/// A snapshot of one upcall, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpcallInfo {
    /// Its id.
    pub id: UpcallId,
    /// What it was created with.
    pub spec: UpcallSpec,
    /// Released or not.
    pub state: UpcallState,
    /// When its next job will be released, if it is active.
    pub next_release: Option<Time>,
    /// Its counters.
    pub stats: UpcallStats,
}

#[derive(Clone, Copy, Debug)]
enum Outstanding {
    Pending(Job),
    Running,
}

#[derive(Clone, Debug)]
struct Upcall {
    spec: UpcallSpec,
    /// Period and relative deadline in nanoseconds (validated to fit).
    period: u64,
    deadline: u64,
    state: UpcallState,
    next_release: Option<Time>,
    last_release: Option<Time>,
    job: Option<Outstanding>,
    stats: UpcallStats,
}

impl Upcall {
    /// Release instants up to and including `upto`, for an upcall whose job is not
    /// running: the latest becomes the outstanding job, the others (and a job still
    /// pending from before) are skipped.
    fn release_upto(&mut self, id: UpcallId, upto: Time) {
        let Some(first) = self.next_release.filter(|r| *r <= upto) else { return };
        let passed = (upto.as_nanos() - first.as_nanos()) / self.period; // instants after the first
        let latest = Time::from_nanos(first.as_nanos() + passed * self.period);
        if let Some(Outstanding::Pending(_)) = self.job {
            self.stats.skipped += 1;
        }
        self.stats.skipped += passed;
        let job = Job {
            upcall: id,
            release: latest,
            deadline: latest.saturating_add(Duration::from_nanos(self.deadline)),
            number: self.stats.released,
        };
        self.stats.released += 1;
        self.job = Some(Outstanding::Pending(job));
        self.last_release = Some(latest);
        self.next_release = Some(latest.saturating_add(Duration::from_nanos(self.period)));
    }

    /// Release instants strictly before `before` while this upcall's job runs: all
    /// skipped.
    fn skip_before(&mut self, before: Time) {
        let Some(first) = self.next_release.filter(|r| *r < before) else { return };
        let count = (before.as_nanos() - 1 - first.as_nanos()) / self.period + 1;
        self.stats.skipped += count;
        let next = first.as_nanos().saturating_add(count.saturating_mul(self.period));
        self.next_release = Some(Time::from_nanos(next));
    }

    fn pending(&self) -> Option<Job> {
        match self.job {
            Some(Outstanding::Pending(job)) => Some(job),
            _ => None,
        }
    }
}

/// The Real-Time Upcall dispatcher's state and decisions. See the module documentation.
#[derive(Clone, Debug)]
pub struct Dispatcher {
    upcalls: BTreeMap<UpcallId, Upcall>,
    running: Option<Job>,
    next_id: u32,
    policy: AdmissionPolicy,
    limit: usize,
}

impl Default for Dispatcher {
    /// A [guaranteed](AdmissionPolicy::Guaranteed) dispatcher for up to
    /// [`DEFAULT_UPCALL_LIMIT`] upcalls.
    fn default() -> Self {
        Dispatcher::new(AdmissionPolicy::Guaranteed)
    }
}

impl Dispatcher {
    /// An empty dispatcher for up to [`DEFAULT_UPCALL_LIMIT`] upcalls.
    pub fn new(policy: AdmissionPolicy) -> Dispatcher {
        Dispatcher::with_limit(policy, DEFAULT_UPCALL_LIMIT)
    }

    /// An empty dispatcher for up to `limit` upcalls.
    pub fn with_limit(policy: AdmissionPolicy, limit: usize) -> Dispatcher {
        Dispatcher { upcalls: BTreeMap::new(), running: None, next_id: 0, policy, limit }
    }

    /// The admission policy.
    pub fn policy(&self) -> AdmissionPolicy {
        self.policy
    }

    /// Create an upcall (the paper's `rtu_create`), suspended. In a guaranteed
    /// dispatcher it is refused unless the set with it passes the admission test; the
    /// error names the upcall that would fail.
    pub fn create(&mut self, spec: UpcallSpec) -> Result<UpcallId, AdmissionError> {
        check_timing(spec.period, spec.relative_deadline())?;
        if spec.cost.is_some_and(|c| c.is_zero()) {
            return Err(SpecError::ZeroCost.into());
        }
        if self.upcalls.len() >= self.limit {
            return Err(AdmissionError::TooMany { limit: self.limit });
        }
        let id = UpcallId(self.next_id);
        let next_id = self.next_id.checked_add(1).ok_or(AdmissionError::IdsExhausted)?;
        if self.policy == AdmissionPolicy::Guaranteed {
            let cost = spec.cost.ok_or(AdmissionError::MissingCost)?;
            let mut tasks = self.tasks().ok_or(AdmissionError::MissingCost)?;
            tasks.push(Task::new(id, spec.period, spec.relative_deadline(), cost)?);
            if let Some(refusal) = Refusal::from_analysis(admission::analyse(&tasks)) {
                return Err(AdmissionError::Unschedulable(Box::new(refusal)));
            }
        }
        self.next_id = next_id;
        self.upcalls.insert(
            id,
            Upcall {
                spec,
                period: duration_nanos(spec.period),
                deadline: duration_nanos(spec.relative_deadline()),
                state: UpcallState::Suspended,
                next_release: None,
                last_release: None,
                job: None,
                stats: UpcallStats::default(),
            },
        );
        Ok(id)
    }

    /// Stop releasing an upcall (the paper's `rtu_suspend`). A released job that has
    /// not started is discarded (not a miss); a running one completes.
    pub fn suspend(&mut self, id: UpcallId) -> Result<(), UnknownUpcall> {
        let u = self.upcalls.get_mut(&id).ok_or(UnknownUpcall(id))?;
        u.state = UpcallState::Suspended;
        u.next_release = None;
        if let Some(Outstanding::Pending(_)) = u.job {
            u.job = None;
        }
        Ok(())
    }

    /// Start (or restart) releasing an upcall (the paper's `rtu_run`): its next job is
    /// released at `now`, or one period after its previous release if that is later.
    /// Resuming an active upcall changes nothing.
    pub fn resume(&mut self, id: UpcallId, now: Time) -> Result<(), UnknownUpcall> {
        let u = self.upcalls.get_mut(&id).ok_or(UnknownUpcall(id))?;
        if u.state == UpcallState::Active {
            return Ok(());
        }
        u.state = UpcallState::Active;
        let earliest = u.last_release.map_or(Time::ZERO, |l| l.saturating_add(Duration::from_nanos(u.period)));
        u.next_release = Some(now.max(earliest));
        Ok(())
    }

    /// Remove an upcall and free its reservation, returning its final counters. Refused
    /// while its job is running.
    pub fn destroy(&mut self, id: UpcallId) -> Result<UpcallStats, DestroyError> {
        if self.running.is_some_and(|j| j.upcall == id) {
            return Err(DestroyError::Running(id));
        }
        self.upcalls.remove(&id).map(|u| u.stats).ok_or(DestroyError::Unknown(UnknownUpcall(id)))
    }

    /// Release every job due at `now` (applying the overrun policy) without
    /// dispatching. [`Dispatcher::next`] does this itself; it is public so that a
    /// caller can look at the pending jobs at a given time, e.g. at the end of a
    /// simulation. The running upcall's releases are left for
    /// [`Dispatcher::complete`].
    pub fn release(&mut self, now: Time) {
        let running = self.running.map(|j| j.upcall);
        for (id, u) in self.upcalls.iter_mut() {
            if u.state == UpcallState::Active && Some(*id) != running {
                u.release_upto(*id, now);
            }
        }
    }

    /// The dispatch step: release what is due at `now`, then run the highest-priority
    /// released job, or say how long to stay idle. Refused while a job is running.
    pub fn next(&mut self, now: Time) -> Result<Decision, NextError> {
        if let Some(job) = self.running {
            return Err(NextError::Busy(job));
        }
        self.release(now);
        let best = self
            .upcalls
            .iter()
            .filter_map(|(id, u)| u.pending().map(|job| ((u.period, *id), job)))
            .min_by_key(|(key, _)| *key)
            .map(|(_, job)| job);
        if let Some(job) = best {
            if let Some(u) = self.upcalls.get_mut(&job.upcall) {
                u.job = Some(Outstanding::Running);
            }
            self.running = Some(job);
            return Ok(Decision::Run(job));
        }
        let until = self.upcalls.values().filter_map(|u| u.next_release).min();
        Ok(Decision::Idle { until })
    }

    /// Report that the running job of `id` finished at `finished_at`: count it (late if
    /// `finished_at` is after its deadline), skip the release instants it overran, and
    /// free the dispatcher for the next decision.
    pub fn complete(&mut self, id: UpcallId, finished_at: Time) -> Result<Completion, CompleteError> {
        let job = match self.running {
            Some(job) if job.upcall == id => job,
            other => return Err(CompleteError::NotRunning { upcall: id, running: other.map(|j| j.upcall) }),
        };
        self.running = None;
        let lateness = finished_at.checked_duration_since(job.deadline).filter(|d| !d.is_zero());
        let completion =
            Completion { job, finished_at, response: finished_at.saturating_duration_since(job.release), lateness };
        if let Some(u) = self.upcalls.get_mut(&id) {
            if u.state == UpcallState::Active {
                u.skip_before(finished_at);
            }
            u.job = None;
            let s = &mut u.stats;
            s.completed += 1;
            s.worst_response = s.worst_response.max(completion.response);
            if let Some(late) = lateness {
                s.late += 1;
                s.worst_lateness = s.worst_lateness.max(late);
            }
        }
        Ok(completion)
    }

    /// The job running, if any.
    pub fn running(&self) -> Option<Job> {
        self.running
    }

    /// Jobs released but not started, in priority order.
    pub fn pending_jobs(&self) -> Vec<Job> {
        let mut jobs: Vec<(u64, Job)> =
            self.upcalls.values().filter_map(|u| u.pending().map(|j| (u.period, j))).collect();
        jobs.sort_by_key(|(period, job)| (*period, job.upcall));
        jobs.into_iter().map(|(_, j)| j).collect()
    }

    /// One upcall's counters.
    pub fn stats(&self, id: UpcallId) -> Option<UpcallStats> {
        self.upcalls.get(&id).map(|u| u.stats)
    }

    /// One upcall's state.
    pub fn state(&self, id: UpcallId) -> Option<UpcallState> {
        self.upcalls.get(&id).map(|u| u.state)
    }

    /// Every upcall, by id.
    pub fn upcalls(&self) -> impl Iterator<Item = UpcallInfo> + '_ {
        self.upcalls.iter().map(|(id, u)| UpcallInfo {
            id: *id,
            spec: u.spec,
            state: u.state,
            next_release: u.next_release,
            stats: u.stats,
        })
    }

    /// Upcall ids in dispatch priority order, highest first.
    pub fn priority_order(&self) -> Vec<UpcallId> {
        let mut ids: Vec<(u64, UpcallId)> = self.upcalls.iter().map(|(id, u)| (u.period, *id)).collect();
        ids.sort();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// The admitted set as the analysis sees it; `None` if some upcall has no cost
    /// (possible only in a best-effort dispatcher).
    pub fn tasks(&self) -> Option<Vec<Task>> {
        self.upcalls
            .iter()
            .map(|(id, u)| Task::new(*id, u.spec.period, u.spec.relative_deadline(), u.spec.cost?).ok())
            .collect()
    }

    /// The admission analysis of the current set, for reports; `None` if some upcall
    /// has no cost.
    pub fn analysis(&self) -> Option<Analysis> {
        self.tasks().map(|t| admission::analyse(&t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
    fn at(n: u64) -> Time {
        Time::from_millis(n)
    }
    fn spec(period: u64, cost: u64) -> UpcallSpec {
        UpcallSpec::periodic(ms(period)).with_cost(ms(cost))
    }
    fn run(d: &mut Dispatcher, now: u64) -> Job {
        match d.next(at(now)).unwrap() {
            Decision::Run(job) => job,
            other => panic!("expected a job at {now} ms, got {other:?}"),
        }
    }

    #[test]
    fn created_suspended_then_released_on_a_grid() {
        let mut d = Dispatcher::default();
        let a = d.create(spec(10, 2)).unwrap();
        assert_eq!(d.state(a), Some(UpcallState::Suspended));
        assert_eq!(d.next(at(0)), Ok(Decision::Idle { until: None }));
        d.resume(a, at(5)).unwrap();
        assert_eq!(d.next(at(0)), Ok(Decision::Idle { until: Some(at(5)) }));
        let job = run(&mut d, 5);
        assert_eq!(job, Job { upcall: a, release: at(5), deadline: at(15), number: 0 });
        assert_eq!(d.running(), Some(job));
        assert_eq!(d.next(at(6)), Err(NextError::Busy(job)), "no other decision while a job runs");
        let done = d.complete(a, at(7)).unwrap();
        assert_eq!(done.response, ms(2));
        assert_eq!(done.lateness, None);
        assert_eq!(d.next(at(7)), Ok(Decision::Idle { until: Some(at(15)) }));
        assert_eq!(run(&mut d, 15).release, at(15));
        let s = d.stats(a).unwrap();
        assert_eq!((s.released, s.completed, s.misses()), (2, 1, 0));
    }

    #[test]
    fn rate_monotonic_order_ties_by_id() {
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let slow = d.create(UpcallSpec::periodic(ms(100))).unwrap();
        let fast_b = d.create(UpcallSpec::periodic(ms(10))).unwrap();
        let fast_a = d.create(UpcallSpec::periodic(ms(10))).unwrap();
        for id in [slow, fast_a, fast_b] {
            d.resume(id, at(0)).unwrap();
        }
        assert_eq!(d.priority_order(), vec![fast_b, fast_a, slow]);
        assert_eq!(d.pending_jobs(), vec![]);
        let mut order = Vec::new();
        for _ in 0..3 {
            let job = run(&mut d, 0);
            order.push(job.upcall);
            d.complete(job.upcall, at(0)).unwrap();
        }
        assert_eq!(order, vec![fast_b, fast_a, slow]);
    }

    #[test]
    fn no_preemption_a_running_job_blocks_a_more_urgent_one() {
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let fast = d.create(spec(10, 2)).unwrap();
        let slow = d.create(spec(100, 9)).unwrap();
        d.resume(slow, at(0)).unwrap();
        d.resume(fast, at(1)).unwrap();
        let job = run(&mut d, 0);
        assert_eq!(job.upcall, slow);
        // fast is released at 1 ms, but slow runs to 9 ms.
        assert!(d.next(at(1)).is_err());
        d.complete(slow, at(9)).unwrap();
        let job = run(&mut d, 9);
        assert_eq!((job.upcall, job.release, job.deadline), (fast, at(1), at(11)));
        let done = d.complete(fast, at(12)).unwrap();
        assert_eq!(done.lateness, Some(ms(1)));
        // Its release at 11 passed while it ran: that period is skipped too.
        let s = d.stats(fast).unwrap();
        assert_eq!((s.late, s.skipped, s.worst_lateness, s.worst_response), (1, 1, ms(1), ms(11)));
        assert_eq!(d.next(at(12)), Ok(Decision::Idle { until: Some(at(21)) }));
    }

    #[test]
    fn a_running_overrun_skips_releases_and_counts_them() {
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let a = d.create(spec(10, 2)).unwrap();
        d.resume(a, at(0)).unwrap();
        run(&mut d, 0);
        // Runs 35 ms: releases at 10, 20, 30 pass while it runs.
        let done = d.complete(a, at(35)).unwrap();
        assert_eq!(done.lateness, Some(ms(25)));
        let s = d.stats(a).unwrap();
        assert_eq!((s.late, s.skipped, s.misses()), (1, 3, 4));
        // No backlog: the next job is the one due at 40.
        assert_eq!(d.next(at(35)), Ok(Decision::Idle { until: Some(at(40)) }));
        let job = run(&mut d, 40);
        assert_eq!((job.release, job.number), (at(40), 1));
    }

    #[test]
    fn finishing_exactly_at_the_next_release_is_neither_late_nor_an_overrun() {
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let a = d.create(spec(10, 10)).unwrap();
        d.resume(a, at(0)).unwrap();
        run(&mut d, 0);
        assert_eq!(d.complete(a, at(10)).unwrap().lateness, None);
        assert_eq!(run(&mut d, 10).release, at(10));
        assert_eq!(d.stats(a).unwrap().misses(), 0);
    }

    #[test]
    fn a_pending_job_is_superseded_by_the_next_release() {
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let fast = d.create(spec(10, 1)).unwrap();
        let hog = d.create(spec(100, 50)).unwrap();
        d.resume(hog, at(0)).unwrap();
        d.resume(fast, at(1)).unwrap();
        run(&mut d, 0); // hog, 0..25
        d.complete(hog, at(25)).unwrap();
        // fast's releases at 1 and 11 passed unseen; 21 is the latest.
        let job = run(&mut d, 25);
        assert_eq!((job.upcall, job.release, job.number), (fast, at(21), 0));
        assert_eq!(d.stats(fast).unwrap().skipped, 2);
        d.complete(fast, at(26)).unwrap();
        // Consulted late while its job was pending: the pending job is superseded.
        run(&mut d, 31);
        d.complete(fast, at(32)).unwrap();
        d.release(at(41));
        assert_eq!(d.pending_jobs().len(), 1);
        let job = run(&mut d, 55);
        assert_eq!(job.release, at(51));
        let s = d.stats(fast).unwrap();
        assert_eq!((s.released, s.completed, s.skipped, s.late), (4, 2, 3, 0));
    }

    #[test]
    fn suspend_discards_a_pending_job_and_resume_keeps_the_spacing() {
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let a = d.create(spec(10, 1)).unwrap();
        let b = d.create(spec(20, 1)).unwrap();
        d.resume(a, at(0)).unwrap();
        d.resume(b, at(0)).unwrap();
        let job = run(&mut d, 0);
        assert_eq!(job.upcall, a);
        d.suspend(b).unwrap(); // b's pending job is dropped
        d.suspend(a).unwrap(); // a's running job completes
        assert_eq!(d.complete(a, at(1)).unwrap().job, job);
        assert_eq!(d.next(at(1)), Ok(Decision::Idle { until: None }));
        let sb = d.stats(b).unwrap();
        assert_eq!((sb.released, sb.completed, sb.misses()), (1, 0, 0));
        // Resumed 3 ms after its last release: the next release waits for the period.
        d.resume(a, at(3)).unwrap();
        d.resume(a, at(4)).unwrap(); // no-op
        assert_eq!(d.next(at(3)), Ok(Decision::Idle { until: Some(at(10)) }));
        // Resumed long after: released at once.
        d.resume(b, at(50)).unwrap();
        assert_eq!(d.upcalls().find(|u| u.id == b).unwrap().next_release, Some(at(50)));
        assert_eq!(d.state(b), Some(UpcallState::Active));
    }

    #[test]
    fn destroy_frees_the_reservation_but_not_while_running() {
        let mut d = Dispatcher::default();
        let a = d.create(spec(10, 6)).unwrap();
        assert!(matches!(d.create(spec(10, 6)), Err(AdmissionError::Unschedulable(_))));
        d.resume(a, at(0)).unwrap();
        run(&mut d, 0);
        assert_eq!(d.destroy(a), Err(DestroyError::Running(a)));
        d.complete(a, at(6)).unwrap();
        assert_eq!(d.destroy(a).map(|s| s.completed), Ok(1));
        assert_eq!(d.destroy(a), Err(DestroyError::Unknown(UnknownUpcall(a))));
        assert_eq!(d.suspend(a), Err(UnknownUpcall(a)));
        let b = d.create(spec(10, 6)).unwrap();
        assert!(b > a, "ids are not reused");
    }

    #[test]
    fn complete_must_name_the_running_upcall() {
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let a = d.create(spec(10, 1)).unwrap();
        let b = d.create(spec(10, 1)).unwrap();
        assert_eq!(d.complete(a, at(0)), Err(CompleteError::NotRunning { upcall: a, running: None }));
        d.resume(a, at(0)).unwrap();
        run(&mut d, 0);
        assert_eq!(d.complete(b, at(1)), Err(CompleteError::NotRunning { upcall: b, running: Some(a) }));
        assert!(d.complete(a, at(1)).is_ok());
    }

    #[test]
    fn guaranteed_admission_names_the_upcall_that_would_fail() {
        // The fast upcall is admitted first; the long one would block it.
        let mut d = Dispatcher::default();
        let fast = d.create(spec(10, 2)).unwrap();
        let err = d.create(spec(100, 9)).unwrap_err();
        let AdmissionError::Unschedulable(refusal) = &err else { panic!("{err:?}") };
        assert_eq!(refusal.failing.task.id(), fast);
        assert_eq!(refusal.failing.blocker, Some(UpcallId::from_raw(1)));
        let msg = err.to_string();
        assert!(msg.starts_with("refused: upcall #0 (period 10ms, cost 2ms, deadline 10ms) could miss"), "{msg}");
        assert!(msg.contains("lower-priority upcall #1"), "{msg}");
        // The refused id was not consumed, and a shorter one fits.
        assert_eq!(d.create(spec(100, 8)), Ok(UpcallId::from_raw(1)));

        // The other way round: the new fast upcall is the one that would fail.
        let mut d = Dispatcher::default();
        d.create(spec(100, 9)).unwrap();
        let Err(AdmissionError::Unschedulable(refusal)) = d.create(spec(10, 2)) else { panic!() };
        assert_eq!(refusal.failing.task.id(), UpcallId::from_raw(1));
        assert!(d.analysis().unwrap().is_schedulable());
    }

    #[test]
    fn invalid_and_unbounded_requests_are_refused() {
        let mut d = Dispatcher::with_limit(AdmissionPolicy::Guaranteed, 2);
        assert_eq!(d.create(UpcallSpec::periodic(ms(10))), Err(AdmissionError::MissingCost));
        assert_eq!(d.create(spec(0, 1)), Err(SpecError::ZeroPeriod.into()));
        assert_eq!(d.create(spec(10, 0)), Err(SpecError::ZeroCost.into()));
        assert_eq!(d.create(spec(10, 1).with_deadline(Duration::ZERO)), Err(SpecError::ZeroDeadline.into()));
        assert_eq!(
            d.create(spec(10, 1).with_deadline(ms(11))),
            Err(SpecError::DeadlineAfterPeriod { deadline: ms(11), period: ms(10) }.into())
        );
        assert_eq!(
            d.create(UpcallSpec::periodic(Duration::MAX).with_cost(ms(1))),
            Err(SpecError::PeriodTooLong.into())
        );
        d.create(spec(10, 1)).unwrap();
        d.create(spec(20, 1).with_deadline(ms(5))).unwrap();
        assert_eq!(d.create(spec(40, 1)), Err(AdmissionError::TooMany { limit: 2 }));
        assert_eq!(d.upcalls().count(), 2);
        assert_eq!(d.policy(), AdmissionPolicy::Guaranteed);

        // Best effort: a cost is optional, but then there is no analysis to report.
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        d.create(UpcallSpec::periodic(ms(10))).unwrap();
        assert!(d.analysis().is_none());
    }
}
