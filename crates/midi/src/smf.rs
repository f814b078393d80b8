//! Standard MIDI Files: reading a score (formats 0 and 1), its tempo map, and the small
//! demo file ictus makes itself.
//!
//! # Reading, strictly or leniently
//!
//! The file's layout is walked here first, as a checked view with byte offsets: the
//! header chunk (format, track count, division), then every chunk (id, length, data),
//! each length checked against what the file has; each track chunk's events are then
//! read by the `midly` crate, one at a time, so that where it stops is known too. A file
//! that is not what its header says — shorter than a chunk's length, fewer (or more)
//! tracks than promised, a track without End of Track or with events after it, an event
//! that cannot be read, a second header, bytes after the last chunk that are not one — is
//! refused by [`Score::parse`] with an error naming the byte offset ([`Problem`]).
//! [`Score::parse_with`] and [`Strictness::Lenient`] play what is there instead: every
//! event read before the first problem of each track, the problems listed in
//! [`Score::problems`]. (midly alone, built lenient, played 35 of 41 truncations of real
//! files without a word: a 14-byte prefix of a two-track file was "0 tracks".) What no
//! reading can play is refused either way: not a MIDI file, a header cut short, an
//! impossible division, format 2.
//!
//! A [`Score`] keeps every
//! channel and system-exclusive event of every track, merged in tick order (events at
//! the same tick keep their track order, then their order in the track), and a
//! [`TempoMap`] built from the tempo meta events of all tracks — in a format 1 file the
//! tempo map is global even if the tempo events sit in track 0, as the standard says.
//!
//! Format 2 (independent sequences) is refused with a clear error: its tracks are not
//! meant to be played together, and no player we know of handles it the same way.
//! Escape events (`F7` packets of arbitrary bytes) and meta events other than tempo are
//! skipped and counted.
//!
//! # Time
//!
//! With metrical timing (`ticks per quarter note`), the time of tick `t` is the sum, over
//! the tempo segments before `t`, of ticks × (µs per quarter note) / (ticks per quarter
//! note), computed in integer nanoseconds without accumulating rounding (each segment's
//! start time is computed exactly from the previous one). The tempo before the first
//! tempo event is 500 000 µs per quarter note (120 beats a minute). With SMPTE timing
//! (`frames per second` × `ticks per frame`), a tick is a fixed time and tempo events
//! do not apply.

use std::path::Path;
use std::time::Duration;

use midly::{Format, MetaMessage, MidiMessage, Smf, Timing, TrackEventKind};

use crate::parse::Message;
use ictus_rt::Time;

/// The tempo before any tempo event: 500 000 µs per quarter note (120 beats a minute).
pub const DEFAULT_TEMPO: u32 = 500_000;

/// How [`Score::parse_with`] treats a file that is not what its header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strictness {
    /// Refuse it, naming the first problem's byte offset.
    Strict,
    /// Play what is there, listing the problems in [`Score::problems`].
    Lenient,
}

/// Where a file is not what its header says. Its `Display` is one line naming the byte
/// offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The byte of the file where it shows (for a file cut short: its length).
    pub offset: u64,
    /// What it is.
    pub kind: ProblemKind,
}

