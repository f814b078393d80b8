//! The one error every server's start and loop return.

use ictus_ipc::{ReceiveError, RightsError};
use ictus_name_api::socket::PathError;
use rustix::io::Errno;

use crate::listener::ListenError;
use crate::ports::MAX_CONSECUTIVE_ERRORS;
use crate::registrar::RegisterError;

/// Why a server could not start, or had to stop. Each message is one line: what
/// failed and why (and what to do, where there is something to do); the command that
/// prints it says which server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Allocating or arranging the server's ports failed.
    #[error("cannot set up the server's ports: {0}")]
    Rights(#[from] RightsError),
    /// The well-known socket could not be set up.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The default socket directory is unsafe or could not be made.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The server's names could not be registered with the name server at start-up.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// Something of the server's own could not be made (its timer, its ring, …).
    #[error("the server's {what} failed: {source}")]
    Setup {
        /// What.
        what: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Receiving failed [`MAX_CONSECUTIVE_ERRORS`] times in a row.
    #[error("receiving requests failed {MAX_CONSECUTIVE_ERRORS} times in a row, the last with: {0}")]
    Receive(ReceiveError),
    /// Waiting for work failed.
    #[error("waiting for requests failed: {0}")]
    Poll(Errno),
    /// Setting up the stop channel or the signal handlers failed.
    #[error("cannot set up the stop channel and the signal handlers: {0}")]
    Signals(std::io::Error),
    /// The server thread could not be started.
    #[error("cannot start the server thread: {0}")]
    Thread(std::io::Error),
    /// The server thread panicked.
    #[error("the server thread panicked (a bug: please report it with the server's log)")]
    Panicked,
}

impl ServeError {
    /// A [`ServeError::Setup`] error.
    pub fn setup(what: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> ServeError {
        ServeError::Setup { what, source: Box::new(source) }
    }
}
