//! Channels between processes, and processes that die: clients in other processes
//! (one of them unprivileged), a client killed with `kill -9` in the middle of writing
//! a frame, a server killed while its clients wait, a scribbling process among good
//! ones. Nothing may leak, nothing may hang, and every survivor must be told.
//!
//! Children are this test binary run again with `--exact child_…` and
//! `ICTUS_SHM_ROLE` set; without that variable the `child_…` functions return at once.
//! A child gets its first right as its bootstrap port and dies with its parent.
#![cfg(not(loom))] // the channels need the real atomics; `tests/loom.rs` is the model

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use ictus_ipc::{Disposition, Message, Name, PortArg, ReceiveOptions, Received, SendOptions, Space};
use ictus_shm::layout::REQ_HEAD;
use ictus_shm::{Client, CloseReason, Event, Next, RecvError, Server, ServerConfig, WaitConfig};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

const ROLE_ENV: &str = "ICTUS_SHM_ROLE";
const ARG_ENV: &str = "ICTUS_SHM_ARG";
/// Tag of the record a writer sends before it starts its endless frame.
const READY: u32 = 0xaaaa;
/// Tag of records the child server never answers.
const SILENT: u32 = 0x5151;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// This process's descriptors and channel mappings (after starting the process's
/// link watcher, which lives as long as the process).
fn resources() -> (BTreeMap<String, String>, usize) {
    ictus_shm::start_watcher().expect("watcher");
    let mut fds = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/fd").expect("fd dir").flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy().into_owned();
            if !(t.starts_with("/proc/") && t.ends_with("/fd")) {
                fds.insert(e.file_name().to_string_lossy().into_owned(), t);
            }
        }
    }
    (fds, ictus_shm::mappings_named("ictus-shm"))
}

#[track_caller]
fn assert_back_to(baseline: &(BTreeMap<String, String>, usize)) {
    let start = Instant::now();
    loop {
        let now = resources();
        if &now == baseline {
            return;
        }
        assert!(start.elapsed() < WATCHDOG, "leaked: before {baseline:?}\nafter {now:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn spawn(role: &str, arg: &str, boot: Option<(&Space, Name)>) -> Child {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", role, "--nocapture", "--test-threads=1"]).env(ROLE_ENV, role).env(ARG_ENV, arg);
    if let Some((space, name)) = boot {
        space.give_bootstrap(&mut cmd, name).expect("bootstrap");
    }
    cmd.spawn().expect("spawn child")
}

/// In a child: our role's argument, or `None` in the normal test run.
fn role(name: &str) -> Option<String> {
    if std::env::var(ROLE_ENV).ok()? != name {
        return None;
    }
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    Some(std::env::var(ARG_ENV).unwrap_or_default())
}

#[track_caller]
fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        if start.elapsed() > WATCHDOG {
            let _ = child.kill();
            panic!("child {} did not exit within the watchdog", child.id());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Serve (echo) until `done` says so with the events seen so far.
fn serve_until(server: &mut Server, events: &mut Vec<Event>, done: impl Fn(&[Event]) -> bool) {
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    while !done(events) {
        assert!(start.elapsed() < WATCHDOG, "server: not done within the watchdog; events {events:?}");
        server.wait(Some(Duration::from_millis(10))).expect("wait");
        while let Some(n) = server.try_next() {
            echo(n, &tx);
        }
        events.extend(rx.try_iter());
    }
}

fn count(events: &[Event], f: impl Fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| f(e)).count()
}

fn closed_gone(e: &Event) -> bool {
    matches!(e, Event::Closed { reason: CloseReason::PeerGone, .. })
}

// ----- children ------------------------------------------------------------------------

fn child_connect(slots: u32) -> Client {
    let space = Space::new();
    let service = space.take_bootstrap().expect("bootstrap").expect("a bootstrap right");
    Client::connect(&space, service, options(geometry(slots))).expect("connect")
}

