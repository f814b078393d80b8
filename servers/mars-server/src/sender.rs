//! The download thread: full-speed downloads sent by `sendfile(2)` from the page cache
//! to non-blocking sockets, driven by `epoll` — what nginx does — while the engine's
//! Deficit Round Robin still decides when each piece may go.
//!
//! The engine hands over a **job** when DRR dispatches a download's piece: that piece
//! and the ones queued behind it (the same chain the io_uring path links, charged to the
//! class in DRR alike), with a duplicate of the connection's socket. This thread runs
//! `sendfile` on each piece until the socket's buffer is full (`EAGAIN`), waits for the
//! socket to be writable (edge-triggered `EPOLLOUT`) while it serves the other jobs,
//! and hands back one result per job through the engine's eventfd: the bytes sent and
//! whether the job ended whole, failed, or was **parked** — no byte taken by the
//! client for [`Sender::start`]'s `park` — so that a client that stops reading gives its
//! device slots back to the others (the engine waits for the socket to be writable
//! before it queues the rest in DRR again).
//!
//! Why a thread and not io_uring: `IORING_OP_SPLICE` runs in io_uring's workers, and
//! every worker request is freed through task work that wakes the submitting thread
//! (see `doc/mars.md`): two wake-ups of the engine per piece, whatever the ring's flags.
//! Here the engine wakes once per job, and the thread sleeps only when every socket it
//! serves is full — as one nginx worker does.
//!
//! The socket is made non-blocking (`O_NONBLOCK`, a flag of the open file the engine's
//! descriptor shares) for the job only, and put back before the result is handed back:
//! the engine's own sends on it never see the flag.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::epoll;
use rustix::io::Errno;

/// One piece of a job: `len` bytes at `offset` of device `dev` (an index into the
/// descriptors the thread was started with); `ahead`: bytes of the same download that
/// follow the piece contiguously on its device (as far as the engine looked: see
/// [`Device`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub dev: u16,
    pub offset: u64,
    pub len: u32,
    pub ahead: u64,
}

/// What the engine hands over: its key for the result (one key per connection), the
/// socket (a duplicate the job owns), the pieces in order.
///
/// A connection may have a second job in flight behind its first (double buffering:
/// the thread starts it the moment the first ends, without waiting for the engine).
/// Such a job says so (`after`): it runs only if the job before it of the same key
/// ended [`Outcome::Whole`], and is handed back [`Outcome::Skipped`] otherwise — its
/// bytes must never reach the socket ahead of the earlier job's unsent rest.
#[derive(Debug)]
pub(crate) struct Job {
    pub key: u64,
    pub sock: OwnedFd,
    pub pieces: Vec<Piece>,
    /// It follows an earlier job of its key that the engine has not had back yet.
    pub after: bool,
}

/// How a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every piece sent.
    Whole,
    /// The client took nothing for the park time: the rest is the engine's again.
    Parked,
    /// The socket failed (the client is gone, or the connection was shut down), or the
    /// device ended before a piece did.
    Failed,
    /// Not started: the job before it of its key did not end whole (nothing sent).
    Skipped,
}

/// A job's result: its key, the bytes sent from its first piece on, how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Done {
    pub key: u64,
    pub sent: u64,
    pub outcome: Outcome,
}

/// What the engine posts to the thread.
#[derive(Debug)]
enum Msg {
    Job(Job),
    /// The engine has had back every job of this key and the last did not end whole:
    /// the thread's note of that (kept for a job `after` it that never came) goes.
    Forget(u64),
}

struct Shared {
    inbox: Mutex<Vec<Msg>>,
    stop: AtomicBool,
}

