//! The output library: the paper's `libmtmidi` (000 §4.2) in Rust form.
//!
//! [`Output::open`] takes a [`Device`] and starts a timer thread (or one on each CPU
//! asked for, see below) and a byte sender:
//!
//! - the **timer thread** serves the *timed queue*: it sleeps until the head message is
//!   due (`clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`, see
//!   [`crate::device::sleep_until`]), then, when the byte sender is idle and nothing is
//!   waiting for it, writes the due messages itself, **all of them in one non-blocking
//!   write** (up to [`BATCH_MAX`] bytes a write: a chord of 256 notes is one write and,
//!   on a cable, one wake-up of the receiver). A message goes out one thread wake-up
//!   after its time, not two: the paper's timer thread signalled its sender every time,
//!   and that second switch was most of the lateness measured by `ictus bench midi`.
//!   Whatever the device does not take at once it leaves to the byte sender, and
//!   signals it. With the timed queue empty it waits on a condition variable for
//!   [`Output::put`];
//! - the **byte sender** serves the *immediate queue*: it writes what is waiting there,
//!   as many messages a write as fit in [`BATCH_MAX`] bytes; when the device is full
//!   (`WouldBlock`) it **waits for the device to become writable**
//!   ([`Device::wait_writable`]: `POLLOUT` on a raw MIDI device or serial port, the
//!   ring's wake-up on a cable), never a fixed sleep. (The paper slept "a few
//!   milliseconds", since the MPU-401 gave no interrupt when its output buffer emptied;
//!   the 1 ms sleep this library had before made a 229-event instant arrive over 20 ms.)
//!
//! Nothing is dropped without being counted ([`OutputStats`]): messages refused by a
//! failing device (`write_errors`), discarded on close (`discarded`); a device's own
//! losses (a cable nobody receives) are in [`Device::lost_bytes`].
//!
//! [`Output::put`] with a time that has already come (a *late* message) or that is
//! earlier than the last message in the timed queue (an *out-of-order* message) puts it
//! straight into the immediate queue, as the paper does: the timed queue is a FIFO in
//! time order, never searched or sorted, so a put costs O(1) under the lock. Both cases
//! are counted in [`OutputStats`].
//!
//! [`Output::close`] with [`Close::Drain`] lets every queued message go out at its time
//! and then ends the threads (waiting for the device as long as it takes: a receiver that
//! never reads holds a drain up); with [`Close::Discard`] nothing that has not started to
//! go out is sent (a message already partly written is finished, so the line is never
//! left in the middle of a message, unless the device takes nothing more for a second).
//! Either way the threads are joined: none outlives the `Output`, and dropping an
//! `Output` without closing it discards.
//!
//! Both threads ask for [`OutputOptions::thread`] (by default `SCHED_FIFO` 70 and 1 ns
//! of timer slack) through [`ictus_rt::thread::configure_current_thread`], which never
//! fails: what the system refused is reported once on standard error and in
//! [`Output::granted`].
//!
//! With [`OutputOptions::timer_cpus`] there is a timer thread pinned to each of those
//! CPUs, racing for each due message, so that a CPU stopped by a virtual machine's host
//! (or busy in a kernel section that does not preempt) at a message's time does not
//! delay it. The queue's lock inherits priority ([`ictus_rt::sync::PiMutex`]): a
//! program's timesharing thread preempted inside [`Output::put`] runs at the priority of
//! an output thread waiting for it (the inversion the paper met in C-Threads, 000 §5).
//!
//! # Nothing to wait for on the way out
//!
//! Once warm, the timer thread's path from its wake-up to the device allocates nothing
//! (the due messages and the encoded bytes go through buffers kept between wake-ups),
//! wakes the byte sender only when it has something to do (counted in
//! [`OutputStats::handed_off`]), and each thread touches 64 KiB of its stack when it
//! starts, so the first message due does not wait for page faults. Locking the memory
//! is the host program's choice, for the whole process (`ThreadRequest::lock_memory` in
//! [`OutputOptions::thread`]; see `ictus_rt::thread`): `ictus bench midi` does.
//!
//! # Waking the timer thread on close
//!
//! The paper's timer thread checks whether its `mi_id` was closed each time it wakes.
//! Here it sleeps at most [`CLOSE_POLL`] at a time, so a close is seen within that even
//! when the head of the queue is minutes away; the last sleep before a message is still
//! one absolute sleep to its exact time. (Interrupting `clock_nanosleep` with a signal
//! was rejected: a library must not take a signal from its host program.)

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_rt::sync::{PiCondvar, PiMutex, PiMutexGuard};
use ictus_rt::thread::{configure_current_thread, Granted, Policy, ThreadRequest};
use ictus_rt::Time;

