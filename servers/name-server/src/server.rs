//! The server: a table from names to send rights, kept honest by dead-name
//! notifications.
//!
//! It receives on a port set holding two receive rights: the **service port**, to which
//! clients hold send rights (from the bootstrap port or the well-known socket), and the
//! **notify port**, whose only send rights are the ones the server itself gave its
//! dead-name requests. Every message on the service port is an untrusted request; a
//! message on the notify port is believed only if it is a dead-name notification whose
//! kernel-verified sender is this very process.
//!
//! Requests are the [`Names`] interface (see [`crate::protocol`]): the server's own
//! loop receives on the port set, hands each request to the generated
//! [`NamesServer`] through [`ictus_idl::Server::handle`] — which decodes it, calls the
//! method, and sends the reply, or refuses it with `MIG_BAD_ID` / `MIG_BAD_ARGUMENTS` —
//! and handles the notifications itself. It needs a loop of its own (not
//! [`ictus_idl::Server::run`]) for the notify port, the well-known socket and the stop
//! channel.
//!
//! # Rights and references
//!
//! Each registration holds one user reference of the registered send right in the
//! server's space. Rights to the same port coalesce to one name, so a port registered
//! under several names has one name here with several references; the server arms one
//! dead-name request per such name (when its first registration arrives) and cancels it
//! when its last registration goes. When the port dies the notification names it: every
//! registration of it is dropped and the dead name destroyed. A lookup or list that
//! finds a right already dead (its notification still on the way) does the same at
//! once, so a client never gets a dead right back.
//!
//! A right a request brings as a method's argument belongs to the method: `register`
//! keeps it (or releases it when it refuses), `unregister_with_right` releases its proof
//! once it has compared it. Everything a refused request carries is released by the
//! runtime, one reference per right as it arrived (so a right that coalesced with one
//! the server holds leaves the server's own alone): send and send-once rights are
//! deallocated, a receive right is destroyed (its port dies, which is what sending it to
//! a name server deserves), out-of-line memory is unmapped. A reply right that is a send
//! right rather than a send-once right is released after the reply. Replies are sent by
//! the runtime, which waits at most a few seconds for room in the client's queue before
//! dropping the reply.
//!
//! # Who may unregister
//!
//! The task that registered the name (the same kernel-verified pid and uid as the
//! register request), or any task that presents the registered send right itself with
//! the request: its right coalesces to the registered right's name in the server's
//! space, which the kernel's socket identity guarantees and nobody can forge. Others get
//! `NoAccess` (`netname`'s `NETNAME_NOT_YOUR_ENTRY`).

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use ictus_abi::{Name, NotifyId};
use ictus_idl::{Context, Dispatched, SendRight, ServerStats, ServicePorts};
use ictus_ipc::{Credentials, Disposition, NotifyKind, PortArg, ReceiveError, Received, RightKind, RightsError, Space};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

use crate::protocol::{validate_name, Names, NamesError, NamesServer, MAX_REGISTRATIONS};
use crate::socket::{ListenError, Listener, PathError};

