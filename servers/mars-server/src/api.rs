//! The streams API and the control interface on ports: each request becomes an engine
//! [`Command`]; `open` connects the destination sockets here (a connect may block for a
//! moment, which the engine must never do) and hands them over.
//!
//! Owners: `open` takes an owner send right; the server arms a dead-name notification
//! on it (once per owner, counted per stream), so when the owner's task dies — even by
//! `kill -9` — the notification arrives on the notify port and the owner's streams are
//! closed.

use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ictus_abi::NotifyId;
use ictus_idl::{Context, DeadNameWatches, ServicePorts};
use ictus_ipc::{Name, Received, RightKind, RightsError, Space};
use rustix::event::{poll, PollFd, PollFlags};

use crate::engine::{Command, EngineHandle, StreamState};
use crate::protocol::{MarsControl, MarsControlServer, StreamError, Streams, StreamsServer, MAX_BATCH, STATE_WORDS};

/// Why the ports side stopped.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The port set could not be polled.
    #[error("the port set: {0}")]
    Rights(#[from] RightsError),
    /// Receiving failed again and again.
    #[error("receiving: {0}")]
    Receive(#[source] ictus_ipc::ReceiveError),
}

struct Shared {
    space: Space,
    notify: Name,
    engine: EngineHandle,
    owners: Mutex<Owners>,
}

#[derive(Default)]
struct Owners {
    watches: DeadNameWatches,
    streams: HashMap<Name, Vec<u64>>,
}

#[derive(Clone)]
struct StreamsImpl(Arc<Shared>);

/// Asks how many owners hold open streams.
#[derive(Clone)]
pub struct OwnersHandle(Arc<Shared>);

impl OwnersHandle {
    /// Owners with streams open.
    pub fn owners(&self) -> usize {
        self.0.owners.lock().map_or(0, |o| o.streams.len())
    }
}

impl std::fmt::Debug for OwnersHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OwnersHandle({})", self.owners())
    }
}

fn batch(ids: &[u64]) -> Result<(), StreamError> {
    if ids.is_empty() || ids.len() > MAX_BATCH {
        return Err(StreamError::BadBatch);
    }
    Ok(())
}

fn connect(dest: &str) -> Result<OwnedFd, String> {
    let addrs: Vec<_> = dest.to_socket_addrs().map_err(|e| format!("destination {dest:?}: {e}"))?.collect();
    let addr = addrs.first().ok_or_else(|| format!("destination {dest:?}: no address"))?;
    let s = TcpStream::connect_timeout(addr, Duration::from_secs(5)).map_err(|e| format!("connect {dest}: {e}"))?;
    let _ = s.set_nodelay(true);
    Ok(OwnedFd::from(s))
}

impl Streams for StreamsImpl {
    fn open(
        &self,
        _cx: &Context,
        owner: ictus_idl::SendRight,
        names: Vec<String>,
        dests: Vec<String>,
        offsets: Vec<u64>,
        rates: Vec<u64>,
        chains: u32,
    ) -> Result<(Vec<u64>, Vec<String>), StreamError> {
        let s = &self.0;
        let n = names.len();
        let release_owner = || {
            let _ = s.space.mod_refs(owner.name, RightKind::Send, -1);
        };
        if n == 0 || n > MAX_BATCH || dests.len() != n || offsets.len() != n || rates.len() != n {
            release_owner();
            return Err(StreamError::BadBatch);
        }
        let mut ids = Vec::with_capacity(n);
        let mut reasons = Vec::with_capacity(n);
        for i in 0..n {
            let r = connect(&dests[i]).and_then(|sock| {
                let (tx, rx) = mpsc::channel();
                let rate = (rates[i] > 0).then_some(rates[i] as f64);
                s.engine.post(Command::Open {
                    sock,
                    name: names[i].clone(),
                    offset: offsets[i],
                    rate,
                    chains: chains as usize,
                    reply: tx,
                });
                rx.recv_timeout(Duration::from_secs(10)).map_err(|_| "the engine did not answer".to_string())?
            });
            match r {
                Ok(id) => {
                    ids.push(id);
                    reasons.push(String::new());
                }
                Err(e) => {
                    ids.push(0);
                    reasons.push(e);
                }
            }
        }
        let opened: Vec<u64> = ids.iter().copied().filter(|&id| id != 0).collect();
        let mut o = s.owners.lock().map_err(|_| StreamError::Stopped)?;
        if opened.is_empty() || o.watches.watch(&s.space, owner.name, s.notify).is_err() {
            // Nothing to watch for, or the owner is already dead: close what opened.
            drop(o);
            if !opened.is_empty() {
                s.engine.post(Command::Close(opened));
            }
            release_owner();
            return Ok((ids, reasons));
        }
        // One reference of the owner right per open call is kept; the watch counts it.
        o.streams.entry(owner.name).or_default().extend(opened);
        Ok((ids, reasons))
    }

