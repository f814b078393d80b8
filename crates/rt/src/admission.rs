//! Admission control for non-preemptive rate-monotonic scheduling.
//!
//! Real-Time Upcalls run to completion: the dispatcher never takes the CPU from an
//! upcall to give it to a more urgent one (001 §4.5, "no asynchronous preemption").
//! That makes the classic Liu–Layland test (`U ≤ n(2^{1/n} − 1)`) unsound: it assumes a
//! newly released high-priority job runs at once, whereas here it may wait for a
//! lower-priority upcall that has just started. Two upcalls with a utilisation of 0.29
//! are enough to break it: one of period 10 ms and cost 2 ms, one of period 100 ms and
//! cost 9 ms. If the long one starts just before the short one is released, the short
//! one finishes 11 ms after its release, past its 10 ms deadline.
//!
//! # The test
//!
//! This module implements the response-time analysis for non-preemptive fixed-priority
//! scheduling in the form given by Davis, Burns, Bril and Lukkien (*Controller Area
//! Network (CAN) schedulability analysis: refuted, revisited and revised*, Real-Time
//! Systems 35, 2007, §5), with no release jitter, in discrete time as in George,
//! Rivierre and Spuri (*Preemptive and non-preemptive real-time uniprocessor
//! scheduling*, INRIA RR-2966, 1996). Priorities are rate-monotonic, exactly as the
//! dispatcher orders upcalls: shorter period first, ties broken by the lower
//! [`UpcallId`]. For each task *i* (cost *Cᵢ*, period *Tᵢ*, deadline *Dᵢ ≤ Tᵢ*):
//!
//! 1. **Blocking** `Bᵢ = max { Cⱼ : j has lower priority than i }` (zero for the lowest):
//!    the longest lower-priority upcall that may have started just before. (George et
//!    al. use `Cⱼ − 1` in discrete time; the full `Cⱼ` is a tick more cautious and
//!    absorbs a little dispatcher overhead.)
//! 2. **Level-i busy period** `Lᵢ`, the least fixed point of
//!    `L = Bᵢ + Σ_{j ∈ hp(i) ∪ {i}} ⌈L / Tⱼ⌉ Cⱼ`. Under non-preemptive scheduling the
//!    first job of *i* is not necessarily the worst: a job of *i*, running unpreempted,
//!    pushes higher-priority releases into the wait of *i*'s next job. Checking only the
//!    first job is the error Davis et al. corrected; so every job in the busy period is
//!    checked: `Qᵢ = ⌈Lᵢ / Tᵢ⌉` jobs.
//! 3. For each job `q = 0 … Qᵢ − 1`, its **start time** `wᵢ,q`, the least fixed point of
//!    `w = Bᵢ + q Cᵢ + Σ_{j ∈ hp(i)} (⌊w / Tⱼ⌋ + 1) Cⱼ`. The `⌊·⌋ + 1` counts a
//!    higher-priority job released exactly at `w` as still ahead of job *q*, as the
//!    dispatcher does (it releases everything due before it picks). Once started, the
//!    job runs to completion: its **response time** is `Rᵢ,q = wᵢ,q + Cᵢ − q Tᵢ`.
//! 4. Task *i* is schedulable if `Rᵢ,q ≤ Dᵢ` for every *q*.
//!
//! A set is admitted if every task in it is schedulable. The test is sufficient (it
//! never admits a set that can miss a deadline when every job takes at most its cost
//! and releases are at least a period apart) but not necessary: it assumes the worst
//! alignment of releases and blocking, which a periodic set with fixed phases may never
//! reach. It is monotone: removing a task never makes another one fail, because
//! blocking, interference and busy periods can only shrink.
//!
//! # Cost and limits
//!
//! The analysis is pseudo-polynomial. Because it runs on requests from untrusted
//! clients, it refuses (soundly: refusing is always safe) any task whose level busy
//! period would contain more than [`MAX_BUSY_PERIOD_RELEASES`] releases, which also
//! covers every set whose utilisation at or above some priority reaches 1 (the busy
//! period then never ends). Refusal for this reason is reported as
//! [`Outcome::Inconclusive`], not as a deadline miss.
//!
//! The utilisation and the Liu–Layland bound are reported alongside for comparison;
//! neither takes part in the decision.

