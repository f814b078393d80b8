//! The ictus display server: the window server of 002, drawn into over a socket, over
//! ports or over shared-memory rings, shown through an X server with MIT-SHM or kept
//! headless in memory.
//!
//! - [`raster`]: software drawing on a window's pixels (pure, tested alone).
//! - `core`: windows, per-client sessions executing requests, outboxes.
//! - `transport`: the three transports, one thread each; the port transport is the
//!   server skeleton's loop ([`ictus_server::Loop`]), whose service port every client
//!   opens its connection on.
//! - `present`: the presenter thread: damage at the refresh rate, frames at their
//!   time, syncs that wait for the screen.
//! - [`x11`]: the X server as the screen (x11rb, MIT-SHM `ShmAttachFd`/`ShmPutImage`,
//!   plain `PutImage` without it).
//! - [`xvfb`]: a private Xvfb for tests and experiments.
//! - [`bench`]: the `display` experiment (002 Table 1 and §4.2, 000 §10).
//! - [`cli`]: `ictus display`.
//!
//! `doc/display.md` explains the design, the wake-up protocol, what a hostile client
//! can and cannot do, and the numbers.
#![deny(unsafe_code)]

pub mod bench;
pub mod cli;
mod core;
mod present;
pub mod raster;
pub mod sched;
#[allow(unsafe_code)]
mod sys;
mod transport;
pub mod x11;
pub mod xvfb;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_ipc::{Name, Space};
use ictus_server::{Loop, ServicePorts};
use ictus_shm::{ServerConfig, SleepMode, WaitConfig};

pub use crate::core::Limits;
use crate::core::{lock, Core, Waker};
pub use crate::x11::XError;

/// Where windows are shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Screen {
    /// In memory only, on a screen of this size (save it with [`Running::save_png`]).
    Headless {
        /// Width.
        width: u16,
        /// Height.
        height: u16,
    },
    /// An X server: `display` (or `$DISPLAY`), with MIT-SHM unless refused.
    X {
        /// The display name.
        display: Option<String>,
        /// Use MIT-SHM when the X server has it.
        shm: bool,
    },
}

/// How to run a display server.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where windows are shown.
    pub screen: Screen,
    /// The socket transport's path (`None`: no socket transport).
    pub socket: Option<PathBuf>,
    /// Offer the shared-memory transport.
    pub shm: bool,
    /// How the shared-memory thread waits: spin up to `spin` when the machine has a
    /// CPU to spare ([`ictus_display::spin::SpinPolicy`]), then block.
    pub shm_wait: WaitConfig,
    /// What each client may use.
    pub limits: Limits,
    /// Presents of drawing per second at most (timed frames and syncs that wait for
    /// the screen are presented at once).
    pub refresh_hz: u32,
    /// The presenter and the transports' threads ask for `SCHED_FIFO`
    /// ([`sched::PRESENT_PRIORITY`], [`sched::TRANSPORT_PRIORITY`]); refused, they
    /// run as they are and the server says so once ([`Running::scheduling`]). On in
    /// the server process (`ictus display serve`, the experiment's server); off by
    /// default for a server embedded in another program's threads (tests), whose
    /// other threads it would otherwise outrank.
    pub realtime: bool,
    /// With [`Options::realtime`]: the transports' threads ask too (the presenter
    /// always does). Off, they stay timesharing while the presenter is real-time: on
    /// one CPU a real-time transport thread preempts its client at every wake-up, so a
    /// client's flushes no longer gather while the server is awake, which is what the
    /// shared-memory transport's "server is asleep" flag is for (doc/display.md).
    pub realtime_transports: bool,
}

