//! `ictus bench mars`: paper 001's Tables 1–3 on today's Linux, beside nginx, fio and
//! curl from Debian, and a `splice` loop.
//!
//! **The slow disk.** This VM's disk is fast and cached by the host, so a slow disk is
//! made visible: each "disk" is a loop device `U` (where the I/O scheduler runs:
//! mq-deadline or BFQ) stacked on a loop device `L` over a file, and `L`'s reads are
//! throttled with the cgroup-v1 blkio controller (`blkio.throttle.read_bps_device`) for
//! one cgroup that holds the experiment and every peer it starts. On this kernel the v1
//! throttle is per cgroup and not hierarchical, and the loop driver charges a stacked
//! read to the cgroup of the process that issued it, so one cgroup is the only way all
//! readers share one budget, as they share a real disk; the throttle sits below `U`'s
//! scheduler, as a disk's own queue does. Device-mapper (dm-delay), null_blk, nbd and
//! ublk are not in this kernel, and cgroup v2's `io.max` is not available (blkio is
//! bound to the v1 hierarchy). Needs root; without it, Tables 1–3 are skipped (and the
//! notes say so) and the HTTP comparison runs alone.
//!
//! Everything made — loop devices, the cgroup, the ext4 mount nginx serves from,
//! files, child processes — is torn down when the experiment ends, fails or is
//! interrupted ([`rig`]), and checked to be gone.
//!
//! - **Table 1** ([`tables::table1`]): read/send against stream read/send, one disk and
//!   striped over two. Headline `mars_striped_vs_single`.
//! - **Table 2** ([`tables::table2`]): one real-time stream at 40 % of a disk under 0–4
//!   background readers — ours (fio readers; the same with BFQ and the engine at
//!   `ionice -c1`; the readers as downloads through our DRR, the paper's setting) and
//!   nginx with mq-deadline, with BFQ + `ionice -c1`, and with BFQ's
//!   `strict_guarantees` + `ionice -c1` (what BFQ's documentation advises for
//!   streaming) — and at 60 and 75 % under the most readers, where what the background
//!   is left can differ. Headlines `mars_rt_held_4bg`, `mars_rt_held_4bg_drr`,
//!   `mars_bg_vs_bfq` (at the highest share where ours and BFQ in either configuration
//!   hold the stream, down to 10 %), `mars_bg_vs_bfq_40`.
//! - **Table 3** ([`tables::table3`]): three streams paced by 60, 75 and 120 ms upcalls.
//! - **HTTP** ([`http::http`]): throughput and sender CPU per GB of ours (spliced from
//!   the page cache, and through the `O_DIRECT` buffers), nginx and a splice loop, cold
//!   and warm. Headlines `mars_http_vs_nginx`, `mars_cpu_per_gb_vs_splice`.

pub mod account;
pub mod client;
pub mod http;
pub mod rig;
pub mod tables;

use std::path::PathBuf;

use ictus_bench::report::{Headline, PaperFigure, Report};
use ictus_bench::{BenchError, Conditions, Experiment, Options, Outcome};
use serde_json::Value;

use rig::{err, Rig};

/// `ictus bench mars`.
pub static MARS: Experiment = Experiment {
    name: "mars",
    about: "MARS (001 Tables 1-3): striped stream read/send against read/send, a real-time stream under \
            background readers against nginx (mq-deadline; BFQ + ionice -c1), upcall-paced streams, HTTP \
            throughput and CPU per GB against nginx and splice",
    figures: &[8, 9, 10],
    quick_s: 150.0,
    full_s: 1500.0,
    roles: &[],
    args,
    run,
};

/// Where in the papers.
pub const PAPER: &str = "001 Tables 1-3";
/// The engine's and nginx's `SCHED_FIFO` priority in the tables.
pub const ENGINE_FIFO: u8 = 50;
/// The measuring clients' `SCHED_FIFO` priority.
pub const CLIENT_FIFO: u8 = 60;

/// What the sections add to the report.
#[derive(Debug, Default)]
pub struct Out {
    /// Rows.
    pub rows: Vec<Value>,
    /// Headlines.
    pub headline: Vec<Headline>,
    /// The paper's figures beside ours.
    pub figures: Vec<PaperFigure>,
    /// Notes.
    pub notes: Vec<String>,
}

/// The median of `v` (NaN if empty).
pub fn med(v: &[f64]) -> f64 {
    ictus_bench::stats::median(v.iter().copied()).unwrap_or(f64::NAN)
}

