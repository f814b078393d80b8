//! The client side: find the name server, then register, look up, unregister, list,
//! through the [`NamesClient`] stubs generated from [`crate::protocol::Names`].

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use ictus_abi::{Name, ReturnCode};
use ictus_idl::{EncodeError, SendRight};
use ictus_ipc::{CallError, ReceiveError, RightKind, RightsError, SendError, Space};

use crate::protocol::{self, NameError, NamesClient, NamesError, ReplyError, MAX_NAMES_PER_CLIENT, MAX_REGISTRATIONS};
use crate::socket::{self, FetchError};

/// How long a call waits for the server by default: generous, so that only a server
/// that is wedged (not merely slow on a loaded machine) turns into an error. A server
/// that dies is seen at once, whatever the timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the name server could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The well-known socket did not give us a right (its message says where and what
    /// to do).
    #[error(transparent)]
    Socket(#[from] FetchError),
    /// The right could not be put in our space.
    #[error("cannot take the name server's send right into this task: {0}")]
    Rights(#[from] RightsError),
}

/// Why a request failed. Each message is one line: what failed, why, and what to do
/// where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The name is not a valid name (checked before sending).
    #[error("invalid name: {0}")]
    InvalidName(#[from] NameError),
    /// The right to register is neither a send nor a receive right in our space.
    #[error("{0} is not a send or receive right in this space")]
    NotARight(Name),
    /// Register: the name is taken.
    #[error("the name {0:?} is already registered by another task; unregister it there or choose another name")]
    NameExists(String),
    /// Lookup, unregister: no such name.
    #[error("no name {0:?} is registered; is the server that registers it running?")]
    NotFound(String),
    /// Unregister: we neither registered it nor presented its right.
    #[error("not allowed to unregister {0:?}: another task registered it")]
    NotOwner(String),
    /// Register: the server refused the right (its port is dead).
    #[error("the name server refused the right: its port is dead")]
    BadRight,
    /// Register: the server holds [`MAX_REGISTRATIONS`] names.
    #[error("the name server is full: it holds {MAX_REGISTRATIONS} names, its limit for all tasks together")]
    Full,
    /// Register: this task holds [`MAX_NAMES_PER_CLIENT`] names already.
    #[error(
        "this task has {MAX_NAMES_PER_CLIENT} names registered, the name server's quota per task; unregister some first"
    )]
    QuotaExceeded,
    /// Any other code from the server.
    #[error("the name server refused the request: {0}")]
    Refused(ReturnCode),
    /// The server died, or dropped the request without answering, and no new one
    /// answers at its address.
    #[error(
        "the name server died (or dropped the request) and no new one answers; start one with `ictus name-server`"
    )]
    ServerDied,
    /// No answer within the timeout.
    #[error("the name server did not answer in time: it is stopped or overloaded")]
    TimedOut,
    /// The reply did not decode.
    #[error("the name server's reply is malformed: {0}")]
    BadReply(#[from] ReplyError),
    /// Sending or receiving failed for another reason.
    #[error("calling the name server failed: {0}")]
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
                NamesError::QuotaExceeded => ClientError::QuotaExceeded,
                NamesError::BadName | NamesError::ResourceShortage => ClientError::Refused(e.return_code()),
            },
            Stub::Refused(code) => ClientError::Refused(code),
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
        match ictus_idl::CallFailure::from(e) {
            ictus_idl::CallFailure::ServerDied => ClientError::ServerDied,
            ictus_idl::CallFailure::TimedOut => ClientError::TimedOut,
            ictus_idl::CallFailure::Other(e) => ClientError::Call(e),
        }
    }
}

/// Where a client found the name server, so that it can find a restarted one.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Address {
    /// The default socket path (after the bootstrap right, which dies with its server).
    Default,
    /// A socket path given explicitly.
    Socket(PathBuf),
    /// A right handed over by the caller: nowhere to look for another.
    Given,
}

impl Address {
    fn path(&self) -> Option<PathBuf> {
        match self {
            Address::Default => Some(socket::default_socket_path()),
            Address::Socket(p) => Some(p.clone()),
            Address::Given => None,
        }
    }
}

/// What the client knows of its server's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    /// Calls go to the server as they are.
    Alive,
    /// A call found the server dead and no new one at its address; `restart` if the dead
    /// one left its socket behind (a crash: a restart is likely), not if it removed it
    /// (a clean stop).
    Dead { restart: bool },
}

