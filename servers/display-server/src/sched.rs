//! The server's time-critical threads ask the scheduler for a real-time class
//! themselves: the presenter (a paced frame's deadline) and the transports' threads
//! (a frame or a sync waits on them). Tactus draws its video through this server, so
//! video must be delivered under load without anyone raising the threads from outside.
//!
//! Every thread that serves clients asks, not only the shared-memory one: the
//! transports are compared with each other, and none is to win by its scheduling
//! class. The server process (`ictus display serve`, the experiment) has the
//! presenter alone ask ([`crate::Options::realtime_transports`] off): on one CPU a
//! real-time transport thread preempts its client at every wake-up, which costs the
//! shared-memory transport the flushes it gathers while the server is awake. The presenter asks one step higher than the transports, so that a flood of
//! requests does not delay a frame already due.
//!
//! Without the privilege (`CAP_SYS_NICE` or an `RLIMIT_RTPRIO`), the threads run in
//! the timesharing class: everything works, and the server says once, on standard
//! error, what was not granted and what that costs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;

use ictus_rt::thread::{configure_current_thread, Policy, RefusalKind, ThreadRequest};

/// The presenter's `SCHED_FIFO` priority: below the MIDI server's driver and server
/// threads (85, 80: audio is less tolerant of lateness than video), above the
/// transports.
pub const PRESENT_PRIORITY: u8 = 62;
/// The transports' threads' `SCHED_FIFO` priority.
pub const TRANSPORT_PRIORITY: u8 = 60;

/// What one of the server's threads asked of the scheduler and got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadScheduling {
    /// The thread's name, e.g. `ictus-display-present`.
    pub thread: &'static str,
    /// What it asked for (`None`: nothing, [`crate::Options::realtime`] is off, or
    /// [`crate::Options::realtime_transports`] for a transport's thread).
    pub asked: Option<Policy>,
    /// What it runs with, read back from the kernel.
    pub policy: Policy,
    /// Why a request was refused, in the kernel's words.
    pub refused: Option<String>,
}

impl ThreadScheduling {
    /// Whether the thread runs in the class it asked for.
    pub fn granted(&self) -> bool {
        self.asked.is_none() || self.refused.is_none()
    }
}

static COST_SAID: AtomicBool = AtomicBool::new(false);

/// What running without a real-time class costs, said once per process.
pub const COST: &str = "the display server's presenter and transport threads run in the timesharing class: \
     under load a paced frame or a sync can wait a scheduler slice (milliseconds) behind other programs, so video \
     can be shown late; grant CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 62 to avoid it";

/// Called first on each time-critical thread: ask for `SCHED_FIFO priority` (when
/// `realtime`), and report what was granted on `report`.
pub(crate) fn enter(thread: &'static str, realtime: bool, priority: u8, report: &Sender<ThreadScheduling>) {
    let asked = realtime.then_some(Policy::Fifo { priority });
    let (policy, refused) = if realtime {
        let granted = configure_current_thread(&ThreadRequest { policy: asked, ..ThreadRequest::default() });
        let refused = granted.refusal(RefusalKind::FixedPriority).map(ToString::to_string);
        if refused.is_some() && !COST_SAID.swap(true, Ordering::Relaxed) {
            eprintln!("ictus display: {COST}");
        }
        (granted.policy, refused)
    } else {
        (ictus_rt::thread::current_policy(), None)
    };
    let _ = report.send(ThreadScheduling { thread, asked, policy, refused });
}
