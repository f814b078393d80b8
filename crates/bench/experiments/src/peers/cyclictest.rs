//! rt-tests' `cyclictest`, the peer of the timing experiments (`alarm`, `midi`): one
//! thread woken periodically under a given class, measuring its own wake-up latency,
//! run in the same window as what it is compared with.
//!
//! It prints either a histogram (`-h US`, [`parse_histogram`]) or every wake-up
//! (`-v -N`, [`parse_samples`]); both parsers refuse what does not parse rather than
//! guess.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_bench::LatencyRecorder;

/// The histogram range given to cyclictest, in µs; later wake-ups count as overflows
/// and are recorded at cyclictest's reported maximum.
pub const HIST_US: u64 = 20_000;
/// cyclictest's histogram, as `-q -h US` prints it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CyclictestHistogram {
    /// `(latency µs, count)` of every non-empty bucket (the first thread's column).
    pub buckets: Vec<(u64, u64)>,
    /// Samples beyond the histogram's range.
    pub overflows: u64,
    /// The largest latency, µs.
    pub max_us: Option<u64>,
    /// Samples in the histogram (`# Total`).
    pub total: Option<u64>,
}

impl CyclictestHistogram {
    /// Every sample, in ns, into a recorder; overflows at the maximum.
    pub fn recorder(&self) -> LatencyRecorder {
        let mut r = LatencyRecorder::new();
        for &(us, n) in &self.buckets {
            for _ in 0..n {
                r.record(us * 1000);
            }
        }
        let over = self.max_us.unwrap_or(HIST_US) * 1000;
        for _ in 0..self.overflows {
            r.record(over);
        }
        r
    }
}

/// Parse cyclictest's `-q -h US` output: bucket lines `LATENCY COUNT…` and the
/// `# Max Latencies`, `# Histogram Overflows` and `# Total` lines. Unknown lines are
/// skipped; a bucket line that does not parse is an error.
pub fn parse_histogram(text: &str) -> Result<CyclictestHistogram, String> {
    let mut h = CyclictestHistogram::default();
    let first_number = |rest: &str| rest.split_whitespace().next().and_then(|v| v.parse::<u64>().ok());
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim();
            if let Some(v) = rest.strip_prefix("Max Latencies:") {
                h.max_us = first_number(v);
            } else if let Some(v) = rest.strip_prefix("Histogram Overflows:") {
                h.overflows = first_number(v).unwrap_or(0);
            } else if let Some(v) = rest.strip_prefix("Total:") {
                h.total = first_number(v);
            }
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(lat), Some(count)) = (fields.next(), fields.next()) else {
            return Err(format!("a histogram line without a count: {line:?}"));
        };
        let lat: u64 = lat.parse().map_err(|_| format!("not a latency: {line:?}"))?;
        let count: u64 = count.parse().map_err(|_| format!("not a count: {line:?}"))?;
        if count > 0 {
            h.buckets.push((lat, count));
        }
    }
    if h.buckets.is_empty() && h.overflows == 0 {
        return Err("cyclictest printed no histogram".into());
    }
    Ok(h)
}

/// Start `cyclictest` (rt-tests) as the peer of a timing experiment: one thread woken
/// every `interval`, `loops` times, under `policy` (`other` or `fifo`) at `prio`, its
/// latency histogram (µs buckets up to `HIST_US`) on standard output for
/// [`parse_histogram`].
pub fn spawn_histogram(policy: &str, prio: u8, interval: Duration, loops: u64) -> std::io::Result<std::process::Child> {
    command(policy, prio, interval, loops, &["-h", &HIST_US.to_string()]).spawn()
}

