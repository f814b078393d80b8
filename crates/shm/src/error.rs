//! Errors, one enum per verb.

use crate::record::Corrupt;

/// Why a channel ended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloseReason {
    /// The other end closed its channel or exited (even by `kill -9`): its link hung up.
    #[error("the other end closed the channel or died")]
    PeerGone,
    /// The server cut this client off, saying why.
    #[error("cut off by the server: {0}")]
    CutOff(String),
    /// The other end wrote nonsense into shared memory.
    #[error("the other end corrupted the channel: {0}")]
    Corrupt(#[from] Corrupt),
    /// Closed by this end.
    #[error("closed here")]
    Local,
}

/// Why a channel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The request to the server's port failed.
    #[error("asking the server: {0}")]
    Call(#[from] ictus_ipc::CallError),
    /// The server refused, saying why.
    #[error("the server refused the channel: {0}")]
    Refused(String),
    /// What the server sent is not a valid channel.
    #[error("the server sent an invalid channel: {0}")]
    Invalid(String),
    /// The geometry asked for is not valid.
    #[error(transparent)]
    Geometry(#[from] crate::layout::GeometryError),
    /// The kernel refused.
    #[error("kernel: {0}")]
    Os(#[from] rustix::io::Errno),
}

/// Why a record could not be sent (or a loan made).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The ring (or the pool) has no room now; the server has not caught up.
    #[error("no room: the server has not caught up")]
    Full,
    /// The record is larger than the ring carries; use a pool loan.
    #[error("{len} bytes exceed the largest record of {max} bytes")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// The largest.
        max: usize,
    },
    /// The channel has no buffer pool.
    #[error("the channel has no buffer pool")]
    NoPool,
    /// No room came within the timeout.
    #[error("timed out waiting for room")]
    TimedOut,
    /// The channel is closed.
    #[error("channel closed: {0}")]
    Closed(CloseReason),
}

/// Why a record could not be received.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// Nothing arrived within the timeout.
    #[error("timed out")]
    TimedOut,
    /// The channel is closed.
    #[error("channel closed: {0}")]
    Closed(CloseReason),
}

/// Why a server could not reply to a client.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The client's reply ring is full: it is not reading.
    #[error("the client's reply ring is full")]
    Full,
    /// The reply is larger than the client's reply ring carries.
    #[error("{len} bytes exceed the largest reply of {max} bytes")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// The largest.
        max: usize,
    },
    /// No such client, or it is gone.
    #[error("no such client")]
    NoClient,
}

/// Why a server operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A rights operation on the service port failed.
    #[error("service port: {0}")]
    Rights(#[from] ictus_ipc::RightsError),
    /// The kernel refused.
    #[error("kernel: {0}")]
    Os(#[from] rustix::io::Errno),
}
