//! The server: a table from names to send rights, kept honest by dead-name
//! notifications.
//!
//! It is written on the server skeleton ([`ictus_server::Loop`]): one service port, to
//! which clients hold send rights (from the bootstrap port or the well-known socket),
//! and the notify port, whose only send rights are the ones the server itself gave its
//! dead-name requests. Every message on the service port is an untrusted request; a
//! message on the notify port is believed only if it is a dead-name notification whose
//! kernel-verified sender is this very process (the skeleton checks).
//!
//! Requests are the [`Names`] interface (see [`crate::protocol`]): the loop hands each
//! to the generated [`NamesServer`] through [`ictus_idl::Server::handle`] — which
//! decodes it, calls the method, and sends the reply, or refuses it with `MIG_BAD_ID` /
//! `MIG_BAD_ARGUMENTS` — except a look-up held while the server recovers (below).
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
//! right rather than a send-once right is released after the reply. Replies are never
//! waited for: a client whose queue is full loses its reply, not the server its time.
//!
//! # Who may unregister
//!
//! The task that registered the name (the same kernel-verified pid and uid as the
//! register request), or any task that presents the registered send right itself with
//! the request: its right coalesces to the registered right's name in the server's
//! space, which the kernel's socket identity guarantees and nobody can forge. Others get
//! `NoAccess` (`netname`'s `NETNAME_NOT_YOUR_ENTRY`).
//!
//! # Quotas
//!
//! One task (one kernel-verified pid) holds at most [`MAX_NAMES_PER_CLIENT`]
//! registrations, and all tasks together [`MAX_REGISTRATIONS`]; over either a register
//! is refused with `QuotaExceeded` or `NoSpace`, whose messages say which.
//!
//! # After a crash: recovering
//!
//! A name server that dies takes every registration with it. When a new one starts on a
//! socket path where its predecessor left a socket behind (`kill -9`, a crash:
//! [`ictus_server::Listener::reclaimed`]), the servers that had registered are about to
//! register again (`ictus_server::Registrar`, within about 250 ms), and clients are
//! about to look their names up again. For [`RECOVERY`] after it starts, the server
//! *holds* a look-up of a name that is not registered instead of answering `NotFound`:
//! it keeps the reply right and answers when the name is registered, or `NotFound` when
//! the window closes. So a client never sees a name missing merely because the new
//! server was quicker than the server that registers it. At most [`MAX_HELD`] look-ups
//! are held at once (the rest are answered at once); a client that dies meanwhile only
//! loses its reply.

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ictus_abi::Name;
use ictus_idl::{Context, Decode, Dispatched, Outcome, SendRight, ServerStats, Service};
use ictus_ipc::{
    Credentials, Disposition, NotifyKind, PortArg, Received, ReceivedRight, RightKind, RightsError, Space,
};
use ictus_server::{Door, Listener, Loop, Serve, ServicePorts, Wait, SMALL_REQUESTS};

use crate::protocol::{validate_name, Names, NamesError, NamesServer, LOOKUP, MAX_NAMES_PER_CLIENT, MAX_REGISTRATIONS};

pub use ictus_server::ServeError;

/// How long a name server that replaced a crashed one holds look-ups of names not yet
/// registered again (see the module documentation).
pub const RECOVERY: Duration = Duration::from_secs(2);
/// The most look-ups held at once while recovering.
pub const MAX_HELD: usize = 1024;

#[derive(Clone, Copy, Debug)]
struct Registration {
    /// The send right, in the server's space.
    right: Name,
    /// Who registered it.
    owner: Credentials,
}

/// A look-up held while the server recovers.
#[derive(Debug)]
struct Held {
    name: String,
    reply: ReceivedRight,
}

/// The table: names to registrations, how many registrations hold each right, and how
/// many each task holds.
#[derive(Debug, Default)]
struct Table {
    regs: BTreeMap<String, Registration>,
    /// Registrations per right name.
    by_right: HashMap<Name, usize>,
    /// Registrations per registering pid.
    per_client: HashMap<u32, usize>,
    /// Until when look-ups of missing names are held, if the server is recovering.
    recovering_until: Option<Instant>,
    held: Vec<Held>,
}

