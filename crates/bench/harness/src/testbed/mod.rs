//! `ictus testbed`: every experiment, one report.
//!
//! The testbed runs the experiments of the registry it is given (those `ictus bench
//! --list` names), each as a child process, `ictus bench NAME [--quick] --json DIR/NAME.json`, in a
//! process group of its own, so that one experiment that fails or crashes costs only its
//! own section of the report. Its table goes to `DIR/NAME.txt`, its standard error to
//! `DIR/NAME.stderr.txt` (removed when empty), its plots stay where it wrote them,
//! beside its JSON.
//!
//! While an experiment runs, standard error shows a line per experiment with a progress
//! bar, the time spent and an estimate of the time left, from a small table of expected
//! durations (each [`Experiment`]'s own) scaled by how long the finished experiments took against their
//! expectations. On a terminal the line of the running experiment is redrawn every
//! second; otherwise one line is printed when an experiment starts and one when it ends.
//!
//! Ctrl-C (or SIGTERM, SIGHUP) stops the running experiment's whole process group; the
//! report is still written, with what did not finish marked as interrupted, and the
//! testbed then fails. A second Ctrl-C exits at once.
//!
//! What it writes to DIR, besides each experiment's own files:
//!
//! - `report.md`: the conditions, then per experiment the paper's figures beside ours,
//!   the headlines, the plots and the notes, then what could not run here and why;
//! - `NAME-cdf.svg`: latency tails (one sample in N slower than x) for every experiment
//!   whose rows carry latency percentiles;
//! - `testbed.json`: the run's conditions, each experiment's status, and the headline
//!   `figures_reproduced`, the number of the papers' 19 figures ([`FIGURES`]) that the
//!   report covers with a measured result.
//!
//! The code: this module runs the experiments; [`progress`] draws the progress lines;
//! [`summary`] writes `testbed.json`, `report.md` and the latency-tail plots.

mod progress;
mod summary;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, IsTerminal};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustix::process::Signal;
use serde_json::Value;

use crate::conditions::Conditions;
use crate::experiment::{find, Experiment, FIGURES};
use crate::sys::GuardedCommand;
use crate::BenchError;

use progress::{clock, spawn_redraw, Board};
use summary::{cdf_svg, render_report, testbed_json, Run};

/// Options of `ictus testbed`.
#[derive(Debug, Clone)]
pub struct TestbedOptions {
    /// Seconds per experiment instead of minutes.
    pub quick: bool,
    /// Where the report goes.
    pub out: PathBuf,
    /// Only these experiments (empty: all).
    pub only: Vec<String>,
}

/// Expected duration of an experiment missing from the registry, in seconds.
pub const DEFAULT_EXPECTED_S: f64 = 60.0;

/// How long an interrupted experiment's process group gets to exit after SIGTERM
/// before it is sent SIGKILL.
const GRACE: Duration = Duration::from_secs(3);

/// How an experiment's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// It exited successfully and wrote its JSON.
    Ok,
    /// It could not start, exited with an error, or wrote no readable JSON; why.
    Failed(String),
    /// The testbed was interrupted while it ran.
    Interrupted,
    /// The testbed was interrupted before it started.
    NotRun,
}

impl Status {
    /// The status as `testbed.json` and the report spell it.
    pub fn label(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed(_) => "failed",
            Status::Interrupted => "interrupted",
            Status::NotRun => "not run",
        }
    }
}

/// One experiment's run as the testbed saw it.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) name: String,
    pub(crate) status: Status,
    pub(crate) seconds: f64,
    /// Its JSON object, when it finished and wrote one.
    pub(crate) json: Option<Value>,
    /// SVG files (names in the output directory) it wrote, and ours for it.
    pub(crate) plots: Vec<String>,
    /// The title of each plot, for the report.
    pub(crate) plot_titles: Vec<String>,
    /// Whether `NAME.txt` and `NAME.stderr.txt` exist.
    pub(crate) has_table: bool,
    pub(crate) has_stderr: bool,
}

