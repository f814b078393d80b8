//! The atomics the protocol core is written with: the standard ones, or loom's when
//! the crate is built for the model check (`--cfg loom`).

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
