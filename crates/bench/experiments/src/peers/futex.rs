//! A futex over a shared `memfd` mapping, the peer that stands for hand-written shared
//! memory signalling.
//!
//! The mapping holds a futex word and the data areas. The client copies the message
//! in, flips the word and wakes the server; the server touches the data where it lies
//! (no copy out: that is the point of shared memory), writes the reply and wakes the
//! client. A waiter polls for up to 50 µs before it sleeps if the peer is on another
//! CPU, and a waker skips `FUTEX_WAKE` when nobody sleeps, as a good low-latency
//! implementation would. The server exits on an exit value in the word, or when its
//! parent disappears, and by `SIGKILL` when the parent dies.

// The two processes share the data areas through raw pointers; each copy says which
// step of the handshake keeps the other side away.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ictus_bench::child::{fd_arg, num_arg, reap_status, spawn_child};
use ictus_bench::{Role, Transport};
use ictus_sys::memfd::{self, SealFlags, Size};
use ictus_sys::mm::{Mapping, Protection};
use rustix::io::Errno;
use rustix::thread::futex;

use super::{check_sizes, elapsed_ns, invalid, pattern, touch_pages, LIVENESS_POLL, PAGE, SHUTDOWN_GRACE};

// ---------------------------------------------------------------------------------
// Futex over shared memory.

/// Futex word values.
const IDLE: u32 = 0;
const REQUEST: u32 = 1;
const REPLY: u32 = 2;
const EXIT: u32 = 3;

/// How long a waiter polls the word before it sleeps in `FUTEX_WAIT`. A handover
/// between two polling processes on different CPUs takes about a hundred ns, but
/// waking a sleeping one on another CPU takes tens of µs on a VM; polling for longer
/// than that wakeup lets a pair that once fell asleep return to polling, instead of
/// paying two wakeups per round trip for ever. Bounded by time rather than by
/// iterations, because the cost of a `pause` varies tenfold between CPUs. A waiter
/// only polls when the peer last ran on another CPU: on the same CPU the peer cannot
/// run until we sleep, so polling would only add its whole length to every round trip.
const SPIN: Duration = Duration::from_micros(50);

/// Which side of the handshake a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// Where things live in the shared mapping: a header page (futex word, sleeper count,
/// message size), then the request area, then the reply area, each page-aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    request: usize,
    capacity: usize,
    reply: usize,
    reply_len: usize,
    total: usize,
}

const STATE_OFFSET: usize = 0;
const SLEEPERS_OFFSET: usize = 4;
const SIZE_OFFSET: usize = 8;
/// The CPU each side last posted from.
const CLIENT_CPU_OFFSET: usize = 16;
const SERVER_CPU_OFFSET: usize = 20;

/// The CPU the caller runs on (glibc reads it from the rseq area: no system call);
/// `u32::MAX` if unknown.
fn current_cpu() -> u32 {
    ictus_bench::pin::current_cpu().and_then(|cpu| u32::try_from(cpu).ok()).unwrap_or(u32::MAX)
}

impl Layout {
    fn new(capacity: usize, reply_len: usize) -> io::Result<Self> {
        check_sizes(capacity, reply_len)?;
        let round = |n: usize| n.div_ceil(PAGE) * PAGE;
        let request = PAGE;
        let reply = request + round(capacity);
        Ok(Layout { request, capacity, reply, reply_len, total: reply + round(reply_len) })
    }
}

/// The shared-memory handshake, used by both ends.
struct Handshake<'a> {
    state: &'a AtomicU32,
    sleepers: &'a AtomicU32,
    my_cpu: &'a AtomicU32,
    peer_cpu: &'a AtomicU32,
}

impl<'a> Handshake<'a> {
    fn new(map: &'a Mapping, side: Side) -> Self {
        let (mine, theirs) = match side {
            Side::Client => (CLIENT_CPU_OFFSET, SERVER_CPU_OFFSET),
            Side::Server => (SERVER_CPU_OFFSET, CLIENT_CPU_OFFSET),
        };
        Handshake {
            state: map.atomic_u32(STATE_OFFSET),
            sleepers: map.atomic_u32(SLEEPERS_OFFSET),
            my_cpu: map.atomic_u32(mine),
            peer_cpu: map.atomic_u32(theirs),
        }
    }

    /// Publishes `value` (releasing the data written before) and wakes the other side
    /// if it sleeps. SeqCst on the store and on the sleeper count pairs with `wait`: a
    /// waiter either sees the new value or is counted before we look.
    fn post(&self, value: u32) -> io::Result<()> {
        self.my_cpu.store(current_cpu(), Ordering::Relaxed);
        self.state.store(value, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex::wake(self.state, futex::Flags::empty(), 1)?;
        }
        Ok(())
    }

