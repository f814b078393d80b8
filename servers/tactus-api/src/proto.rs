//! The wire: records between a client and the Tactus server (no system calls).
//!
//! Everything a client says travels in its shared-memory channel (or, for the
//! sockets-throughout comparison, a stream socket carrying the same records framed by
//! length): control records ([`Control`], tag [`TAG_CONTROL`]) and items
//! ([`TAG_ITEM`]: an [`ItemHeader`] and the payload in the ring). A large payload (a
//! video frame) is written once, by the client, into a buffer lent from the channel's
//! pool, and committed as an *attachment* ([`TAG_POOL_ITEM`], the payload alone from
//! byte 0); the item record that follows it carries [`item::ATTACHED`] and no payload
//! of its own, and takes the client's oldest attachment. The server answers in the
//! reply ring with [`Report`]s.
//!
//! All integers are little-endian. Every decoder takes untrusted bytes and either
//! returns a validated value or a [`DecodeError`]; none panics or reads past what it
//! was given (fuzzed: `fuzz/fuzz_targets/tactus_record.rs`).

use std::fmt;

/// Protocol version, checked when a channel opens.
pub const VERSION: u32 = 1;

/// Record tag: a control record.
pub const TAG_CONTROL: u32 = 1;
/// Record tag: an item in the ring.
pub const TAG_ITEM: u32 = 2;
/// Record tag: an attachment, a pool buffer holding the payload of the next item
/// record that says [`item::ATTACHED`].
pub const TAG_POOL_ITEM: u32 = 3;

/// Item header flags.
pub mod item {
    /// The payload is the client's oldest attachment, not in this record.
    pub const ATTACHED: u32 = 1;
}

/// Reply tag: a status report.
pub const TAG_STATUS: u32 = 101;
/// Reply tag: a delivery report.
pub const TAG_DELIVERED: u32 = 102;
/// Reply tag: an error.
pub const TAG_ERROR: u32 = 103;
/// Reply tag: a time map change took effect (or will, at the instant given).
pub const TAG_CHANGED: u32 = 104;

/// The longest device name.
pub const MAX_DEVICE: usize = 256;
/// The longest item duration accepted (one hour).
pub const MAX_DURATION_NS: u64 = 3_600_000_000_000;
/// The most streams in one status report.
pub const MAX_STATUS_STREAMS: usize = 256;

/// Why bytes did not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the record needs.
    #[error("{what}: {got} bytes, at least {need} needed")]
    Short {
        /// What was being decoded.
        what: &'static str,
        /// Bytes given.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Bytes left over after the record.
    #[error("{what}: {extra} bytes left over")]
    Trailing {
        /// What was being decoded.
        what: &'static str,
        /// How many.
        extra: usize,
    },
    /// A field out of its range.
    #[error("{0}")]
    Invalid(String),
    /// An unknown tag or operation.
    #[error("unknown {what} {code}")]
    Unknown {
        /// Tag or operation.
        what: &'static str,
        /// Its value.
        code: u32,
    },
}

fn invalid(s: impl Into<String>) -> DecodeError {
    DecodeError::Invalid(s.into())
}

/// A checked little-endian reader over untrusted bytes.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { b, at: 0, what }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or(DecodeError::Short {
            what: self.what,
            got: self.b.len(),
            need: self.at.saturating_add(n),
        })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(self.u64()? as i64)
    }
    fn f64(&mut self) -> Result<f64, DecodeError> {
        Ok(f64::from_bits(self.u64()?))
    }
    fn rest(&self) -> usize {
        self.b.len() - self.at
    }
    fn end(&self) -> Result<(), DecodeError> {
        match self.rest() {
            0 => Ok(()),
            extra => Err(DecodeError::Trailing { what: self.what, extra }),
        }
    }
}

/// What kind of data a stream carries, and the device it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// Video frames of `width × height` pixels, `0x00RRGGBB` little-endian, rows back
    /// to back.
    Video {
        /// Width in pixels.
        width: u16,
        /// Height in pixels.
        height: u16,
    },
    /// Audio blocks of signed 16-bit little-endian interleaved samples.
    Audio {
        /// Frames per second.
        rate: u32,
        /// Channels.
        channels: u16,
    },
    /// MIDI messages, one complete message per item.
    Midi,
    /// Any timestamped payload, delivered at its time to a device that takes bytes.
    Data,
}

