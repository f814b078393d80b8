//! The send path: resolve, plan, transmit, then commit or undo.
//!
//! 1. **Resolve** the destination into a [`Target`] (a shared send end, or a send-once
//!    right taken out of the table while it is used) and every right the message names
//!    into a [`Plan`] (`plan`): nothing is taken for good yet.
//! 2. **Route**: [`Route::choose`] is the one place that decides how the message
//!    leaves — one write to a kept call channel's reply pipe, one datagram, or one
//!    datagram with the in-line data in a sealed memfd beside it — and
//!    [`Route::after_refusal`] the one place that decides what to try when the kernel
//!    refuses a route.
//! 3. **Transmit**: seal out-of-line regions, encode the head, hand the message to the
//!    kernel along the route; the outcome is a [`Delivery`].
//! 4. **Commit** what the plan took (a moved right leaves the table, a made send right
//!    counts) if it was delivered; otherwise **undo** it all, and a dead destination
//!    becomes a dead name.
//!
//! `send` and `call` both go through [`Space::send_message`]; a call only supplies its
//! own reply right ([`ReplySlot`]) and, often, its already resolved destination.

use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use ictus_abi::{
    Datagram, Descriptor, Head, Header, Name, ReplyKind, DESCRIPTOR_LEN, HEADER_LEN, HEAD_MAX, INLINE_DATAGRAM_MAX,
    PIPE_MESSAGE_MAX,
};
use rustix::io::Errno;

use crate::channel::{point_to_connection, reply_through_pipe};
use crate::error::SendError;
use crate::message::{Message, SendOptions};
use crate::plan::Plan;
use crate::space::Space;
use crate::sys::{self, SendOutcome};
use crate::table::{Entry, PortEntry, SendOnce, Table};

/// Heads of messages with up to four descriptors are built on the stack.
const SMALL_HEAD: usize = HEADER_LEN + 4 * DESCRIPTOR_LEN;

/// The reply right a message carries, as its sender supplies it.
pub(crate) enum ReplySlot {
    /// The message's own `reply`, a right of the sender's taken by its disposition (or
    /// none).
    FromMessage,
    /// A send-once right made for this call alone.
    Once(OwnedFd),
    /// A new call channel offered to the server, with its reply pipe's write end (if
    /// one could be made) and its token.
    Channel { fd: OwnedFd, pipe: Option<OwnedFd>, token: u32 },
    /// Answer on the call channel the server keeps under this token.
    OnChannel(u32),
}

/// Where a message goes, resolved.
pub(crate) enum Target {
    /// A send end shared by every send right to the port.
    Shared(Arc<OwnedFd>),
    /// A send-once right, taken out of the table (its name reserved) until the send
    /// commits or undoes, so that no other thread can use it too.
    Once(SendOnce),
}

impl Target {
    #[inline]
    fn fd(&self) -> &Arc<OwnedFd> {
        match self {
            Target::Shared(fd) => fd,
            Target::Once(so) => &so.fd,
        }
    }

    /// Whether this is a reply right on a call channel the port keeps: the reply says
    /// so, and the caller pools the channel.
    #[inline]
    fn kept(&self) -> bool {
        matches!(self, Target::Once(so) if so.channel.is_some())
    }

    /// The kept call channel's reply pipe, if it has one.
    #[inline]
    fn pipe(&self) -> Option<&OwnedFd> {
        match self {
            Target::Once(so) => so.pipe.as_deref(),
            Target::Shared(_) => None,
        }
    }

    /// Give a send-once right back to the table, under its reserved name. Returns the
    /// send end, to turn the name into a dead name if its port has died.
    fn put_back(self, t: &mut Table, dest: Name) -> Arc<OwnedFd> {
        match self {
            Target::Shared(fd) => fd,
            Target::Once(so) => {
                let fd = so.fd.clone();
                t.restore(dest, Entry::SendOnce(so));
                fd
            }
        }
    }
}

