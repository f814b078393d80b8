//! The ictus OS layer: thin wrappers over the Linux calls that every part of ictus
//! makes the same way, written once.
//!
//! Most system calls ictus makes go through [rustix](https://docs.rs/rustix), which is
//! safe and close to the kernel. This crate holds the few that rustix does not cover
//! the way ictus needs them, or that need `unsafe` to use at all, so that no other
//! crate repeats them:
//!
//! | module | calls | why not plain rustix |
//! | --- | --- | --- |
//! | [`socket`] | `sendmsg`, `recvmsg`, `recvmmsg` with `SCM_RIGHTS` and `SCM_CREDENTIALS`; `SIOCOUTQ`, `SIOCINQ` | an aligned control buffer with room for the kernel's limit (or, in a batch, a stated room and the kernel closing the rest), every received descriptor owned (also on truncation), no sender address asked for on receive; `recvmmsg` and `SIOCOUTQ` are not in rustix |
//! | [`pipe`] | `pipe2`, `pwritev2(RWF_NOWAIT)`, `preadv2(RWF_NOWAIT)`, `readv` | reply pipes: one message per write, whole or not at all, never waiting on a peer that holds the write end; the nucleus's calls and the real-time ports share them |
//! | [`mm`] | `mmap`, `munmap`, `madvise` | a mapping that unmaps itself, with bounds-checked atomics in shared memory |
//! | [`memfd`] | `memfd_create`, `F_ADD_SEALS`, `F_GET_SEALS`, `fstat` | one way to make, seal and check an untrusted memfd |
//! | [`sched`] | `sched_setattr`, `sched_getattr` | not in rustix; `SCHED_DEADLINE` needs them |
//! | [`activation`] | `sd_listen_fds` (`fcntl` on descriptors 3..) | owning descriptors a service manager passed needs `unsafe`, once, after checking each is open |
//! | [`sockdiag`] | `NETLINK_SOCK_DIAG` | the peer of a Unix socket, which no `getsockopt` tells |
//!
//! Each wrapper's documentation starts with its C form and ends with `# References` to
//! the man pages. The crate knows nothing of ports, rings or messages: policy (how long
//! to wait, what a refusal means) stays with the callers.
//!
//! # What is not here, and why
//!
//! - Sockets, polling, epoll, eventfds, futexes, `fstat`, `fcntl`: rustix's safe
//!   wrappers are used directly.
//! - Sending `SCM_CREDENTIALS` explicitly: the kernel attaches the sender's own
//!   credentials to every message for a receiver with `SO_PASSCRED`; naming others is
//!   for privileged processes, and ictus never does it.
//!
//! # Safety
//!
//! `unsafe` is denied crate-wide and allowed per module where a raw call is made; every
//! block says which man page or invariant makes it sound.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod activation;
pub mod memfd;
#[allow(unsafe_code)]
pub mod mm;
pub mod pipe;
#[allow(unsafe_code)]
pub mod sched;
pub mod sockdiag;
#[allow(unsafe_code)]
pub mod socket;

pub use rustix::io::{Errno, Result};
