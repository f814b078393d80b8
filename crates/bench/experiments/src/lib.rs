//! The papers' experiments, each run as `ictus bench NAME`, and the peers they measure
//! ours against.
//!
//! Each module declares its experiment once, as a `static` [`ictus_bench::Experiment`]
//! (name, the line `--help` shows, the papers' figures, expected durations, child
//! roles, extra arguments, run function); the `ictus` binary lists them in its
//! registry, one line each. Everything they share with any other experiment (conditions,
//! reports, plots, interleaved rounds, child processes, loads) is the harness,
//! `ictus-bench`, which knows nothing of them.
//!
//! | module | `ictus bench …` | the papers' figures |
//! | --- | --- | --- |
//! | [`ipc`] | `ipc` | 000 §8, Figure 3 (transfer costs); [`ipc_async`], the async API's round trip |
//! | [`fileread`] | `fileread` | 000 Table 2 (file read methods) |
//! | [`alarm`] | `alarm` | 000 §3.1, §5 (wake-up lateness) |
//! | [`timer_overhead`] | `timer-overhead` | 000 §6 (timer overhead) |
//! | [`rtu`] | `rtu` | 001 Table 3 (periodic streams) |
//! | [`rtipc`] | `rtipc` | 003 §5.1 (RT-IPC message cost) |
//! | [`dhs`] | `dhs` | 003 Table 2 (Distributed Hartstone) |
//! | [`shm`] | `shm` | 002 §3, 000 §8.4 (shared-memory channels) |
//! | [`midi`] | `midi` | 000 Table 1, Figure 1 (MIDI latency under load) |
//!
//! [`peers`] holds the transports several experiments measure (sockets, pipes, a futex
//! over shared memory, ictus ports, cyclictest).

#![deny(unsafe_code)]

pub mod alarm;
pub mod dhs;
pub mod fileread;
pub mod ipc;
pub mod ipc_async;
pub mod midi;
pub mod peers;
pub mod rtipc;
pub mod rtu;
pub mod shm;
pub mod timer_overhead;
