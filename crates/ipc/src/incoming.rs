//! What arrived, checked: the first half of the receive path.
//!
//! A datagram, the descriptors that came with it and the sender's credentials are
//! untrusted. [`check`] takes them together and returns one validated value,
//! [`Incoming`], or a [`Refused`] reason; it inserts nothing anywhere. The receive path
//! (`receive`) then inserts an `Incoming` into the space, doing what can still fail
//! there (reading big in-line data, mapping out-of-line regions) before any right is
//! inserted (`doc/ipc.md`, *Validation of what arrives*).
//!
//! What is checked, in this order (the first failure is the reason):
//!
//! 1. the sender's credentials are there (`SCM_CREDENTIALS`);
//! 2. the bytes are a well-formed datagram for the number of descriptors that arrived
//!    (`ictus_abi::Datagram::parse`: magic, version, reserved bits, lengths, counts);
//! 3. a call channel is offered or named only on a port's main connection, and a named
//!    one is a channel the port keeps for this sender (by the kernel's pid);
//! 4. each descriptor, in wire order, is what its place says it is: a right is an
//!    `AF_UNIX SOCK_SEQPACKET` socket (with its kernel identity, to merge names), an
//!    offered channel does not reach the port itself and its reply pipe is a pipe's
//!    write end, out-of-line memory and big in-line data are memfds at least as long
//!    as claimed and sealed against writing, shrinking and growing;
//! 5. a receive right's queue page is a memfd of one page that cannot shrink or grow,
//!    its send source reaches one of the right's own main connections, as the kernel's
//!    socket diagnostics say (if they cannot say, the source is dropped and the right
//!    kept), and its requests' notify rights are port sockets.
//!
//! Before all of this, a message larger than its port takes is refused from its header
//! alone ([`oversized`]), its in-line bytes unread.
//!
//! Every descriptor is owned by the result or by the refusal's caller: on a refusal they
//! are all closed when `check` returns.

use std::fmt;
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use ictus_abi::{Datagram, DecodeError, Descriptor, Header, ReceiveRightInfo, ReplyKind, HEADER_LEN};
use rustix::io::Errno;

use crate::channel;
use crate::message::Credentials;
use crate::port::{conn_kind_at, ConnKind, Ident, RecvPort};
use crate::queue::QueuePage;
use crate::sys;
use crate::table::SendOnce;

/// Where a datagram arrived, which decides what may come with it.
#[derive(Clone, Copy)]
pub(crate) enum Arrival<'a> {
    /// A port's main connection: requests may offer or name call channels.
    Main(&'a Arc<RecvPort>),
    /// A port's send-once connection.
    Once,
    /// A call's own reply connection or channel.
    Reply,
}

/// A message that passed every check, with every descriptor it brought, each in the
/// place and of the kind the wire says.
pub(crate) struct Incoming {
    /// The message id.
    pub(crate) id: i32,
    /// The reply's "channel kept" flag.
    pub(crate) kept: bool,
    /// Who sent it, as the kernel stamped it.
    pub(crate) sender: Credentials,
    /// Where the in-line data is.
    pub(crate) data: Data,
    /// The reply right.
    pub(crate) reply: Option<Reply>,
    /// The body's rights and out-of-line regions, in order.
    pub(crate) body: Vec<Item>,
}

/// Where a message's in-line data is.
pub(crate) enum Data {
    /// In the datagram, at this range of the receive buffer.
    Datagram(Range<usize>),
    /// In a sealed memfd of this many bytes (big in-line data).
    Memfd(OwnedFd, u64),
}

/// A message's reply right, checked.
pub(crate) enum Reply {
    /// A send right, with the kernel's identity of its port.
    Send(OwnedFd, Ident),
    /// A send-once right.
    SendOnce(OwnedFd),
    /// A call channel offered on `port`'s main connection under `token`: a port socket
    /// that does not reach the port, and perhaps a pipe's write end for plain replies.
    Channel { port: Arc<RecvPort>, fd: OwnedFd, pipe: Option<OwnedFd>, token: u32 },
    /// The call channel the port keeps for this sender under the named token.
    OnChannel(SendOnce),
}

