//! Hostile input is refused, not obeyed.
//!
//! A hostile task holding a send right can put any bytes and any descriptors on the
//! port's socket. These tests do exactly that with a raw duplicate of a send right
//! (`Space::send_right_fd`) and `sendmsg`, and check that the receiver refuses each
//! message with `ReceiveError::Malformed` and a reason, counts it, closes every
//! descriptor that came with it (witnessed by hang-ups on their far ends, and by the
//! exact set of open descriptors), and goes on receiving well-formed messages. Also:
//! names are not capabilities (guessing one reaches nothing), a process not given a
//! right has no descriptor for the port, and an unprivileged process cannot forge the
//! credentials a message carries.
//!
//! The seed corpus of the `decode` fuzz target (`fuzz/corpus/decode`) is replayed here
//! too, so it runs on stable in CI.

mod common;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use ictus_abi::{
    Datagram, DecodeError, Descriptor, Head, NotifyId, ReceiveRightInfo, ReplyKind, DATAGRAM_MAX, DESCRIPTOR_LEN,
    HEADER_LEN, MAX_FDS,
};
use ictus_ipc::*;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::net::{AddressFamily, SocketFlags, SocketType};

/// A port to attack, the attacker's raw descriptor for it, and the receiver's
/// resources once everything lazily made has been made.
struct Target {
    s: Space,
    p: Name,
    raw: OwnedFd,
    base: Resources,
}

impl Target {
    fn new() -> Target {
        let s = Space::new();
        let p = s.allocate_port_with_send().unwrap();
        let raw = s.send_right_fd(p).unwrap();
        let t = Target { s, p, raw, base: Resources::settled() };
        t.still_works("warm-up");
        Target { base: Resources::settled(), ..t }
    }

    /// A well-formed message still goes through, and nothing was left open.
    #[track_caller]
    fn still_works(&self, what: &str) {
        let mut m = Message::new(77, what.as_bytes().to_vec());
        self.s.send(self.p, &mut m, SendOptions::default()).unwrap();
        let r = recv(&self.s, self.p);
        assert_eq!((r.id, r.data()), (77, what.as_bytes()), "{what}: the next message");
        assert_eq!(r.sender.pid, std::process::id());
    }

    /// Send `bytes` with `fds` raw, and check the receiver refuses it with a reason
    /// mentioning `reason`, counts it, closes every descriptor (each `witness` is the
    /// far end of one that was sent, and must see a hang-up), and goes on.
    #[track_caller]
    fn refuses(&self, what: &str, bytes: &[u8], fds: Vec<OwnedFd>, witnesses: Vec<OwnedFd>, reason: &str) {
        self.refuses_via(self.raw.as_fd(), what, bytes, fds, witnesses, reason);
    }

    /// [`Target::refuses`], sent on `sock` (another connection of the port).
    #[track_caller]
    fn refuses_via(
        &self,
        sock: BorrowedFd<'_>,
        what: &str,
        bytes: &[u8],
        fds: Vec<OwnedFd>,
        witnesses: Vec<OwnedFd>,
        reason: &str,
    ) {
        let malformed = self.s.stats().malformed;
        raw_send(sock, bytes, &borrow_all(&fds)).unwrap_or_else(|e| panic!("{what}: sendmsg: {e}"));
        // Our copies go; the only others are in flight, then in the receiver's hands.
        drop(fds);
        let mut r = Received::new();
        let (why, sender) = match self.s.receive(self.p, &mut r, within(WATCHDOG)) {
            Err(ReceiveError::Malformed { reason, sender }) => (reason, sender),
            Err(e) => panic!("{what}: expected a malformed-message error, got {e:?}"),
            Ok(()) => panic!("{what}: the hostile message was accepted: {r:?}"),
        };
        assert!(why.contains(reason), "{what}: reason {why:?} should mention {reason:?}");
        if let Some(c) = sender {
            assert_eq!(c.pid, std::process::id(), "{what}: the sender as the kernel saw it");
        }
        assert_eq!(self.s.stats().malformed, malformed + 1, "{what}: counted once");
        for w in &witnesses {
            assert!(peer_closed(w.as_fd()), "{what}: a descriptor sent with the message is still open");
        }
        drop(witnesses);
        assert_same(&self.base, what);
        self.still_works(what);
        assert_same(&self.base, what);
    }
}

/// A connected `AF_UNIX` socket pair of `kind`: (one to send, its peer as witness).
fn socket_pair(kind: SocketType) -> (OwnedFd, OwnedFd) {
    rustix::net::socketpair(AddressFamily::UNIX, kind, SocketFlags::CLOEXEC, None).unwrap()
}

/// A pipe: (write end to send, read end as witness).
fn pipe() -> (OwnedFd, OwnedFd) {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    (w, r)
}

