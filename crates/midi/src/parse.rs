//! The MIDI 1.0 byte stream: a parser that turns untrusted bytes into timestamped
//! [`Message`]s, and an [`Encoder`] that turns messages back into bytes.
//!
//! Pure: no system call, no clock. The caller passes each byte's arrival time, so tests
//! run on made-up times and the input server passes `CLOCK_MONOTONIC` readings.
//!
//! # What the parser does (MIDI 1.0 Detailed Specification, §§ "Data Format", "Running
//! Status", "System Real Time", "System Exclusive")
//!
//! - **Channel messages** (`8n`–`En`): note off/on, polyphonic pressure, control change,
//!   program change, channel pressure, pitch bend, with their 1 or 2 data bytes.
//! - **Running status**: after a channel message, data bytes with no status byte of
//!   their own reuse the last channel status. The delivered [`Message`] always has its
//!   status byte ([`Stats::running_status`] counts the ones supplied this way).
//!   Running status is cancelled by system exclusive and system common status bytes
//!   (including the undefined `F4`/`F5` and a stray `F7`), never by real-time bytes.
//! - **System common**: MTC quarter frame `F1`, song position `F2`, song select `F3`,
//!   tune request `F6`.
//! - **System exclusive**: `F0`, any number of data bytes, `F7`. A sysex is also ended by
//!   any other non-real-time status byte (which then starts its own message); it is then
//!   delivered as [`Kind::SysexUnterminated`], without an `F7`. Its length is bounded
//!   ([`Parser::with_max_sysex`]): data bytes past the bound are dropped and counted
//!   ([`Stats::sysex_overflow`], [`Message::overflow`]), and the `F7` is still kept.
//! - **Real-time** bytes (`F8` clock, `FA` start, `FB` continue, `FC` stop, `FE` active
//!   sensing, `FF` reset) may come anywhere, even between the bytes of a channel message
//!   or inside a sysex: each is delivered on its own, at once, and what it interrupted
//!   goes on as if it had not been there.
//! - **Dropped and counted**: data bytes with no status in force ([`Stats::stray_data`]),
//!   undefined status bytes `F4`, `F5`, `F9`, `FD` ([`Stats::undefined`]), an `F7` with no
//!   sysex open ([`Stats::stray_eox`]), and the bytes of a message cut short by a status
//!   byte ([`Stats::incomplete`]).
//!
//! Every byte is accounted for: at any point,
//! `bytes = Σ delivered lengths − running_status + dropped + held`
//! (see [`Stats::dropped`] and [`Parser::held`]); the property tests check it.
//!
//! # Timestamps
//!
//! A message's [`Message::time`] is the arrival time of its **first** byte on the wire
//! (its status byte, or its first data byte under running status; the `F0` of a sysex).
//! A message is therefore stamped with when its sender started it, independent of its
//! length (a three-byte message takes 640 µs more to finish at 31250 baud). Where bytes
//! arrive in batches (one `read` of several bytes), all of them get the batch's time.
//!
//! # Output
//!
//! [`Feed`], what [`Parser::feed`] returns, holds at most one message — except in one
//! case: a tune request (`F6`, a whole message in one byte) that ends an open sysex
//! yields the unterminated sysex and then the tune request.

use std::fmt;

use ictus_rt::Time;

/// The default bound on a system-exclusive message's length, `F0` and `F7` included.
pub const DEFAULT_MAX_SYSEX: usize = 64 * 1024;

/// The kinds of MIDI message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `8n key velocity`.
    NoteOff,
    /// `9n key velocity` (velocity 0 is, by convention, a note off).
    NoteOn,
    /// `An key pressure`: polyphonic key pressure (aftertouch).
    PolyPressure,
    /// `Bn controller value` (controllers 120–127 are the channel mode messages).
    ControlChange,
    /// `Cn program`.
    ProgramChange,
    /// `Dn pressure`: channel pressure (aftertouch).
    ChannelPressure,
    /// `En lsb msb`: pitch bend, 14 bits, centre `0x2000`.
    PitchBend,
    /// `F0 data… F7`: a complete system-exclusive message.
    Sysex,
    /// `F0 data…` ended by another status byte (or the end of the stream) instead of `F7`.
    SysexUnterminated,
    /// `F1 data`: MIDI time code quarter frame.
    TimeCodeQuarterFrame,
    /// `F2 lsb msb`: song position pointer.
    SongPosition,
    /// `F3 song`: song select.
    SongSelect,
    /// `F6`: tune request.
    TuneRequest,
    /// `F8`: timing clock (real-time).
    Clock,
    /// `FA`: start (real-time).
    Start,
    /// `FB`: continue (real-time).
    Continue,
    /// `FC`: stop (real-time).
    Stop,
    /// `FE`: active sensing (real-time).
    ActiveSensing,
    /// `FF`: system reset (real-time).
    Reset,
}