use std::cmp::Ordering;
use std::fmt;
use std::time::Duration;

use crate::upcall::{SpecError, UpcallId};

/// The most releases (summed over the task and those of higher priority) a task's level
/// busy period may contain before the analysis gives up and refuses the set. With the
/// worst case of 64 upcalls, this bounds one admission decision to about 10⁸ simple
/// steps.
pub const MAX_BUSY_PERIOD_RELEASES: u64 = 20_000;

/// A safety net on fixed-point iterations for the start times of one task. The
/// iterations are bounded by the releases in the busy period plus the jobs checked, so
/// this is not expected to be reached; if it is, the task is refused as inconclusive.
const MAX_START_TIME_STEPS: u64 = 4 * MAX_BUSY_PERIOD_RELEASES + 64;

/// One periodic task as the analysis sees it: an upcall with its worst-case cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Task {
    id: UpcallId,
    period: Duration,
    deadline: Duration,
    cost: Duration,
}

impl Task {
    /// A task, checked like an upcall's spec: period and cost positive, deadline
    /// positive and at most the period. A cost above the deadline is accepted here
    /// (the analysis then reports the task unschedulable).
    pub fn new(id: UpcallId, period: Duration, deadline: Duration, cost: Duration) -> Result<Task, SpecError> {
        crate::upcall::check_timing(period, deadline)?;
        if cost.is_zero() {
            return Err(SpecError::ZeroCost);
        }
        Ok(Task { id, period, deadline, cost })
    }

    /// A task whose deadline is its period.
    pub fn implicit(id: UpcallId, period: Duration, cost: Duration) -> Result<Task, SpecError> {
        Task::new(id, period, period, cost)
    }

    /// The upcall this task stands for; also the tie-break between equal periods.
    pub fn id(&self) -> UpcallId {
        self.id
    }
    /// Time between releases.
    pub fn period(&self) -> Duration {
        self.period
    }
    /// Relative deadline: each job must finish this long after its release.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }
    /// Worst-case execution time of one job.
    pub fn cost(&self) -> Duration {
        self.cost
    }
    /// This task's share of the CPU, `cost / period`.
    pub fn utilization(&self) -> f64 {
        self.cost.as_secs_f64() / self.period.as_secs_f64()
    }
}

/// Rate-monotonic priority order, highest first: shorter period first, ties by the
/// lower id. The dispatcher uses the same order.
pub fn rate_monotonic(a: &Task, b: &Task) -> Ordering {
    (a.period, a.id).cmp(&(b.period, b.id))
}

/// The verdict on one task.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every job meets its deadline.
    Meets {
        /// The longest response time of any job in the busy period.
        worst_response: Duration,
        /// The level busy period's length.
        busy_period: Duration,
        /// Jobs in the busy period, all checked.
        jobs_checked: u64,
    },
    /// A job can finish after its deadline.
    Misses {
        /// Which job of the busy period (0 = the one released at its start).
        job: u64,
        /// Its response time, or the value the iteration had reached when it passed
        /// the deadline (the analysis stops there, so this is a lower bound).
        response: Duration,
    },
    /// The analysis gave up, and the set is refused: the level busy period contains
    /// more than [`MAX_BUSY_PERIOD_RELEASES`] releases (or never ends, when the
    /// utilisation at or above this priority reaches 1).
    Inconclusive {
        /// The utilisation of this task and those of higher priority.
        hep_utilization: f64,
    },
}

/// The analysis of one task of a set.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskVerdict {
    /// The task.
    pub task: Task,
    /// Its priority rank, 0 the highest.
    pub rank: usize,
    /// The longest blocking by a lower-priority task (non-preemption's price).
    pub blocking: Duration,
    /// The lower-priority task that can block longest, if any.
    pub blocker: Option<UpcallId>,
    /// The verdict.
    pub outcome: Outcome,
}

