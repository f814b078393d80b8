//! The name server's messages, encoded and decoded in one place.
//!
//! Hand-written for now; a later interface definition will generate the same stubs, so
//! everything about the wire lives here and nowhere else.
//!
//! # Requests
//!
//! Every request is sent with a reply right (clients use [`ictus_ipc::Space::call`],
//! which makes a send-once right for each call). A request without one is carried out
//! if it is valid, but nobody hears the answer.
//!
//! | id | request | in-line data | port rights |
//! | --- | --- | --- | --- |
//! | 4000 | [`REGISTER`] | the name | exactly one send right (the one to register) |
//! | 4001 | [`LOOKUP`] | the name | none |
//! | 4002 | [`UNREGISTER`] | the name | none, or one send right: the registered one, as proof |
//! | 4003 | [`LIST`] | empty | none |
//!
//! A name is the whole in-line data: 1 to [`MAX_NAME_LEN`] bytes of UTF-8 with no
//! control characters (no NUL, no newline, nothing below U+0020, no U+007F–U+009F).
//! No request carries out-of-line memory.
//!
//! # Replies
//!
//! The reply's id is the request's id + [`REPLY_OFFSET`] (wrapping, so that even a
//! nonsense id gets a well-defined answer). Its in-line data starts with a `u32` LE
//! return code, an [`ictus_abi::ReturnCode`]:
//!
//! | code | meaning | Mach's `netname` equivalent |
//! | --- | --- | --- |
//! | `Success` (0) | done | `NETNAME_SUCCESS` |
//! | `NameExists` (13) | register: the name is taken | (`netname_check_in` replaced it) |
//! | `InvalidName` (15) | lookup / unregister: no such name is registered | `NETNAME_NOT_CHECKED_IN` (2001) |
//! | `NoAccess` (8) | unregister: neither the registering task nor the holder of the right | `NETNAME_NOT_YOUR_ENTRY` (2000) |
//! | `InvalidArgument` (4) | the request is malformed: bad name, wrong number of rights, unexpected data or out-of-line memory | `MIG_BAD_ARGUMENTS` |
//! | `InvalidRight` (17) | register: the right is not a live send right (send-once, receive, dead) | `NETNAME_INVALID_PORT` (2004) |
//! | `NoSpace` (3) | register: the server holds [`MAX_REGISTRATIONS`] already | — |
//! | `ResourceShortage` (6) | the server could not arm the dead-name request | — |
//! | `MigBadId` (`0xfffffed1`) | unknown request id | `MIG_BAD_ID` |
//!
//! `InvalidName` rather than a name-server-specific number keeps every ictus answer in
//! one numbering (`ReturnCode`); the table gives the `netname` code it stands for.
//!
//! After the code:
//!
//! - [`LOOKUP`], on success: no more data; the reply carries the registered send right
//!   (copied from the server's space) as its one port right.
//! - [`LIST`], on success: a `u32` LE count, then for each name, sorted, a `u16` LE
//!   length and the name's bytes; nothing after the last name.
//! - Everything else: nothing more, and no port rights.

use std::fmt;

use ictus_abi::ReturnCode;

/// Register a send right under a name.
pub const REGISTER: i32 = 4000;
/// Look a name up; the reply carries a send right.
pub const LOOKUP: i32 = 4001;
/// Remove a registration.
pub const UNREGISTER: i32 = 4002;
/// List the registered names.
pub const LIST: i32 = 4003;
/// A reply's id is its request's id plus this.
pub const REPLY_OFFSET: i32 = 100;

/// The longest name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// The most registrations the server holds at once; more are refused with `NoSpace`.
/// Bounds the server's memory and the size of a [`LIST`] reply (about 4 MiB).
pub const MAX_REGISTRATIONS: usize = 16_384;

/// The reply id for a request id.
pub const fn reply_id(request: i32) -> i32 {
    request.wrapping_add(REPLY_OFFSET)
}

/// Why a name is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Zero bytes.
    #[error("a name must not be empty")]
    Empty,
    /// More than [`MAX_NAME_LEN`] bytes.
    #[error("a name must be at most {MAX_NAME_LEN} bytes, not {0}")]
    TooLong(usize),
    /// Not valid UTF-8.
    #[error("a name must be valid UTF-8")]
    NotUtf8,
    /// A control character (NUL, newline, …) at this byte offset.
    #[error("a name must not contain control characters (one at byte {0})")]
    Control(usize),
}

/// Check a name: 1..=[`MAX_NAME_LEN`] bytes of UTF-8 without control characters.
pub fn validate_name(bytes: &[u8]) -> Result<&str, NameError> {
    if bytes.is_empty() {
        return Err(NameError::Empty);
    }
    if bytes.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(bytes.len()));
    }
    let s = std::str::from_utf8(bytes).map_err(|_| NameError::NotUtf8)?;
    if let Some((at, _)) = s.char_indices().find(|(_, c)| c.is_control()) {
        return Err(NameError::Control(at));
    }
    Ok(s)
}