impl Options {
    /// Headless, all transports, the socket at `socket`.
    pub fn headless(width: u16, height: u16, socket: Option<PathBuf>) -> Options {
        Options {
            screen: Screen::Headless { width, height },
            socket,
            shm: true,
            shm_wait: WaitConfig::default(),
            limits: Limits::default(),
            refresh_hz: 60,
            realtime: false,
            realtime_transports: true,
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The X server could not be used.
    #[error(transparent)]
    X(#[from] XError),
    /// Ports.
    #[error("ports: {0}")]
    Rights(#[from] ictus_ipc::RightsError),
    /// The shared-memory transport.
    #[error("shared-memory transport: {0}")]
    Shm(String),
    /// The socket.
    #[error("the display socket {path}: {source}")]
    Socket {
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The kernel refused.
    #[error("kernel: {0}")]
    Os(#[from] rustix::io::Errno),
    /// A thread could not be started.
    #[error("starting a thread: {0}")]
    Thread(std::io::Error),
    /// The server skeleton (the port transport's loop).
    #[error(transparent)]
    Serve(#[from] ictus_server::ServeError),
}

/// Counters of a running server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Present cycles, each acknowledged by the screen.
    pub presents: u64,
    /// Frames shown.
    pub frames_shown: u64,
    /// Frames dropped because a later one was due.
    pub frames_dropped: u64,
    /// Clients cut off (bad requests, corrupt rings, not reading).
    pub cut_off: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Clients ever connected.
    pub clients: u64,
    /// Windows now.
    pub windows: u64,
}

/// A window as the server knows it, for tests and tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowInfo {
    /// The client's number for it.
    pub id: u32,
    /// Its X window, if shown on an X server.
    pub xid: Option<u32>,
    /// Width.
    pub width: u16,
    /// Height.
    pub height: u16,
}

/// A display server running on threads of this process. Dropping it stops it.
#[derive(Debug)]
#[must_use = "dropping a Running stops the server"]
pub struct Running {
    core: Arc<Core>,
    space: Space,
    service: Name,
    socket: Option<PathBuf>,
    socket_wake: Option<Arc<Waker>>,
    threads: Vec<JoinHandle<()>>,
    ports: Option<ictus_server::Running>,
    scheduling: Vec<sched::ThreadScheduling>,
}

/// Start a display server with its ports in `space`. Clients reach it through the
/// service port ([`Running::service_port`]; register it with the name server as
/// [`ictus_display::SERVICE_NAME`]).
pub fn spawn(space: &Space, opts: Options) -> Result<Running, StartError> {
    let (x, screen) = match &opts.screen {
        Screen::Headless { width, height } => (None, (*width, *height)),
        Screen::X { display, shm } => {
            let x = x11::XConn::connect(display.as_deref(), *shm)?;
            let s = x.screen_size();
            (Some(Arc::new(x)), s)
        }
    };
    let refresh_ns = 1_000_000_000 / u64::from(opts.refresh_hz.max(1));
    let core = Arc::new(Core::new(screen, x, opts.limits, refresh_ns)?);
    let ports = ServicePorts::<1>::allocate(space)?;
    let service = ports.service(0);
    let mut running = Running {
        core: core.clone(),
        space: space.clone(),
        service,
        socket: None,
        socket_wake: None,
        threads: Vec::new(),
        ports: None,
        scheduling: Vec::new(),
    };
    // Each thread asks the scheduler first and reports what it got; spawn returns
    // once all have.
    let (sched_tx, sched_rx) = std::sync::mpsc::channel();
    let realtime = opts.realtime;
    let transports_rt = opts.realtime && opts.realtime_transports;
    let mut expected = 0;
    let mut thread = |name: &'static str, priority: u8, f: Box<dyn FnOnce() + Send>| {
        let tx = sched_tx.clone();
        expected += 1;
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let rt = if priority == sched::PRESENT_PRIORITY { realtime } else { transports_rt };
                sched::enter(name, rt, priority, &tx);
                drop(tx);
                f();
            })
            .map_err(StartError::Thread)
    };
    let shm_service = if opts.shm {
        let config = ServerConfig { wait: opts.shm_wait, sleep: SleepMode::Futex, ..ServerConfig::default() };
        let server = ictus_shm::Server::new(space, config).map_err(|e| StartError::Shm(e.to_string()))?;
        let svc = server.service();
        let svc_fd = space.send_right_fd(svc)?;
        let c = core.clone();
        let wait = opts.shm_wait;
        running.threads.push(thread(
            "ictus-display-shm",
            sched::TRANSPORT_PRIORITY,
            Box::new(move || transport::shm::run(c, server, wait)),
        )?);
        // The server's own channel to itself, whose records wake the thread.
        let own = Space::new();
        let name = own.insert_send_fd(svc_fd)?;
        let copts = ictus_shm::ClientOptions {
            geometry: ictus_shm::Geometry::new(4096, 4096, 0, 0).expect("valid"),
            wait: WaitConfig { spin: Duration::ZERO, liveness: Duration::from_millis(100) },
            timeout: Duration::from_secs(10),
        };
        let client = ictus_shm::Client::connect(&own, name, copts).map_err(|e| StartError::Shm(e.to_string()))?;
        *lock(&core.shm_waker) = Some(Arc::new(Waker::Shm(Mutex::new(Box::new(client)))));
        Some(svc)
    } else {
        None
    };
    if let Some(path) = &opts.socket {
        let listener = bind(path)?;
        let wake = transport::socket::waker()?;
        let (c, w) = (core.clone(), wake.clone());
        running.socket = Some(path.clone());
        running.socket_wake = Some(wake);
        running.threads.push(thread(
            "ictus-display-sock",
            sched::TRANSPORT_PRIORITY,
            Box::new(move || transport::socket::run(c, listener, w)),
        )?);
    }
    let c = core.clone();
    running.threads.push(thread("ictus-display-present", sched::PRESENT_PRIORITY, Box::new(move || present::run(c)))?);
    let offer = transport::port::Offer { shm_service, socket_path: opts.socket.clone() };
    let wake = transport::socket::waker()?;
    let server = transport::port::PortTransport::new(core, space, &ports, offer, wake);
    let mut ports_loop = Loop::new(space, ports, server);
    expected += 1;
    let tx = sched_tx.clone();
    running.ports = Some(ictus_server::Running::spawn("ictus-display-port", move |stop| {
        sched::enter("ictus-display-port", transports_rt, sched::TRANSPORT_PRIORITY, &tx);
        drop(tx);
        let r = ports_loop.run(None, stop);
        drop(ports_loop);
        r
    })?);
    drop(sched_tx);
    for _ in 0..expected {
        // Every thread reports before it does anything else; one that could not has
        // ended, and its sender with it.
        match sched_rx.recv() {
            Ok(s) => running.scheduling.push(s),
            Err(_) => break,
        }
    }
    Ok(running)
}

/// Bind the socket transport's listener, replacing a stale socket (one nobody
/// answers on) but never a live one or anything that is not a socket.
fn bind(path: &Path) -> Result<UnixListener, StartError> {
    let err = |source| StartError::Socket { path: path.to_owned(), source };
    if let Ok(md) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !md.file_type().is_socket() {
            return Err(err(std::io::Error::other("exists and is not a socket")));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(err(std::io::Error::other("another display server answers there")));
        }
        std::fs::remove_file(path).map_err(err)?;
    }
    UnixListener::bind(path).map_err(err)
}

impl Running {
    /// The space its ports live in.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The service port (a receive right in [`Running::space`]).
    pub fn service_port(&self) -> Name {
        self.service
    }

