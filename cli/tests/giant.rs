//! Giant messages to the real servers, as processes (issue 23, item 4): `ictus
//! name-server`, `ictus clock-server` and `ictus midi-server` each take one 1 GiB, one
//! hundred 16 MiB and ten thousand small messages, and hold no memory for them after.
//!
//! The giant messages are sent raw, as a hostile client would, on a duplicate of an
//! ordinary send right to each service port (from the server's well-known socket, or
//! looked up in the name server as any client does): a header claiming big in-line
//! data and a sparse memfd sealed as the wire requires, which costs the sender nothing.
//! Each server states that its requests are small (`ictus_server::SMALL_REQUESTS`), so
//! every giant one must be refused unread, its sender told why on its reply right (a
//! `TooLarge` notice naming the limit), and the server must go on answering. A sender
//! that goes through its send right the ordinary way is refused before sending. The
//! small messages are real calls of each server's protocol. Then the server's resident
//! memory (`VmRSS` in `/proc/PID/status`) must come back within 1 MiB of what it was
//! after a warm-up.
//!
//! No test asserts a duration: the memory is polled until it settles, within a generous
//! watchdog. The numbers are printed, for the record.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ictus_abi::{Datagram, Head, NotifyId, ReplyKind, DATAGRAM_MAX};
use ictus_ipc::{Message, SendError, SendOptions, Space};
use ictus_server::SMALL_REQUESTS;
use ictus_testkit::{ictus_name_server, unique, wait_until, Proc, TempDir, WATCHDOG};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, SocketFlags, SocketType,
};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Resident memory a server may have gained when it is done with all the messages.
const SLACK: u64 = MIB;
const SMALL_MESSAGES: u32 = 10_000;

fn ictus() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ictus"))
}

/// A server process of the `ictus` binary, its standard error in `log`.
fn spawn_logged(what: &str, args: &[&std::ffi::OsStr], log: &Path) -> Proc {
    let mut cmd = Command::new(ictus());
    cmd.args(args).stdin(Stdio::null());
    Proc::spawn_logged(what, &mut cmd, log)
}

/// The resident memory of process `pid`, in bytes (`VmRSS`).
fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's /proc status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).expect("VmRSS in kB") * 1024
}

/// `sendmsg` of `bytes` with `fds` on a raw socket, as a hostile task would.
fn raw_send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(fds)), "control buffer too small");
    rustix::net::sendmsg(sock, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
        .expect("sendmsg of a giant message");
}

/// One datagram from a raw socket, waiting at most the watchdog; its bytes and how many
/// descriptors came with it (closed here).
fn raw_recv(sock: BorrowedFd<'_>, what: &str) -> (Vec<u8>, usize) {
    #[repr(C, align(8))]
    struct Control([MaybeUninit<u8>; rustix::cmsg_space!(ScmRights(16), ScmCredentials(1))]);
    let mut pfd = [PollFd::new(&sock, PollFlags::IN)];
    let ts = Timespec { tv_sec: WATCHDOG.as_secs() as i64, tv_nsec: 0 };
    assert!(matches!(poll(&mut pfd, Some(&ts)), Ok(1)), "watchdog: no answer to {what}");
    let mut space = Control([MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(16), ScmCredentials(1))]);
    let mut control = RecvAncillaryBuffer::new(&mut space.0);
    let mut buf = vec![0u8; DATAGRAM_MAX];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let m = rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT)
        .expect("recvmsg");
    let mut nfds = 0;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = msg {
            nfds += r.count();
        }
    }
    buf.truncate(m.bytes);
    (buf, nfds)
}

/// A memfd of `len` bytes, sparse (nothing of it is resident), sealed as big in-line
/// data must be.
fn sparse_sealed_memfd(len: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("giant", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).unwrap();
    fd
}

