//! The engine: one thread, one io_uring, every disk read and socket send of the server.
//!
//! - **Reads** of a stream range become device reads through the stripe map
//!   ([`Storage::plan`]); each is queued in its device's **Deficit Round Robin**
//!   scheduler ([`ictus_mars::drr`]) under the class of the stream (real-time for paced
//!   streams and the streams API, non-real-time for downloads, or a weighted class), and
//!   at most `device_depth` reads per device are in the kernel at once — the paper's
//!   adapter queue, short so that the order DRR chose is the order the device sees.
//!   Reads land in registered buffers ([`crate::mmbuf`]) with `IORING_OP_READ_FIXED`
//!   (`O_DIRECT` where the storage allows).
//! - **Sends** of those same buffers go out with `IORING_OP_SEND_ZC` from the fixed
//!   buffer (zero-copy where the kernel can; a buffer is reused only after the kernel's
//!   notification), or `IORING_OP_SEND` where zero-copy send is refused.
//! - **Downloads** (HTTP requests without `?rate=`) go through the page cache with
//!   zero copies where the storage offers cached descriptors ([`Storage::cached`]): each
//!   piece is queued in the device's DRR scheduler in the non-real-time class like any
//!   read; when DRR dispatches it, it goes with the pieces queued behind it as one job
//!   to the download thread (`crate::sender`: `splice(2)` file → pipe → non-blocking
//!   socket, `epoll`; two jobs of a connection in flight, the second started by the
//!   thread when the first ends whole), or, with [`EngineConfig::sendfile`] off, as one
//!   chain of linked `IORING_OP_SPLICE` file → pipe → socket in io_uring's workers;
//!   either way the kernel passes page references from the page cache to the socket
//!   as `sendfile` does. A bounded number of lanes ([`EngineConfig::splice_pipes`]) bounds the
//!   downloads spliced at once; a download that finds none, and every paced stream,
//!   takes the registered-buffer path above.
//! - **HTTP** connections are read with a poll and non-blocking `recv` into one scratch
//!   buffer, so an idle or slow connection holds no buffer at all; request heads are
//!   bounded ([`ictus_mars::http::MAX_HEAD`]); heads that take too long, idle keep-alive
//!   connections and sends that make no progress are closed by a once-a-second tick.
//! - **Streams** (the streams API, and HTTP requests with `?rate=`) send one chunk per
//!   slot; slots are released by Real-Time Upcalls, one per tick period in use
//!   ([`tick_level`]: a ladder of periods a factor √2 apart), each of which wakes every
//!   stream whose own period its period is the longest not above: its job only posts
//!   [`Command::Tick`] and wakes the engine through an eventfd, so all streams due
//!   together are sent in one submission. The number of paced streams is thus bounded
//!   by admission (capability, buffers), not by the runtime's upcall limit.
//!
//! Nothing here blocks: every kernel operation is a submission, and the loop waits in
//! `io_uring_enter` for any completion.

use std::collections::VecDeque;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use ictus_mars::admission::Admission;
use ictus_mars::drr::{ClassId, Drr, Request, SECTOR};
use ictus_mars::http::{self, Parsed, Plan};
use ictus_mars::pace::Pacer;
use ictus_mars::range::Segment;
use ictus_mars::readahead::{LatencyWindow, ReadAhead};
use ictus_rt::{runtime::RuntimeHandle, UpcallId, UpcallSpec};

use crate::mmbuf::{BufPool, BufState, Owner};
use crate::sender::{Done, Job, Outcome, Piece, Sender};
use crate::volume::{Storage, StreamInfo};

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Registered buffers in the pool.
    pub buffers: usize,
    /// Bytes per buffer (one chunk of a stream).
    pub buf_size: usize,
    /// Buffers of the pool on transparent huge pages (`None`: half of them), taken first
    /// by downloads; paced streams take the others first ([`BufPool::alloc`] says why).
    pub huge_buffers: Option<usize>,
    /// Device reads in the kernel at once, per device.
    pub device_depth: usize,
    /// Chunks read ahead per download.
    pub window: usize,
    /// How far paced streams read ahead: from the devices' measured latency, with a
    /// floor ([`ReadAhead`]).
    pub readahead: ReadAhead,
    /// Buffers kept for real-time streams beyond their read-ahead floors: downloads do
    /// not take the last ones.
    pub rt_buffers: usize,
    /// Most connections; more are closed at once.
    pub max_connections: usize,
    /// A request head must arrive within this.
    pub head_timeout: Duration,
    /// A keep-alive connection may idle this long.
    pub idle_timeout: Duration,
    /// A send may make no progress this long.
    pub send_timeout: Duration,
    /// Quanta (sectors) of the real-time and non-real-time classes.
    pub quanta: (u32, u32),
    /// Use zero-copy sends where the kernel has them.
    pub zero_copy: bool,
    /// Fraction of the measured capability promised to real-time streams.
    pub rt_reserve: f64,
    /// The engine thread's I/O priority (class 1 real-time, 2 best-effort, 3 idle;
    /// level 0–7), which its reads carry to the kernel's scheduler (BFQ, mq-deadline).
    pub ioprio: Option<(u8, u8)>,
    /// Run the engine thread at this `SCHED_FIFO` priority (below the upcall
    /// dispatcher's), so that the sends the upcalls release are not delayed by
    /// timesharing load; if refused, run anyway and say so once.
    pub fifo: Option<u8>,
    /// Splice full-speed downloads from the page cache to the socket where the storage
    /// and the kernel allow; otherwise downloads use the registered buffers.
    pub splice: bool,
    /// Most downloads spliced at once (each holds one pipe while it sends).
    pub splice_pipes: usize,
    /// Send the downloads that `splice` takes from the page cache by `sendfile(2)` on a
    /// download thread driven by `epoll` (`crate::sender`) instead of io_uring's
    /// `IORING_OP_SPLICE` through a pipe; DRR decides when each piece goes either way.
    pub sendfile: bool,
    /// A download whose range is mostly not in the page cache (asked of the kernel with
    /// `cachestat(2)`, Linux 6.5) takes the registered-buffer path even where `splice`
    /// is on: read once from the disk straight into the buffers that send it, queued by
    /// DRR, without filling the page cache for a download nobody may ask for again (the
    /// paper's mmbuf); a range mostly in the page cache is spliced from there. Only where
    /// reads are `O_DIRECT`; where `cachestat` is refused, every download is spliced.
    pub cold_direct: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            buffers: 256,
            buf_size: 256 << 10,
            huge_buffers: None,
            device_depth: 4,
            window: 4,
            readahead: ReadAhead::default(),
            rt_buffers: 16,
            max_connections: 16384,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(30),
            quanta: (2048, 512),
            zero_copy: true,
            rt_reserve: 0.8,
            ioprio: None,
            fifo: None,
            splice: true,
            splice_pipes: 64,
            sendfile: true,
            cold_direct: true,
        }
    }
}

/// An [`EngineConfig`] the engine cannot run with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// Downloads leave `rt_buffers` free for the real-time streams and read a window
    /// ahead: with fewer buffers than both, a download never gets one and waits forever.
    #[error(
        "{buffers} buffers cannot serve a download: {rt_buffers} are kept for real-time streams and a download reads {window} ahead (need at least {need})"
    )]
    TooFewBuffers {
        /// Buffers in the pool.
        buffers: usize,
        /// Kept for real-time streams.
        rt_buffers: usize,
        /// A download's read-ahead.
        window: usize,
        /// The least that works: `rt_buffers + window`.
        need: usize,
    },
    /// A buffer must be a non-zero multiple of 4096 bytes (`O_DIRECT` alignment).
    #[error("buffer size {0}: not a non-zero multiple of 4096")]
    BufferSize(usize),
    /// A setting that must be at least 1 is 0.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// The share promised to real-time streams is not a fraction.
    #[error("real-time reserve {0}: not between 0 and 1")]
    Reserve(f64),
}

impl EngineConfig {
    /// Checks that the engine can run with these settings: every combination it
    /// accepts serves both downloads and paced streams (before this check, a pool of no
    /// more buffers than `rt_buffers` starved every download forever, silently).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [("device_depth", self.device_depth), ("window", self.window), ("buffers", self.buffers)] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.splice && self.splice_pipes == 0 {
            return Err(ConfigError::Zero("splice_pipes"));
        }
        if self.buf_size == 0 || self.buf_size % 4096 != 0 {
            return Err(ConfigError::BufferSize(self.buf_size));
        }
        if !(0.0..=1.0).contains(&self.rt_reserve) {
            return Err(ConfigError::Reserve(self.rt_reserve));
        }
        let need = self.rt_buffers.saturating_add(self.window);
        if self.buffers < need {
            return Err(ConfigError::TooFewBuffers {
                buffers: self.buffers,
                rt_buffers: self.rt_buffers,
                window: self.window,
                need,
            });
        }
        Ok(())
    }
}

use ictus_mars_api::Stats;
/// One stream's state, as `stream_state` reports it (the wire form of the API crate).
pub use ictus_mars_api::StreamState;

/// Counters of the engine: the counters the streams API carries ([`Stats`], which
/// `EngineStats` dereferences to) and what only the engine's own users see.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// The counters as [`Streams::stats`](ictus_mars_api::protocol::Streams::stats)
    /// sends them.
    pub counters: Stats,
    /// DRR classes: name, quantum, sectors served.
    pub classes: Vec<(String, u32, u64)>,
    /// The devices' worst read latency now (ns), what read-ahead is sized from.
    pub latency_high_ns: u64,
    /// The largest read-ahead window a paced stream has had (chunks).
    pub max_window: u64,
    /// The most reads the paced streams have needed in flight per device beyond
    /// `device_depth`.
    pub max_rt_need: u64,
    /// The worst device read latency seen (ns).
    pub max_latency_ns: u64,
    /// The longest a paced stream's pre-roll took, from its first chunk read to its
    /// clock's start (ns).
    pub max_preroll_ns: u64,
    /// Whether downloads are spliced from the page cache.
    pub splice: bool,
    /// Bytes of downloads spliced from the page cache to sockets.
    pub bytes_spliced: u64,
    /// Whether those downloads are sent by the download thread's `sendfile` (else by
    /// io_uring's splice).
    pub sendfile: bool,
    /// Download jobs handed back by the download thread because their client took no
    /// byte for a while (the rest waits for the socket to be writable, out of DRR).
    pub parked: u64,
    /// Jobs handed to the download thread.
    pub jobs: u64,
    /// Of those, jobs handed over while an earlier job of the same connection was
    /// still out (the thread starts them without a round trip through the engine).
    pub jobs_behind: u64,
    /// Jobs the thread handed back unsent because the job before them of their
    /// connection was parked or failed (their bytes must not pass its rest).
    pub jobs_skipped: u64,
    /// The `stream=N` tags of HTTP requests whose response is being sent (a director's
    /// stream ids, which a cluster node reports so that streams whose player stopped
    /// are closed there).
    pub open_tags: Vec<u64>,
    /// Requests held while the backend looked their clip up afar
    /// ([`Storage::lookup_ready`] said no): the engine's thread did not wait for it.
    pub lookup_waits: u64,
    /// Downloads whose range was mostly out of the page cache, sent from the registered
    /// buffers (`O_DIRECT`) though splicing was on ([`EngineConfig::cold_direct`]).
    pub cold_downloads: u64,
}

impl std::ops::Deref for EngineStats {
    type Target = Stats;
    fn deref(&self) -> &Stats {
        &self.counters
    }
}

impl std::ops::DerefMut for EngineStats {
    fn deref_mut(&mut self) -> &mut Stats {
        &mut self.counters
    }
}

/// A request to the engine from another thread.
#[derive(Debug)]
pub enum Command {
    /// Open a stream of `name` from `offset`, sending to `sock`; paced at `rate` bytes/s
    /// by an upcall if given, else driven by read/send calls.
    Open {
        /// Connected socket to send to.
        sock: OwnedFd,
        /// Stream name.
        name: String,
        /// First byte.
        offset: u64,
        /// Bytes/s, or none.
        rate: Option<f64>,
        /// Buffers of read-ahead.
        chains: usize,
        /// The answer: the id, or why not.
        reply: mpsc::Sender<Result<u64, String>>,
    },
    /// `stream_read`: fill these streams' chains.
    Read(Vec<u64>),
    /// `stream_send`: send what is read.
    Send(Vec<u64>),
    /// `stream_rdsnd`: read one chunk and send it when read.
    ReadSend(Vec<u64>),
    /// `stream_state`.
    State(Vec<u64>, mpsc::Sender<Vec<StreamState>>),
    /// `stream_close`: stop, free buffers once the kernel is done with them.
    Close(Vec<u64>),
    /// The paced streams of one tick level may have slots due (from its upcall).
    Tick(u8),
    /// Change a class's quantum (sectors), adding the class if new.
    SetQuantum {
        /// Class name.
        class: String,
        /// Sectors per round.
        sectors: u32,
        /// Done, or why not.
        reply: mpsc::Sender<Result<(), String>>,
    },
    /// The counters.
    Stats(mpsc::Sender<EngineStats>),
    /// The storage has bytes that [`Storage::ready`] said were not there yet.
    StorageReady,
    /// Stop the loop.
    Stop,
}

/// A cloneable way to talk to the engine from other threads.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    queue: Arc<Mutex<VecDeque<Command>>>,
    wake: Arc<OwnedFd>,
    stopped: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Queues a command and wakes the engine.
    pub fn post(&self, cmd: Command) {
        if let Ok(mut q) = self.queue.lock() {
            q.push_back(cmd);
        }
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
    }

    /// Whether the engine has stopped.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Asks for the counters; `None` if the engine has stopped.
    pub fn stats(&self) -> Option<EngineStats> {
        let (tx, rx) = mpsc::channel();
        self.post(Command::Stats(tx));
        rx.recv_timeout(Duration::from_secs(10)).ok()
    }

    /// Asks for streams' states.
    pub fn state(&self, ids: Vec<u64>) -> Option<Vec<StreamState>> {
        let (tx, rx) = mpsc::channel();
        self.post(Command::State(ids, tx));
        rx.recv_timeout(Duration::from_secs(10)).ok()
    }
}

