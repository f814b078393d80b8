//! The server's state shared by its threads: windows, per-client sessions and
//! outboxes, and what the presenter must do next.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use ictus_display::proto::{self, error, op, Message, Rect, Request, Source};
use ictus_ipc::{Name, OolRegion};

use crate::raster::{Area, Surface};
use crate::sys::{self, Pixels};
use crate::x11::{XConn, XWin};

/// Locks, shrugging off a poisoned lock (a panicking thread stops the server anyway).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The limits every client lives within.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Windows per client.
    pub windows: usize,
    /// Pixels of all a client's windows together.
    pub pixels: usize,
    /// Frames queued per window.
    pub queued_frames: usize,
    /// Messages waiting for a client that does not read before it is cut off.
    pub outbox: usize,
    /// Attachments held per client.
    pub attachments: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { windows: 64, pixels: 16 << 20, queued_frames: 16, outbox: 4096, attachments: 64 }
    }
}

/// Where a frame's pixels are.
#[derive(Debug)]
pub(crate) enum FrameSrc {
    /// A client's pool buffer, held; `seg` is its channel attached to the X server.
    Held { held: ictus_shm::Held, seg: Option<u32> },
    /// A client's pool buffer given back once the X server had the frame, still read
    /// for repaints (see [`FrameJob::give_back`]).
    Viewed { view: ictus_shm::Viewed, seg: Option<u32> },
    /// An out-of-line region from a port message.
    Ool(OolRegion),
    /// Bytes read from a socket.
    Bytes(Vec<u8>),
}

impl FrameSrc {
    pub(crate) fn len(&self) -> usize {
        match self {
            FrameSrc::Held { held, .. } => held.len(),
            FrameSrc::Viewed { view, .. } => view.len(),
            FrameSrc::Ool(r) => r.len(),
            FrameSrc::Bytes(b) => b.len(),
        }
    }

    /// Which client's pool buffer it is, and where in the channel: for a viewed one,
    /// to tell whether a new frame was written into that very buffer.
    pub(crate) fn pool_buffer(&self) -> Option<(ictus_shm::ClientId, u64)> {
        match self {
            FrameSrc::Held { held, .. } => Some((held.client(), held.offset())),
            FrameSrc::Viewed { view, .. } => Some((view.client(), view.offset())),
            _ => None,
        }
    }

    /// Hand the bytes to a copy.
    pub(crate) fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            FrameSrc::Held { held, .. } => sys::with_shared(held.payload(), f),
            FrameSrc::Viewed { view, .. } => sys::with_shared(view.payload(), f),
            FrameSrc::Ool(r) => f(r),
            FrameSrc::Bytes(b) => f(b),
        }
    }
}

/// A frame: its pixels and where they go.
#[derive(Debug)]
pub(crate) struct FrameJob {
    pub src: FrameSrc,
    pub rect: Rect,
    pub stride: u32,
    pub tag: u32,
    pub due_ns: u64,
    /// Due now, and the client waits until the X server has it (a sync with the
    /// screen in the same batch): once it has, the pool buffer goes back to the
    /// client at once rather than when a later frame replaces this one, so that a
    /// client that waits for each frame writes every frame into one buffer, still in
    /// the cache, as an X client reuses its one MIT-SHM segment (doc/display.md). The
    /// server keeps reading the buffer for repaints until the next frame replaces it.
    pub give_back: bool,
}

/// A window's mutable state.
#[derive(Debug)]
pub(crate) struct WinState {
    /// Position (in its parent) and size.
    pub rect: Rect,
    /// Its contents.
    pub px: Pixels,
    /// What changed in `px` since it was last presented.
    pub damage: Area,
    /// The frame shown over the contents, not yet copied into them (zero-copy video).
    pub overlay: Option<FrameJob>,
    /// Whether the overlay still has to be presented.
    pub overlay_dirty: bool,
    /// Frames waiting for their time.
    pub queue: VecDeque<FrameJob>,
    /// Its X window.
    pub x: Option<XWin>,
    /// Gone: the presenter skips it.
    pub destroyed: bool,
}

/// A window.
#[derive(Debug)]
pub(crate) struct Win {
    /// Unique in the server.
    pub key: u64,
    /// The client's number for it.
    pub id: u32,
    /// Its parent's key.
    pub parent: Option<u64>,
    /// Whose it is.
    pub outbox: Arc<Outbox>,
    /// Its state.
    pub st: Mutex<WinState>,
}

