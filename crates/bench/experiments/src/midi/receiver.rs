//! The paper's instrument: a receiver process that holds a cable's receiving end and
//! records when each message arrived, by the kernel's stamp and its own clock.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::Child;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ictus_bench::child::{fd_arg, num_arg, reap_status, spawn_child};
use ictus_bench::{BenchError, Role};
use ictus_midi::device::cable::CableIn;
use ictus_midi::Parser;
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_rt::{clock, Time};

use super::analysis::number_of;
use super::{AHEAD, INTERVAL, RECEIVER_PRIORITY};

/// `CLOCK_REALTIME − CLOCK_MONOTONIC`, ns, read as tightly as a few tries allow.
fn realtime_offset() -> i128 {
    let mut best = (u64::MAX, 0i128);
    for _ in 0..5 {
        let a = clock::now().as_nanos();
        let w = clock::wall().as_nanos();
        let b = clock::now().as_nanos();
        if b - a < best.0 {
            best = (b - a, i128::from(w) - i128::from(a + (b - a) / 2));
        }
    }
    best.1
}

/// Bytes per arrival record: `u32` number, `u64` kernel stamp (monotonic ns, 0 if
/// none), `u64` the receiver's own clock reading after the read, `u32` the CPU the
/// receiver ran on.
pub(super) const RECORD: usize = 24;

/// The receiver's role.
pub static ROLE: Role = Role { name: "midi-receiver", run: receiver_role };

/// The receiver process: `CABLE COUNT FD MAX_MS`. Binds the cable, writes `R` on the
/// descriptor, then records the arrival of each message (`RECORD` bytes) until it
/// has `COUNT`, or a second passes without one after the first, or `MAX_MS` pass;
/// writes them and exits.
pub fn receiver_role(args: &[String]) -> i32 {
    let run = || -> Result<(), String> {
        let cable = args.first().ok_or("missing cable")?;
        let count = num_arg(args, 1, "count").map_err(|e| e.to_string())? as u64;
        let fd: OwnedFd = fd_arg(args.get(2).ok_or("missing fd")?).map_err(|e| e.to_string())?;
        let max = Duration::from_millis(num_arg(args, 3, "max ms").map_err(|e| e.to_string())? as u64);
        configure_current_thread(&ThreadRequest {
            policy: Some(Policy::Fifo { priority: RECEIVER_PRIORITY }),
            timer_slack: Some(Duration::from_nanos(1)),
            lock_memory: true,
            ..ThreadRequest::default()
        });
        // The kernel stamps each write's wake-up of this receiver (`SO_TIMESTAMPNS`) as
        // the writer makes it: the paper's instrument stamped arrivals in its interrupt
        // handler, so its own scheduling was not part of what it measured.
        let mut input = CableIn::open(cable).map_err(|e| format!("cable {cable}: {e}"))?.with_arrival_stamps();
        let offset = realtime_offset();
        let mut out = std::fs::File::from(fd);
        std::io::Write::write_all(&mut out, b"R").map_err(|e| e.to_string())?;
        let mut parser = Parser::new();
        let mut buf = vec![0u8; ictus_midi::device::cable::MAX_DATAGRAM];
        let mut records: Vec<u8> = Vec::with_capacity(count as usize * RECORD);
        let (mut got, started) = (0u64, Instant::now());
        let mut last = None::<Instant>;
        while got < count
            && started.elapsed() < max
            && !matches!(last, Some(l) if l.elapsed() >= Duration::from_secs(1))
        {
            let (n, stamp) = match input.read_stamped(&mut buf, Some(Duration::from_millis(100))) {
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                Err(e) => return Err(e.to_string()),
            };
            let user = clock::now();
            let cpu = rustix::thread::sched_getcpu() as u32;
            last = Some(Instant::now());
            let kernel = stamp.map_or(0, |s| (i128::from(s) - offset).clamp(0, i128::from(u64::MAX)) as u64);
            for &b in &buf[..n] {
                for m in parser.feed(b, user) {
                    if let Some(k) = number_of(&m) {
                        records.extend_from_slice(&(k as u32).to_le_bytes());
                        records.extend_from_slice(&kernel.to_le_bytes());
                        records.extend_from_slice(&user.as_nanos().to_le_bytes());
                        records.extend_from_slice(&cpu.to_le_bytes());
                        got += 1;
                    }
                }
            }
        }
        std::io::Write::write_all(&mut out, &records).map_err(|e| e.to_string())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("midi-receiver: {e}");
            1
        }
    }
}

/// Arrivals: `(message number, time)`.
type Arrivals = Vec<(u64, Time)>;

