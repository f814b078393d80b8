//! The `ipc` experiment: transfer costs by message size (paper 000 §8, Figure 3).
//!
//! Every transport is a client in this process doing timed round trips with a server
//! in its own child process: `size` bytes out, a small [`REPLY_LEN`]-byte reply back,
//! as the paper's server replied with a bare `KERN_SUCCESS`. Sizes run from 1 B to
//! 16 MiB. For each size, transports take turns in rounds (A B C, B C A, …), each
//! round a batch of round trips per transport, so machine noise falls on all of them
//! alike; each (transport, size) accumulates its own HDR histogram.
//!
//! Each transport is summarized by the paper's model `time = a + N/b`, fitted by least
//! squares to the medians of sizes ≥ 4 KiB (where the per-byte cost dominates and
//! `b` is meaningful); the fit's intercept is reported as `a_ns`, and since a line
//! through large sizes says little about small ones, the median at 1 B is reported
//! beside it as `a_small_ns`, the paper's own reading of `a` ("a 1-byte buffer took
//! 0.160 ms").
//!
//! Headlines compare p50s, each side's median of its per-round p50s (a round holds one
//! batch of each transport, side by side): a batch now and then runs in a slower state
//! of the machine (on one CPU shared with other work, a lane's batch median sits at one
//! of two levels ~25 % apart), and the p50 of all samples pooled moved with how many
//! batches did, where the median of the rounds does not (`doc/ipc.md`, *Quick runs*).

use std::io;
use std::time::Instant;

use ictus_bench::experiment::no_args;
use ictus_bench::fit::{fit_cost, CostFit};
use ictus_bench::pin;
use ictus_bench::plot::{Axis, Plot, Scale, Series, TickFormat};
use ictus_bench::rounds::{Lane, Lanes, Schedule};
use ictus_bench::windows::Windowed;
use ictus_bench::{format_ns, format_size, BenchError, Conditions, Experiment, Options, Outcome, Transport};
use ictus_bench::{Better, Headline, Notes, PaperFigure, Report, Throughput};
use serde_json::json;

use crate::peers::echo::{PipePeer, SeqpacketPeer, PIPE_ROLE, SEQPACKET_ROLE};
use crate::peers::futex::{self, FutexPeer};
use crate::peers::memcpy_bandwidth;
use crate::peers::ports::{self, NullPair, NullTimes, PortMode, PortTransport};
pub use crate::peers::ports::{PORT_INLINE, PORT_OOL};
pub use crate::peers::REPLY_LEN;

/// `ictus bench ipc`.
pub static IPC: Experiment = Experiment {
    name: "ipc",
    about: "Transfer costs (000 §8, Figure 3): port round trips in-line and out-of-line from 1 B to 16 MiB \
            beside socketpair, pipe and futex peers, and memcpy",
    figures: &[1],
    quick_s: 8.0,
    full_s: 150.0,
    roles: &[&SEQPACKET_ROLE, &PIPE_ROLE, &futex::ROLE, &ports::ROLE, &crate::ipc_async::ROLE],
    args: no_args,
    run,
};

/// Message sizes measured, 1 B to 16 MiB.
pub const SIZES: &[usize] = &[1, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];

/// The largest size in [`SIZES`]; shared-memory transports size their areas by it.
pub const MAX_SIZE: usize = 16 << 20;

/// Sizes from which the per-byte rate `b` is fitted.
pub const FIT_FROM: usize = 4 << 10;

/// The AF_UNIX seqpacket peer's name.
pub const SEQPACKET: &str = "seqpacket";
/// The futex shared-memory peer's name.
pub const FUTEX_SHM: &str = "futex shm";

/// How many round trips to run for one (transport, size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    warmup: usize,
    rounds: usize,
    per_round: usize,
}

/// Iteration counts scale down with size so every size costs about the same time:
/// a byte budget divided by the size, clamped.
fn plan(size: usize, quick: bool) -> Plan {
    // Many short rounds rather than a few long ones: on this kind of machine the
    // scheduler's placement of client and server (same CPU or not) changes the round
    // trip several-fold and shifts now and then, so each transport must sample many
    // placements.
    let (budget, min, max, rounds) =
        if quick { (256usize << 20, 16, 2_000, 20) } else { (8usize << 30, 100, 50_000, 50) };
    let total = (budget / size).clamp(min, max);
    Plan { warmup: (total / 10).max(2), rounds, per_round: total.div_ceil(rounds) }
}