/// What a [`Problem`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// The file ends inside a chunk: its length says `declared` bytes of data, `present`
    /// are there. `track` is its track number, `None` for another chunk.
    ChunkCut {
        /// Where the chunk starts.
        chunk_at: u64,
        /// Its track number (0-based), if it is a track.
        track: Option<usize>,
        /// Data bytes its length promises.
        declared: u64,
        /// Data bytes there.
        present: u64,
    },
    /// The file ends inside the 8-byte header of a chunk starting at `chunk_at`.
    ChunkHeaderCut {
        /// Where the chunk starts.
        chunk_at: u64,
    },
    /// The header promises more tracks than the file has.
    MissingTracks {
        /// Tracks promised.
        declared: u16,
        /// Track chunks found.
        found: usize,
    },
    /// The file has more track chunks than its header says (the first extra one here).
    ExtraTracks {
        /// Tracks promised.
        declared: u16,
        /// Track chunks found.
        found: usize,
    },
    /// A format 0 file with other than one track.
    Format0Tracks {
        /// Tracks declared.
        declared: u16,
    },
    /// A second header chunk.
    SecondHeader,
    /// An event of `track` that cannot be read (cut short, or bytes that are no event).
    BadEvent {
        /// Track number.
        track: usize,
    },
    /// `track` ends without an End of Track event (the offset is where its chunk ends).
    NoEndOfTrack {
        /// Track number.
        track: usize,
    },
    /// `track` goes on after its End of Track event.
    AfterEndOfTrack {
        /// Track number.
        track: usize,
    },
    /// Bytes after the last chunk that are not a chunk.
    TrailingBytes {
        /// How many.
        len: u64,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self.offset;
        let track = |t: &Option<usize>| match t {
            Some(t) => format!("track {t}'s chunk"),
            None => "a chunk".to_owned(),
        };
        match &self.kind {
            ProblemKind::ChunkCut { chunk_at, track: t, declared, present } => write!(
                f,
                "cut short at byte {at}: {} (at byte {chunk_at}) promises {declared} bytes, {present} are there",
                track(t)
            ),
            ProblemKind::ChunkHeaderCut { chunk_at } => {
                write!(f, "cut short at byte {at}: inside the 8-byte header of a chunk starting at byte {chunk_at}")
            }
            ProblemKind::MissingTracks { declared, found } => {
                write!(f, "cut short at byte {at}: the header promises {declared} tracks, {found} are there")
            }
            ProblemKind::ExtraTracks { declared, found } => {
                write!(f, "at byte {at}: {found} track chunks where the header promises {declared}")
            }
            ProblemKind::Format0Tracks { declared } => {
                write!(f, "at byte {at}: a format 0 file has one track; its header says {declared}")
            }
            ProblemKind::SecondHeader => write!(f, "at byte {at}: a second header chunk"),
            ProblemKind::BadEvent { track } => {
                write!(f, "at byte {at}: track {track} has an event that cannot be read (cut short or garbled)")
            }
            ProblemKind::NoEndOfTrack { track } => {
                write!(f, "at byte {at}: track {track} ends without an End of Track event (cut short?)")
            }
            ProblemKind::AfterEndOfTrack { track } => {
                write!(f, "at byte {at}: track {track} goes on after its End of Track event")
            }
            ProblemKind::TrailingBytes { len } => {
                write!(f, "at byte {at}: {len} bytes after the last chunk are not a chunk")
            }
        }
    }
}

/// Why a MIDI file cannot be played.
#[derive(Debug, thiserror::Error)]
pub enum SmfError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A file's bytes are not a Standard MIDI File that can be played.
    #[error("{path}: {source}")]
    InFile {
        /// The file.
        path: String,
        /// Why.
        source: Box<SmfError>,
    },
    /// The bytes are not a Standard MIDI File at all, or its header chunk is cut short.
    #[error("not a valid Standard MIDI File: {0}")]
    Parse(String),
    /// The file is not what its header says ([`Strictness::Strict`]); leniently, what is
    /// there plays.
    #[error("not a valid Standard MIDI File: {0}")]
    Damaged(Problem),
    /// Format 2 files are refused.
    #[error("format 2 MIDI files (independent sequences) are not supported; formats 0 and 1 are")]
    Format2,
    /// The division (or a tempo map's ticks per quarter note) makes no time.
    #[error("the file's timing is invalid: {0}")]
    Timing(String),
    /// The file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// How ticks map to time: metrical (with a tempo map) or SMPTE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TempoMap {
    kind: TimingKind,
    /// Tempo segments: (start tick, µs per quarter note, start time in ns), sorted by
    /// tick, the first at tick 0.
    segments: Vec<(u64, u32, u128)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimingKind {
    Metrical {
        ticks_per_quarter: u16,
    },
    /// Nanoseconds per tick, as a fraction (num / den).
    Smpte {
        num: u128,
        den: u128,
    },
}

