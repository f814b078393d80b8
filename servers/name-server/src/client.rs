//! The client side: find the name server, then register, look up, unregister, list.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use ictus_abi::{Name, ReturnCode};
use ictus_ipc::{
    CallError, Disposition, Message, PortArg, ReceiveError, ReceiveOptions, Received, RightKind, RightsError,
    SendError, SendOptions, Space,
};

use crate::protocol::{self, Code, NameError, ReplyError};
use crate::socket::{self, FetchError};

/// How long a call waits for the server by default: generous, so that only a server
/// that is wedged (not merely slow on a loaded machine) turns into an error. A server
/// that dies is seen at once, whatever the timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the name server could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The well-known socket did not give us a right.
    #[error(transparent)]
    Socket(#[from] FetchError),
    /// The right could not be put in our space.
    #[error("taking the name server's send right: {0}")]
    Rights(#[from] RightsError),
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The name is not a valid name (checked before sending).
    #[error("invalid name: {0}")]
    InvalidName(#[from] NameError),
    /// The right to register is neither a send nor a receive right in our space.
    #[error("{0} is not a send or receive right in this space")]
    NotARight(Name),
    /// Register: the name is taken.
    #[error("the name {0:?} is already registered")]
    NameExists(String),
    /// Lookup, unregister: no such name.
    #[error("no name {0:?} is registered")]
    NotFound(String),
    /// Unregister: we neither registered it nor presented its right.
    #[error("not allowed to unregister {0:?}: another task registered it")]
    NotOwner(String),
    /// Register: the server refused the right (dead, or not a send right).
    #[error("the name server refused the right: it is not a live send right")]
    BadRight,
    /// Register: the server is full.
    #[error("the name server holds too many registrations")]
    Full,
    /// Any other code from the server.
    #[error("the name server refused the request: {0}")]
    Refused(Code),
    /// The server died, or dropped the request without answering.
    #[error("the name server died or dropped the request")]
    ServerDied,
    /// No answer within the timeout.
    #[error("the name server did not answer in time")]
    TimedOut,
    /// The reply did not decode.
    #[error("the name server's reply is malformed: {0}")]
    BadReply(#[from] ReplyError),
    /// Sending or receiving failed for another reason.
    #[error("calling the name server: {0}")]
    Call(CallError),
}

impl From<CallError> for ClientError {
    fn from(e: CallError) -> ClientError {
        match e {
            CallError::ServerDied
            | CallError::Send(SendError::InvalidDest(_))
            | CallError::Receive(ReceiveError::PortDied) => ClientError::ServerDied,
            CallError::Send(SendError::TimedOut) | CallError::Receive(ReceiveError::TimedOut) => ClientError::TimedOut,
            e => ClientError::Call(e),
        }
    }
}

/// A connection to the name server: a send right to its service port, in a space.
///
/// Dropping it releases the right.
#[derive(Debug)]
pub struct Client {
    space: Space,
    server: Name,
    timeout: Duration,
}

/// The bootstrap right, taken once per process (it can only be taken once) and kept as
/// a descriptor so that any space can have a copy.
static BOOTSTRAP: OnceLock<Option<OwnedFd>> = OnceLock::new();

fn bootstrap_fd() -> Option<&'static OwnedFd> {
    BOOTSTRAP
        .get_or_init(|| {
            let tmp = Space::new();
            let name = tmp.take_bootstrap().ok()??;
            tmp.send_right_fd(name).ok()
        })
        .as_ref()
}

impl Client {
    /// Find the name server: through the inherited bootstrap right if this process was
    /// given one (and its port is alive), else through the well-known socket at its
    /// default path ([`socket::default_socket_path`]).
    pub fn connect(space: &Space) -> Result<Client, ConnectError> {
        if let Some(fd) = bootstrap_fd() {
            if let Ok(dup) = fd.as_fd().try_clone_to_owned() {
                let name = space.insert_send_fd(dup)?;
                if space.right_kinds(name).is_ok_and(|k| k.contains(&RightKind::Send)) {
                    return Ok(Client::from_right(space, name));
                }
                let _ = space.deallocate(name);
            }
        }
        Client::connect_socket(space, &socket::default_socket_path())
    }

    /// Find the name server through the well-known socket at `path`.
    pub fn connect_socket(space: &Space, path: &Path) -> Result<Client, ConnectError> {
        let fd = socket::fetch_service_fd(path, DEFAULT_TIMEOUT)?;
        let name = space.insert_send_fd(fd)?;
        Ok(Client::from_right(space, name))
    }

    /// Use a send right to the name server that this space already holds; the client
    /// takes over one user reference of it.
    pub fn from_right(space: &Space, server: Name) -> Client {
        Client { space: space.clone(), server, timeout: DEFAULT_TIMEOUT }
    }

    /// Wait at most `timeout` for each call (sending, then the reply).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The send right to the name server, in this client's space.
    pub fn server_port(&self) -> Name {
        self.server
    }

    /// Register `right` under `name`. `right` is a send right (copied: we keep ours) or
    /// a receive right (a send right is made from it).
    pub fn register(&self, name: &str, right: Name) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let disposition = self.disposition_of(right)?;
        let reply = self.call(protocol::REGISTER, name.as_bytes().to_vec(), vec![PortArg::new(right, disposition)])?;
        self.expect_plain(protocol::REGISTER, name, &reply)
    }

    /// Look `name` up. On success the returned name is a send right in this client's
    /// space; the caller owns one user reference of it (deallocate it when done).
    pub fn lookup(&self, name: &str) -> Result<Name, ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let reply = self.call(protocol::LOOKUP, name.as_bytes().to_vec(), Vec::new())?;
        let result = self.code_of(protocol::LOOKUP, name, &reply);
        match (result, reply.ports.as_slice()) {
            (Ok(_), [r]) if r.kind == RightKind::Send => Ok(r.name),
            (Ok(_), _) => {
                self.release(&reply);
                Err(ReplyError::Malformed("a successful lookup must carry exactly one send right").into())
            }
            (Err(e), _) => {
                self.release(&reply);
                Err(e)
            }
        }
    }

    /// Remove the registration of `name`. Allowed for the task that registered it.
    pub fn unregister(&self, name: &str) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let reply = self.call(protocol::UNREGISTER, name.as_bytes().to_vec(), Vec::new())?;
        self.expect_plain(protocol::UNREGISTER, name, &reply)
    }

    /// Remove the registration of `name`, proving the right to do so by presenting the
    /// registered right itself (a send right, copied; or a receive right, from which a
    /// send right is made). Works from any task that holds the right.
    pub fn unregister_with_right(&self, name: &str, right: Name) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let disposition = self.disposition_of(right)?;
        let reply =
            self.call(protocol::UNREGISTER, name.as_bytes().to_vec(), vec![PortArg::new(right, disposition)])?;
        self.expect_plain(protocol::UNREGISTER, name, &reply)
    }

    /// The registered names, sorted.
    pub fn list(&self) -> Result<Vec<String>, ClientError> {
        let reply = self.call(protocol::LIST, Vec::new(), Vec::new())?;
        self.release(&reply);
        let rest = self.code_of(protocol::LIST, "", &reply)?;
        Ok(protocol::decode_list(rest)?)
    }

    fn disposition_of(&self, right: Name) -> Result<Disposition, ClientError> {
        let kinds = self.space.right_kinds(right).map_err(|_| ClientError::NotARight(right))?;
        if kinds.contains(&RightKind::Send) {
            Ok(Disposition::CopySend)
        } else if kinds.contains(&RightKind::Receive) {
            Ok(Disposition::MakeSend)
        } else {
            Err(ClientError::NotARight(right))
        }
    }

    fn call(&self, id: i32, data: Vec<u8>, ports: Vec<PortArg>) -> Result<Received, ClientError> {
        let mut msg = Message { id, data, ports, ..Message::default() };
        let mut reply = Received::new();
        let send = SendOptions { timeout: Some(self.timeout) };
        let recv = ReceiveOptions { timeout: Some(self.timeout), ..ReceiveOptions::default() };
        self.space.call(self.server, &mut msg, &mut reply, send, recv)?;
        Ok(reply)
    }

    /// The reply's payload after a success code, or the error its code stands for.
    fn code_of<'r>(&self, request: i32, name: &str, reply: &'r Received) -> Result<&'r [u8], ClientError> {
        let (code, rest) = protocol::decode_reply(request, reply.id, reply.data())?;
        let named = || name.to_owned();
        match ReturnCode::from_code(code) {
            Some(ReturnCode::Success) => Ok(rest),
            Some(ReturnCode::NameExists) => Err(ClientError::NameExists(named())),
            Some(ReturnCode::InvalidName) => Err(ClientError::NotFound(named())),
            Some(ReturnCode::NoAccess) => Err(ClientError::NotOwner(named())),
            Some(ReturnCode::InvalidRight) => Err(ClientError::BadRight),
            Some(ReturnCode::NoSpace) => Err(ClientError::Full),
            _ => Err(ClientError::Refused(Code(code))),
        }
    }

    /// A reply that carries only a code.
    fn expect_plain(&self, request: i32, name: &str, reply: &Received) -> Result<(), ClientError> {
        self.release(reply);
        let rest = self.code_of(request, name, reply)?;
        if !rest.is_empty() || !reply.ports.is_empty() {
            return Err(ReplyError::Malformed("unexpected data after the code").into());
        }
        Ok(())
    }

    /// Release every right a reply brought (when none of them is wanted).
    fn release(&self, reply: &Received) {
        for r in &reply.ports {
            let _ = match r.kind {
                RightKind::Receive => self.space.mod_refs(r.name, RightKind::Receive, -1),
                _ => self.space.deallocate(r.name),
            };
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.space.deallocate(self.server);
    }
}
