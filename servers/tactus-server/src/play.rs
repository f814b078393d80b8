//! `ictus play FILE|DIR`: disk → application → Tactus → devices (000 §7.2).
//!
//! The application reads a clip — uncompressed YUV4MPEG2 video, WAV audio and a
//! Standard MIDI File (a directory holding any of them, or one file), or a compressed
//! container (MP4, MKV, WebM…) decoded by GStreamer — and sends each frame, audio
//! block and MIDI message to Tactus ahead of its time; Tactus presents them, video on
//! the display server, audio into a sink whose clock is the presentation's clock, MIDI
//! through the output library. Frames are written into pool buffers of the channel
//! (converted from YUV where they land), so no copy is made on the way to the server.
//!
//! In a terminal: space pauses and resumes, ← and → seek 5 s, ↓ and ↑ halve and double
//! the rate, `q` quits. A status line shows the position, the buffer levels and the
//! late and dropped counts. A file that is corrupt or cut short ends playback with an
//! error saying what and where; a decoder that produces nothing for
//! [`STALL`] is an error too, never a hang.

use std::fs::File;
use std::io::{BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_midi::smf::Score;
use ictus_tactus::media::wav::WavReader;
use ictus_tactus::media::y4m::{self, Y4mHeader, Y4mReader};
use ictus_tactus::proto::{Report, Status};
use ictus_tactus::{
    monotonic_ns, ConnectOptions, LatePolicy, PresentationId, StreamId, StreamSpec, Tactus, TactusError,
};

/// How long a source may produce nothing before playback gives up.
pub const STALL: Duration = Duration::from_secs(10);

/// Why playback failed.
#[derive(Debug, thiserror::Error)]
pub enum PlayError {
    /// Nothing playable there.
    #[error("{0}")]
    Nothing(String),
    /// A file could not be read or is not what it claims.
    #[error("{path}: {why}")]
    File {
        /// Which.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// Tactus refused or went away.
    #[error("Tactus: {0}")]
    Tactus(String),
    /// The decoder.
    #[error("decoding: {0}")]
    Decode(String),
}

impl From<TactusError> for PlayError {
    fn from(e: TactusError) -> Self {
        PlayError::Tactus(e.to_string())
    }
}

fn file_err(path: &Path, why: impl std::fmt::Display) -> PlayError {
    PlayError::File { path: path.display().to_string(), why: why.to_string() }
}

/// A video source: frames in presentation order, `0x00RRGGBB` pixels.
pub trait VideoSource {
    /// Width, height and nanoseconds per frame.
    fn info(&self) -> (u16, u16, u64);
    /// The next frame's time (ns), `None` at the end.
    fn peek(&mut self) -> Result<Option<i64>, PlayError>;
    /// Write the next frame into `buf` (`4 × w × h` bytes) and move past it.
    fn read_into(&mut self, buf: &mut [u8]) -> Result<(), PlayError>;
    /// Go to the frame at or after `t`.
    fn seek(&mut self, t: i64) -> Result<(), PlayError>;
}

/// An audio source: blocks of 16-bit interleaved samples.
pub trait AudioSource {
    /// Rate and channels.
    fn info(&self) -> (u32, u16);
    /// The next block's time (ns), `None` at the end.
    fn peek(&mut self) -> Result<Option<i64>, PlayError>;
    /// The next block (cleared and filled), and move past it.
    fn read(&mut self, out: &mut Vec<u8>) -> Result<(), PlayError>;
    /// Go to `t`.
    fn seek(&mut self, t: i64) -> Result<(), PlayError>;
}

/// A YUV4MPEG2 file.
#[derive(Debug)]
pub struct Y4mSource {
    path: PathBuf,
    r: Y4mReader<BufReader<File>>,
    h: Y4mHeader,
    next: u64,
    planes: Vec<u8>,
    have: bool,
    ended: bool,
}

impl Y4mSource {
    /// Open and check the header.
    pub fn open(path: &Path) -> Result<Y4mSource, PlayError> {
        let f = File::open(path).map_err(|e| file_err(path, e))?;
        let r = Y4mReader::new(BufReader::with_capacity(1 << 20, f)).map_err(|e| file_err(path, e))?;
        let h = r.header();
        if h.width > u32::from(u16::MAX) || h.height > u32::from(u16::MAX) {
            return Err(file_err(path, "too large"));
        }
        Ok(Y4mSource {
            path: path.to_owned(),
            planes: vec![0; h.frame_len()],
            r,
            h,
            next: 0,
            have: false,
            ended: false,
        })
    }

    /// Read the next frame's planes (the disk read of the frame timing model).
    pub fn read_planes(&mut self) -> Result<bool, PlayError> {
        if self.have {
            return Ok(true);
        }
        if self.ended {
            return Ok(false);
        }
        match self.r.read_frame(&mut self.planes) {
            Ok(true) => {
                self.have = true;
                Ok(true)
            }
            Ok(false) => {
                self.ended = true;
                Ok(false)
            }
            Err(e) => Err(file_err(&self.path, e)),
        }
    }

    /// Convert the frame read into `buf` and move past it.
    pub fn convert_into(&mut self, buf: &mut [u8]) {
        y4m::yuv_to_rgb(&self.h, &self.planes, buf);
        self.have = false;
        self.next += 1;
    }
}

impl VideoSource for Y4mSource {
    fn info(&self) -> (u16, u16, u64) {
        (self.h.width as u16, self.h.height as u16, self.h.frame_ns())
    }
    fn peek(&mut self) -> Result<Option<i64>, PlayError> {
        Ok(self.read_planes()?.then(|| (self.next * self.h.frame_ns()) as i64))
    }
    fn read_into(&mut self, buf: &mut [u8]) -> Result<(), PlayError> {
        if self.read_planes()? {
            self.convert_into(buf);
        }
        Ok(())
    }
    fn seek(&mut self, t: i64) -> Result<(), PlayError> {
        let k = (t.max(0) as u64).div_ceil(self.h.frame_ns());
        let f = File::open(&self.path).map_err(|e| file_err(&self.path, e))?;
        self.r = Y4mReader::new(BufReader::with_capacity(1 << 20, f)).map_err(|e| file_err(&self.path, e))?;
        self.next = 0;
        self.have = false;
        self.ended = false;
        while self.next < k {
            if !self.read_planes()? {
                break;
            }
            self.have = false;
            self.next += 1;
        }
        Ok(())
    }
}

/// A WAV file, read in blocks of 20 ms.
#[derive(Debug)]
pub struct WavSource {
    path: PathBuf,
    r: WavReader<BufReader<File>>,
    pos: u64,
}

impl WavSource {
    /// Open and check.
    pub fn open(path: &Path) -> Result<WavSource, PlayError> {
        let f = File::open(path).map_err(|e| file_err(path, e))?;
        let r = WavReader::new(BufReader::new(f)).map_err(|e| file_err(path, e))?;
        Ok(WavSource { path: path.to_owned(), r, pos: 0 })
    }
}

impl AudioSource for WavSource {
    fn info(&self) -> (u32, u16) {
        let f = self.r.format();
        (f.rate, f.channels)
    }
    fn peek(&mut self) -> Result<Option<i64>, PlayError> {
        let rate = u64::from(self.r.format().rate);
        Ok((self.pos < self.r.frames()).then(|| (self.pos * 1_000_000_000 / rate) as i64))
    }
    fn read(&mut self, out: &mut Vec<u8>) -> Result<(), PlayError> {
        let block = (self.r.format().rate / 50) as usize;
        let n = self.r.read_s16(block, out).map_err(|e| file_err(&self.path, e))?;
        self.pos += n as u64;
        Ok(())
    }
    fn seek(&mut self, t: i64) -> Result<(), PlayError> {
        let f = (t.max(0) as u128 * u128::from(self.r.format().rate) / 1_000_000_000) as u64;
        self.r.seek_frame(f).map_err(|e| file_err(&self.path, e))?;
        self.pos = f.min(self.r.frames());
        Ok(())
    }
}

/// MIDI events of a Standard MIDI File.
#[derive(Debug)]
pub struct MidiSource {
    events: Vec<(i64, Vec<u8>)>,
    next: usize,
}

impl MidiSource {
    /// Load.
    pub fn open(path: &Path) -> Result<MidiSource, PlayError> {
        let score = Score::load(path).map_err(|e| file_err(path, e))?;
        let events = score.timed().into_iter().map(|(t, m)| (t.as_nanos() as i64, m.bytes().to_vec())).collect();
        Ok(MidiSource { events, next: 0 })
    }

    fn peek(&self) -> Option<i64> {
        self.events.get(self.next).map(|e| e.0)
    }

    fn seek(&mut self, t: i64) {
        self.next = self.events.partition_point(|e| e.0 < t);
    }

    fn duration(&self) -> i64 {
        self.events.last().map_or(0, |e| e.0)
    }
}

/// What to play and where.
#[derive(Clone, Debug)]
pub struct PlayOptions {
    /// A file or a directory.
    pub path: PathBuf,
    /// The name server.
    pub name_server: Option<PathBuf>,
    /// Video device.
    pub video: String,
    /// Audio device (its clock leads the presentation).
    pub audio: String,
    /// MIDI device.
    pub midi: String,
    /// How far ahead the application keeps Tactus fed.
    pub ahead: Duration,
    /// Play at most this much of the clip (from `start`).
    pub seconds: Option<Duration>,
    /// Where in the clip to start.
    pub start: Duration,
    /// How many times faster than written (1/16 to 16, as the time map takes).
    pub rate: f64,
    /// Keys and a status line when standard input is a terminal.
    pub interactive: bool,
    /// Print nothing but errors.
    pub quiet: bool,
}

impl PlayOptions {
    /// Defaults for `path`.
    pub fn new(path: PathBuf) -> PlayOptions {
        PlayOptions {
            path,
            name_server: None,
            video: "display".into(),
            audio: "wav:-".into(),
            midi: "cable:ictus-play".into(),
            ahead: Duration::from_millis(500),
            seconds: None,
            start: Duration::ZERO,
            rate: 1.0,
            interactive: true,
            quiet: false,
        }
    }
}

/// What a playback did.
#[derive(Clone, Debug, Default)]
pub struct PlayReport {
    /// The last status report.
    pub status: Status,
    /// Items sent per kind: video, audio, MIDI.
    pub sent: [u64; 3],
    /// How long the clip is (ns).
    pub duration: i64,
}

struct Media {
    video: Option<Box<dyn VideoSource>>,
    audio: Option<Box<dyn AudioSource>>,
    midi: Option<MidiSource>,
    gst: Option<crate::gst::Pipeline>,
    duration: i64,
}

fn find(dir: &Path, exts: &[&str]) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().and_then(|e| e.to_str()).is_some_and(|e| exts.contains(&e.to_ascii_lowercase().as_str()))
        })
        .collect();
    v.sort();
    v.into_iter().next()
}

