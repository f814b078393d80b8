//! Call channels (`doc/ipc.md`, *Calls*): the connection a client makes once per
//! destination port for the replies to its calls, and the reply pipe beside it.
//!
//! - **The client's side** is the pool ([`Pool`]): a space keeps its idle channels by
//!   the destination port's identity, takes one for a call and puts it back when the
//!   reply says the port keeps it ([`Pooled`]). Beside them it keeps the port's queue
//!   page, found once ([`SenderQueue`]).
//! - **The port's side**: a channel offered with a request is kept under (the client's
//!   pid as the kernel stamped it, the client's token) if the kernel vouches for the
//!   pid ([`Inner::accept_offer`]); later requests name it by token ([`kept`]); the
//!   notifier forgets it when the client's end hangs up; a moved receive right finds
//!   each one's key again from the kernel ([`Inner::rekey_moved`]).
//! - **The reply pipe**: a plain reply goes through it ([`reply_through_pipe`]);
//!   anything else goes on the connection, and a word on the pipe sends the caller
//!   there ([`point_to_connection`]).

use std::collections::HashMap;
use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ictus_abi::{Datagram, Head, Name, NotifyId, PipeMessage, ReplyKind, HEAD_MAX, PIPE_MESSAGE_MAX};

use crate::message::Credentials;
use crate::port::{Channel, ChannelKey, Ident, KeyHash, RecvPort};
use crate::queue::{QueuePage, Settings};
use crate::space::{Inner, Space};
use crate::sys;
use crate::table::SendOnce;

/// Most idle call channels kept per destination port.
const CHANNELS_PER_PORT: usize = 8;

/// A call channel of this space's, idle between calls: the end replies arrive on, and
/// the token the port knows it by.
pub(crate) struct Pooled {
    pub(crate) fd: OwnedFd,
    pub(crate) token: u32,
    /// The receive time-out set on `fd` (`None`: none).
    pub(crate) timer: Option<Duration>,
    /// The read end of the channel's reply pipe, until the port lets go of its write end.
    pub(crate) pipe: Option<OwnedFd>,
    /// Who sent the last reply on `fd`, as the kernel said: the sender a reply on the
    /// pipe is credited to (only the port's holder has the pipe's write end).
    pub(crate) replier: Option<Credentials>,
}

/// A new call channel to offer with a request.
pub(crate) struct Offer {
    /// This space's side, to pool once the port keeps it.
    pub(crate) pooled: Pooled,
    /// The end that travels to the port.
    pub(crate) far_end: OwnedFd,
    /// The reply pipe's write end that travels beside it, if a pipe could be made.
    pub(crate) pipe: Option<OwnedFd>,
}

impl Offer {
    /// Make a channel: ours is the receive end (`SO_PASSCRED` on, for the replies'
    /// credentials); its inode number is the token the server will know the channel
    /// by, and can find again from the kernel if the port moves. Plain replies will
    /// come through a pipe beside it, if one can be made.
    pub(crate) fn new() -> rustix::io::Result<Offer> {
        let (far_end, ours) = sys::connection()?;
        let token = sys::channel_token(ours.as_fd())?;
        let (pipe, pipe_w) = sys::reply_pipe().map_or((None, None), |(r, w)| (Some(r), Some(w)));
        Ok(Offer { pooled: Pooled { fd: ours, token, timer: None, pipe, replier: None }, far_end, pipe: pipe_w })
    }
}

/// A destination port's queue page as a sender found it, with the settings its note
/// said when the page's `version` read `seen`.
pub(crate) struct SenderQueue {
    pub(crate) page: Arc<QueuePage>,
    pub(crate) settings: Settings,
    pub(crate) seen: u32,
    /// The page memfd's identity, to tell a note about it from one about another.
    pub(crate) file: Ident,
}

