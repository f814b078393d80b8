//! The client: a connection to the Tactus server, presentations, streams, items sent
//! ahead of their time.
//!
//! ```no_run
//! use ictus_tactus::{ConnectOptions, StreamSpec, Tactus};
//! let mut t = Tactus::connect(&ConnectOptions::default())?;
//! let p = t.open_presentation()?;
//! let midi = t.open_stream(p, &StreamSpec::midi("cable:synth"))?;
//! // A note at 0.5 s and its end at 1 s of the presentation, sent now.
//! t.send(midi, 500_000_000, 0, &[0x90, 60, 100])?;
//! t.send(midi, 1_000_000_000, 0, &[0x80, 60, 0])?;
//! t.start(p, 0, None)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ictus_abi::ReturnCode;
use ictus_idl::{interface, SendRight};
use ictus_ipc::{Name, Space};
use ictus_shm::{ClientOptions, Geometry, WaitConfig};

use crate::policy::LatePolicy;
use crate::proto::{self, flags, item, Control, ItemHeader, Report, StreamKind};

/// The name the server registers with the name server.
pub const SERVICE_NAME: &str = "tactus";

/// The server's port interface: how to reach its transports, and its counters.
#[interface(id = 4700)]
pub trait TactusService {
    /// A send right to the server's shared-memory channel service (`ictus-shm`), for a
    /// client of protocol `version`.
    #[id(0)]
    fn channel(&self, version: u32) -> Result<SendRight, ReturnCode>;
    /// The path of the server's socket transport (the sockets-throughout comparison).
    #[id(1)]
    fn socket(&self, version: u32) -> Result<String, ReturnCode>;
    /// The server's counters, as one line of JSON.
    #[id(2)]
    fn stats(&self) -> Result<String, ReturnCode>;
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock every due time is on.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// How items travel to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A shared-memory channel: items in its ring, large payloads in its pool.
    Shm,
    /// A stream socket carrying the same records (for comparison).
    Socket,
}

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// The transport.
    pub transport: Transport,
    /// The name server's socket (default: its default path).
    pub name_server: Option<PathBuf>,
    /// The name the server is registered under.
    pub service: String,
    /// The channel's rings and pool (shm).
    pub geometry: Geometry,
    /// How the channel's end waits.
    pub wait: WaitConfig,
    /// How long connecting, and a wait for room, may take.
    pub timeout: Duration,
}

impl Default for ConnectOptions {
    /// Shared memory; a 1 MiB request ring, a 256 KiB reply ring and no pool.
    fn default() -> Self {
        ConnectOptions {
            transport: Transport::Shm,
            name_server: None,
            service: SERVICE_NAME.to_owned(),
            geometry: Geometry::new(1 << 20, 256 << 10, 0, 0).expect("a valid geometry"),
            wait: WaitConfig { spin: Duration::ZERO, liveness: Duration::from_millis(20) },
            timeout: Duration::from_secs(10),
        }
    }
}

