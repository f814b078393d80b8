//! A name server killed with `kill -9` under load, and started again: the clock and
//! MIDI servers register again by themselves, clients follow the new name server, and
//! no client sees more than one failed call per restart (issue 23, item 6).
//!
//! The servers are `ictus` processes; the clients are threads of this test, each in a
//! space of its own, looking the servers' names up and calling the clock as fast as
//! they can. No test asserts a duration: every wait is for an event, bounded by a
//! generous watchdog. The time from a new name server's start to every name being back
//! is printed, for the record.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ictus_clock_server::Client as ClockClient;
use ictus_ipc::Space;
use ictus_name_server::Client;
use ictus_testkit::{ictus_name_server, unique, wait_until, Proc, TempDir, WATCHDOG};

fn ictus() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ictus"))
}

/// A server process of the `ictus` binary, its standard error in `log`.
fn spawn_logged(what: &str, args: &[&std::ffi::OsStr], log: &Path) -> Proc {
    let mut cmd = Command::new(ictus());
    cmd.args(args).stdin(Stdio::null());
    Proc::spawn_logged(what, &mut cmd, log)
}

/// The registered names, or none if no name server answers.
fn names(socket: &Path) -> Vec<String> {
    let space = Space::new();
    Client::connect_socket(&space, socket).map(|c| c.list().unwrap_or_default()).unwrap_or_default()
}

/// What one client saw: failed calls, by restart round, and calls that succeeded after
/// each restart.
#[derive(Debug, Default)]
struct Seen {
    failures: Vec<(usize, String)>,
    successes: Vec<usize>,
}

/// A client: look up the clock and the MIDI server, read the clock, again and again,
/// until told to stop.
fn client(socket: PathBuf, midi: String, round: Arc<AtomicUsize>, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let space = Space::new();
    let ns = Client::connect_socket(&space, &socket).expect("connect").with_timeout(WATCHDOG);
    while !stop.load(Ordering::SeqCst) {
        let result: Result<(), String> = (|| {
            let clock = ns.lookup("clock").map_err(|e| e.to_string())?;
            let clock = ClockClient::from_right(&space, clock).with_timeout(WATCHDOG);
            clock.read().map_err(|e| e.to_string())?;
            let input = ns.lookup(&midi).map_err(|e| e.to_string())?;
            let _ = space.deallocate(input);
            Ok(())
        })();
        // Counted in the round in which the call ended: the round changes before a kill.
        let r = round.load(Ordering::SeqCst);
        let mut seen = seen.lock().unwrap();
        match result {
            Ok(()) => {
                if seen.successes.len() <= r {
                    seen.successes.resize(r + 1, 0);
                }
                seen.successes[r] += 1;
            }
            Err(e) => seen.failures.push((r, e)),
        }
    }
}

#[test]
fn servers_and_clients_live_through_name_server_restarts() {
    const CLIENTS: usize = 4;
    const RESTARTS: usize = 2;
    let dir = TempDir::new("restart");
    let socket = dir.join("ns.sock");
    let control = dir.join("clock-control.sock");
    let (clock_log, midi_log) = (dir.join("clock.log"), dir.join("midi.log"));
    let midi = unique("midi");
    let cable = format!("cable:{}", unique("restart"));

    let mut ns = ictus_name_server(ictus(), &socket);
    let _clock = spawn_logged(
        "ictus clock-server",
        &[
            "clock-server".as_ref(),
            "--name-server".as_ref(),
            socket.as_os_str(),
            "--control-socket".as_ref(),
            control.as_os_str(),
        ],
        &clock_log,
    );
    let _midi = spawn_logged(
        "ictus midi-server",
        &[
            "midi-server".as_ref(),
            "--timesharing".as_ref(),
            "--device".as_ref(),
            cable.as_ref(),
            "--name-server".as_ref(),
            socket.as_os_str(),
            "--name".as_ref(),
            midi.as_ref(),
        ],
        &midi_log,
    );
    wait_until("the clock and the MIDI server to register", || {
        let n = names(&socket);
        n.iter().any(|n| n == "clock") && n.contains(&midi)
    });

    let round = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Vec<Arc<Mutex<Seen>>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let threads: Vec<_> = seen
        .iter()
        .map(|s| {
            let (socket, midi, round, stop, s) =
                (socket.clone(), midi.clone(), Arc::clone(&round), Arc::clone(&stop), Arc::clone(s));
            std::thread::spawn(move || client(socket, midi, round, stop, s))
        })
        .collect();
    let calls = |s: &Mutex<Seen>, r: usize| s.lock().unwrap().successes.get(r).copied().unwrap_or(0);
    // Under load: every client is calling before the first kill.
    wait_until("every client to be calling", || seen.iter().all(|s| calls(s, 0) > 0));

    for r in 1..=RESTARTS {
        round.store(r, Ordering::SeqCst);
        ns.kill9();
        // The clients' calls meet a dead name server for a while.
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        ns = ictus_name_server(ictus(), &socket);
        wait_until("every name to be back", || {
            let n = names(&socket);
            n.iter().any(|n| n == "clock") && n.contains(&midi)
        });
        eprintln!("restart {r}: every name back {:?} after the new name server started", started.elapsed());
        // Every client calls the new server successfully before the next kill.
        wait_until("every client to succeed with the new name server", || seen.iter().all(|s| calls(s, r) > 0));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("a client panicked");
    }

    for (i, s) in seen.iter().enumerate() {
        let s = s.lock().unwrap();
        for r in 1..=RESTARTS {
            let failed: Vec<&String> = s.failures.iter().filter(|(fr, _)| *fr == r).map(|(_, e)| e).collect();
            assert!(failed.len() <= 1, "client {i} saw {} failed calls in restart {r}: {failed:?}", failed.len());
            assert!(s.successes[r] > 0, "client {i} made no successful call after restart {r}: {s:?}");
        }
        assert!(s.failures.iter().all(|(r, _)| *r > 0), "client {i} failed before any restart: {s:?}");
    }
    // One line each time the name server died, one each time the names were back.
    for (log, name) in [(&clock_log, "\"clock\""), (&midi_log, midi.as_str())] {
        let text = std::fs::read_to_string(log).unwrap();
        assert_eq!(text.matches("the name server died").count(), RESTARTS, "{text}");
        assert_eq!(
            text.lines().filter(|l| l.contains("again with the new name server") && l.contains(name)).count(),
            RESTARTS,
            "{text}"
        );
    }
    assert!(ns.terminate().success());
}
