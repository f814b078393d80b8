//! The name server's interface, [`Names`], declared once with
//! `#[ictus_idl::interface]`: the client stubs ([`NamesClient`], which
//! [`crate::Client`] wraps) and the server's demultiplexer ([`NamesServer`], which
//! the name server (`ictus_name_server::Server`) runs) are generated from it, so everything about the wire follows
//! from the trait below and the conventions of [`ictus_idl`].
//!
//! # Requests
//!
//! Every request is a routine: it is sent with a reply right (the stubs use
//! [`ictus_ipc::Space::call`], which makes a send-once right for each call). A request
//! without one is carried out if it is valid, but nobody hears the answer.
//!
//! | id | method | in-line data | port rights |
//! | --- | --- | --- | --- |
//! | 4000 | [`Names::register`] ([`REGISTER`]) | the name | one send right: the one to register |
//! | 4001 | [`Names::lookup`] ([`LOOKUP`]) | the name | none |
//! | 4002 | [`Names::unregister`] ([`UNREGISTER`]) | the name | none |
//! | 4003 | [`Names::list`] ([`LIST`]) | empty | none |
//! | 4004 | [`Names::unregister_with_right`] ([`UNREGISTER_WITH_RIGHT`]) | the name | one send right: the registered one, as proof |
//!
//! A name travels as a `String` does: a `u32` LE length, then the bytes, which must be
//! UTF-8. The server's methods then check that it is a valid name: 1 to
//! [`MAX_NAME_LEN`] bytes with no control characters (no NUL, no newline, nothing below
//! U+0020, no U+007F–U+009F). No request carries out-of-line memory.
//!
//! A request that does not decode as its method says — an unknown id, a string that is
//! short or not UTF-8, trailing bytes, a missing, extra or wrong kind of right (a
//! send-once or receive right where a send right belongs), out-of-line memory — never
//! reaches a method: the runtime answers `MIG_BAD_ID` or `MIG_BAD_ARGUMENTS` and
//! releases every right the request brought (a receive right is destroyed: its port
//! dies).
//!
//! # Replies
//!
//! The reply's id is the request's id + 100 (wrapping, so that even a nonsense id gets
//! a well-defined answer). Its in-line data starts with a `u32` LE return code, an
//! [`ictus_abi::ReturnCode`]; a method's [`NamesError`] travels as its code:
//!
//! | code | [`NamesError`] | meaning | Mach's `netname` equivalent |
//! | --- | --- | --- | --- |
//! | `Success` (0) | — | done | `NETNAME_SUCCESS` |
//! | `NameExists` (13) | `NameExists` | register: the name is taken | (`netname_check_in` replaced it) |
//! | `InvalidName` (15) | `NotFound` | lookup / unregister: no such name is registered | `NETNAME_NOT_CHECKED_IN` (2001) |
//! | `NoAccess` (8) | `NotOwner` | unregister: neither the registering task nor the holder of the right | `NETNAME_NOT_YOUR_ENTRY` (2000) |
//! | `InvalidArgument` (4) | `BadName` | the name is not a valid name | — |
//! | `InvalidRight` (17) | `BadRight` | register: the right's port is dead | `NETNAME_INVALID_PORT` (2004) |
//! | `NoSpace` (3) | `Full` | register: the server holds [`MAX_REGISTRATIONS`] already | — |
//! | `QuotaExceeded` (`0x10001`) | `QuotaExceeded` | register: the requesting task (its kernel-verified pid) holds [`MAX_NAMES_PER_CLIENT`] already | — |
//! | `ResourceShortage` (6) | `ResourceShortage` | the server could not arm the dead-name request | — |
//! | `MigBadArguments` (`0xfffffed0`) | — | the request does not decode (above) | `MIG_BAD_ARGUMENTS` |
//! | `MigBadId` (`0xfffffed1`) | — | unknown request id | `MIG_BAD_ID` |
//!
//! `InvalidName` rather than a name-server-specific number keeps every ictus answer in
//! one numbering (`ReturnCode`); the table gives the `netname` code it stands for.
//!
//! After a success code:
//!
//! - [`LOOKUP`]: no more data; the reply carries the registered send right (copied from
//!   the server's space) as its one port right.
//! - [`LIST`]: a `u32` LE count, then each name, sorted, as a string (`u32` LE length
//!   and bytes); nothing after the last name.
//! - Everything else: nothing more, and no port rights.
//!
//! # Rights the methods receive
//!
//! A `SendRight` argument is a user reference the request brought into the server's
//! space; the method owns it. [`Names::register`] keeps it on success and releases it on
//! refusal; [`Names::unregister_with_right`] always releases its proof.

use ictus_abi::ReturnCode;
use ictus_idl::{Context, RemoteError, SendRight};

/// The name server: the papers' `netname` (see the module documentation for the wire).
#[ictus_idl::interface(id = 4000)]
pub trait Names {
    /// Register `port` under `name`, for the requesting task (`cx.sender`), which may
    /// later unregister it.
    #[id(0)]
    fn register(&self, cx: &Context, name: String, port: SendRight) -> Result<(), NamesError>;

    /// Look `name` up: a copy of the registered send right.
    #[id(1)]
    fn lookup(&self, name: String) -> Result<SendRight, NamesError>;

    /// Remove the registration of `name`; allowed for the task that registered it.
    #[id(2)]
    fn unregister(&self, cx: &Context, name: String) -> Result<(), NamesError>;

    /// The registered names, sorted.
    #[id(3)]
    fn list(&self) -> Result<Vec<String>, NamesError>;

