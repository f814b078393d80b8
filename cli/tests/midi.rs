//! `ictus midi …` as a process: decode of files, standard input and a live cable; the
//! demo file played onto a cable; conducting with taps from a cable; bad files.
//!
//! No test asserts a duration; every wait is bounded by a watchdog.

use std::io::{self, BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ictus_midi::device::cable::{CableIn, CableOut, MAX_DATAGRAM};
use ictus_midi::device::{Device, OpenError};
use ictus_midi::parse::{Kind, Message, Parser};
use ictus_midi::smf::DEMO_MELODY;
use ictus_testkit::{unique, Proc, TempDir, WATCHDOG};

fn ictus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ictus"))
}

fn lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout).lines().map(|l| serde_json::from_str(l).expect(l)).collect()
}

const CAPTURE: [u8; 14] = [0x90, 60, 100, 62, 101, 0xF8, 0x05, 0xF0, 1, 2, 0xF7, 0xF4, 0xC1, 7];

fn check_capture(v: &[serde_json::Value]) {
    let kinds: Vec<&str> = v.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["note_on", "note_on", "clock", "sysex", "program_change"]);
    assert_eq!(v[1]["bytes"], serde_json::json!([144, 62, 101]), "running status restored");
    assert_eq!(v[1]["channel"], 0);
    assert_eq!(v[4]["channel"], 1);
    assert!(v[2].get("channel").is_none());
}

#[test]
fn decode_a_file_with_wire_timestamps() {
    let dir = TempDir::new("midi-cli");
    let f = dir.join("capture.mid.raw");
    std::fs::write(&f, CAPTURE).unwrap();
    let out = ictus().args(["midi", "decode"]).arg(&f).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = lines(&out.stdout);
    check_capture(&v);
    // t = offset of the first byte × 320 µs.
    let ts: Vec<u64> = v.iter().map(|o| o["t"].as_u64().unwrap()).collect();
    assert_eq!(ts, [0, 3 * 320_000, 5 * 320_000, 7 * 320_000, 12 * 320_000]);
    let err = String::from_utf8_lossy(&out.stderr);
    // 0x05 is a stray data byte (after the clock, running status is still note on —
    // so it starts a note that F0 cuts short), F4 is undefined.
    assert!(err.contains("5 messages from 14 bytes"), "{err}");
    assert!(err.contains("undefined status 1"), "{err}");
    assert!(err.contains("incomplete 1"), "{err}");
}

