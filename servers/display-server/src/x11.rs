//! The screen: an X server, reached with x11rb. Windows' contents live in memfds
//! attached to the X server with MIT-SHM (`ShmAttachFd`), so presenting is one
//! `ShmPutImage` and the X server's copy into its framebuffer; a client's frame
//! buffers are attached the same way (its channel's memfd), so a frame goes from the
//! client's buffer to the screen without a copy in between. Without MIT-SHM, plain
//! `PutImage` carries the pixels over the X connection.

use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use ictus_display::proto::Rect;
use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::shm::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{self, ConnectionExt as _, CreateWindowAux, EventMask, ImageFormat, WindowClass};
use x11rb::protocol::Event;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

use ictus_rt::sync::{PiMutex, PiMutexGuard};

use crate::raster::Area;
use crate::sys::Pixels;

/// Why the X server could not be used.
#[derive(Debug, thiserror::Error)]
pub enum XError {
    /// Connecting failed.
    #[error("connecting to the X server {display:?}: {source}")]
    Connect {
        /// `$DISPLAY` or the name given.
        display: String,
        /// Why.
        source: x11rb::errors::ConnectError,
    },
    /// The X server refused or the connection broke.
    #[error("X server: {0}")]
    Conn(#[from] x11rb::errors::ConnectionError),
    /// A request failed.
    #[error("X request: {0}")]
    Reply(#[from] x11rb::errors::ReplyError),
    /// An id could not be allocated.
    #[error("X id: {0}")]
    Id(#[from] x11rb::errors::ReplyOrIdError),
    /// The root window is not 24-bit TrueColor with 32 bits per pixel.
    #[error("the X screen is not 24-bit TrueColor at 32 bits per pixel ({0})")]
    Visual(String),
}

/// A window in the X server and the segment its contents are attached as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XWin {
    /// The X window.
    pub id: u32,
    /// Its contents' MIT-SHM segment (none without MIT-SHM).
    pub seg: Option<u32>,
}

/// The connections to the X server: one for requests and their replies (the
/// transports' threads and the presenter draw and wait for round trips on it), one
/// that only the presenter reads, for events. With one connection, the answer to a
/// transport's round trip also woke the presenter (the descriptor it polls turned
/// readable) and the two then contended for x11rb's reader lock; worse, an event read
/// by a thread waiting for its reply sat in x11rb's queue while the descriptor the
/// presenter sleeps on showed nothing, so the presenter learnt of it only at its next
/// timeout (an expose or a key up to 100 ms late: a lost wake-up).
///
/// Each connection is used by one thread at a time ([`Serial`]): see there why.
#[derive(Debug)]
pub struct XConn {
    conn: Serial,
    /// Selects the windows' events and receives them; read by the presenter (a
    /// transport thread only makes the round trip that orders a new window's event
    /// selection before its mapping, and wakes the presenter afterwards).
    events: Serial,
    root: u32,
    gc: u32,
    depth: u8,
    shm: bool,
    max_request: usize,
}

/// Something the X server reported, for the presenter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum XEvent {
    Expose { xid: u32, area: Area },
    Configure { xid: u32, rect: Rect },
    Key { xid: u32, press: bool, code: u8, state: u16, x: i16, y: i16 },
    Button { xid: u32, press: bool, button: u8, state: u16, x: i16, y: i16 },
    Motion { xid: u32, state: u16, x: i16, y: i16 },
}

impl XConn {
    /// Connect to `display` (or `$DISPLAY`); MIT-SHM is used when the server has
    /// version 1.2 or later (for `ShmAttachFd`) and `allow_shm` is set.
    pub fn connect(display: Option<&str>, allow_shm: bool) -> Result<XConn, XError> {
        let (conn, screen) = RustConnection::connect(display).map_err(|source| XError::Connect {
            display: display.map(str::to_owned).or_else(|| std::env::var("DISPLAY").ok()).unwrap_or_default(),
            source,
        })?;
        let s = &conn.setup().roots[screen];
        let root = s.root;
        let depth = s.root_depth;
        let bpp = conn.setup().pixmap_formats.iter().find(|f| f.depth == depth).map(|f| f.bits_per_pixel);
        if depth != 24 || bpp != Some(32) {
            return Err(XError::Visual(format!("depth {depth}, {bpp:?} bits per pixel")));
        }
        let shm = allow_shm
            && conn.extension_information(shm::X11_EXTENSION_NAME)?.is_some()
            && conn.shm_query_version()?.reply().is_ok_and(|v| (v.major_version, v.minor_version) >= (1, 2));
        let gc = conn.generate_id()?;
        conn.create_gc(gc, root, &xproto::CreateGCAux::new().graphics_exposures(0))?;
        conn.prefetch_maximum_request_bytes();
        let max_request = conn.maximum_request_bytes();
        conn.flush()?;
        let (events, _) = RustConnection::connect(display).map_err(|source| XError::Connect {
            display: display.map(str::to_owned).or_else(|| std::env::var("DISPLAY").ok()).unwrap_or_default(),
            source,
        })?;
        Ok(XConn { conn: Serial::new(conn), events: Serial::new(events), root, gc, depth, shm, max_request })
    }