impl TaskVerdict {
    /// Every job of this task meets its deadline.
    pub fn is_schedulable(&self) -> bool {
        matches!(self.outcome, Outcome::Meets { .. })
    }
}

/// The analysis of a whole set, for the decision and for reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Analysis {
    /// Total utilisation, `Σ cost / period`.
    pub utilization: f64,
    /// The Liu–Layland bound `n(2^{1/n} − 1)` for this many tasks (1 for none).
    /// Reported for comparison only: it is neither necessary nor, without preemption,
    /// sufficient.
    pub liu_layland_bound: f64,
    /// One verdict per task, in priority order (highest first).
    pub tasks: Vec<TaskVerdict>,
}

impl Analysis {
    /// Every task meets its deadlines.
    pub fn is_schedulable(&self) -> bool {
        self.tasks.iter().all(TaskVerdict::is_schedulable)
    }

    /// The highest-priority task that fails, if any.
    pub fn first_failure(&self) -> Option<&TaskVerdict> {
        self.tasks.iter().find(|v| !v.is_schedulable())
    }

    /// Whether the utilisation is within the Liu–Layland bound (which would suffice if
    /// upcalls could be preempted).
    pub fn within_liu_layland(&self) -> bool {
        self.utilization <= self.liu_layland_bound
    }

    /// The verdict on one task.
    pub fn verdict(&self, id: UpcallId) -> Option<&TaskVerdict> {
        self.tasks.iter().find(|v| v.task.id == id)
    }
}

/// Analyse a set of tasks (in any order; they are ranked rate-monotonically).
pub fn analyse(tasks: &[Task]) -> Analysis {
    let mut order = tasks.to_vec();
    order.sort_by(rate_monotonic);
    let n = order.len();
    let utilization = order.iter().map(Task::utilization).sum();
    let liu_layland_bound = if n == 0 { 1.0 } else { n as f64 * (2f64.powf(1.0 / n as f64) - 1.0) };
    let tasks = (0..n).map(|i| analyse_task(&order, i)).collect();
    Analysis { utilization, liu_layland_bound, tasks }
}

fn ns(d: Duration) -> u128 {
    d.as_nanos()
}

fn from_ns(n: u128) -> Duration {
    const NS: u128 = 1_000_000_000;
    Duration::new(u64::try_from(n / NS).unwrap_or(u64::MAX), (n % NS) as u32)
}

/// Steps 1–4 of the module documentation for `order[i]`; `order` is in priority order.
fn analyse_task(order: &[Task], i: usize) -> TaskVerdict {
    let me = order[i];
    let (hep, lp) = order.split_at(i + 1);
    let hp = &hep[..i];

    // 1. Blocking: the longest lower-priority cost (the highest-priority such task on ties).
    let blocker = lp.iter().fold(None::<&Task>, |best, t| match best {
        Some(b) if b.cost >= t.cost => Some(b),
        _ => Some(t),
    });
    let b = blocker.map_or(0, |t| ns(t.cost));
    let verdict =
        |outcome| TaskVerdict { task: me, rank: i, blocking: from_ns(b), blocker: blocker.map(|t| t.id), outcome };
    let inconclusive = || Outcome::Inconclusive { hep_utilization: hep.iter().map(Task::utilization).sum() };
    let (c, t, d) = (ns(me.cost), ns(me.period), ns(me.deadline));

    // 2. The level-i busy period. Each iteration that does not converge adds at least
    // one release, so bounding the releases bounds the iterations.
    let mut busy = b + c;
    loop {
        let releases: u128 = hep.iter().map(|j| busy.div_ceil(ns(j.period))).sum();
        if releases > u128::from(MAX_BUSY_PERIOD_RELEASES) {
            return verdict(inconclusive());
        }
        let next = b + hep.iter().map(|j| busy.div_ceil(ns(j.period)) * ns(j.cost)).sum::<u128>();
        if next == busy {
            break;
        }
        busy = next;
    }
    let jobs = busy.div_ceil(t).max(1);

    // 3. Each job's start time and response time. The start time of job q + 1 is at
    // least that of job q plus one cost, so the iteration resumes from there (a value
    // below the least fixed point converges to it).
    let mut w = b;
    let mut worst = 0u128;
    let mut steps = 0u64;
    for q in 0..jobs {
        if q > 0 {
            w += c;
        }
        let release = q * t;
        loop {
            steps += 1;
            if steps > MAX_START_TIME_STEPS {
                return verdict(inconclusive());
            }
            let next = b + q * c + hp.iter().map(|j| (w / ns(j.period) + 1) * ns(j.cost)).sum::<u128>();
            // The response only grows as the iteration proceeds: stop as soon as it
            // passes the deadline.
            let response = next.max(release) - release + c;
            if response > d {
                return verdict(Outcome::Misses {
                    job: u64::try_from(q).unwrap_or(u64::MAX),
                    response: from_ns(response),
                });
            }
            if next == w {
                worst = worst.max(response);
                break;
            }
            w = next;
        }
    }
    verdict(Outcome::Meets {
        worst_response: from_ns(worst),
        busy_period: from_ns(busy),
        jobs_checked: u64::try_from(jobs).unwrap_or(u64::MAX),
    })
}

