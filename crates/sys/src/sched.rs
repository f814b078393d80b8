//! Scheduling attributes of a thread: `sched_setattr(2)` and `sched_getattr(2)`.
//!
//! These are the only calls that set every class, `SCHED_DEADLINE` included, and that
//! act on any thread by its id (the older `sched_setscheduler` cannot set a deadline
//! reservation). glibc has no wrappers for them (before 2.41), so the raw system calls
//! are made. What the classes mean, and which are refused without privileges, is the
//! callers' business (`ictus-rt`'s `thread` module).

/// `SCHED_OTHER`: timesharing.
pub const SCHED_OTHER: u32 = 0;
/// `SCHED_FIFO`: fixed priority, first in first out.
pub const SCHED_FIFO: u32 = 1;
/// `SCHED_RR`: fixed priority with round-robin time slices.
pub const SCHED_RR: u32 = 2;
/// `SCHED_BATCH`: timesharing, for batch work.
pub const SCHED_BATCH: u32 = 3;
/// `SCHED_IDLE`: only when nothing else runs.
pub const SCHED_IDLE: u32 = 5;
/// `SCHED_DEADLINE`: a CPU reservation (runtime every period, within a deadline).
pub const SCHED_DEADLINE: u32 = 6;
/// `SCHED_FLAG_RESET_ON_FORK`: children start as `SCHED_OTHER`. A deadline thread may
/// not fork or create threads without it.
pub const SCHED_FLAG_RESET_ON_FORK: u64 = 1;

/// `struct sched_attr` as of Linux 3.14 (`SCHED_ATTR_SIZE_VER0`, 48 bytes). The kernel
/// accepts any size from VER0 up, zero-extending what it lacks (the later utilisation
/// clamp fields), so this layout works on every kernel with `sched_setattr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedAttr {
    /// The class: [`SCHED_OTHER`], [`SCHED_FIFO`], [`SCHED_RR`], [`SCHED_DEADLINE`]…
    pub policy: u32,
    /// `SCHED_FLAG_*`, e.g. [`SCHED_FLAG_RESET_ON_FORK`].
    pub flags: u64,
    /// The nice value, for `SCHED_OTHER` and `SCHED_BATCH`.
    pub nice: i32,
    /// The static priority (1..=99), for `SCHED_FIFO` and `SCHED_RR`.
    pub priority: u32,
    /// `SCHED_DEADLINE`'s runtime, in nanoseconds.
    pub runtime: u64,
    /// `SCHED_DEADLINE`'s relative deadline, in nanoseconds.
    pub deadline: u64,
    /// `SCHED_DEADLINE`'s period, in nanoseconds.
    pub period: u64,
}

impl SchedAttr {
    fn to_raw(self) -> libc::sched_attr {
        libc::sched_attr {
            size: std::mem::size_of::<libc::sched_attr>() as u32,
            sched_policy: self.policy,
            sched_flags: self.flags,
            sched_nice: self.nice,
            sched_priority: self.priority,
            sched_runtime: self.runtime,
            sched_deadline: self.deadline,
            sched_period: self.period,
        }
    }

    fn from_raw(a: &libc::sched_attr) -> SchedAttr {
        SchedAttr {
            policy: a.sched_policy,
            flags: a.sched_flags,
            nice: a.sched_nice,
            priority: a.sched_priority,
            runtime: a.sched_runtime,
            deadline: a.sched_deadline,
            period: a.sched_period,
        }
    }
}

fn last_errno() -> rustix::io::Errno {
    rustix::io::Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

/// `sched_setattr(tid, &attr, 0)`: give thread `tid` (0: the calling thread) this
/// scheduling class. Any thread of the caller's process may be changed, any other with
/// `CAP_SYS_NICE`; fixed priorities without it need `RLIMIT_RTPRIO`.
///
/// # References
/// - [`sched_setattr(2)`](https://man7.org/linux/man-pages/man2/sched_setattr.2.html)
/// - [`sched(7)`](https://man7.org/linux/man-pages/man7/sched.7.html)
pub fn set_attr(tid: u32, attr: &SchedAttr) -> rustix::io::Result<()> {
    let raw = attr.to_raw();
    // SAFETY: sched_setattr(tid, attr, 0) reads `attr.size` bytes from `raw`, a live
    // sched_attr whose size field is its own size, and touches no other memory.
    let rc =
        unsafe { libc::syscall(libc::SYS_sched_setattr, tid as libc::pid_t, &raw as *const libc::sched_attr, 0u32) };
    if rc != 0 {
        return Err(last_errno());
    }
    Ok(())
}

/// `sched_getattr(tid, &attr, sizeof attr, 0)`: thread `tid`'s own scheduling class (0:
/// the calling thread), not a priority it inherits through a PI futex.
///
/// # References
/// - [`sched_getattr(2)`](https://man7.org/linux/man-pages/man2/sched_getattr.2.html)
pub fn get_attr(tid: u32) -> rustix::io::Result<SchedAttr> {
    let mut raw = SchedAttr::default().to_raw();
    let size = raw.size;
    // SAFETY: sched_getattr writes at most `size` bytes into `raw`, a live, writable
    // sched_attr of exactly that size.
    let rc = unsafe {
        libc::syscall(libc::SYS_sched_getattr, tid as libc::pid_t, &mut raw as *mut libc::sched_attr, size, 0u32)
    };
    if rc != 0 {
        return Err(last_errno());
    }
    Ok(SchedAttr::from_raw(&raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_reads_back_the_nice_value_it_set() {
        std::thread::spawn(|| {
            let before = get_attr(0).unwrap();
            assert!(matches!(before.policy, SCHED_OTHER | SCHED_BATCH | SCHED_IDLE));
            // Raising nice needs no privilege.
            set_attr(0, &SchedAttr { policy: SCHED_OTHER, nice: 5, ..SchedAttr::default() }).unwrap();
            let after = get_attr(0).unwrap();
            assert_eq!((after.policy, after.nice), (SCHED_OTHER, 5));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn bad_attributes_are_refused() {
        std::thread::spawn(|| {
            assert_eq!(
                set_attr(0, &SchedAttr { policy: SCHED_FIFO, priority: 100, ..SchedAttr::default() }),
                Err(rustix::io::Errno::INVAL)
            );
            assert_eq!(get_attr(u32::MAX >> 2), Err(rustix::io::Errno::SRCH));
        })
        .join()
        .unwrap();
    }
}
