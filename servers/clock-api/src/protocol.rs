//! The clock service's two interfaces, declared once with `#[ictus_idl::interface]`,
//! and the alarm message the server sends.
//!
//! # Ports and interfaces
//!
//! The paper's clock (000 §3.1) answers on two ports. The **clock port** serves
//! [`Clock`] (ids 4100–4104): read the time, sleep, set and cancel alarms, read the
//! resolution. The **clock-control port** serves [`Clock`] *and* [`ClockControl`]
//! (ids 4300–4302): set the alarm resolution, set the per-client quota, read the
//! server's counters. A [`ClockControl`] request that arrives on the clock port is
//! refused with `MIG_BAD_ID`, as if the method did not exist: only holders of the
//! control port can change the clock's state ("normal actions … can be performed with
//! either port").
//!
//! Why 4300 and not 4200: a reply's id is its request's plus 100, so the clock's
//! replies are 4200–4204; keeping the control interface's requests off that range
//! means no id is both a request and a reply within the clock service. (The name
//! server's replies, 4100–4104, do coincide with the clock's requests; they never
//! travel to the same ports.)
//!
//! | id | method | in-line data | rights |
//! | --- | --- | --- | --- |
//! | 4100 | [`Clock::read`] | empty | none |
//! | 4101 | [`Clock::sleep`] | a [`WireWhen`] | none (reply right: the caller's) |
//! | 4102 | [`Clock::set_alarm`] | a [`WireWhen`], a `u64` tag | one send or send-once right: where the alarm goes |
//! | 4103 | [`Clock::cancel_alarm`] | a `u64` alarm id | none |
//! | 4104 | [`Clock::resolution`] | empty | none |
//! | 4300 | [`ClockControl::set_resolution`] | a [`WireTime`] | none |
//! | 4301 | [`ClockControl::stats`] | empty | none |
//! | 4302 | [`ClockControl::set_client_quota`] | a `u32` | none |
//! | 4190 | the [`AlarmMessage`], server → alarm port | 40 bytes, below | none |
//!
//! # Times on the wire
//!
//! A time or interval is the paper's `timespec` ([`WireTime`]): seconds as a `u64` LE,
//! nanoseconds as a `u32` LE (the 12-byte form of [`ictus_rt::Timespec`]). Absolute
//! times count from boot (`CLOCK_MONOTONIC`). [`WireWhen`] is a tag byte (0: absolute,
//! 1: relative to when the server received the request) and a [`WireTime`]. The bytes
//! decode into any value; the methods then check it, so a nanoseconds field ≥ 10⁹ or
//! a time past 584 years is refused with [`ClockError::InvalidTime`] (`InvalidValue`),
//! not silently normalised. A tag other than 0 or 1 does not decode
//! (`MIG_BAD_ARGUMENTS`).
//!
//! # Sleeping
//!
//! [`Clock::sleep`] is a routine whose reply is deferred: the server keeps the reply
//! right and answers when the time is due (rounded up to the resolution), with the
//! time it sent the reply. A client that dies while it sleeps is noticed through a
//! dead-name notification on the reply right, and its entry is dropped at once.
//!
//! # Alarms
//!
//! [`Clock::set_alarm`] takes the port to notify as a send right (copied, made or
//! moved; kept by the server until the alarm goes off or is cancelled) or a send-once
//! right (used up by the alarm). It returns the alarm's id and the absolute time
//! requested. When the alarm is due the server sends one [`AlarmMessage`] to the port,
//! without waiting: if the port's queue is full the alarm is dropped and counted. If
//! the port dies first (its receiver exits, even by `kill -9`), the dead-name
//! notification the server holds for it drops every alarm for that port.
//!
//! Alarms and sleeps count against a **per-client quota** (clients are told apart by
//! the kernel-verified pid of the sender; 256 by default, [`ClockControl::set_client_quota`]
//! changes it) and a global limit ([`MAX_PENDING`]).
//!
//! A cancelled alarm's right is released: a send-once right destroyed unused makes the
//! nucleus send its port the usual send-once notification.
//!
//! [`Clock::cancel_alarm`] succeeds for the task that set the alarm (same pid and uid)
//! or any request on the control port; others get [`ClockError::NotOwner`]. Alarm ids
//! are never reused, so a stale id finds nothing ([`ClockError::NoSuchAlarm`]).
//!
//! # Errors
//!
//! | [`ClockError`] | return code |
//! | --- | --- |
//! | `InvalidTime` | `InvalidValue` (18) |
//! | `BadResolution` | `InvalidArgument` (4) |
//! | `QuotaExceeded` | `ResourceShortage` (6) |
//! | `Full` | `NoSpace` (3) |
//! | `NoSuchAlarm` | `InvalidName` (15) |
//! | `NotOwner` | `NoAccess` (8) |
//! | `DeadPort` | `InvalidRight` (17) |
//! | `NotHere` | `InvalidCapability` (20) |