fn open_media(path: &Path) -> Result<Media, PlayError> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let (y4m, wav, mid) = if path.is_dir() {
        (find(path, &["y4m"]), find(path, &["wav"]), find(path, &["mid", "midi", "smf"]))
    } else {
        match ext.as_deref() {
            Some("y4m") => (Some(path.to_owned()), None, None),
            Some("wav") => (None, Some(path.to_owned()), None),
            Some("mid" | "midi" | "smf") => (None, None, Some(path.to_owned())),
            _ => {
                if !path.exists() {
                    return Err(file_err(path, "no such file"));
                }
                let p = crate::gst::Pipeline::open(path)?;
                let (video, audio) = p.sources();
                let duration = p.duration();
                return Ok(Media { video, audio, midi: None, gst: Some(p), duration });
            }
        }
    };
    if y4m.is_none() && wav.is_none() && mid.is_none() {
        return Err(PlayError::Nothing(format!("{}: no .y4m, .wav or .mid file to play", path.display())));
    }
    let video: Option<Box<dyn VideoSource>> = match &y4m {
        Some(p) => Some(Box::new(Y4mSource::open(p)?)),
        None => None,
    };
    let audio: Option<Box<dyn AudioSource>> = match &wav {
        Some(p) => Some(Box::new(WavSource::open(p)?)),
        None => None,
    };
    let midi = match &mid {
        Some(p) => Some(MidiSource::open(p)?),
        None => None,
    };
    let mut duration = midi.as_ref().map_or(0, MidiSource::duration);
    if let Some(p) = &wav {
        let r =
            WavReader::new(BufReader::new(File::open(p).map_err(|e| file_err(p, e))?)).map_err(|e| file_err(p, e))?;
        duration = duration.max((r.frames() * 1_000_000_000 / u64::from(r.format().rate)) as i64);
    }
    if let Some(p) = &y4m {
        // Count frames from the file size (every frame header is FRAME and a newline
        // unless it has parameters; the estimate only sets when playback ends).
        let s = Y4mSource::open(p)?;
        let len = std::fs::metadata(p).map_err(|e| file_err(p, e))?.len();
        let frames = len / (s.h.frame_len() as u64 + 6);
        duration = duration.max((frames * s.h.frame_ns()) as i64);
    }
    Ok(Media { video, audio, midi, gst: None, duration })
}