/// How a message leaves. Chosen in one place, [`Route::choose`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// One write to a kept call channel's reply pipe: a reply of in-line data only that
    /// fits `PIPE_BUF` (about half a datagram's cost).
    Pipe,
    /// One datagram carrying the in-line data.
    Datagram,
    /// One datagram, the in-line data copied into a sealed memfd beside it.
    BigInline,
}

impl Route {
    /// The route for a message whose plan is made and whose out-of-line regions are
    /// sealed.
    #[inline]
    fn choose(msg: &Message, plan: &Plan, target: &Target) -> Route {
        if msg.data.len() > INLINE_DATAGRAM_MAX {
            Route::BigInline
        } else if target.pipe().is_some() && plan.is_plain() && HEADER_LEN + msg.data.len() <= PIPE_MESSAGE_MAX {
            Route::Pipe
        } else {
            Route::Datagram
        }
    }

    /// The route to try when this one was refused: the pipe is full or its reader
    /// gone (the reply goes on the connection, where a word on the pipe sends the
    /// caller); the port's buffer can never hold the datagram (the in-line data goes in
    /// a memfd). `None`: nothing else can carry it.
    fn after_refusal(self, msg: &Message) -> Option<Route> {
        match self {
            Route::Pipe => Some(Route::Datagram),
            Route::Datagram if !msg.data.is_empty() => Some(Route::BigInline),
            Route::Datagram | Route::BigInline => None,
        }
    }
}

/// How a transmission ended. Anything else is an error of the send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    /// The kernel took the message.
    Sent,
    /// The destination's queue stayed full until the deadline.
    QueueFull,
    /// The destination's receive right is gone.
    PortDead,
}

impl Space {
    /// Send a message to the port named by `dest` (a send or send-once right; a
    /// receive right sends to its own port).
    ///
    /// Rights in the message are taken by their dispositions only if the send
    /// succeeds. Out-of-line buffers are moved out of `msg` in every case.
    pub fn send(&self, dest: Name, msg: &mut Message, opts: SendOptions) -> Result<(), SendError> {
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        self.send_message(dest, None, msg, ReplySlot::FromMessage, deadline)
    }

    /// The send path: resolve (unless the caller resolved the destination already),
    /// transmit, then commit or undo.
    pub(crate) fn send_message(
        &self,
        dest: Name,
        target: Option<Target>,
        msg: &mut Message,
        reply: ReplySlot,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let mut plan = Plan::new();
        let target = self.resolve(dest, target, msg, reply, &mut plan)?;
        let delivery = self.transmit(&target, msg, &mut plan, deadline);
        self.finish(dest, target, &mut plan, delivery)
    }

    /// Resolve the destination and every right the message names into `plan`. On
    /// failure nothing has been taken.
    #[inline]
    fn resolve(
        &self,
        dest: Name,
        target: Option<Target>,
        msg: &Message,
        reply: ReplySlot,
        plan: &mut Plan,
    ) -> Result<Target, SendError> {
        match reply {
            ReplySlot::FromMessage => {}
            ReplySlot::OnChannel(token) => {
                plan.token = token;
                plan.reply = ReplyKind::OnChannel;
            }
            own => plan_own_reply(own, plan),
        }
        let names_rights = msg.reply.is_some() || !msg.ports.is_empty();
        match target {
            // Nothing to look up: the common case takes no lock.
            Some(target) if !names_rights => Ok(target),
            None if !names_rights => resolve_target(&mut self.table(), dest),
            target => self.resolve_rights(dest, target, msg, plan),
        }
    }

    /// [`Space::resolve`] for a message that names rights: the destination (if need
    /// be) and the rights under one lock of the table.
    #[inline(never)]
    fn resolve_rights(
        &self,
        dest: Name,
        target: Option<Target>,
        msg: &Message,
        plan: &mut Plan,
    ) -> Result<Target, SendError> {
        // No liveness check here: the send itself finds a dead port (EPIPE).
        let mut t = self.table();
        let target = match target {
            Some(target) => target,
            None => resolve_target(&mut t, dest)?,
        };
        let resolved = match msg.reply {
            Some(r) => self.resolve_reply(&mut t, r, plan),
            None => Ok(()),
        }
        .and_then(|()| self.resolve_body(&mut t, &msg.ports, plan));
        if let Err(e) = resolved {
            self.inner.undo(&mut t, plan.take_undo());
            target.put_back(&mut t, dest);
            return Err(e);
        }
        Ok(target)
    }

