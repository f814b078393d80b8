//! Real-time thread control: scheduling class, CPU placement, memory locking and
//! timer slack for the calling thread, granted as far as the system allows.
//!
//! The paper's fixed-priority threads (000 §5) become `SCHED_FIFO`/`SCHED_RR`, and a
//! CPU reservation becomes `SCHED_DEADLINE` (runtime/deadline/period, through the raw
//! `sched_setattr` system call). None of these is a right: an unprivileged user has no
//! `CAP_SYS_NICE` and usually `RLIMIT_RTPRIO` 0, a container may have no real-time
//! budget, `SCHED_DEADLINE` has its own admission control. So
//! [`configure_current_thread`] never fails: it applies what it can, reads back what
//! the thread really has, and lists what was refused, each [`Refusal`] saying what was
//! asked, what the thread got instead and why (the errno and what it means here). The
//! first refusal of each [`RefusalKind`] in a process prints one warning on standard
//! error; later ones are silent (they are still returned).
//!
//! ```no_run
//! use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
//! let granted = configure_current_thread(&ThreadRequest {
//!     policy: Some(Policy::Fifo { priority: 80 }),
//!     timer_slack: Some(std::time::Duration::from_nanos(1)),
//!     ..ThreadRequest::default()
//! });
//! println!("running {}", granted.describe()); // "SCHED_FIFO 80", or "SCHED_OTHER nice 0"
//! ```
//!
//! # What to know
//!
//! - **Per thread.** Policy, affinity and timer slack apply to the calling thread only
//!   (pid 0 in the system calls means the calling thread). Threads it creates later
//!   inherit them, except that a `SCHED_DEADLINE` thread is set with
//!   `SCHED_FLAG_RESET_ON_FORK`: without it the kernel refuses to let a deadline thread
//!   create threads or processes at all (`EAGAIN`), and with it children start as
//!   `SCHED_OTHER`.
//! - **Memory locking is per process.** `mlockall(MCL_CURRENT | MCL_FUTURE)` locks every
//!   page mapped now and every page mapped later, for every thread. Under a finite
//!   `RLIMIT_MEMLOCK` (an unprivileged user, 8 MiB by default) `MCL_FUTURE` can make
//!   later `mmap`s, and so later large allocations and thread stacks, fail with
//!   `ENOMEM` / `EAGAIN`. Lock memory only in a process that knows its footprint, and
//!   never in a test process shared with other tests.
//! - **`SCHED_DEADLINE` needs the whole root domain.** The kernel refuses it (`EPERM`)
//!   to a thread whose affinity is narrower than its root domain, and refuses to
//!   narrow the affinity of a deadline thread (`EBUSY`). A request for both applies the
//!   deadline class first and reports the affinity as refused.
//! - **Timer slack 0** cannot be asked of `prctl(PR_SET_TIMERSLACK)`: 0 means "back to
//!   the default" (50 µs). A request for zero sets 1 ns, the smallest. The kernel gives
//!   real-time and deadline threads no slack anyway.
//!
//! # References
//!  - [`sched(7)`](https://man7.org/linux/man-pages/man7/sched.7.html),
//!    [`sched_setattr(2)`](https://man7.org/linux/man-pages/man2/sched_setattr.2.html),
//!    [`sched_setscheduler(2)`](https://man7.org/linux/man-pages/man2/sched_setscheduler.2.html)
//!  - [`mlockall(2)`](https://man7.org/linux/man-pages/man2/mlockall.2.html),
//!    [`prctl(2)`](https://man7.org/linux/man-pages/man2/prctl.2.html) (`PR_SET_TIMERSLACK`)
//!  - [Deadline Task Scheduling](https://docs.kernel.org/scheduler/sched-deadline.html)

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ictus_sys::sched::{SchedAttr, SCHED_DEADLINE, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK, SCHED_OTHER, SCHED_RR};
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// A scheduling class and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Timesharing (`SCHED_OTHER`, the default) with a nice value in `-20..=19`.
    Other {
        /// Lower is more favoured; going below the current value needs privilege.
        nice: i32,
    },
    /// Fixed priority, first in first out (`SCHED_FIFO`), priority `1..=99`.
    Fifo {
        /// Higher runs first.
        priority: u8,
    },
    /// Fixed priority with round-robin time slices among equals (`SCHED_RR`).
    RoundRobin {
        /// Higher runs first.
        priority: u8,
    },
    /// A CPU reservation (`SCHED_DEADLINE`): `runtime` of CPU in every `period`, to be
    /// used within `deadline` of each period's start. Needs
    /// `runtime <= deadline <= period`, runtime at least 1024 ns.
    Deadline {
        /// CPU time per period.
        runtime: Duration,
        /// Relative deadline.
        deadline: Duration,
        /// Period of the reservation.
        period: Duration,
    },
}

