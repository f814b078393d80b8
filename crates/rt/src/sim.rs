//! Drive a [`Dispatcher`] on a virtual clock.
//!
//! [`run`] plays the part of the dispatcher's shell: it asks for a decision, "runs" the
//! job for however long `exec` says, reports it complete, and jumps the clock to the
//! next event when idle. Nothing sleeps, so a minute of schedule takes microseconds,
//! and the same inputs always give the same trace. The property tests use it to check
//! that what admission control admits really meets its deadlines; experiments can use
//! it to compare policies before running them for real.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::time::Time;
use crate::upcall::{Decision, Dispatcher, Job, NextError, UpcallId, UpcallStats};

/// One thing that happened in a simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A job was dispatched.
    Start {
        /// The job.
        job: Job,
        /// When.
        at: Time,
    },
    /// A job completed.
    Finish {
        /// The job.
        job: Job,
        /// When.
        at: Time,
        /// After its deadline.
        late: bool,
    },
    /// The dispatcher was idle from `from` to `until` (the horizon, if nothing was to
    /// be released before it).
    Idle {
        /// Start of the idle stretch.
        from: Time,
        /// End of it.
        until: Time,
    },
}

/// What a simulation produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// Everything, in time order.
    pub events: Vec<Event>,
    /// The time the simulation stopped: at or after the horizon (a job that started
    /// before the horizon runs to completion), or at the horizon if it ran out of work.
    pub end: Time,
    /// Each upcall's counters at the end.
    pub stats: Vec<(UpcallId, UpcallStats)>,
    /// Jobs released by `end` but never started.
    pub unfinished: Vec<Job>,
}

impl Trace {
    /// Jobs released but not started whose deadline passed before `end`: misses the
    /// dispatcher has not counted yet (it counts a pending job only when it is
    /// superseded).
    pub fn overdue(&self) -> impl Iterator<Item = &Job> + '_ {
        self.unfinished.iter().filter(|j| j.deadline < self.end)
    }

    /// All deadline misses: the counted ones plus the overdue jobs.
    pub fn misses(&self) -> u64 {
        self.stats.iter().map(|(_, s)| s.misses()).sum::<u64>() + self.overdue().count() as u64
    }

    /// Completed jobs with their finish times.
    pub fn completions(&self) -> impl Iterator<Item = (Job, Time)> + '_ {
        self.events.iter().filter_map(|e| match e {
            Event::Finish { job, at, .. } => Some((*job, *at)),
            _ => None,
        })
    }
}

/// Run `dispatcher` from `start` until `horizon`, each job taking `exec(job)`.
///
/// Decisions are made at every completion and at every release the dispatcher asks to
/// be woken for, as a perfect shell would. Refused if a job is already running.
pub fn run(
    dispatcher: &mut Dispatcher,
    start: Time,
    horizon: Time,
    mut exec: impl FnMut(&Job) -> Duration,
) -> Result<Trace, NextError> {
    let mut events = Vec::new();
    let mut now = start;
    while now < horizon {
        match dispatcher.next(now)? {
            Decision::Run(job) => {
                events.push(Event::Start { job, at: now });
                let finish = now.saturating_add(exec(&job));
                let done = dispatcher.complete(job.upcall, finish).expect("the job just dispatched is running");
                events.push(Event::Finish { job, at: finish, late: done.lateness.is_some() });
                now = finish;
            }
            Decision::Idle { until } => {
                let wake = until.map_or(horizon, |t| t.min(horizon));
                events.push(Event::Idle { from: now, until: wake });
                now = wake;
            }
        }
    }
    dispatcher.release(now);
    Ok(Trace {
        events,
        end: now,
        stats: dispatcher.upcalls().map(|u| (u.id, u.stats)).collect(),
        unfinished: dispatcher.pending_jobs(),
    })
}