impl StreamKind {
    fn code(self) -> u8 {
        match self {
            StreamKind::Video { .. } => 1,
            StreamKind::Audio { .. } => 2,
            StreamKind::Midi => 3,
            StreamKind::Data => 4,
        }
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            StreamKind::Video { .. } => "video",
            StreamKind::Audio { .. } => "audio",
            StreamKind::Midi => "midi",
            StreamKind::Data => "data",
        }
    }

    /// Bytes of one video frame, or of one audio frame (all channels).
    pub fn unit_bytes(self) -> usize {
        match self {
            StreamKind::Video { width, height } => usize::from(width) * usize::from(height) * 4,
            StreamKind::Audio { channels, .. } => usize::from(channels) * 2,
            StreamKind::Midi | StreamKind::Data => 1,
        }
    }
}

/// Stream flags.
pub mod flags {
    /// Send a delivery report ([`super::Delivered`]) for every item.
    pub const REPORT: u8 = 1;
    /// This audio stream's device clock is its presentation's clock.
    pub const MASTER: u8 = 2;
}

/// A control record.
#[derive(Clone, Debug, PartialEq)]
pub enum Control {
    /// Open a presentation with the client's number for it.
    OpenPresentation {
        /// The client's number.
        id: u32,
    },
    /// Close a presentation and its streams.
    ClosePresentation {
        /// Which.
        id: u32,
    },
    /// Open a stream of a presentation.
    OpenStream {
        /// The client's number for the stream.
        id: u32,
        /// Its presentation.
        presentation: u32,
        /// What it carries.
        kind: StreamKind,
        /// [`flags`].
        flags: u8,
        /// [`crate::policy::LatePolicy`] in wire form.
        policy: u32,
        /// The device: `display`, `wav:PATH`, `cable:NAME`, `null`… (see the server).
        device: String,
    },
    /// Close a stream: what it has queued is flushed.
    CloseStream {
        /// Which.
        id: u32,
    },
    /// No more items on this stream until a seek (so it does not count underruns).
    EndStream {
        /// Which.
        id: u32,
    },
    /// Start the presentation from logical time `logical`, at clock time `at` (0: as
    /// soon as its devices allow).
    Start {
        /// Which.
        presentation: u32,
        /// Logical time to start from.
        logical: i64,
        /// When (`CLOCK_MONOTONIC` ns), or 0.
        at: u64,
    },
    /// Pause.
    Pause {
        /// Which.
        presentation: u32,
    },
    /// Resume.
    Resume {
        /// Which.
        presentation: u32,
    },
    /// Seek to logical time `logical`: a new epoch (the client's items after this record
    /// carry it).
    Seek {
        /// Which.
        presentation: u32,
        /// Where.
        logical: i64,
    },
    /// Change the rate.
    Rate {
        /// Which.
        presentation: u32,
        /// The rate (checked against [`crate::timemap::Rate`]).
        rate: f64,
    },
    /// Send a status report now.
    Status,
}

mod op {
    pub const OPEN_PRESENTATION: u8 = 1;
    pub const CLOSE_PRESENTATION: u8 = 2;
    pub const OPEN_STREAM: u8 = 3;
    pub const CLOSE_STREAM: u8 = 4;
    pub const END_STREAM: u8 = 5;
    pub const START: u8 = 6;
    pub const PAUSE: u8 = 7;
    pub const RESUME: u8 = 8;
    pub const SEEK: u8 = 9;
    pub const RATE: u8 = 10;
    pub const STATUS: u8 = 11;
}

