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
use std::os::fd::{AsFd, AsRawFd};
use std::process::Child;
use std::time::{Duration, Instant};

use ictus_bench::child::{fd_arg, reap, role_status, spawn_child};
use ictus_bench::experiment::no_args;
use ictus_bench::pin;
use ictus_bench::plot::{Axis, Plot, Scale, Series, TickFormat};
use ictus_bench::rounds::{Lane, Lanes, Schedule};
use ictus_bench::{format_size, BenchError, Conditions, Experiment, Options, Outcome, Role, Transport};
use ictus_bench::{Better, Headline, Notes, PaperFigure, Report};
use ictus_ipc::{Disposition, Message, PortArg, ReceiveOptions, Received, SendOptions as IpcSend, Space};
use ictus_rt::thread::Policy;
use ictus_rtipc::{PortAttrs, RtClient, RtSpace, SendOptions};
use serde_json::json;

use crate::peers::ports::{self, PortMode, PortTransport};
use crate::peers::REPLY_LEN;

/// `ictus bench rtipc`.
pub static RTIPC: Experiment = Experiment {
    name: "rtipc",
    about: "Real-time IPC message cost (003 §5.1): round trips through real-time ports under FIFO/OFF, \
            PRIO/OFF, PRIO/ON and BPI/ON beside a plain port, several sizes",
    figures: &[13],
    quick_s: 3.0,
    full_s: 25.0,
    roles: &[&ports::ROLE, &ROLE],
    args: no_args,
    run,
};

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
        let child = spawn_child(&ROLE, &[fd.as_raw_fd().to_string(), label.to_string()], &[fd.as_fd()])?;
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
        // No time-out, as the plain port's timed calls and the peers' blocking reads: a
        // server that dies still ends a call at once (its reply pipe closes), and a
        // time-out would add a `poll` to every wait.
        let opts = SendOptions::default();
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

/// The real-time port server's role.
pub static ROLE: Role = Role { name: "rtipc-echo", run: rt_echo_server };

/// The `rtipc-echo` role: a real-time port server answering [`REPLY_LEN`] bytes.
pub fn rt_echo_server(args: &[String]) -> i32 {
    role_status("rtipc-echo", serve(args))
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

/// Runs the experiment.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    let started = Instant::now();
    let mut conditions = Conditions::capture_before();
    let mut notes = Notes::new();

    // Set-up: servers at their own priority (they inherit the spawning thread's class),
    // then the client at a higher one; both restored at the end.
    let _affinity = pin::AffinityGuard::save()?;
    let saved_policy = ictus_rt::thread::current_policy();
    let privileged = ictus_rt::thread::rt_privileges();
    if !privileged {
        notes.not_measured(
            "real-time priorities and hand-off",
            "no real-time privilege: client and servers run SCHED_OTHER, hand-off is refused (one warning) and \
             PRIO/ON measures priority queueing only",
        );
    }
    let transports = pin::place(opts.pin, || {
        if privileged {
            let _ = ictus_rtipc::sys::set_current_policy(Policy::Fifo { priority: SERVER_PRIO });
        }
        transports(&mut notes)
    })?;
    if privileged {
        let _ = ictus_rtipc::sys::set_current_policy(Policy::Fifo { priority: CLIENT_PRIO });
    }
    if let Some(plan) = opts.pin {
        conditions.pinned = plan.describe();
    }

    // The measured windows.
    let measured = measure(transports, opts.quick);
    let _ = ictus_rtipc::sys::set_current_policy(saved_policy);

    // Rows, the headline and the paper's figure.
    let mut report = Report::new("rtipc", "003 §5.1, Figure 4", opts.quick, conditions.finish());
    if privileged {
        report.conditions.policy = format!("client SCHED_FIFO {CLIENT_PRIO}, servers SCHED_FIFO {SERVER_PRIO}");
    }
    report.hidden_in_table = ["transport", "size_bytes", "mean_ns"].iter().map(|s| s.to_string()).collect();
    add_rows(&mut report, &measured);
    add_headline_and_figure(&mut report, &measured, &mut notes);
    for m in &measured {
        if let Some(failed) = &m.failed {
            notes.not_measured(&m.name, format!("stopped: {failed}"));
        }
    }
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
    report.add_notes(notes);
    let svg = plot_svg(&report);
    Ok(Outcome::new(report, svg))
}

