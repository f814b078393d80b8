//! Shared-memory channels as futures for tokio (feature `tokio`).
//!
//! Both ends already have a pollable descriptor ([`Client`] and [`Server`] implement
//! `AsFd`: an epoll over the side's eventfd and links) and the `arm` / `try_*` pair that
//! an event loop needs: `arm()` announces a sleep woken by eventfd and says whether
//! there is already work; after the descriptor fires, `try_recv` / `try_next`. This module
//! puts that under [`tokio::io::unix::AsyncFd`]: [`AsyncClient`] and [`AsyncServer`] own
//! their end, wait in the runtime's epoll, never spin and never start a thread.
//!
//! Records are read in place, so a receive hands the record to a closure
//! ([`AsyncClient::recv_with`], [`AsyncServer::next_with`]) rather than returning a
//! borrow of the channel from a future.
//!
//! ```no_run
//! # async fn demo(client: ictus_shm::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use ictus_shm::aio::AsyncClient;
//! let mut client = AsyncClient::new(client)?;
//! client.send(1, b"frame").await?;
//! let (tag, bytes) = client.recv_with(|r| (r.tag(), r.to_vec())).await?;
//! # let _ = (tag, bytes); Ok(()) }
//! ```

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::{Client, Next, RecvError, Reply, SendError, Server, ServerError};

/// While a client's request ring is full and replies wait unread, the server has no
/// sleep of the client's to end when it makes room (the client can only announce a
/// sleep when no reply waits): look again this often until the caller reads them.
const FULL_WITH_REPLIES_WAITING: Duration = Duration::from_micros(500);

/// Why an end could not be registered with the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Called outside a tokio runtime.
    #[error("not inside a tokio runtime (make one with I/O enabled: enable_io or enable_all)")]
    NoRuntime,
    /// The runtime refused the descriptor.
    #[error("registering the channel's descriptor with the runtime: {0}")]
    Io(std::io::Error),
}

/// An end whose descriptor `AsyncFd` waits on: the end's own epoll, owned by the end.
#[derive(Debug)]
struct End<T: AsFd>(T);

impl<T: AsFd> AsRawFd for End<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

fn register<T: AsFd>(end: T) -> Result<AsyncFd<End<T>>, RegisterError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(RegisterError::NoRuntime);
    }
    // SAFETY: the descriptor is the end's own epoll (`Client::ep`, `Server::ep`), which
    // the end owns, never replaces and closes only when dropped — after the `AsyncFd`
    // that owns the end has deregistered it: the obligations of
    // `AsyncFd::register_with_interest`.
    unsafe { AsyncFd::register_with_interest(End(end), Interest::READABLE) }
        .map_err(|e| RegisterError::Io(e.into_parts().1))
}

/// `readable` fails only when the runtime is shutting down: this end is being closed.
fn shutting_down(_: std::io::Error) -> RecvError {
    RecvError::Closed(crate::CloseReason::Local)
}

/// The client end of a channel, as futures.
#[derive(Debug)]
pub struct AsyncClient {
    fd: AsyncFd<End<Client>>,
}

impl AsyncClient {
    /// Wait for `client`'s replies in the current tokio runtime.
    pub fn new(client: Client) -> Result<AsyncClient, RegisterError> {
        Ok(AsyncClient { fd: register(client)? })
    }

    /// The client, for what never waits: loans ([`Client::loan`], [`Client::loan_pool`]),
    /// `try_recv`, statistics.
    pub fn get_mut(&mut self) -> &mut Client {
        &mut self.fd.get_mut().0
    }

    /// The client, taken back from the runtime.
    pub fn into_inner(self) -> Client {
        self.fd.into_inner().0
    }

    /// Send a copy of `data` as one record, waiting while the request ring is full.
    pub async fn send(&mut self, tag: u32, data: &[u8]) -> Result<(), SendError> {
        loop {
            match self.fd.get_mut().0.send(tag, data) {
                Err(SendError::Full) => {}
                other => return other,
            }
            self.wait(true).await.map_err(|e| match e {
                RecvError::Closed(r) => SendError::Closed(r),
                RecvError::TimedOut => SendError::TimedOut,
            })?;
        }
    }

    /// The next reply, handed to `f` in place (consumed when `f` returns).
    pub async fn recv_with<R>(&mut self, f: impl FnOnce(Reply<'_>) -> R) -> Result<R, RecvError> {
        loop {
            if let Some(r) = self.fd.get_mut().0.try_recv()? {
                return Ok(f(r));
            }
            self.wait(false).await?;
        }
    }

    /// The next reply, copied: its tag and payload.
    pub async fn recv(&mut self) -> Result<(u32, Vec<u8>), RecvError> {
        self.recv_with(|r| (r.tag(), r.to_vec())).await
    }

    /// Wait once: announce a sleep woken by eventfd and wait for the descriptor, unless
    /// a reply is already there. `for_room`: a send waits for room, which a waiting reply
    /// does not give.
    async fn wait(&mut self, for_room: bool) -> Result<(), RecvError> {
        // A wait for a reply only does not ask for the server's wake-ups for room.
        if self.fd.get_mut().0.arm_for(for_room) {
            let mut ready = self.fd.readable_mut().await.map_err(shutting_down)?;
            // The eventfd is drained by the next `arm`; its next write is a new edge.
            ready.clear_ready();
        } else if for_room {
            tokio::time::sleep(FULL_WITH_REPLIES_WAITING).await;
        }
        // A hang-up of the link makes the descriptor readable too; the next `try_recv`
        // (or send) says `Closed`.
        Ok(())
    }
}

/// The server end of shared-memory channels, as futures.
#[derive(Debug)]
pub struct AsyncServer {
    fd: AsyncFd<End<Server>>,
}

impl AsyncServer {
    /// Wait for `server`'s clients in the current tokio runtime.
    pub fn new(server: Server) -> Result<AsyncServer, RegisterError> {
        Ok(AsyncServer { fd: register(server)? })
    }

    /// The server, for what never waits: [`Server::send_to`], [`Server::close`],
    /// statistics, the service port.
    pub fn get_mut(&mut self) -> &mut Server {
        &mut self.fd.get_mut().0
    }

    /// The server, taken back from the runtime.
    pub fn into_inner(self) -> Server {
        self.fd.into_inner().0
    }

    /// The next thing to handle — a channel opened or closed, or a record — handed to `f`
    /// in place (a record is consumed when `f` returns, unless `f` calls
    /// [`crate::Incoming::retry_later`]).
    pub async fn next_with<R>(&mut self, f: impl FnOnce(Next<'_>) -> R) -> Result<R, ServerError> {
        loop {
            if let Some(n) = self.fd.get_mut().0.try_next() {
                return Ok(f(n));
            }
            if self.fd.get_mut().0.arm() {
                let mut ready = self.fd.readable_mut().await.map_err(|e| {
                    ServerError::Os(rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO))
                })?;
                ready.clear_ready();
            }
        }
    }
}
