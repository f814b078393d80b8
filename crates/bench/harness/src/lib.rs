//! The ictus experiment harness: the layer below every experiment.
//!
//! An experiment ([`Experiment`]) is declared once, with its run function; the
//! `ictus` binary assembles the registry (a slice of them) and hands it to the command
//! line ([`cli`]), the testbed ([`testbed`]) and the child dispatcher
//! ([`child::maybe_run_child`]). Everything an experiment is built from, so that all
//! of them obey `shared/BENCHMARKS.md` the same way, is here:
//!
//! - [`experiment`]: the [`Experiment`] and [`Role`] types, the common [`Options`], what
//!   a run returns ([`Outcome`]), and the papers' [`experiment::FIGURES`];
//! - [`conditions`]: the machine and scheduling conditions a result was measured under;
//! - [`stats`]: HDR-histogram latency distributions and throughput summaries;
//! - [`report`]: the table printed to the terminal and the JSON object of `--json`;
//! - [`fit`]: the paper's `time = a + N/b` cost model, fitted by least squares;
//! - [`plot`]: the SVG plots (curves, bars), the one plotting path;
//! - [`rounds`]: the shapes runs repeat: interleaved rounds over transports with a
//!   rotating first, and the [`Transport`] trait they are measured through;
//! - [`child`]: running the other end of a measurement in a separate process;
//! - [`load`]: background loads for the papers' "under load" columns;
//! - [`pin`]: optional CPU pinning;
//! - [`sys`]: the few Linux calls that need `unsafe`, and nothing else does;
//! - [`testbed`]: every experiment of the registry, one report.
//!
//! Nothing here depends on an experiment: experiments (`ictus-experiments`, and the
//! servers' own) depend on this crate, never the reverse. A binary that embeds the
//! harness must call [`child::maybe_run_child`] first thing in `main`, because
//! measurements re-execute the current binary to run their peers.

#![deny(unsafe_code)]

pub mod child;
pub mod cli;
pub mod conditions;
pub mod experiment;
pub mod fit;
pub mod load;
pub mod pin;
pub mod plot;
pub mod report;
pub mod rounds;
pub mod stats;
pub mod sys;
pub mod testbed;
pub mod windows;

pub use child::maybe_run_child;
pub use conditions::Conditions;
pub use experiment::{Experiment, Options, Outcome, Role};
pub use report::{Better, Headline, NotMeasured, Notes, PaperFigure, Report};
pub use rounds::Transport;
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
