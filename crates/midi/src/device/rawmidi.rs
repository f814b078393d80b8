//! ALSA raw MIDI device files (`/dev/snd/midiC<card>D<device>`), read and written with
//! plain `read(2)`/`write(2)` on a non-blocking descriptor.
//!
//! The kernel's rawmidi driver is the modern form of the paper's MPU-401 driver: an
//! interrupt handler fills an input buffer, `read` empties it, `poll` waits for it;
//! `write` fills an output buffer that the hardware drains, and a full buffer answers
//! `EAGAIN` (our [`Device::write`] `WouldBlock`). alsa-lib's `snd_rawmidi_*` is a thin
//! layer over the same calls, so it is not needed.
//!
//! A device may be input-only or output-only; opening it read-write then fails, so
//! [`RawMidi::open`] opens only the direction asked for. A machine without sound cards
//! (this build machine, most CI) has no `/dev/snd` at all: [`present`] says so in words
//! and [`RawMidi::open`] reports it in its error.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{read_fd, wait_fd, write_fd, Device, Direction, OpenError};

/// Where ALSA's device files live.
pub const DEV_SND: &str = "/dev/snd";

/// Whether a file name is an ALSA raw MIDI device's: `midiC<digits>D<digits>`.
pub fn is_rawmidi_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("midiC") else {
        return false;
    };
    let Some((card, dev)) = rest.split_once('D') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(card) && digits(dev)
}

/// The raw MIDI device files in `dir` (normally [`DEV_SND`]), sorted. A missing
/// directory is no devices.
pub fn list_in(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        if e.file_name().to_str().is_some_and(is_rawmidi_name) {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// The raw MIDI device files of this machine.
pub fn list() -> io::Result<Vec<PathBuf>> {
    list_in(Path::new(DEV_SND))
}

/// What raw MIDI devices this machine has, in words, for error messages.
pub fn present() -> String {
    match list() {
        Ok(v) if v.is_empty() && !Path::new(DEV_SND).exists() => {
            format!("this machine has no ALSA raw MIDI devices ({DEV_SND} does not exist: no sound card or MIDI interface, or the ALSA drivers are not loaded); use a virtual cable, cable:NAME")
        }
        Ok(v) if v.is_empty() => {
            format!(
                "this machine has no ALSA raw MIDI devices (no midiC*D* in {DEV_SND}); use a virtual cable, cable:NAME"
            )
        }
        Ok(v) => {
            let names: Vec<String> = v.iter().map(|p| p.display().to_string()).collect();
            format!("raw MIDI devices here: {}", names.join(", "))
        }
        Err(e) => format!("{DEV_SND} could not be read: {e}"),
    }
}

/// An open raw MIDI device file.
#[derive(Debug)]
pub struct RawMidi {
    path: PathBuf,
    fd: OwnedFd,
    dir: Direction,
}

impl RawMidi {
    /// Open `path` for `dir`, non-blocking. It must be a character device.
    pub fn open(path: &Path, dir: Direction) -> Result<RawMidi, OpenError> {
        let access = match dir {
            Direction::Input => OFlags::RDONLY,
            Direction::Output => OFlags::WRONLY,
            Direction::Both => OFlags::RDWR,
        };
        let fd =
            match rustix::fs::open(path, access | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Err(OpenError::NotFound { path: path.to_owned(), present: present() }),
                Err(e) => return Err(OpenError::os(path.display(), "open", e)),
            };
        let st = rustix::fs::fstat(&fd).map_err(|e| OpenError::os(path.display(), "fstat", e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::CharacterDevice {
            return Err(OpenError::NotCharDevice(path.to_owned()));
        }
        Ok(RawMidi { path: path.to_owned(), fd, dir })
    }

    /// The device file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Device for RawMidi {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
        if self.dir == Direction::Output {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "raw MIDI device opened for output only"));
        }
        read_fd(self.fd.as_fd(), buf, timeout)
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.dir == Direction::Input {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "raw MIDI device opened for input only"));
        }
        write_fd(self.fd.as_fd(), bytes)
    }

    fn wait_writable(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        wait_fd(self.fd.as_fd(), rustix::event::PollFlags::OUT, timeout)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_rawmidi_name("midiC0D0"));
        assert!(is_rawmidi_name("midiC12D3"));
        assert!(!is_rawmidi_name("midiC0"));
        assert!(!is_rawmidi_name("midiCD0"));
        assert!(!is_rawmidi_name("midiC0D"));
        assert!(!is_rawmidi_name("pcmC0D0p"));
        assert!(!is_rawmidi_name("midiC0D0x"));
    }

    #[test]
    fn listing_a_directory() {
        let dir = std::env::temp_dir().join(format!("ictus-rawmidi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(list_in(&dir).unwrap().is_empty());
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["midiC1D0", "midiC0D0", "controlC0", "pcmC0D0p"] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        assert_eq!(list_in(&dir).unwrap(), vec![dir.join("midiC0D0"), dir.join("midiC1D0")]);
        // A regular file is refused.
        let e = RawMidi::open(&dir.join("midiC0D0"), Direction::Both).unwrap_err();
        assert!(matches!(e, OpenError::NotCharDevice(_)), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_device_says_what_the_machine_has() {
        let e = RawMidi::open(Path::new("/dev/snd/midiC97D3"), Direction::Output).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, OpenError::NotFound { .. }), "{text}");
        assert!(
            text.contains("midiC97D3") && (text.contains("no ALSA raw MIDI") || text.contains("devices here")),
            "{text}"
        );
    }

    /// The read/write path on a character device that exists everywhere: `/dev/null`
    /// swallows writes and reads as end of stream.
    #[test]
    fn the_io_path_on_a_character_device() {
        let mut d = RawMidi::open(Path::new("/dev/null"), Direction::Both).unwrap();
        assert_eq!(d.write(&[0x90, 60, 100]).unwrap(), 3);
        let mut buf = [0u8; 16];
        assert_eq!(d.read(&mut buf, Some(Duration::ZERO)).unwrap(), 0);
        let mut out = RawMidi::open(Path::new("/dev/null"), Direction::Output).unwrap();
        assert_eq!(out.read(&mut buf, None).unwrap_err().kind(), io::ErrorKind::Unsupported);
        let mut inp = RawMidi::open(Path::new("/dev/null"), Direction::Input).unwrap();
        assert_eq!(inp.write(&[1]).unwrap_err().kind(), io::ErrorKind::Unsupported);
    }
}