#[test]
fn decode_standard_input_and_stop_at_a_count() {
    let mut c = ictus()
        .args(["midi", "decode", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(&CAPTURE).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success());
    check_capture(&lines(&out.stdout));

    let mut c = ictus()
        .args(["midi", "decode", "--count", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(&CAPTURE).unwrap();
    let out = c.wait_with_output().unwrap();
    assert_eq!(lines(&out.stdout).len(), 2);
}

#[test]
fn decode_garbage_never_fails_and_counts_it() {
    let bytes: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut c = ictus()
        .args(["midi", "decode", "--max-sysex", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("from 5000 bytes"), "{err}");
    for o in lines(&out.stdout) {
        assert!(o["bytes"].as_array().unwrap().len() <= 16);
    }
}

/// Wait until someone holds the receiving end of cable `name`.
fn wait_held(name: &str) {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        match CableIn::open(name) {
            Err(OpenError::CableBusy(_)) => return,
            Ok(c) => drop(c),
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "nobody took cable {name}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn decode_a_live_cable() {
    let name = unique("live");
    // It ends by itself: after three messages, or after a minute without input.
    let c = ictus()
        .args(["midi", "decode", "--count", "3", "--idle-timeout", "60", "--device"])
        .arg(format!("cable:{name}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_held(&name);
    let mut tx = CableOut::open(&name, None).unwrap();
    let before = ictus_rt::clock::now().as_nanos();
    tx.write(&[0x90, 60, 100, 0xFE, 0xB0, 7, 100]).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = lines(&out.stdout);
    let kinds: Vec<&str> = v.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["note_on", "active_sensing", "control_change"]);
    // Arrival times on CLOCK_MONOTONIC, after we sent.
    assert!(v.iter().all(|o| o["t"].as_u64().unwrap() >= before));
}

/// Collect `n` messages from cable `name` on a thread.
fn collect(name: &str, n: usize) -> std::thread::JoinHandle<Vec<Message>> {
    let mut rx = CableIn::open(name).unwrap();
    std::thread::spawn(move || {
        let deadline = Instant::now() + WATCHDOG;
        let mut p = Parser::new();
        let mut got = Vec::new();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while got.len() < n {
            assert!(Instant::now() < deadline, "only {} of {n} came", got.len());
            match rx.read(&mut buf, Some(Duration::from_secs(1))) {
                Ok(k) => p.feed_slice(&buf[..k], ictus_rt::clock::now(), &mut got),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => panic!("{e}"),
            }
        }
        got
    })
}

fn note_ons(ms: &[Message]) -> Vec<u8> {
    ms.iter().filter(|m| m.kind() == Kind::NoteOn).map(|m| m.bytes()[1]).collect()
}

fn demo_keys() -> Vec<u8> {
    let mut k = DEMO_MELODY.to_vec();
    k.extend([60, 64, 67]);
    k
}

/// Write the demo with `make-demo`, play it onto a cable with `flags`, and check that
/// every note arrived once, in order.
fn make_demo_and_play_it(flags: &[&str]) {
    let dir = TempDir::new("midi-cli");
    let f = dir.join("demo.mid");
    let out = ictus().args(["midi", "make-demo"]).arg(&f).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let score = ictus_midi::smf::Score::load(&f).unwrap();
    let name = unique("play");
    let reader = collect(&name, score.events.len());
    let out = ictus()
        .args(["midi", "play", "--timesharing", "--speed", "8"])
        .args(flags)
        .arg("--device")
        .arg(format!("cable:{name}"))
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("sent {} messages", score.events.len())), "{err}");
    let got = reader.join().unwrap();
    assert_eq!(note_ons(&got), demo_keys());
}

#[test]
fn make_demo_then_play_it_onto_a_cable() {
    make_demo_and_play_it(&[]);
}

#[test]
fn play_with_a_timer_thread_on_every_cpu() {
    make_demo_and_play_it(&["--timer-per-cpu"]);
}

#[test]
fn play_with_nobody_listening_says_so() {
    let dir = TempDir::new("midi-cli");
    let f = dir.join("demo.mid");
    ictus_midi::smf::write_demo(&f).unwrap();
    let out = ictus()
        .args(["midi", "play", "--timesharing", "--speed", "50", "--device"])
        .arg(format!("cable:{}", unique("nobody")))
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("went nowhere"), "{err}");
}

#[test]
fn bad_files_and_devices_give_clear_errors() {
    let dir = TempDir::new("midi-cli");
    let f = dir.join("bad.mid");
    std::fs::write(&f, b"MThd\0\0\0\x06\0\x01\0\x01").unwrap();
    let out = ictus().args(["midi", "play"]).arg(&f).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a valid Standard MIDI File"), "{err}");

    let out = ictus().args(["midi", "play", "/nonexistent/song.mid"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/song.mid"));

    ictus_midi::smf::write_demo(&f).unwrap();
    let out = ictus().args(["midi", "play", "--device", "/dev/snd/midiC9D9"]).arg(&f).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("midiC9D9") && err.contains("raw MIDI"), "{err}");

    let out = ictus().args(["midi", "play", "--device", "usb:3"]).arg(&f).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad device"));
}

#[test]
fn conduct_with_taps_from_a_cable() {
    let dir = TempDir::new("midi-cli");
    let f = dir.join("demo.mid");
    ictus_midi::smf::write_demo(&f).unwrap();
    let n = ictus_midi::smf::Score::load(&f).unwrap().events.len();
    let out_name = unique("conduct-out");
    let tap_name = unique("conduct-taps");
    let reader = collect(&out_name, n);
    let mut c = Proc::spawn(
        "ictus midi conduct",
        ictus()
            .args(["midi", "conduct", "--timesharing", "--device"])
            .arg(format!("cable:{out_name}"))
            .arg("--tap-device")
            .arg(format!("cable:{tap_name}"))
            .arg(&f)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    wait_held(&tap_name);
    let mut tx = CableOut::open(&tap_name, None).unwrap();
    // Tap every 80 ms until the music is over (or the watchdog).
    let stderr = c.child().stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        for l in BufReader::new(stderr).lines() {
            s.push_str(&l.unwrap_or_default());
            s.push('\n');
        }
        s
    });
    let deadline = Instant::now() + WATCHDOG;
    while c.try_wait().is_none() {
        assert!(Instant::now() < deadline, "conducting did not finish");
        tx.write(&[0x90, 40, 90]).unwrap();
        std::thread::sleep(Duration::from_millis(80));
    }
    assert!(c.wait().success());
    let log = log.join().unwrap();
    assert!(log.contains(&format!("{n} of {n} messages conducted")), "{log}");
    assert!(log.contains("tempo"), "{log}");
    assert_eq!(note_ons(&reader.join().unwrap()), demo_keys());
}

/// A damaged file (issue 23, item 5): refused with one line naming the byte offset and
/// what to do, exit status non-zero; with --lenient, what is there plays, with a warning.
#[test]
fn a_cut_file_is_refused_naming_the_offset_and_plays_with_lenient() {
    let dir = TempDir::new("midi-cli");
    let f = dir.join("cut.mid");
    let demo = ictus_midi::smf::demo_bytes();
    std::fs::write(&f, &demo[..200]).unwrap();
    let out = ictus()
        .args(["midi", "play", "--timesharing", "--device"])
        .arg(format!("cable:{}", unique("cut")))
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("cut.mid") && err.contains("cut short at byte 200") && err.contains("--lenient"), "{err}");
    let name = unique("lenient");
    let out = ictus()
        .args(["midi", "play", "--lenient", "--timesharing", "--speed", "50", "--device"])
        .arg(format!("cable:{name}"))
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("warning") && err.contains("byte 200"), "{err}");
}