impl TempoMap {
    /// A metrical map: `ticks_per_quarter` and tempo changes `(tick, µs per quarter
    /// note)` in any order (a later change at the same tick wins; a zero tempo is
    /// ignored).
    pub fn metrical(
        ticks_per_quarter: u16,
        changes: impl IntoIterator<Item = (u64, u32)>,
    ) -> Result<TempoMap, SmfError> {
        if ticks_per_quarter == 0 {
            return Err(SmfError::Timing("zero ticks per quarter note".into()));
        }
        let mut changes: Vec<(u64, u32)> = changes.into_iter().filter(|&(_, us)| us > 0).collect();
        changes.sort_by_key(|&(t, _)| t);
        let mut segments: Vec<(u64, u32, u128)> = vec![(0, DEFAULT_TEMPO, 0)];
        for (tick, us) in changes {
            let &(t0, us0, ns0) = segments.last().unwrap_or(&(0, DEFAULT_TEMPO, 0));
            let ns = ns0 + Self::metrical_ns(tick - t0, us0, ticks_per_quarter);
            if tick == t0 {
                segments.pop();
            }
            segments.push((tick, us, ns));
        }
        Ok(TempoMap { kind: TimingKind::Metrical { ticks_per_quarter }, segments })
    }

    /// An SMPTE map: `frames_per_second` (24, 25, 29.97 as 29, or 30) × `ticks_per_frame`.
    pub fn smpte(frames_per_second: u8, ticks_per_frame: u8) -> Result<TempoMap, SmfError> {
        if ticks_per_frame == 0 || frames_per_second == 0 {
            return Err(SmfError::Timing("zero frames per second or ticks per frame".into()));
        }
        // 29.97 = 30/1.001 frames a second: a tick is 1.001e9 / (30 × tpf) ns.
        let (num, den) = if frames_per_second == 29 {
            (1_001_000_000u128, 30 * u128::from(ticks_per_frame))
        } else {
            (1_000_000_000u128, u128::from(frames_per_second) * u128::from(ticks_per_frame))
        };
        Ok(TempoMap { kind: TimingKind::Smpte { num, den }, segments: vec![(0, DEFAULT_TEMPO, 0)] })
    }

    fn metrical_ns(ticks: u64, us_per_quarter: u32, tpq: u16) -> u128 {
        u128::from(ticks) * u128::from(us_per_quarter) * 1000 / u128::from(tpq)
    }

    /// Ticks per quarter note (`None` for SMPTE timing).
    pub fn ticks_per_quarter(&self) -> Option<u16> {
        match self.kind {
            TimingKind::Metrical { ticks_per_quarter } => Some(ticks_per_quarter),
            TimingKind::Smpte { .. } => None,
        }
    }

    /// The tempo changes `(tick, µs per quarter note)`, the first at tick 0.
    pub fn changes(&self) -> Vec<(u64, u32)> {
        self.segments.iter().map(|&(t, us, _)| (t, us)).collect()
    }

