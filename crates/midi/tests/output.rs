//! The output library on the virtual cable: order kept, timed messages never early, late
//! and out-of-order messages straight out, a full device retried, close(drain) delivers
//! everything, close(discard) nothing more, no thread outlives its output, and the
//! unprivileged path (real-time priority refused, everything still works).
//!
//! No test asserts a duration: "not early" is a lower bound the absolute sleeps
//! guarantee, and every wait is bounded only by a generous watchdog.

use std::io;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ictus_midi::device::cable::{CableIn, CableOut, BUFFER, MAX_DATAGRAM};
use ictus_midi::device::Device;
use ictus_midi::output::{Close, Output, OutputOptions, OutputStats, Placement};
use ictus_midi::parse::{Message, Parser};
use ictus_rt::thread::{Policy, RefusalKind};
use ictus_rt::Time;

const WATCHDOG: Duration = Duration::from_secs(60);
const ROLE_ENV: &str = "ICTUS_MIDI_OUTPUT_TEST_ROLE";

fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("out-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn now() -> Time {
    ictus_rt::clock::now()
}

/// A receiver collecting (arrival time, message) pairs.
struct Rx {
    cable: CableIn,
    parser: Parser,
    got: Vec<(Time, Message)>,
}

impl Rx {
    fn open(name: &str) -> Rx {
        Rx { cable: CableIn::open(name).unwrap(), parser: Parser::new(), got: Vec::new() }
    }

