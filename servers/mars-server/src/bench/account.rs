//! Table 2's accounting: what the background readers and the disk did **during the
//! stream's window**, and the check that the numbers add up to something a disk can do.
//!
//! Until the mars5 session the fio readers' background was fio's own figure
//! (`bw_bytes`: bytes over fio's whole run), while the stream was measured over its
//! window. fio ran a second longer than the stream and started before it, so its figure
//! mixed the contended window with time it had the disk alone, and stream + background
//! came to 48–62 MB/s on a 41.9 MB/s throttle in every fio cell. Now a sampler thread
//! reads, every [`PERIOD`], the readers' progress (the bytes fio's processes submitted,
//! `/proc/PID/io` `read_bytes`, or the bytes our background downloads received) and the
//! throttled device's sectors read (`/sys/block/loopN/stat`); each is interpolated at the
//! window's two ends. A cell whose stream + background exceeds the disk's measured
//! capability by more than [`MARGIN`] is an error in the report, not a number.

use std::collections::HashMap;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the sampler reads its counters.
pub const PERIOD: Duration = Duration::from_millis(20);

/// The longest gap between samples over a window that still measures it.
pub const MAX_GAP: Duration = Duration::from_millis(200);

/// How far stream + background may exceed the disk's measured capability before the
/// cell is an error: the throttle's 100 ms slices let a burst through at a slice's start
/// (4 MiB at 40 MiB/s, 1.4 MB/s over a 3 s window), fio counts a read when submitted
/// (up to 1 MiB per reader in flight at either end of the window), and the capability
/// itself is measured over 1.5 s.
pub const MARGIN: f64 = 0.10;

/// A counter of bytes that only grows.
pub type Source = Box<dyn FnMut() -> u64 + Send>;

/// Samples (when, background bytes, disk bytes) until stopped.
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Series>>,
}

/// What the sampler saw: (when, background bytes, disk bytes), in time order.
#[derive(Clone, Debug, Default)]
pub struct Series(pub Vec<(Instant, u64, u64)>);