/// One right or region of a message's body, checked.
pub(crate) enum Item {
    /// A send right, with the kernel's identity of its port.
    Send(OwnedFd, Ident),
    /// A send-once right.
    SendOnce(OwnedFd),
    /// A receive right.
    Receive(ReceiveRight),
    /// A sealed memfd of this many bytes.
    Ool(OwnedFd, u64),
}

/// A receive right that arrived: its state, its queue page, its connections and the
/// notify rights of its requests.
pub(crate) struct ReceiveRight {
    /// The state it travelled with.
    pub(crate) info: ReceiveRightInfo,
    /// Its queue page, mapped.
    pub(crate) page: QueuePage,
    /// Its send source and the source's identity, if one came and the kernel confirmed
    /// that it reaches one of the right's main connections.
    pub(crate) source: Option<(OwnedFd, Ident)>,
    /// Its main and send-once connections.
    pub(crate) conns: Vec<(OwnedFd, ConnKind)>,
    /// Its call channels.
    pub(crate) channels: Vec<OwnedFd>,
    /// The notify rights of its no-senders and port-destroyed requests.
    pub(crate) no_senders: Option<OwnedFd>,
    pub(crate) port_destroyed: Option<OwnedFd>,
}

/// Why a message was refused: the reason a receiver gets in
/// `ReceiveError::Malformed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The kernel attached no credentials.
    NoCredentials,
    /// Zero bytes on a connection that has not hung up.
    Empty,
    /// The datagram, or its descriptors, did not fit.
    Truncated,
    /// The bytes are not a well-formed datagram.
    Wire(DecodeError),
    /// A request names a call channel the port does not keep for its sender.
    UnknownChannel,
    /// A call channel offered or named anywhere but on a port's main connection.
    ChannelMisplaced,
    /// A right that is not an `AF_UNIX SOCK_SEQPACKET` socket.
    NotAPort,
    /// The kernel could not say what a right is.
    Identity(Errno),
    /// An offered call channel that reaches the port itself.
    ChannelReachesPort,
    /// An offered reply pipe that is not a pipe's write end.
    PipeNotWriteEnd,
    /// Out-of-line memory or big in-line data that is not a sealed memfd long enough.
    Memfd(&'static str),
    /// A receive right whose send source reaches another port.
    SourceElsewhere,
    /// A receive right whose queue page is not one.
    BadPage,
    /// Big in-line data that could not be read.
    BigInline(Errno),
    /// Out-of-line memory that could not be mapped.
    OolMapping(Errno),
    /// What came on a reply pipe is not exactly one plain reply.
    Pipe(DecodeError),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::NoCredentials => f.write_str("no sender credentials"),
            Refused::Empty => f.write_str("empty datagram"),
            Refused::Truncated => f.write_str("datagram or descriptors truncated"),
            Refused::Wire(e) => write!(f, "{e}"),
            Refused::UnknownChannel => f.write_str("a call on a channel this port does not keep"),
            Refused::ChannelMisplaced => f.write_str("a call channel named where none may be"),
            Refused::NotAPort => f.write_str("a right is not a port socket"),
            Refused::Identity(e) => write!(f, "{e}"),
            Refused::ChannelReachesPort => f.write_str("a call channel that reaches the port itself"),
            Refused::PipeNotWriteEnd => f.write_str("a call channel's reply pipe is not a pipe's write end"),
            Refused::Memfd(why) => f.write_str(why),
            Refused::SourceElsewhere => f.write_str("a receive right whose send source reaches another port"),
            Refused::BadPage => f.write_str("a receive right whose queue page is not a sealed page of memory"),
            Refused::BigInline(e) => write!(f, "reading big in-line data: {e}"),
            Refused::OolMapping(e) => write!(f, "mapping out-of-line memory: {e}"),
            Refused::Pipe(e) => write!(f, "reply pipe: {e}"),
        }
    }
}

/// A message larger than a port takes: its header says so (the in-line bytes in the
/// datagram and in a big in-line memfd together), and nothing else of it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Oversized {
    /// The header (the reply right's kind and token, to answer on it).
    pub(crate) header: Header,
    /// The in-line bytes it claims.
    pub(crate) size: u64,
}