/// The plain port, then a real-time port per policy; one that cannot start is noted.
fn transports(notes: &mut Notes) -> Vec<Box<dyn Transport>> {
    let mut transports: Vec<Box<dyn Transport>> = Vec::new();
    match PortTransport::spawn(PortMode::CallInline) {
        Ok(t) => transports.push(Box::new(Named(t, PLAIN))),
        Err(e) => notes.not_measured("plain port", format!("could not run: {e}")),
    }
    for label in POLICIES {
        match RtTransport::spawn(label) {
            Ok(t) => transports.push(Box::new(t)),
            Err(e) => notes.not_measured(format!("rt {label}"), format!("could not run: {e}")),
        }
    }
    transports
}

/// A row per transport and size, with its median against the plain port's.
fn add_rows(report: &mut Report, measured: &[Measured]) {
    for (i, &size) in SIZES.iter().enumerate() {
        let plain = measured.iter().find(|m| m.name == PLAIN).map(|m| &m.cases[i]);
        for m in measured {
            let r = &m.cases[i];
            if r.count() == 0 {
                continue;
            }
            let vs = plain.filter(|p| p.count() > 0).map(|p| r.quantile(0.5) as f64 / p.quantile(0.5) as f64);
            report.rows.push(
                r.row(format!("{} {}", m.name, format_size(size)))
                    .with("transport", m.name.as_str())
                    .with("size_bytes", size)
                    .with("vs_plain_p50", vs)
                    .to_value(),
            );
        }
    }
}

/// `rtipc_prio_on_rtt_vs_port`, the paper's 10–20 % beside ours, and the row of every
/// policy's ratio at 64 B.
fn add_headline_and_figure(report: &mut Report, measured: &[Measured], notes: &mut Notes) {
    let p50 = |name: &str, size: usize| -> Option<f64> {
        let i = SIZES.iter().position(|&s| s == size)?;
        measured.iter().find(|m| m.name == name)?.p50(i)
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

/// Per-transport results: one case per entry of [`SIZES`].
type Measured = Lane;

/// Every size, transports interleaved in rounds, each round after a short rest (a
/// real-time thread's share of CPU 0 must stay under the kernel's throttling limit,
/// 950 ms of every second, which would otherwise stall every real-time thread on it
/// for 50 ms); the servers stop at the end.
fn measure(transports: Vec<Box<dyn Transport>>, quick: bool) -> Vec<Measured> {
    let (rounds, per_round, warmup) = if quick { (20, 100, 200) } else { (50, 1000, 2000) };
    let rest = Duration::from_millis(if quick { 2 } else { 10 });
    let mut lanes = Lanes::new(transports, SIZES.len());
    for (case, &size) in SIZES.iter().enumerate() {
        let context = format!("at {}: ", format_size(size));
        lanes.warm_up(size, warmup, &context);
        lanes.measure(case, size, Schedule { rest, ..Schedule::new(rounds, per_round) }, &context);
    }
    lanes.finish()
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
        use ictus_bench::LatencyRecorder;
        let mut report = Report::new("rtipc", "003", true, Conditions::capture_before());
        let mut r = LatencyRecorder::new();
        r.record_all(&[1000, 2000]);
        report.rows.push(r.row("x").with("transport", "rt PRIO/ON").with("size_bytes", 64usize).to_value());
        ictus_bench::plot::check_well_formed(&plot_svg(&report)).expect("well formed");
    }
}
