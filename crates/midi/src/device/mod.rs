//! MIDI byte devices: what the output library writes to and an input driver reads from.
//!
//! A [`Device`] is an uninterpreted byte stream in both directions (the paper's MPU-401
//! in "UART mode"), with a descriptor that `poll`/`epoll` can wait on. Three kinds:
//!
//! - [`cable`]: the **virtual MIDI cable**, always there: a named, one-way, cross-process
//!   link (a byte ring in shared memory per sender, wake-ups and hang-ups on an `AF_UNIX`
//!   `SOCK_SEQPACKET` connection in the abstract namespace), optionally paced at the
//!   wire's 31250 baud (320 µs a byte). [`cable::CableOut`] is the plug at the sender
//!   (a MIDI OUT), [`cable::CableIn`] the plug at the receiver (a MIDI IN).
//! - [`rawmidi`]: ALSA raw MIDI device files, `/dev/snd/midiC*D*`, read and written
//!   with plain `read`/`write`.
//! - [`serial`]: serial ports through termios, at 31250 baud where the driver allows it.
//!
//! [`DeviceSpec`] names any of them in one string (for `--device`), and
//! [`DeviceSpec::open_output`] / [`DeviceSpec::open_input`] open it.
//!
//! # The contract of [`Device`]
//!
//! - [`Device::read`] waits at most `timeout` (`None`: for ever) for at least one byte;
//!   returns `Ok(n > 0)` with bytes, `Err(kind TimedOut)` if none came in time, `Ok(0)`
//!   at the end of the stream (the device went away). Interrupted system calls are
//!   retried inside.
//! - [`Device::write`] writes a prefix of `bytes` and returns its length (`≥ 1` for a
//!   non-empty `bytes`); `Err(kind WouldBlock)` means the device is full right now. It
//!   does not block, except a paced cable, which takes the wire's time.
//! - [`Device::wait_writable`] waits until a write may be taken again: `poll` for
//!   `POLLOUT` on a device file (ALSA raw MIDI, a serial port), the ring's wake-up on a
//!   cable. The paper's byte sender slept "a few milliseconds" when the MPU-401 was full,
//!   which it had to: the MPU-401 gave no interrupt when its output buffer emptied.
//! - A device open in one direction only answers the other with `Err(kind Unsupported)`.

pub mod cable;
pub mod rawmidi;
#[allow(unsafe_code)]
mod ring;
pub mod serial;
#[allow(unsafe_code)]
mod stamp;

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::time::Duration;

use ictus_rt::Time;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

/// A MIDI byte device. See the module documentation for the contract.
pub trait Device: Send + fmt::Debug {
    /// What it is, for messages: `cable demo (out)`, `/dev/snd/midiC1D0`, ….
    fn describe(&self) -> String;

    /// Read at least one byte, waiting at most `timeout` (`None`: for ever).
    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize>;

    /// Write a prefix of `bytes` without blocking (`WouldBlock`: the device is full).
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize>;

    /// Wait at most `timeout` (`None`: for ever) until [`Device::write`] may take bytes
    /// again after it answered `WouldBlock`; whether it may. Device files poll their
    /// descriptor for `POLLOUT` ([`wait_fd`]); a cable waits for its ring's wake-up. (No
    /// default: a wrapper around a device must pass this on, or it would wait on the
    /// wrong thing.)
    fn wait_writable(&mut self, timeout: Option<Duration>) -> io::Result<bool>;

    /// The descriptor to wait on: readable when [`Device::read`] has bytes (and, for a
    /// device file, writable when [`Device::write`] may take some: see
    /// [`Device::wait_writable`]).
    fn fd(&self) -> BorrowedFd<'_>;

    /// Bytes written that reached nobody (a cable with no receiver); 0 for devices that
    /// cannot tell.
    fn lost_bytes(&self) -> u64 {
        0
    }
}

impl<D: Device + ?Sized> Device for Box<D> {
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
        (**self).read(buf, timeout)
    }
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        (**self).write(bytes)
    }
    fn wait_writable(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        (**self).wait_writable(timeout)
    }
    fn fd(&self) -> BorrowedFd<'_> {
        (**self).fd()
    }
    fn lost_bytes(&self) -> u64 {
        (**self).lost_bytes()
    }
}