impl Policy {
    /// The timesharing default, `SCHED_OTHER` nice 0.
    pub const DEFAULT: Policy = Policy::Other { nice: 0 };

    /// The kernel's name of the class, e.g. `SCHED_FIFO`.
    pub fn class_name(&self) -> &'static str {
        match self {
            Policy::Other { .. } => "SCHED_OTHER",
            Policy::Fifo { .. } => "SCHED_FIFO",
            Policy::RoundRobin { .. } => "SCHED_RR",
            Policy::Deadline { .. } => "SCHED_DEADLINE",
        }
    }

    /// Whether this is a real-time class (fixed priority or deadline).
    pub fn is_realtime(&self) -> bool {
        !matches!(self, Policy::Other { .. })
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Other { nice } => write!(f, "SCHED_OTHER nice {nice}"),
            Policy::Fifo { priority } => write!(f, "SCHED_FIFO {priority}"),
            Policy::RoundRobin { priority } => write!(f, "SCHED_RR {priority}"),
            Policy::Deadline { runtime, deadline, period } => {
                write!(f, "SCHED_DEADLINE runtime {runtime:?} deadline {deadline:?} period {period:?}")
            }
        }
    }
}

/// What a thread asks for. Every field is optional: `None`/`false` leaves that aspect
/// as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadRequest {
    /// Scheduling class and parameters.
    pub policy: Option<Policy>,
    /// CPUs the thread may run on.
    pub cpus: Option<Vec<usize>>,
    /// `mlockall(MCL_CURRENT | MCL_FUTURE)` — for the whole process; see the module
    /// documentation before asking for it.
    pub lock_memory: bool,
    /// Timer slack (how late the kernel may fire this thread's timers to batch
    /// wake-ups). Zero is set as 1 ns, the smallest the kernel accepts.
    pub timer_slack: Option<Duration>,
}

/// Which part of a request was refused. Each kind warns once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalKind {
    /// A fixed-priority class (`SCHED_FIFO`, `SCHED_RR`) or its priority.
    FixedPriority,
    /// `SCHED_DEADLINE`.
    Deadline,
    /// A nice value.
    Nice,
    /// The CPU affinity.
    Affinity,
    /// Memory locking.
    MemoryLock,
    /// Timer slack.
    TimerSlack,
}

impl RefusalKind {
    const ALL: [RefusalKind; 6] = [
        RefusalKind::FixedPriority,
        RefusalKind::Deadline,
        RefusalKind::Nice,
        RefusalKind::Affinity,
        RefusalKind::MemoryLock,
        RefusalKind::TimerSlack,
    ];

    fn index(self) -> usize {
        RefusalKind::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }
}

/// A part of a [`ThreadRequest`] that was not granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What was refused.
    pub kind: RefusalKind,
    /// What was asked, e.g. `SCHED_FIFO 80`.
    pub asked: String,
    /// What the thread has instead, e.g. `SCHED_OTHER nice 0`.
    pub obtained: String,
    /// The error the kernel returned, if the refusal came from a system call.
    pub errno: Option<i32>,
    /// Why, in words: the errno's name and what it means for this request.
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} not granted ({}); running with {}", self.asked, self.reason, self.obtained)
    }
}

/// What the thread has after [`configure_current_thread`]: read back from the kernel,
/// not copied from the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The scheduling class the thread runs in now.
    pub policy: Policy,
    /// The CPUs the thread may run on now (`None` if the affinity could not be read).
    pub cpus: Option<Vec<usize>>,
    /// Whether this call locked the process's memory.
    pub memory_locked: bool,
    /// The thread's timer slack now (`None` if it could not be read).
    pub timer_slack: Option<Duration>,
    /// What was asked and not granted, in the order it was tried.
    pub refused: Vec<Refusal>,
}