impl Control {
    /// Append the encoded record to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut head = |code: u8, a: u32| {
            out.extend_from_slice(&[code, 0, 0, 0]);
            out.extend_from_slice(&a.to_le_bytes());
        };
        match self {
            Control::OpenPresentation { id } => head(op::OPEN_PRESENTATION, *id),
            Control::ClosePresentation { id } => head(op::CLOSE_PRESENTATION, *id),
            Control::OpenStream { id, presentation, kind, flags, policy, device } => {
                head(op::OPEN_STREAM, *id);
                out.extend_from_slice(&presentation.to_le_bytes());
                out.extend_from_slice(&[kind.code(), *flags]);
                let (p1, p2) = match *kind {
                    StreamKind::Video { width, height } => (u32::from(width), u32::from(height)),
                    StreamKind::Audio { rate, channels } => (rate, u32::from(channels)),
                    StreamKind::Midi | StreamKind::Data => (0, 0),
                };
                let dev = &device.as_bytes()[..device.len().min(MAX_DEVICE)];
                out.extend_from_slice(&(dev.len() as u16).to_le_bytes());
                out.extend_from_slice(&policy.to_le_bytes());
                out.extend_from_slice(&p1.to_le_bytes());
                out.extend_from_slice(&p2.to_le_bytes());
                out.extend_from_slice(dev);
            }
            Control::CloseStream { id } => head(op::CLOSE_STREAM, *id),
            Control::EndStream { id } => head(op::END_STREAM, *id),
            Control::Start { presentation, logical, at } => {
                head(op::START, *presentation);
                out.extend_from_slice(&logical.to_le_bytes());
                out.extend_from_slice(&at.to_le_bytes());
            }
            Control::Pause { presentation } => head(op::PAUSE, *presentation),
            Control::Resume { presentation } => head(op::RESUME, *presentation),
            Control::Seek { presentation, logical } => {
                head(op::SEEK, *presentation);
                out.extend_from_slice(&logical.to_le_bytes());
            }
            Control::Rate { presentation, rate } => {
                head(op::RATE, *presentation);
                out.extend_from_slice(&rate.to_bits().to_le_bytes());
            }
            Control::Status => head(op::STATUS, 0),
        }
    }

    /// Decode one control record (the whole of `b`).
    pub fn decode(b: &[u8]) -> Result<Control, DecodeError> {
        let mut r = Reader::new(b, "control record");
        let code = r.u8()?;
        if r.take(3)? != [0, 0, 0] {
            return Err(invalid("control record: reserved bytes not zero"));
        }
        let a = r.u32()?;
        let c = match code {
            op::OPEN_PRESENTATION => Control::OpenPresentation { id: a },
            op::CLOSE_PRESENTATION => Control::ClosePresentation { id: a },
            op::OPEN_STREAM => {
                let presentation = r.u32()?;
                let kind_code = r.u8()?;
                let flags = r.u8()?;
                let dev_len = usize::from(r.u16()?);
                let policy = r.u32()?;
                let p1 = r.u32()?;
                let p2 = r.u32()?;
                if dev_len > MAX_DEVICE {
                    return Err(invalid(format!("device name of {dev_len} bytes (at most {MAX_DEVICE})")));
                }
                if flags & !(flags::REPORT | flags::MASTER) != 0 {
                    return Err(invalid(format!("unknown stream flags {flags:#x}")));
                }
                let device =
                    std::str::from_utf8(r.take(dev_len)?).map_err(|_| invalid("device name is not UTF-8"))?.to_owned();
                let kind = match kind_code {
                    1 => {
                        let (w, h) = (u16::try_from(p1), u16::try_from(p2));
                        match (w, h) {
                            (Ok(width), Ok(height)) if width > 0 && height > 0 && width <= 8192 && height <= 8192 => {
                                StreamKind::Video { width, height }
                            }
                            _ => return Err(invalid(format!("video of {p1}x{p2} pixels (1..8192 each way)"))),
                        }
                    }
                    2 => {
                        if !(1000..=384_000).contains(&p1) || !(1..=32).contains(&p2) {
                            return Err(invalid(format!("audio of {p1} Hz and {p2} channels")));
                        }
                        StreamKind::Audio { rate: p1, channels: p2 as u16 }
                    }
                    3 => StreamKind::Midi,
                    4 => StreamKind::Data,
                    k => return Err(DecodeError::Unknown { what: "stream kind", code: u32::from(k) }),
                };
                if flags & flags::MASTER != 0 && !matches!(kind, StreamKind::Audio { .. }) {
                    return Err(invalid("only an audio stream can be its presentation's clock"));
                }
                Control::OpenStream { id: a, presentation, kind, flags, policy, device }
            }
            op::CLOSE_STREAM => Control::CloseStream { id: a },
            op::END_STREAM => Control::EndStream { id: a },
            op::START => Control::Start { presentation: a, logical: r.i64()?, at: r.u64()? },
            op::PAUSE => Control::Pause { presentation: a },
            op::RESUME => Control::Resume { presentation: a },
            op::SEEK => Control::Seek { presentation: a, logical: r.i64()? },
            op::RATE => {
                let rate = r.f64()?;
                if crate::timemap::Rate::new(rate).is_none() {
                    return Err(invalid(format!("rate {rate} (between 1/16 and 16)")));
                }
                Control::Rate { presentation: a, rate }
            }
            op::STATUS => Control::Status,
            k => return Err(DecodeError::Unknown { what: "control operation", code: u32::from(k) }),
        };
        r.end()?;
        Ok(c)
    }
}

