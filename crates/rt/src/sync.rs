//! A priority-inheriting mutex and its condition variable, for locks that real-time
//! threads share with threads of lower priority.
//!
//! The paper's MIDI library met priority inversion in its thread package's locks
//! (000 §5): a low-priority thread holding a lock that a real-time thread needs is
//! preempted by a medium-priority one, and the real-time thread waits for that. Linux
//! solves it in the kernel: a PI futex (`FUTEX_LOCK_PI`) holds its owner's thread id,
//! and while a thread waits in the kernel, the owner runs at the waiter's priority
//! (the kernel's `rt_mutex` chain). [`PiMutex`] is that word: an uncontended lock and
//! unlock are one compare-and-swap each, as for `std::sync::Mutex`; only contention
//! enters the kernel, which then boosts the owner and hands the lock to its
//! highest-priority waiter on unlock.
//!
//! [`PiCondvar`] is a sequence counter waited on with `FUTEX_WAIT`: a waiter reads the
//! counter while it holds the mutex, unlocks, and sleeps only if no notification has
//! changed the counter since; the kernel queues futex waiters by priority, so
//! `notify_one` wakes the most urgent. (`FUTEX_WAIT_REQUEUE_PI` would move a woken
//! waiter straight onto the mutex; a woken waiter simply locks it again here, which is
//! simpler and, with the few waiters of a library's threads, as good.)
//!
//! *Rejected:* `std::sync::Mutex` (a plain futex, no inheritance); a `pthread_mutex_t`
//! with `PTHREAD_PRIO_INHERIT` (the same futex underneath, but a C object that must not
//! move, behind `unsafe` at every use, and glibc's condition variables for it are not
//! priority-ordered).

// A lock is where `unsafe` belongs: the guard hands out the data behind the word.
#![allow(unsafe_code)]

use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rustix::io::Errno;
use rustix::thread::futex;

thread_local! {
    /// The calling thread's id, read once.
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// The calling thread's kernel id (what a PI futex word holds), read once per thread.
/// A child made by `fork` starts with a copy of the forking thread's cache but a new
/// id, so the first read registers a handler that clears the cache in the child.
fn current_tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            static AT_FORK: std::sync::Once = std::sync::Once::new();
            AT_FORK.call_once(|| {
                extern "C" fn forget_tid() {
                    TID.with(|t| t.set(0));
                }
                // SAFETY: registers a handler that only writes this thread's
                // thread-local cell, which is safe to do in a freshly forked child.
                unsafe {
                    libc::pthread_atfork(None, None, Some(forget_tid));
                }
            });
            t.set(rustix::thread::gettid().as_raw_nonzero().get() as u32);
        }
        t.get()
    })
}

/// A mutual-exclusion lock whose owner inherits the priority of the threads waiting
/// for it (a process-private PI futex). Not poisoned by a panic: the guard unlocks as
/// it unwinds, and the data is what the panicking thread left.
pub struct PiMutex<T> {
    /// 0 when free; otherwise the owner's thread id, with the kernel's `WAITERS` bit
    /// while threads wait in the kernel.
    word: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: the lock gives one thread at a time access to `data`, as `std::sync::Mutex`.
unsafe impl<T: Send> Send for PiMutex<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for PiMutex<T> {}

impl<T> PiMutex<T> {
    /// A free mutex holding `value`.
    pub const fn new(value: T) -> PiMutex<T> {
        PiMutex { word: AtomicU32::new(0), data: UnsafeCell::new(value) }
    }

