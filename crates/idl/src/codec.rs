//! Encoding arguments and results into messages, and decoding them back.
//!
//! Decoding reads untrusted bytes: every length is checked against what is left before
//! anything is allocated or copied, and a message must be used up exactly.

use ictus_ipc::{Disposition, Message, Name, OolBuffer, OolRegion, PortArg, Received, ReceivedRight, RightKind};

use crate::{ClientError, Connection, RemoteError};
use ictus_ipc::ReturnCode;

/// Builds an outgoing message.
#[derive(Debug)]
pub struct Encoder {
    msg: Message,
}

/// Why a value could not be encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// A length does not fit in the wire's `u32`.
    #[error("a value of {0} bytes or items is too long for the wire")]
    TooLong(usize),
    /// A port-right argument was given a disposition that does not make its kind.
    #[error("right {0} cannot be sent as {1:?} in this argument")]
    Disposition(Name, Disposition),
}

/// Why a message did not decode as its interface says.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum DecodeError {
    /// The in-line data ended early.
    #[error("in-line data ends early: needed {needed} more bytes at offset {at}")]
    Short {
        /// Bytes needed.
        needed: usize,
        /// Where.
        at: usize,
    },
    /// In-line data left over after the last argument.
    #[error("{0} bytes of in-line data left over")]
    Trailing(usize),
    /// A string is not UTF-8.
    #[error("a string is not UTF-8")]
    Utf8,
    /// A boolean or tag byte had an impossible value.
    #[error("invalid value {0} for a boolean or tag")]
    BadTag(u8),
    /// A port right the interface expects is missing.
    #[error("a port right is missing")]
    MissingRight,
    /// A port right of the wrong kind.
    #[error("expected a {expected:?} right, got {got:?}")]
    WrongRight {
        /// What the interface says.
        expected: RightKind,
        /// What arrived.
        got: RightKind,
    },
    /// Port rights left over after the last argument.
    #[error("{0} port rights left over")]
    ExtraRights(usize),
    /// An out-of-line region the interface expects is missing.
    #[error("an out-of-line region is missing")]
    MissingOol,
    /// Out-of-line regions left over.
    #[error("{0} out-of-line regions left over")]
    ExtraOol(usize),
    /// A routine arrived without a right to reply through.
    #[error("a routine's request has no reply right")]
    NoReplyRight,
    /// A reply with an unexpected message id.
    #[error("reply id {got} does not answer request {request}")]
    WrongReply {
        /// The request's id.
        request: i32,
        /// The reply's id.
        got: i32,
    },
}

impl Encoder {
    /// A message with this id.
    pub fn new(id: i32) -> Encoder {
        Encoder { msg: crate::message(id) }
    }

    /// Append raw bytes to the in-line data.
    pub fn put(&mut self, bytes: &[u8]) {
        self.msg.data.extend_from_slice(bytes);
    }

    /// Append a length as a `u32`.
    pub fn put_len(&mut self, n: usize) -> Result<(), EncodeError> {
        let n = u32::try_from(n).map_err(|_| EncodeError::TooLong(n))?;
        self.put(&n.to_le_bytes());
        Ok(())
    }

    /// Append a port right.
    pub fn port(&mut self, arg: PortArg) {
        self.msg.ports.push(arg);
    }

    /// Append an out-of-line region (moved).
    pub fn ool(&mut self, buf: OolBuffer) {
        self.msg.ool.push(buf);
    }

    /// The message built.
    pub fn into_message(self) -> Message {
        self.msg
    }
}

/// Reads a received message's in-line data, rights and regions, in order.
#[derive(Debug)]
pub struct Decoder<'a> {
    data: &'a [u8],
    pos: usize,
    ports: &'a [ReceivedRight],
    next_port: usize,
    ool: std::vec::IntoIter<OolRegion>,
}