/// Why the server could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Allocating or arranging the server's ports failed.
    #[error("setting up the server's ports: {0}")]
    Rights(#[from] RightsError),
    /// The well-known socket could not be set up.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The default socket directory is unsafe or could not be made.
    #[error(transparent)]
    Path(#[from] PathError),
    /// Receiving failed persistently.
    #[error("receiving requests: {0}")]
    Receive(ReceiveError),
    /// Waiting for work failed.
    #[error("waiting for requests: {0}")]
    Poll(Errno),
    /// Setting up the stop channel or the signal handlers failed.
    #[error("setting up signal handling: {0}")]
    Signals(std::io::Error),
    /// The server thread could not be started.
    #[error("starting the server thread: {0}")]
    Thread(std::io::Error),
    /// The server thread panicked.
    #[error("the server thread panicked")]
    Panicked,
}

#[derive(Clone, Copy, Debug)]
struct Registration {
    /// The send right, in the server's space.
    right: Name,
    /// Who registered it.
    owner: Credentials,
}

/// Messages handled per wake-up before looking at the socket and the stop channel.
const BATCH: usize = 64;

/// The table: names to registrations, and how many registrations hold each right.
#[derive(Debug, Default)]
struct Table {
    regs: BTreeMap<String, Registration>,
    /// Registrations per right name.
    by_right: HashMap<Name, usize>,
}

/// The registrations, shared by the interface's methods ([`Names`], run through the
/// `ictus_idl` server) and the server's own loop, which takes dead-name notifications
/// and, when it stops, lets go of every right. Only the server's thread touches it; the
/// lock is what lets both hold it.
#[derive(Debug)]
struct Registry {
    space: Space,
    notify: Name,
    table: Mutex<Table>,
}

impl Registry {
    fn table(&self) -> MutexGuard<'_, Table> {
        // A method that panicked left the table as consistent as any step of it; keep
        // serving.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_dead(&self, right: Name) -> bool {
        match self.space.right_kinds(right) {
            Ok(k) => k.contains(&RightKind::DeadName),
            Err(_) => true,
        }
    }

    /// The port behind `right` died: drop every registration of it and the dead name.
    fn purge(&self, t: &mut Table, right: Name) {
        t.regs.retain(|_, r| r.right != right);
        t.by_right.remove(&right);
        if self.space.right_kinds(right).is_ok_and(|k| k == [RightKind::DeadName]) {
            let _ = self.space.destroy(right);
        }
    }

    /// A dead-name notification named `name`.
    fn dead_name(&self, name: Name) {
        if self.space.right_kinds(name).is_ok_and(|k| k == [RightKind::DeadName]) {
            self.purge(&mut self.table(), name);
        }
    }

    /// Drop one registration's reference of `right`.
    fn drop_reference(&self, t: &mut Table, right: Name) {
        if self.is_dead(right) {
            self.purge(t, right);
            return;
        }
        let count = t.by_right.get(&right).copied().unwrap_or(0);
        if count <= 1 {
            t.by_right.remove(&right);
            // Cancel the dead-name request before letting go of the right: the nucleus
            // would otherwise keep watching (and holding) the connection.
            let _ = self.space.request_notification(right, NotifyKind::DeadName, None);
        } else {
            t.by_right.insert(right, count - 1);
        }
        let _ = self.space.deallocate(right);
    }

    fn add(&self, name: &str, right: Name, owner: Credentials) -> Result<(), NamesError> {
        validate_name(name.as_bytes()).map_err(|_| NamesError::BadName)?;
        let mut t = self.table();
        if t.regs.contains_key(name) {
            return Err(NamesError::NameExists);
        }
        if t.regs.len() >= MAX_REGISTRATIONS {
            return Err(NamesError::Full);
        }
        if self.is_dead(right) {
            return Err(NamesError::BadRight);
        }
        let count = t.by_right.get(&right).copied().unwrap_or(0);
        if count == 0 {
            let notify = PortArg::new(self.notify, Disposition::MakeSend);
            if self.space.request_notification(right, NotifyKind::DeadName, Some(notify)).is_err() {
                return Err(NamesError::ResourceShortage);
            }
        }
        t.by_right.insert(right, count + 1);
        t.regs.insert(name.to_owned(), Registration { right, owner });
        Ok(())
    }

    fn remove(&self, name: &str, presented: Option<Name>, sender: Credentials) -> Result<(), NamesError> {
        validate_name(name.as_bytes()).map_err(|_| NamesError::BadName)?;
        let mut t = self.table();
        let reg = t.regs.get(name).copied().ok_or(NamesError::NotFound)?;
        let by_owner = sender.pid == reg.owner.pid && sender.uid == reg.owner.uid;
        if !by_owner && presented != Some(reg.right) {
            return Err(NamesError::NotOwner);
        }
        t.regs.remove(name);
        self.drop_reference(&mut t, reg.right);
        Ok(())
    }

    /// Let go of every registered right (the server is stopping).
    fn release_all(&self) {
        let mut t = self.table();
        t.regs.clear();
        for (right, count) in t.by_right.drain() {
            let _ = self.space.request_notification(right, NotifyKind::DeadName, None);
            if self.space.right_kinds(right).is_ok_and(|k| k == [RightKind::DeadName]) {
                let _ = self.space.destroy(right);
            } else {
                let _ = self.space.mod_refs(right, RightKind::Send, -(count.min(i32::MAX as usize) as i32));
            }
        }
    }
}

