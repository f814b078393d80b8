//! Readiness notification to a service manager: `sd_notify(3)` in a few lines.
//!
//! A server started by systemd as a `Type=notify` service (or by anything that sets
//! `NOTIFY_SOCKET`) says `READY=1` once it serves — its socket taken, its names
//! registered — so that units ordered after it start only then, and `STOPPING=1` when
//! it begins to stop. The message is one datagram of `KEY=VALUE` lines to the
//! `AF_UNIX` datagram socket `NOTIFY_SOCKET` names (a path, or `@name` for the
//! abstract namespace); the manager knows the sender from the kernel's credentials.
//! Without `NOTIFY_SOCKET` nothing is sent. A failure to send is logged, never fatal:
//! the server serves either way, and systemd reports the missing notification itself.
//!
//! # References
//!
//! `sd_notify(3)`, `systemd.service(5)` (`Type=notify`, `NotifyAccess=`), `unix(7)`.

use std::os::unix::ffi::OsStrExt;

use rustix::io::Errno;
use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

/// Why a notification could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` is neither an absolute path nor `@name` (or too long).
    #[error("NOTIFY_SOCKET={0:?} is not an absolute path or an @abstract name this server can send to")]
    BadAddress(String),
    /// A system call failed.
    #[error("notifying the service manager at {socket:?}: {what}: {errno}")]
    Os {
        /// The value of `NOTIFY_SOCKET`.
        socket: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        errno: Errno,
    },
}

/// The address `NOTIFY_SOCKET`'s value names. Pure, for tests.
pub fn notify_address(value: &std::ffi::OsStr) -> Result<SocketAddrUnix, NotifyError> {
    let bytes = value.as_bytes();
    let bad = || NotifyError::BadAddress(value.to_string_lossy().into_owned());
    match bytes.first() {
        Some(b'/') => SocketAddrUnix::new(bytes).map_err(|_| bad()),
        Some(b'@') if bytes.len() > 1 => SocketAddrUnix::new_abstract_name(&bytes[1..]).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// Send `state` (newline-separated `KEY=VALUE` assignments) to the service manager;
/// `Ok(false)` if there is none (`NOTIFY_SOCKET` unset).
pub fn notify(state: &str) -> Result<bool, NotifyError> {
    let Some(value) = std::env::var_os("NOTIFY_SOCKET") else { return Ok(false) };
    let addr = notify_address(&value)?;
    let os = |what: &'static str| {
        let socket = value.to_string_lossy().into_owned();
        move |errno| NotifyError::Os { socket, what, errno }
    };
    let s = rustix::net::socket_with(AddressFamily::UNIX, SocketType::DGRAM, SocketFlags::CLOEXEC, None)
        .map_err(os("socket"))?;
    loop {
        match rustix::net::sendto(&s, state.as_bytes(), SendFlags::NOSIGNAL, &addr) {
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(os("sendto")(e)),
        }
    }
}

/// Say the server is ready, with a one-line status; log (not fail) if that fails.
pub fn ready(server: &'static str, status: &str) {
    send(server, &format!("READY=1\nSTATUS={}\nMAINPID={}", one_line(status), std::process::id()));
}

/// Say the server is stopping; log (not fail) if that fails.
pub fn stopping(server: &'static str) {
    send(server, "STOPPING=1\nSTATUS=stopping");
}

fn send(server: &'static str, state: &str) {
    match notify(state) {
        Ok(true) => tracing::debug!(server, state, "told the service manager"),
        Ok(false) => {}
        Err(e) => tracing::warn!(server, "{e}"),
    }
}

/// A status on one line: a newline would start another assignment.
fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        assert!(notify_address(OsStr::new("/run/systemd/notify")).is_ok());
        assert!(notify_address(OsStr::new("@/org/freedesktop/systemd1/notify/42")).is_ok());
        for bad in ["", "@", "relative/path", "vsock:2:1234"] {
            assert!(matches!(notify_address(OsStr::new(bad)), Err(NotifyError::BadAddress(_))), "{bad}");
        }
        let long = format!("/{}", "x".repeat(200));
        assert!(matches!(notify_address(OsStr::new(&long)), Err(NotifyError::BadAddress(_))));
    }

    #[test]
    fn a_status_cannot_inject_an_assignment() {
        assert_eq!(one_line("serving\nREADY=0"), "serving READY=0");
    }

    #[test]
    fn a_notification_arrives_as_one_datagram() {
        let dir = std::env::temp_dir().join(format!("ictus-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let rx = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let addr = notify_address(path.as_os_str()).unwrap();
        let s = rustix::net::socket(AddressFamily::UNIX, SocketType::DGRAM, None).unwrap();
        rustix::net::sendto(&s, b"READY=1", SendFlags::empty(), &addr).unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