/// How long a device's read latency is remembered for sizing read-ahead.
const LATENCY_HORIZON: Duration = Duration::from_secs(4);

const OP_ACCEPT: u64 = 1;
const OP_POLL: u64 = 2;
const OP_SEND_BYTES: u64 = 3;
const OP_SEND_BUF: u64 = 4;
const OP_READ: u64 = 5;
const OP_WAKE: u64 = 6;
const OP_TICK: u64 = 7;
const OP_SPLICE_IN: u64 = 8;
const OP_SPLICE_OUT: u64 = 9;
/// A drain linked in a chain (its read's index, not the connection's slot).
const OP_CHAIN_OUT: u64 = 10;
/// Most pieces linked in one chain of fills and drains.
const CHAIN_MAX: usize = 16;
/// A parked download's wait for its socket to be writable.
const OP_POLL_OUT: u64 = 11;
/// A download job the client took nothing of for this long is handed back
/// ([`crate::sender`]): its device slots go to the others.
const PARK_AFTER: Duration = Duration::from_millis(100);

fn ud(op: u64, a: u32, b: u32) -> u64 {
    (op << 56) | (u64::from(a) << 24) | u64::from(b & 0xff_ffff)
}
fn ud_parts(u: u64) -> (u64, u32, u32) {
    (u >> 56, ((u >> 24) & 0xffff_ffff) as u32, (u & 0xff_ffff) as u32)
}

/// A device read waiting in DRR or in the kernel: into a registered buffer, or (for a
/// spliced download, `splice`) from the page cache into the owner's pipe.
#[derive(Clone, Copy, Debug)]
struct ReadReq {
    splice: bool,
    /// A real-time (paced) stream's read: it may use the device queue's depth beyond
    /// `device_depth`.
    rt: bool,
    buf: u16,
    owner: Owner,
    dev: u16,
    offset: u64,
    len: u32,
    at: u32,
    /// When it went to the kernel (ns since the engine's epoch), for the latency.
    submitted: u64,
}

#[derive(Debug)]
enum Item {
    Bytes {
        data: Vec<u8>,
        sent: usize,
    },
    Chunk {
        buf: u16,
        skip: u32,
        len: u32,
        pending: u32,
        sent: u32,
        failed: bool,
    },
    /// `len` bytes at `offset` of cached device `dev`, spliced through the connection's
    /// pipe: `filled` of them into it so far, `drained` of those out to the socket;
    /// `ops` splices in the kernel; `queued` while its read waits in DRR.
    Splice {
        dev: u16,
        offset: u64,
        len: u32,
        filled: u32,
        drained: u32,
        ops: u8,
        queued: bool,
        failed: bool,
    },
}

/// A lane of the page-cache download path: for io_uring's splice a pipe (read end,
/// write end) and its capacity; for the download thread's `sendfile` no pipe, and the
/// size of the pieces handed over.
#[derive(Debug)]
struct Pipe {
    fds: Option<(OwnedFd, OwnedFd)>,
    size: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// HTTP: waiting for a request head.
    Head,
    /// Sending a response or a stream.
    Sending,
    /// A stream sent to the end.
    Done,
    /// Shut down, waiting for the kernel's operations to finish.
    Closing,
}

#[derive(Debug)]
struct Conn {
    gen: u32,
    sock: OwnedFd,
    /// The peer is on this host (a zero-copy send to it is copied at delivery anyway).
    local: bool,
    http: bool,
    phase: Phase,
    head: Vec<u8>,
    since: Instant,
    progress: Instant,
    peer_closed: bool,
    polling: bool,
    send_busy: bool,
    ops: u32,
    items: VecDeque<Item>,
    segs: VecDeque<Segment>,
    stream: Option<StreamInfo>,
    cursor: Option<(u64, u64)>,
    keep_alive: bool,
    class: ClassId,
    window: usize,
    read_credit: u64,
    send_credit: u64,
    pacer: Option<Pacer>,
    /// The tick level that wakes it, while paced.
    tick: Option<u8>,
    rate: Option<f64>,
    read: u64,
    sent: u64,
    failed: bool,
    /// While a download is spliced: its pipe.
    pipe: Option<Pipe>,
    /// The reads of each of its jobs with the download thread, in order: at most
    /// two (the second is started by the thread as soon as the first ends whole).
    jobs: VecDeque<Vec<u32>>,
    /// A job came back parked or failed while a later one was still out: what to do
    /// once every job is back (the later ones come back skipped).
    hold: Option<Outcome>,
    /// The reads of its io_uring chain of linked fills and drains, in order.
    chain: Vec<u32>,
    /// Bytes the peer had acknowledged at the last tick, while a splice to it is in
    /// flight (a blocking splice reports progress only when it is done).
    acked: Option<u64>,
    /// The request's `stream=N` tag (see [`EngineStats::open_tags`]).
    tag: Option<u64>,
    /// Bytes a paced stream sends at once when it starts, before pacing (`lead=N`: a
    /// stream resumed behind its player's clock).
    lead: u64,
    /// When a paced stream's first chunk was read (ns since the engine's epoch), while
    /// it reads its pre-roll.
    preroll_since: Option<u64>,
}

const UNLIMITED: u64 = u64::MAX;

impl Conn {
    fn new(gen: u32, sock: OwnedFd, http: bool, now: Instant, class: ClassId, window: usize) -> Conn {
        let local = peer_is_local(&sock);
        Conn {
            gen,
            sock,
            local,
            http,
            phase: Phase::Head,
            head: Vec::new(),
            since: now,
            progress: now,
            peer_closed: false,
            polling: false,
            send_busy: false,
            ops: 0,
            items: VecDeque::new(),
            segs: VecDeque::new(),
            stream: None,
            cursor: None,
            keep_alive: true,
            class,
            window,
            read_credit: UNLIMITED,
            send_credit: UNLIMITED,
            pacer: None,
            tick: None,
            rate: None,
            read: 0,
            sent: 0,
            failed: false,
            pipe: None,
            jobs: VecDeque::new(),
            hold: None,
            chain: Vec::new(),
            acked: None,
            tag: None,
            lead: 0,
            preroll_since: None,
        }
    }
}

