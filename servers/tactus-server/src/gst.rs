//! Compressed clips through GStreamer (Debian's libraries, through gstreamer-rs):
//! `playbin` decodes whatever the machine has plugins for (MP4, MKV, WebM…) into two
//! application sinks — video as `BGRx` (our `0x00RRGGBB` little-endian), audio as
//! 16-bit interleaved — which the player pulls from at its own pace (the sinks do not
//! synchronise: Tactus does the timing). GStreamer is the peer of the experiments
//! too; here it is only a decoder.
//!
//! Nothing waits unboundedly: opening waits at most [`crate::play::STALL`] for the
//! decoder to preroll, each pull as long, and a decoder error is returned with
//! GStreamer's own message.

use std::path::Path;
use std::sync::OnceLock;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use crate::play::{AudioSource, PlayError, VideoSource, STALL};

fn decode_err(e: impl std::fmt::Display) -> PlayError {
    PlayError::Decode(e.to_string())
}

/// Initialise GStreamer once.
pub fn init() -> Result<(), PlayError> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| gst::init().map_err(|e| e.to_string())).clone().map_err(PlayError::Decode)
}

fn stall() -> gst::ClockTime {
    gst::ClockTime::from_nseconds(STALL.as_nanos() as u64)
}

/// A pipeline's video and audio sources (either may be missing).
pub type Sources = (Option<Box<dyn VideoSource>>, Option<Box<dyn AudioSource>>);

/// A decoding pipeline.
pub struct Pipeline {
    playbin: gst::Element,
    video: Option<(gst_app::AppSink, u16, u16, u64)>,
    audio: Option<(gst_app::AppSink, u32, u16)>,
    duration: i64,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gst::Pipeline(video {:?}, audio {:?})",
            self.video.as_ref().map(|v| (v.1, v.2)),
            self.audio.as_ref().map(|a| (a.1, a.2))
        )
    }
}

/// The first error on the bus, if any, as text.
fn bus_error(e: &gst::Element) -> Option<String> {
    let bus = e.bus()?;
    while let Some(m) = bus.pop_filtered(&[gst::MessageType::Error]) {
        if let gst::MessageView::Error(err) = m.view() {
            return Some(format!("{} ({})", err.error(), err.debug().map(|d| d.to_string()).unwrap_or_default()));
        }
    }
    None
}

