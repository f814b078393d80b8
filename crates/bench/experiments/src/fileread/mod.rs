//! The `fileread` experiment: ways to read a file (paper 000 §9, Table 2).
//!
//! The paper read a 30 MB file on a 16 MB machine, so that nothing came from the cache,
//! with four methods: `stdio`, plain `read` at the best block size (it tried many and kept
//! the best), a memory mapping faulted in page by page, and `mapio`, a `stdio`-like
//! library over a mapping. We read one test file with those four and with today's two
//! ways past the page cache's copying, `O_DIRECT` and io_uring, each both *cached* (the
//! file read once just before) and *uncached* (read in, then its pages dropped with
//! `posix_fadvise(POSIX_FADV_DONTNEED)` just before, verified with `mincore`; reading it
//! in first makes every uncached run reuse the memory just freed, whatever ran before).
//!
//! A file larger than memory is not practical on a machine with gigabytes of it, so
//! "uncached" here means "not in this kernel's page cache": dropping one file's pages
//! needs no privileges and leaves the rest of the machine alone.
//!
//! Every run is timed (wall clock) and charged its CPU time (`getrusage(RUSAGE_SELF)`
//! user + system, which includes io_uring's kernel workers), and checksums every byte
//! it read; a checksum that differs from the one computed while writing the file fails
//! the experiment. Methods take turns in rounds, rotating who goes first, cached and
//! uncached phases alternating, after an untimed warm-up round, so machine noise falls on
//! all of them alike. Each (method, cache state) is reported as the median MB/s (10^6
//! bytes per second) of its runs with the slowest and fastest, CPU seconds per GB and
//! CPU % of the wall time (the paper's measure).
//!
//! Headline `fileread_best_vs_stdio`: the fastest method's uncached throughput against
//! buffered `stdio`-style reads (what a program gets without trying), higher is better.

mod checksum;
mod methods;
mod testfile;

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ictus_bench::conditions::{disk_share, free_bytes, DISK_RESERVE};
use ictus_bench::plot::{Bar, BarChart, BarGroup};
use ictus_bench::rounds::rotation;
use ictus_bench::{format_size, BenchError, Conditions, Experiment, Options, Outcome};
use ictus_bench::{Better, Headline, Notes, PaperFigure, Report, Throughput};
use serde_json::{json, Value};

use checksum::{check_checksum, fill_pattern};
pub use checksum::{Checksum, StreamChecksum};
use methods::{probe_direct, probe_uring, timed, RunSample};
use testfile::{choose_base, free_page_reporting, memory_backed, read_ahead_kb, Dropper, TestFile};

/// `ictus bench fileread [--dir DIR]`.
pub static FILEREAD: Experiment = Experiment {
    name: EXPERIMENT,
    about: "File read methods (000 Table 2): stdio-style, block, mapped, mapio, O_DIRECT and io_uring reads, \
            cached and uncached",
    figures: &[2],
    quick_s: 10.0,
    full_s: 200.0,
    roles: &[],
    args,
    run,
};

/// `--dir DIR`.
fn args() -> Vec<clap::Arg> {
    vec![clap::Arg::new("dir").long("dir").value_name("DIR").value_parser(clap::value_parser!(PathBuf)).help(
        "Directory to write the test file in [default: $ICTUS_BENCH_DIR, else the temporary directory if it is \
         on a disk, else ./target]",
    )]
}

/// Experiment name, as in `ictus bench fileread`.
pub const EXPERIMENT: &str = "fileread";
/// Where in the papers the experiment comes from.
pub const PAPER: &str = "000 Table 2";
/// The headline's stable name.
pub const HEADLINE: &str = "fileread_best_vs_stdio";
/// What the headline's peer is.
pub const PEER_NAME: &str = "buffered stdio-style reads (BufReader)";

/// Buffer of the `stdio`-style reader (bytes), as a C `FILE`'s is typically.
pub const STDIO_BUFFER: usize = 8 << 10;
/// Size of each `fread`-like request of the `stdio` and `mapio` readers (bytes): the
/// paper's best `stdio` request size on SCSI.
pub const STDIO_REQUEST: usize = 1 << 10;
/// Request size of the `O_DIRECT` reader (bytes).
pub const DIRECT_REQUEST: usize = 1 << 20;
/// Reads in flight in the io_uring readers.
pub const URING_DEPTH: usize = 8;
/// Request size of each io_uring read (bytes).
pub const URING_REQUEST: usize = 1 << 20;
/// Alignment of `O_DIRECT` buffers, offsets and lengths (bytes).
pub const DIRECT_ALIGN: usize = 4096;
/// Block sizes searched for plain `read(2)` in full mode, 4 KiB to 4 MiB.
pub const BLOCK_SIZES: &[usize] =
    &[4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20];
