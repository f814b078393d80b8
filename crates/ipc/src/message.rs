//! Messages as the caller sees them: what goes out, what comes in.

use std::fmt;
use std::time::Duration;

use ictus_abi::{Name, DATAGRAM_MAX};

use crate::ool::{OolBuffer, OolRegion};

/// How a right is taken from the sender's name space when a message carries it
/// (Mach's `MACH_MSG_TYPE_*` dispositions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Move the receive right: the sender loses it, queued messages go with it.
    MoveReceive,
    /// Move one user reference of a send right.
    MoveSend,
    /// Copy a send right; the sender keeps its references.
    CopySend,
    /// Make a new send right from a receive right the sender holds.
    MakeSend,
    /// Make a new send-once right from a receive right the sender holds.
    MakeSendOnce,
    /// Move a send-once right.
    MoveSendOnce,
}

/// The kind of right a name denotes, or a message delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RightKind {
    /// A send right.
    Send,
    /// A send-once right.
    SendOnce,
    /// A receive right.
    Receive,
    /// A dead name: a send or send-once right whose port died.
    DeadName,
    /// A port set.
    PortSet,
}

/// A right named in an outgoing message, with how to take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortArg {
    /// The name in the sender's space.
    pub name: Name,
    /// How to take it.
    pub disposition: Disposition,
}

impl PortArg {
    /// A right taken by `disposition`.
    pub fn new(name: Name, disposition: Disposition) -> PortArg {
        PortArg { name, disposition }
    }
}

/// An outgoing message.
///
/// In-line data is copied into the receiver; out-of-line buffers are moved without a
/// copy and sealed so that nobody can change them after sending; port rights travel as
/// kernel descriptors.
#[derive(Debug, Default)]
pub struct Message {
    /// What the receiver is asked to do (Mach's `msgh_id`).
    pub id: i32,
    /// A right for the receiver to reply through.
    pub reply: Option<PortArg>,
    /// In-line data.
    pub data: Vec<u8>,
    /// Port rights in the body.
    pub ports: Vec<PortArg>,
    /// Out-of-line regions in the body; moved out of the message by a send.
    pub ool: Vec<OolBuffer>,
}

impl Message {
    /// A message with this id and in-line data.
    pub fn new(id: i32, data: impl Into<Vec<u8>>) -> Message {
        Message { id, data: data.into(), ..Message::default() }
    }
}

/// Options for a send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// How long to wait while the destination's queue is full. `None` waits for ever;
    /// `Some(Duration::ZERO)` does not wait.
    pub timeout: Option<Duration>,
}

impl SendOptions {
    /// Do not wait when the queue is full.
    pub const NONBLOCKING: SendOptions = SendOptions { timeout: Some(Duration::ZERO) };
}

/// Options for a receive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiveOptions {
    /// How long to wait for a message. `None` waits for ever; `Some(Duration::ZERO)`
    /// does not wait.
    pub timeout: Option<Duration>,
    /// Map out-of-line regions with every page present (`MAP_POPULATE`).
    pub populate_ool: bool,
}

/// The identity of a message's sender, as the kernel verified it (`SCM_CREDENTIALS`).
///
/// The uid and gid are the sender's *real* ids: what the kernel stamps on a message
/// whose sender attached no credentials of its own (`scm_send` with `current_uid()`),
/// and ictus never attaches any. A sender whose effective ids differ (a root daemon
/// running as `nobody` for a while, a set-user-id program) can take its real ids back
/// at will, so they are the ids it holds for good; a receiver that must know the
/// effective ids asks the sender to drop the others first (`doc/ipc.md`, *Sender
/// identity*). A process cannot claim another's pid, uid or gid unless it holds
/// `CAP_SYS_ADMIN` (pid) or `CAP_SETUID`/`CAP_SETGID` (ids), as `unix(7)` describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Credentials {
    /// Process id (thread group id) of the sender.
    pub pid: u32,
    /// Real user id of the sender.
    pub uid: u32,
    /// Real group id of the sender.
    pub gid: u32,
}

/// A right delivered in a message, as inserted in the receiver's space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceivedRight {
    /// Its name in the receiver's space.
    pub name: Name,
    /// What it is.
    pub kind: RightKind,
}

/// A received message. Reuse one across receives to avoid allocating a buffer each time.
pub struct Received {
    /// The message id.
    pub id: i32,
    /// The sequence number the port gave this message.
    pub seqno: u64,
    /// Who sent it, as the kernel verified. For a notification generated inside this
    /// task (send-once), the task's own credentials.
    pub sender: Credentials,
    /// The port (or port set member) it arrived on; `Name::NULL` for a reply to `call`.
    pub port: Name,
    /// The reply right, inserted in this space.
    pub reply: Option<ReceivedRight>,
    /// Port rights from the body, inserted in this space, in order.
    pub ports: Vec<ReceivedRight>,
    /// Out-of-line regions from the body, in order.
    pub ool: Vec<OolRegion>,
    pub(crate) buf: Vec<u8>,
    pub(crate) data_start: usize,
    pub(crate) data_end: usize,
    /// Big in-line data: the sender's sealed memfd, mapped read-only while the message
    /// is held, and unmapped with it.
    pub(crate) big: Option<OolRegion>,
}

impl Received {
    /// An empty message with room for any datagram.
    pub fn new() -> Received {
        Received {
            id: 0,
            seqno: 0,
            sender: Credentials::default(),
            port: Name::NULL,
            reply: None,
            ports: Vec::new(),
            ool: Vec::new(),
            buf: vec![0; DATAGRAM_MAX],
            data_start: 0,
            data_end: 0,
            big: None,
        }
    }

    /// The in-line data.
    pub fn data(&self) -> &[u8] {
        match &self.big {
            Some(big) => big,
            None => &self.buf[self.data_start..self.data_end],
        }
    }

    pub(crate) fn reset(&mut self) {
        self.id = 0;
        self.seqno = 0;
        self.sender = Credentials::default();
        self.port = Name::NULL;
        self.reply = None;
        self.ports.clear();
        self.ool.clear();
        self.data_start = 0;
        self.data_end = 0;
        // Big in-line data is unmapped with its message: nothing of it stays.
        self.big = None;
    }
}

impl Default for Received {
    fn default() -> Self {
        Received::new()
    }
}

impl fmt::Debug for Received {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Received")
            .field("id", &self.id)
            .field("seqno", &self.seqno)
            .field("sender", &self.sender)
            .field("port", &self.port)
            .field("reply", &self.reply)
            .field("ports", &self.ports)
            .field("ool", &self.ool)
            .field("data_len", &self.data().len())
            .finish()
    }
}