impl Kind {
    /// Every kind, in declaration order.
    pub const ALL: [Kind; 19] = [
        Kind::NoteOff,
        Kind::NoteOn,
        Kind::PolyPressure,
        Kind::ControlChange,
        Kind::ProgramChange,
        Kind::ChannelPressure,
        Kind::PitchBend,
        Kind::Sysex,
        Kind::SysexUnterminated,
        Kind::TimeCodeQuarterFrame,
        Kind::SongPosition,
        Kind::SongSelect,
        Kind::TuneRequest,
        Kind::Clock,
        Kind::Start,
        Kind::Continue,
        Kind::Stop,
        Kind::ActiveSensing,
        Kind::Reset,
    ];

    /// The snake-case name used in JSON (`"note_on"`, `"sysex"`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Kind::NoteOff => "note_off",
            Kind::NoteOn => "note_on",
            Kind::PolyPressure => "poly_pressure",
            Kind::ControlChange => "control_change",
            Kind::ProgramChange => "program_change",
            Kind::ChannelPressure => "channel_pressure",
            Kind::PitchBend => "pitch_bend",
            Kind::Sysex => "sysex",
            Kind::SysexUnterminated => "sysex_unterminated",
            Kind::TimeCodeQuarterFrame => "time_code_quarter_frame",
            Kind::SongPosition => "song_position",
            Kind::SongSelect => "song_select",
            Kind::TuneRequest => "tune_request",
            Kind::Clock => "clock",
            Kind::Start => "start",
            Kind::Continue => "continue",
            Kind::Stop => "stop",
            Kind::ActiveSensing => "active_sensing",
            Kind::Reset => "reset",
        }
    }

    /// The kind whose [`Kind::name`] is `name`.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// A channel voice or mode message (`8n`–`En`).
    pub const fn is_channel(self) -> bool {
        matches!(
            self,
            Kind::NoteOff
                | Kind::NoteOn
                | Kind::PolyPressure
                | Kind::ControlChange
                | Kind::ProgramChange
                | Kind::ChannelPressure
                | Kind::PitchBend
        )
    }

    /// A system-exclusive message, terminated or not: the paper's `getx` kind, as opposed
    /// to the "normal" messages of at most three bytes.
    pub const fn is_sysex(self) -> bool {
        matches!(self, Kind::Sysex | Kind::SysexUnterminated)
    }

    /// A system real-time message (one byte, `F8`–`FF`).
    pub const fn is_realtime(self) -> bool {
        matches!(self, Kind::Clock | Kind::Start | Kind::Continue | Kind::Stop | Kind::ActiveSensing | Kind::Reset)
    }

    /// A system common message (`F1`, `F2`, `F3`, `F6`).
    pub const fn is_common(self) -> bool {
        matches!(self, Kind::TimeCodeQuarterFrame | Kind::SongPosition | Kind::SongSelect | Kind::TuneRequest)
    }

    /// The kind a status byte starts, if it is a defined status byte.
    pub const fn of_status(status: u8) -> Option<Kind> {
        Some(match status {
            0x80..=0x8F => Kind::NoteOff,
            0x90..=0x9F => Kind::NoteOn,
            0xA0..=0xAF => Kind::PolyPressure,
            0xB0..=0xBF => Kind::ControlChange,
            0xC0..=0xCF => Kind::ProgramChange,
            0xD0..=0xDF => Kind::ChannelPressure,
            0xE0..=0xEF => Kind::PitchBend,
            0xF0 => Kind::Sysex,
            0xF1 => Kind::TimeCodeQuarterFrame,
            0xF2 => Kind::SongPosition,
            0xF3 => Kind::SongSelect,
            0xF6 => Kind::TuneRequest,
            0xF8 => Kind::Clock,
            0xFA => Kind::Start,
            0xFB => Kind::Continue,
            0xFC => Kind::Stop,
            0xFE => Kind::ActiveSensing,
            0xFF => Kind::Reset,
            _ => return None,
        })
    }

    /// How many data bytes follow the status byte, for the fixed-length kinds (`None`
    /// for system exclusive).
    pub const fn data_len(self) -> Option<usize> {
        Some(match self {
            Kind::NoteOff | Kind::NoteOn | Kind::PolyPressure | Kind::ControlChange | Kind::PitchBend => 2,
            Kind::SongPosition => 2,
            Kind::ProgramChange | Kind::ChannelPressure | Kind::TimeCodeQuarterFrame | Kind::SongSelect => 1,
            Kind::Sysex | Kind::SysexUnterminated => return None,
            _ => 0,
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A message's bytes: short ones in-line (at most three), system exclusive on the heap.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Bytes {
    Short { len: u8, buf: [u8; 3] },
    Long(Vec<u8>),
}

/// One MIDI message, validated, with its arrival time.
///
/// Its bytes always start with the status byte (also when the wire used running status)
/// and are always a well-formed message of its [`Kind`]: made only by the [`Parser`] or
/// by the checked constructors ([`Message::from_bytes`], [`Message::note_on`], …).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Message {
    time: Time,
    kind: Kind,
    bytes: Bytes,
    overflow: u64,
}

/// Why bytes are not one well-formed MIDI message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// No bytes at all.
    #[error("empty message")]
    Empty,
    /// The first byte is not a status byte.
    #[error("message starts with data byte {0:#04x}, not a status byte")]
    NoStatus(u8),
    /// The status byte is undefined (`F4`, `F5`, `F9`, `FD`) or a lone `F7`.
    #[error("status byte {0:#04x} starts no message")]
    Undefined(u8),
    /// Wrong number of data bytes for the kind.
    #[error("{kind} takes {expected} data bytes, got {got}")]
    Length {
        /// The kind of the status byte.
        kind: Kind,
        /// Data bytes it takes.
        expected: usize,
        /// Data bytes given.
        got: usize,
    },
    /// A status byte where a data byte should be.
    #[error("byte {index} ({byte:#04x}) of a {kind} message is not a data byte")]
    NotData {
        /// The kind of the message.
        kind: Kind,
        /// Where.
        index: usize,
        /// The byte.
        byte: u8,
    },
    /// A sysex longer than the bound.
    #[error("system exclusive message of {len} bytes is longer than the limit of {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// An argument out of range for a constructor (channel > 15, data > 127, …).
    #[error("{what} {value} out of range 0..={max}")]
    Range {
        /// The argument.
        what: &'static str,
        /// Its value.
        value: u32,
        /// Its largest valid value.
        max: u32,
    },
}

