//! The shape most measurements share: ours and the peers take turns, round after
//! round, so that whatever the machine does meanwhile falls on all of them alike
//! (`shared/BENCHMARKS.md`: side by side, in one run, A B A B).
//!
//! - [`rotation`]: the order of turns in a round, the first place rotating;
//! - [`Transport`]: something that does timed round trips with a server in another
//!   process (a peer or one of ours);
//! - [`Lanes`]: transports measured in interleaved rounds, each case into a histogram
//!   of its own per transport; a transport that fails is retired with its error, and
//!   the others go on.

use std::io;
use std::time::Duration;

use crate::pin;
use crate::stats::{median, LatencyRecorder};

/// The order of turns in round `round` among `n` contenders: `round % n` first, then
/// the others in order, wrapping; so that over the rounds nobody always goes first or
/// always follows the same one.
pub fn rotation(round: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (round + k) % n)
}

/// Something that can do timed round trips with a server in another process.
///
/// A transport owns its server for the whole experiment: it is spawned once and told
/// the size of each batch. Dropping the transport stops the server.
pub trait Transport {
    /// Short name used in rows and headlines, e.g. `"seqpacket"`, `"port inline"`.
    fn name(&self) -> &str;

    /// What it is, for readers, e.g. `"AF_UNIX SOCK_SEQPACKET socketpair"`.
    fn description(&self) -> &str {
        self.name()
    }

    /// Performs `iters` round trips of `size`-byte requests, each answered by the
    /// transport's reply, and returns each round-trip time in ns.
    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>>;

    /// The server's process id, if it runs in its own process: [`Lanes`] that track
    /// placement note after each batch whether it last ran on the client's CPU.
    fn server_pid(&self) -> Option<u32> {
        None
    }
}

/// How one case is measured: `rounds` rounds, each a batch of `per_round` timed round
/// trips from every transport in turn, each batch after `warm` untimed ones, and a
/// `rest` before each round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Rounds.
    pub rounds: usize,
    /// Timed round trips per transport per round.
    pub per_round: usize,
    /// Untimed round trips before each timed batch (bringing both ends back to
    /// polling, say).
    pub warm: usize,
    /// A pause before each round (e.g. to keep real-time threads under the kernel's
    /// throttling limit).
    pub rest: Duration,
}

impl Schedule {
    /// `rounds` rounds of `per_round`, no warm-up per batch, no rest.
    pub fn new(rounds: usize, per_round: usize) -> Schedule {
        Schedule { rounds, per_round, warm: 0, rest: Duration::ZERO }
    }
}

/// One transport's results.
#[derive(Debug, Clone)]
pub struct Lane {
    /// The transport's name.
    pub name: String,
    /// What it is.
    pub description: String,
    /// One histogram per case.
    pub cases: Vec<LatencyRecorder>,
    /// Per case, the median of each round's batch, in the order measured: the windows
    /// of a headline that compares medians ([`crate::windows::Windowed`]).
    pub round_p50s: Vec<Vec<f64>>,
    /// Per case: batches after which the server had last run on the client's CPU, and
    /// batches observed (only when placement is tracked).
    pub placement: Vec<(u32, u32)>,
    /// Why it stopped, if it did.
    pub failed: Option<String>,
}

impl Lane {
    /// An empty lane with `cases` histograms.
    pub fn new(name: impl Into<String>, description: impl Into<String>, cases: usize) -> Lane {
        Lane {
            name: name.into(),
            description: description.into(),
            cases: (0..cases).map(|_| LatencyRecorder::new()).collect(),
            round_p50s: vec![Vec::new(); cases],
            placement: vec![(0, 0); cases],
            failed: None,
        }
    }

    /// The median of case `case`, if it has samples.
    pub fn p50(&self, case: usize) -> Option<f64> {
        let r = self.cases.get(case)?;
        (r.count() > 0).then(|| r.quantile(0.5) as f64)
    }

    /// Fraction of batches with client and server on one CPU, in one case or overall.
    pub fn same_cpu(&self, case: Option<usize>) -> Option<f64> {
        let (same, seen) = match case {
            Some(i) => *self.placement.get(i)?,
            None => self.placement.iter().fold((0, 0), |(a, b), &(s, n)| (a + s, b + n)),
        };
        (seen > 0).then(|| f64::from(same) / f64::from(seen))
    }

    fn retire(&mut self, context: &str, e: io::Error) {
        self.failed.get_or_insert_with(|| format!("{context}{e}"));
    }
}

/// The median of one batch of round-trip times (ns); `None` for an empty batch.
pub fn batch_p50(samples: &[u64]) -> Option<f64> {
    median(samples.iter().map(|&ns| ns as f64))
}

/// Transports measured side by side, and their results.
pub struct Lanes {
    transports: Vec<Box<dyn Transport>>,
    lanes: Vec<Lane>,
    track_placement: bool,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes").field("lanes", &self.lanes).finish_non_exhaustive()
    }
}

impl Lanes {
    /// `transports`, each with `cases` empty histograms.
    pub fn new(transports: Vec<Box<dyn Transport>>, cases: usize) -> Lanes {
        let lanes = transports.iter().map(|t| Lane::new(t.name(), t.description(), cases)).collect();
        Lanes { transports, lanes, track_placement: false }
    }

    /// After every batch, note whether the server last ran on the client's CPU
    /// ([`Lane::same_cpu`]): on a VM one CPU or two changes a small round trip
    /// several-fold.
    pub fn tracking_placement(mut self) -> Lanes {
        self.track_placement = true;
        self
    }

