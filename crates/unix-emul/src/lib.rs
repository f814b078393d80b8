//! The transparent system-call emulation library of the ictus Unix server (004 §3.3),
//! and the loader that puts it in every program.
//!
//! - [`sysno`]: the one table of what happens to each system call (native, by the
//!   library, by the server, refused), which the server's seccomp filter and the
//!   library's dispatcher both read.
//! - [`wire`]: the requests and replies between library and server, and the numbers
//!   both agree on. [`elf`]: the ELF fields a loader reads. Both pure.
//! - `loader`, `handler`, `conn`, `cache`, `state`, `patch`, `sys` (x86_64 Linux
//!   only): the library itself —
//!   `no_std`, no allocator, no thread-local storage, raw system calls from its own
//!   image only. It is linked into the `ictus-unix-loader` executable (in
//!   `servers/unix-server`) at a fixed address.
//!
//! `doc/unix.md` explains the design and the trust boundary.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

pub mod elf;
pub mod sysno;
pub mod wire;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod cache;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod conn;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod handler;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod loader;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod lookup;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod patch;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod send;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod state;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub mod sys;