impl Message {
    fn short(time: Time, kind: Kind, bytes: &[u8]) -> Message {
        let mut buf = [0u8; 3];
        let len = bytes.len().min(3);
        buf[..len].copy_from_slice(&bytes[..len]);
        Message { time, kind, bytes: Bytes::Short { len: len as u8, buf }, overflow: 0 }
    }

    /// Check that `bytes` are exactly one well-formed message and make it, stamped `time`.
    ///
    /// A system-exclusive message must start with `F0`; it ends with `F7` (a
    /// [`Kind::Sysex`]) or not at all (a [`Kind::SysexUnterminated`]); its length is
    /// bounded by [`DEFAULT_MAX_SYSEX`].
    pub fn from_bytes(bytes: &[u8], time: Time) -> Result<Message, MessageError> {
        Message::from_bytes_bounded(bytes, time, DEFAULT_MAX_SYSEX)
    }

    /// [`Message::from_bytes`] with another bound on a sysex's length (`F0` and `F7`
    /// included), for receivers whose parser was made with [`Parser::with_max_sysex`].
    pub fn from_bytes_bounded(bytes: &[u8], time: Time, max_sysex: usize) -> Result<Message, MessageError> {
        let (&status, data) = bytes.split_first().ok_or(MessageError::Empty)?;
        if status < 0x80 {
            return Err(MessageError::NoStatus(status));
        }
        let kind = Kind::of_status(status).ok_or(MessageError::Undefined(status))?;
        if kind == Kind::Sysex {
            if bytes.len() > max_sysex {
                return Err(MessageError::TooLong { len: bytes.len(), max: max_sysex });
            }
            let (body, kind) = match data.split_last() {
                Some((&0xF7, body)) => (body, Kind::Sysex),
                _ => (data, Kind::SysexUnterminated),
            };
            if let Some(i) = body.iter().position(|&b| b >= 0x80) {
                return Err(MessageError::NotData { kind, index: i + 1, byte: body[i] });
            }
            return Ok(Message { time, kind, bytes: Bytes::Long(bytes.to_vec()), overflow: 0 });
        }
        let expected = kind.data_len().unwrap_or(0);
        if data.len() != expected {
            return Err(MessageError::Length { kind, expected, got: data.len() });
        }
        if let Some(i) = data.iter().position(|&b| b >= 0x80) {
            return Err(MessageError::NotData { kind, index: i + 1, byte: data[i] });
        }
        Ok(Message::short(time, kind, bytes))
    }