/// The right the stubs use and what is known of it; replaced when the client finds a
/// restarted server.
#[derive(Debug)]
struct Current {
    stubs: NamesClient,
    health: Health,
}

/// A connection to the name server: the generated [`NamesClient`] stubs, on a send
/// right to its service port in a space.
///
/// # A name server that restarts
///
/// A name server that dies takes every registration with it, and a new one starts
/// empty; the servers that had registered register again (`ictus_server::Registrar`).
/// A client that found the server through a socket path follows it:
///
/// - a call that finds the server dead looks once, at once, for a new server at the
///   same path and, if one answers, makes the call there (a registration or lookup the
///   dead server was carrying out died with it, so making it again is what was asked);
/// - otherwise the call fails with [`ClientError::ServerDied`], and the client remembers
///   the death. If the dead server left its socket behind — `kill -9` does, a clean
///   stop removes it — a restart is likely, and the next calls wait for a server at the
///   path (backing off from 10 ms to 250 ms, for at most their timeout) before they are
///   made; after a clean stop they fail at once.
///
/// So across a restart a client sees at most one failed call. A client made from a
/// right ([`Client::from_right`]) has no path to look at, and every call after the
/// server's death fails.
///
/// Dropping the client releases its right.
#[derive(Debug)]
pub struct Client {
    space: Space,
    address: Address,
    timeout: Duration,
    current: Mutex<Current>,
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

/// The first wait between two looks for a restarted name server.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest wait between two looks for a restarted name server (the first is
/// 10 ms); short enough that a client waiting for a restart is served
/// well within a second of the new server starting.
pub const MAX_BACKOFF: Duration = Duration::from_millis(250);

impl Client {
    /// Find the name server: through the inherited bootstrap right if this process was
    /// given one (and its port is alive), else through the well-known socket at its
    /// default path ([`socket::default_socket_path`]).
    pub fn connect(space: &Space) -> Result<Client, ConnectError> {
        if let Some(fd) = bootstrap_fd() {
            if let Ok(dup) = fd.as_fd().try_clone_to_owned() {
                let name = space.insert_send_fd(dup)?;
                if space.right_kinds(name).is_ok_and(|k| k.contains(&RightKind::Send)) {
                    return Ok(Client::with_address(space, name, Address::Default));
                }
                let _ = space.deallocate(name);
            }
        }
        let name = fetch(space, &socket::default_socket_path())?;
        Ok(Client::with_address(space, name, Address::Default))
    }

    /// Find the name server through the well-known socket at `path`.
    pub fn connect_socket(space: &Space, path: &Path) -> Result<Client, ConnectError> {
        let name = fetch(space, path)?;
        Ok(Client::with_address(space, name, Address::Socket(path.to_owned())))
    }

    /// Use a send right to the name server that this space already holds; the client
    /// takes over one user reference of it.
    pub fn from_right(space: &Space, server: Name) -> Client {
        Client::with_address(space, server, Address::Given)
    }

    fn with_address(space: &Space, server: Name, address: Address) -> Client {
        let stubs = NamesClient::new(space, server).with_timeout(DEFAULT_TIMEOUT);
        Client {
            space: space.clone(),
            address,
            timeout: DEFAULT_TIMEOUT,
            current: Mutex::new(Current { stubs, health: Health::Alive }),
        }
    }

    /// Wait at most `timeout` for each call (sending, then the reply; and, after the
    /// server died, for a new one).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        let current = self.current.get_mut().unwrap_or_else(PoisonError::into_inner);
        current.stubs = current.stubs.with_timeout(timeout);
        self.timeout = timeout;
        self
    }

    fn current(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The send right to the name server, in this client's space (a new name once the
    /// client has found a restarted server).
    pub fn server_port(&self) -> Name {
        self.current().stubs.port()
    }

    /// The typed stubs of the [`Names`](crate::protocol::Names) interface, for calls
    /// without this type's checks, error mapping and restarts. They use the client's
    /// right, which stays the client's: they must not outlive it.
    pub fn stubs(&self) -> NamesClient {
        self.current().stubs.clone()
    }

    /// Register `right` under `name`. `right` is a send right (copied: we keep ours) or
    /// a receive right (a send right is made from it).
    pub fn register(&self, name: &str, right: Name) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let port = self.send_right(right)?;
        self.call(name, |s| s.register(name, port))
    }

