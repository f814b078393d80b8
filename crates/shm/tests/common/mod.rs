//! Helpers shared by the channel tests: an echo server on a thread, clients, and
//! the watchdog every wait is bounded by. No test asserts a duration.
#![allow(dead_code)] // each test binary uses its own subset

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ictus_ipc::Space;
use ictus_shm::{Client, ClientOptions, Event, Geometry, Next, Server, ServerConfig, WaitConfig};

/// How long any one wait may take before the test is declared hung.
pub const WATCHDOG: Duration = Duration::from_secs(30);

/// A channel geometry: 4 KiB rings and `slots` pool buffers of 64 KiB.
pub fn geometry(slots: u32) -> Geometry {
    Geometry::new(4096, 4096, slots, 64 << 10).expect("valid geometry")
}

/// Client options with a geometry.
pub fn options(geometry: Geometry) -> ClientOptions {
    ClientOptions { geometry, wait: WaitConfig::default(), timeout: WATCHDOG }
}

/// The echo server's answer to a pool record: the payload's length and byte sum.
pub fn digest(data: &[u8]) -> Vec<u8> {
    let sum: u64 = data.iter().map(|&b| u64::from(b)).sum();
    [(data.len() as u64).to_le_bytes(), sum.to_le_bytes()].concat()
}

/// A test pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

/// Serve one record the echo way: in-line records come back as they are with the
/// tag plus one, pool records as their digest.
pub fn echo(next: Next<'_>, events: &mpsc::Sender<Event>) {
    match next {
        Next::Event(e) => {
            let _ = events.send(e);
        }
        Next::Record(mut r) => {
            let data = r.payload().to_vec();
            let answer = if r.is_pool() { digest(&data) } else { data };
            let tag = r.tag().wrapping_add(1);
            if r.reply(tag, &answer) == Err(ictus_shm::ReplyError::Full) {
                // The client is not reading yet: keep its record and come back.
                r.retry_later();
                std::thread::yield_now();
            }
        }
    }
}

/// An echo server on its own thread, stopped and joined on drop.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Server>>,
    /// Channel events, in order.
    pub events: mpsc::Receiver<Event>,
    /// A send right to the service port, as a descriptor.
    pub service: OwnedFd,
    /// The server thread's id (see `ictus_testkit::wait_thread_asleep`).
    pub tid: u32,
}

impl EchoServer {
    pub fn start(config: ServerConfig) -> EchoServer {
        let space = Space::new();
        let mut server = Server::new(&space, config).expect("server");
        let service = space.send_right_fd(server.service()).expect("send right");
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, events) = mpsc::channel();
        let s = stop.clone();
        let (tid_tx, tid_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            tid_tx.send(ictus_testkit::gettid()).expect("tid");
            while !s.load(Ordering::Relaxed) {
                server.wait(Some(Duration::from_millis(5))).expect("wait");
                while let Some(next) = server.try_next() {
                    echo(next, &tx);
                }
            }
            server
        });
        let tid = tid_rx.recv_timeout(WATCHDOG).expect("the server thread starts");
        EchoServer { stop, thread: Some(thread), events, service, tid }
    }

    /// A client of this server.
    pub fn client(&self, opts: ClientOptions) -> Client {
        connect(&self.service, opts)
    }

    /// The next event, within the watchdog.
    pub fn event(&self) -> Event {
        self.events.recv_timeout(WATCHDOG).expect("an event within the watchdog")
    }

    /// Stop the server and get it back.
    pub fn stop(mut self) -> Server {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().expect("running").join().expect("server thread")
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connect to the service behind a send-right descriptor, from a space of its own.
pub fn connect(service: &OwnedFd, opts: ClientOptions) -> Client {
    let space = Space::new();
    let fd = rustix::io::fcntl_dupfd_cloexec(service.as_fd(), 0).expect("dup");
    let name = space.insert_send_fd(fd).expect("insert");
    Client::connect(&space, name, opts).expect("connect")
}

/// One round trip: send, then the reply's tag and bytes.
pub fn round_trip(c: &mut Client, tag: u32, data: &[u8]) -> (u32, Vec<u8>) {
    c.send_wait(tag, data, Some(WATCHDOG)).expect("send");
    let r = c.recv(Some(WATCHDOG)).expect("reply");
    (r.tag(), r.to_vec())
}

/// Wait until `f` holds, or panic after the watchdog.
#[track_caller]
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < WATCHDOG, "{what}: not within the watchdog");
        std::thread::sleep(Duration::from_millis(2));
    }
}
