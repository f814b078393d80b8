//! Standard MIDI File playback and conducting through the output library onto the
//! virtual cable: every note arrives, in order, never before its time.

use std::io;
use std::time::Duration;

use ictus_midi::device::cable::{CableIn, CableOut, MAX_DATAGRAM};
use ictus_midi::device::Device;
use ictus_midi::output::{Close, Output, OutputOptions};
use ictus_midi::parse::{Kind, Message, Parser};
use ictus_midi::play::{conduct, device_taps, play, ConductEvent};
use ictus_midi::smf::{demo_bytes, Score, DEMO_MELODY};
use ictus_rt::Time;

const WATCHDOG: Duration = Duration::from_secs(60);

fn now() -> Time {
    ictus_rt::clock::now()
}

fn unique(tag: &str) -> String {
    format!("play-{tag}-{}", std::process::id())
}

/// Reads messages on its own thread until `n` have come.
fn collect(name: &str, n: usize) -> std::thread::JoinHandle<Vec<(Time, Message)>> {
    let mut rx = CableIn::open(name).unwrap();
    std::thread::spawn(move || {
        let deadline = now() + WATCHDOG;
        let mut p = Parser::new();
        let mut got = Vec::new();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while got.len() < n {
            assert!(now() < deadline, "only {} of {n} messages came: {got:?}", got.len());
            match rx.read(&mut buf, Some(Duration::from_secs(1))) {
                Ok(k) => {
                    let t = now();
                    for &b in &buf[..k] {
                        got.extend(p.feed(b, t).map(|m| (t, m)));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => panic!("{e}"),
            }
        }
        got
    })
}

fn expected_keys() -> Vec<u8> {
    let mut keys = DEMO_MELODY.to_vec();
    keys.extend([60, 64, 67]);
    keys
}

fn note_on_keys(got: &[(Time, Message)]) -> Vec<u8> {
    got.iter().filter(|(_, m)| m.kind() == Kind::NoteOn).map(|(_, m)| m.bytes()[1]).collect()
}

#[test]
fn the_demo_file_plays_onto_the_cable_in_order_and_on_time() {
    let score = Score::parse(&demo_bytes()).unwrap();
    let name = unique("demo");
    let reader = collect(&name, score.events.len());
    let out = Output::open(Box::new(CableOut::open(&name, None).unwrap()), OutputOptions::timesharing()).unwrap();
    let speed = 8.0;
    let start = now() + Duration::from_millis(50);
    assert_eq!(play(&score, &out, start, speed).unwrap(), score.events.len());
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.sent, score.events.len() as u64);
    assert_eq!(closed.stats.late + closed.stats.out_of_order, 0);
    let got = reader.join().unwrap();
    // The same messages, in the file's order.
    let sent: Vec<&[u8]> = got.iter().map(|(_, m)| m.bytes()).collect();
    let want: Vec<&[u8]> = score.events.iter().map(|e| e.message.bytes()).collect();
    assert_eq!(sent, want);
    assert_eq!(note_on_keys(&got), expected_keys());
    // None before its time (tempo map applied: the ninth note is at 4 s / speed).
    for ((arrived, m), (at, _)) in got.iter().zip(score.timed()) {
        let due = start + at.div_f64(speed);
        assert!(*arrived >= due, "{m:?} arrived at {arrived}, due {due}");
    }
}

#[test]
fn conducting_with_taps_from_a_midi_input_plays_every_note_in_order() {
    let score = Score::parse(&demo_bytes()).unwrap();
    let name = unique("conduct-out");
    let taps_name = unique("conduct-taps");
    let reader = collect(&name, score.events.len());
    let out = Output::open(Box::new(CableOut::open(&name, None).unwrap()), OutputOptions::timesharing()).unwrap();
    // Taps come as note-ons on another cable, every 100 ms, from another thread.
    let (taps, tap_thread) = device_taps(Box::new(CableIn::open(&taps_name).unwrap())).unwrap();
    let tapper = std::thread::spawn(move || {
        let mut tx = CableOut::open(&taps_name, None).unwrap();
        for i in 0..40u8 {
            // A note off between taps is not a tap.
            tx.write(&[0x99, 36, 100, 0x89, 36, 0]).unwrap();
            let _ = i;
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut events = Vec::new();
    let n = conduct(&score, &out, &taps, |e| events.push(e)).unwrap();
    assert_eq!(n, score.events.len());
    let closed = out.close(Close::Drain);
    assert_eq!(closed.stats.sent, score.events.len() as u64);
    assert_eq!(closed.stats.out_of_order, 0, "conducted times never go backwards");
    let got = reader.join().unwrap();
    assert_eq!(note_on_keys(&got), expected_keys());
    tapper.join().unwrap();
    drop(tap_thread);
    // Taps were taken, and the tempo rose above the file's 120 beats a minute.
    let bpms: Vec<f64> =
        events.iter().filter_map(|e| if let ConductEvent::Tap { bpm, .. } = e { Some(*bpm) } else { None }).collect();
    assert!(bpms.len() >= 2, "{events:?}");
    assert!(bpms.last().unwrap() > &120.0, "{bpms:?}");
}