/// An `exec` for [`run`] in which every job takes exactly its upcall's stated cost
/// (zero for an upcall without one).
pub fn at_cost(dispatcher: &Dispatcher) -> impl FnMut(&Job) -> Duration {
    let costs: BTreeMap<UpcallId, Duration> =
        dispatcher.upcalls().map(|u| (u.id, u.spec.cost.unwrap_or(Duration::ZERO))).collect();
    move |job| costs.get(&job.upcall).copied().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upcall::{AdmissionPolicy, UpcallSpec};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn create_all(d: &mut Dispatcher, specs: &[UpcallSpec]) -> Vec<UpcallId> {
        specs.iter().map(|s| d.create(*s).unwrap()).collect()
    }

    #[test]
    fn table3_runs_ten_seconds_without_a_miss() {
        let mut d = Dispatcher::default();
        let specs = [
            UpcallSpec::periodic(ms(60)).with_cost(ms(20)),
            UpcallSpec::periodic(ms(75)).with_cost(ms(20)),
            UpcallSpec::periodic(ms(120)).with_cost(ms(30)),
        ];
        let ids = create_all(&mut d, &specs);
        for id in &ids {
            d.resume(*id, Time::ZERO).unwrap();
        }
        let exec = at_cost(&d);
        let trace = run(&mut d, Time::ZERO, Time::from_secs(10), exec).unwrap();
        assert_eq!(trace.misses(), 0, "{:?}", trace.stats);
        let released: Vec<u64> = trace.stats.iter().map(|(_, s)| s.released).collect();
        assert_eq!(released, vec![167, 134, 84]);
        // The 120 ms upcall's last job (released at 9.96 s) had not started at 10 s;
        // its deadline is still ahead, so it is unfinished but not a miss.
        assert_eq!(
            trace.unfinished.iter().map(|j| (j.upcall, j.release)).collect::<Vec<_>>(),
            vec![(ids[2], Time::from_millis(9960))]
        );
        let completed: Vec<u64> = trace.stats.iter().map(|(_, s)| s.completed).collect();
        assert_eq!(completed, vec![167, 134, 83]);
        // The analysis' worst cases bound what happened.
        let analysis = d.analysis().unwrap();
        for ((id, s), v) in trace.stats.iter().zip(&analysis.tasks) {
            assert_eq!(*id, v.task.id());
            match v.outcome {
                crate::admission::Outcome::Meets { worst_response, .. } => assert!(s.worst_response <= worst_response),
                ref o => panic!("{o:?}"),
            }
        }
    }

    #[test]
    fn the_set_refused_for_blocking_really_misses() {
        // What admission control refuses, run anyway in a best-effort dispatcher: the
        // long upcall starts just before the short one is released.
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let ids = create_all(
            &mut d,
            &[UpcallSpec::periodic(ms(10)).with_cost(ms(2)), UpcallSpec::periodic(ms(100)).with_cost(ms(9))],
        );
        d.resume(ids[1], Time::ZERO).unwrap();
        d.resume(ids[0], Time::from_micros(1)).unwrap();
        let exec = at_cost(&d);
        let trace = run(&mut d, Time::ZERO, Time::from_millis(100), exec).unwrap();
        let fast = trace.stats[0].1;
        assert_eq!(fast.late, 1);
        assert_eq!(fast.worst_lateness, ms(1) - Duration::from_micros(1));
        assert!(!d.analysis().unwrap().is_schedulable());
    }

    #[test]
    fn a_later_job_of_the_busy_period_misses_in_simulation_too() {
        // The admission test's example (admission.rs): C's first job is fine, its
        // second is not. Synchronous release, every job at its cost.
        let us = Duration::from_micros;
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let ids = create_all(
            &mut d,
            &[
                UpcallSpec::periodic(us(2500)).with_cost(us(1000)),
                UpcallSpec::periodic(us(3500)).with_cost(us(1000)),
                UpcallSpec::periodic(us(3500)).with_deadline(us(3400)).with_cost(us(1000)),
            ],
        );
        for id in &ids {
            d.resume(*id, Time::ZERO).unwrap();
        }
        let exec = at_cost(&d);
        let trace = run(&mut d, Time::ZERO, Time::from_micros(7000), exec).unwrap();
        let c: Vec<(u64, Time)> =
            trace.completions().filter(|(j, _)| j.upcall == ids[2]).map(|(j, at)| (j.number, at)).collect();
        assert_eq!(c, vec![(0, Time::from_micros(3000)), (1, Time::from_micros(7000))]);
        assert_eq!(trace.stats[2].1.late, 1);
    }

    #[test]
    fn trace_records_idle_time_and_overdue_jobs() {
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let ids = create_all(&mut d, &[UpcallSpec::periodic(ms(10)).with_cost(ms(1))]);
        d.resume(ids[0], Time::from_millis(5)).unwrap();
        let exec = at_cost(&d);
        let trace = run(&mut d, Time::ZERO, Time::from_millis(20), exec).unwrap();
        assert_eq!(
            trace.events,
            vec![
                Event::Idle { from: Time::ZERO, until: Time::from_millis(5) },
                Event::Start {
                    job: Job {
                        upcall: ids[0],
                        release: Time::from_millis(5),
                        deadline: Time::from_millis(15),
                        number: 0
                    },
                    at: Time::from_millis(5)
                },
                Event::Finish {
                    job: Job {
                        upcall: ids[0],
                        release: Time::from_millis(5),
                        deadline: Time::from_millis(15),
                        number: 0
                    },
                    at: Time::from_millis(6),
                    late: false
                },
                Event::Idle { from: Time::from_millis(6), until: Time::from_millis(15) },
                Event::Start {
                    job: Job {
                        upcall: ids[0],
                        release: Time::from_millis(15),
                        deadline: Time::from_millis(25),
                        number: 1
                    },
                    at: Time::from_millis(15)
                },
                Event::Finish {
                    job: Job {
                        upcall: ids[0],
                        release: Time::from_millis(15),
                        deadline: Time::from_millis(25),
                        number: 1
                    },
                    at: Time::from_millis(16),
                    late: false
                },
                Event::Idle { from: Time::from_millis(16), until: Time::from_millis(20) },
            ]
        );
        assert_eq!(trace.end, Time::from_millis(20));
        assert!(trace.unfinished.is_empty());
        assert_eq!(trace.misses(), 0);

        // A job that can never run before the end (a hog holds the CPU) is overdue.
        let mut d = Dispatcher::new(AdmissionPolicy::BestEffort);
        let ids = create_all(
            &mut d,
            &[UpcallSpec::periodic(ms(10)).with_deadline(ms(2)), UpcallSpec::periodic(ms(100)).with_cost(ms(50))],
        );
        d.resume(ids[1], Time::ZERO).unwrap();
        d.resume(ids[0], Time::from_millis(41)).unwrap();
        let trace = run(&mut d, Time::ZERO, Time::from_millis(1), |_| ms(50)).unwrap();
        assert_eq!(trace.end, Time::from_millis(50));
        assert_eq!(trace.overdue().count(), 1);
        assert_eq!(trace.misses(), 1);
        // Refused while a job is running.
        let job = match d.next(Time::from_millis(50)).unwrap() {
            Decision::Run(job) => job,
            other => panic!("{other:?}"),
        };
        assert_eq!(run(&mut d, Time::ZERO, Time::from_millis(1), |_| ms(1)), Err(NextError::Busy(job)));
    }
}
