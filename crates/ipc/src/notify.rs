//! The notifier: one thread per space, started on the first request, that turns the
//! kernel's hang-up reports into notification messages.
//!
//! A send right is a socket whose peer is the port's receive end; when the receive
//! right is destroyed (or its task dies, even by `kill -9`) the kernel marks every
//! send end hung up. A port's main receive end hangs up when the last send right to it
//! is closed anywhere. The notifier waits for those hang-ups in one epoll.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ictus_abi::Name;
use rustix::event::{epoll, eventfd, EventfdFlags};

use crate::port::{ChannelKey, NotifyTarget, RecvPort};
use crate::space::Inner;

enum Watch {
    DeadName {
        name: Name,
        fd: Arc<OwnedFd>,
        target: NotifyTarget,
    },
    NoSenders {
        port: Weak<RecvPort>,
        fd: Arc<OwnedFd>,
    },
    /// A call channel a port keeps: forgotten when the client's end hangs up.
    Channel {
        port: Weak<RecvPort>,
        key: ChannelKey,
        fd: Arc<OwnedFd>,
    },
}

impl Watch {
    fn fd(&self) -> &Arc<OwnedFd> {
        match self {
            Watch::DeadName { fd, .. } | Watch::NoSenders { fd, .. } | Watch::Channel { fd, .. } => fd,
        }
    }
}

struct Shared {
    ep: OwnedFd,
    wake: OwnedFd,
    watches: Mutex<Watches>,
    next: AtomicU64,
    /// Dead-name watches in `watches` (read without the lock, to skip the lookup).
    dead_names: std::sync::atomic::AtomicUsize,
}

/// The watches by id, and the dead-name ones by name too: a send-once right released by
/// every reply must not cost a walk over every watch (a server keeps one per client's
/// call channel).
#[derive(Default)]
struct Watches {
    by_id: HashMap<u64, Watched>,
    dead_names: HashMap<Name, Vec<u64>>,
}

/// A watch, and the duplicate descriptor it is registered under when its descriptor was
/// registered already: epoll keys on the descriptor, and one socket can be watched twice
/// (a call channel's reply right: by its port, and by a dead-name request).
struct Watched {
    watch: Watch,
    dup: Option<OwnedFd>,
}

impl Watched {
    fn registered(&self) -> BorrowedFd<'_> {
        match &self.dup {
            Some(d) => d.as_fd(),
            None => self.watch.fd().as_fd(),
        }
    }
}

impl Shared {
    /// Change the watches under their lock, keeping the dead-name count in step.
    fn with_watches<R>(&self, f: impl FnOnce(&mut Watches) -> R) -> R {
        let mut w = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut w);
        self.dead_names.store(w.dead_names.len(), Ordering::Relaxed);
        r
    }
}

impl Watches {
    fn insert(&mut self, id: u64, w: Watched) {
        if let Watch::DeadName { name, .. } = &w.watch {
            self.dead_names.entry(*name).or_default().push(id);
        }
        self.by_id.insert(id, w);
    }

    fn remove(&mut self, id: u64) -> Option<Watched> {
        let w = self.by_id.remove(&id)?;
        if let Watch::DeadName { name, .. } = &w.watch {
            if let Some(ids) = self.dead_names.get_mut(name) {
                ids.retain(|&i| i != id);
                if ids.is_empty() {
                    self.dead_names.remove(name);
                }
            }
        }
        Some(w)
    }
}

