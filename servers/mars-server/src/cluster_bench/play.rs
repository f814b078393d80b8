//! The experiment's players: a stream is asked of the director (which redirects to a
//! node) or of nginx's front (which proxies to a node), then pulled at its rate, every
//! byte checked against the clip; a stream cut by a dead node is asked for again from
//! the byte reached, and the time to its first resumed byte is recorded.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bench::client::Received;
use crate::bench::rig::stopped;

/// A response head and the body bytes that came with it.
#[derive(Debug)]
pub struct Head {
    /// Status code.
    pub status: u16,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// Body bytes read with the head.
    pub rest: Vec<u8>,
}

impl Head {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// GETs `target` from `addr` (from byte `from` with a `Range`), and reads the head.
pub fn request(addr: SocketAddr, target: &str, from: u64, timeout: Duration) -> io::Result<(TcpStream, Head)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(Duration::from_millis(20)))?;
    let _ = s.set_nodelay(true);
    let range = if from > 0 { format!("Range: bytes={from}-\r\n") } else { String::new() };
    s.write_all(format!("GET {target} HTTP/1.1\r\nHost: bench\r\n{range}Connection: close\r\n\r\n").as_bytes())?;
    let end_by = Instant::now() + timeout;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if Instant::now() > end_by || stopped() || buf.len() > 64 << 10 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no response head from {addr}")));
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{addr} closed before a head"))),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    };
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((s, Head { status, headers, rest: buf[end..].to_vec() }))
}

/// Where players ask for a stream.
#[derive(Clone, Copy, Debug)]
pub enum Via {
    /// Ours: the director's HTTP port; it redirects to a node.
    Director(SocketAddr),
    /// The peer: nginx's round-robin front; it proxies to a node.
    Front(SocketAddr),
}

/// A stream opened at a node.
#[derive(Debug)]
pub struct Opened {
    /// The connection, head read.
    pub sock: TcpStream,
    /// Its head.
    pub head: Head,
    /// The director's stream id (ours).
    pub stream: Option<u64>,
    /// The node serving it (`X-Ictus-Node` from the director, `X-Node` from nginx).
    pub node: Option<u32>,
    /// How long the director took to answer (ours).
    pub redirect_ns: Option<u64>,
    /// When the director's answer was read (ours).
    pub redirected_at: Option<Instant>,
    /// When the node's (or the front's) response head was read.
    pub head_at: Instant,
}

/// Opens `clip` at byte `from` through `via`, paced at `rate` by our nodes;
/// `stream` names the director's stream on a resume.
pub fn open(via: Via, clip: &str, rate: u64, stream: Option<u64>, from: u64) -> Result<Opened, String> {
    let timeout = Duration::from_secs(10);
    match via {
        Via::Director(d) => {
            let resume = stream.map_or(String::new(), |s| format!("&stream={s}"));
            let t = Instant::now();
            let (_, h) = request(d, &format!("/{clip}?rate={rate}{resume}"), from, timeout)
                .map_err(|e| format!("asking the director: {e}"))?;
            let redirect_ns = t.elapsed().as_nanos() as u64;
            if h.status != 302 {
                return Err(format!("the director answered {}", h.status));
            }
            let loc = h.header("location").ok_or("a redirect without Location")?;
            let (host, path) = loc
                .strip_prefix("http://")
                .and_then(|l| l.split_once('/'))
                .ok_or_else(|| format!("Location {loc:?}"))?;
            let to: SocketAddr = host.parse().map_err(|_| format!("Location {loc:?}: not host:port"))?;
            let stream = h.header("x-ictus-stream").and_then(|v| v.parse().ok());
            let node = h.header("x-ictus-node").and_then(|v| v.parse().ok());
            let redirected_at = Instant::now();
            let (sock, head) =
                request(to, &format!("/{path}"), from, timeout).map_err(|e| format!("node {to}: {e}"))?;
            Ok(Opened {
                sock,
                head,
                stream,
                node,
                redirect_ns: Some(redirect_ns),
                redirected_at: Some(redirected_at),
                head_at: Instant::now(),
            })
        }
        Via::Front(f) => {
            let (sock, head) = request(f, &format!("/{clip}"), from, timeout).map_err(|e| format!("front: {e}"))?;
            let node = head.header("x-node").and_then(|v| v.parse().ok());
            Ok(Opened {
                sock,
                head,
                stream: None,
                node,
                redirect_ns: None,
                redirected_at: None,
                head_at: Instant::now(),
            })
        }
    }
}

