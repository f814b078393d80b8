//! The `shm` experiment: shared-memory channels (papers 002 §3, 000 §8.4) beside
//! iceoryx2, a raw futex ping-pong over shared memory, and ictus port messages.
//!
//! Every transport is a client in this process and a server in a child process.
//! Cases, each measured with its peers in interleaved rounds (A B C, B C A, …):
//!
//! - **64 B round trip, spinning**: client on CPU 0, servers on CPU 1 (when there are
//!   two), both ends polling: ours (`ictus-shm`, both ends spinning) beside iceoryx2's
//!   publish-subscribe ping-pong (busy-polling, as its own benchmark does), the futex
//!   peer (which polls 50 µs across CPUs before it sleeps) and a port call.
//! - **64 B round trip, blocking**: everything on CPU 0, nobody spins: ours with zero
//!   spin (the server sleeps in `futex_waitv`, the client in `FUTEX_WAIT`) beside the
//!   futex peer (which never polls on one CPU) and a port call.
//! - **small-record throughput**: bursts of 64 pipelined 64 B requests, each answered
//!   with 8 bytes, ours beside port send/receive on two long-lived ports.
//! - **wake-ups per message, 8 clients**: eight client threads each send bursts of 16
//!   records with pauses between; ours counts the system calls clients make to wake
//!   the server (`FUTEX_WAKE` or eventfd writes). A socket or port costs one
//!   notification per message: the peer is 1.0 by construction.
//! - **large buffers through loans**: a frame written into a pool buffer (before
//!   timing, as a producer would), committed, touched page by page by the server,
//!   answered with 8 bytes; beside a port call with the frame out-of-line (sealed
//!   memfd, mapped by the server) and the futex peer (which copies the frame into its
//!   shared area, the way a transport without loans must).
//!
//! Servers here spin for 2 ms at most before they sleep, so a server whose turn is
//! over stops competing for the CPU its successor's server uses; each batch starts

pub mod transports;

use std::io;
use std::time::{Duration, Instant};

use ictus_bench::experiment::no_args;
use ictus_bench::pin::{self, PinPlan};
use ictus_bench::plot::{Axis, Plot, Scale, Series, TickFormat};
use ictus_bench::rounds::{Lane, Lanes, Schedule};
use ictus_bench::windows::Windowed;
use ictus_bench::{format_ns, format_size, BenchError, Conditions, Experiment, Options, Outcome, Transport};
use ictus_bench::{Better, Headline, Notes, PaperFigure, Report, Throughput};
use serde_json::json;

use crate::peers::futex::{self, FutexPeer};
use crate::peers::ports::{self, PortMode, PortTransport};
use transports::{IceoryxTransport, PortBurst, ShmTransport};

/// `ictus bench shm`.
pub static SHM: Experiment = Experiment {
    name: "shm",
    about: "Shared-memory channels (002 §3, 000 §8.4): 64 B round trips spinning and blocking, small-record \
            throughput, wake-ups per message with 8 clients, frames through loans, beside iceoryx2, a raw futex \
            ping-pong and ictus ports",
    figures: &[],
    quick_s: 12.0,
    full_s: 150.0,
    roles: &[
        &transports::SHM_ROLE,
        &transports::ICEORYX2_ROLE,
        &transports::PORT_BURST_ROLE,
        &futex::ROLE,
        &ports::ROLE,
    ],
    args: no_args,
    run,
};
/// Tag of records the shm server echoes.
pub(crate) const ECHO: u32 = 1;
/// Tag of records the shm server consumes without answering.
pub(crate) const SINK: u32 = 2;
/// Tag of records answered with 8 bytes.
pub(crate) const ACK: u32 = 3;
/// The payload of the round-trip cases.
pub(crate) const SMALL: usize = 64;
/// Reply of the throughput and loan cases.
pub(crate) const ACK_LEN: usize = 8;
/// Requests per throughput burst (below the port queue limit of 128).
pub(crate) const BURST: usize = 64;
/// Records per burst of one client in the wake-up case.
const WAKE_BURST: usize = 16;
/// Clients of the wake-up case.
const WAKE_CLIENTS: usize = 8;
/// Frame sizes of the loan case.
const LOAN_SIZES: &[usize] = &[64 << 10, 1 << 20, 8 << 20];
/// How long a bench server polls before it sleeps, in the spinning case.
pub(crate) const SERVER_SPIN: Duration = Duration::from_millis(2);

