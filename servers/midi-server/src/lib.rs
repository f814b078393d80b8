//! The ictus MIDI input server (000 §4.3–4.6), its library input calls, and the
//! timing monitor (000 §5, Figure 1).
//!
//! - [`ring`]: the driver's ring — the paper's shared page and semaphore, as a memfd
//!   mapping and an eventfd.
//! - [`protocol`]: the interface, [`protocol::MidiInput`]
//!   (`#[ictus_idl::interface(id = 4500)]`), and the deliveries the server sends.
//! - [`server`]: the server — a driver thread reading the device into the ring, a
//!   server thread parsing, timestamping and sending each message to the clients
//!   subscribed to its class, dropping clients whose ports die.
//! - [`client`]: [`Input`], the library side: `get` and `getx`, blocking or not.
//! - [`monitor`]: the timing monitor — interarrival times binned one row per
//!   millisecond, drawn live in the terminal and as an SVG.
//! - [`cli`]: `ictus midi-server` and `ictus midi monitor`.
//!
//! See `doc/midi-server.md` for the design and what of the paper is left out.
#![deny(unsafe_code)]

pub mod cli;
pub mod client;
pub mod monitor;
pub mod protocol;
#[allow(unsafe_code)]
pub mod ring;
pub mod server;

pub use client::{Input, InputError, OpenError};
pub use protocol::{Class, InputStats, MidiError, SERVICE_NAME};
pub use server::{Options, Running, ServeError, Server};