/// Keys from the terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// Space.
    Pause,
    /// → / ←.
    Seek(i64),
    /// ↑ / ↓.
    Rate(bool),
    /// q, Ctrl-C.
    Quit,
}

struct Keys {
    rx: mpsc::Receiver<Key>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
    restore: Option<(OwnedFd, rustix::termios::Termios)>,
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        if let Some((fd, t)) = self.restore.take() {
            let _ = rustix::termios::tcsetattr(&fd, rustix::termios::OptionalActions::Now, &t);
        }
    }
}

/// Parse keys from raw terminal bytes.
pub fn parse_keys(bytes: &[u8]) -> Vec<Key> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b' ' | b'p' => out.push(Key::Pause),
            b'q' | b'Q' | 0x03 | 0x04 => out.push(Key::Quit),
            0x1B if bytes.get(i + 1) == Some(&b'[') && i + 2 < bytes.len() => {
                match bytes[i + 2] {
                    b'C' => out.push(Key::Seek(5_000_000_000)),
                    b'D' => out.push(Key::Seek(-5_000_000_000)),
                    b'A' => out.push(Key::Rate(true)),
                    b'B' => out.push(Key::Rate(false)),
                    _ => {}
                }
                i += 2;
            }
            0x1B => out.push(Key::Quit),
            b'+' => out.push(Key::Rate(true)),
            b'-' => out.push(Key::Rate(false)),
            _ => {}
        }
        i += 1;
    }
    out
}

