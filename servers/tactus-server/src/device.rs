//! Devices: where a stream's items go, and how early each takes them.
//!
//! | spec | kind | takes items | presented |
//! | --- | --- | --- | --- |
//! | `display[:shm\|socket\|port][@NAME]` | video | just ahead of its time ([`Options::video_lead`], 2 ms), with its due time: the display server shows it then | the screen's own report (the X server acknowledged) |
//! | `wav:PATH[,skew=PPM][,buffer=MS]` | audio | [`Options::audio_lead`] early, placed at its exact frame | the device clock's moment for that frame |
//! | `cable:NAME`, `/dev/snd/midiC…`, `serial:…` | MIDI | [`Options::midi_lead`] early, with its time: the output library's timer thread sends it | its due time (the library's timing) |
//! | `null` | any | at its time | when handed over |
//!
//! Opening a device may take time (a display connection is a call to the display
//! server, a MIDI output starts threads), so the loop thread opens devices before it
//! takes the state's lock; the delivery thread only uses them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ictus_display::{ConnectOptions as DisplayOptions, Display, Rect, Transport as DisplayTransport, Window};
use ictus_midi::output::{Output, OutputOptions};
use ictus_rt::thread::ThreadRequest;
use ictus_shm::Geometry;
use ictus_tactus::proto::{Delivered, StreamKind};

use crate::audio::{AudioSink, SinkSpec};
use crate::core::Key;

/// How devices are opened.
#[derive(Clone, Debug)]
pub struct Options {
    /// The name server to find the display server with (default: its default socket).
    pub name_server: Option<PathBuf>,
    /// The display server's name.
    pub display_service: String,
    /// The display transport (`display:socket` in a spec picks the socket transport).
    pub display_transport: DisplayTransport,
    /// How early video frames go to the display server.
    pub video_lead: Duration,
    /// How early audio blocks are placed in a sink.
    pub audio_lead: Duration,
    /// How early MIDI messages go to the output library.
    pub midi_lead: Duration,
    /// What a WAV sink's clock thread asks of the scheduler.
    pub audio_thread: ThreadRequest,
    /// The MIDI output library's threads.
    pub midi: OutputOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            name_server: None,
            display_service: ictus_display::SERVICE_NAME.to_owned(),
            display_transport: DisplayTransport::Shm,
            // Just ahead of its time: the display server itself sends a frame to the X
            // server ahead by its measured latency (a running mean, which a slow round
            // trip inflates); given the frame 25 ms early it showed many frames several
            // ms early under load. 2 ms covers the hop to the display.
            video_lead: Duration::from_millis(2),
            audio_lead: Duration::from_millis(40),
            midi_lead: Duration::from_millis(20),
            audio_thread: crate::rt(75),
            midi: OutputOptions::default(),
        }
    }
}

/// A video stream's window on the display server, and its frames awaiting reports.
pub struct VideoDev {
    /// The connection (one per stream: its pool is sized for its frames).
    pub display: Display,
    /// The window.
    pub window: Window,
    /// Width.
    pub width: u16,
    /// Height.
    pub height: u16,
    /// Frames presented, by tag, awaiting the display's report.
    pub pending: HashMap<u32, (Key, Delivered)>,
    /// The next tag.
    pub next_tag: u32,
    /// Why the display server can no longer be used (it died, or broke the
    /// connection): from then on the stream's frames are dropped, counted, without
    /// touching the connection, and the client is told once.
    pub lost: Option<String>,
    /// Whether the client has been told of `lost`.
    pub lost_told: bool,
}

impl std::fmt::Debug for VideoDev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VideoDev({}x{}, {} pending)", self.width, self.height, self.pending.len())
    }
}

/// Lock a device (its only users are the delivery thread and, at close, the loop).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A stream's device.
#[derive(Clone, Debug)]
pub enum Device {
    /// Frames to the display server.
    Video {
        /// The window and connection.
        dev: Arc<Mutex<VideoDev>>,
        /// How early frames go.
        lead: Duration,
    },
    /// Audio into a sink.
    Audio {
        /// The sink.
        sink: Arc<AudioSink>,
        /// How early blocks are placed.
        lead: Duration,
    },
    /// MIDI to the output library.
    Midi {
        /// The output.
        out: Arc<Output>,
        /// How early messages go.
        lead: Duration,
    },
    /// Nowhere, at its time.
    Null,
}