    /// Seal the out-of-line regions, then hand the message to the kernel along the
    /// chosen route, and along the next one while a route is refused.
    #[inline]
    fn transmit(
        &self,
        target: &Target,
        msg: &mut Message,
        plan: &mut Plan,
        deadline: Option<Instant>,
    ) -> Result<Delivery, SendError> {
        if !msg.ool.is_empty() {
            seal_regions(msg, plan)?;
        }
        let route = Route::choose(msg, plan, target);
        if route == Route::BigInline || !plan.is_bare() {
            return transmit_from(route, target, msg, plan, deadline);
        }
        // The common case: in-line data in the datagram (or the pipe), a header and
        // nothing else.
        let header = plain_head(head(msg, plan, target), msg.data.len(), 0);
        match attempt(route, target, &[IoSlice::new(&header), IoSlice::new(&msg.data)], &[], deadline)? {
            Attempt::Done(delivery) => Ok(delivery),
            Attempt::Refused => {
                let next = route.after_refusal(msg).ok_or(SendError::Os(Errno::MSGSIZE))?;
                transmit_from(next, target, msg, plan, deadline)
            }
        }
    }

    /// Commit what the plan took if the message was delivered; otherwise undo it all,
    /// and turn a destination whose port has died into a dead name.
    #[inline]
    fn finish(
        &self,
        dest: Name,
        target: Target,
        plan: &mut Plan,
        delivery: Result<Delivery, SendError>,
    ) -> Result<(), SendError> {
        match delivery {
            Ok(Delivery::Sent) => {
                if matches!(target, Target::Once(_)) || plan.has_commits() {
                    self.commit_sent(dest, target, plan);
                }
                Ok(())
            }
            failed => Err(self.undo_failed(dest, target, plan, failed)),
        }
    }

    /// A delivered message: a used send-once right's name is free again, and what the
    /// plan took is taken for good.
    #[inline(never)]
    fn commit_sent(&self, dest: Name, target: Target, plan: &mut Plan) {
        let commits = plan.take_commit();
        let mut t = self.table();
        if let Target::Once(_) = target {
            t.release(dest);
            self.inner.cancel_requests(dest);
        }
        self.inner.commit(&mut t, commits);
    }

    /// A message that was not delivered: everything goes back, and a destination whose
    /// port died becomes a dead name. Returns the send's error.
    #[cold]
    #[inline(never)]
    fn undo_failed(
        &self,
        dest: Name,
        target: Target,
        plan: &mut Plan,
        delivery: Result<Delivery, SendError>,
    ) -> SendError {
        let mut t = self.table();
        self.inner.undo(&mut t, plan.take_undo());
        let fd = target.put_back(&mut t, dest);
        match delivery {
            Ok(Delivery::Sent) => unreachable!("delivered messages are committed"),
            Ok(Delivery::QueueFull) => SendError::TimedOut,
            Ok(Delivery::PortDead) => {
                self.inner.make_dead(&mut t, dest, &fd);
                SendError::InvalidDest(dest)
            }
            Err(e) => e,
        }
    }
}

/// The head a message's header is built from.
#[inline]
fn head(msg: &Message, plan: &Plan, target: &Target) -> Head {
    Head { id: msg.id, reply: plan.reply, token: plan.token, kept: target.kept() }
}

/// What one attempt along a route came to.
enum Attempt {
    /// The kernel took the message, or gave a final answer.
    Done(Delivery),
    /// The route refused the message: try the next.
    Refused,
}