impl SenderQueue {
    /// Find the queue page of the port `send_end` reaches (see `QueuePage::find`).
    pub(crate) fn find(send_end: BorrowedFd<'_>) -> Option<SenderQueue> {
        let (page, settings, file) = QueuePage::find(send_end)?;
        let seen = page.words().version.load(Ordering::Acquire);
        Some(SenderQueue { page: Arc::new(page), settings, seen, file })
    }

    /// Whether the settings may be out of date: the page's version moved since.
    #[inline]
    pub(crate) fn stale(&self) -> bool {
        self.page.words().version.load(Ordering::Acquire) != self.seen
    }

    /// The same page with the settings its note says now (or `None`: find it again).
    pub(crate) fn refreshed(&self, send_end: BorrowedFd<'_>) -> Option<SenderQueue> {
        let seen = self.page.words().version.load(Ordering::Acquire);
        let (settings, file) = QueuePage::read_note(send_end)?;
        if file != self.file {
            return SenderQueue::find(send_end);
        }
        Some(SenderQueue { page: self.page.clone(), settings, seen, file })
    }
}

/// What a space keeps for one destination port: idle call channels and the port's
/// queue page.
#[derive(Default)]
struct ForPort {
    channels: Vec<Pooled>,
    queue: Option<Arc<SenderQueue>>,
}

/// A space's idle call channels and destination queue pages, by the destination port's
/// identity.
#[derive(Default)]
pub(crate) struct Pool {
    by_port: Mutex<HashMap<Ident, ForPort, KeyHash>>,
    /// Bumped whenever the space forgets its channels to a port, so that a call that
    /// was under way meanwhile does not put its channel back.
    forgotten: AtomicU64,
}

impl Pool {
    /// The pool's generation, read before taking a channel for a call and given back
    /// to [`Pool::put`].
    pub(crate) fn generation(&self) -> u64 {
        self.forgotten.load(Ordering::Acquire)
    }

    /// A pooled channel to the port `ident`, if there is one, and the port's queue page
    /// if it was found before. The port's place in the pool stays (empty, if need be)
    /// while the call is under way, so that forgetting the port meanwhile is seen by
    /// [`Pool::put`].
    #[inline]
    pub(crate) fn take(&self, ident: Ident) -> (Option<Pooled>, Option<Arc<SenderQueue>>) {
        let mut pool = self.by_port.lock().unwrap_or_else(|e| e.into_inner());
        let entry = pool.entry(ident).or_default();
        (entry.channels.pop(), entry.queue.clone())
    }

    /// The port `ident`'s queue page, if it was found before.
    #[inline]
    pub(crate) fn queue(&self, ident: Ident) -> Option<Arc<SenderQueue>> {
        self.by_port.lock().unwrap_or_else(|e| e.into_inner()).get(&ident).and_then(|e| e.queue.clone())
    }

    /// Keep the port `ident`'s queue page, found since `generation`, unless the space
    /// forgot the port meanwhile (so that a page is never kept for a port the space no
    /// longer sends to).
    pub(crate) fn keep_queue(&self, ident: Ident, queue: Arc<SenderQueue>, generation: u64) {
        let mut pool = self.by_port.lock().unwrap_or_else(|e| e.into_inner());
        if self.forgotten.load(Ordering::Acquire) == generation {
            pool.entry(ident).or_default().queue = Some(queue);
        }
    }

    /// Put a channel back for the next call, unless the space forgot channels since
    /// `generation` (it let go of a send right meanwhile: a pooled channel would keep
    /// the port from seeing no senders).
    pub(crate) fn put(&self, ident: Ident, chan: Pooled, generation: u64) {
        let mut pool = self.by_port.lock().unwrap_or_else(|e| e.into_inner());
        if self.forgotten.load(Ordering::Acquire) != generation {
            return;
        }
        let Some(v) = pool.get_mut(&ident) else { return };
        if v.channels.len() < CHANNELS_PER_PORT {
            v.channels.push(chan);
        }
    }