impl Device {
    /// How early items are handed to it.
    pub fn lead(&self) -> Duration {
        match self {
            Device::Video { lead, .. } | Device::Audio { lead, .. } | Device::Midi { lead, .. } => *lead,
            Device::Null => Duration::ZERO,
        }
    }

    /// A short name.
    pub fn name(&self) -> &'static str {
        match self {
            Device::Video { .. } => "display",
            Device::Audio { .. } => "wav",
            Device::Midi { .. } => "midi",
            Device::Null => "null",
        }
    }
}

/// Open the device `spec` for a stream of `kind`. `now` is the system time.
pub fn open(spec: &str, kind: StreamKind, opts: &Options, now: u64) -> Result<Device, String> {
    let (name, rest) = match spec.split_once(['@', ':']) {
        // `display@NAME` has no transport part: keep the `@` for the display's parser.
        Some(("display", _)) => ("display", spec.strip_prefix("display").unwrap_or("").trim_start_matches(':')),
        Some((n, r)) => (n, r),
        None => (spec, ""),
    };
    match (kind, name) {
        (_, "null") => Ok(Device::Null),
        (StreamKind::Video { width, height }, "display") => {
            // display[:TRANSPORT][@SERVICE]
            let (rest, service) = match rest.split_once('@') {
                Some((r, s)) => (r, s.to_owned()),
                None => (rest, opts.display_service.clone()),
            };
            let transport = match rest {
                "" | "shm" => opts.display_transport,
                "socket" => DisplayTransport::Socket,
                "port" => DisplayTransport::Port,
                other => return Err(format!("display transport {other:?} (shm, socket or port)")),
            };
            let mut o = DisplayOptions::new(transport);
            o.name_server = opts.name_server.clone();
            o.service = service;
            let frame = usize::from(width) * usize::from(height) * 4 + 64;
            let slot = frame.next_multiple_of(4096) as u32;
            o.geometry = Geometry::new(256 << 10, 256 << 10, 6, slot).map_err(|e| format!("frame buffers: {e}"))?;
            o.wait.spin = Duration::ZERO;
            let mut display = Display::connect(&o).map_err(|e| e.to_string())?;
            let window = display.create_window(None, Rect::new(0, 0, width, height), 0).map_err(|e| e.to_string())?;
            display.set_title(window, "tactus").map_err(|e| e.to_string())?;
            display.sync().map_err(|e| e.to_string())?;
            // From now on the delivery thread never waits for the display: a frame
            // buffer that is not free at once is a frame the device could not take.
            display.set_timeout(Duration::ZERO);
            let dev = VideoDev {
                display,
                window,
                width,
                height,
                pending: HashMap::new(),
                next_tag: 1,
                lost: None,
                lost_told: false,
            };
            Ok(Device::Video { dev: Arc::new(Mutex::new(dev)), lead: opts.video_lead })
        }
        (StreamKind::Audio { rate, channels }, "wav") => {
            let s = SinkSpec::parse(rest)?;
            if opts.audio_lead >= s.buffer {
                return Err(format!(
                    "a sink buffer of {:?} is not longer than the audio lead {:?}",
                    s.buffer, opts.audio_lead
                ));
            }
            let sink = AudioSink::open(&s, rate, channels, now + 10_000_000, opts.audio_thread.clone())
                .map_err(|e| format!("the WAV sink: {e}"))?;
            Ok(Device::Audio { sink, lead: opts.audio_lead })
        }
        (StreamKind::Midi, _) => {
            let d = ictus_midi::device::DeviceSpec::parse(spec).map_err(|e| e.to_string())?;
            let dev = d.open_output().map_err(|e| e.to_string())?;
            let out = Output::open(dev, opts.midi.clone()).map_err(|e| e.to_string())?;
            Ok(Device::Midi { out: Arc::new(out), lead: opts.midi_lead })
        }
        (k, n) => Err(format!("no device {n:?} for a {} stream (display, wav:PATH, a MIDI device, null)", k.name())),
    }
}
