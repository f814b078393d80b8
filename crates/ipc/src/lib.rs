//! The ictus nucleus: Mach ports, rights and messages, enforced by the Linux kernel.
//!
//! - A **port** is a message queue with one receive right and any number of send and
//!   send-once rights. Here it is reached through `AF_UNIX SOCK_SEQPACKET`
//!   connections: rights are socket descriptors, so a task can reach only the ports
//!   the kernel has given it descriptors for, and a task that dies — even by
//!   `kill -9` — releases them all, which its peers see as hang-ups and turn into
//!   dead-name and no-senders notifications.
//! - A **space** ([`Space`]) is a task's table of port names with user-reference
//!   counts, as in Mach: allocate, deallocate, mod-refs, destroy, insert and extract
//!   rights, port sets.
//! - A **message** ([`Message`]) carries in-line data (copied), out-of-line memory
//!   (sealed memfds: moved, never copied, and immutable once sent), and port rights
//!   taken by Mach's dispositions, plus a reply right. The receiver gets a sequence
//!   number and the sender's pid, uid and gid as the kernel verified them.
//!
//! `doc/ipc.md` explains the design and what of Mach is left out.
//!
//! ```no_run
//! use ictus_ipc::{Message, ReceiveOptions, Received, SendOptions, Space};
//! let space = Space::new();
//! let port = space.allocate_port_with_send()?;
//! space.send(port, &mut Message::new(7, b"hello".to_vec()), SendOptions::default())?;
//! let mut msg = Received::new();
//! space.receive(port, &mut msg, ReceiveOptions::default())?;
//! assert_eq!((msg.id, msg.data()), (7, &b"hello"[..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

#[cfg(feature = "tokio")]
#[allow(unsafe_code)]
pub mod aio;
mod bootstrap;
mod call;
mod channel;
mod error;
mod incoming;
mod message;
mod notify;
#[allow(unsafe_code)]
mod ool;
mod plan;
mod port;
mod queue;
mod receive;
mod send;
mod set;
mod space;
#[allow(unsafe_code)]
mod sys;
mod table;

pub use error::{CallError, ReceiveError, RightsError, SendError};
pub use ictus_abi::{Name, NotifyId, ReturnCode};
pub use message::{
    Credentials, Disposition, Message, PortArg, ReceiveOptions, Received, ReceivedRight, RightKind, SendOptions,
};
pub use notify::{HangUpWatch, NotifyKind};
pub use ool::{OolBuffer, OolError, OolRegion};
pub use port::{DEFAULT_QLIMIT, MAX_QLIMIT};
pub use space::{PortStatus, Space, SpaceStats};
pub use table::{MAX_NAMES, UREFS_MAX};

/// The environment variable that tells a child which descriptor is its bootstrap port.
pub const BOOTSTRAP_ENV: &str = "ICTUS_BOOTSTRAP_FD";
/// The descriptor number a child's bootstrap port is given.
pub const BOOTSTRAP_FD: i32 = 3;
