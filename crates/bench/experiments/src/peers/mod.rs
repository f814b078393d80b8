//! The peers our transports are measured against, and our own transports, shared by
//! the experiments that measure them.
//!
//! Each transport is a ping-pong between two processes: this process is the client and
//! times every round trip; a re-executed child (a [`Role`], see
//! [`ictus_bench::child`]) is the server. Per round trip the client sends `size` bytes
//! and waits for a `reply_len`-byte reply. The paper's in-line IPC server replied with
//! a bare `KERN_SUCCESS`, so the ipc experiment uses a small fixed reply;
//! `reply_len == size` gives a true echo. For fairness every server touches each page
//! it receives (one byte per 4 KiB, summed into `black_box`), as the paper's receivers
//! did.
//!
//! - [`echo`]: `AF_UNIX SOCK_SEQPACKET` and pipes;
//! - [`futex`]: a futex over a shared memfd;
//! - [`ports`]: ictus ports (ours), and the stub-overhead pair;
//! - [`cyclictest`]: rt-tests' `cyclictest`, the peer of the timing experiments.
//!
//! An experiment that uses a transport lists its role (`ROLE`) in its
//! [`ictus_bench::Experiment::roles`].
//!
//! [`Role`]: ictus_bench::Role

use std::hint::black_box;
use std::io;

use ictus_bench::Throughput;
use std::time::{Duration, Instant};

pub mod cyclictest;
pub mod echo;
pub mod futex;
pub mod ports;

/// Reply size of the round-trip transports (bytes): small, like the paper's
/// `KERN_SUCCESS` reply.
pub const REPLY_LEN: usize = 8;

/// Largest record or write the stream peers issue at once.
pub const CHUNK: usize = 64 * 1024;
/// Page size assumed when touching received data.
pub const PAGE: usize = 4096;
/// Largest message a server accepts (a guard against a corrupt header).
pub const MAX_MESSAGE: usize = 1 << 30;
/// How long a server or client waits on a stalled peer before it checks that the peer
/// is still there.
pub(crate) const LIVENESS_POLL: Duration = Duration::from_millis(200);
/// How long a server gets to exit by itself once told to, before it is killed.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Reads one byte per page (and the last byte) of `data` and returns their sum, so the
/// receiver really maps and reads what it received.
pub fn touch_pages(data: &[u8]) -> u64 {
    let mut sum: u64 = data.iter().step_by(PAGE).map(|&b| u64::from(b)).sum();
    if let Some(&last) = data.last() {
        sum += u64::from(last);
    }
    black_box(sum)
}

/// A message pattern that is not all zeros, so pages hold real data.
pub(crate) fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 + 1).collect()
}

pub(crate) fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

pub(crate) fn check_sizes(size: usize, reply_len: usize) -> io::Result<()> {
    if size == 0 || reply_len == 0 {
        // A zero-length record is indistinguishable from end-of-file.
        return Err(invalid("message and reply must be at least one byte"));
    }
    if size > MAX_MESSAGE || reply_len > MAX_MESSAGE {
        return Err(invalid(format!("messages are limited to {MAX_MESSAGE} bytes")));
    }
    Ok(())
}

pub(crate) fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Exit status of a server role: end-of-file or a vanished parent mid-batch is a normal
/// way to be told to stop.
pub(crate) fn server_status(role: &str, result: io::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) if matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe) => 0,
        Err(e) => {
            eprintln!("{role}: {e}");
            1
        }
    }
}

/// `memcpy` bandwidth (the paper's `bcopy` line) between two preallocated buffers of
/// `size` bytes, in MB/s (decimal): `repeats` runs, each copying about
/// `bytes_per_run` bytes (at least once), summarized as median, min and max.
pub fn memcpy_bandwidth(size: usize, repeats: usize, bytes_per_run: usize) -> Option<Throughput> {
    if size == 0 {
        return None;
    }
    let source = pattern(size);
    // Written once up front so page faults stay out of the timing.
    let mut destination = vec![0u8; size];
    destination.copy_from_slice(&source);
    // Capped so that tiny sizes, dominated by loop overhead, do not take seconds.
    let copies = (bytes_per_run / size).clamp(1, 1_000_000);
    let runs: Vec<f64> = (0..repeats)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..copies {
                // black_box on both sides: the source may have changed, and the
                // destination may be read, so no copy can be merged or dropped.
                destination.copy_from_slice(black_box(&source));
                black_box(&mut destination);
            }
            let ns = start.elapsed().as_nanos().max(1) as f64;
            (size * copies) as f64 / ns * 1000.0
        })
        .collect();
    Throughput::from_runs(&runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_reads_every_page_and_the_last_byte() {
        let mut data = vec![0u8; 3 * PAGE + 10];
        data[0] = 1;
        data[PAGE] = 2;
        data[2 * PAGE] = 4;
        data[3 * PAGE] = 8;
        *data.last_mut().expect("non-empty") = 16;
        assert_eq!(touch_pages(&data), 31);
        assert_eq!(touch_pages(&[]), 0);
    }

    #[test]
    fn memcpy_reports_a_positive_rate() {
        let t = memcpy_bandwidth(4096, 3, 1 << 20).expect("rates");
        assert_eq!(t.runs, 3);
        assert!(t.min > 0.0 && t.min <= t.median && t.median <= t.max);
        assert!(memcpy_bandwidth(0, 3, 1).is_none());
    }
}