impl WinState {
    /// Copy the overlay frame into the contents (before drawing on them), giving its
    /// source to `retire` (freed once the screen no longer reads it).
    pub(crate) fn materialize(&mut self, retire: &Mutex<Vec<FrameSrc>>) {
        if let Some(f) = self.overlay.take() {
            let (w, h) = (self.px.w, self.px.h);
            let mut s = Surface { px: self.px.as_mut_slice(), w, h };
            let a = f.src.with_bytes(|b| s.put_image(f.rect, f.stride as usize, b));
            self.damage = self.damage.union(&a);
            self.overlay_dirty = false;
            lock(retire).push(f.src);
        }
    }
}

/// What waits for a client.
#[derive(Debug)]
pub(crate) enum Out {
    /// An encoded message.
    Msg(Vec<u8>),
    /// The answer to a port client's sync call, through its reply right.
    PortReply { reply: Name, bytes: Vec<u8> },
}

/// How a transport thread is woken to deliver what waits.
#[derive(Debug)]
pub(crate) enum Waker {
    /// A shared-memory channel of the server's own to itself: a record rings the
    /// server's bell like any client's (the paper's "back door").
    Shm(Mutex<Box<ictus_shm::Client>>),
    /// An eventfd in the socket thread's epoll, or the port thread's poll.
    Fd(OwnedFd),
}

impl Waker {
    pub(crate) fn wake(&self) {
        match self {
            Waker::Shm(c) => {
                let _ = lock(c).send(0, &[]);
            }
            Waker::Fd(fd) => {
                let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
            }
        }
    }
}

/// Messages waiting for one client, and how to wake its transport thread.
#[derive(Debug)]
pub(crate) struct Outbox {
    pub q: Mutex<VecDeque<Out>>,
    pub waker: Arc<Waker>,
    /// Set when the client is gone: nothing more is queued.
    pub gone: AtomicBool,
}

impl Outbox {
    pub(crate) fn new(waker: Arc<Waker>) -> Arc<Outbox> {
        Arc::new(Outbox { q: Mutex::new(VecDeque::new()), waker, gone: AtomicBool::new(false) })
    }

    /// Queue a message from this thread (the transport thread delivers it after the batch).
    pub(crate) fn push(&self, m: &Message) {
        if !self.gone.load(Ordering::Relaxed) {
            let mut b = Vec::with_capacity(32);
            m.encode(&mut b);
            lock(&self.q).push_back(Out::Msg(b));
        }
    }

    /// Queue from another thread and wake the transport.
    pub(crate) fn push_wake(&self, out: Out) {
        if !self.gone.load(Ordering::Relaxed) {
            lock(&self.q).push_back(out);
            self.waker.wake();
        }
    }
}

/// A sync that waits for the screen: delivered after the next acknowledged present.
#[derive(Debug)]
pub(crate) struct Fence {
    pub outbox: Arc<Outbox>,
    /// The answer, without its present's stamps.
    pub synced: Message,
    /// A port client's reply right.
    pub reply: Option<Name>,
}

impl Fence {
    /// Answer, stamped with when the present was sent to the X server and acknowledged
    /// (0 and 0: none was).
    pub(crate) fn answer(self, sent: u64, acked: u64) {
        let mut m = self.synced;
        if let Message::Synced { sent_ns, acked_ns, .. } = &mut m {
            (*sent_ns, *acked_ns) = (sent, acked);
        }
        self.outbox.push_wake(encoded_answer(&m, self.reply));
    }
}

/// The encoded answer to a sync: through a port client's reply right, or as a message.
fn encoded_answer(m: &Message, reply: Option<Name>) -> Out {
    let mut bytes = Vec::with_capacity(56);
    m.encode(&mut bytes);
    match reply {
        Some(reply) => Out::PortReply { reply, bytes },
        None => Out::Msg(bytes),
    }
}

/// Counters.
#[derive(Debug, Default)]
pub struct CoreStats {
    /// Present cycles (each ends with the X server's acknowledgement).
    pub presents: AtomicU64,
    /// Frames shown.
    pub frames_shown: AtomicU64,
    /// Frames dropped because a later one was due.
    pub frames_dropped: AtomicU64,
    /// Clients cut off for bad requests or not reading.
    pub cut_off: AtomicU64,
    /// Requests refused with an error message.
    pub errors: AtomicU64,
    /// Clients connected, ever.
    pub clients: AtomicU64,
}

