//! The protocol core of ictus shared-memory channels (`doc/shm.md`), without `std`,
//! an allocator or any dependency, so that both ends can use the same code: `ictus-shm`
//! (channels between ictus tasks) and the Unix emulation library (`ictus-unix-emul`,
//! linked into every program's image with no C runtime).
//!
//! - [`record`]: the record format of a ring and its decoder for untrusted rings;
//! - [`ring`]: the single-producer single-consumer ring over any memory that offers
//!   its counters and words as atomics ([`ring::RingMem`]);
//! - [`wake`]: the wake-up protocol (a flag only the sleeper writes, a doorbell per
//!   waker).
//!
//! Pure: no system calls; futex and eventfd calls are the caller's.
#![no_std]
#![deny(unsafe_code)]

#[cfg(any(test, feature = "alloc"))]
extern crate alloc;
#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod record;
pub mod ring;
/// The atomics the core is written with: the standard ones, or loom's when built for
/// the model check (`--cfg loom`). For `ictus-shm`, whose shared memory the rings use.
#[doc(hidden)]
pub mod sync;
pub mod wake;