use std::fmt;
use std::time::Duration;

use ictus_abi::ReturnCode;
use ictus_idl::{Context, Decode, DecodeError, Decoder, Encode, EncodeError, Encoder, RemoteError};
use ictus_idl::{SendOnceRight, SendRight};
use ictus_ipc::{Message, Name, Received, RightKind};
use ictus_rt::{Time, Timespec, When};

/// The name the clock server registers its clock port under with the name server.
pub const SERVICE_NAME: &str = "clock";
/// The message id of an [`AlarmMessage`].
pub const ALARM_MESSAGE: i32 = 4190;
/// The most alarms and sleeps the server holds at once, all clients together.
pub const MAX_PENDING: usize = 16_384;
/// The per-client quota of pending alarms and sleeps a server starts with.
pub const DEFAULT_CLIENT_QUOTA: u32 = 256;
/// The largest per-client quota the control port may set.
pub const MAX_CLIENT_QUOTA: u32 = MAX_PENDING as u32;
/// The coarsest resolution the control port may set.
pub const MAX_RESOLUTION: Duration = Duration::from_secs(1);

/// The clock port's interface (and, with [`ClockControl`], the control port's).
#[ictus_idl::interface(id = 4100)]
pub trait Clock {
    /// The time since boot (`CLOCK_MONOTONIC`) and the wall time (`CLOCK_REALTIME`,
    /// since the Unix epoch), read together.
    #[id(0)]
    fn read(&self) -> Result<(WireTime, WireTime), ClockError>;

    /// Suspend the caller until `when`; the reply (the time since boot at which the
    /// server sent it) comes when the time is due. Served by the clock server's loop,
    /// which defers the reply; an implementation that cannot defer answers `NotHere`.
    #[id(1)]
    fn sleep(&self, cx: &Context, when: WireWhen) -> Result<WireTime, ClockError>;

    /// Send an [`AlarmMessage`] carrying `tag` to `port` at `when`. Returns the alarm's
    /// id and the absolute time requested.
    #[id(2)]
    fn set_alarm(&self, cx: &Context, when: WireWhen, port: AlarmPort, tag: u64)
        -> Result<(u64, WireTime), ClockError>;

    /// Cancel a pending alarm (set by the caller, or any alarm through the control
    /// port).
    #[id(3)]
    fn cancel_alarm(&self, cx: &Context, alarm: u64) -> Result<(), ClockError>;

    /// The alarm resolution (zero: exact).
    #[id(4)]
    fn resolution(&self) -> Result<WireTime, ClockError>;
}

/// The clock-control port's own interface: what changes the clock's state.
#[ictus_idl::interface(id = 4300)]
pub trait ClockControl {
    /// Set the alarm resolution (zero: exact; at most [`MAX_RESOLUTION`]); returns the
    /// previous one. Applies to pending alarms and sleeps too: each is due at the first
    /// multiple of the resolution (counted from boot) at or after its requested time.
    #[id(0)]
    fn set_resolution(&self, resolution: WireTime) -> Result<WireTime, ClockError>;

    /// The server's counters.
    #[id(1)]
    fn stats(&self) -> Result<ClockStats, ClockError>;

    /// Set the per-client quota of pending alarms and sleeps (1 to
    /// [`MAX_CLIENT_QUOTA`]); returns the previous one. Pending requests over a new,
    /// lower quota are kept.
    #[id(2)]
    fn set_client_quota(&self, quota: u32) -> Result<u32, ClockError>;
}

/// Read the time and both clocks.
pub const READ: i32 = ClockClient::READ;
/// Sleep until a time.
pub const SLEEP: i32 = ClockClient::SLEEP;
/// Set an alarm.
pub const SET_ALARM: i32 = ClockClient::SET_ALARM;
/// Cancel an alarm.
pub const CANCEL_ALARM: i32 = ClockClient::CANCEL_ALARM;
/// Read the resolution.
pub const RESOLUTION: i32 = ClockClient::RESOLUTION;
/// Set the resolution (control port only).
pub const SET_RESOLUTION: i32 = ClockControlClient::SET_RESOLUTION;
/// Read the counters (control port only).
pub const STATS: i32 = ClockControlClient::STATS;
/// Set the per-client quota (control port only).
pub const SET_CLIENT_QUOTA: i32 = ClockControlClient::SET_CLIENT_QUOTA;

