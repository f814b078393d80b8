//! Descriptors passed by a service manager: `sd_listen_fds(3)` without libsystemd.
//!
//! ```c
//! int sd_listen_fds(int unset_environment);   /* fds SD_LISTEN_FDS_START (3) .. 3+n-1 */
//! ```
//!
//! A service manager (systemd, `systemd-socket-activate`) that starts a program with
//! sockets it made puts them at descriptors `3 .. 3 + LISTEN_FDS` and sets
//! `LISTEN_PID` to the program's pid, so that a child that inherits the environment
//! (but not the pid) does not take them for its own. [`take_listen_fds`] reads the two
//! variables and, if `LISTEN_PID` is this process, returns those descriptors owned,
//! once: a second call returns none. What the descriptors must be (a listening socket
//! of a kind, bound where) is the caller's business.
//!
//! The environment is left as it is (`unset_environment = 0`): changing it is not safe
//! once other threads may read it, and the `LISTEN_PID` check already keeps children
//! from taking the descriptors.
//!
//! # References
//!
//! `sd_listen_fds(3)`, `systemd.socket(5)`, `systemd-socket-activate(1)`, `fcntl(2)`.

use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::io::{Errno, FdFlags};

/// The first descriptor a service manager passes (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// At most this many passed descriptors are accepted (a bound on a number read from
/// the environment; systemd's own limit per socket unit is far lower in practice).
pub const MAX_LISTEN_FDS: usize = 64;

static TAKEN: AtomicBool = AtomicBool::new(false);

/// Why the passed descriptors could not be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenFdsError {
    /// `LISTEN_PID` or `LISTEN_FDS` is not a number, or `LISTEN_FDS` is above
    /// [`MAX_LISTEN_FDS`].
    BadEnvironment(&'static str),
    /// A descriptor the variables name is not open.
    NotOpen(RawFd),
    /// `fcntl` on a passed descriptor failed.
    Os(Errno),
}

impl std::fmt::Display for ListenFdsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenFdsError::BadEnvironment(what) => write!(f, "socket activation: {what}"),
            ListenFdsError::NotOpen(fd) => {
                write!(f, "socket activation: descriptor {fd} was announced by LISTEN_FDS but is not open")
            }
            ListenFdsError::Os(e) => write!(f, "socket activation: fcntl: {e}"),
        }
    }
}

impl std::error::Error for ListenFdsError {}

/// How many descriptors `LISTEN_PID` and `LISTEN_FDS` pass to the process `pid`:
/// `None` if they are not for it (unset, or another pid). Pure, for tests.
pub fn parse_listen_env(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    pid: u32,
) -> Result<Option<usize>, ListenFdsError> {
    let Some(listen_pid) = listen_pid else { return Ok(None) };
    let for_pid: u32 = listen_pid.parse().map_err(|_| ListenFdsError::BadEnvironment("LISTEN_PID is not a pid"))?;
    if for_pid != pid {
        return Ok(None);
    }
    let n: usize = listen_fds
        .ok_or(ListenFdsError::BadEnvironment("LISTEN_PID is set but LISTEN_FDS is not"))?
        .parse()
        .map_err(|_| ListenFdsError::BadEnvironment("LISTEN_FDS is not a count"))?;
    if n > MAX_LISTEN_FDS {
        return Err(ListenFdsError::BadEnvironment("LISTEN_FDS is implausibly large"));
    }
    Ok(Some(n))
}

/// The descriptors a service manager passed to this process, owned and marked
/// close-on-exec; empty if none were passed, if they were for another process, or if
/// they were taken already.
pub fn take_listen_fds() -> Result<Vec<OwnedFd>, ListenFdsError> {
    let pid = std::process::id();
    let env = |k: &str| std::env::var(k).ok();
    let Some(n) = parse_listen_env(env("LISTEN_PID").as_deref(), env("LISTEN_FDS").as_deref(), pid)? else {
        return Ok(Vec::new());
    };
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(Vec::new());
    }
    let fds = LISTEN_FDS_START..LISTEN_FDS_START + n as RawFd;
    // Check every one is open before owning any, so that no `OwnedFd` ever holds a
    // number that is not a descriptor.
    for fd in fds.clone() {
        // SAFETY: `fcntl(F_GETFD)` only reads the descriptor flags; on a number that is
        // not open it fails with EBADF and touches nothing (fcntl(2)). The borrow ends
        // with the call.
        let flags = rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) });
        match flags {
            Ok(_) => {}
            Err(Errno::BADF) => return Err(ListenFdsError::NotOpen(fd)),
            Err(e) => return Err(ListenFdsError::Os(e)),
        }
    }
    let mut owned = Vec::with_capacity(n);
    for fd in fds {
        // SAFETY: sd_listen_fds(3): with LISTEN_PID naming this process, descriptors
        // 3 .. 3+LISTEN_FDS were passed to it across exec and belong to the program;
        // each was checked open above, nothing in this process opened or owns them
        // (the standard library opens no descriptors before main), and the swap of
        // `TAKEN` above makes this the only place that ever owns them.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        rustix::io::fcntl_setfd(&fd, FdFlags::CLOEXEC).map_err(ListenFdsError::Os)?;
        owned.push(fd);
    }
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_read_as_sd_listen_fds_reads_it() {
        assert_eq!(parse_listen_env(None, None, 7), Ok(None));
        assert_eq!(parse_listen_env(None, Some("1"), 7), Ok(None));
        assert_eq!(parse_listen_env(Some("8"), Some("1"), 7), Ok(None), "another process's");
        assert_eq!(parse_listen_env(Some("7"), Some("1"), 7), Ok(Some(1)));
        assert_eq!(parse_listen_env(Some("7"), Some("0"), 7), Ok(Some(0)));
        assert!(parse_listen_env(Some("7"), None, 7).is_err());
        assert!(parse_listen_env(Some("x"), Some("1"), 7).is_err());
        assert!(parse_listen_env(Some("7"), Some("-1"), 7).is_err());
        assert!(parse_listen_env(Some("7"), Some("65"), 7).is_err());
        assert!(parse_listen_env(Some("7"), Some("99999999999999999999"), 7).is_err());
    }

    #[test]
    fn nothing_is_taken_without_the_environment() {
        // The test harness is not socket-activated: its LISTEN_PID, if any, is not ours.
        if std::env::var("LISTEN_PID").ok() != Some(std::process::id().to_string()) {
            assert!(take_listen_fds().unwrap().is_empty());
        }
    }
}