    /// Time from the start of the score to tick `tick`.
    pub fn time_of(&self, tick: u64) -> Duration {
        let ns = match self.kind {
            TimingKind::Smpte { num, den } => u128::from(tick) * num / den,
            TimingKind::Metrical { ticks_per_quarter } => {
                let i = self.segments.partition_point(|&(t, _, _)| t <= tick).saturating_sub(1);
                let (t0, us, ns0) = self.segments[i];
                ns0 + Self::metrical_ns(tick - t0, us, ticks_per_quarter)
            }
        };
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// The score position of `tick` in quarter notes (beats), for conducting. SMPTE
    /// scores count seconds at 120 beats a minute.
    pub fn beats_of(&self, tick: u64) -> f64 {
        match self.kind {
            TimingKind::Metrical { ticks_per_quarter } => tick as f64 / f64::from(ticks_per_quarter),
            TimingKind::Smpte { .. } => self.time_of(tick).as_secs_f64() * 2.0,
        }
    }

    /// The tempo at `tick`, µs per quarter note.
    pub fn tempo_at(&self, tick: u64) -> u32 {
        let i = self.segments.partition_point(|&(t, _, _)| t <= tick).saturating_sub(1);
        self.segments[i].1
    }
}

impl SmfError {
    /// Whether [`Strictness::Lenient`] would play something of the file.
    pub fn lenient_would_play(&self) -> bool {
        match self {
            SmfError::Damaged(_) => true,
            SmfError::InFile { source, .. } => source.lenient_would_play(),
            _ => false,
        }
    }
}

/// The header chunk, checked.
struct Header {
    format: u8,
    tracks: u16,
    timing: TempoMapKind,
}

/// The division, before the tempo events are known.
enum TempoMapKind {
    Metrical(u16),
    Smpte(u8, u8),
}

/// One track chunk: its number, where its data starts, its data (what the file has of
/// it) and whether the file cut it short.
struct TrackChunk<'a> {
    index: usize,
    data_at: u64,
    data: &'a [u8],
    cut: bool,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The header chunk: what no reading can do without (`MThd`, 6 bytes of data, a known
/// format, a division that makes time).
fn read_header(bytes: &[u8]) -> Result<Header, SmfError> {
    match bytes.get(..4) {
        Some(b"MThd") => {}
        Some(b"RIFF") => {
            return Err(SmfError::Parse(
                "RIFF-wrapped MIDI (RMID) files are not supported; extract the standard MIDI data (MThd…)".into(),
            ))
        }
        _ if bytes.is_empty() => return Err(SmfError::Parse("the file is empty".into())),
        _ if b"MThd".starts_with(bytes) => {
            return Err(SmfError::Parse(format!("cut short at byte {}, inside its header chunk", bytes.len())))
        }
        _ => return Err(SmfError::Parse("not a MIDI file (it does not start with MThd)".into())),
    }
    if bytes.len() < 14 {
        return Err(SmfError::Parse(format!(
            "cut short at byte {}, inside its header chunk (14 bytes at least)",
            bytes.len()
        )));
    }
    let len = be32(bytes, 4);
    if len < 6 {
        return Err(SmfError::Parse(format!("at byte 4: a header chunk of {len} bytes (6 at least)")));
    }
    let format = match be16(bytes, 8) {
        0 => 0,
        1 => 1,
        2 => return Err(SmfError::Format2),
        f => return Err(SmfError::Parse(format!("at byte 8: format {f} (0, 1 and 2 exist)"))),
    };
    let tracks = be16(bytes, 10);
    let division = be16(bytes, 12);
    let timing = if division & 0x8000 != 0 {
        // The high byte is minus the frame rate, two's complement.
        let fps = -i16::from(bytes[12] as i8);
        let tpf = bytes[13];
        if !matches!(fps, 24 | 25 | 29 | 30) {
            return Err(SmfError::Timing(format!("at byte 12: {fps} SMPTE frames a second (24, 25, 29.97 or 30)")));
        }
        if tpf == 0 {
            return Err(SmfError::Timing("at byte 13: zero ticks per SMPTE frame".into()));
        }
        TempoMapKind::Smpte(fps as u8, tpf)
    } else {
        if division == 0 {
            return Err(SmfError::Timing("at byte 12: zero ticks per quarter note".into()));
        }
        TempoMapKind::Metrical(division)
    };
    Ok(Header { format, tracks, timing })
}

/// Every chunk after the header, each length checked against the file: the track
/// chunks, and the problems met on the way.
fn read_chunks<'a>(bytes: &'a [u8], header: &Header, problems: &mut Vec<Problem>) -> Vec<TrackChunk<'a>> {
    let end = bytes.len() as u64;
    let mut tracks = Vec::new();
    let mut pos = 8 + u64::from(be32(bytes, 4));
    if pos > end {
        problems.push(Problem {
            offset: end,
            kind: ProblemKind::ChunkCut { chunk_at: 0, track: None, declared: pos - 8, present: end - 8 },
        });
    }
    let mut extra_at = None;
    while pos < end {
        let at = pos as usize;
        if end - pos < 8 {
            let kind = if tracks.len() < usize::from(header.tracks) {
                ProblemKind::ChunkHeaderCut { chunk_at: pos }
            } else {
                ProblemKind::TrailingBytes { len: end - pos }
            };
            let offset = if matches!(kind, ProblemKind::ChunkHeaderCut { .. }) { end } else { pos };
            problems.push(Problem { offset, kind });
            break;
        }
        let id = &bytes[at..at + 4];
        let declared = u64::from(be32(bytes, at + 4));
        let data_at = pos + 8;
        let present = declared.min(end - data_at);
        let cut = present < declared;
        let index = tracks.len();
        match id {
            b"MTrk" => {
                if index == usize::from(header.tracks) {
                    extra_at = Some(pos);
                }
                tracks.push(TrackChunk {
                    index,
                    data_at,
                    data: &bytes[data_at as usize..(data_at + present) as usize],
                    cut,
                });
            }
            b"MThd" => problems.push(Problem { offset: pos, kind: ProblemKind::SecondHeader }),
            // Chunks of other kinds are skipped, as the standard asks.
            _ => {}
        }
        if cut {
            let track = (id == b"MTrk").then_some(index);
            problems
                .push(Problem { offset: end, kind: ProblemKind::ChunkCut { chunk_at: pos, track, declared, present } });
        }
        pos = data_at + declared;
    }
    let declared = header.tracks;
    if tracks.len() < usize::from(declared) {
        problems.push(Problem { offset: end, kind: ProblemKind::MissingTracks { declared, found: tracks.len() } });
    }
    if let Some(at) = extra_at {
        problems.push(Problem { offset: at, kind: ProblemKind::ExtraTracks { declared, found: tracks.len() } });
    }
    if header.format == 0 && declared != 1 {
        problems.push(Problem { offset: 10, kind: ProblemKind::Format0Tracks { declared } });
    }
    tracks
}

