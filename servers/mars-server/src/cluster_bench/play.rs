//! The experiment's players: a stream is asked of the director (which redirects to a
//! node) or of nginx's front (which proxies to a node), then pulled at its rate, every
//! byte checked against the clip; a stream cut by a dead node is asked for again from
//! the byte reached, and the time to its first resumed byte is recorded.
//!
//! A player's requests (the director's redirect, the node's head) run on its own
//! thread; its body bytes are read by one [`Pump`] per batch of streams, an epoll loop
//! that reads each stream when its playback clock allows and checks the bytes against
//! the clip; the player's thread sleeps on a channel meanwhile. *Why*: with a thread per
//! stream reading in quarter-chunk steps, 128 players made ~16 000 thread wake-ups a
//! second on two cores shared with the servers measured, and used more CPU per GB than
//! the nodes and the OSD together (12–21 CPU-s per GB); the loop reads the same bytes at
//! the same moments with one thread.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::epoll;

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

impl Played {
    /// Nothing received yet (or ever: `error` says why), after `elapsed`.
    fn nothing(elapsed: Duration, error: Option<String>) -> Played {
        Played {
            received: Received { status: 0, bytes: 0, marks: Vec::new(), elapsed },
            wrong: false,
            nodes: (None, None),
            resume_ns: Vec::new(),
            kill_to_resume_ns: Vec::new(),
            resume_phases: Vec::new(),
            redirect_ns: Vec::new(),
            error,
        }
    }
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
/// chunk ahead of it (so a server that does not pace is paced by TCP); its body bytes are
/// read by `pump`. A cut before the window's end is resumed (from the byte reached) when
/// `resume` is given, else ends it. `node` is told the serving node as soon as it is known.
pub fn play<'a>(s: &Stream<'a>, resume: Option<&'a KillClock>, node: &Mutex<Option<u32>>, pump: &Pump<'a>) -> Played {
    let t0 = Instant::now();
    let end_by = t0 + s.limit;
    let mut p = Played::nothing(Duration::ZERO, None);
    let mut stream_id = None;
    let mut done_after_kill = false;
    let mut resumed_at: Option<Instant> = None;
    let mut cut_at: Option<Instant> = None;
    let mut phases = ResumePhases::default();
    while p.received.bytes < s.window && Instant::now() < end_by && !stopped() {
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
        let leg = Leg {
            s: *s,
            resume,
            t0,
            end_by,
            sock: o.sock,
            pending: o.head.rest,
            p,
            cut_at,
            phases,
            resumed_at,
            wake_at: None,
            key: 0,
            ready: true,
        };
        let Some((leg, end)) = pump.carry(leg) else {
            // The pump is gone (it does not end while a handle lives): nothing to do.
            return Played::nothing(t0.elapsed(), Some("the players' pump stopped".into()));
        };
        (p, resumed_at) = (leg.p, leg.resumed_at);
        match end {
            End::Finished => break,
            End::AfterKill => {
                done_after_kill = true;
                break;
            }
            End::Cut => {}
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

/// CPU time of every pump's thread so far (ns), for the rows' cost of the players.
static PUMP_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// CPU time the pumps' threads have used so far in this process (ns).
pub fn pump_cpu_ns() -> u64 {
    PUMP_CPU_NS.load(Ordering::Relaxed)
}

/// One connection's body, from a player's thread to the pump and back.
#[derive(Debug)]
struct Leg<'a> {
    s: Stream<'a>,
    resume: Option<&'a KillClock>,
    t0: Instant,
    end_by: Instant,
    sock: TcpStream,
    pending: Vec<u8>,
    p: Played,
    cut_at: Option<Instant>,
    phases: ResumePhases,
    resumed_at: Option<Instant>,
    /// Not before this, the player's clock allows no read.
    wake_at: Option<Instant>,
    /// Its key in the pump's epoll.
    key: u64,
    /// Its socket was reported readable (or it just came): read it this pass.
    ready: bool,
}

/// How a leg ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The connection ended (EOF or error) before the window: resume or give up.
    Cut,
    /// The window was played, the limit passed, the run stopped.
    Finished,
    /// A failover round's player stopped a while after the kill.
    AfterKill,
}

type Reply<'a> = mpsc::Sender<(Leg<'a>, End)>;

