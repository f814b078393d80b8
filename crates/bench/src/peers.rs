//! The raw modern transports our IPC is measured against, and `memcpy`.
//!
//! Each transport is a ping-pong between two processes: this process is the client and
//! times every round trip; a re-executed child (see [`crate::child`]) is the echo
//! server. Per round trip the client sends `size` bytes and waits for a `reply_len`-byte
//! reply. The paper's in-line IPC server replied with a bare `KERN_SUCCESS`, so the ipc
//! experiment uses a small fixed reply; `reply_len == size` gives a true echo.
//!
//! For fairness every server touches each page it receives (one byte per 4 KiB, summed
//! into `black_box`), as the paper's receivers did.
//!
//! - **seqpacket**: an `AF_UNIX SOCK_SEQPACKET` socketpair. A record must fit the socket
//!   send buffer (~208 KiB by default), so messages go as records of at most
//!   [`CHUNK`] bytes and the receiver reads records until it has the whole message.
//! - **pipe**: two pipes, written and read in [`CHUNK`]-byte pieces (the default pipe
//!   buffer is 64 KiB, so large messages stream through it either way).
//! - **futex shm**: a shared `memfd` mapping holding a futex word and the data areas.
//!   The client copies the message in, flips the word and wakes the server; the server
//!   touches the data where it lies (no copy out: that is the point of shared memory),
//!   writes the reply and wakes the client. A waiter polls for up to 50 µs before it
//!   sleeps if the peer is on another CPU, and a waker skips `FUTEX_WAKE` when nobody
//!   sleeps, as a good low-latency implementation would.
//!
//! Servers exit on end-of-file of their channel (futex: an exit value in the word,
//! or their parent disappearing) and by `SIGKILL` when the parent dies.

use std::fs::File;
use std::hint::black_box;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::{Child, ExitStatus};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use rustix::thread::futex;

use crate::child::{fd_arg, num_arg, reap_status, spawn_child};
use crate::ipc::Transport;
use crate::stats::Throughput;

/// Largest record or write the stream peers issue at once.
pub const CHUNK: usize = 64 * 1024;
/// Page size assumed when touching received data.
pub const PAGE: usize = 4096;
/// Largest message a server accepts (a guard against a corrupt header).
pub const MAX_MESSAGE: usize = 1 << 30;
/// How long a server or client waits on a stalled peer before it checks that the peer
/// is still there.
const LIVENESS_POLL: Duration = Duration::from_millis(200);
/// How long a server gets to exit by itself once told to, before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Reads one byte per page (and the last byte) of `data` and returns their sum, so the
/// receiver really maps and reads what it received.
pub fn touch_pages(data: &[u8]) -> u64 {
    let mut sum: u64 = data.iter().step_by(PAGE).map(|&b| u64::from(b)).sum();
    if let Some(&last) = data.last() {
        sum += u64::from(last);
    }
    black_box(sum)
}

/// A message pattern that is not all zeros, so pages hold real data.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 + 1).collect()
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

fn check_sizes(size: usize, reply_len: usize) -> io::Result<()> {
    if size == 0 || reply_len == 0 {
        // A zero-length record is indistinguishable from end-of-file.
        return Err(invalid("message and reply must be at least one byte"));
    }
    if size > MAX_MESSAGE || reply_len > MAX_MESSAGE {
        return Err(invalid(format!("messages are limited to {MAX_MESSAGE} bytes")));
    }
    Ok(())
}

fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------
// Stream-like channels: seqpacket and pipes.

/// A bidirectional byte channel that moves messages in [`CHUNK`]-sized pieces.
pub trait Channel {
    /// Sends all of `data`.
    fn send_all(&mut self, data: &[u8]) -> io::Result<()>;
    /// Fills `buf`; `UnexpectedEof` if the other end closed.
    fn recv_exact(&mut self, buf: &mut [u8]) -> io::Result<()>;
}

/// One end of an `AF_UNIX SOCK_SEQPACKET` socketpair.
#[derive(Debug)]
pub struct SeqpacketChannel(OwnedFd);