    fn channel_message(time: Time, status: u8, channel: u8, data: &[u32]) -> Result<Message, MessageError> {
        if channel > 15 {
            return Err(MessageError::Range { what: "channel", value: channel.into(), max: 15 });
        }
        let mut bytes = vec![status | channel];
        for &d in data {
            if d > 127 {
                return Err(MessageError::Range { what: "data byte", value: d, max: 127 });
            }
            bytes.push(d as u8);
        }
        Message::from_bytes(&bytes, time)
    }

    /// `9n key velocity`.
    pub fn note_on(channel: u8, key: u8, velocity: u8, time: Time) -> Result<Message, MessageError> {
        Message::channel_message(time, 0x90, channel, &[key.into(), velocity.into()])
    }

    /// `8n key velocity`.
    pub fn note_off(channel: u8, key: u8, velocity: u8, time: Time) -> Result<Message, MessageError> {
        Message::channel_message(time, 0x80, channel, &[key.into(), velocity.into()])
    }

    /// `Bn controller value`.
    pub fn control_change(channel: u8, controller: u8, value: u8, time: Time) -> Result<Message, MessageError> {
        Message::channel_message(time, 0xB0, channel, &[controller.into(), value.into()])
    }

    /// `Cn program`.
    pub fn program_change(channel: u8, program: u8, time: Time) -> Result<Message, MessageError> {
        Message::channel_message(time, 0xC0, channel, &[program.into()])
    }

    /// `En lsb msb`, `value` in `0..=0x3FFF` (`0x2000` is the centre).
    pub fn pitch_bend(channel: u8, value: u16, time: Time) -> Result<Message, MessageError> {
        if value > 0x3FFF {
            return Err(MessageError::Range { what: "pitch bend", value: value.into(), max: 0x3FFF });
        }
        Message::channel_message(time, 0xE0, channel, &[u32::from(value & 0x7F), u32::from(value >> 7)])
    }

    /// A one-byte real-time message of `kind` (`None` if `kind` is not real-time).
    pub fn realtime(kind: Kind, time: Time) -> Option<Message> {
        let status = match kind {
            Kind::Clock => 0xF8,
            Kind::Start => 0xFA,
            Kind::Continue => 0xFB,
            Kind::Stop => 0xFC,
            Kind::ActiveSensing => 0xFE,
            Kind::Reset => 0xFF,
            _ => return None,
        };
        Some(Message::short(time, kind, &[status]))
    }

    /// When its first byte arrived (or, for output, when it is to be sent).
    pub fn time(&self) -> Time {
        self.time
    }

    /// The same message at another time.
    pub fn with_time(mut self, time: Time) -> Message {
        self.time = time;
        self
    }

    /// Its kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Its bytes, status byte first (`F0 … F7` for a complete sysex).
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Short { len, buf } => &buf[..usize::from(*len)],
            Bytes::Long(v) => v,
        }
    }

    /// Its status byte.
    pub fn status(&self) -> u8 {
        self.bytes()[0]
    }

    /// The channel (0–15) of a channel message.
    pub fn channel(&self) -> Option<u8> {
        self.kind.is_channel().then(|| self.status() & 0x0F)
    }

    /// For a system-exclusive message, how many of its data bytes were dropped because it
    /// was longer than the parser's bound; zero otherwise.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// Append its bytes to `out` (status byte always included; see [`Encoder`] for
    /// running status).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.bytes());
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} [", self.time, self.kind)?;
        for (i, b) in self.bytes().iter().take(16).enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:02X}")?;
        }
        if self.bytes().len() > 16 {
            write!(f, " … ({} bytes)", self.bytes().len())?;
        }
        if self.overflow > 0 {
            write!(f, " +{} dropped", self.overflow)?;
        }
        f.write_str("]")
    }
}

