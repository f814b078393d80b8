//! Ports as futures for tokio (feature `tokio`): receive, send with a time-out, call and
//! port sets, each waiting on the port's pollable descriptor through
//! [`tokio::io::unix::AsyncFd`] — no thread per port, nothing polled on a timer.
//!
//! - [`AsyncReceiver`] waits on a receive right or a port set: its epoll descriptor
//!   ([`Space::pollable_fd`]) joins the runtime's epoll, and a receive is tried when the
//!   runtime says it is readable. A set covers the ports moved into it later too.
//! - [`AsyncSender`] sends without blocking and, while the destination's queue is full,
//!   waits for its send end to become writable (the kernel's own flow control), up to an
//!   optional time-out. A destination whose port dies (even by `kill -9`) ends the wait
//!   with [`SendError::InvalidDest`].
//! - [`AsyncCaller`] makes calls (Mach RPC) to one destination: the request carries a
//!   send right to a reply port the caller keeps, and the reply is awaited on that port;
//!   a server that dies ends the call at once with [`CallError::ServerDied`] (the hang-up
//!   of the destination's send end, in the same runtime).
//!
//! Every future is cancel-safe in the sense that matters: dropping it loses no message
//! that was not yet handed to the caller. A call dropped after its request went out
//! leaves the reply port to a late reply, so the next call uses a new reply port.
//!
//! `doc/async.md` says why it is built this way and what it costs (`ictus bench ipc`,
//! headline `ipc_async_rtt_vs_blocking`).
//!
//! ```no_run
//! use ictus_ipc::aio::AsyncReceiver;
//! use ictus_ipc::{Message, Received, SendOptions, Space};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let space = Space::task();
//! let port = space.allocate_port_with_send()?;
//! let receiver = AsyncReceiver::new(&space, port)?;
//! space.send(port, &mut Message::new(7, b"hello".to_vec()), SendOptions::default())?;
//! let mut msg = Received::new();
//! receiver.receive(&mut msg).await?;
//! assert_eq!(msg.data(), b"hello");
//! # Ok(()) }
//! ```

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::Instant;

use crate::{
    CallError, Disposition, Message, Name, PortArg, ReceiveError, ReceiveOptions, Received, RightKind, RightsError,
    SendError, SendOptions, Space,
};

/// Why a port could not be made into a future's source.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The name does not denote the right this needs (a receive right or port set to
    /// receive from, a send right to send to).
    #[error(transparent)]
    Rights(#[from] RightsError),
    /// Called outside a tokio runtime.
    #[error("not inside a tokio runtime (make one with I/O enabled: enable_io or enable_all)")]
    NoRuntime,
    /// The runtime refused the descriptor.
    #[error("registering the port's descriptor with the runtime: {0}")]
    Io(std::io::Error),
}

/// A descriptor owned for the runtime's sake. `AsyncFd` wants `AsRawFd`.
#[derive(Debug)]
struct Fd(OwnedFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

fn register(fd: OwnedFd, interest: Interest) -> Result<AsyncFd<Fd>, RegisterError> {
    // `AsyncFd::with_interest` panics outside a runtime; say so as an error instead. (A
    // runtime built without I/O is tokio's own panic, as for its sockets.)
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(RegisterError::NoRuntime);
    }
    // SAFETY: `Fd` owns the descriptor (an `OwnedFd` nothing else closes) for as long as
    // the `AsyncFd` holds it, and its `as_raw_fd` always returns that same descriptor:
    // the obligations of `AsyncFd::register_with_interest`.
    unsafe { AsyncFd::register_with_interest(Fd(fd), interest) }.map_err(|e| RegisterError::Io(e.into_parts().1))
}

fn os(e: std::io::Error) -> rustix::io::Errno {
    rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO)
}

/// Receives from a receive right or a port set as a future.
#[derive(Debug)]
pub struct AsyncReceiver {
    space: Space,
    name: Name,
    fd: AsyncFd<Fd>,
    populate_ool: bool,
}

impl AsyncReceiver {
    /// Receive from `name` (a receive right or a port set of `space`) in the current
    /// tokio runtime.
    pub fn new(space: &Space, name: Name) -> Result<AsyncReceiver, RegisterError> {
        let fd = register(space.pollable_fd(name)?, Interest::READABLE)?;
        Ok(AsyncReceiver { space: space.clone(), name, fd, populate_ool: false })
    }

    /// Map out-of-line regions of received messages with every page present.
    pub fn with_populate_ool(mut self, populate: bool) -> AsyncReceiver {
        self.populate_ool = populate;
        self
    }

    /// The receive right or port set received from.
    pub fn name(&self) -> Name {
        self.name
    }

