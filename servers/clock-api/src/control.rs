//! How the clock-control port reaches authorised tasks, and only them.
//!
//! The paper gets the control port through the host privileged port. ictus has no
//! host port; the kernel's own file permissions and socket credentials stand in for
//! it. The server listens on a second well-known socket, the **control socket**:
//!
//! - `$XDG_RUNTIME_DIR/ictus/clock-control.sock`, else
//!   `/tmp/ictus-$UID/clock-control.sock` — beside the name server's socket, in the same
//!   private (`0700`, owned by the server's user) directory; `--control-socket PATH`
//!   overrides it;
//! - the socket itself has mode `0600`, so only the server's user (and root) can
//!   connect to it at all;
//! - on each connection the server reads `SO_PEERCRED` and hands the control port (one
//!   send right, `SCM_RIGHTS`) only to a peer whose uid is the server's own or root;
//!   anyone else is closed unanswered. The client checks the server's uid the same way.
//!
//! The mechanism (lock file, stale-socket reclaim, handshake) is the name server's
//! ([`ictus_name_api::socket`]); only the path and the right handed out differ.
//! The clock port, by contrast, is registered with the name server under
//! [`crate::protocol::SERVICE_NAME`], for everyone the name server serves.
//!
//! A holder may pass its control right on in a message, as any right; that is the
//! point of a capability. What a task cannot do is obtain it without being given it:
//! the right is a connected socket, and guessing a name in one's own space yields
//! nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ictus_ipc::{Name, RightsError, Space};
use ictus_name_api::socket::{self as ns_socket, FetchError, PathError};

/// The control socket's file name inside the per-user ictus directory.
pub const CONTROL_SOCKET_FILE: &str = "clock-control.sock";

/// The default control socket path for this process's environment and effective uid,
/// without making or checking anything.
pub fn default_control_socket_path() -> PathBuf {
    ns_socket::default_socket_path().with_file_name(CONTROL_SOCKET_FILE)
}

/// The default control socket path, its directory made private (`0700`) if missing
/// and checked.
pub fn prepare_default_control_socket_path() -> Result<PathBuf, PathError> {
    Ok(ns_socket::prepare_default_socket_path()?.with_file_name(CONTROL_SOCKET_FILE))
}

/// Why the control port could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Nothing listens at the path.
    #[error("no clock server hands out its control port at {0}: start `ictus clock-server` first")]
    NotRunning(PathBuf),
    /// The socket exists but we may not connect to it (its mode is `0600`: another
    /// user's).
    #[error("not allowed to connect to the clock-control socket {0}: the control port is for the clock server's user and root")]
    PermissionDenied(PathBuf),
    /// The server closed without handing out the right: it refused us (another uid).
    #[error("the clock server at {0} refused to hand out its control port: only its own user and root may have it")]
    Refused(PathBuf),
    /// The server's uid is neither ours nor root's.
    #[error("the clock-control socket {path} belongs to uid {uid}; not trusting it")]
    Untrusted {
        /// The socket path.
        path: PathBuf,
        /// The server's uid.
        uid: u32,
    },
    /// No answer in time.
    #[error("the clock server at {0} did not answer in time")]
    TimedOut(PathBuf),
    /// Anything else on the socket.
    #[error("the clock-control socket: {0}")]
    Socket(FetchError),
    /// The right could not be put in our space.
    #[error("taking the control port's send right: {0}")]
    Rights(#[from] RightsError),
}

/// Get a send right to the control port from the control socket at `path`, into
/// `space`.
pub fn fetch_control_port(space: &Space, path: &Path, timeout: Duration) -> Result<Name, ControlError> {
    let fd = ns_socket::fetch_service_fd(path, timeout).map_err(|e| match e {
        FetchError::NotRunning(p) => ControlError::NotRunning(p),
        FetchError::Untrusted { path, uid, .. } => ControlError::Untrusted { path, uid },
        FetchError::BadHandshake { path, .. } => ControlError::Refused(path),
        FetchError::TimedOut(p) => ControlError::TimedOut(p),
        FetchError::Os { errno, .. } if errno == rustix::io::Errno::ACCESS || errno == rustix::io::Errno::PERM => {
            ControlError::PermissionDenied(path.to_owned())
        }
        e => ControlError::Socket(e),
    })?;
    Ok(space.insert_send_fd(fd)?)
}
