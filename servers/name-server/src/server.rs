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
//! Whatever else a request carries is released when it has been answered: extra send
//! and send-once rights are deallocated, a receive right is destroyed (its port dies,
//! which is what sending it to a name server deserves), out-of-line memory is unmapped.
//! Replies are sent without waiting: a reply that does not fit in the client's queue is
//! dropped, so that no client can stall the server.
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
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_abi::{Name, NotifyId, ReturnCode};
use ictus_ipc::{
    Credentials, Disposition, Message, NotifyKind, PortArg, ReceiveError, ReceiveOptions, Received, RightKind,
    RightsError, SendError, SendOptions, Space,
};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

use crate::protocol::{self, ArgRight, Request, MAX_REGISTRATIONS};
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

/// What answering one request comes to.
struct Outcome {
    code: ReturnCode,
    rest: Vec<u8>,
    /// A right to copy into the reply.
    right: Option<Name>,
    /// A right of the request the server keeps (not released).
    keep: Option<Name>,
}

impl Outcome {
    fn code(code: ReturnCode) -> Outcome {
        Outcome { code, rest: Vec::new(), right: None, keep: None }
    }
}

/// Consecutive receive failures (other than malformed messages) after which the server
/// gives up instead of spinning.
const MAX_CONSECUTIVE_ERRORS: u32 = 1000;
/// Messages handled per wake-up before looking at the socket and the stop channel.
const BATCH: usize = 64;

/// The name server: its ports and its table. See the module documentation.
#[derive(Debug)]
pub struct Server {
    space: Space,
    set: Name,
    service: Name,
    notify: Name,
    pid: u32,
    regs: BTreeMap<String, Registration>,
    /// Registrations per right name.
    by_right: HashMap<Name, usize>,
    malformed: u64,
    consecutive_errors: u32,
}

impl Server {
    /// A server with its ports allocated in `space` (the process's own,
    /// [`Space::task`], for a real server).
    pub fn new(space: Space) -> Result<Server, ServeError> {
        let mut s = Server {
            space,
            set: Name::NULL,
            service: Name::NULL,
            notify: Name::NULL,
            pid: std::process::id(),
            regs: BTreeMap::new(),
            by_right: HashMap::new(),
            malformed: 0,
            consecutive_errors: 0,
        };
        // Dropping `s` on an error releases whatever was made.
        s.set = s.space.allocate_port_set()?;
        s.service = s.space.allocate_port()?;
        s.notify = s.space.allocate_port()?;
        s.space.move_member(s.service, s.set)?;
        s.space.move_member(s.notify, s.set)?;
        Ok(s)
    }

    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The service port's receive right, in [`Server::space`]. Make send rights from it
    /// to hand out (for example with [`Space::give_bootstrap`]).
    pub fn service_port(&self) -> Name {
        self.service
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.regs.keys().map(String::as_str)
    }

