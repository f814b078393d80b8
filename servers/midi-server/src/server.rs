//! The input server: a driver thread, a ring, a parser, and the subscribers.
//!
//! - The **driver thread** (the paper's interrupt handler) reads the device, stamps
//!   each read with `CLOCK_MONOTONIC`, and puts the bytes in the ring
//!   ([`crate::ring`]), ringing the bell when the server sleeps. It runs at a real-time
//!   priority above the server's when it may ([`Options::driver_thread`]).
//! - The **server thread** waits in one `poll` on the bell, its port set (the service
//!   port and the notify port) and a stop channel. It drains the ring through the
//!   MIDI parser ([`ictus_midi::Parser`], each byte stamped with its read's time) and
//!   sends every message to the subscribers of its class: normal messages in-line,
//!   system exclusive out-of-line ([`crate::protocol::Delivery`]), without ever
//!   waiting for a client (a full queue drops that delivery and counts it). Requests
//!   go to the generated [`MidiInputServer`].
//! - A subscriber's port that dies — its task exits or is killed, even by `kill -9` —
//!   is dropped through its **dead-name notification** (the server arms one per port
//!   name, counted, on its notify port, and believes only notifications whose
//!   kernel-verified sender is itself), or at once if a delivery finds it dead.
//!
//! # Rights
//!
//! Each subscription holds one user reference of the send right its request brought;
//! subscriptions of one port to both classes share the name (two references) and one
//! dead-name request. Unsubscribing, purging and stopping release exactly what was
//! taken.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_abi::Name;
use ictus_idl::{Context, Dispatched, SendRight};
use ictus_ipc::{Credentials, ReceiveError, Received, RightKind, RightsError, SendError, SendOptions, Space};
use ictus_midi::device::Device;
use ictus_midi::{Message, Parser};
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_rt::{clock, Time};
use ictus_server::rtlog::{RtEvent, RtLog, RtWriter};
use ictus_server::{DeadNameWatches, Loop, Serve, ServicePorts, Wait, SMALL_REQUESTS};
use tracing::Level;

use crate::protocol::{
    Class, Delivery, InputStats, MidiError, MidiInput, MidiInputServer, MAX_PER_CLIENT, MAX_SUBSCRIPTIONS,
};
use crate::ring::{self, Consumer, Producer};

pub use ictus_server::ServeError;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Slots in the ring ([`ring::DEFAULT_SLOTS`]).
    pub ring_slots: usize,
    /// What the driver thread asks of the scheduler (default `SCHED_FIFO` 85, timer
    /// slack 1 ns; refusals are reported once and never fatal).
    pub driver_thread: ThreadRequest,
    /// What the server thread asks (default `SCHED_FIFO` 80).
    pub server_thread: ThreadRequest,
    /// The parser's bound on a system-exclusive message, in bytes.
    pub max_sysex: usize,
}

impl Default for Options {
    fn default() -> Options {
        let rt = |priority| ThreadRequest {
            policy: Some(Policy::Fifo { priority }),
            timer_slack: Some(Duration::from_nanos(1)),
            ..ThreadRequest::default()
        };
        Options {
            ring_slots: ring::DEFAULT_SLOTS,
            driver_thread: rt(85),
            server_thread: rt(80),
            max_sysex: ictus_midi::parse::DEFAULT_MAX_SYSEX,
        }
    }
}

impl Options {
    /// The defaults, with both threads timesharing (tests, unprivileged use).
    pub fn timesharing() -> Options {
        Options {
            driver_thread: ThreadRequest::default(),
            server_thread: ThreadRequest::default(),
            ..Options::default()
        }
    }
}

/// Device read failures in a row after which the driver gives up instead of spinning.
const MAX_CONSECUTIVE_ERRORS: u32 = 1000;
/// How long a driver read waits before looking at the stop flag.
const DRIVER_POLL: Duration = Duration::from_millis(100);

/// One subscription.
#[derive(Debug)]
struct Sub {
    id: u64,
    port: Name,
    class: Class,
    owner: Credentials,
    seq: u64,
}

