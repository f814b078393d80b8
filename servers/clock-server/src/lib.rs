//! The ictus clock server (000 §3.1): the clock port and the privileged clock-control
//! port, an alarm queue and a timer.
//!
//! This crate is the server. The interfaces, the clients and the in-process services —
//! all a program that reads the time, sleeps or asks for alarms needs — are
//! `ictus-clock-api`, re-exported here ([`protocol`], [`client`], [`control`],
//! [`local`], [`timer`]) for programs that run a server and talk to it.
//!
//! - [`server`]: the server ([`Server`], and [`server::spawn`] to run one on a thread),
//!   on the server skeleton ([`ictus_server::Loop`]): an [`ictus_rt::AlarmQueue`], a
//!   `timerfd` on `CLOCK_MONOTONIC` with `TFD_TIMER_ABSTIME`, dead-name notifications
//!   for every port it holds, per-client quotas.
//! - [`cli`]: `ictus clock-server` and `ictus clock`.
//!
//! See `doc/clock.md` for the design and what of the paper is left out.
#![forbid(unsafe_code)]

pub mod cli;
pub mod server;

pub use ictus_clock_api::{client, control, local, protocol, timer, wait};
pub use ictus_clock_api::{
    AlarmMessage, AlarmReceiver, AlarmWait, Client, ClientError, ClockError, ClockStats, ConnectError, Control,
};
pub use server::{Running, ServeError, Server};
