//! Property tests: what admission control admits, the dispatcher schedules without a
//! miss, on a virtual clock; and the admission test is monotone.
//!
//! The seed is fixed so that every run is the same; set `PROPTEST_RNG_SEED` (and
//! `PROPTEST_CASES`) to explore further.

use std::time::Duration;

use ictus_rt::admission::{analyse, Outcome, Task};
use ictus_rt::sim;
use ictus_rt::{AdmissionPolicy, Dispatcher, Job, Time, UpcallId, UpcallSpec};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    let rng_seed =
        if std::env::var_os("PROPTEST_RNG_SEED").is_some() { default.rng_seed } else { RngSeed::Fixed(0x1c75_0005) };
    ProptestConfig { rng_seed, failure_persistence: None, ..default }
}

/// Periods (µs) whose least common multiple is 120 ms, so that a synchronous schedule
/// repeats within a short horizon.
const PERIODS_US: [u64; 15] =
    [2_000, 3_000, 4_000, 5_000, 6_000, 8_000, 10_000, 12_000, 15_000, 20_000, 24_000, 30_000, 40_000, 60_000, 120_000];
const HYPERPERIOD: Duration = Duration::from_millis(120);

/// A candidate upcall: period, deadline and cost.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    period: Duration,
    deadline: Duration,
    cost: Duration,
}

impl Candidate {
    fn spec(&self) -> UpcallSpec {
        UpcallSpec::periodic(self.period).with_deadline(self.deadline).with_cost(self.cost)
    }
}

/// Up to seven upcalls sharing a total load of 5–100 % (often above 70 %) in random
/// proportions, some with deadlines shorter than their periods. Costs and deadlines are
/// sometimes whole milliseconds or tenths, so that releases and completions coincide,
/// which is where off-by-one errors in the analysis (a release exactly at a start time)
/// show.
fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
    let one = (0..PERIODS_US.len(), 1u64..=10, prop_oneof![3 => Just(1.0f64), 1 => 0.3f64..1.0]);
    let load = prop_oneof![0.05f64..1.0, 0.7f64..1.0];
    let grain = prop_oneof![Just(1u64), Just(100_000), Just(1_000_000)]; // ns
    (proptest::collection::vec(one, 1..=7), load, grain).prop_map(|(tasks, load, grain)| {
        let total: u64 = tasks.iter().map(|(_, w, _)| w).sum();
        tasks
            .into_iter()
            .map(|(p, w, dfrac)| {
                let period = PERIODS_US[p] * 1_000; // ns
                let cost = (period as f64 * load * w as f64 / total as f64) as u64;
                let cost = (cost / grain).max(1) * grain;
                let deadline = ((period as f64 * dfrac) as u64 / grain).max(1) * grain;
                Candidate {
                    period: Duration::from_nanos(period),
                    deadline: Duration::from_nanos(deadline),
                    cost: Duration::from_nanos(cost),
                }
            })
            .collect()
    })
}

/// Offer every candidate to a guaranteed dispatcher, keeping those it admits, as a
/// server would. Never empty in practice: the first candidate alone fits unless its
/// cost exceeds its deadline.
fn admit(cands: &[Candidate]) -> Dispatcher {
    let mut d = Dispatcher::default();
    for c in cands {
        let _ = d.create(c.spec());
    }
    d
}

fn ids(d: &Dispatcher) -> Vec<UpcallId> {
    d.upcalls().map(|u| u.id).collect()
}

