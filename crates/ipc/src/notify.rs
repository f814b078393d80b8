//! Notifications: requests (`Space::request_notification`), the messages that carry
//! them (dead-name, no-senders, port-destroyed, send-once, with Mach's ids), and the
//! notifier, one thread per space, started on the first request, that turns the
//! kernel's hang-up reports into them.
//!
//! A send right is a socket whose peer is the port's receive end; when the receive
//! right is destroyed (or its task dies, even by `kill -9`) the kernel marks every
//! send end hung up. A port's main receive end hangs up when the last send right to it
//! is closed anywhere. The notifier waits for those hang-ups in one epoll.

use std::collections::HashMap;
use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use ictus_abi::{Datagram, Descriptor, Head, Name, NotifyId, ReplyKind, HEAD_MAX};

use crate::error::RightsError;
use crate::message::PortArg;
use crate::port::{ChannelKey, ConnKind, NotifyTarget, Packed, RecvPort};
use crate::space::{Inner, Space};
use crate::sys::{self, Interest, SendOutcome};
use crate::table::{Entry, PortEntry};

/// Which notification to request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotifyKind {
    /// When the port named by a send or send-once right dies.
    DeadName,
    /// When no send rights remain for a port whose receive right is named.
    NoSenders,
    /// When the named receive right is destroyed: the notification carries it instead.
    PortDestroyed,
}

impl Space {
    /// Ask for a notification about `name`, to be sent through the right `notify`
    /// (`mach_port_request_notification`). `notify` is usually a send-once right made
    /// from a port of this task. `None` cancels the request.
    ///
    /// A notification is an ordinary message whose id is a [`NotifyId`] and whose
    /// in-line data names the right it concerns; its sender is the task that asked for
    /// it, which is how a receiver tells it from a forgery.
    pub fn request_notification(
        &self,
        name: Name,
        kind: NotifyKind,
        notify: Option<PortArg>,
    ) -> Result<(), RightsError> {
        let target = match notify {
            None => None,
            Some(arg) => Some(self.notify_target(arg)?),
        };
        match kind {
            NotifyKind::DeadName => {
                let mut t = self.table();
                self.inner.reap_if_dead(&mut t, name);
                let fd = match t.get(name)? {
                    Entry::Port(PortEntry { send: Some(s), .. }) => s.fd.clone(),
                    Entry::SendOnce(so) => so.fd.clone(),
                    Entry::Dead(_) if target.is_none() => {
                        drop(t);
                        if let Some(n) = self.inner.notifier.get() {
                            n.cancel_dead_name(name);
                        }
                        return Ok(());
                    }
                    Entry::Dead(_) => {
                        // Already dead: notify at once, as Mach does.
                        if let Entry::Dead(n) = t.get_mut(name)? {
                            *n = n.saturating_add(1);
                        }
                        drop(t);
                        if let Some(target) = target {
                            self.inner.notify(&target, NotifyId::DeadName, name, 0);
                        }
                        return Ok(());
                    }
                    _ => return Err(RightsError::InvalidRight(name)),
                };
                drop(t);
                let notifier = self.inner.notifier(&self.inner)?;
                notifier.cancel_dead_name(name);
                if let Some(target) = target {
                    notifier.watch_dead_name(name, fd, target)?;
                }
                Ok(())
            }
            NotifyKind::NoSenders => {
                let port = self.receive_port(name)?;
                match target {
                    Some(target) => self.inner.arm_no_senders(self, &port, target),
                    None => {
                        let notifier = self.inner.notifier(&self.inner)?;
                        let mut st = port.lock();
                        for w in st.ns_watches.drain(..) {
                            notifier.cancel(w);
                        }
                        st.no_senders = None;
                        st.ns_watcher = None;
                        Ok(())
                    }
                }
            }
            NotifyKind::PortDestroyed => {
                let port = self.receive_port(name)?;
                port.lock().port_destroyed = target;
                Ok(())
            }
        }
    }