/// What the engine serves from and how.
pub struct Engine {
    ring: IoUring,
    /// The download thread, where downloads are sent by `sendfile` (stopped before the
    /// connections' sockets and the storage's descriptors go).
    sender: Option<Sender>,
    /// Its results, queued for this thread (which it wakes through `wake`).
    jobs_done: Arc<Mutex<Vec<Done>>>,
    pool: BufPool,
    storage: Arc<dyn Storage>,
    devices: Vec<RawFd>,
    registered: bool,
    zero_copy: bool,
    drr: Vec<Drr<ReadReq>>,
    inflight: Vec<usize>,
    /// Of those, the real-time class's reads.
    inflight_rt: Vec<usize>,
    /// Each device's read latency over the last seconds.
    latency: Vec<LatencyWindow>,
    /// The worst of them now, and of the reads still in flight (ns).
    latency_high: u64,
    /// Reads per device the paced streams need in flight at that latency, beyond
    /// `device_depth`.
    rt_need: usize,
    /// The most pieces one chunk puts on one device.
    pieces_per_dev: usize,
    /// Slots of the paced (real-time) streams.
    paced: Vec<u32>,
    /// The tick upcalls in use, by level, with the streams each wakes.
    ticks: std::collections::BTreeMap<u8, Tick>,
    /// Free buffers downloads must leave: `rt_buffers` and what the paced streams lack
    /// of their read-ahead floors.
    rt_hold: usize,
    reads: Vec<Option<ReadReq>>,
    free_reads: Vec<u32>,
    conns: Vec<Option<Conn>>,
    free_slots: Vec<u32>,
    gens: Vec<u32>,
    live: usize,
    listener: Option<TcpListener>,
    accept_armed: bool,
    cfg: EngineConfig,
    queue: Arc<Mutex<VecDeque<Command>>>,
    wake: Arc<OwnedFd>,
    wake_buf: Box<[u8; 8]>,
    tick: Box<types::Timespec>,
    stopped: Arc<AtomicBool>,
    dirty: Vec<u32>,
    starved: Vec<u32>,
    /// Connections waiting for the storage to have their next bytes (pumped again on
    /// [`Command::StorageReady`] and each tick).
    waiting: Vec<u32>,
    rt: Option<RuntimeHandle>,
    admission: Admission,
    stats: EngineStats,
    scratch: Vec<u8>,
    boundary_seq: u64,
    boundary_salt: u64,
    epoch: Instant,
    rt_class: ClassId,
    nrt_class: ClassId,
    class_names: Vec<String>,
    /// The storage's devices through the page cache, if downloads are spliced.
    cached: Vec<RawFd>,
    /// The largest read DRR takes (bytes).
    max_read: u64,
    /// Free pipes, and how many exist (free or held).
    pipes: Vec<Pipe>,
    pipes_made: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("connections", &self.live).finish_non_exhaustive()
    }
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// io_uring is not available (kernel, sysctl `kernel.io_uring_disabled`, seccomp).
    #[error("io_uring unavailable: {0}")]
    NoUring(#[source] io::Error),
    /// The buffer pool could not be made.
    #[error("buffer pool: {0}")]
    Pool(#[source] io::Error),
    /// Another set-up step failed.
    #[error("{0}: {1}")]
    Setup(&'static str, #[source] io::Error),
    /// The settings cannot work ([`EngineConfig::validate`]).
    #[error("engine settings: {0}")]
    Config(#[from] ConfigError),
}

fn warn_once(flag: &AtomicBool, msg: &str) {
    if !flag.swap(true, Ordering::Relaxed) {
        eprintln!("ictus mars: warning: {msg}");
    }
}
static WARN_REGISTER: AtomicBool = AtomicBool::new(false);
static WARN_ZC: AtomicBool = AtomicBool::new(false);
static WARN_SPLICE: AtomicBool = AtomicBool::new(false);
static WARN_SENDER: AtomicBool = AtomicBool::new(false);
static WARN_CACHESTAT: AtomicBool = AtomicBool::new(false);

impl Engine {
    /// An engine over `storage`, accepting HTTP on `listener` if given. `capability`
    /// is the measured bytes/s admission control works from; `rt` the upcall runtime
    /// that paces streams.
    pub fn new(
        storage: Arc<dyn Storage>,
        listener: Option<TcpListener>,
        cfg: EngineConfig,
        capability: f64,
        rt: Option<RuntimeHandle>,
    ) -> Result<(Engine, EngineHandle), EngineError> {
        cfg.validate()?;
        // A smaller ring where the locked-memory limit refuses a large one (kernels
        // that charge rings to RLIMIT_MEMLOCK): the submission path copes with a full
        // queue, and completions past the queue are kept by the kernel (NODROP).
        let ring = {
            let mut last = None;
            let mut got = None;
            for entries in [4096u32, 1024, 256, 64] {
                match IoUring::new(entries) {
                    Ok(r) => {
                        got = Some(r);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match got {
                Some(r) => r,
                None => return Err(EngineError::NoUring(last.unwrap_or_else(|| io::Error::other("no ring")))),
            }
        };
        let max_read = storage.max_read().min(cfg.buf_size as u64);
        let pool =
            BufPool::new(cfg.buffers, cfg.buf_size, cfg.huge_buffers.unwrap_or(cfg.buffers / 2).min(cfg.buffers))
                .map_err(EngineError::Pool)?;
        let iovecs = pool.iovecs();
        // SAFETY: the iovecs cover the pool's mapping, which lives as long as the engine
        // and is unmapped only after the ring is dropped (the ring field is declared
        // first, so it drops first).
        let registered = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        if !registered {
            warn_once(
                &WARN_REGISTER,
                "io_uring refused to register the buffers (RLIMIT_MEMLOCK?): reads and sends use them unregistered",
            );
        }
        let mut probe = io_uring::Probe::new();
        let zc_supported =
            ring.submitter().register_probe(&mut probe).is_ok() && probe.is_supported(opcode::SendZc::CODE);
        let zero_copy = cfg.zero_copy && zc_supported;
        let cached: Vec<RawFd> = storage.cached().iter().map(|d| d.as_raw_fd()).collect();
        let splice_supported = probe.is_supported(opcode::Splice::CODE);
        let cached = if cfg.splice && splice_supported && cached.len() == storage.devices().len() {
            cached
        } else {
            if cfg.splice && !cached.is_empty() && !splice_supported {
                warn_once(
                    &WARN_SPLICE,
                    "this kernel has no IORING_OP_SPLICE: downloads read into the registered buffers",
                );
            }
            Vec::new()
        };
        if cfg.zero_copy && !zc_supported {
            warn_once(&WARN_ZC, "this kernel has no IORING_OP_SEND_ZC: sends copy from the registered buffers");
        }
        let max_request = (max_read / SECTOR).max(1) as u32;
        let quanta = (cfg.quanta.0.max(max_request), cfg.quanta.1.max(max_request));
        let devices: Vec<RawFd> = storage.devices().iter().map(|d| d.as_raw_fd()).collect();
        let mut drr = Vec::new();
        for _ in &devices {
            let mut d = Drr::new(max_request);
            d.add_class("rt", quanta.0).map_err(|e| EngineError::Setup("drr", io::Error::other(e.to_string())))?;
            d.add_class("nrt", quanta.1).map_err(|e| EngineError::Setup("drr", io::Error::other(e.to_string())))?;
            drr.push(d);
        }
        let wake = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .map_err(|e| EngineError::Setup("eventfd", e.into()))?;
        let wake = Arc::new(wake);
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let handle = EngineHandle { queue: Arc::clone(&queue), wake: Arc::clone(&wake), stopped: Arc::clone(&stopped) };
        let waker = handle.clone();
        storage.set_waker(Box::new(move || waker.post(Command::StorageReady)));
        let jobs_done: Arc<Mutex<Vec<Done>>> = Arc::new(Mutex::new(Vec::new()));
        let sender = if cfg.sendfile && !cached.is_empty() {
            let start = || -> io::Result<Sender> {
                let mut fds = Vec::new();
                for d in storage.cached() {
                    fds.push(d.try_clone_to_owned()?);
                }
                let (q, w) = (Arc::clone(&jobs_done), Arc::clone(&wake));
                Sender::start(
                    fds,
                    PARK_AFTER,
                    Box::new(move |done| {
                        let first = match q.lock() {
                            Ok(mut v) => {
                                let first = v.is_empty();
                                v.extend(done);
                                first
                            }
                            Err(_) => false,
                        };
                        if first {
                            let _ = rustix::io::write(&*w, &1u64.to_ne_bytes());
                        }
                    }),
                )
            };
            match start() {
                Ok(s) => Some(s),
                Err(e) => {
                    warn_once(
                        &WARN_SENDER,
                        &format!("the download thread could not start ({e}): downloads are spliced by io_uring"),
                    );
                    None
                }
            }
        } else {
            None
        };
        let sendfile = sender.is_some();
        let direct = storage.direct();
        let n = devices.len();
        let pieces_per_dev = {
            let mut per = vec![0usize; n];
            for p in storage.plan(0, cfg.buf_size as u64) {
                if let Some(c) = per.get_mut(usize::from(p.component)) {
                    *c += 1;
                }
            }
            per.into_iter().max().unwrap_or(1).max(1)
        };
        let engine = Engine {
            ring,
            sender,
            jobs_done,
            pool,
            storage,
            devices,
            registered,
            zero_copy,
            drr,
            inflight: vec![0; n],
            inflight_rt: vec![0; n],
            latency: vec![LatencyWindow::new(LATENCY_HORIZON.as_nanos() as u64); n],
            latency_high: 0,
            rt_need: 0,
            pieces_per_dev,
            paced: Vec::new(),
            ticks: std::collections::BTreeMap::new(),
            rt_hold: 0,
            reads: Vec::new(),
            free_reads: Vec::new(),
            conns: Vec::new(),
            free_slots: Vec::new(),
            gens: Vec::new(),
            live: 0,
            listener,
            accept_armed: false,
            admission: Admission::new(capability, cfg.rt_reserve),
            cfg,
            queue,
            wake,
            wake_buf: Box::new([0; 8]),
            tick: Box::new(types::Timespec::new().sec(1)),
            stopped,
            dirty: Vec::new(),
            starved: Vec::new(),
            waiting: Vec::new(),
            rt,
            stats: EngineStats {
                counters: Stats { direct, registered, zero_copy, ..Stats::default() },
                splice: !cached.is_empty(),
                sendfile,
                ..EngineStats::default()
            },
            scratch: vec![0; 16 << 10],
            boundary_seq: 0,
            boundary_salt: crate::volume::random_id(),
            epoch: Instant::now(),
            rt_class: ClassId(0),
            nrt_class: ClassId(1),
            class_names: vec!["rt".into(), "nrt".into()],
            cached,
            max_read: u64::from(max_request) * SECTOR,
            pipes: Vec::new(),
            pipes_made: 0,
        };
        Ok((engine, handle))
    }

    fn push(&mut self, e: squeue::Entry) {
        loop {
            // SAFETY: for every entry built in this file, the memory an entry points to
            // lives until its completion — registered pool buffers (held by `refs`), a
            // connection's byte items (kept in its queue until the send completes; the
            // slot is freed only when its `ops` is 0), the engine's boxed wake buffer and
            // timespec (owned by the engine, which drains the ring before it drops).
            let pushed = unsafe { self.ring.submission().push(&e) };
            if pushed.is_ok() {
                return;
            }
            // Full submission queue: hand it to the kernel and try again.
            let _ = self.ring.submit();
        }
    }

    fn arm_accept(&mut self) {
        if self.accept_armed {
            return;
        }
        if let Some(l) = &self.listener {
            let fd = types::Fd(l.as_raw_fd());
            let e = opcode::Accept::new(fd, std::ptr::null_mut(), std::ptr::null_mut())
                .flags(libc::SOCK_CLOEXEC)
                .build()
                .user_data(ud(OP_ACCEPT, 0, 0));
            self.push(e);
            self.accept_armed = true;
        }
    }

    fn arm_wake(&mut self) {
        let e = opcode::Read::new(types::Fd(self.wake.as_raw_fd()), self.wake_buf.as_mut_ptr(), 8)
            .build()
            .user_data(ud(OP_WAKE, 0, 0));
        self.push(e);
    }

    fn arm_tick(&mut self) {
        let e = opcode::Timeout::new(&*self.tick as *const _).build().user_data(ud(OP_TICK, 0, 0));
        self.push(e);
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Runs until [`Command::Stop`].
    pub fn run(mut self) -> io::Result<()> {
        self.arm_accept();
        self.arm_wake();
        self.arm_tick();
        let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(1024);
        let result = loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => break Err(e),
            }
            cqes.clear();
            cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result(), c.flags())));
            for &(u, res, flags) in &cqes {
                self.complete(u, res, flags);
            }
            if self.stopped.load(Ordering::Acquire) {
                break Ok(());
            }
            self.settle();
        };
        self.shutdown();
        result
    }

    /// The devices' latency now, what the paced streams need in flight at it, and the
    /// buffers downloads must leave them.
    fn refresh_rt(&mut self) {
        let now = self.now_ns();
        let mut oldest = vec![0u64; self.latency.len()];
        for r in self.reads.iter().flatten() {
            let age = now.saturating_sub(r.submitted);
            let o = &mut oldest[usize::from(r.dev)];
            *o = (*o).max(age);
        }
        self.latency_high = self.latency.iter().zip(&oldest).map(|(w, &o)| w.high(now, o)).max().unwrap_or(0);
        let (chunk, ra, l) = (self.cfg.buf_size as u64, self.cfg.readahead, self.latency_high);
        let mut need = 0;
        let mut hold = self.cfg.rt_buffers;
        for &slot in &self.paced {
            let Some(c) = self.conns.get(slot as usize).and_then(Option::as_ref) else { continue };
            let Some(rate) = c.rate else { continue };
            if c.cursor.is_some() || !c.segs.is_empty() {
                need += ra.in_flight(rate, chunk, l) * self.pieces_per_dev;
            }
            hold += ra.floor_window(rate, chunk).saturating_sub(c.items.len());
        }
        self.rt_need = need;
        self.rt_hold = hold;
        self.stats.latency_high_ns = self.latency_high;
        self.stats.max_rt_need = self.stats.max_rt_need.max(need as u64);
    }

    /// After a batch of completions: pump every touched connection, then the devices.
    fn settle(&mut self) {
        self.refresh_rt();
        loop {
            let dirty = std::mem::take(&mut self.dirty);
            if dirty.is_empty() {
                break;
            }
            for slot in dirty {
                self.pump(slot);
            }
        }
        self.kick_devices();
        if self.pool.free_count() > 0 && !self.starved.is_empty() {
            let starved = std::mem::take(&mut self.starved);
            for slot in starved {
                self.pump(slot);
            }
            self.kick_devices();
        }
    }

    fn shutdown(&mut self) {
        self.stopped.store(true, Ordering::Release);
        // The download thread first (joined): its jobs end here, as failed.
        if self.sender.take().is_some() {
            self.jobs_done();
            let keys: Vec<(u64, usize)> = self
                .conns
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.as_ref().map(|c| (stream_id(i as u32, c.gen), c.jobs.len())))
                .collect();
            for (key, n) in keys {
                for _ in 0..n {
                    self.job_done(Done { key, sent: 0, outcome: Outcome::Failed });
                }
            }
        }
        for slot in 0..self.conns.len() as u32 {
            if self.conns[slot as usize].is_some() {
                self.close(slot);
            }
        }
        // Wait (bounded) for the kernel to give back every buffer and socket.
        let deadline = Instant::now() + Duration::from_secs(5);
        while (self.live > 0 || self.inflight.iter().any(|&n| n > 0)) && Instant::now() < deadline {
            let _ = self.ring.submit_and_wait(1);
            let cqes: Vec<_> = self.ring.completion().map(|c| (c.user_data(), c.result(), c.flags())).collect();
            for (u, res, flags) in cqes {
                self.complete(u, res, flags);
            }
        }
    }

    fn complete(&mut self, u: u64, res: i32, flags: u32) {
        let (op, a, b) = ud_parts(u);
        match op {
            OP_ACCEPT => {
                self.accept_armed = false;
                if res >= 0 {
                    // SAFETY: a successful accept's result is a new descriptor we own.
                    let fd = unsafe { OwnedFd::from_raw_fd(res) };
                    self.accepted(fd);
                }
                if !self.stopped.load(Ordering::Acquire)
                    && (res >= 0 || res == -libc::EINTR || res == -libc::ECONNABORTED)
                {
                    self.arm_accept();
                }
                // Other errors (EMFILE…): the tick re-arms.
            }
            OP_POLL => self.polled(a, b, res),
            OP_SEND_BYTES | OP_SEND_BUF => {
                if cqueue::notif(flags) {
                    // The kernel is done with a zero-copy send's pages.
                    self.pool.unhold(b as u16);
                    return;
                }
                // A zero-copy send that will post a notification (IORING_CQE_F_MORE)
                // keeps its hold until then; any other send is done with the buffer.
                if op == OP_SEND_BUF && !cqueue::more(flags) {
                    self.pool.unhold(b as u16);
                }
                self.sent(a, res, op == OP_SEND_BUF);
            }
            OP_READ => self.read_done(a, res),
            OP_SPLICE_IN => self.chain_done(a, true, res),
            OP_CHAIN_OUT => self.chain_done(a, false, res),
            OP_SPLICE_OUT => self.splice_out_done(a, b, res),
            OP_POLL_OUT => self.writable(a, b),
            OP_WAKE => {
                self.jobs_done();
                self.commands();
                if !self.stopped.load(Ordering::Acquire) {
                    self.arm_wake();
                }
            }
            OP_TICK => {
                self.ticked();
                if !self.stopped.load(Ordering::Acquire) {
                    self.arm_tick();
                    self.arm_accept();
                }
            }
            _ => {}
        }
    }

    fn new_slot(&mut self) -> u32 {
        if let Some(s) = self.free_slots.pop() {
            return s;
        }
        self.conns.push(None);
        self.gens.push(0);
        (self.conns.len() - 1) as u32
    }

    fn install(&mut self, sock: OwnedFd, http: bool, class: ClassId, window: usize) -> u32 {
        let slot = self.new_slot();
        self.gens[slot as usize] = self.gens[slot as usize].wrapping_add(1) & 0xff_ffff;
        let gen = self.gens[slot as usize];
        self.conns[slot as usize] = Some(Conn::new(gen, sock, http, Instant::now(), class, window));
        self.live += 1;
        self.stats.connections = self.live as u64;
        slot
    }

    fn accepted(&mut self, fd: OwnedFd) {
        self.stats.accepted += 1;
        if self.live >= self.cfg.max_connections {
            self.stats.refused += 1;
            return; // dropped: closed
        }
        let _ = rustix::net::sockopt::set_tcp_nodelay(&fd, true);
        let slot = self.install(fd, true, self.nrt_class, self.cfg.window);
        self.arm_poll(slot);
    }

    fn conn(&mut self, slot: u32) -> Option<&mut Conn> {
        self.conns.get_mut(slot as usize).and_then(Option::as_mut)
    }

    fn arm_poll(&mut self, slot: u32) {
        let Some(c) = self.conn(slot) else { return };
        if c.polling || c.phase == Phase::Closing {
            return;
        }
        c.polling = true;
        c.ops += 1;
        let (fd, gen) = (c.sock.as_raw_fd(), c.gen);
        let e = opcode::PollAdd::new(types::Fd(fd), (libc::POLLIN | libc::POLLRDHUP) as u32)
            .build()
            .user_data(ud(OP_POLL, slot, gen));
        self.push(e);
    }

    fn polled(&mut self, slot: u32, gen: u32, _res: i32) {
        let scratch_len = self.scratch.len();
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        c.polling = false;
        c.ops -= 1;
        if c.gen != gen || c.phase == Phase::Closing {
            self.maybe_free(slot);
            return;
        }
        // Drain what the socket has, without blocking, into the scratch buffer; keep at
        // most one head's worth (the parser refuses anything longer).
        loop {
            let room = (http::MAX_HEAD + 1).saturating_sub(c.head.len()).min(scratch_len);
            if room == 0 {
                break;
            }
            match rustix::net::recv(&c.sock, &mut self.scratch[..room], rustix::net::RecvFlags::DONTWAIT) {
                Ok((0, _)) => {
                    c.peer_closed = true;
                    break;
                }
                Ok((n, _)) => {
                    if c.head.is_empty() {
                        c.since = Instant::now();
                    }
                    c.head.extend_from_slice(&self.scratch[..n]);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => break,
                Err(_) => {
                    c.peer_closed = true;
                    c.failed = true;
                    break;
                }
            }
        }
        self.dirty.push(slot);
    }

    /// Starts the response to the next request in the head buffer, if complete.
    fn next_request(&mut self, slot: u32) {
        let Some(c) = self.conn(slot) else { return };
        if c.phase != Phase::Head {
            return;
        }
        match http::parse(&c.head) {
            Parsed::Partial => {
                if c.peer_closed || c.failed {
                    self.close(slot);
                } else {
                    self.arm_poll(slot);
                }
            }
            Parsed::Refuse(status) => {
                let plan = http::refusal(&c.head, status);
                self.start_plan(slot, plan, None);
            }
            Parsed::Request(req, n) => {
                // A clip the backend must ask afar about (a cluster's `stat`): the request
                // waits in `waiting`, its head kept, and is parsed again when the backend
                // wakes the engine (or at the tick); the head's time-out bounds the wait.
                if ictus_mars::label::valid_name(&req.path) && !self.storage.lookup_ready(&req.path) {
                    if !self.waiting.contains(&slot) {
                        self.waiting.push(slot);
                        self.stats.lookup_waits += 1;
                    }
                    return;
                }
                let Some(c) = self.conn(slot) else { return };
                c.head.drain(..n);
                c.since = Instant::now();
                c.tag = req_tag(&req);
                let rate = req_rate(&req);
                c.lead = req_lead(&req);
                self.boundary_seq += 1;
                let boundary = format!("ictus-{:016x}-{}", self.boundary_salt, self.boundary_seq);
                let catalog = Catalog(&*self.storage);
                let plan = http::respond(&req, &catalog, &boundary);
                let info = plan.stream.as_deref().and_then(|n| self.storage.lookup(n));
                self.stats.requests += 1;
                self.start_plan(slot, plan, info.map(|i| (i, rate)));
            }
        }
    }

    fn start_plan(&mut self, slot: u32, plan: Plan, stream: Option<(StreamInfo, Option<f64>)>) {
        let mut rate_refused = false;
        let (info, rate) = match stream {
            Some((i, r)) => (Some(i), r),
            None => (None, None),
        };
        if let Some(rate) = rate {
            if plan.status == 200 || plan.status == 206 {
                rate_refused = !self.make_paced(slot, rate);
            }
        }
        let plan = if rate_refused { refused_plan() } else { plan };
        // A full-speed download with data to send goes through the page cache by
        // splice, if a pipe is to be had.
        let spliced = rate.is_none()
            && info.is_some()
            && !self.cached.is_empty()
            && plan.body.iter().any(|s| matches!(s, Segment::Data { .. }));
        // Unless it is cold: then from the disk into the registered buffers.
        let cold = spliced
            && self.cfg.cold_direct
            && self.storage.direct()
            && info.as_ref().is_some_and(|i| self.mostly_uncached(i.start, &plan.body));
        if cold {
            self.stats.cold_downloads += 1;
        }
        let pipe = if spliced && !cold { self.take_pipe() } else { None };
        let Some(c) = self.conn(slot) else { return };
        c.pipe = pipe;
        c.phase = Phase::Sending;
        c.keep_alive = plan.keep_alive && !rate_refused;
        c.progress = Instant::now();
        c.items.push_back(Item::Bytes { data: plan.head, sent: 0 });
        c.segs = plan.body.into();
        c.stream = if rate_refused { None } else { info };
        c.cursor = None;
        self.dirty.push(slot);
    }

    /// Buffers the admitted paced streams hold on a quiet device (their read-ahead
    /// floors), with `extra` more bytes/s.
    fn floor_buffers(&self, extra: Option<f64>) -> usize {
        let chunk = self.cfg.buf_size as u64;
        let ra = self.cfg.readahead;
        self.paced
            .iter()
            .filter_map(|&s| self.conns.get(s as usize).and_then(Option::as_ref).and_then(|c| c.rate))
            .chain(extra)
            .map(|r| ra.floor_window(r, chunk))
            .sum()
    }

    /// Makes the connection a paced real-time stream; false if admission refuses: the
    /// rate past what the volume was measured to give, or the read-ahead floors past
    /// what the buffer pool holds (keeping `rt_buffers` and a download's window free).
    fn make_paced(&mut self, slot: u32, rate: f64) -> bool {
        let Some(rt) = self.rt.clone() else { return false };
        let gen = self.conns[slot as usize].as_ref().map_or(0, |c| c.gen);
        let id = stream_id(slot, gen);
        let spare = self.cfg.rt_buffers + self.cfg.window;
        if self.floor_buffers(Some(rate)) + spare > self.pool.count() {
            return false;
        }
        if self.admission.admit(id, rate).is_err() {
            return false;
        }
        let chunk = self.cfg.buf_size as f64;
        let period = Duration::from_secs_f64((chunk / rate).clamp(0.001, 60.0));
        let (level, tick) = tick_level(period);
        if !self.ticks.contains_key(&level) {
            let handle = EngineHandle {
                queue: Arc::clone(&self.queue),
                wake: Arc::clone(&self.wake),
                stopped: Arc::clone(&self.stopped),
            };
            // The job posts one command whatever the streams it wakes: its cost does
            // not grow with them (their sends are the engine's work, as before).
            let spec = UpcallSpec::periodic(tick).with_cost(Duration::from_micros(200).min(tick / 2));
            let upcall = match rt.create(spec, move |_job| handle.post(Command::Tick(level))) {
                Ok(u) => u,
                Err(_) => {
                    self.admission.release(id);
                    return false;
                }
            };
            let _ = rt.resume(upcall);
            self.ticks.insert(level, Tick { upcall, members: Vec::new() });
        }
        if let Some(t) = self.ticks.get_mut(&level) {
            t.members.push(id);
        }
        let window = self.cfg.readahead.window(rate, chunk as u64, self.latency_high);
        let rt_class = self.rt_class;
        let Some(c) = self.conn(slot) else { return false };
        c.class = rt_class;
        c.window = window;
        c.send_credit = 0;
        c.rate = Some(rate);
        // A catch-up of at most two read-ahead windows: a resumed stream, not a
        // download in disguise.
        c.lead = c.lead.min(2 * window as u64 * chunk as u64);
        c.tick = Some(level);
        // The pacer's clock starts when the pre-roll is read (`maybe_start_pacer`): a
        // player starts its clock at the first byte, and the first read may wait behind
        // a busy device for longer than a period.
        c.pacer = None;
        c.preroll_since = None;
        self.paced.push(slot);
        true
    }

    /// Moves a connection's response forward: queue reads, start the next send.
    fn pump(&mut self, slot: u32) {
        let Some(c) = self.conns.get(slot as usize).and_then(Option::as_ref) else { return };
        match c.phase {
            Phase::Closing => {
                self.maybe_free(slot);
                return;
            }
            Phase::Head => {
                self.next_request(slot);
                return;
            }
            Phase::Done => return,
            Phase::Sending => {}
        }
        if c.failed {
            self.close(slot);
            return;
        }
        self.fill(slot);
        self.start_send(slot);
        // Finished?
        let Some(c) = self.conn(slot) else { return };
        if c.items.is_empty() && c.segs.is_empty() && c.cursor.is_none() && !c.send_busy {
            // Every splice done and drained: the pipe is empty, back to the pool.
            if let Some(p) = c.pipe.take() {
                self.pipes.push(p);
            }
            let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
            if c.http {
                if c.keep_alive && !c.peer_closed {
                    c.phase = Phase::Head;
                    c.stream = None;
                    c.since = Instant::now();
                    let paced = c.tick.take();
                    c.pacer = None;
                    c.preroll_since = None;
                    c.rate = None;
                    c.class = ClassId(1);
                    c.window = 0;
                    let gen = c.gen;
                    if let Some(u) = paced {
                        self.unpace(slot, gen, u);
                    }
                    let w = self.cfg.window;
                    if let Some(c) = self.conn(slot) {
                        c.window = w;
                        c.send_credit = UNLIMITED;
                    }
                    self.dirty.push(slot);
                } else {
                    self.close(slot);
                }
            } else {
                c.phase = Phase::Done;
                let _ = rustix::net::shutdown(&c.sock, rustix::net::Shutdown::Write);
            }
        }
    }

    fn unpace(&mut self, slot: u32, gen: u32, level: u8) {
        let id = stream_id(slot, gen);
        if let Some(t) = self.ticks.get_mut(&level) {
            t.members.retain(|&m| m != id);
            if t.members.is_empty() {
                if let (Some(rt), Some(t)) = (&self.rt, self.ticks.remove(&level)) {
                    let _ = rt.destroy(t.upcall);
                }
            }
        }
        self.paced.retain(|&s| s != slot);
        self.admission.release(id);
    }

    /// Queues reads for the next chunks, up to the window and the read credit.
    fn fill(&mut self, slot: u32) {
        let (chunk, ra, latency) = (self.cfg.buf_size as u64, self.cfg.readahead, self.latency_high);
        let max_read = self.max_read;
        if let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) {
            if let Some(rate) = c.rate {
                // A paced stream reads as far ahead as the devices' latency asks now.
                c.window = ra.window(rate, chunk, latency);
                self.stats.max_window = self.stats.max_window.max(c.window as u64);
            }
        }
        loop {
            let rt_class = self.rt_class;
            let rt_floor = self.rt_hold;
            let free = self.pool.free_count();
            let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
            // Pieces out with the download thread do not count: the window is what
            // waits for the next job.
            let out: usize = c.jobs.iter().map(Vec::len).sum();
            if c.items.len() - out.min(c.items.len()) >= c.window.max(1) {
                return;
            }
            let Some((pos, end)) = c.cursor else {
                match c.segs.pop_front() {
                    None => return,
                    Some(Segment::Bytes(data)) => c.items.push_back(Item::Bytes { data, sent: 0 }),
                    Some(Segment::Data { offset, len }) => {
                        let start = c.stream.as_ref().map_or(0, |s| s.start);
                        c.cursor = Some((start + offset, start + offset + len));
                    }
                }
                continue;
            };
            if c.read_credit == 0 {
                return;
            }
            if let Some(pipe_size) = c.pipe.as_ref().map(|p| u64::from(p.size)) {
                // A spliced download: the next pipeful, in pieces of one device each
                // (a stripe unit, or several contiguous ones on one device).
                let want = (end - pos).min(pipe_size);
                let mut pieces: Vec<(u16, u64, u64)> = Vec::new();
                for p in self.storage.plan(pos, want) {
                    let (mut offset, mut len) = (p.offset, p.len);
                    while len > 0 {
                        match pieces.last_mut() {
                            Some((d, o, l)) if *d == p.component && *o + *l == offset && *l < max_read => {
                                let n = len.min(max_read - *l);
                                *l += n;
                                offset += n;
                                len -= n;
                            }
                            _ => {
                                let n = len.min(max_read);
                                pieces.push((p.component, offset, n));
                                offset += n;
                                len -= n;
                            }
                        }
                    }
                }
                let got: u64 = pieces.iter().map(|p| p.2).sum();
                if got != want {
                    // The range leaves the volume (a label that decoded cannot say so).
                    c.failed = true;
                    c.cursor = None;
                    return;
                }
                c.cursor = if pos + want >= end { None } else { Some((pos + want, end)) };
                for (dev, offset, len) in pieces {
                    c.items.push_back(Item::Splice {
                        dev,
                        offset,
                        len: len as u32,
                        filled: 0,
                        drained: 0,
                        ops: 0,
                        queued: false,
                        failed: false,
                    });
                }
                continue;
            }
            // A backend that fetches from afar (a cluster) says whether the bytes are
            // here; if not, the connection waits (the engine's thread does not) until
            // the backend says they came.
            {
                let align = self.storage.align().max(1);
                let first = pos - pos % align;
                let span_end = (first + self.pool.buf_size() as u64).min(end.next_multiple_of(align));
                if !self.storage.ready(first, span_end - first) {
                    if !self.waiting.contains(&slot) {
                        self.waiting.push(slot);
                    }
                    return;
                }
            }
            let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
            // Downloads leave the last buffers to real-time streams.
            if c.class != rt_class && free <= rt_floor {
                self.starved.push(slot);
                return;
            }
            let owner = (slot, c.gen);
            let Some(buf) = self.pool.alloc(owner, c.class != rt_class) else {
                self.starved.push(slot);
                return;
            };
            let c = self.conns[slot as usize].as_mut().expect("checked above");
            let align = self.storage.align().max(1);
            let size = self.pool.buf_size() as u64;
            let first = pos - pos % align;
            let span_end = (first + size).min(end.next_multiple_of(align));
            let skip = (pos - first) as u32;
            let len = (span_end.min(end) - pos) as u32;
            let pieces = self.storage.plan(first, span_end - first);
            c.cursor = if pos + u64::from(len) >= end { None } else { Some((pos + u64::from(len), end)) };
            if c.read_credit != UNLIMITED {
                c.read_credit -= 1;
            }
            c.items.push_back(Item::Chunk {
                buf,
                skip,
                len,
                pending: pieces.len() as u32,
                sent: 0,
                failed: pieces.is_empty(),
            });
            let class = c.class;
            for p in pieces {
                let req = ReadReq {
                    splice: false,
                    rt: class == rt_class,
                    buf,
                    owner,
                    dev: p.component,
                    offset: p.offset,
                    len: p.len as u32,
                    at: p.at as u32,
                    submitted: 0,
                };
                let sectors = (p.len.div_ceil(SECTOR)) as u32;
                let dev = usize::from(p.component);
                if let Err((_, r)) = self.drr[dev].enqueue(class, Request { position: p.offset, sectors, payload: req })
                {
                    // Larger than the scheduler allows (cannot happen with the plan's
                    // pieces): submit directly rather than lose it.
                    self.submit_read(r.payload);
                }
            }
        }
    }

    /// Dispatches what DRR chose, up to each device's queue limit: `device_depth` (the
    /// paper's adapter queue) plus what the paced streams need in flight at the
    /// measured latency (Little's law), so that a device whose queue other processes
    /// fill still gives them their rate.
    ///
    /// The depth beyond `device_depth` is the paced streams' alone: other classes keep
    /// to the adapter queue. Otherwise downloads fill it whenever the streams' read-ahead
    /// is full, the reads a stream needs next queue behind theirs in the kernel, the
    /// measured latency grows, and with it the depth the downloads fill (a loop that
    /// made a 75 % stream late under four downloads).
    fn kick_devices(&mut self) {
        let base = self.cfg.device_depth;
        let limit = base + self.rt_need;
        for dev in 0..self.drr.len() {
            while self.inflight[dev] < limit {
                let Some(class) = self.drr[dev].peek_class() else { break };
                if class != self.rt_class && self.inflight[dev] - self.inflight_rt[dev] >= base {
                    // DRR's order is kept: the next completion dispatches it.
                    break;
                }
                let Some((_, r)) = self.drr[dev].dispatch() else { break };
                self.submit_read(r.payload);
            }
        }
    }

    fn read_started(&mut self, r: &ReadReq) {
        self.inflight[usize::from(r.dev)] += 1;
        if r.rt {
            self.inflight_rt[usize::from(r.dev)] += 1;
        }
    }

    fn read_ended(&mut self, r: &ReadReq) {
        self.inflight[usize::from(r.dev)] -= 1;
        if r.rt {
            self.inflight_rt[usize::from(r.dev)] -= 1;
        }
    }

    fn submit_read(&mut self, mut r: ReadReq) {
        r.submitted = self.now_ns();
        if r.splice && self.sender.is_some() {
            self.submit_job(r);
            return;
        }
        if r.splice {
            self.submit_chain(r);
            return;
        }
        let idx = self.alloc_read(r);
        self.read_started(&r);
        self.pool.hold(r.buf);
        let ptr = self.pool.ptr(r.buf).wrapping_add(r.at as usize);
        let fd = types::Fd(self.devices[usize::from(r.dev)]);
        let e = if self.registered {
            opcode::ReadFixed::new(fd, ptr, r.len, r.buf).offset(r.offset).build()
        } else {
            opcode::Read::new(fd, ptr, r.len).offset(r.offset).build()
        };
        self.push(e.user_data(ud(OP_READ, idx, 0)));
    }

    fn alloc_read(&mut self, r: ReadReq) -> u32 {
        match self.free_reads.pop() {
            Some(i) => {
                self.reads[i as usize] = Some(r);
                i
            }
            None => {
                self.reads.push(Some(r));
                (self.reads.len() - 1) as u32
            }
        }
    }

    /// DRR dispatched a spliced download's next piece: it goes to the kernel as the
    /// head of a **chain** — page-cache pages of the device into the connection's pipe,
    /// then from the pipe to the socket (references, not copies), the next piece's fill
    /// linked after that drain (`IOSQE_IO_LINK`), for the pieces queued behind it (up to
    /// [`CHAIN_MAX`] and the devices' queue limits; they are charged to the class in
    /// DRR, as if dispatched with it). Every operation but the last drain skips its
    /// completion on success (`IOSQE_CQE_SKIP_SUCCESS`), so a chain posts exactly one
    /// completion: the last drain's, or that of the first operation that failed or came
    /// back short — the kernel then cancels the rest without completions
    /// (`REQ_F_SKIP_LINK_CQES`). One io_uring worker runs the chain through without
    /// waking this thread: one wake-up per chain instead of two per piece.
    fn submit_chain(&mut self, r: ReadReq) {
        let (slot, gen) = r.owner;
        // The devices' queue limits, as `kick_devices` keeps them.
        let limit = if r.rt { self.cfg.device_depth + self.rt_need } else { self.cfg.device_depth };
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if c.gen != gen || c.phase != Phase::Sending || !c.chain.is_empty() {
            return;
        }
        let Some(pipe) = c.pipe.as_ref() else { return };
        let (pr, pw) = match &pipe.fds {
            Some((r, w)) => (r.as_raw_fd(), w.as_raw_fd()),
            None => (-1, -1),
        };
        let sock = c.sock.as_raw_fd();
        match c.items.front_mut() {
            Some(Item::Splice { ops, queued, .. }) => {
                *ops = 2;
                *queued = false;
            }
            _ => return,
        }
        // The fresh pieces behind it, while their devices have room.
        let pieces = fresh_pieces(c.items.iter_mut().skip(1), r, CHAIN_MAX, limit, &self.inflight, 2);
        let class = c.class;
        c.ops += 2 * pieces.len() as u32;
        c.send_busy = true;
        c.acked = None;
        let mut chain = Vec::with_capacity(pieces.len());
        for (j, p) in pieces.iter().enumerate() {
            if j > 0 {
                let _ = self.drr[usize::from(p.dev)].charge(class, p.len.div_ceil(SECTOR as u32));
            }
            let idx = self.alloc_read(*p);
            self.read_started(p);
            chain.push(idx);
        }
        let n = chain.len();
        let mut entries = Vec::with_capacity(2 * n);
        for (j, (p, &idx)) in pieces.iter().zip(&chain).enumerate() {
            let dev_fd = self.cached.get(usize::from(p.dev)).copied().unwrap_or(-1);
            let link = squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS;
            entries.push(
                opcode::Splice::new(types::Fd(dev_fd), p.offset as i64, types::Fd(pw), -1, p.len)
                    .build()
                    .flags(link)
                    .user_data(ud(OP_SPLICE_IN, idx, 0)),
            );
            let drain = opcode::Splice::new(types::Fd(pr), -1, types::Fd(sock), -1, p.len).build();
            let drain = if j + 1 < n { drain.flags(link) } else { drain };
            entries.push(drain.user_data(ud(OP_CHAIN_OUT, idx, 0)));
        }
        if let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) {
            c.chain = chain;
        }
        // Linked entries must be in one submission: make room for all first.
        let room = {
            let sq = self.ring.submission();
            sq.capacity() - sq.len()
        };
        if room < entries.len() {
            let _ = self.ring.submit();
        }
        for e in entries {
            self.push(e);
        }
    }

    /// DRR dispatched a download's next piece, with the download thread: it goes to
    /// the thread as a **job** with the fresh pieces queued behind it (charged to the
    /// class in DRR as if dispatched with it), up to half the device's queue limit, so
    /// that a connection can have a second job in flight behind its first — the thread
    /// starts it the moment the first ends whole, while the engine is told of the first
    /// and queues the third (double buffering: no wake-up of the engine or of the
    /// thread between two jobs of a download). A job's pieces are the items after those
    /// of the jobs still out (which stay at the front of the queue until they are back).
    fn submit_job(&mut self, r: ReadReq) {
        let (slot, gen) = r.owner;
        // The devices' queue limits, as `kick_devices` keeps them.
        let limit = if r.rt { self.cfg.device_depth + self.rt_need } else { self.cfg.device_depth };
        let most = CHAIN_MAX.min((limit / 2).max(1));
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if c.gen != gen || c.phase != Phase::Sending || c.jobs.len() >= 2 || c.hold.is_some() {
            return;
        }
        let first: usize = c.jobs.iter().map(Vec::len).sum();
        match c.items.get_mut(first) {
            Some(Item::Splice { ops, queued: queued @ true, .. }) => {
                *ops = 1;
                *queued = false;
            }
            _ => return,
        }
        let pieces = fresh_pieces(c.items.iter_mut().skip(first + 1), r, most, limit, &self.inflight, 1);
        // What of the download follows the job, in order, as far as the thread needs to
        // know where the kernel's read-ahead may go (the items queued behind the job, then
        // the rest of the current range as the storage maps it; a multipart boundary
        // ends it).
        let ahead = {
            let job: Vec<(u16, u64, u64)> = pieces.iter().map(|p| (p.dev, p.offset, u64::from(p.len))).collect();
            let mut rest = Vec::new();
            let mut whole = true;
            for item in c.items.iter().skip(first + pieces.len()) {
                match item {
                    Item::Splice { dev, offset, len, .. } => rest.push((*dev, *offset, u64::from(*len))),
                    _ => {
                        whole = false;
                        break;
                    }
                }
            }
            // (Only with the download thread, whose devices are the page cache's: a
            // volume's plan pins nothing, see `Storage::done`.)
            if let (true, Some((pos, end)), true) = (whole, c.cursor, self.sender.is_some()) {
                let span = (end - pos).min(AHEAD_MAX.saturating_mul(self.inflight.len().max(1) as u64));
                rest.extend(self.storage.plan(pos, span).into_iter().map(|p| (p.component, p.offset, p.len)));
            }
            contiguous_ahead(&job, &rest)
        };
        // The job owns a duplicate of the socket (the connection's descriptor is closed
        // only when its jobs are back, but a duplicate makes that not matter to the
        // thread).
        let Ok(sock) = c.sock.try_clone() else {
            // No descriptor to spare (EMFILE): the download fails, as a failed splice
            // (after the bytes of the job before it, if one is out).
            for item in c.items.iter_mut().skip(first).take(pieces.len()) {
                if let Item::Splice { ops, failed, .. } = item {
                    *ops = 0;
                    *failed = true;
                }
            }
            self.dirty.push(slot);
            return;
        };
        let after = !c.jobs.is_empty();
        self.stats.jobs += 1;
        self.stats.jobs_behind += u64::from(after);
        let class = c.class;
        c.ops += 1;
        c.send_busy = true;
        c.acked = None;
        let mut chain = Vec::with_capacity(pieces.len());
        for (j, p) in pieces.iter().enumerate() {
            if j > 0 {
                let _ = self.drr[usize::from(p.dev)].charge(class, p.len.div_ceil(SECTOR as u32));
            }
            let idx = self.alloc_read(*p);
            self.read_started(p);
            chain.push(idx);
        }
        if let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) {
            c.jobs.push_back(chain);
        }
        if let Some(sender) = self.sender.as_ref() {
            let pieces = pieces
                .iter()
                .zip(ahead)
                .map(|(p, ahead)| Piece { dev: p.dev, offset: p.offset, len: p.len, ahead })
                .collect();
            sender.submit(Job { key: stream_id(slot, gen), sock, pieces, after });
        }
        // The next piece waits its turn in DRR for the second job.
        self.dirty.push(slot);
    }

    /// Queues a spliced piece's fill in its device's DRR queue (or submits it at once
    /// where the queue refuses it).
    fn enqueue_splice(&mut self, owner: (u32, u32), class: ClassId, dev: u16, offset: u64, len: u32) {
        let req =
            ReadReq { splice: true, rt: class == self.rt_class, buf: 0, owner, dev, offset, len, at: 0, submitted: 0 };
        let sectors = req.len.div_ceil(SECTOR as u32);
        let position = req.offset;
        if let Err((_, r)) = self.drr[usize::from(dev)].enqueue(class, Request { position, sectors, payload: req }) {
            self.submit_read(r.payload);
        }
    }

    /// Ends the reads of a finished chain or job: their slots freed, each counted.
    fn end_reads(&mut self, chain: &[u32]) {
        for &i in chain {
            if let Some(r) = self.reads.get_mut(i as usize).and_then(Option::take) {
                self.free_reads.push(i);
                self.read_ended(&r);
                self.stats.reads += 1;
            }
        }
    }

    /// A chain's one completion (see [`Engine::submit_chain`]): the pieces before the
    /// one it names were filled and drained whole, that one is as `res` says, and those
    /// after it did not run (they go back to DRR).
    fn chain_done(&mut self, idx: u32, fill: bool, res: i32) {
        let Some(r) = self.reads.get(idx as usize).and_then(Option::as_ref).copied() else { return };
        let (slot, gen) = r.owner;
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if c.gen != gen || !c.chain.contains(&idx) {
            return;
        }
        let chain = std::mem::take(&mut c.chain);
        c.ops -= 2 * chain.len() as u32;
        c.send_busy = false;
        let closing = c.phase == Phase::Closing;
        self.end_reads(&chain);
        if closing {
            self.maybe_free(slot);
            return;
        }
        let k = chain.iter().position(|&i| i == idx).unwrap_or(0);
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        let (mut read, mut sent) = (0u64, 0u64);
        for j in 0..chain.len() {
            let Some(Item::Splice { len, filled, drained, ops, failed, .. }) = c.items.get_mut(j) else { break };
            *ops = 0;
            let rest = *len - *filled;
            if j < k || (j == k && !fill && res >= 0 && res as u32 == rest) {
                *filled = *len;
                *drained = *len;
                read += u64::from(rest);
                sent += u64::from(rest);
            } else if j == k && fill {
                // A short fill (the end of the device before the stream's, or a
                // signal) or an error; what the pipe holds is drained next.
                if res > 0 {
                    *filled += res as u32;
                    read += res as u64;
                } else {
                    *failed = true;
                }
            } else if j == k {
                // Its fill was whole; the drain came back short, or failed (EPIPE,
                // ECONNRESET…: the client is gone).
                *filled = *len;
                read += u64::from(rest);
                if res > 0 {
                    *drained += res as u32;
                    sent += res as u64;
                } else {
                    *failed = true;
                }
            }
        }
        while matches!(c.items.front(), Some(Item::Splice { len, drained, failed: false, .. }) if drained == len) {
            c.items.pop_front();
        }
        c.read += read;
        c.sent += sent;
        if sent > 0 {
            c.progress = Instant::now();
        }
        self.stats.bytes_spliced += sent;
        self.dirty.push(slot);
    }

    fn splice_out_done(&mut self, slot: u32, gen: u32, res: i32) {
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if c.gen != gen {
            return;
        }
        c.ops -= 1;
        if c.phase == Phase::Closing {
            c.send_busy = false;
            self.maybe_free(slot);
            return;
        }
        let mut done = false;
        if let Some(Item::Splice { ops, len, drained, failed, .. }) = c.items.front_mut() {
            *ops = ops.saturating_sub(1);
            if res > 0 {
                *drained += res as u32;
                c.sent += res as u64;
                c.progress = Instant::now();
                self.stats.bytes_spliced += res as u64;
            } else if res != -libc::ECANCELED {
                // EPIPE, ECONNRESET…: the client is gone (a cancelled drain followed a
                // short fill, whose bytes are sent next).
                *failed = true;
            }
            done = *ops == 0 && *drained == *len;
            if *ops == 0 {
                c.send_busy = false;
            }
        }
        if done {
            c.items.pop_front();
        }
        self.dirty.push(slot);
    }

    /// The download thread's results since the last look.
    fn jobs_done(&mut self) {
        let done = match self.jobs_done.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(_) => return,
        };
        for d in done {
            self.job_done(d);
        }
    }

    /// A job of the download thread is back (see [`crate::sender`]): its first `sent`
    /// bytes went out, in the order of its pieces; the pieces not sent whole are the
    /// connection's again — queued in DRR anew (and charged anew: a parked client's
    /// class pays twice for what it did not take, never less), after the socket is
    /// writable if the job was parked, or failed if the job did. Jobs come back in the
    /// order they were handed over; a job behind one that was parked or failed comes
    /// back skipped, and the connection goes on only when all are back.
    fn job_done(&mut self, d: Done) {
        let (slot, gen) = ((d.key & 0xffff_ffff) as u32, (d.key >> 32) as u32);
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if c.gen != gen {
            return;
        }
        let Some(chain) = c.jobs.pop_front() else { return };
        c.ops -= 1;
        self.stats.jobs_skipped += u64::from(d.outcome == Outcome::Skipped);
        let more = !c.jobs.is_empty();
        if !more {
            c.send_busy = false;
        }
        let closing = c.phase == Phase::Closing;
        self.end_reads(&chain);
        if closing {
            self.maybe_free(slot);
            return;
        }
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        // Its pieces: the first of the items still out (those of the jobs back before
        // it and not sent whole are out no more).
        let mut left = d.sent;
        let mut blamed = false;
        let mine = c.items.iter_mut().filter(|i| matches!(i, Item::Splice { ops, .. } if *ops > 0)).take(chain.len());
        for item in mine {
            let Item::Splice { len, filled, drained, ops, failed, .. } = item else { break };
            *ops = 0;
            let n = u64::from(*len - *drained).min(left) as u32;
            *drained += n;
            *filled = *drained;
            left -= u64::from(n);
            if *drained < *len && d.outcome == Outcome::Failed && !blamed {
                *failed = true;
                blamed = true;
            }
        }
        let sent = d.sent - left;
        while matches!(c.items.front(), Some(Item::Splice { len, drained, failed: false, .. }) if drained == len) {
            c.items.pop_front();
        }
        c.read += sent;
        c.sent += sent;
        if sent > 0 {
            c.progress = Instant::now();
        }
        self.stats.bytes_spliced += sent;
        if matches!(d.outcome, Outcome::Parked | Outcome::Failed) {
            if c.hold.is_none() {
                c.hold = Some(d.outcome);
            }
            if !more {
                // No job of it is on its way to the thread: its note of this one goes.
                if let Some(sender) = self.sender.as_ref() {
                    sender.forget(d.key);
                }
            }
        }
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if more {
            if c.hold.is_none() {
                // The next job is running: the one after it may queue.
                self.dirty.push(slot);
            }
            return;
        }
        if c.hold.take() == Some(Outcome::Parked) {
            // The client took nothing for a while: the rest waits, out of DRR, until
            // its socket is writable (the send timeout still runs).
            self.stats.parked += 1;
            c.send_busy = true;
            c.ops += 1;
            let e = opcode::PollAdd::new(types::Fd(c.sock.as_raw_fd()), (libc::POLLOUT) as u32).build().user_data(ud(
                OP_POLL_OUT,
                slot,
                gen,
            ));
            self.push(e);
            return;
        }
        self.dirty.push(slot);
    }

    /// A parked download's socket is writable again (or shut down).
    fn writable(&mut self, slot: u32, gen: u32) {
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if c.gen != gen {
            return;
        }
        c.ops -= 1;
        c.send_busy = false;
        if c.phase == Phase::Closing {
            self.maybe_free(slot);
            return;
        }
        self.dirty.push(slot);
    }

    /// Whether less than half of the first [`COLD_PROBE`] bytes of `body`'s data (a
    /// stream's, from `start` in the backend) is in the page cache of the cached
    /// descriptors; false if the kernel cannot say.
    fn mostly_uncached(&self, start: u64, body: &[Segment]) -> bool {
        // A contiguous stream range lies in one contiguous range of each component
        // (stripes go round the components in order), so one question per component.
        let mut spans: Vec<Option<(u64, u64)>> = vec![None; self.cached.len()];
        let mut left = COLD_PROBE;
        for seg in body {
            let Segment::Data { offset, len } = *seg else { continue };
            let len = len.min(left);
            left -= len;
            for p in self.storage.plan(start.saturating_add(offset), len) {
                let Some(span) = spans.get_mut(usize::from(p.component)) else { return false };
                let (a, b) = span.unwrap_or((p.offset, p.offset));
                *span = Some((a.min(p.offset), b.max(p.offset.saturating_add(p.len))));
            }
            if left == 0 {
                break;
            }
        }
        let (mut cached, mut pages) = (0u64, 0u64);
        for (fd, span) in self.cached.iter().zip(&spans) {
            let Some((a, b)) = *span else { continue };
            match cachestat(*fd, a, b - a) {
                Some(n) => cached += n,
                None => return false,
            }
            pages += (b - a).div_ceil(rustix::param::page_size() as u64);
        }
        pages > 0 && cached.saturating_mul(2) < pages
    }

    /// A pipe for a spliced download: a free one, or a new one while fewer than
    /// `splice_pipes` exist.
    fn take_pipe(&mut self) -> Option<Pipe> {
        if let Some(p) = self.pipes.pop() {
            return Some(p);
        }
        if self.pipes_made >= self.cfg.splice_pipes {
            return None;
        }
        if self.sender.is_some() {
            self.pipes_made += 1;
            return Some(Pipe { fds: None, size: 1 << 20 });
        }
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).ok()?;
        // 1 MiB where allowed (fs.pipe-max-size; an unprivileged user's pipes past
        // fs.pipe-user-pages-soft stay small): what it really is is what is used.
        let _ = rustix::pipe::fcntl_setpipe_size(&w, 1 << 20);
        let size = rustix::pipe::fcntl_getpipe_size(&w).ok()?;
        self.pipes_made += 1;
        Some(Pipe { fds: Some((r, w)), size: u32::try_from(size).unwrap_or(u32::MAX).max(4096) })
    }

    fn read_done(&mut self, idx: u32, res: i32) {
        let Some(r) = self.reads.get_mut(idx as usize).and_then(Option::take) else { return };
        self.free_reads.push(idx);
        let dev = usize::from(r.dev);
        self.read_ended(&r);
        self.stats.reads += 1;
        let now = self.now_ns();
        self.latency[dev].record(now, now.saturating_sub(r.submitted));
        self.stats.max_latency_ns = self.stats.max_latency_ns.max(now.saturating_sub(r.submitted));
        if res > 0 && (res as u32) < r.len {
            // A short read (at a component's end, or a signal): read the rest.
            let rest = ReadReq { offset: r.offset + res as u64, len: r.len - res as u32, at: r.at + res as u32, ..r };
            self.pool.unhold(r.buf);
            self.submit_read(rest);
            return;
        }
        self.storage.done(r.dev, r.offset);
        let failed = res <= 0;
        let (slot, gen) = r.owner;
        if let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) {
            if c.gen == gen {
                for item in c.items.iter_mut() {
                    if let Item::Chunk { buf, pending, failed: f, len, .. } = item {
                        if *buf == r.buf {
                            *pending = pending.saturating_sub(1);
                            *f |= failed;
                            if *pending == 0 {
                                c.read += u64::from(*len);
                                self.pool.set_state(r.buf, BufState::Full);
                            }
                            break;
                        }
                    }
                }
                self.dirty.push(slot);
            }
        }
        self.maybe_start_pacer(slot, now);
        self.pool.unhold(r.buf);
    }

    /// A paced stream's clock starts (its first chunk sent, its lead — a catch-up —
    /// released at once) when its **pre-roll** is read: the read-ahead floor's worth of
    /// chunks, or all it asked for, or after twice the floor's time since its first
    /// chunk was read, whichever comes first. Until then it reads at the real-time
    /// class's share of the device with nothing consumed. Started at its first chunk,
    /// a stream taking most of a device (75 % under DRR's 80 % real-time share) built
    /// its read-ahead from the small difference only, i.e. not within a 3 s clip, and
    /// any stall of the device's queue made it late; a player waits for its buffer too.
    fn maybe_start_pacer(&mut self, slot: u32, now: u64) {
        let (chunk, ra) = (self.cfg.buf_size as u64, self.cfg.readahead);
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        let (Some(rate), None) = (c.rate, &c.pacer) else { return };
        let (mut full, mut reading) = (0usize, false);
        for item in &c.items {
            if let Item::Chunk { pending, .. } = item {
                if *pending == 0 {
                    full += 1;
                } else {
                    reading = true;
                }
            }
        }
        if full == 0 {
            return;
        }
        let since = *c.preroll_since.get_or_insert(now);
        let want = ra.floor_window(rate, chunk).min(c.window.max(1));
        let all = c.cursor.is_none() && c.segs.is_empty() && !reading;
        if full >= want || all || now.saturating_sub(since) >= ra.floor_ns.saturating_mul(2) {
            let lead = c.lead / chunk;
            c.pacer = Some(Pacer::with_lead(now, chunk, rate, lead));
            c.send_credit = 1 + lead;
            self.stats.max_preroll_ns = self.stats.max_preroll_ns.max(now.saturating_sub(since));
            self.dirty.push(slot);
        }
    }

    fn start_send(&mut self, slot: u32) {
        let zero_copy = self.zero_copy;
        let registered = self.registered;
        let thread = self.sender.is_some();
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if thread && c.jobs.len() == 1 && c.hold.is_none() && c.phase == Phase::Sending {
            // One job out with the download thread: the piece after it waits its turn
            // in DRR for the second.
            let first = c.jobs[0].len();
            if let Some(Item::Splice {
                dev,
                offset,
                len,
                filled: 0,
                drained: 0,
                ops: 0,
                queued: queued @ false,
                failed: false,
            }) = c.items.get_mut(first)
            {
                *queued = true;
                let (dev, offset, len) = (*dev, *offset, *len);
                let (class, owner) = (c.class, (slot, c.gen));
                self.enqueue_splice(owner, class, dev, offset, len);
            }
            return;
        }
        if c.send_busy || c.phase != Phase::Sending {
            return;
        }
        let fd = types::Fd(c.sock.as_raw_fd());
        let gen = c.gen;
        let e = match c.items.front() {
            None => return,
            Some(Item::Bytes { data, sent }) => {
                let rest = &data[*sent..];
                opcode::Send::new(fd, rest.as_ptr(), rest.len() as u32).flags(libc::MSG_NOSIGNAL).build().user_data(ud(
                    OP_SEND_BYTES,
                    slot,
                    gen,
                ))
            }
            Some(Item::Chunk { failed: true, .. }) | Some(Item::Splice { failed: true, .. }) => {
                c.failed = true;
                self.dirty.push(slot);
                return;
            }
            Some(&Item::Splice { dev, offset, len, filled, drained, ops, queued, .. }) => {
                if ops > 0 || queued {
                    return;
                }
                if drained < filled {
                    // A short fill (its linked drain was cancelled) or a short drain: send
                    // what the pipe holds.
                    let Some((pr, _)) = c.pipe.as_ref().and_then(|p| p.fds.as_ref()) else { return };
                    let e = opcode::Splice::new(types::Fd(pr.as_raw_fd()), -1, fd, -1, filled - drained)
                        .build()
                        .user_data(ud(OP_SPLICE_OUT, slot, gen));
                    if let Some(Item::Splice { ops, .. }) = c.items.front_mut() {
                        *ops = 1;
                    }
                    c.send_busy = true;
                    c.acked = None;
                    c.ops += 1;
                    self.push(e);
                    return;
                }
                if filled < len {
                    // The next fill waits its turn in the device's DRR queue.
                    if let Some(Item::Splice { queued, .. }) = c.items.front_mut() {
                        *queued = true;
                    }
                    let (class, owner) = (c.class, (slot, gen));
                    self.enqueue_splice(owner, class, dev, offset + u64::from(filled), len - filled);
                }
                return;
            }
            Some(Item::Chunk { pending, .. }) if *pending > 0 => return,
            Some(&Item::Chunk { buf, skip, len, sent, .. }) => {
                if c.send_credit == 0 {
                    return;
                }
                let ptr = self.pool.ptr(buf).wrapping_add((skip + sent) as usize);
                let n = len - sent;
                self.pool.set_state(buf, BufState::Sending);
                self.pool.hold(buf);
                if zero_copy && !copies_to(&self.pool, c.local, buf) {
                    // A huge-page buffer goes by its address, not its registered index:
                    // from a registered huge page the kernel builds fragments that span
                    // the folio and charges the receiver for the span (a local
                    // receiver's window then stays a few KiB); by address it takes
                    // page by page, charged by the bytes.
                    let fixed = registered && !self.pool.is_huge(buf);
                    opcode::SendZc::new(fd, ptr, n)
                        .buf_index(fixed.then_some(buf))
                        .flags(libc::MSG_NOSIGNAL)
                        .build()
                        .user_data(ud(OP_SEND_BUF, slot, u32::from(buf)))
                } else {
                    opcode::Send::new(fd, ptr, n).flags(libc::MSG_NOSIGNAL).build().user_data(ud(
                        OP_SEND_BUF,
                        slot,
                        u32::from(buf),
                    ))
                }
            }
        };
        c.send_busy = true;
        c.ops += 1;
        self.push(e);
    }

    fn sent(&mut self, slot: u32, res: i32, chunk: bool) {
        let now_ns = self.now_ns();
        let zero_copy = self.zero_copy;
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        c.send_busy = false;
        c.ops -= 1;
        if c.phase == Phase::Closing {
            self.maybe_free(slot);
            return;
        }
        if chunk && zero_copy && (res == -libc::ENOBUFS || res == -libc::ENOMEM || res == -libc::EOPNOTSUPP) {
            // Zero-copy send pins the pages it sends; unregistered buffers under a small
            // RLIMIT_MEMLOCK cannot be pinned. Copy from now on (the same buffers) and
            // send this chunk again.
            self.zero_copy = false;
            self.stats.zero_copy = false;
            warn_once(
                &WARN_ZC,
                "zero-copy send refused (pinning pages past RLIMIT_MEMLOCK?): sends copy from the buffers",
            );
            self.dirty.push(slot);
            return;
        }
        if res <= 0 {
            // EPIPE, ECONNRESET…: the client is gone.
            c.failed = true;
            self.dirty.push(slot);
            return;
        }
        c.progress = Instant::now();
        let n = res as u32;
        let mut done_buf = None;
        match c.items.front_mut() {
            Some(Item::Bytes { data, sent }) if !chunk => {
                *sent += n as usize;
                self.stats.bytes_copied += u64::from(n);
                if *sent >= data.len() {
                    c.items.pop_front();
                }
            }
            Some(Item::Chunk { buf, len, sent, .. }) if chunk => {
                *sent += n;
                c.sent += u64::from(n);
                if zero_copy && !copies_to(&self.pool, c.local, *buf) {
                    self.stats.bytes_zero_copy += u64::from(n);
                } else {
                    self.stats.bytes_copied += u64::from(n);
                }
                if *sent >= *len {
                    done_buf = Some(*buf);
                }
            }
            _ => {}
        }
        if let Some(buf) = done_buf {
            c.items.pop_front();
            if c.send_credit != UNLIMITED {
                c.send_credit -= 1;
            }
            if let Some(p) = c.pacer.as_mut() {
                p.sent_at(now_ns);
            }
            self.pool.release(buf);
        }
        self.dirty.push(slot);
    }

    /// Shuts the connection down and frees what it holds (buffers once the kernel lets
    /// go of them, the slot once its socket operations are done).
    fn close(&mut self, slot: u32) {
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else { return };
        if c.phase == Phase::Closing {
            return;
        }
        c.phase = Phase::Closing;
        let _ = rustix::net::shutdown(&c.sock, rustix::net::Shutdown::Both);
        let owner = (slot, c.gen);
        let items = std::mem::take(&mut c.items);
        c.segs.clear();
        c.cursor = None;
        let upcall = c.tick.take();
        let gen = c.gen;
        for d in &mut self.drr {
            for r in d.remove_if(|r| r.owner == owner) {
                self.storage.done(r.dev, r.offset);
            }
        }
        for item in items {
            if let Item::Chunk { buf, .. } = item {
                self.pool.release(buf);
            }
        }
        if let Some(u) = upcall {
            self.unpace(slot, gen, u);
        } else {
            self.admission.release(stream_id(slot, gen));
        }
        self.maybe_free(slot);
    }

    fn maybe_free(&mut self, slot: u32) {
        let Some(c) = self.conns.get(slot as usize).and_then(Option::as_ref) else { return };
        if c.phase == Phase::Closing && c.ops == 0 {
            if c.pipe.is_some() {
                // Dropped with the connection: it may hold bytes never sent.
                self.pipes_made -= 1;
            }
            self.conns[slot as usize] = None;
            self.free_slots.push(slot);
            self.live -= 1;
            self.stats.connections = self.live as u64;
        }
    }

    fn ticked(&mut self) {
        let now = Instant::now();
        let (head_t, idle_t, send_t) = (self.cfg.head_timeout, self.cfg.idle_timeout, self.cfg.send_timeout);
        let mut expired = Vec::new();
        for (slot, c) in self.conns.iter_mut().enumerate() {
            let Some(c) = c else { continue };
            if c.send_busy && c.pipe.is_some() {
                // A splice to the socket reports only when all is sent: a slow client
                // that acknowledges bytes is making progress.
                let acked = bytes_acked(&c.sock);
                if acked.is_some() && acked != c.acked {
                    if c.acked.is_some() {
                        c.progress = now;
                    }
                    c.acked = acked;
                }
            }
            let late = match c.phase {
                Phase::Head if !c.head.is_empty() => now.duration_since(c.since) > head_t,
                Phase::Head => now.duration_since(c.since) > idle_t,
                Phase::Sending => c.send_busy && now.duration_since(c.progress) > send_t,
                _ => false,
            };
            if late && c.http {
                expired.push(slot as u32);
            }
        }
        for slot in expired {
            self.stats.timed_out += 1;
            self.close(slot);
        }
        let now_ns = self.now_ns();
        for slot in self.paced.clone() {
            self.maybe_start_pacer(slot, now_ns);
        }
        self.dirty.append(&mut self.starved);
        self.dirty.append(&mut self.waiting);
        self.settle();
    }

    fn lookup_stream(&mut self, id: u64) -> Option<u32> {
        let (slot, gen) = ((id & 0xffff_ffff) as u32, (id >> 32) as u32);
        let c = self.conns.get(slot as usize).and_then(Option::as_ref)?;
        (c.gen == gen && !c.http).then_some(slot)
    }

    fn commands(&mut self) {
        let cmds: Vec<Command> = match self.queue.lock() {
            Ok(mut q) => q.drain(..).collect(),
            Err(_) => return,
        };
        for cmd in cmds {
            match cmd {
                Command::Stop => self.stopped.store(true, Ordering::Release),
                Command::Open { sock, name, offset, rate, chains, reply } => {
                    let r = self.open_stream(sock, &name, offset, rate, chains);
                    let _ = reply.send(r);
                }
                Command::Read(ids) => self.credit(&ids, |c| c.read_credit = c.read_credit.max(c.window as u64)),
                Command::Send(ids) => self.credit(&ids, |c| {
                    let full = c.items.iter().filter(|i| matches!(i, Item::Chunk { .. })).count() as u64;
                    c.send_credit = c.send_credit.saturating_add(full);
                }),
                Command::ReadSend(ids) => self.credit(&ids, |c| {
                    c.read_credit = c.read_credit.saturating_add(1);
                    c.send_credit = c.send_credit.saturating_add(1);
                }),
                Command::Tick(level) => {
                    // HTTP paced streams and API streams alike: any live connection.
                    let now = self.now_ns();
                    let members = match self.ticks.get_mut(&level) {
                        Some(t) => std::mem::take(&mut t.members),
                        None => Vec::new(),
                    };
                    for &id in &members {
                        let (slot, gen) = ((id & 0xffff_ffff) as u32, (id >> 32) as u32);
                        if let Some(c) = self.conn(slot).filter(|c| c.gen == gen) {
                            if let Some(p) = &c.pacer {
                                // The slots due by the pacer's clock, not one per tick:
                                // a tick that ran late or was skipped loses no slot, and
                                // one that comes before a slot is due releases none. At
                                // most a window's worth is released at once.
                                c.send_credit = p.due(now).min(c.window as u64 + 1);
                            }
                            self.dirty.push(slot);
                        }
                    }
                    if let Some(t) = self.ticks.get_mut(&level) {
                        t.members = members;
                    }
                }
                Command::State(ids, reply) => {
                    let out = ids.iter().map(|&id| self.stream_state(id)).collect();
                    let _ = reply.send(out);
                }
                Command::Close(ids) => {
                    for id in ids {
                        if let Some(slot) = self.lookup_stream(id) {
                            self.close(slot);
                        }
                    }
                }
                Command::SetQuantum { class, sectors, reply } => {
                    let _ = reply.send(self.set_quantum(&class, sectors));
                }
                Command::Stats(reply) => {
                    let _ = reply.send(self.current_stats());
                }
                Command::StorageReady => self.dirty.append(&mut self.waiting),
            }
        }
        self.settle();
    }

    fn credit(&mut self, ids: &[u64], f: impl Fn(&mut Conn)) {
        for &id in ids {
            if let Some(slot) = self.lookup_stream(id) {
                if let Some(c) = self.conn(slot) {
                    if c.rate.is_none() {
                        f(c);
                    }
                }
                self.dirty.push(slot);
            }
        }
    }

    fn set_quantum(&mut self, class: &str, sectors: u32) -> Result<(), String> {
        let idx = match self.class_names.iter().position(|n| n == class) {
            Some(i) => ClassId(i as u16),
            None => {
                if !class.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    || class.is_empty()
                    || class.len() > 32
                {
                    return Err(format!("bad class name {class:?}"));
                }
                for d in &mut self.drr {
                    d.add_class(class, sectors).map_err(|e| e.to_string())?;
                }
                self.class_names.push(class.to_string());
                return Ok(());
            }
        };
        for d in &mut self.drr {
            d.set_quantum(idx, sectors).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn open_stream(
        &mut self,
        sock: OwnedFd,
        name: &str,
        offset: u64,
        rate: Option<f64>,
        chains: usize,
    ) -> Result<u64, String> {
        let info = self.storage.lookup(name).ok_or_else(|| format!("no stream {name:?}"))?;
        if offset > info.len {
            return Err(format!("offset {offset} past the end ({} bytes)", info.len));
        }
        let chains = chains.clamp(1, 16);
        let slot = self.install(sock, false, self.rt_class, chains);
        let gen = self.conns[slot as usize].as_ref().map_or(0, |c| c.gen);
        let id = stream_id(slot, gen);
        if let Some(c) = self.conn(slot) {
            c.phase = Phase::Sending;
            c.segs.push_back(Segment::Data { offset, len: info.len - offset });
            c.stream = Some(info);
            c.read_credit = 0;
            c.send_credit = 0;
        }
        if let Some(rate) = rate {
            if !self.make_paced(slot, rate) {
                let reason = format!(
                    "admission refused {rate:.0} B/s: {:.0} of {:.0} B/s reservable are taken (measured capability {:.0} B/s)",
                    self.admission.reserved(),
                    self.admission.reservable(),
                    self.admission.capability()
                );
                self.close(slot);
                return Err(reason);
            }
            if let Some(c) = self.conn(slot) {
                c.read_credit = UNLIMITED;
            }
        }
        self.dirty.push(slot);
        Ok(id)
    }

    fn stream_state(&mut self, id: u64) -> StreamState {
        let Some(slot) = self.lookup_stream(id) else { return StreamState { id, ..StreamState::default() } };
        let pool = &self.pool;
        let Some(c) = self.conns.get(slot as usize).and_then(Option::as_ref) else { return StreamState::default() };
        let mut buffers = [0u32; 3];
        for i in &c.items {
            if let Item::Chunk { buf, .. } = i {
                match pool.state(*buf).0 {
                    BufState::Reading => buffers[0] += 1,
                    BufState::Full => buffers[1] += 1,
                    BufState::Sending => buffers[2] += 1,
                    BufState::Empty => {}
                }
            }
        }
        let state = if c.failed {
            3
        } else if c.phase == Phase::Done {
            2
        } else {
            1
        };
        let (slots, late, max_late_ns) = c.pacer.as_ref().map_or((0, 0, 0), |p| (p.sent, p.late, p.max_late));
        StreamState { id, state, read: c.read, sent: c.sent, buffers, slots, late, max_late_ns }
    }

    fn current_stats(&self) -> EngineStats {
        let mut s = self.stats.clone();
        s.buffers = self.pool.count() as u64;
        s.buffers_free = self.pool.free_count() as u64;
        s.classes = self
            .class_names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = ClassId(i as u16);
                let q = self.drr.first().and_then(|d| d.class(id)).map_or(0, |c| c.1);
                let served: u64 = self.drr.iter().map(|d| d.classes().nth(i).map_or(0, |c| c.3.sectors)).sum();
                (n.clone(), q, served)
            })
            .collect();
        s.rt_streams = self.admission.len() as u64;
        s.reserved = self.admission.reserved() as u64;
        s.reservable = self.admission.reservable() as u64;
        s.open_tags =
            self.conns.iter().flatten().filter(|c| c.http && c.phase == Phase::Sending).filter_map(|c| c.tag).collect();
        s
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Release);
    }
}