pub(crate) fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

pub(crate) fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Per-transport results of a phase: one case.
type Measured = Lane;

/// Runs `spawn` with the servers it starts on `server_cpu`, then moves this thread to
/// `client_cpu`.
fn spawn_pinned<T>(server_cpu: usize, client_cpu: usize, spawn: impl FnOnce() -> T) -> Result<T, BenchError> {
    pin::place(Some(PinPlan { client: client_cpu, server: server_cpu }), spawn)
}

fn spawn_or_note<T: Transport + 'static>(
    r: io::Result<T>,
    what: &str,
    ts: &mut Vec<Box<dyn Transport>>,
    notes: &mut Notes,
) {
    match r {
        Ok(t) => ts.push(Box::new(t)),
        Err(e) => notes.not_measured(what, format!("could not run here: {e}")),
    }
}

/// Interleaved rounds of 64 B round trips on `schedule`. The servers stop at the end.
fn round_trips(ts: Vec<Box<dyn Transport>>, schedule: Schedule) -> Vec<Measured> {
    let mut lanes = Lanes::new(ts, 1);
    lanes.measure(0, SMALL, schedule, "");
    lanes.finish()
}

/// The spinning case's rounds: `warm` untimed round trips start each batch and bring
/// both ends back to polling.
fn spinning_schedule(quick: bool) -> Schedule {
    let (rounds, per_round) = if quick { (20, 200) } else { (50, 2000) };
    Schedule { warm: 5, ..Schedule::new(rounds, per_round) }
}

/// The blocking case's rounds, each a window of the headline `shm_rtt_64B_block_vs_futex`
/// ([`block_windows`]). Everything runs on CPU 0 with the other helpers' processes, so
/// a round trip includes whom the scheduler runs at each wake-up: that moves over
/// hundreds of milliseconds, and 20 rounds measured back to back (0.1 s in all, the
/// quick mode until 2026-11-26) read it from one moment (ratio 1.21 in one run, 1.30 in
/// the next). So the rounds are spread over the phase by a rest before each (quick:
/// 13 rounds over about 1 s; full: 21 rounds over about 3 s), and the headline is the
/// round whose ratio of p50s is the median ([`Windowed::median_window`]): a batch is
/// fast (~5 µs) or slow (~8 µs, another process wanted CPU 0) as a whole, and each
/// side's own median picks whichever state that side met in most of its rounds.
fn blocking_schedule(quick: bool) -> Schedule {
    let (rounds, per_round, rest) = if quick { (13, 300, 80) } else { (21, 5000, 100) };
    Schedule { warm: 2, rest: Duration::from_millis(rest), ..Schedule::new(rounds, per_round) }
}

/// Phase 1, spinning: client on CPU 0, servers on `server_cpu`, both ends polling.
fn spinning(quick: bool, server_cpu: usize, notes: &mut Notes) -> Result<Vec<Measured>, BenchError> {
    let mut ts: Vec<Box<dyn Transport>> = Vec::new();
    spawn_pinned(server_cpu, 0, || {
        spawn_or_note(ShmTransport::spawn("ictus-shm spin", SERVER_SPIN, 0, 0), "ictus-shm", &mut ts, notes);
        spawn_or_note(IceoryxTransport::spawn(), "iceoryx2", &mut ts, notes);
        spawn_or_note(FutexPeer::spawn(SMALL, SMALL), "futex peer", &mut ts, notes);
        spawn_or_note(PortTransport::spawn(PortMode::CallInline), "port call", &mut ts, notes);
    })?;
    Ok(round_trips(ts, spinning_schedule(quick)))
}

/// Phase 2, blocking: everything on CPU 0, nobody spins.
fn blocking(quick: bool, notes: &mut Notes) -> Result<Vec<Measured>, BenchError> {
    let mut ts: Vec<Box<dyn Transport>> = Vec::new();
    spawn_pinned(0, 0, || {
        spawn_or_note(ShmTransport::spawn("ictus-shm block", Duration::ZERO, 0, 0), "ictus-shm", &mut ts, notes);
        spawn_or_note(FutexPeer::spawn(SMALL, SMALL), "futex peer", &mut ts, notes);
        spawn_or_note(PortTransport::spawn(PortMode::CallInline), "port call", &mut ts, notes);
    })?;
    Ok(round_trips(ts, blocking_schedule(quick)))
}