/// The state the transport threads and the presenter share.
#[derive(Debug)]
pub(crate) struct Core {
    pub windows: Mutex<HashMap<u64, Arc<Win>>>,
    pub screen: (u16, u16),
    pub x: Option<Arc<XConn>>,
    pub limits: Limits,
    next_key: AtomicU64,
    /// Wakes the presenter.
    pub present_wake: OwnedFd,
    /// Set while some window has damage the presenter has not been told of.
    pub damage_pending: AtomicBool,
    pub fences: Mutex<Vec<Fence>>,
    /// Frame sources freed after the next acknowledged present.
    pub retired: Mutex<Vec<FrameSrc>>,
    /// Pool buffers to give back to their clients (by the shared-memory thread).
    pub release: Mutex<Vec<ictus_shm::Held>>,
    /// Windows whose shown frame's buffer goes back to its client, seen still
    /// ([`FrameJob::give_back`]; by the shared-memory thread, after `release`).
    pub give_back: Mutex<Vec<Arc<Win>>>,
    pub shm_waker: Mutex<Option<Arc<Waker>>>,
    pub stop: AtomicBool,
    pub stats: CoreStats,
    /// The shortest time between two presents of damage (not of timed frames).
    pub refresh_ns: u64,
    /// The presenter's state, for whichever thread runs a present cycle.
    pub present: Mutex<crate::present::PresentState>,
}

impl Core {
    pub(crate) fn new(
        screen: (u16, u16),
        x: Option<Arc<XConn>>,
        limits: Limits,
        refresh_ns: u64,
    ) -> rustix::io::Result<Core> {
        Ok(Core {
            windows: Mutex::new(HashMap::new()),
            screen,
            x,
            limits,
            next_key: AtomicU64::new(1),
            present_wake: rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )?,
            damage_pending: AtomicBool::new(false),
            fences: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
            release: Mutex::new(Vec::new()),
            give_back: Mutex::new(Vec::new()),
            shm_waker: Mutex::new(None),
            stop: AtomicBool::new(false),
            stats: CoreStats::default(),
            refresh_ns,
            present: Mutex::new(crate::present::PresentState::default()),
        })
    }

    pub(crate) fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn wake_presenter(&self) {
        let _ = rustix::io::write(self.present_wake.as_fd(), &1u64.to_ne_bytes());
    }

    /// Say there is damage; wakes the presenter only on the first since its last look.
    pub(crate) fn damaged(&self) {
        if !self.damage_pending.swap(true, Ordering::AcqRel) {
            self.wake_presenter();
        }
    }

    /// A pool buffer goes back to its client, through the shared-memory thread.
    pub(crate) fn release_held(&self, h: ictus_shm::Held) {
        lock(&self.release).push(h);
        self.wake_shm();
    }

    /// Wake the shared-memory thread (to give buffers back).
    pub(crate) fn wake_shm(&self) {
        if let Some(w) = lock(&self.shm_waker).as_ref() {
            w.wake();
        }
    }

    /// Free frame sources (pool buffers go back to their clients).
    pub(crate) fn free(&self, srcs: Vec<FrameSrc>) {
        for s in srcs {
            if let FrameSrc::Held { held, .. } = s {
                self.release_held(held);
            }
        }
    }

    /// Everything shown composed on a screen-sized canvas, `0x00RRGGBB` row after row:
    /// each top-level window at its place, sub-windows on their parents, in creation
    /// order. Frames not yet copied into a window's contents are drawn over them.
    pub(crate) fn snapshot(&self) -> (usize, usize, Vec<u32>) {
        let (w, h) = (self.screen.0 as usize, self.screen.1 as usize);
        let mut canvas = vec![0u32; w * h];
        let wins = lock(&self.windows);
        let mut all: Vec<&Arc<Win>> = wins.values().collect();
        all.sort_by_key(|w| w.key);
        fn origin(wins: &HashMap<u64, Arc<Win>>, win: &Win) -> (i32, i32) {
            let r = lock(&win.st).rect;
            let (mut x, mut y) = (i32::from(r.x), i32::from(r.y));
            if let Some(p) = win.parent.and_then(|p| wins.get(&p)) {
                let (px, py) = origin(wins, p);
                x += px;
                y += py;
            }
            (x, y)
        }
        for win in all {
            let (ox, oy) = origin(&wins, win);
            let pixels = window_pixels(win);
            let st = lock(&win.st);
            let (ww, wh) = (st.px.w, st.px.h);
            drop(st);
            let mut s = Surface { px: &mut canvas, w, h };
            let bytes: Vec<u8> = pixels.iter().flat_map(|p| p.to_le_bytes()).collect();
            s.put_image(Rect::new(ox as i16, oy as i16, ww as u16, wh as u16), ww * 4, &bytes);
        }
        (w, h, canvas)
    }
}