pub(crate) struct Notifier {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const WAKE: u64 = 0;

impl Notifier {
    pub(crate) fn start(space: Weak<Inner>) -> rustix::io::Result<Notifier> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(&ep, &wake, epoll::EventData::new_u64(WAKE), epoll::EventFlags::IN)?;
        let shared = Arc::new(Shared {
            ep,
            wake,
            watches: Mutex::new(Watches::default()),
            next: AtomicU64::new(1),
            dead_names: std::sync::atomic::AtomicUsize::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ictus-notifier".into())
            .spawn(move || run(s, space))
            .map_err(|_| rustix::io::Errno::AGAIN)?;
        Ok(Notifier { shared, thread: Some(thread) })
    }

    fn watch(&self, w: Watch) -> rustix::io::Result<u64> {
        watch(&self.shared, w)
    }

    /// A handle that can add no-senders watches, for a port to keep while its
    /// no-senders request is armed.
    pub(crate) fn watcher(&self) -> Watcher {
        Watcher(self.shared.clone())
    }

    pub(crate) fn watch_dead_name(
        &self,
        name: Name,
        fd: Arc<OwnedFd>,
        target: NotifyTarget,
    ) -> rustix::io::Result<u64> {
        self.watch(Watch::DeadName { name, fd, target })
    }

    pub(crate) fn watch_no_senders(&self, port: &Arc<RecvPort>, fd: Arc<OwnedFd>) -> rustix::io::Result<u64> {
        self.watch(Watch::NoSenders { port: Arc::downgrade(port), fd })
    }

    pub(crate) fn watch_channel(
        &self,
        port: &Arc<RecvPort>,
        key: ChannelKey,
        fd: Arc<OwnedFd>,
    ) -> rustix::io::Result<u64> {
        self.watch(Watch::Channel { port: Arc::downgrade(port), key, fd })
    }

    pub(crate) fn cancel(&self, id: u64) {
        let w = self.shared.with_watches(|w| w.remove(id));
        if let Some(w) = w {
            let _ = epoll::delete(&self.shared.ep, w.registered());
        }
    }

    /// Cancel any dead-name request on `name`. Its notify right is released, so a
    /// send-once notify right's port learns of it by a send-once notification.
    pub(crate) fn cancel_dead_name(&self, name: Name) {
        if self.shared.dead_names.load(Ordering::Relaxed) == 0 {
            return;
        }
        let ids: Vec<u64> = {
            let watches = self.shared.watches.lock().unwrap_or_else(|e| e.into_inner());
            match watches.dead_names.get(&name) {
                Some(ids) => ids.clone(),
                None => return,
            }
        };
        for id in ids {
            self.cancel(id);
        }
    }
}

impl Drop for Notifier {
    /// Stop the thread and wait for it, so that a dropped space has closed its
    /// descriptors when the drop returns (unless the space's last handle went on the
    /// notifier thread itself, which then ends on its own right after).
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.shared.wake, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

fn watch(shared: &Shared, w: Watch) -> rustix::io::Result<u64> {
    let id = shared.next.fetch_add(1, Ordering::Relaxed);
    // Registered and recorded under the lock, so that the notifier thread, woken at
    // once by a descriptor already hung up, finds the watch complete.
    shared.with_watches(|all| {
        // Hang-up is always reported; ask for nothing else.
        let add =
            |fd: BorrowedFd<'_>| epoll::add(&shared.ep, fd, epoll::EventData::new_u64(id), epoll::EventFlags::ONESHOT);
        let dup = match add(w.fd().as_fd()) {
            Ok(()) => None,
            Err(rustix::io::Errno::EXIST) => {
                let d = crate::sys::dup(w.fd().as_fd())?;
                add(d.as_fd())?;
                Some(d)
            }
            Err(e) => return Err(e),
        };
        all.insert(id, Watched { watch: w, dup });
        Ok(id)
    })
}

/// Adds no-senders watches on behalf of a port (see [`Notifier::watcher`]).
#[derive(Clone)]
pub(crate) struct Watcher(Arc<Shared>);

impl Watcher {
    pub(crate) fn watch_no_senders(&self, port: Weak<RecvPort>, fd: Arc<OwnedFd>) -> rustix::io::Result<u64> {
        watch(&self.0, Watch::NoSenders { port, fd })
    }
}

fn run(shared: Arc<Shared>, space: Weak<Inner>) {
    let mut events = Vec::with_capacity(16);
    loop {
        events.clear();
        match epoll::wait(&shared.ep, rustix::buffer::spare_capacity(&mut events), None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        for ev in &events {
            let id = ev.data.u64();
            if id == WAKE {
                return;
            }
            let w = shared.with_watches(|w| w.remove(id));
            let Some(w) = w else { continue };
            let _ = epoll::delete(&shared.ep, w.registered());
            let Some(inner) = space.upgrade() else { return };
            match w.watch {
                Watch::DeadName { name, fd, target } => inner.dead_name_event(name, &fd, target),
                Watch::NoSenders { port, .. } => {
                    if let Some(p) = port.upgrade() {
                        inner.check_no_senders(&p);
                    }
                }
                Watch::Channel { port, key, fd } => {
                    if let Some(p) = port.upgrade() {
                        inner.channel_hung_up(&p, key, &fd);
                    }
                }
            }
        }
    }
}
