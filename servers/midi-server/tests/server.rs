//! The MIDI input server between processes: the server on a virtual cable in one
//! process, a writer putting bytes on the cable in another, clients in a third (and in
//! this one); clients and the server killed with `kill -9`.
//!
//! Children are this test binary run again with `--exact child_…` and
//! `ICTUS_MIDI_TEST_ROLE` set; without it the `child_…` functions return at once. A
//! child dies with its parent (`PR_SET_PDEATHSIG`). Every wait is bounded by a generous
//! watchdog and waits for an event; no test asserts a duration.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ictus_idl::SendRight;
use ictus_ipc::{Message as IpcMessage, SendOptions, Space};
use ictus_midi::device::cable::CableOut;
use ictus_midi::device::Device;
use ictus_midi::Kind;
use ictus_midi_server::client::Input;
use ictus_midi_server::protocol::{Class, InputStats, MidiError, MidiInputClient};
use ictus_midi_server::server::{self, Options};
use ictus_midi_server::InputError;
use ictus_testkit::{unique, NameServer, Proc, Role, WATCHDOG};

const ROLE: Role = Role { env: "ICTUS_MIDI_TEST_ROLE" };
const CABLE_ENV: &str = "ICTUS_MIDI_TEST_CABLE";
const NS_ENV: &str = "ICTUS_MIDI_TEST_NS";
const NAME_ENV: &str = "ICTUS_MIDI_TEST_NAME";
const BYTES_ENV: &str = "ICTUS_MIDI_TEST_BYTES";

/// The test stream: running status, a clock inside a sysex, stray and undefined bytes,
/// active sensing inside a control change, a sysex ended by a note off.
const STREAM: &[u8] = &[
    0x90, 60, 100, 61, 101, // note on, then one by running status
    0xF0, 0x7D, 1, 2, 0xF8, 3, 0xF7, // sysex with a clock inside
    0x05, 0x06, // stray data (the sysex cancelled running status)
    0xF4, // undefined
    0xB0, 7, 0xFE, 100, // control change with active sensing inside
    0xF0, 0x7D, 9, 0x80, 60, 0, // sysex ended by a note off
    0xF0, 0x7E, 0xF7, // another sysex
];

fn expected_normal() -> Vec<(Kind, Vec<u8>)> {
    vec![
        (Kind::NoteOn, vec![0x90, 60, 100]),
        (Kind::NoteOn, vec![0x90, 61, 101]),
        (Kind::Clock, vec![0xF8]),
        (Kind::ActiveSensing, vec![0xFE]),
        (Kind::ControlChange, vec![0xB0, 7, 100]),
        (Kind::NoteOff, vec![0x80, 60, 0]),
    ]
}

fn expected_sysex() -> Vec<(Kind, Vec<u8>)> {
    vec![
        (Kind::Sysex, vec![0xF0, 0x7D, 1, 2, 3, 0xF7]),
        (Kind::SysexUnterminated, vec![0xF0, 0x7D, 9]),
        (Kind::Sysex, vec![0xF0, 0x7E, 0xF7]),
    ]
}

// ----- children -------------------------------------------------------------------

