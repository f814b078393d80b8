//! The port transport, on the server skeleton ([`ictus_server::Loop`]): the service
//! port, where every client opens its connection (whatever its transport), and one
//! request port per port client, all in the loop's port set.
//!
//! A port client brings a send right to its event port when it opens; the server
//! watches that right with a dead-name request, so a client that dies (even by
//! `kill -9`) or closes loses its windows at once. Batches arrive one message each,
//! in-line, with images out-of-line (sealed memfds, never copied on the way); a batch
//! that ends with a sync comes as a call, answered through its reply right once the
//! server has done it. Other threads (the presenter, a transport thread that presented
//! a frame) wake this one through an eventfd, the paper's "back door".

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ictus_display::{proto, service, Transport};
use ictus_idl::Dispatched;
use ictus_ipc::{Disposition, Message, Name, PortArg, Received, RightKind, SendOptions, Space};
use ictus_server::{DeadNameWatches, Serve, ServeError, Wait};

use super::take_msgs;
use crate::core::{lock, Core, FrameSrc, Out, Outbox, Session, Waker};

/// Largest message of events sent to a port client at once.
const EVENTS_MAX: usize = 60 << 10;

struct PortClient {
    session: Session,
    /// The client's event port (a send right).
    events: Name,
}

/// What the service port answers with, besides the port transport's own clients.
#[derive(Debug, Clone)]
pub(crate) struct Offer {
    /// The shared-memory transport's service port, if the server offers it.
    pub shm_service: Option<Name>,
    /// The socket transport's path, if the server offers it.
    pub socket_path: Option<PathBuf>,
}

/// The port transport: a [`Serve`] for the skeleton's loop.
pub(crate) struct PortTransport {
    core: Arc<Core>,
    space: Space,
    service: Name,
    notify: Name,
    set: Name,
    offer: Offer,
    /// By request port.
    clients: HashMap<Name, PortClient>,
    watches: DeadNameWatches,
    wake: Arc<Waker>,
}

impl std::fmt::Debug for PortTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortTransport").field("clients", &self.clients.len()).finish()
    }
}

impl PortTransport {
    /// The transport for the loop whose ports are `service` (0), `notify` and `set`.
    pub(crate) fn new(
        core: Arc<Core>,
        space: &Space,
        ports: &ictus_server::ServicePorts<1>,
        offer: Offer,
        wake: Arc<Waker>,
    ) -> PortTransport {
        PortTransport {
            core,
            space: space.clone(),
            service: ports.service(0),
            notify: ports.notify(),
            set: ports.set(),
            offer,
            clients: HashMap::new(),
            watches: DeadNameWatches::new(),
            wake,
        }
    }

    /// Answer an open request (its data checked here); for a port client, make its
    /// request port and keep its event right. The rights the request brought are
    /// released by the caller, but for the event right, which this takes.
    fn open(&mut self, rcv: &mut Received) -> Message {
        let refuse = |why: &str| Message::new(service::OPEN_REFUSED, why.as_bytes().to_vec());
        let d = rcv.data();
        if d.len() != 8 {
            return refuse("an open request is 8 bytes");
        }
        let version = u32::from_le_bytes(d[..4].try_into().expect("4 bytes"));
        if version != proto::VERSION {
            return refuse(&format!("protocol version {version}; this server speaks {}", proto::VERSION));
        }
        let Some(t) = Transport::from_code(d[4]) else { return refuse("unknown transport") };
        let mut data = proto::VERSION.to_le_bytes().to_vec();
        data.extend_from_slice(&self.core.screen.0.to_le_bytes());
        data.extend_from_slice(&self.core.screen.1.to_le_bytes());
        let mut m = Message::new(service::OPEN_OK, Vec::new());
        match t {
            Transport::Socket => match &self.offer.socket_path {
                Some(path) => data.extend_from_slice(path.to_string_lossy().as_bytes()),
                None => return refuse("this server has no socket transport"),
            },
            Transport::Shm => match self.offer.shm_service {
                Some(s) => m.ports.push(PortArg::new(s, Disposition::MakeSend)),
                None => return refuse("this server has no shared-memory transport"),
            },
            Transport::Port => {
                let events = match rcv.ports.as_slice() {
                    [r] if r.kind == RightKind::Send => r.name,
                    _ => return refuse("a port connection brings one send right, to its event port"),
                };
                let Ok(port) = self.space.allocate_port() else { return refuse("no port") };
                if self.space.move_member(port, self.set).is_err() {
                    let _ = self.space.destroy(port);
                    return refuse("cannot set up the request port");
                }
                if self.watches.watch(&self.space, events, self.notify).is_err() {
                    let _ = self.space.destroy(port);
                    return refuse("the event port is already dead");
                }
                // The event right (its one reference) is the client's entry's now.
                rcv.ports.clear();
                let session = Session::new(&self.core, Outbox::new(self.wake.clone()));
                self.clients.insert(port, PortClient { session, events });
                m.ports.push(PortArg::new(port, Disposition::MakeSend));
            }
        }
        m.data = data;
        m
    }

