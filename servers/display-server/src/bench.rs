//! The `display` experiment: 002 Table 1 (muncher), 002 §4.2 (a terminal scrolling a
//! file, a maze drawn and solved), 000 §10 (frames, and frames paced at 30 fps), over
//! each of our transports and beside a peer that draws the same thing straight into
//! the same X server with x11rb over its own socket (what a program would do without
//! ictus). Xvfb is started and stopped here; our server runs in a process of its own
//! (this binary re-executed, [`maybe_run_child`]); rounds alternate peer and ours.
//!
//! What "our path" includes: the client library, the transport, our server executing
//! the requests into the windows' contents, and the X server receiving them. Drawing
//! reaches the X server at most once per refresh period (damage merged, as a
//! compositor does); every round ends with a sync that waits for the X server, so the
//! time per iteration includes getting everything onto the screen. A companion case
//! syncs with the screen every iteration.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use ictus_bench::child::{fd_arg, role_status, spawn_child};
use ictus_bench::experiment::Options;
use ictus_bench::plot::{Bar, BarChart, BarGroup};
use ictus_bench::{
    BenchError, Better, Conditions, Experiment, Headline, LatencyRecorder, Outcome, PaperFigure, Report, Role,
};
use ictus_display::{
    monotonic_ns, ConnectOptions, Display, Message, RasterOp, Rect, Segment, SyncInfo, Transport, Window,
};
use ictus_ipc::{
    Disposition, Message as PortMessage, PortArg, ReceiveOptions, Received, RightKind, SendOptions, Space,
};
use serde_json::json;
use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::shm::ConnectionExt as _;
use x11rb::protocol::xproto::{
    self, ConnectionExt as _, CreateGCAux, CreateWindowAux, Gcontext, ImageFormat, Rectangle,
};
use x11rb::rust_connection::RustConnection;

use crate::xvfb::Xvfb;

/// `ictus bench display`.
pub static DISPLAY: Experiment = Experiment {
    name: "display",
    about: "Display transports (002 Table 1, §4.2; 000 §10): muncher, a scrolling terminal, a maze, frames and \
            frames paced at 30 fps over socket, ports and shared memory, beside x11rb drawing straight into the \
            same Xvfb",
    figures: &[6, 11, 12],
    quick_s: 30.0,
    full_s: 300.0,
    roles: &[&SERVER_ROLE],
    args,
    run,
};

/// Our display server, in a process of its own: `DISPLAY SOCKET REFRESH_HZ FD`, where
/// FD is a send right on which it sends its service port.
pub static SERVER_ROLE: Role = Role { name: "display-server", run: server_role };

fn args() -> Vec<clap::Arg> {
    vec![
        clap::Arg::new("refresh-hz")
            .long("refresh-hz")
            .value_name("HZ")
            .value_parser(ictus_args::count(1, 1000))
            .default_value("60")
            .help("Presents of drawing per second at most, in our server, 1 to 1000"),
        clap::Arg::new("spin-us")
            .long("spin-us")
            .value_name("US")
            .value_parser(ictus_args::micros(0, 10_000))
            .default_value("20")
            .help(
                "How long both ends of a shared-memory channel spin before they block, in microseconds, 0 to \
                 10000, when the machine has a CPU to spare (runnable tasks <= CPUs, never when pinned to one \
                 CPU); 0: always block",
            ),
    ]
}

fn io(context: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::io(context.to_owned(), std::io::Error::other(e.to_string()))
}

fn server_role(args: &[String]) -> i32 {
    role_status(SERVER_ROLE.name, serve_child(args))
}

