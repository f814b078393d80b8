//! The virtual MIDI cable: a named, one-way byte link between processes, always there.
//!
//! # Design
//!
//! A cable `NAME` has one receiving end ([`CableIn`], the MIDI IN), which listens on an
//! `AF_UNIX` `SOCK_SEQPACKET` socket bound to the **abstract** address
//! `\0ictus-midi-cable/UID/NAME` (`UID` its effective uid), and any number of sending
//! ends ([`CableOut`], a MIDI OUT each). A sending end connects, makes a **byte ring**
//! in a memfd (the `ring` module: [`BUFFER`] bytes, a counter and a wake-up flag each
//! way) and hands it over in its first message (`SCM_RIGHTS`). From then on the bytes go
//! through the ring, and the connection carries only wake-ups — one byte "bytes are
//! there" to a reader that said it sleeps, one byte "room is there" to a writer that
//! said it waits — and, by closing, the news that the other end is gone.
//!
//! - **It buffers what a device does.** The ring holds [`BUFFER`] bytes (8 KiB) of
//!   whatever was written, in any pieces: 2730 single notes written one by one fit, as
//!   they do in an ALSA raw MIDI device's 4 KiB buffer, and a write of up to
//!   [`MAX_WRITE`] bytes is taken whole or not at all, so a writer told *full* has left
//!   at least 4 KiB waiting. *Rejected:* datagrams (the cable before): a receiver's
//!   queue holds `net.unix.max_dgram_qlen` datagrams (10 by default), so 10 single
//!   notes filled it, and a 229-event chord written one event a datagram was smeared
//!   over 20 ms by the sender's retries. A `SOCK_SEQPACKET` or stream socket with a
//!   bigger send buffer: the kernel charges each message its buffer's true size (about
//!   768 bytes for a 3-byte note), and an unprivileged process may raise its buffer
//!   only to `net.core.wmem_max` (212 992 by default, doubled): 556 single notes, 1.6
//!   KiB. A pipe passed over the socket: exact in bytes, but it raises `SIGPIPE` in a
//!   host program whose receiver died, and it carries no kernel arrival stamp for the
//!   latency experiment.
//! - **Order kept, nothing split.** A write's bytes appear to the reader all at once
//!   (the ring's head moves after the last byte is in), so a message written whole is
//!   read whole, or — when the reader's buffer is smaller — continued by the next read
//!   from the same ring before any other sender's bytes. Writes longer than
//!   [`MAX_WRITE`] (a long sysex) are taken in pieces. Each sender has its own ring; the
//!   receiver merges them at write boundaries, so two senders' messages interleave whole
//!   (paced senders, which write a byte at a time, interleave bytes: a merge without a
//!   merge box; use one).
//! - **Full is real, and bounded.** When the ring has no room for a write, the write
//!   answers `WouldBlock` (the paper's "MPU-401 buffer full"); [`Device::wait_writable`]
//!   sleeps on the connection until the reader has taken bytes and rung. Memory is the
//!   ring and one connection per sender (at most [`MAX_SENDERS`]), whatever the reader
//!   does.
//! - **One wake-up per burst.** The reader sets its flag before it sleeps; the writer
//!   rings only when it finds the flag set, and clears it. A chord written in one write
//!   is one copy into the ring and one wake-up, however many notes it has.
//! - **Nothing stale, ever.** An abstract address is not a file: the kernel frees it
//!   when the receiver's socket closes, also on `kill -9`; memfds have no name and go
//!   with their last holder. (A path socket in `$XDG_RUNTIME_DIR/ictus/` was rejected:
//!   after `kill -9` it stays behind and needs the name server's lock-and-reclaim.)
//! - **Only our user.** Abstract addresses are visible to every process in the network
//!   namespace. The receiver reads each sender's kernel-verified credentials
//!   (`SO_PEERCRED`) and refuses a sender whose uid is neither its own nor root, counting
//!   the bytes it had written ([`CableIn::refused_bytes`]); a sender checks the
//!   listener's credentials the same way before it hands over a ring. The receiver never
//!   trusts a ring: the memfd must be sealed against resizing and of the right size
//!   before it is mapped, and counters that make no sense cut that sender off.
//! - **Unplugged is not an error.** Writing to a cable nobody receives loses the bytes,
//!   like a MIDI cable plugged into nothing: the write succeeds and the bytes are
//!   counted in [`Device::lost_bytes`], and so are bytes a receiver that went away had
//!   not read. Every write to an unplugged cable tries to connect again, so a receiver
//!   that appears (or comes back after a crash) gets what follows.
//!
//! # Pacing
//!
//! A real MIDI line carries 31250 bits a second, ten bits a byte (start, eight data,
//! stop): one byte every [`WIRE_BYTE_TIME`] (320 µs), a three-byte note in 960 µs. A
//! paced [`CableOut`] models the line at the sender: a byte written when the line is
//! idle starts at once and is delivered when its stop bit would have arrived, 320 µs
//! later; a byte written while the line is busy waits for it. The sender sleeps
//! (`clock_nanosleep`, absolute `CLOCK_MONOTONIC`) until each byte's delivery time and
//! writes it alone, so the receiver sees bytes arrive at the wire's pace and the
//! timestamps it takes are the wire's. A paced `write` therefore blocks for the wire's
//! time (at most [`PACED_WRITE_MAX`] bytes per call), as a polled UART does.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use ictus_rt::Time;
use rustix::event::{epoll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use super::ring::{self, Consumer, Producer, Protection, PushError, RingMem, SharedRing};
use super::{wait_fd, Device, OpenError};

/// The time one byte takes on a MIDI line: 10 bits at 31250 baud.
pub const WIRE_BYTE_TIME: Duration = Duration::from_micros(320);
/// Bytes a cable holds between a sender and a receiver that has not read them (per
/// sender).
pub const BUFFER: usize = ring::CAPACITY;
/// The most bytes one write puts on the cable; a write of at most this many is taken
/// whole or not at all, a longer one in pieces.
pub const MAX_WRITE: usize = BUFFER / 2;
/// The name this size had when the cable carried datagrams; a read buffer of this size
/// takes any write whole.
pub const MAX_DATAGRAM: usize = MAX_WRITE;
/// The most bytes one paced [`Device::write`] sends (about 82 ms of wire time), so a
/// caller gets control back between pieces of a long sysex.
pub const PACED_WRITE_MAX: usize = 256;
/// The most senders one receiver serves at once; more are refused (and counted).
pub const MAX_SENDERS: usize = 64;

/// Whether `name` is an acceptable cable name: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub fn check_name(name: &str) -> Result<(), OpenError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(OpenError::BadCableName(name.to_owned()))
    }
}

