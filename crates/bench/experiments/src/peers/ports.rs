//! Our transports for the `ipc` experiment: ictus ports between two processes.
//!
//! The server runs in a child process (role `port-echo`), reached through a send right
//! handed over as an inherited descriptor. It answers each request through the request's
//! reply right with [`REPLY_LEN`] bytes, as the paper's MIG server answered with a bare
//! `KERN_SUCCESS`. It touches every page of what it receives (one byte per 4 KiB of
//! in-line data, every page of out-of-line regions), as the paper's receiver did.
//!
//! Transports:
//! - `port inline` — `Space::call`: the request goes with a send-once reply right made
//!   for that call alone, as a MIG routine does; in-line data up to 64 KiB rides in the
//!   datagram, larger data is copied through a sealed memfd.
//! - `port ool` — the same call with the payload as one out-of-line region: the client
//!   fills an [`OolBuffer`] before timing (a frame written once), the send seals and moves
//!   it, the server maps it (`MAP_POPULATE`) and reads every page.
//! - `port send/recv` — two long-lived ports and no reply right per message: the
//!   client sends to the server's port and receives on its own reply port, to which the
//!   server holds a send right. The cost of a Mach exchange without MIG's per-call
//!   send-once right.

use std::io;
use std::os::fd::AsFd;
use std::process::Child;
use std::time::{Duration, Instant};

use ictus_ipc::{Disposition, Message, Name, OolBuffer, PortArg, ReceiveOptions, Received, SendOptions, Space};

use ictus_bench::child::{fd_arg, reap, role_status, spawn_child};
use ictus_bench::rounds::batch_p50;
use ictus_bench::{LatencyRecorder, Role, Transport};

use super::REPLY_LEN;

/// The in-line call transport's name, as rows and headlines spell it.
pub const PORT_INLINE: &str = "port inline";
/// The out-of-line call transport's name.
pub const PORT_OOL: &str = "port ool";

const SETUP: i32 = 1;
const REQUEST: i32 = 2;
const SET_REPLY_PORT: i32 = 3;
const STOP: i32 = 4;
/// The hand-written null request; its reply has id `HAND_NULL + 100` and a zero `u32`,
/// byte for byte what the generated stubs send.
const HAND_NULL: i32 = 10;

/// The interface the stub-overhead pair calls through: one null routine.
#[ictus_idl::interface(id = 7000)]
pub trait BenchNull {
    /// Does nothing; its reply is a bare success code, as the paper's `KERN_SUCCESS`.
    #[id(0)]
    fn null(&self) -> Result<(), ictus_idl::Status>;
}

struct NullImpl;

impl BenchNull for NullImpl {
    fn null(&self) -> Result<(), ictus_idl::Status> {
        Ok(())
    }
}
const WATCHDOG: Duration = Duration::from_secs(60);
const PAGE: usize = 4096;

/// How a round trip is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortMode {
    /// `Space::call` with in-line data.
    CallInline,
    /// `Space::call` with one out-of-line region.
    CallOol,
    /// Send to the server's port, receive on a long-lived reply port.
    SendReceive,
}

/// A port transport and its server process.
#[derive(Debug)]
pub struct PortTransport {
    name: &'static str,
    description: &'static str,
    mode: PortMode,
    space: Space,
    service: Name,
    reply_port: Name,
    received: Received,
    child: Child,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn recv_opts() -> ReceiveOptions {
    ReceiveOptions { timeout: Some(WATCHDOG), populate_ool: true }
}

/// What the timed round trips wait with: no time-out, as the peers' blocking reads.
/// A server that dies still ends a call at once (`CallError::ServerDied`); a time-out
/// would add the kernel's timer to every wait, which the peers do not pay.
fn timed_opts() -> ReceiveOptions {
    ReceiveOptions { timeout: None, populate_ool: true }
}

impl PortTransport {
    /// Spawn the server and connect to it.
    pub fn spawn(mode: PortMode) -> io::Result<PortTransport> {
        let (name, description) = match mode {
            PortMode::CallInline => (PORT_INLINE, "ictus port call, in-line data (over a call channel)"),
            PortMode::CallOol => (PORT_OOL, "ictus port call, one out-of-line region (sealed memfd)"),
            PortMode::SendReceive => ("port send/recv", "ictus port send + receive on a long-lived reply port"),
        };
        let space = Space::new();
        let setup = space.allocate_port().map_err(other)?;
        let fd = space.send_right_fd(setup).map_err(other)?;
        let child = spawn_child(&ROLE, &[fd.as_fd().as_raw_fd_string()], &[fd.as_fd()])?;
        drop(fd);
        let mut received = Received::new();
        space.receive(setup, &mut received, recv_opts()).map_err(other)?;
        if received.id != SETUP || received.ports.len() != 1 {
            return Err(other("port server sent an unexpected set-up message"));
        }
        let service = received.ports[0].name;
        let reply_port = space.allocate_port().map_err(other)?;
        let mut m = Message::new(SET_REPLY_PORT, Vec::new());
        m.ports.push(PortArg::new(reply_port, Disposition::MakeSend));
        space.send(service, &mut m, SendOptions::default()).map_err(other)?;
        space.destroy(setup).map_err(other)?;
        Ok(PortTransport { name, description, mode, space, service, reply_port, received, child })
    }
}

trait RawFdString {
    fn as_raw_fd_string(&self) -> String;
}

impl RawFdString for std::os::fd::BorrowedFd<'_> {
    fn as_raw_fd_string(&self) -> String {
        use std::os::fd::AsRawFd;
        self.as_raw_fd().to_string()
    }
}