/// Block sizes searched in quick mode.
pub const BLOCK_SIZES_QUICK: &[usize] = &[4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

/// Test file size in quick mode (bytes).
pub const QUICK_FILE: u64 = 256 << 20;
/// Test file size in full mode (bytes).
pub const FULL_FILE: u64 = 2 << 30;

/// Environment variable naming the directory to put the test file in.
pub const DIR_ENV: &str = "ICTUS_BENCH_DIR";

const MIB: u64 = 1 << 20;

/// Options of `ictus bench fileread`.
#[derive(Debug, Clone, Default)]
pub struct FilereadOptions {
    /// Seconds instead of minutes: a 256 MiB file, fewer block sizes, 3 rounds.
    pub quick: bool,
    /// Directory to create the test file in [default: `$ICTUS_BENCH_DIR`, else the
    /// temporary directory if it is on a disk, else `./target`]. A private
    /// subdirectory is made in it and removed at the end.
    pub dir: Option<PathBuf>,
    /// Test file size instead of the mode's (rounded up to whole MiB): tests use a
    /// small one.
    pub file_bytes: Option<u64>,
    /// Rounds instead of the mode's (3 quick, 7 full).
    pub rounds: Option<usize>,
    /// Print a line per round to standard error.
    pub progress: bool,
}

/// Runs the experiment with the command line's options.
pub fn run(opts: &Options) -> Result<Outcome, BenchError> {
    run_with(&FilereadOptions {
        quick: opts.quick,
        dir: opts.arg("dir"),
        progress: opts.progress,
        ..Default::default()
    })
}

/// A way to read the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `fread`-like requests of [`STDIO_REQUEST`] bytes through a [`BufReader`] of
    /// [`STDIO_BUFFER`] bytes: the peer.
    Stdio,
    /// Plain `read(2)` of this many bytes at a time into one buffer.
    Block(usize),
    /// The whole file mapped and every byte touched: page faults bring it in.
    Mapped,
    /// `fread`-like requests of [`STDIO_REQUEST`] bytes copied out of a mapping of the
    /// whole file (the paper's `mapio`).
    Mapio,
    /// `read(2)` of [`DIRECT_REQUEST`] bytes with `O_DIRECT` into an aligned buffer.
    Direct,
    /// io_uring: [`URING_DEPTH`] reads of [`URING_REQUEST`] bytes in flight into
    /// registered buffers, through the page cache or (`direct`) with `O_DIRECT`.
    Uring {
        /// Open the file with `O_DIRECT`.
        direct: bool,
    },
}

impl Method {
    /// The method's name in rows: `stdio`, `block`, `mapped`, `mapio`, `O_DIRECT`,
    /// `io_uring`, `io_uring O_DIRECT`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Stdio => "stdio",
            Method::Block(_) => "block",
            Method::Mapped => "mapped",
            Method::Mapio => "mapio",
            Method::Direct => "O_DIRECT",
            Method::Uring { direct: false } => "io_uring",
            Method::Uring { direct: true } => "io_uring O_DIRECT",
        }
    }

    /// Bytes asked for per request (`None` for a mapping, which asks for nothing).
    pub fn request_bytes(self) -> Option<usize> {
        match self {
            Method::Stdio | Method::Mapio => Some(STDIO_REQUEST),
            Method::Block(size) => Some(size),
            Method::Mapped => None,
            Method::Direct => Some(DIRECT_REQUEST),
            Method::Uring { .. } => Some(URING_REQUEST),
        }
    }

    /// Name and request size, e.g. `block 64 KiB`, `io_uring 8x1 MiB`, `mapped`.
    pub fn label(self) -> String {
        match (self, self.request_bytes()) {
            (Method::Uring { .. }, Some(size)) => format!("{} {URING_DEPTH}x{}", self.name(), format_size(size)),
            (_, Some(size)) => format!("{} {}", self.name(), format_size(size)),
            (_, None) => self.name().to_string(),
        }
    }

    pub(crate) fn needs_direct(self) -> bool {
        matches!(self, Method::Direct | Method::Uring { direct: true })
    }

    pub(crate) fn needs_uring(self) -> bool {
        matches!(self, Method::Uring { .. })
    }
}

/// Whether the file's pages were in the page cache when a run started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// The file was read just before.
    Cached,
    /// The file's pages were dropped just before.
    Uncached,
}

impl Cache {
    /// `cached` or `uncached`.
    pub fn name(self) -> &'static str {
        match self {
            Cache::Cached => "cached",
            Cache::Uncached => "uncached",
        }
    }
}

// ---------------------------------------------------------------------------------------
// Summaries, report, plot.

/// One (method, cache state) summarized over its runs.
#[derive(Debug, Clone, PartialEq)]
struct Summary {
    method: Method,
    cache: Cache,
    mb_s: Throughput,
    cpu_s_per_gb: f64,
    user_s_per_gb: f64,
    sys_s_per_gb: f64,
    cpu_pct: f64,
    minor_faults: u64,
    major_faults: u64,
    /// Most of the file resident when an uncached run started; least for cached ones.
    resident_before: f64,
    /// The best block size for this cache state.
    best_block: bool,
}

fn median(values: &[f64]) -> f64 {
    Throughput::from_runs(values).map_or(f64::NAN, |t| t.median)
}

