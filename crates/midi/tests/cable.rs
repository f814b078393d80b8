//! The virtual cable between processes: bytes cross in order (paced and not), a
//! receiver killed with `kill -9` leaves nothing behind, and another user's bytes are
//! refused.
//!
//! Child processes are this test binary run again with `--exact child_role` and a role
//! in the environment. No test asserts a duration; waits are bounded by a watchdog.

use std::io::{self, BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ictus_midi::device::cable::{CableIn, CableOut, MAX_DATAGRAM, WIRE_BYTE_TIME};
use ictus_midi::device::{Device, OpenError};
use ictus_midi::parse::{Kind, Message, Parser};
use ictus_rt::Time;

const WATCHDOG: Duration = Duration::from_secs(60);
const ROLE_ENV: &str = "ICTUS_MIDI_CABLE_TEST_ROLE";

fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("x-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn child(role: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_role", "--nocapture", "--test-threads=1"]).env(ROLE_ENV, role);
    cmd
}

/// A child killed if the test ends first.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The bytes the sending child writes: every kind of message, a sysex, real-time bytes.
fn song() -> Vec<u8> {
    let mut b = Vec::new();
    for i in 0..50u8 {
        b.extend([0x90 | (i % 16), i, 100, 0xF8, 0x80 | (i % 16), i, 0]);
    }
    b.extend([0xF0, 0x7E, 0x7F, 0x09, 0x01, 0xF7, 0xC0, 5, 0xE0, 0, 0x40, 0xFC]);
    b
}

fn receive(rx: &mut CableIn, n: usize) -> Vec<(Time, Message)> {
    let deadline = ictus_rt::clock::now() + WATCHDOG;
    let mut p = Parser::new();
    let mut got = Vec::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while got.len() < n {
        assert!(ictus_rt::clock::now() < deadline, "only {} of {n} messages came", got.len());
        match rx.read(&mut buf, Some(Duration::from_secs(1))) {
            Ok(k) => {
                let t = ictus_rt::clock::now();
                for &b in &buf[..k] {
                    got.extend(p.feed(b, t).map(|m| (t, m)));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
            Err(e) => panic!("{e}"),
        }
    }
    got
}

fn expected() -> Vec<Message> {
    let mut p = Parser::new();
    let mut out = Vec::new();
    p.feed_slice(&song(), Time::ZERO, &mut out);
    out
}

fn send_song(name: &str, paced: bool) {
    let mut tx = CableOut::open(name, paced.then_some(WIRE_BYTE_TIME)).unwrap();
    let bytes = song();
    let mut off = 0;
    while off < bytes.len() {
        // Whole messages per write when unpaced (7 bytes), so the receiver's queue fills
        // and this side meets WouldBlock too.
        let end = (off + 7).min(bytes.len());
        match tx.write(&bytes[off..end]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(tx.lost_bytes(), 0, "the receiver was there all along");
}

#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    let (what, name) = role.split_once(':').unwrap();
    match what {
        "send" => send_song(name, false),
        "send-paced" => send_song(name, true),
        "hold" => {
            let _rx = CableIn::open(name).unwrap();
            println!("ready");
            std::thread::sleep(WATCHDOG);
        }
        "send-to-root" => {
            let mut tx = CableOut::open_owned_by(name, 0, None).unwrap();
            assert!(tx.is_plugged(), "root's receiver must be reachable");
            assert_eq!(tx.write(&[0x90, 1, 2]).unwrap(), 3);
            println!("sent");
        }
        other => panic!("unknown role {other}"),
    }
}

fn cross_process(paced: bool) {
    let name = unique(if paced { "paced" } else { "plain" });
    let mut rx = CableIn::open(&name).unwrap();
    let t0 = ictus_rt::clock::now();
    let mut c = Proc(
        child(&format!("{}:{name}", if paced { "send-paced" } else { "send" })).stdout(Stdio::null()).spawn().unwrap(),
    );
    let want = expected();
    let got = receive(&mut rx, want.len());
    let kinds: Vec<(Kind, Vec<u8>)> = got.iter().map(|(_, m)| (m.kind(), m.bytes().to_vec())).collect();
    let want_kinds: Vec<(Kind, Vec<u8>)> = want.iter().map(|m| (m.kind(), m.bytes().to_vec())).collect();
    assert_eq!(kinds, want_kinds);
    assert!(c.0.wait().unwrap().success());
    if paced {
        // The last byte cannot come before the wire could have carried them all.
        let last = got.last().unwrap().0;
        let floor = t0 + WIRE_BYTE_TIME * song().len() as u32;
        assert!(last >= floor, "{} bytes arrived by {last}, before {floor}", song().len());
    }
}

#[test]
fn messages_cross_between_processes_in_order() {
    cross_process(false);
}

#[test]
fn paced_messages_cross_between_processes_at_the_wire_pace() {
    cross_process(true);
}

#[test]
fn a_receiver_killed_with_sigkill_leaves_nothing_behind() {
    let name = unique("kill");
    let mut c = Proc(child(&format!("hold:{name}")).stdout(Stdio::piped()).spawn().unwrap());
    // libtest prints its own lines first; wait for the child's.
    let mut out = BufReader::new(c.0.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended before it was ready");
    }
    assert!(matches!(CableIn::open(&name), Err(OpenError::CableBusy(_))));
    // A sender now reaches the child's receiver.
    let mut tx = CableOut::open(&name, None).unwrap();
    assert!(tx.is_plugged());
    rustix::process::kill_process(rustix::process::Pid::from_child(&c.0), rustix::process::Signal::KILL).unwrap();
    c.0.wait().unwrap();
    // No file, no lock: the name is free at once, and the sender finds the new receiver.
    let mut rx = CableIn::open(&name).unwrap();
    tx.write(&[0xFA]).unwrap();
    let got = receive(&mut rx, 1);
    assert_eq!(got[0].1.kind(), Kind::Start);
}

#[test]
fn another_users_bytes_are_refused() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: sending as uid 65534 needs root (this run is unprivileged)");
        return;
    }
    let name = unique("refuse");
    let mut rx = CableIn::open(&name).unwrap();
    let mut cmd = child(&format!("send-to-root:{name}"));
    std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
    std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("sent"));
    // The datagram is in the queue already (the child finished sending); it is dropped.
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let e = rx.read(&mut buf, Some(Duration::from_millis(100))).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert_eq!(rx.refused_bytes(), 3);
}
