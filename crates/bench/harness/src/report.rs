//! The result of one experiment: a readable table for the terminal and one JSON object
//! for `--json`, in the shape `shared/BENCHMARKS.md` specifies.

use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::conditions::Conditions;
use crate::format_ns;

/// Which direction of a comparison is the good one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Smaller is better (times).
    Lower,
    /// Larger is better (rates).
    Higher,
}

/// Something an experiment did not run or measure here, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotMeasured {
    /// What: "peer futex shm", "cpu load", "fixed-priority rows".
    pub what: String,
    /// Why, as the error or refusal said it.
    pub why: String,
}

/// What a run gathers beside its numbers, as it goes: notes on how the numbers were
/// made, and what it did not measure and why ([`Report::add_notes`] puts both in the
/// report). The distinction is made where it is known, by the call, never guessed
/// from the words afterwards.
#[derive(Debug, Clone, Default)]
pub struct Notes {
    /// How the numbers were made ([`Report::notes`]).
    pub notes: Vec<String>,
    /// What was not measured ([`Report::not_measured`]).
    pub not_measured: Vec<NotMeasured>,
}

impl Notes {
    /// No notes yet.
    pub fn new() -> Notes {
        Notes::default()
    }

    /// A note on how the numbers were made.
    pub fn push(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// A note put first.
    pub fn push_front(&mut self, note: impl Into<String>) {
        self.notes.insert(0, note.into());
    }

    /// Something not measured here, and why; once, however often it is said (a
    /// window per load and class may each find the same thing missing).
    pub fn not_measured(&mut self, what: impl Into<String>, why: impl std::fmt::Display) {
        let n = NotMeasured { what: what.into(), why: why.to_string() };
        if !self.not_measured.contains(&n) {
            self.not_measured.push(n);
        }
    }
}

/// Where a harness function that runs an experiment's phases (e.g.
/// [`crate::load::each_load`]) says what it noted: a [`Notes`], or a plain list of
/// notes (where what was not measured becomes a note, `WHAT not measured: WHY`).
pub trait NoteSink {
    /// A note on how the numbers were made.
    fn note(&mut self, note: String);
    /// Something not measured here, and why.
    fn not_measured(&mut self, what: &str, why: &str);
}

impl NoteSink for Notes {
    fn note(&mut self, note: String) {
        self.push(note);
    }

    fn not_measured(&mut self, what: &str, why: &str) {
        Notes::not_measured(self, what, why);
    }
}

impl NoteSink for Vec<String> {
    fn note(&mut self, note: String) {
        self.push(note);
    }

    fn not_measured(&mut self, what: &str, why: &str) {
        self.push(format!("{what} not measured: {why}"));
    }
}

/// One of the few comparisons that matter: ours against a peer measured in the same
/// run. Names are stable once published, because issues refer to them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Headline {
    /// Stable identifier, e.g. `port_rtt_64B_vs_uds`.
    pub name: String,
    /// Our value.
    pub ours: f64,
    /// The peer's value.
    pub peer: f64,
    /// What the peer is, e.g. `AF_UNIX SOCK_SEQPACKET socketpair`.
    pub peer_name: String,
    /// Unit of `ours` and `peer`.
    pub unit: String,
    /// `ours / peer`.
    pub ratio: f64,
    /// Whether a lower or a higher ratio is better.
    pub better: Better,
    /// The ratio we aim for, if one is set. Targets live here, in benchmark output,
    /// never in tests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    /// Whether the ratio meets the target (`None` without a target).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
}

impl Headline {
    /// A comparison without a target; the ratio is computed here.
    pub fn new(
        name: impl Into<String>,
        ours: f64,
        peer: f64,
        peer_name: impl Into<String>,
        unit: impl Into<String>,
        better: Better,
    ) -> Self {
        Headline {
            name: name.into(),
            ours,
            peer,
            peer_name: peer_name.into(),
            unit: unit.into(),
            ratio: if peer == 0.0 { f64::NAN } else { ours / peer },
            better,
            target: None,
            met: None,
        }
    }