    /// Whether no transport is left.
    pub fn is_empty(&self) -> bool {
        self.transports.is_empty()
    }

    /// `iters` untimed round trips of `size` bytes on every transport still running; a
    /// failure retires the transport with `context` before its error.
    pub fn warm_up(&mut self, size: usize, iters: usize, context: &str) {
        for (t, lane) in self.transports.iter_mut().zip(&mut self.lanes) {
            if lane.failed.is_none() {
                if let Err(e) = t.round_trips(size, iters) {
                    lane.retire(context, e);
                }
            }
        }
    }

    /// Measures case `case` (round trips of `size` bytes) on every transport still
    /// running, in interleaved rounds ([`rotation`]); a failure retires the transport
    /// with `context` before its error.
    pub fn measure(&mut self, case: usize, size: usize, schedule: Schedule, context: &str) {
        let n = self.transports.len();
        for round in 0..schedule.rounds {
            if !schedule.rest.is_zero() {
                std::thread::sleep(schedule.rest);
            }
            for i in rotation(round, n) {
                let (t, lane) = (&mut self.transports[i], &mut self.lanes[i]);
                if lane.failed.is_some() {
                    continue;
                }
                let batch = match schedule.warm {
                    0 => t.round_trips(size, schedule.per_round),
                    warm => t.round_trips(size, warm).and_then(|_| t.round_trips(size, schedule.per_round)),
                };
                match batch {
                    Ok(samples) => {
                        lane.cases[case].record_all(&samples);
                        lane.round_p50s[case].extend(batch_p50(&samples));
                    }
                    Err(e) => lane.retire(context, e),
                }
                if self.track_placement {
                    let server = t.server_pid().and_then(pin::last_cpu_of);
                    if let (Some(server), Some(client)) = (server, pin::current_cpu()) {
                        let (same, seen) = &mut lane.placement[case];
                        *same += u32::from(server == client);
                        *seen += 1;
                    }
                }
            }
        }
    }

    /// Stops the transports (their servers exit) and returns the results, in the
    /// order the transports were given.
    pub fn finish(self) -> Vec<Lane> {
        drop(self.transports);
        self.lanes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_rotates_who_goes_first() {
        assert_eq!(rotation(0, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(rotation(1, 3).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(rotation(5, 3).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(rotation(4, 0).count(), 0);
    }

    #[test]
    fn a_batch_median_is_the_middle_sample() {
        assert_eq!(batch_p50(&[]), None);
        assert_eq!(batch_p50(&[30, 10, 20]), Some(20.0));
        assert_eq!(batch_p50(&[40, 10, 30, 20]), Some(25.0));
    }

    /// A transport that answers in a fixed time and fails after `fail_after` batches.
    struct Fake {
        name: &'static str,
        ns: u64,
        batches: usize,
        fail_after: usize,
        log: std::rc::Rc<std::cell::RefCell<Vec<&'static str>>>,
    }

    impl Transport for Fake {
        fn name(&self) -> &str {
            self.name
        }
        fn round_trips(&mut self, _size: usize, iters: usize) -> io::Result<Vec<u64>> {
            self.log.borrow_mut().push(self.name);
            self.batches += 1;
            if self.batches > self.fail_after {
                return Err(io::Error::other("gone"));
            }
            Ok(vec![self.ns; iters])
        }
    }

    #[test]
    fn lanes_interleave_and_retire_what_fails() {
        let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let fake = |name, ns, fail_after| -> Box<dyn Transport> {
            Box::new(Fake { name, ns, batches: 0, fail_after, log: log.clone() })
        };
        let mut lanes = Lanes::new(vec![fake("a", 10, usize::MAX), fake("b", 20, 2)], 2);
        lanes.warm_up(64, 1, "at 64 B: ");
        lanes.measure(1, 64, Schedule::new(3, 4), "at 64 B: ");
        assert_eq!(*log.borrow(), ["a", "b", "a", "b", "b", "a", "a"], "b fails in round 1 and is skipped after");
        let lanes = lanes.finish();
        assert_eq!(lanes[0].cases[1].count(), 12);
        assert_eq!(lanes[0].p50(1), Some(10.0));
        assert_eq!(lanes[0].p50(0), None);
        assert_eq!(lanes[1].cases[1].count(), 4);
        assert_eq!(lanes[1].failed.as_deref(), Some("at 64 B: gone"));
        assert_eq!(lanes[0].same_cpu(None), None, "placement is not tracked unless asked");
        assert_eq!(lanes[0].round_p50s[1], [10.0; 3], "a median per round");
        assert_eq!(lanes[1].round_p50s[1], [20.0], "none for the rounds after it failed");
        assert!(lanes[0].round_p50s[0].is_empty());
    }

    #[test]
    fn batches_can_start_warm() {
        let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let t: Box<dyn Transport> = Box::new(Fake { name: "a", ns: 1, batches: 0, fail_after: 100, log: log.clone() });
        let mut lanes = Lanes::new(vec![t], 1);
        lanes.measure(0, 8, Schedule { warm: 2, ..Schedule::new(2, 3) }, "");
        assert_eq!(log.borrow().len(), 4, "a warm batch before each timed one");
        assert_eq!(lanes.finish()[0].cases[0].count(), 6, "warm round trips are not recorded");
    }
}
