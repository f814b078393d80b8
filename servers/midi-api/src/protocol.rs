//! The input server's interface, [`MidiInput`], and the messages it sends its clients.
//!
//! # Requests (`#[ictus_idl::interface(id = 4500)]`)
//!
//! | id | method | in-line data | port rights |
//! | --- | --- | --- | --- |
//! | 4500 | [`MidiInput::subscribe`] | class (`u8`: 0 normal, 1 system exclusive) | one send right: where to deliver |
//! | 4501 | [`MidiInput::unsubscribe`] | the subscription's id (`u64`) | — |
//! | 4502 | [`MidiInput::stats`] | — | — |
//! | 4503 | [`MidiInput::device`] | — | — |
//!
//! A client asks for normal and system-exclusive messages separately, as in the paper
//! (000 §4.5), each on a port of its own; [`MidiInput::subscribe`] answers with the
//! server's pid, which the client then requires of every delivery's kernel-verified
//! sender, and the subscription's id, which only the same task (pid and uid) may
//! unsubscribe. Replies follow `ictus_idl`'s conventions (id + 100, a `u32` return code).
//!
//! # Deliveries (server → client, one way, never waited for)
//!
//! - [`NORMAL_MESSAGE`] (4590): 24 bytes in-line — the arrival time (a 12-byte
//!   `timespec` since boot, `CLOCK_MONOTONIC`), the subscription's sequence number
//!   (`u64` LE, from 0, one per message the server tried to send, so a gap is a
//!   message lost to a full queue), the length (`u8`, 1–3) and three bytes (unused
//!   ones zero). The paper passed these in-line "because they are at most three bytes
//!   long".
//! - [`SYSEX_MESSAGE`] (4591): 32 bytes in-line — time, sequence number, the length
//!   (`u32` LE) and the count of data bytes the server's parser dropped because the
//!   message was longer than its bound (`u64` LE) — and exactly one out-of-line region
//!   (a sealed memfd) holding the bytes, `F0` first. The paper passed "a length and a
//!   pointer to a copy-on-write buffer".
//!
//! [`Delivery::parse`] checks all of it: the id, the lengths, that nothing else came
//! with it, and that the bytes are one well-formed MIDI message of the right class.

use ictus_abi::ReturnCode;
use ictus_idl::{Context, Decode, DecodeError, Decoder, Encode, EncodeError, Encoder, RemoteError, SendRight};
use ictus_ipc::{Message as IpcMessage, OolBuffer, Received};
use ictus_midi::Message;
use ictus_rt::{Time, Timespec};

/// The name the input server registers with the name server (the paper's).
pub const SERVICE_NAME: &str = "midi_inputport";
/// The message id of a normal (at most three bytes) message's delivery.
pub const NORMAL_MESSAGE: i32 = 4590;
/// The message id of a system-exclusive message's delivery.
pub const SYSEX_MESSAGE: i32 = 4591;
/// The most subscriptions the server holds, all clients together.
pub const MAX_SUBSCRIPTIONS: usize = 1024;
/// The most subscriptions one client (a kernel-verified pid) may hold.
pub const MAX_PER_CLIENT: usize = 64;

/// Which messages a subscription wants: the paper's two input calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Every message but system exclusive: channel, system common, real-time (`get`).
    Normal,
    /// System exclusive, terminated or not (`getx`).
    Sysex,
}

impl Class {
    /// Both classes.
    pub const ALL: [Class; 2] = [Class::Normal, Class::Sysex];

    /// The class of a message.
    pub fn of(m: &Message) -> Class {
        if m.kind().is_sysex() {
            Class::Sysex
        } else {
            Class::Normal
        }
    }

    /// Its wire number.
    pub const fn to_wire(self) -> u8 {
        match self {
            Class::Normal => 0,
            Class::Sysex => 1,
        }
    }

    /// The class of a wire number.
    pub const fn from_wire(v: u8) -> Option<Class> {
        match v {
            0 => Some(Class::Normal),
            1 => Some(Class::Sysex),
            _ => None,
        }
    }

