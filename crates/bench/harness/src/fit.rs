//! The paper's transfer-cost model, `time = a + N/b`.
//!
//! Paper 000 §8 summarizes each transfer method as a fixed per-message cost `a` plus a
//! per-byte cost at rate `b` (in-line IPC: 0.160 ms + N/4000 ms, i.e. a = 160 µs and
//! b = 4000 bytes/ms = 4 MB/s). Fitting it is an ordinary least-squares regression of
//! time on size: the intercept is `a` and the slope is `1/b`.

use serde::Serialize;

/// A fitted `time = a + N/b`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostFit {
    /// Fixed cost per message (ns): the intercept.
    pub a_ns: f64,
    /// Transfer rate (bytes per ns): the inverse of the slope. Infinite when the time
    /// does not grow with size; negative if it shrinks (noise), which callers should
    /// report rather than hide.
    pub b_bytes_per_ns: f64,
    /// Number of points fitted.
    pub points: usize,
}

impl CostFit {
    /// The rate `b` in MB/s (decimal megabytes, as the paper's "4000 bytes per ms =
    /// 4 MB/s"): 1 byte/ns is 1000 MB/s.
    pub fn b_mb_per_s(&self) -> f64 {
        self.b_bytes_per_ns * 1000.0
    }

    /// The model's prediction for `n` bytes (ns).
    pub fn predict_ns(&self, n: f64) -> f64 {
        self.a_ns + n / self.b_bytes_per_ns
    }
}

/// Fits `time = a + N/b` to `(N bytes, time ns)` points by least squares.
///
/// Returns `None` with fewer than two distinct sizes, or if any value is not finite.
pub fn fit_cost(points: &[(f64, f64)]) -> Option<CostFit> {
    if points.len() < 2 || points.iter().any(|(n, t)| !n.is_finite() || !t.is_finite()) {
        return None;
    }
    let count = points.len() as f64;
    let mean_n = points.iter().map(|p| p.0).sum::<f64>() / count;
    let mean_t = points.iter().map(|p| p.1).sum::<f64>() / count;
    // Centred sums keep the arithmetic well conditioned when sizes span 4 KiB..16 MiB.
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_n).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_n) * (p.1 - mean_t)).sum();
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx; // ns per byte
    Some(CostFit { a_ns: mean_t - slope * mean_n, b_bytes_per_ns: 1.0 / slope, points: points.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_the_papers_inline_ipc_line() {
        // 0.160 ms + N/4000 ms, in ns: a = 160_000 ns, slope = 250 ns/byte.
        let points: Vec<(f64, f64)> =
            [1.0, 1024.0, 4096.0, 16384.0, 32768.0].iter().map(|&n| (n, 160_000.0 + n * 250.0)).collect();
        let fit = fit_cost(&points).expect("fit");
        assert!((fit.a_ns - 160_000.0).abs() < 1e-6);
        assert!((fit.b_mb_per_s() - 4.0).abs() < 1e-9);
        assert_eq!(fit.points, 5);
        assert!((fit.predict_ns(8192.0) - (160_000.0 + 8192.0 * 250.0)).abs() < 1e-3);
    }

    #[test]
    fn least_squares_on_noisy_points() {
        // t = 1000 + 0.5 N with symmetric noise that cancels in the fit.
        let points = [(0.0, 1010.0), (0.0, 990.0), (1000.0, 1510.0), (1000.0, 1490.0)];
        let fit = fit_cost(&points).expect("fit");
        assert!((fit.a_ns - 1000.0).abs() < 1e-9);
        assert!((fit.b_bytes_per_ns - 2.0).abs() < 1e-9);
    }

    #[test]
    fn flat_times_give_an_infinite_rate() {
        let fit = fit_cost(&[(1.0, 5.0), (2.0, 5.0)]).expect("fit");
        assert_eq!(fit.a_ns, 5.0);
        assert!(fit.b_bytes_per_ns.is_infinite());
    }

    #[test]
    fn degenerate_inputs_are_refused() {
        assert!(fit_cost(&[]).is_none());
        assert!(fit_cost(&[(1.0, 2.0)]).is_none());
        assert!(fit_cost(&[(4.0, 2.0), (4.0, 3.0)]).is_none());
        assert!(fit_cost(&[(1.0, 2.0), (2.0, f64::NAN)]).is_none());
    }
}
