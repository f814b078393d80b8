//! The server skeleton: what every ictus server does besides its own work, written once.
//!
//! A server is a value that implements [`Serve`] — what to do with a request, with a
//! right that died, with its own descriptors — and this crate runs it:
//!
//! - [`ServicePorts`]: its `N` service ports and a notify port, in one port set;
//! - [`Loop`]: the receive loop, one `poll` on a stop channel, the port set, a
//!   well-known socket ([`Door`], [`Listener`]) and the server's own descriptors;
//!   dead-name notifications told from requests by their kernel-verified sender;
//!   malformed messages counted; batches so that no source starves the others;
//! - [`DeadNameWatches`]: one counted dead-name request per right the server keeps for
//!   its clients (alarm ports, subscribers, registered rights);
//! - [`Running`]: a server on a thread of this process, stopped and joined on drop;
//!   [`serve_until_signalled`]: a server in the foreground until `SIGTERM`/`SIGINT`;
//! - [`Listener::activated_or_bind`] and [`notify`]: a server as a system service,
//!   its socket passed by systemd (socket activation) and its readiness told
//!   (`sd_notify`);
//! - [`Registrar`]: the server's names with the name server, registered again when the
//!   name server restarts;
//! - [`ServeError`]: the one error of a server's start and loop;
//! - [`log`]: the logs (`tracing`, `RUST_LOG`, `-v`/`-q`, one line per event or JSON)
//!   and [`rtlog`], the preallocated ring real-time paths log through;
//! - error codes: a server's error enum maps to [`ictus_abi::ReturnCode`], which is open
//!   (any `u32`), with Mach's codes as constants.
//!
//! The name server, the clock server and the MIDI input server are written on it;
//! `doc/interfaces.md` shows how to write a new one.
//!
//! # Why a crate of its own
//!
//! Not `ictus-idl`, where the dispatcher ([`ictus_idl::Server`]) lives: every client
//! links `ictus-idl` for its stubs, and none needs a poll loop, signal handling or a
//! listening socket. And the [`Registrar`] is a client of the name server, whose client
//! (`ictus-name-api`) is itself built on `ictus-idl`: the skeleton sits above both.
//!
//! # A server in thirty lines
//!
//! ```no_run
//! use ictus_idl::{interface, Dispatched, Status};
//! use ictus_ipc::{Received, Space};
//! use ictus_server::{serve_until_signalled, Loop, Registrar, Serve, ServeError, ServicePorts};
//!
//! #[interface(id = 7000)]
//! pub trait Echo {
//!     #[id(0)]
//!     fn echo(&self, text: String) -> Result<String, Status>;
//! }
//!
//! struct Impl;
//! impl Echo for Impl {
//!     fn echo(&self, text: String) -> Result<String, Status> {
//!         Ok(text)
//!     }
//! }
//!
//! /// The server: the dispatcher generated from `Echo` (and, in a real server, its
//! /// state, its timers, the rights it keeps for its clients).
//! struct Echoing(ictus_idl::Server);
//! impl Serve for Echoing {
//!     const NAME: &'static str = "echo-server";
//!     fn request(&mut self, msg: &mut Received) -> Dispatched {
//!         self.0.handle(msg)
//!     }
//! }
//!
//! fn main() -> Result<(), ServeError> {
//!     let space = Space::task();
//!     let ports = ServicePorts::<1>::allocate(&space)?;
//!     let requests = ictus_idl::Server::new(&space, ports.set()).with(EchoServer(Impl));
//!     let service = ports.service(0);
//!     let mut server = Loop::new(&space, ports, Echoing(requests));
//!     let names = Registrar::start("echo-server", None, &space, &[("echo", service)])?;
//!     serve_until_signalled(|stop| server.run(None, stop))?;
//!     names.stop();
//!     Ok(())
//! }
//! ```
#![forbid(unsafe_code)]

mod error;
mod listener;
pub mod log;
pub mod notify;
mod ports;
mod registrar;
pub mod rtlog;
mod running;
mod serve;

pub use error::ServeError;
pub use listener::{ListenError, Listener, Occupied};
pub use ports::{DeadNameWatches, ReceiveCounts, ServicePorts, MAX_CONSECUTIVE_ERRORS, SMALL_REQUESTS};
pub use registrar::{RegisterError, Registrar, MAX_BACKOFF};
pub use running::{serve_until_signalled, Running};
pub use serve::{Door, Loop, Serve, Wait, BATCH};
