//! The `shm` experiment: shared-memory channels (papers 002 §3, 000 §8.4) beside
//! iceoryx2, a raw futex ping-pong over shared memory, and ictus port messages.
//!
//! Every transport is a client in this process and a server in a child process.
//! Cases, each measured with its peers in interleaved rounds (A B C, B C A, …):
//!
//! - **64 B round trip, spinning**: client on CPU 0, servers on CPU 1 (when there are
//!   two), both ends polling: ours (`ictus-shm`, both ends spinning) beside iceoryx2's
//!   publish-subscribe ping-pong (busy-polling, as its own benchmark does), the futex
//!   peer (which polls 50 µs across CPUs before it sleeps) and a port call.
//! - **64 B round trip, blocking**: everything on CPU 0, nobody spins: ours with zero
//!   spin (the server sleeps in `futex_waitv`, the client in `FUTEX_WAIT`) beside the
//!   futex peer (which never polls on one CPU) and a port call.
//! - **small-record throughput**: bursts of 64 pipelined 64 B requests, each answered
//!   with 8 bytes, ours beside port send/receive on two long-lived ports.
//! - **wake-ups per message, 8 clients**: eight client threads each send bursts of 16
//!   records with pauses between; ours counts the system calls clients make to wake
//!   the server (`FUTEX_WAKE` or eventfd writes). A socket or port costs one
//!   notification per message: the peer is 1.0 by construction.
//! - **large buffers through loans**: a frame written into a pool buffer (before
//!   timing, as a producer would), committed, touched page by page by the server,
//!   answered with 8 bytes; beside a port call with the frame out-of-line (sealed
//!   memfd, mapped by the server) and the futex peer (which copies the frame into its
//!   shared area, the way a transport without loans must).
//!
//! Servers here spin for 2 ms at most before they sleep, so a server whose turn is
//! over stops competing for the CPU its successor's server uses; each batch starts
//! with a few untimed round trips that bring both ends back to polling.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use ictus_ipc::{Disposition, Message, Name, PortArg, ReceiveOptions, Received, SendOptions, Space};
use ictus_shm::{Client, ClientOptions, Geometry, Next, Server, ServerConfig, WaitConfig};
use serde_json::json;

use crate::child::{fd_arg, num_arg, reap, spawn_child};
use crate::conditions::Conditions;
use crate::ipc::Transport;
use crate::peers::FutexPeer;
use crate::pin;
use crate::ports::{PortMode, PortTransport};
use crate::report::{Better, Headline, PaperFigure, Report};
use crate::stats::{LatencyRecorder, Throughput};
use crate::svg::{Axis, Plot, Scale, Series, TickFormat};
use crate::{format_ns, format_size, BenchError};

/// Tag of records the shm server echoes.
const ECHO: u32 = 1;
/// Tag of records the shm server consumes without answering.
const SINK: u32 = 2;
/// Tag of records answered with 8 bytes.
const ACK: u32 = 3;
/// The payload of the round-trip cases.
const SMALL: usize = 64;
/// Reply of the throughput and loan cases.
const ACK_LEN: usize = 8;
/// Requests per throughput burst (below the port queue limit of 128).
const BURST: usize = 64;
/// Records per burst of one client in the wake-up case.
const WAKE_BURST: usize = 16;
/// Clients of the wake-up case.
const WAKE_CLIENTS: usize = 8;
/// Frame sizes of the loan case.
const LOAN_SIZES: &[usize] = &[64 << 10, 1 << 20, 8 << 20];
/// How long a bench server polls before it sleeps, in the spinning case.
const SERVER_SPIN: Duration = Duration::from_millis(2);

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

// ----- our transport ---------------------------------------------------------------------

/// A channel to an `shm-echo` server in its own process.
#[derive(Debug)]
pub struct ShmTransport {
    name: &'static str,
    /// Taken in `drop`, so the server sees its last channel close before it is reaped.
    client: Option<Client>,
    child: Child,
    space: Space,
    service: Name,
    opts: ClientOptions,
    buf: Vec<u8>,
}

