//! The experiment's clients: a player that pulls a stream at its rate and a download
//! that reads as fast as the server sends, both recording when each byte arrived; and
//! the player's judgement of a stream (late slots, worst lateness), the same for every
//! server measured.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ictus_bench::BenchError;

use super::rig::{check_stop, err};

/// What a client received.
#[derive(Debug)]
pub struct Received {
    /// The response's status (0 if none arrived).
    pub status: u16,
    /// Body bytes.
    pub bytes: u64,
    /// (ns since the request was sent, cumulative body bytes) at each read.
    pub marks: Vec<(u64, u64)>,
    /// From the request to the last read.
    pub elapsed: Duration,
}

impl Received {
    /// When the first body byte arrived (ns since the request), if one did.
    pub fn first_byte_ns(&self) -> Option<u64> {
        self.marks.first().map(|m| m.0)
    }
}

/// How a client reads.
#[derive(Clone, Copy, Debug)]
pub enum Pull {
    /// As fast as the server sends, until `limit` body bytes (or the end).
    Download {
        /// Stop after this many body bytes.
        limit: Option<u64>,
    },
    /// A player: its playback clock starts at the first body byte and it reads at most
    /// one `chunk` ahead of `rate` bytes/s, so a server that does not pace itself is
    /// paced by TCP's flow control; it stops after `window` bytes.
    Player {
        /// Bytes/s.
        rate: f64,
        /// Its buffer beyond the playback clock.
        chunk: u64,
        /// Bytes to play.
        window: u64,
    },
}

/// GETs `/path` from `127.0.0.1:port` and reads it as `pull` says, for at most
/// `deadline`.
pub fn get(port: u16, path: &str, pull: Pull, deadline: Duration) -> Result<Received, BenchError> {
    request(port, path, "", pull, deadline, None)
}

/// Downloads `/path` from byte `from` on for `dur` (a `Range: bytes=from-` request).
pub fn get_range(port: u16, path: &str, from: u64, dur: Duration) -> Result<Received, BenchError> {
    request(port, path, &format!("Range: bytes={from}-\r\n"), Pull::Download { limit: None }, dur, None)
}

/// Background downloads' progress, shared with whoever measures them while they run.
#[derive(Debug, Default)]
pub struct Meter {
    /// Body bytes received so far, by all the downloads using this meter.
    pub bytes: AtomicU64,
    /// Set to make them stop at their next read.
    pub stop: AtomicBool,
}

/// [`get_range`] until `meter.stop` (or `limit`), adding every body byte to
/// `meter.bytes` as it arrives.
pub fn get_range_metered(
    port: u16,
    path: &str,
    from: u64,
    limit: Duration,
    meter: &Meter,
) -> Result<Received, BenchError> {
    request(port, path, &format!("Range: bytes={from}-\r\n"), Pull::Download { limit: None }, limit, Some(meter))
}

fn request(
    port: u16,
    path: &str,
    headers: &str,
    pull: Pull,
    deadline: Duration,
    meter: Option<&Meter>,
) -> Result<Received, BenchError> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| err("connect", e))?;
    s.set_read_timeout(Some(Duration::from_millis(20))).map_err(|e| err("socket", e))?;
    let _ = s.set_nodelay(true);
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: bench\r\n{headers}Connection: close\r\n\r\n").as_bytes())
        .map_err(|e| err("send", e))?;
    let t0 = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    let mut head = Vec::new();
    let (mut status, mut body, mut in_body) = (0u16, 0u64, false);
    let mut marks: Vec<(u64, u64)> = Vec::new();
    loop {
        check_stop()?;
        if t0.elapsed() > deadline || meter.is_some_and(|m| m.stop.load(Ordering::Relaxed)) {
            break;
        }
        let want = match pull {
            Pull::Download { limit } => {
                if limit.is_some_and(|l| body >= l) {
                    break;
                }
                buf.len()
            }
            Pull::Player { rate, chunk, window } => {
                if body >= window {
                    break;
                }
                match marks.first() {
                    Some(&(first, _)) if in_body => {
                        let played = (t0.elapsed().as_nanos() as u64).saturating_sub(first) as f64 / 1e9;
                        let allowed = (played * rate) as u64 + chunk;
                        if body >= allowed {
                            std::thread::sleep(Duration::from_micros(500));
                            continue;
                        }
                        ((allowed - body) as usize).min(buf.len())
                    }
                    _ => buf.len(),
                }
            }
        };
        let n = match s.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(err("recv", e)),
        };
        let mut data = &buf[..n];
        if !in_body {
            head.extend_from_slice(data);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            status = String::from_utf8_lossy(&head[..end])
                .split_whitespace()
                .nth(1)
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            let extra = head.len() - (end + 4);
            data = &buf[n - extra..n];
            in_body = true;
            if data.is_empty() {
                continue;
            }
        }
        body += data.len() as u64;
        if let Some(m) = meter {
            m.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        marks.push((t0.elapsed().as_nanos() as u64, body));
    }
    Ok(Received { status, bytes: body, marks, elapsed: t0.elapsed() })
}

