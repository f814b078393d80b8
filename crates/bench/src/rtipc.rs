//! The `rtipc` experiment: the per-message cost of real-time ports under each policy
//! against a plain port (paper 003 §5.1, Figure 4; the paper found RT-IPC 10–20 %
//! dearer than Mach IPC).
//!
//! Each transport is a client thread here doing timed round trips (N-byte request,
//! [`REPLY_LEN`]-byte reply) with its own server process: the plain port is the `ipc`
//! experiment's `port inline` (`Space::call`); the real-time ports are `ictus-rtipc`
//! ports allocated by the server with FIFO/OFF, PRIO/OFF, PRIO/ON and BPI/ON. With
//! real-time privileges the servers run at `SCHED_FIFO` [`SERVER_PRIO`] and the client
//! at [`CLIENT_PRIO`], so hand-off really changes the server's priority on every
//! message (and the server returns to its own at its next receive), as in the paper.
//! Transports take turns in rounds, so noise falls on all alike.

use std::io;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use ictus_ipc::{Disposition, Message, PortArg, ReceiveOptions, Received, SendOptions as IpcSend, Space};
use ictus_rt::thread::Policy;
use ictus_rtipc::{PortAttrs, RtClient, RtSpace, SendOptions};
use serde_json::json;

use crate::child::{fd_arg, reap, spawn_child};
use crate::conditions::Conditions;
use crate::ipc::{Transport, REPLY_LEN};
use crate::pin::{self, PinPlan};
use crate::ports::{PortMode, PortTransport};
use crate::report::{Better, Headline, PaperFigure, Report};
use crate::stats::LatencyRecorder;
use crate::svg::{Axis, Plot, Scale, Series, TickFormat};
use crate::{format_size, BenchError};

/// Message sizes measured.
pub const SIZES: &[usize] = &[64, 256, 1024, 4096, 16384];
/// Buffer size of the real-time ports (the largest size).
const BUFFER: u32 = 16384;
/// The servers' own priority (when permitted).
pub const SERVER_PRIO: u8 = 40;
/// The client's priority (when permitted): hand-off raises the server to it.
pub const CLIENT_PRIO: u8 = 50;
const WATCHDOG: Duration = Duration::from_secs(60);
const PLAIN: &str = "plain port";
const POLICIES: &[&str] = &["FIFO/OFF", "PRIO/OFF", "PRIO/ON", "BPI/ON"];

/// Options of `ictus bench rtipc`.
#[derive(Debug, Clone, Default)]
pub struct RtipcOptions {
    /// Seconds instead of minutes.
    pub quick: bool,
    /// Where to write the JSON report (the plot goes beside it).
    pub json: Option<PathBuf>,
    /// CPU placement; unpinned when `None`.
    pub pin: Option<PinPlan>,
}

/// The attributes a policy label names (`FIFO/OFF`, `PRIO/ON`, `BPI/ON`, …).
pub fn attrs_for(label: &str) -> Option<PortAttrs> {
    use ictus_rtipc::{Handoff, Queueing};
    let (q, h) = label.split_once('/')?;
    let q = match q {
        "FIFO" => Queueing::Fifo,
        "PRIO" => Queueing::Priority,
        "BPI" => Queueing::PriorityInheritance,
        _ => return None,
    };
    let h = match h {
        "OFF" => Handoff::Off,
        "ON" => Handoff::Sender,
        "MSG" => Handoff::Message,
        _ => return None,
    };
    Some(PortAttrs::new(q, h))
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A real-time port transport and its server process.
#[derive(Debug)]
pub struct RtTransport {
    name: String,
    description: String,
    client: RtClient,
    _rt: RtSpace,
    reply: Vec<u8>,
    body: Vec<u8>,
    child: Child,
}

impl RtTransport {
    /// Spawns a server process owning a real-time port with `label`'s policies, and
    /// connects to it.
    pub fn spawn(label: &str) -> io::Result<RtTransport> {
        let space = Space::new();
        let setup = space.allocate_port().map_err(other)?;
        let fd = space.send_right_fd(setup).map_err(other)?;
        let child = {
            use std::os::fd::{AsFd, AsRawFd};
            spawn_child("rtipc-echo", &[fd.as_raw_fd().to_string(), label.to_string()], &[fd.as_fd()])?
        };
        drop(fd);
        let mut r = Received::new();
        space
            .receive(setup, &mut r, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() })
            .map_err(other)?;
        let port = r.ports.first().ok_or_else(|| other("rtipc server sent no port"))?.name;
        space.destroy(setup).map_err(other)?;
        let rt = RtSpace::new(space);
        let client = rt.connect(port).map_err(other)?;
        Ok(RtTransport {
            name: format!("rt {label}"),
            description: format!("ictus-rtipc port, {label}"),
            client,
            _rt: rt,
            reply: vec![0; 64],
            body: vec![0xa5; BUFFER as usize],
            child,
        })
    }
}

