//! What `ictus tactus serve` and `ictus tactus status` do.

use std::path::PathBuf;
use std::time::Duration;

use ictus_ipc::Space;
use ictus_server::{serve_until_signalled, Registrar, ServeError};
use ictus_tactus::{TactusServiceClient, SERVICE_NAME};

use crate::{Options, Server};

/// Options of `ictus tactus serve`.
#[derive(Debug, Default)]
pub struct ServeOptions {
    /// The name server's socket [default: its default path].
    pub name_server: Option<PathBuf>,
    /// The name to register under [default: `tactus`].
    pub name: Option<String>,
    /// Also serve the socket transport here.
    pub socket: Option<PathBuf>,
    /// Ask for no real-time priority.
    pub timesharing: bool,
}

/// `ictus tactus serve`: register with the name server (again whenever it restarts)
/// and serve until `SIGINT` or `SIGTERM`.
pub fn serve(o: ServeOptions) -> Result<(), ServeError> {
    serve_until_signalled(|stop| {
        let space = Space::task();
        let mut opts = if o.timesharing { Options::timesharing() } else { Options::default() };
        opts.devices.name_server = o.name_server.clone();
        opts.socket = o.socket.clone();
        let mut server = Server::new(&space, opts)?;
        let name = o.name.clone().unwrap_or_else(|| SERVICE_NAME.to_owned());
        let names = Registrar::start("tactus", o.name_server.as_deref(), &space, &[(&name, server.service_port())])?;
        eprintln!("ictus tactus: registered as {name:?} (pid {})", std::process::id());
        let r = server.run(stop);
        names.stop();
        drop(server);
        r
    })
}

/// Why `ictus tactus status` failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The name server.
    #[error("reaching the name server: {0}")]
    NameServer(#[from] ictus_name_api::ConnectError),
    /// The lookup.
    #[error("looking up the Tactus server: {0} (is `ictus tactus serve` running?)")]
    Lookup(#[from] ictus_name_api::ClientError),
    /// The call.
    #[error("asking the Tactus server: {0}")]
    Call(String),
}

/// `ictus tactus status`: the server's counters as JSON on standard output.
pub fn status(name_server: Option<PathBuf>, name: Option<String>) -> Result<(), StatusError> {
    let space = Space::new();
    let ns = match &name_server {
        Some(p) => ictus_name_api::Client::connect_socket(&space, p)?,
        None => ictus_name_api::Client::connect(&space)?,
    };
    let port = ns.lookup(name.as_deref().unwrap_or(SERVICE_NAME))?;
    let c = TactusServiceClient::new(&space, port).with_timeout(Duration::from_secs(10));
    println!("{}", c.stats().map_err(|e| StatusError::Call(e.to_string()))?);
    Ok(())
}
