//! Points in time, and the clock service's wire form of them.
//!
//! A [`Time`] is a count of nanoseconds since an epoch. For the clock service the epoch
//! is boot (`CLOCK_MONOTONIC`, as the paper's clock is "elapsed time since the system
//! boot"); on a virtual clock it is wherever the test starts. A `u64` of nanoseconds
//! lasts 584 years, so nothing here needs a wider type, but nothing here panics on
//! overflow either: every operation is either `checked_…` (returns `None`) or
//! `saturating_…` (sticks at [`Time::ZERO`] or [`Time::MAX`]), and the operators
//! (`+`, `-`) are the saturating ones. A saturated deadline is "never", which is the
//! safe reading of an absurd request from an untrusted client.
//!
//! Intervals are [`std::time::Duration`]; there is no second duration type.
//!
//! [`Timespec`] is the paper's (and POSIX's) `timespec`: seconds plus nanoseconds in
//! `[0, 10⁹)`. It is the form times take on the wire, and untrusted bytes become one
//! only through [`Timespec::new`] or [`Timespec::from_le_bytes`], which check the
//! nanoseconds field.

use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};
use std::time::Duration;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u32 = 1_000_000_000;

/// A point in time: nanoseconds since an epoch (boot, for the clock service).
///
/// Ordered, hashable, `Copy`. Arithmetic with [`Duration`] never panics: see the
/// module documentation.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    /// The epoch.
    pub const ZERO: Time = Time(0);
    /// The last representable instant; also what saturated arithmetic yields, read as
    /// "never".
    pub const MAX: Time = Time(u64::MAX);

    /// `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// `micros` microseconds after the epoch (saturating).
    pub const fn from_micros(micros: u64) -> Time {
        Time(micros.saturating_mul(1_000))
    }

    /// `millis` milliseconds after the epoch (saturating).
    pub const fn from_millis(millis: u64) -> Time {
        Time(millis.saturating_mul(1_000_000))
    }

    /// `secs` seconds after the epoch (saturating).
    pub const fn from_secs(secs: u64) -> Time {
        Time(secs.saturating_mul(NANOS_PER_SEC as u64))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The interval from the epoch to this instant.
    pub const fn since_epoch(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self + d`, or `None` if that is past [`Time::MAX`].
    pub fn checked_add(self, d: Duration) -> Option<Time> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_add(d).map(Time)
    }

    /// `self + d`, or [`Time::MAX`] if that is past it.
    pub fn saturating_add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self - d`, or `None` if that is before the epoch.
    pub fn checked_sub(self, d: Duration) -> Option<Time> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_sub(d).map(Time)
    }

    /// `self - d`, or [`Time::ZERO`] if that is before the epoch.
    pub fn saturating_sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(duration_nanos(d)))
    }

    /// The interval from `earlier` to `self`, or `None` if `earlier` is later.
    pub fn checked_duration_since(self, earlier: Time) -> Option<Duration> {
        self.0.checked_sub(earlier.0).map(Duration::from_nanos)
    }

    /// The interval from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// The first multiple of `resolution` (counted from the epoch) at or after `self`:
    /// the clock tick on which something due at `self` happens when the clock only
    /// looks every `resolution`.
    ///
    /// A zero resolution means "exact" and returns `self`. If the tick would be past
    /// [`Time::MAX`], returns [`Time::MAX`] ("never").
    ///
    /// ```
    /// # use ictus_rt::Time;
    /// # use std::time::Duration;
    /// let res = Duration::from_millis(10);
    /// assert_eq!(Time::from_millis(13).round_up(res), Time::from_millis(20));
    /// assert_eq!(Time::from_millis(20).round_up(res), Time::from_millis(20));
    /// assert_eq!(Time::from_millis(13).round_up(Duration::ZERO), Time::from_millis(13));
    /// ```
    pub fn round_up(self, resolution: Duration) -> Time {
        let res = duration_nanos(resolution);
        if res == 0 {
            return self;
        }
        match self.0 % res {
            0 => self,
            rem => Time(self.0.saturating_add(res - rem)),
        }
    }

    /// The wire form of this instant.
    pub const fn to_timespec(self) -> Timespec {
        Timespec { secs: self.0 / NANOS_PER_SEC as u64, nanos: (self.0 % NANOS_PER_SEC as u64) as u32 }
    }

    /// The instant a (validated) wire time names, or [`TimespecError::Overflow`] if it
    /// is past [`Time::MAX`] (about 584 years after the epoch).
    pub fn from_timespec(ts: Timespec) -> Result<Time, TimespecError> {
        ts.secs
            .checked_mul(NANOS_PER_SEC as u64)
            .and_then(|n| n.checked_add(u64::from(ts.nanos)))
            .map(Time)
            .ok_or(TimespecError::Overflow)
    }
}

