//! Several short windows instead of one long one, for a headline whose statistic is a
//! tail (a p99, a worst case, a breakdown point).
//!
//! On this VM the host stalls every virtual CPU at once for 1–9 ms every 100 ms. A tail
//! statistic of one short window is then a lottery: whether the stalls happened to fall
//! on ours or on the peer decides the ratio. So a quick run measures several short
//! windows, ours and the peer side by side in each (A B A B), takes the *same*
//! statistic on both sides within each window (a p99 stays a p99, a max stays a max),
//! and reports the median across windows of each side; the headline's ratio is the
//! ratio of the two medians. Every window's pair and ratio is shown, so that a reader
//! sees the spread, not only its middle.
//!
//! Where each window is one whole run per side, adjacent in time (a compile, a
//! build), the machine's load moves both sides of a window together but moves the
//! windows apart; there [`Windowed::median_ratio`], the median of the per-window
//! ratios, compares each run only with its neighbour and is the steadier headline.

use serde_json::{json, Value};

use crate::stats::median;

/// Ours and the peer in each window, and their medians across the windows.
#[derive(Debug, Clone, PartialEq)]
pub struct Windowed {
    /// `(ours, peer)` per window, in the order measured.
    pub windows: Vec<(f64, f64)>,
    /// The median of ours across the windows.
    pub ours: f64,
    /// The median of the peer across the windows.
    pub peer: f64,
}

impl Windowed {
    /// The windows whose two values are both finite; `None` if there are none.
    pub fn new(windows: impl IntoIterator<Item = (f64, f64)>) -> Option<Windowed> {
        let windows: Vec<(f64, f64)> = windows.into_iter().filter(|(o, p)| o.is_finite() && p.is_finite()).collect();
        let ours = median(windows.iter().map(|w| w.0))?;
        let peer = median(windows.iter().map(|w| w.1))?;
        Some(Windowed { windows, ours, peer })
    }

    /// ours / peer of each window (`None` where the peer is 0).
    pub fn ratios(&self) -> Vec<Option<f64>> {
        self.windows.iter().map(|&(o, p)| (p != 0.0).then(|| o / p)).collect()
    }

    /// The ratio of the medians, as the headline reports it (`None` if the peer's
    /// median is 0).
    pub fn ratio(&self) -> Option<f64> {
        (self.peer != 0.0).then(|| self.ours / self.peer)
    }

    /// The median of the per-window ratios (`None` if no window has one): each of ours
    /// compared only with the peer measured beside it, then the middle of those.
    pub fn median_ratio(&self) -> Option<f64> {
        median(self.ratios().into_iter().flatten())
    }

    /// The smallest and largest per-window ratio: the spread a reader should see.
    pub fn ratio_range(&self) -> Option<(f64, f64)> {
        let r: Vec<f64> = self.ratios().into_iter().flatten().collect();
        let lo = r.iter().copied().reduce(f64::min)?;
        let hi = r.iter().copied().reduce(f64::max)?;
        Some((lo, hi))
    }