    /// Read until `n` messages have come (panics after the watchdog).
    fn until(&mut self, n: usize) -> &[(Time, Message)] {
        let deadline = now() + WATCHDOG;
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while self.got.len() < n {
            assert!(now() < deadline, "only {} of {n} messages arrived: {:?}", self.got.len(), self.got);
            match self.cable.read(&mut buf, Some(Duration::from_secs(1))) {
                Ok(k) => {
                    let t = now();
                    for &b in &buf[..k] {
                        for m in self.parser.feed(b, t) {
                            self.got.push((t, m));
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => panic!("{e}"),
            }
        }
        &self.got
    }

    /// Whatever arrives within `wait` (used only to show that nothing does).
    fn nothing_within(&mut self, wait: Duration) -> bool {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        match self.cable.read(&mut buf, Some(wait)) {
            Err(e) if e.kind() == io::ErrorKind::TimedOut => true,
            Ok(_) => false,
            Err(e) => panic!("{e}"),
        }
    }
}

fn note(i: usize) -> Message {
    Message::note_on((i % 16) as u8, (i % 128) as u8, 100, Time::ZERO).unwrap()
}

fn open(name: &str) -> Output {
    Output::open(Box::new(CableOut::open(name, None).unwrap()), OutputOptions::timesharing()).unwrap()
}

/// Wait (up to the watchdog) until the output's counts satisfy `done`.
#[track_caller]
fn wait_for_stats(out: &Output, what: &str, done: impl Fn(&OutputStats) -> bool) {
    let deadline = now() + WATCHDOG;
    while !done(&out.stats()) {
        assert!(now() < deadline, "{what}: {:?}", out.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What arrived is `note(0)`, `note(1)`, … in order.
#[track_caller]
fn assert_notes_in_order(got: &[(Time, Message)]) {
    for (i, (_, m)) in got.iter().enumerate() {
        assert_eq!(m.bytes(), note(i).bytes(), "message {i}");
    }
}

fn threads_named(prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        if let Ok(comm) = std::fs::read_to_string(e.unwrap().path().join("comm")) {
            let comm = comm.trim().to_owned();
            if comm.starts_with(prefix) {
                out.push(comm);
            }
        }
    }
    out
}

/// Put notes `0..n`, note `i` due at `due(i)`, each into the timed queue, and check
/// that they arrive once each, in order, none before its time.
fn put_timed_and_check_arrivals(out: &Output, rx: &mut Rx, n: usize, due: impl Fn(usize) -> Time) {
    for i in 0..n {
        assert_eq!(out.put(note(i), due(i)).unwrap(), Placement::Timed);
    }
    let got = rx.until(n).to_vec();
    for (i, (arrived, m)) in got.iter().enumerate() {
        assert_eq!(m.bytes(), note(i).bytes(), "message {i} out of order or twice");
        assert!(*arrived >= due(i), "message {i} arrived at {arrived}, before its time {}", due(i));
    }
}

#[test]
fn timed_messages_keep_their_order_and_are_never_early() {
    let name = unique("order");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    let t0 = now() + Duration::from_millis(50);
    let n = 40;
    put_timed_and_check_arrivals(&out, &mut rx, n, |i| t0 + Duration::from_millis(3) * i as u32);
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.sent, n as u64);
    assert_eq!(closed.stats.timed, n as u64);
    assert_eq!(closed.stats.late + closed.stats.out_of_order + closed.stats.discarded, 0);
}

#[test]
fn late_and_out_of_order_messages_go_out_at_once() {
    let name = unique("late");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    let far = now() + Duration::from_secs(3600);
    assert_eq!(out.put(note(1), far).unwrap(), Placement::Timed);
    // Earlier than the last timed message: straight out, long before `far`.
    assert_eq!(out.put(note(2), far - Duration::from_secs(1800)).unwrap(), Placement::OutOfOrder);
    // Its time has passed: straight out.
    assert_eq!(out.put(note(3), now() - Duration::from_secs(1)).unwrap(), Placement::Immediate { late: true });
    let got: Vec<Vec<u8>> = rx.until(2).iter().map(|(_, m)| m.bytes().to_vec()).collect();
    assert_eq!(got, vec![note(2).bytes().to_vec(), note(3).bytes().to_vec()]);
    let closed = out.close(Close::Discard);
    assert_eq!(closed.stats.late, 1);
    assert_eq!(closed.stats.out_of_order, 1);
    assert_eq!(closed.stats.sent, 2);
    assert_eq!(closed.stats.discarded, 1, "the message an hour away is discarded");
    assert!(rx.nothing_within(Duration::from_millis(200)));
}

#[test]
fn close_drain_delivers_everything() {
    let name = unique("drain");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    let t0 = now() + Duration::from_millis(20);
    let n = 60;
    for i in 0..n {
        out.put(note(i), t0 + Duration::from_millis(2) * i as u32).unwrap();
    }
    // The receiver reads on its own thread: a drain waits for the device, and the
    // cable holds only a few datagrams.
    let reader = std::thread::spawn(move || rx.until(n).to_vec());
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.sent, n as u64);
    assert_eq!(closed.stats.discarded, 0);
    let got = reader.join().unwrap();
    assert_eq!(got.len(), n);
    for (i, (_, m)) in got.iter().enumerate() {
        assert_eq!(m.bytes(), note(i).bytes());
    }
}

#[test]
fn close_discard_sends_nothing_more_and_leaves_no_thread() {
    let name = unique("discard");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    let id = out.id();
    let prefix = format!("mo{id}-");
    assert_eq!(out.granted().len(), 2);
    assert_eq!(threads_named(&prefix).len(), 2, "both output threads run while open");
    let later = now() + Duration::from_secs(600);
    for i in 0..25 {
        out.put(note(i), later + Duration::from_millis(i as u64)).unwrap();
    }
    let closed = out.close(Close::Discard);
    assert_eq!(closed.stats.sent, 0);
    assert_eq!(closed.stats.discarded, 25);
    assert!(rx.nothing_within(Duration::from_millis(300)), "a discarded message was sent");
    assert!(threads_named(&prefix).is_empty(), "output threads outlived close: {:?}", threads_named(&prefix));

    // Dropping without closing also ends the threads.
    let out = open(&name);
    let prefix = format!("mo{}-", out.id());
    out.put(note(0), now() + Duration::from_secs(600)).unwrap();
    assert_eq!(out.granted().len(), 2);
    drop(out);
    assert!(threads_named(&prefix).is_empty());
}

#[test]
fn a_full_device_is_retried_and_nothing_is_lost() {
    let name = unique("full");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    // The receiver does not read yet: the cable's buffer fills, the sender meets
    // WouldBlock and waits for it.
    let n = OVERFILL;
    for i in 0..n {
        out.put_now(note(i)).unwrap();
    }
    let deadline = now() + WATCHDOG;
    while out.stats().full_retries == 0 {
        assert!(now() < deadline, "the device never became full: {:?}", out.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = rx.until(n);
    for (i, (_, m)) in got.iter().enumerate() {
        assert_eq!(m.bytes(), note(i).bytes(), "message {i}");
    }
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.sent, n as u64);
    assert!(closed.stats.full_retries > 0);
    assert_eq!(closed.stats.write_errors, 0);
}

/// More three-byte notes than a cable holds.
const OVERFILL: usize = BUFFER / 3 + 200;

#[test]
fn with_an_idle_sender_the_timer_thread_writes_due_messages_itself() {
    let name = unique("direct");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    // Fewer messages than the receiver's queue holds, and nothing for the byte sender:
    // every due message is written by the timer thread, none handed off, however late
    // the thread wakes.
    let n = 5;
    // Far enough ahead that no put can come after its time, even on a loaded machine.
    let t0 = now() + Duration::from_millis(500);
    for i in 0..n {
        assert_eq!(out.put(note(i), t0 + Duration::from_millis(2) * i as u32).unwrap(), Placement::Timed);
    }
    wait_for_stats(&out, "not all sent", |s| s.sent >= n as u64);
    assert_notes_in_order(rx.until(n));
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.handed_off, 0, "{:?}", closed.stats);
    assert_eq!(closed.stats.sent, n as u64);
}

#[test]
fn with_a_full_device_due_messages_are_handed_to_the_sender_in_order() {
    let name = unique("handoff");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    // The receiver does not read yet: the cable fills, the write that does not fit is
    // left to the byte sender, and every later due message is handed to it, in order.
    let n = OVERFILL;
    let t0 = now() + Duration::from_millis(500);
    for i in 0..n {
        assert_eq!(out.put(note(i), t0 + Duration::from_micros(100) * i as u32).unwrap(), Placement::Timed);
    }
    wait_for_stats(&out, "never handed off", |s| s.full_retries > 0 && s.handed_off > 0);
    assert_notes_in_order(rx.until(n));
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.sent, n as u64);
    assert!(closed.stats.handed_off > 0);
    assert_eq!(closed.stats.discarded + closed.stats.write_errors, 0);
}

#[test]
fn running_status_on_the_wire_parses_back() {
    let name = unique("running");
    let mut rx = Rx::open(&name);
    let out = Output::open(
        Box::new(CableOut::open(&name, None).unwrap()),
        OutputOptions { running_status: true, ..OutputOptions::timesharing() },
    )
    .unwrap();
    for key in 60..70 {
        out.put_now(Message::note_on(0, key, 90, Time::ZERO).unwrap()).unwrap();
    }
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.bytes, 3 + 9 * 2, "running status leaves out the repeated status bytes");
    let got = rx.until(10);
    for (i, (_, m)) in got.iter().enumerate() {
        assert_eq!(m.bytes(), &[0x90, 60 + i as u8, 90]);
    }
}

#[test]
fn the_default_asks_for_fixed_priority() {
    let name = unique("prio");
    let _rx = Rx::open(&name);
    let out = Output::open(Box::new(CableOut::open(&name, None).unwrap()), OutputOptions::default()).unwrap();
    let granted = out.granted();
    assert_eq!(granted.len(), 2);
    for (role, g) in &granted {
        // Either SCHED_FIFO 70 was granted, or the refusal says why.
        assert!(
            g.policy == Policy::Fifo { priority: 70 } || g.refusal(RefusalKind::FixedPriority).is_some(),
            "{role}: {g:?}"
        );
    }
    out.close(Close::Discard);
}

/// Child role: as uid/gid 65534 (no CAP_SYS_NICE, RLIMIT_RTPRIO as inherited), open an
/// output with the default (fixed-priority) request and a receiver of our own; every
/// message must still arrive, and a refused priority must be reported.
fn child_unprivileged_output(name: &str) {
    let mut rx = Rx::open(name);
    let out = Output::open(Box::new(CableOut::open(name, None).unwrap()), OutputOptions::default()).unwrap();
    let granted = out.granted();
    for (role, g) in &granted {
        println!("{role}: {} refused={}", g.describe(), g.refused.len());
        if ictus_rt::thread::rtprio_limit() == 0 {
            assert!(g.refusal(RefusalKind::FixedPriority).is_some(), "{role}: {g:?}");
            assert!(!g.policy.is_realtime());
        }
    }
    for i in 0..5 {
        out.put(note(i), now() + Duration::from_millis(5 * i as u64)).unwrap();
    }
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.sent, 5);
    let got = rx.until(5);
    for (i, (_, m)) in got.iter().enumerate() {
        assert_eq!(m.bytes(), note(i).bytes());
    }
    println!("unprivileged output ok");
}