/// How much of a download [`Engine::mostly_uncached`] looks at.
const COLD_PROBE: u64 = 64 << 20;

/// `cachestat(2)`'s number (Linux 6.5; the same on every architecture, from the
/// common table); the libc crate does not name it for x86-64.
const SYS_CACHESTAT: libc::c_long = 451;

/// Pages of `[off, off + len)` of `fd` in the page cache (`cachestat(2)`); `None` (said
/// once) where the kernel refuses.
fn cachestat(fd: RawFd, off: u64, len: u64) -> Option<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off, len };
    let mut st = Stat::default();
    // SAFETY: cachestat(2) reads `range` and writes one `struct cachestat` (five u64s,
    // `Stat`'s layout) to `st`; both live across the call; flags must be 0.
    let r =
        unsafe { libc::syscall(SYS_CACHESTAT, fd, &range as *const Range, &mut st as *mut Stat, 0 as libc::c_uint) };
    if r != 0 {
        let e = io::Error::last_os_error();
        warn_once(
            &WARN_CACHESTAT,
            &format!("cachestat(2) refused ({e}): every download is spliced from the page cache, cold ones too"),
        );
        return None;
    }
    Some(st.nr_cache)
}

/// The bytes the peer of a TCP socket has acknowledged (`TCP_INFO`, tcp(7)).
fn bytes_acked(sock: &OwnedFd) -> Option<u64> {
    // Kernels older than the field give a shorter struct: no answer then.
    let need = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + std::mem::size_of::<u64>();
    tcp_info(sock.as_fd()).filter(|&(_, len)| len >= need).map(|(info, _)| info.tcpi_bytes_acked)
}

