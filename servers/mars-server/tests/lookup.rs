//! A clip lookup that must ask afar (a Ceph node's `stat`) never holds the engine's
//! thread: while one request's lookup hangs, a stream already running on the same
//! engine is sent to its end, and the held request is answered once the lookup comes.
//!
//! The backend here is the local volume behind a gate: `slow.bin` (the volume's
//! `clip.bin` under another name) is "looked up afar" until the test opens the gate.
//! An engine that looked it up on its own thread would block in `lookup` at the gate,
//! the running stream would stop, and its read would hit the watchdog.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use ictus_mars_server::volume::{DeviceRead, StreamInfo};
use ictus_mars_server::{EngineConfig, LocalStorage, StartOptions, Storage};

/// The slow name and what it stands for.
const SLOW: &str = "slow.bin";
const MISSING: &str = "gone.bin";

struct Gated {
    inner: LocalStorage,
    /// Whether the gate is open.
    open: Mutex<bool>,
    opened: Condvar,
    /// `lookup_ready` calls for gated names.
    asked: AtomicU32,
    /// A `lookup` of a gated name on a closed gate (what the engine must never do).
    blocked: AtomicBool,
    waker: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl Gated {
    fn is_open(&self) -> bool {
        *self.open.lock().unwrap()
    }
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
        if let Some(w) = self.waker.lock().unwrap().as_ref() {
            w();
        }
    }
}

impl Storage for Gated {
    fn lookup(&self, name: &str) -> Option<StreamInfo> {
        if name != SLOW && name != MISSING {
            return self.inner.lookup(name);
        }
        // A synchronous lookup of a gated name waits for the gate, as a `stat` on the
        // caller's thread waits for the cluster.
        let mut open = self.open.lock().unwrap();
        if !*open {
            self.blocked.store(true, Ordering::SeqCst);
        }
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        drop(open);
        if name == MISSING {
            return None;
        }
        self.inner.lookup("clip.bin").map(|i| StreamInfo { name: SLOW.into(), ..i })
    }
    fn lookup_ready(&self, name: &str) -> bool {
        if name != SLOW && name != MISSING {
            return true;
        }
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.is_open()
    }
    fn streams(&self) -> Vec<StreamInfo> {
        self.inner.streams()
    }
    fn plan(&self, start: u64, len: u64) -> Vec<DeviceRead> {
        self.inner.plan(start, len)
    }
    fn devices(&self) -> Vec<BorrowedFd<'_>> {
        self.inner.devices()
    }
    fn direct(&self) -> bool {
        self.inner.direct()
    }
    fn align(&self) -> u64 {
        self.inner.align()
    }
    fn max_read(&self) -> u64 {
        self.inner.max_read()
    }
    fn cached(&self) -> Vec<BorrowedFd<'_>> {
        self.inner.cached()
    }
    fn done(&self, device: u16, offset: u64) {
        self.inner.done(device, offset)
    }
    fn ready(&self, start: u64, len: u64) -> bool {
        self.inner.ready(start, len)
    }
    fn set_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        *self.waker.lock().unwrap() = Some(wake);
    }
}

/// Opens the gate when dropped: a failing test (an engine stuck at the gate) ends
/// instead of hanging in the server's stop.
struct OpenOnDrop(Arc<Gated>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Sends `GET path` and returns the connection (read timeout: a watchdog).
fn ask(addr: std::net::SocketAddr, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET /{path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    s
}

/// Reads the rest of a response whose first bytes were `raw`.
fn read_all(mut s: TcpStream, mut raw: Vec<u8>, what: &str) -> (u16, String, Vec<u8>) {
    if let Err(e) = s.read_to_end(&mut raw) {
        panic!("{what}: read failed after {} bytes (a stalled engine hits this watchdog): {e}", raw.len());
    }
    split_response(&raw)
}

#[test]
fn a_slow_lookup_does_not_delay_a_running_stream() {
    let dir = TempDir::new("lookup");
    let (comps, clip, _) = volume(dir.path());
    let gated = Arc::new(Gated {
        inner: LocalStorage::open(&comps).unwrap(),
        open: Mutex::new(false),
        opened: Condvar::new(),
        asked: AtomicU32::new(0),
        blocked: AtomicBool::new(false),
        waker: Mutex::new(None),
    });
    let r = ictus_mars_server::start_on(
        gated.clone(),
        &StartOptions {
            volume: Vec::new(),
            listen: Some("127.0.0.1:0".into()),
            capability: Some(100e6),
            engine: EngineConfig { buf_size: 64 << 10, ..EngineConfig::default() },
            force_fallback: false,
        },
    )
    .expect("server starts");
    if r.handle.is_none() {
        eprintln!("skipped: no io_uring here (the fallback server looks up on its own threads)");
        return;
    }
    // Dropped before `r` (declared after it).
    let _open = OpenOnDrop(gated.clone());
    let addr = r.addr.unwrap();
    // A paced stream (3 MB at 4 MB/s: it lasts ~0.75 s) starts, then two requests whose
    // lookups hang: one for a clip that exists, one for one that does not.
    let running = ask(addr, "clip.bin?rate=4000000");
    let mut first = [0u8; 1];
    (&running).read_exact(&mut first).expect("the stream's first byte");
    let slow = ask(addr, SLOW);
    let gone = ask(addr, MISSING);
    assert!(
        eventually(Duration::from_secs(60), || gated.asked.load(Ordering::SeqCst) >= 2),
        "the engine asked whether the lookups were ready"
    );
    // With both lookups hanging, the running stream goes to its end, byte for byte.
    let (status, _, body) = read_all(running, first.to_vec(), "the running stream");
    assert_eq!(status, 200);
    assert_eq!(body.len(), clip.len(), "the whole stream came while the lookups hung");
    assert_eq!(body, clip);
    assert!(!gated.is_open(), "the gate was closed all along");
    assert!(!gated.blocked.load(Ordering::SeqCst), "the engine never looked a gated name up before the gate opened");
    // The lookups come: the held requests are answered.
    gated.release();
    let (status, head, body) = read_all(slow, Vec::new(), "the held request");
    assert_eq!(status, 200, "{head}");
    assert_eq!(body, clip);
    let (status, _, _) = read_all(gone, Vec::new(), "the held request for a missing clip");
    assert_eq!(status, 404);
    let s = r.handle.as_ref().unwrap().stats().unwrap();
    assert!(s.lookup_waits >= 2, "the engine held the two requests: {}", s.lookup_waits);
    r.stop();
}