/// Send on `port` (a raw send right) a message of `len` bytes of big in-line data with
/// a send-once reply right, and check that the server refuses it unread: the reply
/// right carries a `TooLarge` notice naming the server's limit, and then nothing more.
fn giant_is_refused(port: BorrowedFd<'_>, len: u64, what: &str) {
    let (reply, far) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .expect("a reply right");
    let big = sparse_sealed_memfd(len);
    let mut head = Vec::new();
    Datagram::encode(Head::new(0x4242, ReplyKind::SendOnce), &[], b"", len, &mut head).expect("encode");
    raw_send(port, &head, &[reply.as_fd(), big.as_fd()]);
    drop((reply, big));
    let (notice, nfds) = raw_recv(far.as_fd(), what);
    let parsed = Datagram::parse(&notice, nfds).unwrap_or_else(|e| panic!("{what}: the answer is not a message: {e}"));
    assert_eq!(parsed.header.id, NotifyId::TooLarge.id(), "{what}: the sender hears that it was too large");
    let (_, limit) = NotifyId::parse_body(parsed.inline).expect("a notice's body");
    assert_eq!(limit, SMALL_REQUESTS, "{what}: the notice names the server's limit");
    // Answered once: the server closed the send-once right.
    let (rest, _) = raw_recv(far.as_fd(), what);
    assert!(rest.is_empty(), "{what}: more than one answer");
}

/// A sender that goes through its send right is refused before anything is sent.
fn ordinary_send_is_refused(space: &Space, port: ictus_ipc::Name, what: &str) {
    let mut m = Message::new(0x4243, vec![0u8; (16 * MIB) as usize]);
    match space.send(port, &mut m, SendOptions::default()) {
        Err(SendError::TooLarge { size, limit }) => assert_eq!((size, limit), (16 * MIB, SMALL_REQUESTS), "{what}"),
        other => panic!("{what}: a 16 MiB message through a send right should be refused, got {other:?}"),
    }
}

/// Every attack on one server: `ports` are raw send rights to its service ports,
/// `call(i)` makes the `i`th small call of its protocol (it must succeed). Prints and
/// checks the server's resident memory; returns how many giant messages were refused.
fn holds_no_memory(server: &mut Proc, what: &str, ports: &[(&str, OwnedFd)], call: &mut dyn FnMut(u32)) -> u64 {
    let pid = server.pid();
    let mut giants = 0;
    let mut giant = |fd: BorrowedFd<'_>, len: u64, what: &str| {
        giant_is_refused(fd, len, what);
        giants += 1;
    };
    // Warm-up: every path once (a refusal, a call), so that what is made lazily is made.
    for (port, fd) in ports {
        giant(fd.as_fd(), 16 * MIB, &format!("{what} {port}: warm-up"));
    }
    for i in 0..100 {
        call(i);
    }
    let before = resident(pid);

    for (port, fd) in ports {
        giant(fd.as_fd(), GIB, &format!("{what} {port}: 1 GiB"));
        call(0);
        for i in 0..100 {
            giant(fd.as_fd(), 16 * MIB, &format!("{what} {port}: 16 MiB #{i}"));
        }
        call(1);
    }
    let peak = resident(pid);
    for i in 0..SMALL_MESSAGES {
        call(i);
    }
    assert!(server.try_wait().is_none(), "{what} died; its log:\n{}", server.log());

    // Whatever a server frees may take a moment to leave its resident set: poll.
    let deadline = Instant::now() + WATCHDOG;
    let after = loop {
        let now = resident(pid);
        if now <= before + SLACK {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "watchdog: {what} still holds {} KiB more than its baseline of {} KiB (peak {} KiB) after \
             the giant messages",
            (now - before) >> 10,
            before >> 10,
            peak >> 10
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "{what}: VmRSS baseline {} KiB, after the giant messages {} KiB, after {SMALL_MESSAGES} small {} KiB \
         ({:+} KiB)",
        before >> 10,
        peak >> 10,
        after >> 10,
        (after as i64 - before as i64) >> 10
    );
    giants
}

/// The operator hears of the refusals too, in the server's own log.
fn logged_refusals(server: &Proc, what: &str) {
    let log = server.log();
    assert!(log.contains(&format!("the port takes {SMALL_REQUESTS} at most")), "{what}'s log:\n{log}");
}

#[test]
fn the_name_server_holds_no_memory_after_giant_messages() {
    let dir = TempDir::new("giant-ns");
    let socket = dir.join("ns.sock");
    let mut ns = ictus_name_server(ictus(), &socket);
    let space = Space::new();
    let client = ictus_name_server::Client::connect_socket(&space, &socket).expect("connect").with_timeout(WATCHDOG);
    let mine = space.allocate_port().unwrap();
    client.register("giant-test", mine).unwrap();
    ordinary_send_is_refused(&space, client.server_port(), "the name server");
    // A raw send right as any client gets it, from the well-known socket.
    let raw = ictus_name_server::socket::fetch_service_fd(&socket, WATCHDOG).expect("the service port");
    holds_no_memory(&mut ns, "ictus name-server", &[("service port", raw)], &mut |i| {
        if i % 2 == 0 {
            assert_eq!(client.list().expect("list"), ["giant-test"]);
        } else {
            let missing = client.lookup("no-such-name");
            assert!(matches!(missing, Err(ictus_name_server::ClientError::NotFound(_))), "{missing:?}");
        }
    });
    logged_refusals(&ns, "ictus name-server");
    assert!(ns.terminate().success(), "a clean stop; log:\n{}", ns.log());
}

