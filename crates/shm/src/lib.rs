//! Shared-memory channels: the fastest path of the papers (002 §3, 000 §8.4), made
//! safe against the clients it serves.
//!
//! - A client asks a server for a channel over an ictus port ([`Client::connect`]);
//!   the server makes the channel's memory (a sealed-size memfd, never a name in
//!   `/dev/shm`) and the wake-up objects and sends them back, with a *link* whose
//!   hang-up tells either end that the other closed or died (`setup`).
//! - Each channel has a request ring (the client moves the head, the server the
//!   tail) and a reply ring (the other way), both lock-free SPSC rings of
//!   variable-size records ([`ring`], [`record`]); a **loan** borrows space in the
//!   ring ([`Client::loan`]) or a buffer of the channel's pool ([`Client::loan_pool`])
//!   to write in place, then commits, so a frame is written once and never copied.
//! - One server flag, which only the server can write, tells clients whether the
//!   server sleeps; a client wakes it at most once per sleep, by ringing its own
//!   doorbell, and the server re-checks every ring before it sleeps ([`wake`]).
//!   Spin, then block; `futex_waitv` or `epoll`.
//! - Both ends have a pollable descriptor ([`std::os::fd::AsFd`]).
//! - The server never trusts the memory: counters, headers, lengths and pool slots
//!   are copied out once and checked; a client that scribbles is cut off, alone.
//!
//! `doc/shm.md` explains the design and what of the papers is left out.
#![deny(unsafe_code)]

#[cfg(all(feature = "tokio", not(loom)))]
#[allow(unsafe_code)]
pub mod aio;
/// The protocol core, shared with the Unix emulation library (no_std): the record
/// format, the ring and the wake-up protocol live in `ictus-shm-core`.
pub use ictus_shm_core::{record, ring, wake};
// The same atomics as the core's (loom's under `--cfg loom`), so that the segment's
// words are the rings' `RingMem` words (only the channel itself uses them: not
// built for the model check).
#[cfg(not(loom))]
use ictus_shm_core::sync;

#[cfg(not(loom))]
#[allow(unsafe_code)]
mod client;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
pub mod layout;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod segment;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod server;
#[cfg(not(loom))]
pub mod setup;
#[cfg(not(loom))]
mod sys;
#[cfg(not(loom))]
mod watch;

#[cfg(not(loom))]
pub use client::{Client, ClientOptions, ClientStats, Loan, PoolLoan, Reply, WaitConfig};
#[cfg(not(loom))]
pub use error::{CloseReason, ConnectError, RecvError, ReplyError, SendError, ServerError};
#[cfg(not(loom))]
pub use layout::Geometry;
#[cfg(not(loom))]
pub use segment::Payload;
#[cfg(not(loom))]
pub use server::{ClientId, Event, Held, Incoming, Next, Server, ServerConfig, ServerStats, SleepMode, Viewed};
#[cfg(not(loom))]
pub use sys::{mappings_named, open_fds};
#[cfg(not(loom))]
pub use watch::start_watcher;
