//! The ictus clock service's interfaces and clients (000 §3.1), and the same services
//! in-process: all a program that reads the time, sleeps or asks for alarms needs. The
//! server is `ictus-clock-server`; nothing here links it (or the name server).
//!
//! - [`protocol`]: the two interfaces — [`protocol::Clock`] on the clock port (read the
//!   time since boot and the wall time, sleep until a time, set and cancel alarms) and
//!   [`protocol::ClockControl`] on the clock-control port (set the resolution and the
//!   per-client quota, read the counters) — and the [`AlarmMessage`] an alarm sends.
//! - [`client`]: [`Client`] (the clock port, found through the name server under
//!   `"clock"`) and [`Control`] (the control port, from the control socket).
//! - [`control`]: how the control port reaches only authorised tasks, and where its
//!   socket is.
//! - [`local`]: the same services without a server: sleep-until with
//!   `clock_nanosleep(TIMER_ABSTIME)`, alarm messages from a library timer thread.
//! - [`timer`]: the `timerfd` and `clock_nanosleep` wrappers the server and [`local`]
//!   use.
//!
//! See `doc/clock.md` for the design and what of the paper is left out.
//!
//! ```no_run
//! use std::time::Duration;
//! use ictus_ipc::Space;
//! use ictus_rt::When;
//! use ictus_clock_api::{AlarmMessage, Client};
//! let space = Space::task();
//! let clock = Client::connect(&space)?;
//! let (since_boot, _wall) = clock.read()?;
//! clock.sleep_until(since_boot + Duration::from_millis(10))?;
//! let port = space.allocate_port()?;
//! let (id, _at) = clock.set_alarm(When::After(Duration::from_millis(5)), port, 42)?;
//! # let _ = id;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod client;
pub mod control;
pub mod local;
pub mod protocol;
pub mod timer;
pub mod wait;

pub use client::{Client, ClientError, ConnectError, Control};
pub use protocol::{AlarmMessage, ClockError, ClockStats};
pub use wait::{AlarmReceiver, AlarmWait};
