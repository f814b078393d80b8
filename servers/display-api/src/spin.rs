//! How long a shared-memory end spins before it blocks, sized to the machine.
//!
//! A spin pays only when the other end runs on another CPU at the same time: then the
//! answer (or the next request) comes within the spin, and neither side pays for a
//! block and a wake-up (two system calls and, on a virtual machine, an inter-processor
//! interrupt through the hypervisor: tens of microseconds). When every CPU already has
//! work, a spinning thread takes the CPU its peer, or anyone else, needs, and under
//! the kernel's fair scheduler it spends its own share for nothing: blocking at once
//! is then the faster choice. So a [`SpinPolicy`] spins for its budget only while the
//! machine has room, judged from the count of runnable tasks (`/proc/loadavg`, fourth
//! field, an instantaneous count) sampled at most every [`SAMPLE`], and never when
//! this thread may run on one CPU only (its peer is likely to share it).

use std::time::{Duration, Instant};

/// How often the runnable count is read again.
pub const SAMPLE: Duration = Duration::from_millis(100);

/// Whether spinning can pay: this thread may use more than one CPU, and no more tasks
/// are runnable than there are CPUs (the count includes the caller, and a peer that
/// spins too).
pub fn machine_has_room(runnable: u32, cpus: usize, affinity: usize) -> bool {
    affinity > 1 && (runnable as usize) <= cpus
}

/// The runnable count of `/proc/loadavg`'s text (`"0.5 0.4 0.3 2/345 6789"` → 2).
pub fn parse_runnable(loadavg: &str) -> Option<u32> {
    loadavg.split_whitespace().nth(3)?.split_once('/')?.0.parse().ok()
}

/// The spin of one end, re-judged as the machine's load changes.
#[derive(Debug, Clone)]
pub struct SpinPolicy {
    budget: Duration,
    cpus: usize,
    affinity: usize,
    sampled: Option<Instant>,
    current: Duration,
    looks: u64,
    with_room: u64,
}

impl SpinPolicy {
    /// A policy that spins up to `budget` when the machine has room (zero: never).
    pub fn new(budget: Duration) -> SpinPolicy {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let affinity = rustix::thread::sched_getaffinity(None).map_or(cpus, |s| s.count() as usize);
        SpinPolicy { budget, cpus, affinity, sampled: None, current: Duration::ZERO, looks: 0, with_room: 0 }
    }

    /// The most it spins.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// How many times it looked at the machine, and how many of those found room to
    /// spin.
    pub fn looks(&self) -> (u64, u64) {
        (self.looks, self.with_room)
    }

    /// How long to spin now; reads the runnable count again if [`SAMPLE`] has passed
    /// since the last look.
    pub fn spin(&mut self, now: Instant) -> Duration {
        if self.budget.is_zero() {
            return Duration::ZERO;
        }
        if self.sampled.map_or(true, |t| now.duration_since(t) >= SAMPLE) {
            self.sampled = Some(now);
            let runnable = std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| parse_runnable(&s));
            let room = runnable.is_some_and(|r| machine_has_room(r, self.cpus, self.affinity));
            self.current = if room { self.budget } else { Duration::ZERO };
            self.looks += 1;
            self.with_room += u64::from(room);
        }
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runnable_count_is_the_fourth_field() {
        assert_eq!(parse_runnable("0.50 0.40 0.30 2/345 6789\n"), Some(2));
        assert_eq!(parse_runnable("9.01 9.30 9.17 13/188 21597"), Some(13));
        assert_eq!(parse_runnable("0.5 0.4 0.3"), None);
        assert_eq!(parse_runnable("0.5 0.4 0.3 x/1 2"), None);
    }

    #[test]
    fn spin_only_with_room_and_more_than_one_cpu() {
        assert!(machine_has_room(2, 2, 2), "client and server spinning on an idle pair");
        assert!(!machine_has_room(3, 2, 2), "a third task wants a CPU");
        assert!(!machine_has_room(1, 2, 1), "pinned to one CPU: the peer likely shares it");
        assert!(machine_has_room(5, 8, 8));
    }

    #[test]
    fn a_zero_budget_never_spins() {
        let mut p = SpinPolicy::new(Duration::ZERO);
        assert_eq!(p.spin(Instant::now()), Duration::ZERO);
    }
}
