//! Clocks that agree: tracking a device's clock against `CLOCK_MONOTONIC` (pure).
//!
//! An audio device plays samples at the rate of its own crystal, which is off the
//! system clock by up to a few hundred parts per million: at +200 ppm a 48 kHz device
//! plays 48 009.6 samples per system second, and a video stream timed by the system
//! clock drifts 12 ms a minute away from the sound. Tactus makes the device the
//! presentation's clock (audio is placed sample-exactly in the device's time) and has
//! every other stream follow an estimate of that clock in system time.
//!
//! The estimate comes from the device's position reports: "frame `f` was being played
//! at system time `t`". Reports are late by the reporting thread's wake-up latency
//! (microseconds to milliseconds on a loaded machine, never early), so they are
//! filtered by a second-order delay-locked loop (F. Adriaensen, *Using a DLL to filter
//! time*, 2005; the loop JACK uses): a phase `t_ref` for frame `f_ref` and a period `k`
//! (nanoseconds per frame), corrected by each report's error `e` as
//! `t_ref += b·e`, `k += c·e / Δf` with `ω = 2π·B·Δt`, `b = √2·ω`, `c = ω²`.
//! Two refinements for late-only noise:
//!
//! - errors are clipped to ±[`Tracker::clip`] before they steer the loop (a report
//!   that is 5 ms late because the thread was descheduled moves the estimate no more
//!   than one a little late), and a run of large errors of the same sign (a real jump:
//!   the device stalled and lost samples) resets the loop at the new position;
//! - the bandwidth starts wide ([`TrackerConfig::initial_bandwidth`]) to lock fast and
//!   narrows to [`TrackerConfig::bandwidth`] to hold still.
//!
//! Time is a parameter: [`Tracker::observe`] takes the report, [`Tracker::mono_of`]
//! and [`Tracker::frame_at`] convert. The tests drive it with a virtual device clock
//! skewed by ±200 ppm and late, heavy-tailed report jitter.

use std::f64::consts::{PI, SQRT_2};

/// How a tracker follows its device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrackerConfig {
    /// The device's nominal rate (frames per second).
    pub rate: u32,
    /// The loop's bandwidth once locked (Hz).
    pub bandwidth: f64,
    /// The bandwidth at the start (Hz), narrowed to `bandwidth` over `settle` seconds.
    pub initial_bandwidth: f64,
    /// Seconds over which the bandwidth narrows.
    pub settle: f64,
    /// Errors beyond this many nanoseconds are clipped before steering the loop.
    pub clip_ns: f64,
    /// Consecutive clipped errors of one sign after which the loop resets.
    pub reset_after: u32,
}

impl TrackerConfig {
    /// Defaults for a device of `rate` frames per second.
    pub fn new(rate: u32) -> TrackerConfig {
        TrackerConfig { rate, bandwidth: 0.1, initial_bandwidth: 2.0, settle: 5.0, clip_ns: 500_000.0, reset_after: 16 }
    }
}

/// An estimate of a device clock in system time.
#[derive(Clone, Debug)]
pub struct Tracker {
    cfg: TrackerConfig,
    /// Frame of the reference point.
    f_ref: u64,
    /// System time (ns) of `f_ref`, as estimated.
    t_ref: f64,
    /// Estimated nanoseconds per frame.
    k: f64,
    /// System time of the first report.
    t_first: Option<f64>,
    /// Consecutive clipped errors and their sign.
    run: (u32, bool),
    resets: u64,
    reports: u64,
}

impl Tracker {
    /// A tracker that has seen nothing yet.
    pub fn new(cfg: TrackerConfig) -> Tracker {
        let rate = f64::from(cfg.rate.max(1));
        Tracker { cfg, f_ref: 0, t_ref: 0.0, k: 1e9 / rate, t_first: None, run: (0, false), resets: 0, reports: 0 }
    }

    /// The configuration.
    pub fn config(&self) -> &TrackerConfig {
        &self.cfg
    }

    /// Whether a report has been seen (before that the estimate is nominal from 0).
    pub fn locked(&self) -> bool {
        self.t_first.is_some()
    }

    /// The clip bound (ns).
    pub fn clip(&self) -> f64 {
        self.cfg.clip_ns
    }