/// The abstract socket name of cable `name` owned by `uid` (a cable's receiving end is
/// always at its own effective uid's name).
pub fn address_name(name: &str, uid: u32) -> String {
    format!("ictus-midi-cable/{uid}/{name}")
}

fn address(name: &str, uid: u32) -> Result<SocketAddrUnix, OpenError> {
    check_name(name)?;
    SocketAddrUnix::new_abstract_name(address_name(name, uid).as_bytes())
        .map_err(|e| OpenError::os(format!("cable {name}"), "address", e))
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?)
}

/// Whether a peer running as `uid` may be plugged into a cable of ours.
fn allowed(uid: u32) -> bool {
    uid == euid() || uid == 0
}

/// A wake-up on a connection, without waiting: to a reader, the stream offset where the
/// write that rang ends (8 bytes, little-endian); to a writer, one byte. A full socket
/// already holds wake-ups enough; an error means the peer is gone, which the caller
/// learns from the result (`false`).
fn ring_bell(sock: BorrowedFd<'_>, what: &[u8]) -> bool {
    loop {
        match rustix::net::send(sock, what, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(_) | Err(Errno::AGAIN) => return true,
            Err(Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Whether the other end of a connection has hung up (`poll` with no wait).
fn hung_up(sock: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&sock, PollFlags::empty())];
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    match rustix::event::poll(&mut fds, Some(&zero)) {
        Ok(n) => n > 0 && fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR),
        Err(_) => false,
    }
}

/// The most write ends a receiver with arrival stamps keeps per sender (a sender that
/// rings without writing cannot make it hold more).
const MAX_ANNOUNCED: usize = 4096;

/// The epoll token of the listening socket.
const LISTENER: u64 = u64::MAX;
/// The epoll token of the receiver's own bell.
const BELL: u64 = u64::MAX - 1;

/// One sender, as its receiver sees it.
#[derive(Debug)]
struct Sender {
    sock: OwnedFd,
    uid: u32,
    /// Its ring, once its first message came.
    ring: Option<(SharedRing, Consumer)>,
    /// With arrival stamps: where each write announced so far ends, and its stamp.
    announced: VecDeque<(u64, Option<u64>)>,
    /// It closed its end; the ring is read to its end, then dropped.
    gone: bool,
}

/// The receiving end of a cable (a MIDI IN). Only one process may hold it at a time.
#[derive(Debug)]
pub struct CableIn {
    name: String,
    listener: OwnedFd,
    epoll: OwnedFd,
    /// An eventfd the receiver rings itself when a read left bytes in a ring, so that
    /// [`Device::fd`] stays readable while [`Device::read`] has bytes.
    bell: OwnedFd,
    senders: Vec<Option<Sender>>,
    /// A ring whose bytes a read left half taken: read on from it first.
    sticky: Option<usize>,
    next: usize,
    refused: u64,
    refused_senders: u64,
    stamps: bool,
    stamp: Option<u64>,
    /// The listener is out of the epoll set: accepting failed for want of descriptors
    /// or memory, and a listener left in the set would wake every wait at once.
    listener_paused: bool,
}

impl CableIn {
    /// Take the receiving end of cable `name`. Fails with [`OpenError::CableBusy`] if
    /// another socket holds it.
    pub fn open(name: &str) -> Result<CableIn, OpenError> {
        let os = |what, e: io::Error| OpenError::os(format!("cable {name}"), what, e);
        let addr = address(name, euid())?;
        let listener = seqpacket_socket().map_err(|e| os("socket", e))?;
        match rustix::net::bind(&listener, &addr) {
            Ok(()) => {}
            Err(Errno::ADDRINUSE) => return Err(OpenError::CableBusy(name.to_owned())),
            Err(e) => return Err(os("bind", e.into())),
        }
        rustix::net::listen(&listener, MAX_SENDERS as i32).map_err(|e| os("listen", e.into()))?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| os("epoll", e.into()))?;
        let bell =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
                .map_err(|e| os("eventfd", e.into()))?;
        for (fd, token) in [(listener.as_fd(), LISTENER), (bell.as_fd(), BELL)] {
            epoll::add(&epoll, fd, epoll::EventData::new_u64(token), epoll::EventFlags::IN)
                .map_err(|e| os("epoll_ctl", e.into()))?;
        }
        Ok(CableIn {
            name: name.to_owned(),
            listener,
            epoll,
            bell,
            senders: Vec::new(),
            sticky: None,
            next: 0,
            refused: 0,
            refused_senders: 0,
            stamps: false,
            stamp: None,
            listener_paused: false,
        })
    }

    /// The cable's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes dropped because they came from another user.
    pub fn refused_bytes(&self) -> u64 {
        self.refused
    }

    /// Senders refused: another user's, one too many ([`MAX_SENDERS`]), or one whose
    /// ring was not a sealed memory file of the right size or whose counters made no
    /// sense.
    pub fn refused_senders(&self) -> u64 {
        self.refused_senders
    }

    /// Senders plugged in now (with their ring received).
    pub fn senders(&self) -> usize {
        self.senders.iter().flatten().filter(|s| s.ring.is_some()).count()
    }

    /// Bytes received and not yet returned by [`Device::read`].
    pub fn pending(&self) -> usize {
        self.senders
            .iter()
            .flatten()
            .filter_map(|s| s.ring.as_ref())
            .map(|(ring, c)| c.available(ring).unwrap_or(0) as usize)
            .sum()
    }

    /// Have every writer ring at every write and the kernel stamp each wake-up
    /// (`SO_TIMESTAMPNS`), for [`CableIn::read_stamped`]. Applies to senders that connect
    /// from now on.
    pub fn with_arrival_stamps(mut self) -> CableIn {
        self.stamps = true;
        self
    }

    /// [`Device::read`] of the bytes of one write (or what of it fits in `buf`), with the
    /// kernel's stamp (`CLOCK_REALTIME` ns) of its wake-up: the time the writer's wake-up
    /// was queued to this receiver, right after the bytes were in the ring. Only after
    /// [`CableIn::with_arrival_stamps`], which asks every writer for a wake-up at every
    /// write (one `sendmsg` each, as the datagrams of the cable before); `None` for bytes
    /// whose wake-up had not come.
    pub fn read_stamped(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<(usize, Option<u64>)> {
        let n = self.read(buf, timeout)?;
        Ok((n, self.stamp.take()))
    }

    fn drop_sender(&mut self, i: usize, refused: bool) {
        if let Some(s) = self.senders.get_mut(i).and_then(Option::take) {
            let _ = epoll::delete(&self.epoll, &s.sock);
        }
        if refused {
            self.refused_senders += 1;
        }
        if self.sticky == Some(i) {
            self.sticky = None;
        }
    }

    /// Take the connections waiting on the listener.
    fn accept_all(&mut self) {
        loop {
            let sock = match rustix::net::accept_with(&self.listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) {
                Ok(s) => s,
                Err(Errno::INTR | Errno::CONNABORTED) => continue,
                Err(Errno::AGAIN) => return,
                Err(_) => {
                    // Out of descriptors or memory: the connection stays queued, and the
                    // listener stays readable. Take it out of the set until the next read,
                    // which tries again, rather than spin on it.
                    if epoll::delete(&self.epoll, &self.listener).is_ok() {
                        self.listener_paused = true;
                    }
                    return;
                }
            };
            if self.senders.iter().flatten().count() >= MAX_SENDERS {
                self.refused_senders += 1;
                continue;
            }
            let uid = rustix::net::sockopt::socket_peercred(&sock).map_or(u32::MAX, |c| c.uid.as_raw());
            let i = match self.senders.iter().position(Option::is_none) {
                Some(i) => i,
                None => {
                    self.senders.push(None);
                    self.senders.len() - 1
                }
            };
            if epoll::add(&self.epoll, &sock, epoll::EventData::new_u64(i as u64), epoll::EventFlags::IN).is_err() {
                self.refused_senders += 1;
                continue;
            }
            self.senders[i] = Some(Sender { sock, uid, ring: None, announced: VecDeque::new(), gone: false });
            self.serve(i);
        }
    }

    /// A sender's socket is readable: its ring (first message), wake-ups, or hang-up.
    fn serve(&mut self, i: usize) {
        let Some(s) = self.senders.get_mut(i).and_then(Option::as_mut) else { return };
        if s.gone {
            return;
        }
        if s.ring.is_none() {
            let mut fds: Vec<OwnedFd> = Vec::new();
            let mut head = [0u8; ring::SETUP.len() + 1];
            let mut iov = [IoSliceMut::new(&mut head)];
            let msg = match ictus_sys::socket::recvmsg(s.sock.as_fd(), &mut iov, &mut fds, RecvFlags::DONTWAIT) {
                Ok(m) => m,
                Err(Errno::AGAIN | Errno::INTR) => return,
                Err(_) => return self.drop_sender(i, false),
            };
            if msg.bytes == 0 && fds.is_empty() {
                // Gone before it said anything.
                return self.drop_sender(i, false);
            }
            let setup_ok = msg.bytes == ring::SETUP.len() && head[..msg.bytes] == ring::SETUP && fds.len() == 1;
            let ours = allowed(s.uid);
            let opened = match fds.first() {
                Some(fd) if setup_ok => {
                    SharedRing::open(fd, if ours { Protection::ReadWrite } else { Protection::Read }).ok()
                }
                _ => None,
            };
            let Some(shared) = opened else { return self.drop_sender(i, true) };
            if !ours {
                // Another user's: count what it wrote, read none of it.
                self.refused += shared.head().load(std::sync::atomic::Ordering::SeqCst).min(BUFFER as u64);
                return self.drop_sender(i, true);
            }
            if self.stamps {
                // Stamps from now on (not before the ring came: a stamp would take the
                // room its descriptor needs in the first message's control data), and a
                // wake-up for every write, which says where the write ends.
                let _ = super::stamp::enable(s.sock.as_fd());
                let consumer = Consumer::waking_at_every_write(&shared);
                s.ring = Some((shared, consumer));
            } else {
                s.ring = Some((shared, Consumer::new()));
            }
        }
        // Wake-ups: one read takes one (more stay readable for the next wait), or, with
        // stamps, all of them, each noted with where its write ends.
        let mut buf = [0u8; 64];
        loop {
            let got = if self.stamps {
                super::stamp::recv(s.sock.as_fd(), &mut buf)
            } else {
                rustix::net::recv(&s.sock, &mut buf, RecvFlags::DONTWAIT)
                    .map(|(n, _)| (n, None))
                    .map_err(io::Error::from)
            };
            match got {
                Ok((0, _)) => {
                    // Hung up: read its ring to the end, then drop it.
                    s.gone = true;
                    let _ = epoll::delete(&self.epoll, &s.sock);
                    return;
                }
                Ok((n, stamp)) if self.stamps => {
                    if let Ok(end) = <[u8; 8]>::try_from(&buf[..n.min(64)]) {
                        if s.announced.len() >= MAX_ANNOUNCED {
                            s.announced.pop_front();
                        }
                        s.announced.push_back((u64::from_le_bytes(end), stamp));
                    }
                }
                Ok(_) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    s.gone = true;
                    let _ = epoll::delete(&self.epoll, &s.sock);
                    return;
                }
            }
        }
    }

    /// With arrival stamps: the bytes of one write (or what of it fits in `buf`), and its
    /// stamp in `self.stamp`. Bytes whose wake-up has not come (written before stamps
    /// were asked for, or read in the microseconds between the write and its wake-up)
    /// are returned without a stamp.
    fn take_one_write(&mut self, buf: &mut [u8]) -> usize {
        let count = self.senders.len();
        let start = self.sticky.take().unwrap_or(self.next % count.max(1));
        for k in 0..count {
            let i = (start + k) % count;
            let Some(s) = self.senders[i].as_mut() else { continue };
            let Some((shared, consumer)) = s.ring.as_mut() else { continue };
            while s.announced.front().is_some_and(|&(end, _)| end <= consumer.tail()) {
                s.announced.pop_front();
            }
            let (end, stamp) = s.announced.front().copied().unwrap_or((u64::MAX, None));
            match consumer.pop_until(shared, buf, end) {
                Ok((got, wake)) => {
                    if wake && !ring_bell(s.sock.as_fd(), &[1]) {
                        s.gone = true;
                    }
                    let left = consumer.available(shared).unwrap_or(0);
                    if got == 0 {
                        if s.gone && left == 0 {
                            self.drop_sender(i, false);
                        }
                        continue;
                    }
                    if left > 0 && consumer.tail() < end {
                        self.sticky = Some(i);
                    }
                    self.next = i + 1;
                    self.stamp = stamp;
                    return got;
                }
                Err(_) => self.drop_sender(i, true),
            }
        }
        0
    }

    /// Bytes from the rings into `buf`: first the ring a read left half taken, then the
    /// others in turn, each taken to its end (a write boundary) while `buf` has room.
    fn take(&mut self, buf: &mut [u8]) -> usize {
        let count = self.senders.len();
        if count == 0 {
            return 0;
        }
        let start = self.sticky.take().unwrap_or(self.next % count);
        let mut n = 0;
        for k in 0..count {
            let i = (start + k) % count;
            let Some(s) = self.senders[i].as_mut() else { continue };
            let Some((shared, consumer)) = s.ring.as_mut() else { continue };
            match consumer.pop(shared, &mut buf[n..]) {
                Ok((got, wake)) => {
                    n += got;
                    if wake && !ring_bell(s.sock.as_fd(), &[1]) {
                        s.gone = true;
                    }
                    let left = consumer.available(shared).unwrap_or(0);
                    if s.gone && left == 0 {
                        self.drop_sender(i, false);
                    } else if left > 0 {
                        // `buf` is full in the middle of this ring's bytes.
                        self.sticky = Some(i);
                        self.next = i;
                        return n;
                    }
                }
                Err(_) => self.drop_sender(i, true),
            }
            if n == buf.len() {
                self.next = i + 1;
                return n;
            }
        }
        self.next = start + 1;
        n
    }

    /// Arm every ring (each writer will ring on its next write); whether one has bytes
    /// already.
    fn arm_all(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.senders.len() {
            let Some(s) = self.senders[i].as_ref() else { continue };
            let Some((shared, consumer)) = s.ring.as_ref() else { continue };
            match consumer.arm(shared) {
                Ok(has) => any |= has,
                Err(_) => self.drop_sender(i, true),
            }
        }
        any
    }

    /// Wait for the listener, the bell or a sender, at most `timeout`, and serve what
    /// is ready. Returns how many were ready (0: the time ran out).
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<usize> {
        let ts = timeout.map(|l| rustix::time::Timespec {
            tv_sec: l.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(l.subsec_nanos()),
        });
        let mut events = [epoll::Event { flags: epoll::EventFlags::empty(), data: epoll::EventData::new_u64(0) }; 16];
        let n = loop {
            match epoll::wait(&self.epoll, &mut events, ts.as_ref()) {
                Ok(n) => break n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        for ev in &events[..n] {
            match ev.data.u64() {
                LISTENER => self.accept_all(),
                BELL => {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&self.bell, &mut b);
                }
                i => self.serve(i as usize),
            }
        }
        Ok(n)
    }
}

impl Device for CableIn {
    fn describe(&self) -> String {
        format!("cable {} (in)", self.name)
    }

    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = timeout.map(|t| ictus_rt::clock::now() + t);
        if self.listener_paused {
            let token = epoll::EventData::new_u64(LISTENER);
            self.listener_paused = epoll::add(&self.epoll, &self.listener, token, epoll::EventFlags::IN).is_err();
        }
        if self.stamps {
            // Take the wake-ups already there, which say where their writes end.
            self.wait(Some(Duration::ZERO))?;
        }
        loop {
            let n = if self.stamps { self.take_one_write(buf) } else { self.take(buf) };
            if n > 0 {
                // Leave every ring armed, or the bell rung if one still has bytes, so that
                // the descriptor is readable exactly when a read would find bytes.
                if self.arm_all() {
                    let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
                }
                return Ok(n);
            }
            if self.arm_all() {
                continue;
            }
            let left = deadline.map(|d| d.saturating_duration_since(ictus_rt::clock::now()));
            if self.wait(left)? == 0 {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no MIDI input within the timeout"));
            }
        }
    }

    fn write(&mut self, _bytes: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "the receiving end of a cable cannot send"))
    }

    fn wait_writable(&mut self, _timeout: Option<Duration>) -> io::Result<bool> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "the receiving end of a cable cannot send"))
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}

