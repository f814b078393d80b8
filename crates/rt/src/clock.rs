//! Reading the real clocks: the one place in this crate that makes a system call.
//!
//! Everything else takes the time as a parameter. The clock service's shell reads
//! [`now`] and passes it in; tests pass a virtual time instead.

use crate::time::{Time, Timespec};

/// Time since boot: `clock_gettime(CLOCK_MONOTONIC)`, the clock the paper's clock
/// service reports ("elapsed time since the system boot") and the one
/// `clock_nanosleep(…, TIMER_ABSTIME, …)` sleeps on.
///
/// # References
///  - [Linux `clock_gettime(2)`](https://man7.org/linux/man-pages/man2/clock_gettime.2.html)
pub fn now() -> Time {
    from_rustix(rustix::time::clock_gettime(rustix::time::ClockId::Monotonic))
}

/// Wall-clock time: `clock_gettime(CLOCK_REALTIME)`, nanoseconds since the Unix epoch.
/// It can jump (settimeofday, NTP steps), so never schedule against it.
///
/// # References
///  - [Linux `clock_gettime(2)`](https://man7.org/linux/man-pages/man2/clock_gettime.2.html)
pub fn wall() -> Time {
    from_rustix(rustix::time::clock_gettime(rustix::time::ClockId::Realtime))
}

/// The kernel's `timespec` as a [`Time`]. The kernel never returns a negative or
/// unnormalised value for these clocks; if it somehow did, the epoch (or the end of
/// time) is a safer answer than a panic in a real-time path.
fn from_rustix(ts: rustix::time::Timespec) -> Time {
    // `tv_nsec` is `i64` here but `c_long` on some targets.
    #[allow(clippy::unnecessary_cast)]
    match Timespec::from_signed(ts.tv_sec, ts.tv_nsec as i64) {
        Ok(ts) => Time::from_timespec(ts).unwrap_or(Time::MAX),
        Err(_) => Time::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_does_not_go_backwards() {
        let a = now();
        let b = now();
        assert!(b >= a);
        assert!(a > Time::ZERO);
    }

    #[test]
    fn wall_is_after_2020() {
        assert!(wall() > Time::from_secs(1_577_836_800));
    }
}
