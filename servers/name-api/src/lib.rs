//! The ictus name server's interface and client: the papers' `netname` (000 §4.5;
//! 002 §2.1), as a program that only registers or looks up names needs it. The server
//! itself is `ictus-name-server`; nothing here links it.
//!
//! - [`protocol`]: the interface, [`protocol::Names`], declared with
//!   `#[ictus_idl::interface(id = 4000)]` — its methods, message ids and encodings, its
//!   errors ([`protocol::NamesError`]) and the return codes that carry them, and its
//!   limits (names, registrations, registrations per task).
//! - [`client`]: [`Client`], which finds the server, makes the calls through the
//!   generated [`protocol::NamesClient`] stubs, and follows a server that restarts.
//! - [`socket`]: the well-known socket — where it is (`$XDG_RUNTIME_DIR/ictus/name-server.sock`,
//!   else `/tmp/ictus-$UID/name-server.sock`), and the client's half of its handshake.
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
//! use ictus_name_api::Client;
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

pub mod client;
pub mod protocol;
pub mod socket;

pub use client::{Client, ClientError, ConnectError};
pub use protocol::{NamesError, MAX_NAMES_PER_CLIENT};