/// Every transport, peers first: seqpacket, pipe and futex over shared memory, then
/// ours, ictus ports (see [`crate::peers::ports`]). One that cannot start is noted.
fn transports(notes: &mut Notes) -> Vec<Box<dyn Transport>> {
    let mut transports: Vec<Box<dyn Transport>> = Vec::new();
    let mut add = |what: String, t: io::Result<Box<dyn Transport>>| match t {
        Ok(t) => transports.push(t),
        Err(e) => notes.not_measured(what, format!("could not run here: {e}")),
    };
    add(format!("peer {SEQPACKET}"), SeqpacketPeer::spawn_seqpacket(REPLY_LEN).map(|p| Box::new(p) as _));
    add("peer pipe".into(), PipePeer::spawn_pipe(REPLY_LEN).map(|p| Box::new(p) as _));
    add(format!("peer {FUTEX_SHM}"), FutexPeer::spawn(REPLY_LEN, MAX_SIZE).map(|p| Box::new(p) as _));
    for mode in [PortMode::CallInline, PortMode::CallOol, PortMode::SendReceive] {
        match PortTransport::spawn(mode) {
            Ok(t) => transports.push(Box::new(t)),
            Err(e) => notes.not_measured(format!("our transport {mode:?}"), format!("could not run: {e}")),
        }
    }
    match crate::ipc_async::AsyncPortTransport::spawn() {
        Ok(t) => transports.push(Box::new(t)),
        Err(e) => notes.push(format!("our transport {} could not run: {e}", crate::ipc_async::PORT_ASYNC)),
    }
    transports
}

/// Per-transport results: one case per entry of [`SIZES`].
type Measured = Lane;

/// The median at `size`, if measured.
fn p50_at(m: &Measured, size: usize) -> Option<f64> {
    m.p50(SIZES.iter().position(|&s| s == size)?)
}

/// The paper's `time = a + N/b` through the medians of sizes from [`FIT_FROM`].
fn fit(m: &Measured) -> Option<CostFit> {
    let points: Vec<(f64, f64)> =
        SIZES.iter().filter(|&&s| s >= FIT_FROM).filter_map(|&s| Some((s as f64, p50_at(m, s)?))).collect();
    fit_cost(&points)
}

/// Runs the experiment.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    let started = Instant::now();
    let mut conditions = Conditions::capture_before();
    let mut notes = Notes::new();

    // Set-up: the servers, on the server CPU if pinned (they inherit the affinity they
    // are spawned with), then this thread on the client CPU.
    let _affinity = pin::AffinityGuard::save()?;
    let (transports, null_pair) = pin::place(opts.pin, || {
        let transports = transports(&mut notes);
        let null_pair =
            NullPair::spawn().map_err(|e| notes.not_measured("stub overhead pair", format!("could not run: {e}")));
        (transports, null_pair.ok())
    })?;
    if let Some(plan) = opts.pin {
        conditions.pinned = plan.describe();
    }

    // The measured windows: every size, transports interleaved; then the stub pair,
    // then memcpy alone.
    let measured = measure(transports, opts);
    let stubs = null_pair.map(|mut p| p.measure(opts.quick));
    let memcpy = measure_memcpy(opts.quick);

    // Rows, headlines and the paper's figures.
    let mut report = Report::new("ipc", "000 §8, Figure 3", opts.quick, conditions.finish());
    report.hidden_in_table =
        ["transport", "size_bytes", "reply_bytes", "mean_ns"].iter().map(|s| s.to_string()).collect();
    add_rows(&mut report, &measured, &memcpy);
    add_headlines(&mut report, &measured);
    crate::ipc_async::add_headline(&mut report, &measured, PORT_INLINE);
    match stubs {
        Some(Ok(pair)) => add_stub_overhead(&mut report, &pair),
        Some(Err(e)) => notes.not_measured("stub overhead pair", format!("stopped: {e}")),
        None => {}
    }
    report.paper_figures = paper_figures(&measured, &memcpy);
    for m in &measured {
        if let Some(failed) = &m.failed {
            notes.not_measured(&m.name, format!("stopped early: {failed}"));
        }
    }
    notes.notes.extend(method_notes());
    if let Some(warning) = placement_warning(&measured) {
        notes.push(warning);
    }
    notes.push(format!("measured in {:.1} s", started.elapsed().as_secs_f64()));
    report.add_notes(notes);
    let svg = plot_svg(&report);
    Ok(Outcome::new(report, svg))
}