/// Runs the experiment.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    let started = Instant::now();
    let mut conditions = Conditions::capture_before();
    let mut notes = Notes::new();
    let server_cpu = if conditions.cpus >= 2 { 1 } else { 0 };
    let q = opts.quick;

    // The measured windows, phase after phase, each with its own servers.
    let (spin, block, throughput, wakeups, loans) = {
        let _affinity = pin::AffinityGuard::save()?;
        let spin = spinning(q, server_cpu, &mut notes)?;
        let block = blocking(q, &mut notes)?;
        // Phase 3: throughput of small records (pipelined bursts), CPU 0 and 1.
        let throughput = measure_throughput(q, server_cpu, &mut notes);
        // Phase 4: wake-ups per message with 8 clients in bursts.
        let wakeups = measure_wakeups(q, server_cpu, &mut notes);
        // Phase 5: large buffers through loans.
        let loans = measure_loans(q, server_cpu, &mut notes);
        (spin, block, throughput, wakeups, loans)
    };
    conditions.pinned = format!("client 0, servers {server_cpu} (spinning, throughput, loans); all on 0 (blocking)");

    // Rows, headlines, the paper's figure.
    let mut report = Report::new("shm", "002 §3, 000 §8.4", q, conditions.finish());
    report.hidden_in_table = ["transport", "phase", "mean_ns"].iter().map(|s| s.to_string()).collect();
    add_rows(&mut report, [("spin", &spin), ("block", &block)], &throughput, &wakeups, &loans, &mut notes);
    add_headlines_and_figure(&mut report, &spin, &block, &wakeups, &mut notes);
    notes.push(format!(
        "64 B round trips: request 64 B; ictus-shm, iceoryx2 and futex echo 64 B, the port call answers {} B",
        crate::peers::REPLY_LEN
    ));
    notes.push("spinning: both ends poll, and every server sleeps after 2 ms without traffic (so it does not compete with the next transport's server); blocking: nobody polls, one CPU");
    let b = blocking_schedule(q);
    notes.push(format!(
        "shm_rtt_64B_block_vs_futex: {} rounds of {} round trips per transport, {} ms apart, in rotating order; the p50 of \
         each side per round, a row per round; the headline is the round whose ratio is the median of the rounds' \
         (each batch is fast or slow as a whole, as other processes want CPU 0 or not: each side's own median would \
         pick whichever state it met more often)",
        b.rounds,
        b.per_round,
        b.rest.as_millis()
    ));
    notes.push(format!(
        "wake-ups: {WAKE_CLIENTS} client threads, bursts of {WAKE_BURST} x 64 B with 50-300 µs pauses; counted by the clients (FUTEX_WAKE or eventfd writes); the peer's 1.0 is a socket's or port's one notification per message"
    ));
    notes.push("loans: the frame is written into the pool buffer before timing; the server touches every page; port ool maps a sealed memfd (MAP_POPULATE); the futex peer copies the frame into its shared area inside the timed region");
    notes.push("the machine is shared with other builds: absolute numbers are noisy; ratios are measured together");
    notes.push(format!("measured in {:.1} s", started.elapsed().as_secs_f64()));
    report.add_notes(notes);
    let svg = plot_svg(&report);
    Ok(Outcome::new(report, svg))
}

/// A row per round trip, throughput, wake-up and loan case.
fn add_rows(
    report: &mut Report,
    phases: [(&str, &[Measured]); 2],
    throughput: &[(String, Throughput)],
    wakeups: &[Wakeups],
    loans: &[Measured],
    notes: &mut Notes,
) {
    for (phase, ms) in phases {
        for m in ms.iter() {
            if m.cases[0].count() > 0 {
                report.rows.push(
                    m.cases[0]
                        .row(format!("{} 64 B RTT ({phase})", m.name))
                        .with("transport", m.name.as_str())
                        .with("phase", phase)
                        .with("p90_ns", m.cases[0].quantile(0.9))
                        .to_value(),
                );
            }
            if let Some(f) = &m.failed {
                notes.not_measured(format!("{} ({phase})", m.name), format!("stopped: {f}"));
            }
        }
    }
    for (name, t) in throughput {
        report.rows.push(json!({
            "case": format!("{name} throughput, bursts of {BURST} x 64 B"),
            "transport": name,
            "msgs_per_s_median": t.median, "msgs_per_s_min": t.min, "msgs_per_s_max": t.max, "runs": t.runs,
        }));
    }
    for w in wakeups {
        report.rows.push(json!({
            "case": format!("ictus-shm wake-ups, {WAKE_CLIENTS} clients, server {}", w.label),
            "transport": "ictus-shm",
            "messages": w.messages, "wakeup_syscalls": w.wakeups,
            "wakeups_per_msg": w.per_msg(),
        }));
    }
    for m in loans {
        if m.cases[0].count() > 0 {
            report.rows.push(m.cases[0].row(m.name.clone()).with("transport", m.description.as_str()).to_value());
        }
        if let Some(f) = &m.failed {
            notes.not_measured(&m.name, format!("stopped: {f}"));
        }
    }
}

