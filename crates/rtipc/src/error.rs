//! Errors, one enum per verb, each with the Mach return code of the paper.

use ictus_ipc::{Name, ReturnCode};

/// Why a real-time port could not be allocated.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// An attribute is out of range.
    #[error("invalid port attribute: {0}")]
    InvalidValue(&'static str),
    /// The kernel refused (descriptors, memory).
    #[error("kernel: {0}")]
    Os(#[from] std::io::Error),
    /// The name space refused the port's send right.
    #[error("name space: {0}")]
    Rights(#[from] ictus_ipc::RightsError),
}

impl AllocateError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            AllocateError::InvalidValue(_) => ReturnCode::InvalidValue,
            AllocateError::Os(_) => ReturnCode::ResourceShortage,
            AllocateError::Rights(e) => e.code(),
        }
    }
}

/// Why a thread could not associate with a port (`rt_mach_port_associate`).
#[derive(Debug, thiserror::Error)]
pub enum AssociateError {
    /// The name is not a real-time port this task receives from — for example a plain
    /// port (the paper's `KERN_INVALID_NAME`).
    #[error("{0} is not a real-time port held here")]
    InvalidName(Name),
    /// The calling thread is already associated with a port.
    #[error("this thread is already associated with a real-time port")]
    AlreadyAssociated,
    /// The port has been destroyed.
    #[error("the port is dead")]
    PortDied,
    /// The port is a member of a real-time port set: its messages are received through
    /// the set (associate with the set instead).
    #[error("the port is in a real-time port set; associate with the set")]
    InSet,
}

impl AssociateError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            AssociateError::InvalidName(_) => ReturnCode::InvalidName,
            AssociateError::AlreadyAssociated => ReturnCode::InvalidArgument,
            AssociateError::PortDied => ReturnCode::InvalidName,
            AssociateError::InSet => ReturnCode::InvalidRight,
        }
    }
}

/// Why a port could not be moved into or out of a real-time port set
/// (`mach_port_move_member` on real-time rights).
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The name denotes nothing here (`KERN_INVALID_NAME`).
    #[error("{0} denotes no right here")]
    InvalidName(Name),
    /// The name denotes the wrong kind of right: a plain port where a real-time port
    /// is needed, a plain (nucleus) port set where a real-time port set is needed
    /// (`KERN_INVALID_RIGHT`).
    #[error("{0} is not a real-time port or real-time port set held here")]
    InvalidRight(Name),
    /// The port has receivers of its own associated; dissociate them first.
    #[error("{0} has receivers associated with it")]
    Associated(Name),
    /// The port is not a member of that set (`KERN_NOT_IN_SET`).
    #[error("{0} is not in that port set")]
    NotInSet(Name),
    /// The set has as many members as it may.
    #[error("the port set is full")]
    Full,
    /// The kernel refused (adding the port to the set's `epoll`).
    #[error("kernel: {0}")]
    Os(#[from] std::io::Error),
}

impl MemberError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            MemberError::InvalidName(_) => ReturnCode::InvalidName,
            MemberError::InvalidRight(_) | MemberError::Associated(_) => ReturnCode::InvalidRight,
            MemberError::NotInSet(_) => ReturnCode::NotInSet,
            MemberError::Full => ReturnCode::NoSpace,
            MemberError::Os(_) => ReturnCode::ResourceShortage,
        }
    }
}

/// Why a real-time send or call failed (`rt_mach_msg`).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The destination is not a real-time port — for example a plain port (the
    /// paper's `MACH_SEND_INVALID_DEST`) — or it is dead.
    #[error("invalid destination {0}: {1}")]
    InvalidDest(Name, &'static str),
    /// The message is larger than the port's buffers.
    #[error("message of {len} bytes exceeds the port's {max}-byte buffers")]
    TooLarge {
        /// Its size.
        len: usize,
        /// The port's buffer size.
        max: usize,
    },
    /// The port's queue (its socket) is full and the send was not to wait.
    #[error("the destination's queue is full")]
    WouldBlock,
    /// The receiving task died, or destroyed the port, before replying.
    #[error("the server died or destroyed the port")]
    ServerDied,
    /// No reply came within the timeout.
    #[error("no reply within the timeout")]
    TimedOut,
    /// The reply was malformed or larger than the caller's buffer.
    #[error("bad reply: {0}")]
    BadReply(String),
    /// The kernel refused.
    #[error("kernel: {0}")]
    Os(#[from] std::io::Error),
}

impl SendError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            SendError::InvalidDest(..) => ReturnCode::SendInvalidDest,
            SendError::TooLarge { .. } => ReturnCode::SendInvalidData,
            SendError::WouldBlock | SendError::TimedOut => ReturnCode::SendTimedOut,
            SendError::ServerDied => ReturnCode::MigServerDied,
            SendError::BadReply(_) => ReturnCode::RcvInvalidData,
            SendError::Os(_) => ReturnCode::SendNoBuffer,
        }
    }
}

/// Why a receive failed.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The port was destroyed.
    #[error("the port died")]
    PortDied,
    /// Nothing arrived within the timeout.
    #[error("receive timed out")]
    TimedOut,
    /// The caller's buffer is smaller than the port's buffers.
    #[error("receive buffer of {have} bytes is smaller than the port's {need}")]
    BufferTooSmall {
        /// What the caller gave.
        have: usize,
        /// The port's buffer size.
        need: usize,
    },
    /// The kernel refused.
    #[error("kernel: {0}")]
    Os(#[from] std::io::Error),
}

impl ReceiveError {
    /// The Mach return code.
    pub fn code(&self) -> ReturnCode {
        match self {
            ReceiveError::PortDied => ReturnCode::RcvPortDied,
            ReceiveError::TimedOut => ReturnCode::RcvTimedOut,
            ReceiveError::BufferTooSmall { .. } => ReturnCode::RcvTooLarge,
            ReceiveError::Os(_) => ReturnCode::Failure,
        }
    }
}

/// Why a reply failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    /// The request was sent asynchronously: nobody waits for a reply.
    #[error("the request was asynchronous; there is nobody to reply to")]
    NotSynchronous,
    /// This request was already answered.
    #[error("the request was already answered")]
    AlreadyReplied,
    /// The reply is larger than a message may be.
    #[error("reply of {0} bytes is too large")]
    TooLarge(usize),
    /// The client is gone (it died or gave up); nothing was delivered.
    #[error("the client is gone")]
    ClientGone,
    /// The kernel refused.
    #[error("kernel: {0}")]
    Os(#[from] std::io::Error),
}