impl Outcome {
    pub(crate) fn new(name: &str, status: Status) -> Self {
        Outcome {
            name: name.to_string(),
            status,
            seconds: 0.0,
            json: None,
            plots: Vec::new(),
            plot_titles: Vec::new(),
            has_table: false,
            has_stderr: false,
        }
    }

    /// Whether this run measured at least one of the paper's figures.
    pub(crate) fn measured_a_figure(&self) -> bool {
        self.status == Status::Ok
            && self.json.as_ref().is_some_and(|j| {
                summary::array(j, "paper_figures").iter().any(|f| f.get("ours_value").and_then(Value::as_f64).is_some())
            })
    }
}

/// Expected duration of an experiment, in seconds.
fn expected_seconds(registry: &[&Experiment], name: &str, quick: bool) -> f64 {
    find(registry, name).map_or(DEFAULT_EXPECTED_S, |e| if quick { e.quick_s } else { e.full_s })
}

/// The figure numbers an experiment covers.
fn figures_of(registry: &[&Experiment], name: &str) -> &'static [u8] {
    // The registry's experiments are `'static`; the lookup borrows only the slice.
    registry.iter().find(|e| e.name == name).map_or(&[], |e| e.figures)
}

/// The numbers of the papers' figures covered with a measured result: figures of
/// experiments that finished and measured at least one of their paper figures.
fn figures_reproduced(registry: &[&Experiment], outcomes: &[Outcome]) -> BTreeSet<u8> {
    outcomes
        .iter()
        .filter(|o| o.measured_a_figure())
        .flat_map(|o| figures_of(registry, &o.name).iter().copied())
        .collect()
}

/// Runs the testbed: every selected experiment of `registry`, then the report. Fails
/// if `--only` names an unknown experiment, the output cannot be written, or the run
/// was interrupted (after writing the report). Experiments that fail are reported, not
/// errors.
pub fn main(opts: &TestbedOptions, registry: &[&'static Experiment]) -> Result<(), BenchError> {
    let exe = std::env::current_exe().map_err(|e| BenchError::io("finding the ictus binary", e))?;
    let available: Vec<String> = registry.iter().map(|e| e.name.to_string()).collect();
    let selected = select(&available, &opts.only)?;
    fs::create_dir_all(&opts.out).map_err(|e| BenchError::io(format!("creating {}", opts.out.display()), e))?;
    let dir =
        fs::canonicalize(&opts.out).map_err(|e| BenchError::io(format!("resolving {}", opts.out.display()), e))?;
    let stop = install_signal_handlers()?;

    let started_wall = SystemTime::now();
    let started = Instant::now();
    let conditions = Conditions::capture_before();
    let expected: Vec<f64> = selected.iter().map(|n| expected_seconds(registry, n, opts.quick)).collect();
    let board = Arc::new(Board::new(&selected, &expected, io::stderr().is_terminal()));
    let expected = board.lock().left(None);
    board.say(&format!(
        "testbed: {} experiment{}{}, about {} in all; writing to {}",
        selected.len(),
        if selected.len() == 1 { "" } else { "s" },
        if opts.quick { " (quick)" } else { "" },
        clock(expected),
        dir.display()
    ));
    let redraw = board.tty.then(|| spawn_redraw(Arc::clone(&board)));

    let mut outcomes = Vec::new();
    for (i, name) in selected.iter().enumerate() {
        if stop.load(Ordering::SeqCst) {
            outcomes.push(Outcome::new(name, Status::NotRun));
            continue;
        }
        board.start(i);
        let outcome = run_one(&exe, name, opts.quick, &dir, &stop);
        board.finish(i, &outcome);
        outcomes.push(outcome);
    }
    if let Some((tx, handle)) = redraw {
        drop(tx);
        let _ = handle.join();
    }
    let interrupted = stop.load(Ordering::SeqCst);
    let conditions = conditions.finish();
    let run = Run { started: started_wall, seconds: started.elapsed().as_secs_f64(), quick: opts.quick, interrupted };

    for outcome in &mut outcomes {
        if let Some(svg) = outcome.json.as_ref().and_then(|json| cdf_svg(&outcome.name, json)) {
            let file = format!("{}-cdf.svg", outcome.name);
            write_file(&dir.join(&file), &svg)?;
            outcome.plots.push(file);
        }
        let cdf = format!("{}-cdf.svg", outcome.name);
        outcome.plot_titles = outcome
            .plots
            .iter()
            .map(|p| match p {
                p if *p == cdf => {
                    format!("{}: latency tails per case, one sample in N took longer than x", outcome.name)
                }
                p => svg_title(&dir.join(p)).unwrap_or_else(|| p.clone()),
            })
            .collect();
    }
    let summary = testbed_json(registry, &run, &conditions, &outcomes);
    let mut summary_text =
        serde_json::to_string_pretty(&summary).map_err(|e| BenchError::io("serializing testbed.json", e.into()))?;
    summary_text.push('\n');
    write_file(&dir.join("testbed.json"), &summary_text)?;
    let report_path = dir.join("report.md");
    write_file(&report_path, &render_report(registry, &run, &conditions, &outcomes))?;

    let ok = outcomes.iter().filter(|o| o.status == Status::Ok).count();
    let covered = figures_reproduced(registry, &outcomes).len();
    let interrupted_text = if interrupted { "; interrupted" } else { "" };
    println!(
        "testbed: {ok} of {} experiments ran{interrupted_text}; the papers' figures reproduced: {covered} of {}",
        outcomes.len(),
        FIGURES.len()
    );
    println!("testbed: report: {}", report_path.display());
    if interrupted {
        return Err(BenchError::io(
            format!("testbed interrupted; {} has what finished", report_path.display()),
            io::Error::from(io::ErrorKind::Interrupted),
        ));
    }
    Ok(())
}

/// The experiments to run: all of `available`, or those of `only`, in the order of
/// `available`. Names not in `available` are an error.
fn select(available: &[String], only: &[String]) -> Result<Vec<String>, BenchError> {
    let unknown: Vec<&str> = only.iter().filter(|n| !available.contains(n)).map(String::as_str).collect();
    if !unknown.is_empty() {
        return Err(BenchError::io(
            format!("--only {}", unknown.join(" ")),
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no such experiment; `ictus bench --list` has: {}", available.join(", ")),
            ),
        ));
    }
    Ok(available.iter().filter(|n| only.is_empty() || only.contains(n)).cloned().collect())
}

