//! What the testbed writes once the experiments have run: `testbed.json`, the
//! latency-tail plots (`NAME-cdf.svg`) and `report.md`.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use super::progress::clock;
use super::{figures_of, figures_reproduced, Outcome, Status};
use crate::conditions::Conditions;
use crate::experiment::{Experiment, FIGURES};
use crate::plot::{stack, Axis, Plot, Scale, Series, TickFormat};
use crate::report::{Better, Headline};
use crate::{format_ns, format_size};

// ---------------------------------------------------------------------------------
// testbed.json
// ---------------------------------------------------------------------------------

/// Facts about the whole run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) started: SystemTime,
    pub(super) seconds: f64,
    pub(super) quick: bool,
    pub(super) interrupted: bool,
}

/// The testbed's own JSON object (`testbed.json`), in the shape of an experiment's:
/// conditions, the experiments with their status, and the `figures_reproduced`
/// headline.
#[derive(Debug, Serialize)]
pub(super) struct Summary<'a> {
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
pub(super) fn testbed_json<'a>(
    registry: &[&Experiment],
    run: &Run,
    conditions: &'a Conditions,
    outcomes: &'a [Outcome],
) -> Summary<'a> {
    let covered = figures_reproduced(registry, outcomes);
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
                figures: figures_of(registry, &o.name),
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
pub(super) fn rfc3339(time: SystemTime) -> String {
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
pub(super) fn cdf_svg(experiment: &str, json: &Value) -> Option<String> {
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
    Some(stack(&panels))
}

// ---------------------------------------------------------------------------------
// report.md
// ---------------------------------------------------------------------------------

/// The elements of a JSON array field, or none.
pub(super) fn array<'a>(json: &'a Value, key: &str) -> &'a [Value] {
    json.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn text<'a>(json: &'a Value, key: &str) -> Option<&'a str> {
    json.get(key).and_then(Value::as_str)
}

/// Text made safe for a Markdown table cell or list item.
pub(super) fn md(text: &str) -> String {
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
pub(super) fn sig3(x: f64) -> String {
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
pub(super) fn render_report(
    registry: &[&Experiment],
    run: &Run,
    conditions: &Conditions,
    outcomes: &[Outcome],
) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail; results are ignored on purpose.
    let _ = write_report(&mut out, registry, run, conditions, outcomes);
    out
}

fn write_report(
    out: &mut String,
    registry: &[&Experiment],
    run: &Run,
    c: &Conditions,
    outcomes: &[Outcome],
) -> std::fmt::Result {
    let covered = figures_reproduced(registry, outcomes);
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
        let figures: Vec<String> = figures_of(registry, &o.name)
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
        write_experiment(out, registry, o)?;
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
        // What the experiment itself says it did not measure (`not_measured`), never its
        // notes: those say how the numbers were made, in words that may well be
        // "skipped" or "cannot" without anything missing.
        for n in array(json, "not_measured") {
            any = true;
            writeln!(
                out,
                "- **{}**: {}: {}",
                o.name,
                md(text(n, "what").unwrap_or("something")),
                md(text(n, "why").unwrap_or("no reason given"))
            )?;
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
        let experiments: Vec<&Outcome> =
            outcomes.iter().filter(|o| figures_of(registry, &o.name).contains(&n)).collect();
        let state = if covered.contains(&n) {
            let by: Vec<&str> = experiments.iter().filter(|o| o.measured_a_figure()).map(|o| o.name.as_str()).collect();
            format!("measured by {}", by.join(", "))
        } else if experiments.is_empty() {
            match registry.iter().find(|e| e.figures.contains(&n)) {
                Some(e) => format!("not selected in this run (`{}`)", e.name),
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
fn write_experiment(out: &mut String, registry: &[&Experiment], o: &Outcome) -> std::fmt::Result {
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
        match figures_of(registry, &o.name) {
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