    fn read(&self, ids: Vec<u64>) -> Result<(), StreamError> {
        batch(&ids)?;
        self.0.engine.post(Command::Read(ids));
        Ok(())
    }

    fn send(&self, ids: Vec<u64>) -> Result<(), StreamError> {
        batch(&ids)?;
        self.0.engine.post(Command::Send(ids));
        Ok(())
    }

    fn read_send(&self, ids: Vec<u64>) -> Result<(), StreamError> {
        batch(&ids)?;
        self.0.engine.post(Command::ReadSend(ids));
        Ok(())
    }

    fn state(&self, ids: Vec<u64>) -> Result<Vec<u64>, StreamError> {
        batch(&ids)?;
        let states = self.0.engine.state(ids).ok_or(StreamError::Stopped)?;
        let mut out = Vec::with_capacity(states.len() * STATE_WORDS);
        for st in states {
            out.extend(state_words(&st));
        }
        Ok(out)
    }

    fn close(&self, ids: Vec<u64>) -> Result<(), StreamError> {
        batch(&ids)?;
        self.0.engine.post(Command::Close(ids));
        Ok(())
    }

    fn stats(&self) -> Result<Vec<u64>, StreamError> {
        let s = self.0.engine.stats().ok_or(StreamError::Stopped)?;
        Ok(vec![
            s.connections,
            s.accepted,
            s.refused,
            s.timed_out,
            s.requests,
            s.buffers_free,
            s.buffers,
            s.bytes_zero_copy,
            s.bytes_copied,
            s.reads,
            u64::from(s.direct),
            u64::from(s.registered),
            u64::from(s.zero_copy),
            s.rt_streams,
            s.reserved as u64,
            s.reservable as u64,
        ])
    }
}

/// The words of one stream's state, as [`Streams::state`] sends them.
pub fn state_words(st: &StreamState) -> [u64; STATE_WORDS] {
    [
        st.id,
        u64::from(st.state),
        st.read,
        st.sent,
        u64::from(st.buffers[0]),
        u64::from(st.buffers[1]),
        u64::from(st.buffers[2]),
        st.slots,
        st.late,
        st.max_late_ns,
    ]
}

#[derive(Clone)]
struct ControlImpl(Arc<Shared>);

impl MarsControl for ControlImpl {
    fn set_quantum(&self, class: String, sectors: u32) -> Result<(), StreamError> {
        let (tx, rx) = mpsc::channel();
        self.0.engine.post(Command::SetQuantum { class, sectors, reply: tx });
        rx.recv_timeout(Duration::from_secs(10)).map_err(|_| StreamError::Stopped)?.map_err(|_| StreamError::Invalid)
    }

    fn classes(&self) -> Result<(Vec<String>, Vec<u32>, Vec<u64>), StreamError> {
        let s = self.0.engine.stats().ok_or(StreamError::Stopped)?;
        Ok((
            s.classes.iter().map(|c| c.0.clone()).collect(),
            s.classes.iter().map(|c| c.1).collect(),
            s.classes.iter().map(|c| c.2).collect(),
        ))
    }
}