    /// `normal` or `sysex`.
    pub const fn name(self) -> &'static str {
        match self {
            Class::Normal => "normal",
            Class::Sysex => "sysex",
        }
    }
}

/// The input server's interface (see the module documentation).
#[ictus_idl::interface(id = 4500)]
pub trait MidiInput {
    /// Deliver every message of `class` to `port`, until it dies or is unsubscribed.
    /// Returns the server's pid (the kernel-verified sender of every delivery) and the
    /// subscription's id.
    #[id(0)]
    fn subscribe(&self, cx: &Context, class: u8, port: SendRight) -> Result<(u32, u64), MidiError>;

    /// End subscription `id`; allowed for the task that made it (same kernel-verified
    /// pid and uid).
    #[id(1)]
    fn unsubscribe(&self, cx: &Context, id: u64) -> Result<(), MidiError>;

    /// The server's counters.
    #[id(2)]
    fn stats(&self) -> Result<InputStats, MidiError>;

    /// The device the server reads, in words.
    #[id(3)]
    fn device(&self) -> Result<String, MidiError>;
}

/// Why the server refused a request that reached its method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum MidiError {
    /// The class is neither 0 nor 1 (`InvalidArgument`).
    #[error("unknown message class (0 normal, 1 system exclusive)")]
    BadClass,
    /// The port is already subscribed to that class (`NameExists`).
    #[error("the port is already subscribed to this class")]
    AlreadySubscribed,
    /// No such subscription (`InvalidName`).
    #[error("no such subscription")]
    NotSubscribed,
    /// The subscription belongs to another task (`NoAccess`).
    #[error("the subscription belongs to another task")]
    NotOwner,
    /// The port is dead (`InvalidRight`).
    #[error("the port is dead")]
    DeadPort,
    /// The client holds [`MAX_PER_CLIENT`] subscriptions already (`ResourceShortage`).
    #[error("this task holds {MAX_PER_CLIENT} subscriptions, the MIDI input server's quota per task; close some handles first")]
    QuotaExceeded,
    /// The server holds [`MAX_SUBSCRIPTIONS`] already (`NoSpace`).
    #[error("the MIDI input server holds {MAX_SUBSCRIPTIONS} subscriptions, its limit for all tasks together")]
    Full,
}

impl MidiError {
    /// Every error.
    pub const ALL: [MidiError; 7] = [
        MidiError::BadClass,
        MidiError::AlreadySubscribed,
        MidiError::NotSubscribed,
        MidiError::NotOwner,
        MidiError::DeadPort,
        MidiError::QuotaExceeded,
        MidiError::Full,
    ];

    /// The return code that carries it.
    pub const fn return_code(self) -> ReturnCode {
        match self {
            MidiError::BadClass => ReturnCode::InvalidArgument,
            MidiError::AlreadySubscribed => ReturnCode::NameExists,
            MidiError::NotSubscribed => ReturnCode::InvalidName,
            MidiError::NotOwner => ReturnCode::NoAccess,
            MidiError::DeadPort => ReturnCode::InvalidRight,
            MidiError::QuotaExceeded => ReturnCode::ResourceShortage,
            MidiError::Full => ReturnCode::NoSpace,
        }
    }
}

impl RemoteError for MidiError {
    fn code(&self) -> u32 {
        self.return_code().code()
    }
    fn from_code(code: u32) -> Option<Self> {
        MidiError::ALL.into_iter().find(|e| e.code() == code)
    }
}

macro_rules! input_stats {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        /// The input server's counters ([`MidiInput::stats`]).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct InputStats {
            $($(#[$doc])* pub $field: u64,)*
        }

        impl InputStats {
            /// Every counter with its name, in wire order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field)),*]
            }
        }

        impl Encode for InputStats {
            fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
                $(self.$field.encode(enc)?;)*
                Ok(())
            }
        }

        impl Decode for InputStats {
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                Ok(InputStats { $($field: u64::decode(dec)?,)* })
            }
        }
    };
}