impl Granted {
    /// The policy as the benchmark conditions record it, e.g. `SCHED_FIFO 80` or
    /// `SCHED_OTHER nice 0`.
    pub fn describe(&self) -> String {
        self.policy.to_string()
    }

    /// Whether everything asked was granted.
    pub fn all_granted(&self) -> bool {
        self.refused.is_empty()
    }

    /// The refusal of this kind, if any.
    pub fn refusal(&self, kind: RefusalKind) -> Option<&Refusal> {
        self.refused.iter().find(|r| r.kind == kind)
    }
}

static WARNED: [AtomicBool; 6] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];

/// Prints the refusal on standard error if it is the first of its kind in this
/// process; returns whether it printed.
fn warn_once(refusal: &Refusal) -> bool {
    if WARNED[refusal.kind.index()].swap(true, Ordering::Relaxed) {
        return false;
    }
    eprintln!("ictus: warning: {refusal} (further refusals of this kind are not shown)");
    true
}

/// Applies `req` to the calling thread as far as permitted, and reports what it got.
/// Never fails: a refused part leaves that aspect as it was (or the nearest thing that
/// is permitted, e.g. a fixed priority capped at `RLIMIT_RTPRIO`) and is listed in
/// [`Granted::refused`], with one warning per kind per process on standard error.
pub fn configure_current_thread(req: &ThreadRequest) -> Granted {
    configure_current_thread_preferring(req.policy.as_slice(), req)
}

/// As [`configure_current_thread`], trying the `policies` in order (for example a
/// deadline reservation, then a fixed priority) and keeping the first one granted;
/// `req.policy` is ignored. Each refused choice is listed, with what the thread ended
/// up with as `obtained`.
pub fn configure_current_thread_preferring(policies: &[Policy], req: &ThreadRequest) -> Granted {
    let mut refused: Vec<Refusal> = Vec::new();

    if let Some(slack) = req.timer_slack {
        if let Err(r) = set_timer_slack(slack) {
            refused.push(r);
        }
    }

    // Deadline before affinity: a deadline thread must span its root domain, so
    // narrowing first would make the deadline class fail.
    let mut policy_refusals = Vec::new();
    for policy in policies {
        match set_policy(*policy) {
            Ok(None) => break,
            Ok(Some(partial)) => {
                policy_refusals.push(partial);
                break;
            }
            Err(r) => policy_refusals.push(r),
        }
    }

    if let Some(cpus) = &req.cpus {
        if let Err(r) = set_affinity(cpus) {
            refused.push(r);
        }
    }

    let mut memory_locked = false;
    if req.lock_memory {
        match lock_memory() {
            Ok(()) => memory_locked = true,
            Err(r) => refused.push(r),
        }
    }

    let policy = current_policy();
    for mut r in policy_refusals {
        r.obtained = policy.to_string();
        refused.push(r);
    }
    for r in &refused {
        warn_once(r);
    }
    Granted { policy, cpus: current_affinity().ok(), memory_locked, timer_slack: timer_slack().ok(), refused }
}

/// The calling thread's scheduling class, read with `sched_getattr`.
pub fn current_policy() -> Policy {
    thread_policy(0).unwrap_or(Policy::DEFAULT)
}

/// Thread `tid`'s own scheduling class (0: the calling thread), read with
/// `sched_getattr`: not a priority it inherits through a PI futex.
pub fn thread_policy(tid: u32) -> io::Result<Policy> {
    Ok(Policy::from_attr(&ictus_sys::sched::get_attr(tid)?))
}

/// Give thread `tid` (0: the calling thread) this class with `sched_setattr`, as it is:
/// no capping, no fallback, no flags (see [`configure_current_thread`] for a request
/// that is granted as far as permitted). Any thread of this process may be changed,
/// another's only with `CAP_SYS_NICE`.
pub fn set_thread_policy(tid: u32, policy: Policy) -> io::Result<()> {
    Ok(ictus_sys::sched::set_attr(tid, &policy.to_attr())?)
}

/// Whether a thread of this process may switch to `SCHED_FIFO`, tried for real on a
/// throwaway thread (root is not enough when a cgroup gives no real-time budget; an
/// unprivileged user may have `RLIMIT_RTPRIO`). The calling thread is not changed.
pub fn rt_privileges() -> bool {
    probe(Policy::Fifo { priority: 1 })
}