/// Hand the message's head and in-line data (`bufs`) and its descriptors (`fds`) to
/// the kernel along `route`, once.
#[inline]
fn attempt(
    route: Route,
    target: &Target,
    bufs: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
    deadline: Option<Instant>,
) -> Result<Attempt, SendError> {
    if route == Route::Pipe {
        let sent = reply_through_pipe(target.pipe(), bufs);
        return Ok(if sent { Attempt::Done(Delivery::Sent) } else { Attempt::Refused });
    }
    Ok(match sys::send(target.fd().as_fd(), bufs, fds, deadline)? {
        SendOutcome::Sent => {
            // A kept call channel's reply that went on the connection: the word on its
            // pipe that sends the caller there.
            point_to_connection(target.pipe(), target.kept());
            Attempt::Done(Delivery::Sent)
        }
        SendOutcome::WouldBlock => Attempt::Done(Delivery::QueueFull),
        SendOutcome::Dead => Attempt::Done(Delivery::PortDead),
        SendOutcome::TooLarge => Attempt::Refused,
    })
}

/// Transmit from `route` on, each refused route giving way to the next: any message,
/// descriptors, big in-line data and all.
#[inline(never)]
fn transmit_from(
    mut route: Route,
    target: &Target,
    msg: &Message,
    plan: &Plan,
    deadline: Option<Instant>,
) -> Result<Delivery, SendError> {
    let head = head(msg, plan, target);
    let mut big: Option<(OwnedFd, u64)> = None;
    loop {
        if route == Route::BigInline && big.is_none() {
            big = Some(big_inline(&msg.data)?);
        }
        let (inline, big_len) = match &big {
            Some((_, len)) => (&[][..], *len),
            None => (&msg.data[..], 0),
        };
        let (plain, mut small, mut large);
        let bytes: &[u8] = if plan.descriptors().is_empty() {
            plain = plain_head(head, inline.len(), big_len);
            &plain
        } else {
            small = [0u8; SMALL_HEAD];
            large = Vec::new();
            encode_head(head, plan.descriptors(), inline.len(), big_len, &mut small, &mut large)?
        };
        let bufs = [IoSlice::new(bytes), IoSlice::new(inline)];
        let fds = plan.wire_fds(big.as_ref().map(|(fd, _)| fd.as_fd()));
        match attempt(route, target, &bufs, &fds, deadline)? {
            Attempt::Done(delivery) => return Ok(delivery),
            Attempt::Refused => route = route.after_refusal(msg).ok_or(SendError::Os(Errno::MSGSIZE))?,
        }
    }
}

/// A reply right the caller made itself goes first in the plan.
#[inline(never)]
fn plan_own_reply(reply: ReplySlot, plan: &mut Plan) {
    match reply {
        ReplySlot::Once(fd) => plan.own_reply(fd, ReplyKind::SendOnce),
        ReplySlot::Channel { fd, pipe, token } => {
            plan.token = token;
            match pipe {
                Some(pipe) => {
                    plan.own_reply(fd, ReplyKind::ChannelPipe);
                    plan.push_owned(pipe);
                }
                None => plan.own_reply(fd, ReplyKind::Channel),
            }
        }
        ReplySlot::FromMessage | ReplySlot::OnChannel(_) => unreachable!("no reply right of the caller's"),
    }
}

/// Out-of-line regions: give up each mapping, seal the memfd, and plan to send it.
#[inline(never)]
fn seal_regions(msg: &mut Message, plan: &mut Plan) -> Result<(), SendError> {
    for buf in msg.ool.drain(..) {
        let (fd, len) = buf.seal()?;
        plan.push_region(fd, len);
    }
    Ok(())
}

/// The head of a message without descriptors (the common case): the fixed header
/// alone, as `Datagram::encode_head` writes it; its checks hold by construction (the
/// token comes with a channel reply kind, the in-line data fits its route).
#[inline]
fn plain_head(head: Head, inline_len: usize, big_len: u64) -> [u8; HEADER_LEN] {
    let header = Header {
        id: head.id,
        reply: head.reply,
        token: head.token,
        kept: head.kept,
        on_socket: false,
        ndesc: 0,
        nfds: (head.reply.fds() + usize::from(big_len != 0)) as u8,
        inline_len: inline_len as u32,
        big_len,
    };
    let mut out = [0u8; HEADER_LEN];
    header.encode(&mut out);
    out
}

