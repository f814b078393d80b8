//! The WAV sink: an audio device with its own buffer and its own clock.
//!
//! This machine has no sound hardware, so the audio device is a WAV file consumed at
//! its sample rate by a clock thread of its own, exactly as a sound card's DMA
//! consumes its buffer: every period (10 ms of samples) the thread sleeps until the
//! period's start *on the device's clock*, takes that period's samples from the ring
//! (silence where nothing was placed, counted as a device underrun) and appends them
//! to the file. The device clock can be skewed (`skew=PPM`) to stand in for a crystal
//! that is off, which is what [`ictus_tactus::drift`] exists for: the sink reports its
//! position (frame, system time of the wake-up) after each period, and a tracking loop
//! turns those late, jittery reports into an estimate of the device clock that the
//! other streams of a presentation follow.
//!
//! Tactus places each audio block at its exact frame position ([`AudioSink::place`]),
//! up to the buffer's length ahead of the device; what arrives after its frames were
//! consumed is trimmed (and counted late). The ring is the "audio device with its own
//! buffer" of the paper's Figure 2: it takes data early, with its timestamp (here its
//! frame position), and times it better than a thread could.

use std::fs::File;
use std::io::BufWriter;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_rt::sync::PiMutex;
use ictus_rt::thread::{configure_current_thread, ThreadRequest};
use ictus_rt::Time;
use ictus_tactus::drift::{Tracker, TrackerConfig};
use ictus_tactus::media::wav::WavWriter;

/// What a WAV sink is: `wav:PATH[,skew=PPM][,buffer=MS]` (`PATH` `-` discards).
#[derive(Clone, Debug, PartialEq)]
pub struct SinkSpec {
    /// Where the samples go (`None`: discarded).
    pub path: Option<String>,
    /// The device clock's error (parts per million; positive runs fast).
    pub skew_ppm: f64,
    /// The ring's length.
    pub buffer: Duration,
}

impl SinkSpec {
    /// Parse the part after `wav:`.
    pub fn parse(s: &str) -> Result<SinkSpec, String> {
        let mut parts = s.split(',');
        let path = parts.next().unwrap_or("");
        let mut spec = SinkSpec {
            path: (path != "-" && !path.is_empty()).then(|| path.to_owned()),
            skew_ppm: 0.0,
            buffer: Duration::from_millis(250),
        };
        for p in parts {
            match p.split_once('=') {
                Some(("skew", v)) => {
                    spec.skew_ppm = v.parse().ok().filter(|x: &f64| x.abs() <= 10_000.0).ok_or(format!("skew {v:?}"))?
                }
                Some(("buffer", v)) => {
                    let ms: u64 = v.parse().ok().filter(|x| (20..=5000).contains(x)).ok_or(format!("buffer {v:?}"))?;
                    spec.buffer = Duration::from_millis(ms);
                }
                _ => return Err(format!("unknown WAV sink option {p:?} (skew=PPM, buffer=MS)")),
            }
        }
        Ok(spec)
    }
}

/// Counters of a sink.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Frames consumed (played) so far.
    pub played: u64,
    /// Periods that had no sample placed in them while the sink was fed.
    pub underruns: u64,
    /// Frames placed too late (trimmed).
    pub trimmed: u64,
    /// Frames written to the file.
    pub written: u64,
}

struct Ring {
    /// Samples (16-bit, interleaved) of frames `base..base + cap`, as placed.
    buf: Vec<i16>,
    /// Which frames were placed (one flag per frame).
    placed: Vec<bool>,
    /// The next frame to be consumed.
    base: u64,
    /// The highest frame placed (exclusive).
    high: u64,
}

/// A WAV sink running its clock thread. Dropping the last handle stops the thread
/// and finishes the file.
pub struct AudioSink {
    rate: u32,
    channels: u16,
    cap: u64,
    period: u64,
    /// The device clock: frame `f` plays at `t0 + f / (rate·(1 + skew))`.
    t0: u64,
    skew: f64,
    ring: PiMutex<Ring>,
    tracker: PiMutex<Tracker>,
    stats: Mutex<SinkStats>,
    fed: AtomicBool,
    stop: Arc<AtomicBool>,
    played: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
    granted: Mutex<String>,
}