/// Whether a thread of this process may be given this policy, tried on a throwaway
/// thread that exits right after.
pub fn probe(policy: Policy) -> bool {
    std::thread::Builder::new()
        .name("rt-probe".to_string())
        .spawn(move || matches!(set_policy(policy), Ok(None)))
        .ok()
        .and_then(|h| h.join().ok())
        .unwrap_or(false)
}

/// The calling thread's CPU affinity, as a sorted list.
pub fn current_affinity() -> io::Result<Vec<usize>> {
    let set = sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// The calling thread's timer slack (`prctl(PR_GET_TIMERSLACK)`).
pub fn timer_slack() -> io::Result<Duration> {
    Ok(Duration::from_nanos(rustix::thread::current_timer_slack()?))
}

/// The process's `RLIMIT_RTPRIO` soft limit; unlimited reads as `u64::MAX`.
pub fn rtprio_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Rtprio).current.unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------
// The system calls.

impl Policy {
    /// The `sched_attr` that asks for this class (no flags).
    fn to_attr(self) -> SchedAttr {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        match self {
            Policy::Other { nice } => SchedAttr { policy: SCHED_OTHER, nice, ..SchedAttr::default() },
            Policy::Fifo { priority } => {
                SchedAttr { policy: SCHED_FIFO, priority: u32::from(priority), ..SchedAttr::default() }
            }
            Policy::RoundRobin { priority } => {
                SchedAttr { policy: SCHED_RR, priority: u32::from(priority), ..SchedAttr::default() }
            }
            Policy::Deadline { runtime, deadline, period } => SchedAttr {
                policy: SCHED_DEADLINE,
                runtime: ns(runtime),
                deadline: ns(deadline),
                period: ns(period),
                ..SchedAttr::default()
            },
        }
    }

    /// The class a `sched_attr` describes.
    fn from_attr(attr: &SchedAttr) -> Policy {
        let prio = u8::try_from(attr.priority).unwrap_or(u8::MAX);
        match attr.policy {
            SCHED_FIFO => Policy::Fifo { priority: prio },
            SCHED_RR => Policy::RoundRobin { priority: prio },
            SCHED_DEADLINE => Policy::Deadline {
                runtime: Duration::from_nanos(attr.runtime),
                deadline: Duration::from_nanos(attr.deadline),
                period: Duration::from_nanos(attr.period),
            },
            // SCHED_OTHER, SCHED_BATCH and SCHED_IDLE are all timesharing.
            _ => Policy::Other { nice: attr.nice },
        }
    }
}

/// `sched_setattr` on the calling thread.
fn set_attr(attr: &SchedAttr) -> io::Result<()> {
    Ok(ictus_sys::sched::set_attr(0, attr)?)
}

fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::EINVAL => "EINVAL",
        libc::EBUSY => "EBUSY",
        libc::ENOMEM => "ENOMEM",
        libc::EAGAIN => "EAGAIN",
        libc::ENOSYS => "ENOSYS",
        libc::ESRCH => "ESRCH",
        libc::E2BIG => "E2BIG",
        _ => "error",
    }
}

fn refusal(kind: RefusalKind, asked: String, errno: Option<i32>, reason: String) -> Refusal {
    let reason = match errno {
        Some(e) => format!("{}: {reason}", errno_name(e)),
        None => reason,
    };
    Refusal { kind, asked, obtained: String::new(), errno, reason }
}

/// Why a fixed-priority or deadline request got `EPERM`, as far as can be told.
fn explain_rt_eperm(asked_priority: Option<u8>) -> String {
    let limit = rtprio_limit();
    let euid = rustix::process::geteuid();
    if asked_priority.is_none() && !euid.is_root() {
        return "SCHED_DEADLINE needs CAP_SYS_NICE (RLIMIT_RTPRIO does not grant it)".to_string();
    }
    match limit {
        0 if !euid.is_root() => "RLIMIT_RTPRIO is 0 and the process lacks CAP_SYS_NICE (not root); raise the limit \
             (limits.conf rtprio, or the `rtprio` of a systemd unit) or grant CAP_SYS_NICE"
            .to_string(),
        l if !euid.is_root() && asked_priority.is_some_and(|p| u64::from(p) > l) => {
            format!("RLIMIT_RTPRIO is {l}, below the priority asked, and the process lacks CAP_SYS_NICE")
        }
        _ if euid.is_root() => "refused even as root: CAP_SYS_NICE dropped, or the cgroup gives real-time \
                                threads no CPU budget (cpu.rt_runtime_us)"
            .to_string(),
        _ => "the process lacks CAP_SYS_NICE".to_string(),
    }
}