    /// Run `hook` on this space's notifier thread once `fd`, a connection end, hangs up:
    /// its peer end is closed everywhere, by its task's death too (`kill -9`
    /// included). For parts built beside the nucleus (the real-time ports watch their
    /// clients' connections this way, as a port watches its kept call channels). The
    /// hook runs once, must not wait for long, and must not call back into the watch
    /// API. Until the watch fires or is cancelled, the notifier holds `fd` open.
    pub fn watch_hang_up(
        &self,
        fd: Arc<OwnedFd>,
        hook: impl FnOnce() + Send + 'static,
    ) -> Result<HangUpWatch, RightsError> {
        let notifier = self.inner.notifier(&self.inner)?;
        Ok(HangUpWatch(notifier.watch(Watch::Hook { fd, hook: Box::new(hook) })?))
    }

    /// Cancel a watch of [`Space::watch_hang_up`] that has not fired: its hook is
    /// dropped unrun and the notifier lets go of the descriptor.
    pub fn cancel_hang_up(&self, watch: HangUpWatch) {
        if let Some(n) = self.inner.notifier.get() {
            n.cancel(watch.0);
        }
    }

    fn notify_target(&self, arg: PortArg) -> Result<NotifyTarget, RightsError> {
        let (entry, _) = self.extract(arg.name, arg.disposition)?;
        match entry {
            Entry::Port(PortEntry { send: Some(s), .. }) => Ok(NotifyTarget { fd: s.fd }),
            Entry::SendOnce(so) => Ok(NotifyTarget { fd: so.fd }),
            _ => Err(RightsError::InvalidRight(arg.name)),
        }
    }
}

impl Inner {
    /// Arm a no-senders request on `port`, held in `space`, replacing any: the port lets
    /// go of its send source, so that from now on the kernel tells when the last send
    /// right anywhere is gone, and the notifier watches every connection that reaches
    /// the port like a send right. Fires at once if none is left.
    pub(crate) fn arm_no_senders(
        &self,
        space: &Space,
        port: &Arc<RecvPort>,
        target: NotifyTarget,
    ) -> Result<(), RightsError> {
        let notifier = self.notifier(&space.inner)?;
        {
            let mut st = port.lock();
            for w in st.ns_watches.drain(..) {
                notifier.cancel(w);
            }
            st.send_source = None;
            st.no_senders = Some(target);
            st.ns_watcher = Some(notifier.watcher());
            let mains: Vec<Arc<OwnedFd>> =
                st.conns.iter().filter(|c| c.kind != ConnKind::Once).map(|c| c.fd.clone()).collect();
            for fd in mains {
                let w = notifier.watch_no_senders(port, fd)?;
                st.ns_watches.push(w);
            }
        }
        self.check_no_senders(port);
        Ok(())
    }

    /// Send a small message built here (notifications), waiting at most a second.
    fn send_raw(&self, dest: &OwnedFd, id: i32, body: &[u8], descs: &[Descriptor], fds: &[BorrowedFd<'_>]) -> bool {
        let mut head = [0u8; HEAD_MAX];
        let Ok((_, n)) = Datagram::encode_head(Head::new(id, ReplyKind::None), descs, body.len(), 0, &mut head) else {
            return false;
        };
        let bufs = [IoSlice::new(&head[..n]), IoSlice::new(body)];
        let deadline = Some(Instant::now() + std::time::Duration::from_secs(1));
        matches!(sys::send(dest.as_fd(), &bufs, fds, deadline), Ok(SendOutcome::Sent))
    }

    pub(crate) fn notify(&self, target: &NotifyTarget, id: NotifyId, name: Name, count: u32) {
        self.send_raw(&target.fd, id.id(), &NotifyId::body(name, count), &[], &[]);
    }

    /// Send the no-senders notification if it is armed and no send right remains.
    pub(crate) fn check_no_senders(&self, p: &Arc<RecvPort>) {
        let fire = {
            let mut st = p.lock();
            if st.no_senders.is_some() && !st.dead && st.no_senders_now() {
                let watches: Vec<u64> = st.ns_watches.drain(..).collect();
                st.ns_watcher = None;
                Some((st.no_senders.take().expect("checked"), st.mscount, watches))
            } else {
                None
            }
        };
        if let Some((target, mscount, watches)) = fire {
            if let Some(n) = self.notifier.get() {
                for w in watches {
                    n.cancel(w);
                }
            }
            self.notify(&target, NotifyId::NoSenders, p.name(), mscount);
        }
    }

    /// Called by the notifier when a watched send right's port died.
    pub(crate) fn dead_name_event(&self, name: Name, fd: &Arc<OwnedFd>, target: NotifyTarget) {
        let notify = {
            let mut t = self.table();
            if self.make_dead(&mut t, name, fd) {
                if let Ok(Entry::Dead(n)) = t.get_mut(name) {
                    // The notification carries a dead-name reference, as in Mach.
                    *n = n.saturating_add(1);
                }
                true
            } else {
                false
            }
        };
        if notify {
            self.notify(&target, NotifyId::DeadName, name, 0);
        }
    }

    /// The port-destroyed notification: the destroyed receive right (`packed`) handed
    /// on to `target`. Whether it went; if not, the caller destroys the right.
    pub(crate) fn notify_port_destroyed(&self, target: &NotifyTarget, name: Name, packed: &Packed) -> bool {
        let fds: Vec<BorrowedFd<'_>> = packed.fds.iter().map(|f| f.as_fd()).collect();
        self.send_raw(
            &target.fd,
            NotifyId::PortDestroyed.id(),
            &NotifyId::body(name, 0),
            &[Descriptor::Receive(packed.info)],
            &fds,
        )
    }
}

/// A watch made with [`Space::watch_hang_up`], to cancel it with
/// [`Space::cancel_hang_up`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct HangUpWatch(u64);

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
    /// A hang-up another part asked to hear of ([`Space::watch_hang_up`]).
    Hook {
        fd: Arc<OwnedFd>,
        hook: Box<dyn FnOnce() + Send>,
    },
}