    /// Sets the target ratio and records whether it is met.
    pub fn with_target(mut self, target: f64) -> Self {
        self.target = Some(target);
        self.met = Some(match self.better {
            Better::Lower => self.ratio <= target,
            Better::Higher => self.ratio >= target,
        });
        self
    }
}

/// A figure from the paper set beside ours. Hardware differs by three decades, so this
/// is context, not a comparison that passes or fails.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PaperFigure {
    /// What is compared, e.g. `in-line IPC fixed cost a`.
    pub quantity: String,
    /// The paper's figure as it states it, e.g. `0.160 ms`.
    pub paper: String,
    /// Ours, in words, e.g. `seqpacket: 9.1 µs`, or why it is missing.
    pub ours: String,
    /// The paper's figure in `unit`, when it is a single number.
    pub paper_value: Option<f64>,
    /// Ours in `unit`, when measured.
    pub ours_value: Option<f64>,
    /// Unit of the two values, e.g. `ns` or `MB/s`.
    pub unit: String,
    /// Whether lower or higher is better for this quantity.
    pub better: Better,
    /// How many times better ours is than the paper's (paper/ours for times,
    /// ours/paper for rates), when both values exist.
    pub times_better: Option<f64>,
}

impl PaperFigure {
    /// A paper figure with nothing of ours beside it yet.
    pub fn new(
        quantity: impl Into<String>,
        paper: impl Into<String>,
        paper_value: Option<f64>,
        unit: impl Into<String>,
        better: Better,
    ) -> Self {
        PaperFigure {
            quantity: quantity.into(),
            paper: paper.into(),
            ours: "not measured".to_string(),
            paper_value,
            ours_value: None,
            unit: unit.into(),
            better,
            times_better: None,
        }
    }

    /// Sets our value and its description.
    pub fn ours(mut self, value: Option<f64>, text: impl Into<String>) -> Self {
        self.ours = text.into();
        self.ours_value = value;
        self.times_better = match (self.paper_value, value) {
            (Some(p), Some(o)) if p > 0.0 && o > 0.0 => Some(match self.better {
                Better::Lower => p / o,
                Better::Higher => o / p,
            }),
            _ => None,
        };
        self
    }
}

/// One experiment's result.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Experiment name, as in `ictus bench <experiment>`.
    pub experiment: String,
    /// Where in the papers the experiment comes from, e.g. `000 §8, Figure 3`.
    pub paper: String,
    /// Whether this was a `--quick` run.
    pub quick: bool,
    /// The conditions it was measured under.
    pub conditions: Conditions,
    /// Measurements, one JSON object each (see [`crate::LatencyRow`]).
    pub rows: Vec<Value>,
    /// The comparisons that matter.
    pub headline: Vec<Headline>,
    /// How the numbers were made: methods, caveats, where the worst cases fell. Never
    /// what failed to run: that is [`Report::not_measured`].
    pub notes: Vec<String>,
    /// What did not run or was not measured here, and why (a peer that could not start,
    /// a load that could not start, a class of scheduling refused): what the testbed
    /// lists under "What could not run here and why".
    pub not_measured: Vec<NotMeasured>,
    /// The paper's figures beside ours.
    pub paper_figures: Vec<PaperFigure>,
    /// Row fields left out of the printed table (they stay in the JSON), e.g. fields
    /// that repeat what `case` already says.
    #[serde(skip)]
    pub hidden_in_table: Vec<String>,
}

/// Row fields shown first, in this order, after `case`.
const LEADING_COLUMNS: &[&str] = &["p50_ns", "p99_ns", "p999_ns", "max_ns", "mean_ns", "count"];

impl Report {
    /// An empty report.
    pub fn new(experiment: impl Into<String>, paper: impl Into<String>, quick: bool, conditions: Conditions) -> Self {
        Report {
            experiment: experiment.into(),
            paper: paper.into(),
            quick,
            conditions,
            rows: Vec::new(),
            headline: Vec::new(),
            notes: Vec::new(),
            not_measured: Vec::new(),
            paper_figures: Vec::new(),
            hidden_in_table: Vec::new(),
        }
    }

