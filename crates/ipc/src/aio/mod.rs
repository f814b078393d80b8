//! Ports as futures for tokio (feature `tokio`): receive, send with a time-out, call and
//! port sets, each waiting on the port's pollable descriptor through
//! [`tokio::io::unix::AsyncFd`] — no thread per port, nothing polled on a timer.
//!
//! - [`AsyncReceiver`] waits on a receive right or a port set: its epoll descriptor
//!   ([`Space::pollable_fd`]) joins the runtime's epoll, and a receive is tried when the
//!   runtime says it is readable. A set covers the ports moved into it later too.
//! - [`AsyncSender`] sends without blocking and, while the destination's queue is full,
//!   waits for room as a blocked [`Space::send`] does — on the futex word of the port's
//!   queue page, from a thread of the runtime's blocking pool — or, while the kernel's
//!   buffer is what is full, for its send end to become writable; up to an optional
//!   time-out. A destination whose port dies (even by `kill -9`) ends the wait with
//!   [`SendError::InvalidDest`].
//! - [`AsyncCaller`] makes calls (Mach RPC) to one destination over a call channel of
//!   its own — the same protocol as [`Space::call`]: the channel is offered with the
//!   first request, later requests name it, plain replies come through its reply pipe —
//!   and awaits the reply on the pipe or the channel. A server that drops the request or
//!   dies (even by `kill -9`) ends the call at once with [`CallError::ServerDied`].
//!
//! Every future is cancel-safe in the sense that matters: dropping it loses no message
//! that was not yet handed to the caller. A call dropped after its request went out
//! leaves its channel to a late reply, so the next call offers a new channel.
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
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::io::Interest;
use tokio::time::Instant;

use crate::send::{Room, RoomWait};
use crate::{
    Message, Name, ReceiveError, ReceiveOptions, Received, RightKind, RightsError, SendError, SendOptions, Space,
};

mod call;
pub use call::AsyncCaller;

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
///
/// The destination's send end is registered with the runtime only while a send waits
/// for room (or [`AsyncSender::dead`] waits): registered for good, every message the
/// receiver takes would wake the runtime for the room it frees.
#[derive(Debug)]
pub struct AsyncSender {
    space: Space,
    dest: Name,
    /// A send-once right: a connection of its own, which one message cannot fill.
    once: bool,
}

impl AsyncSender {
    /// Send to `dest` (a send right, a send-once right, or a receive right of `space`,
    /// which sends to its own port) in the current tokio runtime.
    pub fn new(space: &Space, dest: Name) -> Result<AsyncSender, RegisterError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RegisterError::NoRuntime);
        }
        let once = match space.right_kinds(dest)?.as_slice() {
            [RightKind::SendOnce] => true,
            kinds if kinds.contains(&RightKind::Send) || kinds.contains(&RightKind::Receive) => false,
            _ => return Err(RightsError::InvalidRight(dest).into()),
        };
        Ok(AsyncSender { space: space.clone(), dest, once })
    }

    /// The destination.
    pub fn dest(&self) -> Name {
        self.dest
    }

    /// The destination's send end, registered with the runtime for `interest`.
    fn watch(&self, interest: Interest) -> Result<AsyncFd<Fd>, SendError> {
        let fd = self.space.send_right_fd(self.dest).map_err(|_| SendError::InvalidDest(self.dest))?;
        register(fd, interest).map_err(|e| match e {
            RegisterError::Io(e) => SendError::Os(os(e)),
            _ => SendError::Os(rustix::io::Errno::INVAL),
        })
    }

    /// Send `msg`, waiting while the destination's queue is full for at most `timeout`
    /// (`None`: for ever). As [`Space::send`], rights move only if the send succeeds, and
    /// out-of-line buffers leave `msg` in every case — so a message that carries them is
    /// sent only once the queue shows room; if another sender takes that room first, the
    /// send fails with [`SendError::TimedOut`] as a blocking send at its time-out would.
    ///
    /// A queue full by its count (the queue limit) is waited for as a blocked
    /// [`Space::send`] waits: on the futex word of the port's queue page, whose wake-up
    /// the receiver gives with each place it gives back — on a thread of the runtime's
    /// blocking pool, for as long as the queue stays full. The send end's writability
    /// says nothing of the count (the kernel makes it writable as the receiver dequeues,
    /// before that receiver gives the place back); it is waited for only while the
    /// kernel's own buffer is what is full.
    pub async fn send(&self, msg: &mut Message, timeout: Option<Duration>) -> Result<(), SendError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        if self.once {
            return self.space.send(self.dest, msg, SendOptions::NONBLOCKING);
        }
        // The common case: room in the queue, one system call.
        if msg.ool.is_empty() {
            match self.space.send(self.dest, msg, SendOptions::NONBLOCKING) {
                Err(SendError::TimedOut) => {}
                other => return other,
            }
        }
        let watch = self.room_watch()?;
        let wait = async {
            loop {
                let ready = watch.ready(self, deadline).await?;
                let carries_ool = !msg.ool.is_empty();
                match self.space.send(self.dest, msg, SendOptions::NONBLOCKING) {
                    Err(SendError::TimedOut) if !carries_ool => watch.still_full(ready),
                    other => return other,
                }
            }
        };
        match deadline {
            None => wait.await,
            Some(d) => tokio::time::timeout_at(d, wait).await.unwrap_or(Err(SendError::TimedOut)),
        }
    }

    /// What a send that found the destination's queue full waits on.
    fn room_watch(&self) -> Result<RoomWatch, SendError> {
        let room = self.space.room_wait(self.dest)?.map(Arc::new);
        Ok(RoomWatch { room, fd: self.watch(Interest::WRITABLE)? })
    }

    /// Resolves when the destination's port is dead (its receive right destroyed, or
    /// its holder dead, even by `kill -9`): the kernel's hang-up of its send end. Never
    /// resolves for a send-once destination.
    pub async fn dead(&self) {
        if self.once {
            return std::future::pending().await;
        }
        // A name that no longer denotes the right is as dead as it gets here.
        let Ok(fd) = self.watch(Interest::READABLE) else { return };
        loop {
            match fd.readable().await {
                Ok(mut ready) => {
                    if ready.ready().is_read_closed() {
                        return;
                    }
                    // A port never writes to a send end: nothing else makes it readable.
                    ready.clear_ready();
                }
                Err(_) => return,
            }
        }
    }
}