#[test]
fn child_role() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        let (what, name) = role.split_once(':').unwrap();
        match what {
            "unprivileged-output" => child_unprivileged_output(name),
            other => panic!("unknown role {other}"),
        }
    }
}

#[test]
fn without_privileges_the_output_still_works() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: dropping to uid 65534 needs root (this run is already unprivileged)");
        return;
    }
    let name = unique("nobody");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, format!("unprivileged-output:{name}"));
    std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
    std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("unprivileged output ok"), "{stdout}");
}

#[test]
fn close_discard_gives_up_on_a_device_that_stays_full() {
    let name = unique("stuck");
    // A receiver that never reads.
    let _rx = CableIn::open(&name).unwrap();
    let out = open(&name);
    let n = OVERFILL;
    for i in 0..n {
        out.put_now(note(i)).unwrap();
    }
    let deadline = now() + WATCHDOG;
    while out.stats().full_retries == 0 {
        assert!(now() < deadline, "the device never became full");
        std::thread::sleep(Duration::from_millis(5));
    }
    let closed = out.close(Close::Discard);
    assert!(closed.stats.discarded > 0);
    assert_eq!(closed.stats.sent + closed.stats.discarded, n as u64, "{:?}", closed.stats);
}

#[test]
fn a_failing_device_is_counted_and_the_rest_still_goes() {
    use ictus_midi::device::rawmidi::RawMidi;
    use ictus_midi::device::Direction;
    // Opened for input only: every write fails (Unsupported).
    let dev = RawMidi::open(std::path::Path::new("/dev/null"), Direction::Input).unwrap();
    let out = Output::open(Box::new(dev), OutputOptions::timesharing()).unwrap();
    for i in 0..3 {
        out.put_now(note(i)).unwrap();
    }
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.write_errors, 3);
    assert_eq!(closed.stats.sent, 0);
    assert!(closed.stats.last_error.as_deref().unwrap_or("").contains("/dev/null"), "{:?}", closed.stats);
    assert!(closed.device.is_some());
}

