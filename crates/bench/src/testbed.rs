//! `ictus testbed`: every experiment, one report.
//!
//! The testbed asks the running binary for its experiments (`ictus bench --list`) and
//! runs each as a child process, `ictus bench NAME [--quick] --json DIR/NAME.json`, in a
//! process group of its own, so that one experiment that fails or crashes costs only its
//! own section of the report. Its table goes to `DIR/NAME.txt`, its standard error to
//! `DIR/NAME.stderr.txt` (removed when empty), its plots stay where it wrote them,
//! beside its JSON.
//!
//! While an experiment runs, standard error shows a line per experiment with a progress
//! bar, the time spent and an estimate of the time left, from a small table of expected
//! durations ([`KNOWN`]) scaled by how long the finished experiments took against their
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, IsTerminal, Write as _};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use crate::conditions::Conditions;
use crate::report::{Better, Headline};
use crate::svg::{Axis, Plot, Scale, Series, TickFormat};
use crate::{format_ns, format_size, BenchError};

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

/// What the testbed knows about an experiment before running it.
#[derive(Debug, Clone, Copy)]
pub struct Known {
    /// The experiment, as `ictus bench NAME` spells it.
    pub name: &'static str,
    /// The numbers of the papers' figures ([`FIGURES`]) it measures.
    pub figures: &'static [u8],
    /// About how long `--quick` takes, in seconds (a loaded two-core VM).
    pub quick_s: f64,
    /// About how long the full run takes, in seconds.
    pub full_s: f64,
}

/// The experiments the testbed knows, keyed by name. An experiment missing here still
/// runs and is reported; it just covers no figure and is expected to take
/// [`DEFAULT_EXPECTED_S`]. Add a line when an experiment lands.
pub const KNOWN: &[Known] = &[
    Known { name: "ipc", figures: &[1], quick_s: 8.0, full_s: 150.0 },
    Known { name: "fileread", figures: &[2], quick_s: 10.0, full_s: 200.0 },
    Known { name: "alarm", figures: &[], quick_s: 30.0, full_s: 400.0 },
    Known { name: "timer-overhead", figures: &[3], quick_s: 12.0, full_s: 180.0 },
    Known { name: "rtu", figures: &[10], quick_s: 20.0, full_s: 260.0 },
    Known { name: "rtipc", figures: &[13], quick_s: 3.0, full_s: 25.0 },
    Known { name: "dhs", figures: &[14], quick_s: 25.0, full_s: 540.0 },
    Known { name: "shm", figures: &[], quick_s: 12.0, full_s: 150.0 },
    Known { name: "midi", figures: &[4, 5], quick_s: 35.0, full_s: 575.0 },
    Known { name: "unix", figures: &[15, 16, 17, 18, 19], quick_s: 30.0, full_s: 300.0 },
];

/// Expected duration of an experiment missing from [`KNOWN`], in seconds.
pub const DEFAULT_EXPECTED_S: f64 = 60.0;

/// The papers' figures listed in `shared/BENCHMARKS.md`: number, what, where.
pub const FIGURES: [(u8, &str, &str); 19] = [
    (1, "transfer costs", "000 §8, Fig. 3"),
    (2, "file read methods", "000 Table 2"),
    (3, "timer overhead", "000 §6"),
    (4, "MIDI interarrival plot", "000 Fig. 1"),
    (5, "MIDI latency under load", "000 Table 1"),
    (6, "display transfer", "000 §10"),
    (7, "frame timing model", "000 §11"),
    (8, "MARS throughput", "001 Table 1"),
    (9, "MARS under load", "001 Table 2"),
    (10, "MARS periodic streams", "001 Table 3"),
    (11, "display transports", "002 Table 1"),
    (12, "display macrobenchmarks", "002 §4.2"),
    (13, "RT-IPC message cost", "003 §5.1"),
    (14, "Distributed Hartstone", "003 Table 2"),
    (15, "compile test", "004 §5.1"),
    (16, "modified Andrew benchmark", "004 §5.2"),
    (17, "file system throughput", "004 §5.3"),
    (18, "file system operations", "004 §5.3"),
    (19, "process management", "004 §5.4"),
];

/// Words in an experiment's notes that mean something could not be measured here; such
/// notes are gathered under "What could not run here and why".
const COULD_NOT_RUN: &[&str] = &[
    "could not",
    "cannot",
    "omitted",
    "stopped",
    "skipped",
    "unavailable",
    "not available",
    "not permitted",
    "not supported",
];

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
struct Outcome {
    name: String,
    status: Status,
    seconds: f64,
    /// Its JSON object, when it finished and wrote one.
    json: Option<Value>,
    /// SVG files (names in the output directory) it wrote, and ours for it.
    plots: Vec<String>,
    /// The title of each plot, for the report.
    plot_titles: Vec<String>,
    /// Whether `NAME.txt` and `NAME.stderr.txt` exist.
    has_table: bool,
    has_stderr: bool,
}

impl Outcome {
    fn new(name: &str, status: Status) -> Self {
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
    fn measured_a_figure(&self) -> bool {
        self.status == Status::Ok
            && self.json.as_ref().is_some_and(|j| {
                array(j, "paper_figures").iter().any(|f| f.get("ours_value").and_then(Value::as_f64).is_some())
            })
    }
}

/// The entry of [`KNOWN`] for an experiment, if any.
fn known(name: &str) -> Option<&'static Known> {
    KNOWN.iter().find(|k| k.name == name)
}

/// Expected duration of an experiment, in seconds.
fn expected_seconds(name: &str, quick: bool) -> f64 {
    known(name).map_or(DEFAULT_EXPECTED_S, |k| if quick { k.quick_s } else { k.full_s })
}

/// The figure numbers an experiment covers.
fn figures_of(name: &str) -> &'static [u8] {
    known(name).map_or(&[], |k| k.figures)
}

