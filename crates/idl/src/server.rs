//! The server side: dispatching requests to a trait implementation, one thread or many.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ictus_ipc::{Credentials, Name, ReceiveError, ReceiveOptions, Received, ReturnCode, SendOptions, Space};

use crate::codec::{DecodeError, Encode, Encoder};
use crate::RemoteError;

/// How long a server waits to deliver a reply before giving up on that client.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// What a request came with, for methods that take `cx: &Context`.
#[derive(Debug)]
pub struct Context<'a> {
    /// Who sent it, as the kernel verified.
    pub sender: Credentials,
    /// Its sequence number on the port.
    pub seqno: u64,
    /// The port (or port-set member) it arrived on.
    pub port: Name,
    /// The server's space, where rights in the request were inserted.
    pub space: &'a Space,
}

impl<'a> Context<'a> {
    /// The context of a received request.
    pub fn new(space: &'a Space, req: &Received) -> Context<'a> {
        Context { sender: req.sender, seqno: req.seqno, port: req.port, space }
    }
}

/// What became of one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Dispatched {
    /// A routine ran and its reply was sent.
    Replied,
    /// A one-way request ran.
    OneWay,
    /// A routine ran but its reply could not be delivered (the client is gone).
    ReplyFailed,
    /// The request did not decode; nothing ran.
    BadRequest(DecodeError),
    /// Not a message id of this service.
    NotMine,
}

/// A generated server side: decodes requests and calls the implementation.
pub trait Service: Send + Sync {
    /// The message ids this service answers.
    fn ids(&self) -> RangeInclusive<i32>;
    /// Handle one request whose id is in [`Service::ids`] (else `NotMine`).
    fn dispatch(&self, space: &Space, req: &mut Received) -> Dispatched;
}

/// Send a routine's reply (used by generated code): the return code, then the results.
pub fn reply<T: Encode, E: RemoteError>(
    space: &Space,
    req: &mut Received,
    id: i32,
    result: Result<T, E>,
) -> Dispatched {
    let Some(to) = req.reply.take() else {
        return Dispatched::ReplyFailed;
    };
    let mut enc = Encoder::new(crate::reply_id(id));
    let encoded = match result {
        Ok(v) => 0u32.encode(&mut enc).and_then(|()| v.encode(&mut enc)).map(|()| enc),
        Err(e) => {
            let code = e.code();
            let mut enc = Encoder::new(crate::reply_id(id));
            code.encode(&mut enc).map(|()| enc)
        }
    };
    let enc = encoded.unwrap_or_else(|_| code_only(id, ReturnCode::Failure.code()));
    send_reply(space, to.name, enc)
}

fn code_only(id: i32, code: u32) -> Encoder {
    let mut enc = Encoder::new(crate::reply_id(id));
    enc.put(&code.to_le_bytes());
    enc
}

fn send_reply(space: &Space, to: Name, enc: Encoder) -> Dispatched {
    let mut msg = enc.into_message();
    match space.send(to, &mut msg, SendOptions { timeout: Some(REPLY_TIMEOUT) }) {
        Ok(()) => Dispatched::Replied,
        Err(_) => {
            let _ = space.destroy(to);
            Dispatched::ReplyFailed
        }
    }
}

/// Counters of a server.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Requests that ran.
    pub handled: AtomicU64,
    /// Requests refused: unknown id or did not decode.
    pub refused: AtomicU64,
    /// Replies that could not be delivered.
    pub replies_failed: AtomicU64,
    /// Malformed messages the nucleus destroyed before dispatch.
    pub malformed: AtomicU64,
}

/// A receive loop over a port or port set, dispatching to one or more services.
#[derive(Clone)]
pub struct Server {
    space: Space,
    port: Name,
    services: Vec<Arc<dyn Service>>,
    stats: Arc<ServerStats>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("port", &self.port).field("stats", &self.stats).finish()
    }
}

impl Server {
    /// A server receiving on `port` (a receive right or port set) in `space`.
    pub fn new(space: &Space, port: Name) -> Server {
        Server { space: space.clone(), port, services: Vec::new(), stats: Arc::default() }
    }

    /// Answer the ids of `service` too.
    pub fn with(mut self, service: impl Service + 'static) -> Server {
        self.services.push(Arc::new(service));
        self
    }

    /// The counters.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Handle one received request: dispatch it, or refuse it with `MIG_BAD_ID` /
    /// `MIG_BAD_ARGUMENTS` (one-way requests are dropped), releasing every right it
    /// brought. Never panics on what a client sent.
    pub fn handle(&self, req: &mut Received) -> Dispatched {
        let id = req.id;
        let service = self.services.iter().find(|s| s.ids().contains(&id));
        let outcome = match service {
            Some(s) => s.dispatch(&self.space, req),
            None => Dispatched::NotMine,
        };
        match &outcome {
            Dispatched::Replied | Dispatched::OneWay => {
                self.stats.handled.fetch_add(1, Ordering::Relaxed);
            }
            Dispatched::ReplyFailed => {
                self.stats.handled.fetch_add(1, Ordering::Relaxed);
                self.stats.replies_failed.fetch_add(1, Ordering::Relaxed);
            }
            Dispatched::BadRequest(_) | Dispatched::NotMine => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                let code =
                    if outcome == Dispatched::NotMine { ReturnCode::MigBadId } else { ReturnCode::MigBadArguments };
                if let Some(to) = req.reply.take() {
                    send_reply(&self.space, to.name, code_only(id, code.code()));
                }
                crate::release_rights(&self.space, req);
            }
        }
        outcome
    }

    /// Receive and handle requests on this thread until the port is destroyed.
    /// Messages no service answers are refused; malformed ones are counted.
    pub fn run(&self) -> Result<(), ReceiveError> {
        let mut req = Received::new();
        loop {
            match self.space.receive(self.port, &mut req, ReceiveOptions::default()) {
                Ok(()) => {
                    self.handle(&mut req);
                }
                Err(ReceiveError::Malformed { .. }) => {
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                }
                Err(ReceiveError::PortDied | ReceiveError::InvalidName(_)) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Run on `threads` threads (this one included) receiving on the same port, until
    /// the port is destroyed.
    pub fn run_pool(&self, threads: usize) -> Result<(), ReceiveError> {
        let handles: Vec<_> = (1..threads.max(1))
            .map(|_| {
                let s = self.clone();
                std::thread::spawn(move || s.run())
            })
            .collect();
        let mine = self.run();
        for h in handles {
            if let Ok(Err(e)) = h.join() {
                return Err(e);
            }
        }
        mine
    }
}
