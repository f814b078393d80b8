//! MARS (001): the multimedia-on-demand stream server.
//!
//! - [`volume`]: striped volumes on files or block devices (the paper's ccd) and the
//!   [`volume::Storage`] trait the engine reads through;
//! - [`mmbuf`]: the pool of registered buffers that are both the disk's and the
//!   network's (the paper's mmbufs);
//! - [`engine`]: one io_uring thread doing every read and send, Deficit Round Robin per
//!   device, HTTP connections, paced streams;
//! - `sender`: the download thread, which sends full-speed downloads by `sendfile(2)`
//!   on non-blocking sockets driven by `epoll`, each piece when DRR says;
//! - [`api`]: the streams API and the control interface on ports, on the server
//!   skeleton; their protocol and clients are `ictus-mars-api` (re-exported as
//!   [`protocol`] and [`client`]);
//! - [`ceph`]: the same [`volume::Storage`] over a Ceph cluster (issue 20), through a
//!   stripe cache read ahead of each stream;
//! - [`measure`]: the volume's capability, for admission control;
//! - [`fallback`]: HTTP without io_uring;
//! - [`bench`]: `ictus bench mars` (001 Tables 1–3, HTTP beside nginx and a splice loop);
//! - [`cluster_bench`]: `ictus bench mars-cluster` (issue 20: nodes over Ceph beside
//!   nginx nodes behind a round-robin front);
//! - [`cli`]: `ictus mars …`.
//!
//! See `doc/mars.md`.
#![deny(unsafe_code)]

pub mod api;
pub mod bench;
pub mod ceph;
pub mod cli;
pub mod cluster_bench;
#[allow(unsafe_code)]
pub mod engine;
#[allow(unsafe_code)]
pub mod fallback;
#[allow(unsafe_code)]
pub mod measure;
#[allow(unsafe_code)]
pub mod mmbuf;
mod sender;
pub mod volume;