/// Why the clock refused a request that reached its method. Travels as the reply's
/// return code (see the module documentation's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ClockError {
    /// A time's nanoseconds field is not below 10⁹, or the time is past 584 years.
    #[error("invalid time: nanoseconds must be below 1000000000 and the time within 584 years of boot")]
    InvalidTime,
    /// The resolution is above [`MAX_RESOLUTION`], or the quota outside its range.
    #[error("resolution or quota out of range (resolution at most 1 s, quota 1 to {MAX_CLIENT_QUOTA})")]
    BadResolution,
    /// The client already has its quota of pending alarms and sleeps.
    #[error(
        "this task has as many alarms and sleeps pending as the clock's quota per task allows ({DEFAULT_CLIENT_QUOTA} unless set on the control port); cancel some first"
    )]
    QuotaExceeded,
    /// The server holds [`MAX_PENDING`] alarms and sleeps already.
    #[error("the clock server holds {MAX_PENDING} alarms and sleeps, its limit for all tasks together")]
    Full,
    /// No pending alarm has this id (delivered, cancelled, or never set).
    #[error("no pending alarm has this id")]
    NoSuchAlarm,
    /// The alarm was set by another task, and the request did not come through the
    /// control port.
    #[error("the alarm belongs to another task")]
    NotOwner,
    /// The alarm's port is already dead.
    #[error("the alarm's port is dead")]
    DeadPort,
    /// The request needs the clock server's own loop (a deferred reply) and reached an
    /// implementation without one.
    #[error("this clock implementation cannot serve this request")]
    NotHere,
}

impl ClockError {
    /// Every error, for look-ups and tests.
    pub const ALL: [ClockError; 8] = [
        ClockError::InvalidTime,
        ClockError::BadResolution,
        ClockError::QuotaExceeded,
        ClockError::Full,
        ClockError::NoSuchAlarm,
        ClockError::NotOwner,
        ClockError::DeadPort,
        ClockError::NotHere,
    ];

    /// The return code that carries it.
    pub const fn return_code(self) -> ReturnCode {
        match self {
            ClockError::InvalidTime => ReturnCode::InvalidValue,
            ClockError::BadResolution => ReturnCode::InvalidArgument,
            ClockError::QuotaExceeded => ReturnCode::ResourceShortage,
            ClockError::Full => ReturnCode::NoSpace,
            ClockError::NoSuchAlarm => ReturnCode::InvalidName,
            ClockError::NotOwner => ReturnCode::NoAccess,
            ClockError::DeadPort => ReturnCode::InvalidRight,
            ClockError::NotHere => ReturnCode::InvalidCapability,
        }
    }
}

impl RemoteError for ClockError {
    fn code(&self) -> u32 {
        self.return_code().code()
    }

    fn from_code(code: u32) -> Option<Self> {
        ClockError::ALL.into_iter().find(|e| e.code() == code)
    }
}

/// A time or interval as it travels: the paper's `timespec`, unchecked. The methods
/// check it with [`WireTime::to_time`] or [`WireTime::to_duration`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WireTime {
    /// Whole seconds.
    pub secs: u64,
    /// Nanoseconds; valid only below 10⁹.
    pub nanos: u32,
}

impl WireTime {
    /// The wire form of an instant.
    pub fn from_time(t: Time) -> WireTime {
        let ts = t.to_timespec();
        WireTime { secs: ts.secs(), nanos: ts.nanos() }
    }

    /// The wire form of an interval.
    pub fn from_duration(d: Duration) -> WireTime {
        WireTime { secs: d.as_secs(), nanos: d.subsec_nanos() }
    }

    /// The validated `timespec`.
    pub fn to_timespec(self) -> Result<Timespec, ClockError> {
        Timespec::new(self.secs, self.nanos).map_err(|_| ClockError::InvalidTime)
    }

    /// The instant this names, checked.
    pub fn to_time(self) -> Result<Time, ClockError> {
        Time::from_timespec(self.to_timespec()?).map_err(|_| ClockError::InvalidTime)
    }