    /// Register the service port with the name server at `name_server` (its default
    /// socket if `None`) as `name`, and again whenever that name server restarts, until
    /// the [`Registrar`](ictus_server::Registrar) is stopped.
    pub fn register(
        &self,
        name: &str,
        name_server: Option<&Path>,
    ) -> Result<ictus_server::Registrar, ictus_server::RegisterError> {
        ictus_server::Registrar::start("display-server", name_server, &self.space, &[(name, self.service)])
    }

    /// A send right to the service port, as a descriptor (for `Space::insert_send_fd`).
    pub fn service_fd(&self) -> Result<OwnedFd, ictus_ipc::RightsError> {
        self.space.send_right_fd(self.service)
    }

    /// The socket transport's path.
    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        let s = &self.core.stats;
        Stats {
            presents: s.presents.load(Ordering::Relaxed),
            frames_shown: s.frames_shown.load(Ordering::Relaxed),
            frames_dropped: s.frames_dropped.load(Ordering::Relaxed),
            cut_off: s.cut_off.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
            clients: s.clients.load(Ordering::Relaxed),
            windows: lock(&self.core.windows).len() as u64,
        }
    }

    /// The windows, oldest first.
    pub fn windows(&self) -> Vec<WindowInfo> {
        let wins = lock(&self.core.windows);
        let mut v: Vec<_> = wins
            .values()
            .map(|w| {
                let st = lock(&w.st);
                (w.key, WindowInfo { id: w.id, xid: st.x.map(|x| x.id), width: st.rect.w, height: st.rect.h })
            })
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v.into_iter().map(|(_, i)| i).collect()
    }