/// The numbers of the papers' figures covered with a measured result: figures of
/// experiments that finished and measured at least one of their paper figures.
fn figures_reproduced(outcomes: &[Outcome]) -> BTreeSet<u8> {
    outcomes.iter().filter(|o| o.measured_a_figure()).flat_map(|o| figures_of(&o.name).iter().copied()).collect()
}

/// Runs the testbed: every selected experiment, then the report. Fails if the
/// experiments cannot be listed, `--only` names an unknown one, the output cannot be
/// written, or the run was interrupted (after writing the report). Experiments that
/// fail are reported, not errors.
pub fn main(opts: &TestbedOptions) -> Result<(), BenchError> {
    let exe = std::env::current_exe().map_err(|e| BenchError::io("finding the ictus binary", e))?;
    let available = list_experiments(&exe)?;
    let selected = select(&available, &opts.only)?;
    fs::create_dir_all(&opts.out).map_err(|e| BenchError::io(format!("creating {}", opts.out.display()), e))?;
    let dir =
        fs::canonicalize(&opts.out).map_err(|e| BenchError::io(format!("resolving {}", opts.out.display()), e))?;
    let stop = install_signal_handlers()?;

    let started_wall = SystemTime::now();
    let started = Instant::now();
    let conditions = Conditions::capture_before();
    let board = Arc::new(Board::new(&selected, opts.quick, io::stderr().is_terminal()));
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
    let summary = testbed_json(&run, &conditions, &outcomes);
    let mut summary_text =
        serde_json::to_string_pretty(&summary).map_err(|e| BenchError::io("serializing testbed.json", e.into()))?;
    summary_text.push('\n');
    write_file(&dir.join("testbed.json"), &summary_text)?;
    let report_path = dir.join("report.md");
    write_file(&report_path, &render_report(&run, &conditions, &outcomes))?;

    let ok = outcomes.iter().filter(|o| o.status == Status::Ok).count();
    let covered = figures_reproduced(&outcomes).len();
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

/// The experiments `ictus bench --list` names, in its order.
fn list_experiments(exe: &Path) -> Result<Vec<String>, BenchError> {
    let output = Command::new(exe)
        .args(["bench", "--list"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| BenchError::io("running `ictus bench --list`", e))?;
    if !output.status.success() {
        return Err(BenchError::io(
            "running `ictus bench --list`",
            io::Error::other(format!("it exited with {}", output.status)),
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
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
    let mut command = Command::new(exe);
    command.args(["bench", name]);
    if quick {
        command.arg("--quick");
    }
    command
        .arg("--json")
        .arg(json)
        .stdin(Stdio::null())
        .stdout(File::create(table)?)
        .stderr(File::create(stderr)?)
        // Its own group: the terminal's Ctrl-C reaches only the testbed, which then
        // stops the experiment and every server it started, as a group.
        .process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only makes one
    // prctl system call, which is async-signal-safe; it allocates nothing and touches no
    // lock or state shared with the parent.
    unsafe {
        command.pre_exec(|| {
            // If the testbed dies without stopping it (kill -9, a second Ctrl-C), the
            // experiment is told to stop too.
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
            Ok(())
        });
    }
    command.spawn()
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

// ---------------------------------------------------------------------------------
// Progress
// ---------------------------------------------------------------------------------

/// Where an experiment stands, for the progress lines.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Pending,
    Running(Instant),
    /// Finished (in any way) after this many seconds.
    Done(f64),
}

#[derive(Debug)]
struct BoardRow {
    name: String,
    expected: f64,
    stage: Stage,
    ok: bool,
}

#[derive(Debug)]
struct BoardState {
    rows: Vec<BoardRow>,
    name_width: usize,
}

impl BoardState {
    /// How much slower (> 1) or faster than expected the experiments that finished
    /// well ran; scales the estimates of those still to run.
    fn pace(&self) -> f64 {
        let (actual, expected) = self
            .rows
            .iter()
            .filter_map(|r| match r.stage {
                Stage::Done(s) if r.ok => Some((s, r.expected)),
                _ => None,
            })
            .fold((0.0, 0.0), |(a, e), (s, x)| (a + s, e + x));
        if expected > 0.0 {
            (actual / expected).clamp(0.25, 4.0)
        } else {
            1.0
        }
    }

    /// Estimated seconds left in all: what remains of the running experiment (`now`
    /// is its elapsed time) and every pending one.
    fn left(&self, running: Option<(usize, f64)>) -> f64 {
        let pace = self.pace();
        self.rows
            .iter()
            .enumerate()
            .map(|(i, r)| match (r.stage, running) {
                (Stage::Pending, _) => r.expected * pace,
                (Stage::Running(_), Some((j, elapsed))) if i == j => (r.expected * pace - elapsed).max(0.0),
                _ => 0.0,
            })
            .sum()
    }

    /// The progress line of a running experiment.
    fn running_line(&self, i: usize, elapsed: f64) -> String {
        const WIDTH: usize = 24;
        let row = &self.rows[i];
        let expected = row.expected * self.pace();
        let fraction = if expected > 0.0 { (elapsed / expected).min(0.99) } else { 0.99 };
        let filled = (fraction * WIDTH as f64).round() as usize;
        let over = if elapsed > expected { ", longer than expected" } else { "" };
        format!(
            "[{}/{}] {:<w$} [{}{}] {} of ~{}{over}, ~{} left in all",
            i + 1,
            self.rows.len(),
            row.name,
            "#".repeat(filled),
            "-".repeat(WIDTH - filled),
            clock(elapsed),
            clock(expected),
            clock(self.left(Some((i, elapsed)))),
            w = self.name_width
        )
    }
}

/// The progress display: one line per experiment on standard error.
#[derive(Debug)]
struct Board {
    state: Mutex<BoardState>,
    tty: bool,
}

impl Board {
    fn new(names: &[String], quick: bool, tty: bool) -> Self {
        let rows = names
            .iter()
            .map(|n| BoardRow {
                name: n.clone(),
                expected: expected_seconds(n, quick),
                stage: Stage::Pending,
                ok: false,
            })
            .collect();
        let name_width = names.iter().map(String::len).max().unwrap_or(0);
        Board { state: Mutex::new(BoardState { rows, name_width }), tty }
    }

    fn lock(&self) -> MutexGuard<'_, BoardState> {
        // A panic while drawing leaves nothing inconsistent worth refusing to draw.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prints a whole line.
    fn say(&self, line: &str) {
        let _guard = self.lock();
        let _ = writeln!(io::stderr().lock(), "{line}");
    }

    fn start(&self, i: usize) {
        let mut state = self.lock();
        state.rows[i].stage = Stage::Running(Instant::now());
        let mut err = io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r{}\x1b[K", state.running_line(i, 0.0));
        } else {
            let row = &state.rows[i];
            let _ = writeln!(
                err,
                "testbed: [{}/{}] {}: running (about {}; about {} left in all)",
                i + 1,
                state.rows.len(),
                row.name,
                clock(row.expected * state.pace()),
                clock(state.left(Some((i, 0.0))))
            );
        }
        let _ = err.flush();
    }

    /// Redraws the running experiment's line (terminals only).
    fn redraw(&self) {
        let state = self.lock();
        let running = state.rows.iter().enumerate().find_map(|(i, r)| match r.stage {
            Stage::Running(t) => Some((i, t.elapsed().as_secs_f64())),
            _ => None,
        });
        if let Some((i, elapsed)) = running {
            let mut err = io::stderr().lock();
            let _ = write!(err, "\r{}\x1b[K", state.running_line(i, elapsed));
            let _ = err.flush();
        }
    }

    fn finish(&self, i: usize, outcome: &Outcome) {
        let mut state = self.lock();
        state.rows[i].stage = Stage::Done(outcome.seconds);
        state.rows[i].ok = outcome.status == Status::Ok;
        let what = match &outcome.status {
            Status::Ok => format!("ok in {}", clock(outcome.seconds)),
            Status::Failed(why) => format!("failed after {}: {why}", clock(outcome.seconds)),
            Status::Interrupted => format!("interrupted after {}", clock(outcome.seconds)),
            Status::NotRun => "not run".to_string(),
        };
        let line = format!("[{}/{}] {:<w$} {what}", i + 1, state.rows.len(), outcome.name, w = state.name_width);
        let mut err = io::stderr().lock();
        if self.tty {
            let _ = writeln!(err, "\r{line}\x1b[K");
        } else {
            let _ = writeln!(err, "testbed: {line}");
        }
        let _ = err.flush();
    }
}

/// Redraws the board every second until the returned sender is dropped.
fn spawn_redraw(board: Arc<Board>) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(1)) {
            board.redraw();
        }
    });
    (tx, handle)
}

/// Seconds as `m:ss` or `h:mm:ss`.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

// ---------------------------------------------------------------------------------
// testbed.json
// ---------------------------------------------------------------------------------

/// Facts about the whole run.
#[derive(Debug, Clone, Copy)]
struct Run {
    started: SystemTime,
    seconds: f64,
    quick: bool,
    interrupted: bool,
}

/// The testbed's own JSON object (`testbed.json`), in the shape of an experiment's:
/// conditions, the experiments with their status, and the `figures_reproduced`
/// headline.
#[derive(Debug, Serialize)]
struct Summary<'a> {
    experiment: &'static str,
    paper: &'static str,
    quick: bool,
    /// When the run started (UTC, RFC 3339).
    started: String,
    seconds: f64,
    interrupted: bool,
    /// The testbed's own conditions: load before and after the whole run.
    conditions: &'a Conditions,
    experiments: Vec<ExperimentSummary<'a>>,
    /// Numbers of the papers' figures ([`FIGURES`]) measured in this run.
    figures_covered: Vec<u8>,
    headline: Vec<Headline>,
}

