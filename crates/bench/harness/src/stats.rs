//! Latency distributions and throughput summaries.
//!
//! Latency is reported as a distribution (p50, p99, p99.9, max and the sample count)
//! from an HDR histogram; throughput as the median of repeated runs with min and max.

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Map, Value};

/// Collects latency samples in nanoseconds into an HDR histogram with three
/// significant figures that grows as needed, so no sample is ever clamped or lost.
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    histogram: Histogram<u64>,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        LatencyRecorder {
            // Three significant figures is a valid precision (0..=5), and `new` makes an
            // auto-resizing histogram, so this cannot fail.
            histogram: Histogram::new(3).expect("3 significant figures is valid"),
        }
    }

    /// Records one sample (ns).
    pub fn record(&mut self, ns: u64) {
        // An auto-resizing histogram only refuses values beyond its representable
        // range (~2^63), which no measured duration reaches; saturate to be safe.
        if self.histogram.record(ns).is_err() {
            let _ = self.histogram.record(self.histogram.high());
        }
    }

    /// Records every sample of a batch (ns).
    pub fn record_all(&mut self, samples: &[u64]) {
        for &ns in samples {
            self.record(ns);
        }
    }

    /// Number of samples recorded.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The sample at quantile `q` in 0..=1 (ns); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        self.histogram.value_at_quantile(q)
    }

    /// Summarizes the distribution as a row named `case`.
    pub fn row(&self, case: impl Into<String>) -> LatencyRow {
        let h = &self.histogram;
        LatencyRow {
            case: case.into(),
            count: h.len(),
            p50_ns: h.value_at_quantile(0.50),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
            mean_ns: if h.is_empty() { 0.0 } else { h.mean() },
            extra: Map::new(),
        }
    }
}

/// One latency distribution, as a row of a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyRow {
    /// What was measured, e.g. `"seqpacket 64 B"`.
    pub case: String,
    /// Number of samples.
    pub count: u64,
    /// Median (ns).
    pub p50_ns: u64,
    /// 99th percentile (ns).
    pub p99_ns: u64,
    /// 99.9th percentile (ns).
    pub p999_ns: u64,
    /// Largest sample (ns).
    pub max_ns: u64,
    /// Arithmetic mean (ns); reported for completeness, compare medians.
    pub mean_ns: f64,
    /// Experiment-specific fields (`transport`, `size_bytes`, …), flattened into the row.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl LatencyRow {
    /// Adds an experiment-specific field.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_string(), value.into());
        self
    }

    /// The row as a JSON object, ready for [`crate::Report::rows`].
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Median, minimum and maximum of repeated throughput runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Throughput {
    /// Median of the runs.
    pub median: f64,
    /// Slowest run.
    pub min: f64,
    /// Fastest run.
    pub max: f64,
    /// Number of runs.
    pub runs: usize,
}

impl Throughput {
    /// Summarizes runs; `None` if there are none or any is not a finite number.
    pub fn from_runs(runs: &[f64]) -> Option<Self> {
        if runs.is_empty() || runs.iter().any(|r| !r.is_finite()) {
            return None;
        }
        let mut sorted = runs.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Some(Throughput { median, min: sorted[0], max: sorted[n - 1], runs: n })
    }
}

/// The median of the finite `values` (the mean of the middle two for an even count);
/// `None` if there are none.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        let m = |v: &[u64]| median(v.iter().map(|&x| x as f64));
        assert_eq!(m(&[]), None);
        assert_eq!(m(&[7]), Some(7.0));
        assert_eq!(m(&[9, 1, 5]), Some(5.0));
        assert_eq!(m(&[4, 1, 3, 100]), Some(3.5));
    }

    #[test]
    fn quantiles_of_a_uniform_distribution() {
        let mut r = LatencyRecorder::new();
        let samples: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        r.record_all(&samples);
        let row = r.row("uniform");
        assert_eq!(row.count, 1000);
        // Three significant figures: within 0.1 % of the exact order statistic.
        let close = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 1e-3;
        assert!(close(row.p50_ns, 500_000), "p50 {}", row.p50_ns);
        assert!(close(row.p99_ns, 990_000), "p99 {}", row.p99_ns);
        assert!(close(row.p999_ns, 999_000), "p999 {}", row.p999_ns);
        assert!(close(row.max_ns, 1_000_000), "max {}", row.max_ns);
        assert!((row.mean_ns - 500_500.0).abs() < 500.0);
    }

    #[test]
    fn recorder_grows_for_large_values() {
        let mut r = LatencyRecorder::new();
        r.record(1);
        r.record(60_000_000_000); // a minute
        assert_eq!(r.count(), 2);
        assert!(r.row("x").max_ns >= 59_000_000_000);
    }

    #[test]
    fn empty_recorder_gives_a_zero_row() {
        let row = LatencyRecorder::new().row("none");
        assert_eq!((row.count, row.p50_ns, row.max_ns), (0, 0, 0));
        assert_eq!(row.mean_ns, 0.0);
    }

    #[test]
    fn extras_are_flattened_into_the_row() {
        let mut r = LatencyRecorder::new();
        r.record(100);
        let v = r.row("seqpacket 64 B").with("transport", "seqpacket").with("size_bytes", 64).to_value();
        assert_eq!(v["case"], "seqpacket 64 B");
        assert_eq!(v["transport"], "seqpacket");
        assert_eq!(v["size_bytes"], 64);
        assert!(v.get("extra").is_none());
        assert!(v["p50_ns"].is_u64());
    }

    #[test]
    fn throughput_median_min_max() {
        let t = Throughput::from_runs(&[3.0, 1.0, 2.0]).expect("runs");
        assert_eq!((t.median, t.min, t.max, t.runs), (2.0, 1.0, 3.0, 3));
        let even = Throughput::from_runs(&[4.0, 1.0, 2.0, 3.0]).expect("runs");
        assert_eq!(even.median, 2.5);
        assert!(Throughput::from_runs(&[]).is_none());
        assert!(Throughput::from_runs(&[1.0, f64::NAN]).is_none());
    }
}
