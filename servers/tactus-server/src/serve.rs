//! The loop thread: the service port (on the server skeleton), every client's
//! shared-memory channel, the socket transport, and what the delivery thread hands
//! back (held buffers, reports).

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_abi::ReturnCode;
use ictus_idl::{Dispatched, SendRight};
use ictus_ipc::{Name, Received};
use ictus_server::{Serve, ServeError, Wait};
use ictus_shm::{Event, Next};
use ictus_tactus::proto::{self, Control, Record, Report};
use ictus_tactus::TactusService;

use crate::core::Conn;
use crate::deliver::{now, Shared};
use crate::device::{self, Device};

/// Records taken per turn before the loop looks at its other descriptors.
const BATCH: usize = 256;
/// Bytes a socket client may leave unread before it is cut off.
const MAX_SOCKET_BACKLOG: usize = 16 << 20;

/// The port interface's methods.
pub struct Methods {
    pub(crate) shm_service: Name,
    pub(crate) socket: Option<PathBuf>,
    pub(crate) shared: Arc<Shared>,
}

impl TactusService for Methods {
    fn channel(&self, version: u32) -> Result<SendRight, ReturnCode> {
        if version != proto::VERSION {
            return Err(ReturnCode::InvalidArgument);
        }
        Ok(SendRight::make(self.shm_service))
    }

    fn socket(&self, version: u32) -> Result<String, ReturnCode> {
        if version != proto::VERSION {
            return Err(ReturnCode::InvalidArgument);
        }
        self.socket.as_ref().map(|p| p.to_string_lossy().into_owned()).ok_or(ReturnCode::InvalidName)
    }

    fn stats(&self) -> Result<String, ReturnCode> {
        let core = self.shared.core.lock();
        let c = core.counters;
        Ok(serde_json::json!({
            "clients": core.clients.len(),
            "presentations": core.pres.len(),
            "streams": core.streams.len(),
            "queued_items": core.streams.values().map(|s| s.queue.len()).sum::<usize>(),
            "clients_ever": c.clients,
            "records": c.records,
            "items": c.items,
            "delivered": c.delivered,
            "refused": c.refused,
            "reports_dropped": c.reports_dropped,
        })
        .to_string())
    }
}

struct SocketClient {
    id: u64,
    stream: UnixStream,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
}

/// The loop's part of the server.
pub struct Tactus {
    pub(crate) shared: Arc<Shared>,
    pub(crate) shm: ictus_shm::Server,
    pub(crate) wake: OwnedFd,
    pub(crate) listener: Option<UnixListener>,
    sockets: Vec<SocketClient>,
    next_socket: u64,
    pub(crate) requests: ictus_idl::Server,
    pub(crate) devices: device::Options,
    status_period: Duration,
    next_status: Instant,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for Tactus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tactus({} socket clients)", self.sockets.len())
    }
}

impl Tactus {
    pub(crate) fn new(
        shared: Arc<Shared>,
        shm: ictus_shm::Server,
        wake: OwnedFd,
        listener: Option<UnixListener>,
        requests: ictus_idl::Server,
        devices: device::Options,
        status_period: Duration,
    ) -> Tactus {
        Tactus {
            shared,
            shm,
            wake,
            listener,
            sockets: Vec::new(),
            next_socket: 1,
            requests,
            devices,
            status_period,
            next_status: Instant::now() + status_period,
            scratch: Vec::new(),
        }
    }

    /// Close devices outside the lock (a MIDI output joins its threads, an audio sink
    /// finishes its file, a display connection goes).
    fn close_devices(devices: Vec<Device>) {
        drop(devices);
    }

    fn gone(&mut self, conn: Conn) {
        let (devices, held) = self.shared.core.lock().gone(conn);
        for h in held {
            let _ = self.shm.release(h);
        }
        Self::close_devices(devices);
        self.shared.ring();
    }

