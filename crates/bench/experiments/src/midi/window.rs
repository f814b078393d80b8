//! One window of the experiment: a receiver, an output library on a logged cable,
//! a producer keeping the queue a second ahead, cyclictest beside them; and what the
//! window measured, put together.

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ictus_bench::{format_ns, BenchError, Notes};
use ictus_midi::device::cable::CableOut;
use ictus_midi::device::{sleep_until, Device};
use ictus_midi::output::{Close, Output, OutputOptions};
use ictus_rt::{clock, Time};

use super::analysis::{analyse, message_for, parse_task_faults, read_steal, steal_ms, Analysis};
use super::receiver::{parse_records, Receiver, RECORD};
use super::{Sched, AHEAD, INTERVAL, MAX_MESSAGES, RATE_HZ, SIDE_OFFSET};
use crate::peers::cyclictest::Cyclictest;

/// Page faults (minor, major) of output `id`'s two threads so far; `None` if they
/// cannot be found.
pub(super) fn output_faults(id: u64) -> Option<(u64, u64)> {
    let names = [Output::thread_name(id, "timer"), Output::thread_name(id, "send")];
    let mut total = (0, 0);
    let mut found = 0;
    for e in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if names.iter().any(|n| n == comm.trim()) {
            let (min, maj) = parse_task_faults(&std::fs::read_to_string(e.path().join("stat")).ok()?)?;
            total = (total.0 + min, total.1 + maj);
            found += 1;
        }
    }
    (found == 2).then_some(total)
}

/// When the output library wrote message `k`, and on which CPU.
#[derive(Clone, Copy, Debug)]
pub(super) struct WriteRecord {
    k: u32,
    at: u64,
    cpu: u32,
}

/// The write records of one output, shared with its [`LoggedCable`].
type WriteLog = Arc<Mutex<Vec<WriteRecord>>>;

/// The sending end of a cable that notes the time and CPU of every write (a clock
/// reading and `getcpu`, tens of ns), to tell where an outlier happened.
#[derive(Debug)]
struct LoggedCable {
    inner: CableOut,
    log: WriteLog,
}

impl Device for LoggedCable {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> std::io::Result<usize> {
        self.inner.read(buf, timeout)
    }
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let at = clock::now().as_nanos();
        let cpu = rustix::thread::sched_getcpu() as u32;
        let n = self.inner.write(bytes)?;
        // The output library writes the messages due together in one write, each as a
        // whole note-on (no running status): a record for each note written whole.
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        for note in bytes[..n].chunks_exact(3) {
            if let &[0x90, key, vel] = note {
                if vel >= 1 {
                    let k = u64::from(key) + 128 * u64::from(vel - 1);
                    log.push(WriteRecord { k: k as u32, at, cpu });
                }
            }
        }
        Ok(n)
    }
    fn wait_writable(&mut self, timeout: Option<Duration>) -> std::io::Result<bool> {
        self.inner.wait_writable(timeout)
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd()
    }
    fn lost_bytes(&self) -> u64 {
        self.inner.lost_bytes()
    }
}

/// Where and when a window's worst interval error happened.
#[derive(Clone, Debug)]
pub(super) struct Worst {
    pub(super) error: u64,
    /// Seconds after the window's first due time that the interval ended.
    pub(super) at_s: f64,
    /// The CPUs the output library wrote the pair's two messages on.
    pub(super) writer_cpus: (Option<u32>, Option<u32>),
    /// The CPU the receiver ran on when the second message arrived.
    pub(super) receiver_cpu: Option<u32>,
    /// How late after its due time the output library wrote the pair's second message.
    pub(super) write_late: Option<i64>,
}