pub use ictus_mars_api::{client, protocol};

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use engine::{ConfigError, EngineConfig, EngineHandle, EngineStats, StreamState};
pub use volume::{LocalStorage, Storage, Volume, VolumeError};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The volume.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// The engine's settings cannot work.
    #[error("engine settings: {0}")]
    Config(#[from] engine::ConfigError),
    /// The listening socket.
    #[error("listening on {0}: {1}")]
    Listen(String, #[source] std::io::Error),
    /// The engine.
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    /// The Ceph backend.
    #[error(transparent)]
    Ceph(#[from] ceph::CephError),
    /// Measuring the volume.
    #[error("measuring the volume: {0}")]
    Measure(#[source] std::io::Error),
    /// The upcall runtime.
    #[error("the upcall runtime: {0}")]
    Runtime(String),
    /// A thread.
    #[error("starting a thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// How to start a server.
#[derive(Clone, Debug)]
pub struct StartOptions {
    /// The volume's components.
    pub volume: Vec<PathBuf>,
    /// HTTP address (`127.0.0.1:0` picks a port), or none.
    pub listen: Option<String>,
    /// Bytes/s admission works from; measured at start if none.
    pub capability: Option<f64>,
    /// The engine's settings.
    pub engine: EngineConfig,
    /// Serve with the fallback even where io_uring works (for tests and comparisons).
    pub force_fallback: bool,
}

/// A running server (engine, upcall runtime, or the fallback).
#[derive(Debug)]
pub struct Running {
    /// The engine's handle (none under the fallback).
    pub handle: Option<EngineHandle>,
    /// Where HTTP listens.
    pub addr: Option<SocketAddr>,
    /// The capability admission works from (bytes/s).
    pub capability: f64,
    /// Whether reads are `O_DIRECT`.
    pub direct: bool,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    fallback_stop: Option<Arc<AtomicBool>>,
    _rt: Option<ictus_rt::runtime::Runtime>,
}

static WARN_FALLBACK: AtomicBool = AtomicBool::new(false);
static WARN_DIRECT: AtomicBool = AtomicBool::new(false);

/// Starts a server on its own threads.
pub fn start(opts: &StartOptions) -> Result<Running, StartError> {
    let storage = LocalStorage::open(&opts.volume)?;
    if !storage.direct() && !WARN_DIRECT.swap(true, Ordering::Relaxed) {
        eprintln!(
            "ictus mars: warning: O_DIRECT refused on the volume's file system: reads go through the page cache (a copy, and cache pollution)"
        );
    }
    start_on(Arc::new(storage), opts)
}

/// Starts a server whose clips are in a Ceph cluster (`opts.volume` is not used);
/// returns the backend too, for its cache's report to the director. Without a
/// `capability`, the cluster's read rate is measured for admission.
pub fn start_cluster(
    ceph: &ceph::CephOptions,
    opts: &StartOptions,
) -> Result<(Running, Arc<ceph::CephStorage>), StartError> {
    let storage = Arc::new(ceph::CephStorage::open(ceph)?);
    let mut opts = opts.clone();
    if opts.capability.is_none() {
        let rate = ceph::measure(storage.striper(), Duration::from_millis(1000), ceph.fetchers)
            .map_err(|e| StartError::Ceph(ceph::CephError::Store(e)))?;
        opts.capability = Some(rate);
    }
    let running = start_on(storage.clone(), &opts)?;
    Ok((running, storage))
}

/// A TCP listener on `addr` whose accept queue is as deep as the host allows.
///
/// The standard library listens with a backlog of 128. A client that opens connections
/// in a burst while the engine thread waits for a CPU (a two-core VM, a loaded machine)
/// fills 128 in a few milliseconds; the next SYN is dropped and that client waits for
/// its retransmission, 1 s later, then 3 s… (10,000 idle connections took minutes and
/// met the idle timeout). Listening again on a listening socket only changes the backlog;
/// the kernel caps it at `net.core.somaxconn` (4096 by default).
pub fn listen_tcp<A: std::net::ToSocketAddrs>(addr: A) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr)?;
    rustix::net::listen(&l, i32::MAX)?;
    Ok(l)
}

/// Starts a server over `storage` on its own threads (`opts.volume` is not used).
pub fn start_on(storage: Arc<dyn Storage>, opts: &StartOptions) -> Result<Running, StartError> {
    // Before anything: settings that cannot work are refused, never served by the
    // fallback (which an engine error otherwise falls back to).
    opts.engine.validate()?;
    let direct = storage.direct();
    let listener = match &opts.listen {
        Some(a) => Some(listen_tcp(a).map_err(|e| StartError::Listen(a.clone(), e))?),
        None => None,
    };
    let addr = listener.as_ref().and_then(|l| l.local_addr().ok());
    let capability = match opts.capability {
        Some(c) => c,
        None => measure::capability(&*storage, opts.engine.device_depth, Duration::from_millis(1500)).unwrap_or(0.0),
    };
    let uring = if opts.force_fallback {
        Err(engine::EngineError::NoUring(std::io::Error::other("fallback forced")))
    } else {
        let rt = ictus_rt::runtime::Runtime::start(ictus_rt::runtime::RuntimeConfig::default())
            .map_err(|e| StartError::Runtime(e.to_string()))?;
        let storage_dyn = Arc::clone(&storage);
        let listener_clone = match &listener {
            Some(l) => Some(l.try_clone().map_err(StartError::Thread)?),
            None => None,
        };
        engine::Engine::new(storage_dyn, listener_clone, opts.engine.clone(), capability, Some(rt.handle()))
            .map(|(e, h)| (e, h, rt))
    };
    match uring {
        Ok((eng, handle, rt)) => {
            let thread = engine::spawn(eng, &handle).map_err(StartError::Thread)?;
            drop(listener);
            Ok(Running {
                handle: Some(handle),
                addr,
                capability,
                direct,
                thread: Some(thread),
                fallback_stop: None,
                _rt: Some(rt),
            })
        }
        Err(e) => {
            if !WARN_FALLBACK.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "ictus mars: warning: {e}; serving HTTP with the fallback (blocking threads): no DRR, no zero-copy send, no streams API, no pacing"
                );
            }
            let Some(listener) = listener else { return Err(e.into()) };
            let stop = Arc::new(AtomicBool::new(false));
            let (s, st) = (Arc::clone(&storage), Arc::clone(&stop));
            let buf = opts.engine.buf_size;
            let thread = std::thread::Builder::new()
                .name("ictus-mars-fallback".into())
                .spawn(move || fallback::serve(s, listener, st, buf))
                .map_err(StartError::Thread)?;
            Ok(Running {
                handle: None,
                addr,
                capability,
                direct,
                thread: Some(thread),
                fallback_stop: Some(stop),
                _rt: None,
            })
        }
    }
}

impl Running {
    /// Stops the server and waits for its threads.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(h) = &self.handle {
            h.post(engine::Command::Stop);
        }
        if let Some(s) = &self.fallback_stop {
            s.store(true, Ordering::Release);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    /// The accept queue is the host's maximum, not the standard library's 128: for a
    /// listening socket, `TCP_INFO`'s `tcpi_sacked` is the queue's limit.
    #[test]
    fn listener_queue_is_as_deep_as_the_host_allows() {
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .expect("somaxconn")
            .trim()
            .parse()
            .expect("a number");
        let l = super::listen_tcp("127.0.0.1:0").expect("listening");
        let (info, _) = crate::engine::tcp_info(l.as_fd()).expect("TCP_INFO");
        assert_eq!(info.tcpi_sacked, somaxconn);
    }
}
