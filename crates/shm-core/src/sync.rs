//! The atomics the protocol core is written with: the standard ones, or loom's when
//! the crate is built for the model check (`--cfg loom`).

#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