/// Sets the scheduling class. `Ok(None)`: granted as asked. `Ok(Some(r))`: granted
/// partly (e.g. a priority capped at the limit), `r` says how. `Err(r)`: refused, the
/// thread's class is unchanged.
fn set_policy(policy: Policy) -> Result<Option<Refusal>, Refusal> {
    let asked = policy.to_string();
    match policy {
        Policy::Other { nice } => {
            let kind = RefusalKind::Nice;
            if !(-20..=19).contains(&nice) {
                return Err(refusal(kind, asked, None, "nice must be in -20..=19".to_string()));
            }
            match set_attr(&policy.to_attr()) {
                Ok(()) => Ok(None),
                Err(e) => {
                    let errno = e.raw_os_error();
                    let why = if errno == Some(libc::EPERM) {
                        "lowering nice needs CAP_SYS_NICE or RLIMIT_NICE".to_string()
                    } else {
                        "sched_setattr(SCHED_OTHER) failed".to_string()
                    };
                    Err(refusal(kind, asked, errno, why))
                }
            }
        }
        Policy::Fifo { priority } | Policy::RoundRobin { priority } => {
            let kind = RefusalKind::FixedPriority;
            let class = if matches!(policy, Policy::Fifo { .. }) { libc::SCHED_FIFO } else { libc::SCHED_RR };
            let make = |p: u8| {
                if class == libc::SCHED_FIFO {
                    Policy::Fifo { priority: p }
                } else {
                    Policy::RoundRobin { priority: p }
                }
            };
            if !(1..=99).contains(&priority) {
                return Err(refusal(kind, asked, None, "fixed priorities are 1..=99".to_string()));
            }
            let try_prio = |p: u8| -> io::Result<()> { set_attr(&make(p).to_attr()) };
            match try_prio(priority) {
                Ok(()) => Ok(None),
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    // An unprivileged thread may use priorities up to RLIMIT_RTPRIO.
                    let limit = rtprio_limit();
                    if limit > 0 && limit < u64::from(priority) {
                        let capped = limit as u8;
                        if try_prio(capped).is_ok() {
                            return Ok(Some(refusal(
                                kind,
                                asked,
                                Some(libc::EPERM),
                                format!("RLIMIT_RTPRIO is {limit}; capped at {}", make(capped)),
                            )));
                        }
                    }
                    Err(refusal(kind, asked, Some(libc::EPERM), explain_rt_eperm(Some(priority))))
                }
                Err(e) => Err(refusal(kind, asked, e.raw_os_error(), "sched_setattr failed".to_string())),
            }
        }
        Policy::Deadline { runtime, deadline, period } => {
            let kind = RefusalKind::Deadline;
            let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            let (r, d, p) = (ns(runtime), ns(deadline), ns(period));
            if r < 1024 || r > d || d > p || p >= 1 << 63 {
                return Err(refusal(
                    kind,
                    asked,
                    None,
                    "needs 1024 ns <= runtime <= deadline <= period (and a period within \
                     kernel.sched_deadline_period_min_us..max_us)"
                        .to_string(),
                ));
            }
            // Without it a deadline thread may not create threads or processes.
            let attr = SchedAttr { flags: SCHED_FLAG_RESET_ON_FORK, ..policy.to_attr() };
            match set_attr(&attr) {
                Ok(()) => Ok(None),
                Err(e) => {
                    let errno = e.raw_os_error();
                    let why = match errno {
                        Some(libc::EPERM) if !affinity_spans_all_cpus() => format!(
                            "the thread's CPU affinity ({}) is narrower than its root domain; \
                             SCHED_DEADLINE needs every CPU (use a cpuset partition to confine it)",
                            current_affinity().map(|c| list(&c)).unwrap_or_else(|_| "?".to_string())
                        ),
                        Some(libc::EPERM) => explain_rt_eperm(None),
                        Some(libc::EBUSY) => "the kernel's deadline admission control refused the bandwidth \
                                              (kernel.sched_rt_runtime_us / the root domain's free capacity)"
                            .to_string(),
                        Some(libc::EINVAL) => "parameters outside the kernel's limits \
                                               (kernel.sched_deadline_period_min_us/max_us)"
                            .to_string(),
                        Some(libc::ENOSYS) => "no sched_setattr on this kernel".to_string(),
                        _ => "sched_setattr(SCHED_DEADLINE) failed".to_string(),
                    };
                    Err(refusal(kind, asked, errno, why))
                }
            }
        }
    }
}