/// The download thread; stopped and joined when dropped.
pub(crate) struct Sender {
    shared: Arc<Shared>,
    wake: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// The eventfd's key in the epoll set (jobs' keys are slab indices).
const WAKE: u64 = u64::MAX;
/// Most bytes of one `sendfile` call.
const MAX_CALL: usize = 1 << 30;

impl Sender {
    /// Starts the thread over `devices` (descriptors of the storage's devices through
    /// the page cache, owned by the thread); `done` receives each batch of results (the
    /// engine queues them and wakes itself). A job none of whose bytes the client took
    /// for `park` is handed back as [`Outcome::Parked`].
    pub(crate) fn start(
        devices: Vec<OwnedFd>,
        park: Duration,
        done: Box<dyn Fn(Vec<Done>) + Send>,
    ) -> io::Result<Sender> {
        let wake = Arc::new(rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?);
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(&ep, &*wake, epoll::EventData::new_u64(WAKE), epoll::EventFlags::IN)?;
        let devices = devices.into_iter().map(Device::new).collect();
        let shared = Arc::new(Shared { inbox: Mutex::new(Vec::new()), stop: AtomicBool::new(false) });
        let (s, w) = (Arc::clone(&shared), Arc::clone(&wake));
        let thread = std::thread::Builder::new().name("ictus-mars-dl".into()).spawn(move || {
            Loop {
                ep,
                wake: w,
                shared: s,
                devices,
                park,
                done,
                jobs: HashMap::new(),
                next: 0,
                pipes: Vec::new(),
                busy: HashSet::new(),
                waiting: HashMap::new(),
                broken: HashSet::new(),
            }
            .run()
        })?;
        Ok(Sender { shared, wake, thread: Some(thread) })
    }

    /// Hands a job over.
    pub(crate) fn submit(&self, job: Job) {
        self.post(Msg::Job(job));
    }

    /// Says that the engine has had back every job of `key` and the last one did not
    /// end whole (see [`Msg::Forget`]).
    pub(crate) fn forget(&self, key: u64) {
        self.post(Msg::Forget(key));
    }

