//! What a send takes from the sender's space, planned before anything is taken for
//! good: the rights a message names, resolved by their dispositions into the file
//! descriptors that travel and the descriptors that describe them, with what to do if
//! the send succeeds ([`Commit`]) and how to put everything back if it fails
//! ([`Undo`]). Mach's rule: rights are taken only if the message is sent.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};

use ictus_abi::{Descriptor, Name, ReplyKind};

use crate::error::SendError;
use crate::message::{Disposition, PortArg};
use crate::port::{ChannelKey, Packed, RecvPort};
use crate::set::PortSet;
use crate::space::{Inner, Space};
use crate::table::{Entry, PortEntry, Table};

/// A send's plan: its reply slot and body, as they go on the wire.
///
/// A plain message (in-line data, perhaps naming a call channel by token) is the common
/// case: its plan is the reply kind and the token, with no allocation and nothing to
/// commit or undo. Everything else lives in [`Rights`], made on first need.
pub(crate) struct Plan {
    /// What the reply slot carries.
    pub(crate) reply: ReplyKind,
    /// The call channel token the header carries.
    pub(crate) token: u32,
    more: Option<Box<Rights>>,
}

/// What a message carries beyond in-line data.
#[derive(Default)]
struct Rights {
    /// The file descriptors of the reply slot and the body's rights, in wire order.
    fds: Vec<PlanFd>,
    /// The body's descriptors, rights first, then out-of-line regions.
    descriptors: Vec<Descriptor>,
    /// The sealed memfds of the out-of-line regions, after every right's descriptors.
    ool: Vec<OwnedFd>,
    undo: Vec<Undo>,
    commit: Vec<Commit>,
}

/// A file descriptor that travels: shared with the sender's table (send rights, moved
/// rights), or made for this message (send-once rights, a call's own reply right and
/// pipe).
enum PlanFd {
    Shared(Arc<OwnedFd>),
    Owned(OwnedFd),
}

impl PlanFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            PlanFd::Shared(fd) => fd.as_fd(),
            PlanFd::Owned(fd) => fd.as_fd(),
        }
    }
}

/// How to put back what a failed send took.
pub(crate) enum Undo {
    Restore(Name, Entry),
    RemoveConn(Arc<RecvPort>, u64),
    /// Put a packed receive right back, and back in the port set it left.
    Unpack(Arc<RecvPort>, Packed, Option<Arc<PortSet>>),
}

/// What a successful send takes for good.
pub(crate) enum Commit {
    Release(Name),
    DropSendUref(Name),
    MadeSend(Arc<RecvPort>),
    /// The receive right left; its call channels' watches (ids) go with it.
    Moved(Arc<RecvPort>, Vec<u64>),
    /// A call channel's reply right left for another task: the port stops keeping the
    /// channel, so the reply's new holder is the only one that can write to it.
    ForgetChannel(Weak<RecvPort>, ChannelKey, Arc<OwnedFd>),
}

impl Plan {
    /// The plan of a plain message without a reply right.
    #[inline]
    pub(crate) fn new() -> Plan {
        Plan { reply: ReplyKind::None, token: 0, more: None }
    }

    fn more(&mut self) -> &mut Rights {
        self.more.get_or_insert_with(Box::default)
    }

    /// Whether the message is in-line data only: no reply right, no descriptors.
    #[inline]
    pub(crate) fn is_plain(&self) -> bool {
        self.reply == ReplyKind::None && self.is_bare()
    }

    /// Whether nothing travels beside the header and the in-line data: no descriptor,
    /// no file descriptor.
    #[inline]
    pub(crate) fn is_bare(&self) -> bool {
        self.more.as_ref().is_none_or(|m| m.fds.is_empty() && m.descriptors.is_empty())
    }

    /// The body's descriptors, in wire order.
    #[inline]
    pub(crate) fn descriptors(&self) -> &[Descriptor] {
        self.more.as_ref().map_or(&[], |m| &m.descriptors)
    }

    /// A reply right the call made itself (its descriptor goes first on the wire).
    pub(crate) fn own_reply(&mut self, fd: OwnedFd, kind: ReplyKind) {
        self.push_owned(fd);
        self.reply = kind;
    }

    pub(crate) fn push_owned(&mut self, fd: OwnedFd) {
        self.more().fds.push(PlanFd::Owned(fd));
    }

    fn push_shared(&mut self, fd: Arc<OwnedFd>) {
        self.more().fds.push(PlanFd::Shared(fd));
    }

    fn push_descriptor(&mut self, d: Descriptor) {
        self.more().descriptors.push(d);
    }

    /// An out-of-line region, sealed: its memfd travels after every right's.
    pub(crate) fn push_region(&mut self, fd: OwnedFd, len: u64) {
        let more = self.more();
        more.ool.push(fd);
        more.descriptors.push(Descriptor::Ool { len });
    }

    fn push_undo(&mut self, u: Undo) {
        self.more().undo.push(u);
    }

    fn push_commit(&mut self, c: Commit) {
        self.more().commit.push(c);
    }

    /// Whether a delivered message leaves anything to take for good.
    #[inline]
    pub(crate) fn has_commits(&self) -> bool {
        self.more.as_ref().is_some_and(|m| !m.commit.is_empty())
    }