    /// Times the loop was reset after a run of large errors.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Reports seen.
    pub fn reports(&self) -> u64 {
        self.reports
    }

    /// The estimated rate relative to nominal, in parts per million (positive: the
    /// device runs fast).
    pub fn skew_ppm(&self) -> f64 {
        let nominal = 1e9 / f64::from(self.cfg.rate.max(1));
        (nominal / self.k - 1.0) * 1e6
    }

    fn reset(&mut self, frame: u64, t: f64) {
        self.f_ref = frame;
        self.t_ref = t;
    }

    /// A position report: frame `frame` was playing at system time `t_ns`.
    /// Reports must come in order of frames; one that goes backwards is ignored.
    pub fn observe(&mut self, frame: u64, t_ns: u64) {
        let t = t_ns as f64;
        self.reports += 1;
        let Some(t0) = self.t_first else {
            self.t_first = Some(t);
            self.reset(frame, t);
            return;
        };
        if frame <= self.f_ref {
            return;
        }
        let df = (frame - self.f_ref) as f64;
        let pred = self.t_ref + df * self.k;
        let e = t - pred;
        let clip = self.cfg.clip_ns;
        let e_used = e.clamp(-clip, clip);
        if e.abs() > clip {
            let sign = e > 0.0;
            self.run = if self.run.1 == sign { (self.run.0 + 1, sign) } else { (1, sign) };
            if self.run.0 >= self.cfg.reset_after {
                // A real jump, not noise: start again from here, keeping the period.
                self.resets += 1;
                self.run = (0, sign);
                self.reset(frame, t);
                return;
            }
        } else {
            self.run = (0, false);
        }
        let since = ((t - t0) / 1e9).max(0.0);
        let settle = self.cfg.settle.max(1e-9);
        let frac = (since / settle).min(1.0);
        // Geometric narrowing from the initial to the final bandwidth.
        let bw = self.cfg.initial_bandwidth * (self.cfg.bandwidth / self.cfg.initial_bandwidth).powf(frac);
        let dt = df * self.k / 1e9;
        let omega = (2.0 * PI * bw * dt).min(1.0);
        let b = SQRT_2 * omega;
        let c = omega * omega;
        self.t_ref = pred + b * e_used;
        self.f_ref = frame;
        self.k += c * e_used / df;
    }

    /// The estimated system time (ns) at which frame `frame` plays.
    pub fn mono_of(&self, frame: u64) -> u64 {
        let df = frame as f64 - self.f_ref as f64;
        (self.t_ref + df * self.k).max(0.0) as u64
    }

    /// The estimated frame playing at system time `t_ns` (fractional).
    pub fn frame_at(&self, t_ns: u64) -> f64 {
        self.f_ref as f64 + (t_ns as f64 - self.t_ref) / self.k
    }

    /// The device clock in nanoseconds (frames at the nominal rate) at system time
    /// `t_ns`.
    pub fn device_ns_at(&self, t_ns: u64) -> u64 {
        let f = self.frame_at(t_ns).max(0.0);
        (f * 1e9 / f64::from(self.cfg.rate.max(1))) as u64
    }