    /// Whether MIT-SHM is in use.
    pub fn has_shm(&self) -> bool {
        self.shm
    }

    /// The screen's size.
    pub fn screen_size(&self) -> (u16, u16) {
        let s = &self.conn.unlocked().setup().roots[0];
        (s.width_in_pixels, s.height_in_pixels)
    }

    /// The events connection's descriptor, for the presenter's `poll`.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.events.unlocked().stream().as_fd()
    }

    /// The requests connection, for this thread alone until the guard is dropped
    /// (tests read windows back with it).
    pub fn connection(&self) -> impl Deref<Target = RustConnection> + '_ {
        self.conn.lock()
    }

    /// Attach a memfd read-only; returns the segment.
    pub(crate) fn attach(&self, fd: BorrowedFd<'_>) -> Result<u32, XError> {
        attach(&self.conn.lock(), fd)
    }

    pub(crate) fn create_window(&self, parent: Option<XWin>, rect: Rect, px: &Pixels) -> Result<XWin, XError> {
        let c = self.conn.lock();
        let id = c.generate_id()?;
        let mask = EventMask::EXPOSURE
            | EventMask::STRUCTURE_NOTIFY
            | EventMask::KEY_PRESS
            | EventMask::KEY_RELEASE
            | EventMask::BUTTON_PRESS
            | EventMask::BUTTON_RELEASE
            | EventMask::POINTER_MOTION;
        // No background: the X server leaves exposed areas alone and we paint them.
        let aux = CreateWindowAux::new().background_pixmap(x11rb::NONE);
        c.create_window(
            self.depth,
            id,
            parent.map_or(self.root, |p| p.id),
            rect.x,
            rect.y,
            rect.w,
            rect.h,
            0,
            WindowClass::INPUT_OUTPUT,
            x11rb::COPY_FROM_PARENT,
            &aux,
        )?;
        let seg = if self.shm { Some(attach(&c, px.fd())?) } else { None };
        // The X server orders requests within a connection, not across them: the
        // window exists before the events connection names it, and its events are
        // selected before it is mapped (so that its first expose is seen). One
        // connection's turn at a time, never both (no lock order to keep).
        c.get_input_focus()?.reply()?;
        drop(c);
        {
            let e = self.events.lock();
            let select = xproto::ChangeWindowAttributesAux::new().event_mask(mask);
            e.change_window_attributes(id, &select)?;
            e.get_input_focus()?.reply()?;
        }
        // Events that came meanwhile were read into the events connection's queue by
        // this thread: the caller wakes the presenter to take them.
        let c = self.conn.lock();
        c.map_window(id)?;
        c.flush()?;
        Ok(XWin { id, seg })
    }

    pub(crate) fn set_title(&self, w: XWin, title: &str) {
        let c = self.conn.lock();
        let _ = c.change_property8(
            xproto::PropMode::REPLACE,
            w.id,
            xproto::AtomEnum::WM_NAME,
            xproto::AtomEnum::STRING,
            title.as_bytes(),
        );
        let _ = c.flush();
    }

    pub(crate) fn configure(&self, w: XWin, rect: Rect) {
        let c = self.conn.lock();
        let aux = xproto::ConfigureWindowAux::new()
            .x(i32::from(rect.x))
            .y(i32::from(rect.y))
            .width(u32::from(rect.w))
            .height(u32::from(rect.h));
        let _ = c.configure_window(w.id, &aux);
        let _ = c.flush();
    }

    /// New contents for a window (after a resize): attach them, detach the old.
    pub(crate) fn replace_pixels(&self, w: &mut XWin, px: &Pixels) {
        let c = self.conn.lock();
        if let Some(old) = w.seg.take() {
            let _ = c.shm_detach(old);
        }
        if self.shm {
            w.seg = attach(&c, px.fd()).ok();
        }
        let _ = c.flush();
    }

    pub(crate) fn destroy_window(&self, w: XWin) {
        let c = self.conn.lock();
        let _ = c.destroy_window(w.id);
        if let Some(seg) = w.seg {
            // Requests run in order: a put already sent reads before the detach.
            let _ = c.shm_detach(seg);
        }
        let _ = c.flush();
    }

    /// Detach a segment (a departed client's channel).
    pub(crate) fn detach_later(&self, seg: u32) {
        let c = self.conn.lock();
        let _ = c.shm_detach(seg);
        let _ = c.flush();
    }

    /// Send `area` of a window's contents to the X server.
    pub(crate) fn put_area(&self, w: XWin, px: &Pixels, a: Area) -> Result<(), XError> {
        let c = self.conn.lock();
        if a.is_empty() {
            return Ok(());
        }
        match w.seg {
            Some(seg) => {
                c.shm_put_image(
                    w.id,
                    self.gc,
                    px.w as u16,
                    px.h as u16,
                    a.x0 as u16,
                    a.y0 as u16,
                    a.w() as u16,
                    a.h() as u16,
                    a.x0 as i16,
                    a.y0 as i16,
                    self.depth,
                    ImageFormat::Z_PIXMAP.into(),
                    false,
                    seg,
                    0,
                )?;
            }
            None => {
                let rows = ((self.max_request - 64) / (a.w() * 4)).max(1);
                let src = px.as_slice();
                let mut y = a.y0;
                let mut buf = Vec::new();
                while y < a.y1 {
                    let n = rows.min((a.y1 - y) as usize);
                    buf.clear();
                    for r in 0..n {
                        let row = (y as usize + r) * px.w;
                        for p in &src[row + a.x0 as usize..row + a.x1 as usize] {
                            buf.extend_from_slice(&p.to_le_bytes());
                        }
                    }
                    c.put_image(
                        ImageFormat::Z_PIXMAP,
                        w.id,
                        self.gc,
                        a.w() as u16,
                        n as u16,
                        a.x0 as i16,
                        y as i16,
                        0,
                        self.depth,
                        &buf,
                    )?;
                    y += n as i32;
                }
            }
        }
        Ok(())
    }

    /// Show a frame straight from an attached segment: `rect.w × rect.h` pixels at
    /// `offset`, rows `stride` bytes apart.
    pub(crate) fn put_segment(&self, w: XWin, seg: u32, offset: u64, stride: u32, rect: Rect) -> Result<(), XError> {
        let c = self.conn.lock();
        c.shm_put_image(
            w.id,
            self.gc,
            (stride / 4) as u16,
            rect.h,
            0,
            0,
            rect.w,
            rect.h,
            rect.x,
            rect.y,
            self.depth,
            ImageFormat::Z_PIXMAP.into(),
            false,
            seg,
            offset as u32,
        )?;
        Ok(())
    }

    /// Send what is buffered, then wait until the X server has done it (a round trip).
    pub(crate) fn ack(&self) -> Result<(), XError> {
        let c = self.conn.lock();
        c.get_input_focus()?.reply()?;
        Ok(())
    }

    /// Send what is buffered.
    pub(crate) fn flush(&self) -> Result<(), XError> {
        let c = self.conn.lock();
        c.flush()?;
        Ok(())
    }

    /// Events the X server sent, without waiting. Also drops what the requests
    /// connection queued (errors of requests whose answer nobody waits for: a window
    /// destroyed meanwhile), so that its queue does not grow.
    pub(crate) fn poll_events(&self, out: &mut Vec<XEvent>) -> Result<(), XError> {
        {
            let c = self.conn.lock();
            while c.poll_for_event()?.is_some() {}
        }
        let events = self.events.lock();
        while let Some(e) = events.poll_for_event()? {
            let ev = match e {
                Event::Expose(e) => XEvent::Expose {
                    xid: e.window,
                    area: Area::of(Rect::new(e.x as i16, e.y as i16, e.width, e.height)),
                },
                Event::ConfigureNotify(e) => {
                    XEvent::Configure { xid: e.window, rect: Rect::new(e.x, e.y, e.width.max(1), e.height.max(1)) }
                }
                Event::KeyPress(e) | Event::KeyRelease(e) => XEvent::Key {
                    xid: e.event,
                    press: e.response_type & 0x7f == xproto::KEY_PRESS_EVENT,
                    code: e.detail,
                    state: e.state.into(),
                    x: e.event_x,
                    y: e.event_y,
                },
                Event::ButtonPress(e) | Event::ButtonRelease(e) => XEvent::Button {
                    xid: e.event,
                    press: e.response_type & 0x7f == xproto::BUTTON_PRESS_EVENT,
                    button: e.detail,
                    state: e.state.into(),
                    x: e.event_x,
                    y: e.event_y,
                },
                Event::MotionNotify(e) => {
                    XEvent::Motion { xid: e.event, state: e.state.into(), x: e.event_x, y: e.event_y }
                }
                _ => continue,
            };
            out.push(ev);
        }
        Ok(())
    }

    /// Read a window back from the X server (`GetImage`), `0x00RRGGBB` row after row.
    pub fn get_image(&self, xid: u32, w: u16, h: u16) -> Result<Vec<u32>, XError> {
        let c = self.conn.lock();
        let r = c.get_image(ImageFormat::Z_PIXMAP, xid, 0, 0, w, h, !0)?.reply()?;
        Ok(r.data.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0xff_ffff).collect())
    }
}