/// A sending end's connection to a receiver.
#[derive(Debug)]
struct Link {
    sock: OwnedFd,
    ring: SharedRing,
    producer: Producer,
}

/// The sending end of a cable (a MIDI OUT), optionally paced at the wire's speed.
#[derive(Debug)]
pub struct CableOut {
    name: String,
    addr: SocketAddrUnix,
    /// The uid the receiver must run as (or root).
    owner: u32,
    link: Option<Link>,
    /// A socket for [`Device::fd`] while unplugged.
    idle: OwnedFd,
    /// The receiver's listener had no room for another connection at the last try.
    busy: bool,
    pacing: Option<Duration>,
    /// When the paced line is next free.
    line_free: Time,
    lost: u64,
    /// Bytes the last write refused as *full* needed.
    want: usize,
}

/// The outcome of trying to plug in.
enum Plug {
    In,
    Unplugged,
    Busy,
}

impl CableOut {
    /// The sending end of cable `name`; `pacing` is the time a byte takes on the line
    /// (`Some(WIRE_BYTE_TIME)` for a real MIDI line's pace), `None` for no pacing. It
    /// need not have a receiver yet.
    pub fn open(name: &str, pacing: Option<Duration>) -> Result<CableOut, OpenError> {
        CableOut::open_owned_by(name, euid(), pacing)
    }