/// A window's contents with its overlay frame drawn over them.
pub(crate) fn window_pixels(win: &Win) -> Vec<u32> {
    let st = lock(&win.st);
    let mut px = st.px.as_slice().to_vec();
    if let Some(f) = &st.overlay {
        let mut s = Surface { px: &mut px, w: st.px.w, h: st.px.h };
        f.src.with_bytes(|b| s.put_image(f.rect, f.stride as usize, b));
    }
    px
}

/// One client, as its transport thread sees it.
#[derive(Debug)]
pub(crate) struct Session {
    pub outbox: Arc<Outbox>,
    windows: HashMap<u32, Arc<Win>>,
    attachments: VecDeque<(u32, FrameSrc)>,
    next_attach: u32,
    pixels: usize,
    exec_ns: u64,
    requests: u64,
    /// When the server began executing the requests since the last sync.
    begun_ns: Option<u64>,
    /// For a port client's sync call: where the synced answer goes.
    pub reply: Option<Name>,
    /// The client's channel attached to the X server (shared memory).
    pub channel_seg: Option<u32>,
    /// A frame due now waits for the end of the batch.
    present_now: bool,
    /// Windows given a frame due now in this batch.
    now_windows: Vec<Arc<Win>>,
}

/// What executing a batch found wrong with the bytes (the client is cut off).
pub(crate) type BatchError = proto::DecodeError;

impl Session {
    pub(crate) fn new(core: &Core, outbox: Arc<Outbox>) -> Session {
        core.stats.clients.fetch_add(1, Ordering::Relaxed);
        Session {
            outbox,
            windows: HashMap::new(),
            attachments: VecDeque::new(),
            next_attach: 0,
            pixels: 0,
            exec_ns: 0,
            requests: 0,
            begun_ns: None,
            reply: None,
            channel_seg: None,
            present_now: false,
            now_windows: Vec::new(),
        }
    }

    /// An attachment arrived (in the order the client sent them).
    pub(crate) fn attach(&mut self, core: &Core, src: FrameSrc) {
        let seq = self.next_attach;
        self.next_attach = self.next_attach.wrapping_add(1);
        self.attachments.push_back((seq, src));
        while self.attachments.len() > core.limits.attachments {
            let (_, old) = self.attachments.pop_front().expect("not empty");
            core.free(vec![old]);
        }
    }

    fn take_attachment(&mut self, core: &Core, seq: u32) -> Option<FrameSrc> {
        // Attachments older than the one named were never used: give them back.
        while let Some((s, _)) = self.attachments.front() {
            if *s == seq {
                return self.attachments.pop_front().map(|(_, src)| src);
            }
            if s.wrapping_sub(seq) < u32::MAX / 2 {
                // Only newer ones are left: the one named is gone or never came.
                return None;
            }
            let (_, old) = self.attachments.pop_front().expect("not empty");
            core.free(vec![old]);
        }
        None
    }

    fn error(&self, core: &Core, code: u16, op: u8, window: u32) {
        core.stats.errors.fetch_add(1, Ordering::Relaxed);
        self.outbox.push(&Message::Error { code, op, window });
    }