/// The three headlines and the paper's shared-memory signalling.
fn add_headlines_and_figure(
    report: &mut Report,
    spin: &[Measured],
    block: &[Measured],
    wakeups: &[Wakeups],
    notes: &mut Notes,
) {
    let p50 = |ms: &[Measured], name: &str| {
        ms.iter()
            .find(|m| m.name == name && m.cases[0].count() > 0)
            .map(|m| (m.cases[0].quantile(0.5) as f64, m.description.clone()))
    };
    match (p50(spin, "ictus-shm spin"), p50(spin, "iceoryx2")) {
        (Some((ours, _)), Some((peer, d))) => report
            .headline
            .push(Headline::new("shm_rtt_64B_spin_vs_iceoryx2", ours, peer, d, "ns", Better::Lower).with_target(1.0)),
        _ => notes.push("headline shm_rtt_64B_spin_vs_iceoryx2 omitted: a transport did not run"),
    }
    let futex = block.iter().find(|m| m.name == "futex shm");
    let windows = block_windows(block.iter().find(|m| m.name == "ictus-shm block"), futex);
    match windows.as_ref().and_then(|w| Some((w, w.median_window()?))) {
        Some((w, (ours, peer))) => {
            let d = futex.map_or("futex shm", |f| f.description.as_str());
            report
                .headline
                .push(Headline::new("shm_rtt_64B_block_vs_futex", ours, peer, d, "ns", Better::Lower).with_target(1.3));
            let what = "ictus-shm block vs futex shm 64 B RTT p50";
            report.rows.extend(w.rows(what, "ns"));
            report.rows.push(json!({
                "case": format!("{what}: the median window by ratio (the headline)"),
                "ours": ours.round(), "peer": peer.round(), "unit": "ns", "ratio": (ours / peer * 1000.0).round() / 1000.0,
            }));
        }
        None => notes.push("headline shm_rtt_64B_block_vs_futex omitted: a transport did not run"),
    }
    match wakeups.first() {
        Some(w) if w.messages > 0 => report.headline.push(
            Headline::new(
                "shm_wakeups_per_msg_8clients",
                w.per_msg(),
                1.0,
                "one notification per message (a socket or a port)",
                "wake-ups/msg",
                Better::Lower,
            )
            .with_target(0.2),
        ),
        _ => notes.push("headline shm_wakeups_per_msg_8clients omitted: not measured"),
    }
    let paper = PaperFigure::new(
        "shared-memory signalling, one way (000 §8.4)",
        "0.16 ms",
        Some(160_000.0),
        "ns",
        Better::Lower,
    );
    report.paper_figures.push(match p50(block, "ictus-shm block") {
        Some((rtt, _)) => {
            paper.ours(Some(rtt / 2.0), format!("ictus-shm, blocking: {} (p50 RTT/2, 64 B)", format_ns(rtt / 2.0)))
        }
        None => paper.ours(None, "not measured"),
    });
}

/// Each round of the blocking case as a window: `(ours, peer)` p50s of the batches both
/// ran in that round ([`Windowed`]: each side's median across the windows, the ratio of
/// the medians). `None` if either lane is missing or has no round.
fn block_windows(ours: Option<&Measured>, peer: Option<&Measured>) -> Option<Windowed> {
    let (ours, peer) = (ours?, peer?);
    Windowed::new(ours.round_p50s[0].iter().copied().zip(peer.round_p50s[0].iter().copied()))
}