/// The kind of right a request carried, as far as decoding cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgRight {
    /// A send right.
    Send,
    /// Anything else: send-once, receive, dead name.
    Other,
}

/// A request, decoded and validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// [`REGISTER`]: the one port right is the send right to register.
    Register {
        /// The name.
        name: &'a str,
    },
    /// [`LOOKUP`].
    Lookup {
        /// The name.
        name: &'a str,
    },
    /// [`UNREGISTER`]; `with_right` if the request presents the registered send right.
    Unregister {
        /// The name.
        name: &'a str,
        /// Whether the request carries a send right as proof.
        with_right: bool,
    },
    /// [`LIST`].
    List,
}

/// Decode a request from its id, in-line data, the kinds of its port rights and
/// whether it carried out-of-line memory. An error is the code to answer with.
pub fn decode_request<'a>(
    id: i32,
    data: &'a [u8],
    rights: &[ArgRight],
    has_ool: bool,
) -> Result<Request<'a>, ReturnCode> {
    if !matches!(id, REGISTER | LOOKUP | UNREGISTER | LIST) {
        return Err(ReturnCode::MigBadId);
    }
    if has_ool {
        return Err(ReturnCode::InvalidArgument);
    }
    if id == LIST {
        return if data.is_empty() && rights.is_empty() { Ok(Request::List) } else { Err(ReturnCode::InvalidArgument) };
    }
    let name = validate_name(data).map_err(|_| ReturnCode::InvalidArgument)?;
    match (id, rights) {
        (REGISTER, [ArgRight::Send]) => Ok(Request::Register { name }),
        (REGISTER, [ArgRight::Other]) => Err(ReturnCode::InvalidRight),
        (LOOKUP, []) => Ok(Request::Lookup { name }),
        (UNREGISTER, []) => Ok(Request::Unregister { name, with_right: false }),
        (UNREGISTER, [ArgRight::Send]) => Ok(Request::Unregister { name, with_right: true }),
        _ => Err(ReturnCode::InvalidArgument),
    }
}

/// A reply's in-line data: the code, then `rest`.
pub fn encode_reply(code: ReturnCode, rest: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + rest.len());
    v.extend_from_slice(&code.code().to_le_bytes());
    v.extend_from_slice(rest);
    v
}

/// Why a reply could not be understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply's id is not the request's id + [`REPLY_OFFSET`].
    #[error("reply id {got}, expected {expected}")]
    WrongId {
        /// What came.
        got: i32,
        /// What should have.
        expected: i32,
    },
    /// Too short for its return code, or the rest does not decode.
    #[error("malformed reply: {0}")]
    Malformed(&'static str),
    /// A listed name is not a valid name.
    #[error("the list carries an invalid name: {0}")]
    BadName(NameError),
}

/// Split a reply's in-line data into its code and the rest, checking its id.
pub fn decode_reply(request: i32, id: i32, data: &[u8]) -> Result<(u32, &[u8]), ReplyError> {
    let expected = reply_id(request);
    if id != expected {
        return Err(ReplyError::WrongId { got: id, expected });
    }
    if data.len() < 4 {
        return Err(ReplyError::Malformed("shorter than its return code"));
    }
    let code = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    Ok((code, &data[4..]))
}

/// Encode the names of a [`LIST`] reply (after the code).
pub fn encode_list<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + names.len() * 16);
    v.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for n in names {
        // Names are at most MAX_NAME_LEN bytes, so the length fits.
        v.extend_from_slice(&(n.len() as u16).to_le_bytes());
        v.extend_from_slice(n.as_bytes());
    }
    v
}

/// Decode the names of a [`LIST`] reply (after the code), validating each.
pub fn decode_list(mut data: &[u8]) -> Result<Vec<String>, ReplyError> {
    let take = |data: &mut &[u8], n: usize| -> Result<Vec<u8>, ReplyError> {
        if data.len() < n {
            return Err(ReplyError::Malformed("list shorter than its lengths"));
        }
        let (head, tail) = data.split_at(n);
        *data = tail;
        Ok(head.to_vec())
    };
    let count = u32::from_le_bytes(take(&mut data, 4)?.try_into().expect("4 bytes"));
    // Each name takes at least 3 bytes: refuse a count the data cannot hold before
    // allocating for it.
    if count as usize > data.len() / 3 {
        return Err(ReplyError::Malformed("list count larger than its data"));
    }
    let mut names = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = u16::from_le_bytes(take(&mut data, 2)?.try_into().expect("2 bytes"));
        let bytes = take(&mut data, usize::from(len))?;
        validate_name(&bytes).map_err(ReplyError::BadName)?;
        names.push(String::from_utf8(bytes).expect("validated"));
    }
    if !data.is_empty() {
        return Err(ReplyError::Malformed("bytes after the last name"));
    }
    Ok(names)
}