#[test]
fn the_clock_server_holds_no_memory_after_giant_messages() {
    let dir = TempDir::new("giant-clock");
    let socket = dir.join("ns.sock");
    let control = dir.join("clock-control.sock");
    let mut ns = ictus_name_server(ictus(), &socket);
    let mut clock = spawn_logged(
        "ictus clock-server",
        &[
            "clock-server".as_ref(),
            "--name-server".as_ref(),
            socket.as_os_str(),
            "--control-socket".as_ref(),
            control.as_os_str(),
        ],
        &dir.join("clock.log"),
    );
    let space = Space::new();
    let names = ictus_name_server::Client::connect_socket(&space, &socket).expect("connect").with_timeout(WATCHDOG);
    wait_until("the clock to be registered", || names.list().is_ok_and(|l| l.iter().any(|n| n == "clock")));
    let port = names.lookup("clock").expect("look the clock up");
    let raw_clock = space.send_right_fd(port).expect("a raw send right");
    ordinary_send_is_refused(&space, port, "the clock server");
    let clock_client = ictus_clock_server::Client::from_right(&space, port).with_timeout(WATCHDOG);
    let raw_control = ictus_name_server::socket::fetch_service_fd(&control, WATCHDOG).expect("the control port");
    let ctl = ictus_clock_server::Control::connect_socket(&space, &control).expect("control").with_timeout(WATCHDOG);
    holds_no_memory(
        &mut clock,
        "ictus clock-server",
        &[("clock port", raw_clock), ("control port", raw_control)],
        &mut |i| {
            if i % 2 == 0 {
                clock_client.read().expect("read the clock");
            } else {
                ctl.stats().expect("the clock's counters");
            }
        },
    );
    logged_refusals(&clock, "ictus clock-server");
    drop((clock_client, ctl));
    assert!(clock.terminate().success(), "a clean stop; log:\n{}", clock.log());
    assert!(ns.terminate().success());
}

#[test]
fn the_midi_server_holds_no_memory_after_giant_messages() {
    let dir = TempDir::new("giant-midi");
    let socket = dir.join("ns.sock");
    let name = unique("midi");
    let cable_name = unique("giant");
    let cable = format!("cable:{cable_name}");
    let mut ns = ictus_name_server(ictus(), &socket);
    let mut midi = spawn_logged(
        "ictus midi-server",
        &[
            "midi-server".as_ref(),
            "--timesharing".as_ref(),
            "--device".as_ref(),
            cable.as_ref(),
            "--name-server".as_ref(),
            socket.as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
        ],
        &dir.join("midi.log"),
    );
    let space = Space::new();
    let names = ictus_name_server::Client::connect_socket(&space, &socket).expect("connect").with_timeout(WATCHDOG);
    wait_until("the MIDI server to be registered", || names.list().is_ok_and(|l| l.contains(&name)));
    let port = names.lookup(&name).expect("look the MIDI server up");
    let raw = space.send_right_fd(port).expect("a raw send right");
    ordinary_send_is_refused(&space, port, "the MIDI server");
    let input = ictus_midi_server::Input::open(&space, port, true, false).expect("open an input handle");
    let giants = holds_no_memory(&mut midi, "ictus midi-server", &[("service port", raw)], &mut |i| {
        if i % 2 == 0 {
            input.server_stats().expect("the server's counters");
        } else {
            let device = input.device().expect("the device");
            assert!(device.contains(&cable_name), "{device}");
        }
    });
    // It counts refusals rather than logging them.
    assert_eq!(input.server_stats().expect("the server's counters").refused, giants, "every giant one refused");
    input.close().expect("close the handle");
    assert!(midi.terminate().success(), "a clean stop; log:\n{}", midi.log());
    assert!(ns.terminate().success());
}