impl ConnectOptions {
    /// With a pool of `slots` buffers of `slot_bytes` each, for video frames.
    pub fn with_pool(mut self, slots: u32, slot_bytes: u32) -> ConnectOptions {
        let g = self.geometry;
        self.geometry = Geometry::new(g.request.cap, g.reply.cap, slots, slot_bytes).expect("a valid geometry");
        self
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The name server could not be reached.
    #[error("reaching the name server: {0} (is `ictus name-server` running?)")]
    NameServer(#[from] ictus_name_api::ConnectError),
    /// The server is not registered.
    #[error("looking up the Tactus server: {0} (is `ictus tactus serve` running?)")]
    Lookup(#[from] ictus_name_api::ClientError),
    /// The server died, or dropped the request, before answering.
    #[error("the Tactus server died before answering (is `ictus tactus serve` running?)")]
    ServerDied,
    /// The server did not answer, or had no room for the request, in time.
    #[error("the Tactus server did not answer within {0:?}")]
    TimedOut(Duration),
    /// The server refused or failed.
    #[error("asking the Tactus server: {0}")]
    Call(String),
    /// The channel could not be opened.
    #[error("the shared-memory channel: {0}")]
    Shm(#[from] ictus_shm::ConnectError),
    /// The socket could not be opened.
    #[error("the Tactus socket: {0}")]
    Socket(#[from] std::io::Error),
}

impl ConnectError {
    /// A call to the service port that failed, classified as every client's are
    /// ([`ictus_idl::CallFailure`]); `timeout` is the one the call had.
    fn stub<E: std::fmt::Debug>(e: ictus_idl::ClientError<E>, timeout: Duration) -> ConnectError {
        match e {
            ictus_idl::ClientError::Call(e) => match ictus_idl::CallFailure::from(e) {
                ictus_idl::CallFailure::ServerDied => ConnectError::ServerDied,
                ictus_idl::CallFailure::TimedOut => ConnectError::TimedOut(timeout),
                ictus_idl::CallFailure::Other(e) => ConnectError::Call(e.to_string()),
            },
            e => ConnectError::Call(e.to_string()),
        }
    }
}

/// Why a request could not be sent or an answer read.
#[derive(Debug, thiserror::Error)]
pub enum TactusError {
    /// No room in time: the server is not taking items (or the pool is all lent).
    #[error("the Tactus server took nothing for {0:?}")]
    TimedOut(Duration),
    /// The connection is gone.
    #[error("the Tactus server closed the connection: {0}")]
    Closed(String),
    /// Something this library refuses to send.
    #[error("{0}")]
    Invalid(String),
    /// The server sent something that does not decode.
    #[error("the Tactus server sent a malformed report: {0}")]
    Malformed(#[from] proto::DecodeError),
}

/// A presentation: a time map that its streams follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PresentationId(pub u32);

/// A stream of a presentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

/// What a stream is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSpec {
    /// What it carries.
    pub kind: StreamKind,
    /// Where it goes (`display`, `wav:PATH[,skew=PPM]`, `cable:NAME`, `null`).
    pub device: String,
    /// What to do with late items.
    pub policy: LatePolicy,
    /// Report every item's delivery ([`Report::Delivered`]).
    pub report: bool,
    /// (Audio) this device's clock is the presentation's clock.
    pub master: bool,
}

impl StreamSpec {
    /// Video frames of `width × height` to the display server; a frame more than half
    /// a frame period late (at 30 fps) is dropped.
    pub fn video(width: u16, height: u16) -> StreamSpec {
        StreamSpec {
            kind: StreamKind::Video { width, height },
            device: "display".into(),
            policy: LatePolicy::DropAfter(Duration::from_millis(16)),
            report: false,
            master: false,
        }
    }

    /// 16-bit audio to `device`; every block is played (late samples are trimmed by
    /// the device).
    pub fn audio(rate: u32, channels: u16, device: &str) -> StreamSpec {
        StreamSpec {
            kind: StreamKind::Audio { rate, channels },
            device: device.into(),
            policy: LatePolicy::Show,
            report: false,
            master: false,
        }
    }

    /// MIDI messages to `device` (a MIDI device spec: `cable:NAME`, a raw MIDI file).
    pub fn midi(device: &str) -> StreamSpec {
        StreamSpec {
            kind: StreamKind::Midi,
            device: device.into(),
            policy: LatePolicy::Show,
            report: false,
            master: false,
        }
    }

    /// Any payload, delivered at its time to `device` (`null`).
    pub fn data(device: &str) -> StreamSpec {
        StreamSpec {
            kind: StreamKind::Data,
            device: device.into(),
            policy: LatePolicy::Show,
            report: false,
            master: false,
        }
    }

    /// Report each item's delivery.
    pub fn reported(mut self) -> StreamSpec {
        self.report = true;
        self
    }

    /// Make this audio stream's device clock the presentation's clock.
    pub fn master(mut self) -> StreamSpec {
        self.master = true;
        self
    }

    /// Another late policy.
    pub fn policy(mut self, p: LatePolicy) -> StreamSpec {
        self.policy = p;
        self
    }

    /// Another device.
    pub fn device(mut self, d: &str) -> StreamSpec {
        self.device = d.into();
        self
    }
}

#[derive(Debug)]
enum Conn {
    Shm(Box<ictus_shm::Client>),
    Socket { stream: UnixStream, inbuf: Vec<u8>, out: Vec<u8> },
}

#[derive(Debug, Default)]
struct StreamState {
    pres: u32,
    seq: u64,
}

/// A connection to the Tactus server.
#[derive(Debug)]
pub struct Tactus {
    conn: Conn,
    timeout: Duration,
    next_id: u32,
    epochs: HashMap<u32, u32>,
    streams: HashMap<u32, StreamState>,
    reports: VecDeque<Report>,
    scratch: Vec<u8>,
}

/// Items up to this size travel in the ring; larger ones in a pool buffer if the
/// channel has one.
pub const INLINE_MAX: usize = 16 << 10;

impl Tactus {
    /// Find the server through the name server and connect.
    pub fn connect(opts: &ConnectOptions) -> Result<Tactus, ConnectError> {
        let space = Space::new();
        let ns = match &opts.name_server {
            Some(p) => ictus_name_api::Client::connect_socket(&space, p)?,
            None => ictus_name_api::Client::connect(&space)?,
        };
        let service = ns.lookup(&opts.service)?;
        Tactus::connect_to(&space, service, opts)
    }

    /// Connect through `service`, a send right in `space` to the server's port.
    pub fn connect_to(space: &Space, service: Name, opts: &ConnectOptions) -> Result<Tactus, ConnectError> {
        let stubs = TactusServiceClient::new(space, service).with_timeout(opts.timeout);
        let conn = match opts.transport {
            Transport::Shm => {
                let svc = stubs.channel(proto::VERSION).map_err(|e| ConnectError::stub(e, opts.timeout))?;
                let copts = ClientOptions { geometry: opts.geometry, wait: opts.wait, timeout: opts.timeout };
                let c = ictus_shm::Client::connect(space, svc.name, copts);
                let _ = space.deallocate(svc.name);
                Conn::Shm(Box::new(c?))
            }
            Transport::Socket => {
                let path = stubs.socket(proto::VERSION).map_err(|e| ConnectError::stub(e, opts.timeout))?;
                let stream = UnixStream::connect(path)?;
                Conn::Socket { stream, inbuf: Vec::new(), out: Vec::new() }
            }
        };
        Ok(Tactus {
            conn,
            timeout: opts.timeout,
            next_id: 1,
            epochs: HashMap::new(),
            streams: HashMap::new(),
            reports: VecDeque::new(),
            scratch: Vec::new(),
        })
    }

    /// The transport in use.
    pub fn transport(&self) -> Transport {
        match self.conn {
            Conn::Shm(_) => Transport::Shm,
            Conn::Socket { .. } => Transport::Socket,
        }
    }

    /// How long a send may wait for room.
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    fn send_record(&mut self, tag: u32, bytes: &[u8]) -> Result<(), TactusError> {
        match &mut self.conn {
            Conn::Shm(c) => c.send_wait(tag, bytes, Some(self.timeout)).map_err(|e| match e {
                ictus_shm::SendError::TimedOut => TactusError::TimedOut(self.timeout),
                ictus_shm::SendError::TooLarge { .. } => TactusError::Invalid(e.to_string()),
                e => TactusError::Closed(e.to_string()),
            }),
            Conn::Socket { stream, out, .. } => {
                out.clear();
                proto::frame(tag, bytes, out);
                stream.write_all(out).map_err(|e| TactusError::Closed(e.to_string()))
            }
        }
    }

    fn control(&mut self, c: &Control) -> Result<(), TactusError> {
        let mut b = std::mem::take(&mut self.scratch);
        b.clear();
        c.encode(&mut b);
        let r = self.send_record(proto::TAG_CONTROL, &b);
        self.scratch = b;
        r
    }

    /// Open a presentation (stopped, at logical 0, epoch 0).
    pub fn open_presentation(&mut self) -> Result<PresentationId, TactusError> {
        let id = self.next_id;
        self.next_id += 1;
        self.control(&Control::OpenPresentation { id })?;
        self.epochs.insert(id, 0);
        Ok(PresentationId(id))
    }

    /// Close a presentation and its streams.
    pub fn close_presentation(&mut self, p: PresentationId) -> Result<(), TactusError> {
        self.control(&Control::ClosePresentation { id: p.0 })?;
        self.epochs.remove(&p.0);
        self.streams.retain(|_, s| s.pres != p.0);
        Ok(())
    }

    /// Open a stream of presentation `p`.
    pub fn open_stream(&mut self, p: PresentationId, spec: &StreamSpec) -> Result<StreamId, TactusError> {
        if !self.epochs.contains_key(&p.0) {
            return Err(TactusError::Invalid(format!("no presentation {}", p.0)));
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut f = 0;
        if spec.report {
            f |= flags::REPORT;
        }
        if spec.master {
            f |= flags::MASTER;
        }
        self.control(&Control::OpenStream {
            id,
            presentation: p.0,
            kind: spec.kind,
            flags: f,
            policy: spec.policy.to_wire(),
            device: spec.device.clone(),
        })?;
        self.streams.insert(id, StreamState { pres: p.0, seq: 0 });
        Ok(StreamId(id))
    }

    /// Close a stream; what the server holds of it is flushed.
    pub fn close_stream(&mut self, s: StreamId) -> Result<(), TactusError> {
        self.control(&Control::CloseStream { id: s.0 })?;
        self.streams.remove(&s.0);
        Ok(())
    }

    /// Say that no more items come on `s` (until a seek).
    pub fn end_stream(&mut self, s: StreamId) -> Result<(), TactusError> {
        self.control(&Control::EndStream { id: s.0 })
    }

    /// Start `p` from logical time `logical`, at `at` (`CLOCK_MONOTONIC` ns) or as soon
    /// as its devices allow.
    pub fn start(&mut self, p: PresentationId, logical: i64, at: Option<u64>) -> Result<(), TactusError> {
        self.control(&Control::Start { presentation: p.0, logical, at: at.unwrap_or(0) })
    }

    /// Pause `p`.
    pub fn pause(&mut self, p: PresentationId) -> Result<(), TactusError> {
        self.control(&Control::Pause { presentation: p.0 })
    }

    /// Resume `p`.
    pub fn resume(&mut self, p: PresentationId) -> Result<(), TactusError> {
        self.control(&Control::Resume { presentation: p.0 })
    }

    /// Seek `p` to `logical`: a new epoch; items sent after this are of it. Returns it.
    pub fn seek(&mut self, p: PresentationId, logical: i64) -> Result<u32, TactusError> {
        self.control(&Control::Seek { presentation: p.0, logical })?;
        let e = self.epochs.entry(p.0).or_default();
        *e += 1;
        Ok(*e)
    }

    /// Change `p`'s rate.
    pub fn set_rate(&mut self, p: PresentationId, rate: f64) -> Result<(), TactusError> {
        if crate::timemap::Rate::new(rate).is_none() {
            return Err(TactusError::Invalid(format!("rate {rate} (between 1/16 and 16)")));
        }
        self.control(&Control::Rate { presentation: p.0, rate })
    }

    /// Ask for a status report now.
    pub fn request_status(&mut self) -> Result<(), TactusError> {
        self.control(&Control::Status)
    }

    fn header(&mut self, s: StreamId, logical: i64, duration: u64, len: usize) -> Result<ItemHeader, TactusError> {
        let st = self.streams.get_mut(&s.0).ok_or_else(|| TactusError::Invalid(format!("no stream {}", s.0)))?;
        let epoch = *self.epochs.get(&st.pres).unwrap_or(&0);
        st.seq += 1;
        let len = u32::try_from(len).map_err(|_| TactusError::Invalid(format!("an item of {len} bytes")))?;
        Ok(ItemHeader { stream: s.0, epoch, seq: st.seq, logical, duration, sent: monotonic_ns(), len, flags: 0 })
    }

    /// Send an item: `payload` presented at logical time `logical` for `duration` ns.
    /// Small payloads travel in the ring, large ones in a pool buffer when the channel
    /// has one. Returns its sequence number.
    pub fn send(&mut self, s: StreamId, logical: i64, duration: u64, payload: &[u8]) -> Result<u64, TactusError> {
        self.send_with(s, payload.len(), logical, duration, |b| {
            b.copy_from_slice(payload);
            Ok(())
        })
    }

    /// Send an item of `len` bytes that `fill` writes in place: into a buffer lent
    /// from the channel's pool when the payload is large and the channel has one (a
    /// frame read from disk straight into shared memory, never copied on its way to
    /// the server), else into the record itself. If `fill` fails nothing is sent.
    /// Waits (up to the timeout) for a pool buffer or ring room. Returns the item's
    /// sequence number.
    pub fn send_with(
        &mut self,
        s: StreamId,
        len: usize,
        logical: i64,
        duration: u64,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64, TactusError> {
        let use_pool = len > INLINE_MAX
            && matches!(&self.conn, Conn::Shm(c) if c.geometry().pool.slots > 0 && len <= c.geometry().pool.slot_size as usize);
        let h = self.header(s, logical, duration, len)?;
        if use_pool {
            let timeout = self.timeout;
            let Conn::Shm(c) = &mut self.conn else { unreachable!("checked above") };
            let deadline = Instant::now() + timeout;
            while c.pool_free() == 0 {
                if let Some(r) = c.closed() {
                    return Err(TactusError::Closed(r.to_string()));
                }
                if Instant::now() >= deadline {
                    return Err(TactusError::TimedOut(timeout));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            let mut loan = c.loan_pool(len).map_err(|e| TactusError::Closed(e.to_string()))?;
            fill(&mut loan[..len]).map_err(|e| TactusError::Invalid(format!("filling the item: {e}")))?;
            loan.commit(proto::TAG_POOL_ITEM).map_err(|e| TactusError::Closed(e.to_string()))?;
            let mut b = [0u8; ItemHeader::LEN];
            ItemHeader { flags: item::ATTACHED, sent: monotonic_ns(), ..h }.write(&mut b);
            self.send_record(proto::TAG_ITEM, &b)?;
            return Ok(h.seq);
        }
        let mut b = std::mem::take(&mut self.scratch);
        b.clear();
        b.resize(ItemHeader::LEN + len, 0);
        let r = fill(&mut b[ItemHeader::LEN..]).map_err(|e| TactusError::Invalid(format!("filling the item: {e}")));
        let r = r.and_then(|()| {
            ItemHeader { sent: monotonic_ns(), ..h }.write(&mut b);
            self.send_record(proto::TAG_ITEM, &b)
        });
        self.scratch = b;
        r.map(|()| h.seq)
    }

    /// Read what the server sent, waiting at most `timeout` for something.
    fn read_reports(&mut self, timeout: Duration) -> Result<(), TactusError> {
        match &mut self.conn {
            Conn::Shm(c) => {
                let (tag, bytes) = match c.recv(Some(timeout)) {
                    Ok(r) => (r.tag(), r.to_vec()),
                    Err(ictus_shm::RecvError::TimedOut) => return Ok(()),
                    Err(ictus_shm::RecvError::Closed(r)) => return Err(TactusError::Closed(r.to_string())),
                };
                self.reports.push_back(Report::decode(tag, &bytes)?);
                // Take whatever else is there without waiting.
                while let Ok(Some(r)) = c.try_recv() {
                    let (tag, bytes) = (r.tag(), r.to_vec());
                    drop(r);
                    self.reports.push_back(Report::decode(tag, &bytes)?);
                }
                Ok(())
            }
            Conn::Socket { stream, inbuf, .. } => {
                stream
                    .set_read_timeout(Some(timeout.max(Duration::from_micros(1))))
                    .map_err(|e| TactusError::Closed(e.to_string()))?;
                let at = inbuf.len();
                inbuf.resize(at + (64 << 10), 0);
                match stream.read(&mut inbuf[at..]) {
                    Ok(0) => {
                        inbuf.truncate(at);
                        return Err(TactusError::Closed("end of file".into()));
                    }
                    Ok(n) => inbuf.truncate(at + n),
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        inbuf.truncate(at);
                    }
                    Err(e) => {
                        inbuf.truncate(at);
                        return Err(TactusError::Closed(e.to_string()));
                    }
                }
                let mut used = 0;
                while let Some((tag, payload, n)) = proto::unframe(&inbuf[used..])? {
                    self.reports.push_back(Report::decode(tag, payload)?);
                    used += n;
                }
                inbuf.drain(..used);
                Ok(())
            }
        }
    }

    /// The next report from the server, waiting at most `timeout`.
    pub fn next_report(&mut self, timeout: Duration) -> Result<Option<Report>, TactusError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.reports.pop_front() {
                return Ok(Some(r));
            }
            let now = Instant::now();
            if now >= deadline {
                self.read_reports(Duration::ZERO)?;
                return Ok(self.reports.pop_front());
            }
            self.read_reports(deadline - now)?;
        }
    }

    /// Reports already received and those waiting now, without blocking.
    pub fn drain_reports(&mut self) -> Result<Vec<Report>, TactusError> {
        self.read_reports(Duration::ZERO)?;
        Ok(self.reports.drain(..).collect())
    }

    /// Wait (at most `timeout`) for a status report and return it; other reports stay
    /// queued for [`Tactus::next_report`].
    pub fn status(&mut self, timeout: Duration) -> Result<Option<proto::Status>, TactusError> {
        self.request_status()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = self.reports.iter().position(|r| matches!(r, Report::Status(_))) {
                let Some(Report::Status(s)) = self.reports.remove(i) else { unreachable!() };
                return Ok(Some(s));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.read_reports(deadline - now)?;
        }
    }

    /// The current epoch of `p` (bumped by each [`Tactus::seek`]).
    pub fn epoch(&self, p: PresentationId) -> u32 {
        self.epochs.get(&p.0).copied().unwrap_or(0)
    }

    /// Counters of the shared-memory channel.
    pub fn shm_stats(&self) -> Option<ictus_shm::ClientStats> {
        match &self.conn {
            Conn::Shm(c) => Some(c.stats()),
            Conn::Socket { .. } => None,
        }
    }
}

/// A descriptor readable when the server may have sent something.
impl AsFd for Tactus {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.conn {
            Conn::Shm(c) => c.as_fd(),
            Conn::Socket { stream, .. } => stream.as_fd(),
        }
    }
}
