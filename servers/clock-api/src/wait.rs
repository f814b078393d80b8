//! Waiting for an alarm whose time the receiver knows: sleep on the port until the
//! time, then poll it, then block (`doc/clock.md`, *Waiting for an alarm*).
//!
//! An alarm through the clock server is two wake-ups where an in-process sleep is one:
//! the server's timer, then the receiver, woken by the message. The second is the
//! costly one on a virtual machine: the receiver usually sleeps on the other CPU, and
//! waking it is an interprocessor interrupt through the hypervisor (tens of
//! microseconds when that CPU is halted). A receiver that knows when its alarm is due
//! (`Client::set_alarm` returns the time) can instead be awake when the message comes:
//! it waits on the port with a kernel timer of its own (`ppoll` on the port's pollable
//! descriptor, armed on its own CPU, exactly as an in-process sleep is), and from the
//! alarm's time it polls the port without sleeping, for at most [`AlarmWait::spin`],
//! before it blocks as any receiver does. The message is still the clock server's,
//! sent when the alarm is due, received from the port like any other: nothing of the
//! alarm's meaning changes, only how its receiver waits.

use std::cell::Cell;
use std::os::fd::OwnedFd;
use std::time::Duration;

use ictus_ipc::{Name, ReceiveError, ReceiveOptions, Received, RightsError, Space};
use ictus_rt::{clock, Time};

/// How an [`AlarmReceiver`] waits near an alarm's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlarmWait {
    /// Start polling this long before the alarm's time (zero: at the time).
    pub lead: Duration,
    /// Poll at most this long past the alarm's time, then block. Zero: never poll
    /// (block on the port as a plain receive does).
    pub spin: Duration,
}

impl AlarmWait {
    /// Poll from 50 µs before the alarm's time for up to 500 µs after it. The clock
    /// server wakes ahead too and sends within a few microseconds of the time
    /// (`doc/clock.md`, *The server wakes ahead*), so a receiver awake 50 µs early
    /// (about its own median wake-up lateness) takes the message as it comes, and one
    /// that wakes late finds it waiting. What it costs per alarm is those 50 µs and
    /// the server's lateness, at most 550 µs (5.5 % of a CPU at 100 Hz) when the server
    /// is that late. 200 µs of polling, the first choice, sat at the server's own p99
    /// under CPU load: the 2.5 % of alarms sent later fell to a blocking receive.
    pub const DEFAULT: AlarmWait = AlarmWait { lead: Duration::from_micros(50), spin: Duration::from_micros(500) };

    /// Never poll: block on the port until the message wakes us.
    pub const BLOCK: AlarmWait = AlarmWait { lead: Duration::ZERO, spin: Duration::ZERO };
}

impl Default for AlarmWait {
    fn default() -> Self {
        AlarmWait::DEFAULT
    }
}

/// How an [`AlarmReceiver`]'s messages came.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlarmWaitStats {
    /// Before the time it polled from (the message woke the receiver).
    pub early: u64,
    /// Already there when the receiver's own timer woke it, at or after the time it was
    /// to poll from: the receiver woke later than the message came (its own wake-up was
    /// the late one), and took it at once.
    pub on_waking: u64,
    /// While it polled.
    pub polled: u64,
    /// In the blocking receive after polling (or without polling).
    pub blocked: u64,
}

/// Receives from a port whose next message is expected at a known time (an alarm).
#[derive(Debug)]
pub struct AlarmReceiver {
    space: Space,
    port: Name,
    pollable: OwnedFd,
    wait: AlarmWait,
    stats: Cell<AlarmWaitStats>,
}

impl AlarmReceiver {
    /// For the receive right (or port set) `port` of `space`.
    pub fn new(space: &Space, port: Name, wait: AlarmWait) -> Result<AlarmReceiver, RightsError> {
        let pollable = space.pollable_fd(port)?;
        Ok(AlarmReceiver { space: space.clone(), port, pollable, wait, stats: Cell::new(AlarmWaitStats::default()) })
    }

    /// How the messages received so far came.
    pub fn stats(&self) -> AlarmWaitStats {
        self.stats.get()
    }