impl std::fmt::Debug for AudioSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AudioSink({} Hz × {}, skew {} ppm)", self.rate, self.channels, self.skew * 1e6)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AudioSink {
    /// Open a sink of `rate` Hz and `channels` channels; its clock starts at `start`
    /// (system ns) and its thread asks for `thread`.
    pub fn open(
        spec: &SinkSpec,
        rate: u32,
        channels: u16,
        start: u64,
        thread: ThreadRequest,
    ) -> std::io::Result<Arc<AudioSink>> {
        let file = match &spec.path {
            Some(p) => Some(WavWriter::new(BufWriter::new(File::create(p)?), rate, channels)?),
            None => None,
        };
        let period = u64::from(rate / 100).max(1);
        let cap = (spec.buffer.as_nanos() as u64 * u64::from(rate) / 1_000_000_000).max(4 * period);
        let cap = cap.div_ceil(period) * period;
        let n = cap as usize * usize::from(channels);
        let stop = Arc::new(AtomicBool::new(false));
        let sink = Arc::new(AudioSink {
            rate,
            channels,
            cap,
            period,
            t0: start,
            skew: spec.skew_ppm * 1e-6,
            ring: PiMutex::new(Ring { buf: vec![0; n], placed: vec![false; cap as usize], base: 0, high: 0 }),
            tracker: PiMutex::new({
                // The device starts at `start` by our command: until its first report the
                // estimate is the nominal clock from there (a presentation may take this
                // clock as its own at once).
                let mut t = Tracker::new(TrackerConfig::new(rate));
                t.observe(0, start);
                t
            }),
            stats: Mutex::new(SinkStats::default()),
            fed: AtomicBool::new(false),
            stop: stop.clone(),
            played: AtomicU64::new(0),
            thread: Mutex::new(None),
            granted: Mutex::new(String::new()),
        });
        let weak = Arc::downgrade(&sink);
        let h = std::thread::Builder::new().name("tactus-audio".into()).spawn(move || {
            let g = configure_current_thread(&thread);
            if let Some(s) = weak.upgrade() {
                *lock(&s.granted) = g.describe();
            }
            clock_thread(weak, stop, file)
        })?;
        *lock(&sink.thread) = Some(h);
        Ok(sink)
    }

    /// Frames per second.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Channels.
    pub fn channels(&self) -> u16 {
        self.channels
    }

    /// The ring's length in frames: how far ahead of the device Tactus may place.
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// What the clock thread was granted.
    pub fn granted(&self) -> String {
        lock(&self.granted).clone()
    }

    /// The true system time at which frame `frame` plays (the device's own clock: the
    /// DAC's moment, which a real card knows and a program only estimates).
    pub fn true_mono_of(&self, frame: u64) -> u64 {
        self.t0 + (frame as f64 * 1e9 / (f64::from(self.rate) * (1.0 + self.skew))) as u64
    }

    /// The tracking loop's estimate of the device clock.
    pub fn tracker(&self) -> Tracker {
        self.tracker.lock().clone()
    }

    /// Counters.
    pub fn stats(&self) -> SinkStats {
        let mut s = *lock(&self.stats);
        s.played = self.played.load(Ordering::Relaxed);
        s
    }

    /// Frames placed ahead of the device now.
    pub fn queued_frames(&self) -> u64 {
        let r = self.ring.lock();
        r.high.saturating_sub(r.base)
    }

    /// Place 16-bit interleaved `samples` at frame `frame`. Frames already consumed
    /// are trimmed, frames beyond the ring are refused. Returns the frames placed and
    /// the frames trimmed.
    pub fn place(&self, frame: u64, samples: &[u8]) -> (u64, u64) {
        let ch = usize::from(self.channels);
        let frames = (samples.len() / (2 * ch)) as u64;
        let mut r = self.ring.lock();
        let start = frame.max(r.base);
        let end = (frame + frames).min(r.base + self.cap);
        let trimmed = start - frame;
        if start >= end {
            drop(r);
            lock(&self.stats).trimmed += frames.min(trimmed);
            return (0, frames.min(trimmed));
        }
        for f in start..end {
            let slot = (f % self.cap) as usize;
            let src = ((f - frame) as usize) * ch * 2;
            for c in 0..ch {
                let i = src + c * 2;
                r.buf[slot * ch + c] = i16::from_le_bytes([samples[i], samples[i + 1]]);
            }
            r.placed[slot] = true;
        }
        r.high = r.high.max(end);
        drop(r);
        self.fed.store(true, Ordering::Relaxed);
        if trimmed > 0 {
            lock(&self.stats).trimmed += trimmed;
        }
        (end - start, trimmed)
    }

    /// Forget what was placed from frame `frame` on (a pause, seek or rate change that
    /// takes effect there).
    pub fn erase_from(&self, frame: u64) {
        let mut r = self.ring.lock();
        let from = frame.max(r.base);
        for f in from..r.high.max(from) {
            let slot = (f % self.cap) as usize;
            r.placed[slot] = false;
        }
        r.high = r.high.min(from);
    }
}

