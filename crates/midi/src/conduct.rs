//! Conducting: the score's tempo follows a person's taps (000 §3, the paper's first
//! application). This module is the pure part — the tempo follower, on any clock.
//!
//! # The filter
//!
//! The follower keeps the score position (in beats) as a continuous, piecewise linear
//! function of time: from the last tap (the *anchor*) the position advances at a
//! constant *rate* (beats a second). Each tap does two things:
//!
//! 1. **Tempo.** The interval since the previous tap, divided by the beats it spans,
//!    updates the beat period by exponential smoothing,
//!    `period ← period + α (interval − period)` with `α` = [`Follower::ALPHA`] (0.3:
//!    a step change in the tapping tempo is 97 % followed after ten taps, and one
//!    uneven tap moves the tempo by only 30 % of its error). An interval is first
//!    clamped to `[period / 2, 2 period]` so that one wild tap cannot halve or double
//!    the tempo. The beats an interval spans are its length in periods, rounded, 1 to 4:
//!    a tap that comes after a missed one counts two beats, not one very slow beat.
//!    Taps closer than a quarter period after the last are ignored (key bounce, a
//!    double tap).
//! 2. **Phase.** A tap says "this is beat *b*" (*b* = the previous tap's beat plus the
//!    beats spanned). The score is wherever it is (`pos`, possibly ahead or behind *b*);
//!    the follower does not jump there, which would skip or repeat notes. Instead it
//!    picks the rate that brings the score to beat *b* + 1 exactly when the next tap is
//!    expected, one period from now: `rate = (b + 1 − pos) / period`, bounded to
//!    `[¼, 4] / period`. An error in phase is so absorbed within one beat, smoothly.
//!
//! Before the first tap the score waits; the first tap starts it at beat 0 at the
//! initial tempo (the file's). After the last tap it goes on at the last rate.

use std::time::Duration;

use ictus_rt::Time;

/// The tempo follower. See the module documentation.
#[derive(Clone, Debug)]
pub struct Follower {
    /// Seconds per beat, smoothed.
    period: f64,
    /// Position (beats) at `anchor`.
    anchor_pos: f64,
    anchor: Time,
    /// Beats per second from the anchor on.
    rate: f64,
    last_tap: Option<Time>,
    /// The beat the last tap marked.
    last_beat: f64,
    taps: u64,
    ignored: u64,
}

impl Follower {
    /// The smoothing factor of the period.
    pub const ALPHA: f64 = 0.3;

    /// A follower waiting for its first tap, with the score's initial beat period.
    pub fn new(initial_period: Duration) -> Follower {
        let period = initial_period.as_secs_f64().clamp(0.05, 10.0);
        Follower {
            period,
            anchor_pos: 0.0,
            anchor: Time::ZERO,
            rate: 1.0 / period,
            last_tap: None,
            last_beat: 0.0,
            taps: 0,
            ignored: 0,
        }
    }

    /// Whether the first tap has come.
    pub fn started(&self) -> bool {
        self.last_tap.is_some()
    }

    /// The smoothed beat period.
    pub fn period(&self) -> Duration {
        Duration::from_secs_f64(self.period)
    }

    /// The smoothed tempo, beats a minute.
    pub fn bpm(&self) -> f64 {
        60.0 / self.period
    }

    /// The current rate of the score, beats a second (differs from `1 / period` while
    /// a phase error is being absorbed).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Taps taken and taps ignored (too close to the previous one, or not after it).
    pub fn counts(&self) -> (u64, u64) {
        (self.taps, self.ignored)
    }

    /// A tap at `t`.
    pub fn tap(&mut self, t: Time) {
        let Some(last) = self.last_tap else {
            self.anchor = t;
            self.anchor_pos = 0.0;
            self.rate = 1.0 / self.period;
            self.last_tap = Some(t);
            self.last_beat = 0.0;
            self.taps = 1;
            return;
        };
        let interval = t.checked_duration_since(last).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        if interval < self.period / 4.0 {
            self.ignored += 1;
            return;
        }
        let beats = (interval / self.period).round().clamp(1.0, 4.0);
        let per_beat = (interval / beats).clamp(self.period / 2.0, self.period * 2.0);
        self.period += Self::ALPHA * (per_beat - self.period);
        let beat = self.last_beat + beats;
        let pos = self.position(t);
        self.rate = ((beat + 1.0 - pos) / self.period).clamp(0.25 / self.period, 4.0 / self.period);
        self.anchor = t;
        self.anchor_pos = pos;
        self.last_tap = Some(t);
        self.last_beat = beat;
        self.taps += 1;
    }

    /// The score position (beats) at `t`: 0 before the first tap.
    pub fn position(&self, t: Time) -> f64 {
        if self.last_tap.is_none() {
            return 0.0;
        }
        let dt = t.checked_duration_since(self.anchor).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        self.anchor_pos + self.rate * dt
    }