    /// The next message. As [`Space::receive`]: a malformed message is destroyed and
    /// reported ([`ReceiveError::Malformed`]), and the next receive goes on; a receive
    /// right destroyed meanwhile is [`ReceiveError::PortDied`].
    pub async fn receive(&self, into: &mut Received) -> Result<(), ReceiveError> {
        let now = ReceiveOptions { timeout: Some(Duration::ZERO), populate_ool: self.populate_ool };
        loop {
            let mut ready = self.fd.readable().await.map_err(|e| ReceiveError::Os(os(e)))?;
            match self.space.receive(self.name, into, now) {
                // Nothing there (another receiver took it, or a wake-up of the port's
                // own): wait for the next edge.
                Err(ReceiveError::TimedOut) => ready.clear_ready(),
                other => return other,
            }
        }
    }

    /// The next message, waiting at most `timeout` ([`ReceiveError::TimedOut`]).
    pub async fn receive_timeout(&self, into: &mut Received, timeout: Duration) -> Result<(), ReceiveError> {
        match tokio::time::timeout(timeout, self.receive(into)).await {
            Ok(r) => r,
            Err(_) => Err(ReceiveError::TimedOut),
        }
    }
}

/// Sends to one destination as a future, waiting for room while its queue is full.
#[derive(Debug)]
pub struct AsyncSender {
    space: Space,
    dest: Name,
    /// A duplicate of the destination's send end, registered when first needed: writable
    /// when its queue has room, hung up when its port died. `None` for a send-once right
    /// (a connection of its own, which one message cannot fill).
    fd: Option<AsyncFd<Fd>>,
}

impl AsyncSender {
    /// Send to `dest` (a send right, a send-once right, or a receive right of `space`,
    /// which sends to its own port) in the current tokio runtime.
    pub fn new(space: &Space, dest: Name) -> Result<AsyncSender, RegisterError> {
        let fd = match space.right_kinds(dest)?.as_slice() {
            [RightKind::SendOnce] => None,
            _ => Some(register(space.send_right_fd(dest)?, Interest::READABLE | Interest::WRITABLE)?),
        };
        Ok(AsyncSender { space: space.clone(), dest, fd })
    }

    /// The destination.
    pub fn dest(&self) -> Name {
        self.dest
    }

    /// Send `msg`, waiting while the destination's queue is full for at most `timeout`
    /// (`None`: for ever). As [`Space::send`], rights move only if the send succeeds, and
    /// out-of-line buffers leave `msg` in every case — so a message that carries them is
    /// sent only once the queue shows room; if another sender takes that room first, the
    /// send fails with [`SendError::TimedOut`] as a blocking send at its time-out would.
    pub async fn send(&self, msg: &mut Message, timeout: Option<Duration>) -> Result<(), SendError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let Some(fd) = &self.fd else {
            return self.space.send(self.dest, msg, SendOptions::NONBLOCKING);
        };
        // The common case: room in the queue, one system call.
        if msg.ool.is_empty() {
            match self.space.send(self.dest, msg, SendOptions::NONBLOCKING) {
                Err(SendError::TimedOut) => {}
                other => return other,
            }
        }
        let wait = async {
            loop {
                let mut ready = fd.writable().await.map_err(|e| SendError::Os(os(e)))?;
                let carries_ool = !msg.ool.is_empty();
                match self.space.send(self.dest, msg, SendOptions::NONBLOCKING) {
                    Err(SendError::TimedOut) if !carries_ool => ready.clear_ready(),
                    other => return other,
                }
            }
        };
        match deadline {
            None => wait.await,
            Some(d) => tokio::time::timeout_at(d, wait).await.unwrap_or(Err(SendError::TimedOut)),
        }
    }

    /// Resolves when the destination's port is dead (its receive right destroyed, or
    /// its holder dead). Never resolves for a send-once destination.
    pub async fn dead(&self) {
        match &self.fd {
            Some(fd) => loop {
                match fd.readable().await {
                    Ok(mut ready) => {
                        if ready.ready().is_read_closed() {
                            return;
                        }
                        // Readable without a hang-up: a port never writes to a send end,
                        // so only a stray datagram (none is ever sent) gets here.
                        ready.clear_ready();
                    }
                    Err(_) => return,
                }
            },
            None => std::future::pending().await,
        }
    }
}

/// Sends `msg` to `dest` once, as [`AsyncSender::send`] does, for a destination used
/// once. A program that sends to the same port often keeps an [`AsyncSender`].
pub async fn send(space: &Space, dest: Name, msg: &mut Message, timeout: Option<Duration>) -> Result<(), SendError> {
    // Nothing to register when the queue has room.
    if msg.ool.is_empty() {
        match space.send(dest, msg, SendOptions::NONBLOCKING) {
            Err(SendError::TimedOut) => {}
            other => return other,
        }
    }
    let sender = AsyncSender::new(space, dest).map_err(|e| match e {
        RegisterError::Rights(_) => SendError::InvalidDest(dest),
        RegisterError::NoRuntime => SendError::Os(rustix::io::Errno::INVAL),
        RegisterError::Io(e) => SendError::Os(os(e)),
    })?;
    sender.send(msg, timeout).await
}

