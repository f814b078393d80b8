//! The real-time message header: a checked view over untrusted bytes.
//!
//! One real-time message is one `SOCK_SEQPACKET` datagram (or, for a reply, one write
//! to the client's reply pipe), little-endian:
//!
//! ```text
//! 0 magic u32 "RTI2" | 4 kind u8 | 5 flags u8 | 6 priority u8 | 7 zero u8
//! 8 seq u32          | 12 len u32 | 16 conn u32 | 20 body (len bytes)
//! ```
//!
//! `conn` is the token of the client's connection: requests travel on the port's main
//! connection, as the nucleus's calls do, and name the connection they came from (the
//! port believes the name only from the process that made that connection, as the
//! kernel stamps it); the port's answer to a connection offer tells the client its
//! token. Other kinds carry none.
//!
//! Its magic differs from the nucleus's (`ICT1`), so a plain port refuses a real-time
//! message and a real-time port a plain one: the paper's rule that normal ports carry
//! only normal messages and real-time ports only real-time ones.

/// `"RTI2"` little-endian.
pub const RT_MAGIC: u32 = u32::from_le_bytes(*b"RTI2");
/// Bytes in the header.
pub const RT_HEADER_LEN: usize = 20;

/// The request wants a reply and its sender waits for it (synchronous mode).
pub const FLAG_SYNC: u8 = 1;
/// On a reply pipe: the reply is on the connection instead (it did not fit the pipe).
/// Such a header has no body.
pub const FLAG_ON_SOCKET: u8 = 2;

/// What a datagram is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A client offers a connection: its own socket end, its shared page and the write
    /// end of its reply pipe.
    Connect = 1,
    /// The port accepts: `conn` = the connection's token, body = attributes (16 bytes)
    /// and the server's pid (4 bytes), one descriptor = the port's read-only status page.
    Accept = 2,
    /// A message for the receivers, naming its connection.
    Request = 3,
    /// A reply to a synchronous request.
    Reply = 4,
    /// A doorbell: wakes the receiver waiting on the port's main connection, says
    /// nothing else.
    Wake = 5,
}

impl Kind {
    /// File descriptors that must travel with a datagram of this kind.
    pub fn fds(self) -> usize {
        match self {
            Kind::Connect => 3,
            Kind::Accept => 1,
            Kind::Request | Kind::Reply | Kind::Wake => 0,
        }
    }
}

/// A validated header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtHeader {
    /// What the datagram is.
    pub kind: Kind,
    /// [`FLAG_SYNC`] (a request), [`FLAG_ON_SOCKET`] (a reply), or nothing.
    pub flags: u8,
    /// The priority the sender claims (0..=99).
    pub priority: u8,
    /// The sender's sequence number on its connection; a reply repeats its request's.
    pub seq: u32,
    /// Body length.
    pub len: u32,
    /// The connection's token (a request, an accept), else 0.
    pub conn: u32,
}

/// Why untrusted bytes are not a real-time message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RtDecodeError {
    /// Shorter than the header.
    #[error("{0} bytes is shorter than the real-time header")]
    Short(usize),
    /// Not a real-time message (a plain ictus message has magic `ICT1`).
    #[error("bad magic {0:#010x}: not a real-time message")]
    BadMagic(u32),
    /// Unknown kind.
    #[error("unknown kind {0}")]
    BadKind(u8),
    /// Unknown flags, flags on a kind that takes none, a reserved byte set, a body
    /// where none belongs.
    #[error("reserved bits are set")]
    Reserved,
    /// Priority above 99.
    #[error("priority {0} is above 99")]
    BadPriority(u8),
    /// A request or accept without a connection token, or another kind with one.
    #[error("connection token {0} does not fit the kind")]
    BadConnection(u32),
    /// The length field disagrees with the datagram.
    #[error("header says {stated} body bytes, datagram has {actual}")]
    LengthMismatch {
        /// From the header.
        stated: u32,
        /// What arrived.
        actual: usize,
    },
    /// The wrong number of descriptors for the kind.
    #[error("{kind:?} needs {expected} descriptors, {actual} arrived")]
    Fds {
        /// The kind.
        kind: Kind,
        /// What it needs.
        expected: usize,
        /// What arrived.
        actual: usize,
    },
}

impl RtHeader {
    /// A header of `kind` with nothing else set.
    pub const fn new(kind: Kind) -> RtHeader {
        RtHeader { kind, flags: 0, priority: 0, seq: 0, len: 0, conn: 0 }
    }

    /// Encodes into [`RT_HEADER_LEN`] bytes.
    pub fn encode(&self) -> [u8; RT_HEADER_LEN] {
        let mut out = [0u8; RT_HEADER_LEN];
        out[0..4].copy_from_slice(&RT_MAGIC.to_le_bytes());
        out[4] = self.kind as u8;
        out[5] = self.flags;
        out[6] = self.priority;
        out[8..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..20].copy_from_slice(&self.conn.to_le_bytes());
        out
    }

    /// Validates a whole untrusted datagram of `bytes` that arrived with `nfds`
    /// descriptors; on success the body is `bytes[RT_HEADER_LEN..]`.
    pub fn parse(bytes: &[u8], nfds: usize) -> Result<RtHeader, RtDecodeError> {
        if bytes.len() < RT_HEADER_LEN {
            return Err(RtDecodeError::Short(bytes.len()));
        }
        RtHeader::parse_parts(&bytes[..RT_HEADER_LEN], bytes.len() - RT_HEADER_LEN, nfds)
    }