/// The size of the p50 headlines at small messages (`port_rtt_64B_vs_uds`,
/// `ipc_async_rtt_vs_blocking`).
const SPREAD_SIZE: usize = 64;

/// Into how many parts the rounds at [`SPREAD_SIZE`] are cut, spread over the sweep.
const SPREAD_PARTS: usize = 4;

/// The order of the sweep: `(case, rounds)` steps. Every size is one step of all its
/// rounds, except [`SPREAD_SIZE`], whose rounds are cut into [`SPREAD_PARTS`] steps
/// spread evenly over the sweep (before sizes 0, 3, 6, 9 of eleven). This machine has
/// slow spells lasting a second or more (every round trip ~30 % slower, the async
/// lane's ~45 %), longer than one block of a quick run's 64 B rounds (~1 s): one block
/// could fall wholly inside one, and the run's headline with it.
fn sweep(rounds_of: impl Fn(usize) -> usize) -> Vec<(usize, usize)> {
    let spread = SIZES.iter().position(|&s| s == SPREAD_SIZE);
    let step = SIZES.len().div_ceil(SPREAD_PARTS);
    let mut order = Vec::new();
    for case in 0..SIZES.len() {
        if let Some(spread) = spread.filter(|_| case % step == 0) {
            let (total, part) = (rounds_of(spread), case / step);
            // Parts as even as the rounds allow, the larger first.
            let rounds = total / SPREAD_PARTS + usize::from(part < total % SPREAD_PARTS);
            order.push((spread, rounds));
        }
        if Some(case) != spread {
            order.push((case, rounds_of(case)));
        }
    }
    order
}

/// Runs every size, transports interleaved in rounds ([`sweep`]); the servers stop at
/// the end.
fn measure(transports: Vec<Box<dyn Transport>>, opts: &Options) -> Vec<Measured> {
    let mut lanes = Lanes::new(transports, SIZES.len()).tracking_placement();
    for (case, rounds) in sweep(|case| plan(SIZES[case], opts.quick).rounds) {
        let size = SIZES[case];
        let plan = plan(size, opts.quick);
        opts.say(format_args!("ipc: {} x {} round trips per transport", format_size(size), rounds * plan.per_round));
        let context = format!("at {}: ", format_size(size));
        lanes.warm_up(size, plan.warmup, &context);
        lanes.measure(case, size, Schedule::new(rounds, plan.per_round), &context);
    }
    lanes.finish()
}

/// How the numbers were made.
fn method_notes() -> Vec<String> {
    vec![
        format!(
            "round trips: request of N bytes, {REPLY_LEN}-byte reply (the paper's server \
             replied KERN_SUCCESS); the receiver touches one byte per 4 KiB page"
        ),
        format!("fit t = a + N/b over p50 at sizes >= {}; a_small_ns is p50 at 1 B", format_size(FIT_FROM)),
        "headlines: each side's median of its per-round p50s, the ratio of the two medians (a round is one \
         batch of every transport, side by side in rotating order); rows '…: window k of n' show every round's \
         pair and ratio, the median row the smallest and largest"
            .to_string(),
        "seqpacket sends messages as records of at most 64 KiB (the socket buffer \
         limits a record to ~208 KiB); pipes are written and read in 64 KiB pieces"
            .to_string(),
        "same_cpu: fraction of batches after which the server had last run on the \
         client's CPU; one CPU or two changes small round trips several-fold \
         (cross-CPU wakeups are slow on a VM)"
            .to_string(),
        format!(
            "shared-memory transparent huge pages: {} (out-of-line regions of 2 MiB and more \
             ask for them; with `advise` or `always` a 16 MiB region is 8 pages to map, unmap \
             and free instead of 4096)",
            ictus_sys::mm::shmem_thp_policy().unwrap_or_else(|| "unknown".into())
        ),
    ]
}