    /// The screen as shown: every window composed on a screen-sized canvas,
    /// `(width, height, 0x00RRGGBB pixels)`.
    pub fn snapshot(&self) -> (usize, usize, Vec<u32>) {
        self.core.snapshot()
    }

    /// Save [`Running::snapshot`] as a PNG.
    pub fn save_png(&self, path: &Path) -> std::io::Result<()> {
        let (w, h, px) = self.snapshot();
        write_png(path, w, h, &px)
    }

    /// The X connection, when shown on an X server.
    pub fn x(&self) -> Option<&x11::XConn> {
        self.core.x.as_deref()
    }

    /// What each time-critical thread asked of the scheduler and got.
    pub fn scheduling(&self) -> &[sched::ThreadScheduling] {
        &self.scheduling
    }

    /// Stop: every thread ends, every client's windows and buffers go.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.core.stop.store(true, Ordering::Release);
        self.core.wake_presenter();
        if let Some(w) = &self.socket_wake {
            w.wake();
        }
        if let Some(w) = lock(&self.core.shm_waker).as_ref() {
            w.wake();
        }
        if let Some(p) = self.ports.take() {
            if let Err(e) = p.stop() {
                eprintln!("ictus display: the port transport stopped: {e}");
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        *lock(&self.core.shm_waker) = None;
        if let Some(p) = self.socket.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Write `0x00RRGGBB` pixels as an 8-bit RGB PNG.
pub fn write_png(path: &Path, w: usize, h: usize, px: &[u32]) -> std::io::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, w as u32, h as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(std::io::Error::other)?;
    let rgb: Vec<u8> = px.iter().flat_map(|p| [(p >> 16) as u8, (p >> 8) as u8, *p as u8]).collect();
    wr.write_image_data(&rgb).map_err(std::io::Error::other)?;
    wr.finish().map_err(std::io::Error::other)
}

/// Read an 8-bit RGB PNG written by [`write_png`] back as `(w, h, 0x00RRGGBB pixels)`.
pub fn read_png(path: &Path) -> std::io::Result<(usize, usize, Vec<u32>)> {
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path)?));
    let mut rd = dec.read_info().map_err(std::io::Error::other)?;
    let mut buf = vec![0; rd.output_buffer_size().ok_or_else(|| std::io::Error::other("image too large"))?];
    let info = rd.next_frame(&mut buf).map_err(std::io::Error::other)?;
    if info.color_type != png::ColorType::Rgb || info.bit_depth != png::BitDepth::Eight {
        return Err(std::io::Error::other(format!("{:?} {:?}, not 8-bit RGB", info.color_type, info.bit_depth)));
    }
    let px = buf[..info.buffer_size()]
        .chunks_exact(3)
        .map(|c| (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]))
        .collect();
    Ok((info.width as usize, info.height as usize, px))
}
