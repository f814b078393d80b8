//! The testbed's unit tests: the report's shape, the figures count, the progress
//! estimates and the small formatters.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde_json::json;

use super::progress::{clock, Board, Stage};
use super::summary::{cdf_svg, md, render_report, rfc3339, sig3, testbed_json, Run};
use super::*;
use crate::experiment::tests::REGISTRY;
use crate::plot::root_size;

fn balanced(xml: &str) -> bool {
    crate::plot::check_well_formed(xml).is_ok()
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
        "notes": [ "measured in 4 s",
                   "misses = jobs finished late + periods skipped because the previous job overran",
                   "a deadline thread cannot be pinned; the sender's memory could not be locked (see above)" ],
        "not_measured": [ { "what": "peer futex shm", "why": "could not run here: no futex" } ],
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
    let report = render_report(REGISTRY, &run(), &Conditions::capture_before().finish(), &sample_outcomes());
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
fn what_could_not_run_gathers_failures_what_was_not_measured_and_missing_figures() {
    let report = render_report(REGISTRY, &run(), &Conditions::capture_before().finish(), &sample_outcomes());
    let section = report.split("## What could not run here and why").nth(1).expect("the section");
    let section = section.split("\n## ").next().expect("its body");
    assert!(section.contains("**fileread**: failed: ictus: fileread: not implemented yet"), "{section}");
    assert!(section.contains("**ipc**: peer futex shm: could not run here: no futex"), "{section}");
    assert!(section.contains("shared memory signalling"), "{section}");
    assert!(!section.contains("measured in 4 s"), "{section}");
    // Notes describe the method, whatever their words: never listed as failures.
    assert!(!section.contains("periods skipped"), "{section}");
    assert!(!section.contains("cannot be pinned"), "{section}");
    // They stay in the experiment's own section.
    let ipc = report.split("\n## ipc").nth(1).expect("the ipc section");
    assert!(ipc.contains("periods skipped") && ipc.contains("cannot be pinned"), "{ipc}");
    assert!(report.contains("- #1 transfer costs (000 §8, Fig. 3): measured by ipc"), "{report}");
    assert!(report.contains("- #2 file read methods (000 Table 2): not measured: fileread failed"), "{report}");
    assert!(report.contains("- #6 display transfer (000 §10): no experiment yet"), "{report}");
}

#[test]
fn figures_count_only_finished_experiments_with_a_measured_figure() {
    let mut outcomes = sample_outcomes();
    assert_eq!(figures_reproduced(REGISTRY, &outcomes), BTreeSet::from([1]));
    let mut unmeasured = sample_json();
    unmeasured["paper_figures"][0]["ours_value"] = Value::Null;
    outcomes[0] = ok_outcome("ipc", unmeasured);
    assert!(figures_reproduced(REGISTRY, &outcomes).is_empty());
    outcomes[0].json = Some(sample_json());
    outcomes[0].status = Status::Interrupted;
    assert!(figures_reproduced(REGISTRY, &outcomes).is_empty());
}

#[test]
fn testbed_json_has_the_figures_reproduced_headline() {
    let conditions = Conditions::capture_before().finish();
    let outcomes = sample_outcomes();
    let v = serde_json::to_value(testbed_json(REGISTRY, &run(), &conditions, &outcomes)).expect("serializable");
    assert_eq!(v["experiment"], "testbed");
    assert_eq!(v["paper"], "all");
    assert_eq!(v["quick"], true);
    assert!(v["conditions"]["cpus"].is_u64());
    assert_eq!(v["experiments"][0]["name"], "ipc");
    assert_eq!(v["experiments"][0]["status"], "ok");
    assert_eq!(v["experiments"][1]["status"], "failed");
    assert!(v["experiments"][0].get("reason").is_none());
    assert!(v["experiments"][1]["reason"].as_str().is_some_and(|r| r.contains("not implemented")));
    let text = serde_json::to_string_pretty(&testbed_json(REGISTRY, &run(), &conditions, &outcomes)).expect("text");
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
    let names = ["a".to_string(), "b".to_string(), "c".to_string()];
    let expected: Vec<f64> = names.iter().map(|n| expected_seconds(REGISTRY, n, true)).collect();
    let board = Board::new(&names, &expected, false);
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