    /// Act on one validated record of `conn`.
    fn record(&mut self, conn: Conn, tag: u32, bytes: &[u8]) {
        let t = now();
        let rec = match Record::decode(tag, bytes) {
            Ok(r) => r,
            Err(e) => {
                let mut core = self.shared.core.lock();
                core.counters.refused += 1;
                core.outbox.push_back((conn, Report::Error(proto::ErrorReport { id: 0, text: e.to_string() })));
                return;
            }
        };
        match rec {
            Record::Control(c @ Control::OpenStream { .. }) => {
                let Control::OpenStream { id, kind, ref device, .. } = c else { unreachable!() };
                // Open the device first, without the lock: it may call the display server.
                match device::open(device, kind, &self.devices, t) {
                    Ok(dev) => {
                        let refused = self.shared.core.lock().open_stream(conn, &c, dev);
                        if let Err(dev) = refused {
                            Self::close_devices(vec![dev]);
                        }
                    }
                    Err(why) => {
                        let mut core = self.shared.core.lock();
                        core.counters.refused += 1;
                        core.outbox.push_back((
                            conn,
                            Report::Error(proto::ErrorReport {
                                id,
                                text: format!("stream {id}: device {device:?}: {why}"),
                            }),
                        ));
                    }
                }
            }
            Record::Control(c) => {
                let fx = self.shared.core.lock().control(conn, c, t);
                Self::close_devices(fx.closed);
            }
            Record::Item(h, inline) => {
                let back = self.shared.core.lock().item(conn, h, inline, t);
                if let Some(h) = back {
                    let _ = self.shm.release(h);
                }
            }
            Record::Attachment => {
                let mut core = self.shared.core.lock();
                core.counters.refused += 1;
                core.outbox.push_back((
                    conn,
                    Report::Error(proto::ErrorReport { id: 0, text: "an attachment must be a pool buffer".into() }),
                ));
            }
        }
        self.shared.core.lock().counters.records += 1;
        self.shared.ring();
    }

    /// Take what the shared-memory channels hold, up to a batch; whether more may wait.
    fn drain_shm(&mut self) -> bool {
        enum Took {
            Opened(u64),
            Closed(u64),
            Attachment(Conn, ictus_shm::Held),
            Record(Conn, u32),
        }
        for _ in 0..BATCH {
            let mut b = std::mem::take(&mut self.scratch);
            let took = match self.shm.try_next() {
                None => {
                    self.scratch = b;
                    return false;
                }
                Some(Next::Event(Event::Opened { client, .. })) => Took::Opened(client.0),
                Some(Next::Event(Event::Closed { client, .. })) => Took::Closed(client.0),
                Some(Next::Record(inc)) => {
                    let conn = Conn::Shm(inc.client().0);
                    let tag = inc.tag();
                    if tag == proto::TAG_POOL_ITEM && inc.is_pool() {
                        match inc.hold() {
                            Some(held) => Took::Attachment(conn, held),
                            None => Took::Record(conn, u32::MAX),
                        }
                    } else {
                        // Copy the record out of shared memory before parsing it: the
                        // client could change it under us.
                        b.resize(inc.payload().len(), 0);
                        inc.payload().copy_to(&mut b);
                        Took::Record(conn, tag)
                    }
                }
            };
            match took {
                Took::Opened(id) => self.shared.core.lock().connected(Conn::Shm(id)),
                Took::Closed(id) => self.gone(Conn::Shm(id)),
                Took::Attachment(conn, held) => {
                    let back = self.shared.core.lock().attachment(conn, held);
                    if let Some(h) = back {
                        let _ = self.shm.release(h);
                    }
                }
                Took::Record(conn, tag) => self.record(conn, tag, &b),
            }
            self.scratch = b;
        }
        true
    }

    fn release_and_report(&mut self) {
        let (releases, outbox) = {
            let mut core = self.shared.core.lock();
            (std::mem::take(&mut core.releases), std::mem::take(&mut core.outbox))
        };
        for h in releases {
            let _ = self.shm.release(h);
        }
        let mut dropped = 0;
        let mut buf = Vec::new();
        for (conn, r) in outbox {
            buf.clear();
            r.encode(&mut buf);
            match conn {
                Conn::Shm(id) => {
                    if self.shm.send_to(ictus_shm::ClientId(id), r.tag(), &buf).is_err() {
                        dropped += 1;
                    }
                }
                Conn::Socket(id) => {
                    if let Some(c) = self.sockets.iter_mut().find(|c| c.id == id) {
                        proto::frame(r.tag(), &buf, &mut c.outbuf);
                    }
                }
            }
        }
        if dropped > 0 {
            self.shared.core.lock().counters.reports_dropped += dropped;
        }
        self.flush_sockets();
    }

