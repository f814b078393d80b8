//! What `ictus name-server` and `ictus names` do.

use std::io::Write;
use std::path::PathBuf;

use ictus_ipc::Space;
use ictus_server::{serve_until_signalled, Listener};

use crate::client::{Client, ClientError, ConnectError};
use crate::server::{ServeError, Server};
use crate::socket;

/// `ictus name-server [--socket PATH]`: serve in the foreground until `SIGINT` or
/// `SIGTERM`, then remove the socket and return. Started by systemd with the socket
/// (socket activation), serve that one and leave it to systemd; tell systemd when
/// serving and when stopping (`ictus_server::notify`).
///
/// Without `--socket`, the socket is the default one ([`socket`] says where), its
/// directory made private if missing.
pub fn serve(socket: Option<PathBuf>) -> Result<(), ServeError> {
    serve_until_signalled(|stop| {
        let path = match socket {
            Some(p) => p,
            None => socket::prepare_default_socket_path()?,
        };
        let listener = Listener::activated_or_bind(&path, "name server")?;
        let mut server = Server::new(Space::task())?;
        let restart = if listener.reclaimed() { "; replaces one that died, recovering its names" } else { "" };
        let activated = if listener.activated() { " (socket from the service manager)" } else { "" };
        tracing::info!(
            server = "name-server",
            path = %path.display(),
            pid = std::process::id(),
            restart = listener.reclaimed(),
            activated = listener.activated(),
            "serving on {}{activated} (pid {}){restart}",
            path.display(),
            std::process::id()
        );
        ictus_server::notify::ready("name-server", &format!("serving on {}", path.display()));
        let result = server.run(Some(&listener), stop);
        ictus_server::notify::stopping("name-server");
        let removed = if listener.activated() { "left" } else { "removed" };
        drop(server);
        drop(listener);
        match &result {
            Ok(()) => {
                tracing::info!(server = "name-server", path = %path.display(), "stopped; {removed} {}", path.display())
            }
            Err(e) => tracing::error!(server = "name-server", "stopping: {e}"),
        }
        result
    })
}

/// Why `ictus names` failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// No name server could be reached.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The request failed.
    #[error(transparent)]
    Request(#[from] ClientError),
    /// Writing the output failed.
    #[error("writing the list: {0}")]
    Output(std::io::Error),
}

/// `ictus names [--socket PATH] [--json]`: print the registered names, one a line, or
/// as a JSON array of strings.
pub fn list(socket: Option<PathBuf>, json: bool) -> Result<(), ListError> {
    let space = Space::task();
    let client = match socket {
        Some(path) => Client::connect_socket(&space, &path)?,
        None => Client::connect(&space)?,
    };
    let names = client.list()?;
    let mut out = String::new();
    if json {
        out.push_str(&serde_json::Value::from(names).to_string());
        out.push('\n');
    } else {
        for n in &names {
            out.push_str(n);
            out.push('\n');
        }
    }
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Ok(()) => Ok(()),
        // `ictus names | head -1`: the reader has what it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(ListError::Output(e)),
    }
}