input_stats! {
    /// Subscriptions to normal messages now.
    normal_clients,
    /// Subscriptions to system-exclusive messages now.
    sysex_clients,
    /// Subscriptions accepted since the start.
    subscribed,
    /// Subscriptions ended by `unsubscribe`.
    unsubscribed,
    /// Subscriptions dropped because their port died (dead-name notification, or a
    /// delivery that found the port dead) — clients killed, even by `kill -9`.
    dropped_dead,
    /// Messages delivered (one per subscription).
    delivered,
    /// Deliveries dropped because the client's queue was full (the server never waits).
    queue_full,
    /// Deliveries that failed for another reason.
    send_errors,
    /// Bytes read from the device.
    device_bytes,
    /// Device reads that failed.
    device_errors,
    /// 1 once the device reported its end (unplugged).
    device_ended,
    /// Bytes the driver dropped because the ring was full.
    ring_overflow,
    /// Ring slots found corrupt and skipped.
    ring_corrupt,
    /// Times the driver woke the server.
    ring_wakeups,
    /// Bytes the parser took.
    parsed_bytes,
    /// Messages the parser made.
    messages,
    /// Messages whose status came from running status.
    running_status,
    /// Data bytes with no status in force, dropped.
    stray_data,
    /// Undefined status bytes, dropped.
    undefined,
    /// `F7` with no sysex open, dropped.
    stray_eox,
    /// Bytes of messages cut short by a status byte, dropped.
    incomplete,
    /// Sysex data bytes past the bound, dropped.
    sysex_overflow,
    /// Sysex messages ended by another status byte.
    sysex_unterminated,
    /// Requests refused (bad id or arguments) or malformed.
    refused,
}

impl InputStats {
    /// Every byte the parser dropped, for whatever reason.
    pub fn dropped_bytes(&self) -> u64 {
        self.stray_data + self.undefined + self.stray_eox + self.incomplete + self.sysex_overflow
    }

    /// The counters as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.fields().into_iter().map(|(k, v)| (k.to_owned(), v.into())).collect())
    }
}

/// Why a delivery was refused by the client library.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// Not a delivery's message id.
    #[error("message id {0} is not a MIDI delivery")]
    WrongId(i32),
    /// In-line data of the wrong length.
    #[error("a {class:?} delivery has {got} bytes of in-line data, not {expected}")]
    WrongLength {
        /// The class the id says.
        class: Class,
        /// Bytes expected.
        expected: usize,
        /// Bytes there.
        got: usize,
    },
    /// The time is not a valid `timespec`.
    #[error("the delivery's time is not a valid timespec")]
    BadTime,
    /// Port rights, a reply right, or the wrong number of out-of-line regions.
    #[error("the delivery carries rights or regions it should not")]
    Extra,
    /// The length says more bytes than there are.
    #[error("the delivery claims {claimed} bytes, but carries {have}")]
    Short {
        /// The length claimed.
        claimed: usize,
        /// What there is.
        have: usize,
    },
    /// The bytes are not one well-formed message of the delivery's class.
    #[error("the delivered bytes are not a well-formed {0:?} message: {1}")]
    BadMessage(Class, String),
}

/// One delivery, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Its class.
    pub class: Class,
    /// The subscription's sequence number.
    pub seq: u64,
    /// The message, with its arrival time.
    pub message: Message,
    /// Sysex data bytes the server dropped (over its bound).
    pub overflow: u64,
}

impl Delivery {
    /// The in-line data of a normal delivery.
    pub const NORMAL_LEN: usize = 24;
    /// The in-line data of a sysex delivery.
    pub const SYSEX_LEN: usize = 32;