/// The `cyclictest` command of [`spawn_cyclictest`] with `output` for what it prints
/// (`-h N` for a histogram, `-v -N` for every wake-up in ns), standard output piped.
/// Used by `alarm` and `midi`.
pub fn command(policy: &str, prio: u8, interval: Duration, loops: u64, output: &[&str]) -> Command {
    let mut c = Command::new("cyclictest");
    c.args(["-q", "-t", "1", "-i", &interval.as_micros().to_string(), "-l", &loops.to_string()])
        .args(output)
        .args(["-p", &prio.to_string(), &format!("--policy={policy}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    c
}

/// cyclictest running, every wake-up's latency read as it comes (a pipe would fill
/// with a long window's samples).
#[derive(Debug)]
pub struct Cyclictest {
    child: Child,
    reader: Option<JoinHandle<String>>,
}

impl Cyclictest {
    /// One thread woken every `interval` for `loops` wake-ups, under `policy`
    /// (`other` or `fifo`) at `prio`, each wake-up's latency printed in ns (`-v -N`).
    pub fn start(policy: &str, prio: u8, interval: Duration, loops: u64) -> std::io::Result<Cyclictest> {
        let mut child = command(policy, prio, interval, loops, &["-v", "-N"]).spawn()?;
        let mut out = child.stdout.take();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(out) = out.as_mut() {
                let _ = out.read_to_string(&mut text);
            }
            text
        });
        Ok(Cyclictest { child, reader: Some(reader) })
    }

    /// Its wake-up latencies, once it has finished.
    pub fn finish(mut self) -> Result<Vec<u64>, String> {
        let text = self.reader.take().and_then(|r| r.join().ok()).unwrap_or_default();
        let status = self.child.wait().map_err(|e| e.to_string())?;
        parse_samples(&text).map_err(|e| format!("{e} (exit {status})"))
    }
}

impl Drop for Cyclictest {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The paper's measure on cyclictest's wake-ups: |interval − nominal| between
/// consecutive wake-ups, from their latencies (`latencies[i]` = wake-up `i` − its due
/// time). cyclictest's due times are `nominal` apart, except that after a wake-up late
/// by more than a period it skips the periods already past (its `next += interval`
/// while `now > next`); so wake-up `i + 1` is due `m·nominal` after wake-up `i`'s due
/// time, `m = max(1, ⌈latencies[i] / nominal⌉)`, and the interval between the two
/// wake-ups is `m·nominal + latencies[i + 1] − latencies[i]`.
pub fn interval_errors(latencies: &[u64], nominal: u64) -> Vec<u64> {
    let nominal = i128::from(nominal.max(1));
    latencies
        .windows(2)
        .map(|w| {
            let (a, b) = (i128::from(w[0]), i128::from(w[1]));
            let periods = ((a + nominal - 1) / nominal).max(1);
            ((periods - 1) * nominal + b - a).unsigned_abs() as u64
        })
        .collect()
}

/// cyclictest's per-wake-up output (`-v -N`): lines `thread: cycle: latency`, the
/// latency in ns. The latencies of thread 0, in cycle order; an error if a line that
/// looks like a sample does not parse, if cycles are missing, or if there are none.
pub fn parse_samples(text: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').map(str::trim).collect();
        if fields.len() != 3 || !fields.iter().all(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let parse = |f: &str| f.parse::<u64>().map_err(|e| format!("cyclictest line {line:?}: {e}"));
        let (thread, cycle, latency) = (parse(fields[0])?, parse(fields[1])?, parse(fields[2])?);
        if thread != 0 {
            continue;
        }
        if cycle != out.len() as u64 {
            return Err(format!("cyclictest: cycle {cycle} where {} was expected", out.len()));
        }
        out.push(latency);
    }
    if out.is_empty() {
        return Err("cyclictest printed no samples".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# /dev/cpu_dma_latency set to 0us\n# Histogram\n000000 000000\n000011 000001\n000014 000050\n000168 000001\n# Total: 000000052\n# Min Latencies: 00011\n# Avg Latencies: 00016\n# Max Latencies: 00900\n# Histogram Overflows: 00002\n# Histogram Overflow at cycle number:\n# Thread 0: 00052 00059\n";

    #[test]
    fn cyclictest_histograms_parse() {
        let h = parse_histogram(SAMPLE).unwrap();
        assert_eq!(h.buckets, vec![(11, 1), (14, 50), (168, 1)]);
        assert_eq!((h.overflows, h.max_us, h.total), (2, Some(900), Some(52)));
        let r = h.recorder();
        assert_eq!(r.count(), 54);
        assert!((14_000..14_020).contains(&r.quantile(0.5)), "HDR keeps three significant figures");
        assert!(r.quantile(1.0) >= 900_000 && r.quantile(1.0) < 901_000);
    }

    #[test]
    fn cyclictest_garbage_is_an_error() {
        assert!(parse_histogram("").is_err());
        assert!(parse_histogram("# Total: 0\n").is_err());
        assert!(parse_histogram("00001\n").is_err());
        assert!(parse_histogram("abc 00001\n").is_err());
        assert!(parse_histogram("00001 -3\n").is_err());
    }

    #[test]
    fn cyclictest_samples_parse() {
        let text = "# /dev/cpu_dma_latency set to 0us\nThread 0 Interval: 10500\n       0:       0:   17460\n       0:       1:   14531\n       1:       0:      99\n       0:       2:   15868\nT: 0 ( 3073) P:80 I:10000 C:      3 Min:  14531 Act:   15868 Avg:   15953 Max:   17460\n";
        assert_eq!(parse_samples(text).unwrap(), vec![17460, 14531, 15868]);
        assert!(parse_samples("").is_err());
        assert!(parse_samples("T: 0 ( 3073) P:80 I:10000 C: 0\n").is_err());
        let gap = "       0:       0:   17\n       0:       2:   15\n";
        assert!(parse_samples(gap).unwrap_err().contains("cycle 2"));
        let huge = "       0:       0:   99999999999999999999999\n";
        assert!(parse_samples(huge).is_err());
    }
}