/// `TCP_INFO` of a socket, and how many bytes of it the kernel filled.
pub(crate) fn tcp_info(sock: std::os::fd::BorrowedFd<'_>) -> Option<(libc::tcp_info, usize)> {
    // SAFETY: tcp_info is plain integers, for which all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes to `info`, which is valid and
    // that large for the call, and stores the length it wrote in `len`.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some((info, len as usize))
}

/// One tick upcall and the paced streams it wakes.
#[derive(Debug)]
struct Tick {
    upcall: UpcallId,
    members: Vec<u64>,
}

/// Tick levels: level `k` has the period 1 ms × √2^k.
pub const TICK_LEVELS: u8 = 32;

/// The tick level that wakes a paced stream of slot period `period`, and its period:
/// the longest of the ladder's periods (1 ms × √2^k, `k < TICK_LEVELS`) not above
/// `period` (the shortest, 1 ms, for anything shorter). A stream is thus woken at
/// least once per slot and at most √2 times per slot (below 46 s), and however many
/// streams and rates there are, at most [`TICK_LEVELS`] upcalls exist: fewer than the
/// runtime's limit, so the admission decision keeps its bound.
pub fn tick_level(period: Duration) -> (u8, Duration) {
    let at = |k: u8| Duration::from_nanos((1e6 * std::f64::consts::SQRT_2.powi(i32::from(k))) as u64);
    let mut k = 0;
    while k + 1 < TICK_LEVELS && at(k + 1) <= period {
        k += 1;
    }
    (k, at(k))
}