    /// The window whose ratio is the median of the windows' ratios, as its `(ours,
    /// peer)` pair; with an even number of windows, the mean of the two middle windows'
    /// ours and of their peers. Windows with no ratio (peer 0) are left out; `None` if
    /// none is left.
    ///
    /// For a statistic whose windows fall into two states that both sides share (a round
    /// trip on a CPU that another process sometimes also wants: every batch is either
    /// all fast or all slow), each side's own median ([`Windowed::ratio`]) takes whichever
    /// state that side happened to be in for most of its windows, which need not be the
    /// same state for both; the windows where both sides met the same state give the
    /// ratio that holds in either, and the median window is one of them as long as
    /// they are the majority.
    pub fn median_window(&self) -> Option<(f64, f64)> {
        let mut w: Vec<(f64, f64)> = self.windows.iter().copied().filter(|&(_, p)| p != 0.0).collect();
        w.sort_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)));
        let n = w.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(w[n / 2]),
            _ => {
                let (a, b) = (w[n / 2 - 1], w[n / 2]);
                Some(((a.0 + b.0) / 2.0, (a.1 + b.1) / 2.0))
            }
        }
    }

    /// A report row per window (`case` = `"{what}: window k of n"`, 1-based) with ours,
    /// the peer and their ratio in `unit`, then one row `"{what}: median of n windows"`.
    pub fn rows(&self, what: &str, unit: &str) -> Vec<Value> {
        let n = self.windows.len();
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        let mut rows: Vec<Value> = self
            .windows
            .iter()
            .zip(self.ratios())
            .enumerate()
            .map(|(k, (&(o, p), r))| {
                json!({
                    "case": format!("{what}: window {} of {n}", k + 1),
                    "window": k + 1,
                    "ours": round(o),
                    "peer": round(p),
                    "unit": unit,
                    "ratio": r.map(round),
                })
            })
            .collect();
        rows.push(json!({
            "case": format!("{what}: median of {n} windows"),
            "ours": round(self.ours),
            "peer": round(self.peer),
            "unit": unit,
            "ratio": self.ratio().map(round),
            "median_ratio": self.median_ratio().map(round),
            "window_ratio_min": self.ratio_range().map(|r| round(r.0)),
            "window_ratio_max": self.ratio_range().map(|r| round(r.1)),
        }));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_in_one_window_does_not_decide_the_median() {
        // Window 2's peer and window 3's ours were hit by a stall (9 ms); the others
        // were not.
        let w = Windowed::new([(1.0, 2.0), (1.2, 9.0), (9.0, 2.2), (1.1, 2.1), (0.9, 1.9)]).unwrap();
        assert_eq!((w.ours, w.peer), (1.1, 2.1));
        assert!((w.ratio().unwrap() - 1.1 / 2.1).abs() < 1e-12);
        let (lo, hi) = w.ratio_range().unwrap();
        assert!((lo - 1.2 / 9.0).abs() < 1e-12 && (hi - 9.0 / 2.2).abs() < 1e-12, "the spread is kept: {lo} {hi}");
    }

    #[test]
    fn each_side_takes_its_own_median() {
        // The ratio of medians, not the median of ratios: with two windows each side's
        // median is the mean of its two.
        let w = Windowed::new([(1.0, 4.0), (3.0, 2.0)]).unwrap();
        assert_eq!((w.ours, w.peer), (2.0, 3.0));
        assert_eq!(w.ratios(), [Some(0.25), Some(1.5)]);
    }

    #[test]
    fn the_median_of_ratios_follows_each_pair_not_each_side() {
        // The machine got slower round by round and both sides with it: each round's
        // pair is 1.1, while the medians of each side come from different rounds.
        let w = Windowed::new([(1.1, 1.0), (4.4, 4.0), (2.2, 2.0), (8.8, 8.0)]).unwrap();
        assert!((w.median_ratio().unwrap() - 1.1).abs() < 1e-12);
        // One round where a stall hit only ours does not move the middle.
        let w = Windowed::new([(1.1, 1.0), (9.0, 2.0), (1.2, 1.0), (3.3, 3.0), (1.0, 1.0)]).unwrap();
        assert!((w.median_ratio().unwrap() - 1.1).abs() < 1e-12);
        // Rounds without a ratio (a zero peer) are left out, none is none.
        let w = Windowed::new([(1.0, 0.0), (3.0, 2.0)]).unwrap();
        assert_eq!(w.median_ratio(), Some(1.5));
        assert_eq!(Windowed::new([(1.0, 0.0)]).unwrap().median_ratio(), None);
    }

    #[test]
    fn non_finite_windows_are_left_out_and_none_is_none() {
        let w = Windowed::new([(f64::NAN, 1.0), (2.0, 4.0), (3.0, f64::INFINITY)]).unwrap();
        assert_eq!(w.windows, [(2.0, 4.0)]);
        assert_eq!(w.ratio(), Some(0.5));
        assert!(Windowed::new([]).is_none());
        assert!(Windowed::new([(f64::NAN, f64::NAN)]).is_none());
    }

    #[test]
    fn a_zero_peer_has_no_ratio() {
        let w = Windowed::new([(1.0, 0.0), (2.0, 1.0), (3.0, 0.0)]).unwrap();
        assert_eq!(w.peer, 0.0);
        assert_eq!(w.ratio(), None);
        assert_eq!(w.ratios(), [None, Some(2.0), None]);
        assert_eq!(w.ratio_range(), Some((2.0, 2.0)));
    }

    #[test]
    fn the_median_window_is_a_measured_pair_from_the_middle_ratio() {
        // Each side's batches are fast (5) or slow (8); windows 1, 3 and 6 met a slow
        // state on one side only. Ours was slow in 3 of 6 windows, the peer in 2.
        let w = Windowed::new([(5.0, 8.0), (5.5, 5.0), (8.3, 4.7), (8.0, 7.4), (5.2, 4.8), (8.4, 4.8)]).unwrap();
        // Sorted ratios: 0.625, 1.081, 1.083, 1.1, 1.75, 1.766: the middle two are
        // (5.2, 4.8) and (5.5, 5.0), both sides fast in both.
        let (o, p) = w.median_window().unwrap();
        assert!((o - 5.35).abs() < 1e-12 && (p - 4.9).abs() < 1e-12, "{o} {p}");
        assert!(w.ratio().unwrap() > 1.3, "each side's own median mixes the states: {:?}", w.ratio());
        let odd = Windowed::new([(5.0, 8.0), (5.5, 5.0), (8.3, 4.7)]).unwrap();
        assert_eq!(odd.median_window(), Some((5.5, 5.0)));
        let zero = Windowed::new([(1.0, 0.0), (2.0, 1.0)]).unwrap();
        assert_eq!(zero.median_window(), Some((2.0, 1.0)));
        assert_eq!(Windowed::new([(1.0, 0.0)]).unwrap().median_window(), None);
    }

    #[test]
    fn rows_show_every_window_then_the_median() {
        let w = Windowed::new([(90.0, 60.0), (96.0, 58.0), (93.0, 64.0)]).unwrap();
        let rows = w.rows("DHScl PRIO/ON vs FIFO/OFF", "%");
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[1]["case"], "DHScl PRIO/ON vs FIFO/OFF: window 2 of 3");
        assert_eq!(rows[1]["ratio"], 1.655);
        assert_eq!(rows[3]["case"], "DHScl PRIO/ON vs FIFO/OFF: median of 3 windows");
        assert_eq!((rows[3]["ours"].as_f64(), rows[3]["peer"].as_f64()), (Some(93.0), Some(60.0)));
        assert_eq!(rows[3]["ratio"], 1.55);
        assert_eq!(rows[3]["median_ratio"], 1.5);
        assert_eq!(rows[3]["window_ratio_min"], 1.453);
    }
}