    /// Waits until the word satisfies `done`, polling first if the peer is on another
    /// CPU, then sleeping in `FUTEX_WAIT` (shared, not private: the word is in memory
    /// shared between processes). Every [`LIVENESS_POLL`] asleep, `check` may end the
    /// wait.
    fn wait(&self, done: impl Fn(u32) -> bool, mut check: impl FnMut() -> io::Result<()>) -> io::Result<u32> {
        let spin = self.peer_cpu.load(Ordering::Relaxed) != current_cpu();
        let spin_start = Instant::now();
        for k in 1usize.. {
            let value = self.state.load(Ordering::Acquire);
            if done(value) {
                return Ok(value);
            }
            std::hint::spin_loop();
            // Reading the clock costs more than a check; do it now and then.
            if !spin || (k % 16 == 0 && spin_start.elapsed() >= SPIN) {
                break;
            }
        }
        let timeout =
            futex::Timespec { tv_sec: LIVENESS_POLL.as_secs() as _, tv_nsec: LIVENESS_POLL.subsec_nanos().into() };
        loop {
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let value = self.state.load(Ordering::SeqCst);
            let result = if done(value) {
                Ok(())
            } else {
                futex::wait(self.state, futex::Flags::empty(), value, Some(&timeout))
            };
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            match result {
                Ok(()) | Err(Errno::AGAIN) | Err(Errno::INTR) => {}
                Err(Errno::TIMEDOUT) => check()?,
                Err(e) => return Err(e.into()),
            }
            let value = self.state.load(Ordering::Acquire);
            if done(value) {
                return Ok(value);
            }
        }
    }
}

/// The server's role.
pub static ROLE: Role = Role { name: "futex-echo", run: futex_server };