    fn flush_sockets(&mut self) {
        let mut cut = Vec::new();
        for c in &mut self.sockets {
            while !c.outbuf.is_empty() {
                match c.stream.write(&c.outbuf) {
                    Ok(0) => break,
                    Ok(n) => {
                        c.outbuf.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        cut.push(c.id);
                        break;
                    }
                }
            }
            if c.outbuf.len() > MAX_SOCKET_BACKLOG {
                cut.push(c.id);
            }
        }
        for id in cut {
            self.sockets.retain(|c| c.id != id);
            self.gone(Conn::Socket(id));
        }
    }

    fn periodic_status(&mut self) {
        if Instant::now() < self.next_status {
            return;
        }
        self.next_status = Instant::now() + self.status_period;
        let t = now();
        let mut core = self.shared.core.lock();
        for conn in core.clients_with_presentations() {
            let st = core.status(conn, t);
            core.outbox.push_back((conn, Report::Status(st)));
        }
    }

    fn accept(&mut self) {
        let Some(l) = &self.listener else { return };
        while let Ok((stream, _)) = l.accept() {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let id = self.next_socket;
            self.next_socket += 1;
            self.sockets.push(SocketClient { id, stream, inbuf: Vec::new(), outbuf: Vec::new() });
            self.shared.core.lock().connected(Conn::Socket(id));
        }
    }

    fn read_socket(&mut self, i: usize) {
        let mut closed = false;
        let mut records = Vec::new();
        {
            let c = &mut self.sockets[i];
            let mut chunk = vec![0u8; 256 << 10];
            loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => c.inbuf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
                if c.inbuf.len() > proto::MAX_FRAMED * 2 {
                    break;
                }
            }
            let mut used = 0;
            loop {
                match proto::unframe(&c.inbuf[used..]) {
                    Ok(Some((tag, payload, n))) => {
                        records.push((tag, payload.to_vec()));
                        used += n;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            }
            c.inbuf.drain(..used);
        }
        let conn = Conn::Socket(self.sockets[i].id);
        for (tag, b) in records {
            if tag == proto::TAG_POOL_ITEM {
                closed = true;
                break;
            }
            self.record(conn, tag, &b);
        }
        if closed {
            let id = self.sockets[i].id;
            self.sockets.retain(|c| c.id != id);
            self.gone(conn);
        }
    }
}

impl Serve for Tactus {
    const NAME: &'static str = "tactus";

    fn request(&mut self, msg: &mut Received) -> Dispatched {
        self.requests.handle(msg)
    }

    fn prepare(&mut self) -> Result<Wait, ServeError> {
        let more = self.drain_shm();
        self.periodic_status();
        self.release_and_report();
        if more {
            return Ok(Wait::Again);
        }
        let wait = Wait::Until(Some(self.next_status));
        Ok(if self.shm.arm() { wait } else { Wait::Again })
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut v = vec![self.shm.as_fd(), self.wake.as_fd()];
        if let Some(l) = &self.listener {
            v.push(l.as_fd());
            v.extend(self.sockets.iter().map(|c| c.stream.as_fd()));
        }
        v
    }

    fn ready(&mut self, index: usize) -> Result<(), ServeError> {
        match index {
            0 => {}
            1 => {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&self.wake, &mut b);
            }
            2 => self.accept(),
            i => {
                if i - 3 < self.sockets.len() {
                    self.read_socket(i - 3);
                }
            }
        }
        Ok(())
    }
}

impl Drop for Tactus {
    fn drop(&mut self) {
        let mut core = self.shared.core.lock();
        core.stop = true;
        drop(core);
        self.shared.ring();
    }
}