impl Worst {
    pub(super) fn describe(&self) -> String {
        let c = |c: Option<u32>| c.map_or("?".to_string(), |c| c.to_string());
        let late = self.write_late.map_or("?".to_string(), |l| {
            if l < 0 {
                format!("-{}", format_ns(-l as f64))
            } else {
                format_ns(l as f64)
            }
        });
        format!(
            "{} at {:.2} s: written on cpu {} then {} (the second {late} after its time), received on cpu {}",
            format_ns(self.error as f64),
            self.at_s,
            c(self.writer_cpus.0),
            c(self.writer_cpus.1),
            c(self.receiver_cpu)
        )
    }
}

/// One window's results.
#[derive(Debug)]
pub(super) struct Window {
    pub(super) load: &'static str,
    pub(super) sched: Sched,
    /// Run side by side with the other class (the headline's window), not alone.
    pub(super) side: bool,
    pub(super) granted: String,
    /// On the kernel's arrival stamps.
    pub(super) analysis: Analysis,
    /// On the receiver's own clock readings after each read (its wake-up included).
    pub(super) analysis_user: Analysis,
    /// cyclictest's wake-up latencies, ns, one run (in wake-up order) per window.
    pub(super) cyclictest: Vec<Vec<u64>>,
    pub(super) output_late: u64,
    pub(super) sent: u64,
    /// Steal time per CPU during the window, ms.
    pub(super) steal: Vec<(usize, u64)>,
    /// Page faults (minor, major) of the output threads while messages were due.
    pub(super) faults: Option<(u64, u64)>,
    /// The worst interval error, where and when.
    pub(super) worst: Option<Worst>,
}

impl Window {
    /// How a row names it.
    pub(super) fn label(&self) -> String {
        if self.side {
            format!("{} side by side, {}", self.load, self.sched.name())
        } else {
            format!("{} {}", self.load, self.sched.name())
        }
    }
}

/// An output library on a logged cable, its threads in class `sched`, with a timer
/// thread on each CPU where the class allows it ([`timer_cpus`]).
pub(super) fn open_output(cable: &str, sched: Sched, n: u64) -> Result<(Output, WriteLog, String), BenchError> {
    let device = CableOut::open(cable, None).map_err(|e| BenchError::io("midi: cable", std::io::Error::other(e)))?;
    // Written through once here, so that the output threads' first writes to it take no
    // page fault (its memory may be reused heap that the receiver's fork made
    // copy-on-write).
    let mut records = vec![WriteRecord { k: 0, at: 0, cpu: 0 }; n as usize + 16];
    records.clear();
    let log = Arc::new(Mutex::new(records));
    let device = LoggedCable { inner: device, log: Arc::clone(&log) };
    let options = OutputOptions { thread: sched.request(), timer_cpus: timer_cpus(sched), ..OutputOptions::default() };
    let output = Output::open(Box::new(device), options)
        .map_err(|e| BenchError::io("midi: output", std::io::Error::other(e.to_string())))?;
    let threads = output.granted();
    let mut granted: Vec<String> = threads.iter().map(|(role, g)| format!("{role}: {}", g.describe())).collect();
    if threads.iter().any(|(_, g)| g.refusal(ictus_rt::thread::RefusalKind::Affinity).is_some()) {
        granted.push("CPU placement refused".into());
    }
    Ok((output, log, granted.join(", ")))
}

/// The CPUs the output library runs a timer thread on, in every window of class
/// `sched` (`OutputOptions::timer_cpus`): one on each CPU this process may use, racing
/// for each due message, so that a virtual CPU the host stops at a due time (or a CPU
/// busy in a kernel section that does not preempt) delays no message while the other
/// runs. Not for deadline threads: the kernel refuses to pin them (a deadline task
/// must span its root domain), so those windows keep one timer thread.
pub(super) fn timer_cpus(sched: Sched) -> Vec<usize> {
    match sched {
        Sched::Timesharing | Sched::Fixed => ictus_rt::thread::current_affinity().unwrap_or_default(),
        Sched::Deadline => Vec::new(),
    }
}