impl Drop for AudioSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // The thread holds only a weak reference; it sees the stop flag within a period.
        if let Some(h) = lock(&self.thread).take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

fn clock_thread(sink: std::sync::Weak<AudioSink>, stop: Arc<AtomicBool>, mut file: Option<WavWriter<BufWriter<File>>>) {
    let mut out: Vec<u8> = Vec::new();
    let mut k: u64 = 0;
    loop {
        let (due, period) = {
            let Some(s) = sink.upgrade() else { break };
            (s.true_mono_of(k * s.period), s.period)
        };
        if stop.load(Ordering::Acquire) {
            break;
        }
        // Sleep in slices so that a stop is seen within 50 ms however far off the
        // next period is (it never is, but the device clock could be pathological).
        let now = ictus_rt::clock::now().as_nanos();
        if due > now + 50_000_000 {
            ictus_midi::device::sleep_until(Time::from_nanos(now + 50_000_000));
            continue;
        }
        ictus_midi::device::sleep_until(Time::from_nanos(due));
        let woke = ictus_rt::clock::now().as_nanos();
        let Some(s) = sink.upgrade() else { break };
        // Consume frames [k·P, (k+1)·P).
        let ch = usize::from(s.channels);
        out.clear();
        let mut missing = false;
        let hole;
        {
            let mut r = s.ring.lock();
            let first = k * period;
            // Frames missing while later frames were placed: the device ran dry in the
            // middle of the stream (at its end nothing is placed later, and it is not).
            hole = r.high > first + period;
            for f in first..first + period {
                let slot = (f % s.cap) as usize;
                if r.placed[slot] {
                    for c in 0..ch {
                        out.extend_from_slice(&r.buf[slot * ch + c].to_le_bytes());
                    }
                    r.placed[slot] = false;
                } else {
                    missing = true;
                    out.resize(out.len() + ch * 2, 0);
                }
            }
            r.base = first + period;
            r.high = r.high.max(r.base);
        }
        s.played.store((k + 1) * period, Ordering::Relaxed);
        if missing && hole && s.fed.load(Ordering::Relaxed) {
            lock(&s.stats).underruns += 1;
        }
        if let Some(w) = file.as_mut() {
            if w.write(&out).is_ok() {
                lock(&s.stats).written += period;
            }
        }
        // The position report: frame k·P was playing when this thread woke.
        s.tracker.lock().observe(k * period, woke);
        k += 1;
    }
    if let Some(w) = file.take() {
        let _ = w.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let s = SinkSpec::parse("/tmp/a.wav,skew=-200,buffer=100").unwrap();
        assert_eq!(s.path.as_deref(), Some("/tmp/a.wav"));
        assert_eq!(s.skew_ppm, -200.0);
        assert_eq!(s.buffer, Duration::from_millis(100));
        assert_eq!(SinkSpec::parse("-").unwrap().path, None);
        assert!(SinkSpec::parse("x,skew=abc").is_err());
        assert!(SinkSpec::parse("x,buffer=1").is_err());
        assert!(SinkSpec::parse("x,loud").is_err());
    }

    #[test]
    fn places_plays_and_trims() {
        let spec = SinkSpec { path: None, skew_ppm: 0.0, buffer: Duration::from_millis(100) };
        let start = ictus_rt::clock::now().as_nanos() + 20_000_000;
        let s = AudioSink::open(&spec, 8000, 1, start, ThreadRequest::default()).unwrap();
        // 50 ms of samples at frame 0.
        let block: Vec<u8> = (0..400i16).flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(s.place(0, &block), (400, 0));
        // Beyond the ring (100 ms = 800 frames): only what fits.
        assert_eq!(s.place(600, &block).0, 200);
        // Wait until the device has played past frame 1000 (within the watchdog).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while s.stats().played < 1000 {
            assert!(std::time::Instant::now() < deadline, "the device clock does not run");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A block for frames already played is trimmed whole.
        let (placed, trimmed) = s.place(0, &block);
        assert_eq!(placed, 0);
        assert_eq!(trimmed, 400);
        assert!(s.tracker().locked());
        // Frames 400..600 were never placed while later ones were: an underrun.
        assert!(s.stats().underruns >= 1);
    }
}
