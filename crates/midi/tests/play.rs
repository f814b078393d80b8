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

/// A format 1 file that starts as game soundtracks do: a GM reset, then every controller
/// of all 16 channels set at time 0, and the first chord — 229 events at its first
/// instant — then a few bars of notes.
fn reset_heavy_file() -> Vec<u8> {
    use midly::num::{u14, u15, u24, u28, u4, u7};
    use midly::{Format, Header, MetaMessage, MidiMessage, PitchBend, Smf, Timing, TrackEvent, TrackEventKind};
    let ev = |delta: u32, kind: TrackEventKind<'static>| TrackEvent { delta: u28::new(delta), kind };
    let mut smf = Smf::new(Header::new(Format::Parallel, Timing::Metrical(u15::new(96))));
    smf.tracks.push(vec![
        ev(0, TrackEventKind::Meta(MetaMessage::Tempo(u24::new(500_000)))),
        ev(0, TrackEventKind::SysEx(&[0x7E, 0x7F, 0x09, 0x01, 0xF7])),
        ev(0, TrackEventKind::Meta(MetaMessage::EndOfTrack)),
    ]);
    for ch in 0..16u8 {
        let midi = |delta: u32, message: MidiMessage| ev(delta, TrackEventKind::Midi { channel: u4::new(ch), message });
        let cc = |c: u8, v: u8| midi(0, MidiMessage::Controller { controller: u7::new(c), value: u7::new(v) });
        let mut t = vec![
            cc(121, 0),
            cc(0, 0),
            cc(32, 0),
            midi(0, MidiMessage::ProgramChange { program: u7::new(ch * 7 % 128) }),
            cc(7, 100),
            cc(10, 64),
            cc(11, 127),
            cc(91, 40),
            cc(93, 0),
            cc(101, 0),
            cc(100, 0),
            cc(6, 2),
            cc(38, 0),
            midi(0, MidiMessage::PitchBend { bend: PitchBend(u14::new(0x2000)) }),
        ];
        let key = |k: u8| u7::new(36 + ch * 3 + k);
        if ch == 0 {
            // The first chord, at the same instant as the resets.
            for k in [0, 4, 7, 12] {
                t.push(midi(0, MidiMessage::NoteOn { key: key(k), vel: u7::new(90) }));
            }
        }
        for beat in 0..8u8 {
            t.push(midi(
                if beat == 0 && ch == 0 { 96 } else { 48 },
                MidiMessage::NoteOn { key: key(beat % 5), vel: u7::new(80) },
            ));
            t.push(midi(48, MidiMessage::NoteOff { key: key(beat % 5), vel: u7::new(0) }));
        }
        t.push(ev(0, TrackEventKind::Meta(MetaMessage::EndOfTrack)));
        smf.tracks.push(t);
    }
    let mut out = Vec::new();
    smf.write_std(&mut out).unwrap();
    out
}

/// Issue 25: a file whose first instant has 229 events plays onto a cable byte for byte,
/// each instant in one write.
#[test]
fn a_file_with_a_229_event_first_instant_arrives_byte_for_byte() {
    let score = Score::parse(&reset_heavy_file()).unwrap();
    let first = score.events.iter().filter(|e| e.tick == 0).count();
    assert_eq!(first, 229);
    let want: Vec<u8> = score.events.iter().flat_map(|e| e.message.bytes().to_vec()).collect();
    let name = unique("reset-heavy");
    let mut rx = CableIn::open(&name).unwrap();
    let n = want.len();
    let reader = std::thread::spawn(move || {
        let deadline = now() + WATCHDOG;
        let mut got = Vec::new();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while got.len() < n {
            assert!(now() < deadline, "only {} of {n} bytes came", got.len());
            match rx.read(&mut buf, Some(Duration::from_secs(1))) {
                Ok(k) => got.extend_from_slice(&buf[..k]),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => panic!("{e}"),
            }
        }
        got
    });
    let out = Output::open(Box::new(CableOut::open(&name, None).unwrap()), OutputOptions::timesharing()).unwrap();
    play(&score, &out, now() + Duration::from_millis(100), 4.0).unwrap();
    let closed = out.close(Close::Drain);
    assert_eq!(reader.join().unwrap(), want, "not byte for byte");
    assert_eq!(closed.stats.sent, score.events.len() as u64);
    let mut instants: Vec<u64> = score.events.iter().map(|e| e.tick).collect();
    instants.dedup();
    assert!(
        closed.stats.writes <= instants.len() as u64,
        "{} writes for {} instants",
        closed.stats.writes,
        instants.len()
    );
}