impl<'a> Decoder<'a> {
    /// Decode a request (or any message) from its start.
    pub fn new(msg: &'a mut Received) -> Decoder<'a> {
        let ool = std::mem::take(&mut msg.ool).into_iter();
        let msg: &'a Received = msg;
        Decoder { data: msg.data(), pos: 0, ports: &msg.ports, next_port: 0, ool }
    }

    /// Decode a reply to request `id`: check its id, read its return code, and turn a
    /// failure code into the caller's error.
    pub fn reply<E: RemoteError>(
        conn: &Connection,
        msg: &'a mut Received,
        id: i32,
    ) -> Result<Decoder<'a>, ClientError<E>> {
        if msg.id != crate::reply_id(id) {
            let got = msg.id;
            return Err(conn.bad_reply(msg, DecodeError::WrongReply { request: id, got }));
        }
        let Some(code) = msg.data().get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))) else {
            let at = msg.data().len();
            return Err(conn.bad_reply(msg, DecodeError::Short { needed: 4 - at, at }));
        };
        if code != 0 {
            crate::release_rights(conn.space(), msg);
            let code = ReturnCode(code);
            if matches!(code, ReturnCode::MigBadId | ReturnCode::MigBadArguments | ReturnCode::Failure) {
                return Err(ClientError::Refused(code));
            }
            return Err(match E::from_code(code.code()) {
                Some(e) => ClientError::Remote(e),
                None => ClientError::Refused(code),
            });
        }
        let mut d = Decoder::new(msg);
        d.pos = 4;
        Ok(d)
    }

    /// Take `n` bytes of in-line data.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let left = self.data.len() - self.pos;
        if n > left {
            return Err(DecodeError::Short { needed: n - left, at: self.pos });
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Take a `u32` length, checked to leave at least `n × unit` bytes.
    pub fn take_len(&mut self, unit: usize) -> Result<usize, DecodeError> {
        let n = u32::decode(self)? as usize;
        let left = self.data.len() - self.pos;
        if n.saturating_mul(unit.max(1)) > left {
            return Err(DecodeError::Short { needed: n.saturating_mul(unit.max(1)) - left, at: self.pos });
        }
        Ok(n)
    }

    /// Take the next port right, which must be of kind `kind`.
    pub fn right(&mut self, kind: RightKind) -> Result<Name, DecodeError> {
        let r = self.ports.get(self.next_port).ok_or(DecodeError::MissingRight)?;
        if r.kind != kind {
            return Err(DecodeError::WrongRight { expected: kind, got: r.kind });
        }
        self.next_port += 1;
        Ok(r.name)
    }

    /// Take the next out-of-line region.
    pub fn ool(&mut self) -> Result<OolRegion, DecodeError> {
        self.ool.next().ok_or(DecodeError::MissingOol)
    }

    /// Check that everything was used.
    pub fn finish(&mut self) -> Result<(), DecodeError> {
        if self.pos != self.data.len() {
            return Err(DecodeError::Trailing(self.data.len() - self.pos));
        }
        if self.next_port != self.ports.len() {
            return Err(DecodeError::ExtraRights(self.ports.len() - self.next_port));
        }
        let extra = self.ool.len();
        if extra != 0 {
            return Err(DecodeError::ExtraOol(extra));
        }
        Ok(())
    }
}

/// A value that can be sent.
pub trait Encode {
    /// Append this value to a message.
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError>;
}

/// A value that can be received.
pub trait Decode: Sized {
    /// Read this value from a message.
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError>;
}

macro_rules! scalar {
    ($($t:ty),*) => {$(
        impl Encode for $t {
            fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
                enc.put(&self.to_le_bytes());
                Ok(())
            }
        }
        impl Decode for $t {
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                let b = dec.take(std::mem::size_of::<$t>())?;
                Ok(<$t>::from_le_bytes(b.try_into().expect("sized")))
            }
        }
    )*};
}
scalar!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

impl Encode for bool {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        enc.put(&[u8::from(self)]);
        Ok(())
    }
}

impl Decode for bool {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        match u8::decode(dec)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DecodeError::BadTag(b)),
        }
    }
}

impl Encode for () {
    fn encode(self, _: &mut Encoder) -> Result<(), EncodeError> {
        Ok(())
    }
}

impl Decode for () {
    fn decode(_: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(())
    }
}

impl Encode for &[u8] {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        enc.put_len(self.len())?;
        enc.put(self);
        Ok(())
    }
}

impl Encode for Vec<u8> {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        self.as_slice().encode(enc)
    }
}

impl Decode for Vec<u8> {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let n = dec.take_len(1)?;
        Ok(dec.take(n)?.to_vec())
    }
}

impl Encode for &str {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        self.as_bytes().encode(enc)
    }
}

impl Encode for String {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        self.as_str().encode(enc)
    }
}

impl Decode for String {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let n = dec.take_len(1)?;
        let b = dec.take(n)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| DecodeError::Utf8)
    }
}