/// What a node may be sent of paced streams (bytes/s), the smallest of its limits: the
/// real-time share of its measured `capability`; and what its buffer pool admits (each
/// stream reserves its read-ahead floor, at a rate `r` more than `r × floor` bytes, so
/// the pool less the spare buffers admits less than `pool × chunk / floor` bytes/s at
/// any rate whose floor is under `readahead.max_chunks`: 128 MiB/s a stream with the
/// defaults). The number of streams is not a limit of its own: ticks are shared
/// ([`tick_level`]) and connections are `max_connections`, far more than either
/// admits (a count cannot be said in bytes/s; the engine's own admission stays exact).
pub fn paced_capacity(cfg: &EngineConfig, capability: f64) -> u64 {
    let share = capability * cfg.rt_reserve;
    let spare = cfg.rt_buffers + cfg.window;
    let floor_s = (cfg.readahead.floor_ns as f64 / 1e9).max(1e-9);
    let pool = cfg.buffers.saturating_sub(spare) as f64 * cfg.buf_size as f64 / floor_s;
    share.min(pool).max(0.0) as u64
}

/// A stream's id: slot and generation.
fn stream_id(slot: u32, gen: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(slot)
}

fn refused_plan() -> Plan {
    let mut p = http::error(503, true);
    let head = String::from_utf8_lossy(&p.head).replace("\r\n\r\n", "\r\nRetry-After: 5\r\n\r\n");
    p.head = head.into_bytes();
    p
}

