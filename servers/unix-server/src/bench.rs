//! `ictus bench unix`: 004 §5 — the operation table (§5.3–5.4), the compile test
//! (§5.1) and the modified Andrew benchmark (§5.2), each natively, under ictus and
//! under proot (Debian's ptrace-based user-space chroot, the peer a user would pick),
//! interleaved round by round (the order rotates every round), in one run.
//!
//! - Operations: a small C program (`bench/opbench.c`, compiled here with gcc) times
//!   each repetition of one operation; the samples of every round go into one HDR
//!   histogram per (operation, mode).
//! - Compile test: nine small C files compiled one by one by a shell script, the
//!   whole run timed from outside (session start-up included, as a user sees it).
//! - Andrew: a generated source tree (directories, C files, headers, a Makefile);
//!   phases mkdir, copy, stat (`ls -lR`), find/grep, compile (`make`), each timed
//!   inside the script with bash's `$EPOCHREALTIME` (no fork for the clock).
//!
//! The compile and Andrew headlines are the median of per-round ratios: each round
//! runs every mode back to back, so a round's ictus run is compared only with the
//! native run beside it (the load of a shared machine moves whole rounds, not one
//! mode); every round's ratio is a row of its own. Quick runs the same programs on
//! the same kind of tree as full, fewer rounds.
//!
//! Headlines: `unix_getpid_vs_native`, `unix_failed_open_vs_native`,
//! `unix_compile_vs_native`, `unix_compile_vs_proot`, `unix_andrew_vs_native`.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use ictus_bench::conditions::Conditions;
use ictus_bench::experiment::no_args;
use ictus_bench::report::{Better, Headline, PaperFigure, Report};
use ictus_bench::stats::{median, LatencyRecorder};
use ictus_bench::windows::Windowed;
use ictus_bench::{BenchError, Experiment, Options, Outcome};
use serde_json::json;

use crate::launch::{run_session, Ended, RunOptions, Snapshot};

/// The experiment, for the `ictus` binary's registry.
pub static UNIX: Experiment = Experiment {
    name: EXPERIMENT,
    about: "Unix as an application (004 §5): the operation table, the compile test and the modified Andrew \
            benchmark, native, under ictus and under proot, interleaved",
    figures: &[15, 16, 17, 18, 19],
    quick_s: 60.0,
    full_s: 600.0,
    roles: &[],
    args: no_args,
    run: run_experiment,
};

fn run_experiment(opts: &Options) -> Result<Outcome, BenchError> {
    Ok(Outcome { report: run(opts.quick)?, plots: Vec::new() })
}

/// Experiment name, as in `ictus bench unix`.
pub const EXPERIMENT: &str = "unix";
/// Where in the papers it comes from.
pub const PAPER: &str = "004 §5.1-5.4 (figures #15-#19)";

/// How a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// On the host kernel.
    Native,
    /// Under `ictus unix run` (a private server per run).
    Ictus,
    /// Under `proot`.
    Proot,
    /// Under `ictus unix run` with a view that confines paths (it hides one
    /// directory nobody uses): every lookup is then served, none native.
    IctusConfined,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Ictus => "ictus",
            Mode::Proot => "proot",
            Mode::IctusConfined => "ictus-confined",
        }
    }
}

fn err(context: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::io(context.to_string(), std::io::Error::other(e.to_string()))
}

/// Run `argv` in `mode` with standard output to `out`; returns the wall time (ns)
/// and, under ictus, what the server counted.
fn run_in(mode: Mode, argv: &[String], out: &Path) -> Result<(u64, Option<Snapshot>), BenchError> {
    let start = Instant::now();
    let mut snap = None;
    match mode {
        Mode::Native | Mode::Proot => {
            let mut cmd = if mode == Mode::Native {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            } else {
                let mut c = Command::new("proot");
                c.args(argv);
                c
            };
            let st = cmd
                .stdout(fs::File::create(out).map_err(|e| BenchError::io("output file", e))?)
                .stderr(std::process::Stdio::null())
                .status()
                .map_err(|e| BenchError::io(format!("running {argv:?} {}", mode.name()), e))?;
            if !st.success() {
                return Err(err(&format!("{argv:?} {}", mode.name()), format!("ended {st}")));
            }
        }
        Mode::Ictus | Mode::IctusConfined => {
            let opts = RunOptions {
                // The confining view's policy is written beside the output file.
                policy: (mode == Mode::IctusConfined).then(|| out.with_file_name(CONFINED_POLICY)),
                argv: argv.iter().map(Into::into).collect(),
                quiet: true,
                stdout: Some(out.to_path_buf()),
            };
            let (ended, counted) = run_session(&opts).map_err(|e| err("ictus unix run", e))?;
            if ended != Ended::Code(0) {
                return Err(err(&format!("{argv:?} ictus"), format!("{ended:?}")));
            }
            snap = Some(counted);
        }
    }
    Ok((start.elapsed().as_nanos() as u64, snap))
}