/// One experiment in `testbed.json`.
#[derive(Debug, Serialize)]
struct ExperimentSummary<'a> {
    name: &'a str,
    /// `ok`, `failed`, `interrupted` or `not run`.
    status: &'static str,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    seconds: f64,
    /// The papers' figures it is meant to cover.
    figures: &'static [u8],
    /// Whether it measured at least one of them in this run.
    measured: bool,
    /// Its JSON file, when it wrote one.
    json: Option<String>,
    /// Its SVG plots.
    plots: &'a [String],
}

/// Builds `testbed.json`.
fn testbed_json<'a>(run: &Run, conditions: &'a Conditions, outcomes: &'a [Outcome]) -> Summary<'a> {
    let covered = figures_reproduced(outcomes);
    let headline = Headline::new(
        "figures_reproduced",
        covered.len() as f64,
        FIGURES.len() as f64,
        "figures listed in BENCHMARKS.md",
        "figures",
        Better::Higher,
    );
    let tenths = |s: f64| (s * 10.0).round() / 10.0;
    Summary {
        experiment: "testbed",
        paper: "all",
        quick: run.quick,
        started: rfc3339(run.started),
        seconds: tenths(run.seconds),
        interrupted: run.interrupted,
        conditions,
        experiments: outcomes
            .iter()
            .map(|o| ExperimentSummary {
                name: &o.name,
                status: o.status.label(),
                reason: match &o.status {
                    Status::Failed(why) => Some(why),
                    _ => None,
                },
                seconds: tenths(o.seconds),
                figures: figures_of(&o.name),
                measured: o.measured_a_figure(),
                json: o.json.is_some().then(|| format!("{}.json", o.name)),
                plots: &o.plots,
            })
            .collect(),
        figures_covered: covered.into_iter().collect(),
        headline: vec![headline],
    }
}

/// A time as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn rfc3339(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let t = secs % 86_400;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", t / 3600, t / 60 % 60, t % 60)
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

// ---------------------------------------------------------------------------------
// Latency tails
// ---------------------------------------------------------------------------------

/// Most curves in one panel (the plotter's palette has eight colours).
const CURVES_PER_PANEL: usize = 8;