use crate::device::{sleep_until, Device};
use crate::parse::{Encoder, Message};

/// The longest the timer thread sleeps before looking whether the output was closed.
pub const CLOSE_POLL: Duration = Duration::from_millis(50);

/// The most bytes the output library writes in one write: an ALSA raw MIDI device's
/// default buffer, and the most a cable takes whole ([`crate::device::cable::MAX_WRITE`]).
/// A message longer than this (a long sysex) is written alone, in as many writes as the
/// device needs.
pub const BATCH_MAX: usize = 4096;

/// How long a close that discards waits for a device that takes nothing before it gives
/// up a message already partly written.
const DISCARD_PATIENCE: Duration = Duration::from_secs(1);

/// Stack each output thread touches when it starts, so that the pages its deepest calls
/// use are mapped before the first message is due (and stay mapped where the process
/// has locked its memory).
const STACK_PREFAULT: usize = 64 * 1024;

/// How an [`Output`] runs.
#[derive(Clone, Debug)]
pub struct OutputOptions {
    /// What both output threads ask of the scheduler (default: `SCHED_FIFO` 70, timer
    /// slack 1 ns; refused parts are reported, never fatal).
    pub thread: ThreadRequest,
    /// The most messages queued (timed and immediate together); beyond, `put` fails.
    pub max_queued: usize,
    /// Leave out repeated channel status bytes (running status).
    pub running_status: bool,
    /// Run one timer thread on each of these CPUs (each pinned to its own), all
    /// sleeping until the head message is due and racing for it: on a virtual machine
    /// whose host stops one virtual CPU for milliseconds now and then, or on a CPU busy
    /// in a kernel section that does not preempt, a message due meanwhile goes out from
    /// another. The first to take the queue's lock writes; order and once-only delivery
    /// are kept by the lock and the `sending` flag, as with one timer thread. It costs a
    /// wake-up per CPU per due time. Empty (the default): one timer thread, placed as
    /// [`OutputOptions::thread`] says. A deadline thread cannot be pinned (the kernel
    /// wants it to span its root domain): with a deadline policy the pinning is refused
    /// and reported, and the threads run unpinned.
    pub timer_cpus: Vec<usize>,
}

impl Default for OutputOptions {
    fn default() -> OutputOptions {
        OutputOptions {
            thread: ThreadRequest {
                policy: Some(Policy::Fifo { priority: 70 }),
                timer_slack: Some(Duration::from_nanos(1)),
                ..ThreadRequest::default()
            },
            max_queued: 1 << 20,
            running_status: false,
            timer_cpus: Vec::new(),
        }
    }
}

impl OutputOptions {
    /// The defaults, but timesharing: for tests and for programs that must not ask for
    /// real-time priority.
    pub fn timesharing() -> OutputOptions {
        OutputOptions { thread: ThreadRequest::default(), ..OutputOptions::default() }
    }

    /// These options with a timer thread on every CPU the calling thread may run on
    /// (see [`OutputOptions::timer_cpus`]); unchanged where that set cannot be read.
    pub fn with_timer_per_cpu(self) -> OutputOptions {
        let timer_cpus = ictus_rt::thread::current_affinity().unwrap_or(self.timer_cpus);
        OutputOptions { timer_cpus, ..self }
    }
}

/// How to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    /// Send everything queued, each message at its time, then stop.
    Drain,
    /// Send nothing more (but finish a message already partly written), then stop.
    Discard,
}

/// Where [`Output::put`] placed a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In the timed queue, to go out at its time.
    Timed,
    /// In the immediate queue: its time had come (`late` if it had passed).
    Immediate {
        /// Its time was already in the past.
        late: bool,
    },
    /// In the immediate queue because it was earlier than the last timed message.
    OutOfOrder,
}

