//! The ictus wire format.
//!
//! Everything that crosses a port is described here, and nothing here makes a system
//! call: the nucleus (`ictus-ipc`) moves bytes and descriptors, this crate says what
//! they mean. Untrusted bytes go through [`Datagram::parse`], which checks every
//! length, count and reserved bit before anything is read; the result is a validated
//! form the nucleus can use without further checks.
//!
//! One message is one `SOCK_SEQPACKET` datagram, laid out little-endian as
//!
//! ```text
//! +--------------------+---------------------------+------------------+
//! | Header (32 bytes)  | Descriptor × ndesc (24 B) | in-line data     |
//! +--------------------+---------------------------+------------------+
//! ```
//!
//! with `nfds` file descriptors beside it in one `SCM_RIGHTS` control message, in this
//! order: the reply right (if any: one, or two for a call channel offered with its reply
//! pipe), the big in-line memfd (if any), then each descriptor's descriptors in
//! descriptor order.
//!
//! A call channel's reply pipe carries [`PipeMessage`]s instead: a header and in-line
//! data in one `write` of at most [`PIPE_MESSAGE_MAX`] bytes, checked by
//! [`PipeMessage::parse`].
#![forbid(unsafe_code)]

mod name;
mod notify;
mod ret;
mod wire;

pub use name::{Name, NameIndex};
pub use notify::NotifyId;
pub use ret::ReturnCode;
pub use wire::{
    Datagram, DecodeError, Descriptor, DescriptorKind, Head, Header, PipeMessage, ReceiveRightInfo, ReplyKind,
    BIG_INLINE_MAX, COUNTED_FLAG, DATAGRAM_MAX, DESCRIPTOR_LEN, FLAGS_OFFSET, HEADER_LEN, HEAD_MAX,
    INLINE_DATAGRAM_MAX, MAGIC, MAX_DESCRIPTORS, MAX_FDS, OOL_MAX, PIPE_MESSAGE_MAX, VERSION,
};
