//! The virtual MIDI cable: a named, one-way byte link between processes, always there.
//!
//! # Design
//!
//! A cable `NAME` is an `AF_UNIX` `SOCK_DGRAM` socket bound by its receiving end
//! ([`CableIn`], the MIDI IN) to the **abstract** address
//! `\0ictus-midi-cable/UID/NAME` (`UID` the effective uid). The sending end
//! ([`CableOut`], the MIDI OUT) connects to it and sends each `write` as one datagram.
//!
//! - **Nothing stale, ever.** An abstract address is not a file: the kernel frees it
//!   when the receiver's socket closes, also on `kill -9`, so a new receiver can take
//!   the name at once; there is no lock file and no reclaim logic. (A path socket in
//!   `$XDG_RUNTIME_DIR/ictus/` was rejected for that reason: after `kill -9` it stays
//!   behind and needs the name server's lock-and-reclaim dance.)
//! - **Only our user.** Abstract addresses are visible to every process in the network
//!   namespace, so the receiver turns on `SO_PASSCRED` and drops (and counts, see
//!   [`CableIn::refused_bytes`]) every datagram whose sender's uid is neither its own
//!   nor root: the kernel fills in the credentials, the sender cannot forge them.
//!   (Another user could bind a name first and receive what we send; that is no worse
//!   than plugging a cable into the wrong synthesizer, and names carry the uid.)
//! - **Ordered and reliable.** Unix datagrams are neither lost nor reordered. Each
//!   datagram is at most [`MAX_DATAGRAM`] bytes; a longer write is sent in pieces.
//! - **Full is real.** The receiver's queue holds `net.unix.max_dgram_qlen` datagrams
//!   (10 by default); when it is full a send fails with `EAGAIN`, and
//!   [`Device::write`] answers `WouldBlock` — the "device full" that the output library
//!   retries, as the paper's byte sender did when the MPU-401's buffer was full.
//! - **Unplugged is not an error.** Writing to a cable nobody receives loses the bytes,
//!   like a MIDI cable plugged into nothing: the write succeeds and the bytes are
//!   counted in [`Device::lost_bytes`]. Every write tries to connect again, so a
//!   receiver that appears (or comes back after a crash) gets what follows.
//! - **One sender per cable.** Two senders' datagrams interleave whole, so unpaced
//!   messages stay intact, but paced senders interleave bytes: like a MIDI merge without
//!   a merge box. Use one.
//!
//! # Pacing
//!
//! A real MIDI line carries 31250 bits a second, ten bits a byte (start, eight data,
//! stop): one byte every [`WIRE_BYTE_TIME`] (320 µs), a three-byte note in 960 µs. A
//! paced [`CableOut`] models the line at the sender: a byte written when the line is
//! idle starts at once and is delivered when its stop bit would have arrived, 320 µs
//! later; a byte written while the line is busy waits for it. The sender sleeps
//! (`clock_nanosleep`, absolute `CLOCK_MONOTONIC`) until each byte's delivery time and
//! sends it alone, so the receiver sees bytes arrive at the wire's pace and the
//! timestamps it takes are the wire's. A paced `write` therefore blocks for the wire's
//! time (at most [`PACED_WRITE_MAX`] bytes per call), as a polled UART does.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use ictus_rt::Time;
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use super::{wait_fd, Device, OpenError};

/// The time one byte takes on a MIDI line: 10 bits at 31250 baud.
pub const WIRE_BYTE_TIME: Duration = Duration::from_micros(320);
/// The largest datagram a cable carries; a receiver reading into a buffer at least this
/// large never keeps bytes back (see [`CableIn::pending`]).
pub const MAX_DATAGRAM: usize = 4096;
/// The most bytes one paced [`Device::write`] sends (about 82 ms of wire time), so a
/// caller gets control back between pieces of a long sysex.
pub const PACED_WRITE_MAX: usize = 256;

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

fn datagram_socket(name: &str) -> Result<OwnedFd, OpenError> {
    rustix::net::socket_with(AddressFamily::UNIX, SocketType::DGRAM, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None)
        .map_err(|e| OpenError::os(format!("cable {name}"), "socket", e))
}

