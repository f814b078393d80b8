//! A task's name space: the table from port names to rights, and the operations on
//! rights (Mach's `mach_port_*` calls).
//!
//! The verbs on messages live beside it, each in its own module: the send path
//! (`send`, with `plan`), calls (`call`, with the call-channel pool in `channel`), the
//! receive path (`receive`, which first checks what arrived in `incoming`), and
//! notifications (`notify`). `doc/ipc.md` describes the layout.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use ictus_abi::Name;

use crate::channel::{self, Pool};
use crate::error::{ReceiveError, RightsError};
use crate::message::{Credentials, Disposition, RightKind};
use crate::notify::Notifier;
use crate::port::{ConnKind, RecvPort, MAX_QLIMIT};
use crate::set::PortSet;
use crate::sys;
use crate::table::{Entry, PortEntry, SendOnce, SendRef, Table, UREFS_MAX};

/// A task's port name space.
///
/// A `Space` is what Mach calls a task's IPC space: the table from port names to the
/// rights this task holds. Cloning it gives another handle to the same space, for
/// other threads. Most programs use the process's own, [`Space::task`]; tests and
/// in-process servers may make more with [`Space::new`].
///
/// Rights are kernel objects (socket and memfd descriptors), so what a task may do is
/// enforced by Linux, not by this table: a name a task has not been given a right for
/// reaches nothing, whatever number it guesses.
#[derive(Clone)]
pub struct Space {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    table: Mutex<Table>,
    /// This space's call channels to other ports, idle between calls.
    pub(crate) pool: Pool,
    pub(crate) notifier: OnceLock<Notifier>,
    malformed: AtomicU64,
    too_large: AtomicU64,
    /// This task's credentials, the sender of notifications it makes itself.
    pub(crate) me: Credentials,
}

/// Attributes of a receive right (Mach's `mach_port_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortStatus {
    /// The sequence number the next message will get.
    pub seqno: u64,
    /// The make-send count.
    pub mscount: u32,
    /// The queue limit, in messages.
    pub qlimit: u32,
    /// Messages queued (Mach's `mps_msgcount`): those counted against the queue limit
    /// (a sender that has taken its place and is about to send counts already, as its
    /// message would in Mach), and messages waiting on send-once rights. Notifications
    /// and messages from senders that bypass the count are not in it.
    pub msgcount: u32,
    /// The most in-line bytes a message may carry (`Space::set_message_limit`).
    pub message_limit: u32,
    /// Outstanding send-once rights.
    pub sorights: u32,
    /// Connections currently reaching the port.
    pub connections: u32,
    /// Call channels the port keeps, one per client that has made calls to it; a
    /// client's channel stays after it hangs up until the requests it sent before are
    /// read.
    pub channels: u32,
    /// Of those, the channels of clients that hung up, kept while requests they sent
    /// before may still be unread.
    pub hung_up_channels: u32,
    /// Whether the port keeps a send source (false while a no-senders request is armed).
    pub has_send_source: bool,
}

/// Counters of a space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceStats {
    /// Names in use.
    pub names: usize,
    /// Malformed messages received and destroyed.
    pub malformed: u64,
    /// Messages refused unread because they were larger than their port takes.
    pub too_large: u64,
}

impl Default for Space {
    fn default() -> Self {
        Space::new()
    }
}

impl std::fmt::Debug for Space {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Space").field("stats", &self.stats()).finish()
    }
}

impl Space {
    /// A new, empty name space.
    pub fn new() -> Space {
        Space {
            inner: Arc::new(Inner {
                table: Mutex::new(Table::new()),
                pool: Pool::default(),
                notifier: OnceLock::new(),
                malformed: AtomicU64::new(0),
                too_large: AtomicU64::new(0),
                me: sys::own_credentials(),
            }),
        }
    }

    /// The process's own space (Mach's `mach_task_self()`), made on first use.
    pub fn task() -> Space {
        static TASK: OnceLock<Space> = OnceLock::new();
        TASK.get_or_init(Space::new).clone()
    }