/// How long after its output is ready a window's first message is due. The producer
/// queues each message [`AHEAD`] before it is due from then on; the first ones are queued
/// at once with this lead (the output library takes them ahead of time all the same).
/// It was [`AHEAD`] itself, a second of every window measuring nothing.
const START_LEAD: Duration = Duration::from_millis(200);

/// The producer: keeps `n` messages, due at `t0 + k·INTERVAL`, queued about [`AHEAD`]
/// ahead, calling `at_start` once just before `t0`; returns when all are queued and
/// `at_start` has run. Failed puts are noted.
fn produce(output: &Output, n: u64, t0: Time, mut at_start: impl FnMut(), failures: &mut Vec<String>) {
    let mut next = 0u64;
    let mut started = false;
    loop {
        let now = clock::now();
        while next < n && t0 + INTERVAL * next as u32 <= now + AHEAD {
            if let Some(m) = message_for(next) {
                if let Err(e) = output.put(m, t0 + INTERVAL * next as u32) {
                    failures.push(format!("put failed: {e}"));
                }
            }
            next += 1;
        }
        if !started && now + Duration::from_millis(60) >= t0 {
            sleep_until(t0);
            at_start();
            started = true;
        }
        if next >= n && started {
            break;
        }
        sleep_until(now + Duration::from_millis(50));
    }
}

/// One output of a window: its receiver process, the output library writing to the
/// receiver's cable, and what is needed to put the results together.
struct OutputLane {
    sched: Sched,
    receiver: Receiver,
    output: Output,
    log: WriteLog,
    granted: String,
    /// Message `k` is due at `t0 + k·INTERVAL`.
    t0: Time,
    n: u64,
    /// The output threads' page faults when the first message was due.
    faults0: Option<(u64, u64)>,
    failures: Vec<String>,
}

impl OutputLane {
    /// A receiver for `n` messages, and an output of class `sched` on its cable; the
    /// first message will be due [`START_LEAD`] from when both are ready (see
    /// [`OutputLane::due_from`]).
    fn open(sched: Sched, n: u64) -> Result<OutputLane, BenchError> {
        let receiver = Receiver::start(n)?;
        let (output, log, granted) = open_output(&receiver.cable, sched, n)?;
        let t0 = clock::now() + START_LEAD;
        Ok(OutputLane { sched, receiver, output, log, granted, t0, n, faults0: None, failures: Vec::new() })
    }

    /// The same lane with its first message due at `t0` instead.
    fn due_from(self, t0: Time) -> OutputLane {
        OutputLane { t0, ..self }
    }

    /// Produces every message ([`produce`]) from the calling thread; `at_start` runs
    /// just before the first is due, once the output threads' page faults are counted.
    fn produce(&mut self, mut at_start: impl FnMut()) {
        let OutputLane { output, n, t0, faults0, failures, .. } = self;
        let output = &*output;
        produce(
            output,
            *n,
            *t0,
            || {
                *faults0 = output_faults(output.id());
                at_start();
            },
            failures,
        );
    }

