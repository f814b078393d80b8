//! The timing monitor (000 §5, Figure 1): timestamp what arrives, and plot the
//! interarrival times the way the paper's RS/6000 monitor did — one row per
//! millisecond, each message on the next column, wrapping from the right edge back to
//! the left so the picture is the superposition of several passes, and the worst case
//! written at the lower right.
//!
//! The pure parts — [`Figure1`] (binning and the terminal layout), [`Summary`] and
//! [`figure1_svg`] — take the intervals as data, so tests need no device and no clock.
//! [`run`] is the shell: it reads a device (or the input server), stamps arrivals with
//! `CLOCK_MONOTONIC`, redraws the terminal at most ten times a second, and stops on a
//! count, a duration, or Ctrl-C.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_midi::device::DeviceSpec;
use ictus_midi::{Kind, Message, Parser};
use ictus_rt::{clock, Time};

const NS_PER_MS: u64 = 1_000_000;

/// Interarrival times binned for the terminal: `rows` rows of one millisecond each
/// (row `r` holds intervals in `[r, r+1)` ms), `columns` columns filled left to right
/// and wrapping. Intervals of `rows` ms or more are *off scale*: marked on the top row
/// and counted, and the worst case is kept whatever the scale.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Figure1 {
    rows: usize,
    columns: usize,
    cells: Vec<u32>,
    next: usize,
    count: u64,
    off_scale: u64,
    worst_ns: u64,
    worst_index: u64,
}

impl Figure1 {
    /// An empty plot (at least one row and one column).
    pub fn new(rows: usize, columns: usize) -> Figure1 {
        let (rows, columns) = (rows.max(1), columns.max(1));
        Figure1 {
            rows,
            columns,
            cells: vec![0; rows * columns],
            next: 0,
            count: 0,
            off_scale: 0,
            worst_ns: 0,
            worst_index: 0,
        }
    }

    /// The row an interval falls in, `None` if off scale.
    pub fn row_of(&self, interval_ns: u64) -> Option<usize> {
        let r = (interval_ns / NS_PER_MS) as usize;
        (r < self.rows).then_some(r)
    }

    /// Add the next interval, in the next column.
    pub fn add(&mut self, interval_ns: u64) {
        let col = self.next;
        match self.row_of(interval_ns) {
            Some(r) => self.cells[r * self.columns + col] = self.cells[r * self.columns + col].saturating_add(1),
            None => self.off_scale += 1,
        }
        if interval_ns > self.worst_ns || self.count == 0 {
            self.worst_ns = interval_ns;
            self.worst_index = self.count;
        }
        self.count += 1;
        self.next = (col + 1) % self.columns;
    }

    /// How many intervals were added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The worst (longest) interval and its index, if any.
    pub fn worst(&self) -> Option<(u64, u64)> {
        (self.count > 0).then_some((self.worst_ns, self.worst_index))
    }

    /// Intervals at or above the top row.
    pub fn off_scale(&self) -> u64 {
        self.off_scale
    }

    /// How many intervals fell in row `row`, column `col`.
    pub fn cell(&self, row: usize, col: usize) -> u32 {
        if row < self.rows && col < self.columns {
            self.cells[row * self.columns + col]
        } else {
            0
        }
    }

    /// The terminal picture: one line per millisecond, the longest at the top, each
    /// labelled on the left; then an axis line with the next column marked `^`, and a
    /// footer with the count and the worst case (at the right, as in the paper). Every
    /// line is `label + columns` characters wide (the footer may be shorter).
    pub fn render(&self) -> Vec<String> {
        let mut lines = Vec::with_capacity(self.rows + 2);
        for r in (0..self.rows).rev() {
            let mut line = format!("{r:>4} ms |");
            for c in 0..self.columns {
                let n = self.cell(r, c);
                line.push(match n {
                    0 if r.is_multiple_of(5) => '-',
                    0 => ' ',
                    1 => '.',
                    2..=3 => ':',
                    4..=9 => '*',
                    _ => '#',
                });
            }
            lines.push(line);
        }
        let mut axis = String::from("        +");
        for c in 0..self.columns {
            axis.push(if c == self.next && self.count > 0 { '^' } else { '-' });
        }
        lines.push(axis);
        let worst = match self.worst() {
            Some((ns, i)) => format!("worst case {:.2} ms (message {})", ns as f64 / 1e6, i + 1),
            None => "no intervals yet".to_string(),
        };
        let left = format!("n = {}   off scale (>= {} ms): {}", self.count, self.rows, self.off_scale);
        let width = 9 + self.columns;
        let pad = width.saturating_sub(left.chars().count() + worst.chars().count()).max(3);
        lines.push(format!("{left}{}{worst}", " ".repeat(pad)));
        lines
    }
}