macro_rules! list {
    ($($t:ty => $unit:expr),*) => {$(
        impl Encode for Vec<$t> {
            fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
                enc.put_len(self.len())?;
                for v in self {
                    v.encode(enc)?;
                }
                Ok(())
            }
        }
        impl Decode for Vec<$t> {
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                // Each item takes at least `$unit` bytes, so a hostile count cannot
                // make us allocate more than the message holds.
                let n = dec.take_len($unit)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(<$t>::decode(dec)?);
                }
                Ok(v)
            }
        }
    )*};
}
list!(String => 4, u32 => 4, u64 => 8, i64 => 8);

impl<T: Encode> Encode for Option<T> {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        match self {
            None => false.encode(enc),
            Some(v) => {
                true.encode(enc)?;
                v.encode(enc)
            }
        }
    }
}

impl<T: Decode> Decode for Option<T> {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(if bool::decode(dec)? { Some(T::decode(dec)?) } else { None })
    }
}

macro_rules! tuple {
    ($($n:ident),+) => {
        impl<$($n: Encode),+> Encode for ($($n,)+) {
            #[allow(non_snake_case)]
            fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
                let ($($n,)+) = self;
                $($n.encode(enc)?;)+
                Ok(())
            }
        }
        impl<$($n: Decode),+> Decode for ($($n,)+) {
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                Ok(($($n::decode(dec)?,)+))
            }
        }
    };
}
tuple!(A);
tuple!(A, B);
tuple!(A, B, C);
tuple!(A, B, C, D);

impl Encode for OolBuffer {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        enc.ool(self);
        Ok(())
    }
}

impl Decode for OolRegion {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        dec.ool()
    }
}

/// A send right as an argument or result. Sending takes it by its disposition
/// (copy by default); receiving gives the name it landed under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendRight {
    /// The name in the holder's space.
    pub name: Name,
    /// How the sender takes it: `CopySend`, `MakeSend` or `MoveSend`.
    pub disposition: Disposition,
}

impl SendRight {
    /// Copy a send right the sender holds.
    pub fn copy(name: Name) -> SendRight {
        SendRight { name, disposition: Disposition::CopySend }
    }
    /// Make a send right from a receive right the sender holds.
    pub fn make(name: Name) -> SendRight {
        SendRight { name, disposition: Disposition::MakeSend }
    }
    /// Move one reference of a send right.
    pub fn moved(name: Name) -> SendRight {
        SendRight { name, disposition: Disposition::MoveSend }
    }
}

impl From<Name> for SendRight {
    fn from(name: Name) -> Self {
        SendRight::copy(name)
    }
}

/// A send-once right as an argument or result (made or moved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendOnceRight {
    /// The name in the holder's space.
    pub name: Name,
    /// `MakeSendOnce` or `MoveSendOnce`.
    pub disposition: Disposition,
}

impl SendOnceRight {
    /// Make a send-once right from a receive right the sender holds.
    pub fn make(name: Name) -> SendOnceRight {
        SendOnceRight { name, disposition: Disposition::MakeSendOnce }
    }
    /// Move a send-once right.
    pub fn moved(name: Name) -> SendOnceRight {
        SendOnceRight { name, disposition: Disposition::MoveSendOnce }
    }
}

/// A receive right as an argument or result: always moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveRight {
    /// The name in the holder's space.
    pub name: Name,
}

fn right(enc: &mut Encoder, name: Name, d: Disposition, allowed: &[Disposition]) -> Result<(), EncodeError> {
    if !allowed.contains(&d) {
        return Err(EncodeError::Disposition(name, d));
    }
    enc.port(PortArg::new(name, d));
    Ok(())
}

impl Encode for SendRight {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        right(enc, self.name, self.disposition, &[Disposition::CopySend, Disposition::MakeSend, Disposition::MoveSend])
    }
}

impl Decode for SendRight {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(SendRight::copy(dec.right(RightKind::Send)?))
    }
}

impl Encode for SendOnceRight {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        right(enc, self.name, self.disposition, &[Disposition::MakeSendOnce, Disposition::MoveSendOnce])
    }
}

impl Decode for SendOnceRight {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(SendOnceRight::moved(dec.right(RightKind::SendOnce)?))
    }
}

impl Encode for ReceiveRight {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        right(enc, self.name, Disposition::MoveReceive, &[Disposition::MoveReceive])
    }
}

impl Decode for ReceiveRight {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(ReceiveRight { name: dec.right(RightKind::Receive)? })
    }
}