/// Attach a memfd read-only on `c`; returns the segment.
fn attach(c: &RustConnection, fd: BorrowedFd<'_>) -> Result<u32, XError> {
    let seg = c.generate_id()?;
    let dup: OwnedFd = fd.try_clone_to_owned().map_err(|e| XError::Conn(e.into()))?;
    c.shm_attach_fd(seg, dup, true)?;
    Ok(seg)
}

impl AsRawFd for XConn {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.conn.unlocked().stream().as_raw_fd()
    }
}

/// An X connection that one thread at a time uses, from its first request to the
/// answer it waits for.
///
/// x11rb lets several threads share a connection: one of them reads the socket for
/// all, the others wait for it, and a thread that finds its write blocked reads
/// instead, without waiting, unless another thread holds the reader role, in which
/// case it polls and retries. With the server's threads at different real-time
/// priorities on one CPU, that retry is a livelock: the presenter (`SCHED_FIFO` 62)
/// polled, found the socket readable, could not read (a transport thread at 60 held
/// the reader role), and polled again, forever, while the thread that could read never
/// ran again (the experiment hung: "sync: the display server did not answer in
/// time"). The same held for the events connection: its descriptor showed the answer
/// to a transport thread's round trip, which the presenter could not read and never
/// stopped looking at.
///
/// Taking turns removes the class: no thread is ever inside x11rb on a connection
/// another thread is inside, so x11rb's reader role is never contended and none of
/// its waits is on another thread. A thread that wants a busy connection sleeps on
/// the turn while the holder waits for the X server in `poll`; nothing spins, so the
/// X server (timesharing) runs and answers. The turn is a priority-inheriting mutex
/// (`FUTEX_LOCK_PI`, [`PiMutex`]): a timesharing transport thread holding it while
/// the real-time presenter waits runs at the presenter's priority until it lets go,
/// so the presenter waits for one round trip, not for the holder's turn among every
/// other program on the CPU.
#[derive(Debug)]
struct Serial {
    conn: RustConnection,
    turn: PiMutex<()>,
}

/// One thread's turn on a [`Serial`] connection.
struct Turn<'a> {
    conn: &'a RustConnection,
    _turn: PiMutexGuard<'a, ()>,
}

impl Serial {
    fn new(conn: RustConnection) -> Serial {
        Serial { conn, turn: PiMutex::new(()) }
    }

    /// Wait for the connection to be free, and have it until the turn is dropped.
    fn lock(&self) -> Turn<'_> {
        let turn = self.turn.lock();
        Turn { conn: &self.conn, _turn: turn }
    }

    /// What needs no turn: the setup the server sent, the descriptor (to poll it).
    fn unlocked(&self) -> &RustConnection {
        &self.conn
    }
}

impl Deref for Turn<'_> {
    type Target = RustConnection;
    fn deref(&self) -> &RustConnection {
        self.conn
    }
}