fn list(cpus: &[usize]) -> String {
    cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

fn online_cpu_count() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| parse_cpu_list(text.trim()))
        .map(|cpus| cpus.len())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Parses the kernel's CPU list format (`0-3,5,7-8`).
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    if text.is_empty() {
        return Some(cpus);
    }
    for part in text.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b || b >= CpuSet::MAX_CPU {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => {
                let c: usize = part.parse().ok()?;
                if c >= CpuSet::MAX_CPU {
                    return None;
                }
                cpus.push(c);
            }
        }
    }
    Some(cpus)
}

fn affinity_spans_all_cpus() -> bool {
    current_affinity().map(|c| c.len() >= online_cpu_count()).unwrap_or(true)
}

fn set_affinity(cpus: &[usize]) -> Result<(), Refusal> {
    let kind = RefusalKind::Affinity;
    let asked = format!("CPUs {}", list(cpus));
    if cpus.is_empty() {
        return Err(refusal(kind, asked, None, "no CPU named".to_string()));
    }
    if let Some(bad) = cpus.iter().find(|&&c| c >= CpuSet::MAX_CPU) {
        return Err(refusal(kind, asked, None, format!("CPU {bad} is beyond the largest CPU set")));
    }
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    match sched_setaffinity(None, &set) {
        Ok(()) => Ok(()),
        Err(e) => {
            let errno = Some(e.raw_os_error());
            let why = if e == rustix::io::Errno::BUSY {
                "a SCHED_DEADLINE thread must stay allowed on every CPU of its root domain".to_string()
            } else if e == rustix::io::Errno::INVAL {
                "none of these CPUs is online and allowed by the cpuset".to_string()
            } else {
                "sched_setaffinity failed".to_string()
            };
            Err(refusal(kind, asked, errno, why))
        }
    }
}

fn lock_memory() -> Result<(), Refusal> {
    use rustix::mm::{mlockall, MlockAllFlags};
    let Err(e) = mlockall(MlockAllFlags::CURRENT | MlockAllFlags::FUTURE) else { return Ok(()) };
    let errno = Some(e.raw_os_error());
    let memlock = rustix::process::getrlimit(rustix::process::Resource::Memlock).current;
    let why = match errno {
        Some(libc::ENOMEM) | Some(libc::EPERM) => format!(
            "RLIMIT_MEMLOCK is {} and the process lacks CAP_IPC_LOCK; memory stays pageable",
            memlock.map_or("unlimited".to_string(), |b| format!("{} KiB", b / 1024))
        ),
        _ => "mlockall failed".to_string(),
    };
    Err(Refusal {
        obtained: "pageable memory".to_string(),
        ..refusal(RefusalKind::MemoryLock, "mlockall(MCL_CURRENT | MCL_FUTURE)".to_string(), errno, why)
    })
}