/// Subscriptions, dead-name counts, and the counters the subscription side keeps.
#[derive(Debug, Default)]
struct Table {
    subs: Vec<Sub>,
    watched: DeadNameWatches,
    stats: InputStats,
    next_id: u64,
}

/// What the driver thread reports.
#[derive(Debug, Default)]
struct DriverCounters {
    bytes: AtomicU64,
    errors: AtomicU64,
    ended: AtomicBool,
    wakeups: AtomicU64,
    granted: Mutex<String>,
}

/// Shared by the interface's methods and the server's loop (both on the server
/// thread; the lock lets both hold it, and lets [`Running::stats`] read it).
#[derive(Debug)]
struct State {
    space: Space,
    notify: Name,
    pid: u32,
    device: String,
    table: Mutex<Table>,
    /// The parser's and the ring's counters, as of the last drain.
    parse: Mutex<InputStats>,
    driver: Arc<DriverCounters>,
}

impl State {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_dead(&self, right: Name) -> bool {
        match self.space.right_kinds(right) {
            Ok(k) => k.contains(&RightKind::DeadName),
            Err(_) => true,
        }
    }

    fn snapshot(&self) -> InputStats {
        let t = self.table();
        let mut s = *self.parse.lock().unwrap_or_else(PoisonError::into_inner);
        s.normal_clients = t.subs.iter().filter(|x| x.class == Class::Normal).count() as u64;
        s.sysex_clients = t.subs.iter().filter(|x| x.class == Class::Sysex).count() as u64;
        s.subscribed = t.stats.subscribed;
        s.unsubscribed = t.stats.unsubscribed;
        s.dropped_dead = t.stats.dropped_dead;
        s.delivered = t.stats.delivered;
        s.queue_full = t.stats.queue_full;
        s.send_errors = t.stats.send_errors;
        s.refused += t.stats.refused;
        s.device_bytes = self.driver.bytes.load(Ordering::Relaxed);
        s.device_errors = self.driver.errors.load(Ordering::Relaxed);
        s.device_ended = u64::from(self.driver.ended.load(Ordering::Relaxed));
        s.ring_wakeups = self.driver.wakeups.load(Ordering::Relaxed);
        s
    }

    /// The port behind `right` died: drop its subscriptions and the dead name.
    fn purge(&self, t: &mut Table, right: Name) {
        let before = t.subs.len();
        t.subs.retain(|s| s.port != right);
        let removed = before - t.subs.len();
        t.stats.dropped_dead += removed as u64;
        t.watched.forget(&self.space, right);
        if self.is_dead(right) {
            let _ = self.space.destroy(right);
        } else {
            for _ in 0..removed {
                let _ = self.space.deallocate(right);
            }
        }
    }

    fn dead_name(&self, name: Name) {
        if self.space.right_kinds(name).is_ok_and(|k| k == [RightKind::DeadName]) {
            self.purge(&mut self.table(), name);
        }
    }

    /// Send `m` to every subscriber of its class, never waiting.
    fn deliver(&self, m: &Message, overflow: u64) {
        let class = Class::of(m);
        let mut t = self.table();
        let mut dead = Vec::new();
        let mut delivered = 0;
        let mut full = 0;
        let mut errors = 0;
        for sub in t.subs.iter_mut().filter(|s| s.class == class) {
            let seq = sub.seq;
            sub.seq += 1;
            let mut msg = match Delivery::to_message(m, seq, overflow) {
                Ok(msg) => msg,
                Err(_) => {
                    errors += 1;
                    continue;
                }
            };
            match self.space.send(sub.port, &mut msg, SendOptions::NONBLOCKING) {
                Ok(()) => delivered += 1,
                Err(SendError::TimedOut) => full += 1,
                Err(SendError::InvalidDest(_)) => dead.push(sub.port),
                Err(_) => errors += 1,
            }
        }
        t.stats.delivered += delivered;
        t.stats.queue_full += full;
        t.stats.send_errors += errors;
        for port in dead {
            if t.subs.iter().any(|s| s.port == port) {
                self.purge(&mut t, port);
            }
        }
    }

