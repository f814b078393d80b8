//! A server's names with the name server, kept there across the name server's restarts.
//!
//! A name server that dies (`kill -9`, a crash) takes every registration with it, and
//! the one that replaces it starts empty. A server that registered its ports keeps
//! running, so it must notice and register again; its clients look the names up in the
//! new name server (see `ictus_name_api::Client`, which follows a restarted server).
//!
//! The [`Registrar`] does that on a thread of its own, in a space of its own:
//!
//! - at start it registers every name, on the caller's thread, so that a server without
//!   a name server fails to start with a clear error as before;
//! - it holds a dead-name request on its send right to the name server, and waits for
//!   the notification (or the stop message) on a port of its own space;
//! - when the name server dies it says so (one line), then looks for a new one at the
//!   same socket path, backing off from 10 ms to [`MAX_BACKOFF`] (250 ms: a new name
//!   server has every name back well within a second of starting), and registers every
//!   name again (one line when done; one line for a name some other task took first,
//!   which it leaves);
//! - [`Registrar::stop`] unregisters the names (they would vanish with the ports anyway)
//!   and ends the thread.
//!
//! Why a thread and a space of its own: the server's loop never waits on a name server
//! that is slow to start or wedged, and no right a client hands the server can coalesce
//! with the registrar's right to the name server (a client that sent the server a copy
//! of the name server's port, as an alarm port say, must not be able to cancel or
//! consume the registrar's dead-name request). The cost is two threads that sleep: the
//! registrar's and its space's notifier.
//!
//! Why not inotify on the socket's directory to see the new server appear: the
//! directory may itself be removed and made again, and a connect every 250 ms while
//! there is no name server costs nothing measurable.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_abi::{Name, NotifyId};
use ictus_ipc::{
    Disposition, Message, NotifyKind, PortArg, ReceiveError, ReceiveOptions, Received, RightKind, RightsError,
    SendOptions, Space,
};
use ictus_name_api::socket::{self, default_socket_path};
use ictus_name_api::{Client, ClientError, ConnectError};

/// The first wait between two looks for a restarted name server.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest wait between two looks for a restarted name server.
pub const MAX_BACKOFF: Duration = Duration::from_millis(250);
/// How long a call to the name server may take before the registrar gives up on it (and
/// tries again later).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The message id that tells the registrar's thread to unregister and end.
const STOP: i32 = 0x1c7_5700;

/// Why a server's names could not be registered at start-up.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The name server could not be reached (its message says where and what to do).
    #[error("cannot register {names} with the name server: {source}")]
    Connect {
        /// The names, quoted.
        names: String,
        /// Why.
        source: ConnectError,
    },
    /// The name server refused a name.
    #[error("cannot register {name:?} with the name server: {source}")]
    Refused {
        /// The name.
        name: String,
        /// Why.
        source: ClientError,
    },
    /// A right could not be made in the registrar's space.
    #[error("cannot prepare the registration of the server's ports: {0}")]
    Rights(#[from] RightsError),
    /// The registrar's thread could not be started.
    #[error("cannot start the name registration thread: {0}")]
    Thread(std::io::Error),
}

/// A server's names, registered with the name server and registered again whenever the
/// name server restarts (see the module documentation). Dropping it unregisters them.
#[derive(Debug)]
pub struct Registrar {
    space: Space,
    inbox: Name,
    thread: Option<JoinHandle<()>>,
}

/// What the registrar's thread keeps.
struct Keeper {
    who: &'static str,
    space: Space,
    inbox: Name,
    path: PathBuf,
    names: Vec<(String, Name)>,
    ns: Option<Client>,
}

impl Registrar {
    /// Register each `(name, port)` — `port` a receive right (or a send right) in
    /// `space` — with the name server at the socket `name_server` (or found as
    /// `ictus_name_api::Client::connect` finds it), now, and again after each restart
    /// of the name server, until the registrar is stopped. `who` names the server in
    /// log lines (`"clock-server"`).
    pub fn start(
        who: &'static str,
        name_server: Option<&Path>,
        space: &Space,
        names: &[(&str, Name)],
    ) -> Result<Registrar, RegisterError> {
        let own = Space::new();
        let inbox = own.allocate_port()?;
        // Dropping `registrar` on an error below destroys `inbox` (and, through the
        // space, everything else made in it).
        let mut registrar = Registrar { space: own.clone(), inbox, thread: None };
        let mut rights = Vec::with_capacity(names.len());
        for &(name, port) in names {
            let right = own.insert_send_fd(space.send_right_fd(port)?)?;
            rights.push((name.to_owned(), right));
        }
        let quoted = || names.iter().map(|(n, _)| format!("{n:?}")).collect::<Vec<_>>().join(", ");
        let ns = match name_server {
            Some(p) => Client::connect_socket(&own, p),
            None => Client::connect(&own),
        }
        .map_err(|source| RegisterError::Connect { names: quoted(), source })?
        .with_timeout(CALL_TIMEOUT);
        for (name, right) in &rights {
            ns.register(name, *right).map_err(|source| RegisterError::Refused { name: name.clone(), source })?;
        }
        let mut keeper = Keeper {
            who,
            space: own,
            inbox,
            path: name_server.map_or_else(default_socket_path, Path::to_owned),
            names: rights,
            ns: Some(ns),
        };
        keeper.watch();
        let thread = std::thread::Builder::new()
            .name("ictus-registrar".into())
            .spawn(move || keeper.run())
            .map_err(RegisterError::Thread)?;
        registrar.thread = Some(thread);
        Ok(registrar)
    }