/// The events of one track chunk, read one at a time by midly up to the first that
/// cannot be read or the End of Track, with what is wrong.
fn read_events<'a>(chunk: &TrackChunk<'a>, problems: &mut Vec<Problem>) -> Vec<midly::TrackEvent<'a>> {
    let mut it = midly::EventIter::new(chunk.data);
    let mut events = Vec::new();
    let at = |unread: usize| chunk.data_at + (chunk.data.len() - unread) as u64;
    let track = chunk.index;
    loop {
        let unread = it.unread().len();
        match it.next() {
            Some(Ok(ev)) => {
                let end = matches!(ev.kind, TrackEventKind::Meta(MetaMessage::EndOfTrack));
                events.push(ev);
                if end {
                    if !it.unread().is_empty() {
                        let offset = at(it.unread().len());
                        problems.push(Problem { offset, kind: ProblemKind::AfterEndOfTrack { track } });
                    }
                    return events;
                }
            }
            // An event midly cannot read (built `strict`, it refuses an event cut short
            // — a length or a data byte missing — rather than take what is there).
            Some(Err(_)) | None if unread > 0 => {
                // A chunk the file cut short says so already.
                if !chunk.cut {
                    problems.push(Problem { offset: at(unread), kind: ProblemKind::BadEvent { track } });
                }
                return events;
            }
            Some(Err(_)) | None => {
                if !chunk.cut {
                    let offset = chunk.data_at + chunk.data.len() as u64;
                    problems.push(Problem { offset, kind: ProblemKind::NoEndOfTrack { track } });
                }
                return events;
            }
        }
    }
}

/// One event of a score.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Its tick from the start.
    pub tick: u64,
    /// Its track.
    pub track: usize,
    /// The message (its time is zero; see [`Score::timed`]).
    pub message: Message,
}

/// A score: every playable event of every track, merged in order, and the tempo map.
#[derive(Clone, Debug)]
pub struct Score {
    /// What is wrong with the file, in file order (empty unless read with
    /// [`Strictness::Lenient`]).
    pub problems: Vec<Problem>,
    /// 0 or 1.
    pub format: u8,
    /// How many tracks the file had.
    pub tracks: usize,
    /// The events, sorted by tick.
    pub events: Vec<Event>,
    /// The tempo map.
    pub tempo: TempoMap,
    /// Events skipped (escape packets, sysex that does not make a valid message).
    pub skipped: usize,
    /// The tick of the last event of any kind (end of track included).
    pub end_tick: u64,
}

impl Score {
    /// Read and parse the file at `path`, strictly.
    pub fn load(path: &Path) -> Result<Score, SmfError> {
        Score::load_with(path, Strictness::Strict)
    }