/// The header of an item, before its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemHeader {
    /// The stream.
    pub stream: u32,
    /// The presentation's epoch the item was made for (bumped by each seek the client
    /// sent before it).
    pub epoch: u32,
    /// The client's sequence number (echoed in reports).
    pub seq: u64,
    /// Logical time (ns) at which it is presented.
    pub logical: i64,
    /// How long it lasts (ns).
    pub duration: u64,
    /// When the client sent it (`CLOCK_MONOTONIC` ns; for the frame timing model).
    pub sent: u64,
    /// Payload bytes following the header (or used in the attachment).
    pub len: u32,
    /// [`item`] flags.
    pub flags: u32,
}

impl ItemHeader {
    /// Encoded size.
    pub const LEN: usize = 48;

    /// Encode into the first [`ItemHeader::LEN`] bytes of `out`.
    pub fn write(&self, out: &mut [u8]) {
        let out = &mut out[..Self::LEN];
        out[0..4].copy_from_slice(&self.stream.to_le_bytes());
        out[4..8].copy_from_slice(&self.epoch.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.logical.to_le_bytes());
        out[24..32].copy_from_slice(&self.duration.to_le_bytes());
        out[32..40].copy_from_slice(&self.sent.to_le_bytes());
        out[40..44].copy_from_slice(&self.len.to_le_bytes());
        out[44..48].copy_from_slice(&self.flags.to_le_bytes());
    }

    /// Decode the header at the start of an item record of `total` bytes (`b` holds at
    /// least the header; an in-line payload must fit in `total`).
    pub fn decode(b: &[u8], total: usize) -> Result<ItemHeader, DecodeError> {
        let mut r = Reader::new(b, "item header");
        let h = ItemHeader {
            stream: r.u32()?,
            epoch: r.u32()?,
            seq: r.u64()?,
            logical: r.i64()?,
            duration: r.u64()?,
            sent: r.u64()?,
            len: r.u32()?,
            flags: r.u32()?,
        };
        if h.flags & !item::ATTACHED != 0 {
            return Err(invalid(format!("item header: unknown flags {:#x}", h.flags)));
        }
        if h.duration > MAX_DURATION_NS {
            return Err(invalid(format!("item of {} ns (at most an hour)", h.duration)));
        }
        let need = if h.flags & item::ATTACHED != 0 { Self::LEN } else { Self::LEN + h.len as usize };
        if need > total {
            return Err(DecodeError::Short { what: "item payload", got: total, need });
        }
        Ok(h)
    }
}

/// Delivery report flags.
pub mod delivered {
    /// Handed over later than due (past the grace).
    pub const LATE: u32 = 1;
    /// Dropped as too late.
    pub const DROPPED: u32 = 2;
    /// Flushed (a seek or a close made it never due).
    pub const FLUSHED: u32 = 4;
    /// `presented` is the device's own report (the screen had it), not the hand-over.
    pub const BY_DEVICE: u32 = 8;
    /// The device dropped it (a later frame was due first).
    pub const DEVICE_DROPPED: u32 = 16;
}

/// What happened to one item (sent for streams opened with [`flags::REPORT`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delivered {
    /// The stream.
    pub stream: u32,
    /// [`delivered`] flags.
    pub flags: u32,
    /// The client's sequence number.
    pub seq: u64,
    /// The item's logical time.
    pub logical: i64,
    /// When it was due (`CLOCK_MONOTONIC` ns; 0 if never).
    pub due: u64,
    /// When the server received it.
    pub received: u64,
    /// When it was handed to its device (after any copy into the device's buffer).
    pub handed: u64,
    /// When it was presented: the device's report if [`delivered::BY_DEVICE`], else
    /// the hand-over for a device that presents at once, or the due time placed
    /// exactly in a device that accepts early (audio).
    pub presented: u64,
    /// The client's send stamp.
    pub sent: u64,
}

impl Delivered {
    /// Encoded size.
    pub const LEN: usize = 64;