impl Table {
    fn remove_reg(&mut self, name: &str) -> Option<Registration> {
        let reg = self.regs.remove(name)?;
        if let Some(n) = self.per_client.get_mut(&reg.owner.pid) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&reg.owner.pid);
            }
        }
        Some(reg)
    }
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
        let names: Vec<String> = t.regs.iter().filter(|(_, r)| r.right == right).map(|(n, _)| n.clone()).collect();
        for n in names {
            t.remove_reg(&n);
        }
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
        if t.per_client.get(&owner.pid).copied().unwrap_or(0) >= MAX_NAMES_PER_CLIENT {
            return Err(NamesError::QuotaExceeded);
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
        *t.per_client.entry(owner.pid).or_insert(0) += 1;
        t.regs.insert(name.to_owned(), Registration { right, owner });
        // Look-ups held for this name while recovering get their answer now.
        if t.held.iter().any(|h| h.name == name) {
            let (now, later): (Vec<Held>, Vec<Held>) =
                std::mem::take(&mut t.held).into_iter().partition(|h| h.name == name);
            t.held = later;
            for h in now {
                ictus_idl::reply_later::<SendRight, NamesError>(
                    &self.space,
                    h.reply,
                    LOOKUP,
                    Ok(SendRight::copy(right)),
                    Duration::ZERO,
                );
            }
        }
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
        t.remove_reg(name);
        self.drop_reference(&mut t, reg.right);
        Ok(())
    }

    /// Hold a look-up if the server is recovering and the name is not registered: keep
    /// its reply right, and say so. Anything else (a registered name, a request that
    /// does not decode, too many held) goes to the generated code as usual.
    fn hold(&self, req: &mut Received) -> bool {
        let mut t = self.table();
        let recovering = t.recovering_until.is_some_and(|until| Instant::now() < until);
        if !recovering
            || t.held.len() >= MAX_HELD
            || req.reply.is_none()
            || !req.ports.is_empty()
            || !req.ool.is_empty()
        {
            return false;
        }
        let name = {
            let mut dec = ictus_idl::Decoder::new(req);
            match String::decode(&mut dec).and_then(|n| dec.finish().map(|()| n)) {
                Ok(n) => n,
                Err(_) => return false,
            }
        };
        if validate_name(name.as_bytes()).is_err() || t.regs.contains_key(&name) {
            return false;
        }
        let Some(reply) = req.reply.take() else { return false };
        t.held.push(Held { name, reply });
        true
    }

    /// End the recovery window if it is over, answering what is still held; when the
    /// loop should look again.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut t = self.table();
        let until = t.recovering_until?;
        if now < until {
            return Some(until);
        }
        t.recovering_until = None;
        for h in std::mem::take(&mut t.held) {
            ictus_idl::reply_later::<SendRight, NamesError>(
                &self.space,
                h.reply,
                LOOKUP,
                Err(NamesError::NotFound),
                Duration::ZERO,
            );
        }
        None
    }

    /// Let go of every registered right and held reply (the server is stopping).
    fn release_all(&self) {
        let mut t = self.table();
        t.regs.clear();
        t.per_client.clear();
        for h in std::mem::take(&mut t.held) {
            let _ = self.space.deallocate(h.reply.name);
        }
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

/// The interface's methods, on the shared registry.
#[derive(Debug)]
struct Methods(Arc<Registry>);

impl std::ops::Deref for Methods {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        &self.0
    }
}

/// The interface's methods. Each `SendRight` argument is a reference the request
/// brought into the server's space: kept by a registration, else released here.
impl Names for Methods {
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

/// The generated [`NamesServer`], with look-ups taken aside while the server recovers.
struct NamesService {
    registry: Arc<Registry>,
    generated: NamesServer<Methods>,
}

impl Service for NamesService {
    fn ids(&self) -> RangeInclusive<i32> {
        self.generated.ids()
    }

    fn dispatch(&self, space: &Space, req: &mut Received) -> Outcome {
        if req.id == LOOKUP && self.registry.hold(req) {
            // Answered later, by `Registry::add` or `Registry::expire`.
            return Outcome::OneWay;
        }
        self.generated.dispatch(space, req)
    }
}

/// What the skeleton runs: the table and the generated demultiplexer.
#[derive(Debug)]
pub struct Core {
    registry: Arc<Registry>,
    /// The generated demultiplexer, [`NamesServer`], for requests on the service port.
    requests: ictus_idl::Server,
}

impl Serve for Core {
    const NAME: &'static str = "name-server";

    fn request(&mut self, msg: &mut Received) -> Dispatched {
        self.requests.handle(msg)
    }

    fn dead_name(&mut self, name: Name) {
        self.registry.dead_name(name);
    }

