//! A presentation's logical-to-real time map (pure: time is a parameter).
//!
//! A client stamps every item with a *logical* time (nanoseconds of its presentation:
//! 0 is the start of the clip). The server decides when logical time runs: start,
//! pause, resume, seek and rate are changes of the map, each taking effect at an
//! instant of the presentation's *clock* (`CLOCK_MONOTONIC`, or a device's sample
//! clock that the other streams follow; see [`crate::drift`]).
//!
//! The map is a list of [`Segment`]s: from clock time `from` on, logical time is
//! `logical + (c − from) × rate` while running, or stays `logical` while paused or
//! stopped, until the next segment starts. Changes are scheduled at an instant that
//! the server chooses a little in the future (now + the longest device lead), so that
//! what devices were already given early stays right: a pause at `t` means that items
//! due before `t` still play.
//!
//! A seek starts a new *epoch*. Items carry the epoch they were made for; an item is
//! mapped only through the segments of its own epoch, so an item of the old epoch due
//! after the seek instant has no due time any more ([`Due::Never`]) and is flushed,
//! while the client sends the new epoch's items.

use std::collections::VecDeque;
use std::fmt;

/// A playback rate: logical nanoseconds per clock nanosecond, in `[1/16, 16]`.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Rate(f64);

impl Rate {
    /// Normal speed.
    pub const ONE: Rate = Rate(1.0);
    /// The slowest rate.
    pub const MIN: f64 = 1.0 / 16.0;
    /// The fastest rate.
    pub const MAX: f64 = 16.0;

    /// A rate, if finite and within [`Rate::MIN`], [`Rate::MAX`].
    pub fn new(r: f64) -> Option<Rate> {
        (r.is_finite() && (Rate::MIN..=Rate::MAX).contains(&r)).then_some(Rate(r))
    }

    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}×", self.0)
    }
}

/// Whether logical time runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Motion {
    /// Not started yet (or stopped): nothing is due.
    Stopped,
    /// Logical time runs at the segment's rate.
    Running,
    /// Logical time stands still.
    Paused,
}

/// One piece of the map: from clock time `from` on (until the next segment).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment {
    /// Clock time (ns) at which the segment starts.
    pub from: u64,
    /// Logical time (ns) at `from`.
    pub logical: i64,
    /// The rate while running.
    pub rate: Rate,
    /// Running, paused or stopped.
    pub motion: Motion,
    /// The epoch: bumped by every seek.
    pub epoch: u32,
}

impl Segment {
    fn logical_at(&self, clock: u64) -> i64 {
        match self.motion {
            Motion::Running => {
                let d = clock.saturating_sub(self.from) as f64 * self.rate.0;
                self.logical.saturating_add(d.min(i64::MAX as f64) as i64)
            }
            Motion::Stopped | Motion::Paused => self.logical,
        }
    }
}

/// When an item is due, as the map says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// At this clock time (ns).
    At(u64),
    /// Not known yet: the presentation is stopped or paused before this item's time.
    NotYet,
    /// Never: the item belongs to an epoch a seek has ended, or lies before its
    /// epoch's start. Flush it.
    Never,
}

/// Why a change was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// A change earlier than the last change.
    #[error("a change at {at} ns comes before the last change at {last} ns")]
    Backwards {
        /// The requested instant.
        at: u64,
        /// The last change.
        last: u64,
    },
    /// Resume or pause without a start.
    #[error("the presentation has not been started")]
    NotStarted,
    /// Too many epochs.
    #[error("no epochs left")]
    Epochs,
}

/// The most segments kept; the oldest are forgotten first (items mapped through them
/// are long late).
pub const MAX_SEGMENTS: usize = 64;

/// A presentation's time map.
#[derive(Clone, Debug)]
pub struct TimeMap {
    segs: VecDeque<Segment>,
}

impl Default for TimeMap {
    fn default() -> Self {
        TimeMap::new()
    }
}

impl TimeMap {
    /// A stopped map at logical 0, epoch 0.
    pub fn new() -> TimeMap {
        let mut segs = VecDeque::new();
        segs.push_back(Segment { from: 0, logical: 0, rate: Rate::ONE, motion: Motion::Stopped, epoch: 0 });
        TimeMap { segs }
    }

