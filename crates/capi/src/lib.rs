//! The C library of ictus (`libictus.so`, `libictus.a`, header `include/ictus.h`,
//! pkg-config `ictus`): ports and messages, the name server's client, shared-memory
//! channels and the MIDI output library, for C and C++ programs.
//!
//! The conventions every function follows are in `doc/c-api.md`:
//!
//! - **Names.** Everything is `ictus_`-prefixed; a function is `ictus_<object>_<verb>`
//!   (`ictus_port_allocate`, `ictus_name_lookup`); constants are `ICTUS_…`.
//! - **Status.** Every function that can fail returns an [`ictus_error`]: `ICTUS_OK` or
//!   why not; `ictus_strerror` names a value, `ictus_last_error` gives the detail of the
//!   thread's last failure. Results come back through out-pointers, written only on
//!   success.
//! - **Owning handles** come from `*_new`, `*_open`, `*_connect`, `ictus_space_task` and
//!   are released by exactly one call to the matching `*_free` or `*_close` (which
//!   accept NULL). **Borrowed** pointers (`ictus_received_data`, `ictus_last_error`,
//!   descriptors from `*_fd`) are valid until the object they come from changes or is
//!   freed, and are never freed by the caller. Descriptors from `*_fd_dup`-style calls
//!   (`ictus_port_pollable_fd`, `ictus_port_send_right_fd`) are the caller's to close.
//! - **Port names** (`ictus_name`, a `uint32_t`) mean something only in their space;
//!   rights that a call gives the caller (a received right, a looked-up name) are the
//!   caller's, released with `ictus_port_deallocate` (or sent on).
//! - **Time-outs** are `int64_t` nanoseconds: negative waits for ever, zero does not wait.
//! - **No panic crosses the boundary**: every entry point runs inside
//!   `catch_unwind`; a bug in ictus is `ICTUS_ERR_PANIC`, never an unwinding into C or
//!   an abort. Every pointer is checked for NULL, every string for UTF-8, every constant
//!   for range, before use.
#![allow(unsafe_code)] // the boundary itself: raw pointers from C, each use checked
#![allow(clippy::missing_safety_doc)] // the safety contract is the header's, per function
#![allow(non_camel_case_types)] // C's names

mod error;
mod midi;
mod names;
mod ports;
mod shm;

pub use error::*;
pub use midi::*;
pub use names::*;
pub use ports::*;
pub use shm::*;

use std::ffi::{c_char, CStr};

use error::guard_value;
use std::time::Duration;

/// A pointer the caller gives for a result: must not be NULL.
pub(crate) fn out<'a, T>(p: *mut T, what: &str) -> error::Result<&'a mut T> {
    // SAFETY: C promises `p` is NULL or points to a writable `T` for the call's duration
    // (the header's contract for every out-pointer); NULL is refused here.
    unsafe { p.as_mut() }.ok_or_else(|| error::Error::invalid(format!("{what} is NULL")))
}

/// A handle the caller passes: must not be NULL.
pub(crate) fn handle<'a, T>(p: *const T, what: &str) -> error::Result<&'a T> {
    // SAFETY: C promises `p` is NULL or a live handle of this type from this library
    // (the header's contract); NULL is refused here.
    unsafe { p.as_ref() }.ok_or_else(|| error::Error::invalid(format!("{what} is NULL")))
}

/// A handle the caller passes for changing: must not be NULL.
pub(crate) fn handle_mut<'a, T>(p: *mut T, what: &str) -> error::Result<&'a mut T> {
    // SAFETY: as for `handle`, and C promises no other thread uses it meanwhile.
    unsafe { p.as_mut() }.ok_or_else(|| error::Error::invalid(format!("{what} is NULL")))
}

/// A NUL-terminated UTF-8 string the caller passes.
pub(crate) fn string<'a>(p: *const c_char, what: &str) -> error::Result<&'a str> {
    if p.is_null() {
        return Err(error::Error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: C promises a NUL-terminated string that lives for the call (the header's
    // contract for every `const char *`).
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| error::Error::invalid(format!("{what} is not UTF-8")))
}

/// `len` bytes at `p`: NULL is allowed only with a length of zero.
pub(crate) fn bytes<'a>(p: *const u8, len: usize, what: &str) -> error::Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(error::Error::invalid(format!("{what} is NULL with a length of {len}")));
    }
    if len > isize::MAX as usize {
        return Err(error::Error::invalid(format!("{what}: length {len} is too large")));
    }
    // SAFETY: C promises `len` readable bytes at `p` for the call (the header's contract).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// `cap` writable bytes at `p`: NULL is allowed only with a capacity of zero.
pub(crate) fn buffer<'a>(p: *mut u8, cap: usize, what: &str) -> error::Result<&'a mut [u8]> {
    if cap == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(error::Error::invalid(format!("{what} is NULL with a capacity of {cap}")));
    }
    if cap > isize::MAX as usize {
        return Err(error::Error::invalid(format!("{what}: capacity {cap} is too large")));
    }
    // SAFETY: C promises `cap` writable bytes at `p` for the call (the header's contract).
    Ok(unsafe { std::slice::from_raw_parts_mut(p, cap) })
}

/// A time-out in nanoseconds: negative waits for ever.
pub(crate) fn timeout(ns: i64) -> Option<Duration> {
    u64::try_from(ns).ok().map(Duration::from_nanos)
}

/// Free a handle made by `Box::into_raw` (NULL is allowed).
pub(crate) fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: C promises `p` came from this library's constructor for `T` (a
        // `Box::into_raw`) and is freed exactly once (the header's contract).
        drop(unsafe { Box::from_raw(p) });
    }
}

/// The library's version, `"MAJOR.MINOR.PATCH"`: a static string.
#[no_mangle]
pub extern "C" fn ictus_version() -> *const c_char {
    guard_value(c"unknown".as_ptr(), || {
        const V: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
        V.as_ptr()
    })
}
