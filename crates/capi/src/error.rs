//! Errors at the boundary: one enum for every function, a string for each value, the
//! last error's detail per thread, and the guard every entry point runs in, so that no
//! panic ever unwinds into C.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What an ictus function returns: `ICTUS_OK`, or why it failed. `ictus_strerror` names
/// each value; `ictus_last_error` says more about the last failure on this thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ictus_error {
    /// Success.
    ICTUS_OK = 0,
    /// A null pointer, a string that is not UTF-8, an unknown constant, a bad length.
    ICTUS_ERR_INVALID_ARGUMENT = 1,
    /// The name denotes no right in this space.
    ICTUS_ERR_INVALID_NAME = 2,
    /// The name denotes a right of the wrong kind for this operation.
    ICTUS_ERR_INVALID_RIGHT = 3,
    /// The destination is not a send right here, or its port is dead.
    ICTUS_ERR_INVALID_DEST = 4,
    /// The time-out passed (a full queue, no message, no reply).
    ICTUS_ERR_TIMED_OUT = 5,
    /// The receive right was destroyed while waiting.
    ICTUS_ERR_PORT_DIED = 6,
    /// The server died, or dropped the request without replying.
    ICTUS_ERR_SERVER_DIED = 7,
    /// A message arrived malformed; it was destroyed, and the next receive goes on.
    ICTUS_ERR_MALFORMED = 8,
    /// The space has no room for another name, or a limit was reached.
    ICTUS_ERR_NO_SPACE = 9,
    /// No such name is registered (or no reply right, no such item).
    ICTUS_ERR_NOT_FOUND = 10,
    /// The name is already registered by another task.
    ICTUS_ERR_EXISTS = 11,
    /// Not allowed: another task registered the name, or a quota is used up.
    ICTUS_ERR_DENIED = 12,
    /// No room now: a ring, a pool, a queue is full.
    ICTUS_ERR_FULL = 13,
    /// The channel or output is closed, or its peer is gone.
    ICTUS_ERR_CLOSED = 14,
    /// More than the channel or message carries.
    ICTUS_ERR_TOO_LARGE = 15,
    /// The caller's buffer is too small; the length needed was returned.
    ICTUS_ERR_BUFFER_TOO_SMALL = 16,
    /// A service is not there: no name server running, no such device.
    ICTUS_ERR_UNAVAILABLE = 17,
    /// The kernel refused (out of descriptors or memory, …).
    ICTUS_ERR_OS = 18,
    /// A bug in ictus: it panicked. The panic was stopped at the boundary.
    ICTUS_ERR_PANIC = 19,
    /// The receive right moved to another task while this thread waited on it (Mach's
    /// `MACH_RCV_PORT_CHANGED`).
    ICTUS_ERR_PORT_CHANGED = 20,
}

pub use ictus_error::*;

/// An error on its way to C: the value, and the detail `ictus_last_error` gives.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) code: ictus_error,
    pub(crate) detail: String,
}

impl Error {
    pub(crate) fn new(code: ictus_error, detail: impl std::fmt::Display) -> Error {
        Error { code, detail: detail.to_string() }
    }

    pub(crate) fn invalid(detail: impl std::fmt::Display) -> Error {
        Error::new(ICTUS_ERR_INVALID_ARGUMENT, detail)
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

thread_local! {
    /// The detail of the last failure on this thread (empty after a success).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last(detail: &str) {
    // Interior NULs cannot be shown by C: drop them.
    let clean = CString::new(detail.replace('\0', "")).unwrap_or_default();
    let _ = LAST.try_with(|l| *l.borrow_mut() = clean);
}

/// Run an entry point's body: its error becomes the return value and the thread's last
/// error; a panic is caught here, never unwinding into C, and becomes `ICTUS_ERR_PANIC`.
pub(crate) fn guard(body: impl FnOnce() -> Result<()>) -> ictus_error {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last("");
            ICTUS_OK
        }
        Ok(Err(e)) => {
            set_last(&e.detail);
            e.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last(&format!("internal error (a bug in ictus, please report it): {what}"));
            ICTUS_ERR_PANIC
        }
    }
}

/// As [`guard`] for an entry point that returns a value rather than a status: `fallback`
/// if its body panics.
pub(crate) fn guard_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// The name of an error value, a static string (never null, never to be freed).
#[no_mangle]
pub extern "C" fn ictus_strerror(error: std::ffi::c_int) -> *const c_char {
    // An `int`, not the enum: C may pass any value, and an out-of-range enum in Rust would
    // be undefined behaviour.
    guard_value(c"ictus: unknown error".as_ptr(), || strerror(error).as_ptr())
}

fn strerror(code: i32) -> &'static std::ffi::CStr {
    match code {
        0 => c"success",
        1 => c"invalid argument",
        2 => c"the name denotes no right in this space",
        3 => c"the name denotes a right of the wrong kind",
        4 => c"invalid destination: not a send right, or its port is dead",
        5 => c"timed out",
        6 => c"the port died while waiting",
        7 => c"the server died or dropped the request",
        8 => c"a malformed message was destroyed",
        9 => c"no space: a table or limit is full",
        10 => c"not found",
        11 => c"already exists",
        12 => c"not allowed",
        13 => c"full: no room now",
        14 => c"closed, or the peer is gone",
        15 => c"too large",
        16 => c"buffer too small",
        17 => c"unavailable: the service or device is not there",
        18 => c"the kernel refused",
        19 => c"internal error in ictus (a panic, stopped at the boundary)",
        _ => c"ictus: unknown error",
    }
}

/// The detail of the last failure of an ictus function on the calling thread: what
/// failed, why, and what to do where there is something to do. Empty after a success.
/// Borrowed: valid until the next ictus call on this thread; never null.
#[no_mangle]
pub extern "C" fn ictus_last_error() -> *const c_char {
    guard_value(c"".as_ptr(), || {
        // The string lives in this thread's slot until the next call replaces it.
        LAST.try_with(|l| l.borrow().as_ptr()).unwrap_or(c"".as_ptr())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_stopped_at_the_boundary_and_said() {
        let code = guard(|| panic!("boom {}", 7));
        assert_eq!(code, ICTUS_ERR_PANIC);
        // SAFETY: ictus_last_error returns a NUL-terminated string valid until the next
        // ictus call on this thread.
        let last = unsafe { std::ffi::CStr::from_ptr(ictus_last_error()) }.to_str().unwrap().to_owned();
        assert!(last.contains("boom 7"), "{last}");
        assert_eq!(guard(|| Ok(())), ICTUS_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(ictus_last_error()) }.to_bytes(), b"");
        assert_eq!(guard_value(5, || -> i32 { panic!("value") }), 5);
    }

    #[test]
    fn every_error_has_its_own_string() {
        let mut seen = std::collections::HashSet::new();
        for code in 0..=19 {
            let s = strerror(code).to_str().unwrap();
            assert!(seen.insert(s), "{code}: {s} twice");
            assert_ne!(s, "ictus: unknown error");
        }
        assert_eq!(strerror(20).to_str().unwrap(), "ictus: unknown error");
        assert_eq!(strerror(-1).to_str().unwrap(), "ictus: unknown error");
    }

    #[test]
    fn details_with_nul_bytes_are_kept_readable() {
        let code = guard(|| Err(Error::invalid("a\0b")));
        assert_eq!(code, ICTUS_ERR_INVALID_ARGUMENT);
        // SAFETY: as above.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(ictus_last_error()) }.to_bytes(), b"ab");
    }
}
