//! What `ictus clock-server` does.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use ictus_ipc::Space;
use ictus_name_server::socket::Listener;

use crate::control;
use crate::protocol::SERVICE_NAME;
use crate::server::{ServeError, Server};

/// Why `ictus clock-server` stopped.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Serving failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The control socket's directory is unsafe or could not be made.
    #[error(transparent)]
    Path(#[from] ictus_name_server::socket::PathError),
    /// The name server could not be reached.
    #[error("reaching the name server to register {SERVICE_NAME:?}: {0} (start `ictus name-server` first)")]
    NameServer(#[from] ictus_name_server::ConnectError),
    /// The name server refused the registration.
    #[error("registering {name:?} with the name server: {source}")]
    Register {
        /// The name.
        name: String,
        /// Why.
        source: ictus_name_server::ClientError,
    },
}

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
}

/// `ictus clock-server`: register the clock port with the name server, hand the
/// control port out on the control socket, serve until `SIGINT` or `SIGTERM`.
pub fn serve(opts: ServeOptions) -> Result<(), CliError> {
    let (stop_r, stop_w) = UnixStream::pair().map_err(ServeError::Signals)?;
    let mut ids = Vec::new();
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let w = stop_w.try_clone().map_err(ServeError::Signals)?;
        ids.push(signal_hook::low_level::pipe::register(sig, w).map_err(ServeError::Signals)?);
    }
    let result = serve_until(opts, &stop_r);
    for id in ids {
        signal_hook::low_level::unregister(id);
    }
    result
}

fn serve_until(opts: ServeOptions, stop: &UnixStream) -> Result<(), CliError> {
    let path = match opts.control_socket {
        Some(p) => p,
        None => control::prepare_default_control_socket_path()?,
    };
    let listener = Listener::bind(&path).map_err(ServeError::from)?;
    if let Some(priority) = opts.fifo {
        use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
        let req = ThreadRequest { policy: Some(Policy::Fifo { priority }), ..ThreadRequest::default() };
        // A refusal is reported once by `configure_current_thread`; serve anyway.
        let granted = configure_current_thread(&req);
        eprintln!("ictus clock-server: serving as {}", granted.describe());
    }
    let space = Space::task();
    let mut server = Server::new(space.clone())?;
    let ns = match &opts.name_server {
        Some(p) => ictus_name_server::Client::connect_socket(&space, p)?,
        None => ictus_name_server::Client::connect(&space)?,
    };
    let name = opts.name.unwrap_or_else(|| SERVICE_NAME.to_owned());
    ns.register(&name, server.clock_port()).map_err(|source| CliError::Register { name: name.clone(), source })?;
    eprintln!(
        "ictus clock-server: clock port registered as {name:?}; control port on {} (pid {})",
        path.display(),
        std::process::id()
    );
    let result = server.run(Some(&listener), stop.as_fd());
    // The registration would vanish with the port anyway; say goodbye first.
    let _ = ns.unregister(&name);
    drop(server);
    drop(listener);
    match &result {
        Ok(()) => eprintln!("ictus clock-server: stopped; removed {}", path.display()),
        Err(e) => eprintln!("ictus clock-server: stopping: {e}"),
    }
    Ok(result?)
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