impl ShmTransport {
    /// Spawns a server polling for `server_spin` before it sleeps, and connects with
    /// the client waiting the same way; `slots` pool buffers of `slot_size` bytes.
    pub fn spawn(name: &'static str, spin: Duration, slots: u32, slot_size: u32) -> io::Result<ShmTransport> {
        let space = Space::new();
        let setup = space.allocate_port().map_err(other)?;
        let fd = space.send_right_fd(setup).map_err(other)?;
        let args = [fd.as_raw_fd().to_string(), spin.as_micros().to_string()];
        let child = spawn_child("shm-echo", &args, &[fd.as_fd()])?;
        drop(fd);
        let mut hello = Received::new();
        let ropts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), populate_ool: false };
        space.receive(setup, &mut hello, ropts).map_err(other)?;
        let service = hello.ports.first().map(|r| r.name).ok_or_else(|| other("shm server sent no port"))?;
        let _ = space.destroy(setup);
        let geometry = Geometry::new(64 << 10, 64 << 10, slots, slot_size).map_err(other)?;
        let wait = WaitConfig { spin, liveness: Duration::from_millis(20) };
        let opts = ClientOptions { geometry, wait, timeout: Duration::from_secs(30) };
        let client = Client::connect(&space, service, opts).map_err(other)?;
        Ok(ShmTransport { name, client: Some(client), child, space, service, opts, buf: vec![0; 64 << 10] })
    }

    /// Another channel to the same server.
    pub fn another_channel(&self) -> io::Result<Client> {
        Client::connect(&self.space, self.service, self.opts).map_err(other)
    }

    fn client(&mut self) -> io::Result<&mut Client> {
        self.client.as_mut().ok_or_else(|| other("closed"))
    }

    fn round_trip(&mut self, tag: u32, size: usize) -> io::Result<()> {
        let timeout = Some(Duration::from_secs(30));
        let Some(client) = self.client.as_mut() else { return Err(other("closed")) };
        client.send_wait(tag, &self.buf[..size], timeout).map_err(other)?;
        let r = client.recv(timeout).map_err(other)?;
        r.payload().copy_to(&mut self.buf[..SMALL]);
        Ok(())
    }

    /// Round trips of `size`-byte frames through pool loans (filled before timing).
    pub fn loan_round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        let mut out = Vec::with_capacity(iters);
        for i in 0..iters {
            let client = self.client()?;
            let mut loan = loop {
                match client.loan_pool(size) {
                    Ok(l) => break l,
                    Err(ictus_shm::SendError::Full) => std::hint::spin_loop(),
                    Err(e) => return Err(other(e)),
                }
            };
            loan.fill(i as u8 | 1);
            let t0 = Instant::now();
            loan.commit(ACK).map_err(other)?;
            drop(client.recv(Some(Duration::from_secs(30))).map_err(other)?);
            out.push(elapsed_ns(t0));
        }
        Ok(out)
    }

    /// Bursts of `BURST` pipelined `size`-byte requests answered with 8 bytes;
    /// returns messages per second.
    pub fn burst_rate(&mut self, size: usize, bursts: usize) -> io::Result<f64> {
        let t0 = Instant::now();
        let timeout = Some(Duration::from_secs(30));
        let Some(client) = self.client.as_mut() else { return Err(other("closed")) };
        for _ in 0..bursts {
            for _ in 0..BURST {
                client.send_wait(ACK, &self.buf[..size], timeout).map_err(other)?;
            }
            for _ in 0..BURST {
                drop(client.recv(timeout).map_err(other)?);
            }
        }
        Ok((bursts * BURST) as f64 / t0.elapsed().as_secs_f64())
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        "ictus-shm channel (request and reply rings)"
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t0 = Instant::now();
            self.round_trip(ECHO, size)?;
            out.push(elapsed_ns(t0));
        }
        Ok(out)
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        // Closing the client ends the server: it exits when its last channel closes.
        drop(self.client.take());
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// Child role `shm-echo <setup-fd> <spin-µs>`: an ictus-shm server. `ECHO` records come
/// back as they are; `ACK` records (and pool frames, touched page by page) get 8
/// bytes; `SINK` records nothing. Exits when its last client has gone.
pub fn shm_server(args: &[String]) -> i32 {
    let run = || -> io::Result<()> {
        let fd = fd_arg(args.first().map_or("", String::as_str))?;
        let spin = Duration::from_micros(num_arg(args, 1, "spin")? as u64);
        let space = Space::new();
        let setup = space.insert_send_fd(fd).map_err(other)?;
        let wait = WaitConfig { spin, liveness: Duration::from_millis(20) };
        let mut server = Server::new(&space, ServerConfig { wait, ..ServerConfig::default() }).map_err(other)?;
        let mut m = Message::new(1, Vec::new());
        m.ports.push(PortArg::new(server.service(), Disposition::MakeSend));
        space.send(setup, &mut m, SendOptions::default()).map_err(other)?;
        let _ = space.deallocate(setup);
        let (mut opened, mut closed) = (0u64, 0u64);
        let started = Instant::now();
        let mut scratch = [0u8; 64 << 10];
        let ack = [0u8; ACK_LEN];
        let mut sink = 0u64;
        loop {
            server.wait(Some(Duration::from_millis(100))).map_err(other)?;
            while let Some(next) = server.try_next() {
                match next {
                    Next::Event(ictus_shm::Event::Opened { .. }) => opened += 1,
                    Next::Event(ictus_shm::Event::Closed { .. }) => closed += 1,
                    Next::Record(mut r) => {
                        let p = r.payload();
                        if r.is_pool() {
                            sink = sink.wrapping_add(p.touch_pages());
                            let _ = r.reply(0, &ack);
                        } else if r.tag() == ECHO {
                            let n = p.copy_to(&mut scratch);
                            let _ = r.reply(0, &scratch[..n]);
                        } else if r.tag() == ACK {
                            sink = sink.wrapping_add(p.touch_pages());
                            let _ = r.reply(0, &ack);
                        }
                    }
                }
            }
            if opened > 0 && opened == closed {
                break;
            }
            if opened == 0 && started.elapsed() > Duration::from_secs(60) {
                return Err(other("no client came"));
            }
        }
        std::hint::black_box(sink);
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("shm-echo: {e}");
            1
        }
    }
}