    fn count(&self, f: impl FnOnce(&mut AlarmWaitStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Receive the next message, expected at `due`; give up after `timeout` (from now;
    /// `None`: never). A message that comes earlier is received at once; one due
    /// later than `due + spin` is waited for as a plain receive would.
    pub fn receive(&self, due: Time, into: &mut Received, timeout: Option<Duration>) -> Result<(), ReceiveError> {
        let start = clock::now();
        let give_up = timeout.map(|t| start.saturating_add(t));
        let left = |now: Time| give_up.map(|g| g.saturating_duration_since(now));
        if self.wait.spin > Duration::ZERO {
            let from = due.saturating_sub(self.wait.lead);
            let wake = give_up.map_or(from, |g| g.min(from));
            // Until then, wait on the port with our own timer: a message that comes
            // early wakes us as it would a plain receive.
            let now = clock::now();
            let early = wake > now && self.readable_within(wake.saturating_duration_since(now));
            if early && clock::now() >= from {
                // Readable, but we woke at or after the time: the message was there when
                // our own timer's wake-up came (late). Take it now; not a blocked wait.
                let got = self.space.receive(
                    self.port,
                    into,
                    ReceiveOptions { timeout: Some(Duration::ZERO), ..ReceiveOptions::default() },
                );
                if !matches!(got, Err(ReceiveError::TimedOut)) {
                    self.count(|s| s.on_waking += 1);
                    return got;
                }
            }
            if !early {
                // Polling: each look is one non-blocking receive.
                let stop = due.saturating_add(self.wait.spin);
                let now_only = ReceiveOptions { timeout: Some(Duration::ZERO), ..ReceiveOptions::default() };
                loop {
                    match self.space.receive(self.port, into, now_only) {
                        Err(ReceiveError::TimedOut) => {}
                        other => {
                            self.count(|s| s.polled += 1);
                            return other;
                        }
                    }
                    let now = clock::now();
                    if now >= stop || give_up.is_some_and(|g| now >= g) {
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
        }
        let opts = ReceiveOptions { timeout: left(clock::now()), ..ReceiveOptions::default() };
        let before = clock::now();
        let got = self.space.receive(self.port, into, opts);
        if got.is_ok() {
            let early = self.wait.spin > Duration::ZERO && before < due.saturating_sub(self.wait.lead);
            self.count(|s| if early { s.early += 1 } else { s.blocked += 1 });
        }
        got
    }

    /// Whether the port became readable within `d` (`ppoll`: an `hrtimer` on this
    /// thread's CPU, with this thread's timer slack).
    fn readable_within(&self, d: Duration) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let ts = Timespec { tv_sec: d.as_secs() as i64, tv_nsec: i64::from(d.subsec_nanos()) };
        let mut fds = [PollFd::new(&self.pollable, PollFlags::IN)];
        // Interrupted or refused: say readable, so the caller receives (and blocks) as a
        // plain receive would; never a late look.
        poll(&mut fds, Some(&ts)).map_or(true, |n| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_ipc::{Message, SendOptions};

    fn port() -> (Space, Name) {
        let space = Space::new();
        let port = space.allocate_port().expect("port");
        (space, port)
    }

    fn send(space: &Space, port: Name, id: i32) {
        space.send(port, &mut Message::new(id, b"x".to_vec()), SendOptions::default()).expect("send");
    }

    #[test]
    fn a_message_that_came_early_is_received_without_waiting_for_the_time() {
        let (space, port) = port();
        send(&space, port, 7);
        let r = AlarmReceiver::new(&space, port, AlarmWait::DEFAULT).expect("receiver");
        let mut m = Received::new();
        // Due an hour from now: only the message can end this wait (the watchdog is the
        // test's time-out, not an assertion on how long it took).
        let due = clock::now() + Duration::from_secs(3600);
        r.receive(due, &mut m, Some(Duration::from_secs(60))).expect("received");
        assert_eq!(m.id, 7);
        assert_eq!(r.stats(), AlarmWaitStats { early: 1, on_waking: 0, polled: 0, blocked: 0 });
    }

    #[test]
    fn messages_at_or_after_their_time_are_all_received_in_order_whatever_the_wait() {
        for wait in [
            AlarmWait::DEFAULT,
            AlarmWait::BLOCK,
            AlarmWait { lead: Duration::from_micros(50), spin: Duration::from_micros(1) },
        ] {
            let (space, port) = port();
            let r = AlarmReceiver::new(&space, port, wait).expect("receiver");
            let start = clock::now();
            let at = move |k: u32| start + Duration::from_millis(2) * k;
            let sender = {
                let space = space.clone();
                std::thread::spawn(move || {
                    for k in 1..=20u32 {
                        crate::timer::sleep_until(at(k));
                        send(&space, port, k as i32);
                    }
                })
            };
            let mut m = Received::new();
            for k in 1..=20u32 {
                r.receive(at(k), &mut m, Some(Duration::from_secs(60))).expect("received");
                assert_eq!(m.id, k as i32, "{wait:?}");
            }
            sender.join().expect("sender");
            let s = r.stats();
            assert_eq!(s.early + s.on_waking + s.polled + s.blocked, 20, "{wait:?}: {s:?}");
            if wait == AlarmWait::BLOCK {
                assert_eq!((s.early, s.on_waking, s.polled), (0, 0, 0), "never polls: {s:?}");
            }
        }
    }

    #[test]
    fn nothing_sent_is_a_time_out_and_a_dead_port_an_error() {
        let (space, port) = port();
        let r = AlarmReceiver::new(&space, port, AlarmWait::DEFAULT).expect("receiver");
        let mut m = Received::new();
        let due = clock::now();
        assert!(matches!(r.receive(due, &mut m, Some(Duration::from_millis(20))), Err(ReceiveError::TimedOut)));
        let due = clock::now() + Duration::from_secs(3600);
        assert!(matches!(r.receive(due, &mut m, Some(Duration::from_millis(20))), Err(ReceiveError::TimedOut)));
        space.destroy(port).expect("destroy");
        assert!(r.receive(clock::now(), &mut m, Some(Duration::from_secs(60))).is_err());
        assert!(AlarmReceiver::new(&space, port, AlarmWait::DEFAULT).is_err(), "no right: refused");
    }
}