/// Nanoseconds in `d`, saturating at `u64::MAX` (584 years).
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Saturating, like [`Time::saturating_add`].
impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        self.saturating_add(d)
    }
}

/// Saturating, like [`Time::saturating_add`].
impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

/// Saturating, like [`Time::saturating_sub`].
impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        self.saturating_sub(d)
    }
}

/// Saturating, like [`Time::saturating_sub`].
impl SubAssign<Duration> for Time {
    fn sub_assign(&mut self, d: Duration) {
        *self = self.saturating_sub(d);
    }
}

/// Saturating, like [`Time::saturating_duration_since`]: zero if `rhs` is later.
impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, rhs: Time) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Seconds since the epoch with nine decimals, e.g. `12.000345678s`.
impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ts = self.to_timespec();
        write!(f, "{}.{:09}s", ts.secs, ts.nanos)
    }
}

impl From<Time> for Timespec {
    fn from(t: Time) -> Timespec {
        t.to_timespec()
    }
}

impl TryFrom<Timespec> for Time {
    type Error = TimespecError;
    fn try_from(ts: Timespec) -> Result<Time, TimespecError> {
        Time::from_timespec(ts)
    }
}

/// Why a wire time was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimespecError {
    /// The nanoseconds field was not in `[0, 10⁹)`.
    #[error("nanoseconds field {0} is not below 1000000000")]
    NanosOutOfRange(i64),
    /// The seconds field was negative (times here are since boot, intervals are not
    /// negative).
    #[error("seconds field {0} is negative")]
    NegativeSeconds(i64),
    /// The time is past [`Time::MAX`], about 584 years after the epoch.
    #[error("time is too far in the future to represent")]
    Overflow,
}

/// The paper's `timespec`: whole seconds and nanoseconds in `[0, 10⁹)`, the form times
/// and intervals take in clock-service messages.
///
/// The fields are private so that every value is valid: build one with [`Timespec::new`]
/// (checked), [`Timespec::from_le_bytes`] (checked), or from a [`Time`] or
/// [`Duration`] (always valid).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    secs: u64,
    nanos: u32,
}

impl Timespec {
    /// Bytes in the wire form: `secs` as a little-endian `u64`, then `nanos` as a
    /// little-endian `u32`.
    pub const WIRE_LEN: usize = 12;

    /// A wire time from its fields, refusing `nanos ≥ 10⁹`.
    pub const fn new(secs: u64, nanos: u32) -> Result<Timespec, TimespecError> {
        if nanos >= NANOS_PER_SEC {
            return Err(TimespecError::NanosOutOfRange(nanos as i64));
        }
        Ok(Timespec { secs, nanos })
    }