/// When a node was killed, and which (failover rounds): players measure their resume
/// from it.
pub type KillClock = Arc<Mutex<Option<(Instant, u32)>>>;

/// One stream as its player saw it.
#[derive(Debug)]
pub struct Played {
    /// Arrivals, for [`crate::bench::client::judge`].
    pub received: Received,
    /// A byte differed from the clip.
    pub wrong: bool,
    /// The first node, and the last.
    pub nodes: (Option<u32>, Option<u32>),
    /// Per cut: from the client seeing the cut to the first resumed body byte (ns).
    pub resume_ns: Vec<u64>,
    /// Per cut: from the kill to the first resumed body byte (ns).
    pub kill_to_resume_ns: Vec<u64>,
    /// Per cut, where the resume's time went: [`ResumePhases`].
    pub resume_phases: Vec<ResumePhases>,
    /// The director's answer times (ns).
    pub redirect_ns: Vec<u64>,
    /// Why it stopped before its window, if it did.
    pub error: Option<String>,
}

/// One resume, from the player's seeing the cut (ns after it): where the time went.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResumePhases {
    /// Requests made until one was answered with a stream (1: the first was).
    pub attempts: u32,
    /// The director's redirect read (ours; 0 for nginx's front).
    pub redirect_ns: u64,
    /// The serving node's response head read.
    pub head_ns: u64,
    /// The first body byte read.
    pub first_byte_ns: u64,
    /// Detection: from the kill to the player's seeing the cut (before the rest; 0 if
    /// no kill clock ran).
    pub detect_ns: u64,
}

/// What a player plays.
#[derive(Clone, Copy, Debug)]
pub struct Stream<'a> {
    /// Where to ask.
    pub via: Via,
    /// The clip's name.
    pub clip: &'a str,
    /// The clip's bytes from `offset` on (to check what arrives).
    pub expect: &'a [u8],
    /// Where in the clip the stream starts.
    pub offset: u64,
    /// Bytes/s.
    pub rate: u64,
    /// The player's buffer beyond its playback clock.
    pub chunk: u64,
    /// Bytes to play.
    pub window: u64,
    /// Give up after this long.
    pub limit: Duration,
    /// In a failover round: stop playing this long after the kill (while not cut off).
    pub after_kill: Option<Duration>,
}