/// Why a set was refused: the first task that would fail, and the whole analysis.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The highest-priority task that fails (it may be an upcall admitted earlier,
    /// which the new one would break).
    pub failing: TaskVerdict,
    /// The analysis of the set with the new upcall in it.
    pub analysis: Analysis,
}

impl Refusal {
    /// A refusal from an analysis that has a failing task; `None` if it has none.
    pub fn from_analysis(analysis: Analysis) -> Option<Refusal> {
        let failing = analysis.first_failure()?.clone();
        Some(Refusal { failing, analysis })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = &self.failing;
        let t = &v.task;
        match &v.outcome {
            Outcome::Misses { job, response } => {
                write!(
                    f,
                    "{} (period {:?}, cost {:?}, deadline {:?}) could miss its deadline: job {} of its busy \
                     period could finish {:?} after release",
                    t.id, t.period, t.cost, t.deadline, job, response
                )?;
                if let Some(blocker) = v.blocker {
                    write!(f, ", including up to {:?} waiting for lower-priority {} to finish", v.blocking, blocker)?;
                }
                let higher = v.rank;
                if higher > 0 {
                    write!(f, " and interference from {higher} higher-priority upcall(s)")?;
                }
            }
            Outcome::Inconclusive { hep_utilization } => write!(
                f,
                "{} (period {:?}, cost {:?}) cannot be guaranteed: the CPU demand at or above its priority \
                 (utilisation {:.3}) keeps the processor busy for more than {} releases",
                t.id, t.period, t.cost, hep_utilization, MAX_BUSY_PERIOD_RELEASES
            )?,
            Outcome::Meets { .. } => write!(f, "{} meets its deadlines", t.id)?,
        }
        write!(
            f,
            " (total utilisation {:.3}; Liu–Layland bound {:.3}, not sufficient without preemption)",
            self.analysis.utilization, self.analysis.liu_layland_bound
        )
    }
}

