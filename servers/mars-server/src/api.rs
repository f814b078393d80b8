//! The streams API and the control interface on ports, on the server skeleton
//! ([`ictus_server::Loop`]): each request becomes an engine [`Command`]; `open`
//! connects the destination sockets here (a connect may block for a moment, which the
//! engine must never do) and hands them over.
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

use ictus_idl::{Context, Dispatched};
use ictus_ipc::{Name, Received, RightKind, Space};
use ictus_mars_api::protocol::{MarsControl, MarsControlServer, Stats, StreamError, Streams, StreamsServer, MAX_BATCH};
use ictus_server::{DeadNameWatches, Door, Listener, Loop, Serve, ServeError, ServicePorts};

use crate::engine::{Command, EngineHandle, EngineStats};

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

/// Asks how many owners hold open streams (from any thread).
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

/// The counters as the wire carries them.
pub fn stats_of(s: &EngineStats) -> Stats {
    s.counters
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
        Ok(states.iter().flat_map(|st| st.to_words()).collect())
    }

    fn close(&self, ids: Vec<u64>) -> Result<(), StreamError> {
        batch(&ids)?;
        self.0.engine.post(Command::Close(ids));
        Ok(())
    }

    fn stats(&self) -> Result<Vec<u64>, StreamError> {
        let s = self.0.engine.stats().ok_or(StreamError::Stopped)?;
        Ok(stats_of(&s).to_words().to_vec())
    }
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

/// What the loop serves: the streams port (0) and the control port (1), whose
/// dispatchers differ (only the control port serves [`MarsControl`]), and the owners'
/// dead-name notifications.
struct Serving {
    space: Space,
    shared: Arc<Shared>,
    streams: ictus_idl::Server,
    control: ictus_idl::Server,
    control_port: Name,
}

impl Serve for Serving {
    const NAME: &'static str = "mars";

    fn request(&mut self, msg: &mut Received) -> Dispatched {
        if msg.port == self.control_port {
            self.control.handle(msg)
        } else {
            self.streams.handle(msg)
        }
    }

    fn dead_name(&mut self, name: Name) {
        let Ok(mut o) = self.shared.owners.lock() else { return };
        let Some(ids) = o.streams.remove(&name) else { return };
        // `forget` drops the watch's reference; the name's other references (one per
        // open call) go with the dead name.
        o.watches.forget(&self.space, name);
        drop(o);
        for _ in 0..=MAX_BATCH {
            if self.space.deallocate(name).is_err() {
                break;
            }
        }
        self.shared.engine.post(Command::Close(ids));
    }
}

/// The ports side of the server: the streams port, the control port and the notify
/// port, served by one [`Loop`].
pub struct ApiServer {
    inner: Loop<Serving, 2>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Ports allocated in `space`, requests going to `engine`.
    pub fn new(space: Space, engine: EngineHandle) -> Result<ApiServer, ServeError> {
        let ports = ServicePorts::<2>::allocate(&space)?;
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
        let serving = Serving {
            space: space.clone(),
            shared: Arc::clone(&shared),
            streams,
            control,
            control_port: ports.service(1),
        };
        Ok(ApiServer { inner: Loop::new(&space, ports, serving), shared })
    }

    /// The streams port's receive right.
    pub fn streams_port(&self) -> Name {
        self.inner.ports().service(0)
    }

    /// The control port's receive right.
    pub fn control_port(&self) -> Name {
        self.inner.ports().service(1)
    }

    /// The space.
    pub fn space(&self) -> &Space {
        self.inner.space()
    }

    /// Owners watched now (for tests).
    pub fn owners(&self) -> usize {
        self.owners_handle().owners()
    }

    /// A handle other threads can ask for the owner count while the server runs.
    pub fn owners_handle(&self) -> OwnersHandle {
        OwnersHandle(Arc::clone(&self.shared))
    }

    /// Serves until `stop` is readable or the engine stops; `control` hands out the
    /// control port.
    pub fn run(&mut self, control: Option<&Listener>, stop: BorrowedFd<'_>) -> Result<(), ServeError> {
        self.inner.run(control.map(|listener| Door { listener, port: 1 }), stop)
    }
}
