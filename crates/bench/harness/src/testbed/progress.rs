//! The testbed's progress lines on standard error: one per experiment, the running
//! one redrawn every second on a terminal, with the time left for the whole run
//! estimated from the experiments' expected durations, scaled by how the finished
//! ones did against theirs.

use std::io::{self, Write as _};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Outcome, Status};

/// Where an experiment stands, for the progress lines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Stage {
    Pending,
    Running(Instant),
    /// Finished (in any way) after this many seconds.
    Done(f64),
}

#[derive(Debug)]
pub(super) struct BoardRow {
    pub(super) name: String,
    pub(super) expected: f64,
    pub(super) stage: Stage,
    pub(super) ok: bool,
}

#[derive(Debug)]
pub(super) struct BoardState {
    pub(super) rows: Vec<BoardRow>,
    name_width: usize,
}

impl BoardState {
    /// How much slower (> 1) or faster than expected the experiments that finished
    /// well ran; scales the estimates of those still to run.
    pub(super) fn pace(&self) -> f64 {
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
    pub(super) fn left(&self, running: Option<(usize, f64)>) -> f64 {
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
    pub(super) fn running_line(&self, i: usize, elapsed: f64) -> String {
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
pub(super) struct Board {
    state: Mutex<BoardState>,
    pub(super) tty: bool,
}

impl Board {
    /// A board for experiments `names`, expected to take `expected` seconds each.
    pub(super) fn new(names: &[String], expected: &[f64], tty: bool) -> Self {
        let rows = names
            .iter()
            .zip(expected)
            .map(|(n, &expected)| BoardRow { name: n.clone(), expected, stage: Stage::Pending, ok: false })
            .collect();
        let name_width = names.iter().map(String::len).max().unwrap_or(0);
        Board { state: Mutex::new(BoardState { rows, name_width }), tty }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, BoardState> {
        // A panic while drawing leaves nothing inconsistent worth refusing to draw.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prints a whole line.
    pub(super) fn say(&self, line: &str) {
        let _guard = self.lock();
        let _ = writeln!(io::stderr().lock(), "{line}");
    }

    pub(super) fn start(&self, i: usize) {
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
    pub(super) fn redraw(&self) {
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

    pub(super) fn finish(&self, i: usize, outcome: &Outcome) {
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
pub(super) fn spawn_redraw(board: Arc<Board>) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(1)) {
            board.redraw();
        }
    });
    (tx, handle)
}

/// Seconds as `m:ss` or `h:mm:ss`.
pub(super) fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}