impl Pipeline {
    /// Open `path` and preroll: learn which streams it has and their formats.
    pub fn open(path: &Path) -> Result<Pipeline, PlayError> {
        init()?;
        let abs = std::fs::canonicalize(path)
            .map_err(|e| PlayError::File { path: path.display().to_string(), why: e.to_string() })?;
        let uri = gst::glib::filename_to_uri(&abs, None).map_err(decode_err)?;
        let playbin = gst::ElementFactory::make("playbin").property("uri", uri.as_str()).build().map_err(decode_err)?;
        let vsink = gst_app::AppSink::builder()
            .caps(&gst::Caps::builder("video/x-raw").field("format", "BGRx").build())
            .sync(false)
            .max_buffers(8)
            .drop(false)
            .build();
        let asink = gst_app::AppSink::builder()
            .caps(&gst::Caps::builder("audio/x-raw").field("format", "S16LE").field("layout", "interleaved").build())
            .sync(false)
            .max_buffers(128)
            .drop(false)
            .build();
        playbin.set_property("video-sink", &vsink);
        playbin.set_property("audio-sink", &asink);
        let fail = |playbin: &gst::Element, why: String| {
            let _ = playbin.set_state(gst::State::Null);
            PlayError::Decode(format!("{}: {why}", path.display()))
        };
        if playbin.set_state(gst::State::Paused).is_err() {
            let why = bus_error(&playbin).unwrap_or_else(|| "the decoder refused to start".into());
            return Err(fail(&playbin, why));
        }
        let bus = playbin.bus().ok_or_else(|| fail(&playbin, "no bus".into()))?;
        match bus.timed_pop_filtered(stall(), &[gst::MessageType::AsyncDone, gst::MessageType::Error]) {
            Some(m) => {
                if let gst::MessageView::Error(err) = m.view() {
                    return Err(fail(&playbin, err.error().to_string()));
                }
            }
            None => return Err(fail(&playbin, format!("the decoder did not preroll within {STALL:?}"))),
        }
        let nv: i32 = playbin.property("n-video");
        let na: i32 = playbin.property("n-audio");
        let video = if nv > 0 {
            let s = vsink.try_pull_preroll(stall()).ok_or_else(|| fail(&playbin, "no video frame".into()))?;
            let caps = s.caps().ok_or_else(|| fail(&playbin, "video without caps".into()))?;
            let st = caps.structure(0).ok_or_else(|| fail(&playbin, "video without caps".into()))?;
            let w: i32 = st.get("width").map_err(|e| fail(&playbin, e.to_string()))?;
            let h: i32 = st.get("height").map_err(|e| fail(&playbin, e.to_string()))?;
            let fr: gst::Fraction = st.get("framerate").unwrap_or_else(|_| gst::Fraction::new(25, 1));
            let (n, d) = (fr.numer().max(1) as u64, fr.denom().max(1) as u64);
            if !(1..=8192).contains(&w) || !(1..=8192).contains(&h) {
                return Err(fail(&playbin, format!("a {w}x{h} video")));
            }
            Some((vsink, w as u16, h as u16, 1_000_000_000 * d / n))
        } else {
            None
        };
        let audio = if na > 0 {
            let s = asink.try_pull_preroll(stall()).ok_or_else(|| fail(&playbin, "no audio".into()))?;
            let caps = s.caps().ok_or_else(|| fail(&playbin, "audio without caps".into()))?;
            let st = caps.structure(0).ok_or_else(|| fail(&playbin, "audio without caps".into()))?;
            let rate: i32 = st.get("rate").map_err(|e| fail(&playbin, e.to_string()))?;
            let ch: i32 = st.get("channels").map_err(|e| fail(&playbin, e.to_string()))?;
            if !(1000..=384_000).contains(&rate) || !(1..=32).contains(&ch) {
                return Err(fail(&playbin, format!("audio of {rate} Hz × {ch}")));
            }
            Some((asink, rate as u32, ch as u16))
        } else {
            None
        };
        if video.is_none() && audio.is_none() {
            return Err(fail(&playbin, "neither video nor audio".into()));
        }
        let duration = playbin.query_duration::<gst::ClockTime>().map_or(0, |d| d.nseconds() as i64);
        if playbin.set_state(gst::State::Playing).is_err() {
            let why = bus_error(&playbin).unwrap_or_else(|| "the decoder refused to play".into());
            return Err(fail(&playbin, why));
        }
        Ok(Pipeline { playbin, video, audio, duration })
    }

    /// The clip's length (ns), 0 if unknown.
    pub fn duration(&self) -> i64 {
        self.duration
    }

    /// Its sources.
    pub fn sources(&self) -> Sources {
        let v = self.video.as_ref().map(|(s, w, h, f)| {
            Box::new(GstVideo {
                sink: s.clone(),
                playbin: self.playbin.clone(),
                w: *w,
                h: *h,
                frame: *f,
                pending: None,
                eos: false,
            }) as Box<dyn VideoSource>
        });
        let a = self.audio.as_ref().map(|(s, r, c)| {
            Box::new(GstAudio {
                sink: s.clone(),
                playbin: self.playbin.clone(),
                rate: *r,
                ch: *c,
                pending: None,
                eos: false,
            }) as Box<dyn AudioSource>
        });
        (v, a)
    }

    /// Seek the whole pipeline to `t` (ns).
    pub fn seek(&self, t: i64) -> Result<(), PlayError> {
        self.playbin
            .seek_simple(
                gst::SeekFlags::FLUSH | gst::SeekFlags::ACCURATE,
                gst::ClockTime::from_nseconds(t.max(0) as u64),
            )
            .map_err(decode_err)
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let _ = self.playbin.set_state(gst::State::Null);
    }
}

