//! Header and descriptors: a checked view over untrusted bytes, and the validated form.

use thiserror::Error;

/// `"ICT1"` in little-endian: the first four bytes of every ictus message.
pub const MAGIC: u32 = u32::from_le_bytes(*b"ICT1");
/// The wire version this crate speaks.
pub const VERSION: u16 = 4;
/// Bytes in the fixed header.
pub const HEADER_LEN: usize = 32;
/// Bytes in one descriptor.
pub const DESCRIPTOR_LEN: usize = 24;
/// Most descriptors one message may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most file descriptors one message may carry (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 128;
/// Most in-line bytes carried in the datagram itself; larger in-line data is copied
/// through an anonymous memfd (the "big in-line" path).
pub const INLINE_DATAGRAM_MAX: usize = 64 * 1024;
/// Most bytes of one message on a call channel's reply pipe: `PIPE_BUF`, the most one
/// `write` puts in a pipe in one piece.
pub const PIPE_MESSAGE_MAX: usize = 4096;
/// Most in-line bytes one message may carry in all (1 GiB).
pub const BIG_INLINE_MAX: u64 = 1 << 30;
/// Most bytes of header and descriptors in one datagram.
pub const HEAD_MAX: usize = HEADER_LEN + MAX_DESCRIPTORS * DESCRIPTOR_LEN;
/// Most bytes in one datagram.
pub const DATAGRAM_MAX: usize = HEAD_MAX + INLINE_DATAGRAM_MAX;
/// Largest out-of-line region one descriptor may describe (64 GiB).
pub const OOL_MAX: u64 = 64 << 30;

const FLAG_BIG_INLINE: u16 = 1 << 0;
const FLAG_CHANNEL_KEPT: u16 = 1 << 1;
const FLAG_ON_SOCKET: u16 = 1 << 2;
const FLAG_COUNTED: u16 = 1 << 3;
const KNOWN_FLAGS: u16 = FLAG_BIG_INLINE | FLAG_CHANNEL_KEPT | FLAG_ON_SOCKET | FLAG_COUNTED;

/// The byte offset of the header's flags, and the counted flag in them: what a receiver
/// reads of a datagram before anything else is checked (see [`Header::counted`]).
pub const FLAGS_OFFSET: usize = 6;
/// The header's "counted" flag, as a bit of the little-endian `u16` at [`FLAGS_OFFSET`].
pub const COUNTED_FLAG: u16 = FLAG_COUNTED;

const RECV_HAS_SEND_SOURCE: u16 = 1 << 0;
const RECV_NO_SENDERS: u16 = 1 << 1;
const RECV_PORT_DESTROYED: u16 = 1 << 2;
const RECV_KNOWN_FLAGS: u16 = RECV_HAS_SEND_SOURCE | RECV_NO_SENDERS | RECV_PORT_DESTROYED;

/// What the reply slot of a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplyKind {
    /// No reply right.
    None = 0,
    /// A send right (made or copied or moved by the sender).
    Send = 1,
    /// A send-once right.
    SendOnce = 2,
    /// A *call channel* offered: one end of a connection the sender made for the replies
    /// to its calls to this port, with the header's `token` naming it. The receiver keeps
    /// it under (sender's pid, token); this request's reply goes back through it.
    Channel = 3,
    /// A request to be answered on the call channel the same sender offered earlier
    /// under the header's `token`; no file descriptor travels.
    OnChannel = 4,
    /// A call channel offered as with [`ReplyKind::Channel`], with a *reply pipe*
    /// beside it: two file descriptors, the connection's end, then the write end of a
    /// pipe the sender reads its replies from. Replies that carry in-line data only go
    /// through the pipe (see [`PipeMessage`]); anything else goes on the connection.
    ChannelPipe = 5,
}

impl ReplyKind {
    fn from_u8(v: u8) -> Option<ReplyKind> {
        match v {
            0 => Some(ReplyKind::None),
            1 => Some(ReplyKind::Send),
            2 => Some(ReplyKind::SendOnce),
            3 => Some(ReplyKind::Channel),
            4 => Some(ReplyKind::OnChannel),
            5 => Some(ReplyKind::ChannelPipe),
            _ => None,
        }
    }
}

/// The fixed message header.
///
/// ```text
/// 0  magic u32 | 4 version u16 | 6 flags u16 | 8 id i32 | 12 reply u8 | 13 ndesc u8
/// 14 nfds u8   | 15 zero u8    | 16 inline_len u32 | 20 token u32 | 24 big_len u64
/// flags: bit 0 big in-line, bit 1 channel kept, bit 2 on socket (reply pipes only),
///        bit 3 counted (a place in the port's queue was reserved for it).
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The message id (Mach's `msgh_id`): what the receiver is asked to do.
    pub id: i32,
    /// What the reply slot carries.
    pub reply: ReplyKind,
    /// The call channel's token: non-zero exactly when `reply` is
    /// [`ReplyKind::Channel`] or [`ReplyKind::OnChannel`].
    pub token: u32,
    /// Set on a reply sent back on a call channel that the port keeps for the caller's
    /// later calls (so the caller may name it by its token again).
    pub kept: bool,
    /// Set only on a message on a call channel's reply pipe that carries no reply of
    /// its own but says that the reply waits on the channel's connection. A datagram
    /// with it set is refused.
    pub on_socket: bool,
    /// Set by a sender that reserved a place for this message in the destination
    /// port's queue (its queue limit, `doc/ipc.md`, *Queue limits*): the receiver gives
    /// the place back when it takes the message. Meaningful on a port's main
    /// connection only; a sender can set it without reserving, which only makes room
    /// for others sooner (the kernel's buffer still bounds what is queued).
    pub counted: bool,
    /// Number of descriptors after the header.
    pub ndesc: u8,
    /// Number of file descriptors that travel beside the datagram.
    pub nfds: u8,
    /// In-line bytes in this datagram, after the descriptors.
    pub inline_len: u32,
    /// In-line bytes carried in a memfd instead (0 if none). When non-zero, `inline_len`
    /// is zero and the memfd is the descriptor after the reply right.
    pub big_len: u64,
}