/// Why [`Output::put`] refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PutError {
    /// The output is closing or closed.
    #[error("the MIDI output is closed")]
    Closed,
    /// The queues hold [`OutputOptions::max_queued`] messages already.
    #[error("the MIDI output queues are full ({0} messages)")]
    Full(usize),
}

/// Why [`Output::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A thread could not be started.
    #[error("starting the MIDI output threads: {0}")]
    Spawn(#[source] io::Error),
}

/// Counts kept by an [`Output`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputStats {
    /// Messages accepted by `put`.
    pub put: u64,
    /// Of those, put in the timed queue.
    pub timed: u64,
    /// Put in the immediate queue because their time had passed.
    pub late: u64,
    /// Put in the immediate queue because they were earlier than the last timed message.
    pub out_of_order: u64,
    /// Messages written completely.
    pub sent: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Times a write found the device full (`WouldBlock`) and the output waited for it.
    pub full_retries: u64,
    /// Messages dropped by [`Close::Discard`] (or by dropping the `Output`).
    pub discarded: u64,
    /// Messages dropped because the device failed (each counted, whether it was alone
    /// in its write or one of a chord).
    pub write_errors: u64,
    /// Writes made (each carrying one or more messages).
    pub writes: u64,
    /// Due messages the timer thread handed to the byte sender (because the sender was
    /// busy, messages were waiting for it, or the device was full) instead of writing
    /// them itself.
    pub handed_off: u64,
    /// The last device error, in words.
    pub last_error: Option<String>,
}

#[derive(Debug)]
struct Queued {
    at: Time,
    message: Message,
}

#[derive(Debug, Default)]
struct State {
    timed: VecDeque<Queued>,
    immediate: VecDeque<Message>,
    closing: Option<Close>,
    /// Timer threads still running.
    timers: usize,
    /// A thread (the byte sender, or the timer thread writing due messages itself) is
    /// writing to the device; the other keeps off, which keeps the bytes in order.
    sending: bool,
    /// The writer holds encoded bytes not yet written (the rest of a write the device
    /// did not take whole), for the byte sender to finish before anything else.
    partial: bool,
    stats: OutputStats,
    granted: Vec<(&'static str, Granted)>,
}

#[derive(Debug)]
struct Shared {
    /// Priority-inheriting: a timesharing program thread that `put`s while holding it
    /// runs at the priority of a real-time output thread waiting for it (the paper's
    /// priority inversion in C-Threads' locks, 000 §5).
    state: PiMutex<State>,
    /// Signalled when the timed queue gains a message or the output closes.
    timed_changed: PiCondvar,
    /// Signalled when the immediate queue gains a message or the output closes.
    immediate_changed: PiCondvar,
    /// Signalled when a thread has recorded what the scheduler granted it.
    granted_changed: PiCondvar,
    /// Set by `close(Discard)`: read by the sender between retries without the lock.
    discard: AtomicBool,
    /// The device and what writing to it needs. Taken by whichever thread `sending`
    /// names; never held while `state` is being waited for.
    writer: Mutex<Writer>,
}

/// The device side of an output, shared by the two threads (one at a time).
struct Writer {
    device: Option<Box<dyn Device>>,
    encoder: Encoder,
    /// Encoded bytes of one or more messages; `out[off..]` is not written yet. Kept
    /// between writes, so that the timer thread's path allocates nothing once warm.
    out: Vec<u8>,
    off: usize,
    /// Where each message in `out` ends, for those not written to their end yet.
    ends: VecDeque<usize>,
    /// Where the last message written to its end ended (where the first of `ends` starts).
    done: usize,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("unwritten", &(self.out.len() - self.off))
            .field("messages", &self.ends.len())
            .finish()
    }
}

/// What one write did.
#[derive(Debug, Default)]
struct Wrote {
    /// Messages written to their end.
    sent: u64,
    bytes: u64,
    /// The device answered `WouldBlock` (nothing taken).
    full: bool,
    /// The device failed: the messages of the write were dropped (how many, why).
    failed: Option<(u64, String)>,
}

impl Writer {
    /// Whether encoded bytes wait to be written.
    fn busy(&self) -> bool {
        self.off < self.out.len()
    }

