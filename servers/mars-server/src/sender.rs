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

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::epoll;
use rustix::io::Errno;

/// One piece of a job: `len` bytes at `offset` of device `dev` (an index into the
/// descriptors the thread was started with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub dev: u16,
    pub offset: u64,
    pub len: u32,
}

/// What the engine hands over: its key for the result, the socket (a duplicate the job
/// owns), the pieces in order.
#[derive(Debug)]
pub(crate) struct Job {
    pub key: u64,
    pub sock: OwnedFd,
    pub pieces: Vec<Piece>,
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
}

/// A job's result: its key, the bytes sent from its first piece on, how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Done {
    pub key: u64,
    pub sent: u64,
    pub outcome: Outcome,
}

struct Shared {
    inbox: Mutex<Vec<Job>>,
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
        let shared = Arc::new(Shared { inbox: Mutex::new(Vec::new()), stop: AtomicBool::new(false) });
        let (s, w) = (Arc::clone(&shared), Arc::clone(&wake));
        let thread = std::thread::Builder::new().name("ictus-mars-dl".into()).spawn(move || {
            Loop { ep, wake: w, shared: s, devices, park, done, jobs: HashMap::new(), next: 0, pipes: Vec::new() }.run()
        })?;
        Ok(Sender { shared, wake, thread: Some(thread) })
    }

    /// Hands a job over.
    pub(crate) fn submit(&self, job: Job) {
        let first = match self.shared.inbox.lock() {
            Ok(mut q) => {
                q.push(job);
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

struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    size: usize,
}

struct Loop {
    ep: OwnedFd,
    wake: Arc<OwnedFd>,
    shared: Arc<Shared>,
    devices: Vec<OwnedFd>,
    park: Duration,
    done: Box<dyn Fn(Vec<Done>) + Send>,
    jobs: HashMap<u64, Active>,
    next: u64,
    /// Empty pipes for the next jobs.
    pipes: Vec<Pipe>,
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
                    let jobs: Vec<Job> = match self.shared.inbox.lock() {
                        Ok(mut q) => std::mem::take(&mut *q),
                        Err(_) => Vec::new(),
                    };
                    for job in jobs {
                        self.begin(job, &mut out);
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

    fn begin(&mut self, job: Job, out: &mut Vec<Done>) {
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
        out.push(Done { key: a.job.key, sent: a.sent, outcome });
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

    fn file(len: usize) -> (Scratch, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let path = std::env::temp_dir().join(format!("ictus-mars-sender-{}-{len}", std::process::id()));
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
        let pieces = vec![Piece { dev: 0, offset: 0, len: 16 << 20 }];
        sender.submit(Job { key: 1, sock: stalled_s.try_clone().unwrap().into(), pieces });
        // A reading client, pieces out of file order.
        let (s, mut c) = pair();
        let pieces = vec![Piece { dev: 0, offset: 2 << 20, len: 100_000 }, Piece { dev: 0, offset: 5, len: 70_000 }];
        sender.submit(Job { key: 2, sock: s.try_clone().unwrap().into(), pieces });
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
        let pieces = vec![Piece { dev: 0, offset: 0, len: 1 << 20 }];
        sender.submit(Job { key: 3, sock: stalled_s.try_clone().unwrap().into(), pieces });
        let d = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!((d.key, d.outcome), (3, Outcome::Failed));
        drop(stalled_c);
        let mut c2 = c;
        c2.write_all(b"x").unwrap();
        drop(sender);
    }
}