/// Makes calls to one destination as futures: a request out, its reply awaited on a
/// reply port of the caller's.
///
/// The request carries a send right to the caller's reply port (`MakeSend`) rather than
/// a send-once right: a send-once right is a connection made and closed per call, which
/// costs more than the round trip itself (`doc/ipc.md`, *Calls*). What that changes:
/// a server that drops a request without replying is seen at the call's time-out, not
/// at once (a server that dies is seen at once, by the destination's hang-up), and a
/// server may keep the send right and write to the reply port later — a call after a
/// time-out or a cancelled call therefore uses a new reply port, so a late reply never
/// answers the next call.
#[derive(Debug)]
pub struct AsyncCaller {
    sender: AsyncSender,
    reply: AsyncReceiver,
    /// A call's request went out and its reply has not been taken: the reply port may
    /// still receive it, so it must not answer the next call.
    pending: bool,
}

impl AsyncCaller {
    /// Calls to `dest` (a send right of `space`) in the current tokio runtime.
    pub fn new(space: &Space, dest: Name) -> Result<AsyncCaller, RegisterError> {
        let sender = AsyncSender::new(space, dest)?;
        let reply = Self::reply_port(space)?;
        Ok(AsyncCaller { sender, reply, pending: false })
    }

    fn reply_port(space: &Space) -> Result<AsyncReceiver, RegisterError> {
        let port = space.allocate_port()?;
        AsyncReceiver::new(space, port).inspect_err(|_| {
            let _ = space.destroy(port);
        })
    }

    /// A fresh reply port, the old one destroyed (with any late reply in it).
    fn renew(&mut self) -> Result<(), CallError> {
        let space = self.sender.space.clone();
        let fresh = Self::reply_port(&space).map_err(|e| match e {
            RegisterError::Rights(RightsError::Os(e)) => CallError::Send(SendError::Os(e)),
            RegisterError::Io(e) => CallError::Send(SendError::Os(os(e))),
            _ => CallError::Send(SendError::Os(rustix::io::Errno::NOMEM)),
        })?;
        let old = std::mem::replace(&mut self.reply, fresh);
        let _ = space.destroy(old.name);
        self.pending = false;
        Ok(())
    }

    /// The destination.
    pub fn dest(&self) -> Name {
        self.sender.dest
    }

    /// Send `msg` (its `reply` must be empty) and wait for the reply into `reply`, for
    /// at most `timeout` in all (`None`: for ever). A server that dies meanwhile, even
    /// by `kill -9`, ends the call with [`CallError::ServerDied`]; a reply it sent before
    /// dying is still delivered.
    pub async fn call(
        &mut self,
        msg: &mut Message,
        reply: &mut Received,
        timeout: Option<Duration>,
    ) -> Result<(), CallError> {
        if let Some(r) = msg.reply {
            return Err(CallError::Send(SendError::InvalidRight(r.name)));
        }
        if self.pending {
            self.renew()?;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        msg.reply = Some(PortArg::new(self.reply.name, Disposition::MakeSend));
        let sent = self.sender.send(msg, timeout).await;
        msg.reply = None;
        sent?;
        self.pending = true;
        let wait = async {
            tokio::select! {
                biased;
                r = self.reply.receive(reply) => r.map_err(CallError::Receive),
                () = self.sender.dead() => {
                    // A reply sent just before the server died is still the answer.
                    let now = ReceiveOptions { timeout: Some(Duration::ZERO), populate_ool: self.reply.populate_ool };
                    match self.sender.space.receive(self.reply.name, reply, now) {
                        Ok(()) => Ok(()),
                        Err(_) => Err(CallError::ServerDied),
                    }
                }
            }
        };
        let result = match deadline {
            None => wait.await,
            Some(d) => tokio::time::timeout_at(d, wait).await.unwrap_or(Err(CallError::Receive(ReceiveError::TimedOut))),
        };
        match &result {
            Ok(()) => self.pending = false,
            // The reply port stays with a request out; the next call renews it.
            Err(_) => {}
        }
        result
    }
}

impl Drop for AsyncCaller {
    fn drop(&mut self) {
        let _ = self.sender.space.destroy(self.reply.name);
    }
}

impl AsFd for AsyncReceiver {
    /// The port's (or set's) pollable descriptor, as registered with the runtime.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.get_ref().0.as_fd()
    }
}