impl Channel for SeqpacketChannel {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(CHUNK) {
            // NOSIGNAL: a vanished peer is an error to report, not a SIGPIPE.
            let sent = rustix::net::send(&self.0, chunk, SendFlags::NOSIGNAL)?;
            if sent != chunk.len() {
                return Err(io::Error::other("short seqpacket send"));
            }
        }
        Ok(())
    }

    fn recv_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        for chunk in buf.chunks_mut(CHUNK) {
            // The sender cut the message at the same boundaries, so each record is
            // exactly one chunk; anything else is a protocol error (a shorter buffer
            // would silently truncate a record).
            let want = chunk.len();
            let (got, full) = rustix::net::recv(&self.0, chunk, RecvFlags::TRUNC)?;
            if got == 0 && full == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if full != want {
                return Err(io::Error::other(format!("seqpacket record of {full} bytes, expected {want}")));
            }
        }
        Ok(())
    }
}

/// The read end of one pipe and the write end of another.
#[derive(Debug)]
pub struct PipeChannel {
    rx: File,
    tx: File,
}

impl Channel for PipeChannel {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(CHUNK) {
            self.tx.write_all(chunk)?;
        }
        Ok(())
    }

    fn recv_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        for chunk in buf.chunks_mut(CHUNK) {
            self.rx.read_exact(chunk)?;
        }
        Ok(())
    }
}

/// Batch header: message size and number of round trips, little-endian u64s.
fn encode_header(size: usize, iters: usize) -> [u8; 16] {
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&(size as u64).to_le_bytes());
    header[8..].copy_from_slice(&(iters as u64).to_le_bytes());
    header
}

fn decode_header(header: &[u8; 16]) -> io::Result<(usize, usize)> {
    let word = |range: std::ops::Range<usize>| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&header[range]);
        usize::try_from(u64::from_le_bytes(bytes)).map_err(|_| invalid("header value too large"))
    };
    let (size, iters) = (word(0..8)?, word(8..16)?);
    if size == 0 || size > MAX_MESSAGE {
        return Err(invalid(format!("bad message size {size}")));
    }
    Ok((size, iters))
}

/// The echo server loop: for each batch header, receive `size` bytes, touch them and
/// reply with `reply_len` bytes, `iters` times. Returns `Ok` at end-of-file.
fn echo_loop(channel: &mut impl Channel, reply_len: usize) -> io::Result<()> {
    let mut buf = pattern(reply_len);
    loop {
        let mut header = [0u8; 16];
        match channel.recv_exact(&mut header) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        let (size, iters) = decode_header(&header)?;
        if buf.len() < size {
            buf.resize(size, 0);
        }
        for _ in 0..iters {
            channel.recv_exact(&mut buf[..size])?;
            touch_pages(&buf[..size]);
            channel.send_all(&buf[..reply_len])?;
        }
    }
}

/// Exit status of a server role: end-of-file or a vanished parent mid-batch is a normal
/// way to be told to stop.
fn server_status(role: &str, result: io::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) if matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe) => 0,
        Err(e) => {
            eprintln!("{role}: {e}");
            1
        }
    }
}

/// Child role `seqpacket-echo <fd> <reply_len>`.
pub fn seqpacket_server(args: &[String]) -> i32 {
    let result = (|| {
        let fd = fd_arg(args.first().map_or("", String::as_str))?;
        let reply_len = num_arg(args, 1, "reply length")?;
        check_sizes(1, reply_len)?;
        echo_loop(&mut SeqpacketChannel(fd), reply_len)
    })();
    server_status("seqpacket-echo", result)
}

/// Child role `pipe-echo <read fd> <write fd> <reply_len>`.
pub fn pipe_server(args: &[String]) -> i32 {
    let result = (|| {
        let rx = fd_arg(args.first().map_or("", String::as_str))?;
        let tx = fd_arg(args.get(1).map_or("", String::as_str))?;
        let reply_len = num_arg(args, 2, "reply length")?;
        check_sizes(1, reply_len)?;
        echo_loop(&mut PipeChannel { rx: File::from(rx), tx: File::from(tx) }, reply_len)
    })();
    server_status("pipe-echo", result)
}

/// The client end of a ping-pong with an echo server in a child process.
#[derive(Debug)]
pub struct EchoPeer<C: Channel> {
    name: &'static str,
    description: &'static str,
    channel: Option<C>,
    child: Child,
    reply_len: usize,
    request: Vec<u8>,
    reply: Vec<u8>,
}

/// The `AF_UNIX SOCK_SEQPACKET` socketpair peer.
pub type SeqpacketPeer = EchoPeer<SeqpacketChannel>;
/// The two-pipes peer.
pub type PipePeer = EchoPeer<PipeChannel>;