/// A handle for players to give their connections' bodies to the pump.
#[derive(Clone, Debug)]
pub struct Pump<'a> {
    tx: mpsc::Sender<(Leg<'a>, Reply<'a>)>,
    wake: Arc<OwnedFd>,
}

/// The pump's side: run it on a thread of its own ([`PumpLoop::run`]).
#[derive(Debug)]
pub struct PumpLoop<'a> {
    rx: mpsc::Receiver<(Leg<'a>, Reply<'a>)>,
    wake: Arc<OwnedFd>,
}

/// A pump and its loop; the loop ends when every [`Pump`] handle is gone and its last
/// leg is done.
pub fn pump<'a>() -> io::Result<(Pump<'a>, PumpLoop<'a>)> {
    let wake = Arc::new(rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )?);
    let (tx, rx) = mpsc::channel();
    Ok((Pump { tx, wake: wake.clone() }, PumpLoop { rx, wake }))
}

impl<'a> Pump<'a> {
    /// Gives `leg` to the pump and waits for its end.
    fn carry(&self, leg: Leg<'a>) -> Option<(Leg<'a>, End)> {
        let (tx, rx) = mpsc::channel();
        self.tx.send((leg, tx)).ok()?;
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        rx.recv().ok()
    }
}

const WAKE: u64 = u64::MAX;