/// Makes SIGINT, SIGTERM and SIGHUP set the returned flag instead of killing the
/// testbed; the same signal arriving again once the flag is set exits at once with
/// status 130. The handlers stay installed for the rest of the process, which ends
/// right after the testbed.
fn install_signal_handlers() -> Result<Arc<AtomicBool>, BenchError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM, SIGHUP] {
        // The shutdown must be registered first: it runs before the flag is set, so only
        // a second signal finds the flag already set.
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&stop))
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&stop)))
            .map_err(|e| BenchError::io("installing the Ctrl-C handler", e))?;
    }
    Ok(stop)
}

/// Runs one experiment to completion or interruption and collects what it wrote.
fn run_one(exe: &Path, name: &str, quick: bool, dir: &Path, stop: &AtomicBool) -> Outcome {
    let json_path = dir.join(format!("{name}.json"));
    let table_path = dir.join(format!("{name}.txt"));
    let stderr_path = dir.join(format!("{name}.stderr.txt"));
    // What a previous run left must not pass for this run's results.
    for stale in [&json_path, &table_path, &stderr_path, &dir.join(format!("{name}-cdf.svg"))] {
        let _ = fs::remove_file(stale);
    }
    let svgs_before = svg_mtimes(dir);
    let started = Instant::now();
    let result = spawn_experiment(exe, name, quick, &json_path, &table_path, &stderr_path)
        .and_then(|mut child| wait_or_stop(&mut child, stop));
    let mut outcome = Outcome::new(name, Status::NotRun);
    outcome.seconds = started.elapsed().as_secs_f64();

    let stderr_text = fs::read_to_string(&stderr_path).unwrap_or_default();
    if stderr_text.trim().is_empty() {
        let _ = fs::remove_file(&stderr_path);
    }
    outcome.has_stderr = stderr_path.exists();
    outcome.has_table = fs::metadata(&table_path).is_ok_and(|m| m.len() > 0);
    if !outcome.has_table {
        let _ = fs::remove_file(&table_path);
    }
    outcome.status = match result {
        Err(e) => Status::Failed(format!("could not run `ictus bench {name}`: {e}")),
        Ok((_, true)) => Status::Interrupted,
        Ok((status, false)) if !status.success() => Status::Failed(failure_reason(status, &stderr_text)),
        Ok(_) => match fs::read_to_string(&json_path).map(|t| serde_json::from_str::<Value>(&t)) {
            Ok(Ok(json)) if json.is_object() => {
                outcome.json = Some(json);
                Status::Ok
            }
            Ok(Ok(_)) => Status::Failed(format!("{name}.json is not a JSON object")),
            Ok(Err(e)) => Status::Failed(format!("{name}.json is not valid JSON: {e}")),
            Err(e) => Status::Failed(format!("it exited successfully but wrote no {name}.json: {e}")),
        },
    };
    // Plots it wrote: SVG files that are new or rewritten since it started.
    let svgs_after = svg_mtimes(dir);
    outcome.plots = svgs_after.into_iter().filter(|(f, m)| svgs_before.get(f) != Some(m)).map(|(f, _)| f).collect();
    outcome
}

