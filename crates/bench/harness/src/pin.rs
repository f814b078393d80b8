//! Optional CPU pinning (`--pin`).
//!
//! Runs are unpinned by default: that is how a user's programs run. Pinning the client
//! and the server to chosen CPUs takes the scheduler's placement out of the numbers,
//! e.g. `0,1` (client on CPU 0, server on CPU 1: every round trip crosses CPUs, which
//! is slow on a VM) or `0,0` (both on one CPU: every round trip is a context switch).

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

use crate::BenchError;

/// Where the two ends of a measurement run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinPlan {
    /// CPU of the measuring (client) thread.
    pub client: usize,
    /// CPU of the server processes.
    pub server: usize,
}

impl PinPlan {
    /// Parses `"C,S"` (client CPU, server CPU) or `"C"` (both on one CPU), checking
    /// that the CPUs exist and this process may run on them (as `--pin` does:
    /// [`ictus_args::Placement`]).
    pub fn parse(spec: &str) -> Result<Self, BenchError> {
        let bad = |reason: &str| BenchError::Pin { spec: spec.to_string(), reason: reason.to_string() };
        // Spaces around the CPUs are forgiven here (a plan written in code or a file);
        // the command line takes none.
        let spaced: Vec<&str> = spec.split(',').map(str::trim).collect();
        match ictus_args::Placement::parse(&spaced.join(",")) {
            Ok(ictus_args::Placement::Cpus { client, server }) => Ok(PinPlan { client, server }),
            Ok(ictus_args::Placement::Unpinned) => Err(bad("`none` names no CPU")),
            Err(reason) => Err(bad(&reason)),
        }
    }

    /// How the plan is recorded in the conditions, e.g. `"client 0, server 1"`.
    pub fn describe(&self) -> String {
        format!("client {}, server {}", self.client, self.server)
    }
}

/// Pins the calling thread to one CPU. Threads and processes it creates afterwards
/// inherit the affinity, which is how servers are placed: pin to the server CPU, spawn
/// them, then pin to the client CPU.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set).map_err(std::io::Error::from)
}

/// The calling thread's current affinity, e.g. `"0,1"`.
pub fn current_affinity() -> String {
    match sched_getaffinity(None) {
        Ok(set) => {
            (0..CpuSet::MAX_CPU).filter(|&cpu| set.is_set(cpu)).map(|cpu| cpu.to_string()).collect::<Vec<_>>().join(",")
        }
        Err(_) => "unknown".to_string(),
    }
}

/// Restores the calling thread's affinity to a saved set (see [`saved_affinity`]).
pub fn restore_affinity(set: &CpuSet) -> std::io::Result<()> {
    sched_setaffinity(None, set).map_err(std::io::Error::from)
}

/// The calling thread's affinity, to restore after pinning.
pub fn saved_affinity() -> std::io::Result<CpuSet> {
    sched_getaffinity(None).map_err(std::io::Error::from)
}

/// The calling thread's affinity, restored when this is dropped: a run pins its
/// thread as it places its servers and gives its caller the thread back as it was.
#[derive(Debug)]
pub struct AffinityGuard {
    saved: CpuSet,
}

impl AffinityGuard {
    /// Saves the calling thread's affinity.
    pub fn save() -> Result<AffinityGuard, BenchError> {
        Ok(AffinityGuard { saved: saved_affinity().map_err(|e| BenchError::io("reading CPU affinity", e))? })
    }
}

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        let _ = restore_affinity(&self.saved);
    }
}

/// Places a run's two ends: with a plan, runs `spawn` on the server CPU (the processes
/// and threads it starts inherit that affinity), then moves the calling thread to the
/// client CPU; without one, just runs `spawn`. What `spawn` made is dropped (its
/// servers stopped) if the client CPU cannot be had.
pub fn place<T>(plan: Option<PinPlan>, spawn: impl FnOnce() -> T) -> Result<T, BenchError> {
    let pin = |cpu: usize| pin_current_thread(cpu).map_err(|e| BenchError::io(format!("pinning to CPU {cpu}"), e));
    if let Some(plan) = plan {
        pin(plan.server)?;
    }
    let spawned = spawn();
    if let Some(plan) = plan {
        pin(plan.client)?;
    }
    Ok(spawned)
}

/// The CPU the calling thread runs on.
pub fn current_cpu() -> Option<usize> {
    Some(rustix::thread::sched_getcpu())
}

/// The CPU a process last ran on (field 39, `processor`, of `/proc/<pid>/stat`).
pub fn last_cpu_of(pid: u32) -> Option<usize> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_processor(&stat)
}

/// Field 39 of a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may itself contain spaces and parentheses, so count from the last
/// `)`, after which field 3 comes.
fn parse_stat_processor(stat: &str) -> Option<usize> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(39 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_one_or_two_cpus() {
        assert_eq!(PinPlan::parse("0").expect("cpu 0 exists"), PinPlan { client: 0, server: 0 });
        assert_eq!(PinPlan::parse(" 0 , 0 ").expect("ok").describe(), "client 0, server 0");
    }

    #[test]
    fn refuses_nonsense() {
        for spec in ["", "a", "0,1,2", "0,", "99999", "none", "-1", "nan"] {
            assert!(PinPlan::parse(spec).is_err(), "{spec:?} accepted");
        }
    }

    #[test]
    fn stat_processor_field_survives_odd_command_names() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[39 - 3] = "1".to_string();
        let line = format!("1234 (a) b (c) {}", fields.join(" "));
        assert_eq!(parse_stat_processor(&line), Some(1));
        assert_eq!(parse_stat_processor("1234 (x) S 1"), None);
        let me = last_cpu_of(std::process::id()).expect("own stat is readable");
        assert!(me < CpuSet::MAX_CPU);
    }

    #[test]
    fn current_affinity_lists_cpus() {
        let text = current_affinity();
        assert!(text.split(',').all(|c| c.parse::<usize>().is_ok()), "{text}");
    }
}
