//! The ictus name server: the papers' `netname` (000 §4.5; 002 §2.1).
//!
//! A task registers a send right under a name; any task looks the name up and gets a
//! copy of the right; the registering task (or anyone holding the right) unregisters
//! it; a registration vanishes by itself when its port dies, because the server holds
//! a dead-name request for every registered right. `ictus names` lists the names.
//!
//! - [`protocol`]: the interface, [`protocol::Names`], declared with
//!   `#[ictus_idl::interface(id = 4000)]` — its methods, message ids and encodings, its
//!   errors ([`protocol::NamesError`]) and the return codes that carry them.
//! - [`server`]: the server ([`Server`]), which implements the interface and runs the
//!   generated [`protocol::NamesServer`] in a loop of its own beside its dead-name
//!   notifications, and [`server::spawn`] to run one on a thread.
//! - [`client`]: [`Client`], which finds the server and makes the calls through the
//!   generated [`protocol::NamesClient`] stubs.
//! - [`socket`]: the well-known socket — where it is (`$XDG_RUNTIME_DIR/ictus/name-server.sock`,
//!   else `/tmp/ictus-$UID/name-server.sock`), who is served, and how a stale path left
//!   by a killed server is reclaimed.
//! - [`cli`]: `ictus name-server` and `ictus names`.
//!
//! # Finding the name server
//!
//! [`Client::connect`] first takes the bootstrap right this process inherited (fd 3,
//! named by `ICTUS_BOOTSTRAP_FD`; see [`ictus_ipc::Space::give_bootstrap`]); a parent
//! that runs a name server, or has a right to one, hands it to its children that way.
//! Without one it connects to the well-known socket, which hands every caller of the
//! same uid (or root) a send right to the server's service port.
//!
//! ```no_run
//! use ictus_ipc::Space;
//! use ictus_name_server::Client;
//! let space = Space::task();
//! let ns = Client::connect(&space)?;
//! let port = space.allocate_port()?;
//! ns.register("metronome", port)?;
//! let right = ns.lookup("metronome")?;
//! # let _ = right;
//! ns.unregister("metronome")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod cli;
pub mod client;
pub mod protocol;
pub mod server;
pub mod socket;

pub use client::{Client, ClientError, ConnectError};
pub use server::{Running, ServeError, Server};
