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
    /// Slots released at `start` at once (a catch-up), before the periodic ones.
    lead: u64,
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
        Pacer { start, period, lead: 0, next_slot: 0, sent: 0, late: 0, max_late: 0 }
    }

    /// A pacer whose first `lead` slots are all released at `start`, the rest one per
    /// period after them: a stream that resumes behind its player's clock (its player
    /// cut off, a new node taking over) catches up by `lead` slots at once, then keeps
    /// the rate. Every slot's deadline is one period after its release, as without lead.
    pub fn with_lead(start: u64, chunk: u64, rate: f64, lead: u64) -> Pacer {
        Pacer { lead, ..Pacer::new(start, chunk, rate) }
    }

    /// Release time of slot `k`.
    fn release(&self, k: u64) -> u64 {
        self.start.saturating_add(k.saturating_sub(self.lead).saturating_mul(self.period))
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
        ((now - self.start) / self.period + 1).saturating_add(self.lead).saturating_sub(self.next_slot)
    }

    /// Release time of the next slot not yet sent.
    pub fn next_release(&self) -> u64 {
        self.release(self.next_slot)
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
    fn a_lead_releases_its_slots_at_once_then_the_rate_holds() {
        // 100 ms slots, 3 of lead, from 1 s.
        let s = 1_000_000_000;
        let mut p = Pacer::with_lead(s, 100_000, 1e6, 3);
        assert_eq!(p.due(s - 1), 0);
        assert_eq!(p.due(s), 4, "the lead and slot 0");
        for _ in 0..4 {
            assert_eq!(p.sent_at(s + 1_000_000), 0, "sent within their period: on time");
        }
        assert_eq!(p.due(s + 50_000_000), 0);
        assert_eq!(p.next_release(), s + 100_000_000, "slot 4 is the first periodic one after slot 0");
        assert_eq!(p.due(s + 100_000_000), 1);
        assert_eq!(p.sent_at(s + 250_000_000), 50_000_000);
        assert_eq!((p.sent, p.late), (5, 1));
        // Over a long run the rate is the rate: lead + elapsed periods.
        assert_eq!(p.due(s + 10_000_000_000), 3 + 101 - 5);
    }

    #[test]
    fn a_zero_rate_never_releases_a_second_slot() {
        let p = Pacer::new(0, 100, 0.0);
        assert_eq!(p.due(u64::MAX / 2), 1);
    }
}