    /// Execute a batch of requests. A request that names something wrong (a window it
    /// does not have, an attachment that is not there) gets an error message and the
    /// batch goes on; bytes that do not decode end the batch with `Err` (the caller cuts
    /// the client off).
    pub(crate) fn execute(&mut self, core: &Core, mut bytes: &[u8]) -> Result<(), BatchError> {
        let mut mark = Instant::now();
        self.begun_ns.get_or_insert_with(ictus_display::monotonic_ns);
        let mut damaged = false;
        let result = loop {
            if bytes.is_empty() {
                break Ok(());
            }
            let (req, n) = match Request::decode(bytes) {
                Ok(x) => x,
                Err(e) => break Err(e),
            };
            bytes = &bytes[n..];
            self.requests += 1;
            if let Request::Sync { serial, shown } = req {
                // What this batch drew so far is damage a sync with the screen must show.
                if std::mem::take(&mut damaged) {
                    core.damaged();
                }
                self.exec_ns += mark.elapsed().as_nanos() as u64;
                self.sync(core, serial, shown);
                // A sync with the screen presents on this thread: not request time.
                mark = Instant::now();
                continue;
            }
            damaged |= self.one(core, req);
        };
        if damaged {
            core.damaged();
        }
        self.exec_ns += mark.elapsed().as_nanos() as u64;
        self.now_windows.clear();
        if std::mem::take(&mut self.present_now)
            && crate::present::cycle(core, &mut lock(&core.present), false).is_err()
        {
            core.wake_presenter();
        }
        result
    }

    fn sync(&mut self, core: &Core, serial: u32, shown: bool) {
        let m = Message::Synced {
            serial,
            exec_ns: self.exec_ns,
            requests: self.requests,
            begun_ns: self.begun_ns.take().unwrap_or(0),
            sent_ns: 0,
            acked_ns: 0,
        };
        self.exec_ns = 0;
        self.requests = 0;
        if shown {
            // The client waits for this batch's frames due now: their buffers can go
            // back as soon as the X server has them.
            for win in self.now_windows.drain(..) {
                for f in lock(&win.st).queue.iter_mut().filter(|f| f.due_ns == 0) {
                    f.give_back = true;
                }
            }
            // Present now, on this thread, and answer after the X server has: two
            // thread hops fewer than asking the presenter.
            lock(&core.fences).push(Fence { outbox: self.outbox.clone(), synced: m, reply: self.reply.take() });
            self.present_now = false;
            if crate::present::cycle(core, &mut lock(&core.present), true).is_err() {
                // The X server is gone: the presenter will answer as it stops.
                core.wake_presenter();
            }
        } else {
            lock(&self.outbox.q).push_back(encoded_answer(&m, self.reply.take()));
        }
    }

    fn window(&self, core: &Core, id: u32, op: u8) -> Option<Arc<Win>> {
        let w = self.windows.get(&id).cloned();
        if w.is_none() {
            self.error(core, error::BAD_WINDOW, op, id);
        }
        w
    }