// ----- iceoryx2 ---------------------------------------------------------------------------

type IceService = iceoryx2::service::ipc::Service;
/// The payload that tells the iceoryx2 echo to exit cleanly (its node then removes
/// its own files).
const ICE_STOP: [u8; SMALL] = [0xee; SMALL];
type Payload64 = [u8; SMALL];
type IcePublisher = iceoryx2::port::publisher::Publisher<IceService, Payload64, ()>;
type IceSubscriber = iceoryx2::port::subscriber::Subscriber<IceService, Payload64, ()>;

/// iceoryx2 publish-subscribe ping-pong with an `iceoryx2-echo` child.
pub struct IceoryxTransport {
    _node: iceoryx2::node::Node<IceService>,
    publisher: IcePublisher,
    subscriber: IceSubscriber,
    child: Child,
}

impl std::fmt::Debug for IceoryxTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IceoryxTransport").field("child", &self.child.id()).finish()
    }
}

fn ice_names(tag: &str) -> (String, String) {
    (format!("ictus-bench/{tag}/ping"), format!("ictus-bench/{tag}/pong"))
}

fn ice_ports(
    node: &iceoryx2::node::Node<IceService>,
    publish: &str,
    subscribe: &str,
) -> io::Result<(IcePublisher, IceSubscriber)> {
    use iceoryx2::prelude::*;
    let service = |name: &str| -> io::Result<_> {
        let name: ServiceName = name.try_into().map_err(|e| other(format!("{e:?}")))?;
        node.service_builder(&name)
            .publish_subscribe::<Payload64>()
            .max_publishers(1)
            .max_subscribers(1)
            .history_size(0)
            .subscriber_max_buffer_size(1)
            .open_or_create()
            .map_err(|e| other(format!("{e:?}")))
    };
    let publisher = service(publish)?.publisher_builder().create().map_err(|e| other(format!("{e:?}")))?;
    let subscriber = service(subscribe)?.subscriber_builder().create().map_err(|e| other(format!("{e:?}")))?;
    Ok((publisher, subscriber))
}

fn ice_send(p: &IcePublisher, v: &Payload64) -> io::Result<()> {
    let s = p.loan_uninit().map_err(|e| other(format!("{e:?}")))?;
    s.write_payload(*v).send().map_err(|e| other(format!("{e:?}")))?;
    Ok(())
}

impl IceoryxTransport {
    /// Spawns the echo child and waits until a ping comes back.
    pub fn spawn() -> io::Result<IceoryxTransport> {
        use iceoryx2::prelude::*;
        let tag = format!("{}-{}", std::process::id(), Instant::now().elapsed().as_nanos());
        let (ping, pong) = ice_names(&tag);
        set_log_level(LogLevel::Error);
        let node = NodeBuilder::new().create::<ipc::Service>().map_err(|e| other(format!("{e:?}")))?;
        let (publisher, subscriber) = ice_ports(&node, &ping, &pong)?;
        let child = spawn_child("iceoryx2-echo", &[tag], &[])?;
        let mut t = IceoryxTransport { _node: node, publisher, subscriber, child };
        // The echo's subscriber may not exist yet: ping until a pong comes back.
        let start = Instant::now();
        'outer: loop {
            ice_send(&t.publisher, &[1; SMALL])?;
            let sent = Instant::now();
            while sent.elapsed() < Duration::from_millis(5) {
                if t.subscriber.receive().map_err(|e| other(format!("{e:?}")))?.is_some() {
                    break 'outer;
                }
            }
            if start.elapsed() > Duration::from_secs(20) {
                return Err(other("iceoryx2 echo did not answer"));
            }
            if let Ok(Some(s)) = t.child.try_wait() {
                return Err(other(format!("iceoryx2 echo exited: {s}")));
            }
        }
        // Drain stragglers.
        std::thread::sleep(Duration::from_millis(10));
        while t.subscriber.receive().map_err(|e| other(format!("{e:?}")))?.is_some() {}
        Ok(t)
    }
}

impl Transport for IceoryxTransport {
    fn name(&self) -> &str {
        "iceoryx2"
    }