impl EchoPeer<SeqpacketChannel> {
    /// Spawns a seqpacket echo server replying with `reply_len` bytes.
    pub fn spawn_seqpacket(reply_len: usize) -> io::Result<Self> {
        check_sizes(1, reply_len)?;
        let (ours, theirs) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        let args = [theirs.as_raw_fd().to_string(), reply_len.to_string()];
        let child = spawn_child("seqpacket-echo", &args, &[theirs.as_fd()])?;
        // Our copy of the server's end must go, or the server never sees end-of-file.
        drop(theirs);
        Ok(EchoPeer::new("seqpacket", "AF_UNIX SOCK_SEQPACKET socketpair", SeqpacketChannel(ours), child, reply_len))
    }
}

impl EchoPeer<PipeChannel> {
    /// Spawns a pipe echo server replying with `reply_len` bytes.
    pub fn spawn_pipe(reply_len: usize) -> io::Result<Self> {
        check_sizes(1, reply_len)?;
        let flags = rustix::pipe::PipeFlags::CLOEXEC;
        let (request_rx, request_tx) = rustix::pipe::pipe_with(flags)?;
        let (reply_rx, reply_tx) = rustix::pipe::pipe_with(flags)?;
        let args = [request_rx.as_raw_fd().to_string(), reply_tx.as_raw_fd().to_string(), reply_len.to_string()];
        let child = spawn_child("pipe-echo", &args, &[request_rx.as_fd(), reply_tx.as_fd()])?;
        drop((request_rx, reply_tx));
        Ok(EchoPeer::new(
            "pipe",
            "pipe pair",
            PipeChannel { rx: File::from(reply_rx), tx: File::from(request_tx) },
            child,
            reply_len,
        ))
    }
}

impl<C: Channel> EchoPeer<C> {
    fn new(name: &'static str, description: &'static str, channel: C, child: Child, reply_len: usize) -> Self {
        EchoPeer {
            name,
            description,
            channel: Some(channel),
            child,
            reply_len,
            request: Vec::new(),
            reply: vec![0; reply_len],
        }
    }

    fn channel(&mut self) -> io::Result<&mut C> {
        self.channel.as_mut().ok_or_else(|| io::Error::other("channel closed"))
    }

    /// One untimed round trip with the given request; returns the reply. With
    /// `reply_len == request.len()` the reply is the request echoed back.
    pub fn exchange(&mut self, request: &[u8]) -> io::Result<Vec<u8>> {
        check_sizes(request.len(), self.reply_len)?;
        let reply_len = self.reply_len;
        let channel = self.channel()?;
        channel.send_all(&encode_header(request.len(), 1))?;
        channel.send_all(request)?;
        let mut reply = vec![0; reply_len];
        channel.recv_exact(&mut reply)?;
        Ok(reply)
    }
}

impl<C: Channel> Transport for EchoPeer<C> {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        self.description
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        check_sizes(size, self.reply_len)?;
        if self.request.len() < size {
            self.request = pattern(size);
        }
        let channel = self.channel.as_mut().ok_or_else(|| io::Error::other("channel closed"))?;
        channel.send_all(&encode_header(size, iters))?;
        let mut samples = Vec::with_capacity(iters);
        for _ in 0..iters {
            let start = Instant::now();
            channel.send_all(&self.request[..size])?;
            channel.recv_exact(&mut self.reply)?;
            samples.push(elapsed_ns(start));
        }
        Ok(samples)
    }
}

impl<C: Channel> EchoPeer<C> {
    /// Stops the server by closing the channel and returns its exit status (success
    /// unless it failed or had to be killed after a second).
    pub fn shutdown(mut self) -> io::Result<ExitStatus> {
        self.stop()
    }

    fn stop(&mut self) -> io::Result<ExitStatus> {
        // Closing our end is the server's signal to exit.
        drop(self.channel.take());
        reap_status(&mut self.child, SHUTDOWN_GRACE)
    }
}

impl<C: Channel> Drop for EchoPeer<C> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

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
    crate::pin::current_cpu().and_then(|cpu| u32::try_from(cpu).ok()).unwrap_or(u32::MAX)
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

/// A shared, read-write mapping of a memfd, unmapped on drop.
#[derive(Debug)]
struct SharedMap {
    base: NonNull<u8>,
    len: usize,
}