    /// One request; returns whether it changed what is shown.
    fn one(&mut self, core: &Core, req: Request<'_>) -> bool {
        let draw = |s: &Session, id: u32, opc: u8, f: &mut dyn FnMut(&mut Surface<'_>) -> Area| -> bool {
            let Some(win) = s.window(core, id, opc) else { return false };
            let mut st = lock(&win.st);
            st.materialize(&core.retired);
            let (w, h) = (st.px.w, st.px.h);
            let a = f(&mut Surface { px: st.px.as_mut_slice(), w, h });
            st.damage = st.damage.union(&a);
            !a.is_empty()
        };
        match req {
            Request::CreateWindow { id, parent, rect, background } => self.create(core, id, parent, rect, background),
            Request::DestroyWindow { id } => {
                if self.window(core, id, op::DESTROY_WINDOW).is_some() {
                    self.destroy(core, id);
                }
                false
            }
            Request::ConfigureWindow { id, rect } => self.configure(core, id, rect),
            Request::SetTitle { id, title } => {
                if let Some(win) = self.window(core, id, op::SET_TITLE) {
                    if let (Some(x), Some(xw)) = (&core.x, lock(&win.st).x) {
                        x.set_title(xw, &String::from_utf8_lossy(title));
                    }
                }
                false
            }
            Request::FillRects { window, op: rop, color, rects } => draw(self, window, op::FILL_RECTS, &mut |s| {
                rects.iter().fold(Area::default(), |a, r| a.union(&s.fill(r, rop, color & 0xff_ffff)))
            }),
            Request::Segments { window, op: rop, color, segments } => draw(self, window, op::SEGMENTS, &mut |s| {
                segments.iter().fold(Area::default(), |a, g| a.union(&s.segment(g, rop, color & 0xff_ffff)))
            }),
            Request::Text { window, x, y, fg, bg, text } => {
                draw(self, window, op::TEXT, &mut |s| s.text(x, y, fg & 0xff_ffff, bg.map(|b| b & 0xff_ffff), text))
            }
            Request::CopyArea { window, src, dx, dy } => {
                draw(self, window, op::COPY_AREA, &mut |s| s.copy_area(src, dx, dy))
            }
            Request::PutImage { window, rect, stride, source } => match source {
                Source::Inline(b) => draw(self, window, op::PUT_IMAGE, &mut |s| s.put_image(rect, stride as usize, b)),
                Source::Attachment(seq) => {
                    let Some(src) = self.attachment_for(core, op::PUT_IMAGE, window, seq, rect, stride) else {
                        return false;
                    };
                    let changed = draw(self, window, op::PUT_IMAGE, &mut |s| {
                        src.with_bytes(|b| s.put_image(rect, stride as usize, b))
                    });
                    core.free(vec![src]);
                    changed
                }
            },
            Request::PresentFrame { window, rect, stride, source, tag, due_ns } => {
                let src = match source {
                    Source::Inline(b) => FrameSrc::Bytes(b.to_vec()),
                    Source::Attachment(seq) => {
                        match self.attachment_for(core, op::PRESENT_FRAME, window, seq, rect, stride) {
                            Some(s) => s,
                            None => return false,
                        }
                    }
                };
                let Some(win) = self.window(core, window, op::PRESENT_FRAME) else {
                    core.free(vec![src]);
                    return false;
                };
                let mut st = lock(&win.st);
                if st.queue.len() >= core.limits.queued_frames {
                    drop(st);
                    self.error(core, error::LIMIT, op::PRESENT_FRAME, window);
                    core.free(vec![src]);
                    return false;
                }
                st.queue.push_back(FrameJob { src, rect, stride, tag, due_ns, give_back: false });
                drop(st);
                if due_ns == 0 {
                    // Due now: shown from this thread at the end of the batch.
                    self.present_now = true;
                    if !self.now_windows.iter().any(|w| Arc::ptr_eq(w, &win)) {
                        self.now_windows.push(win);
                    }
                } else {
                    // The presenter sets its timer for it.
                    core.wake_presenter();
                }
                false
            }
            Request::Sync { .. } => false,
        }
    }

    fn attachment_for(
        &mut self,
        core: &Core,
        opc: u8,
        window: u32,
        seq: u32,
        rect: Rect,
        stride: u32,
    ) -> Option<FrameSrc> {
        let Some(src) = self.take_attachment(core, seq) else {
            self.error(core, error::BAD_ATTACHMENT, opc, window);
            return None;
        };
        if src.len() < Request::image_len(rect, stride) {
            self.error(core, error::BAD_GEOMETRY, opc, window);
            core.free(vec![src]);
            return None;
        }
        Some(src)
    }

    fn create(&mut self, core: &Core, id: u32, parent: u32, rect: Rect, background: u32) -> bool {
        let opc = op::CREATE_WINDOW;
        if self.windows.contains_key(&id) {
            self.error(core, error::ID_IN_USE, opc, id);
            return false;
        }
        let parent = match parent {
            0 => None,
            p => match self.window(core, p, opc) {
                Some(w) => Some(w),
                None => return false,
            },
        };
        let n = rect.w as usize * rect.h as usize;
        if self.windows.len() >= core.limits.windows || self.pixels + n > core.limits.pixels {
            self.error(core, error::LIMIT, opc, id);
            return false;
        }
        let Ok(px) = Pixels::new(rect.w.into(), rect.h.into(), background & 0xff_ffff) else {
            self.error(core, error::FAILED, opc, id);
            return false;
        };
        let x = match &core.x {
            Some(x) => {
                let parent_x = parent.as_ref().and_then(|p| lock(&p.st).x);
                let made = x.create_window(parent_x, rect, &px);
                // Events this thread read while it waited for the X server are in the
                // events connection's queue, which the presenter drains when it wakes.
                core.wake_presenter();
                match made {
                    Ok(w) => Some(w),
                    Err(_) => {
                        self.error(core, error::FAILED, opc, id);
                        return false;
                    }
                }
            }
            None => None,
        };
        let full = Area::of(Rect::new(0, 0, rect.w, rect.h));
        let win = Arc::new(Win {
            key: core.next_key(),
            id,
            parent: parent.map(|p| p.key),
            outbox: self.outbox.clone(),
            st: Mutex::new(WinState {
                rect,
                px,
                damage: full,
                overlay: None,
                overlay_dirty: false,
                queue: VecDeque::new(),
                x,
                destroyed: false,
            }),
        });
        self.pixels += n;
        lock(&core.windows).insert(win.key, win.clone());
        self.windows.insert(id, win);
        true
    }