    /// Append the encoded report.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.stream.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        for v in [self.seq, self.logical as u64, self.due, self.received, self.handed, self.presented, self.sent] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Decode a report (the whole of `b`).
    pub fn decode(b: &[u8]) -> Result<Delivered, DecodeError> {
        let mut r = Reader::new(b, "delivery report");
        let d = Delivered {
            stream: r.u32()?,
            flags: r.u32()?,
            seq: r.u64()?,
            logical: r.i64()?,
            due: r.u64()?,
            received: r.u64()?,
            handed: r.u64()?,
            presented: r.u64()?,
            sent: r.u64()?,
        };
        r.end()?;
        Ok(d)
    }
}

/// A presentation in a status report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PresentationStatus {
    /// The client's number.
    pub id: u32,
    /// Its epoch.
    pub epoch: u32,
    /// 0 stopped, 1 running, 2 paused.
    pub motion: u8,
    /// Whether a device clock drives it.
    pub device_clock: bool,
    /// The rate.
    pub rate: f64,
    /// Logical position now (ns).
    pub position: i64,
    /// The device clock's estimated skew (ppm), 0 for the system clock.
    pub skew_ppm: f64,
}

/// A stream in a status report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStatus {
    /// The client's number.
    pub id: u32,
    /// Items queued in the server.
    pub items: u32,
    /// Bytes queued.
    pub bytes: u64,
    /// How far ahead of the position the queue reaches (ns).
    pub level_ns: u64,
    /// Handed over on time.
    pub on_time: u64,
    /// Handed over late.
    pub late: u64,
    /// Dropped as too late.
    pub dropped: u64,
    /// Flushed by seeks and closes.
    pub flushed: u64,
    /// Refused (malformed for the stream).
    pub refused: u64,
    /// Dry spells.
    pub underruns: u64,
    /// Bytes the device holds ahead (audio), or 0.
    pub device_bytes: u64,
    /// Dry spells of the device itself (audio: periods played as silence).
    pub device_underruns: u64,
}

/// A status report: every presentation and stream of the client.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    /// When the server made it (`CLOCK_MONOTONIC` ns).
    pub now: u64,
    /// Presentations.
    pub presentations: Vec<PresentationStatus>,
    /// Streams.
    pub streams: Vec<StreamStatus>,
}

impl Status {
    /// Append the encoded report.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let np = self.presentations.len().min(MAX_STATUS_STREAMS);
        let ns = self.streams.len().min(MAX_STATUS_STREAMS);
        out.extend_from_slice(&self.now.to_le_bytes());
        out.extend_from_slice(&(np as u16).to_le_bytes());
        out.extend_from_slice(&(ns as u16).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        for p in &self.presentations[..np] {
            out.extend_from_slice(&p.id.to_le_bytes());
            out.extend_from_slice(&p.epoch.to_le_bytes());
            out.extend_from_slice(&[p.motion, u8::from(p.device_clock), 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&p.rate.to_bits().to_le_bytes());
            out.extend_from_slice(&p.position.to_le_bytes());
            out.extend_from_slice(&p.skew_ppm.to_bits().to_le_bytes());
        }
        for s in &self.streams[..ns] {
            out.extend_from_slice(&s.id.to_le_bytes());
            out.extend_from_slice(&s.items.to_le_bytes());
            for v in [
                s.bytes,
                s.level_ns,
                s.on_time,
                s.late,
                s.dropped,
                s.flushed,
                s.refused,
                s.underruns,
                s.device_bytes,
                s.device_underruns,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }

    /// Decode a report (the whole of `b`).
    pub fn decode(b: &[u8]) -> Result<Status, DecodeError> {
        let mut r = Reader::new(b, "status report");
        let now = r.u64()?;
        let np = usize::from(r.u16()?);
        let ns = usize::from(r.u16()?);
        r.take(4)?;
        if np > MAX_STATUS_STREAMS || ns > MAX_STATUS_STREAMS {
            return Err(invalid("status report: too many entries"));
        }
        let mut st = Status { now, presentations: Vec::with_capacity(np), streams: Vec::with_capacity(ns) };
        for _ in 0..np {
            let id = r.u32()?;
            let epoch = r.u32()?;
            let m = r.take(8)?;
            if m[0] > 2 {
                return Err(invalid(format!("status report: motion {}", m[0])));
            }
            st.presentations.push(PresentationStatus {
                id,
                epoch,
                motion: m[0],
                device_clock: m[1] != 0,
                rate: r.f64()?,
                position: r.i64()?,
                skew_ppm: r.f64()?,
            });
        }
        for _ in 0..ns {
            st.streams.push(StreamStatus {
                id: r.u32()?,
                items: r.u32()?,
                bytes: r.u64()?,
                level_ns: r.u64()?,
                on_time: r.u64()?,
                late: r.u64()?,
                dropped: r.u64()?,
                flushed: r.u64()?,
                refused: r.u64()?,
                underruns: r.u64()?,
                device_bytes: r.u64()?,
                device_underruns: r.u64()?,
            });
        }
        r.end()?;
        Ok(st)
    }
}

/// A time map change that took effect, or will at `at`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// The presentation.
    pub presentation: u32,
    /// Its epoch after the change.
    pub epoch: u32,
    /// The instant (`CLOCK_MONOTONIC` ns, estimated for a device clock).
    pub at: u64,
    /// Logical time at that instant.
    pub logical: i64,
}

impl Changed {
    /// Append the encoded report.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.presentation.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.at.to_le_bytes());
        out.extend_from_slice(&self.logical.to_le_bytes());
    }

    /// Decode (the whole of `b`).
    pub fn decode(b: &[u8]) -> Result<Changed, DecodeError> {
        let mut r = Reader::new(b, "change report");
        let c = Changed { presentation: r.u32()?, epoch: r.u32()?, at: r.u64()?, logical: r.i64()? };
        r.end()?;
        Ok(c)
    }
}

/// An error the server reports about a record (the channel stays open).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReport {
    /// The stream or presentation it concerns, or 0.
    pub id: u32,
    /// What went wrong.
    pub text: String,
}