/// Child role `futex-echo <memfd> <capacity> <reply_len>`.
pub fn futex_server(args: &[String]) -> i32 {
    let result = (|| {
        let fd = fd_arg(args.first().map_or("", String::as_str))?;
        let capacity = num_arg(args, 1, "capacity")?;
        let reply_len = num_arg(args, 2, "reply length")?;
        let layout = Layout::new(capacity, reply_len)?;
        // The parent fixed the file's size (sealed): a mapping of it cannot fault.
        memfd::check(fd.as_fd(), Size::AtLeast(layout.total as u64), SealFlags::SHRINK)
            .map_err(|e| invalid(format!("shared memory file: {e}")))?;
        let map = Mapping::shared(fd.as_fd(), layout.total, Protection::ReadWrite)?;
        drop(fd);
        let parent = rustix::process::getppid();
        let handshake = Handshake::new(&map, Side::Server);
        let size_word = map.atomic_u64(SIZE_OFFSET);
        let request = map.ptr_at(layout.request, layout.capacity);
        let reply = map.ptr_at(layout.reply, layout.reply_len);
        loop {
            let state = handshake.wait(
                |s| s == REQUEST || s == EXIT,
                || {
                    if rustix::process::getppid() == parent {
                        Ok(())
                    } else {
                        Err(io::ErrorKind::BrokenPipe.into())
                    }
                },
            )?;
            if state == EXIT {
                return Ok(());
            }
            let size = usize::try_from(size_word.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
            if size > layout.capacity {
                return Err(invalid(format!("message of {size} bytes exceeds capacity")));
            }
            // SAFETY: `request` points at `capacity >= size` bytes of the mapping. The
            // client wrote them before posting REQUEST (our Acquire load saw it) and
            // does not write again until we post REPLY, so nothing mutates them while
            // this shared slice lives.
            let data = unsafe { std::slice::from_raw_parts(request, size) };
            touch_pages(data);
            let echoed = size.min(reply_len);
            // SAFETY: the reply area holds `reply_len >= echoed` bytes, separate from
            // the request area; the client reads it only after we post REPLY.
            unsafe { std::ptr::copy_nonoverlapping(request, reply, echoed) };
            handshake.post(REPLY)?;
        }
    })();
    super::server_status("futex-echo", result)
}

/// The client end of the futex-over-shared-memory ping-pong.
#[derive(Debug)]
pub struct FutexPeer {
    map: Mapping,
    layout: Layout,
    child: Child,
    source: Vec<u8>,
    reply: Vec<u8>,
}

impl FutexPeer {
    /// Spawns a futex echo server for messages up to `capacity` bytes, replying with
    /// `reply_len` bytes. The shared memory is an anonymous `memfd` (no `/dev/shm`
    /// names to leak); pages are only allocated as they are used.
    pub fn spawn(reply_len: usize, capacity: usize) -> io::Result<Self> {
        let layout = Layout::new(capacity, reply_len)?;
        let fd = memfd::create("ictus-bench-futex", layout.total as u64)?;
        // A fixed size: the server can check that its mapping cannot fault.
        memfd::add_seals(fd.as_fd(), SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Mapping::shared(fd.as_fd(), layout.total, Protection::ReadWrite)?;
        // A fresh memfd reads as zeros already; say so explicitly.
        map.atomic_u32(STATE_OFFSET).store(IDLE, Ordering::Relaxed);
        // No CPU yet: the first waits poll.
        map.atomic_u32(CLIENT_CPU_OFFSET).store(u32::MAX, Ordering::Relaxed);
        map.atomic_u32(SERVER_CPU_OFFSET).store(u32::MAX, Ordering::Relaxed);
        let args = [fd.as_raw_fd().to_string(), capacity.to_string(), reply_len.to_string()];
        let child = spawn_child(&ROLE, &args, &[fd.as_fd()])?;
        Ok(FutexPeer { map, layout, child, source: Vec::new(), reply: vec![0; reply_len] })
    }

    /// One round trip of `size` bytes from `self.source`, reply into `self.reply`.
    fn round_trip(&mut self, size: usize) -> io::Result<()> {
        let handshake = Handshake::new(&self.map, Side::Client);
        let request = self.map.ptr_at(self.layout.request, size);
        // SAFETY: `request` has room for `size` bytes (checked by `area`), `source`
        // holds at least `size`, and the server does not read the area until we post
        // REQUEST below, nor after it posted its last REPLY.
        unsafe { std::ptr::copy_nonoverlapping(self.source.as_ptr(), request, size) };
        self.map.atomic_u64(SIZE_OFFSET).store(size as u64, Ordering::Relaxed);
        handshake.post(REQUEST)?;
        let child = &mut self.child;
        handshake.wait(
            |s| s == REPLY,
            || match child.try_wait() {
                Ok(None) => Ok(()),
                Ok(Some(status)) => Err(io::Error::other(format!("futex server exited: {status}"))),
                Err(e) => Err(e),
            },
        )?;
        let reply = self.map.ptr_at(self.layout.reply, self.layout.reply_len);
        // SAFETY: the reply area holds `reply_len` bytes, the server wrote them before
        // posting REPLY (our Acquire load saw it) and writes again only after our next
        // REQUEST; `self.reply` is a separate local buffer of `reply_len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(reply, self.reply.as_mut_ptr(), self.layout.reply_len) };
        Ok(())
    }

    fn prepare(&mut self, size: usize) -> io::Result<()> {
        check_sizes(size, self.layout.reply_len)?;
        if size > self.layout.capacity {
            return Err(invalid(format!("{size} bytes exceed the shared area of {} bytes", self.layout.capacity)));
        }
        if self.source.len() < size {
            self.source = pattern(size);
        }
        Ok(())
    }

    /// One untimed round trip with the given request; returns the reply (the first
    /// `reply_len` bytes of the request if it is at least that long).
    pub fn exchange(&mut self, request: &[u8]) -> io::Result<Vec<u8>> {
        self.prepare(request.len())?;
        self.source[..request.len()].copy_from_slice(request);
        self.round_trip(request.len())?;
        Ok(self.reply.clone())
    }
}

impl Transport for FutexPeer {
    fn name(&self) -> &str {
        "futex shm"
    }

    fn description(&self) -> &str {
        "futex over a shared memfd"
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        self.prepare(size)?;
        let mut samples = Vec::with_capacity(iters);
        for _ in 0..iters {
            let start = Instant::now();
            self.round_trip(size)?;
            samples.push(elapsed_ns(start));
        }
        Ok(samples)
    }
}

impl FutexPeer {
    /// Stops the server by posting the exit value and returns its exit status
    /// (success unless it failed or had to be killed after a second).
    pub fn shutdown(mut self) -> io::Result<ExitStatus> {
        self.stop()
    }

    fn stop(&mut self) -> io::Result<ExitStatus> {
        Handshake::new(&self.map, Side::Client).post(EXIT)?;
        reap_status(&mut self.child, SHUTDOWN_GRACE)
    }
}

impl Drop for FutexPeer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_page_aligned_and_disjoint() {
        let l = Layout::new(5000, 8).expect("valid");
        assert_eq!(l.request, PAGE);
        assert_eq!(l.reply, PAGE + 2 * PAGE);
        assert_eq!(l.total, l.reply + PAGE);
        assert!(Layout::new(0, 8).is_err());
    }
}