    fn description(&self) -> &str {
        "iceoryx2 0.10 publish-subscribe ping-pong, busy-polling"
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        if size != SMALL {
            return Err(other("iceoryx2 peer is built for 64-byte payloads"));
        }
        let mut out = Vec::with_capacity(iters);
        let msg = [7u8; SMALL];
        for _ in 0..iters {
            let t0 = Instant::now();
            ice_send(&self.publisher, &msg)?;
            loop {
                if let Some(s) = self.subscriber.receive().map_err(|e| other(format!("{e:?}")))? {
                    std::hint::black_box(s.payload()[0]);
                    break;
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err(other("iceoryx2 echo stopped answering"));
                }
                std::hint::spin_loop();
            }
            out.push(elapsed_ns(t0));
        }
        Ok(out)
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }
}

impl Drop for IceoryxTransport {
    fn drop(&mut self) {
        let _ = ice_send(&self.publisher, &ICE_STOP);
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// Child role `iceoryx2-echo <tag>`: answers every ping with a pong of the same
/// payload, busy-polling while traffic flows and napping after 2 ms without any.
pub fn iceoryx2_server(args: &[String]) -> i32 {
    let run = || -> io::Result<()> {
        use iceoryx2::prelude::*;
        let tag = args.first().ok_or_else(|| other("missing tag"))?;
        let (ping, pong) = ice_names(tag);
        set_log_level(LogLevel::Error);
        let node = NodeBuilder::new().create::<ipc::Service>().map_err(|e| other(format!("{e:?}")))?;
        let (publisher, subscriber) = ice_ports(&node, &pong, &ping)?;
        let parent = rustix::process::getppid();
        let mut idle = Instant::now();
        loop {
            if let Some(s) = subscriber.receive().map_err(|e| other(format!("{e:?}")))? {
                let v: Payload64 = *s.payload();
                drop(s);
                if v == ICE_STOP {
                    return Ok(());
                }
                ice_send(&publisher, &v)?;
                idle = Instant::now();
            } else if idle.elapsed() > SERVER_SPIN {
                std::thread::sleep(Duration::from_micros(200));
                if rustix::process::getppid() != parent {
                    return Ok(());
                }
            } else {
                std::hint::spin_loop();
            }
        }
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("iceoryx2-echo: {e}");
            1
        }
    }
}

// ----- measurement ------------------------------------------------------------------------

/// Options of `ictus bench shm`.
#[derive(Debug, Clone, Default)]
pub struct ShmOptions {
    /// Seconds instead of minutes.
    pub quick: bool,
    /// Where to write the JSON report (the plot goes beside it).
    pub json: Option<PathBuf>,
}

/// `ictus bench shm [--quick] [--json FILE]`.
pub fn main(quick: bool, json: Option<PathBuf>) -> Result<(), BenchError> {
    let report = run(&ShmOptions { quick, json })?;
    report.print_table();
    Ok(())
}

struct Measured {
    name: String,
    description: String,
    rec: LatencyRecorder,
    failed: Option<String>,
}

/// Spawns transports with servers pinned to `server_cpu`, then pins this thread to
/// `client_cpu`.
fn spawn_pinned<T>(server_cpu: usize, client_cpu: usize, f: impl FnOnce() -> T) -> io::Result<T> {
    pin::pin_current_thread(server_cpu)?;
    let t = f();
    pin::pin_current_thread(client_cpu)?;
    Ok(t)
}

/// Interleaved rounds of round trips of `size` bytes; `warm` untimed ones start each batch.
fn interleave(
    ts: &mut [Box<dyn Transport>],
    size: usize,
    rounds: usize,
    per_round: usize,
    warm: usize,
) -> Vec<Measured> {
    let mut out: Vec<Measured> = ts
        .iter()
        .map(|t| Measured {
            name: t.name().to_string(),
            description: t.description().to_string(),
            rec: LatencyRecorder::new(),
            failed: None,
        })
        .collect();
    let n = ts.len();
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            if out[i].failed.is_some() {
                continue;
            }
            let r = ts[i].round_trips(size, warm).and_then(|_| ts[i].round_trips(size, per_round));
            match r {
                Ok(s) => out[i].rec.record_all(&s),
                Err(e) => out[i].failed = Some(e.to_string()),
            }
        }
    }
    out
}

fn spawn_or_note<T: Transport + 'static>(
    r: io::Result<T>,
    what: &str,
    ts: &mut Vec<Box<dyn Transport>>,
    notes: &mut Vec<String>,
) {
    match r {
        Ok(t) => ts.push(Box::new(t)),
        Err(e) => notes.push(format!("{what} could not run here: {e}")),
    }
}