    fn configure(&mut self, core: &Core, id: u32, rect: Rect) -> bool {
        let Some(win) = self.window(core, id, op::CONFIGURE_WINDOW) else { return false };
        let mut st = lock(&win.st);
        let old = st.rect;
        let n_old = old.w as usize * old.h as usize;
        let n_new = rect.w as usize * rect.h as usize;
        if self.pixels - n_old + n_new > core.limits.pixels {
            drop(st);
            self.error(core, error::LIMIT, op::CONFIGURE_WINDOW, id);
            return false;
        }
        let changed = resize(core, &mut st, rect);
        self.pixels = self.pixels - n_old + n_new;
        if let (Some(x), Some(xw)) = (&core.x, st.x) {
            x.configure(xw, rect);
        }
        self.outbox.push(&Message::Configure { window: id, rect });
        changed
    }

    fn destroy(&mut self, core: &Core, id: u32) {
        // Sub-windows first.
        let key = match self.windows.get(&id) {
            Some(w) => w.key,
            None => return,
        };
        let children: Vec<u32> = self.windows.values().filter(|w| w.parent == Some(key)).map(|w| w.id).collect();
        for c in children {
            self.destroy(core, c);
        }
        if let Some(win) = self.windows.remove(&id) {
            lock(&core.windows).remove(&win.key);
            let mut st = lock(&win.st);
            st.destroyed = true;
            self.pixels -= st.px.w * st.px.h;
            if let (Some(x), Some(xw)) = (&core.x, st.x.take()) {
                x.destroy_window(xw);
            }
            let mut srcs: Vec<FrameSrc> = st.queue.drain(..).map(|f| f.src).collect();
            srcs.extend(st.overlay.take().map(|f| f.src));
            drop(st);
            // The screen may still read them: after the next acknowledged present.
            lock(&core.retired).extend(srcs);
        }
    }

    /// The client is gone (closed, died, or cut off): its windows and buffers go.
    pub(crate) fn close(mut self, core: &Core) {
        self.outbox.gone.store(true, Ordering::Relaxed);
        let ids: Vec<u32> = self.windows.values().filter(|w| w.parent.is_none()).map(|w| w.id).collect();
        for id in ids {
            self.destroy(core, id);
        }
        let srcs: Vec<FrameSrc> = self.attachments.drain(..).map(|(_, s)| s).collect();
        lock(&core.retired).extend(srcs);
        if let (Some(x), Some(seg)) = (&core.x, self.channel_seg.take()) {
            x.detach_later(seg);
        }
        lock(&self.outbox.q).clear();
        core.wake_presenter();
    }
}

/// Give a window new pixels of the new size, keeping what overlaps; returns whether
/// anything is to be presented.
pub(crate) fn resize(core: &Core, st: &mut WinState, rect: Rect) -> bool {
    st.materialize(&core.retired);
    let (w, h) = (rect.w as usize, rect.h as usize);
    if (w, h) != (st.px.w, st.px.h) {
        let Ok(mut px) = Pixels::new(w, h, 0) else { return false };
        let (ow, oh) = (st.px.w, st.px.h);
        let old = st.px.as_slice();
        let dst = px.as_mut_slice();
        for y in 0..oh.min(h) {
            let n = ow.min(w);
            dst[y * w..y * w + n].copy_from_slice(&old[y * ow..y * ow + n]);
        }
        if let (Some(x), Some(xw)) = (&core.x, st.x.as_mut()) {
            x.replace_pixels(xw, &px);
        }
        st.px = px;
        st.damage = Area::of(Rect::new(0, 0, rect.w, rect.h));
    }
    st.rect = rect;
    true
}