impl Sampler {
    /// Starts sampling `background` and the bytes read from the block device `disk`
    /// (its name under `/sys/block`).
    pub fn start(mut background: Source, disk: &str) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (st, disk) = (Arc::clone(&stop), disk.trim_start_matches("/dev/").to_string());
        let thread = std::thread::spawn(move || {
            let mut s = Series::default();
            loop {
                let last = st.load(Ordering::Acquire);
                s.0.push((Instant::now(), background(), disk_bytes(&disk)));
                if last {
                    return s;
                }
                std::thread::sleep(PERIOD);
            }
        });
        Sampler { stop, thread: Some(thread) }
    }

    /// Stops; what was seen (with one last sample taken now).
    pub fn finish(mut self) -> Series {
        self.stop.store(true, Ordering::Release);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Series {
    /// The two counters at `t`, linearly between the samples around it (clamped to the
    /// first and last sample).
    pub fn at(&self, t: Instant) -> (f64, f64) {
        let v = &self.0;
        let Some(first) = v.first() else { return (0.0, 0.0) };
        if t <= first.0 {
            return (first.1 as f64, first.2 as f64);
        }
        for w in v.windows(2) {
            let ((t0, b0, d0), (t1, b1, d1)) = (w[0], w[1]);
            if t <= t1 {
                let span = t1.duration_since(t0).as_secs_f64();
                let f = if span > 0.0 { t.duration_since(t0).as_secs_f64() / span } else { 1.0 };
                let lerp = |a: u64, b: u64| a as f64 + (b as f64 - a as f64) * f;
                return (lerp(b0, b1), lerp(d0, d1));
            }
        }
        let last = v[v.len() - 1];
        (last.1 as f64, last.2 as f64)
    }

    /// Bytes/s of the background and of the disk between `from` and `to`.
    pub fn rates(&self, from: Instant, to: Instant) -> (f64, f64) {
        let secs = to.saturating_duration_since(from).as_secs_f64();
        if secs <= 0.0 {
            return (0.0, 0.0);
        }
        let (a, b) = (self.at(from), self.at(to));
        ((b.0 - a.0).max(0.0) / secs, (b.1 - a.1).max(0.0) / secs)
    }

    /// Whether both ends of `from..to` fall inside what was sampled.
    pub fn covers(&self, from: Instant, to: Instant) -> bool {
        matches!((self.0.first(), self.0.last()), (Some(f), Some(l)) if f.0 <= from && to <= l.0)
    }

    /// The longest time without a sample over `from..to` (from the sample before
    /// `from` to the one after `to`): a sampler starved of the CPU cannot say what
    /// happened in between.
    pub fn widest_gap(&self, from: Instant, to: Instant) -> Duration {
        let v = &self.0;
        let first = v.iter().rposition(|s| s.0 <= from).unwrap_or(0);
        let last = v.iter().position(|s| s.0 >= to).unwrap_or(v.len().saturating_sub(1));
        v[first..=last.max(first).min(v.len().saturating_sub(1))]
            .windows(2)
            .map(|w| w[1].0.duration_since(w[0].0))
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

/// Bytes read from a block device since boot (`/sys/block/NAME/stat`, sectors read ×
/// 512), 0 if unreadable.
pub fn disk_bytes(name: &str) -> u64 {
    fs::read_to_string(format!("/sys/block/{name}/stat"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).and_then(|x| x.parse::<u64>().ok()))
        .map_or(0, |sectors| sectors * 512)
}

/// The bytes a process and its children (fio forks one process per job) have had read
/// from storage for them (`/proc/PID/io` `read_bytes`: counted when a read is submitted
/// to the block layer, `O_DIRECT` included), summed. A process seen once keeps counting
/// with its last value after it exits. (This kernel has no `/proc/PID/task/TID/children`,
/// so children are found by their parent pid, scanning `/proc` only until `children` of
/// them are known: the sampler must not load the machine it measures.)
pub fn tree_reader(root: u32, children: usize) -> Source {
    let mut seen: HashMap<u32, u64> = HashMap::new();
    let mut kids: Vec<u32> = Vec::new();
    Box::new(move || {
        if kids.len() < children {
            if let Ok(rd) = fs::read_dir("/proc") {
                for e in rd.flatten() {
                    let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                    if pid != root && !kids.contains(&pid) && parent_of(pid) == Some(root) {
                        kids.push(pid);
                    }
                }
            }
        }
        for &pid in std::iter::once(&root).chain(&kids) {
            if let Some(b) = read_bytes(pid) {
                let v = seen.entry(pid).or_insert(0);
                *v = (*v).max(b);
            }
        }
        seen.values().sum()
    })
}

fn parent_of(pid: u32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: the fields
    // after its closing one are state, then the parent's pid.
    s[s.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

fn read_bytes(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("read_bytes:")).and_then(|v| v.trim().parse().ok())
}

/// One run's accounting over the stream's window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    /// Whether the sampler saw the whole window, with no gap over [`MAX_GAP`].
    pub sampled: bool,
    /// The stream's bytes/s as its player received them.
    pub stream: f64,
    /// The background readers' bytes/s.
    pub background: f64,
    /// Bytes/s read from the throttled device (everyone's reads, read-ahead included).
    pub disk: f64,
}

impl Window {
    /// Why these numbers cannot all be true on a disk that delivers `capability`
    /// bytes/s (and is throttled to `throttle`), if they cannot: a window the sampler
    /// did not see whole; stream + background more than [`MARGIN`] above the disk
    /// (the larger of its measured capability and its throttle: a capability measured
    /// while other programs starved the measuring thread of the CPU came out at 26 MB/s
    /// on a 41.9 MB/s disk), or above what the device itself counted; or the device's
    /// count above the throttle.
    pub fn impossible(&self, capability: f64, throttle: f64) -> Option<String> {
        if !self.sampled {
            return Some(format!(
                "the sampler did not see the stream's window whole (a gap over {} ms: starved of the CPU)",
                MAX_GAP.as_millis()
            ));
        }
        let capability = capability.max(throttle);
        let sum = self.stream + self.background;
        if sum > self.disk * (1.0 + MARGIN) {
            return Some(format!(
                "stream {:.1} + background {:.1} = {:.1} MB/s is more than {:.0} % above the {:.1} MB/s the device read",
                self.stream / 1e6,
                self.background / 1e6,
                sum / 1e6,
                MARGIN * 100.0,
                self.disk / 1e6
            ));
        }
        if sum > capability * (1.0 + MARGIN) {
            return Some(format!(
                "stream {:.1} + background {:.1} = {:.1} MB/s exceeds the disk's {:.1} MB/s (its measured capability or its throttle, the larger) by more than {:.0} %",
                self.stream / 1e6,
                self.background / 1e6,
                sum / 1e6,
                capability / 1e6,
                MARGIN * 100.0
            ));
        }
        if self.disk > throttle * (1.0 + MARGIN) {
            return Some(format!(
                "the throttled device read {:.1} MB/s, more than {:.0} % above its {:.1} MB/s throttle",
                self.disk / 1e6,
                MARGIN * 100.0,
                throttle / 1e6
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_interpolated_between_samples_and_clamped_outside() {
        let t = Instant::now();
        let ms = |n: u64| t + Duration::from_millis(n);
        let s = Series(vec![(ms(0), 0, 0), (ms(100), 1000, 500), (ms(300), 1000, 2500)]);
        assert_eq!(s.at(ms(50)), (500.0, 250.0));
        assert_eq!(s.at(ms(200)), (1000.0, 1500.0));
        assert_eq!(s.at(t), (0.0, 0.0));
        assert_eq!(s.at(ms(1000)), (1000.0, 2500.0));
        // 500 background bytes and 1250 disk bytes in 0.15 s.
        let (bg, disk) = s.rates(ms(50), ms(200));
        assert!((bg - 500.0 / 0.15).abs() < 1e-6 && (disk - 1250.0 / 0.15).abs() < 1e-6, "{bg} {disk}");
        assert!(s.covers(ms(0), ms(300)) && !s.covers(ms(0), ms(301)));
        assert_eq!(s.widest_gap(ms(10), ms(90)), Duration::from_millis(100));
        assert_eq!(s.widest_gap(ms(50), ms(250)), Duration::from_millis(200));
        assert_eq!(Series::default().rates(ms(0), ms(10)), (0.0, 0.0));
    }

    #[test]
    fn a_window_beyond_the_disk_is_flagged() {
        let ok = Window { sampled: true, stream: 31.5e6, background: 10.9e6, disk: 42.0e6 };
        assert_eq!(ok.impossible(41.9e6, 41.9e6), None);
        // A capability measured too low (CPU-starved) does not flag a disk doing its rate.
        assert_eq!(ok.impossible(26.1e6, 41.9e6), None);
        let e = Window { sampled: false, ..ok }.impossible(41.9e6, 41.9e6).expect("flagged");
        assert!(e.contains("did not see"), "{e}");
        // What the fio cells reported before the fix: 31.5 + 29.0 on a 41.9 MB/s disk.
        let e = Window { background: 29.0e6, disk: 70e6, ..ok }.impossible(41.9e6, 41.9e6).expect("flagged");
        assert!(e.contains("60.5 MB/s exceeds"), "{e}");
        // More than the device read: background counted that the disk did not deliver.
        let e = Window { background: 29.0e6, ..ok }.impossible(41.9e6, 41.9e6).expect("flagged");
        assert!(e.contains("above the 42.0 MB/s the device read"), "{e}");
        let e = Window { disk: 50e6, ..ok }.impossible(41.9e6, 41.9e6).expect("flagged");
        assert!(e.contains("throttled device"), "{e}");
    }

    #[test]
    fn a_process_tree_reads_this_process() {
        // Our own pid: readable, and the count never goes down.
        let mut r = tree_reader(std::process::id(), 0);
        let (a, b) = (r(), r());
        assert!(b >= a);
        assert_eq!(parent_of(std::process::id()), Some(std::os::unix::process::parent_id()));
    }
}