    /// The sending end of another user's cable `name` (whose receiver runs as `uid`).
    /// Its receiver accepts the bytes only if we are root or that user; otherwise they
    /// are dropped there and counted in [`CableIn::refused_bytes`].
    pub fn open_owned_by(name: &str, uid: u32, pacing: Option<Duration>) -> Result<CableOut, OpenError> {
        let addr = address(name, uid)?;
        let idle = seqpacket_socket().map_err(|e| OpenError::os(format!("cable {name}"), "socket", e))?;
        let mut out = CableOut {
            name: name.to_owned(),
            addr,
            owner: uid,
            link: None,
            idle,
            busy: false,
            pacing,
            line_free: Time::ZERO,
            lost: 0,
            want: 0,
        };
        let _ = out.plug();
        Ok(out)
    }

    /// The cable's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a receiver held the cable at the last attempt to write.
    pub fn is_plugged(&self) -> bool {
        self.link.is_some()
    }

    /// The pacing, if any.
    pub fn pacing(&self) -> Option<Duration> {
        self.pacing
    }

    /// Connect and hand over a fresh ring, unless connected already.
    fn plug(&mut self) -> io::Result<Plug> {
        if self.link.is_some() {
            return Ok(Plug::In);
        }
        self.busy = false;
        let sock = seqpacket_socket()?;
        match rustix::net::connect(&sock, &self.addr) {
            Ok(()) => {}
            Err(Errno::AGAIN) => {
                self.busy = true;
                return Ok(Plug::Busy);
            }
            Err(_) => return Ok(Plug::Unplugged),
        }
        // The listener's credentials, as the kernel recorded them: not another user's
        // receiver squatting on the name.
        let uid = rustix::net::sockopt::socket_peercred(&sock).map_or(u32::MAX, |c| c.uid.as_raw());
        if uid != self.owner && uid != 0 {
            return Ok(Plug::Unplugged);
        }
        let (fd, shared) = SharedRing::create()?;
        let sent = ictus_sys::socket::sendmsg(
            sock.as_fd(),
            &[IoSlice::new(&ring::SETUP)],
            &[fd.as_fd()],
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        );
        if sent.is_err() {
            return Ok(Plug::Unplugged);
        }
        self.link = Some(Link { sock, ring: shared, producer: Producer::new() });
        Ok(Plug::In)
    }