    pub(crate) fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.table()
    }

    /// Start this space's notifier thread now instead of on first need. It turns the
    /// kernel's hang-ups into notifications and keeps a port's call channels tidy; a
    /// server starts it with its service port, so that its threads and descriptors
    /// stay the same from then on, whoever calls or dies.
    pub fn start_notifier(&self) -> Result<(), RightsError> {
        self.inner.notifier(&self.inner).map(|_| ())
    }

    /// Counters.
    pub fn stats(&self) -> SpaceStats {
        SpaceStats {
            names: self.table().len(),
            malformed: self.inner.malformed.load(Ordering::Relaxed),
            too_large: self.inner.too_large.load(Ordering::Relaxed),
        }
    }

    /// Every name in the space.
    pub fn names(&self) -> Vec<Name> {
        self.table().names()
    }

    // ----- allocation and rights ------------------------------------------------------

    /// Allocate a new port and return the name of its receive right
    /// (`mach_port_allocate(MACH_PORT_RIGHT_RECEIVE)`).
    pub fn allocate_port(&self) -> Result<Name, RightsError> {
        let port = RecvPort::new()?;
        let ident = port.lock().ident;
        self.table().insert_receive(port, ident)
    }

    /// Allocate an empty port set (`mach_port_allocate(MACH_PORT_RIGHT_PORT_SET)`).
    pub fn allocate_port_set(&self) -> Result<Name, RightsError> {
        let set = PortSet::new()?;
        self.table().alloc(Entry::Set(set))
    }

    /// Allocate a port, and a send right under the same name.
    pub fn allocate_port_with_send(&self) -> Result<Name, RightsError> {
        let name = self.allocate_port()?;
        self.insert_right(self, name, name, Disposition::MakeSend)?;
        Ok(name)
    }

    /// What rights a name denotes (`mach_port_type`). A send or send-once right whose
    /// port has died is reported, and from now on kept, as a dead name.
    pub fn right_kinds(&self, name: Name) -> Result<Vec<RightKind>, RightsError> {
        let mut t = self.table();
        self.inner.reap_if_dead(&mut t, name);
        Ok(match t.get(name)? {
            Entry::Port(p) => {
                let mut v = Vec::new();
                if p.recv.is_some() {
                    v.push(RightKind::Receive);
                }
                if p.send.is_some() {
                    v.push(RightKind::Send);
                }
                v
            }
            Entry::SendOnce(_) => vec![RightKind::SendOnce],
            Entry::Set(_) => vec![RightKind::PortSet],
            Entry::Dead(_) => vec![RightKind::DeadName],
        })
    }

    /// User references a name holds for a kind of right (`mach_port_get_refs`).
    pub fn refs(&self, name: Name, right: RightKind) -> Result<u32, RightsError> {
        let mut t = self.table();
        self.inner.reap_if_dead(&mut t, name);
        Ok(match (t.get(name)?, right) {
            (Entry::Port(p), RightKind::Send) => p.send.as_ref().map_or(0, |s| s.urefs),
            (Entry::Port(p), RightKind::Receive) => u32::from(p.recv.is_some()),
            (Entry::SendOnce(_), RightKind::SendOnce) => 1,
            (Entry::Set(_), RightKind::PortSet) => 1,
            (Entry::Dead(n), RightKind::DeadName) => *n,
            _ => 0,
        })
    }

    /// Add `delta` user references to a right (`mach_port_mod_refs`). Dropping a
    /// receive right's or port set's one reference destroys it.
    pub fn mod_refs(&self, name: Name, right: RightKind, delta: i32) -> Result<(), RightsError> {
        let mut dropped = Vec::new();
        let mut t = self.table();
        self.inner.reap_if_dead(&mut t, name);
        let entry = t.get_mut(name)?;
        let remove_name = match (entry, right) {
            (Entry::Port(p), RightKind::Send) => {
                let Some(s) = p.send.as_mut() else { return Err(RightsError::InvalidRight(name)) };
                let n = i64::from(s.urefs) + i64::from(delta);
                if n < 0 {
                    return Err(RightsError::InvalidValue);
                }
                if n > i64::from(UREFS_MAX) {
                    return Err(RightsError::UrefsOverflow(name));
                }
                s.urefs = n as u32;
                if n == 0 {
                    dropped.push(p.send.take());
                    self.inner.pool.forget(p.ident);
                    p.recv.is_none()
                } else {
                    false
                }
            }
            (Entry::Port(p), RightKind::Receive) => {
                if p.recv.is_none() || !(-1..=0).contains(&delta) {
                    return Err(if p.recv.is_none() {
                        RightsError::InvalidRight(name)
                    } else {
                        RightsError::InvalidValue
                    });
                }
                if delta == 0 {
                    return Ok(());
                }
                let port = p.recv.take().expect("checked");
                let empty = p.send.is_none();
                if empty {
                    t.remove(name)?;
                } else {
                    // The name now holds a send right only; keep it findable.
                }
                drop(t);
                self.inner.destroy_receive(port);
                return Ok(());
            }
            (Entry::SendOnce(_), RightKind::SendOnce) => match delta {
                0 => false,
                -1 => true,
                _ => return Err(RightsError::InvalidValue),
            },
            (Entry::Dead(n), RightKind::DeadName) => {
                let v = i64::from(*n) + i64::from(delta);
                if v < 0 {
                    return Err(RightsError::InvalidValue);
                }
                if v > i64::from(UREFS_MAX) {
                    return Err(RightsError::UrefsOverflow(name));
                }
                *n = v as u32;
                v == 0
            }
            (Entry::Set(_), RightKind::PortSet) => match delta {
                0 => false,
                -1 => true,
                _ => return Err(RightsError::InvalidValue),
            },
            _ => return Err(RightsError::InvalidRight(name)),
        };
        let send_gone = dropped.iter().any(Option::is_some);
        if remove_name {
            let e = t.remove(name)?;
            drop(t);
            self.inner.cancel_requests(name);
            self.inner.drop_entry(e);
        } else if send_gone {
            drop(t);
            self.inner.cancel_requests(name);
        }
        Ok(())
    }

    /// Release one user reference of a send right, a send-once right or a dead name
    /// (`mach_port_deallocate`).
    pub fn deallocate(&self, name: Name) -> Result<(), RightsError> {
        let kind = {
            let mut t = self.table();
            self.inner.reap_if_dead(&mut t, name);
            match t.get(name)? {
                Entry::Port(p) if p.send.is_some() => RightKind::Send,
                Entry::SendOnce(_) => RightKind::SendOnce,
                Entry::Dead(_) => RightKind::DeadName,
                _ => return Err(RightsError::InvalidRight(name)),
            }
        };
        self.mod_refs(name, kind, -1)
    }

    /// Destroy every right a name denotes (`mach_port_destroy`).
    pub fn destroy(&self, name: Name) -> Result<(), RightsError> {
        let e = self.table().remove(name)?;
        self.inner.cancel_requests(name);
        self.inner.drop_entry(e);
        Ok(())
    }

    /// Insert a right taken from this space (named `right`, taken by `disposition`)
    /// into `target` under the name `name` (`mach_port_insert_right`). With
    /// `target` this space and `name == right`, `MakeSend` gives a receive right a send
    /// right under its own name.
    pub fn insert_right(
        &self,
        target: &Space,
        name: Name,
        right: Name,
        disposition: Disposition,
    ) -> Result<(), RightsError> {
        let same = Arc::ptr_eq(&self.inner, &target.inner);
        if same && name == right && disposition == Disposition::MakeSend {
            let mut t = self.table();
            let Entry::Port(p) = t.get_mut(name)? else { return Err(RightsError::InvalidRight(name)) };
            let Some(port) = p.recv.clone() else { return Err(RightsError::InvalidRight(name)) };
            let (fd, ident, _) = {
                let mut st = port.lock();
                let r = st.send_end()?;
                st.mscount = st.mscount.wrapping_add(1);
                r
            };
            match &mut p.send {
                Some(s) => {
                    if s.urefs >= UREFS_MAX {
                        return Err(RightsError::UrefsOverflow(name));
                    }
                    s.urefs += 1;
                }
                None => {
                    p.send = Some(SendRef { fd, urefs: 1 });
                    if p.ident.is_none() {
                        t.set_ident(name, ident);
                    }
                }
            }
            return Ok(());
        }
        // Refuse before taking anything, so a refused insert leaves the source as it was.
        target.table().check_free(name)?;
        let (entry, _) = self.extract(right, disposition)?;
        if let Entry::Port(PortEntry { recv: Some(port), .. }) = &entry {
            port.name.store(name.0, Ordering::Relaxed);
        }
        target.table().alloc_at(name, entry)
    }

    /// Take a right out of `source` by `disposition` and give it a new name in this
    /// space (`mach_port_extract_right`). Returns the name and the kind received.
    pub fn extract_right(
        &self,
        source: &Space,
        name: Name,
        disposition: Disposition,
    ) -> Result<(Name, RightKind), RightsError> {
        let (entry, kind) = source.extract(name, disposition)?;
        let mut t = self.table();
        let new = match entry {
            Entry::Port(PortEntry { send: Some(s), recv: None, ident: Some(ident) }) => {
                let fd = Arc::try_unwrap(s.fd).or_else(|a| sys::dup(a.as_fd()))?;
                t.insert_send(fd, ident)?
            }
            Entry::Port(PortEntry { recv: Some(port), ident, .. }) => t.insert_receive(port, ident)?,
            other => t.alloc(other)?,
        };
        Ok((new, kind))
    }

    /// Take a right out of this space as an entry of its own (for insert/extract, and
    /// a notification request's notify right).
    pub(crate) fn extract(&self, name: Name, disposition: Disposition) -> Result<(Entry, RightKind), RightsError> {
        let mut t = self.table();
        self.inner.reap_if_dead(&mut t, name);
        let entry = t.get_mut(name)?;
        match (disposition, entry) {
            (Disposition::CopySend, Entry::Port(p)) => {
                let s = p.send.as_ref().ok_or(RightsError::InvalidRight(name))?;
                let e = Entry::Port(PortEntry {
                    send: Some(SendRef { fd: s.fd.clone(), urefs: 1 }),
                    recv: None,
                    ident: p.ident,
                });
                Ok((e, RightKind::Send))
            }
            (Disposition::MoveSend, Entry::Port(p)) => {
                let s = p.send.as_mut().ok_or(RightsError::InvalidRight(name))?;
                let fd = s.fd.clone();
                s.urefs -= 1;
                let ident = p.ident;
                if s.urefs == 0 {
                    p.send = None;
                    self.inner.pool.forget(ident);
                    self.inner.cancel_requests(name);
                    if p.recv.is_none() {
                        t.remove(name)?;
                    }
                }
                Ok((
                    Entry::Port(PortEntry { send: Some(SendRef { fd, urefs: 1 }), recv: None, ident }),
                    RightKind::Send,
                ))
            }
            (Disposition::MakeSend, Entry::Port(p)) => {
                let port = p.recv.clone().ok_or(RightsError::InvalidRight(name))?;
                let mut st = port.lock();
                let (fd, ident, _) = st.send_end()?;
                st.mscount = st.mscount.wrapping_add(1);
                Ok((
                    Entry::Port(PortEntry { send: Some(SendRef { fd, urefs: 1 }), recv: None, ident: Some(ident) }),
                    RightKind::Send,
                ))
            }
            (Disposition::MakeSendOnce, Entry::Port(p)) => {
                let port = p.recv.clone().ok_or(RightsError::InvalidRight(name))?;
                let (fd, _) = port.lock().send_once_end()?;
                Ok((Entry::SendOnce(SendOnce::plain(Arc::new(fd))), RightKind::SendOnce))
            }
            (Disposition::MoveSendOnce, Entry::SendOnce(_)) => Ok((t.remove(name)?, RightKind::SendOnce)),
            (Disposition::MoveReceive, Entry::Port(p)) => {
                let port = p.recv.take().ok_or(RightsError::InvalidRight(name))?;
                let ident = port.lock().ident;
                if p.send.is_none() {
                    t.remove(name)?;
                }
                let set = port.lock().set.as_ref().and_then(std::sync::Weak::upgrade);
                if let Some(set) = set {
                    set.remove(&port);
                }
                // Mach's rules for a moving receive right (`ipc_port_clear_receiver`).
                port.moved_within();
                Ok((Entry::Port(PortEntry { send: None, recv: Some(port), ident }), RightKind::Receive))
            }
            _ => Err(RightsError::InvalidRight(name)),
        }
    }

    // ----- port sets, attributes, descriptors -----------------------------------------

    /// Move a receive right into a port set, or out of any set with `Name::NULL`
    /// (`mach_port_move_member`).
    pub fn move_member(&self, member: Name, set: Name) -> Result<(), RightsError> {
        let (port, new_set) = {
            let t = self.table();
            let port = match t.get(member)? {
                Entry::Port(PortEntry { recv: Some(p), .. }) => p.clone(),
                _ => return Err(RightsError::InvalidRight(member)),
            };
            let new_set = if set == Name::NULL {
                None
            } else {
                match t.get(set)? {
                    Entry::Set(s) => Some(s.clone()),
                    _ => return Err(RightsError::InvalidRight(set)),
                }
            };
            (port, new_set)
        };
        let old = port.lock().set.as_ref().and_then(std::sync::Weak::upgrade);
        if let Some(old) = old {
            old.remove(&port);
        }
        if let Some(s) = new_set {
            s.add(&port)?;
        }
        Ok(())
    }

    /// The receive rights in a port set.
    pub fn set_members(&self, set: Name) -> Result<Vec<Name>, RightsError> {
        match self.table().get(set)? {
            Entry::Set(s) => Ok(s.member_names()),
            _ => Err(RightsError::InvalidRight(set)),
        }
    }

    /// A receive right's attributes.
    pub fn port_status(&self, name: Name) -> Result<PortStatus, RightsError> {
        let port = self.receive_port(name)?;
        let counted = port.counted();
        let st = port.lock();
        let once_waiting = st
            .conns
            .iter()
            .filter(|c| c.kind == ConnKind::Once)
            .filter(|c| ictus_sys::socket::inq_len(c.fd.as_fd()).is_ok_and(|n| n > 0))
            .count() as u32;
        Ok(PortStatus {
            seqno: port.seqno.load(Ordering::Relaxed),
            mscount: st.mscount,
            qlimit: st.qlimit,
            msgcount: counted.saturating_add(once_waiting),
            message_limit: port.limit.load(Ordering::Relaxed),
            sorights: st.conns.iter().filter(|c| c.kind == ConnKind::Once).count() as u32,
            connections: st.conns.len() as u32,
            channels: st.channels.len() as u32,
            hung_up_channels: st.channels.values().filter(|c| c.hung_up).count() as u32,
            has_send_source: st.send_source.is_some(),
        })
    }

    /// Set a receive right's queue limit, in messages (1..=65536;
    /// `mach_port_set_qlimit`). With `qlimit` messages queued, the next sender through a
    /// send right blocks until one is received, or fails at once if it asked not to
    /// wait; send-once rights are not held back (`doc/ipc.md`, *Queue limits*).
    pub fn set_qlimit(&self, name: Name, qlimit: u32) -> Result<(), RightsError> {
        if qlimit == 0 || qlimit > MAX_QLIMIT {
            return Err(RightsError::InvalidValue);
        }
        let port = self.receive_port(name)?;
        port.change_settings(|st| st.qlimit = qlimit)?;
        Ok(())
    }

    /// Set the most in-line bytes a message to this receive right may carry
    /// (`0..=1 GiB`; 1 GiB by default). A server sets what its protocol needs. Senders
    /// through send rights are refused a larger message before anything is sent
    /// (`SendError::TooLarge`); one that arrives anyway (a sender that bypasses the
    /// check, a send-once right) is destroyed unread and its caller, if it waits for a
    /// reply, told why (`ReceiveError::TooLarge`, Mach's `MACH_RCV_TOO_LARGE`).
    pub fn set_message_limit(&self, name: Name, bytes: u32) -> Result<(), RightsError> {
        if u64::from(bytes) > ictus_abi::BIG_INLINE_MAX {
            return Err(RightsError::InvalidValue);
        }
        let port = self.receive_port(name)?;
        port.limit.store(bytes, Ordering::Relaxed);
        port.change_settings(|_| {})?;
        Ok(())
    }

    /// Set the sequence number the next message will get (`mach_port_set_seqno`).
    pub fn set_seqno(&self, name: Name, seqno: u64) -> Result<(), RightsError> {
        self.receive_port(name)?.seqno.store(seqno, Ordering::Relaxed);
        Ok(())
    }

    /// A descriptor that is readable when a message is waiting on a receive right or
    /// port set, for `poll`, `epoll` or an async runtime. Receive with a zero timeout
    /// when it fires; another thread may have taken the message.
    pub fn pollable_fd(&self, name: Name) -> Result<OwnedFd, RightsError> {
        let fd = match self.table().get(name)? {
            Entry::Port(PortEntry { recv: Some(p), .. }) => {
                let ep = p.lock().ensure_epoll()?;
                sys::dup(ep.as_fd())?
            }
            Entry::Set(s) => sys::dup(s.ep.as_fd())?,
            _ => return Err(RightsError::InvalidRight(name)),
        };
        Ok(fd)
    }

    /// The receive right under `name`.
    pub(crate) fn receive_port(&self, name: Name) -> Result<Arc<RecvPort>, RightsError> {
        match self.table().get(name)? {
            Entry::Port(PortEntry { recv: Some(p), .. }) => Ok(p.clone()),
            _ => Err(RightsError::InvalidRight(name)),
        }
    }
}

