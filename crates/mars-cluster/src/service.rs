//! The director as a service (`ictus mars director`) and the node's side of it: the
//! pure core ([`crate::Director`]) behind two TCP ports.
//!
//! - **Nodes' port**: a node keeps one connection open and says, one line each,
//!   after the director's `NONCE`, `HELLO <id> <host:port> <capacity bytes/s> <MAC>`
//!   (the MAC proves the cluster key: [`crate::wire`]; the director answers `WELCOME`,
//!   or `REFUSED <why>` and hangs up), then every beat interval
//!   `BEAT <connections> <clip>…` (the clips its stripe cache holds) and
//!   `OPEN <stream>…` (the director's streams whose player is connected to it now).
//!   The connection is
//!   the node's name: when the node dies, even by `kill -9`, its kernel closes the
//!   socket and the director reads end-of-file at once (the dead-name notification of a
//!   port, enforced by the kernel, not by the node); a node that hangs without dying is
//!   caught by the heartbeat timeout. A malformed line ends the connection (the node is
//!   lost); lines are at most [`MAX_LINE`] bytes.
//! - **Clients' port (HTTP)**: `GET /CLIP[?rate=R][&stream=S]` with an optional `Range`
//!   is answered `302 Found` to the node chosen by the core (cache, then load), at the
//!   byte the range starts (a resume), with the stream's id in `X-Ictus-Stream` and in
//!   the node's URL (`stream=S`, which the node reports back in `OPEN`); a
//!   client resuming after its node died asks again with `stream=S`: the director moved
//!   that stream when the node died, and sends the client to its new node. Refusals:
//!   `503` with the limit that refused (`Retry-After`), `404` for a clip the cluster does
//!   not hold, `400`/`416` for bad requests. `GET /_cluster` shows the state (text).
//!
//! Streams end when their player stops: a stream placed (or moved) more than
//! [`DirectorOptions::close_grace`] ago that its node's `OPEN` does not list is closed,
//! and its rate is free again. A node that never says `OPEN` (or a client that never
//! goes to its node) keeps the stream until its schedule passes the clip's end.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::wire::{self, DirectorLine, NodeLine};
use crate::{ClusterKey, Config, Director, NodeId, Refused, StreamId};

pub use crate::wire::MAX_LINE;
/// Longest HTTP request head.
const MAX_HEAD: usize = 16 << 10;
/// A client's whole request head must arrive within this (a slowloris client that
/// sends a byte now and then is cut off here, not at each read), else 408.
const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// Most connections of each port served at once (one thread each); past it a client is
/// answered 503 by the refuser and a node connection is closed, so many idle or slow
/// peers cost bounded threads and memory.
pub const MAX_CONNECTIONS: usize = 1024;
/// After its answer, how long a client's connection is drained (its request's rest,
/// until it hangs up) before it is closed, and how many bytes at most: a socket closed
/// with bytes unread is reset, and the reset can reach the client before it has read the
/// answer. A client that neither sends nor hangs up is closed at this bound.
const LINGER: Duration = Duration::from_secs(2);
/// Bytes drained after an answer, at most (the head's bound and a body's worth).
const LINGER_BYTES: usize = MAX_HEAD + (64 << 10);
/// Clients over the bound being refused at once (by one thread, `refuser`); past
/// these, one is answered and closed at once, unread (it may see a reset).
const REFUSING: usize = 256;

/// What the director needs of the store: a clip's length, or none if not there.
pub trait Catalog: Send + Sync + 'static {
    /// Bytes of clip `name`, or `None` if the store has no such clip.
    fn len(&self, name: &str) -> Option<u64>;
}

/// How the director runs.
#[derive(Clone, Debug)]
pub struct DirectorOptions {
    /// The core's tunables.
    pub config: Config,
    /// Bytes/s assumed for a stream that names no `rate` (admission's unit).
    pub default_rate: u64,
    /// How often the core is ticked (silent nodes, finished streams).
    pub tick: Duration,
    /// How long after a stream is placed or moved its client has to reach its node
    /// before the node's `OPEN` not listing it closes it.
    pub close_grace: Duration,
    /// The cluster key: only a node that proves it holds it registers
    /// ([`crate::wire`]'s challenge–response).
    pub key: ClusterKey,
}

struct NodeInfo {
    http: String,
    connections: u64,
}

struct State {
    core: Director,
    nodes: HashMap<NodeId, NodeInfo>,
    /// Each stream's clip name and length (to end it when its schedule passes the
    /// end), and when it was placed or last moved (ns).
    streams: HashMap<StreamId, (String, u64, u64)>,
    /// Each node connection's generation: a stale connection's end does not kill a
    /// node that registered again.
    conn_gen: HashMap<NodeId, u64>,
    next_gen: u64,
    moved: u64,
    dropped: u64,
    closed: u64,
    placements: u64,
    placement_ns: u64,
    /// Node connections refused before registering (no HELLO first, or one whose MAC
    /// was missing or wrong: another key, a forgery, a replay).
    auth_refused: u64,
}

struct Shared {
    state: Mutex<State>,
    epoch: Instant,
    catalog: Box<dyn Catalog>,
    opts: DirectorOptions,
    stop: AtomicBool,
    /// Connections being served: clients', nodes'.
    serving: [AtomicUsize; 2],
    /// Most of each.
    max_connections: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// A running director: its two ports and threads; stopped on drop.
pub struct RunningDirector {
    shared: Arc<Shared>,
    /// Where clients ask.
    pub http: SocketAddr,
    /// Where nodes register.
    pub nodes: SocketAddr,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// A snapshot for tests, benchmarks and `/_cluster`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Live nodes: id, HTTP address, load (bytes/s placed), capacity, streams.
    pub nodes: Vec<(u32, String, u64, u64, usize)>,
    /// Streams placed.
    pub streams: usize,
    /// Streams moved by failovers.
    pub moved: u64,
    /// Streams dropped by failovers (no room).
    pub dropped: u64,
    /// Streams closed because their node reported their player gone.
    pub closed: u64,
    /// Placements made, and the time they took in the core (ns, summed).
    pub placements: (u64, u64),
    /// Node connections refused before registering (a missing or wrong MAC).
    pub auth_refused: u64,
}

impl std::fmt::Debug for RunningDirector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningDirector").field("http", &self.http).field("nodes", &self.nodes).finish()
    }
}

