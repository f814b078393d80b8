//! The MARS stream server's interfaces and clients (001 §4.6): all a program that opens
//! and drives streams, or changes the server's Deficit Round Robin quanta, needs. The
//! server is `ictus-mars-server`; nothing here links it.
//!
//! - [`protocol`]: [`protocol::Streams`] on the streams port (registered with the name
//!   server as `"mars"`): open, read, send, read-and-send, state, close, stats — each
//!   taking many streams in one call; [`protocol::MarsControl`] on the control port
//!   (quanta, classes); the words a stream's state and the server's counters travel as.
//! - [`client`]: [`Client`] (the streams port, through the name server) and [`Control`]
//!   (the control port, from the control socket), with typed arguments and checked
//!   replies.
//!
//! See `doc/mars.md`.
//!
//! ```no_run
//! use ictus_ipc::Space;
//! use ictus_mars_api::{Client, OpenStream};
//! let space = Space::task();
//! let mars = Client::connect(&space)?;
//! let owner = space.allocate_port()?; // when it dies, the server closes our streams
//! let wanted = [OpenStream { name: "films/clip.ts".into(), dest: "127.0.0.1:9000".into(), offset: 0, rate: 2_000_000 }];
//! let opened = mars.open(owner, &wanted, 16)?;
//! let ids: Vec<u64> = opened.into_iter().filter_map(Result::ok).collect();
//! let states = mars.state(&ids)?;
//! # let _ = states;
//! mars.close(&ids)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod client;
pub mod protocol;

pub use client::{Class, Client, ClientError, ConnectError, Control, OpenStream};
pub use protocol::{Stats, StreamError, StreamState, MAX_BATCH, SERVICE_NAME};
