//! Calls as futures, over a call channel of the caller's own.
//!
//! The protocol is [`Space::call`]'s (`doc/ipc.md`, *Calls*): the first request offers a
//! connection and a reply pipe, the port keeps them under the caller's pid and a token,
//! later requests name the token, plain replies come through the pipe and anything else
//! on the connection. Only the waiting differs: the connection and the pipe's read end
//! are registered with the runtime once, and a call waits for them to become readable
//! instead of blocking in `read`.
//!
//! The channel is the caller's alone, never in the space's pool: the pool's channels
//! are read by blocking calls, and this one's pipe is made non-blocking (its read end is
//! a file description only this caller holds, so the flag changes nobody else's reads).

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use ictus_abi::{NotifyId, PipeMessage, HEADER_LEN, PIPE_MESSAGE_MAX};
use rustix::io::Errno;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::Instant;

use super::{os, register, AsyncSender, Fd, RegisterError};
use crate::channel::Offer;
use crate::incoming::Refused;
use crate::message::Credentials;
use crate::receive::malformed;
use crate::send::{Queue, ReplySlot, Target};
use crate::table::{Entry, PortEntry};
use crate::{CallError, Message, Name, ReceiveError, ReceiveOptions, Received, RightsError, SendError};

/// A call channel owned by one [`AsyncCaller`], registered with the runtime.
#[derive(Debug)]
struct Channel {
    /// This side of the connection (`SO_PASSCRED` on): replies that are not plain, and
    /// the hang-up of a server that died.
    conn: AsyncFd<Fd>,
    /// The reply pipe's read end (non-blocking), until the port lets go of its write end.
    pipe: Option<AsyncFd<Fd>>,
    /// The token the port keeps the channel under.
    token: u32,
    /// Who sent the last reply on the connection: a reply on the pipe is credited to it.
    replier: Option<Credentials>,
    /// `SO_RCVTIMEO` as set on `conn` (never: every read here is non-blocking).
    timer: Option<Duration>,
}

/// Makes calls to one destination as futures, over a call channel of its own.
///
/// Semantics are those of [`Space::call`]: a server that destroys the reply right
/// without answering, or dies (even by `kill -9`), ends the call at once with
/// [`CallError::ServerDied`]; a call that times out drops its channel, so a late reply
/// never answers the next call. While it lives, an `AsyncCaller`'s channel reaches the
/// port as a send right does (the port sees no-senders only after it is dropped).
#[derive(Debug)]
pub struct AsyncCaller {
    sender: AsyncSender,
    chan: Option<Channel>,
    /// A request went out and its reply was not taken (the call was cancelled or timed
    /// out): the channel may still get that reply, so the next call offers a new one.
    pending: bool,
    populate_ool: bool,
}

impl AsyncCaller {
    /// Calls to `dest` (a send right of `space`, or a receive right, which calls its own
    /// port) in the current tokio runtime.
    pub fn new(space: &crate::Space, dest: Name) -> Result<AsyncCaller, RegisterError> {
        let sender = AsyncSender::new(space, dest)?;
        if sender.once {
            // A call channel is kept by a port, which a send-once right is not.
            return Err(RegisterError::Rights(RightsError::InvalidRight(dest)));
        }
        Ok(AsyncCaller { sender, chan: None, pending: false, populate_ool: false })
    }

    /// Map out-of-line regions of replies with every page present.
    pub fn with_populate_ool(mut self, populate: bool) -> AsyncCaller {
        self.populate_ool = populate;
        self
    }

    /// The destination.
    pub fn dest(&self) -> Name {
        self.sender.dest
    }