/// One section of the run: it measures with the rig and adds to the output.
type Part<'a> = dyn Fn(&mut Rig, &mut Out) -> Result<(), BenchError> + 'a;

const PARTS: [&str; 4] = ["table1", "table2", "table3", "http"];

fn args() -> Vec<clap::Arg> {
    vec![clap::Arg::new("only")
        .long("only")
        .value_delimiter(',')
        .value_parser(clap::builder::PossibleValuesParser::new(PARTS))
        .help("Run only these parts (comma-separated): table1, table2, table3, http")]
}

fn run(opts: &Options) -> Result<Outcome, BenchError> {
    let signals = rig::StopOnSignals::register();
    let result = run_parts(opts);
    drop(signals);
    let report = result?;
    Ok(Outcome { report, plots: Vec::new() })
}

fn run_parts(opts: &Options) -> Result<Report, BenchError> {
    let only: Vec<String> =
        opts.extra.try_get_many::<String>("only").ok().flatten().into_iter().flatten().cloned().collect();
    let wanted = |p: &str| only.is_empty() || only.iter().any(|o| o == p);
    let conditions = Conditions::capture_before();
    crate::cli::raise_nofile();
    let base = std::env::var_os("ICTUS_MARS_BENCH_DIR").map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    rig::sweep_stale(&base);
    let quick = opts.quick;
    let mut out = Out::default();
    if let Some(p) = opts.pin {
        // Decided in the mars5 session (doc/mars.md, "Placement"): measured pinned, the
        // cold downloads lost throughput and CPU, and Table 2's FIFO threads (engine,
        // nginx, player) would share one CPU with fio and the downloads.
        out.notes.push(format!(
            "--pin {},{} not applied: this experiment places no thread (engine, io_uring workers, nginx, fio, curl and the players run where the scheduler puts them; the conditions say pinned = none)",
            p.client, p.server
        ));
    }
    let tables = ["table1", "table2", "table3"].iter().any(|p| wanted(p));
    let result = (|| -> Result<(), BenchError> {
        if tables {
            let mut rig = Rig::new(base.join(format!("{}{}", rig::PREFIX, std::process::id())))?;
            let rate: u64 = 40 << 20;
            let clip_len: u64 = if quick { 96 << 20 } else { 320 << 20 };
            let disk = 2 * clip_len + (512 << 20);
            match rig::make_slow_disks(&mut rig, 4, disk, rate) {
                Err(why) => out.notes.push(format!("Tables 1-3 skipped: could not make a slow disk here ({why})")),
                Ok(slow) => {
                    out.notes.push(format!(
                        "slow disks: a loop device (the scheduler) over a loop device throttled to {:.1} MB/s by cgroup-v1 blkio.throttle.read_bps_device, one cgroup holding the experiment and every peer; 4 such disks",
                        slow.rate as f64 / 1e6
                    ));
                    let layout = tables::layout(&mut rig, &slow, clip_len)?;
                    let parts: [(&str, &Part<'_>); 3] = [
                        ("table1", &|_, o| tables::table1(&layout, quick, o)),
                        ("table2", &|r, o| tables::table2(r, &layout, quick, o)),
                        ("table3", &|_, o| tables::table3(&layout, quick, o)),
                    ];
                    for (name, part) in parts {
                        if !wanted(name) {
                            continue;
                        }
                        opts.say(format!("mars: {name}"));
                        if let Err(e) = part(&mut rig, &mut out) {
                            if rig::stopped() {
                                return Err(e);
                            }
                            out.notes.push(format!("{name} stopped: {e}"));
                        }
                    }
                }
            }
            drop(rig);
        }
        if wanted("http") {
            opts.say("mars: http");
            let mut rig = Rig::new(base.join(format!("{}{}-http", rig::PREFIX, std::process::id())))?;
            if let Err(e) = http::http(&mut rig, quick, &mut out) {
                if rig::stopped() {
                    return Err(e);
                }
                out.notes.push(format!("HTTP stopped: {e}"));
            }
        }
        Ok(())
    })();
    // Whatever happened, nothing the run made may be left.
    let left = rig::leftovers();
    if !left.is_empty() {
        return Err(err("tearing down", format!("left behind: {}", left.join("; "))));
    }
    result?;
    let mut report = Report::new(MARS.name, PAPER, quick, conditions.finish());
    report.rows = out.rows;
    report.headline = out.headline;
    report.paper_figures = out.figures;
    report.notes = out.notes;
    Ok(report)
}