/// A warning when transports ran with client and server placed differently: unpinned,
/// the scheduler tends to keep each server where it first ran, so one transport may
/// run on one CPU and another across two for the whole run, and their ratio then
/// measures placement rather than transport.
fn placement_warning(measured: &[Measured]) -> Option<String> {
    let placed: Vec<(&str, f64)> = measured.iter().filter_map(|m| Some((m.name.as_str(), m.same_cpu(None)?))).collect();
    let low = placed.iter().min_by(|a, b| a.1.total_cmp(&b.1))?;
    let high = placed.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
    (high.1 - low.1 > 0.25).then(|| {
        format!(
            "WARNING: placement differs: {} shared the client's CPU in {:.0}% of batches, \
             {} in {:.0}%; ratios between them are skewed by placement; rerun with \
             --pin C,S (0,0 or 0,1) to fix it",
            high.0,
            high.1 * 100.0,
            low.0,
            low.1 * 100.0
        )
    })
}

/// `memcpy` bandwidth per size, in MB/s.
fn measure_memcpy(quick: bool) -> Vec<(usize, Throughput)> {
    let (repeats, bytes_per_run) = if quick { (5, 32 << 20) } else { (15, 256 << 20) };
    SIZES.iter().filter_map(|&size| Some((size, memcpy_bandwidth(size, repeats, bytes_per_run)?))).collect()
}

fn add_rows(report: &mut Report, measured: &[Measured], memcpy: &[(usize, Throughput)]) {
    for (i, &size) in SIZES.iter().enumerate() {
        for m in measured {
            let r = &m.cases[i];
            if r.count() == 0 {
                continue;
            }
            report.rows.push(
                r.row(format!("{} {}", m.name, format_size(size)))
                    .with("transport", m.name.as_str())
                    .with("size_bytes", size)
                    .with("reply_bytes", REPLY_LEN)
                    .with("same_cpu", m.same_cpu(Some(i)))
                    .to_value(),
            );
        }
    }
    for m in measured {
        let Some(fit) = fit(m) else { continue };
        report.rows.push(json!({
            "case": format!("{} fit", m.name),
            "transport": m.name,
            "a_ns": fit.a_ns,
            "b_mb_s": fit.b_mb_per_s(),
            "a_small_ns": p50_at(m, SIZES[0]),
            "fit_points": fit.points,
            "same_cpu": m.same_cpu(None),
        }));
    }
    for (size, t) in memcpy {
        report.rows.push(json!({
            "case": format!("memcpy {}", format_size(*size)),
            "size_bytes": size,
            "mb_s_median": t.median,
            "mb_s_min": t.min,
            "mb_s_max": t.max,
            "runs": t.runs,
        }));
    }
}

fn find<'a>(measured: &'a [Measured], name: &str) -> Option<&'a Measured> {
    measured.iter().find(|m| m.name == name)
}

/// Each round of the lanes as a window: `(ours, peer)` p50s of the batches at `size`
/// that both ran in that round ([`Windowed`]: each side's median across the windows,
/// the ratio of the medians). `None` if either lane is missing or has no round.
pub(crate) fn p50_windows(ours: Option<&Measured>, peer: Option<&Measured>, size: usize) -> Option<Windowed> {
    let case = SIZES.iter().position(|&s| s == size)?;
    let (ours, peer) = (ours?, peer?);
    Windowed::new(ours.round_p50s[case].iter().copied().zip(peer.round_p50s[case].iter().copied()))
}

/// `port_rtt_64B_vs_uds` and `ool_16MiB_vs_inline_16MiB`: p50 against p50, each side's
/// median of its per-round p50s ([`p50_windows`]), a row per window.
fn add_headlines(report: &mut Report, measured: &[Measured]) {
    let specs = [
        ("port_rtt_64B_vs_uds", PORT_INLINE, SEQPACKET, 64, 1.15),
        ("ool_16MiB_vs_inline_16MiB", PORT_OOL, PORT_INLINE, 16 << 20, 0.3),
    ];
    for (name, ours_name, peer_name, size, target) in specs {
        let peer = find(measured, peer_name);
        match p50_windows(find(measured, ours_name), peer, size) {
            Some(w) => {
                let description = peer.map_or(peer_name, |p| p.description.as_str());
                report
                    .headline
                    .push(Headline::new(name, w.ours, w.peer, description, "ns", Better::Lower).with_target(target));
                report.rows.extend(w.rows(&format!("{ours_name} vs {peer_name} {} p50", format_size(size)), "ns"));
            }
            None => report.notes.push(format!(
                "headline {name} omitted: needs p50 of {ours_name:?} and {peer_name:?} at {}",
                format_size(size)
            )),
        }
    }
}