    /// The message to send to a subscriber of `class` (`message` must be of that
    /// class). A sysex delivery needs an out-of-line buffer, which can fail.
    pub fn to_message(message: &Message, seq: u64, overflow: u64) -> Result<IpcMessage, ictus_ipc::OolError> {
        let bytes = message.bytes();
        let mut data = Vec::with_capacity(Delivery::SYSEX_LEN);
        data.extend_from_slice(&message.time().to_timespec().to_le_bytes());
        data.extend_from_slice(&seq.to_le_bytes());
        match Class::of(message) {
            Class::Normal => {
                let mut three = [0u8; 3];
                let n = bytes.len().min(3);
                three[..n].copy_from_slice(&bytes[..n]);
                data.push(n as u8);
                data.extend_from_slice(&three);
                Ok(IpcMessage::new(NORMAL_MESSAGE, data))
            }
            Class::Sysex => {
                data.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                data.extend_from_slice(&overflow.to_le_bytes());
                let mut m = IpcMessage::new(SYSEX_MESSAGE, data);
                m.ool.push(OolBuffer::from_slice(bytes)?);
                Ok(m)
            }
        }
    }

    /// Check a received message (untrusted) and make the delivery it carries.
    pub fn parse(msg: &Received) -> Result<Delivery, DeliveryError> {
        let regions: Vec<&[u8]> = msg.ool.iter().map(|r| &r[..]).collect();
        Delivery::parse_parts(msg.id, msg.data(), &regions, !msg.ports.is_empty() || msg.reply.is_some())
    }