/// splitmix64: a deterministic per-job "random" number.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Check a finished simulation: no miss of any kind, and no observed response time
/// above the analysis' bound.
fn check(d: &Dispatcher, trace: &sim::Trace) -> Result<(), TestCaseError> {
    prop_assert_eq!(trace.misses(), 0, "stats {:?}\noverdue {:?}", trace.stats, trace.overdue().collect::<Vec<_>>());
    let analysis = d.analysis().expect("guaranteed upcalls have costs");
    prop_assert!(analysis.is_schedulable());
    for (id, stats) in &trace.stats {
        let v = analysis.verdict(*id).expect("every upcall is analysed");
        let Outcome::Meets { worst_response, .. } = v.outcome else {
            return Err(TestCaseError::fail(format!("{id} admitted but not schedulable")));
        };
        prop_assert!(
            stats.worst_response <= worst_response,
            "{} responded in {:?}, analysis bound {:?}\n{}",
            id,
            stats.worst_response,
            worst_response,
            analysis
        );
        prop_assert!(stats.completed > 0, "{} never ran", id);
    }
    // The dispatcher and the analysis agree on priorities.
    let analysed: Vec<UpcallId> = analysis.tasks.iter().map(|v| v.task.id()).collect();
    prop_assert_eq!(d.priority_order(), analysed);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// (a) Synchronous release at 0, every job taking exactly its cost, three
    /// hyperperiods: no admitted upcall misses a deadline.
    #[test]
    fn admitted_sets_meet_every_deadline_at_cost(cands in candidates()) {
        let mut d = admit(&cands);
        prop_assume!(d.upcalls().count() > 0);
        for id in ids(&d) {
            d.resume(id, Time::ZERO).unwrap();
        }
        let exec = sim::at_cost(&d);
        let horizon = Time::ZERO + HYPERPERIOD * 3;
        let trace = sim::run(&mut d, Time::ZERO, horizon, exec).unwrap();
        check(&d, &trace)?;
    }

    /// (a′) The analysis covers more than the synchronous case: arbitrary release
    /// offsets (the worst case for non-preemptive scheduling is a long low-priority job
    /// starting just before a release, which offsets reach) and jobs shorter than their
    /// cost.
    #[test]
    fn admitted_sets_meet_every_deadline_with_offsets_and_shorter_jobs(
        cands in candidates(),
        offsets in proptest::collection::vec(any::<u64>(), 7),
        seed in any::<u64>(),
        full_cost_percent in 0u64..=100,
    ) {
        let mut d = admit(&cands);
        prop_assume!(d.upcalls().count() > 0);
        let costs: Vec<(UpcallId, Duration, Duration)> =
            d.upcalls().map(|u| (u.id, u.spec.period, u.spec.cost.unwrap())).collect();
        for ((id, period, _), offset) in costs.iter().zip(&offsets) {
            let offset = offset % period.as_nanos() as u64;
            d.resume(*id, Time::from_nanos(offset)).unwrap();
        }
        // Each job takes its full cost with the given probability, otherwise a random
        // fraction of it (at least 1 ns).
        let exec = |job: &Job| {
            let cost = costs.iter().find(|(id, _, _)| *id == job.upcall).unwrap().2;
            let r = mix(seed ^ (u64::from(job.upcall.as_raw()) << 32) ^ job.number);
            if r % 100 < full_cost_percent {
                cost
            } else {
                Duration::from_nanos(1 + mix(r) % cost.as_nanos() as u64)
            }
        };
        let horizon = Time::ZERO + HYPERPERIOD * 4;
        let trace = sim::run(&mut d, Time::ZERO, horizon, exec).unwrap();
        check(&d, &trace)?;
    }

    /// (b) Monotone: removing any task from an admitted set leaves it admitted, and no
    /// remaining task's worst response grows.
    #[test]
    fn removing_a_task_keeps_the_set_admitted(cands in candidates()) {
        let d = admit(&cands);
        let tasks = d.tasks().unwrap();
        let full = analyse(&tasks);
        prop_assert!(full.is_schedulable());
        for gone in 0..tasks.len() {
            let rest: Vec<Task> = tasks.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, t)| *t).collect();
            let fewer = analyse(&rest);
            prop_assert!(fewer.is_schedulable(), "without {}:\n{}", tasks[gone].id(), fewer);
            for v in &fewer.tasks {
                let (Outcome::Meets { worst_response: after, .. }, Some(Outcome::Meets { worst_response: before, .. })) =
                    (&v.outcome, full.verdict(v.task.id()).map(|b| &b.outcome))
                else {
                    return Err(TestCaseError::fail("schedulable sets have Meets verdicts"));
                };
                prop_assert!(after <= before);
            }
        }
    }

    /// (b′) The same, seen from the other side on arbitrary (not greedily admitted)
    /// sets: a set that fails keeps failing when a task is added, and the dispatcher
    /// decides exactly as the analysis of the set with the newcomer does.
    #[test]
    fn the_dispatcher_admits_exactly_what_the_analysis_accepts(cands in candidates()) {
        let mut d = Dispatcher::default();
        let mut admitted: Vec<Task> = Vec::new();
        for c in &cands {
            let id = UpcallId::from_raw(admitted.len() as u32);
            let task = Task::new(id, c.period, c.deadline, c.cost).unwrap();
            let mut with = admitted.clone();
            with.push(task);
            let verdict = analyse(&with).is_schedulable();
            prop_assert_eq!(d.create(c.spec()).is_ok(), verdict);
            if verdict {
                admitted.push(task);
            } else {
                // Adding anything to a failing set keeps it failing.
                for extra in &cands {
                    let mut more = with.clone();
                    more.push(Task::new(UpcallId::from_raw(1000), extra.period, extra.deadline, extra.cost).unwrap());
                    prop_assert!(!analyse(&more).is_schedulable());
                }
            }
        }
    }
}

/// The generator is not vacuous: a fair share of candidate sets admit several
/// upcalls, and a fair share of candidates are refused.
#[test]
fn the_generator_exercises_both_outcomes() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::new(config());
    let (mut offered, mut admitted, mut multi) = (0, 0, 0);
    for _ in 0..500 {
        let cands = candidates().new_tree(&mut runner).unwrap().current();
        let d = admit(&cands);
        offered += cands.len();
        let n = d.upcalls().count();
        admitted += n;
        multi += usize::from(n >= 3);
    }
    assert!(admitted * 10 > offered * 3, "admitted {admitted} of {offered}");
    assert!(admitted * 10 < offered * 9, "admitted {admitted} of {offered}");
    assert!(multi > 100, "{multi} sets with three or more upcalls");
}

/// One configuration by hand, with the policy the property tests cannot see: the
/// dispatcher refuses a new upcall that only its blocking would break, and a
/// best-effort dispatcher running the same set shows the miss.
#[test]
fn refusing_for_blocking_is_not_needless_pessimism() {
    let fast = UpcallSpec::periodic(Duration::from_millis(10)).with_cost(Duration::from_millis(2));
    let slow = UpcallSpec::periodic(Duration::from_millis(100)).with_cost(Duration::from_millis(9));
    let mut d = Dispatcher::default();
    d.create(fast).unwrap();
    assert!(d.create(slow).is_err());

    let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
    let f = d.create(fast).unwrap();
    let s = d.create(slow).unwrap();
    d.resume(s, Time::ZERO).unwrap();
    d.resume(f, Time::from_nanos(1)).unwrap();
    let exec = sim::at_cost(&d);
    let trace = sim::run(&mut d, Time::ZERO, Time::from_secs(1), exec).unwrap();
    assert!(trace.misses() > 0);
}