impl ErrorReport {
    /// Append the encoded report.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        let t = &self.text.as_bytes()[..self.text.len().min(1024)];
        out.extend_from_slice(t);
    }

    /// Decode (the whole of `b`).
    pub fn decode(b: &[u8]) -> Result<ErrorReport, DecodeError> {
        let mut r = Reader::new(b, "error report");
        let id = r.u32()?;
        let text = String::from_utf8_lossy(r.take(r.rest())?).into_owned();
        Ok(ErrorReport { id, text })
    }
}

/// A reply from the server.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// A status report.
    Status(Status),
    /// A delivery report.
    Delivered(Delivered),
    /// A time map change.
    Changed(Changed),
    /// An error.
    Error(ErrorReport),
}

impl Report {
    /// The reply's tag.
    pub fn tag(&self) -> u32 {
        match self {
            Report::Status(_) => TAG_STATUS,
            Report::Delivered(_) => TAG_DELIVERED,
            Report::Changed(_) => TAG_CHANGED,
            Report::Error(_) => TAG_ERROR,
        }
    }

    /// Append the encoded payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Report::Status(s) => s.encode(out),
            Report::Delivered(d) => d.encode(out),
            Report::Changed(c) => c.encode(out),
            Report::Error(e) => e.encode(out),
        }
    }

    /// Decode a reply with tag `tag`.
    pub fn decode(tag: u32, b: &[u8]) -> Result<Report, DecodeError> {
        match tag {
            TAG_STATUS => Status::decode(b).map(Report::Status),
            TAG_DELIVERED => Delivered::decode(b).map(Report::Delivered),
            TAG_CHANGED => Changed::decode(b).map(Report::Changed),
            TAG_ERROR => ErrorReport::decode(b).map(Report::Error),
            t => Err(DecodeError::Unknown { what: "reply tag", code: t }),
        }
    }
}

/// A record from a client, validated: what the server acts on.
#[derive(Clone, Debug, PartialEq)]
pub enum Record<'a> {
    /// A control record.
    Control(Control),
    /// An item and its in-line payload (empty when [`item::ATTACHED`]).
    Item(ItemHeader, &'a [u8]),
    /// An attachment (its bytes stay where they are; this carries nothing).
    Attachment,
}

impl<'a> Record<'a> {
    /// Decode a client's in-line record with tag `tag` (an attachment's bytes are not
    /// looked at here: they are the next item's payload).
    pub fn decode(tag: u32, b: &'a [u8]) -> Result<Record<'a>, DecodeError> {
        match tag {
            TAG_CONTROL => Control::decode(b).map(Record::Control),
            TAG_ITEM => {
                let h = ItemHeader::decode(b, b.len())?;
                let inline = if h.flags & item::ATTACHED != 0 { 0 } else { h.len as usize };
                if b.len() != ItemHeader::LEN + inline {
                    return Err(DecodeError::Trailing {
                        what: "item record",
                        extra: b.len() - ItemHeader::LEN - inline,
                    });
                }
                Ok(Record::Item(h, &b[ItemHeader::LEN..]))
            }
            TAG_POOL_ITEM => Ok(Record::Attachment),
            t => Err(DecodeError::Unknown { what: "record tag", code: t }),
        }
    }
}

/// Frame a record for a stream socket: `len u32 | tag u32 | payload`.
pub fn frame(tag: u32, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(payload);
}

/// The largest framed record on a socket.
pub const MAX_FRAMED: usize = 64 << 20;

/// A framed record: its tag, its payload, and the bytes it took.
pub type Framed<'a> = (u32, &'a [u8], usize);