fn paper_figures(measured: &[Measured], memcpy: &[(usize, Throughput)]) -> Vec<PaperFigure> {
    let mut figures = Vec::new();

    // bcopy: the paper used blocks of 656..65536 bytes.
    let rates: Vec<f64> =
        memcpy.iter().filter(|(s, _)| (1 << 10..=64 << 10).contains(s)).map(|(_, t)| t.median).collect();
    let bcopy = PaperFigure::new("bcopy rate", "10-14 MB/s", Some(12.0), "MB/s", Better::Higher);
    figures.push(match Throughput::from_runs(&rates) {
        Some(t) => {
            bcopy.ours(Some(t.median), format!("memcpy 1-64 KiB: {:.0} MB/s ({:.0}-{:.0})", t.median, t.min, t.max))
        }
        None => bcopy,
    });

    let fixed = |name: &str, quantity: &str, paper: &str, paper_ns: f64, halve: bool| {
        let figure = PaperFigure::new(quantity, paper, Some(paper_ns), "ns", Better::Lower);
        match find(measured, name).and_then(|m| p50_at(m, SIZES[0])) {
            Some(p50) => {
                let ours = if halve { p50 / 2.0 } else { p50 };
                let how = if halve { "p50 RTT/2 at 1 B" } else { "p50 RTT at 1 B" };
                figure.ours(Some(ours), format!("{name}: {} ({how})", format_ns(ours)))
            }
            None => figure.ours(None, format!("{name} not measured")),
        }
    };
    let rate = |name: &str, quantity: &str, paper: &str, paper_mb_s: f64| {
        let figure = PaperFigure::new(quantity, paper, Some(paper_mb_s), "MB/s", Better::Higher);
        match find(measured, name).and_then(fit) {
            Some(fit) => figure.ours(
                Some(fit.b_mb_per_s()),
                format!("{name}: {:.0} MB/s (fit >= {})", fit.b_mb_per_s(), format_size(FIT_FROM)),
            ),
            None => figure.ours(None, format!("{name} not measured")),
        }
    };
    figures.push(fixed(PORT_INLINE, "in-line IPC fixed cost a", "0.160 ms", 160_000.0, false));
    figures.push(rate(PORT_INLINE, "in-line IPC rate b", "N/4000 ms = 4 MB/s", 4.0));
    figures.push(fixed(PORT_OOL, "out-of-line IPC fixed cost a", "0.6 ms (one way, pages touched)", 600_000.0, false));
    figures.push(rate(PORT_OOL, "out-of-line IPC rate b", "N/6300 ms = 6.3 MB/s", 6.3));
    figures.push(fixed(SEQPACKET, "Unix socket, one way", "2.9 ms", 2_900_000.0, true));
    figures.push(fixed(FUTEX_SHM, "shared memory signalling", "0.16 ms", 160_000.0, false));
    figures
}

/// The p50 round-trip time against message size for every transport (log-log), with
/// the time of one `memcpy` of the same size for reference, from a report's rows.
pub fn plot_svg(report: &Report) -> String {
    let mut series: Vec<Series> = Vec::new();
    let mut memcpy = Series { name: "memcpy (one copy)".to_string(), points: Vec::new() };
    for row in &report.rows {
        let size = row.get("size_bytes").and_then(|v| v.as_f64());
        if let (Some(name), Some(size), Some(p50)) =
            (row.get("transport").and_then(|v| v.as_str()), size, row.get("p50_ns").and_then(|v| v.as_f64()))
        {
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push((size, p50)),
                None => series.push(Series { name: name.to_string(), points: vec![(size, p50)] }),
            }
        } else if let (Some(size), Some(rate)) = (size, row.get("mb_s_median").and_then(|v| v.as_f64())) {
            if rate > 0.0 {
                memcpy.points.push((size, size * 1000.0 / rate));
            }
        }
    }
    if !memcpy.points.is_empty() {
        series.push(memcpy);
    }
    Plot {
        title: format!(
            "ipc: round trip (p50) vs message size, {REPLY_LEN}-byte reply{}",
            if report.quick { " [quick]" } else { "" }
        ),
        x: Axis { label: "message size".to_string(), scale: Scale::Log2, ticks: TickFormat::Bytes },
        y: Axis { label: "time".to_string(), scale: Scale::Log10, ticks: TickFormat::Nanoseconds },
        series,
    }
    .render()
}