impl Watch {
    fn fd(&self) -> &Arc<OwnedFd> {
        match self {
            Watch::DeadName { fd, .. }
            | Watch::NoSenders { fd, .. }
            | Watch::Channel { fd, .. }
            | Watch::Hook { fd, .. } => fd,
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
        let ep = sys::epoll()?;
        let wake = sys::eventfd()?;
        sys::epoll_add(ep.as_fd(), wake.as_fd(), WAKE, Interest::Readable)?;
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
            sys::epoll_delete(self.shared.ep.as_fd(), w.registered());
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
        sys::eventfd_signal(self.shared.wake.as_fd());
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
        let add = |fd: BorrowedFd<'_>| sys::epoll_add(shared.ep.as_fd(), fd, id, Interest::HangUpOnce);
        let dup = match add(w.fd().as_fd()) {
            Ok(()) => None,
            Err(rustix::io::Errno::EXIST) => {
                let d = sys::dup(w.fd().as_fd())?;
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
    let mut events = sys::Events::with_capacity(16);
    loop {
        if events.wait(shared.ep.as_fd()).is_err() {
            return;
        }
        for id in events.data() {
            if id == WAKE {
                return;
            }
            let w = shared.with_watches(|w| w.remove(id));
            let Some(w) = w else { continue };
            sys::epoll_delete(shared.ep.as_fd(), w.registered());
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
                Watch::Hook { hook, .. } => hook(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A hook runs once its connection hangs up; a cancelled one never runs, and the
    /// notifier lets go of the descriptor either way.
    #[test]
    fn hang_up_hooks_run_once_or_are_cancelled() {
        let space = Space::new();
        let (a, b) = sys::connection().expect("connection");
        let a = Arc::new(a);
        let (tx, rx) = mpsc::channel();
        space.watch_hang_up(a.clone(), move || tx.send(()).expect("send")).expect("watch");
        assert!(rx.try_recv().is_err());
        drop(b);
        rx.recv_timeout(Duration::from_secs(60)).expect("the hook ran");
        let until = Instant::now() + Duration::from_secs(60);
        while Arc::strong_count(&a) > 1 {
            assert!(Instant::now() < until, "the notifier kept the descriptor");
            std::thread::sleep(Duration::from_millis(1));
        }

        let (c, d) = sys::connection().expect("connection");
        let c = Arc::new(c);
        let (tx, rx) = mpsc::channel();
        let w = space.watch_hang_up(c.clone(), move || tx.send(()).expect("send")).expect("watch");
        space.cancel_hang_up(w);
        assert_eq!(Arc::strong_count(&c), 1);
        drop(d);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "a cancelled hook ran");
    }
}