    /// The space no longer holds a send right to the port `ident`: close its call
    /// channels too, since a channel reaches the port like a send right, and unmap its
    /// queue page.
    pub(crate) fn forget(&self, ident: Option<Ident>) {
        if let Some(ident) = ident {
            let gone = {
                let mut pool = self.by_port.lock().unwrap_or_else(|e| e.into_inner());
                let gone = pool.remove(&ident);
                if gone.is_some() {
                    self.forgotten.fetch_add(1, Ordering::Release);
                }
                gone
            };
            drop(gone);
        }
    }
}

/// The token under which a port keeps a hung-up call channel that came with a moved
/// receive right: the kernel still names the channel's creator (`SO_PEERCRED`) but no
/// longer the inode of its closed end, so the real token cannot be found again. No
/// request can name it (a header's token is never zero).
pub(crate) const UNKNOWN_TOKEN: u32 = 0;

/// The reply right of a request naming a call channel by `token`: the channel the
/// port keeps under the sender's pid as the kernel stamped it, so a task can name only
/// channels it offered itself, whatever token it guesses. Failing that, a hung-up
/// channel of the same pid that came with a moved receive right, whose token is not
/// known ([`Inner::rekey_moved`]): the request of a caller that hung up before the move
/// is delivered with a reply right that leads nowhere, as before it. `None`: the port
/// keeps no such channel.
#[inline]
pub(crate) fn kept(port: &RecvPort, sender: Credentials, token: u32) -> Option<SendOnce> {
    let st = port.lock();
    let (&key, c) = st
        .channels
        .get_key_value(&(sender.pid, token))
        .or_else(|| st.channels.get_key_value(&(sender.pid, UNKNOWN_TOKEN)))?;
    Some(SendOnce { fd: c.fd.clone(), channel: Some((port.id, key)), pipe: c.pipe.clone() })
}

/// Whether an offered call channel is what it claims, a connection of the client's
/// own, and not a way back into this port: not the port's send end (which would make
/// the port its own sender for ever, defeating no-senders, and loop replies back in as
/// requests).
pub(crate) fn is_foreign(port: &RecvPort, ch: BorrowedFd<'_>) -> bool {
    let Ok(id) = sys::identity(ch) else { return false };
    let st = port.lock();
    st.ident != Some(id) && st.conns.iter().all(|c| sys::identity(c.fd.as_fd()).is_ok_and(|own| own != id))
}

impl Inner {
    /// A client's new call channel, offered with a request on `port`'s main
    /// connection: the reply right for this request. The port keeps the channel for
    /// the client's later calls only under a pid the kernel can vouch for again (the
    /// socket's creator, `SO_PEERCRED`, must be the sender), so that a moved receive
    /// right finds the same key; otherwise it answers this call alone.
    pub(crate) fn accept_offer(
        &self,
        space: &Space,
        port: &Arc<RecvPort>,
        sender: Credentials,
        token: u32,
        fd: OwnedFd,
        pipe: Option<OwnedFd>,
    ) -> SendOnce {
        let fd = Arc::new(fd);
        let key = (sender.pid, token);
        let kept = sender.pid != 0
            && sys::peer_pid(fd.as_fd()) == Some(sender.pid)
            && self.keep_channel(space, port, key, fd.clone(), pipe.map(Arc::new));
        // This first reply goes on the connection, so that the caller learns from the
        // kernel who answers; later ones may take the pipe.
        SendOnce { fd, channel: kept.then_some((port.id, key)), pipe: None }
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
        if let Some(old) = st.add_channel(key, Channel { fd, pipe, watch: Some(watch), hung_up: false }) {
            // Only the same client could have used the key: its older channel goes.
            if old.hung_up {
                p.hung_up.fetch_sub(1, Ordering::SeqCst);
            } else if let Some(w) = old.watch {
                notifier.cancel(w);
            }
        }
        true
    }