/// With a timer thread on each CPU, each pinned to its own, every message still goes
/// out exactly once, in order and never early, whichever thread wins it; closing ends
/// every timer thread.
#[test]
fn timer_threads_on_every_cpu_send_each_message_once_in_order() {
    let cpus = ictus_rt::thread::current_affinity().unwrap();
    let name = unique("timers");
    let mut rx = Rx::open(&name);
    let opts = OutputOptions { timer_cpus: cpus.clone(), ..OutputOptions::timesharing() };
    let out = Output::open(Box::new(CableOut::open(&name, None).unwrap()), opts).unwrap();
    let prefix = format!("mo{}-", out.id());
    let granted = out.granted();
    assert_eq!(granted.iter().filter(|(role, _)| *role == "timer").count(), cpus.len());
    assert_eq!(threads_named(&prefix).len(), cpus.len() + 1, "{:?}", threads_named(&prefix));
    let t0 = now() + Duration::from_millis(50);
    let n = 200;
    // Pairs of messages due at the same instant, the pairs 2 ms apart.
    put_timed_and_check_arrivals(&out, &mut rx, n, |i| t0 + Duration::from_millis(2) * (i / 2) as u32);
    let closed = out.close(Close::Drain);
    // Every write is done once close has joined the threads: a second copy of any
    // message would already be waiting on the cable.
    assert!(rx.nothing_within(Duration::ZERO), "a message went out twice");
    assert_eq!((closed.stats.sent, closed.stats.timed, closed.stats.discarded), (n as u64, n as u64, 0));
    assert!(threads_named(&prefix).is_empty(), "output threads outlived close: {:?}", threads_named(&prefix));
}