fn child_role(role: &str) -> bool {
    ROLE.current().as_deref() == Some(role)
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// This test binary's test `test` in `role`, with `vars`, changed by `tweak`; killed
/// and reaped if the test ends first.
fn spawn_role(test: &str, role: &str, vars: &[(&str, &str)], tweak: impl FnOnce(&mut Command)) -> Proc {
    let mut cmd = ROLE.command(test, role);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    tweak(&mut cmd);
    Proc::spawn(role, &mut cmd)
}

/// The server child: `ictus midi-server` on the cable, registered with the test's
/// name server; serves until killed.
#[test]
fn child_server() {
    if !child_role("server") {
        return;
    }
    let args = ictus_midi_server::cli::ServerArgs {
        device: format!("cable:{}", env(CABLE_ENV)),
        name_server: Some(PathBuf::from(env(NS_ENV))),
        name: env(NAME_ENV),
        timesharing: true,
        stats: false,
    };
    ictus_midi_server::cli::serve(args).expect("the server ran");
}

/// The writer child: the bytes (hex) on the cable, then exit.
#[test]
fn child_writer() {
    if !child_role("writer") {
        return;
    }
    let hex = env(BYTES_ENV);
    let bytes: Vec<u8> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
    let mut out = CableOut::open(&env(CABLE_ENV), None).expect("cable");
    let mut off = 0;
    while off < bytes.len() {
        match out.write(&bytes[off..]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(out.is_plugged(), "nobody held the cable");
    assert_eq!(out.lost_bytes(), 0);
}

/// A client child: subscribes to both classes, then waits for input for ever.
#[test]
fn child_client() {
    if !child_role("client") {
        return;
    }
    let space = Space::task();
    let input =
        Input::connect_named(&space, Some(Path::new(&env(NS_ENV))), &env(NAME_ENV), true, true).expect("subscribe");
    loop {
        let _ = input.get(true);
    }
}

/// An unprivileged child (uid and gid 65534, `RLIMIT_RTPRIO` 0): a server asking for
/// real-time priority is refused it, says so, and serves anyway.
#[test]
fn child_unprivileged() {
    if !child_role("unprivileged") {
        return;
    }
    assert_eq!(rustix::process::getuid().as_raw(), 65534);
    let cable = env(CABLE_ENV);
    let dev = ictus_midi::device::cable::CableIn::open(&cable).expect("cable");
    let running = server::spawn(Space::new(), Box::new(dev), &Options::default()).expect("server");
    let space = Space::new();
    let right = space.insert_send_fd(running.service_fd().unwrap()).unwrap();
    let input = Input::open(&space, right, true, false).expect("subscribe");
    let mut out = CableOut::open(&cable, None).unwrap();
    out.write(&[0x99, 36, 90]).unwrap();
    let m = input.receive(Class::Normal, Some(WATCHDOG)).unwrap().expect("watchdog: no message");
    assert_eq!(m.bytes(), &[0x99, 36, 90]);
    let granted = running.driver_granted();
    assert!(granted.starts_with("SCHED_OTHER"), "an unprivileged driver got {granted:?}");
    running.stop().unwrap();
}

// ----- the parent's side ---------------------------------------------------------

/// A name server on a temporary socket, and the MIDI server in a child process
/// registered with it.
struct World {
    ns: NameServer,
    sock: PathBuf,
    cable: String,
    name: String,
    server: Option<Proc>,
}

impl World {
    fn start(tag: &str) -> World {
        let ns = NameServer::start();
        let sock = ns.socket();
        let cable = unique(tag);
        let name = format!("midi-{cable}");
        let server = spawn_role(
            "child_server",
            "server",
            &[(CABLE_ENV, &cable), (NS_ENV, sock.to_str().unwrap()), (NAME_ENV, &name)],
            |_| {},
        );
        let w = World { ns, sock, cable, name, server: Some(server) };
        w.wait_until("the server to register", |w| w.ns.has(&w.name));
        w
    }

    fn wait_until(&self, what: &str, mut cond: impl FnMut(&World) -> bool) {
        let deadline = Instant::now() + WATCHDOG;
        while !cond(self) {
            assert!(Instant::now() < deadline, "watchdog: still waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn input(&self, space: &Space, normal: bool, sysex: bool) -> Input {
        Input::connect_named(space, Some(&self.sock), &self.name, normal, sysex).expect("open an input handle")
    }

    fn write(&self, bytes: &[u8]) {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        spawn_role("child_writer", "writer", &[(CABLE_ENV, &self.cable), (BYTES_ENV, &hex)], |_| {}).wait_success();
    }

    fn stats(&self, input: &Input) -> InputStats {
        input.server_stats().expect("server stats")
    }
}

fn collect(input: &Input, class: Class, n: usize) -> Vec<ictus_midi::Message> {
    (0..n)
        .map(|_| {
            input
                .receive(class, Some(WATCHDOG))
                .expect("receive")
                .unwrap_or_else(|| panic!("watchdog: no {class:?} message"))
        })
        .collect()
}

fn kinds_bytes(ms: &[ictus_midi::Message]) -> Vec<(Kind, Vec<u8>)> {
    ms.iter().map(|m| (m.kind(), m.bytes().to_vec())).collect()
}

#[test]
fn normal_and_sysex_messages_arrive_separately_and_bad_bytes_are_counted() {
    let w = World::start("classes");
    let space = Space::task();
    // Several handles in one process: normal only, sysex only, both.
    let a = w.input(&space, true, false);
    let b = w.input(&space, false, true);
    let c = w.input(&space, true, true);
    assert!(matches!(a.getx(false), Err(InputError::NotSubscribed(Class::Sysex))));
    assert!(matches!(b.get(false), Err(InputError::NotSubscribed(Class::Normal))));
    assert_eq!(a.get(false).unwrap(), None, "nothing yet, and a non-blocking get says so");
    assert!(a.device().unwrap().contains(&w.cable));

    let before = ictus_rt::clock::now();
    w.write(STREAM);
    let an = collect(&a, Class::Normal, 6);
    let bx = collect(&b, Class::Sysex, 3);
    let cn = collect(&c, Class::Normal, 6);
    let cx = collect(&c, Class::Sysex, 3);
    let after = ictus_rt::clock::now();
    assert_eq!(kinds_bytes(&an), expected_normal());
    assert_eq!(kinds_bytes(&cn), expected_normal());
    assert_eq!(kinds_bytes(&bx), expected_sysex());
    assert_eq!(kinds_bytes(&cx), expected_sysex());
    // Stamped by the server's driver on the same clock, between our two readings.
    for m in an.iter().chain(&bx) {
        assert!(m.time() >= before && m.time() <= after, "{m:?} outside [{before}, {after}]");
    }
    assert_eq!(a.get(false).unwrap(), None);
    assert_eq!(c.getx(false).unwrap(), None);
    assert_eq!(a.stats().normal, 6);
    assert_eq!(b.stats().sysex, 3);
    assert_eq!((a.stats().lost, a.stats().refused), (0, 0));

    let s = w.stats(&a);
    assert_eq!((s.normal_clients, s.sysex_clients), (2, 2));
    assert_eq!(s.stray_data, 2, "{s:?}");
    assert_eq!(s.undefined, 1, "{s:?}");
    assert_eq!(s.sysex_unterminated, 1);
    assert_eq!(s.delivered, 2 * 6 + 2 * 3);
    assert_eq!(s.device_bytes, STREAM.len() as u64);
    assert_eq!(s.parsed_bytes, STREAM.len() as u64);

    // Bad bytes were not fatal: more comes through.
    w.write(&[0xF5, 0x91, 1, 2]);
    let more = collect(&a, Class::Normal, 1);
    assert_eq!(kinds_bytes(&more), vec![(Kind::NoteOn, vec![0x91, 1, 2])]);
    assert_eq!(w.stats(&a).undefined, 2);

    // A clean close unsubscribes.
    b.close().unwrap();
    w.wait_until("the unsubscription", |_| w.stats(&a).sysex_clients == 1);
    assert_eq!(w.stats(&a).unsubscribed, 1);
    assert_eq!(w.stats(&a).dropped_dead, 0);
    drop(w.ns);
}

#[test]
fn a_client_killed_with_kill_9_is_dropped() {
    let w = World::start("kill-client");
    let space = Space::task();
    let me = w.input(&space, true, false);
    let mut child =
        spawn_role("child_client", "client", &[(NS_ENV, w.sock.to_str().unwrap()), (NAME_ENV, &w.name)], |_| {});
    w.wait_until("the child's subscriptions", |w| w.stats(&me).subscribed == 3);
    let s = w.stats(&me);
    assert_eq!((s.normal_clients, s.sysex_clients), (2, 1));
    let pid = child.pid();
    child.kill9();
    // Dropped through the dead-name notifications, with nothing sent to it.
    w.wait_until("the killed client to be dropped", |w| w.stats(&me).dropped_dead == 2);
    let s = w.stats(&me);
    assert_eq!((s.normal_clients, s.sysex_clients), (1, 0), "pid {pid} is gone: {s:?}");
    // The server goes on serving the others.
    w.write(&[0x92, 64, 1]);
    assert_eq!(kinds_bytes(&collect(&me, Class::Normal, 1)), vec![(Kind::NoteOn, vec![0x92, 64, 1])]);
    assert_eq!(w.stats(&me).send_errors, 0);
}

#[test]
fn a_server_killed_with_kill_9_is_an_error_not_a_hang() {
    let mut w = World::start("kill-server");
    let space = Space::task();
    let input = std::sync::Arc::new(w.input(&space, true, true));
    let (tx, rx) = mpsc::channel();
    let mut waiters = Vec::new();
    for class in Class::ALL {
        let (input, tx) = (std::sync::Arc::clone(&input), tx.clone());
        waiters.push(std::thread::spawn(move || {
            let r = input.receive(class, None);
            let _ = tx.send((class, r.map(|m| m.is_some())));
        }));
    }
    // Let both block (a blocked receive is what must not hang), then kill.
    std::thread::sleep(Duration::from_millis(100));
    w.server.take().expect("server").kill9();
    for _ in 0..2 {
        let (class, r) = rx.recv_timeout(WATCHDOG).expect("watchdog: a get hung after the server died");
        assert!(matches!(r, Err(InputError::ServerDied)), "{class:?}: {r:?}");
    }
    for h in waiters {
        h.join().unwrap();
    }
    // And later calls fail at once.
    assert!(matches!(input.get(true), Err(InputError::ServerDied)));
    assert!(matches!(input.getx(false), Err(InputError::ServerDied)));
}

#[test]
fn without_real_time_privileges_the_server_runs_anyway() {
    if !rustix::process::geteuid().is_root() {
        // Already unprivileged: the in-process tests below run this path.
        return;
    }
    let cable = unique("unpriv");
    let mut child = spawn_role("child_unprivileged", "unprivileged", &[(CABLE_ENV, &cable)], |cmd| {
        use std::os::unix::process::CommandExt;
        // SAFETY: runs in the forked child before exec and only makes async-signal-safe
        // system calls (setrlimit, setgroups, setresgid, setresuid), allocating nothing.
        unsafe {
            cmd.pre_exec(|| {
                let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                if libc::setrlimit(libc::RLIMIT_RTPRIO, &zero) != 0
                    || libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(65534, 65534, 65534) != 0
                    || libc::setresuid(65534, 65534, 65534) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    child.wait_success();
}

// ----- in one process: requests, rights, hostile input ------------------------------

/// A server on a thread of this process, reading a fresh cable; a client space with a
/// send right to it.
fn in_process() -> (server::Running, String, Space, ictus_ipc::Name) {
    let cable = unique("inproc");
    let dev = ictus_midi::device::cable::CableIn::open(&cable).expect("cable");
    let running = server::spawn(Space::new(), Box::new(dev), &Options::timesharing()).expect("server");
    let client = Space::new();
    let right = client.insert_send_fd(running.service_fd().unwrap()).unwrap();
    (running, cable, client, right)
}

#[test]
fn requests_are_checked() {
    let (running, _cable, space, right) = in_process();
    let stubs = MidiInputClient::new(&space, right).with_timeout(WATCHDOG);
    let port = space.allocate_port().unwrap();
    let baseline = running.space().names().len();
    let remote = |r: Result<(u32, u64), ictus_idl::ClientError<MidiError>>| match r {
        Err(ictus_idl::ClientError::Remote(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(remote(stubs.subscribe(7, SendRight::make(port))), MidiError::BadClass);
    let (pid, id) = stubs.subscribe(0, SendRight::make(port)).unwrap();
    assert_eq!(pid, std::process::id());
    assert_eq!(remote(stubs.subscribe(0, SendRight::make(port))), MidiError::AlreadySubscribed);
    // The same port for the other class shares the server's name for it.
    let (_, id2) = stubs.subscribe(1, SendRight::make(port)).unwrap();
    assert_eq!(running.space().names().len(), baseline + 1, "refused rights were released");
    assert!(matches!(stubs.unsubscribe(999), Err(ictus_idl::ClientError::Remote(MidiError::NotSubscribed))));
    stubs.unsubscribe(id).unwrap();
    stubs.unsubscribe(id2).unwrap();
    assert_eq!(running.space().names().len(), baseline, "unsubscribing released the right");
    let s = running.stats();
    assert_eq!((s.subscribed, s.unsubscribed, s.normal_clients), (2, 2, 0));
    // A request that does not decode is refused and counted, never fatal.
    let mut junk = IpcMessage::new(4500, vec![1, 2, 3]);
    space.send(right, &mut junk, SendOptions::default()).unwrap();
    let mut junk = IpcMessage::new(4577, vec![]);
    space.send(right, &mut junk, SendOptions::default()).unwrap();
    let deadline = Instant::now() + WATCHDOG;
    while running.stats().refused < 2 {
        assert!(Instant::now() < deadline, "watchdog: refusals not counted");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(stubs.stats().is_ok());
    running.stop().unwrap();
}

#[test]
fn a_handle_dropped_is_purged_and_its_rights_released() {
    let (running, cable, space, right) = in_process();
    let baseline = running.space().names().len();
    let input = Input::open(&space, right, true, true).unwrap();
    assert_eq!(running.space().names().len(), baseline + 2, "one name per port");
    let mut out = CableOut::open(&cable, None).unwrap();
    out.write(&[0xC0, 5, 0xF0, 1, 0xF7]).unwrap();
    assert_eq!(input.receive(Class::Normal, Some(WATCHDOG)).unwrap().unwrap().bytes(), &[0xC0, 5]);
    assert_eq!(input.receive(Class::Sysex, Some(WATCHDOG)).unwrap().unwrap().bytes(), &[0xF0, 1, 0xF7]);
    drop(input);
    let deadline = Instant::now() + WATCHDOG;
    while running.space().names().len() != baseline {
        assert!(Instant::now() < deadline, "watchdog: the server kept a dead client's rights");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(running.stats().dropped_dead, 2);
    running.stop().unwrap();
}

#[test]
fn a_client_that_does_not_read_costs_it_messages_not_the_server() {
    let (running, cable, space, right) = in_process();
    let slow = Input::open(&space, right, true, false).unwrap();
    space.set_qlimit(slow.port(Class::Normal).unwrap(), 1).unwrap();
    let right2 = space.insert_send_fd(running.service_fd().unwrap()).unwrap();
    let fast = Input::open(&space, right2, true, false).unwrap();
    let mut out = CableOut::open(&cable, None).unwrap();
    let n = 3000u64;
    let mut got = 0u64;
    let put = |out: &mut CableOut, b: &[u8]| {
        while out.write(b).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let deadline = Instant::now() + WATCHDOG;
    for i in 0..n {
        put(&mut out, &[0x90, (i % 128) as u8, 1]);
        while let Some(_m) = fast.get(false).unwrap() {
            got += 1;
        }
        // Every 64 messages, let the server parse what was written: on a loaded machine
        // a writer that runs ahead overflows the driver's ring (counted, but then too
        // few messages reach the slow client to fill its queue).
        if i % 64 == 63 {
            while {
                let s = running.stats();
                s.parsed_bytes + s.ring_overflow < 3 * (i + 1)
            } {
                assert!(Instant::now() < deadline, "watchdog: the server stopped parsing: {:?}", running.stats());
                while let Some(_m) = fast.get(false).unwrap() {
                    got += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    // A last message of another kind marks the end, so a gap before it shows.
    put(&mut out, &[0x80, 0, 0]);
    loop {
        let m = fast.receive(Class::Normal, Some(WATCHDOG)).unwrap().expect("watchdog: the fast client starved");
        if m.kind() == Kind::NoteOff {
            break;
        }
        got += 1;
    }
    // On a loaded machine the driver's ring may overflow before the server parses (those
    // bytes are counted as ring_overflow, never delivered); every message the server did
    // parse reached the fast client or is counted lost by it.
    // (The server's counters may trail its deliveries by a moment: wait for them.)
    let settle = Instant::now() + WATCHDOG;
    let mut s = running.stats();
    while got + fast.stats().lost != s.messages - 1 && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(5));
        s = running.stats();
    }
    assert_eq!(
        got + fast.stats().lost,
        s.messages - 1,
        "every parsed message reached the fast client or is counted lost: {s:?}"
    );
    if s.ring_overflow == 0 && s.dropped_bytes() == 0 {
        assert_eq!(s.messages - 1, n, "nothing overflowed, so every message was parsed: {s:?}");
    }
    assert!(running.stats().queue_full > 0, "the slow client's queue never filled: {:?}", running.stats());
    let mut seen = 0;
    while slow.get(false).unwrap().is_some() {
        seen += 1;
    }
    assert!(seen > 0 && seen < n, "{seen}");
    running.stop().unwrap();
}

#[test]
fn an_over_long_sysex_is_cut_and_the_cut_is_counted() {
    let cable = unique("long");
    let dev = ictus_midi::device::cable::CableIn::open(&cable).expect("cable");
    let opts = Options { max_sysex: 8, ..Options::timesharing() };
    let running = server::spawn(Space::new(), Box::new(dev), &opts).expect("server");
    let space = Space::new();
    let right = space.insert_send_fd(running.service_fd().unwrap()).unwrap();
    let input = Input::open(&space, right, false, true).unwrap();
    let mut long = vec![0xF0];
    long.extend(1..=18u8);
    long.push(0xF7);
    CableOut::open(&cable, None).unwrap().write(&long).unwrap();
    let m = input.getx(true).unwrap().expect("a sysex");
    assert_eq!(m.bytes(), &[0xF0, 1, 2, 3, 4, 5, 6, 0xF7]);
    assert_eq!(input.stats().sysex_overflow, 12);
    // The server's counters are brought up to date after each drain of its ring.
    let deadline = Instant::now() + WATCHDOG;
    while running.stats().sysex_overflow != 12 {
        assert!(Instant::now() < deadline, "watchdog: {:?}", running.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    running.stop().unwrap();
}