/// A return code as a reader would want it: its `ReturnCode` name, or the number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub u32);

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match ReturnCode::from_code(self.0) {
            Some(r) => write!(f, "{r}"),
            None => write!(f, "unknown code {:#x}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert_eq!(validate_name(b"clock"), Ok("clock"));
        assert_eq!(validate_name("métronome ♩".as_bytes()), Ok("métronome ♩"));
        assert_eq!(validate_name(&[b'a'; MAX_NAME_LEN]).map(str::len), Ok(MAX_NAME_LEN));
        assert_eq!(validate_name(b""), Err(NameError::Empty));
        assert_eq!(validate_name(&[b'a'; MAX_NAME_LEN + 1]), Err(NameError::TooLong(256)));
        assert_eq!(validate_name(b"a\xffb"), Err(NameError::NotUtf8));
        assert_eq!(validate_name(b"a\0b"), Err(NameError::Control(1)));
        assert_eq!(validate_name(b"a\nb"), Err(NameError::Control(1)));
        assert_eq!(validate_name(b"\x7f"), Err(NameError::Control(0)));
        assert_eq!(validate_name("a\u{85}".as_bytes()), Err(NameError::Control(1)));
    }

    #[test]
    fn requests_decode_only_in_their_shape() {
        use ArgRight::*;
        assert_eq!(decode_request(REGISTER, b"x", &[Send], false), Ok(Request::Register { name: "x" }));
        assert_eq!(decode_request(REGISTER, b"x", &[], false), Err(ReturnCode::InvalidArgument));
        assert_eq!(decode_request(REGISTER, b"x", &[Send, Send], false), Err(ReturnCode::InvalidArgument));
        assert_eq!(decode_request(REGISTER, b"x", &[Other], false), Err(ReturnCode::InvalidRight));
        assert_eq!(decode_request(REGISTER, b"x", &[Send], true), Err(ReturnCode::InvalidArgument));
        assert_eq!(decode_request(REGISTER, b"", &[Send], false), Err(ReturnCode::InvalidArgument));
        assert_eq!(decode_request(LOOKUP, b"x", &[], false), Ok(Request::Lookup { name: "x" }));
        assert_eq!(decode_request(LOOKUP, b"x", &[Send], false), Err(ReturnCode::InvalidArgument));
        assert_eq!(
            decode_request(UNREGISTER, b"x", &[], false),
            Ok(Request::Unregister { name: "x", with_right: false })
        );
        assert_eq!(
            decode_request(UNREGISTER, b"x", &[Send], false),
            Ok(Request::Unregister { name: "x", with_right: true })
        );
        assert_eq!(decode_request(UNREGISTER, b"x", &[Other], false), Err(ReturnCode::InvalidArgument));
        assert_eq!(decode_request(LIST, b"", &[], false), Ok(Request::List));
        assert_eq!(decode_request(LIST, b"x", &[], false), Err(ReturnCode::InvalidArgument));
        assert_eq!(decode_request(LIST, b"", &[Send], false), Err(ReturnCode::InvalidArgument));
        assert_eq!(decode_request(4242, b"", &[], false), Err(ReturnCode::MigBadId));
        assert_eq!(decode_request(i32::MIN, b"", &[], true), Err(ReturnCode::MigBadId));
    }

    #[test]
    fn replies_and_lists_round_trip() {
        let data = encode_reply(ReturnCode::NameExists, b"");
        assert_eq!(decode_reply(REGISTER, 4100, &data), Ok((13, &b""[..])));
        assert!(matches!(decode_reply(REGISTER, 4101, &data), Err(ReplyError::WrongId { .. })));
        assert!(decode_reply(REGISTER, 4100, &data[..3]).is_err());
        assert_eq!(reply_id(i32::MAX), i32::MIN + 99);

        let names = ["a", "clock", "métronome"];
        let enc = encode_list(names.iter().copied());
        assert_eq!(decode_list(&enc).unwrap(), names);
        assert_eq!(decode_list(&encode_list(std::iter::empty())).unwrap(), Vec::<String>::new());
        assert!(decode_list(&enc[..enc.len() - 1]).is_err());
        let mut extra = enc.clone();
        extra.push(0);
        assert!(decode_list(&extra).is_err());
        assert!(decode_list(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(matches!(decode_list(&[1, 0, 0, 0, 1, 0, b'\n']), Err(ReplyError::BadName(_))));
        assert!(decode_list(&[1, 0, 0, 0, 0, 0, 0]).is_err());
    }
}