impl RunningDirector {
    /// Starts a director: clients on `http`, nodes on `nodes`.
    pub fn start(
        http: TcpListener,
        nodes: TcpListener,
        catalog: Box<dyn Catalog>,
        opts: DirectorOptions,
    ) -> std::io::Result<RunningDirector> {
        Self::start_bounded(http, nodes, catalog, opts, MAX_CONNECTIONS)
    }

    /// [`RunningDirector::start`] serving at most `max_connections` of each port at once.
    fn start_bounded(
        http: TcpListener,
        nodes: TcpListener,
        catalog: Box<dyn Catalog>,
        opts: DirectorOptions,
        max_connections: usize,
    ) -> std::io::Result<RunningDirector> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                core: Director::new(opts.config),
                nodes: HashMap::new(),
                streams: HashMap::new(),
                conn_gen: HashMap::new(),
                next_gen: 0,
                moved: 0,
                dropped: 0,
                closed: 0,
                placements: 0,
                placement_ns: 0,
                auth_refused: 0,
            }),
            epoch: Instant::now(),
            catalog,
            opts,
            stop: AtomicBool::new(false),
            serving: [AtomicUsize::new(0), AtomicUsize::new(0)],
            max_connections,
        });
        let (http_addr, nodes_addr) = (http.local_addr()?, nodes.local_addr()?);
        let mut threads = Vec::new();
        let (refuse_tx, refuse_rx) = std::sync::mpsc::sync_channel(REFUSING);
        let sh = Arc::clone(&shared);
        threads
            .push(std::thread::Builder::new().name("director-refuse".into()).spawn(move || refuser(&sh, &refuse_rx))?);
        let sh = Arc::clone(&shared);
        threads.push(std::thread::Builder::new().name("director-http".into()).spawn(move || {
            accept_loop(&sh, &http, Port::Clients, Some(&refuse_tx), |sh, mut s| {
                let _ = serve_client(sh, &mut s);
                linger_close(s);
            })
        })?);
        let sh = Arc::clone(&shared);
        threads.push(
            std::thread::Builder::new()
                .name("director-nodes".into())
                .spawn(move || accept_loop(&sh, &nodes, Port::Nodes, None, serve_node))?,
        );
        let sh = Arc::clone(&shared);
        threads.push(std::thread::Builder::new().name("director-tick".into()).spawn(move || {
            while !sh.stop.load(Ordering::Acquire) {
                std::thread::sleep(sh.opts.tick);
                tick(&sh);
            }
        })?);
        Ok(RunningDirector { shared, http: http_addr, nodes: nodes_addr, threads })
    }

    /// The state now.
    pub fn snapshot(&self) -> Snapshot {
        snapshot(&self.shared.lock())
    }

    /// Stops the threads (connections in progress finish on their own threads).
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the accept loops.
        let _ = TcpStream::connect_timeout(&self.http, Duration::from_secs(1));
        let _ = TcpStream::connect_timeout(&self.nodes, Duration::from_secs(1));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for RunningDirector {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn snapshot(st: &State) -> Snapshot {
    Snapshot {
        nodes: st
            .core
            .nodes()
            .iter()
            .map(|(id, n)| {
                let http = st.nodes.get(id).map_or(String::new(), |i| i.http.clone());
                (id.0, http, n.load, n.capacity, n.streams.len())
            })
            .collect(),
        streams: st.core.stream_count(),
        moved: st.moved,
        dropped: st.dropped,
        closed: st.closed,
        placements: (st.placements, st.placement_ns),
        auth_refused: st.auth_refused,
    }
}

/// The director's two ports.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Port {
    Clients = 0,
    Nodes = 1,
}

/// One connection counted in [`Shared::serving`] while it lives.
struct Serving(Arc<Shared>, Port);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.serving[self.1 as usize].fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accepts `port`'s connections, each served by `f` on a thread of its own up to the
/// bound; past it a client goes to the refuser (`refuse`), a node is closed.
fn accept_loop(
    sh: &Arc<Shared>,
    l: &TcpListener,
    port: Port,
    refuse: Option<&std::sync::mpsc::SyncSender<TcpStream>>,
    f: fn(&Arc<Shared>, TcpStream),
) {
    for s in l.incoming() {
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(s) = s else {
            // EMFILE and the like: do not spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if sh.serving[port as usize].fetch_add(1, Ordering::AcqRel) >= sh.max_connections {
            sh.serving[port as usize].fetch_sub(1, Ordering::AcqRel);
            let _ = s.set_nonblocking(true);
            if let Some(tx) = refuse {
                // The refuser reads the request before it answers; if it has all it
                // can take, answer at once (a few hundred bytes into an empty socket
                // buffer: this does not block) and close.
                if let Err(std::sync::mpsc::TrySendError::Full(mut s)) = tx.try_send(s) {
                    let _ = respond(&mut s, "503 Service Unavailable", "Retry-After: 1\r\n", "busy\n", false);
                }
            }
            continue;
        }
        let guard = Serving(Arc::clone(sh), port);
        let _ = std::thread::Builder::new().name("director-conn".into()).spawn(move || {
            f(&guard.0, s);
            drop(guard);
        });
    }
}

