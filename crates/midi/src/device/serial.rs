//! Serial MIDI ports through termios: raw 8N1, no flow control, at 31250 baud.
//!
//! 31250 is not one of the `Bnnn` rates of classic termios. Linux takes any rate through
//! `termios2` (`TCSETS2` with `BOTHER` and the rate in `c_ospeed`/`c_ispeed`), which
//! rustix uses for [`rustix::termios::Termios::set_speed`]. A driver that cannot make
//! the rate rounds it or refuses; [`Serial::open`] reads the settings back, and if the
//! port does not run at the rate asked it falls back to 38400 — the rate that old MIDI
//! serial adapters (and `setserial spd_cust` with a custom divisor) turn into 31250 —
//! and says so in [`SpeedOutcome::note`].
//!
//! [`Pty`] makes a pseudo-terminal pair, so the serial path can be tested (and
//! demonstrated) without hardware: the slave side is opened as a [`Serial`] port, the
//! master side is the "other end of the cable".

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::termios::{ControlModes, InputModes, OptionalActions};

use super::{read_fd, wait_fd, write_fd, Device, OpenError};

/// The MIDI line rate.
pub const MIDI_BAUD: u32 = 31250;
/// The standard rate used when the driver refuses 31250.
pub const FALLBACK_BAUD: u32 = 38400;

/// The rate a port was asked for and the rate it runs at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpeedOutcome {
    /// Asked.
    pub asked: u32,
    /// Read back from the port.
    pub got: u32,
    /// Why they differ, when they do.
    pub note: Option<String>,
}

/// An open serial port in raw mode.
#[derive(Debug)]
pub struct Serial {
    path: PathBuf,
    fd: OwnedFd,
    speed: SpeedOutcome,
}

fn set_speed(fd: BorrowedFd<'_>, baud: u32) -> io::Result<u32> {
    let mut t = rustix::termios::tcgetattr(fd)?;
    t.set_speed(baud)?;
    rustix::termios::tcsetattr(fd, OptionalActions::Now, &t)?;
    Ok(rustix::termios::tcgetattr(fd)?.output_speed())
}