    /// Let go of every subscription (the server is stopping).
    fn release_all(&self) {
        let mut t = self.table();
        let subs = std::mem::take(&mut t.subs);
        t.watched.forget_all(&self.space);
        for s in subs {
            if self.is_dead(s.port) {
                let _ = self.space.destroy(s.port);
            } else {
                let _ = self.space.deallocate(s.port);
            }
        }
    }
}

/// The interface's methods, on the shared state.
#[derive(Debug)]
struct Methods(Arc<State>);

impl std::ops::Deref for Methods {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

/// The interface's methods. Each `SendRight` argument is a reference the request
/// brought: kept by a subscription, else released here.
impl MidiInput for Methods {
    fn subscribe(&self, cx: &Context, class: u8, port: SendRight) -> Result<(u32, u64), MidiError> {
        let result = (|| {
            let class = Class::from_wire(class).ok_or(MidiError::BadClass)?;
            let mut t = self.table();
            if self.is_dead(port.name) {
                return Err(MidiError::DeadPort);
            }
            if t.subs.iter().any(|s| s.port == port.name && s.class == class) {
                return Err(MidiError::AlreadySubscribed);
            }
            if t.subs.len() >= MAX_SUBSCRIPTIONS {
                return Err(MidiError::Full);
            }
            if t.subs.iter().filter(|s| s.owner.pid == cx.sender.pid).count() >= MAX_PER_CLIENT {
                return Err(MidiError::QuotaExceeded);
            }
            t.watched.watch(&self.space, port.name, self.notify).map_err(|_| MidiError::DeadPort)?;
            t.next_id += 1;
            let id = t.next_id;
            t.subs.push(Sub { id, port: port.name, class, owner: cx.sender, seq: 0 });
            t.stats.subscribed += 1;
            Ok((self.pid, id))
        })();
        if result.is_err() {
            if self.is_dead(port.name) && !self.table().subs.iter().any(|s| s.port == port.name) {
                let _ = self.space.destroy(port.name);
            } else {
                let _ = self.space.deallocate(port.name);
            }
        }
        result
    }

    fn unsubscribe(&self, cx: &Context, id: u64) -> Result<(), MidiError> {
        let mut t = self.table();
        let i = t.subs.iter().position(|s| s.id == id).ok_or(MidiError::NotSubscribed)?;
        let owner = t.subs[i].owner;
        if owner.pid != cx.sender.pid || owner.uid != cx.sender.uid {
            return Err(MidiError::NotOwner);
        }
        let sub = t.subs.remove(i);
        t.stats.unsubscribed += 1;
        t.watched.unwatch(&self.space, sub.port);
        let _ = self.space.deallocate(sub.port);
        Ok(())
    }

    fn stats(&self) -> Result<InputStats, MidiError> {
        Ok(self.snapshot())
    }

    fn device(&self) -> Result<String, MidiError> {
        Ok(self.device.clone())
    }
}

/// The driver thread and the drainer of its log ring, stopped and joined on drop.
#[derive(Debug)]
struct Driver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    drainer: Option<JoinHandle<()>>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The driver's end dropped its writer: the drainer logs what is left and stops.
        if let Some(d) = self.drainer.take() {
            d.thread().unpark();
            let _ = d.join();
        }
    }
}

/// What the driver thread logs, through its ring (it never formats or writes a line).
static DRIVER_EVENTS: &[RtEvent] = &[
    RtEvent {
        level: Level::WARN,
        name: "device_read_failed",
        message: "the device's read failed (errno {}, {} in a row)",
        fields: ["errno", "in_a_row", ""],
    },
    RtEvent {
        level: Level::ERROR,
        name: "device_gave_up",
        message: "the device failed {} reads in a row; the driver stops reading it",
        fields: ["in_a_row", "", ""],
    },
    RtEvent {
        level: Level::INFO,
        name: "device_ended",
        message: "the device ended after {} bytes",
        fields: ["bytes", "", ""],
    },
];
const DEVICE_READ_FAILED: usize = 0;
const DEVICE_GAVE_UP: usize = 1;
const DEVICE_ENDED: usize = 2;
/// Events the driver's ring holds between two drains ([`ictus_server::rtlog::DRAIN_PERIOD`]).
const DRIVER_LOG_SLOTS: usize = 64;