    /// A wire time from a C `struct timespec`'s signed fields (as `clock_gettime`
    /// returns them), refusing negative seconds and nanoseconds outside `[0, 10⁹)`.
    pub const fn from_signed(secs: i64, nanos: i64) -> Result<Timespec, TimespecError> {
        if secs < 0 {
            return Err(TimespecError::NegativeSeconds(secs));
        }
        if nanos < 0 || nanos >= NANOS_PER_SEC as i64 {
            return Err(TimespecError::NanosOutOfRange(nanos));
        }
        Ok(Timespec { secs: secs as u64, nanos: nanos as u32 })
    }

    /// Whole seconds.
    pub const fn secs(self) -> u64 {
        self.secs
    }

    /// Nanoseconds past the whole seconds, always below 10⁹.
    pub const fn nanos(self) -> u32 {
        self.nanos
    }

    /// The wire form of an interval (always valid: `Duration` keeps the same invariant).
    pub const fn from_duration(d: Duration) -> Timespec {
        Timespec { secs: d.as_secs(), nanos: d.subsec_nanos() }
    }

    /// The interval this names.
    pub const fn to_duration(self) -> Duration {
        Duration::new(self.secs, self.nanos)
    }

    /// The 12-byte wire form (see [`Timespec::WIRE_LEN`]).
    pub fn to_le_bytes(self) -> [u8; Timespec::WIRE_LEN] {
        let mut out = [0u8; Timespec::WIRE_LEN];
        out[..8].copy_from_slice(&self.secs.to_le_bytes());
        out[8..].copy_from_slice(&self.nanos.to_le_bytes());
        out
    }

    /// Parse the 12-byte wire form, refusing an out-of-range nanoseconds field.
    pub fn from_le_bytes(bytes: [u8; Timespec::WIRE_LEN]) -> Result<Timespec, TimespecError> {
        let [s0, s1, s2, s3, s4, s5, s6, s7, n0, n1, n2, n3] = bytes;
        let secs = u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]);
        let nanos = u32::from_le_bytes([n0, n1, n2, n3]);
        Timespec::new(secs, nanos)
    }
}

impl From<Duration> for Timespec {
    fn from(d: Duration) -> Timespec {
        Timespec::from_duration(d)
    }
}

impl From<Timespec> for Duration {
    fn from(ts: Timespec) -> Duration {
        ts.to_duration()
    }
}

