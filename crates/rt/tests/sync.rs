//! The priority-inheriting mutex and its condition variable: exclusion under
//! contention (the kernel path), waits and notifications, and the inheritance itself.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ictus_rt::sync::{PiCondvar, PiMutex};
use ictus_rt::thread::{configure_current_thread, current_affinity, rt_privileges, Policy, ThreadRequest};

/// Long enough for anything here on a loaded machine; reaching it is a failure.
const WATCHDOG: Duration = Duration::from_secs(60);

#[test]
fn contended_increments_are_never_lost() {
    let m = Arc::new(PiMutex::new(0u64));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    let mut g = m.lock();
                    let v = *g;
                    if i % 1000 == 0 {
                        // Hold it across a yield now and then, so others queue in the kernel.
                        std::thread::yield_now();
                    }
                    *g = v + 1;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*m.lock(), 80_000);
    let m = Arc::try_unwrap(m).unwrap();
    assert_eq!(m.into_inner(), 80_000);
}

#[test]
fn try_lock_fails_while_another_thread_holds_it() {
    let m = Arc::new(PiMutex::new(()));
    let g = m.lock();
    let other = Arc::clone(&m);
    assert!(std::thread::spawn(move || other.try_lock().is_none()).join().unwrap());
    drop(g);
    let other = Arc::clone(&m);
    assert!(std::thread::spawn(move || other.try_lock().is_some()).join().unwrap());
}

#[test]
fn a_panic_while_holding_it_unlocks_it() {
    let m = Arc::new(PiMutex::new(1u32));
    let other = Arc::clone(&m);
    let r = std::thread::spawn(move || {
        let mut g = other.lock();
        *g = 2;
        panic!("while holding the lock");
    })
    .join();
    assert!(r.is_err());
    assert_eq!(*m.lock(), 2);
}

/// Two threads taking turns through two condition variables: the one whose `parity`
/// the turn has advances it and notifies the other (`notify_one` on one side,
/// `notify_all` on the other, so both are used).
type Turns = (PiMutex<u64>, [PiCondvar; 2]);

fn take_turns(shared: &Turns, parity: u64, n: u64, started: Instant) {
    let (m, cvs) = shared;
    let mut g = m.lock();
    while *g < n {
        if *g % 2 == parity {
            *g += 1;
            let other = &cvs[1 - parity as usize];
            if parity == 0 {
                other.notify_all();
            } else {
                other.notify_one();
            }
        } else {
            g = cvs[parity as usize].wait_timeout(g, Duration::from_secs(1));
            assert!(started.elapsed() < WATCHDOG, "stuck at turn {}", *g);
        }
    }
}

#[test]
fn waiters_see_every_notified_change() {
    // A ping-pong of 2000 turns: a lost wake-up would hang it (the watchdog turns that
    // into a failure).
    let shared: Arc<Turns> = Arc::new((PiMutex::new(0), [PiCondvar::new(), PiCondvar::new()]));
    let n = 2000u64;
    let started = Instant::now();
    let other = Arc::clone(&shared);
    let odd = std::thread::spawn(move || take_turns(&other, 1, n, started));
    take_turns(&shared, 0, n, started);
    odd.join().unwrap();
    assert_eq!(*shared.0.lock(), n);
}

#[test]
fn a_wait_with_a_timeout_ends_without_a_notification() {
    let m = PiMutex::new(7u8);
    let cv = PiCondvar::new();
    let g = cv.wait_timeout(m.lock(), Duration::from_millis(5));
    assert_eq!(*g, 7);
    drop(g);
    assert!(m.try_lock().is_some(), "the mutex is held again after the wait and free after the guard");
}

