//! `ictus bench tactus`: the frame timing model (000 §11) and delivery beside GStreamer.
//!
//! Everything runs against one private Xvfb, a private name server, two display
//! servers (one showing through MIT-SHM, one through plain `PutImage`: the
//! sockets-throughout path) and a Tactus server with its socket transport, all on
//! threads of this process, started and stopped here.
//!
//! 1. **Frame timing model** (000 §11, figure 7; §10, figure 6): a YUV4MPEG2 clip is
//!    read frame by frame and played through Tactus to the display, at the paper's
//!    10 fps 160×120 and at 1080p 30 fps. Per frame: the disk read (read and YUV→RGB
//!    into the buffer the frame travels in), client → Tactus (from the client's send
//!    stamp to the server taking the record), within Tactus (taken → handed to the
//!    display: its queue, the delivery thread's wake-up and the one copy into a display
//!    frame), Tactus → display (handed → the X server has it). Each frame is due as it
//!    is sent, so nothing waits for its time: the stages are the path's own costs.
//!    Ours: pool buffers over shared memory, a display frame buffer, MIT-SHM. Beside
//!    it, in alternating rounds, the same path over sockets throughout: the records
//!    over Tactus's socket, the frame over the display's socket, `PutImage` to X.
//! 2. **Delivery beside GStreamer**: the same WebM clip (VP8 video, Vorbis audio)
//!    played by us (decoded by GStreamer into the application, then through Tactus:
//!    video to the display server, audio into a WAV sink whose clock runs off by
//!    `SKEW_PPM` and leads the presentation) and by GStreamer (`decodebin` into
//!    `ximagesink` in the same Xvfb and a clocked audio sink), rounds alternating.
//!    Delivery error = presented − due per stream; A/V skew = when the picture of a
//!    moment was shown − when its sound was played; drift = the A/V skew at the end
//!    of the run less at its start. GStreamer's numbers come from its own
//!    instrumentation: a tracer on its sinks' pushes (see [`tracer`]).

pub mod tracer;

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::prelude::*;
use ictus_bench::{
    BenchError, Better, Conditions, Experiment, Headline, LatencyRecorder, Options, Outcome, PaperFigure, Report,
};
use ictus_ipc::Space;
use ictus_server::Registrar;
use ictus_tactus::media::y4m::{self, Y4mHeader, Y4mReader};
use ictus_tactus::proto::{delivered, Delivered, Report as TReport};
use ictus_tactus::{monotonic_ns, ConnectOptions, LatePolicy, StreamSpec, Tactus, Transport};
use serde_json::json;

/// The device clock's error in the delivery runs (parts per million, fast).
pub const SKEW_PPM: f64 = 200.0;

/// The experiment, as the registry declares it.
pub static TACTUS: Experiment = Experiment {
    name: "tactus",
    about: "Tactus (000 §7, §11): the frame timing model at 10 fps 160x120 and 1080p30 beside the same path over \
            sockets; delivery error, A/V skew and drift beside GStreamer playing the same clip",
    figures: &[6, 7],
    quick_s: 90.0,
    full_s: 1800.0,
    roles: &[],
    args: ictus_bench::experiment::no_args,
    run,
};

