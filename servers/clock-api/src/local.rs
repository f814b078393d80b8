//! The clock's services in-process, for code that cannot afford an IPC hop.
//!
//! The same types as the server ([`Time`], [`When`], [`AlarmId`], [`AlarmMessage`]),
//! without a server:
//!
//! - [`read`]: `CLOCK_MONOTONIC` and `CLOCK_REALTIME`, as [`crate::Client::read`];
//! - [`sleep_until`] / [`sleep`]: `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)` on
//!   the calling thread, resumed after `EINTR` with the same absolute deadline;
//! - [`LocalAlarms`]: alarm messages to a port of a space, sent by a library timer
//!   thread that sleeps on a `timerfd` (`TFD_TIMER_ABSTIME`) for the queue's next
//!   deadline, with the server's [`AlarmQueue`], resolution and message format. An
//!   `eventfd` wakes it when an earlier alarm is set or it must stop.
//!
//! The timer thread is an ordinary thread of the caller's process: give it a priority
//! with the `setup` closure of [`LocalAlarms::with_setup`]. Alarms go to a port in the
//! caller's space; one whose port is dead when it comes due is dropped (and every other
//! alarm for that port with it), counted in [`LocalStats::dropped`]. There are no
//! dead-name notifications here: the process that set the alarm is the process that
//! holds the queue, so a `kill -9` takes both.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_ipc::{Name, RightKind, SendError, SendOptions, Space};
use ictus_rt::{clock, AlarmId, AlarmQueue, Time, When};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

use crate::protocol::{AlarmMessage, MAX_PENDING};
pub use crate::timer::{sleep_for, sleep_until};

/// The time since boot and the wall time, read together.
pub fn read() -> (Time, Time) {
    (clock::now(), clock::wall())
}

/// Sleep until `when` (relative: from now) on this thread; returns the time woken.
pub fn sleep(when: When) -> Time {
    sleep_until(when.resolve(clock::now()));
    clock::now()
}

/// Why a local alarm could not be set, or the timer thread started.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The port is not a send or receive right in the space.
    #[error("{0} is not a send or receive right in this space")]
    NotARight(Name),
    /// The queue is full.
    #[error("too many pending alarms ({MAX_PENDING})")]
    Full,
    /// The timer, the wake-up descriptor or the thread could not be made.
    #[error("starting the alarm thread: {0}")]
    Start(std::io::Error),
}

/// What [`LocalAlarms`] has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalStats {
    /// Pending alarms.
    pub pending: usize,
    /// Alarm messages sent.
    pub sent: u64,
    /// Alarms dropped (dead port, full queue).
    pub dropped: u64,
}

#[derive(Debug)]
struct Entry {
    port: Name,
    /// Whether we took a send-right reference (released when the alarm goes).
    referenced: bool,
    tag: u64,
    requested: Time,
}

#[derive(Debug)]
struct Table {
    queue: AlarmQueue<Entry>,
    sent: u64,
    dropped: u64,
}

#[derive(Debug)]
struct Inner {
    space: Space,
    table: Mutex<Table>,
    wake: OwnedFd,
    stop: AtomicBool,
}

impl Inner {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn kick(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn release(&self, e: &Entry) {
        if e.referenced {
            let _ = self.space.deallocate(e.port);
        }
    }

    fn fire(&self, now: Time) {
        let mut t = self.table();
        for (id, e) in t.queue.pop_due(now) {
            let msg = AlarmMessage { alarm: id.as_raw(), tag: e.tag, requested: e.requested, sent: clock::now() };
            let sent = self.space.send(e.port, &mut msg.to_message(), SendOptions { timeout: Some(Duration::ZERO) });
            self.release(&e);
            match sent {
                Ok(()) => t.sent += 1,
                Err(SendError::InvalidDest(_)) => {
                    t.dropped += 1;
                    let port = e.port;
                    for (_, other) in t.queue.remove_if(|o| o.port == port) {
                        self.release(&other);
                        t.dropped += 1;
                    }
                }
                Err(_) => t.dropped += 1,
            }
        }
    }

    fn run(&self) -> Result<(), Errno> {
        let mut timer = crate::timer::Timer::new()?;
        while !self.stop.load(Ordering::Acquire) {
            let next = self.table().queue.next_deadline();
            timer.arm(next)?;
            let (woken, fired) = {
                let mut fds =
                    [PollFd::new(&self.wake, PollFlags::IN), PollFd::from_borrowed_fd(timer.as_fd(), PollFlags::IN)];
                match poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(e),
                }
                (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
            };
            if woken {
                let mut buf = [0u8; 8];
                let _ = rustix::io::read(&self.wake, &mut buf);
            }
            if fired {
                timer.clear();
                self.fire(clock::now());
            }
        }
        Ok(())
    }
}

/// Alarm messages to ports of one space, from a timer thread of this process. Dropping
/// it stops the thread and forgets the pending alarms.
#[derive(Debug)]
pub struct LocalAlarms {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<Result<(), Errno>>>,
}

impl LocalAlarms {
    /// Start the timer thread, sending to ports of `space`.
    pub fn new(space: &Space) -> Result<LocalAlarms, LocalError> {
        LocalAlarms::with_setup(space, || {})
    }