    fn post(&self, msg: Msg) {
        let first = match self.shared.inbox.lock() {
            Ok(mut q) => {
                q.push(msg);
                q.len() == 1
            }
            Err(_) => return,
        };
        if first {
            let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Active {
    job: Job,
    piece: usize,
    at: u32,
    sent: u64,
    /// Since when the socket has been full with nothing taken.
    blocked: Option<Instant>,
    /// The socket's file status flags before the job (put back after it).
    flags: rustix::fs::OFlags,
    /// The job's pipe, and the bytes in it (filled from the device, not yet sent);
    /// none: `sendfile`.
    pipe: Option<Pipe>,
    in_pipe: usize,
}

/// A device as the thread reads it: two open file descriptions of its own, so that the
/// kernel's read-ahead never runs past a download into bytes DRR did not dispatch.
///
/// Why: the kernel's heuristic read-ahead of a description reads up to two windows
/// (`read_ahead_kb` each) beyond the position read, bounded only by the end of the
/// *file* — and a volume's component holds many clips and free space. Measured (doc/mars.md,
/// the marscpu session): every 256 MiB download through one description read 24–32 MiB
/// past the clip's end (the next clip, or the volume's free space, whose holes the kernel
/// zeroes page by page: a third of the download thread's CPU in the bench). So:
///
/// - `seq` (`POSIX_FADV_SEQUENTIAL`, as the engine's own description: twice the
///   device's window): the kernel's read-ahead, with large folios, for a piece followed
///   by at least `reach` more bytes of its download on the device;
/// - `exact` (`POSIX_FADV_RANDOM`: no heuristic read-ahead) for the rest — a download's
///   last `reach` bytes, a short range — whose pieces the thread reads ahead itself,
///   exactly, when their job arrives (`POSIX_FADV_WILLNEED`).
///
/// Where the descriptions cannot be reopened (`/proc` not mounted), there is only the
/// descriptor given, and nothing is bounded (as before).
struct Device {
    seq: OwnedFd,
    exact: Option<OwnedFd>,
    /// How far beyond a read the kernel's read-ahead of `seq` may reach: twice the
    /// device's window, and a piece.
    reach: u64,
}

impl Device {
    fn new(fd: OwnedFd) -> Device {
        let reopen = || -> io::Result<(OwnedFd, OwnedFd)> {
            use std::os::fd::AsRawFd;
            let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
            let seq = OwnedFd::from(std::fs::File::open(&path)?);
            let exact = OwnedFd::from(std::fs::File::open(&path)?);
            rustix::fs::fadvise(&seq, 0, None, rustix::fs::Advice::Sequential)?;
            rustix::fs::fadvise(&exact, 0, None, rustix::fs::Advice::Random)?;
            Ok((seq, exact))
        };
        match reopen() {
            Ok((seq, exact)) => {
                // Unknown (no block device under it: nothing to read ahead from, or a
                // file system sysfs does not name): a generous bound.
                // `POSIX_FADV_SEQUENTIAL` doubles the device's window.
                let window = 2 * read_ahead_window(&seq).unwrap_or(16 << 20);
                Device { seq, exact: Some(exact), reach: 2 * window + (1 << 20) }
            }
            Err(_) => Device { seq: fd, exact: None, reach: 0 },
        }
    }

    /// The description to fill from for `rest` bytes of a download from here on: the
    /// kernel's read-ahead only where it cannot pass the download's end.
    fn for_rest(&self, rest: u64) -> &OwnedFd {
        self.exact_for(rest).unwrap_or(&self.seq)
    }

    /// The `exact` description, where `rest` bytes of a download are filled from it
    /// (the thread reads those ahead itself).
    fn exact_for(&self, rest: u64) -> Option<&OwnedFd> {
        self.exact.as_ref().filter(|_| rest < self.reach)
    }
}

/// The kernel's read-ahead window of the block device under `fd` (`read_ahead_kb` in
/// sysfs, of the device itself or of the disk a partition is on), in bytes.
fn read_ahead_window(fd: &OwnedFd) -> Option<u64> {
    let st = rustix::fs::fstat(fd).ok()?;
    let dev = if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice {
        st.st_rdev
    } else {
        st.st_dev
    };
    let (maj, min) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    ["queue/read_ahead_kb", "../queue/read_ahead_kb"].iter().find_map(|q| {
        let s = std::fs::read_to_string(format!("/sys/dev/block/{maj}:{min}/{q}")).ok()?;
        s.trim().parse::<u64>().ok().map(|kb| kb << 10)
    })
}

struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    size: usize,
}

struct Loop {
    ep: OwnedFd,
    wake: Arc<OwnedFd>,
    shared: Arc<Shared>,
    devices: Vec<Device>,
    park: Duration,
    done: Box<dyn Fn(Vec<Done>) + Send>,
    jobs: HashMap<u64, Active>,
    next: u64,
    /// Empty pipes for the next jobs.
    pipes: Vec<Pipe>,
    /// Engine keys with a job running.
    busy: HashSet<u64>,
    /// Jobs waiting for the running job of their key.
    waiting: HashMap<u64, VecDeque<Job>>,
    /// Keys whose last job did not end whole and had no job waiting behind it: a job
    /// `after` it, still on its way, is skipped (until the engine says to forget).
    broken: HashSet<u64>,
}

impl Loop {
    fn run(mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        loop {
            let now = Instant::now();
            let timeout = self
                .jobs
                .values()
                .filter_map(|a| a.blocked)
                .min()
                .map(|t| rustix::time::Timespec::try_from((t + self.park).saturating_duration_since(now)))
                .and_then(Result::ok);
            events.clear();
            match epoll::wait(&self.ep, rustix::buffer::spare_capacity(&mut events), timeout.as_ref()) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            let mut out = Vec::new();
            for ev in &events {
                let key = ev.data.u64();
                if key == WAKE {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&*self.wake, &mut b);
                    let msgs: Vec<Msg> = match self.shared.inbox.lock() {
                        Ok(mut q) => std::mem::take(&mut *q),
                        Err(_) => Vec::new(),
                    };
                    for msg in msgs {
                        match msg {
                            Msg::Job(job) => self.arrive(job, &mut out),
                            Msg::Forget(key) => {
                                self.broken.remove(&key);
                            }
                        }
                    }
                } else {
                    self.progress(key, &mut out);
                }
            }
            // Jobs whose client took nothing for the park time go back to the engine.
            let now = Instant::now();
            let parked: Vec<u64> = self
                .jobs
                .iter()
                .filter(|(_, a)| a.blocked.is_some_and(|t| now.duration_since(t) >= self.park))
                .map(|(&k, _)| k)
                .collect();
            for k in parked {
                self.finish(k, Outcome::Parked, &mut out);
            }
            if !out.is_empty() {
                (self.done)(out);
            }
            if self.shared.stop.load(Ordering::Acquire) {
                // The engine is going: its jobs end here (it waits for none of them).
                return;
            }
        }
    }

    /// A job from the engine: run now, wait behind its key's running job, or skipped
    /// if the job before it did not end whole.
    fn arrive(&mut self, job: Job, out: &mut Vec<Done>) {
        if !job.after {
            // The engine had every earlier job of the key back before it sent this one.
            self.broken.remove(&job.key);
            self.read_ahead(&job);
            self.begin(job, out);
        } else if self.busy.contains(&job.key) {
            // Its pieces are read while the job ahead of it is sent.
            self.read_ahead(&job);
            self.waiting.entry(job.key).or_default().push_back(job);
        } else if self.broken.remove(&job.key) {
            out.push(Done { key: job.key, sent: 0, outcome: Outcome::Skipped });
        } else {
            self.read_ahead(&job);
            self.begin(job, out);
        }
    }

    /// Starts reading the job's pieces that the kernel will not read ahead (those
    /// filled from a device's `exact` description, see [`Device`]): exactly their bytes,
    /// submitted and not waited for (`POSIX_FADV_WILLNEED`), when DRR has dispatched
    /// them.
    fn read_ahead(&self, job: &Job) {
        for p in &job.pieces {
            let Some(dev) = self.devices.get(usize::from(p.dev)) else { continue };
            let exact = dev.exact_for(u64::from(p.len) + p.ahead);
            if let (Some(exact), Some(len)) = (exact, std::num::NonZeroU64::new(u64::from(p.len))) {
                let _ = rustix::fs::fadvise(exact, p.offset, Some(len), rustix::fs::Advice::WillNeed);
            }
        }
    }

    fn begin(&mut self, job: Job, out: &mut Vec<Done>) {
        self.busy.insert(job.key);
        let k = self.next;
        self.next = self.next.wrapping_add(1) % WAKE;
        let flags = rustix::fs::fcntl_getfl(&job.sock).unwrap_or(rustix::fs::OFlags::empty());
        let ok = rustix::fs::fcntl_setfl(&job.sock, flags | rustix::fs::OFlags::NONBLOCK).is_ok()
            && epoll::add(
                &self.ep,
                &job.sock,
                epoll::EventData::new_u64(k),
                epoll::EventFlags::OUT | epoll::EventFlags::ET,
            )
            .is_ok();
        let pipe = self.pipes.pop().or_else(new_pipe);
        self.jobs.insert(k, Active { job, piece: 0, at: 0, sent: 0, blocked: None, flags, pipe, in_pipe: 0 });
        if ok {
            self.progress(k, out);
        } else {
            self.finish(k, Outcome::Failed, out);
        }
    }

    /// Sends what the socket takes of the job's pieces.
    fn progress(&mut self, k: u64, out: &mut Vec<Done>) {
        let Some(a) = self.jobs.get_mut(&k) else { return };
        let outcome = loop {
            if let (Some(pipe), true) = (&a.pipe, a.in_pipe > 0) {
                // Drain what the pipe holds to the socket.
                // More of the job follows this pipeful (not the job's last bytes, which
                // must not wait in TCP for data that may never come).
                let more = a.job.pieces.get(a.piece).is_some_and(|p| a.at < p.len) || a.piece + 1 < a.job.pieces.len();
                let flags = if more { rustix::pipe::SpliceFlags::MORE } else { rustix::pipe::SpliceFlags::empty() };
                match rustix::pipe::splice(&pipe.r, None, &a.job.sock, None, a.in_pipe, flags) {
                    Ok(0) => break Outcome::Failed,
                    Ok(n) => {
                        a.in_pipe -= n;
                        a.sent += n as u64;
                        a.blocked = None;
                    }
                    Err(Errno::INTR) => {}
                    Err(Errno::AGAIN) => {
                        a.blocked.get_or_insert_with(Instant::now);
                        return;
                    }
                    Err(_) => break Outcome::Failed,
                }
                continue;
            }
            let Some(p) = a.job.pieces.get(a.piece).copied() else { break Outcome::Whole };
            let rest = p.len - a.at;
            if rest == 0 {
                a.piece += 1;
                a.at = 0;
                continue;
            }
            let Some(dev) = self.devices.get(usize::from(p.dev)) else { break Outcome::Failed };
            let dev = dev.for_rest(u64::from(rest) + p.ahead);
            let mut offset = p.offset + u64::from(a.at);
            if let Some(pipe) = &a.pipe {
                // Fill the (empty) pipe from the page cache: references, no copy.
                match rustix::pipe::splice(
                    dev,
                    Some(&mut offset),
                    &pipe.w,
                    None,
                    (rest as usize).min(pipe.size),
                    rustix::pipe::SpliceFlags::empty(),
                ) {
                    // The device ended before the piece did.
                    Ok(0) => break Outcome::Failed,
                    Ok(n) => {
                        a.at += n as u32;
                        a.in_pipe = n;
                    }
                    Err(Errno::INTR) => {}
                    Err(_) => break Outcome::Failed,
                }
                continue;
            }
            match rustix::fs::sendfile(&a.job.sock, dev, Some(&mut offset), (rest as usize).min(MAX_CALL)) {
                // The device ended before the piece did.
                Ok(0) => break Outcome::Failed,
                Ok(n) => {
                    a.at += n as u32;
                    a.sent += n as u64;
                    a.blocked = None;
                }
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => {
                    a.blocked.get_or_insert_with(Instant::now);
                    return;
                }
                Err(_) => break Outcome::Failed,
            }
        };
        self.finish(k, outcome, out);
    }

    fn finish(&mut self, k: u64, outcome: Outcome, out: &mut Vec<Done>) {
        let Some(a) = self.jobs.remove(&k) else { return };
        let _ = epoll::delete(&self.ep, &a.job.sock);
        let _ = rustix::fs::fcntl_setfl(a.job.sock.as_fd(), a.flags);
        // A pipe that still holds bytes goes with the job (they were never sent).
        if let (Some(p), 0) = (a.pipe, a.in_pipe) {
            self.pipes.push(p);
        }
        let key = a.job.key;
        self.busy.remove(&key);
        out.push(Done { key, sent: a.sent, outcome });
        let next = self.waiting.get_mut(&key).and_then(VecDeque::pop_front);
        if self.waiting.get(&key).is_some_and(VecDeque::is_empty) {
            self.waiting.remove(&key);
        }
        match next {
            // The next job of the connection goes on at once: no wake-up of the engine
            // between the two.
            Some(job) if outcome == Outcome::Whole => self.begin(job, out),
            // Its bytes would pass the earlier job's unsent rest: back, unsent, with
            // every job behind it.
            Some(job) => {
                let rest = self.waiting.remove(&key).into_iter().flatten();
                for job in std::iter::once(job).chain(rest) {
                    out.push(Done { key: job.key, sent: 0, outcome: Outcome::Skipped });
                }
            }
            None if outcome != Outcome::Whole => {
                self.broken.insert(key);
            }
            None => {}
        }
    }
}

/// A pipe of 1 MiB where allowed (`fs.pipe-max-size`); none if no descriptor is to be
/// had (the job is then sent by `sendfile`, through the kernel's own 64 KiB pipe).
fn new_pipe() -> Option<Pipe> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).ok()?;
    let _ = rustix::pipe::fcntl_setpipe_size(&w, 1 << 20);
    let size = rustix::pipe::fcntl_getpipe_size(&w).ok()?.max(4096);
    Some(Pipe { r, w, size })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::mpsc;