/// The receiving end of a cable (a MIDI IN). Only one process may hold it at a time.
#[derive(Debug)]
pub struct CableIn {
    name: String,
    sock: OwnedFd,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    refused: u64,
}

impl CableIn {
    /// Take the receiving end of cable `name`. Fails with [`OpenError::CableBusy`] if
    /// another socket holds it.
    pub fn open(name: &str) -> Result<CableIn, OpenError> {
        let addr = address(name, euid())?;
        let sock = datagram_socket(name)?;
        rustix::net::sockopt::set_socket_passcred(&sock, true)
            .map_err(|e| OpenError::os(format!("cable {name}"), "SO_PASSCRED", e))?;
        match rustix::net::bind(&sock, &addr) {
            Ok(()) => {}
            Err(Errno::ADDRINUSE) => return Err(OpenError::CableBusy(name.to_owned())),
            Err(e) => return Err(OpenError::os(format!("cable {name}"), "bind", e)),
        }
        Ok(CableIn {
            name: name.to_owned(),
            sock,
            buf: vec![0u8; MAX_DATAGRAM].into_boxed_slice(),
            start: 0,
            end: 0,
            refused: 0,
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

    /// Bytes received but not yet returned by [`Device::read`] (only when reading into
    /// buffers smaller than [`MAX_DATAGRAM`]). While non-zero, the descriptor may not be
    /// readable although `read` has bytes.
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    /// One datagram from an allowed sender into `into`, without waiting. `Ok(None)`:
    /// nothing queued. Descriptors a sender attached are closed: a cable carries bytes.
    fn recv_one(sock: BorrowedFd<'_>, into: &mut [u8], refused: &mut u64) -> io::Result<Option<usize>> {
        let ours = euid();
        loop {
            let mut fds = Vec::new();
            let mut iov = [IoSliceMut::new(&mut *into)];
            let msg = match ictus_sys::socket::recvmsg(sock, &mut iov, &mut fds, RecvFlags::DONTWAIT) {
                Ok(m) => m,
                Err(Errno::AGAIN) => return Ok(None),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            drop(fds);
            match msg.creds.map(|c| c.uid) {
                Some(u) if u == ours || u == 0 => {
                    if msg.bytes > 0 {
                        return Ok(Some(msg.bytes));
                    }
                }
                _ => *refused += msg.bytes as u64,
            }
        }
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
        loop {
            if self.start < self.end {
                let n = (self.end - self.start).min(buf.len());
                buf[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
                self.start += n;
                return Ok(n);
            }
            if buf.len() >= MAX_DATAGRAM {
                if let Some(n) = CableIn::recv_one(self.sock.as_fd(), buf, &mut self.refused)? {
                    return Ok(n);
                }
            } else if let Some(n) = CableIn::recv_one(self.sock.as_fd(), &mut self.buf, &mut self.refused)? {
                self.start = 0;
                self.end = n;
                continue;
            }
            let left = deadline.map(|d| d.saturating_duration_since(ictus_rt::clock::now()));
            if left == Some(Duration::ZERO) || !wait_fd(self.sock.as_fd(), rustix::event::PollFlags::IN, left)? {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no MIDI input within the timeout"));
            }
        }
    }

    fn write(&mut self, _bytes: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "the receiving end of a cable cannot send"))
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// The sending end of a cable (a MIDI OUT), optionally paced at the wire's speed.
#[derive(Debug)]
pub struct CableOut {
    name: String,
    addr: SocketAddrUnix,
    sock: OwnedFd,
    connected: bool,
    pacing: Option<Duration>,
    /// When the paced line is next free.
    line_free: Time,
    lost: u64,
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
        let sock = datagram_socket(name)?;
        let mut out =
            CableOut { name: name.to_owned(), addr, sock, connected: false, pacing, line_free: Time::ZERO, lost: 0 };
        out.try_connect();
        Ok(out)
    }

    /// The cable's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a receiver held the cable at the last attempt to send.
    pub fn is_plugged(&self) -> bool {
        self.connected
    }

    /// The pacing, if any.
    pub fn pacing(&self) -> Option<Duration> {
        self.pacing
    }

    fn try_connect(&mut self) -> bool {
        if !self.connected {
            // A datagram socket whose peer went away stays "connected" to nothing; start
            // from a fresh one.
            if let Ok(s) = datagram_socket(&self.name) {
                self.sock = s;
            }
            self.connected = rustix::net::connect(&self.sock, &self.addr).is_ok();
        }
        self.connected
    }

    /// Send one datagram. `WouldBlock` when the receiver's queue is full.
    fn send(&mut self, bytes: &[u8]) -> io::Result<usize> {
        for attempt in 0..2 {
            if !self.try_connect() {
                break;
            }
            match rustix::net::send(&self.sock, bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                Ok(n) => return Ok(n),
                Err(Errno::INTR) => return Ok(0),
                Err(Errno::AGAIN) => return Err(io::ErrorKind::WouldBlock.into()),
                Err(Errno::CONNREFUSED | Errno::NOTCONN | Errno::CONNRESET | Errno::PIPE | Errno::NOENT) => {
                    // The receiver went away; try once more with a fresh connection.
                    self.connected = false;
                    let _ = attempt;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.lost += bytes.len() as u64;
        Ok(bytes.len())
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
            let n = bytes.len().min(MAX_DATAGRAM);
            return loop {
                match self.send(&bytes[..n]) {
                    Ok(0) => continue,
                    other => break other,
                }
            };
        };
        let mut sent = 0;
        for &b in bytes.iter().take(PACED_WRITE_MAX) {
            let now = ictus_rt::clock::now();
            let deliver = now.max(self.line_free) + byte_time;
            super::sleep_until(deliver);
            match self.send(&[b]) {
                Ok(0) => break,
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

    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Bytes written while no receiver held the cable (lost, as on a cable plugged into
    /// nothing).
    fn lost_bytes(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique(tag: &str) -> String {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        format!("unit-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
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
        let mut got = Vec::new();
        // A small buffer: bytes kept back are returned by the next read.
        let mut buf = [0u8; 2];
        while got.len() < 6 {
            let n = rx.read(&mut buf, Some(Duration::from_secs(30))).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, [0x90, 60, 100, 0x80, 60, 0]);
        assert_eq!(rx.pending(), 0);
        let e = rx.read(&mut buf, Some(Duration::ZERO)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
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
        assert_eq!(rx.read(&mut buf, Some(Duration::from_secs(30))).unwrap(), 1);
        assert_eq!(buf[0], 0xFA);
        // The receiver goes away and comes back: the sender reconnects.
        drop(rx);
        assert_eq!(tx.write(&[0xFB]).unwrap(), 1);
        assert_eq!(tx.lost_bytes(), 3);
        let mut rx = CableIn::open(&name).unwrap();
        tx.write(&[0xFC]).unwrap();
        assert_eq!(rx.read(&mut buf, Some(Duration::from_secs(30))).unwrap(), 1);
        assert_eq!(buf[0], 0xFC);
    }

    #[test]
    fn a_receiver_that_does_not_read_fills_up() {
        let name = unique("full");
        let _rx = CableIn::open(&name).unwrap();
        let mut tx = CableOut::open(&name, None).unwrap();
        let mut full = false;
        for _ in 0..100_000 {
            match tx.write(&[0x90, 60, 100]) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    full = true;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(full, "the cable never reported full");
        assert_eq!(tx.lost_bytes(), 0);
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
        while arrivals.len() < 6 {
            let n = rx.read(&mut buf, Some(Duration::from_secs(30))).unwrap();
            assert_eq!(n, 1, "a paced cable delivers one byte at a time");
            arrivals.push(ictus_rt::clock::now());
        }
        // Each byte i was sent no earlier than t0 + (i+1)·320 µs (a lower bound that the
        // absolute sleeps guarantee; nothing here bounds lateness).
        let last = *arrivals.last().unwrap();
        assert!(last >= t0 + WIRE_BYTE_TIME * 6, "{last} < {t0} + 6 bytes of wire time");
    }
}