/// Whether the datagram whose first bytes are `bytes` carries more than `limit` in-line
/// bytes, by its header alone: two words read before anything else, so the common case
/// costs a comparison. `None` also for bytes that are not a header at all (the full
/// check refuses them).
#[inline]
pub(crate) fn oversized(bytes: &[u8], limit: u32) -> Option<Oversized> {
    if bytes.len() < HEADER_LEN {
        return None;
    }
    let inline_len = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let big_len = u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes"));
    if u64::from(inline_len).saturating_add(big_len) <= u64::from(limit) {
        return None;
    }
    let header = Header::decode(bytes).ok()?;
    Some(Oversized { header, size: header.inline_total() })
}

/// Check a datagram of `bytes` that arrived with the descriptors `fds` (all taken:
/// owned by the result, or closed) from `sender`, at `arrival`.
#[inline]
pub(crate) fn check(
    bytes: &[u8],
    sender: Option<Credentials>,
    fds: &mut Vec<OwnedFd>,
    arrival: Arrival<'_>,
) -> Result<Incoming, Refused> {
    let Some(sender) = sender else {
        fds.clear();
        return Err(Refused::NoCredentials);
    };
    if fds.is_empty() {
        if let Some(m) = check_plain(bytes, sender, arrival)? {
            return Ok(m);
        }
    }
    let mut fds = std::mem::take(fds).into_iter();
    let dg = Datagram::parse(bytes, fds.len()).map_err(Refused::Wire)?;
    let header = dg.header;
    // A call channel may be offered or named only on a port's main connection.
    let mut on_channel = None;
    match (header.reply, arrival) {
        (ReplyKind::Channel | ReplyKind::ChannelPipe, Arrival::Main(_)) => {}
        (ReplyKind::OnChannel, Arrival::Main(port)) => {
            on_channel = Some(channel::kept(port, sender, header.token).ok_or(Refused::UnknownChannel)?);
        }
        (ReplyKind::Channel | ReplyKind::ChannelPipe | ReplyKind::OnChannel, _) => {
            return Err(Refused::ChannelMisplaced)
        }
        _ => {}
    }
    // `parse` checked that the descriptors that arrived are exactly those the header
    // and the descriptors account for, so each `next` below has one to take.
    let mut next = || fds.next().expect("counted by Datagram::parse");
    let reply = match header.reply {
        ReplyKind::None => None,
        ReplyKind::Send => {
            let fd = port_socket(next())?;
            let ident = identity(&fd)?;
            Some(Reply::Send(fd, ident))
        }
        ReplyKind::SendOnce => Some(Reply::SendOnce(port_socket(next())?)),
        ReplyKind::Channel | ReplyKind::ChannelPipe => {
            let Arrival::Main(port) = arrival else { return Err(Refused::ChannelMisplaced) };
            let fd = port_socket(next())?;
            if !channel::is_foreign(port, fd.as_fd()) {
                return Err(Refused::ChannelReachesPort);
            }
            let pipe = if header.reply == ReplyKind::ChannelPipe {
                let p = next();
                if !sys::is_pipe_write_end(p.as_fd()) {
                    return Err(Refused::PipeNotWriteEnd);
                }
                Some(p)
            } else {
                None
            };
            Some(Reply::Channel { port: port.clone(), fd, pipe, token: header.token })
        }
        ReplyKind::OnChannel => on_channel.map(Reply::OnChannel),
    };
    let data = if header.big_len != 0 {
        Data::Memfd(sealed_memfd(next(), header.big_len)?, header.big_len)
    } else {
        Data::Datagram(bytes.len() - dg.inline.len()..bytes.len())
    };
    let mut body = Vec::with_capacity(dg.descriptors.len());
    for d in &dg.descriptors {
        body.push(match *d {
            Descriptor::Send => {
                let fd = port_socket(next())?;
                let ident = identity(&fd)?;
                Item::Send(fd, ident)
            }
            Descriptor::SendOnce => Item::SendOnce(port_socket(next())?),
            Descriptor::Ool { len } => Item::Ool(sealed_memfd(next(), len)?, len),
            Descriptor::Receive(info) => Item::Receive(receive_right(info, &mut next)?),
        });
    }
    Ok(Incoming { id: header.id, kept: header.kept, sender, data, reply, body })
}

