//! The clock server across processes: the name server runs on a thread of the test,
//! the clock server and misbehaving clients are this test binary re-executed as child
//! processes (the `child_role` test, selected by an environment variable).
//!
//! No test asserts a duration or a lateness; waits are bounded by generous watchdogs.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ictus_clock_server::client::{Client, ClientError, ConnectError, Control};
use ictus_clock_server::control::ControlError;
use ictus_clock_server::protocol::{self, AlarmPort, ClockControlClient, WireTime, WireWhen};
use ictus_clock_server::{AlarmMessage, ClockError};
use ictus_idl::SendOnceRight;
use ictus_ipc::*;
use ictus_rt::{clock, AlarmId, Time, When};
use ictus_testkit::{wait_until, NameServer, Proc, Role, TempDir, WATCHDOG};

const ROLE: Role = Role { env: "ICTUS_CLOCK_TEST_ROLE" };
const NS_SOCK: &str = "ICTUS_CLOCK_TEST_NS";
const CONTROL_SOCK: &str = "ICTUS_CLOCK_TEST_CONTROL";

/// This test binary, re-executed in `role`, its standard input and output piped.
fn child(role: &str, env: &[(&str, &Path)]) -> Command {
    let mut cmd = ROLE.command("child_role", role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    cmd
}

/// A name server on a thread, a clock server in a child process. The control socket is
/// in a directory other users may enter, so that a test can show what refuses them.
struct Fixture {
    ns: NameServer,
    dir: TempDir,
    server: Proc,
}

impl Fixture {
    fn start() -> Fixture {
        let ns = NameServer::start();
        let dir = TempDir::shared("clock");
        let control = dir.join("control.sock");
        let mut server = Proc::spawn(
            "the clock server",
            &mut child("clock-server", &[(NS_SOCK, &ns.socket()), (CONTROL_SOCK, &control)]),
        );
        server.wait_line("ready");
        Fixture { ns, dir, server }
    }

    fn ns_sock(&self) -> PathBuf {
        self.ns.socket()
    }

    fn control_sock(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    fn client(&self, space: &Space) -> Client {
        Client::connect_socket(space, &self.ns_sock()).expect("the clock is registered").with_timeout(WATCHDOG)
    }

    fn control(&self, space: &Space) -> Control {
        Control::connect_socket(space, &self.control_sock()).expect("root gets the control port").with_timeout(WATCHDOG)
    }

    /// Stop the clock server cleanly (its stdin closes), then the name server.
    fn stop(mut self) {
        drop(self.server.child().stdin.take());
        let status = self.server.wait();
        assert!(status.success(), "the clock server exits cleanly: {status}");
        self.ns.stop();
    }
}

fn receive(space: &Space, port: Name) -> Received {
    let mut r = Received::new();
    space.receive(port, &mut r, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() }).expect("a message");
    r
}

fn receive_alarm(space: &Space, port: Name) -> AlarmMessage {
    AlarmMessage::parse(&receive(space, port)).expect("an alarm message")
}

/// Roles of the re-executed binary; does nothing in a normal test run.
#[test]
fn child_role() {
    let Some(role) = ROLE.current() else { return };
    let env_path = |k: &str| PathBuf::from(std::env::var_os(k).expect("path in the environment"));
    match role.as_str() {
        "clock-server" => {
            let listener = ictus_server::Listener::bind(&env_path(CONTROL_SOCK), "clock server").unwrap();
            let space = Space::task();
            let mut server = ictus_clock_server::Server::new(space.clone()).unwrap();
            let ns = ictus_name_api::Client::connect_socket(&space, &env_path(NS_SOCK)).unwrap();
            ns.register(protocol::SERVICE_NAME, server.clock_port()).unwrap();
            println!("ready");
            std::io::stdout().flush().unwrap();
            // Serve until the parent closes our stdin.
            let stdin = std::io::stdin();
            server.run(Some(&listener), stdin.as_fd()).unwrap();
        }
        "alarm-client" => {
            let space = Space::task();
            let clock = Client::connect_socket(&space, &env_path(NS_SOCK)).unwrap().with_timeout(WATCHDOG);
            let port = space.allocate_port().unwrap();
            let later = When::After(Duration::from_secs(3600));
            let mut ids = Vec::new();
            for tag in 0..5 {
                ids.push(clock.set_alarm(later, port, tag).unwrap().0.as_raw());
            }
            let once = space.allocate_port().unwrap();
            ids.push(clock.set_alarm_once(later, once, 99).unwrap().0.as_raw());
            // A sleeper too: its reply right dies with us.
            let sleeper_space = space.clone();
            let ns = env_path(NS_SOCK);
            std::thread::spawn(move || {
                let c = Client::connect_socket(&sleeper_space, &ns).unwrap();
                let _ = c.sleep_for(Duration::from_secs(3600));
            });
            // Tell the parent once the sleep has had time to arrive; it checks the
            // count itself, so this only saves it polling.
            let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
            println!("ready {}", ids.join(" "));
            std::io::stdout().flush().unwrap();
            loop {
                std::thread::park();
            }
        }
        "fetch-control" => {
            let space = Space::task();
            let verdict = match Control::connect_socket(&space, &env_path(CONTROL_SOCK)) {
                Ok(_) => "granted".to_owned(),
                Err(ConnectError::Control(ControlError::PermissionDenied(_))) => "denied-by-mode".to_owned(),
                Err(ConnectError::Control(ControlError::Refused(_))) => "refused-by-server".to_owned(),
                Err(e) => format!("other {e}"),
            };
            println!("verdict {} uid {}", verdict, rustix::process::geteuid().as_raw());
            std::io::stdout().flush().unwrap();
        }
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

#[test]
fn read_sleep_and_alarms_absolute_and_relative() {
    let fx = Fixture::start();
    let space = Space::new();
    let clock = fx.client(&space);

    let before = clock::now();
    let (boot, wall) = clock.read().unwrap();
    assert!(boot >= before && boot <= clock::now(), "the server reads the same CLOCK_MONOTONIC");
    assert!(wall > Time::from_secs(1_577_836_800), "wall time is since the Unix epoch");

    // Sleeping: the reply never comes before the time.
    let target = clock::now() + Duration::from_millis(20);
    let woke = clock.sleep_until(target).unwrap();
    assert!(woke >= target && clock::now() >= target);
    let start = clock::now();
    let woke = clock.sleep_for(Duration::from_millis(5)).unwrap();
    assert!(woke >= start + Duration::from_millis(5));
    // A time already past answers at once.
    clock.sleep_until(Time::from_nanos(1)).unwrap();

    // Alarms: absolute, relative, to a send right and to a send-once right.
    let port = space.allocate_port().unwrap();
    let abs_at = clock::now() + Duration::from_millis(30);
    let (abs, at) = clock.set_alarm(When::At(abs_at), port, 1).unwrap();
    assert_eq!(at, abs_at);
    let asked = clock::now();
    let (rel, rel_at) = clock.set_alarm(When::After(Duration::from_millis(10)), port, 2).unwrap();
    assert!(rel_at >= asked + Duration::from_millis(10), "relative to the request's arrival");
    let once = space.allocate_port().unwrap();
    let (one, _) = clock.set_alarm_once(When::After(Duration::from_millis(1)), once, 3).unwrap();

    let m = receive_alarm(&space, once);
    assert_eq!((m.alarm, m.tag), (one.as_raw(), 3));
    let m = receive_alarm(&space, port);
    assert_eq!((m.alarm, m.tag, m.requested), (rel.as_raw(), 2, rel_at));
    assert!(m.sent >= m.requested, "never early");
    let m = receive_alarm(&space, port);
    assert_eq!((m.alarm, m.tag, m.requested), (abs.as_raw(), 1, abs_at));
    assert!(clock::now() >= abs_at);

    let control = fx.control(&space);
    let s = control.stats().unwrap();
    assert_eq!((s.pending_alarms, s.pending_sleeps, s.alarms_sent, s.alarms_dropped), (0, 0, 3, 0));
    assert!(s.sleeps_answered >= 3);
    drop(control);
    drop(clock);
    fx.stop();
}

#[test]
fn cancellation_works() {
    let fx = Fixture::start();
    let space = Space::new();
    let clock = fx.client(&space);
    let port = space.allocate_port().unwrap();
    let (doomed, _) = clock.set_alarm(When::After(Duration::from_millis(50)), port, 1).unwrap();
    let (kept, _) = clock.set_alarm(When::After(Duration::from_millis(100)), port, 2).unwrap();
    clock.cancel_alarm(doomed).unwrap();
    assert!(matches!(clock.cancel_alarm(doomed), Err(ClientError::Clock(ClockError::NoSuchAlarm))));
    assert!(matches!(
        clock.cancel_alarm(AlarmId::from_raw(u64::MAX)),
        Err(ClientError::Clock(ClockError::NoSuchAlarm))
    ));
    // Only the kept alarm arrives; nothing after it.
    let m = receive_alarm(&space, port);
    assert_eq!((m.alarm, m.tag), (kept.as_raw(), 2));
    let mut r = Received::new();
    let quiet =
        space.receive(port, &mut r, ReceiveOptions { timeout: Some(Duration::from_millis(200)), ..Default::default() });
    assert!(matches!(quiet, Err(ReceiveError::TimedOut)), "the cancelled alarm never comes: {quiet:?}");
    // A delivered alarm cannot be cancelled either.
    assert!(matches!(clock.cancel_alarm(kept), Err(ClientError::Clock(ClockError::NoSuchAlarm))));
    let s = fx.control(&space).stats().unwrap();
    assert_eq!((s.pending_alarms, s.alarms_sent, s.clients), (0, 1, 0));
    drop(clock);
    fx.stop();
}

#[test]
fn a_dead_alarm_port_is_cleaned_up_and_others_cannot_cancel() {
    let fx = Fixture::start();
    let space = Space::new();
    let control = fx.control(&space);
    let clock = fx.client(&space);
    let mut victim = Proc::spawn("the alarm client", &mut child("alarm-client", &[(NS_SOCK, &fx.ns_sock())]));
    let line = victim.wait_line("ready");
    let ids: Vec<u64> = line.split_whitespace().skip(1).map(|s| s.parse().unwrap()).collect();
    assert_eq!(ids.len(), 6);
    wait_until("the child's alarms and sleep to be pending", || {
        let s = control.stats().unwrap();
        s.pending_alarms == 6 && s.pending_sleeps == 1
    });
    // Another task cannot cancel the child's alarms; the control port can.
    assert!(matches!(clock.cancel_alarm(AlarmId::from_raw(ids[0])), Err(ClientError::Clock(ClockError::NotOwner))));
    control.clock().cancel_alarm(AlarmId::from_raw(ids[0])).unwrap();
    assert_eq!(control.stats().unwrap().pending_alarms, 5);

    victim.kill9();
    // The dead-name notifications alone clean up: nothing is due for an hour.
    wait_until("the server to drop the dead client's alarms and sleep", || {
        let s = control.stats().unwrap();
        s.pending_alarms == 0 && s.pending_sleeps == 0 && s.clients == 0
    });
    let s = control.stats().unwrap();
    assert_eq!(s.alarms_dropped, 5, "{s:?}");
    // The server still works.
    let port = space.allocate_port().unwrap();
    clock.set_alarm(When::After(Duration::ZERO), port, 7).unwrap();
    assert_eq!(receive_alarm(&space, port).tag, 7);
    drop((clock, control));
    fx.stop();
}

#[test]
fn an_alarm_to_a_port_that_dies_is_dropped() {
    let fx = Fixture::start();
    let space = Space::new();
    let control = fx.control(&space);
    let clock = fx.client(&space);
    let port = space.allocate_port().unwrap();
    clock.set_alarm(When::After(Duration::from_secs(3600)), port, 1).unwrap();
    clock.set_alarm(When::After(Duration::from_secs(7200)), port, 2).unwrap();
    assert_eq!(control.stats().unwrap().pending_alarms, 2);
    space.mod_refs(port, RightKind::Receive, -1).unwrap();
    wait_until("the alarms of the dead port to go", || control.stats().unwrap().pending_alarms == 0);
    assert_eq!(control.stats().unwrap().alarms_dropped, 2);
    // A dead name cannot even be sent: the client refuses before the server sees it.
    let p = space.allocate_port_with_send().unwrap();
    let (send, _) = space.extract_right(&space, p, Disposition::MakeSend).unwrap();
    space.mod_refs(p, RightKind::Receive, -1).unwrap();
    let r = clock.set_alarm(When::After(Duration::from_secs(1)), send, 0);
    assert!(matches!(r, Err(ClientError::NotARight(_))), "{r:?}");
    drop((clock, control));
    fx.stop();
}

#[test]
fn the_control_port_is_only_for_its_holders() {
    let fx = Fixture::start();
    let space = Space::new();
    let clock = fx.client(&space);
    // With the clock port only, control requests do not exist.
    let stubs = ClockControlClient::new(&space, clock.port()).with_timeout(WATCHDOG);
    let r = stubs.set_resolution(WireTime::from_duration(Duration::from_millis(10)));
    assert!(matches!(&r, Err(ictus_idl::ClientError::Refused(s)) if s.0 == ReturnCode::MigBadId.code()), "{r:?}");
    assert!(matches!(stubs.stats(), Err(ictus_idl::ClientError::Refused(_))));
    assert_eq!(clock.resolution().unwrap(), Duration::ZERO, "unchanged");

    // With the control port: resolution changes, and alarms keep to its ticks.
    let control = fx.control(&space);
    assert_eq!(control.set_resolution(Duration::from_millis(10)).unwrap(), Duration::ZERO);
    assert_eq!(clock.resolution().unwrap(), Duration::from_millis(10));
    let port = space.allocate_port().unwrap();
    let (_, at) = clock.set_alarm(When::After(Duration::from_millis(1)), port, 0).unwrap();
    let m = receive_alarm(&space, port);
    assert!(m.sent >= at.round_up(Duration::from_millis(10)), "delivered on a resolution tick, never before");
    assert!(matches!(
        control.set_resolution(Duration::from_secs(2)),
        Err(ClientError::Clock(ClockError::BadResolution))
    ));
    control.set_resolution(Duration::ZERO).unwrap();

    // Another user cannot obtain it: by the socket's mode …
    // (None: uid 65534 cannot execute this test binary where it was built.)
    let verdict = |dir: &TempDir| -> Option<String> {
        let mut c = child("fetch-control", &[(CONTROL_SOCK, &fx.control_sock())]);
        c.uid(65534).gid(65534).current_dir(dir.path());
        let c = match c.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return None,
            Err(e) => panic!("spawning the uid-65534 child: {e}"),
        };
        let mut c = Proc::from_child("the uid-65534 child", c);
        let line = c.wait_line("verdict");
        c.wait();
        Some(line)
    };
    if !rustix::process::geteuid().is_root() {
        eprintln!("not root: the uid-65534 half of this test needs to change uid; skipped");
    } else if let Some(line) = verdict(&fx.dir) {
        assert_eq!(line, "verdict denied-by-mode uid 65534");
        // … and, were the mode relaxed, by the server's SO_PEERCRED check.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(fx.control_sock(), std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(verdict(&fx.dir).as_deref(), Some("verdict refused-by-server uid 65534"));
    } else {
        eprintln!("uid 65534 cannot execute the test binary here; the uid-65534 half is skipped");
    }
    drop((clock, control));
    fx.stop();
}

#[test]
fn bad_requests_get_clear_errors() {
    let fx = Fixture::start();
    let space = Space::new();
    let clock = fx.client(&space);
    let control = fx.control(&space);
    let port = space.allocate_port().unwrap();
    let stubs = clock.stubs();
    let bad_time = WireWhen::After(WireTime { secs: 0, nanos: 1_000_000_000 });
    let r = stubs.set_alarm(bad_time, AlarmPort::Send(ictus_idl::SendRight::make(port)), 0);
    assert!(matches!(r, Err(ictus_idl::ClientError::Remote(ClockError::InvalidTime))), "{r:?}");
    assert!(matches!(stubs.sleep(bad_time), Err(ictus_idl::ClientError::Remote(ClockError::InvalidTime))));
    let past_584_years = WireWhen::At(WireTime { secs: u64::MAX, nanos: 0 });
    assert!(matches!(stubs.sleep(past_584_years), Err(ictus_idl::ClientError::Remote(ClockError::InvalidTime))));
    assert!(matches!(control.set_client_quota(0), Err(ClientError::Clock(ClockError::BadResolution))));

    // Quotas.
    assert_eq!(control.set_client_quota(2).unwrap(), protocol::DEFAULT_CLIENT_QUOTA);
    let later = When::After(Duration::from_secs(3600));
    let (a, _) = clock.set_alarm(later, port, 0).unwrap();
    clock.set_alarm(later, port, 0).unwrap();
    assert!(matches!(clock.set_alarm(later, port, 0), Err(ClientError::Clock(ClockError::QuotaExceeded))));
    clock.cancel_alarm(a).unwrap();
    clock.set_alarm(later, port, 0).unwrap();
    control.set_client_quota(protocol::DEFAULT_CLIENT_QUOTA).unwrap();

    // Hand-made requests: a bad tag, trailing bytes, a sleep nobody can hear, a
    // receive right as the alarm port.
    let raw = |msg: &mut Message| {
        let mut r = Received::new();
        let o = ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() };
        space.call(clock.port(), msg, &mut r, SendOptions { timeout: Some(WATCHDOG) }, o).unwrap();
        u32::from_le_bytes(r.data()[..4].try_into().unwrap())
    };
    let mut when = vec![2u8];
    when.extend_from_slice(&[0; 12]);
    assert_eq!(raw(&mut Message::new(protocol::SLEEP, when.clone())), ReturnCode::MigBadArguments.code());
    let mut ok_when = vec![1u8];
    ok_when.extend_from_slice(&[0; 12]);
    ok_when.push(0);
    assert_eq!(raw(&mut Message::new(protocol::SLEEP, ok_when)), ReturnCode::MigBadArguments.code());
    assert_eq!(raw(&mut Message::new(9999, vec![])), ReturnCode::MigBadId.code());
    space.send(clock.port(), &mut Message::new(protocol::SLEEP, when), SendOptions::default()).unwrap();
    let victim = space.allocate_port().unwrap();
    let mut data = vec![1u8];
    data.extend_from_slice(&[0; 12]);
    data.extend_from_slice(&0u64.to_le_bytes());
    let mut m = Message::new(protocol::SET_ALARM, data);
    m.ports.push(PortArg::new(victim, Disposition::MoveReceive));
    assert_eq!(raw(&mut m), ReturnCode::MigBadArguments.code());
    // A send-once alarm whose right is spent by cancelling it.
    let once = space.allocate_port().unwrap();
    let (id, _) = clock.set_alarm_with(later, AlarmPort::SendOnce(SendOnceRight::make(once)), 1).unwrap();
    clock.cancel_alarm(id).unwrap();
    // The destroyed send-once right tells its port so, as the nucleus does for any.
    assert_eq!(receive(&space, once).id, NotifyId::SendOnce.id());

    // A second server on the same control socket is refused, in the clock's words.
    let second = ictus_clock_server::server::spawn(
        Space::new(),
        ictus_clock_server::server::Options { control_socket: Some(fx.control_sock()), setup: None },
    );
    let err = second.unwrap_err();
    assert!(err.to_string().contains("a clock server is already running"), "{err}");

    let s = control.stats().unwrap();
    assert_eq!((s.pending_alarms, s.clients), (2, 1), "{s:?}");
    drop((clock, control));
    fx.stop();
}

#[test]
fn a_killed_server_is_an_error_for_sleepers_not_a_hang() {
    let mut fx = Fixture::start();
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..3 {
        let tx = tx.clone();
        let ns = fx.ns_sock();
        std::thread::spawn(move || {
            let space = Space::new();
            let clock = Client::connect_socket(&space, &ns).unwrap();
            tx.send(None).unwrap();
            let r = clock.sleep_for(Duration::from_secs(3600));
            tx.send(Some(r)).unwrap();
        });
    }
    for _ in 0..3 {
        assert!(rx.recv_timeout(WATCHDOG).unwrap().is_none());
    }
    let space = Space::new();
    let control = fx.control(&space);
    wait_until("three sleepers", || control.stats().unwrap().pending_sleeps == 3);
    fx.server.kill9();
    for _ in 0..3 {
        let r = rx.recv_timeout(WATCHDOG).expect("watchdog: a sleeper hangs after the server died");
        assert!(matches!(r, Some(Err(ClientError::ServerDied))), "{r:?}");
    }
    assert!(matches!(control.stats(), Err(ClientError::ServerDied)));
    // Its registration vanished with its port.
    let r = Client::connect_socket(&space, &fx.ns_sock());
    assert!(matches!(r, Err(ConnectError::Lookup(_))), "{r:?}");
    fx.ns.stop();
}

#[test]
fn a_server_on_a_thread_serves_clients_given_its_right() {
    use ictus_clock_server::server::{spawn, Options};
    let running = spawn(Space::new(), Options::default()).unwrap();
    let space = Space::new();
    let right = space.insert_send_fd(running.clock_fd().unwrap()).unwrap();
    let clock = Client::from_right(&space, right).with_timeout(WATCHDOG);
    let port = space.allocate_port().unwrap();
    clock.set_alarm(When::After(Duration::from_millis(1)), port, 5).unwrap();
    assert_eq!(receive_alarm(&space, port).tag, 5);
    assert_eq!(running.stats().alarms_sent, 1);
    running.stop().unwrap();
    assert!(matches!(clock.read(), Err(ClientError::ServerDied)));
}

/// The server wakes ahead of each deadline (`Server::set_lead`) and waits for it
/// awake: with the longest lead, alarms on a tight grid and sleeps still come in order
/// and never before their time (its `sent` stamp and the sleep's answer), and none is
/// lost.
#[test]
fn a_server_that_wakes_ahead_still_never_sends_early() {
    let space = Space::new();
    let mut server = ictus_clock_server::Server::new(space.clone()).unwrap();
    server.set_lead(ictus_clock_server::server::MAX_LEAD);
    assert_eq!(server.lead(), ictus_clock_server::server::MAX_LEAD);
    server.set_lead(Duration::from_secs(1));
    assert_eq!(server.lead(), ictus_clock_server::server::MAX_LEAD, "capped");
    let clock_fd = space.send_right_fd(server.clock_port()).unwrap();
    let (stop, stop_theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let serving = std::thread::spawn(move || server.run(None, stop_theirs.as_fd()));

    let client_space = Space::new();
    let right = client_space.insert_send_fd(clock_fd).unwrap();
    let clock = Client::from_right(&client_space, right).with_timeout(WATCHDOG);
    let port = client_space.allocate_port().unwrap();
    let start = clock::now() + Duration::from_millis(20);
    let at = |k: u32| start + Duration::from_micros(700) * k;
    for k in 0..20u32 {
        clock.set_alarm(When::At(at(k)), port, u64::from(k)).unwrap();
    }
    for k in 0..20u32 {
        let m = receive_alarm(&client_space, port);
        assert_eq!((m.tag, m.requested), (u64::from(k), at(k)), "in order");
        assert!(m.sent >= m.requested, "alarm {k} sent {:?} before its time {:?}", m.sent, m.requested);
        assert!(clock::now() >= m.requested);
    }
    for _ in 0..3 {
        let target = clock::now() + Duration::from_micros(300);
        let woke = clock.sleep_until(target).unwrap();
        assert!(woke >= target && clock::now() >= target, "a sleep is never answered early");
    }
    drop(stop);
    serving.join().expect("server thread").expect("served");
}

#[test]
fn a_stalled_server_is_a_timeout_not_a_hang() {
    let fx = Fixture::start();
    let space = Space::new();
    let clock = fx.client(&space).with_timeout(Duration::from_millis(200));
    clock.read().unwrap();
    fx.server.stop_all_threads();
    let r = clock.read();
    let s = clock.sleep_for(Duration::from_millis(1));
    fx.server.resume();
    assert!(matches!(r, Err(ClientError::TimedOut)), "{r:?}");
    assert!(matches!(s, Err(ClientError::TimedOut)), "{s:?}");
    assert!(ClientError::TimedOut.to_string().contains("did not answer in time"));
    // Once it runs again it answers.
    let clock = clock.with_timeout(WATCHDOG);
    clock.read().unwrap();
    drop(clock);
    fx.stop();
}