/// `child_client rounds[,unprivileged]`: round trips, checked, then exit.
#[test]
fn child_client() {
    let Some(arg) = role("child_client") else { return };
    let mut parts = arg.split(',');
    let rounds: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    if parts.next() == Some("unprivileged") && rustix::process::geteuid().is_root() {
        // Drop to nobody before touching the channel: nothing here needs privileges.
        // SAFETY: plain system calls on this single-purpose child process.
        let ok = unsafe { libc::setresgid(65534, 65534, 65534) == 0 && libc::setresuid(65534, 65534, 65534) == 0 };
        assert!(ok, "dropping privileges");
        assert_eq!(rustix::process::geteuid().as_raw(), 65534);
    }
    let mut c = child_connect(2);
    for n in 0..rounds {
        let data = pattern((n as usize * 13) % 1500, n as u8);
        let (tag, back) = round_trip(&mut c, n, &data);
        assert_eq!((tag, back), (n + 1, data));
        if n % 10 == 0 {
            let frame = pattern(50_000, n as u8);
            let mut p = c.loan_pool(frame.len()).expect("pool loan");
            p.copy_from_slice(&frame);
            p.commit(n).expect("commit");
            assert_eq!(c.recv(Some(WATCHDOG)).expect("digest").to_vec(), digest(&frame));
        }
    }
    std::process::exit(0);
}

/// `child_writer`: announces itself, then writes a frame into a pool loan for ever.
#[test]
fn child_writer() {
    let Some(_) = role("child_writer") else { return };
    let mut c = child_connect(1);
    c.send(READY, b"ready").expect("send");
    let mut loan = c.loan_pool(60_000).expect("loan");
    let mut x = 0u8;
    loop {
        for b in loan.iter_mut() {
            *b = x;
        }
        x = x.wrapping_add(1);
    }
}

/// `child_evil`: scribbles a wild head, then waits to be told it was cut off.
#[test]
fn child_evil() {
    let Some(_) = role("child_evil") else { return };
    let mut c = child_connect(0);
    let (tag, _) = round_trip(&mut c, 1, b"innocent");
    assert_eq!(tag, 2);
    // A head from nowhere, left for the server to find when it next looks.
    c.scribble(REQ_HEAD, 1 << 50);
    let start = Instant::now();
    loop {
        match c.closed() {
            Some(CloseReason::CutOff(_)) => std::process::exit(0),
            Some(other) => panic!("closed for {other:?}"),
            None => {}
        }
        assert!(start.elapsed() < WATCHDOG, "never cut off");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `child_server`: serves, never answering `SILENT` records, until killed.
#[test]
fn child_server() {
    let Some(_) = role("child_server") else { return };
    let space = Space::new();
    let boot = space.take_bootstrap().expect("bootstrap").expect("a bootstrap right");
    let mut server = Server::new(&space, ServerConfig::default()).expect("server");
    let mut m = Message::new(1, Vec::new());
    m.ports.push(PortArg::new(server.service(), Disposition::MakeSend));
    space.send(boot, &mut m, SendOptions::default()).expect("hello");
    let (tx, _rx) = mpsc::channel();
    loop {
        server.wait(Some(Duration::from_millis(50))).expect("wait");
        while let Some(n) = server.try_next() {
            match n {
                Next::Record(r) if r.tag() == SILENT => {}
                n => echo(n, &tx),
            }
        }
    }
}

// ----- tests ---------------------------------------------------------------------------

#[test]
fn clients_in_other_processes_round_trip_and_close_cleanly() {
    let _s = serial();
    let space = Space::new();
    let mut server = Server::new(&space, ServerConfig::default()).expect("server");
    let baseline = resources();
    let mut children: Vec<Child> = ["200", "200", "200,unprivileged"]
        .iter()
        .map(|arg| spawn("child_client", arg, Some((&space, server.service()))))
        .collect();
    let mut events = Vec::new();
    serve_until(&mut server, &mut events, |e| count(e, closed_gone) == 3);
    assert_eq!(count(&events, |e| matches!(e, Event::Opened { .. })), 3);
    for c in &mut children {
        assert!(wait_exit(c).success());
    }
    // The unprivileged child's requests carried its own identity.
    let uids: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::Opened { credentials, .. } => Some(credentials.uid),
            _ => None,
        })
        .collect();
    if rustix::process::geteuid().is_root() {
        assert!(uids.contains(&65534), "{uids:?}");
    }
    assert!(server.clients().is_empty());
    assert_back_to(&baseline);
}