    /// The interval this names, checked (and within [`Time`]'s range).
    pub fn to_duration(self) -> Result<Duration, ClockError> {
        self.to_time().map(Time::since_epoch)
    }
}

impl fmt::Display for WireTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}s", self.secs, self.nanos)
    }
}

impl Encode for WireTime {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        self.secs.encode(enc)?;
        self.nanos.encode(enc)
    }
}

impl Decode for WireTime {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(WireTime { secs: u64::decode(dec)?, nanos: u32::decode(dec)? })
    }
}

/// When something should happen, as it travels: absolute (since boot) or relative to
/// the request's arrival at the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireWhen {
    /// At this time since boot (tag 0).
    At(WireTime),
    /// This long after the server received the request (tag 1).
    After(WireTime),
}

impl WireWhen {
    /// The wire form of an [`ictus_rt::When`].
    pub fn from_when(w: When) -> WireWhen {
        match w {
            When::At(t) => WireWhen::At(WireTime::from_time(t)),
            When::After(d) => WireWhen::After(WireTime::from_duration(d)),
        }
    }

    /// The checked [`ictus_rt::When`].
    pub fn to_when(self) -> Result<When, ClockError> {
        match self {
            WireWhen::At(t) => t.to_time().map(When::At),
            WireWhen::After(d) => d.to_duration().map(When::After),
        }
    }
}

impl Encode for WireWhen {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        let (tag, t) = match self {
            WireWhen::At(t) => (0u8, t),
            WireWhen::After(t) => (1u8, t),
        };
        tag.encode(enc)?;
        t.encode(enc)
    }
}

impl Decode for WireWhen {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        match u8::decode(dec)? {
            0 => Ok(WireWhen::At(WireTime::decode(dec)?)),
            1 => Ok(WireWhen::After(WireTime::decode(dec)?)),
            t => Err(DecodeError::BadTag(t)),
        }
    }
}

/// Where an alarm goes: a send right (the server keeps a reference until the alarm
/// goes off or is cancelled) or a send-once right (used up by the alarm message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlarmPort {
    /// A send right, with how the sender takes it.
    Send(SendRight),
    /// A send-once right.
    SendOnce(SendOnceRight),
}

impl AlarmPort {
    /// The right's name in the holder's space.
    pub fn name(self) -> Name {
        match self {
            AlarmPort::Send(r) => r.name,
            AlarmPort::SendOnce(r) => r.name,
        }
    }

    /// The kind of right the receiver holds.
    pub fn kind(self) -> RightKind {
        match self {
            AlarmPort::Send(_) => RightKind::Send,
            AlarmPort::SendOnce(_) => RightKind::SendOnce,
        }
    }
}

impl Encode for AlarmPort {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        match self {
            AlarmPort::Send(r) => r.encode(enc),
            AlarmPort::SendOnce(r) => r.encode(enc),
        }
    }
}

impl Decode for AlarmPort {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        // A failed `right` takes nothing, so the second try sees the same right.
        match dec.right(RightKind::Send) {
            Ok(name) => Ok(AlarmPort::Send(SendRight::copy(name))),
            Err(DecodeError::WrongRight { got: RightKind::SendOnce, .. }) => {
                Ok(AlarmPort::SendOnce(SendOnceRight::moved(dec.right(RightKind::SendOnce)?)))
            }
            Err(e) => Err(e),
        }
    }
}

/// The clock server's counters, from [`ClockControl::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockStats {
    /// Alarms waiting to go off.
    pub pending_alarms: u64,
    /// Sleeping clients waiting for their reply.
    pub pending_sleeps: u64,
    /// Alarm messages sent.
    pub alarms_sent: u64,
    /// Alarms dropped: their port died (before or when sending), or its queue was
    /// full.
    pub alarms_dropped: u64,
    /// Sleep replies sent.
    pub sleeps_answered: u64,
    /// Clients (pids) with something pending.
    pub clients: u64,
    /// The per-client quota.
    pub client_quota: u32,
    /// The resolution.
    pub resolution: WireTime,
}

impl Encode for ClockStats {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        for v in [
            self.pending_alarms,
            self.pending_sleeps,
            self.alarms_sent,
            self.alarms_dropped,
            self.sleeps_answered,
            self.clients,
        ] {
            v.encode(enc)?;
        }
        self.client_quota.encode(enc)?;
        self.resolution.encode(enc)
    }
}