    /// Closes the output (its last message due and sent by now), waits for the
    /// receiver's records, and puts the window together.
    fn finish(self, load: &'static str, side: bool, steal: Vec<(usize, u64)>, notes: &mut Notes) -> Window {
        let faults = faults_between(self.faults0, output_faults(self.output.id()));
        let closed = self.output.close(Close::Drain);
        let records = self.receiver.finish();
        let (sched, n, t0) = (self.sched, self.n, self.t0);
        let label =
            if side { format!("{load} side by side, {}", sched.name()) } else { format!("{load} {}", sched.name()) };
        for f in self.failures {
            notes.push(format!("{label}: {f}"));
        }
        let (kernel, user, rx_cpus) = parse_records(&records);
        let stamped = records.chunks_exact(RECORD).filter(|c| c[4..12] != [0; 8]).count();
        if stamped < kernel.len() {
            notes.push(format!(
                "{label}: {} of {} arrivals had no kernel timestamp (the receiver's own reading was used)",
                kernel.len() - stamped,
                kernel.len()
            ));
        }
        let analysis = analyse(&kernel, n, t0, INTERVAL);
        let analysis_user = analyse(&user, n, t0, INTERVAL);
        let worst = analysis.worst().map(|(error, k)| {
            let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            let wrote = |k: u64| log.iter().find(|r| u64::from(r.k) == k);
            let due = (t0 + INTERVAL * (k + 1) as u32).as_nanos();
            Worst {
                error,
                at_s: (INTERVAL * (k + 1) as u32).as_secs_f64(),
                writer_cpus: (wrote(k).map(|r| r.cpu), wrote(k + 1).map(|r| r.cpu)),
                receiver_cpu: rx_cpus.iter().find(|&&(j, _)| j == k + 1).map(|&(_, c)| c),
                write_late: wrote(k + 1).map(|r| r.at as i64 - due as i64),
            }
        });
        Window {
            load,
            sched,
            side,
            granted: self.granted,
            analysis,
            analysis_user,
            cyclictest: Vec::new(),
            output_late: closed.stats.late + closed.stats.out_of_order,
            sent: closed.stats.sent,
            steal,
            faults,
            worst,
        }
    }
}

fn faults_between(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    let (a, b) = (a?, b?);
    Some((b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)))
}

/// Run one window: `secs` seconds of messages, output threads in `sched`, cyclictest
/// beside them.
pub(super) fn window(load: &'static str, sched: Sched, secs: u64, notes: &mut Notes) -> Result<Window, BenchError> {
    let n = (secs * RATE_HZ).min(MAX_MESSAGES);
    let mut lane = OutputLane::open(sched, n)?;
    let t0 = lane.t0;

    // The producer (this thread) is timesharing in every window, as an application's
    // own thread would be. It shares the output library's lock with the output threads;
    // the lock inherits priority, so a producer preempted while holding it runs at the
    // priority of a real-time output thread waiting for it (the paper found this
    // inversion in C-Threads' locks and had none to prevent it).
    let mut cyclictest = None;
    let mut steal0 = Vec::new();
    lane.produce(|| {
        steal0 = read_steal();
        let (policy, prio) = sched.cyclictest_policy();
        cyclictest = Some(Cyclictest::start(policy, prio, INTERVAL, n));
    });
    sleep_until(t0 + INTERVAL * (n.saturating_sub(1)) as u32 + Duration::from_millis(200));
    let steal = steal_ms(&steal0, &read_steal());
    let mut w = lane.finish(load, false, steal, notes);

    w.cyclictest = match cyclictest {
        Some(Ok(c)) => match c.finish() {
            Ok(samples) => vec![samples],
            Err(e) => {
                notes.not_measured(format!("cyclictest ({load}, {})", sched.name()), e);
                Vec::new()
            }
        },
        Some(Err(e)) => {
            notes.not_measured(
                format!("cyclictest ({load}, {})", sched.name()),
                format!("could not run ({e}); install Debian rt-tests (scripts/setup.sh)"),
            );
            Vec::new()
        }
        None => Vec::new(),
    };
    Ok(w)
}

/// The side-by-side window: a fixed-priority output and a timesharing output of the
/// same library, at once, under the same load, each on its own cable with its own
/// receiver and its own (timesharing) producer, so that both meet the same
/// machine at the same time — the host's stalls of a virtual CPU, other programs'
/// kernel sections — and only the class differs. Each has a timer thread on every CPU
/// ([`timer_cpus`]); the timesharing output's messages are due [`SIDE_OFFSET`] after
/// the fixed-priority output's.
pub(super) fn side_by_side(load: &'static str, secs: u64, notes: &mut Notes) -> Result<Vec<Window>, BenchError> {
    let n = (secs * RATE_HZ).min(MAX_MESSAGES);
    let ts = OutputLane::open(Sched::Timesharing, n)?;
    let mut fixed = OutputLane::open(Sched::Fixed, n)?;
    let t0 = fixed.t0;
    let mut ts = ts.due_from(t0 + SIDE_OFFSET);
    let mut steal0 = Vec::new();
    std::thread::scope(|scope| {
        // Both producers timesharing, as in the other windows (see `window`).
        let ts = scope.spawn(|| ts.produce(|| {}));
        let fixed = scope.spawn(|| fixed.produce(|| steal0 = read_steal()));
        let _ = ts.join();
        let _ = fixed.join();
    });
    sleep_until(t0 + SIDE_OFFSET + INTERVAL * (n.saturating_sub(1)) as u32 + Duration::from_millis(200));
    let steal = steal_ms(&steal0, &read_steal());
    let fixed = fixed.finish(load, true, steal.clone(), notes);
    let ts = ts.finish(load, true, steal, notes);
    Ok(vec![fixed, ts])
}

