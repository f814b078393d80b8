//! The ictus name server: the papers' `netname` (000 §4.5; 002 §2.1).
//!
//! A task registers a send right under a name; any task looks the name up and gets a
//! copy of the right; the registering task (or anyone holding the right) unregisters
//! it; a registration vanishes by itself when its port dies, because the server holds
//! a dead-name request for every registered right. `ictus names` lists the names.
//!
//! This crate is the server. The interface and the client — all a program that
//! registers or looks up names needs — are `ictus-name-api`, re-exported here as
//! [`protocol`], [`client`] and [`socket`] for programs that run a server and talk to
//! it.
//!
//! - [`server`]: the server ([`Server`]), which implements the interface on the server
//!   skeleton ([`ictus_server::Loop`]), its per-task quota, its recovery after a crash,
//!   and [`server::spawn`] to run one on a thread.
//! - [`cli`]: `ictus name-server` and `ictus names`.
//!
//! See `doc/name-server.md` for the design, and how servers and clients live through a
//! restart of the name server.
#![forbid(unsafe_code)]

pub mod cli;
pub mod server;

pub use ictus_name_api::{client, protocol, socket, Client, ClientError, ConnectError};
pub use server::{Running, ServeError, Server};