fn terminal_keys() -> Option<Keys> {
    use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
    let fd = std::io::stdin().as_fd().try_clone_to_owned().ok()?;
    let saved = tcgetattr(&fd).ok()?;
    let mut raw = saved.clone();
    raw.local_modes &= !(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG);
    tcsetattr(&fd, OptionalActions::Now, &raw).ok()?;
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let reader = fd.try_clone().ok()?;
    let handle = std::thread::Builder::new()
        .name("play-keys".into())
        .spawn(move || {
            let mut buf = [0u8; 64];
            while !stopped.load(Ordering::Relaxed) {
                match ictus_midi::device::wait_fd(
                    reader.as_fd(),
                    rustix::event::PollFlags::IN,
                    Some(Duration::from_millis(100)),
                ) {
                    Ok(false) => continue,
                    Ok(true) => {}
                    Err(_) => return,
                }
                let n = match rustix::io::read(&reader, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for k in parse_keys(&buf[..n]) {
                    if tx.send(k).is_err() {
                        return;
                    }
                }
            }
        })
        .ok();
    Some(Keys { rx, stop, handle, restore: Some((fd, saved)) })
}

struct Streams {
    video: Option<(StreamId, usize)>,
    audio: Option<StreamId>,
    midi: Option<StreamId>,
}

/// Play.
pub fn play(o: &PlayOptions) -> Result<PlayReport, PlayError> {
    let mut m = open_media(&o.path)?;
    let (w, h) = m.video.as_ref().map_or((0, 0), |v| (v.info().0, v.info().1));
    let frame_bytes = usize::from(w) * usize::from(h) * 4;
    let mut copts = ConnectOptions { name_server: o.name_server.clone(), ..ConnectOptions::default() };
    if frame_bytes > 0 {
        copts = copts.with_pool(16, frame_bytes.next_multiple_of(4096) as u32);
    }
    let mut t = Tactus::connect(&copts).map_err(|e| PlayError::Tactus(e.to_string()))?;
    let p = t.open_presentation()?;
    let mut st = Streams { video: None, audio: None, midi: None };
    if let Some(a) = &m.audio {
        let (rate, ch) = a.info();
        st.audio = Some(t.open_stream(p, &StreamSpec::audio(rate, ch, &o.audio).master())?);
    }
    if m.video.is_some() {
        let spec = StreamSpec::video(w, h).device(&o.video).policy(LatePolicy::DropAfter(Duration::from_millis(20)));
        st.video = Some((t.open_stream(p, &spec)?, frame_bytes));
    }
    if m.midi.is_some() {
        st.midi = Some(t.open_stream(p, &StreamSpec::midi(&o.midi))?);
    }
    let start = i64::try_from(o.start.as_nanos()).unwrap_or(i64::MAX);
    if start >= m.duration {
        return Err(PlayError::Nothing(format!(
            "{}: starts at {:.3} s, but the clip is {:.3} s long",
            o.path.display(),
            start as f64 / 1e9,
            m.duration as f64 / 1e9
        )));
    }
    let end = o.seconds.map_or(m.duration, |s| {
        start.saturating_add(i64::try_from(s.as_nanos()).unwrap_or(i64::MAX)).min(m.duration.max(1))
    });
    let keys = if o.interactive && !o.quiet { terminal_keys() } else { None };
    let mut report = PlayReport { duration: m.duration, ..PlayReport::default() };
    let mut rate = o.rate;
    if rate != 1.0 {
        // On the stopped map: the start takes it.
        t.set_rate(p, rate)?;
    }
    if start > 0 {
        seek_sources(&mut m, start)?;
    }
    // Feed the first stretch, then start.
    let ahead0 = (o.ahead.as_nanos() as f64 * rate.max(1.0)) as i64;
    feed(&mut t, &mut m, &st, start, start + ahead0, end, &mut report)?;
    t.start(p, start, None)?;
    let mut pos_anchor: Option<(u64, i64, f64, u8)> = None;
    // Where the presentation stands until a status report says otherwise.
    let mut pos_known = start;
    let mut last_line = Instant::now();
    let mut last_progress = Instant::now();
    let mut last_pos = i64::MIN;
    let mut next_status = Instant::now();
    loop {
        if Instant::now() >= next_status {
            t.request_status()?;
            next_status = Instant::now() + Duration::from_millis(100);
        }
        while let Some(r) = t.next_report(Duration::ZERO)? {
            match r {
                Report::Status(s) => {
                    if let Some(ps) = s.presentations.iter().find(|x| x.id == p.0) {
                        pos_anchor = Some((s.now, ps.position, ps.rate, ps.motion));
                    }
                    report.status = s;
                }
                Report::Error(e) => return Err(PlayError::Tactus(format!("stream {}: {}", e.id, e.text))),
                _ => {}
            }
        }
        let pos = match pos_anchor {
            Some((at, l, r, 1)) => l + ((monotonic_ns() as i64 - at as i64) as f64 * r) as i64,
            Some((_, l, _, _)) => l,
            None => pos_known,
        };
        if pos != last_pos {
            last_pos = pos;
            last_progress = Instant::now();
        }
        if pos >= end {
            break;
        }
        // The presentation does not move and is not paused: give up rather than hang.
        let paused = matches!(pos_anchor, Some((_, _, _, 2)));
        if !paused && last_progress.elapsed() > STALL {
            return Err(PlayError::Tactus(format!("the presentation has not moved for {STALL:?}")));
        }
        let ahead = (o.ahead.as_nanos() as f64 * rate.max(1.0)) as i64;
        feed(&mut t, &mut m, &st, pos, pos + ahead, end, &mut report)?;
        if let Some(k) = &keys {
            while let Ok(key) = k.rx.try_recv() {
                match key {
                    Key::Quit => {
                        drop(keys);
                        eprintln!();
                        return Ok(report);
                    }
                    Key::Pause => {
                        if paused {
                            t.resume(p)?;
                        } else {
                            t.pause(p)?;
                        }
                    }
                    Key::Rate(up) => {
                        rate = if up { (rate * 2.0).min(4.0) } else { (rate / 2.0).max(0.25) };
                        t.set_rate(p, rate)?;
                    }
                    Key::Seek(d) => {
                        let to = (pos + d).clamp(0, end.max(1) - 1);
                        seek(&mut t, p, &mut m, to)?;
                        pos_anchor = None;
                        pos_known = to;
                        feed(&mut t, &mut m, &st, to, to + o.ahead.as_nanos() as i64, end, &mut report)?;
                    }
                }
            }
        }
        if !o.quiet && last_line.elapsed() >= Duration::from_millis(200) {
            last_line = Instant::now();
            status_line(pos, end, rate, &report.status, &st);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for s in [st.video.map(|v| v.0), st.audio, st.midi].into_iter().flatten() {
        t.end_stream(s)?;
    }
    if let Some(s) = t.status(Duration::from_secs(5))? {
        report.status = s;
    }
    if !o.quiet {
        status_line(end, end, rate, &report.status, &st);
        eprintln!();
    }
    drop(m.gst.take());
    Ok(report)
}

fn seek(t: &mut Tactus, p: PresentationId, m: &mut Media, to: i64) -> Result<(), PlayError> {
    t.seek(p, to)?;
    seek_sources(m, to)
}

/// Move every source to logical time `to`.
fn seek_sources(m: &mut Media, to: i64) -> Result<(), PlayError> {
    if let Some(g) = &m.gst {
        g.seek(to)?;
    }
    if let Some(v) = &mut m.video {
        v.seek(to)?;
    }
    if let Some(a) = &mut m.audio {
        a.seek(to)?;
    }
    if let Some(mi) = &mut m.midi {
        mi.seek(to);
    }
    Ok(())
}

/// Send every item before `until` (and before `end`), earliest first.
fn feed(
    t: &mut Tactus,
    m: &mut Media,
    st: &Streams,
    _pos: i64,
    until: i64,
    end: i64,
    report: &mut PlayReport,
) -> Result<(), PlayError> {
    let until = until.min(end);
    let mut block = Vec::new();
    loop {
        let v = match (&mut m.video, st.video) {
            (Some(v), Some(_)) => v.peek()?,
            _ => None,
        };
        let a = match (&mut m.audio, st.audio) {
            (Some(a), Some(_)) => a.peek()?,
            _ => None,
        };
        let mi = match (&m.midi, st.midi) {
            (Some(mi), Some(_)) => mi.peek(),
            _ => None,
        };
        let next = [v, a, mi].into_iter().flatten().min();
        let Some(next) = next else { return Ok(()) };
        if next >= until {
            return Ok(());
        }
        if Some(next) == v {
            let (s, len) = st.video.expect("a video stream");
            let vs = m.video.as_mut().expect("a video source");
            let dur = vs.info().2;
            let mut err = None;
            t.send_with(s, len, next, dur, |buf| {
                if let Err(e) = vs.read_into(buf) {
                    err = Some(e);
                    return Err(std::io::Error::other("read"));
                }
                Ok(())
            })
            .map_err(|e| err.take().unwrap_or(PlayError::from(e)))?;
            report.sent[0] += 1;
        } else if Some(next) == a {
            let s = st.audio.expect("an audio stream");
            let src = m.audio.as_mut().expect("an audio source");
            let (rate, ch) = src.info();
            src.read(&mut block)?;
            let frames = block.len() / (2 * usize::from(ch));
            if frames > 0 {
                t.send(s, next, frames as u64 * 1_000_000_000 / u64::from(rate), &block)?;
                report.sent[1] += 1;
            }
        } else {
            let s = st.midi.expect("a MIDI stream");
            let mi = m.midi.as_mut().expect("a MIDI source");
            let (at, bytes) = mi.events[mi.next].clone();
            mi.next += 1;
            t.send(s, at, 0, &bytes)?;
            report.sent[2] += 1;
        }
    }
}

fn status_line(pos: i64, end: i64, rate: f64, s: &Status, st: &Streams) {
    let mut line = format!("\r{:7.2} / {:.2} s  ×{rate}", pos as f64 / 1e9, end as f64 / 1e9);
    let mut part = |name: &str, id: Option<StreamId>| {
        if let Some(x) = id.and_then(|id| s.streams.iter().find(|x| x.id == id.0)) {
            line.push_str(&format!(
                " | {name} {:4} ms q{:<3} late {} drop {} under {}",
                x.level_ns / 1_000_000,
                x.items,
                x.late,
                x.dropped,
                x.underruns + x.device_underruns
            ));
        }
    };
    part("video", st.video.map(|v| v.0));
    part("audio", st.audio);
    part("midi", st.midi);
    let _ = write!(std::io::stderr(), "{line}   ");
    let _ = std::io::stderr().flush();
}

/// Make a small test clip in `dir`: `clip.y4m` (160×120, 10 fps, a moving bar),
/// `clip.wav` (8 kHz mono: a click on every frame) and `clip.mid` (the MIDI demo),
/// `seconds` long.
pub fn make_clip(dir: &Path, seconds: u32, w: u16, h: u16, fps: u32) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let hd =
        Y4mHeader { width: u32::from(w), height: u32::from(h), fps_num: fps, fps_den: 1, chroma: y4m::Chroma::C420 };
    let mut f = std::io::BufWriter::new(File::create(dir.join("clip.y4m"))?);
    y4m::write_header(&mut f, &hd)?;
    let mut planes = Vec::new();
    let mut px = vec![0u32; usize::from(w) * usize::from(h)];
    for k in 0..seconds * fps {
        for (i, p) in px.iter_mut().enumerate() {
            let x = i % usize::from(w);
            *p = if (x + k as usize * 4) % usize::from(w) < 8 { 0xffffff } else { 0x203040 };
        }
        y4m::rgb_to_yuv420(usize::from(w), usize::from(h), &px, &mut planes);
        f.write_all(b"FRAME\n")?;
        f.write_all(&planes)?;
    }
    f.flush()?;
    let rate = 8000u32;
    let mut wav = ictus_tactus::media::wav::WavWriter::new(
        std::io::BufWriter::new(File::create(dir.join("clip.wav"))?),
        rate,
        1,
    )?;
    let per_frame = rate / fps;
    let mut s = Vec::new();
    for _ in 0..seconds * fps {
        s.clear();
        for i in 0..per_frame {
            let v: i16 = if i < 40 { 12_000 } else { 0 };
            s.extend_from_slice(&v.to_le_bytes());
        }
        wav.write(&s)?;
    }
    let mut inner = wav.finish()?;
    inner.flush()?;
    ictus_midi::smf::write_demo(&dir.join("clip.mid")).map_err(std::io::Error::other)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse() {
        assert_eq!(parse_keys(b" q"), vec![Key::Pause, Key::Quit]);
        assert_eq!(
            parse_keys(b"\x1b[C\x1b[D\x1b[A\x1b[B"),
            vec![Key::Seek(5_000_000_000), Key::Seek(-5_000_000_000), Key::Rate(true), Key::Rate(false)]
        );
        assert_eq!(parse_keys(b"\x1b"), vec![Key::Quit]);
        assert_eq!(parse_keys(b"xyz"), vec![]);
    }

    #[test]
    fn native_sources_read_a_clip_and_seek() {
        let dir = std::env::temp_dir().join(format!("ictus-play-unit-{}", std::process::id()));
        make_clip(&dir, 2, 32, 16, 10).unwrap();
        let mut v = Y4mSource::open(&dir.join("clip.y4m")).unwrap();
        assert_eq!(v.info(), (32, 16, 100_000_000));
        let mut buf = vec![0u8; 32 * 16 * 4];
        let mut n = 0;
        while v.peek().unwrap().is_some() {
            v.read_into(&mut buf).unwrap();
            n += 1;
        }
        assert_eq!(n, 20);
        v.seek(1_050_000_000).unwrap();
        assert_eq!(v.peek().unwrap(), Some(1_100_000_000));
        let mut a = WavSource::open(&dir.join("clip.wav")).unwrap();
        assert_eq!(a.info(), (8000, 1));
        a.seek(500_000_000).unwrap();
        assert_eq!(a.peek().unwrap(), Some(500_000_000));
        let mut blk = Vec::new();
        a.read(&mut blk).unwrap();
        assert_eq!(blk.len(), 160 * 2);
        let m = open_media(&dir).unwrap();
        assert!(m.video.is_some() && m.audio.is_some() && m.midi.is_some());
        assert_eq!(m.duration.max(2_000_000_000), m.duration);
        // A truncated video file: the error names the frame.
        let y = std::fs::read(dir.join("clip.y4m")).unwrap();
        std::fs::write(dir.join("cut.y4m"), &y[..y.len() - 100]).unwrap();
        let mut v = Y4mSource::open(&dir.join("cut.y4m")).unwrap();
        let err = loop {
            match v.peek() {
                Ok(Some(_)) => v.read_into(&mut buf).unwrap(),
                Ok(None) => panic!("a truncated file read to its end"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("frame 19"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