/// Percentiles of a set of intervals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// How many.
    pub count: usize,
    /// The shortest.
    pub min_ns: u64,
    /// The median.
    pub p50_ns: u64,
    /// The 99th percentile.
    pub p99_ns: u64,
    /// The longest.
    pub max_ns: u64,
}

impl Summary {
    /// The summary of `intervals` (nearest-rank percentiles), `None` if empty.
    pub fn of(intervals: &[u64]) -> Option<Summary> {
        if intervals.is_empty() {
            return None;
        }
        let mut v = intervals.to_vec();
        v.sort_unstable();
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Summary { count: v.len(), min_ns: v[0], p50_ns: rank(0.5), p99_ns: rank(0.99), max_ns: v[v.len() - 1] })
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The paper's Figure 1 as an SVG document: interval `i` at column `i mod columns`,
/// height its length in ms on a 0…`rows_ms` scale with a line per millisecond (every
/// tenth darker), off-scale intervals as triangles on the top edge, and the worst case
/// at the lower right.
pub fn figure1_svg(intervals: &[u64], columns: usize, rows_ms: usize, title: &str) -> String {
    let columns = columns.max(1);
    let rows_ms = rows_ms.max(1);
    let (w, h) = (900.0_f64, 560.0_f64);
    let (left, right, top, bottom) = (60.0, 20.0, 40.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let x = |col: usize| left + (col as f64 + 0.5) / columns as f64 * pw;
    let y = |ms: f64| top + ph - ms.min(rows_ms as f64) / rows_ms as f64 * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" \
         height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text x=\"{:.1}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        left + pw / 2.0,
        escape(title)
    );
    for ms in 0..=rows_ms {
        let yy = y(ms as f64);
        let color = if ms.is_multiple_of(10) { "#999999" } else { "#e4e4e4" };
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"{color}\"/>",
            left + pw
        );
        if ms.is_multiple_of(5) {
            let _ =
                writeln!(s, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{ms} ms</text>", left - 6.0, yy + 4.0);
        }
    }
    let _ = writeln!(
        s,
        "<rect x=\"{left}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"black\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">message number mod {columns} (wrapping left to right)</text>\n\
         <text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">interarrival time</text>",
        left + pw / 2.0,
        h - 30.0,
        top + ph / 2.0,
        top + ph / 2.0
    );
    for (i, &ns) in intervals.iter().enumerate() {
        let ms = ns as f64 / 1e6;
        let xx = x(i % columns);
        if ms >= rows_ms as f64 {
            let _ = writeln!(s, "<path d=\"M{:.1},{:.1} l-3,6 h6 z\" fill=\"#d62728\"/>", xx, top + 1.0);
        } else {
            let _ = writeln!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"1.6\" height=\"1.6\" fill=\"#1f4e99\"/>",
                xx - 0.8,
                y(ms) - 0.8
            );
        }
    }
    let worst = match intervals.iter().max() {
        Some(&m) => format!("Worst case: {:.1} ms  (n = {})", m as f64 / 1e6, intervals.len()),
        None => "no intervals".to_string(),
    };
    let _ =
        writeln!(s, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", left + pw, h - 10.0, escape(&worst));
    s.push_str("</svg>\n");
    s
}

/// Where the monitor listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A device, opened for input (the monitor holds it alone).
    Device(DeviceSpec),
    /// The input server, through the library input (`get`), its timestamps the
    /// server's.
    Server {
        /// The name server's socket (default: its default path).
        name_server: Option<PathBuf>,
        /// The name the server is registered under.
        name: String,
    },
}

/// What [`run`] does.
#[derive(Clone, Debug)]
pub struct MonitorOptions {
    /// Where to listen.
    pub source: Source,
    /// Stop after this many intervals.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Rows of the plot (one millisecond each).
    pub rows: usize,
    /// Columns of the plot (default: the terminal's width, else 100).
    pub columns: Option<usize>,
    /// Only these kinds (empty: every kind but active sensing).
    pub kinds: Vec<Kind>,
    /// Write the plot here.
    pub svg: Option<PathBuf>,
    /// Write the intervals and their summary here.
    pub json: Option<PathBuf>,
    /// Draw live (default: when standard output is a terminal).
    pub live: bool,
}

