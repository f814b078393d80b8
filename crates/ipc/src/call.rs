//! Calls (Mach RPC): send a request through the send path with a reply right the call
//! supplies itself, then wait for the reply on it (`doc/ipc.md`, *Calls*).
//!
//! To a send right the reply right is a call channel from the space's pool (or a new
//! one, offered with the request), and the reply comes through the channel's pipe or on
//! the channel; to a send-once right, a send-once connection made for the call alone.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_abi::{Name, NotifyId, PipeMessage, HEADER_LEN, PIPE_MESSAGE_MAX};

use crate::channel::{Offer, Pooled};
use crate::error::{CallError, ReceiveError, SendError};
use crate::incoming::{Arrival, Refused};
use crate::message::{Message, ReceiveOptions, Received, SendOptions};
use crate::port::Ident;
use crate::receive::malformed;
use crate::send::{Queue, ReplySlot, Target};
use crate::space::{Inner, Space};
use crate::sys::{self, RecvOutcome};
use crate::table::{Entry, PortEntry};

impl Space {
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
        let deadline = send.timeout.map(|t| Instant::now() + t);
        // One look at the table: the port's identity (for the channel pool) and, for the
        // common case, the send end.
        let (ident, send_end) = self.peek(dest);
        let Some(ident) = ident else {
            // No port identity (a send-once right): a reply right for this call alone.
            let (s, r) = sys::connection().map_err(SendError::Os)?;
            self.send_message(dest, None, msg, ReplySlot::Once(s), deadline)?;
            return self.inner.wait_reply(self, &r, &mut None, reply, recv).map(|_| ()).map_err(|(e, _)| e);
        };
        let generation = self.inner.pool.generation();
        let (pooled, queue) = self.inner.pool.take(ident);
        let (slot, mut chan) = match pooled {
            Some(chan) => (ReplySlot::OnChannel(chan.token), chan),
            None => {
                let offer = Offer::new().map_err(SendError::Os)?;
                let slot = ReplySlot::Channel { fd: offer.far_end, pipe: offer.pipe, token: offer.pooled.token };
                (slot, offer.pooled)
            }
        };
        let target = send_end.map(|fd| Target::Shared(fd, Queue::Right(ident, queue)));
        self.send_message(dest, target, msg, slot, deadline)?;
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
            self.inner.pool.put(ident, chan, generation);
        }
        result
    }

    /// The identity of the port `dest` names, and its shared send end if it is a send
    /// right.
    fn peek(&self, dest: Name) -> (Option<Ident>, Option<Arc<OwnedFd>>) {
        match self.table().get(dest) {
            Ok(Entry::Port(PortEntry { ident: Some(i), send, .. })) => (Some(*i), send.as_ref().map(|s| s.fd.clone())),
            _ => (None, None),
        }
    }
}

impl Inner {
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
            Err(e) => Err(lost(self.count_malformed(malformed(Refused::Pipe(e), chan.replier)))),
        }
    }

    /// Wait for the reply to a call on its reply connection or channel. Returns, with
    /// the outcome, whether the reply said that the port keeps the channel.
    ///
    /// The reply connection is this task's alone, so a time-out is the socket's own
    /// receive time-out (`SO_RCVTIMEO`), set only when it changes (`timer` says what is
    /// set): a blocking `recvmsg` and nothing else, where a `poll` first would cost a
    /// system call per call.
    pub(crate) fn wait_reply(
        &self,
        space: &Space,
        r: &OwnedFd,
        timer: &mut Option<Duration>,
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
                Err(lost(self.count_malformed(malformed(Refused::Empty, None))))
            }
            RecvOutcome::Datagram { len, creds, truncated } => {
                if truncated {
                    return Err(lost(self.count_malformed(malformed(Refused::Truncated, creds))));
                }
                let kept =
                    self.accept(space, reply, len, creds, &mut fds, recv.populate_ool, Arrival::Reply).map_err(lost)?;
                if reply.id == NotifyId::SendOnce.id() && reply.ports.is_empty() && reply.reply.is_none() {
                    // The server destroyed the reply right of a channel call unused.
                    return Err((CallError::ServerDied, kept));
                }
                reply.port = Name::NULL;
                Ok(kept)
            }
        }
    }
}
