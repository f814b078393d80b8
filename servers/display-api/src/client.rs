//! The client library: buffered requests, three transports, frames, events.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ictus_ipc::{
    Disposition, Message as PortMessage, Name, OolBuffer, PortArg, ReceiveOptions, Received, RightKind, SendOptions,
    Space,
};
use ictus_shm::{ClientOptions, Geometry, WaitConfig};

use crate::proto::{self, items, Message, RasterOp, Rect, Request, Segment, Source};
use crate::service;
use crate::spin::SpinPolicy;

/// How requests travel to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// A stream socket (`AF_UNIX SOCK_STREAM`), like X11's.
    Socket,
    /// ictus port messages.
    Port,
    /// A shared-memory ring with pool buffers for frames.
    Shm,
}

impl Transport {
    /// All three, in the order the experiments print them.
    pub const ALL: [Transport; 3] = [Transport::Socket, Transport::Port, Transport::Shm];

    /// The wire code.
    pub fn code(self) -> u8 {
        match self {
            Transport::Socket => 0,
            Transport::Port => 1,
            Transport::Shm => 2,
        }
    }

    /// From a wire code.
    pub fn from_code(c: u8) -> Option<Transport> {
        Transport::ALL.into_iter().find(|t| t.code() == c)
    }

    /// A short name: `socket`, `port`, `shm`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Socket => "socket",
            Transport::Port => "port",
            Transport::Shm => "shm",
        }
    }
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Transport, String> {
        Transport::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| format!("{s:?}: expected socket, port or shm"))
    }
}

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// The transport.
    pub transport: Transport,
    /// The name server's socket (default: its default path, or the bootstrap right).
    pub name_server: Option<PathBuf>,
    /// The name the display server is registered under.
    pub service: String,
    /// For [`Transport::Shm`]: the channel's rings and frame buffers.
    pub geometry: Geometry,
    /// For [`Transport::Shm`]: how this end waits.
    pub wait: WaitConfig,
    /// How long connecting, and each wait for the server, may take.
    pub timeout: Duration,
}