    /// The receiver is gone: what it had not read is lost.
    fn unplug(&mut self) {
        if let Some(link) = self.link.take() {
            self.lost += link.producer.unread(&link.ring).unwrap_or(0);
        }
    }

    /// Put `bytes` (at most [`MAX_WRITE`]) on the cable, whole.
    fn put(&mut self, bytes: &[u8]) -> io::Result<usize> {
        // A receiver gone since the last write: count what it had not read, and plug
        // into its successor, if there is one, before this write.
        if self.link.as_ref().is_some_and(|l| hung_up(l.sock.as_fd())) {
            self.unplug();
        }
        match self.plug()? {
            Plug::In => {}
            Plug::Unplugged => {
                self.lost += bytes.len() as u64;
                return Ok(bytes.len());
            }
            Plug::Busy => return Err(io::ErrorKind::WouldBlock.into()),
        }
        let Some(link) = self.link.as_mut() else { return Err(io::ErrorKind::NotConnected.into()) };
        match link.producer.push(&link.ring, bytes) {
            Ok(wake) => {
                self.want = 0;
                // A reader that sleeps is woken. One found gone meanwhile will never read
                // these bytes: they count as lost.
                if wake.is_some_and(|end| !ring_bell(link.sock.as_fd(), &end.to_le_bytes())) {
                    self.unplug();
                }
                Ok(bytes.len())
            }
            Err(PushError::Full) => {
                if hung_up(link.sock.as_fd()) {
                    self.unplug();
                    self.lost += bytes.len() as u64;
                    return Ok(bytes.len());
                }
                self.want = bytes.len();
                Err(io::ErrorKind::WouldBlock.into())
            }
            Err(PushError::Corrupt(_)) => {
                // A receiver that scribbles on the ring is no receiver.
                self.unplug();
                self.lost += bytes.len() as u64;
                Ok(bytes.len())
            }
        }
    }
}