    /// Read and parse the file at `path`; errors name the file.
    pub fn load_with(path: &Path, strictness: Strictness) -> Result<Score, SmfError> {
        let name = || path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| SmfError::Read { path: name(), source })?;
        Score::parse_with(&bytes, strictness).map_err(|e| SmfError::InFile { path: name(), source: Box::new(e) })
    }

    /// Parse a Standard MIDI File, strictly: a file that is not what its header says is
    /// refused ([`SmfError::Damaged`], naming the byte offset).
    pub fn parse(bytes: &[u8]) -> Result<Score, SmfError> {
        Score::parse_with(bytes, Strictness::Strict)
    }

    /// Parse a Standard MIDI File; [`Strictness::Lenient`] plays what there is of a
    /// damaged one (see the module documentation).
    pub fn parse_with(bytes: &[u8], strictness: Strictness) -> Result<Score, SmfError> {
        // midly is not known to panic on a track chunk, but it is a parser of untrusted
        // bytes we did not write: a panic in it becomes an error.
        std::panic::catch_unwind(|| Score::parse_checked(bytes, strictness))
            .unwrap_or_else(|_| Err(SmfError::Parse("the MIDI event parser failed on this file".into())))
    }

    fn parse_checked(bytes: &[u8], strictness: Strictness) -> Result<Score, SmfError> {
        let header = read_header(bytes)?;
        let mut problems = Vec::new();
        let chunks = read_chunks(bytes, &header, &mut problems);
        let tracks: Vec<Vec<midly::TrackEvent<'_>>> = chunks.iter().map(|c| read_events(c, &mut problems)).collect();
        problems.sort_by_key(|p| p.offset);
        if strictness == Strictness::Strict {
            if let Some(p) = problems.first() {
                return Err(SmfError::Damaged(p.clone()));
            }
        }
        let format = header.format;
        let mut tempos = Vec::new();
        let mut events = Vec::new();
        let mut skipped = 0;
        let mut end_tick = 0u64;
        for (track, evs) in tracks.iter().enumerate() {
            let mut tick = 0u64;
            for ev in evs {
                tick = tick.saturating_add(u64::from(ev.delta.as_int()));
                end_tick = end_tick.max(tick);
                let bytes: Vec<u8> = match ev.kind {
                    TrackEventKind::Meta(MetaMessage::Tempo(us)) => {
                        tempos.push((tick, us.as_int()));
                        continue;
                    }
                    TrackEventKind::Meta(_) => continue,
                    TrackEventKind::Escape(_) => {
                        skipped += 1;
                        continue;
                    }
                    TrackEventKind::SysEx(data) => {
                        let mut b = Vec::with_capacity(data.len() + 2);
                        b.push(0xF0);
                        b.extend_from_slice(data);
                        if b.last() != Some(&0xF7) {
                            b.push(0xF7);
                        }
                        b
                    }
                    TrackEventKind::Midi { channel, message } => {
                        let ch = channel.as_int();
                        match message {
                            MidiMessage::NoteOff { key, vel } => vec![0x80 | ch, key.as_int(), vel.as_int()],
                            MidiMessage::NoteOn { key, vel } => vec![0x90 | ch, key.as_int(), vel.as_int()],
                            MidiMessage::Aftertouch { key, vel } => vec![0xA0 | ch, key.as_int(), vel.as_int()],
                            MidiMessage::Controller { controller, value } => {
                                vec![0xB0 | ch, controller.as_int(), value.as_int()]
                            }
                            MidiMessage::ProgramChange { program } => vec![0xC0 | ch, program.as_int()],
                            MidiMessage::ChannelAftertouch { vel } => vec![0xD0 | ch, vel.as_int()],
                            MidiMessage::PitchBend { bend } => {
                                let v = bend.0.as_int();
                                vec![0xE0 | ch, (v & 0x7F) as u8, (v >> 7) as u8]
                            }
                        }
                    }
                };
                match Message::from_bytes(&bytes, Time::ZERO) {
                    Ok(message) => events.push(Event { tick, track, message }),
                    Err(_) => skipped += 1,
                }
            }
        }
        // Stable: equal ticks keep track order, then order within the track.
        events.sort_by_key(|e| e.tick);
        let tempo = match header.timing {
            TempoMapKind::Metrical(tpq) => TempoMap::metrical(tpq, tempos)?,
            TempoMapKind::Smpte(fps, tpf) => TempoMap::smpte(fps, tpf)?,
        };
        Ok(Score { problems, format, tracks: tracks.len(), events, tempo, skipped, end_tick })
    }

    /// Every event with its time from the start of the score.
    pub fn timed(&self) -> Vec<(Duration, &Message)> {
        self.events.iter().map(|e| (self.tempo.time_of(e.tick), &e.message)).collect()
    }

    /// The score's length in time.
    pub fn duration(&self) -> Duration {
        self.tempo.time_of(self.end_tick)
    }
}

