//! The chord experiment (issue 25): many events due at one instant, through the output
//! library onto a cable, beside one write of the same bytes to a socket pair by a thread
//! of the same class sleeping until the due time, alternating (A B A B), no load; from
//! the due time to the read that completes the chord. Headlines `midi_chord256_last_us`
//! (p99, absolute target [`CHORD_BUDGET_US`]) and `midi_chord256_vs_one_write` (medians,
//! target [`CHORD_VS_ONE_WRITE`]).

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use ictus_bench::{BenchError, Better, Headline, Notes, Report};
use ictus_midi::device::cable::{CableIn, CableOut};
use ictus_midi::device::{sleep_until, Device};
use ictus_midi::output::{Close, Output, OutputOptions};
use ictus_midi::Message;
use ictus_rt::thread::{configure_current_thread, Policy, ThreadRequest};
use ictus_rt::{clock, Time};

use super::receiver::unique_cable;
use super::window::timer_cpus;
use super::{recorder, Sched, RECEIVER_PRIORITY};

/// The chord sizes: events due at one instant.
pub const CHORD_SIZES: [usize; 3] = [16, 64, 256];

/// The chord headline's size and its absolute budget: a dense instant (a game
/// soundtrack's reset of 16 channels, an orchestral downbeat) arrives whole within a
/// millisecond, as ALSA's sequencer delivers it to a virtual port.
pub const CHORD_HEADLINE: usize = 256;
/// `midi_chord256_last_us`'s target, µs.
pub const CHORD_BUDGET_US: f64 = 1000.0;
/// `midi_chord256_vs_one_write`'s target.
pub const CHORD_VS_ONE_WRITE: f64 = 3.0;

/// The `i`-th event of a chord: a note-on, each of the chord distinct.
fn chord_event(i: usize) -> Message {
    let key = (24 + i % 96) as u8;
    let vel = (1 + i / 96) as u8;
    Message::note_on((i % 16) as u8, key, vel, Time::ZERO).expect("a valid note")
}

/// A chord of `n` events, as the bytes one write carries (no running status, as the
/// output library writes by default).
fn chord_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| chord_event(i).bytes().to_vec()).collect()
}

/// Which side a chord trial measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChordSide {
    /// The output library: `n` messages put due at one instant, its timer thread writing
    /// them onto the cable; the receiver reads the cable.
    Ours,
    /// The floor: a thread of the same class sleeping until the due time and writing the
    /// same bytes with one `write` to a `SOCK_STREAM` socket pair; the same receiver
    /// reads the other end.
    OneWrite,
}

/// One trial for the receiver: where to read, what must come, and when it was due.
struct ChordTrial {
    side: ChordSide,
    expect: Vec<u8>,
    due: Time,
}

/// The receiver thread: reads each trial's bytes from its side until all have come and
/// answers the time of the read that completed them, minus the due time (ns), or why not.
fn chord_receiver(
    mut cable: CableIn,
    pair: OwnedFd,
    trials: std::sync::mpsc::Receiver<ChordTrial>,
    results: std::sync::mpsc::Sender<Result<u64, String>>,
) {
    configure_current_thread(&ThreadRequest {
        policy: Some(Policy::Fifo { priority: RECEIVER_PRIORITY }),
        timer_slack: Some(Duration::from_nanos(1)),
        ..ThreadRequest::default()
    });
    let mut buf = vec![0u8; 16 * 1024];
    let mut got = Vec::with_capacity(16 * 1024);
    let watchdog = Duration::from_secs(5);
    for t in trials {
        got.clear();
        let deadline = clock::now() + watchdog;
        let mut last = clock::now();
        let outcome = loop {
            if got.len() >= t.expect.len() {
                break if got == t.expect {
                    Ok(last.saturating_duration_since(t.due).as_nanos() as u64)
                } else {
                    Err(format!("{:?} chord of {} bytes arrived changed", t.side, t.expect.len()))
                };
            }
            let left = deadline.saturating_duration_since(clock::now());
            if left.is_zero() {
                break Err(format!("{:?}: {} of {} bytes in {watchdog:?}", t.side, got.len(), t.expect.len()));
            }
            let n = match t.side {
                ChordSide::Ours => match cable.read(&mut buf, Some(left)) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                    Err(e) => break Err(format!("cable: {e}")),
                },
                ChordSide::OneWrite => {
                    match ictus_midi::device::wait_fd(pair.as_fd(), rustix::event::PollFlags::IN, Some(left)) {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(e) => break Err(format!("socket pair: {e}")),
                    }
                    match rustix::io::read(&pair, &mut buf) {
                        Ok(n) => n,
                        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
                        Err(e) => break Err(format!("socket pair: {e}")),
                    }
                }
            };
            last = clock::now();
            got.extend_from_slice(&buf[..n]);
        };
        if results.send(outcome).is_err() {
            return;
        }
    }
}