/// The ports side of the server: the streams port (0), the control port (1) and the
/// notify port, in one set.
pub struct ApiServer {
    space: Space,
    pid: u32,
    shared: Arc<Shared>,
    streams: ictus_idl::Server,
    control: ictus_idl::Server,
    counts: ictus_idl::ReceiveCounts,
    ports: ServicePorts<2>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Ports allocated in `space`, requests going to `engine`.
    pub fn new(space: Space, engine: EngineHandle) -> Result<ApiServer, RightsError> {
        let ports = ServicePorts::allocate(&space)?;
        let shared = Arc::new(Shared {
            space: space.clone(),
            notify: ports.notify(),
            engine,
            owners: Mutex::new(Owners::default()),
        });
        let streams = ictus_idl::Server::new(&space, ports.set())
            .with(StreamsServer(StreamsImpl(Arc::clone(&shared))))
            .with_reply_timeout(Duration::from_secs(1));
        let control = ictus_idl::Server::new(&space, ports.set())
            .with(StreamsServer(StreamsImpl(Arc::clone(&shared))))
            .with(MarsControlServer(ControlImpl(Arc::clone(&shared))))
            .with_reply_timeout(Duration::from_secs(1));
        Ok(ApiServer {
            space,
            pid: std::process::id(),
            shared,
            streams,
            control,
            counts: ictus_idl::ReceiveCounts::default(),
            ports,
        })
    }

    /// The streams port's receive right.
    pub fn streams_port(&self) -> Name {
        self.ports.service(0)
    }

    /// The control port's receive right.
    pub fn control_port(&self) -> Name {
        self.ports.service(1)
    }

    /// The space.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Owners watched now (for tests).
    pub fn owners(&self) -> usize {
        self.owners_handle().owners()
    }

    /// A handle other threads can ask for the owner count while the server runs.
    pub fn owners_handle(&self) -> OwnersHandle {
        OwnersHandle(Arc::clone(&self.shared))
    }

    /// Serves until `stop` is readable; `control` hands out the control port.
    pub fn run(
        &mut self,
        control: Option<&ictus_name_server::socket::Listener>,
        stop: BorrowedFd<'_>,
    ) -> Result<(), ApiError> {
        let ports = self.space.pollable_fd(self.ports.set())?;
        let mut rcv = Received::new();
        loop {
            let (stop_ready, ports_ready, listen_ready) = {
                let mut fds = vec![PollFd::from_borrowed_fd(stop, PollFlags::IN), PollFd::new(&ports, PollFlags::IN)];
                if let Some(l) = control {
                    fds.push(PollFd::from_borrowed_fd(l.as_fd(), PollFlags::IN));
                }
                match poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => return Ok(()),
                }
                let ready = |i: usize| fds.get(i).is_some_and(|f| !f.revents().is_empty());
                (ready(0), ready(1), ready(2))
            };
            if stop_ready || self.shared.engine.stopped() {
                return Ok(());
            }
            if ports_ready {
                self.handle_pending(&mut rcv).map_err(ApiError::Receive)?;
            }
            if let (true, Some(l)) = (listen_ready, control) {
                let (_, refused) = l.serve_pending(|| self.space.send_right_fd(self.ports.service(1)).ok());
                if refused > 0 {
                    eprintln!("ictus mars: refused the control port to {refused} connection(s) from another user");
                }
            }
        }
    }

    fn handle_pending(&mut self, rcv: &mut Received) -> Result<usize, ictus_ipc::ReceiveError> {
        let mut counts = self.counts;
        let r = self.ports.handle_pending(
            rcv,
            64,
            &mut counts,
            |m| self.handle(m),
            |n, e| {
                if n.is_power_of_two() {
                    eprintln!("ictus mars: dropped a malformed message ({n} so far): {e}");
                }
            },
        );
        self.counts = counts;
        r
    }

    fn handle(&self, msg: &mut Received) {
        if msg.port == self.ports.notify() {
            if msg.sender.pid == self.pid && msg.id == NotifyId::DeadName.id() {
                if let Some((name, _)) = NotifyId::parse_body(msg.data()) {
                    self.owner_died(name);
                }
            }
            ictus_idl::release_rights(&self.space, msg);
            return;
        }
        if msg.port == self.ports.service(1) {
            self.control.handle(msg);
        } else {
            self.streams.handle(msg);
        }
    }

    fn owner_died(&self, name: Name) {
        let Ok(mut o) = self.shared.owners.lock() else { return };
        let Some(ids) = o.streams.remove(&name) else { return };
        o.watches.forget(&self.space, name);
        drop(o);
        // The dead name's references (one per open call) go with it.
        for _ in 0..=MAX_BATCH {
            if self.space.deallocate(name).is_err() {
                break;
            }
        }
        self.shared.engine.post(Command::Close(ids));
    }
}