fn measure_throughput(quick: bool, server_cpu: usize, notes: &mut Notes) -> Vec<(String, Throughput)> {
    let (runs, bursts) = if quick { (5, 100) } else { (15, 1000) };
    let mut out = Vec::new();
    let spawned =
        spawn_pinned(server_cpu, 0, || (ShmTransport::spawn("ictus-shm", SERVER_SPIN, 0, 0), PortBurst::spawn()));
    let Ok((ours, port)) = spawned else {
        notes.not_measured("throughput", "pinning failed");
        return out;
    };
    let (mut ours, mut port) = match (ours, port) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            notes.not_measured("throughput", format!("could not run: {:?} {:?}", a.err(), b.err()));
            return out;
        }
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        match ours.burst_rate(SMALL, bursts) {
            Ok(r) => a.push(r),
            Err(e) => notes.not_measured("ictus-shm throughput", e),
        }
        match port.burst_rate(bursts) {
            Ok(r) => b.push(r),
            Err(e) => notes.not_measured("port throughput", e),
        }
    }
    if let Some(t) = Throughput::from_runs(&a) {
        out.push(("ictus-shm".to_string(), t));
    }
    if let Some(t) = Throughput::from_runs(&b) {
        out.push(("port send/recv".to_string(), t));
    }
    out
}

/// Port send/receive pipelined in bursts: the client sends `BURST` 64-byte requests
/// to the server's port, then receives their 8-byte replies on its own reply port.
struct Wakeups {
    label: &'static str,
    messages: u64,
    wakeups: u64,
}

impl Wakeups {
    fn per_msg(&self) -> f64 {
        if self.messages == 0 {
            f64::NAN
        } else {
            self.wakeups as f64 / self.messages as f64
        }
    }
}

fn measure_wakeups(quick: bool, server_cpu: usize, notes: &mut Notes) -> Vec<Wakeups> {
    let bursts = if quick { 60 } else { 600 };
    let mut out = Vec::new();
    for (label, spin) in [("blocking at once", Duration::ZERO), ("spinning 20 µs first", Duration::from_micros(20))] {
        match wakeups_once(spin, bursts, server_cpu) {
            Ok((messages, wakeups)) => out.push(Wakeups { label, messages, wakeups }),
            Err(e) => notes.not_measured(format!("wake-ups ({label})"), format!("could not run: {e}")),
        }
    }
    out
}

fn wakeups_once(spin: Duration, bursts: usize, server_cpu: usize) -> io::Result<(u64, u64)> {
    let server = spawn_pinned(server_cpu, 0, || ShmTransport::spawn("ictus-shm", spin, 0, 0))
        .map_err(|e| io::Error::other(e.to_string()))??;
    let mut clients = vec![];
    for _ in 0..WAKE_CLIENTS {
        clients.push(server.another_channel()?);
    }
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            std::thread::spawn(move || -> io::Result<(u64, u64)> {
                let mut x = i as u64 * 7919 + 1;
                let payload = [0u8; SMALL];
                let timeout = Some(Duration::from_secs(30));
                for _ in 0..bursts {
                    for _ in 0..WAKE_BURST {
                        c.send_wait(SINK, &payload, timeout).map_err(other)?;
                    }
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    std::thread::sleep(Duration::from_micros(50 + (x >> 33) % 250));
                }
                // Wait until the server has consumed everything.
                c.send_wait(ACK, &payload, timeout).map_err(other)?;
                drop(c.recv(timeout).map_err(other)?);
                let s = c.stats();
                Ok((s.sent, s.wakeups))
            })
        })
        .collect();
    let (mut msgs, mut wakes) = (0, 0);
    for h in handles {
        let (m, w) = h.join().map_err(|_| other("client thread panicked"))??;
        msgs += m;
        wakes += w;
    }
    drop(server);
    Ok((msgs, wakes))
}

