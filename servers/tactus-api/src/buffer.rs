//! Buffer levels and underruns of a stream (pure).
//!
//! A stream's buffer is what the server holds of it: items queued and the bytes they
//! take, and how far ahead of the presentation's position they reach (the *level*,
//! in logical nanoseconds: the client's margin against a hiccup). An *underrun* is a
//! moment when the stream had nothing to present: the last item handed over has
//! ended (logical time is past its end), nothing is queued, and the client has not
//! said the stream ended. It is counted once per dry spell, however long it lasts.

/// A stream's buffer account.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferAccount {
    /// Items queued.
    pub items: u64,
    /// Bytes queued.
    pub bytes: u64,
    /// Logical end (ns) of the latest item received, if any.
    pub horizon: Option<i64>,
    /// Logical end of the last item handed over.
    pub delivered_end: Option<i64>,
    /// Dry spells so far.
    pub underruns: u64,
    /// Whether the stream is dry now.
    pub dry: bool,
    /// The client said no more items come (until a seek).
    pub ended: bool,
    /// The most items ever queued at once.
    pub peak_items: u64,
}

impl BufferAccount {
    /// An item of `bytes` bytes reaching logical time `end` was queued.
    pub fn queued(&mut self, bytes: u64, end: i64) {
        self.items += 1;
        self.bytes += bytes;
        self.peak_items = self.peak_items.max(self.items);
        self.horizon = Some(self.horizon.map_or(end, |h| h.max(end)));
        self.dry = false;
    }

    /// An item of `bytes` left the queue: handed over (`Some(end)`) or dropped
    /// (`None`).
    pub fn left(&mut self, bytes: u64, delivered_end: Option<i64>) {
        self.items = self.items.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
        if let Some(e) = delivered_end {
            self.delivered_end = Some(self.delivered_end.map_or(e, |d| d.max(e)));
        }
    }

    /// A seek or a restart: what was queued is gone, the past does not count.
    pub fn flushed(&mut self) {
        self.items = 0;
        self.bytes = 0;
        self.horizon = None;
        self.delivered_end = None;
        self.dry = false;
        self.ended = false;
    }

    /// Look at the stream at logical time `position` (while its presentation runs):
    /// counts an underrun when it goes dry. Returns whether it is dry.
    pub fn check(&mut self, position: i64) -> bool {
        let dry = !self.ended && self.items == 0 && self.delivered_end.is_some_and(|e| position > e);
        if dry && !self.dry {
            self.underruns += 1;
        }
        self.dry = dry;
        dry
    }

    /// How far ahead of `position` the queued items reach (ns); 0 when nothing is
    /// queued past it.
    pub fn level(&self, position: i64) -> u64 {
        if self.items == 0 {
            return 0;
        }
        self.horizon.map_or(0, |h| h.saturating_sub(position).max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    #[test]
    fn levels_follow_what_is_queued() {
        let mut b = BufferAccount::default();
        for i in 0..10 {
            b.queued(1000, (i + 1) * 100 * MS);
        }
        assert_eq!(b.level(0), 1000 * MS as u64);
        assert_eq!(b.level(250 * MS), 750 * MS as u64);
        assert_eq!((b.items, b.bytes, b.peak_items), (10, 10_000, 10));
        b.left(1000, Some(100 * MS));
        assert_eq!((b.items, b.bytes), (9, 9000));
    }

    #[test]
    fn a_dry_spell_is_one_underrun() {
        let mut b = BufferAccount::default();
        // Nothing delivered yet: not dry (the stream has not begun).
        assert!(!b.check(5 * MS));
        b.queued(10, 100 * MS);
        b.left(10, Some(100 * MS));
        assert!(!b.check(99 * MS));
        assert!(!b.check(100 * MS));
        for t in 101..200 {
            assert!(b.check(t * MS));
        }
        assert_eq!(b.underruns, 1);
        b.queued(10, 300 * MS);
        assert!(!b.check(250 * MS));
        b.left(10, Some(300 * MS));
        assert!(b.check(301 * MS));
        assert_eq!(b.underruns, 2);
    }

    #[test]
    fn an_ended_stream_never_underruns_and_a_flush_forgets() {
        let mut b = BufferAccount::default();
        b.queued(10, 100 * MS);
        b.left(10, Some(100 * MS));
        b.ended = true;
        assert!(!b.check(500 * MS));
        assert_eq!(b.underruns, 0);
        b.queued(10, 700 * MS);
        b.flushed();
        assert_eq!((b.items, b.bytes, b.level(0)), (0, 0, 0));
        assert!(!b.ended);
        assert!(!b.check(800 * MS));
    }

    #[test]
    fn drops_do_not_move_the_delivered_end() {
        let mut b = BufferAccount::default();
        b.queued(10, 100 * MS);
        b.queued(10, 200 * MS);
        b.left(10, Some(100 * MS));
        b.left(10, None);
        assert_eq!(b.delivered_end, Some(100 * MS));
        assert!(b.check(150 * MS));
    }
}
