//! The ictus MIDI input server's interface and the library input calls (000 §4.5–4.6):
//! all a program that receives MIDI input needs. The server, its driver ring and the
//! timing monitor are `ictus-midi-server`; nothing here links them (or the name
//! server).
//!
//! - [`protocol`]: the interface, [`protocol::MidiInput`]
//!   (`#[ictus_idl::interface(id = 4500)]`), and the deliveries the server sends.
//! - [`client`]: [`Input`], the library side: `get` and `getx`, blocking or not.
//!
//! See `doc/midi-server.md` for the design and what of the paper is left out.
#![forbid(unsafe_code)]

pub mod client;
pub mod protocol;

pub use client::{Input, InputError, OpenError};
pub use protocol::{Class, InputStats, MidiError, SERVICE_NAME};