    /// When the score reaches position `beat`, as things stand (`None` before the first
    /// tap). A position already passed maps to the last tap's time.
    pub fn time_of(&self, beat: f64) -> Option<Time> {
        self.last_tap?;
        if beat <= self.anchor_pos {
            return Some(self.anchor);
        }
        let secs = (beat - self.anchor_pos) / self.rate;
        Some(self.anchor + Duration::from_secs_f64(secs.min(1e9)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Time {
        Time::from_nanos((secs * 1e9) as u64)
    }

    fn taps(f: &mut Follower, start: f64, period: f64, n: usize) -> f64 {
        let mut t = start;
        for _ in 0..n {
            f.tap(s(t));
            t += period;
        }
        t - period
    }

    #[test]
    fn steady_taps_at_the_initial_tempo_keep_it() {
        let mut f = Follower::new(Duration::from_millis(500));
        assert_eq!(f.time_of(1.0), None);
        taps(&mut f, 10.0, 0.5, 20);
        assert!((f.bpm() - 120.0).abs() < 1e-6, "{}", f.bpm());
        assert!((f.position(s(10.0 + 19.0 * 0.5)) - 19.0).abs() < 1e-6);
        assert!((f.position(s(10.0 + 19.25 * 0.5)) - 19.25).abs() < 1e-6);
    }

    #[test]
    fn faster_taps_are_followed_smoothly() {
        let mut f = Follower::new(Duration::from_millis(500));
        taps(&mut f, 1.0, 0.5, 4);
        let mut last_period = f.period().as_secs_f64();
        let mut t = 1.0 + 3.0 * 0.5;
        for k in 0..25 {
            t += 0.4;
            f.tap(s(t));
            let p = f.period().as_secs_f64();
            assert!(p <= last_period + 1e-12 && p >= 0.4 - 1e-12, "tap {k}: period {p} after {last_period}");
            last_period = p;
        }
        assert!((f.period().as_secs_f64() - 0.4).abs() < 1e-3, "{:?}", f.period());
        // In phase: the score is at the tapped beat (3 + 25 = 28) when the tap comes.
        assert!((f.position(s(t)) - 28.0).abs() < 0.02, "{}", f.position(s(t)));
    }

    #[test]
    fn the_position_never_jumps_or_goes_back() {
        let mut f = Follower::new(Duration::from_millis(500));
        let tap_times = [0.0, 0.5, 0.9, 1.5, 1.8, 2.6, 2.7, 3.1, 4.5, 4.9];
        let mut prev = 0.0;
        for (i, &tt) in tap_times.iter().enumerate() {
            let before = f.position(s(tt));
            f.tap(s(tt));
            let after = f.position(s(tt));
            assert!((before - after).abs() < 1e-9, "tap {i} moved the score from {before} to {after}");
            assert!(after >= prev - 1e-9);
            prev = after;
            // Between taps the position rises.
            let mid = f.position(s(tt + 0.1));
            assert!(mid > after);
        }
    }

    #[test]
    fn bounces_are_ignored_and_a_missed_beat_counts_two() {
        let mut f = Follower::new(Duration::from_millis(500));
        taps(&mut f, 0.0, 0.5, 5); // beats 0..4 at 0, 0.5, …, 2.0
        f.tap(s(2.05)); // a bounce
        assert_eq!(f.counts(), (5, 1));
        f.tap(s(3.0)); // one beat missed: this is beat 6
        assert!((f.period().as_secs_f64() - 0.5).abs() < 1e-9, "{:?}", f.period());
        f.tap(s(3.5));
        assert!((f.position(s(3.5)) - 7.0).abs() < 1e-6, "{}", f.position(s(3.5)));
    }

    #[test]
    fn time_of_inverts_position() {
        let mut f = Follower::new(Duration::from_millis(600));
        taps(&mut f, 5.0, 0.55, 6);
        for beat in [5.5, 6.0, 7.25, 9.0] {
            let t = f.time_of(beat).unwrap();
            assert!((f.position(t) - beat).abs() < 1e-6, "{beat}");
        }
        // A passed position maps to the anchor.
        let anchor = f.time_of(0.0).unwrap();
        let last_tap = s(5.0 + 5.0 * 0.55);
        assert!(anchor.max(last_tap) - anchor.min(last_tap) < Duration::from_micros(1), "{anchor} vs {last_tap}");
    }

    #[test]
    fn one_wild_tap_moves_the_tempo_by_at_most_alpha_of_double() {
        let mut f = Follower::new(Duration::from_millis(500));
        taps(&mut f, 0.0, 0.5, 3);
        f.tap(s(1.0 + 0.74)); // 1.48 periods: one beat, very late
        let p = f.period().as_secs_f64();
        assert!(p <= 0.5 + Follower::ALPHA * 0.5 + 1e-9, "{p}");
    }
}