/// The common case: a datagram that came without descriptors, whose header says so
/// and describes only in-line data, perhaps naming a call channel on a port's main
/// connection. `None` when it is anything else (the full check then decides).
#[inline]
fn check_plain(bytes: &[u8], sender: Credentials, arrival: Arrival<'_>) -> Result<Option<Incoming>, Refused> {
    let Ok(h) = Header::decode(bytes) else { return Ok(None) };
    let plain = h.ndesc == 0 && h.nfds == 0 && h.big_len == 0 && HEADER_LEN + h.inline_len as usize == bytes.len();
    let reply = match (h.reply, arrival) {
        _ if !plain || h.on_socket => return Ok(None),
        (ReplyKind::None, _) => None,
        (ReplyKind::OnChannel, Arrival::Main(port)) => {
            Some(Reply::OnChannel(channel::kept(port, sender, h.token).ok_or(Refused::UnknownChannel)?))
        }
        _ => return Ok(None),
    };
    let data = Data::Datagram(HEADER_LEN..bytes.len());
    Ok(Some(Incoming { id: h.id, kept: h.kept, sender, data, reply, body: Vec::new() }))
}

/// A right: an `AF_UNIX SOCK_SEQPACKET` socket, the only kind of object that can stand
/// for a port.
fn port_socket(fd: OwnedFd) -> Result<OwnedFd, Refused> {
    if sys::is_port_socket(fd.as_fd()) {
        Ok(fd)
    } else {
        Err(Refused::NotAPort)
    }
}

/// The kernel's identity of a right's socket.
fn identity(fd: &OwnedFd) -> Result<Ident, Refused> {
    sys::identity(fd.as_fd()).map_err(Refused::Identity)
}

/// Out-of-line memory or big in-line data of `len` bytes.
fn sealed_memfd(fd: OwnedFd, len: u64) -> Result<OwnedFd, Refused> {
    sys::check_sealed_memfd(fd.as_fd(), len).map_err(Refused::Memfd)?;
    Ok(fd)
}