impl fmt::Display for Timespec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}s", self.secs, self.nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn constructors_and_display() {
        assert_eq!(Time::from_secs(2).as_nanos(), 2_000_000_000);
        assert_eq!(Time::from_millis(3).as_nanos(), 3_000_000);
        assert_eq!(Time::from_micros(4).as_nanos(), 4_000);
        assert_eq!(Time::from_secs(u64::MAX), Time::MAX);
        assert_eq!(Time::from_nanos(12_000_345_678).to_string(), "12.000345678s");
        assert_eq!(format!("{:?}", Time::from_millis(1500)), "1.500000000s");
    }

    #[test]
    fn arithmetic_saturates_or_checks() {
        let near_end = Time::MAX - Duration::from_nanos(5);
        assert_eq!(near_end.checked_add(Duration::from_nanos(5)), Some(Time::MAX));
        assert_eq!(near_end.checked_add(Duration::from_nanos(6)), None);
        assert_eq!(near_end + Duration::from_secs(1), Time::MAX);
        assert_eq!(Time::ZERO.checked_add(Duration::MAX), None);
        assert_eq!(Time::ZERO + Duration::MAX, Time::MAX);
        assert_eq!(Time::from_nanos(3).checked_sub(Duration::from_nanos(4)), None);
        assert_eq!(Time::from_nanos(3) - Duration::from_nanos(4), Time::ZERO);
        assert_eq!(Time::from_nanos(3) - Time::from_nanos(4), Duration::ZERO);
        assert_eq!(Time::from_nanos(3).checked_duration_since(Time::from_nanos(4)), None);
        assert_eq!(Time::from_nanos(9) - Time::from_nanos(4), Duration::from_nanos(5));
        let mut t = Time::from_millis(1);
        t += Duration::from_millis(2);
        t -= Duration::from_micros(500);
        assert_eq!(t, Time::from_micros(2_500));
    }

    #[test]
    fn round_up_to_resolution() {
        let res = Duration::from_micros(500);
        assert_eq!(Time::ZERO.round_up(res), Time::ZERO);
        assert_eq!(Time::from_nanos(1).round_up(res), Time::from_micros(500));
        assert_eq!(Time::from_micros(500).round_up(res), Time::from_micros(500));
        assert_eq!(Time::from_micros(501).round_up(res), Time::from_micros(1_000));
        assert_eq!((Time::MAX - Duration::from_nanos(1)).round_up(Duration::from_secs(1)), Time::MAX);
        assert_eq!(Time::from_nanos(7).round_up(Duration::MAX), Time::MAX);
    }

    #[test]
    fn timespec_validation() {
        assert_eq!(Timespec::new(1, 999_999_999).map(Timespec::nanos), Ok(999_999_999));
        assert_eq!(Timespec::new(1, 1_000_000_000), Err(TimespecError::NanosOutOfRange(1_000_000_000)));
        assert_eq!(Timespec::from_signed(-1, 0), Err(TimespecError::NegativeSeconds(-1)));
        assert_eq!(Timespec::from_signed(0, -1), Err(TimespecError::NanosOutOfRange(-1)));
        assert_eq!(Timespec::from_signed(5, 6), Timespec::new(5, 6));
        let mut bytes = Timespec::new(7, 8).unwrap().to_le_bytes();
        assert_eq!(bytes, [7, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0]);
        bytes[8..].copy_from_slice(&NANOS_PER_SEC.to_le_bytes());
        assert!(Timespec::from_le_bytes(bytes).is_err());
        let huge = Timespec::new(u64::MAX / 1_000_000_000 + 1, 0).unwrap();
        assert_eq!(Time::try_from(huge), Err(TimespecError::Overflow));
        let last = Time::MAX.to_timespec();
        assert_eq!(Time::try_from(last), Ok(Time::MAX));
        let past_last = Timespec::new(last.secs(), last.nanos() + 1).unwrap();
        assert_eq!(Time::try_from(past_last), Err(TimespecError::Overflow));
        assert_eq!(Timespec::new(1, 5).unwrap().to_string(), "1.000000005s");
    }

    proptest! {
        #![proptest_config(crate::proptest_config())]

        #[test]
        fn time_timespec_round_trip(n in any::<u64>()) {
            let t = Time::from_nanos(n);
            let ts = t.to_timespec();
            prop_assert!(ts.nanos() < NANOS_PER_SEC);
            prop_assert_eq!(Time::try_from(ts), Ok(t));
            prop_assert_eq!(Timespec::from_le_bytes(ts.to_le_bytes()), Ok(ts));
        }

        #[test]
        fn duration_timespec_round_trip(secs in any::<u64>(), nanos in 0..NANOS_PER_SEC) {
            let d = Duration::new(secs, nanos);
            prop_assert_eq!(Duration::from(Timespec::from(d)), d);
        }

        #[test]
        fn wire_parse_never_accepts_bad_nanos(bytes in any::<[u8; 12]>()) {
            match Timespec::from_le_bytes(bytes) {
                Ok(ts) => prop_assert!(ts.nanos() < NANOS_PER_SEC),
                Err(e) => prop_assert!(matches!(e, TimespecError::NanosOutOfRange(n) if n >= 1_000_000_000)),
            }
        }

        #[test]
        fn round_up_is_the_first_tick_at_or_after(n in any::<u64>(), res in 1u64..10_000_000_000) {
            let t = Time::from_nanos(n);
            let r = t.round_up(Duration::from_nanos(res));
            prop_assert!(r >= t);
            if r != Time::MAX {
                prop_assert_eq!(r.as_nanos() % res, 0);
                prop_assert!(r.as_nanos() - n < res);
            }
        }
    }
}