/// The next framed record in `buf`: `(tag, payload, bytes used)`, `None` if incomplete.
pub fn unframe(buf: &[u8]) -> Result<Option<Framed<'_>>, DecodeError> {
    if buf.len() < 8 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("4")) as usize;
    let tag = u32::from_le_bytes(buf[4..8].try_into().expect("4"));
    if len > MAX_FRAMED {
        return Err(invalid(format!("a framed record of {len} bytes (at most {MAX_FRAMED})")));
    }
    if buf.len() < 8 + len {
        return Ok(None);
    }
    Ok(Some((tag, &buf[8..8 + len], 8 + len)))
}

impl fmt::Display for Control {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Decode anything a client or server could be sent, for the fuzz target: a tag, then
/// a record or reply. Returns whether it decoded.
pub fn fuzz_one(data: &[u8]) -> bool {
    if data.len() < 4 {
        return false;
    }
    let tag = u32::from_le_bytes(data[..4].try_into().expect("4"));
    let body = &data[4..];
    let a = Record::decode(tag % 4, body).is_ok();
    let b = Report::decode(101 + tag % 4, body).is_ok();
    let c = unframe(body).is_ok();
    a || b || c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(c: Control) {
        let mut out = Vec::new();
        c.encode(&mut out);
        assert_eq!(Control::decode(&out).unwrap(), c);
        // Every strict prefix is short, never a panic.
        for n in 0..out.len() {
            assert!(Control::decode(&out[..n]).is_err());
        }
        out.push(0);
        assert!(matches!(Control::decode(&out), Err(DecodeError::Trailing { .. }) | Err(DecodeError::Invalid(_))));
    }

    #[test]
    fn controls_round_trip() {
        round(Control::OpenPresentation { id: 7 });
        round(Control::ClosePresentation { id: 7 });
        round(Control::OpenStream {
            id: 3,
            presentation: 7,
            kind: StreamKind::Video { width: 160, height: 120 },
            flags: flags::REPORT,
            policy: 40_000,
            device: "display".into(),
        });
        round(Control::OpenStream {
            id: 4,
            presentation: 7,
            kind: StreamKind::Audio { rate: 48_000, channels: 2 },
            flags: flags::MASTER,
            policy: u32::MAX,
            device: "wav:/tmp/x.wav,skew=200".into(),
        });
        round(Control::OpenStream {
            id: 5,
            presentation: 7,
            kind: StreamKind::Midi,
            flags: 0,
            policy: 0,
            device: "cable:a".into(),
        });
        round(Control::CloseStream { id: 3 });
        round(Control::EndStream { id: 3 });
        round(Control::Start { presentation: 7, logical: -5, at: 99 });
        round(Control::Pause { presentation: 7 });
        round(Control::Resume { presentation: 7 });
        round(Control::Seek { presentation: 7, logical: 1 << 40 });
        round(Control::Rate { presentation: 7, rate: 0.5 });
        round(Control::Status);
    }

    #[test]
    fn bad_controls_are_refused() {
        let mut out = Vec::new();
        Control::Rate { presentation: 1, rate: 100.0 }.encode(&mut out);
        assert!(Control::decode(&out).is_err());
        let mut out = Vec::new();
        Control::OpenStream {
            id: 1,
            presentation: 1,
            kind: StreamKind::Video { width: 0, height: 10 },
            flags: 0,
            policy: 0,
            device: String::new(),
        }
        .encode(&mut out);
        assert!(Control::decode(&out).is_err());
        let mut out = Vec::new();
        Control::OpenStream {
            id: 1,
            presentation: 1,
            kind: StreamKind::Midi,
            flags: flags::MASTER,
            policy: 0,
            device: String::new(),
        }
        .encode(&mut out);
        assert!(Control::decode(&out).is_err());
        assert!(matches!(Control::decode(&[99, 0, 0, 0, 0, 0, 0, 0]), Err(DecodeError::Unknown { .. })));
        assert!(Control::decode(&[1, 1, 0, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn items_are_checked_against_their_record() {
        let h = ItemHeader { stream: 1, epoch: 0, seq: 9, logical: 100, duration: 33, sent: 5, len: 4, flags: 0 };
        let mut b = vec![0u8; ItemHeader::LEN + 4];
        h.write(&mut b);
        b[ItemHeader::LEN..].copy_from_slice(b"abcd");
        assert_eq!(Record::decode(TAG_ITEM, &b).unwrap(), Record::Item(h, b"abcd"));
        // An attached item has no in-line payload, whatever its length says.
        let a = ItemHeader { flags: item::ATTACHED, len: 1 << 20, ..h };
        let mut ab = vec![0u8; ItemHeader::LEN];
        a.write(&mut ab);
        assert_eq!(Record::decode(TAG_ITEM, &ab).unwrap(), Record::Item(a, b""));
        assert!(Record::decode(TAG_ITEM, &b[..ItemHeader::LEN + 1]).is_err());
        assert_eq!(Record::decode(TAG_POOL_ITEM, &[1, 2, 3]).unwrap(), Record::Attachment);
        let mut pool = b.clone();
        pool.extend_from_slice(&[0; 100]);
        // A length past the record.
        assert!(Record::decode(TAG_ITEM, &b[..b.len() - 1]).is_err());
        // Trailing bytes in a ring record.
        assert!(Record::decode(TAG_ITEM, &pool).is_err());
        let mut flagged = b.clone();
        flagged[44] = 2;
        assert!(Record::decode(TAG_ITEM, &flagged).is_err());
        let mut long = b.clone();
        long[24..32].copy_from_slice(&(MAX_DURATION_NS + 1).to_le_bytes());
        assert!(Record::decode(TAG_ITEM, &long).is_err());
    }

    #[test]
    fn reports_round_trip() {
        let d = Delivered {
            stream: 1,
            flags: delivered::LATE,
            seq: 2,
            logical: 3,
            due: 4,
            received: 5,
            handed: 6,
            presented: 7,
            sent: 8,
        };
        let mut out = Vec::new();
        Report::Delivered(d).encode(&mut out);
        assert_eq!(out.len(), Delivered::LEN);
        assert_eq!(Report::decode(TAG_DELIVERED, &out).unwrap(), Report::Delivered(d));
        let st = Status {
            now: 1,
            presentations: vec![PresentationStatus {
                id: 1,
                epoch: 2,
                motion: 1,
                device_clock: true,
                rate: 1.0,
                position: 5,
                skew_ppm: 199.5,
            }],
            streams: vec![StreamStatus {
                id: 3,
                items: 4,
                bytes: 5,
                level_ns: 6,
                underruns: 7,
                ..StreamStatus::default()
            }],
        };
        let mut out = Vec::new();
        Report::Status(st.clone()).encode(&mut out);
        assert_eq!(Report::decode(TAG_STATUS, &out).unwrap(), Report::Status(st));
        for n in 0..out.len() {
            assert!(Report::decode(TAG_STATUS, &out[..n]).is_err());
        }
        let c = Changed { presentation: 1, epoch: 2, at: 3, logical: -4 };
        let mut out = Vec::new();
        c.encode(&mut out);
        assert_eq!(Changed::decode(&out).unwrap(), c);
        let e = ErrorReport { id: 9, text: "no such stream".into() };
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(ErrorReport::decode(&out).unwrap(), e);
    }

    #[test]
    fn framing() {
        let mut out = Vec::new();
        frame(TAG_CONTROL, b"xyz", &mut out);
        frame(TAG_ITEM, b"", &mut out);
        let (t, p, n) = unframe(&out).unwrap().unwrap();
        assert_eq!((t, p, n), (TAG_CONTROL, &b"xyz"[..], 11));
        let (t, p, _) = unframe(&out[n..]).unwrap().unwrap();
        assert_eq!((t, p), (TAG_ITEM, &b""[..]));
        assert_eq!(unframe(&out[..10]).unwrap(), None);
        let mut huge = Vec::new();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&1u32.to_le_bytes());
        assert!(unframe(&huge).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(tag in 0u32..8, b in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = Record::decode(tag, &b);
            let _ = Report::decode(100 + tag, &b);
            let _ = unframe(&b);
        }
    }
}