    /// Send `msg` (its `reply` must be empty) and wait for the reply into `reply`, for
    /// at most `timeout` in all (`None`: for ever).
    pub async fn call(
        &mut self,
        msg: &mut Message,
        reply: &mut Received,
        timeout: Option<Duration>,
    ) -> Result<(), CallError> {
        if let Some(r) = msg.reply {
            return Err(CallError::Send(SendError::InvalidRight(r.name)));
        }
        if std::mem::take(&mut self.pending) {
            self.chan = None;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let result = match deadline {
            None => self.call_inner(msg, reply).await,
            Some(d) => match tokio::time::timeout_at(d, self.call_inner(msg, reply)).await {
                Ok(r) => r,
                Err(_) if self.pending => Err(CallError::Receive(ReceiveError::TimedOut)),
                Err(_) => Err(CallError::Send(SendError::TimedOut)),
            },
        };
        if self.pending {
            // Timed out waiting for the reply: it may still come, on this channel.
            self.pending = false;
            self.chan = None;
        }
        result
    }

    async fn call_inner(&mut self, msg: &mut Message, reply: &mut Received) -> Result<(), CallError> {
        self.send_request(msg).await?;
        self.pending = true;
        let (result, kept) = self.wait_reply(reply).await;
        self.pending = false;
        if !kept {
            // Only a channel the port said it keeps may be named by its token again.
            self.chan = None;
        }
        result
    }

    /// Send the request naming our channel, or offering a new one. While the queue is
    /// full, wait for room (an offer whose send failed is discarded and made again).
    async fn send_request(&mut self, msg: &mut Message) -> Result<(), CallError> {
        let space = self.sender.space.clone();
        let dest = self.sender.dest;
        // The first attempt without waiting: the queue almost always has room. Out-of-line
        // buffers leave the message whether a send succeeds or not, so a message carrying
        // them is sent only once the queue shows room. The destination is registered with
        // the runtime only for such waits (see `AsyncSender`).
        let mut room = None;
        let mut wait = !msg.ool.is_empty();
        loop {
            let ready = match wait {
                true => {
                    let watch = match &room {
                        Some(watch) => watch,
                        None => room.insert(self.sender.room_watch()?),
                    };
                    Some((watch, watch.ready(&self.sender, None).await?))
                }
                false => None,
            };
            let send_end = match space.table().get(dest) {
                // The queue page is found in the space's pool, as for a blocking call.
                Ok(Entry::Port(PortEntry { ident: Some(ident), send, .. })) => {
                    send.as_ref().map(|s| Target::Shared(s.fd.clone(), Queue::Right(*ident, None)))
                }
                _ => None,
            };
            let (slot, offered) = match &self.chan {
                Some(c) => (ReplySlot::OnChannel(c.token), None),
                None => {
                    let offer = Offer::new().map_err(SendError::Os)?;
                    let slot = ReplySlot::Channel { fd: offer.far_end, pipe: offer.pipe, token: offer.pooled.token };
                    (slot, Some(offer.pooled))
                }
            };
            let carries_ool = !msg.ool.is_empty();
            let now = Some(std::time::Instant::now());
            match space.send_message(dest, send_end, msg, slot, now) {
                Ok(()) => {
                    if let Some(pooled) = offered {
                        self.chan = Some(Channel::register(pooled).map_err(CallError::Send)?);
                    }
                    return Ok(());
                }
                Err(SendError::TimedOut) if !carries_ool => {
                    // Full: wait for room (`RoomWatch`).
                    if let Some((watch, r)) = ready {
                        watch.still_full(r);
                    }
                    wait = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Wait for the reply on the pipe (plain replies) or the connection (the first
    /// reply, replies with rights or out-of-line memory, and a server's death). Returns
    /// the outcome and whether the port keeps the channel.
    async fn wait_reply(&mut self, reply: &mut Received) -> (Result<(), CallError>, bool) {
        let space = self.sender.space.clone();
        let Some(chan) = self.chan.as_mut() else {
            return (Err(CallError::Send(SendError::Os(Errno::INVAL))), false);
        };
        let lost = |e: ReceiveError| (Err(CallError::Receive(e)), false);
        loop {
            if let (Some(pipe), Some(replier)) = (&chan.pipe, chan.replier) {
                let mut ready = match pipe.readable().await {
                    Ok(r) => r,
                    Err(e) => return lost(ReceiveError::Os(os(e))),
                };
                // One more byte than a message may have, so that too much is seen as such.
                let n = match rustix::io::read(pipe.get_ref().0.as_fd(), &mut reply.buf[..PIPE_MESSAGE_MAX + 1]) {
                    Err(Errno::AGAIN) => {
                        ready.clear_ready();
                        continue;
                    }
                    Err(Errno::INTR) => continue,
                    Err(e) => return lost(ReceiveError::Os(e)),
                    Ok(0) => {
                        // The port let go of the pipe's write end (or died): the
                        // connection from now on.
                        drop(ready);
                        chan.pipe = None;
                        continue;
                    }
                    Ok(n) => n,
                };
                // One reply per call: the pipe is empty now, and the next reply comes
                // after the next request, with an edge of its own.
                ready.clear_ready();
                match PipeMessage::parse(&reply.buf[..n]) {
                    Ok(PipeMessage::OnSocket { .. }) => {}
                    Ok(PipeMessage::Reply { header, .. }) => {
                        reply.reset();
                        reply.data_start = HEADER_LEN;
                        reply.data_end = n;
                        reply.id = header.id;
                        reply.sender = replier;
                        if header.id == NotifyId::SendOnce.id() {
                            // The server destroyed the reply right unused.
                            return (Err(CallError::ServerDied), header.kept);
                        }
                        return (Ok(()), header.kept);
                    }
                    Err(e) => {
                        let e = space.inner.count_malformed(malformed(Refused::Pipe(e), Some(replier)));
                        return lost(e);
                    }
                }
            }
            // On the connection.
            let mut ready = match chan.conn.readable().await {
                Ok(r) => r,
                Err(e) => return lost(ReceiveError::Os(os(e))),
            };
            let now = ReceiveOptions { timeout: Some(Duration::ZERO), populate_ool: self.populate_ool };
            let waited = space.inner.wait_reply(&space, &chan.conn.get_ref().0, &mut chan.timer, reply, now);
            match waited {
                Err((CallError::Receive(ReceiveError::TimedOut), _)) => {
                    ready.clear_ready();
                    continue;
                }
                Ok(kept) => {
                    chan.replier = Some(reply.sender);
                    return (Ok(()), kept);
                }
                Err((CallError::ServerDied, true)) => {
                    chan.replier = Some(reply.sender);
                    return (Err(CallError::ServerDied), true);
                }
                Err((e, kept)) => return (Err(e), kept),
            }
        }
    }
}

impl Channel {
    /// Register a channel this caller offered and the port accepted.
    fn register(pooled: crate::channel::Pooled) -> Result<Channel, SendError> {
        let failed = |e: RegisterError| match e {
            RegisterError::Io(e) => SendError::Os(os(e)),
            _ => SendError::Os(Errno::INVAL),
        };
        let conn = register(pooled.fd, Interest::READABLE).map_err(failed)?;
        let pipe = match pooled.pipe {
            Some(p) => {
                // Ours alone (the port has the write end's description), so the flag
                // changes no one else's reads.
                rustix::fs::fcntl_setfl(&p, rustix::fs::OFlags::NONBLOCK).map_err(SendError::Os)?;
                debug_assert!(p.as_raw_fd() >= 0);
                Some(register(p, Interest::READABLE).map_err(failed)?)
            }
            None => None,
        };
        Ok(Channel { conn, pipe, token: pooled.token, replier: pooled.replier, timer: pooled.timer })
    }
}