    /// Call channels that came with a moved receive right: find each one's key again
    /// from the kernel (its creator's pid, the inode of the client's end), so the
    /// clients' requests already queued, and later ones, are answered on them. Their
    /// reply pipes stayed behind: the clients see the pipes close and take replies on
    /// the connection from now on.
    ///
    /// A channel whose client's end is closed (`POLLHUP`) has no inode to find, but may
    /// still have requests queued behind it, which Mach delivers with the port: it is
    /// kept hung up, exactly as [`Inner::channel_hung_up`] leaves one, under its
    /// creator's pid and [`UNKNOWN_TOKEN`] (one per pid: they all lead nowhere), until
    /// nothing sent before the move can be unread ([`Inner::forget_hung_up_channels`]).
    /// One the kernel cannot place otherwise is closed: its client sees the hang-up.
    pub(crate) fn rekey_moved(&self, space: &Space, port: &Arc<RecvPort>, channels: Vec<OwnedFd>) {
        let mut hung_up = false;
        for fd in channels {
            let Some(pid) = sys::peer_pid(fd.as_fd()).filter(|&p| p != 0) else { continue };
            match sys::peer_inode(fd.as_fd()).ok().flatten() {
                Some(ino) => {
                    self.keep_channel(space, port, (pid, sys::token_of_inode(ino)), Arc::new(fd), None);
                }
                None if sys::hung_up(fd.as_fd()) => {
                    let mut st = port.lock();
                    if !st.dead && !st.channels.contains_key(&(pid, UNKNOWN_TOKEN)) {
                        let c = Channel { fd: Arc::new(fd), pipe: None, watch: None, hung_up: true };
                        st.add_channel((pid, UNKNOWN_TOKEN), c);
                        port.hung_up.fetch_add(1, Ordering::SeqCst);
                        hung_up = true;
                    }
                }
                None => {}
            }
        }
        if hung_up {
            self.forget_hung_up_channels(port);
        }
    }

    /// Called by the notifier when the client's end of a call channel hung up. Requests
    /// the client sent before may still wait on the main connection, or be taken and
    /// not yet looked up: Mach delivers them (their reply rights lead nowhere), so the
    /// channel stays, marked hung up and without its reply pipe, until nothing from
    /// before the hang-up can be unread ([`Inner::forget_hung_up_channels`]). If
    /// receivers wait on an empty queue, a doorbell wakes one to forget it at once.
    pub(crate) fn channel_hung_up(&self, p: &Arc<RecvPort>, key: ChannelKey, fd: &Arc<OwnedFd>) {
        let marked = {
            let mut st = p.lock();
            match st.channels.get_mut(&key) {
                Some(c) if Arc::ptr_eq(&c.fd, fd) && !c.hung_up => {
                    c.hung_up = true;
                    c.watch = None;
                    // A reply must not write into a pipe nobody reads (`SIGPIPE`).
                    c.pipe = None;
                    p.hung_up.fetch_add(1, Ordering::SeqCst);
                    true
                }
                _ => false,
            }
        };
        if marked {
            if !self.forget_hung_up_channels(p) {
                let st = p.lock();
                if st.mains_hold_no_request() {
                    st.ring_doorbell();
                }
            }
            self.check_no_senders(p);
        }
    }

    /// Forget the call channels kept hung up, once nothing their clients sent can still
    /// be unread: no receive is under way on the port (one could hold a request taken
    /// and not yet looked up) and no main connection's kernel queue holds a request
    /// (`SIOCINQ`: fewer bytes than a header; a doorbell may wait there). A client's requests are queued before its channel can hang up (an
    /// `AF_UNIX` send is complete when it returns), so none can come later. Returns
    /// whether none is left. Called on a hang-up and when the last receive under way
    /// ends while some channel is hung up: one `ioctl` per main connection, and only
    /// then.
    pub(crate) fn forget_hung_up_channels(&self, p: &Arc<RecvPort>) -> bool {
        let mut st = p.lock();
        if p.hung_up.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if p.reading.load(Ordering::SeqCst) != 0 || !st.mains_hold_no_request() {
            return false;
        }
        st.channels.retain(|_, c| !c.hung_up);
        p.hung_up.store(0, Ordering::SeqCst);
        true
    }
}

