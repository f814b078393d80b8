//! What to fetch next for one stream: the pure core of prefetching, on positions and
//! virtual time, no I/O.
//!
//! A stream consumes an object from some position at some rate (its schedule). The
//! planner keeps every chunk from the consumer's position up to `window` bytes ahead
//! requested, with at most `max_in_flight` requests outstanding: a stream whose store is
//! remote still finds its next bytes local when their deadline comes, as long as the
//! store delivers faster than the stream consumes and the window covers the store's
//! latency (see [`Window::for_rate`]). A jump of the consumer (a seek) outside what is
//! requested restarts the plan at the new position.

use std::time::Duration;

/// A stream's prefetch window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Bytes per request (a multiple of the stripe unit reads whole units).
    pub chunk: u64,
    /// Bytes ahead of the consumer to keep requested.
    pub ahead: u64,
    /// Requests outstanding at most.
    pub max_in_flight: usize,
}

impl Window {
    /// The window for a stream of `rate` bytes/s over a store answering a chunk within
    /// `latency`: `lead` of playing time ahead, and at least enough to cover two chunk
    /// latencies at the stream's rate, and two chunks. Requests in flight: enough for the
    /// window, at least 2.
    pub fn for_rate(rate: u64, chunk: u64, lead: Duration, latency: Duration) -> Window {
        let chunk = chunk.max(4096);
        let by_time = |d: Duration| (rate as u128 * d.as_nanos() / 1_000_000_000).min(u64::MAX as u128) as u64;
        let ahead = by_time(lead).max(by_time(latency).saturating_mul(2)).max(chunk.saturating_mul(2));
        let max_in_flight = ahead.div_ceil(chunk).clamp(2, 64) as usize;
        Window { chunk, ahead, max_in_flight }
    }
}

/// One request to start: `len` bytes at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetch {
    /// First byte.
    pub offset: u64,
    /// Bytes (a whole chunk, or the object's tail).
    pub len: u64,
}

/// The plan of one stream over an object of `len` bytes.
#[derive(Clone, Debug)]
pub struct Planner {
    len: u64,
    window: Window,
    /// Chunks before this one (down to `base`) are requested or held.
    next: u64,
    /// Start of what is requested or held: a chunk boundary at or before the consumer.
    base: u64,
    in_flight: usize,
    /// Incremented by every restart: completions of an older epoch are stale.
    epoch: u64,
}

impl Planner {
    /// A plan for an object of `len` bytes read from position 0.
    pub fn new(len: u64, window: Window) -> Planner {
        let window = Window { chunk: window.chunk.max(1), max_in_flight: window.max_in_flight.max(1), ..window };
        Planner { len, window, next: 0, base: 0, in_flight: 0, epoch: 0 }
    }

    /// The window.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Requests outstanding.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The current epoch (tag each request with it; see [`Planner::complete`]).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The end of what is requested or held.
    pub fn requested_end(&self) -> u64 {
        self.next
    }

    fn align(&self, pos: u64) -> u64 {
        pos - pos % self.window.chunk
    }

    /// The consumer is at `pos`: the requests to start now (in order). A `pos` outside
    /// `[base, next]` (a seek) restarts the plan there; requests of the old epoch still
    /// in flight count against the limit until they complete.
    pub fn advance(&mut self, pos: u64) -> Vec<Fetch> {
        let pos = pos.min(self.len);
        if pos < self.base || pos > self.next {
            self.epoch += 1;
            self.base = self.align(pos);
            self.next = self.base;
        } else {
            self.base = self.align(pos).max(self.base);
        }
        let horizon = pos.saturating_add(self.window.ahead).min(self.len);
        let mut out = Vec::new();
        while self.next < horizon && self.in_flight < self.window.max_in_flight {
            let len = self.window.chunk.min(self.len - self.next);
            out.push(Fetch { offset: self.next, len });
            self.next += len;
            self.in_flight += 1;
        }
        out
    }

    /// A request has completed (whatever its epoch); returns whether its bytes are
    /// still wanted (its epoch is current and it is not behind the consumer's chunk).
    pub fn complete(&mut self, fetch: Fetch, epoch: u64) -> bool {
        self.in_flight = self.in_flight.saturating_sub(1);
        epoch == self.epoch && fetch.offset + fetch.len > self.base
    }