impl Inner {
    pub(crate) fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn notifier(&self, me: &Arc<Inner>) -> Result<&Notifier, RightsError> {
        if let Some(n) = self.notifier.get() {
            return Ok(n);
        }
        let n = Notifier::start(Arc::downgrade(me))?;
        // If another thread won the race, ours is dropped and its thread ends.
        let _ = self.notifier.set(n);
        Ok(self.notifier.get().expect("set above"))
    }

    /// Count a malformed message, which was destroyed.
    pub(crate) fn count_malformed(&self, e: ReceiveError) -> ReceiveError {
        self.malformed.fetch_add(1, Ordering::Relaxed);
        e
    }

    /// Count a message refused because it was larger than its port takes.
    pub(crate) fn count_too_large(&self) {
        self.too_large.fetch_add(1, Ordering::Relaxed);
    }

    /// If the send or send-once right under `name` has lost its port, turn the name
    /// into a dead name.
    pub(crate) fn reap_if_dead(&self, t: &mut Table, name: Name) {
        let fd = match t.get(name) {
            Ok(Entry::Port(PortEntry { send: Some(s), recv: None, .. })) => s.fd.clone(),
            Ok(Entry::SendOnce(so)) => so.fd.clone(),
            _ => return,
        };
        if sys::hung_up(fd.as_fd()) {
            self.make_dead(t, name, &fd);
        }
    }