/// The interface's methods. Each `SendRight` argument is a reference the request
/// brought into the server's space: kept by a registration, else released here.
impl Names for Arc<Registry> {
    fn register(&self, cx: &Context, name: String, port: SendRight) -> Result<(), NamesError> {
        let result = self.add(&name, port.name, cx.sender);
        if result.is_err() {
            let _ = self.space.deallocate(port.name);
        }
        result
    }

    fn lookup(&self, name: String) -> Result<SendRight, NamesError> {
        validate_name(name.as_bytes()).map_err(|_| NamesError::BadName)?;
        let mut t = self.table();
        let right = t.regs.get(&name).ok_or(NamesError::NotFound)?.right;
        if self.is_dead(right) {
            // Its notification is still on the way: never hand out a dead right.
            self.purge(&mut t, right);
            return Err(NamesError::NotFound);
        }
        Ok(SendRight::copy(right))
    }

    fn unregister(&self, cx: &Context, name: String) -> Result<(), NamesError> {
        self.remove(&name, None, cx.sender)
    }

    fn list(&self) -> Result<Vec<String>, NamesError> {
        let mut t = self.table();
        let dead: Vec<Name> = t.by_right.keys().copied().filter(|&r| self.is_dead(r)).collect();
        for r in dead {
            self.purge(&mut t, r);
        }
        Ok(t.regs.keys().cloned().collect())
    }

    fn unregister_with_right(&self, cx: &Context, name: String, proof: SendRight) -> Result<(), NamesError> {
        let result = self.remove(&name, Some(proof.name), cx.sender);
        let _ = self.space.deallocate(proof.name);
        result
    }
}

/// The name server: its ports and its table. See the module documentation.
#[derive(Debug)]
pub struct Server {
    space: Space,
    pid: u32,
    registry: Arc<Registry>,
    /// The generated demultiplexer, [`NamesServer`], for requests on the service port.
    requests: ictus_idl::Server,
    counts: ictus_idl::ReceiveCounts,
    // Last: dropped after `Drop for Server` has released the registered rights.
    ports: ServicePorts<1>,
}

impl Server {
    /// A server with its ports allocated in `space` (the process's own,
    /// [`Space::task`], for a real server).
    pub fn new(space: Space) -> Result<Server, ServeError> {
        let ports = ServicePorts::allocate(&space)?;
        let registry = Arc::new(Registry { space: space.clone(), notify: ports.notify(), table: Mutex::default() });
        // Replies never wait: a client that stops reading must not stall the only thread.
        let requests = ictus_idl::Server::new(&space, ports.set())
            .with(NamesServer(Arc::clone(&registry)))
            .with_reply_timeout(std::time::Duration::ZERO);
        Ok(Server {
            space,
            pid: std::process::id(),
            registry,
            requests,
            counts: ictus_idl::ReceiveCounts::default(),
            ports,
        })
    }

    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The service port's receive right, in [`Server::space`]. Make send rights from it
    /// to hand out (for example with [`Space::give_bootstrap`]).
    pub fn service_port(&self) -> Name {
        self.ports.service(0)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.registry.table().regs.keys().cloned().collect()
    }

    /// Malformed messages received (and destroyed by the nucleus) so far.
    pub fn malformed(&self) -> u64 {
        self.counts.malformed
    }

    /// The request counters: handled, refused (`MIG_BAD_ID`, `MIG_BAD_ARGUMENTS`),
    /// replies that could not be delivered.
    pub fn stats(&self) -> &ServerStats {
        self.requests.stats()
    }