/// The floor's writer thread: for each `(due, bytes)`, sleep until `due` and write the
/// bytes with one `write`.
fn chord_one_writer(pair: OwnedFd, jobs: std::sync::mpsc::Receiver<(Time, Vec<u8>)>) {
    configure_current_thread(&Sched::Fixed.request());
    for (due, bytes) in jobs {
        sleep_until(due);
        let mut off = 0;
        // One write takes it all (the socket's buffer is far larger than a chord); the
        // loop is only there so that a short write could not lose bytes.
        while off < bytes.len() {
            match rustix::io::write(&pair, &bytes[off..]) {
                Ok(n) => off += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    }
}

/// What the chord experiment measured: per size, ours and the floor (ns from due to the
/// last byte read), the output's counts.
#[derive(Debug)]
pub(super) struct Chords {
    /// `(size, ours, one write)`.
    samples: Vec<(usize, Vec<u64>, Vec<u64>)>,
    /// The output library's writes per chord on the cable (its count over the trials).
    writes_per_chord: f64,
    granted: String,
}

/// The chord experiment: for each size, `trials` chords through the output library and
/// as many as one write to a socket pair, alternating (A B A B), each due a few
/// milliseconds after it is set up, nothing else loaded.
pub(super) fn chords(trials: usize, notes: &mut Notes) -> Result<Chords, BenchError> {
    let io = |what: &str, e: &dyn std::fmt::Display| {
        BenchError::io(format!("midi chords: {what}"), std::io::Error::other(e.to_string()))
    };
    let name = unique_cable();
    let cable = CableIn::open(&name).map_err(|e| io("cable", &e))?;
    let (pair_tx, pair_rx) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| io("socketpair", &e))?;
    let (trial_tx, trial_rx) = std::sync::mpsc::channel::<ChordTrial>();
    let (result_tx, result_rx) = std::sync::mpsc::channel();
    let receiver = std::thread::Builder::new()
        .name("chord-rx".into())
        .spawn(move || chord_receiver(cable, pair_rx, trial_rx, result_tx))
        .map_err(|e| io("thread", &e))?;
    let (job_tx, job_rx) = std::sync::mpsc::channel::<(Time, Vec<u8>)>();
    let writer = std::thread::Builder::new()
        .name("chord-write".into())
        .spawn(move || chord_one_writer(pair_tx, job_rx))
        .map_err(|e| io("thread", &e))?;
    let device = CableOut::open(&name, None).map_err(|e| io("cable", &e))?;
    let options = OutputOptions {
        thread: Sched::Fixed.request(),
        timer_cpus: timer_cpus(Sched::Fixed),
        ..OutputOptions::default()
    };
    let output = Output::open(Box::new(device), options).map_err(|e| io("output", &e))?;
    let granted =
        output.granted().iter().map(|(role, g)| format!("{role}: {}", g.describe())).collect::<Vec<_>>().join(", ");
    let lead = Duration::from_millis(4);
    let mut samples = Vec::new();
    let mut failures = 0usize;
    let mut chords_sent = 0u64;
    let writes_before = output.stats().writes;
    for n in CHORD_SIZES {
        let bytes = chord_bytes(n);
        let (mut ours, mut one) = (Vec::with_capacity(trials), Vec::with_capacity(trials));
        // Two of each first, not counted: the receiver's and writers' first pages.
        for k in 0..2 * trials + 4 {
            let side = if k % 2 == 0 { ChordSide::Ours } else { ChordSide::OneWrite };
            let due = clock::now() + lead;
            let _ = trial_tx.send(ChordTrial { side, expect: bytes.clone(), due });
            match side {
                ChordSide::Ours => {
                    for i in 0..n {
                        let _ = output.put(chord_event(i), due);
                    }
                    chords_sent += 1;
                }
                ChordSide::OneWrite => {
                    let _ = job_tx.send((due, bytes.clone()));
                }
            }
            match result_rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Ok(ns)) if k >= 4 => match side {
                    ChordSide::Ours => ours.push(ns),
                    ChordSide::OneWrite => one.push(ns),
                },
                Ok(Ok(_)) => {}
                Ok(Err(why)) => {
                    failures += 1;
                    if failures <= 3 {
                        notes.push(format!("chord of {n}: {why}"));
                    }
                }
                Err(_) => {
                    notes.push(format!("chord of {n}: the receiver stopped answering"));
                    break;
                }
            }
            // A pause, so that chords do not meet in the queues.
            std::thread::sleep(Duration::from_millis(1));
        }
        samples.push((n, ours, one));
    }
    let stats = output.close(Close::Drain).stats;
    drop(trial_tx);
    drop(job_tx);
    let _ = receiver.join();
    let _ = writer.join();
    if failures > 0 {
        notes.push(format!("chords: {failures} trials failed (the first are above)"));
    }
    if stats.late > 0 {
        notes.push(format!("chords: {} events were put after their due time (the producer was late)", stats.late));
    }
    Ok(Chords { samples, writes_per_chord: (stats.writes - writes_before) as f64 / chords_sent.max(1) as f64, granted })
}