/// A memfd of `len` bytes with `seals`.
fn memfd(len: u64, seals: SealFlags) -> OwnedFd {
    let fd = rustix::fs::memfd_create("hostile", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    if !seals.is_empty() {
        rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
    }
    fd
}

fn all_seals() -> SealFlags {
    SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL
}

fn receive_right(has_send_source: bool, main_conns: u16, once_conns: u8, qlimit: u32) -> Descriptor {
    Descriptor::Receive(ReceiveRightInfo {
        has_send_source,
        main_conns,
        once_conns,
        channel_conns: 0,
        qlimit,
        message_limit: 4096,
        released: 0,
        no_senders: false,
        port_destroyed: false,
    })
}

/// A memfd that looks like a port's queue page (one page, its magic word, sealed
/// against shrinking and growing): what a forger would send with a receive right.
fn queue_page() -> OwnedFd {
    let fd = rustix::fs::memfd_create("forged-page", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, 4096).unwrap();
    rustix::io::pwrite(&fd, b"ICQ1", 0).unwrap();
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    fd
}

fn set_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

const NDESC: usize = 13;
const NFDS: usize = 14;

// ----- the header -----------------------------------------------------------------------------

#[test]
fn bad_headers_are_refused() {
    let _serial = serial();
    let t = Target::new();
    let good = encode(5, ReplyKind::None, &[], b"hello, world", 0);

    let mut b = good.clone();
    b[..4].copy_from_slice(b"XXXX");
    t.refuses("wrong magic", &b, vec![], vec![], "bad magic");

    let mut b = good.clone();
    b[4] = 5;
    t.refuses("bad version", &b, vec![], vec![], "wire version 5 is not supported");

    for (what, off, v) in [("unknown flag", 6usize, 0x10u8), ("high flag", 7, 0x80), ("reserved byte 15", 15, 1)] {
        let mut b = good.clone();
        b[off] = v;
        t.refuses(what, &b, vec![], vec![], "reserved bits are set");
    }
    for (what, off, v) in [("token without a channel", 20usize, 1u8), ("high token byte", 23, 0x80)] {
        let mut b = good.clone();
        b[off] = v;
        t.refuses(what, &b, vec![], vec![], "a call channel token must be given exactly with a channel reply kind");
    }

    let mut b = good.clone();
    b[12] = 9;
    t.refuses("unknown reply kind", &b, vec![], vec![], "unknown reply kind 9");

    let mut b = good.clone();
    b[NDESC] = 65;
    t.refuses("too many descriptors", &b, vec![], vec![], "65 descriptors exceed");

    let mut b = good.clone();
    b[NFDS] = (MAX_FDS + 1) as u8;
    t.refuses("too many descriptors claimed", &b, vec![], vec![], "129 file descriptors exceed");

    let mut b = encode(5, ReplyKind::None, &[], b"", 0);
    set_u32(&mut b, 16, 70_000);
    t.refuses("in-line length beyond a datagram", &b, vec![], vec![], "70000 in-line bytes exceed");

    let mut b = encode(5, ReplyKind::None, &[], b"", 4096);
    set_u32(&mut b, 16, 1);
    b.push(0);
    let m = memfd(4096, all_seals());
    t.refuses("big in-line alongside in-line bytes", &b, vec![m], vec![], "bad big in-line length");

    let mut b = good.clone();
    b[6] = 1; // the big in-line flag without a big in-line length
    t.refuses("big in-line flag without a length", &b, vec![], vec![], "bad big in-line length");

    t.refuses("shorter than a header", &good[..10], vec![], vec![], "message of 10 bytes is shorter");
}

#[test]
fn lengths_that_do_not_match_the_datagram_are_refused() {
    let _serial = serial();
    let t = Target::new();
    let good = encode(5, ReplyKind::None, &[Descriptor::Ool { len: 4096 }], b"0123456789", 0);
    let n = good.len();

    let m = memfd(4096, all_seals());
    t.refuses("truncated", &good[..n - 1], vec![m], vec![], &format!("header says {n} bytes, datagram has {}", n - 1));

    let mut b = good.clone();
    b.push(b'!');
    let m = memfd(4096, all_seals());
    t.refuses("padded", &b, vec![m], vec![], &format!("header says {n} bytes, datagram has {}", n + 1));

    // A descriptor the header does not count: it is read as in-line data that the
    // header does not count either.
    let mut b = good.clone();
    b[NDESC] = 0;
    let m = memfd(4096, all_seals());
    t.refuses("descriptor not counted", &b, vec![m], vec![], "header says 42 bytes");

    // Zero bytes but a descriptor: not the hang-up an empty read otherwise means.
    let (fd, w) = socket_pair(SocketType::SEQPACKET);
    t.refuses("no bytes, one descriptor", &[], vec![fd], vec![w], "message of 0 bytes is shorter");
}

/// A zero-length datagram looks like a hang-up to `recvmsg`; it must be refused as
/// malformed, and the port must stay alive.
#[test]
fn an_empty_datagram_does_not_kill_the_port() {
    let _serial = serial();
    let t = Target::new();
    for i in 0..3 {
        t.refuses(&format!("empty datagram {i}"), &[], vec![], vec![], "empty datagram");
    }
    assert_eq!(t.s.right_kinds(t.p).unwrap(), vec![RightKind::Receive, RightKind::Send]);
    assert!(t.s.port_status(t.p).unwrap().has_send_source);
}

/// A datagram larger than any message (the receive buffer is `DATAGRAM_MAX`) is
/// truncated by the kernel, and refused.
#[test]
fn an_oversized_datagram_is_refused() {
    let _serial = serial();
    let t = Target::new();
    // The raw descriptor is the port's shared send end: this sets its buffer too.
    rustix::net::sockopt::set_socket_send_buffer_size(&t.raw, 128 << 10).unwrap();
    let mut b = encode(5, ReplyKind::None, &[], &vec![7u8; 60_000], 0);
    b.resize(DATAGRAM_MAX + 4096, 7);
    t.refuses("oversized", &b, vec![], vec![], "datagram or descriptors truncated");
    let (fd, w) = socket_pair(SocketType::SEQPACKET);
    t.refuses("oversized, with a descriptor", &b, vec![fd], vec![w], "datagram or descriptors truncated");
}

// ----- descriptors and the file descriptors that come with them -------------------------

#[test]
fn descriptor_counts_that_do_not_match_are_refused() {
    let _serial = serial();
    let t = Target::new();
    let one_send = encode(5, ReplyKind::None, &[Descriptor::Send], b"x", 0);

    t.refuses("too few", &one_send, vec![], vec![], "header says 1 file descriptors, 0 arrived");

    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    let (b, wb) = socket_pair(SocketType::SEQPACKET);
    t.refuses("too many", &one_send, vec![a, b], vec![wa, wb], "header says 1 file descriptors, 2 arrived");

    let none = encode(5, ReplyKind::None, &[], b"nothing attached", 0);
    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    t.refuses("unexpected descriptor", &none, vec![a], vec![wa], "header says 0 file descriptors, 1 arrived");
    let (a, wa) = pipe();
    t.refuses("unexpected pipe", &none, vec![a], vec![wa], "header says 0 file descriptors, 1 arrived");

    // The header and what arrived agree, but the descriptors need fewer.
    let mut b = one_send.clone();
    b[NFDS] = 2;
    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    let (c, wc) = socket_pair(SocketType::SEQPACKET);
    t.refuses("unaccounted", &b, vec![a, c], vec![wa, wc], "descriptors need 1 file descriptors, header says 2");

    // A send right that claims two descriptors.
    let mut b = one_send.clone();
    b[HEADER_LEN + 1] = 2;
    b[NFDS] = 2;
    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    let (c, wc) = socket_pair(SocketType::SEQPACKET);
    t.refuses("send right with two", &b, vec![a, c], vec![wa, wc], "descriptor needs 1 file descriptors but states 2");
}

/// More descriptors than the receiver has room for (up to the kernel's limit of 253):
/// refused, and every one of them closed. Run in a child process, because the failure
/// it guards against aborts the receiving process.
#[test]
fn more_descriptors_than_fit_are_closed() {
    let _serial = serial();
    for n in [MAX_FDS + 1, MAX_FDS + 2, 200, 253] {
        let mut cmd = child_command("child_fd_flood", "fd-flood");
        cmd.env("ICTUS_TEST_FDS", n.to_string());
        ChildGuard::spawn(cmd, &format!("fd-flood with {n} descriptors")).expect_success();
    }
}

#[test]
fn child_fd_flood() {
    if !child_role("fd-flood") {
        return;
    }
    let n: usize = std::env::var("ICTUS_TEST_FDS").unwrap().parse().unwrap();
    let t = Target::new();
    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    let many: Vec<OwnedFd> = (0..n).map(|_| rustix::io::fcntl_dupfd_cloexec(&a, 0).unwrap()).collect();
    drop(a);
    let mut b = encode(5, ReplyKind::None, &[], b"", 0);
    b[NFDS] = MAX_FDS as u8;
    t.refuses(&format!("{n} descriptors"), &b, many, vec![wa], "");
}

#[test]
fn bad_descriptors_are_refused() {
    let _serial = serial();
    let t = Target::new();
    let one = |d: Descriptor| encode(5, ReplyKind::None, &[d], b"", 0);

    let mut b = one(Descriptor::Send);
    b[HEADER_LEN] = 9;
    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    t.refuses("unknown descriptor kind", &b, vec![a], vec![wa], "unknown descriptor kind 9");

    for (what, off) in [("flags", 2usize), ("a", 4), ("b", 8), ("c", 16)] {
        let mut b = one(Descriptor::SendOnce);
        b[HEADER_LEN + off] = 1;
        let (a, wa) = socket_pair(SocketType::SEQPACKET);
        t.refuses(&format!("send-once right with {what} set"), &b, vec![a], vec![wa], "reserved bits are set");
    }

    let mut b = one(Descriptor::Ool { len: 4096 });
    b[HEADER_LEN + 17] = 1;
    t.refuses("out-of-line with c set", &b, vec![memfd(4096, all_seals())], vec![], "reserved bits are set");

    let mut b = one(Descriptor::Ool { len: 4096 });
    b[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&0u64.to_le_bytes());
    t.refuses("out-of-line of zero bytes", &b, vec![memfd(4096, all_seals())], vec![], "out-of-line length 0");

    let mut b = one(Descriptor::Ool { len: 4096 });
    b[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&(65u64 << 30).to_le_bytes());
    t.refuses("out-of-line beyond the limit", &b, vec![memfd(4096, all_seals())], vec![], "is zero or too large");
}

/// Where a port right is expected, anything but an `AF_UNIX` `SOCK_SEQPACKET` socket
/// is refused: a pipe, a stream or datagram socket, a memfd.
#[test]
fn non_port_descriptors_as_rights_are_refused() {
    let _serial = serial();
    let t = Target::new();
    let send = encode(5, ReplyKind::None, &[Descriptor::Send], b"", 0);
    let send_once = encode(5, ReplyKind::None, &[Descriptor::SendOnce], b"", 0);
    let reply = encode(5, ReplyKind::SendOnce, &[], b"", 0);
    let why = "a right is not a port socket";

    let (a, wa) = pipe();
    t.refuses("pipe as send right", &send, vec![a], vec![wa], why);
    let (a, wa) = pipe();
    t.refuses("pipe as send-once right", &send_once, vec![a], vec![wa], why);
    let (a, wa) = pipe();
    t.refuses("pipe as reply right", &reply, vec![a], vec![wa], why);
    let (a, wa) = socket_pair(SocketType::STREAM);
    t.refuses("stream socket as send right", &send, vec![a], vec![wa], why);
    let a = rustix::net::socket_with(AddressFamily::UNIX, SocketType::DGRAM, SocketFlags::CLOEXEC, None).unwrap();
    t.refuses("datagram socket as send-once right", &send_once, vec![a], vec![], why);
    t.refuses("memfd as reply right", &reply, vec![memfd(4096, all_seals())], vec![], why);

    // A right among good ones: nothing of the message is kept.
    let mixed = encode(5, ReplyKind::Send, &[Descriptor::Send, Descriptor::Send, Descriptor::SendOnce], b"", 0);
    let (r, wr) = socket_pair(SocketType::SEQPACKET);
    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    let (b, wb) = pipe();
    let (c, wc) = socket_pair(SocketType::SEQPACKET);
    t.refuses("pipe among rights", &mixed, vec![r, a, b, c], vec![wr, wa, wb, wc], why);
    assert_eq!(t.s.stats().names, 1, "no right of a refused message was inserted");
}

/// A call channel offered with a reply pipe must bring a pipe's write end beside the
/// channel, and nothing else: a pipe's read end, a socket or a memfd is refused, and so
/// is an offer that brings one descriptor where it says two.
#[test]
fn a_channel_offer_with_a_bad_reply_pipe_is_refused() {
    let _serial = serial();
    let t = Target::new();
    let offer = encode(5, ReplyKind::ChannelPipe, &[], b"first call", 0);
    let why = "reply pipe is not a pipe's write end";

    let (chan, peer) = socket_pair(SocketType::SEQPACKET);
    let (_, read_end) = pipe();
    t.refuses("a pipe's read end", &offer, vec![chan, read_end], vec![peer], why);
    let (chan, peer) = socket_pair(SocketType::SEQPACKET);
    let (a, wa) = socket_pair(SocketType::STREAM);
    t.refuses("a stream socket", &offer, vec![chan, a], vec![peer, wa], why);
    let (chan, peer) = socket_pair(SocketType::SEQPACKET);
    t.refuses("a memfd", &offer, vec![chan, memfd(4096, all_seals())], vec![peer], why);
    let (chan, peer) = socket_pair(SocketType::SEQPACKET);
    t.refuses("the pipe missing", &offer, vec![chan], vec![peer], "header says 2 file descriptors, 1 arrived");
    assert_eq!(t.s.stats().names, 1, "no right of a refused offer was inserted");
}

/// Out-of-line memory must be a memfd sealed against writing, shrinking and growing,
/// at least as long as its descriptor says.
#[test]
fn bad_out_of_line_memory_is_refused() {
    let _serial = serial();
    let t = Target::new();
    let ool = encode(5, ReplyKind::None, &[Descriptor::Ool { len: 8192 }], b"", 0);
    let big = encode(5, ReplyKind::None, &[], b"", 8192);

    t.refuses("unsealed memfd", &ool, vec![memfd(8192, SealFlags::empty())], vec![], "not sealed against writing");
    t.refuses("memfd sealed against writing only", &ool, vec![memfd(8192, SealFlags::WRITE)], vec![], "not sealed");
    t.refuses(
        "memfd sealed against all but growing",
        &ool,
        vec![memfd(8192, SealFlags::WRITE | SealFlags::SHRINK)],
        vec![],
        "not sealed",
    );
    t.refuses("sealed but shorter", &ool, vec![memfd(4096, all_seals())], vec![], "shorter than its descriptor says");
    let (a, wa) = pipe();
    t.refuses("pipe as out-of-line", &ool, vec![a], vec![wa], "not a memory file");
    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    t.refuses("socket as out-of-line", &ool, vec![a], vec![wa], "not a memory file");
    let exe: OwnedFd = std::fs::File::open("/proc/self/exe").unwrap().into();
    t.refuses("regular file as out-of-line", &ool, vec![exe], vec![], "not sealable");

    t.refuses("unsealed big in-line", &big, vec![memfd(8192, SealFlags::empty())], vec![], "not sealed");
    t.refuses("short big in-line", &big, vec![memfd(100, all_seals())], vec![], "shorter than");
    let (a, wa) = pipe();
    t.refuses("pipe as big in-line", &big, vec![a], vec![wa], "not a memory file");

    // A good region next to a bad one: the good one is not mapped either.
    let two = encode(5, ReplyKind::None, &[Descriptor::Ool { len: 8192 }, Descriptor::Ool { len: 8192 }], b"", 0);
    let fds = vec![memfd(8192, all_seals()), memfd(8192, SealFlags::empty())];
    t.refuses("good and unsealed", &two, fds, vec![], "not sealed");
    assert_eq!(memfd_mappings(), t.base.memfd_maps);

    // Control: a properly sealed memfd is accepted and mapped.
    raw_send(t.raw.as_fd(), &ool, &[memfd(8192, all_seals()).as_fd()]).unwrap();
    let r = recv(&t.s, t.p);
    assert_eq!(r.ool.len(), 1);
    assert_eq!(r.ool[0].len(), 8192);
    assert_eq!(memfd_mappings(), t.base.memfd_maps + 1);
    drop(r);
    assert_same(&t.base, "accepted out-of-line region released");
}

/// A receive right whose descriptor and file descriptors disagree, or whose state is
/// impossible, is refused.
#[test]
fn inconsistent_receive_rights_are_refused() {
    let _serial = serial();
    let t = Target::new();
    // A page and `n` connections (a receive right brings its queue page first).
    let with_page = |n: usize| -> (Vec<OwnedFd>, Vec<OwnedFd>) {
        let (socks, ws): (Vec<OwnedFd>, Vec<OwnedFd>) = (0..n).map(|_| socket_pair(SocketType::SEQPACKET)).unzip();
        (std::iter::once(queue_page()).chain(socks).collect(), ws)
    };

    // The descriptor states one file descriptor; its state needs three.
    let mut b = encode(5, ReplyKind::None, &[receive_right(true, 1, 0, 5)], b"", 0);
    b[HEADER_LEN + 1] = 1;
    b[NFDS] = 1;
    let (fds, ws) = with_page(0);
    t.refuses("receive right stating too few", &b, fds, ws, "descriptor needs 3 file descriptors but states 1");

    // Consistent descriptor, but the header counts fewer than it needs.
    let mut b = encode(5, ReplyKind::None, &[receive_right(true, 1, 1, 5)], b"", 0);
    b[NFDS] = 3;
    let (fds, ws) = with_page(2);
    t.refuses("receive right needing more", &b, fds, ws, "descriptors need 4 file descriptors, header says 3");

    // And more than it needs.
    let mut b = encode(5, ReplyKind::None, &[receive_right(false, 1, 0, 5)], b"", 0);
    b[NFDS] = 3;
    let (fds, ws) = with_page(2);
    t.refuses("receive right with a spare", &b, fds, ws, "descriptors need 2 file descriptors, header says 3");

    let b = encode(5, ReplyKind::None, &[receive_right(true, 0, 0, 5)], b"", 0);
    let (fds, ws) = with_page(1);
    t.refuses("send source without a connection", &b, fds, ws, "send source without a main connection");

    let b = encode(5, ReplyKind::None, &[receive_right(true, 1, 0, 0)], b"", 0);
    let (fds, ws) = with_page(2);
    t.refuses("queue limit of zero", &b, fds, ws, "queue limit of zero");

    let mut b = encode(5, ReplyKind::None, &[receive_right(true, 1, 0, 5)], b"", 0);
    b[HEADER_LEN + 2] = 0x08;
    let (fds, ws) = with_page(2);
    t.refuses("unknown receive-right flag", &b, fds, ws, "reserved bits are set");

    // Counts agree, but one connection is a pipe.
    let b = encode(5, ReplyKind::None, &[receive_right(true, 1, 1, 5)], b"", 0);
    let (mut fds, mut ws) = with_page(2);
    let (p, wp) = pipe();
    fds.push(p);
    ws.push(wp);
    t.refuses("pipe as a connection", &b, fds, ws, "a right is not a port socket");

    // Counts agree, but the queue page is not one: an unsealed memfd (it could shrink
    // under the mapping), a page without its magic word, a socket.
    let b = encode(5, ReplyKind::None, &[receive_right(false, 1, 0, 5)], b"", 0);
    let pages: [(&str, &dyn Fn() -> OwnedFd); 4] = [
        ("an unsealed page", &|| memfd(4096, SealFlags::empty())),
        ("a page without its magic word", &|| memfd(4096, SealFlags::SHRINK | SealFlags::GROW)),
        ("two pages' worth", &|| memfd(8192, SealFlags::SHRINK | SealFlags::GROW)),
        ("a socket as the page", &|| socket_pair(SocketType::SEQPACKET).0),
    ];
    for (what, page) in pages {
        let (main, w) = socket_pair(SocketType::SEQPACKET);
        t.refuses(what, &b, vec![page(), main], vec![w], "queue page is not");
    }
    assert_eq!(t.s.stats().names, 1, "no right of a refused message was inserted");
}

// ----- hostile but well-formed ----------------------------------------------------------

/// A task that holds only a send right to a port cannot make another task believe it
/// holds that port's receive right. A "receive right" made of duplicates of the send
/// end must not merge with the receiver's own send right to that port (it would then
/// report `[Receive, Send]` for a port it cannot receive from).
#[test]
fn a_receive_right_forged_from_send_rights_is_not_believed() {
    let _serial = serial();
    let owner = Space::new();
    let x = owner.allocate_port().unwrap();
    let t = Target::new();
    // The victim holds a send right to `x`, as everyone may (a server's port).
    let (vx, _) = t.s.extract_right(&owner, x, Disposition::MakeSend).unwrap();
    // So does the attacker: two descriptors of `x`'s send end.
    let sx = owner.send_right_fd(x).unwrap();
    let sx2 = rustix::io::fcntl_dupfd_cloexec(&sx, 0).unwrap();
    let page = queue_page();
    let b = encode(5, ReplyKind::None, &[receive_right(true, 1, 0, 5)], b"", 0);
    raw_send(t.raw.as_fd(), &b, &[page.as_fd(), sx.as_fd(), sx2.as_fd()]).unwrap();
    drop((sx, sx2, page));
    let mut r = Received::new();
    match t.s.receive(t.p, &mut r, within(WATCHDOG)) {
        Err(ReceiveError::Malformed { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(()) => {
            assert_eq!(r.ports.len(), 1);
            assert_ne!(r.ports[0].name, vx, "the forgery merged with the victim's send right to the port");
            assert_eq!(t.s.right_kinds(vx).unwrap(), vec![RightKind::Send]);
        }
    }
    // The port's real owner still gets its messages.
    t.s.send(vx, &mut Message::new(9, vec![]), SendOptions::default()).unwrap();
    assert_eq!(recv(&owner, x).id, 9);
}

// ----- call channels -----------------------------------------------------------------------

/// A call channel (reply kind `Channel`) may be offered, and named (`OnChannel`), only on
/// a port's main connection; it must be a port socket; a task can name only a channel it
/// offered itself; and what a client writes on its channel never reaches the port.
#[test]
fn misplaced_call_channels_are_refused() {
    let _serial = serial();
    let t = Target::new();
    // A send-once connection makes the port wait through an epoll of its own, made once
    // and kept: make it now, so that it is part of the baseline.
    drop(t.s.pollable_fd(t.p).unwrap());
    let t = Target { base: Resources::settled(), ..t };
    let why_where = "a call channel named where none may be";
    let why_unknown = "a call on a channel this port does not keep";

    let offer = encode(1, ReplyKind::Channel, &[], b"call", 0);
    let (a, wa) = pipe();
    t.refuses("pipe as call channel", &offer, vec![a], vec![wa], "a right is not a port socket");
    let (a, wa) = socket_pair(SocketType::STREAM);
    t.refuses("stream socket as call channel", &offer, vec![a], vec![wa], "a right is not a port socket");
    t.refuses("call channel without a descriptor", &offer, vec![], vec![], "header says 1 file descriptors, 0 arrived");
    let on_channel = |token: u32, data: &[u8]| {
        let mut b = encode(4, ReplyKind::OnChannel, &[], data, 0);
        b[20..24].copy_from_slice(&token.to_le_bytes());
        b
    };
    t.refuses("a call on a channel never offered", &on_channel(1, b""), vec![], vec![], why_unknown);

    // Offered, or named, on a send-once right's connection.
    for (what, bytes, with_fd) in [("offered", offer.clone(), true), ("named", on_channel(1, b""), false)] {
        let other = Space::new();
        let (so, _) = other.extract_right(&t.s, t.p, Disposition::MakeSendOnce).unwrap();
        let so_fd = launder(&other, so);
        drop(other);
        let (b, wb) = socket_pair(SocketType::SEQPACKET);
        let fds: Vec<BorrowedFd<'_>> = if with_fd { vec![b.as_fd()] } else { vec![] };
        raw_send(so_fd.as_fd(), &bytes, &fds).unwrap();
        drop((b, so_fd));
        let (why, _) = recv_refused(&t.s, t.p);
        assert!(why.contains(why_where), "{what}: {why}");
        if with_fd {
            assert!(peer_closed(wb.as_fd()), "the offered channel was closed");
        }
        drop(wb);
        assert_back_to(&t.base, "channel on a send-once connection");
        t.still_works("channel on a send-once connection");
    }

    // Offered properly: the reply comes back on it, saying the port keeps it.
    let (ours, theirs) = socket_pair(SocketType::SEQPACKET);
    let token = u32::from_le_bytes(offer[20..24].try_into().unwrap());
    raw_send(t.raw.as_fd(), &offer, &[theirs.as_fd()]).unwrap();
    drop(theirs);
    let req = recv(&t.s, t.p);
    let reply = req.reply.expect("a channel brings a reply right");
    assert_eq!((req.id, req.data(), reply.kind), (1, &b"call"[..], RightKind::SendOnce));
    t.s.send(reply.name, &mut Message::new(2, b"answer".to_vec()), SendOptions::default()).unwrap();
    let (answer, fds) = raw_recv(ours.as_fd());
    assert!(fds.is_empty());
    let answer = Datagram::parse(&answer, 0).unwrap();
    assert_eq!(answer.inline, b"answer");
    assert!(answer.header.kept, "the port keeps the channel");
    // The port keeps the channel (and a notifier watches it); that is the baseline now.
    let t = Target { base: Resources::settled(), ..t };

    // Another task naming this client's channel is refused: channels are keyed by the
    // pid the kernel stamps, so a guessed (or stolen) token reaches nothing.
    {
        let mut cmd = child_command("child_channel_thief", "channel-thief");
        cmd.env("ICTUS_TEST_TOKEN", token.to_string());
        t.s.give_bootstrap(&mut cmd, t.p).unwrap();
        let child = ChildGuard::spawn(cmd, "channel-thief");
        let (why, sender) = recv_refused(&t.s, t.p);
        assert!(why.contains(why_unknown), "{why}");
        assert_eq!(sender.map(|c| c.pid), Some(child.pid()));
        child.expect_success();
        assert!(!readable(ours.as_fd(), Duration::ZERO), "nothing reached the client's channel");
    }

    // What the client writes on its own channel is never read by the port.
    let (a, wa) = socket_pair(SocketType::SEQPACKET);
    raw_send(ours.as_fd(), &encode(3, ReplyKind::SendOnce, &[], b"", 0), &[a.as_fd()]).unwrap();
    raw_send(ours.as_fd(), b"garbage", &[]).unwrap();
    drop(a);
    assert_empty(&t.s, t.p);
    drop(wa);

    // A token of one's own that was never offered is refused; the right one is served.
    t.refuses("a call naming another token", &on_channel(token ^ 0x55, b""), vec![], vec![], why_unknown);
    let malformed = t.s.stats().malformed;
    raw_send(t.raw.as_fd(), &on_channel(token, b"again"), &[]).unwrap();
    let req = recv(&t.s, t.p);
    assert_eq!((req.id, req.data()), (4, &b"again"[..]));
    let reply = req.reply.expect("a call on a kept channel is answered on it");
    t.s.send(reply.name, &mut Message::new(5, b"again".to_vec()), SendOptions::default()).unwrap();
    let (answer, _) = raw_recv(ours.as_fd());
    assert_eq!(Datagram::parse(&answer, 0).unwrap().header.id, 5);
    assert_eq!(t.s.stats().malformed, malformed);

    // The client goes: so does the port's end of its channel, once the notifier has
    // seen the hang-up.
    drop(ours);
    wait_until_fd_count(t.base.fds.len() - 2, "both ends of the channel closed");
    t.still_works("client gone");
}

#[test]
fn child_channel_thief() {
    if !child_role("channel-thief") {
        return;
    }
    let token: u32 = std::env::var("ICTUS_TEST_TOKEN").unwrap().parse().unwrap();
    let s = Space::task();
    let boot = s.take_bootstrap().unwrap().expect("bootstrap");
    let raw = s.send_right_fd(boot).unwrap();
    let mut b = encode(6, ReplyKind::OnChannel, &[], b"stolen", 0);
    b[20..24].copy_from_slice(&token.to_le_bytes());
    raw_send(raw.as_fd(), &b, &[]).unwrap();
}

/// Wait (within the watchdog) until the process has `n` descriptors open.
#[track_caller]
fn wait_until_fd_count(n: usize, what: &str) {
    let deadline = Instant::now() + WATCHDOG;
    while Resources::now().fds.len() != n {
        assert!(Instant::now() < deadline, "{what}: {} descriptors, expected {n}", Resources::now().fds.len());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Control for the test below: a call channel counts as a sender, and when the client
/// holding it (and its send right) goes, no-senders fires.
#[test]
fn no_senders_fires_when_a_client_with_a_call_channel_leaves() {
    let _serial = serial();
    let s = Space::new();
    let notify = s.allocate_port().unwrap();
    let p = s.allocate_port().unwrap();
    let client = Space::new();
    let (cp, _) = client.extract_right(&s, p, Disposition::MakeSend).unwrap();
    s.request_notification(p, NotifyKind::NoSenders, Some(PortArg::new(notify, Disposition::MakeSendOnce))).unwrap();
    let raw = client.send_right_fd(cp).unwrap();
    let (ours, theirs) = socket_pair(SocketType::SEQPACKET);
    raw_send(raw.as_fd(), &encode(1, ReplyKind::Channel, &[], b"", 0), &[theirs.as_fd()]).unwrap();
    drop((raw, theirs));
    let req = recv(&s, p);
    s.send(req.reply.unwrap().name, &mut Message::new(2, vec![]), SendOptions::default()).unwrap();
    let _ = raw_recv(ours.as_fd());
    client.deallocate(cp).unwrap();
    drop(client);
    // The channel still reaches the port.
    assert_empty(&s, notify);
    drop(ours);
    let n = recv(&s, notify);
    assert_eq!(n.id, NotifyId::NoSenders.id());
    assert_eq!(NotifyId::parse_body(n.data()), Some((p, 1)));
}

/// A client holding a send right can offer *that send right* as its call channel. The
/// port must not keep a send right to itself: once every client is gone, no-senders
/// must fire.
#[test]
fn a_call_channel_that_is_the_ports_own_send_right_does_not_defeat_no_senders() {
    let _serial = serial();
    let s = Space::new();
    let notify = s.allocate_port().unwrap();
    let p = s.allocate_port().unwrap();
    let client = Space::new();
    let (cp, _) = client.extract_right(&s, p, Disposition::MakeSend).unwrap();
    s.request_notification(p, NotifyKind::NoSenders, Some(PortArg::new(notify, Disposition::MakeSendOnce))).unwrap();
    assert_empty(&s, notify);
    // The client "offers a channel": a duplicate of its send right.
    let raw = client.send_right_fd(cp).unwrap();
    let chan = rustix::io::fcntl_dupfd_cloexec(&raw, 0).unwrap();
    raw_send(raw.as_fd(), &encode(1, ReplyKind::Channel, &[], b"", 0), &[chan.as_fd()]).unwrap();
    drop((raw, chan));
    let mut r = Received::new();
    match s.receive(p, &mut r, within(WATCHDOG)) {
        Err(ReceiveError::Malformed { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(()) => s.deallocate(r.reply.expect("reply right").name).unwrap(),
    }
    // Every send right the client had is gone.
    client.deallocate(cp).unwrap();
    drop(client);
    let n = recv(&s, notify);
    assert_eq!(n.id, NotifyId::NoSenders.id());
}

/// Move a send-once right out of `space` onto a raw socket, and return its descriptor:
/// what a hostile task holding the right would have.
fn launder(space: &Space, right: Name) -> OwnedFd {
    let (mine, theirs) = socket_pair(SocketType::SEQPACKET);
    let carrier = space.insert_send_fd(mine).unwrap();
    let mut m = Message::new(1, Vec::new());
    m.ports.push(PortArg::new(right, Disposition::MoveSendOnce));
    space.send(carrier, &mut m, SendOptions::default()).unwrap();
    space.deallocate(carrier).unwrap();
    let (_, mut fds) = raw_recv(theirs.as_fd());
    assert_eq!(fds.len(), 1);
    fds.pop().unwrap()
}

/// A receive that must be refused as malformed: the reason and the sender.
#[track_caller]
fn recv_refused(s: &Space, p: Name) -> (String, Option<Credentials>) {
    let mut r = Received::new();
    match s.receive(p, &mut r, within(WATCHDOG)) {
        Err(ReceiveError::Malformed { reason, sender }) => (reason, sender),
        other => panic!("expected a malformed-message error, got {other:?} {r:?}"),
    }
}

// ----- names are not capabilities ------------------------------------------------------------

/// A space that was given no right reaches nothing, whatever name it guesses, and
/// another space's ports receive nothing from it.
#[test]
fn guessed_names_reach_nothing() {
    let _serial = serial();
    let owner = Space::new();
    let ports: Vec<Name> = (0..8).map(|_| owner.allocate_port_with_send().unwrap()).collect();
    let set = owner.allocate_port_set().unwrap();
    let stranger = Space::new();
    let mut guesses: Vec<Name> = (0..=4096u32).map(Name).collect();
    guesses.extend((0..64u32).flat_map(|i| (0..=255u8).map(move |g| Name::new(i, g))));
    guesses.extend([Name::DEAD, Name(u32::MAX - 1)]);
    guesses.extend(ports.iter().copied().chain([set]));
    for &n in &guesses {
        match stranger.send(n, &mut Message::new(1, b"guess".to_vec()), SendOptions::NONBLOCKING) {
            Err(SendError::InvalidDest(d)) => assert_eq!(d, n),
            other => panic!("send to guessed name {n}: {other:?}"),
        }
        assert!(matches!(
            stranger.receive(n, &mut Received::new(), within(std::time::Duration::ZERO)),
            Err(ReceiveError::InvalidName(_))
        ));
        assert!(stranger.right_kinds(n).is_err());
        assert!(stranger.send_right_fd(n).is_err());
        assert!(stranger.pollable_fd(n).is_err());
        assert!(stranger.request_notification(n, NotifyKind::DeadName, None).is_err());
    }
    assert_eq!(stranger.stats().names, 0);
    for &p in &ports {
        assert_empty(&owner, p);
    }
}

/// A child process given no right has no descriptor for the port: no open file in it
/// is the port's socket. (Control: a child given the port as its bootstrap right has
/// exactly one, which `take_bootstrap` takes over.)
#[test]
fn a_child_without_the_right_has_no_descriptor_for_the_port() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let p = s.allocate_port_with_send().unwrap();
        let other = s.allocate_port().unwrap();
        let st = rustix::fs::fstat(s.send_right_fd(p).unwrap()).unwrap();
        let ident = format!("{}:{}", st.st_dev, st.st_ino);
        for (expect, boot) in [(0, other), (1, p)] {
            let mut cmd = child_command("child_fd_scanner", "fd-scanner");
            cmd.env("ICTUS_TEST_PORT_IDENT", &ident).env("ICTUS_TEST_EXPECT", expect.to_string());
            s.give_bootstrap(&mut cmd, boot).unwrap();
            ChildGuard::spawn(cmd, "fd-scanner").expect_success();
        }
        for n in [p, other] {
            s.destroy(n).unwrap();
        }
    }
    assert_back_to(&base, "fd scanner");
}

/// Descriptors of this process that are the socket `ident` ("dev:ino").
fn descriptors_of(ident: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for (fd, _) in open_fds() {
        // Following /proc/self/fd/N stats the open file itself, sockets included.
        if let Ok(m) = std::fs::metadata(format!("/proc/self/fd/{fd}")) {
            use std::os::unix::fs::MetadataExt;
            if format!("{}:{}", m.dev(), m.ino()) == ident {
                out.push(fd);
            }
        }
    }
    out
}

#[test]
fn child_fd_scanner() {
    if !child_role("fd-scanner") {
        return;
    }
    let ident = std::env::var("ICTUS_TEST_PORT_IDENT").unwrap();
    let expect: usize = std::env::var("ICTUS_TEST_EXPECT").unwrap().parse().unwrap();
    let found = descriptors_of(&ident);
    assert_eq!(found.len(), expect, "descriptors for the port: {found:?}, all: {:?}", open_fds());
    if expect == 1 {
        assert_eq!(found, vec![BOOTSTRAP_FD]);
    }
    let s = Space::task();
    let boot = s.take_bootstrap().unwrap().expect("a bootstrap right");
    // Taken over: the inherited number is closed, one descriptor remains.
    assert_eq!(descriptors_of(&ident).len(), expect);
    let inherited = format!("/proc/self/fd/{BOOTSTRAP_FD}");
    assert!(std::fs::symlink_metadata(inherited).is_err(), "the inherited descriptor was closed");
    s.send(boot, &mut Message::new(1, vec![]), SendOptions::NONBLOCKING).unwrap();
}

// ----- credentials ------------------------------------------------------------------------

/// The credentials a message carries are the kernel's: an unprivileged process that
/// claims another pid, uid or gid in `SCM_CREDENTIALS` is refused by the kernel, and
/// its messages show who it is, so a forged notification (a message with a
/// notification's id and body) is told from a real one by its sender. (As root the
/// test drops to `nobody` in the child: everything in ictus works unprivileged. A
/// privileged sender could forge credentials, as `Credentials` documents.)
#[test]
fn an_unprivileged_sender_cannot_forge_credentials() {
    let _serial = serial();
    let base = Resources::settled();
    {
        let s = Space::new();
        let p = s.allocate_port().unwrap();
        let mut cmd = child_command("child_forger", "forger");
        s.give_bootstrap(&mut cmd, p).unwrap();
        let child = ChildGuard::spawn(cmd, "forger");
        let pid = child.pid();
        let r = recv(&s, p);
        assert_eq!(r.id, NotifyId::DeadName.id(), "looks like a notification");
        assert_ne!(r.sender.pid, std::process::id(), "but it does not come from this task");
        let root = rustix::process::geteuid().is_root();
        let expect_uid = if root { NOBODY } else { rustix::process::geteuid().as_raw() };
        let expect_gid = if root { NOBODY } else { rustix::process::getegid().as_raw() };
        assert_eq!(r.sender, Credentials { pid, uid: expect_uid, gid: expect_gid });
        let r = recv(&s, p);
        assert_eq!((r.id, r.sender.pid), (2, pid), "explicit, truthful credentials are fine");
        child.expect_success();
        s.destroy(p).unwrap();
    }
    assert_back_to(&base, "forger");
}

const NOBODY: u32 = 65534;

#[test]
fn child_forger() {
    if !child_role("forger") {
        return;
    }
    if rustix::process::geteuid().is_root() {
        // SAFETY: plain system calls with valid arguments (an empty group list).
        // glibc applies set*id to every thread of the process.
        unsafe {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
            assert_eq!(libc::setresgid(NOBODY, NOBODY, NOBODY), 0);
            assert_eq!(libc::setresuid(NOBODY, NOBODY, NOBODY), 0);
        }
        // A change of credentials clears the parent-death signal: arm it again.
        assert!(child_role("forger"));
    }
    let s = Space::task();
    let boot = s.take_bootstrap().unwrap().expect("bootstrap");
    let raw = s.send_right_fd(boot).unwrap();
    let me = rustix::process::getpid();
    let uid = rustix::process::geteuid();
    let gid = rustix::process::getegid();
    let bytes = encode(3, ReplyKind::None, &[], b"forged", 0);
    let forge = |c: rustix::net::UCred| -> rustix::io::Result<usize> {
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        assert!(control.push(rustix::net::SendAncillaryMessage::ScmCredentials(c)));
        rustix::net::sendmsg(
            &raw,
            &[std::io::IoSlice::new(&bytes)],
            &mut control,
            rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT,
        )
    };
    let init = rustix::process::Pid::from_raw(1).unwrap();
    let root_uid = rustix::process::Uid::ROOT;
    let root_gid = rustix::process::Gid::ROOT;
    use rustix::io::Errno;
    use rustix::net::UCred;
    assert_eq!(forge(UCred { pid: init, uid, gid }), Err(Errno::PERM), "another pid");
    assert_eq!(forge(UCred { pid: me, uid: root_uid, gid }), Err(Errno::PERM), "another uid");
    assert_eq!(forge(UCred { pid: me, uid, gid: root_gid }), Err(Errno::PERM), "another gid");
    let mut forged = Message::new(NotifyId::DeadName.id(), NotifyId::body(Name(0x101), 0).to_vec());
    s.send(boot, &mut forged, SendOptions::default()).unwrap();
    let truthful = encode(2, ReplyKind::None, &[], b"", 0);
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    assert!(control.push(rustix::net::SendAncillaryMessage::ScmCredentials(UCred { pid: me, uid, gid })));
    rustix::net::sendmsg(
        &raw,
        &[std::io::IoSlice::new(&truthful)],
        &mut control,
        rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT,
    )
    .unwrap();
}

// ----- the fuzz target's seed corpus ----------------------------------------------------

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode")
}

/// The seed corpus: (file name, bytes). Each input is one byte of file-descriptor
/// count, then a datagram. `seed-valid-*` parse; `seed-broken-*` do not.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut valid = |name: &str, nfds: u8, dg: Vec<u8>| {
        let mut v = vec![nfds];
        v.extend(dg);
        out.push((format!("seed-valid-{name}"), v));
    };
    valid("empty", 0, encode(1, ReplyKind::None, &[], b"", 0));
    valid("inline", 0, encode(7, ReplyKind::None, &[], b"hello, ictus", 0));
    valid(
        "notification",
        0,
        encode(NotifyId::NoSenders.id(), ReplyKind::None, &[], &NotifyId::body(Name(0x101), 3), 0),
    );
    valid(
        "reply-send-ool",
        3,
        encode(42, ReplyKind::SendOnce, &[Descriptor::Send, Descriptor::Ool { len: 4096 }], b"abc", 0),
    );
    valid("receive-right", 5, encode(-3, ReplyKind::None, &[receive_right(true, 1, 2, 128)], b"", 0));
    valid("counted", 0, {
        let mut v = Vec::new();
        let head = Head { counted: true, ..Head::new(14, ReplyKind::None) };
        Datagram::encode(head, &[], b"took a place in the queue", 0, &mut v).unwrap();
        v
    });
    valid("big-inline", 2, encode(9, ReplyKind::Send, &[], b"", 1 << 20));
    valid("channel-offer", 1, encode(11, ReplyKind::Channel, &[], b"first call", 0));
    valid("on-channel", 0, encode(12, ReplyKind::OnChannel, &[], b"later call", 0));
    valid("channel-pipe-offer", 2, encode(13, ReplyKind::ChannelPipe, &[], b"first call, with a pipe", 0));
    valid(
        "everything",
        11,
        encode(
            i32::MIN,
            ReplyKind::Send,
            &[
                Descriptor::SendOnce,
                Descriptor::Receive(ReceiveRightInfo {
                    has_send_source: false,
                    main_conns: 2,
                    once_conns: 1,
                    channel_conns: 1,
                    qlimit: 65_536,
                    message_limit: 1 << 30,
                    released: u32::MAX,
                    no_senders: true,
                    port_destroyed: true,
                }),
                Descriptor::Ool { len: 1 },
                Descriptor::Send,
            ],
            &[0xff; 40],
            0,
        ),
    );
    let base = encode(5, ReplyKind::None, &[Descriptor::Send], b"data", 0);
    let mut broken = |name: &str, nfds: u8, f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = base.clone();
        f(&mut b);
        let mut v = vec![nfds];
        v.extend(b);
        out.push((format!("seed-broken-{name}"), v));
    };
    broken("magic", 1, &|b| b[0] = b'X');
    broken("version", 1, &|b| b[4] = 9);
    broken("reserved", 1, &|b| b[15] = 1);
    broken("on-socket-word", 1, &|b| b[6] = 4);
    broken("truncated", 1, &|b| {
        b.pop();
    });
    broken("padded", 1, &|b| b.push(0));
    broken("fd-count", 0, &|_| {});
    broken("unaccounted", 2, &|b| b[NFDS] = 2);
    broken("descriptor-kind", 1, &|b| b[HEADER_LEN] = 9);
    broken("descriptor-fds", 2, &|b| {
        b[HEADER_LEN + 1] = 2;
        b[NFDS] = 2;
    });
    broken("short", 1, &|b| b.truncate(10));
    broken("empty", 0, &|b| b.clear());
    broken("big-and-inline", 2, &|b| {
        b[6] = 1;
        b[24] = 1;
        b[NFDS] = 2;
    });
    broken("receive-zero-qlimit", 3, &|b| {
        let mut d = [0u8; DESCRIPTOR_LEN];
        receive_right(true, 1, 0, 1).encode(&mut d);
        d[16..20].copy_from_slice(&0u32.to_le_bytes());
        b[HEADER_LEN..HEADER_LEN + DESCRIPTOR_LEN].copy_from_slice(&d);
        b[NFDS] = 3;
    });
    broken("receive-limit-beyond-the-largest-message", 3, &|b| {
        let mut d = [0u8; DESCRIPTOR_LEN];
        receive_right(true, 1, 0, 1).encode(&mut d);
        d[4..8].copy_from_slice(&((1u32 << 30) + 1).to_le_bytes());
        b[HEADER_LEN..HEADER_LEN + DESCRIPTOR_LEN].copy_from_slice(&d);
        b[NFDS] = 3;
    });
    out
}

/// Check one fuzz input the way the fuzz target does.
fn check_input(name: &str, data: &[u8]) -> bool {
    let Some((&nfds, bytes)) = data.split_first() else {
        return false;
    };
    let Ok(dg) = Datagram::parse(bytes, usize::from(nfds)) else {
        return false;
    };
    let needed = dg.header.leading_fds() + dg.descriptors.iter().map(Descriptor::nfds).sum::<usize>();
    assert_eq!(needed, usize::from(nfds), "{name}: file descriptors unaccounted");
    let mut out = Vec::new();
    Datagram::encode(dg.header.head(), &dg.descriptors, dg.inline, dg.header.big_len, &mut out)
        .unwrap_or_else(|e| panic!("{name}: accepted but not encodable: {e}"));
    assert_eq!(out, bytes, "{name}: re-encoding changed the bytes");
    true
}

/// The reply-pipe fuzz target's seed corpus: (file name, bytes), one pipe read each.
fn pipe_seeds() -> Vec<(String, Vec<u8>)> {
    let reply = encode(11, ReplyKind::None, &[], b"pong", 0);
    let mut kept = reply.clone();
    kept[6] |= 2;
    let notification = {
        let mut v = encode(NotifyId::SendOnce.id(), ReplyKind::None, &[], &NotifyId::body(Name::NULL, 0), 0);
        v[6] |= 2;
        v
    };
    let counted = {
        let mut v = Vec::new();
        Datagram::encode(Head { counted: true, ..Head::new(11, ReplyKind::None) }, &[], b"pong", 0, &mut v).unwrap();
        v
    };
    [
        ("seed-valid-reply", kept.clone()),
        ("seed-valid-on-socket", ictus_abi::PipeMessage::on_socket(true).to_vec()),
        ("seed-valid-send-once-notification", notification),
        ("seed-broken-reply-right", encode(11, ReplyKind::SendOnce, &[], b"", 0)),
        ("seed-broken-two-messages", [kept.clone(), kept].concat()),
        ("seed-broken-counted", counted),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), b))
    .collect()
}