    /// Malformed messages received (and destroyed) so far.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// Serve until `stop` becomes readable (a byte written, or its peer closed): ports,
    /// and the well-known socket if there is one.
    pub fn run(&mut self, listener: Option<&Listener>, stop: BorrowedFd<'_>) -> Result<(), ServeError> {
        let ports = self.space.pollable_fd(self.set)?;
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
                let (_, refused) = l.serve_pending(|| self.space.send_right_fd(self.service).ok());
                if refused > 0 {
                    eprintln!("ictus name-server: refused {refused} connection(s) from another user");
                }
            }
        }
    }

    /// Receive and handle up to `max` messages that are already waiting; returns how
    /// many were handled.
    pub fn handle_pending(&mut self, rcv: &mut Received, max: usize) -> Result<usize, ServeError> {
        let now = ReceiveOptions { timeout: Some(Duration::ZERO), ..ReceiveOptions::default() };
        let mut handled = 0;
        while handled < max {
            match self.space.receive(self.set, rcv, now) {
                Ok(()) => {
                    self.consecutive_errors = 0;
                    self.handle(rcv);
                    handled += 1;
                }
                Err(ReceiveError::TimedOut) => break,
                Err(e @ ReceiveError::Malformed { .. }) => {
                    self.malformed += 1;
                    // Say so, but do not let a hostile sender flood the log.
                    if self.malformed.is_power_of_two() {
                        eprintln!("ictus name-server: dropped a malformed message ({} so far): {e}", self.malformed);
                    }
                }
                Err(e) => {
                    self.consecutive_errors += 1;
                    if self.consecutive_errors >= MAX_CONSECUTIVE_ERRORS {
                        return Err(ServeError::Receive(e));
                    }
                    break;
                }
            }
        }
        Ok(handled)
    }

    /// Handle one received message: answer it, and release what it carried.
    pub fn handle(&mut self, msg: &Received) {
        if msg.port == self.notify {
            self.handle_notification(msg);
            self.release(msg, None);
            if let Some(r) = msg.reply {
                let _ = self.space.deallocate(r.name);
            }
            return;
        }
        let rights: Vec<ArgRight> = msg
            .ports
            .iter()
            .map(|r| if r.kind == RightKind::Send { ArgRight::Send } else { ArgRight::Other })
            .collect();
        let outcome = match protocol::decode_request(msg.id, msg.data(), &rights, !msg.ool.is_empty()) {
            Err(code) => Outcome::code(code),
            Ok(Request::Register { name }) => self.register(name, msg.ports[0].name, msg.sender),
            Ok(Request::Lookup { name }) => self.lookup(name),
            Ok(Request::Unregister { name, with_right }) => {
                self.unregister(name, with_right.then(|| msg.ports[0].name), msg.sender)
            }
            Ok(Request::List) => self.list(),
        };
        self.release(msg, outcome.keep);
        let Some(reply) = msg.reply else { return };
        let mut sent = self.send_reply(reply.name, msg.id, &outcome);
        if let (Err(SendError::InvalidRight(r)), Some(right)) = (&sent, outcome.right) {
            if *r == right {
                // The right died between the check and the send.
                self.purge(right);
                sent = self.send_reply(reply.name, msg.id, &Outcome::code(ReturnCode::InvalidName));
            }
        }
        if sent.is_err() || reply.kind != RightKind::SendOnce {
            let _ = self.space.deallocate(reply.name);
        }
    }

    fn send_reply(&self, to: Name, request: i32, outcome: &Outcome) -> Result<(), SendError> {
        let mut m = Message::new(protocol::reply_id(request), protocol::encode_reply(outcome.code, &outcome.rest));
        if let Some(r) = outcome.right {
            m.ports.push(PortArg::new(r, Disposition::CopySend));
        }
        self.space.send(to, &mut m, SendOptions::NONBLOCKING)
    }

    /// Release the rights a message brought, except one reference of `keep`.
    fn release(&self, msg: &Received, keep: Option<Name>) {
        let mut kept = false;
        for r in &msg.ports {
            if !kept && keep == Some(r.name) {
                kept = true;
                continue;
            }
            let _ = match r.kind {
                RightKind::Receive => self.space.mod_refs(r.name, RightKind::Receive, -1),
                _ => self.space.deallocate(r.name),
            };
        }
    }

    fn handle_notification(&mut self, msg: &Received) {
        // Only the notifier of this very process sends here; the kernel stamps the pid.
        if msg.sender.pid != self.pid || msg.id != NotifyId::DeadName.id() {
            return;
        }
        let Some((name, _)) = NotifyId::parse_body(msg.data()) else {
            return;
        };
        if self.space.right_kinds(name).is_ok_and(|k| k == [RightKind::DeadName]) {
            self.purge(name);
        }
    }

    fn is_dead(&self, right: Name) -> bool {
        match self.space.right_kinds(right) {
            Ok(k) => k.contains(&RightKind::DeadName),
            Err(_) => true,
        }
    }

    /// The port behind `right` died: drop every registration of it and the dead name.
    fn purge(&mut self, right: Name) {
        self.regs.retain(|_, r| r.right != right);
        self.by_right.remove(&right);
        if self.space.right_kinds(right).is_ok_and(|k| k == [RightKind::DeadName]) {
            let _ = self.space.destroy(right);
        }
    }

    /// Drop one registration's reference of `right`.
    fn drop_reference(&mut self, right: Name) {
        if self.is_dead(right) {
            self.purge(right);
            return;
        }
        let count = self.by_right.get(&right).copied().unwrap_or(0);
        if count <= 1 {
            self.by_right.remove(&right);
            // Cancel the dead-name request before letting go of the right: the nucleus
            // would otherwise keep watching (and holding) the connection.
            let _ = self.space.request_notification(right, NotifyKind::DeadName, None);
        } else {
            self.by_right.insert(right, count - 1);
        }
        let _ = self.space.deallocate(right);
    }

    fn register(&mut self, name: &str, right: Name, owner: Credentials) -> Outcome {
        if self.regs.contains_key(name) {
            return Outcome::code(ReturnCode::NameExists);
        }
        if self.regs.len() >= MAX_REGISTRATIONS {
            return Outcome::code(ReturnCode::NoSpace);
        }
        if self.is_dead(right) {
            return Outcome::code(ReturnCode::InvalidRight);
        }
        let count = self.by_right.get(&right).copied().unwrap_or(0);
        if count == 0 {
            let notify = PortArg::new(self.notify, Disposition::MakeSend);
            if self.space.request_notification(right, NotifyKind::DeadName, Some(notify)).is_err() {
                return Outcome::code(ReturnCode::ResourceShortage);
            }
        }
        self.by_right.insert(right, count + 1);
        self.regs.insert(name.to_owned(), Registration { right, owner });
        Outcome { keep: Some(right), ..Outcome::code(ReturnCode::Success) }
    }

    fn lookup(&mut self, name: &str) -> Outcome {
        let Some(reg) = self.regs.get(name) else {
            return Outcome::code(ReturnCode::InvalidName);
        };
        let right = reg.right;
        if self.is_dead(right) {
            self.purge(right);
            return Outcome::code(ReturnCode::InvalidName);
        }
        Outcome { right: Some(right), ..Outcome::code(ReturnCode::Success) }
    }

    fn unregister(&mut self, name: &str, presented: Option<Name>, sender: Credentials) -> Outcome {
        let Some(reg) = self.regs.get(name).copied() else {
            return Outcome::code(ReturnCode::InvalidName);
        };
        let by_owner = sender.pid == reg.owner.pid && sender.uid == reg.owner.uid;
        if !by_owner && presented != Some(reg.right) {
            return Outcome::code(ReturnCode::NoAccess);
        }
        self.regs.remove(name);
        self.drop_reference(reg.right);
        Outcome::code(ReturnCode::Success)
    }

    fn list(&mut self) -> Outcome {
        let dead: Vec<Name> = self.by_right.keys().copied().filter(|&r| self.is_dead(r)).collect();
        for r in dead {
            self.purge(r);
        }
        let rest = protocol::encode_list(self.regs.keys().map(String::as_str));
        Outcome { rest, ..Outcome::code(ReturnCode::Success) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let rights: Vec<(Name, usize)> = self.by_right.drain().collect();
        self.regs.clear();
        for (right, count) in rights {
            let _ = self.space.request_notification(right, NotifyKind::DeadName, None);
            if self.space.right_kinds(right).is_ok_and(|k| k == [RightKind::DeadName]) {
                let _ = self.space.destroy(right);
            } else {
                let _ = self.space.mod_refs(right, RightKind::Send, -(count.min(i32::MAX as usize) as i32));
            }
        }
        for port in [self.service, self.notify] {
            if port != Name::NULL {
                // Out of the set first: destroying a receive right that is a set member
                // deadlocks in the nucleus (`destroy_receive` holds the port's lock
                // while removing it from its set).
                let _ = self.space.move_member(port, Name::NULL);
                let _ = self.space.mod_refs(port, RightKind::Receive, -1);
            }
        }
        if self.set != Name::NULL {
            let _ = self.space.mod_refs(self.set, RightKind::PortSet, -1);
        }
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
