//! One-shot absolute timers on `CLOCK_MONOTONIC`, and sleeping until a time.
//!
//! [`Timer`] is a `timerfd` armed with `TFD_TIMER_ABSTIME`: it becomes readable at an
//! absolute time since boot, so it joins a `poll` beside the server's ports and needs
//! no thread of its own, and a late arming never drifts (the deadline is absolute, not
//! "now + interval"). [`sleep_until`] is `clock_nanosleep(CLOCK_MONOTONIC,
//! TIMER_ABSTIME)`, restarted after a signal with the same absolute deadline.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use ictus_rt::Time;
use rustix::io::Errno;
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};

/// A kernel `timespec` for an instant since boot. The kernel refuses a zero
/// `it_value` as "disarm", so the epoch itself becomes 1 ns (long past in any case).
fn kernel_timespec(t: Time) -> Timespec {
    let ts = t.max(Time::from_nanos(1)).to_timespec();
    // Seconds of a u64 nanosecond count fit an i64 (at most 1.8e10).
    Timespec { tv_sec: ts.secs() as i64, tv_nsec: i64::from(ts.nanos()) }
}

/// A one-shot timer on `CLOCK_MONOTONIC` at absolute times: a pollable descriptor.
#[derive(Debug)]
pub struct Timer {
    fd: OwnedFd,
    armed: Option<Time>,
}

impl Timer {
    /// A disarmed timer (`timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)`).
    ///
    /// # References
    ///  - [Linux `timerfd_create(2)`](https://man7.org/linux/man-pages/man2/timerfd_create.2.html)
    pub fn new() -> Result<Timer, Errno> {
        let fd =
            rustix::time::timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?;
        Ok(Timer { fd, armed: None })
    }

    /// Fire at `at` (since boot), or never (`None`). Does nothing if already armed for
    /// that time. A time already past fires at once.
    pub fn arm(&mut self, at: Option<Time>) -> Result<(), Errno> {
        if at == self.armed {
            return Ok(());
        }
        let value = match at {
            Some(t) => kernel_timespec(t),
            None => Timespec { tv_sec: 0, tv_nsec: 0 },
        };
        let spec = Itimerspec { it_interval: Timespec { tv_sec: 0, tv_nsec: 0 }, it_value: value };
        rustix::time::timerfd_settime(&self.fd, TimerfdTimerFlags::ABSTIME, &spec)?;
        self.armed = at;
        Ok(())
    }

    /// The time it is armed for.
    pub fn armed(&self) -> Option<Time> {
        self.armed
    }

    /// Consume an expiry, if there is one (never blocks). After this the timer is
    /// disarmed until [`Timer::arm`] is called again.
    pub fn clear(&mut self) {
        let mut buf = [0u8; 8];
        // EAGAIN: it had not fired (a spurious wake-up); nothing to consume.
        let _ = rustix::io::read(&self.fd, &mut buf);
        if let Some(t) = self.armed {
            if t <= ictus_rt::clock::now() {
                self.armed = None;
            }
        }
    }

    /// The descriptor, for `poll`.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Sleep until `deadline` (since boot): `clock_nanosleep(CLOCK_MONOTONIC,
/// TIMER_ABSTIME)`, resumed with the same deadline when a signal interrupts it, so the
/// wake-up never drifts. Returns at once if the deadline has passed.
///
/// # References
///  - [Linux `clock_nanosleep(2)`](https://man7.org/linux/man-pages/man2/clock_nanosleep.2.html)
pub fn sleep_until(deadline: Time) {
    let ts = kernel_timespec(deadline);
    loop {
        match rustix::thread::clock_nanosleep_absolute(rustix::thread::ClockId::Monotonic, &ts) {
            Err(Errno::INTR) => continue,
            // Ok, or an error that cannot happen for a valid absolute CLOCK_MONOTONIC time
            // (EINVAL/EFAULT): do not spin.
            _ => return,
        }
    }
}

/// Sleep for `d`, measured from now, on the same absolute clock ([`sleep_until`]).
pub fn sleep_for(d: Duration) {
    sleep_until(ictus_rt::clock::now().saturating_add(d));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_past_deadline_fires_at_once_and_never_is_disarmed() {
        let mut t = Timer::new().unwrap();
        assert_eq!(t.armed(), None);
        t.arm(Some(Time::ZERO)).unwrap();
        let mut fds = [rustix::event::PollFd::new(&t.fd, rustix::event::PollFlags::IN)];
        // A generous watchdog only: a past deadline is readable at once.
        let n = rustix::event::poll(&mut fds, Some(&Timespec { tv_sec: 30, tv_nsec: 0 })).unwrap();
        assert_eq!(n, 1);
        t.clear();
        assert_eq!(t.armed(), None);
        t.arm(Some(Time::MAX)).unwrap();
        assert_eq!(t.armed(), Some(Time::MAX));
        t.arm(None).unwrap();
        assert_eq!(t.armed(), None);
    }

    #[test]
    fn sleep_until_is_never_early() {
        let target = ictus_rt::clock::now() + Duration::from_millis(2);
        sleep_until(target);
        assert!(ictus_rt::clock::now() >= target);
        sleep_until(Time::ZERO); // the past: returns at once
        sleep_for(Duration::ZERO);
    }
}