/// Why the monitor failed.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The device could not be opened.
    #[error(transparent)]
    Open(#[from] ictus_midi::device::OpenError),
    /// The input server could not be reached.
    #[error(transparent)]
    Input(#[from] crate::client::OpenError),
    /// Reading failed.
    #[error("reading MIDI: {0}")]
    Read(String),
    /// Writing a file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Setting up Ctrl-C handling failed.
    #[error("setting up signal handling: {0}")]
    Signals(std::io::Error),
}

/// What [`run`] measured.
#[derive(Clone, Debug)]
pub struct MonitorResult {
    /// The interarrival times, in order.
    pub intervals: Vec<u64>,
    /// Messages counted (of the kinds asked for).
    pub messages: u64,
}

fn wanted(kinds: &[Kind], m: &Message) -> bool {
    if kinds.is_empty() {
        m.kind() != Kind::ActiveSensing
    } else {
        kinds.contains(&m.kind())
    }
}

fn terminal_columns() -> usize {
    std::env::var("COLUMNS").ok().and_then(|c| c.parse::<usize>().ok()).filter(|&c| c > 20).unwrap_or(110)
}

/// Run the monitor until a count, a duration, or Ctrl-C (SIGINT or SIGTERM).
pub fn run(opts: &MonitorOptions) -> Result<MonitorResult, MonitorError> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut ids = Vec::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        ids.push(signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(MonitorError::Signals)?);
    }
    let result = run_until(opts, &stop);
    for id in ids {
        signal_hook::low_level::unregister(id);
    }
    result
}

fn run_until(opts: &MonitorOptions, stop: &AtomicBool) -> Result<MonitorResult, MonitorError> {
    let columns = opts.columns.unwrap_or_else(|| terminal_columns().saturating_sub(10).max(10));
    let mut fig = Figure1::new(opts.rows, columns);
    let live = opts.live;
    let started = Instant::now();
    let mut intervals = Vec::new();
    let mut messages = 0u64;
    let mut last: Option<Time> = None;
    let mut last_draw = Instant::now() - Duration::from_secs(1);
    let mut out = std::io::stdout();
    // Arrivals are stamped by a thread at real-time priority when that is allowed.
    ictus_rt::thread::configure_current_thread(&ictus_rt::thread::ThreadRequest {
        policy: Some(ictus_rt::thread::Policy::Fifo { priority: 80 }),
        timer_slack: Some(Duration::from_nanos(1)),
        ..ictus_rt::thread::ThreadRequest::default()
    });
    let mut on_message = |m: &Message, fig: &mut Figure1, intervals: &mut Vec<u64>| {
        if !wanted(&opts.kinds, m) {
            return;
        }
        messages += 1;
        if let Some(prev) = last {
            let d = (m.time() - prev).as_nanos() as u64;
            fig.add(d);
            intervals.push(d);
        }
        last = Some(m.time());
    };
    let done = |n: usize| {
        stop.load(Ordering::SeqCst)
            || opts.count.is_some_and(|c| n as u64 >= c)
            || opts.duration.is_some_and(|d| started.elapsed() >= d)
    };
    let tick = Some(Duration::from_millis(100));
    match &opts.source {
        Source::Device(spec) => {
            let mut dev = spec.open_input()?;
            let mut parser = Parser::new();
            let mut buf = vec![0u8; ictus_midi::device::cable::MAX_DATAGRAM];
            while !done(intervals.len()) {
                match dev.read(&mut buf, tick) {
                    Ok(0) => break,
                    Ok(n) => {
                        let t = clock::now();
                        for &b in &buf[..n] {
                            for m in parser.feed(b, t) {
                                on_message(&m, &mut fig, &mut intervals);
                            }
                        }
                    }
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
                    Err(e) => return Err(MonitorError::Read(e.to_string())),
                }
                if live && last_draw.elapsed() >= Duration::from_millis(100) {
                    draw(&mut out, &fig);
                    last_draw = Instant::now();
                }
            }
        }
        Source::Server { name_server, name } => {
            let space = ictus_ipc::Space::task();
            let input = crate::client::Input::connect_named(&space, name_server.as_deref(), name, true, false)?;
            while !done(intervals.len()) {
                match input.receive(crate::Class::Normal, tick) {
                    Ok(Some(m)) => on_message(&m, &mut fig, &mut intervals),
                    Ok(None) => {}
                    Err(e) => return Err(MonitorError::Read(e.to_string())),
                }
                if live && last_draw.elapsed() >= Duration::from_millis(100) {
                    draw(&mut out, &fig);
                    last_draw = Instant::now();
                }
            }
            // Unsubscribe cleanly (dropping would also do, through the dead names).
            let _ = input.close();
        }
    }
    if live {
        draw(&mut out, &fig);
    }
    if let Some(path) = &opts.svg {
        let title = "MIDI message interarrival times (one line per millisecond)";
        std::fs::write(path, figure1_svg(&intervals, columns, opts.rows, title))
            .map_err(|source| MonitorError::Write { path: path.clone(), source })?;
    }
    if let Some(path) = &opts.json {
        let summary = Summary::of(&intervals);
        let v = serde_json::json!({
            "messages": messages,
            "intervals_ns": intervals,
            "summary": summary.map(|s| serde_json::json!({
                "count": s.count, "min_ns": s.min_ns, "p50_ns": s.p50_ns, "p99_ns": s.p99_ns, "max_ns": s.max_ns,
            })),
        });
        std::fs::write(path, format!("{v}\n")).map_err(|source| MonitorError::Write { path: path.clone(), source })?;
    }
    Ok(MonitorResult { intervals, messages })
}