    /// Lock it, waiting as long as it takes; while this thread waits, the owner runs at
    /// its priority if that is higher. Locking a mutex this thread already holds is a
    /// bug and panics (the kernel answers `EDEADLK`).
    pub fn lock(&self) -> PiMutexGuard<'_, T> {
        let tid = current_tid();
        if self.word.compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed).is_err() {
            loop {
                match futex::lock_pi(&self.word, futex::Flags::PRIVATE, None) {
                    Ok(()) => break,
                    Err(Errno::INTR | Errno::AGAIN) => continue,
                    Err(e) => panic!("PiMutex::lock: FUTEX_LOCK_PI failed: {e}"),
                }
            }
        }
        PiMutexGuard { mutex: self, _not_send: PhantomData }
    }

    /// Lock it if it is free.
    pub fn try_lock(&self) -> Option<PiMutexGuard<'_, T>> {
        let tid = current_tid();
        // Not `then_some`: a guard made eagerly and dropped would unlock.
        match self.word.compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => Some(PiMutexGuard { mutex: self, _not_send: PhantomData }),
            Err(_) => None,
        }
    }

    /// The data, taking the mutex apart.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }

    fn unlock(&self) {
        let tid = current_tid();
        if self.word.compare_exchange(tid, 0, Ordering::Release, Ordering::Relaxed).is_err() {
            // Waiters: the kernel hands the lock to the most urgent one and ends the
            // boost it gave this thread.
            if let Err(e) = futex::unlock_pi(&self.word, futex::Flags::PRIVATE) {
                panic!("PiMutex::unlock: FUTEX_UNLOCK_PI failed: {e}");
            }
        }
    }
}

impl<T> fmt::Debug for PiMutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PiMutex")
            .field("owner", &(self.word.load(Ordering::Relaxed) & !(futex::WAITERS | futex::OWNER_DIED)))
            .finish()
    }
}

/// The lock held; unlocks when dropped. Not `Send`: the thread that locked must
/// unlock (the word holds its id).
pub struct PiMutexGuard<'a, T> {
    mutex: &'a PiMutex<T>,
    _not_send: PhantomData<*const ()>,
}

impl<T> Deref for PiMutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no other thread touches the data.
        unsafe { &*self.mutex.data.get() }
    }
}

impl<T> DerefMut for PiMutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and the guard is borrowed mutably.
        unsafe { &mut *self.mutex.data.get() }
    }
}

impl<T: fmt::Debug> fmt::Debug for PiMutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T> Drop for PiMutexGuard<'_, T> {
    fn drop(&mut self) {
        self.mutex.unlock();
    }
}

/// A condition variable for [`PiMutex`]: wait until notified, with the mutex released
/// meanwhile. Waits may end without a notification; callers re-check their condition
/// in a loop, as with `std::sync::Condvar`.
#[derive(Debug, Default)]
pub struct PiCondvar {
    /// Changed by every notification.
    seq: AtomicU32,
}

impl PiCondvar {
    /// A condition variable nobody waits on.
    pub const fn new() -> PiCondvar {
        PiCondvar { seq: AtomicU32::new(0) }
    }

    /// Release the mutex, sleep until notified, lock it again.
    pub fn wait<'a, T>(&self, guard: PiMutexGuard<'a, T>) -> PiMutexGuard<'a, T> {
        self.wait_inner(guard, None)
    }

    /// As [`PiCondvar::wait`], for at most `timeout`.
    pub fn wait_timeout<'a, T>(&self, guard: PiMutexGuard<'a, T>, timeout: Duration) -> PiMutexGuard<'a, T> {
        self.wait_inner(guard, Some(timeout))
    }

    fn wait_inner<'a, T>(&self, guard: PiMutexGuard<'a, T>, timeout: Option<Duration>) -> PiMutexGuard<'a, T> {
        // Read while the mutex is held: a notification after our caller checked its
        // condition changes the counter, and the wait below returns at once.
        let seq = self.seq.load(Ordering::Acquire);
        let mutex = guard.mutex;
        drop(guard);
        let ts = timeout.map(|d| rustix::time::Timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        // EAGAIN (notified meanwhile), EINTR and ETIMEDOUT all end the wait.
        let _ = futex::wait(&self.seq, futex::Flags::PRIVATE, seq, ts.as_ref());
        mutex.lock()
    }

    /// Wake the most urgent waiter (the kernel orders futex waiters by priority).
    pub fn notify_one(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        let _ = futex::wake(&self.seq, futex::Flags::PRIVATE, 1);
    }

    /// Wake every waiter.
    pub fn notify_all(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        let _ = futex::wake(&self.seq, futex::Flags::PRIVATE, i32::MAX as u32);
    }
}