/// What the parser has counted since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes fed.
    pub bytes: u64,
    /// Messages delivered.
    pub messages: u64,
    /// Messages whose status byte was supplied by running status.
    pub running_status: u64,
    /// Data bytes dropped because no status was in force.
    pub stray_data: u64,
    /// Undefined status bytes (`F4`, `F5`, `F9`, `FD`) dropped.
    pub undefined: u64,
    /// `F7` bytes dropped because no sysex was open.
    pub stray_eox: u64,
    /// Bytes of messages cut short by a status byte (or the end of the stream), dropped.
    pub incomplete: u64,
    /// Sysex data bytes dropped because the sysex was longer than the bound.
    pub sysex_overflow: u64,
    /// Sysex messages delivered as [`Kind::SysexUnterminated`].
    pub sysex_unterminated: u64,
}

impl Stats {
    /// Every byte dropped, for whatever reason.
    pub fn dropped(&self) -> u64 {
        self.stray_data + self.undefined + self.stray_eox + self.incomplete + self.sysex_overflow
    }
}

/// A message being assembled.
#[derive(Clone, Debug)]
enum State {
    Idle,
    /// A channel or system common message waiting for data bytes.
    Short {
        kind: Kind,
        buf: [u8; 3],
        have: u8,
        need: u8,
        time: Time,
        implied: bool,
    },
    /// A sysex: `buf` holds `F0` and the data bytes kept so far.
    Sysex {
        buf: Vec<u8>,
        time: Time,
        overflow: u64,
    },
}

/// What one byte produced: at most two messages, almost always at most one (see the
/// module documentation). An iterator; also see [`Feed::first`].
#[derive(Debug, Default)]
pub struct Feed {
    first: Option<Message>,
    second: Option<Message>,
}

impl Feed {
    /// The first message this byte produced, if any, dropping a second one. Use the
    /// iterator to see all (only a tune request that ends a sysex makes two).
    pub fn first(self) -> Option<Message> {
        self.first
    }

    /// No message.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn push(&mut self, m: Message) {
        if self.first.is_none() {
            self.first = Some(m);
        } else {
            self.second = Some(m);
        }
    }
}

impl Iterator for Feed {
    type Item = Message;
    fn next(&mut self) -> Option<Message> {
        self.first.take().or_else(|| self.second.take())
    }
}

/// The MIDI byte-stream parser. See the module documentation.
#[derive(Clone, Debug)]
pub struct Parser {
    state: State,
    /// The channel status byte in force for running status.
    running: Option<u8>,
    max_sysex: usize,
    stats: Stats,
}

impl Default for Parser {
    fn default() -> Parser {
        Parser::new()
    }
}

impl Parser {
    /// A parser with the default sysex bound ([`DEFAULT_MAX_SYSEX`]).
    pub fn new() -> Parser {
        Parser::with_max_sysex(DEFAULT_MAX_SYSEX)
    }

    /// A parser that keeps at most `max` bytes of a sysex, `F0` and `F7` included (at
    /// least 2: a bound below that is raised to 2).
    pub fn with_max_sysex(max: usize) -> Parser {
        Parser { state: State::Idle, running: None, max_sysex: max.max(2), stats: Stats::default() }
    }

    /// The sysex bound.
    pub fn max_sysex(&self) -> usize {
        self.max_sysex
    }

    /// What has been counted so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Wire bytes held in a message not yet complete (they are neither delivered nor
    /// dropped yet).
    pub fn held(&self) -> u64 {
        match &self.state {
            State::Idle => 0,
            State::Short { have, implied, .. } => u64::from(*have) + u64::from(!*implied),
            State::Sysex { buf, .. } => buf.len() as u64,
        }
    }

    /// The channel status in force for running status, if any.
    pub fn running_status(&self) -> Option<u8> {
        self.running
    }

    fn deliver(&mut self, out: &mut Feed, m: Message) {
        self.stats.messages += 1;
        out.push(m);
    }

    /// Feed one byte that arrived at `time`; returns what it completed.
    pub fn feed(&mut self, byte: u8, time: Time) -> Feed {
        let mut out = Feed::default();
        self.stats.bytes += 1;
        match byte {
            0xF8..=0xFF => match Kind::of_status(byte) {
                Some(kind) => {
                    let m = Message::short(time, kind, &[byte]);
                    self.deliver(&mut out, m);
                }
                None => self.stats.undefined += 1,
            },
            0x80..=0xF7 => {
                // A status byte ends whatever was being assembled.
                match std::mem::replace(&mut self.state, State::Idle) {
                    State::Idle => {}
                    State::Short { have, implied, .. } => {
                        self.stats.incomplete += u64::from(have) + u64::from(!implied);
                    }
                    State::Sysex { mut buf, time: t0, overflow } => {
                        if byte == 0xF7 {
                            buf.push(0xF7);
                            let m = Message { time: t0, kind: Kind::Sysex, bytes: Bytes::Long(buf), overflow };
                            self.deliver(&mut out, m);
                            return out;
                        }
                        self.stats.sysex_unterminated += 1;
                        let m = Message { time: t0, kind: Kind::SysexUnterminated, bytes: Bytes::Long(buf), overflow };
                        self.deliver(&mut out, m);
                    }
                }
                self.start(byte, time, &mut out);
            }
            _ => self.data(byte, time, &mut out),
        }
        out
    }