#[test]
fn a_client_killed_mid_write_leaves_nothing() {
    let _s = serial();
    let space = Space::new();
    let mut server = Server::new(&space, ServerConfig::default()).expect("server");
    let baseline = resources();
    let mut child = spawn("child_writer", "", Some((&space, server.service())));
    // Serve until the writer says it is writing.
    let start = Instant::now();
    let mut ready = false;
    let mut events = Vec::new();
    while !ready {
        assert!(start.elapsed() < WATCHDOG, "writer never ready");
        server.wait(Some(Duration::from_millis(10))).expect("wait");
        while let Some(n) = server.try_next() {
            match n {
                Next::Record(r) => ready |= r.tag() == READY,
                Next::Event(e) => events.push(e),
            }
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    child.kill().expect("kill -9");
    let status = wait_exit(&mut child);
    assert!(!status.success());
    serve_until(&mut server, &mut events, |e| count(e, closed_gone) == 1);
    assert!(server.clients().is_empty());
    assert_back_to(&baseline);
}

#[test]
fn a_killed_server_wakes_every_waiting_client() {
    let _s = serial();
    let baseline = resources();
    let space = Space::new();
    let boot = space.allocate_port().expect("port");
    let mut child = spawn("child_server", "", Some((&space, boot)));
    let mut hello = Received::new();
    space.receive(boot, &mut hello, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() }).expect("hello");
    let service = hello.ports[0].name;
    let blocking = WaitConfig { spin: Duration::ZERO, liveness: Duration::from_secs(60) };
    let mut clients: Vec<Client> = (0..3)
        .map(|i| {
            let mut opts = options(geometry(0));
            if i < 2 {
                opts.wait = blocking;
            }
            Client::connect(&space, service, opts).expect("connect")
        })
        .collect();
    for c in &mut clients {
        assert_eq!(round_trip(c, 1, b"alive").0, 2);
    }
    let (tx, rx) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    let mut threads = Vec::new();
    let poller = clients.pop().expect("three");
    for mut c in clients {
        let tx = tx.clone();
        let tid_tx = tid_tx.clone();
        threads.push(std::thread::spawn(move || {
            tid_tx.send(ictus_testkit::gettid()).expect("tid");
            c.send(SILENT, b"never answered").expect("send");
            let r = c.recv(None).map(|_| ());
            tx.send(r).expect("report");
        }));
    }
    {
        let tx = tx.clone();
        let tid_tx = tid_tx.clone();
        threads.push(std::thread::spawn(move || {
            tid_tx.send(ictus_testkit::gettid()).expect("tid");
            let mut c = poller;
            c.send(SILENT, b"never answered").expect("send");
            // The descriptor may fire for nothing (a wake-up for room made); wait
            // again until a reply or an error.
            let r = loop {
                if c.arm() {
                    let mut fds = [PollFd::new(&c, PollFlags::IN)];
                    let ts = Timespec { tv_sec: 60, tv_nsec: 0 };
                    poll(&mut fds, Some(&ts)).expect("poll");
                }
                match c.try_recv() {
                    Ok(None) => continue,
                    Ok(Some(_)) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            tx.send(r).expect("report");
        }));
    }
    // Let them block, then kill the server.
    for _ in 0..3 {
        let tid = tid_rx.recv_timeout(WATCHDOG).expect("a client thread starts");
        assert!(ictus_testkit::wait_thread_asleep(tid), "a client never blocked");
    }
    child.kill().expect("kill -9");
    wait_exit(&mut child);
    for _ in 0..3 {
        let r = rx.recv_timeout(WATCHDOG).expect("every waiting client returns within the watchdog");
        assert_eq!(r, Err(RecvError::Closed(CloseReason::PeerGone)));
    }
    for t in threads {
        t.join().expect("client thread");
    }
    let _ = space.deallocate(service);
    let _ = space.destroy(boot);
    drop(hello);
    drop(space);
    assert_back_to(&baseline);
}

#[test]
fn a_scribbling_process_is_cut_off_while_others_run() {
    let _s = serial();
    let space = Space::new();
    let mut server = Server::new(&space, ServerConfig::default()).expect("server");
    let mut good: Vec<Child> = (0..2).map(|_| spawn("child_client", "300", Some((&space, server.service())))).collect();
    let mut evil = spawn("child_evil", "", Some((&space, server.service())));
    let mut events = Vec::new();
    serve_until(&mut server, &mut events, |e| {
        count(e, closed_gone) == 2
            && count(e, |e| matches!(e, Event::Closed { reason: CloseReason::Corrupt(_), .. })) == 1
    });
    for c in &mut good {
        assert!(wait_exit(c).success(), "a good client noticed");
    }
    assert!(wait_exit(&mut evil).success(), "the evil client was told");
    assert_eq!(server.stats().cut_off, 1);
}