    /// Encode messages from the front of `from` into the (empty) buffer: at least one,
    /// then as many as fit in [`BATCH_MAX`] bytes.
    fn fill(&mut self, from: &mut VecDeque<Message>) {
        debug_assert!(!self.busy());
        self.out.clear();
        self.off = 0;
        self.done = 0;
        self.ends.clear();
        while let Some(m) = from.front() {
            if !self.out.is_empty() && self.out.len() + m.bytes().len() > BATCH_MAX {
                break;
            }
            if let Some(m) = from.pop_front() {
                self.encoder.encode(&m, &mut self.out);
                self.ends.push_back(self.out.len());
            }
        }
    }

    /// One non-blocking write of what waits.
    fn write_once(&mut self) -> Wrote {
        let mut w = Wrote::default();
        let Writer { device, out, off, ends, done, .. } = self;
        let Some(device) = device.as_mut() else { return w };
        if *off >= out.len() {
            return w;
        }
        match device.write(&out[*off..]) {
            Ok(n) => {
                *off += n;
                w.bytes = n as u64;
                while let Some(e) = ends.front().copied().filter(|&e| e <= *off) {
                    ends.pop_front();
                    *done = e;
                    w.sent += 1;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => w.full = true,
            Err(e) => {
                w.failed = Some((ends.len() as u64, format!("{}: {e}", device.describe())));
                self.drop_unwritten();
            }
        }
        w
    }

    /// Drop every message not written to its end; how many. The message partly on the
    /// line, if any, is cut: the encoder forgets its running status.
    fn drop_unwritten(&mut self) -> u64 {
        let n = self.ends.len() as u64;
        self.ends.clear();
        self.out.clear();
        self.off = 0;
        self.done = 0;
        self.encoder.reset();
        n
    }

    /// Drop the messages not yet started, keeping the one partly on the line (if any);
    /// how many were dropped.
    fn drop_unstarted(&mut self) -> u64 {
        let started = self.off > self.done;
        let keep = usize::from(started && self.off < self.out.len());
        let dropped = self.ends.len().saturating_sub(keep) as u64;
        if dropped > 0 {
            if keep == 1 {
                let end = self.ends[0];
                self.ends.truncate(1);
                self.out.truncate(end);
            } else {
                self.ends.clear();
                self.out.clear();
                self.off = 0;
                self.done = 0;
            }
            self.encoder.reset();
        }
        dropped
    }
}

impl Wrote {
    fn count(&self, stats: &mut OutputStats) {
        stats.sent += self.sent;
        stats.bytes += self.bytes;
        stats.writes += u64::from(self.bytes > 0);
        if self.full {
            stats.full_retries += 1;
        }
        if let Some((n, why)) = &self.failed {
            stats.write_errors += n;
            stats.last_error = Some(why.clone());
        }
    }
}

impl Shared {
    fn lock(&self) -> PiMutexGuard<'_, State> {
        // Not poisoned: a panic in one of our threads must not take the host program
        // down with it.
        self.state.lock()
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What [`Output::close`] gives back.
#[derive(Debug)]
pub struct Closed {
    /// The final counts.
    pub stats: OutputStats,
    /// The device, for the caller to reuse or inspect (`None` only if the sender
    /// thread panicked).
    pub device: Option<Box<dyn Device>>,
}

/// An open MIDI output (the paper's `mi_id`, output side). See the module documentation.
pub struct Output {
    id: u64,
    shared: Arc<Shared>,
    timers: Vec<JoinHandle<()>>,
    sender: Option<JoinHandle<Box<dyn Device>>>,
    describe: String,
    max_queued: usize,
}

impl fmt::Debug for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Output").field("id", &self.id).field("device", &self.describe).finish_non_exhaustive()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Output {
    /// Start the output threads on `device`.
    pub fn open(device: Box<dyn Device>, options: OutputOptions) -> Result<Output, OpenError> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let describe = device.describe();
        let shared = Arc::new(Shared {
            state: PiMutex::new(State::default()),
            timed_changed: PiCondvar::new(),
            immediate_changed: PiCondvar::new(),
            granted_changed: PiCondvar::new(),
            discard: AtomicBool::new(false),
            writer: Mutex::new(Writer {
                device: Some(device),
                encoder: if options.running_status { Encoder::with_running_status() } else { Encoder::new() },
                out: Vec::with_capacity(BATCH_MAX),
                off: 0,
                ends: VecDeque::with_capacity(BATCH_MAX / 2),
                done: 0,
            }),
        });
        // One timer thread, or one pinned to each CPU asked for.
        let placements: Vec<Option<usize>> = if options.timer_cpus.is_empty() {
            vec![None]
        } else {
            options.timer_cpus.iter().copied().map(Some).collect()
        };
        shared.lock().timers = placements.len();
        let mut timers = Vec::with_capacity(placements.len());
        let mut spawned = Ok(());
        for (i, cpu) in placements.iter().enumerate() {
            let mine = Arc::clone(&shared);
            let mut req = options.thread.clone();
            if let Some(cpu) = cpu {
                req.cpus = Some(vec![*cpu]);
            }
            let role = if i == 0 { "timer".to_string() } else { format!("timer{i}") };
            match std::thread::Builder::new()
                .name(Output::thread_name(id, &role))
                .spawn(move || timer_thread(&mine, &req))
            {
                Ok(t) => timers.push(t),
                Err(e) => {
                    shared.lock().timers -= placements.len() - i;
                    spawned = Err(e);
                    break;
                }
            }
        }
        let sender = spawned.and_then(|()| {
            let shared = Arc::clone(&shared);
            let opts = options.clone();
            std::thread::Builder::new()
                .name(Output::thread_name(id, "send"))
                .spawn(move || sender_thread(&shared, &opts))
        });
        let sender = match sender {
            Ok(s) => s,
            Err(e) => {
                {
                    let mut st = shared.lock();
                    st.closing = Some(Close::Discard);
                }
                shared.discard.store(true, Ordering::SeqCst);
                shared.timed_changed.notify_all();
                for t in timers {
                    let _ = t.join();
                }
                return Err(OpenError::Spawn(e));
            }
        };
        Ok(Output { id, shared, timers, sender: Some(sender), describe, max_queued: options.max_queued })
    }

    /// This output's number in the process (its threads are named `mo<ID>-timer` and
    /// `mo<ID>-send`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The name of one of this output's threads (`role` is `timer` or `send`).
    pub fn thread_name(id: u64, role: &str) -> String {
        format!("mo{id}-{role}")
    }

    /// The device, in words.
    pub fn device(&self) -> &str {
        &self.describe
    }

    /// Queue `message` to be sent at `at` (`CLOCK_MONOTONIC`, see
    /// [`ictus_rt::clock::now`]). The message's own time is ignored.
    pub fn put(&self, message: Message, at: Time) -> Result<Placement, PutError> {
        self.enqueue(message, Some(at))
    }

    /// Queue `message` to be sent at once (not counted as late).
    pub fn put_now(&self, message: Message) -> Result<Placement, PutError> {
        self.enqueue(message, None)
    }

    fn enqueue(&self, message: Message, at: Option<Time>) -> Result<Placement, PutError> {
        let mut st = self.shared.lock();
        if st.closing.is_some() {
            return Err(PutError::Closed);
        }
        let queued = st.timed.len() + st.immediate.len();
        if queued >= self.max_queued {
            return Err(PutError::Full(queued));
        }
        st.stats.put += 1;
        let now = ictus_rt::clock::now();
        let at = at.unwrap_or(now);
        let placement = if at <= now {
            if at < now {
                st.stats.late += 1;
            }
            Placement::Immediate { late: at < now }
        } else if st.timed.back().is_some_and(|last| at < last.at) {
            st.stats.out_of_order += 1;
            Placement::OutOfOrder
        } else {
            Placement::Timed
        };
        if placement == Placement::Timed {
            st.stats.timed += 1;
            let was_empty = st.timed.is_empty();
            st.timed.push_back(Queued { at, message });
            drop(st);
            if was_empty {
                // Every timer thread races for it.
                self.shared.timed_changed.notify_all();
            }
        } else {
            st.immediate.push_back(message);
            drop(st);
            self.shared.immediate_changed.notify_one();
        }
        Ok(placement)
    }

    /// The counts so far.
    pub fn stats(&self) -> OutputStats {
        self.shared.lock().stats.clone()
    }

    /// Messages queued and not yet written.
    pub fn queued(&self) -> usize {
        let st = self.shared.lock();
        st.timed.len() + st.immediate.len()
    }

    /// What the scheduler granted each thread (`("timer", …)` for each timer thread,
    /// `("send", …)`), waiting until all have started.
    pub fn granted(&self) -> Vec<(&'static str, Granted)> {
        // Every timer thread and the sender record what they were granted.
        let threads = self.timers.len() + 1;
        let mut st = self.shared.lock();
        while st.granted.len() < threads && !(st.timers == 0 && st.closing.is_some()) {
            st = self.shared.granted_changed.wait(st);
        }
        st.granted.clone()
    }

    /// Close: drain or discard what is queued (see [`Close`]), end and join both
    /// threads, and give back the device and the final counts.
    pub fn close(mut self, how: Close) -> Closed {
        self.shutdown(how)
    }

    fn shutdown(&mut self, how: Close) -> Closed {
        {
            let mut st = self.shared.lock();
            st.closing = Some(how);
            if how == Close::Discard {
                self.shared.discard.store(true, Ordering::SeqCst);
            }
        }
        self.shared.timed_changed.notify_all();
        self.shared.immediate_changed.notify_all();
        for t in self.timers.drain(..) {
            let _ = t.join();
        }
        let device = self.sender.take().map(|s| s.join());
        let mut st = self.shared.lock();
        let left = (st.timed.len() + st.immediate.len()) as u64;
        st.stats.discarded += left;
        st.timed.clear();
        st.immediate.clear();
        let stats = st.stats.clone();
        drop(st);
        Closed { stats, device: device.and_then(Result::ok) }
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.timers.is_empty() || self.sender.is_some() {
            self.shutdown(Close::Discard);
        }
    }
}

/// Touch [`STACK_PREFAULT`] bytes of the calling thread's stack (see there).
#[inline(never)]
fn prefault_stack() {
    let mut block = [0u8; STACK_PREFAULT];
    std::hint::black_box(&mut block);
}

fn record_granted(shared: &Shared, role: &'static str, req: &ThreadRequest) {
    let g = configure_current_thread(req);
    prefault_stack();
    shared.lock().granted.push((role, g));
    shared.granted_changed.notify_all();
}

fn timer_thread(shared: &Shared, req: &ThreadRequest) {
    record_granted(shared, "timer", req);
    // Due messages on their way out; kept between wake-ups, so allocated once.
    let mut due: VecDeque<Message> = VecDeque::with_capacity(16);
    let mut st = shared.lock();
    loop {
        if st.closing == Some(Close::Discard) {
            break;
        }
        let Some(head) = st.timed.front().map(|q| q.at) else {
            if st.closing.is_some() {
                break;
            }
            st = shared.timed_changed.wait(st);
            continue;
        };
        let now = ictus_rt::clock::now();
        if head <= now {
            while st.timed.front().is_some_and(|q| q.at <= now) {
                if let Some(q) = st.timed.pop_front() {
                    due.push_back(q.message);
                }
            }
            if st.immediate.is_empty() && !st.sending && !st.partial {
                // Nothing is waiting for the byte sender and it is idle: write the due
                // messages from here, saving the sender's wake-up (a second thread
                // switch per message, the largest part of the lateness).
                st.sending = true;
                drop(st);
                write_due(shared, &mut due);
                st = shared.lock();
                st.sending = false;
                // What the device did not take goes first to the sender, before anything
                // put in the immediate queue meanwhile.
                st.stats.handed_off += due.len() as u64;
                while let Some(m) = due.pop_back() {
                    st.immediate.push_front(m);
                }
            } else {
                st.stats.handed_off += due.len() as u64;
                st.immediate.extend(due.drain(..));
            }
            // The sender is woken only when it has something to do.
            if st.partial || !st.immediate.is_empty() {
                shared.immediate_changed.notify_one();
            }
            continue;
        }
        let wake = head.min(now + CLOSE_POLL);
        drop(st);
        sleep_until(wake);
        st = shared.lock();
    }
    st.timers -= 1;
    drop(st);
    shared.immediate_changed.notify_all();
    shared.granted_changed.notify_all();
}

/// The timer thread's direct path: the due messages in as few writes as the device
/// allows — one, for up to [`BATCH_MAX`] bytes — none of them blocking. What the device
/// does not take stays in the writer for the byte sender (`partial`), and messages not
/// yet encoded stay in `due`, to go to the front of the immediate queue.
fn write_due(shared: &Shared, due: &mut VecDeque<Message>) {
    let mut w = shared.writer();
    let mut total = Wrote::default();
    while !due.is_empty() && !w.busy() {
        w.fill(due);
        let wrote = w.write_once();
        total.sent += wrote.sent;
        total.bytes += wrote.bytes;
        let stop = wrote.full || wrote.failed.is_some();
        let mut st = shared.lock();
        wrote.count(&mut st.stats);
        drop(st);
        if stop {
            break;
        }
    }
    let partial = w.busy();
    drop(w);
    shared.lock().partial = partial;
}

fn sender_thread(shared: &Shared, opts: &OutputOptions) -> Box<dyn Device> {
    record_granted(shared, "send", &opts.thread);
    let give_back = || shared.writer().device.take().expect("the sender hands the device back once");
    // Messages taken from the immediate queue for one write; kept between writes.
    let mut batch: VecDeque<Message> = VecDeque::with_capacity(64);
    loop {
        {
            let mut st = shared.lock();
            loop {
                if st.closing == Some(Close::Discard) && !st.sending {
                    return give_back();
                }
                if !st.sending {
                    if st.partial {
                        st.sending = true;
                        break;
                    }
                    if !st.immediate.is_empty() {
                        // As many as one write carries (their encoded size is at most
                        // their own, running status only shortens it).
                        let mut bytes = 0;
                        while let Some(m) = st.immediate.front() {
                            if !batch.is_empty() && bytes + m.bytes().len() > BATCH_MAX {
                                break;
                            }
                            bytes += m.bytes().len();
                            if let Some(m) = st.immediate.pop_front() {
                                batch.push_back(m);
                            }
                        }
                        st.sending = true;
                        break;
                    }
                    if st.closing == Some(Close::Drain) && st.timers == 0 {
                        return give_back();
                    }
                }
                st = shared.immediate_changed.wait(st);
            }
        }
        let mut w = shared.writer();
        if !w.busy() {
            w.fill(&mut batch);
        }
        debug_assert!(batch.is_empty(), "the batch fits one write");
        // Write until everything is out, waiting for the device when it is full.
        let mut stuck_since = None;
        while w.busy() {
            if shared.discard.load(Ordering::SeqCst) {
                // Discarding: nothing more starts; the message on the line is finished.
                let dropped = w.drop_unstarted();
                shared.lock().stats.discarded += dropped;
                if !w.busy() {
                    break;
                }
            }
            let wrote = w.write_once();
            let full = wrote.full;
            if wrote.bytes > 0 {
                stuck_since = None;
            }
            // Counted as it happens, so a caller can see a full device. (Lock order:
            // writer, then state; `state` holders never wait for the writer while
            // `sending` is set.)
            wrote.count(&mut shared.lock().stats);
            if !full {
                continue;
            }
            if shared.discard.load(Ordering::SeqCst) {
                // Give up the message on the line too if the device has taken nothing
                // for a while.
                let since = *stuck_since.get_or_insert_with(ictus_rt::clock::now);
                if ictus_rt::clock::now() >= since + DISCARD_PATIENCE {
                    let given_up = w.drop_unwritten();
                    shared.lock().stats.discarded += given_up;
                    break;
                }
            }
            let Writer { device, .. } = &mut *w;
            let Some(device) = device.as_mut() else { break };
            if let Err(e) = device.wait_writable(Some(CLOSE_POLL)) {
                let why = format!("{}: waiting to write: {e}", device.describe());
                let n = w.drop_unwritten();
                let mut st = shared.lock();
                st.stats.write_errors += n;
                st.stats.last_error = Some(why);
            }
        }
        drop(w);
        let mut st = shared.lock();
        st.partial = false;
        st.sending = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

    /// A device that takes at most `room` bytes a write (then `WouldBlock`), or fails.
    #[derive(Debug)]
    struct Narrow {
        room: usize,
        fail: bool,
        got: Vec<u8>,
        fd: OwnedFd,
    }

    impl Device for Narrow {
        fn describe(&self) -> String {
            "narrow".into()
        }
        fn read(&mut self, _: &mut [u8], _: Option<Duration>) -> io::Result<usize> {
            Err(io::ErrorKind::Unsupported.into())
        }
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if self.fail {
                return Err(io::Error::other("unplugged"));
            }
            if self.room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = bytes.len().min(self.room);
            self.got.extend_from_slice(&bytes[..n]);
            Ok(n)
        }
        fn wait_writable(&mut self, _: Option<Duration>) -> io::Result<bool> {
            Ok(true)
        }
        fn fd(&self) -> BorrowedFd<'_> {
            self.fd.as_fd()
        }
    }