/// Rows and the `stub_rtt_vs_port` headline: a null routine through generated stubs
/// against the same exchange written by hand on the nucleus, same server, interleaved.
/// Each round (a batch of each, in alternating order) is a window; the headline takes
/// each side's median of its per-window p50s and their ratio ([`Windowed`]), and a row
/// per window shows the spread.
fn add_stub_overhead(report: &mut Report, pair: &NullTimes) {
    for (name, r) in [("stub null routine", &pair.stub), ("port null request/reply", &pair.hand)] {
        if r.count() > 0 {
            report.rows.push(r.row(name.to_string()).with("transport", name).with("size_bytes", 0usize).to_value());
        }
    }
    let windows = pair.stub_rounds.iter().copied().zip(pair.hand_rounds.iter().copied());
    let Some(w) = Windowed::new(windows) else {
        report.notes.push("headline stub_rtt_vs_port omitted: no round measured both".to_string());
        return;
    };
    report.headline.push(
        Headline::new(
            "stub_rtt_vs_port",
            w.ours,
            w.peer,
            "hand-written port request/reply (Space::call), same server",
            "ns",
            Better::Lower,
        )
        .with_target(1.05),
    );
    report.rows.extend(w.rows("stub vs hand-written null p50", "ns"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_bench::report::svg_path_for;
    use ictus_bench::LatencyRecorder;
    use std::path::Path;

    #[test]
    fn plans_shrink_with_size_and_stay_bounded() {
        for quick in [true, false] {
            let small = plan(1, quick);
            let large = plan(MAX_SIZE, quick);
            assert!(small.per_round >= large.per_round);
            assert!(large.per_round * large.rounds >= 8);
            assert!(small.warmup >= 2);
        }
    }

    #[test]
    fn the_sweep_spreads_the_64_byte_rounds_and_keeps_every_round() {
        for rounds in [20, 50, 3] {
            let order = sweep(|_| rounds);
            let at64 = SIZES.iter().position(|&s| s == SPREAD_SIZE).unwrap();
            let parts: Vec<(usize, usize)> =
                order.iter().enumerate().filter(|(_, s)| s.0 == at64).map(|(i, s)| (i, s.1)).collect();
            assert_eq!(parts.len(), SPREAD_PARTS);
            assert_eq!(parts.iter().map(|p| p.1).sum::<usize>(), rounds, "every round, once");
            assert!(parts.iter().all(|p| p.1.abs_diff(rounds / SPREAD_PARTS) <= 1), "{parts:?}");
            assert!(parts.windows(2).all(|w| w[1].0 - w[0].0 >= 3), "spread over the sweep: {parts:?}");
            for case in (0..SIZES.len()).filter(|&c| c != at64) {
                assert_eq!(order.iter().filter(|s| s.0 == case).collect::<Vec<_>>(), [&(case, rounds)]);
            }
        }
        assert_eq!(sweep(|_| 20).len(), SIZES.len() - 1 + SPREAD_PARTS);
    }

    #[test]
    fn sizes_are_sorted_and_end_at_max() {
        assert!(SIZES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(SIZES.last(), Some(&MAX_SIZE));
    }

    #[test]
    fn svg_path_replaces_the_extension() {
        assert_eq!(svg_path_for(Path::new("out/ipc.json")), Path::new("out/ipc.svg"));
        assert_eq!(svg_path_for(Path::new("ipc")), Path::new("ipc.svg"));
        assert_eq!(svg_path_for(Path::new("x.svg")), Path::new("x.svg.svg"));
    }

    fn fake(name: &str, p50_of: impl Fn(usize) -> u64) -> Measured {
        let mut m = Lane::new(name, format!("{name} description"), SIZES.len());
        for ((r, p), &s) in m.cases.iter_mut().zip(&mut m.round_p50s).zip(SIZES) {
            r.record_all(&[p50_of(s); 3]);
            p.push(p50_of(s) as f64);
        }
        m
    }

    fn report_from(measured: &[Measured]) -> Report {
        let mut report = Report::new("ipc", "000 §8, Figure 3", true, Conditions::capture_before());
        add_rows(&mut report, measured, &[(4096, Throughput::from_runs(&[4096.0]).expect("one"))]);
        add_headlines(&mut report, measured);
        report.paper_figures = paper_figures(measured, &[]);
        report
    }

    #[test]
    fn headlines_appear_when_the_transports_exist() {
        let measured = [
            fake(SEQPACKET, |s| 10_000 + s as u64),
            fake(PORT_INLINE, |s| 8_000 + s as u64),
            fake(PORT_OOL, |s| 20_000 + s as u64 / 10),
        ];
        let report = report_from(&measured);
        let names: Vec<&str> = report.headline.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["port_rtt_64B_vs_uds", "ool_16MiB_vs_inline_16MiB"]);
        let uds = &report.headline[0];
        assert_eq!(uds.peer_name, "seqpacket description");
        assert!((uds.ratio - 8_064.0 / 10_064.0).abs() < 1e-2);
        assert_eq!(uds.met, Some(true));
        assert!(report.notes.is_empty());
        assert!(placement_warning(&measured).is_none());
        // The slope of 1 ns/byte is 1000 MB/s.
        let fit = report.rows.iter().find(|r| r["case"] == "port inline fit").expect("fit row");
        let b = fit["b_mb_s"].as_f64().expect("b");
        assert!((b - 1000.0).abs() < 10.0, "{b}");
    }

    #[test]
    fn missing_transports_leave_a_note_instead_of_a_headline() {
        let report = report_from(&[fake(SEQPACKET, |_| 10_000)]);
        assert!(report.headline.is_empty());
        assert_eq!(report.notes.len(), 2);
        let inline = report.paper_figures.iter().find(|f| f.quantity == "in-line IPC fixed cost a").expect("figure");
        assert_eq!(inline.ours, "port inline not measured");
    }

    #[test]
    fn differing_placement_is_flagged() {
        let mut a = fake(SEQPACKET, |_| 1);
        let mut b = fake(FUTEX_SHM, |_| 1);
        a.placement[0] = (0, 10);
        b.placement[0] = (9, 10);
        b.placement[1] = (1, 1);
        assert_eq!(b.same_cpu(None), Some(10.0 / 11.0));
        let warning = placement_warning(&[a, b]).expect("a warning");
        assert!(warning.contains("futex shm shared the client's CPU in 91%"), "{warning}");
    }

    #[test]
    fn the_stub_headline_compares_each_sides_median_window() {
        let mut pair = NullTimes {
            stub: LatencyRecorder::new(),
            hand: LatencyRecorder::new(),
            stub_rounds: vec![10_400.0, 10_300.0, 25_000.0],
            hand_rounds: vec![20_000.0, 10_000.0, 10_100.0],
        };
        pair.stub.record_all(&[10_400, 10_300, 25_000]);
        pair.hand.record_all(&[20_000, 10_000, 10_100]);
        let mut report = Report::new("ipc", "000 §8, Figure 3", true, Conditions::capture_before());
        add_stub_overhead(&mut report, &pair);
        let h = &report.headline[0];
        assert_eq!((h.name.as_str(), h.ours, h.peer), ("stub_rtt_vs_port", 10_400.0, 10_100.0));
        assert_eq!(h.met, Some(true), "1.03 <= 1.05");
        assert_eq!(report.rows.len(), 2 + 3 + 1, "two distributions, a row per window, the median");
        pair.stub_rounds.clear();
        let mut report = Report::new("ipc", "000 §8, Figure 3", true, Conditions::capture_before());
        add_stub_overhead(&mut report, &pair);
        assert!(report.headline.is_empty() && report.notes[0].contains("stub_rtt_vs_port"), "{:?}", report.notes);
    }

    #[test]
    fn plot_has_a_series_per_transport_and_memcpy() {
        let report = report_from(&[fake(SEQPACKET, |_| 10_000), fake(FUTEX_SHM, |_| 5_000)]);
        let svg = plot_svg(&report);
        assert!(svg.contains(">seqpacket<"));
        assert!(svg.contains(">futex shm<"));
        assert!(svg.contains(">memcpy (one copy)<"));
    }
}