    /// The checks of [`Delivery::parse`] on a message's parts: its id, in-line data,
    /// out-of-line regions, and whether it carried any port right (pure, for fuzzing).
    pub fn parse_parts(id: i32, data: &[u8], ool: &[&[u8]], rights: bool) -> Result<Delivery, DeliveryError> {
        let class = match id {
            NORMAL_MESSAGE => Class::Normal,
            SYSEX_MESSAGE => Class::Sysex,
            id => return Err(DeliveryError::WrongId(id)),
        };
        let expected = match class {
            Class::Normal => Delivery::NORMAL_LEN,
            Class::Sysex => Delivery::SYSEX_LEN,
        };
        if data.len() != expected {
            return Err(DeliveryError::WrongLength { class, expected, got: data.len() });
        }
        let regions = match class {
            Class::Normal => 0,
            Class::Sysex => 1,
        };
        if rights || ool.len() != regions {
            return Err(DeliveryError::Extra);
        }
        let ts: [u8; Timespec::WIRE_LEN] = data[..12].try_into().map_err(|_| DeliveryError::BadTime)?;
        let time = Timespec::from_le_bytes(ts)
            .ok()
            .and_then(|ts| Time::from_timespec(ts).ok())
            .ok_or(DeliveryError::BadTime)?;
        let seq = u64::from_le_bytes(data[12..20].try_into().unwrap_or([0; 8]));
        let (bytes, overflow): (&[u8], u64) = match class {
            Class::Normal => {
                let n = usize::from(data[20]);
                if n == 0 || n > 3 {
                    return Err(DeliveryError::Short { claimed: n, have: 3 });
                }
                (&data[21..21 + n], 0)
            }
            Class::Sysex => {
                let n = u32::from_le_bytes(data[20..24].try_into().unwrap_or([0; 4])) as usize;
                let overflow = u64::from_le_bytes(data[24..32].try_into().unwrap_or([0; 8]));
                let region = ool[0];
                if n > region.len() || n == 0 {
                    return Err(DeliveryError::Short { claimed: n, have: region.len() });
                }
                (&region[..n], overflow)
            }
        };
        let message = Message::from_bytes(bytes, time).map_err(|e| DeliveryError::BadMessage(class, e.to_string()))?;
        if Class::of(&message) != class {
            return Err(DeliveryError::BadMessage(class, format!("a {} message", message.kind())));
        }
        Ok(Delivery { class, seq, message, overflow })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_codes() {
        assert_eq!(MidiInputClient::SUBSCRIBE, 4500);
        assert_eq!(MidiInputClient::DEVICE, 4503);
        for e in MidiError::ALL {
            assert_ne!(e.code(), 0);
            assert_eq!(MidiError::from_code(e.code()), Some(e));
        }
        for c in Class::ALL {
            assert_eq!(Class::from_wire(c.to_wire()), Some(c));
        }
        assert_eq!(Class::from_wire(2), None);
    }

    fn parts(m: &IpcMessage) -> (i32, Vec<u8>, Vec<Vec<u8>>) {
        (m.id, m.data.clone(), m.ool.iter().map(|b| b.to_vec()).collect())
    }

    fn parse(id: i32, data: &[u8], ool: &[Vec<u8>]) -> Result<Delivery, DeliveryError> {
        let regions: Vec<&[u8]> = ool.iter().map(|r| &r[..]).collect();
        Delivery::parse_parts(id, data, &regions, false)
    }

    #[test]
    fn deliveries_round_trip_and_bad_ones_are_refused() {
        let t = Time::from_nanos(1_234_567_890);
        let note = Message::note_on(3, 60, 100, t).unwrap();
        let (id, data, ool) = parts(&Delivery::to_message(&note, 7, 0).unwrap());
        let d = parse(id, &data, &ool).unwrap();
        assert_eq!((d.class, d.seq, d.message.clone(), d.overflow), (Class::Normal, 7, note, 0));
        let sx = Message::from_bytes(&[0xF0, 1, 2, 0xF7], t).unwrap();
        let (sid, sdata, sool) = parts(&Delivery::to_message(&sx, 9, 5).unwrap());
        let d = parse(sid, &sdata, &sool).unwrap();
        assert_eq!((d.class, d.seq, d.message.bytes(), d.overflow), (Class::Sysex, 9, &[0xF0, 1, 2, 0xF7][..], 5));

        assert_eq!(parse(4592, &data, &ool), Err(DeliveryError::WrongId(4592)));
        assert!(matches!(parse(id, &data[..20], &ool), Err(DeliveryError::WrongLength { .. })));
        assert_eq!(parse(id, &data, &sool), Err(DeliveryError::Extra));
        assert_eq!(Delivery::parse_parts(id, &data, &[], true), Err(DeliveryError::Extra));
        let mut bad = data.clone();
        bad[8] = 0xFF; // nanoseconds ≥ 10⁹
        bad[11] = 0xFF;
        assert_eq!(parse(id, &bad, &ool), Err(DeliveryError::BadTime));
        let mut bad = data.clone();
        bad[20] = 4;
        assert!(matches!(parse(id, &bad, &ool), Err(DeliveryError::Short { .. })));
        let mut bad = data.clone();
        bad[22] = 0x90; // a status byte where a data byte belongs
        assert!(matches!(parse(id, &bad, &ool), Err(DeliveryError::BadMessage(..))));
        // A sysex claiming more than its region, or sent as a normal message.
        let mut bad = sdata.clone();
        bad[20] = 200;
        assert!(matches!(parse(sid, &bad, &sool), Err(DeliveryError::Short { .. })));
        let mut bad = data.clone();
        bad[20] = 1;
        bad[21] = 0xF0;
        assert!(matches!(parse(id, &bad, &ool), Err(DeliveryError::BadMessage(..))));
        // A normal message in a sysex delivery.
        let mut three = sdata.clone();
        three[20] = 3;
        assert!(matches!(parse(sid, &three, &[vec![0x90, 1, 2]]), Err(DeliveryError::BadMessage(..))));
    }

    #[test]
    fn stats_travel() {
        let mut s = InputStats { delivered: 7, refused: 9, ..InputStats::default() };
        s.stray_data = 3;
        let mut enc = Encoder::new(1);
        s.encode(&mut enc).unwrap();
        let m = enc.into_message();
        assert_eq!(m.data.len(), 8 * s.fields().len());
        assert_eq!(s.dropped_bytes(), 3);
        assert_eq!(s.to_json()["delivered"], 7);
    }
}