/// A latency-tail plot of an experiment's rows that carry `p50_ns`, `p99_ns`,
/// `p999_ns`, `max_ns` and `count`: for each case, the latency x against N, where one
/// sample in N took longer than x (N = 2 at p50, 100 at p99, 1000 at p99.9, the sample
/// count at the maximum), both axes logarithmic; a complementary CDF, which shows the
/// tail that a linear CDF squeezes into its top edge. Rows with a `size_bytes` field
/// get a panel per size; others a panel per eight cases. `None` without such rows.
fn cdf_svg(experiment: &str, json: &Value) -> Option<String> {
    struct Curve {
        group: Option<u64>,
        series: Series,
    }
    let curves: Vec<Curve> = array(json, "rows")
        .iter()
        .filter_map(|row| {
            let get = |k: &str| row.get(k).and_then(Value::as_f64);
            let count = row.get("count").and_then(Value::as_u64).filter(|&c| c > 0)?;
            let (p50, p99, p999, max) = (get("p50_ns")?, get("p99_ns")?, get("p999_ns")?, get("max_ns")?);
            let name = row.get("transport").or_else(|| row.get("case")).and_then(Value::as_str)?.to_string();
            let points = [(p50, 2), (p99, 100), (p999, 1000), (max, count)]
                .into_iter()
                .filter(|&(_, n)| n <= count)
                .map(|(x, n)| (x, n as f64))
                .collect();
            Some(Curve { group: row.get("size_bytes").and_then(Value::as_u64), series: Series { name, points } })
        })
        .collect();
    if curves.is_empty() {
        return None;
    }
    let by_size = curves.iter().all(|c| c.group.is_some());
    let mut groups: Vec<(String, Vec<Series>)> = Vec::new();
    for curve in curves {
        let label = match curve.group {
            Some(0) if by_size => "no payload".to_string(),
            Some(size) if by_size => format!("{} messages", format_size(size as usize)),
            _ => String::new(),
        };
        match groups.last_mut() {
            Some((last, series)) if *last == label && series.len() < CURVES_PER_PANEL => series.push(curve.series),
            _ => groups.push((label, vec![curve.series])),
        }
    }
    let quick = if json.get("quick").and_then(Value::as_bool) == Some(true) { " [quick]" } else { "" };
    let panels: Vec<String> = groups
        .into_iter()
        .map(|(label, series)| {
            let what = if label.is_empty() { String::new() } else { format!(", {label}") };
            Plot {
                title: format!("{experiment}: latency tail{what}{quick}"),
                x: Axis { label: "latency".to_string(), scale: Scale::Log10, ticks: TickFormat::Nanoseconds },
                y: Axis {
                    label: "one sample in N took longer (2: p50, 100: p99, 1000: p99.9)".to_string(),
                    scale: Scale::Log10,
                    ticks: TickFormat::Plain,
                },
                series,
            }
            .render()
        })
        .collect();
    Some(stack_panels(&panels))
}

/// Stacks standalone SVG documents vertically into one document, each as a nested
/// `<svg>` element placed at its offset.
fn stack_panels(panels: &[String]) -> String {
    let (width, height) = panels.first().and_then(|p| root_size(p)).unwrap_or((860.0, 520.0));
    let total = height * panels.len() as f64;
    let mut svg = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{width}\" height=\"{total}\" viewBox=\"0 0 {width} {total}\">\n"
    );
    for (i, panel) in panels.iter().enumerate() {
        let body = panel.find("<svg").map_or(panel.as_str(), |at| &panel[at..]);
        svg.push_str(&body.replacen("<svg ", &format!("<svg x=\"0\" y=\"{}\" ", height * i as f64), 1));
    }
    svg.push_str("</svg>\n");
    svg
}

/// The `width` and `height` attributes of a document's root `<svg>` element.
fn root_size(svg: &str) -> Option<(f64, f64)> {
    let start = svg.find("<svg")?;
    let tag = &svg[start..start + svg[start..].find('>')?];
    let attribute = |name: &str| -> Option<f64> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[at..].split('"').next()?.parse().ok()
    };
    Some((attribute("width")?, attribute("height")?))
}

// ---------------------------------------------------------------------------------
// report.md
// ---------------------------------------------------------------------------------

/// The elements of a JSON array field, or none.
fn array<'a>(json: &'a Value, key: &str) -> &'a [Value] {
    json.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn text<'a>(json: &'a Value, key: &str) -> Option<&'a str> {
    json.get(key).and_then(Value::as_str)
}

