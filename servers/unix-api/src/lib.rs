//! The control interface of `ictus unix-server` (004): what a user asks the long-lived
//! Unix server that runs their programs. The server is `ictus-unix-server`; nothing
//! here links it.
//!
//! - [`protocol`]: the interface, [`protocol::UnixControl`], declared with
//!   `#[ictus_idl::interface(id = 4900)]` — counts (in total and per program), the
//!   programs served, the policy read and replaced — and its errors.
//! - [`Control`]: the client, which finds the server through the name server under
//!   [`SERVICE_NAME`].
//!
//! Anyone holding a send right to the control port may read; only the server's user
//! and root may replace the policy, by the uid the kernel stamped on the request (the
//! message trailer's credentials), not by anything the client says.
//!
//! ```no_run
//! use ictus_ipc::Space;
//! use ictus_unix_api::Control;
//! let space = Space::task();
//! let unix = Control::connect(&space, None)?;
//! let stats = unix.stats()?;
//! println!("{} requests served", stats.total.served);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod protocol;

use std::path::Path;
use std::time::Duration;

use ictus_idl::ClientError as StubError;
use ictus_ipc::{Name, Space};

pub use protocol::{
    Counts, NativeLookups, PolicyChange, Program, Programs, ServerStats, UnixControl, UnixControlClient,
    UnixControlServer, UnixError, MAX_POLICY, MESSAGE_LIMIT, SERVICE_NAME,
};

/// How long a call may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the server could not be found.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The name server could not be reached.
    #[error(transparent)]
    NameServer(#[from] ictus_name_api::ConnectError),
    /// The name server does not know the name.
    #[error(
        "no Unix server is registered as {name:?} with the name server ({source}): start `ictus unix-server` first"
    )]
    NotRegistered {
        /// The name looked up.
        name: String,
        /// The name server's answer.
        source: ictus_name_api::ClientError,
    },
}

/// Why a control request failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The server refused it.
    #[error("the Unix server refused: {0}")]
    Refused(UnixError),
    /// The server is gone (it died or stopped while we asked).
    #[error("the Unix server is gone")]
    ServerDied,
    /// Anything else on the way.
    #[error("asking the Unix server: {0}")]
    Call(String),
}

impl From<StubError<UnixError>> for ControlError {
    fn from(e: StubError<UnixError>) -> ControlError {
        match e {
            StubError::Remote(u) => ControlError::Refused(u),
            e if e.server_died() => ControlError::ServerDied,
            e => ControlError::Call(e.to_string()),
        }
    }
}

/// A client of the control port.
#[derive(Debug, Clone)]
pub struct Control {
    stubs: UnixControlClient,
}

impl Control {
    /// Find the server through the name server (at the socket `name_server`, else as
    /// `ictus_name_api::Client::connect` finds it: the bootstrap right, then the
    /// well-known socket) under [`SERVICE_NAME`].
    pub fn connect(space: &Space, name_server: Option<&Path>) -> Result<Control, ConnectError> {
        Control::connect_as(space, name_server, SERVICE_NAME)
    }

    /// The same, under another name.
    pub fn connect_as(space: &Space, name_server: Option<&Path>, name: &str) -> Result<Control, ConnectError> {
        let ns = match name_server {
            Some(p) => ictus_name_api::Client::connect_socket(space, p)?,
            None => ictus_name_api::Client::connect(space)?,
        };
        let right = ns.lookup(name).map_err(|source| ConnectError::NotRegistered { name: name.to_owned(), source })?;
        Ok(Control::from_right(space, right))
    }

    /// Use a send right to the control port this space holds (takes over one user
    /// reference of it).
    pub fn from_right(space: &Space, port: Name) -> Control {
        Control { stubs: UnixControlClient::new(space, port).with_timeout(DEFAULT_TIMEOUT) }
    }

    /// Wait at most `timeout` for each call.
    pub fn with_timeout(mut self, timeout: Duration) -> Control {
        self.stubs = self.stubs.with_timeout(timeout);
        self
    }

    /// The server's counts, in total.
    pub fn stats(&self) -> Result<ServerStats, ControlError> {
        Ok(self.stubs.stats()?)
    }

    /// The programs the server serves now (and their counts).
    pub fn programs(&self) -> Result<Vec<Program>, ControlError> {
        Ok(self.stubs.programs()?.0)
    }

    /// The policy programs started now get: its number (1 for the one the server
    /// started with, one more per change) and its text.
    pub fn policy(&self) -> Result<(u64, String), ControlError> {
        Ok(self.stubs.policy()?)
    }

    /// Replace the policy for programs started from now on; programs running keep
    /// theirs. The server checks it first: an invalid one is refused with the reason.
    pub fn set_policy(&self, text: &str) -> Result<PolicyChange, ControlError> {
        if text.len() > MAX_POLICY {
            return Err(ControlError::Refused(UnixError::TooLong));
        }
        Ok(self.stubs.set_policy(text)?)
    }
}