/// A receive under way on a port (`RecvPort::reading`), from before it can take a
/// datagram until what it took is checked. The last one to end forgets the call
/// channels kept hung up, if nothing they sent can still be unread.
pub(crate) struct Reading<'a> {
    inner: &'a Inner,
    port: &'a Arc<RecvPort>,
}

impl<'a> Reading<'a> {
    /// Count a receive as under way: called with the port's state locked, so that a
    /// hang-up seen under the same lock either sees it or happened before it began.
    #[inline]
    pub(crate) fn begin(inner: &'a Inner, port: &'a Arc<RecvPort>) -> Reading<'a> {
        port.reading.fetch_add(1, Ordering::SeqCst);
        Reading { inner, port }
    }
}

impl Drop for Reading<'_> {
    #[inline]
    fn drop(&mut self) {
        // Sequentially consistent with the hang-up's mark and look: either the
        // notifier sees no receive under way, or the last receive sees the mark.
        if self.port.reading.fetch_sub(1, Ordering::SeqCst) == 1 && self.port.hung_up.load(Ordering::SeqCst) != 0 {
            self.inner.forget_hung_up_channels(self.port);
        }
    }
}

/// Send one reply through a kept call channel's reply pipe, if it has one and the reply
/// fits one pipe write; whether it went.
pub(crate) fn reply_through_pipe(pipe: Option<&OwnedFd>, bufs: &[IoSlice<'_>]) -> bool {
    let len: usize = bufs.iter().map(|b| b.len()).sum();
    pipe.is_some_and(|p| len <= PIPE_MESSAGE_MAX && sys::pipe_write(p.as_fd(), bufs).is_ok())
}

/// A reply on a kept call channel went on the connection: the word on the channel's
/// reply pipe, if any, that sends the caller there.
pub(crate) fn point_to_connection(pipe: Option<&OwnedFd>, kept: bool) {
    if let Some(p) = pipe {
        let _ = sys::pipe_write(p.as_fd(), &[IoSlice::new(&PipeMessage::on_socket(kept))]);
    }
}

/// A kept call channel's reply right was destroyed unused: tell the caller, whose
/// channel stays open for its next call, with a send-once notification (through the
/// pipe if it can, else on the connection, never waiting).
pub(crate) fn reply_unused(fd: &OwnedFd, pipe: Option<&OwnedFd>) {
    notice(fd, pipe, true, NotifyId::SendOnce, 0);
}

/// A request was refused unread because it is larger than the port takes: tell the
/// caller on its reply right (`fd`, or the kept channel's pipe), with the port's limit,
/// never waiting. `kept` as the channel is.
pub(crate) fn too_large(fd: &OwnedFd, pipe: Option<&OwnedFd>, kept: bool, limit: u32) {
    notice(fd, pipe, kept, NotifyId::TooLarge, limit);
}

/// A notification-like word from the nucleus on a reply right: `id`, and a body naming
/// no port with `count`.
fn notice(fd: &OwnedFd, pipe: Option<&OwnedFd>, kept: bool, id: NotifyId, count: u32) {
    let body = NotifyId::body(Name::NULL, count);
    let mut head = [0u8; HEAD_MAX];
    let spec = Head { kept, ..Head::new(id.id(), ReplyKind::None) };
    if let Ok((_, n)) = Datagram::encode_head(spec, &[], body.len(), 0, &mut head) {
        let bufs = [IoSlice::new(&head[..n]), IoSlice::new(&body)];
        if !reply_through_pipe(pipe, &bufs) {
            let _ = sys::send(fd.as_fd(), &bufs, &[], Some(Instant::now()));
        }
    }
}