/// What a descriptor describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DescriptorKind {
    /// A send right: one file descriptor.
    Send = 1,
    /// A send-once right: one file descriptor.
    SendOnce = 2,
    /// A receive right: its connections and its state.
    Receive = 3,
    /// An out-of-line memory region: one sealed memfd.
    Ool = 4,
}

impl DescriptorKind {
    fn from_u8(v: u8) -> Option<DescriptorKind> {
        match v {
            1 => Some(DescriptorKind::Send),
            2 => Some(DescriptorKind::SendOnce),
            3 => Some(DescriptorKind::Receive),
            4 => Some(DescriptorKind::Ool),
            _ => None,
        }
    }
}

/// The state that travels with a receive right.
///
/// Its file descriptors come in this order: the port's queue page (always), its send
/// source (if it has one), its main connections, its send-once connections, its call
/// channels, then the notify rights of its no-senders and port-destroyed requests (if
/// armed). A moved receive right's sequence number and make-send count start again at
/// zero, as in Mach (`ipc_port_clear_receiver`), so they do not travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReceiveRightInfo {
    /// Whether a send source follows the queue page (the port's `S` end, from which
    /// send rights are made).
    pub has_send_source: bool,
    /// Number of main connections (receive ends that send rights reach).
    pub main_conns: u16,
    /// Number of send-once connections (each reached by one outstanding send-once right).
    pub once_conns: u8,
    /// Number of call channels (private connections clients made for their calls).
    pub channel_conns: u8,
    /// The port's queue limit, in messages.
    pub qlimit: u32,
    /// The most in-line bytes a message to the port may carry (`0..=BIG_INLINE_MAX`).
    pub message_limit: u32,
    /// Places in the port's queue given back so far (the receiver's own count, which
    /// its queue page only claims: `doc/ipc.md`, *Queue limits*).
    pub released: u32,
    /// Whether a no-senders request is armed: its notify right comes after the channels.
    pub no_senders: bool,
    /// Whether a port-destroyed request is armed: its notify right comes last.
    pub port_destroyed: bool,
}

impl ReceiveRightInfo {
    /// File descriptors this receive right brings.
    pub fn nfds(&self) -> usize {
        1 + usize::from(self.has_send_source)
            + usize::from(self.main_conns)
            + usize::from(self.once_conns)
            + usize::from(self.channel_conns)
            + usize::from(self.no_senders)
            + usize::from(self.port_destroyed)
    }
}

/// One descriptor in a message body, in its validated form.
///
/// ```text
/// 0 kind u8 | 1 nfds u8 | 2 flags u16 | 4 a u32 | 8 b u64 | 16 c u64
/// Send, SendOnce: nfds 1, everything else zero.
/// Ool:            nfds 1, b = length in bytes (1..=OOL_MAX).
/// Receive:        flags bit 0 = has send source, bit 1 = no-senders request,
///                 bit 2 = port-destroyed request, a = message limit, b = places given back,
///                 c = qlimit | main_conns << 32 | once_conns << 48 | channel_conns << 56.
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Descriptor {
    /// A send right.
    Send,
    /// A send-once right.
    SendOnce,
    /// A receive right.
    Receive(ReceiveRightInfo),
    /// An out-of-line region of this many bytes.
    Ool {
        /// Length in bytes.
        len: u64,
    },
}

impl Descriptor {
    /// The kind of this descriptor.
    pub fn kind(&self) -> DescriptorKind {
        match self {
            Descriptor::Send => DescriptorKind::Send,
            Descriptor::SendOnce => DescriptorKind::SendOnce,
            Descriptor::Receive(_) => DescriptorKind::Receive,
            Descriptor::Ool { .. } => DescriptorKind::Ool,
        }
    }

    /// File descriptors this descriptor consumes.
    pub fn nfds(&self) -> usize {
        match self {
            Descriptor::Send | Descriptor::SendOnce | Descriptor::Ool { .. } => 1,
            Descriptor::Receive(info) => info.nfds(),
        }
    }