    fn writer(room: usize, fail: bool) -> Writer {
        let fd = rustix::io::dup(std::io::stdin().as_fd()).unwrap();
        Writer {
            device: Some(Box::new(Narrow { room, fail, got: Vec::new(), fd })),
            encoder: Encoder::new(),
            out: Vec::new(),
            off: 0,
            ends: VecDeque::new(),
            done: 0,
        }
    }

    fn notes(n: u8) -> VecDeque<Message> {
        (0..n).map(|k| Message::note_on(0, k, 100, Time::ZERO).unwrap()).collect()
    }

    #[test]
    fn a_batch_is_one_write_and_partial_writes_count_whole_messages() {
        let mut w = writer(4, false);
        let mut q = notes(3);
        w.fill(&mut q);
        assert!(q.is_empty() && w.out.len() == 9);
        let a = w.write_once();
        assert_eq!((a.sent, a.bytes), (1, 4), "one note whole, one begun");
        let b = w.write_once();
        assert_eq!((b.sent, b.bytes), (1, 4));
        let c = w.write_once();
        assert_eq!((c.sent, c.bytes), (1, 1));
        assert!(!w.busy());
    }

    #[test]
    fn a_batch_stops_at_4_kib_but_takes_one_message_whatever_its_size() {
        let mut w = writer(usize::MAX, false);
        let mut q = notes(100);
        q.extend((0..2000).map(|k| Message::note_on(1, (k % 128) as u8, 1, Time::ZERO).unwrap()));
        w.fill(&mut q);
        assert!(w.out.len() <= BATCH_MAX && w.out.len() + 3 > BATCH_MAX, "{}", w.out.len());
        let mut big = VecDeque::new();
        let mut sysex = vec![0xF0];
        sysex.extend(std::iter::repeat_n(1, 10_000));
        sysex.push(0xF7);
        big.push_back(Message::from_bytes(&sysex, Time::ZERO).unwrap());
        let mut w = writer(usize::MAX, false);
        w.fill(&mut big);
        assert_eq!(w.out.len(), 10_002);
    }

    #[test]
    fn discarding_keeps_only_the_message_on_the_line() {
        // At a boundary: nothing is on the line, everything left is dropped.
        let mut w = writer(3, false);
        w.fill(&mut notes(3));
        assert_eq!(w.write_once().sent, 1);
        assert_eq!(w.drop_unstarted(), 2);
        assert!(!w.busy());
        // Inside a message: it stays, to be finished; the rest is dropped.
        let mut w = writer(4, false);
        w.fill(&mut notes(3));
        w.write_once();
        assert_eq!(w.drop_unstarted(), 1);
        assert_eq!((w.out.len(), w.off), (6, 4));
        assert_eq!(w.write_once().sent, 1);
        assert!(!w.busy());
    }

    #[test]
    fn a_failing_device_counts_every_message_of_the_write() {
        let mut w = writer(3, true);
        w.fill(&mut notes(5));
        let r = w.write_once();
        assert_eq!(r.failed.as_ref().map(|(n, _)| *n), Some(5));
        assert!(!w.busy());
        let mut stats = OutputStats::default();
        r.count(&mut stats);
        assert_eq!((stats.write_errors, stats.sent), (5, 0));
        assert!(stats.last_error.unwrap().contains("narrow"));
    }
}