/// After the answer: says the director is done writing (FIN), then reads and drops
/// what the client still sends until it hangs up, at most [`LINGER`] and
/// [`LINGER_BYTES`], and closes. Without it, bytes the director did not read (a
/// request's rest after an early answer, a body) make the close a reset, which can
/// destroy the answer before the client reads it.
fn linger_close(s: TcpStream) {
    let _ = s.shutdown(Shutdown::Write);
    let until = Instant::now() + LINGER;
    let mut left = LINGER_BYTES;
    let mut b = [0u8; 4096];
    while left > 0 {
        let wait = until.saturating_duration_since(Instant::now());
        if wait.is_zero() || s.set_read_timeout(Some(wait)).is_err() {
            break;
        }
        match (&s).read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// One client being refused past the bound.
struct Refusing {
    s: TcpStream,
    /// Closed at this time, whatever it does.
    until: Instant,
    /// Bytes read.
    read: usize,
    /// The last bytes read (to see the head's end across reads).
    tail: [u8; 3],
    /// 503 said (then FIN; the rest is drained).
    answered: bool,
}

/// The clients over the bound, all on this one thread: each is read (nonblocking, by
/// `poll`) until its head's end, then answered 503 and drained as [`linger_close`]
/// does, within [`LINGER`] and [`LINGER_BYTES`] — so a client that sent its request
/// sees the 503, not a reset, and a hostile one holds neither the acceptor nor more
/// than its place here.
fn refuser(sh: &Shared, rx: &std::sync::mpsc::Receiver<TcpStream>) {
    use rustix::event::{PollFd, PollFlags};
    use std::sync::mpsc::RecvTimeoutError;
    let mut cs: Vec<Refusing> = Vec::new();
    let add = |cs: &mut Vec<Refusing>, s| {
        cs.push(Refusing { s, until: Instant::now() + LINGER, read: 0, tail: [0; 3], answered: false });
    };
    loop {
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        if cs.is_empty() {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(s) => add(&mut cs, s),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        while let Ok(s) = rx.try_recv() {
            add(&mut cs, s);
        }
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = cs.iter().map(|c| PollFd::new(&c.s, PollFlags::IN)).collect();
            let t = rustix::event::Timespec { tv_sec: 0, tv_nsec: 20_000_000 };
            let _ = rustix::event::poll(&mut fds, Some(&t));
            fds.iter().map(|f| !f.revents().is_empty()).collect()
        };
        let now = Instant::now();
        let mut i = 0;
        cs.retain_mut(|c| {
            let r = ready[i];
            i += 1;
            refusing_step(c, r, now)
        });
    }
}

/// One round for one refused client; whether to keep it.
fn refusing_step(c: &mut Refusing, ready: bool, now: Instant) -> bool {
    let mut ended = false;
    let mut head_end = false;
    if ready {
        let mut b = [0u8; 4096];
        loop {
            match (&c.s).read(&mut b) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(n) => {
                    c.read += n;
                    if !c.answered {
                        let mut w = c.tail.to_vec();
                        w.extend_from_slice(&b[..n]);
                        head_end |= w.windows(4).any(|x| x == b"\r\n\r\n");
                        let k = w.len();
                        c.tail.copy_from_slice(&w[k - 3..]);
                    }
                    if c.read >= LINGER_BYTES {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
    }
    let late = now >= c.until;
    if !c.answered && (head_end || ended || late || c.read >= MAX_HEAD) {
        // A few hundred bytes into an empty socket buffer: this does not block.
        let _ = respond(&mut c.s, "503 Service Unavailable", "Retry-After: 1\r\n", "busy\n", false);
        let _ = c.s.shutdown(Shutdown::Write);
        c.answered = true;
    }
    !(ended || late || c.read >= LINGER_BYTES)
}

fn tick(sh: &Shared) {
    let now = sh.now();
    let mut st = sh.lock();
    let moved = st.core.tick(now);
    account_moves(&mut st, &moved, now);
    // Streams whose schedule passed the clip's end are over.
    let done: Vec<StreamId> = st
        .streams
        .iter()
        .filter(|(id, (_, len, _))| st.core.stream(**id, now).map_or(true, |(_, pos)| pos >= *len))
        .map(|(id, _)| *id)
        .collect();
    for id in done {
        st.core.close(id);
        st.streams.remove(&id);
    }
}

fn account_moves(st: &mut State, moved: &[crate::Moved], now: u64) {
    for m in moved {
        match &m.to {
            Ok(_) => {
                st.moved += 1;
                // Its client has the grace again to reach the new node.
                if let Some(s) = st.streams.get_mut(&m.stream) {
                    s.2 = now;
                }
            }
            Err(_) => {
                st.dropped += 1;
                st.streams.remove(&m.stream);
            }
        }
    }
    let live: Vec<NodeId> = st.core.nodes().keys().copied().collect();
    st.nodes.retain(|id, _| live.contains(id));
}

/// One node's connection: NONCE, a HELLO whose MAC proves the key, then BEATs until it
/// ends.
fn serve_node(sh: &Arc<Shared>, mut s: TcpStream) {
    let timeout = Duration::from_nanos(sh.opts.config.heartbeat_timeout_ns).max(Duration::from_millis(100));
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    // A fresh nonce per connection: a HELLO signed for another is a replay.
    let Ok(nonce) = crate::key::nonce() else { return };
    if s.write_all(wire::director_line(&DirectorLine::Nonce(nonce)).as_bytes()).is_err() {
        return;
    }
    let mut r = BufReader::new(match s.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut node: Option<(NodeId, u64)> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        // A read error (the heartbeat timeout, a reset) ends the node as end-of-file does.
        let n: usize = (&mut r).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line).unwrap_or_default();
        if n == 0 || line.len() > MAX_LINE || !line.ends_with(b"\n") || sh.stop.load(Ordering::Acquire) {
            break;
        }
        // A malformed line ends the node's connection (wire::parse says what was wrong).
        let parsed = wire::parse(&line[..line.len() - 1]);
        if node.is_none() {
            // Nothing before a HELLO whose MAC is right for this connection's nonce.
            let why = match &parsed {
                Ok(h @ NodeLine::Hello { .. }) if wire::verify_hello(&sh.opts.key, &nonce, h) => None,
                Ok(NodeLine::Hello { .. }) => Some("wrong MAC (not this cluster's key, or not this nonce)".to_string()),
                Ok(_) => Some("HELLO first".to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = why {
                sh.lock().auth_refused += 1;
                let _ = s.write_all(wire::director_line(&DirectorLine::Refused(why)).as_bytes());
                break;
            }
        }
        let Ok(parsed) = parsed else { break };
        match (parsed, node) {
            (NodeLine::Hello { id, http, capacity, .. }, None) => {
                let now = sh.now();
                let mut st = sh.lock();
                st.next_gen += 1;
                let gen = st.next_gen;
                st.conn_gen.insert(NodeId(id), gen);
                // A node registering again (after a restart) starts empty.
                if st.core.nodes().contains_key(&NodeId(id)) {
                    let moved = st.core.node_lost(NodeId(id), now);
                    account_moves(&mut st, &moved, now);
                }
                st.core.register(NodeId(id), capacity, Vec::<String>::new(), now);
                st.nodes.insert(NodeId(id), NodeInfo { http: http.to_string(), connections: 0 });
                node = Some((NodeId(id), gen));
                drop(st);
                if s.write_all(wire::director_line(&DirectorLine::Welcome).as_bytes()).is_err() {
                    break;
                }
            }
            (NodeLine::Beat { connections, clips }, Some((id, gen))) => {
                let clips: Vec<String> = clips.into_iter().map(str::to_string).collect();
                let now = sh.now();
                let mut st = sh.lock();
                if st.conn_gen.get(&id) != Some(&gen) || !st.core.heartbeat(id, clips, now) {
                    // Declared dead meanwhile (silent too long): it must register again.
                    break;
                }
                if let Some(i) = st.nodes.get_mut(&id) {
                    i.connections = connections;
                }
            }
            (NodeLine::Open(open), Some((id, gen))) => {
                let now = sh.now();
                let grace = sh.opts.close_grace.as_nanos() as u64;
                let mut st = sh.lock();
                if st.conn_gen.get(&id) != Some(&gen) {
                    break;
                }
                close_gone(&mut st, id, &open, now, grace);
            }
            _ => break,
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    if let Some((id, gen)) = node {
        let now = sh.now();
        let mut st = sh.lock();
        if st.conn_gen.get(&id) == Some(&gen) {
            st.conn_gen.remove(&id);
            let moved = st.core.node_lost(id, now);
            account_moves(&mut st, &moved, now);
        }
    }
}

/// Closes the streams placed on `node` more than `grace` ns ago (or moved there) that
/// the node does not report `open`: their players stopped.
fn close_gone(st: &mut State, node: NodeId, open: &[StreamId], now: u64, grace: u64) {
    let Some(n) = st.core.nodes().get(&node) else { return };
    let gone: Vec<StreamId> = n
        .streams
        .iter()
        .copied()
        .filter(|s| !open.contains(s))
        .filter(|s| st.streams.get(s).map_or(true, |(_, _, since)| now.saturating_sub(*since) > grace))
        .collect();
    for s in gone {
        st.core.close(s);
        st.streams.remove(&s);
        st.closed += 1;
    }
}

/// The most of a stream a resume catches up at once (seconds of it).
const MAX_LEAD_S: u64 = 2;

use ictus_mars::http::query_param;

/// Answers and closes; a HEAD's answer has the head a GET's would, without the body
/// (RFC 9110 §9.3.2).
fn respond(s: &mut TcpStream, status: &str, headers: &str, body: &str, head_only: bool) -> std::io::Result<()> {
    let body_sent = if head_only { "" } else { body };
    write!(
        s,
        "HTTP/1.1 {status}\r\n{headers}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body_sent}",
        body.len()
    )
}

/// Refuses a request head the parser refused (its status; `Allow` with a 405; no body
/// to a HEAD), and closes.
fn refuse(s: &mut TcpStream, head: &[u8], status: u16) -> std::io::Result<()> {
    let plan = ictus_mars::http::refusal(head, status);
    s.write_all(&plan.head)?;
    for seg in &plan.body {
        if let ictus_mars::range::Segment::Bytes(b) = seg {
            s.write_all(b)?;
        }
    }
    Ok(())
}

/// One client request (then the connection closes).
fn serve_client(sh: &Arc<Shared>, s: &mut TcpStream) -> std::io::Result<()> {
    let deadline = Instant::now() + HEAD_DEADLINE;
    s.set_write_timeout(Some(HEAD_DEADLINE))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let req = loop {
        match ictus_mars::http::parse(&buf) {
            ictus_mars::http::Parsed::Request(r, _) => break r,
            ictus_mars::http::Parsed::Refuse(code) => return refuse(s, &buf, code),
            ictus_mars::http::Parsed::Partial => {}
        }
        if buf.len() > MAX_HEAD {
            return refuse(s, &buf, 431);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return refuse(s, &buf, 408);
        }
        s.set_read_timeout(Some(left))?;
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return refuse(s, &buf, 408)
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head_only = req.method == ictus_mars::http::Method::Head;
    let respond =
        |s: &mut TcpStream, status: &str, headers: &str, body: &str| respond(s, status, headers, body, head_only);
    let q = req.query.as_deref();
    if req.path == "_cluster" {
        let snap = snapshot(&sh.lock());
        let mut body = format!(
            "streams {} moved {} dropped {} closed {} placements {} placement_ns {} nodes_refused {}\n",
            snap.streams,
            snap.moved,
            snap.dropped,
            snap.closed,
            snap.placements.0,
            snap.placements.1,
            snap.auth_refused
        );
        for (id, http, load, cap, n) in &snap.nodes {
            body.push_str(&format!("node {id} {http} load {load} capacity {cap} streams {n}\n"));
        }
        return respond(s, "200 OK", "", &body);
    }
    let name = req.path.as_str();
    if !ictus_mars::label::valid_name(name) {
        return respond(s, "404 Not Found", "", "no such clip\n");
    }
    let rate = match query_param(q, "rate") {
        None => sh.opts.default_rate,
        Some(v) => match v.parse::<u64>() {
            Ok(r) if r > 0 && r <= 1 << 40 => r,
            _ => return respond(s, "400 Bad Request", "", "rate: bytes/s, 1 to 2^40\n"),
        },
    };
    let stream = match query_param(q, "stream") {
        None => None,
        Some(v) => match v.parse::<u64>() {
            Ok(id) => Some(StreamId(id)),
            Err(_) => return respond(s, "400 Bad Request", "", "stream: a stream id\n"),
        },
    };
    let Some(len) = sh.catalog.len(name) else { return respond(s, "404 Not Found", "", "no such clip\n") };
    let offset = match ictus_mars::range::resolve(req.range.as_deref(), len) {
        ictus_mars::range::Ranges::Whole => 0,
        ictus_mars::range::Ranges::Partial(r) => r.first().map_or(0, |r| r.start),
        ictus_mars::range::Ranges::Unsatisfiable => {
            return respond(s, "416 Range Not Satisfiable", &format!("Content-Range: bytes */{len}\r\n"), "")
        }
    };
    let now = sh.now();
    let mut st = sh.lock();
    // A stream the director knows (a resume): its node now, moved there by a failover.
    if let Some(id) = stream {
        if let Some((node, position)) = st.core.stream(id, now) {
            if st.streams.get(&id).is_some_and(|(clip, _, _)| clip == name) {
                if let Some(info) = st.nodes.get(&node) {
                    // The player is behind its schedule by what it did not get while
                    // cut off: the node sends that much at once (at most
                    // `MAX_LEAD_S` of stream), then paces.
                    let lead = position.saturating_sub(offset).min(rate.saturating_mul(MAX_LEAD_S));
                    let mut loc = location(&info.http, name, q, id);
                    if lead > 0 && query_param(q, "rate").is_some() {
                        loc.push_str(&format!("&lead={lead}"));
                    }
                    // The client is on its way to the node: the grace starts again.
                    if let Some(s) = st.streams.get_mut(&id) {
                        s.2 = now;
                    }
                    drop(st);
                    return respond(
                        s,
                        "302 Found",
                        &format!("Location: {loc}\r\nX-Ictus-Stream: {}\r\nX-Ictus-Node: {}\r\n", id.0, node.0),
                        "",
                    );
                }
            }
        }
    }
    let t0 = Instant::now();
    let placed = st.core.place(name, len, rate, offset.min(len), now);
    st.placement_ns += t0.elapsed().as_nanos() as u64;
    st.placements += 1;
    match placed {
        Ok(p) => {
            st.streams.insert(p.stream, (name.to_string(), len, now));
            if let Some(old) = stream {
                // The client's old stream (if still placed) is this one now.
                if st.streams.remove(&old).is_some() {
                    st.core.close(old);
                }
            }
            let http = st.nodes.get(&p.node).map(|i| i.http.clone()).unwrap_or_default();
            drop(st);
            let loc = location(&http, name, q, p.stream);
            respond(
                s,
                "302 Found",
                &format!("Location: {loc}\r\nX-Ictus-Stream: {}\r\nX-Ictus-Node: {}\r\n", p.stream.0, p.node.0),
                "",
            )
        }
        Err(e) => {
            drop(st);
            let status = match e {
                Refused::Bad(_) => "400 Bad Request",
                _ => "503 Service Unavailable",
            };
            respond(s, status, "Retry-After: 1\r\n", &format!("{e}\n"))
        }
    }
}

/// The node's URL for the clip: the client's `rate` kept (it paces the stream there),
/// and the stream's id (the node reports it back while the player is connected).
fn location(http: &str, name: &str, q: Option<&str>, stream: StreamId) -> String {
    match query_param(q, "rate") {
        Some(r) => format!("http://{http}/{name}?rate={r}&stream={}", stream.0),
        None => format!("http://{http}/{name}?stream={}", stream.0),
    }
}

/// What a node reports in each beat.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// HTTP connections open.
    pub connections: u64,
    /// Clips with stripes in its cache.
    pub clips: Vec<String>,
    /// The director's streams (`stream=S` of the requests) being sent now.
    pub open: Vec<u64>,
}

/// How a node registers: where the director is, who the node is, the key.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    /// The director's nodes' port.
    pub director: SocketAddr,
    /// This node's id.
    pub id: u32,
    /// Where the director sends players.
    pub http: SocketAddr,
    /// Bytes/s the director may place here.
    pub capacity: u64,
    /// The cluster key.
    pub key: ClusterKey,
}

/// Registers on `s`: reads the director's nonce, says the signed HELLO, reads the
/// answer. `Err` says why not (a refusal's reason, or what broke).
fn register(s: &mut TcpStream, me: &NodeIdentity) -> Result<(), String> {
    // The director's lines are input too: at most MAX_LINE each, within the timeout.
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?).take(MAX_LINE as u64);
    let mut read = |what: &str| -> Result<DirectorLine, String> {
        let mut line = Vec::new();
        r.set_limit(MAX_LINE as u64);
        r.read_until(b'\n', &mut line).map_err(|e| format!("{what}: {e}"))?;
        let Some(body) = line.strip_suffix(b"\n") else { return Err(format!("{what}: the director hung up")) };
        wire::parse_director(body).map_err(|e| format!("{what}: {e}"))
    };
    let DirectorLine::Nonce(nonce) = read("the nonce")? else { return Err("no nonce first".into()) };
    s.write_all(wire::hello(&me.key, &nonce, me.id, me.http, me.capacity).as_bytes()).map_err(|e| e.to_string())?;
    match read("the answer to HELLO")? {
        DirectorLine::Welcome => Ok(()),
        DirectorLine::Refused(why) => Err(format!("refused: {why}")),
        DirectorLine::Nonce(_) => Err("a second nonce".into()),
    }
}

/// The node's side: keeps a connection to the director, registers (NONCE, signed
/// HELLO, WELCOME), then every `every` a BEAT and an OPEN with what `report` says;
/// reconnects (and registers again, starting empty) if the connection breaks. A
/// refused registration is said on standard error (once until one succeeds) and tried
/// again every 2 s. Runs until `stop`.
pub fn node_agent(me: &NodeIdentity, every: Duration, report: impl Fn() -> Report, stop: &AtomicBool) {
    let mut said = false;
    while !stop.load(Ordering::Acquire) {
        let Ok(mut s) = TcpStream::connect_timeout(&me.director, Duration::from_secs(2)) else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let _ = s.set_nodelay(true);
        if let Err(why) = register(&mut s, me) {
            if !said {
                eprintln!(
                    "ictus mars node {}: registering with the director at {}: {why} (is --cluster-key the director's?); trying again",
                    me.id, me.director
                );
                said = true;
            }
            std::thread::sleep(Duration::from_secs(2));
            continue;
        }
        said = false;
        while !stop.load(Ordering::Acquire) {
            let r = report();
            let mut line = wire::beat(r.connections, &r.clips);
            line.extend(wire::open(&r.open));
            if s.write_all(line.as_bytes()).is_err() {
                break;
            }
            std::thread::sleep(every);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clips of fixed lengths (the director's view of a store; the Ceph catalog is
    /// exercised by `servers/mars-server/tests/cluster.rs`).
    struct Lengths;
    impl Catalog for Lengths {
        fn len(&self, name: &str) -> Option<u64> {
            (name == "a.ts").then_some(1 << 30)
        }
    }

    fn director() -> RunningDirector {
        director_bounded(MAX_CONNECTIONS)
    }

    fn director_bounded(max_connections: usize) -> RunningDirector {
        RunningDirector::start_bounded(
            TcpListener::bind("127.0.0.1:0").unwrap(),
            TcpListener::bind("127.0.0.1:0").unwrap(),
            Box::new(Lengths),
            DirectorOptions {
                config: Config { heartbeat_timeout_ns: 60_000_000_000, store_capacity: 1 << 40, cache_bound_pct: None },
                default_rate: 1000,
                tick: Duration::from_millis(20),
                close_grace: Duration::from_millis(300),
                key: key(),
            },
            max_connections,
        )
        .unwrap()
    }

    /// A HEAD is answered without a body, a refused method with `Allow`, a head that
    /// dribbles in forever with 408, and past the bound on connections a client is
    /// answered 503 at once while the connections held are idle; others are served as
    /// soon as those go.
    #[test]
    fn hostile_clients_get_correct_answers_and_bounded_threads() {
        let d = director_bounded(4);
        let r = ask(&d, "HEAD /b.ts HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404") && r.ends_with("\r\n\r\n"), "{r:?}");
        let declared: usize = r.lines().find_map(|l| l.strip_prefix("Content-Length: ")).unwrap().parse().unwrap();
        assert!(declared > 0, "the length a GET's body would have: {r:?}");
        let r = ask(&d, "HEAD /a.ts?rate=x HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400") && r.ends_with("\r\n\r\n"), "{r:?}");
        let r = ask(&d, "DELETE /a.ts HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405") && r.contains("\r\nAllow: GET, HEAD\r\n"), "{r:?}");
        // (Exactly what the director reads before it answers: nothing unread, no reset.)
        let line = format!("GET /{}", "a".repeat(ictus_mars::http::MAX_HEAD - 5));
        let r = ask(&d, &line);
        assert!(r.starts_with("HTTP/1.1 414"), "{r:?}");
        // Four idle connections take every thread allowed; a fifth client is told 503.
        wait("the answered gone", || d.shared.serving[Port::Clients as usize].load(Ordering::Acquire) == 0);
        let idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(d.http).unwrap()).collect();
        wait("four served", || d.shared.serving[Port::Clients as usize].load(Ordering::Acquire) == 4);
        // It sent its whole request (more than a socket's first read) and then reads: it
        // gets the 503, not a reset (the refuser reads the request before it answers,
        // and drains the rest before it closes).
        let big = format!("GET /a.ts HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "p".repeat(12 << 10));
        let r = ask(&d, &big);
        assert!(r.starts_with("HTTP/1.1 503") && r.contains("Retry-After"), "{r:?}");
        // A silent client over the bound holds its place in the refuser, not the
        // acceptor: a client after it is answered while it is still connected, and it
        // is answered 503 itself at the refuser's bound.
        let mut silent = TcpStream::connect(d.http).unwrap();
        let r = ask(&d, "GET /a.ts HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 503"), "{r:?}");
        let mut out = String::new();
        silent.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 503"), "{out:?}");
        // One of them dribbles its head a byte at a time: it gets 408 at the deadline,
        // not a fresh timeout per byte.
        let mut slow = idle.into_iter().next().unwrap();
        let dribble = std::thread::spawn(move || {
            let mut out = Vec::new();
            slow.set_read_timeout(Some(Duration::from_millis(250))).unwrap();
            // A byte each 250 ms, until an answer comes (a head longer than the
            // deadline allows, whatever the load); then the rest of the answer.
            for b in b"GET /a.ts HTTP/1.1\r\n".iter().chain(std::iter::repeat(&b'X')).take(4000) {
                if slow.write_all(&[*b]).is_err() || slow.read_to_end(&mut out).is_ok() || !out.is_empty() {
                    break;
                }
            }
            slow.set_read_timeout(None).unwrap();
            let _ = slow.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        });
        let r = dribble.join().unwrap();
        assert!(r.starts_with("HTTP/1.1 408"), "{r:?}");
        wait("the dribbler's thread gone", || d.shared.serving[Port::Clients as usize].load(Ordering::Acquire) <= 3);
        assert!(ask(&d, "GET /b.ts HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 404"));
        d.stop();
    }

    fn key() -> ClusterKey {
        ClusterKey::from_bytes(b"the test cluster's key, 32 bytes or more").unwrap()
    }

    /// A node connection: reads the director's nonce, says the HELLO signed with `key`;
    /// returns the connection and the HELLO said.
    fn hello(d: &RunningDirector, key: &ClusterKey, id: u32, http: &str) -> (TcpStream, String) {
        let mut n = TcpStream::connect(d.nodes).unwrap();
        let line = director_says(&mut n);
        let DirectorLine::Nonce(nonce) = wire::parse_director(line.trim_end().as_bytes()).unwrap() else {
            panic!("{line}")
        };
        let h = wire::hello(key, &nonce, id, http.parse().unwrap(), 1_000_000);
        n.write_all(h.as_bytes()).unwrap();
        (n, h)
    }

    /// A node that registers with the cluster's key (told WELCOME), then says `lines`.
    fn join(d: &RunningDirector, id: u32, http: &str, lines: &str) -> TcpStream {
        let (mut n, _) = hello(d, &key(), id, http);
        assert_eq!(director_says(&mut n), "WELCOME\n");
        n.write_all(lines.as_bytes()).unwrap();
        n
    }

    /// One line from the director (a byte at a time: nothing after it is taken).
    fn director_says(n: &mut TcpStream) -> String {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while !line.ends_with(b"\n") && n.read(&mut b).unwrap_or(0) == 1 {
            line.push(b[0]);
        }
        String::from_utf8(line).unwrap()
    }

    /// What the director says until it hangs up (a reset counts as hanging up).
    fn until_hang_up(n: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = n.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    fn ask(d: &RunningDirector, req: &str) -> String {
        let mut s = TcpStream::connect(d.http).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn wait(what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(60), "{what}: not within 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Early answers read (or drain) what the client sent before closing: a head longer
    /// than the director takes, and a request with a body, both written whole and then
    /// read, get their answer, not a reset.
    #[test]
    fn early_answers_are_read_not_reset() {
        let d = director();
        let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(40 << 10));
        let r = ask(&d, &long);
        assert!(r.starts_with("HTTP/1.1 414") || r.starts_with("HTTP/1.1 431"), "{r:?}");
        let body = format!("GET /b.ts HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\n\r\n{}", "b".repeat(30000));
        let r = ask(&d, &body);
        assert!(r.starts_with("HTTP/1.1 400"), "a body is not taken: {r:?}");
        let pad = format!("GET /a.ts?rate=0 HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "p".repeat(8000));
        let r = ask(&d, &pad);
        assert!(r.starts_with("HTTP/1.1 400"), "{r:?}");
        d.stop();
    }

    /// Only a node with the cluster's key registers. Without a MAC, with another key,
    /// or replaying a HELLO captured from another connection, the director says
    /// REFUSED and hangs up, counts it, and nothing is placed there; an impostor cannot
    /// take a registered node's id (its address stays the node's).
    #[test]
    fn only_nodes_with_the_key_register() {
        let d = director();
        let get = "GET /a.ts?rate=5000 HTTP/1.1\r\nHost: x\r\n\r\n";
        // No MAC (a HELLO of the protocol before keys).
        let mut n = TcpStream::connect(d.nodes).unwrap();
        assert!(director_says(&mut n).starts_with("NONCE "));
        n.write_all(b"HELLO 5 127.0.0.1:50 1000000\nBEAT 0 a.ts\n").unwrap();
        assert!(until_hang_up(&mut n).starts_with("REFUSED a HELLO without a MAC"));
        // Another key.
        let other = ClusterKey::from_bytes(b"not the test cluster's key, 32 bytes or more").unwrap();
        let (mut n, _) = hello(&d, &other, 6, "127.0.0.1:60");
        assert!(until_hang_up(&mut n).starts_with("REFUSED wrong MAC"));
        // A line other than HELLO first.
        let mut n = TcpStream::connect(d.nodes).unwrap();
        assert!(director_says(&mut n).starts_with("NONCE "));
        n.write_all(b"BEAT 0 a.ts\n").unwrap();
        assert!(until_hang_up(&mut n).starts_with("REFUSED HELLO first"));
        let s = d.snapshot();
        assert!(s.nodes.is_empty() && s.auth_refused == 3, "{s:?}");
        assert!(ask(&d, get).starts_with("HTTP/1.1 503"), "nothing placed on a refused node");
        // Node 1 registers with the key; its HELLO is captured.
        let (mut n1, captured) = hello(&d, &key(), 1, "127.0.0.1:9");
        assert_eq!(director_says(&mut n1), "WELCOME\n");
        n1.write_all(b"BEAT 0 a.ts\n").unwrap();
        wait("node 1 registered", || d.snapshot().nodes.len() == 1);
        // The captured HELLO, replayed on a new connection (a new nonce): refused.
        let mut r = TcpStream::connect(d.nodes).unwrap();
        assert!(director_says(&mut r).starts_with("NONCE "));
        r.write_all(captured.as_bytes()).unwrap();
        assert!(until_hang_up(&mut r).starts_with("REFUSED wrong MAC"));
        // An impostor claims id 1 at its own address: refused.
        let (mut imp, _) = hello(&d, &other, 1, "127.0.0.1:666");
        assert!(until_hang_up(&mut imp).starts_with("REFUSED wrong MAC"));
        let s = d.snapshot();
        assert_eq!(s.auth_refused, 5, "{s:?}");
        assert_eq!((s.nodes.len(), s.nodes[0].0, s.nodes[0].1.as_str()), (1, 1, "127.0.0.1:9"), "{s:?}");
        // Node 1's connection is still the node's: it beats on, streams go to it.
        n1.write_all(b"BEAT 0 a.ts\n").unwrap();
        let r = ask(&d, get);
        assert!(r.contains("Location: http://127.0.0.1:9/a.ts?rate=5000&stream="), "{r}");
        assert!(ask(&d, "GET /_cluster HTTP/1.1\r\nHost: x\r\n\r\n").contains("nodes_refused 5"));
        drop(n1);
        d.stop();
    }

    #[test]
    fn nodes_register_are_lost_on_hang_up_and_bad_lines_and_clients_are_redirected() {
        let d = director();
        let get = "GET /a.ts HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(ask(&d, get).starts_with("HTTP/1.1 503"), "no nodes yet");
        assert!(ask(&d, "GET /b.ts HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(ask(&d, "GET /a.ts?rate=x HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(ask(&d, "BREW /a.ts HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 405"));
        // Node 1 registers, beats; a client is sent to it at the byte its range asks.
        let n1 = join(&d, 1, "127.0.0.1:9", "BEAT 0 a.ts\n");
        wait("node 1 registered", || d.snapshot().nodes.len() == 1);
        let r = ask(&d, "GET /a.ts?rate=5000 HTTP/1.1\r\nHost: x\r\nRange: bytes=100-\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 302"), "{r}");
        assert!(r.contains("Location: http://127.0.0.1:9/a.ts?rate=5000&stream=1\r\n"), "{r}");
        assert!(r.contains("X-Ictus-Node: 1\r\n"), "{r}");
        assert_eq!(d.snapshot().streams, 1);
        // Node 2 sends a line that is not the protocol: it is lost, nothing placed on it.
        let mut n2 = join(&d, 2, "127.0.0.1:10", "BEAT lots\n");
        assert_eq!(until_hang_up(&mut n2), "", "the director hangs up on a bad line");
        wait("node 2 gone", || d.snapshot().nodes.len() == 1);
        // An over-long number, a non-address and an over-long line are refused the same
        // way, before registering: counted with the wrong MACs.
        let mac = "00".repeat(32);
        for bad in [format!("HELLO 3 127.0.0.1:11 {} {mac}\n", "9".repeat(30)), format!("HELLO 3 nowhere 5 {mac}\n")] {
            let mut n = TcpStream::connect(d.nodes).unwrap();
            assert!(director_says(&mut n).starts_with("NONCE "));
            n.write_all(bad.as_bytes()).unwrap();
            let r = until_hang_up(&mut n);
            assert!(r.starts_with("REFUSED a malformed HELLO"), "{bad:?}: {r:?}");
        }
        let mut n4 = TcpStream::connect(d.nodes).unwrap();
        let _ = n4.write_all(&vec![b'x'; MAX_LINE + 10]);
        assert!(!until_hang_up(&mut n4).contains("WELCOME"), "an over-long line is refused");
        assert_eq!(d.snapshot().auth_refused, 2);
        // Node 1 hangs up (as its kernel does when it is killed): its stream has nowhere
        // to go and is dropped; the next client is refused.
        drop(n1);
        wait("node 1 lost", || d.snapshot().nodes.is_empty());
        let s = d.snapshot();
        assert_eq!((s.streams, s.dropped), (0, 1), "{s:?}");
        assert!(ask(&d, get).starts_with("HTTP/1.1 503"));
        d.stop();
    }

    /// The stream id of a redirect.
    fn stream_of(r: &str) -> u64 {
        r.lines().find_map(|l| l.strip_prefix("X-Ictus-Stream: ")).and_then(|v| v.trim().parse().ok()).expect(r)
    }

    /// The `lead=` of a redirect's Location, if any.
    fn lead_of(r: &str) -> Option<u64> {
        let loc = r.lines().find_map(|l| l.strip_prefix("Location: "))?;
        loc.split(['?', '&']).find_map(|kv| kv.strip_prefix("lead=")).and_then(|v| v.trim().parse().ok())
    }

    #[test]
    fn a_resume_behind_its_schedule_is_told_to_catch_up_at_most_max_lead() {
        let d = director();
        let n1 = join(&d, 1, "127.0.0.1:9", "BEAT 0\n");
        wait("node 1 registered", || d.snapshot().nodes.len() == 1);
        let r = ask(&d, "GET /a.ts?rate=5000 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(lead_of(&r), None, "a new stream has no lead: {r}");
        let id = stream_of(&r);
        std::thread::sleep(Duration::from_millis(50));
        // Its player was cut off at byte 0: it is behind the schedule (5000 B/s since
        // it was placed), by at most MAX_LEAD_S of stream after any wait.
        let r = ask(&d, &format!("GET /a.ts?rate=5000&stream={id} HTTP/1.1\r\nHost: x\r\nRange: bytes=0-\r\n\r\n"));
        assert_eq!(stream_of(&r), id, "{r}");
        let lead = lead_of(&r).expect("a lead");
        assert!(lead > 0 && lead <= 5000 * MAX_LEAD_S, "{lead}");
        // A player ahead of the schedule (it buffered) catches up nothing.
        let r =
            ask(&d, &format!("GET /a.ts?rate=5000&stream={id} HTTP/1.1\r\nHost: x\r\nRange: bytes=900000000-\r\n\r\n"));
        assert_eq!(lead_of(&r), None, "{r}");
        drop(n1);
        d.stop();
    }

    #[test]
    fn streams_the_node_no_longer_reports_open_are_closed() {
        let d = director();
        let mut n1 = join(&d, 1, "127.0.0.1:9", "BEAT 0\nOPEN\n");
        wait("node 1 registered", || d.snapshot().nodes.len() == 1);
        let get = "GET /a.ts?rate=5000 HTTP/1.1\r\nHost: x\r\n\r\n";
        let (a, b) = (ask(&d, get), ask(&d, get));
        let (a, b) = (stream_of(&a), stream_of(&b));
        assert_eq!(d.snapshot().nodes[0].2, 10_000, "two streams of 5000 B/s placed");
        // The node reports both open, for longer than the grace: both stay.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(900) {
            n1.write_all(format!("BEAT 2 a.ts\nOPEN {a} {b}\n").as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
        let s = d.snapshot();
        assert_eq!((s.streams, s.closed), (2, 0), "{s:?}");
        // Player a stops: once the node no longer lists it, it is closed, its rate free.
        wait("stream a closed", || {
            n1.write_all(format!("BEAT 1 a.ts\nOPEN {b}\n").as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            d.snapshot().closed == 1
        });
        let s = d.snapshot();
        assert_eq!((s.streams, s.nodes[0].2), (1, 5000), "{s:?}");
        // Asking for stream a again places it anew; b, still open, is not touched.
        let r = ask(&d, &format!("GET /a.ts?rate=5000&stream={a} HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert_ne!(stream_of(&r), a, "a closed stream is not resumed under its old id");
        // An OPEN that is not a list of ids ends the node's connection like any bad line.
        n1.write_all(b"OPEN 1 x\n").unwrap();
        assert_eq!(until_hang_up(&mut n1), "", "the director hangs up on a bad OPEN");
        wait("node 1 lost", || d.snapshot().nodes.is_empty());
        d.stop();
    }
}