    /// Encode into 24 bytes.
    pub fn encode(&self, out: &mut [u8; DESCRIPTOR_LEN]) {
        *out = [0; DESCRIPTOR_LEN];
        out[0] = self.kind() as u8;
        // A receive right's count is bounded by MAX_FDS when the message is built.
        out[1] = u8::try_from(self.nfds()).unwrap_or(u8::MAX);
        match *self {
            Descriptor::Send | Descriptor::SendOnce => {}
            Descriptor::Ool { len } => out[8..16].copy_from_slice(&len.to_le_bytes()),
            Descriptor::Receive(info) => {
                let mut flags = if info.has_send_source { RECV_HAS_SEND_SOURCE } else { 0 };
                if info.no_senders {
                    flags |= RECV_NO_SENDERS;
                }
                if info.port_destroyed {
                    flags |= RECV_PORT_DESTROYED;
                }
                out[2..4].copy_from_slice(&flags.to_le_bytes());
                out[4..8].copy_from_slice(&info.message_limit.to_le_bytes());
                out[8..16].copy_from_slice(&u64::from(info.released).to_le_bytes());
                let c = u64::from(info.qlimit)
                    | (u64::from(info.main_conns) << 32)
                    | (u64::from(info.once_conns) << 48)
                    | (u64::from(info.channel_conns) << 56);
                out[16..24].copy_from_slice(&c.to_le_bytes());
            }
        }
    }

    /// Decode and validate 24 untrusted bytes.
    pub fn decode(raw: &[u8; DESCRIPTOR_LEN]) -> Result<Descriptor, DecodeError> {
        let kind = DescriptorKind::from_u8(raw[0]).ok_or(DecodeError::UnknownDescriptor(raw[0]))?;
        let nfds = usize::from(raw[1]);
        let flags = u16::from_le_bytes([raw[2], raw[3]]);
        let a = u32::from_le_bytes(raw[4..8].try_into().expect("4 bytes"));
        let b = u64::from_le_bytes(raw[8..16].try_into().expect("8 bytes"));
        let c = u64::from_le_bytes(raw[16..24].try_into().expect("8 bytes"));
        let d = match kind {
            DescriptorKind::Send | DescriptorKind::SendOnce => {
                if flags != 0 || a != 0 || b != 0 || c != 0 {
                    return Err(DecodeError::ReservedNonZero);
                }
                if kind == DescriptorKind::Send {
                    Descriptor::Send
                } else {
                    Descriptor::SendOnce
                }
            }
            DescriptorKind::Ool => {
                if flags != 0 || a != 0 || c != 0 {
                    return Err(DecodeError::ReservedNonZero);
                }
                if b == 0 || b > OOL_MAX {
                    return Err(DecodeError::BadOolLength(b));
                }
                Descriptor::Ool { len: b }
            }
            DescriptorKind::Receive => {
                if flags & !RECV_KNOWN_FLAGS != 0 || b > u64::from(u32::MAX) {
                    return Err(DecodeError::ReservedNonZero);
                }
                let info = ReceiveRightInfo {
                    has_send_source: flags & RECV_HAS_SEND_SOURCE != 0,
                    no_senders: flags & RECV_NO_SENDERS != 0,
                    port_destroyed: flags & RECV_PORT_DESTROYED != 0,
                    message_limit: a,
                    released: b as u32,
                    qlimit: (c & 0xffff_ffff) as u32,
                    main_conns: ((c >> 32) & 0xffff) as u16,
                    once_conns: ((c >> 48) & 0xff) as u8,
                    channel_conns: (c >> 56) as u8,
                };
                if info.qlimit == 0 {
                    return Err(DecodeError::BadReceiveRight("queue limit of zero"));
                }
                if u64::from(info.message_limit) > BIG_INLINE_MAX {
                    return Err(DecodeError::BadReceiveRight("message limit beyond the largest message"));
                }
                if info.has_send_source && info.main_conns == 0 {
                    return Err(DecodeError::BadReceiveRight("send source without a main connection"));
                }
                Descriptor::Receive(info)
            }
        };
        if d.nfds() != nfds {
            return Err(DecodeError::DescriptorFdCount { expected: d.nfds(), stated: nfds });
        }
        Ok(d)
    }
}