fn summarize(method: Method, cache: Cache, samples: &[RunSample]) -> Option<Summary> {
    let mb_s = Throughput::from_runs(&samples.iter().map(RunSample::mb_s).collect::<Vec<_>>())?;
    let per_gb = |f: &dyn Fn(&RunSample) -> Duration| {
        median(&samples.iter().map(|s| f(s).as_secs_f64() / (s.bytes as f64 / 1e9)).collect::<Vec<_>>())
    };
    let resident = samples.iter().map(|s| s.resident_before).filter(|r| r.is_finite());
    Some(Summary {
        method,
        cache,
        mb_s,
        cpu_s_per_gb: per_gb(&|s| s.cpu()),
        user_s_per_gb: per_gb(&|s| s.user),
        sys_s_per_gb: per_gb(&|s| s.sys),
        cpu_pct: median(
            &samples.iter().map(|s| 100.0 * s.cpu().as_secs_f64() / s.wall.as_secs_f64()).collect::<Vec<_>>(),
        ),
        minor_faults: median(&samples.iter().map(|s| s.minor_faults as f64).collect::<Vec<_>>()).round() as u64,
        major_faults: median(&samples.iter().map(|s| s.major_faults as f64).collect::<Vec<_>>()).round() as u64,
        resident_before: match cache {
            Cache::Cached => resident.fold(f64::NAN, f64::min),
            Cache::Uncached => resident.fold(f64::NAN, f64::max),
        },
        best_block: false,
    })
}

/// The block size with the highest median throughput (the smaller one on a tie).
fn best_block_size(curve: &[(usize, f64)]) -> Option<usize> {
    curve
        .iter()
        .filter(|(_, rate)| rate.is_finite())
        .fold(None, |best: Option<(usize, f64)>, &(size, rate)| match best {
            Some((b, r)) if r > rate || (r == rate && b < size) => Some((b, r)),
            _ => Some((size, rate)),
        })
        .map(|(size, _)| size)
}

/// Marks the best block size of each cache state.
fn mark_best_blocks(summaries: &mut [Summary]) {
    for cache in [Cache::Cached, Cache::Uncached] {
        let curve: Vec<(usize, f64)> = summaries
            .iter()
            .filter_map(|s| match s.method {
                Method::Block(size) if s.cache == cache => Some((size, s.mb_s.median)),
                _ => None,
            })
            .collect();
        if let Some(best) = best_block_size(&curve) {
            for s in summaries.iter_mut().filter(|s| s.cache == cache) {
                s.best_block = s.method == Method::Block(best);
            }
        }
    }
}

fn find(summaries: &[Summary], cache: Cache, pick: impl Fn(&Summary) -> bool) -> Option<&Summary> {
    summaries.iter().find(|s| s.cache == cache && pick(s))
}

/// The fastest uncached method other than the peer.
fn fastest_uncached(summaries: &[Summary]) -> Option<&Summary> {
    summaries
        .iter()
        .filter(|s| s.cache == Cache::Uncached && s.method != Method::Stdio)
        .max_by(|a, b| a.mb_s.median.total_cmp(&b.mb_s.median))
}