impl Decode for ClockStats {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(ClockStats {
            pending_alarms: u64::decode(dec)?,
            pending_sleeps: u64::decode(dec)?,
            alarms_sent: u64::decode(dec)?,
            alarms_dropped: u64::decode(dec)?,
            sleeps_answered: u64::decode(dec)?,
            clients: u64::decode(dec)?,
            client_quota: u32::decode(dec)?,
            resolution: WireTime::decode(dec)?,
        })
    }
}

/// The message an alarm sends: id [`ALARM_MESSAGE`], 40 bytes of in-line data —
/// the alarm id (`u64` LE), the client's tag (`u64` LE), the requested time and the
/// time the message was sent (each a 12-byte `timespec`, since boot) — and nothing
/// else.
///
/// Anyone who holds a send right to the port can send a message that looks like
/// this; a client that hands its port out should check the tag (or the kernel-verified
/// sender, [`Received::sender`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlarmMessage {
    /// The alarm's id, as [`Clock::set_alarm`] returned it.
    pub alarm: u64,
    /// The tag given to [`Clock::set_alarm`].
    pub tag: u64,
    /// The time the alarm was requested for (absolute, since boot).
    pub requested: Time,
    /// When the clock sent the message (since boot).
    pub sent: Time,
}

/// Why a message is not an alarm message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlarmParseError {
    /// The message id is not [`ALARM_MESSAGE`].
    #[error("message id {0} is not an alarm message ({ALARM_MESSAGE})")]
    WrongId(i32),
    /// The in-line data is not exactly [`AlarmMessage::WIRE_LEN`] bytes.
    #[error("an alarm message carries {expected} bytes, not {0}", expected = AlarmMessage::WIRE_LEN)]
    WrongLength(usize),
    /// A time in it is not a valid `timespec`.
    #[error("an alarm message carries an invalid time")]
    BadTime,
    /// It carries port rights or out-of-line memory.
    #[error("an alarm message carries no rights or memory")]
    Extra,
}

impl AlarmMessage {
    /// Bytes of in-line data.
    pub const WIRE_LEN: usize = 40;

    /// The message to send.
    pub fn to_message(self) -> Message {
        let mut data = Vec::with_capacity(Self::WIRE_LEN);
        data.extend_from_slice(&self.alarm.to_le_bytes());
        data.extend_from_slice(&self.tag.to_le_bytes());
        data.extend_from_slice(&self.requested.to_timespec().to_le_bytes());
        data.extend_from_slice(&self.sent.to_timespec().to_le_bytes());
        Message::new(ALARM_MESSAGE, data)
    }

    /// Parse a message's id and in-line data (untrusted).
    pub fn parse_bytes(id: i32, data: &[u8]) -> Result<AlarmMessage, AlarmParseError> {
        if id != ALARM_MESSAGE {
            return Err(AlarmParseError::WrongId(id));
        }
        let bytes: &[u8; Self::WIRE_LEN] = data.try_into().map_err(|_| AlarmParseError::WrongLength(data.len()))?;
        let (alarm, rest) = bytes.split_at(8);
        let (tag, rest) = rest.split_at(8);
        let (requested, sent) = rest.split_at(Timespec::WIRE_LEN);
        let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let time_of = |b: &[u8]| -> Result<Time, AlarmParseError> {
            let arr: [u8; Timespec::WIRE_LEN] = b.try_into().map_err(|_| AlarmParseError::BadTime)?;
            let ts = Timespec::from_le_bytes(arr).map_err(|_| AlarmParseError::BadTime)?;
            Time::from_timespec(ts).map_err(|_| AlarmParseError::BadTime)
        };
        Ok(AlarmMessage {
            alarm: u64_of(alarm),
            tag: u64_of(tag),
            requested: time_of(requested)?,
            sent: time_of(sent)?,
        })
    }

