//! The conditions a result was measured under.
//!
//! On a shared, noisy virtual machine a number means little without the load, the
//! scheduling class and the pinning it was obtained with, so every report carries them.

use serde::Serialize;

/// Machine and scheduling conditions of one experiment run, serialized as the
/// `conditions` object of the JSON report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conditions {
    /// Online CPUs.
    pub cpus: usize,
    /// CPU model as `/proc/cpuinfo` names it.
    pub cpu_model: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// One-minute load average when the experiment started.
    pub loadavg_before: Option<f64>,
    /// One-minute load average when it finished (`None` until [`Conditions::finish`]).
    pub loadavg_after: Option<f64>,
    /// Scheduling policy and priority the benchmark threads actually run with,
    /// e.g. `"SCHED_OTHER nice 0"` or `"SCHED_FIFO 80"`.
    pub policy: String,
    /// Whether this process may switch a thread to `SCHED_FIFO`.
    pub rt_privileges: bool,
    /// CPUs the benchmark threads are pinned to, or `"none"`.
    pub pinned: String,
}

impl Conditions {
    /// Records everything that can be known before the measurements start.
    pub fn capture_before() -> Self {
        Conditions {
            cpus: online_cpus(),
            cpu_model: cpu_model(),
            kernel: rustix::system::uname().release().to_string_lossy().into_owned(),
            loadavg_before: loadavg_1min(),
            loadavg_after: None,
            policy: current_policy(),
            rt_privileges: rt_privileges(),
            pinned: "none".to_string(),
        }
    }

    /// Records the load average after the measurements and the policy the calling
    /// thread ended up with (an experiment may have changed it on the way).
    pub fn finish(mut self) -> Self {
        self.loadavg_after = loadavg_1min();
        self.policy = current_policy();
        self
    }
}

/// Number of online CPUs, from `/proc/cpuinfo`, falling back to the affinity-limited
/// count the standard library reports.
fn online_cpus() -> usize {
    let from_cpuinfo = std::fs::read_to_string("/proc/cpuinfo")
        .map(|text| text.lines().filter(|line| line.split(':').next().map(str::trim) == Some("processor")).count())
        .unwrap_or(0);
    if from_cpuinfo > 0 {
        from_cpuinfo
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// The first `model name` (x86) or `Hardware`/`CPU part` (Arm) line of `/proc/cpuinfo`.
fn cpu_model() -> String {
    let Ok(text) = std::fs::read_to_string("/proc/cpuinfo") else {
        return "unknown".to_string();
    };
    ["model name", "Hardware", "CPU part"]
        .iter()
        .find_map(|key| {
            text.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                (name.trim() == *key).then(|| value.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// Space an experiment that writes files leaves free on their filesystem for
/// everything else on the machine.
pub const DISK_RESERVE: u64 = 64 << 20;

/// With `free` bytes free, the size of each of `shares` equal parts of what is free
/// beyond [`DISK_RESERVE`], in whole MiB and no larger than `wanted`; `None` when a part
/// would be less than 1 MiB.
pub fn disk_share(free: u64, shares: u64, wanted: u64) -> Option<u64> {
    let each = (free.saturating_sub(DISK_RESERVE) / shares.max(1)) >> 20 << 20;
    (each >= 1 << 20).then_some(wanted.min(each))
}

/// Bytes free for an unprivileged user in the filesystem holding `dir`.
pub fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    let s = rustix::fs::statfs(dir).ok()?;
    Some((s.f_bavail as u64).saturating_mul(s.f_bsize as u64))
}

/// The one-minute load average, the first field of `/proc/loadavg`.
pub fn loadavg_1min() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Describes the scheduling policy and priority of the calling thread, e.g.
/// `"SCHED_OTHER nice 0"` or `"SCHED_FIFO 80"`.
pub fn current_policy() -> String {
    ictus_rt::thread::current_policy().to_string()
}

/// Whether `sched_setscheduler(SCHED_FIFO)` is permitted, tested for real on a
/// throwaway thread: root alone is not enough when a cgroup gives no real-time budget,
/// and an unprivileged user may have `RLIMIT_RTPRIO`. The benchmark threads keep their
/// own policy.
pub fn rt_privileges() -> bool {
    ictus_rt::thread::rt_privileges()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_serialize_to_the_contract_shape() {
        let c = Conditions::capture_before().finish();
        assert!(c.cpus >= 1);
        let value = serde_json::to_value(&c).expect("serializable");
        for key in
            ["cpus", "cpu_model", "kernel", "loadavg_before", "loadavg_after", "policy", "rt_privileges", "pinned"]
        {
            assert!(value.get(key).is_some(), "missing {key}");
        }
        assert!(c.policy.starts_with("SCHED_") || c.policy.starts_with("policy"));
    }
}
