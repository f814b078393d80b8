//! The ictus MIDI input server (000 §4.3–4.5) and the timing monitor (000 §5,
//! Figure 1).
//!
//! This crate is the server. The interface and the library input calls — all a
//! program that receives MIDI input needs — are `ictus-midi-api`, re-exported here
//! ([`protocol`], [`client`]) for programs that run a server and talk to it.
//!
//! - [`ring`]: the driver's ring — the paper's shared page and semaphore, as a memfd
//!   mapping and an eventfd.
//! - [`server`]: the server, on the server skeleton ([`ictus_server::Loop`]) — a driver
//!   thread reading the device into the ring, a server thread parsing, timestamping and
//!   sending each message to the clients subscribed to its class, dropping clients
//!   whose ports die.
//! - [`monitor`]: the timing monitor — interarrival times binned one row per
//!   millisecond, drawn live in the terminal and as an SVG.
//! - [`cli`]: `ictus midi-server` and `ictus midi monitor`.
//!
//! See `doc/midi-server.md` for the design and what of the paper is left out.
#![forbid(unsafe_code)]

pub mod cli;
pub mod monitor;
pub mod ring;
pub mod server;

pub use ictus_midi_api::{client, protocol};
pub use ictus_midi_api::{Class, Input, InputError, InputStats, MidiError, OpenError, SERVICE_NAME};
pub use server::{Options, Running, ServeError, Server};