/// Merge the windows of the same load, class and kind (rounds).
pub(super) fn merge(windows: Vec<Window>) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    for w in windows {
        match out.iter_mut().find(|o| o.load == w.load && o.sched == w.sched && o.side == w.side) {
            Some(o) => {
                // Later rounds' pairs are numbered after the earlier rounds' messages.
                let offset = o.analysis.pairs.iter().max().map_or(0, |m| m + 2);
                o.analysis.errors.extend(w.analysis.errors);
                o.analysis.pairs.extend(w.analysis.pairs.iter().map(|k| k + offset));
                o.analysis.intervals.extend(w.analysis.intervals);
                o.analysis.latencies.extend(w.analysis.latencies);
                o.analysis.lost += w.analysis.lost;
                o.analysis_user.errors.extend(w.analysis_user.errors);
                o.analysis.strays += w.analysis.strays;
                o.output_late += w.output_late;
                o.sent += w.sent;
                o.cyclictest.extend(w.cyclictest);
                for (cpu, ms) in w.steal {
                    match o.steal.iter_mut().find(|(c, _)| *c == cpu) {
                        Some((_, v)) => *v += ms,
                        None => o.steal.push((cpu, ms)),
                    }
                }
                o.faults = match (o.faults, w.faults) {
                    (Some(a), Some(b)) => Some((a.0 + b.0, a.1 + b.1)),
                    _ => None,
                };
                if w.worst.as_ref().map(|x| x.error) > o.worst.as_ref().map(|x| x.error) {
                    o.worst = w.worst;
                }
            }
            None => out.push(w),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::receiver::unique_cable;
    use super::*;
    use ictus_midi::device::cable::CableIn;

    #[test]
    fn timer_threads_go_where_the_class_allows() {
        assert!(timer_cpus(Sched::Deadline).is_empty());
        let cpus = ictus_rt::thread::current_affinity().unwrap();
        assert_eq!(timer_cpus(Sched::Fixed), cpus);
        assert_eq!(timer_cpus(Sched::Timesharing), cpus);
    }

    #[test]
    fn an_output_on_a_logged_cable_reports_its_writes_and_faults() {
        let name = unique_cable();
        let mut rx = CableIn::open(&name).unwrap();
        let (output, log, granted) = open_output(&name, Sched::Timesharing, 4).unwrap();
        assert!(granted.contains("timer"), "{granted}");
        assert!(output_faults(output.id()).is_some());
        for k in 0..3 {
            output.put_now(message_for(k).unwrap()).unwrap();
        }
        let mut buf = [0u8; 16];
        let mut got = 0;
        while got < 9 {
            got += rx.read(&mut buf, Some(Duration::from_secs(30))).unwrap();
        }
        let closed = output.close(Close::Drain);
        assert_eq!(closed.stats.sent, 3);
        let log = log.lock().unwrap();
        assert_eq!(log.iter().map(|r| r.k).collect::<Vec<_>>(), vec![0, 1, 2]);
        let cpus = ictus_rt::thread::current_affinity().unwrap();
        assert!(log.iter().all(|r| cpus.contains(&(r.cpu as usize)) && r.at > 0));
    }
}