fn serve_child(args: &[String]) -> Result<(), String> {
    let [display, socket, refresh, spin_us, fd] = args else {
        return Err("expected DISPLAY SOCKET REFRESH_HZ SPIN_US FD".into());
    };
    let space = Space::task();
    let parent = space.insert_send_fd(fd_arg(fd).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let mut opts = crate::Options::headless(0, 0, Some(PathBuf::from(socket)));
    opts.screen = crate::Screen::X { display: Some(display.clone()), shm: true };
    opts.refresh_hz = refresh.parse().map_err(|_| "bad refresh rate")?;
    // As `ictus display serve` runs it: the presenter real-time when allowed, the
    // transports timesharing (lib.rs, Options::realtime_transports).
    opts.realtime = true;
    opts.realtime_transports = false;
    opts.shm_wait.spin = Duration::from_micros(spin_us.parse().map_err(|_| "bad spin")?);
    let running = crate::spawn(&space, opts).map_err(|e| e.to_string())?;
    // What the server's threads got from the scheduler, for the report's notes.
    let sched: Vec<String> = running
        .scheduling()
        .iter()
        .map(|t| format!("{} {}", t.thread.trim_start_matches("ictus-display-"), t.policy))
        .collect();
    let mut m = PortMessage::new(1, sched.join(", ").into_bytes());
    m.ports.push(PortArg::new(running.service_port(), Disposition::MakeSend));
    space.send(parent, &mut m, SendOptions { timeout: Some(Duration::from_secs(10)) }).map_err(|e| e.to_string())?;
    // Serve until the experiment goes (its port dies with it).
    while space.right_kinds(parent).is_ok_and(|k| k.contains(&RightKind::Send)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    running.stop();
    Ok(())
}

/// Our display server in a process of its own.
struct ServerProc {
    child: Child,
    space: Space,
    service: ictus_ipc::Name,
    spin: Duration,
    /// The server's threads and their scheduling classes, as the server reported them.
    scheduling: String,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl ServerProc {
    fn start(display: &str, refresh_hz: u32, spin: Duration) -> Result<ServerProc, BenchError> {
        let dir = std::env::temp_dir().join(format!("ictus-display-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::io("socket directory", e))?;
        let dir = TempDir(dir);
        let space = Space::new();
        let port = space.allocate_port().map_err(|e| io("port", e))?;
        let right = space.send_right_fd(port).map_err(|e| io("port", e))?;
        let args = [
            display.to_owned(),
            dir.0.join("display.sock").display().to_string(),
            refresh_hz.to_string(),
            spin.as_micros().to_string(),
        ];
        let args: Vec<String> = args.into_iter().chain([right.as_raw_fd().to_string()]).collect();
        let child = spawn_child(&SERVER_ROLE, &args, &[right.as_fd()])
            .map_err(|e| BenchError::io("starting the display server", e))?;
        drop(right);
        let mut got = Received::new();
        let opts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), populate_ool: false };
        space.receive(port, &mut got, opts).map_err(|e| io("the display server's service right", e))?;
        let service = match got.ports.as_slice() {
            [r] if r.kind == RightKind::Send => r.name,
            _ => return Err(io("the display server", "sent no service right")),
        };
        let scheduling = String::from_utf8_lossy(got.data()).into_owned();
        Ok(ServerProc { child, space, service, spin, scheduling, _dir: dir })
    }

    fn connect(&self, t: Transport) -> Result<Display, BenchError> {
        let mut o = ConnectOptions::new(t);
        o.wait.spin = self.spin;
        o.timeout = Duration::from_secs(60);
        Display::connect_to(&self.space, self.service, &o).map_err(|e| io("connecting", e))
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The screen: four 1920×1080 quadrants, one per drawer, so that no window covers
/// another. An X server clips drawing to what is visible: a window under another
/// would be drawn for nothing, and whoever drew it would look faster than they are.
const SCREEN: (u16, u16) = (3840, 2160);

/// Where a drawer's windows go: the peer (`None`) top left, then socket, port, shm.
fn origin(t: Option<Transport>) -> (i16, i16) {
    match t {
        None => (0, 0),
        Some(Transport::Socket) => (1920, 0),
        Some(Transport::Port) => (0, 1080),
        Some(Transport::Shm) => (1920, 1080),
    }
}

/// One drawing step, as our protocol and X11 both have it.
#[derive(Clone, Debug)]
enum Op {
    Fill(Rect, u32),
    Xor(Rect, u32),
    Segs(Vec<Segment>, u32),
    Text(i16, i16, Vec<u8>),
    Copy(Rect, i16, i16),
    Flush,
}

/// Something that draws: our client over a transport, or the peer.
trait Drawer {
    fn window(&mut self, w: u16, h: u16) -> Result<(), BenchError>;
    fn ops(&mut self, ops: &[Op]) -> Result<(), BenchError>;
    /// Wait until the drawing is done; returns the server's time if it says.
    fn sync(&mut self) -> Result<u64, BenchError>;
    /// Wait until the drawing is on the X server.
    fn sync_shown(&mut self) -> Result<(), BenchError>;
    fn close(&mut self) -> Result<(), BenchError>;
}

struct Ours {
    d: Display,
    w: Option<Window>,
    /// Where its windows go on the screen (see [`origin`]).
    at: (i16, i16),
}

impl Drawer for Ours {
    fn window(&mut self, w: u16, h: u16) -> Result<(), BenchError> {
        self.w =
            Some(self.d.create_window(None, Rect::new(self.at.0, self.at.1, w, h), 0).map_err(|e| io("window", e))?);
        self.d.sync_shown().map_err(|e| io("sync", e))?;
        Ok(())
    }
    fn ops(&mut self, ops: &[Op]) -> Result<(), BenchError> {
        let w = self.w.expect("a window");
        let d = &mut self.d;
        for op in ops {
            let r = match op {
                Op::Fill(r, c) => d.fill_rect(w, *r, *c),
                Op::Xor(r, c) => d.xor_rect(w, *r, *c),
                Op::Segs(s, c) => d.segments(w, RasterOp::Copy, *c, s),
                Op::Text(x, y, t) => d.text(w, *x, *y, 0xffffff, Some(0), t),
                Op::Copy(r, x, y) => d.copy_area(w, *r, *x, *y),
                Op::Flush => d.flush(),
            };
            r.map_err(|e| io("drawing", e))?;
        }
        Ok(())
    }
    fn sync(&mut self) -> Result<u64, BenchError> {
        self.d.sync().map(|i| i.server_ns).map_err(|e| io("sync", e))
    }
    fn sync_shown(&mut self) -> Result<(), BenchError> {
        self.d.sync_shown().map(|_| ()).map_err(|e| io("sync", e))
    }
    fn close(&mut self) -> Result<(), BenchError> {
        if let Some(w) = self.w.take() {
            self.d.destroy_window(w).map_err(|e| io("destroy", e))?;
            self.d.sync().map_err(|e| io("sync", e))?;
        }
        Ok(())
    }
}

/// The peer: x11rb straight into the X server.
struct Peer {
    c: RustConnection,
    root: u32,
    win: u32,
    gc: Gcontext,
    xor: Gcontext,
    font: u32,
}

impl Peer {
    fn connect(display: &str) -> Result<Peer, BenchError> {
        let (c, screen) = RustConnection::connect(Some(display)).map_err(|e| io("peer connect", e))?;
        let root = c.setup().roots[screen].root;
        let gen = |c: &RustConnection| c.generate_id().map_err(|e| io("peer id", e));
        let (gc, xor, font) = (gen(&c)?, gen(&c)?, gen(&c)?);
        // The X server's own fixed font (built in), 6x13: the peer's terminal glyphs.
        c.open_font(font, b"fixed").map_err(|e| io("peer font", e))?;
        c.create_gc(gc, root, &CreateGCAux::new().graphics_exposures(0).font(font)).map_err(|e| io("peer gc", e))?;
        c.create_gc(xor, root, &CreateGCAux::new().graphics_exposures(0).function(xproto::GX::XOR))
            .map_err(|e| io("peer gc", e))?;
        c.flush().map_err(|e| io("peer flush", e))?;
        c.prefetch_maximum_request_bytes();
        Ok(Peer { c, root, win: 0, gc, xor, font })
    }

    fn check<T>(r: Result<T, x11rb::errors::ConnectionError>) -> Result<T, BenchError> {
        r.map_err(|e| io("peer request", e))
    }
}

fn xrect(r: Rect) -> Rectangle {
    Rectangle { x: r.x, y: r.y, width: r.w, height: r.h }
}

impl Drawer for Peer {
    fn window(&mut self, w: u16, h: u16) -> Result<(), BenchError> {
        let id = self.c.generate_id().map_err(|e| io("peer id", e))?;
        let aux = CreateWindowAux::new().background_pixel(0);
        let (x, y) = origin(None);
        Self::check(self.c.create_window(0, id, self.root, x, y, w, h, 0, xproto::WindowClass::INPUT_OUTPUT, 0, &aux))?;
        Self::check(self.c.map_window(id))?;
        self.win = id;
        self.sync().map(|_| ())
    }
    fn ops(&mut self, ops: &[Op]) -> Result<(), BenchError> {
        let (c, w) = (&self.c, self.win);
        for op in ops {
            match op {
                Op::Fill(r, col) => {
                    Self::check(c.change_gc(self.gc, &xproto::ChangeGCAux::new().foreground(*col)))?;
                    Self::check(c.poly_fill_rectangle(w, self.gc, &[xrect(*r)]))?;
                }
                Op::Xor(r, col) => {
                    Self::check(c.change_gc(self.xor, &xproto::ChangeGCAux::new().foreground(*col)))?;
                    Self::check(c.poly_fill_rectangle(w, self.xor, &[xrect(*r)]))?;
                }
                Op::Segs(s, col) => {
                    Self::check(c.change_gc(self.gc, &xproto::ChangeGCAux::new().foreground(*col)))?;
                    let segs: Vec<xproto::Segment> =
                        s.iter().map(|s| xproto::Segment { x1: s.x1, y1: s.y1, x2: s.x2, y2: s.y2 }).collect();
                    Self::check(c.poly_segment(w, self.gc, &segs))?;
                }
                Op::Text(x, y, t) => {
                    Self::check(c.change_gc(self.gc, &xproto::ChangeGCAux::new().foreground(0xffffff).background(0)))?;
                    Self::check(c.image_text8(w, self.gc, *x, *y + 8, t))?;
                }
                Op::Copy(r, x, y) => {
                    Self::check(c.copy_area(w, w, self.gc, r.x, r.y, *x, *y, r.w, r.h))?;
                }
                Op::Flush => Self::check(c.flush())?,
            }
        }
        Ok(())
    }
    fn sync(&mut self) -> Result<u64, BenchError> {
        // XSync: flush, then a round trip.
        self.c.get_input_focus().map_err(|e| io("peer sync", e))?.reply().map_err(|e| io("peer sync", e))?;
        Ok(0)
    }
    fn sync_shown(&mut self) -> Result<(), BenchError> {
        self.sync().map(|_| ())
    }
    fn close(&mut self) -> Result<(), BenchError> {
        if self.win != 0 {
            Self::check(self.c.destroy_window(self.win))?;
            self.win = 0;
            self.sync()?;
        }
        Ok(())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.c.close_font(self.font);
        let _ = self.c.flush();
    }
}

/// A deterministic maze: drawn as it is carved, then solved, the path drawn and
/// backtracked (the MIT `maze` demo's request stream, in spirit): `cells × cells`
/// cells of 8 pixels. Each step ends with a flush, as the demo's look for events
/// between steps flushes Xlib's buffer (`XPending`); only the solution syncs.
fn maze_ops(cells: usize, seed: u64) -> Vec<Op> {
    let mut rng = seed;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let px = |c: usize| (c * 8) as i16;
    let side = (cells * 8) as u16;
    let mut ops = vec![Op::Fill(Rect::new(0, 0, side, side), 0x000000)];
    // The grid, as segments.
    let mut grid = Vec::new();
    for i in 0..=cells {
        grid.push(Segment { x1: 0, y1: px(i), x2: side as i16, y2: px(i) });
        grid.push(Segment { x1: px(i), y1: 0, x2: px(i), y2: side as i16 });
    }
    ops.push(Op::Segs(grid, 0xc0c0c0));
    // Carve with a depth-first walk, knocking each wall down as a small fill.
    let mut seen = vec![false; cells * cells];
    let mut open = vec![[false; 4]; cells * cells]; // right, down, left, up
    let mut stack = vec![0usize];
    seen[0] = true;
    while let Some(&c) = stack.last() {
        let (x, y) = (c % cells, c / cells);
        let mut nbrs = Vec::new();
        if x + 1 < cells && !seen[c + 1] {
            nbrs.push((0, c + 1));
        }
        if y + 1 < cells && !seen[c + cells] {
            nbrs.push((1, c + cells));
        }
        if x > 0 && !seen[c - 1] {
            nbrs.push((2, c - 1));
        }
        if y > 0 && !seen[c - cells] {
            nbrs.push((3, c - cells));
        }
        if nbrs.is_empty() {
            stack.pop();
            continue;
        }
        let (dir, n) = nbrs[next(nbrs.len())];
        open[c][dir] = true;
        open[n][(dir + 2) % 4] = true;
        let wall = match dir {
            0 => Rect::new(px(x + 1), px(y) + 1, 1, 7),
            1 => Rect::new(px(x) + 1, px(y + 1), 7, 1),
            2 => Rect::new(px(x), px(y) + 1, 1, 7),
            _ => Rect::new(px(x) + 1, px(y), 7, 1),
        };
        ops.push(Op::Fill(wall, 0x000000));
        ops.push(Op::Flush);
        seen[n] = true;
        stack.push(n);
    }
    // Solve from the top-left to the bottom-right, drawing the path and erasing dead ends.
    let goal = cells * cells - 1;
    let mut visited = vec![false; cells * cells];
    let mut path = vec![0usize];
    visited[0] = true;
    let dot = |c: usize, col: u32| Op::Fill(Rect::new(px(c % cells) + 2, px(c / cells) + 2, 4, 4), col);
    ops.push(dot(0, 0x00ff00));
    while let Some(&c) = path.last() {
        if c == goal {
            break;
        }
        let steps = [(0, c + 1), (1, c + cells), (2, c.wrapping_sub(1)), (3, c.wrapping_sub(cells))];
        match steps.iter().find(|(d, n)| open[c][*d] && !visited[*n]) {
            Some(&(_, n)) => {
                visited[n] = true;
                path.push(n);
                ops.push(dot(n, 0x00ff00));
                ops.push(Op::Flush);
            }
            None => {
                path.pop();
                ops.push(dot(c, 0x400000));
                ops.push(Op::Flush);
            }
        }
    }
    ops
}

/// A terminal of 80 × 24 cells of 8 pixels scrolling `lines` lines of a file with
/// jump scrolling: each chunk of 8 lines is one scroll, one clear and 8 lines of text,
/// then a flush (the terminal has read its input).
fn terminal_ops(lines: usize) -> Vec<Op> {
    let (cols, rows, chunk) = (80usize, 24usize, 8usize);
    let (w, h) = ((cols * 8) as u16, (rows * 8) as u16);
    let mut ops = Vec::new();
    let mut n = 0;
    while n < lines {
        let k = chunk.min(lines - n);
        let dy = (k * 8) as i16;
        ops.push(Op::Copy(Rect::new(0, dy, w, h - dy as u16), 0, 0));
        ops.push(Op::Fill(Rect::new(0, h as i16 - dy, w, dy as u16), 0));
        for i in 0..k {
            let text = format!("{:6}  fn line_{}() {{ let x = {} * {}; }} // scrolling the file", n + i, n + i, n, i);
            let mut t = text.into_bytes();
            t.truncate(cols);
            ops.push(Op::Text(0, h as i16 - dy + (i * 8) as i16, t));
        }
        ops.push(Op::Flush);
        n += k;
    }
    ops
}

/// Frames per case in a round, by size. 1080p: blocks of 10 in many rounds, so that
/// ours and the peer's `ShmPutImage` (adjacent in every round, their order alternating)
/// see the same machine; doc/display.md, "How the 1080p headline is measured".
const FRAMES_PER_ROUND: [usize; 3] = [40, 20, 10];

/// How long a run is.
#[derive(Clone, Copy, Debug)]
struct Scale {
    rounds: usize,
    munch: usize,
    mazes: usize,
    maze_cells: usize,
    lines: usize,
    /// Frames per case per round, by size (160×120, 640×480, 1920×1080): the same in
    /// both modes, so that quick and full runs estimate the same quantity (a frame's
    /// cost in a block of this many, after the other cases' blocks) and differ only in
    /// how many rounds they average.
    frames: [usize; 3],
    /// Rounds of frames, by size.
    frame_rounds: [usize; 3],
    paced: usize,
}

impl Scale {
    fn of(quick: bool) -> Scale {
        if quick {
            // Five short rounds rather than three long ones: on a shared machine the
            // load drifts, and alternating often keeps ours and the peer's in step.
            Scale {
                rounds: 5,
                munch: 150,
                mazes: 2,
                maze_cells: 32,
                lines: 1500,
                frames: FRAMES_PER_ROUND,
                frame_rounds: [5, 5, 6],
                paced: 30,
            }
        } else {
            Scale {
                rounds: 9,
                munch: 2500,
                mazes: 10,
                maze_cells: 32,
                lines: 15_000,
                frames: FRAMES_PER_ROUND,
                frame_rounds: [135, 90, 54],
                paced: 300,
            }
        }
    }
}

#[derive(Default)]
struct Case {
    name: String,
    rec: LatencyRecorder,
    /// Frames only, per frame: the client's part (a buffer, and writing the frame
    /// into it) and the rest (presenting it and waiting until the X server has it).
    fill: LatencyRecorder,
    rest: LatencyRecorder,
    /// Per round: mean nanoseconds per iteration, including the round's final sync
    /// with the screen.
    per_iter: Vec<f64>,
    server_ns: f64,
    client_ns: f64,
    iters: u64,
    /// Our frames only, per frame, from the server's stamps in its answer: the way in
    /// (frame written to our server beginning the batch), our server (to sending the
    /// present), the X server (to its acknowledgement), the way back (to the client
    /// having the answer).
    split: [LatencyRecorder; 4],
    /// Frames only: CPU time and context switches of this process (the clients), our
    /// server's process and Xvfb, over this case's blocks.
    cost: [Cost; 3],
    extra: serde_json::Map<String, serde_json::Value>,
}

impl Case {
    fn new(name: impl Into<String>) -> Case {
        Case { name: name.into(), ..Case::default() }
    }
    /// One frame that began at `t` and was written at `written`, and is done now.
    fn stamp(&mut self, t: Instant, written: Instant) {
        let (fill, all) = ((written - t).as_nanos() as u64, t.elapsed().as_nanos() as u64);
        self.client_ns += fill as f64;
        self.fill.record(fill);
        self.rest.record(all.saturating_sub(fill));
        self.rec.record(all);
    }
    /// Split our frame's rest by the server's stamps (one clock: `CLOCK_MONOTONIC`).
    fn hops(&mut self, written_ns: u64, info: SyncInfo, done_ns: u64) {
        if info.sent_ns == 0 || info.begun_ns == 0 {
            return;
        }
        let parts = [
            info.begun_ns.saturating_sub(written_ns),
            info.sent_ns.saturating_sub(info.begun_ns.max(written_ns)),
            info.acked_ns.saturating_sub(info.sent_ns),
            done_ns.saturating_sub(info.acked_ns),
        ];
        for (r, v) in self.split.iter_mut().zip(parts) {
            r.record(v);
        }
    }
    fn median_per_iter(&self) -> f64 {
        ictus_bench::stats::median(self.per_iter.iter().copied()).unwrap_or(f64::NAN)
    }
    fn row(&self, workload: &str, transport: &str) -> serde_json::Value {
        let n = self.iters.max(1) as f64;
        let mut row = self
            .rec
            .row(&self.name)
            .with("workload", workload)
            .with("transport", transport)
            .with("ms_per_iter", self.median_per_iter() / 1e6)
            .with("client_us", self.client_ns / n / 1e3)
            .with("server_us", self.server_ns / n / 1e3)
            .with("transport_us", ((self.median_per_iter() - (self.client_ns + self.server_ns) / n) / 1e3).max(0.0))
            .with("ms_min", self.per_iter.iter().copied().fold(f64::INFINITY, f64::min) / 1e6)
            .with("ms_max", self.per_iter.iter().copied().fold(0.0, f64::max) / 1e6);
        if self.fill.count() > 0 {
            let us = |r: &LatencyRecorder, q: f64| r.quantile(q) as f64 / 1e3;
            row = row
                .with("fill_p50_us", us(&self.fill, 0.5))
                .with("fill_p99_us", us(&self.fill, 0.99))
                .with("rest_p50_us", us(&self.rest, 0.5))
                .with("rest_p99_us", us(&self.rest, 0.99));
        }
        if self.split[0].count() > 0 {
            for (r, part) in self.split.iter().zip(["in", "server", "x", "back"]) {
                row = row.with(&format!("{part}_p50_us"), r.quantile(0.5) as f64 / 1e3);
            }
        }
        if self.cost.iter().any(|c| c.switches > 0) {
            for (c, who) in self.cost.iter().zip(["client", "server", "x"]) {
                row = row
                    .with(&format!("cpu_us_{who}"), c.cpu_ns as f64 / n / 1e3)
                    .with(&format!("switches_{who}"), c.switches as f64 / n);
            }
        }
        for (k, v) in &self.extra {
            row = row.with(k, v.clone());
        }
        row.to_value()
    }
}

/// CPU time and context switches of every thread of a process, from
/// `/proc/PID/task/*/schedstat` (ns on a CPU) and `status` (voluntary and involuntary
/// switches): what a frame costs the machine, which the load does not stretch as it
/// stretches wall time (proc(5)).
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    cpu_ns: u64,
    switches: u64,
}

impl Cost {
    fn of(pid: u32) -> Cost {
        let mut c = Cost::default();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return c };
        for t in tasks.flatten() {
            let p = t.path();
            if let Ok(s) = std::fs::read_to_string(p.join("schedstat")) {
                c.cpu_ns += s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
            if let Ok(s) = std::fs::read_to_string(p.join("status")) {
                for l in s.lines() {
                    let v = l
                        .strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"));
                    c.switches += v.and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
                }
            }
        }
        c
    }

    /// Add what was spent from `a` to `b` (a thread that ended meanwhile counts 0).
    fn add_since(&mut self, a: Cost, b: Cost) {
        self.cpu_ns += b.cpu_ns.saturating_sub(a.cpu_ns);
        self.switches += b.switches.saturating_sub(a.switches);
    }
}

/// One round of muncher: `iters` times an xor of the 256×256 window and a sync (with
/// the screen every time if `every_shown`), then a sync with the screen.
fn muncher_round(
    d: &mut dyn Drawer,
    case: &mut Case,
    iters: usize,
    every_shown: bool,
    round: usize,
) -> Result<(), BenchError> {
    let area = Rect::new(0, 0, 256, 256);
    let start = Instant::now();
    for i in 0..iters {
        let t0 = Instant::now();
        d.ops(&[Op::Xor(area, 0x010203u32.wrapping_mul((round * iters + i) as u32 | 1) & 0xffffff)])?;
        let t1 = Instant::now();
        if every_shown {
            d.sync_shown()?;
        } else {
            case.server_ns += d.sync()? as f64;
        }
        case.client_ns += (t1 - t0).as_nanos() as f64;
        case.rec.record(t0.elapsed().as_nanos() as u64);
    }
    d.sync_shown()?;
    case.per_iter.push(start.elapsed().as_nanos() as f64 / iters as f64);
    case.iters += iters as u64;
    Ok(())
}

fn frame_bytes(w: u16, h: u16, k: u32, out: &mut [u8]) {
    // A moving gradient: every byte written every frame, like a decoder's output.
    let row = w as usize * 4;
    for (y, line) in out.chunks_exact_mut(row).enumerate().take(h as usize) {
        let v = (0x0001_0101u32.wrapping_mul(y as u32 + k)) & 0xffffff;
        for px in line.chunks_exact_mut(4) {
            px.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// The peer's frames: `PutImage` over the socket (split to fit the request size), or
/// `ShmPutImage` from a memfd attached with MIT-SHM.
struct PeerFrames<'a> {
    p: &'a Peer,
    shm: Option<(u32, crate::sys::Pixels)>,
    buf: Vec<u8>,
}

impl<'a> PeerFrames<'a> {
    fn new(p: &'a Peer, w: u16, h: u16, shm: bool) -> Result<PeerFrames<'a>, BenchError> {
        let shm = if shm {
            let px = crate::sys::Pixels::new(w as usize, h as usize, 0).map_err(|e| io("peer segment", e))?;
            let seg = p.c.generate_id().map_err(|e| io("peer id", e))?;
            let fd: OwnedFd = px.fd().try_clone_to_owned().map_err(|e| BenchError::io("dup", e))?;
            Peer::check(p.c.shm_attach_fd(seg, fd, true))?;
            Some((seg, px))
        } else {
            None
        };
        Ok(PeerFrames { p, shm, buf: vec![0; w as usize * h as usize * 4] })
    }

    /// Write frame `k` into the segment (or the buffer).
    fn fill(&mut self, w: u16, h: u16, k: u32) {
        match &mut self.shm {
            Some((_, px)) => frame_bytes(w, h, k, px_bytes(px)),
            None => frame_bytes(w, h, k, &mut self.buf),
        }
    }

    /// Send it to the X server (no round trip).
    fn put(&mut self, w: u16, h: u16) -> Result<(), BenchError> {
        let (c, win, gc) = (&self.p.c, self.p.win, self.p.gc);
        match &self.shm {
            Some((seg, _)) => {
                Peer::check(c.shm_put_image(
                    win,
                    gc,
                    w,
                    h,
                    0,
                    0,
                    w,
                    h,
                    0,
                    0,
                    24,
                    ImageFormat::Z_PIXMAP.into(),
                    false,
                    *seg,
                    0,
                ))?;
            }
            None => {
                let rows = ((c.maximum_request_bytes() - 64) / (w as usize * 4)).max(1);
                let mut y = 0usize;
                while y < h as usize {
                    let n = rows.min(h as usize - y);
                    let part = &self.buf[y * w as usize * 4..(y + n) * w as usize * 4];
                    Peer::check(c.put_image(ImageFormat::Z_PIXMAP, win, gc, w, n as u16, 0, y as i16, 0, 24, part))?;
                    y += n;
                }
            }
        }
        Ok(())
    }
}

impl Drop for PeerFrames<'_> {
    fn drop(&mut self) {
        if let Some((seg, _)) = &self.shm {
            let _ = self.p.c.shm_detach(*seg);
            let _ = self.p.c.flush();
        }
    }
}

fn px_bytes(px: &mut crate::sys::Pixels) -> &mut [u8] {
    px.as_bytes_mut()
}

/// Our frame: written into the buffer the transport lends, presented (now if `due` is
/// 0), and synced with the screen or flushed. Returns when the frame was written (the
/// client's part ends there) and, if synced, what the server reported: its time on the
/// requests and its stamps.
fn our_frame(
    d: &mut Display,
    w: Window,
    fw: u16,
    fh: u16,
    k: u32,
    due: u64,
    sync: bool,
) -> Result<(Instant, u64, SyncInfo), BenchError> {
    let mut f = d.frame(fw, fh).map_err(|e| io("frame", e))?;
    frame_bytes(fw, fh, k, f.pixels());
    let written = Instant::now();
    let written_ns = monotonic_ns();
    f.present(w, 0, 0, due, k).map_err(|e| io("present", e))?;
    let info = if sync {
        d.sync_shown().map_err(|e| io("sync", e))?
    } else {
        d.flush().map_err(|e| io("flush", e))?;
        SyncInfo::default()
    };
    Ok((written, written_ns, info))
}

/// Run the experiment.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    let mut conditions = Conditions::capture_before();
    let s = Scale::of(opts.quick);
    // Checked against 1 to 1000 when parsed, so the narrowing loses nothing.
    let refresh_hz = opts.arg::<ictus_args::Count>("refresh-hz").map_or(60, |c| u32::try_from(c.get()).unwrap_or(1000));
    let spin = opts.arg::<ictus_args::Micros>("spin-us").map_or(Duration::from_micros(20), ictus_args::Micros::get);
    // Xvfb and our server on the server CPU, this thread (our clients, the peer) on the
    // client CPU; with one CPU for all (the default, as the papers' machines had), every
    // wake-up is a context switch and nothing spins.
    let _affinity = ictus_bench::pin::AffinityGuard::save()?;
    let (xvfb, server) = ictus_bench::pin::place(opts.pin, || -> Result<_, BenchError> {
        let xvfb = Xvfb::start(SCREEN.0, SCREEN.1).map_err(|e| io("Xvfb", e))?;
        let server = ServerProc::start(xvfb.display(), refresh_hz, spin)?;
        Ok((xvfb, server))
    })??;
    if let Some(plan) = opts.pin {
        conditions.pinned = plan.describe();
    }
    let mut report = Report::new("display", "002 Table 1, 002 §4.2, 000 §10", opts.quick, conditions);
    report.hidden_in_table.extend(["workload", "transport", "mean_ns"].map(String::from));
    let mut peer = Peer::connect(xvfb.display())?;
    let mut ours: Vec<Ours> = Vec::new();
    for t in Transport::ALL {
        ours.push(Ours { d: server.connect(t)?, w: None, at: origin(Some(t)) });
    }

    // ---- muncher (002 Table 1)
    let mut peer_case = Case::new("muncher: x11rb PolyFillRectangle GXxor + sync");
    let mut cases: Vec<Case> =
        Transport::ALL.iter().map(|t| Case::new(format!("muncher: ictus {}", t.name()))).collect();
    let mut shown_cases: Vec<Case> = Transport::ALL
        .iter()
        .map(|t| Case::new(format!("muncher, shown every iteration: ictus {}", t.name())))
        .collect();
    peer.window(256, 256)?;
    for o in ours.iter_mut() {
        o.window(256, 256)?;
    }
    for round in 0..s.rounds {
        muncher_round(&mut peer, &mut peer_case, s.munch, false, round)?;
        for (o, c) in ours.iter_mut().zip(cases.iter_mut()) {
            muncher_round(o, c, s.munch, false, round)?;
        }
        for (o, c) in ours.iter_mut().zip(shown_cases.iter_mut()) {
            muncher_round(o, c, s.munch / 4, true, round)?;
        }
    }
    report.rows.push(peer_case.row("muncher", "x11rb"));
    for (t, c) in Transport::ALL.iter().zip(&cases) {
        report.rows.push(c.row("muncher", t.name()));
    }
    for (t, c) in Transport::ALL.iter().zip(&shown_cases) {
        report.rows.push(c.row("muncher shown", t.name()));
    }
    let ms = |c: &Case| c.median_per_iter() / 1e6;
    let (sock, port, shm) = (&cases[0], &cases[1], &cases[2]);
    report.headline.push(
        Headline::new(
            "display_muncher_shm_vs_socket",
            ms(shm),
            ms(sock),
            "ictus display over a stream socket",
            "ms",
            Better::Lower,
        )
        .with_target(0.75),
    );
    report.headline.push(
        Headline::new(
            "display_muncher_shm_vs_xlib",
            ms(shm),
            ms(&peer_case),
            "x11rb straight to Xvfb (PolyFillRectangle GXxor, GetInputFocus)",
            "ms",
            Better::Lower,
        )
        .with_target(1.0),
    );
    report.headline.push(Headline::new(
        "display_muncher_port_vs_socket",
        ms(port),
        ms(sock),
        "ictus display over a stream socket",
        "ms",
        Better::Lower,
    ));
    report.paper_figures.push(
        PaperFigure::new("muncher over sockets (Mach 3.0)", "8.1 ms/iteration", Some(8.1), "ms", Better::Lower)
            .ours(Some(ms(sock)), format!("socket: {:.3} ms", ms(sock))),
    );
    report.paper_figures.push(
        PaperFigure::new("muncher over ports (Mach 3.0)", "4.4 ms/iteration", Some(4.4), "ms", Better::Lower)
            .ours(Some(ms(port)), format!("port: {:.3} ms", ms(port))),
    );
    report.paper_figures.push(
        PaperFigure::new("muncher over shared memory (Mach 3.0)", "3.4 ms/iteration", Some(3.4), "ms", Better::Lower)
            .ours(Some(ms(shm)), format!("shm: {:.3} ms", ms(shm))),
    );
    peer.close()?;
    for o in ours.iter_mut() {
        o.close()?;
    }

    // ---- maze and terminal (002 §4.2)
    let maze: Vec<Vec<Op>> = (0..s.mazes).map(|i| maze_ops(s.maze_cells, 0x9e37_79b9_7f4a_7c15 ^ i as u64)).collect();
    let term = terminal_ops(s.lines);
    for (workload, side) in [("maze", (s.maze_cells * 8 + 1) as u16), ("terminal", 0)] {
        let (w, h) = if workload == "maze" { (side, side) } else { (640, 192) };
        let mut pc = Case::new(format!("{workload}: x11rb"));
        let mut oc: Vec<Case> =
            Transport::ALL.iter().map(|t| Case::new(format!("{workload}: ictus {}", t.name()))).collect();
        peer.window(w, h)?;
        for o in ours.iter_mut() {
            o.window(w, h)?;
        }
        for _ in 0..s.rounds {
            let run = |d: &mut dyn Drawer, c: &mut Case| -> Result<(), BenchError> {
                let t0 = Instant::now();
                if workload == "maze" {
                    for m in &maze {
                        let t = Instant::now();
                        d.ops(m)?;
                        c.server_ns += d.sync()? as f64;
                        c.rec.record(t.elapsed().as_nanos() as u64);
                    }
                    d.sync_shown()?;
                    c.per_iter.push(t0.elapsed().as_nanos() as f64 / maze.len() as f64);
                    c.iters += maze.len() as u64;
                } else {
                    d.ops(&term)?;
                    c.server_ns += d.sync()? as f64;
                    d.sync_shown()?;
                    let e = t0.elapsed().as_nanos();
                    c.rec.record(e as u64);
                    c.per_iter.push(e as f64);
                    c.iters += 1;
                }
                Ok(())
            };
            run(&mut peer, &mut pc)?;
            for (o, c) in ours.iter_mut().zip(oc.iter_mut()) {
                run(o, c)?;
            }
        }
        report.rows.push(pc.row(workload, "x11rb"));
        for (t, c) in Transport::ALL.iter().zip(&oc) {
            report.rows.push(c.row(workload, t.name()));
        }
        if workload == "maze" {
            report.headline.push(
                Headline::new(
                    "display_maze_shm_vs_socket",
                    ms(&oc[2]),
                    ms(&oc[0]),
                    "ictus display over a stream socket",
                    "ms",
                    Better::Lower,
                )
                .with_target(0.6),
            );
            report.headline.push(Headline::new(
                "display_maze_shm_vs_xlib",
                ms(&oc[2]),
                ms(&pc),
                "x11rb straight to Xvfb",
                "ms",
                Better::Lower,
            ));
            report.paper_figures.push(
                PaperFigure::new(
                    "maze draw-solve, sockets → ports → shared memory",
                    "3.97 s → 1.88 s → 1.10 s",
                    Some(1100.0),
                    "ms",
                    Better::Lower,
                )
                .ours(
                    Some(ms(&oc[2])),
                    format!("socket {:.2} ms, port {:.2} ms, shm {:.2} ms", ms(&oc[0]), ms(&oc[1]), ms(&oc[2])),
                ),
            );
        } else {
            report.headline.push(Headline::new(
                "display_terminal_shm_vs_socket",
                ms(&oc[2]),
                ms(&oc[0]),
                "ictus display over a stream socket",
                "ms",
                Better::Lower,
            ));
            report.paper_figures.push(
                PaperFigure::new(
                    "xterm, 15,000 lines, sockets → ports → shared memory",
                    "2:15 → 1:17 → 1:05",
                    Some(65_000.0),
                    "ms",
                    Better::Lower,
                )
                .ours(
                    Some(ms(&oc[2]) * 15_000.0 / s.lines as f64),
                    format!(
                        "{} lines: socket {:.1} ms, port {:.1} ms, shm {:.1} ms",
                        s.lines,
                        ms(&oc[0]),
                        ms(&oc[1]),
                        ms(&oc[2])
                    ),
                ),
            );
        }
        peer.close()?;
        for o in ours.iter_mut() {
            o.close()?;
        }
    }

    // ---- frames (000 §10)
    let sizes: [(u16, u16); 3] = [(160, 120), (640, 480), (1920, 1080)];
    for (si, &(fw, fh)) in sizes.iter().enumerate() {
        let n = s.frames[si];
        peer.window(fw, fh)?;
        let mut put = Case::new(format!("frame {fw}x{fh}: x11rb PutImage"));
        let mut xshm = Case::new(format!("frame {fw}x{fh}: x11rb ShmPutImage"));
        let mut oc: Vec<Case> =
            Transport::ALL.iter().map(|t| Case::new(format!("frame {fw}x{fh}: ictus {}", t.name()))).collect();
        let mut wins = Vec::new();
        for o in ours.iter_mut() {
            wins.push(o.d.create_window(None, Rect::new(o.at.0, o.at.1, fw, fh), 0).map_err(|e| io("window", e))?);
            o.d.sync_shown().map_err(|e| io("sync", e))?;
        }
        // The peer's image and segment are made once and reused, as a program keeps its
        // XShmImage (a new segment per round charged the peer its page faults: over
        // a quick run's 6 frames a round, ~0.5 ms a 1080p frame; doc/display.md).
        let mut pfs = [PeerFrames::new(&peer, fw, fh, false)?, PeerFrames::new(&peer, fw, fh, true)?];
        // Each round: the other cases in rotating order, then ShmPutImage and ours over
        // shared memory next to each other, their order alternating (the headline's pair).
        let pids = [std::process::id(), server.child.id(), xvfb.pid()];
        // Round 0 is untimed, for every case alike: first touches of the peer's segment
        // and of our pool's buffers (8 MB of page faults each at 1080p), which a full
        // run's 540 frames amortize and a quick run's 60 would not.
        let mut warm = Case::default();
        for round in 0..=s.frame_rounds[si] {
            let mut order: Vec<usize> = ictus_bench::rounds::rotation(round, 3).map(|k| [0, 2, 3][k]).collect();
            order.extend(if round % 2 == 0 { [1, 4] } else { [4, 1] });
            for case in order {
                // This process last before the block and first after it: reading the
                // others' counters is not charged to the block.
                let before = {
                    let (x, server) = (Cost::of(pids[2]), Cost::of(pids[1]));
                    [Cost::of(pids[0]), server, x]
                };
                let t0 = Instant::now();
                let c = match case {
                    0 | 1 => {
                        let (pf, c) = if case == 0 { (&mut pfs[0], &mut put) } else { (&mut pfs[1], &mut xshm) };
                        let c = if round == 0 { &mut warm } else { c };
                        for i in 0..n {
                            let t = Instant::now();
                            pf.fill(fw, fh, (round * n + i) as u32);
                            let written = Instant::now();
                            pf.put(fw, fh)?;
                            peer.c.get_input_focus().map_err(|e| io("sync", e))?.reply().map_err(|e| io("sync", e))?;
                            c.stamp(t, written);
                        }
                        c
                    }
                    _ => {
                        let (o, c, w) = (&mut ours[case - 2], &mut oc[case - 2], wins[case - 2]);
                        let c = if round == 0 { &mut warm } else { c };
                        for i in 0..n {
                            let t = Instant::now();
                            let (written, written_ns, info) =
                                our_frame(&mut o.d, w, fw, fh, (round * n + i) as u32, 0, true)?;
                            let done_ns = monotonic_ns();
                            c.stamp(t, written);
                            c.server_ns += info.server_ns as f64;
                            c.hops(written_ns, info, done_ns);
                        }
                        let _ = o.d.pending_events().map_err(|e| io("events", e))?.count();
                        c
                    }
                };
                c.per_iter.push(t0.elapsed().as_nanos() as f64 / n as f64);
                c.iters += n as u64;
                for (k, (a, b)) in before.iter().zip(pids.map(Cost::of)).enumerate() {
                    c.cost[k].add_since(*a, b);
                }
            }
        }
        drop(pfs);
        let mb = |c: &Case| (fw as f64 * fh as f64 * 4.0) / (c.median_per_iter() / 1e9) / 1e6;
        for (c, t) in [(&mut put, "x11rb PutImage"), (&mut xshm, "x11rb ShmPutImage")] {
            c.extra.insert("mb_s".into(), json!(mb(c)));
            report.rows.push(c.row(&format!("frame {fw}x{fh}"), t));
        }
        for (t, c) in Transport::ALL.iter().zip(oc.iter_mut()) {
            c.extra.insert("mb_s".into(), json!(mb(c)));
            // The same rounds paired: this transport's mean over ShmPutImage's, per round
            // (a cross-check of the ratio of medians that the headline reports).
            let mut r: Vec<f64> = c.per_iter.iter().zip(&xshm.per_iter).map(|(a, b)| a / b).collect();
            r.sort_by(f64::total_cmp);
            let q = |p: f64| r.get(((r.len() - 1) as f64 * p).round() as usize).copied().unwrap_or(f64::NAN);
            if !r.is_empty() {
                c.extra.insert("vs_xshm_per_round".into(), json!({"p25": q(0.25), "p50": q(0.5), "p75": q(0.75)}));
            }
            report.rows.push(c.row(&format!("frame {fw}x{fh}"), t.name()));
        }
        if (fw, fh) == (1920, 1080) {
            report.headline.push(
                Headline::new(
                    "display_frame_1080p_shm_vs_xshm",
                    ms(&oc[2]),
                    ms(&xshm),
                    "x11rb ShmPutImage straight to Xvfb",
                    "ms",
                    Better::Lower,
                )
                .with_target(1.2),
            );
            // CPU time per frame of every process on the path (load stretches waits, not
            // this): ours = clients, our server, Xvfb; the peer = clients, Xvfb (our idle
            // server's ticks meanwhile are not the peer's).
            let cpu = |c: &Case, server: bool| {
                let ns = c.cost[0].cpu_ns + c.cost[2].cpu_ns + if server { c.cost[1].cpu_ns } else { 0 };
                ns as f64 / c.iters.max(1) as f64 / 1e6
            };
            report.headline.push(Headline::new(
                "display_frame_1080p_cpu_shm_vs_xshm",
                cpu(&oc[2], true),
                cpu(&xshm, false),
                "x11rb ShmPutImage straight to Xvfb (CPU time of client and Xvfb)",
                "ms CPU",
                Better::Lower,
            ));
            report.headline.push(Headline::new(
                "display_frame_1080p_socket_vs_putimage",
                ms(&oc[0]),
                ms(&put),
                "x11rb PutImage straight to Xvfb",
                "ms",
                Better::Lower,
            ));
        }
        if (fw, fh) == (160, 120) {
            report.paper_figures.push(
                PaperFigure::new(
                    "frame 19.2 KB over a socket (XPutImage)",
                    "76–85 ms",
                    Some(80.0),
                    "ms",
                    Better::Lower,
                )
                .ours(Some(ms(&oc[0])), format!("160x120x32 bit (76.8 KB): {:.3} ms", ms(&oc[0]))),
            );
            report.paper_figures.push(
                PaperFigure::new("frame 19.2 KB through shared memory", "10–23 ms", Some(16.5), "ms", Better::Lower)
                    .ours(Some(ms(&oc[2])), format!("160x120x32 bit: {:.3} ms", ms(&oc[2]))),
            );
        }
        peer.close()?;
        for (o, w) in ours.iter_mut().zip(&wins) {
            o.d.destroy_window(*w).map_err(|e| io("destroy", e))?;
            o.d.sync().map_err(|e| io("sync", e))?;
        }
    }

    // ---- paced 1080p at 30 fps: lateness of each frame on the screen.
    let (fw, fh) = (1920u16, 1080u16);
    let period = 1_000_000_000u64 / 30;
    peer.window(fw, fh)?;
    let shm = &mut ours[2];
    let win = shm.d.create_window(None, Rect::new(shm.at.0, shm.at.1, fw, fh), 0).map_err(|e| io("window", e))?;
    shm.d.sync_shown().map_err(|e| io("sync", e))?;
    let mut ours_late = LatencyRecorder::new();
    let mut ours_early = LatencyRecorder::new();
    let mut peer_late = LatencyRecorder::new();
    let mut dropped = 0u64;
    let per_round = (s.paced / s.rounds).max(1);
    let mut paced_peer = PeerFrames::new(&peer, fw, fh, true)?;
    for round in 0..s.rounds {
        // Ours: each frame written a little ahead and presented at its time.
        let t0 = monotonic_ns() + 50_000_000;
        let mut pending = 0;
        for i in 0..per_round {
            let due = t0 + i as u64 * period;
            sleep_until(due.saturating_sub(period / 2));
            our_frame(&mut shm.d, win, fw, fh, (round * per_round + i) as u32, due, false)?;
            pending += 1;
            collect_frames(&mut shm.d, &mut ours_late, &mut ours_early, &mut dropped, &mut pending, None)?;
        }
        let until = Instant::now() + Duration::from_secs(10);
        collect_frames(&mut shm.d, &mut ours_late, &mut ours_early, &mut dropped, &mut pending, Some(until))?;
        if pending > 0 {
            return Err(io("paced frames", format!("{pending} frame(s) never reported within 10 s")));
        }
        // The peer: sleep until the frame is due, then write it, ShmPutImage and sync.
        let t0 = monotonic_ns() + 50_000_000;
        for i in 0..per_round {
            let due = t0 + i as u64 * period;
            sleep_until(due);
            paced_peer.fill(fw, fh, (round * per_round + i) as u32);
            paced_peer.put(fw, fh)?;
            peer.c.get_input_focus().map_err(|e| io("sync", e))?.reply().map_err(|e| io("sync", e))?;
            peer_late.record(monotonic_ns().saturating_sub(due));
        }
    }
    report.rows.push(
        ours_late
            .row("paced 1080p 30 fps: ictus shm, lateness on screen")
            .with("workload", "paced")
            .with("transport", "shm")
            .with("dropped", dropped)
            .with("early_p99_ns", ours_early.quantile(0.99))
            .to_value(),
    );
    report.rows.push(
        peer_late
            .row("paced 1080p 30 fps: x11rb ShmPutImage at the due time, lateness")
            .with("workload", "paced")
            .with("transport", "x11rb")
            .to_value(),
    );
    let late_us = |r: &LatencyRecorder| r.quantile(0.99) as f64 / 1e3;
    report.headline.push(Headline::new(
        "display_paced_1080p_late_p99_us",
        late_us(&ours_late),
        late_us(&peer_late),
        "x11rb: sleep until due, ShmPutImage, sync",
        "µs",
        Better::Lower,
    ));
    drop(paced_peer);
    peer.close()?;
    let looks = ours[2].d.spin_looks().unwrap_or((0, 0));
    report.notes.push(format!(
        "our server's threads ask for SCHED_FIFO themselves and run with: {} (this process, our clients and the peer: \
         {}; Xvfb as started)",
        server.scheduling,
        ictus_rt::thread::current_policy()
    ));
    drop(ours);
    drop(server);
    drop(xvfb);
    report.notes.push(format!(
        "shared memory: both ends spin up to {} µs before blocking when the machine has a CPU to spare (runnable \
         tasks <= CPUs, read every 100 ms; never when pinned to one CPU); the shm client found room in {} of its {} \
         looks at the machine this run",
        spin.as_micros(),
        looks.1,
        looks.0
    ));
    report.notes.push(format!(
        "our server runs in its own process, presenting drawing at most {} times a second (damage merged); every round ends \
         with a sync that waits for the X server, included in ms_per_iter",
        refresh_hz
    ));
    report.notes.push(
        "client_us: building requests (frames: getting a buffer and writing the frame into it); server_us: our server \
         executing them (it reports this in each sync); transport_us: the rest of an iteration (IPC, wake-ups, and the X \
         server: for the peer's frames all of ShmPutImage/PutImage and its round trip); fill_p50_us / rest_p50_us: per \
         frame, the client's part and the rest"
            .into(),
    );
    report.notes.push(
        "frames: rounds of a few frames per case, ShmPutImage and ours over shared memory next to each other in \
         alternating order, the other cases before them in rotating order; quick and full runs have the same rounds \
         and differ in how many; ms_per_iter is the median over rounds of the mean per frame (the headline: ours over \
         the peer's); vs_xshm_per_round: the same rounds paired; cpu_us_* and switches_*: per frame, CPU time and \
         context switches of this process (client), our server's process and Xvfb (/proc/PID/task/*/schedstat and \
         status); in/server/x/back_p50_us: from our server's stamps in each sync's answer, frame written -> server \
         begins the batch -> present sent to Xvfb -> Xvfb acknowledged -> client has the answer"
            .into(),
    );
    report.notes.push(
        "the peer's terminal text uses the X server's built-in 'fixed' font (6x13) where ours draws 8x8 cells: the same \
         number of characters and requests, not the same pixels"
            .into(),
    );
    report.notes.push(
        "paced: ours presents each frame ahead of its due time by the X server's measured latency; lateness is when the X \
         server acknowledged it minus when it was due (early frames count as 0 late; early_p99_ns says how early)"
            .into(),
    );
    report.conditions = report.conditions.clone().finish();
    let svg = plot_svg(&report);
    Ok(Outcome::new(report, svg))
}

/// Each workload's time per iteration over each transport, relative to the peer's
/// (for frames, `ShmPutImage`): bars below 1 are faster than drawing straight into the
/// X server.
pub fn plot_svg(report: &Report) -> String {
    let series = ["socket", "port", "shm"];
    let mut groups: Vec<BarGroup> = Vec::new();
    let field = |row: &serde_json::Value, k: &str| row.get(k).and_then(serde_json::Value::as_f64);
    let text = |row: &serde_json::Value, k: &str| row.get(k).and_then(serde_json::Value::as_str).map(str::to_owned);
    let mut workloads: Vec<String> = Vec::new();
    for row in &report.rows {
        if let Some(w) = text(row, "workload") {
            if field(row, "ms_per_iter").is_some() && !workloads.contains(&w) {
                workloads.push(w);
            }
        }
    }
    for w in workloads {
        let rows: Vec<&serde_json::Value> =
            report.rows.iter().filter(|r| text(r, "workload").as_deref() == Some(&w)).collect();
        let peer = rows
            .iter()
            .find(|r| text(r, "transport").as_deref() == Some("x11rb ShmPutImage"))
            .or_else(|| rows.iter().find(|r| text(r, "transport").as_deref() == Some("x11rb")))
            .and_then(|r| field(r, "ms_per_iter"));
        let Some(peer) = peer.filter(|p| *p > 0.0) else { continue };
        let bars = series
            .iter()
            .map(|t| {
                let r = rows.iter().find(|r| text(r, "transport").as_deref() == Some(t))?;
                let m = field(r, "ms_per_iter")? / peer;
                Some(Bar {
                    median: m,
                    min: field(r, "ms_min").map_or(m, |v| v / peer),
                    max: field(r, "ms_max").map_or(m, |v| v / peer),
                    label: format!("{m:.2}"),
                })
            })
            .collect();
        groups.push(BarGroup { name: w, bars });
    }
    BarChart {
        title: format!("display: time per iteration, ours / x11rb{}", if report.quick { " [quick]" } else { "" }),
        y_label: "ours / x11rb straight to Xvfb".into(),
        series: series.iter().map(|t| format!("ictus {t}")).collect(),
        groups,
    }
    .render()
}

fn sleep_until(t: u64) {
    let now = monotonic_ns();
    if t > now {
        std::thread::sleep(Duration::from_nanos(t - now));
    }
}

/// Take the frame reports that have arrived, counting each down from `pending`; with
/// `until`, wait until every pending frame is reported or that time has passed.
/// Messages that are not frame reports (an expose, say) are passed over: they are not
/// progress, and not the end of the wait either.
fn collect_frames(
    d: &mut Display,
    late: &mut LatencyRecorder,
    early: &mut LatencyRecorder,
    dropped: &mut u64,
    pending: &mut usize,
    until: Option<Instant>,
) -> Result<(), BenchError> {
    loop {
        let wait = match until {
            Some(_) if *pending == 0 => return Ok(()),
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => Duration::ZERO,
        };
        match d.next_event(wait).map_err(|e| io("events", e))? {
            Some(Message::Frame { due_ns, shown_ns, dropped: was_dropped, .. }) => {
                *pending = pending.saturating_sub(1);
                if was_dropped {
                    *dropped += 1;
                } else {
                    late.record(shown_ns.saturating_sub(due_ns));
                    early.record(due_ns.saturating_sub(shown_ns));
                }
            }
            Some(Message::Error { code, op, .. }) => {
                return Err(io("paced frames", format!("the server refused a request: error {code}, opcode {op}")))
            }
            Some(_) => {}
            None if until.is_some_and(|t| Instant::now() < t) => {}
            None => return Ok(()),
        }
    }
}