    /// Adds what a run gathered beside its numbers: its notes after those already
    /// here, and what it did not measure.
    pub fn add_notes(&mut self, notes: Notes) {
        self.notes.extend(notes.notes);
        self.not_measured.extend(notes.not_measured);
    }

    /// The report as the JSON object of the output contract.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Writes the JSON object to `path` (pretty-printed, with a final newline).
    pub fn write_json(&self, path: &Path) -> io::Result<()> {
        let mut text = serde_json::to_string_pretty(self).map_err(io::Error::other)?;
        text.push('\n');
        std::fs::write(path, text)
    }

    /// Prints the readable table to standard output.
    pub fn print_table(&self) {
        let mut out = io::stdout().lock();
        // A closed stdout (e.g. `| head`) is not worth a panic.
        let _ = self.write_table(&mut out);
    }

    /// The readable table as a string.
    pub fn table_string(&self) -> String {
        let mut out = Vec::new();
        let _ = self.write_table(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Writes the readable table: conditions, rows (one aligned table per run of rows
    /// with the same fields), headlines, the paper's figures and the notes.
    pub fn write_table(&self, out: &mut dyn Write) -> io::Result<()> {
        let c = &self.conditions;
        let load = |l: Option<f64>| l.map_or("?".to_string(), |v| format!("{v:.2}"));
        writeln!(out, "== {} ({}){}", self.experiment, self.paper, if self.quick { " [quick]" } else { "" })?;
        writeln!(
            out,
            "   {} CPUs ({}), Linux {}, load {} -> {}, {}, RT {}, pinned {}",
            c.cpus,
            c.cpu_model,
            c.kernel,
            load(c.loadavg_before),
            load(c.loadavg_after),
            c.policy,
            if c.rt_privileges { "available" } else { "unavailable" },
            c.pinned
        )?;

        for group in self.row_groups() {
            writeln!(out)?;
            let columns = self.columns(group[0]);
            let mut lines = vec![columns.clone()];
            for row in group {
                lines.push(columns.iter().map(|col| format_cell(col, row.get(col.as_str()))).collect());
            }
            write_aligned(out, &lines)?;
        }

        if !self.headline.is_empty() {
            writeln!(out, "\nheadline (ratio = ours / peer)")?;
            let mut lines = vec![strings(&["name", "ours", "peer", "ratio", "better", "target", "met", "peer is"])];
            for h in &self.headline {
                lines.push(vec![
                    h.name.clone(),
                    format_quantity(h.ours, &h.unit),
                    format_quantity(h.peer, &h.unit),
                    format!("{:.3}", h.ratio),
                    format!("{:?}", h.better).to_lowercase(),
                    h.target.map_or("-".to_string(), |t| format!("{t}")),
                    h.met.map_or("-".to_string(), |m| if m { "yes" } else { "NO" }.to_string()),
                    h.peer_name.clone(),
                ]);
            }
            write_aligned(out, &lines)?;
        }

        if !self.paper_figures.is_empty() {
            writeln!(out, "\nthe paper's figures beside ours")?;
            let mut lines = vec![strings(&["quantity", "paper", "ours", "x better"])];
            for f in &self.paper_figures {
                lines.push(vec![
                    f.quantity.clone(),
                    f.paper.clone(),
                    f.ours.clone(),
                    f.times_better.map_or("-".to_string(), |x| format!("{}x", format_number(x))),
                ]);
            }
            write_aligned(out, &lines)?;
        }

        if !self.notes.is_empty() {
            writeln!(out, "\nnotes")?;
            for note in &self.notes {
                writeln!(out, "  - {note}")?;
            }
        }
        if !self.not_measured.is_empty() {
            writeln!(out, "\nnot measured here")?;
            for n in &self.not_measured {
                writeln!(out, "  - {}: {}", n.what, n.why)?;
            }
        }
        Ok(())
    }

    /// Splits the rows into runs of consecutive rows with the same set of fields.
    fn row_groups(&self) -> Vec<Vec<&Value>> {
        let mut groups: Vec<Vec<&Value>> = Vec::new();
        for row in &self.rows {
            let same = groups.last().and_then(|g| g.first()).is_some_and(|first| same_keys(first, row));
            match groups.last_mut() {
                Some(group) if same => group.push(row),
                _ => groups.push(vec![row]),
            }
        }
        groups
    }

    /// Column order for a row: `case`, the latency summary, then the rest by name.
    fn columns(&self, row: &Value) -> Vec<String> {
        let Some(object) = row.as_object() else {
            return vec!["value".to_string()];
        };
        let shown = |k: &str| object.contains_key(k) && !self.hidden_in_table.iter().any(|h| h == k);
        let mut columns: Vec<String> = Vec::new();
        if shown("case") {
            columns.push("case".to_string());
        }
        columns.extend(LEADING_COLUMNS.iter().filter(|k| shown(k)).map(|k| k.to_string()));
        let mut rest: Vec<&String> = object.keys().filter(|k| !columns.contains(k) && shown(k)).collect();
        rest.sort();
        columns.extend(rest.into_iter().cloned());
        columns
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn same_keys(a: &Value, b: &Value) -> bool {
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => a.len() == b.len() && a.keys().all(|k| b.contains_key(k)),
        _ => false,
    }
}

/// Formats one table cell; `*_ns` fields are shown as durations.
fn format_cell(column: &str, value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "-".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if column.ends_with("_ns") => format_ns(x),
            Some(x) if n.is_f64() => format_number(x),
            _ => n.to_string(),
        },
        Some(other) => other.to_string(),
    }
}

fn format_quantity(value: f64, unit: &str) -> String {
    if unit == "ns" {
        format_ns(value)
    } else {
        format!("{} {unit}", format_number(value))
    }
}

/// Three significant figures or so, without exponents for ordinary magnitudes.
fn format_number(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// Writes lines of cells with aligned columns: the first left-aligned, the others
/// right-aligned, the first line as a header.
fn write_aligned(out: &mut dyn Write, lines: &[Vec<String>]) -> io::Result<()> {
    let columns = lines.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| lines.iter().filter_map(|l| l.get(i)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    for line in lines {
        let mut text = String::new();
        for (i, cell) in line.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i == 0 {
                text.push_str(cell);
                text.push_str(&" ".repeat(pad));
            } else if i == line.len() - 1 && cell.chars().any(char::is_alphabetic) && pad > 0 {
                // A trailing text column reads better left-aligned.
                text.push_str("  ");
                text.push_str(cell);
            } else {
                text.push_str("  ");
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
            }
        }
        writeln!(out, "{}", text.trim_end())?;
    }
    Ok(())
}

/// The plot's path for a JSON path: same name, `.svg` extension.
pub fn svg_path_for(json: &Path) -> std::path::PathBuf {
    let svg = json.with_extension("svg");
    if svg == json {
        let mut name = json.as_os_str().to_owned();
        name.push(".svg");
        std::path::PathBuf::from(name)
    } else {
        svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::LatencyRecorder;

    fn sample_report() -> Report {
        let mut r = Report::new("ipc", "000 §8, Figure 3", true, Conditions::capture_before().finish());
        let mut rec = LatencyRecorder::new();
        rec.record_all(&[8_000, 8_100, 8_200]);
        r.rows.push(rec.row("port inline 64 B").with("transport", "port inline").with("size_bytes", 64).to_value());
        r.rows.push(serde_json::json!({"case": "memcpy 64 B", "mb_s_median": 5123.4}));
        r.headline.push(
            Headline::new(
                "port_rtt_64B_vs_uds",
                8100.0,
                7600.0,
                "AF_UNIX SOCK_SEQPACKET socketpair",
                "ns",
                Better::Lower,
            )
            .with_target(1.15),
        );
        r.paper_figures.push(
            PaperFigure::new("in-line IPC fixed cost a", "0.160 ms", Some(160_000.0), "ns", Better::Lower)
                .ours(Some(8_000.0), "port inline: 8.00 µs"),
        );
        r.notes.push("a note".to_string());
        r.not_measured.push(NotMeasured { what: "peer futex shm".into(), why: "no futex".into() });
        r
    }

    #[test]
    fn json_has_the_contract_shape() {
        let v = sample_report().to_json();
        for key in ["experiment", "paper", "quick", "conditions", "rows", "headline", "notes", "paper_figures"] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert!(v.get("hidden_in_table").is_none());
        assert_eq!(v["experiment"], "ipc");
        assert_eq!(v["quick"], true);
        assert!(v["conditions"]["cpus"].is_u64());
        let row = &v["rows"][0];
        assert_eq!(row["case"], "port inline 64 B");
        assert_eq!(row["size_bytes"], 64);
        for key in ["count", "p50_ns", "p99_ns", "p999_ns", "max_ns"] {
            assert!(row[key].is_u64(), "row field {key}");
        }
        let h = &v["headline"][0];
        assert_eq!(h["name"], "port_rtt_64B_vs_uds");
        assert_eq!(h["better"], "lower");
        assert_eq!(h["peer_name"], "AF_UNIX SOCK_SEQPACKET socketpair");
        assert_eq!(h["unit"], "ns");
        assert!((h["ratio"].as_f64().expect("ratio") - 8100.0 / 7600.0).abs() < 1e-12);
        assert_eq!(h["target"], 1.15);
        assert_eq!(h["met"], true);
        assert_eq!(v["paper_figures"][0]["times_better"], 20.0);
        assert_eq!(v["not_measured"][0]["what"], "peer futex shm");
        assert_eq!(v["not_measured"][0]["why"], "no futex");
    }

    #[test]
    fn notes_keep_what_was_not_measured_apart() {
        let mut notes = Notes::new();
        notes.push("windows of 3 s; a job still running when its window closes is abandoned, skipped");
        notes.not_measured("cpu load", "could not start: EPERM");
        notes.not_measured("cpu load", "could not start: EPERM");
        notes.push_front("first");
        let mut r = sample_report();
        r.add_notes(notes);
        assert_eq!(r.notes.len(), 3);
        assert_eq!(r.notes[1], "first");
        assert_eq!(r.not_measured.len(), 2);
        assert_eq!(r.not_measured[1], NotMeasured { what: "cpu load".into(), why: "could not start: EPERM".into() });
        let mut plain: Vec<String> = Vec::new();
        NoteSink::not_measured(&mut plain, "cpu load", "EPERM");
        assert_eq!(plain, ["cpu load not measured: EPERM"]);
    }

    #[test]
    fn headline_without_target_omits_target_and_met() {
        let h = Headline::new("x", 2.0, 1.0, "peer", "MB/s", Better::Higher);
        let v = serde_json::to_value(&h).expect("serializable");
        assert_eq!(v["ratio"], 2.0);
        assert!(v.get("target").is_none() && v.get("met").is_none());
        assert_eq!(h.clone().with_target(1.5).met, Some(true));
        assert_eq!(h.with_target(2.5).met, Some(false));
    }

    #[test]
    fn json_round_trips_through_a_file() {
        let path = std::env::temp_dir().join(format!("ictus-bench-report-{}.json", std::process::id()));
        sample_report().write_json(&path).expect("write");
        let text = std::fs::read_to_string(&path).expect("read");
        let _ = std::fs::remove_file(&path);
        let v: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(v["paper"], "000 §8, Figure 3");
    }

    #[test]
    fn table_mentions_rows_headlines_and_figures() {
        let mut report = sample_report();
        report.hidden_in_table.push("transport".to_string());
        let table = report.table_string();
        assert!(table.contains("port inline 64 B"));
        assert!(table.contains("8.10 µs"), "{table}");
        assert!(table.contains("memcpy 64 B"));
        assert!(table.contains("port_rtt_64B_vs_uds"));
        assert!(table.contains("0.160 ms"));
        assert!(table.contains("a note"));
        assert!(table.contains("not measured here\n  - peer futex shm: no futex"), "{table}");
        // Hidden fields stay out of the table.
        let header = table.lines().find(|l| l.starts_with("case")).expect("a header line");
        assert!(!header.contains("transport"), "{header}");
        assert!(header.find("p50_ns") < header.find("max_ns"));
    }
}