/// The head of a message with descriptors: on the stack for up to four (zeroing the
/// largest possible head costs more than a whole small message), on the heap beyond.
#[inline(never)]
fn encode_head<'a>(
    head: Head,
    descriptors: &[Descriptor],
    inline_len: usize,
    big_len: u64,
    small: &'a mut [u8; SMALL_HEAD],
    large: &'a mut Vec<u8>,
) -> Result<&'a [u8], SendError> {
    let need = HEADER_LEN + descriptors.len() * DESCRIPTOR_LEN;
    let buf: &mut [u8] = if need <= SMALL_HEAD {
        small
    } else {
        large.resize(need.min(HEAD_MAX), 0);
        large
    };
    let (_, n) = Datagram::encode_head(head, descriptors, inline_len, big_len, buf)?;
    Ok(&buf[..n])
}

/// The destination `dest` names: a send right's shared send end, a receive right's
/// send end (sending to one's own port), or a send-once right taken out of the table.
#[inline]
fn resolve_target(t: &mut Table, dest: Name) -> Result<Target, SendError> {
    let invalid = SendError::InvalidDest(dest);
    let port = match t.get(dest).map_err(|_| SendError::InvalidDest(dest))? {
        Entry::Port(PortEntry { send: Some(s), .. }) => return Ok(Target::Shared(s.fd.clone())),
        Entry::Port(PortEntry { recv: Some(p), .. }) => p.clone(),
        Entry::SendOnce(_) => {
            return match t.reserve(dest) {
                Ok(Entry::SendOnce(so)) => Ok(Target::Once(so)),
                _ => Err(invalid),
            }
        }
        _ => return Err(invalid),
    };
    let (fd, _, _) = port.lock().send_end().map_err(SendError::Os)?;
    Ok(Target::Shared(fd))
}