fn row(s: &Summary) -> Value {
    json!({
        "case": format!("{} {}", s.method.label(), s.cache.name()),
        "method": s.method.name(),
        "cache": s.cache.name(),
        "request_bytes": s.method.request_bytes(),
        "mb_s_median": s.mb_s.median,
        "mb_s_min": s.mb_s.min,
        "mb_s_max": s.mb_s.max,
        "runs": s.mb_s.runs,
        "cpu_s_per_gb": s.cpu_s_per_gb,
        "user_s_per_gb": s.user_s_per_gb,
        "sys_s_per_gb": s.sys_s_per_gb,
        "cpu_pct": s.cpu_pct,
        "minor_faults": s.minor_faults,
        "major_faults": s.major_faults,
        "resident_before": finite(s.resident_before),
        "best_block": if s.best_block { Some("yes") } else { None },
    })
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// The paper's Table 2, SCSI column (and IDE for context): method, quantity, text,
/// SCSI KB/s.
const PAPER_TABLE: &[(&str, &str, &str, f64)] = &[
    ("stdio", "stdio read (SCSI)", "840 KB/s (1 KB), CPU 102% (IDE 450 KB/s)", 840.0),
    ("block", "block read, best size (SCSI)", "940 KB/s (8 KB), CPU 112% (IDE 440 KB/s)", 940.0),
    ("mapped", "memory-mapped read (SCSI)", "660 KB/s (1 MB), CPU 54% (IDE 420 KB/s)", 660.0),
    ("mapio", "mapio read (SCSI)", "660 KB/s (20 KB), CPU 68% (IDE 430 KB/s)", 660.0),
];

fn paper_figures(summaries: &[Summary]) -> Vec<PaperFigure> {
    PAPER_TABLE
        .iter()
        .map(|&(name, quantity, paper, kb_s)| {
            let figure = PaperFigure::new(quantity, paper, Some(kb_s / 1000.0), "MB/s", Better::Higher);
            let pick = |s: &Summary| s.method.name() == name && (name != "block" || s.best_block);
            let uncached = find(summaries, Cache::Uncached, pick);
            let cached = find(summaries, Cache::Cached, pick);
            match uncached {
                Some(u) => {
                    let cached_text = cached.map_or(String::new(), |c| {
                        format!("; cached {:.0} MB/s ({})", c.mb_s.median, c.method.label())
                    });
                    figure.ours(
                        Some(u.mb_s.median),
                        format!(
                            "uncached {:.0} MB/s ({}), CPU {:.0}%{cached_text}",
                            u.mb_s.median,
                            u.method.label(),
                            u.cpu_pct
                        ),
                    )
                }
                None => figure.ours(None, format!("{name} not measured")),
            }
        })
        .collect()
}

fn headline(summaries: &[Summary], notes: &mut Vec<String>) -> Option<Headline> {
    let peer = find(summaries, Cache::Uncached, |s| s.method == Method::Stdio);
    let ours = fastest_uncached(summaries);
    match (ours, peer) {
        (Some(ours), Some(peer)) => {
            notes.push(format!(
                "{HEADLINE}: ours is the fastest uncached method, {} ({:.0} MB/s); peer is {} uncached",
                ours.method.label(),
                ours.mb_s.median,
                peer.method.label()
            ));
            Some(Headline::new(HEADLINE, ours.mb_s.median, peer.mb_s.median, PEER_NAME, "MB/s", Better::Higher))
        }
        _ => {
            notes.push(format!("headline {HEADLINE} omitted: needs stdio and another method measured uncached"));
            None
        }
    }
}

/// Builds the report's rows, headline and paper figures from the summaries.
fn fill_report(report: &mut Report, summaries: &[Summary], checksum_rate: Option<Throughput>) {
    report.rows.extend(summaries.iter().map(row));
    if let Some(t) = checksum_rate {
        report.rows.push(json!({
            "case": "checksum only, in memory",
            "mb_s_median": t.median,
            "mb_s_min": t.min,
            "mb_s_max": t.max,
            "runs": t.runs,
        }));
    }
    let mut notes = Vec::new();
    report.headline.extend(headline(summaries, &mut notes));
    report.paper_figures = paper_figures(summaries);
    report.notes.extend(notes);
}

/// Bars per method: (method, cached, uncached), in the order of the rows. Block reads
/// show their best size only.
fn bars(report: &Report) -> Vec<BarGroup> {
    let mut groups: Vec<BarGroup> = Vec::new();
    for r in &report.rows {
        let (Some(method), Some(cache), Some(median)) = (
            r.get("method").and_then(Value::as_str),
            r.get("cache").and_then(Value::as_str),
            r.get("mb_s_median").and_then(Value::as_f64),
        ) else {
            continue;
        };
        if method == "block" && r.get("best_block").and_then(Value::as_str).is_none() {
            continue;
        }
        let value = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(median);
        let size = r.get("request_bytes").and_then(Value::as_u64);
        let label = match (method, size) {
            ("block", Some(size)) => format!("{median:.0} ({})", format_size(size as usize)),
            _ => format!("{median:.0}"),
        };
        let bar = Bar { median, min: value("mb_s_min"), max: value("mb_s_max"), label };
        let name = if method == "block" { "block (best size)" } else { method };
        let index = match groups.iter().position(|g| g.name == name) {
            Some(i) => i,
            None => {
                groups.push(BarGroup { name: name.to_string(), bars: vec![None, None] });
                groups.len() - 1
            }
        };
        groups[index].bars[usize::from(cache != "cached")] = Some(bar);
    }
    groups
}

/// The bar chart of median throughput per method, cached beside uncached, with the
/// runs' min-max as whiskers, from a report's rows.
pub fn plot_svg(report: &Report) -> String {
    BarChart {
        title: format!(
            "fileread: read throughput per method (median, min-max){}",
            if report.quick { " [quick]" } else { "" }
        ),
        y_label: "MB/s".to_string(),
        series: vec![Cache::Cached.name().to_string(), Cache::Uncached.name().to_string()],
        groups: bars(report),
    }
    .render()
}

// ---------------------------------------------------------------------------------------
// The experiment.

/// Sizes and counts of one run of the experiment.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    file_bytes: u64,
    rounds: usize,
    block_sizes: &'static [usize],
}

impl Plan {
    fn new(opts: &FilereadOptions) -> Self {
        let file_bytes = opts.file_bytes.unwrap_or(if opts.quick { QUICK_FILE } else { FULL_FILE }).max(1);
        Plan {
            file_bytes: file_bytes.div_ceil(MIB) * MIB,
            rounds: opts.rounds.unwrap_or(if opts.quick { 3 } else { 7 }).max(1),
            block_sizes: if opts.quick { BLOCK_SIZES_QUICK } else { BLOCK_SIZES },
        }
    }

    fn methods(&self) -> Vec<Method> {
        let mut methods = vec![Method::Stdio];
        methods.extend(self.block_sizes.iter().map(|&s| Method::Block(s)));
        methods.extend([
            Method::Mapped,
            Method::Mapio,
            Method::Direct,
            Method::Uring { direct: false },
            Method::Uring { direct: true },
        ]);
        methods
    }
}