impl SharedMap {
    fn map(fd: &OwnedFd, len: usize) -> io::Result<Self> {
        use rustix::mm::{MapFlags, ProtFlags};
        // Mapping past the end of the file would turn accesses into SIGBUS.
        let file_len = rustix::fs::fstat(fd)?.st_size;
        if u64::try_from(file_len).map_or(true, |l| l < len as u64) {
            return Err(invalid("shared memory file is smaller than its layout"));
        }
        // SAFETY: a fresh mapping chosen by the kernel (null hint) aliases no Rust
        // object; `len` bytes of the file exist (checked above).
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)?
        };
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SharedMap { base, len })
    }

    /// The 32-bit atomic at `offset` of the header page.
    fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset % 4 == 0 && offset + 4 <= PAGE.min(self.len));
        // SAFETY: the address is inside the mapping, 4-byte aligned (page-aligned base,
        // offset checked), and the mapping lives as long as `self`. Both processes
        // only ever access it atomically, which is what AtomicU32 allows through `&`.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// The 64-bit atomic at `offset` of the header page.
    fn word64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset % 8 == 0 && offset + 8 <= PAGE.min(self.len));
        // SAFETY: as for `word32`, with 8-byte alignment checked.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// Raw pointer to `len` bytes at `offset`.
    fn area(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: offset + len is within the mapping (checked above).
        unsafe { self.base.as_ptr().add(offset) }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are exactly what mmap returned and were given; no
        // reference into the mapping outlives `self` (accessors borrow `self`).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
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
    fn new(map: &'a SharedMap, side: Side) -> Self {
        let (mine, theirs) = match side {
            Side::Client => (CLIENT_CPU_OFFSET, SERVER_CPU_OFFSET),
            Side::Server => (SERVER_CPU_OFFSET, CLIENT_CPU_OFFSET),
        };
        Handshake {
            state: map.word32(STATE_OFFSET),
            sleepers: map.word32(SLEEPERS_OFFSET),
            my_cpu: map.word32(mine),
            peer_cpu: map.word32(theirs),
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

/// Child role `futex-echo <memfd> <capacity> <reply_len>`.
pub fn futex_server(args: &[String]) -> i32 {
    let result = (|| {
        let fd = fd_arg(args.first().map_or("", String::as_str))?;
        let capacity = num_arg(args, 1, "capacity")?;
        let reply_len = num_arg(args, 2, "reply length")?;
        let layout = Layout::new(capacity, reply_len)?;
        let map = SharedMap::map(&fd, layout.total)?;
        drop(fd);
        let parent = rustix::process::getppid();
        let handshake = Handshake::new(&map, Side::Server);
        let size_word = map.word64(SIZE_OFFSET);
        let request = map.area(layout.request, layout.capacity);
        let reply = map.area(layout.reply, layout.reply_len);
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
    server_status("futex-echo", result)
}

/// The client end of the futex-over-shared-memory ping-pong.
#[derive(Debug)]
pub struct FutexPeer {
    map: SharedMap,
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
        let fd = rustix::fs::memfd_create("ictus-bench-futex", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&fd, layout.total as u64)?;
        let map = SharedMap::map(&fd, layout.total)?;
        // A fresh memfd reads as zeros already; say so explicitly.
        map.word32(STATE_OFFSET).store(IDLE, Ordering::Relaxed);
        // No CPU yet: the first waits poll.
        map.word32(CLIENT_CPU_OFFSET).store(u32::MAX, Ordering::Relaxed);
        map.word32(SERVER_CPU_OFFSET).store(u32::MAX, Ordering::Relaxed);
        let args = [fd.as_raw_fd().to_string(), capacity.to_string(), reply_len.to_string()];
        let child = spawn_child("futex-echo", &args, &[fd.as_fd()])?;
        Ok(FutexPeer { map, layout, child, source: Vec::new(), reply: vec![0; reply_len] })
    }

    /// One round trip of `size` bytes from `self.source`, reply into `self.reply`.
    fn round_trip(&mut self, size: usize) -> io::Result<()> {
        let handshake = Handshake::new(&self.map, Side::Client);
        let request = self.map.area(self.layout.request, size);
        // SAFETY: `request` has room for `size` bytes (checked by `area`), `source`
        // holds at least `size`, and the server does not read the area until we post
        // REQUEST below, nor after it posted its last REPLY.
        unsafe { std::ptr::copy_nonoverlapping(self.source.as_ptr(), request, size) };
        self.map.word64(SIZE_OFFSET).store(size as u64, Ordering::Relaxed);
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
        let reply = self.map.area(self.layout.reply, self.layout.reply_len);
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

// ---------------------------------------------------------------------------------
// One-shot conveniences and memcpy.

fn one_shot(mut peer: impl Transport, size: usize, iters: usize, warmup: usize) -> io::Result<Vec<u64>> {
    if warmup > 0 {
        peer.round_trips(size, warmup)?;
    }
    peer.round_trips(size, iters)
}

/// Spawns a seqpacket echo server, runs `warmup` untimed and `iters` timed round trips
/// of `size` bytes with `reply_len`-byte replies, and returns the round-trip times (ns).
pub fn rtt_seqpacket(size: usize, reply_len: usize, iters: usize, warmup: usize) -> io::Result<Vec<u64>> {
    one_shot(SeqpacketPeer::spawn_seqpacket(reply_len)?, size, iters, warmup)
}

/// As [`rtt_seqpacket`], over two pipes.
pub fn rtt_pipe(size: usize, reply_len: usize, iters: usize, warmup: usize) -> io::Result<Vec<u64>> {
    one_shot(PipePeer::spawn_pipe(reply_len)?, size, iters, warmup)
}

/// As [`rtt_seqpacket`], with a futex over shared memory.
pub fn rtt_futex(size: usize, reply_len: usize, iters: usize, warmup: usize) -> io::Result<Vec<u64>> {
    one_shot(FutexPeer::spawn(reply_len, size)?, size, iters, warmup)
}

/// `memcpy` bandwidth (the paper's `bcopy` line) between two preallocated buffers of
/// `size` bytes, in MB/s (decimal): `repeats` runs, each copying about
/// `bytes_per_run` bytes (at least once), summarized as median, min and max.
pub fn memcpy_bandwidth(size: usize, repeats: usize, bytes_per_run: usize) -> Option<Throughput> {
    if size == 0 {
        return None;
    }
    let source = pattern(size);
    // Written once up front so page faults stay out of the timing.
    let mut destination = vec![0u8; size];
    destination.copy_from_slice(&source);
    // Capped so that tiny sizes, dominated by loop overhead, do not take seconds.
    let copies = (bytes_per_run / size).clamp(1, 1_000_000);
    let runs: Vec<f64> = (0..repeats)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..copies {
                // black_box on both sides: the source may have changed, and the
                // destination may be read, so no copy can be merged or dropped.
                destination.copy_from_slice(black_box(&source));
                black_box(&mut destination);
            }
            let ns = start.elapsed().as_nanos().max(1) as f64;
            (size * copies) as f64 / ns * 1000.0
        })
        .collect();
    Throughput::from_runs(&runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_reads_every_page_and_the_last_byte() {
        let mut data = vec![0u8; 3 * PAGE + 10];
        data[0] = 1;
        data[PAGE] = 2;
        data[2 * PAGE] = 4;
        data[3 * PAGE] = 8;
        *data.last_mut().expect("non-empty") = 16;
        assert_eq!(touch_pages(&data), 31);
        assert_eq!(touch_pages(&[]), 0);
    }

    #[test]
    fn headers_round_trip_and_reject_nonsense() {
        assert_eq!(decode_header(&encode_header(4096, 7)).expect("valid"), (4096, 7));
        assert!(decode_header(&encode_header(0, 1)).is_err());
        assert!(decode_header(&encode_header(MAX_MESSAGE + 1, 1)).is_err());
    }

    #[test]
    fn layout_is_page_aligned_and_disjoint() {
        let l = Layout::new(5000, 8).expect("valid");
        assert_eq!(l.request, PAGE);
        assert_eq!(l.reply, PAGE + 2 * PAGE);
        assert_eq!(l.total, l.reply + PAGE);
        assert!(Layout::new(0, 8).is_err());
    }

    #[test]
    fn memcpy_reports_a_positive_rate() {
        let t = memcpy_bandwidth(4096, 3, 1 << 20).expect("rates");
        assert_eq!(t.runs, 3);
        assert!(t.min > 0.0 && t.min <= t.median && t.median <= t.max);
        assert!(memcpy_bandwidth(0, 3, 1).is_none());
    }

    /// A channel over an in-process socketpair, for testing the echo loop without
    /// spawning a process.
    #[test]
    fn echo_loop_serves_batches_until_eof() {
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .expect("socketpair");
        let server = std::thread::spawn(move || echo_loop(&mut SeqpacketChannel(b), 200_000));
        let mut client = SeqpacketChannel(a);
        let message = pattern(200_000);
        client.send_all(&encode_header(message.len(), 2)).expect("header");
        for _ in 0..2 {
            client.send_all(&message).expect("send");
            let mut reply = vec![0; 200_000];
            client.recv_exact(&mut reply).expect("reply");
            assert_eq!(reply, message);
        }
        drop(client);
        server.join().expect("no panic").expect("clean exit at EOF");
    }
}
