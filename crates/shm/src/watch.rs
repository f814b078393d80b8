//! The link watcher: one thread per process, started with the first channel, that
//! turns a link's hang-up into a futex wake-up.
//!
//! A side blocked in `FUTEX_WAIT` (or `futex_waitv`) learns nothing from the kernel
//! when its peer dies: only a wake-up or a timeout ends the wait. So every link is
//! also registered here; when the kernel reports it hung up (the peer closed it or
//! died, even by `kill -9`) or readable (a cut-off notice), the watcher raises the
//! channel's `fired` flag, rings the doorbell the waiting side sleeps on and wakes it.
//! The flag is raised before the bell is rung, so a waiter that read the bell before
//! the ring returns from its wait, and one that read it after sees the flag.
//! This is the nucleus's notifier (`crates/ipc/src/notify.rs`) in shared-memory form.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rustix::event::epoll;

use crate::segment::Segment;
use crate::{sys, wake};

struct Entry {
    seg: Arc<Segment>,
    bell: usize,
    fired: Arc<AtomicBool>,
}

struct Watcher {
    ep: OwnedFd,
    entries: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
}

static WATCHER: OnceLock<Result<Watcher, rustix::io::Errno>> = OnceLock::new();

fn watcher() -> Result<&'static Watcher, rustix::io::Errno> {
    WATCHER
        .get_or_init(|| {
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            std::thread::Builder::new()
                .name("ictus-shm-watcher".into())
                .spawn(run)
                .map_err(|_| rustix::io::Errno::AGAIN)?;
            Ok(Watcher { ep, entries: Mutex::new(HashMap::new()), next: AtomicU64::new(1) })
        })
        .as_ref()
        .map_err(|e| *e)
}

fn run() {
    // Wait for the cell to be filled (we were spawned from inside its initializer).
    let w = loop {
        match WATCHER.get() {
            Some(Ok(w)) => break w,
            Some(Err(_)) => return,
            None => std::thread::yield_now(),
        }
    };
    let mut events = Vec::with_capacity(32);
    loop {
        events.clear();
        match epoll::wait(&w.ep, rustix::buffer::spare_capacity(&mut events), None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
        for ev in &events {
            let e = w.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(&ev.data.u64());
            if let Some(e) = e {
                e.fired.store(true, Ordering::SeqCst);
                let bell = e.seg.word32(e.bell);
                wake::ring(bell);
                let _ = sys::futex_wake(bell);
            }
        }
    }
}

/// Start the process's link watcher now (the first channel starts it anyway): for
/// tests that count a process's descriptors, since it keeps one epoll for good.
pub fn start_watcher() -> Result<(), rustix::io::Errno> {
    watcher().map(|_| ())
}

/// A link under watch; dropping it stops the watch. (The epoll forgets the link by
/// itself when the link's last descriptor is closed.)
#[derive(Debug)]
pub(crate) struct Watch {
    id: u64,
}

/// Watch `link`: when it hangs up or becomes readable, raise `fired` and ring the
/// doorbell at offset `bell` of `seg`. One shot.
pub(crate) fn watch(
    link: BorrowedFd<'_>,
    seg: Arc<Segment>,
    bell: usize,
    fired: Arc<AtomicBool>,
) -> Result<Watch, rustix::io::Errno> {
    let w = watcher()?;
    let id = w.next.fetch_add(1, Ordering::Relaxed);
    w.entries.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Entry { seg, bell, fired });
    let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT;
    if let Err(e) = epoll::add(&w.ep, link, epoll::EventData::new_u64(id), flags) {
        w.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        return Err(e);
    }
    Ok(Watch { id })
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(w) = watcher() {
            w.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
        }
    }
}
