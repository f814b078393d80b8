//! How far ahead a real-time stream reads, from the device's **measured** latency.
//!
//! A paced stream consumes `rate` bytes/s. Its reads wait in queues the server does not
//! own — the kernel's scheduler and the device's queue, shared with other processes'
//! I/O that no user-space server can reorder. By Little's law a stream that must get
//! `rate` from a queue whose latency is `L` needs `rate · L` bytes in flight; and
//! because a latency can jump (another process starts reading) faster than the server
//! can see it, a stream also keeps a *buffer* of read data ahead of its sending clock,
//! the way a player buffers ahead of its playback clock. So:
//!
//! - **in flight**: `rate · margin · L / chunk + 1` chunks may be in the device at once
//!   (the engine's per-device queue limit grows by what its real-time streams need, so
//!   the paper's short "adapter queue" does not starve them once other processes fill
//!   the device);
//! - **read-ahead** (the stream's buffer chain): `rate · max(floor, margin · L) / chunk
//!   + 1` chunks, where `floor` is the time a latency jump must be covered for
//!   (half a second by default) and `L` the latency measured now.
//!
//! `L` is [`LatencyWindow::high`]: the worst completion time of the device's reads over
//! the last few seconds, and at least the age of its oldest read still in flight (so a
//! device that suddenly stalls raises it before anything completes).
//!
//! Pure: time is a parameter (nanoseconds on any monotonic clock).

/// The worst latency seen over a sliding window of time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyWindow {
    bucket_ns: u64,
    /// (bucket number, worst sample in it), newest last.
    buckets: [(u64, u64); BUCKETS],
}

/// Buckets of a [`LatencyWindow`].
pub const BUCKETS: usize = 8;

impl LatencyWindow {
    /// A window remembering samples for about `horizon_ns` (in [`BUCKETS`] steps).
    pub fn new(horizon_ns: u64) -> LatencyWindow {
        LatencyWindow { bucket_ns: (horizon_ns / BUCKETS as u64).max(1), buckets: [(0, 0); BUCKETS] }
    }

    /// Records a read that took `sample_ns`, completing at `now`.
    pub fn record(&mut self, now: u64, sample_ns: u64) {
        let b = now / self.bucket_ns;
        let slot = &mut self.buckets[(b % BUCKETS as u64) as usize];
        if slot.0 != b {
            *slot = (b, 0);
        }
        slot.1 = slot.1.max(sample_ns);
    }

    /// The worst sample of the window ending at `now`, and at least `oldest_in_flight`
    /// (the age of the oldest read not yet complete, 0 if none).
    pub fn high(&self, now: u64, oldest_in_flight: u64) -> u64 {
        let b = now / self.bucket_ns;
        let recent = self
            .buckets
            .iter()
            .filter(|(n, _)| *n + (BUCKETS as u64) > b && *n <= b)
            .map(|(_, s)| *s)
            .max()
            .unwrap_or(0);
        recent.max(oldest_in_flight)
    }
}

/// How a real-time stream sizes its reads ahead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReadAhead {
    /// The least time of stream kept read ahead (ns): what a latency jump must be
    /// covered for before the measured latency shows it.
    pub floor_ns: u64,
    /// Latency is multiplied by this (≥ 1) for headroom.
    pub margin: f64,
    /// The most chunks one stream may hold.
    pub max_chunks: usize,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead { floor_ns: 500_000_000, margin: 2.0, max_chunks: 64 }
    }
}

impl ReadAhead {
    fn chunks(rate: f64, chunk: u64, lead_ns: f64) -> usize {
        if !(rate.is_finite() && rate > 0.0) || chunk == 0 {
            return 1;
        }
        let bytes = rate * lead_ns / 1e9;
        (bytes / chunk as f64).ceil().min(1e6) as usize + 1
    }

    /// Chunks a stream of `rate` bytes/s may have in the device at once when its reads
    /// take `latency_ns` (Little's law with the margin), at most [`Self::max_chunks`].
    pub fn in_flight(&self, rate: f64, chunk: u64, latency_ns: u64) -> usize {
        Self::chunks(rate, chunk, self.margin.max(1.0) * latency_ns as f64).min(self.max_chunks.max(1))
    }

    /// Chunks a stream of `rate` bytes/s keeps read ahead of its sending clock when its
    /// reads take `latency_ns`, at most [`Self::max_chunks`] and at least 2 (one being
    /// sent, one read).
    pub fn window(&self, rate: f64, chunk: u64, latency_ns: u64) -> usize {
        let lead = (self.floor_ns as f64).max(self.margin.max(1.0) * latency_ns as f64);
        Self::chunks(rate, chunk, lead).clamp(2, self.max_chunks.max(2))
    }

    /// The chunks of buffer a stream at `rate` holds on a quiet device (its floor's
    /// worth): what admission reserves for it in the buffer pool. A busier device
    /// grows the window past it, up to [`Self::max_chunks`], from the buffers not
    /// reserved.
    pub fn floor_window(&self, rate: f64, chunk: u64) -> usize {
        self.window(rate, chunk, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_window_remembers_the_worst_of_its_horizon_and_forgets_older() {
        let mut w = LatencyWindow::new(2_000 * MS); // 8 buckets of 250 ms
        assert_eq!(w.high(0, 0), 0);
        w.record(10 * MS, 6 * MS);
        w.record(20 * MS, 170 * MS);
        w.record(300 * MS, 8 * MS);
        assert_eq!(w.high(400 * MS, 0), 170 * MS);
        assert_eq!(w.high(1_900 * MS, 0), 170 * MS, "still inside the horizon");
        assert_eq!(w.high(2_100 * MS, 0), 8 * MS, "the 170 ms bucket has aged out");
        assert_eq!(w.high(2_400 * MS, 0), 0, "everything aged out");
        assert_eq!(w.high(2_400 * MS, 90 * MS), 90 * MS, "a read stuck in flight counts");
        // A bucket reused after wrapping starts empty.
        w.record(4_000 * MS, 5 * MS);
        assert_eq!(w.high(4_000 * MS, 0), 5 * MS);
    }

    #[test]
    fn read_ahead_follows_littles_law_with_a_floor() {
        let ra = ReadAhead { floor_ns: 500 * MS, margin: 2.0, max_chunks: 64 };
        let chunk = 256 << 10;
        // 64 chunks/s, 15.6 ms each.
        let rate = 16.8e6;
        // Quiet device: 6 ms reads — one chunk in flight, the floor's half second read ahead.
        assert_eq!(ra.in_flight(rate, chunk, 6 * MS), 2);
        assert_eq!(ra.window(rate, chunk, 6 * MS), 34);
        // Busy device: 170 ms reads need 2·170 ms·16.8 MB/s = 5.7 MB in flight.
        assert_eq!(ra.in_flight(rate, chunk, 170 * MS), 23);
        assert_eq!(ra.window(rate, chunk, 170 * MS), 34);
        // Slower still: the latency, not the floor, sizes the window, up to the cap.
        assert_eq!(ra.window(rate, chunk, 400 * MS), 53);
        assert_eq!(ra.window(rate, chunk, 4_000 * MS), 64);
        assert_eq!(ra.in_flight(rate, chunk, 4_000 * MS), 64);
        assert_eq!(ra.floor_window(rate, chunk), 34);
        // Nonsense rates ask for the least.
        assert_eq!(ra.window(f64::NAN, chunk, 6 * MS), 2);
        assert_eq!(ra.in_flight(0.0, chunk, 6 * MS), 1);
    }
}