fn err(context: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::io(context.to_owned(), std::io::Error::other(e.to_string()))
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The servers of a run.
struct Rig {
    dir: TempDir,
    xvfb: ictus_display_server::xvfb::Xvfb,
    ns_socket: PathBuf,
    names: Vec<Registrar>,
    tactus: Option<crate::Running>,
    displays: Vec<ictus_display_server::Running>,
    ns: Option<ictus_name_server::Running>,
    granted: String,
}

impl Rig {
    fn start() -> Result<Rig, BenchError> {
        let dir = std::env::temp_dir().join(format!("ictus-tactus-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::io("bench directory", e))?;
        let dir = TempDir(dir);
        let xvfb = ictus_display_server::xvfb::Xvfb::start(1920, 1080).map_err(|e| err("Xvfb", e))?;
        let ns_socket = dir.0.join("ns.sock");
        let ns =
            ictus_name_server::server::spawn(Space::task(), Some(&ns_socket)).map_err(|e| err("name server", e))?;
        let mut names = Vec::new();
        let mut displays = Vec::new();
        for (name, shm) in [("display", true), ("display-plain", false)] {
            let space = Space::task();
            let mut o = ictus_display_server::Options::headless(0, 0, Some(dir.0.join(format!("{name}.sock"))));
            o.screen = ictus_display_server::Screen::X { display: Some(xvfb.display().to_owned()), shm };
            o.shm_wait.spin = Duration::ZERO;
            let d = ictus_display_server::spawn(&space, o).map_err(|e| err("display server", e))?;
            names.push(
                Registrar::start("display", Some(&ns_socket), d.space(), &[(name, d.service_port())])
                    .map_err(|e| err("registering a display", e))?,
            );
            displays.push(d);
        }
        let space = Space::task();
        let mut o = crate::Options { socket: Some(dir.0.join("tactus.sock")), ..crate::Options::default() };
        o.devices.name_server = Some(ns_socket.clone());
        let tactus = crate::spawn(&space, o).map_err(|e| err("tactus", e))?;
        names.push(
            Registrar::start("tactus", Some(&ns_socket), tactus.space(), &[("tactus", tactus.service_port())])
                .map_err(|e| err("registering tactus", e))?,
        );
        // Wait until every name answers.
        let client_space = Space::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = ictus_name_server::Client::connect_socket(&client_space, &ns_socket)
                .ok()
                .is_some_and(|c| ["display", "display-plain", "tactus"].iter().all(|n| c.lookup(n).is_ok()));
            if ok {
                break;
            }
            if Instant::now() > deadline {
                return Err(err("set-up", "the servers never registered"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let granted = ictus_rt::thread::probe(ictus_rt::thread::Policy::Fifo { priority: 70 });
        Ok(Rig {
            dir,
            xvfb,
            ns_socket,
            names,
            tactus: Some(tactus),
            displays,
            ns: Some(ns),
            granted: if granted {
                "SCHED_FIFO 70 (delivery), 50 (loop), 75 (audio clock)".into()
            } else {
                "timesharing (no real-time privilege)".into()
            },
        })
    }

    fn client(&self, transport: Transport, pool: Option<(u32, usize)>) -> Result<Tactus, BenchError> {
        let mut o =
            ConnectOptions { name_server: Some(self.ns_socket.clone()), transport, ..ConnectOptions::default() };
        o.timeout = Duration::from_secs(30);
        if let Some((slots, bytes)) = pool {
            o = o.with_pool(slots, bytes.next_multiple_of(4096) as u32);
        }
        Tactus::connect(&o).map_err(|e| err("connecting to tactus", e))
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for n in self.names.drain(..) {
            n.stop();
        }
        if let Some(t) = self.tactus.take() {
            let _ = t.stop();
        }
        self.displays.clear();
        if let Some(n) = self.ns.take() {
            let _ = n.stop();
        }
        let _ = &self.xvfb;
    }
}

/// Collect `n` delivery reports (video reports come when the screen has the frame),
/// within `limit`.
fn collect(t: &mut Tactus, n: usize, limit: Duration) -> Result<Vec<Delivered>, BenchError> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        if Instant::now() > deadline {
            return Err(err("collecting delivery reports", format!("{} of {n} after {limit:?}", got.len())));
        }
        match t.next_report(Duration::from_millis(50)).map_err(|e| err("reports", e))? {
            Some(TReport::Delivered(d)) => got.push(d),
            Some(TReport::Error(e)) => return Err(err("tactus", format!("stream {}: {}", e.id, e.text))),
            _ => {}
        }
    }
    Ok(got)
}

/// Write a Y4M clip of `frames` frames of `w × h` at `fps` (a moving gradient).
fn make_y4m(path: &Path, w: u16, h: u16, fps: u32, frames: usize) -> std::io::Result<()> {
    use std::io::Write;
    let hd =
        Y4mHeader { width: u32::from(w), height: u32::from(h), fps_num: fps, fps_den: 1, chroma: y4m::Chroma::C420 };
    let mut f = std::io::BufWriter::new(File::create(path)?);
    y4m::write_header(&mut f, &hd)?;
    let mut px = vec![0u32; usize::from(w) * usize::from(h)];
    let mut planes = Vec::new();
    for k in 0..frames {
        for (i, p) in px.iter_mut().enumerate() {
            let (x, y) = (i % usize::from(w), i / usize::from(w));
            *p = ((((x + k * 8) & 0xff) << 16) | (((y + k * 4) & 0xff) << 8) | ((k * 16) & 0xff)) as u32;
        }
        y4m::rgb_to_yuv420(usize::from(w), usize::from(h), &px, &mut planes);
        f.write_all(b"FRAME\n")?;
        f.write_all(&planes)?;
    }
    f.flush()
}

/// Per-stage times of one path, ns per frame.
#[derive(Default)]
struct Stages {
    read: LatencyRecorder,
    c2t: LatencyRecorder,
    within: LatencyRecorder,
    t2x: LatencyRecorder,
    total: LatencyRecorder,
    dropped: u64,
}

/// One round of the frame timing model: `frames` frames of the clip at `path`.
fn frame_round(rig: &Rig, path: &Path, sockets: bool, st: &mut Stages) -> Result<(), BenchError> {
    let f = File::open(path).map_err(|e| BenchError::io("the clip", e))?;
    let mut r = Y4mReader::new(BufReader::with_capacity(8 << 20, f)).map_err(|e| err("the clip", e))?;
    let h = r.header();
    let (w, hh) = (h.width as u16, h.height as u16);
    let bytes = usize::from(w) * usize::from(hh) * 4;
    let (transport, device, pool) = if sockets {
        (Transport::Socket, "display:socket@display-plain", None)
    } else {
        (Transport::Shm, "display", Some((6, bytes)))
    };
    let mut t = rig.client(transport, pool)?;
    let p = t.open_presentation().map_err(|e| err("tactus", e))?;
    let s = t
        .open_stream(p, &StreamSpec::video(w, hh).device(device).policy(LatePolicy::Show).reported())
        .map_err(|e| err("tactus", e))?;
    let period = h.frame_ns();
    let t0 = monotonic_ns() + 300_000_000;
    t.start(p, 0, Some(t0)).map_err(|e| err("tactus", e))?;
    let mut planes = vec![0u8; h.frame_len()];
    let mut reads = Vec::new();
    let mut got_reports = Vec::new();
    let mut k = 0u64;
    loop {
        // Each frame is sent at its due time (or, behind, at once): nothing waits in
        // Tactus for its time.
        let at = t0 + k * period;
        let now = monotonic_ns();
        if at > now {
            std::thread::sleep(Duration::from_nanos(at - now));
        }
        let t_read = monotonic_ns();
        let mut got = false;
        let mut read_ns = 0;
        let mut failed = None;
        let sent = t.send_with(s, bytes, (k * period) as i64, period, |buf| match r.read_frame(&mut planes) {
            Ok(true) => {
                y4m::yuv_to_rgb(&h, &planes, buf);
                got = true;
                read_ns = monotonic_ns() - t_read;
                Ok(())
            }
            Ok(false) => Err(std::io::Error::other("end")),
            Err(e) => {
                failed = Some(e.to_string());
                Err(std::io::Error::other("read"))
            }
        });
        if let Some(e) = failed {
            return Err(err("reading the clip", e));
        }
        if !got {
            break;
        }
        sent.map_err(|e| err("sending a frame", e))?;
        reads.push(read_ns);
        k += 1;
        // The next frame goes when this one is on the screen (or at its time, if
        // later): the stages are each frame's own costs, not a queue behind a path
        // slower than real time (the sockets path at 1080p is).
        got_reports.extend(collect(&mut t, 1, Duration::from_secs(120))?);
    }
    for d in got_reports {
        if d.flags & (delivered::DROPPED | delivered::DEVICE_DROPPED) != 0 || d.presented == 0 {
            st.dropped += 1;
            continue;
        }
        let read = reads.get(d.seq as usize - 1).copied().unwrap_or(0);
        let c2t = d.received.saturating_sub(d.sent);
        let within = d.handed.saturating_sub(d.received);
        let t2x = d.presented.saturating_sub(d.handed);
        st.read.record(read);
        st.c2t.record(c2t);
        st.within.record(within);
        st.t2x.record(t2x);
        st.total.record(read + c2t + within + t2x);
    }
    Ok(())
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The frame timing model at one size: rows, and (ours total p50, sockets total p50, ours T→X p50, sockets T→X p50).
#[allow(clippy::too_many_arguments)]
fn frame_model(
    rig: &Rig,
    report: &mut Report,
    w: u16,
    h: u16,
    fps: u32,
    frames: usize,
    rounds: usize,
    o: &Options,
) -> Result<(f64, f64, f64, f64), BenchError> {
    let path = rig.dir.0.join(format!("clip-{w}x{h}.y4m"));
    make_y4m(&path, w, h, fps, frames).map_err(|e| BenchError::io("writing the clip", e))?;
    let mut ours = Stages::default();
    let mut sock = Stages::default();
    for round in 0..rounds {
        o.say(format!("tactus: frame model {w}x{h}@{fps}, round {}", round + 1));
        frame_round(rig, &path, false, &mut ours)?;
        frame_round(rig, &path, true, &mut sock)?;
    }
    let _ = std::fs::remove_file(&path);
    let size = format!("{w}x{h} {fps} fps");
    for (name, st) in [("shared memory", &ours), ("sockets throughout", &sock)] {
        for (stage, rec) in [
            ("disk read", &st.read),
            ("client → Tactus", &st.c2t),
            ("within Tactus", &st.within),
            ("Tactus → display → X", &st.t2x),
            ("total", &st.total),
        ] {
            report.rows.push(
                rec.row(format!("frame model {size}, {name}: {stage}"))
                    .with("size", size.clone())
                    .with("path", name)
                    .with("stage", stage)
                    .with("dropped", st.dropped)
                    .to_value(),
            );
        }
    }
    let p50 = |r: &LatencyRecorder| r.quantile(0.5) as f64;
    Ok((p50(&ours.total), p50(&sock.total), p50(&ours.t2x), p50(&sock.t2x)))
}

/// Encode the delivery clip: VP8 video `w × h` at 30 fps and Vorbis stereo 48 kHz,
/// `secs` long, in WebM, with GStreamer.
fn make_webm(path: &Path, secs: u32, w: u16, h: u16) -> Result<(), BenchError> {
    crate::gst::init().map_err(|e| err("GStreamer", e))?;
    let desc = format!(
        "webmmux name=m ! filesink location={} \
         videotestsrc pattern=ball num-buffers={} ! video/x-raw,width={w},height={h},framerate=30/1 ! vp8enc deadline=1 ! m. \
         audiotestsrc wave=ticks num-buffers={} samplesperbuffer=1024 ! audio/x-raw,rate=48000,channels=2 ! vorbisenc ! m.",
        path.display(),
        secs * 30,
        (secs * 48_000).div_ceil(1024)
    );
    let p = gst::parse::launch(&desc).map_err(|e| err("encoding the clip", e))?;
    p.set_state(gst::State::Playing).map_err(|e| err("encoding the clip", e))?;
    let bus = p.bus().ok_or_else(|| err("encoding", "no bus"))?;
    let m =
        bus.timed_pop_filtered(gst::ClockTime::from_seconds(600), &[gst::MessageType::Eos, gst::MessageType::Error]);
    let _ = p.set_state(gst::State::Null);
    match m {
        Some(m) if matches!(m.view(), gst::MessageView::Eos(_)) && path.exists() => Ok(()),
        Some(m) => Err(err("encoding the clip", format!("{m:?}"))),
        None => Err(err("encoding the clip", "no end of stream")),
    }
}

/// What one delivery run measured.
#[derive(Default)]
struct Delivery {
    video: Vec<u64>,
    audio: Vec<u64>,
    skew: Vec<u64>,
    /// (logical or pts ns, skew ns) for drift.
    skews: Vec<(i64, i64)>,
    dropped: u64,
    frames: u64,
}

impl Delivery {
    fn drift_us(&self) -> f64 {
        let n = self.skews.len();
        if n < 20 {
            return f64::NAN;
        }
        let k = (n / 10).max(1);
        let mean = |s: &[(i64, i64)]| s.iter().map(|x| x.1 as f64).sum::<f64>() / s.len() as f64;
        (mean(&self.skews[n - k..]) - mean(&self.skews[..k])) / 1e3
    }

    /// Whether the streams stay together (issue 17.2: under 1 ms from 10 s on, held):
    /// the A/V skew's median in each 10-s window from 10 s into the clip on, the
    /// largest in magnitude (µs). Medians, so that the video's tail (a frame the X
    /// server showed late) does not hide the trend a drifting clock would make.
    fn held_us(&self) -> f64 {
        const WINDOW: i64 = 10_000_000_000;
        let Some(first) = self.skews.first().map(|s| s.0) else { return f64::NAN };
        let mut worst = f64::NAN;
        let mut w: Vec<i64> = Vec::new();
        let mut at = first + WINDOW;
        let mut flush = |w: &mut Vec<i64>| {
            if w.len() >= 10 {
                w.sort_unstable();
                let m = w[w.len() / 2] as f64 / 1e3;
                if worst.is_nan() || m.abs() > worst.abs() {
                    worst = m;
                }
            }
            w.clear();
        };
        for &(pts, skew) in &self.skews {
            if pts < first + WINDOW {
                continue;
            }
            if pts >= at + WINDOW {
                flush(&mut w);
                at += WINDOW * ((pts - at) / WINDOW);
            }
            w.push(skew);
        }
        flush(&mut w);
        worst
    }
}

/// Ours: the clip decoded by GStreamer into the application, through Tactus.
fn ours_delivery(rig: &Rig, clip: &Path, d: &mut Delivery) -> Result<(), BenchError> {
    let pipe = crate::gst::Pipeline::open(clip).map_err(|e| err("decoding", e))?;
    let (video, audio) = pipe.sources();
    let (Some(mut video), Some(mut audio)) = (video, audio) else {
        return Err(err("the clip", "needs video and audio"));
    };
    let (w, h, frame) = video.info();
    let (rate, ch) = audio.info();
    let bytes = usize::from(w) * usize::from(h) * 4;
    let mut t = rig.client(Transport::Shm, Some((16, bytes)))?;
    let p = t.open_presentation().map_err(|e| err("tactus", e))?;
    let dev = format!("wav:-,skew={SKEW_PPM}");
    let a = t.open_stream(p, &StreamSpec::audio(rate, ch, &dev).master().reported()).map_err(|e| err("tactus", e))?;
    let v = t
        .open_stream(p, &StreamSpec::video(w, h).policy(LatePolicy::DropAfter(Duration::from_millis(20))).reported())
        .map_err(|e| err("tactus", e))?;
    let ahead = 300_000_000i64;
    let mut vq: Option<i64> = video.peek().map_err(|e| err("decoding", e))?;
    let mut aq: Option<i64> = audio.peek().map_err(|e| err("decoding", e))?;
    let mut block = Vec::new();
    let mut reports: Vec<Delivered> = Vec::new();
    let mut sent = 0usize;
    let mut started = false;
    let mut anchor: Option<(u64, i64)> = None;
    let mut last_status = Instant::now();
    let mut end = 0i64;
    let stall = Instant::now();
    loop {
        let pos = anchor.map_or(0, |(at, l)| l + (monotonic_ns() as i64 - at as i64));
        // Feed what is due within `ahead`, earliest first.
        loop {
            let next = [vq, aq].into_iter().flatten().min();
            let Some(next) = next else { break };
            if next > pos + ahead {
                break;
            }
            if Some(next) == vq {
                let vs = &mut video;
                t.send_with(v, bytes, next, frame, |buf| {
                    vs.read_into(buf).map_err(|e| std::io::Error::other(e.to_string()))
                })
                .map_err(|e| err("sending a frame", e))?;
                vq = video.peek().map_err(|e| err("decoding", e))?;
                end = end.max(next + frame as i64);
            } else {
                audio.read(&mut block).map_err(|e| err("decoding", e))?;
                let frames = block.len() / (2 * usize::from(ch));
                if frames > 0 {
                    let dur = frames as u64 * 1_000_000_000 / u64::from(rate);
                    t.send(a, next, dur, &block).map_err(|e| err("sending audio", e))?;
                    end = end.max(next + dur as i64);
                }
                aq = audio.peek().map_err(|e| err("decoding", e))?;
            }
            sent += 1;
        }
        if !started {
            t.start(p, 0, None).map_err(|e| err("tactus", e))?;
            started = true;
        }
        if last_status.elapsed() > Duration::from_millis(100) {
            t.request_status().map_err(|e| err("tactus", e))?;
            last_status = Instant::now();
        }
        for r in t.drain_reports().map_err(|e| err("reports", e))? {
            match r {
                TReport::Delivered(x) => reports.push(x),
                TReport::Status(s) => {
                    if let Some(ps) = s.presentations.iter().find(|x| x.id == p.0) {
                        if ps.motion == 1 {
                            anchor = Some((s.now, ps.position));
                        }
                    }
                }
                TReport::Error(e) => return Err(err("tactus", format!("stream {}: {}", e.id, e.text))),
                TReport::Changed(c) if anchor.is_none() => anchor = Some((c.at, c.logical)),
                TReport::Changed(_) => {}
            }
        }
        if vq.is_none() && aq.is_none() && reports.len() >= sent {
            break;
        }
        if stall.elapsed() > Duration::from_secs(3 * 3600) {
            return Err(err("playing", "took too long"));
        }
        if vq.is_none() && aq.is_none() && pos > end + 5_000_000_000 {
            return Err(err("playing", format!("{} of {sent} reports", reports.len())));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(pipe);
    // Audio: presented is the device's true moment for the block's first frame; due is
    // that moment as the tracking loop estimated it: the error is the tracking error.
    let mut blocks: Vec<&Delivered> = reports.iter().filter(|x| x.stream == a.0 && x.presented > 0).collect();
    blocks.sort_by_key(|x| x.logical);
    for b in &blocks {
        d.audio.push((b.presented as i64 - b.due as i64).unsigned_abs());
    }
    let scale = 1.0 / (1.0 + SKEW_PPM * 1e-6);
    for x in reports.iter().filter(|x| x.stream == v.0) {
        d.frames += 1;
        if x.flags & (delivered::DROPPED | delivered::DEVICE_DROPPED) != 0 || x.presented == 0 {
            d.dropped += 1;
            continue;
        }
        d.video.push((x.presented as i64 - x.due as i64).unsigned_abs());
        // The sound of this moment: the block holding it, played from its first frame.
        let i = blocks.partition_point(|b| b.logical <= x.logical);
        if i == 0 {
            continue;
        }
        let b = blocks[i - 1];
        let audio_at = b.presented as f64 + (x.logical - b.logical) as f64 * scale;
        let skew = x.presented as f64 - audio_at;
        d.skew.push(skew.abs() as u64);
        d.skews.push((x.logical, skew as i64));
    }
    Ok(())
}

/// GStreamer: `playbin` into `ximagesink` in the same Xvfb and a clocked audio sink.
fn peer_delivery(rig: &Rig, clip: &Path, d: &mut Delivery) -> Result<(), BenchError> {
    crate::gst::init().map_err(|e| err("GStreamer", e))?;
    tracer::install();
    // playbin, as a player would use it, with the same kinds of sinks as ours: the
    // X server for video, a clocked sink for audio.
    let abs = std::fs::canonicalize(clip).map_err(|e| BenchError::io("the clip", e))?;
    let uri = gst::glib::filename_to_uri(&abs, None).map_err(|e| err("the clip", e))?;
    let p =
        gst::ElementFactory::make("playbin").property("uri", uri.as_str()).build().map_err(|e| err("playbin", e))?;
    let vsink = gst::ElementFactory::make("ximagesink")
        .name("vsink")
        .property("display", rig.xvfb.display())
        .property("sync", true)
        .build()
        .map_err(|e| err("ximagesink", e))?;
    let asink = gst::ElementFactory::make("fakesink")
        .name("asink")
        .property("sync", true)
        .build()
        .map_err(|e| err("fakesink", e))?;
    p.set_property("video-sink", &vsink);
    p.set_property("audio-sink", &asink);
    let pipeline = p.clone().downcast::<gst::Pipeline>().map_err(|_| err("GStreamer", "not a pipeline"))?;
    p.set_state(gst::State::Paused).map_err(|e| err("GStreamer", e))?;
    let bus = p.bus().ok_or_else(|| err("GStreamer", "no bus"))?;
    match bus
        .timed_pop_filtered(gst::ClockTime::from_seconds(30), &[gst::MessageType::AsyncDone, gst::MessageType::Error])
    {
        Some(m) if matches!(m.view(), gst::MessageView::AsyncDone(_)) => {}
        other => {
            let _ = p.set_state(gst::State::Null);
            return Err(err("GStreamer preroll", format!("{other:?}")));
        }
    }
    let clock = pipeline.pipeline_clock();
    // The base time is chosen when the pipeline goes to PLAYING; watch from then.
    p.set_state(gst::State::Playing).map_err(|e| err("GStreamer", e))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let base = loop {
        if let Some(b) = p.base_time() {
            if b.nseconds() > 0 {
                break b.nseconds();
            }
        }
        if Instant::now() > deadline {
            let _ = p.set_state(gst::State::Null);
            return Err(err("GStreamer", "no base time"));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    tracer::watch(&["vsink", "asink"], clock, base);
    let m = bus
        .timed_pop_filtered(gst::ClockTime::from_seconds(4 * 3600), &[gst::MessageType::Eos, gst::MessageType::Error]);
    let rec = tracer::take();
    let dropped = vsink.property::<gst::Structure>("stats").get::<u64>("dropped").unwrap_or(0);
    let _ = p.set_state(gst::State::Null);
    if let Some(m) = m {
        if let gst::MessageView::Error(e) = m.view() {
            return Err(err("GStreamer", e.error()));
        }
    }
    let mut audio: Vec<&tracer::Presented> = rec.iter().filter(|r| r.sink == 1).collect();
    audio.sort_by_key(|r| r.pts);
    for a in &audio {
        d.audio.push((a.done as i64 - a.due as i64).unsigned_abs());
    }
    for v in rec.iter().filter(|r| r.sink == 0) {
        d.frames += 1;
        d.video.push((v.done as i64 - v.due as i64).unsigned_abs());
        let i = audio.partition_point(|a| a.pts <= v.pts);
        if i == 0 {
            continue;
        }
        let a = audio[i - 1];
        // The sound of the frame's moment: its buffer, played from its start.
        let audio_at = a.done as i64 + (v.pts - a.pts) as i64;
        let skew = v.done as i64 - audio_at;
        d.skew.push(skew.unsigned_abs());
        d.skews.push((v.pts as i64, skew));
    }
    d.frames += dropped;
    d.dropped += dropped;
    Ok(())
}

fn run(o: &Options) -> Result<Outcome, BenchError> {
    let conditions = Conditions::capture_before();
    let mut report = Report::new("tactus", "000 §7, §10, §11 (figures 6 and 7)", o.quick, conditions);
    report.hidden_in_table.extend(["size", "path", "stage", "stream", "player", "mean_ns"].map(String::from));
    let rig = Rig::start()?;
    report.notes.push(format!("Tactus threads: {}", rig.granted));

    // 1. The frame timing model.
    let (small_frames, big_frames, rounds) = if o.quick { (30, 20, 2) } else { (300, 150, 3) };
    let (s_ours, s_sock, s_t2x_ours, s_t2x_sock) =
        frame_model(&rig, &mut report, 160, 120, 10, small_frames, rounds, o)?;
    let (b_ours, b_sock, _, _) = frame_model(&rig, &mut report, 1920, 1080, 30, big_frames, rounds, o)?;
    report.headline.push(
        Headline::new(
            "tactus_frame_path_vs_sockets",
            b_ours / 1e6,
            b_sock / 1e6,
            "the same path over sockets throughout (1080p30, median total)",
            "ms",
            Better::Lower,
        )
        .with_target(0.35),
    );
    report.headline.push(Headline::new(
        "tactus_frame_path_vs_sockets_160x120",
        s_ours / 1e6,
        s_sock / 1e6,
        "the same path over sockets throughout (160x120 10 fps, median total)",
        "ms",
        Better::Lower,
    ));
    report.paper_figures.push(
        PaperFigure::new(
            "frame timing model, 10 fps 160×120: total per frame",
            "51 ms (20 disk, 9 client→Tactus, 2 copy, 20 Tactus→X11)",
            Some(51.0),
            "ms",
            Better::Lower,
        )
        .ours(Some(ms(s_ours as u64)), format!("{:.3} ms (median)", ms(s_ours as u64))),
    );
    report.paper_figures.push(
        PaperFigure::new(
            "frame timing model over sockets throughout",
            "about 170 ms",
            Some(170.0),
            "ms",
            Better::Lower,
        )
        .ours(Some(ms(s_sock as u64)), format!("{:.3} ms (median)", ms(s_sock as u64))),
    );
    report.paper_figures.push(
        PaperFigure::new("display a 160×120 frame: shared memory", "10–23 ms", Some(16.5), "ms", Better::Lower)
            .ours(Some(ms(s_t2x_ours as u64)), format!("Tactus → display → X: {:.3} ms", ms(s_t2x_ours as u64))),
    );
    report.paper_figures.push(
        PaperFigure::new("display a 160×120 frame: sockets (XPutImage)", "76–85 ms", Some(80.5), "ms", Better::Lower)
            .ours(Some(ms(s_t2x_sock as u64)), format!("Tactus → display → X: {:.3} ms", ms(s_t2x_sock as u64))),
    );

    // 2. Delivery beside GStreamer, rounds alternating; the last round of a full run is
    //    the long one (drift).
    let secs: Vec<u32> = if o.quick { vec![8, 8] } else { vec![30, 30, 600] };
    let mut ours = Delivery::default();
    let mut peer = Delivery::default();
    let mut long = (f64::NAN, f64::NAN);
    let mut held = (f64::NAN, f64::NAN);
    for (i, &s) in secs.iter().enumerate() {
        let clip = rig.dir.0.join(format!("clip-{s}.webm"));
        if !clip.exists() {
            o.say(format!("tactus: encoding a {s} s clip"));
            make_webm(&clip, s, 320, 240)?;
        }
        o.say(format!("tactus: delivery round {} ({s} s): ours", i + 1));
        let mut a = Delivery::default();
        ours_delivery(&rig, &clip, &mut a)?;
        o.say(format!("tactus: delivery round {} ({s} s): GStreamer", i + 1));
        let mut b = Delivery::default();
        peer_delivery(&rig, &clip, &mut b)?;
        if i + 1 == secs.len() {
            long = (a.drift_us(), b.drift_us());
            held = (a.held_us(), b.held_us());
        }
        merge(&mut ours, a);
        merge(&mut peer, b);
    }
    let rec = |v: &[u64]| {
        let mut r = LatencyRecorder::new();
        r.record_all(v);
        r
    };
    let (ov, oa, os) = (rec(&ours.video), rec(&ours.audio), rec(&ours.skew));
    let (pv, pa, ps) = (rec(&peer.video), rec(&peer.audio), rec(&peer.skew));
    for (name, d, v, a, s) in [("ictus Tactus", &ours, &ov, &oa, &os), ("GStreamer", &peer, &pv, &pa, &ps)] {
        for (stream, rec) in [("video", v), ("audio", a), ("A/V skew", s)] {
            report.rows.push(
                rec.row(format!("delivery, {name}: {stream}"))
                    .with("player", name)
                    .with("stream", stream)
                    .with("frames", d.frames)
                    .with("dropped", d.dropped)
                    .to_value(),
            );
        }
    }
    let us = |r: &LatencyRecorder| r.quantile(0.99) as f64 / 1e3;
    let ours_p99 = us(&ov).max(us(&oa));
    let peer_p99 = us(&pv).max(us(&pa));
    report.headline.push(
        Headline::new(
            "tactus_delivery_p99_us",
            ours_p99,
            1000.0,
            "the issue's bound (1 ms; not a measured peer)",
            "µs",
            Better::Lower,
        )
        .with_target(1.0),
    );
    report.headline.push(
        Headline::new(
            "tactus_av_skew_p99_us",
            us(&os),
            5000.0,
            "the issue's bound (5 ms; not a measured peer)",
            "µs",
            Better::Lower,
        )
        .with_target(1.0),
    );
    report.headline.push(
        Headline::new(
            "tactus_delivery_p99_vs_gstreamer",
            ours_p99,
            peer_p99,
            "GStreamer playbin-style pipeline (ximagesink, clocked audio sink), its tracer",
            "µs",
            Better::Lower,
        )
        .with_target(0.5),
    );
    report.headline.push(Headline::new(
        "tactus_av_skew_p99_vs_gstreamer",
        us(&os),
        us(&ps),
        "GStreamer, the same clip and sinks",
        "µs",
        Better::Lower,
    ));
    report.rows.push(json!({
        "case": format!("drift over the last run ({} s): A/V skew at the end less at the start", secs.last().copied().unwrap_or(0)),
        "ours_drift_us": long.0,
        "gstreamer_drift_us": long.1,
        "ours_held_us": held.0,
        "gstreamer_held_us": held.1,
        "held": "the A/V skew's median per 10-s window from 10 s on: the largest",
        "device_skew_ppm": SKEW_PPM,
    }));
    report.notes.push(format!(
        "Our audio device's clock runs {SKEW_PPM} ppm fast and leads the presentation (the other streams follow the \
         tracking loop's estimate of it); GStreamer's pipeline runs on the system clock (its audio sink has no clock of \
         its own here), so it has no device drift to follow."
    ));
    report.notes.push(
        "Delivery error: ours is when the X server acknowledged the frame (the display server's report) and when the \
         sink's own clock played the audio block's first frame, each less its due time; GStreamer's is when its sink's \
         push returned (after XPutImage and XSync for video), less the buffer's running time plus base time, from a \
         tracer on its pads."
            .into(),
    );
    drop(rig);
    report.conditions = report.conditions.finish();
    Ok(Outcome { report, plots: Vec::new() })
}

fn merge(into: &mut Delivery, from: Delivery) {
    into.video.extend(from.video);
    into.audio.extend(from.audio);
    into.skew.extend(from.skew);
    into.dropped += from.dropped;
    into.frames += from.frames;
    into.skews = from.skews;
}