/// Pull the next sample; `None` at the end. An error on the bus, or nothing for
/// [`STALL`], is an error.
fn pull(sink: &gst_app::AppSink, playbin: &gst::Element, eos: &mut bool) -> Result<Option<gst::Sample>, PlayError> {
    if *eos {
        return Ok(None);
    }
    match sink.try_pull_sample(stall()) {
        Some(s) => Ok(Some(s)),
        None if sink.is_eos() => {
            *eos = true;
            Ok(None)
        }
        None => Err(PlayError::Decode(
            bus_error(playbin).unwrap_or_else(|| format!("the decoder produced nothing for {STALL:?}")),
        )),
    }
}

/// Where a sample sits in the clip: its stream time, through the segment it came
/// in, not its raw timestamp. They differ where a container says so: an MP4 with an
/// edit list (every H.264 clip with B-frames: x264 and FFmpeg delay the first picture
/// by the reordering depth and list the track from there) has video timestamps that
/// start 67 ms or so in, audio ones at 0, and only the segment lines them up. A frame
/// before the segment's start (none a decoder lets through) sits at its start.
fn pts(s: &gst::Sample) -> i64 {
    let Some(t) = s.buffer().and_then(|b| b.pts()) else { return 0 };
    match s.segment().and_then(|seg| seg.downcast_ref::<gst::ClockTime>()) {
        Some(seg) => seg.to_stream_time(t).map_or(0, |st| st.nseconds() as i64),
        None => t.nseconds() as i64,
    }
}

struct GstVideo {
    sink: gst_app::AppSink,
    playbin: gst::Element,
    w: u16,
    h: u16,
    frame: u64,
    pending: Option<gst::Sample>,
    eos: bool,
}

impl VideoSource for GstVideo {
    fn info(&self) -> (u16, u16, u64) {
        (self.w, self.h, self.frame)
    }
    fn peek(&mut self) -> Result<Option<i64>, PlayError> {
        if self.pending.is_none() {
            self.pending = pull(&self.sink, &self.playbin, &mut self.eos)?;
        }
        Ok(self.pending.as_ref().map(pts))
    }
    fn read_into(&mut self, buf: &mut [u8]) -> Result<(), PlayError> {
        let Some(s) = self.pending.take() else { return Ok(()) };
        let b = s.buffer().ok_or_else(|| PlayError::Decode("a frame without a buffer".into()))?;
        let map = b.map_readable().map_err(decode_err)?;
        if map.len() < buf.len() {
            return Err(PlayError::Decode(format!("a frame of {} bytes, {} expected", map.len(), buf.len())));
        }
        buf.copy_from_slice(&map[..buf.len()]);
        Ok(())
    }
    fn seek(&mut self, _t: i64) -> Result<(), PlayError> {
        self.pending = None;
        self.eos = false;
        Ok(())
    }
}

struct GstAudio {
    sink: gst_app::AppSink,
    playbin: gst::Element,
    rate: u32,
    ch: u16,
    pending: Option<gst::Sample>,
    eos: bool,
}

impl AudioSource for GstAudio {
    fn info(&self) -> (u32, u16) {
        (self.rate, self.ch)
    }
    fn peek(&mut self) -> Result<Option<i64>, PlayError> {
        if self.pending.is_none() {
            self.pending = pull(&self.sink, &self.playbin, &mut self.eos)?;
        }
        Ok(self.pending.as_ref().map(pts))
    }
    fn read(&mut self, out: &mut Vec<u8>) -> Result<(), PlayError> {
        out.clear();
        let Some(s) = self.pending.take() else { return Ok(()) };
        let b = s.buffer().ok_or_else(|| PlayError::Decode("audio without a buffer".into()))?;
        let map = b.map_readable().map_err(decode_err)?;
        let unit = 2 * usize::from(self.ch);
        out.extend_from_slice(&map[..map.len() - map.len() % unit]);
        Ok(())
    }
    fn seek(&mut self, _t: i64) -> Result<(), PlayError> {
        self.pending = None;
        self.eos = false;
        Ok(())
    }
}