/// The demo piece's notes: `(start tick, key)`, each a quarter note long at 480 ticks a
/// quarter (channel 0, velocity 96), for tests to compare against.
pub const DEMO_TICKS_PER_QUARTER: u16 = 480;

/// The keys of the demo piece, in order: a C major scale up and down, then a chord.
pub const DEMO_MELODY: [u8; 15] = [60, 62, 64, 65, 67, 69, 71, 72, 71, 69, 67, 65, 64, 62, 60];

/// The demo piece as Standard MIDI File bytes: format 1, two tracks. Track 0 is the tempo
/// map (120 beats a minute, 90 from the ninth beat on); track 1 sets program 0 on channel
/// 0, plays [`DEMO_MELODY`] as quarter notes (note on velocity 96, note off velocity 0,
/// a sixteenth of a beat of silence between notes), then a C major chord of a half note,
/// with a short sysex (a GM "system on") at the start.
pub fn demo_bytes() -> Vec<u8> {
    use midly::num::{u15, u24, u28, u4, u7};
    use midly::{Header, TrackEvent};
    let ev = |delta: u32, kind: TrackEventKind<'static>| TrackEvent { delta: u28::new(delta), kind };
    let tpq = u32::from(DEMO_TICKS_PER_QUARTER);
    let tempo_track = vec![
        ev(0, TrackEventKind::Meta(MetaMessage::TrackName(b"ictus demo tempo"))),
        ev(0, TrackEventKind::Meta(MetaMessage::Tempo(u24::new(500_000)))),
        ev(8 * tpq, TrackEventKind::Meta(MetaMessage::Tempo(u24::new(666_667)))),
        ev(0, TrackEventKind::Meta(MetaMessage::EndOfTrack)),
    ];
    let midi = |delta: u32, message: MidiMessage| ev(delta, TrackEventKind::Midi { channel: u4::new(0), message });
    let gap = tpq / 16;
    let mut notes = vec![
        ev(0, TrackEventKind::SysEx(&[0x7E, 0x7F, 0x09, 0x01, 0xF7])),
        midi(0, MidiMessage::ProgramChange { program: u7::new(0) }),
    ];
    for &key in &DEMO_MELODY {
        notes.push(midi(0, MidiMessage::NoteOn { key: u7::new(key), vel: u7::new(96) }));
        notes.push(midi(tpq - gap, MidiMessage::NoteOff { key: u7::new(key), vel: u7::new(0) }));
        notes.push(midi(gap, MidiMessage::Controller { controller: u7::new(7), value: u7::new(100) }));
    }
    for (i, key) in [60u8, 64, 67].into_iter().enumerate() {
        let _ = i;
        notes.push(midi(0, MidiMessage::NoteOn { key: u7::new(key), vel: u7::new(80) }));
    }
    notes.push(midi(2 * tpq, MidiMessage::NoteOff { key: u7::new(60), vel: u7::new(0) }));
    notes.push(midi(0, MidiMessage::NoteOff { key: u7::new(64), vel: u7::new(0) }));
    notes.push(midi(0, MidiMessage::NoteOff { key: u7::new(67), vel: u7::new(0) }));
    notes.push(ev(0, TrackEventKind::Meta(MetaMessage::EndOfTrack)));
    let mut smf = Smf::new(Header::new(Format::Parallel, Timing::Metrical(u15::new(DEMO_TICKS_PER_QUARTER))));
    smf.tracks.push(tempo_track);
    smf.tracks.push(notes);
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = smf.write_std(&mut out);
    out
}