/// Why untrusted bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Fewer bytes than a header.
    #[error("message of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    /// The magic number is wrong: not an ictus message.
    #[error("bad magic {0:#010x}: not an ictus message")]
    BadMagic(u32),
    /// A wire version this build does not speak.
    #[error("wire version {0} is not supported (this build speaks {VERSION})")]
    BadVersion(u16),
    /// A flag or reserved field that must be zero is not.
    #[error("reserved bits are set")]
    ReservedNonZero,
    /// The reply slot holds an unknown kind.
    #[error("unknown reply kind {0}")]
    BadReplyKind(u8),
    /// Too many descriptors.
    #[error("{0} descriptors exceed the limit of {MAX_DESCRIPTORS}")]
    TooManyDescriptors(usize),
    /// Too many file descriptors.
    #[error("{0} file descriptors exceed the limit of {MAX_FDS}")]
    TooManyFds(usize),
    /// The lengths in the header do not add up to the datagram's size.
    #[error("header says {stated} bytes, datagram has {actual}")]
    LengthMismatch {
        /// What the header implies.
        stated: usize,
        /// What arrived.
        actual: usize,
    },
    /// The file descriptor count in the header does not match what arrived.
    #[error("header says {stated} file descriptors, {actual} arrived")]
    FdCountMismatch {
        /// What the header says.
        stated: usize,
        /// What arrived.
        actual: usize,
    },
    /// The descriptors together need a different number of file descriptors.
    #[error("descriptors need {needed} file descriptors, header says {stated}")]
    FdsUnaccounted {
        /// What the descriptors and reply need.
        needed: usize,
        /// What the header says.
        stated: usize,
    },
    /// An unknown descriptor kind.
    #[error("unknown descriptor kind {0}")]
    UnknownDescriptor(u8),
    /// A descriptor states the wrong number of file descriptors for its kind.
    #[error("descriptor needs {expected} file descriptors but states {stated}")]
    DescriptorFdCount {
        /// What its kind needs.
        expected: usize,
        /// What it states.
        stated: usize,
    },
    /// An out-of-line length of zero or beyond [`OOL_MAX`].
    #[error("out-of-line length {0} is zero or too large")]
    BadOolLength(u64),
    /// A big in-line length beyond [`BIG_INLINE_MAX`], or big in-line alongside
    /// in-line bytes in the datagram.
    #[error("bad big in-line length {0}")]
    BadBigInline(u64),
    /// A receive right whose state is inconsistent.
    #[error("bad receive right: {0}")]
    BadReceiveRight(&'static str),
    /// A channel token where none may be, or none where one must be.
    #[error("a call channel token must be given exactly with a channel reply kind")]
    BadToken,
    /// The reply pipe's "on socket" flag in a datagram.
    #[error("a datagram carries the reply pipe's on-socket flag")]
    OnSocketInDatagram,
    /// A message on a reply pipe that is not a plain reply: it names a reply right,
    /// descriptors, big in-line data or a token.
    #[error("a reply pipe carries in-line data only")]
    NotPlainOnPipe,
    /// More in-line bytes than a datagram may carry.
    #[error("{0} in-line bytes exceed the datagram limit of {INLINE_DATAGRAM_MAX}")]
    InlineTooLarge(usize),
}

impl Header {
    /// Encode into 32 bytes.
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        *out = [0; HEADER_LEN];
        let mut flags = if self.big_len != 0 { FLAG_BIG_INLINE } else { 0 };
        if self.kept {
            flags |= FLAG_CHANNEL_KEPT;
        }
        if self.on_socket {
            flags |= FLAG_ON_SOCKET;
        }
        if self.counted {
            flags |= FLAG_COUNTED;
        }
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&flags.to_le_bytes());
        out[8..12].copy_from_slice(&self.id.to_le_bytes());
        out[12] = self.reply as u8;
        out[13] = self.ndesc;
        out[14] = self.nfds;
        out[16..20].copy_from_slice(&self.inline_len.to_le_bytes());
        out[20..24].copy_from_slice(&self.token.to_le_bytes());
        out[24..32].copy_from_slice(&self.big_len.to_le_bytes());
    }

    /// Decode and validate the first 32 of some untrusted bytes. This checks the
    /// header alone; [`Datagram::parse`] checks it against the rest.
    pub fn decode(raw: &[u8]) -> Result<Header, DecodeError> {
        if raw.len() < HEADER_LEN {
            return Err(DecodeError::Short(raw.len()));
        }
        let magic = u32::from_le_bytes(raw[0..4].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([raw[4], raw[5]]);
        if version != VERSION {
            return Err(DecodeError::BadVersion(version));
        }
        let flags = u16::from_le_bytes([raw[6], raw[7]]);
        if flags & !KNOWN_FLAGS != 0 || raw[15] != 0 {
            return Err(DecodeError::ReservedNonZero);
        }
        let id = i32::from_le_bytes(raw[8..12].try_into().expect("4 bytes"));
        let reply = ReplyKind::from_u8(raw[12]).ok_or(DecodeError::BadReplyKind(raw[12]))?;
        let ndesc = raw[13];
        let nfds = raw[14];
        let inline_len = u32::from_le_bytes(raw[16..20].try_into().expect("4 bytes"));
        let token = u32::from_le_bytes(raw[20..24].try_into().expect("4 bytes"));
        let big_len = u64::from_le_bytes(raw[24..32].try_into().expect("8 bytes"));
        if reply.has_token() != (token != 0) {
            return Err(DecodeError::BadToken);
        }
        if usize::from(ndesc) > MAX_DESCRIPTORS {
            return Err(DecodeError::TooManyDescriptors(usize::from(ndesc)));
        }
        if usize::from(nfds) > MAX_FDS {
            return Err(DecodeError::TooManyFds(usize::from(nfds)));
        }
        if inline_len as usize > INLINE_DATAGRAM_MAX {
            return Err(DecodeError::InlineTooLarge(inline_len as usize));
        }
        let big = flags & FLAG_BIG_INLINE != 0;
        if big != (big_len != 0) || big_len > BIG_INLINE_MAX || (big && inline_len != 0) {
            return Err(DecodeError::BadBigInline(big_len));
        }
        let kept = flags & FLAG_CHANNEL_KEPT != 0;
        let on_socket = flags & FLAG_ON_SOCKET != 0;
        let counted = flags & FLAG_COUNTED != 0;
        Ok(Header { id, reply, token, kept, on_socket, counted, ndesc, nfds, inline_len, big_len })
    }

    /// What of this header [`Datagram::encode_head`] takes, to encode it again.
    pub fn head(&self) -> Head {
        Head { id: self.id, reply: self.reply, token: self.token, kept: self.kept, counted: self.counted }
    }

    /// The message's in-line bytes, wherever they travel: in the datagram, or in the
    /// big in-line memfd. What a port's message limit is checked against.
    pub fn inline_total(&self) -> u64 {
        u64::from(self.inline_len) + self.big_len
    }

    /// File descriptors taken by the reply right and the big in-line memfd.
    pub fn leading_fds(&self) -> usize {
        self.reply.fds() + usize::from(self.big_len != 0)
    }
}