    /// Parse a received message (untrusted). It must carry nothing but its bytes.
    pub fn parse(msg: &Received) -> Result<AlarmMessage, AlarmParseError> {
        let parsed = AlarmMessage::parse_bytes(msg.id, msg.data())?;
        if !msg.ports.is_empty() || msg.reply.is_some() || !msg.ool.is_empty() {
            return Err(AlarmParseError::Extra);
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn message_ids() {
        assert_eq!([READ, SLEEP, SET_ALARM, CANCEL_ALARM, RESOLUTION], [4100, 4101, 4102, 4103, 4104]);
        assert_eq!([SET_RESOLUTION, STATS, SET_CLIENT_QUOTA], [4300, 4301, 4302]);
        // No request id of the clock service is a reply id of it, and the alarm
        // message is neither.
        let requests = [READ, SLEEP, SET_ALARM, CANCEL_ALARM, RESOLUTION, SET_RESOLUTION, STATS, SET_CLIENT_QUOTA];
        for r in requests {
            assert!(!requests.contains(&ictus_idl::reply_id(r)));
            assert_ne!(ictus_idl::reply_id(r), ALARM_MESSAGE);
            assert_ne!(r, ALARM_MESSAGE);
        }
    }

    #[test]
    fn errors_travel_as_return_codes() {
        for e in ClockError::ALL {
            assert_ne!(e.code(), 0);
            assert_eq!(ClockError::from_code(e.code()), Some(e));
            assert_eq!(ReturnCode::from_code(e.code()), Some(e.return_code()));
        }
        for r in [ReturnCode::Success, ReturnCode::MigBadId, ReturnCode::MigBadArguments, ReturnCode::Failure] {
            assert_eq!(ClockError::from_code(r.code()), None);
        }
    }

    #[test]
    fn wire_times_are_checked() {
        assert_eq!(WireTime { secs: 1, nanos: 5 }.to_time(), Ok(Time::from_nanos(1_000_000_005)));
        assert_eq!(WireTime { secs: 1, nanos: 1_000_000_000 }.to_time(), Err(ClockError::InvalidTime));
        assert_eq!(WireTime { secs: u64::MAX, nanos: 0 }.to_time(), Err(ClockError::InvalidTime));
        assert_eq!(WireTime::from_duration(Duration::from_millis(1500)).to_duration(), Ok(Duration::from_millis(1500)));
        let w = WireWhen::from_when(When::After(Duration::from_millis(3)));
        assert_eq!(w.to_when(), Ok(When::After(Duration::from_millis(3))));
        let bad = WireWhen::At(WireTime { secs: 0, nanos: u32::MAX });
        assert_eq!(bad.to_when(), Err(ClockError::InvalidTime));
        assert_eq!(WireTime { secs: 2, nanos: 30 }.to_string(), "2.000000030s");
    }

    #[test]
    fn alarm_messages_round_trip_and_refuse_garbage() {
        let m = AlarmMessage { alarm: 7, tag: 99, requested: Time::from_millis(1500), sent: Time::from_millis(1501) };
        let msg = m.to_message();
        assert_eq!(msg.data.len(), AlarmMessage::WIRE_LEN);
        assert_eq!(AlarmMessage::parse_bytes(msg.id, &msg.data), Ok(m));
        assert_eq!(AlarmMessage::parse_bytes(1, &msg.data), Err(AlarmParseError::WrongId(1)));
        assert_eq!(AlarmMessage::parse_bytes(ALARM_MESSAGE, &msg.data[1..]), Err(AlarmParseError::WrongLength(39)));
        let mut bad = msg.data.clone();
        bad[24..28].copy_from_slice(&1_000_000_000u32.to_le_bytes());
        assert_eq!(AlarmMessage::parse_bytes(ALARM_MESSAGE, &bad), Err(AlarmParseError::BadTime));
    }

    /// The fuzz target's seed corpus, replayed on stable with the target's own check.
    #[test]
    fn fuzz_corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/alarm_message");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("the seed corpus") {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            seen += 1;
            let Some((id, bytes)) = data.split_first_chunk::<4>() else { continue };
            let id = if id[0] & 1 == 0 { ALARM_MESSAGE } else { i32::from_le_bytes(*id) };
            if let Ok(m) = AlarmMessage::parse_bytes(id, bytes) {
                assert_eq!(m.to_message().data, bytes);
            }
        }
        assert!(seen >= 4, "the seeds are there");
    }

    proptest! {
        #[test]
        fn alarm_parse_never_panics(id in any::<i32>(), data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = AlarmMessage::parse_bytes(id, &data);
            let _ = AlarmMessage::parse_bytes(ALARM_MESSAGE, &data);
        }

        #[test]
        fn alarm_message_round_trip(alarm in any::<u64>(), tag in any::<u64>(), r in any::<u64>(), s in any::<u64>()) {
            let m = AlarmMessage { alarm, tag, requested: Time::from_nanos(r), sent: Time::from_nanos(s) };
            let msg = m.to_message();
            prop_assert_eq!(AlarmMessage::parse_bytes(msg.id, &msg.data), Ok(m));
        }
    }
}