fn measure_loans(quick: bool, server_cpu: usize, notes: &mut Notes) -> Vec<Measured> {
    let iters = if quick { 30 } else { 300 };
    let max = *LOAN_SIZES.iter().max().unwrap_or(&(1 << 20));
    let spawned = spawn_pinned(server_cpu, 0, || {
        (
            ShmTransport::spawn("ictus-shm loan", SERVER_SPIN, 4, max as u32),
            PortTransport::spawn(PortMode::CallOol),
            FutexPeer::spawn(ACK_LEN, max),
        )
    });
    let Ok((ours, port, futex)) = spawned else {
        notes.not_measured("loans", "pinning failed");
        return Vec::new();
    };
    let (mut ours, mut port, mut futex) = match (ours, port, futex) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (a, b, c) => {
            notes.not_measured("loans", format!("could not run: {:?} {:?} {:?}", a.err(), b.err(), c.err()));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for &size in LOAN_SIZES {
        let mut recs: Vec<Measured> = ["ictus-shm pool loan", "port ool", "futex shm (copy in)"]
            .iter()
            .map(|n| Lane::new(format!("{n} {}", format_size(size)), *n, 1))
            .collect();
        let per = (iters / 5).max(1);
        for _ in 0..5 {
            let r = [ours.loan_round_trips(size, per), port.round_trips(size, per), futex.round_trips(size, per)];
            for (m, r) in recs.iter_mut().zip(r) {
                match r {
                    Ok(s) => m.cases[0].record_all(&s),
                    Err(e) => m.failed = Some(e.to_string()),
                }
            }
        }
        out.extend(recs);
    }
    out
}

/// Latency tails of the round-trip cases: one sample in N slower than y.
pub fn plot_svg(report: &Report) -> String {
    let mut series = Vec::new();
    for row in &report.rows {
        let (Some(name), Some(phase)) =
            (row.get("transport").and_then(|v| v.as_str()), row.get("phase").and_then(|v| v.as_str()))
        else {
            continue;
        };
        let q = |k: &str| row.get(k).and_then(|v| v.as_f64());
        let mut points = Vec::new();
        for (n, key) in [(2.0, "p50_ns"), (10.0, "p90_ns"), (100.0, "p99_ns"), (1000.0, "p999_ns")] {
            if let Some(v) = q(key) {
                points.push((n, v.max(1.0)));
            }
        }
        series.push(Series { name: format!("{name} ({phase})"), points });
    }
    Plot {
        title: format!("shm: 64 B round-trip tails{}", if report.quick { " [quick]" } else { "" }),
        x: Axis {
            label: "one round trip in N is slower than".to_string(),
            scale: Scale::Log10,
            ticks: TickFormat::Plain,
        },
        y: Axis { label: "round trip".to_string(), scale: Scale::Log10, ticks: TickFormat::Nanoseconds },
        series,
    }
    .render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_rate_is_wakeups_over_messages() {
        let w = Wakeups { label: "x", messages: 100, wakeups: 5 };
        assert!((w.per_msg() - 0.05).abs() < 1e-12);
        assert!(Wakeups { label: "x", messages: 0, wakeups: 0 }.per_msg().is_nan());
    }

    #[test]
    fn the_blocking_headline_is_a_median_over_rounds_spread_in_time() {
        let lane = |name: &str, p50s: &[f64]| {
            let mut l = Lane::new(name, name, 1);
            l.round_p50s[0] = p50s.to_vec();
            l
        };
        // Round 2's futex batch met a busy moment, round 3's ours; neither decides.
        let ours = lane("ictus-shm block", &[5000.0, 5100.0, 9000.0, 4900.0]);
        let futex = lane("futex shm", &[4000.0, 8000.0, 4100.0, 3900.0]);
        let w = block_windows(Some(&ours), Some(&futex)).unwrap();
        assert_eq!((w.ours, w.peer), (5050.0, 4050.0));
        assert_eq!(w.windows.len(), 4);
        assert_eq!(w.median_window(), Some((4950.0, 3950.0)), "rounds 1 and 4 hold the middle ratios");
        assert!(block_windows(Some(&ours), None).is_none());
        assert!(block_windows(Some(&lane("x", &[])), Some(&futex)).is_none());
        for quick in [true, false] {
            let s = blocking_schedule(quick);
            assert!(s.rounds >= 9 && !s.rest.is_zero(), "windows spread over the phase: {s:?}");
        }
        assert_eq!(spinning_schedule(true).rest, Duration::ZERO, "the spinning case is unchanged");
    }

    #[test]
    fn the_plot_has_a_series_per_round_trip_row() {
        use ictus_bench::LatencyRecorder;
        let mut report = Report::new("shm", "x", true, Conditions::capture_before());
        let mut r = LatencyRecorder::new();
        r.record_all(&[1000, 2000, 3000]);
        report
            .rows
            .push(r.row("a").with("transport", "ictus-shm").with("phase", "spin").with("p90_ns", 2500u64).to_value());
        report.rows.push(json!({"case": "throughput", "transport": "x"}));
        let svg = plot_svg(&report);
        assert!(svg.contains("ictus-shm (spin)"));
        ictus_bench::plot::check_well_formed(&svg).expect("well-formed");
    }
}
