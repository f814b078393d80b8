//! Unix as an application (004): the user-level Unix server.
//!
//! - [`policy`]: the policy file (pure). [`view`]: the program's view of the file
//!   tree and path resolution in it (pure, the file system a parameter).
//!   [`filter`]: the session's seccomp filter (pure).
//! - [`server`]: the server — a session socket, a thread pool over one epoll, one
//!   connection per program thread, every request checked ([`ictus_unix_emul::wire`])
//!   and served in the view by [`ops`].
//! - [`launch`]: `ictus unix run`: a private server, the first process with Landlock
//!   and the loader.
//! - [`daemon`]: `ictus unix-server`: one server for several programs, registered
//!   with the name server, its control port ([`control_api`]) and its run socket.
//!
//! `doc/unix.md` explains the design, the trust boundary and what is left out.
#![deny(unsafe_code)]

pub mod bench;
pub mod daemon;
pub mod filter;
pub mod launch;
pub mod ops;
pub mod policy;
pub mod server;
#[allow(unsafe_code)]
mod sys;
pub mod view;
pub mod watch;

/// The control interface and its client (`ictus-unix-api`).
pub use ictus_unix_api as control_api;
pub use launch::{exit_like, run, run_session, Ended, GenerationBumps, RunError, RunOptions, Snapshot};