/// Arrival records: `(number, kernel stamp, receiver's reading)` and `(number, CPU)`;
/// a missing kernel stamp is the receiver's reading.
pub(super) fn parse_records(bytes: &[u8]) -> (Arrivals, Arrivals, Vec<(u64, u32)>) {
    let mut kernel = Vec::new();
    let mut user = Vec::new();
    let mut cpus = Vec::new();
    for c in bytes.chunks_exact(RECORD) {
        let k = u64::from(u32::from_le_bytes(c[..4].try_into().unwrap_or([0; 4])));
        let kt = u64::from_le_bytes(c[4..12].try_into().unwrap_or([0; 8]));
        let ut = u64::from_le_bytes(c[12..20].try_into().unwrap_or([0; 8]));
        let cpu = u32::from_le_bytes(c[20..24].try_into().unwrap_or([0; 4]));
        user.push((k, Time::from_nanos(ut)));
        kernel.push((k, Time::from_nanos(if kt == 0 { ut } else { kt })));
        cpus.push((k, cpu));
    }
    (kernel, user, cpus)
}

pub(super) fn unique_cable() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("bench-midi-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A receiver process holding one cable, and the thread collecting its records. One
/// dropped without [`Receiver::finish`] (a window that failed) is killed and reaped.
pub(super) struct Receiver {
    pub(super) cable: String,
    child: Option<Child>,
    reader: Option<JoinHandle<Vec<u8>>>,
}

impl Receiver {
    /// Start a receiver for `n` messages and wait until it holds its cable.
    pub(super) fn start(n: u64) -> Result<Receiver, BenchError> {
        let cable = unique_cable();
        let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| BenchError::io("midi: pipe", e.into()))?;
        let mut rd = std::fs::File::from(rd);
        let max_ms = (AHEAD + INTERVAL * n as u32 + Duration::from_secs(10)).as_millis();
        let args =
            vec![cable.clone(), n.to_string(), std::os::fd::AsRawFd::as_raw_fd(&wr).to_string(), max_ms.to_string()];
        let mut child =
            spawn_child(&ROLE, &args, &[wr.as_fd()]).map_err(|e| BenchError::io("midi: spawn receiver", e))?;
        drop(wr);
        let mut ready = [0u8; 1];
        if rd.read_exact(&mut ready).is_err() || ready != *b"R" {
            let status = reap_status(&mut child, Duration::from_secs(5));
            return Err(BenchError::io(
                "midi: the receiver did not start",
                std::io::Error::other(format!("{status:?}")),
            ));
        }
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = rd.read_to_end(&mut all);
            all
        });
        Ok(Receiver { cable, child: Some(child), reader: Some(reader) })
    }

    /// The records it wrote, once it has exited.
    pub(super) fn finish(mut self) -> Vec<u8> {
        let records = self.reader.take().and_then(|r| r.join().ok()).unwrap_or_default();
        if let Some(mut child) = self.child.take() {
            let _ = reap_status(&mut child, Duration::from_secs(5));
        }
        records
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_midi::device::cable::CableOut;
    use ictus_midi::device::Device;

    #[test]
    fn records_parse() {
        let mut b = Vec::new();
        for (k, kt, ut, cpu) in [(7u32, 123u64, 130u64, 1u32), (8, 0, 240, 0)] {
            b.extend_from_slice(&k.to_le_bytes());
            b.extend_from_slice(&kt.to_le_bytes());
            b.extend_from_slice(&ut.to_le_bytes());
            b.extend_from_slice(&cpu.to_le_bytes());
        }
        b.extend_from_slice(&[1, 2, 3]); // a torn tail is ignored
        let (kernel, user, cpus) = parse_records(&b);
        assert_eq!(kernel, vec![(7, Time::from_nanos(123)), (8, Time::from_nanos(240))]);
        assert_eq!(user, vec![(7, Time::from_nanos(130)), (8, Time::from_nanos(240))]);
        assert_eq!(cpus, vec![(7, 1), (8, 0)]);
    }

    #[test]
    fn the_kernel_stamps_arrivals_on_a_cable() {
        let name = unique_cable();
        let mut rx = CableIn::open(&name).unwrap().with_arrival_stamps();
        let mut tx = CableOut::open(&name, None).unwrap();
        let mut buf = [0u8; 16];
        // The receiver takes the new sender and arms its ring: the next write wakes it.
        assert!(rx.read_stamped(&mut buf, Some(Duration::ZERO)).is_err());
        let before = clock::wall().as_nanos();
        tx.write(&[0x90, 1, 1]).unwrap();
        let (n, stamp) = rx.read_stamped(&mut buf, Some(Duration::from_secs(30))).unwrap();
        assert_eq!(&buf[..n], &[0x90, 1, 1]);
        let stamp = stamp.expect("a sleeping receiver's wake-up carries SO_TIMESTAMPNS");
        assert!(stamp >= before && stamp <= clock::wall().as_nanos());
        assert!(rx.read_stamped(&mut buf, Some(Duration::ZERO)).is_err());
    }
}