/// Which way a device is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Bytes come in (a MIDI IN).
    Input,
    /// Bytes go out (a MIDI OUT).
    Output,
    /// Both.
    Both,
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The spec string is not understood.
    #[error("bad device {spec:?}: {why} (try cable:NAME, cable:NAME,paced, /dev/snd/midiCxDy, serial:/dev/ttyX)")]
    BadSpec {
        /// The spec.
        spec: String,
        /// What is wrong with it.
        why: String,
    },
    /// A cable name is not acceptable.
    #[error("bad cable name {0:?}: use 1 to 64 of A-Z a-z 0-9 . _ -")]
    BadCableName(String),
    /// Someone already holds the receiving end of this cable.
    #[error("cable {0:?} already has a receiver (only one process may hold its MIDI IN end)")]
    CableBusy(String),
    /// The device file does not exist.
    #[error("{path}: no such device; {present}")]
    NotFound {
        /// The path.
        path: PathBuf,
        /// What this machine has instead, in words.
        present: String,
    },
    /// The path names something that is not a character device.
    #[error("{0}: not a character device")]
    NotCharDevice(PathBuf),
    /// The path names something that is not a terminal (for a serial port).
    #[error("{0}: not a terminal (serial ports are tty devices)")]
    NotATerminal(PathBuf),
    /// A system call failed.
    #[error("{what} {target}: {source}")]
    Os {
        /// What was being opened.
        target: String,
        /// Which step.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

impl OpenError {
    pub(crate) fn os(target: impl fmt::Display, what: &'static str, e: impl Into<io::Error>) -> OpenError {
        OpenError::Os { target: target.to_string(), what, source: e.into() }
    }
}

/// A device named by a string, for command lines (`--device`).
///
/// | spec | device |
/// | --- | --- |
/// | `cable:NAME` | the virtual cable `NAME`, unpaced |
/// | `cable:NAME,paced` | the same, paced at 31250 baud (pacing applies at the sender) |
/// | `/dev/snd/midiCxDy`, `rawmidi:PATH` | an ALSA raw MIDI device file |
/// | `serial:PATH`, `/dev/tty…` | a serial port at 31250 baud (38400 where refused) |
/// | `serial:PATH,BAUD` | a serial port at another rate |
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The virtual cable.
    Cable {
        /// Its name.
        name: String,
        /// Paced at the wire's speed.
        paced: bool,
    },
    /// An ALSA raw MIDI device file.
    RawMidi(PathBuf),
    /// A serial port.
    Serial {
        /// The tty device.
        path: PathBuf,
        /// The rate asked for.
        baud: u32,
    },
}

impl DeviceSpec {
    /// Parse a spec string (see the type's documentation).
    pub fn parse(spec: &str) -> Result<DeviceSpec, OpenError> {
        let bad = |why: &str| OpenError::BadSpec { spec: spec.to_owned(), why: why.to_owned() };
        if let Some(rest) = spec.strip_prefix("cable:") {
            let (name, opts) = rest.split_once(',').unwrap_or((rest, ""));
            cable::check_name(name)?;
            let paced = match opts {
                "" => false,
                "paced" => true,
                _ => return Err(bad("the only cable option is `paced`")),
            };
            return Ok(DeviceSpec::Cable { name: name.to_owned(), paced });
        }
        if let Some(path) = spec.strip_prefix("rawmidi:") {
            if path.is_empty() {
                return Err(bad("rawmidi: needs a path"));
            }
            return Ok(DeviceSpec::RawMidi(path.into()));
        }
        let serial = |rest: &str| -> Result<DeviceSpec, OpenError> {
            let (path, baud) = match rest.split_once(',') {
                Some((p, b)) => (p, b.parse::<u32>().map_err(|_| bad("the baud rate must be a number"))?),
                None => (rest, serial::MIDI_BAUD),
            };
            if path.is_empty() || baud == 0 {
                return Err(bad("serial: needs a path and a positive rate"));
            }
            Ok(DeviceSpec::Serial { path: path.into(), baud })
        };
        if let Some(rest) = spec.strip_prefix("serial:") {
            return serial(rest);
        }
        if spec.starts_with("/dev/snd/midi") {
            return Ok(DeviceSpec::RawMidi(spec.into()));
        }
        if spec.starts_with("/dev/tty") {
            return serial(spec);
        }
        Err(bad("unknown kind of device"))
    }

    /// Open it to send MIDI (the sending end of a cable).
    pub fn open_output(&self) -> Result<Box<dyn Device>, OpenError> {
        self.open(Direction::Output)
    }

    /// Open it to receive MIDI (the receiving end of a cable).
    pub fn open_input(&self) -> Result<Box<dyn Device>, OpenError> {
        self.open(Direction::Input)
    }

    fn open(&self, dir: Direction) -> Result<Box<dyn Device>, OpenError> {
        Ok(match self {
            DeviceSpec::Cable { name, paced } => match dir {
                Direction::Input => Box::new(cable::CableIn::open(name)?),
                _ => {
                    let pacing = if *paced { Some(cable::WIRE_BYTE_TIME) } else { None };
                    Box::new(cable::CableOut::open(name, pacing)?)
                }
            },
            DeviceSpec::RawMidi(path) => Box::new(rawmidi::RawMidi::open(path, dir)?),
            DeviceSpec::Serial { path, baud } => Box::new(serial::Serial::open(path, *baud)?),
        })
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cable { name, paced: false } => write!(f, "cable:{name}"),
            DeviceSpec::Cable { name, paced: true } => write!(f, "cable:{name},paced"),
            DeviceSpec::RawMidi(p) => write!(f, "{}", p.display()),
            DeviceSpec::Serial { path, baud } => write!(f, "serial:{},{baud}", path.display()),
        }
    }
}