/// Write the demo piece to `path`.
pub fn write_demo(path: &Path) -> Result<(), SmfError> {
    std::fs::write(path, demo_bytes()).map_err(|source| SmfError::Write { path: path.display().to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Kind;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn ticks_to_time_with_tempo_changes() {
        // 480 tpq; 120 bpm, then 60 bpm at tick 960, then 240 bpm at tick 1440.
        let m = TempoMap::metrical(480, [(1440, 250_000), (960, 1_000_000)]).unwrap();
        assert_eq!(m.time_of(0), Duration::ZERO);
        assert_eq!(m.time_of(480), 500 * MS);
        assert_eq!(m.time_of(960), 1000 * MS);
        assert_eq!(m.time_of(1200), 1500 * MS);
        assert_eq!(m.time_of(1440), 2000 * MS);
        assert_eq!(m.time_of(1920), 2250 * MS);
        assert_eq!(m.tempo_at(1000), 1_000_000);
        assert_eq!(m.changes(), vec![(0, 500_000), (960, 1_000_000), (1440, 250_000)]);
    }

    #[test]
    fn a_tempo_at_tick_zero_replaces_the_default_and_the_last_at_a_tick_wins() {
        let m = TempoMap::metrical(96, [(0, 1_000_000), (96, 400_000), (96, 200_000)]).unwrap();
        assert_eq!(m.changes(), vec![(0, 1_000_000), (96, 200_000)]);
        assert_eq!(m.time_of(96), 1000 * MS);
        assert_eq!(m.time_of(192), 1200 * MS);
    }

    #[test]
    fn no_rounding_drift_over_long_scores() {
        // 7 ticks per quarter at 500 000 µs: 71 428.571… µs a tick; after a million
        // ticks the time is exact to the nanosecond (integer arithmetic per segment).
        let m = TempoMap::metrical(7, []).unwrap();
        assert_eq!(m.time_of(7_000_000), Duration::from_secs(500_000));
        assert_eq!(m.time_of(1), Duration::from_nanos(71_428_571));
    }

    #[test]
    fn smpte_ticks() {
        let m = TempoMap::smpte(25, 40).unwrap(); // 1000 ticks a second
        assert_eq!(m.time_of(1000), Duration::from_secs(1));
        let m = TempoMap::smpte(29, 1).unwrap();
        assert_eq!(m.time_of(30), Duration::from_nanos(1_001_000_000));
        assert!(TempoMap::smpte(25, 0).is_err());
        assert!(TempoMap::metrical(0, []).is_err());
    }

    #[test]
    fn the_demo_file_reads_back() {
        let s = Score::parse(&demo_bytes()).unwrap();
        assert_eq!(s.format, 1);
        assert_eq!(s.tracks, 2);
        assert_eq!(s.skipped, 0);
        let ons: Vec<u8> =
            s.events.iter().filter(|e| e.message.kind() == Kind::NoteOn).map(|e| e.message.bytes()[1]).collect();
        let mut expected = DEMO_MELODY.to_vec();
        expected.extend([60, 64, 67]);
        assert_eq!(ons, expected);
        assert_eq!(s.events[0].message.kind(), Kind::Sysex);
        // Beat 8 (the ninth note) starts at 4 s; after it, 666 667 µs a beat.
        let ninth = s.events.iter().filter(|e| e.message.kind() == Kind::NoteOn).nth(8).unwrap();
        assert_eq!(s.tempo.time_of(ninth.tick), Duration::from_secs(4));
        let tenth = s.events.iter().filter(|e| e.message.kind() == Kind::NoteOn).nth(9).unwrap();
        assert_eq!(s.tempo.time_of(tenth.tick), Duration::from_nanos(4_666_667_000));
    }

    #[test]
    fn bad_files_give_clear_errors() {
        assert!(matches!(Score::parse(b""), Err(SmfError::Parse(_))));
        assert!(matches!(Score::parse(b"RIFF nonsense"), Err(SmfError::Parse(_))));
        // Found by fuzzing: an SMPTE division of -128 frames a second (midly overflows).
        let crash = b"MThd\0\0\0\x06\0\0\0\x01\x80\x3c\0\0>\0`MTrk\0\x80<\0\0>\x12\0\0\xf0\x03\xff\xff\xff\xff\xe0\0\x9d\0\xff/\0";
        assert!(matches!(Score::parse(crash), Err(SmfError::Timing(_))));
        let mut f2 = demo_bytes();
        f2[9] = 2; // header format field
        assert!(matches!(Score::parse(&f2), Err(SmfError::Format2)));
        let mut zero_tpq = demo_bytes();
        zero_tpq[12] = 0;
        zero_tpq[13] = 0;
        assert!(Score::parse(&zero_tpq).is_err());
        let e = Score::load(Path::new("/nonexistent/x.mid")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.mid"), "{e}");
        // A truncated file is an error or a shorter score, never a panic.
        let full = demo_bytes();
        for n in 0..full.len() {
            let _ = Score::parse(&full[..n]);
        }
    }
}