/// The paper's inversion, on one CPU: a timesharing thread L holds the lock; a
/// `SCHED_FIFO` 50 thread M spins; a `SCHED_FIFO` 70 thread H wants the lock. Without
/// inheritance L never runs while M spins, so H gets the lock only after M is done.
/// With it, L runs at H's priority until it unlocks, and H gets the lock while M is
/// still spinning. M spins at most 800 ms (under the kernel's real-time throttling,
/// 950 ms a second, which would otherwise let L run and hide a missing inheritance).
#[test]
fn the_owner_runs_at_the_priority_of_a_real_time_waiter() {
    if !rt_privileges() {
        eprintln!("skipped: SCHED_FIFO is not granted here (the inheritance needs a real-time waiter)");
        return;
    }
    let cpu = current_affinity().unwrap()[0];
    let on =
        move |policy: Policy| ThreadRequest { policy: Some(policy), cpus: Some(vec![cpu]), ..ThreadRequest::default() };
    let m = Arc::new(PiMutex::new(()));
    let h_locking = Arc::new(AtomicBool::new(false));
    let m_done = Arc::new(AtomicBool::new(false));
    let m_spun_ms = Arc::new(AtomicU64::new(0));
    let held = Arc::new(Barrier::new(2));
    let go = Arc::new(Barrier::new(3));

    let low = {
        let (m, h_locking, held) = (Arc::clone(&m), Arc::clone(&h_locking), Arc::clone(&held));
        std::thread::spawn(move || {
            configure_current_thread(&on(Policy::Other { nice: 0 }));
            let g = m.lock();
            held.wait();
            let started = Instant::now();
            while !h_locking.load(Ordering::Acquire) {
                assert!(started.elapsed() < WATCHDOG, "H never came for the lock");
                std::hint::spin_loop();
            }
            drop(g);
        })
    };
    held.wait();
    let medium = {
        let (go, m_done, m_spun_ms) = (Arc::clone(&go), Arc::clone(&m_done), Arc::clone(&m_spun_ms));
        std::thread::spawn(move || {
            let g = configure_current_thread(&on(Policy::Fifo { priority: 50 }));
            assert!(g.refused.is_empty(), "{}", g.describe());
            go.wait();
            let started = Instant::now();
            // Spin until H has the lock (it sets `m_done`), for 800 ms at most.
            while started.elapsed() < Duration::from_millis(800) && !m_done.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            m_spun_ms.store(started.elapsed().as_millis() as u64, Ordering::Release);
            m_done.store(true, Ordering::Release);
        })
    };
    let high = {
        let (go, m, h_locking, m_done) = (Arc::clone(&go), Arc::clone(&m), Arc::clone(&h_locking), Arc::clone(&m_done));
        std::thread::spawn(move || {
            let g = configure_current_thread(&on(Policy::Fifo { priority: 70 }));
            assert!(g.refused.is_empty(), "{}", g.describe());
            go.wait();
            h_locking.store(true, Ordering::Release);
            let g = m.lock();
            // Whether M had finished spinning when the lock came.
            let after_m = m_done.swap(true, Ordering::AcqRel);
            drop(g);
            after_m
        })
    };
    go.wait();
    let after_m = high.join().unwrap();
    medium.join().unwrap();
    low.join().unwrap();
    assert!(
        !after_m,
        "H got the lock only after M had spun for {} ms: the owner did not inherit H's priority",
        m_spun_ms.load(Ordering::Acquire)
    );
}

/// The state letter of thread `tid` of this process (`R`, `S`, …) from `/proc`.
fn thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// In a child made by `fork` from a thread that had used a mutex, the lock still names
/// the right owner: the child's main thread locks, a second thread blocks on it in the
/// kernel, and the unlock hands it over. (A thread id cached from before the fork would
/// put the parent's thread id in the word, and the kernel would refuse the unlock.)
#[test]
fn a_forked_child_locks_with_its_own_thread_id() {
    let warm = PiMutex::new(());
    drop(warm.lock());
    // SAFETY: the child only locks, spawns a thread and reads /proc before `_exit`;
    // glibc keeps malloc usable in a child of a threaded parent.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let m = Arc::new(PiMutex::new(0u32));
            let g = m.lock();
            let (tx, rx) = std::sync::mpsc::channel();
            let other = Arc::clone(&m);
            let t = std::thread::spawn(move || {
                tx.send(rustix::thread::gettid().as_raw_nonzero().get()).unwrap();
                *other.lock() += 1;
            });
            let tid = rx.recv().unwrap();
            let started = Instant::now();
            while thread_state(tid) != Some('S') {
                assert!(started.elapsed() < WATCHDOG, "the second thread never blocked");
                std::thread::yield_now();
            }
            drop(g);
            t.join().unwrap();
            assert_eq!(*m.lock(), 1);
        })
        .is_ok();
        // SAFETY: ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let started = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if started.elapsed() > WATCHDOG {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the forked child hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child failed: status {status:#x}");
}
