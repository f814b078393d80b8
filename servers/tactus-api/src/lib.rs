//! Tactus: timestamped streams sent ahead of real time, delivered on time, kept in step
//! (000 §7, Figure 2).
//!
//! The pure cores, tested on virtual clocks:
//!
//! - [`timemap`]: a presentation's logical-to-real time map (start, pause, resume,
//!   seek, rate), with epochs so that a seek flushes exactly what it should;
//! - [`drift`]: tracking a drifting device clock (an audio sample clock) so that the
//!   other streams follow it;
//! - [`policy`]: early, on time, late-and-shown or late-and-dropped, and the counts;
//! - [`buffer`]: buffer levels and underruns.
//!
//! The wire ([`proto`]) and the media files clients read ([`media`]: Y4M, WAV).
//!
//! The client ([`Tactus`]): presentations and streams over a shared-memory channel,
//! items sent ahead of their time (large ones written in place into pool buffers),
//! reports back. The toolkit ([`toolkit`]): active objects run early by a managed lead.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod buffer;
pub mod client;
pub mod drift;
pub mod media;
pub mod policy;
pub mod proto;
pub mod timemap;
pub mod toolkit;

pub use client::{
    monotonic_ns, ConnectError, ConnectOptions, PresentationId, StreamId, StreamSpec, Tactus, TactusError,
    TactusService, TactusServiceClient, TactusServiceServer, Transport, SERVICE_NAME,
};
pub use policy::LatePolicy;
pub use proto::{Report, StreamKind};