/// The confining view's policy file, in the work directory.
const CONFINED_POLICY: &str = "confined.policy";

struct Op {
    name: &'static str,
    case: &'static str,
    quick: usize,
    full: usize,
    paper: Option<(&'static str, f64)>,
}

const OPS: &[Op] = &[
    Op {
        name: "getpid",
        case: "getpid (glibc's, batches of 100)",
        quick: 3000,
        full: 30000,
        paper: Some(("102 µs", 102_000.0)),
    },
    Op { name: "getpid_raw", case: "getpid by syscall(2) (a site not patched)", quick: 1000, full: 10000, paper: None },
    Op { name: "lseek", case: "lseek", quick: 3000, full: 30000, paper: Some(("170 µs", 170_000.0)) },
    Op { name: "lseek_read1", case: "lseek + read 1 B", quick: 2000, full: 20000, paper: Some(("0.35 ms", 350_000.0)) },
    Op {
        name: "lseek_read8k",
        case: "lseek + read 8 KiB",
        quick: 2000,
        full: 20000,
        paper: Some(("1.38 ms", 1_380_000.0)),
    },
    Op {
        name: "open_read_close",
        case: "open foo + read 8 KiB + close",
        quick: 500,
        full: 5000,
        paper: Some(("5.5 ms", 5_500_000.0)),
    },
    Op {
        name: "open_read_close_abs",
        case: "open /deep/path/foo + read 8 KiB + close",
        quick: 500,
        full: 5000,
        paper: Some(("6.68 ms", 6_680_000.0)),
    },
    Op {
        name: "failed_open",
        case: "failed open of xxx",
        quick: 1000,
        full: 10000,
        paper: Some(("1.42 ms", 1_420_000.0)),
    },
    Op { name: "stat", case: "stat", quick: 1000, full: 10000, paper: None },
    Op {
        name: "fork_exit_wait",
        case: "fork + exit + wait",
        quick: 40,
        full: 400,
        paper: Some(("48 ms", 48_000_000.0)),
    },
    Op {
        name: "fork_exec_wait",
        case: "fork + exec + exit + wait",
        quick: 20,
        full: 200,
        paper: Some(("74 ms", 74_000_000.0)),
    },
    Op {
        name: "cwd0",
        case: "create, write 0 B, delete",
        quick: 200,
        full: 2000,
        paper: Some(("83.4 ms", 83_400_000.0)),
    },
    Op {
        name: "cwd10k",
        case: "create, write 10 KiB, delete",
        quick: 200,
        full: 2000,
        paper: Some(("152 ms", 152_000_000.0)),
    },
    Op {
        name: "cwd100k",
        case: "create, write 100 KiB, delete",
        quick: 100,
        full: 1000,
        paper: Some(("596 ms", 596_000_000.0)),
    },
    Op { name: "write1m", case: "write 1 MiB", quick: 20, full: 200, paper: None },
    Op { name: "read_cached", case: "read 1 MiB cached", quick: 20, full: 200, paper: None },
    Op { name: "read_uncached", case: "read 1 MiB uncached", quick: 10, full: 100, paper: None },
];

fn gcc(src: &Path, out: &Path) -> Result<(), BenchError> {
    let st =
        Command::new("gcc").args(["-O2", "-o"]).arg(out).arg(src).status().map_err(|e| BenchError::io("gcc", e))?;
    if st.success() {
        Ok(())
    } else {
        Err(err("compiling the benchmark program", "gcc failed"))
    }
}

fn c_sources(dir: &Path, n: usize) -> Result<(), BenchError> {
    fs::create_dir_all(dir).map_err(|e| BenchError::io("source dir", e))?;
    for i in 0..n {
        let text = format!(
            "#include <stdio.h>\n#include <string.h>\n#include \"common.h\"\nstatic int t{i}[64];\nint f{i}(int x) {{ for (int k = 0; k < 64; k++) t{i}[k] = k * x + COMMON; return t{i}[x & 63]; }}\nvoid p{i}(const char *s) {{ printf(\"%s %zu\\n\", s, strlen(s)); }}\n"
        );
        fs::write(dir.join(format!("f{i}.c")), text).map_err(|e| BenchError::io("source", e))?;
    }
    fs::write(dir.join("common.h"), "#define COMMON 7\n").map_err(|e| BenchError::io("header", e))
}

/// Run the experiment.
pub fn run(quick: bool) -> Result<Report, BenchError> {
    let conditions = Conditions::capture_before();
    let mut report = Report::new(EXPERIMENT, PAPER, quick, conditions);
    let work = std::env::temp_dir().join(format!("ictus-bench-unix-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(work.join("a/b/c/d")).map_err(|e| BenchError::io("work dir", e))?;
    let result = run_in_dir(quick, &work, &mut report);
    let _ = fs::remove_dir_all(&work);
    result?;
    report.conditions = report.conditions.clone().finish();
    Ok(report)
}

/// Run in `mode`; a failure of the peer is a finding, noted once per part, not the
/// end of the experiment.
fn try_run(
    mode: Mode,
    argv: &[String],
    out: &Path,
    part: &str,
    notes: &mut Vec<String>,
) -> Result<Option<(u64, Option<Snapshot>)>, BenchError> {
    match run_in(mode, argv, out) {
        Ok(t) => Ok(Some(t)),
        Err(e) if mode == Mode::Proot => {
            let note = format!("proot failed the {part}: {e}");
            if !notes.iter().any(|n| n.starts_with(&format!("proot failed the {part}:"))) {
                notes.push(note);
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn run_in_dir(quick: bool, work: &Path, report: &mut Report) -> Result<(), BenchError> {
    let have_proot = Command::new("proot").arg("--version").output().is_ok_and(|o| o.status.success());
    let mut modes = vec![Mode::Native, Mode::Ictus];
    if have_proot {
        modes.push(Mode::Proot);
    } else {
        report.notes.push("proot is not installed (scripts/setup.sh installs it): no peer column".into());
    }
    let src = work.join("opbench.c");
    fs::write(&src, include_str!("../bench/opbench.c")).map_err(|e| BenchError::io("opbench.c", e))?;
    let opbench = work.join("opbench");
    gcc(&src, &opbench)?;
    fs::write(work.join("foo"), vec![b'x'; 8192]).map_err(|e| BenchError::io("foo", e))?;
    fs::write(work.join("a/b/c/d/foo"), vec![b'x'; 8192]).map_err(|e| BenchError::io("foo", e))?;
    fs::write(work.join("mib"), vec![b'y'; 1 << 20]).map_err(|e| BenchError::io("mib", e))?;
    let rounds = if quick { 2 } else { 5 };
    let out = work.join("out.txt");

    // The operation table.
    let mut p50 = std::collections::HashMap::new();
    for op in OPS {
        let n = if quick { op.quick } else { op.full } / rounds;
        let mut rec: Vec<LatencyRecorder> = modes.iter().map(|_| LatencyRecorder::new()).collect();
        for round in 0..rounds {
            for k in 0..modes.len() {
                let m = (k + round) % modes.len();
                let argv =
                    vec![opbench.display().to_string(), work.display().to_string(), op.name.to_string(), n.to_string()];
                if try_run(modes[m], &argv, &out, op.name, &mut report.notes)?.is_none() {
                    continue;
                }
                let text = fs::read_to_string(&out).map_err(|e| BenchError::io("samples", e))?;
                for l in text.lines() {
                    if let Ok(v) = l.trim().parse::<u64>() {
                        rec[m].record(v);
                    }
                }
            }
        }
        for (m, r) in modes.iter().zip(&rec) {
            let row = r.row(format!("{} {}", op.case, m.name())).with("op", op.name).with("mode", m.name());
            p50.insert((op.name, *m), row.p50_ns as f64);
            report.rows.push(row.to_value());
        }
        if let Some((paper, v)) = op.paper {
            let ours = p50.get(&(op.name, Mode::Ictus)).copied();
            report.paper_figures.push(
                PaperFigure::new(
                    op.case,
                    format!("{paper} (Mach with Unix server, Sun 3/60)"),
                    Some(v),
                    "ns",
                    Better::Lower,
                )
                .ours(ours, ours.map_or("not measured".into(), |o| format!("{} p50", ictus_bench::format_ns(o)))),
            );
        }
    }

    // The compile test: nine small compilations, timed whole from outside; under
    // ictus also with a view that confines paths (a second row: there every lookup
    // is served, where the default view lets the library do read-only ones itself).
    let csrc = work.join("compile");
    c_sources(&csrc, 9)?;
    let unused = work.join("unused");
    fs::create_dir_all(&unused).map_err(|e| BenchError::io("unused dir", e))?;
    fs::write(work.join(CONFINED_POLICY), format!("hide {}\n", unused.display()))
        .map_err(|e| BenchError::io("confined policy", e))?;
    let compile_modes: Vec<Mode> = modes.iter().copied().chain([Mode::IctusConfined]).collect();
    let script =
        format!("cd {} && for i in 0 1 2 3 4 5 6 7 8; do gcc -O1 -c f$i.c -o f$i.o || exit 1; done", csrc.display());
    let compile_rounds = if quick { COMPILE_ROUNDS.0 } else { COMPILE_ROUNDS.1 };
    let mut compile: Vec<Vec<f64>> = compile_modes.iter().map(|_| Vec::new()).collect();
    // Per round and mode (NaN where the peer failed): the pairs of a round.
    let mut compile_by_round = vec![vec![f64::NAN; compile_modes.len()]; compile_rounds];
    for (round, by_mode) in compile_by_round.iter_mut().enumerate() {
        for k in 0..compile_modes.len() {
            let m = (k + round) % compile_modes.len();
            if let Some(t) = try_run(
                compile_modes[m],
                &["sh".into(), "-c".into(), script.clone()],
                &out,
                "compile test",
                &mut report.notes,
            )? {
                compile[m].push(t.0 as f64);
                by_mode[m] = t.0 as f64;
            }
        }
    }
    let cidx = |m: Mode| compile_modes.iter().position(|x| *x == m);
    let compile_pairs = |a: Mode, b: Mode| {
        let (a, b) = (cidx(a)?, cidx(b)?);
        Windowed::new(compile_by_round.iter().map(|r| (r[a], r[b])))
    };
    for (m, v) in compile_modes.iter().zip(&compile) {
        let case = match m {
            Mode::IctusConfined => {
                "compile test (9 files) ictus, a confining view (one unused directory hidden)".into()
            }
            _ => format!("compile test (9 files) {}", m.name()),
        };
        report.rows.push(json!({"case": case, "mode": m.name(), "median_ns": median(v.iter().copied()), "runs_ns": v}));
    }
    let compile_vs_native = compile_pairs(Mode::Ictus, Mode::Native);
    let compile_vs_proot = compile_pairs(Mode::Ictus, Mode::Proot);
    let confined_vs_native = compile_pairs(Mode::IctusConfined, Mode::Native);
    for (w, what) in [
        (&compile_vs_native, "compile test ictus / native, per round"),
        (&compile_vs_proot, "compile test ictus / proot, per round"),
        (&confined_vs_native, "compile test ictus (confining view) / native, per round"),
    ] {
        if let Some(w) = w {
            report.rows.extend(w.rows(what, "ns"));
        }
    }
    if let Some(r) = confined_vs_native.as_ref().and_then(Windowed::median_ratio) {
        report.notes.push(format!(
            "compile test under a confining view (`hide` of one unused directory: every lookup served, none done by the library): {r:.2} of native (median of per-round ratios)"
        ));
    }

    // The modified Andrew benchmark on a generated tree.
    let tree = work.join("andrew-src");
    let dirs = if quick { ANDREW_DIRS.0 } else { ANDREW_DIRS.1 };
    let mut make = String::from("OBJS=");
    for d in 0..dirs {
        c_sources(&tree.join(format!("d{d}")), 10)?;
        for i in 0..10 {
            make += &format!(" d{d}/f{i}.o");
        }
    }
    make += "\nall: $(OBJS)\n%.o: %.c\n\tgcc -O1 -Id0 -c $< -o $@\n";
    fs::write(tree.join("Makefile"), make).map_err(|e| BenchError::io("Makefile", e))?;
    let andrew = format!(
        r#"set -e; cd {w}; rm -rf target; t0=$EPOCHREALTIME; mkdir -p target; for d in {src}/*/; do mkdir -p target/$(basename $d)/x/y; done; t1=$EPOCHREALTIME; cp -r {src}/. target/; t2=$EPOCHREALTIME; ls -lR target > /dev/null; t3=$EPOCHREALTIME; find target -name '*.c' | xargs grep -l include | wc -l > /dev/null; t4=$EPOCHREALTIME; make -s -C target; t5=$EPOCHREALTIME; echo $t0 $t1 $t2 $t3 $t4 $t5"#,
        w = work.display(),
        src = tree.display()
    );
    let andrew_rounds = if quick { ANDREW_ROUNDS.0 } else { ANDREW_ROUNDS.1 };
    let phases = ["mkdir", "copy", "stat", "find/grep", "compile"];
    let mut andrew_t: Vec<Vec<[f64; 6]>> = modes.iter().map(|_| Vec::new()).collect();
    // Under ictus, per round: requests served, failed lookups the server walked,
    // generation bumps (every kept failure stale).
    let mut andrew_n: Vec<Vec<[f64; 3]>> = modes.iter().map(|_| Vec::new()).collect();
    // Total per round and mode (NaN where the peer failed): the pairs of a round.
    let mut andrew_by_round = vec![vec![f64::NAN; modes.len()]; andrew_rounds];
    for (round, by_mode) in andrew_by_round.iter_mut().enumerate() {
        for k in 0..modes.len() {
            let m = (k + round) % modes.len();
            let Some((_, snap)) = try_run(
                modes[m],
                &["bash".into(), "-c".into(), andrew.clone()],
                &out,
                "Andrew benchmark",
                &mut report.notes,
            )?
            else {
                continue;
            };
            if let Some(s) = snap {
                andrew_n[m].push([s.served as f64, s.failure_walks as f64, s.generation_bumps.total() as f64]);
            }
            let text = fs::read_to_string(&out).map_err(|e| BenchError::io("andrew", e))?;
            let t: Vec<f64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            if t.len() == 6 {
                let mut p = [0.0; 6];
                for i in 0..5 {
                    p[i] = (t[i + 1] - t[i]) * 1e9;
                }
                p[5] = (t[5] - t[0]) * 1e9;
                andrew_t[m].push(p);
                by_mode[m] = p[5];
            }
        }
    }
    let mut andrew_total = vec![f64::NAN; modes.len()];
    for (m, runs) in andrew_t.iter().enumerate() {
        let mut row =
            json!({"case": format!("modified Andrew benchmark {}", modes[m].name()), "mode": modes[m].name()});
        andrew_total[m] = median(runs.iter().map(|p| p[5])).unwrap_or(f64::NAN);
        for (i, ph) in phases.iter().enumerate() {
            let med = median(runs.iter().map(|p| p[i]));
            row[format!("{ph}_ns")] = json!(med);
            // The phase's share of the total (its median over the total's): the mix a
            // quick tree must keep to measure what the full tree does.
            row[format!("{ph}_share")] = json!(med.map(|v| (v / andrew_total[m] * 1000.0).round() / 1000.0));
        }
        row["total_ns"] = json!(andrew_total[m]);
        if !andrew_n[m].is_empty() {
            for (i, what) in ["served_requests", "failure_walks", "generation_bumps"].iter().enumerate() {
                row[*what] = json!(median(andrew_n[m].iter().map(|n| n[i])));
            }
        }
        report.rows.push(row);
    }
    let (an, ai) = (modes.iter().position(|x| *x == Mode::Native), modes.iter().position(|x| *x == Mode::Ictus));
    let andrew_vs_native = match (ai, an) {
        (Some(a), Some(b)) => Windowed::new(andrew_by_round.iter().map(|r| (r[a], r[b]))),
        _ => None,
    };
    if let Some(w) = &andrew_vs_native {
        report.rows.extend(w.rows("modified Andrew benchmark ictus / native, per round", "ns"));
    }

    // Headlines.
    let get = |op: &str, m: Mode| p50.get(&(op, m)).copied().unwrap_or(f64::NAN);
    let idx = |m: Mode| modes.iter().position(|x| *x == m);
    report.headline.push(
        Headline::new(
            "unix_getpid_vs_native",
            get("getpid", Mode::Ictus),
            get("getpid", Mode::Native),
            "native getpid",
            "ns",
            Better::Lower,
        )
        .with_target(0.2),
    );
    report.headline.push(
        Headline::new(
            "unix_failed_open_vs_native",
            get("failed_open", Mode::Ictus),
            get("failed_open", Mode::Native),
            "native failed open",
            "ns",
            Better::Lower,
        )
        .with_target(3.0),
    );
    report.headline.push(paired_headline("unix_compile_vs_native", compile_vs_native.as_ref(), "native", 1.15));
    if idx(Mode::Proot).is_some() {
        report.headline.push(paired_headline(
            "unix_compile_vs_proot",
            compile_vs_proot.as_ref(),
            "proot (Debian)",
            0.5,
        ));
    }
    report.headline.push(paired_headline("unix_andrew_vs_native", andrew_vs_native.as_ref(), "native", 1.2));
    let compile_ratio = compile_vs_native.as_ref().and_then(Windowed::median_ratio).unwrap_or(f64::NAN);
    let andrew_ratio = andrew_vs_native.as_ref().and_then(Windowed::median_ratio).unwrap_or(f64::NAN);
    report.paper_figures.push(
        PaperFigure::new(
            "compile test, Unix server / in-kernel",
            "28.4 s / 28.5 s = 1.00",
            Some(28.4 / 28.5),
            "ratio",
            Better::Lower,
        )
        .ours(Some(compile_ratio), format!("{compile_ratio:.2}")),
    );
    report.paper_figures.push(
        PaperFigure::new(
            "modified Andrew benchmark, Unix server / in-kernel",
            "411 s / 399 s = 1.03",
            Some(411.0 / 399.0),
            "ratio",
            Better::Lower,
        )
        .ours(Some(andrew_ratio), format!("{andrew_ratio:.2}")),
    );
    report.notes.push(format!(
        "modes interleaved, order rotating each round; {rounds} rounds per operation, {compile_rounds} compile rounds, {andrew_rounds} Andrew rounds over {dirs} directories of 10 C files; the compile and Andrew headlines are the median of per-round ratios (each round's ictus run against the run of the peer beside it), `ours` and `peer` in them each side's median; each ictus run starts a private server (its start-up is in the compile and Andrew times)"
    ));
    report.notes.push("under ictus a `mov eax, NR; syscall` site is patched on its first trap: getpid is then answered from the library's state page, a cached failed lookup in the library, and other served calls reach the server without a trap; getpid by syscall(2) (the number in a register: not patchable) pays a SIGSYS trap every time".into());
    Ok(())
}

/// Rounds of the compile test, (quick, full).
const COMPILE_ROUNDS: (usize, usize) = (7, 11);
/// Directories of 10 C files in the Andrew tree, (quick, full). The tree's phases
/// (mkdir, copy, stat, find/grep, compile) all grow with it, so a smaller tree keeps
/// the full tree's mix (the `*_share` fields of the Andrew rows show it).
const ANDREW_DIRS: (usize, usize) = (3, 8);
/// Rounds of the Andrew benchmark, (quick, full).
const ANDREW_ROUNDS: (usize, usize) = (5, 5);

/// A headline whose ratio is the median of per-round ratios (`NaN`, not met, when no
/// round has both sides); `ours` and `peer` are each side's median across the rounds.
fn paired_headline(name: &str, w: Option<&Windowed>, peer_name: &str, target: f64) -> Headline {
    let (ours, peer) = w.map_or((f64::NAN, f64::NAN), |w| (w.ours, w.peer));
    let mut h = Headline::new(name, ours, peer, peer_name, "ns", Better::Lower);
    h.ratio = w.and_then(Windowed::median_ratio).unwrap_or(f64::NAN);
    h.with_target(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paired_headline_is_the_median_of_round_ratios() {
        // Rounds that drew different loads: each round's pair is within 10 %, the
        // medians of each side (3.3 / 2.5 = 1.32) would straddle a 1.15 target.
        let w = Windowed::new([(1.1, 1.0), (3.3, 3.0), (5.0, 4.8), (9.0, 2.0), (1.2, 1.1)]).unwrap();
        let h = paired_headline("x", Some(&w), "native", 1.15);
        assert_eq!((h.ours, h.peer), (3.3, 2.0));
        assert!((h.ratio - 1.1).abs() < 1e-12, "{}", h.ratio);
        assert_eq!(h.met, Some(true));
        // A round where only ours was slow, repeated, is seen.
        let w = Windowed::new([(1.5, 1.0), (3.0, 2.0), (1.2, 1.0)]).unwrap();
        assert_eq!(paired_headline("x", Some(&w), "native", 1.15).met, Some(false));
    }

    #[test]
    fn no_paired_round_is_not_met() {
        let h = paired_headline("x", None, "native", 1.15);
        assert!(h.ratio.is_nan());
        assert_eq!(h.met, Some(false));
    }
}
