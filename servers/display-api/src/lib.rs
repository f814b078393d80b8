//! The ictus display: its protocol and client library.
//!
//! A client draws into windows of the display server (`ictus display`) the way an X11
//! client draws into an X server (002): requests are buffered here and sent on
//! [`Display::flush`]; [`Display::sync`] waits until the server has done them
//! (`XSync`), [`Display::sync_shown`] until what they drew has reached the screen.
//! The same requests travel over the transport the client picks ([`Transport`]):
//!
//! - **a stream socket**, the baseline, like X11's own;
//! - **port messages**: a batch of requests in-line, images out-of-line (sealed memfds,
//!   moved, never copied), a sync as a call;
//! - **a shared-memory ring** (`ictus-shm`): a batch per record, the server woken at most
//!   once per sleep through its single flag, frames written straight into buffers
//!   lent from the channel's pool, which the server hands to the X server (MIT-SHM)
//!   without a copy.
//!
//! Frames for video ([`Display::frame`]) are presented at a target time on the
//! `CLOCK_MONOTONIC` clock and answered with [`Message::Frame`]: when the screen had it,
//! or that it was dropped. `doc/display.md` explains the design.
//!
//! ```no_run
//! use ictus_display::{Display, ConnectOptions, Rect, Transport};
//! let mut d = Display::connect(&ConnectOptions::new(Transport::Shm))?;
//! let w = d.create_window(None, Rect::new(0, 0, 256, 256), 0x000000)?;
//! d.xor_rect(w, Rect::new(0, 0, 256, 256), 0xffffff)?;
//! d.sync()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

mod client;
pub mod proto;
pub mod spin;

pub use client::{
    monotonic_ns, ConnectError, ConnectOptions, Display, DisplayError, Frame, ServerInfo, SyncInfo, Transport, Window,
};
pub use proto::{Message, RasterOp, Rect, Request, Segment, Source};

/// The name the display server registers with the name server.
pub const SERVICE_NAME: &str = "display";

/// Messages on the display server's service port.
pub mod service {
    /// Open a connection: version (u32), transport (u8: 0 socket, 1 port, 2 shm).
    pub const OPEN: i32 = 0x4449_5300;
    /// The answer: version, screen width and height (u16 each), then per transport the
    /// socket's path, or a right (the client's request port, the channel service).
    pub const OPEN_OK: i32 = OPEN + 100;
    /// A refusal; the data says why.
    pub const OPEN_REFUSED: i32 = OPEN + 101;
    /// A batch of requests on a client's request port (one way); attachments out-of-line.
    pub const BATCH: i32 = OPEN + 1;
    /// A batch ending with a sync, as a call: the reply carries the synced message.
    pub const BATCH_SYNC: i32 = OPEN + 2;
    /// Messages (events) to a client's event port.
    pub const EVENTS: i32 = OPEN + 3;
    /// The reply to [`BATCH_SYNC`].
    pub const SYNCED: i32 = OPEN + 4;
    /// Record tag of a batch in a shared-memory channel.
    pub const TAG_BATCH: u32 = 1;
    /// Record tag of an attachment (a pool buffer) in a shared-memory channel.
    pub const TAG_ATTACH: u32 = 2;
}