    /// A request failed: the plan restarts at `pos` at the next advance.
    pub fn failed(&mut self, pos: u64) {
        self.epoch += 1;
        self.base = self.align(pos.min(self.len));
        self.next = self.base;
    }
}

/// A stream's schedule: byte `start` is due at time `t0`, then `rate` bytes per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Time (any clock, ns) at which `start` is due.
    pub t0_ns: u64,
    /// First byte.
    pub start: u64,
    /// Bytes per second (at least 1).
    pub rate: u64,
}

impl Schedule {
    /// The position due at `now_ns` (`start` before `t0`).
    pub fn position(&self, now_ns: u64) -> u64 {
        let dt = now_ns.saturating_sub(self.t0_ns) as u128;
        let p = self.start as u128 + dt * self.rate.max(1) as u128 / 1_000_000_000;
        p.min(u64::MAX as u128) as u64
    }

    /// When byte `offset` is due (ns).
    pub fn deadline(&self, offset: u64) -> u64 {
        let d = offset.saturating_sub(self.start) as u128 * 1_000_000_000 / self.rate.max(1) as u128;
        (self.t0_ns as u128 + d).min(u64::MAX as u128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keeps_the_window_requested_and_no_more() {
        let w = Window { chunk: 100, ahead: 350, max_in_flight: 10 };
        let mut p = Planner::new(1000, w);
        let f = p.advance(0);
        assert_eq!(f.iter().map(|f| f.offset).collect::<Vec<_>>(), vec![0, 100, 200, 300]);
        for x in &f {
            assert!(p.complete(*x, p.epoch()));
        }
        assert_eq!(p.advance(50), vec![]);
        assert_eq!(p.advance(60), vec![Fetch { offset: 400, len: 100 }]);
        // The tail is short; nothing past the end.
        let f = p.advance(900);
        assert_eq!(f.last(), Some(&Fetch { offset: 900, len: 100 }));
        assert!(p.advance(1000).is_empty());
    }

    #[test]
    fn a_seek_restarts_and_old_completions_are_stale() {
        let w = Window { chunk: 100, ahead: 200, max_in_flight: 4 };
        let mut p = Planner::new(10_000, w);
        let old = p.advance(0);
        let e0 = p.epoch();
        let f = p.advance(5_050);
        assert_eq!(f.first(), Some(&Fetch { offset: 5_000, len: 100 }));
        // Only 2 more fit: the 2 old requests still count.
        assert_eq!(f.len(), 2);
        assert!(!p.complete(old[0], e0));
        assert!(p.complete(f[0], p.epoch()));
    }

    #[test]
    fn window_for_rate() {
        // 1 MB/s, 2 s lead, 50 ms latency: 2 MB ahead in 256 KiB chunks.
        let w = Window::for_rate(1_000_000, 256 << 10, Duration::from_secs(2), Duration::from_millis(50));
        assert_eq!(w.ahead, 2_000_000);
        assert_eq!(w.max_in_flight, 8);
        // A tiny lead still covers two latencies and two chunks.
        let w = Window::for_rate(1_000_000, 4096, Duration::ZERO, Duration::from_millis(100));
        assert_eq!(w.ahead, 200_000);
    }

    #[test]
    fn schedule_positions_and_deadlines_agree() {
        let s = Schedule { t0_ns: 1_000, start: 500, rate: 2_000_000 };
        assert_eq!(s.position(0), 500);
        assert_eq!(s.position(1_000 + 1_000_000_000), 2_000_500);
        assert_eq!(s.deadline(2_000_500), 1_000 + 1_000_000_000);
        assert_eq!(s.deadline(0), 1_000);
    }

    proptest! {
        /// Whatever the consumer does: never more requests in flight than allowed, never
        /// a byte past the end, never more than a chunk past the window; and while
        /// requests are allowed, everything from the consumer's chunk to the window's
        /// edge is requested.
        #[test]
        fn invariants_under_any_consumer(
            len in 1u64..100_000,
            chunk in 1u64..5_000,
            ahead in 0u64..20_000,
            max_in_flight in 1usize..8,
            steps in proptest::collection::vec((0u8..4, 0u64..100_000), 1..60),
        ) {
            let mut p = Planner::new(len, Window { chunk, ahead, max_in_flight });
            let mut flying: Vec<(Fetch, u64)> = Vec::new();
            let mut pos = 0u64;
            for (kind, x) in steps {
                match kind {
                    0 => pos = (pos + x % 3_000).min(len),   // play on
                    1 => pos = x % (len + 1),                // seek
                    _ => {                                   // some requests complete
                        let n = (x as usize % 3).min(flying.len());
                        for (f, e) in flying.drain(..n) { p.complete(f, e); }
                    }
                }
                let issued = p.advance(pos);
                let any = !issued.is_empty();
                for f in issued {
                    prop_assert!(f.len > 0 && f.offset + f.len <= len);
                    prop_assert!(f.offset % chunk == 0);
                    prop_assert!(f.offset < pos.saturating_add(ahead).max(pos + 1));
                    flying.push((f, p.epoch()));
                }
                prop_assert!(p.in_flight() <= max_in_flight);
                prop_assert_eq!(p.in_flight(), flying.len());
                let horizon = pos.saturating_add(ahead).min(len);
                if p.in_flight() < max_in_flight {
                    prop_assert!(p.requested_end() >= horizon);
                }
                // What it requests now reaches at most a chunk past the window (a consumer
                // that stepped back inside what was requested keeps what it had).
                if any {
                    prop_assert!(p.requested_end() <= horizon.max(pos) + chunk);
                }
            }
        }

        /// On a virtual clock: a store that answers each request after `latency` plus its
        /// transfer time at `bandwidth` (one transfer at a time), a stream of `rate` that
        /// starts playing once its first window is in. With the store at least 25 % faster
        /// than the stream and the window from `Window::for_rate` (lead covering the
        /// latency and a chunk's transfer), no chunk arrives after its deadline.
        #[test]
        fn a_fast_enough_store_never_makes_the_stream_late(
            rate in 100_000u64..20_000_000,
            speedup_pct in 125u64..400,
            latency_us in 0u64..50_000,
            chunk_kib in 16u64..1024,
            len_chunks in 4u64..200,
        ) {
            let chunk = chunk_kib << 10;
            let len = chunk * len_chunks - chunk / 3;
            let bandwidth = rate * speedup_pct / 100;
            let latency = latency_us * 1_000;
            let xfer = chunk as u128 * 1_000_000_000 / bandwidth as u128;
            let lead = Duration::from_nanos(latency + xfer as u64) * 2;
            let w = Window::for_rate(rate, chunk, lead, Duration::from_nanos(latency));
            let mut p = Planner::new(len, w);
            // Completion times of requests in flight, by offset.
            let mut flying: Vec<(Fetch, u64)> = Vec::new();
            let mut ready_at = std::collections::BTreeMap::new();
            let mut store_free = 0u64;
            let mut now = 0u64;
            let issue = |fs: Vec<Fetch>, now: u64, store_free: &mut u64, flying: &mut Vec<(Fetch, u64)>| {
                for f in fs {
                    let start = now.max(*store_free);
                    let t = f.len as u128 * 1_000_000_000 / bandwidth as u128;
                    *store_free = start + t as u64;
                    flying.push((f, *store_free + latency));
                }
            };
            issue(p.advance(0), now, &mut store_free, &mut flying);
            // Pre-roll: play starts when the first window's requests are all in.
            let t0 = flying.iter().map(|f| f.1).max().unwrap_or(0);
            let sched = Schedule { t0_ns: t0, start: 0, rate };
            // Step the clock through every event until the whole object is in.
            // The clock moves to the next completion, or by half a chunk's playing time.
            let tick = (chunk as u128 * 1_000_000_000 / rate as u128 / 2).max(1) as u64;
            while !(flying.is_empty() && p.requested_end() == len) {
                let t = flying.iter().map(|f| f.1).min().unwrap_or(u64::MAX).min(now.max(t0) + tick);
                now = t.max(now);
                let (done, rest): (Vec<_>, Vec<_>) = flying.into_iter().partition(|f| f.1 <= now);
                flying = rest;
                for (f, at) in done {
                    p.complete(f, p.epoch());
                    ready_at.insert(f.offset, at);
                }
                issue(p.advance(sched.position(now)), now, &mut store_free, &mut flying);
            }
            prop_assert_eq!(p.requested_end(), len);
            for (off, at) in ready_at {
                prop_assert!(at <= sched.deadline(off), "chunk at {} ready at {} after its deadline {}", off, at, sched.deadline(off));
            }
        }
    }
}