    /// Forget a client: its windows and buffers go, its ports with them.
    fn close(&mut self, port: Name) {
        if let Some(c) = self.clients.remove(&port) {
            c.session.close(&self.core);
            self.watches.unwatch(&self.space, c.events);
            let _ = self.space.deallocate(c.events);
            let _ = self.space.destroy(port);
        }
    }

    /// A batch on a client's request port; `false` to cut the client off.
    fn batch(&mut self, port: Name, rcv: &mut Received) -> bool {
        let core = &self.core;
        let Some(c) = self.clients.get_mut(&port) else { return true };
        if !matches!(rcv.id, service::BATCH | service::BATCH_SYNC) || !rcv.ports.is_empty() {
            return false;
        }
        for r in std::mem::take(&mut rcv.ool) {
            c.session.attach(core, FrameSrc::Ool(r));
        }
        c.session.reply = if rcv.id == service::BATCH_SYNC { rcv.reply.take().map(|r| r.name) } else { None };
        let ok = c.session.execute(core, rcv.data()).is_ok();
        if let Some(r) = c.session.reply.take() {
            // A sync call without a sync in it: nothing to answer.
            let _ = self.space.deallocate(r);
        }
        ok
    }

    /// Send every client what waits for it; cut off those whose event port is gone.
    fn deliver(&mut self) {
        let mut dead = Vec::new();
        for (port, c) in &self.clients {
            loop {
                let front = lock(&c.session.outbox.q).pop_front();
                match front {
                    None => break,
                    Some(Out::PortReply { reply, bytes }) => {
                        let mut m = Message::new(service::SYNCED, bytes);
                        if self.space.send(reply, &mut m, SendOptions::NONBLOCKING).is_err() {
                            let _ = self.space.deallocate(reply);
                        }
                    }
                    Some(Out::Msg(first)) => {
                        let mut bytes = first;
                        bytes.extend_from_slice(&take_msgs(&c.session.outbox, EVENTS_MAX));
                        let mut m = Message::new(service::EVENTS, bytes);
                        match self.space.send(c.events, &mut m, SendOptions::NONBLOCKING) {
                            Ok(()) => {}
                            // Its queue is full: it is not reading. Dropped, and counted.
                            Err(ictus_ipc::SendError::TimedOut) => {
                                self.core.stats.errors.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                dead.push(*port);
                                break;
                            }
                        }
                    }
                }
            }
        }
        for port in dead {
            self.close(port);
        }
    }
}

impl Serve for PortTransport {
    const NAME: &'static str = "display-server";

    fn request(&mut self, msg: &mut Received) -> Dispatched {
        let port = msg.port;
        let outcome = if port == self.service {
            if msg.id != service::OPEN {
                Dispatched::NotMine
            } else {
                let mut answer = self.open(msg);
                let new_port = answer.ports.first().map(|a| a.name).filter(|n| self.clients.contains_key(n));
                let sent = msg.reply.take().is_some_and(|r| {
                    let ok = self.space.send(r.name, &mut answer, SendOptions::NONBLOCKING).is_ok();
                    if !ok {
                        let _ = self.space.deallocate(r.name);
                    }
                    ok
                });
                match (sent, new_port) {
                    (true, _) => Dispatched::Replied,
                    (false, Some(p)) => {
                        // The caller gave up: forget the connection it never saw.
                        self.close(p);
                        Dispatched::ReplyFailed
                    }
                    (false, None) => Dispatched::ReplyFailed,
                }
            }
        } else if self.clients.contains_key(&port) {
            if self.batch(port, msg) {
                Dispatched::OneWay
            } else {
                // Bytes that do not decode, or a message that is not a batch: the
                // client is cut off (what ran of its batch stays done).
                self.core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
                self.close(port);
                Dispatched::OneWay
            }
        } else {
            Dispatched::NotMine
        };
        ictus_idl::release_rights(&self.space, msg);
        outcome
    }

    fn dead_name(&mut self, name: Name) {
        if !self.space.right_kinds(name).is_ok_and(|k| k == [RightKind::DeadName]) {
            return;
        }
        // Every connection whose event right that was (a client may have opened several).
        let gone: Vec<Name> = self.clients.iter().filter(|(_, c)| c.events == name).map(|(p, _)| *p).collect();
        for port in gone {
            self.close(port);
        }
        self.watches.forget(&self.space, name);
        let _ = self.space.deallocate(name);
    }

    fn prepare(&mut self) -> Result<Wait, ServeError> {
        self.deliver();
        Ok(Wait::Until(None))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        match &*self.wake {
            Waker::Fd(fd) => vec![fd.as_fd()],
            _ => Vec::new(),
        }
    }

    fn ready(&mut self, _wake: usize) -> Result<(), ServeError> {
        if let Waker::Fd(fd) = &*self.wake {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(fd, &mut b);
        }
        Ok(())
    }
}

impl Drop for PortTransport {
    fn drop(&mut self) {
        let ports: Vec<Name> = self.clients.keys().copied().collect();
        for port in ports {
            self.close(port);
        }
        self.watches.forget_all(&self.space);
    }
}