impl Serial {
    /// Open the tty at `path` (non-blocking, not as controlling terminal), make it raw
    /// 8N1 without flow control, and set `baud` (falling back to 38400 if the driver
    /// does not take it; see the module documentation).
    pub fn open(path: &Path, baud: u32) -> Result<Serial, OpenError> {
        let fd = match rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                return Err(OpenError::NotFound { path: path.to_owned(), present: "no such serial port".into() })
            }
            Err(e) => return Err(OpenError::os(path.display(), "open", e)),
        };
        let mut t = match rustix::termios::tcgetattr(&fd) {
            Ok(t) => t,
            Err(Errno::NOTTY) => return Err(OpenError::NotATerminal(path.to_owned())),
            Err(e) => return Err(OpenError::os(path.display(), "tcgetattr", e)),
        };
        t.make_raw();
        t.control_modes |= ControlModes::CLOCAL | ControlModes::CREAD;
        t.control_modes &= !(ControlModes::CRTSCTS | ControlModes::CSTOPB);
        t.input_modes &= !(InputModes::IXON | InputModes::IXOFF);
        rustix::termios::tcsetattr(&fd, OptionalActions::Now, &t)
            .map_err(|e| OpenError::os(path.display(), "tcsetattr", e))?;
        let speed = match set_speed(fd.as_fd(), baud) {
            Ok(got) if got == baud => SpeedOutcome { asked: baud, got, note: None },
            first => {
                let why = match first {
                    Ok(got) => format!("the driver set {got} baud instead"),
                    Err(e) => format!("the driver refused it: {e}"),
                };
                let got = set_speed(fd.as_fd(), FALLBACK_BAUD)
                    .map_err(|e| OpenError::os(path.display(), "setting 38400 baud", e))?;
                SpeedOutcome {
                    asked: baud,
                    got,
                    note: Some(format!(
                        "{}: {baud} baud not available ({why}); running at {got} baud — a MIDI adapter (or `setserial spd_cust`) must turn that into 31250",
                        path.display()
                    )),
                }
            }
        };
        Ok(Serial { path: path.to_owned(), fd, speed })
    }

    /// The port's rate, asked and obtained.
    pub fn speed(&self) -> &SpeedOutcome {
        &self.speed
    }

    /// The tty device.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Device for Serial {
    fn describe(&self) -> String {
        format!("{} ({} baud)", self.path.display(), self.speed.got)
    }

    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
        read_fd(self.fd.as_fd(), buf, timeout)
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        write_fd(self.fd.as_fd(), bytes)
    }

    fn wait_writable(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        wait_fd(self.fd.as_fd(), rustix::event::PollFlags::OUT, timeout)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A pseudo-terminal pair: [`Pty::slave_path`] to open as a [`Serial`] port, and the
/// master side as a [`Device`] — the far end of the serial line.
#[derive(Debug)]
pub struct Pty {
    master: OwnedFd,
    slave: PathBuf,
}

impl Pty {
    /// `posix_openpt`, `grantpt`, `unlockpt`, `ptsname`; the master is non-blocking and
    /// in raw mode.
    ///
    /// # References
    ///  - [`pty(7)`](https://man7.org/linux/man-pages/man7/pty.7.html)
    pub fn open() -> io::Result<Pty> {
        use rustix::pty::OpenptFlags;
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let name = rustix::pty::ptsname(&master, Vec::new())?;
        let slave = PathBuf::from(std::ffi::OsStr::from_bytes(name.as_bytes()));
        let mut flags = rustix::fs::fcntl_getfl(&master)?;
        flags |= OFlags::NONBLOCK;
        rustix::fs::fcntl_setfl(&master, flags)?;
        let mut t = rustix::termios::tcgetattr(&master)?;
        t.make_raw();
        rustix::termios::tcsetattr(&master, OptionalActions::Now, &t)?;
        Ok(Pty { master, slave })
    }

    /// The slave side's path (`/dev/pts/N`).
    pub fn slave_path(&self) -> &Path {
        &self.slave
    }
}

impl Device for Pty {
    fn describe(&self) -> String {
        format!("pty master of {}", self.slave.display())
    }

    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
        read_fd(self.master.as_fd(), buf, timeout)
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        write_fd(self.master.as_fd(), bytes)
    }

    fn wait_writable(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        wait_fd(self.master.as_fd(), rustix::event::PollFlags::OUT, timeout)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.master.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{Kind, Parser};

    const WATCHDOG: Option<Duration> = Some(Duration::from_secs(30));

    fn read_n(d: &mut dyn Device, n: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < n {
            let k = d.read(&mut buf, WATCHDOG).unwrap();
            assert!(k > 0, "end of stream after {got:?}");
            got.extend_from_slice(&buf[..k]);
        }
        got
    }

    #[test]
    fn midi_over_a_pseudo_terminal_at_31250_baud() {
        let mut pty = Pty::open().unwrap();
        let mut port = Serial::open(pty.slave_path(), MIDI_BAUD).unwrap();
        let s = port.speed().clone();
        // A pty keeps the termios2 rate as set; if a kernel ever refuses, the fallback
        // must say why.
        assert!(s.got == MIDI_BAUD || (s.got == FALLBACK_BAUD && s.note.is_some()), "{s:?}");
        assert_eq!(s.got, MIDI_BAUD, "{:?}", s.note);

        // In from the far end, parsed.
        let bytes = [0x90, 60, 100, 0xF8, 62, 100, 0xF0, 1, 2, 0xF7];
        assert_eq!(pty.write(&bytes).unwrap(), bytes.len());
        let got = read_n(&mut port, bytes.len());
        assert_eq!(got, bytes, "the raw port changed the bytes");
        let mut p = Parser::new();
        let mut ms = Vec::new();
        p.feed_slice(&got, ictus_rt::Time::ZERO, &mut ms);
        let kinds: Vec<Kind> = ms.iter().map(|m| m.kind()).collect();
        assert_eq!(kinds, [Kind::NoteOn, Kind::Clock, Kind::NoteOn, Kind::Sysex]);

        // Out to the far end: every byte value passes untouched (no CR/LF or flow
        // control processing in raw mode).
        let all: Vec<u8> = (0..=255u8).collect();
        let mut off = 0;
        while off < all.len() {
            match port.write(&all[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(read_n(&mut pty, all.len()), all);
    }

    #[test]
    fn a_non_terminal_is_refused() {
        let e = Serial::open(Path::new("/dev/null"), MIDI_BAUD).unwrap_err();
        assert!(matches!(e, OpenError::NotATerminal(_)), "{e}");
        let e = Serial::open(Path::new("/dev/ttyNOPE9"), MIDI_BAUD).unwrap_err();
        assert!(matches!(e, OpenError::NotFound { .. }), "{e}");
    }

    #[test]
    fn the_far_end_closing_is_the_end_of_the_stream() {
        let pty = Pty::open().unwrap();
        let mut port = Serial::open(pty.slave_path(), MIDI_BAUD).unwrap();
        drop(pty);
        let mut buf = [0u8; 8];
        assert_eq!(port.read(&mut buf, WATCHDOG).unwrap(), 0);
    }
}