impl ConnectOptions {
    /// Defaults for a transport: a 256 KiB request ring, a 64 KiB reply ring and four
    /// 8 MiB frame buffers (a 1920×1080 frame each).
    pub fn new(transport: Transport) -> ConnectOptions {
        ConnectOptions {
            transport,
            name_server: None,
            service: crate::SERVICE_NAME.to_owned(),
            geometry: Geometry::new(256 << 10, 64 << 10, 4, 8 << 20).expect("a valid geometry"),
            wait: WaitConfig::default(),
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The name server could not be reached.
    #[error("reaching the name server: {0} (is `ictus name-server` running?)")]
    NameServer(#[from] ictus_name_api::ConnectError),
    /// The display server is not registered, or the lookup failed.
    #[error("looking up the display server: {0} (is `ictus display serve` running?)")]
    Lookup(#[from] ictus_name_api::ClientError),
    /// The call to the display server's port failed.
    #[error("asking the display server: {0}")]
    Call(#[from] ictus_ipc::CallError),
    /// The server refused.
    #[error("the display server refused: {0}")]
    Refused(String),
    /// The server's answer made no sense.
    #[error("the display server answered nonsense: {0}")]
    Invalid(String),
    /// The socket could not be opened.
    #[error("the display socket: {0}")]
    Socket(#[from] std::io::Error),
    /// The shared-memory channel could not be opened.
    #[error("the shared-memory channel: {0}")]
    Shm(#[from] ictus_shm::ConnectError),
    /// A port operation failed.
    #[error("ports: {0}")]
    Rights(#[from] ictus_ipc::RightsError),
}

/// Why a display operation failed. The connection is unusable after any of these but
/// [`DisplayError::TimedOut`].
#[derive(Debug, thiserror::Error)]
pub enum DisplayError {
    /// The server did not answer in time.
    #[error("the display server did not answer in time")]
    TimedOut,
    /// The server closed the connection or died, or cut this client off.
    #[error("the display server closed the connection: {0}")]
    Closed(String),
    /// The server sent something that does not decode.
    #[error("the display server sent a malformed message: {0}")]
    Malformed(#[from] proto::DecodeError),
    /// A request this library cannot send (too large for the transport).
    #[error("{0}")]
    Unsendable(String),
}

impl DisplayError {
    /// A port transport's call or send that failed, classified as every client's are
    /// ([`ictus_idl::CallFailure`]): no answer or no room in time leaves the connection
    /// usable ([`DisplayError::TimedOut`]); a server gone, or anything else, closes it.
    fn call(e: ictus_ipc::CallError) -> DisplayError {
        let why = e.to_string();
        match ictus_idl::CallFailure::from(e) {
            ictus_idl::CallFailure::TimedOut => DisplayError::TimedOut,
            ictus_idl::CallFailure::ServerDied | ictus_idl::CallFailure::Other(_) => DisplayError::Closed(why),
        }
    }
}

/// A window, as this client names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window(pub u32);

/// What the server said at connect time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// Screen width.
    pub width: u16,
    /// Screen height.
    pub height: u16,
}

/// What a sync reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncInfo {
    /// Nanoseconds the server spent executing this client's requests since the last sync.
    pub server_ns: u64,
    /// Requests it executed since the last sync.
    pub requests: u64,
    /// When the server began executing them (`CLOCK_MONOTONIC` ns, as [`monotonic_ns`]).
    pub begun_ns: u64,
    /// For [`Display::sync_shown`]: when the server sent its present to the X server
    /// (0 for a plain sync; headless, the same as `acked_ns`).
    pub sent_ns: u64,
    /// For [`Display::sync_shown`]: when the X server acknowledged that present.
    pub acked_ns: u64,
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of frame times.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

enum Conn {
    /// `read_timeout`: the socket's receive timeout now (set only when it changes).
    Socket {
        stream: UnixStream,
        inbuf: Vec<u8>,
        read_timeout: Option<Duration>,
    },
    Port {
        space: Space,
        requests: Name,
        events: Name,
        received: Received,
    },
    /// `spin`: how long waits spin, sized to the machine; `liveness` of the waits.
    Shm {
        client: Box<ictus_shm::Client>,
        spin: SpinPolicy,
        liveness: Duration,
    },
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Socket { .. } => "Conn::Socket",
            Conn::Port { .. } => "Conn::Port",
            Conn::Shm { .. } => "Conn::Shm",
        })
    }
}

/// Everything but the connection: what frames borrow beside a pool loan.
#[derive(Debug)]
struct State {
    out: Vec<u8>,
    scratch: Vec<u8>,
    serial: u32,
    attach: u32,
    ool: Vec<OolBuffer>,
    events: VecDeque<Message>,
    next_window: u32,
    batch_max: usize,
    timeout: Duration,
    transport: Transport,
}

/// A connection to the display server.
#[derive(Debug)]
pub struct Display {
    conn: Conn,
    st: State,
    info: ServerInfo,
}

fn invalid(s: impl Into<String>) -> ConnectError {
    ConnectError::Invalid(s.into())
}

impl Display {
    /// Find the display server through the name server and connect.
    pub fn connect(opts: &ConnectOptions) -> Result<Display, ConnectError> {
        let space = Space::new();
        let ns = match &opts.name_server {
            Some(p) => ictus_name_api::Client::connect_socket(&space, p)?,
            None => ictus_name_api::Client::connect(&space)?,
        };
        let service = ns.lookup(&opts.service)?;
        Display::connect_to(&space, service, opts)
    }

    /// Connect through `service`, a send right in `space` to the display server's
    /// service port.
    pub fn connect_to(space: &Space, service: Name, opts: &ConnectOptions) -> Result<Display, ConnectError> {
        let mut data = proto::VERSION.to_le_bytes().to_vec();
        data.extend_from_slice(&[opts.transport.code(), 0, 0, 0]);
        let mut msg = PortMessage::new(service::OPEN, data);
        let events = if opts.transport == Transport::Port {
            let p = space.allocate_port()?;
            msg.ports.push(PortArg::new(p, Disposition::MakeSend));
            Some(p)
        } else {
            None
        };
        let mut got = Received::new();
        let ropts = ReceiveOptions { timeout: Some(opts.timeout), populate_ool: false };
        space.call(service, &mut msg, &mut got, SendOptions { timeout: Some(opts.timeout) }, ropts)?;
        let rights: Vec<Name> = got.ports.iter().map(|r| r.name).collect();
        let cleanup = |space: &Space| {
            for r in &rights {
                let _ = space.deallocate(*r);
            }
        };
        if got.id == service::OPEN_REFUSED {
            cleanup(space);
            return Err(ConnectError::Refused(String::from_utf8_lossy(got.data()).into_owned()));
        }
        let d = got.data();
        if got.id != service::OPEN_OK || d.len() < 8 {
            cleanup(space);
            return Err(invalid(format!("answer {} of {} bytes", got.id, d.len())));
        }
        let version = u32::from_le_bytes(d[..4].try_into().expect("4 bytes"));
        if version != proto::VERSION {
            cleanup(space);
            return Err(invalid(format!("protocol version {version}")));
        }
        let info = ServerInfo { width: u16::from_le_bytes([d[4], d[5]]), height: u16::from_le_bytes([d[6], d[7]]) };
        let one_send_right = |space: &Space| -> Result<Name, ConnectError> {
            match got.ports.as_slice() {
                [r] if r.kind == RightKind::Send => Ok(r.name),
                _ => {
                    cleanup(space);
                    Err(invalid(format!("{} rights where one send right was due", got.ports.len())))
                }
            }
        };
        let (conn, batch_max) = match opts.transport {
            Transport::Socket => {
                let path = std::str::from_utf8(&d[8..]).map_err(|_| invalid("socket path not UTF-8"))?;
                cleanup(space);
                let stream = UnixStream::connect(path)?;
                (Conn::Socket { stream, inbuf: Vec::with_capacity(64 << 10), read_timeout: None }, 64 << 10)
            }
            Transport::Port => {
                let requests = one_send_right(space)?;
                let events = events.expect("made above");
                (Conn::Port { space: space.clone(), requests, events, received: Received::new() }, 60 << 10)
            }
            Transport::Shm => {
                let svc = one_send_right(space)?;
                // The spin is judged before each wait (see `SpinPolicy`); block until then.
                let wait = WaitConfig { spin: Duration::ZERO, liveness: opts.wait.liveness };
                let copts = ClientOptions { geometry: opts.geometry, wait, timeout: opts.timeout };
                let client = ictus_shm::Client::connect(space, svc, copts);
                let _ = space.deallocate(svc);
                let client = client?;
                let max = (client.geometry().request.max_payload() as usize).min(64 << 10);
                let spin = SpinPolicy::new(opts.wait.spin);
                (Conn::Shm { client: Box::new(client), spin, liveness: opts.wait.liveness }, max)
            }
        };
        Ok(Display {
            conn,
            info,
            st: State {
                out: Vec::with_capacity(batch_max),
                scratch: Vec::new(),
                serial: 0,
                attach: 0,
                ool: Vec::new(),
                events: VecDeque::new(),
                next_window: 1,
                batch_max,
                timeout: opts.timeout,
                transport: opts.transport,
            },
        })
    }

    /// The transport in use.
    pub fn transport(&self) -> Transport {
        self.st.transport
    }

    /// The screen's size.
    pub fn info(&self) -> ServerInfo {
        self.info
    }

    /// Wait at most this long for the server in [`Display::sync`] and when the
    /// transport is full.
    pub fn set_timeout(&mut self, t: Duration) {
        self.st.timeout = t;
    }

    fn push(&mut self, r: Request<'_>) -> Result<(), DisplayError> {
        let before = self.st.out.len();
        r.encode(&mut self.st.out);
        if self.st.out.len() - before > self.st.batch_max && self.st.transport != Transport::Socket {
            self.st.out.truncate(before);
            return Err(DisplayError::Unsendable(format!(
                "a request of {} bytes exceeds this transport's batch of {} bytes",
                self.st.out.len() - before,
                self.st.batch_max
            )));
        }
        if self.st.out.len() >= self.st.batch_max {
            self.flush()?;
        }
        Ok(())
    }

    /// Create a window (inside `parent`, or top-level), filled with `background`.
    pub fn create_window(
        &mut self,
        parent: Option<Window>,
        rect: Rect,
        background: u32,
    ) -> Result<Window, DisplayError> {
        let id = self.st.next_window;
        self.st.next_window += 1;
        self.push(Request::CreateWindow { id, parent: parent.map_or(0, |w| w.0), rect, background })?;
        Ok(Window(id))
    }

    /// Destroy a window and its sub-windows.
    pub fn destroy_window(&mut self, w: Window) -> Result<(), DisplayError> {
        self.push(Request::DestroyWindow { id: w.0 })
    }

    /// Move and resize a window.
    pub fn configure_window(&mut self, w: Window, rect: Rect) -> Result<(), DisplayError> {
        self.push(Request::ConfigureWindow { id: w.0, rect })
    }

    /// Set a window's title.
    pub fn set_title(&mut self, w: Window, title: &str) -> Result<(), DisplayError> {
        self.push(Request::SetTitle { id: w.0, title: title.as_bytes() })
    }

    /// Fill rectangles.
    pub fn fill_rects(&mut self, w: Window, op: RasterOp, color: u32, rects: &[Rect]) -> Result<(), DisplayError> {
        let mut scratch = std::mem::take(&mut self.st.scratch);
        let r = self.push(Request::FillRects { window: w.0, op, color, rects: items(rects, &mut scratch) });
        self.st.scratch = scratch;
        r
    }

    /// Fill one rectangle.
    pub fn fill_rect(&mut self, w: Window, rect: Rect, color: u32) -> Result<(), DisplayError> {
        self.fill_rects(w, RasterOp::Copy, color, &[rect])
    }

    /// Exclusive-or one rectangle with `color`.
    pub fn xor_rect(&mut self, w: Window, rect: Rect, color: u32) -> Result<(), DisplayError> {
        self.fill_rects(w, RasterOp::Xor, color, &[rect])
    }

    /// Draw line segments.
    pub fn segments(&mut self, w: Window, op: RasterOp, color: u32, segs: &[Segment]) -> Result<(), DisplayError> {
        let mut scratch = std::mem::take(&mut self.st.scratch);
        let r = self.push(Request::Segments { window: w.0, op, color, segments: items(segs, &mut scratch) });
        self.st.scratch = scratch;
        r
    }

    /// Draw one line.
    pub fn line(&mut self, w: Window, x1: i16, y1: i16, x2: i16, y2: i16, color: u32) -> Result<(), DisplayError> {
        self.segments(w, RasterOp::Copy, color, &[Segment { x1, y1, x2, y2 }])
    }

    /// Draw text in 8×8 cells from `(x, y)` (top-left), on `bg` if given.
    pub fn text(
        &mut self,
        w: Window,
        x: i16,
        y: i16,
        fg: u32,
        bg: Option<u32>,
        text: &[u8],
    ) -> Result<(), DisplayError> {
        self.push(Request::Text { window: w.0, x, y, fg, bg, text })
    }

    /// Copy `src` to `(dx, dy)` within the window (scrolling).
    pub fn copy_area(&mut self, w: Window, src: Rect, dx: i16, dy: i16) -> Result<(), DisplayError> {
        self.push(Request::CopyArea { window: w.0, src, dx, dy })
    }

    /// Draw an image (`rect.w × rect.h` pixels, rows back to back) into the window.
    pub fn put_image(&mut self, w: Window, rect: Rect, pixels: &[u32]) -> Result<(), DisplayError> {
        let n = rect.w as usize * rect.h as usize;
        if pixels.len() < n {
            return Err(DisplayError::Unsendable(format!("{} pixels for a {}x{} image", pixels.len(), rect.w, rect.h)));
        }
        let bytes: Vec<u8> = pixels[..n].iter().flat_map(|p| p.to_le_bytes()).collect();
        let stride = u32::from(rect.w) * 4;
        if bytes.len() + 64 <= self.st.batch_max || self.st.transport == Transport::Socket {
            return self.push(Request::PutImage { window: w.0, rect, stride, source: Source::Inline(&bytes) });
        }
        let seq = {
            let mut f = self.frame(rect.w, rect.h)?;
            f.pixels().copy_from_slice(&bytes);
            f.attach()?
        };
        self.push(Request::PutImage { window: w.0, rect, stride, source: Source::Attachment(seq) })
    }

    /// Borrow a frame buffer of `width × height` pixels to draw into, then
    /// [`Frame::present`] it: in the channel's pool (shm), an out-of-line buffer (port)
    /// or the request itself (socket), so that it is written once and not copied again
    /// on its way to the server.
    pub fn frame(&mut self, width: u16, height: u16) -> Result<Frame<'_>, DisplayError> {
        let rect = Rect::new(0, 0, width, height);
        let len = Request::image_len(rect, u32::from(width) * 4);
        let deadline = Instant::now() + self.st.timeout;
        let buf = match &mut self.conn {
            Conn::Shm { client, .. } => {
                let client: &mut ictus_shm::Client = client;
                // Wait for a buffer the server has given back: a sleep that asks for
                // the server's wake-up for room, which its giving a buffer back sends.
                if client.pool_free() == 0 {
                    match client.wait_pool(Some(deadline.saturating_duration_since(Instant::now()))) {
                        Ok(()) | Err(ictus_shm::SendError::TimedOut) => {}
                        Err(ictus_shm::SendError::Closed(r)) => return Err(DisplayError::Closed(r.to_string())),
                        Err(e) => return Err(DisplayError::Unsendable(e.to_string())),
                    }
                }
                match client.loan_pool(len) {
                    Ok(l) => FrameBuf::Pool(l),
                    Err(ictus_shm::SendError::Full) => return Err(DisplayError::TimedOut),
                    Err(e) => return Err(DisplayError::Unsendable(e.to_string())),
                }
            }
            Conn::Port { .. } => {
                FrameBuf::Ool(OolBuffer::new(len).map_err(|e| DisplayError::Unsendable(e.to_string()))?)
            }
            Conn::Socket { .. } => {
                // The request's header first, the pixels behind it: written in place.
                let at = self.st.out.len();
                self.st.out.resize(at + PRESENT_HEADER + len, 0);
                FrameBuf::Inline(at)
            }
        };
        Ok(Frame { st: &mut self.st, buf: Some(buf), width, height, len })
    }

    fn send_batch(&mut self, sync: bool) -> Result<Option<Vec<u8>>, DisplayError> {
        let st = &mut self.st;
        match &mut self.conn {
            Conn::Socket { stream, .. } => {
                stream.write_all(&st.out).map_err(|e| DisplayError::Closed(e.to_string()))?;
                st.out.clear();
                Ok(None)
            }
            Conn::Port { space, requests, .. } => {
                // Split at request boundaries into messages of at most a batch each; the
                // attachments travel with the first.
                let mut start = 0;
                let total = st.out.len();
                let mut reply = None;
                while start < total || (start == 0 && !st.ool.is_empty()) {
                    let mut end = start;
                    while end < total {
                        let n = proto::peek_len(&st.out[end..]).ok().flatten().unwrap_or(total - end);
                        if end > start && end + n - start > st.batch_max {
                            break;
                        }
                        end += n;
                    }
                    let last = end >= total;
                    let id = if sync && last { service::BATCH_SYNC } else { service::BATCH };
                    let mut msg = PortMessage::new(id, st.out[start..end].to_vec());
                    msg.ool = std::mem::take(&mut st.ool);
                    let sopts = SendOptions { timeout: Some(st.timeout) };
                    if id == service::BATCH_SYNC {
                        let mut got = Received::new();
                        let ropts = ReceiveOptions { timeout: Some(st.timeout), populate_ool: false };
                        space.call(*requests, &mut msg, &mut got, sopts, ropts).map_err(DisplayError::call)?;
                        for r in &got.ports {
                            let _ = space.deallocate(r.name);
                        }
                        if got.id != service::SYNCED {
                            return Err(DisplayError::Closed(format!("answer {} to a sync", got.id)));
                        }
                        reply = Some(got.data().to_vec());
                    } else {
                        space.send(*requests, &mut msg, sopts).map_err(|e| DisplayError::call(e.into()))?;
                    }
                    start = end;
                    if last {
                        break;
                    }
                }
                st.out.clear();
                Ok(reply)
            }
            Conn::Shm { client, spin, liveness } => {
                if sync {
                    // The answer is waited for right after: spin as the machine allows.
                    let s = spin.spin(Instant::now());
                    client.set_wait(WaitConfig { spin: s, liveness: *liveness });
                }
                let mut start = 0;
                let total = st.out.len();
                while start < total {
                    let mut end = start;
                    while end < total {
                        let n = proto::peek_len(&st.out[end..]).ok().flatten().unwrap_or(total - end);
                        if end > start && end + n - start > st.batch_max {
                            break;
                        }
                        end += n;
                    }
                    client.send_wait(service::TAG_BATCH, &st.out[start..end], Some(st.timeout)).map_err(
                        |e| match e {
                            ictus_shm::SendError::TimedOut => DisplayError::TimedOut,
                            e => DisplayError::Closed(e.to_string()),
                        },
                    )?;
                    start = end;
                }
                st.out.clear();
                Ok(None)
            }
        }
    }

    /// Send what is buffered (`XFlush`): it returns once the requests are on their
    /// way, not when they are done.
    pub fn flush(&mut self) -> Result<(), DisplayError> {
        if self.st.out.is_empty() && self.st.ool.is_empty() {
            return Ok(());
        }
        self.send_batch(false).map(|_| ())
    }

    /// Flush, then wait until the server has done every request (`XSync`): drawn into
    /// the windows' contents, which reach the screen shortly after (see
    /// [`Display::sync_shown`]).
    pub fn sync(&mut self) -> Result<SyncInfo, DisplayError> {
        self.sync_inner(false)
    }

    /// As [`Display::sync`], and wait until what was drawn has reached the screen too
    /// (the X server has it, or the headless framebuffer).
    pub fn sync_shown(&mut self) -> Result<SyncInfo, DisplayError> {
        self.sync_inner(true)
    }

    fn sync_inner(&mut self, shown: bool) -> Result<SyncInfo, DisplayError> {
        self.st.serial = self.st.serial.wrapping_add(1);
        let serial = self.st.serial;
        Request::Sync { serial, shown }.encode(&mut self.st.out);
        let reply = self.send_batch(true)?;
        if let Some(bytes) = reply {
            // Messages the server sent before its answer are already on the event port.
            self.drain_events()?;
            self.take_messages(&bytes)?;
        }
        let deadline = Instant::now() + self.st.timeout;
        loop {
            if let Some(i) =
                self.st.events.iter().position(|m| matches!(m, Message::Synced { serial: s, .. } if *s == serial))
            {
                let Some(Message::Synced { exec_ns, requests, begun_ns, sent_ns, acked_ns, .. }) =
                    self.st.events.remove(i)
                else {
                    unreachable!()
                };
                return Ok(SyncInfo { server_ns: exec_ns, requests, begun_ns, sent_ns, acked_ns });
            }
            if Instant::now() >= deadline {
                return Err(DisplayError::TimedOut);
            }
            // Each read waits at most the connection's timeout (the same every time, so
            // a socket's receive timeout is set once, not per read); the deadline above
            // ends the sync.
            self.read_messages(Some(self.st.timeout))?;
        }
    }

    fn take_messages(&mut self, mut bytes: &[u8]) -> Result<(), DisplayError> {
        while !bytes.is_empty() {
            let (m, n) = Message::decode(bytes)?;
            self.st.events.push_back(m);
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// Take every message already waiting on a port client's event port.
    fn drain_events(&mut self) -> Result<(), DisplayError> {
        loop {
            let Conn::Port { space, events, received, .. } = &mut self.conn else { return Ok(()) };
            let opts = ReceiveOptions { timeout: Some(Duration::ZERO), populate_ool: false };
            match space.receive(*events, received, opts) {
                Ok(()) => {}
                Err(ictus_ipc::ReceiveError::TimedOut) => return Ok(()),
                Err(e) => return Err(DisplayError::Closed(e.to_string())),
            }
            if received.id != service::EVENTS || !received.ports.is_empty() || received.reply.is_some() {
                return Err(DisplayError::Closed(format!("message {} on the event port", received.id)));
            }
            let bytes = received.data().to_vec();
            self.take_messages(&bytes)?;
        }
    }

    /// Read what the server sent, waiting at most `timeout` for something; whether
    /// anything was read.
    fn read_messages(&mut self, timeout: Option<Duration>) -> Result<bool, DisplayError> {
        match &mut self.conn {
            Conn::Socket { stream, inbuf, read_timeout } => {
                let at = inbuf.len();
                inbuf.resize(at + (16 << 10), 0);
                let got = if timeout == Some(Duration::ZERO) {
                    // A look, not a wait: one non-blocking receive.
                    rustix::net::recv(&*stream, &mut inbuf[at..], rustix::net::RecvFlags::DONTWAIT)
                        .map(|(n, _)| n)
                        .map_err(std::io::Error::from)
                } else {
                    // The socket blocks; its timeout changes (a system call) only when
                    // the caller's does, not on every read.
                    if *read_timeout != timeout {
                        stream.set_read_timeout(timeout).map_err(|e| DisplayError::Closed(e.to_string()))?;
                        *read_timeout = timeout;
                    }
                    stream.read(&mut inbuf[at..])
                };
                match got {
                    Ok(0) => {
                        inbuf.truncate(at);
                        return Err(DisplayError::Closed("end of file".into()));
                    }
                    Ok(n) => inbuf.truncate(at + n),
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        inbuf.truncate(at);
                        return Ok(false);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                        inbuf.truncate(at);
                        return Ok(false);
                    }
                    Err(e) => {
                        inbuf.truncate(at);
                        return Err(DisplayError::Closed(e.to_string()));
                    }
                }
                let mut used = 0;
                while let Some(n) = proto::peek_len(&inbuf[used..])? {
                    if inbuf.len() - used < n {
                        break;
                    }
                    let (m, _) = Message::decode(&inbuf[used..used + n])?;
                    self.st.events.push_back(m);
                    used += n;
                }
                inbuf.drain(..used);
                Ok(true)
            }
            Conn::Port { space, events, received, .. } => {
                let opts =
                    ReceiveOptions { timeout: Some(timeout.unwrap_or(Duration::from_secs(3600))), populate_ool: false };
                match space.receive(*events, received, opts) {
                    Ok(()) => {}
                    Err(ictus_ipc::ReceiveError::TimedOut) => return Ok(false),
                    Err(e) => return Err(DisplayError::Closed(e.to_string())),
                }
                for r in &received.ports {
                    let _ = space.deallocate(r.name);
                }
                if let Some(r) = received.reply {
                    let _ = space.deallocate(r.name);
                }
                if received.id != service::EVENTS {
                    return Err(DisplayError::Closed(format!("message {} on the event port", received.id)));
                }
                let bytes = received.data().to_vec();
                self.take_messages(&bytes).map(|()| true)
            }
            Conn::Shm { client, .. } => {
                let bytes = match client.recv(timeout) {
                    Ok(r) => r.to_vec(),
                    Err(ictus_shm::RecvError::TimedOut) => return Ok(false),
                    Err(ictus_shm::RecvError::Closed(r)) => return Err(DisplayError::Closed(r.to_string())),
                };
                self.take_messages(&bytes).map(|()| true)
            }
        }
    }

    /// The next message from the server (an event, an error, a frame report), waiting
    /// at most `timeout`; `None` if none came.
    ///
    /// The transport is always looked at, even with a zero timeout: a message that
    /// has arrived is returned, whatever the timeout.
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<Message>, DisplayError> {
        let deadline = Instant::now() + timeout;
        let mut looked = false;
        loop {
            if let Some(m) = self.st.events.pop_front() {
                return Ok(Some(m));
            }
            let now = Instant::now();
            if now >= deadline && looked {
                return Ok(None);
            }
            self.read_messages(Some(deadline.saturating_duration_since(now)))?;
            looked = true;
        }
    }

    /// Every message that has arrived, without waiting: those earlier calls read, then
    /// whatever the transport holds now.
    pub fn pending_events(&mut self) -> Result<impl Iterator<Item = Message> + '_, DisplayError> {
        while self.read_messages(Some(Duration::ZERO))? {}
        Ok(self.st.events.drain(..))
    }

    /// Send `bytes` as a batch, unchecked, as a client that ignores the protocol would
    /// (for tests that play a hostile client).
    #[doc(hidden)]
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), DisplayError> {
        self.st.out.extend_from_slice(bytes);
        self.send_batch(false).map(|_| ())
    }

    /// The shared-memory channel itself (for tests that scribble on it).
    #[doc(hidden)]
    pub fn shm_channel(&mut self) -> Option<&mut ictus_shm::Client> {
        match &mut self.conn {
            Conn::Shm { client, .. } => Some(client),
            _ => None,
        }
    }

    /// For a shared-memory connection: how many times it looked at the machine's load
    /// before a wait, and how many of those found room to spin
    /// ([`SpinPolicy`](crate::spin::SpinPolicy)).
    pub fn spin_looks(&self) -> Option<(u64, u64)> {
        match &self.conn {
            Conn::Shm { spin, .. } => Some(spin.looks()),
            _ => None,
        }
    }

    /// Counters of the shared-memory channel, for the experiments (wake-ups per record).
    pub fn shm_stats(&self) -> Option<ictus_shm::ClientStats> {
        match &self.conn {
            Conn::Shm { client, .. } => Some(client.stats()),
            _ => None,
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Conn::Port { space, requests, events, .. } = self {
            // The server watches the event port: destroying it tells the server at once
            // that this connection is over (its windows go), even if the space lives on.
            let _ = space.deallocate(*requests);
            let _ = space.destroy(*events);
        }
    }
}

/// A descriptor that is readable when the server may have sent something: the socket,
/// the event port's, or the channel's.
impl AsFd for Display {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.conn {
            Conn::Socket { stream, .. } => stream.as_fd(),
            Conn::Shm { client, .. } => client.as_fd(),
            Conn::Port { .. } => panic!("a port connection has no single descriptor; use next_event"),
        }
    }
}

/// Length of a present-frame request before its in-line pixels.
const PRESENT_HEADER: usize = 40;

enum FrameBuf<'a> {
    Pool(ictus_shm::PoolLoan<'a>),
    Ool(OolBuffer),
    Inline(usize),
}

/// A frame buffer lent by [`Display::frame`]: draw into [`Frame::pixels`], then
/// [`Frame::present`]. Dropped unpresented, it sends nothing.
pub struct Frame<'a> {
    st: &'a mut State,
    buf: Option<FrameBuf<'a>>,
    width: u16,
    height: u16,
    len: usize,
}

impl std::fmt::Debug for Frame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Frame {}x{}", self.width, self.height)
    }
}