    fn prepare(&mut self) -> Result<Wait, ServeError> {
        Ok(Wait::Until(self.registry.expire(Instant::now())))
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // The registered rights first; the ports go with the loop afterwards.
        self.registry.release_all();
    }
}

/// The name server: its ports and its table. See the module documentation.
#[derive(Debug)]
pub struct Server {
    inner: Loop<Core, 1>,
}

impl Server {
    /// A server with its ports allocated in `space` (the process's own,
    /// [`Space::task`], for a real server).
    pub fn new(space: Space) -> Result<Server, ServeError> {
        let ports = ServicePorts::allocate(&space)?;
        ports.set_message_limit(SMALL_REQUESTS)?;
        let registry = Arc::new(Registry { space: space.clone(), notify: ports.notify(), table: Mutex::default() });
        let service =
            NamesService { registry: Arc::clone(&registry), generated: NamesServer(Methods(Arc::clone(&registry))) };
        // Replies never wait: a client that stops reading must not stall the only thread.
        let requests = ictus_idl::Server::new(&space, ports.set()).with(service).with_reply_timeout(Duration::ZERO);
        Ok(Server { inner: Loop::new(&space, ports, Core { registry, requests }) })
    }

    /// Hold look-ups of names not (yet) registered for [`RECOVERY`] from now: this
    /// server replaces one that crashed (see the module documentation).
    pub fn recover(&self) {
        self.inner.server().registry.table().recovering_until = Some(Instant::now() + RECOVERY);
    }

    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        self.inner.space()
    }

    /// The service port's receive right, in [`Server::space`]. Make send rights from it
    /// to hand out (for example with [`Space::give_bootstrap`]).
    pub fn service_port(&self) -> Name {
        self.inner.ports().service(0)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.inner.server().registry.table().regs.keys().cloned().collect()
    }

    /// Malformed messages received (and destroyed by the nucleus) so far.
    pub fn malformed(&self) -> u64 {
        self.inner.malformed()
    }

    /// The request counters: handled, refused (`MIG_BAD_ID`, `MIG_BAD_ARGUMENTS`),
    /// replies that could not be delivered.
    pub fn stats(&self) -> &ServerStats {
        self.inner.server().requests.stats()
    }

    /// Serve until `stop` becomes readable (a byte written, or its peer closed): ports,
    /// and the well-known socket if there is one. A listener that reclaimed a crashed
    /// server's socket starts the recovery window ([`Server::recover`]).
    pub fn run(&mut self, listener: Option<&Listener>, stop: BorrowedFd<'_>) -> Result<(), ServeError> {
        if listener.is_some_and(Listener::reclaimed) {
            self.recover();
        }
        self.inner.run(listener.map(|listener| Door { listener, port: 0 }), stop)
    }

    /// Receive and handle up to `max` messages that are already waiting; returns how
    /// many were handled.
    pub fn handle_pending(&mut self, rcv: &mut Received, max: usize) -> Result<usize, ServeError> {
        self.inner.handle_pending(rcv, max)
    }

    /// Handle one received message: a notification on the notify port, or a request on
    /// the service port, which the generated [`NamesServer`] decodes, carries out and
    /// answers (or refuses). Whatever the message carried and nobody keeps is released.
    pub fn handle(&mut self, msg: &mut Received) -> Dispatched {
        self.inner.handle(msg)
    }
}

/// A server running on a thread of this process (for tests, and for programs that
/// embed one). Dropping it stops the server.
#[derive(Debug)]
#[must_use = "dropping a Running stops the server"]
pub struct Running {
    inner: ictus_server::Running,
    space: Space,
    service: Name,
    path: Option<PathBuf>,
}

/// Start a server on a new thread, its ports in `space`, listening on the well-known
/// socket `socket` if given (see [`crate::socket`] and [`Listener`]). When this returns the socket is
/// bound and listening, so clients can connect at once.
pub fn spawn(space: Space, socket: Option<&Path>) -> Result<Running, ServeError> {
    let listener = socket.map(|p| Listener::bind(p, "name server")).transpose()?;
    let mut server = Server::new(space.clone())?;
    let service = server.service_port();
    let inner = ictus_server::Running::spawn("ictus-name-server", move |stop| {
        let r = server.run(listener.as_ref(), stop);
        // Release the ports first, then the socket path.
        drop(server);
        drop(listener);
        r
    })?;
    Ok(Running { inner, space, service, path: socket.map(Path::to_owned) })
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
    pub fn stop(self) -> Result<(), ServeError> {
        self.inner.stop()
    }
}