impl Transport for PortTransport {
    fn name(&self) -> &str {
        self.name
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn description(&self) -> &str {
        self.description
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        let mut times = Vec::with_capacity(iters);
        match self.mode {
            PortMode::CallInline | PortMode::SendReceive => {
                let mut msg = Message::new(REQUEST, vec![0xa5; size]);
                for _ in 0..iters {
                    let t0 = Instant::now();
                    if self.mode == PortMode::CallInline {
                        self.space
                            .call(self.service, &mut msg, &mut self.received, SendOptions::default(), timed_opts())
                            .map_err(other)?;
                    } else {
                        self.space.send(self.service, &mut msg, SendOptions::default()).map_err(other)?;
                        self.space.receive(self.reply_port, &mut self.received, timed_opts()).map_err(other)?;
                    }
                    times.push(t0.elapsed().as_nanos() as u64);
                }
            }
            PortMode::CallOol => {
                // Buffers are made and filled before timing, a batch at a time so as not
                // to hold thousands of memfds open at once.
                let mut left = iters;
                while left > 0 {
                    let batch = left.min(64);
                    let mut bufs = Vec::with_capacity(batch);
                    for _ in 0..batch {
                        let mut b = OolBuffer::new(size).map_err(other)?;
                        b.fill(0xa5);
                        bufs.push(b);
                    }
                    for b in bufs {
                        let mut msg = Message::new(REQUEST, Vec::new());
                        msg.ool.push(b);
                        let t0 = Instant::now();
                        self.space
                            .call(self.service, &mut msg, &mut self.received, SendOptions::default(), timed_opts())
                            .map_err(other)?;
                        times.push(t0.elapsed().as_nanos() as u64);
                        // Release the reply's resources outside the timed region.
                    }
                    left -= batch;
                }
            }
        }
        Ok(times)
    }
}

impl Drop for PortTransport {
    fn drop(&mut self) {
        // Ask the server to stop; the watchdog kill in `reap` is the fallback.
        let _ = self.space.send(self.service, &mut Message::new(STOP, Vec::new()), SendOptions::NONBLOCKING);
        let _ = self.space.destroy(self.service);
        let _ = self.space.destroy(self.reply_port);
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// Touch every page of received data, so that the receiver pays for what it maps.
fn touch(data: &[u8]) -> u64 {
    let mut sum = 0u64;
    let mut i = 0;
    while i < data.len() {
        sum = sum.wrapping_add(u64::from(data[i]));
        i += PAGE;
    }
    if let Some(&last) = data.last() {
        sum = sum.wrapping_add(u64::from(last));
    }
    sum
}

/// The server end of every port transport.
pub static ROLE: Role = Role { name: "port-echo", run: port_server };

/// The `port-echo` role: the server end of every port transport.
pub fn port_server(args: &[String]) -> i32 {
    role_status("port-echo", serve(args))
}

fn serve(args: &[String]) -> io::Result<()> {
    let fd = fd_arg(args.first().ok_or_else(|| other("missing descriptor argument"))?)?;
    let space = Space::new();
    let setup = space.insert_send_fd(fd).map_err(other)?;
    let service = space.allocate_port().map_err(other)?;
    let mut m = Message::new(SETUP, Vec::new());
    m.ports.push(PortArg::new(service, Disposition::MakeSend));
    space.send(setup, &mut m, SendOptions::default()).map_err(other)?;
    space.deallocate(setup).map_err(other)?;
    let mut reply_port = None;
    let stubs = ictus_idl::Server::new(&space, service).with(BenchNullServer(NullImpl));
    let mut null_reply = Message::new(HAND_NULL + 100, 0u32.to_le_bytes().to_vec());
    let mut r = Received::new();
    let mut reply = Message::new(0, vec![0u8; REPLY_LEN]);
    let mut sink = 0u64;
    loop {
        match space.receive(service, &mut r, ReceiveOptions { timeout: None, populate_ool: true }) {
            Ok(()) => {}
            Err(ictus_ipc::ReceiveError::Malformed { .. }) => continue,
            Err(e) => return Err(other(e)),
        }
        match r.id {
            REQUEST => {
                sink = sink.wrapping_add(touch(r.data()));
                for region in &r.ool {
                    sink = sink.wrapping_add(touch(region));
                }
                // Released before the reply, as the paper's receiver deallocated before
                // answering: back to back on one CPU the release is paid either way.
                r.ool.clear();
                reply.id = REQUEST + 100;
                let to = match (r.reply, reply_port) {
                    (Some(rr), _) => rr.name,
                    (None, Some(p)) => p,
                    (None, None) => continue,
                };
                space.send(to, &mut reply, SendOptions::default()).map_err(other)?;
            }
            SET_REPLY_PORT if r.ports.len() == 1 => reply_port = Some(r.ports[0].name),
            HAND_NULL => {
                if let Some(rr) = r.reply {
                    space.send(rr.name, &mut null_reply, SendOptions::default()).map_err(other)?;
                }
            }
            id if stubs_answer(id) => {
                stubs.handle(&mut r);
            }
            STOP => break,
            _ => {}
        }
    }
    std::hint::black_box(sink);
    Ok(())
}

fn stubs_answer(id: i32) -> bool {
    (BenchNullClient::NULL..=BenchNullClient::NULL).contains(&id)
}

/// Samples of the stub-overhead pair.
#[derive(Debug)]
pub struct NullTimes {
    /// Null routine through the generated stubs.
    pub stub: LatencyRecorder,
    /// The same exchange written by hand on the nucleus.
    pub hand: LatencyRecorder,
    /// The median of each round's batch of stub calls, in order.
    pub stub_rounds: Vec<f64>,
    /// The median of each round's batch of hand-written exchanges, in order.
    pub hand_rounds: Vec<f64>,
}

/// A null routine through generated stubs and the same exchange by hand, against one
/// server process, so that only the stub code differs.
#[derive(Debug)]
pub struct NullPair {
    inner: PortTransport,
    client: BenchNullClient,
}

impl NullPair {
    /// Spawn the server.
    pub fn spawn() -> io::Result<NullPair> {
        let inner = PortTransport::spawn(PortMode::CallInline)?;
        let client = BenchNullClient::new(&inner.space, inner.service).with_timeout(WATCHDOG);
        Ok(NullPair { inner, client })
    }

    fn hand(&mut self) -> io::Result<()> {
        let mut msg = Message::new(HAND_NULL, Vec::new());
        let t = &mut self.inner;
        t.space
            .call(t.service, &mut msg, &mut t.received, SendOptions { timeout: Some(WATCHDOG) }, recv_opts())
            .map_err(other)?;
        // The checks the stubs make: the reply's id and its success code.
        let ok = t.received.id == HAND_NULL + 100 && t.received.data() == 0u32.to_le_bytes();
        if !ok {
            return Err(other("unexpected reply to the hand-written null request"));
        }
        Ok(())
    }

    /// Interleaved rounds of both, after a warm-up.
    pub fn measure(&mut self, quick: bool) -> io::Result<NullTimes> {
        let (rounds, per_round) = if quick { (20, 50) } else { (50, 400) };
        let mut times = NullTimes {
            stub: LatencyRecorder::new(),
            hand: LatencyRecorder::new(),
            stub_rounds: Vec::with_capacity(rounds),
            hand_rounds: Vec::with_capacity(rounds),
        };
        for _ in 0..per_round {
            self.client.null().map_err(other)?;
            self.hand()?;
        }
        for round in 0..rounds {
            for k in 0..2 {
                let stub_turn = (round + k) % 2 == 0;
                let mut samples = Vec::with_capacity(per_round);
                for _ in 0..per_round {
                    let t0 = Instant::now();
                    if stub_turn {
                        self.client.null().map_err(other)?;
                    } else {
                        self.hand()?;
                    }
                    samples.push(t0.elapsed().as_nanos() as u64);
                }
                let (all, each) = if stub_turn {
                    (&mut times.stub, &mut times.stub_rounds)
                } else {
                    (&mut times.hand, &mut times.hand_rounds)
                };
                all.record_all(&samples);
                each.extend(batch_p50(&samples));
            }
        }
        Ok(times)
    }
}