impl Frame<'_> {
    /// The pixels: `height` rows of `4 * width` bytes, `0x00RRGGBB` little-endian.
    pub fn pixels(&mut self) -> &mut [u8] {
        match self.buf.as_mut().expect("a live frame") {
            FrameBuf::Pool(l) => &mut l[..],
            FrameBuf::Ool(b) => &mut b[..],
            FrameBuf::Inline(at) => {
                let at = *at + PRESENT_HEADER;
                &mut self.st.out[at..at + self.len]
            }
        }
    }

    /// Fill the whole frame with one colour.
    pub fn fill(&mut self, color: u32) {
        let c = color.to_le_bytes();
        for px in self.pixels().chunks_exact_mut(4) {
            px.copy_from_slice(&c);
        }
    }

    /// Send the buffer as the client's next attachment; returns its sequence number.
    fn attach(&mut self) -> Result<u32, DisplayError> {
        match self.buf.take().expect("a live frame") {
            // Quietly: the batch naming it, sent next, wakes the server once for both.
            FrameBuf::Pool(l) => {
                l.commit_quietly(service::TAG_ATTACH).map_err(|e| DisplayError::Closed(e.to_string()))?
            }
            FrameBuf::Ool(b) => self.st.ool.push(b),
            FrameBuf::Inline(_) => unreachable!("in-line frames are not attachments"),
        }
        let seq = self.st.attach;
        self.st.attach = self.st.attach.wrapping_add(1);
        Ok(seq)
    }

    /// Show the frame in `window` at `(x, y)` at `due_ns` (`CLOCK_MONOTONIC`; 0 for as
    /// soon as possible). The server answers with [`Message::Frame`] carrying `tag`.
    /// Like any request it is sent on the next flush or sync.
    pub fn present(mut self, window: Window, x: i16, y: i16, due_ns: u64, tag: u32) -> Result<(), DisplayError> {
        let rect = Rect::new(x, y, self.width, self.height);
        let stride = u32::from(self.width) * 4;
        if let Some(FrameBuf::Inline(at)) = self.buf {
            // The pixels are in place behind room for the header: write the header of
            // an in-line frame there (an attachment's header with the in-line length
            // in the source field, the attachment flag cleared, the whole length).
            self.buf = None;
            let mut h = Vec::with_capacity(PRESENT_HEADER);
            let source = Source::Attachment(self.len as u32);
            Request::PresentFrame { window: window.0, rect, stride, source, tag, due_ns }.encode(&mut h);
            debug_assert_eq!(h.len(), PRESENT_HEADER);
            h[1] = 0;
            h[4..8].copy_from_slice(&((PRESENT_HEADER + self.len) as u32).to_le_bytes());
            self.st.out[at..at + PRESENT_HEADER].copy_from_slice(&h);
            return Ok(());
        }
        let seq = self.attach()?;
        Request::PresentFrame { window: window.0, rect, stride, source: Source::Attachment(seq), tag, due_ns }
            .encode(&mut self.st.out);
        Ok(())
    }
}

impl Drop for Frame<'_> {
    fn drop(&mut self) {
        if let Some(FrameBuf::Inline(at)) = self.buf.take() {
            self.st.out.truncate(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DisplayError;
    use ictus_ipc::{CallError, ReceiveError, SendError};

    /// The port transport's failures, as every client classifies them: time (of the
    /// send or of the answer) leaves the connection usable, the rest closes it.
    #[test]
    fn port_failures_are_classified_as_every_clients() {
        for e in [CallError::Send(SendError::TimedOut), CallError::Receive(ReceiveError::TimedOut)] {
            assert!(matches!(DisplayError::call(e), DisplayError::TimedOut));
        }
        for e in [CallError::ServerDied, CallError::Receive(ReceiveError::PortDied)] {
            let why = e.to_string();
            assert!(matches!(DisplayError::call(e), DisplayError::Closed(w) if w == why));
        }
    }
}