fn set_timer_slack(slack: Duration) -> Result<(), Refusal> {
    let asked = format!("timer slack {slack:?}");
    // 0 would mean "reset to the default"; 1 ns is the least slack there is.
    let ns = std::num::NonZeroU64::new(u64::try_from(slack.as_nanos()).unwrap_or(u64::MAX).max(1));
    if let Err(e) = rustix::thread::set_current_timer_slack(ns) {
        let mut r = refusal(RefusalKind::TimerSlack, asked, Some(e.raw_os_error()), "prctl failed".to_string());
        r.obtained = timer_slack().map_or("unknown slack".to_string(), |s| format!("timer slack {s:?}"));
        return Err(r);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a fresh thread, so that the scheduling class it sets dies with it.
    fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().expect("test thread panicked")
    }

    #[test]
    fn policies_describe_themselves_as_the_conditions_record_them() {
        assert_eq!(Policy::Fifo { priority: 80 }.to_string(), "SCHED_FIFO 80");
        assert_eq!(Policy::Other { nice: 0 }.to_string(), "SCHED_OTHER nice 0");
        assert_eq!(Policy::RoundRobin { priority: 3 }.to_string(), "SCHED_RR 3");
        let d = Policy::Deadline {
            runtime: Duration::from_millis(1),
            deadline: Duration::from_millis(5),
            period: Duration::from_millis(10),
        };
        assert_eq!(d.to_string(), "SCHED_DEADLINE runtime 1ms deadline 5ms period 10ms");
        assert!(d.is_realtime() && !Policy::DEFAULT.is_realtime());
    }

    #[test]
    fn cpu_lists_parse_like_sysfs() {
        assert_eq!(parse_cpu_list("0-3,5"), Some(vec![0, 1, 2, 3, 5]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list("0-99999"), None);
    }

    #[test]
    fn an_empty_request_changes_nothing_and_refuses_nothing() {
        let (before, granted) = on_thread(|| (current_policy(), configure_current_thread(&ThreadRequest::default())));
        assert_eq!(granted.policy, before);
        assert!(granted.all_granted(), "{:?}", granted.refused);
        assert!(!granted.memory_locked);
    }

    #[test]
    fn invalid_requests_are_refused_with_a_reason_and_change_nothing() {
        // "Unchanged" is the policy the thread started with: the tests may run under `nice`.
        let (before, granted) = on_thread(|| {
            let before = current_policy();
            let granted = configure_current_thread(&ThreadRequest {
                policy: Some(Policy::Fifo { priority: 0 }),
                cpus: Some(vec![]),
                ..ThreadRequest::default()
            });
            (before, granted)
        });
        assert_eq!(granted.policy, before);
        let fifo = granted.refusal(RefusalKind::FixedPriority).expect("priority 0 refused");
        assert!(fifo.reason.contains("1..=99"), "{fifo}");
        assert_eq!(fifo.obtained, before.to_string());
        assert!(granted.refusal(RefusalKind::Affinity).is_some());

        let bad_deadline = Policy::Deadline {
            runtime: Duration::from_millis(2),
            deadline: Duration::from_millis(1),
            period: Duration::from_millis(10),
        };
        let (before, granted) = on_thread(move || {
            let before = current_policy();
            (
                before,
                configure_current_thread(&ThreadRequest { policy: Some(bad_deadline), ..ThreadRequest::default() }),
            )
        });
        assert_eq!(granted.policy, before);
        assert!(granted.refusal(RefusalKind::Deadline).is_some_and(|r| r.errno.is_none()));
    }

    #[test]
    fn fifo_is_granted_and_read_back_when_permitted_else_refused() {
        let privileged = rt_privileges();
        let (before, granted) = on_thread(|| {
            let before = current_policy();
            let g = configure_current_thread(&ThreadRequest {
                policy: Some(Policy::Fifo { priority: 10 }),
                ..ThreadRequest::default()
            });
            assert_eq!(g.policy, current_policy(), "Granted reports what the kernel says");
            (before, g)
        });
        if privileged {
            assert_eq!(granted.policy, Policy::Fifo { priority: 10 });
            assert_eq!(granted.describe(), "SCHED_FIFO 10");
            assert!(granted.all_granted());
        } else {
            assert_eq!(granted.policy, before);
            assert!(granted.refusal(RefusalKind::FixedPriority).is_some());
        }
        // The probe left this thread alone.
        assert!(!current_policy().is_realtime());
    }

    #[test]
    fn round_robin_and_nice_are_read_back() {
        let privileged = rt_privileges();
        let rr = on_thread(|| {
            configure_current_thread(&ThreadRequest {
                policy: Some(Policy::RoundRobin { priority: 5 }),
                ..ThreadRequest::default()
            })
        });
        assert_eq!(rr.policy == (Policy::RoundRobin { priority: 5 }), privileged, "{rr:?}");
        // Raising nice is always permitted.
        let nice = on_thread(|| {
            configure_current_thread(&ThreadRequest {
                policy: Some(Policy::Other { nice: 5 }),
                ..ThreadRequest::default()
            })
        });
        assert_eq!(nice.policy, Policy::Other { nice: 5 });
    }

    #[test]
    fn deadline_is_granted_or_its_refusal_explained() {
        let dl = Policy::Deadline {
            runtime: Duration::from_micros(500),
            deadline: Duration::from_millis(10),
            period: Duration::from_millis(10),
        };
        let (before, granted, child_policy) = on_thread(move || {
            let before = current_policy();
            let g = configure_current_thread(&ThreadRequest { policy: Some(dl), ..ThreadRequest::default() });
            // SCHED_FLAG_RESET_ON_FORK: a deadline thread can still create threads,
            // and they start as timesharing.
            let child = std::thread::spawn(current_policy).join().expect("child thread");
            (before, g, child)
        });
        match granted.refusal(RefusalKind::Deadline) {
            None => {
                assert_eq!(granted.policy, dl);
                assert!(!child_policy.is_realtime(), "{child_policy}");
            }
            Some(r) => {
                assert_eq!(granted.policy, before);
                assert!(r.errno.is_some() && !r.reason.is_empty(), "{r}");
            }
        }
    }

    #[test]
    fn deadline_with_a_narrow_affinity_reports_the_affinity() {
        if online_cpu_count() < 2 || !affinity_spans_all_cpus() {
            return; // nothing to narrow
        }
        let dl = Policy::Deadline {
            runtime: Duration::from_micros(200),
            deadline: Duration::from_millis(10),
            period: Duration::from_millis(10),
        };
        let granted = on_thread(move || {
            configure_current_thread(&ThreadRequest {
                policy: Some(dl),
                cpus: Some(vec![0]),
                ..ThreadRequest::default()
            })
        });
        if granted.policy == dl {
            let r = granted.refusal(RefusalKind::Affinity).expect("a deadline thread cannot be narrowed");
            assert_eq!(r.errno, Some(libc::EBUSY), "{r}");
        } else {
            // No deadline at all here: the affinity was then applied.
            assert!(granted.refusal(RefusalKind::Deadline).is_some());
            assert_eq!(granted.cpus, Some(vec![0]));
        }
        // Narrowed first, then asked for a deadline: EPERM, explained.
        let granted = on_thread(move || {
            configure_current_thread(&ThreadRequest { cpus: Some(vec![0]), ..ThreadRequest::default() });
            configure_current_thread(&ThreadRequest { policy: Some(dl), ..ThreadRequest::default() })
        });
        let r = granted.refusal(RefusalKind::Deadline).expect("refused with a narrow affinity");
        if r.errno == Some(libc::EPERM) && rt_privileges() {
            assert!(r.reason.contains("affinity"), "{r}");
        }
    }

    #[test]
    fn preferring_falls_back_in_order() {
        let granted = on_thread(|| {
            configure_current_thread_preferring(
                &[Policy::Fifo { priority: 0 }, Policy::Other { nice: 3 }],
                &ThreadRequest::default(),
            )
        });
        assert_eq!(granted.policy, Policy::Other { nice: 3 });
        let r = granted.refusal(RefusalKind::FixedPriority).expect("first choice refused");
        assert_eq!(r.obtained, "SCHED_OTHER nice 3");
    }

    #[test]
    fn affinity_and_timer_slack_are_read_back() {
        let granted = on_thread(|| {
            configure_current_thread(&ThreadRequest {
                cpus: Some(vec![0]),
                timer_slack: Some(Duration::ZERO),
                ..ThreadRequest::default()
            })
        });
        assert_eq!(granted.cpus, Some(vec![0]));
        assert_eq!(granted.timer_slack, Some(Duration::from_nanos(1)));
        let slack = on_thread(|| {
            configure_current_thread(&ThreadRequest {
                timer_slack: Some(Duration::from_micros(7)),
                ..ThreadRequest::default()
            })
            .timer_slack
        });
        assert_eq!(slack, Some(Duration::from_micros(7)));
    }

    #[test]
    fn a_refusal_warns_once_per_kind() {
        let r = refusal(RefusalKind::TimerSlack, "x".into(), None, "test".into());
        // Another test may have warned already; either way the second call is silent.
        warn_once(&r);
        assert!(!warn_once(&r));
    }
}