/// Wait until `fd` is ready for `flags`, at most `timeout` (`None`: for ever). Returns
/// whether it is ready; retries on `EINTR` with the time left.
pub fn wait_fd(fd: BorrowedFd<'_>, flags: PollFlags, timeout: Option<Duration>) -> io::Result<bool> {
    let deadline = timeout.map(|t| ictus_rt::clock::now() + t);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(ictus_rt::clock::now()));
        let ts = left.map(|l| rustix::time::Timespec {
            tv_sec: l.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(l.subsec_nanos()),
        });
        let mut fds = [PollFd::new(&fd, flags)];
        match poll(&mut fds, ts.as_ref()) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// `read` on a non-blocking descriptor, after waiting for it to be readable: the
/// [`Device::read`] contract for plain descriptors (raw MIDI, serial ports).
pub(crate) fn read_fd(fd: BorrowedFd<'_>, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    let deadline = timeout.map(|t| ictus_rt::clock::now() + t);
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Ok(n) => return Ok(n),
            // A pseudo-terminal whose other side has closed answers EIO: the end.
            Err(Errno::IO) => return Ok(0),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => {}
            Err(e) => return Err(e.into()),
        }
        let left = deadline.map(|d| d.saturating_duration_since(ictus_rt::clock::now()));
        if left == Some(Duration::ZERO) || !wait_fd(fd, PollFlags::IN, left)? {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no MIDI input within the timeout"));
        }
    }
}

/// `write` on a non-blocking descriptor: `EAGAIN` becomes `WouldBlock` (full).
pub(crate) fn write_fd(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<usize> {
    loop {
        match rustix::io::write(fd, bytes) {
            Ok(n) => return Ok(n),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sleep until `deadline` on `CLOCK_MONOTONIC` (`clock_nanosleep(…, TIMER_ABSTIME, …)`),
/// resuming after signals. An absolute deadline does not drift when the sleep is
/// interrupted or starts late.
///
/// # References
///  - [`clock_nanosleep(2)`](https://man7.org/linux/man-pages/man2/clock_nanosleep.2.html)
pub fn sleep_until(deadline: Time) {
    let ts = deadline.to_timespec();
    let req = rustix::time::Timespec { tv_sec: ts.secs().min(i64::MAX as u64) as i64, tv_nsec: i64::from(ts.nanos()) };
    while let Err(Errno::INTR) = rustix::thread::clock_nanosleep_absolute(rustix::time::ClockId::Monotonic, &req) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(DeviceSpec::parse("cable:demo").unwrap(), DeviceSpec::Cable { name: "demo".into(), paced: false });
        assert_eq!(
            DeviceSpec::parse("cable:a.b-c,paced").unwrap(),
            DeviceSpec::Cable { name: "a.b-c".into(), paced: true }
        );
        assert!(DeviceSpec::parse("cable:").is_err());
        assert!(DeviceSpec::parse("cable:a/b").is_err());
        assert!(DeviceSpec::parse("cable:a,fast").is_err());
        assert_eq!(DeviceSpec::parse("/dev/snd/midiC1D0").unwrap(), DeviceSpec::RawMidi("/dev/snd/midiC1D0".into()));
        assert_eq!(DeviceSpec::parse("rawmidi:/x").unwrap(), DeviceSpec::RawMidi("/x".into()));
        assert_eq!(
            DeviceSpec::parse("/dev/ttyUSB0").unwrap(),
            DeviceSpec::Serial { path: "/dev/ttyUSB0".into(), baud: serial::MIDI_BAUD }
        );
        assert_eq!(
            DeviceSpec::parse("serial:/dev/pts/3,38400").unwrap(),
            DeviceSpec::Serial { path: "/dev/pts/3".into(), baud: 38400 }
        );
        assert!(DeviceSpec::parse("serial:/dev/x,fast").is_err());
        assert!(DeviceSpec::parse("usb:1").is_err());
        for s in ["cable:x", "cable:x,paced", "serial:/dev/pts/3,38400"] {
            assert_eq!(DeviceSpec::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn sleep_until_the_past_returns() {
        sleep_until(Time::ZERO);
        let t = ictus_rt::clock::now() + Duration::from_millis(1);
        sleep_until(t);
        assert!(ictus_rt::clock::now() >= t);
    }
}