/// Runs the experiment, writes the JSON and SVG if asked, and returns the report.
pub fn run(opts: &ShmOptions) -> Result<Report, BenchError> {
    let started = Instant::now();
    let mut conditions = Conditions::capture_before();
    let mut notes = Vec::new();
    let saved = pin::saved_affinity().map_err(|e| BenchError::io("reading CPU affinity", e))?;
    let cpus = conditions.cpus;
    let server_cpu = if cpus >= 2 { 1 } else { 0 };
    let q = opts.quick;
    let (rounds, per_round) = if q { (20, 200) } else { (50, 2000) };
    let mut report = Report::new("shm", "002 §3, 000 §8.4", q, Conditions::capture_before());
    report.hidden_in_table = ["transport", "phase", "mean_ns"].iter().map(|s| s.to_string()).collect();

    // Phase 1: spinning, client on CPU 0, servers on CPU 1.
    let mut spin_ts: Vec<Box<dyn Transport>> = Vec::new();
    spawn_pinned(server_cpu, 0, || {
        spawn_or_note(ShmTransport::spawn("ictus-shm spin", SERVER_SPIN, 0, 0), "ictus-shm", &mut spin_ts, &mut notes);
        spawn_or_note(IceoryxTransport::spawn(), "iceoryx2", &mut spin_ts, &mut notes);
        spawn_or_note(FutexPeer::spawn(SMALL, SMALL), "futex peer", &mut spin_ts, &mut notes);
        spawn_or_note(PortTransport::spawn(PortMode::CallInline), "port call", &mut spin_ts, &mut notes);
    })
    .map_err(|e| BenchError::io("pinning", e))?;
    let spin = interleave(&mut spin_ts, SMALL, rounds, per_round, 5);
    drop(spin_ts);

    // Phase 2: blocking, everything on CPU 0.
    let mut block_ts: Vec<Box<dyn Transport>> = Vec::new();
    spawn_pinned(0, 0, || {
        spawn_or_note(
            ShmTransport::spawn("ictus-shm block", Duration::ZERO, 0, 0),
            "ictus-shm",
            &mut block_ts,
            &mut notes,
        );
        spawn_or_note(FutexPeer::spawn(SMALL, SMALL), "futex peer", &mut block_ts, &mut notes);
        spawn_or_note(PortTransport::spawn(PortMode::CallInline), "port call", &mut block_ts, &mut notes);
    })
    .map_err(|e| BenchError::io("pinning", e))?;
    let block = interleave(&mut block_ts, SMALL, rounds, per_round, 2);
    drop(block_ts);

    // Phase 3: throughput of small records (pipelined bursts), CPU 0 and 1.
    let throughput = measure_throughput(q, server_cpu, &mut notes);
    // Phase 4: wake-ups per message with 8 clients in bursts.
    let wakeups = measure_wakeups(q, server_cpu, &mut notes);
    // Phase 5: large buffers through loans.
    let loans = measure_loans(q, server_cpu, &mut notes);

    let _ = pin::restore_affinity(&saved);
    conditions.pinned = format!("client 0, servers {server_cpu} (spinning, throughput, loans); all on 0 (blocking)");
    report.conditions = conditions.finish();

    for (phase, ms) in [("spin", &spin), ("block", &block)] {
        for m in ms.iter() {
            if m.rec.count() > 0 {
                report.rows.push(
                    m.rec
                        .row(format!("{} 64 B RTT ({phase})", m.name))
                        .with("transport", m.name.as_str())
                        .with("phase", phase)
                        .with("p90_ns", m.rec.quantile(0.9))
                        .to_value(),
                );
            }
            if let Some(f) = &m.failed {
                notes.push(format!("{} ({phase}) stopped: {f}", m.name));
            }
        }
    }
    for (name, t) in &throughput {
        report.rows.push(json!({
            "case": format!("{name} throughput, bursts of {BURST} x 64 B"),
            "transport": name,
            "msgs_per_s_median": t.median, "msgs_per_s_min": t.min, "msgs_per_s_max": t.max, "runs": t.runs,
        }));
    }
    for w in &wakeups {
        report.rows.push(json!({
            "case": format!("ictus-shm wake-ups, {WAKE_CLIENTS} clients, server {}", w.label),
            "transport": "ictus-shm",
            "messages": w.messages, "wakeup_syscalls": w.wakeups,
            "wakeups_per_msg": w.per_msg(),
        }));
    }
    for m in &loans {
        if m.rec.count() > 0 {
            report.rows.push(m.rec.row(m.name.clone()).with("transport", m.description.as_str()).to_value());
        }
        if let Some(f) = &m.failed {
            notes.push(format!("{} stopped: {f}", m.name));
        }
    }

    let p50 = |ms: &[Measured], name: &str| {
        ms.iter()
            .find(|m| m.name == name && m.rec.count() > 0)
            .map(|m| (m.rec.quantile(0.5) as f64, m.description.clone()))
    };
    match (p50(&spin, "ictus-shm spin"), p50(&spin, "iceoryx2")) {
        (Some((ours, _)), Some((peer, d))) => report
            .headline
            .push(Headline::new("shm_rtt_64B_spin_vs_iceoryx2", ours, peer, d, "ns", Better::Lower).with_target(1.0)),
        _ => notes.push("headline shm_rtt_64B_spin_vs_iceoryx2 omitted: a transport did not run".into()),
    }
    match (p50(&block, "ictus-shm block"), p50(&block, "futex shm")) {
        (Some((ours, _)), Some((peer, d))) => report
            .headline
            .push(Headline::new("shm_rtt_64B_block_vs_futex", ours, peer, d, "ns", Better::Lower).with_target(1.3)),
        _ => notes.push("headline shm_rtt_64B_block_vs_futex omitted: a transport did not run".into()),
    }
    match wakeups.first() {
        Some(w) if w.messages > 0 => report.headline.push(
            Headline::new(
                "shm_wakeups_per_msg_8clients",
                w.per_msg(),
                1.0,
                "one notification per message (a socket or a port)",
                "wake-ups/msg",
                Better::Lower,
            )
            .with_target(0.2),
        ),
        _ => notes.push("headline shm_wakeups_per_msg_8clients omitted: not measured".into()),
    }
    let paper = PaperFigure::new(
        "shared-memory signalling, one way (000 §8.4)",
        "0.16 ms",
        Some(160_000.0),
        "ns",
        Better::Lower,
    );
    report.paper_figures.push(match p50(&block, "ictus-shm block") {
        Some((rtt, _)) => {
            paper.ours(Some(rtt / 2.0), format!("ictus-shm, blocking: {} (p50 RTT/2, 64 B)", format_ns(rtt / 2.0)))
        }
        None => paper.ours(None, "not measured"),
    });
    notes.push(format!(
        "64 B round trips: request 64 B; ictus-shm, iceoryx2 and futex echo 64 B, the port call answers {} B",
        crate::ipc::REPLY_LEN
    ));
    notes.push("spinning: both ends poll, and every server sleeps after 2 ms without traffic (so it does not compete with the next transport's server); blocking: nobody polls, one CPU".into());
    notes.push(format!(
        "wake-ups: {WAKE_CLIENTS} client threads, bursts of {WAKE_BURST} x 64 B with 50-300 µs pauses; counted by the clients (FUTEX_WAKE or eventfd writes); the peer's 1.0 is a socket's or port's one notification per message"
    ));
    notes.push("loans: the frame is written into the pool buffer before timing; the server touches every page; port ool maps a sealed memfd (MAP_POPULATE); the futex peer copies the frame into its shared area inside the timed region".into());
    notes.push(
        "the machine is shared with other builds: absolute numbers are noisy; ratios are measured together".into(),
    );
    notes.push(format!("measured in {:.1} s", started.elapsed().as_secs_f64()));
    report.notes.extend(notes);
    if let Some(path) = &opts.json {
        report.write_json_and_plot(path, &plot_svg(&report))?;
    }
    Ok(report)
}