impl Transport for RtTransport {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        self.client.refresh_priority();
        let opts = SendOptions { timeout: Some(WATCHDOG), ..SendOptions::default() };
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t0 = Instant::now();
            self.client.call(&self.body[..size], &mut self.reply, opts).map_err(other)?;
            times.push(t0.elapsed().as_nanos() as u64);
        }
        Ok(times)
    }
}

impl Drop for RtTransport {
    fn drop(&mut self) {
        let _ = self.client.send(b"stop", SendOptions { nonblocking: true, ..SendOptions::default() });
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// The `rtipc-echo` role: a real-time port server answering [`REPLY_LEN`] bytes.
pub fn rt_echo_server(args: &[String]) -> i32 {
    match serve(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rtipc-echo: {e}");
            1
        }
    }
}

fn serve(args: &[String]) -> io::Result<()> {
    let fd = fd_arg(args.first().ok_or_else(|| other("missing descriptor"))?)?;
    let label = args.get(1).ok_or_else(|| other("missing policy"))?;
    let attrs = attrs_for(label).ok_or_else(|| other(format!("unknown policy {label}")))?;
    let space = Space::new();
    let setup = space.insert_send_fd(fd).map_err(other)?;
    let rt = RtSpace::new(space.clone());
    let port = rt.allocate(PortAttrs { buffer_size: BUFFER, ..attrs }).map_err(other)?;
    let mut m = Message::new(1, Vec::new());
    m.ports.push(PortArg::new(port, Disposition::CopySend));
    space.send(setup, &mut m, IpcSend::default()).map_err(other)?;
    space.deallocate(setup).map_err(other)?;
    let mut r = rt.associate(port, None).map_err(other)?;
    let mut req = r.request_buffer();
    let reply = [0u8; REPLY_LEN];
    let mut sink = 0u64;
    loop {
        r.receive(&mut req, None).map_err(other)?;
        if req.data() == b"stop" {
            return Ok(());
        }
        // Touch one byte per page, as the `ipc` experiment's receivers do.
        sink = sink.wrapping_add(req.data().iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>());
        std::hint::black_box(sink);
        if req.sync {
            let _ = r.reply(&mut req, &reply);
        }
    }
}

/// `ictus bench rtipc`: runs, prints the table, writes the JSON and plot if asked.
pub fn main(quick: bool, json: Option<PathBuf>, pin: Option<PinPlan>) -> Result<(), BenchError> {
    let report = run(&RtipcOptions { quick, json, pin })?;
    report.print_table();
    Ok(())
}

/// Runs the experiment.
pub fn run(opts: &RtipcOptions) -> Result<Report, BenchError> {
    let started = Instant::now();
    let mut conditions = Conditions::capture_before();
    let mut notes = Vec::new();
    let saved_affinity = pin::saved_affinity().map_err(|e| BenchError::io("reading CPU affinity", e))?;
    let saved_policy = ictus_rt::thread::current_policy();
    let privileged = ictus_rt::thread::rt_privileges();
    if let Some(plan) = opts.pin {
        pin::pin_current_thread(plan.server).map_err(|e| BenchError::io("pinning", e))?;
    }
    // Servers inherit the spawning thread's class.
    if privileged {
        let _ = ictus_rtipc::sys::set_current_policy(Policy::Fifo { priority: SERVER_PRIO });
    } else {
        notes.push(
            "no real-time privilege: client and servers run SCHED_OTHER, hand-off is refused (one warning) and \
             PRIO/ON measures priority queueing only"
                .to_string(),
        );
    }
    let mut transports: Vec<Box<dyn Transport>> = Vec::new();
    match PortTransport::spawn(PortMode::CallInline) {
        Ok(t) => transports.push(Box::new(Named(t, PLAIN))),
        Err(e) => notes.push(format!("plain port could not run: {e}")),
    }
    for label in POLICIES {
        match RtTransport::spawn(label) {
            Ok(t) => transports.push(Box::new(t)),
            Err(e) => notes.push(format!("rt {label} could not run: {e}")),
        }
    }
    if privileged {
        let _ = ictus_rtipc::sys::set_current_policy(Policy::Fifo { priority: CLIENT_PRIO });
    }
    if let Some(plan) = opts.pin {
        let _ = pin::pin_current_thread(plan.client);
        conditions.pinned = plan.describe();
    }
    let measured = measure(&mut transports, opts.quick);
    drop(transports);
    let _ = ictus_rtipc::sys::set_current_policy(saved_policy);
    let _ = pin::restore_affinity(&saved_affinity);

    let mut report = Report::new("rtipc", "003 §5.1, Figure 4", opts.quick, conditions.finish());
    report.conditions.policy = if privileged {
        format!("client SCHED_FIFO {CLIENT_PRIO}, servers SCHED_FIFO {SERVER_PRIO}")
    } else {
        report.conditions.policy.clone()
    };
    report.hidden_in_table = ["transport", "size_bytes", "mean_ns"].iter().map(|s| s.to_string()).collect();
    for (i, &size) in SIZES.iter().enumerate() {
        let plain = measured.iter().find(|m| m.0 == PLAIN).map(|m| &m.2[i]);
        for (name, _, by_size) in &measured {
            let r = &by_size[i];
            if r.count() == 0 {
                continue;
            }
            let vs = plain.filter(|p| p.count() > 0).map(|p| r.quantile(0.5) as f64 / p.quantile(0.5) as f64);
            report.rows.push(
                r.row(format!("{name} {}", format_size(size)))
                    .with("transport", name.as_str())
                    .with("size_bytes", size)
                    .with("vs_plain_p50", vs)
                    .to_value(),
            );
        }
    }
    let p50 = |name: &str, size: usize| -> Option<f64> {
        let i = SIZES.iter().position(|&s| s == size)?;
        let r = &measured.iter().find(|m| m.0 == name)?.2[i];
        (r.count() > 0).then(|| r.quantile(0.5) as f64)
    };
    match (p50("rt PRIO/ON", 64), p50(PLAIN, 64)) {
        (Some(ours), Some(peer)) => report.headline.push(
            Headline::new(
                "rtipc_prio_on_rtt_vs_port",
                ours,
                peer,
                "plain ictus port call (Space::call), 64 B",
                "ns",
                Better::Lower,
            )
            .with_target(1.2),
        ),
        _ => notes.push("headline rtipc_prio_on_rtt_vs_port omitted: a transport did not run".to_string()),
    }
    let ratios: Vec<(String, f64)> =
        POLICIES.iter().filter_map(|l| Some((l.to_string(), p50(&format!("rt {l}"), 64)? / p50(PLAIN, 64)?))).collect();
    let figure = PaperFigure::new(
        "RT-IPC cost per message vs plain IPC",
        "10-20 % more (ratio 1.1-1.2)",
        Some(1.15),
        "ratio",
        Better::Lower,
    );
    report.paper_figures.push(match ratios.iter().find(|(l, _)| l == "PRIO/ON") {
        Some((_, r)) => figure.ours(
            Some(*r),
            format!(
                "64 B round trip p50: {}",
                ratios.iter().map(|(l, r)| format!("{l} {:+.0} %", (r - 1.0) * 100.0)).collect::<Vec<_>>().join(", ")
            ),
        ),
        None => figure,
    });
    report.rows.push(json!({
        "case": "policies vs plain port at 64 B (p50 ratio)",
        "ratios": ratios.iter().map(|(l, r)| json!({"policy": l, "ratio": r})).collect::<Vec<_>>(),
    }));
    notes.push(format!(
        "round trips: N-byte request, {REPLY_LEN}-byte reply; the receiver touches one byte per 4 KiB; the plain \
         port is `ictus bench ipc`'s `port inline`"
    ));
    notes.push(
        "the paper's Figure 5 (sending while the receiver serves another request) is not measured separately; \
         `ictus bench dhs` exercises that case"
            .to_string(),
    );
    notes.push(
        "client and servers are SCHED_FIFO on one CPU: rounds are separated by short rests so that the kernel's \
         real-time throttling (950 ms of every 1 s) does not stall them"
            .to_string(),
    );
    notes.push(format!("measured in {:.1} s", started.elapsed().as_secs_f64()));
    report.notes.extend(notes);
    if let Some(path) = &opts.json {
        report.write_json_and_plot(path, &plot_svg(&report))?;
    }
    Ok(report)
}

/// The plain port transport under this experiment's name.
struct Named(PortTransport, &'static str);

impl Transport for Named {
    fn name(&self) -> &str {
        self.1
    }
    fn description(&self) -> &str {
        self.0.description()
    }
    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        self.0.round_trips(size, iters)
    }
    fn server_pid(&self) -> Option<u32> {
        self.0.server_pid()
    }
}

type Measured = (String, String, Vec<LatencyRecorder>);

fn measure(transports: &mut [Box<dyn Transport>], quick: bool) -> Vec<Measured> {
    let (rounds, per_round, warmup) = if quick { (20, 100, 200) } else { (50, 1000, 2000) };
    let mut out: Vec<Measured> = transports
        .iter()
        .map(|t| {
            (t.name().to_string(), t.description().to_string(), SIZES.iter().map(|_| LatencyRecorder::new()).collect())
        })
        .collect();
    let mut failed = vec![false; transports.len()];
    let n = transports.len();
    for (si, &size) in SIZES.iter().enumerate() {
        for (i, t) in transports.iter_mut().enumerate() {
            if t.round_trips(size, warmup).is_err() {
                failed[i] = true;
            }
        }
        for round in 0..rounds {
            // A short rest per round keeps CPU 0's real-time share under the kernel's
            // throttling limit (950 ms of every second), which would otherwise stall
            // every real-time thread on it for 50 ms.
            std::thread::sleep(Duration::from_millis(if quick { 2 } else { 10 }));
            for k in 0..n {
                let i = (round + k) % n;
                if failed[i] {
                    continue;
                }
                match transports[i].round_trips(size, per_round) {
                    Ok(samples) => out[i].2[si].record_all(&samples),
                    Err(_) => failed[i] = true,
                }
            }
        }
    }
    out
}

/// p50 round trip against size, one series per transport.
pub fn plot_svg(report: &Report) -> String {
    let mut series: Vec<Series> = Vec::new();
    for row in &report.rows {
        if let (Some(name), Some(size), Some(p50)) = (
            row.get("transport").and_then(|v| v.as_str()),
            row.get("size_bytes").and_then(|v| v.as_f64()),
            row.get("p50_ns").and_then(|v| v.as_f64()),
        ) {
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push((size, p50)),
                None => series.push(Series { name: name.to_string(), points: vec![(size, p50)] }),
            }
        }
    }
    Plot {
        title: format!(
            "rtipc: round trip (p50) per policy vs plain port{}",
            if report.quick { " [quick]" } else { "" }
        ),
        x: Axis { label: "message size".to_string(), scale: Scale::Log2, ticks: TickFormat::Bytes },
        y: Axis { label: "time".to_string(), scale: Scale::Log10, ticks: TickFormat::Nanoseconds },
        series,
    }
    .render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_labels_parse() {
        for l in POLICIES {
            assert_eq!(attrs_for(l).map(|a| a.label()), Some(l.to_string()));
        }
        assert!(attrs_for("NOPE/ON").is_none());
        assert!(attrs_for("PRIO").is_none());
    }

    #[test]
    fn plot_is_well_formed() {
        let mut report = Report::new("rtipc", "003", true, Conditions::capture_before());
        let mut r = LatencyRecorder::new();
        r.record_all(&[1000, 2000]);
        report.rows.push(r.row("x").with("transport", "rt PRIO/ON").with("size_bytes", 64usize).to_value());
        crate::svg::check_well_formed(&plot_svg(&report)).expect("well formed");
    }
}
