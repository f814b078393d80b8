//! What to do with an item at a given moment, and the counts kept per stream (pure).
//!
//! Every item is judged when the delivery thread looks at it ([`judge`]): still early
//! (wait until its device's lead time), on time, late but shown, or late and dropped.
//! A stream's [`LatePolicy`] says how late is too late: a video stream usually drops
//! a frame that would be shown more than half a frame late (the next one is nearly
//! due), a MIDI stream plays every note (a missing note is worse than a late one), an
//! audio stream trims what has already passed.

use std::time::Duration;

/// How a stream treats an item that is late.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatePolicy {
    /// Deliver it anyway, counted late.
    Show,
    /// Drop it if it is later than `after`; deliver it (counted late) otherwise.
    DropAfter(Duration),
}

impl LatePolicy {
    /// The wire form: `u32::MAX` for [`LatePolicy::Show`], else microseconds.
    pub fn to_wire(self) -> u32 {
        match self {
            LatePolicy::Show => u32::MAX,
            LatePolicy::DropAfter(d) => u32::try_from(d.as_micros()).unwrap_or(u32::MAX - 1).min(u32::MAX - 1),
        }
    }

    /// From the wire form.
    pub fn from_wire(w: u32) -> LatePolicy {
        if w == u32::MAX {
            LatePolicy::Show
        } else {
            LatePolicy::DropAfter(Duration::from_micros(u64::from(w)))
        }
    }
}

/// What to do with an item now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not yet: hand it to its device at this time (due − lead).
    Wait(u64),
    /// Hand it over now; `late_ns` is how late it is (0 if on time or early).
    Deliver {
        /// Nanoseconds past its due time.
        late_ns: u64,
    },
    /// Drop it: this late.
    Drop {
        /// Nanoseconds past its due time.
        late_ns: u64,
    },
}

/// Judge an item due at `due` (system ns) for a device that takes items `lead` early,
/// at system time `now`. An item counts as late once `now` is past its due time by
/// more than `grace` (the delivery thread's own expected wake-up latency is not
/// lateness of the item).
pub fn judge(policy: LatePolicy, now: u64, due: u64, lead: Duration, grace: Duration) -> Verdict {
    let lead = lead.as_nanos().min(u128::from(u64::MAX)) as u64;
    let hand_at = due.saturating_sub(lead);
    if now < hand_at {
        return Verdict::Wait(hand_at);
    }
    let late_ns = now.saturating_sub(due);
    if late_ns <= grace.as_nanos().min(u128::from(u64::MAX)) as u64 {
        return Verdict::Deliver { late_ns };
    }
    match policy {
        LatePolicy::Show => Verdict::Deliver { late_ns },
        LatePolicy::DropAfter(d) if u128::from(late_ns) > d.as_nanos() => Verdict::Drop { late_ns },
        LatePolicy::DropAfter(_) => Verdict::Deliver { late_ns },
    }
}

/// A stream's delivery counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Items handed to the device in time.
    pub on_time: u64,
    /// Items handed over late (shown late).
    pub late: u64,
    /// Items dropped as too late.
    pub dropped: u64,
    /// Items flushed: a seek or a close made them never due.
    pub flushed: u64,
    /// Items refused: malformed for their stream (wrong size, unknown epoch).
    pub refused: u64,
}

impl Counts {
    /// Count a verdict that was acted on.
    pub fn count(&mut self, v: Verdict, grace: Duration) {
        match v {
            Verdict::Wait(_) => {}
            Verdict::Deliver { late_ns } if u128::from(late_ns) <= grace.as_nanos() => self.on_time += 1,
            Verdict::Deliver { .. } => self.late += 1,
            Verdict::Drop { .. } => self.dropped += 1,
        }
    }

    /// Items accounted for.
    pub fn total(&self) -> u64 {
        self.on_time + self.late + self.dropped + self.flushed + self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn early_items_wait_for_their_lead() {
        let v = judge(LatePolicy::Show, 100 * MS, 150 * MS, Duration::from_millis(20), Duration::ZERO);
        assert_eq!(v, Verdict::Wait(130 * MS));
        let v = judge(LatePolicy::Show, 130 * MS, 150 * MS, Duration::from_millis(20), Duration::ZERO);
        assert_eq!(v, Verdict::Deliver { late_ns: 0 });
    }

    #[test]
    fn show_delivers_however_late() {
        let v = judge(LatePolicy::Show, 10_000 * MS, 150 * MS, Duration::ZERO, Duration::ZERO);
        assert_eq!(v, Verdict::Deliver { late_ns: 9_850 * MS });
    }

    #[test]
    fn drop_after_a_bound() {
        let p = LatePolicy::DropAfter(Duration::from_millis(16));
        assert_eq!(judge(p, 110 * MS, 100 * MS, Duration::ZERO, Duration::ZERO), Verdict::Deliver { late_ns: 10 * MS });
        assert_eq!(judge(p, 117 * MS, 100 * MS, Duration::ZERO, Duration::ZERO), Verdict::Drop { late_ns: 17 * MS });
    }

    #[test]
    fn grace_is_not_lateness() {
        let mut c = Counts::default();
        let g = Duration::from_micros(200);
        let p = LatePolicy::DropAfter(Duration::ZERO);
        let v = judge(p, 100 * MS + 150_000, 100 * MS, Duration::ZERO, g);
        assert_eq!(v, Verdict::Deliver { late_ns: 150_000 });
        c.count(v, g);
        let v = judge(p, 100 * MS + 250_000, 100 * MS, Duration::ZERO, g);
        assert_eq!(v, Verdict::Drop { late_ns: 250_000 });
        c.count(v, g);
        let v = judge(LatePolicy::Show, 100 * MS + 250_000, 100 * MS, Duration::ZERO, g);
        c.count(v, g);
        assert_eq!(c, Counts { on_time: 1, late: 1, dropped: 1, flushed: 0, refused: 0 });
        assert_eq!(c.total(), 3);
    }

    #[test]
    fn policies_round_trip_the_wire() {
        for p in
            [LatePolicy::Show, LatePolicy::DropAfter(Duration::ZERO), LatePolicy::DropAfter(Duration::from_millis(40))]
        {
            assert_eq!(LatePolicy::from_wire(p.to_wire()), p);
        }
        // An absurd bound saturates below "show".
        assert_ne!(LatePolicy::DropAfter(Duration::from_secs(1 << 40)).to_wire(), u32::MAX);
    }

    #[test]
    fn on_a_virtual_clock_a_stream_of_frames_counts_each_once() {
        // 30 frames at 10 fps; the delivery thread wakes 2 ms after each due time,
        // except that it stalls for 250 ms around frame 10.
        let p = LatePolicy::DropAfter(Duration::from_millis(50));
        let g = Duration::from_micros(500);
        let mut c = Counts::default();
        let mut now = 0u64;
        for i in 0..30u64 {
            let due = 1_000 * MS + i * 100 * MS;
            now = now.max(due + 2 * MS);
            if i == 10 {
                now += 250 * MS;
            }
            let v = judge(p, now, due, Duration::ZERO, g);
            c.count(v, g);
        }
        // Frame 10 is 252 ms late (dropped), 11 is 152 ms late (dropped), 12 is 52 ms
        // late (dropped), 13 is on the stalled thread's heels: 0 ms behind + 2 → late.
        assert_eq!(c.dropped, 3);
        assert_eq!(c.late, 27);
        assert_eq!(c.total(), 30);
    }
}