    /// A scratch file, removed when dropped (a failed assertion included).
    struct Scratch(std::path::PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// A scratch file of its own per call: tests run in parallel in one process, and a
    /// shared name let one test truncate (rewrite) and remove the file another test's
    /// sender was reading (its job then failed: the device ended before the piece).
    fn file(len: usize) -> (Scratch, Vec<u8>) {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let path = std::env::temp_dir().join(format!("ictus-mars-sender-{}-{n}-{len}", std::process::id()));
        std::fs::write(&path, &data).unwrap();
        (Scratch(path), data)
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (s, c)
    }

    /// Pieces are sent in order, byte for byte; a client that reads nothing gets its job
    /// parked while another job is served whole; a shut-down socket fails its job.
    #[test]
    fn pieces_in_order_parked_and_failed() {
        let (path, data) = file(16 << 20);
        let dev: OwnedFd = std::fs::File::open(&path.0).unwrap().into();
        let (tx, rx) = mpsc::channel();
        let sender = Sender::start(
            vec![dev],
            Duration::from_millis(200),
            Box::new(move |d| {
                for x in d {
                    let _ = tx.send(x);
                }
            }),
        )
        .unwrap();
        // A stalled client: 16 MiB is more than loopback's buffers hold.
        let (stalled_s, stalled_c) = pair();
        rustix::net::sockopt::set_socket_send_buffer_size(&stalled_s, 64 << 10).unwrap();
        let pieces = vec![Piece { dev: 0, offset: 0, len: 16 << 20, ahead: 0 }];
        sender.submit(Job { key: 1, sock: stalled_s.try_clone().unwrap().into(), pieces, after: false });
        // A reading client, pieces out of file order: the first filled with the kernel's
        // read-ahead (much of its download follows it), the second exactly.
        let (s, mut c) = pair();
        let pieces = vec![
            Piece { dev: 0, offset: 2 << 20, len: 100_000, ahead: 1 << 40 },
            Piece { dev: 0, offset: 5, len: 70_000, ahead: 0 },
        ];
        sender.submit(Job { key: 2, sock: s.try_clone().unwrap().into(), pieces, after: false });
        let mut got = vec![0u8; 170_000];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got[..100_000], &data[2 << 20..(2 << 20) + 100_000]);
        assert_eq!(&got[100_000..], &data[5..70_005]);
        let mut results = vec![rx.recv_timeout(Duration::from_secs(60)).unwrap()];
        results.push(rx.recv_timeout(Duration::from_secs(60)).unwrap());
        results.sort_by_key(|d| d.key);
        assert_eq!(results[1], Done { key: 2, sent: 170_000, outcome: Outcome::Whole });
        assert_eq!(results[0].outcome, Outcome::Parked);
        assert!(results[0].sent < 16 << 20, "{:?}", results[0]);
        // The socket is blocking again after the job.
        let flags = rustix::fs::fcntl_getfl(&s).unwrap();
        assert!(!flags.contains(rustix::fs::OFlags::NONBLOCK));
        // A job on a shut-down socket fails.
        stalled_s.shutdown(std::net::Shutdown::Both).unwrap();
        let pieces = vec![Piece { dev: 0, offset: 0, len: 1 << 20, ahead: 0 }];
        sender.submit(Job { key: 3, sock: stalled_s.try_clone().unwrap().into(), pieces, after: false });
        let d = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!((d.key, d.outcome), (3, Outcome::Failed));
        drop(stalled_c);
        let mut c2 = c;
        c2.write_all(b"x").unwrap();
        drop(sender);
    }

