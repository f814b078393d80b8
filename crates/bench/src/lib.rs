//! The ictus experiment harness.
//!
//! Every experiment in `ictus bench` is built from the same few parts, so that they all
//! obey `shared/BENCHMARKS.md` the same way:
//!
//! - [`conditions`]: the machine and scheduling conditions a result was measured under;
//! - [`stats`]: HDR-histogram latency distributions and throughput summaries;
//! - [`report`]: the table printed to the terminal and the JSON object written with `--json`;
//! - [`fit`]: the paper's `time = a + N/b` cost model, fitted by least squares;
//! - [`svg`]: a dependency-free SVG plotter for size/time curves;
//! - [`child`]: running the other end of a measurement in a separate process;
//! - [`pin`]: optional CPU pinning;
//! - [`peers`]: the raw modern transports our IPC is compared with;
//! - [`ports`]: our transports, ictus ports, and the stub-overhead pair;
//! - [`ipc`]: the `ipc` experiment (paper 000 §8, Figure 3).
//!
//! A binary that embeds the harness must call [`child::maybe_run_child`] first thing in
//! `main`, because measurements re-execute the current binary to run their servers.

pub mod alarm;
pub mod child;
pub mod conditions;
pub mod dhs;
pub mod fileread;
pub mod fit;
pub mod ipc;
pub mod load;
pub mod midi;
pub mod peers;
pub mod pin;
pub mod ports;
pub mod report;
pub mod rtipc;
pub mod rtu;
pub mod shm;
pub mod stats;
pub mod svg;
pub mod testbed;
pub mod timer_overhead;

pub use child::maybe_run_child;
pub use conditions::Conditions;
pub use ipc::Transport;
pub use report::{Better, Headline, PaperFigure, Report};
pub use stats::{LatencyRecorder, LatencyRow, Throughput};

/// Errors an experiment can return.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A system call or process operation failed; `context` says which step.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A `--pin` specification could not be understood or used.
    #[error("bad CPU pinning {spec:?}: {reason}")]
    Pin {
        /// The specification as given.
        spec: String,
        /// Why it was rejected.
        reason: String,
    },
}

impl BenchError {
    /// Wraps an I/O error with a short description of the step that failed.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        BenchError::Io { context: context.into(), source }
    }
}

/// Formats a byte count the way the tables and plots label message sizes
/// (`64 B`, `4 KiB`, `16 MiB`); exact binary multiples only get a unit prefix.
pub fn format_size(bytes: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

/// Formats a duration in nanoseconds with a readable unit (`812 ns`, `8.10 µs`, `2.90 ms`).
pub fn format_ns(ns: f64) -> String {
    let (value, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "µs")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    if unit == "ns" {
        format!("{value:.0} {unit}")
    } else if value < 10.0 {
        format!("{value:.2} {unit}")
    } else if value < 100.0 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_labelled_with_exact_binary_units() {
        assert_eq!(format_size(1), "1 B");
        assert_eq!(format_size(64), "64 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(16 << 20), "16 MiB");
        assert_eq!(format_size(1500), "1500 B");
    }

    #[test]
    fn durations_pick_a_readable_unit() {
        assert_eq!(format_ns(812.0), "812 ns");
        assert_eq!(format_ns(8_100.0), "8.10 µs");
        assert_eq!(format_ns(21_000.0), "21.0 µs");
        assert_eq!(format_ns(2_900_000.0), "2.90 ms");
        assert_eq!(format_ns(1.5e9), "1.50 s");
    }
}