    /// A status byte (not real-time) with nothing open.
    fn start(&mut self, status: u8, time: Time, out: &mut Feed) {
        if (0x80..=0xEF).contains(&status) {
            self.running = Some(status);
        } else {
            // System exclusive and system common (defined or not) cancel running status.
            self.running = None;
        }
        match Kind::of_status(status) {
            Some(Kind::Sysex) => {
                let mut buf = Vec::with_capacity(16);
                buf.push(0xF0);
                self.state = State::Sysex { buf, time, overflow: 0 };
            }
            Some(Kind::TuneRequest) => {
                let m = Message::short(time, Kind::TuneRequest, &[status]);
                self.deliver(out, m);
            }
            Some(kind) => {
                let need = kind.data_len().unwrap_or(0) as u8;
                self.state = State::Short { kind, buf: [status, 0, 0], have: 0, need, time, implied: false };
            }
            None if status == 0xF7 => self.stats.stray_eox += 1,
            None => self.stats.undefined += 1,
        }
    }

    /// A data byte.
    fn data(&mut self, byte: u8, time: Time, out: &mut Feed) {
        match &mut self.state {
            State::Sysex { buf, overflow, .. } => {
                // Keep room for the F7.
                if buf.len() + 1 < self.max_sysex {
                    buf.push(byte);
                } else {
                    *overflow += 1;
                    self.stats.sysex_overflow += 1;
                }
                return;
            }
            State::Short { buf, have, need, .. } => {
                *have += 1;
                buf[usize::from(*have)] = byte;
                if *have < *need {
                    return;
                }
            }
            State::Idle => match self.running {
                Some(status) => {
                    let kind = Kind::of_status(status).unwrap_or(Kind::NoteOn);
                    let need = kind.data_len().unwrap_or(0) as u8;
                    self.state = State::Short { kind, buf: [status, byte, 0], have: 1, need, time, implied: true };
                    if need > 1 {
                        return;
                    }
                }
                None => {
                    self.stats.stray_data += 1;
                    return;
                }
            },
        }
        // A short message is complete.
        if let State::Short { kind, buf, have, time, implied, .. } = std::mem::replace(&mut self.state, State::Idle) {
            if implied {
                self.stats.running_status += 1;
            }
            let m = Message::short(time, kind, &buf[..=usize::from(have)]);
            self.deliver(out, m);
        }
    }

    /// Feed `bytes` that all arrived at `time`, appending what they complete to `out`.
    pub fn feed_slice(&mut self, bytes: &[u8], time: Time, out: &mut Vec<Message>) {
        for &b in bytes {
            out.extend(self.feed(b, time));
        }
    }

    /// The end of the stream: an open sysex is delivered as [`Kind::SysexUnterminated`];
    /// the bytes of an incomplete short message are dropped (counted as
    /// [`Stats::incomplete`]). Running status is forgotten.
    pub fn finish(&mut self) -> Option<Message> {
        self.running = None;
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Idle => None,
            State::Short { have, implied, .. } => {
                self.stats.incomplete += u64::from(have) + u64::from(!implied);
                None
            }
            State::Sysex { buf, time, overflow } => {
                self.stats.sysex_unterminated += 1;
                self.stats.messages += 1;
                Some(Message { time, kind: Kind::SysexUnterminated, bytes: Bytes::Long(buf), overflow })
            }
        }
    }
}

/// Parse a whole buffer at once, byte `i` arriving at `time_of(i)`, and finish the
/// stream. Returns the messages and the counts.
pub fn parse_all(bytes: &[u8], mut time_of: impl FnMut(usize) -> Time) -> (Vec<Message>, Stats) {
    let mut p = Parser::new();
    let mut out = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        out.extend(p.feed(b, time_of(i)));
    }
    out.extend(p.finish());
    (out, p.stats())
}