    /// Remove the registration of `name`, proving the right to do so by presenting the
    /// registered send right itself; allowed for any task that holds it.
    #[id(4)]
    fn unregister_with_right(&self, cx: &Context, name: String, proof: SendRight) -> Result<(), NamesError>;
}

/// Register a send right under a name.
pub const REGISTER: i32 = NamesClient::REGISTER;
/// Look a name up; the reply carries a send right.
pub const LOOKUP: i32 = NamesClient::LOOKUP;
/// Remove a registration (by the registering task).
pub const UNREGISTER: i32 = NamesClient::UNREGISTER;
/// List the registered names.
pub const LIST: i32 = NamesClient::LIST;
/// Remove a registration, presenting its right.
pub const UNREGISTER_WITH_RIGHT: i32 = NamesClient::UNREGISTER_WITH_RIGHT;
/// A reply's id is its request's id plus this.
pub const REPLY_OFFSET: i32 = 100;

/// The longest name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// The most registrations the server holds at once; more are refused with `NoSpace`.
/// Bounds the server's memory and the size of a [`LIST`] reply (about 4 MiB).
pub const MAX_REGISTRATIONS: usize = 16_384;
/// The most registrations one task (one kernel-verified pid) holds at once; more are
/// refused with `QuotaExceeded`, so that no one task can take the whole table (or every
/// descriptor the server may open) from the others. A server registers a handful of
/// names; 256 leaves room for a task that registers one per client or device.
pub const MAX_NAMES_PER_CLIENT: usize = 256;

/// The reply id for a request id.
pub const fn reply_id(request: i32) -> i32 {
    ictus_idl::reply_id(request)
}

/// Why the server refused a request that reached its method. Travels as the reply's
/// return code (see the module documentation's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum NamesError {
    /// The name is not a valid name (`InvalidArgument`).
    #[error("the name is not a valid name")]
    BadName,
    /// Register: the name is taken (`NameExists`).
    #[error("the name is already registered")]
    NameExists,
    /// Lookup, unregister: no such name is registered (`InvalidName`).
    #[error("no such name is registered")]
    NotFound,
    /// Unregister: neither the registering task nor the holder of the right
    /// (`NoAccess`).
    #[error("neither the registering task nor the holder of the right")]
    NotOwner,
    /// Register: the right's port is dead (`InvalidRight`).
    #[error("the right is not a live send right")]
    BadRight,
    /// Register: the server holds [`MAX_REGISTRATIONS`] already (`NoSpace`).
    #[error("the name server holds {MAX_REGISTRATIONS} names, its limit for all tasks together")]
    Full,
    /// Register: the requesting task holds [`MAX_NAMES_PER_CLIENT`] names already
    /// (`QuotaExceeded`).
    #[error("the requesting task holds {MAX_NAMES_PER_CLIENT} names, the quota per task")]
    QuotaExceeded,
    /// The server could not arm the dead-name request (`ResourceShortage`).
    #[error("the name server could not watch the right")]
    ResourceShortage,
}

impl NamesError {
    /// Every error, for look-ups and tests.
    pub const ALL: [NamesError; 8] = [
        NamesError::BadName,
        NamesError::NameExists,
        NamesError::NotFound,
        NamesError::NotOwner,
        NamesError::BadRight,
        NamesError::Full,
        NamesError::QuotaExceeded,
        NamesError::ResourceShortage,
    ];

    /// The return code that carries it.
    pub const fn return_code(self) -> ReturnCode {
        match self {
            NamesError::BadName => ReturnCode::InvalidArgument,
            NamesError::NameExists => ReturnCode::NameExists,
            NamesError::NotFound => ReturnCode::InvalidName,
            NamesError::NotOwner => ReturnCode::NoAccess,
            NamesError::BadRight => ReturnCode::InvalidRight,
            NamesError::Full => ReturnCode::NoSpace,
            NamesError::QuotaExceeded => ReturnCode::QuotaExceeded,
            NamesError::ResourceShortage => ReturnCode::ResourceShortage,
        }
    }
}

impl RemoteError for NamesError {
    fn code(&self) -> u32 {
        self.return_code().code()
    }

    fn from_code(code: u32) -> Option<Self> {
        NamesError::ALL.into_iter().find(|e| e.code() == code)
    }
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

/// Why a reply could not be understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply does not decode as the interface says (wrong id, too short, extra or
    /// missing rights, …); whatever rights it brought were released.
    #[error("malformed reply: {0}")]
    Decode(#[from] ictus_idl::DecodeError),
    /// A listed name is not a valid name.
    #[error("the list carries an invalid name: {0}")]
    BadName(NameError),
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
    fn message_ids_are_netnames() {
        assert_eq!([REGISTER, LOOKUP, UNREGISTER, LIST, UNREGISTER_WITH_RIGHT], [4000, 4001, 4002, 4003, 4004]);
        assert_eq!(reply_id(REGISTER), 4100);
        assert_eq!(reply_id(i32::MAX), i32::MIN + 99);
    }

    #[test]
    fn errors_travel_as_return_codes() {
        for e in NamesError::ALL {
            assert_ne!(e.code(), 0);
            assert_eq!(NamesError::from_code(e.code()), Some(e));
            assert_eq!(ReturnCode::from_code(e.code()), Some(e.return_code()));
        }
        assert_eq!(NamesError::NotFound.code(), ReturnCode::InvalidName.code());
        assert_eq!(NamesError::NameExists.code(), 13);
        // The runtime's own codes are never mistaken for a method's error.
        for r in [ReturnCode::Success, ReturnCode::MigBadId, ReturnCode::MigBadArguments, ReturnCode::Failure] {
            assert_eq!(NamesError::from_code(r.code()), None);
        }
    }
}
