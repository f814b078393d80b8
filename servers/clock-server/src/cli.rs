//! What `ictus clock-server` does.

use std::path::PathBuf;

use ictus_ipc::Space;
use ictus_server::{serve_until_signalled, Listener, Registrar};

use crate::control;
use crate::protocol::SERVICE_NAME;
use crate::server::{ServeError, Server};

/// Why `ictus clock-server` stopped.
pub type CliError = ServeError;

/// Options of `ictus clock-server`.
#[derive(Debug, Default)]
pub struct ServeOptions {
    /// The name server's socket [default: its default path].
    pub name_server: Option<PathBuf>,
    /// The control socket [default: [`control::default_control_socket_path`]].
    pub control_socket: Option<PathBuf>,
    /// The name to register the clock port under [default: `clock`].
    pub name: Option<String>,
    /// Serve at this `SCHED_FIFO` priority (the paper's alarm thread ran "at high
    /// priority"); if refused, serve anyway and say so once.
    pub fifo: Option<u8>,
    /// Wake this long before each deadline and wait for it awake
    /// ([`Server::set_lead`]; default [`crate::server::DEFAULT_LEAD`], at most
    /// [`crate::server::MAX_LEAD`]; zero: wake at the deadline, no CPU spent waiting).
    pub lead: Option<std::time::Duration>,
}

/// `ictus clock-server`: register the clock port with the name server (again whenever
/// the name server restarts), hand the control port out on the control socket, serve
/// until `SIGINT` or `SIGTERM`.
pub fn serve(opts: ServeOptions) -> Result<(), CliError> {
    serve_until_signalled(|stop| {
        let path = match opts.control_socket {
            Some(p) => p,
            None => control::prepare_default_control_socket_path()?,
        };
        let listener = Listener::activated_or_bind(&path, "clock server")?;
        if let Some(priority) = opts.fifo {
            use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
            let req = ThreadRequest { policy: Some(Policy::Fifo { priority }), ..ThreadRequest::default() };
            // A refusal is reported once by `configure_current_thread`; serve anyway.
            let granted = configure_current_thread(&req);
            tracing::info!(server = "clock-server", priority, "serving as {}", granted.describe());
        }
        let space = Space::task();
        let mut server = Server::new(space.clone())?;
        if let Some(lead) = opts.lead {
            server.set_lead(lead);
        }
        let name = opts.name.unwrap_or_else(|| SERVICE_NAME.to_owned());
        let names =
            Registrar::start("clock-server", opts.name_server.as_deref(), &space, &[(&name, server.clock_port())])?;
        tracing::info!(
            server = "clock-server",
            name = %name,
            port = server.clock_port().0,
            control_socket = %path.display(),
            pid = std::process::id(),
            "clock port registered as {name:?}; control port on {} (pid {})",
            path.display(),
            std::process::id()
        );
        ictus_server::notify::ready(
            "clock-server",
            &format!("clock port registered as {name:?}; control port on {}", path.display()),
        );
        let result = server.run(Some(&listener), stop);
        ictus_server::notify::stopping("clock-server");
        // The registration would vanish with the port anyway; say goodbye first.
        names.stop();
        let removed = if listener.activated() { "left" } else { "removed" };
        drop(server);
        drop(listener);
        match &result {
            Ok(()) => {
                tracing::info!(server = "clock-server", path = %path.display(), "stopped; {removed} {}", path.display())
            }
            Err(e) => tracing::error!(server = "clock-server", "stopping: {e}"),
        }
        result
    })
}

/// What `ictus clock` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// The time since boot and the wall time, from the clock port.
    Now,
    /// The server's counters, from the control port.
    Stats,
    /// Set the resolution (µs; 0 = exact) through the control port.
    SetResolution(u64),
}

/// Why `ictus clock` failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The clock or its control port could not be reached.
    #[error(transparent)]
    Connect(#[from] crate::client::ConnectError),
    /// The request failed.
    #[error(transparent)]
    Request(#[from] crate::client::ClientError),
}

/// `ictus clock now|stats|set-resolution US`: one request, its answer on standard
/// output.
pub fn query(q: Query, name_server: Option<PathBuf>, control_socket: Option<PathBuf>) -> Result<(), QueryError> {
    use crate::client::{Client, Control};
    let space = Space::task();
    let control = || match &control_socket {
        Some(p) => Control::connect_socket(&space, p),
        None => Control::connect(&space),
    };
    match q {
        Query::Now => {
            let clock = match &name_server {
                Some(p) => Client::connect_socket(&space, p)?,
                None => Client::connect(&space)?,
            };
            let (boot, wall) = clock.read()?;
            println!("since boot {boot}\nwall       {wall}\nresolution {:?}", clock.resolution()?);
        }
        Query::Stats => {
            let s = control()?.stats()?;
            println!(
                "pending alarms {}\npending sleeps {}\nalarms sent {}\nalarms dropped {}\nsleeps answered {}\nclients {}\nclient quota {}\nresolution {}",
                s.pending_alarms,
                s.pending_sleeps,
                s.alarms_sent,
                s.alarms_dropped,
                s.sleeps_answered,
                s.clients,
                s.client_quota,
                s.resolution
            );
        }
        Query::SetResolution(us) => {
            let previous = control()?.set_resolution(std::time::Duration::from_micros(us))?;
            println!("resolution {:?} (was {previous:?})", std::time::Duration::from_micros(us));
        }
    }
    Ok(())
}