/// A stream as its player saw it.
#[derive(Clone, Debug, Default)]
pub struct Judged {
    /// Slots (chunks) of the window.
    pub slots: u64,
    /// Slots whose last byte arrived more than one period after the player needed it.
    pub late: u64,
    /// Each slot's lateness beyond that tolerance (ns; 0 if on time).
    pub lateness: Vec<u64>,
    /// The worst (ns).
    pub worst: u64,
    /// From the request to the first body byte (ns).
    pub first_byte_ns: u64,
    /// Bytes/s over the window, from the first body byte.
    pub achieved: f64,
    /// Whether the rate was held: a 2xx answer, the whole window, at most 1 % of slots
    /// late.
    pub held: bool,
}

/// The stream's window as its player saw it: from the first body byte to the arrival
/// that completed `window` bytes (or the last read, if it never did), in ns since the
/// request was sent.
pub fn window_ns(r: &Received, window: u64) -> (u64, u64) {
    let done_at = r.marks.iter().find(|m| m.1 >= window).map_or(r.elapsed.as_nanos() as u64, |m| m.0);
    let t0 = r.first_byte_ns().unwrap_or(done_at).min(done_at);
    (t0, done_at)
}

/// Judges a stream that should deliver `rate` bytes/s in `chunk`-byte slots over
/// `window` bytes. The player starts its clock at the first body byte, `t0`; slot k
/// (bytes up to (k+1)·chunk) is needed by `t0 + (k+1)·period`, and is late if it
/// arrived more than one more period after that.
pub fn judge(r: &Received, rate: f64, chunk: u64, window: u64) -> Judged {
    let period = chunk as f64 / rate * 1e9;
    let n = window / chunk;
    let t0 = r.first_byte_ns().unwrap_or(u64::MAX / 4);
    let (mut late, mut worst) = (0, 0);
    let mut lateness = Vec::with_capacity(n as usize);
    let mut i = 0;
    for k in 0..n {
        let need = (k + 1) * chunk;
        while i < r.marks.len() && r.marks[i].1 < need {
            i += 1;
        }
        let due = t0.saturating_add(((k + 2) as f64 * period) as u64);
        let at = r.marks.get(i).map_or(u64::MAX / 2, |m| m.0);
        let l = at.saturating_sub(due).min(u64::MAX / 4);
        late += u64::from(l > 0);
        worst = worst.max(l);
        lateness.push(l);
    }
    let (from, done_at) = window_ns(r, window);
    let achieved = r.bytes.min(window) as f64 / (done_at.saturating_sub(from) as f64 / 1e9).max(1e-9);
    Judged {
        slots: n,
        late,
        lateness,
        worst,
        first_byte_ns: r.first_byte_ns().unwrap_or(0),
        achieved,
        held: r.status / 100 == 2 && r.bytes >= window && late as f64 <= 0.01 * n as f64,
    }
}

/// Puts the calling thread (a client, which measures) at `SCHED_FIFO priority` if
/// permitted, so that timesharing load on the machine does not show as lateness of the
/// server measured; what it got.
pub fn measuring_thread(priority: u8) -> String {
    use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
    configure_current_thread(&ThreadRequest { policy: Some(Policy::Fifo { priority }), ..ThreadRequest::default() })
        .describe()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn arrivals(marks: &[(u64, u64)]) -> Received {
        Received {
            status: 200,
            bytes: marks.last().map_or(0, |m| m.1),
            marks: marks.to_vec(),
            elapsed: Duration::from_nanos(marks.last().map_or(0, |m| m.0)),
        }
    }

    #[test]
    fn the_player_counts_from_the_first_byte_with_one_period_of_tolerance() {
        // 100-byte slots at 1000 B/s: a period of 100 ms. First byte at 300 ms.
        let r = arrivals(&[(300 * MS, 100), (500 * MS, 200), (620 * MS, 300), (800 * MS, 400)]);
        let j = judge(&r, 1000.0, 100, 400);
        // Slot k is due by 300 + (k+2)·100 ms: 500, 600, 700, 800.
        assert_eq!(j.slots, 4);
        assert_eq!(j.lateness, vec![0, 0, 0, 0]);
        assert!(j.held);
        assert_eq!(j.first_byte_ns, 300 * MS);
        let r = arrivals(&[(300 * MS, 100), (650 * MS, 300), (700 * MS, 400)]);
        let j = judge(&r, 1000.0, 100, 400);
        assert_eq!(j.lateness, vec![0, 50 * MS, 0, 0], "slot 1 arrived at 650, due by 600");
        assert_eq!((j.late, j.worst), (1, 50 * MS));
        assert!(!j.held, "1 of 4 late is more than 1 %");
        // A window never completed: the rest is late, and not held.
        let j = judge(&arrivals(&[(300 * MS, 100)]), 1000.0, 100, 400);
        assert_eq!(j.late, 3);
        assert!(!j.held);
    }
}