/// The chord experiment's rows, headlines and notes.
pub(super) fn report_chords(report: &mut Report, c: &Chords, notes: &mut Notes) {
    let us = |ns: u64| ns as f64 / 1000.0;
    for (n, ours, one) in &c.samples {
        for (who, v) in [("output library → cable", ours), ("one write → socket pair (floor)", one)] {
            if v.is_empty() {
                continue;
            }
            report.rows.push(
                recorder(v)
                    .row(format!("chord of {n} events: {who}"))
                    .with("measure", "due → last event read by the receiver")
                    .with("events", *n as u64)
                    .with("bytes", (*n * 3) as u64)
                    .to_value(),
            );
        }
    }
    let Some((_, ours, one)) = c.samples.iter().find(|(n, ..)| *n == CHORD_HEADLINE) else {
        notes.not_measured("the midi_chord256 headlines", "the chord experiment did not run");
        return;
    };
    if ours.is_empty() || one.is_empty() {
        notes.not_measured("the midi_chord256 headlines", "the 256-event chords did not arrive");
        return;
    }
    let (o, f) = (recorder(ours), recorder(one));
    let mut last = Headline::new(
        "midi_chord256_last_us",
        us(o.quantile(0.99)),
        us(f.quantile(0.99)),
        format!(
            "p99 over {} chords of 256 events due at one instant, due → last event read (receiver SCHED_FIFO {RECEIVER_PRIORITY}); peer: the same bytes, one write to a socket pair by a thread sleeping until the due time; the target is absolute: ours ≤ {CHORD_BUDGET_US} µs",
            ours.len()
        ),
        "us",
        Better::Lower,
    );
    last.target = Some(CHORD_BUDGET_US);
    last.met = Some(last.ours <= CHORD_BUDGET_US);
    report.headline.push(last);
    report.headline.push(
        Headline::new(
            "midi_chord256_vs_one_write",
            us(o.quantile(0.5)),
            us(f.quantile(0.5)),
            format!(
                "median over {} chords of 256 events (A B A B in one run): ours through the output library and the cable against one write of the same bytes to a socket pair by a thread of the same class sleeping until the due time",
                ours.len()
            ),
            "us",
            Better::Lower,
        )
        .with_target(CHORD_VS_ONE_WRITE),
    );
    notes.push(format!(
        "chords: {}; the output library wrote {:.2} times per chord (one write carries a whole instant); both sides include the wake-up at the due time; ours also the queue, the encoding and the cable's ring and wake-up",
        c.granted, c.writes_per_chord
    ));
}
