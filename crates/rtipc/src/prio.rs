//! Priorities of threads: reading them, handing them off by thread id, and what a
//! thread inherits from the synchronous request it is serving.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use ictus_rt::thread::Policy;

use crate::attr::{Priority, MAX_PRIORITY};
use crate::sys;

static HANDOFF_REFUSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The native (associated) priority of a receiver thread, set at association.
    static NATIVE: Cell<Option<Priority>> = const { Cell::new(None) };
    /// The priority of the synchronous request this thread is serving, if any.
    static INHERITED: Cell<Option<Priority>> = const { Cell::new(None) };
}

/// The priority of a scheduling class: its fixed priority, 0 for timesharing, the top
/// for a deadline reservation (it preempts every fixed priority).
pub fn priority_of(policy: Policy) -> Priority {
    match policy {
        Policy::Fifo { priority } | Policy::RoundRobin { priority } => priority.min(MAX_PRIORITY),
        Policy::Other { .. } => 0,
        Policy::Deadline { .. } => MAX_PRIORITY,
    }
}

/// The policy a hand-off to `priority` gives a thread.
pub(crate) fn policy_for(priority: Priority) -> Policy {
    if priority == 0 {
        Policy::Other { nice: 0 }
    } else {
        Policy::Fifo { priority }
    }
}

/// The calling thread's native priority: its associated priority if it is a receiver,
/// its scheduling class's otherwise.
pub fn native_priority() -> Priority {
    NATIVE.with(Cell::get).unwrap_or_else(|| sys::thread_policy(0).map(priority_of).unwrap_or(0))
}

/// The priority a message sent now from this thread carries: in synchronous mode the
/// higher of the native priority and that of the synchronous request being served
/// (so it follows nested calls); in asynchronous mode the native priority (§3.4).
pub fn sending_priority(sync: bool, native: Priority) -> Priority {
    if sync {
        INHERITED.with(Cell::get).map_or(native, |p| p.max(native))
    } else {
        native
    }
}

pub(crate) fn set_native(p: Option<Priority>) {
    NATIVE.with(|c| c.set(p));
}

pub(crate) fn native_cached() -> Option<Priority> {
    NATIVE.with(Cell::get)
}

pub(crate) fn set_inherited(p: Option<Priority>) {
    INHERITED.with(|c| c.set(p));
}

/// Whether hand-off is still possible: false once the kernel refused a priority
/// change for lack of privilege (one warning is printed then).
pub fn handoff_available() -> bool {
    !HANDOFF_REFUSED.load(Ordering::Relaxed)
}

/// Sets thread `tid` to `priority`; returns whether it was done. A refusal for lack of
/// privilege turns hand-off off for the process, with one warning.
pub(crate) fn hand_off(tid: u32, priority: Priority) -> bool {
    if !handoff_available() {
        return false;
    }
    match sys::set_thread_policy(tid, policy_for(priority)) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            if !HANDOFF_REFUSED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "ictus-rtipc: warning: the kernel refused a real-time priority ({e}); priority hand-off is \
                     off for this process: real-time ports still queue by priority, but receivers keep their own \
                     priority (grant CAP_SYS_NICE or RLIMIT_RTPRIO to enable it)"
                );
            }
            false
        }
        Err(_) => false,
    }
}

/// Sets thread `tid` back to `policy` (a receiver's own class). Best effort.
pub(crate) fn restore(tid: u32, policy: Policy) -> bool {
    sys::set_thread_policy(tid, policy).is_ok()
}