/// `?rate=N` (bytes/s) on a request: send paced, as a real-time stream.
fn req_rate(req: &http::RequestHead) -> Option<f64> {
    req.query.as_deref().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("rate="))
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&r| r > 0)
            .map(|r| r as f64)
    })
}

/// `?lead=N` on a paced request: bytes to send at once before pacing (a director's
/// resume of a stream behind its player's clock); 0 if absent or not a number.
fn req_lead(req: &http::RequestHead) -> u64 {
    req.query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("lead=")).and_then(|v| v.parse::<u64>().ok()))
        .unwrap_or(0)
}

/// `?stream=N` on a request: the director's id of the stream (reported back, not used).
fn req_tag(req: &http::RequestHead) -> Option<u64> {
    req.query.as_deref()?.split('&').find_map(|kv| kv.strip_prefix("stream=")).and_then(|v| v.parse().ok())
}

struct Catalog<'a>(&'a dyn Storage);

impl http::Catalog for Catalog<'_> {
    fn lookup(&self, name: &str) -> Option<http::Resource> {
        self.0.lookup(name).map(|s| http::Resource::Stream { len: s.len, etag: s.etag })
    }
}

/// Runs an engine on its own thread; returns its handle and the thread.
pub fn spawn(engine: Engine, handle: &EngineHandle) -> io::Result<std::thread::JoinHandle<io::Result<()>>> {
    let stopped = Arc::clone(&handle.stopped);
    std::thread::Builder::new().name("ictus-mars".into()).spawn(move || {
        if let Some(priority) = engine.cfg.fifo {
            use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
            // A refusal is said once by `configure_current_thread`; serve anyway.
            let _ = configure_current_thread(&ThreadRequest {
                policy: Some(Policy::Fifo { priority }),
                ..ThreadRequest::default()
            });
        }
        if let Some((class, level)) = engine.cfg.ioprio {
            if let Err(e) = set_thread_ioprio(class, level) {
                eprintln!("ictus mars: warning: I/O priority class {class} level {level} refused ({e}); reads keep the default");
            }
        }
        let r = engine.run();
        stopped.store(true, Ordering::Release);
        r
    })
}