/// Replay the reply-pipe fuzz target's corpus on stable: every committed seed is
/// current, valid seeds are accepted and broken ones refused.
#[test]
fn pipe_reply_corpus_replays() {
    let dir = corpus_dir().with_file_name("pipe_reply");
    for (name, bytes) in pipe_seeds() {
        assert_eq!(
            std::fs::read(dir.join(&name)).ok().as_ref(),
            Some(&bytes),
            "seed {name} is missing or stale: run `cargo test -p ictus-ipc --test hostile -- --ignored write_fuzz_seed_corpus`"
        );
    }
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ok = ictus_abi::PipeMessage::parse(&std::fs::read(e.path()).unwrap()).is_ok();
        if name.starts_with("seed-valid-") {
            assert!(ok, "{name} must parse");
            seen += 1;
        } else if name.starts_with("seed-broken-") {
            assert!(!ok, "{name} must be refused");
            seen += 1;
        }
    }
    assert!(seen >= 5, "the committed seeds are in {}", dir.display());
}

/// Replay the fuzz target's corpus on stable: every committed seed is current, valid
/// seeds are accepted and re-encode to themselves, broken seeds are refused, and any
/// other input found by fuzzing meets the target's invariants.
#[test]
fn fuzz_corpus_replays() {
    let _serial = serial();
    let dir = corpus_dir();
    let mut on_disk = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        on_disk.insert(e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap());
    }
    let seeds = seeds();
    for (name, bytes) in &seeds {
        assert_eq!(
            on_disk.get(name),
            Some(bytes),
            "seed {name} is missing or stale: run `cargo test -p ictus-ipc --test hostile -- --ignored write_fuzz_seed_corpus`"
        );
    }
    let (mut accepted, mut refused) = (0, 0);
    for (name, data) in &on_disk {
        let ok = check_input(name, data);
        if name.starts_with("seed-valid-") {
            assert!(ok, "{name} must parse");
        } else if name.starts_with("seed-broken-") {
            assert!(!ok, "{name} must be refused");
        }
        if ok {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    assert!(accepted >= 7 && refused >= 13, "corpus: {accepted} accepted, {refused} refused");
    // The decoder's own error for a broken seed is the one its name says.
    let fd_count = &on_disk["seed-broken-fd-count"];
    assert!(matches!(
        Datagram::parse(&fd_count[1..], usize::from(fd_count[0])),
        Err(DecodeError::FdCountMismatch { stated: 1, actual: 0 })
    ));
}

/// Write the seed corpus (run by hand when the wire format changes).
#[test]
#[ignore = "writes fuzz/corpus/decode and pipe_reply; run by hand when the wire format changes"]
fn write_fuzz_seed_corpus() {
    let _serial = serial();
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let dir = corpus_dir().with_file_name("pipe_reply");
    for (name, bytes) in pipe_seeds() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

// ----- a hostile server on a call channel's reply pipe ---------------------------------------

/// A caller whose server writes anything but one plain reply into the channel's reply
/// pipe gets a clear error, counts it as malformed, and never uses that channel again:
/// its next call offers a new one. The pipe cannot carry rights.
#[test]
fn a_hostile_reply_pipe_is_refused_and_the_channel_dropped() {
    let _serial = serial();
    let client = Space::new();
    let (mine, theirs) = socket_pair(SocketType::SEQPACKET);
    let dest = client.insert_send_fd(mine).unwrap();
    let garbage: [(&str, Vec<u8>); 4] = [
        ("not a message", b"garbage".to_vec()),
        ("a reply naming a reply right", encode(2, ReplyKind::SendOnce, &[], b"", 0)),
        (
            "two replies in one",
            [encode(2, ReplyKind::None, &[], b"a", 0), encode(2, ReplyKind::None, &[], b"b", 0)].concat(),
        ),
        ("a truncated reply", encode(2, ReplyKind::None, &[], b"cut short", 0)[..36].to_vec()),
    ];
    let calls = garbage.len() * 2;
    let caller = {
        let client = client.clone();
        std::thread::spawn(move || {
            let mut r = Received::new();
            let mut outcomes = Vec::new();
            for _ in 0..calls {
                outcomes.push(
                    client
                        .call(
                            dest,
                            &mut Message::new(1, b"hi".to_vec()),
                            &mut r,
                            SendOptions::default(),
                            within(WATCHDOG),
                        )
                        .map(|()| r.id),
                );
            }
            outcomes
        })
    };
    for (what, bytes) in &garbage {
        // The first call offers a channel with a pipe; its reply goes on the connection.
        let (req, fds) = raw_recv(theirs.as_fd());
        let h = ictus_abi::Header::decode(&req).unwrap();
        assert_eq!((h.reply, fds.len()), (ReplyKind::ChannelPipe, 2), "{what}: a fresh channel is offered");
        let mut reply = encode(10, ReplyKind::None, &[], b"", 0);
        reply[6] |= 2; // kept
        raw_send(fds[0].as_fd(), &reply, &[]).unwrap();
        // The next call names the channel; the answer is garbage on the pipe.
        let (req, none) = raw_recv(theirs.as_fd());
        assert_eq!((ictus_abi::Header::decode(&req).unwrap().reply, none.len()), (ReplyKind::OnChannel, 0), "{what}");
        rustix::io::write(&fds[1], bytes).unwrap();
    }
    let outcomes = caller.join().unwrap();
    for (i, (what, _)) in garbage.iter().enumerate() {
        assert_eq!(outcomes[2 * i].as_ref().ok(), Some(&10), "{what}: the first reply");
        assert!(
            matches!(outcomes[2 * i + 1], Err(CallError::Receive(ReceiveError::Malformed { .. }))),
            "{what}: {:?}",
            outcomes[2 * i + 1]
        );
    }
    assert_eq!(client.stats().malformed, garbage.len() as u64);
}

// ----- giant messages (issue 23) -------------------------------------------------------------

/// The resident memory of this process, in bytes (`VmRSS`).
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Send raw, with a sparse sealed memfd (it costs the sender nothing), a message whose
/// big in-line data is `len` bytes, and a send-once reply right whose far end is returned.
fn giant(sock: BorrowedFd<'_>, id: i32, len: u64) -> OwnedFd {
    let (reply, far) = socket_pair(SocketType::SEQPACKET);
    let big = memfd(len, all_seals());
    let b = encode(id, ReplyKind::SendOnce, &[], b"", len);
    raw_send(sock, &b, &[reply.as_fd(), big.as_fd()]).unwrap();
    far
}

/// A message larger than the port takes is refused by its header, unread and unmapped:
/// the receiver gets `TooLarge` with the sizes, the sender's reply right a `TooLarge`
/// notice naming the limit, every descriptor is closed, and the port goes on.
#[test]
fn a_giant_message_to_a_port_with_a_limit_is_refused_unread() {
    let _serial = serial();
    let t = Target::new();
    t.s.set_message_limit(t.p, 4096).unwrap();
    let base = Resources::settled();
    let far = giant(t.raw.as_fd(), 5, 1 << 30);
    let mut r = Received::new();
    match t.s.receive(t.p, &mut r, within(WATCHDOG)) {
        Err(e @ ReceiveError::TooLarge { size, limit: 4096, sender: Some(c) }) => {
            assert_eq!((size, c.pid), (1 << 30, std::process::id()));
            assert_eq!(e.code(), ictus_abi::ReturnCode::RcvTooLarge);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(t.s.stats().too_large, 1);
    let (notice, fds) = raw_recv(far.as_fd());
    assert!(fds.is_empty());
    let parsed = Datagram::parse(&notice, 0).unwrap();
    assert_eq!(parsed.header.id, NotifyId::TooLarge.id(), "the caller hears why");
    assert_eq!(&parsed.inline[4..8], &4096u32.to_le_bytes()[..], "and the limit");
    drop(far);
    // In-line bytes in the datagram beyond the limit are refused the same way.
    let b = encode(6, ReplyKind::None, &[], &[7u8; 5000], 0);
    raw_send(t.raw.as_fd(), &b, &[]).unwrap();
    assert!(matches!(t.s.receive(t.p, &mut r, within(WATCHDOG)), Err(ReceiveError::TooLarge { size: 5000, .. })));
    assert_same(&base, "refused giant messages");
    t.s.set_message_limit(t.p, 1 << 30).unwrap();
    t.still_works("after giant messages");
}

/// No client may make a receiver hold memory after its message is done: after one
/// 1 GiB, one hundred 16 MiB and ten thousand small messages, taken by a port that
/// accepts them all, this process's resident memory is within 1 MiB of what it was.
#[test]
fn giant_messages_leave_no_resident_memory_behind() {
    let _serial = serial();
    let t = Target::new();
    let mut r = Received::new();
    // Warm up every path once (the receive buffer, a big mapping, a small message).
    let _ = giant(t.raw.as_fd(), 1, 16 << 20);
    t.s.receive(t.p, &mut r, within(WATCHDOG)).unwrap();
    drop(r);
    let mut r = Received::new();
    t.still_works("warm-up");
    let before = resident();
    let _ = giant(t.raw.as_fd(), 2, 1 << 30);
    t.s.receive(t.p, &mut r, within(WATCHDOG)).unwrap();
    assert_eq!(r.data().len(), 1 << 30);
    assert_eq!((r.data()[0], r.data()[(1 << 30) - 1]), (0, 0), "the data is there to read");
    for i in 0..100 {
        let _ = giant(t.raw.as_fd(), 3, 16 << 20);
        t.s.receive(t.p, &mut r, within(WATCHDOG)).unwrap();
        assert_eq!(r.data().len(), 16 << 20, "message {i}");
    }
    for i in 0..10_000u32 {
        let mut m = Message::new(4, i.to_le_bytes().repeat(16));
        t.s.send(t.p, &mut m, SendOptions::default()).unwrap();
        t.s.receive(t.p, &mut r, within(WATCHDOG)).unwrap();
    }
    // Measured with the receive buffer still held, as a server holds its own.
    let after = resident();
    drop(r);
    assert!(
        after <= before + (1 << 20),
        "resident memory grew by {} KiB after the giant messages",
        (after.saturating_sub(before)) >> 10
    );
}