    /// Unregister the names and end the registrar's thread.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(t) = self.thread.take() {
            // A receive right sends to its own port; the thread believes only our pid.
            let sent = self.space.send(self.inbox, &mut Message::new(STOP, Vec::new()), SendOptions::default());
            if sent.is_ok() || t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        self.stop_inner();
        let _ = self.space.mod_refs(self.inbox, RightKind::Receive, -1);
    }
}

impl Keeper {
    fn quoted(&self) -> String {
        self.names.iter().map(|(n, _)| format!("{n:?}")).collect::<Vec<_>>().join(", ")
    }

    /// Arm the dead-name request on the right to the name server.
    fn watch(&mut self) {
        if let Some(ns) = &self.ns {
            let notify = PortArg::new(self.inbox, Disposition::MakeSendOnce);
            // A right already dead is notified at once; one that cannot be watched
            // (which the nucleus does not refuse for a live send right) is taken as dead.
            if self.space.request_notification(ns.server_port(), NotifyKind::DeadName, Some(notify)).is_err() {
                self.ns = None;
            }
        }
    }

    fn run(mut self) {
        let me = std::process::id();
        let mut rcv = Received::new();
        let mut backoff = FIRST_BACKOFF;
        loop {
            let timeout = if self.ns.is_some() { None } else { Some(backoff) };
            match self.space.receive(self.inbox, &mut rcv, ReceiveOptions { timeout, ..ReceiveOptions::default() }) {
                Ok(()) => {
                    let ours = rcv.sender.pid == me;
                    let id = rcv.id;
                    let dead = (ours && id == NotifyId::DeadName.id())
                        .then(|| NotifyId::parse_body(rcv.data()).map(|(n, _)| n))
                        .flatten();
                    ictus_idl::release_rights(&self.space, &mut rcv);
                    if ours && id == STOP {
                        self.unregister();
                        return;
                    }
                    if let (Some(name), Some(ns)) = (dead, &self.ns) {
                        if name == ns.server_port() {
                            tracing::warn!(
                                server = self.who,
                                names = %self.quoted(),
                                path = %self.path.display(),
                                "the name server died; registering {} again as soon as a new one answers at {}",
                                self.quoted(),
                                self.path.display()
                            );
                            // Dropping the client releases the dead name (the request
                            // went with the notification).
                            self.ns = None;
                            backoff = FIRST_BACKOFF;
                        }
                    }
                }
                Err(ReceiveError::TimedOut) => {
                    if self.register_again() {
                        backoff = FIRST_BACKOFF;
                    } else {
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
                // Our inbox is gone: the registrar is being dropped.
                Err(ReceiveError::PortDied | ReceiveError::InvalidName(_)) => return,
                Err(_) => std::thread::sleep(backoff),
            }
        }
    }

    /// Look for a name server at the path; if one answers, register every name with it.
    fn register_again(&mut self) -> bool {
        let Ok(fd) = socket::fetch_service_fd(&self.path, MAX_BACKOFF) else { return false };
        let Ok(right) = self.space.insert_send_fd(fd) else { return false };
        let ns = Client::from_right(&self.space, right).with_timeout(CALL_TIMEOUT);
        let (mut done, mut taken) = (Vec::new(), Vec::new());
        for (name, port) in &self.names {
            match ns.register(name, *port) {
                Ok(()) => done.push(format!("{name:?}")),
                Err(ClientError::NameExists(_)) => taken.push(format!("{name:?}")),
                // It died again, or is wedged: start over with the next look.
                Err(_) => return false,
            }
        }
        if !done.is_empty() {
            let names = done.join(", ");
            tracing::info!(server = self.who, names = %names, "registered {names} again with the new name server");
        }
        if !taken.is_empty() {
            let names = taken.join(", ");
            tracing::warn!(
                server = self.who,
                names = %names,
                "{names} taken on the new name server by another task; leaving it to that task"
            );
        }
        self.ns = Some(ns);
        self.watch();
        true
    }

    /// Unregister every name (the server is stopping).
    fn unregister(&mut self) {
        if let Some(ns) = &self.ns {
            for (name, _) in &self.names {
                // A name server that died meanwhile took the names with it.
                if let Err(ClientError::ServerDied | ClientError::TimedOut) = ns.unregister(name) {
                    break;
                }
            }
        }
    }
}
