//! A task's name space, and every operation done through it: rights, messages,
//! notifications.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use ictus_abi::{
    Datagram, Descriptor, Head, Name, NotifyId, PipeMessage, ReplyKind, DESCRIPTOR_LEN, HEADER_LEN, HEAD_MAX,
    INLINE_DATAGRAM_MAX, PIPE_MESSAGE_MAX,
};

/// Heads of messages with up to four descriptors are built on the stack.
const SMALL_HEAD: usize = HEADER_LEN + 4 * DESCRIPTOR_LEN;
use rustix::event::epoll;

use crate::error::{CallError, ReceiveError, RightsError, SendError};
use crate::message::{
    Credentials, Disposition, Message, PortArg, ReceiveOptions, Received, ReceivedRight, RightKind, SendOptions,
};
use crate::notify::Notifier;
use crate::ool::OolRegion;
use crate::port::{Channel, ChannelKey, ConnKind, Ident, KeyHash, NotifyTarget, RecvPort, DOORBELL, MAX_QLIMIT};
use crate::set::PortSet;
use crate::sys::{self, RecvOutcome, SendOutcome};
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
    /// Call channels to other ports, by the port's identity, ready for the next call.
    channels: Mutex<std::collections::HashMap<Ident, Vec<Pooled>, KeyHash>>,
    notifier: OnceLock<Notifier>,
    malformed: AtomicU64,
    /// Bumped whenever this space forgets its channels to a port, so that a call that
    /// was under way meanwhile does not put its channel back in the pool.
    forgotten: AtomicU64,
    me: Credentials,
}

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

/// Attributes of a receive right (Mach's `mach_port_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortStatus {
    /// The sequence number the next message will get.
    pub seqno: u64,
    /// The make-send count.
    pub mscount: u32,
    /// The queue limit, in messages.
    pub qlimit: u32,
    /// Outstanding send-once rights.
    pub sorights: u32,
    /// Connections currently reaching the port.
    pub connections: u32,
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
}

/// A call channel of this space's, idle between calls: the end replies arrive on, and
/// the token the port knows it by.
struct Pooled {
    fd: OwnedFd,
    token: u32,
    /// The receive time-out set on `fd` (`None`: none).
    timer: Option<std::time::Duration>,
    /// The read end of the channel's reply pipe, until the port lets go of its write end.
    pipe: Option<OwnedFd>,
    /// Who sent the last reply on `fd`, as the kernel said: the sender a reply on the
    /// pipe is credited to (only the port's holder has the pipe's write end).
    replier: Option<Credentials>,
}

/// What a send resolved, to carry out or undo.
#[derive(Default)]
struct Plan {
    fds: Vec<Arc<OwnedFd>>,
    owned: Vec<OwnedFd>,
    /// Which list each descriptor's file descriptors come from, in wire order.
    order: Vec<FdRef>,
    descriptors: Vec<Descriptor>,
    reply: Option<ReplyKind>,
    /// The call channel token the header carries.
    token: u32,
    /// Whether the message answers on a call channel the port keeps.
    kept: bool,
    undo: Vec<Undo>,
    commit: Vec<Commit>,
}

/// Where a plain send goes: a shared send end, or a send-once right's entry, taken out
/// of the table while it is used.
enum Plain {
    Shared(Arc<OwnedFd>),
    Once(Entry),
}

/// The reply right a call supplies itself.
enum CallReply {
    None,
    /// A send-once right made for this call alone.
    Once(OwnedFd),
    /// A new call channel offered to the server, with its reply pipe's write end (if
    /// one could be made) and its token.
    Channel(OwnedFd, Option<OwnedFd>, u32),
    /// Answer on the call channel the server keeps under this token.
    OnChannel(u32),
}

#[derive(Clone, Copy)]
enum FdRef {
    Shared(usize),
    Owned(usize),
}

enum Undo {
    Restore(Name, Entry),
    RemoveConn(Arc<RecvPort>, u64),
    /// Put a packed receive right back, and back in the port set it left.
    Unpack(Arc<RecvPort>, crate::port::Packed, Option<Arc<PortSet>>),
}