/// In-line data too large for a datagram (or for the port's buffer), copied into a
/// sealed memfd: still two copies, like Mach in-line, and one datagram per message.
#[inline(never)]
fn big_inline(data: &[u8]) -> Result<(OwnedFd, u64), SendError> {
    if data.len() as u64 > ictus_abi::BIG_INLINE_MAX {
        return Err(SendError::Invalid(ictus_abi::DecodeError::BadBigInline(data.len() as u64)));
    }
    let fd = sys::memfd(data.len())?;
    sys::write_all_at(fd.as_fd(), data)?;
    sys::seal(fd.as_fd())?;
    Ok((fd, data.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::PortArg;

    fn shared() -> Target {
        Target::Shared(Arc::new(sys::connection().unwrap().0))
    }

    fn kept_reply(pipe: bool) -> Target {
        let fd = Arc::new(sys::connection().unwrap().0);
        let pipe = pipe.then(|| Arc::new(sys::reply_pipe().unwrap().1));
        Target::Once(SendOnce { fd, channel: Some((1, (2, 3))), pipe })
    }

    #[test]
    fn routes_are_chosen_in_one_place() {
        let plain = Plan::new();
        let small = Message::new(1, vec![0; 100]);
        let page = Message::new(1, vec![0; PIPE_MESSAGE_MAX - HEADER_LEN]);
        let over_a_page = Message::new(1, vec![0; PIPE_MESSAGE_MAX - HEADER_LEN + 1]);
        let huge = Message::new(1, vec![0; INLINE_DATAGRAM_MAX + 1]);
        // A plain reply that fits a pipe write goes through the kept channel's pipe.
        assert_eq!(Route::choose(&small, &plain, &kept_reply(true)), Route::Pipe);
        assert_eq!(Route::choose(&page, &plain, &kept_reply(true)), Route::Pipe);
        assert_eq!(Route::choose(&over_a_page, &plain, &kept_reply(true)), Route::Datagram);
        // No pipe, or not a reply: a datagram.
        assert_eq!(Route::choose(&small, &plain, &kept_reply(false)), Route::Datagram);
        assert_eq!(Route::choose(&small, &plain, &shared()), Route::Datagram);
        // Anything but in-line data goes on the connection.
        let mut with_right = Plan::new();
        with_right.reply = ReplyKind::SendOnce;
        assert_eq!(Route::choose(&small, &with_right, &kept_reply(true)), Route::Datagram);
        let mut with_region = Plan::new();
        with_region.push_region(sys::memfd(1).unwrap(), 1);
        assert_eq!(Route::choose(&small, &with_region, &kept_reply(true)), Route::Datagram);
        // More than a datagram carries: a memfd beside it, whatever the target.
        assert_eq!(Route::choose(&huge, &plain, &kept_reply(true)), Route::BigInline);
        assert_eq!(Route::choose(&huge, &plain, &shared()), Route::BigInline);
    }

    /// The plain header is what `Datagram::encode_head` writes for the same message.
    #[test]
    fn a_plain_head_is_the_wire_encoders() {
        for (reply, token) in [(ReplyKind::None, 0), (ReplyKind::OnChannel, 9), (ReplyKind::SendOnce, 0)] {
            for kept in [false, true] {
                for (inline_len, big_len) in [(0, 0), (64, 0), (INLINE_DATAGRAM_MAX, 0), (0, 100_000)] {
                    let head = Head { id: -3, reply, token, kept };
                    let fast = plain_head(head, inline_len, big_len);
                    let mut wire = [0u8; HEAD_MAX];
                    let (_, n) = Datagram::encode_head(head, &[], inline_len, big_len, &mut wire).unwrap();
                    assert_eq!(&fast[..], &wire[..n], "{reply:?} kept {kept} {inline_len} {big_len}");
                }
            }
        }
    }

    #[test]
    fn a_refused_route_gives_way_to_the_next() {
        let data = Message::new(1, vec![1]);
        let empty = Message::new(1, Vec::new());
        assert_eq!(Route::Pipe.after_refusal(&data), Some(Route::Datagram));
        assert_eq!(Route::Datagram.after_refusal(&data), Some(Route::BigInline));
        // Nothing to move into a memfd, or already there: the send fails.
        assert_eq!(Route::Datagram.after_refusal(&empty), None);
        assert_eq!(Route::BigInline.after_refusal(&data), None);
    }

    /// A port whose buffer is smaller than a datagram: the in-line data goes through a
    /// memfd, and the receiver still gets it whole.
    #[test]
    fn a_datagram_too_large_for_the_port_goes_in_a_memfd() {
        let space = Space::new();
        let port = space.allocate_port_with_send().unwrap();
        space.set_qlimit(port, 1).unwrap();
        let data: Vec<u8> = (0..60_000u32).map(|i| i as u8).collect();
        space.send(port, &mut Message::new(3, data.clone()), SendOptions::default()).unwrap();
        let mut got = crate::Received::new();
        space.receive(port, &mut got, crate::ReceiveOptions::default()).unwrap();
        assert_eq!((got.id, got.data()), (3, &data[..]));
    }

    /// A failed send takes nothing: the rights it named stay, a send-once destination
    /// whose port died becomes a dead name.
    #[test]
    fn a_failed_send_takes_nothing() {
        let space = Space::new();
        let port = space.allocate_port().unwrap();
        let other = space.allocate_port_with_send().unwrap();
        let once = {
            let (name, _) = space.extract_right(&space, port, crate::Disposition::MakeSendOnce).unwrap();
            name
        };
        space.mod_refs(port, crate::RightKind::Receive, -1).unwrap();
        let mut msg = Message::new(1, b"x".to_vec());
        msg.ports.push(PortArg::new(other, crate::Disposition::MoveSend));
        assert!(
            matches!(space.send(once, &mut msg, SendOptions::default()), Err(SendError::InvalidDest(n)) if n == once)
        );
        assert_eq!(space.right_kinds(once).unwrap(), vec![crate::RightKind::DeadName]);
        assert_eq!(space.refs(other, crate::RightKind::Send).unwrap(), 1, "the moved send right stayed");
    }
}