/// The wait for room of a send that found its destination's queue full ([`AsyncSender`],
/// [`AsyncCaller`]): the port's queue page, for a queue full by its count (`None` for a
/// destination no page holds back), and the send end, registered for writability, for
/// a kernel buffer that is full.
struct RoomWatch {
    room: Option<Arc<RoomWait>>,
    fd: AsyncFd<Fd>,
}

impl RoomWatch {
    /// Wait until a send may find room (then try it, and hand the guard to
    /// [`RoomWatch::still_full`] if the queue is full again), the destination's port
    /// dies (the send then says so), or `deadline` passes ([`SendError::TimedOut`]).
    async fn ready(
        &self,
        sender: &AsyncSender,
        deadline: Option<Instant>,
    ) -> Result<AsyncFdReadyGuard<'_, Fd>, SendError> {
        let ready = self.fd.writable().await.map_err(|e| SendError::Os(os(e)))?;
        if let Some(room) = self.room.as_ref().filter(|r| r.full()) {
            let found = tokio::select! {
                found = wait_for_room(room, deadline) => found?,
                () = sender.dead() => Room::Dead,
            };
            if found == Room::Full {
                return Err(SendError::TimedOut);
            }
        }
        Ok(ready)
    }

    /// A send tried after [`RoomWatch::ready`] found the queue full again. Full by the
    /// count (another sender took the place): the next wait sleeps on the page. Full by
    /// the kernel's buffer: the next waits for its next writability edge (one that came
    /// since `ready` was given keeps it set).
    fn still_full(&self, mut ready: AsyncFdReadyGuard<'_, Fd>) {
        match &self.room {
            Some(room) if room.full() => {}
            Some(_) if writable_now(&self.fd) => {}
            _ => ready.clear_ready(),
        }
    }
}

/// Where a [`wait_for_room`]'s blocking thread stands.
const WAITING: u8 = 0;
/// The thread found room; the future has not taken the news yet.
const FOUND: u8 = 1;
/// The future was dropped: the thread stops at its next look.
const STOPPED: u8 = 2;
/// The future took the news.
const TAKEN: u8 = 3;

/// Wait on a blocking-pool thread until `room` shows a free place, its port dies, or
/// `deadline` passes. Dropping the future stops the thread at its next look (at most
/// `queue::RING_EVERY` later), and a wake-up it took for a place nobody will now use
/// is passed on to the next sleeper, as a blocked sender that gives up passes it on.
async fn wait_for_room(room: &Arc<RoomWait>, deadline: Option<Instant>) -> Result<Room, SendError> {
    struct Stop(Arc<AtomicU8>, Arc<RoomWait>);
    impl Drop for Stop {
        fn drop(&mut self) {
            if self.0.swap(STOPPED, Ordering::AcqRel) == FOUND {
                self.1.pass_on();
            }
        }
    }
    let stop = Stop(Arc::new(AtomicU8::new(WAITING)), room.clone());
    let (state, room) = (stop.0.clone(), room.clone());
    let deadline = deadline.map(Instant::into_std);
    let found = tokio::task::spawn_blocking(move || {
        let found = room.wait(deadline, || state.load(Ordering::Acquire) == STOPPED);
        if found == Room::Free && state.compare_exchange(WAITING, FOUND, Ordering::AcqRel, Ordering::Acquire).is_err() {
            room.pass_on();
        }
        found
    })
    .await
    .map_err(|_| SendError::Os(rustix::io::Errno::IO))?;
    stop.0.store(TAKEN, Ordering::Release);
    Ok(found)
}

/// Whether the kernel would take a datagram on `fd` now (`POLLOUT`).
fn writable_now(fd: &AsyncFd<Fd>) -> bool {
    let mut pfd = [PollFd::new(&fd.get_ref().0, PollFlags::OUT)];
    matches!(poll(&mut pfd, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(n) if n > 0)
        && pfd[0].revents().contains(PollFlags::OUT)
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

impl AsFd for AsyncReceiver {
    /// The port's (or set's) pollable descriptor, as registered with the runtime.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.get_ref().0.as_fd()
    }
}