    /// Start the timer thread, running `setup` on it first (to set its scheduling
    /// policy, for example).
    pub fn with_setup(space: &Space, setup: impl FnOnce() + Send + 'static) -> Result<LocalAlarms, LocalError> {
        let wake =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
                .map_err(|e| LocalError::Start(e.into()))?;
        let inner = Arc::new(Inner {
            space: space.clone(),
            table: Mutex::new(Table { queue: AlarmQueue::new(MAX_PENDING), sent: 0, dropped: 0 }),
            wake,
            stop: AtomicBool::new(false),
        });
        let thread_inner = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("ictus-local-alarms".into())
            .spawn(move || {
                setup();
                thread_inner.run()
            })
            .map_err(LocalError::Start)?;
        Ok(LocalAlarms { inner, thread: Some(thread) })
    }

    /// Send an [`AlarmMessage`] carrying `tag` to `port` (a send right, of which the
    /// queue takes a reference of its own, or a receive right of the space) at `when`
    /// (relative: from now). Returns its id and absolute requested time.
    pub fn set_alarm(&self, when: When, port: Name, tag: u64) -> Result<(AlarmId, Time), LocalError> {
        let kinds = self.inner.space.right_kinds(port).map_err(|_| LocalError::NotARight(port))?;
        let referenced = if kinds.contains(&RightKind::Send) {
            self.inner.space.mod_refs(port, RightKind::Send, 1).map_err(|_| LocalError::NotARight(port))?;
            true
        } else if kinds.contains(&RightKind::Receive) {
            false
        } else {
            return Err(LocalError::NotARight(port));
        };
        let at = when.resolve(clock::now());
        let entry = Entry { port, referenced, tag, requested: at };
        let (id, earliest) = {
            let mut t = self.inner.table();
            let before = t.queue.next_deadline();
            match t.queue.insert(at, entry) {
                Ok(id) => {
                    let earlier = match (before, t.queue.next_deadline()) {
                        (None, _) => true,
                        (Some(b), Some(n)) => n < b,
                        (Some(_), None) => false,
                    };
                    (id, earlier)
                }
                Err(e) => {
                    self.inner.release(&e.into_payload());
                    return Err(LocalError::Full);
                }
            }
        };
        if earliest {
            self.inner.kick();
        }
        Ok((id, at))
    }

    /// Cancel a pending alarm; false if it is not pending.
    pub fn cancel(&self, alarm: AlarmId) -> bool {
        let e = self.inner.table().queue.cancel(alarm);
        match e {
            Some(e) => {
                self.inner.release(&e);
                true
            }
            None => false,
        }
    }

    /// Set the resolution (zero: exact), as the control port does for the server.
    pub fn set_resolution(&self, resolution: Duration) {
        self.inner.table().queue.set_resolution(resolution);
        self.inner.kick();
    }

    /// The counters.
    pub fn stats(&self) -> LocalStats {
        let t = self.inner.table();
        LocalStats { pending: t.queue.len(), sent: t.sent, dropped: t.dropped }
    }
}

impl Drop for LocalAlarms {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.kick();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut t = self.inner.table();
        for (_, e) in t.queue.remove_if(|_| true) {
            self.inner.release(&e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_ipc::{ReceiveOptions, Received};

    const WATCHDOG: Duration = Duration::from_secs(30);

    fn receive_alarm(space: &Space, port: Name) -> AlarmMessage {
        let mut r = Received::new();
        space
            .receive(port, &mut r, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() })
            .expect("an alarm");
        AlarmMessage::parse(&r).expect("an alarm message")
    }

    #[test]
    fn alarms_arrive_in_order_and_cancel_works() {
        let space = Space::new();
        let port = space.allocate_port().unwrap();
        let alarms = LocalAlarms::new(&space).unwrap();
        let now = clock::now();
        let (late, _) = alarms.set_alarm(When::At(now + Duration::from_millis(30)), port, 2).unwrap();
        let (early, at) = alarms.set_alarm(When::After(Duration::from_millis(5)), port, 1).unwrap();
        let (cancelled, _) = alarms.set_alarm(When::After(Duration::from_millis(10)), port, 3).unwrap();
        assert!(alarms.cancel(cancelled));
        assert!(!alarms.cancel(cancelled));
        let first = receive_alarm(&space, port);
        assert_eq!((first.alarm, first.tag, first.requested), (early.as_raw(), 1, at));
        assert!(first.sent >= first.requested, "never early");
        let second = receive_alarm(&space, port);
        assert_eq!((second.alarm, second.tag), (late.as_raw(), 2));
        assert_eq!(alarms.stats(), LocalStats { pending: 0, sent: 2, dropped: 0 });
    }

    #[test]
    fn a_dead_port_drops_its_alarms() {
        let space = Space::new();
        let port = space.allocate_port_with_send().unwrap();
        let (send, _) = space.extract_right(&space, port, ictus_ipc::Disposition::MakeSend).unwrap();
        let alarms = LocalAlarms::new(&space).unwrap();
        alarms.set_alarm(When::After(Duration::from_millis(1)), send, 0).unwrap();
        alarms.set_alarm(When::After(Duration::from_secs(3600)), send, 0).unwrap();
        space.mod_refs(port, RightKind::Receive, -1).unwrap();
        let deadline = std::time::Instant::now() + WATCHDOG;
        while alarms.stats().pending != 0 {
            assert!(std::time::Instant::now() < deadline, "watchdog");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(alarms.stats().dropped, 2);
        assert!(matches!(
            alarms.set_alarm(When::After(Duration::ZERO), Name::new(999, 1), 0),
            Err(LocalError::NotARight(_))
        ));
    }

    #[test]
    fn local_sleep_is_never_early() {
        let target = clock::now() + Duration::from_millis(1);
        assert!(sleep(When::At(target)) >= target);
        let (boot, wall) = read();
        assert!(boot > Time::ZERO && wall > boot);
    }
}