impl ReplyKind {
    /// Whether a file descriptor travels for this reply slot.
    pub fn has_fd(self) -> bool {
        self.fds() != 0
    }

    /// How many file descriptors travel for this reply slot.
    pub fn fds(self) -> usize {
        match self {
            ReplyKind::None | ReplyKind::OnChannel => 0,
            ReplyKind::Send | ReplyKind::SendOnce | ReplyKind::Channel => 1,
            ReplyKind::ChannelPipe => 2,
        }
    }

    /// Whether the header's token names a call channel.
    pub fn has_token(self) -> bool {
        matches!(self, ReplyKind::Channel | ReplyKind::ChannelPipe | ReplyKind::OnChannel)
    }
}

/// One message read from a call channel's reply pipe, checked: a reply that carries
/// in-line data only, or word that the reply waits on the channel's connection.
///
/// The pipe is a byte stream, so a message is one `write` of at most
/// [`PIPE_MESSAGE_MAX`] bytes (which the kernel keeps whole) and one `read` takes it
/// whole: exactly what was read must be one message, nothing more or less.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipeMessage<'a> {
    /// A reply: its header and its in-line bytes.
    Reply {
        /// The header (no reply right, descriptors, big in-line data or token).
        header: Header,
        /// The in-line bytes.
        inline: &'a [u8],
    },
    /// The reply waits on the channel's connection; `kept` as in a reply's header.
    OnSocket {
        /// Whether the port keeps the channel.
        kept: bool,
    },
}

impl<'a> PipeMessage<'a> {
    /// Check bytes read in one `read` from a reply pipe.
    pub fn parse(bytes: &'a [u8]) -> Result<PipeMessage<'a>, DecodeError> {
        if bytes.len() > PIPE_MESSAGE_MAX {
            return Err(DecodeError::LengthMismatch { stated: PIPE_MESSAGE_MAX, actual: bytes.len() });
        }
        let header = Header::decode(bytes)?;
        if header.reply != ReplyKind::None
            || header.ndesc != 0
            || header.nfds != 0
            || header.big_len != 0
            || header.counted
        {
            return Err(DecodeError::NotPlainOnPipe);
        }
        let stated = HEADER_LEN + header.inline_len as usize;
        if stated != bytes.len() {
            return Err(DecodeError::LengthMismatch { stated, actual: bytes.len() });
        }
        if header.on_socket {
            if header.inline_len != 0 || header.id != 0 {
                return Err(DecodeError::NotPlainOnPipe);
            }
            return Ok(PipeMessage::OnSocket { kept: header.kept });
        }
        Ok(PipeMessage::Reply { header, inline: &bytes[HEADER_LEN..] })
    }

    /// The message that says the reply waits on the connection.
    pub fn on_socket(kept: bool) -> [u8; HEADER_LEN] {
        let header = Header {
            id: 0,
            reply: ReplyKind::None,
            token: 0,
            kept,
            on_socket: true,
            counted: false,
            ndesc: 0,
            nfds: 0,
            inline_len: 0,
            big_len: 0,
        };
        let mut out = [0u8; HEADER_LEN];
        header.encode(&mut out);
        out
    }
}

/// The head of a message to encode: what the header says besides the lengths and
/// counts, which [`Datagram::encode_head`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// The message id.
    pub id: i32,
    /// What the reply slot carries.
    pub reply: ReplyKind,
    /// The call channel's token (non-zero exactly for `Channel` and `OnChannel`).
    pub token: u32,
    /// The channel-kept flag of a reply.
    pub kept: bool,
    /// The counted flag: a place in the destination's queue is reserved for it.
    pub counted: bool,
}

impl Head {
    /// A head with this id and reply kind, no token, not kept, not counted.
    pub fn new(id: i32, reply: ReplyKind) -> Head {
        Head { id, reply, token: 0, kept: false, counted: false }
    }
}