    /// Two jobs of one connection: the second starts when the first ends whole (bytes
    /// in order); behind a parked job it comes back skipped and none of its bytes reach
    /// the socket; a job `after` a parked one with nothing waiting is skipped when it
    /// comes, unless the engine said to forget.
    #[test]
    fn second_job_of_a_connection_waits_or_is_skipped() {
        let (path, data) = file(16 << 20);
        let start = |park: Duration| {
            let dev: OwnedFd = std::fs::File::open(&path.0).unwrap().into();
            let (tx, rx) = mpsc::channel();
            let sender = Sender::start(
                vec![dev],
                park,
                Box::new(move |d| {
                    for x in d {
                        let _ = tx.send(x);
                    }
                }),
            )
            .unwrap();
            (sender, rx)
        };
        // Whole, then the next: in order (a park time no load reaches).
        let (patient, rx) = start(Duration::from_secs(3600));
        let (s, mut c) = pair();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let first = vec![Piece { dev: 0, offset: 3 << 20, len: 3 << 20, ahead: 0 }];
        let second = vec![Piece { dev: 0, offset: 7, len: 2 << 20, ahead: 0 }];
        patient.submit(Job { key: 10, sock: s.try_clone().unwrap().into(), pieces: first, after: false });
        patient.submit(Job { key: 10, sock: s.try_clone().unwrap().into(), pieces: second, after: true });
        let mut got = vec![0u8; 5 << 20];
        c.read_exact(&mut got).unwrap();
        assert!(got[..3 << 20] == data[3 << 20..6 << 20]);
        assert!(got[3 << 20..] == data[7..(2 << 20) + 7]);
        let next = || rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(next(), Done { key: 10, sent: 3 << 20, outcome: Outcome::Whole });
        assert_eq!(next(), Done { key: 10, sent: 2 << 20, outcome: Outcome::Whole });
        drop(patient);
        let (sender, rx) = start(Duration::from_millis(200));
        let next = || rx.recv_timeout(Duration::from_secs(60)).unwrap();
        // Behind a parked job: skipped, nothing of it sent.
        let (s, mut c) = pair();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        rustix::net::sockopt::set_socket_send_buffer_size(&s, 64 << 10).unwrap();
        let big = vec![Piece { dev: 0, offset: 0, len: 16 << 20, ahead: 0 }];
        let marker = vec![Piece { dev: 0, offset: 9 << 20, len: 1 << 20, ahead: 0 }];
        sender.submit(Job { key: 11, sock: s.try_clone().unwrap().into(), pieces: big.clone(), after: false });
        sender.submit(Job { key: 11, sock: s.try_clone().unwrap().into(), pieces: marker.clone(), after: true });
        let a = next();
        assert_eq!((a.key, a.outcome), (11, Outcome::Parked));
        assert_eq!(next(), Done { key: 11, sent: 0, outcome: Outcome::Skipped });
        // The client reads what was sent: the first job's bytes and nothing after them.
        // Both jobs are back, so the thread writes no more to the socket: its end of
        // writing, then everything up to it (no waiting to see that nothing comes).
        let sent = a.sent as usize;
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), sent, "nothing of the skipped job was sent");
        assert!(got == data[..sent]);
        // A job `after` a parked one that had nothing waiting: skipped when it comes.
        let (s2, _c2) = pair();
        rustix::net::sockopt::set_socket_send_buffer_size(&s2, 64 << 10).unwrap();
        sender.submit(Job { key: 12, sock: s2.try_clone().unwrap().into(), pieces: big.clone(), after: false });
        assert_eq!(next().outcome, Outcome::Parked);
        sender.submit(Job { key: 12, sock: s2.try_clone().unwrap().into(), pieces: marker.clone(), after: true });
        assert_eq!(next(), Done { key: 12, sent: 0, outcome: Outcome::Skipped });
        // ... unless the engine said to forget (it had every job back).
        let (s3, mut c3) = pair();
        c3.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        rustix::net::sockopt::set_socket_send_buffer_size(&s3, 64 << 10).unwrap();
        sender.submit(Job { key: 13, sock: s3.try_clone().unwrap().into(), pieces: big, after: false });
        let parked = next();
        assert_eq!(parked.outcome, Outcome::Parked);
        sender.forget(13);
        let mut got = vec![0u8; parked.sent as usize];
        c3.read_exact(&mut got).unwrap();
        sender.submit(Job { key: 13, sock: s3.try_clone().unwrap().into(), pieces: marker, after: true });
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut b = vec![0u8; 64 << 10];
            while got.len() < 1 << 20 {
                match c3.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&b[..n]),
                }
            }
            got
        });
        // It runs (whole, or parked if this machine starved the reader for the park
        // time): what was sent is the marker's first bytes.
        let d = next();
        assert_eq!(d.key, 13);
        assert!(d.outcome != Outcome::Skipped && d.sent > 0, "{d:?}");
        let got = reader.join().unwrap();
        assert!(got.len() as u64 >= d.sent);
        assert!(got[..d.sent as usize] == data[9 << 20..(9 << 20) + d.sent as usize]);
        drop(sender);
    }
}