/// The listener's socket, for tests that need its address.
pub fn local_port(l: &TcpListener) -> u16 {
    l.local_addr().map_or(0, |a| a.port())
}

/// `ioprio_set(IOPRIO_WHO_PROCESS, 0, …)`: the calling thread's I/O priority (glibc has
/// no wrapper). Reads submitted from this thread carry it.
pub fn set_thread_ioprio(class: u8, level: u8) -> io::Result<()> {
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    let value = (libc::c_int::from(class) << 13) | libc::c_int::from(level & 7);
    // SAFETY: ioprio_set(2) takes three integers and touches no memory of ours; who = 0
    // means the calling thread.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, value) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A spliced download's piece `head` and the fresh pieces queued behind it (from
/// `behind`, in order, stopping at the first that is not fresh), up to `most` pieces
/// and while each device stays under `limit` reads in flight (`inflight` plus those
/// taken here); each taken piece is marked with `ops` operations outstanding. Shared
/// by the io_uring chain (two operations a piece) and the download thread's job (one).
/// Most bytes of a download looked at behind a piece for [`Piece::ahead`]: more than
/// twice any read-ahead window the kernel keeps (`read_ahead_kb` is 128 KiB by default,
/// up to a few MiB on disks that ask for it).
const AHEAD_MAX: u64 = 64 << 20;

/// For each of a job's pieces (device, offset, length), the bytes of its download that
/// follow it contiguously on its device — among the job's later pieces and `rest`, what
/// follows the job in order — up to [`AHEAD_MAX`]. The download thread fills a piece
/// with the kernel's read-ahead only where this is more than the read-ahead can reach
/// (`sender::Device`).
fn contiguous_ahead(job: &[(u16, u64, u64)], rest: &[(u16, u64, u64)]) -> Vec<u64> {
    job.iter()
        .enumerate()
        .map(|(i, &(dev, offset, len))| {
            let (mut next, mut ahead) = (offset + len, 0u64);
            for &(d, o, l) in job[i + 1..].iter().chain(rest) {
                if ahead >= AHEAD_MAX {
                    break;
                }
                if d != dev {
                    continue;
                }
                if o != next {
                    break;
                }
                ahead += l;
                next += l;
            }
            ahead.min(AHEAD_MAX)
        })
        .collect()
}

fn fresh_pieces<'a>(
    behind: impl Iterator<Item = &'a mut Item>,
    head: ReadReq,
    most: usize,
    limit: usize,
    inflight: &[usize],
    ops_each: u8,
) -> Vec<ReadReq> {
    let mut pieces = vec![head];
    let mut extra = vec![0usize; inflight.len()];
    extra[usize::from(head.dev)] += 1;
    for item in behind {
        let Item::Splice { dev, offset, len, filled: 0, drained: 0, ops, queued: false, failed: false } = item else {
            break;
        };
        let d = usize::from(*dev);
        if pieces.len() >= most || *ops > 0 || inflight[d] + extra[d] >= limit {
            break;
        }
        *ops = ops_each;
        extra[d] += 1;
        pieces.push(ReadReq { offset: *offset, len: *len, dev: *dev, ..head });
    }
    pieces
}

/// Whether buffer `buf` goes to a peer by a copying send although zero-copy sends are
/// on: a huge-page buffer (a download) to a peer on this host. The kernel copies a
/// zero-copy send to a local socket at delivery anyway; copying at the send spares the
/// pinning and the notification. (The send and its byte count both ask this.)
fn copies_to(pool: &BufPool, local: bool, buf: u16) -> bool {
    local && pool.is_huge(buf)
}

/// Whether the socket's peer is on this host: a loopback address, or the socket's own
/// address (a connection between two addresses of this host).
fn peer_is_local(sock: &OwnedFd) -> bool {
    use std::net::SocketAddr;
    let addr = |a: Option<rustix::net::SocketAddrAny>| -> Option<std::net::IpAddr> {
        SocketAddr::try_from(a?).ok().map(|a| a.ip().to_canonical())
    };
    let (Some(peer), Some(me)) =
        (addr(rustix::net::getpeername(sock).ok().flatten()), addr(rustix::net::getsockname(sock).ok()))
    else {
        return false;
    };
    peer.is_loopback() || peer == me
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback connection's peer is local; a socket with no IP peer is not.
    #[test]
    fn a_loopback_peer_is_local_and_a_unix_peer_is_not() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert!(peer_is_local(&OwnedFd::from(s)));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(!peer_is_local(&OwnedFd::from(a)));
    }

    /// What follows a piece contiguously on its device: the job's later pieces and
    /// the rest, other devices' pieces skipped (striping), a gap ending it, capped.
    #[test]
    fn contiguous_ahead_counts_what_follows_on_the_device() {
        const M: u64 = 1 << 20;
        // Striped over two devices: 0 and 1 alternate, each contiguous on its own.
        let job = [(0, 0, M), (1, 0, M), (0, M, M)];
        let rest = [(1, M, M), (0, 2 * M, M), (1, 2 * M, M), (0, 9 * M, M)];
        assert_eq!(contiguous_ahead(&job, &rest), vec![2 * M, 2 * M, M]);
        // Nothing behind: the download's end.
        assert_eq!(contiguous_ahead(&[(0, 5, 10)], &[]), vec![0]);
        // A long download: capped.
        let long: Vec<(u16, u64, u64)> = (1..200).map(|i| (0, i * M, M)).collect();
        assert_eq!(contiguous_ahead(&[(0, 0, M)], &long), vec![AHEAD_MAX]);
    }

    #[test]
    fn the_default_settings_are_valid() {
        assert_eq!(EngineConfig::default().validate(), Ok(()));
    }

    #[test]
    fn a_pool_downloads_cannot_use_is_refused() {
        // The hang found with 16 buffers of 4 MiB: all of them kept for real-time streams.
        let cfg = EngineConfig { buffers: 16, rt_buffers: 16, buf_size: 4 << 20, ..EngineConfig::default() };
        let e = cfg.validate().unwrap_err();
        assert_eq!(e, ConfigError::TooFewBuffers { buffers: 16, rt_buffers: 16, window: 4, need: 20 });
        assert!(e.to_string().contains("need at least 20"), "{e}");
        // One short of a download's window beside the reserve is refused too; exactly
        // enough is accepted.
        let cfg = EngineConfig { buffers: 19, ..cfg };
        assert!(matches!(cfg.validate(), Err(ConfigError::TooFewBuffers { .. })));
        assert_eq!(EngineConfig { buffers: 20, ..cfg }.validate(), Ok(()));
    }

    #[test]
    fn other_impossible_settings_are_refused() {
        let d = EngineConfig::default();
        assert_eq!(EngineConfig { buf_size: 0, ..d.clone() }.validate(), Err(ConfigError::BufferSize(0)));
        assert_eq!(EngineConfig { buf_size: 5000, ..d.clone() }.validate(), Err(ConfigError::BufferSize(5000)));
        assert_eq!(EngineConfig { window: 0, ..d.clone() }.validate(), Err(ConfigError::Zero("window")));
        assert_eq!(EngineConfig { device_depth: 0, ..d.clone() }.validate(), Err(ConfigError::Zero("device_depth")));
        assert_eq!(EngineConfig { splice_pipes: 0, ..d.clone() }.validate(), Err(ConfigError::Zero("splice_pipes")));
        assert_eq!(EngineConfig { splice: false, splice_pipes: 0, ..d.clone() }.validate(), Ok(()));
        assert_eq!(EngineConfig { rt_reserve: 1.5, ..d.clone() }.validate(), Err(ConfigError::Reserve(1.5)));
        assert!(EngineConfig { rt_reserve: f64::NAN, ..d }.validate().is_err());
    }

    #[test]
    fn a_tick_wakes_a_stream_at_least_once_and_at_most_sqrt2_times_a_slot() {
        let ms = Duration::from_millis;
        assert_eq!(tick_level(Duration::from_micros(10)), (0, ms(1)), "under the ladder: the shortest");
        assert_eq!(tick_level(ms(1)), (0, ms(1)));
        assert_eq!(tick_level(ms(2)), (2, ms(2)));
        let mut levels = std::collections::BTreeSet::new();
        // Every period the engine asks for (1 ms to 60 s), in steps of 1 %.
        let mut p = 1e-3;
        while p <= 60.0 {
            let period = Duration::from_secs_f64(p);
            let (k, tick) = tick_level(period);
            assert!(k < TICK_LEVELS);
            assert!(tick <= period, "{period:?}: tick {tick:?} above the period");
            if k + 1 < TICK_LEVELS {
                assert!(tick.as_secs_f64() * 1.415 > p, "{period:?}: tick {tick:?} more than √2 below");
            }
            levels.insert(k);
            p *= 1.01;
        }
        assert_eq!(levels.len(), usize::from(TICK_LEVELS), "every level is used, none beyond");
        assert!(usize::from(TICK_LEVELS) < ictus_rt::upcall::DEFAULT_UPCALL_LIMIT, "all ticks fit the runtime's limit");
    }

    #[test]
    fn the_capacity_told_is_the_smallest_limit() {
        let d = EngineConfig::default();
        // A slow store: its real-time share is the limit.
        assert_eq!(paced_capacity(&d, 10e6), (10e6 * d.rt_reserve) as u64);
        // A fast store behind a small pool: the pool is. 64 buffers of 1 MiB, 16 kept
        // for real-time streams and 4 for a download: 44 MiB of floors of 0.5 s.
        let small = EngineConfig { buffers: 64, buf_size: 1 << 20, rt_buffers: 16, window: 4, ..d.clone() };
        assert_eq!(paced_capacity(&small, 10e9), (44.0 * 1048576.0 / 0.5) as u64);
        // And the pool's bound is above what the engine's own admission lets through:
        // at several rates, the streams whose floors fit, times their rate.
        for rate in [64e3, 1e6, 3e6, 16e6, 100e6] {
            let floor = small.readahead.floor_window(rate, small.buf_size as u64);
            let streams = (small.buffers - small.rt_buffers - small.window) / floor;
            assert!((streams as f64 * rate) as u64 <= paced_capacity(&small, 10e9), "{rate}");
        }
        assert_eq!(paced_capacity(&d, 0.0), 0);
    }
}
