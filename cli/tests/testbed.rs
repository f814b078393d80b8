//! `ictus testbed` as a process: a quick run of a small subset, then the structure of
//! what it wrote (issue 8): every Markdown table of `report.md` has `paper`, `ours`,
//! `peer` and `ratio` columns; every headline of every experiment's JSON appears in the
//! report; every SVG file is well-formed XML; `testbed.json` carries the
//! `figures_reproduced` headline against the 19 figures. And Ctrl-C: the report is
//! still written, with the running experiment marked as interrupted.
//!
//! No test asserts a duration; waits are bounded by a watchdog only, a generous one,
//! because the quick `ipc` experiment takes seconds on a quiet machine and much longer
//! on a loaded two-core VM.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const WATCHDOG: Duration = Duration::from_secs(300);

/// The two tests each run a testbed; one at a time, so that they do not measure each
/// other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A directory of its own for each test, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "ictus-testbed-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `ictus testbed --quick --only ipc --out DIR`, with standard error piped.
fn start_testbed(out: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ictus"))
        .args(["testbed", "--quick", "--out"])
        .arg(out)
        .args(["--only", "ipc"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ictus testbed")
}

/// Waits for the child within the watchdog, killing it (and failing) past it.
fn wait_bounded(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ictus testbed still running after the {WATCHDOG:?} watchdog");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads a pipe to its end on a thread of its own, so the child never blocks on it.
fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    rx
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The header cells of every Markdown table: a table is a run of lines starting with
/// `|`, its first line the header.
fn table_headers(markdown: &str) -> Vec<Vec<String>> {
    let mut headers = Vec::new();
    let mut in_table = false;
    for line in markdown.lines() {
        let is_row = line.trim_start().starts_with('|');
        if is_row && !in_table {
            headers.push(line.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect());
        }
        in_table = is_row;
    }
    headers
}

#[test]
fn a_quick_testbed_writes_a_well_formed_report() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new();
    let mut child = start_testbed(&dir.0);
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let status = wait_bounded(&mut child);
    let stdout = stdout.recv().unwrap_or_default();
    let stderr = stderr.recv().unwrap_or_default();
    assert!(status.success(), "ictus testbed: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    // Not a terminal: one line when the experiment starts and one when it ends.
    assert!(stderr.contains("[1/1] ipc: running"), "{stderr}");
    assert!(stderr.contains("[1/1] ipc ok in"), "{stderr}");
    let report_path = dir.0.join("report.md");
    assert!(stdout.contains(&report_path.canonicalize().expect("report.md").display().to_string()), "{stdout}");

    let report = std::fs::read_to_string(&report_path).expect("report.md");
    let headers = table_headers(&report);
    assert!(headers.len() >= 2, "the paper's figures and the headlines, at least:\n{report}");
    for header in &headers {
        for column in ["paper", "ours", "peer", "ratio"] {
            assert!(header.iter().any(|c| c == column), "a table without a {column:?} column: {header:?}");
        }
    }
    for section in ["## Conditions", "## ipc", "## What could not run here and why"] {
        assert!(report.contains(section), "no {section:?} in:\n{report}");
    }

    // Every headline of every experiment's JSON is in the report.
    let summary = read_json(&dir.0.join("testbed.json"));
    let experiments = summary["experiments"].as_array().expect("experiments");
    assert_eq!(experiments.len(), 1);
    assert_eq!(experiments[0]["name"], "ipc");
    assert_eq!(experiments[0]["status"], "ok");
    let ipc = read_json(&dir.0.join("ipc.json"));
    let headlines = ipc["headline"].as_array().expect("ipc headlines");
    assert!(!headlines.is_empty(), "ipc reports headlines");
    for h in headlines {
        let name = h["name"].as_str().expect("headline name");
        assert!(report.contains(name), "headline {name} is not in report.md");
    }

    // The testbed's own headline.
    assert_eq!(summary["experiment"], "testbed");
    assert_eq!(summary["quick"], true);
    assert!(summary["conditions"]["cpus"].is_u64());
    let h = summary["headline"].as_array().expect("headline").iter().find(|h| h["name"] == "figures_reproduced");
    let h = h.expect("a figures_reproduced headline");
    assert_eq!(h["peer"], 19.0);
    assert_eq!(h["better"], "higher");
    let ours = h["ours"].as_f64().expect("ours");
    assert!((1.0..=19.0).contains(&ours), "ipc measures figure #1: {ours}");
    assert!((h["ratio"].as_f64().expect("ratio") - ours / 19.0).abs() < 1e-9);

    // Plots: the transfer-cost curve and the latency tails, each well-formed.
    let svgs: Vec<PathBuf> = std::fs::read_dir(&dir.0)
        .expect("read the report directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "svg"))
        .collect();
    for expected in ["ipc.svg", "ipc-cdf.svg"] {
        assert!(svgs.iter().any(|p| p.ends_with(expected)), "no {expected} among {svgs:?}");
        assert!(report.contains(&format!("]({expected})")), "report.md does not link {expected}");
    }
    for svg in &svgs {
        let text = std::fs::read_to_string(svg).expect("read svg");
        if let Err(e) = ictus_bench::plot::check_well_formed(&text) {
            panic!("{} is not well-formed XML: {e}", svg.display());
        }
    }
}

#[test]
fn ctrl_c_keeps_the_report_and_says_what_did_not_finish() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new();
    let mut child = start_testbed(&dir.0);
    let stdout = drain(child.stdout.take().expect("stdout"));
    // Wait until the experiment has started, so the handler is installed and there is
    // something to interrupt, then press Ctrl-C.
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).expect("read stderr");
        seen.push_str(&line);
        if n == 0 || line.contains("ipc: running") {
            break;
        }
    }
    assert!(seen.contains("ipc: running"), "{seen}");
    let ok = Command::new("sh").arg("-c").arg(format!("kill -INT {}", child.id())).status().expect("kill").success();
    assert!(ok, "kill -INT {}", child.id());
    let rest = drain(stderr);
    let status = wait_bounded(&mut child);
    let stderr = format!("{seen}{}", rest.recv().unwrap_or_default());
    let _ = stdout.recv();
    assert!(!status.success(), "an interrupted testbed fails: {status}\n{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");

    let report = std::fs::read_to_string(dir.0.join("report.md")).expect("report.md after Ctrl-C");
    let section = report.split("## What could not run here and why").nth(1).expect("the section");
    assert!(section.contains("**ipc**: interrupted"), "{report}");
    let summary = read_json(&dir.0.join("testbed.json"));
    assert_eq!(summary["interrupted"], true);
    assert_eq!(summary["experiments"][0]["status"], "interrupted");
    assert_eq!(summary["headline"][0]["ours"], 0.0);
    assert!(!dir.0.join("ipc.json").exists(), "an interrupted experiment leaves no results");
}
