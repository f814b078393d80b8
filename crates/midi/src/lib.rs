//! MIDI for ictus (paper 000 §4–5): the byte-stream parser, devices, the timed output
//! library, Standard MIDI File playback and conducting.
//!
//! - [`parse`]: the MIDI 1.0 byte-stream parser and encoder. Pure: no I/O, the time of
//!   each byte is a parameter.
//! - [`device`]: MIDI byte devices — the virtual cable (always there, cross-process,
//!   optionally paced at 31250 baud), ALSA raw MIDI device files, serial ports.
//! - [`output`]: the paper's `libmtmidi` output side — `open`, `put(message, time)`,
//!   `close(drain | discard)`, a timed queue and an immediate queue served by two threads.
//! - [`smf`]: Standard MIDI Files: tempo maps, merged tracks, the demo file.
//! - [`conduct`]: the conducting program's tempo follower (pure).
//! - [`play`]: a score through the output library, at its tempo or following taps.
//!
//! See `doc/midi.md` for the design and what of the paper is left out.
#![deny(unsafe_code)]

pub mod conduct;
pub mod device;
pub mod output;
pub mod parse;
pub mod play;
pub mod smf;

pub use parse::{Encoder, Kind, Message, MessageError, Parser, Stats};
