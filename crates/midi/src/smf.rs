//! Standard MIDI Files: reading a score (formats 0 and 1), its tempo map, and the small
//! demo file ictus makes itself.
//!
//! Parsing is done by the `midly` crate (its lenient default: it tolerates the common
//! defects of real files, such as a missing end-of-track). A [`Score`] keeps every
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
    /// The bytes are not a Standard MIDI File.
    #[error("not a valid Standard MIDI File: {0}")]
    Parse(String),
    /// Format 2 files are refused.
    #[error("format 2 MIDI files (independent sequences) are not supported; formats 0 and 1 are")]
    Format2,
    /// Ticks per quarter note of zero.
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

/// What `midly` does not check before it trips over it: the file must be a plain SMF
/// (`MThd` first; RIFF-wrapped RMID files are refused), and no `MThd` chunk — midly reads
/// every one it meets, not only the first — may have an SMPTE division whose frame-rate
/// byte is -128 (midly 0.5 negates it and overflows; found by the `midi_smf` fuzz target).
/// The chunks are walked as midly walks them: id, big-endian length, data (cut short at
/// the end of the file).
fn check_header(bytes: &[u8]) -> Result<(), SmfError> {
    match bytes.get(..4) {
        Some(b"MThd") => {}
        Some(b"RIFF") => {
            return Err(SmfError::Parse(
                "RIFF-wrapped MIDI (RMID) files are not supported; extract the standard MIDI data (MThd…)".into(),
            ))
        }
        _ => return Err(SmfError::Parse("not a MIDI file (it does not start with MThd)".into())),
    }
    let mut rest = bytes;
    while rest.len() >= 8 {
        let (head, after) = rest.split_at(8);
        let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let data = &after[..len.min(after.len())];
        if &head[..4] == b"MThd" && data.get(4) == Some(&0x80) {
            return Err(SmfError::Timing("SMPTE division with frame rate -128".into()));
        }
        rest = &after[data.len()..];
    }
    Ok(())
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
    /// Read and parse the file at `path`.
    pub fn load(path: &Path) -> Result<Score, SmfError> {
        let bytes =
            std::fs::read(path).map_err(|source| SmfError::Read { path: path.display().to_string(), source })?;
        Score::parse(&bytes)
    }

    /// Parse a Standard MIDI File.
    pub fn parse(bytes: &[u8]) -> Result<Score, SmfError> {
        check_header(bytes)?;
        // midly is not known to panic on anything `check_header` lets through, but it is
        // a parser of untrusted bytes we did not write: a panic in it becomes an error.
        let parsed = std::panic::catch_unwind(|| Smf::parse(bytes))
            .map_err(|_| SmfError::Parse("the MIDI file parser failed on this file".into()))?;
        let smf = parsed.map_err(|e| SmfError::Parse(e.to_string()))?;
        let format = match smf.header.format {
            Format::SingleTrack => 0,
            Format::Parallel => 1,
            Format::Sequential => return Err(SmfError::Format2),
        };
        let mut tempos = Vec::new();
        let mut events = Vec::new();
        let mut skipped = 0;
        let mut end_tick = 0u64;
        for (track, evs) in smf.tracks.iter().enumerate() {
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
        let tempo = match smf.header.timing {
            Timing::Metrical(tpq) => TempoMap::metrical(tpq.as_int(), tempos)?,
            Timing::Timecode(fps, tpf) => TempoMap::smpte(fps.as_int(), tpf)?,
        };
        Ok(Score { format, tracks: smf.tracks.len(), events, tempo, skipped, end_tick })
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