/// A datagram whose header, descriptors and lengths have all been checked against
/// each other and against the number of file descriptors that arrived with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The header.
    pub header: Header,
    /// The descriptors, in order.
    pub descriptors: Vec<Descriptor>,
    /// The in-line bytes carried in the datagram.
    pub inline: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// Validate an untrusted datagram that arrived with `nfds` file descriptors.
    ///
    /// On success every file descriptor is accounted for, in the order described in
    /// the crate documentation; on failure the caller closes all of them.
    pub fn parse(bytes: &'a [u8], nfds: usize) -> Result<Datagram<'a>, DecodeError> {
        let header = Header::decode(bytes)?;
        if header.on_socket {
            return Err(DecodeError::OnSocketInDatagram);
        }
        let ndesc = usize::from(header.ndesc);
        let body = HEADER_LEN + ndesc * DESCRIPTOR_LEN;
        let stated = body + header.inline_len as usize;
        if stated != bytes.len() {
            return Err(DecodeError::LengthMismatch { stated, actual: bytes.len() });
        }
        if usize::from(header.nfds) != nfds {
            return Err(DecodeError::FdCountMismatch { stated: usize::from(header.nfds), actual: nfds });
        }
        let mut descriptors = Vec::with_capacity(ndesc);
        let mut needed = header.leading_fds();
        for i in 0..ndesc {
            let off = HEADER_LEN + i * DESCRIPTOR_LEN;
            let raw: &[u8; DESCRIPTOR_LEN] = bytes[off..off + DESCRIPTOR_LEN].try_into().expect("24 bytes");
            let d = Descriptor::decode(raw)?;
            needed += d.nfds();
            descriptors.push(d);
        }
        if needed != nfds {
            return Err(DecodeError::FdsUnaccounted { needed, stated: nfds });
        }
        Ok(Datagram { header, descriptors, inline: &bytes[body..] })
    }

    /// Encode a message's header and descriptors into `out`, for `inline_len` in-line
    /// bytes that the caller sends right after them (so in-line data is never copied
    /// here). Returns the header and the number of bytes written. The caller supplies
    /// the file descriptors in the documented order; `ndesc`, `nfds` and `inline_len`
    /// are computed here.
    pub fn encode_head(
        head: Head,
        descriptors: &[Descriptor],
        inline_len: usize,
        big_len: u64,
        out: &mut [u8],
    ) -> Result<(Header, usize), DecodeError> {
        if out.len() < HEADER_LEN + descriptors.len().min(MAX_DESCRIPTORS) * DESCRIPTOR_LEN {
            return Err(DecodeError::TooManyDescriptors(descriptors.len()));
        }
        if descriptors.len() > MAX_DESCRIPTORS {
            return Err(DecodeError::TooManyDescriptors(descriptors.len()));
        }
        if inline_len > INLINE_DATAGRAM_MAX {
            return Err(DecodeError::InlineTooLarge(inline_len));
        }
        if big_len != 0 && (inline_len != 0 || big_len > BIG_INLINE_MAX) {
            return Err(DecodeError::BadBigInline(big_len));
        }
        if head.reply.has_token() != (head.token != 0) {
            return Err(DecodeError::BadToken);
        }
        let nfds =
            head.reply.fds() + usize::from(big_len != 0) + descriptors.iter().map(Descriptor::nfds).sum::<usize>();
        if nfds > MAX_FDS {
            return Err(DecodeError::TooManyFds(nfds));
        }
        let header = Header {
            id: head.id,
            reply: head.reply,
            token: head.token,
            kept: head.kept,
            on_socket: false,
            counted: head.counted,
            ndesc: descriptors.len() as u8,
            nfds: nfds as u8,
            inline_len: inline_len as u32,
            big_len,
        };
        let mut h = [0u8; HEADER_LEN];
        header.encode(&mut h);
        out[..HEADER_LEN].copy_from_slice(&h);
        let mut off = HEADER_LEN;
        for d in descriptors {
            let mut raw = [0u8; DESCRIPTOR_LEN];
            d.encode(&mut raw);
            out[off..off + DESCRIPTOR_LEN].copy_from_slice(&raw);
            off += DESCRIPTOR_LEN;
        }
        Ok((header, off))
    }

    /// Encode a whole message (head and in-line bytes) into `out`, cleared first.
    pub fn encode(
        head: Head,
        descriptors: &[Descriptor],
        inline: &[u8],
        big_len: u64,
        out: &mut Vec<u8>,
    ) -> Result<Header, DecodeError> {
        let mut buf = [0u8; HEAD_MAX];
        let (header, n) = Self::encode_head(head, descriptors, inline.len(), big_len, &mut buf)?;
        out.clear();
        out.extend_from_slice(&buf[..n]);
        out.extend_from_slice(inline);
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(id: i32, reply: ReplyKind, d: &[Descriptor], inline: &[u8], big: u64) -> Vec<u8> {
        let token = if reply.has_token() { 7 } else { 0 };
        let mut v = Vec::new();
        Datagram::encode(Head { id, reply, token, kept: false, counted: false }, d, inline, big, &mut v).unwrap();
        v
    }

    #[test]
    fn a_pipe_message_is_a_plain_reply_or_the_on_socket_word() {
        for kept in [false, true] {
            assert_eq!(PipeMessage::parse(&PipeMessage::on_socket(kept)), Ok(PipeMessage::OnSocket { kept }));
        }
        // Anything that names a right, descriptors, big in-line data or a token is refused.
        for (reply, d, big) in [
            (ReplyKind::SendOnce, &[][..], 0),
            (ReplyKind::OnChannel, &[][..], 0),
            (ReplyKind::None, &[Descriptor::Send][..], 0),
            (ReplyKind::None, &[][..], 5),
        ] {
            let bytes = encode(1, reply, d, b"", big);
            assert_eq!(PipeMessage::parse(&bytes), Err(DecodeError::NotPlainOnPipe), "{reply:?} {d:?} {big}");
        }
        // The on-socket word carries nothing, and never travels as a datagram.
        let mut word = PipeMessage::on_socket(false);
        word[8] = 1;
        assert_eq!(PipeMessage::parse(&word), Err(DecodeError::NotPlainOnPipe));
        assert_eq!(Datagram::parse(&PipeMessage::on_socket(true), 0), Err(DecodeError::OnSocketInDatagram));
        // More than one pipe write's worth.
        let big = vec![0u8; PIPE_MESSAGE_MAX + 1];
        assert!(matches!(PipeMessage::parse(&big), Err(DecodeError::LengthMismatch { .. })));
        // A channel offered with a pipe brings two descriptors.
        let bytes = encode(3, ReplyKind::ChannelPipe, &[Descriptor::Send], b"x", 0);
        assert_eq!(Datagram::parse(&bytes, 3).unwrap().header.leading_fds(), 2);
        assert!(Datagram::parse(&bytes, 2).is_err());
    }

    #[test]
    fn simple_round_trip() {
        let bytes = encode(42, ReplyKind::SendOnce, &[Descriptor::Send, Descriptor::Ool { len: 4096 }], b"hello", 0);
        let d = Datagram::parse(&bytes, 3).unwrap();
        assert_eq!(d.header.id, 42);
        assert_eq!(d.header.reply, ReplyKind::SendOnce);
        assert_eq!(d.descriptors, vec![Descriptor::Send, Descriptor::Ool { len: 4096 }]);
        assert_eq!(d.inline, b"hello");
    }

    #[test]
    fn token_goes_with_channel_kinds_only() {
        let mut v = Vec::new();
        let head = |reply, token| Head { id: 1, reply, token, kept: false, counted: false };
        assert_eq!(Datagram::encode(head(ReplyKind::OnChannel, 0), &[], b"", 0, &mut v), Err(DecodeError::BadToken));
        assert_eq!(Datagram::encode(head(ReplyKind::None, 9), &[], b"", 0, &mut v), Err(DecodeError::BadToken));
        Datagram::encode(head(ReplyKind::OnChannel, 9), &[], b"x", 0, &mut v).unwrap();
        let d = Datagram::parse(&v, 0).unwrap();
        assert_eq!((d.header.reply, d.header.token), (ReplyKind::OnChannel, 9));
        // A token under a kind that takes none is refused on the way in too.
        v[12] = ReplyKind::None as u8;
        assert_eq!(Datagram::parse(&v, 0), Err(DecodeError::BadToken));
        v[12] = ReplyKind::OnChannel as u8;
        v[20..24].copy_from_slice(&[0; 4]);
        assert_eq!(Datagram::parse(&v, 0), Err(DecodeError::BadToken));
        // The kept flag round-trips.
        Datagram::encode(Head { kept: true, ..Head::new(2, ReplyKind::None) }, &[], b"", 0, &mut v).unwrap();
        assert!(Datagram::parse(&v, 0).unwrap().header.kept);
    }

    #[test]
    fn fd_count_must_match() {
        let bytes = encode(1, ReplyKind::None, &[Descriptor::Send], b"", 0);
        assert!(matches!(Datagram::parse(&bytes, 0), Err(DecodeError::FdCountMismatch { .. })));
        assert!(matches!(Datagram::parse(&bytes, 2), Err(DecodeError::FdCountMismatch { .. })));
        assert!(Datagram::parse(&bytes, 1).is_ok());
    }

    #[test]
    fn truncated_and_padded_are_refused() {
        let bytes = encode(1, ReplyKind::None, &[], b"abcdef", 0);
        assert!(matches!(Datagram::parse(&bytes[..bytes.len() - 1], 0), Err(DecodeError::LengthMismatch { .. })));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(Datagram::parse(&longer, 0), Err(DecodeError::LengthMismatch { .. })));
        assert!(matches!(Datagram::parse(&bytes[..10], 0), Err(DecodeError::Short(10))));
    }

    #[test]
    fn descriptor_claiming_wrong_fd_count_is_refused() {
        let mut bytes = encode(1, ReplyKind::None, &[Descriptor::Send], b"", 0);
        bytes[HEADER_LEN + 1] = 2; // a send right that claims two descriptors
        bytes[14] = 2;
        assert!(matches!(Datagram::parse(&bytes, 2), Err(DecodeError::DescriptorFdCount { .. })));
    }

    #[test]
    fn the_counted_flag_round_trips_and_is_where_receivers_look() {
        let mut v = Vec::new();
        let head = Head { counted: true, ..Head::new(5, ReplyKind::None) };
        Datagram::encode(head, &[], b"x", 0, &mut v).unwrap();
        assert!(Datagram::parse(&v, 0).unwrap().header.counted);
        let flags = u16::from_le_bytes([v[FLAGS_OFFSET], v[FLAGS_OFFSET + 1]]);
        assert_ne!(flags & COUNTED_FLAG, 0, "the flag is where a receiver reads it before parsing");
        Datagram::encode(Head::new(5, ReplyKind::None), &[], b"x", 0, &mut v).unwrap();
        assert!(!Datagram::parse(&v, 0).unwrap().header.counted);
        // Never on a reply pipe: a pipe carries replies, and replies are not counted.
        let mut piped = Vec::new();
        Datagram::encode(head, &[], b"x", 0, &mut piped).unwrap();
        assert_eq!(PipeMessage::parse(&piped), Err(DecodeError::NotPlainOnPipe));
    }

    #[test]
    fn a_receive_right_brings_its_page_and_its_requests() {
        let info = ReceiveRightInfo {
            has_send_source: true,
            main_conns: 2,
            once_conns: 1,
            channel_conns: 1,
            qlimit: 5,
            message_limit: 4096,
            released: 77,
            no_senders: true,
            port_destroyed: true,
        };
        assert_eq!(info.nfds(), 1 + 1 + 2 + 1 + 1 + 1 + 1);
        let mut raw = [0u8; DESCRIPTOR_LEN];
        Descriptor::Receive(info).encode(&mut raw);
        assert_eq!(Descriptor::decode(&raw), Ok(Descriptor::Receive(info)));
        // The count is 32 bits wide, and the limit at most the largest message.
        let mut bad = raw;
        bad[12] = 1;
        assert_eq!(Descriptor::decode(&bad), Err(DecodeError::ReservedNonZero));
        let mut bad = raw;
        bad[4..8].copy_from_slice(&(BIG_INLINE_MAX as u32 + 1).to_le_bytes());
        assert!(matches!(Descriptor::decode(&bad), Err(DecodeError::BadReceiveRight(_))));
        let mut bad = raw;
        bad[2] |= 1 << 3;
        assert_eq!(Descriptor::decode(&bad), Err(DecodeError::ReservedNonZero));
    }

    #[test]
    fn big_inline_excludes_datagram_inline() {
        let mut v = Vec::new();
        let head = Head::new(1, ReplyKind::None);
        assert!(Datagram::encode(head, &[], b"x", 10, &mut v).is_err());
        assert!(Datagram::encode(head, &[], b"", BIG_INLINE_MAX + 1, &mut v).is_err());
        assert!(Datagram::encode(head, &[], b"", 1 << 20, &mut v).is_ok());
        assert_eq!(Datagram::parse(&v, 1).unwrap().header.big_len, 1 << 20);
    }

    fn arb_descriptor() -> impl Strategy<Value = Descriptor> {
        prop_oneof![
            Just(Descriptor::Send),
            Just(Descriptor::SendOnce),
            (1..=OOL_MAX).prop_map(|len| Descriptor::Ool { len }),
            (
                any::<bool>(),
                1u16..4,
                0u8..4,
                0u8..4,
                (any::<bool>(), any::<bool>(), any::<u32>()),
                0..=BIG_INLINE_MAX as u32,
                1..=u32::MAX
            )
                .prop_map(|(src, main, once, chan, (ns, pd, released), message_limit, qlimit)| {
                    Descriptor::Receive(ReceiveRightInfo {
                        has_send_source: src,
                        main_conns: main,
                        once_conns: once,
                        channel_conns: chan,
                        no_senders: ns,
                        port_destroyed: pd,
                        message_limit,
                        released,
                        qlimit,
                    })
                }),
        ]
    }

    proptest! {
        #[test]
        fn encode_then_parse_is_identity(
            id in any::<i32>(),
            reply in prop_oneof![Just(ReplyKind::None), Just(ReplyKind::Send), Just(ReplyKind::SendOnce), Just(ReplyKind::Channel), Just(ReplyKind::ChannelPipe), Just(ReplyKind::OnChannel)],
            descs in proptest::collection::vec(arb_descriptor(), 0..8),
            inline in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let bytes = encode(id, reply, &descs, &inline, 0);
            let nfds = reply.fds() + descs.iter().map(Descriptor::nfds).sum::<usize>();
            let d = Datagram::parse(&bytes, nfds).unwrap();
            prop_assert_eq!(d.header.id, id);
            prop_assert_eq!(d.header.reply, reply);
            prop_assert_eq!(d.header.token != 0, reply.has_token());
            prop_assert_eq!(d.descriptors, descs);
            prop_assert_eq!(d.inline, &inline[..]);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), nfds in 0usize..200) {
            let _ = Datagram::parse(&bytes, nfds);
            let _ = PipeMessage::parse(&bytes);
        }

        #[test]
        fn a_pipe_takes_a_plain_reply_and_nothing_else(
            id in any::<i32>(),
            inline in proptest::collection::vec(any::<u8>(), 0..(PIPE_MESSAGE_MAX - HEADER_LEN)),
            cut in 1usize..HEADER_LEN,
        ) {
            let bytes = encode(id, ReplyKind::None, &[], &inline, 0);
            let PipeMessage::Reply { header, inline: got } = PipeMessage::parse(&bytes).unwrap() else {
                panic!("a plain reply");
            };
            prop_assert_eq!((header.id, got), (id, &inline[..]));
            // Short, long, or two messages in one read: refused.
            prop_assert!(PipeMessage::parse(&bytes[..bytes.len() - cut.min(bytes.len())]).is_err());
            let mut two = bytes.clone();
            two.extend_from_slice(&bytes);
            prop_assert!(PipeMessage::parse(&two).is_err());
        }

        #[test]
        fn accepted_datagrams_account_for_every_fd(bytes in proptest::collection::vec(any::<u8>(), 0..400), nfds in 0usize..8) {
            if let Ok(d) = Datagram::parse(&bytes, nfds) {
                let needed = d.header.leading_fds() + d.descriptors.iter().map(Descriptor::nfds).sum::<usize>();
                prop_assert_eq!(needed, nfds);
            }
        }
    }
}
