//! The server side: dispatching requests to a trait implementation, one thread or many.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ictus_ipc::{
    Credentials, Name, ReceiveError, ReceiveOptions, Received, ReceivedRight, ReturnCode, RightKind, SendOptions, Space,
};

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

/// What a service made of one request; [`Server::handle`] carries it out.
#[derive(Debug)]
pub enum Outcome {
    /// A routine ran: send this reply through this right.
    Reply(ReceivedRight, Encoder),
    /// A one-way request ran.
    OneWay,
    /// The request did not decode; nothing ran.
    BadRequest(DecodeError),
    /// Not a message id of this service.
    NotMine,
}

/// A generated server side: decodes requests and calls the implementation.
pub trait Service: Send + Sync {
    /// The message ids this service answers.
    fn ids(&self) -> RangeInclusive<i32>;
    /// Handle one request whose id is in [`Service::ids`] (else `NotMine`). The reply,
    /// if any, is returned for the server to send with its own options.
    fn dispatch(&self, space: &Space, req: &mut Received) -> Outcome;
}

/// Build a routine's reply (used by generated code): the return code, then the results.
pub fn reply<T: Encode, E: RemoteError>(req: &mut Received, id: i32, result: Result<T, E>) -> Outcome {
    let Some(to) = req.reply.take() else {
        // Generated code checks before running the routine; a hand-made service may not.
        return Outcome::BadRequest(DecodeError::NoReplyRight);
    };
    Outcome::Reply(to, encode_reply(id, result))
}

/// Answer a request whose reply the server kept for later (a sleep that is due, a
/// look-up that can now be answered): send `result` as the reply to request `id`
/// through the request's reply right `to`, waiting at most `timeout` for room. The right
/// is used up or released either way.
pub fn reply_later<T: Encode, E: RemoteError>(
    space: &Space,
    to: ReceivedRight,
    id: i32,
    result: Result<T, E>,
    timeout: Duration,
) -> Dispatched {
    send_reply(space, to, encode_reply(id, result), timeout)
}

fn encode_reply<T: Encode, E: RemoteError>(id: i32, result: Result<T, E>) -> Encoder {
    let mut enc = Encoder::new(crate::reply_id(id));
    let encoded = match result {
        Ok(v) => 0u32.encode(&mut enc).and_then(|()| v.encode(&mut enc)).map(|()| enc),
        Err(e) => {
            let code = e.code();
            let mut enc = Encoder::new(crate::reply_id(id));
            code.encode(&mut enc).map(|()| enc)
        }
    };
    encoded.unwrap_or_else(|_| code_only(id, ReturnCode::Failure.code()))
}

fn code_only(id: i32, code: u32) -> Encoder {
    let mut enc = Encoder::new(crate::reply_id(id));
    enc.put(&code.to_le_bytes());
    enc
}

fn send_reply(space: &Space, to: ReceivedRight, enc: Encoder, timeout: Duration) -> Dispatched {
    let mut msg = enc.into_message();
    let sent = space.send(to.name, &mut msg, SendOptions { timeout: Some(timeout) });
    // A send-once right is used up by a reply that went; a send right (a client may
    // give one) is not. Release the one reference the request brought otherwise, never
    // the name's others (see `release_rights`).
    if sent.is_err() || to.kind != RightKind::SendOnce {
        crate::release_right(space, to);
    }
    match sent {
        Ok(()) => Dispatched::Replied,
        Err(_) => Dispatched::ReplyFailed,
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
    reply_timeout: Duration,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("port", &self.port).field("stats", &self.stats).finish()
    }
}

impl Server {
    /// A server receiving on `port` (a receive right or port set) in `space`.
    pub fn new(space: &Space, port: Name) -> Server {
        Server { space: space.clone(), port, services: Vec::new(), stats: Arc::default(), reply_timeout: REPLY_TIMEOUT }
    }

    /// How long a reply may wait for room in a client's queue (default 5 s). A server
    /// on one thread that must not be stalled by a client that stops reading gives a
    /// short one, or zero: the reply is then dropped and counted instead.
    pub fn with_reply_timeout(mut self, timeout: Duration) -> Server {
        self.reply_timeout = timeout;
        self
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
        let outcome = match service.map(|s| s.dispatch(&self.space, req)) {
            Some(Outcome::Reply(to, enc)) => send_reply(&self.space, to, enc, self.reply_timeout),
            Some(Outcome::OneWay) => Dispatched::OneWay,
            Some(Outcome::BadRequest(e)) => Dispatched::BadRequest(e),
            Some(Outcome::NotMine) | None => Dispatched::NotMine,
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
                // Release first, so that a client hearing the refusal sees its rights
                // gone (a receive right it sent is dead by then).
                let to = req.reply.take();
                crate::release_rights(&self.space, req);
                if let Some(to) = to {
                    send_reply(&self.space, to, code_only(id, code.code()), self.reply_timeout);
                }
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
