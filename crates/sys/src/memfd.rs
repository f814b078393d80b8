//! Anonymous memory files and their seals: `memfd_create(2)` and the `F_*_SEALS`
//! commands of `fcntl(2)`.
//!
//! A memfd has no name in any file system, so nothing outlives its last holder: no
//! `/dev/shm` file is left behind by a crash. Seals make promises the kernel keeps for
//! everyone who holds the file, the sender included:
//!
//! - `F_SEAL_SHRINK | F_SEAL_GROW`: the size is fixed, so a mapping of it can never
//!   fault with `SIGBUS`;
//! - `F_SEAL_WRITE`: nobody can change the contents again (refused with `EBUSY` while
//!   a writable shared mapping exists, or while the kernel sees pages still pinned);
//! - `F_SEAL_FUTURE_WRITE`: writable mappings that exist stay writable, no new one can
//!   be made and `write(2)` is refused — a page only its owner can change;
//! - `F_SEAL_SEAL`: the seals themselves are fixed.
//!
//! A memfd that arrives from elsewhere is untrusted until [`check`] has said what it is.

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};

pub use rustix::fs::SealFlags;
use rustix::fs::{FileType, MemfdFlags};
use rustix::io::Errno;

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)` then `ftruncate(fd, len)`: a
/// new, zero-filled memory file of `len` bytes that may be sealed. `name` shows in
/// `/proc/PID/fd` and `/proc/PID/maps` (as `/memfd:NAME`), nowhere else.
///
/// # References
/// - [`memfd_create(2)`](https://man7.org/linux/man-pages/man2/memfd_create.2.html)
/// - [`ftruncate(2)`](https://man7.org/linux/man-pages/man2/ftruncate.2.html)
pub fn create(name: &str, len: u64) -> rustix::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len)?;
    Ok(fd)
}

/// `fcntl(fd, F_ADD_SEALS, seals)`.
///
/// # References
/// - [`fcntl(2)`](https://man7.org/linux/man-pages/man2/fcntl.2.html), "File Sealing"
/// - [`memfd_create(2)`](https://man7.org/linux/man-pages/man2/memfd_create.2.html)
pub fn add_seals(fd: BorrowedFd<'_>, seals: SealFlags) -> rustix::io::Result<()> {
    rustix::fs::fcntl_add_seals(fd, seals)
}

/// `fcntl(fd, F_GET_SEALS)`. `EINVAL` for a file that does not support sealing.
///
/// # References
/// - [`fcntl(2)`](https://man7.org/linux/man-pages/man2/fcntl.2.html), "File Sealing"
pub fn seals(fd: BorrowedFd<'_>) -> rustix::io::Result<SealFlags> {
    rustix::fs::fcntl_get_seals(fd)
}

/// The size a checked memfd must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// At least this many bytes (a region of this length fits in it).
    AtLeast(u64),
    /// Exactly this many bytes.
    Exactly(u64),
}

/// Why an untrusted descriptor is not the memfd it was said to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckError {
    /// `fstat` failed.
    Stat(Errno),
    /// Not a regular file (a socket, a pipe, a directory…).
    NotRegular,
    /// Shorter than [`Size::AtLeast`] asks.
    TooShort {
        /// Its size.
        size: u64,
        /// The least it must have.
        need: u64,
    },
    /// Not the size [`Size::Exactly`] asks.
    WrongSize {
        /// Its size.
        size: u64,
        /// The size it must have.
        expected: u64,
    },
    /// `F_GET_SEALS` failed: not a file that can be sealed.
    NotSealable(Errno),
    /// Some of the seals asked for are missing.
    MissingSeals {
        /// The seals it has.
        have: SealFlags,
        /// The seals it must have.
        need: SealFlags,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Stat(e) => write!(f, "fstat: {e}"),
            CheckError::NotRegular => write!(f, "not a regular file"),
            CheckError::TooShort { size, need } => write!(f, "{size} bytes, at least {need} needed"),
            CheckError::WrongSize { size, expected } => write!(f, "{size} bytes, expected {expected}"),
            CheckError::NotSealable(e) => write!(f, "seals: {e}"),
            CheckError::MissingSeals { have, need } => write!(f, "seals {have:?} lack {need:?}"),
        }
    }
}

impl std::error::Error for CheckError {}

/// Check an untrusted descriptor before mapping it: a regular file (`fstat`) of the
/// given size, carrying at least the seals `need` (`F_GET_SEALS`). A file sealed
/// `SHRINK` of at least the length mapped cannot make the mapping fault; one sealed
/// `WRITE` cannot change under its reader.
///
/// # References
/// - [`fstat(2)`](https://man7.org/linux/man-pages/man2/fstat.2.html)
/// - [`fcntl(2)`](https://man7.org/linux/man-pages/man2/fcntl.2.html), `F_GET_SEALS`
pub fn check(fd: BorrowedFd<'_>, size: Size, need: SealFlags) -> Result<(), CheckError> {
    let st = rustix::fs::fstat(fd).map_err(CheckError::Stat)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(CheckError::NotRegular);
    }
    let have = u64::try_from(st.st_size).unwrap_or(0);
    match size {
        Size::AtLeast(need) if have < need => return Err(CheckError::TooShort { size: have, need }),
        Size::Exactly(expected) if have != expected => return Err(CheckError::WrongSize { size: have, expected }),
        _ => {}
    }
    let seals = seals(fd).map_err(CheckError::NotSealable)?;
    if !seals.contains(need) {
        return Err(CheckError::MissingSeals { have: seals, need });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm::{Mapping, Protection};
    use std::os::fd::AsFd;

    #[test]
    fn made_sealed_and_checked() {
        let fd = create("memfd-test", 4096).unwrap();
        let want = SealFlags::SHRINK | SealFlags::GROW;
        assert_eq!(
            check(fd.as_fd(), Size::Exactly(4096), want),
            Err(CheckError::MissingSeals { have: SealFlags::empty(), need: want })
        );
        add_seals(fd.as_fd(), want | SealFlags::SEAL).unwrap();
        assert_eq!(check(fd.as_fd(), Size::Exactly(4096), want), Ok(()));
        assert_eq!(check(fd.as_fd(), Size::AtLeast(4096), want), Ok(()));
        assert_eq!(check(fd.as_fd(), Size::AtLeast(4097), want), Err(CheckError::TooShort { size: 4096, need: 4097 }));
        assert_eq!(
            check(fd.as_fd(), Size::Exactly(8192), want),
            Err(CheckError::WrongSize { size: 4096, expected: 8192 })
        );
        assert!(rustix::fs::ftruncate(&fd, 0).is_err(), "sealed against shrinking");
        assert!(add_seals(fd.as_fd(), SealFlags::WRITE).is_err(), "sealed against more seals");
    }

    #[test]
    fn other_files_are_refused() {
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert_eq!(check(r.as_fd(), Size::AtLeast(0), SealFlags::empty()), Err(CheckError::NotRegular));
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(matches!(check(f.as_fd(), Size::AtLeast(0), SealFlags::empty()), Err(CheckError::NotSealable(_))));
    }

    /// What `F_SEAL_WRITE` rests on: refused while a writable shared mapping exists,
    /// and afterwards nobody can write, map writable, or shrink.
    #[test]
    fn write_seal_waits_for_the_writable_mapping_to_go() {
        let fd = create("memfd-test", 4096).unwrap();
        let w = Mapping::shared(fd.as_fd(), 4096, Protection::ReadWrite).unwrap();
        assert_eq!(add_seals(fd.as_fd(), SealFlags::WRITE), Err(Errno::BUSY));
        drop(w);
        add_seals(fd.as_fd(), SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW).unwrap();
        assert!(Mapping::shared(fd.as_fd(), 4096, Protection::ReadWrite).is_err());
        assert!(rustix::io::write(&fd, b"x").is_err());
        assert!(Mapping::shared(fd.as_fd(), 4096, Protection::Read).is_ok());
    }
}