impl Device for CableOut {
    fn describe(&self) -> String {
        match self.pacing {
            Some(p) => format!("cable {} (out, paced {} µs/byte)", self.name, p.as_micros()),
            None => format!("cable {} (out)", self.name),
        }
    }

    fn read(&mut self, _buf: &mut [u8], _timeout: Option<Duration>) -> io::Result<usize> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "the sending end of a cable cannot receive"))
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if bytes.is_empty() {
            return Ok(0);
        }
        let Some(byte_time) = self.pacing else {
            return self.put(&bytes[..bytes.len().min(MAX_WRITE)]);
        };
        let mut sent = 0;
        for &b in bytes.iter().take(PACED_WRITE_MAX) {
            let now = ictus_rt::clock::now();
            let deliver = now.max(self.line_free) + byte_time;
            super::sleep_until(deliver);
            match self.put(&[b]) {
                Ok(_) => {
                    self.line_free = deliver;
                    sent += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && sent > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    /// Until the receiver has taken enough for the last refused write (it rings when it
    /// takes bytes from a ring whose writer waits), or has gone (then a write succeeds,
    /// lost). Unplugged: at once, since a write then succeeds; a listener with no room
    /// for another connection gives no wake-up, so then this sleeps a millisecond.
    fn wait_writable(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        let deadline = timeout.map(|t| ictus_rt::clock::now() + t);
        loop {
            let Some(link) = self.link.as_ref() else {
                if self.busy {
                    std::thread::sleep(timeout.unwrap_or(Duration::MAX).min(Duration::from_millis(1)));
                }
                return Ok(true);
            };
            match link.producer.room_or_ask(&link.ring, self.want.max(1)) {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(_) => {
                    self.unplug();
                    return Ok(true);
                }
            }
            let left = deadline.map(|d| d.saturating_duration_since(ictus_rt::clock::now()));
            if !wait_fd(link.sock.as_fd(), PollFlags::IN, left)? {
                return Ok(false);
            }
            // Take the wake-ups; a hang-up ends the link.
            let mut b = [0u8; 64];
            loop {
                match rustix::net::recv(&link.sock, &mut b, RecvFlags::DONTWAIT) {
                    Ok((0, _)) => {
                        self.unplug();
                        return Ok(true);
                    }
                    Ok(_) | Err(Errno::INTR) => continue,
                    Err(Errno::AGAIN) => break,
                    Err(_) => {
                        self.unplug();
                        return Ok(true);
                    }
                }
            }
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.link.as_ref().map_or(self.idle.as_fd(), |l| l.sock.as_fd())
    }

    /// Bytes written while no receiver held the cable, or that a receiver which went
    /// away had not read (lost, as on a cable plugged into nothing).
    fn lost_bytes(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WATCHDOG: Option<Duration> = Some(Duration::from_secs(30));

    fn unique(tag: &str) -> String {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        format!("unit-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
    }

    /// Read until `n` bytes have come, with reads of `chunk` bytes.
    fn read_n(rx: &mut CableIn, n: usize, chunk: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; chunk];
        while got.len() < n {
            let k = rx.read(&mut buf, WATCHDOG).unwrap();
            got.extend_from_slice(&buf[..k]);
        }
        got
    }

    fn readable(fd: BorrowedFd<'_>) -> bool {
        wait_fd(fd, PollFlags::IN, Some(Duration::ZERO)).unwrap()
    }

    #[test]
    fn names() {
        assert!(check_name("a").is_ok());
        assert!(check_name(&"x".repeat(64)).is_ok());
        assert!(check_name(&"x".repeat(65)).is_err());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name("a/b").is_err());
    }

    #[test]
    fn bytes_go_through_in_order() {
        let name = unique("order");
        let mut rx = CableIn::open(&name).unwrap();
        let mut tx = CableOut::open(&name, None).unwrap();
        assert!(tx.is_plugged());
        assert_eq!(tx.write(&[0x90, 60, 100]).unwrap(), 3);
        assert_eq!(tx.write(&[0x80, 60, 0]).unwrap(), 3);
        // A small buffer: bytes kept back are returned by the next read.
        assert_eq!(read_n(&mut rx, 6, 2), [0x90, 60, 100, 0x80, 60, 0]);
        assert_eq!(rx.pending(), 0);
        let mut buf = [0u8; 2];
        let e = rx.read(&mut buf, Some(Duration::ZERO)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn a_chord_written_at_once_is_read_at_once() {
        let name = unique("chord");
        let mut rx = CableIn::open(&name).unwrap();
        let mut tx = CableOut::open(&name, None).unwrap();
        let chord: Vec<u8> = (0..256u32).flat_map(|i| [0x90 | (i % 16) as u8, (i % 128) as u8, 100]).collect();
        assert_eq!(tx.write(&chord).unwrap(), chord.len());
        let mut buf = vec![0u8; MAX_WRITE];
        let n = rx.read(&mut buf, WATCHDOG).unwrap();
        assert_eq!(&buf[..n], &chord[..], "the whole chord in one read");
    }

    #[test]
    fn the_descriptor_is_readable_whenever_a_read_has_bytes() {
        let name = unique("poll");
        let mut rx = CableIn::open(&name).unwrap();
        assert!(!readable(rx.fd()));
        let mut tx = CableOut::open(&name, None).unwrap();
        // A new sender makes it readable (a read serves its connection, finds no bytes).
        assert!(readable(rx.fd()));
        let mut buf = [0u8; 4];
        assert_eq!(rx.read(&mut buf, Some(Duration::ZERO)).unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(!readable(rx.fd()));
        tx.write(&[0x90, 60, 100, 0x80, 60, 0]).unwrap();
        assert!(wait_fd(rx.fd(), PollFlags::IN, WATCHDOG).unwrap());
        assert_eq!(rx.read(&mut buf, Some(Duration::ZERO)).unwrap(), 4);
        // Two bytes left behind: still readable.
        assert!(readable(rx.fd()));
        assert_eq!(rx.read(&mut buf, Some(Duration::ZERO)).unwrap(), 2);
        let _ = rx.read(&mut buf, Some(Duration::ZERO));
        assert!(!readable(rx.fd()));
        // The reader armed its ring on the way out: the next write wakes a poller.
        tx.write(&[0xF8]).unwrap();
        assert!(wait_fd(rx.fd(), PollFlags::IN, WATCHDOG).unwrap());
        assert_eq!(rx.read(&mut buf, Some(Duration::ZERO)).unwrap(), 1);
    }

    #[test]
    fn one_receiver_per_name_and_the_name_is_free_again_after_close() {
        let name = unique("busy");
        let rx = CableIn::open(&name).unwrap();
        assert!(matches!(CableIn::open(&name), Err(OpenError::CableBusy(_))));
        drop(rx);
        CableIn::open(&name).unwrap();
    }

    #[test]
    fn unplugged_bytes_are_lost_then_a_receiver_gets_what_follows() {
        let name = unique("unplugged");
        let mut tx = CableOut::open(&name, None).unwrap();
        assert!(!tx.is_plugged());
        assert_eq!(tx.write(&[0xF8, 0xF8]).unwrap(), 2);
        assert_eq!(tx.lost_bytes(), 2);
        let mut rx = CableIn::open(&name).unwrap();
        assert_eq!(tx.write(&[0xFA]).unwrap(), 1);
        assert!(tx.is_plugged());
        let mut buf = [0u8; MAX_DATAGRAM];
        assert_eq!(rx.read(&mut buf, WATCHDOG).unwrap(), 1);
        assert_eq!(buf[0], 0xFA);
        // The receiver goes away and comes back: the sender reconnects.
        drop(rx);
        assert_eq!(tx.write(&[0xFB]).unwrap(), 1);
        assert_eq!(tx.lost_bytes(), 3);
        let mut rx = CableIn::open(&name).unwrap();
        tx.write(&[0xFC]).unwrap();
        assert_eq!(rx.read(&mut buf, WATCHDOG).unwrap(), 1);
        assert_eq!(buf[0], 0xFC);
    }

    #[test]
    fn bytes_a_vanished_receiver_never_read_are_counted_lost() {
        let name = unique("vanish");
        let rx = CableIn::open(&name).unwrap();
        let mut tx = CableOut::open(&name, None).unwrap();
        // The receiver never reads (nor arms its ring): the writes go into the ring.
        for _ in 0..10 {
            tx.write(&[0x90, 60, 100]).unwrap();
        }
        assert_eq!(tx.lost_bytes(), 0);
        drop(rx);
        tx.write(&[0xF8]).unwrap();
        assert_eq!(tx.lost_bytes(), 31, "the 30 unread bytes and the one after");
        assert!(!tx.is_plugged());
    }

    /// A reader that does not read: a full cable holds at least 4 KiB of single notes
    /// written one by one (a raw MIDI device's buffer), the writer is told `WouldBlock`,
    /// loses nothing, and everything it was told went arrives, in order.
    #[test]
    fn a_receiver_that_does_not_read_fills_up_after_4_kib_and_loses_nothing() {
        let name = unique("full");
        let mut rx = CableIn::open(&name).unwrap();
        let mut tx = CableOut::open(&name, None).unwrap();
        let mut sent = Vec::new();
        let mut full = false;
        for i in 0..100_000u32 {
            let note = [0x90 | (i % 16) as u8, (i % 128) as u8, (i / 128 % 127 + 1) as u8];
            match tx.write(&note) {
                Ok(3) => sent.extend_from_slice(&note),
                Ok(n) => panic!("a note was split: {n} bytes"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    full = true;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(full, "the cable never reported full");
        assert!(sent.len() >= 4096, "only {} bytes fitted", sent.len());
        assert!(sent.len() <= BUFFER, "{} bytes fitted in a buffer of {BUFFER}", sent.len());
        assert_eq!(tx.lost_bytes(), 0);
        assert!(!tx.wait_writable(Some(Duration::ZERO)).unwrap(), "nothing was read");
        assert_eq!(read_n(&mut rx, sent.len(), 1000), sent);
        // The reads freed room and rang the waiting writer.
        assert!(tx.wait_writable(WATCHDOG).unwrap());
        tx.write(&[0xFE]).unwrap();
        assert_eq!(read_n(&mut rx, 1, 16), [0xFE]);
    }

    #[test]
    fn two_senders_interleave_whole_writes() {
        let name = unique("merge");
        let mut rx = CableIn::open(&name).unwrap();
        let mut a = CableOut::open(&name, None).unwrap();
        let mut b = CableOut::open(&name, None).unwrap();
        let n = 500;
        for i in 0..n {
            a.write(&[0x90, (i % 128) as u8, 1]).unwrap();
            b.write(&[0x91, (i % 128) as u8, 2]).unwrap();
        }
        // Small reads, so that a ring is often left half read.
        let got = read_n(&mut rx, 6 * n, 5);
        let mut next = [0usize; 2];
        for m in got.chunks(3) {
            let who = usize::from(m[0] & 1);
            assert_eq!(m, [0x90 | who as u8, (next[who] % 128) as u8, 1 + who as u8], "{m:?}");
            next[who] += 1;
        }
        assert_eq!(next, [n, n]);
    }

    #[test]
    fn a_bad_sender_is_refused_and_the_cable_goes_on() {
        let name = unique("bad");
        let mut rx = CableIn::open(&name).unwrap();
        let addr = address(&name, euid()).unwrap();
        let raw = |payload: &[u8], fd: Option<BorrowedFd<'_>>| {
            let s = seqpacket_socket().unwrap();
            rustix::net::connect(&s, &addr).unwrap();
            let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
            ictus_sys::socket::sendmsg(s.as_fd(), &[IoSlice::new(payload)], &fds, SendFlags::NOSIGNAL).unwrap();
            s
        };
        let small = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&small, 4096).unwrap();
        let unsealed = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::empty()).unwrap();
        rustix::fs::ftruncate(&unsealed, ring::FILE_LEN as u64).unwrap();
        let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
        let _keep = [
            raw(b"hello", None),
            raw(&ring::SETUP, None),
            raw(&ring::SETUP, Some(small.as_fd())),
            raw(&ring::SETUP, Some(unsealed.as_fd())),
            raw(&ring::SETUP, Some(pipe_r.as_fd())),
        ];
        let mut tx = CableOut::open(&name, None).unwrap();
        tx.write(&[0xF8]).unwrap();
        assert_eq!(read_n(&mut rx, 1, 16), [0xF8]);
        let deadline = ictus_rt::clock::now() + Duration::from_secs(30);
        while rx.refused_senders() < 5 {
            assert!(ictus_rt::clock::now() < deadline, "refused only {}", rx.refused_senders());
            let _ = rx.read(&mut [0u8; 16], Some(Duration::from_millis(10)));
        }
        assert_eq!(rx.senders(), 1);
    }

    #[test]
    fn a_scribbling_receiver_unplugs_its_sender() {
        let name = unique("scribble");
        let mut rx = CableIn::open(&name).unwrap();
        let mut tx = CableOut::open(&name, None).unwrap();
        tx.write(&[1]).unwrap();
        assert_eq!(read_n(&mut rx, 1, 16), [1]);
        // The reader's counter made impossible, as a hostile receiver could.
        let s = rx.senders.iter().flatten().next().unwrap();
        let (shared, _) = s.ring.as_ref().unwrap();
        shared.tail().store(u64::MAX / 2, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(tx.write(&[2]).unwrap(), 1);
        assert!(!tx.is_plugged());
        assert_eq!(tx.lost_bytes(), 1);
    }

    /// With arrival stamps, a read returns one write and the kernel's stamp of it, as
    /// datagrams did, even when several writes wait.
    #[test]
    fn with_arrival_stamps_each_read_is_one_stamped_write() {
        let name = unique("stamps");
        let mut rx = CableIn::open(&name).unwrap().with_arrival_stamps();
        let mut tx = CableOut::open(&name, None).unwrap();
        let mut buf = [0u8; 64];
        assert!(rx.read_stamped(&mut buf, Some(Duration::ZERO)).is_err());
        let before = ictus_rt::clock::wall().as_nanos();
        tx.write(&[0x90, 1, 1]).unwrap();
        tx.write(&[0x90, 2, 1, 0x90, 3, 1]).unwrap();
        let (n, first) = rx.read_stamped(&mut buf, WATCHDOG).unwrap();
        assert_eq!(&buf[..n], &[0x90, 1, 1]);
        let (n, second) = rx.read_stamped(&mut buf, WATCHDOG).unwrap();
        assert_eq!(&buf[..n], &[0x90, 2, 1, 0x90, 3, 1]);
        let (first, second) = (first.expect("a stamp"), second.expect("a stamp"));
        assert!(before <= first && first <= second && second <= ictus_rt::clock::wall().as_nanos());
        // A buffer smaller than a write: the rest follows, with the same stamp.
        tx.write(&[0x90, 4, 1, 0x90, 5, 1]).unwrap();
        let mut small = [0u8; 4];
        let (n, a) = rx.read_stamped(&mut small, WATCHDOG).unwrap();
        assert_eq!(&small[..n], &[0x90, 4, 1, 0x90]);
        let (n, b) = rx.read_stamped(&mut small, WATCHDOG).unwrap();
        assert_eq!(&small[..n], &[5, 1]);
        assert!(a.is_some() && a == b);
    }

    #[test]
    fn paced_bytes_are_not_delivered_before_their_wire_time() {
        let name = unique("paced");
        let mut rx = CableIn::open(&name).unwrap();
        let mut tx = CableOut::open(&name, Some(WIRE_BYTE_TIME)).unwrap();
        let t0 = ictus_rt::clock::now();
        let mut sent = 0;
        while sent < 6 {
            sent += tx.write(&[0x90, 60, 100, 0x80, 60, 0][sent..]).unwrap();
        }
        let mut arrivals = Vec::new();
        let mut buf = [0u8; MAX_DATAGRAM];
        let mut got = 0;
        while got < 6 {
            got += rx.read(&mut buf, WATCHDOG).unwrap();
            arrivals.push(ictus_rt::clock::now());
        }
        // Each byte i was sent no earlier than t0 + (i+1)·320 µs (a lower bound that the
        // absolute sleeps guarantee; nothing here bounds lateness).
        let last = *arrivals.last().unwrap();
        assert!(last >= t0 + WIRE_BYTE_TIME * 6, "{last} < {t0} + 6 bytes of wire time");
    }
}