impl fmt::Display for Analysis {
    /// One line per task, in priority order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "utilisation {:.3} (Liu–Layland bound {:.3}); {}",
            self.utilization,
            self.liu_layland_bound,
            if self.is_schedulable() { "schedulable" } else { "NOT schedulable" }
        )?;
        for v in &self.tasks {
            let t = &v.task;
            write!(
                f,
                "  {}: period {:?} deadline {:?} cost {:?} blocking {:?}",
                t.id, t.period, t.deadline, t.cost, v.blocking
            )?;
            match &v.outcome {
                Outcome::Meets { worst_response, jobs_checked, .. } => {
                    writeln!(f, " -> worst response {worst_response:?} ({jobs_checked} job(s) checked)")?
                }
                Outcome::Misses { job, response } => writeln!(f, " -> MISSES: job {job} responds in {response:?}")?,
                Outcome::Inconclusive { hep_utilization } => {
                    writeln!(f, " -> REFUSED: busy period too long (utilisation at or above: {hep_utilization:.3})")?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn task(id: u32, period: u64, cost: u64) -> Task {
        Task::implicit(UpcallId::from_raw(id), ms(period), ms(cost)).unwrap()
    }

    fn response(a: &Analysis, id: u32) -> Duration {
        match a.verdict(UpcallId::from_raw(id)).unwrap().outcome {
            Outcome::Meets { worst_response, .. } => worst_response,
            ref o => panic!("upcall #{id} not schedulable: {o:?}"),
        }
    }

    #[test]
    fn table3_periods_with_plausible_costs_are_admitted() {
        // 001 Table 3: three streams with RTU periods 60, 75 and 120 ms. A 32 KB
        // stream read and send took a few milliseconds on the paper's 200 MHz Pentium;
        // 10, 10 and 15 ms is generous.
        let a = analyse(&[task(0, 60, 10), task(1, 75, 10), task(2, 120, 15)]);
        assert!(a.is_schedulable(), "{a}");
        assert!(a.within_liu_layland());
        // The 60 ms upcall can be blocked by the 15 ms one, then runs: 25 ms.
        assert_eq!(response(&a, 0), ms(25));
        assert_eq!(a.tasks[0].blocker, Some(UpcallId::from_raw(2)));
        assert_eq!(a.tasks.iter().map(|v| v.rank).collect::<Vec<_>>(), vec![0, 1, 2]);
    }

    #[test]
    fn above_liu_layland_can_still_be_admitted() {
        // Utilisation 0.85 > 0.780, yet every job meets its deadline (worked by hand:
        // responses 50, 70 and 70 ms; the 75 ms task's busy period holds two jobs).
        let a = analyse(&[task(0, 60, 20), task(1, 75, 20), task(2, 120, 30)]);
        assert!(!a.within_liu_layland());
        assert!(a.is_schedulable(), "{a}");
        assert_eq!(response(&a, 0), ms(50));
        assert_eq!(response(&a, 1), ms(70));
        assert_eq!(response(&a, 2), ms(70));
        match a.tasks[1].outcome {
            Outcome::Meets { jobs_checked, busy_period, .. } => {
                assert_eq!(jobs_checked, 2);
                assert_eq!(busy_period, ms(110));
            }
            ref o => panic!("{o:?}"),
        }
    }

    #[test]
    fn blocking_alone_can_make_a_light_set_unschedulable() {
        // Utilisation 0.29, far below the bound for two tasks (0.828): preemptive RM
        // would accept. Without preemption the 10 ms task can wait 9 ms, then run 2 ms.
        let a = analyse(&[task(0, 10, 2), task(1, 100, 9)]);
        assert!(a.within_liu_layland());
        assert!(a.utilization < 0.3);
        assert!(!a.is_schedulable());
        let fail = a.first_failure().unwrap();
        assert_eq!(fail.task.id(), UpcallId::from_raw(0));
        assert_eq!(fail.blocker, Some(UpcallId::from_raw(1)));
        assert_eq!(fail.blocking, ms(9));
        assert_eq!(fail.outcome, Outcome::Misses { job: 0, response: ms(11) });
        // The long task itself is fine.
        assert!(a.verdict(UpcallId::from_raw(1)).unwrap().is_schedulable());
        let msg = Refusal::from_analysis(a).unwrap().to_string();
        assert!(msg.starts_with("upcall #0 (period 10ms, cost 2ms, deadline 10ms) could miss its deadline"), "{msg}");
        assert!(msg.contains("waiting for lower-priority upcall #1"), "{msg}");
        // One tick less blocking and it fits exactly (response = deadline is a meet).
        assert!(analyse(&[task(0, 10, 2), task(1, 100, 8)]).is_schedulable());
    }

    #[test]
    fn a_later_job_in_the_busy_period_can_be_the_one_that_misses() {
        // After the example Davis et al. use to refute the original CAN analysis:
        // A, B, C with periods 2.5, 3.5 and 3.5 ms and costs of 1 ms each, here with
        // C's deadline 3.4 ms. C's first job starts after A and B, at 2 ms, and
        // finishes at 3 ms: fine, and all the original analysis looked at. But C's
        // own execution pushes the busy period past A's second and B's second release:
        // its second job (released 3.5) waits for A (3-4), B (4-5), A again (5-6), and
        // finishes at 7 ms, 3.5 ms after release.
        let us = Duration::from_micros;
        let id = UpcallId::from_raw;
        let a = analyse(&[
            Task::implicit(id(0), us(2500), us(1000)).unwrap(),
            Task::implicit(id(1), us(3500), us(1000)).unwrap(),
            Task::new(id(2), us(3500), us(3400), us(1000)).unwrap(),
        ]);
        let c = a.verdict(id(2)).unwrap();
        assert_eq!(c.outcome, Outcome::Misses { job: 1, response: us(3500) }, "{a}");
        assert!(a.verdict(id(0)).unwrap().is_schedulable() && a.verdict(id(1)).unwrap().is_schedulable());
    }

    #[test]
    fn saturated_and_degenerate_sets() {
        // One task using the whole CPU, deadline = period: exactly schedulable.
        let a = analyse(&[task(0, 10, 10)]);
        assert!(a.is_schedulable(), "{a}");
        // Utilisation above 1: the busy period never ends; refused as inconclusive.
        let a = analyse(&[task(0, 10, 6), task(1, 10, 6)]);
        assert!(matches!(a.tasks[1].outcome, Outcome::Inconclusive { hep_utilization } if hep_utilization > 1.0));
        let a = analyse(&[Task::new(UpcallId::from_raw(0), ms(10), ms(10), ms(11)).unwrap()]);
        assert!(matches!(a.tasks[0].outcome, Outcome::Inconclusive { .. }));
        let msg = Refusal::from_analysis(a).unwrap().to_string();
        assert!(msg.contains("upcall #0 (period 10ms, cost 11ms) cannot be guaranteed"), "{msg}");
        // Cost above the deadline.
        let a = analyse(&[Task::new(UpcallId::from_raw(0), ms(10), ms(5), ms(6)).unwrap()]);
        assert!(!a.is_schedulable());
        // The empty set.
        let a = analyse(&[]);
        assert!(a.is_schedulable() && a.utilization == 0.0 && a.liu_layland_bound == 1.0);
        assert!(Refusal::from_analysis(a).is_none());
    }

    #[test]
    fn ties_in_period_are_broken_by_id() {
        let a = analyse(&[task(5, 10, 3), task(2, 10, 3)]);
        let ids: Vec<u32> = a.tasks.iter().map(|v| v.task.id().as_raw()).collect();
        assert_eq!(ids, vec![2, 5]);
        // #2 can be blocked by #5 for 3 ms: response 6 ms; #5 waits for #2: 6 ms.
        assert_eq!(response(&a, 2), ms(6));
        assert_eq!(response(&a, 5), ms(6));
    }

    #[test]
    fn invalid_tasks_are_refused_by_the_constructor() {
        let id = UpcallId::from_raw(0);
        assert_eq!(Task::implicit(id, Duration::ZERO, ms(1)), Err(SpecError::ZeroPeriod));
        assert_eq!(Task::implicit(id, ms(1), Duration::ZERO), Err(SpecError::ZeroCost));
        assert_eq!(Task::new(id, ms(10), Duration::ZERO, ms(1)), Err(SpecError::ZeroDeadline));
        assert!(matches!(Task::new(id, ms(10), ms(11), ms(1)), Err(SpecError::DeadlineAfterPeriod { .. })));
    }

    #[test]
    fn the_report_names_every_task() {
        let a = analyse(&[task(0, 60, 10), task(1, 75, 10), task(2, 120, 15)]);
        let text = a.to_string();
        assert!(text.starts_with("utilisation 0.425 (Liu–Layland bound 0.780); schedulable"), "{text}");
        assert_eq!(text.lines().count(), 4);
    }
}
