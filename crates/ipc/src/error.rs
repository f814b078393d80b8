//! Errors, one enum per verb. Each maps to the Mach return code a C programmer expects.

use ictus_abi::{DecodeError, Name, ReturnCode};
use rustix::io::Errno;

use crate::message::Credentials;
use crate::ool::OolError;

/// Why an operation on names and rights failed (allocate, deallocate, mod-refs,
/// destroy, insert, extract, move-member, notification requests, attributes).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RightsError {
    /// The name denotes nothing in this space.
    #[error("name {0} denotes no right")]
    InvalidName(Name),
    /// The name denotes a right of the wrong kind for this operation.
    #[error("name {0} does not denote the right this needs")]
    InvalidRight(Name),
    /// An argument is out of range (a negative reference count, a zero queue limit).
    #[error("invalid value")]
    InvalidValue,
    /// A user-reference count would exceed its limit.
    #[error("user references of {0} would overflow")]
    UrefsOverflow(Name),
    /// The chosen name is already in use.
    #[error("name {0} already exists")]
    NameExists(Name),
    /// The space has no room for another name.
    #[error("name space is full")]
    NoSpace,
    /// The kernel refused (out of descriptors, memory).
    #[error("kernel: {0}")]
    Os(#[from] Errno),
}

impl RightsError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            RightsError::InvalidName(_) => ReturnCode::InvalidName,
            RightsError::InvalidRight(_) => ReturnCode::InvalidRight,
            RightsError::InvalidValue => ReturnCode::InvalidValue,
            RightsError::UrefsOverflow(_) => ReturnCode::UrefsOverflow,
            RightsError::NameExists(_) => ReturnCode::NameExists,
            RightsError::NoSpace => ReturnCode::NoSpace,
            RightsError::Os(_) => ReturnCode::ResourceShortage,
        }
    }
}

/// Why a send failed. On failure, rights the message was to move stay with the
/// sender, and out-of-line buffers are released.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The destination is not a send or send-once right here, or its port is dead.
    #[error("invalid destination {0}")]
    InvalidDest(Name),
    /// A right in the message (reply or body) is not held with that disposition.
    #[error("right {0} in the message is invalid for its disposition")]
    InvalidRight(Name),
    /// The destination's queue stayed full for the whole timeout.
    #[error("send timed out: the destination's queue is full")]
    TimedOut,
    /// The message carries more in-line bytes than the destination port takes (its
    /// receiver's limit, `Space::set_message_limit`). Nothing was sent.
    #[error("message of {size} in-line bytes is larger than the destination takes ({limit} bytes at most)")]
    TooLarge {
        /// The message's in-line bytes.
        size: u64,
        /// The most the port takes.
        limit: u32,
    },
    /// The message breaks a wire limit (too many rights or descriptors).
    #[error("message is malformed: {0}")]
    Invalid(#[from] DecodeError),
    /// An out-of-line buffer could not be sealed.
    #[error(transparent)]
    Ool(#[from] OolError),
    /// The kernel refused.
    #[error("kernel: {0}")]
    Os(#[from] Errno),
}

impl SendError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            SendError::InvalidDest(_) => ReturnCode::SendInvalidDest,
            SendError::InvalidRight(_) => ReturnCode::SendInvalidRight,
            SendError::TimedOut => ReturnCode::SendTimedOut,
            SendError::TooLarge { .. } => ReturnCode::SendTooLarge,
            SendError::Invalid(_) | SendError::Ool(_) => ReturnCode::SendInvalidData,
            SendError::Os(_) => ReturnCode::SendNoBuffer,
        }
    }
}

/// Why a receive failed.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The name is not a receive right or port set here.
    #[error("{0} is not a receive right or port set")]
    InvalidName(Name),
    /// No message arrived within the timeout.
    #[error("receive timed out")]
    TimedOut,
    /// The receive right was destroyed while waiting.
    #[error("the port died while receiving")]
    PortDied,
    /// The receive right moved to another space or task while waiting (Mach's
    /// `MACH_RCV_PORT_CHANGED`).
    #[error("the receive right moved away while receiving")]
    PortChanged,
    /// A message larger than the port takes arrived; it was destroyed unread (its
    /// descriptors closed, its in-line bytes never read), its sender told if it waited
    /// for a reply, and counted. The next receive goes on (Mach's `MACH_RCV_TOO_LARGE`).
    #[error(
        "refused a message of {size} in-line bytes from pid {}: the port takes {limit} at most",
        sender.map_or(0, |s| s.pid)
    )]
    TooLarge {
        /// The in-line bytes its header claims.
        size: u64,
        /// The most the port takes.
        limit: u32,
        /// Who sent it, if the kernel said.
        sender: Option<Credentials>,
    },
    /// A message arrived that is not well formed; it was destroyed (its descriptors
    /// closed, nothing inserted) and counted. The next receive goes on.
    #[error("malformed message from pid {} uid {}: {reason}", sender.map_or(0, |s| s.pid), sender.map_or(0, |s| s.uid))]
    Malformed {
        /// What was wrong.
        reason: String,
        /// Who sent it, if the kernel said.
        sender: Option<Credentials>,
    },
    /// The kernel refused.
    #[error("kernel: {0}")]
    Os(#[from] Errno),
}

impl ReceiveError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            ReceiveError::InvalidName(_) => ReturnCode::RcvInvalidName,
            ReceiveError::TimedOut => ReturnCode::RcvTimedOut,
            ReceiveError::PortDied => ReturnCode::RcvPortDied,
            ReceiveError::PortChanged => ReturnCode::RcvPortChanged,
            ReceiveError::TooLarge { .. } => ReturnCode::RcvTooLarge,
            ReceiveError::Malformed { .. } => ReturnCode::RcvInvalidData,
            ReceiveError::Os(_) => ReturnCode::Failure,
        }
    }
}

/// Why a call (send a request, wait for its reply) failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The request could not be sent.
    #[error("call: {0}")]
    Send(#[from] SendError),
    /// The reply could not be received.
    #[error("call: {0}")]
    Receive(#[from] ReceiveError),
    /// The server destroyed the reply right without answering — it died, or dropped
    /// the request.
    #[error("the server died or dropped the request without replying")]
    ServerDied,
}

impl CallError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            CallError::Send(e) => e.code(),
            CallError::Receive(e) => e.code(),
            CallError::ServerDied => ReturnCode::MigServerDied,
        }
    }
}