impl PumpLoop<'_> {
    /// Reads every leg given until the handles are gone.
    pub fn run(self) {
        // It measures: at SCHED_FIFO where permitted, as the MARS bench's players, so
        // that the servers' load does not show as their lateness (the loop's work is
        // small: a read and a compare per step; it never spins).
        let _ = crate::bench::client::measuring_thread(crate::bench::CLIENT_FIFO);
        let cpu0 = thread_cpu_ns();
        let Ok(ep) = epoll::create(epoll::CreateFlags::CLOEXEC) else { return };
        let _ = epoll::add(&ep, &*self.wake, epoll::EventData::new_u64(WAKE), epoll::EventFlags::IN);
        let mut legs: HashMap<u64, (Leg<'_>, Reply<'_>)> = HashMap::new();
        let mut next = 0u64;
        let mut open = true;
        let mut buf = vec![0u8; 1 << 20];
        let mut evs = Vec::with_capacity(256);
        let mut done: Vec<(u64, End)> = Vec::new();
        let mut sweep_at = Instant::now();
        while open || !legs.is_empty() {
            // Sleep until the earliest player's clock allows a read, at most 10 ms (the
            // limits, the run's stop and the kill clock are looked at every pass).
            let now = Instant::now();
            let wait = legs
                .values()
                .filter_map(|(l, _)| l.wake_at)
                .map(|w| w.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_millis(10))
                .min(Duration::from_millis(10));
            let t = rustix::event::Timespec { tv_sec: 0, tv_nsec: wait.as_nanos() as i64 };
            evs.clear();
            match epoll::wait(&ep, rustix::buffer::spare_capacity(&mut evs), Some(&t)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => break,
            }
            for ev in &evs {
                match ev.data.u64() {
                    WAKE => {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&*self.wake, &mut b);
                    }
                    key => {
                        if let Some((l, _)) = legs.get_mut(&key) {
                            l.ready = true;
                        }
                    }
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok((mut leg, reply)) => {
                        leg.key = next;
                        leg.ready = true;
                        let _ = leg.sock.set_nonblocking(true);
                        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT;
                        if epoll::add(&ep, &leg.sock, epoll::EventData::new_u64(next), flags).is_err() {
                            let _ = reply.send((leg, End::Cut));
                            continue;
                        }
                        legs.insert(next, (leg, reply));
                        next += 1;
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            let now = Instant::now();
            // A leg whose socket or clock says so is read; every 10 ms each of the
            // others is looked at for its end (the limit, the run's stop, the kill clock).
            let sweep = now >= sweep_at;
            if sweep {
                sweep_at = now + Duration::from_millis(10);
            }
            done.clear();
            for (&key, (leg, _)) in legs.iter_mut() {
                let due = std::mem::take(&mut leg.ready) || leg.wake_at.is_some_and(|w| w <= now);
                let end = if due {
                    serve(leg, &mut buf, &ep)
                } else if sweep {
                    ended(leg)
                } else {
                    None
                };
                if let Some(end) = end {
                    done.push((key, end));
                }
            }
            for &(key, end) in &done {
                if let Some((leg, reply)) = legs.remove(&key) {
                    let _ = epoll::delete(&ep, &leg.sock);
                    let _ = reply.send((leg, end));
                }
            }
        }
        PUMP_CPU_NS.fetch_add(thread_cpu_ns().saturating_sub(cpu0), Ordering::Relaxed);
    }
}

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A leg's end without reading: the window, the limit, the run's stop, the kill clock.
fn ended(l: &Leg<'_>) -> Option<End> {
    if l.p.received.bytes >= l.s.window || Instant::now() > l.end_by || stopped() {
        return Some(End::Finished);
    }
    // A player stops `after_kill` after the kill, unless it was on the killed node and
    // has not resumed (and played half a second more) yet.
    let (Some((at, victim)), Some(d)) = (l.resume.and_then(|k| k.lock().ok().and_then(|k| *k)), l.s.after_kill) else {
        return None;
    };
    let first = l.p.nodes.0;
    (at.elapsed() > d
        && (first != Some(victim) || l.resumed_at.is_some_and(|r| r.elapsed() > Duration::from_millis(500))))
    .then_some(End::AfterKill)
}

/// Takes `data` as the next bytes of `l`'s stream: checked against the clip, its arrival
/// marked; the first byte after a cut ends the resume's clocks.
fn take(l: &mut Leg<'_>, data: &[u8]) {
    let n = data.len().min((l.s.window - l.p.received.bytes) as usize);
    let at = l.p.received.bytes as usize;
    if l.s.expect.get(at..at + n) != Some(&data[..n]) {
        l.p.wrong = true;
    }
    if let Some(cut) = l.cut_at.take() {
        // The first byte after a cut.
        l.p.resume_ns.push(cut.elapsed().as_nanos() as u64);
        l.phases.first_byte_ns = cut.elapsed().as_nanos() as u64;
        l.resumed_at = Some(Instant::now());
        if let Some((k, _)) = l.resume.and_then(|k| k.lock().ok().and_then(|k| *k)) {
            let kill_to_resume = k.elapsed().as_nanos() as u64;
            l.p.kill_to_resume_ns.push(kill_to_resume);
            l.phases.detect_ns = kill_to_resume.saturating_sub(l.phases.first_byte_ns);
        }
        l.p.resume_phases.push(l.phases);
    }
    l.p.received.bytes += n as u64;
    l.p.received.marks.push((l.t0.elapsed().as_nanos() as u64, l.p.received.bytes));
}

/// Reads `l` as far as its player's clock allows: until the clock says wait (`wake_at`
/// set), the socket has nothing (the socket armed in `ep` again), or the leg ends.
fn serve(l: &mut Leg<'_>, buf: &mut [u8], ep: &OwnedFd) -> Option<End> {
    l.wake_at = None;
    if !l.pending.is_empty() {
        let pending = std::mem::take(&mut l.pending);
        take(l, &pending);
    }
    loop {
        if let Some(end) = ended(l) {
            return Some(end);
        }
        // The player's clock: one chunk ahead of the rate, from the first byte.
        let want = match l.p.received.marks.first() {
            Some(&(first, _)) => {
                let played = (l.t0.elapsed().as_nanos() as u64).saturating_sub(first) as f64 / 1e9;
                let allowed = (played * l.s.rate as f64) as u64 + l.s.chunk;
                // Read only once a quarter of a chunk is allowed: reading what the clock
                // allows the moment it allows it reads a few bytes per call, a spin for
                // as long as the socket holds data (what the players on threads did).
                if l.p.received.bytes + l.s.chunk / 4 > allowed {
                    let short = l.p.received.bytes + l.s.chunk / 4 - allowed;
                    let wait = Duration::from_secs_f64(short as f64 / l.s.rate.max(1) as f64);
                    l.wake_at =
                        Some(Instant::now() + wait.clamp(Duration::from_micros(500), Duration::from_millis(20)));
                    return None;
                }
                ((allowed - l.p.received.bytes) as usize).min(buf.len())
            }
            None => buf.len(),
        };
        let want = want.min((l.s.window - l.p.received.bytes) as usize);
        match l.sock.read(&mut buf[..want]) {
            Ok(0) => return Some(End::Cut),
            Ok(n) => take(l, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT;
                return epoll::modify(ep, &l.sock, epoll::EventData::new_u64(l.key), flags).err().map(|_| End::Cut);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Some(End::Cut),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// An unpaced server (as nginx's nodes): the head, then `data` as fast as TCP takes it.
    fn serve_unpaced(data: Arc<Vec<u8>>, n: usize) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for _ in 0..n {
                let Ok((mut s, _)) = l.accept() else { return };
                let data = data.clone();
                std::thread::spawn(move || {
                    let mut b = [0u8; 4096];
                    let _ = s.read(&mut b);
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
                    let _ = s.write_all(&data);
                });
            }
        });
        addr
    }

    #[test]
    fn the_pump_checks_bytes_and_waits_for_the_players_clocks_without_spinning() {
        let data: Arc<Vec<u8>> = Arc::new((0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect());
        let streams = 4;
        let addr = serve_unpaced(data.clone(), streams);
        let (pump, pump_loop) = pump().unwrap();
        let cpu0 = pump_cpu_ns();
        let t = Instant::now();
        let played: Vec<Played> = std::thread::scope(|s| {
            s.spawn(move || pump_loop.run());
            let hs: Vec<_> = (0..streams)
                .map(|_| {
                    let pump = pump.clone();
                    let data = &data;
                    s.spawn(move || {
                        let st = Stream {
                            via: Via::Front(addr),
                            clip: "c",
                            expect: &data[..],
                            offset: 0,
                            rate: 2_000_000,
                            chunk: 64 << 10,
                            window: 1_500_000,
                            limit: Duration::from_secs(60),
                            after_kill: None,
                        };
                        play(&st, None, &Mutex::new(None), &pump)
                    })
                })
                .collect();
            drop(pump);
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let wall = t.elapsed();
        let cpu = pump_cpu_ns() - cpu0;
        for p in &played {
            assert_eq!(p.error, None);
            assert_eq!(p.received.bytes, 1_500_000);
            assert!(!p.wrong);
            // Paced by its clock: 1.5 MB at 2 MB/s with 64 KiB ahead takes ~0.72 s.
            let (first, _) = p.received.marks[0];
            let (last, _) = *p.received.marks.last().unwrap();
            assert!(last - first >= 600_000_000, "read faster than the player's clock: {} ns", last - first);
        }
        // A loop that spins uses its core while it waits; CPU time only falls under load.
        assert!(cpu < wall.as_nanos() as u64 / 4, "the pump used {cpu} ns of CPU in {wall:?}");
    }

    #[test]
    fn a_wrong_byte_is_seen() {
        let mut d: Vec<u8> = (0..400_000u32).map(|i| i as u8).collect();
        let expect = d.clone();
        d[300_000] ^= 1;
        let addr = serve_unpaced(Arc::new(d), 1);
        let (pump, pump_loop) = pump().unwrap();
        let p = std::thread::scope(|s| {
            s.spawn(move || pump_loop.run());
            let st = Stream {
                via: Via::Front(addr),
                clip: "c",
                expect: &expect[..],
                offset: 0,
                rate: 4_000_000,
                chunk: 64 << 10,
                window: 400_000,
                limit: Duration::from_secs(60),
                after_kill: None,
            };
            let p = play(&st, None, &Mutex::new(None), &pump);
            drop(pump);
            p
        });
        assert_eq!(p.received.bytes, 400_000);
        assert!(p.wrong);
    }
}