fn measure_throughput(quick: bool, server_cpu: usize, notes: &mut Vec<String>) -> Vec<(String, Throughput)> {
    let (runs, bursts) = if quick { (5, 100) } else { (15, 1000) };
    let mut out = Vec::new();
    let spawned =
        spawn_pinned(server_cpu, 0, || (ShmTransport::spawn("ictus-shm", SERVER_SPIN, 0, 0), PortBurst::spawn()));
    let Ok((ours, port)) = spawned else {
        notes.push("throughput: pinning failed".into());
        return out;
    };
    let (mut ours, mut port) = match (ours, port) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            notes.push(format!("throughput could not run: {:?} {:?}", a.err(), b.err()));
            return out;
        }
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        match ours.burst_rate(SMALL, bursts) {
            Ok(r) => a.push(r),
            Err(e) => notes.push(format!("ictus-shm throughput: {e}")),
        }
        match port.burst_rate(bursts) {
            Ok(r) => b.push(r),
            Err(e) => notes.push(format!("port throughput: {e}")),
        }
    }
    if let Some(t) = Throughput::from_runs(&a) {
        out.push(("ictus-shm".to_string(), t));
    }
    if let Some(t) = Throughput::from_runs(&b) {
        out.push(("port send/recv".to_string(), t));
    }
    out
}

/// Port send/receive pipelined in bursts: the client sends `BURST` 64-byte requests
/// to the server's port, then receives their 8-byte replies on its own reply port.
#[derive(Debug)]
pub struct PortBurst {
    space: Space,
    service: Name,
    reply_port: Name,
    received: Received,
    child: Child,
}

const PORT_REQUEST: i32 = 2;