    /// Validates an untrusted header received apart from its body, given the number
    /// of body bytes and descriptors that arrived with it.
    pub fn parse_parts(head: &[u8], body_len: usize, nfds: usize) -> Result<RtHeader, RtDecodeError> {
        if head.len() < RT_HEADER_LEN {
            return Err(RtDecodeError::Short(head.len()));
        }
        let word = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
        let magic = word(0);
        if magic != RT_MAGIC {
            return Err(RtDecodeError::BadMagic(magic));
        }
        let kind = match head[4] {
            1 => Kind::Connect,
            2 => Kind::Accept,
            3 => Kind::Request,
            4 => Kind::Reply,
            5 => Kind::Wake,
            k => return Err(RtDecodeError::BadKind(k)),
        };
        let flags = head[5];
        let allowed = match kind {
            Kind::Request => FLAG_SYNC,
            Kind::Reply => FLAG_ON_SOCKET,
            _ => 0,
        };
        if flags & !allowed != 0 || head[7] != 0 {
            return Err(RtDecodeError::Reserved);
        }
        let priority = head[6];
        if priority > crate::attr::MAX_PRIORITY {
            return Err(RtDecodeError::BadPriority(priority));
        }
        let (seq, len, conn) = (word(8), word(12), word(16));
        if len as usize != body_len {
            return Err(RtDecodeError::LengthMismatch { stated: len, actual: body_len });
        }
        if (flags & FLAG_ON_SOCKET != 0 || kind == Kind::Wake) && len != 0 {
            return Err(RtDecodeError::Reserved);
        }
        let named = matches!(kind, Kind::Request | Kind::Accept);
        if named != (conn != 0) {
            return Err(RtDecodeError::BadConnection(conn));
        }
        if nfds != kind.fds() {
            return Err(RtDecodeError::Fds { kind, expected: kind.fds(), actual: nfds });
        }
        Ok(RtHeader { kind, flags, priority, seq, len, conn })
    }

    /// Whether the sender waits for a reply.
    pub fn is_sync(&self) -> bool {
        self.flags & FLAG_SYNC != 0
    }

    /// Whether a reply header on a pipe says the reply is on the connection.
    pub fn on_socket(&self) -> bool {
        self.flags & FLAG_ON_SOCKET != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn datagram(h: RtHeader, body: &[u8]) -> Vec<u8> {
        let mut v = h.encode().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn round_trip_and_refusals() {
        let h = RtHeader { kind: Kind::Request, flags: FLAG_SYNC, priority: 42, seq: 7, len: 3, conn: 9 };
        assert_eq!(RtHeader::parse(&datagram(h, b"abc"), 0), Ok(h));
        assert!(matches!(RtHeader::parse(&datagram(h, b"ab"), 0), Err(RtDecodeError::LengthMismatch { .. })));
        assert!(matches!(RtHeader::parse(&datagram(h, b"abc"), 1), Err(RtDecodeError::Fds { .. })));
        let mut bad = datagram(h, b"abc");
        bad[0] = b'I';
        assert!(matches!(RtHeader::parse(&bad, 0), Err(RtDecodeError::BadMagic(_))));
        let mut bad = datagram(h, b"abc");
        bad[6] = 100;
        assert_eq!(RtHeader::parse(&bad, 0), Err(RtDecodeError::BadPriority(100)));
        let reply = RtHeader { kind: Kind::Reply, flags: FLAG_SYNC, priority: 0, seq: 1, len: 0, conn: 0 };
        assert_eq!(RtHeader::parse(&datagram(reply, b""), 0), Err(RtDecodeError::Reserved));
        // A request must name its connection, a reply must not.
        let anonymous = RtHeader { conn: 0, ..h };
        assert_eq!(RtHeader::parse(&datagram(anonymous, b"abc"), 0), Err(RtDecodeError::BadConnection(0)));
        let named = RtHeader { kind: Kind::Reply, conn: 3, ..RtHeader::new(Kind::Reply) };
        assert_eq!(RtHeader::parse(&datagram(named, b""), 0), Err(RtDecodeError::BadConnection(3)));
        // "On the socket" has no body; a doorbell neither.
        let word = RtHeader { kind: Kind::Reply, flags: FLAG_ON_SOCKET, seq: 1, ..RtHeader::new(Kind::Reply) };
        assert_eq!(RtHeader::parse(&datagram(word, b""), 0).map(|h| h.on_socket()), Ok(true));
        let word = RtHeader { len: 1, ..word };
        assert_eq!(RtHeader::parse(&datagram(word, b"x"), 0), Err(RtDecodeError::Reserved));
        let bell = RtHeader::new(Kind::Wake);
        assert_eq!(RtHeader::parse(&datagram(bell, b""), 0), Ok(bell));
        assert_eq!(RtHeader::parse(&datagram(RtHeader { len: 2, ..bell }, b"hi"), 0), Err(RtDecodeError::Reserved));
        // A plain ictus header is refused.
        let mut plain = vec![0u8; 32];
        plain[0..4].copy_from_slice(b"ICT1");
        assert!(matches!(RtHeader::parse(&plain, 0), Err(RtDecodeError::BadMagic(_))));
        assert_eq!(RtHeader::parse(b"RTI", 0), Err(RtDecodeError::Short(3)));
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_accepts_only_consistent_datagrams(bytes in proptest::collection::vec(any::<u8>(), 0..64), nfds in 0usize..4) {
            if let Ok(h) = RtHeader::parse(&bytes, nfds) {
                prop_assert_eq!(h.len as usize + RT_HEADER_LEN, bytes.len());
                prop_assert_eq!(h.kind.fds(), nfds);
                prop_assert!(h.priority <= 99);
                prop_assert_eq!(&h.encode()[..], &bytes[..RT_HEADER_LEN]);
            }
        }
    }
}