/// Per (method, cache state): samples, or why the method stopped.
struct Track {
    method: Method,
    cached: Vec<RunSample>,
    uncached: Vec<RunSample>,
    failed: Option<String>,
}

/// The in-memory rate of the checksum alone, the ceiling of every cached read.
fn checksum_rate(quick: bool, rounds: usize) -> Option<Throughput> {
    let mut buf = vec![0u8; if quick { 64 << 20 } else { 256 << 20 }];
    fill_pattern(&mut buf, 0, 1);
    let runs: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let mut sum = Checksum::default();
            sum.add_at(0, &buf);
            std::hint::black_box(sum);
            buf.len() as f64 / start.elapsed().as_secs_f64().max(1e-9) / 1e6
        })
        .collect();
    Throughput::from_runs(&runs)
}

/// Runs the experiment, and returns the report and its bar chart. Fails if any read
/// returns other bytes than were written.
pub fn run_with(opts: &FilereadOptions) -> Result<Outcome, BenchError> {
    let started = Instant::now();
    let conditions = Conditions::capture_before();
    let plan = Plan::new(opts);
    let mut notes = Notes::new();

    // Set-up: the test file where there is room for it, a way to drop its pages, and
    // the methods that can run on its filesystem.
    let (base, why) = choose_base(opts.dir.as_deref());
    let file_bytes = fitting_file_bytes(&base, plan.file_bytes, &mut notes)?;
    let file = TestFile::create(&base, file_bytes)
        .map_err(|e| BenchError::io(format!("writing the test file in {}", base.display()), e))?;
    let dropper = file.find_dropper(&mut notes);
    let fs_text = describe_test_file(&file, &why, &mut notes);
    let mut tracks = runnable_methods(&plan, &file, &fs_text, &mut notes);

    // The measured windows: rounds of every method, cached and uncached.
    let not_cached = measure_rounds(opts, &plan, &file, dropper, &mut tracks)?;
    let checksums = checksum_rate(opts.quick, plan.rounds.max(3));
    let file_size = file.size;
    drop(file);

    // Summaries, rows, the headline and the paper's figures.
    let mut summaries: Vec<Summary> = Vec::new();
    for track in &tracks {
        if let Some(why) = &track.failed {
            notes.not_measured(track.method.label(), format!("stopped: {why}"));
        }
        summaries.extend(summarize(track.method, Cache::Cached, &track.cached));
        summaries.extend(summarize(track.method, Cache::Uncached, &track.uncached));
    }
    mark_best_blocks(&mut summaries);
    let mut report = Report::new(EXPERIMENT, PAPER, opts.quick, conditions.finish());
    report.hidden_in_table = ["method", "cache", "request_bytes", "user_s_per_gb", "sys_s_per_gb", "minor_faults"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    fill_report(&mut report, &summaries, checksums);
    add_notes(&mut notes, &plan, &summaries, not_cached, file_size);
    notes.push(format!("measured in {:.1} s", started.elapsed().as_secs_f64()));
    report.add_notes(notes);
    let svg = plot_svg(&report);
    Ok(Outcome::new(report, svg))
}

/// The test file's size: `wanted`, or less if `base` is short of room (at most half of
/// what is free beyond the reserve, noted); an error if not even 1 MiB fits.
fn fitting_file_bytes(base: &std::path::Path, wanted: u64, notes: &mut Notes) -> Result<u64, BenchError> {
    std::fs::create_dir_all(base).map_err(|e| BenchError::io(format!("creating {}", base.display()), e))?;
    let mut file_bytes = wanted;
    if let Some(free) = free_bytes(base) {
        // The file takes at most half of what is free beyond the reserve.
        let fits = disk_share(free, 2, file_bytes).ok_or_else(|| {
            BenchError::io(
                format!("{}: not enough free space for the test file", base.display()),
                io::Error::other(format!(
                    "{} MiB free; the smallest test file needs 1 MiB, with {} MiB left for the rest of the machine",
                    free / MIB,
                    DISK_RESERVE / MIB
                )),
            )
        })?;
        if fits < file_bytes {
            notes.push(format!(
                "only {} MiB free in {}: the file is {} MiB instead of {} MiB",
                free / MIB,
                base.display(),
                fits / MIB,
                file_bytes / MIB
            ));
            file_bytes = fits;
        }
    }
    Ok(file_bytes)
}

/// Notes where the test file is; returns its filesystem in words.
fn describe_test_file(file: &TestFile, why: &str, notes: &mut Notes) -> String {
    let fs_text = match &file.mount {
        Some(m) => {
            let ra = read_ahead_kb(&m.source).map_or(String::new(), |kb| format!(", device readahead {kb} KiB"));
            format!("{} on {} mounted at {}{ra}", m.fstype, m.source, m.point)
        }
        None => "an unknown filesystem".to_string(),
    };
    notes.push(format!(
        "test file: {} MiB in {} ({why}), {fs_text}; written with a known pattern, fsynced, removed at the end",
        file.size / MIB,
        file.dir.display()
    ));
    if memory_backed(&file.dir) {
        notes.push(
            "WARNING: the test file is on a memory-backed filesystem (tmpfs/ramfs): uncached reads are \
             cached; set ICTUS_BENCH_DIR to a directory on a disk"
                .to_string(),
        );
    }

    fs_text
}

/// A track for every method of the plan that can run here; the others are noted.
fn runnable_methods(plan: &Plan, file: &TestFile, fs_text: &str, notes: &mut Notes) -> Vec<Track> {
    let direct = probe_direct(file);
    let uring = probe_uring();
    if uring == Ok(false) {
        notes.push("io_uring could not register buffers here: its reads use plain (unregistered) buffers".to_string());
    }
    let mut tracks: Vec<Track> = Vec::new();
    for method in plan.methods() {
        let refused = match (&direct, &uring) {
            (Err(why), _) if method.needs_direct() => Some(format!("O_DIRECT on {fs_text}: {why}")),
            (_, Err(why)) if method.needs_uring() => Some(why.clone()),
            _ => None,
        };
        match refused {
            Some(why) => notes.not_measured(method.label(), format!("could not run here: {why}")),
            None => tracks.push(Track { method, cached: Vec::new(), uncached: Vec::new(), failed: None }),
        }
    }

    tracks
}

/// Round 0 is a warm-up whose times are dropped: it checks every method once and lets
/// first-time costs (fresh page-cache memory, io_uring's workers) fall outside. Then
/// `plan.rounds` rounds, each a cached and an uncached phase (their order alternating),
/// each phase every method once in an order that rotates. Returns the largest fraction
/// of the file that was not resident when a cached run started.
fn measure_rounds(
    opts: &FilereadOptions,
    plan: &Plan,
    file: &TestFile,
    dropper: Dropper,
    tracks: &mut [Track],
) -> Result<f64, BenchError> {
    let mut not_cached = 0.0f64;
    // Round 0 is a warm-up whose times are dropped: it checks every method once and
    // lets first-time costs (fresh page-cache memory, io_uring's workers) fall outside.
    for round in 0..=plan.rounds {
        let warm_up = round == 0;
        let phases = if round % 2 == 1 { [Cache::Cached, Cache::Uncached] } else { [Cache::Uncached, Cache::Cached] };
        for cache in phases {
            if opts.progress {
                match warm_up {
                    true => eprintln!("fileread: warm-up {}", cache.name()),
                    false => eprintln!("fileread: round {}/{} {}", round, plan.rounds, cache.name()),
                }
            }
            if cache == Cache::Cached {
                file.warm().map_err(|e| BenchError::io("reading the test file into the cache", e))?;
            }
            for i in rotation(round, tracks.len()) {
                let track = &mut tracks[i];
                if track.failed.is_some() {
                    continue;
                }
                let resident = match cache {
                    Cache::Cached => file.resident(),
                    Cache::Uncached => {
                        // Read it in first, so that every uncached run allocates the
                        // pages its drop has just freed, whatever ran before (see
                        // `free_page_reporting`).
                        file.warm().map_err(|e| BenchError::io("reading the test file into the cache", e))?;
                        file.drop_pages(dropper)
                    }
                };
                if cache == Cache::Cached && !warm_up {
                    not_cached = not_cached.max(1.0 - resident);
                }
                let case = format!("{} {}", track.method.label(), cache.name());
                match timed(track.method, file, resident) {
                    Ok((sample, sum)) => {
                        check_checksum(&case, file.checksum, sum)?;
                        match cache {
                            _ if warm_up => {}
                            Cache::Cached => track.cached.push(sample),
                            Cache::Uncached => track.uncached.push(sample),
                        }
                    }
                    Err(e) => track.failed = Some(format!("{case}: {e}")),
                }
            }
        }
    }
    Ok(not_cached)
}

/// Noise, cache misses and how the numbers were made.
fn add_notes(notes: &mut Notes, plan: &Plan, summaries: &[Summary], not_cached: f64, file_size: u64) {
    let erratic: Vec<String> = summaries
        .iter()
        .filter(|s| s.mb_s.max > 1.5 * s.mb_s.min)
        .map(|s| format!("{} {}", s.method.label(), s.cache.name()))
        .collect();
    if !erratic.is_empty() {
        notes.push(format!(
            "runs varied more than 1.5x (min-max) in {}: the machine was noisy (compare medians; rerun to check)",
            erratic.join(", ")
        ));
    }
    if not_cached > 0.05 {
        notes.push(format!(
            "WARNING: up to {:.0}% of the file was not resident when a cached run started (memory pressure)",
            not_cached * 100.0
        ));
    }
    notes.push(format!(
        "{} rounds after an untimed warm-up round; each reads the whole {} MiB file once per method and \
         cache state, methods rotated, cached and uncached phases alternating; MB/s = 10^6 bytes/s, median \
         (min-max) of the rounds",
        plan.rounds,
        file_size / MIB
    ));
    notes.push(format!(
        "methods: stdio = fread-like {} requests into a page-aligned buffer through an {} BufReader; \
         block = read(2) at each size, best marked (the paper kept its best size too); mapped = mmap of \
         the whole file, every byte touched (page faults); mapio = {} fread-like copies out of a \
         whole-file mapping into a page-aligned buffer (the copy's speed depends several-fold on where \
         the buffer falls in a page relative to the source); O_DIRECT = {} aligned read(2)s; io_uring = \
         {URING_DEPTH} reads of {} in flight (registered buffers), through the page cache or with O_DIRECT",
        format_size(STDIO_REQUEST),
        format_size(STDIO_BUFFER),
        format_size(STDIO_REQUEST),
        format_size(DIRECT_REQUEST),
        format_size(URING_REQUEST)
    ));
    notes.push(
        "every run checksums every byte it reads (the `checksum only` row is that work alone, the ceiling of \
         cached reads); all checksums matched the file written"
            .to_string(),
    );
    notes.push(
        "CPU: getrusage(RUSAGE_SELF) user+sys per run (io_uring's kernel workers included, device interrupts \
         not); cpu_pct = CPU / wall, as the paper's CPU %; O_DIRECT bypasses the page cache, so its cached and \
         uncached rows both read the device"
            .to_string(),
    );
    notes.push(format!(
        "each uncached run reads the file in (untimed) and drops it just before, so that it allocates \
         the pages just freed whatever ran before it{}",
        if free_page_reporting() {
            "; this VM reports free memory to its host (virtio-balloon free page reporting), and memory \
             left free for a few seconds costs a host fault per page when next used, which shows as \
             slow uncached runs with high system CPU"
        } else {
            ""
        }
    ));
    notes.push(
        "the paper read a 30 MB file on a 16 MB machine (33 MHz i486, SCSI and IDE disks, Mach 3.0); here the \
         file fits in memory, so uncached means its pages were dropped first; on a virtual machine the host may \
         still cache the disk image, so uncached may not reach the physical disk"
            .to_string(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_bench::conditions::{disk_share, DISK_RESERVE};

    #[test]
    fn the_test_file_shrinks_to_fit_a_nearly_full_disk() {
        // Plenty of room: the file asked for.
        assert_eq!(disk_share(100 << 30, 2, FULL_FILE), Some(FULL_FILE));
        // 127 MiB free (seen on a CI machine): half of what is beyond the reserve.
        assert_eq!(disk_share(127 * MIB, 2, 8 * MIB), Some(8 * MIB));
        assert_eq!(disk_share(127 * MIB, 2, FULL_FILE), Some(31 * MIB));
        // Whole MiB, never below the smallest file, never into the reserve.
        assert_eq!(disk_share(DISK_RESERVE + 3 * MIB + 5, 2, FULL_FILE), Some(MIB));
        assert_eq!(disk_share(DISK_RESERVE + MIB, 2, FULL_FILE), None);
        assert_eq!(disk_share(0, 2, MIB), None);
    }

    #[test]
    fn the_best_block_size_is_the_fastest_median() {
        assert_eq!(best_block_size(&[(4096, 100.0), (65536, 300.0), (1 << 20, 200.0)]), Some(65536));
        assert_eq!(best_block_size(&[(65536, 300.0), (4096, 300.0)]), Some(4096), "a tie goes to the smaller");
        assert_eq!(best_block_size(&[(4096, f64::NAN), (8192, 1.0)]), Some(8192));
        assert_eq!(best_block_size(&[]), None);
    }

    fn fake(method: Method, cache: Cache, mb_s: f64) -> Summary {
        Summary {
            method,
            cache,
            mb_s: Throughput::from_runs(&[mb_s * 0.9, mb_s, mb_s * 1.1]).expect("runs"),
            cpu_s_per_gb: 0.1,
            user_s_per_gb: 0.04,
            sys_s_per_gb: 0.06,
            cpu_pct: 40.0,
            minor_faults: 0,
            major_faults: 0,
            resident_before: if cache == Cache::Cached { 1.0 } else { 0.0 },
            best_block: false,
        }
    }

    fn fake_summaries() -> Vec<Summary> {
        let mut s = Vec::new();
        for (method, cached, uncached) in [
            (Method::Stdio, 8000.0, 2600.0),
            (Method::Block(4096), 6000.0, 2500.0),
            (Method::Block(1 << 20), 17000.0, 3500.0),
            (Method::Block(256 << 10), 18000.0, 3400.0),
            (Method::Mapped, 23000.0, 3300.0),
            (Method::Mapio, 5400.0, 2800.0),
            (Method::Direct, 1000.0, 1100.0),
            (Method::Uring { direct: true }, 1500.0, 3900.0),
        ] {
            s.push(fake(method, Cache::Cached, cached));
            s.push(fake(method, Cache::Uncached, uncached));
        }
        mark_best_blocks(&mut s);
        s
    }

    #[test]
    fn each_cache_state_has_its_own_best_block() {
        let s = fake_summaries();
        let best: Vec<(Cache, Method)> = s.iter().filter(|s| s.best_block).map(|s| (s.cache, s.method)).collect();
        assert_eq!(best, [(Cache::Uncached, Method::Block(1 << 20)), (Cache::Cached, Method::Block(256 << 10))]);
    }

    #[test]
    fn the_headline_is_the_fastest_uncached_method_against_stdio() {
        let mut report = Report::new(EXPERIMENT, PAPER, true, Conditions::capture_before());
        fill_report(&mut report, &fake_summaries(), Throughput::from_runs(&[30000.0]));
        assert_eq!(report.headline.len(), 1);
        let h = &report.headline[0];
        assert_eq!((h.name.as_str(), h.peer_name.as_str(), h.unit.as_str()), (HEADLINE, PEER_NAME, "MB/s"));
        assert_eq!((h.ours, h.peer, h.better), (3900.0, 2600.0, Better::Higher));
        assert!(h.target.is_none());
        assert!(report.notes[0].contains("io_uring O_DIRECT 8x1 MiB"), "{:?}", report.notes);

        let quantities: Vec<&str> = report.paper_figures.iter().map(|f| f.quantity.as_str()).collect();
        assert_eq!(
            quantities,
            ["stdio read (SCSI)", "block read, best size (SCSI)", "memory-mapped read (SCSI)", "mapio read (SCSI)"]
        );
        let block = &report.paper_figures[1];
        assert_eq!((block.paper_value, block.ours_value), (Some(0.94), Some(3500.0)));
        assert!(block.ours.contains("block 1 MiB") && block.ours.contains("cached 18000 MB/s (block 256 KiB)"));

        // 16 method rows and the checksum row, each with a case.
        assert_eq!(report.rows.len(), 17);
        let stdio = &report.rows[1];
        assert_eq!(stdio["case"], "stdio 1 KiB uncached");
        assert_eq!((stdio["method"].as_str(), stdio["cache"].as_str()), (Some("stdio"), Some("uncached")));
        assert_eq!(stdio["request_bytes"], STDIO_REQUEST);
        assert_eq!(report.rows[5]["best_block"], "yes");
        assert!(report.rows[2]["best_block"].is_null());
        assert_eq!(report.rows[8]["request_bytes"], Value::Null, "a mapping requests nothing");
    }

    #[test]
    fn without_stdio_there_is_no_headline() {
        let summaries: Vec<Summary> =
            fake_summaries().into_iter().filter(|s| s.method != Method::Stdio || s.cache == Cache::Cached).collect();
        let mut report = Report::new(EXPERIMENT, PAPER, true, Conditions::capture_before());
        fill_report(&mut report, &summaries, None);
        assert!(report.headline.is_empty());
        assert!(report.notes.iter().any(|n| n.contains("omitted")));
        assert_eq!(report.paper_figures[0].ours, "stdio not measured");
    }

    fn balanced(xml: &str) -> Result<(), String> {
        ictus_bench::plot::check_well_formed(xml)
    }

    #[test]
    fn the_bar_chart_is_well_formed() {
        let mut report = Report::new(EXPERIMENT, PAPER, true, Conditions::capture_before());
        fill_report(&mut report, &fake_summaries(), Throughput::from_runs(&[30000.0]));
        let svg = plot_svg(&report);
        balanced(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        assert!(svg.starts_with("<?xml") && svg.ends_with("</svg>\n"));
        for text in [">stdio<", ">block<", ">(best size)<", ">mapped<", ">mapio<", ">O_DIRECT<", ">io_uring<"] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(svg.contains(">3500 (1 MiB)<") && svg.contains(">18000 (256 KiB)<"), "best block bars");
        assert!(!svg.contains(">6000 (4 KiB)<"), "only the best block size is drawn");
        assert!(!svg.contains("checksum"), "the checksum row is no method");
        // Two bars for each of the 6 methods (block once, at its best), each with a title.
        assert_eq!(svg.matches("<title>").count(), 12);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));

        report.rows.clear();
        balanced(&plot_svg(&report)).expect("an empty chart is well-formed");
    }

    #[test]
    fn plans_follow_the_mode() {
        let quick = Plan::new(&FilereadOptions { quick: true, ..FilereadOptions::default() });
        assert_eq!((quick.file_bytes, quick.rounds, quick.block_sizes), (QUICK_FILE, 3, BLOCK_SIZES_QUICK));
        let full = Plan::new(&FilereadOptions::default());
        assert_eq!((full.file_bytes, full.rounds, full.block_sizes.len()), (FULL_FILE, 7, 11));
        let small = Plan::new(&FilereadOptions { file_bytes: Some(3), rounds: Some(0), ..FilereadOptions::default() });
        assert_eq!((small.file_bytes, small.rounds), (MIB, 1));
        let methods = full.methods();
        assert_eq!(methods.len(), 1 + BLOCK_SIZES.len() + 5);
        assert_eq!(methods[0], Method::Stdio);
        assert!(BLOCK_SIZES.windows(2).all(|w| w[0] < w[1]));
        assert!(BLOCK_SIZES_QUICK.iter().all(|s| BLOCK_SIZES.contains(s)));
        let labels: Vec<String> = methods.iter().map(|m| m.label()).collect();
        assert!(labels.contains(&"io_uring O_DIRECT 8x1 MiB".to_string()), "{labels:?}");
        assert!(labels.contains(&"mapped".to_string()) && labels.contains(&"block 4 KiB".to_string()));
    }
}