impl PortBurst {
    /// Spawns a `port-burst` server and hands it a send right to our reply port.
    pub fn spawn() -> io::Result<PortBurst> {
        let space = Space::new();
        let setup = space.allocate_port().map_err(other)?;
        let fd = space.send_right_fd(setup).map_err(other)?;
        let child = spawn_child("port-burst", &[fd.as_raw_fd().to_string()], &[fd.as_fd()])?;
        drop(fd);
        let mut received = Received::new();
        let ropts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), populate_ool: false };
        space.receive(setup, &mut received, ropts).map_err(other)?;
        let service = received.ports.first().map(|r| r.name).ok_or_else(|| other("no service port"))?;
        let _ = space.destroy(setup);
        let reply_port = space.allocate_port().map_err(other)?;
        let mut m = Message::new(1, Vec::new());
        m.ports.push(PortArg::new(reply_port, Disposition::MakeSend));
        space.send(service, &mut m, SendOptions::default()).map_err(other)?;
        Ok(PortBurst { space, service, reply_port, received, child })
    }

    /// Bursts of `BURST` pipelined requests; messages per second.
    pub fn burst_rate(&mut self, bursts: usize) -> io::Result<f64> {
        let t0 = Instant::now();
        let mut msg = Message::new(PORT_REQUEST, vec![0xa5; SMALL]);
        let ropts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), populate_ool: false };
        for _ in 0..bursts {
            for _ in 0..BURST {
                self.space.send(self.service, &mut msg, SendOptions::default()).map_err(other)?;
            }
            for _ in 0..BURST {
                self.space.receive(self.reply_port, &mut self.received, ropts).map_err(other)?;
            }
        }
        Ok((bursts * BURST) as f64 / t0.elapsed().as_secs_f64())
    }
}

impl Drop for PortBurst {
    fn drop(&mut self) {
        let _ = self.space.destroy(self.reply_port);
        let _ = self.space.deallocate(self.service);
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// Child role `port-burst <setup-fd>`: answers every request on its port with 8 bytes
/// to the reply port it was given; exits when that port dies.
pub fn port_burst_server(args: &[String]) -> i32 {
    let run = || -> io::Result<()> {
        let fd = fd_arg(args.first().map_or("", String::as_str))?;
        let space = Space::new();
        let setup = space.insert_send_fd(fd).map_err(other)?;
        let service = space.allocate_port().map_err(other)?;
        let mut m = Message::new(1, Vec::new());
        m.ports.push(PortArg::new(service, Disposition::MakeSend));
        space.send(setup, &mut m, SendOptions::default()).map_err(other)?;
        let _ = space.deallocate(setup);
        let mut r = Received::new();
        let ropts = ReceiveOptions { timeout: Some(Duration::from_secs(60)), populate_ool: false };
        space.receive(service, &mut r, ropts).map_err(other)?;
        let reply = r.ports.first().map(|p| p.name).ok_or_else(|| other("no reply port"))?;
        let mut ack = Message::new(PORT_REQUEST + 100, vec![0; ACK_LEN]);
        loop {
            match space.receive(service, &mut r, ropts) {
                Ok(()) if r.id == PORT_REQUEST => {
                    if space.send(reply, &mut ack, SendOptions::default()).is_err() {
                        return Ok(());
                    }
                }
                Ok(()) => {}
                Err(ictus_ipc::ReceiveError::Malformed { .. }) => {}
                Err(_) => return Ok(()),
            }
        }
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("port-burst: {e}");
            1
        }
    }
}

struct Wakeups {
    label: &'static str,
    messages: u64,
    wakeups: u64,
}

impl Wakeups {
    fn per_msg(&self) -> f64 {
        if self.messages == 0 {
            f64::NAN
        } else {
            self.wakeups as f64 / self.messages as f64
        }
    }
}

fn measure_wakeups(quick: bool, server_cpu: usize, notes: &mut Vec<String>) -> Vec<Wakeups> {
    let bursts = if quick { 60 } else { 600 };
    let mut out = Vec::new();
    for (label, spin) in [("blocking at once", Duration::ZERO), ("spinning 20 µs first", Duration::from_micros(20))] {
        match wakeups_once(spin, bursts, server_cpu) {
            Ok((messages, wakeups)) => out.push(Wakeups { label, messages, wakeups }),
            Err(e) => notes.push(format!("wake-ups ({label}) could not run: {e}")),
        }
    }
    out
}

fn wakeups_once(spin: Duration, bursts: usize, server_cpu: usize) -> io::Result<(u64, u64)> {
    let server = spawn_pinned(server_cpu, 0, || ShmTransport::spawn("ictus-shm", spin, 0, 0))??;
    let mut clients = vec![];
    for _ in 0..WAKE_CLIENTS {
        clients.push(server.another_channel()?);
    }
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            std::thread::spawn(move || -> io::Result<(u64, u64)> {
                let mut x = i as u64 * 7919 + 1;
                let payload = [0u8; SMALL];
                let timeout = Some(Duration::from_secs(30));
                for _ in 0..bursts {
                    for _ in 0..WAKE_BURST {
                        c.send_wait(SINK, &payload, timeout).map_err(other)?;
                    }
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    std::thread::sleep(Duration::from_micros(50 + (x >> 33) % 250));
                }
                // Wait until the server has consumed everything.
                c.send_wait(ACK, &payload, timeout).map_err(other)?;
                drop(c.recv(timeout).map_err(other)?);
                let s = c.stats();
                Ok((s.sent, s.wakeups))
            })
        })
        .collect();
    let (mut msgs, mut wakes) = (0, 0);
    for h in handles {
        let (m, w) = h.join().map_err(|_| other("client thread panicked"))??;
        msgs += m;
        wakes += w;
    }
    drop(server);
    Ok((msgs, wakes))
}