    /// What to put back if the send fails.
    #[inline]
    pub(crate) fn take_undo(&mut self) -> Vec<Undo> {
        self.more.as_mut().map_or_else(Vec::new, |m| std::mem::take(&mut m.undo))
    }

    /// What to take for good now that the message was delivered.
    #[inline]
    pub(crate) fn take_commit(&mut self) -> Vec<Commit> {
        self.more.as_mut().map_or_else(Vec::new, |m| std::mem::take(&mut m.commit))
    }

    /// The file descriptors in wire order: the reply slot's, the big in-line memfd
    /// (`big`), the rights', then the out-of-line regions'.
    #[inline]
    pub(crate) fn wire_fds<'a>(&'a self, big: Option<BorrowedFd<'a>>) -> Vec<BorrowedFd<'a>> {
        let Some(m) = &self.more else {
            return match big {
                Some(big) => vec![big],
                None => Vec::new(),
            };
        };
        let mut fds = Vec::with_capacity(m.fds.len() + m.ool.len() + usize::from(big.is_some()));
        let (reply, body) = m.fds.split_at(self.reply.fds().min(m.fds.len()));
        fds.extend(reply.iter().map(PlanFd::as_fd));
        fds.extend(big);
        fds.extend(body.iter().map(PlanFd::as_fd));
        fds.extend(m.ool.iter().map(|f| f.as_fd()));
        fds
    }
}

impl Space {
    /// Resolve the reply right a message names by its disposition.
    pub(crate) fn resolve_reply(&self, t: &mut Table, arg: PortArg, plan: &mut Plan) -> Result<(), SendError> {
        plan.reply = match self.resolve_arg(t, arg, plan)? {
            Descriptor::Send => ReplyKind::Send,
            Descriptor::SendOnce => ReplyKind::SendOnce,
            _ => return Err(SendError::InvalidRight(arg.name)),
        };
        Ok(())
    }

    /// Resolve the rights of a message's body by their dispositions.
    pub(crate) fn resolve_body(&self, t: &mut Table, ports: &[PortArg], plan: &mut Plan) -> Result<(), SendError> {
        for &p in ports {
            let d = self.resolve_arg(t, p, plan)?;
            plan.push_descriptor(d);
        }
        Ok(())
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
                plan.push_commit(Commit::DropSendUref(name));
                Ok(Descriptor::Send)
            }
            (Disposition::MakeSend, Entry::Port(PortEntry { recv: Some(p), .. })) => {
                let p = p.clone();
                let (fd, _, new_conn) = p.lock().send_end().map_err(SendError::Os)?;
                if let Some(c) = new_conn {
                    plan.push_undo(Undo::RemoveConn(p.clone(), c));
                }
                plan.push_shared(fd);
                plan.push_commit(Commit::MadeSend(p));
                Ok(Descriptor::Send)
            }
            (Disposition::MakeSendOnce, Entry::Port(PortEntry { recv: Some(p), .. })) => {
                let p = p.clone();
                let (fd, conn) = p.lock().send_once_end().map_err(SendError::Os)?;
                plan.push_undo(Undo::RemoveConn(p, conn));
                plan.push_owned(fd);
                Ok(Descriptor::SendOnce)
            }
            (Disposition::MoveSendOnce, Entry::SendOnce(_)) => {
                let e = t.reserve(name).map_err(|_| bad())?;
                let Entry::SendOnce(so) = &e else { unreachable!("matched a send-once entry") };
                if let Some((port, key)) = so.channel {
                    // The right answers on a client's call channel. The task it goes to
                    // may write this one reply; the port stops keeping the channel, so
                    // the reply comes without the kept flag and the client's next call
                    // makes a new one. (If the receive right has left this space, its
                    // new holder keeps the channel until the client lets go of it.)
                    if let Some(p) = t.receive_right_by_id(port) {
                        plan.push_commit(Commit::ForgetChannel(Arc::downgrade(&p), key, so.fd.clone()));
                    }
                }
                plan.push_shared(so.fd.clone());
                plan.push_undo(Undo::Restore(name, e));
                plan.push_commit(Commit::Release(name));
                Ok(Descriptor::SendOnce)
            }
            (Disposition::MoveReceive, Entry::Port(PortEntry { recv: Some(p), .. })) => {
                let p = p.clone();
                let set = p.lock().set.as_ref().and_then(Weak::upgrade);
                if let Some(set) = &set {
                    set.remove(&p);
                }
                let packed = p.lock().pack(&p);
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
                plan.push_undo(Undo::Unpack(p.clone(), packed, set));
                plan.push_commit(Commit::Moved(p, watches));
                Ok(Descriptor::Receive(info))
            }
            _ => Err(bad()),
        }
    }
}

impl Inner {
    /// Put back what a failed send took, last taken first.
    pub(crate) fn undo(&self, t: &mut Table, undo: Vec<Undo>) {
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

    /// Take for good what a successful send took.
    pub(crate) fn commit(&self, t: &mut Table, commits: Vec<Commit>) {
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
                                self.pool.forget(p.ident);
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
}