    /// The segments, oldest first.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segs.iter()
    }

    fn last(&self) -> &Segment {
        self.segs.back().expect("never empty")
    }

    /// The current epoch (that of the last change).
    pub fn epoch(&self) -> u32 {
        self.last().epoch
    }

    /// Whether logical time runs after the last change.
    pub fn motion(&self) -> Motion {
        self.last().motion
    }

    /// The rate after the last change.
    pub fn rate(&self) -> Rate {
        self.last().rate
    }

    /// The segment in force at `clock`.
    fn seg_at(&self, clock: u64) -> &Segment {
        let i = self.segs.partition_point(|s| s.from <= clock);
        &self.segs[i.saturating_sub(1)]
    }

    /// Logical time at clock time `clock`, and its epoch.
    pub fn logical_at(&self, clock: u64) -> (u32, i64) {
        let s = self.seg_at(clock);
        (s.epoch, s.logical_at(clock))
    }

    /// Whether logical time runs at clock time `clock`.
    pub fn motion_at(&self, clock: u64) -> Motion {
        self.seg_at(clock).motion
    }

    /// The rate in force at clock time `clock` (a change takes effect at its instant,
    /// so an item due before a pending change keeps the old rate).
    pub fn rate_at(&self, clock: u64) -> Rate {
        self.seg_at(clock).rate
    }

    fn push(&mut self, seg: Segment) -> Result<(), MapError> {
        let last = *self.last();
        if seg.from < last.from {
            return Err(MapError::Backwards { at: seg.from, last: last.from });
        }
        if seg.from == last.from {
            self.segs.pop_back();
        }
        self.segs.push_back(seg);
        while self.segs.len() > MAX_SEGMENTS {
            self.segs.pop_front();
        }
        Ok(())
    }

    /// Start (or restart) at clock time `at` from logical time `logical`, at the
    /// current rate, in the current epoch.
    pub fn start(&mut self, at: u64, logical: i64) -> Result<(), MapError> {
        let last = *self.last();
        self.push(Segment { from: at, logical, rate: last.rate, motion: Motion::Running, epoch: last.epoch })
    }

    /// Pause at `at`: logical time stands at what it is then.
    pub fn pause(&mut self, at: u64) -> Result<(), MapError> {
        let last = *self.last();
        match last.motion {
            Motion::Stopped => Err(MapError::NotStarted),
            Motion::Paused => Ok(()),
            Motion::Running => {
                self.push(Segment { from: at, logical: last.logical_at(at), motion: Motion::Paused, ..last })
            }
        }
    }

    /// Resume at `at` from where logical time stood.
    pub fn resume(&mut self, at: u64) -> Result<(), MapError> {
        let last = *self.last();
        match last.motion {
            Motion::Stopped => Err(MapError::NotStarted),
            Motion::Running => Ok(()),
            Motion::Paused => self.push(Segment { from: at, motion: Motion::Running, ..last }),
        }
    }

    /// Seek at `at` to logical time `logical`: a new epoch, running or paused as before.
    /// Returns the new epoch.
    pub fn seek(&mut self, at: u64, logical: i64) -> Result<u32, MapError> {
        let last = *self.last();
        let epoch = last.epoch.checked_add(1).ok_or(MapError::Epochs)?;
        self.push(Segment { from: at, logical, epoch, ..last })?;
        Ok(epoch)
    }

    /// Change the rate at `at`.
    pub fn set_rate(&mut self, at: u64, rate: Rate) -> Result<(), MapError> {
        let last = *self.last();
        self.push(Segment { from: at, logical: last.logical_at(at), rate, ..last })
    }

    /// When the item of epoch `epoch` at logical time `logical` is due.
    ///
    /// Only the segments of its epoch count. Within them, the item is due in the
    /// running segment whose logical span holds it (each segment spans up to the next
    /// one's start; the last running one without end). An item the epoch has already
    /// passed in a paused stretch is due when logical time next reaches it.
    pub fn due(&self, epoch: u32, logical: i64) -> Due {
        // Epochs only grow, so an epoch's segments are contiguous. Within an epoch
        // logical time never decreases: an item is due where it is first reached, and
        // an item that a start or a seek jumped over is never due.
        let mut found = false;
        for (i, s) in self.segs.iter().enumerate() {
            if s.epoch != epoch {
                if found {
                    // A seek ended the epoch before it reached this item.
                    return Due::Never;
                }
                continue;
            }
            found = true;
            let end = self.segs.get(i + 1).map(|t| t.from);
            match s.motion {
                Motion::Stopped => {
                    if end.is_none() {
                        return Due::NotYet;
                    }
                }
                Motion::Paused => {
                    if end.is_none() {
                        return if logical >= s.logical { Due::NotYet } else { Due::Never };
                    }
                }
                Motion::Running => {
                    if logical < s.logical {
                        return Due::Never;
                    }
                    let off = ((logical - s.logical) as f64 / s.rate.0).ceil();
                    let at = s.from.saturating_add(off.min(u64::MAX as f64) as u64);
                    if end.map_or(true, |e| at < e) {
                        return Due::At(at);
                    }
                }
            }
        }
        // The epoch was forgotten (long past) or not reached yet (a client ahead of its
        // own seek): either way nothing to play.
        Due::Never
    }

    /// Forget segments that ended before `clock` (keeping the one in force then).
    pub fn forget_before(&mut self, clock: u64) {
        while self.segs.len() > 1 && self.segs[1].from <= clock {
            self.segs.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn at(d: Due) -> u64 {
        match d {
            Due::At(t) => t,
            other => panic!("expected a due time, got {other:?}"),
        }
    }

    #[test]
    fn stopped_map_has_nothing_due() {
        let m = TimeMap::new();
        assert_eq!(m.due(0, 0), Due::NotYet);
        assert_eq!(m.logical_at(5 * S), (0, 0));
    }

    #[test]
    fn start_maps_logical_to_clock() {
        let mut m = TimeMap::new();
        m.start(10 * S, 0).unwrap();
        assert_eq!(at(m.due(0, 0)), 10 * S);
        assert_eq!(at(m.due(0, 2 * S as i64)), 12 * S);
        assert_eq!(m.logical_at(11 * S), (0, S as i64));
        // Before the start, logical time is where it will start.
        assert_eq!(m.logical_at(5 * S), (0, 0));
    }

    #[test]
    fn items_before_the_start_point_are_never_due() {
        let mut m = TimeMap::new();
        m.start(10 * S, 5 * S as i64).unwrap();
        assert_eq!(m.due(0, S as i64), Due::Never);
        assert_eq!(at(m.due(0, 5 * S as i64)), 10 * S);
    }

    #[test]
    fn pause_holds_and_resume_shifts_later_items() {
        let mut m = TimeMap::new();
        m.start(0, 0).unwrap();
        m.pause(3 * S).unwrap();
        // An item before the pause point is still due where it was.
        assert_eq!(at(m.due(0, 2 * S as i64)), 2 * S);
        // One after it is not due while paused.
        assert_eq!(m.due(0, 4 * S as i64), Due::NotYet);
        assert_eq!(m.logical_at(100 * S), (0, 3 * S as i64));
        m.resume(10 * S).unwrap();
        // Logical 4 s: 1 s after the pause point, 1 s after the resume.
        assert_eq!(at(m.due(0, 4 * S as i64)), 11 * S);
        // The pause point itself plays at the resume.
        assert_eq!(at(m.due(0, 3 * S as i64)), 10 * S);
        assert_eq!(at(m.due(0, 2 * S as i64)), 2 * S);
        assert_eq!(m.logical_at(12 * S), (0, 5 * S as i64));
    }

    #[test]
    fn seek_starts_an_epoch_and_flushes_the_old_one_after_it() {
        let mut m = TimeMap::new();
        m.start(0, 0).unwrap();
        let e = m.seek(5 * S, 60 * S as i64).unwrap();
        assert_eq!(e, 1);
        // Old epoch: due before the seek still plays, after it never.
        assert_eq!(at(m.due(0, 4 * S as i64)), 4 * S);
        assert_eq!(m.due(0, 6 * S as i64), Due::Never);
        // New epoch from 60 s at clock 5 s.
        assert_eq!(at(m.due(1, 61 * S as i64)), 6 * S);
        assert_eq!(m.due(1, 59 * S as i64), Due::Never);
        assert_eq!(m.logical_at(7 * S), (1, 62 * S as i64));
    }

    #[test]
    fn seek_while_paused_stays_paused() {
        let mut m = TimeMap::new();
        m.start(0, 0).unwrap();
        m.pause(S).unwrap();
        m.seek(2 * S, 30 * S as i64).unwrap();
        assert_eq!(m.due(1, 30 * S as i64), Due::NotYet);
        m.resume(4 * S).unwrap();
        assert_eq!(at(m.due(1, 30 * S as i64)), 4 * S);
        assert_eq!(at(m.due(1, 31 * S as i64)), 5 * S);
    }

    #[test]
    fn rate_changes_the_slope_from_its_instant() {
        let mut m = TimeMap::new();
        m.start(0, 0).unwrap();
        m.set_rate(2 * S, Rate::new(2.0).unwrap()).unwrap();
        assert_eq!(at(m.due(0, S as i64)), S);
        assert_eq!(m.logical_at(3 * S), (0, 4 * S as i64));
        assert_eq!(at(m.due(0, 4 * S as i64)), 3 * S);
        m.set_rate(4 * S, Rate::new(0.5).unwrap()).unwrap();
        // At clock 4 s logical is 6 s; logical 7 s is 2 clock seconds later.
        assert_eq!(at(m.due(0, 7 * S as i64)), 6 * S);
    }

    #[test]
    fn changes_cannot_go_back_in_time_and_same_instant_replaces() {
        let mut m = TimeMap::new();
        m.start(10 * S, 0).unwrap();
        assert!(matches!(m.pause(9 * S), Err(MapError::Backwards { .. })));
        m.pause(10 * S).unwrap();
        assert_eq!(m.segments().count(), 2);
        assert_eq!(m.due(0, 0), Due::NotYet);
    }

    #[test]
    fn pause_and_resume_need_a_start() {
        let mut m = TimeMap::new();
        assert_eq!(m.pause(S), Err(MapError::NotStarted));
        assert_eq!(m.resume(S), Err(MapError::NotStarted));
    }

    #[test]
    fn rates_are_bounded() {
        assert!(Rate::new(0.0).is_none());
        assert!(Rate::new(f64::NAN).is_none());
        assert!(Rate::new(-1.0).is_none());
        assert!(Rate::new(17.0).is_none());
        assert!(Rate::new(0.25).is_some());
    }

    #[test]
    fn forgetting_keeps_the_segment_in_force() {
        let mut m = TimeMap::new();
        m.start(0, 0).unwrap();
        m.pause(S).unwrap();
        m.resume(2 * S).unwrap();
        m.forget_before(3 * S);
        assert_eq!(m.segments().count(), 1);
        assert_eq!(m.logical_at(3 * S), (0, 2 * S as i64));
        assert_eq!(at(m.due(0, 3 * S as i64)), 4 * S);
    }

    #[test]
    fn at_most_max_segments_are_kept() {
        let mut m = TimeMap::new();
        m.start(0, 0).unwrap();
        for i in 1..200u64 {
            m.set_rate(i * MS, Rate::ONE).unwrap();
        }
        assert!(m.segments().count() <= MAX_SEGMENTS);
        assert_eq!(at(m.due(0, 500 * MS as i64)), 500 * MS);
    }

    proptest::proptest! {
        /// Mapping a logical time to its due clock time and back gives the logical
        /// time again (to a nanosecond of rounding), through any sequence of changes,
        /// and due times are monotone in logical time within an epoch.
        #[test]
        fn due_and_logical_agree(ops in proptest::collection::vec((0u8..4, 1u64..2_000, 1u32..8), 1..20),
                                 probes in proptest::collection::vec(0i64..200_000, 1..40)) {
            let mut m = TimeMap::new();
            let mut t = 0u64;
            m.start(0, 0).unwrap();
            for (op, dt, r) in ops {
                t += dt * MS;
                match op {
                    0 => { let _ = m.pause(t); }
                    1 => { let _ = m.resume(t); }
                    2 => { let _ = m.set_rate(t, Rate::new(f64::from(r) / 4.0).unwrap()); }
                    _ => { let (_, l) = m.logical_at(t); let _ = m.seek(t, l + 1_000 * MS as i64); }
                }
            }
            let epoch = m.epoch();
            let mut probes: Vec<i64> = probes.into_iter().map(|p| p * MS as i64).collect();
            probes.sort_unstable();
            let mut last = 0u64;
            for l in probes {
                if let Due::At(c) = m.due(epoch, l) {
                    let (e, back) = m.logical_at(c);
                    proptest::prop_assert_eq!(e, epoch);
                    proptest::prop_assert!((back - l).abs() <= 16, "l {} -> c {} -> {}", l, c, back);
                    proptest::prop_assert!(c >= last);
                    last = c;
                }
            }
        }
    }
}