/// Issue 25: 256 notes due at one instant leave in one write and arrive complete, in
/// order.
#[test]
fn a_256_event_chord_goes_out_in_one_write_and_arrives_complete_in_order() {
    let name = unique("chord");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    let n = 256;
    let at = now() + Duration::from_millis(300);
    for i in 0..n {
        assert_eq!(out.put(note(i), at).unwrap(), Placement::Timed);
    }
    let got = rx.until(n).to_vec();
    assert_notes_in_order(&got);
    assert!(got.iter().all(|(t, _)| *t >= at), "a note arrived before its time");
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.sent, n as u64);
    assert_eq!(closed.stats.writes, 1, "the chord took more than one write: {:?}", closed.stats);
    assert_eq!(closed.stats.handed_off, 0);
    assert!(rx.nothing_within(Duration::ZERO), "more than the chord arrived");
}

/// Issue 25: a reader that stops reading makes the writer report the device full, and
/// everything the output says it sent arrives, none twice, none missing, once the
/// reader reads again.
#[test]
fn a_reader_that_stops_makes_the_writer_report_full_and_nothing_it_sent_is_lost() {
    let name = unique("stops");
    let mut rx = Rx::open(&name);
    let out = open(&name);
    let n = 2 * OVERFILL;
    // Timed notes, many due at each instant, so that both threads write.
    let t0 = now() + Duration::from_millis(100);
    for i in 0..n {
        out.put(note(i), t0 + Duration::from_micros(200) * (i / 8) as u32).unwrap();
    }
    wait_for_stats(&out, "the device never became full", |s| s.full_retries > 0);
    let said_sent = out.stats().sent as usize;
    assert!(said_sent < n, "everything went while the reader did not read");
    // What the output said it had sent is all there, in order.
    assert_notes_in_order(rx.until(said_sent));
    assert_notes_in_order(rx.until(n));
    let closed = out.close(Close::Drain);
    assert_eq!(rx.got.len(), n);
    assert_eq!((closed.stats.sent, closed.stats.discarded, closed.stats.write_errors), (n as u64, 0, 0));
    assert_eq!(closed.device.unwrap().lost_bytes(), 0);
    assert!(rx.nothing_within(Duration::ZERO), "a message arrived twice");
}

/// The byte sender waits for a full serial port to become writable (`POLLOUT`), as for
/// any device file: a far end that reads nothing fills the line discipline's buffer; when
/// it reads, every byte follows, in order.
#[test]
fn a_full_serial_port_is_waited_for_and_every_byte_follows() {
    use ictus_midi::device::serial::{Pty, Serial, MIDI_BAUD};
    let mut pty = Pty::open().unwrap();
    let port = Serial::open(pty.slave_path(), MIDI_BAUD).unwrap();
    let out = Output::open(Box::new(port), OutputOptions::timesharing()).unwrap();
    let n = 20_000;
    for i in 0..n {
        out.put_now(note(i)).unwrap();
    }
    wait_for_stats(&out, "the port never became full", |s| s.full_retries > 0);
    let mut parser = Parser::new();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = now() + WATCHDOG;
    while got.len() < n {
        assert!(now() < deadline, "only {} of {n} came", got.len());
        match pty.read(&mut buf, Some(Duration::from_secs(1))) {
            Ok(k) => parser.feed_slice(&buf[..k], now(), &mut got),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
            Err(e) => panic!("{e}"),
        }
    }
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.bytes(), note(i).bytes(), "message {i}");
    }
    let closed = out.close(Close::Drain);
    assert_eq!((closed.stats.sent, closed.stats.write_errors), (n as u64, 0));
}