/// Text made safe for a Markdown table cell or list item.
fn md(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '*' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// About three significant figures, without exponents for ordinary magnitudes.
fn sig3(x: f64) -> String {
    if !x.is_finite() {
        return "—".to_string();
    }
    if x == 0.0 {
        return "0".to_string();
    }
    let decimals = (2 - x.abs().log10().floor() as i32).clamp(0, 9) as usize;
    format!("{x:.decimals$}")
}

/// A value in its unit: durations for `ns`, otherwise the number and the unit.
fn quantity(value: f64, unit: &str) -> String {
    if unit == "ns" {
        format_ns(value)
    } else {
        format!("{} {unit}", sig3(value))
    }
}

/// Renders `report.md`.
fn render_report(run: &Run, conditions: &Conditions, outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail; results are ignored on purpose.
    let _ = write_report(&mut out, run, conditions, outcomes);
    out
}

fn write_report(out: &mut String, run: &Run, c: &Conditions, outcomes: &[Outcome]) -> std::fmt::Result {
    let covered = figures_reproduced(outcomes);
    let ok = outcomes.iter().filter(|o| o.status == Status::Ok).count();
    let load = |l: Option<f64>| l.map_or("?".to_string(), |v| format!("{v:.2}"));

    writeln!(out, "# ictus testbed report\n")?;
    writeln!(
        out,
        "The papers' experiments rerun on this machine: each figure of the papers beside ours and \
         beside today's peer, measured side by side in the same run (`shared/BENCHMARKS.md`).\n"
    )?;
    writeln!(out, "- **date**: {} (UTC), {} in all", rfc3339(run.started), clock(run.seconds))?;
    writeln!(
        out,
        "- **mode**: {}",
        if run.quick {
            "quick (`ictus testbed --quick`): seconds per experiment; run without `--quick` for the papers' scale"
        } else {
            "full (`ictus testbed`): the papers' scale"
        }
    )?;
    let statuses: Vec<String> = outcomes.iter().map(|o| format!("{} ({})", o.name, o.status.label())).collect();
    writeln!(out, "- **experiments**: {ok} of {} ran: {}", outcomes.len(), statuses.join(", "))?;
    let numbers: Vec<String> = covered.iter().map(|n| format!("#{n}")).collect();
    writeln!(
        out,
        "- **the papers' figures reproduced**: {} of {} listed in BENCHMARKS.md{} (headline `figures_reproduced` \
         in [testbed.json](testbed.json))",
        covered.len(),
        FIGURES.len(),
        if numbers.is_empty() { String::new() } else { format!(" ({})", numbers.join(", ")) }
    )?;
    if run.interrupted {
        writeln!(out, "- **interrupted**: the run was stopped (Ctrl-C); what did not finish is marked below")?;
    }

    writeln!(out, "\n## Conditions\n")?;
    writeln!(out, "- **CPU**: {} × {}", c.cpus, md(&c.cpu_model))?;
    writeln!(out, "- **kernel**: Linux {}", md(&c.kernel))?;
    writeln!(
        out,
        "- **real-time privileges**: {}",
        if c.rt_privileges { "available (SCHED_FIFO permitted)" } else { "unavailable (SCHED_FIFO refused)" }
    )?;
    writeln!(
        out,
        "- **load average** (1 min): {} before the testbed, {} after",
        load(c.loadavg_before),
        load(c.loadavg_after)
    )?;
    writeln!(
        out,
        "- **scheduling policy obtained, CPU pinning, load**: per experiment, in its section (the testbed \
         itself ran {})",
        md(&c.policy)
    )?;

    writeln!(out, "\n## How to read the tables\n")?;
    writeln!(out, "Every table has the columns `paper`, `ours`, `peer` and `ratio`.\n")?;
    writeln!(
        out,
        "- **The paper's figures beside ours**: `paper` is the figure as the paper states it, `ours` the same \
         quantity measured here, `peer` today's peer for that quantity when the experiment reports one (— \
         otherwise). `ratio` = ours / paper, both in the figure's unit; `x better` is how many times better \
         ours is (paper / ours for times, ours / paper for rates). The hardware differs by three decades: this \
         is context, not a pass or a fail."
    )?;
    writeln!(
        out,
        "- **Headlines**: the comparisons that matter, ours against the modern peer measured in the same run, \
         interleaved. `ratio` = ours / peer; `target` is the ratio aimed for (≤ when lower is better, ≥ when \
         higher is), `met` whether this run meets it; `paper` the paper's figure for that comparison when the \
         experiment reports one (— otherwise)."
    )?;
    writeln!(
        out,
        "- Full distributions (p50, p99, p99.9, max, sample counts) are in each experiment's table \
         (`NAME.txt`) and JSON (`NAME.json`)."
    )?;

    writeln!(out, "\n## Experiments\n")?;
    for o in outcomes {
        let figures: Vec<String> = figures_of(&o.name)
            .iter()
            .filter_map(|n| FIGURES.iter().find(|f| f.0 == *n))
            .map(|(n, what, at)| format!("#{n} {what} ({at})"))
            .collect();
        let figures = if figures.is_empty() { "no figure of the list".to_string() } else { figures.join(", ") };
        let how = match &o.status {
            Status::Ok => format!("ok in {}", clock(o.seconds)),
            Status::Failed(_) => format!("failed after {}", clock(o.seconds)),
            Status::Interrupted => format!("interrupted after {}", clock(o.seconds)),
            Status::NotRun => "not run".to_string(),
        };
        writeln!(out, "- [{0}](#{0}): {figures}; {how}", o.name)?;
    }

    for o in outcomes {
        write_experiment(out, o)?;
    }

    writeln!(out, "\n## What could not run here and why\n")?;
    let mut any = false;
    for o in outcomes {
        let why = match &o.status {
            Status::Ok => None,
            Status::Failed(why) => Some(format!("failed: {}", md(why))),
            Status::Interrupted => Some("interrupted (Ctrl-C) before it finished".to_string()),
            Status::NotRun => Some("not run: the testbed was interrupted before it started".to_string()),
        };
        if let Some(why) = why {
            any = true;
            let log = if o.has_stderr {
                format!(" (its standard error: [{0}.stderr.txt]({0}.stderr.txt))", o.name)
            } else {
                String::new()
            };
            writeln!(out, "- **{}**: {why}{log}", o.name)?;
        }
        let Some(json) = &o.json else { continue };
        for note in array(json, "notes").iter().filter_map(Value::as_str) {
            let lower = note.to_lowercase();
            if COULD_NOT_RUN.iter().any(|w| lower.contains(w)) {
                any = true;
                writeln!(out, "- **{}**: {}", o.name, md(note))?;
            }
        }
        for f in array(json, "paper_figures") {
            if f.get("ours_value").and_then(Value::as_f64).is_none() {
                any = true;
                writeln!(
                    out,
                    "- **{}**: the paper's {} ({}) has no measured value here: {}",
                    o.name,
                    md(text(f, "quantity").unwrap_or("figure")),
                    md(text(f, "paper").unwrap_or("?")),
                    md(text(f, "ours").unwrap_or("not measured"))
                )?;
            }
        }
    }
    if !any {
        writeln!(out, "Everything selected ran.")?;
    }

    writeln!(out, "\n## The papers' {} figures\n", FIGURES.len())?;
    for (n, what, at) in FIGURES {
        let experiments: Vec<&Outcome> = outcomes.iter().filter(|o| figures_of(&o.name).contains(&n)).collect();
        let state = if covered.contains(&n) {
            let by: Vec<&str> = experiments.iter().filter(|o| o.measured_a_figure()).map(|o| o.name.as_str()).collect();
            format!("measured by {}", by.join(", "))
        } else if experiments.is_empty() {
            match KNOWN.iter().find(|k| k.figures.contains(&n)) {
                Some(k) => format!("not selected in this run (`{}`)", k.name),
                None => "no experiment yet".to_string(),
            }
        } else {
            let why: Vec<String> = experiments
                .iter()
                .map(|o| match o.status {
                    Status::Ok => format!("{} measured none of its figures", o.name),
                    _ => format!("{} {}", o.name, o.status.label()),
                })
                .collect();
            format!("not measured: {}", why.join(", "))
        };
        writeln!(out, "- #{n} {what} ({at}): {state}")?;
    }
    Ok(())
}

/// One experiment's section.
fn write_experiment(out: &mut String, o: &Outcome) -> std::fmt::Result {
    writeln!(out, "\n## {}\n", o.name)?;
    let files = {
        let mut f = Vec::new();
        if o.json.is_some() {
            f.push(format!("[{0}.json]({0}.json) (raw)", o.name));
        }
        if o.has_table {
            f.push(format!("[{0}.txt]({0}.txt) (its table)", o.name));
        }
        if o.has_stderr {
            f.push(format!("[{0}.stderr.txt]({0}.stderr.txt) (standard error)", o.name));
        }
        f
    };
    let Some(json) = &o.json else {
        let what = match &o.status {
            Status::Failed(why) => format!("**Failed** after {}: {}", clock(o.seconds), md(why)),
            Status::Interrupted => format!("**Interrupted** after {}, before it finished.", clock(o.seconds)),
            Status::NotRun => "**Not run**: the testbed was interrupted before it started.".to_string(),
            Status::Ok => "No results.".to_string(),
        };
        writeln!(out, "{what}")?;
        if !files.is_empty() {
            writeln!(out, "\nFiles: {}.", files.join(", "))?;
        }
        return Ok(());
    };

    writeln!(
        out,
        "**{}**{}. Ran in {}{}.\n",
        md(text(json, "paper").unwrap_or("the papers")),
        match figures_of(&o.name) {
            [] => String::new(),
            figures => {
                let list: Vec<String> = figures
                    .iter()
                    .filter_map(|n| FIGURES.iter().find(|f| f.0 == *n))
                    .map(|(n, what, _)| format!("#{n} {what}"))
                    .collect();
                format!(" — BENCHMARKS.md figure {}", list.join(", "))
            }
        },
        clock(o.seconds),
        if json.get("quick").and_then(Value::as_bool) == Some(true) { " (quick)" } else { "" }
    )?;
    if let Some(c) = json.get("conditions") {
        let s = |k: &str| c.get(k).map_or("?".to_string(), |v| v.as_str().map_or_else(|| v.to_string(), String::from));
        let rt = match c.get("rt_privileges").and_then(Value::as_bool) {
            Some(true) => "available",
            Some(false) => "unavailable",
            None => "?",
        };
        writeln!(
            out,
            "Conditions: policy obtained {}; pinned {}; load {} → {}; real-time privileges {}; {} CPUs ({}), \
             Linux {}.\n",
            md(&s("policy")),
            md(&s("pinned")),
            md(&s("loadavg_before")),
            md(&s("loadavg_after")),
            rt,
            md(&s("cpus")),
            md(&s("cpu_model")),
            md(&s("kernel"))
        )?;
    }
    if !files.is_empty() {
        writeln!(out, "Files: {}.", files.join(", "))?;
    }

    let figures = array(json, "paper_figures");
    if !figures.is_empty() {
        writeln!(out, "\n### The paper's figures beside ours\n")?;
        writeln!(out, "| quantity | paper | ours | peer | ratio | x better |")?;
        writeln!(out, "| --- | --- | --- | --- | ---: | ---: |")?;
        for f in figures {
            let unit = text(f, "unit").unwrap_or("");
            let paper_value = f.get("paper_value").and_then(Value::as_f64);
            let ours_value = f.get("ours_value").and_then(Value::as_f64);
            let peer = match (text(f, "peer"), f.get("peer_value").and_then(Value::as_f64)) {
                (Some(p), _) => md(p),
                (None, Some(v)) => quantity(v, unit),
                (None, None) => "—".to_string(),
            };
            let ratio = match (ours_value, paper_value) {
                (Some(o), Some(p)) if p != 0.0 => sig3(o / p),
                _ => "—".to_string(),
            };
            let better = match f.get("times_better").and_then(Value::as_f64) {
                Some(x) if x >= 1.0 => format!("{}×", sig3(x)),
                Some(x) => format!("{}× (worse)", sig3(x)),
                None => "—".to_string(),
            };
            writeln!(
                out,
                "| {} | {} | {} | {peer} | {ratio} | {better} |",
                md(text(f, "quantity").unwrap_or("?")),
                md(text(f, "paper").unwrap_or("?")),
                md(text(f, "ours").unwrap_or("not measured"))
            )?;
        }
    }

    let headlines = array(json, "headline");
    if !headlines.is_empty() {
        writeln!(out, "\n### Headlines\n")?;
        writeln!(out, "| headline | paper | ours | peer | ratio | target | met |")?;
        writeln!(out, "| --- | --- | ---: | --- | ---: | ---: | --- |")?;
        for h in headlines {
            let unit = text(h, "unit").unwrap_or("");
            let value = |k: &str| h.get(k).and_then(Value::as_f64).map_or("—".to_string(), |v| quantity(v, unit));
            let peer = match text(h, "peer_name") {
                Some(name) => format!("{} ({})", value("peer"), md(name)),
                None => value("peer"),
            };
            let lower = text(h, "better") == Some("lower");
            let target = match h.get("target").and_then(Value::as_f64) {
                Some(t) => format!("{} {t}", if lower { "≤" } else { "≥" }),
                None => format!("— ({} is better)", if lower { "lower" } else { "higher" }),
            };
            let met = match h.get("met").and_then(Value::as_bool) {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            };
            let paper = match h.get("paper") {
                Some(Value::String(p)) => md(p),
                Some(Value::Number(n)) => n.as_f64().map_or("—".to_string(), |v| quantity(v, unit)),
                _ => "—".to_string(),
            };
            writeln!(
                out,
                "| `{}` | {paper} | {} | {peer} | {} | {target} | {met} |",
                text(h, "name").unwrap_or("?"),
                value("ours"),
                h.get("ratio").and_then(Value::as_f64).map_or("—".to_string(), sig3)
            )?;
        }
    }

    if !o.plots.is_empty() {
        writeln!(out, "\n### Plots")?;
        for (plot, title) in o.plots.iter().zip(&o.plot_titles) {
            writeln!(out, "\n![{}]({plot})", md(title))?;
        }
    }

    let notes = array(json, "notes");
    if !notes.is_empty() {
        writeln!(out, "\n### Notes\n")?;
        for note in notes.iter().filter_map(Value::as_str) {
            writeln!(out, "- {}", md(note))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn balanced(xml: &str) -> bool {
        crate::svg::check_well_formed(xml).is_ok()
    }

    fn sample_json() -> Value {
        json!({
            "experiment": "ipc",
            "paper": "000 §8, Figure 3",
            "quick": true,
            "conditions": { "cpus": 2, "cpu_model": "Test CPU", "kernel": "6.1", "loadavg_before": 0.5,
                            "loadavg_after": 0.7, "policy": "SCHED_OTHER nice 0", "rt_privileges": false,
                            "pinned": "client 0, server 0" },
            "rows": [
                { "case": "seqpacket 64 B", "transport": "seqpacket", "size_bytes": 64, "count": 2000,
                  "p50_ns": 6500, "p99_ns": 7700, "p999_ns": 31000, "max_ns": 180000 },
                { "case": "port inline 64 B", "transport": "port inline", "size_bytes": 64, "count": 20,
                  "p50_ns": 9700, "p99_ns": 12000, "p999_ns": 50000, "max_ns": 170000 },
                { "case": "memcpy 64 B", "size_bytes": 64, "mb_s_median": 43000.0 }
            ],
            "headline": [ { "name": "port_rtt_64B_vs_uds", "ours": 9700.0, "peer": 6500.0,
                            "peer_name": "AF_UNIX | seqpacket", "unit": "ns", "ratio": 1.49, "better": "lower",
                            "target": 1.15, "met": false } ],
            "notes": [ "peer futex shm could not run here: no futex", "measured in 4 s" ],
            "paper_figures": [
                { "quantity": "in-line IPC fixed cost a", "paper": "0.160 ms", "ours": "port inline: 9.7 µs",
                  "paper_value": 160000.0, "ours_value": 9700.0, "unit": "ns", "better": "lower",
                  "times_better": 16.5 },
                { "quantity": "shared memory signalling", "paper": "0.16 ms", "ours": "futex shm not measured",
                  "paper_value": 160000.0, "ours_value": null, "unit": "ns", "better": "lower",
                  "times_better": null }
            ]
        })
    }

    fn ok_outcome(name: &str, json: Value) -> Outcome {
        let mut o = Outcome::new(name, Status::Ok);
        o.json = Some(json);
        o.seconds = 4.2;
        o.plots = vec![format!("{name}.svg")];
        o.has_table = true;
        o
    }

    fn run() -> Run {
        Run { started: UNIX_EPOCH + Duration::from_secs(86_400 * 365), seconds: 12.0, quick: true, interrupted: false }
    }

    fn sample_outcomes() -> Vec<Outcome> {
        vec![
            ok_outcome("ipc", sample_json()),
            Outcome::new("fileread", Status::Failed("ictus: fileread: not implemented yet (exit status 1)".into())),
        ]
    }

    /// The header cells of every Markdown table in `text`.
    fn table_headers(text: &str) -> Vec<Vec<String>> {
        let mut headers = Vec::new();
        let mut in_table = false;
        for line in text.lines() {
            let is_row = line.trim_start().starts_with('|');
            if is_row && !in_table {
                headers.push(line.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect());
            }
            in_table = is_row;
        }
        headers
    }

    #[test]
    fn every_table_has_paper_ours_peer_and_ratio() {
        let report = render_report(&run(), &Conditions::capture_before().finish(), &sample_outcomes());
        let headers = table_headers(&report);
        assert_eq!(headers.len(), 2, "{report}");
        for header in headers {
            for column in ["paper", "ours", "peer", "ratio"] {
                assert!(header.iter().any(|c| c == column), "{header:?} lacks {column}");
            }
        }
        assert!(report.contains("`port_rtt_64B_vs_uds`"));
        // Pipes inside cells are escaped, so the table keeps its columns.
        assert!(report.contains("AF_UNIX \\| seqpacket"));
        assert!(report.contains("| ≤ 1.15 | **no** |"), "{report}");
        assert!(report.contains("| 0.0606 | 16.5× |"), "{report}");
    }

    #[test]
    fn what_could_not_run_gathers_failures_notes_and_missing_figures() {
        let report = render_report(&run(), &Conditions::capture_before().finish(), &sample_outcomes());
        let section = report.split("## What could not run here and why").nth(1).expect("the section");
        let section = section.split("\n## ").next().expect("its body");
        assert!(section.contains("**fileread**: failed: ictus: fileread: not implemented yet"), "{section}");
        assert!(section.contains("peer futex shm could not run here"), "{section}");
        assert!(section.contains("shared memory signalling"), "{section}");
        assert!(!section.contains("measured in 4 s"), "{section}");
        assert!(report.contains("- #1 transfer costs (000 §8, Fig. 3): measured by ipc"), "{report}");
        assert!(report.contains("- #2 file read methods (000 Table 2): not measured: fileread failed"), "{report}");
        assert!(report.contains("- #6 display transfer (000 §10): no experiment yet"), "{report}");
    }

    #[test]
    fn figures_count_only_finished_experiments_with_a_measured_figure() {
        let mut outcomes = sample_outcomes();
        assert_eq!(figures_reproduced(&outcomes), BTreeSet::from([1]));
        let mut unmeasured = sample_json();
        unmeasured["paper_figures"][0]["ours_value"] = Value::Null;
        outcomes[0] = ok_outcome("ipc", unmeasured);
        assert!(figures_reproduced(&outcomes).is_empty());
        outcomes[0].json = Some(sample_json());
        outcomes[0].status = Status::Interrupted;
        assert!(figures_reproduced(&outcomes).is_empty());
    }

    #[test]
    fn testbed_json_has_the_figures_reproduced_headline() {
        let conditions = Conditions::capture_before().finish();
        let outcomes = sample_outcomes();
        let v = serde_json::to_value(testbed_json(&run(), &conditions, &outcomes)).expect("serializable");
        assert_eq!(v["experiment"], "testbed");
        assert_eq!(v["paper"], "all");
        assert_eq!(v["quick"], true);
        assert!(v["conditions"]["cpus"].is_u64());
        assert_eq!(v["experiments"][0]["name"], "ipc");
        assert_eq!(v["experiments"][0]["status"], "ok");
        assert_eq!(v["experiments"][1]["status"], "failed");
        assert!(v["experiments"][0].get("reason").is_none());
        assert!(v["experiments"][1]["reason"].as_str().is_some_and(|r| r.contains("not implemented")));
        let text = serde_json::to_string_pretty(&testbed_json(&run(), &conditions, &outcomes)).expect("text");
        assert!(text.starts_with("{\n  \"experiment\": \"testbed\""), "{text}");
        let h = &v["headline"][0];
        assert_eq!(h["name"], "figures_reproduced");
        assert_eq!(h["ours"], 1.0);
        assert_eq!(h["peer"], 19.0);
        assert_eq!(h["peer_name"], "figures listed in BENCHMARKS.md");
        assert_eq!(h["unit"], "figures");
        assert_eq!(h["better"], "higher");
        assert!((h["ratio"].as_f64().expect("ratio") - 1.0 / 19.0).abs() < 1e-12);
    }

    #[test]
    fn latency_tails_get_a_panel_per_size_and_are_well_formed() {
        let svg = cdf_svg("ipc", &sample_json()).expect("a plot");
        assert!(balanced(&svg), "{svg}");
        assert_eq!(svg.matches("<svg").count(), 2, "one panel inside the document");
        assert!(svg.contains("ipc: latency tail, 64 B messages [quick]"));
        assert!(svg.contains(">seqpacket<") && svg.contains(">port inline<"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        assert!(cdf_svg("x", &json!({ "rows": [ { "case": "memcpy", "mb_s_median": 1.0 } ] })).is_none());
    }

    #[test]
    fn cases_without_sizes_go_eight_to_a_panel() {
        let rows: Vec<Value> = (0..10)
            .map(|i| {
                json!({ "case": format!("case {i}"), "count": 5, "p50_ns": 10, "p99_ns": 20,
                             "p999_ns": 30, "max_ns": 40 })
            })
            .collect();
        let svg = cdf_svg("x", &json!({ "rows": rows })).expect("a plot");
        assert!(balanced(&svg));
        assert_eq!(svg.matches("<svg").count(), 3);
        assert_eq!(root_size(&svg), Some((860.0, 1040.0)));
    }

    #[test]
    fn selection_keeps_the_list_order_and_rejects_unknown_names() {
        let available = vec!["ipc".to_string(), "fileread".to_string()];
        assert_eq!(select(&available, &[]).expect("all"), available);
        assert_eq!(select(&available, &["fileread".into(), "ipc".into()]).expect("both"), available);
        assert_eq!(select(&available, &["fileread".into()]).expect("one"), ["fileread"]);
        let err = select(&available, &["nope".into()]).expect_err("unknown").to_string();
        assert!(err.contains("nope") && err.contains("ipc, fileread"), "{err}");
    }

    #[test]
    fn estimates_scale_with_the_pace_of_finished_experiments() {
        let board = Board::new(&["a".to_string(), "b".to_string(), "c".to_string()], true, false);
        let mut state = board.lock();
        assert_eq!(state.left(None), 3.0 * DEFAULT_EXPECTED_S);
        state.rows[0].stage = Stage::Done(120.0);
        state.rows[0].ok = true;
        assert_eq!(state.pace(), 2.0);
        state.rows[1].stage = Stage::Running(Instant::now());
        assert_eq!(state.left(Some((1, 20.0))), 100.0 + 120.0);
        let line = state.running_line(1, 60.0);
        assert!(line.starts_with("[2/3] b [############------------] 1:00 of ~2:00"), "{line}");
        assert!(state.running_line(1, 500.0).contains("longer than expected"));
    }

    #[test]
    fn small_formatters() {
        assert_eq!(clock(0.4), "0:00");
        assert_eq!(clock(65.0), "1:05");
        assert_eq!(clock(3_725.0), "1:02:05");
        assert_eq!(sig3(1.4805), "1.48");
        assert_eq!(sig3(0.060_625), "0.0606");
        assert_eq!(sig3(10_636.8), "10637");
        assert_eq!(sig3(f64::NAN), "—");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_709_210_096)), "2024-02-29T12:34:56Z");
        assert_eq!(md("a|b <c> *d*\ne"), "a\\|b &lt;c&gt; \\*d\\* e");
        let reason = failure_reason(ExitStatus::from_raw(1 << 8), "x\n\nictus: boom\n");
        assert_eq!(reason, "x / ictus: boom (exit status 1)");
        assert_eq!(failure_reason(ExitStatus::from_raw(9), ""), "no message (killed by signal 9)");
    }
}
