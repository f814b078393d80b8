//! The Tactus server (000 §7, Figure 2): clients send timestamped items ahead of real
//! time; the server buffers them and hands each to its device at its time, keeping the
//! streams of a presentation in step.
//!
//! - [`core`]: clients, presentations (each with its time map), streams and their
//!   queues, under one priority-inheriting lock.
//! - `serve`: the loop thread, on the server skeleton: the service port, every
//!   client's shared-memory channel (items in the ring, frames in pool buffers held
//!   until shown), a socket transport for comparison, and status reports.
//! - `deliver`: the delivery thread, real-time when permitted, which never waits for
//!   a server, a client or a device.
//! - [`device`], [`audio`]: the display server, WAV sinks with their own clocks, the
//!   MIDI output library, `null`.
//! - [`play`], [`gst`]: `ictus play FILE|DIR`, disk → application → Tactus → devices.
//! - [`cli`]: `ictus tactus serve|status`.
//! - [`bench`]: `ictus bench tactus` (000 §11's frame timing model; delivery beside GStreamer).
//!
//! `doc/tactus.md` explains the design.
#![deny(unsafe_code)]

pub mod audio;
pub mod bench;
pub mod cli;
pub mod core;
mod deliver;
pub mod device;
pub mod gst;
pub mod play;
mod serve;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_ipc::{Name, Space};
use ictus_rt::sync::PiMutex;
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_server::{Loop, ServeError, ServicePorts};
use ictus_shm::{ServerConfig, SleepMode, WaitConfig};
use ictus_tactus::TactusServiceServer;

pub use crate::core::Counters;
pub use deliver::now;
use deliver::Shared;

/// A thread request for `SCHED_FIFO` at `priority`, timer slack 1 ns.
pub fn rt(priority: u8) -> ThreadRequest {
    ThreadRequest {
        policy: Some(Policy::Fifo { priority }),
        timer_slack: Some(Duration::from_nanos(1)),
        ..ThreadRequest::default()
    }
}

/// How the server runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// How devices are opened and how early they take items.
    pub devices: device::Options,
    /// The socket transport's path (`None`: no socket transport).
    pub socket: Option<PathBuf>,
    /// The delivery thread (default `SCHED_FIFO` 70).
    pub delivery_thread: ThreadRequest,
    /// The loop thread (default `SCHED_FIFO` 50: above clients, below delivery).
    pub loop_thread: ThreadRequest,
    /// Lateness below this is not lateness (the delivery thread's own wake-up).
    pub grace: Duration,
    /// How often each client with a presentation gets a status report.
    pub status_period: Duration,
    /// How the shared-memory side waits.
    pub shm_wait: WaitConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            devices: device::Options::default(),
            socket: None,
            delivery_thread: rt(70),
            loop_thread: rt(50),
            grace: Duration::from_micros(500),
            status_period: Duration::from_millis(100),
            shm_wait: WaitConfig { spin: Duration::ZERO, liveness: Duration::from_millis(20) },
        }
    }
}

impl Options {
    /// The defaults with every thread timesharing (tests, unprivileged use).
    pub fn timesharing() -> Options {
        let mut o = Options {
            delivery_thread: ThreadRequest::default(),
            loop_thread: ThreadRequest::default(),
            ..Options::default()
        };
        o.devices.audio_thread = ThreadRequest::default();
        o.devices.midi = ictus_midi::output::OutputOptions::timesharing();
        o
    }
}

/// The server: its loop (on the skeleton) and its delivery thread.
pub struct Server {
    inner: Loop<serve::Tactus, 1>,
    delivery: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    loop_thread: ThreadRequest,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tactus::Server")
    }
}

impl Server {
    /// A server with its ports in `space`; starts the delivery thread.
    pub fn new(space: &Space, opts: Options) -> Result<Server, ServeError> {
        let ports = ServicePorts::<1>::allocate(space)?;
        let config = ServerConfig { wait: opts.shm_wait, sleep: SleepMode::Poll, ..ServerConfig::default() };
        let shm = ictus_shm::Server::new(space, config).map_err(|e| ServeError::setup("shared-memory channels", e))?;
        let wake: OwnedFd =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
                .map_err(|e| ServeError::setup("eventfd", e))?;
        let wake_loop = wake.try_clone().map_err(|e| ServeError::setup("eventfd", e))?;
        let listener = match &opts.socket {
            Some(p) => {
                let _ = std::fs::remove_file(p);
                let l = UnixListener::bind(p).map_err(|e| ServeError::setup("the socket transport", e))?;
                l.set_nonblocking(true).map_err(|e| ServeError::setup("socket", e))?;
                Some(l)
            }
            None => None,
        };
        let shared = Arc::new(Shared { core: PiMutex::new(core::Core::default()), bell: AtomicU32::new(0), wake_loop });
        let methods =
            serve::Methods { shm_service: shm.service(), socket: opts.socket.clone(), shared: Arc::clone(&shared) };
        let requests = ictus_idl::Server::new(space, ports.set())
            .with(TactusServiceServer(methods))
            .with_reply_timeout(Duration::ZERO);
        let tactus = serve::Tactus::new(
            Arc::clone(&shared),
            shm,
            wake,
            listener,
            requests,
            opts.devices.clone(),
            opts.status_period,
        );
        let delivery = {
            let shared = Arc::clone(&shared);
            let (req, grace) = (opts.delivery_thread.clone(), opts.grace);
            std::thread::Builder::new()
                .name("tactus-deliver".into())
                .spawn(move || deliver::run(shared, req, grace))
                .map_err(ServeError::Thread)?
        };
        Ok(Server {
            inner: Loop::new(space, ports, tactus),
            delivery: Some(delivery),
            shared,
            loop_thread: opts.loop_thread,
        })
    }

    /// The service port (a receive right in the server's space).
    pub fn service_port(&self) -> Name {
        self.inner.ports().service(0)
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.shared.core.lock().counters
    }

    /// Serve until `stop` is readable.
    pub fn run(&mut self, stop: std::os::fd::BorrowedFd<'_>) -> Result<(), ServeError> {
        configure_current_thread(&self.loop_thread);
        self.inner.run(None, stop)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.core.lock().stop = true;
        self.shared.ring();
        if let Some(h) = self.delivery.take() {
            let _ = h.join();
        }
    }
}

/// A server on a thread of this process; dropping it stops it.
#[derive(Debug)]
#[must_use = "dropping a Running stops the server"]
pub struct Running {
    inner: ictus_server::Running,
    space: Space,
    service: Name,
    shared: Arc<Shared>,
}

/// Start a server on a new thread, its ports in `space`.
pub fn spawn(space: &Space, opts: Options) -> Result<Running, ServeError> {
    let mut server = Server::new(space, opts)?;
    let service = server.service_port();
    let shared = Arc::clone(&server.shared);
    let inner = ictus_server::Running::spawn("tactus", move |stop| {
        let r = server.run(stop);
        drop(server);
        r
    })?;
    Ok(Running { inner, space: space.clone(), service, shared })
}

impl Running {
    /// The service port's receive right in [`Running::space`].
    pub fn service_port(&self) -> Name {
        self.service
    }

    /// The space.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// A send right to the service port, as a descriptor.
    pub fn service_fd(&self) -> Result<OwnedFd, ictus_ipc::RightsError> {
        self.space.send_right_fd(self.service)
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.shared.core.lock().counters
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        self.shared.core.lock().streams.len()
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.shared.core.lock().clients.len()
    }

    /// Stop and wait.
    pub fn stop(self) -> Result<(), ServeError> {
        self.inner.stop()
    }
}
