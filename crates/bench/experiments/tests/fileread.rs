//! `ictus bench fileread` end to end on a small file: every method runs, the report has
//! the contract's shape, the JSON and the bar chart are written, and the test file is
//! removed. No duration is asserted.

use std::path::PathBuf;

use ictus_experiments::fileread::{self, FilereadOptions};
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ictus-fileread-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

#[test]
fn a_small_run_reports_every_method_and_cleans_up() {
    let out = scratch("out");
    let base = scratch("base");
    let json = out.join("fileread.json");
    let opts = FilereadOptions {
        quick: true,
        dir: Some(base.clone()),
        file_bytes: Some(8 << 20),
        rounds: Some(1),
        progress: false,
    };
    let outcome = fileread::run_with(&opts).expect("the experiment runs");
    outcome.write(&json).expect("the JSON and the chart are written");
    let report = outcome.report;

    assert_eq!(report.experiment, fileread::EXPERIMENT);
    assert_eq!(report.paper, "000 Table 2");
    let cases: Vec<&str> = report.rows.iter().filter_map(|r| r["case"].as_str()).collect();
    for case in ["stdio 1 KiB cached", "stdio 1 KiB uncached", "block 4 KiB uncached", "mapped uncached"] {
        assert!(cases.contains(&case), "{case} missing from {cases:?}");
    }
    for row in report.rows.iter().filter(|r| r.get("method").is_some()) {
        assert!(row["mb_s_median"].as_f64().is_some_and(|v| v > 0.0), "{row}");
        assert_eq!(row["runs"], 1);
        assert!(row["cpu_s_per_gb"].is_number(), "{row}");
    }
    // Exactly one best block size per cache state.
    for cache in ["cached", "uncached"] {
        let best = report.rows.iter().filter(|r| r["cache"] == cache && r["best_block"] == "yes").count();
        assert_eq!(best, 1, "{cache}");
    }
    // Methods that could not run say so, where the testbed lists what did not run.
    for method in ["O_DIRECT", "io_uring"] {
        let ran = report.rows.iter().any(|r| r["method"] == method);
        let said = report.not_measured.iter().any(|n| n.what.starts_with(method) && n.why.contains("could not run"));
        assert!(ran != said, "{method}: ran {ran}, said {said}");
        assert!(!report.notes.iter().any(|n| n.starts_with(method) && n.contains("could not run here")));
    }

    assert_eq!(report.headline.len(), 1);
    let h = &report.headline[0];
    assert_eq!(h.name, fileread::HEADLINE);
    assert_eq!(h.peer_name, fileread::PEER_NAME);
    assert!(h.ours > 0.0 && h.peer > 0.0);
    assert_eq!(report.paper_figures.len(), 4);
    assert!(report.paper_figures.iter().all(|f| f.ours_value.is_some() && f.paper_value.is_some()));

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).expect("valid JSON");
    for key in ["experiment", "paper", "quick", "conditions", "rows", "headline", "notes", "paper_figures"] {
        assert!(v.get(key).is_some(), "{key} missing");
    }
    assert_eq!(v["headline"][0]["better"], "higher");
    let svg = std::fs::read_to_string(out.join("fileread.svg")).expect("SVG written");
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains(">stdio<") && svg.contains(">mapio<"));

    // The test file and its directory are gone.
    let left: Vec<_> = std::fs::read_dir(&base).expect("base").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&base);
}