fn measure_loans(quick: bool, server_cpu: usize, notes: &mut Vec<String>) -> Vec<Measured> {
    let iters = if quick { 30 } else { 300 };
    let max = *LOAN_SIZES.iter().max().unwrap_or(&(1 << 20));
    let spawned = spawn_pinned(server_cpu, 0, || {
        (
            ShmTransport::spawn("ictus-shm loan", SERVER_SPIN, 4, max as u32),
            PortTransport::spawn(PortMode::CallOol),
            FutexPeer::spawn(ACK_LEN, max),
        )
    });
    let Ok((ours, port, futex)) = spawned else {
        notes.push("loans: pinning failed".into());
        return Vec::new();
    };
    let (mut ours, mut port, mut futex) = match (ours, port, futex) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (a, b, c) => {
            notes.push(format!("loans could not run: {:?} {:?} {:?}", a.err(), b.err(), c.err()));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for &size in LOAN_SIZES {
        let mut recs: Vec<Measured> = ["ictus-shm pool loan", "port ool", "futex shm (copy in)"]
            .iter()
            .map(|n| Measured {
                name: format!("{n} {}", format_size(size)),
                description: n.to_string(),
                rec: LatencyRecorder::new(),
                failed: None,
            })
            .collect();
        let per = (iters / 5).max(1);
        for _ in 0..5 {
            let r = [ours.loan_round_trips(size, per), port.round_trips(size, per), futex.round_trips(size, per)];
            for (m, r) in recs.iter_mut().zip(r) {
                match r {
                    Ok(s) => m.rec.record_all(&s),
                    Err(e) => m.failed = Some(e.to_string()),
                }
            }
        }
        out.extend(recs);
    }
    out
}

/// Latency tails of the round-trip cases: one sample in N slower than y.
pub fn plot_svg(report: &Report) -> String {
    let mut series = Vec::new();
    for row in &report.rows {
        let (Some(name), Some(phase)) =
            (row.get("transport").and_then(|v| v.as_str()), row.get("phase").and_then(|v| v.as_str()))
        else {
            continue;
        };
        let q = |k: &str| row.get(k).and_then(|v| v.as_f64());
        let mut points = Vec::new();
        for (n, key) in [(2.0, "p50_ns"), (10.0, "p90_ns"), (100.0, "p99_ns"), (1000.0, "p999_ns")] {
            if let Some(v) = q(key) {
                points.push((n, v.max(1.0)));
            }
        }
        series.push(Series { name: format!("{name} ({phase})"), points });
    }
    Plot {
        title: format!("shm: 64 B round-trip tails{}", if report.quick { " [quick]" } else { "" }),
        x: Axis {
            label: "one round trip in N is slower than".to_string(),
            scale: Scale::Log10,
            ticks: TickFormat::Plain,
        },
        y: Axis { label: "round trip".to_string(), scale: Scale::Log10, ticks: TickFormat::Nanoseconds },
        series,
    }
    .render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_rate_is_wakeups_over_messages() {
        let w = Wakeups { label: "x", messages: 100, wakeups: 5 };
        assert!((w.per_msg() - 0.05).abs() < 1e-12);
        assert!(Wakeups { label: "x", messages: 0, wakeups: 0 }.per_msg().is_nan());
    }

    #[test]
    fn the_plot_has_a_series_per_round_trip_row() {
        let mut report = Report::new("shm", "x", true, Conditions::capture_before());
        let mut r = LatencyRecorder::new();
        r.record_all(&[1000, 2000, 3000]);
        report
            .rows
            .push(r.row("a").with("transport", "ictus-shm").with("phase", "spin").with("p90_ns", 2500u64).to_value());
        report.rows.push(json!({"case": "throughput", "transport": "x"}));
        let svg = plot_svg(&report);
        assert!(svg.contains("ictus-shm (spin)"));
        crate::svg::check_well_formed(&svg).expect("well-formed");
    }
}