    /// Serve until `stop` becomes readable (a byte written, or its peer closed): ports,
    /// and the well-known socket if there is one.
    pub fn run(&mut self, listener: Option<&Listener>, stop: BorrowedFd<'_>) -> Result<(), ServeError> {
        let ports = self.space.pollable_fd(self.ports.set())?;
        let mut rcv = Received::new();
        loop {
            let (stop_ready, ports_ready, listen_ready) = {
                let mut fds = vec![PollFd::from_borrowed_fd(stop, PollFlags::IN), PollFd::new(&ports, PollFlags::IN)];
                if let Some(l) = listener {
                    fds.push(PollFd::from_borrowed_fd(l.as_fd(), PollFlags::IN));
                }
                match poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(ServeError::Poll(e)),
                }
                let ready = |i: usize| fds.get(i).is_some_and(|f| !f.revents().is_empty());
                (ready(0), ready(1), ready(2))
            };
            if stop_ready {
                return Ok(());
            }
            if ports_ready {
                self.handle_pending(&mut rcv, BATCH)?;
            }
            if let (true, Some(l)) = (listen_ready, listener) {
                let (_, refused) = l.serve_pending(|| self.space.send_right_fd(self.ports.service(0)).ok());
                if refused > 0 {
                    eprintln!("ictus name-server: refused {refused} connection(s) from another user");
                }
            }
        }
    }

    /// Receive and handle up to `max` messages that are already waiting; returns how
    /// many were handled.
    pub fn handle_pending(&mut self, rcv: &mut Received, max: usize) -> Result<usize, ServeError> {
        let mut counts = self.counts;
        let result = self.ports.handle_pending(
            rcv,
            max,
            &mut counts,
            |m| {
                self.handle(m);
            },
            |n, e| {
                // Say so, but do not let a hostile sender flood the log.
                if n.is_power_of_two() {
                    eprintln!("ictus name-server: dropped a malformed message ({n} so far): {e}");
                }
            },
        );
        self.counts = counts;
        result.map_err(ServeError::Receive)
    }

    /// Handle one received message: a notification on the notify port, or a request on
    /// the service port, which the generated [`NamesServer`] decodes, carries out and
    /// answers (or refuses). Whatever the message carried and nobody keeps is released.
    pub fn handle(&self, msg: &mut Received) -> Dispatched {
        if msg.port == self.ports.notify() {
            self.handle_notification(msg);
            ictus_idl::release_rights(&self.space, msg);
            return Dispatched::OneWay;
        }
        self.requests.handle(msg)
    }

    fn handle_notification(&self, msg: &Received) {
        // Only the notifier of this very process sends here; the kernel stamps the pid.
        if msg.sender.pid != self.pid || msg.id != NotifyId::DeadName.id() {
            return;
        }
        if let Some((name, _)) = NotifyId::parse_body(msg.data()) {
            self.registry.dead_name(name);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The registered rights first; the ports go with `self.ports` afterwards.
        self.registry.release_all();
    }
}

/// A server running on a thread of this process (for tests, and for programs that
/// embed one). Dropping it stops the server.
#[derive(Debug)]
#[must_use = "dropping a Running stops the server"]
pub struct Running {
    thread: Option<JoinHandle<Result<(), ServeError>>>,
    stop: Option<UnixStream>,
    space: Space,
    service: Name,
    path: Option<PathBuf>,
}

/// Start a server on a new thread, its ports in `space`, listening on the well-known
/// socket `socket` if given (see [`crate::socket`]). When this returns the socket is
/// bound and listening, so clients can connect at once.
pub fn spawn(space: Space, socket: Option<&Path>) -> Result<Running, ServeError> {
    let listener = socket.map(Listener::bind).transpose()?;
    let mut server = Server::new(space.clone())?;
    let service = server.service_port();
    let (stop_r, stop_w) = UnixStream::pair().map_err(ServeError::Signals)?;
    let thread = std::thread::Builder::new()
        .name("ictus-name-server".into())
        .spawn(move || {
            let r = server.run(listener.as_ref(), stop_r.as_fd());
            // Release the ports first, then the socket path.
            drop(server);
            drop(listener);
            r
        })
        .map_err(ServeError::Thread)?;
    Ok(Running { thread: Some(thread), stop: Some(stop_w), space, service, path: socket.map(Path::to_owned) })
}

impl Running {
    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The service port's receive right in [`Running::space`].
    pub fn service_port(&self) -> Name {
        self.service
    }

    /// The well-known socket, if the server listens on one.
    pub fn socket_path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// A new send right to the service port, as a descriptor (for
    /// [`Space::insert_send_fd`]).
    pub fn service_fd(&self) -> Result<OwnedFd, RightsError> {
        self.space.send_right_fd(self.service)
    }

    /// Stop the server, wait for its thread, and report how it ended. Its ports die
    /// (clients' calls fail with `ServerDied`) and its socket path is removed.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), ServeError> {
        // Closing our end makes the server's end readable (end of file).
        drop(self.stop.take());
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| ServeError::Panicked)?,
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