    /// The system time at which the device clock reads `device_ns`.
    pub fn mono_of_device_ns(&self, device_ns: u64) -> u64 {
        let f = device_ns as f64 * f64::from(self.cfg.rate.max(1)) / 1e9;
        let df = f - self.f_ref as f64;
        (self.t_ref + df * self.k).max(0.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device whose crystal is off by `ppm`: frame `f` truly plays at
    /// `start + f / (rate·(1 + ppm·10⁻⁶))` seconds.
    struct VirtualDevice {
        rate: f64,
        start: f64,
        ppm: f64,
    }

    impl VirtualDevice {
        fn true_time(&self, f: u64) -> f64 {
            self.start + f as f64 * 1e9 / (self.rate * (1.0 + self.ppm * 1e-6))
        }
    }

    /// A small deterministic generator (xorshift), so the tests need no seed file.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
        /// Wake-up latency: usually tens of µs, sometimes milliseconds (a loaded VM).
        fn latency(&mut self) -> f64 {
            let u = self.next();
            let base = -60_000.0 * (1.0 - self.next()).ln();
            if u < 0.02 {
                base + 2_000_000.0 + 6_000_000.0 * self.next()
            } else {
                base
            }
        }
    }

    /// Run a device for `secs` seconds with reports every `period` frames; returns the
    /// worst error (ns) of the estimate of "now" in each second.
    fn run(ppm: f64, secs: u64, period: u64, seed: u64) -> Vec<f64> {
        let rate = 48_000u32;
        let dev = VirtualDevice { rate: f64::from(rate), start: 5e9, ppm };
        let mut tr = Tracker::new(TrackerConfig::new(rate));
        let mut rng = Rng(seed);
        let mut worst = vec![0f64; secs as usize];
        let mut f = 0u64;
        loop {
            let t_true = dev.true_time(f);
            let sec = ((t_true - dev.start) / 1e9) as usize;
            if sec >= secs as usize {
                break;
            }
            tr.observe(f, (t_true + rng.latency()) as u64);
            // Error of the estimate for the frames the other streams are being timed
            // by: up to 100 ms ahead of the last report.
            for ahead in [0u64, rate as u64 / 20, rate as u64 / 10] {
                let err = (tr.mono_of(f + ahead) as f64 - dev.true_time(f + ahead)).abs();
                worst[sec] = worst[sec].max(err);
            }
            f += period;
        }
        worst
    }

    #[test]
    fn locks_within_ten_seconds_and_holds_at_plus_and_minus_200_ppm() {
        for (ppm, seed) in [(200.0, 1), (-200.0, 2), (0.0, 3), (150.0, 4), (-37.0, 5)] {
            let worst = run(ppm, 120, 480, 0x9e37_79b9 ^ seed);
            for (s, w) in worst.iter().enumerate().skip(10) {
                assert!(*w < 1_000_000.0, "{ppm} ppm: error {w:.0} ns in second {s}");
            }
        }
    }

    #[test]
    fn estimates_the_skew() {
        let rate = 48_000u32;
        let dev = VirtualDevice { rate: f64::from(rate), start: 0.0, ppm: 200.0 };
        let mut tr = Tracker::new(TrackerConfig::new(rate));
        let mut rng = Rng(7);
        for i in 0..(60 * 100) {
            let f = i * 480;
            tr.observe(f, (dev.true_time(f) + rng.latency()) as u64);
        }
        assert!((tr.skew_ppm() - 200.0).abs() < 20.0, "estimated {} ppm", tr.skew_ppm());
    }

    #[test]
    fn without_tracking_the_error_grows() {
        // The point of the loop: a nominal clock is 2 ms off after 10 s at 200 ppm.
        let dev = VirtualDevice { rate: 48_000.0, start: 0.0, ppm: 200.0 };
        let nominal = 480_000.0 * 1e9 / 48_000.0;
        assert!((dev.true_time(480_000) - nominal).abs() > 1_900_000.0);
    }

    #[test]
    fn a_jump_resets_the_loop() {
        let rate = 48_000u32;
        let mut tr = Tracker::new(TrackerConfig::new(rate));
        let period_ns = 10_000_000u64;
        for i in 0..500u64 {
            tr.observe(i * 480, 1_000_000_000 + i * period_ns);
        }
        // The device stalls for 50 ms (its samples keep their numbers, time jumps).
        let base = 1_000_000_000 + 500 * period_ns + 50_000_000;
        for i in 0..100u64 {
            tr.observe((500 + i) * 480, base + i * period_ns);
        }
        assert_eq!(tr.resets(), 1);
        let f = 599 * 480;
        let err = tr.mono_of(f) as i64 - (base + 99 * period_ns) as i64;
        assert!(err.abs() < 1_000_000, "error after the jump {err} ns");
    }

    #[test]
    fn device_time_round_trips() {
        let mut tr = Tracker::new(TrackerConfig::new(44_100));
        tr.observe(0, 7_000_000_000);
        tr.observe(441, 7_010_000_000);
        let t = tr.mono_of_device_ns(3_000_000_000);
        let back = tr.device_ns_at(t);
        assert!((back as i64 - 3_000_000_000i64).abs() < 1_000, "{back}");
        // Reports that go backwards are ignored.
        tr.observe(100, 9_000_000_000);
        assert_eq!(tr.mono_of_device_ns(3_000_000_000), t);
    }
}
