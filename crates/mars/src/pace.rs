//! A paced stream's schedule: which slot is due, and which slots were late.
//!
//! A stream of `rate` bytes/s sent in chunks of `chunk` bytes has one slot per period
//! `chunk / rate`; slot *k* is released at `start + k·period` and must be sent by the
//! end of its period. The Real-Time Upcall of the stream runs once per period and sends
//! what is due; this records, on whatever clock the caller passes (nanoseconds), how
//! many slots were late and by how much. Time is a parameter, so the tests run on a
//! virtual clock.

/// One stream's slot accounting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pacer {
    start: u64,
    period: u64,
    next_slot: u64,
    /// Slots sent.
    pub sent: u64,
    /// Slots sent after their deadline.
    pub late: u64,
    /// Worst lateness (ns).
    pub max_late: u64,
}

impl Pacer {
    /// A pacer for chunks of `chunk` bytes at `rate` bytes/s, first slot at `start` (ns).
    pub fn new(start: u64, chunk: u64, rate: f64) -> Pacer {
        let period =
            if rate.is_finite() && rate > 0.0 { (chunk as f64 / rate * 1e9).max(1.0) as u64 } else { u64::MAX };
        Pacer { start, period, next_slot: 0, sent: 0, late: 0, max_late: 0 }
    }

    /// The period between slots (ns).
    pub fn period(&self) -> u64 {
        self.period
    }

    /// Slots released by `now` and not yet sent.
    pub fn due(&self, now: u64) -> u64 {
        if now < self.start {
            return 0;
        }
        ((now - self.start) / self.period + 1).saturating_sub(self.next_slot)
    }

    /// Release time of the next slot not yet sent.
    pub fn next_release(&self) -> u64 {
        self.start.saturating_add(self.next_slot.saturating_mul(self.period))
    }

    /// Records that the next slot was sent at `at`; returns its lateness (0 if on time).
    pub fn sent_at(&mut self, at: u64) -> u64 {
        let deadline = self.next_release().saturating_add(self.period);
        self.next_slot += 1;
        self.sent += 1;
        let late = at.saturating_sub(deadline);
        if late > 0 {
            self.late += 1;
            self.max_late = self.max_late.max(late);
        }
        late
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_on_a_virtual_clock() {
        // 1 MB/s in 100 kB chunks: one slot every 100 ms.
        let mut p = Pacer::new(1_000, 100_000, 1e6);
        assert_eq!(p.period(), 100_000_000);
        assert_eq!(p.due(0), 0);
        assert_eq!(p.due(1_000), 1);
        assert_eq!(p.sent_at(50_000_000), 0);
        assert_eq!(p.due(150_000_000), 1);
        assert_eq!(p.due(350_000_000), 3);
        // Slot 1 (released at 100 ms + 1 µs) sent at 250 ms: 49.999 ms late.
        assert_eq!(p.sent_at(250_000_000), 250_000_000 - 200_001_000);
        assert_eq!((p.sent, p.late), (2, 1));
        assert_eq!(p.next_release(), 200_001_000);
    }

    #[test]
    fn a_zero_rate_never_releases_a_second_slot() {
        let p = Pacer::new(0, 100, 0.0);
        assert_eq!(p.due(u64::MAX / 2), 1);
    }
}
