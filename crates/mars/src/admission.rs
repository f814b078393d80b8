//! Admission control for streams from the volume's **measured** capability.
//!
//! MARS admits a stream only if the storage can give it its rate without taking away
//! what the admitted streams were promised. The capability is what the volume was
//! measured to deliver (bytes per second, by the engine's own reads at start or by
//! `ictus mars volume bench`), never a number from a data sheet; a fraction of it
//! ([`Admission::new`]'s `reserve`) may be promised to real-time streams, the rest is
//! left for everything else — downloads through the non-real-time class and other
//! processes' I/O, which the kernel's cgroup I/O controls keep to what is left
//! ([`Admission::background_limit`]).
//!
//! The promised share becomes the Deficit Round Robin quanta ([`quanta`]): over a round,
//! the real-time class's share of sectors is at least its share of the rate, so a
//! backlogged real-time class is served at its admitted rate even when the other classes
//! are backlogged too.

use std::collections::BTreeMap;

/// Why a stream was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    /// The rate would exceed what is left of the reservable capability.
    #[error("stream of {rate:.0} B/s refused: {free:.0} B/s of {reservable:.0} B/s left (measured capability {capability:.0} B/s)")]
    Full {
        /// Asked.
        rate: f64,
        /// Left.
        free: f64,
        /// Reservable in all.
        reservable: f64,
        /// Measured.
        capability: f64,
    },
    /// A rate that is zero, negative or not a number.
    #[error("bad rate {0}")]
    BadRate(f64),
    /// The id is already admitted.
    #[error("stream {0} already admitted")]
    Duplicate(u64),
}

/// The streams admitted against one volume.
#[derive(Clone, Debug)]
pub struct Admission {
    capability: f64,
    reserve: f64,
    admitted: BTreeMap<u64, f64>,
}

impl Admission {
    /// Admission against a measured `capability` (bytes/s), promising at most the
    /// fraction `reserve` (clamped to 0..=1) of it to streams.
    pub fn new(capability: f64, reserve: f64) -> Admission {
        let capability = if capability.is_finite() && capability > 0.0 { capability } else { 0.0 };
        Admission { capability, reserve: reserve.clamp(0.0, 1.0), admitted: BTreeMap::new() }
    }

    /// Bytes/s that may be promised in all.
    pub fn reservable(&self) -> f64 {
        self.capability * self.reserve
    }

    /// Bytes/s promised now.
    pub fn reserved(&self) -> f64 {
        self.admitted.values().sum()
    }

    /// The measured capability.
    pub fn capability(&self) -> f64 {
        self.capability
    }

    /// Admits stream `id` at `rate` bytes/s, or says why not.
    pub fn admit(&mut self, id: u64, rate: f64) -> Result<(), AdmissionError> {
        if !rate.is_finite() || rate <= 0.0 {
            return Err(AdmissionError::BadRate(rate));
        }
        if self.admitted.contains_key(&id) {
            return Err(AdmissionError::Duplicate(id));
        }
        let free = self.reservable() - self.reserved();
        if rate > free {
            return Err(AdmissionError::Full {
                rate,
                free: free.max(0.0),
                reservable: self.reservable(),
                capability: self.capability,
            });
        }
        self.admitted.insert(id, rate);
        Ok(())
    }

    /// Releases stream `id`'s reservation; whether it had one.
    pub fn release(&mut self, id: u64) -> bool {
        self.admitted.remove(&id).is_some()
    }

    /// Streams admitted.
    pub fn len(&self) -> usize {
        self.admitted.len()
    }

    /// Whether none is admitted.
    pub fn is_empty(&self) -> bool {
        self.admitted.is_empty()
    }

    /// What other I/O on the volume's devices may use without eating into the
    /// promises: the capability less what is reserved, less `margin` (a fraction of
    /// the capability kept free for the variance of the device). Bytes/s, at least 0.
    pub fn background_limit(&self, margin: f64) -> f64 {
        (self.capability * (1.0 - margin.clamp(0.0, 1.0)) - self.reserved()).max(0.0)
    }
}

/// Quanta (sectors) for a real-time and a non-real-time class so that the real-time
/// class gets at least `rt_share` (0..1) of each round of about `round_sectors`, neither
/// quantum below `max_request`.
pub fn quanta(rt_share: f64, round_sectors: u32, max_request: u32) -> (u32, u32) {
    let share = if rt_share.is_finite() { rt_share.clamp(0.0, 1.0) } else { 1.0 };
    let round = f64::from(round_sectors.max(2 * max_request));
    let rt = ((round * share).ceil() as u32).max(max_request);
    let nrt = ((round - f64::from(rt)).floor() as u32).max(max_request);
    (rt, nrt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_reservable_share_and_refuses_past_it() {
        let mut a = Admission::new(100e6, 0.8);
        a.admit(1, 50e6).unwrap();
        a.admit(2, 30e6).unwrap();
        let e = a.admit(3, 1e6).unwrap_err();
        assert!(matches!(e, AdmissionError::Full { .. }), "{e}");
        assert!(matches!(a.admit(1, 1.0), Err(AdmissionError::Duplicate(1))));
        assert!(matches!(a.admit(4, f64::NAN), Err(AdmissionError::BadRate(_))));
        assert!(matches!(a.admit(4, 0.0), Err(AdmissionError::BadRate(_))));
        assert!((a.background_limit(0.05) - 15e6).abs() < 1.0);
        assert!(a.release(2));
        assert!(!a.release(2));
        a.admit(3, 30e6).unwrap();
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn an_unmeasured_volume_admits_nothing() {
        let mut a = Admission::new(f64::NAN, 0.8);
        assert!(a.admit(1, 1.0).is_err());
        assert_eq!(a.background_limit(0.0), 0.0);
    }

    #[test]
    fn quanta_give_the_share_and_respect_the_largest_request() {
        assert_eq!(quanta(0.25, 4096, 256), (1024, 3072));
        assert_eq!(quanta(0.0, 4096, 256), (256, 3840));
        assert_eq!(quanta(1.0, 4096, 256), (4096, 256));
        assert_eq!(quanta(0.5, 10, 256), (256, 256));
    }
}
