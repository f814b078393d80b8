//! The client side: find the name server, then register, look up, unregister, list,
//! through the [`NamesClient`] stubs generated from [`crate::protocol::Names`].

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use ictus_abi::Name;
use ictus_idl::{EncodeError, RemoteError, SendRight};
use ictus_ipc::{CallError, ReceiveError, RightKind, RightsError, SendError, Space};

use crate::protocol::{self, Code, NameError, NamesClient, NamesError, ReplyError};
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
    /// Register: the server refused the right (its port is dead).
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

impl ClientError {
    /// The error a call through the stubs about `name` comes to.
    fn from_call(name: &str, e: ictus_idl::ClientError<NamesError>) -> ClientError {
        use ictus_idl::ClientError as Stub;
        let named = || name.to_owned();
        match e {
            Stub::Remote(e) => match e {
                NamesError::NameExists => ClientError::NameExists(named()),
                NamesError::NotFound => ClientError::NotFound(named()),
                NamesError::NotOwner => ClientError::NotOwner(named()),
                NamesError::BadRight => ClientError::BadRight,
                NamesError::Full => ClientError::Full,
                NamesError::BadName | NamesError::ResourceShortage => ClientError::Refused(Code(e.code())),
            },
            Stub::Refused(status) => ClientError::Refused(Code(status.0)),
            Stub::Call(e) => e.into(),
            Stub::Send(e) => CallError::Send(e).into(),
            // Not reached: names are checked before sending, and `send_right` picks a
            // disposition that fits.
            Stub::Encode(EncodeError::Disposition(right, _)) => ClientError::NotARight(right),
            Stub::Encode(EncodeError::TooLong(n)) => ClientError::InvalidName(NameError::TooLong(n)),
            Stub::BadReply(e) => ClientError::BadReply(e.into()),
        }
    }
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

/// A connection to the name server: the generated [`NamesClient`] stubs, on a send
/// right to its service port in a space.
///
/// Dropping it releases the right.
#[derive(Debug)]
pub struct Client {
    space: Space,
    stubs: NamesClient,
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
        Client { space: space.clone(), stubs: NamesClient::new(space, server).with_timeout(DEFAULT_TIMEOUT) }
    }

    /// Wait at most `timeout` for each call (sending, then the reply).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.stubs = self.stubs.with_timeout(timeout);
        self
    }

    /// The send right to the name server, in this client's space.
    pub fn server_port(&self) -> Name {
        self.stubs.port()
    }

    /// The typed stubs of the [`Names`](crate::protocol::Names) interface, for calls
    /// without this type's checks and error mapping.
    pub fn stubs(&self) -> &NamesClient {
        &self.stubs
    }

    /// Register `right` under `name`. `right` is a send right (copied: we keep ours) or
    /// a receive right (a send right is made from it).
    pub fn register(&self, name: &str, right: Name) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let port = self.send_right(right)?;
        self.stubs.register(name, port).map_err(|e| ClientError::from_call(name, e))
    }

    /// Look `name` up. On success the returned name is a send right in this client's
    /// space; the caller owns one user reference of it (deallocate it when done).
    pub fn lookup(&self, name: &str) -> Result<Name, ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let right = self.stubs.lookup(name).map_err(|e| ClientError::from_call(name, e))?;
        Ok(right.name)
    }

    /// Remove the registration of `name`. Allowed for the task that registered it.
    pub fn unregister(&self, name: &str) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        self.stubs.unregister(name).map_err(|e| ClientError::from_call(name, e))
    }

    /// Remove the registration of `name`, proving the right to do so by presenting the
    /// registered right itself (a send right, copied; or a receive right, from which a
    /// send right is made). Works from any task that holds the right.
    pub fn unregister_with_right(&self, name: &str, right: Name) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let proof = self.send_right(right)?;
        self.stubs.unregister_with_right(name, proof).map_err(|e| ClientError::from_call(name, e))
    }

    /// The registered names, sorted. Each is checked to be a valid name, so that what
    /// a server sends cannot smuggle control characters into a terminal.
    pub fn list(&self) -> Result<Vec<String>, ClientError> {
        let names = self.stubs.list().map_err(|e| ClientError::from_call("", e))?;
        for n in &names {
            protocol::validate_name(n.as_bytes()).map_err(ReplyError::BadName)?;
        }
        Ok(names)
    }

    /// How to send `right`: copied if it is a send right, made if a receive right.
    fn send_right(&self, right: Name) -> Result<SendRight, ClientError> {
        let kinds = self.space.right_kinds(right).map_err(|_| ClientError::NotARight(right))?;
        if kinds.contains(&RightKind::Send) {
            Ok(SendRight::copy(right))
        } else if kinds.contains(&RightKind::Receive) {
            Ok(SendRight::make(right))
        } else {
            Err(ClientError::NotARight(right))
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.space.deallocate(self.stubs.port());
    }
}