enum Commit {
    Release(Name),
    DropSendUref(Name),
    MadeSend(Arc<RecvPort>),
    /// The receive right left; its call channels' watches (ids) go with it.
    Moved(Arc<RecvPort>, Vec<u64>),
    /// A call channel's reply right left for another task: the port stops keeping the
    /// channel, so the reply's new holder is the only one that can write to it.
    ForgetChannel(std::sync::Weak<RecvPort>, ChannelKey, Arc<OwnedFd>),
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

fn malformed(reason: impl std::fmt::Display, sender: Option<Credentials>) -> ReceiveError {
    ReceiveError::Malformed { reason: reason.to_string(), sender }
}

impl Space {
    /// A new, empty name space.
    pub fn new() -> Space {
        Space {
            inner: Arc::new(Inner {
                table: Mutex::new(Table::new()),
                channels: Mutex::new(std::collections::HashMap::default()),
                notifier: OnceLock::new(),
                malformed: AtomicU64::new(0),
                forgotten: AtomicU64::new(0),
                me: Credentials {
                    pid: rustix::process::getpid().as_raw_nonzero().get() as u32,
                    uid: rustix::process::geteuid().as_raw(),
                    gid: rustix::process::getegid().as_raw(),
                },
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
        SpaceStats { names: self.table().len(), malformed: self.inner.malformed.load(Ordering::Relaxed) }
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
                    self.inner.forget_channels(p.ident);
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

    /// Take a right out of this space as an entry of its own (for insert/extract).
    fn extract(&self, name: Name, disposition: Disposition) -> Result<(Entry, RightKind), RightsError> {
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
                    self.inner.forget_channels(ident);
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
        let st = port.lock();
        Ok(PortStatus {
            seqno: port.seqno.load(Ordering::Relaxed),
            mscount: st.mscount,
            qlimit: st.qlimit,
            sorights: st.conns.iter().filter(|c| c.kind == ConnKind::Once).count() as u32,
            connections: st.conns.len() as u32,
            has_send_source: st.send_source.is_some(),
        })
    }

    /// Set a receive right's queue limit, in messages (1..=65536). Senders block, or
    /// fail without waiting, when that many small messages are queued. The limit is
    /// the kernel's socket buffer, so it counts bytes: large messages fill it sooner.
    pub fn set_qlimit(&self, name: Name, qlimit: u32) -> Result<(), RightsError> {
        if qlimit == 0 || qlimit > MAX_QLIMIT {
            return Err(RightsError::InvalidValue);
        }
        let port = self.receive_port(name)?;
        let mut st = port.lock();
        if let Some(src) = &st.send_source {
            sys::set_queue_limit(src.as_fd(), qlimit)?;
        }
        st.qlimit = qlimit;
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

    fn receive_port(&self, name: Name) -> Result<Arc<RecvPort>, RightsError> {
        match self.table().get(name)? {
            Entry::Port(PortEntry { recv: Some(p), .. }) => Ok(p.clone()),
            _ => Err(RightsError::InvalidRight(name)),
        }
    }

    // ----- notifications --------------------------------------------------------------

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
                let notifier = self.inner.notifier(&self.inner)?;
                {
                    let mut st = port.lock();
                    for w in st.ns_watches.drain(..) {
                        notifier.cancel(w);
                    }
                    st.no_senders = None;
                    st.ns_watcher = None;
                    let Some(target) = target else { return Ok(()) };
                    // Let go of the send source: from now on the kernel tells us when
                    // the last send right anywhere is gone.
                    st.send_source = None;
                    st.no_senders = Some(target);
                    st.ns_watcher = Some(notifier.watcher());
                    let mains: Vec<Arc<OwnedFd>> =
                        st.conns.iter().filter(|c| c.kind != ConnKind::Once).map(|c| c.fd.clone()).collect();
                    for fd in mains {
                        let w = notifier.watch_no_senders(&port, fd)?;
                        st.ns_watches.push(w);
                    }
                }
                self.inner.check_no_senders(&port);
                Ok(())
            }
            NotifyKind::PortDestroyed => {
                let port = self.receive_port(name)?;
                port.lock().port_destroyed = target;
                Ok(())
            }
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

    // ----- messages -------------------------------------------------------------------

    /// Send a message to the port named by `dest` (a send or send-once right; a
    /// receive right sends to its own port).
    ///
    /// Rights in the message are taken by their dispositions only if the send
    /// succeeds. Out-of-line buffers are moved out of `msg` in every case.
    pub fn send(&self, dest: Name, msg: &mut Message, opts: SendOptions) -> Result<(), SendError> {
        self.send_inner(dest, msg, CallReply::None, opts)
    }

    /// Send a request and wait for its reply (Mach RPC). `msg.reply` must be empty.
    ///
    /// To a send right (or this task's own receive right) the reply comes over a *call
    /// channel*: a connection this space made for its calls to that port, offered with
    /// its first request and kept by both sides. Later requests travel on the port's
    /// main connection like any message, naming the channel by its token, and the reply
    /// comes back on the channel: two datagrams, no descriptor passing. To a send-once
    /// right the call goes with a send-once reply right made for that call alone.
    /// Either way, if the server destroys the reply right without answering, or dies
    /// (even by `kill -9`), the call ends with [`CallError::ServerDied`] instead of
    /// hanging.
    pub fn call(
        &self,
        dest: Name,
        msg: &mut Message,
        reply: &mut Received,
        send: SendOptions,
        recv: ReceiveOptions,
    ) -> Result<(), CallError> {
        if let Some(r) = msg.reply {
            return Err(CallError::Send(SendError::InvalidRight(r.name)));
        }
        // One look at the table: the port's identity (for the channel pool) and, for the
        // common case, the send end.
        let (ident, send_end) = match self.table().get(dest) {
            Ok(Entry::Port(PortEntry { ident: Some(i), send, .. })) => (Some(*i), send.as_ref().map(|s| s.fd.clone())),
            _ => (None, None),
        };
        let Some(ident) = ident else {
            let (s, r) = sys::connection().map_err(SendError::Os)?;
            self.send_inner(dest, msg, CallReply::Once(s), send)?;
            return self.inner.wait_reply(self, &r, &mut None, reply, recv).map(|_| ()).map_err(|(e, _)| e);
        };
        let plain = msg.ports.is_empty() && msg.ool.is_empty() && msg.data.len() <= INLINE_DATAGRAM_MAX;
        let forgotten = self.inner.forgotten.load(Ordering::Acquire);
        let chan = match self.inner.take_channel(ident) {
            Some(chan) => {
                let deadline = send.timeout.map(|t| Instant::now() + t);
                let sent = match send_end {
                    Some(fd) if plain => self.send_plain_to(dest, Plain::Shared(fd), msg, chan.token, deadline),
                    _ => Err(SendError::Os(rustix::io::Errno::MSGSIZE)),
                };
                match sent {
                    Err(SendError::Os(rustix::io::Errno::MSGSIZE)) => {
                        self.send_inner(dest, msg, CallReply::OnChannel(chan.token), send)?
                    }
                    other => other?,
                }
                chan
            }
            None => {
                // Ours is the receive end (`SO_PASSCRED` on, for the replies'
                // credentials); its inode number is the token the server will know the
                // channel by, and can find again from the kernel if the port moves.
                // Plain replies will come through a pipe beside it, if one can be made.
                let (b, a) = sys::connection().map_err(SendError::Os)?;
                let token = sys::channel_token(a.as_fd()).map_err(SendError::Os)?;
                let (pipe, pipe_w) = sys::reply_pipe().map_or((None, None), |(r, w)| (Some(r), Some(w)));
                self.send_inner(dest, msg, CallReply::Channel(b, pipe_w, token), send)?;
                Pooled { fd: a, token, timer: None, pipe, replier: None }
            }
        };
        let mut chan = chan;
        let waited = match self.inner.wait_pipe_reply(&mut chan, reply, recv) {
            Ok(None) => {
                let waited = self.inner.wait_reply(self, &chan.fd, &mut chan.timer, reply, recv);
                // A reply the port sent on the connection (or its word that the reply
                // right was destroyed) names who answers; the pipe is used from then on.
                if matches!(waited, Ok(_) | Err((CallError::ServerDied, true))) {
                    chan.replier = Some(reply.sender);
                }
                waited
            }
            Ok(Some(kept)) => Ok(kept),
            Err(e) => Err(e),
        };
        let (result, kept) = match waited {
            Ok(kept) => (Ok(()), kept),
            Err((e, kept)) => (Err(e), kept),
        };
        // Only a channel the port said it keeps can be named by its token again.
        if kept {
            self.inner.put_channel(ident, chan, forgotten);
        }
        result
    }

    fn send_inner(
        &self,
        dest: Name,
        msg: &mut Message,
        call_reply: CallReply,
        opts: SendOptions,
    ) -> Result<(), SendError> {
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        if msg.ports.is_empty()
            && msg.ool.is_empty()
            && msg.reply.is_none()
            && msg.data.len() <= INLINE_DATAGRAM_MAX
            && matches!(call_reply, CallReply::None | CallReply::OnChannel(_))
        {
            let token = match call_reply {
                CallReply::OnChannel(token) => token,
                _ => 0,
            };
            match self.send_plain(dest, msg, token, deadline) {
                Err(SendError::Os(rustix::io::Errno::MSGSIZE)) => {}
                other => return other,
            }
        }
        let mut plan = Plan::default();
        let dest_fd;
        // A reply that does not fit a call channel's pipe goes on the connection, and a
        // word on the pipe sends the caller there.
        let mut pipe: Option<Arc<OwnedFd>> = None;
        {
            // No liveness check here: the send itself finds a dead port (EPIPE).
            let mut t = self.table();
            dest_fd = match t.get(dest).map_err(|_| SendError::InvalidDest(dest))? {
                Entry::Port(PortEntry { send: Some(s), .. }) => s.fd.clone(),
                Entry::Port(PortEntry { recv: Some(p), .. }) => {
                    let p = p.clone();
                    let mut st = p.lock();
                    let (fd, _, _) = st.send_end().map_err(SendError::Os)?;
                    fd
                }
                Entry::SendOnce(_) => {
                    let e = t.reserve(dest).expect("checked");
                    let Entry::SendOnce(so) = &e else { unreachable!() };
                    let fd = so.fd.clone();
                    plan.kept = so.channel.is_some();
                    pipe = so.pipe.clone();
                    plan.undo.push(Undo::Restore(dest, e));
                    plan.commit.push(Commit::Release(dest));
                    fd
                }
                _ => return Err(SendError::InvalidDest(dest)),
            };
            let result = (|| {
                match call_reply {
                    CallReply::None => {
                        if let Some(r) = msg.reply {
                            let kind = self.resolve_arg(&mut t, r, &mut plan)?;
                            plan.reply = Some(match kind {
                                Descriptor::Send => ReplyKind::Send,
                                Descriptor::SendOnce => ReplyKind::SendOnce,
                                _ => return Err(SendError::InvalidRight(r.name)),
                            });
                        }
                    }
                    CallReply::Once(fd) => plan.own_reply(fd, ReplyKind::SendOnce),
                    CallReply::Channel(fd, pipe, token) => {
                        plan.token = token;
                        match pipe {
                            Some(pipe) => {
                                plan.own_reply(fd, ReplyKind::ChannelPipe);
                                plan.push_owned(pipe);
                            }
                            None => plan.own_reply(fd, ReplyKind::Channel),
                        }
                    }
                    CallReply::OnChannel(token) => {
                        plan.token = token;
                        plan.reply = Some(ReplyKind::OnChannel);
                    }
                }
                for &p in &msg.ports {
                    let d = self.resolve_arg(&mut t, p, &mut plan)?;
                    plan.descriptors.push(d);
                }
                Ok(())
            })();
            if let Err(e) = result {
                self.inner.undo(&mut t, std::mem::take(&mut plan.undo));
                return Err(e);
            }
        }
        let result = self.transmit(&dest_fd, msg, &mut plan, deadline);
        if result.is_ok() {
            point_to_connection(pipe.as_deref(), plan.kept);
        }
        let mut t = self.table();
        match result {
            Ok(()) => {
                let commits = std::mem::take(&mut plan.commit);
                drop(plan);
                self.inner.commit(&mut t, commits);
                Ok(())
            }
            Err(e) => {
                if matches!(e, SendError::InvalidDest(_)) {
                    self.inner.make_dead(&mut t, dest, &dest_fd);
                }
                self.inner.undo(&mut t, std::mem::take(&mut plan.undo));
                Err(match e {
                    SendError::InvalidDest(_) => SendError::InvalidDest(dest),
                    e => e,
                })
            }
        }
    }

    /// The common case, without the general path's bookkeeping: in-line data and no
    /// rights besides the destination (and perhaps a call channel's token). Returns
    /// `Os(MSGSIZE)` untouched when the datagram does not fit the port's buffer, for the
    /// general path to carry the data in a memfd instead.
    fn send_plain(&self, dest: Name, msg: &Message, token: u32, deadline: Option<Instant>) -> Result<(), SendError> {
        let target = {
            let mut t = self.table();
            match t.get(dest).map_err(|_| SendError::InvalidDest(dest))? {
                Entry::Port(PortEntry { send: Some(s), .. }) => Plain::Shared(s.fd.clone()),
                Entry::Port(PortEntry { recv: Some(p), .. }) => {
                    let p = p.clone();
                    let mut st = p.lock();
                    Plain::Shared(st.send_end().map_err(SendError::Os)?.0)
                }
                // Taken out for the send (so no other thread can use it too): the entry
                // itself holds the descriptor.
                Entry::SendOnce(_) => Plain::Once(t.reserve(dest).expect("checked")),
                _ => return Err(SendError::InvalidDest(dest)),
            }
        };
        self.send_plain_to(dest, target, msg, token, deadline)
    }

    /// [`Space::send_plain`] once the destination is resolved.
    fn send_plain_to(
        &self,
        dest: Name,
        target: Plain,
        msg: &Message,
        token: u32,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let (fd, kept) = match &target {
            Plain::Shared(fd) => (fd, false),
            Plain::Once(Entry::SendOnce(so)) => (&so.fd, so.channel.is_some()),
            Plain::Once(_) => unreachable!("only send-once entries are taken for a plain send"),
        };
        let header = ictus_abi::Header {
            id: msg.id,
            reply: if token != 0 { ReplyKind::OnChannel } else { ReplyKind::None },
            token,
            kept,
            on_socket: false,
            ndesc: 0,
            nfds: 0,
            inline_len: msg.data.len() as u32,
            big_len: 0,
        };
        let mut head = [0u8; HEADER_LEN];
        header.encode(&mut head);
        let bufs = [IoSlice::new(&head), IoSlice::new(&msg.data)];
        // A kept call channel's reply goes through its pipe if it fits there; otherwise
        // (or should the pipe refuse it) on the connection, where the caller is sent.
        let pipe = match &target {
            Plain::Once(Entry::SendOnce(so)) => so.pipe.as_deref(),
            _ => None,
        };
        let failed = if reply_through_pipe(pipe, &bufs) {
            None
        } else {
            let failed = match sys::send(fd.as_fd(), &bufs, &[], deadline) {
                Ok(SendOutcome::Sent) => None,
                Ok(SendOutcome::WouldBlock) => Some(SendError::TimedOut),
                Ok(SendOutcome::Dead) => Some(SendError::InvalidDest(dest)),
                Ok(SendOutcome::TooLarge) => Some(SendError::Os(rustix::io::Errno::MSGSIZE)),
                Err(e) => Some(SendError::Os(e)),
            };
            if failed.is_none() {
                point_to_connection(pipe, kept);
            }
            failed
        };
        match (failed, target) {
            (None, Plain::Shared(_)) => Ok(()),
            (None, Plain::Once(e)) => {
                self.table().release(dest);
                self.inner.cancel_requests(dest);
                drop(e);
                Ok(())
            }
            (Some(err), target) => {
                let mut t = self.table();
                let fd = match target {
                    Plain::Shared(fd) => fd,
                    Plain::Once(e) => {
                        let fd = match &e {
                            Entry::SendOnce(so) => so.fd.clone(),
                            _ => unreachable!("only send-once entries are taken for a plain send"),
                        };
                        t.restore(dest, e);
                        fd
                    }
                };
                if matches!(err, SendError::InvalidDest(_)) {
                    self.inner.make_dead(&mut t, dest, &fd);
                }
                Err(err)
            }
        }
    }

    /// Build the datagram and hand it to the kernel.
    fn transmit(
        &self,
        dest: &Arc<OwnedFd>,
        msg: &mut Message,
        plan: &mut Plan,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        // Out-of-line regions: give up the mapping, seal, send the memfd.
        for buf in msg.ool.drain(..) {
            let (fd, len) = buf.seal()?;
            plan.owned.push(fd);
            plan.descriptors.push(Descriptor::Ool { len });
        }
        let ool_count = plan.descriptors.iter().filter(|d| matches!(d, Descriptor::Ool { .. })).count();
        let first_ool_owned = plan.owned.len() - ool_count;
        let mut big: Option<OwnedFd> = None;
        let mut big_len = 0u64;
        if msg.data.len() > INLINE_DATAGRAM_MAX {
            let (fd, len) = big_inline(&msg.data)?;
            big = Some(fd);
            big_len = len;
        }
        loop {
            let inline: &[u8] = if big.is_some() { &[] } else { &msg.data };
            // Small heads on the stack; zeroing the largest possible one costs more
            // than a whole small message's encoding.
            let need = HEADER_LEN + plan.descriptors.len() * DESCRIPTOR_LEN;
            let mut small = [0u8; SMALL_HEAD];
            let mut large = Vec::new();
            let head: &mut [u8] = if need <= SMALL_HEAD {
                &mut small
            } else {
                large.resize(need.min(HEAD_MAX), 0);
                &mut large
            };
            let reply_kind = plan.reply.unwrap_or(ReplyKind::None);
            let spec = Head { id: msg.id, reply: reply_kind, token: plan.token, kept: plan.kept };
            let (_, n) = Datagram::encode_head(spec, &plan.descriptors, inline.len(), big_len, head)?;
            // File descriptors in wire order: reply, big memfd, then descriptors'.
            let nfds = plan.order.len() + ool_count + usize::from(big.is_some());
            let mut fds: Vec<BorrowedFd<'_>> = if nfds == 0 { Vec::new() } else { Vec::with_capacity(nfds) };
            let mut order = plan.order.iter();
            for _ in 0..reply_kind.fds() {
                fds.push(plan.fd(*order.next().expect("reply fd")));
            }
            if let Some(b) = &big {
                fds.push(b.as_fd());
            }
            fds.extend(order.map(|r| plan.fd(*r)));
            fds.extend(plan.owned[first_ool_owned..].iter().map(|f| f.as_fd()));
            let bufs = [IoSlice::new(&head[..n]), IoSlice::new(inline)];
            match sys::send(dest.as_fd(), &bufs, &fds, deadline)? {
                SendOutcome::Sent => return Ok(()),
                SendOutcome::WouldBlock => return Err(SendError::TimedOut),
                SendOutcome::Dead => return Err(SendError::InvalidDest(Name::NULL)),
                SendOutcome::TooLarge if big.is_none() && !msg.data.is_empty() => {
                    // The port's buffer is smaller than this datagram: carry the
                    // in-line data in a memfd instead.
                    let (fd, len) = big_inline(&msg.data)?;
                    big = Some(fd);
                    big_len = len;
                }
                SendOutcome::TooLarge => return Err(SendError::Os(rustix::io::Errno::MSGSIZE)),
            }
        }
    }

    /// Resolve one right named in a message by its disposition.
    fn resolve_arg(&self, t: &mut Table, arg: PortArg, plan: &mut Plan) -> Result<Descriptor, SendError> {
        let name = arg.name;
        let bad = || SendError::InvalidRight(name);
        let entry = t.get_mut(name).map_err(|_| bad())?;
        match (arg.disposition, entry) {
            (Disposition::CopySend, Entry::Port(PortEntry { send: Some(s), .. })) => {
                plan.push_shared(s.fd.clone());
                Ok(Descriptor::Send)
            }
            (Disposition::MoveSend, Entry::Port(PortEntry { send: Some(s), .. })) => {
                plan.push_shared(s.fd.clone());
                plan.commit.push(Commit::DropSendUref(name));
                Ok(Descriptor::Send)
            }
            (Disposition::MakeSend, Entry::Port(PortEntry { recv: Some(p), .. })) => {
                let p = p.clone();
                let (fd, _, new_conn) = p.lock().send_end().map_err(SendError::Os)?;
                if let Some(c) = new_conn {
                    plan.undo.push(Undo::RemoveConn(p.clone(), c));
                }
                plan.push_shared(fd);
                plan.commit.push(Commit::MadeSend(p));
                Ok(Descriptor::Send)
            }
            (Disposition::MakeSendOnce, Entry::Port(PortEntry { recv: Some(p), .. })) => {
                let p = p.clone();
                let (fd, conn) = p.lock().send_once_end().map_err(SendError::Os)?;
                plan.undo.push(Undo::RemoveConn(p, conn));
                plan.owned.push(fd);
                plan.order.push(FdRef::Owned(plan.owned.len() - 1));
                Ok(Descriptor::SendOnce)
            }
            (Disposition::MoveSendOnce, Entry::SendOnce(_)) => {
                let e = t.reserve(name).map_err(|_| bad())?;
                let Entry::SendOnce(so) = &e else { unreachable!() };
                if let Some((port, key)) = so.channel {
                    // The right answers on a client's call channel. The task it goes to
                    // may write this one reply; the port stops keeping the channel, so
                    // the reply comes without the kept flag and the client's next call
                    // makes a new one. (If the receive right has left this space, its
                    // new holder keeps the channel until the client lets go of it.)
                    if let Some(p) = t.receive_right_by_id(port) {
                        plan.commit.push(Commit::ForgetChannel(Arc::downgrade(&p), key, so.fd.clone()));
                    }
                }
                plan.push_shared(so.fd.clone());
                plan.undo.push(Undo::Restore(name, e));
                plan.commit.push(Commit::Release(name));
                Ok(Descriptor::SendOnce)
            }
            (Disposition::MoveReceive, Entry::Port(PortEntry { recv: Some(p), .. })) => {
                let p = p.clone();
                let set = p.lock().set.as_ref().and_then(std::sync::Weak::upgrade);
                if let Some(set) = &set {
                    set.remove(&p);
                }
                let packed = p.lock().pack(p.seqno.load(Ordering::Relaxed));
                let info = packed.info;
                if packed.fds.len() != info.nfds() {
                    // More connections than one message can describe: refuse the move.
                    p.lock().unpack(packed);
                    if let Some(set) = set {
                        let _ = set.add(&p);
                    }
                    return Err(SendError::Invalid(ictus_abi::DecodeError::TooManyFds(info.nfds())));
                }
                for fd in &packed.fds {
                    plan.push_shared(fd.clone());
                }
                let watches = packed.channels.iter().filter_map(|(_, c)| c.watch).collect();
                plan.undo.push(Undo::Unpack(p.clone(), packed, set));
                plan.commit.push(Commit::Moved(p, watches));
                Ok(Descriptor::Receive(info))
            }
            _ => Err(bad()),
        }
    }

    /// Receive a message from a receive right or port set.
    ///
    /// A malformed message is destroyed (its descriptors closed, nothing inserted),
    /// counted, and reported as [`ReceiveError::Malformed`]; receiving again goes on
    /// with the next message.
    pub fn receive(&self, name: Name, into: &mut Received, opts: ReceiveOptions) -> Result<(), ReceiveError> {
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        enum Source {
            Port(Arc<RecvPort>),
            Set(Arc<PortSet>),
        }
        let src = match self.table().get(name) {
            Ok(Entry::Port(PortEntry { recv: Some(p), .. })) => Source::Port(p.clone()),
            Ok(Entry::Set(s)) => Source::Set(s.clone()),
            _ => return Err(ReceiveError::InvalidName(name)),
        };
        match src {
            Source::Port(p) => self.inner.receive_port(self, &p, into, deadline, opts),
            Source::Set(s) => loop {
                let Some(id) = wait_one(s.ep.as_fd(), deadline)? else { continue };
                let Some(port) = s.member(id) else { continue };
                match self.inner.receive_port(self, &port, into, Some(Instant::now()), opts) {
                    Err(ReceiveError::TimedOut) | Err(ReceiveError::PortDied) => continue,
                    other => return other,
                }
            },
        }
    }

    // ----- bootstrap ------------------------------------------------------------------

    /// Give a child process, about to be spawned by `cmd`, a send right to the port
    /// named `name` as its bootstrap port (made from a receive right, or copied from a
    /// send right). The child finds it with [`Space::take_bootstrap`].
    pub fn give_bootstrap(&self, cmd: &mut std::process::Command, name: Name) -> Result<(), RightsError> {
        use std::os::unix::process::CommandExt;
        let fd = {
            let mut t = self.table();
            match t.get_mut(name)? {
                Entry::Port(PortEntry { send: Some(s), .. }) => sys::dup(s.fd.as_fd())?,
                Entry::Port(PortEntry { recv: Some(p), .. }) => {
                    let mut st = p.lock();
                    let (fd, _, _) = st.send_end()?;
                    st.mscount = st.mscount.wrapping_add(1);
                    sys::dup(fd.as_fd())?
                }
                _ => return Err(RightsError::InvalidRight(name)),
            }
        };
        cmd.env(crate::BOOTSTRAP_ENV, crate::BOOTSTRAP_FD.to_string());
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // dup2 and fcntl, which are async-signal-safe (signal-safety(7)). `fd` is owned
        // by the closure, so it is open in the parent (and thus in the child) until the
        // Command is dropped.
        unsafe {
            cmd.pre_exec(move || {
                let raw = fd.as_raw_fd();
                if raw == crate::BOOTSTRAP_FD {
                    if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(raw, crate::BOOTSTRAP_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// In a child spawned with [`Space::give_bootstrap`]: take the inherited send
    /// right into this space. `None` if this process was not given one. Call it early,
    /// before other threads read the environment.
    pub fn take_bootstrap(&self) -> Result<Option<Name>, RightsError> {
        let Ok(v) = std::env::var(crate::BOOTSTRAP_ENV) else { return Ok(None) };
        std::env::remove_var(crate::BOOTSTRAP_ENV);
        let raw: i32 = v.parse().map_err(|_| RightsError::InvalidValue)?;
        if raw < 0 {
            return Err(RightsError::InvalidValue);
        }
        // SAFETY: the descriptor number was handed to us by our parent for us to own;
        // we check below that it is open and is a port socket before using it.
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        if rustix::io::fcntl_getfd(borrowed).is_err() || !sys::is_port_socket(borrowed) {
            return Err(RightsError::InvalidValue);
        }
        // Take ownership through a close-on-exec duplicate, and close the inherited number.
        let fd = rustix::io::fcntl_dupfd_cloexec(borrowed, 0)?;
        // SAFETY: `raw` is ours (see above) and nothing else refers to it.
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) });
        let ident = sys::identity(fd.as_fd())?;
        Ok(Some(self.table().insert_send(fd, ident)?))
    }

    /// Insert a send right from a raw socket descriptor received outside ictus
    /// (for example from the name server's well-known socket). The descriptor is
    /// checked to be a port socket.
    pub fn insert_send_fd(&self, fd: OwnedFd) -> Result<Name, RightsError> {
        if !sys::is_port_socket(fd.as_fd()) {
            return Err(RightsError::InvalidValue);
        }
        let ident = sys::identity(fd.as_fd())?;
        self.table().insert_send(fd, ident)
    }

    /// A duplicate of the descriptor behind a send right (or a new send right made
    /// from a receive right), to hand to a process outside ictus's messages.
    pub fn send_right_fd(&self, name: Name) -> Result<OwnedFd, RightsError> {
        let mut t = self.table();
        match t.get_mut(name)? {
            Entry::Port(PortEntry { send: Some(s), .. }) => Ok(sys::dup(s.fd.as_fd())?),
            Entry::Port(PortEntry { recv: Some(p), .. }) => {
                let mut st = p.lock();
                let (fd, _, _) = st.send_end()?;
                st.mscount = st.mscount.wrapping_add(1);
                Ok(sys::dup(fd.as_fd())?)
            }
            _ => Err(RightsError::InvalidRight(name)),
        }
    }
}

/// Send one reply through a kept call channel's reply pipe, if it has one and the reply
/// fits one pipe write; whether it went.
fn reply_through_pipe(pipe: Option<&OwnedFd>, bufs: &[IoSlice<'_>]) -> bool {
    let len: usize = bufs.iter().map(|b| b.len()).sum();
    pipe.is_some_and(|p| len <= PIPE_MESSAGE_MAX && sys::pipe_write(p.as_fd(), bufs).is_ok())
}

/// A reply on a kept call channel went on the connection: the word on the channel's
/// reply pipe, if any, that sends the caller there.
fn point_to_connection(pipe: Option<&OwnedFd>, kept: bool) {
    if let Some(p) = pipe {
        let _ = sys::pipe_write(p.as_fd(), &[IoSlice::new(&PipeMessage::on_socket(kept))]);
    }
}

fn big_inline(data: &[u8]) -> Result<(OwnedFd, u64), SendError> {
    if data.len() as u64 > ictus_abi::BIG_INLINE_MAX {
        return Err(SendError::Invalid(ictus_abi::DecodeError::BadBigInline(data.len() as u64)));
    }
    let fd = sys::memfd(data.len())?;
    let mut off = 0;
    while off < data.len() {
        match rustix::io::pwrite(&fd, &data[off..], off as u64) {
            Ok(0) => return Err(SendError::Os(rustix::io::Errno::IO)),
            Ok(n) => off += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(SendError::Os(e)),
        }
    }
    sys::seal(fd.as_fd())?;
    Ok((fd, data.len() as u64))
}

fn to_creds(c: rustix::net::UCred) -> Credentials {
    Credentials { pid: rustix::process::Pid::as_raw(Some(c.pid)) as u32, uid: c.uid.as_raw(), gid: c.gid.as_raw() }
}

/// The port and connection a message arrived on.
#[derive(Clone, Copy)]
struct Origin<'a> {
    port: &'a Arc<RecvPort>,
    kind: ConnKind,
}

impl Plan {
    /// A reply right the call made itself (its descriptor goes first on the wire).
    fn own_reply(&mut self, fd: OwnedFd, kind: ReplyKind) {
        self.push_owned(fd);
        self.reply = Some(kind);
    }

    fn push_owned(&mut self, fd: OwnedFd) {
        self.owned.push(fd);
        self.order.push(FdRef::Owned(self.owned.len() - 1));
    }

    fn push_shared(&mut self, fd: Arc<OwnedFd>) {
        self.fds.push(fd);
        self.order.push(FdRef::Shared(self.fds.len() - 1));
    }

    fn fd(&self, r: FdRef) -> BorrowedFd<'_> {
        match r {
            FdRef::Shared(i) => self.fds[i].as_fd(),
            FdRef::Owned(i) => self.owned[i].as_fd(),
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

    fn count_malformed(&self, e: ReceiveError) -> ReceiveError {
        self.malformed.fetch_add(1, Ordering::Relaxed);
        e
    }

    /// If the send or send-once right under `name` has lost its port, turn the name
    /// into a dead name.
    fn reap_if_dead(&self, t: &mut Table, name: Name) {
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
            self.forget_channels(p.ident);
        }
        t.forget_ident(name);
        if let Ok(e) = t.get_mut(name) {
            *e = Entry::Dead(urefs);
        }
        true
    }

    fn undo(&self, t: &mut Table, undo: Vec<Undo>) {
        for u in undo.into_iter().rev() {
            match u {
                Undo::Restore(name, e) => t.restore(name, e),
                Undo::RemoveConn(p, id) => {
                    p.lock().remove_conn(id);
                }
                Undo::Unpack(p, packed, set) => {
                    p.lock().unpack(packed);
                    if let Some(set) = set {
                        let _ = set.add(&p);
                    }
                }
            }
        }
    }

    fn commit(&self, t: &mut Table, commits: Vec<Commit>) {
        let mut dropped = Vec::new();
        for c in commits {
            match c {
                Commit::Release(name) => {
                    t.release(name);
                    self.cancel_requests(name);
                }
                Commit::DropSendUref(name) => {
                    if let Ok(Entry::Port(p)) = t.get_mut(name) {
                        if let Some(s) = p.send.as_mut() {
                            s.urefs = s.urefs.saturating_sub(1);
                            if s.urefs == 0 {
                                dropped.push(p.send.take());
                                self.forget_channels(p.ident);
                                self.cancel_requests(name);
                                if p.recv.is_none() {
                                    if let Ok(e) = t.remove(name) {
                                        dropped.push(None);
                                        drop(e);
                                    }
                                }
                            }
                        }
                    }
                }
                Commit::MadeSend(p) => {
                    let mut st = p.lock();
                    st.mscount = st.mscount.wrapping_add(1);
                }
                Commit::ForgetChannel(port, key, fd) => {
                    let gone = port.upgrade().and_then(|p| p.lock().remove_channel(key, &fd));
                    if let (Some(n), Some(w)) = (self.notifier.get(), gone.and_then(|c| c.watch)) {
                        n.cancel(w);
                    }
                }
                Commit::Moved(p, watches) => {
                    if let Some(n) = self.notifier.get() {
                        for w in watches {
                            n.cancel(w);
                        }
                    }
                    let name = p.name();
                    if let Ok(Entry::Port(e)) = t.get_mut(name) {
                        if e.recv.as_ref().is_some_and(|r| Arc::ptr_eq(r, &p)) {
                            e.recv = None;
                            if e.send.is_none() {
                                let _ = t.remove(name);
                            }
                        }
                    }
                    self.cancel_port_watches(&p);
                }
            }
        }
    }

    fn cancel_port_watches(&self, p: &RecvPort) {
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
    fn drop_entry(&self, e: Entry) {
        match e {
            Entry::Port(PortEntry { recv, send, ident }) => {
                if send.is_some() {
                    self.forget_channels(ident);
                }
                if let Some(p) = recv {
                    self.destroy_receive(p);
                }
            }
            Entry::SendOnce(SendOnce { fd, channel: Some(_), pipe }) => {
                // A call channel's reply right destroyed unused: tell the caller, whose
                // channel stays open for its next call.
                let body = NotifyId::body(Name::NULL, 0);
                let mut head = [0u8; HEAD_MAX];
                let spec = Head { kept: true, ..Head::new(NotifyId::SendOnce.id(), ReplyKind::None) };
                if let Ok((_, n)) = Datagram::encode_head(spec, &[], body.len(), 0, &mut head) {
                    let bufs = [IoSlice::new(&head[..n]), IoSlice::new(&body)];
                    if !reply_through_pipe(pipe.as_deref(), &bufs) {
                        let _ = sys::send(fd.as_fd(), &bufs, &[], Some(Instant::now()));
                    }
                }
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
            st.no_senders = None;
            st.ns_watcher = None;
            if target.is_none() {
                // Shut the connections down while they are still in the port's epoll,
                // so that every thread waiting on the port wakes and finds it dead.
                st.dead = true;
                for c in &st.conns {
                    let _ = rustix::net::shutdown(c.fd.as_fd(), rustix::net::Shutdown::Both);
                }
            }
            let packed = st.pack(p.seqno.load(Ordering::Relaxed));
            (target, packed)
        };
        if let Some(target) = target {
            let name = p.name();
            let fds: Vec<BorrowedFd<'_>> = packed.fds.iter().map(|f| f.as_fd()).collect();
            if self.send_raw(
                &target.fd,
                NotifyId::PortDestroyed.id(),
                &NotifyId::body(name, 0),
                &[Descriptor::Receive(packed.info)],
                &fds,
            ) {
                return;
            }
        }
        // Shut every connection down: threads blocked receiving on it wake (and find
        // the port dead), and senders see the hang-up at once, even while another
        // thread still holds a descriptor.
        for fd in &packed.fds {
            let _ = rustix::net::shutdown(fd.as_fd(), rustix::net::Shutdown::Both);
        }
        drop(packed);
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

    /// The right under `name` is gone: cancel its dead-name request. The request's
    /// notify right is released (Mach would send port-deleted; a send-once notify
    /// right's port gets a send-once notification instead).
    fn cancel_requests(&self, name: Name) {
        if let Some(n) = self.notifier.get() {
            n.cancel_dead_name(name);
        }
    }

    /// Whether an offered call channel is what it claims, a connection of the client's
    /// own, and not a way back into this port: not the port's send end (which would
    /// make the port its own sender for ever, defeating no-senders, and loop replies
    /// back in as requests).
    fn channel_is_foreign(&self, p: &Arc<RecvPort>, ch: BorrowedFd<'_>) -> bool {
        let Ok(id) = sys::identity(ch) else { return false };
        let st = p.lock();
        st.ident != Some(id) && st.conns.iter().all(|c| sys::identity(c.fd.as_fd()).is_ok_and(|own| own != id))
    }

    /// Keep a client's call channel in a port under `key`, watched so that the port
    /// forgets it when the client's end hangs up. Returns whether the port keeps it.
    fn keep_channel(
        &self,
        space: &Space,
        p: &Arc<RecvPort>,
        key: ChannelKey,
        fd: Arc<OwnedFd>,
        pipe: Option<Arc<OwnedFd>>,
    ) -> bool {
        let Ok(notifier) = self.notifier(&space.inner) else { return false };
        let mut st = p.lock();
        if st.dead {
            return false;
        }
        let Ok(watch) = notifier.watch_channel(p, key, fd.clone()) else { return false };
        if let Some(old) = st.add_channel(key, Channel { fd, pipe, watch: Some(watch) }) {
            // Only the same client could have used the key: its older channel goes.
            if let Some(w) = old.watch {
                notifier.cancel(w);
            }
        }
        true
    }

    /// Called by the notifier when the client's end of a call channel hung up.
    pub(crate) fn channel_hung_up(&self, p: &Arc<RecvPort>, key: ChannelKey, fd: &Arc<OwnedFd>) {
        let gone = p.lock().remove_channel(key, fd);
        if gone.is_some() {
            self.check_no_senders(p);
        }
    }

    /// Most idle call channels kept per destination port.
    const CHANNELS_PER_PORT: usize = 8;

    /// A pooled channel to the port `ident`, if there is one. The port's place in the
    /// pool stays (empty, if need be) while the call is under way, so that forgetting the
    /// port meanwhile is seen by [`Inner::put_channel`].
    fn take_channel(&self, ident: Ident) -> Option<Pooled> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner()).entry(ident).or_default().pop()
    }

    /// Put a channel back for the next call, unless this space forgot channels since
    /// `forgotten` was read (it let go of a send right meanwhile: a pooled channel would
    /// keep the port from seeing no senders).
    fn put_channel(&self, ident: Ident, chan: Pooled, forgotten: u64) {
        let mut pool = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if self.forgotten.load(Ordering::Acquire) != forgotten {
            return;
        }
        let Some(v) = pool.get_mut(&ident) else { return };
        if v.len() < Self::CHANNELS_PER_PORT {
            v.push(chan);
        }
    }

    /// This space no longer holds a send right to the port `ident`: close its call
    /// channels too, since a channel reaches the port like a send right.
    pub(crate) fn forget_channels(&self, ident: Option<Ident>) {
        if let Some(ident) = ident {
            let gone = {
                let mut pool = self.channels.lock().unwrap_or_else(|e| e.into_inner());
                let gone = pool.remove(&ident);
                if gone.is_some() {
                    self.forgotten.fetch_add(1, Ordering::Release);
                }
                gone
            };
            drop(gone);
        }
    }

    /// Wait for the reply to a call on its channel's reply pipe, if it has one and an
    /// earlier reply came on the connection. `Ok(None)`: the reply is on the connection
    /// instead (the pipe said so, or the port let go of the pipe's write end: the
    /// channel then goes on without a pipe). A reply on the pipe is credited to the
    /// sender of the last reply on the connection, since only the port's holder has the
    /// pipe's write end.
    fn wait_pipe_reply(
        &self,
        chan: &mut Pooled,
        reply: &mut Received,
        recv: ReceiveOptions,
    ) -> Result<Option<bool>, (CallError, bool)> {
        let lost = |e: ReceiveError| (CallError::from(e), false);
        // The reply to the call that offered the channel comes on the connection.
        let (Some(pipe), Some(replier)) = (&chan.pipe, chan.replier) else { return Ok(None) };
        let deadline = recv.timeout.map(|t| Instant::now() + t);
        // One more byte than a message may have, so that too much is seen as such.
        let n = match sys::pipe_read(pipe.as_fd(), &mut reply.buf[..PIPE_MESSAGE_MAX + 1], deadline) {
            Ok(0) => {
                chan.pipe = None;
                return Ok(None);
            }
            Ok(n) => n,
            Err(rustix::io::Errno::AGAIN) => return Err(lost(ReceiveError::TimedOut)),
            Err(e) => return Err(lost(ReceiveError::Os(e))),
        };
        let bad = |why: String| lost(self.count_malformed(malformed(why, chan.replier)));
        match PipeMessage::parse(&reply.buf[..n]) {
            Ok(PipeMessage::OnSocket { .. }) => Ok(None),
            Ok(PipeMessage::Reply { header, .. }) => {
                reply.reset();
                reply.data_start = HEADER_LEN;
                reply.data_end = n;
                reply.id = header.id;
                reply.sender = replier;
                if header.id == NotifyId::SendOnce.id() {
                    // The server destroyed the reply right of a channel call unused.
                    return Err((CallError::ServerDied, header.kept));
                }
                Ok(Some(header.kept))
            }
            Err(e) => Err(bad(format!("reply pipe: {e}"))),
        }
    }

    /// Wait for the reply to a call on its reply connection or channel. Returns, with
    /// the outcome, whether the reply said that the port keeps the channel.
    ///
    /// The reply connection is this task's alone, so a time-out is the socket's own
    /// receive time-out (`SO_RCVTIMEO`), set only when it changes (`timer` says what is
    /// set): a blocking `recvmsg` and nothing else, where a `poll` first would cost a
    /// system call per call.
    fn wait_reply(
        &self,
        space: &Space,
        r: &OwnedFd,
        timer: &mut Option<std::time::Duration>,
        reply: &mut Received,
        recv: ReceiveOptions,
    ) -> Result<bool, (CallError, bool)> {
        let mut fds = Vec::new();
        let lost = |e: ReceiveError| (CallError::from(e), false);
        let want = recv.timeout;
        let nonblocking = want.is_some_and(|t| t.is_zero());
        if !nonblocking && *timer != want {
            sys::set_receive_timeout(r.as_fd(), want).map_err(|e| lost(ReceiveError::Os(e)))?;
            *timer = want;
        }
        match sys::recv(r.as_fd(), &mut reply.buf, &mut fds, nonblocking).map_err(|e| lost(ReceiveError::Os(e)))? {
            // Nothing queued, or the time-out ran out (a signal interrupts with EINTR, and
            // the wait starts again: a time-out is a lower bound).
            RecvOutcome::Empty => Err(lost(ReceiveError::TimedOut)),
            RecvOutcome::Zero => {
                if sys::hung_up(r.as_fd()) {
                    return Err((CallError::ServerDied, false));
                }
                Err(lost(self.count_malformed(malformed("empty datagram", None))))
            }
            RecvOutcome::Datagram { len, creds, truncated } => {
                if truncated {
                    return Err(lost(self.count_malformed(malformed("datagram or descriptors truncated", creds))));
                }
                let kept = self.decode(space, reply, len, creds, &mut fds, recv.populate_ool, None).map_err(lost)?;
                if reply.id == NotifyId::SendOnce.id() && reply.ports.is_empty() && reply.reply.is_none() {
                    // The server destroyed the reply right of a channel call unused.
                    return Err((CallError::ServerDied, kept));
                }
                reply.port = Name::NULL;
                Ok(kept)
            }
        }
    }

    fn receive_port(
        &self,
        space: &Space,
        p: &Arc<RecvPort>,
        rcv: &mut Received,
        deadline: Option<Instant>,
        opts: ReceiveOptions,
    ) -> Result<(), ReceiveError> {
        let mut fds = Vec::new();
        loop {
            // Choose how to wait: straight on the main connection when it is the only
            // one and a doorbell can reach it; otherwise through the port's epoll.
            let direct = {
                let mut st = p.lock();
                if st.dead {
                    return Err(ReceiveError::PortDied);
                }
                if st.conns.len() == 1 && st.conns[0].kind == ConnKind::Main && st.send_source.is_some() {
                    Ok((st.conns[0].fd.clone(), st.conns[0].id))
                } else {
                    Err(st.ensure_epoll()?)
                }
            };
            let (fd, cid, kind, nonblocking) = match direct {
                Ok((fd, cid)) => {
                    if deadline.is_some() && !sys::wait_until(fd.as_fd(), rustix::event::PollFlags::IN, deadline)? {
                        return Err(ReceiveError::TimedOut);
                    }
                    (fd, cid, ConnKind::Main, deadline.is_some())
                }
                Err(ep) => {
                    let Some(cid) = wait_one(ep.as_fd(), deadline)? else { continue };
                    // The wake event (or a connection already gone): look again.
                    let Some((fd, kind)) = p.lock().conn(cid) else { continue };
                    (fd, cid, kind, true)
                }
            };
            fds.clear();
            match sys::recv(fd.as_fd(), &mut rcv.buf, &mut fds, nonblocking)? {
                RecvOutcome::Empty => continue,
                RecvOutcome::Zero => {
                    if !sys::hung_up(fd.as_fd()) {
                        return Err(self.count_malformed(malformed("empty datagram", None)));
                    }
                    p.lock().remove_conn(cid);
                    if kind == ConnKind::Once {
                        // A send-once right died unused: the send-once notification.
                        rcv.reset();
                        rcv.id = NotifyId::SendOnce.id();
                        rcv.seqno = p.seqno.fetch_add(1, Ordering::Relaxed);
                        rcv.sender = self.me;
                        rcv.port = p.name();
                        let body = NotifyId::body(p.name(), 0);
                        rcv.buf[..8].copy_from_slice(&body);
                        rcv.data_start = 0;
                        rcv.data_end = 8;
                        return Ok(());
                    }
                    self.check_no_senders(p);
                    continue;
                }
                RecvOutcome::Datagram { len, creds, truncated } => {
                    if kind == ConnKind::Once {
                        // Read at most once: closing the connection makes the kernel
                        // refuse anything more sent on this send-once right.
                        p.lock().remove_conn(cid);
                    }
                    if kind == ConnKind::Main && len == 1 && rcv.buf[0] == DOORBELL && fds.is_empty() {
                        continue;
                    }
                    if truncated {
                        return Err(self.count_malformed(malformed("datagram or descriptors truncated", creds)));
                    }
                    let seqno = p.seqno.fetch_add(1, Ordering::Relaxed);
                    self.decode(space, rcv, len, creds, &mut fds, opts.populate_ool, Some(Origin { port: p, kind }))?;
                    rcv.seqno = seqno;
                    rcv.port = p.name();
                    return Ok(());
                }
            }
        }
    }

    /// The reply right of a request naming a call channel by `token`: the channel the
    /// port keeps under the sender's pid as the kernel stamped it, so a task can name
    /// only channels it offered itself, whatever token it guesses.
    fn kept_channel(&self, port: &Arc<RecvPort>, sender: Credentials, token: u32) -> Result<SendOnce, ReceiveError> {
        let key = (sender.pid, token);
        match port.lock().channels.get(&key) {
            Some(c) => Ok(SendOnce { fd: c.fd.clone(), channel: Some((port.id, key)), pipe: c.pipe.clone() }),
            None => Err(self.count_malformed(malformed("a call on a channel this port does not keep", Some(sender)))),
        }
    }

    /// The common case of [`Inner::decode`]: a datagram that came without descriptors,
    /// whose header says so and describes only in-line data, perhaps naming a call
    /// channel. `None` when it is anything else (the general path then decides).
    fn decode_plain(
        &self,
        space: &Space,
        rcv: &mut Received,
        len: usize,
        sender: Credentials,
        origin: Option<Origin<'_>>,
    ) -> Result<Option<bool>, ReceiveError> {
        let Ok(h) = ictus_abi::Header::decode(&rcv.buf[..len]) else { return Ok(None) };
        let plain = h.ndesc == 0 && h.nfds == 0 && h.big_len == 0 && HEADER_LEN + h.inline_len as usize == len;
        let main = origin.filter(|o| o.kind == ConnKind::Main);
        let reply = match (h.reply, main) {
            _ if !plain => return Ok(None),
            (ReplyKind::None, _) => None,
            (ReplyKind::OnChannel, Some(o)) => Some(self.kept_channel(o.port, sender, h.token)?),
            _ => return Ok(None),
        };
        rcv.reset();
        rcv.data_start = HEADER_LEN;
        rcv.data_end = len;
        if let Some(so) = reply {
            let mut t = space.table();
            rcv.reply = t.alloc(Entry::SendOnce(so)).map(|n| ReceivedRight { name: n, kind: RightKind::SendOnce }).ok();
        }
        rcv.id = h.id;
        rcv.sender = sender;
        Ok(Some(h.kept))
    }

    /// Validate a received datagram and its descriptors, then insert its rights.
    /// Nothing is inserted unless everything is valid.
    #[allow(clippy::too_many_arguments)]
    fn decode(
        &self,
        space: &Space,
        rcv: &mut Received,
        len: usize,
        creds: Option<Credentials>,
        fds: &mut Vec<OwnedFd>,
        populate: bool,
        origin: Option<Origin<'_>>,
    ) -> Result<bool, ReceiveError> {
        let sender = creds;
        let fail = |why: String| self.count_malformed(malformed(why, sender));
        let sender = sender.ok_or_else(|| fail("no sender credentials".into()))?;
        if fds.is_empty() {
            if let Some(kept) = self.decode_plain(space, rcv, len, sender, origin)? {
                return Ok(kept);
            }
        }
        let dg = Datagram::parse(&rcv.buf[..len], fds.len()).map_err(|e| fail(e.to_string()))?;
        // A call channel may be offered or named only on a port's main connection.
        let mut on_channel = None;
        match (dg.header.reply, origin) {
            (ReplyKind::Channel | ReplyKind::ChannelPipe, Some(o)) if o.kind == ConnKind::Main => {}
            (ReplyKind::OnChannel, Some(o)) if o.kind == ConnKind::Main => {
                on_channel = Some(self.kept_channel(o.port, sender, dg.header.token)?);
            }
            (ReplyKind::Channel | ReplyKind::ChannelPipe | ReplyKind::OnChannel, _) => {
                return Err(fail("a call channel named where none may be".into()))
            }
            _ => {}
        }
        // Check every descriptor before using any.
        let mut idents: Vec<Option<Ident>> = Vec::with_capacity(fds.len());
        // Per receive right in the message: whether its send source was verified.
        let mut source_trusted: Vec<bool> = Vec::new();
        let mut i = 0;
        // Send-once rights are never merged with other names, so they need no identity.
        let check_port = |fd: &OwnedFd, idents: &mut Vec<Option<Ident>>, merge: bool| -> Result<(), String> {
            if !sys::is_port_socket(fd.as_fd()) {
                return Err("a right is not a port socket".into());
            }
            idents.push(if merge { Some(sys::identity(fd.as_fd()).map_err(|e| e.to_string())?) } else { None });
            Ok(())
        };
        if dg.header.reply.has_fd() {
            check_port(&fds[i], &mut idents, dg.header.reply == ReplyKind::Send).map_err(&fail)?;
            if let (ReplyKind::Channel | ReplyKind::ChannelPipe, Some(o)) = (dg.header.reply, origin) {
                if !self.channel_is_foreign(o.port, fds[i].as_fd()) {
                    return Err(fail("a call channel that reaches the port itself".into()));
                }
            }
            i += 1;
            if dg.header.reply == ReplyKind::ChannelPipe {
                if !sys::is_pipe_write_end(fds[i].as_fd()) {
                    return Err(fail("a call channel's reply pipe is not a pipe's write end".into()));
                }
                idents.push(None);
                i += 1;
            }
        }
        if dg.header.big_len != 0 {
            sys::check_sealed_memfd(fds[i].as_fd(), dg.header.big_len).map_err(|e| fail(e.into()))?;
            idents.push(None);
            i += 1;
        }
        for d in &dg.descriptors {
            match d {
                Descriptor::Send | Descriptor::SendOnce => {
                    check_port(&fds[i], &mut idents, *d == Descriptor::Send).map_err(&fail)?;
                    i += 1;
                }
                Descriptor::Receive(info) => {
                    let first = i;
                    for _ in 0..info.nfds() {
                        check_port(&fds[i], &mut idents, true).map_err(&fail)?;
                        i += 1;
                    }
                    source_trusted.push(
                        !info.has_send_source || {
                            // The send source must reach this receive right: the kernel's
                            // peer of the source must be one of its main connections.
                            // Otherwise a task holding only a send right to some port could
                            // pass that send end off as a receive right's source.
                            let mains = &idents[first + 1..first + 1 + usize::from(info.main_conns)];
                            match sys::peer_inode(fds[first].as_fd()) {
                                Ok(Some(peer)) => {
                                    if !mains.iter().any(|m| m.is_some_and(|(_, ino)| ino == peer)) {
                                        return Err(fail(
                                            "a receive right whose send source reaches another port".into(),
                                        ));
                                    }
                                    true
                                }
                                // The kernel cannot say: keep the right, drop the source.
                                _ => false,
                            }
                        },
                    );
                }
                Descriptor::Ool { len } => {
                    sys::check_sealed_memfd(fds[i].as_fd(), *len).map_err(|e| fail(e.into()))?;
                    idents.push(None);
                    i += 1;
                }
            }
        }
        let header = dg.header;
        let descriptors = dg.descriptors.clone();
        let inline_start = len - dg.inline.len();
        // Work that can fail, before any right is inserted.
        let mut taken: std::vec::IntoIter<OwnedFd> = std::mem::take(fds).into_iter();
        let reply_fd = header.reply.has_fd().then(|| taken.next().expect("counted"));
        let reply_pipe = (header.reply == ReplyKind::ChannelPipe).then(|| taken.next().expect("counted"));
        let mut ool = Vec::new();
        let mut rights: Vec<(Descriptor, Vec<OwnedFd>)> = Vec::new();
        rcv.reset();
        if header.big_len != 0 {
            let fd = taken.next().expect("counted");
            read_all(&fd, header.big_len as usize, &mut rcv.big)
                .map_err(|e| fail(format!("reading big in-line data: {e}")))?;
            rcv.is_big = true;
        } else {
            rcv.data_start = inline_start;
            rcv.data_end = len;
        }
        for d in &descriptors {
            let mut v: Vec<OwnedFd> = Vec::with_capacity(d.nfds());
            for _ in 0..d.nfds() {
                v.push(taken.next().expect("counted"));
            }
            match d {
                Descriptor::Ool { len } => {
                    let region = OolRegion::map(v.pop().expect("one"), *len, populate)
                        .map_err(|e| fail(format!("mapping out-of-line memory: {e}")))?;
                    ool.push(region);
                }
                _ => rights.push((*d, v)),
            }
        }
        // Insert rights.
        let mut ident_iter = idents.into_iter();
        let mut t = space.table();
        if let Some(fd) = reply_fd {
            let ident = ident_iter.next().flatten();
            if reply_pipe.is_some() {
                ident_iter.next();
            }
            let r = match (header.reply, ident, origin) {
                (ReplyKind::Send, Some(ident), _) => {
                    t.insert_send(fd, ident).map(|n| ReceivedRight { name: n, kind: RightKind::Send })
                }
                (ReplyKind::Channel | ReplyKind::ChannelPipe, _, Some(o)) => {
                    // A client's new call channel: the port keeps it for the client's
                    // later calls, and this request's reply goes back on it. Kept only
                    // under a pid the kernel can vouch for again (the socket's creator,
                    // `SO_PEERCRED`, must be the sender), so that a moved receive right
                    // finds the same key; otherwise it answers this call alone.
                    let fd = Arc::new(fd);
                    let key = (sender.pid, header.token);
                    let creator = rustix::net::sockopt::socket_peercred(fd.as_fd()).ok().map(to_creds);
                    let kept = sender.pid != 0
                        && creator.is_some_and(|c| c.pid == sender.pid)
                        && self.keep_channel(space, o.port, key, fd.clone(), reply_pipe.map(Arc::new));
                    // This first reply goes on the connection, so that the caller learns
                    // from the kernel who answers; later ones may take the pipe.
                    let so = SendOnce { fd, channel: kept.then_some((o.port.id, key)), pipe: None };
                    t.alloc(Entry::SendOnce(so)).map(|n| ReceivedRight { name: n, kind: RightKind::SendOnce })
                }
                _ => t
                    .alloc(Entry::SendOnce(SendOnce::plain(Arc::new(fd))))
                    .map(|n| ReceivedRight { name: n, kind: RightKind::SendOnce }),
            };
            rcv.reply = r.ok();
        } else if let Some(so) = on_channel {
            // A later call from the same client: answered back on its channel.
            rcv.reply = t.alloc(Entry::SendOnce(so)).map(|n| ReceivedRight { name: n, kind: RightKind::SendOnce }).ok();
        }
        if header.big_len != 0 {
            ident_iter.next();
        }
        let mut ports = Vec::new();
        let mut moved_channels: Vec<(Arc<RecvPort>, Vec<Arc<OwnedFd>>)> = Vec::new();
        let mut trusted_iter = source_trusted.into_iter();
        for d in &descriptors {
            match d {
                Descriptor::Ool { .. } => {
                    ident_iter.next();
                }
                Descriptor::Send => {
                    let ident = ident_iter.next().flatten().expect("checked");
                    let fd = rights.remove(0).1.pop().expect("one");
                    if let Ok(n) = t.insert_send(fd, ident) {
                        ports.push(ReceivedRight { name: n, kind: RightKind::Send });
                    }
                }
                Descriptor::SendOnce => {
                    ident_iter.next();
                    let fd = rights.remove(0).1.pop().expect("one");
                    if let Ok(n) = t.alloc(Entry::SendOnce(SendOnce::plain(Arc::new(fd)))) {
                        ports.push(ReceivedRight { name: n, kind: RightKind::SendOnce });
                    }
                }
                Descriptor::Receive(info) => {
                    let mut ids: Vec<Ident> = Vec::new();
                    for _ in 0..info.nfds() {
                        ids.push(ident_iter.next().flatten().expect("checked"));
                    }
                    let fds = rights.remove(0).1;
                    let mut it = fds.into_iter().map(Arc::new);
                    let trusted = trusted_iter.next().unwrap_or(false);
                    let (send_source, ident) = match (info.has_send_source, trusted) {
                        (true, true) => (it.next(), ids.first().copied()),
                        (true, false) => {
                            drop(it.next());
                            (None, None)
                        }
                        (false, _) => (None, None),
                    };
                    let mut conns = Vec::new();
                    let mut channels = Vec::new();
                    for (k, fd) in it.enumerate() {
                        match crate::port::conn_kind_at(info, k) {
                            Some(kind) => {
                                let _ = rustix::net::sockopt::set_socket_passcred(fd.as_fd(), true);
                                conns.push((fd, kind));
                            }
                            None => channels.push(fd),
                        }
                    }
                    let port = RecvPort::from_parts(
                        send_source,
                        ident,
                        conns,
                        info.seqno,
                        info.mscount,
                        info.qlimit.min(MAX_QLIMIT),
                    );
                    if !channels.is_empty() {
                        moved_channels.push((port.clone(), channels));
                    }
                    if let Ok(n) = t.insert_receive(port, ident) {
                        ports.push(ReceivedRight { name: n, kind: RightKind::Receive });
                    }
                }
            }
        }
        drop(t);
        // Call channels that came with receive rights: find each one's key again from
        // the kernel (its creator's pid, the inode of the client's end), so the clients'
        // requests already queued, and later ones, are answered on them. One the
        // kernel cannot place is closed: its client sees the hang-up.
        for (port, channels) in moved_channels {
            for fd in channels {
                let pid = rustix::net::sockopt::socket_peercred(fd.as_fd()).ok().map(|c| to_creds(c).pid);
                let peer = sys::peer_inode(fd.as_fd()).ok().flatten();
                if let (Some(pid), Some(ino)) = (pid.filter(|&p| p != 0), peer) {
                    // Its reply pipe stayed behind: the client sees the pipe close and
                    // takes replies on the connection from now on.
                    self.keep_channel(space, &port, (pid, sys::token_of_inode(ino)), fd, None);
                }
            }
        }
        rcv.id = header.id;
        rcv.sender = sender;
        rcv.ports = ports;
        rcv.ool = ool;
        Ok(header.kept)
    }
}

/// Wait in an epoll for one event until `deadline`: its datum, `None` to look again
/// (interrupted, or woken early), or `TimedOut` once the deadline has passed.
fn wait_one(ep: BorrowedFd<'_>, deadline: Option<Instant>) -> Result<Option<u64>, ReceiveError> {
    let mut events = [epoll::Event { flags: epoll::EventFlags::empty(), data: epoll::EventData::new_u64(0) }; 1];
    let timeout = deadline.map(|d| sys::timespec(d.saturating_duration_since(Instant::now())));
    match epoll::wait(ep, &mut events, timeout.as_ref()) {
        Ok(0) if deadline.is_some_and(|d| Instant::now() >= d) => Err(ReceiveError::TimedOut),
        Ok(0) | Err(rustix::io::Errno::INTR) => Ok(None),
        Ok(_) => Ok(Some(events[0].data.u64())),
        Err(e) => Err(ReceiveError::Os(e)),
    }
}

fn read_all(fd: &OwnedFd, len: usize, out: &mut Vec<u8>) -> rustix::io::Result<()> {
    // Keep the buffer between messages: only newly grown bytes are zeroed.
    if out.len() < len {
        out.resize(len, 0);
    } else {
        out.truncate(len);
    }
    let mut off = 0;
    while off < len {
        match rustix::io::pread(fd, &mut out[off..], off as u64) {
            Ok(0) => return Err(rustix::io::Errno::IO),
            Ok(n) => off += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