fn draw(out: &mut std::io::Stdout, fig: &Figure1) {
    let mut text = String::from("\x1b[H\x1b[2J");
    for line in fig.render() {
        text.push_str(&line);
        text.push('\n');
    }
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Whether standard output is a terminal (the default for live drawing).
pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn intervals_bin_one_row_per_millisecond_and_wrap() {
        let mut f = Figure1::new(20, 4);
        for &ms in &[10, 10, 11, 9] {
            f.add(ms * MS + 300_000);
        }
        assert_eq!((f.cell(10, 0), f.cell(10, 1), f.cell(11, 2), f.cell(9, 3)), (1, 1, 1, 1));
        // The fifth wraps to column 0 and superposes.
        f.add(10 * MS);
        assert_eq!(f.cell(10, 0), 2);
        // Exactly 20 ms is off scale for rows 0..20; 19.999 is not.
        f.add(20 * MS);
        f.add(20 * MS - 1);
        assert_eq!(f.off_scale(), 1);
        assert_eq!(f.cell(19, 2), 1);
        assert_eq!(f.worst(), Some((20 * MS, 5)));
        assert_eq!(f.count(), 7);
        assert_eq!(f.row_of(0), Some(0));
    }

    #[test]
    fn the_terminal_layout() {
        let mut f = Figure1::new(12, 10);
        assert!(f.render().last().unwrap().contains("no intervals yet"));
        for _ in 0..12 {
            f.add(10 * MS + 1);
        }
        f.add(63_200_000);
        let lines = f.render();
        assert_eq!(lines.len(), 12 + 2);
        // Row 11 is on top, row 0 just above the axis.
        assert!(lines[0].starts_with("  11 ms |"));
        assert!(lines[11].starts_with("   0 ms |"));
        for l in &lines[..13] {
            assert_eq!(l.chars().count(), 9 + 10, "{l:?}");
        }
        // The 10 ms row: columns 0 and 1 hit twice (wrapped), the rest once.
        assert_eq!(&lines[1][9..], "::........");
        // The next column is 3 (13 intervals into 10 columns).
        assert_eq!(lines[12].chars().nth(9 + 3), Some('^'));
        let footer = &lines[13];
        assert!(footer.starts_with("n = 13"), "{footer}");
        assert!(footer.ends_with("worst case 63.20 ms (message 13)"), "{footer}");
        assert!(footer.contains("off scale (>= 12 ms): 1"));
    }

    #[test]
    fn density_marks() {
        let mut f = Figure1::new(3, 1);
        for n in 0..10 {
            f.add(MS);
            let c = f.render()[1].chars().last().unwrap();
            let expected = match n + 1 {
                1 => '.',
                2..=3 => ':',
                4..=9 => '*',
                _ => '#',
            };
            assert_eq!(c, expected);
        }
    }

    #[test]
    fn summaries() {
        assert_eq!(Summary::of(&[]), None);
        let v: Vec<u64> = (1..=100).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!((s.count, s.min_ns, s.p50_ns, s.p99_ns, s.max_ns), (100, 1, 50, 99, 100));
        assert_eq!(Summary::of(&[7]).unwrap().p99_ns, 7);
    }

    #[test]
    fn the_svg_has_a_point_per_interval_and_the_worst_case() {
        let v = vec![10 * MS, 11 * MS, 65 * MS];
        let svg = figure1_svg(&v, 2, 20, "a <title> & more");
        assert!(svg.starts_with("<?xml"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect x=").count() - 2, 2, "two in-scale points (plus background and frame)");
        assert_eq!(svg.matches("<path").count(), 1, "one off-scale marker");
        assert!(svg.contains("Worst case: 65.0 ms"));
        assert!(svg.contains("a &lt;title&gt; &amp; more"));
        // Only 21 horizontal lines, one per millisecond 0..=20.
        assert_eq!(svg.matches("<line").count(), 21);
    }

    #[test]
    fn kinds_filter() {
        let t = Time::from_nanos(0);
        let sense = Message::realtime(Kind::ActiveSensing, t).unwrap();
        let note = Message::note_on(0, 60, 1, t).unwrap();
        assert!(!wanted(&[], &sense));
        assert!(wanted(&[], &note));
        assert!(wanted(&[Kind::ActiveSensing], &sense));
        assert!(!wanted(&[Kind::NoteOff], &note));
    }
}