/// Plays `s`: a player whose clock starts at the first body byte and reads at most one
/// chunk ahead of it (so a server that does not pace is paced by TCP). A cut before the
/// window's end is resumed (from the byte reached) when `resume` is given, else ends it.
/// `node` is told the serving node as soon as it is known.
pub fn play(s: &Stream<'_>, resume: Option<&KillClock>, node: &Mutex<Option<u32>>) -> Played {
    let t0 = Instant::now();
    let end_by = t0 + s.limit;
    let mut p = Played {
        received: Received { status: 0, bytes: 0, marks: Vec::new(), elapsed: Duration::ZERO },
        wrong: false,
        nodes: (None, None),
        resume_ns: Vec::new(),
        kill_to_resume_ns: Vec::new(),
        resume_phases: Vec::new(),
        redirect_ns: Vec::new(),
        error: None,
    };
    let mut stream_id = None;
    let mut done_after_kill = false;
    let mut resumed_at: Option<Instant> = None;
    // A player stops `after_kill` after the kill, unless it was on the killed node and
    // has not resumed (and played half a second more) yet.
    let done = |first: Option<u32>, resumed_at: Option<Instant>| {
        let Some((at, victim)) = resume.and_then(|k| k.lock().ok().and_then(|k| *k)) else { return false };
        let Some(d) = s.after_kill else { return false };
        at.elapsed() > d
            && (first != Some(victim) || resumed_at.is_some_and(|r| r.elapsed() > Duration::from_millis(500)))
    };
    let mut cut_at: Option<Instant> = None;
    let mut phases = ResumePhases::default();
    let mut buf = vec![0u8; 1 << 20];
    'open: while p.received.bytes < s.window && Instant::now() < end_by && !stopped() {
        let from = s.offset + p.received.bytes;
        phases.attempts += 1;
        let o = match open(s.via, s.clip, s.rate, stream_id, from) {
            Ok(o) if o.head.status / 100 == 2 => o,
            Ok(o) => {
                let why = format!("status {} at byte {from}", o.head.status);
                if cut_at.is_some() {
                    // The director or the front may not know yet: ask again.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                p.error = Some(why);
                break;
            }
            Err(e) => {
                if cut_at.is_some() {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                p.error = Some(e);
                break;
            }
        };
        if p.received.status == 0 {
            p.received.status = o.head.status;
        }
        stream_id = o.stream.or(stream_id);
        p.redirect_ns.extend(o.redirect_ns);
        if p.nodes.0.is_none() {
            p.nodes.0 = o.node;
        }
        p.nodes.1 = o.node;
        if let Ok(mut n) = node.lock() {
            *n = o.node;
        }
        if let Some(cut) = cut_at {
            phases.redirect_ns = o.redirected_at.map_or(0, |t| t.duration_since(cut).as_nanos() as u64);
            phases.head_ns = o.head_at.duration_since(cut).as_nanos() as u64;
        }
        let mut sock = o.sock;
        let mut pending = o.head.rest;
        loop {
            let data: &[u8] = if pending.is_empty() {
                if Instant::now() > end_by || stopped() {
                    break 'open;
                }
                if p.received.bytes >= s.window {
                    break 'open;
                }
                if done(p.nodes.0, resumed_at) {
                    done_after_kill = true;
                    break 'open;
                }
                // The player's clock: one chunk ahead of the rate, from the first byte.
                let want = match p.received.marks.first() {
                    Some(&(first, _)) => {
                        let played = (t0.elapsed().as_nanos() as u64).saturating_sub(first) as f64 / 1e9;
                        let allowed = (played * s.rate as f64) as u64 + s.chunk;
                        if p.received.bytes >= allowed {
                            // Until a quarter of a chunk more is allowed (not a busy
                            // poll: many players share the machine with the servers).
                            let short = p.received.bytes - allowed + s.chunk / 4;
                            let wait = Duration::from_secs_f64(short as f64 / s.rate.max(1) as f64);
                            std::thread::sleep(wait.clamp(Duration::from_micros(500), Duration::from_millis(20)));
                            continue;
                        }
                        ((allowed - p.received.bytes) as usize).min(buf.len())
                    }
                    None => buf.len(),
                };
                let want = want.min((s.window - p.received.bytes) as usize);
                match sock.read(&mut buf[..want]) {
                    Ok(0) => break,
                    Ok(n) => &buf[..n],
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            } else {
                &pending
            };
            let n = data.len().min((s.window - p.received.bytes) as usize);
            let at = p.received.bytes as usize;
            if s.expect.get(at..at + n) != Some(&data[..n]) {
                p.wrong = true;
            }
            if let Some(cut) = cut_at.take() {
                // The first byte after a cut.
                p.resume_ns.push(cut.elapsed().as_nanos() as u64);
                phases.first_byte_ns = cut.elapsed().as_nanos() as u64;
                resumed_at = Some(Instant::now());
                if let Some((k, _)) = resume.and_then(|k| k.lock().ok().and_then(|k| *k)) {
                    let kill_to_resume = k.elapsed().as_nanos() as u64;
                    p.kill_to_resume_ns.push(kill_to_resume);
                    phases.detect_ns = kill_to_resume.saturating_sub(phases.first_byte_ns);
                }
                p.resume_phases.push(phases);
            }
            p.received.bytes += n as u64;
            p.received.marks.push((t0.elapsed().as_nanos() as u64, p.received.bytes));
            pending.clear();
        }
        // The connection ended before the window did.
        if p.received.bytes >= s.window {
            break;
        }
        if resume.is_none() {
            p.error = Some(format!("the connection ended at byte {}", s.offset + p.received.bytes));
            break;
        }
        cut_at = Some(Instant::now());
        phases = ResumePhases::default();
    }
    if p.received.bytes < s.window && p.error.is_none() && !done_after_kill {
        p.error = Some(format!("{} of {} bytes within {:?}", p.received.bytes, s.window, s.limit));
    }
    p.received.elapsed = t0.elapsed();
    p
}