/// The text of an SVG file's first `<text>` element: the plotter's title.
fn svg_title(path: &Path) -> Option<String> {
    let svg = fs::read_to_string(path).ok()?;
    let start = svg.find("<text")?;
    let body = &svg[start..];
    let body = &body[body.find('>')? + 1..];
    let title = &body[..body.find("</text>")?];
    let title = title
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&");
    (!title.trim().is_empty()).then(|| title.trim().to_string())
}

/// Modification times of the SVG files in `dir`, by file name.
fn svg_mtimes(dir: &Path) -> BTreeMap<String, Option<SystemTime>> {
    let Ok(entries) = fs::read_dir(dir) else { return BTreeMap::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.ends_with(".svg").then(|| (name, e.metadata().ok().and_then(|m| m.modified().ok())))
        })
        .collect()
}

/// Starts `ictus bench NAME [--quick] --json JSON` in a process group of its own, its
/// output into files.
fn spawn_experiment(
    exe: &Path,
    name: &str,
    quick: bool,
    json: &Path,
    table: &Path,
    stderr: &Path,
) -> io::Result<Child> {
    // If the testbed dies without stopping it (kill -9, a second Ctrl-C), the
    // experiment is told to stop too.
    let mut guarded = GuardedCommand::new(exe, Signal::TERM);
    let command = guarded.command();
    command.args(["bench", name]);
    if quick {
        command.arg("--quick");
    }
    command
        .arg("--json")
        .arg(json)
        .stdout(File::create(table)?)
        .stderr(File::create(stderr)?)
        // Its own group: the terminal's Ctrl-C reaches only the testbed, which then
        // stops the experiment and every server it started, as a group.
        .process_group(0);
    guarded.spawn()
}

/// Waits for the experiment to exit, or stops its process group once `stop` is set.
/// Returns its exit status and whether it was stopped.
fn wait_or_stop(child: &mut Child, stop: &AtomicBool) -> io::Result<(ExitStatus, bool)> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok((status, false));
        }
        if stop.load(Ordering::SeqCst) {
            let group = rustix::process::Pid::from_child(child);
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
            let deadline = Instant::now() + GRACE;
            while Instant::now() < deadline {
                if let Some(status) = child.try_wait()? {
                    return Ok((status, true));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            return Ok((child.wait()?, true));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Why an experiment failed: the last lines of its standard error and its exit status.
fn failure_reason(status: ExitStatus, stderr: &str) -> String {
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    };
    let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" / ");
    let mut tail: String = tail.chars().take(400).collect();
    if tail.is_empty() {
        tail = "no message".to_string();
    }
    format!("{tail} ({how})")
}

fn write_file(path: &Path, text: &str) -> Result<(), BenchError> {
    fs::write(path, text).map_err(|e| BenchError::io(format!("writing {}", path.display()), e))
}