    /// Look `name` up. On success the returned name is a send right in this client's
    /// space; the caller owns one user reference of it (deallocate it when done).
    pub fn lookup(&self, name: &str) -> Result<Name, ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let right = self.call(name, |s| s.lookup(name))?;
        Ok(right.name)
    }

    /// Remove the registration of `name`. Allowed for the task that registered it.
    pub fn unregister(&self, name: &str) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        self.call(name, |s| s.unregister(name))
    }

    /// Remove the registration of `name`, proving the right to do so by presenting the
    /// registered right itself (a send right, copied; or a receive right, from which a
    /// send right is made). Works from any task that holds the right.
    pub fn unregister_with_right(&self, name: &str, right: Name) -> Result<(), ClientError> {
        protocol::validate_name(name.as_bytes())?;
        let proof = self.send_right(right)?;
        self.call(name, |s| s.unregister_with_right(name, proof))
    }

    /// The registered names, sorted. Each is checked to be a valid name, so that what
    /// a server sends cannot smuggle control characters into a terminal.
    pub fn list(&self) -> Result<Vec<String>, ClientError> {
        let names = self.call("", NamesClient::list)?;
        for n in &names {
            protocol::validate_name(n.as_bytes()).map_err(ReplyError::BadName)?;
        }
        Ok(names)
    }

    /// Make a call through the stubs, following a restarted server (see the type's
    /// documentation).
    fn call<T>(
        &self,
        name: &str,
        f: impl Fn(&NamesClient) -> Result<T, ictus_idl::ClientError<NamesError>>,
    ) -> Result<T, ClientError> {
        let stubs = {
            let mut current = self.current();
            if let Health::Dead { restart } = current.health {
                let deadline = restart.then(|| Instant::now() + self.timeout);
                if !self.revive(&mut current, deadline) {
                    return Err(ClientError::ServerDied);
                }
            }
            current.stubs.clone()
        };
        match f(&stubs) {
            Err(e) if dead_server(&e) => {}
            r => return r.map_err(|e| ClientError::from_call(name, e)),
        }
        let stubs = {
            let mut current = self.current();
            // Another thread may have found the new server meanwhile.
            if current.stubs.port() == stubs.port() {
                let restart = self.address.path().is_some_and(|p| socket_present(&p));
                current.health = Health::Dead { restart };
                if !self.revive(&mut current, None) {
                    return Err(ClientError::ServerDied);
                }
            }
            current.stubs.clone()
        };
        f(&stubs).map_err(|e| ClientError::from_call(name, e))
    }

    /// Look for a server at the client's address: once, or until `deadline` backing off.
    /// On success the stubs use it and the old right is released.
    fn revive(&self, current: &mut Current, deadline: Option<Instant>) -> bool {
        let Some(path) = self.address.path() else { return false };
        let mut backoff = FIRST_BACKOFF;
        loop {
            let left = deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
            // The handshake of a live server is immediate; do not let a wedged one hold
            // the caller longer than its own timeout.
            if let Ok(name) = fetch_within(&self.space, &path, left.max(MAX_BACKOFF).min(self.timeout)) {
                let old = current.stubs.port();
                current.stubs = NamesClient::new(&self.space, name).with_timeout(self.timeout);
                current.health = Health::Alive;
                if old != name {
                    let _ = self.space.deallocate(old);
                }
                return true;
            }
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
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
        let port = self.current().stubs.port();
        let _ = self.space.deallocate(port);
    }
}

/// Whether a stub call failed because the name server is gone.
fn dead_server(e: &ictus_idl::ClientError<NamesError>) -> bool {
    use ictus_idl::ClientError as Stub;
    matches!(
        e,
        Stub::Call(CallError::ServerDied)
            | Stub::Call(CallError::Send(SendError::InvalidDest(_)))
            | Stub::Call(CallError::Receive(ReceiveError::PortDied))
            | Stub::Send(SendError::InvalidDest(_))
    )
}

/// Whether a socket is at `path` (one left by a server that died, or a new server's).
fn socket_present(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Take the service right from the socket at `path` into `space`.
fn fetch(space: &Space, path: &Path) -> Result<Name, ConnectError> {
    fetch_within(space, path, DEFAULT_TIMEOUT)
}

fn fetch_within(space: &Space, path: &Path, timeout: Duration) -> Result<Name, ConnectError> {
    let fd = socket::fetch_service_fd(path, timeout)?;
    Ok(space.insert_send_fd(fd)?)
}
