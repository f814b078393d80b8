//! Interfaces: declare a server once, get typed client and server stubs.
//!
//! This is the papers' MIG in the form Rust programmers expect: an attribute on a
//! trait. [`interface`] generates a client whose methods are plain typed calls
//! returning `Result`, and a server-side [`Service`] that decodes each request by its
//! message id, calls the trait method, and sends the reply. This crate is the runtime
//! both use: the wire conventions ([`Encoder`], [`Decoder`], [`Encode`], [`Decode`]),
//! port-right argument types ([`SendRight`], [`SendOnceRight`], [`ReceiveRight`]),
//! errors that travel ([`RemoteError`], [`ClientError`]), and the receive loop
//! ([`Server`]) for one thread or a pool. A long-running server's own loop, ports and
//! stop are the server skeleton's (`ictus-server`).
//!
//! Wire conventions (as MIG's): a request's id is the interface's base plus the
//! method's `#[id(N)]`; a reply's id is the request's plus 100 and its in-line data
//! starts with a `u32` return code (0: success, then the results). In-line values are
//! little-endian; strings and byte arrays are a `u32` length and the bytes; port rights
//! and out-of-line regions travel as the message's descriptors, in argument order.
//!
//! See `doc/interfaces.md` for a whole example.
#![deny(unsafe_code)]

mod codec;
mod server;

pub use codec::{Decode, DecodeError, Decoder, Encode, EncodeError, Encoder, ReceiveRight, SendOnceRight, SendRight};
pub use ictus_idl_macros::interface;
pub use ictus_ipc;
pub use server::{reply, reply_later, Context, Dispatched, Outcome, Server, ServerStats, Service};

use std::cell::RefCell;
use std::time::Duration;

use ictus_ipc::{
    CallError, Message, Name, ReceiveOptions, Received, ReceivedRight, ReturnCode, RightKind, SendError, SendOptions,
    Space,
};

/// An error a server returns from a routine, carried to the client as a `u32` code.
///
/// Codes must not be zero (success) and should avoid Mach's and MIG's own codes
/// ([`ReturnCode`]), which the runtime uses for requests that never reach a method.
pub trait RemoteError: Sized + std::fmt::Debug {
    /// The code that travels.
    fn code(&self) -> u32;
    /// Rebuild the error from its code; `None` for a code this type does not know.
    fn from_code(code: u32) -> Option<Self>;
}

/// A plain error code, for interfaces that need no error type of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub u32);

impl RemoteError for Status {
    fn code(&self) -> u32 {
        self.0
    }
    fn from_code(code: u32) -> Option<Self> {
        Some(Status(code))
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match ReturnCode::from_code(self.0) {
            Some(r) => write!(f, "{r}"),
            None => write!(f, "status {:#x}", self.0),
        }
    }
}

/// A return code travels as itself: an interface may use Mach's codes (and any other
/// number) as its error type.
impl RemoteError for ReturnCode {
    fn code(&self) -> u32 {
        self.0
    }
    fn from_code(code: u32) -> Option<Self> {
        Some(ReturnCode(code))
    }
}