fn driver_thread(
    mut device: Box<dyn Device>,
    mut producer: Producer,
    stop: &AtomicBool,
    counters: &DriverCounters,
    req: &ThreadRequest,
    mut log: RtWriter,
) {
    let granted = configure_current_thread(req);
    *counters.granted.lock().unwrap_or_else(PoisonError::into_inner) = granted.describe();
    let mut buf = vec![0u8; ictus_midi::device::cable::MAX_DATAGRAM];
    let mut consecutive = 0u32;
    while !stop.load(Ordering::SeqCst) {
        match device.read(&mut buf, Some(DRIVER_POLL)) {
            Ok(0) => {
                counters.ended.store(true, Ordering::SeqCst);
                log.record(DEVICE_ENDED, clock::now().as_nanos(), [counters.bytes.load(Ordering::Relaxed), 0, 0]);
                break;
            }
            Ok(n) => {
                let t = clock::now();
                // Counted before publishing: the server's Acquire of the ring's head then
                // sees the count, so its stats never lag what it delivered.
                counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                producer.push(t, &buf[..n]);
                counters.wakeups.store(producer.rings(), Ordering::Relaxed);
                consecutive = 0;
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
            Err(e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                consecutive += 1;
                let at = clock::now().as_nanos();
                let errno = e.raw_os_error().map_or(0, i32::unsigned_abs);
                log.record(DEVICE_READ_FAILED, at, [u64::from(errno), u64::from(consecutive), 0]);
                if consecutive >= MAX_CONSECUTIVE_ERRORS {
                    counters.ended.store(true, Ordering::SeqCst);
                    log.record(DEVICE_GAVE_UP, at, [u64::from(consecutive), 0, 0]);
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// What the skeleton runs: the ring's consumer, the parser, the subscriptions.
#[derive(Debug)]
pub struct Core {
    state: Arc<State>,
    requests: ictus_idl::Server,
    consumer: Consumer,
    parser: Parser,
    malformed: u64,
    _driver: Driver,
}

impl Core {
    /// Parse and deliver everything in the ring.
    fn drain_ring(&mut self) {
        let mut any = false;
        while let Some(chunk) = self.consumer.pop() {
            any = true;
            for &b in chunk.bytes() {
                for m in self.parser.feed(b, chunk.time) {
                    let overflow = m.overflow();
                    self.state.deliver(&m, overflow);
                }
            }
        }
        if any || self.consumer.corrupt() > 0 {
            let p = self.parser.stats();
            let mut s = self.state.parse.lock().unwrap_or_else(PoisonError::into_inner);
            s.parsed_bytes = p.bytes;
            s.messages = p.messages;
            s.running_status = p.running_status;
            s.stray_data = p.stray_data;
            s.undefined = p.undefined;
            s.stray_eox = p.stray_eox;
            s.incomplete = p.incomplete;
            s.sysex_overflow = p.sysex_overflow;
            s.sysex_unterminated = p.sysex_unterminated;
            s.ring_overflow = self.consumer.overflow();
            s.ring_corrupt = self.consumer.corrupt();
            s.refused = self.malformed;
        }
    }
}

impl Serve for Core {
    const NAME: &'static str = "midi-server";

    fn request(&mut self, msg: &mut Received) -> Dispatched {
        let d = self.requests.handle(msg);
        if matches!(d, Dispatched::BadRequest(_) | Dispatched::NotMine) {
            self.state.table().stats.refused += 1;
        }
        d
    }

    fn dead_name(&mut self, name: Name) {
        self.state.dead_name(name);
    }

    /// Drain the ring, then sleep on its bell only if it is still empty once the
    /// driver has been told we sleep.
    fn prepare(&mut self) -> Result<Wait, ServeError> {
        self.drain_ring();
        Ok(if self.consumer.prepare_sleep() { Wait::Until(None) } else { Wait::Again })
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.consumer.bell()]
    }

    fn ready(&mut self, _bell: usize) -> Result<(), ServeError> {
        self.consumer.clear_bell();
        Ok(())
    }

    fn malformed(&mut self, count: u64, _e: &ReceiveError) {
        // Counted, not logged: the counters say it (`ictus midi-server --stats`).
        self.malformed = count;
        self.state.parse.lock().unwrap_or_else(PoisonError::into_inner).refused = count;
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // The subscriptions' rights first; the ports go with the loop afterwards.
        self.state.release_all();
    }
}

/// The input server. See the module documentation.
#[derive(Debug)]
pub struct Server {
    inner: Loop<Core, 1>,
    server_thread: ThreadRequest,
}

impl Server {
    /// A server reading `device`, its ports in `space` ([`Space::task`] for a real
    /// server). Starts the driver thread.
    pub fn new(space: Space, device: Box<dyn Device>, options: &Options) -> Result<Server, ServeError> {
        let ports = ServicePorts::allocate(&space)?;
        ports.set_message_limit(SMALL_REQUESTS)?;
        let (producer, consumer) = ring::ring(options.ring_slots).map_err(|e| ServeError::setup("ring", e))?;
        let counters = Arc::new(DriverCounters::default());
        let state = Arc::new(State {
            space: space.clone(),
            notify: ports.notify(),
            pid: std::process::id(),
            device: device.describe(),
            table: Mutex::default(),
            parse: Mutex::default(),
            driver: Arc::clone(&counters),
        });
        let requests = ictus_idl::Server::new(&space, ports.set())
            .with(MidiInputServer(Methods(Arc::clone(&state))))
            // Replies never wait: a client that stops reading must not stall the only thread.
            .with_reply_timeout(Duration::ZERO);
        let stop = Arc::new(AtomicBool::new(false));
        // The ring is made here, before the driver thread runs: it allocates nothing.
        let (log, log_reader) = RtLog::channel(DRIVER_EVENTS, DRIVER_LOG_SLOTS);
        let drainer = RtLog::spawn_drainer(log_reader, "midi-server").map_err(ServeError::Thread)?;
        let thread = {
            let stop = Arc::clone(&stop);
            let req = options.driver_thread.clone();
            std::thread::Builder::new()
                .name("midi-driver".into())
                .spawn(move || driver_thread(device, producer, &stop, &counters, &req, log))
                .map_err(ServeError::Thread)?
        };
        let core = Core {
            state,
            requests,
            consumer,
            parser: Parser::with_max_sysex(options.max_sysex),
            malformed: 0,
            _driver: Driver { stop, thread: Some(thread), drainer: Some(drainer) },
        };
        Ok(Server { inner: Loop::new(&space, ports, core), server_thread: options.server_thread.clone() })
    }

    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        self.inner.space()
    }

    /// The service port's receive right in [`Server::space`].
    pub fn service_port(&self) -> Name {
        self.inner.ports().service(0)
    }

    /// The counters.
    pub fn stats(&self) -> InputStats {
        self.inner.server().state.snapshot()
    }

    /// What the driver thread was granted by the scheduler (empty until it started).
    pub fn driver_granted(&self) -> String {
        self.inner.server().state.driver.granted.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Serve until `stop` becomes readable (a byte written, or its peer closed).
    /// Applies [`Options::server_thread`] to the calling thread.
    pub fn run(&mut self, stop: BorrowedFd<'_>) -> Result<(), ServeError> {
        configure_current_thread(&self.server_thread);
        self.inner.run(None, stop)
    }

    /// Receive and handle up to `max` messages already waiting; how many.
    pub fn handle_pending(&mut self, rcv: &mut Received, max: usize) -> Result<usize, ServeError> {
        self.inner.handle_pending(rcv, max)
    }

    /// Handle one message: a notification on the notify port, or a request.
    pub fn handle(&mut self, msg: &mut Received) -> Dispatched {
        self.inner.handle(msg)
    }

    /// Feed bytes to the parser as if the driver had read them at `time` (for tests of
    /// delivery without a device).
    #[doc(hidden)]
    pub fn inject_for_test(&mut self, bytes: &[u8], time: Time) {
        let core = self.inner.server_mut();
        for &b in bytes {
            for m in core.parser.feed(b, time) {
                let overflow = m.overflow();
                core.state.deliver(&m, overflow);
            }
        }
    }
}

/// A server running on a thread of this process (tests, programs that embed one).
/// Dropping it stops the server.
#[derive(Debug)]
#[must_use = "dropping a Running stops the server"]
pub struct Running {
    inner: ictus_server::Running,
    space: Space,
    service: Name,
    state: Arc<State>,
}

/// Start a server reading `device` on a new thread, its ports in `space`.
pub fn spawn(space: Space, device: Box<dyn Device>, options: &Options) -> Result<Running, ServeError> {
    let mut server = Server::new(space.clone(), device, options)?;
    let service = server.service_port();
    let state = Arc::clone(&server.inner.server().state);
    let inner = ictus_server::Running::spawn("midi-server", move |stop| {
        let r = server.run(stop);
        drop(server);
        r
    })?;
    Ok(Running { inner, space, service, state })
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

    /// A new send right to the service port, as a descriptor.
    pub fn service_fd(&self) -> Result<OwnedFd, RightsError> {
        self.space.send_right_fd(self.service)
    }

    /// The counters.
    pub fn stats(&self) -> InputStats {
        self.state.snapshot()
    }

    /// What the driver thread was granted by the scheduler (empty until it started).
    pub fn driver_granted(&self) -> String {
        self.state.driver.granted.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stop the server and wait for it.
    pub fn stop(self) -> Result<(), ServeError> {
        self.inner.stop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::os::fd::AsFd as _;

    /// A device whose reads fail `fails` times with EIO, then end.
    #[derive(Debug)]
    struct Failing {
        fails: u32,
        fd: OwnedFd,
    }

    impl Device for Failing {
        fn describe(&self) -> String {
            "failing".into()
        }
        fn read(&mut self, _buf: &mut [u8], _timeout: Option<Duration>) -> io::Result<usize> {
            if self.fails == 0 {
                return Ok(0);
            }
            self.fails -= 1;
            Err(io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error()))
        }
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            Ok(bytes.len())
        }
        fn wait_writable(&mut self, _timeout: Option<Duration>) -> io::Result<bool> {
            Ok(true)
        }
        fn fd(&self) -> BorrowedFd<'_> {
            self.fd.as_fd()
        }
    }

    #[test]
    fn the_driver_logs_its_device_errors_through_its_ring() {
        let fd = std::fs::File::open("/dev/null").unwrap().into();
        let (producer, _consumer) = ring::ring(16).unwrap();
        let (log, reader) = RtLog::channel(DRIVER_EVENTS, DRIVER_LOG_SLOTS);
        let counters = DriverCounters::default();
        let stop = AtomicBool::new(false);
        driver_thread(Box::new(Failing { fails: 3, fd }), producer, &stop, &counters, &ThreadRequest::default(), log);
        let mut got = Vec::new();
        reader.drain(|d| got.push((d.event, d.args)));
        let eio = u64::from(rustix::io::Errno::IO.raw_os_error().unsigned_abs());
        assert_eq!(
            got,
            [
                (DEVICE_READ_FAILED, [eio, 1, 0]),
                (DEVICE_READ_FAILED, [eio, 2, 0]),
                (DEVICE_READ_FAILED, [eio, 3, 0]),
                (DEVICE_ENDED, [0, 0, 0]),
            ]
        );
        assert_eq!(reader.lost(), 0);
        assert_eq!(counters.errors.load(Ordering::Relaxed), 3);
    }
}