/// A receive right: its queue page, its connections, each a port socket, its send
/// source, believed only if the kernel's peer of the source is one of the right's main
/// connections (otherwise a task holding only a send right to some port could pass that
/// send end off as a receive right's source), and its requests' notify rights.
fn receive_right(info: ReceiveRightInfo, next: &mut impl FnMut() -> OwnedFd) -> Result<ReceiveRight, Refused> {
    let page = QueuePage::adopt(next(), true).ok_or(Refused::BadPage)?;
    let sockets = info.nfds() - 1;
    let mut all = Vec::with_capacity(sockets);
    for _ in 0..sockets {
        let fd = port_socket(next())?;
        let ident = identity(&fd)?;
        all.push((fd, ident));
    }
    let port_destroyed = if info.port_destroyed { all.pop().map(|(fd, _)| fd) } else { None };
    let no_senders = if info.no_senders { all.pop().map(|(fd, _)| fd) } else { None };
    let mut all = all.into_iter();
    let source = if info.has_send_source {
        let (source, ident) = all.next().expect("a send source implies a main connection");
        let mains = all.as_slice().iter().take(usize::from(info.main_conns));
        let mains: Vec<u64> = mains.map(|(_, (_, ino))| *ino).collect();
        match sys::peer_inode(source.as_fd()) {
            Ok(Some(peer)) if mains.contains(&peer) => Some((source, ident)),
            Ok(Some(_)) => return Err(Refused::SourceElsewhere),
            // The kernel cannot say: keep the right, drop the source.
            _ => None,
        }
    } else {
        None
    };
    let mut conns = Vec::with_capacity(usize::from(info.main_conns) + usize::from(info.once_conns));
    let mut channels = Vec::new();
    for (k, (fd, _)) in all.enumerate() {
        match conn_kind_at(&info, k) {
            Some(kind) => conns.push((fd, kind)),
            None => channels.push(fd),
        }
    }
    Ok(ReceiveRight { info, page, source, conns, channels, no_senders, port_destroyed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::RecvOutcome;
    use ictus_abi::{Datagram, Head, DATAGRAM_MAX};
    use rustix::fs::SealFlags;
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    use std::io::IoSlice;
    use std::os::fd::BorrowedFd;

    /// A connection like a port's, and what arrived on it.
    struct Wire {
        send: OwnedFd,
        recv: OwnedFd,
        buf: Vec<u8>,
    }

    impl Wire {
        fn new() -> Wire {
            let (send, recv) = sys::connection().unwrap();
            Wire { send, recv, buf: vec![0; DATAGRAM_MAX] }
        }

        /// Send `bytes` with `fds`, receive it as the nucleus does, and check it.
        fn check(&mut self, bytes: &[u8], fds: &[BorrowedFd<'_>], arrival: Arrival<'_>) -> Result<Incoming, Refused> {
            ictus_sys::socket::sendmsg(self.send.as_fd(), &[IoSlice::new(bytes)], fds, rustix::net::SendFlags::empty())
                .unwrap();
            let mut got = Vec::new();
            match sys::recv(self.recv.as_fd(), &mut self.buf, &mut got, true).unwrap() {
                RecvOutcome::Datagram { len, creds, truncated: false } => {
                    check(&self.buf[..len], creds, &mut got, arrival)
                }
                _ => panic!("no datagram"),
            }
        }
    }

    fn encode(head: Head, descriptors: &[Descriptor], inline: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        Datagram::encode(head, descriptors, inline, 0, &mut v).unwrap();
        v
    }

    fn plain(id: i32, data: &[u8]) -> Vec<u8> {
        encode(Head::new(id, ReplyKind::None), &[], data)
    }

    fn sealed(len: u64) -> OwnedFd {
        let fd = ictus_sys::memfd::create("incoming-test", len).unwrap();
        ictus_sys::memfd::add_seals(fd.as_fd(), SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW).unwrap();
        fd
    }

    fn pair(kind: SocketType) -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(AddressFamily::UNIX, kind, SocketFlags::CLOEXEC, None).unwrap()
    }

    /// A socket to send, and its far end, which hangs up once every copy of the
    /// socket (the one sent included) is closed.
    fn witness() -> (OwnedFd, OwnedFd) {
        pair(SocketType::SEQPACKET)
    }

    fn closed_everywhere(far: &OwnedFd) -> bool {
        sys::hung_up(far.as_fd())
    }

    #[test]
    fn a_plain_message_is_its_data_and_its_sender() {
        let mut w = Wire::new();
        let m = w.check(&plain(7, b"hello"), &[], Arrival::Reply).unwrap();
        assert_eq!((m.id, m.kept, m.sender), (7, false, sys::own_credentials()));
        assert!(m.reply.is_none() && m.body.is_empty());
        let Data::Datagram(r) = m.data else { panic!("in-line data in the datagram") };
        assert_eq!(&w.buf[r], b"hello");
    }

    #[test]
    fn rights_and_regions_arrive_checked_and_in_order() {
        let mut w = Wire::new();
        let (s1, _r1) = sys::connection().unwrap();
        let (s2, _r2) = sys::connection().unwrap();
        let (reply, _rr) = sys::connection().unwrap();
        let ool = sealed(8192);
        let bytes = encode(
            Head::new(9, ReplyKind::SendOnce),
            &[Descriptor::Send, Descriptor::Ool { len: 8000 }, Descriptor::SendOnce],
            b"body",
        );
        let m = w.check(&bytes, &[reply.as_fd(), s1.as_fd(), ool.as_fd(), s2.as_fd()], Arrival::Once).unwrap();
        assert!(matches!(m.reply, Some(Reply::SendOnce(_))));
        assert_eq!(m.body.len(), 3);
        let Item::Send(fd, ident) = &m.body[0] else { panic!("a send right first") };
        assert_eq!(*ident, sys::identity(s1.as_fd()).unwrap());
        assert!(sys::same_file(fd, &s1));
        assert!(matches!(&m.body[1], Item::Ool(_, 8000)));
        let Item::SendOnce(fd) = &m.body[2] else { panic!("a send-once right last") };
        assert!(sys::same_file(fd, &s2));
    }

    #[test]
    fn no_credentials_no_message() {
        let (a, b) = pair(SocketType::SEQPACKET);
        let (keep, far) = witness();
        rustix::net::send(&a, &plain(1, b"x"), rustix::net::SendFlags::empty()).unwrap();
        let mut buf = vec![0; 64];
        let mut fds = vec![keep];
        let n = rustix::net::recv(&b, &mut buf, rustix::net::RecvFlags::empty()).unwrap().0;
        assert_eq!(check(&buf[..n], None, &mut fds, Arrival::Reply).err(), Some(Refused::NoCredentials));
        assert!(fds.is_empty() && closed_everywhere(&far), "the descriptors are closed");
    }

    /// Hostile shapes: each is refused with its reason, and every descriptor that came
    /// with it is closed (its witness's far end sees the hang-up).
    #[test]
    fn hostile_shapes_are_refused_with_their_reason() {
        let mut w = Wire::new();
        let refuse = |w: &mut Wire, what: &str, bytes: &[u8], fds: Vec<OwnedFd>, want: Refused| {
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            let got = w.check(bytes, &borrowed, Arrival::Once).err();
            assert_eq!(got, Some(want), "{what}");
        };
        // The reply pipe's word is not a message, even alone in a datagram.
        let word = ictus_abi::PipeMessage::on_socket(false);
        refuse(&mut w, "the on-socket word", &word, vec![], Refused::Wire(DecodeError::OnSocketInDatagram));
        // Descriptors that are not what their place says.
        let (r, _wr) = rustix::pipe::pipe().unwrap();
        let send = encode(Head::new(1, ReplyKind::None), &[Descriptor::Send], b"");
        refuse(&mut w, "a pipe as a send right", &send, vec![r], Refused::NotAPort);
        let (st, _st2) = pair(SocketType::STREAM);
        refuse(&mut w, "a stream socket as a send right", &send, vec![st], Refused::NotAPort);
        let ool = encode(Head::new(1, ReplyKind::None), &[Descriptor::Ool { len: 4096 }], b"");
        refuse(
            &mut w,
            "an unsealed memfd",
            &ool,
            vec![ictus_sys::memfd::create("t", 4096).unwrap()],
            Refused::Memfd("out-of-line memory is not sealed against writing"),
        );
        refuse(
            &mut w,
            "a short memfd",
            &ool,
            vec![sealed(100)],
            Refused::Memfd("out-of-line memory is shorter than its descriptor says"),
        );
        let (c, _c2) = sys::connection().unwrap();
        refuse(
            &mut w,
            "a socket as out-of-line memory",
            &ool,
            vec![c],
            Refused::Memfd("out-of-line descriptor is not a memory file"),
        );
        // Counts that do not match.
        let (a, _a2) = sys::connection().unwrap();
        let (b, _b2) = sys::connection().unwrap();
        refuse(
            &mut w,
            "two descriptors for one right",
            &send,
            vec![a, b],
            Refused::Wire(DecodeError::FdCountMismatch { stated: 1, actual: 2 }),
        );
        // A call channel where none may be.
        let offer = encode(Head { token: 5, ..Head::new(1, ReplyKind::Channel) }, &[], b"");
        let (ch, _ch2) = sys::connection().unwrap();
        refuse(&mut w, "a channel offered on a send-once connection", &offer, vec![ch], Refused::ChannelMisplaced);
    }

    #[test]
    fn descriptors_of_a_refused_message_are_all_closed() {
        let mut w = Wire::new();
        let (keep1, far1) = witness();
        let (keep2, far2) = witness();
        let ool = sealed(4096);
        // A good send right, then a bad (unsealed) region: the whole message goes.
        let bytes = encode(
            Head::new(1, ReplyKind::None),
            &[Descriptor::Send, Descriptor::Send, Descriptor::Ool { len: 1 << 20 }],
            b"",
        );
        let got = w.check(&bytes, &[keep1.as_fd(), keep2.as_fd(), ool.as_fd()], Arrival::Reply);
        assert!(matches!(got, Err(Refused::Memfd(_))));
        drop((keep1, keep2));
        assert!(closed_everywhere(&far1) && closed_everywhere(&far2), "every received copy closed");
    }

    #[test]
    fn channels_are_offered_and_named_only_on_a_main_connection_and_by_their_owner() {
        let port = RecvPort::new().unwrap();
        let mut w = Wire::new();
        let me = sys::own_credentials();
        // Naming a channel the port does not keep, plain or not.
        let named = encode(Head { token: 77, ..Head::new(1, ReplyKind::OnChannel) }, &[], b"x");
        assert_eq!(w.check(&named, &[], Arrival::Main(&port)).err(), Some(Refused::UnknownChannel));
        assert_eq!(w.check(&named, &[], Arrival::Reply).err(), Some(Refused::ChannelMisplaced));
        // Keep one under our pid and token 77: now it is found.
        let (chan, _client) = sys::connection().unwrap();
        port.lock().add_channel(
            (me.pid, 77),
            crate::port::Channel { fd: Arc::new(chan), pipe: None, watch: None, hung_up: false },
        );
        let m = w.check(&named, &[], Arrival::Main(&port)).unwrap();
        let Some(Reply::OnChannel(so)) = m.reply else { panic!("the kept channel") };
        assert_eq!(so.channel, Some((port.id, (me.pid, 77))));
        // Another pid's key with the same token is not ours.
        port.lock().channels.clear();
        port.lock().add_channel(
            (me.pid + 1, 77),
            crate::port::Channel {
                fd: Arc::new(sys::connection().unwrap().0),
                pipe: None,
                watch: None,
                hung_up: false,
            },
        );
        assert_eq!(w.check(&named, &[], Arrival::Main(&port)).err(), Some(Refused::UnknownChannel));
        // An offer whose channel is the port's own send end.
        let offer = encode(Head { token: 5, ..Head::new(1, ReplyKind::Channel) }, &[], b"");
        let own = port.lock().send_source.clone().unwrap();
        assert_eq!(w.check(&offer, &[own.as_fd()], Arrival::Main(&port)).err(), Some(Refused::ChannelReachesPort));
        // An offer with a pipe's read end as its reply pipe.
        let pipe_offer = encode(Head { token: 5, ..Head::new(1, ReplyKind::ChannelPipe) }, &[], b"");
        let (ch, _c) = sys::connection().unwrap();
        let (read_end, _write_end) = rustix::pipe::pipe().unwrap();
        let got = w.check(&pipe_offer, &[ch.as_fd(), read_end.as_fd()], Arrival::Main(&port)).err();
        assert_eq!(got, Some(Refused::PipeNotWriteEnd));
        // A good offer.
        let (ch, _c) = sys::connection().unwrap();
        let (_read_end, write_end) = rustix::pipe::pipe().unwrap();
        let m = w.check(&pipe_offer, &[ch.as_fd(), write_end.as_fd()], Arrival::Main(&port)).unwrap();
        assert!(matches!(m.reply, Some(Reply::Channel { token: 5, pipe: Some(_), .. })));
    }

    /// A receive right's queue page, as the port would send it.
    fn page_fd() -> OwnedFd {
        let page = QueuePage::new().unwrap();
        sys::dup(page.fd().unwrap()).unwrap()
    }

    #[test]
    fn a_receive_right_is_believed_only_with_its_own_send_source() {
        let mut w = Wire::new();
        let info = |has_send_source| ReceiveRightInfo {
            has_send_source,
            main_conns: 1,
            once_conns: 0,
            channel_conns: 0,
            qlimit: 5,
            message_limit: 4096,
            released: 3,
            no_senders: false,
            port_destroyed: false,
        };
        let bytes = |src| encode(Head::new(1, ReplyKind::None), &[Descriptor::Receive(info(src))], b"");
        // Its own: the source's peer is its main connection.
        let (source, main) = sys::connection().unwrap();
        let m = w.check(&bytes(true), &[page_fd().as_fd(), source.as_fd(), main.as_fd()], Arrival::Reply).unwrap();
        let Item::Receive(r) = &m.body[0] else { panic!("a receive right") };
        if sys::peer_inode(source.as_fd()).unwrap().is_none() {
            eprintln!("skipped: the kernel does not answer NETLINK_SOCK_DIAG for AF_UNIX");
            return;
        }
        assert!(r.source.is_some());
        assert_eq!(r.conns.len(), 1);
        assert_eq!((r.info.released, r.info.qlimit, r.info.message_limit), (3, 5, 4096));
        // Someone else's send end passed off as the source.
        let (other_source, _other_main) = sys::connection().unwrap();
        let (_, main) = sys::connection().unwrap();
        let got = w.check(&bytes(true), &[page_fd().as_fd(), other_source.as_fd(), main.as_fd()], Arrival::Reply).err();
        assert_eq!(got, Some(Refused::SourceElsewhere));
        // No source at all: nothing to believe.
        let (_, main) = sys::connection().unwrap();
        let m = w.check(&bytes(false), &[page_fd().as_fd(), main.as_fd()], Arrival::Reply).unwrap();
        let Item::Receive(r) = &m.body[0] else { panic!("a receive right") };
        assert!(r.source.is_none());
        // A page that is not one.
        let (_, main) = sys::connection().unwrap();
        let not_a_page = ictus_sys::memfd::create("not-a-page", 4096).unwrap();
        let got = w.check(&bytes(false), &[not_a_page.as_fd(), main.as_fd()], Arrival::Reply).err();
        assert_eq!(got, Some(Refused::BadPage));
    }

    #[test]
    fn a_receive_right_brings_its_requests_last() {
        let mut w = Wire::new();
        let info = ReceiveRightInfo {
            has_send_source: false,
            main_conns: 1,
            once_conns: 1,
            channel_conns: 0,
            qlimit: 5,
            message_limit: 4096,
            released: 0,
            no_senders: true,
            port_destroyed: true,
        };
        let bytes = encode(Head::new(1, ReplyKind::None), &[Descriptor::Receive(info)], b"");
        let (_, main) = sys::connection().unwrap();
        let (_, once) = sys::connection().unwrap();
        let (ns, _) = sys::connection().unwrap();
        let (pd, _) = sys::connection().unwrap();
        let page = page_fd();
        let fds = [page.as_fd(), main.as_fd(), once.as_fd(), ns.as_fd(), pd.as_fd()];
        let m = w.check(&bytes, &fds, Arrival::Reply).unwrap();
        let Item::Receive(r) = &m.body[0] else { panic!("a receive right") };
        assert_eq!(r.conns.len(), 2);
        assert!(sys::same_file(r.no_senders.as_ref().unwrap(), &ns));
        assert!(sys::same_file(r.port_destroyed.as_ref().unwrap(), &pd));
        // A notify right must be a port socket.
        let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
        let page = page_fd();
        let fds = [page.as_fd(), main.as_fd(), once.as_fd(), ns.as_fd(), pipe_r.as_fd()];
        assert_eq!(w.check(&bytes, &fds, Arrival::Reply).err(), Some(Refused::NotAPort));
    }

    #[test]
    fn a_message_larger_than_the_port_takes_is_seen_from_its_header() {
        let small = plain(1, b"12345678");
        assert_eq!(oversized(&small, 8), None);
        let big = oversized(&small, 7).expect("8 bytes is more than 7");
        assert_eq!((big.size, big.header.id), (8, 1));
        let mut v = Vec::new();
        Datagram::encode(Head::new(2, ReplyKind::SendOnce), &[], &[], 1 << 30, &mut v).unwrap();
        assert_eq!(oversized(&v, 4096).map(|o| o.size), Some(1 << 30), "big in-line data, by its length alone");
        assert_eq!(oversized(&v, 1 << 30), None);
        // Not a header: left for the full check to refuse.
        assert_eq!(oversized(&v[..20], 0), None);
        let mut garbage = v.clone();
        garbage[0] = 0;
        assert_eq!(oversized(&garbage, 0), None);
    }

    #[test]
    fn big_in_line_data_is_a_sealed_memfd() {
        let mut w = Wire::new();
        let mut bytes = Vec::new();
        Datagram::encode(Head::new(1, ReplyKind::None), &[], &[], 100_000, &mut bytes).unwrap();
        let m = w.check(&bytes, &[sealed(100_000).as_fd()], Arrival::Reply).unwrap();
        assert!(matches!(m.data, Data::Memfd(_, 100_000)));
        let got = w.check(&bytes, &[sealed(99_999).as_fd()], Arrival::Reply).err();
        assert_eq!(got, Some(Refused::Memfd("out-of-line memory is shorter than its descriptor says")));
    }

    #[test]
    fn refusals_read_as_before() {
        assert_eq!(Refused::Truncated.to_string(), "datagram or descriptors truncated");
        assert_eq!(Refused::Empty.to_string(), "empty datagram");
        assert_eq!(Refused::Wire(DecodeError::BadMagic(1)).to_string(), "bad magic 0x00000001: not an ictus message");
        assert_eq!(
            Refused::OolMapping(Errno::NOMEM).to_string(),
            format!("mapping out-of-line memory: {}", Errno::NOMEM)
        );
    }
}