    /// Turn the send or send-once right `name` (if it still holds `fd`) into a dead name.
    pub(crate) fn make_dead(&self, t: &mut Table, name: Name, fd: &Arc<OwnedFd>) -> bool {
        let urefs = match t.get(name) {
            Ok(Entry::Port(PortEntry { send: Some(s), recv: None, .. })) if Arc::ptr_eq(&s.fd, fd) => s.urefs,
            Ok(Entry::SendOnce(so)) if Arc::ptr_eq(&so.fd, fd) => 1,
            Ok(Entry::Dead(_)) => return true,
            _ => return false,
        };
        if let Ok(Entry::Port(p)) = t.get(name) {
            self.pool.forget(p.ident);
        }
        t.forget_ident(name);
        if let Ok(e) = t.get_mut(name) {
            *e = Entry::Dead(urefs);
        }
        true
    }

    pub(crate) fn cancel_port_watches(&self, p: &RecvPort) {
        let watches: Vec<u64> = {
            let mut st = p.lock();
            let mut w: Vec<u64> = st.ns_watches.drain(..).collect();
            w.extend(st.channels.values_mut().filter_map(|c| c.watch.take()));
            w
        };
        if let Some(n) = self.notifier.get() {
            for w in watches {
                n.cancel(w);
            }
        }
    }