/// Why a call through generated stubs failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError<E: std::fmt::Debug> {
    /// The server's method returned this error.
    #[error("server error: {0:?}")]
    Remote(E),
    /// The request never reached a method: the server did not know the message id
    /// (`MIG_BAD_ID`), could not decode it (`MIG_BAD_ARGUMENTS`), or answered with
    /// another code this interface's error type does not know.
    #[error("the server refused the request: {0}")]
    Refused(ReturnCode),
    /// Sending the request or receiving the reply failed; a server that died is
    /// [`CallError::ServerDied`] here, never a hang.
    #[error(transparent)]
    Call(#[from] CallError),
    /// A one-way send failed.
    #[error(transparent)]
    Send(#[from] SendError),
    /// An argument could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The reply did not decode as this interface says; its rights were released.
    #[error("bad reply: {0}")]
    BadReply(DecodeError),
}

impl<E: std::fmt::Debug> ClientError<E> {
    /// Whether the server died (or dropped the request) before replying.
    pub fn server_died(&self) -> bool {
        matches!(self, ClientError::Call(CallError::ServerDied))
    }
}

/// How a failed call ended, as every client reports it: the one classification of
/// [`CallError`] the clients (`ictus-name-api`, `ictus-clock-api`, `ictus-mars-api`)
/// share.
#[derive(Debug)]
pub enum CallFailure {
    /// The server is gone: it died or dropped the request ([`CallError::ServerDied`]),
    /// its port is dead when sending (`InvalidDest`) or while waiting (`PortDied`).
    ServerDied,
    /// No answer, or no room in its queue, within the timeout.
    TimedOut,
    /// Anything else, as it was.
    Other(CallError),
}

impl From<CallError> for CallFailure {
    fn from(e: CallError) -> CallFailure {
        use ictus_ipc::ReceiveError;
        match e {
            CallError::ServerDied
            | CallError::Send(SendError::InvalidDest(_))
            | CallError::Receive(ReceiveError::PortDied) => CallFailure::ServerDied,
            CallError::Send(SendError::TimedOut) | CallError::Receive(ReceiveError::TimedOut) => CallFailure::TimedOut,
            e => CallFailure::Other(e),
        }
    }
}

/// The client end that generated stubs call through: a send right, its space, and a
/// per-call timeout.
#[derive(Clone, Debug)]
pub struct Connection {
    space: Space,
    port: Name,
    timeout: Option<Duration>,
}

thread_local! {
    /// One reply buffer per thread, reused across calls.
    static REPLY: RefCell<Option<Received>> = const { RefCell::new(None) };
}

/// A reply, holding this thread's reply buffer until dropped.
#[derive(Debug)]
pub struct Reply {
    received: Option<Received>,
}

impl std::ops::Deref for Reply {
    type Target = Received;
    fn deref(&self) -> &Received {
        self.received.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for Reply {
    fn deref_mut(&mut self) -> &mut Received {
        self.received.as_mut().expect("present until drop")
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(r) = self.received.take() {
            REPLY.with(|slot| *slot.borrow_mut() = Some(r));
        }
    }
}

impl Connection {
    /// Stubs for the port named `port` (a send right) in `space`.
    pub fn new(space: &Space, port: Name) -> Connection {
        Connection { space: space.clone(), port, timeout: None }
    }

    /// The same connection with a per-call timeout.
    pub fn with_timeout(&self, timeout: Duration) -> Connection {
        Connection { timeout: Some(timeout), ..self.clone() }
    }

    /// The destination port.
    pub fn port(&self) -> Name {
        self.port
    }

    /// The space the stubs use.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Send a request and wait for its reply.
    pub fn call(&self, enc: Encoder) -> Result<Reply, CallError> {
        let mut msg = enc.into_message();
        let mut received = REPLY.with(|slot| slot.borrow_mut().take()).unwrap_or_default();
        let send = SendOptions { timeout: self.timeout };
        let recv = ReceiveOptions { timeout: self.timeout, ..ReceiveOptions::default() };
        let result = self.space.call(self.port, &mut msg, &mut received, send, recv);
        let reply = Reply { received: Some(received) };
        result.map(|()| reply)
    }

    /// Send a one-way request.
    pub fn send<E: std::fmt::Debug>(&self, enc: Encoder) -> Result<(), ClientError<E>> {
        let mut msg = enc.into_message();
        self.space.send(self.port, &mut msg, SendOptions { timeout: self.timeout })?;
        Ok(())
    }

    /// A reply that did not decode: release the rights it brought, report why.
    pub fn bad_reply<E: std::fmt::Debug>(&self, reply: &mut Received, e: DecodeError) -> ClientError<E> {
        release_rights(&self.space, reply);
        ClientError::BadReply(e)
    }
}

/// Release every right a message brought (it was refused, so nobody will own them):
/// one user reference of each, as it arrived.
///
/// Not `destroy`: a received right coalesces with a name the space already holds for
/// the same port (a send right to the server's own service port, a right it already
/// keeps), and destroying that name would take the space's own rights with it.
pub fn release_rights(space: &Space, msg: &mut Received) {
    for r in msg.ports.drain(..) {
        release_right(space, r);
    }
    if let Some(r) = msg.reply.take() {
        release_right(space, r);
    }
    msg.ool.clear();
}

/// Release the one user reference a message brought of `right`.
pub(crate) fn release_right(space: &Space, right: ReceivedRight) {
    let _ = match right.kind {
        RightKind::Receive => space.mod_refs(right.name, RightKind::Receive, -1),
        _ => space.deallocate(right.name),
    };
}

/// The message id of the reply to request `id` (wrapping: a request with any id, even
/// a nonsense one from a hostile client, gets a well-defined answer).
pub const fn reply_id(id: i32) -> i32 {
    id.wrapping_add(100)
}

/// Make an empty outgoing message for encoders.
pub(crate) fn message(id: i32) -> Message {
    Message { id, data: Vec::with_capacity(64), ..Message::default() }
}