/// Messages to bytes, optionally with running status.
///
/// With running status on, a channel message whose status byte equals the last one
/// written is written without it. System exclusive and system common messages cancel
/// running status (as they do in the receiver); real-time messages do not. An
/// [`Kind::SysexUnterminated`] is written as it is: the next status byte ends it.
#[derive(Clone, Debug, Default)]
pub struct Encoder {
    running_status: bool,
    last: Option<u8>,
}

impl Encoder {
    /// An encoder that writes every status byte.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// An encoder that uses running status.
    pub fn with_running_status() -> Encoder {
        Encoder { running_status: true, last: None }
    }

    /// Forget the running status (e.g. after the line was idle, or another writer
    /// shares it).
    pub fn reset(&mut self) {
        self.last = None;
    }

    /// Append `m`'s bytes to `out`.
    pub fn encode(&mut self, m: &Message, out: &mut Vec<u8>) {
        let bytes = m.bytes();
        let status = bytes[0];
        if m.kind.is_channel() {
            if self.running_status && self.last == Some(status) {
                out.extend_from_slice(&bytes[1..]);
            } else {
                out.extend_from_slice(bytes);
            }
            self.last = Some(status);
        } else {
            if !m.kind.is_realtime() {
                self.last = None;
            }
            out.extend_from_slice(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Time {
        Time::from_nanos(n)
    }

    fn parse(bytes: &[u8]) -> (Vec<Message>, Stats) {
        parse_all(bytes, |i| t(i as u64))
    }

    fn kinds_bytes(ms: &[Message]) -> Vec<(Kind, Vec<u8>)> {
        ms.iter().map(|m| (m.kind(), m.bytes().to_vec())).collect()
    }

    #[test]
    fn channel_messages_and_running_status() {
        let (ms, st) = parse(&[0x90, 60, 100, 62, 101, 0xC3, 5, 6, 0x80, 60, 0]);
        assert_eq!(
            kinds_bytes(&ms),
            vec![
                (Kind::NoteOn, vec![0x90, 60, 100]),
                (Kind::NoteOn, vec![0x90, 62, 101]),
                (Kind::ProgramChange, vec![0xC3, 5]),
                (Kind::ProgramChange, vec![0xC3, 6]),
                (Kind::NoteOff, vec![0x80, 60, 0]),
            ]
        );
        assert_eq!(st.running_status, 2);
        assert_eq!(st.dropped(), 0);
        // Timestamps are the first byte's: the running-status note starts at byte 3.
        assert_eq!(ms[1].time(), t(3));
        assert_eq!(ms[3].time(), t(7));
        assert_eq!(ms[2].channel(), Some(3));
    }

    #[test]
    fn realtime_inside_a_channel_message_and_a_sysex() {
        let (ms, st) = parse(&[0x90, 0xF8, 60, 0xFE, 100, 0xF0, 1, 0xFA, 2, 0xF7]);
        assert_eq!(
            kinds_bytes(&ms),
            vec![
                (Kind::Clock, vec![0xF8]),
                (Kind::ActiveSensing, vec![0xFE]),
                (Kind::NoteOn, vec![0x90, 60, 100]),
                (Kind::Start, vec![0xFA]),
                (Kind::Sysex, vec![0xF0, 1, 2, 0xF7]),
            ]
        );
        assert_eq!(ms[0].time(), t(1));
        assert_eq!(ms[2].time(), t(0));
        assert_eq!(ms[4].time(), t(5));
        assert_eq!(st.dropped(), 0);
    }

    #[test]
    fn sysex_ended_by_a_status_byte() {
        let (ms, st) = parse(&[0xF0, 1, 2, 0x90, 60, 100]);
        assert_eq!(
            kinds_bytes(&ms),
            vec![(Kind::SysexUnterminated, vec![0xF0, 1, 2]), (Kind::NoteOn, vec![0x90, 60, 100])]
        );
        assert_eq!(st.sysex_unterminated, 1);
        // A tune request ending a sysex: the only byte that yields two messages.
        let mut p = Parser::new();
        p.feed(0xF0, t(0));
        let two: Vec<_> = p.feed(0xF6, t(1)).collect();
        assert_eq!(kinds_bytes(&two), vec![(Kind::SysexUnterminated, vec![0xF0]), (Kind::TuneRequest, vec![0xF6])]);
        // End of stream.
        let (ms, _) = parse(&[0xF0, 7]);
        assert_eq!(kinds_bytes(&ms), vec![(Kind::SysexUnterminated, vec![0xF0, 7])]);
    }

    #[test]
    fn system_common_cancels_running_status() {
        let (ms, st) = parse(&[0x90, 60, 100, 0xF2, 1, 2, 61, 100, 0xF1, 3, 0xF3, 4, 0xF6]);
        assert_eq!(
            kinds_bytes(&ms),
            vec![
                (Kind::NoteOn, vec![0x90, 60, 100]),
                (Kind::SongPosition, vec![0xF2, 1, 2]),
                (Kind::TimeCodeQuarterFrame, vec![0xF1, 3]),
                (Kind::SongSelect, vec![0xF3, 4]),
                (Kind::TuneRequest, vec![0xF6]),
            ]
        );
        assert_eq!(st.stray_data, 2);
    }

    #[test]
    fn drops_are_counted() {
        let (ms, st) = parse(&[5, 6, 0xF4, 0x90, 0xF5, 1, 0xF9, 0xFD, 0xF7, 0x90, 60, 0xB0]);
        assert!(ms.is_empty(), "{ms:?}");
        assert_eq!(st.stray_data, 3);
        assert_eq!(st.undefined, 4);
        assert_eq!(st.stray_eox, 1);
        // `90` cut by `F5`; `90 3C` cut by `B0`; `B0` cut by the end.
        assert_eq!(st.incomplete, 4);
        assert_eq!(st.dropped(), 12);
        assert_eq!(st.bytes, 12);
    }

    #[test]
    fn sysex_bound() {
        let mut p = Parser::with_max_sysex(4);
        let mut out = Vec::new();
        p.feed_slice(&[0xF0, 1, 2, 3, 4, 5, 0xF7], t(9), &mut out);
        assert_eq!(kinds_bytes(&out), vec![(Kind::Sysex, vec![0xF0, 1, 2, 0xF7])]);
        assert_eq!(out[0].overflow(), 3);
        assert_eq!(p.stats().sysex_overflow, 3);
    }

    #[test]
    fn constructors_check_their_arguments() {
        assert!(Message::note_on(16, 60, 1, t(0)).is_err());
        assert!(Message::note_on(0, 128, 1, t(0)).is_err());
        assert_eq!(Message::pitch_bend(1, 0x2000, t(0)).unwrap().bytes(), &[0xE1, 0, 0x40]);
        assert_eq!(
            Message::from_bytes(&[0x90, 1], t(0)),
            Err(MessageError::Length { kind: Kind::NoteOn, expected: 2, got: 1 })
        );
        assert_eq!(Message::from_bytes(&[0xF4], t(0)), Err(MessageError::Undefined(0xF4)));
        assert_eq!(Message::from_bytes(&[0x10], t(0)), Err(MessageError::NoStatus(0x10)));
        assert!(Message::from_bytes(&[0xF0, 1, 0x90, 0xF7], t(0)).is_err());
        assert_eq!(Message::from_bytes(&[0xF0, 1, 0xF7], t(0)).unwrap().kind(), Kind::Sysex);
        assert_eq!(Message::from_bytes(&[0xF0, 1], t(0)).unwrap().kind(), Kind::SysexUnterminated);
        let long = [&[0xF0][..], &[1; 10][..], &[0xF7][..]].concat();
        assert!(Message::from_bytes_bounded(&long, t(0), 12).is_ok());
        assert_eq!(Message::from_bytes_bounded(&long, t(0), 11), Err(MessageError::TooLong { len: 12, max: 11 }));
        for k in Kind::ALL {
            assert_eq!(Kind::from_name(k.name()), Some(k));
        }
    }

    #[test]
    fn encoder_running_status() {
        let ms = [
            Message::note_on(0, 60, 100, t(0)).unwrap(),
            Message::realtime(Kind::Clock, t(0)).unwrap(),
            Message::note_on(0, 62, 100, t(0)).unwrap(),
            Message::from_bytes(&[0xF6], t(0)).unwrap(),
            Message::note_on(0, 64, 100, t(0)).unwrap(),
        ];
        let mut e = Encoder::with_running_status();
        let mut out = Vec::new();
        for m in &ms {
            e.encode(m, &mut out);
        }
        assert_eq!(out, vec![0x90, 60, 100, 0xF8, 62, 100, 0xF6, 0x90, 64, 100]);
        let (back, st) = parse(&out);
        assert_eq!(kinds_bytes(&back), kinds_bytes(&ms));
        assert_eq!(st.running_status, 1);
    }
}