    /// Release what an entry held.
    pub(crate) fn drop_entry(&self, e: Entry) {
        match e {
            Entry::Port(PortEntry { recv, send, ident }) => {
                if send.is_some() {
                    self.pool.forget(ident);
                }
                if let Some(p) = recv {
                    self.destroy_receive(p);
                }
            }
            Entry::SendOnce(SendOnce { fd, channel: Some(_), pipe }) => {
                // A call channel's reply right destroyed unused: tell the caller, whose
                // channel stays open for its next call.
                channel::reply_unused(&fd, pipe.as_deref());
            }
            Entry::Set(s) => {
                let members: Vec<Arc<RecvPort>> = s
                    .members
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .filter_map(std::sync::Weak::upgrade)
                    .collect();
                for m in members {
                    s.remove(&m);
                }
            }
            _ => {}
        }
    }

    /// Destroy a receive right: unless a port-destroyed request hands it on, close
    /// every connection, so every sender's right becomes a dead name.
    pub(crate) fn destroy_receive(&self, p: Arc<RecvPort>) {
        let set = p.lock().set.as_ref().and_then(std::sync::Weak::upgrade);
        if let Some(set) = set {
            set.remove(&p);
        }
        self.cancel_port_watches(&p);
        let (target, packed) = {
            let mut st = p.lock();
            let target = st.port_destroyed.take();
            st.ns_watcher = None;
            if target.is_none() {
                // Shut the connections down while they are still in the port's epoll,
                // so that every thread waiting on the port wakes and finds it dead.
                st.dead = true;
                for c in &st.conns {
                    sys::shut_down(c.fd.as_fd());
                }
            }
            // A no-senders request travels with a right handed on, as in Mach; with a
            // right destroyed, its notify right goes too.
            let packed = st.pack(&p);
            (target, packed)
        };
        // Senders waiting for a place look again, and find the port gone.
        p.page.wake(u32::MAX);
        if let Some(target) = target {
            if self.notify_port_destroyed(&target, p.name(), &packed) {
                return;
            }
        }
        // Shut every connection down: threads blocked receiving on it wake (and find
        // the port dead), and senders see the hang-up at once, even while another
        // thread still holds a descriptor.
        for fd in &packed.fds {
            sys::shut_down(fd.as_fd());
        }
        drop(packed);
    }

    /// The right under `name` is gone: cancel its dead-name request. The request's
    /// notify right is released (Mach would send port-deleted; a send-once notify
    /// right's port gets a send-once notification instead).
    pub(crate) fn cancel_requests(&self, name: Name) {
        if let Some(n) = self.notifier.get() {
            n.cancel_dead_name(name);
        }
    }
}
